//! The outputs `raw.zst` and `raw.xz` (`disk.raw.zst`, `disk.raw.xz`): the
//! raw disk compressed as one stream, and the way back to a disk for `imager
//! boot`, `inspect` and `verify`.
//!
//! Compression streams the raw disk extent by extent (SEEK_DATA/SEEK_HOLE):
//! data is read in 1 MiB pieces and the holes are fed to the compressor as
//! zeros from one small buffer, so memory does not grow with the disk and
//! holes are never read from the file system. zstd: level 12, the content
//! size and a checksum in the frame (`zstd -t` checks it). xz: preset 1 (see
//! docs/design.md: preset 6 takes twice as long over a 2 GiB disk for a
//! file 2.3 % smaller), CRC-64, in a container written by [`super::xz`],
//! where a block of zeros is compressed once.
//!
//! Both compress on every core, with output that does not depend on how
//! many there are: zstd in its multithreaded mode (the same bytes for any
//! number of workers from 1), xz as independent blocks of [`XZ_BLOCK`]
//! bytes (the same bytes for any thread count; `xz -T0` decompresses them
//! in parallel). The tests compress with 1 and 3 threads and compare.
//!
//! Decompression ([`unpack`]) writes a sparse file: a 64 KiB block of zeros
//! is skipped, not written, so a 2 GiB disk takes the space of its data.

use crate::io::AtomicFile;
use anyhow::{Context, Result, bail};
use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;

/// The most memory an xz stream may ask to be unpacked: 256 MiB.
const XZ_MEMLIMIT: u64 = 256 << 20;
/// The zstd level of `raw.zst`.
pub const ZSTD_LEVEL: i32 = 12;
pub use super::xz::{XZ_BLOCK, XZ_PRESET};

/// The threads the compressors use: the cores there are.
fn threads() -> u32 {
    std::thread::available_parallelism().map_or(1, |n| n.get() as u32)
}

const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];
const XZ_MAGIC: [u8; 6] = [0xfd, b'7', b'z', b'X', b'Z', 0];

/// What a disk image file holds, by its first bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// A raw disk (or a fixed VHD, a raw disk with a footer).
    Raw,
    Qcow2,
    Zstd,
    Xz,
    /// A stream-optimised VMDK (`aws.vmdk`).
    Vmdk,
    /// A tar archive: an OVA (`vmware.ova`).
    Ova,
    /// gzip: Compute Engine's gzip'd tar (`gcp.tar.gz`).
    Gzip,
}

impl Format {
    /// The format of the file `path`, from its magic number.
    pub fn of(path: &Path) -> Result<Format> {
        let mut f = File::open(path).with_context(|| format!("opening {}", path.display()))?;
        let mut m = [0u8; 512];
        let n = bootstate::blank::read_full(&mut f, &mut m)
            .with_context(|| format!("reading {}", path.display()))?;
        Ok(Format::of_bytes(&m[..n]))
    }

    /// The format of a file that starts with `head`.
    pub fn of_bytes(head: &[u8]) -> Format {
        if head.starts_with(&super::qcow2::MAGIC) {
            Format::Qcow2
        } else if head.starts_with(&ZSTD_MAGIC) {
            Format::Zstd
        } else if head.starts_with(&XZ_MAGIC) {
            Format::Xz
        } else if head.starts_with(&super::vmdk::MAGIC) {
            Format::Vmdk
        } else if head.starts_with(&super::gce::MAGIC) {
            Format::Gzip
        } else if head.get(257..262) == Some(b"ustar") {
            Format::Ova
        } else {
            Format::Raw
        }
    }

    /// Whether the disk must be unpacked (decompressed, taken out of its
    /// archive) before it is read.
    pub fn compressed(self) -> bool {
        !matches!(self, Format::Raw | Format::Qcow2)
    }
}

/// 64 KiB of zeros, to compare with (memcmp: fast in unoptimized builds
/// too).
static ZEROS: [u8; 64 << 10] = [0; 64 << 10];

