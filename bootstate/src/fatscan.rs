//! The hand-written FAT reader: the volume's geometry, its FAT, cluster
//! chains and directory entries, every count, size and offset checked
//! against the volume before it is used.
//!
//! [`scan`] walks the whole tree once, bounded by the volume's cluster
//! count: every directory is visited once, every chain ends at an
//! end-of-chain mark within the volume, and no cluster belongs to two files
//! or directories. A volume that passes is what fatfs may be given (fatfs
//! itself follows loops for ever and trusts cross-linked chains), so
//! [`crate::fat::BootFs`] scans before its first use of a volume.
//!
//! The scan also finds *lost* clusters: allocated in the FAT, reached by no
//! directory entry. A power cut while fatfs writes a file leaves them (the
//! entry gets its first cluster last). [`reclaim`] frees them; since no
//! entry points to them, a cut at any of its writes harms nothing.

use anyhow::{Context, Result, bail};
use contract::le::{read_u16, read_u32};
use std::io::{Read, Seek, SeekFrom, Write};

pub(crate) const ENTRY: usize = 32;
pub(crate) const ATTR_LFN: u8 = 0x0F;
pub(crate) const ATTR_DIR: u8 = 0x10;
const ATTR_VOLUME: u8 = 0x08;
pub(crate) const DOT: &[u8; 11] = b".          ";
pub(crate) const DOTDOT: &[u8; 11] = b"..         ";
/// The largest volume scanned, in clusters (its FAT is read into memory:
/// 16 MiB at FAT32).
pub const MAX_CLUSTERS: u32 = 1 << 22;
/// A directory holds at most 65536 entries (the FAT specification).
pub(crate) const MAX_DIR_BYTES: u64 = 65536 * ENTRY as u64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Fat16,
    Fat32,
}

/// Where things are on a FAT volume, checked against its length.
#[derive(Debug, Clone)]
pub(crate) struct Geometry {
    pub kind: Kind,
    /// Number of FAT copies and the length of one, in bytes.
    pub fats: u64,
    pub fat_len: u64,
    pub sector: u64,
    pub cluster_size: u64,
    pub fat_offset: u64,
    /// FAT16: the fixed root directory region (offset, length).
    pub root_region: (u64, u64),
    /// FAT32: first cluster of the root directory.
    pub root_cluster: u32,
    /// FAT32: offset of the FSInfo sector.
    pub fs_info: u64,
    pub data_offset: u64,
    pub clusters: u32,
}

fn le16(b: &[u8], at: usize) -> u64 {
    read_u16(b, at).map_or(0, u64::from)
}

fn le32(b: &[u8], at: usize) -> u64 {
    read_u32(b, at).map_or(0, u64::from)
}

