//! The system area (LBA 0–15) and the backup GPT, written after the ISO
//! 9660 data: the volume identity that the disk GUIDs and the MBR disk
//! signature derive from, the GPT whose EFI System Partition is the EFI
//! boot image, and the MBR with GRUB's hybrid boot code written last.

use super::encoding::put;
use super::plan::Plan;
use super::{BLOCK, HYBRID_KERNEL_SECTOR, IsoSpec, MBR_CODE, SECTOR};
use anyhow::{Context, Result};
use bootstate::gpt::{self, NewPartition};
use contract::Guid;
use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};

/// The volume identity hashed into the GUIDs and the disk signature.
pub(super) fn identity(spec: &IsoSpec, sizes: &[u64]) -> Vec<u8> {
    let mut h = Sha256::new();
    let mut field = |b: &[u8]| {
        h.update((b.len() as u64).to_le_bytes());
        h.update(b);
    };
    field(b"imager.iso.v1");
    field(spec.volume_id.as_bytes());
    field(spec.volume_set_id.as_bytes());
    field(spec.publisher.as_bytes());
    field(&spec.epoch.to_le_bytes());
    let mut files: Vec<(&str, u64)> = spec
        .files
        .iter()
        .zip(sizes)
        .map(|(f, s)| (f.path.as_str(), *s))
        .collect();
    files.sort();
    for (p, s) in files {
        field(p.as_bytes());
        field(&s.to_le_bytes());
    }
    field(
        spec.bios
            .as_ref()
            .map(|b| b.image.as_bytes())
            .unwrap_or(b"-"),
    );
    field(
        spec.bios
            .as_ref()
            .map(|b| &b.hybrid_mbr[..])
            .unwrap_or(b"-"),
    );
    field(spec.efi_image.as_deref().unwrap_or("-").as_bytes());
    h.finalize().to_vec()
}

/// What [`write_system_area`] wrote.
pub(super) struct SystemArea {
    pub(super) disk_guid: Option<Guid>,
    pub(super) efi_partition: Option<(u64, u64)>,
    pub(super) mbr_signature: Option<u32>,
}

/// Writes the GPT (with an EFI image) and then the MBR into `file`, whose
/// `total` bytes of ISO 9660 data are written and synced.
pub(super) fn write_system_area(
    spec: &IsoSpec,
    p: &Plan,
    file: &mut File,
    total: u64,
) -> Result<SystemArea> {
    let digest = &p.identity;
    let mbr_signature = {
        let g = contract::guid::derive("iso-mbr-signature", &[digest]);
        let b = g.as_bytes();
        u32::from_le_bytes([b[0], b[1], b[2], b[3]]).max(1)
    };
    let mut disk_guid = None;
    let mut efi_partition = None;
    if let Some((i, lba)) = p.efi {
        let guid = contract::guid::derive("iso-disk", &[digest]);
        let first = u64::from(lba) * (BLOCK / SECTOR);
        let last = first + p.sizes[i] / SECTOR - 1;
        gpt::write_new(
            &mut *file,
            total,
            SECTOR,
            guid,
            &[NewPartition {
                label: "EFI",
                type_guid: contract::guid::EFI_SYSTEM,
                unique_guid: contract::guid::partition_guid(guid, "EFI"),
                first_lba: first,
                last_lba: last,
            }],
        )
        .context("writing the GPT of the hybrid image")?;
        disk_guid = Some(guid);
        efi_partition = Some((first, last));
    }
    // LBA 0 last: GRUB's hybrid code over the table write_new wrote.
    let mut mbr = [0u8; SECTOR as usize];
    file.seek(SeekFrom::Start(0))?;
    file.read_exact(&mut mbr).context("reading back the MBR")?;
    if let (Some(b), Some((_, lba))) = (&spec.bios, p.bios) {
        mbr[..MBR_CODE].copy_from_slice(&b.hybrid_mbr[..MBR_CODE]);
        put(
            &mut mbr,
            HYBRID_KERNEL_SECTOR,
            &(u64::from(lba) * 4 + 4).to_le_bytes(),
        );
        mbr[510] = 0x55;
        mbr[511] = 0xAA;
    }
    if p.bios.is_some() || p.efi.is_some() {
        put(&mut mbr, MBR_CODE, &mbr_signature.to_le_bytes());
        file.seek(SeekFrom::Start(0))?;
        file.write_all(&mbr).context("writing the MBR")?;
        file.sync_all().context("syncing the image")?;
    }
    Ok(SystemArea {
        disk_guid,
        efi_partition,
        mbr_signature: (p.bios.is_some() || p.efi.is_some()).then_some(mbr_signature),
    })
}
