//! GRUB 2 on the BIOS path: where its configuration lives on BOOT, the
//! prefix its core image is made with, and `grub.cfg` rendered from the same
//! boot entry systemd-boot reads ([`crate::boot::Entry`]).
//!
//! GRUB's core image sits in the BIOS partition; its prefix names BOOT by
//! partition number only, `(,gpt3)/grub`, so GRUB looks for BOOT on the disk
//! it was loaded from (as `grub-install` does), whichever BIOS drive number
//! that disk has. It then reads [`CONFIG_PATH`] from BOOT.
//!
//! This first rendering boots one slot (the default one) with no menu; the
//! A-B rendering with boot counting grows from it.

use crate::boot::Entry;
use crate::partition::{LAYOUT, PartitionRole};

/// The directory of GRUB's files on BOOT (the prefix's path).
pub const CONFIG_DIR: &str = "grub";
/// GRUB's configuration on BOOT, relative to the partition root.
pub const CONFIG_PATH: &str = "grub/grub.cfg";

/// BOOT's partition number (1-based, as GRUB's `gptN` and Linux count):
/// its position in [`LAYOUT`].
pub fn boot_partition_number() -> usize {
    LAYOUT
        .iter()
        .position(|p| p.role == PartitionRole::Boot)
        .map_or(0, |i| i + 1)
}

/// The prefix of the core image: BOOT's `grub` directory on the disk GRUB
/// was loaded from (no drive named: `(,gpt3)/grub`).
pub fn core_prefix() -> String {
    format!("(,gpt{})/{CONFIG_DIR}", boot_partition_number())
}

/// Characters GRUB's `linux` command passes to the kernel escaped with a
/// backslash (`grub_create_loader_cmdline`, grub-core/lib/cmdline.c in GRUB
/// 2.06): the kernel would see other arguments than systemd-boot gives it.
pub const ESCAPED_BY_GRUB: [char; 3] = ['"', '\'', '\\'];

/// The first character of `options` that GRUB cannot pass to the kernel
/// as it is ([`ESCAPED_BY_GRUB`]).
pub fn unpassable(options: &str) -> Option<char> {
    options.chars().find(|c| ESCAPED_BY_GRUB.contains(c))
}

/// One word for GRUB's script parser: as it is when it holds only characters
/// the parser takes literally, else in single quotes (nothing is expanded
/// inside them; a `'` is written `'\''`).
fn word(s: &str) -> String {
    let plain = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.,:=/+@%".contains(c));
    if plain {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// `grub.cfg` booting `entry` at once: serial console and screen, no menu
/// (`timeout=0`), one menu entry with the entry's kernel, options and
/// initramfs. Refused (with the character) when the options hold a
/// character GRUB would pass escaped ([`unpassable`]).
pub fn render(entry: &Entry) -> Result<String, String> {
    if let Some(c) = unpassable(&entry.options) {
        return Err(format!(
            "the kernel command line holds `{c}`, which GRUB (the BIOS boot path) passes to \
             the kernel escaped with a backslash: remove it"
        ));
    }
    if entry.linux.is_empty() {
        return Err("the boot entry has no kernel".into());
    }
    let mut s = String::from(
        "# Written by imager: the BIOS boot path. Do not edit.\n\
         serial --unit=0 --speed=115200\n\
         terminal_input serial console\n\
         terminal_output serial console\n\
         set timeout=0\n\
         set default=0\n",
    );
    s.push_str(&format!("menuentry {} {{\n", word(&entry.title)));
    let mut linux = format!("\tlinux {}", word(&format!("/{}", entry.linux)));
    for arg in entry.options.split_whitespace() {
        linux.push(' ');
        linux.push_str(&word(arg));
    }
    s.push_str(&linux);
    s.push('\n');
    if !entry.initrd.is_empty() {
        s.push_str(&format!(
            "\tinitrd {}\n",
            word(&format!("/{}", entry.initrd))
        ));
    }
    s.push_str("}\n");
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Slot;
    use crate::boot::slot_entry;

    #[test]
    fn prefix_names_boot_by_number() {
        assert_eq!(boot_partition_number(), 3);
        assert_eq!(LAYOUT[boot_partition_number() - 1].label, "BOOT");
        assert_eq!(core_prefix(), "(,gpt3)/grub");
        assert_eq!(CONFIG_PATH, format!("{CONFIG_DIR}/grub.cfg"));
    }

    #[test]
    fn renders_one_entry() {
        let e = slot_entry(
            Slot::A,
            "0123456789abcdef0123",
            "fedcba9876543210ff",
            "Imager 1.0",
            "1.0",
            "console=ttyS0,115200 panic=10 x=$y;z",
        );
        let cfg = render(&e).unwrap();
        assert_eq!(
            cfg,
            "# Written by imager: the BIOS boot path. Do not edit.\n\
             serial --unit=0 --speed=115200\n\
             terminal_input serial console\n\
             terminal_output serial console\n\
             set timeout=0\n\
             set default=0\n\
             menuentry 'Imager 1.0 (slot A)' {\n\
             \tlinux /A/vmlinuz-0123456789abcdef console=ttyS0,115200 panic=10 'x=$y;z' \
             machined.slot=A\n\
             \tinitrd /A/initramfs-fedcba9876543210.zst\n\
             }\n"
        );
        let e = Entry {
            title: "it's".into(),
            ..e
        };
        assert!(render(&e).unwrap().contains("menuentry 'it'\\''s' {"));
        for bad in ["a=\"b c\"", "a='b'", "a\\b"] {
            let e = Entry {
                options: bad.into(),
                ..e.clone()
            };
            let err = render(&e).unwrap_err();
            assert!(err.contains("escaped with a backslash"), "{err}");
        }
    }
}