/// Whether `b` holds only zeros.
pub(crate) fn is_zero(b: &[u8]) -> bool {
    b.chunks(ZEROS.len()).all(|c| c == &ZEROS[..c.len()])
}

/// Writes `raw` (streamed, holes as zeros) into `w`.
fn stream_disk(raw: &Path, w: &mut dyn Write) -> Result<()> {
    let mut src = File::open(raw).with_context(|| format!("opening {}", raw.display()))?;
    crate::io::read_sparse(&mut src, &mut |b| w.write_all(b))
        .with_context(|| format!("streaming {}", raw.display()))?;
    Ok(())
}

/// Writes `dest`, the raw disk `raw` compressed with zstd (level
/// [`ZSTD_LEVEL`]), under a temporary name renamed when complete.
pub fn write_zst(raw: &Path, dest: &Path) -> Result<()> {
    write_zst_threads(raw, dest, threads())
}

/// [`write_zst`] with `threads` workers (at least 1: the multithreaded
/// format, whose bytes do not depend on the count).
pub fn write_zst_threads(raw: &Path, dest: &Path, threads: u32) -> Result<()> {
    let size = std::fs::metadata(raw)
        .with_context(|| format!("reading {}", raw.display()))?
        .len();
    let mut out = AtomicFile::create(dest)?;
    let mut z = zstd::stream::write::Encoder::new(out.file(), ZSTD_LEVEL)?;
    z.multithread(threads.max(1))?;
    z.include_checksum(true)?;
    z.include_contentsize(true)?;
    z.set_pledged_src_size(Some(size))?;
    stream_disk(raw, &mut z).with_context(|| format!("writing {}", dest.display()))?;
    z.finish()
        .with_context(|| format!("writing {}", dest.display()))?;
    out.commit()
        .with_context(|| format!("writing {}", dest.display()))?;
    Ok(())
}

/// Writes `dest`, the raw disk `raw` compressed with xz (preset
/// [`XZ_PRESET`], CRC-64), under a temporary name renamed when complete.
pub fn write_xz(raw: &Path, dest: &Path) -> Result<()> {
    write_xz_threads(raw, dest, threads())
}

/// [`write_xz`] with `threads` threads (the bytes do not depend on it; at
/// most 8, each holding a block).
pub fn write_xz_threads(raw: &Path, dest: &Path, threads: u32) -> Result<()> {
    let mut out = AtomicFile::create(dest)?;
    let threads = threads.clamp(1, 8) as usize;
    let mut x = super::xz::XzWriter::new(std::io::BufWriter::new(out.file()), threads)
        .with_context(|| format!("writing {}", dest.display()))?;
    stream_disk(raw, &mut x).with_context(|| format!("writing {}", dest.display()))?;
    x.finish()
        .and_then(|mut w| w.flush())
        .with_context(|| format!("writing {}", dest.display()))?;
    out.commit()
        .with_context(|| format!("writing {}", dest.display()))?;
    Ok(())
}

/// Copies the disk `src` reads into the new file `dest`, leaving holes
/// where 64 KiB blocks are all zeros; returns its size.
pub fn copy_sparse(src: &mut dyn Read, dest: &Path) -> Result<u64> {
    let f = File::create(dest).with_context(|| format!("creating {}", dest.display()))?;
    let mut buf = vec![0u8; 64 << 10];
    let mut at = 0u64;
    loop {
        let n = bootstate::blank::read_full(src, &mut buf)?;
        if n == 0 {
            break;
        }
        if !is_zero(&buf[..n]) {
            f.write_all_at(&buf[..n], at)
                .with_context(|| format!("writing {}", dest.display()))?;
        }
        at += n as u64;
    }
    f.set_len(at)
        .with_context(|| format!("writing {}", dest.display()))?;
    Ok(at)
}

