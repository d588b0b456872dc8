//! A disk opened for the slot operations: a disk image file or a block
//! device, locked for the whole operation, its partition table read, and
//! windows on its partitions.
//!
//! The lock is an advisory `flock` on the disk itself: exclusive for a
//! change (`install`, `upgrade`, `rollback`), shared for a look
//! (`inspect`). A second change on the same disk is refused at once rather
//! than interleaving its writes with the first (two upgrades at once would
//! cross-link BOOT's FAT). The runtime takes the same lock on its boot disk
//! while it assesses and blesses a boot.
//!
//! Writable handles are plain read-write handles (no `O_DSYNC`): a write
//! may reach the disk late and out of order, and the operations order them
//! with [`crate::device::Device::sync`] (`fdatasync`) where their order
//! needs a barrier, and only there (docs/design.md, "Writes reach the disk
//! in the order the syncs make").

use crate::device::Window;
use crate::fat::BootFs;
use crate::gpt::{self, Table};
use anyhow::{Context, Result, bail};
use contract::partition::PartitionRole;
use std::fs::{File, OpenOptions, TryLockError};
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

/// What the operation does to the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Reads only; a shared lock.
    Read,
    /// Changes it; an exclusive lock, writable handles.
    Write,
}

/// A locked disk and its partition table.
#[derive(Debug)]
pub struct Disk {
    path: PathBuf,
    access: Access,
    /// Holds the lock for as long as the `Disk` lives.
    _lock: File,
    pub table: Table,
}

/// Refuses what is neither a regular file nor a block device before it is
/// opened (opening a FIFO would wait for a writer for ever).
pub fn check_kind(path: &Path) -> Result<()> {
    let m = std::fs::metadata(path).with_context(|| format!("{} not found", path.display()))?;
    let t = m.file_type();
    if !(t.is_file() || t.is_block_device()) {
        bail!(
            "{} is neither a disk image file nor a block device: give the disk image or the \
             disk's device node (/dev/…)",
            path.display()
        );
    }
    Ok(())
}

/// The logical sector size of the block device `path` (what it reads and
/// writes by, and so how its GPT is laid out), from sysfs
/// (`/sys/dev/block/MAJOR:MINOR/queue/logical_block_size`); `None` for a
/// file, whose sector size is the caller's choice.
pub fn logical_sector_size(path: &Path) -> Result<Option<u64>> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).with_context(|| format!("{} not found", path.display()))?;
    if !m.file_type().is_block_device() {
        return Ok(None);
    }
    // Linux's dev_t encoding (glibc's gnu_dev_major/minor).
    let rdev = m.rdev();
    let major = ((rdev >> 8) & 0xfff) | ((rdev >> 32) & !0xfff);
    let minor = (rdev & 0xff) | ((rdev >> 12) & !0xff);
    let sys = format!("/sys/dev/block/{major}:{minor}/queue/logical_block_size");
    let text = std::fs::read_to_string(&sys).with_context(|| {
        format!(
            "reading the sector size of {} from {sys}: is sysfs mounted, and is it a whole disk?",
            path.display()
        )
    })?;
    let size: u64 = text
        .trim()
        .parse()
        .with_context(|| format!("{sys} holds {:?}, not a number", text.trim()))?;
    if !contract::partition::SECTOR_SIZES.contains(&size) {
        bail!(
            "{} has {size}-byte sectors: disks of {:?}-byte sectors are supported",
            path.display(),
            contract::partition::SECTOR_SIZES
        );
    }
    Ok(Some(size))
}

fn open(path: &Path, access: Access) -> std::io::Result<File> {
    let mut o = OpenOptions::new();
    o.read(true);
    if access == Access::Write {
        o.write(true);
    }
    o.open(path)
}

/// Waits for the lock of `access` on an open disk (the runtime: an
/// installer holds it for the length of one operation). A kernel without
/// file locking (ENOSYS) cannot lock: the work goes on unlocked.
pub fn lock_waiting(file: &File, path: &Path, access: Access) -> Result<()> {
    let r = match access {
        Access::Read => file.lock_shared(),
        Access::Write => file.lock(),
    };
    match r {
        Err(e) if e.kind() != std::io::ErrorKind::Unsupported => {
            Err(e).with_context(|| format!("locking {}", path.display()))
        }
        _ => Ok(()),
    }
}

