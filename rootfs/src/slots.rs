//! Boot assessment: what this boot means for the slot state, and the
//! blessing of a trial boot once the runtime's checks pass. The writes and
//! their order are [`bootstate::ops`]'s, shared with the installer.

use crate::console::say;
use crate::partitions::{self, Partition};
use anyhow::{Context, Result};
use bootstate::Window;
use bootstate::disk::Access;
use bootstate::fat::BootFs;
use bootstate::ops::{self, BootOutcome, GrubOutcome};
use contract::Slot;
use contract::partition::PartitionRole;
use std::fs::File;
use std::path::{Path, PathBuf};

/// Where BOOT and META of the disk the runtime booted from are.
pub struct Disk {
    src: Source,
    /// The ESP's device node beside BOOT and META ([`Source::Parts`]).
    esp: Option<PathBuf>,
}

enum Source {
    /// The whole disk (`/dev/vda`): opened, locked and windowed for each
    /// change exactly as the installer does (`bootstate::disk`), so that an
    /// upgrade run from the installer container on this machine and a
    /// blessing never interleave, and both read and write through the same
    /// device (a partition's device node has a page cache of its own).
    Whole(PathBuf),
    /// BOOT's and META's own device nodes, when sysfs names no disk for
    /// META (unlocked).
    Parts(PathBuf, PathBuf),
}

/// A partition's device node opened for writing, as a window on itself.
/// Not `O_DSYNC`: bootstate syncs (`fdatasync`) where the order of its
/// writes needs it, as on the whole disk.
fn open_part(dev: &Path) -> Result<Window<File>> {
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(dev)
        .with_context(|| format!("open {} for writing", dev.display()))?;
    let len = bootstate::gpt::device_size(&mut f)
        .with_context(|| format!("size of {}", dev.display()))?;
    Ok(Window::new(f, 0, len)?)
}

/// The logical sector size of the block device `dev` (`BLKSSZGET`); 512
/// for a file that is not a block device (the tests' images).
fn sector_size(dev: &Path) -> Result<u64> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::FileTypeExt;
    let f = File::open(dev).with_context(|| format!("open {}", dev.display()))?;
    if !f.metadata()?.file_type().is_block_device() {
        return Ok(512);
    }
    let mut size: libc::c_int = 0;
    // SAFETY: BLKSSZGET writes one int through the pointer, which points
    // at `size` for the call's duration; the descriptor is open.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), libc::BLKSSZGET, &mut size) };
    anyhow::ensure!(
        r == 0 && size > 0,
        "reading the sector size of {}: {}",
        dev.display(),
        std::io::Error::last_os_error()
    );
    Ok(size as u64)
}

impl Disk {
    /// Finds BOOT and META on META's disk.
    pub fn open(meta: &Partition, all: &[Partition]) -> Result<Disk> {
        if let Some(d) = &meta.disk {
            return Ok(Disk {
                src: Source::Whole(Path::new("/dev").join(d)),
                esp: None,
            });
        }
        let on_disk = partitions::on_disk_of(all, meta);
        let boot = on_disk
            .iter()
            .find(|p| p.label == PartitionRole::Boot.label())
            .context("no BOOT partition on META's disk")?;
        let esp = on_disk
            .iter()
            .find(|p| p.label == PartitionRole::Efi.label())
            .map(|p| p.dev_path(Path::new("/dev")));
        Ok(Disk {
            src: Source::Parts(
                boot.dev_path(Path::new("/dev")),
                meta.dev_path(Path::new("/dev")),
            ),
            esp,
        })
    }

    /// Runs `f` on BOOT and META, the whole disk locked meanwhile. Files
    /// this writes on BOOT (entries) carry no clock time.
    fn with<R>(
        &self,
        f: impl FnOnce(&mut BootFs<Window<File>>, &mut Window<File>) -> Result<R>,
    ) -> Result<R> {
        self.with_epoch(0, f)
    }

