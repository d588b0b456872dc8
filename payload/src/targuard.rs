//! The guard in front of every tar reader of untrusted bytes (installer
//! image layers from a registry or an archive, the OCI archive itself).
//!
//! The `tar` crate reads a GNU long-name or long-link entry (`L`, `K`) and a
//! PAX extended header (`x`, `g`) whole into memory before it yields the
//! entry they describe, however large their header says they are, and
//! reads a GNU sparse entry's (`S`) extension blocks the same way: a
//! registry that serves a genuine signed first layer and then a second
//! layer whose first header claims 1 GiB of long name makes the reader
//! allocate it before any digest is checked (issue 25: the node ran out of
//! memory). [`TarGuard`] sits between the bytes and the `tar` crate: it
//! reads each 512-byte header before passing it on (ustar layout, POSIX.1-2001
//! "pax Header Block"; GNU tar manual, "Basic Tar Format"), refuses an
//! extension entry larger than its bound ([`MAX_LONG_NAME`], [`MAX_PAX`])
//! and any sparse entry, and passes everything else through unchanged,
//! entry data included. It keeps one header (512 bytes) and allocates
//! nothing else. After the archive's end (a zero block) the rest is passed
//! through unread: the `tar` crate stops there, and readers that drain a
//! blob to its digest read it.

use std::io::{self, Read, Seek, SeekFrom};

/// The most bytes a GNU long name or long link (`L`, `K`) may claim: a
/// Linux path (PATH_MAX). Our layers have none; GNU tar writes them for
/// names over 100 bytes.
pub const MAX_LONG_NAME: u64 = 4096;
/// The most bytes a PAX extended header (`x`, `g`) may claim: a few long
/// names and times with room to spare. Our layers have none.
pub const MAX_PAX: u64 = 64 * 1024;

const BLOCK: usize = 512;

/// A reader of a tar stream that refuses oversized extension headers
/// before the `tar` crate reads them (module doc).
pub struct TarGuard<R> {
    inner: R,
    /// Bytes passed on so far.
    pos: u64,
    /// Where the next header starts.
    next: u64,
    /// The header being passed on, and how much of it is read / passed on.
    header: [u8; BLOCK],
    filled: usize,
    served: usize,
    /// A zero block was seen: the archive has ended.
    ended: bool,
}

impl<R> TarGuard<R> {
    pub fn new(inner: R) -> Self {
        TarGuard {
            inner,
            pos: 0,
            next: 0,
            header: [0; BLOCK],
            filled: 0,
            served: 0,
            ended: false,
        }
    }
}

