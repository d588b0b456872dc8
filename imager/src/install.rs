//! `imager install`, `upgrade` and `rollback`: the installer.
//!
//! The same code runs from the host on a disk image file and, inside the
//! installer container (where the binary is called `installer`), on a block
//! device. The payload — kernel, initramfs and their signed manifest — comes
//! from an installer image (an OCI archive) or a directory holding it.
//!
//! Before its first write, an upgrade checks that the payload's manifest is
//! signed by a key the disk trusts (META's `trusted-keys`), that the files
//! match it, and that BOOT has room; the writes themselves are ordered by
//! [`bootstate::ops`] so that a power cut at any point leaves a disk that
//! boots one of the two versions.

use crate::artifact::Kind;
use crate::disk::{self, Layout};
use crate::io::Window;
use crate::sign::{self, Manifest};
use crate::{boot, oci};
use anyhow::{Context, Result, bail, ensure};
use bootstate::disk::{Access, Disk};
use bootstate::fat::BootFs;
use bootstate::ops::{self, Payload, PayloadFile};
use contract::meta::Tag;
use contract::partition::PartitionRole;
use contract::{Slot, paths};
use payload::root::Root;
use payload::trust::TrustFiles;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

/// Where the installer finds its own payload inside the container: its
/// own architecture's.
pub fn builtin_payload() -> PathBuf {
    Path::new("/").join(paths::installer_payload_dir(contract::Arch::NATIVE))
}

/// What `imager upgrade` is asked to do.
#[derive(Debug, Clone)]
pub struct UpgradeOptions {
    /// Installer image (OCI archive) or payload directory.
    pub installer: PathBuf,
    /// Disk image file or block device.
    pub disk: PathBuf,
    /// Boots the new slot is tried before systemd-boot falls back (1 to 99).
    pub tries: u32,
    /// Let the upgrade take a Secure Boot disk out of Secure Boot (META's
    /// `secure-boot` record goes once the new version is blessed), or move
    /// a disk without it into Secure Boot
    /// ([`bootstate::ops::upgrade_into_secure_boot`]); refused without.
    pub change_secure_boot: bool,
    /// Install a payload of a lower security version than the disk's floor
    /// ([`contract::version::check_security`]); refused without.
    pub allow_downgrade: bool,
}

/// What `imager install` is asked to do.
#[derive(Debug, Clone)]
pub struct InstallOptions {
    /// Installer image (OCI archive) or payload directory.
    pub installer: PathBuf,
    /// Disk image file (created if missing) or block device.
    pub disk: PathBuf,
    /// Size of a new disk image file, e.g. "2GiB" (default: the existing
    /// file's size, else 2 GiB).
    pub size: Option<String>,
    /// Logical sector size of a disk image file, 512 (the default) or 4096;
    /// a block device has its own.
    pub sector_size: Option<u64>,
    /// Public key the payload must be signed with (default: the
    /// development key).
    pub key: Option<PathBuf>,
    /// Overwrite a disk that holds data ([`bootstate::blank`]); without it
    /// such a disk (block device or image file) is refused.
    pub wipe: bool,
    /// The node's own settings, written into META with the install.
    pub settings: Option<contract::settings::Settings>,
    /// The architecture the disk is for: the installer image's payload of
    /// that platform is installed (`--arch`; by default the machine's own,
    /// [`contract::Arch::NATIVE`], what an installer running on its target
    /// wants).
    pub arch: contract::Arch,
}

/// What `imager rollback` is asked to do.
#[derive(Debug, Clone)]
pub struct RollbackOptions {
    /// Disk image file or block device.
    pub disk: PathBuf,
    /// Roll back to a slot known to be bad (it gets boot counting).
    pub force: bool,
    /// Roll back to a slot of a lower security version than the disk's
    /// floor; refused without.
    pub allow_downgrade: bool,
}

/// The payload of an installer, extracted (if needed) and verified.
#[derive(Debug)]
pub struct VerifiedPayload {
    pub payload: Payload,
    pub manifest: Manifest,
    /// A Secure Boot payload's enrolment files (`PK.auth`, `KEK.auth`,
    /// `db.auth`), checked against their signed digests; empty otherwise.
    pub enrolment: NamedFiles,
    /// The keys whose signatures counted, by key id.
    pub signers: Vec<String>,
    /// The root of trust it was checked against (before the one it
    /// brings).
    pub root: Root,
    /// The next root of trust it brings, accepted by the disk's root: the
    /// disk takes it with the payload (an upgrade: once blessed).
    pub next_root: Option<Root>,
    /// The node API's cluster CA certificate it carries, if any: an
    /// install keeps it in META.
    pub node_ca: Option<String>,
    /// Keeps an extracted archive alive while the payload is used.
    _work: Option<tempfile::TempDir>,
}

