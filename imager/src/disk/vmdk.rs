//! The stream-optimised VMDK: the disk of the outputs `vmware` (inside the
//! OVA, [`super::ova`]) and `aws` (`aws.vmdk`), and the reader that turns
//! one back into a raw disk for `imager boot`, `inspect` and `verify`.
//!
//! The format is VMware's *Virtual Disk Format 5.0* ("Stream-Optimized
//! Compressed Sparse Extents"); QEMU's `block/vmdk.c` reads and writes the
//! same. A stream-optimised extent is written front to back, once, so that
//! it can be uploaded while it is made:
//!
//! 1. the sparse extent header (512 bytes, `KDMV`), its grain directory
//!    offset `GD_AT_END` (the directory comes last);
//! 2. the embedded descriptor (text, in whole sectors);
//! 3. for each grain (64 KiB, 128 sectors) of the disk that holds anything
//!    but zeros, in disk order: a grain marker (the grain's first sector,
//!    the compressed length), the grain compressed with zlib (RFC 1950),
//!    zeros to the next sector;
//! 4. every grain table (512 entries: the sector of each grain's marker, 0
//!    for a grain of zeros), each after a metadata marker of type 1;
//! 5. the grain directory (the sector of each grain table), after a marker
//!    of type 2;
//! 6. a footer marker (type 3), the header again with the directory's
//!    offset filled in, and the end-of-stream marker (type 0).
//!
//! Grains are compressed on every core in batches and written in order: the
//! bytes do not depend on the number of threads. Memory is one batch (16
//! MiB) and the grain tables, kept until the end: 4 bytes per grain, 64 KiB
//! per GiB of disk.
//!
//! The reader ([`unpack`]) follows the markers from the start of a stream,
//! as an importer does; it never seeks, so it reads a VMDK from inside a tar
//! (the OVA). Every field is checked before it is used: a grain's sector
//! inside the disk and after the one before, a compressed length at most
//! twice a grain, a grain that inflates to at most a grain, a table or
//! directory of a bounded size; what is wrong is said in the error.

use crate::io::AtomicFile;
use anyhow::{Context, Result, bail};
use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;

/// The magic number at the start of a sparse extent: `KDMV`.
pub const MAGIC: [u8; 4] = *b"KDMV";
const SECTOR: u64 = 512;
/// The writer's grains: 128 sectors, 64 KiB (VMware's and QEMU's).
const GRAIN_SECTORS: u64 = 128;
const GRAIN: u64 = GRAIN_SECTORS * SECTOR;
/// Entries of a grain table.
const GTES_PER_GT: u64 = 512;
/// A grain table's length in sectors.
const GT_SECTORS: u64 = GTES_PER_GT * 4 / SECTOR;
/// Flags: newline detection valid (bit 0), compressed grains (16), markers
/// (17). No redundant directory: a stream has one.
const FLAGS: u32 = 1 | 1 << 16 | 1 << 17;
const FLAG_COMPRESSED: u32 = 1 << 16;
const FLAG_MARKERS: u32 = 1 << 17;
/// The header's directory offset when the directory is in the footer.
const GD_AT_END: u64 = u64::MAX;
/// Compression algorithm 1: deflate, as zlib streams.
const DEFLATE: u16 = 1;
/// Metadata marker types.
const MARKER_EOS: u32 = 0;
const MARKER_GT: u32 = 1;
const MARKER_GD: u32 = 2;
const MARKER_FOOTER: u32 = 3;
/// The zlib level of the grains (6, zlib's default, as QEMU's).
const ZLIB_LEVEL: u32 = 6;
/// Grains compressed together, one share per thread (16 MiB).
const BATCH: usize = 256;
/// The largest virtual disk the reader takes.
const MAX_SIZE: u64 = super::MAX_DISK_SIZE;
/// `ddb.adapterType` of the VMDKs we write: LSI Logic, what VMware and
/// AWS's examples name (an OVA's controller is its descriptor's).
pub const ADAPTER: &str = "lsilogic";
// The grains are read by qcow2's cluster walk: they must be its clusters.
const _: () = assert!(GRAIN == super::qcow2::CLUSTER);
/// The most sectors before the first grain the reader skips (header and
/// descriptor): 32 MiB.
const MAX_OVERHEAD: u64 = 1 << 16;
/// The largest grain the reader takes: 1 MiB.
const MAX_GRAIN_SECTORS: u64 = 2048;
/// The largest grain table or directory the reader skips: 64 MiB.
const MAX_METADATA_SECTORS: u64 = 1 << 17;

