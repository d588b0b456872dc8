//! The partition layout: which partitions an image has, in which order, with
//! which type GUID, filesystem and default size.
//!
//! ```text
//! | MBR | GPT | EFI | BIOS | BOOT | META | STATE | EPHEMERAL ........ | GPT |
//! ```
//!
//! Partition sizes can be changed by a profile; everything else here is fixed,
//! except what the sector size decides ([`esp_role`]): on a 4096-byte-sector
//! disk BOOT is the ESP and EFI is left empty.

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
    /// GRUB's core image (the BIOS path, `bootstate::bios`); zeros where no
    /// GRUB is written (4096-byte sectors).
    Raw,
    /// FAT XBOOTLDR: the kernels, initramfs and boot entries of both slots.
    BootFat,
    /// FAT ESP holding both: systemd-boot and loader.conf as [`Self::EspFat`]
    /// and the slots' files as [`Self::BootFat`] (BOOT at 4096-byte sectors,
    /// [`esp_role`]).
    EspBootFat,
    /// Nothing: zeros (EFI at 4096-byte sectors, [`esp_role`]). An install
    /// onto a used disk clears its start, so no old boot loader is left there
    /// for the firmware to find.
    Reserved,
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

/// The partition that is the ESP: the one the firmware loads systemd-boot
/// from and the one systemd-boot reads its configuration from.
///
/// - At 512-byte sectors, EFI: systemd-boot and `loader.conf` on it, the
///   slots' files and boot entries on BOOT (an XBOOTLDR partition), which
///   systemd-boot finds by its type.
/// - At 4096-byte sectors, BOOT: systemd-boot (Debian 12's 252, and
///   upstream up to at least 257) does not find an XBOOTLDR partition on a
///   disk of 4096-byte logical blocks (systemd/systemd#32535), but reads
///   entries from the ESP it was loaded from whatever its block size. So
///   BOOT is typed as the ESP and carries systemd-boot beside the slots'
///   files, and EFI is typed Linux reserved and left empty: the disk has one
///   ESP (firmware that looks at the first ESP only finds the right one),
///   and the layout (partition numbers, sizes, labels, what the runtime and
///   `bootstate` write) is the same at both sector sizes.
pub fn esp_role(sector_size: u64) -> PartitionRole {
    if sector_size > 512 {
        PartitionRole::Boot
    } else {
        PartitionRole::Efi
    }
}

impl PartitionSpec {
    /// The type GUID of this partition on a disk of `sector_size`-byte
    /// sectors ([`esp_role`]).
    pub fn type_guid_at(&self, sector_size: u64) -> Guid {
        match (self.role, esp_role(sector_size)) {
            (PartitionRole::Efi, PartitionRole::Boot) => guid::LINUX_RESERVED,
            (PartitionRole::Boot, PartitionRole::Boot) => guid::EFI_SYSTEM,
            _ => self.type_guid,
        }
    }

    /// What the builder puts in this partition on a disk of
    /// `sector_size`-byte sectors ([`esp_role`]).
    pub fn content_at(&self, sector_size: u64) -> Content {
        match (self.role, esp_role(sector_size)) {
            (PartitionRole::Efi, PartitionRole::Boot) => Content::Reserved,
            (PartitionRole::Boot, PartitionRole::Boot) => Content::EspBootFat,
            _ => self.content,
        }
    }
}

/// Default size of a whole disk image.
pub const DEFAULT_DISK_SIZE: u64 = 2048 * MIB;

/// Sector sizes the builder can lay out.
pub const SECTOR_SIZES: [u64; 2] = [512, 4096];

/// Number of GPT partition entries (the minimum the UEFI specification allows).
pub const GPT_ENTRIES: u32 = 128;

/// Size of one GPT partition entry as the builder writes it (UEFI allows
/// 128 × 2^n; readers accept those, see `bootstate::gpt`).
pub const GPT_ENTRY_SIZE: u64 = 128;

/// Sectors taken by one copy of a GPT entry array of `array_bytes`.
pub fn gpt_array_sectors(array_bytes: u64, sector: u64) -> u64 {
    array_bytes.div_ceil(sector)
}

/// Sectors taken by one copy of the builder's entry array
/// ([`GPT_ENTRIES`] entries of [`GPT_ENTRY_SIZE`] bytes).
pub fn entry_array_sectors(sector: u64) -> u64 {
    gpt_array_sectors(u64::from(GPT_ENTRIES) * GPT_ENTRY_SIZE, sector)
}

/// The first sector a partition may use: after the protective MBR, the
/// primary header and the primary entry array of `array_sectors`.
pub fn first_usable_lba(array_sectors: u64) -> u64 {
    2 + array_sectors
}

