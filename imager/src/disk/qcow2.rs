//! The output `qcow2` (`disk.qcow2`): the raw disk as a QEMU copy-on-write
//! image, version 3, and a read-only reader of such images for `imager
//! boot`, `inspect` and `verify`.
//!
//! The writer ([`write_qcow2`]) makes 64 KiB clusters, no backing file, no
//! snapshots, no compression, no encryption, 16-bit refcounts. Its layout is
//! computed before the first byte is written, from the raw disk's data
//! extents (SEEK_DATA/SEEK_HOLE): a cluster holding only zeros is left out
//! (it reads as zeros, as an unallocated cluster does), and the file is
//! written in one pass, in this order:
//!
//! 1. the header (cluster 0; no header extensions);
//! 2. the refcount table, then the refcount blocks (every cluster of the
//!    file has refcount 1, so they are a run of ones);
//! 3. the L1 table;
//! 4. for each 512 MiB of the disk that holds data, its L2 table followed by
//!    its data clusters, in disk order.
//!
//! The raw disk is read twice (once to find the clusters that are not all
//! zeros and count them per L2 table, once to copy them); memory is a few
//! clusters and one counter per 512 MiB, whatever the disk's size.
//!
//! The reader ([`Qcow2`]) is `Read + Seek` over the virtual disk, so that the
//! GPT and BIOS checks read it as they read a raw disk. It takes any
//! version 2 or 3 image without a backing file, encryption, compressed
//! clusters or incompatible features; every offset and size in the file is
//! checked before it is used, and what is wrong is said in the error.

use crate::io::{AtomicFile, data_extents};
use anyhow::{Context, Result, bail};
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::Path;

/// The magic number at the start of every qcow2 image: `QFI\xfb`.
pub const MAGIC: [u8; 4] = *b"QFI\xfb";
/// The writer's clusters: 64 KiB (QEMU's default).
const CLUSTER_BITS: u32 = 16;
pub(super) const CLUSTER: u64 = 1 << CLUSTER_BITS;
/// The version 3 header's length without optional fields.
const HEADER_LEN: u32 = 104;
/// An L1 or L2 entry's offset bits (9..=55).
const OFFSET_MASK: u64 = 0x00ff_ffff_ffff_fe00;
/// The entry's cluster is used by this image only (refcount 1).
const COPIED: u64 = 1 << 63;
/// An L2 entry's cluster is compressed.
const COMPRESSED: u64 = 1 << 62;
/// A version 3 L2 entry that reads as zeros.
const ZERO: u64 = 1;
/// The largest L1 table the reader takes, as QEMU: 32 MiB.
const MAX_L1_BYTES: u64 = 32 << 20;
/// The largest virtual disk the reader takes.
const MAX_SIZE: u64 = super::MAX_DISK_SIZE;

/// Whether `path` starts with the qcow2 magic.
pub fn is_qcow2(path: &Path) -> Result<bool> {
    let mut f = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut m = [0u8; 4];
    let n = bootstate::blank::read_full(&mut f, &mut m)
        .with_context(|| format!("reading {}", path.display()))?;
    Ok(n == 4 && m == MAGIC)
}

/// Where everything of the image goes, in clusters.
#[derive(Debug, PartialEq)]
struct Plan {
    size: u64,
    l1_entries: u64,
    refcount_table: u64,
    refcount_table_clusters: u64,
    refcount_blocks: u64,
    l1_table: u64,
    /// For each L1 entry, the number of data clusters under it (0: no L2).
    per_l2: Vec<u64>,
    /// The first cluster after the L1 table: the first L2 table.
    first_l2: u64,
    total: u64,
}

/// Refcounts per refcount block: 16-bit refcounts in a cluster.
const REFCOUNTS_PER_BLOCK: u64 = CLUSTER / 2;
/// Entries per L2 table (and per refcount table cluster).
const L2_ENTRIES: u64 = CLUSTER / 8;

