//! The GUID Partition Table: the one reader and writer of partition tables
//! in the workspace. The builder writes new tables with [`write_new`],
//! `imager inspect` and the installer read them with [`read`], and the
//! runtime grows the last partition with [`grow_last`] and gives a disk
//! written from an image as it is its own GUIDs with [`reidentify`].
//!
//! Hand-written rather than the `gpt` crate's: that crate writes the primary
//! table before the backup (we need the backup first, see below), asserts on
//! entry sizes other than 128 bytes and does not fall back to the backup
//! table when the primary is damaged.
//!
//! **Reading** refuses every count, size and offset that the disk cannot
//! hold before using it: the header's size and CRC, its own LBA, a usable
//! range inside the disk, an entry array of 128 × 2ⁿ-byte entries of at most
//! [`MAX_ARRAY_BYTES`] that lies on the disk outside the usable range and
//! matches its CRC, and used entries inside the usable range that do not
//! overlap. When the primary table fails any of these, the backup is read,
//! as Linux does with `gpt` on its command line: first at the disk's last
//! sector, then where the primary header says it is.
//!
//! **Writing** (a new table, or a grown one) goes in this order:
//!
//! 1. the backup entry array, 2. the backup header, *sync*;
//! 3. the primary entry array, 4. the primary header, 5. the protective
//!    MBR, *sync*.
//!
//! A power cut before 3 leaves the old primary table whole (and for a grow,
//! the old backup it points to). A cut between 3 and 4 leaves a primary
//! whose entries fail their CRC: the new backup, complete since the first
//! sync, is then the table (UEFI firmware restores the primary from it,
//! Linux reads it with `gpt` on the command line, and [`read`] falls back to
//! it). A cut before 5 leaves an MBR whose protective partition is short,
//! which every reader accepts. Growing again after any cut finishes the job
//! and rewrites a damaged primary.

use crate::device::{Device, Window};
use anyhow::{Context, Result, anyhow, bail};
use contract::Guid;
use contract::le::{read_u32, read_u64};
use contract::partition::{
    DiskEnd, GPT_ENTRIES, GPT_ENTRY_SIZE, SECTOR_SIZES, entry_array_sectors, first_usable_lba,
    gpt_array_sectors,
};
use std::io::{self, Read, Seek, SeekFrom, Write};

/// The header's signature, at the start of LBA 1 (and of the disk's last LBA).
pub const SIGNATURE: &[u8; 8] = b"EFI PART";
const REVISION: u32 = 0x0001_0000;
const HEADER_SIZE: usize = 92;
/// The largest entry array read: 8192 entries of 128 bytes.
pub const MAX_ARRAY_BYTES: u64 = 1 << 20;
/// Length of a partition name, in UTF-16 code units.
pub const NAME_UNITS: usize = 36;

// Offsets in the header.
const H_SIZE: usize = 12;
const H_CRC: usize = 16;
const H_MY_LBA: usize = 24;
const H_ALT_LBA: usize = 32;
const H_FIRST_USABLE: usize = 40;
const H_LAST_USABLE: usize = 48;
const H_DISK_GUID: usize = 56;
const H_ENTRIES_LBA: usize = 72;
const H_COUNT: usize = 80;
const H_ENTRY_SIZE: usize = 84;
const H_ENTRIES_CRC: usize = 88;
// Offsets in an entry.
const E_TYPE: usize = 0;
const E_UNIQUE: usize = 16;
const E_FIRST: usize = 32;
const E_LAST: usize = 40;
const E_ATTRS: usize = 48;
const E_NAME: usize = 56;

fn put(b: &mut [u8], at: usize, v: &[u8]) {
    if let Some(s) = b.get_mut(at..at + v.len()) {
        s.copy_from_slice(v);
    }
}

fn guid_at(b: &[u8], at: usize) -> Guid {
    let mut a = [0u8; 16];
    if let Some(s) = b.get(at..at + 16) {
        a.copy_from_slice(s);
    }
    Guid::from_bytes_le(a)
}

