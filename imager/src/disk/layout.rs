//! Partition placement: from a disk size, a sector size and the profile's
//! size overrides to the first and last LBA of every partition of
//! [`contract::LAYOUT`].
//!
//! ```text
//! LBA 0        protective MBR
//! LBA 1        primary GPT header
//! LBA 2..      primary entry array (128 entries of 128 bytes)
//! 1 MiB        EFI, BIOS, BOOT, META, STATE, each 1 MiB aligned
//! ...          EPHEMERAL: the rest, its end rounded down to 1 MiB
//! end - 16 KiB - 1 sector   backup entry array
//! last LBA     backup GPT header
//! ```

use anyhow::{Result, bail};
use contract::partition::{
    ALIGNMENT, DiskEnd, MIB, SECTOR_SIZES, entry_array_sectors, first_usable_lba,
};
use contract::{LAYOUT, PartitionRole, PartitionSpec};
use std::collections::BTreeMap;

/// A partition of the layout placed on a disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlacedPartition {
    pub spec: &'static PartitionSpec,
    /// First sector, inclusive.
    pub first_lba: u64,
    /// Last sector, inclusive.
    pub last_lba: u64,
    /// Sector size of the disk, in bytes.
    pub sector_size: u64,
}

impl PlacedPartition {
    pub fn label(&self) -> &'static str {
        self.spec.label
    }

    pub fn role(&self) -> PartitionRole {
        self.spec.role
    }

    /// Byte offset of the partition on the disk.
    pub fn offset(&self) -> u64 {
        self.first_lba * self.sector_size
    }

    /// Size of the partition in bytes.
    pub fn len(&self) -> u64 {
        (self.last_lba + 1 - self.first_lba) * self.sector_size
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Where every partition of [`LAYOUT`] goes on a disk of a given size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// Size of the disk image in bytes (a multiple of the sector size).
    pub disk_size: u64,
    /// Logical sector size in bytes: 512 or 4096.
    pub sector_size: u64,
    /// The partitions, in [`LAYOUT`] order.
    pub partitions: Vec<PlacedPartition>,
}

fn mib(bytes: u64) -> String {
    if bytes.is_multiple_of(MIB) {
        format!("{} MiB", bytes / MIB)
    } else {
        format!("{bytes} bytes")
    }
}

/// Refuses sizes for unknown or fixed partitions, sizes off the alignment and
/// sizes below a partition's minimum.
fn check_overrides(overrides: &BTreeMap<String, u64>) -> Result<()> {
    for (label, size) in overrides {
        let Some(spec) = LAYOUT.iter().find(|p| p.label == label.as_str()) else {
            let known: Vec<_> = LAYOUT.iter().map(|p| p.label).collect();
            bail!("unknown partition {label:?} in the partition sizes: known are {known:?}");
        };
        if !spec.resizable {
            let resizable: Vec<_> = LAYOUT
                .iter()
                .filter(|p| p.resizable)
                .map(|p| p.label)
                .collect();
            bail!(
                "partition {label} has a fixed size and cannot be resized: \
                 only {resizable:?} can"
            );
        }
        if !size.is_multiple_of(ALIGNMENT) {
            bail!(
                "size of partition {label} ({size} bytes) is not a multiple of {}: \
                 give it in whole MiB",
                mib(ALIGNMENT)
            );
        }
        if *size < spec.min_size {
            bail!(
                "partition {label} of {} is too small: it needs at least {}",
                mib(*size),
                mib(spec.min_size)
            );
        }
    }
    Ok(())
}

impl Layout {
    /// Places the partitions on a disk of `disk_size` bytes with sectors of
    /// `sector_size` bytes. `overrides` maps partition labels to sizes in
    /// bytes; only resizable partitions may be named.
    pub fn new(
        disk_size: u64,
        sector_size: u64,
        overrides: &BTreeMap<String, u64>,
    ) -> Result<Layout> {
        if !SECTOR_SIZES.contains(&sector_size) {
            bail!("sector size {sector_size} is not supported: use one of {SECTOR_SIZES:?}");
        }
        if !disk_size.is_multiple_of(sector_size) {
            bail!(
                "disk size {disk_size} bytes is not a multiple of the sector size {sector_size}; \
                 give disk.size in whole MiB in the profile"
            );
        }
        check_overrides(overrides)?;

        let ss = sector_size;
        let array = entry_array_sectors(ss);
        let mut at = ALIGNMENT; // byte offset of the next partition
        let mut partitions = Vec::with_capacity(LAYOUT.len());
        let mut rest = None;
        for (i, spec) in LAYOUT.iter().enumerate() {
            match overrides.get(spec.label).copied().or(spec.default_size) {
                Some(size) => {
                    partitions.push(PlacedPartition {
                        spec,
                        first_lba: at / ss,
                        last_lba: (at + size) / ss - 1,
                        sector_size: ss,
                    });
                    at += size;
                }
                None => {
                    // Only the last partition takes the rest of the disk.
                    if i + 1 != LAYOUT.len() {
                        bail!("internal: partition {} has no size", spec.label);
                    }
                    rest = Some(spec);
                }
            }
        }
        let rest = rest.ok_or_else(|| anyhow::anyhow!("internal: no partition takes the rest"))?;

        // The backup GPT: entry array then header, in the last sectors
        // (contract::partition::DiskEnd, which the runtime's grow uses too).
        let backup = (array + 1) * ss;
        let needed = at + rest.min_size + backup;
        let too_small = || {
            anyhow::anyhow!(
                "disk size {} is too small for the partitions: needs at least {} MiB; \
                 raise disk.size in the profile",
                mib(disk_size),
                needed.div_ceil(MIB)
            )
        };
        let end = DiskEnd::of(disk_size, ss, array)
            .ok_or_else(too_small)?
            .partitions_end;
        if end < at + rest.min_size {
            return Err(too_small());
        }
        partitions.push(PlacedPartition {
            spec: rest,
            first_lba: at / ss,
            last_lba: end / ss - 1,
            sector_size: ss,
        });
        Ok(Layout {
            disk_size,
            sector_size,
            partitions,
        })
    }

