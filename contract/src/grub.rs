//! GRUB 2 on the BIOS path: where its configuration lives on BOOT and the
//! prefix its core image is made with. What `grub.cfg` says (the A-B
//! script, the good slot, each slot's lines) is [`crate::grubcfg`]; the
//! environment block is [`crate::grubenv`].
//!
//! GRUB's core image sits in the BIOS partition; its prefix names BOOT by
//! partition number only, `(,gpt3)/grub`, so GRUB looks for BOOT on the disk
//! it was loaded from (as `grub-install` does), whichever BIOS drive number
//! that disk has. It then reads [`CONFIG_PATH`] from BOOT.
//!

use crate::partition::{LAYOUT, PartitionRole};

/// The directory of GRUB's files on BOOT (the prefix's path).
pub const CONFIG_DIR: &str = "grub";
/// GRUB's configuration on BOOT, relative to the partition root.
pub const CONFIG_PATH: &str = crate::paths::BOOT_GRUB_CFG;

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

/// The first character of `options` that GRUB cannot pass to the kernel
/// as it is ([`crate::grubcfg::ESCAPED_BY_GRUB`]).
pub fn unpassable(options: &str) -> Option<char> {
    options
        .chars()
        .find(|c| crate::grubcfg::ESCAPED_BY_GRUB.contains(c))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_names_boot_by_number() {
        assert_eq!(boot_partition_number(), 3);
        assert_eq!(LAYOUT[boot_partition_number() - 1].label, "BOOT");
        assert_eq!(core_prefix(), "(,gpt3)/grub");
        assert_eq!(CONFIG_PATH, format!("{CONFIG_DIR}/grub.cfg"));
    }
}