fn crc32(data: &[u8]) -> u32 {
    crc32fast::hash(data)
}

/// A GPT header, as read or to be written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub my_lba: u64,
    pub alternate_lba: u64,
    pub first_usable_lba: u64,
    pub last_usable_lba: u64,
    pub disk_guid: Guid,
    pub entries_lba: u64,
    pub entry_count: u32,
    pub entry_size: u32,
    pub entries_crc: u32,
}

impl Header {
    /// Parses and checks (signature, size, CRC) the header at the start of
    /// `sector`.
    fn parse(sector: &[u8]) -> Result<Header> {
        if sector.get(..8) != Some(&SIGNATURE[..]) {
            bail!("no GPT signature");
        }
        let size = read_u32(sector, H_SIZE).unwrap_or(0) as usize;
        if !(HEADER_SIZE..=sector.len()).contains(&size) {
            bail!("header size {size} is not between {HEADER_SIZE} and the sector size");
        }
        let mut h = sector[..size].to_vec();
        let want = read_u32(&h, H_CRC).unwrap_or(0);
        put(&mut h, H_CRC, &[0; 4]);
        if crc32(&h) != want {
            bail!("header CRC mismatch");
        }
        Ok(Header {
            my_lba: read_u64(&h, H_MY_LBA).unwrap_or(0),
            alternate_lba: read_u64(&h, H_ALT_LBA).unwrap_or(0),
            first_usable_lba: read_u64(&h, H_FIRST_USABLE).unwrap_or(0),
            last_usable_lba: read_u64(&h, H_LAST_USABLE).unwrap_or(0),
            disk_guid: guid_at(&h, H_DISK_GUID),
            entries_lba: read_u64(&h, H_ENTRIES_LBA).unwrap_or(0),
            entry_count: read_u32(&h, H_COUNT).unwrap_or(0),
            entry_size: read_u32(&h, H_ENTRY_SIZE).unwrap_or(0),
            entries_crc: read_u32(&h, H_ENTRIES_CRC).unwrap_or(0),
        })
    }

    /// The header as one sector of `sector` bytes, CRC filled in.
    fn encode(&self, sector: u64) -> Vec<u8> {
        let mut s = vec![0u8; sector as usize];
        put(&mut s, 0, SIGNATURE);
        put(&mut s, 8, &REVISION.to_le_bytes());
        put(&mut s, H_SIZE, &(HEADER_SIZE as u32).to_le_bytes());
        put(&mut s, H_MY_LBA, &self.my_lba.to_le_bytes());
        put(&mut s, H_ALT_LBA, &self.alternate_lba.to_le_bytes());
        put(&mut s, H_FIRST_USABLE, &self.first_usable_lba.to_le_bytes());
        put(&mut s, H_LAST_USABLE, &self.last_usable_lba.to_le_bytes());
        put(&mut s, H_DISK_GUID, &self.disk_guid.to_bytes_le());
        put(&mut s, H_ENTRIES_LBA, &self.entries_lba.to_le_bytes());
        put(&mut s, H_COUNT, &self.entry_count.to_le_bytes());
        put(&mut s, H_ENTRY_SIZE, &self.entry_size.to_le_bytes());
        put(&mut s, H_ENTRIES_CRC, &self.entries_crc.to_le_bytes());
        let crc = crc32(&s[..HEADER_SIZE]);
        put(&mut s, H_CRC, &crc.to_le_bytes());
        s
    }

    fn array_bytes(&self) -> u64 {
        u64::from(self.entry_count) * u64::from(self.entry_size)
    }

    /// The same table as the other copy, at `my_lba` with its array at
    /// `entries_lba`.
    fn moved(&self, my_lba: u64, alternate_lba: u64, entries_lba: u64) -> Header {
        Header {
            my_lba,
            alternate_lba,
            entries_lba,
            ..*self
        }
    }
}

