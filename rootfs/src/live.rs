//! The live system (`machined.live=<ID>`, booted from the ISO) and its
//! install onto a disk (`machined.install=<TARGET>`): finding the disk the
//! target names from sysfs (there is no udev), waiting for it, refusing
//! partitions, read-only disks, the boot medium itself and (without
//! `machined.install.wipe=1`) a disk that holds data, then running the
//! installer (the static `imager` carried in the initramfs's `live/`).
//!
//! Everything that reads sysfs or /dev takes their roots as arguments, so
//! that the tests run on a fake tree.

use anyhow::{Context, Result, bail};
use contract::cmdline::{self, BY_ID_DIR, InstallTarget};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Moves the directory tree `src` to `dst` (created) across filesystems:
/// each file is copied, then removed from `src`, so that the memory needed
/// (both are in RAM) is the tree plus one file, not twice the tree. Every
/// file's and directory's mode is kept, symbolic links stay links;
/// anything else (device nodes, FIFOs) is refused. Returns the bytes of
/// file data moved.
pub fn move_tree(src: &Path, dst: &Path) -> Result<u64> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::symlink_metadata(src).with_context(|| format!("{}", src.display()))?;
    if !meta.is_dir() {
        bail!("{} is not a directory", src.display());
    }
    let mode = meta.permissions().mode() & 0o7777;
    crate::sys::mkdir_all(dst, 0o755)?;
    let mut bytes = 0;
    let mut entries: Vec<_> = std::fs::read_dir(src)
        .with_context(|| format!("read {}", src.display()))?
        .collect::<std::io::Result<_>>()
        .with_context(|| format!("read {}", src.display()))?;
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let (from, to) = (e.path(), dst.join(e.file_name()));
        let t = e
            .file_type()
            .with_context(|| format!("{}", from.display()))?;
        if t.is_dir() {
            bytes += move_tree(&from, &to)?;
        } else if t.is_symlink() {
            let target =
                std::fs::read_link(&from).with_context(|| format!("{}", from.display()))?;
            std::os::unix::fs::symlink(&target, &to)
                .with_context(|| format!("symlink {}", to.display()))?;
            std::fs::remove_file(&from).with_context(|| format!("remove {}", from.display()))?;
        } else if t.is_file() {
            // std::fs::copy keeps the permission bits.
            bytes += std::fs::copy(&from, &to)
                .with_context(|| format!("copy {} to {}", from.display(), to.display()))?;
            std::fs::remove_file(&from).with_context(|| format!("remove {}", from.display()))?;
        } else {
            bail!(
                "{} is neither a file, a directory nor a link",
                from.display()
            );
        }
    }
    std::fs::set_permissions(dst, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("chmod {}", dst.display()))?;
    Ok(bytes)
}

/// What sysfs says about one whole disk (`<sys>/block/<name>`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DiskInfo {
    /// Kernel name, `vda`.
    pub name: String,
    /// Serial number: `serial` (virtio-blk), `device/serial` (NVMe) or the
    /// SCSI unit serial number page (`device/vpd_pg80`; ATA disks too).
    pub serial: Option<String>,
    /// `wwid` or `device/wwid` as sysfs prints it (`naa.5000c500…`).
    pub wwid: Option<String>,
    /// The names udev would give it in `/dev/disk/by-id`.
    pub by_id: Vec<String>,
    /// `ro` is 1.
    pub read_only: bool,
}

impl DiskInfo {
    /// `serial:S wwn:W` (what is known), to show which disk was meant.
    pub fn ids(&self) -> String {
        let mut v = Vec::new();
        if let Some(s) = &self.serial {
            v.push(format!("serial:{s}"));
        }
        if let Some(w) = &self.wwid {
            v.push(format!("wwn:{w}"));
        }
        if v.is_empty() {
            "no serial".into()
        } else {
            v.join(" ")
        }
    }
}

