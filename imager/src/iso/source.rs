//! File data: the size of each source, and streaming it into the image in
//! 64 KiB chunks with patches overlaid, refusing a source that changed size
//! since the layout.

use super::{IsoFile, IsoSource};
use anyhow::{Context, Result, ensure};
use std::fs::File;
use std::io::Read;

pub(super) fn open_source(f: &IsoFile) -> Result<Box<dyn Read + '_>> {
    Ok(match &f.source {
        IsoSource::Bytes(b) => Box::new(&b[..]),
        IsoSource::File(p) => Box::new(
            File::open(p).with_context(|| format!("opening {} for {}", p.display(), f.path))?,
        ),
    })
}

pub(super) fn source_size(f: &IsoFile) -> Result<u64> {
    match &f.source {
        IsoSource::Bytes(b) => Ok(b.len() as u64),
        IsoSource::File(p) => {
            let m = std::fs::metadata(p)
                .with_context(|| format!("reading {} (source of {})", p.display(), f.path))?;
            ensure!(
                m.is_file(),
                "{} (source of {}) is not a regular file",
                p.display(),
                f.path
            );
            Ok(m.len())
        }
    }
}

/// Streams `size` bytes of `f` to `w`, overlaying `patches` (offset, bytes);
/// refuses a source whose size changed.
pub(super) fn copy_patched(
    f: &IsoFile,
    size: u64,
    patches: &[(u64, Vec<u8>)],
    mut w: impl FnMut(&[u8]) -> Result<()>,
) -> Result<()> {
    let mut r = open_source(f)?;
    let mut buf = vec![0u8; 64 * 1024];
    let mut pos = 0u64;
    loop {
        let n = r
            .read(&mut buf)
            .with_context(|| format!("reading the source of {}", f.path))?;
        if n == 0 {
            break;
        }
        ensure!(
            pos + n as u64 <= size,
            "the source of {} grew while the image was written (was {size} bytes)",
            f.path
        );
        let chunk = &mut buf[..n];
        for (at, bytes) in patches {
            let (start, end) = (*at, *at + bytes.len() as u64);
            let (cs, ce) = (pos, pos + n as u64);
            let (s, e) = (start.max(cs), end.min(ce));
            if s < e {
                chunk[(s - cs) as usize..(e - cs) as usize]
                    .copy_from_slice(&bytes[(s - start) as usize..(e - start) as usize]);
            }
        }
        w(chunk)?;
        pos += n as u64;
    }
    ensure!(
        pos == size,
        "the source of {} has {pos} bytes, not the {size} it had when the image was laid out",
        f.path
    );
    Ok(())
}
