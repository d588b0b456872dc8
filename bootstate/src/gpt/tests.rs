//! GPT tests on plain files at 512- and 4096-byte sectors. Tables are made
//! by [`write_new`] (the builder's writer) or by sfdisk; hostile variants
//! are those tables with fields changed and their CRCs made right again, as
//! an attacker would.

use super::*;
use crate::device::Faulty;
use crate::testutil::{output, tool};
use contract::partition::{ALIGNMENT, LAYOUT, MIB};
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The contract's partitions, 1 MiB apart from 1 MiB, STATE at 32 MiB and
/// EPHEMERAL to the aligned end of a disk of `bytes`.
fn layout(bytes: u64, sector: u64) -> Vec<NewPartition<'static>> {
    let end = DiskEnd::of(bytes, sector, entry_array_sectors(sector)).unwrap();
    let mut at = ALIGNMENT;
    LAYOUT
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let len = match p.default_size {
                Some(_) if p.label == "STATE" => 32 * MIB,
                Some(s) => s,
                None => end.partitions_end - at,
            };
            let part = NewPartition {
                label: p.label,
                type_guid: p.type_guid,
                unique_guid: Guid::from_u128(0x1000 + i as u128),
                first_lba: at / sector,
                last_lba: (at + len) / sector - 1,
            };
            at += len;
            part
        })
        .collect()
}

fn open_rw(path: &Path) -> File {
    OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap()
}

/// A new sparse disk image of `bytes` with the builder's table.
fn disk(dir: &Path, name: &str, sector: u64, bytes: u64) -> PathBuf {
    let path = dir.join(name);
    let f = File::create(&path).unwrap();
    f.set_len(bytes).unwrap();
    drop(f);
    let mut f = open_rw(&path);
    write_new(
        &mut f,
        bytes,
        sector,
        Guid::from_u128(0xD15C),
        &layout(bytes, sector),
    )
    .unwrap();
    path
}

/// The disk image at `path`, made `bytes` long (a larger disk).
fn enlarged(path: PathBuf, bytes: u64) -> PathBuf {
    OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(bytes)
        .unwrap();
    path
}

fn table(path: &Path, sector: u64) -> Table {
    let mut f = File::open(path).unwrap();
    let size = device_size(&mut f).unwrap();
    read_at(&mut f, size, sector).unwrap()
}

/// The table as libfdisk reads it: `(start, size, name)` per partition. At
/// 512-byte sectors through `sfdisk --dump`, at 4096 through `fdisk -b`
/// (sfdisk reads plain files at 512-byte sectors only). Panics when the tool
/// refuses the disk.
fn libfdisk(path: &Path, sector: u64) -> Vec<(u64, u64, String)> {
    if sector == 512 {
        let text = output(
            Command::new(tool("sfdisk")).arg("--dump").arg(path),
            "sfdisk refused the table",
        );
        text.lines()
            .filter(|l| l.contains(" : start="))
            .map(|l| {
                let field = |k: &str| {
                    l.split(',')
                        .find_map(|f| f.trim().split_once('=').filter(|(n, _)| n.ends_with(k)))
                        .map(|(_, v)| v.trim().to_string())
                        .unwrap_or_default()
                };
                (
                    field("start").parse().unwrap(),
                    field("size").parse().unwrap(),
                    field("name").trim_matches('"').to_string(),
                )
            })
            .collect()
    } else {
        let text = output(
            Command::new(tool("fdisk"))
                .args(["-b", &sector.to_string(), "-o", "Start,Sectors,Name", "-l"])
                .arg(path),
            "fdisk refused the table",
        );
        let mut rows = Vec::new();
        let mut body = false;
        for l in text.lines() {
            if l.trim_start().starts_with("Start") {
                body = true;
                continue;
            }
            let f: Vec<&str> = l.split_whitespace().collect();
            if body && f.len() == 3 {
                rows.push((f[0].parse().unwrap(), f[1].parse().unwrap(), f[2].into()));
            }
        }
        rows
    }
}

fn ours(t: &Table) -> Vec<(u64, u64, String)> {
    t.partitions
        .iter()
        .map(|p| (p.first_lba, p.last_lba + 1 - p.first_lba, p.label.clone()))
        .collect()
}

