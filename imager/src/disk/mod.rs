//! Disk images: where the partitions go, and the image file around them.
//!
//! [`Layout::new`] places the partitions of [`contract::LAYOUT`] on a disk,
//! [`write_disk`] creates the sparse image with its partition table and lets
//! the caller fill each partition through a [`Window`], and [`read_table`]
//! reads a table back. Every table written is read back and checked
//! ([`check::check_written`]) before the disk is used or renamed into place;
//! `imager verify` runs the same check ([`check::check_table`]) on the raw
//! disks a manifest lists. The table, the FAT filesystems and META themselves
//! are written and read by `bootstate`, the one library for every disk
//! read and write.

pub mod check;
pub mod compress;
pub mod formats;
pub mod gce;
pub mod gpt;
pub mod layout;
pub mod ova;
pub mod platform;
pub mod qcow2;
pub mod vhd;
pub mod vmdk;
pub mod xz;

pub use self::check::{check_image, check_table, check_written};
pub use self::gpt::{Table, TablePartition, read_table, read_table_from, write_table};
pub use self::layout::{Layout, LayoutError, PlacedPartition};
pub use bootstate::bios::Grub;
pub use bootstate::fatformat::{FatFile, FatParams, FatSource, format_fat};

use crate::io::{AtomicFile, Window};

/// The largest disk a reader of a disk format (qcow2, VMDK, a platform's
/// archive) takes: 64 TiB.
pub const MAX_DISK_SIZE: u64 = 1 << 46;

/// A `tar` crate error of reading `what`, its text escaped: it may quote a
/// member's name or header bytes ([`contract::text::escape`]).
pub(crate) fn tar_error(e: std::io::Error, what: &str) -> anyhow::Error {
    anyhow::anyhow!(
        "reading {what} as a tar archive: {}",
        contract::text::escape(&e.to_string())
    )
}
use anyhow::{Context, Result};
use contract::Guid;
use std::fs::File;
use std::path::Path;

/// GRUB for the BIOS path ([`bootstate::bios`]) and whether the protective
/// MBR's entry carries the boot flag (the profile's `disk.bios_boot_flag`).
#[derive(Debug, Clone, Copy)]
pub struct BiosBoot<'a> {
    pub grub: &'a Grub,
    pub boot_flag: bool,
}

/// Creates the disk image `dest` (atomically): a sparse file of
/// `layout.disk_size` bytes with a protective MBR and both GPTs, then calls
/// `fill` once per partition, in layout order, with a window on it, then
/// writes GRUB (`bios`). Nothing else is written: what `fill` leaves alone
/// reads as zeros and takes no space.
pub fn write_disk<F>(
    dest: &Path,
    layout: &Layout,
    disk_guid: Guid,
    bios: Option<BiosBoot>,
    mut fill: F,
) -> Result<()>
where
    F: FnMut(&PlacedPartition, &mut Window<&mut File>) -> Result<()>,
{
    let mut out = AtomicFile::create(dest)?;
    out.file()
        .set_len(layout.disk_size)
        .with_context(|| format!("sizing {} to {} bytes", dest.display(), layout.disk_size))?;
    write_table(out.file(), layout, disk_guid).context("writing partition table")?;
    fill_partitions(out.file(), layout, &mut fill)?;
    write_bios(out.file(), bios)?;
    read_back(out.file(), layout, disk_guid, bios)?;
    out.commit()
        .with_context(|| format!("writing {}", dest.display()))?;
    Ok(())
}

/// Calls `fill` once per partition, in layout order, with a window on it.
fn fill_partitions<F>(f: &mut File, layout: &Layout, fill: &mut F) -> Result<()>
where
    F: FnMut(&PlacedPartition, &mut Window<&mut File>) -> Result<()>,
{
    for p in &layout.partitions {
        let mut w = Window::new(&mut *f, p.offset(), p.len())
            .with_context(|| format!("seeking to partition {}", p.label()))?;
        fill(p, &mut w).with_context(|| format!("filling partition {}", p.label()))?;
    }
    Ok(())
}

