//! End-to-end tests of the hybrid live ISO (`imager build --profile iso`):
//! read back by xorriso and sfdisk, booted in QEMU from CD and as a USB
//! disk under SeaBIOS and OVMF, and installing onto a disk that then boots
//! by itself under both firmwares; the installs it must refuse.

#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// The serial number of the disk the install variant installs to.
const TARGET: &str = "TARGET01";

/// The default ISO build.
fn iso() -> &'static Build {
    static B: Fixture<Build> = Fixture::new("iso");
    B.get(|| build_profile("iso", &repo().join("profiles/iso.yaml"), &[]))
}

/// The ISO whose live system installs onto the disk with serial [`TARGET`].
fn install_iso() -> &'static Build {
    static B: Fixture<Build> = Fixture::new("iso-install");
    B.get(|| {
        let profile = write_profile_from("iso", "iso-install", |t| {
            format!("{t}\nlive:\n  install: serial:{TARGET}\n")
        });
        build_profile("iso-install", &profile, &[])
    })
}

#[test]
fn xorriso_lists_a_bios_and_a_uefi_boot_image_and_sfdisk_reads_the_table() {
    let iso = iso().artifact("iso");
    assert_eq!(iso.file_name().unwrap(), "live.iso");
    let report = ok(tool("xorriso")
        .args(["-indev"])
        .arg(&iso)
        .args(["-report_el_torito", "plain"]));
    let boot_lines: Vec<&str> = report
        .lines()
        .filter(|l| l.starts_with("El Torito boot img :"))
        .collect();
    assert_eq!(boot_lines.len(), 2, "{report}");
    assert!(boot_lines[0].contains("BIOS"), "{report}");
    assert!(boot_lines[1].contains("UEFI"), "{report}");
    // xorriso recognises GRUB's patches in the BIOS image.
    assert!(
        report.contains("boot-info-table") && report.contains("grub2-boot-info"),
        "{report}"
    );
    // The volume carries the name and version.
    let pvd = ok(tool("xorriso")
        .args(["-indev"])
        .arg(&iso)
        .args(["-pvd_info"]));
    assert!(pvd.contains("METAL_0_1_0"), "{pvd}");
    // The system area's partition table: the EFI image as its own partition.
    let json: Value = serde_json::from_str(&ok(tool("sfdisk").arg("--json").arg(&iso))).unwrap();
    let parts = json["partitiontable"]["partitions"].as_array().unwrap();
    let esp = parts
        .iter()
        .find(|p| p["type"] == "C12A7328-F81F-11D2-BA4B-00A0C93EC93B")
        .unwrap_or_else(|| panic!("no EFI System partition: {json}"));
    // It holds a clean FAT with systemd-boot.
    let fat = scratch().join("iso-esp.img");
    let (start, size) = (
        esp["start"].as_u64().unwrap(),
        esp["size"].as_u64().unwrap(),
    );
    ok(tool("dd")
        .arg(format!("if={}", iso.display()))
        .arg(format!("of={}", fat.display()))
        .args(["bs=512", &format!("skip={start}"), &format!("count={size}")]));
    ok(tool("fsck.fat").arg("-n").arg(&fat));
    let listing = ok(tool("mdir").args(["-/", "-b", "-i"]).arg(&fat).arg("::"));
    for f in ["EFI/BOOT/BOOTX64.EFI", "live/vmlinuz", "live/initramfs.zst"] {
        assert!(
            listing.to_lowercase().contains(&f.to_lowercase()),
            "{f}: {listing}"
        );
    }
}

#[test]
fn two_builds_give_the_same_iso() {
    let first = std::fs::read(iso().artifact("iso")).unwrap();
    let again = build_profile("iso-again", &repo().join("profiles/iso.yaml"), &[]);
    let second = std::fs::read(again.artifact("iso")).unwrap();
    assert!(first == second, "the ISO differs between two builds");
}

/// The root hash the build put on the image's command line (its signed
/// manifest's `boot.cmdline`), checked by `veritysetup verify` against
/// the root filesystem and hash device the build made. The default
/// profile's kernel builds dm-verity in (`kernel-config/base.config`), so
/// the build must have put one there (docs/design.md, "The verified
/// root").
fn built_root_hash(b: &Build) -> String {
    let m: Value =
        serde_json::from_slice(&std::fs::read(b.dir.join("manifest.json")).unwrap()).unwrap();
    let cmdline = m["boot"]["cmdline"].as_str().unwrap();
    let hash = contract::cmdline::get(cmdline, contract::cmdline::VERITY)
        .unwrap_or_else(|| panic!("the build's command line has no root hash: {cmdline}"));
    ok(tool("veritysetup")
        .arg("verify")
        .arg(b.artifact("rootfs"))
        .arg(b.artifact("rootfs-verity"))
        .arg(&hash));
    hash
}

