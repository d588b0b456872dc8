//! The GRUB writer on small disks: what it patches, what it keeps, what its
//! check refuses, and what a power cut before each write leaves.

use super::*;
use crate::device::Faulty;
use crate::gpt::{self, NewPartition};
use contract::Guid;
use contract::guid::{BIOS_BOOT, EFI_SYSTEM, XBOOTLDR};
use contract::le::read_u32;
use contract::partition::MIB;
use std::io::Cursor;

const DISK: u64 = 8 * MIB;
const BIOS_LBA: u64 = 2 * MIB / 512;

/// A boot.img stand-in: code bytes everywhere, the boot signature, and
/// boot.S's defaults at the patched offsets.
fn boot_img() -> Vec<u8> {
    let mut b: Vec<u8> = (0..SECTOR).map(|i| (i * 7 + 3) as u8).collect();
    b[KERNEL_SECTOR..KERNEL_SECTOR + 8].copy_from_slice(&1u64.to_le_bytes());
    b[BOOT_DRIVE] = 0xFF;
    b[DRIVE_CHECK..DRIVE_CHECK + 2].copy_from_slice(&[0xEB, 0x05]);
    b[SECTOR - 2..].copy_from_slice(&[0x55, 0xAA]);
    b
}

/// A core.img stand-in of `sectors` sectors (the last one short, as
/// grub-mkimage leaves it), its blocklist as grub-mkimage leaves it.
fn core_img(sectors: usize) -> Vec<u8> {
    let mut c: Vec<u8> = (0..sectors * SECTOR - 100)
        .map(|i| (i % 251) as u8 | 1)
        .collect();
    c[FIRST_LIST - LIST_SIZE..SECTOR].fill(0);
    c[FIRST_LIST..FIRST_LIST + 8].copy_from_slice(&2u64.to_le_bytes());
    c[FIRST_LIST + 8..FIRST_LIST + 10].copy_from_slice(&(sectors as u16 - 1).to_le_bytes());
    c[FIRST_LIST + 10..SECTOR].copy_from_slice(&FIRST_SEGMENT.to_le_bytes());
    c
}

fn grub(sectors: usize) -> Grub {
    Grub::new(&boot_img(), &core_img(sectors)).unwrap()
}

/// An 8 MiB disk: EFI at 1 MiB (its first MiB marked), BIOS at 2 MiB of
/// `bios_sectors`, BOOT after it; a disk signature in the MBR.
fn disk(bios_sectors: u64) -> Cursor<Vec<u8>> {
    let mut d = Cursor::new(vec![0u8; DISK as usize]);
    let parts = [
        NewPartition {
            label: "EFI",
            type_guid: EFI_SYSTEM,
            unique_guid: Guid::from_u128(1),
            first_lba: MIB / 512,
            last_lba: BIOS_LBA - 1,
        },
        NewPartition {
            label: "BIOS",
            type_guid: BIOS_BOOT,
            unique_guid: Guid::from_u128(2),
            first_lba: BIOS_LBA,
            last_lba: BIOS_LBA + bios_sectors - 1,
        },
        NewPartition {
            label: "BOOT",
            type_guid: XBOOTLDR,
            unique_guid: Guid::from_u128(3),
            first_lba: 4 * MIB / 512,
            last_lba: 6 * MIB / 512 - 1,
        },
    ];
    gpt::write_new(&mut d, DISK, 512, Guid::from_u128(0xD15C), &parts).unwrap();
    d.get_mut()[MIB as usize..2 * MIB as usize].fill(0xE5);
    d.get_mut()[WINDOWS_NT_MAGIC..WINDOWS_NT_MAGIC + 4].copy_from_slice(&[0xDE, 0xAD, 0xBE, 0xEF]);
    d
}

fn table(d: &mut Cursor<Vec<u8>>) -> Table {
    gpt::read(d, DISK).unwrap()
}

