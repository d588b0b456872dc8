//! New FAT filesystems (the builder's ESP and BOOT, an installer's blank
//! disk) inside a partition window, formatted and filled with `fatfs`, their
//! directories repaired by [`crate::fatfix`], deterministically: the volume id comes from the caller (derived
//! with [`contract::guid::volume_id`]), files are written in sorted order and
//! every timestamp is SOURCE_DATE_EPOCH.

use anyhow::{Context, Result, bail};
use fatfs::{FatType, FileSystem, FormatVolumeOptions, FsOptions};
use std::collections::BTreeSet;
use std::fs::File;
use std::io::{self, BufReader, Read, Seek, SeekFrom, Write};
use std::path::PathBuf;

/// Where the bytes of a file come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FatSource {
    /// Small contents held in memory (entries, loader.conf).
    Bytes(Vec<u8>),
    /// A file on disk, streamed when written.
    File(PathBuf),
    /// Not a file: an empty directory (the slot directories of BOOT).
    Dir,
}

impl FatSource {
    /// Opens the source for reading, with its length.
    pub fn open(&self) -> Result<(Box<dyn Read + '_>, u64)> {
        Ok(match self {
            FatSource::Bytes(b) => (Box::new(&b[..]), b.len() as u64),
            FatSource::Dir => (Box::new(io::empty()), 0),
            FatSource::File(p) => {
                let f = File::open(p).with_context(|| format!("opening {}", p.display()))?;
                let len = f
                    .metadata()
                    .with_context(|| format!("reading the size of {}", p.display()))?
                    .len();
                (Box::new(BufReader::with_capacity(1 << 20, f)), len)
            }
        })
    }

    /// What the source is, for error messages.
    pub fn describe(&self) -> String {
        match self {
            FatSource::Bytes(b) => format!("{} bytes in memory", b.len()),
            FatSource::Dir => "a directory".to_string(),
            FatSource::File(p) => p.display().to_string(),
        }
    }
}

/// A file to put on a FAT filesystem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FatFile {
    /// Path from the filesystem root, `/`-separated, no leading slash:
    /// `EFI/BOOT/BOOTX64.EFI`.
    pub path: String,
    pub source: FatSource,
}

impl FatFile {
    pub fn bytes(path: impl Into<String>, bytes: impl Into<Vec<u8>>) -> FatFile {
        FatFile {
            path: path.into(),
            source: FatSource::Bytes(bytes.into()),
        }
    }

    pub fn file(path: impl Into<String>, source: impl Into<PathBuf>) -> FatFile {
        FatFile {
            path: path.into(),
            source: FatSource::File(source.into()),
        }
    }

    pub fn dir(path: impl Into<String>) -> FatFile {
        FatFile {
            path: path.into(),
            source: FatSource::Dir,
        }
    }
}

/// How to format a FAT filesystem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FatParams {
    /// Volume label, at most 11 ASCII characters (stored upper case).
    pub label: String,
    /// Volume serial number.
    pub volume_id: u32,
    /// Bytes per logical sector: the disk's sector size.
    pub sector_size: u64,
    /// Ask for FAT32 (the ESP). The cluster size is then the smallest FAT32
    /// allows; a volume with too few clusters for FAT32 at this sector size
    /// (below ~260 MiB at 4096-byte sectors) is still formatted FAT16, as
    /// mkfs.fat would do. Without it, fatfs picks the type by size.
    pub fat32: bool,
    /// Timestamp of every file and directory, seconds since 1970 (UTC).
    pub epoch: u64,
}

use crate::fat::time_provider;

fn volume_label(label: &str) -> Result<[u8; 11]> {
    if label.is_empty()
        || label.len() > 11
        || !label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        bail!("FAT volume label {label:?} must be 1 to 11 characters among A-Z 0-9 _ -");
    }
    let mut out = [b' '; 11];
    for (o, b) in out.iter_mut().zip(label.bytes()) {
        *o = b.to_ascii_uppercase();
    }
    Ok(out)
}

/// Checks a path and splits it into components.
fn components(path: &str) -> Result<Vec<&str>> {
    let parts: Vec<&str> = path.split('/').collect();
    if path.is_empty()
        || parts
            .iter()
            .any(|c| c.is_empty() || *c == "." || *c == ".." || c.contains('\\'))
    {
        bail!(
            "invalid path {path:?} for a FAT filesystem: use a relative `/`-separated path \
             without empty, `.` or `..` components"
        );
    }
    Ok(parts)
}

