//! The disk a machine booted from, with a second disk of ours beside it
//! (docs/design.md, "The boot disk"): two installed disks in one machine,
//! one of an older version, each larger than its image (a first boot
//! grows EPHEMERAL to the end of its disk). The runtime formats, grows,
//! blesses and falls back only on the disk the firmware booted: under OVMF the one
//! systemd-boot names (`LoaderDevicePartUUID`) when it is second by kernel
//! name (`vda` beside `nvme0n1`) and when it is first; under SeaBIOS the
//! one GRUB names (`machined.boot_part=`), second by name (`sda` beside
//! `nvme0n1`). The other disk keeps every byte. Without a word from a
//! loader, the runtime refuses to choose between two disks (a kernel
//! started directly by QEMU).
//!
//! Each disk is the built image written as it is (`dd`): it carries the
//! image's own GUIDs, and its first boot gives it GUIDs of its own; a power
//! cut during that change leaves a disk that boots and finishes it.

// Test helpers panic on unexpected failures: that is how a test fails.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use serde_json::Value;
use std::path::{Path, PathBuf};

struct Images {
    older: Build,
    v1: Build,
    v2: Build,
    /// 0.3.0, which never reaches ready (`machined.break=ready`).
    broken: Build,
}

fn images() -> &'static Images {
    static I: Fixture<Images> = Fixture::new("bootdisk-images");
    I.get(|| {
        let key = dev_key().display().to_string();
        let variant = |name: &str, version: &str, option: &str| {
            let profile = write_profile_from("metal", name, |t| {
                t.replace("version: 0.1.0", version)
                    .replace("    - vdso32=0\n", &format!("    - vdso32=0\n{option}"))
            });
            build_profile(name, &profile, &["--key", &key])
        };
        Images {
            older: variant("bootdisk-older", "version: 0.0.9", ""),
            v1: variant("bootdisk-v1", "version: 0.1.0", ""),
            v2: variant("bootdisk-v2", "version: 0.2.0", ""),
            broken: variant(
                "bootdisk-broken",
                "version: 0.3.0",
                "    - machined.break=ready\n",
            ),
        }
    })
}

/// A copy of `b`'s disk, 512 MiB larger than the image: room that a first
/// boot grows EPHEMERAL into.
fn larger_disk(b: &Build, name: &str) -> PathBuf {
    let d = sparse_copy(&b.artifact("raw"), name);
    let f = std::fs::OpenOptions::new().write(true).open(&d).unwrap();
    let len = f.metadata().unwrap().len();
    f.set_len(len + 512 * 1024 * 1024).unwrap();
    d
}

fn inspect(disk: &Path) -> Value {
    serde_json::from_str(&ok(imager().args(["inspect", "--json"]).arg(disk))).unwrap()
}

/// The unique GUID of partition `name` of `disk`, as sfdisk reads it (in
/// lower case).
fn unique_guid(disk: &Path, name: &str) -> String {
    let json: Value = serde_json::from_str(&ok(tool("sfdisk").arg("--json").arg(disk))).unwrap();
    json["partitiontable"]["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == name)
        .and_then(|p| p["uuid"].as_str())
        .unwrap_or_else(|| panic!("sfdisk: no partition {name} on {}", disk.display()))
        .to_lowercase()
}

/// The last sector of EPHEMERAL, as sfdisk reads it.
fn ephemeral_end(disk: &Path) -> u64 {
    let (start, len) = partition_range(disk, "EPHEMERAL");
    (start + len) / 512
}

/// Boots `disk` on `bus` under `firmware` to ready with `other` attached
/// as an extra disk on `other_bus`; the report and the console. `other`
/// must keep every byte.
fn boot_beside(
    disk: &Path,
    bus: &str,
    firmware: &str,
    other: &Path,
    other_bus: &str,
) -> (Value, String) {
    boot_beside_with(disk, bus, firmware, other, other_bus, &[])
}

/// [`boot_beside`] with `extra` arguments for `imager boot`.
fn boot_beside_with(
    disk: &Path,
    bus: &str,
    firmware: &str,
    other: &Path,
    other_bus: &str,
    extra: &[&str],
) -> (Value, String) {
    let before = sha256(other);
    let log = disk.with_extension(format!("{firmware}.console.log"));
    let other_arg = format!("{},bus={other_bus}", other.display());
    let mut args = vec![
        "--write",
        "--bus",
        bus,
        "--firmware",
        firmware,
        "--disk",
        &other_arg,
        "--console-log",
        log.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let r = boot_report(disk, &args)
        .unwrap_or_else(|e| panic!("{} on {bus} under {firmware}: {e}", disk.display()));
    let console = std::fs::read_to_string(&log).unwrap();
    assert_eq!(r["ready"], true, "{r}\n{console}");
    assert_eq!(
        sha256(other),
        before,
        "the disk the machine did not boot from ({}) was written; console:\n{console}",
        other.display()
    );
    // (The other disk's backup GPT is where its image put it, before the
    // room added: it is never grown, and never touched.)
    check_gpt(disk);
    (r, console)
}

fn line<'a>(console: &'a str, what: &str) -> &'a str {
    console
        .lines()
        .find(|l| l.contains(what))
        .unwrap_or_else(|| panic!("no line with {what:?}; console:\n{console}"))
}

