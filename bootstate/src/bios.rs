//! BIOS boot through GRUB 2: its `boot.img` in the MBR's code area and its
//! `core.img` in the BIOS boot partition, written and checked without
//! `grub-install` or `grub-bios-setup`, patched as `grub-bios-setup` patches
//! them (GRUB 2.06, `util/setup.c`).
//!
//! **The two pieces.** The firmware runs the 446 bytes of code in LBA 0
//! (`boot.img`, GRUB's `boot.S`). It reads one sector, the LBA at
//! [`KERNEL_SECTOR`], which is the first sector of `core.img` (`diskboot.S`),
//! and runs it; that sector reads the rest of `core.img` as its
//! **blocklist** says (12-byte entries growing down from the end of the
//! sector: start LBA, sector count, load segment), decompresses it and
//! starts GRUB's kernel with the modules embedded in it.
//!
//! **What is patched** (offsets from `include/grub/i386/pc/boot.h`):
//!
//! | where | what | value |
//! |---|---|---|
//! | MBR [`KERNEL_SECTOR`] (0x5C), u64 | core.img's first sector | the BIOS partition's first LBA |
//! | MBR [`BOOT_DRIVE`] (0x64) | drive to load from | 0xFF: the drive the BIOS booted |
//! | MBR [`DRIVE_CHECK`] (0x66), 2 bytes | `jmp` over the check of `%dl` | two NOPs (a hard disk: a BIOS that passes a bogus drive number gets 0x80) |
//! | MBR [`WINDOWS_NT_MAGIC`]..[`PART_END`] (0x1B8..0x1FE) | disk signature and partition table | kept: the protective MBR's |
//! | core.img [`FIRST_LIST`] (0x1F4): start u64, len u16, segment u16 | the rest of core.img | BIOS first LBA + 1, core sectors − 1, [`FIRST_SEGMENT`] (0x820) |
//! | core.img 0x1E8..0x1F4 | the next entry | zeros: the terminator |
//!
//! The BIOS parameter block area (0x03..0x5A) is left as `boot.img` has it:
//! `grub-bios-setup` copies it from the disk's old sector 0, which for a
//! protective MBR holds no BPB. `core.img` gets no Reed-Solomon codes
//! (`grub-install` adds them against partial overwrites of the sectors after
//! the MBR gap; the BIOS partition is ours alone).
//!
//! **Limits.** A core image loaded by blocklist must fit below 0x78000 when
//! loaded at GRUB's link address 0x9000 (`GRUB_KERNEL_I386_PC_LINK_ADDR`,
//! `include/grub/offsets.h`; `setup.c` caps the embedding at
//! `(0x78000 - GRUB_KERNEL_I386_PC_LINK_ADDR) >> 9` sectors):
//! [`MAX_CORE_SECTORS`] = 888 sectors. BIOS boot reads 512-byte sectors:
//! [`write`] refuses other sector sizes.
//!
//! **Write order** ([`write`]), on a disk whose partition table is written:
//!
//! 1. core.img into the BIOS partition (one write), *sync*;
//! 2. LBA 0: boot.img's code with the protective MBR's signature and
//!    partition table (one 512-byte write, which a disk does whole or not
//!    at all), *sync*.
//!
//! A power cut before 2 leaves the MBR without boot code: no GRUB, as
//! before. After 2 GRUB is whole. Neither write touches the GPT, the ESP or
//! anything else UEFI reads (the protective MBR's partition entry is
//! rewritten with the same bytes, but for the boot flag a profile asks
//! for). [`check`] reads both back.

use crate::device::Device;
use crate::gpt::Table;
use anyhow::{Context, Result, bail, ensure};
use contract::le::{read_u16, read_u64};
use std::io::{self, Read, Seek, SeekFrom};

