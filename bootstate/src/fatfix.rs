//! FAT internals that fatfs does not get right: the `.` and `..` entries
//! of new directories, and the order of the writes of a file removal
//! ([`remove_file`]).
//!
//! fatfs 0.3.6 (the latest release) has two known bugs in `create_dir`,
//! fixed upstream after the release (rafalh/rust-fatfs#99, #100, #117):
//!
//! * it writes a long-name (LFN) entry before `.` and before `..`, so a new
//!   directory starts `LFN(.) . LFN(..) ..` instead of `. ..`: fsck.fat then
//!   renames them and other implementations may not find them;
//! * on FAT32, `..` of a directory in the root points to the root's cluster,
//!   where the specification wants cluster 0.
//!
//! After fatfs is done, [`fix_dot_entries`] walks every directory and
//! rewrites it as mkfs.fat and Linux would have: the two LFN entries are
//! dropped (the following entries move up two slots) and `..` of a
//! first-level directory points to cluster 0. It only touches directories.

use anyhow::{Result, bail};
use std::io::{Read, Seek, SeekFrom, Write};

use crate::device::Device;
use crate::fatscan::{ATTR_DIR, ATTR_LFN, DOT, DOTDOT, ENTRY, Geometry, Kind, geometry};

fn read_ranges<T: Read + Seek>(dev: &mut T, ranges: &[(u64, u64)]) -> Result<Vec<u8>> {
    let mut buf = Vec::new();
    for &(at, len) in ranges {
        let start = buf.len();
        buf.resize(start + len as usize, 0);
        dev.seek(SeekFrom::Start(at))?;
        dev.read_exact(&mut buf[start..])?;
    }
    Ok(buf)
}

/// Writes `buf` over `ranges`: only the sectors that change, contiguous
/// ones in one write ([`write_changed`]).
fn write_ranges<T: Read + Write + Seek>(
    dev: &mut T,
    g: &Geometry,
    ranges: &[(u64, u64)],
    buf: &[u8],
) -> Result<()> {
    let old = read_ranges(dev, ranges)?;
    let mut from = 0;
    for &(at, len) in ranges {
        let r = from..from + len as usize;
        write_changed(dev, at, &old[r.clone()], &buf[r], g.sector as usize)?;
        from += len as usize;
    }
    Ok(())
}

/// Subdirectories (first cluster) listed in a directory's entries.
fn subdirs(g: &Geometry, dir: &[u8]) -> Vec<u32> {
    crate::fatscan::entries(dir)
        .filter(|e| e[11] & ATTR_DIR != 0)
        .map(|e| g.first_cluster(e))
        .filter(|c| *c >= 2)
        .collect()
}

fn set_cluster(e: &mut [u8], c: u32) {
    e[20..22].copy_from_slice(&((c >> 16) as u16).to_le_bytes());
    e[26..28].copy_from_slice(&(c as u16).to_le_bytes());
}

