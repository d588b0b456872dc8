//! A hybrid ISO 9660 image of our own: the same file boots from a CD (El
//! Torito, BIOS and UEFI) and from a USB stick it is copied to (GRUB's
//! hybrid MBR for BIOS, a GPT whose EFI System Partition is the EFI boot
//! image for UEFI). No external ISO tool writes it; `xorriso` only reads it
//! back in the tests.
//!
//! # API
//!
//! [`write`] takes an [`IsoSpec`] (volume identity, `epoch` as
//! SOURCE_DATE_EPOCH, the files as [`IsoFile`]s read from disk or given as
//! bytes, an optional [`BiosBoot`] and an optional EFI image path) and writes
//! the image to a new file at `out`, which the caller places in a staging
//! directory. Everything is validated before `out` is created; if a write
//! fails afterwards, `out` is removed. File data is streamed from the
//! sources in 64 KiB chunks: no file and no image is held in memory. The
//! returned [`IsoReport`] gives the size and where the boot pieces went.
//!
//! **Deterministic**: the same spec (and the same source bytes) gives the
//! same image, byte for byte. All dates are `epoch`; files are laid out in
//! sorted path order; the disk GUID, the EFI partition's GUID and the MBR
//! disk signature are derived ([`contract::guid::derive`]) from the volume
//! identity: a SHA-256 of the volume, volume set and publisher identifiers,
//! the epoch, every file's path and size and the boot image paths. (Not of
//! the file contents: that would cost a second read of every file; the
//! volume set identifier is where the caller puts a digest of the payload.)
//!
//! # On-disk layout (2048-byte blocks, LBA = block number)
//!
//! | LBA | what |
//! |---|---|
//! | 0–15 | system area (32 KiB), in 512-byte sectors: 0 the MBR (GRUB's hybrid boot code, disk signature, partition table), 1 the primary GPT header, 2–33 its entry array |
//! | 16 | Primary Volume Descriptor |
//! | 17 | El Torito Boot Record (only with a boot entry) |
//! | next | Volume Descriptor Set Terminator |
//! | next | type L path table, then type M path table |
//! | next | Rock Ridge continuation areas (the ER entry, long names) |
//! | next | directories, in path-table order (breadth first, sorted) |
//! | next | El Torito boot catalog (only with a boot entry) |
//! | next | file data, in sorted path order, each file in one extent |
//! | last 9 | only with an EFI image: zeros, then the backup GPT entry array and header in the last 33 512-byte sectors |
//!
//! The **volume space size** in the PVD covers the whole file, the backup
//! GPT included: a reader that copies or hashes "the ISO" by its volume
//! size gets every byte of the file, and the file size is always
//! `volume_blocks × 2048`. Nothing pads the end for old CD read-ahead bugs.
//!
//! # ISO 9660 and Rock Ridge
//!
//! Plain ISO 9660 names are level-2 style: upper case d-characters (`A–Z
//! 0–9 _`, anything else becomes `_`), files `NAME.EXT;1` (name and
//! extension at most 30 together, the extension at most 8), directories at
//! most 31, made unique per directory with a `_N` suffix. Records are
//! sorted by that identifier as ECMA-119 9.3 asks. At most 8 directory
//! levels (the root and 7 below it). The real names are in Rock Ridge
//! (RRIP 1.10, `RRIP_1991A`): the root's "." record carries SP, a CE
//! pointing to the ER entry, and every record carries PX (directories
//! 0555, files 0444, uid/gid 0, 36-byte form without serial number), TF
//! (modify, access, attribute change = `epoch`) and, but for "." and "..",
//! NM with the real name; when a record would pass 255 bytes, its NM moves
//! into a continuation area (in pieces of at most 250 bytes with the
//! CONTINUE flag). Empty files have extent 0. There is no Joliet tree:
//! Windows shows the plain names.
//!
//! # El Torito
//!
//! The boot catalog has the validation entry (platform of the default
//! entry, checksum, 55 AA) and a default entry; with both boot images a
//! final section header for platform 0xEF with one entry:
//!
//! * **BIOS** (default entry, platform 0x00): no emulation, load segment 0
//!   (= 0x7C0), 4 virtual sectors: the 2048 bytes of GRUB's `cdboot.img`,
//!   which then reads the rest of `eltorito.img` using the boot-info table.
//! * **UEFI** (platform 0xEF): no emulation, sector count = the FAT image's
//!   size in 512-byte sectors, or 0 when that does not fit 16 bits: EDK2
//!   (OVMF) then takes the rest of the medium as the partition and its FAT
//!   driver reads the file system's own size (EDK2
//!   `PartitionDxe/ElTorito.c`: "When the SectorCount < 2, set the
//!   Partition as the whole CD"). With only an EFI image it is the default
//!   entry and the validation entry says 0xEF.
//!
//! The stored BIOS image is patched as `xorriso -boot-info-table
//! --grub2-boot-info` patches it: at byte 8 the boot-info table (PVD LBA
//! 16, the image's LBA, its length, the 32-bit little-endian word sum of
//! its bytes from offset 64 on, 40 zero bytes) and at byte 2548 (= 2048 +
//! 0x1F4: the first blocklist entry of `diskboot.img`, which follows the
//! 2048-byte `cdboot.img`) the u64 LE `image LBA × 4 + 5`: in 512-byte
//! sectors, the sector after `diskboot.img`. The checksum is of the bytes
//! as stored (after the 2548 patch), as xorriso 1.5.4 computes it (checked
//! against `xorriso -as mkisofs -boot-info-table --grub2-boot-info` on
//! Debian's eltorito.img); GRUB's cdboot does not check it.
//!
//! # The system area: booting from a USB stick
//!
//! * **BIOS**: the MBR's first 440 bytes are GRUB's `boot_hybrid.img` (the
//!   boot.S built with `HYBRID_BOOT`, whose `kernel_sector` is at 0x1B0,
//!   not 0x5C) with the u64 LE `eltorito LBA × 4 + 4` at 0x1B0: the
//!   512-byte sector of `diskboot.img`, whose patched blocklist then loads
//!   the rest of core.img (xorriso's `--grub2-mbr` does the same and
//!   patches nothing else). 440–443 hold the derived disk signature.
//! * **UEFI**: a GPT written by [`bootstate::gpt::write_new`] (512-byte
//!   sectors, 128 entries) with one partition "EFI" of the EFI System type
//!   over exactly the EFI image's extent. Its protective MBR entry (type
//!   0xEE, LBA 1 to the end) stays in the MBR under GRUB's code: the MBR
//!   is written last, keeping bytes 446–511 as `write_new` wrote them.
//!   No 0xEF MBR entry, no boot flag: SeaBIOS runs the MBR code whatever
//!   the table says, OVMF reads the GPT, and a hybrid (non-protective) MBR
//!   would make Linux and `sfdisk` read the MBR instead of the GPT. Some
//!   old PC BIOSes only boot a USB stick with an active partition; the
//!   UEFI specification asks a protective MBR not to set one.
//! * Without an EFI image there is no GPT: the MBR has GRUB's code and an
//!   empty partition table. Without a BIOS image the MBR is `write_new`'s
//!   plain protective MBR.
//!
//! Copied to a stick larger than the image, the backup GPT is not at the
//! disk's end; firmware and Linux then use the primary (and may complain),
//! as with every hybrid ISO.
//! The system area is laid out for 512-byte sectors only (as xorriso's):
//! on a stick with 4096-byte logical sectors UEFI finds no GPT, and boots
//! only through El Torito if at all.
//!
//! # Identifiers seen by the runtime
//!
//! `blkid` reports the volume identifier as `LABEL`, the volume set
//! identifier as `VOLUME_SET_ID` and, as for every ISO 9660 volume, the
//! PVD's modification date as `UUID` (`2023-11-14-22-13-20-00`): it comes
//! from `epoch`, so two images built with the same epoch share it. Use the
//! volume set identifier (a digest) to tell images apart, not the UUID.

