//! UEFI variables through efivarfs, mounted read-only at [`EFIVARS`] when
//! it is not there yet: the one place the runtime reads them
//! ([`crate::secureboot`]'s `SecureBoot`, [`crate::bootdisk`]'s
//! `LoaderDevicePartUUID`). Each variable file is 4 bytes of attributes,
//! then the value; a value is read up to [`MAX_VAR`] bytes.

use crate::mount;
use anyhow::{Context, Result, bail};
use std::io::Read;
use std::path::Path;

const EFI: &str = "/sys/firmware/efi";
const EFIVARS: &str = "/sys/firmware/efi/efivars";
/// statfs(2)'s f_type of efivarfs (<linux/magic.h>).
const EFIVARFS_MAGIC: i64 = 0xde5e_81e4;
/// The longest variable read (attributes included): both variables read
/// are far shorter; a longer one is refused, not read whole.
pub const MAX_VAR: u64 = 4096;

/// Whether the machine booted through UEFI (the kernel has its runtime
/// services: `/sys/firmware/efi`).
pub fn booted_uefi() -> bool {
    Path::new(EFI).is_dir()
}

fn mounted() -> bool {
    let Ok(c) = crate::sys::cstr(EFIVARS) else {
        return false;
    };
    // SAFETY: statfs fills the zeroed struct; the path is a C string.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    let r = unsafe { libc::statfs(c.as_ptr(), &mut st) };
    r == 0 && st.f_type as i64 == EFIVARFS_MAGIC
}

const MOUNT_FLAGS: libc::c_ulong = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;

fn mount_read_only() -> Result<()> {
    if !mounted() {
        mount::fs("efivarfs", EFIVARS, libc::MS_RDONLY | MOUNT_FLAGS, None)
            .context("mounting efivarfs (is CONFIG_EFIVAR_FS on?)")?;
    }
    Ok(())
}

/// The variable `name-GUID` (attributes and value); `None` when the
/// firmware has no such variable. Mounts efivarfs first if need be.
pub fn read(name_guid: &str) -> Result<Option<Vec<u8>>> {
    read_up_to(name_guid, MAX_VAR)
}

/// [`read`] of a variable of up to `max` bytes (attributes included): db
/// and dbx are longer than [`MAX_VAR`].
pub fn read_up_to(name_guid: &str, max: u64) -> Result<Option<Vec<u8>>> {
    mount_read_only()?;
    let path = Path::new(EFIVARS).join(name_guid);
    let f = match std::fs::File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let mut bytes = Vec::new();
    f.take(max + 1)
        .read_to_end(&mut bytes)
        .with_context(|| format!("reading {}", path.display()))?;
    if bytes.len() as u64 > max {
        bail!("{} is longer than {max} bytes", path.display());
    }
    Ok(Some(bytes))
}

/// Appends to the variable `name-GUID` through efivarfs: `update` is a
/// time-based authenticated update (`EFI_VARIABLE_AUTHENTICATION_2` and
/// the data), written after `attributes` in one `write`, which the kernel
/// passes to firmware's `SetVariable` as they are (`attributes` must hold
/// `EFI_VARIABLE_APPEND_WRITE`: efivarfs does not add it for `O_APPEND`,
/// and firmware checks the signature over the attributes it is given).
/// Firmware refuses what its KEK did not sign (the write then fails). efivarfs is remounted writable for the write only, and
/// the variable's immutable flag (efivarfs sets it on db and dbx) cleared
/// for it and set again.
pub fn append(name_guid: &str, attributes: u32, update: &[u8]) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    mount_read_only()?;
    let remount = |flags: libc::c_ulong| {
        mount::mount(
            None,
            EFIVARS,
            None,
            libc::MS_REMOUNT | MOUNT_FLAGS | flags,
            None,
        )
        .context("remounting efivarfs")
    };
    remount(0)?;
    let path = Path::new(EFIVARS).join(name_guid);
    let result = (|| -> Result<()> {
        let existed = path.exists();
        if existed {
            set_immutable(&path, false)?;
        }
        let mut buf = Vec::with_capacity(4 + update.len());
        buf.extend_from_slice(&attributes.to_le_bytes());
        buf.extend_from_slice(update);
        let written = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .and_then(|mut f| f.write(&buf))
            .with_context(|| {
                format!(
                    "writing {} (firmware refused the update: not signed by its KEK?)",
                    path.display()
                )
            })?;
        if written != buf.len() {
            bail!(
                "{}: {written} of {} bytes written",
                path.display(),
                buf.len()
            );
        }
        if existed {
            set_immutable(&path, true)?;
        }
        Ok(())
    })();
    let back = remount(libc::MS_RDONLY);
    result.and(back)
}

/// Sets or clears a file's immutable flag (chattr +i / -i).
fn set_immutable(path: &Path, on: bool) -> Result<()> {
    use std::os::fd::AsRawFd;
    const FS_IMMUTABLE_FL: libc::c_uint = 0x10;
    let f = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut flags: libc::c_uint = 0;
    // SAFETY: the ioctls read and write one unsigned int through the
    // pointer, on an open descriptor.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), libc::FS_IOC_GETFLAGS, &mut flags) };
    if r != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("reading the flags of {}", path.display()));
    }
    flags = if on {
        flags | FS_IMMUTABLE_FL
    } else {
        flags & !FS_IMMUTABLE_FL
    };
    let r = unsafe { libc::ioctl(f.as_raw_fd(), libc::FS_IOC_SETFLAGS, &flags) };
    if r != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("setting the flags of {}", path.display()));
    }
    Ok(())
}