/// Takes the lock of `access` on an open disk, or says who holds it.
pub fn lock(file: &File, path: &Path, access: Access) -> Result<()> {
    let r = match access {
        Access::Read => file.try_lock_shared(),
        Access::Write => file.try_lock(),
    };
    match r {
        Ok(()) => Ok(()),
        Err(TryLockError::WouldBlock) => bail!(
            "{} is in use: another install, upgrade or rollback (or the running system's \
             boot assessment) is changing it; wait for it to finish and try again",
            path.display()
        ),
        Err(TryLockError::Error(e)) => {
            Err(e).with_context(|| format!("locking {}", path.display()))
        }
    }
}

impl Disk {
    /// Opens and locks the disk at `path` and reads its partition table;
    /// refused at once when another operation holds the disk.
    pub fn open(path: &Path, access: Access) -> Result<Disk> {
        Disk::open_with(path, access, false)
    }

    /// [`Disk::open`], waiting for the lock (the runtime).
    pub fn open_waiting(path: &Path, access: Access) -> Result<Disk> {
        Disk::open_with(path, access, true)
    }

    fn open_with(path: &Path, access: Access, wait: bool) -> Result<Disk> {
        check_kind(path)?;
        let mut f = open(path, access).with_context(|| {
            format!(
                "opening {}{}",
                path.display(),
                if access == Access::Write {
                    " for writing"
                } else {
                    ""
                }
            )
        })?;
        if wait {
            lock_waiting(&f, path, access)?;
        } else {
            lock(&f, path, access)?;
        }
        let size = gpt::image_size(&mut f)
            .with_context(|| format!("finding the size of {}", path.display()))?;
        let table = gpt::read(&mut f, size).with_context(|| {
            format!(
                "reading the partition table of {}: not a disk made by imager (make one with \
                 `imager build` or `imager install`)",
                path.display()
            )
        })?;
        Ok(Disk {
            path: path.to_path_buf(),
            access,
            _lock: f,
            table,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A window on the partition of `role`, on its own handle.
    /// The handle is opened afresh on the locked file itself (through
    /// `/proc/self/fd`), so that a path swapped meanwhile cannot make it
    /// another file than the one locked; by path where /proc is missing.
    pub fn partition(&self, role: PartitionRole) -> Result<Window<File>> {
        use std::os::fd::AsRawFd;
        let same = PathBuf::from(format!("/proc/self/fd/{}", self._lock.as_raw_fd()));
        let f = open(&same, self.access)
            .or_else(|_| open(&self.path, self.access))
            .with_context(|| format!("opening {}", self.path.display()))?;
        self.table.window(f, role.label()).with_context(|| {
            format!(
                "{}: not a disk made by imager (use `imager install`)",
                self.path.display()
            )
        })
    }

    /// The ESP's window, where it is a partition of its own: `None` on a
    /// disk of 4096-byte sectors, whose ESP is BOOT
    /// ([`contract::partition::esp_role`]).
    pub fn separate_esp(&self) -> Result<Option<Window<File>>> {
        match contract::partition::esp_role(self.table.sector_size) {
            PartitionRole::Boot => Ok(None),
            role => self.partition(role).map(Some),
        }
    }

    /// The architecture the disk boots: the one whose removable-media boot
    /// file (`EFI/BOOT/BOOTX64.EFI`, `BOOTAA64.EFI`: `contract::arch`) is on
    /// its ESP. A disk with none, or with several, is refused. The names
    /// are looked up in the directories alone ([`crate::fatfix::file_extent`]),
    /// without the whole filesystem's check: a boot loader's replacement cut
    /// by a power loss (two entries sharing clusters, which the check
    /// refuses) must not stop the upgrade that completes it.
    pub fn arch(&self) -> Result<contract::Arch> {
        let role = contract::partition::esp_role(self.table.sector_size);
        let mut esp = self.partition(role)?;
        one_arch(
            &loader_arches(&mut esp)?,
            &format!("{}: its ESP", self.path.display()),
        )
    }

    /// BOOT, whose new files carry the time `epoch`.
    pub fn boot(&self, epoch: u64) -> Result<BootFs<Window<File>>> {
        Ok(BootFs::new(self.partition(PartitionRole::Boot)?, epoch))
    }

    /// META.
    pub fn meta(&self) -> Result<Window<File>> {
        self.partition(PartitionRole::Meta)
    }
}

/// The architectures whose removable-media boot loader
/// (`EFI/BOOT/BOOTX64.EFI`, `BOOTAA64.EFI`: `contract::arch`) the FAT
/// filesystem `dev` holds, looked up in its directories alone
/// ([`crate::fatfix::file_extent`]).
pub fn loader_arches<T: std::io::Read + std::io::Seek>(dev: &mut T) -> Result<Vec<contract::Arch>> {
    let mut found = Vec::new();
    for a in contract::arch::ARCHES {
        if crate::fatfix::file_extent(dev, &a.arch.esp_boot_loader())?.is_some() {
            found.push(a.arch);
        }
    }
    Ok(found)
}

/// The one architecture of `found` ([`loader_arches`] of `what`), or why
/// the filesystem is refused: none (not made by imager), or several (which
/// one firmware starts depends on the machine).
pub fn one_arch(found: &[contract::Arch], what: &str) -> Result<contract::Arch> {
    match found {
        [one] => Ok(*one),
        [] => bail!(
            "{what} has no EFI/BOOT boot loader of {}: not a disk made by imager",
            contract::arch::ARCHES.map(|a| a.efi_boot_file).join(" or ")
        ),
        _ => bail!(
            "{what} has the boot loaders of several architectures ({}): which one the firmware \
             starts depends on the machine; remove the others",
            found
                .iter()
                .map(|a| a.name())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wait_open(p: &Path, access: Access) -> Disk {
        let start = std::time::Instant::now();
        loop {
            match Disk::open(p, access) {
                Ok(d) => return d,
                Err(e) if start.elapsed().as_secs() > 30 => panic!("{e:#}"),
                Err(_) => std::thread::yield_now(),
            }
        }
    }

    #[test]
    fn one_change_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("disk");
        let f = File::create(&p).unwrap();
        f.set_len(64 << 20).unwrap();
        let parts = [crate::gpt::NewPartition {
            label: "BOOT",
            type_guid: contract::guid::XBOOTLDR,
            unique_guid: contract::Guid::from_u128(1),
            first_lba: 2048,
            last_lba: 4095,
        }];
        let mut w = OpenOptions::new().read(true).write(true).open(&p).unwrap();
        crate::gpt::write_new(&mut w, 64 << 20, 512, contract::Guid::from_u128(2), &parts).unwrap();
        drop(w);
        let first = Disk::open(&p, Access::Write).unwrap();
        let e = format!("{:#}", Disk::open(&p, Access::Write).unwrap_err());
        assert!(e.contains("is in use") && e.contains("wait for it"), "{e}");
        let e = format!("{:#}", Disk::open(&p, Access::Read).unwrap_err());
        assert!(e.contains("is in use"), "{e}");
        drop(first);
        // Other tests' child processes may hold a copy of the descriptor
        // between their fork and exec: wait for the lock to be free.
        let a = wait_open(&p, Access::Read);
        let b = Disk::open(&p, Access::Read).unwrap();
        assert!(Disk::open(&p, Access::Write).is_err());
        assert_eq!(a.table, b.table);
        drop((a, b));
        wait_open(&p, Access::Write);
        // A FIFO is refused before it is opened.
        let fifo = dir.path().join("fifo");
        assert!(
            std::process::Command::new("mkfifo")
                .arg(&fifo)
                .status()
                .unwrap()
                .success()
        );
        let e = format!("{:#}", Disk::open(&fifo, Access::Read).unwrap_err());
        assert!(
            e.contains("neither a disk image file nor a block device"),
            "{e}"
        );
    }
}