#[test]
fn new_tables_read_back_and_libfdisk_agrees() {
    let dir = tempfile::tempdir().unwrap();
    for sector in SECTOR_SIZES {
        let bytes = 1024 * MIB;
        let path = disk(dir.path(), &format!("new-{sector}"), sector, bytes);
        let t = table(&path, sector);
        assert_eq!(t.source, TableCopy::Primary);
        assert_eq!(t.disk_guid, Guid::from_u128(0xD15C));
        assert_eq!(t.partitions.len(), LAYOUT.len());
        for (p, want) in t.partitions.iter().zip(layout(bytes, sector)) {
            assert_eq!(
                (p.label.as_str(), p.type_guid, p.unique_guid),
                (want.label, want.type_guid, want.unique_guid)
            );
            assert_eq!((p.first_lba, p.last_lba), (want.first_lba, want.last_lba));
        }
        assert_eq!(libfdisk(&path, sector), ours(&t));
        // The sector size is found by read().
        let mut f = File::open(&path).unwrap();
        assert_eq!(read(&mut f, bytes).unwrap().sector_size, sector);
        // The backup copy, read on its own, is the same table.
        let end = DiskEnd::of(bytes, sector, entry_array_sectors(sector)).unwrap();
        let b = read_copy(&mut f, sector, bytes, end.backup_header_lba).unwrap();
        assert_eq!(b.partitions, t.partitions);
        assert_eq!(b.header.alternate_lba, 1);
    }
}

#[test]
fn tables_made_by_sfdisk_read_as_sfdisk_reads_them() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sfdisk.img");
    File::create(&path).unwrap().set_len(300 * MIB).unwrap();
    let script = "label: gpt\nfirst-lba: 2048\nsize=10MiB, name=\"one\"\nsize=20MiB, name=\"two\"\nname=\"rest\"\n";
    let mut child = Command::new(tool("sfdisk"))
        .arg("--quiet")
        .arg(&path)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(script.as_bytes())
        .unwrap();
    assert!(child.wait().unwrap().success());
    let t = table(&path, 512);
    assert_eq!(ours(&t), libfdisk(&path, 512));
    assert_eq!(t.partitions[2].label, "rest");
}

/// Rewrites the copy at `lba` after `change`, with correct CRCs: what an
/// attacker who knows the format writes.
fn craft(path: &Path, sector: u64, lba: u64, change: impl FnOnce(&mut Header, &mut Vec<u8>)) {
    let mut f = open_rw(path);
    let s = read_exact_at(&mut f, lba * sector, sector as usize).unwrap();
    let mut h = Header::parse(&s).unwrap();
    let at = h.entries_lba * sector;
    let mut entries = read_exact_at(&mut f, at, h.array_bytes() as usize).unwrap();
    change(&mut h, &mut entries);
    h.entries_crc = crc32(&entries);
    write_at(&mut f, at, &entries).unwrap();
    write_at(&mut f, lba * sector, &h.encode(sector)).unwrap();
}

/// The array re-laid with entries of `size` bytes (each entry's 128 bytes
/// first, the rest zero).
fn with_entry_size(h: &mut Header, entries: &mut Vec<u8>, size: u32) {
    let old = h.entry_size as usize;
    let n = h.entry_count as usize;
    let count = n * old / size as usize;
    let mut out = vec![0u8; count * size as usize];
    for i in 0..count.min(n) {
        out[i * size as usize..i * size as usize + 128]
            .copy_from_slice(&entries[i * old..i * old + 128]);
    }
    h.entry_count = count as u32;
    h.entry_size = size;
    *entries = out;
}