/// Rewrites the dot entries of every directory below the root; see the
/// module documentation. Idempotent.
pub fn fix_dot_entries<T: Read + Write + Seek>(dev: &mut T) -> Result<()> {
    let g = geometry(dev)?;
    let root = match g.kind {
        Kind::Fat16 => read_ranges(dev, &[g.root_region])?,
        Kind::Fat32 => {
            let chain = g.chain(dev, g.root_cluster)?;
            read_ranges(dev, &chain)?
        }
    };
    // (directory cluster, parent cluster as `..` must name it)
    let mut todo: Vec<(u32, u32)> = subdirs(&g, &root).into_iter().map(|c| (c, 0)).collect();
    let mut seen = 0usize;
    while let Some((dir, parent)) = todo.pop() {
        seen += 1;
        if seen > g.clusters as usize {
            bail!("directory tree loops");
        }
        let chain = g.chain(dev, dir)?;
        let mut buf = read_ranges(dev, &chain)?;
        if buf.len() < 4 * ENTRY {
            bail!("directory at cluster {dir} is too small");
        }
        let slot = |b: &[u8], i: usize| (b[i * ENTRY + 11], b[i * ENTRY..i * ENTRY + 11].to_vec());
        let fatfs_layout = slot(&buf, 0).0 == ATTR_LFN
            && slot(&buf, 1).1 == DOT
            && slot(&buf, 2).0 == ATTR_LFN
            && slot(&buf, 3).1 == DOTDOT;
        if fatfs_layout {
            // Drop slots 0 and 2: `.` `..` then everything else, two slots up.
            let dot = buf[ENTRY..2 * ENTRY].to_vec();
            let dotdot = buf[3 * ENTRY..4 * ENTRY].to_vec();
            buf.drain(..4 * ENTRY);
            let mut fixed = dot;
            fixed.extend_from_slice(&dotdot);
            fixed.extend_from_slice(&buf);
            fixed.resize(fixed.len() + 2 * ENTRY, 0);
            buf = fixed;
        } else if !(slot(&buf, 0).1 == DOT && slot(&buf, 1).1 == DOTDOT) {
            buf = unfinished_dir(&buf, dir).ok_or_else(|| {
                anyhow::anyhow!("directory at cluster {dir} does not start with `.` and `..`")
            })?;
        }
        set_cluster(&mut buf[ENTRY..2 * ENTRY], parent);
        write_ranges(dev, &g, &chain, &buf)?;
        todo.extend(subdirs(&g, &buf[2 * ENTRY..]).into_iter().map(|c| (c, dir)));
    }
    if g.kind == Kind::Fat32 {
        write_fs_info(dev, &g)?;
    }
    dev.flush()?;
    Ok(())
}

/// A directory whose creation a power cut interrupted, made whole: fatfs
/// zeroes the new cluster, writes the parent's entry for it, then `.` and
/// `..` (each after a long-name entry), so a cut leaves a prefix of those
/// four entries and then the end of the directory. Such a directory holds
/// nothing: it is given its two dot entries (the `.` it has, or a new
/// one). Anything else in it (a real directory that lost its dot entries)
/// gives None.
fn unfinished_dir(buf: &[u8], dir: u32) -> Option<Vec<u8>> {
    let mut dot = None;
    for e in buf.chunks_exact(ENTRY) {
        if e[0] == 0 {
            break;
        }
        if e[11] == ATTR_LFN {
            continue;
        }
        match &e[..11] {
            n if n == DOT => dot = Some(e.to_vec()),
            n if n == DOTDOT => {}
            _ => return None,
        }
    }
    let dot = dot.unwrap_or_else(|| {
        let mut e = vec![0u8; ENTRY];
        e[..11].copy_from_slice(DOT);
        e[11] = ATTR_DIR;
        set_cluster(&mut e, dir);
        e
    });
    let mut dotdot = dot.clone();
    dotdot[..11].copy_from_slice(DOTDOT);
    let mut fresh = vec![0u8; buf.len()];
    fresh[..ENTRY].copy_from_slice(&dot);
    fresh[ENTRY..2 * ENTRY].copy_from_slice(&dotdot);
    Some(fresh)
}

/// Writes the sectors of `new` that differ from `old` (both at `base`),
/// contiguous changed sectors in one write (at most 1 MiB).
pub(crate) fn write_changed<T: Write + Seek>(
    dev: &mut T,
    base: u64,
    old: &[u8],
    new: &[u8],
    sector: usize,
) -> Result<()> {
    let n = new.len().div_ceil(sector);
    let changed = |k: usize| {
        let r = k * sector..((k + 1) * sector).min(new.len());
        old.get(r.clone()) != new.get(r)
    };
    let mut k = 0;
    while k < n {
        if !changed(k) {
            k += 1;
            continue;
        }
        let start = k;
        while k < n && changed(k) && (k - start) * sector < crate::gather::RUN {
            k += 1;
        }
        let r = start * sector..(k * sector).min(new.len());
        dev.seek(SeekFrom::Start(base + r.start as u64))?;
        dev.write_all(&new[r])?;
    }
    Ok(())
}

