//! STATE and EPHEMERAL: found on META's disk, EPHEMERAL grown to the end of
//! a disk larger than the image, formatted XFS on first boot, mounted
//! (EPHEMERAL at /var, STATE at /system/state), the EPHEMERAL filesystem
//! grown to its partition, the persistent /etc overlays laid, and one line
//! appended to the boot log.
//!
//! Formatting runs the shipped `mkfs.xfs` (a `host` program of the root
//! filesystem); growing the filesystem uses the XFS_IOC_FSGROWFSDATA ioctl
//! directly, so no xfs_growfs is shipped.

use crate::console::say;
use crate::mount;
use crate::partitions::{self, Partition};
use crate::sys::{self, check};
use anyhow::{Context, Result, bail};
use contract::Slot;
use contract::le::{read_u32, read_u64};
use contract::partition::PartitionRole;
use contract::paths::{
    BOOT_LOG, EPHEMERAL_MOUNT, MKFS_XFS, OVERLAYS_DIR, PERSISTENT_ETC_DIRS, STATE_MOUNT,
    etc_overlay_dirs,
};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::{Duration, Instant};

const DEVICE_TIMEOUT: Duration = Duration::from_secs(10);
const DEVICE_POLL: Duration = Duration::from_millis(20);
/// The XFS superblock magic at offset 0 of the filesystem.
const XFS_MAGIC: &[u8; 4] = b"XFSB";
const NOSUID_NODEV: libc::c_ulong = libc::MS_NOSUID | libc::MS_NODEV;

// ioctls: <linux/blkpg.h>, <xfs/xfs_fs.h>.
const BLKPG: libc::c_ulong = 0x1269;
const BLKPG_RESIZE_PARTITION: libc::c_int = 3;
/// _IOR('X', 126, struct xfs_fsop_geom), 256 bytes.
const XFS_IOC_FSGEOMETRY: libc::c_ulong = 0x8100_587e;
/// _IOW('X', 110, struct xfs_growfs_data), 16 bytes.
const XFS_IOC_FSGROWFSDATA: libc::c_ulong = 0x4010_586e;

#[repr(C)]
struct BlkpgPartition {
    start: libc::c_longlong,
    length: libc::c_longlong,
    pno: libc::c_int,
    devname: [libc::c_char; 64],
    volname: [libc::c_char; 64],
}

#[repr(C)]
struct BlkpgIoctlArg {
    op: libc::c_int,
    flags: libc::c_int,
    datalen: libc::c_int,
    data: *mut libc::c_void,
}

#[repr(C)]
struct XfsGrowfsData {
    newblocks: u64,
    imaxpct: u32,
}

/// Whether a partition was formatted this boot or already held XFS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Made {
    Made,
    Kept,
}

impl Made {
    pub fn name(self) -> &'static str {
        match self {
            Made::Made => "made",
            Made::Kept => "kept",
        }
    }
}

/// The one console line of the storage step.
pub fn report_line(
    state: Made,
    ephemeral: Made,
    ephemeral_bytes: u64,
    boot: u64,
    first_version: &str,
) -> String {
    format!(
        "storage STATE={} EPHEMERAL={} ephemeral-bytes={ephemeral_bytes} boot={boot} first-version={first_version}",
        state.name(),
        ephemeral.name()
    )
}