/// Reads and checks the boot sector of the volume on `dev`.
pub(crate) fn geometry<T: Read + Seek>(dev: &mut T) -> Result<Geometry> {
    let len = dev.seek(SeekFrom::End(0))?;
    let mut bs = [0u8; 512];
    dev.seek(SeekFrom::Start(0))?;
    dev.read_exact(&mut bs).context("reading the boot sector")?;
    let bps = le16(&bs, 11);
    let spc = u64::from(bs[13]);
    let reserved = le16(&bs, 14);
    let fats = u64::from(bs[16]);
    let root_entries = le16(&bs, 17);
    let total = match le16(&bs, 19) {
        0 => le32(&bs, 32),
        n => n,
    };
    let spf = match le16(&bs, 22) {
        0 => le32(&bs, 36),
        n => n,
    };
    if ![512, 1024, 2048, 4096].contains(&bps) || !spc.is_power_of_two() {
        bail!("not a FAT boot sector: {bps} bytes per sector, {spc} sectors per cluster");
    }
    if reserved == 0 || !(1..=4).contains(&fats) || spf == 0 || total == 0 {
        bail!(
            "not a FAT boot sector: {reserved} reserved sectors, {fats} FATs of {spf} sectors, \
             {total} sectors"
        );
    }
    if total * bps > len {
        bail!(
            "the FAT volume says it has {} bytes but its partition has {len}",
            total * bps
        );
    }
    let root_sectors = (root_entries * 32).div_ceil(bps);
    let data_sector = reserved + fats * spf + root_sectors;
    if data_sector >= total {
        bail!("the FAT volume's data region starts past its end");
    }
    let clusters = (total - data_sector) / spc;
    let kind = if clusters < 4085 {
        bail!("FAT12 volumes are not supported: make the partition at least 4 MiB")
    } else if clusters < 65525 {
        Kind::Fat16
    } else {
        Kind::Fat32
    };
    if clusters > u64::from(MAX_CLUSTERS) {
        bail!("the FAT volume has {clusters} clusters, more than the {MAX_CLUSTERS} read here");
    }
    let clusters = clusters as u32;
    let width = if kind == Kind::Fat16 { 2 } else { 4 };
    if spf * bps < (u64::from(clusters) + 2) * width {
        bail!(
            "the FAT ({} bytes) is too small for {clusters} clusters",
            spf * bps
        );
    }
    let root_cluster = le32(&bs, 44) as u32;
    let fs_info = le16(&bs, 48);
    // FAT32 may switch mirroring off and name another FAT as the one in
    // use (fatfs then reads that one); we read and write the first.
    let ext_flags = le16(&bs, 40);
    if kind == Kind::Fat32 && ext_flags & 0x80 != 0 && ext_flags & 0x0F != 0 {
        bail!(
            "the FAT32 volume uses FAT {} with mirroring off: only FAT 0 is supported \
             (repair it with fsck.fat -a)",
            ext_flags & 0x0F
        );
    }
    match kind {
        Kind::Fat16 if root_entries == 0 => bail!("the FAT16 volume has no root directory"),
        Kind::Fat32 if !(2..clusters.saturating_add(2)).contains(&root_cluster) => {
            bail!("FAT32 root directory cluster {root_cluster} is out of range")
        }
        Kind::Fat32 if fs_info == 0 || fs_info >= reserved => {
            bail!("FAT32 FSInfo sector {fs_info} is not a reserved sector")
        }
        _ => {}
    }
    Ok(Geometry {
        kind,
        fats,
        fat_len: spf * bps,
        sector: bps,
        cluster_size: bps * spc,
        fat_offset: reserved * bps,
        root_region: ((reserved + fats * spf) * bps, root_sectors * bps),
        root_cluster,
        fs_info: fs_info * bps,
        data_offset: data_sector * bps,
        clusters,
    })
}

impl Geometry {
    /// Whether `c` names a data cluster of this volume.
    pub fn valid_cluster(&self, c: u32) -> bool {
        (2..self.clusters.saturating_add(2)).contains(&c)
    }

    pub fn cluster_offset(&self, c: u32) -> u64 {
        self.data_offset + u64::from(c.saturating_sub(2)) * self.cluster_size
    }

    /// Bytes per FAT entry.
    pub fn width(&self) -> u64 {
        match self.kind {
            Kind::Fat16 => 2,
            Kind::Fat32 => 4,
        }
    }

    /// Offset of cluster `c`'s entry in the first FAT, and its width.
    pub fn fat_entry(&self, c: u32) -> (u64, usize) {
        (
            self.fat_offset + u64::from(c) * self.width(),
            self.width() as usize,
        )
    }

    /// The first cluster named by a directory entry (the high half only on
    /// FAT32, as Linux reads it).
    pub fn first_cluster(&self, e: &[u8]) -> u32 {
        let hi = if self.kind == Kind::Fat32 {
            le16(e, 20) << 16
        } else {
            0
        };
        (hi | le16(e, 26)) as u32
    }

    fn end_mark(&self) -> u32 {
        match self.kind {
            Kind::Fat16 => 0xFFF8,
            Kind::Fat32 => 0x0FFF_FFF8,
        }
    }

    fn bad_mark(&self) -> u32 {
        self.end_mark() - 1
    }

    /// What the FAT says follows `c`: `None` at the end of a chain; an
    /// error for a free, bad, reserved or out-of-range value.
    pub fn next_of(&self, c: u32, v: u32) -> Result<Option<u32>> {
        if v >= self.end_mark() {
            Ok(None)
        } else if self.valid_cluster(v) {
            Ok(Some(v))
        } else {
            bail!("the FAT chain breaks at cluster {c} (next: {v:#x})")
        }
    }

    /// Reads the FAT entry of `c` from the device.
    pub fn next<T: Read + Seek>(&self, dev: &mut T, c: u32) -> Result<Option<u32>> {
        let (at, width) = self.fat_entry(c);
        let mut b = [0u8; 4];
        dev.seek(SeekFrom::Start(at))?;
        dev.read_exact(&mut b[..width])?;
        self.next_of(c, u32::from_le_bytes(b) & 0x0FFF_FFFF)
    }

