//! The output `gcp` (`gcp.tar.gz`): the raw disk as Google Compute
//! Engine imports it, and the reader that takes the disk back out.
//!
//! Compute Engine's "Manually import boot disks" page asks for a file
//! named `disk.raw`, of a whole number of GiB, alone in a tar archive in
//! GNU tar's `oldgnu` format, compressed with gzip (`tar --format=oldgnu
//! -Sczf`). Ours is that archive, written by our code and streamed: one
//! GNU header (magic `ustar  \0`, sizes past 8 GiB in base-256 as GNU tar
//! writes them), the disk's bytes (its holes read as zeros, never from the
//! file system), the two zero blocks that end an archive and zeros to a
//! whole 10,240-byte record, as GNU tar pads; all of it in one gzip member
//! (level [`GZIP_LEVEL`], the header's time the build's epoch, no file
//! name). The entry is not a GNU sparse entry: gzip compresses the holes'
//! zeros about a thousand to one, and every tar reads a plain entry.
//!
//! The reader ([`unpack`]) reads the first member through
//! [`payload::targuard::TarGuard`] (the one guard in front of every tar
//! reader of untrusted bytes) and writes it sparse.

use crate::io::AtomicFile;
use anyhow::{Context, Result, bail};
use payload::targuard::TarGuard;
use std::fs::File;
use std::io::{Read, Write};
use std::path::Path;

/// The one member's name, as Compute Engine requires.
pub const MEMBER: &str = "disk.raw";
/// gzip's level. Over the default 2 GiB disk, GNU gzip's level 6 gave 14.1
/// MB against level 1's 21.3 MB in about the same time (23.8 s and 22.7 s:
/// the zeros dominate); ours writes the archive in about 7 s.
pub const GZIP_LEVEL: u32 = 6;
/// GNU tar's record: 20 blocks.
const RECORD: u64 = 10240;
/// gzip's magic number.
pub const MAGIC: [u8; 2] = [0x1f, 0x8b];

/// Writes `dest`, the gzip'd oldgnu tar of the raw disk `raw` as
/// `disk.raw`, its times the build's `epoch`.
pub fn write_gce(raw: &Path, dest: &Path, epoch: u64) -> Result<()> {
    let mut src = File::open(raw).with_context(|| format!("opening {}", raw.display()))?;
    let size = src.metadata()?.len();
    let mut out = AtomicFile::create(dest)?;
    let werr = || format!("writing {}", dest.display());
    let mut gz = flate2::GzBuilder::new()
        .mtime(u32::try_from(epoch).unwrap_or(0))
        .operating_system(3) // Unix, as GNU gzip writes
        .write(
            std::io::BufWriter::with_capacity(1 << 20, out.file()),
            flate2::Compression::new(GZIP_LEVEL),
        );
    let mut h = tar::Header::new_gnu();
    h.set_path(MEMBER).with_context(werr)?;
    h.set_entry_type(tar::EntryType::Regular);
    h.set_mode(0o644);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(epoch);
    h.set_size(size);
    h.set_cksum();
    gz.write_all(h.as_bytes()).with_context(werr)?;
    crate::io::read_sparse(&mut src, &mut |b| gz.write_all(b))
        .with_context(|| format!("reading {}", raw.display()))?;
    // The member's padding, the two zero blocks, the record's rest.
    let written = 512 + size.next_multiple_of(512) + 1024;
    let end = written.next_multiple_of(RECORD);
    let mut pad = size.next_multiple_of(512) - size + 1024 + (end - written);
    let zeros = [0u8; 4096];
    while pad > 0 {
        let n = pad.min(zeros.len() as u64) as usize;
        gz.write_all(&zeros[..n]).with_context(werr)?;
        pad -= n as u64;
    }
    gz.finish().and_then(|mut w| w.flush()).with_context(werr)?;
    out.commit().with_context(werr)?;
    Ok(())
}

