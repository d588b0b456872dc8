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
//!
//! Every sum and product is checked: sizes that overflow 64 bits are a
//! [`LayoutError::TooSmall`] without a size ("more than any disk holds"),
//! never a wrapped offset.

use contract::partition::{
    ALIGNMENT, DiskEnd, MIB, SECTOR_SIZES, entry_array_sectors, first_usable_lba,
};
use contract::{LAYOUT, PartitionRole, PartitionSpec};
use std::collections::BTreeMap;
use std::fmt;

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

    /// Its type GUID at this disk's sector size
    /// ([`contract::partition::esp_role`]).
    pub fn type_guid(&self) -> contract::Guid {
        self.spec.type_guid_at(self.sector_size)
    }

    /// What goes in it at this disk's sector size.
    pub fn content(&self) -> contract::partition::Content {
        self.spec.content_at(self.sector_size)
    }

    /// Byte offset of the partition on the disk (in bounds for a partition
    /// placed by [`Layout::new`]).
    pub fn offset(&self) -> u64 {
        self.first_lba.saturating_mul(self.sector_size)
    }

    /// Size of the partition in bytes.
    pub fn len(&self) -> u64 {
        self.last_lba
            .saturating_add(1)
            .saturating_sub(self.first_lba)
            .saturating_mul(self.sector_size)
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

/// Why partitions cannot be placed. The messages say what is wrong and
/// what is needed, without naming where the sizes came from: a build adds
/// its profile's keys ([`LayoutError::profile_key`]), an install its device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LayoutError {
    /// A sector size other than [`SECTOR_SIZES`].
    SectorSize { sector_size: u64 },
    /// A disk size that is not a whole number of sectors.
    DiskUnaligned { disk_size: u64, sector_size: u64 },
    /// A size for a partition [`LAYOUT`] does not have.
    UnknownPartition { label: String },
    /// A size for a partition whose size is fixed.
    FixedSize { label: String },
    /// A partition size that is not a whole number of [`ALIGNMENT`]s.
    PartitionUnaligned { label: String, size: u64 },
    /// A partition size below the partition's minimum.
    PartitionTooSmall {
        label: String,
        size: u64,
        min_size: u64,
    },
    /// The partitions do not fit on the disk. `need_bytes` is the smallest
    /// disk that holds them (whole MiB), `None` when their sizes add up to
    /// more than 2⁶⁴ bytes: no disk holds them.
    TooSmall {
        disk_size: u64,
        need_bytes: Option<u64>,
    },
}

impl LayoutError {
    /// The profile key whose value is wrong: `disk.size`,
    /// `disk.sector_size` or `disk.partitions.LABEL`.
    pub fn profile_key(&self) -> String {
        match self {
            LayoutError::SectorSize { .. } => "disk.sector_size".into(),
            LayoutError::DiskUnaligned { .. } | LayoutError::TooSmall { .. } => "disk.size".into(),
            LayoutError::UnknownPartition { label }
            | LayoutError::FixedSize { label }
            | LayoutError::PartitionUnaligned { label, .. }
            | LayoutError::PartitionTooSmall { label, .. } => format!("disk.partitions.{label}"),
        }
    }
}

impl fmt::Display for LayoutError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LayoutError::SectorSize { sector_size } => write!(
                f,
                "sector size {sector_size} is not supported: use one of {SECTOR_SIZES:?}"
            ),
            LayoutError::DiskUnaligned {
                disk_size,
                sector_size,
            } => write!(
                f,
                "disk size {disk_size} bytes is not a multiple of the sector size \
                 {sector_size}: give it in whole MiB"
            ),
            LayoutError::UnknownPartition { label } => {
                let known: Vec<_> = LAYOUT.iter().map(|p| p.label).collect();
                write!(
                    f,
                    "unknown partition {label:?} in the partition sizes: known are {known:?}"
                )
            }
            LayoutError::FixedSize { label } => {
                let resizable: Vec<_> = LAYOUT
                    .iter()
                    .filter(|p| p.resizable)
                    .map(|p| p.label)
                    .collect();
                write!(
                    f,
                    "partition {label} has a fixed size and cannot be resized: only \
                     {resizable:?} can"
                )
            }
            LayoutError::PartitionUnaligned { label, size } => write!(
                f,
                "size of partition {label} ({size} bytes) is not a multiple of {}: give it \
                 in whole MiB",
                mib(ALIGNMENT)
            ),
            LayoutError::PartitionTooSmall {
                label,
                size,
                min_size,
            } => write!(
                f,
                "partition {label} of {} is too small: it needs at least {}",
                mib(*size),
                mib(*min_size)
            ),
            LayoutError::TooSmall {
                disk_size,
                need_bytes: Some(need),
            } => write!(
                f,
                "a disk of {} is too small for the partitions: it needs at least {} MiB",
                mib(*disk_size),
                need / MIB
            ),
            LayoutError::TooSmall {
                disk_size,
                need_bytes: None,
            } => write!(
                f,
                "the partitions add up to more than 16 EiB: no disk holds them (this one \
                 is {})",
                mib(*disk_size)
            ),
        }
    }
}

