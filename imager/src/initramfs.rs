//! The initramfs: a newc cpio archive, zstd-compressed, that the kernel
//! unpacks into its rootfs before running `/init`.
//!
//! ```text
//! dev/            0755
//! dev/console     c 5:1 0600   (the kernel opens it for init's stdio)
//! init            0755         the runtime, stage 1
//! newroot/        0755         where stage 1 assembles the root
//! proc/ run/ sys/ 0755
//! rootfs.sqsh     0444         the squashfs root filesystem
//! rootfs.verity   0444         its dm-verity hash device (crate::verity)
//! ```
//!
//! Deterministic: entries in path order, inode numbers from 1 in that order,
//! every mtime SOURCE_DATE_EPOCH, uid/gid 0, device 0, one zstd frame
//! produced by a single-threaded encoder.

use crate::disk::FatSource;
use crate::io::{AtomicFile, HashingWriter};
use anyhow::{Context, Result, bail, ensure};
use contract::paths::{
    INITRAMFS_INIT, INITRAMFS_NEWROOT, INITRAMFS_ROOTFS, INITRAMFS_ROOTFS_VERITY,
};
use std::io::{self, Read, Write};
use std::path::Path;

/// Default zstd level. The bulk of the archive is the squashfs, already
/// zstd-compressed, on which high levels only cost time; 9 still squeezes the
/// runtime binary well and keeps the window (8 MiB at most) small.
pub const DEFAULT_LEVEL: i32 = 9;
/// Highest level accepted: levels 20-22 ("ultra") use windows of up to
/// 128 MiB, which the kernel would have to allocate to unpack the initramfs.
pub const MAX_LEVEL: i32 = 19;

/// Directories of the initramfs besides [`INITRAMFS_NEWROOT`]: the mount
/// points stage 1 needs before the root is assembled.
pub const MOUNT_DIRS: [&str; 4] = ["dev", "proc", "run", "sys"];
/// The console device node and its numbers (Linux's devices.txt: 5,1).
pub const CONSOLE: &str = "dev/console";
pub const CONSOLE_MAJOR: u32 = 5;
pub const CONSOLE_MINOR: u32 = 1;

const MAGIC: &str = "070701";
const TRAILER: &str = "TRAILER!!!";
const S_IFDIR: u32 = 0o040_000;
const S_IFREG: u32 = 0o100_000;
const S_IFCHR: u32 = 0o020_000;

/// What an archive entry is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntryKind {
    Dir,
    File(FatSource),
    CharDevice { major: u32, minor: u32 },
}

/// One entry of the archive: a relative path (no leading `/`) and the
/// permission bits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub path: String,
    pub mode: u32,
    pub kind: EntryKind,
}

/// A streaming newc writer.
#[derive(Debug)]
pub struct CpioWriter<W: Write> {
    out: W,
    mtime: u32,
    next_ino: u32,
    written: u64,
}

fn pad4(n: u64) -> usize {
    ((4 - n % 4) % 4) as usize
}

impl<W: Write> CpioWriter<W> {
    /// `epoch` becomes every entry's mtime (clamped to 32 bits, as newc has).
    pub fn new(out: W, epoch: u64) -> Self {
        CpioWriter {
            out,
            mtime: u32::try_from(epoch).unwrap_or(u32::MAX),
            next_ino: 1,
            written: 0,
        }
    }

    fn put(&mut self, b: &[u8]) -> io::Result<()> {
        self.out.write_all(b)?;
        self.written += b.len() as u64;
        Ok(())
    }

    fn pad(&mut self) -> io::Result<()> {
        let n = pad4(self.written);
        self.put(&[0u8; 3][..n])
    }

    fn header(
        &mut self,
        name: &str,
        mode: u32,
        nlink: u32,
        size: u32,
        rdev: (u32, u32),
    ) -> Result<()> {
        ensure!(
            !name.is_empty() && !name.contains('\0'),
            "invalid cpio entry name {name:?}"
        );
        let ino = if name == TRAILER { 0 } else { self.next_ino };
        if name != TRAILER {
            self.next_ino += 1;
        }
        let namesize = u32::try_from(name.len() + 1).context("cpio entry name too long")?;
        let fields = [
            ino, mode, 0, // uid
            0, // gid
            nlink, self.mtime, size, 0, // devmajor
            0, // devminor
            rdev.0, rdev.1, namesize, 0, // check
        ];
        let mut h = String::with_capacity(110);
        h.push_str(MAGIC);
        for f in fields {
            h.push_str(&format!("{f:08x}"));
        }
        self.put(h.as_bytes())?;
        self.put(name.as_bytes())?;
        self.put(&[0])?;
        self.pad()?;
        Ok(())
    }