#[test]
fn every_legal_entry_size_reads_and_the_rest_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    for sector in SECTOR_SIZES {
        let path = disk(dir.path(), &format!("sizes-{sector}"), sector, 1024 * MIB);
        let want = table(&path, sector).partitions;
        for size in [256u32, 512, 1024, 2048] {
            let p = disk(
                dir.path(),
                &format!("size-{sector}-{size}"),
                sector,
                1024 * MIB,
            );
            craft(&p, sector, 1, |h, e| with_entry_size(h, e, size));
            let t = table(&p, sector);
            assert_eq!(t.source, TableCopy::Primary, "entry size {size}");
            assert_eq!(t.header.entry_size, size);
            assert_eq!(
                t.partitions
                    .iter()
                    .map(|p| (&p.label, p.first_lba, p.last_lba))
                    .collect::<Vec<_>>(),
                want.iter()
                    .map(|p| (&p.label, p.first_lba, p.last_lba))
                    .collect::<Vec<_>>(),
                "entry size {size}"
            );
        }
        // Illegal sizes in both copies: refused, with what is wrong.
        let end = DiskEnd::of(1024 * MIB, sector, entry_array_sectors(sector)).unwrap();
        for size in [0u32, 64, 100, 129, 384] {
            let p = disk(
                dir.path(),
                &format!("bad-{sector}-{size}"),
                sector,
                1024 * MIB,
            );
            for lba in [1, end.backup_header_lba] {
                craft(&p, sector, lba, |h, _| h.entry_size = size);
            }
            let mut f = File::open(&p).unwrap();
            let e = format!("{:#}", read_at(&mut f, 1024 * MIB, sector).unwrap_err());
            assert!(e.contains("128 × 2^n"), "{size}: {e}");
        }
    }
}

#[test]
fn a_damaged_primary_falls_back_to_the_backup() {
    let dir = tempfile::tempdir().unwrap();
    for sector in SECTOR_SIZES {
        let path = disk(
            dir.path(),
            &format!("fallback-{sector}"),
            sector,
            1024 * MIB,
        );
        let want = table(&path, sector).partitions;
        // A flipped byte in the primary array, then in its header.
        for at in [2 * sector + 200, sector + 60] {
            let p = disk(
                dir.path(),
                &format!("flip-{sector}-{at}"),
                sector,
                1024 * MIB,
            );
            let mut f = open_rw(&p);
            let b = read_exact_at(&mut f, at, 1).unwrap();
            write_at(&mut f, at, &[b[0] ^ 0x5a]).unwrap();
            let t = table(&p, sector);
            assert_eq!(t.source, TableCopy::Backup);
            assert!(t.primary_error.as_deref().unwrap().contains("CRC"), "{t:?}");
            assert_eq!(t.partitions, want);
            // libfdisk does the same.
            assert_eq!(libfdisk(&p, sector), ours(&t));
        }
        // Both copies damaged: refused, saying so for each.
        let p = disk(dir.path(), &format!("both-{sector}"), sector, 1024 * MIB);
        let mut f = open_rw(&p);
        write_at(&mut f, 2 * sector + 200, &[0x99]).unwrap();
        let last = 1024 * MIB / sector - 1;
        write_at(&mut f, last * sector + 60, &[0x99]).unwrap();
        let e = format!("{:#}", read_at(&mut f, 1024 * MIB, sector).unwrap_err());
        assert!(e.contains("primary GPT") && e.contains("backup GPT"), "{e}");
    }
}

#[test]
fn contradictions_are_refused_without_panic() {
    let dir = tempfile::tempdir().unwrap();
    let sector = 512;

    let end = DiskEnd::of(1024 * MIB, sector, entry_array_sectors(sector)).unwrap();
    type Change = fn(&mut Header, &mut Vec<u8>);
    let cases: [(&str, Change); 7] = [
        ("overlap", |_, e| {
            // STATE starts inside META.
            let meta_first = read_u64(e, 3 * 128 + E_FIRST).unwrap();
            put(e, 4 * 128 + E_FIRST, &meta_first.to_le_bytes());
        }),
        ("outside the usable", |_, e| {
            put(e, 5 * 128 + E_LAST, &u64::MAX.to_le_bytes());
        }),
        ("lies outside", |_, e| {
            put(e, E_FIRST, &(u64::MAX / 2).to_le_bytes());
        }),
        ("larger than", |h, _| h.entry_count = u32::MAX),
        ("usable sectors", |h, _| h.last_usable_lba = u64::MAX),
        ("not on the disk", |h, _| h.entries_lba = u64::MAX - 3),
        ("not on the disk", |h, _| h.entries_lba = h.first_usable_lba),
    ];
    for (want, change) in cases {
        let p = disk(dir.path(), "case", sector, 1024 * MIB);
        for lba in [1, end.backup_header_lba] {
            craft(&p, sector, lba, change);
        }
        let mut f = File::open(&p).unwrap();
        let e = format!("{:#}", read_at(&mut f, 1024 * MIB, sector).unwrap_err());
        assert!(e.contains(want), "{want}: {e}");
    }
    // A header that names another LBA than its own.
    let p = disk(dir.path(), "case", sector, 1024 * MIB);
    craft(&p, sector, 1, |h, _| h.my_lba = 7);
    let t = table(&p, sector);
    assert_eq!(t.source, TableCopy::Backup);
    assert!(t.primary_error.unwrap().contains("says it is at LBA 7"));
    // Not a GPT at all, and too small a disk.
    let mut zeros = std::io::Cursor::new(vec![0u8; 1 << 20]);
    assert!(format!("{:#}", read(&mut zeros, 1 << 20).unwrap_err()).contains("no valid GPT"));
    let mut tiny = std::io::Cursor::new(vec![0u8; 1000]);
    assert!(read(&mut tiny, 1000).is_err());
}