/// Finds the payload directory of `installer`: the directory itself, or
/// the payload of an OCI archive extracted into a temporary directory. An
/// archive's signed manifest is verified against `root` before anything
/// else is read from it (see [`oci::extract_payload`]).
fn payload_dir(
    installer: &Path,
    arch: contract::Arch,
    anchor: Anchor,
) -> Result<(PathBuf, Option<tempfile::TempDir>)> {
    if installer.is_dir() {
        return Ok((installer.to_path_buf(), None));
    }
    if !installer.exists() {
        bail!(
            "installer {} not found: pass an installer image (installer.tar from \
             `imager build --profile installer`) or a payload directory",
            installer.display()
        );
    }
    let work = tempfile::tempdir().context("creating a temporary directory")?;
    let verify =
        |files: &TrustFiles| payload::trust::verify(&anchor(files)?, files).map(|t| t.manifest);
    let dir = oci::extract_payload(installer, work.path(), arch, &verify).with_context(|| {
        format!(
            "reading {} as an installer image (an OCI archive such as installer.tar; or pass \
             a payload directory)",
            installer.display()
        )
    })?;
    Ok((dir, Some(work)))
}

/// The root of trust a payload is checked against, given its trust files:
/// a disk's ([`payload::trust::disk_root`]), or a fresh install's
/// ([`payload::trust::install_root`]).
pub type Anchor<'a> = &'a dyn Fn(&TrustFiles) -> Result<Root>;

/// Loads the payload of `installer` and verifies it against the root of
/// trust `anchor` gives ([`payload::trust`]): the manifest's signatures
/// and the root it may bring, then every file's size and digest but the
/// images' ([`sign::verify_payload`]: an upgrade from a build's output
/// directory does not hash its 2 GiB disk). From an archive, the
/// signatures are checked before the payload is unpacked. The payload is
/// `arch`'s (an image index's manifest of that platform), and its signed
/// manifest must say so ([`payload::verify::check_arch`]).
pub fn load_payload(
    installer: &Path,
    arch: contract::Arch,
    anchor: Anchor,
) -> Result<VerifiedPayload> {
    let (dir, work) = payload_dir(installer, arch, anchor)?;
    let root = anchor(&TrustFiles::read_dir(&dir)?)?;
    let (report, trusted) = sign::verify_payload(&dir, &root)?;
    report
        .ensure_ok()
        .context("the installer's payload does not match its signed manifest")?;
    let manifest = trusted.manifest;
    payload::verify::check_arch(&manifest, arch).context("the installer")?;
    // The version goes into a boot entry line and META's records.
    if manifest.version.is_empty()
        || manifest
            .version
            .chars()
            .any(|c| c.is_whitespace() || c.is_control())
    {
        bail!(
            "the payload's version {:?} is empty or has spaces or control characters",
            manifest.version
        );
    }
    // The files are used from here on; what was verified is their digests,
    // and every file written to BOOT is read back against them.
    let file = |kind: Kind| -> Result<PayloadFile> {
        let a = manifest
            .artifacts
            .iter()
            .find(|a| a.kind == kind)
            .with_context(|| format!("the payload manifest lists no {}", kind.name()))?;
        Ok(PayloadFile {
            path: dir.join(&a.path),
            sha256: a.sha256.clone(),
            len: a.size,
        })
    };
    let boot = manifest.boot.clone().context(
        "the payload manifest has no `boot` section (title, cmdline): it was made by an \
         older imager; rebuild the installer",
    )?;
    let ukis = payload_ukis(&manifest, &dir)?;
    let (secure_boot, enrolment, node_ca) = secure_boot_parts(&manifest, &dir)?;
    ensure!(
        secure_boot.is_none() || ukis.is_some(),
        "the payload has a Secure Boot db certificate but no UKIs to boot: rebuild the installer"
    );
    let secure_boot_updates = updates_of(&manifest, &dir, ukis.as_ref())?;
    let payload = Payload {
        version: manifest.version.clone(),
        security_version: manifest.security_version,
        title: boot.title,
        cmdline: boot.cmdline,
        kernel: file(Kind::Kernel)?,
        initramfs: file(Kind::Initramfs)?,
        ukis,
        secure_boot,
        next_root: trusted.next_root.as_ref().map(Root::to_bytes),
        secure_boot_updates,
    };
    Ok(VerifiedPayload {
        payload,
        manifest,
        enrolment,
        signers: trusted.signers,
        next_root: trusted.next_root,
        root,
        node_ca,
        _work: work,
    })
}

/// The small payload file `a` (at most `max` bytes), read whole and
/// checked against its signed size and digest.
fn read_signed(dir: &Path, a: &crate::artifact::Artifact, max: u64, what: &str) -> Result<Vec<u8>> {
    let path = dir.join(&a.path);
    let bytes = crate::input::read_head(&path, what, max + 1)?;
    let sha = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&bytes));
    ensure!(
        bytes.len() as u64 == a.size && a.size <= max && sha == a.sha256,
        "{} in the payload is not the signed file ({} bytes, sha256 {sha}; signed: {} \
         bytes, {}): the installer image was changed; nothing was written",
        a.path,
        bytes.len(),
        a.size,
        a.sha256
    );
    Ok(bytes)
}

/// META's record of the Secure Boot updates a payload carries, checked
/// against its own boot loader and UKIs (`payload::secureboot::updates`).
fn updates_of(
    manifest: &Manifest,
    dir: &Path,
    ukis: Option<&bootstate::ops::SlotUkis>,
) -> Result<Option<String>> {
    let mut files = Vec::new();
    for a in &manifest.artifacts {
        if a.kind == Kind::SecureBootUpdate {
            let bytes = read_signed(
                dir,
                a,
                payload::efivar::MAX_LEN as u64,
                "Secure Boot update",
            )?;
            files.push((a.path.clone(), bytes));
        }
    }
    if files.is_empty() {
        return Ok(None);
    }
    let loader = loader_of(manifest, dir).map(|l| l.path);
    let ukis = ukis.map(|u| [u.a.path.as_path(), u.b.path.as_path()]);
    let r = payload::secureboot::updates(&manifest.version, files, loader.as_deref(), ukis)
        .context("the payload's Secure Boot updates")?;
    Ok(r.map(|r| r.to_meta()))
}

