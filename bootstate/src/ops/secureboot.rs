//! The upgrades that write the ESP's boot loader (`EFI/BOOT/BOOTX64.EFI`,
//! or arm64's `BOOTAA64.EFI`: the signed systemd-boot firmware starts)
//! besides a slot:
//!
//! - [`upgrade_into_secure_boot`]: a disk without Secure Boot takes a
//!   Secure Boot payload;
//! - [`upgrade_with_loader`]: a Secure Boot disk takes a payload whose
//!   boot loader is not the ESP's (a newer systemd-boot, or one signed by
//!   a new db key: docs/secureboot.md, "Rotating the db key and revoking
//!   UKIs"), so that firmware may later stop trusting the old key.
//!
//! Both check everything before their first write, then replace the boot
//! loader ([`BootFs::replace`]: whole, old or new, at every cut; the new
//! bytes read back before they take its place) before the slot is touched.
//! Both boot loaders boot both slots' entries: a cut between the two steps
//! leaves the old version booting under the new boot loader, and the same
//! upgrade run again finishes.

use super::{
    EntryKind, GrubRendering, Payload, PayloadFile, Upgraded, apply_upgrade, clusters, plan_upgrade,
};
use crate::device::Device;
use crate::fat::BootFs;
use anyhow::{Result, bail};
use contract::meta::Tag;
use contract::{Slot, grubcfg};
use std::fs::File;

/// Moves a disk without Secure Boot to a Secure Boot payload (whose UKIs
/// and `loader`, its signed systemd-boot, the caller has verified against
/// the payload's db certificate). Checks everything before its first write
/// (the upgrade's checks, the ESP's room, META's room for the db
/// certificate; a replacement of the boot loader that an earlier run left
/// cut short is finished before the ESP's), then, in order:
///
/// 1. the ESP's boot loader becomes `loader` and is read back. With Secure
///    Boot off in the firmware, the signed systemd-boot boots the same
///    entries;
/// 2. GRUB's rendering leaves BOOT, `grub/grub.cfg` first (from then on
///    the disk has none, and the rest are leftovers removed in any later
///    run): the disk boots under UEFI only, as a Secure Boot disk does;
/// 3. the upgrade, as [`super::upgrade`], its META write carrying
///    [`Tag::SecureBootEntering`]: the disk becomes a Secure Boot disk
///    (META's [`Tag::SecureBoot`]) when the new version is blessed.
///
/// Nothing enrols keys: a machine in setup mode that enrolled at the next
/// boot would then refuse the old, unsigned slot to fall back to. The user
/// enrols the keys and turns Secure Boot on once the new version is
/// blessed (docs/secureboot.md). A cut anywhere leaves a disk that boots
/// under UEFI with Secure Boot off, and running the same upgrade again
/// finishes it.
pub fn upgrade_into_secure_boot<E: Device, B: Device, M: Device>(
    esp: &mut BootFs<E>,
    loader: &PayloadFile,
    boot: &mut BootFs<B>,
    meta_dev: &mut M,
    payload: &Payload,
    tries: u32,
) -> Result<Upgraded> {
    let Some(db) = &payload.secure_boot else {
        bail!("the payload is not a Secure Boot build: there is no Secure Boot to enter");
    };
    let mut plan = plan_upgrade(boot, meta_dev, payload, tries, GrubRendering::TakeOff)?;
    if plan.st.meta.get(Tag::SecureBoot).is_some() {
        bail!("this disk boots with Secure Boot already: upgrade it without entering it");
    }
    if plan.kind != EntryKind::Uki {
        bail!("a Secure Boot payload boots its slots from UKIs, and this one has none");
    }
    plan.new_meta.set(Tag::SecureBootEntering, db.as_bytes());
    plan.new_meta.encode_block().map_err(|e| {
        anyhow::anyhow!(
            "META has no room for the db certificate ({e}): nothing was written; install the \
             disk from the Secure Boot installer (`imager install`) instead"
        )
    })?;
    const INSTALL: &str = "install the disk from the Secure Boot installer (`imager install`)";
    let (path, replace) = prepare_loader(esp, loader, INSTALL)?;
    // 1. The signed boot loader.
    write_loader(
        esp,
        loader,
        (&path, replace),
        "the upgrade stopped before touching BOOT, the disk boots as before with Secure Boot off",
    )?;
    // 2. GRUB's rendering: its configuration first, then what it used.
    let grub_files = [
        contract::paths::BOOT_GRUB_CFG.to_string(),
        contract::paths::BOOT_GRUB_ENV.to_string(),
        grubcfg::slot_config_path(Slot::A),
        grubcfg::slot_config_path(Slot::B),
    ];
    for f in &grub_files {
        boot.remove(f)?;
    }
    // 3. The upgrade.
    apply_upgrade(boot, meta_dev, payload, plan, tries)
}

