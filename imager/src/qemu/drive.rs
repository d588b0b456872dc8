//! How the booted disk is attached: the controller (bus) QEMU emulates
//! and the device on it. Real machines and clouds boot from NVMe, SATA
//! (AHCI), SCSI behind a hypervisor's or a RAID controller, or USB; the
//! image must boot on each (docs/design.md, "Disk controllers"), and
//! `imager boot --bus` attaches it the way a machine would.
//!
//! What each firmware boots from (tried with QEMU 7.2, Debian 12's OVMF
//! and SeaBIOS): OVMF from virtio, NVMe, AHCI, virtio-scsi and USB mass
//! storage; SeaBIOS also from MegaRAID SAS, PVSCSI and the LSI 53c895a. A
//! bus the firmware cannot read boots nothing: the firmware says so, and
//! `imager boot` reports it (docs/design.md, "Disk controllers").
//!
//! References: QEMU's `docs/system/devices/nvme.rst`, `usb.rst`, the
//! `-device help` list of `qemu-system-x86_64`.

use anyhow::{Result, bail};
use serde::Serialize;

/// The controller the booted disk sits on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Bus {
    /// virtio-blk (the default: QEMU's fastest).
    #[default]
    Virtio,
    /// An NVMe controller (4096-byte sectors too).
    Nvme,
    /// SATA on q35's AHCI controller.
    Sata,
    /// A SCSI disk behind virtio-scsi.
    VirtioScsi,
    /// A SCSI disk behind an LSI SAS1068 (Fusion MPT SAS).
    Mptsas,
    /// A SCSI disk behind a MegaRAID SAS 2108 (SeaBIOS only).
    Megasas,
    /// A SCSI disk behind an LSI 53c895a (SeaBIOS only).
    Lsi,
    /// A SCSI disk behind VMware's PVSCSI (OVMF only).
    Pvscsi,
    /// A USB stick: mass storage on an xHCI controller.
    Usb,
    /// A USB disk speaking UAS, on an xHCI controller.
    Uas,
}

impl Bus {
    pub const ALL: [Bus; 10] = [
        Bus::Virtio,
        Bus::Nvme,
        Bus::Sata,
        Bus::VirtioScsi,
        Bus::Mptsas,
        Bus::Megasas,
        Bus::Lsi,
        Bus::Pvscsi,
        Bus::Usb,
        Bus::Uas,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Bus::Virtio => "virtio",
            Bus::Nvme => "nvme",
            Bus::Sata => "sata",
            Bus::VirtioScsi => "virtio-scsi",
            Bus::Mptsas => "mptsas",
            Bus::Megasas => "megasas",
            Bus::Lsi => "lsi",
            Bus::Pvscsi => "pvscsi",
            Bus::Usb => "usb",
            Bus::Uas => "uas",
        }
    }

    /// The SCSI host adapter QEMU emulates for a SCSI bus.
    fn scsi_controller(self) -> Option<&'static str> {
        match self {
            Bus::VirtioScsi => Some("virtio-scsi-pci"),
            Bus::Mptsas => Some("mptsas1068"),
            Bus::Megasas => Some("megasas-gen2"),
            Bus::Lsi => Some("lsi53c895a"),
            Bus::Pvscsi => Some("pvscsi"),
            _ => None,
        }
    }
}

impl std::str::FromStr for Bus {
    type Err = String;

    fn from_str(s: &str) -> Result<Bus, String> {
        Bus::ALL.into_iter().find(|b| b.name() == s).ok_or_else(|| {
            let names: Vec<&str> = Bus::ALL.iter().map(|b| b.name()).collect();
            format!(
                "{} is not a bus: one of {}",
                contract::text::excerpt(s),
                names.join(", ")
            )
        })
    }
}

/// The `-device` arguments that attach the `index`th extra disk, drive
/// `drive`, on `bus`, without a boot index: after the boot disk, on a
/// controller of its own (NVMe), a port of its own of q35's AHCI (SATA:
/// ports 1 to 5; the boot disk's is 0) or virtio-blk. Other buses are
/// refused: their controllers are the boot disk's.
pub fn extra_device_args(
    bus: Bus,
    drive: &str,
    index: usize,
    serial: Option<&str>,
) -> Result<Vec<String>> {
    let serial_opt = serial.map(|s| format!(",serial={s}")).unwrap_or_default();
    let device = match bus {
        Bus::Virtio => format!("virtio-blk-pci,drive={drive}{serial_opt}"),
        Bus::Nvme => format!("nvme,drive={drive},serial={}", serial.unwrap_or(drive)),
        Bus::Sata if index < 5 => format!("ide-hd,bus=ide.{},drive={drive}{serial_opt}", index + 1),
        Bus::Sata => bail!("--disk …,bus=sata: q35's AHCI controller has room for 5 more disks"),
        other => bail!(
            "--disk …,bus={}: an extra disk goes on virtio, nvme or sata",
            other.name()
        ),
    };
    Ok(vec!["-device".into(), device])
}