/// The slots' UKIs a payload lists, when its slots boot them: both, or
/// neither.
fn payload_ukis(manifest: &Manifest, dir: &Path) -> Result<Option<bootstate::ops::SlotUkis>> {
    let uki = |slot: Slot| -> Option<PayloadFile> {
        let name = paths::output::uki(slot);
        manifest
            .artifacts
            .iter()
            .find(|a| a.kind == Kind::Uki && a.path == name)
            .map(|a| PayloadFile {
                path: dir.join(&a.path),
                sha256: a.sha256.clone(),
                len: a.size,
            })
    };
    Ok(match (uki(Slot::A), uki(Slot::B)) {
        (Some(a), Some(b)) => Some(bootstate::ops::SlotUkis { a, b }),
        (None, None) => None,
        _ => bail!(
            "the payload manifest lists the UKI of one slot but not the other ({} and {} \
             go together): rebuild the installer",
            paths::output::UKI_A,
            paths::output::UKI_B
        ),
    })
}

/// Named files read whole: a Secure Boot payload's enrolment files.
type NamedFiles = Vec<(String, Vec<u8>)>;

/// A Secure Boot payload's db certificate (PEM) and enrolment files, read
/// whole and checked against their signed digests; `(None, [])` for a
/// payload without Secure Boot.
/// And the node API's cluster CA certificate, when the payload carries one.
fn secure_boot_parts(
    manifest: &Manifest,
    dir: &Path,
) -> Result<(Option<String>, NamedFiles, Option<String>)> {
    let read = |a: &crate::artifact::Artifact| read_signed(dir, a, 64 * 1024, "payload file");
    let mut db = None;
    let mut enrolment = Vec::new();
    let mut node_ca = None;
    for a in &manifest.artifacts {
        match a.kind {
            Kind::SecureBootDb => {
                let pem = String::from_utf8(read(a)?)
                    .context("the payload's db certificate is not PEM text")?;
                crate::secureboot::keys::parse_cert(pem.as_bytes())
                    .context("the payload's db certificate")?;
                db = Some(pem);
            }
            Kind::SecureBootAuth => enrolment.push((a.path.clone(), read(a)?)),
            Kind::NodeCa => {
                let pem = String::from_utf8(read(a)?)
                    .context("the payload's node CA certificate is not PEM text")?;
                nodeapi::tls::certs(pem.as_bytes(), "payload's node CA certificate")?;
                node_ca = Some(pem);
            }
            _ => {}
        }
    }
    Ok((db, enrolment, node_ca))
}

/// BOOT, META and the ESP of a disk locked for one change
/// ([`bootstate::disk`]): the lock is held while `disk` lives.
#[derive(Debug)]
pub struct Slots {
    pub disk: Disk,
    /// BOOT, META and the ESP, each on its own handle (synced by
    /// bootstate where the order of its writes needs it).
    pub boot: Window<File>,
    pub meta: Window<File>,
    /// Written only by an upgrade into Secure Boot (its boot loader).
    /// `None` on a disk of 4096-byte sectors, whose ESP is BOOT itself
    /// ([`contract::partition::esp_role`]).
    pub esp: Option<Window<File>>,
}

/// Refuses a disk image file in a format that install, upgrade, rollback
/// and node provision cannot change in place (qcow2, zstd, xz: `imager build`'s
/// other disk outputs), saying how to make it raw. A raw disk, a fixed VHD
/// (a raw disk and a footer) and a block device pass.
pub fn require_raw(path: &Path) -> Result<()> {
    use crate::disk::compress::Format;
    if !std::fs::metadata(path).is_ok_and(|m| m.is_file()) {
        return Ok(());
    }
    let p = path.display();
    let how = match Format::of(path)? {
        Format::Raw => return Ok(()),
        Format::Qcow2 => {
            format!("a qcow2 image: make it raw with `qemu-img convert -O raw {p} disk.raw`")
        }
        Format::Zstd => format!("compressed with zstd: unpack it with `zstd -d {p} -o disk.raw`"),
        Format::Xz => format!("compressed with xz: unpack it with `xz -dc {p} > disk.raw`"),
        Format::Vmdk => {
            format!("a VMDK: make it raw with `qemu-img convert -O raw {p} disk.raw`")
        }
        Format::Ova => format!(
            "an OVA: take its disk out with `tar -xf {p} disk.vmdk` and make it raw with \
             `qemu-img convert -O raw disk.vmdk disk.raw`"
        ),
        Format::Gzip => format!("a gzip'd tar: `tar -xzf {p}` gives its disk.raw"),
    };
    bail!(
        "{p} is {how} (or build `raw` among the profile's outputs) and give that disk: \
         install, upgrade, rollback and node provision change raw disk images and block \
         devices in place (`imager install` onto a path that does not exist makes a new raw \
         disk). Nothing was written."
    )
}