impl Plan {
    fn new(size: u64, per_l2: Vec<u64>) -> Plan {
        let l1_entries = per_l2.len() as u64;
        let l1_clusters = (l1_entries * 8).div_ceil(CLUSTER).max(1);
        let l2s = per_l2.iter().filter(|&&n| n > 0).count() as u64;
        let data: u64 = per_l2.iter().sum();
        let (mut rt, mut rb) = (1u64, 1u64);
        loop {
            let total = 1 + rt + rb + l1_clusters + l2s + data;
            let need_rb = total.div_ceil(REFCOUNTS_PER_BLOCK);
            let need_rt = (need_rb * 8).div_ceil(CLUSTER);
            if (need_rb, need_rt) == (rb, rt) {
                return Plan {
                    size,
                    l1_entries,
                    refcount_table: 1,
                    refcount_table_clusters: rt,
                    refcount_blocks: rb,
                    l1_table: 1 + rt + rb,
                    first_l2: 1 + rt + rb + l1_clusters,
                    per_l2,
                    total,
                };
            }
            (rb, rt) = (need_rb.max(rb), need_rt.max(rt));
        }
    }

    fn header(&self) -> Vec<u8> {
        let mut h = vec![0u8; HEADER_LEN as usize + 8];
        let mut put = |at: usize, v: &[u8]| h[at..at + v.len()].copy_from_slice(v);
        put(0, &MAGIC);
        put(4, &3u32.to_be_bytes());
        // backing file offset and size: 0 (none)
        put(20, &CLUSTER_BITS.to_be_bytes());
        put(24, &self.size.to_be_bytes());
        // crypt method: 0 (none)
        put(36, &(self.l1_entries as u32).to_be_bytes());
        put(40, &(self.l1_table * CLUSTER).to_be_bytes());
        put(48, &(self.refcount_table * CLUSTER).to_be_bytes());
        put(56, &(self.refcount_table_clusters as u32).to_be_bytes());
        // snapshots: none; incompatible, compatible, autoclear features: none
        put(96, &4u32.to_be_bytes()); // refcount_order: 16-bit refcounts
        put(100, &HEADER_LEN.to_be_bytes());
        // then the end-of-extensions marker (type 0, length 0): zeros
        h
    }
}

/// Reads the cluster `index` of `src` (a disk of `size` bytes) into `buf`,
/// zeros past the end; whether it holds anything but zeros.
fn read_cluster(src: &mut File, size: u64, index: u64, buf: &mut [u8]) -> io::Result<bool> {
    let start = index * CLUSTER;
    let n = (size - start).min(CLUSTER) as usize;
    src.seek(SeekFrom::Start(start))?;
    src.read_exact(&mut buf[..n])?;
    buf[n..].fill(0);
    Ok(!super::compress::is_zero(buf))
}

/// Calls `each` with the index of every cluster of `src` that holds
/// something but zeros, in order, and the cluster's bytes in `buf`.
pub(super) fn data_clusters(
    src: &mut File,
    size: u64,
    buf: &mut [u8],
    mut each: impl FnMut(u64, &[u8]) -> Result<()>,
) -> Result<()> {
    let mut next = 0u64; // the first cluster not yet read
    for ext in data_extents(src, size)? {
        let first = (ext.start / CLUSTER).max(next);
        let end = ext.end.div_ceil(CLUSTER);
        for c in first..end {
            if read_cluster(src, size, c, buf)? {
                each(c, buf)?;
            }
        }
        next = next.max(end);
    }
    Ok(())
}