use anyhow::{Context, Result, anyhow, bail, ensure};
use bootstate::gpt::{self, NewPartition};
use contract::Guid;
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashSet};
use std::fs::File;
use std::io::{BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// ISO 9660 logical block size.
pub const BLOCK: u64 = 2048;
/// The disk sector size of the hybrid system area.
pub const SECTOR: u64 = 512;
/// LBA of the Primary Volume Descriptor.
pub const PVD_LBA: u32 = 16;
/// Offset of the boot-info table in the BIOS boot image.
pub const BOOT_INFO_OFFSET: usize = 8;
/// Offset of GRUB's `--grub2-boot-info` patch in the BIOS boot image:
/// `diskboot.img`'s first blocklist entry (2048 + 0x1F4).
pub const GRUB2_BOOT_INFO_OFFSET: usize = 2548;
/// Offset of `kernel_sector` in GRUB's `boot_hybrid.img`.
pub const HYBRID_KERNEL_SECTOR: usize = 0x1B0;
/// The MBR code area that comes from `boot_hybrid.img`.
pub const MBR_CODE: usize = 440;
/// The deepest directory level ECMA-119 allows, the root being level 1.
pub const MAX_LEVELS: usize = 8;
/// The longest Rock Ridge name, in bytes.
pub const MAX_NAME: usize = 255;
/// The Rock Ridge extension identifier written in the ER entry.
pub const RRIP_ID: &str = "RRIP_1991A";

/// A file of the image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IsoFile {
    /// `/`-separated path, no leading `/`, e.g. `boot/grub/grub.cfg`.
    pub path: String,
    pub source: IsoSource,
}

/// Where a file's bytes come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IsoSource {
    /// Streamed from this file when the image is written.
    File(PathBuf),
    Bytes(Vec<u8>),
}

/// BIOS boot through GRUB.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BiosBoot {
    /// Path (in [`IsoSpec::files`]) of GRUB's `eltorito.img`
    /// (`grub-mkimage -O i386-pc-eltorito`: cdboot.img + core.img).
    pub image: String,
    /// GRUB's `boot_hybrid.img`, 512 bytes.
    pub hybrid_mbr: Vec<u8>,
}

/// What to write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IsoSpec {
    /// 1 to 32 d-characters (`A-Z 0-9 _`).
    pub volume_id: String,
    /// At most 128 a-characters (upper case, digits, space and
    /// `!"%&'()*+,-./:;<=>?_`).
    pub volume_set_id: String,
    /// At most 128 a-characters.
    pub publisher: String,
    /// SOURCE_DATE_EPOCH: every date of the image (at most year 2155).
    pub epoch: u64,
    pub files: Vec<IsoFile>,
    pub bios: Option<BiosBoot>,
    /// Path (in `files`) of a FAT image holding `EFI/BOOT/BOOTX64.EFI`.
    pub efi_image: Option<String>,
}

/// What [`write`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IsoReport {
    /// Bytes of the image (= `volume_blocks` × 2048).
    pub size: u64,
    pub volume_blocks: u32,
    pub catalog_lba: Option<u32>,
    pub bios_image_lba: Option<u32>,
    pub efi_image_lba: Option<u32>,
    /// The EFI partition's first and last 512-byte sector.
    pub efi_partition: Option<(u64, u64)>,
    /// The GPT's disk GUID (with an EFI image).
    pub disk_guid: Option<Guid>,
    /// The MBR disk signature (at byte 440), when the image has a BIOS or
    /// an EFI boot image (else the system area is all zeros).
    pub mbr_signature: Option<u32>,
}

// ---------------------------------------------------------------- encoding

fn both16(v: u16) -> [u8; 4] {
    let (l, b) = (v.to_le_bytes(), v.to_be_bytes());
    [l[0], l[1], b[0], b[1]]
}

fn both32(v: u32) -> [u8; 8] {
    let (l, b) = (v.to_le_bytes(), v.to_be_bytes());
    [l[0], l[1], l[2], l[3], b[0], b[1], b[2], b[3]]
}