/// Opens and locks `disk_path` for a change and finds BOOT, META and the
/// ESP.
pub fn open_slots(disk_path: &Path) -> Result<Slots> {
    require_raw(disk_path)?;
    let disk = Disk::open(disk_path, Access::Write)?;
    Ok(Slots {
        boot: disk.partition(PartitionRole::Boot)?,
        meta: disk.partition(PartitionRole::Meta)?,
        esp: disk.separate_esp()?,
        disk,
    })
}

/// What `imager upgrade` reports.
#[derive(Debug, Serialize)]
pub struct UpgradeReport {
    pub disk: String,
    pub from_slot: String,
    pub to_slot: String,
    pub from_version: String,
    pub to_version: String,
    pub entry: String,
    pub tries: u32,
    pub key_id: String,
    /// Bytes of kernel and initramfs written to BOOT.
    pub boot_bytes_written: u64,
    /// Everything written to the disk (boot files, FAT metadata, entries,
    /// META), in bytes and in write calls.
    pub disk_bytes_written: u64,
    pub disk_writes: u64,
}

/// The decision `payload::secureboot` makes for this disk and payload
/// (the node's pulls make the same), before anything is written; and the
/// disk's own dbx updates revoke none of the payload's UKIs and boot
/// loader.
fn check_secure_boot(
    meta: &contract::meta::Meta,
    p: &VerifiedPayload,
    change: bool,
) -> Result<payload::secureboot::Move> {
    let loader = match p.payload.secure_boot {
        Some(_) => Some(payload_loader(p)?.path),
        None => None,
    };
    let signed = payload::secureboot::Signed {
        db: p.payload.secure_boot.as_deref(),
        loader: loader.as_deref(),
        ukis: p
            .payload
            .ukis
            .as_ref()
            .map(|u| [u.a.path.as_path(), u.b.path.as_path()]),
    };
    // (What dbx revoked first: its message is the more precise.)
    payload::secureboot::check_disk_dbx(meta.get(Tag::SecureBootUpdates), signed)?;
    payload::secureboot::check(meta.get(Tag::SecureBoot), signed, change)
}

/// The payload's boot loader (its signed systemd-boot) in `dir`, as its
/// manifest lists it.
fn loader_of(manifest: &Manifest, dir: &Path) -> Option<PayloadFile> {
    let a = manifest
        .artifacts
        .iter()
        .find(|a| a.kind == Kind::BootLoader)?;
    Some(PayloadFile {
        path: dir.join(&a.path),
        sha256: a.sha256.clone(),
        len: a.size,
    })
}

/// [`loader_of`] a verified payload: a Secure Boot payload must have one.
fn payload_loader(p: &VerifiedPayload) -> Result<PayloadFile> {
    let dir = p.payload.kernel.path.parent().unwrap_or(Path::new("."));
    loader_of(&p.manifest, dir)
        .context("the Secure Boot payload carries no boot loader: rebuild the installer")
}

/// What an upgrade is allowed beyond the usual, each for this operation
/// only (an admin's flags).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Allowed {
    /// `--change-secure-boot`: move the disk into or out of Secure Boot.
    pub change_secure_boot: bool,
    /// `--allow-downgrade`: a payload below the disk's security floor.
    pub downgrade: bool,
}

/// Upgrades the disk whose BOOT, META and ESP are `boot_dev`, `meta_dev`
/// and `esp_dev` (`None` where BOOT is the ESP), and which boots
/// `disk_arch` (`Disk::arch`): the installer's payload of that
/// architecture is taken, another refused. The ESP's boot loader is
/// written only on a Secure Boot disk: by an upgrade into Secure Boot, or
/// when the payload's signed boot loader is not the ESP's.
pub fn upgrade_on<B: bootstate::Device, M: bootstate::Device, E: bootstate::Device>(
    boot_dev: B,
    meta_dev: &mut M,
    esp_dev: Option<E>,
    disk_arch: contract::Arch,
    installer: &Path,
    tries: u32,
    allowed: Allowed,
) -> Result<(ops::Upgraded, VerifiedPayload)> {
    let (meta, _) = bootstate::meta::read(meta_dev).context("reading META")?;
    let root = payload::trust::disk_root(&meta)?;
    let p = load_payload(installer, disk_arch, &|_| Ok(root.clone()))?;
    let asked = payload::verify::Asked {
        version: None,
        allow_downgrade: allowed.downgrade,
    };
    payload::verify::check_for_disk(&meta, disk_arch, &p.manifest, asked)
        .context("the installer")?;
    let epoch = p.manifest.source_date_epoch;
    let mut boot = BootFs::new(boot_dev, epoch);
    use payload::secureboot::Move;
    let up = match check_secure_boot(&meta, &p, allowed.change_secure_boot)? {
        Move::None | Move::Leave => ops::upgrade(&mut boot, meta_dev, &p.payload, tries)?,
        // The payload's boot loader replaces the ESP's when it differs
        // (signed by a db key firmware holds, checked above).
        Move::Keep => {
            let loader = payload_loader(&p)?;
            let mut esp = esp_dev.map(|d| BootFs::new(d, epoch));
            ops::upgrade_with_loader(
                esp.as_mut(),
                &loader,
                &mut boot,
                meta_dev,
                &p.payload,
                tries,
            )?
        }
        Move::Enter => {
            let Some(esp_dev) = esp_dev else {
                bail!(
                    "this disk has 4096-byte sectors, where BOOT is the ESP: it enters Secure \
                     Boot by an install from the Secure Boot installer (`imager install`), \
                     not by an upgrade; nothing was written"
                );
            };
            let mut esp = BootFs::new(esp_dev, epoch);
            let loader = payload_loader(&p)?;
            ops::upgrade_into_secure_boot(&mut esp, &loader, &mut boot, meta_dev, &p.payload, tries)
                .context("moving the disk into Secure Boot")?
        }
    };
    Ok((up, p))
}

