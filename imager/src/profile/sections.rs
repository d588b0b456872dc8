//! The sections of a profile, as its YAML has them (`docs/profiles.md`):
//! what each key holds and its default. What a whole profile must satisfy
//! is checked in [`super::Profile`].

use crate::secret::excerpt;
use anyhow::Result;
use serde::{Deserialize, Deserializer};
use std::path::PathBuf;

/// A size in bytes, written as a number of bytes or with a binary unit
/// (`512KiB`, `100MiB`, `2GiB`, `1TiB`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Size(pub u64);

impl Size {
    pub fn parse(s: &str) -> Result<Size, String> {
        let t = s.trim();
        let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let mult: u64 = match unit.trim() {
            "" | "B" => 1,
            "KiB" => 1 << 10,
            "MiB" => 1 << 20,
            "GiB" => 1 << 30,
            "TiB" => 1 << 40,
            _ => return Err(size_hint(s)),
        };
        num.parse::<u64>()
            .ok()
            .and_then(|n| n.checked_mul(mult))
            .map(Size)
            .ok_or_else(|| size_hint(s))
    }
}

fn size_hint(s: &str) -> String {
    format!(
        "invalid size {}: write a number of bytes or a number with KiB, MiB, GiB or TiB",
        excerpt(s)
    )
}

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Size, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Size;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a size: a number of bytes or a number with KiB, MiB, GiB or TiB")
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Size, E> {
                Ok(Size(v))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Size, E> {
                u64::try_from(v)
                    .map(Size)
                    .map_err(|_| E::custom(size_hint(&v.to_string())))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Size, E> {
                Size::parse(v).map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

/// What the profile says about the kernel.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KernelSection {
    /// Kernel source: a tarball or an unpacked tree. Ignored with `prebuilt`.
    #[serde(default)]
    pub source: Option<PathBuf>,
    /// A prebuilt bzImage; its `.config` must be given as `prebuilt_config`.
    #[serde(default)]
    pub prebuilt: Option<PathBuf>,
    #[serde(default)]
    pub prebuilt_config: Option<PathBuf>,
    /// Config fragments merged in order onto tinyconfig.
    #[serde(default)]
    pub fragments: Vec<PathBuf>,
    /// The KSPP rule table.
    pub rules: PathBuf,
    /// Files of waivers (`- option: …\n  reason: …`).
    #[serde(default)]
    pub waiver_files: Vec<PathBuf>,
    /// Inline waivers.
    #[serde(default)]
    pub waivers: Vec<WaiverEntry>,
    /// Kernel command line, one argument per item.
    #[serde(default)]
    pub cmdline: Vec<String>,
    /// A secret seed for the randstruct GCC plugin (default: derived).
    #[serde(default)]
    pub randstruct_seed: Option<PathBuf>,
    /// The kernel's build timestamp (KBUILD_BUILD_TIMESTAMP), in seconds
    /// since 1970. Kept apart from the image's SOURCE_DATE_EPOCH so that the
    /// cached kernel survives new commits.
    #[serde(default)]
    pub build_epoch: u64,
    /// A directory of firmware files for the kernel's drivers, laid out as
    /// linux-firmware is (`rtl_nic/rtl8168h-2.fw`): its regular files go
    /// under `/lib/firmware` in the root filesystem
    /// (`crate::build::firmware_files`).
    #[serde(default)]
    pub firmware: Option<PathBuf>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WaiverEntry {
    pub option: String,
    pub reason: String,
}

/// The runtime embedded in the image.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuntimeSection {
    /// Build the runtime from this cargo package directory.
    #[serde(default)]
    pub cargo_package: Option<PathBuf>,
    /// Or use this prebuilt static binary.
    #[serde(default)]
    pub binary: Option<PathBuf>,
    /// Static files of the root filesystem.
    pub skeleton: PathBuf,
    /// The root filesystem's manifest (`rootfs/skeleton.txt`): every
    /// directory and file with its mode; see `contract::skeleton`.
    pub manifest: PathBuf,
}

/// The installer binary of the installer image (output `installer`): the
/// static `imager`, which acts as the installer when run as `installer`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InstallerSection {
    /// Build it from this cargo package directory (the `imager` package).
    #[serde(default)]
    pub cargo_package: Option<PathBuf>,
    /// Or use this prebuilt static binary.
    #[serde(default)]
    pub binary: Option<PathBuf>,
    /// The installer image's name in `installer.tar`: `REGISTRY/NAME` or
    /// `REGISTRY/NAME:TAG` (the tag defaults to the version). Default
    /// `localhost/NAME/installer` with the profile's name, which is what
    /// `podman load` calls it.
    #[serde(default)]
    pub image: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BootSection {
    /// systemd-boot's EFI binary: by default the architecture's from
    /// Debian's systemd-boot-efi ([`BootSection::default_systemd_boot`]).
    #[serde(default)]
    pub systemd_boot: PathBuf,
    /// GRUB's i386-pc directory (boot.img, the modules, for the BIOS path).
    #[serde(default = "default_grub_dir")]
    pub grub_dir: PathBuf,
    /// Boot each slot from a Unified Kernel Image (a type #2 entry in
    /// BOOT's `EFI/Linux`, the command line inside it) rather than a
    /// `.conf` entry naming the kernel and initramfs. UEFI only: the disk
    /// gets no BIOS boot.
    #[serde(default)]
    pub uki: bool,
    /// systemd's EFI stub the UKIs are made from: by default the
    /// architecture's ([`BootSection::default_stub`]).
    #[serde(default)]
    pub stub: PathBuf,
}

impl BootSection {
    /// systemd-boot for `arch` as Debian's systemd-boot-efi installs it,
    /// under the architecture's root ([`crate::closure::host_root`]):
    /// `/usr/lib/systemd/boot/efi/systemd-bootx64.efi` on this host,
    /// `systemd-bootaa64.efi` from arm64's unpacked package.
    pub fn default_systemd_boot(arch: contract::Arch) -> PathBuf {
        crate::closure::host_root(arch).join(format!(
            "usr/lib/systemd/boot/efi/systemd-boot{}.efi",
            arch.spec().efi_suffix
        ))
    }

    /// systemd's UKI stub for `arch` (`linuxx64.efi.stub`,
    /// `linuxaa64.efi.stub`), as [`BootSection::default_systemd_boot`].
    pub fn default_stub(arch: contract::Arch) -> PathBuf {
        crate::closure::host_root(arch).join(format!(
            "usr/lib/systemd/boot/efi/linux{}.efi.stub",
            arch.spec().efi_suffix
        ))
    }

    /// Fills the paths the profile left out with `arch`'s defaults (an
    /// empty path is one left out).
    pub(crate) fn fill_defaults(&mut self, arch: contract::Arch) {
        if self.systemd_boot.as_os_str().is_empty() {
            self.systemd_boot = Self::default_systemd_boot(arch);
        }
        if self.stub.as_os_str().is_empty() {
            self.stub = Self::default_stub(arch);
        }
    }
}

fn default_grub_dir() -> PathBuf {
    PathBuf::from(crate::grub::DEFAULT_DIR)
}

impl Default for BootSection {
    fn default() -> Self {
        BootSection {
            systemd_boot: PathBuf::new(),
            grub_dir: default_grub_dir(),
            uki: false,
            stub: PathBuf::new(),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiskSection {
    #[serde(default = "default_disk_size")]
    pub size: Size,
    #[serde(default = "default_sector_size")]
    pub sector_size: u64,
    /// Size overrides of the resizable partitions.
    #[serde(default)]
    pub partitions: PartitionSizes,
    /// Set the boot indicator (0x80) on the protective MBR's partition
    /// entry: some BIOSes boot only a disk with an active partition, some
    /// UEFI firmware refuses a protective MBR with one.
    #[serde(default)]
    pub bios_boot_flag: bool,
}

/// Sizes of the partitions a profile may resize (labels as on disk; BIOS and
/// META are fixed, EPHEMERAL takes the rest).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PartitionSizes {
    #[serde(rename = "EFI", default)]
    pub efi: Option<Size>,
    #[serde(rename = "BOOT", default)]
    pub boot: Option<Size>,
    #[serde(rename = "STATE", default)]
    pub state: Option<Size>,
}

fn default_disk_size() -> Size {
    Size(contract::partition::DEFAULT_DISK_SIZE)
}
fn default_sector_size() -> u64 {
    512
}

impl Default for DiskSection {
    fn default() -> Self {
        DiskSection {
            size: default_disk_size(),
            sector_size: default_sector_size(),
            partitions: PartitionSizes::default(),
            bios_boot_flag: false,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct SigningSection {
    /// The signing key: a PKCS#8 PEM ed25519 private key file, a PKCS#11
    /// URI (`pkcs11:…`) or an external signer (`exec:PROGRAM`); see
    /// [`crate::sign::KeyRef`]. Without it a development key is used.
    #[serde(default)]
    pub key: Option<PathBuf>,
    /// More keys that sign the manifests (`manifest.json.sigs`), named as
    /// `key` is: with it, the signatures a root of trust's threshold asks
    /// for (docs/signing.md, "The root of trust"). At most 8.
    #[serde(default)]
    pub cosigners: Vec<PathBuf>,
    /// The root of trust the build's disks start with and its payloads
    /// carry (`root.json` from `imager root init`; its signatures, from
    /// `imager root sign`, in `root.json.sigs` beside it). A disk whose
    /// root is the version before takes it when the upgrade is blessed.
    /// Without it, disks trust the signing key alone.
    #[serde(default)]
    pub root: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Output {
    /// The raw GPT disk image (`disk.raw`).
    Raw,
    /// The same disk as a fixed VHD (`disk.vhd`), for clouds that take it.
    Vhd,
    /// The same disk as a qcow2 image (`disk.qcow2`), for QEMU and
    /// libvirt.
    Qcow2,
    /// The raw disk compressed with zstd (`disk.raw.zst`).
    #[serde(rename = "raw.zst")]
    RawZst,
    /// The raw disk compressed with xz (`disk.raw.xz`).
    #[serde(rename = "raw.xz")]
    RawXz,
    /// The disk for Google Compute Engine (`gcp.tar.gz`): platform rules
    /// in `imager::disk::platform`.
    Gcp,
    /// The disk for Azure, a fixed VHD (`azure.vhd`).
    Azure,
    /// The OVF package for VMware (`vmware.ova`).
    Vmware,
    /// The disk for AWS, a stream-optimised VMDK (`aws.vmdk`).
    Aws,
    /// The installer container image, an OCI archive (`installer.tar`).
    Installer,
    /// The hybrid live ISO (`live.iso`): boots from CD and USB under BIOS
    /// and UEFI, and installs.
    Iso,
    /// The slots' Unified Kernel Images (`uki-a.efi`, `uki-b.efi`).
    Uki,
}

impl Output {
    /// The disk outputs: the raw disk and the formats made from it.
    pub const DISKS: [Output; 9] = [
        Output::Raw,
        Output::Vhd,
        Output::Qcow2,
        Output::RawZst,
        Output::RawXz,
        Output::Gcp,
        Output::Azure,
        Output::Vmware,
        Output::Aws,
    ];

    /// Whether this is one of [`Output::DISKS`].
    pub fn is_disk(self) -> bool {
        Output::DISKS.contains(&self)
    }

    /// The name as written in a profile.
    pub fn name(self) -> &'static str {
        match self {
            Output::Raw => "raw",
            Output::Vhd => "vhd",
            Output::Qcow2 => "qcow2",
            Output::RawZst => "raw.zst",
            Output::RawXz => "raw.xz",
            Output::Gcp => "gcp",
            Output::Azure => "azure",
            Output::Vmware => "vmware",
            Output::Aws => "aws",
            Output::Installer => "installer",
            Output::Iso => "iso",
            Output::Uki => "uki",
        }
    }
}

/// Secure Boot (`docs/secureboot.md`): the slots boot UKIs signed with the
/// db key, systemd-boot is signed too, and the ESP carries the signed
/// variable updates that enrol the keys.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecureBootSection {
    /// The key directory of `imager keygen --secure-boot`. Without it the
    /// development keys (`out/keys/secureboot`, made on first use).
    #[serde(default)]
    pub keys: Option<PathBuf>,
    /// Where the private halves of `PK`, `KEK` and `db` are, when not in
    /// the key directory's `NAME.key`: a key file, a PKCS#11 URI or an
    /// external signer (`exec:PROGRAM`), as `signing.key` (docs/signing.md);
    /// the directory then holds the certificates.
    #[serde(default)]
    pub signers: std::collections::BTreeMap<String, PathBuf>,
    /// systemd-boot's `secure-boot-enroll`: `force` (default), `manual`
    /// or `off`.
    #[serde(default)]
    pub enroll: Option<String>,
    /// Signed appends to firmware's db and dbx that this version wants in
    /// firmware (`db.append.auth`, `dbx.append.auth` from `imager
    /// secureboot enrol-files --add-db/--revoke`): the runtime writes them
    /// once the version is blessed (docs/secureboot.md, "Rotating the db
    /// key and revoking UKIs").
    #[serde(default)]
    pub updates: Vec<PathBuf>,
}

impl SecureBootSection {
    /// The enrolment mode written to loader.conf.
    pub fn enroll_mode(&self) -> &str {
        self.enroll.as_deref().unwrap_or("force")
    }
}

/// A build cache shared through a registry (docs/build-cache.md).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CacheSection {
    /// `REGISTRY/NAME`: the repository of the cache's entries
    /// (`--cache-registry` overrides it).
    #[serde(default)]
    pub registry: Option<String>,
    /// Public keys (PEM) whose entries are trusted, beside the build's own
    /// signing key.
    #[serde(default)]
    pub trusted_keys: Vec<PathBuf>,
    /// Speak plain HTTP to the registry (a local `docker-registry`).
    #[serde(default)]
    pub plain_http: bool,
    /// PEM CA certificates for the registry's HTTPS, instead of the
    /// Mozilla roots.
    #[serde(default)]
    pub ca: Option<PathBuf>,
}

/// The node API (docs/node-api.md).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeApiSection {
    /// The cluster CA's certificate (`ca.crt` of `imager node
    /// credentials`): the image carries it, and a disk built or installed
    /// from it keeps it in META (`node-ca`), so that its API admits only
    /// clients of this CA once `imager node provision` has given it its
    /// own certificate and key.
    #[serde(default)]
    pub ca: Option<PathBuf>,
    /// Registries (`HOST:PORT`) the node may pull installer images from
    /// over plain HTTP (`machined.plain_http=` on the signed command
    /// line); every other registry over HTTPS only.
    #[serde(default)]
    pub plain_http_registries: Vec<String>,
}

/// The live system of the ISO.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LiveSection {
    /// Install onto this disk when the ISO boots (`machined.install=`): a
    /// kernel name (`vdb`), `/dev/NAME`, `serial:S`, `wwn:W` or a
    /// `/dev/disk/by-id/` path.
    #[serde(default)]
    pub install: Option<String>,
    /// Wipe the install target even if it holds data
    /// (`machined.install.wipe=1`).
    #[serde(default)]
    pub wipe: bool,
    /// The installed node's own settings ([`contract::settings`]), written
    /// into its META: hostname (`machined.install.hostname=`), network
    /// (`machined.install.net=`: `IFACE:dhcp` or
    /// `IFACE:ADDRESS/PREFIX[:GATEWAY]`), DNS servers
    /// (`machined.install.dns=`, comma-separated).
    #[serde(default)]
    pub hostname: Option<String>,
    #[serde(default)]
    pub net: Option<String>,
    #[serde(default)]
    pub dns: Option<String>,
}

impl LiveSection {
    /// The installed node's settings given: the profile's key, the live
    /// installer's kernel argument, the value.
    pub fn settings_args(&self) -> Vec<(&'static str, &'static str, &str)> {
        use contract::cmdline::{INSTALL_DNS, INSTALL_HOSTNAME, INSTALL_NET};
        [
            ("live.hostname", INSTALL_HOSTNAME, &self.hostname),
            ("live.net", INSTALL_NET, &self.net),
            ("live.dns", INSTALL_DNS, &self.dns),
        ]
        .into_iter()
        .filter_map(|(key, arg, v)| v.as_deref().map(|v| (key, arg, v)))
        .collect()
    }
}

/// The image's default IPv4 configuration, rendered onto the kernel
/// command line as `machined.net=` ([`contract::net::NetConfig::arg`]): by
/// DHCP (`dhcp: true`) or a static `address`. A node's own settings in
/// META come first (`imager node provision --net`, [`contract::settings`]).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkSection {
    /// The interface, as the kernel names it (`eth0`).
    pub interface: String,
    /// The address by DHCP.
    #[serde(default)]
    pub dhcp: bool,
    /// `ADDRESS/PREFIX` (`10.0.2.15/24`), when not by DHCP.
    #[serde(default)]
    pub address: Option<String>,
    /// The default route's gateway, inside the subnet; none: no default
    /// route. Only with `address`.
    #[serde(default)]
    pub gateway: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompressionSection {
    #[serde(default = "default_initramfs_level")]
    pub initramfs_zstd_level: i32,
    #[serde(default = "default_rootfs_level")]
    pub rootfs_zstd_level: i32,
}
fn default_initramfs_level() -> i32 {
    3
}
fn default_rootfs_level() -> i32 {
    15
}
impl Default for CompressionSection {
    fn default() -> Self {
        CompressionSection {
            initramfs_zstd_level: default_initramfs_level(),
            rootfs_zstd_level: default_rootfs_level(),
        }
    }
}
