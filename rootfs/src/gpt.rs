//! Growing the last partition of a GPT disk to the end of a disk that is
//! larger than the image it was written from.
//!
//! The order: the new backup entry array and header are written at the new
//! end of the disk and flushed first; then the primary entry array, header
//! and protective MBR. A power cut before the second flush leaves the old
//! primary intact (the next boot does the work again) — unless the new
//! primary entries reached the disk without their header: then the primary
//! no longer checks out, and the new backup at the end of the disk, already
//! complete, is the table. UEFI firmware restores the primary from it, and
//! Linux uses it because the images' command line has `gpt` (without it
//! Linux reads only the primary).

use anyhow::{Context, Result, bail};
use contract::partition::ALIGNMENT;
use std::io::{Read, Seek, SeekFrom, Write};

const SIGNATURE: &[u8; 8] = b"EFI PART";
/// Offsets in the GPT header.
const H_CRC: usize = 16;
const H_MY_LBA: usize = 24;
const H_ALT_LBA: usize = 32;
#[cfg(test)]
const H_FIRST_USABLE: usize = 40;
const H_LAST_USABLE: usize = 48;
const H_ENTRIES_LBA: usize = 72;
const H_NUM_ENTRIES: usize = 80;
const H_ENTRY_SIZE: usize = 84;
const H_ENTRIES_CRC: usize = 88;
/// Offsets in a partition entry.
const E_FIRST_LBA: usize = 32;
const E_LAST_LBA: usize = 40;
const E_NAME: usize = 56;
const E_NAME_LEN: usize = 72;

/// CRC-32 (IEEE 802.3, reflected, as the UEFI specification uses).
pub fn crc32(data: &[u8]) -> u32 {
    let mut crc = 0xffff_ffffu32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xedb8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

fn get_u32(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    if let Some(s) = b.get(at..at + 4) {
        a.copy_from_slice(s);
    }
    u32::from_le_bytes(a)
}
fn get_u64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    if let Some(s) = b.get(at..at + 8) {
        a.copy_from_slice(s);
    }
    u64::from_le_bytes(a)
}
fn put_u32(b: &mut [u8], at: usize, v: u32) {
    if let Some(s) = b.get_mut(at..at + 4) {
        s.copy_from_slice(&v.to_le_bytes());
    }
}
fn put_u64(b: &mut [u8], at: usize, v: u64) {
    if let Some(s) = b.get_mut(at..at + 8) {
        s.copy_from_slice(&v.to_le_bytes());
    }
}

/// The name of a partition entry (UTF-16LE, NUL-padded).
fn entry_name(e: &[u8]) -> String {
    let units: Vec<u16> = e
        .get(E_NAME..E_NAME + E_NAME_LEN)
        .unwrap_or_default()
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .take_while(|u| *u != 0)
        .collect();
    String::from_utf16_lossy(&units)
}

/// A GPT header and its entry array, as read from the disk.
#[derive(Debug, Clone)]
pub struct Table {
    pub header: Vec<u8>,
    pub entries: Vec<u8>,
    pub sector: u64,
}

impl Table {
    pub fn alternate_lba(&self) -> u64 {
        get_u64(&self.header, H_ALT_LBA)
    }
    #[cfg(test)]
    pub fn last_usable(&self) -> u64 {
        get_u64(&self.header, H_LAST_USABLE)
    }
    fn entry_size(&self) -> usize {
        get_u32(&self.header, H_ENTRY_SIZE) as usize
    }
    fn entry_sectors(&self) -> u64 {
        (self.entries.len() as u64).div_ceil(self.sector)
    }
    /// `(index, first LBA, last LBA)` of the entry named `label`.
    pub fn find(&self, label: &str) -> Option<(usize, u64, u64)> {
        self.entries
            .chunks_exact(self.entry_size())
            .enumerate()
            .find(|(_, e)| entry_name(e) == label && e[..16].iter().any(|b| *b != 0))
            .map(|(i, e)| (i, get_u64(e, E_FIRST_LBA), get_u64(e, E_LAST_LBA)))
    }
    /// The highest last LBA of any used entry.
    fn max_last_lba(&self) -> u64 {
        self.entries
            .chunks_exact(self.entry_size())
            .filter(|e| e[..16].iter().any(|b| *b != 0))
            .map(|e| get_u64(e, E_LAST_LBA))
            .max()
            .unwrap_or(0)
    }
}