pub fn run_upgrade(a: &UpgradeOptions) -> Result<UpgradeReport> {
    let slots = open_slots(&a.disk)?;
    let disk_arch = slots.disk.arch()?;
    // Counted, to report what an upgrade costs the disk.
    let boot = bootstate::Faulty::counting(slots.boot);
    let mut meta = boot.share(slots.meta);
    let esp = slots.esp.map(|e| boot.share(e));
    let (up, p) = upgrade_on(
        boot,
        &mut meta,
        esp,
        disk_arch,
        &a.installer,
        a.tries,
        Allowed {
            change_secure_boot: a.change_secure_boot,
            downgrade: a.allow_downgrade,
        },
    )?;
    Ok(UpgradeReport {
        disk: a.disk.display().to_string(),
        from_slot: up.from.to_string(),
        to_slot: up.to.to_string(),
        from_version: up.from_version,
        to_version: p.payload.version.clone(),
        entry: up.entry.file_name(),
        tries: a.tries,
        key_id: p.signers.join(", "),
        boot_bytes_written: up.bytes_written,
        disk_bytes_written: meta.bytes_written(),
        disk_writes: meta.writes(),
    })
}

/// What `imager rollback` reports.
#[derive(Debug, Serialize)]
pub struct RollbackReport {
    pub disk: String,
    pub from_slot: String,
    pub to_slot: String,
    pub version: String,
    pub entry: String,
    pub forced: bool,
}

pub fn run_rollback(a: &RollbackOptions) -> Result<RollbackReport> {
    let mut slots = open_slots(&a.disk)?;
    // (A slot whose UKI the disk's dbx updates revoke is refused, forced or
    // not: firmware refuses it whatever the entry says.)
    let r = ops::rollback_checked(
        &mut BootFs::new(slots.boot, 0),
        &mut slots.meta,
        a.force,
        a.allow_downgrade,
        &payload::secureboot::check_rollback,
    )?;
    Ok(RollbackReport {
        disk: a.disk.display().to_string(),
        from_slot: r.from.to_string(),
        to_slot: r.to.to_string(),
        version: r.version,
        entry: r.entry.file_name(),
        forced: a.force,
    })
}

/// What `imager install` reports.
#[derive(Debug, Serialize)]
pub struct InstallReport {
    pub disk: String,
    pub size: u64,
    pub version: String,
    pub slot: String,
    pub key_id: String,
    /// Whether GRUB was written (the payload carries it): the disk boots
    /// under BIOS too.
    pub bios_boot: bool,
}