/// What goes into the embedded descriptor besides the disk's size.
#[derive(Debug, Clone, Copy)]
pub struct Descriptor<'a> {
    /// The disk's identity (the disk GUID): the content ids.
    pub id: [u8; 16],
    /// The file name the extent line names (the file itself).
    pub file_name: &'a str,
    /// `ddb.adapterType`: the controller the disk was made for.
    pub adapter: &'a str,
}

impl Descriptor<'_> {
    /// The descriptor's text for a disk of `sectors` sectors.
    fn text(&self, sectors: u64) -> String {
        let cid = u32::from_be_bytes([self.id[0], self.id[1], self.id[2], self.id[3]]);
        // The BIOS geometry every VMware disk names: 255 heads, 63 sectors.
        let cylinders = (sectors / (255 * 63)).clamp(1, 65535);
        format!(
            "# Disk DescriptorFile\n\
             version=1\n\
             encoding=\"UTF-8\"\n\
             CID={cid:08x}\n\
             parentCID=ffffffff\n\
             createType=\"streamOptimized\"\n\
             \n\
             # Extent description\n\
             RW {sectors} SPARSE \"{name}\"\n\
             \n\
             # The Disk Data Base\n\
             #DDB\n\
             \n\
             ddb.adapterType = \"{adapter}\"\n\
             ddb.geometry.cylinders = \"{cylinders}\"\n\
             ddb.geometry.heads = \"255\"\n\
             ddb.geometry.sectors = \"63\"\n\
             ddb.longContentID = \"{long}\"\n\
             ddb.virtualHWVersion = \"4\"\n",
            name = self.file_name,
            adapter = self.adapter,
            long = hex::encode(self.id),
        )
    }
}

/// The sparse extent header (also the footer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Header {
    version: u32,
    flags: u32,
    capacity: u64,
    grain_sectors: u64,
    descriptor_offset: u64,
    descriptor_sectors: u64,
    gtes_per_gt: u32,
    gd_offset: u64,
    overhead: u64,
    compression: u16,
}

impl Header {
    fn encode(&self) -> [u8; 512] {
        let mut h = [0u8; 512];
        h[0..4].copy_from_slice(&MAGIC);
        h[4..8].copy_from_slice(&self.version.to_le_bytes());
        h[8..12].copy_from_slice(&self.flags.to_le_bytes());
        h[12..20].copy_from_slice(&self.capacity.to_le_bytes());
        h[20..28].copy_from_slice(&self.grain_sectors.to_le_bytes());
        h[28..36].copy_from_slice(&self.descriptor_offset.to_le_bytes());
        h[36..44].copy_from_slice(&self.descriptor_sectors.to_le_bytes());
        h[44..48].copy_from_slice(&self.gtes_per_gt.to_le_bytes());
        // 48..56: the redundant directory's offset, none.
        h[56..64].copy_from_slice(&self.gd_offset.to_le_bytes());
        h[64..72].copy_from_slice(&self.overhead.to_le_bytes());
        // 72: unclean shutdown, no. The newline test characters:
        h[73..77].copy_from_slice(b"\n \r\n");
        h[77..79].copy_from_slice(&self.compression.to_le_bytes());
        h
    }

    fn decode(h: &[u8; 512]) -> Result<Header> {
        if h[0..4] != MAGIC {
            bail!("not a VMDK sparse extent (no KDMV magic)");
        }
        let u32_at = |i: usize| u32::from_le_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]);
        let u64_at = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&h[i..i + 8]);
            u64::from_le_bytes(b)
        };
        Ok(Header {
            version: u32_at(4),
            flags: u32_at(8),
            capacity: u64_at(12),
            grain_sectors: u64_at(20),
            descriptor_offset: u64_at(28),
            descriptor_sectors: u64_at(36),
            gtes_per_gt: u32_at(44),
            gd_offset: u64_at(56),
            overhead: u64_at(64),
            compression: u16::from_le_bytes([h[77], h[78]]),
        })
    }
}