/// The sector size of BIOS disk access (`GRUB_DISK_SECTOR_SIZE`).
pub const SECTOR: usize = 512;
/// Offset of the u64 LBA of core.img's first sector in boot.img
/// (`GRUB_BOOT_MACHINE_KERNEL_SECTOR`, `include/grub/i386/pc/boot.h`).
pub const KERNEL_SECTOR: usize = 0x5C;
/// Offset of the boot drive byte (`GRUB_BOOT_MACHINE_BOOT_DRIVE`).
pub const BOOT_DRIVE: usize = 0x64;
/// 0xFF at [`BOOT_DRIVE`]: load from the drive the BIOS booted (`setup.c`,
/// `write_rootdev`).
pub const BOOT_DRIVE_FROM_BIOS: u8 = 0xFF;
/// Offset of the 2-byte `jmp` that skips the boot-drive check
/// (`GRUB_BOOT_MACHINE_DRIVE_CHECK`); `setup.c` replaces it by two NOPs
/// for a hard disk.
pub const DRIVE_CHECK: usize = 0x66;
const NOP: u8 = 0x90;
/// Start of what `setup.c` copies from the old sector 0: the disk signature
/// (`GRUB_BOOT_MACHINE_WINDOWS_NT_MAGIC`)…
pub const WINDOWS_NT_MAGIC: usize = 0x1B8;
/// …up to the end of the partition table (`GRUB_BOOT_MACHINE_PART_END`).
pub const PART_END: usize = 0x1FE;
/// The protective MBR's partition entry, its boot indicator first.
pub const PART_START: usize = 0x1BE;
/// The boot indicator of an active (bootable) MBR partition.
pub const ACTIVE: u8 = 0x80;
/// The protective partition's type (`0xEE`), at its entry's offset 4.
const PROTECTIVE_TYPE: u8 = 0xEE;
/// Size of one blocklist entry (`GRUB_BOOT_MACHINE_LIST_SIZE`).
pub const LIST_SIZE: usize = 12;
/// The first (topmost) blocklist entry in core.img's first sector:
/// `struct grub_pc_bios_boot_blocklist { u64 start; u16 len; u16 segment }`
/// at the sector's end (`setup.c`: `core_img + GRUB_DISK_SECTOR_SIZE -
/// sizeof (*bl.block)`; `diskboot.S`: `firstlist`).
pub const FIRST_LIST: usize = SECTOR - LIST_SIZE;
/// The segment core.img is loaded at (`GRUB_BOOT_I386_PC_KERNEL_SEG`,
/// `include/grub/offsets.h`); its first sector goes there.
pub const KERNEL_SEG: u16 = 0x800;
/// Where the blocklist loads the second sector on: `KERNEL_SEG + (512 >> 4)`
/// (`setup.c`, `bl.current_segment`).
pub const FIRST_SEGMENT: u16 = KERNEL_SEG + (SECTOR as u16 >> 4);
/// GRUB's link address on i386-pc (`GRUB_KERNEL_I386_PC_LINK_ADDR`).
pub const LINK_ADDR: u64 = 0x9000;
/// The most sectors a core.img loaded by blocklist may have (`setup.c`).
pub const MAX_CORE_SECTORS: u64 = (0x78000 - LINK_ADDR) / SECTOR as u64;
/// Offset, in core.img's second sector, of the length not covered by
/// Reed-Solomon codes (`GRUB_KERNEL_I386_PC_NO_REED_SOLOMON_LENGTH`); 0xFFFF
/// there means a core.img that does not match this layout (`setup.c`:
/// "core.img version mismatch").
const NO_REED_SOLOMON_LENGTH: usize = 0x14;
const BOOT_SIGNATURE: [u8; 2] = [0x55, 0xAA];

/// GRUB's two images, as `grub-mkimage` made them, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grub {
    boot_img: Vec<u8>,
    /// core.img padded with zeros to whole sectors.
    core_img: Vec<u8>,
}