/// Lays out `disk` (an image file, replaced atomically; or a block device,
/// written in place with the partition table last) and installs the
/// payload into slot A.
pub fn run_install(a: &InstallOptions) -> Result<InstallReport> {
    let installer = a.installer.as_path();
    let key = match &a.key {
        Some(k) => sign::load_public_key(k)?,
        None => sign::load_public_key(&sign::default_dev_pub()).context(
            "no --key given and no development key found: pass --key with the public key \
             that signed the installer",
        )?,
    };
    let p = load_payload(installer, a.arch, &|files| {
        payload::trust::install_root(&key, files)
    })
    .with_context(|| format!("installing the {} payload (--arch)", a.arch))?;
    let exists = std::fs::symlink_metadata(&a.disk).is_ok();
    // An existing disk is locked for the install (and must be a file or a
    // block device): no upgrade may run on it meanwhile.
    let lock = if exists {
        bootstate::disk::check_kind(&a.disk)?;
        require_raw(&a.disk)?;
        let f = File::open(&a.disk).with_context(|| format!("opening {}", a.disk.display()))?;
        bootstate::disk::lock(&f, &a.disk, Access::Write)?;
        Some(f)
    } else {
        None
    };
    let is_block = std::fs::metadata(&a.disk)
        .map(|m| std::os::unix::fs::FileTypeExt::is_block_device(&m.file_type()))
        .unwrap_or(false);
    let size = match (&a.size, &lock) {
        (Some(s), _) if !is_block => {
            crate::profile::Size::parse(s)
                .map_err(anyhow::Error::msg)?
                .0
        }
        (Some(_), _) => bail!("--size is for image files: a block device has its own size"),
        (None, Some(f)) => {
            let mut f = f;
            disk::gpt::device_size(&mut f)
                .with_context(|| format!("finding the size of {}", a.disk.display()))?
        }
        (None, None) => contract::partition::DEFAULT_DISK_SIZE,
    };
    let own_sector_size = if exists {
        bootstate::disk::logical_sector_size(&a.disk)?
    } else {
        None
    };
    let sector_size = match (own_sector_size, a.sector_size) {
        (Some(own), Some(asked)) if own != asked => bail!(
            "{} has {own}-byte sectors: a block device has its own sector size; leave out \
             --sector-size {asked}",
            a.disk.display()
        ),
        (Some(own), _) => own,
        (None, asked) => asked.unwrap_or(512),
    };
    // Too small first: --wipe would not help.
    let layout = Layout::new(size, sector_size, &BTreeMap::new())
        .map_err(|e| install_layout_error(e, &a.disk, is_block, a.size.is_some()))?;
    if let Some(f) = &lock {
        refuse_data(f, &a.disk, a.wipe)?;
    }
    let esp = match &p.payload.secure_boot {
        Some(db) => secure_esp(&p, db, a.arch)?,
        None => boot::esp_files(&systemd_boot_for(&p, a.arch), a.arch)?,
    };
    // The entry as an upgrade writes it (title from the manifest's boot.title).
    let boot_files = boot::initial_boot_files(&p.payload)?;
    let mut meta = bootstate::meta::initial(
        &p.manifest.name,
        &p.payload.version,
        p.payload.security_version,
        &[sign::public_key_pem(&key)?],
        "install",
    );
    // A payload whose own root holds the key, or that brings one the key
    // accepted, installs the disk with that root (and `trusted-keys`
    // goes): no blessing is needed on a new disk, whose slot A counts as
    // good.
    let root = p.next_root.as_ref().unwrap_or(&p.root);
    if *root != payload::trust::key_root(&[key])? {
        bootstate::meta::set_root(&mut meta, &root.to_bytes());
    }
    if let Some(db) = &p.payload.secure_boot {
        meta.set(Tag::SecureBoot, db.as_bytes());
        if let Some(u) = &p.payload.secure_boot_updates {
            meta.set(Tag::SecureBootUpdates, u.as_bytes());
        }
    }
    if let Some(ca) = &p.node_ca {
        meta.set(Tag::NodeCa, ca.as_bytes());
    }
    if let Some(s) = &a.settings {
        meta.set(Tag::NodeSettings, s.render());
    }
    // Every installation its own disk GUID (its partitions' are derived
    // from it): two installs from one installer image never share one.
    let guid = contract::guid::installed({
        let mut b = [0u8; 16];
        rand_core::RngCore::fill_bytes(&mut rand_core::OsRng, &mut b);
        b
    });
    let epoch = p.manifest.source_date_epoch;
    let target = if is_block {
        boot::DiskTarget::InPlace
    } else {
        boot::DiskTarget::NewImage
    };
    // GRUB from the payload (the installer container has no grub-mkimage);
    // a payload without it installs a disk that boots under UEFI only, as
    // does one whose slots boot UKIs, and any disk of 4096-byte sectors
    // (BIOS reads 512-byte sectors: docs/design.md, "Booting (BIOS)").
    let grub = grub_for(&p)?.filter(|_| p.payload.ukis.is_none() && sector_size == 512);
    let bios = grub.as_ref().map(|grub| disk::BiosBoot {
        grub,
        boot_flag: false,
    });
    boot::write_raw_image(
        &a.disk, target, &layout, guid, esp, boot_files, &meta, bios, epoch,
    )?;
    drop(lock);
    // Read back what was written against the signed digests.
    let slots = open_slots(&a.disk)?;
    let mut fs = BootFs::new(slots.boot, epoch);
    boot::check_initial_boot(&mut fs, &p.payload)?;
    Ok(InstallReport {
        disk: a.disk.display().to_string(),
        size,
        version: p.payload.version.clone(),
        slot: Slot::A.to_string(),
        key_id: p.signers.join(", "),
        bios_boot: grub.is_some(),
    })
}

/// Refuses a disk (block device or existing image file) that holds data
/// ([`bootstate::blank::find_data`]: its first or last MiB is not all
/// zeros) unless `wipe`: an install replaces everything on it.
fn refuse_data(f: &File, disk_path: &Path, wipe: bool) -> Result<()> {
    let mut f = f;
    let size = disk::gpt::device_size(&mut f)
        .with_context(|| format!("finding the size of {}", disk_path.display()))?;
    let found = bootstate::blank::find_data(&mut f, size)
        .with_context(|| format!("reading {}", disk_path.display()))?;
    match found {
        Some(d) if !wipe => bail!(
            "{} holds data: {d}; an install overwrites the whole disk: pass --wipe to \
             overwrite it, or name another disk; nothing was written",
            disk_path.display()
        ),
        _ => Ok(()),
    }
}

/// GRUB's images from the payload (verified against the signed manifest
/// with the rest of it), checked; `None` when the manifest lists neither.
fn grub_for(p: &VerifiedPayload) -> Result<Option<disk::Grub>> {
    let find = |kind: Kind| {
        p.manifest
            .artifacts
            .iter()
            .find(|a| a.kind == kind)
            .map(|a| p.payload.kernel.path.with_file_name(&a.path))
    };
    match (find(Kind::GrubBoot), find(Kind::GrubCore)) {
        (None, None) => Ok(None),
        (Some(boot_img), Some(core_img)) => {
            // Bounded: boot.img is one sector, core.img at most GRUB's limit.
            let max = bootstate::bios::MAX_CORE_SECTORS * bootstate::bios::SECTOR as u64 + 1;
            let boot_img = crate::input::read_head(&boot_img, "GRUB's boot.img", 4096)?;
            let core_img = crate::input::read_head(&core_img, "GRUB's core.img", max)?;
            disk::Grub::new(&boot_img, &core_img)
                .context("the payload's GRUB images")
                .map(Some)
        }
        _ => bail!(
            "the payload manifest lists one of GRUB's two images (grub-boot, grub-core) \
             without the other: rebuild the installer image"
        ),
    }
}