/// A used partition entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partition {
    /// Index in the entry array: the kernel's partition number - 1.
    pub index: usize,
    pub label: String,
    pub type_guid: Guid,
    pub unique_guid: Guid,
    /// First and last sector, inclusive.
    pub first_lba: u64,
    pub last_lba: u64,
    pub attributes: u64,
}

impl Partition {
    /// Byte offset and length on a disk of `sector`-byte sectors; in bounds
    /// for partitions of a [`Table`] read from that disk.
    pub fn range(&self, sector: u64) -> (u64, u64) {
        (
            self.first_lba * sector,
            (self.last_lba + 1 - self.first_lba) * sector,
        )
    }
}

/// Which copy of the table a [`Table`] was read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TableCopy {
    Primary,
    Backup,
}

/// A partition table read from a disk and checked against it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Table {
    pub sector_size: u64,
    /// Size of the disk it was read from, in bytes.
    pub disk_size: u64,
    pub disk_guid: Guid,
    /// The header of the copy read.
    pub header: Header,
    /// Used entries, in entry-array order.
    pub partitions: Vec<Partition>,
    pub source: TableCopy,
    /// Why the primary table was not used, when [`Self::source`] is the backup.
    pub primary_error: Option<String>,
    /// The raw entry array, rewritten by [`grow_last`].
    entries: Vec<u8>,
}

