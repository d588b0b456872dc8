//! The output `vhd` (`disk.vhd`): the raw disk as a fixed VHD, its data
//! copied extent by extent (holes stay holes) and the footer
//! ([`bootstate::vhd::footer`]) after it. Written under a temporary name and
//! renamed when complete.

use crate::io::{AtomicFile, data_extents};
use anyhow::{Context, Result, bail};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;

/// Writes `dest`, the fixed VHD of the raw disk `raw`, its footer's
/// timestamp from `epoch` and its unique id from `id` (the disk GUID's
/// bytes: the same disk, the same VHD).
pub fn write_vhd(raw: &Path, dest: &Path, id: [u8; 16], epoch: u64) -> Result<()> {
    let mut src = std::fs::File::open(raw).with_context(|| format!("opening {}", raw.display()))?;
    let size = src.metadata()?.len();
    if size % (1 << 20) != 0 {
        bail!(
            "{} is {size} bytes: a VHD for a cloud must be a whole number of MiB; make \
             disk.size one",
            raw.display()
        );
    }
    let mut out = AtomicFile::create(dest)?;
    let f = out.file();
    f.set_len(size + bootstate::vhd::FOOTER_LEN)
        .with_context(|| format!("sizing {}", dest.display()))?;
    let mut buf = vec![0u8; 1 << 20];
    for data in data_extents(&src, size)? {
        src.seek(SeekFrom::Start(data.start))?;
        f.seek(SeekFrom::Start(data.start))?;
        let mut left = data.end - data.start;
        while left > 0 {
            let n = left.min(buf.len() as u64) as usize;
            src.read_exact(&mut buf[..n])
                .with_context(|| format!("reading {}", raw.display()))?;
            f.write_all(&buf[..n])
                .with_context(|| format!("writing {}", dest.display()))?;
            left -= n as u64;
        }
    }
    f.seek(SeekFrom::Start(size))?;
    f.write_all(&bootstate::vhd::footer(size, id, epoch))
        .with_context(|| format!("writing {}", dest.display()))?;
    out.commit()
        .with_context(|| format!("writing {}", dest.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    /// The VHD is the raw disk, byte for byte, then the footer; its holes
    /// stay holes; bootstate reads it as the raw disk's size.
    #[test]
    fn a_vhd_is_the_raw_disk_and_a_footer() {
        let dir = tempfile::tempdir().unwrap();
        let raw = dir.path().join("disk.raw");
        let f = std::fs::File::create(&raw).unwrap();
        f.set_len(64 << 20).unwrap();
        f.write_all_at(b"start", 0).unwrap();
        f.write_all_at(b"middle", 33 << 20).unwrap();
        f.write_all_at(b"end", (64 << 20) - 3).unwrap();
        drop(f);
        let vhd = dir.path().join("disk.vhd");
        write_vhd(&raw, &vhd, [9; 16], 1_700_000_000).unwrap();
        let r = std::fs::read(&raw).unwrap();
        let v = std::fs::read(&vhd).unwrap();
        assert_eq!(v.len(), r.len() + 512);
        assert!(v[..r.len()] == r[..]);
        let footer: [u8; 512] = v[r.len()..].try_into().unwrap();
        assert_eq!(
            footer,
            bootstate::vhd::footer(64 << 20, [9; 16], 1_700_000_000)
        );
        let mut f = std::fs::File::open(&vhd).unwrap();
        assert_eq!(bootstate::gpt::image_size(&mut f).unwrap(), 64 << 20);
        use std::os::unix::fs::MetadataExt;
        assert!(
            f.metadata().unwrap().blocks() * 512 < 1 << 20,
            "holes were filled"
        );
        // Not a whole number of MiB: refused, nothing written.
        let odd = dir.path().join("odd.raw");
        std::fs::File::create(&odd)
            .unwrap()
            .set_len(1 << 19)
            .unwrap();
        let e = write_vhd(&odd, &dir.path().join("odd.vhd"), [0; 16], 0).unwrap_err();
        assert!(e.to_string().contains("whole number of MiB"), "{e}");
        assert!(!dir.path().join("odd.vhd").exists());
    }
}
