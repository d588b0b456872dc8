//! The partition table: protective MBR, primary and backup GPT, written with
//! the `gpt` crate from a [`Layout`], and read back for `imager inspect`.
//!
//! The `gpt` crate draws random GUIDs only when it is not given any: the disk
//! GUID goes to `create_from_device` and the partition entries are built here
//! with GUIDs from [`contract::guid::partition_guid`], so the table is a pure
//! function of the layout and the disk GUID.

use super::layout::Layout;
use crate::io::Window;
use ::gpt::disk::LogicalBlockSize;
use ::gpt::mbr::ProtectiveMBR;
use ::gpt::partition::Partition;
use ::gpt::partition_types::{OperatingSystem, Type};
use anyhow::{Context, Result, bail};
use contract::Guid;
use contract::guid::partition_guid;
use contract::partition::SECTOR_SIZES;
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;

const GPT_SIGNATURE: &[u8; 8] = b"EFI PART";

fn block_size(sector_size: u64) -> Result<LogicalBlockSize> {
    LogicalBlockSize::try_from(sector_size)
        .map_err(|_| anyhow::anyhow!("sector size {sector_size} is not supported"))
}

/// Writes the protective MBR and both GPTs of `layout` to `device`, which
/// must already be `layout.disk_size` bytes long. Only the table sectors are
/// written.
pub fn write_table<D>(device: &mut D, layout: &Layout, disk_guid: Guid) -> Result<()>
where
    D: Read + Write + Seek + std::fmt::Debug,
{
    let lb = block_size(layout.sector_size)?;
    let len = device
        .seek(SeekFrom::End(0))
        .context("measuring the disk")?;
    if len != layout.disk_size {
        bail!(
            "internal: disk is {len} bytes, the layout is for {}",
            layout.disk_size
        );
    }
    device.seek(SeekFrom::Start(0))?;

    let mut entries = BTreeMap::new();
    for (i, p) in layout.partitions.iter().enumerate() {
        entries.insert(
            i as u32 + 1,
            Partition {
                part_type_guid: Type {
                    guid: p.spec.type_guid,
                    os: OperatingSystem::None,
                },
                part_guid: partition_guid(disk_guid, p.spec.label),
                first_lba: p.first_lba,
                last_lba: p.last_lba,
                flags: 0,
                name: p.spec.label.to_string(),
            },
        );
    }

    let mut disk = ::gpt::GptConfig::new()
        .writable(true)
        .logical_block_size(lb)
        .create_from_device(&mut *device, Some(disk_guid))
        .context("preparing the GPT headers")?;
    disk.update_partitions(entries)
        .context("adding the partitions to the GPT")?;
    let h = disk
        .primary_header()
        .context("reading back the GPT header")?;
    if h.first_usable > layout.first_usable_lba() || h.last_usable < layout.last_usable_lba() {
        bail!(
            "internal: GPT usable range {}..={} does not hold the layout",
            h.first_usable,
            h.last_usable
        );
    }
    disk.write().context("writing the GPT")?;

    // The protective MBR covers the whole disk (or as much as 32 bits say).
    let sectors = layout.total_sectors() - 1;
    let mbr = ProtectiveMBR::with_lb_size(u32::try_from(sectors).unwrap_or(u32::MAX));
    mbr.overwrite_lba0(device)
        .context("writing the protective MBR")?;
    device.flush().context("flushing the partition table")?;
    Ok(())
}

/// A partition as read from a GPT.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TablePartition {
    pub label: String,
    pub type_guid: Guid,
    pub unique_guid: Guid,
    pub first_lba: u64,
    pub last_lba: u64,
}

/// A partition table as read from a disk image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Table {
    pub disk_guid: Guid,
    pub sector_size: u64,
    pub disk_size: u64,
    /// Used entries, in entry-array order.
    pub partitions: Vec<TablePartition>,
}

impl TablePartition {
    /// Byte offset and length on a disk of `sector_size`-byte sectors.
    /// Byte offset and length. In bounds for tables from [`read_table_from`],
    /// which refuses entries outside the disk.
    pub fn range(&self, sector_size: u64) -> (u64, u64) {
        (
            self.first_lba * sector_size,
            (self.last_lba + 1 - self.first_lba) * sector_size,
        )
    }
}

impl Table {
    pub fn find(&self, label: &str) -> Option<&TablePartition> {
        self.partitions.iter().find(|p| p.label == label)
    }

    /// A window of `dev` (the disk this table was read from) on partition
    /// `label`.
    pub fn window<T: Seek>(&self, dev: T, label: &str) -> Result<Window<T>> {
        let p = self
            .find(label)
            .with_context(|| format!("the disk has no partition labelled {label}"))?;
        let (offset, len) = p.range(self.sector_size);
        Window::new(dev, offset, len).with_context(|| format!("opening partition {label}"))
    }
}

/// Size of a disk image file or block device (whose metadata says 0).
pub fn device_size<D: Seek>(dev: &mut D) -> Result<u64> {
    let end = dev
        .seek(SeekFrom::End(0))
        .context("finding the disk's size")?;
    dev.seek(SeekFrom::Start(0))?;
    Ok(end)
}

/// Which sector size the disk is laid out with: the one at which LBA 1 holds
/// a GPT header.
pub fn detect_sector_size<R: Read + Seek>(r: &mut R) -> Result<u64> {
    for ss in SECTOR_SIZES {
        let mut sig = [0u8; 8];
        r.seek(SeekFrom::Start(ss))?;
        match r.read_exact(&mut sig) {
            Ok(()) if &sig == GPT_SIGNATURE => return Ok(ss),
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {}
            Err(e) => return Err(e.into()),
        }
    }
    bail!("no GPT header at sector 1 for sector sizes {SECTOR_SIZES:?}: not a GPT disk image")
}

/// Reads the partition table of the disk image at `path`.
pub fn read_table(path: &Path) -> Result<Table> {
    let mut f = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let disk_size = device_size(&mut f)?;
    read_table_from(f, disk_size)
        .with_context(|| format!("reading the partition table of {}", path.display()))
}

/// Reads the partition table of any device (a file, or bytes in memory for
/// the fuzzer). Never panics on malformed input.
pub fn read_table_from<D: Read + Write + Seek + std::fmt::Debug>(
    mut dev: D,
    disk_size: u64,
) -> Result<Table> {
    let sector_size = detect_sector_size(&mut dev)?;
    dev.seek(SeekFrom::Start(0))?;
    let disk = ::gpt::GptConfig::new()
        .writable(false)
        .logical_block_size(block_size(sector_size)?)
        .open_from_device(dev)?;
    let partitions: Vec<TablePartition> = disk
        .partitions()
        .values()
        .filter(|p| p.is_used())
        .map(|p| TablePartition {
            label: p.name.clone(),
            type_guid: p.part_type_guid.guid,
            unique_guid: p.part_guid,
            first_lba: p.first_lba,
            last_lba: p.last_lba,
        })
        .collect();
    // The gpt crate does not check entries on read: refuse the ones that lie
    // outside the disk, so that every range() below is in bounds.
    for p in &partitions {
        let ok = p.first_lba <= p.last_lba
            && p.last_lba
                .checked_add(1)
                .and_then(|end| end.checked_mul(sector_size))
                .is_some_and(|end| end <= disk_size);
        if !ok {
            bail!(
                "partition {:?} (LBA {}..={}) lies outside the {disk_size}-byte disk: the partition table is damaged",
                p.label,
                p.first_lba,
                p.last_lba
            );
        }
    }
    Ok(Table {
        disk_guid: *disk.guid(),
        sector_size,
        disk_size,
        partitions,
    })
}