impl Table {
    pub fn find(&self, label: &str) -> Option<&Partition> {
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

    /// Sectors of one copy of the entry array.
    fn array_sectors(&self) -> u64 {
        gpt_array_sectors(self.header.array_bytes(), self.sector_size)
    }
}

/// Size of a disk image file, block device (whose metadata says 0) or
/// partition window, by seeking to its end.
pub fn device_size<D: Seek>(dev: &mut D) -> io::Result<u64> {
    let end = dev.seek(SeekFrom::End(0))?;
    dev.seek(SeekFrom::Start(0))?;
    Ok(end)
}

/// The size of the disk in the image file or block device `f`: as
/// [`device_size`], but for a regular file that is a fixed VHD, the disk
/// before its footer ([`crate::vhd::data_size`]). Block devices and
/// partitions are never taken for VHDs.
pub fn image_size(f: &mut std::fs::File) -> io::Result<u64> {
    let end = device_size(f)?;
    if !f.metadata()?.is_file() {
        return Ok(end);
    }
    let size = crate::vhd::data_size(f, end)?;
    f.seek(SeekFrom::Start(0))?;
    Ok(size)
}

fn read_exact_at<D: Read + Seek>(dev: &mut D, at: u64, len: usize) -> io::Result<Vec<u8>> {
    let mut b = vec![0u8; len];
    dev.seek(SeekFrom::Start(at))?;
    dev.read_exact(&mut b)?;
    Ok(b)
}

fn write_at<D: Write + Seek>(dev: &mut D, at: u64, b: &[u8]) -> io::Result<()> {
    dev.seek(SeekFrom::Start(at))?;
    dev.write_all(b)
}

/// Reads the partition table of a disk of `disk_size` bytes, at whichever
/// sector size ([`SECTOR_SIZES`]) it was laid out with. Never panics, loops
/// or allocates beyond [`MAX_ARRAY_BYTES`] on hostile bytes.
pub fn read<D: Read + Seek>(dev: &mut D, disk_size: u64) -> Result<Table> {
    let mut errors = Vec::new();
    for sector in SECTOR_SIZES {
        match read_at(dev, disk_size, sector) {
            Ok(t) => return Ok(t),
            Err(e) => errors.push(format!("at {sector}-byte sectors: {e:#}")),
        }
    }
    bail!("no valid GPT: {}", errors.join("; "))
}

/// Reads the partition table at a known sector size: the primary copy, or
/// the backup when the primary is damaged.
pub fn read_at<D: Read + Seek>(dev: &mut D, disk_size: u64, sector: u64) -> Result<Table> {
    if !SECTOR_SIZES.contains(&sector) {
        bail!("sector size {sector} is not supported");
    }
    let total = disk_size / sector;
    if total < 3 {
        bail!("the disk ({disk_size} bytes) is too small for a GPT");
    }
    let primary_error = match read_copy(dev, sector, disk_size, 1) {
        Ok(t) => return Ok(t),
        Err(e) => format!("{e:#}"),
    };
    // As Linux with `gpt`: the disk's last sector, then where the primary
    // header (if it reads at all) says the backup is.
    let mut candidates = vec![total - 1];
    if let Ok(s) = read_exact_at(dev, sector, sector as usize)
        && let Ok(h) = Header::parse(&s)
        && h.alternate_lba != total - 1
        && h.alternate_lba > 1
        && h.alternate_lba < total
    {
        candidates.push(h.alternate_lba);
    }
    let mut backup_errors = Vec::new();
    for lba in candidates {
        match read_copy(dev, sector, disk_size, lba) {
            Ok(mut t) => {
                t.source = TableCopy::Backup;
                t.primary_error = Some(primary_error);
                return Ok(t);
            }
            Err(e) => backup_errors.push(format!("at LBA {lba}: {e:#}")),
        }
    }
    bail!(
        "primary GPT: {primary_error}; backup GPT: {}",
        backup_errors.join("; ")
    )
}

/// Reads and checks the copy whose header is at `lba`.
fn read_copy<D: Read + Seek>(dev: &mut D, sector: u64, disk_size: u64, lba: u64) -> Result<Table> {
    let total = disk_size / sector;
    let s = read_exact_at(dev, lba * sector, sector as usize).context("reading the header")?;
    let h = Header::parse(&s)?;
    if h.my_lba != lba {
        bail!("the header at LBA {lba} says it is at LBA {}", h.my_lba);
    }
    if h.first_usable_lba > h.last_usable_lba || h.last_usable_lba >= total {
        bail!(
            "usable sectors {}..={} do not fit the disk's {total} sectors",
            h.first_usable_lba,
            h.last_usable_lba
        );
    }
    if h.entry_size < GPT_ENTRY_SIZE as u32 || !h.entry_size.is_power_of_two() {
        bail!(
            "partition entries of {} bytes: UEFI allows 128 × 2^n bytes",
            h.entry_size
        );
    }
    let array = h.array_bytes();
    if array > MAX_ARRAY_BYTES {
        bail!(
            "an entry array of {} entries of {} bytes is larger than {MAX_ARRAY_BYTES} bytes",
            h.entry_count,
            h.entry_size
        );
    }
    let sectors = gpt_array_sectors(array, sector);
    let array_end = h.entries_lba.saturating_add(sectors);
    let in_usable = h.entries_lba <= h.last_usable_lba && array_end > h.first_usable_lba;
    let on_header = h.entries_lba <= lba && array_end > lba;
    if h.entries_lba < 2 || array_end > total || in_usable || on_header {
        bail!(
            "the entry array at LBA {} ({sectors} sectors) is not on the disk outside the \
             usable sectors",
            h.entries_lba
        );
    }
    let entries = read_exact_at(dev, h.entries_lba * sector, array as usize)
        .context("reading the entry array")?;
    if crc32(&entries) != h.entries_crc {
        bail!("entry array CRC mismatch");
    }
    let partitions = parse_entries(&h, &entries)?;
    Ok(Table {
        sector_size: sector,
        disk_size,
        disk_guid: h.disk_guid,
        header: h,
        partitions,
        source: TableCopy::Primary,
        primary_error: None,
        entries,
    })
}

/// The used entries of an array, each inside the usable range, none
/// overlapping another.
fn parse_entries(h: &Header, entries: &[u8]) -> Result<Vec<Partition>> {
    let mut out = Vec::new();
    for (index, e) in entries.chunks_exact(h.entry_size as usize).enumerate() {
        let type_guid = guid_at(e, E_TYPE);
        if type_guid.is_nil() {
            continue;
        }
        let units: Vec<u16> = e[E_NAME..E_NAME + 2 * NAME_UNITS]
            .chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .take_while(|u| *u != 0)
            .collect();
        let p = Partition {
            index,
            label: String::from_utf16_lossy(&units),
            type_guid,
            unique_guid: guid_at(e, E_UNIQUE),
            first_lba: read_u64(e, E_FIRST).unwrap_or(0),
            last_lba: read_u64(e, E_LAST).unwrap_or(0),
            attributes: read_u64(e, E_ATTRS).unwrap_or(0),
        };
        if p.first_lba > p.last_lba
            || p.first_lba < h.first_usable_lba
            || p.last_lba > h.last_usable_lba
        {
            bail!(
                "partition {} ({:?}, LBA {}..={}) lies outside the usable sectors {}..={}",
                index + 1,
                p.label,
                p.first_lba,
                p.last_lba,
                h.first_usable_lba,
                h.last_usable_lba
            );
        }
        out.push(p);
    }
    let mut by_start: Vec<&Partition> = out.iter().collect();
    by_start.sort_by_key(|p| p.first_lba);
    for w in by_start.windows(2) {
        if w[1].first_lba <= w[0].last_lba {
            bail!(
                "partitions {} ({:?}) and {} ({:?}) overlap",
                w[0].index + 1,
                w[0].label,
                w[1].index + 1,
                w[1].label
            );
        }
    }
    Ok(out)
}

/// A partition of a new table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewPartition<'a> {
    pub label: &'a str,
    pub type_guid: Guid,
    pub unique_guid: Guid,
    pub first_lba: u64,
    pub last_lba: u64,
}