    /// The byte ranges of a cluster chain, read from the device; a chain
    /// longer than the volume (a loop) is refused.
    pub fn chain<T: Read + Seek>(&self, dev: &mut T, first: u32) -> Result<Vec<(u64, u64)>> {
        self.chain_at_most(dev, first, self.clusters as usize)
    }

    /// The byte ranges of a directory's cluster chain: at most what the
    /// largest directory the FAT specification allows takes
    /// ([`MAX_DIR_BYTES`]), so that a hostile chain cannot make a lookup
    /// read the whole volume into memory.
    pub(crate) fn dir_chain<T: Read + Seek>(
        &self,
        dev: &mut T,
        first: u32,
    ) -> Result<Vec<(u64, u64)>> {
        let most = MAX_DIR_BYTES.div_ceil(self.cluster_size.max(1));
        self.chain_at_most(dev, first, usize::try_from(most).unwrap_or(usize::MAX))
    }

    fn chain_at_most<T: Read + Seek>(
        &self,
        dev: &mut T,
        first: u32,
        most: usize,
    ) -> Result<Vec<(u64, u64)>> {
        if !self.valid_cluster(first) {
            bail!("cluster {first} is out of range");
        }
        let mut out = Vec::new();
        let mut c = Some(first);
        while let Some(cl) = c {
            if out.len() > self.clusters as usize {
                bail!("FAT chain loops at cluster {cl}");
            }
            if out.len() >= most {
                bail!("the chain at cluster {first} is longer than a directory may be");
            }
            out.push((self.cluster_offset(cl), self.cluster_size));
            c = self.next(dev, cl)?;
        }
        Ok(out)
    }

    /// The whole first FAT, one value per cluster number (0 and 1 included).
    fn read_fat<T: Read + Seek>(&self, dev: &mut T) -> Result<Vec<u32>> {
        let n = u64::from(self.clusters) + 2;
        let mut raw = vec![0u8; (n * self.width()) as usize];
        dev.seek(SeekFrom::Start(self.fat_offset))?;
        dev.read_exact(&mut raw).context("reading the FAT")?;
        Ok(match self.kind {
            Kind::Fat16 => raw
                .chunks_exact(2)
                .map(|c| u32::from(u16::from_le_bytes([c[0], c[1]])))
                .collect(),
            Kind::Fat32 => raw
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) & 0x0FFF_FFFF)
                .collect(),
        })
    }
}

/// What [`scan`] found on a volume that holds together.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scan {
    pub kind: Kind,
    pub cluster_size: u64,
    pub clusters: u32,
    /// Clusters marked free in the FAT.
    pub free: u32,
    /// Clusters allocated in the FAT that no directory entry reaches.
    pub lost: Vec<u32>,
    pub files: u32,
    pub dirs: u32,
}

impl Scan {
    /// Bytes a [`reclaim`] would free.
    pub fn lost_bytes(&self) -> u64 {
        self.lost.len() as u64 * self.cluster_size
    }

    /// Free bytes, counting what a [`reclaim`] frees.
    pub fn room(&self) -> u64 {
        (u64::from(self.free) + self.lost.len() as u64) * self.cluster_size
    }
}

/// The walk's state: the FAT and which clusters a file or directory holds.
struct Walk<'a> {
    g: &'a Geometry,
    fat: Vec<u32>,
    used: Vec<bool>,
}

impl Walk<'_> {
    /// Marks the chain from `first` as held by `path`; its length in
    /// clusters. At most `limit` clusters are followed.
    fn claim(&mut self, path: &str, first: u32, limit: u64) -> Result<u64> {
        if !self.g.valid_cluster(first) {
            bail!("{path} starts at cluster {first}, outside the volume");
        }
        let mut n = 0u64;
        let mut c = Some(first);
        while let Some(cl) = c {
            let i = cl as usize;
            if self.used[i] {
                bail!(
                    "{path} reaches cluster {cl}, which another file or directory (or {path} \
                     itself, in a loop) holds: the FAT is cross-linked"
                );
            }
            self.used[i] = true;
            n += 1;
            if n > limit {
                bail!("{path} is longer than {limit} clusters");
            }
            c = self
                .g
                .next_of(cl, self.fat[i])
                .with_context(|| path.to_string())?;
        }
        Ok(n)
    }

    fn read_chain<T: Read + Seek>(&self, dev: &mut T, first: u32) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        let mut c = Some(first);
        while let Some(cl) = c {
            let start = out.len();
            out.resize(start + self.g.cluster_size as usize, 0);
            dev.seek(SeekFrom::Start(self.g.cluster_offset(cl)))?;
            dev.read_exact(&mut out[start..])?;
            c = self.g.next_of(cl, self.fat[cl as usize])?;
        }
        Ok(out)
    }
}

