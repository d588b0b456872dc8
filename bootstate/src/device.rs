//! Devices: what the slot operations read and write. A disk image file, a
//! block device, or a window on either (a partition), all flushed through
//! [`Device::sync`] at the points where the write order matters.
//!
//! [`Faulty`] cuts the power after a given number of writes, for the tests
//! that prove every step of an upgrade crash-safe, and counts the bytes an
//! operation writes, for the benchmark.

use std::cell::Cell;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::rc::Rc;

/// A readable, writable, seekable device whose writes can be made durable.
pub trait Device: Read + Write + Seek {
    /// Makes every write so far durable (fsync) before later writes.
    fn sync(&mut self) -> io::Result<()>;
}

impl Device for File {
    fn sync(&mut self) -> io::Result<()> {
        self.sync_all()
    }
}

impl<D: Device + ?Sized> Device for &mut D {
    fn sync(&mut self) -> io::Result<()> {
        (**self).sync()
    }
}

impl Device for io::Cursor<Vec<u8>> {
    fn sync(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Device for io::Cursor<&mut Vec<u8>> {
    fn sync(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A window of `len` bytes at `offset` of an inner device, seen as a device
/// of its own: a partition of a disk image. Reads and writes past the end of
/// the window are refused, so a filesystem can never spill into a neighbour.
#[derive(Debug)]
pub struct Window<T> {
    inner: T,
    offset: u64,
    len: u64,
    pos: u64,
}

impl<T: Seek> Window<T> {
    pub fn new(mut inner: T, offset: u64, len: u64) -> io::Result<Window<T>> {
        inner.seek(SeekFrom::Start(offset))?;
        Ok(Window {
            inner,
            offset,
            len,
            pos: 0,
        })
    }

    pub fn into_inner(self) -> T {
        self.inner
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn room(&self, want: usize) -> usize {
        want.min(self.len.saturating_sub(self.pos) as usize)
    }
}

impl<T: Read + Seek> Read for Window<T> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.room(buf.len());
        if n == 0 {
            return Ok(0);
        }
        let n = self.inner.read(&mut buf[..n])?;
        self.pos += n as u64;
        Ok(n)
    }
}

impl<T: Write + Seek> Write for Window<T> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let n = self.room(buf.len());
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "write past the end of the partition",
            ));
        }
        let n = self.inner.write(&buf[..n])?;
        self.pos += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

impl<T: Seek> Seek for Window<T> {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        let target = match to {
            SeekFrom::Start(p) => Some(p),
            SeekFrom::End(d) => self.len.checked_add_signed(d),
            SeekFrom::Current(d) => self.pos.checked_add_signed(d),
        }
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "seek before start"))?;
        let abs = self
            .offset
            .checked_add(target)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "seek past 2^64"))?;
        self.inner.seek(SeekFrom::Start(abs))?;
        self.pos = target;
        Ok(target)
    }
}

impl<T: Device> Device for Window<T> {
    fn sync(&mut self) -> io::Result<()> {
        self.inner.sync()
    }
}

/// Refuses writes: lets a library that wants a writable device (fatfs)
/// read from a source opened read-only, such as a disk `imager inspect`
/// looks at.
#[derive(Debug)]
pub struct ReadOnly<T>(pub T);

impl<T: Read> Read for ReadOnly<T> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.read(buf)
    }
}

impl<T> Write for ReadOnly<T> {
    fn write(&mut self, _: &[u8]) -> io::Result<usize> {
        Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            "the filesystem is opened read-only",
        ))
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<T: Seek> Seek for ReadOnly<T> {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        self.0.seek(to)
    }
}

/// Makes the small writes a FAT library issues for one directory entry (a
/// name here, a size there) reach the device as one sector write, as they
/// would in a filesystem driver: writes that stay within one 512-byte sector
/// are gathered and written together when a write goes elsewhere, on a
/// read, a flush or a sync. A disk writes a sector whole or not at all, so
/// an entry is then created, renamed or sized in one step. Larger writes
/// pass straight through, in order.
#[derive(Debug)]
pub struct SectorWriter<D: Read + Write + Seek> {
    inner: D,
    pos: u64,
    /// The sector being gathered: its offset and contents.
    dirty: Option<(u64, Box<[u8; SECTOR]>)>,
}

const SECTOR: usize = 512;