impl Grub {
    /// Checks `boot.img` (one sector with the boot signature) and `core.img`
    /// (`grub-mkimage -O i386-pc`: at least two sectors, its blocklist as
    /// grub-mkimage leaves it, at most [`MAX_CORE_SECTORS`]).
    pub fn new(boot_img: &[u8], core_img: &[u8]) -> Result<Grub> {
        ensure!(
            boot_img.len() == SECTOR && boot_img[SECTOR - 2..] == BOOT_SIGNATURE,
            "boot.img is {} bytes{}: GRUB's i386-pc boot.img is one 512-byte sector ending in \
             55 AA (install grub-pc-bin, scripts/setup.sh)",
            boot_img.len(),
            if boot_img.len() == SECTOR {
                " without the boot signature"
            } else {
                ""
            }
        );
        let sectors = core_img.len().div_ceil(SECTOR) as u64;
        ensure!(
            sectors >= 2,
            "core.img is {} bytes: a GRUB core image has at least two sectors",
            core_img.len()
        );
        ensure!(
            sectors <= MAX_CORE_SECTORS,
            "core.img is {} bytes ({sectors} sectors): GRUB loads at most {MAX_CORE_SECTORS} \
             sectors ({} bytes) by blocklist; embed fewer modules",
            core_img.len(),
            MAX_CORE_SECTORS * SECTOR as u64
        );
        let (_, len, segment) = list_at(core_img, FIRST_LIST);
        ensure!(
            u64::from(len) == sectors - 1 && segment == FIRST_SEGMENT,
            "core.img's blocklist says {len} sectors at segment {segment:#x}, not {} at \
             {FIRST_SEGMENT:#x}: not an i386-pc core image made by grub-mkimage",
            sectors - 1
        );
        ensure!(
            read_u16(core_img, SECTOR + NO_REED_SOLOMON_LENGTH) != Some(0xFFFF),
            "core.img does not match GRUB 2's i386-pc layout (core.img version mismatch)"
        );
        let mut core = core_img.to_vec();
        core.resize(sectors as usize * SECTOR, 0);
        Ok(Grub {
            boot_img: boot_img.to_vec(),
            core_img: core,
        })
    }

    /// Sectors of core.img.
    pub fn core_sectors(&self) -> u64 {
        (self.core_img.len() / SECTOR) as u64
    }

    /// boot.img as given.
    pub fn boot_img(&self) -> &[u8] {
        &self.boot_img
    }

    /// core.img as given (padded to whole sectors), its blocklist unpatched.
    pub fn core_img(&self) -> &[u8] {
        &self.core_img
    }

    /// core.img with its blocklist for a BIOS partition at `first_lba`.
    pub fn patched_core(&self, first_lba: u64) -> Vec<u8> {
        let mut core = self.core_img.clone();
        put_list(
            &mut core,
            FIRST_LIST,
            first_lba + 1,
            self.core_sectors() - 1,
        );
        core[FIRST_LIST - LIST_SIZE..FIRST_LIST].fill(0);
        core
    }

    /// LBA 0: boot.img's code for core.img at `first_lba`, then `mbr`'s
    /// signature and partition table, the protective entry's boot indicator
    /// set to `active`.
    pub fn patched_mbr(&self, mbr: &[u8; SECTOR], first_lba: u64, active: bool) -> [u8; SECTOR] {
        let mut m = [0u8; SECTOR];
        m.copy_from_slice(&self.boot_img);
        m[KERNEL_SECTOR..KERNEL_SECTOR + 8].copy_from_slice(&first_lba.to_le_bytes());
        m[BOOT_DRIVE] = BOOT_DRIVE_FROM_BIOS;
        m[DRIVE_CHECK] = NOP;
        m[DRIVE_CHECK + 1] = NOP;
        m[WINDOWS_NT_MAGIC..].copy_from_slice(&mbr[WINDOWS_NT_MAGIC..]);
        m[PART_START] = if active { ACTIVE } else { 0 };
        m
    }
}

fn list_at(b: &[u8], at: usize) -> (u64, u16, u16) {
    (
        read_u64(b, at).unwrap_or(0),
        read_u16(b, at + 8).unwrap_or(0),
        read_u16(b, at + 10).unwrap_or(0),
    )
}