/// Writes a protective MBR and both tables ([`GPT_ENTRIES`] entries of
/// [`GPT_ENTRY_SIZE`] bytes, `parts` first) to a disk of `disk_size` bytes,
/// in the order of the module documentation. Only the table sectors are
/// written.
pub fn write_new<D: Device>(
    dev: &mut D,
    disk_size: u64,
    sector: u64,
    disk_guid: Guid,
    parts: &[NewPartition],
) -> Result<()> {
    if !SECTOR_SIZES.contains(&sector) {
        bail!("sector size {sector} is not supported");
    }
    let array_sectors = entry_array_sectors(sector);
    let end = DiskEnd::of(disk_size, sector, array_sectors)
        .ok_or_else(|| anyhow!("a disk of {disk_size} bytes cannot hold a GPT"))?;
    if parts.len() > GPT_ENTRIES as usize {
        bail!(
            "{} partitions do not fit a GPT of {GPT_ENTRIES}",
            parts.len()
        );
    }
    let mut entries = vec![0u8; (u64::from(GPT_ENTRIES) * GPT_ENTRY_SIZE) as usize];
    for (i, p) in parts.iter().enumerate() {
        let units: Vec<u16> = p.label.encode_utf16().collect();
        if units.len() > NAME_UNITS {
            bail!(
                "partition name {:?} is longer than {NAME_UNITS} characters",
                p.label
            );
        }
        let e = &mut entries[i * GPT_ENTRY_SIZE as usize..(i + 1) * GPT_ENTRY_SIZE as usize];
        put(e, E_TYPE, &p.type_guid.to_bytes_le());
        put(e, E_UNIQUE, &p.unique_guid.to_bytes_le());
        put(e, E_FIRST, &p.first_lba.to_le_bytes());
        put(e, E_LAST, &p.last_lba.to_le_bytes());
        for (j, u) in units.iter().enumerate() {
            put(e, E_NAME + 2 * j, &u.to_le_bytes());
        }
    }
    let primary = Header {
        my_lba: 1,
        alternate_lba: end.backup_header_lba,
        first_usable_lba: first_usable_lba(array_sectors),
        last_usable_lba: end.last_usable_lba,
        disk_guid,
        entries_lba: 2,
        entry_count: GPT_ENTRIES,
        entry_size: GPT_ENTRY_SIZE as u32,
        entries_crc: crc32(&entries),
    };
    // Check what was asked against the rules a reader applies.
    parse_entries(&primary, &entries).context("internal: the new partition table is invalid")?;
    let backup = primary.moved(end.backup_header_lba, 1, end.backup_entries_lba);
    commit(dev, sector, &primary, &backup, &entries, Mbr::New)
}

