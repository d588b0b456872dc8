//! The device under fatfs when it changes BOOT: its writes reach the disk
//! in as few device writes and syncs as the order that keeps BOOT readable
//! through a power cut allows. The handles are not opened with `O_DSYNC`
//! ([`crate::device::Device`]): a write may be lost, or land before an
//! earlier one, until a sync; a sync is the only barrier.
//!
//! Each write fatfs makes falls in one of three kinds, told from where it
//! goes and what was on the volume when the [`Gather`] was made:
//!
//! * **new**: data written into clusters that were free, and FAT entries of
//!   clusters that were free (allocated, or joined into a chain of such
//!   clusters). Nothing on the volume leads to them: whether they reach the
//!   disk, in whatever order, changes nothing a reader sees. They are
//!   gathered and written as contiguous runs (up to [`RUN`] bytes a write),
//!   with no sync between them.
//! * **link**: everything else that is not a free: a directory entry, the
//!   FAT entry of a cluster in use (a chain joined or cut), the boot
//!   sector's dirty flag. A link can make new data reachable or change what
//!   existing metadata says, so it goes after a sync (everything written
//!   before it is on the disk first), one sector per device write (a disk
//!   writes a sector whole or not at all): consecutive link writes into one
//!   sector (fatfs writes an entry field by field) are one device write.
//!   The clusters made "new" so far may be reachable after a link: from
//!   then on they are "in use" (writes to them are links).
//! * **last**: a FAT entry going from in use to free, and FAT32's FSInfo
//!   (advisory counts). Held back, read back as written, and written after
//!   a sync at the end ([`Gather::sync`]), one sector a write.
//!
//! So a file created by fatfs (its directory entry written empty, its data
//! and clusters, then its entry with its first cluster and length) costs:
//! one link for the empty entry, its data and FAT in a few large writes,
//! one sync, one link for the entry. A cut leaves the old volume, an empty
//! file, lost clusters ([`crate::fatscan`] finds them), or the whole file.
//!
//! The test that cuts the power before each write of a creation, losing
//! what each [`crate::device::Loss`] pattern loses, is
//! `fat::tests::a_creation_cut_at_any_write_leaves_no_file_an_empty_one_or_the_whole`
//! (it fails with the syncs of [`Gather`] taken out).

use crate::device::Device;
use crate::fatscan::{Geometry, Kind};
use std::collections::BTreeMap;
use std::io::{self, Read, Seek, SeekFrom, Write};

/// The largest device write of gathered new data.
pub const RUN: usize = 1 << 20;

/// Gathered new data is written out once it reaches this much: one
/// [`RUN`], so that the runtime, which upgrades itself through this, holds
/// at most about 1 MiB of a file (8 MiB raised machined's peak RSS from
/// 4.5 to 10 MiB for a handful fewer writes).
const HOLD: usize = RUN;

/// Writes fatfs's changes in the order described in the module
/// documentation.
#[derive(Debug)]
pub struct Gather<D: Device> {
    inner: D,
    g: Geometry,
    pos: u64,
    /// Per cluster (index = cluster number): free when this was made and
    /// not yet possibly reachable.
    fresh: Vec<bool>,
    /// Fresh clusters written to (data or FAT) since the last link.
    touched: Vec<u32>,
    /// New writes not yet on the device: non-overlapping, non-adjacent
    /// byte runs by offset.
    runs: BTreeMap<u64, Vec<u8>>,
    held: usize,
    /// The link sector being gathered: its offset and contents.
    link: Option<(u64, Vec<u8>)>,
    /// Last writes, byte by byte.
    last: BTreeMap<u64, u8>,
    /// Whether the device has writes not yet synced.
    unsynced: bool,
}