/// A metadata marker: `val` (a length in sectors), size 0, its type.
fn marker(val: u64, kind: u32) -> [u8; 512] {
    let mut m = [0u8; 512];
    m[0..8].copy_from_slice(&val.to_le_bytes());
    m[12..16].copy_from_slice(&kind.to_le_bytes());
    m
}

/// Writes `dest`, the stream-optimised VMDK of the raw disk `raw` (see the
/// module documentation), under a temporary name renamed when complete.
pub fn write_vmdk(raw: &Path, dest: &Path, d: &Descriptor) -> Result<()> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    write_vmdk_threads(raw, dest, d, threads)
}

/// [`write_vmdk`] on `threads` threads (the bytes do not depend on it).
pub fn write_vmdk_threads(raw: &Path, dest: &Path, d: &Descriptor, threads: usize) -> Result<()> {
    let mut src = File::open(raw).with_context(|| format!("opening {}", raw.display()))?;
    let size = src.metadata()?.len();
    if size == 0 || size > MAX_SIZE || !size.is_multiple_of(SECTOR) {
        bail!(
            "{} is {size} bytes: a VMDK is made of a disk of whole 512-byte sectors, at most \
             64 TiB",
            raw.display()
        );
    }
    let sectors = size / SECTOR;
    let text = d.text(sectors);
    let descriptor_sectors = (text.len() as u64).div_ceil(SECTOR);
    let header = Header {
        version: 3,
        flags: FLAGS,
        capacity: sectors,
        grain_sectors: GRAIN_SECTORS,
        descriptor_offset: 1,
        descriptor_sectors,
        gtes_per_gt: GTES_PER_GT as u32,
        gd_offset: GD_AT_END,
        // The first grain on a grain boundary, as VMware's, QEMU's and
        // VirtualBox's writers place it.
        overhead: (1 + descriptor_sectors).next_multiple_of(GRAIN_SECTORS),
        compression: DEFLATE,
    };
    let grains = size.div_ceil(GRAIN);
    let mut gt = vec![0u32; grains.next_multiple_of(GTES_PER_GT) as usize];

    let mut out = AtomicFile::create(dest)?;
    let werr = || format!("writing {}", dest.display());
    let mut w = Sectors {
        w: std::io::BufWriter::with_capacity(1 << 20, out.file()),
        at: 0,
    };
    w.put(&header.encode()).with_context(werr)?;
    w.put(text.as_bytes()).with_context(werr)?;
    while w.at < header.overhead {
        w.put(&[0u8; 512]).with_context(werr)?;
    }

    let mut batch: Vec<(u64, Vec<u8>)> = Vec::with_capacity(BATCH);
    let mut flush = |batch: &mut Vec<(u64, Vec<u8>)>, w: &mut Sectors<_>| -> Result<()> {
        for (grain, z) in compress_all(batch, threads)? {
            gt[grain as usize] = u32::try_from(w.at)
                .map_err(|_| anyhow::anyhow!("the VMDK passed 2 TiB: grain offsets are 32-bit"))?;
            let mut m = Vec::with_capacity(12 + z.len());
            m.extend_from_slice(&(grain * GRAIN_SECTORS).to_le_bytes());
            m.extend_from_slice(&(z.len() as u32).to_le_bytes());
            m.extend_from_slice(&z);
            w.put(&m).with_context(werr)?;
        }
        batch.clear();
        Ok(())
    };
    let mut buf = vec![0u8; GRAIN as usize];
    super::qcow2::data_clusters(&mut src, size, &mut buf, |c, bytes| {
        batch.push((c, bytes.to_vec()));
        if batch.len() == BATCH {
            flush(&mut batch, &mut w)?;
        }
        Ok(())
    })
    .with_context(|| format!("reading {}", raw.display()))?;
    flush(&mut batch, &mut w)?;

    let mut gd = Vec::with_capacity(gt.len() / GTES_PER_GT as usize * 4);
    for table in gt.chunks(GTES_PER_GT as usize) {
        w.put(&marker(GT_SECTORS, MARKER_GT)).with_context(werr)?;
        gd.extend_from_slice(
            &u32::try_from(w.at)
                .map_err(|_| anyhow::anyhow!("the VMDK passed 2 TiB: table offsets are 32-bit"))?
                .to_le_bytes(),
        );
        let bytes: Vec<u8> = table.iter().flat_map(|e| e.to_le_bytes()).collect();
        w.put(&bytes).with_context(werr)?;
    }
    w.put(&marker((gd.len() as u64).div_ceil(SECTOR), MARKER_GD))
        .with_context(werr)?;
    let gd_offset = w.at;
    w.put(&gd).with_context(werr)?;
    w.put(&marker(1, MARKER_FOOTER)).with_context(werr)?;
    w.put(
        &Header {
            gd_offset,
            ..header
        }
        .encode(),
    )
    .with_context(werr)?;
    w.put(&marker(0, MARKER_EOS)).with_context(werr)?;
    w.w.flush().with_context(werr)?;
    drop(w);
    out.commit().with_context(werr)?;
    Ok(())
}