    /// The partition of `role`.
    pub fn get(&self, role: PartitionRole) -> &PlacedPartition {
        self.partitions
            .iter()
            .find(|p| p.spec.role == role)
            .expect("a layout places every role")
    }

    /// Number of sectors of the disk.
    pub fn total_sectors(&self) -> u64 {
        self.disk_size / self.sector_size
    }

    /// First sector a partition may use (after the primary GPT).
    pub fn first_usable_lba(&self) -> u64 {
        first_usable_lba(entry_array_sectors(self.sector_size))
    }

    /// Last sector a partition may use (before the backup GPT).
    pub fn last_usable_lba(&self) -> u64 {
        DiskEnd::of(
            self.disk_size,
            self.sector_size,
            entry_array_sectors(self.sector_size),
        )
        .map_or(0, |e| e.last_usable_lba)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use contract::partition::DEFAULT_DISK_SIZE;

    fn check_invariants(l: &Layout) {
        let labels: Vec<_> = l.partitions.iter().map(|p| p.label()).collect();
        let expected: Vec<_> = LAYOUT.iter().map(|p| p.label).collect();
        assert_eq!(labels, expected);
        assert_eq!(l.partitions[0].offset(), ALIGNMENT);
        for w in l.partitions.windows(2) {
            assert_eq!(w[0].last_lba + 1, w[1].first_lba, "contiguous");
        }
        for p in &l.partitions {
            assert_eq!(p.offset() % ALIGNMENT, 0, "{}", p.label());
            assert_eq!(p.len() % ALIGNMENT, 0, "{}", p.label());
            assert!(p.len() >= p.spec.min_size, "{}", p.label());
            assert!(p.first_lba >= l.first_usable_lba());
            assert!(p.last_lba <= l.last_usable_lba());
        }
    }

    #[test]
    fn default_layout_at_both_sector_sizes() {
        for ss in SECTOR_SIZES {
            let l = Layout::new(DEFAULT_DISK_SIZE, ss, &BTreeMap::new()).unwrap();
            check_invariants(&l);
            let efi = l.get(PartitionRole::Efi);
            assert_eq!(efi.first_lba, MIB / ss);
            assert_eq!(efi.len(), 100 * MIB);
            let state = l.get(PartitionRole::State);
            assert_eq!(state.offset() + state.len(), 503 * MIB);
            let eph = l.get(PartitionRole::Ephemeral);
            assert_eq!(eph.offset(), 503 * MIB);
            // The last MiB holds the backup GPT: rounded down to alignment.
            assert_eq!(eph.offset() + eph.len(), DEFAULT_DISK_SIZE - MIB);
            assert_eq!(l.first_usable_lba(), if ss == 512 { 34 } else { 6 });
        }
    }

    #[test]
    fn overrides_and_errors() {
        let mut o = BTreeMap::new();
        o.insert("BOOT".to_string(), 64 * MIB);
        o.insert("EFI".to_string(), 40 * MIB);
        let l = Layout::new(1024 * MIB, 4096, &o).unwrap();
        check_invariants(&l);
        assert_eq!(l.get(PartitionRole::Boot).len(), 64 * MIB);
        assert_eq!(l.get(PartitionRole::Efi).len(), 40 * MIB);

        let err = |o: &BTreeMap<String, u64>, size| {
            format!("{:#}", Layout::new(size, 512, o).unwrap_err())
        };
        let one = |k: &str, v| BTreeMap::from([(k.to_string(), v)]);
        assert!(err(&one("FOO", MIB), DEFAULT_DISK_SIZE).contains("unknown partition \"FOO\""));
        assert!(err(&one("META", 2 * MIB), DEFAULT_DISK_SIZE).contains("cannot be resized"));
        assert!(err(&one("EPHEMERAL", 400 * MIB), DEFAULT_DISK_SIZE).contains("cannot be resized"));
        assert!(err(&one("BOOT", MIB), DEFAULT_DISK_SIZE).contains("at least 16 MiB"));
        assert!(err(&one("BOOT", MIB + 1), DEFAULT_DISK_SIZE).contains("whole MiB"));
        assert!(
            Layout::new(DEFAULT_DISK_SIZE, 1024, &BTreeMap::new())
                .unwrap_err()
                .to_string()
                .contains("sector size 1024")
        );
    }

    #[test]
    fn too_small_disk_says_how_big_it_must_be() {
        let e = format!(
            "{:#}",
            Layout::new(100 * MIB, 512, &BTreeMap::new()).unwrap_err()
        );
        // 1 + 100 + 1 + 300 + 1 + 100 MiB, then 300 MiB EPHEMERAL and the backup GPT.
        assert_eq!(
            e,
            "disk size 100 MiB is too small for the partitions: needs at least 804 MiB; \
             raise disk.size in the profile"
        );
        for ss in SECTOR_SIZES {
            assert!(Layout::new(804 * MIB, ss, &BTreeMap::new()).is_ok());
            assert!(Layout::new(803 * MIB, ss, &BTreeMap::new()).is_err());
            let l = Layout::new(804 * MIB, ss, &BTreeMap::new()).unwrap();
            check_invariants(&l);
            assert_eq!(l.get(PartitionRole::Ephemeral).len(), 300 * MIB);
        }
    }
}
