//! GRUB's rendering of the slot state on BOOT (the BIOS path): the good
//! slot in the first sector of `grub/grub.cfg` and the trial in the
//! environment block `grub/env/grubenv` ([`contract::grubcfg`],
//! [`contract::grubenv`]).
//!
//! Both files are created once, at full length, by [`install`], and
//! afterwards only rewritten in place through
//! [`BootFs::overwrite_in_place`], one 512-byte sector at a time: never
//! truncated, never reallocated, never through grub-editenv. [`sync`]
//! makes them say what a [`BootState`] says, in at most two writes
//! (`grub.cfg`'s first sector, the block's first sector), ordered so that
//! after a cut between them GRUB boots the slot it booted before or the one
//! it boots after: never a third choice.

use crate::device::Device;
use crate::fat::BootFs;
use anyhow::{Context, Result, bail};
use contract::Slot;
use contract::grubcfg::{self, Rendering, Tries};
use contract::grubenv::{BLOCK_LEN, GrubEnv};
use contract::paths::{BOOT_GRUB_CFG, BOOT_GRUB_ENV, BOOT_GRUB_ENV_DIR};
use contract::state::BootState;
use std::io::{Read, Seek};

/// The most `grub.cfg` may hold (it is about 6 KiB).
const CFG_LIMIT: u64 = 1 << 20;

/// What GRUB would read from BOOT now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct View {
    /// The good slot of `grub.cfg`'s first sector; `None` when the file is
    /// missing or its first sector is not one we write.
    pub good: Option<Slot>,
    /// The block as GRUB's script acts on it (a missing or unreadable block
    /// reads as no trial); `exact` when it is byte for byte one we write.
    pub env: GrubEnv,
    pub exact: bool,
}

impl View {
    /// The slot GRUB boots next (when every slot loads).
    pub fn choice(&self) -> Slot {
        grubcfg::choice(self.good, self.env)
    }

    /// Whether GRUB's files say what `r` says.
    pub fn shows(&self, r: &Rendering) -> bool {
        self.good == Some(r.good) && self.env == r.env && self.exact
    }
}

/// Reads GRUB's rendering from BOOT.
pub fn read<D: Read + Seek>(boot: &mut BootFs<D>) -> Result<View> {
    let good = if boot.exists(BOOT_GRUB_CFG)? {
        grubcfg::read_good(&boot.read(BOOT_GRUB_CFG, CFG_LIMIT)?)
    } else {
        None
    };
    let (env, exact) = if boot.exists(BOOT_GRUB_ENV)? {
        let b = boot.read(BOOT_GRUB_ENV, BLOCK_LEN as u64 * 64)?;
        match GrubEnv::read_exact(&b) {
            Some(e) => (e, true),
            None => (GrubEnv::read_or_none(&b), false),
        }
    } else {
        (GrubEnv::none(), false)
    };
    Ok(View { good, env, exact })
}

/// Whether BOOT carries GRUB's rendering (both files): the slot operations
/// keep it in step only then.
pub fn installed<D: Read + Seek>(boot: &mut BootFs<D>) -> Result<bool> {
    Ok(boot.exists(BOOT_GRUB_CFG)? && boot.exists(BOOT_GRUB_ENV)?)
}

/// Creates GRUB's files on a BOOT that has none: `grub/grub.cfg` naming
/// `good`, `grub/env/grubenv` with no trial (directories first). Files that
/// exist are left alone. Each file is complete or absent at every write
/// ([`BootFs::create`]); GRUB without its block boots the good slot, and
/// without `grub.cfg` nothing (the builder and the installer write both
/// before the disk is ever booted).
pub fn install<D: Device>(boot: &mut BootFs<D>, good: Slot) -> Result<()> {
    boot.ensure_dir("grub")?;
    boot.ensure_dir(BOOT_GRUB_ENV_DIR)?;
    if !boot.exists(BOOT_GRUB_ENV)? {
        let b = GrubEnv::none().render().map_err(anyhow::Error::msg)?;
        boot.create(BOOT_GRUB_ENV, &mut &b[..], b.len() as u64)?;
    }
    if !boot.exists(BOOT_GRUB_CFG)? {
        let b = grubcfg::render(good);
        boot.create(BOOT_GRUB_CFG, &mut &b[..], b.len() as u64)?;
    }
    Ok(())
}