#[test]
fn writes_and_patches_what_grub_bios_setup_patches() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("disk.raw");
    std::fs::write(&path, disk(2048).into_inner()).unwrap();
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    let t = gpt::read(&mut f, DISK).unwrap();
    let before = std::fs::read(&path).unwrap();
    let g = grub(5);
    write(&mut f, &t, &g, false).unwrap();
    drop(f);
    let after = std::fs::read(&path).unwrap();

    let m = &after[..SECTOR];
    let b = boot_img();
    // boot.img's code but for the patched fields.
    for i in 0..WINDOWS_NT_MAGIC {
        let patched = (KERNEL_SECTOR..KERNEL_SECTOR + 8).contains(&i)
            || i == BOOT_DRIVE
            || (DRIVE_CHECK..DRIVE_CHECK + 2).contains(&i);
        if !patched {
            assert_eq!(m[i], b[i], "byte {i:#x}");
        }
    }
    assert_eq!(read_u64(m, KERNEL_SECTOR), Some(BIOS_LBA));
    assert_eq!(m[BOOT_DRIVE], 0xFF);
    assert_eq!(&m[DRIVE_CHECK..DRIVE_CHECK + 2], &[0x90, 0x90]);
    // The disk signature and the protective MBR's table are kept.
    assert_eq!(&m[WINDOWS_NT_MAGIC..], &before[WINDOWS_NT_MAGIC..SECTOR]);
    assert_eq!(
        &m[WINDOWS_NT_MAGIC..WINDOWS_NT_MAGIC + 4],
        &[0xDE, 0xAD, 0xBE, 0xEF]
    );
    assert_eq!(m[PART_START], 0, "no boot flag unless asked");

    // core.img in the BIOS partition, its blocklist pointing to itself.
    let at = (BIOS_LBA * 512) as usize;
    let core = &after[at..at + 5 * SECTOR];
    assert_eq!(list_at(core, FIRST_LIST), (BIOS_LBA + 1, 4, 0x820));
    assert_eq!(&core[FIRST_LIST - LIST_SIZE..FIRST_LIST], &[0u8; LIST_SIZE]);
    let c = core_img(5);
    assert_eq!(
        &core[..FIRST_LIST - LIST_SIZE],
        &c[..FIRST_LIST - LIST_SIZE]
    );
    assert_eq!(&core[SECTOR..c.len()], &c[SECTOR..]);
    assert!(core[c.len()..].iter().all(|&x| x == 0), "padded with zeros");

    // Nothing else changed: the GPT reads the same, the ESP is untouched.
    let changed: Vec<usize> = (0..before.len())
        .filter(|&i| before[i] != after[i])
        .collect();
    assert!(
        changed
            .iter()
            .all(|&i| i < WINDOWS_NT_MAGIC || (at..at + 5 * SECTOR).contains(&i)),
        "bytes changed outside the MBR code and core.img"
    );
    let mut c = Cursor::new(after);
    assert_eq!(table(&mut c), t);
    assert_eq!(
        inspect(&mut c, &t).unwrap(),
        Installed::Grub {
            core_sectors: 5,
            active: false
        }
    );
}

#[test]
fn boot_flag_and_rewrite() {
    let mut d = disk(2048);
    let t = table(&mut d);
    assert_eq!(inspect(&mut d, &t).unwrap(), Installed::None);
    write(&mut d, &t, &grub(3), true).unwrap();
    assert_eq!(d.get_ref()[PART_START], ACTIVE);
    assert_eq!(
        inspect(&mut d, &t).unwrap(),
        Installed::Grub {
            core_sectors: 3,
            active: true
        }
    );
    // Written again (a larger core, flag cleared): the new one, whole.
    write(&mut d, &t, &grub(7), false).unwrap();
    check(&mut d, &t, &grub(7), false).unwrap();
    assert_eq!(d.get_ref()[PART_START], 0);
    assert!(check(&mut d, &t, &grub(3), false).is_err());
    assert!(check(&mut d, &t, &grub(7), true).is_err());
}

#[test]
fn check_refuses_a_wrong_pointer_or_blocklist() {
    let g = grub(4);
    let mut good = disk(2048);
    let t = table(&mut good);
    write(&mut good, &t, &g, false).unwrap();
    let core_at = (BIOS_LBA * 512) as usize;
    let cases: [(&str, usize, &[u8], &str); 6] = [
        ("kernel sector", KERNEL_SECTOR, &[7], "loads LBA"),
        ("boot drive", BOOT_DRIVE, &[0x80], "from drive 0x80"),
        (
            "drive check",
            DRIVE_CHECK,
            &[0xEB, 0x05],
            "boot-drive check",
        ),
        (
            "blocklist start",
            core_at + FIRST_LIST,
            &[9],
            "blocklist loads",
        ),
        (
            "blocklist length",
            core_at + FIRST_LIST + 8,
            &[0xFF, 0x7F],
            "blocklist loads",
        ),
        (
            "terminator",
            core_at + FIRST_LIST - 4,
            &[1],
            "no terminator",
        ),
    ];
    for (what, at, bytes, msg) in cases {
        let mut d = good.clone();
        d.get_mut()[at..at + bytes.len()].copy_from_slice(bytes);
        let e = format!("{:#}", check(&mut d, &t, &g, false).unwrap_err());
        assert!(e.contains(msg), "{what}: {e}");
        assert!(inspect(&mut d, &t).is_err(), "{what}");
    }
    // Code or core bytes changed elsewhere: inspect passes, check does not.
    for at in [0x70, core_at + 3 * SECTOR] {
        let mut d = good.clone();
        d.get_mut()[at] ^= 0xFF;
        assert!(inspect(&mut d, &t).is_ok());
        assert!(check(&mut d, &t, &g, false).is_err(), "byte {at:#x}");
    }
}