/// A sysfs attribute, trimmed; `None` when absent, unreadable or empty.
fn attr(dir: &Path, name: &str) -> Option<String> {
    let text = std::fs::read(dir.join(name)).ok()?;
    // Bounded: an attribute is a line; never trust its length.
    let text = String::from_utf8_lossy(&text[..text.len().min(4096)]).into_owned();
    let t = text.trim_matches(|c: char| c.is_whitespace() || c == '\0');
    (!t.is_empty()).then(|| t.to_string())
}

/// udev's whitespace rule for by-id names: leading and trailing whitespace
/// dropped, each run of whitespace one `_`; `/` becomes `_` too.
fn udev_name(s: &str) -> String {
    let mut out = String::new();
    let mut space = false;
    for c in s.trim().chars() {
        if c.is_whitespace() {
            space = true;
            continue;
        }
        if space && !out.is_empty() {
            out.push('_');
        }
        space = false;
        out.push(if c == '/' || c.is_control() { '_' } else { c });
    }
    out
}

/// The serial of a SCSI VPD page 0x80 (Unit Serial Number): bytes 4.. up to
/// the page length.
fn vpd80_serial(page: &[u8]) -> Option<String> {
    if page.len() < 4 || page[1] != 0x80 {
        return None;
    }
    let len = u16::from_be_bytes([page[2], page[3]]) as usize;
    let body = page.get(4..(4 + len).min(page.len()))?;
    let s = String::from_utf8_lossy(body);
    let s = s.trim_matches(|c: char| c.is_whitespace() || c == '\0');
    (!s.is_empty()).then(|| s.to_string())
}

/// A WWN as a by-id name or a `wwn:` target writes it, for comparison:
/// lowercase, without `0x`, `naa.`, `eui.` or `wwn-`.
fn normal_wwn(w: &str) -> String {
    let w = w.trim().to_ascii_lowercase();
    let mut s = w.as_str();
    for p in ["wwn-", "naa.", "eui.", "0x"] {
        s = s.strip_prefix(p).unwrap_or(s);
    }
    s.to_string()
}

/// Reads what sysfs says about the whole disk `name`.
pub fn disk_info(sys: &Path, name: &str) -> DiskInfo {
    let dir = sys.join("block").join(name);
    let dev = dir.join("device");
    let vpd80 = std::fs::read(dev.join("vpd_pg80"))
        .ok()
        .and_then(|p| vpd80_serial(&p[..p.len().min(4096)]));
    let serial = attr(&dir, "serial")
        .or_else(|| attr(&dev, "serial"))
        .or(vpd80);
    let wwid = attr(&dir, "wwid").or_else(|| attr(&dev, "wwid"));
    let vendor = attr(&dev, "vendor");
    let model = attr(&dev, "model");
    let mut by_id = Vec::new();
    if let Some(s) = &serial {
        if name.starts_with("vd") && attr(&dir, "serial").is_some() {
            by_id.push(format!("virtio-{}", udev_name(s)));
        }
        if name.starts_with("nvme")
            && let Some(m) = &model
        {
            by_id.push(format!("nvme-{}_{}", udev_name(m), udev_name(s)));
        }
        if name.starts_with("sd") {
            match (vendor.as_deref(), &model) {
                (Some("ATA"), Some(m)) => {
                    by_id.push(format!("ata-{}_{}", udev_name(m), udev_name(s)));
                }
                (Some(v), Some(m)) => {
                    // scsi_id: a vendor-specific designator prefixed with
                    // its type (0), the vendor and the model.
                    by_id.push(format!("scsi-0{}", udev_name(&format!("{v:<8}{m:<16}{s}"))));
                    by_id.push(format!("scsi-S{}", udev_name(&format!("{v:<8}{m:<16}{s}"))));
                }
                _ => {}
            }
        }
    }
    if let Some(w) = &wwid {
        let lower = w.to_ascii_lowercase();
        if let Some(naa) = lower.strip_prefix("naa.") {
            by_id.push(format!("wwn-0x{naa}"));
            if name.starts_with("sd") {
                by_id.push(format!("scsi-3{naa}"));
            }
        } else if lower.starts_with("eui.") && name.starts_with("nvme") {
            by_id.push(format!("nvme-{lower}"));
        }
    }
    DiskInfo {
        name: name.to_string(),
        serial,
        wwid,
        by_id,
        read_only: attr(&dir, "ro").as_deref() == Some("1"),
    }
}