    /// [`Disk::with`], files written on BOOT dated `epoch` (an upgrade's
    /// files carry its payload's SOURCE_DATE_EPOCH, as `imager upgrade`
    /// writes them).
    fn with_epoch<R>(
        &self,
        epoch: u64,
        f: impl FnOnce(&mut BootFs<Window<File>>, &mut Window<File>) -> Result<R>,
    ) -> Result<R> {
        match &self.src {
            Source::Whole(path) => {
                let disk = bootstate::disk::Disk::open_waiting(path, Access::Write)?;
                let (mut boot, mut meta) = (disk.boot(epoch)?, disk.meta()?);
                f(&mut boot, &mut meta)
            }
            Source::Parts(boot, meta) => f(
                &mut BootFs::new(open_part(boot)?, epoch),
                &mut open_part(meta)?,
            ),
        }
    }

    /// [`Disk::with_epoch`] with the ESP too: `None` where BOOT is the
    /// ESP (a disk of 4096-byte sectors, or no ESP partition beside BOOT).
    fn with_esp<R>(
        &self,
        epoch: u64,
        f: impl FnOnce(
            Option<&mut BootFs<Window<File>>>,
            &mut BootFs<Window<File>>,
            &mut Window<File>,
        ) -> Result<R>,
    ) -> Result<R> {
        match &self.src {
            Source::Whole(path) => {
                let disk = bootstate::disk::Disk::open_waiting(path, Access::Write)?;
                let mut esp = disk.separate_esp()?.map(|e| BootFs::new(e, epoch));
                let (mut boot, mut meta) = (disk.boot(epoch)?, disk.meta()?);
                f(esp.as_mut(), &mut boot, &mut meta)
            }
            Source::Parts(boot, meta) => {
                // (On a disk of 4096-byte sectors BOOT is the ESP, and the
                // partition named EFI is not a filesystem: the contract's
                // rule, as for the whole disk.)
                let mut esp = match &self.esp {
                    Some(e) => match contract::partition::esp_role(sector_size(boot)?) {
                        PartitionRole::Boot => None,
                        _ => Some(BootFs::new(open_part(e)?, epoch)),
                    },
                    None => None,
                };
                f(
                    esp.as_mut(),
                    &mut BootFs::new(open_part(boot)?, epoch),
                    &mut open_part(meta)?,
                )
            }
        }
    }

    /// Installs `payload` into the slot that is not the fallback, tried
    /// next with `tries` boots ([`ops::upgrade`], as `imager upgrade`). With
    /// `loader`, the payload's signed boot loader on a Secure Boot disk,
    /// the ESP's is replaced first when it differs
    /// ([`ops::upgrade_with_loader`]).
    pub fn upgrade(
        &self,
        payload: &ops::Payload,
        loader: Option<&ops::PayloadFile>,
        epoch: u64,
        tries: u32,
    ) -> Result<ops::Upgraded> {
        match loader {
            None => self.with_epoch(epoch, |boot, meta| ops::upgrade(boot, meta, payload, tries)),
            Some(l) => self.with_esp(epoch, |esp, boot, meta| {
                ops::upgrade_with_loader(esp, l, boot, meta, payload, tries)
            }),
        }
    }