/// The grow, cut before each of its writes: every cut leaves a table that
/// our reader and libfdisk accept, the old one or the new one (the other
/// partitions unchanged, the last ending where it did or where it will),
/// and growing again finishes with both copies whole. When the cut loses
/// unsynced writes, a cut after the backup's sync leaves any of the
/// primary's states (old, its new array alone, new).
fn grow_cut_at_every_write(sector: u64, loss: crate::device::Loss) {
    let dir = tempfile::tempdir().unwrap();
    let small = 1024 * MIB;
    let big = 3072 * MIB + 5 * sector;
    let fresh = |name: &str| enlarged(disk(dir.path(), name, sector, small), big);
    let before = table(&fresh("before"), sector);
    let last_before = before.partitions[5].last_lba;
    // The whole grow, counted.
    let p = fresh("whole");
    let mut f = Faulty::counting(open_rw(&p));
    let g = grow_last(&mut f, big, sector, "EPHEMERAL")
        .unwrap()
        .unwrap();
    let writes = f.writes();
    assert_eq!(
        writes, 5,
        "backup entries and header, primary entries and header, MBR"
    );
    let end = if sector == 512 { 3071 } else { 3072 } * MIB;
    assert_eq!((g.new_last_lba + 1) * sector, end);
    assert_eq!(g.old_last_lba, last_before);
    assert_eq!(
        grow_last(&mut open_rw(&p), big, sector, "EPHEMERAL").unwrap(),
        None
    );
    let total = big / sector;
    for n in 1..=writes {
        let p = fresh(&format!("cut-{n}"));
        let mut f = Faulty::failing_at(open_rw(&p), n);
        assert!(
            grow_last(&mut f, big, sector, "EPHEMERAL").is_err(),
            "cut {n}"
        );
        drop(f);
        let t = table(&p, sector);
        assert_eq!(
            t.partitions[..5],
            before.partitions[..5],
            "cut {n}: the other partitions"
        );
        let last = t.partitions[5].last_lba;
        assert!(
            last == last_before || last == g.new_last_lba,
            "cut {n}: EPHEMERAL ends at {last}"
        );
        // Until the primary header is written the old primary is whole;
        // with its new array but not its header the new backup is the table.
        let expect = match n {
            1..=3 => (TableCopy::Primary, last_before),
            4 => (TableCopy::Backup, g.new_last_lba),
            _ => (TableCopy::Primary, g.new_last_lba),
        };
        let lossy_ok = loss != crate::device::Loss::None
            && n >= 4
            && [
                (TableCopy::Primary, last_before),
                (TableCopy::Backup, g.new_last_lba),
                (TableCopy::Primary, g.new_last_lba),
            ]
            .contains(&(t.source, last));
        assert!(
            (t.source, last) == expect || lossy_ok,
            "cut {n}: {:?}",
            (t.source, last)
        );
        assert_eq!(libfdisk(&p, sector), ours(&t), "cut {n}");
        // The next boot grows again, to the end.
        let again = grow_last(&mut open_rw(&p), big, sector, "EPHEMERAL").unwrap();
        assert_eq!(
            again.map(|g| g.new_last_lba),
            Some(g.new_last_lba),
            "cut {n}"
        );
        let t = table(&p, sector);
        assert_eq!(
            (t.source, t.header.alternate_lba),
            (TableCopy::Primary, total - 1),
            "cut {n}"
        );
        assert_eq!(t.partitions[5].last_lba, g.new_last_lba, "cut {n}");
        let b = read_copy(&mut File::open(&p).unwrap(), sector, big, total - 1).unwrap();
        assert_eq!(b.partitions, t.partitions, "cut {n}: the backup");
        assert_eq!(libfdisk(&p, sector), ours(&t), "cut {n}");
        assert_eq!(
            grow_last(&mut open_rw(&p), big, sector, "EPHEMERAL").unwrap(),
            None
        );
    }
}

