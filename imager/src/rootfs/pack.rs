//! Compressed blocks kept from earlier builds, so that a root filesystem
//! built again compresses only the blocks that changed.
//!
//! A pack is one file in the cache directory, named by everything that
//! decides a block's compressed bytes besides the block itself: the pack's
//! format and compressor settings, zstd's version, the level and the block
//! size ([`file_name`], for example `v1-zstd-1.5.4-l15-b131072.pack`). It holds zstd's output for blocks of
//! the squashfs (file data and fragment blocks), keyed by the SHA-256 of
//! their uncompressed bytes:
//!
//! | part   | bytes                                                        |
//! |--------|--------------------------------------------------------------|
//! | data   | the compressed blocks, one after another                     |
//! | index  | 44 per block: SHA-256 of the input, offset (u64 LE), length (u32 LE); sorted by SHA-256, no key twice |
//! | footer | 24: the index's offset (u64 LE), the number of blocks (u64 LE), `IMGSQPK1` |
//!
//! A block found in the pack is used only if it is one whole zstd frame
//! that decompresses to exactly the bytes asked for ([`Pack::get`]): a
//! damaged pack costs time, never a wrong image. The bytes used are those
//! zstd gave for that input at that level when the pack was written, which
//! are the bytes it gives now: the pack's name carries the pack's format
//! and compressor settings, zstd's version and the level. So an image is
//! the same with a pack written by this program or without it (tested).
//! (A pack crafted to hold another encoding of the same bytes would give
//! another image that reads the same: the cache directory is trusted as
//! the kernel cache is.)
//!
//! Each build writes a new pack ([`Writer`], atomically): the blocks that
//! build used first, then the old pack's other blocks, most recent first,
//! up to [`MAX_PACK`] bytes. The pack thus holds the blocks of the last
//! builds, whatever profile they were of, and never grows past the bound.
//! A pack that cannot be read or written never fails a build: the blocks
//! are then compressed.

use crate::io::AtomicFile;
use anyhow::{Context, Result};
use sha2::{Digest, Sha256};
use std::collections::BTreeSet;
use std::fs::File;
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// The most a pack holds (data bytes): about five builds of the default
/// root filesystem. Each build copies what it keeps of the old pack.
pub const MAX_PACK: u64 = 16 << 20;

const MAGIC: &[u8; 8] = b"IMGSQPK1";
const FOOTER: u64 = 24;
const ENTRY: u64 = 44;
/// The most blocks an index lists (the writer stops there too).
pub const MAX_ENTRIES: u64 = MAX_PACK / 1024 + 1;
/// The largest pack file: its data, a whole index and the footer.
pub const MAX_FILE: u64 = MAX_PACK + MAX_ENTRIES * ENTRY + FOOTER;
/// A temporary pack older than this is one a killed build left.
const STALE: std::time::Duration = std::time::Duration::from_secs(3600);

/// The SHA-256 of a block's uncompressed bytes.
pub type Key = [u8; 32];

/// The key of `input`.
pub fn key(input: &[u8]) -> Key {
    Sha256::digest(input).into()
}

/// One block of a pack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub key: Key,
    pub offset: u64,
    pub len: u32,
}

/// The pack's file name for blocks of `block_size` bytes compressed at
/// zstd `level` by the zstd this program is linked with.
pub fn file_name(level: i32, block_size: u32) -> String {
    let version = zstd::zstd_safe::version_string();
    format!("v{FORMAT}-zstd-{version}-l{level}-b{block_size}.pack")
}

/// The pack's format and the compressor's settings besides the level
/// (`zstd::bulk::Compressor::new(level)`, nothing else set): a change to
/// either takes a new number, so that an older pack is never used.
const FORMAT: u32 = 1;

/// The largest compressed block a pack may hold for blocks of
/// `block_size` bytes (zstd's bound for an incompressible block, which is
/// a little more than the block).
fn max_block(block_size: u32) -> u64 {
    u64::from(block_size) + u64::from(block_size) / 128 + 1024
}