/// Writes `dest`, the qcow2 image of the raw disk `raw` (see the module
/// documentation), under a temporary name renamed when complete.
pub fn write_qcow2(raw: &Path, dest: &Path) -> Result<()> {
    let mut src = File::open(raw).with_context(|| format!("opening {}", raw.display()))?;
    let size = src.metadata()?.len();
    // QEMU takes a qcow2's size in whole 512-byte sectors (it drops a
    // partial one): a disk of ours is always a whole number of them.
    if size == 0 || size > MAX_SIZE || !size.is_multiple_of(512) {
        bail!(
            "{} is {size} bytes: a qcow2 is made of a disk of whole 512-byte sectors, \
             at most 64 TiB",
            raw.display()
        );
    }
    let mut buf = vec![0u8; CLUSTER as usize];
    let mut per_l2 = vec![0u64; size.div_ceil(CLUSTER * L2_ENTRIES) as usize];
    data_clusters(&mut src, size, &mut buf, |c, _| {
        per_l2[(c / L2_ENTRIES) as usize] += 1;
        Ok(())
    })
    .with_context(|| format!("reading {}", raw.display()))?;
    let plan = Plan::new(size, per_l2);

    let mut out = AtomicFile::create(dest)?;
    let f = out.file();
    let werr = || format!("writing {}", dest.display());
    f.set_len(plan.total * CLUSTER).with_context(werr)?;
    f.write_all(&plan.header()).with_context(werr)?;
    // The refcount table: one entry per refcount block, which follow it.
    let mut rt = Vec::with_capacity(plan.refcount_blocks as usize * 8);
    for b in 0..plan.refcount_blocks {
        rt.extend_from_slice(
            &((plan.refcount_table + plan.refcount_table_clusters + b) * CLUSTER).to_be_bytes(),
        );
    }
    f.seek(SeekFrom::Start(plan.refcount_table * CLUSTER))?;
    f.write_all(&rt).with_context(werr)?;
    // The refcount blocks: 1 for each of the image's clusters.
    for b in 0..plan.refcount_blocks {
        let first = b * REFCOUNTS_PER_BLOCK;
        let ones = plan.total.saturating_sub(first).min(REFCOUNTS_PER_BLOCK) as usize;
        let mut block = vec![0u8; CLUSTER as usize];
        for r in block.chunks_exact_mut(2).take(ones) {
            r.copy_from_slice(&1u16.to_be_bytes());
        }
        f.seek(SeekFrom::Start(
            (plan.refcount_table + plan.refcount_table_clusters + b) * CLUSTER,
        ))?;
        f.write_all(&block).with_context(werr)?;
    }
    // The L1 table, and where each L2 table and its data go.
    let mut l2_at = Vec::with_capacity(plan.per_l2.len());
    let mut at = plan.first_l2;
    let mut l1 = Vec::with_capacity(plan.per_l2.len() * 8);
    for &n in &plan.per_l2 {
        if n == 0 {
            l2_at.push(0);
            l1.extend_from_slice(&0u64.to_be_bytes());
        } else {
            l2_at.push(at);
            l1.extend_from_slice(&((at * CLUSTER) | COPIED).to_be_bytes());
            at += 1 + n;
        }
    }
    f.seek(SeekFrom::Start(plan.l1_table * CLUSTER))?;
    f.write_all(&l1).with_context(werr)?;
    // Each L2 table's data clusters, then the table itself before them.
    let mut l2 = vec![0u8; CLUSTER as usize];
    let mut current: Option<u64> = None; // the L1 index of `l2`
    let mut next_data = 0u64;
    let flush = |f: &mut File, l1i: u64, l2: &mut [u8]| -> Result<()> {
        f.seek(SeekFrom::Start(l2_at[l1i as usize] * CLUSTER))?;
        f.write_all(l2).with_context(werr)?;
        l2.fill(0);
        Ok(())
    };
    let mut written = 0u64;
    data_clusters(&mut src, size, &mut buf, |c, data| {
        let l1i = c / L2_ENTRIES;
        if current != Some(l1i) {
            if let Some(prev) = current {
                flush(f, prev, &mut l2)?;
            }
            current = Some(l1i);
            next_data = l2_at[l1i as usize] + 1;
        }
        let slot = (c % L2_ENTRIES) as usize * 8;
        l2[slot..slot + 8].copy_from_slice(&((next_data * CLUSTER) | COPIED).to_be_bytes());
        f.seek(SeekFrom::Start(next_data * CLUSTER))?;
        f.write_all(data).with_context(werr)?;
        next_data += 1;
        written += 1;
        Ok(())
    })
    .with_context(|| format!("copying {} into {}", raw.display(), dest.display()))?;
    if let Some(prev) = current {
        flush(f, prev, &mut l2)?;
    }
    if written != plan.per_l2.iter().sum::<u64>() {
        bail!(
            "{} changed while {} was written from it",
            raw.display(),
            dest.display()
        );
    }
    out.commit().with_context(werr)?;
    Ok(())
}

