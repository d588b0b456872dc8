//! The squashfs writer: the layout of mksquashfs 4.5.1, byte for byte.
//!
//! Given the same tree, zstd level, block size, time and zstd library,
//! this writes the bytes of `mksquashfs TREE OUT -comp zstd
//! -Xcompression-level L -noappend -all-root -no-xattrs -mkfs-time E
//! -all-time E` (tested against mksquashfs itself). What it takes from
//! mksquashfs, decision by decision:
//!
//! - **Order.** Every directory's entries sorted by name (bytes). Inode
//!   numbers in pre-order (a directory's entries, each followed by its
//!   subtree), the root last; the root's parent is one more. File data in
//!   the same pre-order. Inodes are made depth first: a file's when its data
//!   is written, a directory's after all of its entries.
//! - **Data.** A file shorter than a block and not all zeros goes into the
//!   current fragment block, which is written when the next one does not
//!   fit (and at the end). Any other file is cut into blocks; an all-zero
//!   block is a hole (size 0). A block is stored compressed if zstd makes it
//!   smaller, as it is otherwise (bit 24).
//! - **Duplicates.** A file whose blocks are those of an earlier file
//!   (holes match holes) points at that file's blocks; a short file equal
//!   to an earlier short file points at its fragment. Found by SHA-256 here
//!   (mksquashfs compares the bytes); the same files match. A short file of
//!   zeros (a hole, not a fragment) is matched as mksquashfs's hash lists
//!   happen to match it: only when a short file of its length went into a
//!   fragment before, and then with the last such zero file not itself a
//!   match ([`Planner::plan_zeros`]).
//! - **Inodes.** Extended file inodes for a file with holes that its
//!   source stores sparsely too (the inode counts the holes), or data past
//!   4 GiB. Extended directory inodes (with an
//!   index) for directories of 257 entries or more, or whose entries take
//!   8 KiB. Directory headers as mksquashfs cuts them (256 entries, one
//!   inode block, inode numbers within 32767, an index point every 8 KiB).
//! - **Tables** in mksquashfs's order (inodes, directories, fragments, the
//!   NFS export table, ids), metadata blocks of 8 KiB compressed at the
//!   same level, no xattrs, one id (root). A compression-options block only
//!   for a level other than zstd's default 15. Padded to 4 KiB.
//!
//! - **Hard links.** The names of one file or symbolic link (the caller
//!   says which: [`Entry::link`]) share its inode (extended, with the number of names), its
//!   number is the first name's, its data is written once.
//!
//! Not done: owners other than root, xattrs, device nodes, fifos and
//! sockets (the trees given here have none).
//!
//! The data blocks are compressed on `threads` workers ahead of the writer
//! (at most [`WINDOW`] queued) and written in order, so the image does not
//! depend on the thread count; with a pack of earlier builds' blocks
//! ([`super::pack`]) a block found there is taken instead of compressed.

use super::Source;
use super::pack::{self, Pack};
use anyhow::{Context, Result, bail, ensure};
use std::collections::{HashMap, HashSet};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::sync::mpsc::{Receiver, Sender, SyncSender, channel, sync_channel};
use std::sync::{Arc, Mutex};

/// Blocks compressed ahead of the writer, at most.
pub const WINDOW: usize = 32;

const METADATA_SIZE: usize = 8192;
const SUPERBLOCK_SIZE: u64 = 96;
const MAGIC: u32 = 0x7371_7368;
const ZSTD: u16 = 6;
/// zstd's level when none is given, for mksquashfs: no options block.
const ZSTD_DEFAULT_LEVEL: i32 = 15;
const DATA_UNCOMPRESSED: u32 = 1 << 24;
const META_UNCOMPRESSED: u16 = 1 << 15;
const INVALID_FRAGMENT: u32 = u32::MAX;
const INVALID_XATTR: u32 = u32::MAX;
const INVALID_TABLE: u64 = u64::MAX;
const FLAG_DUPLICATES: u16 = 1 << 6;
const FLAG_EXPORTABLE: u16 = 1 << 7;
const FLAG_NO_XATTRS: u16 = 1 << 9;
const FLAG_COMPRESSOR_OPTIONS: u16 = 1 << 10;
const DIR_TYPE: u16 = 1;
const FILE_TYPE: u16 = 2;
const SYMLINK_TYPE: u16 = 3;
const LDIR_TYPE: u16 = 8;
const LREG_TYPE: u16 = 9;
/// Longest name a directory entry holds.
const NAME_LEN: usize = 256;

/// What a path is.
#[derive(Debug, Clone, Copy)]
pub enum Kind<'a> {
    Dir,
    File(&'a Source),
    /// A symbolic link and its target.
    Symlink(&'a [u8]),
}

/// One path of the tree (relative: `usr/bin/x`; its parent listed too).
#[derive(Debug, Clone, Copy)]
pub struct Entry<'a> {
    pub path: &'a str,
    /// Permission bits (0o7777 at most).
    pub mode: u16,
    pub kind: Kind<'a>,
    /// The (device, inode) of a file or symbolic link with several names
    /// in the tree (hard links): its names share one inode.
    pub link: Option<(u64, u64)>,
}

/// How to write it.
#[derive(Debug, Clone, Copy)]
pub struct Options<'a> {
    pub level: i32,
    pub block_size: u32,
    /// Every inode's mtime, and the superblock's.
    pub mtime: u32,
    pub root_mode: u16,
    pub threads: usize,
    /// A directory holding the pack of earlier builds' blocks.
    pub cache: Option<&'a Path>,
}

/// How the data and fragment blocks were made.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Stats {
    /// Data and fragment blocks written.
    pub blocks: u64,
    /// Of those, the ones taken from the pack of earlier builds.
    pub reused: u64,
    /// The bytes of this build's blocks at the start of the pack it wrote
    /// (0: none written): [`super::pack::first_blocks`] reads them back.
    pub packed: u64,
}