impl<D: Device> Gather<D> {
    /// Over the FAT volume on `inner` (its geometry `g`): reads the first
    /// FAT to know which clusters are free.
    pub(crate) fn new(mut inner: D, g: Geometry) -> io::Result<Gather<D>> {
        let width = g.width() as usize;
        let n = g.clusters as usize + 2;
        let mut fat = vec![0u8; n * width];
        inner.seek(SeekFrom::Start(g.fat_offset))?;
        inner.read_exact(&mut fat)?;
        let fresh = fat
            .chunks(width)
            .enumerate()
            .map(|(c, e)| c >= 2 && entry_value(e) == 0)
            .collect();
        Ok(Gather {
            inner,
            g,
            pos: 0,
            fresh,
            touched: Vec::new(),
            runs: BTreeMap::new(),
            held: 0,
            link: None,
            last: BTreeMap::new(),
            unsynced: false,
        })
    }

    fn is_fresh(&self, c: u64) -> bool {
        usize::try_from(c)
            .ok()
            .and_then(|c| self.fresh.get(c))
            .copied()
            .unwrap_or(false)
    }

    /// The kind of a write of `buf` at `at`.
    fn kind(&mut self, at: u64, buf: &[u8]) -> io::Result<Class> {
        let g = &self.g;
        let len = buf.len() as u64;
        let end = at + len;
        if g.kind == Kind::Fat32 && g.fs_info > 0 && at >= g.fs_info && end <= g.fs_info + g.sector
        {
            return Ok(Class::Last);
        }
        // The FATs.
        let fats_end = g.fat_offset + g.fats * g.fat_len;
        if at >= g.fat_offset && end <= fats_end {
            let within = (at - g.fat_offset) % g.fat_len;
            let w = g.width();
            // One whole entry, within one copy.
            if !within.is_multiple_of(w) || len != w || within + len > g.fat_len {
                return Ok(Class::Link);
            }
            let c = within / w;
            if self.is_fresh(c) {
                return Ok(Class::New(vec![c as u32]));
            }
            let new = entry_value(buf);
            let mut old = vec![0u8; buf.len()];
            self.read_at(at, &mut old, true)?;
            return Ok(if new == 0 && entry_value(&old) != 0 {
                Class::Last
            } else {
                Class::Link
            });
        }
        // The data region: new only if every cluster it touches is fresh.
        if at >= g.data_offset {
            let first = (at - g.data_offset) / g.cluster_size + 2;
            let last = (end - 1 - g.data_offset) / g.cluster_size + 2;
            if (first..=last).all(|c| self.is_fresh(c)) {
                return Ok(Class::New((first..=last).map(|c| c as u32).collect()));
            }
        }
        Ok(Class::Link)
    }