#[test]
fn bad_input_is_refused_before_any_write() {
    // core.img larger than the BIOS partition.
    let mut d = disk(4);
    let before = d.get_ref().clone();
    let t = table(&mut d);
    let e = format!("{:#}", write(&mut d, &t, &grub(5), false).unwrap_err());
    assert!(
        e.contains("BIOS partition (4 sectors, 2048 bytes) is too small"),
        "{e}"
    );
    assert!(*d.get_ref() == before, "nothing written");

    // Over GRUB's limit for a core loaded by blocklist.
    let e = format!(
        "{:#}",
        Grub::new(&boot_img(), &core_img(MAX_CORE_SECTORS as usize + 1)).unwrap_err()
    );
    assert!(e.contains("GRUB loads at most 888 sectors"), "{e}");
    Grub::new(&boot_img(), &core_img(MAX_CORE_SECTORS as usize)).unwrap();
    // Not GRUB's images.
    assert!(Grub::new(&boot_img()[..500], &core_img(3)).is_err());
    let mut b = boot_img();
    b[511] = 0;
    assert!(Grub::new(&b, &core_img(3)).is_err());
    assert!(Grub::new(&boot_img(), &core_img(3)[..SECTOR]).is_err());
    let mut c = core_img(3);
    c[FIRST_LIST + 8] = 5;
    let e = format!("{:#}", Grub::new(&boot_img(), &c).unwrap_err());
    assert!(e.contains("not an i386-pc core image"), "{e}");

    // No protective MBR.
    let mut d = disk(2048);
    let t = table(&mut d);
    d.get_mut()[PART_START + 4] = 0x83;
    let before = d.get_ref().clone();
    let e = format!("{:#}", write(&mut d, &t, &grub(3), false).unwrap_err());
    assert!(e.contains("no protective MBR"), "{e}");
    assert!(*d.get_ref() == before, "nothing written");

    // 4096-byte sectors.
    let mut t4 = table(&mut disk(2048));
    t4.sector_size = 4096;
    let e = format!("{:#}", check_fits(&t4, &grub(3)).unwrap_err());
    assert!(e.contains("BIOS boot needs 512-byte sectors"), "{e}");
}

/// A power cut before each write: the disk is without GRUB or has all of
/// it, and what UEFI reads (the GPT, the ESP) is never touched.
#[test]
fn power_cut_before_each_write() {
    crate::device::each_loss(|_| power_cut_before_each_write_under_loss());
}

fn power_cut_before_each_write_under_loss() {
    let g = grub(6);
    let mut clean = disk(2048);
    let t = table(&mut clean);
    let mut counting = Faulty::counting(clean.clone());
    write(&mut counting, &t, &g, true).unwrap();
    let writes = counting.writes();
    assert_eq!(writes, 2, "core.img, then the MBR");
    for n in 1..=writes + 1 {
        let mut f = Faulty::failing_at(clean.clone(), n);
        let r = write(&mut f, &t, &g, true);
        assert_eq!(r.is_ok(), n > writes, "cut before write {n}");
        let mut d = f.into_inner();
        assert_eq!(table(&mut d), t, "cut before write {n}: the GPT");
        assert_eq!(
            &d.get_ref()[MIB as usize..2 * MIB as usize],
            &clean.get_ref()[MIB as usize..2 * MIB as usize],
            "cut before write {n}: the ESP"
        );
        let (m, c) = (d.get_ref(), clean.get_ref());
        assert_eq!(
            (&m[WINDOWS_NT_MAGIC..PART_START], &m[PART_START + 1..SECTOR]),
            (&c[WINDOWS_NT_MAGIC..PART_START], &c[PART_START + 1..SECTOR]),
            "cut before write {n}: the MBR's signature and table"
        );
        let flag = if n > writes { ACTIVE } else { 0 };
        assert_eq!(m[PART_START], flag, "cut before write {n}: the boot flag");
        match inspect(&mut d, &t).unwrap() {
            Installed::None => assert!(n <= writes, "cut before write {n}"),
            Installed::Grub { .. } => check(&mut d, &t, &g, true).unwrap(),
        }
    }
}

/// The runtime's grow of the last partition rewrites the protective MBR's
/// size only: GRUB's code and the boot flag stay, and GRUB still checks.
#[test]
fn growing_the_disk_keeps_grub() {
    let g = grub(4);
    let mut d = disk(2048);
    let t = table(&mut d);
    write(&mut d, &t, &g, true).unwrap();
    let code = d.get_ref()[..WINDOWS_NT_MAGIC].to_vec();
    let bigger = 16 * MIB;
    d.get_mut().resize(bigger as usize, 0);
    let grown = gpt::grow_last(&mut d, bigger, 512, "BOOT").unwrap();
    assert!(grown.is_some());
    assert_eq!(&d.get_ref()[..WINDOWS_NT_MAGIC], &code[..]);
    assert_eq!(
        read_u32(d.get_ref(), PART_START + 12),
        Some((bigger / 512 - 1) as u32),
        "the protective entry covers the grown disk"
    );
    let t2 = gpt::read(&mut d, bigger).unwrap();
    check(&mut d, &t2, &g, true).unwrap();
}