/// Does it all; see the module documentation. `meta` is the META partition
/// stage 2 chose: STATE and EPHEMERAL are taken from its disk, never from
/// another disk that also carries our labels.
/// `wipe_ephemeral`: format EPHEMERAL afresh whatever it holds (META's
/// `wipe-ephemeral`, an upgrade's `--preserve=false`).
pub fn setup(meta: &Partition, slot: Slot, version: &str, wipe_ephemeral: bool) -> Result<()> {
    let (disk, state, ephemeral) = wait_for_partitions(meta)?;
    settle_table(&disk, &ephemeral)
        .with_context(|| format!("the partition table of /dev/{disk}"))?;
    let state_dev = format!("/dev/{}", state.name);
    let eph_dev = format!("/dev/{}", ephemeral.name);
    let state_made = format_if_blank(&state_dev, PartitionRole::State.label())?;
    let eph_made = if wipe_ephemeral {
        say(format!(
            "stage2: wiping EPHEMERAL ({eph_dev}) as the last upgrade asked (--preserve=false)"
        ));
        format(&eph_dev, PartitionRole::Ephemeral.label())?
    } else {
        format_if_blank(&eph_dev, PartitionRole::Ephemeral.label())?
    };

    mount::mount(
        Some(&eph_dev),
        EPHEMERAL_MOUNT,
        Some("xfs"),
        NOSUID_NODEV,
        None,
    )
    .context("mount EPHEMERAL")?;
    let eph_bytes = partition_bytes(&ephemeral.name)?;
    grow_xfs(EPHEMERAL_MOUNT, eph_bytes)
        .with_context(|| format!("grow the XFS filesystem on {EPHEMERAL_MOUNT}"))?;
    sys::mkdir_all(Path::new(STATE_MOUNT), 0o700)?;
    mount::mount(
        Some(&state_dev),
        STATE_MOUNT,
        Some("xfs"),
        NOSUID_NODEV | libc::MS_NOEXEC,
        None,
    )
    .context("mount STATE")?;
    overlays()?;
    // The boot log is a record, not a check: a log the runtime cannot use
    // (/var is the workloads') is reported and does not stop the boot.
    let (boot, first_version) = match log_boot(Path::new(BOOT_LOG), slot, version) {
        Ok(v) => v,
        Err(e) => {
            say(format!("stage2: warning: boot log not written: {e:#}"));
            (0, "unknown".to_string())
        }
    };
    say(report_line(
        state_made,
        eph_made,
        eph_bytes,
        boot,
        &first_version,
    ));
    Ok(())
}

/// STATE and EPHEMERAL on META's disk, with their device nodes.
fn wait_for_partitions(meta: &Partition) -> Result<(String, Partition, Partition)> {
    let start = Instant::now();
    loop {
        let all = partitions::scan(Path::new("/sys"))?;
        if let Some(disk) = meta.disk.clone() {
            let on_disk = partitions::on_disk_of(&all, meta);
            let get = |role: PartitionRole| {
                on_disk
                    .iter()
                    .find(|p| p.label == role.label())
                    .map(|p| (*p).clone())
            };
            if let (Some(s), Some(e)) = (get(PartitionRole::State), get(PartitionRole::Ephemeral))
                && s.dev_path(Path::new("/dev")).exists()
                && e.dev_path(Path::new("/dev")).exists()
            {
                return Ok((disk, s, e));
            }
        }
        if start.elapsed() >= DEVICE_TIMEOUT {
            bail!(
                "no STATE and EPHEMERAL partitions on META's disk after {:.1}s",
                DEVICE_TIMEOUT.as_secs_f64()
            );
        }
        std::thread::sleep(DEVICE_POLL);
    }
}

fn read_sys(path: &str) -> Result<u64> {
    let text = std::fs::read_to_string(path).with_context(|| format!("read {path}"))?;
    text.trim()
        .parse()
        .with_context(|| format!("parse {path} ({:?})", text.trim()))
}

/// A block device's size in bytes (sysfs counts 512-byte sectors).
fn partition_bytes(name: &str) -> Result<u64> {
    Ok(read_sys(&format!("/sys/class/block/{name}/size"))? * 512)
}