/// Why the image does not fit on the install target, and what to do about
/// it: a device cannot grow, an image file can (`--size`). The layout's own
/// message says how much is needed.
fn install_layout_error(
    e: crate::disk::LayoutError,
    disk: &Path,
    is_block: bool,
    size_given: bool,
) -> anyhow::Error {
    let shown = disk.display();
    match &e {
        crate::disk::LayoutError::TooSmall {
            need_bytes: Some(need),
            ..
        } => {
            let need_mib = need.div_ceil(1 << 20);
            let todo = if is_block {
                format!("install onto a disk of at least {need_mib} MiB")
            } else if size_given {
                format!("give --size {need_mib}MiB or more")
            } else {
                format!(
                    "grow the image file to at least {need_mib} MiB, or give --size {need_mib}MiB"
                )
            };
            anyhow::anyhow!("{shown}: {e}: {todo}; nothing was written")
        }
        _ => anyhow::anyhow!("{shown}: {e}; nothing was written"),
    }
}

/// The ESP of a Secure Boot install, checked before anything is written:
/// the payload's own systemd-boot and slot A's UKI verify with the payload's
/// db certificate (a disk whose boot loader firmware refuses boots nothing),
/// and the three enrolment files are there.
fn secure_esp(p: &VerifiedPayload, db: &str, arch: contract::Arch) -> Result<Vec<disk::FatFile>> {
    let cert = crate::secureboot::keys::parse_cert(db.as_bytes())
        .context("the payload's db certificate")?;
    let loader = payload_loader(p)?.path;
    let ukis = p
        .payload
        .ukis
        .as_ref()
        .context("the Secure Boot payload has no UKIs: rebuild the installer")?;
    payload::secureboot::verify_all(
        &cert,
        &[("boot loader", &loader), ("UKI of slot A", &ukis.a.path)],
    )
    .context("the payload is not signed for its own db certificate: rebuild the installer; nothing was written")?;
    let mut names: Vec<&str> = p.enrolment.iter().map(|(n, _)| n.as_str()).collect();
    names.sort_unstable();
    ensure!(
        names == ["KEK.auth", "PK.auth", "db.auth"],
        "the Secure Boot payload's enrolment files are {names:?}, not PK.auth, KEK.auth and \
         db.auth: rebuild the installer"
    );
    let mode = p
        .manifest
        .boot
        .as_ref()
        .and_then(|b| b.secure_boot_enroll.as_deref())
        .unwrap_or("force");
    ensure!(
        contract::boot::ENROLL_MODES.contains(&mode),
        "the payload's secure-boot-enroll {mode:?} is not one of off, manual, force: rebuild \
         the installer"
    );
    crate::build::secure_esp_files(&loader, arch, mode, &p.enrolment)
}

