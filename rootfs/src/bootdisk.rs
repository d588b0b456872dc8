//! The disk this machine booted from: the only one the runtime reads its
//! slots from and writes (docs/design.md, "The boot disk"). A second disk
//! that also carries our partitions (another install, an old disk moved
//! into the machine) is never written.
//!
//! Who says which disk booted:
//! - **UEFI**: systemd-boot, and systemd-stub when a UKI is booted without
//!   it, set the loader variable `LoaderDevicePartUUID` (systemd's Boot
//!   Loader Interface, docs/BOOT_LOADER_INTERFACE.md): the unique GUID of
//!   the ESP they were read from, as a UTF-16 string.
//! - **BIOS**: GRUB puts the unique GUID of the BOOT partition it read the
//!   slot's files from on the kernel's command line,
//!   [`contract::cmdline::BOOT_PART`] (`probe --part-uuid`,
//!   [`contract::grubcfg`]). Both are read by [`contract::bootdisk`].
//!
//! The boot disk is the one whose GPT holds a partition of that unique
//! GUID (read with `bootstate::gpt`, primary or backup). When no one says
//! (GRUB's core image written before it could probe, a kernel started
//! without a loader), the one disk that carries META is used, and the
//! console says so; with several, the runtime refuses to choose: that
//! would be a guess, and a wrong guess writes a disk it did not boot from.

use crate::partitions::{self, Partition};
use anyhow::{Context, Result, bail};
use contract::bootdisk::{self, LOADER_VARIABLE, decode_loader_variable};
use contract::cmdline;
use contract::guid::Guid;
use contract::partition::PartitionRole;
use std::path::Path;
use std::time::{Duration, Instant};

/// Who said which partition the machine booted from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Said {
    /// The UEFI loader: the ESP's unique GUID.
    Loader(Guid),
    /// GRUB: BOOT's unique GUID.
    Grub(Guid),
    /// No one.
    Nobody,
}

impl Said {
    fn guid(self) -> Option<Guid> {
        match self {
            Said::Loader(g) | Said::Grub(g) => Some(g),
            Said::Nobody => None,
        }
    }

    fn why(self) -> String {
        match self {
            Said::Loader(g) => {
                format!("it holds the ESP the UEFI loader was read from (LoaderDevicePartUUID {g})")
            }
            Said::Grub(g) => format!(
                "it holds the BOOT partition GRUB read this slot from ({}={g})",
                cmdline::BOOT_PART
            ),
            Said::Nobody => "neither the UEFI loader nor GRUB said which disk booted".into(),
        }
    }
}

/// Who says which disk booted on this machine: the loader variable under
/// UEFI, else GRUB's word on the command line.
pub fn who_said(cmdline_text: &str) -> Result<Said> {
    if crate::efi::booted_uefi()
        && let Some(bytes) = crate::efi::read(LOADER_VARIABLE)?
    {
        let g = decode_loader_variable(&bytes)
            .with_context(|| format!("{LOADER_VARIABLE} holds no GUID ({} bytes)", bytes.len()))?;
        return Ok(Said::Loader(g));
    }
    let grub = bootdisk::boot_part(cmdline_text).map_err(anyhow::Error::msg)?;
    Ok(grub.map_or(Said::Nobody, Said::Grub))
}

/// Whether the GPT of `/dev/<disk>` holds a partition of unique GUID
/// `guid`.
fn holds(dev_root: &Path, disk: &str, guid: Guid) -> Result<bool> {
    let path = dev_root.join(disk);
    let mut f = std::fs::File::open(&path).with_context(|| format!("open {}", path.display()))?;
    let size = bootstate::gpt::device_size(&mut f)
        .with_context(|| format!("size of {}", path.display()))?;
    let table = bootstate::gpt::read(&mut f, size).with_context(|| path.display().to_string())?;
    Ok(table.partitions.iter().any(|p| p.unique_guid == guid))
}