/// Fills the FSInfo sector's free-cluster count and next-free hint, which
/// fatfs leaves "unknown" (fsck.fat reports them uninitialized).
pub(crate) fn write_fs_info<T: Read + Write + Seek>(dev: &mut T, g: &Geometry) -> Result<()> {
    // The FAT, read a chunk at a time (its size comes from the disk).
    let entries = u64::from(g.clusters) + 2;
    let mut free = 0u32;
    let mut next = None;
    let mut chunk = vec![0u8; 64 * 1024];
    let mut index = 0u64;
    dev.seek(SeekFrom::Start(g.fat_offset))?;
    while index < entries {
        let n = ((entries - index) * 4).min(chunk.len() as u64) as usize;
        dev.read_exact(&mut chunk[..n])?;
        for e in chunk[..n].chunks_exact(4) {
            if index >= 2 && u32::from_le_bytes([e[0], e[1], e[2], e[3]]) & 0x0FFF_FFFF == 0 {
                free += 1;
                next.get_or_insert(index as u32);
            }
            index += 1;
        }
    }
    let mut sector = [0u8; 512];
    dev.seek(SeekFrom::Start(g.fs_info))?;
    dev.read_exact(&mut sector)?;
    if sector[..4] != [0x52, 0x52, 0x61, 0x41] || sector[484..488] != [0x72, 0x72, 0x41, 0x61] {
        bail!("FSInfo sector has no signature");
    }
    sector[488..492].copy_from_slice(&free.to_le_bytes());
    sector[492..496].copy_from_slice(&next.unwrap_or(0xFFFF_FFFF).to_le_bytes());
    dev.seek(SeekFrom::Start(g.fs_info))?;
    dev.write_all(&sector)?;
    Ok(())
}

/// Where a directory entry (long-name entries and the short entry) lies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Found {
    /// Byte offset of the short (8.3) entry.
    pub(crate) short: u64,
    /// Byte offsets of its long-name entries.
    pub(crate) long: Vec<u64>,
    pub(crate) first_cluster: u32,
    pub(crate) is_dir: bool,
    /// The length the entry gives (0 for a directory).
    pub(crate) size: u64,
}

/// The name of a short entry as `name.ext`, lower case.
fn short_name(e: &[u8]) -> String {
    let base = String::from_utf8_lossy(&e[..8]).trim_end().to_string();
    let ext = String::from_utf8_lossy(&e[8..11]).trim_end().to_string();
    let name = if ext.is_empty() {
        base
    } else {
        format!("{base}.{ext}")
    };
    name.to_lowercase()
}

fn lfn_checksum(short: &[u8]) -> u8 {
    short[..11]
        .iter()
        .fold(0u8, |sum, b| sum.rotate_right(1).wrapping_add(*b))
}

/// The entries of a directory held in `ranges`: (name, entry).
fn scan_dir<T: Read + Seek>(
    dev: &mut T,
    g: &Geometry,
    ranges: &[(u64, u64)],
) -> Result<Vec<(String, Found)>> {
    let buf = read_ranges(dev, ranges)?;
    // Absolute offset of byte i of buf.
    let offset_of = |i: usize| {
        let mut i = i as u64;
        for &(at, len) in ranges {
            if i < len {
                return at + i;
            }
            i -= len;
        }
        u64::MAX
    };
    let mut out = Vec::new();
    let mut lfn: Vec<(u64, Vec<u16>, u8)> = Vec::new();
    for (i, e) in buf.chunks_exact(ENTRY).enumerate() {
        match e[0] {
            0x00 => break,
            0xE5 => {
                lfn.clear();
                continue;
            }
            _ => {}
        }
        if e[11] == ATTR_LFN {
            let units: Vec<u16> = [1..11, 14..26, 28..32]
                .into_iter()
                .flat_map(|r| {
                    e[r].chunks_exact(2)
                        .map(|c| u16::from_le_bytes([c[0], c[1]]))
                })
                .collect();
            lfn.push((offset_of(i * ENTRY), units, e[13]));
            continue;
        }
        let sum = lfn_checksum(e);
        let long = std::mem::take(&mut lfn);
        let name = if !long.is_empty() && long.iter().all(|(_, _, s)| *s == sum) {
            let units: Vec<u16> = long
                .iter()
                .rev()
                .flat_map(|(_, u, _)| u.iter().copied())
                .take_while(|u| *u != 0)
                .collect();
            String::from_utf16_lossy(&units).to_lowercase()
        } else {
            short_name(e)
        };
        if &e[..11] == DOT || &e[..11] == DOTDOT || e[11] & 0x08 != 0 {
            continue; // dot entries, volume label
        }
        out.push((
            name,
            Found {
                short: offset_of(i * ENTRY),
                long: long.iter().map(|(o, _, _)| *o).collect(),
                first_cluster: g.first_cluster(e),
                is_dir: e[11] & ATTR_DIR != 0,
                size: u64::from(u32::from_le_bytes([e[28], e[29], e[30], e[31]])),
            },
        ));
    }
    Ok(out)
}