fn put(buf: &mut [u8], at: usize, v: &[u8]) {
    if let Some(s) = buf.get_mut(at..at + v.len()) {
        s.copy_from_slice(v);
    }
}

/// A civil date (UTC) from seconds since 1970 (H. Hinnant's algorithm).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Date {
    year: u64,
    month: u8,
    day: u8,
    hour: u8,
    minute: u8,
    second: u8,
}

impl Date {
    fn of(epoch: u64) -> Date {
        let days = (epoch / 86400) as i64;
        let secs = epoch % 86400;
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z.rem_euclid(146_097);
        let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = doy - (153 * mp + 2) / 5 + 1;
        let month = if mp < 10 { mp + 3 } else { mp - 9 };
        let year = yoe + era * 400 + i64::from(month <= 2);
        Date {
            year: year.max(0) as u64,
            month: month as u8,
            day: day as u8,
            hour: (secs / 3600) as u8,
            minute: (secs / 60 % 60) as u8,
            second: (secs % 60) as u8,
        }
    }

    /// The 7-byte form of directory records and TF (ECMA-119 9.1.5),
    /// GMT offset 0.
    fn short(&self) -> [u8; 7] {
        [
            (self.year.saturating_sub(1900)).min(255) as u8,
            self.month,
            self.day,
            self.hour,
            self.minute,
            self.second,
            0,
        ]
    }

    /// The 17-byte form of volume descriptors (ECMA-119 8.4.26.1).
    fn long(&self) -> [u8; 17] {
        let s = format!(
            "{:04}{:02}{:02}{:02}{:02}{:02}00",
            self.year, self.month, self.day, self.hour, self.minute, self.second
        );
        let mut out = [0u8; 17];
        out[..16].copy_from_slice(&s.as_bytes()[..16]);
        out
    }
}

/// "Not specified" in a volume descriptor date.
const NO_DATE: [u8; 17] = [
    b'0', b'0', b'0', b'0', b'0', b'0', b'0', b'0', b'0', b'0', b'0', b'0', b'0', b'0', b'0', b'0',
    0,
];

fn is_d_char(c: u8) -> bool {
    c.is_ascii_uppercase() || c.is_ascii_digit() || c == b'_'
}

fn is_a_char(c: u8) -> bool {
    is_d_char(c) || b" !\"%&'()*+,-./:;<=>?".contains(&c)
}

// ---------------------------------------------------------------- validation

fn check_identifier(what: &str, value: &str, max: usize, d_only: bool) -> Result<()> {
    ensure!(
        value.len() <= max,
        "the {what} {value:?} is {} bytes long: ISO 9660 allows at most {max}",
        value.len()
    );
    if let Some(c) = value
        .chars()
        .find(|c| !c.is_ascii() || !(if d_only { is_d_char } else { is_a_char })(*c as u8))
    {
        if d_only {
            bail!(
                "the {what} {value:?} holds {c:?}: ISO 9660 allows only d-characters (A-Z, \
                 0-9 and _; no lower case)"
            );
        }
        bail!(
            "the {what} {value:?} holds {c:?}: ISO 9660 allows only a-characters (A-Z, 0-9, \
             space and !\"%&'()*+,-./:;<=>?_; no lower case, so write hex digests in upper case)"
        );
    }
    Ok(())
}

/// The components of a valid path.
fn components(path: &str) -> Result<Vec<&str>> {
    ensure!(!path.is_empty(), "an ISO file has an empty path");
    ensure!(
        !path.starts_with('/'),
        "the ISO path {path:?} starts with '/': paths are relative to the image's root"
    );
    let parts: Vec<&str> = path.split('/').collect();
    for p in &parts {
        ensure!(
            !p.is_empty(),
            "the ISO path {path:?} has an empty component"
        );
        ensure!(
            *p != "." && *p != "..",
            "the ISO path {path:?} has a {p:?} component"
        );
        ensure!(
            p.len() <= MAX_NAME,
            "the ISO path {path:?} has a name of {} bytes: Rock Ridge names are at most \
             {MAX_NAME} bytes",
            p.len()
        );
        ensure!(!p.contains('\0'), "the ISO path {path:?} holds a NUL byte");
    }
    ensure!(
        parts.len() <= MAX_LEVELS,
        "the ISO path {path:?} is {} directories deep: ISO 9660 allows {MAX_LEVELS} levels \
         (the root and {} below it)",
        parts.len() - 1,
        MAX_LEVELS - 1
    );
    Ok(parts)
}

// ---------------------------------------------------------------- the tree

#[derive(Debug)]
enum Kind {
    Dir {
        children: Vec<usize>,
        parent: usize,
        lba: u32,
        size: u32,
        /// Path table number (1 for the root).
        number: u16,
    },
    File {
        /// Index in the spec's files.
        file: usize,
        size: u64,
        lba: u32,
    },
}

#[derive(Debug)]
struct Node {
    /// The real (Rock Ridge) name; empty for the root.
    name: String,
    /// The ISO 9660 identifier, version included for files.
    ident: Vec<u8>,
    kind: Kind,
    /// System use bytes of this node's record in its parent, and of its own
    /// "." record (directories), laid out by [`layout_susp`].
    susp: Susp,
    dot_susp: Susp,
}

/// A record's system use field and what goes to a continuation area.
#[derive(Debug, Default, Clone)]
struct Susp {
    inline: Vec<u8>,
    /// Bytes for a continuation area, and where the CE entry sits in
    /// `inline` (its location is filled in once the area is placed).
    cont: Vec<u8>,
    ce_at: Option<usize>,
    /// (LBA, offset) of the continuation area once placed.
    cont_at: (u32, u32),
}

fn pad_even(len: usize) -> usize {
    len + (len & 1)
}

/// Length of a directory record with an identifier of `ident` bytes and
/// `su` bytes of system use.
fn record_len(ident: usize, su: usize) -> usize {
    pad_even(33 + ident) + su
}

fn px(mode: u32, links: u32) -> Vec<u8> {
    let mut e = vec![b'P', b'X', 36, 1];
    e.extend_from_slice(&both32(mode));
    e.extend_from_slice(&both32(links));
    e.extend_from_slice(&both32(0));
    e.extend_from_slice(&both32(0));
    e
}

