//! The partition layout: which partitions an image has, in which order, with
//! which type GUID, filesystem and default size.
//!
//! ```text
//! | MBR | GPT | EFI | BIOS | BOOT | META | STATE | EPHEMERAL ........ | GPT |
//! ```
//!
//! Partition sizes can be changed by a profile; everything else here is fixed.

use crate::guid::{self, Guid};

pub const MIB: u64 = 1024 * 1024;

/// Every partition starts and ends on this boundary.
pub const ALIGNMENT: u64 = MIB;

/// What a partition is for. The label on disk is [`PartitionRole::label`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PartitionRole {
    Efi,
    Bios,
    Boot,
    Meta,
    State,
    Ephemeral,
}

/// How the builder fills a partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Content {
    /// FAT32 EFI System Partition: systemd-boot and loader.conf.
    EspFat,
    /// Raw space for GRUB's core image (BIOS path); zero-filled.
    Raw,
    /// FAT XBOOTLDR: the kernels, initramfs and boot entries of both slots.
    BootFat,
    /// META: two copies of the ADV block, see [`crate::meta`].
    Meta,
    /// Left unformatted by the builder; the runtime formats it (XFS).
    Unformatted,
}

/// One partition of the layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionSpec {
    pub role: PartitionRole,
    pub label: &'static str,
    pub type_guid: Guid,
    pub content: Content,
    /// Default size in bytes; `None` means "the rest of the disk".
    pub default_size: Option<u64>,
    /// The smallest size a profile may ask for, in bytes.
    pub min_size: u64,
    /// Whether a profile may change the size.
    pub resizable: bool,
}

/// The layout, in on-disk order.
pub const LAYOUT: [PartitionSpec; 6] = [
    PartitionSpec {
        role: PartitionRole::Efi,
        label: "EFI",
        type_guid: guid::EFI_SYSTEM,
        content: Content::EspFat,
        default_size: Some(100 * MIB),
        // FAT32 needs at least 65525 clusters; at 512-byte clusters, 33 MiB.
        min_size: 34 * MIB,
        resizable: true,
    },
    PartitionSpec {
        role: PartitionRole::Bios,
        label: "BIOS",
        type_guid: guid::BIOS_BOOT,
        content: Content::Raw,
        default_size: Some(MIB),
        min_size: MIB,
        resizable: false,
    },
    PartitionSpec {
        role: PartitionRole::Boot,
        label: "BOOT",
        type_guid: guid::XBOOTLDR,
        content: Content::BootFat,
        default_size: Some(300 * MIB),
        min_size: 16 * MIB,
        resizable: true,
    },
    PartitionSpec {
        role: PartitionRole::Meta,
        label: "META",
        type_guid: guid::LINUX_DATA,
        content: Content::Meta,
        default_size: Some(MIB),
        min_size: MIB,
        resizable: false,
    },
    PartitionSpec {
        role: PartitionRole::State,
        label: "STATE",
        type_guid: guid::LINUX_DATA,
        content: Content::Unformatted,
        default_size: Some(100 * MIB),
        min_size: 32 * MIB,
        resizable: true,
    },
    PartitionSpec {
        role: PartitionRole::Ephemeral,
        label: "EPHEMERAL",
        type_guid: guid::LINUX_DATA,
        content: Content::Unformatted,
        default_size: None,
        // mkfs.xfs refuses filesystems below 300 MiB.
        min_size: 300 * MIB,
        resizable: false,
    },
];

/// Default size of a whole disk image.
pub const DEFAULT_DISK_SIZE: u64 = 2048 * MIB;

/// Sector sizes the builder can lay out.
pub const SECTOR_SIZES: [u64; 2] = [512, 4096];

/// Number of GPT partition entries (the minimum the UEFI specification allows).
pub const GPT_ENTRIES: u32 = 128;

impl PartitionRole {
    pub fn spec(self) -> &'static PartitionSpec {
        LAYOUT
            .iter()
            .find(|p| p.role == self)
            .expect("every role is in LAYOUT")
    }

    pub fn label(self) -> &'static str {
        self.spec().label
    }

    /// The role whose label is `label` (exact, upper case).
    pub fn from_label(label: &str) -> Option<Self> {
        LAYOUT.iter().find(|p| p.label == label).map(|p| p.role)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_is_in_talos_order_and_aligned() {
        let labels: Vec<_> = LAYOUT.iter().map(|p| p.label).collect();
        assert_eq!(
            labels,
            ["EFI", "BIOS", "BOOT", "META", "STATE", "EPHEMERAL"]
        );
        for p in &LAYOUT {
            if let Some(s) = p.default_size {
                assert_eq!(s % ALIGNMENT, 0, "{}", p.label);
                assert!(s >= p.min_size, "{}", p.label);
            }
            assert_eq!(PartitionRole::from_label(p.label), Some(p.role));
        }
        // Only the last partition takes the rest of the disk.
        assert!(LAYOUT[..5].iter().all(|p| p.default_size.is_some()));
        assert!(LAYOUT[5].default_size.is_none());
    }
}
