//! Artifacts: what a build produces, as listed in the manifest and in
//! `imager build --json`.

use serde::{Deserialize, Serialize};

/// What an artifact is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    Kernel,
    KernelConfig,
    Initramfs,
    Rootfs,
    /// The root filesystem's dm-verity hash device (also in the initramfs).
    RootfsVerity,
    Raw,
    /// The raw disk as a fixed VHD (`disk.vhd`).
    Vhd,
    /// The raw disk as a qcow2 image (`disk.qcow2`).
    Qcow2,
    /// The raw disk compressed with zstd (`disk.raw.zst`).
    RawZst,
    /// The raw disk compressed with xz (`disk.raw.xz`).
    RawXz,
    /// The disk for Google Compute Engine (`gcp.tar.gz`).
    Gcp,
    /// The disk for Azure, a fixed VHD (`azure.vhd`).
    Azure,
    /// The OVF package for VMware (`vmware.ova`).
    Vmware,
    /// The disk for AWS, a stream-optimised VMDK (`aws.vmdk`).
    Aws,
    Iso,
    Installer,
    /// systemd-boot, carried in the installer's payload for `imager install`.
    BootLoader,
    /// GRUB's boot.img, carried in the installer's payload (BIOS path).
    GrubBoot,
    /// GRUB's core.img, carried in the installer's payload (BIOS path).
    GrubCore,
    /// A slot's Unified Kernel Image (`uki-a.efi`, `uki-b.efi`): the
    /// output `uki`, and the payload of images whose slots boot UKIs.
    Uki,
    /// The db certificate (PEM) a Secure Boot payload's UKIs are signed
    /// for: META's `secure-boot` record after an install.
    SecureBootDb,
    /// The node API's cluster CA certificate (PEM), for META.
    NodeCa,
    /// A signed EFI variable update (`PK.auth`, `KEK.auth`, `db.auth`)
    /// that systemd-boot enrols from the ESP.
    SecureBootAuth,
    /// A signed append to firmware's db or dbx (`db.append.auth`,
    /// `dbx.append.auth`) the version wants in firmware: the runtime
    /// writes it once the version is blessed (`efivar`).
    SecureBootUpdate,
    Manifest,
    Signature,
    PublicKey,
}

impl Kind {
    /// A disk in any format: the raw disk and every format and platform
    /// image made from it (`imager verify` checks the partition table of
    /// the disk each holds).
    pub fn is_disk(self) -> bool {
        matches!(
            self,
            Kind::Raw
                | Kind::Vhd
                | Kind::Qcow2
                | Kind::RawZst
                | Kind::RawXz
                | Kind::Gcp
                | Kind::Azure
                | Kind::Vmware
                | Kind::Aws
        )
    }

    /// A whole image made for a machine (a disk in any format, the ISO,
    /// the installer archive): never read by an install or an upgrade.
    pub fn is_image(self) -> bool {
        self.is_disk() || matches!(self, Kind::Iso | Kind::Installer)
    }

    pub fn name(self) -> &'static str {
        match self {
            Kind::Kernel => "kernel",
            Kind::KernelConfig => "kernel-config",
            Kind::Initramfs => "initramfs",
            Kind::Rootfs => "rootfs",
            Kind::RootfsVerity => "rootfs-verity",
            Kind::Raw => "raw",
            Kind::Vhd => "vhd",
            Kind::Qcow2 => "qcow2",
            Kind::RawZst => "raw-zst",
            Kind::RawXz => "raw-xz",
            Kind::Gcp => "gcp",
            Kind::Azure => "azure",
            Kind::Vmware => "vmware",
            Kind::Aws => "aws",
            Kind::Iso => "iso",
            Kind::Installer => "installer",
            Kind::BootLoader => "boot-loader",
            Kind::GrubBoot => "grub-boot",
            Kind::GrubCore => "grub-core",
            Kind::Uki => "uki",
            Kind::SecureBootDb => "secure-boot-db",
            Kind::NodeCa => "node-ca",
            Kind::SecureBootAuth => "secure-boot-auth",
            Kind::SecureBootUpdate => "secure-boot-update",
            Kind::Manifest => "manifest",
            Kind::Signature => "signature",
            Kind::PublicKey => "public-key",
        }
    }
}

/// One produced file. `path` is relative to the output directory in the
/// manifest, and as given on the command line in `--json` output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Artifact {
    pub kind: Kind,
    pub path: String,
    pub sha256: String,
    pub size: u64,
}
