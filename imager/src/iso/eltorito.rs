//! El Torito: the Boot Record volume descriptor, the boot catalog, and the
//! boot-info table and GRUB blocklist patches of the BIOS boot image.

use super::IsoFile;
use super::encoding::put;
use super::source::copy_patched;
use super::{BLOCK, BOOT_INFO_OFFSET, GRUB2_BOOT_INFO_OFFSET, PVD_LBA};
use anyhow::Result;

/// The El Torito boot catalog (one block).
pub(super) fn boot_catalog(bios: Option<u32>, efi: Option<(u32, u16)>) -> Vec<u8> {
    let mut c = vec![0u8; BLOCK as usize];
    let entry = |c: &mut [u8], at: usize, segment: u16, count: u16, lba: u32| {
        c[at] = 0x88;
        c[at + 1] = 0; // no emulation
        put(c, at + 2, &segment.to_le_bytes());
        put(c, at + 6, &count.to_le_bytes());
        put(c, at + 8, &lba.to_le_bytes());
    };
    c[0] = 1;
    c[1] = if bios.is_some() { 0 } else { 0xEF };
    c[30] = 0x55;
    c[31] = 0xAA;
    let sum = c[..32].chunks_exact(2).fold(0u16, |s, w| {
        s.wrapping_add(u16::from_le_bytes([w[0], w[1]]))
    });
    put(&mut c, 28, &0u16.wrapping_sub(sum).to_le_bytes());
    match (bios, efi) {
        (Some(b), efi) => {
            entry(&mut c, 32, 0, 4, b);
            if let Some((lba, count)) = efi {
                c[64] = 0x91;
                c[65] = 0xEF;
                put(&mut c, 66, &1u16.to_le_bytes());
                entry(&mut c, 96, 0, count, lba);
            }
        }
        (None, Some((lba, count))) => entry(&mut c, 32, 0, count, lba),
        (None, None) => {}
    }
    c
}

pub(super) fn boot_record(catalog: u32) -> Vec<u8> {
    let mut d = vec![0u8; BLOCK as usize];
    put(&mut d, 1, b"CD001");
    d[6] = 1;
    put(&mut d, 7, b"EL TORITO SPECIFICATION");
    put(&mut d, 71, &catalog.to_le_bytes());
    d
}

/// The BIOS image's boot-info table and GRUB patch, given its checksum.
pub(super) fn bios_patches(lba: u32, size: u64, checksum: u32) -> Vec<(u64, Vec<u8>)> {
    let mut table = vec![0u8; 56];
    put(&mut table, 0, &PVD_LBA.to_le_bytes());
    put(&mut table, 4, &lba.to_le_bytes());
    put(&mut table, 8, &(size as u32).to_le_bytes());
    put(&mut table, 12, &checksum.to_le_bytes());
    vec![
        (BOOT_INFO_OFFSET as u64, table),
        (
            GRUB2_BOOT_INFO_OFFSET as u64,
            (u64::from(lba) * 4 + 5).to_le_bytes().to_vec(),
        ),
    ]
}

/// The patches of the BIOS boot image `f` stored at `lba`: reads it once
/// for the boot-info checksum, which is of the bytes as stored (GRUB's
/// patch applied), from offset 64 on.
pub(super) fn bios_image_patches(f: &IsoFile, lba: u32, size: u64) -> Result<Vec<(u64, Vec<u8>)>> {
    let pre = bios_patches(lba, size, 0);
    let grub = &pre[1..];
    let mut sum = 0u32;
    let mut off = 0u64;
    let mut carry: Vec<u8> = Vec::new();
    copy_patched(f, size, grub, |chunk| {
        for &b in chunk {
            if off >= 64 {
                carry.push(b);
                if carry.len() == 4 {
                    sum = sum
                        .wrapping_add(u32::from_le_bytes([carry[0], carry[1], carry[2], carry[3]]));
                    carry.clear();
                }
            }
            off += 1;
        }
        Ok(())
    })?;
    if !carry.is_empty() {
        carry.resize(4, 0);
        sum = sum.wrapping_add(u32::from_le_bytes([carry[0], carry[1], carry[2], carry[3]]));
    }
    Ok(bios_patches(lba, size, sum))
}
