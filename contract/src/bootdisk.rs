//! The words that name the disk a machine booted from (docs/design.md,
//! "The boot disk"), as the runtime reads them: the UEFI loader's
//! variable and GRUB's command-line key. The runtime's `bootdisk` module
//! finds the disk they name.

use crate::cmdline;
use crate::guid::Guid;

/// systemd's loader variable naming the partition the loader was read
/// from (the Boot Loader Interface's vendor GUID): set by systemd-boot, and
/// by systemd-stub when a UKI is booted without it.
pub const LOADER_VARIABLE: &str = "LoaderDevicePartUUID-4a67b082-0a4c-41cf-b6c7-440b29bb8c4f";

/// [`LOADER_VARIABLE`]'s contents as efivarfs gives them: 4 bytes of
/// attributes, then a GUID as UTF-16LE text (upper or lower case),
/// NUL-terminated or not. Anything else is `None`.
pub fn decode_loader_variable(bytes: &[u8]) -> Option<Guid> {
    let text = bytes.get(4..)?;
    if text.len() % 2 != 0 || text.len() > 2 * 37 {
        return None;
    }
    let units: Vec<u16> = text
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect();
    let s = String::from_utf16(&units).ok()?;
    let s = s.strip_suffix('\0').unwrap_or(&s);
    if s.len() != 36 {
        return None;
    }
    Guid::try_parse(s).ok()
}

/// [`cmdline::BOOT_PART`]'s value, GRUB's word: `None` when absent or
/// empty (a GRUB whose core image cannot probe); an error, its value
/// escaped, when it is not a GUID.
pub fn boot_part(cmdline_text: &str) -> Result<Option<Guid>, String> {
    match cmdline::get(cmdline_text, cmdline::BOOT_PART) {
        None => Ok(None),
        Some(v) if v.is_empty() => Ok(None),
        Some(v) => Guid::try_parse(&v).map(Some).map_err(|_| {
            format!(
                "{}={} is not a GUID",
                cmdline::BOOT_PART,
                crate::text::excerpt(&v)
            )
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn utf16(s: &str) -> Vec<u8> {
        let mut b = vec![6, 0, 0, 0];
        for u in s.encode_utf16() {
            b.extend(u.to_le_bytes());
        }
        b
    }

    #[test]
    fn reads_the_loader_variable() {
        let g = "4c8a0a4f-6e0e-4f0c-9d0a-2f0b6d6c1a11";
        let want = Guid::try_parse(g).unwrap();
        assert_eq!(decode_loader_variable(&utf16(g)), Some(want));
        // systemd-boot writes it in upper case, with a NUL.
        let upper = format!("{}\0", g.to_uppercase());
        assert_eq!(decode_loader_variable(&utf16(&upper)), Some(want));
        for bad in [
            utf16(""),
            utf16("not a guid"),
            utf16(&format!("{g}x")),
            utf16(&format!("{{{g}}}")),
            vec![6, 0, 0],
            utf16(g)[..10].to_vec(),
            [utf16(g), vec![0]].concat(),
        ] {
            assert_eq!(decode_loader_variable(&bad), None, "{bad:?}");
        }
        // An unpaired surrogate is not text.
        let mut lone = vec![6, 0, 0, 0];
        lone.extend(0xd800u16.to_le_bytes());
        assert_eq!(decode_loader_variable(&lone), None);
    }

    #[test]
    fn reads_grubs_word() {
        let g = "0a9c1b1e-0000-4000-8000-000000000001";
        assert_eq!(
            boot_part(&format!("machined.slot=A machined.boot_part={g}")).unwrap(),
            Some(Guid::try_parse(g).unwrap())
        );
        assert_eq!(
            boot_part("machined.slot=A machined.boot_part=").unwrap(),
            None
        );
        assert_eq!(boot_part("machined.slot=A").unwrap(), None);
        let e = boot_part("machined.boot_part=\u{1b}[2J").unwrap_err();
        assert!(e.contains("is not a GUID") && !e.contains('\u{1b}'), "{e}");
    }
}