/// Live from CD and from a USB disk, under SeaBIOS and OVMF: ready, live,
/// nothing installed, the root verified with the build's root hash.
#[test]
fn the_iso_reaches_ready_live_from_cd_and_usb_under_both_firmwares() {
    let root_hash = built_root_hash(iso());
    let iso = iso().artifact("iso");
    for firmware in ["bios", "uefi"] {
        for usb in [false, true] {
            let mut args = vec!["--firmware", firmware, "--shutdown"];
            if usb {
                args.push("--usb");
            }
            let r =
                boot_report(&iso, &args).unwrap_or_else(|e| panic!("{firmware} usb={usb}: {e}"));
            assert_eq!(r["live"], true, "{firmware} usb={usb}: {r}");
            assert_eq!(r["version"], "0.1.0", "{r}");
            assert_eq!(r["firmware"], firmware, "{r}");
            assert!(r["install"].is_null(), "{r}");
            assert_eq!(r["clean_poweroff"], true, "{r}");
            let cmdline = r["cmdline"].as_str().unwrap();
            assert!(cmdline.contains("machined.live="), "{cmdline}");
            assert!(!cmdline.contains("machined.slot="), "{cmdline}");
            // The root is verified, with the root hash the build made; no
            // Secure Boot in these firmwares.
            assert!(
                cmdline.contains(&contract::cmdline::verity_arg(&root_hash)),
                "{cmdline}"
            );
            assert_eq!(r["root_verified"], true, "{r}");
            assert_eq!(r["secure_boot"], "off", "{r}");
        }
    }
}

fn blank(name: &str, size: u64) -> PathBuf {
    blank_disk(&scratch().join(name), size)
}

/// Booted with a blank disk and the install argument, the live system
/// installs the payload it carries and powers off; the disk then boots by
/// itself on slot A under both firmwares.
#[test]
fn the_live_system_installs_a_disk_that_boots_on_slot_a_under_both_firmwares() {
    let iso = install_iso().artifact("iso");
    let disk = blank("iso-target.raw", 4 << 30);
    let spec = format!("{},serial={TARGET}", disk.display());
    let r = boot_report(&iso, &["--firmware", "bios", "--disk", &spec]).unwrap();
    assert_eq!(r["live"], true, "{r}");
    assert_eq!(r["install"]["installed"], true, "{r}");
    let msg = r["install"]["message"].as_str().unwrap();
    assert!(msg.contains("0.1.0") && msg.contains("slot A"), "{msg}");
    // Six partitions, read by sfdisk.
    assert_eq!(
        partition_names(&disk),
        ["EFI", "BIOS", "BOOT", "META", "STATE", "EPHEMERAL"]
    );
    for firmware in ["uefi", "bios"] {
        let r = boot_report(&disk, &["--firmware", firmware]).unwrap();
        assert_eq!(r["slot"], "A", "{firmware}: {r}");
        assert_eq!(r["version"], "0.1.0", "{firmware}: {r}");
        assert_eq!(r["live"], false, "{firmware}: {r}");
    }
}

/// The installs the live system refuses, with nothing written: the boot
/// medium itself, a disk holding data, a disk too small, no such disk.
#[test]
fn the_live_system_refuses_its_boot_medium_a_disk_with_data_and_a_small_disk() {
    let iso = install_iso().artifact("iso");
    // The ISO written to a USB stick that has the target's serial.
    let e = boot_report(&iso, &["--usb", "--serial", TARGET]).unwrap_err();
    assert!(e.contains("boot medium"), "{e}");

    // A disk holding data (a FAT filesystem on the whole disk).
    let data = blank("iso-data.raw", 4 << 30);
    ok(tool("mkfs.fat").arg("-I").arg(&data));
    let sum = |p: &Path| ok(tool("sha256sum").arg(p));
    let was = sum(&data);
    let spec = format!("{},serial={TARGET}", data.display());
    let e = boot_report(&iso, &["--disk", &spec]).unwrap_err();
    assert!(
        e.contains("holds data") && e.contains("machined.install.wipe=1"),
        "{e}"
    );
    assert_eq!(sum(&data), was, "nothing written");

    // Too small for the layout: the installer's own message.
    let small = blank("iso-small.raw", 64 << 20);
    let spec = format!("{},serial={TARGET}", small.display());
    let e = boot_report(&iso, &["--disk", &spec]).unwrap_err();
    assert!(e.contains("too small"), "{e}");

    // No disk with that serial.
    let e = boot_report(&iso, &["--disk", "1GiB,serial=OTHER"]).unwrap_err();
    assert!(
        e.contains(&format!("no disk serial:{TARGET} appeared")) && e.contains("serial:OTHER"),
        "{e}"
    );
    assert!(!e.contains("loop0"), "{e}");
}

/// The live ISO's kernel and initramfs as a Unified Kernel Image made by
/// `imager::uki` from systemd's stub, with the live entry's command line:
/// `EFI/BOOT/BOOTX64.EFI` on a small FAT disk (no systemd-boot) reaches
/// ready under OVMF, live, with exactly that command line.
#[test]
fn a_uki_of_the_live_system_reaches_ready_under_ovmf() {
    let iso = iso().artifact("iso");
    let dir = scratch().join("uki");
    let (uki, r, cmdline) = live_uki(&iso, &dir);
    assert_eq!(r.sections.len(), 4);

    let disk = dir.join("esp.img");
    ok(tool("mkfs.vfat")
        .args(["-C", "-n", "UKI"])
        .arg(&disk)
        .arg("65536"));
    ok(tool("mmd")
        .arg("-i")
        .arg(&disk)
        .args(["::EFI", "::EFI/BOOT"]));
    ok(tool("mcopy")
        .arg("-i")
        .arg(&disk)
        .arg(&uki)
        .arg("::EFI/BOOT/BOOTX64.EFI"));

    let mut opts = imager::qemu::BootOptions::new(&disk);
    opts.timeout = std::time::Duration::from_secs(180);
    opts.echo = false;
    let report = imager::qemu::boot(&opts).unwrap_or_else(|e| panic!("the UKI: {e:#}"));
    assert!(report.ready && report.live, "{report:?}");
    assert_eq!(report.version, "0.1.0");
    assert_eq!(report.cmdline.as_deref(), Some(cmdline.as_str()));
}
