//! Devices: what the slot operations read and write. A disk image file, a
//! block device, or a window on either (a partition), all flushed through
//! [`Device::sync`] at the points where the write order matters.
//!
//! [`Faulty`] cuts the power after a given number of writes, losing what a
//! [`Loss`] pattern says of the writes since the last sync, for the tests
//! that prove every step of an upgrade crash-safe, and counts the writes,
//! bytes and syncs an operation makes, for the benchmark.

use std::cell::Cell;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::rc::Rc;

/// A readable, writable, seekable device whose writes can be made durable.
///
/// Writes are not durable by themselves (the handles are not opened with
/// `O_DSYNC`): they may reach the disk in any order, or not at all, until
/// the next [`Device::sync`]. A sync is the barrier that orders them: what
/// was written before it is on the disk before anything written after it.
pub trait Device: Read + Write + Seek {
    /// Makes every write so far durable before later writes: `fdatasync` on
    /// a file or a block device (which also flushes the disk's cache).
    fn sync(&mut self) -> io::Result<()>;
}

impl Device for File {
    fn sync(&mut self) -> io::Result<()> {
        // The data and what is needed to read it back (the size of an
        // image file never changes here): fdatasync.
        self.sync_data()
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

/// What a power cut loses of the writes a handle made since its last
/// [`Device::sync`]: without `O_DSYNC` a write sits in the page cache (or
/// the disk's cache) until a sync, and the cache writes back in its own
/// order, so any of them may be missing after the cut. Every
/// cut-at-every-write test runs under each ([`Loss::ALL`], [`each_loss`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loss {
    /// Every write reached the disk (as with `O_DSYNC`).
    None,
    /// None of them did.
    All,
    /// The earlier half of them is lost, the later half kept.
    EarlierHalf,
    /// The later half is lost.
    LaterHalf,
    /// Each 512-byte sector of each of them is kept or lost by a coin
    /// seeded with the given number.
    Coin(u64),
}

impl Loss {
    /// The patterns every cut test runs under.
    pub const ALL: [Loss; 6] = [
        Loss::None,
        Loss::All,
        Loss::EarlierHalf,
        Loss::LaterHalf,
        Loss::Coin(1),
        Loss::Coin(0x5eed),
    ];
}

thread_local! {
    static LOSS: Cell<Loss> = const { Cell::new(Loss::None) };
}

/// Runs `f` once under each [`Loss`] pattern: [`Faulty::failing_at`] made
/// by `f` on this thread loses what that pattern says at its cut.
pub fn each_loss(mut f: impl FnMut(Loss)) {
    for loss in Loss::ALL {
        LOSS.with(|l| l.set(loss));
        // Said first: a failed test's output then names its pattern.
        eprintln!("power cuts lose: {loss:?}");
        f(loss);
    }
    LOSS.with(|l| l.set(Loss::None));
}

/// One write not yet synced: where, what was there, what was written.
#[derive(Debug)]
struct Unsynced {
    at: u64,
    old: Vec<u8>,
    new: Vec<u8>,
}

/// A device that counts writes and syncs and, when asked, cuts the power
/// just before the `fail_at`-th write (1-based): nothing of that write or
/// any later one reaches the device, and of the writes this handle made
/// since its last [`Device::sync`] only what the [`Loss`] pattern keeps
/// (set by [`each_loss`]; none is lost outside it). A sync is the barrier:
/// what was written before it survives the cut. Handles made with
/// [`Faulty::share`] count together and are cut together (two handles on
/// one disk), each losing its own unsynced writes.
#[derive(Debug)]
pub struct Faulty<D> {
    inner: D,
    fail_at: Option<u64>,
    loss: Loss,
    /// Writes since the last sync (kept only when a cut is planned).
    unsynced: Vec<Unsynced>,
    writes: Rc<Cell<u64>>,
    bytes: Rc<Cell<u64>>,
    syncs: Rc<Cell<u64>>,
    refused: Rc<Cell<bool>>,
}

impl<D> Faulty<D> {
    /// Counts, never fails.
    pub fn counting(inner: D) -> Faulty<D> {
        Faulty {
            inner,
            fail_at: None,
            loss: Loss::None,
            unsynced: Vec::new(),
            writes: Rc::default(),
            bytes: Rc::default(),
            syncs: Rc::default(),
            refused: Rc::default(),
        }
    }