    /// Reads `buf` at `at` as the volume now reads: the device, under the
    /// new runs, the link sector and (unless `without_last`) the last
    /// writes.
    fn read_at(&mut self, at: u64, buf: &mut [u8], without_last: bool) -> io::Result<()> {
        self.inner.seek(SeekFrom::Start(at))?;
        let mut got = 0;
        while got < buf.len() {
            match self.inner.read(&mut buf[got..])? {
                0 => break,
                k => got += k,
            }
        }
        if got < buf.len() {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "read past the end of the device",
            ));
        }
        let end = at + buf.len() as u64;
        // Runs that start before `end` and reach past `at`.
        for (&s, run) in self.runs.range(..end).rev() {
            let e = s + run.len() as u64;
            if e <= at {
                break;
            }
            overlay(buf, at, s, run);
        }
        if let Some((s, sec)) = &self.link {
            overlay(buf, at, *s, sec);
        }
        if !without_last {
            for (&o, &b) in self.last.range(at..end) {
                buf[(o - at) as usize] = b;
            }
        }
        Ok(())
    }

    /// Adds a new write to the runs, merging it with those it overlaps or
    /// touches.
    fn add_new(&mut self, at: u64, buf: &[u8]) -> io::Result<()> {
        let end = at + buf.len() as u64;
        // The common case, in place: within or at the end of the run that
        // starts at or before `at`, with no later run reached.
        let next_start = self.runs.range(at + 1..).next().map(|(s, _)| *s);
        if next_start.is_none_or(|n| n > end)
            && let Some((&s, run)) = self.runs.range_mut(..=at).next_back()
            && s + run.len() as u64 >= at
        {
            let o = (at - s) as usize;
            let overlap = (run.len() - o).min(buf.len());
            run[o..o + overlap].copy_from_slice(&buf[..overlap]);
            run.extend_from_slice(&buf[overlap..]);
            self.held += buf.len() - overlap;
            if self.held >= HOLD {
                self.write_runs()?;
            }
            return Ok(());
        }
        let mut start = at;
        let mut end = at + buf.len() as u64;
        let mut merged: Vec<(u64, Vec<u8>)> = Vec::new();
        // Runs overlapping or adjacent to [at, end).
        let keys: Vec<u64> = self
            .runs
            .range(..=end)
            .rev()
            .take_while(|(s, r)| *s + r.len() as u64 >= at)
            .map(|(s, _)| *s)
            .collect();
        for k in keys {
            if let Some(r) = self.runs.remove(&k) {
                self.held -= r.len();
                start = start.min(k);
                end = end.max(k + r.len() as u64);
                merged.push((k, r));
            }
        }
        let mut out = vec![0u8; (end - start) as usize];
        for (k, r) in merged {
            let o = (k - start) as usize;
            out[o..o + r.len()].copy_from_slice(&r);
        }
        let o = (at - start) as usize;
        out[o..o + buf.len()].copy_from_slice(buf);
        self.held += out.len();
        self.runs.insert(start, out);
        if self.held >= HOLD {
            self.write_runs()?;
        }
        Ok(())
    }

    /// Writes the gathered new data, in offset order, at most [`RUN`]
    /// bytes a write.
    fn write_runs(&mut self) -> io::Result<()> {
        let runs = std::mem::take(&mut self.runs);
        self.held = 0;
        for (at, run) in runs {
            for (i, piece) in run.chunks(RUN).enumerate() {
                self.inner.seek(SeekFrom::Start(at + (i * RUN) as u64))?;
                self.inner.write_all(piece)?;
                self.unsynced = true;
            }
        }
        Ok(())
    }

    /// Syncs if anything was written since the last sync.
    fn barrier(&mut self) -> io::Result<()> {
        if self.unsynced {
            self.inner.sync()?;
            self.unsynced = false;
        }
        Ok(())
    }

    /// Writes the link sector being gathered: after the new data, synced.
    /// The clusters written so far may be reachable from here on.
    fn write_link(&mut self) -> io::Result<()> {
        let Some((at, sec)) = self.link.take() else {
            return Ok(());
        };
        self.write_runs()?;
        self.barrier()?;
        self.inner.seek(SeekFrom::Start(at))?;
        self.inner.write_all(&sec)?;
        self.unsynced = true;
        for c in std::mem::take(&mut self.touched) {
            if let Some(f) = self.fresh.get_mut(c as usize) {
                *f = false;
            }
        }
        Ok(())
    }

    /// A link write: into the link sector being gathered, one sector at a
    /// time.
    fn add_link(&mut self, at: u64, buf: &[u8]) -> io::Result<()> {
        let sector = self.g.sector;
        let mut done = 0usize;
        while done < buf.len() {
            let here = at + done as u64;
            let s = here / sector * sector;
            let n = ((s + sector - here) as usize).min(buf.len() - done);
            if self.link.as_ref().is_none_or(|(o, _)| *o != s) {
                self.write_link()?;
                let mut sec = vec![0u8; sector as usize];
                self.read_at(s, &mut sec, true)?;
                self.link = Some((s, sec));
            }
            if let Some((_, sec)) = self.link.as_mut() {
                let o = (here - s) as usize;
                sec[o..o + n].copy_from_slice(&buf[done..done + n]);
            }
            done += n;
        }
        Ok(())
    }

    /// Writes everything held, in order: the link sector (after the new
    /// data), then, after a sync, the last writes, a sector each.
    fn write_all_held(&mut self) -> io::Result<()> {
        self.write_link()?;
        self.write_runs()?;
        if self.last.is_empty() {
            return Ok(());
        }
        self.barrier()?;
        let last = std::mem::take(&mut self.last);
        let sector = self.g.sector;
        let mut sectors: BTreeMap<u64, Vec<(u64, u8)>> = BTreeMap::new();
        for (o, b) in last {
            sectors.entry(o / sector * sector).or_default().push((o, b));
        }
        for (s, bytes) in sectors {
            let mut sec = vec![0u8; sector as usize];
            self.read_at(s, &mut sec, true)?;
            for (o, b) in bytes {
                sec[(o - s) as usize] = b;
            }
            self.inner.seek(SeekFrom::Start(s))?;
            self.inner.write_all(&sec)?;
            self.unsynced = true;
        }
        Ok(())
    }
}

