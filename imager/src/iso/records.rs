//! ECMA-119 structures built from the laid-out tree: directory records and
//! directory extents, the type L and M path tables, the Primary Volume
//! Descriptor and the Volume Descriptor Set Terminator.

use super::encoding::{Date, NO_DATE, both16, both32, put};
use super::rockridge::{px, susp_bytes, tf};
use super::tree::{Kind, Layout};
use super::{BLOCK, IsoSpec};

pub(super) fn pad_even(len: usize) -> usize {
    len + (len & 1)
}

/// Length of a directory record with an identifier of `ident` bytes and
/// `su` bytes of system use.
pub(super) fn record_len(ident: usize, su: usize) -> usize {
    pad_even(33 + ident) + su
}

pub(super) fn dir_record(
    ident: &[u8],
    lba: u32,
    size: u32,
    is_dir: bool,
    date: &Date,
    su: &[u8],
) -> Vec<u8> {
    let len = record_len(ident.len(), su.len());
    let mut r = vec![0u8; len];
    r[0] = len as u8;
    put(&mut r, 2, &both32(lba));
    put(&mut r, 10, &both32(size));
    put(&mut r, 18, &date.short());
    r[25] = if is_dir { 2 } else { 0 };
    put(&mut r, 28, &both16(1));
    r[32] = ident.len() as u8;
    put(&mut r, 33, ident);
    put(&mut r, pad_even(33 + ident.len()), su);
    r
}

/// The records of directory `d`: ".", "..", then its children.
pub(super) fn dir_records(l: &Layout, d: usize, date: &Date) -> Vec<Vec<u8>> {
    let (children, parent, lba, size) = match &l.nodes[d].kind {
        Kind::Dir {
            children,
            parent,
            lba,
            size,
            ..
        } => (children, *parent, *lba, *size),
        Kind::File { .. } => return Vec::new(),
    };
    let (plba, psize) = match &l.nodes[parent].kind {
        Kind::Dir { lba, size, .. } => (*lba, *size),
        Kind::File { .. } => (0, 0),
    };
    let parent_dot = susp_bytes(&l.nodes[parent].dot_susp);
    // ".." carries the parent's PX and TF (the root's without SP and CE).
    let dotdot_su = if parent == 0 {
        let mut h = px(0o040_555, root_links(l));
        h.extend_from_slice(&tf(date));
        h
    } else {
        parent_dot
    };
    let mut out = vec![
        dir_record(
            &[0],
            lba,
            size,
            true,
            date,
            &susp_bytes(&l.nodes[d].dot_susp),
        ),
        dir_record(&[1], plba, psize, true, date, &dotdot_su),
    ];
    for &c in children {
        let n = &l.nodes[c];
        let (clba, csize, is_dir) = match n.kind {
            Kind::Dir { lba, size, .. } => (lba, size, true),
            Kind::File { size, lba, .. } => (lba, size as u32, false),
        };
        out.push(dir_record(
            &n.ident,
            clba,
            csize,
            is_dir,
            date,
            &susp_bytes(&n.susp),
        ));
    }
    out
}

pub(super) fn root_links(l: &Layout) -> u32 {
    match &l.nodes[0].kind {
        Kind::Dir { children, .. } => {
            2 + children
                .iter()
                .filter(|c| matches!(l.nodes[**c].kind, Kind::Dir { .. }))
                .count() as u32
        }
        Kind::File { .. } => 2,
    }
}

/// Bytes of a directory's extent: records never cross a block.
pub(super) fn pack_records(records: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::new();
    for r in records {
        let used = out.len() % BLOCK as usize;
        if used + r.len() > BLOCK as usize {
            out.resize(out.len() + BLOCK as usize - used, 0);
        }
        out.extend_from_slice(r);
    }
    let blocks = out.len().div_ceil(BLOCK as usize).max(1);
    out.resize(blocks * BLOCK as usize, 0);
    out
}

pub(super) fn path_table(l: &Layout, big_endian: bool) -> Vec<u8> {
    let mut out = Vec::new();
    for &d in &l.dirs {
        let n = &l.nodes[d];
        let (lba, parent) = match &n.kind {
            Kind::Dir { lba, parent, .. } => (*lba, *parent),
            Kind::File { .. } => continue,
        };
        let pnum = match &l.nodes[parent].kind {
            Kind::Dir { number, .. } => *number,
            Kind::File { .. } => 1,
        };
        out.push(n.ident.len() as u8);
        out.push(0);
        if big_endian {
            out.extend_from_slice(&lba.to_be_bytes());
            out.extend_from_slice(&pnum.to_be_bytes());
        } else {
            out.extend_from_slice(&lba.to_le_bytes());
            out.extend_from_slice(&pnum.to_le_bytes());
        }
        out.extend_from_slice(&n.ident);
        if n.ident.len() % 2 == 1 {
            out.push(0);
        }
    }
    out
}

pub(super) fn blocks_of(bytes: u64) -> u64 {
    bytes.div_ceil(BLOCK)
}

pub(super) fn pvd(
    spec: &IsoSpec,
    date: &Date,
    blocks: u32,
    pt_size: u32,
    l_lba: u32,
    m_lba: u32,
    root: &[u8],
) -> Vec<u8> {
    let mut d = vec![0u8; BLOCK as usize];
    let text = |d: &mut [u8], at: usize, len: usize, s: &str| {
        let mut f = vec![b' '; len];
        f[..s.len().min(len)].copy_from_slice(&s.as_bytes()[..s.len().min(len)]);
        put(d, at, &f);
    };
    d[0] = 1;
    put(&mut d, 1, b"CD001");
    d[6] = 1;
    text(&mut d, 8, 32, "");
    text(&mut d, 40, 32, &spec.volume_id);
    put(&mut d, 80, &both32(blocks));
    put(&mut d, 120, &both16(1));
    put(&mut d, 124, &both16(1));
    put(&mut d, 128, &both16(BLOCK as u16));
    put(&mut d, 132, &both32(pt_size));
    put(&mut d, 140, &l_lba.to_le_bytes());
    put(&mut d, 148, &m_lba.to_be_bytes());
    put(&mut d, 156, root);
    text(&mut d, 190, 128, &spec.volume_set_id);
    text(&mut d, 318, 128, &spec.publisher);
    text(&mut d, 446, 128, "");
    text(&mut d, 574, 128, "");
    text(&mut d, 702, 37, "");
    text(&mut d, 739, 37, "");
    text(&mut d, 776, 37, "");
    put(&mut d, 813, &date.long());
    put(&mut d, 830, &date.long());
    put(&mut d, 847, &NO_DATE);
    put(&mut d, 864, &NO_DATE);
    d[881] = 1;
    d
}

pub(super) fn terminator() -> Vec<u8> {
    let mut d = vec![0u8; BLOCK as usize];
    d[0] = 255;
    put(&mut d, 1, b"CD001");
    d[6] = 1;
    d
}