fn refuse(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// A header's size field (offset 124, 12 bytes): octal digits padded with
/// spaces or NULs, or GNU's base-256 (top bit of the first byte set).
fn size_field(h: &[u8; BLOCK]) -> io::Result<u64> {
    let f = &h[124..136];
    if f[0] & 0x80 != 0 {
        // Base-256, big-endian, in the 11 bytes after the marker byte
        // (and its low bits, which a size that fits in u64 leaves zero).
        let mut v: u64 = u64::from(f[0] & 0x7f);
        for &b in &f[1..] {
            v = v
                .checked_mul(256)
                .and_then(|v| v.checked_add(u64::from(b)))
                .ok_or_else(|| refuse("a tar header's size does not fit in 64 bits".into()))?;
        }
        return Ok(v);
    }
    let digits = f
        .iter()
        .copied()
        .skip_while(|&b| b == b' ')
        .take_while(|&b| b != b' ' && b != 0);
    let mut v: u64 = 0;
    let mut any = false;
    for b in digits {
        if !(b'0'..=b'7').contains(&b) {
            return Err(refuse(
                "a tar header's size is not an octal number: not a tar archive".into(),
            ));
        }
        v = v * 8 + u64::from(b - b'0');
        any = true;
    }
    if !any && f.iter().any(|&b| b != 0) {
        return Err(refuse(
            "a tar header's size is empty: not a tar archive".into(),
        ));
    }
    Ok(v)
}

/// Checks a whole header; returns the size of its entry's data.
fn check(h: &[u8; BLOCK]) -> io::Result<u64> {
    let size = size_field(h)?;
    let bound = match h[156] {
        b'L' => Some(("a GNU long name", MAX_LONG_NAME)),
        b'K' => Some(("a GNU long link name", MAX_LONG_NAME)),
        b'x' => Some(("a PAX extended header", MAX_PAX)),
        b'g' => Some(("a PAX global header", MAX_PAX)),
        b'S' => {
            return Err(refuse(
                "the tar stream holds a GNU sparse file: installer images hold only \
                 regular files and directories (refusing it before reading it)"
                    .into(),
            ));
        }
        _ => None,
    };
    if let Some((what, max)) = bound
        && size > max
    {
        return Err(refuse(format!(
            "the tar stream has {what} of {size} bytes, over the {max} accepted: \
             refusing it before reading it (not an image imager made, or a hostile one)"
        )));
    }
    Ok(size)
}

impl<R: Read> TarGuard<R> {
    /// Reads the header at `next` whole (or up to the stream's end, which
    /// the `tar` crate then reports) and checks it.
    fn take_header(&mut self) -> io::Result<()> {
        self.filled = 0;
        self.served = 0;
        while self.filled < BLOCK {
            match self.inner.read(&mut self.header[self.filled..]) {
                Ok(0) => break,
                Ok(n) => self.filled += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        if self.filled < BLOCK {
            // A short last block: passed on as it is, nothing more to check.
            self.ended = true;
            return Ok(());
        }
        if self.header.iter().all(|&b| b == 0) {
            self.ended = true;
            return Ok(());
        }
        let size = check(&self.header)?;
        let padded = size
            .checked_add(BLOCK as u64 - 1)
            .map(|s| s / BLOCK as u64 * BLOCK as u64)
            .ok_or_else(|| refuse("a tar header's size does not fit in 64 bits".into()))?;
        self.next = self
            .next
            .checked_add(BLOCK as u64 + padded)
            .ok_or_else(|| refuse("a tar entry ends past 2^64 bytes".into()))?;
        Ok(())
    }
}

impl<R: Read> Read for TarGuard<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        if !self.ended && self.served == self.filled && self.pos == self.next {
            self.take_header()?;
        }
        if self.served < self.filled {
            let n = buf.len().min(self.filled - self.served);
            buf[..n].copy_from_slice(&self.header[self.served..self.served + n]);
            self.served += n;
            self.pos += n as u64;
            return Ok(n);
        }
        let limit = if self.ended {
            buf.len()
        } else {
            // Entry data: up to the next header, which is read whole first.
            usize::try_from(self.next - self.pos).map_or(buf.len(), |left| buf.len().min(left))
        };
        let n = self.inner.read(&mut buf[..limit])?;
        self.pos += n as u64;
        Ok(n)
    }
}

/// Seeking (the `tar` crate's `entries_with_seek` skips entry data) moves
/// within an entry's data or to the next header, never past it.
impl<R: Read + Seek> Seek for TarGuard<R> {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        if self.served < self.filled {
            return Err(refuse("seeking inside a tar header".into()));
        }
        let target = match to {
            SeekFrom::Start(p) => Some(p),
            SeekFrom::Current(d) => self.pos.checked_add_signed(d),
            SeekFrom::End(_) => None,
        };
        if !self.ended && target.is_none_or(|t| t > self.next || t < self.pos) {
            return Err(refuse(
                "seeking past a tar header or backwards in a tar stream".into(),
            ));
        }
        let at = self.inner.seek(to)?;
        self.pos = at;
        Ok(at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ustar header of `kind` claiming `size` bytes, checksum right.
    fn header(name: &str, kind: u8, size: u64) -> Vec<u8> {
        let mut h = tar::Header::new_ustar();
        h.set_path(name).unwrap();
        h.set_size(size);
        h.set_mode(0o644);
        h.set_entry_type(tar::EntryType::new(kind));
        h.set_cksum();
        h.as_bytes().to_vec()
    }

    /// An archive of two files, made by the tar crate's builder.
    fn plain() -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (name, data) in [("a", &b"hello"[..]), ("dir/b", &[7u8; 1500][..])] {
            let mut h = tar::Header::new_ustar();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            h.set_cksum();
            b.append_data(&mut h, name, data).unwrap();
        }
        b.into_inner().unwrap()
    }

    fn names(r: impl Read) -> io::Result<Vec<(String, Vec<u8>)>> {
        let mut a = tar::Archive::new(r);
        let mut out = Vec::new();
        for e in a.entries()? {
            let mut e = e?;
            let name = e.path()?.display().to_string();
            let mut data = Vec::new();
            e.read_to_end(&mut data)?;
            out.push((name, data));
        }
        Ok(out)
    }

    /// Reads `r` a few bytes at a time (as a network stream arrives).
    struct Trickle<R>(R);
    impl<R: Read> Read for Trickle<R> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = buf.len().min(7);
            self.0.read(&mut buf[..n])
        }
    }

    #[test]
    fn a_plain_archive_reads_the_same_through_the_guard() {
        let bytes = plain();
        let direct = names(&bytes[..]).unwrap();
        assert_eq!(direct.len(), 2);
        assert_eq!(names(TarGuard::new(&bytes[..])).unwrap(), direct);
        assert_eq!(names(TarGuard::new(Trickle(&bytes[..]))).unwrap(), direct);
        // Every byte passes through unchanged, the end included.
        let mut all = Vec::new();
        TarGuard::new(Trickle(&bytes[..]))
            .read_to_end(&mut all)
            .unwrap();
        assert_eq!(all, bytes);
    }

    #[test]
    fn long_names_and_pax_headers_within_their_bounds_are_read() {
        let long = format!("{}/file", "d".repeat(300));
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_size(3);
        h.set_mode(0o644);
        b.append_data(&mut h, &long, &b"abc"[..]).unwrap();
        let bytes = b.into_inner().unwrap();
        assert!(bytes.chunks(512).any(|c| c.len() == 512 && c[156] == b'L'));
        let got = names(TarGuard::new(&bytes[..])).unwrap();
        assert_eq!(got, vec![(long, b"abc".to_vec())]);
    }

    /// The attack of issue 25: a header claiming hundreds of MiB of long
    /// name (or PAX records), then nothing. Refused at the header, before
    /// the tar crate allocates: the test reads from a stream that would
    /// fail the test if more than the header were read from it.
    #[test]
    fn oversized_extension_headers_are_refused_before_their_data_is_read() {
        struct HeaderOnly(Vec<u8>, usize);
        impl Read for HeaderOnly {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                assert!(self.1 < 512, "read past the hostile header");
                let n = buf.len().min(self.0.len() - self.1);
                buf[..n].copy_from_slice(&self.0[self.1..self.1 + n]);
                self.1 += n;
                Ok(n)
            }
        }
        for (kind, size, words) in [
            (b'L', 400 << 20, "GNU long name of 419430400 bytes"),
            (b'K', MAX_LONG_NAME + 1, "GNU long link name of 4097"),
            (b'x', 1 << 30, "PAX extended header of 1073741824"),
            (b'g', MAX_PAX + 1, "PAX global header of 65537"),
            (b'S', 10, "GNU sparse file"),
        ] {
            let r = HeaderOnly(header("././@LongLink", kind, size), 0);
            let err = names(TarGuard::new(r)).unwrap_err().to_string();
            assert!(err.contains(words), "{}: {err}", kind as char);
        }
        // At the bound: read (and here, then short: the tar crate's error).
        let mut at = header("././@LongLink", b'L', MAX_LONG_NAME);
        at.extend(vec![b'n'; MAX_LONG_NAME as usize]);
        let err = names(TarGuard::new(&at[..])).unwrap_err().to_string();
        assert!(!err.contains("over the"), "{err}");
    }

    /// A hostile header after a genuine first entry is refused as well.
    #[test]
    fn a_hostile_header_after_good_entries_is_refused() {
        let mut bytes = plain();
        // Replace the end-of-archive blocks with a hostile header.
        let end = bytes.len() - 1024;
        bytes.truncate(end);
        bytes.extend(header("x", b'x', 1 << 40));
        bytes.extend([0u8; 1024]);
        let err = names(TarGuard::new(&bytes[..])).unwrap_err().to_string();
        assert!(err.contains("PAX extended header"), "{err}");
    }

    #[test]
    fn malformed_sizes_are_refused_not_trusted() {
        let mut h = header("a", b'0', 0);
        h[124..136].copy_from_slice(b"99999999999\0");
        let err = names(TarGuard::new(&h[..])).unwrap_err().to_string();
        assert!(err.contains("octal"), "{err}");
        let mut h = header("a", b'0', 0);
        h[124..136].copy_from_slice(&[0xff; 12]);
        let err = names(TarGuard::new(&h[..])).unwrap_err().to_string();
        assert!(err.contains("64 bits"), "{err}");
    }

    #[test]
    fn seeking_skips_data_but_never_a_header() {
        let bytes = plain();
        let mut a = tar::Archive::new(TarGuard::new(io::Cursor::new(bytes.clone())));
        let got: Vec<String> = a
            .entries_with_seek()
            .unwrap()
            .map(|e| e.unwrap().path().unwrap().display().to_string())
            .collect();
        assert_eq!(got, ["a", "dir/b"]);
        let mut g = TarGuard::new(io::Cursor::new(bytes));
        let mut h = [0u8; 512];
        g.read_exact(&mut h).unwrap();
        assert!(g.seek(SeekFrom::Current(4096)).is_err());
        assert!(g.seek(SeekFrom::Current(512)).is_ok());
    }
}