/// The `-device` arguments that attach drive `drive` (an `-drive if=none`
/// id) on `bus` as the first boot device, with `sector_size`-byte logical
/// and physical blocks and the serial number `serial` (NVMe needs one:
/// `drive` when none is given).
pub fn device_args(
    bus: Bus,
    drive: &str,
    sector_size: u64,
    serial: Option<&str>,
) -> Result<Vec<String>> {
    if sector_size != 512 && matches!(bus, Bus::Sata | Bus::Lsi | Bus::Usb) {
        bail!(
            "--bus {}: QEMU's {} disks have 512-byte sectors only; attach a {sector_size}-byte \
             sector image with --bus nvme, virtio or virtio-scsi",
            bus.name(),
            match bus {
                Bus::Sata => "SATA",
                Bus::Lsi => "LSI 53c895a",
                _ => "usb-storage",
            }
        );
    }
    let blocks = format!("logical_block_size={sector_size},physical_block_size={sector_size}");
    let serial_opt = serial.map(|s| format!(",serial={s}")).unwrap_or_default();
    let boot = format!("drive={drive},bootindex=0");
    let mut args = Vec::new();
    let mut device = |d: String| {
        args.push("-device".to_string());
        args.push(d);
    };
    match bus {
        Bus::Virtio => device(format!("virtio-blk-pci,{boot},{blocks}{serial_opt}")),
        Bus::Nvme => device(format!(
            "nvme,{boot},{blocks},serial={}",
            serial.unwrap_or(drive)
        )),
        Bus::Sata => device(format!("ide-hd,bus=ide.0,{boot}{serial_opt}")),
        Bus::Usb => {
            device("qemu-xhci,id=xhci".into());
            device(format!("usb-storage,bus=xhci.0,{boot}{serial_opt}"));
        }
        Bus::Uas => {
            device("qemu-xhci,id=xhci".into());
            device("usb-uas,id=uas,bus=xhci.0".into());
            device(format!("scsi-hd,bus=uas.0,{boot},{blocks}{serial_opt}"));
        }
        scsi => {
            let controller = scsi.scsi_controller().unwrap_or("virtio-scsi-pci");
            device(format!("{controller},id=scsi0"));
            let blocks = if scsi == Bus::Lsi {
                String::new()
            } else {
                format!(",{blocks}")
            };
            device(format!("scsi-hd,bus=scsi0.0,{boot}{blocks}{serial_opt}"));
        }
    }
    Ok(args)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn attaches_extra_disks_after_the_boot_disk_on_their_own_controllers() {
        let args = |bus, i, serial| extra_device_args(bus, "extra1", i, serial).unwrap();
        assert_eq!(
            args(Bus::Virtio, 1, Some("s1")),
            ["-device", "virtio-blk-pci,drive=extra1,serial=s1"]
        );
        assert_eq!(
            args(Bus::Nvme, 1, None),
            ["-device", "nvme,drive=extra1,serial=extra1"]
        );
        // SATA: port 0 is the boot disk's.
        assert_eq!(
            args(Bus::Sata, 0, None),
            ["-device", "ide-hd,bus=ide.1,drive=extra1"]
        );
        assert!(
            extra_device_args(Bus::Sata, "x", 5, None)
                .unwrap_err()
                .to_string()
                .contains("room for 5 more")
        );
        // No boot index: the firmware boots the image.
        assert!(!args(Bus::Nvme, 0, None).concat().contains("bootindex"));
        for bus in [
            Bus::Usb,
            Bus::Uas,
            Bus::VirtioScsi,
            Bus::Megasas,
            Bus::Lsi,
            Bus::Pvscsi,
        ] {
            let e = extra_device_args(bus, "x", 0, None)
                .unwrap_err()
                .to_string();
            assert!(e.contains("on virtio, nvme or sata"), "{e}");
        }
    }

    #[test]
    fn each_bus_attaches_the_drive_as_the_first_boot_device() {
        for bus in Bus::ALL {
            assert_eq!(bus.name().parse::<Bus>(), Ok(bus));
            let args = device_args(bus, "disk0", 512, Some("S1")).unwrap();
            let devices: Vec<&String> = args.iter().skip(1).step_by(2).collect();
            assert!(args.iter().step_by(2).all(|a| a == "-device"), "{args:?}");
            let disk = devices.last().unwrap();
            assert!(
                disk.contains("drive=disk0,bootindex=0") && disk.contains("serial=S1"),
                "{bus:?}: {args:?}"
            );
            let controllers = devices.len() - 1;
            let expected = match bus {
                Bus::Virtio | Bus::Nvme | Bus::Sata => 0,
                Bus::Usb => 1,
                Bus::Uas => 2,
                _ => 1,
            };
            assert_eq!(controllers, expected, "{bus:?}: {args:?}");
        }
        let nvme = device_args(Bus::Nvme, "disk0", 4096, None).unwrap();
        assert_eq!(
            nvme[1],
            "nvme,drive=disk0,bootindex=0,logical_block_size=4096,physical_block_size=4096,\
             serial=disk0"
        );
        let mega = device_args(Bus::Megasas, "disk0", 512, None).unwrap();
        assert_eq!(mega[1], "megasas-gen2,id=scsi0");
        assert!(mega[3].starts_with("scsi-hd,bus=scsi0.0,drive=disk0,bootindex=0"));
    }

    #[test]
    fn a_bus_that_cannot_carry_4096_byte_sectors_is_refused_with_what_can() {
        for bus in [Bus::Sata, Bus::Lsi, Bus::Usb] {
            let e = device_args(bus, "disk0", 4096, None)
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("512-byte sectors only") && e.contains("--bus nvme"),
                "{e}"
            );
        }
        assert!(device_args(Bus::VirtioScsi, "disk0", 4096, None).is_ok());
    }
}
