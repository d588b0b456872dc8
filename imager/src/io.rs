//! I/O adapters: atomic outputs, partition windows and hashing streams.
//!
//! Outputs never appear half-written: [`AtomicFile`] writes to a hidden
//! temporary file in the destination directory and renames it into place on
//! [`AtomicFile::commit`]; dropping it uncommitted removes the temporary.
//! A set of outputs that must replace another set together (a build) is
//! written into a [`Staging`] directory and moved into place at the end;
//! [`try_lock_dir`] keeps a second writer out of the directory meanwhile.

use anyhow::{Context, Result};
use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

/// A file that appears under its final name only when committed.
#[derive(Debug)]
pub struct AtomicFile {
    tmp: Option<tempfile::NamedTempFile>,
    dest: PathBuf,
}

impl AtomicFile {
    pub fn create(dest: impl AsRef<Path>) -> Result<AtomicFile> {
        let dest = dest.as_ref().to_path_buf();
        let dir = dest
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let name = dest
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let tmp = tempfile::Builder::new()
            .prefix(&format!(".{name}."))
            .suffix(".partial")
            .tempfile_in(dir)
            .with_context(|| format!("creating a temporary file for {}", dest.display()))?;
        Ok(AtomicFile {
            tmp: Some(tmp),
            dest,
        })
    }

    pub fn file(&mut self) -> &mut File {
        self.tmp
            .as_mut()
            .expect("AtomicFile used after commit")
            .as_file_mut()
    }

    pub fn path(&self) -> &Path {
        self.tmp
            .as_ref()
            .expect("AtomicFile used after commit")
            .path()
    }

    /// Flushes to stable storage, sets the mode and renames into place.
    pub fn commit_with_mode(self, mode: u32) -> Result<PathBuf> {
        self.finish(mode, true)
    }

    /// Sets the mode, flushes when `flush`, and renames into place.
    fn finish(mut self, mode: u32, flush: bool) -> Result<PathBuf> {
        use std::os::unix::fs::PermissionsExt;
        let tmp = self.tmp.take().expect("AtomicFile committed twice");
        tmp.as_file()
            .set_permissions(std::fs::Permissions::from_mode(mode))
            .with_context(|| format!("setting the mode of {}", self.dest.display()))?;
        if flush {
            tmp.as_file()
                .sync_all()
                .with_context(|| format!("flushing {}", self.dest.display()))?;
        }
        tmp.persist(&self.dest)
            .with_context(|| format!("renaming into {}", self.dest.display()))?;
        Ok(self.dest.clone())
    }

    pub fn commit(self) -> Result<PathBuf> {
        self.commit_with_mode(0o644)
    }

    /// Renames into place without flushing: for a cache whose reader
    /// checks what it reads, where a file lost or cut by a power cut only
    /// costs time.
    pub fn commit_unflushed(self) -> Result<PathBuf> {
        self.finish(0o644, false)
    }
}

impl Write for AtomicFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.file().write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.file().flush()
    }
}

/// Removes the temporaries an interrupted writer left in `dir` (hidden
/// `.NAME.*.partial` files and directories: a killed process runs no
/// destructor). Returns how many were removed.
pub fn remove_stale_partials(dir: &Path) -> Result<usize> {
    remove_partials(dir, |_, _| true)
}

/// [`remove_stale_partials`], only of those temporaries that `pick` (given
/// each one's entry and name) says to remove.
pub fn remove_partials(
    dir: &Path,
    pick: impl Fn(&std::fs::DirEntry, &str) -> bool,
) -> Result<usize> {
    let mut n = 0;
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e).with_context(|| format!("listing {}", dir.display())),
    };
    for entry in entries {
        let entry = entry.with_context(|| format!("listing {}", dir.display()))?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with('.') && name.ends_with(".partial") && pick(&entry, &name) {
            let path = entry.path();
            let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
            if is_dir {
                std::fs::remove_dir_all(&path)
            } else {
                std::fs::remove_file(&path)
            }
            .with_context(|| format!("removing {}", path.display()))?;
            n += 1;
        }
    }
    Ok(n)
}

/// An exclusive advisory lock (`flock`) on a directory itself, held for as
/// long as the value lives. Nothing is created in the directory: a failed
/// run leaves it as it was.
#[derive(Debug)]
pub struct DirLock {
    _dir: File,
    held: bool,
}

