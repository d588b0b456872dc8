//! The default image on the disk controllers of real machines, hypervisors
//! and clouds (kernel-config/hardware.config; docs/design.md, "Disk
//! controllers"): the same `disk.raw`, attached by `imager boot --bus` the
//! way each machine attaches its disk, reaches ready under OVMF from NVMe,
//! SATA (AHCI), virtio-scsi and a USB stick, and under SeaBIOS from NVMe,
//! SATA, MegaRAID SAS, VMware's PVSCSI and an LSI 53c895a (Debian's OVMF
//! has no driver for the last three). The kernel's own partition scan names the disk it found, so
//! each boot shows that the disk was the controller's, not a virtio disk.

// Test helpers panic on unexpected failures: that is how a test fails.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use std::path::Path;

fn image() -> &'static Build {
    static I: Fixture<Build> = Fixture::new("hardware-image");
    I.get(|| build_into("hardware"))
}

/// The kernel's name of the first disk a controller of `bus` gives.
fn kernel_disk(bus: &str) -> &'static str {
    match bus {
        "nvme" => "nvme0n1",
        "virtio" => "vda",
        _ => "sda",
    }
}

/// Boots the default disk on `bus` under `firmware`; the ready report,
/// after checking that the kernel scanned the partitions of the disk the
/// controller gives (`nvme0n1: p1 p2 …`, `sda: sda1 sda2 …`).
fn boot_on(bus: &str, firmware: &str) {
    let log = scratch().join(format!("hardware-{bus}-{firmware}.console.log"));
    let disk = image().artifact("raw");
    let r = boot_report(
        Path::new(&disk),
        &[
            "--bus",
            bus,
            "--firmware",
            firmware,
            "--console-log",
            log.to_str().unwrap(),
        ],
    )
    .unwrap_or_else(|e| panic!("{bus} under {firmware}: {e}"));
    assert_eq!(r["ready"], true, "{bus} under {firmware}: {r}");
    assert_eq!(r["slot"], "A", "{bus} under {firmware}: {r}");
    let console = std::fs::read_to_string(&log).unwrap();
    let name = kernel_disk(bus);
    let first = if bus == "nvme" {
        format!("{name}: p1 ")
    } else {
        format!("{name}: {name}1 ")
    };
    assert!(
        console.lines().any(|l| l.contains(&first)),
        "{bus} under {firmware}: the kernel scanned no {name}; console:\n{console}"
    );
}

#[test]
fn the_default_image_reaches_ready_on_each_controller_under_ovmf() {
    for bus in ["nvme", "sata", "virtio-scsi", "usb"] {
        boot_on(bus, "uefi");
    }
}

#[test]
fn the_default_image_reaches_ready_on_nvme_sata_megaraid_pvscsi_and_lsi_under_seabios() {
    for bus in ["nvme", "sata", "megasas", "pvscsi", "lsi"] {
        boot_on(bus, "bios");
    }
}