#[test]
fn the_grow_cut_at_every_write_512() {
    crate::device::each_loss(|loss| grow_cut_at_every_write(512, loss));
}

#[test]
fn the_grow_cut_at_every_write_4096() {
    crate::device::each_loss(|loss| grow_cut_at_every_write(4096, loss));
}

#[test]
fn the_grow_refuses_what_it_cannot_do() {
    let dir = tempfile::tempdir().unwrap();
    let big = 2048 * MIB;
    let p = enlarged(disk(dir.path(), "refuse", 512, 1024 * MIB), big);
    let mut f = open_rw(&p);
    let e = grow_last(&mut f, big, 512, "STATE").unwrap_err();
    assert!(e.to_string().contains("not the last"), "{e}");
    let e = grow_last(&mut f, big, 512, "NOPE").unwrap_err();
    assert!(e.to_string().contains("no GPT entry"), "{e}");
    // A disk smaller than the table: neither copy fits it.
    let e = format!(
        "{:#}",
        grow_last(&mut f, 512 * MIB, 512, "EPHEMERAL").unwrap_err()
    );
    assert!(e.contains("usable sectors"), "{e}");
}

/// A new table written over a blank disk (an install in place writes it
/// last), cut before each of its writes: the disk shows no table, or the
/// whole new one (from the backup until the primary is in), never another.
#[test]
fn a_new_table_cut_at_every_write_is_absent_or_whole() {
    crate::device::each_loss(a_new_table_cut_at_every_write_is_absent_or_whole_under_loss);
}

fn a_new_table_cut_at_every_write_is_absent_or_whole_under_loss(loss: crate::device::Loss) {
    let dir = tempfile::tempdir().unwrap();
    for sector in SECTOR_SIZES {
        let bytes = 1024 * MIB;
        let want = table(&disk(dir.path(), "whole", sector, bytes), sector).partitions;
        let blank = |name: &str| {
            let p = dir.path().join(name);
            File::create(&p).unwrap().set_len(bytes).unwrap();
            p
        };
        let mut count = Faulty::counting(open_rw(&blank("count")));
        let parts = layout(bytes, sector);
        write_new(&mut count, bytes, sector, Guid::from_u128(0xD15C), &parts).unwrap();
        assert_eq!(count.writes(), 5);
        for n in 1..=5 {
            let p = blank(&format!("cut-{sector}-{n}"));
            let mut f = Faulty::failing_at(open_rw(&p), n);
            assert!(write_new(&mut f, bytes, sector, Guid::from_u128(0xD15C), &parts).is_err());
            match read_at(&mut File::open(&p).unwrap(), bytes, sector) {
                Err(_) => assert!(n <= 2, "{sector}: cut {n}: no table"),
                Ok(t) => {
                    assert!(n >= 3, "{sector}: cut {n}");
                    assert_eq!(t.partitions, want, "{sector}: cut {n}");
                    let from = if n <= 4 {
                        TableCopy::Backup
                    } else {
                        TableCopy::Primary
                    };
                    // A cut that loses unsynced writes may take the
                    // primary's with it: the backup, synced, is the table.
                    let lossy = loss != crate::device::Loss::None && t.source == TableCopy::Backup;
                    assert!(t.source == from || lossy, "{sector}: cut {n}");
                }
            }
        }
    }
}