impl<D: Read + Write + Seek> SectorWriter<D> {
    pub fn new(inner: D) -> SectorWriter<D> {
        SectorWriter {
            inner,
            pos: 0,
            dirty: None,
        }
    }

    fn write_back(&mut self) -> io::Result<()> {
        if let Some((at, buf)) = self.dirty.take() {
            self.inner.seek(SeekFrom::Start(at))?;
            self.inner.write_all(&buf[..])?;
        }
        Ok(())
    }
}

impl<D: Read + Write + Seek> Read for SectorWriter<D> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.write_back()?;
        self.inner.seek(SeekFrom::Start(self.pos))?;
        let n = self.inner.read(buf)?;
        self.pos += n as u64;
        Ok(n)
    }
}

impl<D: Read + Write + Seek> Write for SectorWriter<D> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let sector = self.pos / SECTOR as u64 * SECTOR as u64;
        let within = (self.pos - sector) as usize;
        if within + buf.len() > SECTOR {
            // Not within one sector: in order, after what was gathered.
            self.write_back()?;
            self.inner.seek(SeekFrom::Start(self.pos))?;
            let n = self.inner.write(buf)?;
            self.pos += n as u64;
            return Ok(n);
        }
        if self.dirty.as_ref().is_none_or(|(at, _)| *at != sector) {
            self.write_back()?;
            let mut b = Box::new([0u8; SECTOR]);
            self.inner.seek(SeekFrom::Start(sector))?;
            // The last sector of a device may be short: keep what reads.
            let mut got = 0;
            while got < SECTOR {
                match self.inner.read(&mut b[got..])? {
                    0 => break,
                    k => got += k,
                }
            }
            if got < SECTOR {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "write past the end of the device",
                ));
            }
            self.dirty = Some((sector, b));
        }
        if let Some((_, b)) = self.dirty.as_mut() {
            b[within..within + buf.len()].copy_from_slice(buf);
        }
        self.pos += buf.len() as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.write_back()?;
        self.inner.flush()
    }
}

impl<D: Read + Write + Seek> Seek for SectorWriter<D> {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        let target = match to {
            SeekFrom::Start(p) => p,
            SeekFrom::Current(d) => self
                .pos
                .checked_add_signed(d)
                .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "seek before start"))?,
            SeekFrom::End(_) => {
                self.write_back()?;
                self.inner.seek(to)?
            }
        };
        self.pos = target;
        Ok(target)
    }
}

impl<D: Device> Device for SectorWriter<D> {
    fn sync(&mut self) -> io::Result<()> {
        self.write_back()?;
        self.inner.sync()
    }
}

impl<D: Read + Write + Seek> Drop for SectorWriter<D> {
    fn drop(&mut self) {
        // fatfs does not flush its device when it unmounts: its last write
        // (clearing the dirty flag) is written here. An error shows at the
        // caller's sync, which follows every change.
        let _ = self.write_back();
    }
}

/// A device that counts writes and, when asked, fails every write from the
/// `fail_at`-th on (1-based), as if the power had been cut just before it:
/// nothing of that write or any later one reaches the device. Handles made
/// with [`Faulty::share`] count together (two handles on one disk).
#[derive(Debug)]
pub struct Faulty<D> {
    inner: D,
    fail_at: Option<u64>,
    writes: Rc<Cell<u64>>,
    bytes: Rc<Cell<u64>>,
    refused: Rc<Cell<bool>>,
}

impl<D> Faulty<D> {
    /// Counts, never fails.
    pub fn counting(inner: D) -> Faulty<D> {
        Faulty {
            inner,
            fail_at: None,
            writes: Rc::default(),
            bytes: Rc::default(),
            refused: Rc::default(),
        }
    }

    /// Fails the `n`-th write (1-based) and all after it.
    pub fn failing_at(inner: D, n: u64) -> Faulty<D> {
        Faulty {
            fail_at: Some(n),
            ..Faulty::counting(inner)
        }
    }

    /// Another device counted with this one (and cut at the same write).
    pub fn share<E>(&self, inner: E) -> Faulty<E> {
        Faulty {
            inner,
            fail_at: self.fail_at,
            writes: self.writes.clone(),
            bytes: self.bytes.clone(),
            refused: self.refused.clone(),
        }
    }