/// What [`choose`] found.
#[derive(Debug)]
pub enum Choice<'a> {
    /// META on the boot disk, and why that disk.
    Found(&'a Partition, String),
    /// No disk holds the partition (yet): wait.
    NotYet(String),
}

/// META on the boot disk among `parts` (the labelled partitions in sysfs),
/// `said` naming it; `holds(disk, guid)` reads a disk's GPT. An error is a
/// refusal: several disks carry META and no one said which booted.
pub fn choose<'a>(
    parts: &'a [Partition],
    said: Said,
    holds: impl Fn(&str, Guid) -> Result<bool>,
) -> Result<Choice<'a>> {
    let label = PartitionRole::Meta.label();
    let metas: Vec<&Partition> = parts.iter().filter(|p| p.label == label).collect();
    let disks: Vec<&str> = metas.iter().filter_map(|p| p.disk.as_deref()).collect();
    let Some(guid) = said.guid() else {
        return match metas.as_slice() {
            [] => Ok(Choice::NotYet("no partition labelled META".into())),
            [only] => Ok(Choice::Found(
                only,
                format!("{}; it is the only disk with a META partition", said.why()),
            )),
            _ => bail!(
                "{} disks carry a META partition ({}) and {}: refusing to choose one to \
                 run the A-B logic on and write (docs/design.md, \"The boot disk\")",
                metas.len(),
                metas
                    .iter()
                    .map(|p| p.disk.as_deref().unwrap_or(p.name.as_str()))
                    .collect::<Vec<_>>()
                    .join(", "),
                said.why()
            ),
        };
    };
    let mut unreadable = Vec::new();
    for (meta, disk) in metas.iter().filter_map(|p| Some((*p, p.disk.as_deref()?))) {
        match holds(disk, guid) {
            Ok(true) => return Ok(Choice::Found(meta, said.why())),
            Ok(false) => {}
            Err(e) => unreadable.push(format!("{disk}: {e:#}")),
        }
    }
    let mut why = format!(
        "no disk with a META partition holds partition {guid} (disks with META: {})",
        if disks.is_empty() {
            "none".to_string()
        } else {
            disks.join(", ")
        }
    );
    if !unreadable.is_empty() {
        why.push_str(&format!("; unreadable: {}", unreadable.join("; ")));
    }
    Ok(Choice::NotYet(why))
}

