//! Writing a plan: the output file created, every block written in order,
//! then the system area; the file removed when a step fails.

use super::eltorito::{bios_patches, boot_catalog, boot_record};
use super::encoding::put;
use super::plan::Plan;
use super::records::{dir_record, dir_records, pack_records, path_table, pvd, terminator};
use super::source::copy_patched;
use super::tree::Kind;
use super::{BLOCK, HYBRID_KERNEL_SECTOR, IsoReport, IsoSpec, MBR_CODE, PVD_LBA, SECTOR};
use anyhow::{Context, Result, anyhow, ensure};
use bootstate::gpt::{self, NewPartition};
use std::fs::File;
use std::io::{BufWriter, Read, Seek, SeekFrom, Write};
use std::path::Path;

/// Creates `out` and writes the planned image, removing `out` on failure.
pub(super) fn write_plan(spec: &IsoSpec, plan: &Plan, out: &Path) -> Result<IsoReport> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(out)
        .with_context(|| format!("creating {}", out.display()))?;
    match write_planned(spec, plan, file) {
        Ok(r) => Ok(r),
        Err(e) => {
            let _ = std::fs::remove_file(out);
            Err(e.context(format!("writing the ISO image {}", out.display())))
        }
    }
}

pub(super) fn write_planned(spec: &IsoSpec, p: &Plan, file: File) -> Result<IsoReport> {
    let l = &p.layout;
    let date = &p.date;
    let mut w = BufWriter::with_capacity(256 * 1024, file);
    let mut pos: u64 = 0;
    // System area: zeros for now (the MBR and GPT come last).
    let root_rec = {
        let (lba, size) = match &l.nodes[0].kind {
            Kind::Dir { lba, size, .. } => (*lba, *size),
            Kind::File { .. } => (0, 0),
        };
        dir_record(&[0], lba, size, true, date, &[])
    };
    emit(
        &mut w,
        &mut pos,
        u64::from(PVD_LBA),
        &pvd(spec, date, p.blocks, p.pt_size, p.l_lba, p.m_lba, &root_rec),
    )?;
    let mut next = u64::from(PVD_LBA) + 1;
    if let Some(c) = p.catalog_lba {
        emit(&mut w, &mut pos, next, &boot_record(c))?;
        next += 1;
    }
    emit(&mut w, &mut pos, next, &terminator())?;
    emit(&mut w, &mut pos, u64::from(p.l_lba), &path_table(l, false))?;
    emit(&mut w, &mut pos, u64::from(p.m_lba), &path_table(l, true))?;
    // Continuation areas, in the order they were placed.
    let mut ce = vec![0u8; p.ce_blocks as usize * BLOCK as usize];
    for n in &l.nodes {
        for s in [&n.susp, &n.dot_susp] {
            if s.ce_at.is_some() {
                let at = (s.cont_at.0 - p.ce_lba) as usize * BLOCK as usize + s.cont_at.1 as usize;
                put(&mut ce, at, &s.cont);
            }
        }
    }
    if !ce.is_empty() {
        emit(&mut w, &mut pos, u64::from(p.ce_lba), &ce)?;
    }
    for &d in &l.dirs {
        let lba = match &l.nodes[d].kind {
            Kind::Dir { lba, .. } => *lba,
            Kind::File { .. } => continue,
        };
        emit(
            &mut w,
            &mut pos,
            u64::from(lba),
            &pack_records(&dir_records(l, d, date)),
        )?;
    }
    let efi_count = p.efi.map(|(i, _)| {
        let sectors = p.sizes[i] / SECTOR;
        u16::try_from(sectors).unwrap_or(0)
    });
    if let Some(c) = p.catalog_lba {
        let cat = boot_catalog(
            p.bios.map(|(_, lba)| lba),
            p.efi.zip(efi_count).map(|((_, lba), n)| (lba, n)),
        );
        emit(&mut w, &mut pos, u64::from(c), &cat)?;
    }
    for &n in &l.files {
        let (fi, size, lba) = match l.nodes[n].kind {
            Kind::File { file, size, lba } => (file, size, lba),
            Kind::Dir { .. } => continue,
        };
        if size == 0 {
            continue;
        }
        let f = &spec.files[fi];
        let patches = if p.bios.map(|(i, _)| i) == Some(fi) {
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
                            sum = sum.wrapping_add(u32::from_le_bytes([
                                carry[0], carry[1], carry[2], carry[3],
                            ]));
                            carry.clear();
                        }
                    }
                    off += 1;
                }
                Ok(())
            })?;
            if !carry.is_empty() {
                carry.resize(4, 0);
                sum =
                    sum.wrapping_add(u32::from_le_bytes([carry[0], carry[1], carry[2], carry[3]]));
            }
            bios_patches(lba, size, sum)
        } else {
            Vec::new()
        };
        let at = u64::from(lba) * BLOCK;
        ensure!(pos <= at, "internal: layout overlap at LBA {lba}");
        io_zeros(&mut w, at - pos)?;
        copy_patched(f, size, &patches, |chunk| {
            w.write_all(chunk).context("writing the image")
        })?;
        pos = at + size;
    }
    let total = u64::from(p.blocks) * BLOCK;
    ensure!(
        pos <= total && p.data_end <= total,
        "internal: the data passes the volume"
    );
    io_zeros(&mut w, total - pos)?;
    let mut file = w
        .into_inner()
        .map_err(|e| anyhow!("writing the image: {}", e.error()))?;
    file.sync_all().context("syncing the image")?;

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
            &mut file,
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
    Ok(IsoReport {
        size: total,
        volume_blocks: p.blocks,
        catalog_lba: p.catalog_lba,
        bios_image_lba: p.bios.map(|(_, l)| l),
        efi_image_lba: p.efi.map(|(_, l)| l),
        efi_partition,
        disk_guid,
        mbr_signature: (p.bios.is_some() || p.efi.is_some()).then_some(mbr_signature),
    })
}

/// Writes `bytes` at block `lba`, zeros from `pos` up to it.
pub(super) fn emit(w: &mut impl Write, pos: &mut u64, lba: u64, bytes: &[u8]) -> Result<()> {
    let at = lba * BLOCK;
    ensure!(*pos <= at, "internal: layout overlap at LBA {lba}");
    io_zeros(w, at - *pos)?;
    w.write_all(bytes).context("writing the image")?;
    *pos = at + bytes.len() as u64;
    Ok(())
}

pub(super) fn io_zeros(w: &mut impl Write, mut n: u64) -> Result<()> {
    let z = [0u8; 8192];
    while n > 0 {
        let k = n.min(z.len() as u64) as usize;
        w.write_all(&z[..k]).context("writing the image")?;
        n -= k as u64;
    }
    Ok(())
}
