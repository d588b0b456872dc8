//! What the runtime's ready line says of the boot chain, beside version,
//! slot and uptime: `secureboot=on|off|unknown root=verified|unverified`.
//! The runtime prints these words and `imager::qemu::parse_ready` reads
//! them back, both from here.

/// The ready line's key for the Secure Boot state.
pub const SECURE_BOOT: &str = "secureboot";
/// The ready line's key for the root filesystem's verification.
pub const ROOT: &str = "root";

/// Whether the firmware booted with Secure Boot enforced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SecureBoot {
    /// The firmware's `SecureBoot` variable is 1.
    On,
    /// It is 0, or the machine booted without UEFI (BIOS).
    Off,
    /// A UEFI boot whose variable could not be read (no efivarfs in the
    /// kernel, say).
    Unknown,
}

impl SecureBoot {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::On => "on",
            Self::Off => "off",
            Self::Unknown => "unknown",
        }
    }

    pub fn parse(v: &str) -> Option<Self> {
        [Self::On, Self::Off, Self::Unknown]
            .into_iter()
            .find(|s| s.as_str() == v)
    }
}

/// Whether the root filesystem was opened through dm-verity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Root {
    /// Through dm-verity with the command line's root hash, every block
    /// read and checked once before it was mounted.
    Verified,
    /// Mounted directly (no `machined.verity=` on the command line).
    Unverified,
}

impl Root {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Verified => "verified",
            Self::Unverified => "unverified",
        }
    }

    pub fn parse(v: &str) -> Option<Self> {
        [Self::Verified, Self::Unverified]
            .into_iter()
            .find(|s| s.as_str() == v)
    }
}

/// The ready line's words for these states: `secureboot=on root=verified`.
pub fn words(secure_boot: SecureBoot, root: Root) -> String {
    format!(
        "{SECURE_BOOT}={} {ROOT}={}",
        secure_boot.as_str(),
        root.as_str()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_read_back() {
        assert_eq!(
            words(SecureBoot::Unknown, Root::Verified),
            "secureboot=unknown root=verified"
        );
        for s in [SecureBoot::On, SecureBoot::Off, SecureBoot::Unknown] {
            assert_eq!(SecureBoot::parse(s.as_str()), Some(s));
        }
        for r in [Root::Verified, Root::Unverified] {
            assert_eq!(Root::parse(r.as_str()), Some(r));
        }
        assert_eq!(SecureBoot::parse("yes"), None);
        assert_eq!(Root::parse(""), None);
    }
}
