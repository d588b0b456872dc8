//! Writing a plan: the output file created, every block written in order,
//! then the system area; the file removed when a step fails.

use super::eltorito::{bios_image_patches, boot_catalog, boot_record};
use super::plan::Plan;
use super::records::{dir_record, dir_records, pack_records, path_table, pvd, terminator};
use super::rockridge::continuation_areas;
use super::source::copy_patched;
use super::system_area::write_system_area;
use super::tree::Kind;
use super::{BLOCK, IsoReport, IsoSpec, PVD_LBA, SECTOR};
use anyhow::{Context, Result, anyhow, ensure};
use std::fs::File;
use std::io::{BufWriter, Write};
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
    let ce = continuation_areas(l, p.ce_lba, p.ce_blocks);
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
            bios_image_patches(f, lba, size)?
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

    let area = write_system_area(spec, p, &mut file, total)?;
    Ok(IsoReport {
        size: total,
        volume_blocks: p.blocks,
        catalog_lba: p.catalog_lba,
        bios_image_lba: p.bios.map(|(_, l)| l),
        efi_image_lba: p.efi.map(|(_, l)| l),
        efi_partition: area.efi_partition,
        disk_guid: area.disk_guid,
        mbr_signature: area.mbr_signature,
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