/// The header fields the reader uses.
#[derive(Debug, Clone, PartialEq)]
pub struct Header {
    pub version: u32,
    pub cluster_bits: u32,
    /// The virtual disk's size in bytes.
    pub size: u64,
    pub l1_entries: u64,
    pub l1_table_offset: u64,
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn be64(b: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

impl Header {
    /// Parses and checks the header at the start of an image file of
    /// `file_len` bytes.
    pub fn parse(h: &[u8], file_len: u64) -> Result<Header> {
        if h.len() < 72 {
            bail!(
                "qcow2: the file is {} bytes, shorter than a header",
                h.len()
            );
        }
        if h[..4] != MAGIC {
            bail!("qcow2: no QFI\\xfb magic: not a qcow2 image");
        }
        let version = be32(h, 4);
        if version != 2 && version != 3 {
            bail!("qcow2: version {version}: only versions 2 and 3 are read");
        }
        if be64(h, 8) != 0 || be32(h, 16) != 0 {
            bail!("qcow2: the image has a backing file: only standalone images are read");
        }
        let cluster_bits = be32(h, 20);
        if !(9..=21).contains(&cluster_bits) {
            bail!("qcow2: cluster_bits {cluster_bits} is outside 9..=21");
        }
        let size = be64(h, 24);
        if size > MAX_SIZE {
            bail!("qcow2: a virtual size of {size} bytes is more than the 64 TiB read");
        }
        let crypt = be32(h, 32);
        if crypt != 0 {
            bail!("qcow2: encrypted (method {crypt}): not read");
        }
        let l1_entries = u64::from(be32(h, 36));
        let l1_table_offset = be64(h, 40);
        if version == 3 {
            if h.len() < HEADER_LEN as usize {
                bail!(
                    "qcow2: the file is {} bytes, shorter than a version 3 header",
                    h.len()
                );
            }
            let incompatible = be64(h, 72);
            if incompatible != 0 {
                bail!(
                    "qcow2: incompatible features {incompatible:#x} (dirty, corrupt, external \
                     data, compression type or extended L2): not read"
                );
            }
            let refcount_order = be32(h, 96);
            if refcount_order > 6 {
                bail!("qcow2: refcount_order {refcount_order} is more than 6");
            }
            let header_length = be32(h, 100);
            if header_length < HEADER_LEN {
                bail!("qcow2: header_length {header_length} is less than 104");
            }
        }
        let cluster = 1u64 << cluster_bits;
        let per_l2 = cluster / 8;
        let need = size.div_ceil(cluster).div_ceil(per_l2);
        if l1_entries < need {
            bail!(
                "qcow2: an L1 table of {l1_entries} entries does not cover {size} bytes \
                 ({need} needed)"
            );
        }
        if l1_entries * 8 > MAX_L1_BYTES {
            bail!("qcow2: an L1 table of {l1_entries} entries is more than 32 MiB");
        }
        if need > 0 {
            if !l1_table_offset.is_multiple_of(cluster) {
                bail!("qcow2: the L1 table offset {l1_table_offset} is not cluster-aligned");
            }
            if l1_table_offset
                .checked_add(need * 8)
                .is_none_or(|end| end > file_len)
            {
                bail!(
                    "qcow2: the L1 table ({need} entries at {l1_table_offset}) lies past the \
                     end of the {file_len}-byte file"
                );
            }
        }
        Ok(Header {
            version,
            cluster_bits,
            size,
            l1_entries,
            l1_table_offset,
        })
    }
}

/// A read-only view of a qcow2 image's virtual disk: reads as the raw disk
/// it holds (unallocated and zero clusters as zeros).
pub struct Qcow2<R> {
    inner: R,
    pub header: Header,
    file_len: u64,
    pos: u64,
    /// The L2 table last read: its L1 index and entries.
    l2: Option<(u64, Vec<u64>)>,
}

impl Qcow2<File> {
    /// Opens the qcow2 image `path`.
    pub fn open(path: &Path) -> Result<Qcow2<File>> {
        let f = File::open(path).with_context(|| format!("opening {}", path.display()))?;
        Qcow2::new(f).with_context(|| format!("reading {}", path.display()))
    }
}

impl<R: Read + Seek> Qcow2<R> {
    /// Reads and checks the header of the image `inner`.
    pub fn new(mut inner: R) -> Result<Qcow2<R>> {
        let file_len = inner.seek(SeekFrom::End(0))?;
        inner.seek(SeekFrom::Start(0))?;
        let mut h = [0u8; HEADER_LEN as usize];
        let n = bootstate::blank::read_full(&mut inner, &mut h)?;
        let header = Header::parse(&h[..n], file_len)?;
        Ok(Qcow2 {
            inner,
            header,
            file_len,
            pos: 0,
            l2: None,
        })
    }

    /// The virtual disk's size in bytes.
    pub fn size(&self) -> u64 {
        self.header.size
    }

    fn cluster(&self) -> u64 {
        1 << self.header.cluster_bits
    }

    fn read_at(&mut self, at: u64, buf: &mut [u8]) -> io::Result<()> {
        if at
            .checked_add(buf.len() as u64)
            .is_none_or(|e| e > self.file_len)
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "qcow2: {} bytes at {at} lie past the end of the {}-byte file",
                    buf.len(),
                    self.file_len
                ),
            ));
        }
        self.inner.seek(SeekFrom::Start(at))?;
        self.inner.read_exact(buf)
    }

    /// Where the virtual cluster `index`'s data is in the file, or `None`
    /// when it reads as zeros.
    fn locate(&mut self, index: u64) -> io::Result<Option<u64>> {
        let bad = |m: String| io::Error::new(io::ErrorKind::InvalidData, format!("qcow2: {m}"));
        let cluster = self.cluster();
        let per_l2 = cluster / 8;
        let (l1i, l2i) = (index / per_l2, index % per_l2);
        if self.l2.as_ref().is_none_or(|(i, _)| *i != l1i) {
            let mut e = [0u8; 8];
            self.read_at(self.header.l1_table_offset + l1i * 8, &mut e)?;
            let entry = u64::from_be_bytes(e);
            let l2_offset = entry & OFFSET_MASK;
            if l2_offset == 0 {
                self.l2 = Some((l1i, Vec::new()));
            } else {
                if !l2_offset.is_multiple_of(cluster) {
                    return Err(bad(format!(
                        "L1 entry {l1i} points to {l2_offset}, not a cluster boundary"
                    )));
                }
                let mut raw = vec![0u8; cluster as usize];
                self.read_at(l2_offset, &mut raw).map_err(|e| {
                    bad(format!(
                        "the L2 table of L1 entry {l1i} at {l2_offset}: {e}"
                    ))
                })?;
                let table = raw.chunks_exact(8).map(|c| be64(c, 0)).collect();
                self.l2 = Some((l1i, table));
            }
        }
        let Some((_, table)) = &self.l2 else {
            unreachable!("set above")
        };
        let Some(&entry) = table.get(l2i as usize) else {
            return Ok(None);
        };
        if entry & COMPRESSED != 0 {
            return Err(bad(format!(
                "cluster {index} is compressed: compressed clusters are not read"
            )));
        }
        let offset = entry & OFFSET_MASK;
        if offset == 0 || (self.header.version == 3 && entry & ZERO != 0) {
            return Ok(None);
        }
        if !offset.is_multiple_of(cluster) {
            return Err(bad(format!(
                "the L2 entry of cluster {index} points to {offset}, not a cluster boundary"
            )));
        }
        Ok(Some(offset))
    }
}

impl<R: Read + Seek> Read for Qcow2<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let size = self.header.size;
        if self.pos >= size || buf.is_empty() {
            return Ok(0);
        }
        let cluster = self.cluster();
        let within = self.pos % cluster;
        let n = (buf.len() as u64)
            .min(cluster - within)
            .min(size - self.pos) as usize;
        match self.locate(self.pos / cluster)? {
            None => buf[..n].fill(0),
            Some(at) => self.read_at(at + within, &mut buf[..n])?,
        }
        self.pos += n as u64;
        Ok(n)
    }
}

impl<R: Read + Seek> Seek for Qcow2<R> {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        let new = match to {
            SeekFrom::Start(n) => Some(n),
            SeekFrom::End(d) => self.header.size.checked_add_signed(d),
            SeekFrom::Current(d) => self.pos.checked_add_signed(d),
        };
        match new {
            Some(n) => {
                self.pos = n;
                Ok(n)
            }
            None => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "seek before the start of the disk",
            )),
        }
    }
}

#[cfg(test)]
mod tests;