/// Reads a pack's index. `len` is the file's length; `read_at` fills a
/// buffer from an offset. Whatever the bytes, the entries returned lie
/// within the data part, are at most `max_block(block_size)` long, and are
/// sorted by key without a key twice; anything else is an error.
pub fn parse_index(
    len: u64,
    block_size: u32,
    read_at: &mut dyn FnMut(u64, &mut [u8]) -> io::Result<()>,
) -> io::Result<Vec<Entry>> {
    let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidData, format!("pack: {what}"));
    if len < FOOTER {
        return Err(bad("shorter than its footer"));
    }
    let mut footer = [0u8; FOOTER as usize];
    read_at(len - FOOTER, &mut footer)?;
    if &footer[16..24] != MAGIC {
        return Err(bad("no footer"));
    }
    let word = |b: &[u8]| u64::from_le_bytes(b.try_into().expect("8 bytes"));
    let (index_at, count) = (word(&footer[..8]), word(&footer[8..16]));
    let index_len = len - FOOTER;
    if count > MAX_ENTRIES || index_at > index_len || index_len - index_at != count * ENTRY {
        return Err(bad("index out of place"));
    }
    let mut index = vec![0u8; (count * ENTRY) as usize];
    read_at(index_at, &mut index)?;
    let mut entries: Vec<Entry> = Vec::with_capacity(count as usize);
    for e in index.chunks_exact(ENTRY as usize) {
        let entry = Entry {
            key: e[..32].try_into().expect("32 bytes"),
            offset: word(&e[32..40]),
            len: u32::from_le_bytes(e[40..44].try_into().expect("4 bytes")),
        };
        let end = entry.offset.checked_add(u64::from(entry.len));
        if entry.len == 0
            || u64::from(entry.len) > max_block(block_size)
            || end.is_none_or(|end| end > index_at)
        {
            return Err(bad("a block out of place"));
        }
        if entries.last().is_some_and(|last| last.key >= entry.key) {
            return Err(bad("index not sorted"));
        }
        entries.push(entry);
    }
    Ok(entries)
}

/// The index and footer that follow `data_len` bytes of blocks described
/// by `entries` (sorted here by key).
pub fn index_and_footer(entries: &mut [Entry], data_len: u64) -> Vec<u8> {
    entries.sort_by_key(|e| e.key);
    let mut tail = Vec::with_capacity(entries.len() * ENTRY as usize + FOOTER as usize);
    for e in entries.iter() {
        tail.extend_from_slice(&e.key);
        tail.extend_from_slice(&e.offset.to_le_bytes());
        tail.extend_from_slice(&e.len.to_le_bytes());
    }
    tail.extend_from_slice(&data_len.to_le_bytes());
    tail.extend_from_slice(&(entries.len() as u64).to_le_bytes());
    tail.extend_from_slice(MAGIC);
    tail
}

/// A pack read back: its index, and its file for the blocks.
pub struct Pack {
    file: File,
    entries: Vec<Entry>,
    block_size: u32,
}

impl Pack {
    /// The pack at `path`, or none when there is none or it does not read
    /// as one (it is then replaced by the next build's).
    pub fn open(path: &Path, block_size: u32) -> Option<Pack> {
        let file = File::open(path).ok()?;
        let len = file.metadata().ok()?.len();
        let entries =
            parse_index(len, block_size, &mut |at, buf| file.read_exact_at(buf, at)).ok()?;
        Some(Pack {
            file,
            entries,
            block_size,
        })
    }

    /// The blocks it holds, in the order of their keys.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// The compressed bytes kept for `input` (whose key is `key`), if the
    /// pack holds them and they decompress to exactly `input`.
    /// What is kept must also be one zstd frame, whole: one that
    /// decompresses right with something after it is not what was written.
    pub fn get(&self, key: &Key, input: &[u8]) -> Option<Vec<u8>> {
        let i = self.entries.binary_search_by(|e| e.key.cmp(key)).ok()?;
        let bytes = self.read(&self.entries[i]).ok()?;
        let frame = zstd::zstd_safe::find_frame_compressed_size(&bytes).ok()?;
        if frame != bytes.len() {
            return None;
        }
        let back = zstd::bulk::decompress(&bytes, self.block_size as usize).ok()?;
        (back == input).then_some(bytes)
    }

    fn read(&self, e: &Entry) -> io::Result<Vec<u8>> {
        let mut buf = vec![0u8; e.len as usize];
        self.file.read_exact_at(&mut buf, e.offset)?;
        Ok(buf)
    }
}