impl DirLock {
    /// False when the filesystem cannot lock (flock unsupported): the work
    /// goes on unlocked and must not assume that nobody else is in the
    /// directory.
    pub fn held(&self) -> bool {
        self.held
    }
}

/// Takes the exclusive lock on the directory `dir` without waiting;
/// `Ok(None)` when another process holds it.
pub fn try_lock_dir(dir: &Path) -> Result<Option<DirLock>> {
    let f = File::open(dir).with_context(|| format!("opening {}", dir.display()))?;
    if !f
        .metadata()
        .with_context(|| format!("reading {}", dir.display()))?
        .is_dir()
    {
        anyhow::bail!("{} is not a directory", dir.display());
    }
    match f.try_lock() {
        Ok(()) => Ok(Some(DirLock {
            _dir: f,
            held: true,
        })),
        Err(std::fs::TryLockError::WouldBlock) => Ok(None),
        Err(std::fs::TryLockError::Error(e)) if e.kind() == io::ErrorKind::Unsupported => {
            Ok(Some(DirLock {
                _dir: f,
                held: false,
            }))
        }
        Err(std::fs::TryLockError::Error(e)) => {
            Err(e).with_context(|| format!("locking {}", dir.display()))
        }
    }
}

/// Flushes a directory's entries (renames, removals) to stable storage.
pub fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("flushing the directory {}", dir.display()))
}

/// A set of outputs written under their final names into a hidden staging
/// directory of their destination (`DEST/.NAME.XXXX.partial/`), then moved
/// into `DEST` together and in a chosen order by [`Staging::commit`]: until
/// then, `DEST` holds what it held before. Writers need no special mode:
/// they write (atomically, as always) into [`Staging::path`].
///
/// Dropped, the staging directory is removed with what is left in it; left
/// by a killed process, it is swept by [`remove_stale_partials`] (a
/// `.partial` directory).
#[derive(Debug)]
pub struct Staging {
    dir: tempfile::TempDir,
    dest: PathBuf,
}

impl Staging {
    /// A new staging directory in `dest`, named after `what`.
    pub fn create(dest: &Path, what: &str) -> Result<Staging> {
        let dir = tempfile::Builder::new()
            .prefix(&format!(".{what}."))
            .suffix(".partial")
            .tempdir_in(dest)
            .with_context(|| format!("creating a staging directory in {}", dest.display()))?;
        Ok(Staging {
            dir,
            dest: dest.to_path_buf(),
        })
    }

    /// Where to write the outputs.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The staged file `name`.
    pub fn join(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Refuses to go on when one of `names` is in the way in the
    /// destination: anything there but a regular file (a directory, a
    /// link, a device) is not ours to replace.
    pub fn check_destinations(&self, names: &[&str]) -> Result<()> {
        check_replaceable(&self.dest, names)
    }

    /// Moves the staged files `names` into the destination, in order (each
    /// a rename on one filesystem: atomic), then flushes the destination
    /// directory. Every name is checked first ([`Self::check_destinations`]).
    pub fn commit(&self, names: &[&str]) -> Result<()> {
        self.check_destinations(names)?;
        for name in names {
            let (from, to) = (self.join(name), self.dest.join(name));
            std::fs::rename(&from, &to)
                .with_context(|| format!("moving {} into place", to.display()))?;
        }
        sync_dir(&self.dest)
    }
}

/// Refuses when one of `names` in `dir` exists and is not a regular file
/// (see [`Staging::check_destinations`]).
pub fn check_replaceable(dir: &Path, names: &[&str]) -> Result<()> {
    for name in names {
        let path = dir.join(name);
        match std::fs::symlink_metadata(&path) {
            Ok(m) if !m.file_type().is_file() => anyhow::bail!(
                "{} is in the way: it is not a regular file, and the build replaces only \
                 files; move it away or build into another directory",
                path.display()
            ),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("looking at {}", path.display())),
        }
    }
    Ok(())
}

/// Writes `bytes` to `dest` atomically.
pub fn write_atomic(dest: impl AsRef<Path>, bytes: &[u8], mode: u32) -> Result<PathBuf> {
    let mut f = AtomicFile::create(dest.as_ref())?;
    f.write_all(bytes)
        .with_context(|| format!("writing {}", dest.as_ref().display()))?;
    f.commit_with_mode(mode)
}

pub use bootstate::device::Window;

/// A reader that hashes what passes through it.
#[derive(Debug)]
pub struct HashingReader<R> {
    inner: R,
    hasher: Sha256,
    count: u64,
}

