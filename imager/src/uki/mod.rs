//! Unified Kernel Images: systemd's stub with the kernel, the initramfs,
//! os-release and the command line as PE/COFF sections, written by this
//! module (no objcopy, no ukify). See `docs/uki.md`.
//!
//! # What the stub (systemd 252, Debian 12) reads
//!
//! Debian's `linuxx64.efi.stub` and `linuxaa64.efi.stub` (systemd 252, the
//! arm64 one from Debian's arm64 package, docs/arm64.md) look its sections up by name
//! in the section table of the loaded image (the headers as the firmware
//! mapped them, so a section header must lie within `SizeOfHeaders`) and
//! takes each section's size from its `VirtualSize`. It knows `.linux` (the
//! bzImage, started through the EFI handover protocol), `.initrd`,
//! `.cmdline`, `.osrel` (measured, and read by systemd-boot for its menu),
//! `.splash`, `.dtb`, `.pcrsig` and `.pcrpkey`; 252 has no `.uname` (253
//! added it). We write `.osrel`, `.cmdline`, `.linux` and `.initrd`, in that
//! order; no splash, no device tree, and no PCR signature yet.
//!
//! - **Command line.** 252 replaces the embedded `.cmdline` by one passed
//!   at boot (the load options) whenever Secure Boot is off *or the embedded
//!   one is empty*: an empty or blank command line is refused here, so that
//!   with Secure Boot on nothing typed at boot reaches the kernel. (With
//!   Secure Boot off, 252 still lets a boot-time command line win.)
//! - **Extra files.** The stub packs unsigned files from the ESP into extra
//!   cpio archives appended to the initramfs: `*.cred` next to the UKI
//!   (`<uki>.extra.d/`) under `/.extra/credentials/`, `\loader\credentials\`
//!   under `/.extra/global_credentials/`, `*.raw` system extensions under
//!   `/.extra/sysext/` (and the `.pcrsig`/`.pcrpkey` contents under
//!   `/.extra/`). They are measured, not signed: the runtime must ignore
//!   `/.extra` entirely.
//! - **Kernel.** The stub refuses a bzImage older than boot protocol 2.11,
//!   one that is not relocatable, one without the 64-bit EFI handover
//!   entry (`CONFIG_EFI_HANDOVER_PROTOCOL`, which 6.2 and later can leave
//!   out), and one that cannot run above 4 GiB when firmware loaded the
//!   UKI there: [`write_uki`] refuses the same at build time, and a command
//!   line longer than the kernel's `cmdline_size`. On arm64 the `.linux`
//!   section is the kernel's `Image`, an EFI program itself (its EFI stub,
//!   PE machine 0xAA64): the stub starts it with `LoadImage` from memory,
//!   telling the firmware's security check to pass it (the UKI around it
//!   was verified), and hands it the initramfs through
//!   `LINUX_INITRD_MEDIA_GUID`, which its EFI stub takes from version 1.0
//!   (Linux 5.8; `kernel::check_image` refuses older). An arm64 command
//!   line is at most 2,047 bytes (`COMMAND_LINE_SIZE`). The stub's PE
//!   machine must be the profile's architecture's.
//!
//! # How the sections are placed
//!
//! - New section headers go after the stub's section table, in the room
//!   before `SizeOfHeaders` and before the first section's raw data; that
//!   room must be zero, or on arm64 zero and AArch64 `NOP` words: Debian's
//!   arm64 stub is gnu-efi's hand-written PE header made a file by
//!   `objcopy -O binary`, and the assembler pads its headers to the code at
//!   `SizeOfHeaders` (0x1000) with NOPs, which nothing runs (the entry
//!   point must lie in a section). Debian's x64 stub has room for 7 more,
//!   its arm64 stub for 94; a stub without
//!   room for 4 is refused (the headers are never moved: moving the raw data
//!   would break the stub's file offsets, and the firmware maps only
//!   `SizeOfHeaders`).
//! - Each new section's `VirtualAddress` follows the previous section,
//!   aligned to the larger of the stub's `SectionAlignment` (512 in Debian's
//!   stub) and the 4 KiB page, so that the initramfs and kernel start on a
//!   page of their own; `VirtualSize` is the exact content length (the stub
//!   reads that many bytes). Raw data follows the stub's last section in the
//!   file, each section at a `FileAlignment` boundary, `SizeOfRawData`
//!   rounded up to it and zero-padded. The kernel relocates itself out of
//!   the image when started through the handover entry (since 5.8), so
//!   `.initrd` may follow `.linux` directly.
//! - `SizeOfImage` is the end of the last section rounded up to
//!   `SectionAlignment`; `SizeOfInitializedData` grows by the new raw sizes;
//!   `NumberOfSections` by 4. Section flags: initialized, read-only data.
//! - **After the sections.** The firmware's loader copies the headers and
//!   each section's raw data into memory, nothing else: bytes of the file
//!   after the last section's raw data are never loaded, so the stub's
//!   code cannot read them. They are left out, and the file ends with the
//!   last new section (`PointerToSymbolTable` and `NumberOfSymbols`
//!   become 0): without trailing data, every byte after the headers
//!   belongs to a section, which is what an Authenticode signature
//!   appended later expects. Debian's x64 stub has a COFF symbol table and
//!   its string table there (deprecated for images); Debian's arm64 stub
//!   5,076 bytes of `.sbat` and `.sdmagic` text that its hand-written PE
//!   header maps into no section (so neither firmware nor shim sees them:
//!   a UKI verified with our own keys reads no SBAT). [`UkiReport`] says
//!   how many bytes were left out. A signed stub is refused by its
//!   certificate table.
//! - **Determinism.** `TimeDateStamp` is kept as the stub has it (0 in
//!   Debian's): the stub is an input, so the same inputs give the same bytes.
//! - **Checksum.** The optional header's `CheckSum` is recomputed (the PE
//!   algorithm, as the stub's linker did): firmware does not check it, but a
//!   tool that does finds it right. Authenticode leaves it out of its digest.
//!
//! The parser takes the stub as hostile: every offset and size is checked
//! before use, and a truncated or lying header is an error, never a panic
//! nor an allocation larger than the stub (which is read whole, at most
//! [`MAX_STUB`] bytes). The kernel and the initramfs are streamed.