    /// Cuts the power before the `n`-th write (1-based), losing what the
    /// current [`Loss`] pattern of this thread says.
    pub fn failing_at(inner: D, n: u64) -> Faulty<D> {
        Faulty {
            fail_at: Some(n),
            loss: LOSS.with(Cell::get),
            ..Faulty::counting(inner)
        }
    }

    /// Another device counted with this one (and cut at the same write).
    pub fn share<E>(&self, inner: E) -> Faulty<E> {
        Faulty {
            inner,
            fail_at: self.fail_at,
            loss: self.loss,
            unsynced: Vec::new(),
            writes: self.writes.clone(),
            bytes: self.bytes.clone(),
            syncs: self.syncs.clone(),
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

    /// Syncs made.
    pub fn syncs(&self) -> u64 {
        self.syncs.get()
    }

    fn cut(&self) -> bool {
        self.fail_at.is_some_and(|n| self.writes.get() + 1 >= n)
    }
}

impl<D: Write + Seek> Faulty<D> {
    /// The device as the cut left it.
    pub fn into_inner(mut self) -> D {
        // An error here leaves the writes in place: the test sees more
        // than the pattern would keep, never less.
        let _ = self.lose();
        self.inner
    }

    /// After the cut: undoes the unsynced writes the pattern loses. All are
    /// undone, newest first, then those kept are written again in order.
    fn lose(&mut self) -> io::Result<()> {
        if !self.refused.get() || self.unsynced.is_empty() {
            return Ok(());
        }
        let log = std::mem::take(&mut self.unsynced);
        let back = self.inner.stream_position()?;
        for w in log.iter().rev() {
            self.inner.seek(SeekFrom::Start(w.at))?;
            self.inner.write_all(&w.old)?;
        }
        let n = log.len();
        for (i, w) in log.iter().enumerate() {
            let keep_all = match self.loss {
                Loss::None => true,
                Loss::All => false,
                Loss::EarlierHalf => i >= n.div_ceil(2),
                Loss::LaterHalf => i < n / 2,
                Loss::Coin(seed) => {
                    for (k, piece) in w.new.chunks(512).enumerate() {
                        if coin(seed, i as u64, k as u64) {
                            self.inner.seek(SeekFrom::Start(w.at + 512 * k as u64))?;
                            self.inner.write_all(piece)?;
                        }
                    }
                    false
                }
            };
            if keep_all {
                self.inner.seek(SeekFrom::Start(w.at))?;
                self.inner.write_all(&w.new)?;
            }
        }
        self.inner.seek(SeekFrom::Start(back))?;
        Ok(())
    }
}

/// A fair coin for write `i`'s sector `k` under `seed` (splitmix64).
fn coin(seed: u64, i: u64, k: u64) -> bool {
    let mut z =
        seed ^ i.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ k.wrapping_mul(0xD1B5_4A32_D192_ED03);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (z ^ (z >> 31)) & 1 == 1
}

/// The error of a write after the simulated power cut.
pub fn is_power_cut(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::Other && e.to_string().contains(POWER_CUT)
}

const POWER_CUT: &str = "simulated power cut";

impl<D: Read + Write + Seek> Read for Faulty<D> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.lose()?;
        self.inner.read(buf)
    }
}

impl<D: Read + Write + Seek> Write for Faulty<D> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        if self.cut() {
            self.refused.set(true);
            self.lose()?;
            return Err(io::Error::other(POWER_CUT));
        }
        if self.fail_at.is_some() && self.loss != Loss::None {
            // What the write replaces, to undo it at the cut.
            let at = self.inner.stream_position()?;
            let mut old = vec![0u8; buf.len()];
            let mut got = 0;
            while got < old.len() {
                match self.inner.read(&mut old[got..])? {
                    0 => break,
                    k => got += k,
                }
            }
            self.inner.seek(SeekFrom::Start(at))?;
            let n = self.inner.write(buf)?;
            old.truncate(n);
            self.unsynced.push(Unsynced {
                at,
                old,
                new: buf[..n].to_vec(),
            });
            self.count(n);
            return Ok(n);
        }
        let n = self.inner.write(buf)?;
        self.count(n);
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

impl<D> Faulty<D> {
    fn count(&self, n: usize) {
        self.writes.set(self.writes.get() + 1);
        self.bytes.set(self.bytes.get() + n as u64);
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
        if self.refused.get() {
            self.lose()?;
            return Err(io::Error::other(POWER_CUT));
        }
        self.inner.sync()?;
        self.syncs.set(self.syncs.get() + 1);
        // The barrier: what was written so far survives a later cut.
        self.unsynced.clear();
        Ok(())
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
