//! Whether the firmware booted with Secure Boot on, for the ready line:
//! the UEFI global variable `SecureBoot` (4 bytes of attributes, then one
//! byte, 1 = on) read through efivarfs, mounted read-only at
//! [`EFIVARS`] when it is not there yet.
//!
//! Without `/sys/firmware/efi` the machine booted through BIOS: off. A UEFI
//! boot whose efivarfs cannot be mounted (a kernel without
//! CONFIG_EFIVAR_FS) or read is `unknown`; never a failure of the boot.
//! Firmware without Secure Boot support has no such variable: off.

use crate::console::say;
use crate::mount;
use contract::ready::SecureBoot;
use std::path::Path;

const EFI: &str = "/sys/firmware/efi";
const EFIVARS: &str = "/sys/firmware/efi/efivars";
/// EFI_GLOBAL_VARIABLE's GUID.
const VARIABLE: &str = "SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c";
/// statfs(2)'s f_type of efivarfs (<linux/magic.h>).
const EFIVARFS_MAGIC: i64 = 0xde5e_81e4;

/// The variable's contents to a state: attributes (4 bytes) and a byte.
pub fn decode(bytes: &[u8]) -> SecureBoot {
    match bytes {
        [_, _, _, _, 1] => SecureBoot::On,
        [_, _, _, _, 0] => SecureBoot::Off,
        _ => SecureBoot::Unknown,
    }
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

/// The Secure Boot state of this boot.
pub fn state() -> SecureBoot {
    if !Path::new(EFI).is_dir() {
        return SecureBoot::Off;
    }
    if !mounted() {
        let flags = libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
        if let Err(e) = mount::fs("efivarfs", EFIVARS, flags, None) {
            say(format!(
                "stage2: warning: cannot read the Secure Boot state: {e:#} (is \
                 CONFIG_EFIVAR_FS on?)"
            ));
            return SecureBoot::Unknown;
        }
    }
    match std::fs::read(Path::new(EFIVARS).join(VARIABLE)) {
        Ok(bytes) => decode(&bytes),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => SecureBoot::Off,
        Err(e) => {
            say(format!(
                "stage2: warning: reading {EFIVARS}/{VARIABLE}: {e}"
            ));
            SecureBoot::Unknown
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variable_contents() {
        assert_eq!(decode(&[6, 0, 0, 0, 1]), SecureBoot::On);
        assert_eq!(decode(&[6, 0, 0, 0, 0]), SecureBoot::Off);
        assert_eq!(decode(&[6, 0, 0, 0, 2]), SecureBoot::Unknown);
        assert_eq!(decode(&[6, 0, 0, 0]), SecureBoot::Unknown);
        assert_eq!(decode(&[6, 0, 0, 0, 1, 0]), SecureBoot::Unknown);
        assert_eq!(decode(&[]), SecureBoot::Unknown);
    }
}
