//! The default image (`profiles/metal.yaml`, whose kernel carries the
//! drivers of kernel-config/hardware.config; docs/design.md, "Disk
//! controllers") on the disk controllers of real machines, hypervisors and
//! clouds: the same `disk.raw`, attached by `imager boot --bus` the way
//! each machine attaches its disk, reaches ready under OVMF from NVMe,
//! SATA (AHCI), virtio-scsi and a USB stick, and under SeaBIOS from NVMe,
//! SATA, MegaRAID SAS, VMware's PVSCSI and an LSI 53c895a (Debian's OVMF
//! has no driver for the last three). The kernel's own partition scan
//! names the disk it found, so each boot shows that the disk was the
//! controller's, not a virtio disk. With an e1000, an e1000e or a VMXNET3
//! as its only NIC, the node gets its address by DHCP through it and
//! serves its API. Its messages reach the screen as well as the serial
//! port, under SeaBIOS and OVMF.

// Test helpers panic on unexpected failures: that is how a test fails.
#![allow(clippy::unwrap_used)]

mod common;

#[path = "../registry/tests/common/mod.rs"]
mod reg;

use common::vm::*;
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

/// Boots the hardware disk on `bus` under `firmware`; the ready report,
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

/// The node's credentials (`watcher`, a reader; `root`, an admin; node
/// `node1` at the guest's address and the host's loopback), made once.
fn credentials() -> &'static std::path::PathBuf {
    static C: Fixture<std::path::PathBuf> = Fixture::new("hardware-credentials");
    C.get(|| {
        let dir = scratch().join("hardware-credentials");
        let _ = std::fs::remove_dir_all(&dir);
        for args in [
            &["--role", "reader", "--name", "watcher"][..],
            &["--role", "admin", "--name", "root"],
            &NODE1,
        ] {
            ok(imager().args(["node", "credentials"]).arg(&dir).args(args));
        }
        dir
    })
}

/// Boots a provisioned copy of the hardware disk with `nic` as its only NIC
/// and asks the node for its status through it: the kernel's driver named
/// the interface (`e1000e 0000:00:02.0 eth0: …`), the runtime's DHCP
/// client leased QEMU's address through it, and the API answered over it;
/// then an admin powers it off.
fn serves_the_api_through(nic: &str, driver: &str) {
    let creds = credentials();
    let disk = sparse_copy(&image().artifact("raw"), &format!("hardware-nic-{nic}"));
    ok(imager()
        .args(["node", "provision"])
        .arg(&disk)
        .arg("--credentials")
        .arg(creds)
        .args(["--node", "node1"]));
    let mut vm = Vm::boot(&disk, reg::free_port(), &["--nic", nic]);
    vm.wait_for("ready", 1);
    let s = status(&vm, creds, "watcher");
    assert_eq!(s["booted_slot"], "A", "{nic}: {s}");
    let console = vm.console();
    assert!(
        console
            .lines()
            .any(|l| l.contains(&format!("] {driver} 0000:")) && l.contains("eth0")),
        "{nic}: no line of the {driver} driver naming eth0; console:\n{}",
        tail(&console)
    );
    assert!(
        console.lines().any(|l| l.contains(common::DHCP_UP)),
        "{nic}: eth0 got no address by DHCP; console:\n{}",
        tail(&console)
    );
    vm.power_off(creds);
}

#[test]
fn the_node_serves_its_api_through_an_e1000_an_e1000e_and_a_vmxnet3() {
    for (nic, driver) in [
        ("e1000", "e1000"),
        ("e1000e", "e1000e"),
        ("vmxnet3", "vmxnet3"),
    ] {
        serves_the_api_through(nic, driver);
    }
}

/// Kernel and runtime messages reach the screen as well as the serial
/// port (`console=tty0` before `console=ttyS0,115200`; the runtime writes
/// its lines to every console the kernel does): booted with a screen (a
/// standard VGA adapter), the picture of it taken once the machine is
/// ready shows the runtime's ready line, read in the font it is drawn in
/// (`common::screen`): under SeaBIOS the VGA BIOS's (VGA text mode, the
/// kernel's VGA console), under OVMF the kernel's (the GOP framebuffer
/// through efifb and the framebuffer console).
#[test]
fn the_console_reaches_the_screen_under_seabios_and_ovmf() {
    use common::screen::Font;
    for (firmware, font) in [("bios", Font::VgaBios), ("uefi", Font::Kernel)] {
        let picture = scratch().join(format!("screen-{firmware}.ppm"));
        let log = scratch().join(format!("screen-{firmware}.console"));
        let _ = std::fs::remove_file(&picture);
        let r = boot_report(
            &image().artifact("raw"),
            &[
                "--firmware",
                firmware,
                "--screen",
                picture.to_str().unwrap(),
                "--console-log",
                log.to_str().unwrap(),
            ],
        )
        .unwrap_or_else(|e| panic!("{firmware}: {e}"));
        assert_eq!(r["firmware"], firmware);
        let console = std::fs::read_to_string(&log).unwrap();
        assert!(
            console
                .lines()
                .any(|l| l == "machined: stage2: console lines also on tty0"),
            "{firmware}:\n{console}"
        );
        let screen = common::screen::text(&picture, font);
        assert!(
            screen
                .iter()
                .any(|l| l.starts_with("machined: ready version=0.1.0 slot=A")),
            "{firmware}: the screen shows:\n{}",
            screen.join("\n")
        );
    }
}