/// Finds `path` (`/`-separated, compared without regard to case).
pub(crate) fn find<T: Read + Seek>(dev: &mut T, g: &Geometry, path: &str) -> Result<Option<Found>> {
    // Directories' chains are bounded (`Geometry::dir_chain`): a lookup on
    // a hostile disk reads at most a directory's worth each step.
    let mut ranges = match g.kind {
        Kind::Fat16 => vec![g.root_region],
        Kind::Fat32 => g.dir_chain(dev, g.root_cluster)?,
    };
    let parts: Vec<String> = path.split('/').map(str::to_lowercase).collect();
    for (i, part) in parts.iter().enumerate() {
        let entries = scan_dir(dev, g, &ranges)?;
        let Some((_, found)) = entries.into_iter().find(|(n, _)| n == part) else {
            return Ok(None);
        };
        if i + 1 == parts.len() {
            return Ok(Some(found));
        }
        if !found.is_dir || found.first_cluster < 2 {
            return Ok(None);
        }
        ranges = g.dir_chain(dev, found.first_cluster)?;
    }
    Ok(None)
}

/// Points the existing file `path` at the cluster chain `first_cluster` of
/// `size` bytes: its short entry's first cluster and length are rewritten
/// with one 32-byte write (an entry never straddles a sector: the switch is
/// atomic where a disk writes a sector whole). The chain it held before is
/// held by nothing afterwards. The caller syncs.
pub fn point_entry<T: Read + Write + Seek>(
    dev: &mut T,
    path: &str,
    first_cluster: u32,
    size: u64,
) -> Result<()> {
    let g = geometry(dev)?;
    let Some(f) = find(dev, &g, path)? else {
        bail!("{path} does not exist");
    };
    if f.is_dir {
        bail!("{path} is a directory");
    }
    if !g.valid_cluster(first_cluster) {
        bail!("cluster {first_cluster} is outside the volume");
    }
    let size =
        u32::try_from(size).map_err(|_| anyhow::anyhow!("{size} bytes do not fit a FAT file"))?;
    let mut e = [0u8; ENTRY];
    dev.seek(SeekFrom::Start(f.short))?;
    dev.read_exact(&mut e)?;
    set_cluster(&mut e, first_cluster);
    e[28..32].copy_from_slice(&size.to_le_bytes());
    dev.seek(SeekFrom::Start(f.short))?;
    dev.write_all(&e)?;
    dev.flush()?;
    Ok(())
}

/// The first cluster and length of the file `path`, if it exists.
pub fn file_extent<T: Read + Seek>(dev: &mut T, path: &str) -> Result<Option<(u32, u64)>> {
    let g = geometry(dev)?;
    Ok(find(dev, &g, path)?
        .filter(|f| !f.is_dir)
        .map(|f| (f.first_cluster, f.size)))
}

/// Marks the entries of the file `path` deleted (the short entry first,
/// then its long-name entries last to first, as [`remove_file`]) and leaves
/// its clusters allocated: they belong to another entry now (a replacement,
/// see `BootFs::replace`). Returns false when there is no such file. The
/// caller syncs.
pub fn forget_file<D: Device>(dev: &mut D, path: &str) -> Result<bool> {
    let Some((g, f)) = find_file(dev, path)? else {
        return Ok(false);
    };
    mark_deleted(dev, &g, &f)?;
    Ok(true)
}

/// The volume's geometry and the file `path` (not a directory); None when
/// there is no such file.
fn find_file<T: Read + Seek>(dev: &mut T, path: &str) -> Result<Option<(Geometry, Found)>> {
    let g = geometry(dev)?;
    let Some(f) = find(dev, &g, path)? else {
        return Ok(None);
    };
    if f.is_dir {
        bail!("{path} is a directory");
    }
    Ok(Some((g, f)))
}