/// What to do with LBA 0.
enum Mbr {
    /// Write a fresh protective MBR.
    New,
    /// Update the size of an existing protective MBR, leave anything else.
    Resize,
}

/// The protective MBR's partition size for a disk whose last LBA is `last`.
fn mbr_size(last: u64) -> u32 {
    u32::try_from(last).unwrap_or(u32::MAX)
}

/// Whether LBA 0 holds a protective MBR (whose size a grow updates).
fn is_protective(mbr: &[u8]) -> bool {
    mbr.get(450) == Some(&0xEE) && mbr.get(510..512) == Some(&[0x55, 0xAA][..])
}

/// Writes a table: backup, sync, primary, MBR, sync (module documentation).
fn commit<D: Device>(
    dev: &mut D,
    sector: u64,
    primary: &Header,
    backup: &Header,
    entries: &[u8],
    mbr: Mbr,
) -> Result<()> {
    write_at(dev, backup.entries_lba * sector, entries)
        .context("writing the backup GPT entries")?;
    write_at(dev, backup.my_lba * sector, &backup.encode(sector))
        .context("writing the backup GPT header")?;
    dev.sync().context("syncing the backup GPT")?;
    write_at(dev, primary.entries_lba * sector, entries)
        .context("writing the primary GPT entries")?;
    write_at(dev, sector, &primary.encode(sector)).context("writing the primary GPT header")?;
    let size = mbr_size(backup.my_lba);
    match mbr {
        Mbr::New => {
            let mut m = [0u8; 512];
            // One partition of type 0xEE from LBA 1 over the whole disk.
            m[446..462].copy_from_slice(&[
                0x00, 0x00, 0x02, 0x00, 0xEE, 0xFF, 0xFF, 0xFF, 0x01, 0x00, 0x00, 0x00, 0, 0, 0, 0,
            ]);
            put(&mut m, 458, &size.to_le_bytes());
            m[510] = 0x55;
            m[511] = 0xAA;
            write_at(dev, 0, &m).context("writing the protective MBR")?;
        }
        Mbr::Resize => {
            let mut m = read_exact_at(dev, 0, 512).context("reading the protective MBR")?;
            if is_protective(&m) && read_u32(&m, 458).unwrap_or(0) != size {
                put(&mut m, 458, &size.to_le_bytes());
                write_at(dev, 0, &m).context("writing the protective MBR")?;
            }
        }
    }
    dev.sync().context("syncing the primary GPT")?;
    Ok(())
}

/// Gives the table the disk GUID `disk` and each used entry the unique
/// GUID [`contract::guid::partition_guid`] derives from it and the entry's
/// name, in the order every write here goes (the module's documentation):
/// a cut before the primary header is written leaves the old GUIDs in the
/// primary table (the change is made again, with other GUIDs, at the next
/// try), or a primary whose entries fail their CRC with the new backup
/// whole (read instead; [`grow_last`] then rewrites the primary). Returns
/// the disk GUID before.
pub fn reidentify<D: Device>(dev: &mut D, disk_size: u64, sector: u64, disk: Guid) -> Result<Guid> {
    let t = read_at(dev, disk_size, sector)?;
    let total = disk_size / sector;
    let mut entries = t.entries.clone();
    for p in &t.partitions {
        put(
            &mut entries,
            p.index * t.header.entry_size as usize + E_UNIQUE,
            &contract::guid::partition_guid(disk, &p.label).to_bytes_le(),
        );
    }
    let entries_crc = crc32(&entries);
    // Each copy stays where it is: the primary's entries where its header
    // says (LBA 2 when only the backup could be read), the backup's just
    // before its header.
    let (primary_entries, backup_lba, backup_entries) = match t.source {
        TableCopy::Primary => (
            t.header.entries_lba,
            t.header.alternate_lba,
            t.header.alternate_lba.saturating_sub(t.array_sectors()),
        ),
        TableCopy::Backup => (2, t.header.my_lba, t.header.entries_lba),
    };
    if primary_entries + t.array_sectors() > t.header.first_usable_lba
        || backup_entries <= t.header.last_usable_lba
        || backup_lba >= total
    {
        bail!("the GPT's copies are not where a rewrite in place can put them");
    }
    let primary = Header {
        my_lba: 1,
        alternate_lba: backup_lba,
        entries_lba: primary_entries,
        entries_crc,
        disk_guid: disk,
        ..t.header
    };
    let backup = primary.moved(backup_lba, 1, backup_entries);
    commit(dev, sector, &primary, &backup, &entries, Mbr::Resize)?;
    Ok(t.disk_guid)
}

