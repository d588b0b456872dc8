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
//!
//! # Modules
//!
//! `plan` validates the spec and allocates every block;
//! `writer` writes them in order. The structures come from
//! `tree` (names, identifiers, orders), `rockridge` (SUSP entries and
//! continuation areas), `records` (directory records, path tables, volume
//! descriptors), `eltorito` (boot record, catalog, boot image patches) and
//! `system_area` (GPT and hybrid MBR); `encoding` and `source` are shared.

mod eltorito;
mod encoding;
mod plan;
mod records;
mod rockridge;
mod source;
mod system_area;
mod tree;
mod writer;

use anyhow::Result;
use contract::Guid;
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

/// Writes the image of `spec` to a new file `out` (module documentation).
/// Nothing is created when the spec is refused; `out` is removed when a
/// later step fails.
pub fn write(spec: &IsoSpec, out: &Path) -> Result<IsoReport> {
    let plan = plan::plan(spec)?;
    writer::write_plan(spec, &plan, out)
}

#[cfg(test)]
mod tests;