/// The short entries of a directory's bytes that name something: without
/// free, deleted, long-name, `.` and `..` entries. Entries past the end
/// mark (a free entry, first byte 0) are read too: fatfs writes a new entry
/// into that slot without a new end mark after it, which makes whatever
/// follows visible again, so it must hold together as well.
pub(crate) fn entries(dir: &[u8]) -> impl Iterator<Item = &[u8]> {
    dir.chunks_exact(ENTRY).filter(|e| {
        e[0] != 0x00
            && e[0] != 0xE5
            && e[11] & 0x3F != ATTR_LFN
            && &e[..11] != DOT
            && &e[..11] != DOTDOT
    })
}

/// The `.` and `..` entries of a directory (`own` its first cluster, 0 for
/// the root): fatfs follows them when a path goes through them and names
/// them by their long names, so they must not lead anywhere the walk has
/// not been. In a subdirectory `.` must name the directory and `..` its
/// parent (cluster 0 for the root; on FAT32 fatfs writes the root's cluster,
/// which `fatfix::fix_dot_entries` then makes 0, and a cut can leave it so),
/// and a long name on them may only be their own (fatfs writes one,
/// `fix_dot_entries` removes it). The root has none.
fn check_dots(g: &Geometry, dir: &str, bytes: &[u8], own: u32, parent: u32) -> Result<()> {
    let shown = if dir.is_empty() { "/" } else { dir };
    let mut long: Vec<&[u8]> = Vec::new();
    for e in bytes.chunks_exact(ENTRY) {
        if e[0] == 0xE5 || e[0] == 0x00 {
            long.clear();
            continue;
        }
        if e[11] & 0x3F == ATTR_LFN {
            long.push(e);
            continue;
        }
        let lfn = std::mem::take(&mut long);
        let name = if &e[..11] == DOT {
            "."
        } else if &e[..11] == DOTDOT {
            ".."
        } else {
            continue;
        };
        if own == 0 {
            bail!("the root directory has a `{name}` entry");
        }
        let c = g.first_cluster(e);
        let ok = if name == "." {
            c == own
        } else {
            c == parent || (parent == 0 && g.kind == Kind::Fat32 && c == g.root_cluster)
        };
        if !ok {
            bail!(
                "directory {shown}: its `{name}` entry points to cluster {c}, not to the {}",
                if name == "." {
                    "directory itself"
                } else {
                    "parent directory"
                }
            );
        }
        if !lfn.is_empty() && long_name(&lfn) != name {
            bail!(
                "directory {shown}: its `{name}` entry carries the long name {:?}",
                long_name(&lfn)
            );
        }
    }
    Ok(())
}

/// The name a run of long-name entries spells (they are stored last part
/// first).
fn long_name(run: &[&[u8]]) -> String {
    let units: Vec<u16> = run
        .iter()
        .rev()
        .flat_map(|e| {
            [1..11, 14..26, 28..32].into_iter().flat_map(move |r| {
                e[r].chunks_exact(2)
                    .map(|c| u16::from_le_bytes([c[0], c[1]]))
            })
        })
        .take_while(|u| *u != 0)
        .collect();
    String::from_utf16_lossy(&units)
}

/// The short (8.3) name of an entry, for messages.
fn short_name(e: &[u8]) -> String {
    let part = |r: std::ops::Range<usize>| {
        String::from_utf8_lossy(&e[r])
            .trim_end()
            .chars()
            .map(|c| if c.is_ascii_graphic() { c } else { '?' })
            .collect::<String>()
    };
    let (base, ext) = (part(0..8), part(8..11));
    if ext.is_empty() {
        base
    } else {
        format!("{base}.{ext}")
    }
}