/// Lays out an existing device (a block device, or a file kept where it
/// is) in place: fills every partition first, syncs, then writes the
/// partition table and syncs again, so that the disk only looks like one of
/// ours once everything else is on it; then GRUB (`bios`), core image
/// before the MBR code that loads it. A cut before GRUB is complete leaves
/// a disk that boots under UEFI and not under BIOS.
pub fn write_disk_in_place<F>(
    dest: &Path,
    layout: &Layout,
    disk_guid: Guid,
    bios: Option<BiosBoot>,
    mut fill: F,
) -> Result<()>
where
    F: FnMut(&PlacedPartition, &mut Window<&mut File>) -> Result<()>,
{
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(dest)
        .with_context(|| format!("opening {} for writing", dest.display()))?;
    fill_partitions(&mut f, layout, &mut fill)?;
    f.sync_all()
        .with_context(|| format!("syncing {}", dest.display()))?;
    write_table(&mut f, layout, disk_guid).context("writing partition table")?;
    f.sync_all()
        .with_context(|| format!("syncing {}", dest.display()))?;
    write_bios(&mut f, bios)?;
    read_back(&mut f, layout, disk_guid, bios)
}

/// Writes GRUB to a disk whose partition table is written (core image,
/// sync, MBR code, sync: `bootstate::bios::write`).
fn write_bios(f: &mut File, bios: Option<BiosBoot>) -> Result<()> {
    let Some(b) = bios else {
        return Ok(());
    };
    let table = read_table_from(f).context("reading the partition table for GRUB")?;
    bootstate::bios::write(f, &table, b.grub, b.boot_flag).context("writing GRUB for BIOS boot")
}

/// Reads the table just written back from the disk and checks it against
/// the layout: a table that is not what was laid out (overlapping, out of
/// order, off the disk) is never renamed into place or signed. So is a disk
/// whose MBR and BIOS partition do not hold GRUB as `bios` asked (or hold
/// boot code when it did not).
fn read_back(f: &mut File, layout: &Layout, disk_guid: Guid, bios: Option<BiosBoot>) -> Result<()> {
    let table = read_table_from(f).context("reading back the partition table just written")?;
    check_written(&table, layout, disk_guid)
        .context("the partition table read back is not the one laid out")?;
    match bios {
        Some(b) => bootstate::bios::check(f, &table, b.grub, b.boot_flag)
            .context("GRUB read back from the disk is not the one written"),
        None => match bootstate::bios::inspect(f, &table)
            .context("reading back the protective MBR")?
        {
            bootstate::bios::Installed::None => Ok(()),
            other => anyhow::bail!("the MBR holds boot code ({other:?}) though none was written"),
        },
    }
}

/// The paths of all regular files on the FAT filesystem in `dev`, sorted
/// (read by bootstate, which checks the volume first).
pub fn list_files<T: std::io::Read + std::io::Seek>(dev: T) -> Result<Vec<String>> {
    bootstate::fat::BootFs::new(dev, 0).list_all()
}

/// The contents of the file `path` on the FAT filesystem in `dev`, for
/// small files (boot entries, loader.conf): at most 64 MiB.
pub fn read_file<T: std::io::Read + std::io::Seek>(dev: T, path: &str) -> Result<Vec<u8>> {
    bootstate::fat::BootFs::new(dev, 0).read(path, 64 << 20)
}

/// A read-only window on the partition `label` of the disk image `path`, as
/// found in its partition table.
pub fn open_partition(path: &Path, label: &str) -> Result<Window<File>> {
    let table = read_table(path)?;
    let f = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    table
        .window(f, label)
        .with_context(|| format!("reading {}", path.display()))
}

#[cfg(test)]
pub(crate) mod testutil;

#[cfg(test)]
mod tests;