    /// Writes that reached the devices.
    pub fn writes(&self) -> u64 {
        self.writes.get()
    }

    /// Bytes that reached the devices.
    pub fn bytes_written(&self) -> u64 {
        self.bytes.get()
    }

    pub fn into_inner(self) -> D {
        self.inner
    }

    fn cut(&self) -> bool {
        self.fail_at.is_some_and(|n| self.writes.get() + 1 >= n)
    }
}

/// The error of a write after the simulated power cut.
pub fn is_power_cut(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::Other && e.to_string().contains(POWER_CUT)
}

const POWER_CUT: &str = "simulated power cut";

impl<D: Read> Read for Faulty<D> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.inner.read(buf)
    }
}

impl<D: Write> Write for Faulty<D> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        if self.cut() {
            self.refused.set(true);
            return Err(io::Error::other(POWER_CUT));
        }
        let n = self.inner.write(buf)?;
        self.writes.set(self.writes.get() + 1);
        self.bytes.set(self.bytes.get() + n as u64);
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

impl<D: Seek> Seek for Faulty<D> {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        self.inner.seek(to)
    }
}

impl<D: Device> Device for Faulty<D> {
    fn sync(&mut self) -> io::Result<()> {
        // A sync fails once the power is off: after a refused write.
        if self.fail_at.is_some_and(|n| self.writes.get() + 1 >= n) && self.refused.get() {
            return Err(io::Error::other(POWER_CUT));
        }
        self.inner.sync()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_confines_reads_and_writes() {
        let mut dev = io::Cursor::new(vec![0u8; 100]);
        {
            let mut w = Window::new(&mut dev, 10, 20).unwrap();
            w.write_all(&[1u8; 20]).unwrap();
            assert!(w.write_all(&[2u8; 1]).is_err());
            w.seek(SeekFrom::Start(0)).unwrap();
            let mut back = Vec::new();
            w.read_to_end(&mut back).unwrap();
            assert_eq!(back, vec![1u8; 20]);
            assert_eq!(w.seek(SeekFrom::End(-5)).unwrap(), 15);
        }
        let v = dev.into_inner();
        assert_eq!(v[9], 0);
        assert_eq!(&v[10..30], &[1u8; 20]);
        assert_eq!(v[30], 0);
    }

    #[test]
    fn sector_writer_gathers_writes_within_a_sector() {
        let mut f = Faulty::counting(io::Cursor::new(vec![0u8; 2048]));
        {
            let mut w = SectorWriter::new(&mut f);
            w.seek(SeekFrom::Start(600)).unwrap();
            for b in 0..32u8 {
                w.write_all(&[b]).unwrap();
            }
            let mut back = [0u8; 4];
            w.seek(SeekFrom::Start(600)).unwrap();
            w.read_exact(&mut back).unwrap();
            assert_eq!(back, [0, 1, 2, 3], "reads see gathered writes");
            w.seek(SeekFrom::Start(1020)).unwrap();
            w.write_all(&[9; 8]).unwrap(); // across a sector boundary
            w.flush().unwrap();
        }
        assert_eq!(f.writes(), 2, "one sector write, one straight write");
        let v = f.into_inner().into_inner();
        assert_eq!(&v[600..604], &[0, 1, 2, 3]);
        assert_eq!(v[631], 31);
        assert_eq!(&v[1020..1028], &[9; 8]);
    }

    #[test]
    fn window_bounds_and_faults() {
        let mut w = Window::new(io::Cursor::new(vec![0u8; 100]), 10, 20).unwrap();
        w.write_all(&[1; 20]).unwrap();
        assert!(w.write(&[1]).is_err(), "past the end");
        let inner = w.into_inner().into_inner();
        assert_eq!(
            &inner[8..32],
            &[
                0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0
            ]
        );

        let mut f = Faulty::failing_at(io::Cursor::new(vec![0u8; 8]), 3);
        f.write_all(&[1]).unwrap();
        f.write_all(&[2]).unwrap();
        let e = f.write_all(&[3]).unwrap_err();
        assert!(is_power_cut(&e), "{e}");
        assert!(f.sync().is_err());
        assert_eq!((f.writes(), f.bytes_written()), (2, 2));
        assert_eq!(&f.into_inner().into_inner()[..3], &[1, 2, 0]);
    }
}
