//! The live ISO of a build (`live.iso`, see [`contract::iso`]): the same
//! kernel, a live initramfs (the runtime and root filesystem, the signed
//! payload, the installer and the key it trusts), systemd-boot in a FAT
//! image for UEFI, GRUB's El Torito image for BIOS (on amd64: arm64's ISO
//! boots by UEFI only), written as one hybrid image by [`crate::iso`].
//!
//! The ISO is named by an ID, the first 32 hex digits (upper case: ISO 9660
//! a-characters) of the SHA-256 of its
//! payload's signed manifest: the kernel gets `machined.live=<ID>` and the
//! primary volume descriptor carries it as its volume set identifier, so
//! the live system recognises its own boot medium and never installs onto
//! it.

use super::{PayloadInput, names, step, write_payload};
use crate::grub::Eltorito;
use crate::initramfs::{self, Entry, EntryKind};
use crate::iso::{BiosBoot, IsoFile, IsoSource, IsoSpec};
use crate::profile::Profile;
use crate::sign;
use anyhow::{Context, Result, ensure};
use bootstate::fatformat::{FatFile, FatParams, FatSource, format_fat};
use contract::iso as layout;
use contract::{cmdline, paths};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

/// What the ISO is made of besides the payload.
pub struct IsoInput<'a> {
    /// The runtime (the initramfs's `/init`).
    pub machined: &'a Path,
    /// The root filesystem image.
    pub rootfs: &'a Path,
    /// Its dm-verity hash device.
    pub rootfs_verity: &'a Path,
    /// The static installer (imager).
    pub installer: &'a Path,
    /// GRUB's El Torito image and hybrid MBR, for BIOS boot; `None` on an
    /// architecture without BIOS (arm64), whose ISO boots by UEFI only.
    pub eltorito: Option<&'a Eltorito>,
}

/// The kernel command line of the live system: the image's (`image_cmdline`, with
/// the root hash), then `machined.live=<id>`, then the profile's install
/// target.
pub fn live_options(p: &Profile, image_cmdline: &str, id: &str) -> String {
    let mut o = format!("{image_cmdline} {}={id}", cmdline::LIVE);
    if let Some(t) = &p.live.install {
        o.push_str(&format!(" {}={t}", cmdline::INSTALL));
        if p.live.wipe {
            o.push_str(&format!(" {}=1", cmdline::INSTALL_WIPE));
        }
        for (_, k, v) in p.live.settings_args() {
            o.push_str(&format!(" {k}={v}"));
        }
    }
    o.trim().to_string()
}

/// Writes `out/live.iso`; its work files go to a staging directory in `out`
/// that a later build sweeps if this one is killed.
pub fn write_iso(
    p: &Profile,
    out: &Path,
    payload: &PayloadInput,
    input: &IsoInput,
    signing: &sign::Signing,
) -> Result<PathBuf> {
    let signer = signing.signer;
    let stage = crate::io::Staging::create(out, "iso")?;
    let work = stage.path();
    step("iso: payload, live initramfs");
    let payload_dir = work.join("payload");
    std::fs::create_dir(&payload_dir).context("creating the payload directory")?;
    let manifest = write_payload(p, &payload_dir, payload, signing)?;
    let manifest_bytes = std::fs::read(payload_dir.join(paths::PAYLOAD_MANIFEST))
        .context("reading the payload manifest")?;
    let id = hex::encode_upper(Sha256::digest(&manifest_bytes))[..32].to_string();
    let key = work.join("trusted.pub");
    std::fs::write(&key, sign::public_key_pem(&signer.public_key())?)
        .context("writing the trusted key")?;
    let mut payload_files = vec![
        paths::PAYLOAD_MANIFEST.to_string(),
        paths::PAYLOAD_SIGNATURE.to_string(),
    ];
    payload_files.extend(signing.trust_files().iter().map(|n| n.to_string()));
    payload_files.extend(manifest.artifacts.iter().map(|a| a.path.clone()));
    let live_initramfs = work.join("initramfs.zst");
    let mut entries = initramfs::entries(input.machined, input.rootfs, Some(input.rootfs_verity));
    entries.extend(live_entries(
        &payload_dir,
        &payload_files,
        input.installer,
        &key,
    ));
    initramfs::write_archive(
        &live_initramfs,
        &entries,
        payload.epoch,
        p.compression.initramfs_zstd_level,
    )
    .context("writing the live initramfs")?;

    let options = live_options(p, &payload.boot.cmdline, &id);
    let loaded = cmdline::loaded_len(&options, &[layout::LIVE_INITRAMFS]);
    ensure!(
        loaded <= cmdline::MAX_LEN,
        "{}: the live system's command line would be {loaded} bytes, over the kernel's {}: \
         shorten kernel.cmdline or live.install",
        p.path.display(),
        cmdline::MAX_LEN
    );
    step("iso: EFI image, GRUB, ISO 9660");
    let mut fat_files = match payload.secure_boot {
        Some(sb) => sb.esp_files(payload.boot_loader, p.arch)?,
        None => crate::boot::esp_files(payload.boot_loader, p.arch)?,
    };
    if p.uki_slots() {
        // The live system as a UKI (signed with Secure Boot): its command
        // line inside it.
        let uki = work.join("live.efi");
        let os_release = layout::live_os_release(&p.pretty_name, &payload.boot.title, &p.version);
        crate::uki::write_uki(
            &crate::uki::UkiInput {
                arch: p.arch,
                stub: &p.boot.stub,
                kernel: payload.kernel,
                initramfs: &live_initramfs,
                os_release: os_release.as_bytes(),
                cmdline: &options,
            },
            &uki,
        )
        .context("making the live system's UKI")?;
        if let Some(sb) = payload.secure_boot {
            sb.sign(&uki, &uki)?;
        }
        fat_files.push(FatFile::file(layout::LIVE_UKI, &uki));
    } else {
        let entry = layout::live_entry(&payload.boot.title, &p.version, &options);
        fat_files.push(FatFile::bytes(layout::LIVE_ENTRY, entry.render()));
    }
    fat_files.push(FatFile::file(layout::LIVE_KERNEL, payload.kernel));
    fat_files.push(FatFile::file(layout::LIVE_INITRAMFS, &live_initramfs));
    let efi_image = work.join("efi.img");
    write_efi_image(&efi_image, &fat_files, &id, payload.epoch)?;
    let mut files = vec![IsoFile {
        path: layout::EFI_IMAGE.to_string(),
        source: IsoSource::File(efi_image),
    }];
    let mut bios = None;
    if let Some(eltorito) = input.eltorito {
        let grub_cfg = layout::grub_cfg(&options)
            .map_err(anyhow::Error::msg)
            .with_context(|| format!("{}: kernel.cmdline", p.path.display()))?;
        files.splice(
            0..0,
            [
                IsoFile {
                    path: layout::ELTORITO_IMAGE.to_string(),
                    source: IsoSource::Bytes(eltorito.image.clone()),
                },
                IsoFile {
                    path: layout::GRUB_CFG.to_string(),
                    source: IsoSource::Bytes(grub_cfg.into_bytes()),
                },
            ],
        );
        bios = Some(BiosBoot {
            image: layout::ELTORITO_IMAGE.to_string(),
            hybrid_mbr: eltorito.hybrid_mbr.clone(),
        });
    }
    let spec = IsoSpec {
        volume_id: layout::volume_id(&p.name, &p.version),
        volume_set_id: id,
        publisher: layout::publisher(&p.pretty_name),
        epoch: payload.epoch,
        files,
        bios,
        efi_image: Some(layout::EFI_IMAGE.to_string()),
    };
    let dest = out.join(names::ISO);
    crate::iso::write(&spec, &dest).with_context(|| format!("writing {}", dest.display()))?;
    Ok(dest)
}

