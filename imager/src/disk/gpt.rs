//! The partition table of a new image: a [`Layout`] handed to
//! [`bootstate::gpt`], which writes and reads every partition table in the
//! workspace. GUIDs come from [`contract::guid::partition_guid`], so the
//! table is a pure function of the layout and the disk GUID.

use super::layout::Layout;
use anyhow::{Context, Result, bail};
use bootstate::Device;
use bootstate::gpt::NewPartition;
use contract::Guid;
use contract::guid::partition_guid;
use std::fs::File;
use std::io::{Read, Seek};
use std::path::Path;

pub use bootstate::gpt::{Partition as TablePartition, Table, device_size, image_size};

/// Writes the protective MBR and both GPTs of `layout` to `device`, which
/// must already be `layout.disk_size` bytes long. Only the table sectors are
/// written: the backup first, synced, then the primary and the MBR.
pub fn write_table<D: Device>(device: &mut D, layout: &Layout, disk_guid: Guid) -> Result<()> {
    let len = device_size(device).context("measuring the disk")?;
    if len != layout.disk_size {
        bail!(
            "internal: disk is {len} bytes, the layout is for {}",
            layout.disk_size
        );
    }
    let parts: Vec<NewPartition> = layout
        .partitions
        .iter()
        .map(|p| NewPartition {
            label: p.spec.label,
            type_guid: p.type_guid(),
            unique_guid: partition_guid(disk_guid, p.spec.label),
            first_lba: p.first_lba,
            last_lba: p.last_lba,
        })
        .collect();
    bootstate::gpt::write_new(
        device,
        layout.disk_size,
        layout.sector_size,
        disk_guid,
        &parts,
    )
}

/// Reads the partition table of the disk image or block device at `path`.
pub fn read_table(path: &Path) -> Result<Table> {
    let mut f = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let size =
        image_size(&mut f).with_context(|| format!("finding the size of {}", path.display()))?;
    bootstate::gpt::read(&mut f, size).with_context(|| {
        format!(
            "reading the partition table of {}: not a GPT disk image",
            path.display()
        )
    })
}

/// Reads the partition table of any device, sized by seeking to its end.
pub fn read_table_from<D: Read + Seek>(dev: &mut D) -> Result<Table> {
    let size = device_size(dev).context("finding the disk's size")?;
    bootstate::gpt::read(dev, size)
}
