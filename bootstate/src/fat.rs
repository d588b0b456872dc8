//! The BOOT filesystem (FAT) as the slot operations use it: list, read,
//! hash, create and remove files. Files are created with fatfs, whose order
//! of writes is safe for a new file (the directory entry gets its size and
//! first cluster last), over [`crate::gather`], which writes fatfs's new
//! data in large runs and syncs before each write that links it (so the
//! order holds without `O_DSYNC`); they are removed with
//! [`crate::fatfix::remove_file`], whose order is safe for a removal. Every
//! change ends with a sync.

use crate::device::{Device, ReadOnly};
use crate::fatscan::{self, Scan};
use crate::gather::Gather;
use anyhow::{Context, Result, bail};
use fatfs::{Date, DateTime, FileSystem, FsOptions, Time, TimeProvider};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::sync::Mutex;

/// A fixed time, the only one fatfs will see.
#[derive(Debug)]
pub struct FixedTime(DateTime);

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
pub fn time_provider(epoch: u64) -> &'static FixedTime {
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
    let (year, month, day) = contract::date::civil_from_days(days);
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

/// Whether `path` is a path BOOT's files may have: `/`-separated, relative,
/// every component non-empty and neither `.` nor `..` (fatfs would follow
/// those, and boot entries come from the disk).
pub fn valid_path(path: &str) -> bool {
    !path.is_empty()
        && path
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != ".." && !c.contains('\\'))
}

fn check_path(path: &str) -> Result<()> {
    if !valid_path(path) {
        bail!(
            "{path:?} is not a path on BOOT: use a relative `/`-separated path without empty, `.` or `..` components"
        );
    }
    Ok(())
}

/// A file found on BOOT.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileInfo {
    /// Name within its directory, as stored (long name).
    pub name: String,
    pub size: u64,
}

/// The BOOT FAT filesystem on a device (a partition). Reads need only
/// `Read + Seek` (`imager inspect` opens disks read-only); changes need a
/// [`Device`]. Before its first use of the volume it is [`scan`]ned: a
/// volume that contradicts itself is refused before fatfs reads it.
#[derive(Debug)]
pub struct BootFs<D> {
    dev: D,
    /// Timestamp of files this writes, seconds since 1970.
    epoch: u64,
    /// The scan, once made.
    scanned: Option<Scan>,
}

impl<D: Read + Seek> BootFs<D> {
    pub fn new(dev: D, epoch: u64) -> BootFs<D> {
        BootFs {
            dev,
            epoch,
            scanned: None,
        }
    }

    pub fn into_inner(self) -> D {
        self.dev
    }

    /// The volume's scan (made once): free and lost clusters; an error,
    /// saying what is wrong, for a volume that contradicts itself.
    pub fn scan(&mut self) -> Result<&Scan> {
        if self.scanned.is_none() {
            let s = fatscan::scan(&mut self.dev).context(
                "BOOT's FAT filesystem is damaged (repair it with fsck.fat -a, or reinstall \
                 the disk)",
            )?;
            self.scanned = Some(s);
        }
        self.scanned
            .as_ref()
            .ok_or_else(|| anyhow::anyhow!("internal: no scan"))
    }

    /// fatfs over the device, read-only.
    fn open_ro(&mut self) -> Result<FileSystem<ReadOnly<&mut D>>> {
        self.scan()?;
        self.dev.seek(SeekFrom::Start(0))?;
        FileSystem::new(ReadOnly(&mut self.dev), FsOptions::new())
            .context("reading the BOOT filesystem")
    }