fn read_at<F: Read + Seek>(f: &mut F, at: u64, len: usize) -> std::io::Result<Vec<u8>> {
    let mut b = vec![0u8; len];
    f.seek(SeekFrom::Start(at))?;
    f.read_exact(&mut b)?;
    Ok(b)
}

fn write_at<F: Write + Seek>(f: &mut F, at: u64, b: &[u8]) -> std::io::Result<()> {
    f.seek(SeekFrom::Start(at))?;
    f.write_all(b)
}

/// Reads and checks the primary GPT (header at LBA 1).
pub fn read_primary<F: Read + Seek>(f: &mut F, sector: u64) -> Result<Table> {
    let ss = usize::try_from(sector).context("sector size")?;
    let lba1 = read_at(f, sector, ss).context("read the primary GPT header")?;
    if lba1.get(..8) != Some(&SIGNATURE[..]) {
        bail!("no GPT signature at LBA 1");
    }
    let hsize = get_u32(&lba1, 12) as usize;
    if !(92..=ss).contains(&hsize) {
        bail!("GPT header size {hsize} is invalid");
    }
    let mut header = lba1[..hsize].to_vec();
    let want = get_u32(&header, H_CRC);
    put_u32(&mut header, H_CRC, 0);
    if crc32(&header) != want {
        bail!("primary GPT header CRC mismatch");
    }
    put_u32(&mut header, H_CRC, want);
    if get_u64(&header, H_MY_LBA) != 1 {
        bail!("primary GPT header does not say it is at LBA 1");
    }
    let n = get_u32(&header, H_NUM_ENTRIES) as usize;
    let size = get_u32(&header, H_ENTRY_SIZE) as usize;
    if !(128..=4096).contains(&size) || !size.is_multiple_of(8) || n == 0 || n > 4096 {
        bail!("GPT entry array of {n} entries of {size} bytes is not supported");
    }
    let entries = read_at(f, get_u64(&header, H_ENTRIES_LBA) * sector, n * size)
        .context("read the primary GPT entry array")?;
    if crc32(&entries) != get_u32(&header, H_ENTRIES_CRC) {
        bail!("primary GPT entry array CRC mismatch");
    }
    Ok(Table {
        header,
        entries,
        sector,
    })
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

/// Where things go on a disk of `total` sectors: `(backup entries LBA, last
/// usable LBA, last LBA of the last partition rounded down to ALIGNMENT)`.
pub fn end_of_disk(total: u64, sector: u64, entry_sectors: u64) -> Option<(u64, u64, u64)> {
    let backup_entries = total.checked_sub(1 + entry_sectors)?;
    let last_usable = backup_entries.checked_sub(1)?;
    let aligned_end =
        ((last_usable + 1) * sector / ALIGNMENT * ALIGNMENT / sector).checked_sub(1)?;
    Some((backup_entries, last_usable, aligned_end))
}

/// Moves the backup GPT to the end of a disk of `disk_bytes` and makes the
/// partition `label` (which must be the last one) end at the last usable
/// LBA rounded down to [`ALIGNMENT`]. `None` when the table already spans
/// the disk and the partition cannot grow.
pub fn grow_last<F: Read + Write + Seek>(
    f: &mut F,
    sector: u64,
    disk_bytes: u64,
    label: &str,
    flush: &mut dyn FnMut(&mut F) -> std::io::Result<()>,
) -> Result<Option<Grown>> {
    let t = read_primary(f, sector)?;
    let total = disk_bytes / sector;
    let (index, first, old_last) = t
        .find(label)
        .with_context(|| format!("no GPT entry named {label}"))?;
    if t.max_last_lba() != old_last {
        bail!("{label} is not the last partition");
    }
    if t.alternate_lba() >= total {
        bail!(
            "the backup GPT header (LBA {}) is beyond the disk's {total} sectors",
            t.alternate_lba()
        );
    }
    let (backup_entries, last_usable, aligned_end) =
        end_of_disk(total, sector, t.entry_sectors()).context("disk too small for a GPT")?;
    let new_last = aligned_end.max(old_last);
    if t.alternate_lba() == total - 1 && new_last == old_last {
        return Ok(None);
    }
    let mut entries = t.entries.clone();
    let at = index * t.entry_size();
    put_u64(&mut entries, at + E_LAST_LBA, new_last);
    let entries_crc = crc32(&entries);

    let seal = |h: &mut Vec<u8>| {
        put_u32(h, H_CRC, 0);
        let c = crc32(h);
        put_u32(h, H_CRC, c);
    };
    let mut primary = t.header.clone();
    put_u64(&mut primary, H_ALT_LBA, total - 1);
    put_u64(&mut primary, H_LAST_USABLE, last_usable);
    put_u32(&mut primary, H_ENTRIES_CRC, entries_crc);
    seal(&mut primary);
    let mut backup = primary.clone();
    put_u64(&mut backup, H_MY_LBA, total - 1);
    put_u64(&mut backup, H_ALT_LBA, 1);
    put_u64(&mut backup, H_ENTRIES_LBA, backup_entries);
    seal(&mut backup);
    let pad = |h: &[u8]| {
        let mut s = vec![0u8; sector as usize];
        s[..h.len()].copy_from_slice(h);
        s
    };

    // 1. The new backup, at the new end, flushed.
    write_at(f, backup_entries * sector, &entries).context("write the backup GPT entries")?;
    write_at(f, (total - 1) * sector, &pad(&backup)).context("write the backup GPT header")?;
    flush(f).context("flush the backup GPT")?;
    // 2. The primary entries and header, and the protective MBR's size.
    let primary_entries = get_u64(&primary, H_ENTRIES_LBA);
    write_at(f, primary_entries * sector, &entries).context("write the primary GPT entries")?;
    write_at(f, sector, &pad(&primary)).context("write the primary GPT header")?;
    let mut mbr = read_at(f, 0, 512).context("read the protective MBR")?;
    if mbr[450] == 0xee && mbr[510..512] == [0x55, 0xaa] {
        put_u32(&mut mbr, 458, u32::try_from(total - 1).unwrap_or(u32::MAX));
        write_at(f, 0, &mbr).context("write the protective MBR")?;
    }
    flush(f).context("flush the primary GPT")?;
    Ok(Some(Grown {
        index,
        first_lba: first,
        old_last_lba: old_last,
        new_last_lba: new_last,
    }))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use contract::partition::{GPT_ENTRIES, LAYOUT, MIB};
    use std::path::Path;

    #[test]
    fn crc32_check_value() {
        assert_eq!(crc32(b"123456789"), 0xcbf4_3926);
    }

    /// A fresh GPT laid out like the builder's (the contract's partitions,
    /// STATE 32 MiB, EPHEMERAL to the end) on a plain file of `bytes`.
    pub fn fresh_disk(path: &Path, sector: u64, bytes: u64) {
        let ss = sector as usize;
        let total = bytes / sector;
        let entry_size = 128usize;
        let n = GPT_ENTRIES as usize;
        let entry_sectors = ((n * entry_size) as u64).div_ceil(sector);
        let (backup_entries, last_usable, aligned_end) =
            end_of_disk(total, sector, entry_sectors).unwrap();
        let mut entries = vec![0u8; n * entry_size];
        let mut at = MIB / sector;
        for (i, p) in LAYOUT.iter().enumerate() {
            let e = &mut entries[i * entry_size..(i + 1) * entry_size];
            e[..16].copy_from_slice(&[0x11; 16]);
            e[16] = i as u8 + 1;
            let len = match p.default_size {
                Some(_) if p.label == "STATE" => 32 * MIB,
                Some(s) => s,
                None => (aligned_end + 1) * sector - at * sector,
            };
            put_u64(e, E_FIRST_LBA, at);
            put_u64(e, E_LAST_LBA, at + len / sector - 1);
            for (j, u) in p.label.encode_utf16().enumerate() {
                e[E_NAME + 2 * j..E_NAME + 2 * j + 2].copy_from_slice(&u.to_le_bytes());
            }
            at += len / sector;
        }
        let mut h = vec![0u8; 92];
        h[..8].copy_from_slice(SIGNATURE);
        put_u32(&mut h, 8, 0x0001_0000);
        put_u32(&mut h, 12, 92);
        put_u64(&mut h, H_MY_LBA, 1);
        put_u64(&mut h, H_ALT_LBA, total - 1);
        put_u64(&mut h, H_FIRST_USABLE, 2 + entry_sectors);
        put_u64(&mut h, H_LAST_USABLE, last_usable);
        h[56..72].copy_from_slice(&[0x22; 16]);
        put_u64(&mut h, H_ENTRIES_LBA, 2);
        put_u32(&mut h, H_NUM_ENTRIES, n as u32);
        put_u32(&mut h, H_ENTRY_SIZE, entry_size as u32);
        put_u32(&mut h, H_ENTRIES_CRC, crc32(&entries));
        let mut b = h.clone();
        put_u64(&mut b, H_MY_LBA, total - 1);
        put_u64(&mut b, H_ALT_LBA, 1);
        put_u64(&mut b, H_ENTRIES_LBA, backup_entries);
        for x in [&mut h, &mut b] {
            let c = crc32(x);
            put_u32(x, H_CRC, c);
        }
        let mut mbr = vec![0u8; 512];
        mbr[446 + 2] = 0x02;
        mbr[450] = 0xee;
        put_u32(&mut mbr, 454, 1);
        put_u32(&mut mbr, 458, u32::try_from(total - 1).unwrap_or(u32::MAX));
        mbr[510] = 0x55;
        mbr[511] = 0xaa;
        let mut f = std::fs::File::create(path).unwrap();
        f.set_len(bytes).unwrap();
        let pad = |x: &[u8]| {
            let mut s = vec![0u8; ss];
            s[..x.len()].copy_from_slice(x);
            s
        };
        write_at(&mut f, 0, &mbr).unwrap();
        write_at(&mut f, sector, &pad(&h)).unwrap();
        write_at(&mut f, 2 * sector, &entries).unwrap();
        write_at(&mut f, backup_entries * sector, &entries).unwrap();
        write_at(&mut f, (total - 1) * sector, &pad(&b)).unwrap();
    }

    fn sfdisk() -> Option<std::path::PathBuf> {
        ["/usr/sbin/sfdisk", "/sbin/sfdisk"]
            .iter()
            .map(std::path::PathBuf::from)
            .find(|p| p.is_file())
    }

    fn grows_at(sector: u64) {
        let dir = crate::partitions::tests::tempdir(&format!("gpt-{sector}"));
        let img = dir.join("disk.img");
        let small = 1024 * MIB;
        fresh_disk(&img, sector, small);
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&img)
            .unwrap();
        let mut flushes = 0;
        let mut flush = |f: &mut std::fs::File| {
            flushes += 1;
            f.sync_all()
        };
        // Already spanning the disk: nothing to do.
        assert_eq!(
            grow_last(&mut f, sector, small, "EPHEMERAL", &mut flush).unwrap(),
            None
        );
        let before = read_primary(&mut f, sector).unwrap();
        let (_, first, old_last) = before.find("EPHEMERAL").unwrap();
        // 3 GiB + 5 sectors: the end is not aligned.
        let big = 3072 * MIB + 5 * sector;
        f.set_len(big).unwrap();
        let g = grow_last(&mut f, sector, big, "EPHEMERAL", &mut flush)
            .unwrap()
            .unwrap();
        let total = big / sector;
        let entry_sectors = 128 * 128 / sector;
        let last_usable = total - 1 - entry_sectors - 1;
        assert_eq!(g.index, 5);
        assert_eq!(g.first_lba, first);
        assert_eq!(g.old_last_lba, old_last);
        // The partition ends on the last MiB boundary before the backup GPT.
        assert_eq!((g.new_last_lba + 1) * sector % MIB, 0);
        assert!(g.new_last_lba <= last_usable);
        assert!((last_usable + 1 - (g.new_last_lba + 1)) * sector < MIB);
        // At 512-byte sectors the 5 extra sectors cannot hold the backup
        // (33 sectors), at 4096 they exactly can (4 + 1).
        let end = if sector == 512 { 3071 } else { 3072 } * MIB;
        assert_eq!((g.new_last_lba + 1) * sector, end);
        let t = read_primary(&mut f, sector).unwrap();
        assert_eq!(t.alternate_lba(), total - 1);
        assert_eq!(t.last_usable(), last_usable);
        assert_eq!(t.find("EPHEMERAL").unwrap().2, g.new_last_lba);
        // The backup header is valid and points at its entries.
        let ss = sector as usize;
        let b = read_at(&mut f, (total - 1) * sector, ss).unwrap();
        let mut bh = b[..92].to_vec();
        let c = get_u32(&bh, H_CRC);
        put_u32(&mut bh, H_CRC, 0);
        assert_eq!(crc32(&bh), c);
        assert_eq!(get_u64(&bh, H_MY_LBA), total - 1);
        assert_eq!(get_u64(&bh, H_ALT_LBA), 1);
        let be = read_at(&mut f, get_u64(&bh, H_ENTRIES_LBA) * sector, 128 * 128).unwrap();
        assert_eq!(be, t.entries);
        // Idempotent.
        assert_eq!(
            grow_last(&mut f, sector, big, "EPHEMERAL", &mut flush).unwrap(),
            None
        );
        drop(f);
        assert_eq!(flushes, 2, "backup flushed, then primary");
        // Independent readers agree (sfdisk reads plain files at 512-byte
        // sectors only; fdisk -b for 4096).
        if let Some(sf) = sfdisk().filter(|_| sector == 512) {
            let out = std::process::Command::new(&sf)
                .arg("--verify")
                .arg(&img)
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout).to_string()
                + &String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "{text}");
            assert!(!text.contains("mismatch"), "{text}");
            let out = std::process::Command::new(&sf)
                .arg("--dump")
                .arg(&img)
                .output()
                .unwrap();
            let dump = String::from_utf8_lossy(&out.stdout);
            assert!(dump.contains(&format!("last-lba: {last_usable}")), "{dump}");
        }
        let fdisk = Path::new("/usr/sbin/fdisk");
        if fdisk.is_file() {
            let out = std::process::Command::new(fdisk)
                .args(["-b", &sector.to_string(), "-l"])
                .arg(&img)
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout).to_string()
                + &String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "{text}");
            assert!(!text.to_lowercase().contains("corrupt"), "{text}");
            assert!(!text.contains("mismatch"), "{text}");
            let line = text
                .lines()
                .find(|l| l.contains("disk.img6"))
                .unwrap_or_else(|| panic!("{text}"));
            let fields: Vec<&str> = line.split_whitespace().collect();
            assert_eq!(fields[2], g.new_last_lba.to_string(), "{text}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn grows_the_last_partition_at_512_byte_sectors() {
        grows_at(512);
    }

    #[test]
    fn grows_the_last_partition_at_4096_byte_sectors() {
        grows_at(4096);
    }

    /// A power cut right after the new backup is written (the first flush
    /// never returns) leaves the old table readable and consistent; the next
    /// attempt finishes the job.
    #[test]
    fn a_cut_after_the_backup_leaves_the_old_table_and_is_redone() {
        let dir = crate::partitions::tests::tempdir("gpt-cut");
        let img = dir.join("disk.img");
        fresh_disk(&img, 512, 1024 * MIB);
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&img)
            .unwrap();
        let before = read_primary(&mut f, 512).unwrap();
        let old_backup = read_at(&mut f, before.alternate_lba() * 512, 512).unwrap();
        let big = 2048 * MIB;
        f.set_len(big).unwrap();
        let mut cut = |_: &mut std::fs::File| Err(std::io::Error::other("power cut"));
        let e = grow_last(&mut f, 512, big, "EPHEMERAL", &mut cut).unwrap_err();
        assert!(format!("{e:#}").contains("flush the backup GPT"), "{e:#}");
        let after = read_primary(&mut f, 512).unwrap();
        assert_eq!(after.header, before.header);
        assert_eq!(after.entries, before.entries);
        assert_eq!(
            read_at(&mut f, before.alternate_lba() * 512, 512).unwrap(),
            old_backup
        );
        let mut flush = |f: &mut std::fs::File| f.sync_all();
        let g = grow_last(&mut f, 512, big, "EPHEMERAL", &mut flush)
            .unwrap()
            .unwrap();
        assert_eq!((g.new_last_lba + 1) * 512, 2047 * MIB);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn refuses_corrupt_tables_and_other_partitions() {
        let dir = crate::partitions::tests::tempdir("gpt-bad");
        let img = dir.join("disk.img");
        fresh_disk(&img, 512, 1024 * MIB);
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&img)
            .unwrap();
        let mut flush = |f: &mut std::fs::File| f.sync_all();
        let big = 2048 * MIB;
        f.set_len(big).unwrap();
        let e = grow_last(&mut f, 512, big, "STATE", &mut flush).unwrap_err();
        assert!(format!("{e:#}").contains("not the last"), "{e:#}");
        let e = grow_last(&mut f, 512, big, "NOPE", &mut flush).unwrap_err();
        assert!(format!("{e:#}").contains("no GPT entry"), "{e:#}");
        // A disk smaller than the table says.
        let e = grow_last(&mut f, 512, 512 * MIB, "EPHEMERAL", &mut flush).unwrap_err();
        assert!(format!("{e:#}").contains("beyond"), "{e:#}");
        // One flipped byte in the entries.
        write_at(&mut f, 2 * 512 + 200, &[0x99]).unwrap();
        let e = grow_last(&mut f, 512, big, "EPHEMERAL", &mut flush).unwrap_err();
        assert!(format!("{e:#}").contains("CRC"), "{e:#}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
