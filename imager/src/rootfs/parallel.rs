//! The squashfs's blocks compressed on every core, with the bytes of one.
//!
//! backhand's writer compresses each data block, fragment block and
//! metadata block in turn on the calling thread, through a
//! [`CompressionAction`]. This module runs ahead of it: a reader thread
//! goes through the files in the order backhand will (full paths compared
//! component by component, as backhand's tree sorts them), cuts them into
//! the blocks backhand will ask for (full blocks and a file's last partial
//! block, skipping all-zero blocks, which backhand stores as holes; files
//! shorter than a block packed into fragment blocks as backhand packs them),
//! and hands them to a pool of worker threads. Backhand's writer, on the
//! calling thread, then asks our [`CompressionAction`] to compress a block:
//! it takes the oldest precomputed block, and if that block's input is
//! byte-for-byte the one asked for, returns its compressed bytes; otherwise
//! (a metadata block, a file changed under us, or a wrong prediction) it
//! compresses the block itself and leaves the queue as it was. The answer
//! to each call is thus always zstd's output for exactly the bytes asked
//! for, at the same level, whoever computed it: the image does not depend
//! on the number of threads, and a prediction can only cost time.
//!
//! Memory is bounded: at most [`WINDOW`] blocks are queued ahead of the
//! writer, plus one per worker in progress, each held with its compressed
//! bytes (2 x block size at most).
//!
//! With a cache directory, a worker first looks its block up in the pack
//! of the earlier builds ([`super::pack`]), and the writer's thread keeps
//! every block it used in the next pack: a block built before is
//! decompressed and compared instead of compressed.

use backhand::BackhandError;
use backhand::compression::{CompressionAction, Compressor, DefaultCompressor};
use backhand::{FilesystemCompressor, SuperBlock};
use std::cell::RefCell;
use std::io::Read;
use std::path::Path;
use std::sync::mpsc::{Receiver, Sender, SyncSender, channel, sync_channel};
use std::sync::{Arc, Mutex};

use super::Source;
use super::pack::{self, Pack};

/// Blocks compressed ahead of the writer, at most.
pub const WINDOW: usize = 32;

/// What the writer's calls found.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Stats {
    /// Blocks compressed by the workers and used as they were.
    pub parallel: u64,
    /// Blocks compressed on the writer's thread (metadata, mispredictions).
    pub inline: u64,
    /// Of the `parallel` blocks, those taken from the pack of earlier
    /// builds instead of compressed.
    pub reused: u64,
}

/// One compressed block: the input it was made from and zstd's output.
struct Done {
    input: Vec<u8>,
    output: std::io::Result<Vec<u8>>,
    /// The input's key, when there is a pack to keep it in.
    key: Option<pack::Key>,
    /// Taken from the old pack.
    reused: bool,
}

/// The writer's end of the pipeline, kept in a thread-local for the
/// duration of one [`FilesystemWriter::write`](backhand::FilesystemWriter::write).
struct Consumer {
    ordered: Receiver<Receiver<Done>>,
    front: Option<Done>,
    /// No more blocks will come (the reader stopped).
    ended: bool,
    level: i32,
    local: Option<zstd::bulk::Compressor<'static>>,
    stats: Stats,
    /// The next pack; dropped (not written) at its first error.
    next_pack: Option<pack::Writer>,
}

impl Consumer {
    fn next(&mut self) -> Option<&Done> {
        if self.front.is_none() && !self.ended {
            match self.ordered.recv().ok().and_then(|rx| rx.recv().ok()) {
                Some(d) => self.front = Some(d),
                None => self.ended = true,
            }
        }
        self.front.as_ref()
    }

    fn compress(&mut self, bytes: &[u8]) -> Result<Vec<u8>, BackhandError> {
        if self
            .next()
            .is_some_and(|d| d.input == bytes && d.output.is_ok())
        {
            let d = self.front.take().expect("front checked above");
            self.stats.parallel += 1;
            self.stats.reused += u64::from(d.reused);
            let output = d.output.expect("checked above");
            if let (Some(w), Some(key)) = (&mut self.next_pack, d.key)
                && w.add(key, &output).is_err()
            {
                self.next_pack = None;
            }
            return Ok(output);
        }
        self.stats.inline += 1;
        let c = match &mut self.local {
            Some(c) => c,
            None => self.local.insert(zstd::bulk::Compressor::new(self.level)?),
        };
        Ok(c.compress(bytes)?)
    }
}