use crate::io::AtomicFile;
use anyhow::{Context, Result, ensure};
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

mod pe;
#[cfg(test)]
mod tests;

use pe::{OPT_CHECKSUM, PeChecksum, Summing, u16_at, u32_at};
pub use pe::{
    SECTION_FLAGS, SECTIONS, StubLayout, UkiSection, parse_stub, pe_checksum, uki_headers,
};

/// Where Debian's systemd-boot-efi package puts the x86-64 UKI stub.
pub const DEFAULT_STUB: &str = "/usr/lib/systemd/boot/efi/linuxx64.efi.stub";

/// The largest stub read (Debian's is 83 KB).
pub const MAX_STUB: u64 = 16 << 20;

/// What a UKI is made of.
#[derive(Debug, Clone, Copy)]
pub struct UkiInput<'a> {
    /// The architecture the UKI is for: the stub's PE machine and the
    /// kernel must be its.
    pub arch: contract::Arch,
    /// systemd's stub, `linuxx64.efi.stub` ([`DEFAULT_STUB`]) or
    /// `linuxaa64.efi.stub`.
    pub stub: &'a Path,
    /// The kernel: a bzImage, or arm64's `Image` with its EFI stub.
    pub kernel: &'a Path,
    /// The initramfs (newc cpio, raw or compressed).
    pub initramfs: &'a Path,
    /// os-release, as the `.osrel` section.
    pub os_release: &'a [u8],
    /// The kernel command line, as the `.cmdline` section: never empty.
    pub cmdline: &'a str,
}

/// What [`write_uki`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UkiReport {
    pub path: PathBuf,
    /// The file's length.
    pub size: u64,
    /// The added sections, in order.
    pub sections: Vec<UkiSection>,
    pub size_of_image: u32,
    pub checksum: u32,
    /// The bytes of the stub after its sections left out (never loaded:
    /// its COFF symbol table, or on arm64 its unmapped `.sbat` text).
    pub tail_dropped: u64,
}

/// The longest command line arm64's kernel takes (`COMMAND_LINE_SIZE`,
/// arch/arm64/include/uapi/asm/setup.h), with its NUL: it has no boot
/// header field for it.
const ARM64_COMMAND_LINE_SIZE: u32 = 2048;