/// Reads the gzip'd tar `r` and writes its first member, which must be a
/// regular file named `disk.raw`, into `out` (sparse); returns its size.
pub fn unpack(r: &mut dyn Read, out: &std::path::Path) -> Result<u64> {
    let gz = flate2::read::GzDecoder::new(r);
    let mut ar = tar::Archive::new(TarGuard::new(gz));
    let mut entries = ar
        .entries()
        .map_err(|e| super::tar_error(e, "the gzip'd tar archive"))?;
    let Some(e) = entries.next() else {
        bail!("the archive is empty: Compute Engine's holds one member, {MEMBER}");
    };
    let mut e = e.map_err(|e| {
        if e.to_string().contains("GNU sparse file") {
            anyhow::anyhow!(
                "the archive's first member is a GNU sparse file (`tar -S`), which this reader \
                 does not take: unpack it with `tar -xzf` and give its disk.raw"
            )
        } else {
            super::tar_error(e, "the gzip'd tar archive")
        }
    })?;
    let name = String::from_utf8_lossy(&e.path_bytes()).into_owned();
    if name != MEMBER || e.header().entry_type() != tar::EntryType::Regular {
        bail!(
            "the archive's first member is {}: Compute Engine's is the regular file {MEMBER}",
            contract::text::escape(&name)
        );
    }
    let size = e.size();
    if size > super::MAX_DISK_SIZE {
        bail!("the archive's {MEMBER} is {size} bytes: at most 64 TiB are taken");
    }
    let n = super::compress::copy_sparse(&mut e, out)
        .with_context(|| format!("reading {MEMBER} from the archive"))?;
    if n != size {
        bail!("the archive ends inside {MEMBER} ({n} of {size} bytes): truncated");
    }
    drop(e);
    // The rest of the gzip stream, read so that its CRC-32 and length are
    // checked: a changed byte may still inflate.
    std::io::copy(&mut ar.into_inner(), &mut std::io::sink())
        .with_context(|| format!("reading the gzip stream after {MEMBER}"))?;
    Ok(size)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::disk::testutil::{run, tool};
    use std::os::unix::fs::FileExt;

    /// GNU tar lists one member, `disk.raw`, of the disk's size, in the
    /// gnu format; gzip -t finds the stream whole; tar and our reader give
    /// the disk back; the same disk gives the same bytes; a damaged or
    /// truncated archive, or one whose first member is another file, is
    /// refused.
    #[test]
    fn the_gce_archive_is_disk_raw_alone_in_a_gzipped_gnu_tar() {
        let dir = tempfile::tempdir().unwrap();
        let raw = dir.path().join("src.raw");
        let f = File::create(&raw).unwrap();
        let size = 9u64 << 20;
        f.set_len(size).unwrap();
        f.write_all_at(b"start", 0).unwrap();
        f.write_all_at(&[5u8; 70_000], 3 << 20).unwrap();
        f.write_all_at(b"end", size - 3).unwrap();
        drop(f);
        let gz = dir.path().join("gcp.tar.gz");
        write_gce(&raw, &gz, 1_700_000_000).unwrap();

        run(std::process::Command::new(tool("gzip")).arg("-t").arg(&gz));
        let list = run(std::process::Command::new(tool("tar"))
            .env("TZ", "UTC")
            .arg("-tvzf")
            .arg(&gz));
        let list = String::from_utf8_lossy(&list.stdout).into_owned();
        let lines: Vec<&str> = list.lines().collect();
        assert_eq!(lines.len(), 1, "{list}");
        assert!(
            lines[0].ends_with(&format!(" {size} 2023-11-14 22:13 disk.raw")),
            "{list}"
        );
        assert!(lines[0].starts_with("-rw-r--r-- 0/0"), "{list}");
        // GNU tar names the format it reads: gnu (oldgnu's magic).
        let unzipped = dir.path().join("gcp.tar");
        let out = run(std::process::Command::new(tool("gzip")).arg("-dc").arg(&gz));
        std::fs::write(&unzipped, &out.stdout).unwrap();
        assert_eq!(&out.stdout[257..265], b"ustar  \0");
        assert_eq!(out.stdout.len() as u64 % RECORD, 0);
        let x = dir.path().join("x");
        std::fs::create_dir(&x).unwrap();
        run(std::process::Command::new(tool("tar"))
            .arg("-xf")
            .arg(&unzipped)
            .arg("-C")
            .arg(&x));
        assert!(std::fs::read(x.join("disk.raw")).unwrap() == std::fs::read(&raw).unwrap());

        let back = dir.path().join("back.raw");
        let n = unpack(&mut File::open(&gz).unwrap(), &back).unwrap();
        assert_eq!(n, size);
        assert!(std::fs::read(&back).unwrap() == std::fs::read(&raw).unwrap());

        let again = dir.path().join("again.tar.gz");
        write_gce(&raw, &again, 1_700_000_000).unwrap();
        assert!(std::fs::read(&again).unwrap() == std::fs::read(&gz).unwrap());

        let good = std::fs::read(&gz).unwrap();
        let refuse = |bytes: &[u8], want: &str| {
            let e = unpack(&mut &bytes[..], &dir.path().join("bad.raw")).unwrap_err();
            assert!(format!("{e:#}").contains(want), "{want}: {e:#}");
        };
        refuse(&good[..good.len() / 3], "incomplete deflate stream");
        let mut b = good.clone();
        let mid = b.len() / 2;
        b[mid] ^= 0x55;
        refuse(&b, "disk.raw");
        // Another first member.
        let mut t = tar::Builder::new(Vec::new());
        let mut h = crate::oci::tar_header(tar::EntryType::Regular, 0o644, 3, 0);
        t.append_data(&mut h, "README", &b"hi\n"[..]).unwrap();
        let mut z = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::new(1));
        z.write_all(&t.into_inner().unwrap()).unwrap();
        refuse(&z.finish().unwrap(), "first member is README");
        refuse(b"\x1f\x8b", "gzip");
    }

    /// What GNU tar writes as Compute Engine's page shows (`tar
    /// --format=oldgnu -czf`) our reader reads; with `-S` (a GNU sparse
    /// member) it is refused, saying how to unpack it.
    #[test]
    fn the_reader_takes_gnu_tars_archive_and_refuses_a_sparse_member() {
        let dir = tempfile::tempdir().unwrap();
        let raw = dir.path().join("disk.raw");
        let f = File::create(&raw).unwrap();
        f.set_len(3 << 20).unwrap();
        f.write_all_at(b"data", 1 << 20).unwrap();
        drop(f);
        for (flags, ok) in [("-czf", true), ("-Sczf", false)] {
            let gz = dir.path().join(format!("{flags}.tar.gz"));
            run(std::process::Command::new(tool("tar"))
                .args(["--format=oldgnu", flags])
                .arg(&gz)
                .arg("-C")
                .arg(dir.path())
                .arg("disk.raw"));
            let back = dir.path().join("back.raw");
            let r = unpack(&mut File::open(&gz).unwrap(), &back);
            if ok {
                assert_eq!(r.unwrap(), 3 << 20);
                assert!(std::fs::read(&back).unwrap() == std::fs::read(&raw).unwrap());
            } else {
                let e = format!("{:#}", r.unwrap_err());
                assert!(e.contains("sparse") && e.contains("tar -xzf"), "{e}");
            }
        }
    }
}