    /// Records what this boot of `booted` means and says it; returns
    /// whether it is a trial to bless once ready.
    /// `by_grub`: GRUB booted it (`machined.trial` on the command line), so
    /// GRUB's rendering is assessed too: a switch cut between the two boot
    /// loaders is finished (docs/design.md, "Two renderings of one state").
    pub fn assess(&mut self, booted: Slot, version: &str, by_grub: bool) -> Result<bool> {
        let outcome = if by_grub {
            let g = self
                .with(|boot, meta| ops::assess_grub(boot, meta, booted))
                .context("assessing the boot (GRUB)")?;
            match g {
                GrubOutcome::As(o) => o,
                GrubOutcome::SwitchFinished { slot, tries } => {
                    say(format!(
                        "slots: GRUB's switch to slot {slot} finished ({tries} tries): it boots next"
                    ));
                    BootOutcome::Steady
                }
                GrubOutcome::FollowedMeta => {
                    say("slots: GRUB's rendering brought in line with META");
                    BootOutcome::Steady
                }
                GrubOutcome::BlessingFinished(_) => {
                    say(format!("slots: the blessing of slot {booted} finished"));
                    BootOutcome::Steady
                }
            }
        } else {
            self.with(|boot, meta| ops::assess(boot, meta, booted))
                .context("assessing the boot")?
        };
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

    /// The disk's slot state (META and the boot entries).
    pub fn status(&self) -> Result<ops::Status> {
        self.with(ops::status).context("reading the slot state")
    }

    /// Makes the other slot the default ([`ops::rollback`]; a slot known
    /// to be bad is refused, one below the security floor unless
    /// `allow_downgrade`, one whose UKI the disk's dbx updates revoke).
    pub fn rollback(&self, allow_downgrade: bool) -> Result<ops::RolledBack> {
        self.with(|boot, meta| {
            ops::rollback_checked(
                boot,
                meta,
                false,
                allow_downgrade,
                &payload::secureboot::check_rollback,
            )
        })
    }

    /// Writes `payload` into the slot an upgrade would take without arming
    /// it ([`ops::stage`]).
    pub fn stage(&self, payload: &ops::Payload, epoch: u64) -> Result<ops::Staged> {
        self.with_epoch(epoch, |boot, meta| ops::stage(boot, meta, payload))
    }

    /// Sets (`Some(why)`) or removes (`None`) META's `wipe-ephemeral`; one
    /// META write (both copies, in their order), nothing else.
    pub fn set_wipe_ephemeral(&self, why: Option<&str>) -> Result<()> {
        self.with(|_, meta_dev| {
            let (mut meta, _) = bootstate::meta::read(meta_dev)?;
            if meta.get(contract::meta::Tag::WipeEphemeral) == why {
                return Ok(());
            }
            match why {
                Some(w) => meta.set(contract::meta::Tag::WipeEphemeral, w),
                None => meta.remove(contract::meta::Tag::WipeEphemeral),
            }
            bootstate::meta::write(meta_dev, &meta)
        })
    }

    /// The node's credentials (the CA certificates its clients must chain
    /// to, its certificate and key) in META, replaced in one write.
    pub fn set_credentials(&self, ca: &str, cert: &str, key: &str) -> Result<()> {
        use contract::meta::Tag;
        self.with(|_, meta_dev| {
            let (mut meta, _) = bootstate::meta::read(meta_dev)?;
            meta.set(Tag::NodeCa, ca);
            meta.set(Tag::NodeCert, cert);
            meta.set(Tag::NodeKey, key);
            meta.encode_block()
                .map_err(|e| anyhow::anyhow!("META has no room for the credentials ({e})"))?;
            bootstate::meta::write(meta_dev, &meta)
        })
    }

    /// The boot loader firmware starts from this disk (the ESP's
    /// `EFI/BOOT/BOOTX64.EFI` or `BOOTAA64.EFI`; BOOT's on a disk whose
    /// BOOT is the ESP), read whole (at most 16 MiB).
    pub fn esp_loader(&self) -> Result<Vec<u8>> {
        const MAX: u64 = 16 << 20;
        self.with_esp(0, |esp, boot, _| match esp {
            Some(esp) => esp
                .boot_loader_arch()
                .and_then(|a| esp.read(&a.esp_boot_loader(), MAX))
                .context("reading the boot loader on the ESP"),
            None => boot
                .boot_loader_arch()
                .and_then(|a| boot.read(&a.esp_boot_loader(), MAX))
                .context("reading the boot loader on BOOT"),
        })
    }

    /// META as it is now.
    pub fn meta(&self) -> Result<contract::meta::Meta> {
        self.with(|_, meta_dev| Ok(bootstate::meta::read(meta_dev)?.0))
    }

    /// META's `secure-boot` record (the db certificates firmware trusts)
    /// replaced by `pem`, in one write: the runtime adds a certificate once
    /// firmware's db holds it, and removes one before firmware's dbx takes
    /// it.
    pub fn set_secure_boot(&self, pem: &str) -> Result<()> {
        use contract::meta::Tag;
        self.with(|_, meta_dev| {
            let (mut meta, _) = bootstate::meta::read(meta_dev)?;
            meta.set(Tag::SecureBoot, pem);
            meta.encode_block()
                .map_err(|e| anyhow::anyhow!("META has no room for the db certificates ({e})"))?;
            bootstate::meta::write(meta_dev, &meta)
        })
    }

    /// Blesses the trial boot of `booted`.
    pub fn bless(&mut self, booted: Slot, version: &str) -> Result<()> {
        let b = self
            .with(|boot, meta| ops::bless(boot, meta, booted, version))
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