    pub fn dir(&mut self, path: &str, mode: u32) -> Result<()> {
        self.header(path, S_IFDIR | (mode & 0o7777), 2, 0, (0, 0))
    }

    pub fn char_device(&mut self, path: &str, mode: u32, major: u32, minor: u32) -> Result<()> {
        self.header(path, S_IFCHR | (mode & 0o7777), 1, 0, (major, minor))
    }

    /// A regular file of `len` bytes read from `data`; fails if `data` does
    /// not hold exactly `len` bytes.
    pub fn file(&mut self, path: &str, mode: u32, len: u64, data: &mut dyn Read) -> Result<()> {
        let size = u32::try_from(len)
            .ok()
            .with_context(|| format!("{path} is {len} bytes: cpio (newc) files must be < 4 GiB"))?;
        self.header(path, S_IFREG | (mode & 0o7777), 1, size, (0, 0))?;
        let n = io::copy(&mut data.take(len), &mut self.out)
            .with_context(|| format!("writing {path} into the initramfs"))?;
        self.written += n;
        ensure!(n == len, "{path} ended after {n} bytes, expected {len}");
        self.pad()?;
        Ok(())
    }

    /// Writes one entry, streaming a file's contents.
    pub fn entry(&mut self, e: &Entry) -> Result<()> {
        match &e.kind {
            EntryKind::Dir => self.dir(&e.path, e.mode),
            EntryKind::CharDevice { major, minor } => {
                self.char_device(&e.path, e.mode, *major, *minor)
            }
            EntryKind::File(src) => {
                let (mut r, len) = src.open()?;
                self.file(&e.path, e.mode, len, &mut r)
                    .with_context(|| format!("adding {} as {}", src.describe(), e.path))
            }
        }
    }

    /// Writes the trailer and returns the inner writer.
    pub fn finish(mut self) -> Result<W> {
        self.header(TRAILER, 0, 1, 0, (0, 0))?;
        self.out.flush()?;
        Ok(self.out)
    }
}

/// The entries of the initramfs, in archive (path) order; the root
/// filesystem's hash device when given.
pub fn entries(init: &Path, rootfs_sqsh: &Path, rootfs_verity: Option<&Path>) -> Vec<Entry> {
    let mut v = vec![
        Entry {
            path: CONSOLE.into(),
            mode: 0o600,
            kind: EntryKind::CharDevice {
                major: CONSOLE_MAJOR,
                minor: CONSOLE_MINOR,
            },
        },
        Entry {
            path: INITRAMFS_INIT.into(),
            mode: 0o755,
            kind: EntryKind::File(FatSource::File(init.to_path_buf())),
        },
        Entry {
            path: INITRAMFS_ROOTFS.into(),
            mode: 0o444,
            kind: EntryKind::File(FatSource::File(rootfs_sqsh.to_path_buf())),
        },
        Entry {
            path: INITRAMFS_NEWROOT.into(),
            mode: 0o755,
            kind: EntryKind::Dir,
        },
    ];
    v.extend(rootfs_verity.map(|p| Entry {
        path: INITRAMFS_ROOTFS_VERITY.into(),
        mode: 0o444,
        kind: EntryKind::File(FatSource::File(p.to_path_buf())),
    }));
    v.extend(MOUNT_DIRS.iter().map(|d| Entry {
        path: (*d).into(),
        mode: 0o755,
        kind: EntryKind::Dir,
    }));
    v.sort_by(|a, b| a.path.cmp(&b.path));
    v
}