enum NodeKind<'a> {
    Dir(Vec<usize>),
    File(&'a Source),
    Symlink(&'a [u8]),
}

struct Node<'a> {
    name: &'a str,
    mode: u16,
    kind: NodeKind<'a>,
    ino: u32,
    /// A file with other names on its filesystem: (device, inode).
    link: Option<(u64, u64)>,
    /// The node whose inode this one's name points to (itself, unless it
    /// is a further name of a file already in the tree).
    first: usize,
    /// Names of this node's inode in the tree.
    nlink: u32,
}

/// The tree: node 0 is the root.
struct Tree<'a> {
    nodes: Vec<Node<'a>>,
}

impl<'a> Tree<'a> {
    fn new(entries: &[Entry<'a>], root_mode: u16) -> Result<Tree<'a>> {
        let mut nodes = vec![Node {
            name: "",
            mode: root_mode,
            kind: NodeKind::Dir(Vec::new()),
            ino: 0,
            link: None,
            first: 0,
            nlink: 1,
        }];
        let mut dirs: HashMap<&str, usize> = HashMap::from([("", 0)]);
        let mut order: Vec<&Entry<'a>> = entries.iter().collect();
        // A parent's path is a prefix of its children's: it sorts first.
        order.sort_by(|a, b| a.path.cmp(b.path));
        if let Some(w) = order.windows(2).find(|w| w[0].path == w[1].path) {
            bail!("/{} is in the tree twice", w[0].path);
        }
        for e in order {
            let (parent, name) = e.path.rsplit_once('/').unwrap_or(("", e.path));
            ensure!(
                !name.is_empty() && name.len() <= NAME_LEN && name != "." && name != "..",
                "{:?} cannot be a name in a squashfs (1 to {NAME_LEN} bytes, not . or ..)",
                e.path
            );
            ensure!(
                e.mode <= 0o7777,
                "mode {:o} of /{} has more than permission bits",
                e.mode,
                e.path
            );
            let Some(&p) = dirs.get(parent) else {
                bail!("/{} has no parent directory /{parent} in the tree", e.path)
            };
            let index = nodes.len();
            let kind = match e.kind {
                Kind::Dir => {
                    dirs.insert(e.path, index);
                    NodeKind::Dir(Vec::new())
                }
                Kind::File(s) => NodeKind::File(s),
                Kind::Symlink(t) => NodeKind::Symlink(t),
            };
            nodes.push(Node {
                name,
                mode: e.mode,
                kind,
                ino: 0,
                link: e.link.filter(|_| !matches!(e.kind, Kind::Dir)),
                first: index,
                nlink: 1,
            });
            if let NodeKind::Dir(children) = &mut nodes[p].kind {
                children.push(index);
            }
        }
        for i in 0..nodes.len() {
            let NodeKind::Dir(children) = &nodes[i].kind else {
                continue;
            };
            let mut sorted = children.clone();
            sorted.sort_by(|a, b| nodes[*a].name.as_bytes().cmp(nodes[*b].name.as_bytes()));
            nodes[i].kind = NodeKind::Dir(sorted);
        }
        Ok(Tree { nodes })
    }

    fn children(&self, dir: usize) -> &[usize] {
        match &self.nodes[dir].kind {
            NodeKind::Dir(c) => c,
            _ => &[],
        }
    }

    /// Every node but the root in pre-order: a directory's entries in
    /// order, each followed by its subtree (mksquashfs's order for inode
    /// numbers and for file data).
    fn preorder(&self) -> Vec<usize> {
        let mut out = Vec::with_capacity(self.nodes.len());
        let mut stack = vec![(0usize, 0usize)];
        while let Some((dir, at)) = stack.pop() {
            let Some(&c) = self.children(dir).get(at) else {
                continue;
            };
            stack.push((dir, at + 1));
            out.push(c);
            stack.push((c, 0));
        }
        out
    }

    /// Inode numbers: pre-order from 1, the root last; a further name of a
    /// file (a hard link) gets the number of its first. Returns the root's
    /// parent number (one more than the root's).
    fn number(&mut self) -> u32 {
        let mut next = 1;
        let mut links: HashMap<(u64, u64), usize> = HashMap::new();
        for c in self.preorder() {
            if let Some(key) = self.nodes[c].link {
                if let Some(&first) = links.get(&key) {
                    self.nodes[c].first = first;
                    self.nodes[c].ino = self.nodes[first].ino;
                    self.nodes[first].nlink += 1;
                    continue;
                }
                links.insert(key, c);
            }
            self.nodes[c].ino = next;
            next += 1;
        }
        self.nodes[0].ino = next;
        next + 1
    }

    /// The regular files in the order their data is written.
    fn files(&self) -> Vec<usize> {
        self.preorder()
            .into_iter()
            .filter(|&c| {
                matches!(self.nodes[c].kind, NodeKind::File(_)) && self.nodes[c].first == c
            })
            .collect()
    }
}

/// A block of a file: a hole, or the n-th block written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Blk {
    Hole,
    Seq(u64),
}

/// Where a regular file's data went.
#[derive(Debug, Clone)]
enum Plan {
    Empty,
    Fragment {
        size: u32,
        index: u32,
        offset: u32,
    },
    Blocks {
        size: u64,
        /// The next block written when the file came (its start).
        start: u64,
        blocks: Arc<[Blk]>,
        /// Bytes in holes, when the source is sparse on disk too.
        sparse: u64,
    },
}

impl Plan {
    /// A file of `len` bytes (`sparse` of them in holes that its source
    /// keeps) whose blocks are this earlier file's: the earlier file's
    /// inode if it has the same length, else a new one with its blocks.
    fn same_blocks(&self, len: u64, sparse: u64) -> Option<Plan> {
        let Plan::Blocks {
            size,
            start,
            blocks,
            sparse: earlier_sparse,
        } = self
        else {
            return None;
        };
        Some(Plan::Blocks {
            size: len,
            start: *start,
            blocks: Arc::clone(blocks),
            sparse: if *size == len {
                *earlier_sparse
            } else {
                sparse
            },
        })
    }
}

/// A block to compress: its bytes, its key, and where its result goes.
type Job = (Vec<u8>, [u8; 32], Sender<Done>);

struct Done {
    input: Vec<u8>,
    key: [u8; 32],
    output: std::io::Result<Vec<u8>>,
    reused: bool,
}

/// What the planner hands back: each file's plan, each fragment block's
/// sequence number, and how many blocks it sent.
struct Planned {
    plans: HashMap<usize, Plan>,
    fragments: Vec<u64>,
    sent: u64,
}

/// Sends the blocks to the workers, in order, and decides where every
/// file's data goes.
struct Planner {
    block_size: usize,
    jobs: Sender<Job>,
    ordered: SyncSender<Receiver<Done>>,
    next_seq: u64,
    fragment: Vec<u8>,
    /// The current fragment block's index, if one is being filled.
    fragment_index: Option<u32>,
    /// Each fragment block's sequence number, by fragment index.
    fragments: Vec<u64>,
    /// Files of blocks, by their blocks' keys (None: a hole): a later file
    /// with the same keys is the same blocks.
    by_blocks: HashMap<Arc<[Option<[u8; 32]>]>, Plan>,
    /// Short files in fragments, by length and key: (fragment, offset).
    by_content: HashMap<(u32, [u8; 32]), (u32, u32)>,
    /// The lengths of the short files put in fragments.
    fragment_sizes: HashSet<u32>,
    /// The last short file of zeros that was not a duplicate.
    last_zeros: Option<Plan>,
}

fn all_zero(b: &[u8]) -> bool {
    b.iter().all(|x| *x == 0)
}

/// Reads as much of `buf` as `r` gives.
fn read_block(r: &mut dyn Read, buf: &mut [u8]) -> std::io::Result<usize> {
    bootstate::blank::read_full(r, buf)
}

impl Planner {
    fn new(block_size: usize, jobs: Sender<Job>, ordered: SyncSender<Receiver<Done>>) -> Planner {
        Planner {
            block_size,
            jobs,
            ordered,
            next_seq: 0,
            fragment: Vec::new(),
            fragment_index: None,
            fragments: Vec::new(),
            by_blocks: HashMap::new(),
            by_content: HashMap::new(),
            fragment_sizes: HashSet::new(),
            last_zeros: None,
        }
    }