impl std::error::Error for LayoutError {}

/// `N MiB` for whole MiB, else `N bytes`.
pub fn mib(bytes: u64) -> String {
    if bytes.is_multiple_of(MIB) {
        format!("{} MiB", bytes / MIB)
    } else {
        format!("{bytes} bytes")
    }
}

/// Refuses sizes for unknown or fixed partitions, sizes off the alignment and
/// sizes below a partition's minimum.
fn check_overrides(overrides: &BTreeMap<String, u64>) -> Result<(), LayoutError> {
    for (label, size) in overrides {
        let Some(spec) = LAYOUT.iter().find(|p| p.label == label.as_str()) else {
            return Err(LayoutError::UnknownPartition {
                label: label.clone(),
            });
        };
        if !spec.resizable {
            return Err(LayoutError::FixedSize {
                label: label.clone(),
            });
        }
        if !size.is_multiple_of(ALIGNMENT) {
            return Err(LayoutError::PartitionUnaligned {
                label: label.clone(),
                size: *size,
            });
        }
        if *size < spec.min_size {
            return Err(LayoutError::PartitionTooSmall {
                label: label.clone(),
                size: *size,
                min_size: spec.min_size,
            });
        }
    }
    Ok(())
}

/// Every partition but the last, with its size.
type Sized = Vec<(&'static PartitionSpec, u64)>;

/// The size of every partition but the last (which takes the rest), in
/// [`LAYOUT`] order, and the last one's spec.
fn sizes(overrides: &BTreeMap<String, u64>) -> (Sized, &'static PartitionSpec) {
    let [sized @ .., rest] = &LAYOUT;
    let sized = sized
        .iter()
        .map(|spec| {
            // Every partition but the last has a default size (a contract
            // test checks it); a missing one counts as its minimum.
            let size = overrides
                .get(spec.label)
                .copied()
                .or(spec.default_size)
                .unwrap_or(spec.min_size);
            (spec, size)
        })
        .collect();
    (sized, rest)
}

/// Bytes taken by the backup GPT at the end of a disk.
fn backup_bytes(ss: u64) -> Option<u64> {
    entry_array_sectors(ss).checked_add(1)?.checked_mul(ss)
}

impl Layout {
    /// Places the partitions on a disk of `disk_size` bytes with sectors of
    /// `sector_size` bytes. `overrides` maps partition labels to sizes in
    /// bytes; only resizable partitions may be named.
    pub fn new(
        disk_size: u64,
        sector_size: u64,
        overrides: &BTreeMap<String, u64>,
    ) -> Result<Layout, LayoutError> {
        if !SECTOR_SIZES.contains(&sector_size) {
            return Err(LayoutError::SectorSize { sector_size });
        }
        if !disk_size.is_multiple_of(sector_size) {
            return Err(LayoutError::DiskUnaligned {
                disk_size,
                sector_size,
            });
        }
        check_overrides(overrides)?;
        let ss = sector_size;
        let overflow = LayoutError::TooSmall {
            disk_size,
            need_bytes: None,
        };
        let (sized, rest) = sizes(overrides);

        let mut at = ALIGNMENT; // byte offset of the next partition
        let mut partitions = Vec::with_capacity(LAYOUT.len());
        for (spec, size) in sized {
            let end = at.checked_add(size).ok_or(overflow.clone())?;
            partitions.push(PlacedPartition {
                spec,
                first_lba: at / ss,
                last_lba: (end / ss).checked_sub(1).ok_or(overflow.clone())?,
                sector_size: ss,
            });
            at = end;
        }

        // The backup GPT: entry array then header, in the last sectors
        // (contract::partition::DiskEnd, which the runtime's grow uses too).
        let rest_start = at;
        let rest_end = rest_start
            .checked_add(rest.min_size)
            .ok_or(overflow.clone())?;
        let end = DiskEnd::of(disk_size, ss, entry_array_sectors(ss))
            .map(|e| e.partitions_end)
            .filter(|end| *end >= rest_end);
        let too_small = || LayoutError::TooSmall {
            disk_size,
            // The smallest disk that holds them, in whole MiB.
            need_bytes: backup_bytes(ss)
                .and_then(|b| rest_end.checked_add(b))
                .and_then(|n| n.div_ceil(MIB).checked_mul(MIB)),
        };
        let end = end.ok_or_else(too_small)?;
        partitions.push(PlacedPartition {
            spec: rest,
            first_lba: rest_start / ss,
            last_lba: (end / ss).checked_sub(1).ok_or_else(too_small)?,
            sector_size: ss,
        });
        Ok(Layout {
            disk_size,
            sector_size,
            partitions,
        })
    }

    /// The largest size the resizable partition `label` can have on a disk
    /// of `disk_size` bytes, the other partitions as `overrides` (or their
    /// defaults) say: what to suggest when they do not fit. `None` when even
    /// its minimum does not fit (or `label` is not resizable).
    pub fn largest(
        disk_size: u64,
        sector_size: u64,
        overrides: &BTreeMap<String, u64>,
        label: &str,
    ) -> Option<u64> {
        let spec = LAYOUT.iter().find(|p| p.label == label && p.resizable)?;
        let (sized, rest) = sizes(overrides);
        let mut fixed = ALIGNMENT.checked_add(rest.min_size)?;
        for (s, size) in sized {
            if s.label != label {
                fixed = fixed.checked_add(size)?;
            }
        }
        let end = DiskEnd::of(disk_size, sector_size, entry_array_sectors(sector_size))?;
        let room = end.partitions_end.checked_sub(fixed)?;
        let largest = room / ALIGNMENT * ALIGNMENT;
        (largest >= spec.min_size).then_some(largest)
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
        let e = Layout::new(100 * MIB, 512, &BTreeMap::new()).unwrap_err();
        // 1 + 100 + 1 + 300 + 1 + 100 MiB, then 300 MiB EPHEMERAL and the backup GPT.
        assert_eq!(
            e,
            LayoutError::TooSmall {
                disk_size: 100 * MIB,
                need_bytes: Some(804 * MIB)
            }
        );
        // Neutral: an install on a device names no profile.
        assert_eq!(
            e.to_string(),
            "a disk of 100 MiB is too small for the partitions: it needs at least 804 MiB"
        );
        assert_eq!(e.profile_key(), "disk.size");
        for ss in SECTOR_SIZES {
            assert!(Layout::new(804 * MIB, ss, &BTreeMap::new()).is_ok());
            assert!(Layout::new(803 * MIB, ss, &BTreeMap::new()).is_err());
            let l = Layout::new(804 * MIB, ss, &BTreeMap::new()).unwrap();
            check_invariants(&l);
            assert_eq!(l.get(PartitionRole::Ephemeral).len(), 300 * MIB);
            for tiny in [0, ss, 2 * ss, 34 * ss] {
                assert!(matches!(
                    Layout::new(tiny, ss, &BTreeMap::new()),
                    Err(LayoutError::TooSmall {
                        need_bytes: Some(n),
                        ..
                    }) if n == 804 * MIB
                ));
            }
        }
    }

    /// The largest size a profile can ask for, in whole MiB.
    const MAX_MIB: u64 = u64::MAX / MIB * MIB;

    #[test]
    fn sizes_that_overflow_are_refused_not_wrapped() {
        let one = |k: &str, v| BTreeMap::from([(k.to_string(), v)]);
        // STATE: 16000000TiB on a 2 GiB disk: no overflow, plainly too big.
        let huge = 16_000_000u64 << 40;
        let e = Layout::new(DEFAULT_DISK_SIZE, 512, &one("STATE", huge)).unwrap_err();
        assert_eq!(
            e,
            LayoutError::TooSmall {
                disk_size: DEFAULT_DISK_SIZE,
                need_bytes: Some(huge + 703 * MIB + MIB)
            }
        );
        // What fits: 2047 MiB of partitions less 1 + 100 + 1 + 300 + 1 MiB
        // and EPHEMERAL's 300 MiB.
        assert_eq!(
            Layout::largest(DEFAULT_DISK_SIZE, 512, &one("STATE", huge), "STATE"),
            Some(1344 * MIB)
        );
        let fits = one("STATE", 1344 * MIB);
        check_invariants(&Layout::new(DEFAULT_DISK_SIZE, 512, &fits).unwrap());
        let over = one("STATE", 1345 * MIB);
        assert!(Layout::new(DEFAULT_DISK_SIZE, 512, &over).is_err());
        assert_eq!(Layout::largest(100 * MIB, 512, &fits, "STATE"), None);
        assert_eq!(Layout::largest(DEFAULT_DISK_SIZE, 512, &fits, "META"), None);

        // Sizes whose end passes 2^64: refused, never wrapped to a small
        // offset (which placed STATE before META and EPHEMERAL over it).
        let overflowing = [
            one("STATE", MAX_MIB),
            one("EFI", MAX_MIB),
            one("BOOT", MAX_MIB - 101 * MIB),
            BTreeMap::from([("BOOT".into(), 1 << 63), ("STATE".into(), 1 << 63)]),
            BTreeMap::from([
                ("EFI".into(), MAX_MIB / 3 / MIB * MIB),
                ("BOOT".into(), MAX_MIB / 3 / MIB * MIB),
                ("STATE".into(), MAX_MIB / 3 / MIB * MIB),
            ]),
        ];
        for o in &overflowing {
            for ss in SECTOR_SIZES {
                for disk in [DEFAULT_DISK_SIZE, u64::MAX / ss * ss] {
                    let e = Layout::new(disk, ss, o).unwrap_err();
                    assert_eq!(
                        e,
                        LayoutError::TooSmall {
                            disk_size: disk,
                            need_bytes: None
                        },
                        "{o:?}"
                    );
                    assert!(e.to_string().contains("more than 16 EiB"), "{e}");
                }
            }
        }
    }

    #[test]
    fn the_largest_disks_lay_out_within_their_sectors() {
        for ss in SECTOR_SIZES {
            let disk = u64::MAX / ss * ss;
            let l = Layout::new(disk, ss, &BTreeMap::new()).unwrap();
            check_invariants(&l);
            let state = (MAX_MIB - 4 * 1024 * MIB) / MIB * MIB;
            let o = BTreeMap::from([("STATE".to_string(), state)]);
            match Layout::new(disk, ss, &o) {
                Ok(l) => check_invariants(&l),
                Err(e) => assert!(matches!(e, LayoutError::TooSmall { .. }), "{e}"),
            }
            let largest = Layout::largest(disk, ss, &BTreeMap::new(), "STATE").unwrap();
            let o = BTreeMap::from([("STATE".to_string(), largest)]);
            check_invariants(&Layout::new(disk, ss, &o).unwrap());
            let o = BTreeMap::from([("STATE".to_string(), largest + MIB)]);
            assert!(Layout::new(disk, ss, &o).is_err());
        }
    }

    #[test]
    fn every_placement_is_in_order_and_on_the_disk() {
        // Sizes around every boundary: each layout that is made holds its
        // invariants; every refusal is a LayoutError, never a panic.
        let sizes = [
            34 * MIB,
            100 * MIB,
            4096 * MIB,
            1 << 40,
            1 << 62,
            1 << 63,
            MAX_MIB - 1024 * MIB,
            MAX_MIB,
        ];
        let disks = [
            803 * MIB,
            804 * MIB,
            DEFAULT_DISK_SIZE,
            1 << 50,
            u64::MAX / 4096 * 4096,
        ];
        for ss in SECTOR_SIZES {
            for &disk in &disks {
                for &efi in &sizes {
                    for &state in &sizes {
                        let o = BTreeMap::from([
                            ("EFI".to_string(), efi),
                            ("STATE".to_string(), state),
                        ]);
                        if let Ok(l) = Layout::new(disk, ss, &o) {
                            check_invariants(&l);
                            assert_eq!(l.get(PartitionRole::State).len(), state);
                        }
                    }
                }
            }
        }
    }
}
