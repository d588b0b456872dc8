//! Disk images checked with the reference tools: sfdisk/fdisk for the table,
//! fsck.fat for the filesystems.

use super::testutil::{extract, patch_gpt_entry, run, tool};
use super::*;
use contract::guid::{disk_guid, partition_guid};
use contract::meta::Meta;
use contract::partition::{MIB, SECTOR_SIZES};
use contract::{LAYOUT, PartitionRole};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::process::Command;

const EPOCH: u64 = 1_700_000_000;
const DISK: u64 = 1024 * MIB;

fn guid() -> Guid {
    disk_guid("test 1.0.0 abc")
}

fn esp() -> Vec<FatFile> {
    vec![
        FatFile::bytes("loader/loader.conf", contract::boot::loader_conf()),
        FatFile::bytes("EFI/BOOT/BOOTX64.EFI", vec![0x4d; 150_000]),
    ]
}

fn boot(dir: &Path) -> Vec<FatFile> {
    let kernel = dir.join("kernel");
    std::fs::write(
        &kernel,
        (0..3_000_000u32).map(|i| i as u8).collect::<Vec<_>>(),
    )
    .unwrap();
    vec![
        FatFile::file("A/vmlinuz-0123456789abcdef", kernel),
        FatFile::bytes("loader/entries/slot-a.conf", "title x\nlinux /A/vmlinuz\n"),
    ]
}

fn meta() -> Meta {
    let mut m = Meta::default();
    m.set(contract::meta::Tag::DefaultSlot, "A");
    m
}

/// Writes a test image as the build and `imager install` do
/// ([`crate::boot::write_raw_image`]): both FATs filled, META written.
fn image(dir: &Path, name: &str, sector_size: u64) -> (PathBuf, Layout) {
    let layout = Layout::new(DISK, sector_size, &BTreeMap::new()).unwrap();
    let dest = dir.join(name);
    crate::boot::write_raw_image(
        &dest,
        crate::boot::DiskTarget::NewImage,
        &layout,
        guid(),
        esp(),
        boot(dir),
        &meta(),
        None,
        EPOCH,
    )
    .unwrap();
    (dest, layout)
}

fn fsck(img: &Path, layout: &Layout, role: PartitionRole, dir: &Path) -> String {
    let p = layout.get(role);
    let part = dir.join(format!("{}.fat", p.label()));
    extract(img, p.offset(), p.len(), &part);
    let out = run(Command::new(tool("fsck.fat"))
        .arg("-n")
        .arg("-v")
        .arg(&part));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(!text.contains("Warning"), "{}: {text}", p.label());
    assert!(!text.contains("uninitialized"), "{}: {text}", p.label());
    std::fs::remove_file(&part).unwrap();
    text
}

#[test]
fn sfdisk_reads_512_byte_sector_table() {
    let dir = tempfile::tempdir().unwrap();
    let (img, layout) = image(dir.path(), "disk.raw", 512);
    let out = run(Command::new(tool("sfdisk")).arg("--json").arg(&img));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let t = &v["partitiontable"];
    assert_eq!(t["label"], "gpt");
    assert_eq!(t["id"], guid().hyphenated().to_string().to_uppercase());
    assert_eq!(t["sectorsize"], 512);
    assert_eq!(t["firstlba"], 34);
    assert_eq!(t["lastlba"], DISK / 512 - 34);
    let parts = t["partitions"].as_array().unwrap();
    assert_eq!(parts.len(), LAYOUT.len());
    for ((p, spec), placed) in parts.iter().zip(&LAYOUT).zip(&layout.partitions) {
        assert_eq!(p["name"], spec.label);
        let upper = |g: Guid| g.hyphenated().to_string().to_uppercase();
        assert_eq!(p["type"], upper(spec.type_guid));
        assert_eq!(p["uuid"], upper(partition_guid(guid(), spec.label)));
        assert_eq!(p["start"], placed.first_lba);
        assert_eq!(p["size"], placed.last_lba + 1 - placed.first_lba);
    }
    // Both headers and arrays check out.
    let verify = run(Command::new(tool("sfdisk")).arg("--verify").arg(&img));
    let text = String::from_utf8_lossy(&verify.stdout);
    assert!(text.contains("No errors detected"), "{text}");
}