/// Formats a FAT filesystem on the whole of `dev` (a partition window at
/// position 0) and writes `files` to it, in path order, creating parent
/// directories. Returns the FAT type used.
pub fn format_fat<T: Read + Write + Seek>(
    dev: &mut T,
    params: &FatParams,
    files: &[FatFile],
) -> Result<FatType> {
    let label = volume_label(&params.label)?;
    let sector_size = u16::try_from(params.sector_size)
        .ok()
        .filter(|s| contract::partition::SECTOR_SIZES.contains(&u64::from(*s)))
        .ok_or_else(|| anyhow::anyhow!("sector size {} is not supported", params.sector_size))?;
    let mut opts = FormatVolumeOptions::new()
        .bytes_per_sector(sector_size)
        .volume_id(params.volume_id)
        .volume_label(label);
    if params.fat32 {
        opts = opts.fat_type(FatType::Fat32);
    }
    dev.seek(SeekFrom::Start(0))?;
    fatfs::format_volume(&mut *dev, opts)
        .with_context(|| format!("formatting the {} FAT filesystem", params.label))?;

    let mut sorted: Vec<&FatFile> = files.iter().collect();
    sorted.sort_by(|a, b| a.path.cmp(&b.path));
    for w in sorted.windows(2) {
        if w[0].path == w[1].path {
            bail!(
                "{} is given twice for the {} filesystem",
                w[0].path,
                params.label
            );
        }
    }

    let fs_opts = FsOptions::new().time_provider(time_provider(params.epoch));
    let fs = FileSystem::new(&mut *dev, fs_opts)
        .with_context(|| format!("opening the new {} FAT filesystem", params.label))?;
    let fat_type = fs.fat_type();
    {
        let root = fs.root_dir();
        let mut made = BTreeSet::new();
        for f in sorted {
            let parts = components(&f.path)?;
            let is_dir = f.source == FatSource::Dir;
            for i in 1..parts.len() + usize::from(is_dir) {
                let dir = parts[..i].join("/");
                if made.insert(dir.clone()) {
                    root.create_dir(&dir).with_context(|| {
                        format!(
                            "creating directory {dir} on the {} filesystem",
                            params.label
                        )
                    })?;
                }
            }
            if is_dir {
                continue;
            }
            let (mut src, len) = f.source.open()?;
            let mut out = root.create_file(&f.path).with_context(|| {
                format!("creating {} on the {} filesystem", f.path, params.label)
            })?;
            out.truncate()?;
            let n = io::copy(&mut src, &mut out).with_context(|| {
                format!(
                    "writing {} ({}, {len} bytes) to the {} filesystem; if it is full, \
                     raise the size of the {} partition in the profile",
                    f.path,
                    f.source.describe(),
                    params.label,
                    params.label
                )
            })?;
            if n != len {
                bail!(
                    "{} changed while it was copied to {}: {n} bytes instead of {len}",
                    f.source.describe(),
                    f.path
                );
            }
            out.flush()?;
        }
    }
    fs.unmount()
        .with_context(|| format!("closing the {} FAT filesystem", params.label))?;
    crate::fatfix::fix_dot_entries(dev).with_context(|| {
        format!(
            "repairing the directories of the {} filesystem",
            params.label
        )
    })?;
    Ok(fat_type)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fat::{BootFs, dos_date_time};

    #[test]
    fn labels_and_paths() {
        assert_eq!(&volume_label("efi").unwrap(), b"EFI        ");
        assert!(volume_label("TOO-LONG-LABEL").is_err());
        assert!(volume_label("").is_err());
        assert!(components("a/../b").is_err());
        assert!(components("/a").is_err());
        assert_eq!(components("a/b").unwrap(), ["a", "b"]);
    }

    #[test]
    fn round_trip_in_memory() {
        for ss in [512u64, 4096] {
            let mut dev = io::Cursor::new(vec![0u8; 40 << 20]);
            let files = vec![
                FatFile::bytes("loader/loader.conf", "timeout 0\n"),
                FatFile::bytes("EFI/BOOT/BOOTX64.EFI", vec![7u8; 100_000]),
                FatFile::bytes("A/vmlinuz-0123456789abcdef", vec![1u8; 3000]),
            ];
            let p = FatParams {
                label: "BOOT".into(),
                volume_id: 0x1234_5678,
                sector_size: ss,
                fat32: false,
                epoch: 1_700_000_000,
            };
            format_fat(&mut dev, &p, &files).unwrap();
            assert_eq!(
                BootFs::new(&mut dev, 0).list_all().unwrap(),
                [
                    "A/vmlinuz-0123456789abcdef",
                    "EFI/BOOT/BOOTX64.EFI",
                    "loader/loader.conf"
                ]
            );
            assert_eq!(
                BootFs::new(&mut dev, 0)
                    .read("loader/loader.conf", 1 << 20)
                    .unwrap(),
                b"timeout 0\n"
            );
            dev.seek(SeekFrom::Start(0)).unwrap();
            let fs = FileSystem::new(&mut dev, FsOptions::new()).unwrap();
            assert_eq!(fs.volume_id(), 0x1234_5678);
            let e = fs
                .root_dir()
                .iter()
                .map(|e| e.unwrap())
                .find(|e| e.file_name() == "loader")
                .unwrap();
            assert_eq!(e.modified(), dos_date_time(1_700_000_000));
            assert_eq!(e.created(), dos_date_time(1_700_000_000));
        }
    }

    #[test]
    fn duplicate_and_full() {
        let mut dev = io::Cursor::new(vec![0u8; 8 << 20]);
        let p = FatParams {
            label: "BOOT".into(),
            volume_id: 1,
            sector_size: 512,
            fat32: false,
            epoch: 0,
        };
        let dup = vec![FatFile::bytes("a", "1"), FatFile::bytes("a", "2")];
        assert!(format!("{:#}", format_fat(&mut dev, &p, &dup).unwrap_err()).contains("twice"));
        let big = vec![FatFile::bytes("big", vec![0u8; 9 << 20])];
        let e = format!("{:#}", format_fat(&mut dev, &p, &big).unwrap_err());
        assert!(e.contains("raise the size of the BOOT partition"), "{e}");
    }
}