/// Unpacks the disk image `path` (zstd, xz, qcow2, a stream-optimised
/// VMDK, an OVA, Compute Engine's gzip'd tar) into the sparse raw disk
/// `dest`; returns its size. A raw disk is refused: nothing to do.
pub fn unpack(path: &Path, dest: &Path) -> Result<u64> {
    let f = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let what = || format!("unpacking {} into {}", path.display(), dest.display());
    match Format::of(path)? {
        Format::Qcow2 => {
            let mut q = super::qcow2::Qcow2::new(f)
                .with_context(|| format!("reading {}", path.display()))?;
            copy_sparse(&mut q, dest).with_context(what)
        }
        Format::Raw => bail!("{} is a raw disk: nothing to unpack", path.display()),
        format => {
            let mut r = std::io::BufReader::with_capacity(1 << 20, f);
            unpack_stream(format, &mut r, dest).with_context(what)
        }
    }
}

/// Unpacks the stream `r` of a [`Format::compressed`] format (zstd, xz, a
/// stream-optimised VMDK, an OVA, a gzip'd tar) into the new sparse raw
/// disk `dest`; returns its size. Read front to back, never seeked.
pub fn unpack_stream(format: Format, r: &mut dyn Read, dest: &Path) -> Result<u64> {
    let create = || File::create(dest).with_context(|| format!("creating {}", dest.display()));
    match format {
        Format::Zstd => {
            let mut d = zstd::stream::read::Decoder::new(r)?;
            copy_sparse(&mut d, dest)
        }
        Format::Xz => {
            // A bound on what the stream's headers may ask of memory
            // (the dictionary): xz -9 asks 65 MiB, our preset 1 about 2.
            let s = liblzma::stream::Stream::new_stream_decoder(
                XZ_MEMLIMIT,
                liblzma::stream::CONCATENATED,
            )?;
            let mut d = liblzma::read::XzDecoder::new_stream(r, s);
            copy_sparse(&mut d, dest)
        }
        Format::Vmdk => super::vmdk::unpack(r, &create()?),
        Format::Ova => super::ova::unpack(r, &create()?),
        Format::Gzip => super::gce::unpack(r, dest),
        Format::Raw | Format::Qcow2 => bail!("a raw disk or a qcow2 is not unpacked as a stream"),
    }
}

/// A disk image made readable as a raw disk: the image itself, or a sparse
/// copy in a temporary directory removed when this is dropped.
pub struct Unpacked {
    pub path: std::path::PathBuf,
    pub format: Format,
    _dir: Option<tempfile::TempDir>,
}

impl Unpacked {
    /// `path` itself when it is raw; else unpacked into a new temporary
    /// directory (in `TMPDIR`), as `disk.raw`.
    pub fn open(path: &Path) -> Result<Unpacked> {
        let format = Format::of(path)?;
        if format == Format::Raw {
            return Ok(Unpacked {
                path: path.to_path_buf(),
                format,
                _dir: None,
            });
        }
        let dir = tempfile::Builder::new()
            .prefix("imager-unpacked-")
            .tempdir()
            .context("creating a temporary directory to unpack the disk into")?;
        let raw = dir.path().join("disk.raw");
        unpack(path, &raw)?;
        Ok(Unpacked {
            path: raw,
            format,
            _dir: Some(dir),
        })
    }