/// Where the end of a GPT disk goes: the backup entry array and header in
/// its last sectors, the last usable sector before them, and where the last
/// partition ends (rounded down to [`ALIGNMENT`]). The builder lays a new
/// disk out with it and the runtime grows the last partition with it, so the
/// two agree to the sector.
///
/// ```text
/// ... last partition | (alignment slack) | backup entries | backup header |
///                    ^ partitions_end    ^ last_usable+1  ^               ^ total-1
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskEnd {
    /// The backup header: the disk's last sector.
    pub backup_header_lba: u64,
    /// The backup entry array, just before it.
    pub backup_entries_lba: u64,
    /// The last sector a partition may use.
    pub last_usable_lba: u64,
    /// Byte offset where the last partition ends (exclusive), a multiple of
    /// [`ALIGNMENT`] and of the sector size.
    pub partitions_end: u64,
}

impl DiskEnd {
    /// The end of a disk of `disk_bytes` with `sector`-byte sectors and entry
    /// arrays of `array_sectors`; `None` when the disk cannot hold even the
    /// backup table.
    pub fn of(disk_bytes: u64, sector: u64, array_sectors: u64) -> Option<DiskEnd> {
        if sector == 0 {
            return None;
        }
        let total = disk_bytes / sector;
        let backup_header_lba = total.checked_sub(1)?;
        let backup_entries_lba = backup_header_lba.checked_sub(array_sectors)?;
        let last_usable_lba = backup_entries_lba.checked_sub(1)?;
        let usable_end = last_usable_lba.checked_add(1)?.checked_mul(sector)?;
        let partitions_end = usable_end / ALIGNMENT * ALIGNMENT;
        if !partitions_end.is_multiple_of(sector) {
            return None;
        }
        Some(DiskEnd {
            backup_header_lba,
            backup_entries_lba,
            last_usable_lba,
            partitions_end,
        })
    }

    /// The last sector of a last partition that ends at [`Self::partitions_end`].
    pub fn last_partition_lba(&self, sector: u64) -> Option<u64> {
        (self.partitions_end / sector).checked_sub(1)
    }
}

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

    /// Every disk has exactly one ESP, the partition [`esp_role`] names,
    /// holding systemd-boot; BOOT's files are on a FAT partition at every
    /// sector size, and only EFI and BOOT change with it.
    #[test]
    fn one_esp_at_every_sector_size() {
        for ss in SECTOR_SIZES {
            let esps: Vec<_> = LAYOUT
                .iter()
                .filter(|p| p.type_guid_at(ss) == guid::EFI_SYSTEM)
                .map(|p| p.role)
                .collect();
            assert_eq!(esps, [esp_role(ss)], "{ss}");
            let loader: Vec<_> = LAYOUT
                .iter()
                .filter(|p| matches!(p.content_at(ss), Content::EspFat | Content::EspBootFat))
                .map(|p| p.role)
                .collect();
            assert_eq!(loader, [esp_role(ss)], "{ss}");
            let slots: Vec<_> = LAYOUT
                .iter()
                .filter(|p| matches!(p.content_at(ss), Content::BootFat | Content::EspBootFat))
                .map(|p| p.role)
                .collect();
            assert_eq!(slots, [PartitionRole::Boot], "{ss}");
            for p in &LAYOUT {
                if !matches!(p.role, PartitionRole::Efi | PartitionRole::Boot) {
                    assert_eq!(p.type_guid_at(ss), p.type_guid, "{}", p.label);
                    assert_eq!(p.content_at(ss), p.content, "{}", p.label);
                }
            }
        }
        assert_eq!(esp_role(512), PartitionRole::Efi);
        assert_eq!(LAYOUT[0].type_guid_at(4096), guid::LINUX_RESERVED);
        assert_eq!(LAYOUT[2].type_guid_at(512), guid::XBOOTLDR);
    }

    #[test]
    fn the_end_of_a_disk() {
        // 2 GiB at 512-byte sectors: 33 sectors of backup, the last MiB free.
        let e = DiskEnd::of(2048 * MIB, 512, entry_array_sectors(512)).unwrap();
        let total = 2048 * MIB / 512;
        assert_eq!(e.backup_header_lba, total - 1);
        assert_eq!(e.backup_entries_lba, total - 33);
        assert_eq!(e.last_usable_lba, total - 34);
        assert_eq!(e.partitions_end, 2047 * MIB);
        assert_eq!(e.last_partition_lba(512), Some(2047 * MIB / 512 - 1));
        // At 4096-byte sectors the backup takes 5 sectors: 5 spare sectors
        // past a MiB boundary hold it exactly.
        let e = DiskEnd::of(3072 * MIB + 5 * 4096, 4096, entry_array_sectors(4096)).unwrap();
        assert_eq!(e.partitions_end, 3072 * MIB);
        let e = DiskEnd::of(3072 * MIB + 5 * 512, 512, entry_array_sectors(512)).unwrap();
        assert_eq!(e.partitions_end, 3071 * MIB);
        assert_eq!(first_usable_lba(entry_array_sectors(512)), 34);
        assert_eq!(first_usable_lba(entry_array_sectors(4096)), 6);
        // Too small for a table, or no sector size at all.
        assert_eq!(DiskEnd::of(512 * 10, 512, 33), None);
        assert_eq!(DiskEnd::of(MIB, 0, 33), None);
        assert_eq!(
            DiskEnd::of(u64::MAX, 512, 33).map(|e| e.partitions_end % MIB),
            Some(0)
        );
    }
}