    /// The regular files of directory `dir` ("" for the root), sorted by
    /// name; empty when the directory does not exist.
    pub fn list(&mut self, dir: &str) -> Result<Vec<FileInfo>> {
        if !dir.is_empty() {
            check_path(dir)?;
        }
        let fs = self.open_ro()?;
        let root = fs.root_dir();
        let d = if dir.is_empty() {
            root
        } else {
            match root.open_dir(dir) {
                Ok(d) => d,
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
                Err(e) => return Err(e).with_context(|| format!("opening {dir} on BOOT")),
            }
        };
        let mut out = Vec::new();
        for e in d.iter() {
            let e = e.with_context(|| format!("reading directory {dir} on BOOT"))?;
            if e.is_file() {
                out.push(FileInfo {
                    name: e.file_name(),
                    size: e.len(),
                });
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// The paths of all regular files, sorted.
    pub fn list_all(&mut self) -> Result<Vec<String>> {
        let fs = self.open_ro()?;
        let mut out = Vec::new();
        let mut todo = vec![(String::new(), fs.root_dir())];
        while let Some((prefix, dir)) = todo.pop() {
            for e in dir.iter() {
                let e = e.context("reading a directory on BOOT")?;
                // `.` and `..` by their short names: a long name on them
                // (fatfs writes one) must not make this walk loop.
                if matches!(e.short_file_name_as_bytes(), b"." | b"..") {
                    continue;
                }
                let name = e.file_name();
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

    /// The architecture of the removable-media boot loader on this
    /// filesystem (the ESP's, or BOOT's on a disk whose BOOT is the ESP):
    /// the one whose `EFI/BOOT/BOOTX64.EFI` or `BOOTAA64.EFI`
    /// (`Arch::esp_boot_loader`) it holds, found in the directories alone
    /// ([`crate::disk::loader_arches`]: a replacement cut short does not
    /// hide it); none or several is an error.
    pub fn boot_loader_arch(&mut self) -> Result<contract::Arch> {
        let found = crate::disk::loader_arches(&mut self.dev)?;
        crate::disk::one_arch(&found, "the ESP")
    }

    /// Whether `path` exists (file or directory).
    pub fn exists(&mut self, path: &str) -> Result<bool> {
        check_path(path)?;
        let fs = self.open_ro()?;
        let root = fs.root_dir();
        Ok(root.open_file(path).is_ok() || root.open_dir(path).is_ok())
    }

    /// A small file's contents (entries, at most `limit` bytes).
    pub fn read(&mut self, path: &str, limit: u64) -> Result<Vec<u8>> {
        check_path(path)?;
        let fs = self.open_ro()?;
        let f = fs
            .root_dir()
            .open_file(path)
            .with_context(|| format!("opening {path} on BOOT"))?;
        let mut out = Vec::new();
        f.take(limit + 1)
            .read_to_end(&mut out)
            .with_context(|| format!("reading {path} on BOOT"))?;
        if out.len() as u64 > limit {
            bail!("{path} on BOOT is larger than {limit} bytes");
        }
        Ok(out)
    }

    /// SHA-256 (hex) and length of a file, streamed.
    pub fn hash(&mut self, path: &str) -> Result<(String, u64)> {
        check_path(path)?;
        let fs = self.open_ro()?;
        let mut f = fs
            .root_dir()
            .open_file(path)
            .with_context(|| format!("opening {path} on BOOT"))?;
        let mut h = Sha256::new();
        let mut buf = vec![0u8; 1 << 16];
        let mut n = 0u64;
        loop {
            let k = f
                .read(&mut buf)
                .with_context(|| format!("reading {path} on BOOT"))?;
            if k == 0 {
                break;
            }
            h.update(&buf[..k]);
            n += k as u64;
        }
        Ok((hex(&h.finalize()), n))
    }

    /// Free bytes, and the cluster size (a file takes whole clusters).
    pub fn space(&mut self) -> Result<(u64, u64)> {
        let fs = self.open_ro()?;
        let st = fs.stats().context("reading BOOT's free space")?;
        let cluster = u64::from(st.cluster_size());
        Ok((u64::from(st.free_clusters()) * cluster, cluster))
    }
}

impl<D: Device> BootFs<D> {
    /// The device under fatfs for a change ([`crate::gather`]): fatfs runs
    /// over `&mut` it, and [`Device::sync`] on it writes what it holds in
    /// its order.
    fn gather(&mut self) -> Result<Gather<&mut D>> {
        self.scan()?;
        let g = fatscan::geometry(&mut self.dev)?;
        Gather::new(&mut self.dev, g).context("reading BOOT's FAT")
    }

    fn opts(&self) -> FsOptions {
        FsOptions::new().time_provider(time_provider(self.epoch))
    }

    /// Frees the clusters no directory entry reaches (what a cut file
    /// creation leaves) and brings the FAT copies in line; syncs. Safe to
    /// cut at any write: no entry points to what it frees. Returns the
    /// clusters freed.
    pub fn reclaim(&mut self) -> Result<usize> {
        // A fresh scan: the volume may have changed since the first.
        self.scanned = None;
        let scan = self.scan()?.clone();
        let n = fatscan::reclaim(&mut self.dev, &scan).context("freeing BOOT's lost clusters")?;
        self.dev.sync().context("syncing BOOT")?;
        // Rescanned at next use.
        self.scanned = None;
        Ok(n)
    }

    /// Creates directory `dir` if missing (its parent must exist).
    pub fn ensure_dir(&mut self, dir: &str) -> Result<()> {
        check_path(dir)?;
        let opts = self.opts();
        {
            let mut g = self.gather()?;
            let fs = FileSystem::new(&mut g, opts).context("reading the BOOT filesystem")?;
            match fs.root_dir().open_dir(dir) {
                // A directory starts with `.` and `..`; one without was
                // cut short in its creation, and is finished below.
                Ok(d) => {
                    let first: Vec<String> = d
                        .iter()
                        .take(2)
                        .map(|e| e.map(|e| e.file_name()).unwrap_or_default())
                        .collect();
                    if first == [".", ".."] {
                        return Ok(());
                    }
                }
                Err(_) => {
                    fs.root_dir()
                        .create_dir(dir)
                        .with_context(|| format!("creating directory {dir} on BOOT"))?;
                }
            }
            fs.unmount().context("closing BOOT")?;
            g.sync().context("syncing BOOT")?;
        }
        crate::fatfix::fix_dot_entries(&mut self.dev)
            .with_context(|| format!("repairing directory {dir} on BOOT"))?;
        self.dev.sync().context("syncing BOOT")?;
        Ok(())
    }

    /// Creates `path` with `len` bytes from `src` and syncs. The file must
    /// not exist. It is complete or absent, as far as readers go, at every
    /// write: its directory entry gets its length last.
    pub fn create(&mut self, path: &str, src: &mut dyn Read, len: u64) -> Result<()> {
        check_path(path)?;
        let opts = self.opts();
        {
            let mut g = self.gather()?;
            let fs = FileSystem::new(&mut g, opts).context("reading the BOOT filesystem")?;
            if fs.root_dir().open_file(path).is_ok() {
                bail!("{path} exists on BOOT already");
            }
            let mut f = fs
                .root_dir()
                .create_file(path)
                .with_context(|| format!("creating {path} on BOOT"))?;
            let mut buf = vec![0u8; 1 << 16];
            let mut n = 0u64;
            loop {
                let k = src
                    .read(&mut buf)
                    .with_context(|| format!("reading the source of {path}"))?;
                if k == 0 {
                    break;
                }
                f.write_all(&buf[..k])
                    .with_context(|| format!("writing {path} on BOOT"))?;
                n += k as u64;
            }
            if n != len {
                bail!("the source of {path} gave {n} bytes instead of {len}");
            }
            f.flush()
                .with_context(|| format!("writing {path} on BOOT"))?;
            drop(f);
            fs.unmount().context("closing BOOT")?;
            // Everything held, in its order, and synced.
            g.sync().context("syncing BOOT")?;
        }
        Ok(())
    }

    /// Rewrites the bytes of the existing file `path` in place, as GRUB's
    /// `save_env` does: the same length (a different one is refused), the
    /// same clusters, found through the FAT; the directory entry, the FAT
    /// and every other file are not touched (so the entry keeps its
    /// modification time, as under GRUB). Each 512-byte piece of the file
    /// whose bytes change is written with one device write, in file order,
    /// then the device is synced. A disk writes a sector whole or not at
    /// all, so a caller that keeps its changes within one 512-byte piece
    /// (GRUB's environment block, `grub.cfg`'s first sector) changes the
    /// file atomically. Returns the number of pieces written.
    ///
    /// fatfs is not used: opening an existing file and writing it at offset
    /// 0 would do the same data writes, but fatfs also rewrites the
    /// directory entry (modification date, and the size on the way) when the
    /// file is closed: a second write, in another sector, for nothing.
    pub fn overwrite_in_place(&mut self, path: &str, bytes: &[u8]) -> Result<usize> {
        check_path(path)?;
        self.scan()?;
        let g = fatscan::geometry(&mut self.dev)?;
        let f = crate::fatfix::find(&mut self.dev, &g, path)?
            .ok_or_else(|| anyhow::anyhow!("{path} does not exist on BOOT"))?;
        if f.is_dir {
            bail!("{path} on BOOT is a directory, not a file");
        }
        if f.size != bytes.len() as u64 {
            bail!(
                "{path} on BOOT is {} bytes: it is rewritten in place only with as many \
                 ({} given); it is never truncated or reallocated",
                f.size,
                bytes.len()
            );
        }
        if bytes.is_empty() {
            return Ok(0);
        }
        let chain = g
            .chain(&mut self.dev, f.first_cluster)
            .with_context(|| format!("following {path}'s clusters on BOOT"))?;
        if (chain.len() as u64).saturating_mul(g.cluster_size) < f.size {
            bail!(
                "{path} on BOOT is {} bytes but its clusters hold less",
                f.size
            );
        }
        let mut written = 0;
        let mut old = [0u8; PIECE];
        for (i, want) in bytes.chunks(PIECE).enumerate() {
            let offset = (i * PIECE) as u64;
            let (cluster_at, _) = chain[(offset / g.cluster_size) as usize];
            let at = cluster_at + offset % g.cluster_size;
            self.dev.seek(SeekFrom::Start(at))?;
            self.dev
                .read_exact(&mut old[..want.len()])
                .with_context(|| format!("reading {path} on BOOT"))?;
            if old[..want.len()] != *want {
                self.dev.seek(SeekFrom::Start(at))?;
                self.dev
                    .write_all(want)
                    .with_context(|| format!("rewriting {path} on BOOT"))?;
                written += 1;
            }
        }
        self.dev.sync().context("syncing BOOT")?;
        Ok(written)
    }

    /// Replaces the existing file `path` with `len` bytes from `src` so that
    /// a power cut at any write leaves `path` whole, old or new (for a file
    /// that must always be there: the ESP's boot loader). In order:
    ///
    /// 1. the new bytes become the file [`replacement`]`(path)`, complete
    ///    ([`Self::create`]: its length is written last), and are read back:
    ///    not `sha256` (hex) and `len`, the replacement is removed and
    ///    `path` is left as it was;
    /// 2. `path`'s entry takes the new file's first cluster and length, in
    ///    one 32-byte write ([`crate::fatfix::point_entry`]): from here
    ///    `path` reads new; the old clusters are held by nothing;
    /// 3. the replacement's entries are marked deleted, its clusters kept
    ///    (they are `path`'s now);
    /// 4. the old clusters are freed ([`Self::reclaim`]).
    ///
    /// A cut between 2 and 3 leaves two names on the new clusters, which
    /// the scan of every other change refuses: [`Self::finish_replace`],
    /// run first by `replace`, finishes that state (and removes a
    /// replacement a cut left before step 2). Syncs after each step.
    pub fn replace(
        &mut self,
        path: &str,
        src: &mut dyn Read,
        len: u64,
        sha256: &str,
    ) -> Result<()> {
        check_path(path)?;
        // First: a cut replacement leaves a state the scan refuses.
        self.finish_replace(path)?;
        if !self.exists(path)? {
            bail!("{path} does not exist on BOOT: there is nothing to replace");
        }
        let tmp = replacement(path);
        // 1., read back before anything points at it.
        self.create(&tmp, src, len)?;
        let (got, n) = self.hash(&tmp)?;
        if got != sha256 || n != len {
            self.remove(&tmp)?;
            bail!(
                "{tmp} reads back as sha256 {got} ({n} bytes), not {sha256} ({len} bytes): its \
                 source changed since it was checked, or what was written did not read back; it \
                 was removed and {path} is as it was"
            );
        }
        // 2.
        let (first, size) = crate::fatfix::file_extent(&mut self.dev, &tmp)?
            .ok_or_else(|| anyhow::anyhow!("{tmp} vanished from BOOT"))?;
        self.scanned = None;
        crate::fatfix::point_entry(&mut self.dev, path, first, size)
            .with_context(|| format!("switching {path} to its new contents"))?;
        self.dev.sync().context("syncing BOOT")?;
        // 3.
        crate::fatfix::forget_file(&mut self.dev, &tmp)
            .with_context(|| format!("dropping the name {tmp}"))?;
        self.dev.sync().context("syncing BOOT")?;
        // 4.
        self.reclaim()?;
        Ok(())
    }

    /// Finishes a [`Self::replace`] of `path` that a power cut interrupted:
    /// a replacement that shares `path`'s clusters (cut after the switch)
    /// loses its name; one that does not (cut before) is removed. Nothing
    /// to do otherwise. Returns whether it changed anything.
    pub fn finish_replace(&mut self, path: &str) -> Result<bool> {
        check_path(path)?;
        let tmp = replacement(path);
        let Some((tmp_first, _)) = crate::fatfix::file_extent(&mut self.dev, &tmp)? else {
            return Ok(false);
        };
        let shared = crate::fatfix::file_extent(&mut self.dev, path)?
            .is_some_and(|(first, _)| first == tmp_first && first >= 2);
        self.scanned = None;
        if shared {
            crate::fatfix::forget_file(&mut self.dev, &tmp)?;
            self.dev.sync().context("syncing BOOT")?;
        } else {
            self.remove(&tmp)?;
        }
        self.scanned = None;
        Ok(true)
    }

    /// Removes `path` crash-safely and syncs; false if it was not there.
    pub fn remove(&mut self, path: &str) -> Result<bool> {
        check_path(path)?;
        self.scan()?;
        let found = crate::fatfix::remove_file(&mut self.dev, path)
            .with_context(|| format!("removing {path} from BOOT"))?;
        if found {
            self.dev.sync().context("syncing BOOT")?;
        }
        Ok(found)
    }
}

/// The name a file's replacement is written under before it takes the
/// file's place ([`BootFs::replace`]): the same directory and stem,
/// extension `NEW` (`EFI/BOOT/BOOTX64.EFI` → `EFI/BOOT/BOOTX64.NEW`).
pub fn replacement(path: &str) -> String {
    let (dir, name) = match path.rsplit_once('/') {
        Some((d, n)) => (format!("{d}/"), n),
        None => (String::new(), path),
    };
    let stem = name.rsplit_once('.').map_or(name, |(s, _)| s);
    format!("{dir}{stem}.NEW")
}

/// The unit [`BootFs::overwrite_in_place`] writes: a 512-byte sector,
/// which a disk writes whole (the cluster size is a multiple of it).
const PIECE: usize = 512;

/// Lower-case hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::Faulty;
    use std::io::Cursor;

    fn blank(sector: u16, len: usize) -> Cursor<Vec<u8>> {
        let mut dev = Cursor::new(vec![0u8; len]);
        fatfs::format_volume(
            &mut dev,
            fatfs::FormatVolumeOptions::new().bytes_per_sector(sector),
        )
        .unwrap();
        dev
    }

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
    fn create_list_hash_remove() {
        for (sector, len) in [(512u16, 40usize << 20), (4096, 64 << 20)] {
            let mut fs = BootFs::new(blank(sector, len), 1_700_000_000);
            fs.ensure_dir("loader").unwrap();
            fs.ensure_dir("loader/entries").unwrap();
            fs.ensure_dir("A").unwrap();
            let big = vec![7u8; 3 << 20];
            fs.create(
                "A/vmlinuz-0123456789abcdef",
                &mut &big[..],
                big.len() as u64,
            )
            .unwrap();
            let entry = b"title x\nlinux /A/vmlinuz-0123456789abcdef\n";
            fs.create(
                "loader/entries/g00000001-slot-a.conf",
                &mut &entry[..],
                entry.len() as u64,
            )
            .unwrap();
            assert!(
                fs.create("A/vmlinuz-0123456789abcdef", &mut &b""[..], 0)
                    .is_err()
            );
            let names: Vec<_> = fs.list("loader/entries").unwrap();
            assert_eq!(
                names,
                [FileInfo {
                    name: "g00000001-slot-a.conf".into(),
                    size: entry.len() as u64
                }]
            );
            assert_eq!(fs.list("B").unwrap(), []);
            assert_eq!(
                fs.read("loader/entries/g00000001-slot-a.conf", 4096)
                    .unwrap(),
                entry
            );
            let (sha, n) = fs.hash("A/vmlinuz-0123456789abcdef").unwrap();
            assert_eq!((sha, n), (hex(&Sha256::digest(&big)), big.len() as u64));
            let (free_before, _) = fs.space().unwrap();
            assert!(fs.remove("A/vmlinuz-0123456789abcdef").unwrap());
            assert!(!fs.remove("A/vmlinuz-0123456789abcdef").unwrap());
            let (free_after, _) = fs.space().unwrap();
            assert!(
                free_after >= free_before + big.len() as u64,
                "clusters freed"
            );
            assert_eq!(fs.list("A").unwrap(), []);
            assert!(!fs.exists("A/vmlinuz-0123456789abcdef").unwrap());
        }
    }

    /// A removal cut at any write leaves the file whole or gone, and never
    /// an entry whose clusters another file can take: on FAT16 (a fixed
    /// root region, as BOOT) and FAT32 (FSInfo, a root cluster chain), in a
    /// directory of several clusters.
    #[test]
    fn removal_is_crash_safe_at_every_write() {
        crate::device::each_loss(|_| removal_is_crash_safe_at_every_write_under_loss());
    }

    fn removal_is_crash_safe_at_every_write_under_loss() {
        for (kind, dev) in [
            ("FAT16", blank(512, 40 << 20)),
            ("FAT32", crate::testutil::fat32_volume()),
        ] {
            let mut base = BootFs::new(dev, 0);
            base.ensure_dir("loader").unwrap();
            // Enough entries that the directory spans several clusters.
            for i in 0..40 {
                let name = format!("loader/filler-with-a-long-name-{i:02}.conf");
                base.create(&name, &mut &b"x"[..], 1).unwrap();
            }
            let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
            base.create(
                "loader/a-long-file-name.conf",
                &mut &data[..],
                data.len() as u64,
            )
            .unwrap();
            let image = base.into_inner().into_inner();
            let mut total = Faulty::counting(Cursor::new(image.clone()));
            BootFs::new(&mut total, 0)
                .remove("loader/a-long-file-name.conf")
                .unwrap();
            assert!(total.writes() >= 3, "{kind}");
            for n in 1..=total.writes() {
                let mut dev = Faulty::failing_at(Cursor::new(image.clone()), n);
                assert!(
                    BootFs::new(&mut dev, 0)
                        .remove("loader/a-long-file-name.conf")
                        .is_err()
                );
                // fsck.fat repairs by itself what a cut leaves (an orphaned
                // long-name part), and finds nothing it will not correct.
                let cut = dev.into_inner();
                let said = crate::testutil::fsck(cut.get_ref());
                assert!(
                    !said.contains("Not auto-correcting") && !said.contains("outside a LFN"),
                    "{kind}: cut {n}: fsck.fat says:\n{said}"
                );
                let mut fs = BootFs::new(cut, 0);
                let present = fs.exists("loader/a-long-file-name.conf").unwrap();
                assert_eq!(
                    present,
                    n == 1,
                    "{kind}: cut {n}: gone after its short entry"
                );
                assert_eq!(fs.list("loader").unwrap().len(), 40 + usize::from(present));
                // A new file never shares clusters with a visible one.
                let other = vec![1u8; 300_000];
                fs.create("loader/new", &mut &other[..], other.len() as u64)
                    .unwrap();
                assert_eq!(
                    fs.hash("loader/new").unwrap().0,
                    hex(&Sha256::digest(&other)),
                    "{kind}: cut {n}"
                );
                if present {
                    assert_eq!(
                        fs.hash("loader/a-long-file-name.conf").unwrap().0,
                        hex(&Sha256::digest(&data))
                    );
                }
            }
        }
    }

    /// A creation cut at any write, losing what each pattern loses of the
    /// writes since the last sync, leaves no file, an empty one, or the
    /// whole file, never a file of the right length with other bytes: the
    /// data is synced before the entry that gives its length
    /// ([`crate::gather`]). On FAT16 and FAT32, in a directory that grows
    /// for the new entry and in the root.
    #[test]
    fn a_creation_cut_at_any_write_leaves_no_file_an_empty_one_or_the_whole() {
        crate::device::each_loss(|loss| {
            for (kind, dev) in [
                ("FAT16", blank(512, 40 << 20)),
                ("FAT32", crate::testutil::fat32_volume()),
            ] {
                let mut base = BootFs::new(dev, 0);
                base.ensure_dir("loader").unwrap();
                for i in 0..15 {
                    let name = format!("loader/filler-with-a-long-name-{i:02}.conf");
                    base.create(&name, &mut &b"x"[..], 1).unwrap();
                }
                let image = base.into_inner().into_inner();
                let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8 + 1).collect();
                for path in ["loader/a-new-file-with-a-long-name.conf", "new.efi"] {
                    let mut total = Faulty::counting(Cursor::new(image.clone()));
                    BootFs::new(&mut total, 0)
                        .create(path, &mut &data[..], data.len() as u64)
                        .unwrap();
                    let mut saw_whole = false;
                    for n in 1..=total.writes() {
                        let mut dev = Faulty::failing_at(Cursor::new(image.clone()), n);
                        assert!(
                            BootFs::new(&mut dev, 0)
                                .create(path, &mut &data[..], data.len() as u64)
                                .is_err()
                        );
                        let mut fs = BootFs::new(dev.into_inner(), 0);
                        let at = format!("{kind} {path} {loss:?}: cut {n}");
                        fs.scan().unwrap_or_else(|e| panic!("{at}: {e:#}"));
                        if fs.exists(path).unwrap() {
                            let (sha, len) = fs.hash(path).unwrap();
                            if len > 0 {
                                assert_eq!(
                                    (sha, len),
                                    (hex(&Sha256::digest(&data)), data.len() as u64),
                                    "{at}: a file of its length with other bytes"
                                );
                                saw_whole = true;
                            }
                        }
                        // The next creation of it completes (after a removal
                        // of what the cut left).
                        fs.remove(path).unwrap();
                        fs.reclaim().unwrap();
                        fs.create(path, &mut &data[..], data.len() as u64)
                            .unwrap_or_else(|e| panic!("{at}: {e:#}"));
                    }
                    // Without loss, the cut at the sync that ends it leaves
                    // it whole.
                    assert!(
                        saw_whole || loss != crate::device::Loss::None,
                        "{kind} {path}"
                    );
                }
            }
        });
    }

    /// A replacement cut at any write leaves the file whole, old or new
    /// (new from the switch on), on FAT16 and FAT32; the next replacement
    /// (which finishes a cut one first) completes, and fsck.fat then finds
    /// the volume clean: no shared clusters, nothing lost.
    #[test]
    fn replacement_is_crash_safe_at_every_write() {
        crate::device::each_loss(|_| replacement_is_crash_safe_at_every_write_under_loss());
    }

    fn replacement_is_crash_safe_at_every_write_under_loss() {
        let path = "EFI/BOOT/BOOTX64.EFI";
        assert_eq!(replacement(path), "EFI/BOOT/BOOTX64.NEW");
        assert_eq!(replacement("loader.conf"), "loader.NEW");
        let old: Vec<u8> = (0..12_000u32).map(|i| (i % 253) as u8).collect();
        let new: Vec<u8> = (0..30_000u32).map(|i| (i % 241) as u8).collect();
        let sha = |b: &[u8]| hex(&Sha256::digest(b));
        for (kind, dev) in [
            ("FAT16", blank(512, 40 << 20)),
            ("FAT32", crate::testutil::fat32_volume()),
        ] {
            let mut base = BootFs::new(dev, 0);
            base.ensure_dir("EFI").unwrap();
            base.ensure_dir("EFI/BOOT").unwrap();
            base.create(path, &mut &old[..], old.len() as u64).unwrap();
            let image = base.into_inner().into_inner();
            let mut total = Faulty::counting(Cursor::new(image.clone()));
            BootFs::new(&mut total, 0)
                .replace(path, &mut &new[..], new.len() as u64, &sha(&new))
                .unwrap();
            let writes = total.writes();
            assert!(writes > 4, "{kind}: {writes} writes");
            // Bytes that do not read back as asked never take its place.
            let mut fs = BootFs::new(Cursor::new(image.clone()), 0);
            let e = fs
                .replace(path, &mut &new[..], new.len() as u64, &sha(&old))
                .unwrap_err();
            assert!(format!("{e:#}").contains("is as it was"), "{e:#}");
            assert_eq!(fs.hash(path).unwrap().0, sha(&old), "{kind}");
            assert!(!fs.exists(&replacement(path)).unwrap(), "{kind}");
            let said = crate::testutil::fsck(fs.into_inner().get_ref());
            for bad in ["share", "Reclaimed", "Free cluster summary wrong"] {
                assert!(!said.contains(bad), "{kind}: fsck.fat says:\n{said}");
            }
            let mut saw_new_at = None;
            for n in 1..=writes {
                let mut dev = Faulty::failing_at(Cursor::new(image.clone()), n);
                assert!(
                    BootFs::new(&mut dev, 0)
                        .replace(path, &mut &new[..], new.len() as u64, &sha(&new))
                        .is_err(),
                    "{kind}: cut {n}"
                );
                let cut = dev.into_inner();
                // What firmware reads: the file whole, old or new, through
                // its own FAT code (fatfs, not ours).
                let mut c = cut.clone();
                c.set_position(0);
                let fs = fatfs::FileSystem::new(&mut c, fatfs::FsOptions::new()).unwrap();
                let mut got = Vec::new();
                std::io::Read::read_to_end(&mut fs.root_dir().open_file(path).unwrap(), &mut got)
                    .unwrap();
                drop(fs);
                if got == new {
                    saw_new_at.get_or_insert(n);
                } else {
                    assert!(got == old, "{kind}: cut {n}: neither old nor new");
                    assert!(saw_new_at.is_none(), "{kind}: cut {n}: old after new");
                }
                // The next replacement finishes the cut one and completes.
                let mut fs = BootFs::new(cut, 0);
                fs.replace(path, &mut &new[..], new.len() as u64, &sha(&new))
                    .unwrap_or_else(|e| panic!("{kind}: cut {n}: {e:#}"));
                assert_eq!(fs.hash(path).unwrap().0, sha(&new), "{kind}: cut {n}");
                assert!(!fs.exists(&replacement(path)).unwrap(), "{kind}: cut {n}");
                let said = crate::testutil::fsck(fs.into_inner().get_ref());
                for bad in ["share", "Reclaimed", "Not auto-correcting", "outside a LFN"] {
                    assert!(
                        !said.contains(bad),
                        "{kind}: cut {n}: fsck.fat says:\n{said}"
                    );
                }
            }
            assert!(saw_new_at.is_some(), "{kind}: no cut read the new file");
        }
    }
}