/// The next pack, written as the build goes.
pub struct Writer {
    out: AtomicFile,
    entries: Vec<Entry>,
    keys: BTreeSet<Key>,
    at: u64,
}

impl Writer {
    /// Starts the pack that will replace the one at `path` (and removes
    /// the temporaries of killed builds beside it).
    pub fn create(path: &Path) -> Result<Writer> {
        if let Some(dir) = path.parent() {
            remove_stale(dir);
        }
        Ok(Writer {
            out: AtomicFile::create(path)?,
            entries: Vec::new(),
            keys: BTreeSet::new(),
            at: 0,
        })
    }

    /// Adds a block, unless the pack holds it already or is full.
    pub fn add(&mut self, key: Key, bytes: &[u8]) -> io::Result<()> {
        if self.at + bytes.len() as u64 > MAX_PACK
            || self.entries.len() as u64 >= MAX_ENTRIES
            || !self.keys.insert(key)
        {
            return Ok(());
        }
        self.out.write_all(bytes)?;
        self.entries.push(Entry {
            key,
            offset: self.at,
            len: bytes.len() as u32,
        });
        self.at += bytes.len() as u64;
        Ok(())
    }

    /// The bytes of blocks added so far.
    pub fn used(&self) -> u64 {
        self.at
    }

    /// Adds `old`'s other blocks, most recent first, while they fit; writes
    /// the index and renames the pack into place.
    pub fn finish(mut self, old: Option<&Pack>) -> Result<PathBuf> {
        if let Some(old) = old {
            let mut rest: Vec<&Entry> = old.entries().iter().collect();
            rest.sort_by_key(|e| e.offset);
            for e in rest {
                if self.at + u64::from(e.len) > MAX_PACK {
                    break;
                }
                let bytes = old.read(e).context("reading the old block pack")?;
                self.add(e.key, &bytes)?;
            }
        }
        let tail = index_and_footer(&mut self.entries, self.at);
        self.out.write_all(&tail)?;
        // Not flushed: a pack lost or cut by a power cut reads as none, or
        // its damaged blocks are not used.
        self.out.commit_unflushed()
    }
}

/// Writes at `dest` a pack of the first `used` bytes of blocks of the
/// pack at `src` (a build's own blocks: [`Writer`] puts them first). For
/// the shared build cache ([`crate::remote_cache`]).
pub fn first_blocks(src: &Path, block_size: u32, used: u64, dest: &Path) -> Result<usize> {
    let pack = Pack::open(src, block_size)
        .with_context(|| format!("{} is not a block pack", src.display()))?;
    let mut mine: Vec<&Entry> = pack.entries().iter().filter(|e| e.offset < used).collect();
    mine.sort_by_key(|e| e.offset);
    let mut w = Writer::create(dest)?;
    for e in &mine {
        w.add(e.key, &pack.read(e).context("reading the block pack")?)?;
    }
    w.finish(None)?;
    Ok(mine.len())
}

/// Puts the blocks of the pack at `pulled` first in the pack at `local`
/// (its other blocks after them, as a build's writer keeps them): how
/// blocks pulled from the shared build cache are used. The number of
/// blocks pulled; a pack that does not read as one adds none.
pub fn merge(pulled: &Path, local: &Path, block_size: u32) -> Result<usize> {
    let Some(new) = Pack::open(pulled, block_size) else {
        return Ok(0);
    };
    let old = Pack::open(local, block_size);
    let mut blocks: Vec<&Entry> = new.entries().iter().collect();
    blocks.sort_by_key(|e| e.offset);
    let mut w = Writer::create(local)?;
    for e in &blocks {
        w.add(
            e.key,
            &new.read(e).context("reading the pulled block pack")?,
        )?;
    }
    w.finish(old.as_ref())?;
    Ok(blocks.len())
}