/// The disk GUID and each partition's unique GUID as sfdisk reads them
/// (512-byte sectors only: sfdisk reads plain files at 512).
fn sfdisk_guids(path: &Path) -> (String, Vec<(String, String)>) {
    let text = output(
        Command::new(tool("sfdisk")).arg("--dump").arg(path),
        "sfdisk refused the table",
    );
    let id = text
        .lines()
        .find_map(|l| l.strip_prefix("label-id: "))
        .unwrap_or_default()
        .to_lowercase();
    let parts = text
        .lines()
        .filter(|l| l.contains(" : start="))
        .map(|l| {
            let field = |k: &str| {
                l.split(',')
                    .find_map(|f| {
                        f.trim()
                            .split_once('=')
                            .filter(|(n, _)| n.trim().ends_with(k))
                    })
                    .map(|(_, v)| v.trim().trim_matches('"').to_string())
                    .unwrap_or_default()
            };
            (field("name"), field("uuid").to_lowercase())
        })
        .collect();
    (id, parts)
}

/// What stage 2 does at each boot of a disk: the grow, which moves the
/// backup to the disk's end and rewrites a primary table that only its
/// backup could replace; then a disk still carrying a derived (the
/// image's own) GUID gets `fresh`. Returns how many writes it made.
fn boot_once(p: &Path, bytes: u64, sector: u64, fresh: Guid) -> u64 {
    let mut f = Faulty::counting(open_rw(p));
    grow_last(&mut f, bytes, sector, "EPHEMERAL").unwrap();
    if contract::guid::is_derived(table(p, sector).disk_guid) {
        reidentify(&mut f, bytes, sector, fresh).unwrap();
    }
    f.writes()
}

fn reidentify_cut_at_every_write(sector: u64, loss: crate::device::Loss) {
    let dir = tempfile::tempdir().unwrap();
    let bytes = 1024 * MIB;
    let image_guid = contract::guid::disk_guid("metal 0.1.0 test");
    let fresh = |name: &str| {
        let p = disk(dir.path(), name, sector, bytes);
        // disk() writes a random-looking GUID: give it the image's own.
        let mut f = open_rw(&p);
        reidentify(&mut f, bytes, sector, image_guid).unwrap();
        p
    };
    let before = table(&fresh("before"), sector);
    assert!(contract::guid::is_derived(before.disk_guid));
    let new = contract::guid::installed([7; 16]);
    // The whole change, counted.
    let p = fresh("whole");
    let mut f = Faulty::counting(open_rw(&p));
    assert_eq!(reidentify(&mut f, bytes, sector, new).unwrap(), image_guid);
    assert_eq!(
        f.writes(),
        4,
        "backup entries and header, primary entries and header"
    );
    drop(f);
    let t = table(&p, sector);
    assert_eq!((t.source, t.disk_guid), (TableCopy::Primary, new));
    for (a, b) in t.partitions.iter().zip(&before.partitions) {
        assert_eq!(a.unique_guid, contract::guid::partition_guid(new, &a.label));
        assert_ne!(a.unique_guid, b.unique_guid, "{}", a.label);
        assert_eq!(
            (a.first_lba, a.last_lba, &a.label, a.type_guid),
            (b.first_lba, b.last_lba, &b.label, b.type_guid)
        );
    }
    let total = bytes / sector;
    let b = read_copy(&mut File::open(&p).unwrap(), sector, bytes, total - 1).unwrap();
    assert_eq!(
        (b.disk_guid, &b.partitions),
        (new, &t.partitions),
        "the backup"
    );
    assert_eq!(libfdisk(&p, sector), ours(&t));
    if sector == 512 {
        // sfdisk, independently: the new disk GUID and partition GUIDs.
        let (id, parts) = sfdisk_guids(&p);
        assert_eq!(id, new.hyphenated().to_string());
        for (name, uuid) in parts {
            assert_eq!(
                uuid,
                contract::guid::partition_guid(new, &name)
                    .hyphenated()
                    .to_string(),
                "{name}"
            );
        }
    }
    for n in 1..=4 {
        let p = fresh(&format!("cut-{n}"));
        let mut f = Faulty::failing_at(open_rw(&p), n);
        assert!(reidentify(&mut f, bytes, sector, new).is_err(), "cut {n}");
        drop(f);
        let t = table(&p, sector);
        // Until the primary header is written the old primary is whole;
        // with its new array but not its header the new backup is the table.
        let expect = match n {
            1..=3 => (TableCopy::Primary, image_guid),
            _ => (TableCopy::Backup, new),
        };
        let lossy_ok = loss != crate::device::Loss::None
            && [(TableCopy::Primary, image_guid), (TableCopy::Backup, new)]
                .contains(&(t.source, t.disk_guid));
        assert!(
            (t.source, t.disk_guid) == expect || lossy_ok,
            "cut {n}: {:?}",
            (t.source, t.disk_guid)
        );
        assert_eq!(ours(&t), ours(&before), "cut {n}: the layout");
        assert_eq!(libfdisk(&p, sector), ours(&t), "cut {n}");
        // The next boot finishes: its own GUIDs in both copies, the
        // primary read; the boot after changes nothing.
        let other = contract::guid::installed([9; 16]);
        boot_once(&p, bytes, sector, other);
        let t = table(&p, sector);
        assert_eq!(t.source, TableCopy::Primary, "cut {n}");
        assert!(
            t.disk_guid == new || t.disk_guid == other,
            "cut {n}: {}",
            t.disk_guid
        );
        for q in &t.partitions {
            assert_eq!(
                q.unique_guid,
                contract::guid::partition_guid(t.disk_guid, &q.label)
            );
        }
        let b = read_copy(&mut File::open(&p).unwrap(), sector, bytes, total - 1).unwrap();
        assert_eq!(
            (b.disk_guid, &b.partitions),
            (t.disk_guid, &t.partitions),
            "cut {n}"
        );
        assert_eq!(
            boot_once(&p, bytes, sector, contract::guid::installed([11; 16])),
            0,
            "cut {n}: a later boot wrote"
        );
    }
}

