//! The slots' Unified Kernel Images of a build (`uki-a.efi`, `uki-b.efi`):
//! the build's kernel and initramfs, and for each slot the `.osrel`
//! ([`contract::boot::uki_os_release`]) and command line (the image's, with
//! its `machined.verity=` root hash, then
//! `machined.slot=X`: the same options as the slot's `.conf` entry) that
//! make it that slot's. A UKI carries its command line, so each slot needs
//! its own; with Secure Boot both are signed and the runtime can trust the
//! slot named in it.

use super::{names, step};
use crate::profile::Profile;
use crate::uki::{UkiInput, write_uki};
use anyhow::{Context, Result};
use contract::Slot;
use std::path::{Path, PathBuf};

/// The UKI of each slot, in slot order (A, B).
pub type SlotUkis = [PathBuf; 2];

/// Writes `uki-a.efi` and `uki-b.efi` into `out`.
pub fn write_ukis(
    p: &Profile,
    out: &Path,
    kernel: &Path,
    initramfs: &Path,
    cmdline: &str,
) -> Result<SlotUkis> {
    step("uki: one Unified Kernel Image per slot");
    let title = crate::boot::image_title(&p.pretty_name, &p.version);
    let any = "0".repeat(64);
    let make = |slot: Slot| -> Result<PathBuf> {
        let dest = out.join(names::uki(slot));
        let os_release = contract::boot::uki_os_release(&p.pretty_name, &title, &p.version, slot);
        // The options of the slot's `.conf` entry: one rule for both kinds.
        let cmdline =
            crate::boot::entry(slot, &any, &any, &p.pretty_name, &p.version, cmdline).options;
        write_uki(
            &UkiInput {
                arch: p.arch,
                stub: &p.boot.stub,
                kernel,
                initramfs,
                os_release: os_release.as_bytes(),
                cmdline: &cmdline,
            },
            &dest,
        )
        .with_context(|| format!("making the UKI of slot {slot} (boot.stub, kernel, initramfs)"))?;
        Ok(dest)
    };
    Ok([make(Slot::A)?, make(Slot::B)?])
}
