//! The plan: the spec validated and every block allocated (descriptors,
//! path tables, continuation areas, directories, boot catalog, file data,
//! backup GPT) before the output file exists.

use super::encoding::{Date, is_a_char, is_d_char};
use super::records::{blocks_of, dir_records, pack_records, path_table};
use super::rockridge::{layout_susp, place_continuations};
use super::source::source_size;
use super::system_area::identity;
use super::tree::{Kind, Layout, build_tree, components};
use super::{BLOCK, GRUB2_BOOT_INFO_OFFSET, IsoSpec, PVD_LBA, SECTOR};
use anyhow::{Result, anyhow, bail, ensure};

pub(super) fn check_identifier(what: &str, value: &str, max: usize, d_only: bool) -> Result<()> {
    ensure!(
        value.len() <= max,
        "the {what} {value:?} is {} bytes long: ISO 9660 allows at most {max}",
        value.len()
    );
    if let Some(c) = value
        .chars()
        .find(|c| !c.is_ascii() || !(if d_only { is_d_char } else { is_a_char })(*c as u8))
    {
        if d_only {
            bail!(
                "the {what} {value:?} holds {c:?}: ISO 9660 allows only d-characters (A-Z, \
                 0-9 and _; no lower case)"
            );
        }
        bail!(
            "the {what} {value:?} holds {c:?}: ISO 9660 allows only a-characters (A-Z, 0-9, \
             space and !\"%&'()*+,-./:;<=>?_; no lower case, so write hex digests in upper case)"
        );
    }
    Ok(())
}

pub(super) fn file_index(spec: &IsoSpec, path: &str, what: &str) -> Result<usize> {
    spec.files
        .iter()
        .position(|f| f.path == path)
        .ok_or_else(|| anyhow!("the {what} {path:?} is not among the image's files"))
}

/// Where everything goes; computed before the output exists.
pub(super) struct Plan {
    pub(super) layout: Layout,
    pub(super) date: Date,
    pub(super) sizes: Vec<u64>,
    pub(super) pt_size: u32,
    pub(super) l_lba: u32,
    pub(super) m_lba: u32,
    pub(super) ce_lba: u32,
    pub(super) ce_blocks: u32,
    pub(super) catalog_lba: Option<u32>,
    pub(super) blocks: u32,
    pub(super) bios: Option<(usize, u32)>,
    pub(super) efi: Option<(usize, u32)>,
    /// Bytes of the ISO 9660 data (before the GPT tail).
    pub(super) data_end: u64,
    pub(super) identity: Vec<u8>,
}

pub(super) fn plan(spec: &IsoSpec) -> Result<Plan> {
    ensure!(
        !spec.volume_id.is_empty(),
        "the volume identifier is empty: give 1 to 32 d-characters (A-Z, 0-9, _)"
    );
    check_identifier("volume identifier", &spec.volume_id, 32, true)?;
    check_identifier("volume set identifier", &spec.volume_set_id, 128, false)?;
    check_identifier("publisher identifier", &spec.publisher, 128, false)?;
    let date = Date::of(spec.epoch);
    ensure!(
        date.year <= 2155,
        "the epoch {} is in the year {}: ISO 9660 directory dates end in 2155",
        spec.epoch,
        date.year
    );
    let mut sizes = Vec::with_capacity(spec.files.len());
    for f in &spec.files {
        components(&f.path)?;
        let s = source_size(f)?;
        ensure!(
            s <= u64::from(u32::MAX),
            "{} is {s} bytes: a file of this ISO 9660 image has one extent of at most {} \
             bytes (4 GiB - 1)",
            f.path,
            u32::MAX
        );
        sizes.push(s);
    }
    let bios = match &spec.bios {
        Some(b) => {
            let i = file_index(spec, &b.image, "BIOS boot image")?;
            ensure!(
                sizes[i] >= (GRUB2_BOOT_INFO_OFFSET + 8) as u64,
                "the BIOS boot image {} is {} bytes: GRUB's eltorito.img (cdboot.img + core.img, \
                 grub-mkimage -O i386-pc-eltorito) is at least {} bytes",
                b.image,
                sizes[i],
                GRUB2_BOOT_INFO_OFFSET + 8
            );
            ensure!(
                b.hybrid_mbr.len() == SECTOR as usize && b.hybrid_mbr[510..] == [0x55, 0xAA],
                "the hybrid MBR is {} bytes: GRUB's boot_hybrid.img is one 512-byte sector \
                 ending in 55 AA",
                b.hybrid_mbr.len()
            );
            Some(i)
        }
        None => None,
    };
    let efi = match &spec.efi_image {
        Some(p) => {
            let i = file_index(spec, p, "EFI boot image")?;
            ensure!(
                sizes[i] > 0 && sizes[i].is_multiple_of(SECTOR),
                "the EFI boot image {p} is {} bytes: a FAT image is a non-zero multiple of \
                 {SECTOR} bytes",
                sizes[i]
            );
            Some(i)
        }
        None => None,
    };
    let mut layout = build_tree(spec, &sizes)?;
    layout_susp(&mut layout, &date);

    let boot = bios.is_some() || efi.is_some();
    let mut next: u64 = u64::from(PVD_LBA) + 1 + u64::from(boot) + 1;
    let pt = path_table(&layout, false);
    let pt_size = pt.len() as u32;
    let l_lba = next;
    next += blocks_of(pt.len() as u64);
    let m_lba = next;
    next += blocks_of(pt.len() as u64);
    let ce_lba = next;
    let ce_blocks = place_continuations(&mut layout, ce_lba as u32);
    next += u64::from(ce_blocks);
    // Directory sizes do not depend on LBAs: lay them out with zeros first.
    for k in 0..layout.dirs.len() {
        let d = layout.dirs[k];
        let bytes = pack_records(&dir_records(&layout, d, &date)).len() as u64;
        if let Kind::Dir { lba, size, .. } = &mut layout.nodes[d].kind {
            *lba = next as u32;
            *size = bytes as u32;
        }
        next += blocks_of(bytes);
    }
    let catalog_lba = if boot {
        next += 1;
        Some((next - 1) as u32)
    } else {
        None
    };
    let mut bios_lba = None;
    let mut efi_lba = None;
    for k in 0..layout.files.len() {
        let n = layout.files[k];
        if let Kind::File { file, size, lba } = &mut layout.nodes[n].kind {
            if *size > 0 {
                *lba = u32::try_from(next).map_err(|_| {
                    anyhow!("the image is larger than ISO 9660's 2^32 blocks of 2048 bytes")
                })?;
                next += blocks_of(*size);
            }
            if Some(*file) == bios {
                bios_lba = Some(*lba);
            }
            if Some(*file) == efi {
                efi_lba = Some(*lba);
            }
        }
    }
    let data_end = next * BLOCK;
    if efi.is_some() {
        // The backup GPT: 32 sectors of entries and the header.
        next += blocks_of(33 * SECTOR);
    }
    let blocks = u32::try_from(next)
        .map_err(|_| anyhow!("the image is larger than ISO 9660's 2^32 blocks of 2048 bytes"))?;
    Ok(Plan {
        identity: identity(spec, &sizes),
        layout,
        date,
        sizes,
        pt_size,
        l_lba: l_lba as u32,
        m_lba: m_lba as u32,
        ce_lba: ce_lba as u32,
        ce_blocks,
        catalog_lba,
        blocks,
        bios: bios.zip(bios_lba),
        efi: efi.zip(efi_lba),
        data_end,
    })
}