fn put_list(b: &mut [u8], at: usize, start: u64, len: u64) {
    b[at..at + 8].copy_from_slice(&start.to_le_bytes());
    b[at + 8..at + 10].copy_from_slice(&(len as u16).to_le_bytes());
    b[at + 10..at + 12].copy_from_slice(&FIRST_SEGMENT.to_le_bytes());
}

/// The BIOS boot partition of `table` (by its type GUID): first LBA and
/// sectors. Refused on disks whose sectors are not 512 bytes.
fn bios_partition(table: &Table) -> Result<(u64, u64)> {
    ensure!(
        table.sector_size == SECTOR as u64,
        "BIOS boot needs 512-byte sectors: this disk has {}-byte sectors (BIOS firmware \
         reads 512-byte sectors; boot it under UEFI)",
        table.sector_size
    );
    let p = table
        .partitions
        .iter()
        .find(|p| p.type_guid == contract::guid::BIOS_BOOT)
        .context("the disk has no BIOS boot partition for GRUB's core image")?;
    Ok((p.first_lba, p.last_lba - p.first_lba + 1))
}

fn read_sector<D: Read + Seek>(dev: &mut D, at: u64) -> io::Result<[u8; SECTOR]> {
    let mut s = [0u8; SECTOR];
    dev.seek(SeekFrom::Start(at))?;
    dev.read_exact(&mut s)?;
    Ok(s)
}

fn is_protective(mbr: &[u8; SECTOR]) -> bool {
    mbr[PART_START + 4] == PROTECTIVE_TYPE && mbr[SECTOR - 2..] == BOOT_SIGNATURE
}

/// Checks, before anything is written, that `grub` can be written to the
/// disk of `table`: 512-byte sectors, a BIOS partition that holds core.img.
pub fn check_fits(table: &Table, grub: &Grub) -> Result<()> {
    let (_, sectors) = bios_partition(table)?;
    ensure!(
        grub.core_sectors() <= sectors,
        "the BIOS partition ({sectors} sectors, {} bytes) is too small for GRUB's core image \
         ({} sectors, {} bytes)",
        sectors * SECTOR as u64,
        grub.core_sectors(),
        grub.core_sectors() * SECTOR as u64
    );
    Ok(())
}

/// Writes GRUB to the disk `dev` whose partition table `table` was read
/// from: core.img into the BIOS partition, then boot.img into the
/// protective MBR's code area, with the protective entry's boot indicator
/// set to `active` (the module documentation has the order and what a
/// power cut leaves). Every check comes before the first write; the result
/// is read back ([`check`]).
pub fn write<D: Device>(dev: &mut D, table: &Table, grub: &Grub, active: bool) -> Result<()> {
    check_fits(table, grub)?;
    let (first, _) = bios_partition(table)?;
    let mbr = read_sector(dev, 0).context("reading the protective MBR")?;
    ensure!(
        is_protective(&mbr),
        "LBA 0 holds no protective MBR (partition type 0xEE, signature 55 AA): write the \
         partition table first"
    );
    let core = grub.patched_core(first);
    let new_mbr = grub.patched_mbr(&mbr, first, active);
    dev.seek(SeekFrom::Start(first * SECTOR as u64))?;
    dev.write_all(&core)
        .context("writing GRUB's core image into the BIOS partition")?;
    dev.sync().context("syncing GRUB's core image")?;
    dev.seek(SeekFrom::Start(0))?;
    dev.write_all(&new_mbr)
        .context("writing GRUB's boot code into the MBR")?;
    dev.sync().context("syncing the MBR")?;
    check(dev, table, grub, active).context("GRUB read back from the disk")
}

/// What LBA 0 and the BIOS partition hold for the BIOS path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Installed {
    /// No boot code in the MBR: the disk does not boot under BIOS.
    None,
    /// GRUB: the MBR points to core.img in the BIOS partition, whose
    /// blocklist loads `core_sectors` sectors from there.
    Grub { core_sectors: u64, active: bool },
}

