//! A blob's bytes as they arrive, checked: [`VerifiedReader`] counts and
//! hashes what it passes on, and ends in an error, never a plain end of
//! file, when the stream ends short, runs long, or hashes to another
//! digest. A consumer that read to the end of file has read exactly the
//! blob the digest names.

use crate::error::{Error, ErrorKind};
use crate::reference::Digest;
use sha2::{Digest as _, Sha256};
use std::io::{self, Read};

/// Reads `expected.size` bytes of `inner`, checking them against
/// `expected.digest` (see the module's documentation).
pub struct VerifiedReader<R> {
    inner: R,
    digest: Digest,
    size: u64,
    read: u64,
    hasher: Sha256,
    /// What the blob is, for messages (`layer sha256:… of REF`).
    what: String,
    state: State,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    Reading,
    /// Verified: the end of file is real.
    Done,
    /// Failed: every later read fails the same way.
    Failed(Error),
}

impl<R: Read> VerifiedReader<R> {
    pub fn new(inner: R, digest: Digest, size: u64, what: String) -> VerifiedReader<R> {
        VerifiedReader {
            inner,
            digest,
            size,
            read: 0,
            hasher: Sha256::new(),
            what,
            state: State::Reading,
        }
    }

    /// The bytes passed on so far.
    pub fn bytes_read(&self) -> u64 {
        self.read
    }

    fn fail(&mut self, kind: ErrorKind, msg: String) -> io::Error {
        let e = Error::new(kind, msg);
        self.state = State::Failed(e.clone());
        e.into()
    }

    /// All `size` bytes were read: nothing may follow, and the digest must be
    /// the expected one.
    fn finish(&mut self) -> io::Result<()> {
        let mut probe = [0u8; 1];
        let extra = loop {
            match self.inner.read(&mut probe) {
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    return Err(self.fail(
                        ErrorKind::Truncated,
                        format!("{}: after its {} bytes: {e}", self.what, self.size),
                    ));
                }
            }
        };
        if extra != 0 {
            return Err(self.fail(
                ErrorKind::Truncated,
                format!(
                    "{} runs past the {} bytes its descriptor declares: refused",
                    self.what, self.size
                ),
            ));
        }
        let hasher = std::mem::take(&mut self.hasher);
        let got = Digest::from_sha256(hasher.finalize().as_slice());
        if got != self.digest {
            return Err(self.fail(
                ErrorKind::DigestMismatch,
                format!(
                    "{} is corrupt or tampered with: its {} bytes hash to {got}, not {}: \
                     discard what was read",
                    self.what, self.size, self.digest
                ),
            ));
        }
        self.state = State::Done;
        Ok(())
    }
}

impl<R: Read> Read for VerifiedReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match &self.state {
            State::Done => return Ok(0),
            State::Failed(e) => return Err(e.clone().into()),
            State::Reading => {}
        }
        if buf.is_empty() {
            return Ok(0);
        }
        let remaining = self.size - self.read;
        if remaining == 0 {
            self.finish()?;
            return Ok(0);
        }
        let want = usize::try_from(remaining).map_or(buf.len(), |r| r.min(buf.len()));
        let n = match self.inner.read(&mut buf[..want]) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return Err(e),
            Err(e) => {
                let msg = format!(
                    "{}: the stream failed after {} of {} bytes: {e}",
                    self.what, self.read, self.size
                );
                return Err(self.fail(ErrorKind::Truncated, msg));
            }
        };
        if n == 0 {
            let msg = format!(
                "{} ended after {} of the {} bytes its descriptor declares (connection cut?): \
                 discard what was read",
                self.what, self.read, self.size
            );
            return Err(self.fail(ErrorKind::Truncated, msg));
        }
        self.hasher.update(&buf[..n]);
        self.read += n as u64;
        if self.read == self.size {
            // Verified before the last bytes are handed over: a consumer
            // never sees a complete, unverified blob.
            self.finish()?;
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    fn reader(data: &[u8], of: &[u8], size: u64) -> VerifiedReader<Cursor<Vec<u8>>> {
        VerifiedReader::new(
            Cursor::new(data.to_vec()),
            Digest::of(of),
            size,
            "blob".into(),
        )
    }

    fn read_all(r: &mut impl Read) -> Result<Vec<u8>, ErrorKind> {
        let mut v = Vec::new();
        r.read_to_end(&mut v)
            .map(|_| v)
            .map_err(|e| Error::of_io(&e).map_or(ErrorKind::Http, Error::kind))
    }

    #[test]
    fn exact_blob_reads_to_eof() {
        let data = vec![7u8; 100_000];
        let mut r = reader(&data, &data, data.len() as u64);
        assert_eq!(read_all(&mut r), Ok(data.clone()));
        assert_eq!(r.bytes_read(), 100_000);
        let mut b = [0u8; 4];
        assert_eq!(r.read(&mut b).ok(), Some(0));
        // The empty blob too.
        assert_eq!(read_all(&mut reader(b"", b"", 0)), Ok(vec![]));
    }

    #[test]
    fn short_long_and_wrong_are_errors() {
        let data = b"hello world".to_vec();
        assert_eq!(
            read_all(&mut reader(&data[..5], &data, 11)),
            Err(ErrorKind::Truncated)
        );
        let mut longer = data.clone();
        longer.push(b'!');
        assert_eq!(
            read_all(&mut reader(&longer, &data, 11)),
            Err(ErrorKind::Truncated)
        );
        assert_eq!(
            read_all(&mut reader(b"hello WORLD", &data, 11)),
            Err(ErrorKind::DigestMismatch)
        );
        assert_eq!(
            read_all(&mut reader(b"x", b"", 0)),
            Err(ErrorKind::Truncated)
        );
        // The error stays: a retrying consumer never gets an end of file.
        let mut r = reader(b"hello WORLD", &data, 11);
        assert!(read_all(&mut r).is_err());
        assert!(read_all(&mut r).is_err());
    }

    #[test]
    fn the_last_bytes_come_only_once_verified() {
        let data = b"abcdef".to_vec();
        let mut r = reader(b"abcdeX", &data, 6);
        let mut buf = [0u8; 6];
        assert!(
            r.read(&mut buf).is_err(),
            "the read that completes the blob fails"
        );
    }

    /// A stream that fails in the middle (a cut connection).
    struct Cut(usize);
    impl Read for Cut {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            if self.0 == 0 {
                return Err(io::Error::new(io::ErrorKind::ConnectionReset, "reset"));
            }
            let n = self.0.min(buf.len());
            buf[..n].fill(1);
            self.0 -= n;
            Ok(n)
        }
    }

    #[test]
    fn a_failing_stream_is_an_error() {
        let mut r = VerifiedReader::new(Cut(10), Digest::of(&[1u8; 20]), 20, "blob".into());
        assert_eq!(read_all(&mut r), Err(ErrorKind::Truncated));
    }
}