thread_local! {
    static CONSUMER: RefCell<Option<Consumer>> = const { RefCell::new(None) };
}

/// The [`CompressionAction`] given to backhand: zstd blocks taken from the
/// calling thread's pipeline when one is running, backhand's own
/// compressor otherwise (and always for decompression and options).
pub struct ParallelZstd;

/// The instance backhand's `Kind` refers to.
pub static PARALLEL_ZSTD: ParallelZstd = ParallelZstd;

impl CompressionAction for ParallelZstd {
    type Error = BackhandError;
    type Compressor = Compressor;
    type FilesystemCompressor = FilesystemCompressor;
    type SuperBlock = SuperBlock;

    fn decompress(
        &self,
        bytes: &[u8],
        out: &mut Vec<u8>,
        compressor: Compressor,
    ) -> Result<(), BackhandError> {
        DefaultCompressor.decompress(bytes, out, compressor)
    }

    fn compress(
        &self,
        bytes: &[u8],
        fc: FilesystemCompressor,
        block_size: u32,
    ) -> Result<Vec<u8>, BackhandError> {
        CONSUMER.with(|c| match c.borrow_mut().as_mut() {
            Some(consumer) => consumer.compress(bytes),
            None => DefaultCompressor.compress(bytes, fc, block_size),
        })
    }

    fn compression_options(
        &self,
        superblock: &mut SuperBlock,
        kind: &backhand::kind::Kind,
        fs_compressor: FilesystemCompressor,
    ) -> Result<Option<Vec<u8>>, BackhandError> {
        DefaultCompressor.compression_options(superblock, kind, fs_compressor)
    }
}

/// Clears the thread's consumer when the write ends, however it ends, so
/// that the reader and the workers stop and the scope can join them.
struct Installed;

impl Drop for Installed {
    fn drop(&mut self) {
        CONSUMER.with(|c| c.borrow_mut().take());
    }
}

/// A block to compress and where its result goes.
type Job = (Vec<u8>, Sender<Done>);

/// Sends `input` to the workers and its result's receiver to the writer,
/// in order. False when the writer is gone.
fn submit(input: Vec<u8>, jobs: &Sender<Job>, ordered: &SyncSender<Receiver<Done>>) -> bool {
    let (tx, rx) = channel();
    // The receiver first: sending it blocks while WINDOW blocks wait, which
    // bounds what is read ahead.
    ordered.send(rx).is_ok() && jobs.send((input, tx)).is_ok()
}

/// Fills `buf` from `r` as far as it goes (backhand's reads are the same:
/// a block is whatever a full read gives). Returns the length read.
fn read_block(r: &mut dyn Read, buf: &mut [u8]) -> std::io::Result<usize> {
    bootstate::blank::read_full(r, buf)
}

/// The reader: every block backhand's writer will compress, in its order.
/// Stops quietly at the first file it cannot read (backhand will report
/// it) or when the writer is gone.
fn produce(
    files: &[&Source],
    block_size: usize,
    jobs: Sender<Job>,
    ordered: SyncSender<Receiver<Done>>,
) {
    let mut fragment: Vec<u8> = Vec::with_capacity(block_size);
    let mut buf = vec![0u8; block_size];
    for src in files {
        let Ok((mut r, _)) = src.open() else { return };
        let Ok(first) = read_block(&mut r, &mut buf) else {
            return;
        };
        if first == 0 {
            continue;
        }
        if first < block_size {
            // Packed into the fragment block, which is compressed when the
            // next one would not fit.
            if fragment.len() + first > block_size {
                let full = std::mem::replace(&mut fragment, Vec::with_capacity(block_size));
                if !submit(full, &jobs, &ordered) {
                    return;
                }
            }
            fragment.extend_from_slice(&buf[..first]);
            continue;
        }
        let mut n = first;
        while n > 0 {
            // An all-zero block is a hole: nothing compressed.
            if buf[..n].iter().any(|b| *b != 0) && !submit(buf[..n].to_vec(), &jobs, &ordered) {
                return;
            }
            n = match read_block(&mut r, &mut buf) {
                Ok(n) => n,
                Err(_) => return,
            };
        }
    }
    // The last fragment block, empty or not, is compressed at the end.
    submit(fragment, &jobs, &ordered);
}