/// The boot loader to install: the one the payload's signed manifest lists,
/// else the build host's for `arch` (a payload of an older imager).
fn systemd_boot_for(p: &VerifiedPayload, arch: contract::Arch) -> PathBuf {
    payload_loader(p).map_or_else(
        |_| crate::profile::BootSection::default_systemd_boot(arch),
        |f| f.path,
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::sign::VerifyingKey;
    // Tests panic on unexpected failures: that is how a test fails.

    #[test]
    fn qcow2_and_compressed_disks_are_refused_with_how_to_make_them_raw() {
        let dir = tempfile::tempdir().unwrap();
        let cases: [(&str, &[u8], &str); 3] = [
            ("d.qcow2", b"QFI\xfb\0\0\0\x03", "qemu-img convert -O raw"),
            ("d.raw.zst", &[0x28, 0xb5, 0x2f, 0xfd, 0, 0], "zstd -d"),
            ("d.raw.xz", &[0xfd, b'7', b'z', b'X', b'Z', 0], "xz -dc"),
        ];
        for (name, head, how) in cases {
            let path = dir.path().join(name);
            let mut bytes = head.to_vec();
            bytes.resize(1 << 20, 0);
            std::fs::write(&path, &bytes).unwrap();
            let e = open_slots(&path).err().map(|e| format!("{e:#}")).unwrap();
            assert!(e.contains(how) && e.contains("Nothing was written"), "{e}");
            let req = crate::node::provision::Request {
                credentials: Some((dir.path().to_path_buf(), "n1".into())),
                ..Default::default()
            };
            let e = crate::node::provision::provision(&path, &req)
                .err()
                .map(|e| format!("{e:#}"))
                .unwrap();
            assert!(e.contains(how), "node provision: {e}");
            assert_eq!(std::fs::read(&path).unwrap(), bytes, "{name} changed");
        }
        // A raw file passes this check (and fails later for its own reason).
        let raw = dir.path().join("d.raw");
        std::fs::write(&raw, vec![0u8; 1 << 20]).unwrap();
        require_raw(&raw).unwrap();
    }

    struct TestKey(ed25519_dalek::SigningKey);

    impl sign::Signer for TestKey {
        fn public_key(&self) -> VerifyingKey {
            self.0.verifying_key()
        }
        fn sign(&self, message: &[u8]) -> Result<sign::Signature> {
            Ok(ed25519_dalek::Signer::sign(&self.0, message))
        }
    }

    /// An installer image, laid out as a build lays it out, of a small
    /// payload signed by `signer`, in `dir`.
    fn installer_in(dir: &Path, signer: &TestKey) -> PathBuf {
        let payload = dir.join("payload");
        std::fs::create_dir_all(&payload).unwrap();
        let mut artifacts = Vec::new();
        for (name, kind) in [
            (paths::PAYLOAD_KERNEL, Kind::Kernel),
            (paths::PAYLOAD_INITRAMFS, Kind::Initramfs),
        ] {
            std::fs::write(payload.join(name), format!("the {name}")).unwrap();
            artifacts.push(sign::describe(&payload, kind, name).unwrap());
        }
        let m = Manifest {
            boot: Some(sign::Boot {
                title: "Imager 0.1.0".into(),
                cmdline: "console=ttyS0".into(),
                secure_boot_enroll: None,
            }),
            ..Manifest::new("metal", "0.1.0", "p", 1_700_000_000, artifacts)
        };
        sign::write_signed_manifest(&payload, &m, signer).unwrap();
        std::fs::write(dir.join("imager"), b"\x7fELF not really").unwrap();
        let spec = crate::build::installer_spec(
            &payload,
            &[paths::PAYLOAD_KERNEL, paths::PAYLOAD_INITRAMFS],
            &[],
            &dir.join("imager"),
            "localhost/metal/installer:0.1.0",
            1_700_000_000,
            contract::Arch::Amd64,
        );
        let tar = dir.join("installer.tar");
        oci::write_image(&tar, &spec).unwrap();
        tar
    }

    #[test]
    fn an_installer_image_is_verified_before_it_is_unpacked() {
        let t = tempfile::tempdir().unwrap();
        let (signer, other) = (
            TestKey(ed25519_dalek::SigningKey::from_bytes(&[1; 32])),
            TestKey(ed25519_dalek::SigningKey::from_bytes(&[2; 32])),
        );
        let (key, other) = (
            sign::Signer::public_key(&signer),
            sign::Signer::public_key(&other),
        );
        let tar = installer_in(t.path(), &signer);

        // Not a key the disk trusts: refused before the payload is unpacked.
        let roots = |keys: &[VerifyingKey]| payload::trust::key_root(keys).unwrap();
        let root = |keys: &[VerifyingKey]| {
            let r = roots(keys);
            move |_: &TrustFiles| Ok(r.clone())
        };
        let e = format!(
            "{:#}",
            load_payload(&tar, contract::Arch::Amd64, &root(&[other])).unwrap_err()
        );
        assert!(
            e.contains("refusing the installer image before unpacking its payload")
                && e.contains(&format!(
                    "not signed by a key this disk trusts ({})",
                    sign::key_id(&other)
                ))
                && e.contains(&format!("it says it is signed by {}", sign::key_id(&key)))
                && e.contains("nothing was written"),
            "{e}"
        );

        // One of the keys is the right one: the payload, verified.
        let p = load_payload(&tar, contract::Arch::Amd64, &root(&[other, key])).unwrap();
        assert_eq!(p.signers, [sign::key_id(&key)]);
        assert_eq!(p.manifest.version, "0.1.0");
        assert_eq!(
            std::fs::read(&p.payload.kernel.path).unwrap(),
            b"the vmlinuz"
        );
        assert_eq!(
            std::fs::read(&p.payload.initramfs.path).unwrap(),
            b"the initramfs.zst"
        );

        // A payload directory whose manifest is a FIFO: refused, not waited on.
        let dir = t.path().join("fifo-payload");
        std::fs::create_dir_all(&dir).unwrap();
        for name in [
            paths::PAYLOAD_KERNEL,
            paths::PAYLOAD_INITRAMFS,
            paths::PAYLOAD_SIGNATURE,
        ] {
            std::fs::write(dir.join(name), b"x").unwrap();
        }
        let made = std::process::Command::new("mkfifo")
            .arg(dir.join(paths::PAYLOAD_MANIFEST))
            .status()
            .unwrap();
        assert!(made.success());
        let e = format!(
            "{:#}",
            load_payload(&dir, contract::Arch::Amd64, &root(&[key])).unwrap_err()
        );
        assert!(e.contains("is not a regular file"), "{e}");
    }

    #[test]
    fn a_disk_holding_data_is_refused_without_wipe() {
        let t = tempfile::tempdir().unwrap();
        let disk = t.path().join("disk.raw");
        let f = File::create(&disk).unwrap();
        f.set_len(8 << 20).unwrap();
        // All zeros: installed onto without --wipe.
        refuse_data(&File::open(&disk).unwrap(), &disk, false).unwrap();
        {
            use std::io::{Seek, SeekFrom, Write};
            let mut f = std::fs::OpenOptions::new().write(true).open(&disk).unwrap();
            f.seek(SeekFrom::Start(512)).unwrap();
            f.write_all(b"EFI PART").unwrap();
        }
        let e = format!(
            "{:#}",
            refuse_data(&File::open(&disk).unwrap(), &disk, false).unwrap_err()
        );
        assert!(
            e.contains("holds data: a GPT partition table")
                && e.contains("--wipe")
                && e.contains("nothing was written"),
            "{e}"
        );
        refuse_data(&File::open(&disk).unwrap(), &disk, true).unwrap();
    }
}