/// Writes `entries` (sorted by path, parents first) as a zstd-compressed
/// newc archive to `dest`, atomically. Returns the hex SHA-256 and size of
/// the compressed file.
pub fn write_archive(
    dest: &Path,
    entries: &[Entry],
    epoch: u64,
    level: i32,
) -> Result<(String, u64)> {
    if !(1..=MAX_LEVEL).contains(&level) {
        bail!("initramfs zstd level {level} is out of range: use 1 to {MAX_LEVEL}");
    }
    let mut sorted: Vec<&Entry> = entries.iter().collect();
    sorted.sort_by(|a, b| a.path.cmp(&b.path));
    for w in sorted.windows(2) {
        ensure!(
            w[0].path != w[1].path,
            "{} is in the initramfs twice",
            w[0].path
        );
    }
    let mut out = AtomicFile::create(dest)?;
    let (sha, size) = {
        let hashing = HashingWriter::new(io::BufWriter::with_capacity(1 << 20, &mut out));
        let mut enc =
            zstd::stream::Encoder::new(hashing, level).context("starting the zstd encoder")?;
        enc.include_checksum(true)?;
        let mut cpio = CpioWriter::new(enc, epoch);
        for e in sorted {
            cpio.entry(e)
                .with_context(|| format!("writing {} into the initramfs", e.path))?;
        }
        let enc = cpio.finish().context("writing the cpio trailer")?;
        let hashing = enc.finish().context("finishing the zstd frame")?;
        let (buf, sha, size) = hashing.finish();
        buf.into_inner()
            .map_err(|e| e.into_error())
            .with_context(|| format!("writing {}", dest.display()))?;
        (sha, size)
    };
    out.commit()?;
    Ok((sha, size))
}