#[test]
fn the_runtime_writes_only_the_disk_uefi_booted_whichever_is_first_by_name() {
    let i = images();
    let boot = larger_disk(&i.v1, "bootdisk-uefi-v1");
    let other = larger_disk(&i.older, "bootdisk-uefi-older");
    let image_end = ephemeral_end(&boot);

    // The boot disk is vda, second by name beside nvme0n1.
    let esp = unique_guid(&boot, "EFI");
    assert_eq!(inspect(&boot)["own_guids"], false);
    let (r, console) = boot_beside(&boot, "virtio", "uefi", &other, "nvme");
    assert_eq!(r["slot"], "A", "{r}");
    let said = line(&console, "stage2: boot disk vda:");
    assert!(
        said.contains("LoaderDevicePartUUID") && said.to_lowercase().contains(&esp),
        "{said}"
    );
    // Its first boot gave it GUIDs of its own (the other disk kept every
    // byte, its own included).
    line(&console, "storage: /dev/vda carried the image's own GUIDs");
    assert_ne!(unique_guid(&boot, "EFI"), esp);
    assert_eq!(inspect(&boot)["own_guids"], true);
    assert_eq!(inspect(&other)["own_guids"], false);
    let also = line(&console, "stage2: disk nvme0n1 also carries META");
    assert!(also.contains("never written"), "{also}");
    assert!(
        ephemeral_end(&boot) > image_end,
        "the boot disk's EPHEMERAL was not grown"
    );

    // An upgrade of the boot disk is tried and blessed on it alone.
    // (The build's output directory: its signed manifest lists the kernel
    // and initramfs.)
    ok(imager()
        .args(["upgrade", "--installer"])
        .arg(&i.v2.dir)
        .arg("--disk")
        .arg(&boot));
    let (r, console) = boot_beside(&boot, "virtio", "uefi", &other, "nvme");
    assert_eq!(
        (&r["slot"], &r["version"]),
        (&"B".into(), &"0.2.0".into()),
        "{r}"
    );
    line(&console, "blessed slot B (0.2.0)");

    // An upgrade that never reaches ready falls back on the boot disk
    // alone, the other disk beside it untouched through every try.
    ok(imager()
        .args(["upgrade", "--installer"])
        .arg(&i.broken.dir)
        .arg("--disk")
        .arg(&boot));
    let (r, console) = boot_beside_with(&boot, "virtio", "uefi", &other, "nvme", &["--reboots"]);
    assert_eq!(
        (&r["slot"], &r["version"], &r["failed_boots"]),
        (&"B".into(), &"0.2.0".into(), &3.into()),
        "{r}"
    );
    line(
        &console,
        "rollback: the upgrade to slot A (0.3.0) failed: it failed to reach ready in 3 tries",
    );

    // The older disk boots, first by name (nvme0n1), the newer beside it
    // on vdb: the older one alone is formatted and grown.
    let older_end = ephemeral_end(&other);
    let (r, console) = boot_beside(&other, "nvme", "uefi", &boot, "virtio");
    assert_eq!(r["version"], "0.0.9", "{r}");
    line(&console, "stage2: boot disk nvme0n1:");
    line(&console, "stage2: disk vda also carries META");
    assert!(ephemeral_end(&other) > older_end);
}