/// A worker: compresses the blocks it is sent, or takes them from `old`
/// (the earlier builds' pack) when it holds them; with `keys`, says each
/// block's key, for the next pack.
fn work(jobs: &Mutex<Receiver<Job>>, level: i32, old: Option<&Pack>, keys: bool) {
    let mut zstd = None;
    loop {
        let job = match jobs.lock() {
            Ok(rx) => rx.recv(),
            Err(_) => return,
        };
        let Ok((input, tx)) = job else { return };
        let key = keys.then(|| pack::key(&input));
        let kept = old.zip(key.as_ref()).and_then(|(p, k)| p.get(k, &input));
        let reused = kept.is_some();
        let output = match kept {
            Some(bytes) => Ok(bytes),
            None => match &mut zstd {
                Some(c) => Ok(c),
                None => zstd::bulk::Compressor::new(level).map(|c| zstd.insert(c)),
            }
            .and_then(|c| c.compress(&input)),
        };
        // The writer may be gone (an error elsewhere): nothing to do then.
        let _ = tx.send(Done {
            input,
            output,
            key,
            reused,
        });
    }
}

/// Runs `write` (backhand's write of the filesystem whose regular files
/// are `files`, with [`PARALLEL_ZSTD`] as its compressor) while `threads`
/// workers compress its blocks ahead of it at zstd `level`. With `cache`
/// (a directory), blocks come from its pack when it holds them, and the
/// pack is then replaced by one that holds this run's blocks first.
pub fn run<T>(
    files: &[(&str, &Source)],
    block_size: u32,
    level: i32,
    threads: usize,
    cache: Option<&Path>,
    write: impl FnOnce() -> T,
) -> (T, Stats) {
    let pack_path = cache.map(|d| d.join(pack::file_name(level, block_size)));
    let old = pack_path.as_deref().and_then(|p| Pack::open(p, block_size));
    let next_pack = pack_path
        .as_deref()
        .and_then(|p| pack::Writer::create(p).ok());
    // Keys to look blocks up in the old pack, or to keep them in the next
    // (a cache directory that cannot be written is still read).
    let keys = next_pack.is_some() || old.is_some();
    // backhand writes file data in the order of its tree: paths compared
    // component by component (`usr/bin/x` before `usr/bin-x`).
    let mut order: Vec<&(&str, &Source)> = files.iter().collect();
    order.sort_by(|a, b| Path::new(a.0).cmp(Path::new(b.0)));
    let order: Vec<&Source> = order.into_iter().map(|f| f.1).collect();
    let block_size = block_size as usize;
    std::thread::scope(|s| {
        let (ordered_tx, ordered_rx) = sync_channel(WINDOW);
        let (jobs_tx, jobs_rx) = channel::<Job>();
        let jobs_rx = Arc::new(Mutex::new(jobs_rx));
        let old = old.as_ref();
        for _ in 0..threads.max(1) {
            let jobs_rx = Arc::clone(&jobs_rx);
            s.spawn(move || work(&jobs_rx, level, old, keys));
        }
        let order = &order;
        s.spawn(move || produce(order, block_size, jobs_tx, ordered_tx));
        CONSUMER.with(|c| {
            *c.borrow_mut() = Some(Consumer {
                ordered: ordered_rx,
                front: None,
                ended: false,
                level,
                local: None,
                stats: Stats::default(),
                next_pack,
            })
        });
        let installed = Installed;
        let out = write();
        let (stats, next_pack) = CONSUMER.with(|c| {
            c.borrow_mut()
                .as_mut()
                .map(|c| (c.stats, c.next_pack.take()))
                .unwrap_or_default()
        });
        drop(installed);
        // A pack that cannot be written costs the next build time, not
        // this one its image.
        if let Some(w) = next_pack {
            let _ = w.finish(old);
        }
        (out, stats)
    })
}