/// What [`grow_last`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grown {
    /// Index of the entry in the array (the kernel's partition number - 1).
    pub index: usize,
    pub first_lba: u64,
    pub old_last_lba: u64,
    pub new_last_lba: u64,
}

/// Moves the backup table to the end of a disk of `disk_size` bytes and
/// makes the partition `label`, which must be the last one, end where
/// [`DiskEnd`] says; rewrites a damaged primary table from the backup.
/// `None` when there was nothing to do.
pub fn grow_last<D: Device>(
    dev: &mut D,
    disk_size: u64,
    sector: u64,
    label: &str,
) -> Result<Option<Grown>> {
    let t = read_at(dev, disk_size, sector)?;
    let total = disk_size / sector;
    let p = t
        .find(label)
        .ok_or_else(|| anyhow!("no GPT entry named {label}"))?;
    let (index, first, old_last) = (p.index, p.first_lba, p.last_lba);
    if t.partitions.iter().any(|q| q.last_lba > old_last) {
        bail!("{label} is not the last partition");
    }
    let end = DiskEnd::of(disk_size, sector, t.array_sectors())
        .ok_or_else(|| anyhow!("the disk is too small for its GPT"))?;
    let aligned = end
        .last_partition_lba(sector)
        .ok_or_else(|| anyhow!("the disk is too small for its GPT"))?;
    let new_last = aligned.max(old_last);
    if new_last > end.last_usable_lba {
        bail!(
            "{label} ends at LBA {old_last}, past the last usable sector {} of this disk",
            end.last_usable_lba
        );
    }
    let mbr = read_exact_at(dev, 0, 512).context("reading the protective MBR")?;
    let mbr_stale = is_protective(&mbr) && read_u32(&mbr, 458).unwrap_or(0) != mbr_size(total - 1);
    if t.source == TableCopy::Primary
        && t.header.alternate_lba == total - 1
        && new_last == old_last
        && !mbr_stale
    {
        return Ok(None);
    }
    let mut entries = t.entries.clone();
    put(
        &mut entries,
        index * t.header.entry_size as usize + E_LAST,
        &new_last.to_le_bytes(),
    );
    let entries_crc = crc32(&entries);
    // The primary array stays where it was (LBA 2 when only the backup
    // could be read), before the first usable sector.
    let primary_entries = match t.source {
        TableCopy::Primary => t.header.entries_lba,
        TableCopy::Backup => 2,
    };
    if primary_entries + t.array_sectors() > t.header.first_usable_lba {
        bail!("the primary entry array would not fit before the first usable sector");
    }
    let primary = Header {
        my_lba: 1,
        alternate_lba: end.backup_header_lba,
        last_usable_lba: end.last_usable_lba,
        entries_lba: primary_entries,
        entries_crc,
        ..t.header
    };
    let backup = primary.moved(end.backup_header_lba, 1, end.backup_entries_lba);
    commit(dev, sector, &primary, &backup, &entries, Mbr::Resize)?;
    Ok(Some(Grown {
        index,
        first_lba: first,
        old_last_lba: old_last,
        new_last_lba: new_last,
    }))
}

#[cfg(test)]
mod tests;