    /// Plans `files` (nodes of `tree`) in order, sending their blocks, and
    /// the last fragment block.
    fn run(mut self, tree: &Tree<'_>, files: &[usize]) -> Result<Planned> {
        let mut plans = HashMap::new();
        for &f in files {
            if let NodeKind::File(src) = tree.nodes[f].kind {
                plans.insert(f, self.plan(src)?);
            }
        }
        self.flush_fragment()?;
        Ok(Planned {
            plans,
            fragments: self.fragments,
            sent: self.next_seq,
        })
    }

    fn submit(&mut self, input: Vec<u8>, key: [u8; 32]) -> Result<u64> {
        let (tx, rx) = channel();
        // The receiver first: it blocks while WINDOW blocks wait.
        ensure!(
            self.ordered.send(rx).is_ok() && self.jobs.send((input, key, tx)).is_ok(),
            "the squashfs writer stopped early"
        );
        self.next_seq += 1;
        Ok(self.next_seq - 1)
    }

    fn add_fragment(&mut self, data: &[u8]) -> Result<(u32, u32)> {
        if self.fragment_index.is_some() && self.fragment.len() + data.len() > self.block_size {
            self.flush_fragment()?;
        }
        let index = match self.fragment_index {
            Some(i) => i,
            None => {
                let i = u32::try_from(self.fragments.len()).context(
                    "more than 2^32 fragment blocks: too many small files for one squashfs",
                )?;
                self.fragments.push(u64::MAX);
                *self.fragment_index.insert(i)
            }
        };
        let offset = self.fragment.len() as u32;
        self.fragment.extend_from_slice(data);
        Ok((index, offset))
    }

    fn flush_fragment(&mut self) -> Result<()> {
        if let Some(i) = self.fragment_index.take() {
            let block = std::mem::take(&mut self.fragment);
            let key = pack::key(&block);
            self.fragments[i as usize] = self.submit(block, key)?;
        }
        Ok(())
    }

    /// Where `src`'s data goes: nowhere (empty), a fragment (short, not
    /// all zeros), or blocks; an earlier file's when it has the same.
    fn plan(&mut self, src: &Source) -> Result<Plan> {
        let scan = Scan::read(src, self.block_size)?;
        match (&scan.short, scan.keys.first()) {
            (_, None) => Ok(Plan::Empty),
            (Some(data), Some(Some(key))) => self.plan_fragment(data, *key),
            (Some(_), Some(None)) => Ok(self.plan_zeros(src, scan.len)),
            (None, Some(_)) => self.plan_blocks(src, scan),
        }
    }

    /// A short file of zeros: one hole. mksquashfs looks for a duplicate
    /// of it only when a short file of the same length went into a
    /// fragment before (its `pre_duplicate`), and then finds the last short
    /// file of zeros that was not a duplicate (they share hash list 0, most
    /// recent first, in its `duplicate`).
    fn plan_zeros(&mut self, src: &Source, len: u64) -> Plan {
        let sparse = if src_is_sparse(src, len) { len } else { 0 };
        if self.fragment_sizes.contains(&(len as u32))
            && let Some(dup) = self
                .last_zeros
                .as_ref()
                .and_then(|e| e.same_blocks(len, sparse))
        {
            return dup;
        }
        let plan = Plan::Blocks {
            size: len,
            start: self.next_seq,
            blocks: [Blk::Hole].into(),
            sparse,
        };
        self.last_zeros = Some(plan.clone());
        plan
    }

