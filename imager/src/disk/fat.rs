//! FAT filesystems inside a partition window, formatted and filled with
//! `fatfs`, deterministically: the volume id comes from the caller (derived
//! with [`contract::guid::volume_id`]), files are written in sorted order and
//! every timestamp is SOURCE_DATE_EPOCH.

use anyhow::{Context, Result, bail};
use fatfs::{
    Date, DateTime, FatType, FileSystem, FormatVolumeOptions, FsOptions, Time, TimeProvider,
};
use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::{self, BufReader, Read, Seek, SeekFrom, Write};
use std::path::PathBuf;
use std::sync::Mutex;

/// Where the bytes of a file come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FatSource {
    /// Small contents held in memory (entries, loader.conf).
    Bytes(Vec<u8>),
    /// A file on disk, streamed when written.
    File(PathBuf),
}

impl FatSource {
    /// Opens the source for reading, with its length.
    pub fn open(&self) -> Result<(Box<dyn Read + '_>, u64)> {
        Ok(match self {
            FatSource::Bytes(b) => (Box::new(&b[..]), b.len() as u64),
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

/// A fixed time, the only one fatfs will see.
#[derive(Debug)]
struct FixedTime(DateTime);

impl TimeProvider for FixedTime {
    fn get_current_date(&self) -> Date {
        self.0.date
    }
    fn get_current_date_time(&self) -> DateTime {
        self.0
    }
}

/// fatfs wants a `&'static` time provider: keep one per epoch ever used
/// (a handful per process), so that nothing leaks per call.
fn time_provider(epoch: u64) -> &'static FixedTime {
    static PROVIDERS: Mutex<BTreeMap<u64, &'static FixedTime>> = Mutex::new(BTreeMap::new());
    let mut map = PROVIDERS.lock().unwrap_or_else(|e| e.into_inner());
    map.entry(epoch)
        .or_insert_with(|| Box::leak(Box::new(FixedTime(dos_date_time(epoch)))))
}

/// The DOS date and time of `epoch` (UTC), clamped to what FAT can store
/// (1980-01-01 00:00:00 to 2107-12-31 23:59:58).
pub fn dos_date_time(epoch: u64) -> DateTime {
    const MIN: u64 = 315_532_800; // 1980-01-01T00:00:00Z
    const MAX: u64 = 4_354_819_198; // 2107-12-31T23:59:58Z
    let t = epoch.clamp(MIN, MAX);
    let days = t / 86_400;
    let secs = t % 86_400;
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    DateTime {
        date: Date {
            year: year as u16,
            month: month as u16,
            day: day as u16,
        },
        time: Time {
            hour: (secs / 3600) as u16,
            min: (secs / 60 % 60) as u16,
            sec: (secs % 60) as u16,
            millis: 0,
        },
    }
}

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
            for i in 1..parts.len() {
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
    super::fatfix::fix_dot_entries(dev).with_context(|| {
        format!(
            "repairing the directories of the {} filesystem",
            params.label
        )
    })?;
    Ok(fat_type)
}

/// Refuses writes: lets fatfs read a filesystem from a read-only source.
#[derive(Debug)]
struct ReadOnly<T>(T);

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

fn open_ro<T: Read + Seek>(mut dev: T) -> Result<FileSystem<ReadOnly<T>>> {
    dev.seek(SeekFrom::Start(0))?;
    FileSystem::new(ReadOnly(dev), FsOptions::new()).context("reading the FAT filesystem")
}

/// The paths of all regular files on the FAT filesystem in `dev`, sorted.
pub fn list_files<T: Read + Seek>(dev: T) -> Result<Vec<String>> {
    let fs = open_ro(dev)?;
    let mut out = Vec::new();
    let mut todo = vec![(String::new(), fs.root_dir())];
    while let Some((prefix, dir)) = todo.pop() {
        for e in dir.iter() {
            let e = e.context("reading a FAT directory")?;
            let name = e.file_name();
            if name == "." || name == ".." {
                continue;
            }
            let path = format!("{prefix}{name}");
            if e.is_dir() {
                todo.push((format!("{path}/"), e.to_dir()));
            } else if e.is_file() {
                out.push(path);
            }
        }
    }
    out.sort();
    Ok(out)
}

/// The contents of the file `path` on the FAT filesystem in `dev`. Meant for
/// small files (boot entries, loader.conf): it is read into memory.
pub fn read_file<T: Read + Seek>(dev: T, path: &str) -> Result<Vec<u8>> {
    components(path)?;
    let fs = open_ro(dev)?;
    let mut f = fs
        .root_dir()
        .open_file(path)
        .with_context(|| format!("opening {path} on the FAT filesystem"))?;
    let mut out = Vec::new();
    f.read_to_end(&mut out)
        .with_context(|| format!("reading {path} on the FAT filesystem"))?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dos_times() {
        let d = dos_date_time(1_700_000_000); // 2023-11-14T22:13:20Z
        assert_eq!((d.date.year, d.date.month, d.date.day), (2023, 11, 14));
        assert_eq!((d.time.hour, d.time.min, d.time.sec), (22, 13, 20));
        let lo = dos_date_time(0);
        assert_eq!((lo.date.year, lo.date.month, lo.date.day), (1980, 1, 1));
        let hi = dos_date_time(u64::MAX);
        assert_eq!((hi.date.year, hi.date.month, hi.date.day), (2107, 12, 31));
        assert_eq!((hi.time.hour, hi.time.min, hi.time.sec), (23, 59, 58));
        let leap = dos_date_time(951_782_400); // 2000-02-29
        assert_eq!((leap.date.month, leap.date.day), (2, 29));
    }

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
                list_files(&mut dev).unwrap(),
                [
                    "A/vmlinuz-0123456789abcdef",
                    "EFI/BOOT/BOOTX64.EFI",
                    "loader/loader.conf"
                ]
            );
            assert_eq!(
                read_file(&mut dev, "loader/loader.conf").unwrap(),
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