/// Reads what the disk holds for the BIOS path, checking that GRUB's MBR
/// and blocklist point into the BIOS partition as [`write`] makes them. An
/// MBR with other boot code, or GRUB's pointing elsewhere, is an error.
pub fn inspect<D: Read + Seek>(dev: &mut D, table: &Table) -> Result<Installed> {
    let mbr = read_sector(dev, 0).context("reading the MBR")?;
    ensure!(
        is_protective(&mbr),
        "LBA 0 holds no protective MBR (partition type 0xEE, signature 55 AA)"
    );
    let active = mbr[PART_START] == ACTIVE;
    if mbr[..WINDOWS_NT_MAGIC].iter().all(|&b| b == 0) {
        return Ok(Installed::None);
    }
    let (first, sectors) = bios_partition(table)?;
    let kernel = read_u64(&mbr, KERNEL_SECTOR).unwrap_or(0);
    ensure!(
        kernel == first,
        "the MBR's boot code loads LBA {kernel}, not the BIOS partition's first sector {first}"
    );
    ensure!(
        mbr[BOOT_DRIVE] == BOOT_DRIVE_FROM_BIOS,
        "the MBR's boot code loads from drive {:#04x}, not the drive the BIOS booted (0xff)",
        mbr[BOOT_DRIVE]
    );
    ensure!(
        mbr[DRIVE_CHECK..DRIVE_CHECK + 2] == [NOP, NOP],
        "the MBR's boot code skips the boot-drive check of a hard disk"
    );
    let core0 = read_sector(dev, first * SECTOR as u64).context("reading core.img")?;
    let (start, len, segment) = list_at(&core0, FIRST_LIST);
    let len = u64::from(len);
    ensure!(
        start == first + 1 && len >= 1 && len < sectors && segment == FIRST_SEGMENT,
        "core.img's blocklist loads {len} sectors from LBA {start} at segment {segment:#x}; \
         GRUB's core image in the BIOS partition (LBA {first}, {sectors} sectors) loads the \
         sectors after its first, at most {}, at {FIRST_SEGMENT:#x}",
        sectors - 1
    );
    let (_, next_len, _) = list_at(&core0, FIRST_LIST - LIST_SIZE);
    ensure!(
        next_len == 0,
        "core.img's blocklist has no terminator after its first entry"
    );
    Ok(Installed::Grub {
        core_sectors: len + 1,
        active,
    })
}

/// Reads GRUB back from the disk and checks it is exactly what [`write`]
/// writes for `grub` and `active`: the MBR's code is boot.img's but for the
/// patched fields, its partition table still the protective one, and
/// core.img (with its blocklist) whole in the BIOS partition.
pub fn check<D: Read + Seek>(dev: &mut D, table: &Table, grub: &Grub, active: bool) -> Result<()> {
    let installed = inspect(dev, table)?;
    ensure!(
        installed
            == Installed::Grub {
                core_sectors: grub.core_sectors(),
                active
            },
        "the disk holds {installed:?}, not GRUB's core image of {} sectors (boot flag {})",
        grub.core_sectors(),
        if active { "set" } else { "clear" }
    );
    let (first, _) = bios_partition(table)?;
    let mbr = read_sector(dev, 0).context("reading the MBR")?;
    if mbr != grub.patched_mbr(&mbr, first, active) {
        bail!("the MBR's boot code is not GRUB's boot.img patched for this disk");
    }
    let want = grub.patched_core(first);
    let mut got = vec![0u8; want.len()];
    dev.seek(SeekFrom::Start(first * SECTOR as u64))?;
    dev.read_exact(&mut got).context("reading core.img")?;
    ensure!(
        got == want,
        "core.img in the BIOS partition differs from the one written"
    );
    Ok(())
}

#[cfg(test)]
mod tests;