/// Upgrades a Secure Boot disk to `payload` whose signed boot loader is
/// `loader` (the caller has verified it and the UKIs against a db
/// certificate the disk's firmware holds: `payload::secureboot::check`).
/// `esp` is the ESP; `None` on a disk whose BOOT is the ESP (4096-byte
/// sectors), which keeps its boot loader: a cut replacement there would
/// leave BOOT in a state every scan refuses until it is finished, and the
/// boot's own assessment scans BOOT first (the runtime then refuses a dbx
/// update that revokes the kept boot loader's certificate). Checks
/// everything before its first write (the upgrade's checks, the ESP's
/// room), then, in order:
///
/// 1. the ESP's boot loader becomes `loader` when it is not already, and
///    is read back;
/// 2. the upgrade, as [`super::upgrade`].
///
/// A cut between them leaves the old version booting under the new boot
/// loader (signed by a key firmware holds), and the same upgrade run again
/// finishes.
pub fn upgrade_with_loader<E: Device, B: Device, M: Device>(
    esp: Option<&mut BootFs<E>>,
    loader: &PayloadFile,
    boot: &mut BootFs<B>,
    meta_dev: &mut M,
    payload: &Payload,
    tries: u32,
) -> Result<Upgraded> {
    let plan = plan_upgrade(boot, meta_dev, payload, tries, GrubRendering::Keep)?;
    if plan.st.meta.get(Tag::SecureBoot).is_none() || payload.secure_boot.is_none() {
        bail!(
            "the boot loader is replaced by an upgrade only on a Secure Boot disk taking a Secure \
             Boot payload; nothing was written"
        );
    }
    let Some(esp) = esp else {
        return apply_upgrade(boot, meta_dev, payload, plan, tries);
    };
    let (path, replace) = prepare_loader(
        esp,
        loader,
        "reinstall the disk from the installer (`imager install`)",
    )?;
    write_loader(
        esp,
        loader,
        (&path, replace),
        "the upgrade stopped before touching BOOT, the disk boots as before",
    )?;
    apply_upgrade(boot, meta_dev, payload, plan, tries)
}

/// Checks the ESP before the boot loader is written, and says where it is
/// (the architecture's `EFI/BOOT` file the ESP holds, which `loader` must
/// be an EFI program of) and whether it must be written (the ESP's is not
/// `loader`). The path is found before anything is written (by directory
/// lookup alone: in every state a cut replacement leaves, the name points
/// at the old or the new file). A replacement an earlier run left
/// cut short is finished first: the scan refuses the two names it may
/// leave on the same clusters, and the old boot loader's clusters may be
/// held by nothing. `otherwise` says what to do when the ESP cannot take
/// it.
fn prepare_loader<E: Device>(
    esp: &mut BootFs<E>,
    loader: &PayloadFile,
    otherwise: &str,
) -> Result<(String, bool)> {
    use anyhow::Context;
    let arch = esp
        .boot_loader_arch()
        .map_err(|e| anyhow::anyhow!("{e:#}; nothing was written ({otherwise})"))?;
    let mut head = Vec::new();
    File::open(&loader.path)
        .and_then(|f| std::io::Read::read_to_end(&mut std::io::Read::take(f, 4096), &mut head))
        .with_context(|| format!("reading {}", loader.path.display()))?;
    if contract::arch::pe_machine(&head) != Some(arch.spec().pe_machine) {
        bail!(
            "the payload's boot loader is not an EFI program for {arch}, the architecture this \
             disk boots: nothing was written ({otherwise})"
        );
    }
    let path = arch.esp_boot_loader();
    let mut tidied = esp.finish_replace(&path)?;
    if !esp.scan()?.lost.is_empty() {
        esp.reclaim()?;
        tidied = true;
    }
    let written = if tidied {
        "nothing of this upgrade was written (a replacement an earlier run left cut short was \
         finished)"
    } else {
        "nothing was written"
    };
    let (old_sha, _) = esp.hash(&path)?;
    let replace = old_sha != loader.sha256;
    if replace {
        let room = esp.scan()?.room();
        let need = clusters(loader.len, esp.scan()?.cluster_size);
        if room < need {
            bail!(
                "the ESP has {} KiB free and the signed boot loader needs {} KiB beside the old \
                 one: {written}; {otherwise}",
                room >> 10,
                need >> 10
            );
        }
    }
    Ok((path, replace))
}

/// Replaces the ESP's boot loader at `path` with `loader` when `replace`
/// ([`prepare_loader`]'s answer), then reads it back; `after` says what
/// state a disk that does not keep it is left in.
fn write_loader<E: Device>(
    esp: &mut BootFs<E>,
    loader: &PayloadFile,
    (path, replace): (&str, bool),
    after: &str,
) -> Result<()> {
    use anyhow::Context;
    if replace {
        let mut src = File::open(&loader.path)
            .with_context(|| format!("opening {}", loader.path.display()))?;
        esp.replace(path, &mut src, loader.len, &loader.sha256)?;
    }
    let (sha, len) = esp.hash(path)?;
    if sha != loader.sha256 || len != loader.len {
        bail!(
            "{path} on the ESP reads back as sha256 {sha} ({len} bytes), not the signed {} ({} \
             bytes): the disk does not keep what is written to it; {after}",
            loader.sha256,
            loader.len
        );
    }
    Ok(())
}