/// The partition table at every boot, under the installer's lock:
/// EPHEMERAL grows to the disk's end (with the backup table); then a disk
/// that still carries the image's own GUIDs (written from a built image as
/// it is, `dd`) gets its own ([`contract::guid`]; a cut during the change
/// leaves the old GUIDs or the new ones, and this boot or the next finishes
/// it, `bootstate::gpt::reidentify`).
fn settle_table(disk: &str, ephemeral: &Partition) -> Result<()> {
    let sector = read_sys(&format!("/sys/class/block/{disk}/queue/logical_block_size"))?;
    let disk_bytes = read_sys(&format!("/sys/class/block/{disk}/size"))? * 512;
    let pno = read_sys(&format!("/sys/class/block/{}/partition", ephemeral.name))?;
    let path = format!("/dev/{disk}");
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .with_context(|| format!("open {path}"))?;
    // The installer's lock (bootstate::disk): no upgrade writes meanwhile.
    sys::lock(&f, Path::new(&path))?;
    // The grow first: it puts the backup table at the disk's end, where
    // firmware and Linux look for it when a cut during the GUID change
    // leaves the primary's entries failing their CRC (the image's backup
    // is at the image's end, not the disk's).
    let grown =
        bootstate::gpt::grow_last(&mut f, disk_bytes, sector, PartitionRole::Ephemeral.label())?;
    let table = bootstate::gpt::read_at(&mut f, disk_bytes, sector)?;
    if contract::guid::is_derived(table.disk_guid) {
        let own = contract::guid::installed(sys::random()?);
        bootstate::gpt::reidentify(&mut f, disk_bytes, sector, own)
            .context("give it GUIDs of its own")?;
        say(format!(
            "storage: {path} carried the image's own GUIDs (disk {}); it has its own now: disk \
             {own}, its partitions' derived from it",
            table.disk_guid
        ));
    }
    let Some(g) = grown else {
        return Ok(());
    };
    if g.index as u64 + 1 != pno {
        bail!(
            "EPHEMERAL is GPT entry {} but the kernel calls {} partition {pno}",
            g.index + 1,
            ephemeral.name
        );
    }
    let mut part = BlkpgPartition {
        start: (g.first_lba * sector) as libc::c_longlong,
        length: ((g.new_last_lba + 1 - g.first_lba) * sector) as libc::c_longlong,
        pno: pno as libc::c_int,
        devname: [0; 64],
        volname: [0; 64],
    };
    let mut arg = BlkpgIoctlArg {
        op: BLKPG_RESIZE_PARTITION,
        flags: 0,
        datalen: std::mem::size_of::<BlkpgPartition>() as libc::c_int,
        data: (&mut part as *mut BlkpgPartition).cast(),
    };
    // SAFETY: arg and the partition it points to are valid for the call.
    check(
        unsafe { libc::ioctl(f.as_raw_fd(), BLKPG, &mut arg as *mut BlkpgIoctlArg) },
        || format!("BLKPG_RESIZE_PARTITION {} on {path}", ephemeral.name),
    )?;
    say(format!(
        "stage2: grew EPHEMERAL {} from {} to {} bytes (disk {disk_bytes} bytes)",
        ephemeral.name,
        (g.old_last_lba + 1 - g.first_lba) * sector,
        (g.new_last_lba + 1 - g.first_lba) * sector
    ));
    Ok(())
}

/// What the first sector of a partition holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Content {
    /// An XFS superblock of a finished filesystem.
    Xfs,
    /// An XFS superblock whose mkfs never finished (`sb_inprogress` set):
    /// ours, cut short; it cannot be mounted and is made again.
    XfsUnfinished,
    /// Zeros: never formatted (or wiped by the installer).
    Blank,
    /// Anything else: data of some other kind, which is never formatted.
    Other,
}

/// Classifies the first sector of a partition.
pub fn probe(first_sector: &[u8]) -> Content {
    const SB_INPROGRESS: usize = 126;
    if first_sector.starts_with(XFS_MAGIC) {
        if first_sector.get(SB_INPROGRESS).is_some_and(|b| *b != 0) {
            Content::XfsUnfinished
        } else {
            Content::Xfs
        }
    } else if first_sector.iter().all(|b| *b == 0) {
        Content::Blank
    } else {
        Content::Other
    }
}