/// What a write is (module documentation).
enum Class {
    /// New, into these fresh clusters.
    New(Vec<u32>),
    Link,
    Last,
}

/// A FAT entry's value (16 or 32 bits, little-endian; FAT32's top four
/// bits are reserved).
fn entry_value(e: &[u8]) -> u32 {
    match e {
        [a, b] => u32::from(u16::from_le_bytes([*a, *b])),
        [a, b, c, d] => u32::from_le_bytes([*a, *b, *c, *d]) & 0x0FFF_FFFF,
        _ => u32::MAX,
    }
}

/// Copies the part of `src` (at offset `s`) that falls in `buf` (at `at`).
fn overlay(buf: &mut [u8], at: u64, s: u64, src: &[u8]) {
    let end = at + buf.len() as u64;
    let from = s.max(at);
    let to = (s + src.len() as u64).min(end);
    if from < to {
        buf[(from - at) as usize..(to - at) as usize]
            .copy_from_slice(&src[(from - s) as usize..(to - s) as usize]);
    }
}

impl<D: Device> Read for Gather<D> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let len = self.g.data_offset + u64::from(self.g.clusters) * self.g.cluster_size;
        let n = (buf.len() as u64).min(len.saturating_sub(self.pos)) as usize;
        if n == 0 {
            return Ok(0);
        }
        self.read_at(self.pos, &mut buf[..n], false)?;
        self.pos += n as u64;
        Ok(n)
    }
}

impl<D: Device> Write for Gather<D> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let at = self.pos;
        // Newer than any last write to the same bytes.
        let end = at + buf.len() as u64;
        let stale: Vec<u64> = self.last.range(at..end).map(|(o, _)| *o).collect();
        match self.kind(at, buf)? {
            Class::New(clusters) => {
                for o in stale {
                    self.last.remove(&o);
                }
                // A link sector gathered holds these bytes as they were:
                // it is written first.
                if self
                    .link
                    .as_ref()
                    .is_some_and(|(s, sec)| at < s + sec.len() as u64 && *s < end)
                {
                    self.write_link()?;
                }
                self.touched.extend(clusters);
                self.add_new(at, buf)?;
            }
            Class::Link => {
                for o in stale {
                    self.last.remove(&o);
                }
                self.add_link(at, buf)?;
            }
            Class::Last => {
                for (i, b) in buf.iter().enumerate() {
                    self.last.insert(at + i as u64, *b);
                }
            }
        }
        self.pos = end;
        Ok(buf.len())
    }

    /// Writes nothing: what is held goes at [`Gather::sync`] (a flush is
    /// no barrier).
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<D: Device> Seek for Gather<D> {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        let len = self.g.data_offset + u64::from(self.g.clusters) * self.g.cluster_size;
        let target = match to {
            SeekFrom::Start(p) => Some(p),
            SeekFrom::End(d) => len.checked_add_signed(d),
            SeekFrom::Current(d) => self.pos.checked_add_signed(d),
        }
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "seek before start"))?;
        self.pos = target;
        Ok(target)
    }
}

impl<D: Device> Device for Gather<D> {
    /// Writes everything held in its order, then syncs.
    fn sync(&mut self) -> io::Result<()> {
        self.write_all_held()?;
        self.inner.sync()?;
        self.unsynced = false;
        Ok(())
    }
}