    /// Whether the disk was unpacked (the path is a temporary copy).
    pub fn is_copy(&self) -> bool {
        self._dir.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each format round-trips to the raw disk's bytes, holes as holes;
    /// the same disk gives the same bytes; a damaged stream is an error.
    #[test]
    fn compressed_disks_unpack_to_the_raw_disk() {
        let dir = tempfile::tempdir().unwrap();
        let raw = dir.path().join("disk.raw");
        let f = File::create(&raw).unwrap();
        let size = (24 << 20) + 4608;
        f.set_len(size).unwrap();
        f.write_all_at(b"start", 0).unwrap();
        f.write_all_at(&[7u8; 200_000], 9 << 20).unwrap();
        f.write_all_at(b"end", size - 3).unwrap();
        drop(f);
        let want = std::fs::read(&raw).unwrap();
        type Writer = fn(&Path, &Path) -> Result<()>;
        let writers: [(&str, Writer, Format); 3] = [
            ("disk.raw.zst", write_zst, Format::Zstd),
            ("disk.raw.xz", write_xz, Format::Xz),
            (
                "disk.qcow2",
                super::super::qcow2::write_qcow2,
                Format::Qcow2,
            ),
        ];
        for (name, write, format) in writers {
            let packed = dir.path().join(name);
            write(&raw, &packed).unwrap();
            assert_eq!(Format::of(&packed).unwrap(), format, "{name}");
            let u = Unpacked::open(&packed).unwrap();
            assert!(u.is_copy());
            assert!(std::fs::read(&u.path).unwrap() == want, "{name}");
            use std::os::unix::fs::MetadataExt;
            let blocks = std::fs::metadata(&u.path).unwrap().blocks();
            assert!(blocks * 512 < 2 << 20, "{name}: holes were filled");
            let again = dir.path().join(format!("again-{name}"));
            write(&raw, &again).unwrap();
            assert!(std::fs::read(&again).unwrap() == std::fs::read(&packed).unwrap());
            if format.compressed() {
                let mut bytes = std::fs::read(&packed).unwrap();
                let mid = bytes.len() / 2;
                bytes[mid] ^= 0x55;
                std::fs::write(&again, bytes).unwrap();
                let e = unpack(&again, &dir.path().join("bad.raw")).unwrap_err();
                assert!(format!("{e:#}").contains("unpacking"), "{e:#}");
            }
        }
        assert_eq!(Format::of(&raw).unwrap(), Format::Raw);
        assert!(!Unpacked::open(&raw).unwrap().is_copy());
    }

    /// Compressing on more threads gives the same bytes (several zstd jobs
    /// and xz blocks: the disk is larger than both), which the standard
    /// tools check and unpack to the disk.
    #[test]
    fn compressed_disks_are_the_same_bytes_whatever_the_thread_count() {
        let dir = tempfile::tempdir().unwrap();
        let raw = dir.path().join("disk.raw");
        let f = File::create(&raw).unwrap();
        let size = 96 << 20;
        f.set_len(size).unwrap();
        let mut noise = 0x9e37_79b9_7f4a_7c15u64;
        let mut block = vec![0u8; 1 << 20];
        for at in [0u64, 17 << 20, 50 << 20, size - (1 << 20)] {
            for b in block.iter_mut() {
                noise ^= noise << 13;
                noise ^= noise >> 7;
                noise ^= noise << 17;
                *b = (noise % 4) as u8;
            }
            f.write_all_at(&block, at).unwrap();
        }
        drop(f);
        type Writer = fn(&Path, &Path, u32) -> Result<()>;
        let writers: [(&str, Writer, &str); 2] = [
            ("zst", write_zst_threads, "zstd"),
            ("xz", write_xz_threads, "xz"),
        ];
        for (ext, write, tool) in writers {
            let one = dir.path().join(format!("1.{ext}"));
            write(&raw, &one, 1).unwrap();
            for n in [2, 3] {
                let more = dir.path().join(format!("{n}.{ext}"));
                write(&raw, &more, n).unwrap();
                assert!(
                    std::fs::read(&more).unwrap() == std::fs::read(&one).unwrap(),
                    "{ext}: {n} threads gave other bytes than 1"
                );
            }
            let out = std::process::Command::new(tool)
                .args(["-d", "-c"])
                .arg(&one)
                .output()
                .unwrap();
            assert!(out.status.success(), "{tool} -d: {out:?}");
            assert!(out.stdout == std::fs::read(&raw).unwrap(), "{tool} -d");
        }
    }
}