/// Marks a found file's entries deleted: its short entry first (from then
/// on the file is gone), then its long-name entries from the one next to
/// the short entry back to the first: a cut then leaves the start of the
/// sequence, which fsck.fat deletes by itself as an orphan, never a middle
/// fragment without its start, which it will not correct. One write per
/// sector (a disk writes a sector whole or not at all): the short entry's
/// sector, with the long-name entries in it, then each sector before it,
/// last to first, each after a sync (writes are ordered only by syncs).
/// The last write is not synced: the caller syncs.
fn mark_deleted<D: Device>(dev: &mut D, g: &Geometry, f: &Found) -> Result<()> {
    let sector = g.sector;
    // Sectors in the order they are written, with the entries in each.
    let mut order: Vec<(u64, Vec<u64>)> = Vec::new();
    for at in std::iter::once(f.short).chain(f.long.iter().rev().copied()) {
        let s = at / sector * sector;
        match order.iter_mut().find(|(o, _)| *o == s) {
            Some((_, v)) => v.push(at),
            None => order.push((s, vec![at])),
        }
    }
    let mut buf = vec![0u8; sector as usize];
    for (i, (s, entries)) in order.iter().enumerate() {
        if i > 0 {
            dev.sync()?;
        }
        dev.seek(SeekFrom::Start(*s))?;
        dev.read_exact(&mut buf)?;
        for at in entries {
            buf[(at - s) as usize] = 0xE5;
        }
        dev.seek(SeekFrom::Start(*s))?;
        dev.write_all(&buf)?;
    }
    Ok(())
}

/// Removes the file `path` so that a power cut at any write leaves a
/// consistent filesystem: first its short entry is marked deleted (one
/// sector write: from then on the file is gone), then its long-name
/// entries (last to first, [`mark_deleted`]), then, after a sync, its
/// clusters are freed in every FAT (the changed FAT sectors, contiguous
/// ones in one write: what nothing points to may be freed in any order).
/// A cut between the first write and the last leaves at worst clusters
/// that nothing uses. (fatfs frees the clusters first, which leaves an
/// entry pointing to free clusters that a later file may take.) Returns
/// false when there is no such file. The caller syncs.
pub fn remove_file<D: Device>(dev: &mut D, path: &str) -> Result<bool> {
    let Some((g, f)) = find_file(dev, path)? else {
        return Ok(false);
    };
    if f.first_cluster != 0 && !g.valid_cluster(f.first_cluster) {
        bail!(
            "{path} starts at cluster {}, outside the volume",
            f.first_cluster
        );
    }
    mark_deleted(dev, &g, &f)?;
    if f.first_cluster >= 2 {
        // The chain, from the first FAT.
        let used = ((u64::from(g.clusters) + 2) * g.width()).div_ceil(g.sector) * g.sector;
        let used = used.min(g.fat_len) as usize;
        let mut fat = vec![0u8; used];
        dev.seek(SeekFrom::Start(g.fat_offset))?;
        dev.read_exact(&mut fat)?;
        let width = g.width() as usize;
        let mut chain = Vec::new();
        let mut c = Some(f.first_cluster);
        while let Some(cl) = c {
            if chain.len() > g.clusters as usize {
                bail!("FAT chain of {path} loops");
            }
            chain.push(cl);
            let i = cl as usize * width;
            let v = fat
                .get(i..i + width)
                .map(|e| {
                    let mut b = [0u8; 4];
                    b[..width].copy_from_slice(e);
                    u32::from_le_bytes(b) & 0x0FFF_FFFF
                })
                .ok_or_else(|| anyhow::anyhow!("cluster {cl} is outside the FAT"))?;
            c = g.next_of(cl, v)?;
        }
        // The entry is gone on the disk before any of its clusters is free.
        dev.sync()?;
        for copy in 0..g.fats {
            let base = g.fat_offset + copy * g.fat_len;
            let mut this = vec![0u8; used];
            dev.seek(SeekFrom::Start(base))?;
            dev.read_exact(&mut this)?;
            let before = this.clone();
            for &cl in &chain {
                let i = cl as usize * width;
                this[i..i + width].fill(0);
            }
            write_changed(dev, base, &before, &this, g.sector as usize)?;
        }
    }
    if g.kind == Kind::Fat32 {
        write_fs_info(dev, &g)?;
    }
    dev.flush()?;
    Ok(true)
}