/// What the first sector of the partition `dev` holds.
pub fn content_of(dev: &str) -> Result<Content> {
    let mut sector = [0u8; 512];
    std::fs::File::open(dev)
        .and_then(|mut f| f.read_exact(&mut sector))
        .with_context(|| format!("read the first block of {dev}"))?;
    Ok(probe(&sector))
}

/// Runs mkfs.xfs on `dev` when it is blank (or holds our own unfinished
/// mkfs); keeps an XFS filesystem; refuses anything else, which may be
/// someone's data.
fn format_if_blank(dev: &str, label: &str) -> Result<Made> {
    match content_of(dev)? {
        Content::Xfs => return Ok(Made::Kept),
        Content::Blank | Content::XfsUnfinished => {}
        Content::Other => {
            bail!(
                "{label} ({dev}) holds data that is not an XFS filesystem: refusing to \
                 format it; to let the runtime make {label} afresh, zero its first MiB \
                 (imager install does)"
            );
        }
    }
    format(dev, label)
}

/// Makes a new XFS filesystem labelled `label` on `dev`, whatever it held.
fn format(dev: &str, label: &str) -> Result<Made> {
    let started = Instant::now();
    let out = std::process::Command::new(MKFS_XFS)
        .args(["-f", "-K", "-L", label, dev])
        .env_clear()
        // xfsprogs refuses filesystems under 300 MiB (STATE is 100 MiB)
        // except under its test suite's variables, which Talos sets too.
        .env("TEST_DIR", "1")
        .env("TEST_DEV", "1")
        .env("QA_CHECK_FS", "1")
        .output()
        .with_context(|| format!("run {MKFS_XFS} for {label} on {dev}"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        bail!(
            "{MKFS_XFS} -L {label} {dev} failed ({}): {}",
            out.status,
            err.trim().replace('\n', " | ")
        );
    }
    if content_of(dev)? != Content::Xfs {
        bail!("{MKFS_XFS} succeeded but {dev} has no finished XFS superblock");
    }
    say(format!(
        "stage2: formatted {label} ({dev}) as XFS in {:.1}s",
        started.elapsed().as_secs_f64()
    ));
    Ok(Made::Made)
}

/// Grows the XFS filesystem mounted at `mount_point` to `bytes` when it is
/// smaller (XFS_IOC_FSGROWFSDATA, as xfs_growfs does).
fn grow_xfs(mount_point: &str, bytes: u64) -> Result<()> {
    let f = std::fs::File::open(mount_point).with_context(|| format!("open {mount_point}"))?;
    let mut geom = [0u8; 256];
    // SAFETY: geom is 256 bytes, the size the ioctl number encodes.
    check(
        unsafe { libc::ioctl(f.as_raw_fd(), XFS_IOC_FSGEOMETRY, geom.as_mut_ptr()) },
        || "XFS_IOC_FSGEOMETRY",
    )?;
    let field = |v: Option<u64>| v.context("XFS geometry is shorter than expected");
    let blocksize = field(read_u32(&geom, 0).map(u64::from))?;
    let imaxpct = field(read_u32(&geom, 28).map(u64::from))? as u32;
    let datablocks = field(read_u64(&geom, 32))?;
    if blocksize == 0 {
        bail!("XFS reports a block size of 0");
    }
    let want = bytes / blocksize;
    if want <= datablocks {
        return Ok(());
    }
    let mut arg = XfsGrowfsData {
        newblocks: want,
        imaxpct,
    };
    // SAFETY: arg is a valid xfs_growfs_data for the call.
    check(
        unsafe {
            libc::ioctl(
                f.as_raw_fd(),
                XFS_IOC_FSGROWFSDATA,
                &mut arg as *mut XfsGrowfsData,
            )
        },
        || format!("XFS_IOC_FSGROWFSDATA to {want} blocks"),
    )?;
    say(format!(
        "stage2: grew the XFS filesystem on {mount_point} from {} to {} bytes",
        datablocks * blocksize,
        want * blocksize
    ));
    Ok(())
}

/// overlayfs on each persistent /etc directory, its upper and work
/// directories on EPHEMERAL.
fn overlays() -> Result<()> {
    sys::mkdir_all(Path::new(OVERLAYS_DIR), 0o700)?;
    for name in PERSISTENT_ETC_DIRS {
        let (upper, work) = etc_overlay_dirs(name);
        sys::mkdir_all(Path::new(&upper), 0o755)?;
        sys::mkdir_all(Path::new(&work), 0o700)?;
        let target = format!("/etc/{name}");
        let data = format!("lowerdir={target},upperdir={upper},workdir={work}");
        mount::mount(
            Some("overlay"),
            &target,
            Some("overlay"),
            NOSUID_NODEV,
            Some(&data),
        )?;
    }
    Ok(())
}

/// The number of this boot and the version of the first, from the boot log
/// as it was before this boot. Only well-formed lines count
/// (`<n> slot=<A|B> version=<v>`): a line torn by a power cut, or anything
/// else written there, does not.
pub fn parse_boot_log(text: &str) -> (u64, Option<String>) {
    let valid = |l: &&str| {
        let w: Vec<&str> = l.split_whitespace().collect();
        w.len() == 3
            && w[0].parse::<u64>().is_ok()
            && (w[1] == "slot=A" || w[1] == "slot=B")
            && w[2].strip_prefix("version=").is_some_and(|v| !v.is_empty())
    };
    let lines: Vec<&str> = text.lines().filter(valid).collect();
    let first = lines
        .first()
        .and_then(|l| {
            l.split_whitespace()
                .find_map(|w| w.strip_prefix("version="))
        })
        .map(String::from);
    (lines.len() as u64 + 1, first)
}

/// The boot log is read up to this many bytes (it grows by a line a boot).
const BOOT_LOG_LIMIT: u64 = 16 << 20;

/// Appends `<n> slot=<A|B> version=<v>` to the boot log and makes it durable.
/// Returns this boot's number and the first boot's version. The log is
/// opened without following a symbolic link (it lives on /var, which
/// workloads write) and must be a regular file.
fn log_boot(path: &Path, slot: Slot, version: &str) -> Result<(u64, String)> {
    use std::io::Read as _;
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(dir) = path.parent() {
        sys::mkdir_all(dir, 0o755)?;
    }
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .append(true)
        .create(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .mode(0o644)
        .open(path)
        .with_context(|| format!("open {}", path.display()))?;
    let md = f
        .metadata()
        .with_context(|| format!("stat {}", path.display()))?;
    if !md.is_file() {
        bail!("{} is not a regular file", path.display());
    }
    let mut bytes = Vec::new();
    (&mut f)
        .take(BOOT_LOG_LIMIT)
        .read_to_end(&mut bytes)
        .with_context(|| format!("read {}", path.display()))?;
    let text = String::from_utf8_lossy(&bytes);
    let (n, first) = parse_boot_log(&text);
    let first = first.unwrap_or_else(|| version.to_string());
    // A line torn by a power cut is ended, not continued.
    let torn = !bytes.is_empty() && !bytes.ends_with(b"\n");
    let line = format!(
        "{}{n} slot={slot} version={version}\n",
        if torn { "\n" } else { "" }
    );
    f.write_all(line.as_bytes())
        .and_then(|()| f.sync_all())
        .with_context(|| format!("append to {}", path.display()))?;
    if let Some(dir) = path.parent() {
        let _ = std::fs::File::open(dir).and_then(|d| d.sync_all());
    }
    Ok((n, first))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ioctl_structures_have_the_kernel_sizes() {
        assert_eq!(std::mem::size_of::<BlkpgPartition>(), 152);
        assert_eq!(std::mem::size_of::<BlkpgIoctlArg>(), 24);
        assert_eq!(std::mem::size_of::<XfsGrowfsData>(), 16);
        // _IOC(dir, 'X', nr, size)
        let ioc = |dir: u64, nr: u64, size: u64| (dir << 30) | (size << 16) | (0x58 << 8) | nr;
        assert_eq!(XFS_IOC_FSGEOMETRY, ioc(2, 126, 256));
        assert_eq!(XFS_IOC_FSGROWFSDATA, ioc(1, 110, 16));
    }

    #[test]
    fn boot_log_counts_boots_and_remembers_the_first_version() {
        assert_eq!(parse_boot_log(""), (1, None));
        assert_eq!(
            parse_boot_log("1 slot=A version=0.1.0\n2 slot=B version=0.2.0\n"),
            (3, Some("0.1.0".into()))
        );
        let dir = crate::partitions::tests::tempdir("bootlog");
        let log = dir.join("log/machined/boots");
        assert_eq!(log_boot(&log, Slot::A, "1.0").unwrap(), (1, "1.0".into()));
        assert_eq!(log_boot(&log, Slot::B, "2.0").unwrap(), (2, "1.0".into()));
        assert_eq!(
            std::fs::read_to_string(&log).unwrap(),
            "1 slot=A version=1.0\n2 slot=B version=2.0\n"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn report_line_format() {
        assert_eq!(
            report_line(Made::Made, Made::Kept, 1 << 30, 2, "0.1.0"),
            "storage STATE=made EPHEMERAL=kept ephemeral-bytes=1073741824 boot=2 first-version=0.1.0"
        );
    }

    #[test]
    fn first_sectors_are_classified() {
        let mut xfs = vec![0u8; 512];
        xfs[..4].copy_from_slice(b"XFSB");
        assert_eq!(probe(&xfs), Content::Xfs);
        xfs[126] = 1; // sb_inprogress: mkfs did not finish
        assert_eq!(probe(&xfs), Content::XfsUnfinished);
        assert_eq!(probe(&[0u8; 512]), Content::Blank);
        let mut ext4 = vec![0u8; 512];
        ext4[56] = 0x53;
        assert_eq!(probe(&ext4), Content::Other);
        let dir = crate::partitions::tests::tempdir("xfsmagic");
        let f = dir.join("p");
        std::fs::write(&f, vec![0u8; 4096]).unwrap();
        assert_eq!(content_of(f.to_str().unwrap()).unwrap(), Content::Blank);
        std::fs::write(&f, &xfs).unwrap();
        assert_eq!(
            content_of(f.to_str().unwrap()).unwrap(),
            Content::XfsUnfinished
        );
        // Someone's data is never formatted.
        std::fs::write(&f, &ext4).unwrap();
        let e = format_if_blank(f.to_str().unwrap(), "STATE").unwrap_err();
        assert!(format!("{e:#}").contains("refusing to format it"), "{e:#}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_torn_or_foreign_boot_log_line_does_not_count() {
        assert_eq!(
            parse_boot_log("1 slot=A version=0.1.0\n2 slot=B ver"),
            (2, Some("0.1.0".into()))
        );
        assert_eq!(parse_boot_log("junk\n\u{fffd}\n"), (1, None));
        let dir = crate::partitions::tests::tempdir("bootlog-torn");
        let log = dir.join("boots");
        std::fs::write(&log, b"1 slot=A version=1.0\n2 slot=A ve\xff").unwrap();
        assert_eq!(log_boot(&log, Slot::B, "2.0").unwrap(), (2, "1.0".into()));
        assert!(
            std::fs::read(&log)
                .unwrap()
                .ends_with(b"ve\xff\n2 slot=B version=2.0\n")
        );
        // Not through a symbolic link.
        let link = dir.join("link");
        std::os::unix::fs::symlink(&log, &link).unwrap();
        assert!(log_boot(&link, Slot::A, "1.0").is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