/// A writer that pads what it is given to whole sectors and counts them.
struct Sectors<W> {
    w: W,
    /// The next sector.
    at: u64,
}

impl<W: Write> Sectors<W> {
    fn put(&mut self, b: &[u8]) -> std::io::Result<()> {
        self.w.write_all(b)?;
        let pad = (b.len() as u64).next_multiple_of(SECTOR) - b.len() as u64;
        self.w.write_all(&[0u8; 512][..pad as usize])?;
        self.at += (b.len() as u64).div_ceil(SECTOR);
        Ok(())
    }
}

/// The grains of `batch` compressed, in order, on up to `threads` threads.
fn compress_all(batch: &[(u64, Vec<u8>)], threads: usize) -> Result<Vec<(u64, Vec<u8>)>> {
    let share = batch.len().div_ceil(threads.max(1)).max(1);
    std::thread::scope(|s| {
        let workers: Vec<_> = batch
            .chunks(share)
            .map(|part| {
                s.spawn(move || {
                    part.iter()
                        .map(|(i, g)| Ok((*i, zlib(g)?)))
                        .collect::<std::io::Result<Vec<_>>>()
                })
            })
            .collect();
        let mut all = Vec::with_capacity(batch.len());
        for w in workers {
            let part = w
                .join()
                .map_err(|_| anyhow::anyhow!("a compressing thread panicked"))?
                .context("compressing a grain")?;
            all.extend(part);
        }
        Ok(all)
    })
}

fn zlib(b: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut z = flate2::write::ZlibEncoder::new(
        Vec::with_capacity(b.len() / 2),
        flate2::Compression::new(ZLIB_LEVEL),
    );
    z.write_all(b)?;
    z.finish()
}

/// Reads exactly `buf.len()` bytes, or says the stream ended early.
fn read_exact(r: &mut dyn Read, buf: &mut [u8], what: &str) -> Result<()> {
    r.read_exact(buf).map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            anyhow::anyhow!("the VMDK ends inside {what}: truncated")
        } else {
            anyhow::Error::new(e).context(format!("reading {what}"))
        }
    })
}

/// Skips `sectors` sectors of `r`.
fn skip(r: &mut dyn Read, sectors: u64, what: &str) -> Result<()> {
    let n = std::io::copy(&mut r.take(sectors * SECTOR), &mut std::io::sink())
        .with_context(|| format!("reading {what}"))?;
    if n != sectors * SECTOR {
        bail!("the VMDK ends inside {what}: truncated");
    }
    Ok(())
}