/// Checks the kernel as the 252 stub will; returns the longest command
/// line it takes. On amd64: a bzImage of boot protocol 2.11 or later,
/// relocatable, with the 64-bit EFI handover entry, loadable above 4 GiB
/// (its `cmdline_size`). On arm64: an `Image` with its EFI stub, which
/// systemd's stub loads as an EFI program (`LoadImage`, the initramfs
/// through `LINUX_INITRD_MEDIA_GUID`).
fn check_kernel(path: &Path, arch: contract::Arch) -> Result<u32> {
    crate::kernel::check_image(path, arch)?;
    if arch == contract::Arch::Arm64 {
        return Ok(ARM64_COMMAND_LINE_SIZE - 1);
    }
    let head = crate::input::read_head(path, "kernel image", 0x270)?;
    let shown = path.display();
    let version = u16_at(&head, 0x206).unwrap_or(0);
    ensure!(
        version >= 0x20b,
        "{shown}: boot protocol {}.{:02} is older than 2.11, which systemd's stub needs",
        version >> 8,
        version & 0xff
    );
    ensure!(
        head.get(0x234).is_some_and(|&r| r != 0),
        "{shown} is not relocatable: systemd's stub cannot start it"
    );
    let xloadflags = u16_at(&head, 0x236).unwrap_or(0);
    ensure!(
        xloadflags & (1 << 3) != 0 && u32_at(&head, 0x264).is_some_and(|o| o != 0),
        "{shown} has no 64-bit EFI handover entry (CONFIG_EFI_HANDOVER_PROTOCOL): systemd \
         252's stub starts the kernel through it"
    );
    ensure!(
        xloadflags & (1 << 1) != 0,
        "{shown} cannot be loaded above 4 GiB (XLF_CAN_BE_LOADED_ABOVE_4G): systemd's stub \
         refuses it when firmware loads the UKI there"
    );
    Ok(u32_at(&head, 0x238).unwrap_or(255))
}

/// Refuses an initramfs that is empty or neither a newc cpio archive nor
/// one compressed with zstd, gzip or xz (a wrong path must not put another
/// file, perhaps a secret, into a published image).
fn check_initramfs(path: &Path) -> Result<()> {
    let head = crate::input::read_head(path, "initramfs", 6)?;
    let known = head.starts_with(b"07070")
        || head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd])
        || head.starts_with(&[0x1f, 0x8b])
        || head.starts_with(&[0xfd, b'7', b'z', b'X', b'Z', 0]);
    ensure!(
        known,
        "{} is not an initramfs (a newc cpio archive, raw or compressed with zstd, gzip or \
         xz)",
        path.display()
    );
    Ok(())
}

fn check_text(what: &str, text: &[u8]) -> Result<()> {
    ensure!(
        !text.iter().all(u8::is_ascii_whitespace),
        "the UKI's {what} is empty"
    );
    ensure!(!text.contains(&0), "the UKI's {what} contains a NUL byte");
    Ok(())
}

fn read_stub(path: &Path) -> Result<Vec<u8>> {
    let shown = path.display();
    let f = File::open(path).with_context(|| {
        format!(
            "opening the UKI stub {shown}: install systemd-boot-efi, or for arm64 run \
             scripts/setup.sh (Debian's arm64 package, docs/arm64.md)"
        )
    })?;
    ensure!(
        f.metadata()
            .with_context(|| format!("reading {shown}"))?
            .is_file(),
        "{shown} is not a regular file: give the path of linuxx64.efi.stub (linuxaa64.efi.stub \
         for arm64)"
    );
    let mut b = Vec::new();
    f.take(MAX_STUB + 1)
        .read_to_end(&mut b)
        .with_context(|| format!("reading the UKI stub {shown}"))?;
    ensure!(
        b.len() as u64 <= MAX_STUB,
        "{shown} is larger than {MAX_STUB} bytes: not systemd's stub"
    );
    Ok(b)
}

/// An input streamed into a section: opened once, its length taken from
/// the open file.
fn open_sized(path: &Path, what: &str) -> Result<(File, u64)> {
    let f = File::open(path).with_context(|| format!("opening the {what} {}", path.display()))?;
    let len = f
        .metadata()
        .with_context(|| format!("reading the {what} {}", path.display()))?
        .len();
    Ok((f, len))
}