    fn plan_fragment(&mut self, data: &[u8], key: [u8; 32]) -> Result<Plan> {
        let size = data.len() as u32;
        let (index, offset) = match self.by_content.get(&(size, key)) {
            Some(&earlier) => earlier,
            None => {
                let at = self.add_fragment(data)?;
                self.by_content.insert((size, key), at);
                self.fragment_sizes.insert(size);
                at
            }
        };
        Ok(Plan::Fragment {
            size,
            index,
            offset,
        })
    }

    /// A file of blocks: an earlier file's if their blocks are the same
    /// (holes match holes, whatever their length, as in mksquashfs),
    /// else read again and its blocks with data sent, in order.
    fn plan_blocks(&mut self, src: &Source, scan: Scan) -> Result<Plan> {
        let len = scan.len;
        let sparse = if scan.holes > 0 && !src_is_sparse(src, len) {
            0
        } else {
            scan.holes
        };
        let keys: Arc<[Option<[u8; 32]>]> = scan.keys.into();
        if let Some(dup) = self
            .by_blocks
            .get(&keys)
            .and_then(|e| e.same_blocks(len, sparse))
        {
            return Ok(dup);
        }
        let changed = || format!("{} changed while read: build again", src.describe());
        let start = self.next_seq;
        let mut blocks = Vec::with_capacity(keys.len());
        let (mut r, _) = src.open().with_context(changed)?;
        let mut buf = vec![0u8; self.block_size];
        for key in keys.iter() {
            let n = read_block(&mut r, &mut buf).with_context(changed)?;
            let data = &buf[..n];
            blocks.push(match key {
                None => {
                    ensure!(all_zero(data), changed());
                    Blk::Hole
                }
                Some(k) => {
                    ensure!(pack::key(data) == *k, changed());
                    Blk::Seq(self.submit(data.to_vec(), *k)?)
                }
            });
        }
        let plan = Plan::Blocks {
            size: len,
            start,
            blocks: blocks.into(),
            sparse,
        };
        self.by_blocks.insert(keys, plan.clone());
        Ok(plan)
    }
}

/// A file read once: its length, each block's key (None for a hole), the
/// bytes in holes, and the data itself when shorter than a block.
struct Scan {
    len: u64,
    keys: Vec<Option<[u8; 32]>>,
    holes: u64,
    short: Option<Vec<u8>>,
}

impl Scan {
    fn read(src: &Source, block_size: usize) -> Result<Scan> {
        let what = || format!("reading {}", src.describe());
        let (mut r, len) = src.open().with_context(what)?;
        let mut buf = vec![0u8; block_size];
        let mut scan = Scan {
            len,
            keys: Vec::new(),
            holes: 0,
            short: None,
        };
        let mut total = 0u64;
        loop {
            let n = read_block(&mut r, &mut buf).with_context(what)?;
            total += n as u64;
            // A read past the expected end (the file grew) is caught below.
            if n == 0 || total > len {
                break;
            }
            let data = &buf[..n];
            if all_zero(data) {
                scan.keys.push(None);
                scan.holes += n as u64;
            } else {
                scan.keys.push(Some(pack::key(data)));
            }
            if len < block_size as u64 {
                scan.short = Some(data.to_vec());
            }
            if n < block_size {
                break;
            }
        }
        ensure!(
            total == len
                && (len == 0
                    || !len.is_multiple_of(block_size as u64)
                    || read_block(&mut r, &mut buf[..1]).with_context(what)? == 0),
            "{} changed size while read: build again",
            src.describe()
        );
        Ok(scan)
    }
}

/// Whether the source keeps fewer blocks on disk than its length (a file
/// with holes); memory is never sparse.
fn src_is_sparse(src: &Source, len: u64) -> bool {
    use std::os::unix::fs::MetadataExt;
    match src {
        Source::File(p) => std::fs::metadata(p).is_ok_and(|m| m.blocks() * 512 < len),
        _ => false,
    }
}

/// A worker: compresses the blocks it is sent, or takes them from `old`.
fn work(jobs: &Mutex<Receiver<Job>>, level: i32, old: Option<&Pack>) {
    let mut zstd = None;
    loop {
        let job = match jobs.lock() {
            Ok(rx) => rx.recv(),
            Err(_) => return,
        };
        let Ok((input, key, tx)) = job else { return };
        let kept = old.and_then(|p| p.get(&key, &input));
        let reused = kept.is_some();
        let output = match kept {
            Some(bytes) => Ok(bytes),
            None => match &mut zstd {
                Some(c) => Ok(c),
                None => zstd::bulk::Compressor::new(level).map(|c| zstd.insert(c)),
            }
            .and_then(|c| c.compress(&input)),
        };
        let _ = tx.send(Done {
            input,
            key,
            output,
            reused,
        });
    }
}

/// Where the data blocks went: each one's offset and size word.
struct Written {
    offsets: Vec<u64>,
    sizes: Vec<u32>,
    end: u64,
    stats: Stats,
}

impl Written {
    /// Writes a compressed block (as it is if zstd did not make it
    /// smaller) and keeps it in the next pack.
    fn put(
        &mut self,
        w: &mut dyn Write,
        done: &Done,
        next_pack: &mut Option<pack::Writer>,
    ) -> Result<()> {
        let compressed = match &done.output {
            Ok(c) => c,
            Err(e) => bail!("compressing a squashfs block: {e}"),
        };
        let (bytes, size) = if compressed.len() < done.input.len() {
            (&compressed[..], compressed.len() as u32)
        } else {
            (&done.input[..], done.input.len() as u32 | DATA_UNCOMPRESSED)
        };
        w.write_all(bytes)?;
        self.offsets.push(self.end);
        self.sizes.push(size);
        self.end += bytes.len() as u64;
        self.stats.blocks += 1;
        self.stats.reused += u64::from(done.reused);
        if let Some(p) = next_pack
            && p.add(done.key, compressed).is_err()
        {
            *next_pack = None;
        }
        Ok(())
    }

