//! GPT reading (bootstate::gpt, which the builder, the installer, inspect
//! and the runtime's grow all use): a disk of arbitrary bytes is read or
//! refused, never a panic; what it reads lies on the disk and does not
//! overlap; a grow of what it reads leaves a table it reads again.
//!
//! Random bytes never carry a header and an entry array whose CRC-32s
//! match (nor reach 34 sectors at libFuzzer's first input lengths), so
//! inputs may be patches on a real table instead: the first
//! byte says whether the rest is the disk itself (bit 0 clear) or patches
//! `where off len bytes[len]` (as in the fat target: `where`'s top 3 bits
//! name a region, its low 5 bits and `off` the offset in it) on a disk
//! written by `gpt::write_new` at 512- or 4096-byte sectors (bit 1), with
//! the CRCs of both headers and their arrays made right again after the
//! patches (bit 2), as an attacker would, so that the checks behind the
//! CRCs are reached.
#![no_main]
use bootstate::gpt::{self, NewPartition};
use contract::Guid;
use contract::partition::MIB;
use libfuzzer_sys::fuzz_target;
use std::io::Cursor;
use std::sync::OnceLock;

/// A disk of 2 MiB with the builder's table: BOOT, then EPHEMERAL last,
/// ending before the disk's aligned end (a grow has work to do).
fn base(sector: u64) -> Vec<u8> {
    let len = 2 * MIB;
    let mut dev = Cursor::new(vec![0u8; len as usize]);
    let lba = |bytes: u64| bytes / sector;
    let parts = [
        NewPartition {
            label: "BOOT",
            type_guid: Guid::from_u128(0xB007),
            unique_guid: Guid::from_u128(1),
            first_lba: lba(MIB / 4),
            last_lba: lba(MIB) - 1,
        },
        NewPartition {
            label: "EPHEMERAL",
            type_guid: Guid::from_u128(0xE9E),
            unique_guid: Guid::from_u128(2),
            first_lba: lba(MIB),
            last_lba: lba(MIB + MIB / 2) - 1,
        },
    ];
    gpt::write_new(&mut dev, len, sector, Guid::from_u128(0xD15C), &parts).expect("a new table");
    dev.into_inner()
}

fn bases() -> &'static [Vec<u8>; 2] {
    static B: OnceLock<[Vec<u8>; 2]> = OnceLock::new();
    B.get_or_init(|| [base(512), base(4096)])
}

fn le(b: &[u8], at: usize, n: usize) -> u64 {
    b.get(at..at + n).map_or(0, |s| {
        s.iter().rev().fold(0u64, |v, x| v << 8 | u64::from(*x))
    })
}

/// Makes the CRCs of the header at `lba` (and of the array it names, when
/// that lies on the disk) match what is there.
fn fix_crcs(disk: &mut [u8], sector: usize, lba: usize) {
    let h = lba * sector;
    if disk.get(h..h + 8) != Some(&gpt::SIGNATURE[..]) {
        return;
    }
    let array = le(disk, h + 80, 4) * le(disk, h + 84, 4);
    let at = le(disk, h + 72, 8).saturating_mul(sector as u64);
    if array <= gpt::MAX_ARRAY_BYTES
        && let Some(end) = at.checked_add(array)
        && let Some(entries) = disk.get(at as usize..end as usize)
    {
        let crc = crc32fast::hash(entries);
        disk[h + 88..h + 92].copy_from_slice(&crc.to_le_bytes());
    }
    let size = le(disk, h + 12, 4) as usize;
    if (92..=sector).contains(&size) {
        disk[h + 16..h + 20].fill(0);
        let crc = crc32fast::hash(&disk[h..h + size]);
        disk[h + 16..h + 20].copy_from_slice(&crc.to_le_bytes());
    }
}

/// The disk an input describes.
fn disk(data: &[u8]) -> Vec<u8> {
    let Some((&mode, mut rest)) = data.split_first() else {
        return Vec::new();
    };
    if mode & 1 == 0 {
        return rest.to_vec();
    }
    let sector = if mode & 2 == 0 { 512 } else { 4096 };
    let mut disk = bases()[usize::from(mode & 2 != 0)].clone();
    let len = disk.len();
    let total = len / sector;
    while let [at, lo, n, tail @ ..] = rest {
        let n = usize::from(*n).min(tail.len());
        let off = usize::from(*at & 0x1F) << 8 | usize::from(*lo);
        let at = match *at >> 5 {
            // The MBR, the primary header and array.
            0 => off,
            // The primary array by 32 bytes (4096-byte sectors).
            1 => 2 * sector + off * 32,
            // The disk's last 8 KiB: the backup header, the end of its array.
            2 => len - 8192 + off,
            // Anywhere, by sectors.
            _ => off * sector % len,
        };
        let end = (at + n).min(len);
        disk[at..end].copy_from_slice(&tail[..end - at]);
        rest = &tail[n..];
    }
    if mode & 4 != 0 {
        fix_crcs(&mut disk, sector, 1);
        fix_crcs(&mut disk, sector, total - 1);
    }
    disk
}

fuzz_target!(|data: &[u8]| {
    let data = &disk(data)[..];
    let len = data.len() as u64;
    let Ok(t) = gpt::read(&mut Cursor::new(data), len) else {
        return;
    };
    for p in &t.partitions {
        let (off, size) = p.range(t.sector_size);
        assert!(off + size <= len);
    }
    // The runtime's grow on a disk twice the size: it either refuses or
    // leaves a table that reads, with the same partitions but the last.
    let Some(last) = t.partitions.iter().max_by_key(|p| p.last_lba) else {
        return;
    };
    let mut bigger = data.to_vec();
    bigger.resize(data.len() * 2, 0);
    let mut dev = Cursor::new(bigger);
    if gpt::grow_last(&mut dev, len * 2, t.sector_size, &last.label).is_ok() {
        let g = gpt::read_at(&mut dev, len * 2, t.sector_size).expect("a grown table reads");
        assert_eq!(g.partitions.len(), t.partitions.len());
    }
});
