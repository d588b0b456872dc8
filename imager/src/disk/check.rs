//! The check of a disk image's partition table, read back through
//! [`bootstate::gpt::read`]: the build runs it on every image before it is
//! renamed into place and signed, `imager verify` on every raw disk a
//! manifest lists. One function for both, so that what the build refuses to
//! sign, verification refuses to pass.
//!
//! The reader already refuses entries outside the usable sectors and
//! entries that overlap. On top of that a disk of ours has exactly the
//! partitions of [`LAYOUT`], in that order (by position on the disk and in
//! the entry array), each with its type, on whole MiB, at least its minimum
//! size, read from an intact primary table.

use super::layout::{Layout, mib};
use anyhow::{Context, Result, bail};
use bootstate::gpt::{Table, TableCopy};
use contract::LAYOUT;
use contract::guid::partition_guid;
use contract::partition::ALIGNMENT;
use std::io::{Read, Seek};
use std::path::Path;

/// Checks that `table` is the table of a disk made by imager: see the
/// module documentation. The error says which partition is wrong and how.
pub fn check_table(table: &Table) -> Result<()> {
    if table.source != TableCopy::Primary {
        bail!(
            "the primary partition table is damaged ({}): a new image has both",
            table.primary_error.as_deref().unwrap_or("unreadable")
        );
    }
    let ss = table.sector_size;
    let total = table.disk_size / ss;
    let labels: Vec<&str> = table.partitions.iter().map(|p| p.label.as_str()).collect();
    let expected: Vec<&str> = LAYOUT.iter().map(|p| p.label).collect();
    if labels != expected {
        bail!(
            "the partitions are {labels:?} in the entry array; a disk made by imager has \
             {expected:?}"
        );
    }
    let mut previous_last = None;
    for (p, spec) in table.partitions.iter().zip(LAYOUT.iter()) {
        let what = |msg: String| anyhow::anyhow!("partition {} {msg}", spec.label);
        let want = spec.type_guid_at(ss);
        if p.type_guid != want {
            return Err(what(format!("has type {}, not {want}", p.type_guid)));
        }
        if p.first_lba > p.last_lba || p.last_lba >= total {
            return Err(what(format!(
                "(LBA {}..={}) is not on the disk's {total} sectors",
                p.first_lba, p.last_lba
            )));
        }
        if p.first_lba < table.header.first_usable_lba || p.last_lba > table.header.last_usable_lba
        {
            return Err(what(format!(
                "(LBA {}..={}) lies outside the usable sectors {}..={}",
                p.first_lba,
                p.last_lba,
                table.header.first_usable_lba,
                table.header.last_usable_lba
            )));
        }
        if let Some(prev) = previous_last
            && p.first_lba <= prev
        {
            return Err(what(format!(
                "starts at LBA {}, not after the partition before it (which ends at LBA {prev})",
                p.first_lba
            )));
        }
        previous_last = Some(p.last_lba);
        // In bounds: last_lba < total, so these products are below the disk size.
        let offset = p.first_lba * ss;
        let len = (p.last_lba - p.first_lba + 1) * ss;
        if !offset.is_multiple_of(ALIGNMENT) || !len.is_multiple_of(ALIGNMENT) {
            return Err(what(format!(
                "(offset {offset}, {len} bytes) is not on whole {}",
                mib(ALIGNMENT)
            )));
        }
        if len < spec.min_size {
            return Err(what(format!(
                "of {} is smaller than its minimum {}",
                mib(len),
                mib(spec.min_size)
            )));
        }
    }
    Ok(())
}

/// Checks that `table`, read back from a new disk, is a disk of ours
/// ([`check_table`]) and exactly what `layout` and `disk_guid` asked for.
pub fn check_written(table: &Table, layout: &Layout, disk_guid: contract::Guid) -> Result<()> {
    check_table(table)?;
    if (table.disk_size, table.sector_size, table.disk_guid)
        != (layout.disk_size, layout.sector_size, disk_guid)
    {
        bail!(
            "the disk reads as {} bytes of {}-byte sectors with GUID {}, not the {} bytes of \
             {}-byte sectors with GUID {} laid out",
            table.disk_size,
            table.sector_size,
            table.disk_guid,
            layout.disk_size,
            layout.sector_size,
            disk_guid
        );
    }
    for (p, want) in table.partitions.iter().zip(&layout.partitions) {
        let unique = partition_guid(disk_guid, want.label());
        if (p.first_lba, p.last_lba, p.unique_guid) != (want.first_lba, want.last_lba, unique) {
            bail!(
                "partition {} reads as LBA {}..={} ({}), not LBA {}..={} ({unique}) as laid out",
                want.label(),
                p.first_lba,
                p.last_lba,
                p.unique_guid,
                want.first_lba,
                want.last_lba
            );
        }
    }
    Ok(())
}

/// Reads the partition table of the disk image `path` and checks it
/// ([`check_table`]), and the BIOS path: no boot code in the MBR, or GRUB's
/// pointing to its core image in the BIOS partition
/// ([`bootstate::bios::inspect`]).
///
/// A qcow2 image is read through [`super::qcow2::Qcow2`], a zstd or xz
/// stream is first unpacked into a sparse temporary copy
/// ([`super::compress::Unpacked`]).
pub fn check_image(path: &Path) -> Result<()> {
    use super::compress::{Format, Unpacked};
    match Format::of(path)? {
        Format::Qcow2 => {
            let mut q = super::qcow2::Qcow2::open(path)?;
            return check_device(&mut q).with_context(|| format!("reading {}", path.display()));
        }
        f if f.compressed() => {
            let u = Unpacked::open(path)?;
            return check_image(&u.path)
                .with_context(|| format!("checking the disk unpacked from {}", path.display()));
        }
        _ => {}
    }
    let table = super::read_table(path)?;
    check_table(&table)?;
    let mut f = std::fs::File::open(path)
        .map_err(|e| anyhow::anyhow!("opening {}: {e}", path.display()))?;
    bootstate::bios::inspect(&mut f, &table).map(|_| ())
}

/// [`check_image`] of a disk read through `dev` (sized by seeking to its
/// end): its partition table and BIOS path.
pub fn check_device<D: Read + Seek>(dev: &mut D) -> Result<()> {
    let table = super::read_table_from(dev).context("reading the partition table")?;
    check_table(&table)?;
    bootstate::bios::inspect(dev, &table).map(|_| ())
}