/// sfdisk 2.38 takes the sector size from the device, 512 for a file, and
/// has no option to change it: fdisk has (`-b`).
#[test]
fn fdisk_reads_4096_byte_sector_table() {
    let dir = tempfile::tempdir().unwrap();
    let (img, layout) = image(dir.path(), "disk.raw", 4096);
    let out = run(Command::new(tool("fdisk"))
        .args(["-b", "4096", "-l", "-o", "Start,End,Type-UUID,UUID,Name"])
        .arg(&img));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(!text.to_lowercase().contains("corrupt"), "{text}");
    assert!(
        text.contains("Sector size (logical/physical): 4096 bytes"),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "Disk identifier: {}",
            guid().hyphenated().to_string().to_uppercase()
        )),
        "{text}"
    );
    let rows: Vec<Vec<&str>> = text
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("Start"))
        .skip(1)
        .map(|l| l.split_whitespace().collect())
        .filter(|r: &Vec<&str>| r.len() == 5)
        .collect();
    assert_eq!(rows.len(), LAYOUT.len(), "{text}");
    for ((r, spec), placed) in rows.iter().zip(&LAYOUT).zip(&layout.partitions) {
        let upper = |g: Guid| g.hyphenated().to_string().to_uppercase();
        assert_eq!(r[0], placed.first_lba.to_string());
        assert_eq!(r[1], placed.last_lba.to_string());
        // At 4096-byte sectors BOOT is the ESP and EFI is Linux reserved.
        let want = match spec.label {
            "EFI" => contract::guid::LINUX_RESERVED,
            "BOOT" => contract::guid::EFI_SYSTEM,
            _ => spec.type_guid,
        };
        assert_eq!(r[2], upper(want));
        assert_eq!(r[3], upper(partition_guid(guid(), spec.label)));
        assert_eq!(r[4], spec.label);
    }
}

#[test]
fn tables_read_back_and_filesystems_are_clean() {
    let dir = tempfile::tempdir().unwrap();
    for ss in SECTOR_SIZES {
        let (img, layout) = image(dir.path(), &format!("disk-{ss}.raw"), ss);
        let t = read_table(&img).unwrap();
        assert_eq!(t.sector_size, ss);
        assert_eq!(t.disk_size, DISK);
        assert_eq!(t.disk_guid, guid());
        assert_eq!(t.partitions.len(), LAYOUT.len());
        for (tp, p) in t.partitions.iter().zip(&layout.partitions) {
            assert_eq!(tp.label, p.label());
            assert_eq!(tp.type_guid, p.type_guid());
            assert_eq!(tp.unique_guid, partition_guid(guid(), p.label()));
            assert_eq!((tp.first_lba, tp.last_lba), (p.first_lba, p.last_lba));
            assert_eq!(tp.range(ss), (p.offset(), p.len()));
        }

        fsck(&img, &layout, PartitionRole::Boot, dir.path());
        let boot_files = list_files(open_partition(&img, "BOOT").unwrap()).unwrap();
        let conf = if ss == 512 {
            // systemd-boot on EFI, the slots on BOOT (XBOOTLDR).
            let efi = fsck(&img, &layout, PartitionRole::Efi, dir.path());
            assert!(efi.contains("32 bit entries"), "{efi}");
            let esp_files = list_files(open_partition(&img, "EFI").unwrap()).unwrap();
            assert_eq!(esp_files, ["EFI/BOOT/BOOTX64.EFI", "loader/loader.conf"]);
            assert_eq!(
                boot_files,
                ["A/vmlinuz-0123456789abcdef", "loader/entries/slot-a.conf"]
            );
            read_file(open_partition(&img, "EFI").unwrap(), "loader/loader.conf").unwrap()
        } else {
            // At 4096-byte sectors BOOT is the ESP and carries both; EFI
            // holds nothing (contract::partition::esp_role).
            let mut efi = open_partition(&img, "EFI").unwrap();
            let mut head = vec![0u8; 1 << 20];
            std::io::Read::read_exact(&mut efi, &mut head).unwrap();
            assert!(head.iter().all(|&b| b == 0), "EFI is not empty at 4096");
            assert_eq!(
                boot_files,
                [
                    "A/vmlinuz-0123456789abcdef",
                    "EFI/BOOT/BOOTX64.EFI",
                    "loader/entries/slot-a.conf",
                    "loader/loader.conf"
                ]
            );
            read_file(open_partition(&img, "BOOT").unwrap(), "loader/loader.conf").unwrap()
        };
        assert_eq!(conf, contract::boot::loader_conf().as_bytes());
        let kernel = read_file(
            open_partition(&img, "BOOT").unwrap(),
            "A/vmlinuz-0123456789abcdef",
        )
        .unwrap();
        assert_eq!(kernel, std::fs::read(dir.path().join("kernel")).unwrap());

        let mut area = vec![0u8; contract::meta::AREA_LEN];
        open_partition(&img, "META")
            .unwrap()
            .read_exact(&mut area)
            .unwrap();
        assert_eq!(Meta::decode(&area).unwrap().0, meta());

        // Sparse: the table, two FATs and META, far below the disk size.
        let allocated = std::fs::metadata(&img).unwrap().blocks() * 512;
        assert!(allocated < 16 * MIB, "{allocated} bytes allocated");
    }
}