/// Writes `headers`, then each source into its section (zero-padded to
/// its raw size), returning the checksum of what was written.
fn write_body(
    file: &mut File,
    headers: &[u8],
    sources: [(Box<dyn Read + '_>, &str); 4],
    sections: &[UkiSection],
) -> Result<PeChecksum> {
    let mut w = Summing {
        inner: io::BufWriter::with_capacity(1 << 20, file),
        sum: PeChecksum::default(),
    };
    w.write_all(headers)?;
    for ((src, what), s) in sources.into_iter().zip(sections) {
        let want = u64::from(s.virtual_size);
        let n =
            io::copy(&mut src.take(want), &mut w).with_context(|| format!("copying the {what}"))?;
        ensure!(
            n == want,
            "the {what} shrank from {want} to {n} bytes while it was read"
        );
        let pad = u64::from(s.size_of_raw_data) - want;
        io::copy(&mut io::repeat(0).take(pad), &mut w)?;
    }
    let Summing { inner, sum } = w;
    inner.into_inner().map_err(|e| e.into_error())?;
    Ok(sum)
}

/// Writes the UKI `dest` (atomically) from `input`: see the module
/// documentation for what is checked and how the sections are placed.
pub fn write_uki(input: &UkiInput, dest: &Path) -> Result<UkiReport> {
    check_text("command line", input.cmdline.as_bytes()).context(
        "systemd's stub takes a command line typed at boot when the embedded one is empty: \
         give the image's command line",
    )?;
    check_text("os-release", input.os_release)?;
    let stub = read_stub(input.stub)?;
    let layout = parse_stub(&stub)
        .with_context(|| format!("{} is not a usable UKI stub", input.stub.display()))?;
    ensure!(
        layout.arch == input.arch,
        "{} is a stub for {}, not {}: give {}'s linux{}.efi.stub (boot.stub)",
        input.stub.display(),
        layout.arch,
        input.arch,
        input.arch,
        input.arch.spec().efi_suffix
    );
    let cmdline_size = check_kernel(input.kernel, input.arch)?;
    ensure!(
        input.cmdline.len() as u64 <= u64::from(cmdline_size),
        "the command line has {} bytes, more than the kernel takes ({cmdline_size})",
        input.cmdline.len()
    );
    check_initramfs(input.initramfs)?;
    let (kernel, kernel_len) = open_sized(input.kernel, "kernel image")?;
    let (initrd, initrd_len) = open_sized(input.initramfs, "initramfs")?;
    let lens = [
        input.os_release.len() as u64,
        input.cmdline.len() as u64,
        kernel_len,
        initrd_len,
    ];
    let (headers, sections, size_of_image) = uki_headers(&stub, lens)
        .with_context(|| format!("{} is not a usable UKI stub", input.stub.display()))?;
    let checksum_at = layout.optional_header + OPT_CHECKSUM;
    drop(stub);

    let mut out = AtomicFile::create(dest)?;
    let shown = dest.display().to_string();
    let sum = write_body(
        out.file(),
        &headers,
        [
            (Box::new(input.os_release), "os-release"),
            (Box::new(input.cmdline.as_bytes()), "command line"),
            (Box::new(&kernel), "kernel image"),
            (Box::new(&initrd), "initramfs"),
        ],
        &sections,
    )
    .with_context(|| format!("writing {shown}"))?;
    // A file that grew while it was read is caught too: its length no
    // longer matches the section written from it.
    for (f, len, what) in [
        (&kernel, kernel_len, "kernel image"),
        (&initrd, initrd_len, "initramfs"),
    ] {
        let now = f.metadata().map(|m| m.len()).unwrap_or(u64::MAX);
        ensure!(
            now == len,
            "the {what} changed size while it was read: try again"
        );
    }
    let size = sum.len;
    let checksum = sum.finish();
    let f = out.file();
    f.seek(SeekFrom::Start(checksum_at as u64))
        .and_then(|_| f.write_all(&checksum.to_le_bytes()))
        .with_context(|| format!("writing the checksum of {shown}"))?;
    let path = out.commit()?;
    Ok(UkiReport {
        path,
        size,
        sections,
        size_of_image,
        checksum,
        tail_dropped: layout.tail,
    })
}
