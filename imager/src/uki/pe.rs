//! The PE/COFF side of a UKI: the stub's headers parsed and checked as
//! hostile input, the headers of the UKI made from them, the PE checksum.
//! See the parent module for what is placed where and why.

use anyhow::{Context, Result, bail, ensure};
use std::io::{self, Write};

/// The sections a UKI gets, in file and address order.
pub const SECTIONS: [&str; 4] = [".osrel", ".cmdline", ".linux", ".initrd"];

/// Section flags of the added sections: initialized data, readable.
pub const SECTION_FLAGS: u32 = 0x4000_0040;

/// AArch64's `NOP` (0xd503201f), little-endian: what an arm64 stub made
/// by `objcopy -O binary` from a hand-written PE header (gnu-efi's
/// `crt0-efi-aarch64.S`, Debian's `linuxaa64.efi.stub`) fills its header
/// room with, up to the code at `SizeOfHeaders`.
const AARCH64_NOP: [u8; 4] = [0x1f, 0x20, 0x03, 0xd5];
const MAGIC_PE32_PLUS: u16 = 0x20b;
const SUBSYSTEM_EFI_APPLICATION: u16 = 10;
const FILE_EXECUTABLE_IMAGE: u16 = 0x0002;
const FILE_DLL: u16 = 0x2000;
const PAGE: u32 = 4096;
/// The PE format's limit (and systemd's).
const MAX_SECTIONS: usize = 96;
const SECTION_HEADER: usize = 40;
const SYMBOL: u64 = 18;
/// Offsets in the PE32+ optional header.
const OPT_SIZE_OF_INITIALIZED_DATA: usize = 8;
const OPT_ADDRESS_OF_ENTRY_POINT: usize = 16;
const OPT_SECTION_ALIGNMENT: usize = 32;
const OPT_FILE_ALIGNMENT: usize = 36;
const OPT_SIZE_OF_IMAGE: usize = 56;
const OPT_SIZE_OF_HEADERS: usize = 60;
pub(super) const OPT_CHECKSUM: usize = 64;
const OPT_SUBSYSTEM: usize = 68;
const OPT_NUMBER_OF_RVA_AND_SIZES: usize = 108;
const OPT_DATA_DIRECTORIES: usize = 112;
/// The certificate table (an Authenticode signature), data directory 4.
const DIR_SECURITY: usize = 4;

/// One section of a UKI as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UkiSection {
    pub name: String,
    pub virtual_address: u32,
    /// The content's exact length.
    pub virtual_size: u32,
    pub pointer_to_raw_data: u32,
    pub size_of_raw_data: u32,
}

/// A stub's headers as parsed and checked by [`parse_stub`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StubLayout {
    /// The architecture of its PE machine (`contract::arch`'s `pe_machine`).
    pub arch: contract::Arch,
    /// Offset of the optional header.
    pub optional_header: usize,
    /// Offset of the section table.
    pub section_table: usize,
    pub number_of_sections: usize,
    pub section_alignment: u32,
    pub file_alignment: u32,
    pub size_of_headers: u32,
    /// The lowest file offset of any section's raw data (or
    /// `SizeOfHeaders` if none has any): the end of the room for headers.
    pub first_raw_data: u64,
    /// The end of the last section's raw data in the file.
    pub raw_data_end: u64,
    /// The end of the image in memory (the last section's end, or
    /// `SizeOfImage` if larger).
    pub image_end: u64,
    /// Offset and length (with the string table) of the COFF symbol table,
    /// if any: it lies in the tail.
    pub symbol_table: Option<(u64, u64)>,
    /// The bytes of the file after the last section's raw data, which no
    /// section maps: the firmware never loads them, and the UKI leaves
    /// them out (a COFF symbol table on amd64, `.sbat` and `.sdmagic` text
    /// on arm64; see the module documentation).
    pub tail: u64,
}

impl StubLayout {
    /// How many section headers fit after the stub's own.
    pub fn header_room(&self) -> usize {
        let end = self.first_raw_data.min(u64::from(self.size_of_headers));
        let table_end = (self.section_table + self.number_of_sections * SECTION_HEADER) as u64;
        (end.saturating_sub(table_end) / SECTION_HEADER as u64) as usize
    }
}