    /// Where the block `seq` starts; past the last block, the end of the
    /// data (a file of holes starts where the next block would).
    fn start(&self, seq: u64) -> u64 {
        self.offsets.get(seq as usize).copied().unwrap_or(self.end)
    }

    fn size(&self, b: Blk) -> u32 {
        match b {
            Blk::Hole => 0,
            Blk::Seq(s) => self.sizes[s as usize],
        }
    }
}

/// Writes `entries` as a squashfs to `out` (from its start).
pub fn write(out: &mut std::fs::File, entries: &[Entry<'_>], opts: &Options<'_>) -> Result<Stats> {
    ensure!(
        (1..=22).contains(&opts.level),
        "squashfs zstd level {} is out of range: use 1 to 22",
        opts.level
    );
    ensure!(
        opts.block_size.is_power_of_two() && (4096..=1 << 20).contains(&opts.block_size),
        "squashfs block size {} is not a power of two from 4 KiB to 1 MiB",
        opts.block_size
    );
    let mut tree = Tree::new(entries, opts.root_mode)?;
    let root_parent = tree.number();
    // The superblock (and the options block) last, when the tables are
    // known; the data starts after them.
    let data_start = SUPERBLOCK_SIZE
        + if opts.level != ZSTD_DEFAULT_LEVEL {
            6
        } else {
            0
        };
    out.seek(SeekFrom::Start(data_start))?;
    let mut w = std::io::BufWriter::with_capacity(1 << 20, &mut *out);
    let (planned, written) = write_data(&mut w, &tree, data_start, opts)?;
    let tables = write_tables(&mut w, &tree, &planned, &written, root_parent, opts)?;
    // Padded to 4 KiB, as mksquashfs pads.
    let pad = (4096 - tables.bytes_used % 4096) % 4096;
    w.write_all(&vec![0u8; pad as usize])?;
    w.flush()?;
    drop(w);
    let sb = superblock(
        &tables,
        tree.nodes[0].ino,
        planned.fragments.len() as u32,
        opts,
    );
    out.seek(SeekFrom::Start(0))?;
    out.write_all(&sb)?;
    out.set_len(tables.bytes_used + pad)?;
    Ok(written.stats)
}

/// Writes the data and fragment blocks from `start`: the planner thread
/// reads the files and sends their blocks to the workers, this thread
/// writes the results in order. With a cache directory, blocks come from
/// its pack when it holds them and the next pack is written.
fn write_data(
    w: &mut dyn Write,
    tree: &Tree<'_>,
    start: u64,
    opts: &Options<'_>,
) -> Result<(Planned, Written)> {
    let pack_path = opts
        .cache
        .map(|d| d.join(pack::file_name(opts.level, opts.block_size)));
    let old = pack_path
        .as_deref()
        .and_then(|p| Pack::open(p, opts.block_size));
    let mut next_pack = pack_path
        .as_deref()
        .and_then(|p| pack::Writer::create(p).ok());
    let mut written = Written {
        offsets: Vec::new(),
        sizes: Vec::new(),
        end: start,
        stats: Stats::default(),
    };
    let files = tree.files();
    let planned = std::thread::scope(|s| -> Result<Planned> {
        let (ordered_tx, ordered_rx) = sync_channel::<Receiver<Done>>(WINDOW);
        let (jobs_tx, jobs_rx) = channel::<Job>();
        let jobs_rx = Arc::new(Mutex::new(jobs_rx));
        let old = old.as_ref();
        for _ in 0..opts.threads.max(1) {
            let jobs_rx = Arc::clone(&jobs_rx);
            s.spawn(move || work(&jobs_rx, opts.level, old));
        }
        let planner = Planner::new(opts.block_size as usize, jobs_tx, ordered_tx);
        let files = &files;
        let planner = s.spawn(move || planner.run(tree, files));
        let mut failed = None;
        while let Ok(rx) = ordered_rx.recv() {
            let Ok(done) = rx.recv() else {
                failed = Some(anyhow::anyhow!(
                    "a compressing thread stopped without its result (a bug: report it)"
                ));
                break;
            };
            if let Err(e) = written.put(w, &done, &mut next_pack) {
                failed = Some(e);
                break;
            }
        }
        // The planner, if still sending, stops at its next block.
        drop(ordered_rx);
        let planned = planner
            .join()
            .map_err(|_| anyhow::anyhow!("the squashfs planner panicked"))?;
        if let Some(e) = failed {
            return Err(e.context("writing the squashfs data"));
        }
        let planned = planned?;
        ensure!(
            planned.sent == written.offsets.len() as u64,
            "internal error: {} squashfs blocks sent, {} written (a bug: report it)",
            planned.sent,
            written.offsets.len()
        );
        Ok(planned)
    })?;
    if let Some(p) = next_pack {
        let used = p.used();
        // A pack that cannot be written costs the next build time only.
        if p.finish(old.as_ref()).is_ok() {
            written.stats.packed = used;
        }
    }
    Ok((planned, written))
}

/// Where the tables went, and the image's end.
struct Tables {
    root: u64,
    inode: u64,
    dir: u64,
    fragment: u64,
    lookup: u64,
    id: u64,
    bytes_used: u64,
}

/// Writes the tables after the data, in mksquashfs's order: inodes,
/// directories, fragments, the NFS export table, ids.
fn write_tables(
    w: &mut dyn Write,
    tree: &Tree<'_>,
    planned: &Planned,
    written: &Written,
    root_parent: u32,
    opts: &Options<'_>,
) -> Result<Tables> {
    let mut z = zstd::bulk::Compressor::new(opts.level)?;
    let mut meta = Metadata::new(tree, planned, written, opts, &mut z);
    let root = meta.dir(0, root_parent)?;
    let Metadata {
        inodes,
        dirs,
        lookup,
        ..
    } = meta;
    let mut at = written.end;
    let inode = at;
    let bytes = inodes.finish(&mut z)?;
    w.write_all(&bytes)?;
    at += bytes.len() as u64;
    let dir = at;
    let bytes = dirs.finish(&mut z)?;
    w.write_all(&bytes)?;
    at += bytes.len() as u64;
    let mut entries = Vec::with_capacity(planned.fragments.len() * 16);
    for &seq in &planned.fragments {
        entries.extend_from_slice(&written.start(seq).to_le_bytes());
        entries.extend_from_slice(&written.size(Blk::Seq(seq)).to_le_bytes());
        entries.extend_from_slice(&0u32.to_le_bytes());
    }
    let fragment = table(w, &mut at, &entries, &mut z)?;
    let refs: Vec<u8> = lookup.iter().flat_map(|r| r.to_le_bytes()).collect();
    let lookup = table(w, &mut at, &refs, &mut z)?;
    // One id: root, the owner of everything.
    let id = table(w, &mut at, &0u32.to_le_bytes(), &mut z)?;
    Ok(Tables {
        root,
        inode,
        dir,
        fragment,
        lookup,
        id,
        bytes_used: at,
    })
}

/// The superblock, and the compression-options block mksquashfs writes
/// after it for a level other than zstd's default.
fn superblock(t: &Tables, inodes: u32, fragments: u32, opts: &Options<'_>) -> Vec<u8> {
    let comp_opts = opts.level != ZSTD_DEFAULT_LEVEL;
    let flags = FLAG_DUPLICATES
        | FLAG_EXPORTABLE
        | FLAG_NO_XATTRS
        | if comp_opts {
            FLAG_COMPRESSOR_OPTIONS
        } else {
            0
        };
    let mut sb = Vec::with_capacity(SUPERBLOCK_SIZE as usize + 6);
    for v in [MAGIC, inodes, opts.mtime, opts.block_size, fragments] {
        sb.extend_from_slice(&v.to_le_bytes());
    }
    // Compressor, log2 of the block size, flags, one id, version 4.0.
    for v in [
        ZSTD,
        opts.block_size.trailing_zeros() as u16,
        flags,
        1,
        4,
        0,
    ] {
        sb.extend_from_slice(&v.to_le_bytes());
    }
    for v in [
        t.root,
        t.bytes_used,
        t.id,
        INVALID_TABLE,
        t.inode,
        t.dir,
        t.fragment,
        t.lookup,
    ] {
        sb.extend_from_slice(&v.to_le_bytes());
    }
    if comp_opts {
        sb.extend_from_slice(&(4 | META_UNCOMPRESSED).to_le_bytes());
        sb.extend_from_slice(&(opts.level as u32).to_le_bytes());
    }
    sb
}

/// One metadata block: zstd's output if smaller, else the bytes, with the
/// two-byte header.
fn meta_block(data: &[u8], z: &mut zstd::bulk::Compressor<'_>) -> Result<Vec<u8>> {
    let c = z.compress(data)?;
    let (header, body) = if c.len() < data.len() {
        (c.len() as u16, &c[..])
    } else {
        (data.len() as u16 | META_UNCOMPRESSED, data)
    };
    let mut out = header.to_le_bytes().to_vec();
    out.extend_from_slice(body);
    Ok(out)
}

/// A table as mksquashfs writes one: its bytes in metadata blocks, then
/// the list of their offsets, whose own offset is returned.
fn table(
    w: &mut dyn Write,
    at: &mut u64,
    bytes: &[u8],
    z: &mut zstd::bulk::Compressor<'_>,
) -> Result<u64> {
    let mut list = Vec::new();
    for chunk in bytes.chunks(METADATA_SIZE) {
        let b = meta_block(chunk, z)?;
        list.extend_from_slice(&at.to_le_bytes());
        w.write_all(&b)?;
        *at += b.len() as u64;
    }
    let start = *at;
    w.write_all(&list)?;
    *at += list.len() as u64;
    Ok(start)
}

/// A metadata stream (the inode or the directory table) being cut into
/// blocks.
struct Stream {
    table: Vec<u8>,
    cache: Vec<u8>,
}

impl Stream {
    fn new() -> Stream {
        Stream {
            table: Vec::new(),
            cache: Vec::new(),
        }
    }

    /// Compresses the full blocks waiting.
    fn flush_full(&mut self, z: &mut zstd::bulk::Compressor<'_>) -> Result<()> {
        while self.cache.len() >= METADATA_SIZE {
            let b = meta_block(&self.cache[..METADATA_SIZE], z)?;
            self.table.extend_from_slice(&b);
            self.cache.drain(..METADATA_SIZE);
        }
        Ok(())
    }

    /// Where the next byte goes: (block's offset in the table) << 16 |
    /// offset in the block.
    fn position(&self) -> u64 {
        ((self.table.len() as u64) << 16) | self.cache.len() as u64
    }

    fn finish(mut self, z: &mut zstd::bulk::Compressor<'_>) -> Result<Vec<u8>> {
        self.flush_full(z)?;
        if !self.cache.is_empty() {
            let b = meta_block(&self.cache, z)?;
            self.table.extend_from_slice(&b);
        }
        Ok(self.table)
    }
}

/// A directory's entries being laid out (mksquashfs's `struct directory`).
///
/// A header starts a run of at most 256 entries whose inodes are in one
/// metadata block and whose numbers are within 32767 of the header's; a
/// run also ends where the entries since the last index point would pass
/// 8 KiB, and the new header is then an index point.
struct DirBuf {
    buf: Vec<u8>,
    /// Entries under the current header (256 at first: the first entry
    /// starts a header).
    entry_count: u32,
    /// The current header's offset in `buf`.
    header: Option<usize>,
    /// Where the current index span starts in `buf`.
    index_at: usize,
    /// The current header's inode block and inode number.
    start_block: u32,
    inode_number: u32,
    /// (offset of a header in `buf`, name) for the extended inode's index.
    index: Vec<(u32, Vec<u8>)>,
}

impl DirBuf {
    fn new() -> DirBuf {
        DirBuf {
            buf: Vec::new(),
            entry_count: 256,
            header: None,
            index_at: 0,
            start_block: 0,
            inode_number: 0,
            index: Vec::new(),
        }
    }

    fn close_header(&mut self) {
        if let Some(h) = self.header {
            let mut hdr = Vec::with_capacity(12);
            hdr.extend_from_slice(&(self.entry_count - 1).to_le_bytes());
            hdr.extend_from_slice(&self.start_block.to_le_bytes());
            hdr.extend_from_slice(&self.inode_number.to_le_bytes());
            self.buf[h..h + 12].copy_from_slice(&hdr);
        }
    }

    fn add(&mut self, inode: u64, ino: u32, name: &[u8], typ: u16) {
        let start_block = (inode >> 16) as u32;
        let offset = (inode & 0xffff) as u16;
        let size = name.len();
        let over =
            self.header.is_some() && self.buf.len() + 8 + size - self.index_at > METADATA_SIZE;
        let delta = i64::from(ino) - i64::from(self.inode_number);
        if self.entry_count == 256
            || start_block != self.start_block
            || over
            || !(-32768..=32767).contains(&delta)
        {
            if self.header.is_some() {
                if over {
                    self.index.push((self.buf.len() as u32, name.to_vec()));
                    self.index_at = self.buf.len();
                }
                self.close_header();
            }
            self.header = Some(self.buf.len());
            self.start_block = start_block;
            self.entry_count = 0;
            self.inode_number = ino;
            self.buf.extend_from_slice(&[0; 12]);
        }
        let delta = (i64::from(ino) - i64::from(self.inode_number)) as i16;
        self.buf.extend_from_slice(&offset.to_le_bytes());
        self.buf.extend_from_slice(&delta.to_le_bytes());
        self.buf.extend_from_slice(&typ.to_le_bytes());
        self.buf
            .extend_from_slice(&((size - 1) as u16).to_le_bytes());
        self.buf.extend_from_slice(name);
        self.entry_count += 1;
    }
}

/// The inode and directory tables, made depth first.
struct Metadata<'m, 'a> {
    tree: &'m Tree<'a>,
    planned: &'m Planned,
    written: &'m Written,
    mtime: u32,
    z: &'m mut zstd::bulk::Compressor<'static>,
    inodes: Stream,
    dirs: Stream,
    /// Each inode's reference, by inode number - 1.
    lookup: Vec<u64>,
    /// The inodes of files with further names, by their first node.
    refs: HashMap<usize, u64>,
}

impl<'m, 'a> Metadata<'m, 'a> {
    fn new(
        tree: &'m Tree<'a>,
        planned: &'m Planned,
        written: &'m Written,
        opts: &Options<'_>,
        z: &'m mut zstd::bulk::Compressor<'static>,
    ) -> Self {
        Metadata {
            tree,
            planned,
            written,
            mtime: opts.mtime,
            z,
            inodes: Stream::new(),
            dirs: Stream::new(),
            lookup: vec![0; tree.nodes[0].ino as usize],
            refs: HashMap::new(),
        }
    }

    fn inode(&mut self, node: usize, typ: u16, body: &[u8]) -> Result<u64> {
        self.inodes.flush_full(self.z)?;
        let r = self.inodes.position();
        let n = &self.tree.nodes[node];
        let c = &mut self.inodes.cache;
        c.extend_from_slice(&typ.to_le_bytes());
        c.extend_from_slice(&n.mode.to_le_bytes());
        c.extend_from_slice(&0u16.to_le_bytes());
        c.extend_from_slice(&0u16.to_le_bytes());
        c.extend_from_slice(&self.mtime.to_le_bytes());
        c.extend_from_slice(&n.ino.to_le_bytes());
        c.extend_from_slice(body);
        self.lookup[n.ino as usize - 1] = r;
        Ok(r)
    }

    fn file(&mut self, node: usize) -> Result<u64> {
        let plan = self
            .planned
            .plans
            .get(&node)
            .context("internal error: a file the planner did not plan (a bug: report it)")?;
        let (size, start, frag, offset, blocks, sparse) = match plan {
            Plan::Empty => (0, 0, INVALID_FRAGMENT, 0, Vec::new(), 0),
            Plan::Fragment {
                size,
                index,
                offset,
            } => (u64::from(*size), 0, *index, *offset, Vec::new(), 0),
            Plan::Blocks {
                size,
                start,
                blocks,
                sparse,
            } => (
                *size,
                self.written.start(*start),
                INVALID_FRAGMENT,
                0,
                blocks.iter().map(|b| self.written.size(*b)).collect(),
                *sparse,
            ),
        };
        let mut body = Vec::with_capacity(40 + blocks.len() * 4);
        let nlink = self.tree.nodes[node].nlink;
        let typ = if nlink > 1 || size >= 1 << 32 || start >= 1 << 32 || sparse != 0 {
            body.extend_from_slice(&start.to_le_bytes());
            body.extend_from_slice(&size.to_le_bytes());
            // As mksquashfs: a file all holes says one byte less.
            let sparse = if sparse != 0 && sparse >= size {
                size - 1
            } else {
                sparse
            };
            body.extend_from_slice(&sparse.to_le_bytes());
            for v in [nlink, frag, offset, INVALID_XATTR] {
                body.extend_from_slice(&v.to_le_bytes());
            }
            LREG_TYPE
        } else {
            for v in [start as u32, frag, offset, size as u32] {
                body.extend_from_slice(&v.to_le_bytes());
            }
            FILE_TYPE
        };
        for b in blocks {
            body.extend_from_slice(&b.to_le_bytes());
        }
        self.inode(node, typ, &body)
    }

    /// Writes the directory `node`'s subtree, then its entries and inode.
    fn dir(&mut self, node: usize, parent: u32) -> Result<u64> {
        let tree = self.tree;
        let mut d = DirBuf::new();
        let mut subdirs = 0u32;
        let mut byte_count = 0usize;
        let children = tree.children(node);
        for &c in children {
            let n = &tree.nodes[c];
            byte_count += n.name.len() + 8;
            let (r, typ) = match n.kind {
                NodeKind::File(_) => (self.shared(c)?, FILE_TYPE),
                NodeKind::Symlink(_) => (self.shared(c)?, SYMLINK_TYPE),
                NodeKind::Dir(_) => {
                    subdirs += 1;
                    (self.dir(c, tree.nodes[node].ino)?, DIR_TYPE)
                }
            };
            d.add(r, n.ino, n.name.as_bytes(), typ);
        }
        d.close_header();
        let (block, offset, index_starts) = self.append_dir(&d.buf, &d.index)?;
        let path = || format!("directory {:?}", tree.nodes[node].name);
        let file_size = u32::try_from(d.buf.len() + 3)
            .ok()
            .with_context(|| format!("{} is larger than 4 GiB: split it", path()))?;
        let nlink = subdirs + 2;
        // mksquashfs's rule (its dir_scan6): an extended inode, with the
        // index, from 257 entries or 8 KiB of them.
        if children.len() >= 257 || byte_count >= METADATA_SIZE {
            let count = u16::try_from(d.index.len())
                .ok()
                .with_context(|| format!("{} has too many entries: split it", path()))?;
            let mut body = Vec::new();
            for v in [nlink, file_size, block, parent] {
                body.extend_from_slice(&v.to_le_bytes());
            }
            body.extend_from_slice(&count.to_le_bytes());
            body.extend_from_slice(&offset.to_le_bytes());
            body.extend_from_slice(&INVALID_XATTR.to_le_bytes());
            for ((at, name), start) in d.index.iter().zip(&index_starts) {
                body.extend_from_slice(&at.to_le_bytes());
                body.extend_from_slice(&start.to_le_bytes());
                body.extend_from_slice(&(name.len() as u32 - 1).to_le_bytes());
                body.extend_from_slice(name);
            }
            self.inode(node, LDIR_TYPE, &body)
        } else {
            let mut body = Vec::new();
            body.extend_from_slice(&block.to_le_bytes());
            body.extend_from_slice(&nlink.to_le_bytes());
            body.extend_from_slice(&(file_size as u16).to_le_bytes());
            body.extend_from_slice(&offset.to_le_bytes());
            body.extend_from_slice(&parent.to_le_bytes());
            self.inode(node, DIR_TYPE, &body)
        }
    }

    /// The inode of a file or symbolic link: made at its first name, the
    /// same one for its further names.
    fn shared(&mut self, node: usize) -> Result<u64> {
        let first = self.tree.nodes[node].first;
        if let Some(r) = self.refs.get(&first) {
            return Ok(*r);
        }
        let r = match self.tree.nodes[first].kind {
            NodeKind::Symlink(target) => {
                let mut body = Vec::with_capacity(8 + target.len());
                body.extend_from_slice(&self.tree.nodes[first].nlink.to_le_bytes());
                body.extend_from_slice(&(target.len() as u32).to_le_bytes());
                body.extend_from_slice(target);
                self.inode(first, SYMLINK_TYPE, &body)?
            }
            _ => self.file(first)?,
        };
        if self.tree.nodes[first].nlink > 1 {
            self.refs.insert(first, r);
        }
        Ok(r)
    }

    /// Appends a directory's entries to the directory table (mksquashfs's
    /// write_dir): returns where they start (the block's offset in the
    /// table, the offset in the block) and, for each index point, the
    /// offset of the block that holds it.
    fn append_dir(
        &mut self,
        entries: &[u8],
        index: &[(u32, Vec<u8>)],
    ) -> Result<(u32, u16, Vec<u32>)> {
        // Full blocks are compressed as soon as they are full: the cache
        // holds less than one.
        let offset = self.dirs.cache.len();
        let block = self.dirs.table.len() as u32;
        self.dirs.cache.extend_from_slice(entries);
        let mut starts = Vec::with_capacity(index.len());
        let mut limit = METADATA_SIZE - offset;
        loop {
            while starts.len() < index.len() && (index[starts.len()].0 as usize) < limit {
                starts.push(self.dirs.table.len() as u32);
            }
            limit += METADATA_SIZE;
            if self.dirs.cache.len() < METADATA_SIZE {
                break;
            }
            let b = meta_block(&self.dirs.cache[..METADATA_SIZE], self.z)?;
            self.dirs.table.extend_from_slice(&b);
            self.dirs.cache.drain(..METADATA_SIZE);
        }
        Ok((block, offset as u16, starts))
    }
}