/// What [`sync`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Synced {
    pub rendering: Rendering,
    /// Sectors written: 0, 1 or 2.
    pub writes: usize,
}

/// Makes GRUB's files say what `state` says ([`grubcfg::rendering`]; the
/// trial's tries as `tries` says). Both files must exist ([`install`]) and
/// be ours. At most two one-sector writes, each synced:
///
/// - only one file changes: that one write;
/// - both change: `grub.cfg`'s good slot first, unless GRUB would then
///   boot a slot that neither the old nor the new rendering boots (the old
///   good slot with no trial, the new good slot not the new trial slot: an
///   upgrade switch that also moves the good slot), then the block first.
///
/// A cut at either write leaves GRUB booting the old choice or the new one.
pub fn sync<D: Device>(boot: &mut BootFs<D>, state: &BootState, tries: Tries) -> Result<Synced> {
    let now = read(boot)?;
    if !boot.exists(BOOT_GRUB_CFG)? || !boot.exists(BOOT_GRUB_ENV)? {
        bail!(
            "BOOT has no {BOOT_GRUB_CFG} or {BOOT_GRUB_ENV}: GRUB's files are created when the \
             disk is built or installed (reinstall it with `imager install`)"
        );
    }
    let Some(good_now) = now.good else {
        bail!(
            "{BOOT_GRUB_CFG} on BOOT was not written by this version of imager: its first \
             sector is not rewritten (reinstall the disk with `imager install`)"
        );
    };
    let target = grubcfg::rendering(state, now.env, tries);
    let env_bytes = target.env.render().map_err(anyhow::Error::msg)?;
    let cfg_changes = good_now != target.good;
    let env_changes = !now.exact || now.env != target.env;
    let old = grubcfg::choice(Some(good_now), now.env);
    let new = grubcfg::choice(Some(target.good), target.env);
    let cfg_first_ok = [old, new].contains(&grubcfg::choice(Some(target.good), now.env));
    let mut writes = 0;
    let write_env = |boot: &mut BootFs<D>| -> Result<usize> {
        if !env_changes {
            return Ok(0);
        }
        if boot.read(BOOT_GRUB_ENV, BLOCK_LEN as u64 * 64)?.len() != BLOCK_LEN {
            bail!(
                "{BOOT_GRUB_ENV} on BOOT is not {BLOCK_LEN} bytes: it is never resized \
                 (reinstall the disk with `imager install`)"
            );
        }
        boot.overwrite_in_place(BOOT_GRUB_ENV, &env_bytes)
            .context("writing GRUB's environment block")
    };
    let write_cfg = |boot: &mut BootFs<D>| -> Result<usize> {
        if !cfg_changes {
            return Ok(0);
        }
        let mut cfg = boot.read(BOOT_GRUB_CFG, CFG_LIMIT)?;
        cfg.get_mut(..grubcfg::STATE_LEN)
            .ok_or_else(|| anyhow::anyhow!("{BOOT_GRUB_CFG} on BOOT is shorter than a sector"))?
            .copy_from_slice(&grubcfg::state_sector(target.good));
        boot.overwrite_in_place(BOOT_GRUB_CFG, &cfg)
            .context("writing the good slot into grub.cfg")
    };
    if cfg_first_ok {
        writes += write_cfg(boot)?;
        writes += write_env(boot)?;
    } else {
        writes += write_env(boot)?;
        writes += write_cfg(boot)?;
    }
    Ok(Synced {
        rendering: target,
        writes,
    })
}

#[cfg(test)]
mod tests;
