//! `raw.xz`: the raw disk in xz's container, written here block by block
//! (the .xz file format, version 1.2.1), the blocks' LZMA2 data made by
//! liblzma's raw encoder.
//!
//! Why not liblzma's own multithreaded stream encoder: it runs LZMA over
//! every byte, and a 2 GiB disk is almost all zeros, so `raw.xz` took
//! about 15 s on two cores where `raw.zst` took 2. Here the disk is cut
//! into blocks of [`XZ_BLOCK`] bytes, each compressed on its own (what
//! the multithreaded encoder does too, so `xz -T0` still unpacks them in
//! parallel); a block of zeros is compressed once, and its bytes and check
//! are written again for every other block of zeros. The blocks with data
//! are compressed on every core, a batch at a time, written in order: the
//! bytes do not depend on the number of threads.
//!
//! The stream: the header (check CRC-64), the blocks (each: its header
//! with both sizes and the LZMA2 filter of [`XZ_PRESET`]'s dictionary, the
//! LZMA2 data, padding to 4 bytes, the CRC-64 of the block's bytes), the
//! index (each block's unpadded and uncompressed size) and the footer.
//! `xz -t` and `xz -d` read it (tested), and [`super::compress::unpack`]
//! through liblzma's decoder.

use liblzma::stream::{Action, Filters, LzmaOptions, Status, Stream};
use std::io::{self, Write};

/// The xz preset of `raw.xz`.
pub const XZ_PRESET: u32 = 1;
/// The uncompressed size of each block of `raw.xz` (xz's own default for
/// preset 1, three times its 1 MiB dictionary).
pub const XZ_BLOCK: u64 = 3 << 20;

const HEADER_MAGIC: [u8; 6] = [0xfd, b'7', b'z', b'X', b'Z', 0];
const FOOTER_MAGIC: [u8; 2] = [b'Y', b'Z'];
/// Stream flags: no reserved bits, check 0x04 (CRC-64).
const FLAGS: [u8; 2] = [0, 0x04];
const LZMA2: u64 = 0x21;

/// CRC-64 as xz computes it (ECMA-182, reflected).
fn crc64(crc: u64, bytes: &[u8]) -> u64 {
    const TABLE: [u64; 256] = {
        let mut t = [0u64; 256];
        let mut i = 0;
        while i < 256 {
            let mut c = i as u64;
            let mut k = 0;
            while k < 8 {
                c = if c & 1 == 1 {
                    (c >> 1) ^ 0xC96C_5795_D787_0F42
                } else {
                    c >> 1
                };
                k += 1;
            }
            t[i] = c;
            i += 1;
        }
        t
    };
    let mut c = !crc;
    for b in bytes {
        c = TABLE[((c ^ u64::from(*b)) & 0xff) as usize] ^ (c >> 8);
    }
    !c
}

fn crc32(bytes: &[u8]) -> [u8; 4] {
    crc32fast::hash(bytes).to_le_bytes()
}