fn tf(date: &Date) -> Vec<u8> {
    // MODIFY | ACCESS | ATTRIBUTES, short form.
    let mut e = vec![b'T', b'F', 26, 1, 0x0E];
    for _ in 0..3 {
        e.extend_from_slice(&date.short());
    }
    e
}

/// NM entries for `name`, each at most 255 bytes, CONTINUE on all but the
/// last.
fn nm(name: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let chunks: Vec<&[u8]> = name.chunks(250).collect();
    for (i, c) in chunks.iter().enumerate() {
        let flags = u8::from(i + 1 < chunks.len());
        out.extend_from_slice(&[b'N', b'M', (5 + c.len()) as u8, 1, flags]);
        out.extend_from_slice(c);
    }
    out
}

fn sp() -> Vec<u8> {
    vec![b'S', b'P', 7, 1, 0xBE, 0xEF, 0]
}

const ER_DES: &str = "THE ROCK RIDGE INTERCHANGE PROTOCOL PROVIDES SUPPORT FOR POSIX FILE SYSTEM \
                      SEMANTICS";
const ER_SRC: &str = "PLEASE CONTACT DISC PUBLISHER FOR SPECIFICATION SOURCE.  SEE PUBLISHER \
                      IDENTIFIER IN PRIMARY VOLUME DESCRIPTOR FOR CONTACT INFORMATION.";

