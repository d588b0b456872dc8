//! Boot assessment: what this boot means for the slot state, and the
//! blessing of a trial boot once the runtime's checks pass. The writes and
//! their order are [`bootstate::ops`]'s, shared with the installer.

use crate::console::say;
use crate::partitions::{self, Partition};
use anyhow::{Context, Result};
use bootstate::fat::BootFs;
use bootstate::ops::{self, BootOutcome};
use contract::Slot;
use contract::partition::PartitionRole;
use std::fs::File;
use std::path::Path;

/// The BOOT and META partitions of the disk the runtime booted from.
pub struct Disk {
    boot: BootFs<File>,
    meta: File,
    /// The whole disk's device node, locked for each change as the
    /// installer locks it (`bootstate::disk`): an upgrade run from the
    /// installer container on this machine and a blessing never interleave.
    whole: Option<std::path::PathBuf>,
}

/// Waits for the lock of the whole disk (an installer holds it for the
/// length of one upgrade or rollback) and holds it while the guard lives.
fn lock_disk(whole: Option<&Path>) -> Result<Option<File>> {
    let Some(path) = whole else {
        return Ok(None);
    };
    let f = File::open(path).with_context(|| format!("open {}", path.display()))?;
    crate::sys::lock(&f, path)?;
    Ok(Some(f))
}

/// Opens a partition with O_DSYNC, so that writes reach the disk in the
/// order they are made (see `bootstate::disk`).
fn open_rw(p: &Partition) -> Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let dev = p.dev_path(Path::new("/dev"));
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DSYNC)
        .open(&dev)
        .with_context(|| format!("open {} for writing", dev.display()))
}

impl Disk {
    /// Opens BOOT and META on META's disk.
    pub fn open(meta: &Partition, all: &[Partition]) -> Result<Disk> {
        let on_disk = partitions::on_disk_of(all, meta);
        let boot = on_disk
            .iter()
            .find(|p| p.label == PartitionRole::Boot.label())
            .with_context(|| {
                format!(
                    "no BOOT partition on {}",
                    meta.disk.as_deref().unwrap_or("META's disk")
                )
            })?;
        // Files this writes on BOOT (entries) carry no clock time.
        Ok(Disk {
            boot: BootFs::new(open_rw(boot)?, 0),
            meta: open_rw(meta)?,
            whole: meta.disk.as_ref().map(|d| Path::new("/dev").join(d)),
        })
    }

    /// Records what this boot of `booted` means and says it; returns
    /// whether it is a trial to bless once ready.
    pub fn assess(&mut self, booted: Slot, version: &str) -> Result<bool> {
        let _lock = lock_disk(self.whole.as_deref())?;
        let outcome =
            ops::assess(&mut self.boot, &mut self.meta, booted).context("assessing the boot")?;
        match &outcome {
            BootOutcome::Steady => {}
            BootOutcome::Trial => say(format!(
                "slots: slot {booted} ({version}) is on trial: it is blessed once ready"
            )),
            BootOutcome::FellBack {
                failed,
                version: failed_version,
                reason,
            } => say(format!(
                "rollback: the upgrade to slot {failed} ({failed_version}) failed: {}; \
                 running slot {booted} ({version})",
                reason.describe()
            )),
            BootOutcome::DefaultMoved => say(format!(
                "slots: slot {booted} is the default now (the boot loader started it first)"
            )),
        }
        Ok(outcome == BootOutcome::Trial)
    }

    /// Blesses the trial boot of `booted`.
    pub fn bless(&mut self, booted: Slot, version: &str) -> Result<()> {
        let _lock = lock_disk(self.whole.as_deref())?;
        let b = ops::bless(&mut self.boot, &mut self.meta, booted, version)
            .context("blessing the boot")?;
        match b.from_version {
            Some(from) => say(format!(
                "blessed slot {booted} ({version}): the upgrade from {from} succeeded"
            )),
            None => say(format!("blessed slot {booted} ({version})")),
        }
        Ok(())
    }
}