#[test]
fn same_inputs_give_identical_disks() {
    let dir = tempfile::tempdir().unwrap();
    for ss in SECTOR_SIZES {
        let (a, _) = image(dir.path(), "a.raw", ss);
        let (b, _) = image(dir.path(), "b.raw", ss);
        let (mut fa, mut fb) = (File::open(&a).unwrap(), File::open(&b).unwrap());
        let (mut ba, mut bb) = (vec![0u8; 4 << 20], vec![0u8; 4 << 20]);
        loop {
            let n = fa.read(&mut ba).unwrap();
            fb.read_exact(&mut bb[..n]).unwrap();
            assert!(ba[..n] == bb[..n], "disks differ at {ss}-byte sectors");
            if n == 0 {
                break;
            }
        }
    }
}

#[test]
fn failed_fill_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let layout = Layout::new(DISK, 512, &BTreeMap::new()).unwrap();
    let dest = dir.path().join("disk.raw");
    let e = write_disk(&dest, &layout, guid(), None, |p, _| {
        anyhow::ensure!(p.role() != PartitionRole::Boot, "no kernel");
        Ok(())
    })
    .unwrap_err();
    assert_eq!(format!("{e:#}"), "filling partition BOOT: no kernel");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn not_a_gpt_disk() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("zero.raw");
    std::fs::write(&p, vec![0u8; 1 << 20]).unwrap();
    let e = format!("{:#}", read_table(&p).unwrap_err());
    assert!(e.contains("not a GPT disk image"), "{e}");
}

/// A disk image of `DISK` bytes at 512-byte sectors whose table has the
/// entries `parts` (label, type, first and last LBA), as `write_new` writes
/// any table the reader accepts.
fn crafted(dir: &Path, name: &str, parts: &[(&str, Guid, u64, u64)]) -> PathBuf {
    let path = dir.join(name);
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    f.set_len(DISK).unwrap();
    let new: Vec<_> = parts
        .iter()
        .map(
            |(label, type_guid, first, last)| bootstate::gpt::NewPartition {
                label,
                type_guid: *type_guid,
                unique_guid: partition_guid(guid(), label),
                first_lba: *first,
                last_lba: *last,
            },
        )
        .collect();
    bootstate::gpt::write_new(&mut f, DISK, 512, guid(), &new).unwrap();
    path
}

/// The entries of `layout` as (label, type, first, last).
fn entries(layout: &Layout) -> Vec<(&'static str, Guid, u64, u64)> {
    layout
        .partitions
        .iter()
        .map(|p| (p.label(), p.spec.type_guid, p.first_lba, p.last_lba))
        .collect()
}

fn check_error(path: &Path) -> String {
    format!("{:#}", check_image(path).unwrap_err())
}

#[test]
fn written_tables_pass_the_check_and_match_their_layout() {
    let dir = tempfile::tempdir().unwrap();
    for ss in SECTOR_SIZES {
        let (img, layout) = image(dir.path(), &format!("disk-{ss}.raw"), ss);
        check_image(&img).unwrap();
        if ss == 512 {
            // Boot code in the MBR that does not load GRUB's core image
            // from the BIOS partition: refused.
            let mut bytes = std::fs::read(&img).unwrap();
            bytes[..0x60].fill(0x90);
            let copy = dir.path().join("code.raw");
            std::fs::write(&copy, &bytes).unwrap();
            let e = check_error(&copy);
            assert!(e.contains("the MBR's boot code loads LBA"), "{e}");
            std::fs::remove_file(&copy).unwrap();
        }
        let table = read_table(&img).unwrap();
        check_written(&table, &layout, guid()).unwrap();
        // Another layout of the same disk is not what was written.
        let other = Layout::new(
            DISK,
            ss,
            &BTreeMap::from([("STATE".to_string(), 200 * MIB)]),
        )
        .unwrap();
        let e = format!("{:#}", check_written(&table, &other, guid()).unwrap_err());
        assert!(e.contains("partition STATE reads as LBA"), "{e}");
        let e = format!(
            "{:#}",
            check_written(&table, &layout, disk_guid("other")).unwrap_err()
        );
        assert!(e.contains("with GUID"), "{e}");
    }
}