/// Reads the stream-optimised VMDK `r` from its first byte to its
/// end-of-stream marker and writes the disk it holds into `out` (sparse:
/// grains of zeros are not written); returns the disk's size.
pub fn unpack(r: &mut dyn Read, out: &File) -> Result<u64> {
    let mut h = [0u8; 512];
    read_exact(r, &mut h, "the header")?;
    let h = Header::decode(&h)?;
    if !(1..=3).contains(&h.version) {
        bail!(
            "VMDK version {} is not one this reader knows (1 to 3)",
            h.version
        );
    }
    if h.flags & (FLAG_COMPRESSED | FLAG_MARKERS) != FLAG_COMPRESSED | FLAG_MARKERS {
        bail!(
            "the VMDK is not stream-optimised (no compressed grains with markers): convert it \
             with `qemu-img convert -O raw` and give the raw disk"
        );
    }
    if h.compression != DEFLATE {
        bail!(
            "the VMDK's grains use compression {}, not deflate (1)",
            h.compression
        );
    }
    if !h.grain_sectors.is_power_of_two() || !(8..=MAX_GRAIN_SECTORS).contains(&h.grain_sectors) {
        bail!(
            "the VMDK's grains are {} sectors: a power of two from 8 to {MAX_GRAIN_SECTORS} \
             is expected",
            h.grain_sectors
        );
    }
    if h.capacity == 0 || h.capacity > MAX_SIZE / SECTOR {
        bail!(
            "the VMDK's disk is {} sectors: more than 0 and at most 64 TiB are expected",
            h.capacity
        );
    }
    if !(1..=MAX_OVERHEAD).contains(&h.overhead) {
        bail!(
            "the VMDK's grains start at sector {}: 1 to {MAX_OVERHEAD} are expected",
            h.overhead
        );
    }
    let size = h.capacity * SECTOR;
    let grain = (h.grain_sectors * SECTOR) as usize;
    skip(r, h.overhead - 1, "the descriptor")?;
    let mut z = Vec::with_capacity(2 * grain);
    let mut data = vec![0u8; grain + 1];
    let mut next = 0u64; // the lowest sector the next grain may start at
    loop {
        let mut m = [0u8; 12];
        read_exact(r, &mut m, "a marker")?;
        let val = u64::from_le_bytes(m[0..8].try_into().unwrap_or_default());
        let len = u32::from_le_bytes(m[8..12].try_into().unwrap_or_default()) as usize;
        if len == 0 {
            let mut rest = [0u8; 500];
            read_exact(r, &mut rest, "a marker")?;
            let kind = u32::from_le_bytes(rest[0..4].try_into().unwrap_or_default());
            match kind {
                MARKER_EOS => break,
                // Grain tables, the directory, the footer, and the types
                // newer writers add: skipped, within a bound.
                _ if val <= MAX_METADATA_SECTORS => {
                    skip(r, val, "a grain table, the directory or the footer")?;
                }
                k => bail!("a VMDK metadata marker (type {k}) says {val} sectors follow: too many"),
            }
            continue;
        }
        if val % h.grain_sectors != 0 || val < next || val >= h.capacity {
            bail!(
                "a VMDK grain at sector {val}: grains start on a grain boundary, inside the \
                 disk ({} sectors), after the one before",
                h.capacity
            );
        }
        if len > 2 * grain {
            bail!("a VMDK grain of {len} compressed bytes: more than twice a grain");
        }
        z.resize(len, 0);
        read_exact(r, &mut z, "a grain")?;
        let mut d = flate2::read::ZlibDecoder::new(&z[..]);
        let n = bootstate::blank::read_full(&mut d, &mut data)
            .with_context(|| format!("inflating the VMDK grain at sector {val}"))?;
        if n > grain {
            bail!("the VMDK grain at sector {val} inflates to more than a grain");
        }
        let at = val * SECTOR;
        let n = (n as u64).min(size - at) as usize;
        if !super::compress::is_zero(&data[..n]) {
            out.write_all_at(&data[..n], at)
                .context("writing the unpacked disk")?;
        }
        next = val + h.grain_sectors;
        let pad = (12 + len as u64).next_multiple_of(SECTOR) - (12 + len as u64);
        let mut p = [0u8; 512];
        read_exact(r, &mut p[..pad as usize], "a grain's padding")?;
    }
    out.set_len(size).context("writing the unpacked disk")?;
    Ok(size)
}

#[cfg(test)]
mod tests;