/// Every whole disk under `<sys>/block`, sorted by name.
pub fn disks(sys: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(sys.join("block"))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// The whole disk holding the partition `name`, when `name` is one
/// (`<sys>/class/block/<name>/partition` exists).
fn partition_of(sys: &Path, name: &str) -> Option<String> {
    let entry = sys.join("class/block").join(name);
    if !entry.join("partition").exists() {
        return None;
    }
    let real = std::fs::canonicalize(&entry).ok()?;
    real.parent()?
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
}

/// What a target names right now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// A whole disk.
    Disk(DiskInfo),
    /// Nothing (yet): the disks seen, for the message.
    Missing(Vec<String>),
}

/// Finds the disk `target` names in sysfs. Errors: a partition, or an
/// identifier that several disks share.
pub fn lookup(sys: &Path, target: &InstallTarget) -> Result<Lookup> {
    let names = disks(sys);
    let partition = |name: &str| -> Result<()> {
        if let Some(disk) = partition_of(sys, name) {
            bail!(
                "{target} is a partition (of /dev/{disk}): an install lays out a whole disk; \
                 name the disk"
            );
        }
        Ok(())
    };
    let matching: Vec<DiskInfo> = match target {
        InstallTarget::Name(n) => {
            partition(n)?;
            names
                .iter()
                .filter(|d| *d == n)
                .map(|d| disk_info(sys, d))
                .collect()
        }
        InstallTarget::Serial(s) => names
            .iter()
            .map(|d| disk_info(sys, d))
            .filter(|i| i.serial.as_deref() == Some(s.as_str()))
            .collect(),
        InstallTarget::Wwn(w) => names
            .iter()
            .map(|d| disk_info(sys, d))
            .filter(|i| i.wwid.as_deref().map(normal_wwn) == Some(normal_wwn(w)))
            .collect(),
        InstallTarget::ById(n) => {
            let infos: Vec<DiskInfo> = names.iter().map(|d| disk_info(sys, d)).collect();
            if let Some((base, num)) = n.rsplit_once("-part")
                && !num.is_empty()
                && num.bytes().all(|b| b.is_ascii_digit())
                && let Some(i) = infos.iter().find(|i| i.by_id.iter().any(|b| b == base))
            {
                bail!(
                    "{target} is a partition (of /dev/{}): an install lays out a whole disk; \
                     name the disk ({BY_ID_DIR}/{base})",
                    i.name
                );
            }
            infos
                .into_iter()
                .filter(|i| i.by_id.iter().any(|b| b == n))
                .collect()
        }
    };
    match matching.as_slice() {
        [] => Ok(Lookup::Missing(names)),
        [one] => Ok(Lookup::Disk(one.clone())),
        many => bail!(
            "{target} names several disks ({}): name one by its kernel name",
            many.iter()
                .map(|i| format!("/dev/{}", i.name))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// Polls until `target` names a whole disk whose device node is in `dev`,
/// or `timeout` passes; refuses a read-only disk.
pub fn wait_for_disk(
    sys: &Path,
    dev: &Path,
    target: &InstallTarget,
    timeout: Duration,
    interval: Duration,
) -> Result<(DiskInfo, PathBuf)> {
    let start = Instant::now();
    loop {
        let seen = match lookup(sys, target)? {
            Lookup::Disk(info) => {
                let node = dev.join(&info.name);
                if node.exists() {
                    if info.read_only {
                        bail!(
                            "{} ({}) is read-only: name a writable disk",
                            node.display(),
                            info.ids()
                        );
                    }
                    return Ok((info, node));
                }
                vec![format!("{} (no {} yet)", info.name, node.display())]
            }
            Lookup::Missing(names) => names,
        };
        if start.elapsed() >= timeout {
            // Loop and RAM devices are never install targets: not listed.
            let described: Vec<String> = seen
                .iter()
                .filter(|n| !n.starts_with("loop") && !n.starts_with("ram"))
                .map(|n| {
                    let i = disk_info(sys, n);
                    if i.serial.is_some() || i.wwid.is_some() {
                        format!("{n} ({})", i.ids())
                    } else {
                        n.clone()
                    }
                })
                .collect();
            bail!(
                "no disk {target} appeared in {:.0} s (disks seen: {})",
                timeout.as_secs_f64(),
                if described.is_empty() {
                    "none".into()
                } else {
                    described.join(", ")
                }
            );
        }
        std::thread::sleep(interval);
    }
}

/// Refuses the boot medium (an ISO 9660 volume whose Volume Set Identifier
/// is `live_id`) and, unless `wipe`, a disk holding data
/// ([`bootstate::blank`]). `shown` names the disk in messages.
pub fn check_target(path: &Path, shown: &str, live_id: &str, wipe: bool) -> Result<()> {
    let mut f = std::fs::File::open(path).with_context(|| format!("open {}", path.display()))?;
    let iso = bootstate::blank::iso_volume_set_id(&mut f)
        .with_context(|| format!("read {}", path.display()))?;
    if iso.is_some_and(|id| id.eq_ignore_ascii_case(live_id)) {
        bail!(
            "refusing {shown}: it is the boot medium (or a copy of it: it holds the ISO this \
             system booted from); name another disk"
        );
    }
    let size = bootstate::gpt::device_size(&mut f)
        .with_context(|| format!("size of {}", path.display()))?;
    if size == 0 {
        bail!("refusing {shown}: it is empty (0 bytes; no medium?)");
    }
    let found = bootstate::blank::find_data(&mut f, size)
        .with_context(|| format!("read {}", path.display()))?;
    if let Some(d) = found {
        if !wipe {
            bail!(
                "refusing {shown}: it holds data: {d}; add {}=1 to the kernel command line \
                 to wipe it and install",
                cmdline::INSTALL_WIPE
            );
        }
        crate::console::say(format!(
            "install: {shown} holds {d}; wiping it ({}=1)",
            cmdline::INSTALL_WIPE
        ));
    }
    Ok(())
}

/// The installer's arguments for an install of `disk`.
pub fn installer_args(
    disk: &Path,
    wipe: bool,
    settings: Option<&contract::settings::Settings>,
) -> Vec<String> {
    let mut v = vec![
        "install".to_string(),
        "--installer".into(),
        contract::paths::live_run_path(contract::paths::LIVE_PAYLOAD_DIR),
        "--disk".into(),
        disk.display().to_string(),
        "--key".into(),
        contract::paths::live_run_path(contract::paths::LIVE_TRUSTED_KEY),
        "--json".into(),
    ];
    if wipe {
        v.push("--wipe".into());
    }
    if let Some(s) = settings {
        if let Some(h) = &s.hostname {
            v.extend(["--hostname".into(), h.clone()]);
        }
        if let Some(n) = &s.net {
            v.extend(["--net".into(), n.value()]);
        }
        if !s.dns.is_empty() {
            let list: Vec<String> = s.dns.iter().map(ToString::to_string).collect();
            v.extend(["--dns".into(), list.join(",")]);
        }
    }
    v
}

/// The `"version"` of the installer's JSON report (the runtime has no JSON
/// parser; the report is `imager`'s pretty-printed `InstallReport`).
pub fn report_version(json: &str) -> Option<String> {
    let rest = &json[json.find("\"version\"")? + "\"version\"".len()..];
    let rest = rest.trim_start().strip_prefix(':')?.trim_start();
    let rest = rest.strip_prefix('"')?;
    let v = &rest[..rest.find('"')?];
    (!v.is_empty() && v.len() < 200).then(|| v.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::partitions::tests::tempdir;
    use std::fs;
    use std::os::unix::fs::symlink;

    /// A fake sysfs: a whole disk `name` with `attrs` (relative paths under
    /// its directory) and partitions `<name>1`, `<name>2`.
    fn add_disk(sys: &Path, name: &str, attrs: &[(&str, &[u8])]) {
        let real = sys
            .join("devices/pci0/")
            .join(name)
            .join("block")
            .join(name);
        fs::create_dir_all(&real).unwrap();
        fs::write(real.join("dev"), "253:0\n").unwrap();
        fs::write(real.join("ro"), "0\n").unwrap();
        for (a, v) in attrs {
            let p = real.join(a);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(p, v).unwrap();
        }
        fs::create_dir_all(sys.join("block")).unwrap();
        fs::create_dir_all(sys.join("class/block")).unwrap();
        symlink(&real, sys.join("block").join(name)).unwrap();
        symlink(&real, sys.join("class/block").join(name)).unwrap();
        for n in 1..=2 {
            let pn = format!(
                "{name}{}{n}",
                if name.starts_with("nvme") { "p" } else { "" }
            );
            let p = real.join(&pn);
            fs::create_dir_all(&p).unwrap();
            fs::write(p.join("partition"), format!("{n}\n")).unwrap();
            symlink(&p, sys.join("class/block").join(&pn)).unwrap();
        }
    }

    fn vpd80(serial: &str) -> Vec<u8> {
        let mut v = vec![0, 0x80, 0, serial.len() as u8];
        v.extend_from_slice(serial.as_bytes());
        v
    }

    fn fake(root: &Path) -> PathBuf {
        let sys = root.join("sys");
        add_disk(&sys, "vda", &[("serial", b"live-iso\n")]);
        add_disk(&sys, "vdb", &[("serial", b"target-1\n")]);
        let pg80 = vpd80("QM00005");
        add_disk(
            &sys,
            "sda",
            &[
                ("device/vendor", b"ATA     \n"),
                ("device/model", b"QEMU HARDDISK   \n"),
                ("device/vpd_pg80", &pg80),
                ("device/wwid", b"naa.5000c500a1b2c3d4\n"),
            ],
        );
        let pg80 = vpd80("drive-scsi0");
        add_disk(
            &sys,
            "sdb",
            &[
                ("device/vendor", b"QEMU    \n"),
                ("device/model", b"QEMU HARDDISK   \n"),
                ("device/vpd_pg80", &pg80),
            ],
        );
        add_disk(
            &sys,
            "nvme0n1",
            &[
                ("device/serial", b"NV-77   \n"),
                ("device/model", b"QEMU NVMe Ctrl\n"),
                ("wwid", b"eui.0011223344556677\n"),
            ],
        );
        add_disk(&sys, "vdc", &[("serial", b"read-only\n")]);
        fs::write(sys.join("block/vdc/ro"), "1\n").unwrap();
        sys
    }

    fn name_of(sys: &Path, target: &str) -> String {
        let t = cmdline::parse_install_target(target).unwrap();
        match lookup(sys, &t).unwrap() {
            Lookup::Disk(i) => i.name,
            Lookup::Missing(seen) => panic!("{target}: missing, seen {seen:?}"),
        }
    }

    #[test]
    fn every_identifier_form_finds_its_disk() {
        let root = tempdir("live-ids");
        let sys = fake(&root);
        for (target, want) in [
            ("vdb", "vdb"),
            ("/dev/vdb", "vdb"),
            ("nvme0n1", "nvme0n1"),
            ("serial:target-1", "vdb"),
            ("serial:QM00005", "sda"),
            ("serial:NV-77", "nvme0n1"),
            ("wwn:0x5000c500a1b2c3d4", "sda"),
            ("wwn:naa.5000C500A1B2C3D4", "sda"),
            ("wwn:eui.0011223344556677", "nvme0n1"),
            ("/dev/disk/by-id/virtio-target-1", "vdb"),
            ("/dev/disk/by-id/ata-QEMU_HARDDISK_QM00005", "sda"),
            ("/dev/disk/by-id/wwn-0x5000c500a1b2c3d4", "sda"),
            ("/dev/disk/by-id/scsi-35000c500a1b2c3d4", "sda"),
            (
                "/dev/disk/by-id/scsi-0QEMU_QEMU_HARDDISK_drive-scsi0",
                "sdb",
            ),
            ("/dev/disk/by-id/nvme-QEMU_NVMe_Ctrl_NV-77", "nvme0n1"),
            ("/dev/disk/by-id/nvme-eui.0011223344556677", "nvme0n1"),
        ] {
            assert_eq!(name_of(&sys, target), want, "{target}");
        }
        let info = disk_info(&sys, "sda");
        assert_eq!(info.ids(), "serial:QM00005 wwn:naa.5000c500a1b2c3d4");
        for missing in [
            "vdz",
            "serial:nope",
            "wwn:0x1",
            "/dev/disk/by-id/virtio-nope",
        ] {
            let t = cmdline::parse_install_target(missing).unwrap();
            assert!(
                matches!(lookup(&sys, &t).unwrap(), Lookup::Missing(ref s) if s.len() == 6),
                "{missing}"
            );
        }
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn partitions_shared_ids_and_read_only_disks_are_refused() {
        let root = tempdir("live-refuse");
        let sys = fake(&root);
        for (target, disk) in [
            ("vdb1", "vdb"),
            ("/dev/nvme0n1p2", "nvme0n1"),
            ("/dev/disk/by-id/virtio-target-1-part1", "vdb"),
        ] {
            let t = cmdline::parse_install_target(target).unwrap();
            let e = format!("{:#}", lookup(&sys, &t).unwrap_err());
            assert!(
                e.contains("is a partition") && e.contains(&format!("of /dev/{disk}")),
                "{e}"
            );
        }
        add_disk(&sys, "vdd", &[("serial", b"target-1\n")]);
        let t = cmdline::parse_install_target("serial:target-1").unwrap();
        let e = format!("{:#}", lookup(&sys, &t).unwrap_err());
        assert!(e.contains("/dev/vdb, /dev/vdd"), "{e}");

        let dev = root.join("dev");
        fs::create_dir_all(&dev).unwrap();
        let (short, tick) = (Duration::from_millis(30), Duration::from_millis(5));
        let t = cmdline::parse_install_target("vdc").unwrap();
        // No device node yet: waited for, then a timeout naming the disks.
        let e = format!(
            "{:#}",
            wait_for_disk(&sys, &dev, &t, short, tick).unwrap_err()
        );
        assert!(
            e.contains("no disk /dev/vdc appeared") && e.contains("vdc (no"),
            "{e}"
        );
        fs::write(dev.join("vdc"), "").unwrap();
        let e = format!(
            "{:#}",
            wait_for_disk(&sys, &dev, &t, short, tick).unwrap_err()
        );
        assert!(e.contains("read-only"), "{e}");
        let t = cmdline::parse_install_target("serial:late").unwrap();
        let e = format!(
            "{:#}",
            wait_for_disk(&sys, &dev, &t, short, tick).unwrap_err()
        );
        assert!(e.contains("vdb (serial:target-1)"), "{e}");
        fs::write(dev.join("vdb"), "").unwrap();
        let t = cmdline::parse_install_target("/dev/disk/by-id/virtio-live-iso").unwrap();
        fs::write(dev.join("vda"), "").unwrap();
        let (info, node) = wait_for_disk(&sys, &dev, &t, short, tick).unwrap();
        assert_eq!((info.name.as_str(), node), ("vda", dev.join("vda")));
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn the_boot_medium_and_disks_holding_data_are_refused() {
        let root = tempdir("live-check");
        let disk = root.join("disk");
        let blank = vec![0u8; 4 << 20];
        fs::write(&disk, &blank).unwrap();
        check_target(&disk, "/dev/vdb", "abc123", false).unwrap();

        // The ISO: a PVD at 32768 whose Volume Set Identifier is the ID.
        let mut iso = blank.clone();
        let p = 32768;
        iso[p] = 1;
        iso[p + 1..p + 6].copy_from_slice(b"CD001");
        iso[p + 6] = 1;
        iso[p + 190..p + 318].fill(b' ');
        iso[p + 190..p + 196].copy_from_slice(b"ABC123");
        fs::write(&disk, &iso).unwrap();
        for wipe in [false, true] {
            let e = format!(
                "{:#}",
                check_target(&disk, "/dev/vda (serial:x)", "abc123", wipe).unwrap_err()
            );
            assert!(
                e.contains("refusing /dev/vda (serial:x): it is the boot medium"),
                "{e}"
            );
        }
        // Another ISO is only data.
        let e = format!(
            "{:#}",
            check_target(&disk, "/dev/vda", "ffff", false).unwrap_err()
        );
        assert!(
            e.contains("holds data: an ISO 9660 volume") && e.contains("machined.install.wipe=1"),
            "{e}"
        );
        check_target(&disk, "/dev/vda", "ffff", true).unwrap();
        let mut end = blank.clone();
        *end.last_mut().unwrap() = 1;
        fs::write(&disk, &end).unwrap();
        assert!(check_target(&disk, "/dev/vdb", "ab", false).is_err());
        check_target(&disk, "/dev/vdb", "ab", true).unwrap();
        fs::write(&disk, b"").unwrap();
        let e = format!(
            "{:#}",
            check_target(&disk, "/dev/vdb", "ab", true).unwrap_err()
        );
        assert!(e.contains("empty"), "{e}");
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn the_live_tree_is_moved_with_its_modes() {
        use std::os::unix::fs::PermissionsExt;
        let root = tempdir("live-copy");
        let src = root.join("live");
        fs::create_dir_all(src.join("payload")).unwrap();
        fs::write(src.join("installer"), b"\x7fELF").unwrap();
        fs::set_permissions(src.join("installer"), fs::Permissions::from_mode(0o755)).unwrap();
        fs::write(src.join("trusted.pub"), b"PEM").unwrap();
        fs::set_permissions(src.join("trusted.pub"), fs::Permissions::from_mode(0o644)).unwrap();
        fs::write(src.join("payload/vmlinuz"), vec![1u8; 1000]).unwrap();
        symlink("vmlinuz", src.join("payload/kernel")).unwrap();
        let dst = root.join("run/live");
        assert_eq!(move_tree(&src, &dst).unwrap(), 1000 + 4 + 3);
        // Only the (empty) directories are left behind.
        assert!(!src.join("installer").exists() && !src.join("payload/vmlinuz").exists());
        assert!(fs::read_dir(src.join("payload")).unwrap().next().is_none());
        let mode = |p: &str| fs::metadata(dst.join(p)).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode("installer"), 0o755);
        assert_eq!(mode("trusted.pub"), 0o644);
        assert_eq!(
            fs::read(dst.join("payload/kernel")).unwrap(),
            vec![1u8; 1000]
        );
        assert_eq!(
            fs::read_link(dst.join("payload/kernel")).unwrap(),
            Path::new("vmlinuz")
        );
        assert!(move_tree(&root.join("nope"), &root.join("x")).is_err());
        assert!(move_tree(&dst.join("installer"), &root.join("x")).is_err());
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn installer_command_and_report() {
        let a = installer_args(Path::new("/dev/vdb"), true, None);
        assert_eq!(
            a.join(" "),
            "install --installer /run/live/payload --disk /dev/vdb --key \
             /run/live/trusted.pub --json --wipe"
        );
        let json = "{\n  \"disk\": \"/dev/vdb\",\n  \"size\": 1,\n  \"version\": \"0.2.0\",\n}";
        assert_eq!(report_version(json).as_deref(), Some("0.2.0"));
        assert_eq!(report_version("{}"), None);
        assert_eq!(report_version("\"version\": 3"), None);
        assert_eq!(udev_name("  QEMU  HARD DISK "), "QEMU_HARD_DISK");
        assert_eq!(normal_wwn("0x50AB"), normal_wwn("naa.50ab"));
        assert_eq!(vpd80_serial(&[0, 0x80, 0, 9, b'a']), Some("a".into()));
        assert_eq!(vpd80_serial(&[0, 0x83, 0, 1, b'a']), None);
    }
}
