//! Rock Ridge (RRIP 1.10) on SUSP: the SP, CE, ER, PX, TF and NM entries of
//! every directory record, and the continuation areas a record's NM or the
//! root's ER moves to when the record would pass 255 bytes.

use super::encoding::{Date, both32, put};
use super::records::{pad_even, record_len};
use super::tree::{Kind, Layout};
use super::{BLOCK, RRIP_ID};

/// A record's system use field and what goes to a continuation area.
#[derive(Debug, Default, Clone)]
pub(super) struct Susp {
    pub(super) inline: Vec<u8>,
    /// Bytes for a continuation area, and where the CE entry sits in
    /// `inline` (its location is filled in once the area is placed).
    pub(super) cont: Vec<u8>,
    pub(super) ce_at: Option<usize>,
    /// (LBA, offset) of the continuation area once placed.
    pub(super) cont_at: (u32, u32),
}

pub(super) fn px(mode: u32, links: u32) -> Vec<u8> {
    let mut e = vec![b'P', b'X', 36, 1];
    e.extend_from_slice(&both32(mode));
    e.extend_from_slice(&both32(links));
    e.extend_from_slice(&both32(0));
    e.extend_from_slice(&both32(0));
    e
}

pub(super) fn tf(date: &Date) -> Vec<u8> {
    // MODIFY | ACCESS | ATTRIBUTES, short form.
    let mut e = vec![b'T', b'F', 26, 1, 0x0E];
    for _ in 0..3 {
        e.extend_from_slice(&date.short());
    }
    e
}

/// NM entries for `name`, each at most 255 bytes, CONTINUE on all but the
/// last.
pub(super) fn nm(name: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let chunks: Vec<&[u8]> = name.chunks(250).collect();
    for (i, c) in chunks.iter().enumerate() {
        let flags = u8::from(i + 1 < chunks.len());
        out.extend_from_slice(&[b'N', b'M', (5 + c.len()) as u8, 1, flags]);
        out.extend_from_slice(c);
    }
    out
}

pub(super) fn sp() -> Vec<u8> {
    vec![b'S', b'P', 7, 1, 0xBE, 0xEF, 0]
}

pub(super) const ER_DES: &str = "THE ROCK RIDGE INTERCHANGE PROTOCOL PROVIDES SUPPORT FOR POSIX FILE SYSTEM \
                      SEMANTICS";
pub(super) const ER_SRC: &str = "PLEASE CONTACT DISC PUBLISHER FOR SPECIFICATION SOURCE.  SEE PUBLISHER \
                      IDENTIFIER IN PRIMARY VOLUME DESCRIPTOR FOR CONTACT INFORMATION.";

pub(super) fn er() -> Vec<u8> {
    let (id, des, src) = (RRIP_ID.as_bytes(), ER_DES.as_bytes(), ER_SRC.as_bytes());
    let mut e = vec![
        b'E',
        b'R',
        (8 + id.len() + des.len() + src.len()) as u8,
        1,
        id.len() as u8,
        des.len() as u8,
        src.len() as u8,
        1,
    ];
    e.extend_from_slice(id);
    e.extend_from_slice(des);
    e.extend_from_slice(src);
    e
}

pub(super) const CE_LEN: usize = 28;

/// The system use of a record: `head` always inline, `tail` inline when the
/// record stays within 255 bytes, else in a continuation area.
pub(super) fn susp(ident_len: usize, head: Vec<u8>, tail: Vec<u8>, force_cont: bool) -> Susp {
    let fits = record_len(ident_len, pad_even(head.len() + tail.len())) <= 254;
    if fits && !force_cont {
        let mut inline = head;
        inline.extend_from_slice(&tail);
        if inline.len() % 2 == 1 {
            inline.push(0);
        }
        return Susp {
            inline,
            ..Susp::default()
        };
    }
    let mut inline = head;
    let ce_at = inline.len();
    inline.extend_from_slice(&[b'C', b'E', CE_LEN as u8, 1]);
    inline.extend_from_slice(&[0; CE_LEN - 4]);
    if inline.len() % 2 == 1 {
        inline.push(0);
    }
    Susp {
        inline,
        cont: tail,
        ce_at: Some(ce_at),
        cont_at: (0, 0),
    }
}

/// Fills every node's system use (Rock Ridge) entries.
pub(super) fn layout_susp(l: &mut Layout, date: &Date) {
    for n in 0..l.nodes.len() {
        let (mode, links) = match &l.nodes[n].kind {
            Kind::Dir { children, .. } => {
                let subdirs = children
                    .iter()
                    .filter(|c| matches!(l.nodes[**c].kind, Kind::Dir { .. }))
                    .count() as u32;
                (0o040_555, 2 + subdirs)
            }
            Kind::File { .. } => (0o100_444, 1),
        };
        let mut head = px(mode, links);
        head.extend_from_slice(&tf(date));
        if n != 0 {
            let ident_len = l.nodes[n].ident.len();
            l.nodes[n].susp = susp(
                ident_len,
                head.clone(),
                nm(l.nodes[n].name.as_bytes()),
                false,
            );
        }
        if matches!(l.nodes[n].kind, Kind::Dir { .. }) {
            l.nodes[n].dot_susp = if n == 0 {
                let mut h = sp();
                h.extend_from_slice(&head);
                susp(1, h, er(), true)
            } else {
                susp(1, head, Vec::new(), false)
            };
        }
    }
}

/// Packs the continuation areas into blocks from `first_lba` on, none
/// crossing a block boundary; returns the blocks used.
pub(super) fn place_continuations(l: &mut Layout, first_lba: u32) -> u32 {
    let mut block = 0u32;
    let mut offset = 0usize;
    let mut used_any = false;
    for n in 0..l.nodes.len() {
        let node = &mut l.nodes[n];
        for s in [&mut node.susp, &mut node.dot_susp] {
            if s.ce_at.is_none() {
                continue;
            }
            if offset + s.cont.len() > BLOCK as usize {
                block += 1;
                offset = 0;
            }
            s.cont_at = (first_lba + block, offset as u32);
            offset += s.cont.len();
            used_any = true;
        }
    }
    if used_any { block + 1 } else { 0 }
}

/// The system use field with its CE entry filled in.
pub(super) fn susp_bytes(s: &Susp) -> Vec<u8> {
    let mut b = s.inline.clone();
    if let Some(at) = s.ce_at {
        put(&mut b, at + 4, &both32(s.cont_at.0));
        put(&mut b, at + 12, &both32(s.cont_at.1));
        put(&mut b, at + 20, &both32(s.cont.len() as u32));
    }
    b
}

/// The bytes of the `blocks` continuation-area blocks placed from
/// `first_lba` on by [`place_continuations`].
pub(super) fn continuation_areas(l: &Layout, first_lba: u32, blocks: u32) -> Vec<u8> {
    let mut ce = vec![0u8; blocks as usize * BLOCK as usize];
    for n in &l.nodes {
        for s in [&n.susp, &n.dot_susp] {
            if s.ce_at.is_some() {
                let at = (s.cont_at.0 - first_lba) as usize * BLOCK as usize + s.cont_at.1 as usize;
                put(&mut ce, at, &s.cont);
            }
        }
    }
    ce
}