/// Removes the temporary packs (`.NAME.*.partial`) in `dir` older than
/// [`STALE`]: a build killed while writing its pack leaves one. A younger
/// one may be another build's, still being written.
fn remove_stale(dir: &Path) {
    let old = |e: &std::fs::DirEntry| {
        e.metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > STALE)
    };
    let _ = crate::io::remove_partials(dir, |e, name| name.contains(".pack.") && old(e));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(seed: u8) -> Vec<u8> {
        (0..20_000u32)
            .map(|i| (i % 97) as u8 ^ seed)
            .collect::<Vec<u8>>()
    }

    fn write(path: &Path, blocks: &[Vec<u8>], old: Option<&Pack>) {
        let mut w = Writer::create(path).unwrap();
        for b in blocks {
            w.add(key(b), &zstd::bulk::compress(b, 3).unwrap()).unwrap();
        }
        w.finish(old).unwrap();
    }

    /// What the shared build cache sends: a build's own blocks (the first
    /// `used` bytes), and what it receives: a pulled pack put first in
    /// the local one, whose other blocks stay after it.
    #[test]
    fn a_builds_own_blocks_are_taken_out_and_pulled_ones_merged_first() {
        let dir = tempfile::tempdir().unwrap();
        let local = dir.path().join("local.pack");
        write(&local, &[block(1), block(2)], None);
        let old = Pack::open(&local, 131072).unwrap();
        // This build's: block 3 (used), then the old pack's 1 and 2.
        let mut w = Writer::create(&local).unwrap();
        w.add(key(&block(3)), &zstd::bulk::compress(&block(3), 3).unwrap())
            .unwrap();
        let used = w.used();
        w.finish(Some(&old)).unwrap();
        drop(old);
        let sent = dir.path().join("sent.pack");
        assert_eq!(first_blocks(&local, 131072, used, &sent).unwrap(), 1);
        let p = Pack::open(&sent, 131072).unwrap();
        assert_eq!(p.entries().len(), 1);
        assert!(p.get(&key(&block(3)), &block(3)).is_some());

        // Another machine's pack of blocks 4 and 5, merged into this one's.
        let pulled = dir.path().join("pulled.pack");
        write(&pulled, &[block(4), block(5)], None);
        assert_eq!(merge(&pulled, &local, 131072).unwrap(), 2);
        let p = Pack::open(&local, 131072).unwrap();
        assert_eq!(p.entries().len(), 5);
        for s in 1..=5 {
            assert!(p.get(&key(&block(s)), &block(s)).is_some(), "block {s}");
        }
        // The pulled blocks first.
        let mut by_offset: Vec<&Entry> = p.entries().iter().collect();
        by_offset.sort_by_key(|e| e.offset);
        assert_eq!(by_offset[0].key, key(&block(4)));
        assert_eq!(by_offset[1].key, key(&block(5)));
        // A pulled file that is not a pack adds nothing and keeps the local.
        std::fs::write(&pulled, b"not a pack").unwrap();
        assert_eq!(merge(&pulled, &local, 131072).unwrap(), 0);
        assert_eq!(Pack::open(&local, 131072).unwrap().entries().len(), 5);
    }

    #[test]
    fn blocks_come_back_and_older_ones_follow() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(file_name(3, 131072));
        assert!(Pack::open(&path, 131072).is_none());
        write(&path, &[block(1), block(2)], None);
        let p = Pack::open(&path, 131072).unwrap();
        assert_eq!(p.entries().len(), 2);
        let got = p.get(&key(&block(1)), &block(1)).unwrap();
        assert_eq!(zstd::bulk::decompress(&got, 131072).unwrap(), block(1));
        assert!(p.get(&key(&block(3)), &block(3)).is_none());
        // A key whose block is not the input asked for is not used.
        assert!(p.get(&key(&block(1)), &block(2)).is_none());

        // The next pack: its own blocks, then the old one's others.
        write(&path, &[block(3), block(2)], Some(&p));
        drop(p);
        let p = Pack::open(&path, 131072).unwrap();
        assert_eq!(p.entries().len(), 3);
        for s in [1, 2, 3] {
            assert!(p.get(&key(&block(s)), &block(s)).is_some(), "block {s}");
        }
    }

    #[test]
    fn a_damaged_pack_gives_nothing_wrong() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.pack");
        write(&path, &[block(1), block(2)], None);
        let good = std::fs::read(&path).unwrap();
        // A changed byte in a block: that block is not used, the other is.
        let mut bytes = good.clone();
        bytes[20] ^= 0x40;
        std::fs::write(&path, &bytes).unwrap();
        let p = Pack::open(&path, 131072).unwrap();
        let found = [1, 2].map(|s| p.get(&key(&block(s)), &block(s)).is_some());
        assert_eq!(found.iter().filter(|f| **f).count(), 1, "{found:?}");
        // Cut anywhere, or its footer or index changed: no pack.
        for cut in [0, 10, good.len() - 1, good.len() - 30] {
            std::fs::write(&path, &good[..cut]).unwrap();
            assert!(Pack::open(&path, 131072).is_none(), "cut at {cut}");
        }
        // The footer's magic, count or index offset changed: no pack.
        for at in [good.len() - 1, good.len() - 10, good.len() - 20] {
            let mut bytes = good.clone();
            bytes[at] ^= 1;
            std::fs::write(&path, &bytes).unwrap();
            assert!(Pack::open(&path, 131072).is_none(), "byte {at}");
        }
        // The last key changed (its top byte, so the index stays sorted):
        // that block is no longer found, the other still is.
        let last_key = good.len() - 24 - 44;
        let mut bytes = good.clone();
        bytes[last_key] = 0xff;
        std::fs::write(&path, &bytes).unwrap();
        let p = Pack::open(&path, 131072).unwrap();
        let found = [1, 2].map(|s| p.get(&key(&block(s)), &block(s)).is_some());
        assert_eq!(found.iter().filter(|f| **f).count(), 1, "{found:?}");
    }

    #[test]
    fn a_pack_of_many_small_blocks_stays_readable() {
        // Blocks of a few bytes: the index's bound is reached before the
        // data's, and the pack still reads.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.pack");
        let mut w = Writer::create(&path).unwrap();
        for i in 0..MAX_ENTRIES + 100 {
            w.add(key(&i.to_le_bytes()), &i.to_le_bytes()).unwrap();
        }
        w.finish(None).unwrap();
        let p = Pack::open(&path, 131072).expect("a full pack reads");
        assert_eq!(p.entries().len() as u64, MAX_ENTRIES);
    }

    #[test]
    fn a_frame_with_bytes_after_it_is_not_used() {
        // zstd's decompressor takes a frame followed by a skippable frame:
        // that is not what a build kept, and is not used.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.pack");
        let b = block(7);
        let mut bytes = zstd::bulk::compress(&b, 3).unwrap();
        assert_eq!(zstd::bulk::decompress(&bytes, 131072).unwrap(), b);
        bytes.extend_from_slice(&[0x50, 0x2a, 0x4d, 0x18, 1, 0, 0, 0, 0xee]);
        assert_eq!(zstd::bulk::decompress(&bytes, 131072).unwrap(), b);
        let mut w = Writer::create(&path).unwrap();
        w.add(key(&b), &bytes).unwrap();
        w.finish(None).unwrap();
        assert!(
            Pack::open(&path, 131072)
                .unwrap()
                .get(&key(&b), &b)
                .is_none()
        );
    }

    #[test]
    fn temporaries_of_killed_builds_are_removed_when_old() {
        let dir = tempfile::tempdir().unwrap();
        let old = dir.path().join(".v1-x.pack.AbCdEf.partial");
        let young = dir.path().join(".v1-x.pack.GhIjKl.partial");
        let other = dir.path().join(".grub.img.MnOpQr.partial");
        for p in [&old, &young, &other] {
            std::fs::write(p, b"partial").unwrap();
        }
        for p in [&old, &other] {
            std::fs::File::options()
                .write(true)
                .open(p)
                .unwrap()
                .set_modified(std::time::SystemTime::now() - 2 * STALE)
                .unwrap();
        }
        Writer::create(&dir.path().join("x.pack")).unwrap();
        assert!(!old.exists());
        assert!(young.exists() && other.exists());
    }

    #[test]
    fn the_pack_stays_under_its_bound() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.pack");
        // Incompressible blocks of 128 KiB, more than the bound holds.
        let n = (MAX_PACK / 131072 + 20) as usize;
        let mut w = Writer::create(&path).unwrap();
        let mut state = 1u64;
        for _ in 0..n {
            let b: Vec<u8> = (0..131072)
                .map(|_| {
                    state = state.wrapping_mul(6364136223846793005).wrapping_add(1);
                    (state >> 56) as u8
                })
                .collect();
            w.add(key(&b), &b).unwrap();
        }
        w.finish(None).unwrap();
        let len = std::fs::metadata(&path).unwrap().len();
        assert!(len <= MAX_PACK + MAX_ENTRIES * ENTRY + FOOTER, "{len}");
        assert!(len > MAX_PACK - 131072 * 2, "{len}");
    }
}