/// xz's variable-length integer.
fn varint(out: &mut Vec<u8>, mut n: u64) {
    while n >= 0x80 {
        out.push((n as u8) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

fn pad4(out: &mut Vec<u8>) {
    while !out.len().is_multiple_of(4) {
        out.push(0);
    }
}

/// The LZMA2 dictionary: preset 1's, 1 MiB.
const DICT: u32 = 1 << 20;

/// LZMA2's one-byte dictionary size, for a power of two of at least 4 KiB.
fn dict_byte(dict: u32) -> u8 {
    // size = 2^(b/2 + 12) for an even b.
    ((dict.trailing_zeros() - 12) * 2) as u8
}

/// One block of the stream, whole: header, data, padding and check; and
/// its unpadded size (the index's).
fn block(data: &[u8]) -> io::Result<(Vec<u8>, u64)> {
    let mut opts = LzmaOptions::new_preset(XZ_PRESET).map_err(io::Error::other)?;
    opts.dict_size(DICT);
    let mut filters = Filters::new();
    filters.lzma2(&opts);
    let mut enc = Stream::new_raw_encoder(&filters).map_err(io::Error::other)?;
    let mut lz = Vec::with_capacity(data.len() / 4 + 4096);
    loop {
        if lz.len() == lz.capacity() {
            lz.reserve(lz.capacity().max(4096));
        }
        let rest = &data[enc.total_in() as usize..];
        if enc
            .process_vec(rest, &mut lz, Action::Finish)
            .map_err(io::Error::other)?
            == Status::StreamEnd
        {
            break;
        }
    }
    // The header: size byte, flags (one filter, both sizes present), the
    // sizes, LZMA2 and its dictionary byte, padding, CRC-32.
    let mut head = vec![0u8, 0x40 | 0x80];
    varint(&mut head, lz.len() as u64);
    varint(&mut head, data.len() as u64);
    varint(&mut head, LZMA2);
    varint(&mut head, 1);
    head.push(dict_byte(DICT));
    pad4(&mut head);
    head[0] = (head.len() / 4) as u8; // (size with the CRC) / 4 - 1
    let crc = crc32(&head);
    head.extend_from_slice(&crc);
    let unpadded = (head.len() + lz.len() + 8) as u64;
    let mut out = head;
    out.extend_from_slice(&lz);
    pad4(&mut out);
    out.extend_from_slice(&crc64(0, data).to_le_bytes());
    Ok((out, unpadded))
}

/// A block as written and its unpadded size; none for a block of zeros.
type Made = io::Result<Option<(Vec<u8>, u64)>>;

/// An xz stream written to `W` as bytes come ([`Write`]); [`Self::finish`]
/// writes the rest, the index and the footer.
pub struct XzWriter<W: Write> {
    out: W,
    /// One block's buffer per thread: a batch.
    bufs: Vec<Vec<u8>>,
    /// The buffer being filled, and how much of it is.
    at: usize,
    fill: usize,
    /// Each block's unpadded and uncompressed size.
    index: Vec<(u64, u64)>,
    /// A whole block of zeros as written, once made.
    zero_block: Option<(Vec<u8>, u64)>,
}

impl<W: Write> XzWriter<W> {
    /// Writes the stream header; `threads` blocks are compressed at once.
    pub fn new(mut out: W, threads: usize) -> io::Result<XzWriter<W>> {
        let mut header = HEADER_MAGIC.to_vec();
        header.extend_from_slice(&FLAGS);
        header.extend_from_slice(&crc32(&FLAGS));
        out.write_all(&header)?;
        Ok(XzWriter {
            out,
            bufs: vec![vec![0u8; XZ_BLOCK as usize]; threads.max(1)],
            at: 0,
            fill: 0,
            index: Vec::new(),
            zero_block: None,
        })
    }

    /// Compresses and writes the blocks buffered: those of zeros as the
    /// one block of zeros, the others side by side, in order.
    fn flush_batch(&mut self) -> io::Result<()> {
        let lens: Vec<usize> = (0..self.at)
            .map(|_| XZ_BLOCK as usize)
            .chain((self.fill > 0).then_some(self.fill))
            .collect();
        let bufs = &self.bufs;
        let zero: Vec<bool> = lens
            .iter()
            .enumerate()
            .map(|(i, n)| *n == XZ_BLOCK as usize && super::compress::is_zero(&bufs[i][..*n]))
            .collect();
        if self.zero_block.is_none() && zero.iter().any(|z| *z) {
            self.zero_block = Some(block(&vec![0u8; XZ_BLOCK as usize])?);
        }
        let made: Vec<Made> = std::thread::scope(|s| {
            let jobs: Vec<_> = lens
                .iter()
                .enumerate()
                .map(|(i, n)| {
                    let (data, zero) = (&bufs[i][..*n], zero[i]);
                    s.spawn(move || {
                        if zero {
                            Ok(None)
                        } else {
                            block(data).map(Some)
                        }
                    })
                })
                .collect();
            jobs.into_iter()
                .map(|j| {
                    j.join()
                        .unwrap_or_else(|_| Err(io::Error::other("compressing an xz block failed")))
                })
                .collect()
        });
        for (m, n) in made.into_iter().zip(&lens) {
            let m = m?;
            let (bytes, unpadded) = match &m {
                Some((b, u)) => (b, *u),
                None => {
                    let (b, u) = self.zero_block.as_ref().expect("made above");
                    (b, *u)
                }
            };
            self.out.write_all(bytes)?;
            self.index.push((unpadded, *n as u64));
        }
        self.at = 0;
        self.fill = 0;
        Ok(())
    }

    /// Writes the last blocks, the index and the footer; returns `W`.
    pub fn finish(mut self) -> io::Result<W> {
        if self.at > 0 || self.fill > 0 {
            self.flush_batch()?;
        }
        let mut idx = vec![0u8];
        varint(&mut idx, self.index.len() as u64);
        for (unpadded, size) in &self.index {
            varint(&mut idx, *unpadded);
            varint(&mut idx, *size);
        }
        pad4(&mut idx);
        let crc = crc32(&idx);
        idx.extend_from_slice(&crc);
        self.out.write_all(&idx)?;
        let mut tail = ((idx.len() / 4 - 1) as u32).to_le_bytes().to_vec();
        tail.extend_from_slice(&FLAGS);
        self.out.write_all(&crc32(&tail))?;
        self.out.write_all(&tail)?;
        self.out.write_all(&FOOTER_MAGIC)?;
        Ok(self.out)
    }
}

impl<W: Write> Write for XzWriter<W> {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        let room = XZ_BLOCK as usize - self.fill;
        let n = b.len().min(room);
        self.bufs[self.at][self.fill..self.fill + n].copy_from_slice(&b[..n]);
        self.fill += n;
        if self.fill == XZ_BLOCK as usize {
            self.at += 1;
            self.fill = 0;
            if self.at == self.bufs.len() {
                self.flush_batch()?;
            }
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc64_and_dictionary_byte_are_xz_s() {
        // CRC-64/XZ's check value.
        assert_eq!(crc64(0, b"123456789"), 0x995D_C9BB_DF19_39FA);
        // In parts, as one.
        assert_eq!(crc64(crc64(0, b"1234"), b"56789"), crc64(0, b"123456789"));
        assert_eq!(dict_byte(1 << 20), 16);
        assert_eq!(dict_byte(1 << 12), 0);
    }
}