/// The live initramfs's additions: [`paths::LIVE_DIR`] with the payload's files
/// (`names` in `payload_dir`), the installer and the trusted key.
fn live_entries(payload_dir: &Path, names: &[String], installer: &Path, key: &Path) -> Vec<Entry> {
    let file = |path: String, mode: u32, src: PathBuf| Entry {
        path,
        mode,
        kind: EntryKind::File(FatSource::File(src)),
    };
    let dir = |path: &str| Entry {
        path: path.to_string(),
        mode: 0o755,
        kind: EntryKind::Dir,
    };
    let mut v = vec![
        dir(paths::LIVE_DIR),
        dir(paths::LIVE_PAYLOAD_DIR),
        file(
            paths::LIVE_INSTALLER.to_string(),
            0o755,
            installer.to_path_buf(),
        ),
        file(
            paths::LIVE_TRUSTED_KEY.to_string(),
            0o444,
            key.to_path_buf(),
        ),
    ];
    for n in names {
        v.push(file(
            format!("{}/{n}", paths::LIVE_PAYLOAD_DIR),
            0o444,
            payload_dir.join(n),
        ));
    }
    v
}

/// Room in the FAT image beyond its files: the FATs, directories and the
/// last cluster of each file.
const EFI_IMAGE_SLACK: u64 = 2 * contract::partition::MIB;

/// The smallest FAT image: FAT16 (BOOT's FAT code, `bootstate::fat`, does
/// not do FAT12).
const EFI_IMAGE_MIN: u64 = 8 * contract::partition::MIB;

/// Formats the FAT image `dest` holding `files`, sized to them (whole MiB,
/// at least [`EFI_IMAGE_MIN`]).
fn write_efi_image(dest: &Path, files: &[FatFile], id: &str, epoch: u64) -> Result<()> {
    let mut total = 0u64;
    for f in files {
        if let FatSource::File(path) = &f.source {
            total += std::fs::metadata(path)
                .with_context(|| format!("reading {}", path.display()))?
                .len();
        } else if let FatSource::Bytes(b) = &f.source {
            total += b.len() as u64;
        }
    }
    let mib = contract::partition::MIB;
    let size = ((total + total / 50 + EFI_IMAGE_SLACK).div_ceil(mib) * mib).max(EFI_IMAGE_MIN);
    let mut file = std::fs::File::options()
        .read(true)
        .write(true)
        .create_new(true)
        .open(dest)
        .with_context(|| format!("creating {}", dest.display()))?;
    file.set_len(size)
        .with_context(|| format!("sizing {}", dest.display()))?;
    let params = FatParams {
        label: "EFI".to_string(),
        volume_id: u32::from_str_radix(&id[..8], 16).unwrap_or(0),
        sector_size: 512,
        fat32: false,
        epoch,
    };
    format_fat(&mut file, &params, files)
        .with_context(|| format!("formatting the EFI image {}", dest.display()))?;
    file.sync_all()
        .with_context(|| format!("writing {}", dest.display()))?;
    Ok(())
}