/// Builds the initramfs at `dest` from the runtime binary `init` and the
/// root filesystem image `rootfs_sqsh` (and its dm-verity hash device).
/// Returns its hex SHA-256 and size.
pub fn build_initramfs(
    dest: &Path,
    init: &Path,
    rootfs_sqsh: &Path,
    rootfs_verity: Option<&Path>,
    epoch: u64,
    level: i32,
) -> Result<(String, u64)> {
    for (what, p) in [("runtime binary", init), ("root filesystem", rootfs_sqsh)] {
        ensure!(
            p.is_file(),
            "{what} {} not found: build it first",
            p.display()
        );
    }
    write_archive(
        dest,
        &entries(init, rootfs_sqsh, rootfs_verity),
        epoch,
        level,
    )
    .with_context(|| format!("building the initramfs {}", dest.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::disk::testutil::{run, tool};
    use std::path::PathBuf;
    use std::process::{Command, Stdio};

    #[test]
    fn newc_bytes_are_exact() {
        let mut c = CpioWriter::new(Vec::new(), 0x10);
        c.dir("d", 0o755).unwrap();
        c.file("d/f", 0o644, 3, &mut &b"abc"[..]).unwrap();
        let out = c.finish().unwrap();
        let s = String::from_utf8_lossy(&out);
        let h1 = "070701\
                  00000001000041ed00000000000000000000000200000010\
                  00000000000000000000000000000000000000000000000200000000";
        assert!(s.starts_with(h1), "{s}");
        // 110 + "d\0" = 112: already aligned.
        assert_eq!(&out[110..112], b"d\0");
        let h2 = &s[112..222];
        assert_eq!(&h2[6..14], "00000002");
        assert_eq!(&h2[14..22], "000081a4");
        assert_eq!(&h2[54..62], "00000003");
        // 222 + "d/f\0" = 226, padded to 228; data 3, padded to 232.
        assert_eq!(&out[222..228], b"d/f\0\0\0");
        assert_eq!(&out[228..232], b"abc\0");
        assert!(s[232..].starts_with("070701"));
        assert_eq!(&s[232 + 6..232 + 14], "00000000", "trailer inode");
        assert!(s[232..].contains("TRAILER!!!\0"));
        assert_eq!(out.len() % 4, 0);
        let mut short = CpioWriter::new(Vec::new(), 0);
        assert!(short.file("x", 0o644, 5, &mut &b"abc"[..]).is_err());
    }

    fn inputs(dir: &Path) -> (PathBuf, PathBuf) {
        let init = dir.join("machined");
        std::fs::write(&init, b"#!/bin/sh\necho stage 1\n").unwrap();
        let sqsh = dir.join("rootfs.sqsh");
        let data: Vec<u8> = (0..1_000_003u32).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(&sqsh, data).unwrap();
        (init, sqsh)
    }

    fn decompress(img: &Path) -> Vec<u8> {
        run(Command::new(tool("zstd")).args(["-d", "-c", "-q"]).arg(img)).stdout
    }

    fn cpio(args: &[&str], input: &[u8], cwd: &Path) -> String {
        let mut child = Command::new(tool("cpio"))
            .args(args)
            .current_dir(cwd)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(input).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    #[test]
    fn cpio_lists_and_extracts_it() {
        let dir = tempfile::tempdir().unwrap();
        let (init, sqsh) = inputs(dir.path());
        let img = dir.path().join("initramfs.zst");
        let (sha, size) =
            build_initramfs(&img, &init, &sqsh, None, 1_700_000_000, DEFAULT_LEVEL).unwrap();
        assert_eq!((sha, size), crate::io::sha256_file(&img).unwrap());

        // One frame, with a checksum and a window the kernel can afford.
        let bytes = std::fs::read(&img).unwrap();
        assert_eq!(&bytes[..4], &[0x28, 0xb5, 0x2f, 0xfd]);
        let fhd = bytes[4];
        assert_ne!(fhd & 0x04, 0, "content checksum");
        if fhd & 0x20 == 0 {
            let wd = bytes[5];
            let base = 1u64 << (10 + (wd >> 3));
            let window = base + base / 8 * u64::from(wd & 7);
            assert!(window <= 8 << 20, "window {window}");
        }
        let frames = run(Command::new(tool("zstd")).args(["-l", "-v"]).arg(&img));
        let text = String::from_utf8_lossy(&frames.stdout);
        assert!(text.contains("# Zstandard Frames: 1"), "{text}");

        let raw = decompress(&img);
        let list = cpio(&["-t", "--quiet"], &raw, dir.path());
        assert_eq!(
            list.lines().collect::<Vec<_>>(),
            [
                "dev",
                "dev/console",
                "init",
                "newroot",
                "proc",
                "rootfs.sqsh",
                "run",
                "sys"
            ]
        );
        let long = cpio(&["-tv", "--quiet"], &raw, dir.path());
        let console = long.lines().find(|l| l.ends_with("dev/console")).unwrap();
        assert!(console.starts_with("crw-------"), "{console}");
        assert!(
            console.contains("5,") && console.contains(" 1 "),
            "{console}"
        );
        let init_line = long.lines().find(|l| l.ends_with(" init")).unwrap();
        assert!(init_line.starts_with("-rwxr-xr-x"), "{init_line}");
        assert!(init_line.contains(" root "), "{init_line}");

        let x = dir.path().join("x");
        std::fs::create_dir(&x).unwrap();
        // -d: make directories; the device node needs root, skip it.
        cpio(&["-id", "--quiet", "-f", "dev/console"], &raw, &x);
        assert_eq!(
            std::fs::read(x.join("init")).unwrap(),
            std::fs::read(&init).unwrap()
        );
        assert_eq!(
            std::fs::read(x.join("rootfs.sqsh")).unwrap(),
            std::fs::read(&sqsh).unwrap()
        );
        for d in ["dev", "newroot", "proc", "run", "sys"] {
            assert!(x.join(d).is_dir(), "{d}");
        }
    }

    #[test]
    fn same_inputs_same_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let (init, sqsh) = inputs(dir.path());
        let a = dir.path().join("a.zst");
        let b = dir.path().join("b.zst");
        let ra = build_initramfs(&a, &init, &sqsh, None, 42, 3).unwrap();
        let rb = build_initramfs(&b, &init, &sqsh, None, 42, 3).unwrap();
        assert_eq!(ra, rb);
        assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
        let c = dir.path().join("c.zst");
        assert_ne!(
            build_initramfs(&c, &init, &sqsh, None, 43, 3).unwrap().0,
            ra.0
        );
    }

    #[test]
    fn clear_errors() {
        let dir = tempfile::tempdir().unwrap();
        let (init, sqsh) = inputs(dir.path());
        let dest = dir.path().join("i.zst");
        let e = build_initramfs(&dest, &dir.path().join("nope"), &sqsh, None, 0, 3).unwrap_err();
        assert!(format!("{e:#}").contains("runtime binary"), "{e:#}");
        let e = build_initramfs(&dest, &init, &sqsh, None, 0, 22).unwrap_err();
        assert!(format!("{e:#}").contains("use 1 to 19"), "{e:#}");
        assert!(!dest.exists());
    }
}