#[test]
fn the_runtime_writes_only_the_disk_grub_booted() {
    let i = images();
    let boot = larger_disk(&i.v1, "bootdisk-bios-v1");
    let other = larger_disk(&i.older, "bootdisk-bios-older");
    let image_end = ephemeral_end(&boot);
    let boot_guid = unique_guid(&boot, "BOOT");
    // sda (SATA), second by name beside nvme0n1.
    let (r, console) = boot_beside(&boot, "sata", "bios", &other, "nvme");
    assert_eq!(r["slot"], "A", "{r}");
    let said = line(&console, "stage2: boot disk sda:");
    assert!(
        said.contains(&format!("machined.boot_part={boot_guid}")),
        "{said}"
    );
    line(&console, "stage2: disk nvme0n1 also carries META");
    assert!(ephemeral_end(&boot) > image_end);
    line(&console, "storage: /dev/sda carried the image's own GUIDs");
    assert_ne!(unique_guid(&boot, "BOOT"), boot_guid);
    // The next boot finds it by its new GUID.
    let (_, console) = boot_beside(&boot, "sata", "bios", &other, "nvme");
    let said = line(&console, "stage2: boot disk sda:");
    let now = unique_guid(&boot, "BOOT");
    assert!(
        said.contains(&format!("machined.boot_part={now}")),
        "{said}"
    );
    assert!(
        !console.contains("carried the image's own GUIDs"),
        "{console}"
    );
}

/// A power cut during the first boot's change of GUIDs
/// (`bootstate::gpt::reidentify`, cut offline before its write N as the
/// runtime would have made it): before write 4 the old primary table is
/// whole; before the last (4, the primary header) the new backup is the
/// table, the primary's entries failing their CRC. Each disk boots to
/// ready under OVMF, the last also under SeaBIOS, and leaves the boot with
/// GUIDs of its own in both copies (sgdisk -v finds nothing).
#[test]
fn a_power_cut_during_the_first_boot_guid_change_leaves_a_disk_that_boots() {
    let i = images();
    for (n, firmware) in [(2, "uefi"), (4, "uefi"), (4, "bios")] {
        let what = format!("cut before write {n} of 4, {firmware}");
        let disk = sparse_copy(
            &i.v1.artifact("raw"),
            &format!("bootdisk-cut-{n}-{firmware}"),
        );
        let before = unique_guid(&disk, "EFI");
        {
            let f = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&disk)
                .unwrap();
            let size = f.metadata().unwrap().len();
            let mut f = bootstate::Faulty::failing_at(f, n);
            let e = bootstate::gpt::reidentify(
                &mut f,
                size,
                512,
                contract::guid::installed([n as u8; 16]),
            )
            .unwrap_err();
            assert!(
                format!("{e:#}").contains("simulated power cut"),
                "{what}: {e:#}"
            );
        }
        let log = disk.with_extension("console.log");
        let r = boot_report(
            &disk,
            &[
                "--write",
                "--firmware",
                firmware,
                "--console-log",
                log.to_str().unwrap(),
            ],
        )
        .unwrap_or_else(|e| panic!("{what}: {e}"));
        let console = std::fs::read_to_string(&log).unwrap();
        assert_eq!(r["ready"], true, "{what}: {r}\n{console}");
        assert_eq!(inspect(&disk)["own_guids"], true, "{what}");
        assert_ne!(unique_guid(&disk, "EFI"), before, "{what}");
        check_gpt(&disk);
        std::fs::remove_file(&disk).unwrap();
    }
}

#[test]
fn without_a_loaders_word_the_runtime_refuses_to_choose_between_two_disks() {
    let i = images();
    let a = sparse_copy(&i.v1.artifact("raw"), "bootdisk-direct-a");
    let b = sparse_copy(&i.older.artifact("raw"), "bootdisk-direct-b");
    let (before_a, before_b) = (sha256(&a), sha256(&b));
    // The kernel and initramfs of slot A, started by QEMU itself: no
    // loader says which disk booted.
    let entry = inspect(&a)["entries"][0].clone();
    let cmdline = entry["options"].as_str().unwrap().to_string();
    let mut qemu = direct_qemu(
        &i.v1.artifact("kernel"),
        &i.v1.artifact("initramfs"),
        &format!("{cmdline} machined.on_failure=poweroff"),
    );
    for (n, d) in [&a, &b].iter().enumerate() {
        qemu.arg("-drive").arg(format!(
            "if=virtio,format=raw,file={},index={n}",
            d.display()
        ));
    }
    let (console, exited) = follow_console(
        qemu.spawn().unwrap(),
        None,
        std::time::Duration::from_secs(300),
    );
    let console = console.join("\n");
    let refusal = line(&console, "2 disks carry a META partition (vda, vdb)");
    assert!(refusal.contains("refusing to choose"), "{refusal}");
    assert!(exited, "QEMU did not power off after the refusal");
    assert_eq!((sha256(&a), sha256(&b)), (before_a, before_b));
}