impl<R: Read> HashingReader<R> {
    pub fn new(inner: R) -> Self {
        HashingReader {
            inner,
            hasher: Sha256::new(),
            count: 0,
        }
    }
    /// The hex SHA-256 and length of everything read so far.
    pub fn finish(self) -> (String, u64) {
        (hex::encode(self.hasher.finalize()), self.count)
    }
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        self.count += n as u64;
        Ok(n)
    }
}

/// A writer that hashes what passes through it.
#[derive(Debug)]
pub struct HashingWriter<W> {
    inner: W,
    hasher: Sha256,
    count: u64,
}

impl<W: Write> HashingWriter<W> {
    pub fn new(inner: W) -> Self {
        HashingWriter {
            inner,
            hasher: Sha256::new(),
            count: 0,
        }
    }
    /// The inner writer, the hex SHA-256 and the length of everything written.
    pub fn finish(self) -> (W, String, u64) {
        (self.inner, hex::encode(self.hasher.finalize()), self.count)
    }
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.count += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// A key made of a list of items (a cache key, a stage's inputs): the
/// SHA-256 of each item's length (8 bytes, little-endian) then its bytes,
/// so that no two lists hash alike. The one way every key of the build is
/// made.
#[derive(Clone, Default)]
pub struct ItemHasher(Sha256);

impl ItemHasher {
    pub fn new() -> ItemHasher {
        ItemHasher::default()
    }

    /// Adds one item.
    pub fn item(&mut self, bytes: &[u8]) {
        self.0.update((bytes.len() as u64).to_le_bytes());
        self.0.update(bytes);
    }

    /// The key, as 64 hex digits.
    pub fn finish(self) -> String {
        hex::encode(self.0.finalize())
    }
}

/// Hex SHA-256 and size of a file, streamed. A sparse file's holes are
/// hashed as zeros from memory, not read: reading a hole costs the kernel
/// a page of zeros per 4 KiB, three times what hashing it costs (a built
/// 2 GiB disk is mostly holes). Where the filesystem cannot say where its
/// holes are, the whole file is read.
pub fn sha256_file(path: &Path) -> Result<(String, u64)> {
    sha256_file_progress(path, &mut |_| {})
}

/// [`sha256_file`], telling `progress` each number of bytes hashed (holes
/// included) as it goes.
pub fn sha256_file_progress(path: &Path, progress: &mut dyn FnMut(u64)) -> Result<(String, u64)> {
    let f = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    if !f.metadata().is_ok_and(|m| m.is_file()) {
        // A pipe or a device: its size is not in its metadata. Read it.
        let mut r = HashingReader::new(io::BufReader::with_capacity(1 << 20, f));
        io::copy(&mut r, &mut io::sink()).with_context(|| format!("reading {}", path.display()))?;
        return Ok(r.finish());
    }
    sha256_sparse(f, progress).with_context(|| format!("reading {}", path.display()))
}

fn sha256_sparse(mut f: File, progress: &mut dyn FnMut(u64)) -> io::Result<(String, u64)> {
    let mut hasher = Sha256::new();
    let len = read_sparse(&mut f, &mut |b| {
        hasher.update(b);
        progress(b.len() as u64);
        Ok(())
    })?;
    Ok((hex::encode(hasher.finalize()), len))
}

/// Gives every byte of the regular file `f` to `sink`, in order and in
/// pieces of at most 1 MiB: its data extents as read, its holes as zeros
/// from memory (SEEK_DATA/SEEK_HOLE: a sparse 2 GiB disk costs a read of
/// its data only). Returns the length; a file that changes size meanwhile
/// is an error.
pub fn read_sparse(f: &mut File, sink: &mut dyn FnMut(&[u8]) -> io::Result<()>) -> io::Result<u64> {
    use std::io::{Seek, SeekFrom};
    static ZEROS: [u8; 64 << 10] = [0; 64 << 10];
    let len = f.metadata()?.len();
    let mut buf = vec![0u8; 1 << 20];
    let mut at = 0u64;
    let zeros = |sink: &mut dyn FnMut(&[u8]) -> io::Result<()>, mut n: u64| {
        while n > 0 {
            let k = n.min(ZEROS.len() as u64) as usize;
            sink(&ZEROS[..k])?;
            n -= k as u64;
        }
        io::Result::Ok(())
    };
    for data in data_extents(f, len)? {
        zeros(sink, data.start - at)?;
        f.seek(SeekFrom::Start(data.start))?;
        let mut left = data.end - data.start;
        while left > 0 {
            let n = left.min(buf.len() as u64) as usize;
            f.read_exact(&mut buf[..n])?;
            sink(&buf[..n])?;
            left -= n as u64;
        }
        at = data.end;
    }
    zeros(sink, len - at)?;
    // A file that grew while read is not what was measured.
    if f.metadata()?.len() != len {
        return Err(io::Error::other("the file changed size while it was read"));
    }
    Ok(len)
}

/// The ranges of the first `len` bytes of `f` that hold data, in order; the
/// rest are holes (read as zeros). Where the filesystem cannot tell
/// (no SEEK_DATA), one range: all of it.
pub fn data_extents(f: &File, len: u64) -> io::Result<Vec<std::ops::Range<u64>>> {
    use std::os::fd::AsRawFd;
    let fd = f.as_raw_fd();
    let mut out = Vec::new();
    let mut at = 0u64;
    while at < len {
        let data = seek_extent(fd, at, len, libc::SEEK_DATA)?;
        if data >= len {
            break;
        }
        let hole = match seek_extent(fd, data, len, libc::SEEK_HOLE)? {
            h if h > data => h,
            _ => len,
        };
        out.push(data..hole);
        at = hole;
    }
    Ok(out)
}

/// `lseek(fd, at, whence)` for SEEK_DATA or SEEK_HOLE, within `len`: no
/// more data (ENXIO) is `len`; a filesystem that cannot tell (EINVAL,
/// EOPNOTSUPP) is data at `at`, read to the end.
fn seek_extent(fd: std::os::fd::RawFd, at: u64, len: u64, whence: libc::c_int) -> io::Result<u64> {
    let Ok(off) = libc::off_t::try_from(at) else {
        return Err(io::Error::other("offset beyond off_t"));
    };
    // SAFETY: lseek on a descriptor the caller holds open; no memory passed.
    let r = unsafe { libc::lseek(fd, off, whence) };
    if r < 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENXIO) => Ok(len),
            Some(libc::EINVAL | libc::EOPNOTSUPP) if whence == libc::SEEK_DATA => Ok(at),
            Some(libc::EINVAL | libc::EOPNOTSUPP) => Ok(len),
            _ => Err(e),
        };
    }
    Ok((r as u64).min(len))
}