/// Walks the volume on `dev` (see the module documentation). Refuses a
/// volume that contradicts itself, saying what is wrong.
pub fn scan<T: Read + Seek>(dev: &mut T) -> Result<Scan> {
    let g = geometry(dev)?;
    let fat = g.read_fat(dev)?;
    let mut w = Walk {
        g: &g,
        used: vec![false; fat.len()],
        fat,
    };
    let dir_limit = MAX_DIR_BYTES.div_ceil(g.cluster_size);
    if g.kind == Kind::Fat32 {
        w.claim("the root directory", g.root_cluster, dir_limit)?;
    }
    let (mut files, mut dirs) = (0u32, 0u32);
    // (path, first cluster, its parent's): 0 for the root. A directory's
    // entries are read when it is walked, one directory at a time.
    let mut todo = vec![(String::new(), 0u32, 0u32)];
    while let Some((dir, own, parent)) = todo.pop() {
        let bytes = match (own, g.kind) {
            (0, Kind::Fat16) => {
                let (at, len) = g.root_region;
                let mut b = vec![0u8; len as usize];
                dev.seek(SeekFrom::Start(at))?;
                dev.read_exact(&mut b)
                    .context("reading the root directory")?;
                b
            }
            (0, Kind::Fat32) => w.read_chain(dev, g.root_cluster)?,
            (c, _) => w.read_chain(dev, c)?,
        };
        check_dots(&g, &dir, &bytes, own, parent)?;
        for e in entries(&bytes) {
            let attr = e[11];
            if attr & ATTR_VOLUME != 0 && attr & ATTR_DIR == 0 {
                continue;
            }
            let path = format!("{dir}/{}", short_name(e));
            let first = g.first_cluster(e);
            if attr & ATTR_DIR != 0 {
                w.claim(&format!("directory {path}"), first, dir_limit)?;
                dirs += 1;
                todo.push((path, first, own));
            } else {
                let size = le32(e, 28);
                files += 1;
                if first == 0 {
                    if size != 0 {
                        bail!("file {path} of {size} bytes has no clusters");
                    }
                    continue;
                }
                let need = size.div_ceil(g.cluster_size);
                let n = w.claim(&format!("file {path}"), first, u64::from(g.clusters))?;
                if n < need {
                    bail!(
                        "file {path} is {size} bytes but its clusters hold {}",
                        n * g.cluster_size
                    );
                }
            }
        }
    }
    let bad = g.bad_mark();
    let mut free = 0;
    let mut lost = Vec::new();
    for c in 2..w.fat.len() {
        match w.fat[c] {
            0 => free += 1,
            v if v == bad => {}
            _ if !w.used[c] => lost.push(c as u32),
            _ => {}
        }
    }
    Ok(Scan {
        kind: g.kind,
        cluster_size: g.cluster_size,
        clusters: g.clusters,
        free,
        lost,
        files,
        dirs,
    })
}

/// Frees the lost clusters of `scan` (made on this `dev`, unchanged since)
/// in the first FAT, and makes every other FAT copy equal to the first, one
/// sector at a time. Returns the number of clusters freed. The caller
/// syncs. On FAT32 the FSInfo counts follow.
pub fn reclaim<T: Read + Write + Seek>(dev: &mut T, scan: &Scan) -> Result<usize> {
    let g = geometry(dev)?;
    if g.clusters != scan.clusters {
        bail!("internal: the scan is of another volume");
    }
    // The part of the FAT that maps the volume's clusters (fat_len may be
    // larger, up to the partition: never read more than the clusters need).
    let used = ((u64::from(g.clusters) + 2) * g.width()).div_ceil(g.sector) * g.sector;
    let mut fat = vec![0u8; used.min(g.fat_len) as usize];
    dev.seek(SeekFrom::Start(g.fat_offset))?;
    dev.read_exact(&mut fat).context("reading the FAT")?;
    for &c in &scan.lost {
        let (at, width) = g.fat_entry(c);
        let i = (at - g.fat_offset) as usize;
        fat[i..i + width].fill(0);
    }
    let mut sector = vec![0u8; g.sector as usize];
    for copy in 0..g.fats {
        let base = g.fat_offset + copy * g.fat_len;
        for (k, want) in fat.chunks(g.sector as usize).enumerate() {
            let at = base + (k as u64) * g.sector;
            dev.seek(SeekFrom::Start(at))?;
            dev.read_exact(&mut sector[..want.len()])?;
            if sector[..want.len()] != *want {
                dev.seek(SeekFrom::Start(at))?;
                dev.write_all(want)?;
            }
        }
    }
    if g.kind == Kind::Fat32 && !scan.lost.is_empty() {
        crate::fatfix::write_fs_info(dev, &g)?;
    }
    dev.flush()?;
    Ok(scan.lost.len())
}

#[cfg(test)]
mod tests;
