//! The emulated machine of each architecture: QEMU's program, machine type,
//! CPU and UEFI firmware, in one table ([`MACHINES`]), so that a boot of an
//! amd64 and of an arm64 image differ only by its row.
//!
//! amd64 is QEMU's `q35` under OVMF (SeaBIOS for `--firmware bios`); arm64
//! is the `virt` machine under AAVMF, the same EDK II firmware built for
//! AArch64 (Debian's qemu-efi-aarch64), UEFI only. arm64's CPU is `max`
//! (every feature TCG emulates, so the kernel's pointer authentication,
//! BTI and E0PD run) with `pauth-impdef=on`: QEMU's own pointer
//! authentication algorithm, much cheaper under TCG than the architected
//! QARMA5 one (QEMU's docs/system/arm/cpu-features.rst).
//!
//! Secure Boot: amd64 runs OVMF's Secure Boot build, which keeps the
//! variable store behind SMM (`smm=on` and a secure pflash), so that only
//! authenticated updates reach PK, KEK, db and dbx. arm64's AAVMF is one
//! build, Secure Boot included, and QEMU's `virt` machine has no secure
//! world for the store: the firmware enforces Secure Boot from the keys
//! enrolled in it, but a guest kernel could rewrite the pflash. That is
//! enough to test what we sign (docs/arm64.md); a real arm64 machine keeps
//! its store in its own secure storage.

use anyhow::{Context, Result, bail};
use contract::Arch;
use std::path::{Path, PathBuf};

/// What QEMU runs an architecture's images on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Machine {
    pub arch: Arch,
    /// QEMU's program, looked for on PATH.
    pub qemu: &'static str,
    /// The Debian package that installs it.
    pub qemu_package: &'static str,
    /// `-machine`; Secure Boot adds `,smm=on` on amd64.
    pub machine: &'static str,
    /// `-cpu`.
    pub cpu: &'static str,
    /// The UEFI firmware's code and its variable store's template.
    pub uefi_code: &'static str,
    pub uefi_vars: &'static str,
    /// The Debian package of the UEFI firmware.
    pub uefi_package: &'static str,
    /// The firmware's code that enforces Secure Boot, and whether it needs
    /// SMM (`smm=on`, the variable store behind a secure pflash).
    pub secure_boot_code: &'static str,
    pub secure_boot_smm: bool,
    /// A formatted variable store to enrol keys into with `virt-fw-vars`
    /// (Debian's blank `AAVMF_VARS.fd` is all zeros, which it cannot read;
    /// its snakeoil store is formatted, and its Debian test keys are
    /// deleted before ours go in: [`Machine::enrol_args`]).
    pub keys_template: &'static str,
    /// Whether the machine also boots BIOS (SeaBIOS) and has q35's AHCI
    /// controller (`ide.0`, where a CD-ROM and SATA disks go).
    pub bios_and_ahci: bool,
}

/// The guest's CPU on amd64: QEMU's default model with RDRAND, which every
/// x86-64 machine since about 2012 has. Without it, a guest under TCG waits
/// seconds at each boot for its random pool (the node API's TLS keys,
/// mkfs.xfs's UUIDs): the kernel trusts the CPU's generator as KSPP wants
/// (`random.trust_cpu`), and OVMF seeds the kernel from it too. (arm64's
/// `max` has RNDR.)
pub const CPU: &str = "qemu64,+rdrand";

pub const MACHINES: [Machine; 2] = [
    Machine {
        arch: Arch::Amd64,
        qemu: "qemu-system-x86_64",
        qemu_package: "qemu-system-x86",
        machine: "q35",
        cpu: CPU,
        uefi_code: "/usr/share/OVMF/OVMF_CODE_4M.fd",
        uefi_vars: "/usr/share/OVMF/OVMF_VARS_4M.fd",
        uefi_package: "ovmf",
        secure_boot_code: "/usr/share/OVMF/OVMF_CODE_4M.secboot.fd",
        secure_boot_smm: true,
        keys_template: "/usr/share/OVMF/OVMF_VARS_4M.fd",
        bios_and_ahci: true,
    },
    Machine {
        arch: Arch::Arm64,
        qemu: "qemu-system-aarch64",
        qemu_package: "qemu-system-arm",
        machine: "virt",
        cpu: "max,pauth-impdef=on",
        uefi_code: "/usr/share/AAVMF/AAVMF_CODE.fd",
        uefi_vars: "/usr/share/AAVMF/AAVMF_VARS.fd",
        uefi_package: "qemu-efi-aarch64",
        secure_boot_code: "/usr/share/AAVMF/AAVMF_CODE.fd",
        secure_boot_smm: false,
        keys_template: "/usr/share/AAVMF/AAVMF_VARS.snakeoil.fd",
        bios_and_ahci: false,
    },
];