pub(super) fn u16_at(b: &[u8], o: usize) -> Option<u16> {
    let s = b.get(o..o.checked_add(2)?)?;
    Some(u16::from_le_bytes([s[0], s[1]]))
}

pub(super) fn u32_at(b: &[u8], o: usize) -> Option<u32> {
    let s = b.get(o..o.checked_add(4)?)?;
    Some(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
}

fn put_u16(b: &mut [u8], o: usize, v: u16) {
    b[o..o + 2].copy_from_slice(&v.to_le_bytes());
}

fn put_u32(b: &mut [u8], o: usize, v: u32) {
    b[o..o + 4].copy_from_slice(&v.to_le_bytes());
}

fn align_up(v: u64, a: u64) -> u64 {
    v.div_ceil(a) * a
}

fn section_name(raw: &[u8]) -> String {
    let end = raw.iter().position(|&c| c == 0).unwrap_or(raw.len());
    String::from_utf8_lossy(&raw[..end]).into_owned()
}

/// Parses and checks a stub's headers: a PE32+ EFI application for a
/// machine of [`contract::arch::ARCHES`] with a `SectionAlignment` from
/// 512 to 4096 and a `FileAlignment` from 512 to it, sections in ascending
/// non-overlapping order inside the file, free room after the section
/// table (zeros, or AArch64 `NOP`s on arm64), no certificate table, a COFF
/// symbol table (if any) after the sections, and none of the UKI's
/// sections (a UKI is not a stub).
pub fn parse_stub(b: &[u8]) -> Result<StubLayout> {
    const NOT_PE: &str = "not a PE/COFF image";
    ensure!(b.starts_with(b"MZ"), "{NOT_PE} (no MZ header)");
    let pe = u32_at(b, 0x3c).context("truncated DOS header")? as usize;
    ensure!(
        pe >= 0x40 && b.get(pe..pe.saturating_add(4)) == Some(&b"PE\0\0"[..]),
        "{NOT_PE} (no PE signature at the offset the DOS header gives)"
    );
    let coff = pe + 4;
    let machine = u16_at(b, coff).context("truncated COFF header")?;
    let Some(arch) = contract::Arch::of_pe_machine(machine) else {
        let known: Vec<String> = contract::arch::ARCHES
            .iter()
            .map(|a| format!("{} ({:#06x})", a.name, a.pe_machine))
            .collect();
        bail!(
            "machine {machine:#06x} is not one a stub is built for: {}",
            known.join(", ")
        );
    };
    let nsec = usize::from(u16_at(b, coff + 2).context("truncated COFF header")?);
    let sym_ptr = u32_at(b, coff + 8).context("truncated COFF header")?;
    let nsym = u32_at(b, coff + 12).context("truncated COFF header")?;
    let opt_size = usize::from(u16_at(b, coff + 16).context("truncated COFF header")?);
    let flags = u16_at(b, coff + 18).context("truncated COFF header")?;
    ensure!(
        flags & FILE_EXECUTABLE_IMAGE != 0 && flags & FILE_DLL == 0,
        "not an executable image (COFF characteristics {flags:#06x})"
    );
    ensure!(
        (1..=MAX_SECTIONS).contains(&nsec),
        "{nsec} sections: a stub has 1 to {MAX_SECTIONS}"
    );
    let opt = coff + 20;
    ensure!(
        opt_size >= OPT_DATA_DIRECTORIES && b.len() >= opt + opt_size,
        "truncated optional header ({opt_size} bytes announced, {} in the file)",
        b.len().saturating_sub(opt)
    );
    let o = |off: usize| u32_at(b, opt + off).unwrap_or(0);
    let magic = u16_at(b, opt).unwrap_or(0);
    ensure!(
        magic == MAGIC_PE32_PLUS,
        "optional header magic {magic:#06x} is not PE32+ (0x20b)"
    );
    let subsystem = u16_at(b, opt + OPT_SUBSYSTEM).unwrap_or(0);
    ensure!(
        subsystem == SUBSYSTEM_EFI_APPLICATION,
        "subsystem {subsystem} is not an EFI application (10)"
    );
    let section_alignment = o(OPT_SECTION_ALIGNMENT);
    let file_alignment = o(OPT_FILE_ALIGNMENT);
    ensure!(
        section_alignment.is_power_of_two() && (512..=PAGE).contains(&section_alignment),
        "SectionAlignment {section_alignment:#x} is not a power of two from 512 to 4096"
    );
    ensure!(
        file_alignment.is_power_of_two() && (512..=section_alignment).contains(&file_alignment),
        "FileAlignment {file_alignment:#x} is not a power of two from 512 to the \
         SectionAlignment ({section_alignment:#x})"
    );
    let size_of_headers = o(OPT_SIZE_OF_HEADERS);
    let size_of_image = o(OPT_SIZE_OF_IMAGE);
    let ndirs = o(OPT_NUMBER_OF_RVA_AND_SIZES) as usize;
    ensure!(
        ndirs <= (opt_size - OPT_DATA_DIRECTORIES) / 8,
        "{ndirs} data directories do not fit in an optional header of {opt_size} bytes"
    );
    if ndirs > DIR_SECURITY {
        let d = OPT_DATA_DIRECTORIES + DIR_SECURITY * 8;
        ensure!(
            o(d) == 0 && o(d + 4) == 0,
            "the stub carries a certificate table (it is signed): give the unsigned stub, \
             the UKI is signed as a whole"
        );
    }
    let table = opt + opt_size;
    let table_end = table + nsec * SECTION_HEADER;
    ensure!(
        table_end <= b.len(),
        "truncated section table ({nsec} sections announced)"
    );
    ensure!(
        size_of_headers % file_alignment == 0
            && (table_end as u64) <= u64::from(size_of_headers)
            && u64::from(size_of_headers) <= b.len() as u64,
        "SizeOfHeaders {size_of_headers:#x} does not cover the section table (ends at \
         {table_end:#x}) within the file, at a FileAlignment boundary"
    );

    let entry = u64::from(o(OPT_ADDRESS_OF_ENTRY_POINT));
    let mut entry_in_section = false;
    let mut first_raw_data = u64::MAX;
    let mut raw_data_end = u64::from(size_of_headers);
    let mut va_end = u64::from(size_of_headers);
    for i in 0..nsec {
        let h = &b[table + i * SECTION_HEADER..table + (i + 1) * SECTION_HEADER];
        let name = section_name(&h[..8]);
        let field = |o: usize| u32::from_le_bytes([h[o], h[o + 1], h[o + 2], h[o + 3]]);
        let (vsize, va, rsize, rptr) = (field(8), field(12), field(16), field(20));
        ensure!(
            !SECTIONS.contains(&name.as_str()),
            "the stub already has a {name} section: it is a UKI, not systemd's stub"
        );
        // Not checked: that `va` is a multiple of SectionAlignment. Debian's
        // stub has `.sdmagic` at 0x19100 with SectionAlignment 0x200, and
        // firmware loads it; only the order matters to the added sections.
        ensure!(
            u64::from(va) >= va_end,
            "section {name:?} at {va:#x} overlaps what comes before it (sections must be in \
             ascending address order)"
        );
        // The loader maps VirtualSize bytes (SizeOfRawData when it is 0);
        // raw data past VirtualSize is not loaded.
        va_end = u64::from(va) + u64::from(if vsize == 0 { rsize } else { vsize });
        entry_in_section |= (u64::from(va)..va_end).contains(&entry);
        if rsize > 0 {
            let end = u64::from(rptr) + u64::from(rsize);
            ensure!(
                rptr % file_alignment == 0
                    && rsize % file_alignment == 0
                    && u64::from(rptr) >= u64::from(size_of_headers)
                    && end <= b.len() as u64,
                "section {name:?}'s raw data ({rsize:#x} bytes at {rptr:#x}) is not aligned \
                 to {file_alignment:#x} or lies outside the file"
            );
            first_raw_data = first_raw_data.min(u64::from(rptr));
            raw_data_end = raw_data_end.max(end);
        }
    }
    if first_raw_data == u64::MAX {
        first_raw_data = u64::from(size_of_headers);
    }
    ensure!(
        u64::from(size_of_image) >= va_end,
        "SizeOfImage {size_of_image:#x} does not cover the last section (ends at {va_end:#x})"
    );
    ensure!(
        entry_in_section,
        "the entry point {entry:#x} is not in a section: the headers (and the room the UKI's \
         section headers take) would be run"
    );
    ensure!(
        is_free(&b[table_end..size_of_headers as usize], table_end, arch),
        "the bytes after the section table are not empty: no room for the UKI's headers"
    );

    // After the sections: bytes no section maps (the COFF symbol table with
    // its string table, or anything else), never loaded, left out.
    let symbol_table = if sym_ptr != 0 {
        let start = u64::from(sym_ptr);
        let syms = u64::from(nsym) * SYMBOL;
        ensure!(
            start >= raw_data_end && start + syms + 4 <= b.len() as u64,
            "the COFF symbol table ({nsym} symbols at {sym_ptr:#x}) lies inside the sections \
             or past the end of the file"
        );
        let strings = u64::from(u32_at(b, (start + syms) as usize).unwrap_or(0)).max(4);
        let end = start + syms + strings;
        ensure!(
            end <= b.len() as u64,
            "the COFF symbol table's strings ({strings} bytes at {:#x}) pass the end of the file",
            start + syms
        );
        Some((start, end - start))
    } else {
        None
    };
    Ok(StubLayout {
        arch,
        optional_header: opt,
        section_table: table,
        number_of_sections: nsec,
        section_alignment,
        file_alignment,
        size_of_headers,
        first_raw_data,
        raw_data_end,
        image_end: va_end.max(u64::from(size_of_image)),
        symbol_table,
        tail: b.len() as u64 - raw_data_end,
    })
}

/// Whether `room` (at file offset `at`, after the section table) is free
/// for section headers: all zeros, or on arm64 zeros and whole AArch64
/// `NOP` words. The room lies before `SizeOfHeaders`, and an entry point
/// inside the headers is refused: the NOPs are padding never run.
fn is_free(room: &[u8], at: usize, arch: contract::Arch) -> bool {
    if room.iter().all(|&c| c == 0) {
        return true;
    }
    arch == contract::Arch::Arm64
        && at.is_multiple_of(4)
        && room.len().is_multiple_of(4)
        && room
            .chunks_exact(4)
            .all(|w| w == [0; 4] || w == AARCH64_NOP)
}

/// The UKI's headers: the stub up to the end of its sections' raw data,
/// with a section header for each of [`SECTIONS`] (content lengths `lens`)
/// and the optional and file headers updated, `CheckSum` 0 (the caller
/// fills it in once the file is written). The sections' raw data follows
/// these bytes in order, each padded to `FileAlignment`.
pub fn uki_headers(stub: &[u8], lens: [u64; 4]) -> Result<(Vec<u8>, Vec<UkiSection>, u32)> {
    let l = parse_stub(stub)?;
    ensure!(
        l.header_room() >= SECTIONS.len(),
        "no room for the UKI's section headers: the stub has room for {} more before the end \
         of its headers (SizeOfHeaders {:#x}, first section data at {:#x}), the UKI needs {}; \
         the headers cannot be moved without relinking the stub",
        l.header_room(),
        l.size_of_headers,
        l.first_raw_data,
        SECTIONS.len()
    );
    ensure!(
        l.number_of_sections + SECTIONS.len() <= MAX_SECTIONS,
        "the stub has {} sections: with the UKI's {} it would pass the PE limit of {MAX_SECTIONS}",
        l.number_of_sections,
        SECTIONS.len()
    );
    let fa = u64::from(l.file_alignment);
    let too_big = || anyhow::anyhow!("the UKI would pass the PE format's 4 GiB limit");
    ensure!(lens.iter().all(|&n| n <= u64::from(u32::MAX)), too_big());
    let step = u64::from(l.section_alignment.max(PAGE));
    let mut va = align_up(l.image_end, step);
    let mut ptr = align_up(l.raw_data_end, fa);
    let mut placed = Vec::with_capacity(SECTIONS.len());
    let mut raw_total = 0u64;
    for (name, &len) in SECTIONS.iter().zip(&lens) {
        let raw = align_up(len, fa);
        let s = UkiSection {
            name: name.to_string(),
            virtual_address: u32::try_from(va).map_err(|_| too_big())?,
            virtual_size: u32::try_from(len).map_err(|_| too_big())?,
            pointer_to_raw_data: u32::try_from(ptr).map_err(|_| too_big())?,
            size_of_raw_data: u32::try_from(raw).map_err(|_| too_big())?,
        };
        u32::try_from(ptr + raw).map_err(|_| too_big())?;
        raw_total += raw;
        va = align_up(va + len, step);
        ptr += raw;
        placed.push(s);
    }
    let last = placed.last().expect("four sections");
    let size_of_image = align_up(
        u64::from(last.virtual_address) + u64::from(last.virtual_size),
        u64::from(l.section_alignment),
    );
    let size_of_image = u32::try_from(size_of_image).map_err(|_| too_big())?;
    let opt = l.optional_header;
    let init = u64::from(u32_at(stub, opt + OPT_SIZE_OF_INITIALIZED_DATA).unwrap_or(0));
    let init = u32::try_from(init + raw_total).map_err(|_| too_big())?;

    let mut h = stub[..l.raw_data_end as usize].to_vec();
    h.resize(align_up(l.raw_data_end, fa) as usize, 0);
    let coff = opt - 20;
    put_u16(
        &mut h,
        coff + 2,
        (l.number_of_sections + SECTIONS.len()) as u16,
    );
    put_u32(&mut h, coff + 8, 0);
    put_u32(&mut h, coff + 12, 0);
    put_u32(&mut h, opt + OPT_SIZE_OF_INITIALIZED_DATA, init);
    put_u32(&mut h, opt + OPT_SIZE_OF_IMAGE, size_of_image);
    put_u32(&mut h, opt + OPT_CHECKSUM, 0);
    let mut at = l.section_table + l.number_of_sections * SECTION_HEADER;
    for s in &placed {
        let e = &mut h[at..at + SECTION_HEADER];
        e.fill(0);
        e[..s.name.len()].copy_from_slice(s.name.as_bytes());
        put_u32(e, 8, s.virtual_size);
        put_u32(e, 12, s.virtual_address);
        put_u32(e, 16, s.size_of_raw_data);
        put_u32(e, 20, s.pointer_to_raw_data);
        put_u32(e, 36, SECTION_FLAGS);
        at += SECTION_HEADER;
    }
    Ok((h, placed, size_of_image))
}

/// The PE checksum, computed over what is written: 16-bit little-endian
/// words summed with end-around carry, plus the file length. The
/// `CheckSum` field must be written as zero.
#[derive(Debug, Default)]
pub(super) struct PeChecksum {
    sum: u64,
    pub(super) len: u64,
    odd: Option<u8>,
}

impl PeChecksum {
    pub(super) fn update(&mut self, mut buf: &[u8]) {
        self.len += buf.len() as u64;
        if let Some(lo) = self.odd.take() {
            match buf.split_first() {
                Some((&hi, rest)) => {
                    self.sum += u64::from(u16::from_le_bytes([lo, hi]));
                    buf = rest;
                }
                None => {
                    self.odd = Some(lo);
                    return;
                }
            }
        }
        let mut words = buf.chunks_exact(2);
        for w in &mut words {
            self.sum += u64::from(u16::from_le_bytes([w[0], w[1]]));
        }
        self.odd = words.remainder().first().copied();
        // Folded now and then, the sum never overflows.
        self.sum = (self.sum & 0xffff_ffff) + (self.sum >> 32);
    }

    pub(super) fn finish(mut self) -> u32 {
        if let Some(lo) = self.odd.take() {
            self.sum += u64::from(lo);
        }
        let mut s = self.sum;
        while s > 0xffff {
            s = (s & 0xffff) + (s >> 16);
        }
        (s + self.len) as u32
    }
}

/// The PE checksum of a whole image, its `CheckSum` field (at
/// `checksum_at`) read as zero.
pub fn pe_checksum(image: &[u8], checksum_at: usize) -> u32 {
    let mut c = PeChecksum::default();
    let cut = checksum_at.min(image.len());
    let after = checksum_at.saturating_add(4).min(image.len());
    c.update(&image[..cut]);
    c.update(&[0; 4][..after - cut]);
    c.update(&image[after..]);
    c.finish()
}

pub(super) struct Summing<W> {
    pub(super) inner: W,
    pub(super) sum: PeChecksum,
}

impl<W: Write> Write for Summing<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.sum.update(&buf[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}