/// Polls sysfs until the boot disk's META partition is there (its device
/// node in `dev_root`), or `timeout` passes. Returns it, every labelled
/// partition seen, and why that disk.
pub fn wait_for_meta(
    sys_root: &Path,
    dev_root: &Path,
    said: Said,
    timeout: Duration,
    interval: Duration,
) -> Result<(Partition, Vec<Partition>, String)> {
    let start = Instant::now();
    // A disk whose GPT was read and does not hold the partition is not
    // read again at each poll: its table does not change while we wait.
    let read_without = std::cell::RefCell::new(std::collections::BTreeSet::new());
    let holds_once = |disk: &str, g: Guid| {
        if read_without.borrow().contains(disk) {
            return Ok(false);
        }
        let held = holds(dev_root, disk, g)?;
        if !held {
            read_without.borrow_mut().insert(disk.to_string());
        }
        Ok(held)
    };
    loop {
        let parts = partitions::scan(sys_root)?;
        let ready: Vec<Partition> = parts
            .iter()
            .filter(|p| p.dev_path(dev_root).exists())
            .cloned()
            .collect();
        let why_not = match choose(&ready, said, holds_once)? {
            Choice::Found(meta, why) => return Ok((meta.clone(), parts, why)),
            Choice::NotYet(why) => why,
        };
        if start.elapsed() >= timeout {
            bail!(
                "the disk this machine booted from did not appear in {:.1}s: {why_not} \
                 ({}; labelled partitions seen: {})",
                timeout.as_secs_f64(),
                said.why(),
                partitions::describe(&parts)
            );
        }
        std::thread::sleep(interval);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(name: &str, label: &str, disk: &str) -> Partition {
        Partition {
            name: name.into(),
            label: label.into(),
            disk: Some(disk.into()),
        }
    }

    /// Two disks with our partitions; `vdb` (second by name) holds `g`.
    fn two_disks() -> (Vec<Partition>, Guid) {
        let parts = vec![
            part("vda3", "BOOT", "vda"),
            part("vda4", "META", "vda"),
            part("vdb3", "BOOT", "vdb"),
            part("vdb4", "META", "vdb"),
        ];
        (parts, Guid::from_u128(0x1234))
    }

    #[test]
    fn takes_the_disk_that_holds_the_partition_named_not_the_first() {
        let (parts, g) = two_disks();
        let holds = |disk: &str, guid: Guid| Ok(disk == "vdb" && guid == g);
        for said in [Said::Loader(g), Said::Grub(g)] {
            match choose(&parts, said, holds).unwrap() {
                Choice::Found(meta, why) => {
                    assert_eq!(meta.name, "vdb4");
                    assert!(why.contains(&g.to_string()), "{why}");
                }
                other => panic!("{other:?}"),
            }
        }
        // A partition no disk holds (yet): wait, naming the disks read.
        match choose(&parts, Said::Loader(Guid::from_u128(9)), holds).unwrap() {
            Choice::NotYet(why) => assert!(why.contains("vda, vdb"), "{why}"),
            other => panic!("{other:?}"),
        }
        // A disk that cannot be read is named, and not taken.
        let broken = |disk: &str, _: Guid| {
            if disk == "vda" {
                bail!("no valid GPT")
            }
            Ok(false)
        };
        match choose(&parts, Said::Grub(g), broken).unwrap() {
            Choice::NotYet(why) => assert!(why.contains("vda: no valid GPT"), "{why}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn waits_for_the_device_node_then_times_out_with_context() {
        let root = crate::partitions::tests::tempdir("bootdisk-wait");
        crate::partitions::tests::fake_sys(&root.join("sys"));
        let dev = root.join("dev");
        std::fs::create_dir_all(&dev).unwrap();
        let short = Duration::from_millis(30);
        let tick = Duration::from_millis(5);
        // META is in sysfs but /dev/vda4 does not exist yet.
        let err = wait_for_meta(&root.join("sys"), &dev, Said::Nobody, short, tick).unwrap_err();
        assert!(format!("{err:#}").contains("vda4=META"), "{err:#}");
        std::fs::write(dev.join("vda4"), "").unwrap();
        let (p, all, why) =
            wait_for_meta(&root.join("sys"), &dev, Said::Nobody, short, tick).unwrap();
        assert_eq!(p.dev_path(&dev), dev.join("vda4"));
        assert_eq!(all.len(), 6);
        assert!(why.contains("the only disk"), "{why}");
        // Named by a GUID: /dev/vda is no disk with a GPT here, so it is
        // never taken, and the error says why.
        let err = wait_for_meta(
            &root.join("sys"),
            &dev,
            Said::Loader(Guid::from_u128(7)),
            short,
            tick,
        )
        .unwrap_err();
        assert!(format!("{err:#}").contains("vda: open"), "{err:#}");
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn without_a_word_uses_the_only_disk_and_refuses_to_choose_between_two() {
        let (parts, _) = two_disks();
        let never = |_: &str, _: Guid| -> Result<bool> { panic!("no GPT is read") };
        let e = choose(&parts, Said::Nobody, never).unwrap_err().to_string();
        assert!(
            e.contains("2 disks carry a META partition (vda, vdb)") && e.contains("refusing"),
            "{e}"
        );
        match choose(&parts[..2], Said::Nobody, never).unwrap() {
            Choice::Found(meta, why) => {
                assert_eq!(meta.name, "vda4");
                assert!(why.contains("the only disk with a META partition"), "{why}");
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            choose(&[], Said::Nobody, never).unwrap(),
            Choice::NotYet(_)
        ));
    }
}