impl Machine {
    /// The row of `arch`.
    pub fn of(arch: Arch) -> &'static Machine {
        match MACHINES.iter().find(|m| m.arch == arch) {
            Some(m) => m,
            None => &MACHINES[0],
        }
    }

    /// `virt-fw-vars`' arguments that make a variable store of this
    /// machine at `out` with the key set of `keys` (a directory of `imager
    /// keygen --secure-boot`: PK.crt, KEK.crt, db.crt and GUID) and
    /// nothing else enrolled, from [`Machine::keys_template`]. Secure Boot
    /// is on with `secure_boot`; else the firmware is in user mode and
    /// enforces nothing.
    pub fn enrol_args(&self, keys: &Path, out: &Path, secure_boot: bool) -> Result<Vec<String>> {
        let guid = std::fs::read_to_string(keys.join("GUID"))
            .with_context(|| format!("reading {}", keys.join("GUID").display()))?;
        let guid = guid.trim().to_string();
        let path = |p: &Path| p.display().to_string();
        let mut a: Vec<String> = vec!["--input".into(), self.keys_template.into()];
        a.extend(["--output".into(), path(out)]);
        for v in ["PK", "KEK", "db", "dbx"] {
            a.extend(["--delete".into(), v.into()]);
        }
        for (opt, file) in [
            ("--set-pk", "PK.crt"),
            ("--add-kek", "KEK.crt"),
            ("--add-db", "db.crt"),
        ] {
            a.extend([opt.into(), guid.clone(), path(&keys.join(file))]);
        }
        if secure_boot {
            a.push("--secure-boot".into());
        } else {
            // Neither store says SecureBootEnable: with a PK enrolled and
            // nothing said, the firmware would enforce.
            a.extend(["--set-false".into(), "SecureBootEnable".into()]);
        }
        Ok(a)
    }

    /// The `-device` arguments of the CD-ROM drive holding the drive
    /// `drive` (first to boot; `serial` is `,serial=…` or empty): on q35's
    /// AHCI controller, or on the `virt` machine, which has none, a SCSI
    /// CD-ROM behind virtio-scsi (AAVMF boots from it).
    pub fn cdrom_args(&self, drive: &str, serial: &str) -> Vec<String> {
        if self.bios_and_ahci {
            vec![
                "-device".into(),
                format!("ide-cd,drive={drive},bus=ide.0,bootindex=0{serial}"),
            ]
        } else {
            vec![
                "-device".into(),
                "virtio-scsi-pci,id=cd".into(),
                "-device".into(),
                format!("scsi-cd,drive={drive},bus=cd.0,bootindex=0{serial}"),
            ]
        }
    }

    /// QEMU's program on PATH, or what to install.
    pub fn find_qemu(&self) -> Result<PathBuf> {
        for dir in std::env::var("PATH").unwrap_or_default().split(':') {
            let p = Path::new(dir).join(self.qemu);
            if p.is_file() {
                return Ok(p);
            }
        }
        bail!(
            "{} not found: install {} (scripts/setup.sh)",
            self.qemu,
            self.qemu_package
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every architecture has its row, once.
    #[test]
    fn every_architecture_has_one_machine() {
        for a in contract::arch::ARCHES {
            assert_eq!(
                MACHINES.iter().filter(|m| m.arch == a.arch).count(),
                1,
                "{}",
                a.arch
            );
            assert_eq!(Machine::of(a.arch).arch, a.arch);
            // BIOS boot and the BIOS-era controllers go together with the
            // architecture's own BIOS column.
            assert_eq!(Machine::of(a.arch).bios_and_ahci, a.bios);
        }
    }
}