fn er() -> Vec<u8> {
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

const CE_LEN: usize = 28;

/// The system use of a record: `head` always inline, `tail` inline when the
/// record stays within 255 bytes, else in a continuation area.
fn susp(ident_len: usize, head: Vec<u8>, tail: Vec<u8>, force_cont: bool) -> Susp {
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

/// The plain ISO 9660 identifier for a real name (without uniqueness).
fn iso_ident(name: &str, dir: bool) -> (String, String) {
    let map = |s: &str| -> String {
        s.bytes()
            .map(|c| {
                let c = c.to_ascii_uppercase();
                if is_d_char(c) { c as char } else { '_' }
            })
            .collect()
    };
    if dir {
        let mut n = map(name);
        n.truncate(31);
        return (n, String::new());
    }
    let (base, ext) = match name.rfind('.') {
        Some(i) if i > 0 => (&name[..i], &name[i + 1..]),
        _ => (name, ""),
    };
    let mut ext = map(ext);
    ext.truncate(8);
    let mut base = map(base);
    base.truncate(30 - ext.len());
    if base.is_empty() && ext.is_empty() {
        base.push('_');
    }
    (base, ext)
}

fn full_ident(base: &str, ext: &str, dir: bool) -> Vec<u8> {
    if dir {
        base.as_bytes().to_vec()
    } else {
        format!("{base}.{ext};1").into_bytes()
    }
}

/// The ECMA-119 9.3 ordering key of an identifier: name, then extension,
/// each padded with spaces.
fn order_key(ident: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let s = ident.split(|c| *c == b';').next().unwrap_or(ident);
    let (name, ext) = match s.iter().position(|c| *c == b'.') {
        Some(i) => (&s[..i], &s[i + 1..]),
        None => (s, &[][..]),
    };
    let mut n = name.to_vec();
    n.resize(32, b' ');
    let mut e = ext.to_vec();
    e.resize(32, b' ');
    (n, e)
}

struct Layout {
    nodes: Vec<Node>,
    /// Directories in path-table order.
    dirs: Vec<usize>,
    /// Files (node indices) in data order.
    files: Vec<usize>,
}

/// Builds the tree of `spec`'s files (sizes given).
fn build_tree(spec: &IsoSpec, sizes: &[u64]) -> Result<Layout> {
    let mut nodes = vec![Node {
        name: String::new(),
        ident: vec![0],
        kind: Kind::Dir {
            children: Vec::new(),
            parent: 0,
            lba: 0,
            size: 0,
            number: 1,
        },
        susp: Susp::default(),
        dot_susp: Susp::default(),
    }];
    // Children by real name, per directory node.
    let mut by_name: Vec<BTreeMap<String, usize>> = vec![BTreeMap::new()];
    let mut order: Vec<usize> = (0..spec.files.len()).collect();
    order.sort_by(|a, b| spec.files[*a].path.cmp(&spec.files[*b].path));
    for &i in &order {
        let f = &spec.files[i];
        let parts = components(&f.path)?;
        let mut dir = 0usize;
        for (k, part) in parts.iter().enumerate() {
            let last = k + 1 == parts.len();
            match by_name[dir].get(*part).copied() {
                Some(n) => match (&nodes[n].kind, last) {
                    (Kind::Dir { .. }, false) => dir = n,
                    (Kind::File { .. }, _) | (Kind::Dir { .. }, true) => bail!(
                        "the ISO path {:?} is given twice, or as both a file and a directory",
                        parts[..=k].join("/")
                    ),
                },
                None => {
                    let n = nodes.len();
                    let kind = if last {
                        Kind::File {
                            file: i,
                            size: sizes[i],
                            lba: 0,
                        }
                    } else {
                        Kind::Dir {
                            children: Vec::new(),
                            parent: dir,
                            lba: 0,
                            size: 0,
                            number: 0,
                        }
                    };
                    nodes.push(Node {
                        name: (*part).to_string(),
                        ident: Vec::new(),
                        kind,
                        susp: Susp::default(),
                        dot_susp: Susp::default(),
                    });
                    by_name.push(BTreeMap::new());
                    by_name[dir].insert((*part).to_string(), n);
                    if let Kind::Dir { children, .. } = &mut nodes[dir].kind {
                        children.push(n);
                    }
                    if !last {
                        dir = n;
                    }
                }
            }
        }
    }
    // Unique ISO identifiers per directory, children sorted by them.
    for d in 0..nodes.len() {
        let kids = match &nodes[d].kind {
            Kind::Dir { children, .. } => children.clone(),
            Kind::File { .. } => continue,
        };
        let mut used: HashSet<(Vec<u8>, Vec<u8>)> = HashSet::new();
        for &c in &kids {
            let is_dir = matches!(nodes[c].kind, Kind::Dir { .. });
            let (base, ext) = iso_ident(&nodes[c].name, is_dir);
            let mut ident = full_ident(&base, &ext, is_dir);
            let mut n = 1u32;
            while used.contains(&order_key(&ident)) {
                let suffix = format!("_{n}");
                let room = if is_dir { 31 } else { 30 - ext.len() };
                let mut b = base.clone();
                b.truncate(room.saturating_sub(suffix.len()));
                b.push_str(&suffix);
                ident = full_ident(&b, &ext, is_dir);
                n += 1;
            }
            used.insert(order_key(&ident));
            nodes[c].ident = ident;
        }
        let mut sorted = kids;
        sorted.sort_by(|a, b| order_key(&nodes[*a].ident).cmp(&order_key(&nodes[*b].ident)));
        if let Kind::Dir { children, .. } = &mut nodes[d].kind {
            *children = sorted;
        }
    }
    // Path-table order: breadth first, children in identifier order.
    let mut dirs = vec![0usize];
    let mut i = 0;
    while i < dirs.len() {
        if let Kind::Dir { children, .. } = &nodes[dirs[i]].kind {
            for &c in children {
                if matches!(nodes[c].kind, Kind::Dir { .. }) {
                    dirs.push(c);
                }
            }
        }
        i += 1;
    }
    ensure!(
        dirs.len() <= usize::from(u16::MAX),
        "{} directories: the path table numbers at most 65535",
        dirs.len()
    );
    for (k, &d) in dirs.iter().enumerate() {
        if let Kind::Dir { number, .. } = &mut nodes[d].kind {
            *number = (k + 1) as u16;
        }
    }
    // Files in sorted path order.
    let mut files: Vec<(String, usize)> = Vec::new();
    for (n, node) in nodes.iter().enumerate() {
        if let Kind::File { file, .. } = node.kind {
            files.push((spec.files[file].path.clone(), n));
        }
    }
    files.sort();
    Ok(Layout {
        nodes,
        dirs,
        files: files.into_iter().map(|(_, n)| n).collect(),
    })
}

/// Fills every node's system use (Rock Ridge) entries.
fn layout_susp(l: &mut Layout, date: &Date) {
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
fn place_continuations(l: &mut Layout, first_lba: u32) -> u32 {
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
fn susp_bytes(s: &Susp) -> Vec<u8> {
    let mut b = s.inline.clone();
    if let Some(at) = s.ce_at {
        put(&mut b, at + 4, &both32(s.cont_at.0));
        put(&mut b, at + 12, &both32(s.cont_at.1));
        put(&mut b, at + 20, &both32(s.cont.len() as u32));
    }
    b
}

fn dir_record(ident: &[u8], lba: u32, size: u32, is_dir: bool, date: &Date, su: &[u8]) -> Vec<u8> {
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
fn dir_records(l: &Layout, d: usize, date: &Date) -> Vec<Vec<u8>> {
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

fn root_links(l: &Layout) -> u32 {
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
fn pack_records(records: &[Vec<u8>]) -> Vec<u8> {
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

fn path_table(l: &Layout, big_endian: bool) -> Vec<u8> {
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

fn blocks_of(bytes: u64) -> u64 {
    bytes.div_ceil(BLOCK)
}

// ---------------------------------------------------------------- sources

fn open_source(f: &IsoFile) -> Result<Box<dyn Read + '_>> {
    Ok(match &f.source {
        IsoSource::Bytes(b) => Box::new(&b[..]),
        IsoSource::File(p) => Box::new(
            File::open(p).with_context(|| format!("opening {} for {}", p.display(), f.path))?,
        ),
    })
}

fn source_size(f: &IsoFile) -> Result<u64> {
    match &f.source {
        IsoSource::Bytes(b) => Ok(b.len() as u64),
        IsoSource::File(p) => {
            let m = std::fs::metadata(p)
                .with_context(|| format!("reading {} (source of {})", p.display(), f.path))?;
            ensure!(
                m.is_file(),
                "{} (source of {}) is not a regular file",
                p.display(),
                f.path
            );
            Ok(m.len())
        }
    }
}

/// Streams `size` bytes of `f` to `w`, overlaying `patches` (offset, bytes);
/// refuses a source whose size changed.
fn copy_patched(
    f: &IsoFile,
    size: u64,
    patches: &[(u64, Vec<u8>)],
    mut w: impl FnMut(&[u8]) -> Result<()>,
) -> Result<()> {
    let mut r = open_source(f)?;
    let mut buf = vec![0u8; 64 * 1024];
    let mut pos = 0u64;
    loop {
        let n = r
            .read(&mut buf)
            .with_context(|| format!("reading the source of {}", f.path))?;
        if n == 0 {
            break;
        }
        ensure!(
            pos + n as u64 <= size,
            "the source of {} grew while the image was written (was {size} bytes)",
            f.path
        );
        let chunk = &mut buf[..n];
        for (at, bytes) in patches {
            let (start, end) = (*at, *at + bytes.len() as u64);
            let (cs, ce) = (pos, pos + n as u64);
            let (s, e) = (start.max(cs), end.min(ce));
            if s < e {
                chunk[(s - cs) as usize..(e - cs) as usize]
                    .copy_from_slice(&bytes[(s - start) as usize..(e - start) as usize]);
            }
        }
        w(chunk)?;
        pos += n as u64;
    }
    ensure!(
        pos == size,
        "the source of {} has {pos} bytes, not the {size} it had when the image was laid out",
        f.path
    );
    Ok(())
}

// ---------------------------------------------------------------- write

/// The El Torito boot catalog (one block).
fn boot_catalog(bios: Option<u32>, efi: Option<(u32, u16)>) -> Vec<u8> {
    let mut c = vec![0u8; BLOCK as usize];
    let entry = |c: &mut [u8], at: usize, segment: u16, count: u16, lba: u32| {
        c[at] = 0x88;
        c[at + 1] = 0; // no emulation
        put(c, at + 2, &segment.to_le_bytes());
        put(c, at + 6, &count.to_le_bytes());
        put(c, at + 8, &lba.to_le_bytes());
    };
    c[0] = 1;
    c[1] = if bios.is_some() { 0 } else { 0xEF };
    c[30] = 0x55;
    c[31] = 0xAA;
    let sum = c[..32].chunks_exact(2).fold(0u16, |s, w| {
        s.wrapping_add(u16::from_le_bytes([w[0], w[1]]))
    });
    put(&mut c, 28, &0u16.wrapping_sub(sum).to_le_bytes());
    match (bios, efi) {
        (Some(b), efi) => {
            entry(&mut c, 32, 0, 4, b);
            if let Some((lba, count)) = efi {
                c[64] = 0x91;
                c[65] = 0xEF;
                put(&mut c, 66, &1u16.to_le_bytes());
                entry(&mut c, 96, 0, count, lba);
            }
        }
        (None, Some((lba, count))) => entry(&mut c, 32, 0, count, lba),
        (None, None) => {}
    }
    c
}

fn pvd(
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

fn boot_record(catalog: u32) -> Vec<u8> {
    let mut d = vec![0u8; BLOCK as usize];
    put(&mut d, 1, b"CD001");
    d[6] = 1;
    put(&mut d, 7, b"EL TORITO SPECIFICATION");
    put(&mut d, 71, &catalog.to_le_bytes());
    d
}

fn terminator() -> Vec<u8> {
    let mut d = vec![0u8; BLOCK as usize];
    d[0] = 255;
    put(&mut d, 1, b"CD001");
    d[6] = 1;
    d
}

/// The volume identity hashed into the GUIDs and the disk signature.
fn identity(spec: &IsoSpec, sizes: &[u64]) -> Vec<u8> {
    let mut h = Sha256::new();
    let mut field = |b: &[u8]| {
        h.update((b.len() as u64).to_le_bytes());
        h.update(b);
    };
    field(b"imager.iso.v1");
    field(spec.volume_id.as_bytes());
    field(spec.volume_set_id.as_bytes());
    field(spec.publisher.as_bytes());
    field(&spec.epoch.to_le_bytes());
    let mut files: Vec<(&str, u64)> = spec
        .files
        .iter()
        .zip(sizes)
        .map(|(f, s)| (f.path.as_str(), *s))
        .collect();
    files.sort();
    for (p, s) in files {
        field(p.as_bytes());
        field(&s.to_le_bytes());
    }
    field(
        spec.bios
            .as_ref()
            .map(|b| b.image.as_bytes())
            .unwrap_or(b"-"),
    );
    field(
        spec.bios
            .as_ref()
            .map(|b| &b.hybrid_mbr[..])
            .unwrap_or(b"-"),
    );
    field(spec.efi_image.as_deref().unwrap_or("-").as_bytes());
    h.finalize().to_vec()
}

fn file_index(spec: &IsoSpec, path: &str, what: &str) -> Result<usize> {
    spec.files
        .iter()
        .position(|f| f.path == path)
        .ok_or_else(|| anyhow!("the {what} {path:?} is not among the image's files"))
}

/// Where everything goes; computed before the output exists.
struct Plan {
    layout: Layout,
    date: Date,
    sizes: Vec<u64>,
    pt_size: u32,
    l_lba: u32,
    m_lba: u32,
    ce_lba: u32,
    ce_blocks: u32,
    catalog_lba: Option<u32>,
    blocks: u32,
    bios: Option<(usize, u32)>,
    efi: Option<(usize, u32)>,
    /// Bytes of the ISO 9660 data (before the GPT tail).
    data_end: u64,
    identity: Vec<u8>,
}

fn plan(spec: &IsoSpec) -> Result<Plan> {
    ensure!(
        !spec.volume_id.is_empty(),
        "the volume identifier is empty: give 1 to 32 d-characters (A-Z, 0-9, _)"
    );
    check_identifier("volume identifier", &spec.volume_id, 32, true)?;
    check_identifier("volume set identifier", &spec.volume_set_id, 128, false)?;
    check_identifier("publisher identifier", &spec.publisher, 128, false)?;
    let date = Date::of(spec.epoch);
    ensure!(
        date.year <= 2155,
        "the epoch {} is in the year {}: ISO 9660 directory dates end in 2155",
        spec.epoch,
        date.year
    );
    let mut sizes = Vec::with_capacity(spec.files.len());
    for f in &spec.files {
        components(&f.path)?;
        let s = source_size(f)?;
        ensure!(
            s <= u64::from(u32::MAX),
            "{} is {s} bytes: a file of this ISO 9660 image has one extent of at most {} \
             bytes (4 GiB - 1)",
            f.path,
            u32::MAX
        );
        sizes.push(s);
    }
    let bios = match &spec.bios {
        Some(b) => {
            let i = file_index(spec, &b.image, "BIOS boot image")?;
            ensure!(
                sizes[i] >= (GRUB2_BOOT_INFO_OFFSET + 8) as u64,
                "the BIOS boot image {} is {} bytes: GRUB's eltorito.img (cdboot.img + core.img, \
                 grub-mkimage -O i386-pc-eltorito) is at least {} bytes",
                b.image,
                sizes[i],
                GRUB2_BOOT_INFO_OFFSET + 8
            );
            ensure!(
                b.hybrid_mbr.len() == SECTOR as usize && b.hybrid_mbr[510..] == [0x55, 0xAA],
                "the hybrid MBR is {} bytes: GRUB's boot_hybrid.img is one 512-byte sector \
                 ending in 55 AA",
                b.hybrid_mbr.len()
            );
            Some(i)
        }
        None => None,
    };
    let efi = match &spec.efi_image {
        Some(p) => {
            let i = file_index(spec, p, "EFI boot image")?;
            ensure!(
                sizes[i] > 0 && sizes[i].is_multiple_of(SECTOR),
                "the EFI boot image {p} is {} bytes: a FAT image is a non-zero multiple of \
                 {SECTOR} bytes",
                sizes[i]
            );
            Some(i)
        }
        None => None,
    };
    let mut layout = build_tree(spec, &sizes)?;
    layout_susp(&mut layout, &date);

    let boot = bios.is_some() || efi.is_some();
    let mut next: u64 = u64::from(PVD_LBA) + 1 + u64::from(boot) + 1;
    let pt = path_table(&layout, false);
    let pt_size = pt.len() as u32;
    let l_lba = next;
    next += blocks_of(pt.len() as u64);
    let m_lba = next;
    next += blocks_of(pt.len() as u64);
    let ce_lba = next;
    let ce_blocks = place_continuations(&mut layout, ce_lba as u32);
    next += u64::from(ce_blocks);
    // Directory sizes do not depend on LBAs: lay them out with zeros first.
    for k in 0..layout.dirs.len() {
        let d = layout.dirs[k];
        let bytes = pack_records(&dir_records(&layout, d, &date)).len() as u64;
        if let Kind::Dir { lba, size, .. } = &mut layout.nodes[d].kind {
            *lba = next as u32;
            *size = bytes as u32;
        }
        next += blocks_of(bytes);
    }
    let catalog_lba = if boot {
        next += 1;
        Some((next - 1) as u32)
    } else {
        None
    };
    let mut bios_lba = None;
    let mut efi_lba = None;
    for k in 0..layout.files.len() {
        let n = layout.files[k];
        if let Kind::File { file, size, lba } = &mut layout.nodes[n].kind {
            if *size > 0 {
                *lba = u32::try_from(next).map_err(|_| {
                    anyhow!("the image is larger than ISO 9660's 2^32 blocks of 2048 bytes")
                })?;
                next += blocks_of(*size);
            }
            if Some(*file) == bios {
                bios_lba = Some(*lba);
            }
            if Some(*file) == efi {
                efi_lba = Some(*lba);
            }
        }
    }
    let data_end = next * BLOCK;
    if efi.is_some() {
        // The backup GPT: 32 sectors of entries and the header.
        next += blocks_of(33 * SECTOR);
    }
    let blocks = u32::try_from(next)
        .map_err(|_| anyhow!("the image is larger than ISO 9660's 2^32 blocks of 2048 bytes"))?;
    Ok(Plan {
        identity: identity(spec, &sizes),
        layout,
        date,
        sizes,
        pt_size,
        l_lba: l_lba as u32,
        m_lba: m_lba as u32,
        ce_lba: ce_lba as u32,
        ce_blocks,
        catalog_lba,
        blocks,
        bios: bios.zip(bios_lba),
        efi: efi.zip(efi_lba),
        data_end,
    })
}

/// Writes the image of `spec` to a new file `out` (module documentation).
/// Nothing is created when the spec is refused; `out` is removed when a
/// later step fails.
pub fn write(spec: &IsoSpec, out: &Path) -> Result<IsoReport> {
    let plan = plan(spec)?;
    write_plan(spec, &plan, out)
}

/// Creates `out` and writes the planned image, removing `out` on failure.
fn write_plan(spec: &IsoSpec, plan: &Plan, out: &Path) -> Result<IsoReport> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(out)
        .with_context(|| format!("creating {}", out.display()))?;
    match write_planned(spec, plan, file) {
        Ok(r) => Ok(r),
        Err(e) => {
            let _ = std::fs::remove_file(out);
            Err(e.context(format!("writing the ISO image {}", out.display())))
        }
    }
}

/// The BIOS image's boot-info table and GRUB patch, given its checksum.
fn bios_patches(lba: u32, size: u64, checksum: u32) -> Vec<(u64, Vec<u8>)> {
    let mut table = vec![0u8; 56];
    put(&mut table, 0, &PVD_LBA.to_le_bytes());
    put(&mut table, 4, &lba.to_le_bytes());
    put(&mut table, 8, &(size as u32).to_le_bytes());
    put(&mut table, 12, &checksum.to_le_bytes());
    vec![
        (BOOT_INFO_OFFSET as u64, table),
        (
            GRUB2_BOOT_INFO_OFFSET as u64,
            (u64::from(lba) * 4 + 5).to_le_bytes().to_vec(),
        ),
    ]
}

fn write_planned(spec: &IsoSpec, p: &Plan, file: File) -> Result<IsoReport> {
    let l = &p.layout;
    let date = &p.date;
    let mut w = BufWriter::with_capacity(256 * 1024, file);
    let mut pos: u64 = 0;
    // System area: zeros for now (the MBR and GPT come last).
    let root_rec = {
        let (lba, size) = match &l.nodes[0].kind {
            Kind::Dir { lba, size, .. } => (*lba, *size),
            Kind::File { .. } => (0, 0),
        };
        dir_record(&[0], lba, size, true, date, &[])
    };
    emit(
        &mut w,
        &mut pos,
        u64::from(PVD_LBA),
        &pvd(spec, date, p.blocks, p.pt_size, p.l_lba, p.m_lba, &root_rec),
    )?;
    let mut next = u64::from(PVD_LBA) + 1;
    if let Some(c) = p.catalog_lba {
        emit(&mut w, &mut pos, next, &boot_record(c))?;
        next += 1;
    }
    emit(&mut w, &mut pos, next, &terminator())?;
    emit(&mut w, &mut pos, u64::from(p.l_lba), &path_table(l, false))?;
    emit(&mut w, &mut pos, u64::from(p.m_lba), &path_table(l, true))?;
    // Continuation areas, in the order they were placed.
    let mut ce = vec![0u8; p.ce_blocks as usize * BLOCK as usize];
    for n in &l.nodes {
        for s in [&n.susp, &n.dot_susp] {
            if s.ce_at.is_some() {
                let at = (s.cont_at.0 - p.ce_lba) as usize * BLOCK as usize + s.cont_at.1 as usize;
                put(&mut ce, at, &s.cont);
            }
        }
    }
    if !ce.is_empty() {
        emit(&mut w, &mut pos, u64::from(p.ce_lba), &ce)?;
    }
    for &d in &l.dirs {
        let lba = match &l.nodes[d].kind {
            Kind::Dir { lba, .. } => *lba,
            Kind::File { .. } => continue,
        };
        emit(
            &mut w,
            &mut pos,
            u64::from(lba),
            &pack_records(&dir_records(l, d, date)),
        )?;
    }
    let efi_count = p.efi.map(|(i, _)| {
        let sectors = p.sizes[i] / SECTOR;
        u16::try_from(sectors).unwrap_or(0)
    });
    if let Some(c) = p.catalog_lba {
        let cat = boot_catalog(
            p.bios.map(|(_, lba)| lba),
            p.efi.zip(efi_count).map(|((_, lba), n)| (lba, n)),
        );
        emit(&mut w, &mut pos, u64::from(c), &cat)?;
    }
    for &n in &l.files {
        let (fi, size, lba) = match l.nodes[n].kind {
            Kind::File { file, size, lba } => (file, size, lba),
            Kind::Dir { .. } => continue,
        };
        if size == 0 {
            continue;
        }
        let f = &spec.files[fi];
        let patches = if p.bios.map(|(i, _)| i) == Some(fi) {
            let pre = bios_patches(lba, size, 0);
            let grub = &pre[1..];
            let mut sum = 0u32;
            let mut off = 0u64;
            let mut carry: Vec<u8> = Vec::new();
            copy_patched(f, size, grub, |chunk| {
                for &b in chunk {
                    if off >= 64 {
                        carry.push(b);
                        if carry.len() == 4 {
                            sum = sum.wrapping_add(u32::from_le_bytes([
                                carry[0], carry[1], carry[2], carry[3],
                            ]));
                            carry.clear();
                        }
                    }
                    off += 1;
                }
                Ok(())
            })?;
            if !carry.is_empty() {
                carry.resize(4, 0);
                sum =
                    sum.wrapping_add(u32::from_le_bytes([carry[0], carry[1], carry[2], carry[3]]));
            }
            bios_patches(lba, size, sum)
        } else {
            Vec::new()
        };
        let at = u64::from(lba) * BLOCK;
        ensure!(pos <= at, "internal: layout overlap at LBA {lba}");
        io_zeros(&mut w, at - pos)?;
        copy_patched(f, size, &patches, |chunk| {
            w.write_all(chunk).context("writing the image")
        })?;
        pos = at + size;
    }
    let total = u64::from(p.blocks) * BLOCK;
    ensure!(
        pos <= total && p.data_end <= total,
        "internal: the data passes the volume"
    );
    io_zeros(&mut w, total - pos)?;
    let mut file = w
        .into_inner()
        .map_err(|e| anyhow!("writing the image: {}", e.error()))?;
    file.sync_all().context("syncing the image")?;

    let digest = &p.identity;
    let mbr_signature = {
        let g = contract::guid::derive("iso-mbr-signature", &[digest]);
        let b = g.as_bytes();
        u32::from_le_bytes([b[0], b[1], b[2], b[3]]).max(1)
    };
    let mut disk_guid = None;
    let mut efi_partition = None;
    if let Some((i, lba)) = p.efi {
        let guid = contract::guid::derive("iso-disk", &[digest]);
        let first = u64::from(lba) * (BLOCK / SECTOR);
        let last = first + p.sizes[i] / SECTOR - 1;
        gpt::write_new(
            &mut file,
            total,
            SECTOR,
            guid,
            &[NewPartition {
                label: "EFI",
                type_guid: contract::guid::EFI_SYSTEM,
                unique_guid: contract::guid::partition_guid(guid, "EFI"),
                first_lba: first,
                last_lba: last,
            }],
        )
        .context("writing the GPT of the hybrid image")?;
        disk_guid = Some(guid);
        efi_partition = Some((first, last));
    }
    // LBA 0 last: GRUB's hybrid code over the table write_new wrote.
    let mut mbr = [0u8; SECTOR as usize];
    file.seek(SeekFrom::Start(0))?;
    file.read_exact(&mut mbr).context("reading back the MBR")?;
    if let (Some(b), Some((_, lba))) = (&spec.bios, p.bios) {
        mbr[..MBR_CODE].copy_from_slice(&b.hybrid_mbr[..MBR_CODE]);
        put(
            &mut mbr,
            HYBRID_KERNEL_SECTOR,
            &(u64::from(lba) * 4 + 4).to_le_bytes(),
        );
        mbr[510] = 0x55;
        mbr[511] = 0xAA;
    }
    if p.bios.is_some() || p.efi.is_some() {
        put(&mut mbr, MBR_CODE, &mbr_signature.to_le_bytes());
        file.seek(SeekFrom::Start(0))?;
        file.write_all(&mbr).context("writing the MBR")?;
        file.sync_all().context("syncing the image")?;
    }
    Ok(IsoReport {
        size: total,
        volume_blocks: p.blocks,
        catalog_lba: p.catalog_lba,
        bios_image_lba: p.bios.map(|(_, l)| l),
        efi_image_lba: p.efi.map(|(_, l)| l),
        efi_partition,
        disk_guid,
        mbr_signature: (p.bios.is_some() || p.efi.is_some()).then_some(mbr_signature),
    })
}

/// Writes `bytes` at block `lba`, zeros from `pos` up to it.
fn emit(w: &mut impl Write, pos: &mut u64, lba: u64, bytes: &[u8]) -> Result<()> {
    let at = lba * BLOCK;
    ensure!(*pos <= at, "internal: layout overlap at LBA {lba}");
    io_zeros(w, at - *pos)?;
    w.write_all(bytes).context("writing the image")?;
    *pos = at + bytes.len() as u64;
    Ok(())
}

fn io_zeros(w: &mut impl Write, mut n: u64) -> Result<()> {
    let z = [0u8; 8192];
    while n > 0 {
        let k = n.min(z.len() as u64) as usize;
        w.write_all(&z[..k]).context("writing the image")?;
        n -= k as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
