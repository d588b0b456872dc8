//! Whether the firmware booted with Secure Boot on, for the ready line:
//! the UEFI global variable `SecureBoot` (4 bytes of attributes, then one
//! byte, 1 = on) read through efivarfs ([`crate::efi`]).
//!
//! Without `/sys/firmware/efi` the machine booted through BIOS: off. A UEFI
//! boot whose efivarfs cannot be mounted (a kernel without
//! CONFIG_EFIVAR_FS) or read is `unknown`; never a failure of the boot.
//! Firmware without Secure Boot support has no such variable: off.

use crate::console::say;
use crate::efi;
use contract::ready::SecureBoot;

/// EFI_GLOBAL_VARIABLE's `SecureBoot`.
const VARIABLE: &str = "SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c";

/// The variable's contents to a state: attributes (4 bytes) and a byte.
pub fn decode(bytes: &[u8]) -> SecureBoot {
    match bytes {
        [_, _, _, _, 1] => SecureBoot::On,
        [_, _, _, _, 0] => SecureBoot::Off,
        _ => SecureBoot::Unknown,
    }
}

/// The Secure Boot state of this boot.
pub fn state() -> SecureBoot {
    if !efi::booted_uefi() {
        return SecureBoot::Off;
    }
    match efi::read(VARIABLE) {
        Ok(Some(bytes)) => decode(&bytes),
        Ok(None) => SecureBoot::Off,
        Err(e) => {
            say(format!(
                "stage2: warning: cannot read the Secure Boot state: {e:#}"
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