#[test]
fn tables_that_are_not_our_layout_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let layout = Layout::new(DISK, 512, &BTreeMap::new()).unwrap();
    let good = entries(&layout);
    // The layout's own entries pass.
    check_image(&crafted(dir.path(), "good.raw", &good)).unwrap();

    let mut missing = good.clone();
    missing.pop();
    let e = check_error(&crafted(dir.path(), "missing.raw", &missing));
    assert!(
        e.contains("the partitions are [\"EFI\", \"BIOS\", \"BOOT\", \"META\", \"STATE\"]"),
        "{e}"
    );

    let mut swapped = good.clone();
    swapped.swap(1, 2);
    let e = check_error(&crafted(dir.path(), "swapped.raw", &swapped));
    assert!(e.contains("a disk made by imager has"), "{e}");

    // In entry order, but BIOS placed after BOOT on the disk.
    let mut moved = good.clone();
    let (bios, boot) = (moved[1], moved[2]);
    let boot_len = boot.3 - boot.2;
    moved[2].2 = bios.2;
    moved[2].3 = bios.2 + boot_len;
    moved[1].2 = moved[2].3 + 1;
    moved[1].3 = moved[1].2 + (bios.3 - bios.2);
    let e = check_error(&crafted(dir.path(), "moved.raw", &moved));
    assert!(
        e.contains("partition BOOT starts at LBA") && e.contains("not after the partition before"),
        "{e}"
    );

    let mut unaligned = good.clone();
    unaligned[4].2 += 1;
    let e = check_error(&crafted(dir.path(), "unaligned.raw", &unaligned));
    assert!(
        e.contains("partition STATE (offset") && e.contains("not on whole 1 MiB"),
        "{e}"
    );

    let mut typed = good.clone();
    typed[0].1 = contract::guid::LINUX_DATA;
    let e = check_error(&crafted(dir.path(), "typed.raw", &typed));
    assert!(e.contains("partition EFI has type"), "{e}");

    let mut small = good.clone();
    small[5].3 = small[5].2 + 100 * MIB / 512 - 1;
    let e = check_error(&crafted(dir.path(), "small.raw", &small));
    assert!(
        e.contains("partition EPHEMERAL of 100 MiB is smaller than its minimum 300 MiB"),
        "{e}"
    );
}

#[test]
fn overlapping_partitions_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (img, _) = image(dir.path(), "overlap.raw", 512);
    let t = read_table(&img).unwrap();
    let ephemeral_first = t.find("EPHEMERAL").unwrap().first_lba;
    // STATE (entry 5) now ends inside EPHEMERAL, CRCs made right.
    patch_gpt_entry(&img, 4, |e| {
        e[40..48].copy_from_slice(&(ephemeral_first + 2047).to_le_bytes())
    });
    let e = check_error(&img);
    assert!(
        e.contains("partitions 5 (\"STATE\") and 6 (\"EPHEMERAL\") overlap"),
        "{e}"
    );
}

#[test]
fn a_damaged_primary_table_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (img, _) = image(dir.path(), "damaged.raw", 512);
    let mut f = std::fs::OpenOptions::new().write(true).open(&img).unwrap();
    use std::io::{Seek, SeekFrom};
    f.seek(SeekFrom::Start(512 + 16)).unwrap();
    f.write_all(&[0xff; 4]).unwrap();
    drop(f);
    let e = check_error(&img);
    assert!(
        e.contains("the primary partition table is damaged (header CRC mismatch)"),
        "{e}"
    );
}

/// The check of a disk in another format reads the disk it holds: a
/// qcow2 through its reader, a zstd or xz stream unpacked; a sound table
/// passes in each, a table that is not our layout fails in each with the
/// raw disk's reason.
#[test]
fn the_check_reads_qcow2_zst_and_xz_as_the_disk_they_hold() {
    type Writer = fn(&Path, &Path) -> anyhow::Result<()>;
    let formats: [(&str, Writer); 3] = [
        ("qcow2", super::qcow2::write_qcow2),
        ("zst", super::compress::write_zst),
        ("xz", super::compress::write_xz),
    ];
    let dir = tempfile::tempdir().unwrap();
    let (good, _) = image(dir.path(), "good.raw", 512);
    let layout = Layout::new(DISK, 512, &BTreeMap::new()).unwrap();
    let mut swapped = entries(&layout);
    swapped.swap(0, 1);
    let bad = crafted(dir.path(), "bad.raw", &swapped);
    let want = check_error(&bad);
    for (ext, write) in formats {
        let g = dir.path().join(format!("good.{ext}"));
        write(&good, &g).unwrap();
        check_image(&g).unwrap_or_else(|e| panic!("{ext}: {e:#}"));
        let b = dir.path().join(format!("bad.{ext}"));
        write(&bad, &b).unwrap();
        let e = check_error(&b);
        assert!(e.contains(&want), "{ext}: {e}\nraw: {want}");
    }
}
