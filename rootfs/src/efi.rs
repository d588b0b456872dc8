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

/// The variable `name-GUID` (attributes and value); `None` when the
/// firmware has no such variable. Mounts efivarfs first if need be.
pub fn read(name_guid: &str) -> Result<Option<Vec<u8>>> {
    if !mounted() {
        let flags = libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
        mount::fs("efivarfs", EFIVARS, flags, None)
            .context("mounting efivarfs (is CONFIG_EFIVAR_FS on?)")?;
    }
    let path = Path::new(EFIVARS).join(name_guid);
    let f = match std::fs::File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let mut bytes = Vec::new();
    f.take(MAX_VAR + 1)
        .read_to_end(&mut bytes)
        .with_context(|| format!("reading {}", path.display()))?;
    if bytes.len() as u64 > MAX_VAR {
        bail!("{} is longer than {MAX_VAR} bytes", path.display());
    }
    Ok(Some(bytes))
}
