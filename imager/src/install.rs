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
use crate::sign::{self, Manifest, VerifyingKey};
use crate::{boot, oci};
use anyhow::{Context, Result, bail};
use bootstate::fat::BootFs;
use bootstate::ops::{self, Payload, PayloadFile};
use contract::meta::{Meta, SlotRecord, SlotStatus, Tag};
use contract::partition::PartitionRole;
use contract::state::BootState;
use contract::{Slot, paths};
use ed25519_dalek::pkcs8::DecodePublicKey;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// Where the installer finds its own payload inside the container.
pub fn builtin_payload() -> PathBuf {
    Path::new("/").join(paths::INSTALLER_PAYLOAD_DIR)
}

#[derive(clap::Args, Debug)]
pub struct UpgradeArgs {
    /// Installer image (OCI archive) or payload directory; inside the
    /// installer container it defaults to the image's own payload.
    #[arg(long)]
    pub installer: Option<PathBuf>,
    /// Disk image file or block device.
    #[arg(long)]
    pub disk: PathBuf,
    /// Boots the new slot is tried before systemd-boot falls back (1 to 99).
    #[arg(long, default_value_t = contract::boot::DEFAULT_TRIES,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(contract::boot::MAX_TRIES)))]
    pub tries: u32,
    /// Print the result as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args, Debug)]
pub struct InstallArgs {
    /// Installer image (OCI archive) or payload directory.
    #[arg(long)]
    pub installer: Option<PathBuf>,
    /// Disk image file (created if missing) or block device.
    #[arg(long)]
    pub disk: PathBuf,
    /// Size of a new disk image file, e.g. 2GiB (default: the existing
    /// file's size, else 2 GiB).
    #[arg(long)]
    pub size: Option<String>,
    /// Public key the payload must be signed with; the installed disk then
    /// trusts it for upgrades (default: the development key).
    #[arg(long)]
    pub key: Option<PathBuf>,
    /// Print the result as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args, Debug)]
pub struct RollbackArgs {
    /// Disk image file or block device.
    #[arg(long)]
    pub disk: PathBuf,
    /// Roll back to a slot known to be bad (it gets boot counting).
    #[arg(long)]
    pub force: bool,
    /// Print the result as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

/// The payload of an installer, extracted (if needed) and verified.
#[derive(Debug)]
pub struct VerifiedPayload {
    pub payload: Payload,
    pub manifest: Manifest,
    /// The trusted key that signed it.
    pub key: VerifyingKey,
    /// Keeps an extracted archive alive while the payload is used.
    _work: Option<tempfile::TempDir>,
}

/// Finds the payload directory of `installer`: the directory itself, or an
/// OCI archive extracted into a temporary directory.
fn payload_dir(installer: &Path) -> Result<(PathBuf, Option<tempfile::TempDir>)> {
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
    let dir = oci::extract_payload(installer, work.path()).with_context(|| {
        format!(
            "reading {} as an installer image (an OCI archive such as installer.tar; or pass \
             a payload directory)",
            installer.display()
        )
    })?;
    Ok((dir, Some(work)))
}

/// Parses the concatenated PEM public keys of META's `trusted-keys`.
pub fn parse_trusted_keys(text: &str) -> Result<Vec<VerifyingKey>> {
    const BEGIN: &str = "-----BEGIN PUBLIC KEY-----";
    const END: &str = "-----END PUBLIC KEY-----";
    let mut keys = Vec::new();
    let mut rest = text;
    while let Some(b) = rest.find(BEGIN) {
        let after = &rest[b..];
        let e = after
            .find(END)
            .context("a trusted key in META has no END line")?;
        let pem = &after[..e + END.len()];
        keys.push(
            VerifyingKey::from_public_key_pem(pem)
                .map_err(|e| anyhow::anyhow!("a trusted key in META is not ed25519: {e}"))?,
        );
        rest = &after[e + END.len()..];
    }
    Ok(keys)
}

/// Loads the payload of `installer` and verifies it against `trusted`:
/// the manifest's signature, then every file's size and digest.
pub fn load_payload(installer: &Path, trusted: &[VerifyingKey]) -> Result<VerifiedPayload> {
    let (dir, work) = payload_dir(installer)?;
    if trusted.is_empty() {
        bail!("no trusted key to verify the installer's payload against");
    }
    let mut errors = Vec::new();
    let mut verified = None;
    for key in trusted {
        match sign::verify(&dir, key) {
            Ok(report) => {
                report
                    .ensure_ok()
                    .context("the installer's payload does not match its signed manifest")?;
                verified = Some((*key, report.verified));
                break;
            }
            Err(e) => errors.push(format!("{e:#}")),
        }
    }
    let Some((key, manifest)) = verified else {
        let ids: Vec<String> = trusted.iter().map(sign::key_id).collect();
        // Only to explain: the manifest is not trusted here.
        let claimed = std::fs::read(dir.join(sign::MANIFEST_NAME))
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .and_then(|v| v.get("key_id")?.as_str().map(str::to_string));
        let why = match claimed {
            Some(k) if !ids.contains(&k) => format!(
                "it says it is signed by {k}; build the installer with the key the disk \
                 trusts (imager build --key), or install the disk afresh with \
                 `imager install --key` for the new key"
            ),
            _ => format!(
                "its signature does not verify: the payload was modified or damaged ({})",
                errors.join("; ")
            ),
        };
        bail!(
            "the installer's payload is not signed by a key this disk trusts ({}): {why}; \
             nothing was written",
            ids.join(", ")
        );
    };
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
    let payload = Payload {
        version: manifest.version.clone(),
        title: boot.title,
        cmdline: boot.cmdline,
        kernel: file(Kind::Kernel)?,
        initramfs: file(Kind::Initramfs)?,
    };
    Ok(VerifiedPayload {
        payload,
        manifest,
        key,
        _work: work,
    })
}

/// Size of a disk image file or block device.
pub fn device_size(f: &mut File) -> Result<u64> {
    let end = f
        .seek(SeekFrom::End(0))
        .context("finding the disk's size")?;
    f.seek(SeekFrom::Start(0))?;
    Ok(end)
}

/// The BOOT and META partitions of a disk, each on its own handle, opened
/// with O_DSYNC: every write is on the disk before the next one starts, so
/// the order of writes that makes an upgrade crash-safe is the order in
/// which they reach the disk (the page cache would otherwise write back in
/// its own order).
pub fn open_slots(disk_path: &Path) -> Result<(Window<File>, Window<File>)> {
    use std::os::unix::fs::OpenOptionsExt;
    let open = || {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_DSYNC)
            .open(disk_path)
            .with_context(|| {
                format!(
                    "opening {} for writing (the disk must exist and hold an installed \
                     system: make one with `imager build` or `imager install`)",
                    disk_path.display()
                )
            })
    };
    let mut f = open()?;
    let size = disk::gpt::device_size(&mut f)?;
    let table = disk::gpt::read_table_from(&mut f, size)
        .with_context(|| format!("reading the partition table of {}", disk_path.display()))?;
    let window = |role: PartitionRole| -> Result<Window<File>> {
        table.window(open()?, role.label()).with_context(|| {
            format!(
                "{}: not a disk made by imager (use `imager install`)",
                disk_path.display()
            )
        })
    };
    Ok((window(PartitionRole::Boot)?, window(PartitionRole::Meta)?))
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

/// Upgrades the disk whose BOOT and META are `boot_dev` and `meta_dev`.
pub fn upgrade_on<B: bootstate::Device, M: bootstate::Device>(
    boot_dev: B,
    meta_dev: &mut M,
    installer: &Path,
    tries: u32,
) -> Result<(ops::Upgraded, VerifiedPayload)> {
    let (meta, _) = bootstate::meta::read(meta_dev).context("reading META")?;
    let keys = parse_trusted_keys(meta.get(Tag::TrustedKeys).unwrap_or_default())?;
    if keys.is_empty() {
        bail!(
            "META names no trusted key: this disk cannot be upgraded (it was made by an older \
             imager; reinstall it)"
        );
    }
    let p = load_payload(installer, &keys)?;
    if let Some(name) = meta.get(Tag::ImageName)
        && name != p.manifest.name
    {
        bail!(
            "the installer is for the system {:?} but this disk runs {name:?}: an upgrade \
             installs a new version of the same system; nothing was written",
            p.manifest.name
        );
    }
    let mut boot = BootFs::new(boot_dev, p.manifest.source_date_epoch);
    let up = ops::upgrade(&mut boot, meta_dev, &p.payload, tries)?;
    Ok((up, p))
}

pub fn run_upgrade(a: &UpgradeArgs, installer: &Path) -> Result<UpgradeReport> {
    let (boot, meta) = open_slots(&a.disk)?;
    // Counted, to report what an upgrade costs the disk.
    let boot = bootstate::Faulty::counting(boot);
    let mut meta = boot.share(meta);
    let (up, p) = upgrade_on(boot, &mut meta, installer, a.tries)?;
    Ok(UpgradeReport {
        disk: a.disk.display().to_string(),
        from_slot: up.from.to_string(),
        to_slot: up.to.to_string(),
        from_version: up.from_version,
        to_version: p.payload.version.clone(),
        entry: up.entry.file_name(),
        tries: a.tries,
        key_id: sign::key_id(&p.key),
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

pub fn run_rollback(a: &RollbackArgs) -> Result<RollbackReport> {
    let (boot, mut meta) = open_slots(&a.disk)?;
    let r = ops::rollback(&mut BootFs::new(boot, 0), &mut meta, a.force)?;
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
}

/// META of a newly installed or built disk: slot A good and default, slot B
/// empty, the trusted keys, and the first history event.
pub fn initial_meta(
    image_name: &str,
    version: &str,
    trusted: &[VerifyingKey],
    event: &str,
) -> Result<Meta> {
    let mut m = Meta::default();
    m.set(Tag::ImageName, image_name);
    let mut state = BootState {
        default: Slot::A,
        slots: [
            Some(SlotRecord {
                status: SlotStatus::Good,
                version: version.to_string(),
            }),
            None,
        ],
        pending: None,
        history: Vec::new(),
    };
    state.record(format!("{event} slot=A version={version}"));
    state.write_to(&mut m);
    let mut pems = String::new();
    for k in trusted {
        pems.push_str(&sign::public_key_pem(k)?);
    }
    m.set(Tag::TrustedKeys, pems);
    Ok(m)
}

/// Lays out `disk` (an image file, replaced atomically; or a block device,
/// written in place with the partition table last) and installs the
/// payload into slot A.
pub fn run_install(a: &InstallArgs, installer: &Path) -> Result<InstallReport> {
    let key = match &a.key {
        Some(k) => sign::load_public_key(k)?,
        None => sign::load_public_key(&sign::default_dev_pub()).context(
            "no --key given and no development key found: pass --key with the public key \
             that signed the installer",
        )?,
    };
    let p = load_payload(installer, &[key])?;
    let is_block = std::fs::metadata(&a.disk)
        .map(|m| std::os::unix::fs::FileTypeExt::is_block_device(&m.file_type()))
        .unwrap_or(false);
    let size = match (&a.size, std::fs::metadata(&a.disk)) {
        (Some(s), _) if !is_block => {
            crate::profile::Size::parse(s)
                .map_err(anyhow::Error::msg)?
                .0
        }
        (Some(_), _) => bail!("--size is for image files: a block device has its own size"),
        (None, Ok(_)) => {
            let mut f =
                File::open(&a.disk).with_context(|| format!("opening {}", a.disk.display()))?;
            disk::gpt::device_size(&mut f)?
        }
        (None, Err(_)) => contract::partition::DEFAULT_DISK_SIZE,
    };
    let layout = Layout::new(size, 512, &BTreeMap::new())?;
    let esp = boot::esp_files(&systemd_boot_for(&p))?;
    // The entry as an upgrade writes it (title from the manifest's boot.title).
    let entry = p.payload.entry(Slot::A);
    let boot_files = boot::boot_files(
        Slot::A,
        &entry,
        &p.payload.kernel.path,
        &p.payload.initramfs.path,
    );
    let identity = paths::image_identity(
        &p.manifest.name,
        &p.manifest.version,
        &[&p.payload.kernel.sha256, &p.payload.initramfs.sha256],
    );
    let meta = initial_meta(&p.manifest.name, &p.payload.version, &[key], "install")?;
    let guid = contract::guid::disk_guid(&identity);
    let epoch = p.manifest.source_date_epoch;
    let target = if is_block {
        boot::DiskTarget::InPlace
    } else {
        boot::DiskTarget::NewImage
    };
    boot::write_raw_image(
        &a.disk, target, &layout, guid, esp, boot_files, &meta, epoch,
    )?;
    // Read back what was written against the signed digests.
    let (mut b, _) = open_slots(&a.disk)?;
    let mut fs = BootFs::new(&mut b, epoch);
    let e = p.payload.entry(Slot::A);
    for (path, f) in [
        (&e.linux, &p.payload.kernel),
        (&e.initrd, &p.payload.initramfs),
    ] {
        let (sha, _) = fs.hash(path)?;
        if sha != f.sha256 {
            bail!("{path} reads back as {sha}, not the signed {}", f.sha256);
        }
    }
    Ok(InstallReport {
        disk: a.disk.display().to_string(),
        size,
        version: p.payload.version.clone(),
        slot: Slot::A.to_string(),
        key_id: sign::key_id(&key),
    })
}

/// The boot loader to install: the one the payload's signed manifest lists,
/// else the build host's.
fn systemd_boot_for(p: &VerifiedPayload) -> PathBuf {
    match p
        .manifest
        .artifacts
        .iter()
        .find(|a| a.kind == Kind::BootLoader)
    {
        Some(a) => p.payload.kernel.path.with_file_name(&a.path),
        None => PathBuf::from(boot::DEFAULT_SYSTEMD_BOOT),
    }
}