#[test]
fn the_guid_change_cut_at_every_write_512() {
    crate::device::each_loss(|loss| reidentify_cut_at_every_write(512, loss));
}

#[test]
fn the_guid_change_cut_at_every_write_4096() {
    crate::device::each_loss(|loss| reidentify_cut_at_every_write(4096, loss));
}

/// On a disk larger than its image, the first boot grows before it changes
/// the GUIDs: a cut anywhere in the change leaves the primary table whole
/// or, when it cut between the primary's entries and header, a whole table
/// at the disk's last sector, where firmware and Linux look for the backup
/// when the primary fails (they do not follow a damaged primary's pointer).
#[test]
fn the_guid_change_comes_after_the_grow_so_its_backup_is_at_the_disks_end() {
    for sector in [512, 4096] {
        let dir = tempfile::tempdir().unwrap();
        let small = 1024 * MIB;
        let big = 2048 * MIB;
        let total = big / sector;
        let image_guid = contract::guid::disk_guid("metal 0.1.0 test");
        let fresh = |name: &str| {
            let p = disk(dir.path(), name, sector, small);
            reidentify(&mut open_rw(&p), small, sector, image_guid).unwrap();
            enlarged(p, big)
        };
        // The whole first boot, counted: the grow's writes, then the change's.
        let whole = fresh("whole");
        assert_eq!(
            boot_once(&whole, big, sector, contract::guid::installed([1; 16])),
            9
        );
        for n in 6..=9 {
            let p = fresh(&format!("cut-{n}"));
            let mut f = Faulty::failing_at(open_rw(&p), n);
            grow_last(&mut f, big, sector, "EPHEMERAL").unwrap();
            assert!(
                reidentify(&mut f, big, sector, contract::guid::installed([2; 16])).is_err(),
                "{sector}: cut {n}"
            );
            drop(f);
            // The primary whole, or else a whole backup at the last sector.
            let t = table(&p, sector);
            if t.source == TableCopy::Backup {
                let b = read_copy(&mut File::open(&p).unwrap(), sector, big, total - 1)
                    .unwrap_or_else(|e| {
                        panic!("{sector}: cut {n}: no table at the last sector: {e:#}")
                    });
                assert_eq!(ours(&b), ours(&t), "{sector}: cut {n}");
            }
            assert!(
                n == 9 || t.source == TableCopy::Primary,
                "{sector}: cut {n}"
            );
            boot_once(&p, big, sector, contract::guid::installed([3; 16]));
            let t = table(&p, sector);
            assert_eq!(t.source, TableCopy::Primary, "{sector}: cut {n}");
            assert!(
                !contract::guid::is_derived(t.disk_guid),
                "{sector}: cut {n}"
            );
        }
    }
}