/// Hard-links `src` to `dest`, or copies it where links cannot be made.
pub fn link_or_copy(src: &Path, dest: &Path) -> Result<()> {
    if std::fs::hard_link(src, dest).is_ok() {
        return Ok(());
    }
    std::fs::copy(src, dest)
        .map(|_| ())
        .with_context(|| format!("copying {} to {}", src.display(), dest.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sparse-aware digest against sha256sum's, which reads every byte:
    /// holes at the start, between data and at the end; data only; empty.
    #[test]
    fn sparse_files_hash_as_sha256sum_reads_them() {
        use std::os::unix::fs::FileExt;
        let dir = tempfile::tempdir().unwrap();
        type Case<'a> = (&'a str, u64, &'a [(u64, &'a [u8])]);
        let cases: &[Case] = &[
            ("empty", 0, &[]),
            ("all-hole", 5 << 20, &[]),
            ("dense", 3, &[(0, b"abc")]),
            (
                "holes",
                9 << 20,
                &[
                    (4096, b"first"),
                    ((3 << 20) + 17, b"second"),
                    ((8 << 20) - 1, b"x"),
                ],
            ),
            ("tail-data", (2 << 20) + 5, &[((2 << 20), b"12345")]),
        ];
        for (name, len, writes) in cases {
            let p = dir.path().join(name);
            let f = File::create(&p).unwrap();
            f.set_len(*len).unwrap();
            for (at, b) in *writes {
                f.write_all_at(b, *at).unwrap();
            }
            drop(f);
            let out = std::process::Command::new("sha256sum")
                .arg(&p)
                .output()
                .unwrap();
            assert!(out.status.success());
            let theirs = String::from_utf8(out.stdout).unwrap();
            let (ours, size) = sha256_file(&p).unwrap();
            assert_eq!(size, *len, "{name}");
            assert_eq!(ours, theirs[..64], "{name}");
        }
    }

    #[test]
    fn atomic_file_appears_only_on_commit() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("out.bin");
        {
            let mut f = AtomicFile::create(&dest).unwrap();
            f.write_all(b"half").unwrap();
            assert!(!dest.exists());
        }
        // Dropped without commit: nothing under the final name, no leftovers.
        assert!(!dest.exists());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        let mut f = AtomicFile::create(&dest).unwrap();
        f.write_all(b"whole").unwrap();
        f.commit().unwrap();
        assert_eq!(std::fs::read(&dest).unwrap(), b"whole");
        // A temporary left by a killed writer is swept; the output stays.
        let stale = AtomicFile::create(&dest).unwrap();
        std::mem::forget(stale);
        assert_eq!(remove_stale_partials(dir.path()).unwrap(), 1);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        // So is a temporary directory (a staged installer payload).
        let staged = dir.path().join(".payload.x1.partial");
        std::fs::create_dir_all(staged.join("sub")).unwrap();
        std::fs::write(staged.join("sub/f"), b"x").unwrap();
        assert_eq!(remove_stale_partials(dir.path()).unwrap(), 1);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn a_directory_has_one_lock_holder() {
        let dir = tempfile::tempdir().unwrap();
        let first = try_lock_dir(dir.path()).unwrap().unwrap();
        assert!(first.held());
        // Another open file description: refused while the first lives.
        assert!(try_lock_dir(dir.path()).unwrap().is_none());
        drop(first);
        // Other tests' child processes may hold a copy of the descriptor
        // between their fork and exec: wait for the lock to be free.
        let start = std::time::Instant::now();
        let again = loop {
            match try_lock_dir(dir.path()).unwrap() {
                Some(l) => break l,
                None if start.elapsed().as_secs() > 30 => panic!("the lock stayed taken"),
                None => std::thread::yield_now(),
            }
        };
        assert!(again.held());
        // Nothing is left in the directory.
        assert!(names(dir.path()).is_empty());
        let file = dir.path().join("f");
        std::fs::write(&file, b"x").unwrap();
        let e = format!("{:#}", try_lock_dir(&file).unwrap_err());
        assert!(e.contains("is not a directory"), "{e}");
    }

    #[test]
    fn staged_files_replace_the_old_ones_only_on_commit() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path();
        std::fs::write(out.join("a"), b"old a").unwrap();
        std::fs::write(out.join("b"), b"old b").unwrap();
        {
            let stage = Staging::create(out, "build").unwrap();
            write_atomic(stage.join("a"), b"new a", 0o644).unwrap();
            // Dropped uncommitted: the old files and nothing else.
        }
        assert_eq!(names(out), ["a", "b"]);
        assert_eq!(std::fs::read(out.join("a")).unwrap(), b"old a");

        let stage = Staging::create(out, "build").unwrap();
        assert!(stage.path().starts_with(out));
        let staged = stage.path().file_name().unwrap().to_string_lossy();
        assert!(staged.starts_with(".build.") && staged.ends_with(".partial"));
        write_atomic(stage.join("a"), b"new a", 0o644).unwrap();
        write_atomic(stage.join("b"), b"new b", 0o600).unwrap();
        write_atomic(stage.join("c"), b"new c", 0o644).unwrap();
        stage.commit(&["a", "b"]).unwrap();
        assert_eq!(std::fs::read(out.join("a")).unwrap(), b"new a");
        assert_eq!(std::fs::read(out.join("b")).unwrap(), b"new b");
        assert!(!out.join("c").exists());
        stage.commit(&["c"]).unwrap();
        assert_eq!(std::fs::read(out.join("c")).unwrap(), b"new c");
        drop(stage);
        assert_eq!(names(out), ["a", "b", "c"]);

        // Something else than a file in the way: refused before any rename.
        let stage = Staging::create(out, "build").unwrap();
        write_atomic(stage.join("a"), b"newer a", 0o644).unwrap();
        write_atomic(stage.join("d"), b"d", 0o644).unwrap();
        std::fs::create_dir(out.join("d")).unwrap();
        let e = format!("{:#}", stage.commit(&["a", "d"]).unwrap_err());
        assert!(
            e.contains(&format!("{} is in the way", out.join("d").display())),
            "{e}"
        );
        assert_eq!(std::fs::read(out.join("a")).unwrap(), b"new a");
        std::os::unix::fs::symlink("a", out.join("e")).unwrap();
        assert!(check_replaceable(out, &["e"]).is_err());
        assert!(check_replaceable(out, &["a", "missing"]).is_ok());
    }
}
