// Test helpers panic on unexpected failures: that is how a test fails.
#![allow(clippy::unwrap_used)]

use super::*;
use std::process::Command;

const OS_RELEASE: &[u8] = b"NAME=\"Imager\"\nID=imager\nVERSION_ID=0.1.0\nPRETTY_NAME=\"Imager\"\n";
const CMDLINE: &str = "console=ttyS0,115200 lockdown=confidentiality";

/// A stand-in bzImage the stub's checks accept: boot flag, `HdrS`,
/// protocol 2.15, relocatable, 64-bit handover, an odd length.
fn kernel_bytes() -> Vec<u8> {
    let mut k: Vec<u8> = (0..5001u32).map(|i| (i * 7 + 3) as u8).collect();
    k[0x1fe..0x200].copy_from_slice(&[0x55, 0xaa]);
    k[0x202..0x206].copy_from_slice(b"HdrS");
    k[0x206..0x208].copy_from_slice(&0x20fu16.to_le_bytes());
    k[0x234] = 1;
    k[0x236..0x238].copy_from_slice(&0b1011u16.to_le_bytes());
    k[0x238..0x23c].copy_from_slice(&2047u32.to_le_bytes());
    k[0x264..0x268].copy_from_slice(&0x190u32.to_le_bytes());
    k
}

/// A stand-in initramfs: a newc magic and odd-length contents.
fn initramfs_bytes() -> Vec<u8> {
    let mut i = b"070701".to_vec();
    i.extend((0..3333u32).map(|n| (n * 13) as u8));
    i
}

/// A minimal PE32+ EFI application for x86-64 with `n` sections, headers
/// of 0x200 bytes with room for 6 section headers (5 more with one
/// section, 3 with three), SectionAlignment 0x1000, FileAlignment 0x200.
fn tiny_stub(n: usize) -> Vec<u8> {
    let mut b = vec![0u8; 0x200 * (n + 1)];
    b[..2].copy_from_slice(b"MZ");
    b[0x3c..0x40].copy_from_slice(&0x40u32.to_le_bytes());
    b[0x40..0x44].copy_from_slice(b"PE\0\0");
    let coff = 0x44;
    b[coff..coff + 2].copy_from_slice(&0x8664u16.to_le_bytes());
    b[coff + 2..coff + 4].copy_from_slice(&(n as u16).to_le_bytes());
    b[coff + 16..coff + 18].copy_from_slice(&160u16.to_le_bytes());
    b[coff + 18..coff + 20].copy_from_slice(&0x206u16.to_le_bytes());
    let opt = coff + 20;
    let put = |b: &mut Vec<u8>, o: usize, v: u32| b[o..o + 4].copy_from_slice(&v.to_le_bytes());
    b[opt..opt + 2].copy_from_slice(&0x20bu16.to_le_bytes());
    put(&mut b, opt + 16, 0x1000);
    put(&mut b, opt + 32, 0x1000);
    put(&mut b, opt + 36, 0x200);
    put(&mut b, opt + 56, 0x1000 * (n as u32 + 1));
    put(&mut b, opt + 60, 0x200);
    b[opt + 68..opt + 70].copy_from_slice(&10u16.to_le_bytes());
    put(&mut b, opt + 108, 6);
    let table = opt + 160;
    for i in 0..n {
        let h = table + i * 40;
        b[h..h + 5].copy_from_slice(b".text");
        put(&mut b, h + 8, 0x10);
        put(&mut b, h + 12, 0x1000 * (i as u32 + 1));
        put(&mut b, h + 16, 0x200);
        put(&mut b, h + 20, 0x200 * (i as u32 + 1));
        put(&mut b, h + 36, 0x6000_0020);
    }
    b
}

/// A stand-in arm64 `Image` the stub's checks accept: `MZ`, the arm64
/// boot header's magic, a PE header for AArch64 (its EFI stub), an odd
/// length.
fn arm64_kernel_bytes() -> Vec<u8> {
    let mut k: Vec<u8> = (0..7001u32).map(|i| (i * 11 + 5) as u8).collect();
    k[..2].copy_from_slice(b"MZ");
    k[0x38..0x3c].copy_from_slice(b"ARM\x64");
    k[0x3c..0x40].copy_from_slice(&0x40u32.to_le_bytes());
    k[0x40..0x44].copy_from_slice(b"PE\0\0");
    k[0x44..0x46].copy_from_slice(&0xaa64u16.to_le_bytes());
    // The EFI stub's version (MajorImageVersion): 1.0.
    k[0x84..0x86].copy_from_slice(&1u16.to_le_bytes());
    k
}

/// Debian's arm64 stub, from its arm64 package (docs/arm64.md).
fn arm64_stub() -> Vec<u8> {
    let p = crate::profile::BootSection::default_stub(contract::Arch::Arm64);
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}: run scripts/setup.sh", p.display()))
}

struct Inputs {
    arch: contract::Arch,
    dir: tempfile::TempDir,
    stub: PathBuf,
    kernel: PathBuf,
    initramfs: PathBuf,
}

impl Inputs {
    fn new(stub: &[u8]) -> Inputs {
        let dir = tempfile::tempdir().unwrap();
        let (s, k, i) = (
            dir.path().join("stub.efi"),
            dir.path().join("vmlinuz"),
            dir.path().join("initramfs"),
        );
        std::fs::write(&s, stub).unwrap();
        std::fs::write(&k, kernel_bytes()).unwrap();
        std::fs::write(&i, initramfs_bytes()).unwrap();
        Inputs {
            arch: contract::Arch::Amd64,
            dir,
            stub: s,
            kernel: k,
            initramfs: i,
        }
    }

    fn debian() -> Inputs {
        let stub = std::fs::read(DEFAULT_STUB)
            .unwrap_or_else(|e| panic!("{DEFAULT_STUB}: {e}: install systemd-boot-efi"));
        Inputs::new(&stub)
    }

    fn arm64() -> Inputs {
        let mut i = Inputs::new(&arm64_stub());
        std::fs::write(&i.kernel, arm64_kernel_bytes()).unwrap();
        i.arch = contract::Arch::Arm64;
        i
    }

    fn input<'a>(&'a self, cmdline: &'a str) -> UkiInput<'a> {
        UkiInput {
            arch: self.arch,
            stub: &self.stub,
            kernel: &self.kernel,
            initramfs: &self.initramfs,
            os_release: OS_RELEASE,
            cmdline,
        }
    }

    fn write(&self, name: &str) -> Result<UkiReport> {
        write_uki(&self.input(CMDLINE), &self.dir.path().join(name))
    }

    fn refusal(&self, input: &UkiInput) -> String {
        let dest = self.dir.path().join("refused.efi");
        let e = write_uki(input, &dest).unwrap_err();
        assert!(!dest.exists(), "a refused UKI was written");
        format!("{e:#}")
    }
}

fn hex(s: &str) -> u64 {
    u64::from_str_radix(s, 16).unwrap()
}

#[test]
fn objdump_lists_the_sections_at_their_addresses_and_they_read_back() {
    let inp = Inputs::debian();
    let r = inp.write("uki.efi").unwrap();
    let uki = std::fs::read(&r.path).unwrap();
    assert_eq!(uki.len() as u64, r.size);

    let out = crate::disk::testutil::run(
        Command::new(crate::disk::testutil::tool("objdump"))
            .arg("-h")
            .arg(&r.path),
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("file format pei-x86-64"), "{text}");
    // "  8 .osrel  0000004a  000000000001a000  000000000001a000  00011400  2**2"
    let listed: Vec<(String, u64, u64, u64)> = text
        .lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            (w.len() == 7 && w[0].parse::<u32>().is_ok())
                .then(|| (w[1].to_string(), hex(w[2]), hex(w[3]), hex(w[5])))
        })
        .collect();
    let names: Vec<&str> = listed.iter().map(|l| l.0.as_str()).collect();
    assert_eq!(&names[names.len() - 4..], SECTIONS, "{text}");
    let stub_last = &listed[listed.len() - 5];

    let contents = [
        OS_RELEASE.to_vec(),
        CMDLINE.as_bytes().to_vec(),
        kernel_bytes(),
        initramfs_bytes(),
    ];
    let base = 0; // ImageBase of the stub: objdump's VMA is the RVA.
    let mut prev_end = stub_last.2 + stub_last.1;
    for ((l, s), want) in listed[listed.len() - 4..]
        .iter()
        .zip(&r.sections)
        .zip(&contents)
    {
        assert_eq!(l.0, s.name);
        assert_eq!(l.1, want.len() as u64, "{} size", s.name);
        assert_eq!(l.2, base + u64::from(s.virtual_address), "{} VMA", s.name);
        assert_eq!(
            l.3,
            u64::from(s.pointer_to_raw_data),
            "{} file offset",
            s.name
        );
        assert_eq!(l.2 % 4096, 0, "{} starts on a page", s.name);
        assert!(l.2 >= prev_end, "{} overlaps what comes before", s.name);
        assert_eq!(l.3 % 512, 0);
        prev_end = l.2 + l.1;
        let at = s.pointer_to_raw_data as usize;
        assert_eq!(
            &uki[at..at + want.len()],
            &want[..],
            "{} reads back",
            s.name
        );
        let raw_end = at + s.size_of_raw_data as usize;
        assert!(uki[at + want.len()..raw_end].iter().all(|&b| b == 0));
    }
    let last = r.sections.last().unwrap();
    assert_eq!(
        uki.len() as u64,
        u64::from(last.pointer_to_raw_data) + u64::from(last.size_of_raw_data),
        "the file ends with the last section (the symbol table is dropped)"
    );

    // The headers as the stub's loader reads them.
    let pe = u32::from_le_bytes(uki[0x3c..0x40].try_into().unwrap()) as usize;
    let u32_at = |o: usize| u32::from_le_bytes(uki[o..o + 4].try_into().unwrap());
    let u16_at = |o: usize| u16::from_le_bytes(uki[o..o + 2].try_into().unwrap());
    assert_eq!(u16_at(pe + 6), 12, "NumberOfSections");
    assert_eq!(u32_at(pe + 12), 0, "PointerToSymbolTable");
    assert_eq!(u32_at(pe + 16), 0, "NumberOfSymbols");
    let opt = pe + 24;
    let size_of_image = u32_at(opt + 56);
    assert_eq!(size_of_image, r.size_of_image);
    assert!(
        u64::from(size_of_image) >= prev_end,
        "SizeOfImage covers the last section"
    );
    assert_eq!(size_of_image % u32_at(opt + 32), 0);
    let stub = std::fs::read(DEFAULT_STUB).unwrap();
    let stub_init = u32::from_le_bytes(stub[opt + 8..opt + 12].try_into().unwrap());
    let added: u32 = r.sections.iter().map(|s| s.size_of_raw_data).sum();
    assert_eq!(u32_at(opt + 8), stub_init + added, "SizeOfInitializedData");
    assert_eq!(u32_at(pe + 8), 0, "TimeDateStamp as in Debian's stub");
    assert_eq!(
        r.tail_dropped,
        std::fs::metadata(DEFAULT_STUB).unwrap().len()
            - parse_stub(&std::fs::read(DEFAULT_STUB).unwrap())
                .unwrap()
                .raw_data_end,
        "Debian's stub's symbol table is left out"
    );
    assert_eq!(u32_at(opt + 64), r.checksum);
    assert_eq!(pe_checksum(&uki, opt + 64), r.checksum);

    // objdump -p reads the same checksum and size.
    let p = Command::new(crate::disk::testutil::tool("objdump"))
        .arg("-p")
        .arg(&r.path)
        .output()
        .unwrap();
    let p = String::from_utf8(p.stdout).unwrap();
    let field = |name: &str| {
        p.lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| hex(v.trim()))
            .unwrap_or_else(|| panic!("{name} in {p}"))
    };
    assert_eq!(field("CheckSum"), u64::from(r.checksum));
    assert_eq!(field("SizeOfImage"), u64::from(size_of_image));

    // sbverify (sbsigntool) parses it without a warning: sections inside
    // the file, checksum areas within the image.
    let v = Command::new(crate::disk::testutil::tool("sbverify"))
        .arg("--list")
        .arg(&r.path)
        .output()
        .expect("sbverify (sbsigntool) runs");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&v.stdout),
        String::from_utf8_lossy(&v.stderr)
    );
    assert!(v.status.success(), "{said}");
    assert!(!said.contains("warning"), "{said}");
    assert!(said.contains("No signature table present"), "{said}");

    // The UKI parses as a PE image again (as a stub it is refused: it is a UKI).
    let again = parse_stub(&uki).unwrap_err();
    assert!(format!("{again}").contains("it is a UKI"), "{again}");
}

#[test]
fn the_checksum_is_the_one_the_linker_gave_the_stub() {
    let stub = std::fs::read(DEFAULT_STUB).unwrap();
    let l = parse_stub(&stub).unwrap();
    let at = l.optional_header + 64;
    let stored = u32::from_le_bytes(stub[at..at + 4].try_into().unwrap());
    assert_ne!(stored, 0);
    assert_eq!(pe_checksum(&stub, at), stored);
}

#[test]
fn two_writes_are_byte_identical() {
    let inp = Inputs::debian();
    let a = inp.write("a.efi").unwrap();
    let b = inp.write("b.efi").unwrap();
    assert_eq!(
        std::fs::read(a.path).unwrap(),
        std::fs::read(b.path).unwrap()
    );
    assert_eq!(a.sections, b.sections);
}

#[test]
fn the_debian_stub_has_room_for_the_headers_and_a_symbol_table() {
    let stub = std::fs::read(DEFAULT_STUB).unwrap();
    let l = parse_stub(&stub).unwrap();
    assert!(l.header_room() >= SECTIONS.len(), "{l:?}");
    assert_eq!(l.section_alignment, 512, "{l:?}");
    let (at, len) = l.symbol_table.expect("a COFF symbol table");
    assert_eq!(at, l.raw_data_end);
    assert_eq!(at + len, stub.len() as u64);
    assert_eq!(l.tail, len, "the tail is the symbol table");
    assert_eq!(l.arch, contract::Arch::Amd64);
}

#[test]
fn an_empty_command_line_is_refused() {
    let inp = Inputs::debian();
    for c in ["", "  \n"] {
        let e = inp.refusal(&inp.input(c));
        assert!(e.contains("command line is empty"), "{e}");
        assert!(e.contains("typed at boot"), "{e}");
    }
    let e = inp.refusal(&inp.input("a\0b"));
    assert!(e.contains("NUL"), "{e}");
    let long = "x".repeat(2048);
    let e = inp.refusal(&inp.input(&long));
    assert!(e.contains("more than the kernel takes (2047)"), "{e}");
}

#[test]
fn a_stub_that_is_not_a_pe_image_is_refused() {
    let inp = Inputs::debian();
    std::fs::write(&inp.stub, b"#!/bin/sh\necho not a stub\n").unwrap();
    let e = inp.refusal(&inp.input(CMDLINE));
    assert!(e.contains("not a usable UKI stub"), "{e}");
    assert!(e.contains("not a PE/COFF image"), "{e}");
    // A PE image cut inside its optional header.
    std::fs::write(&inp.stub, &tiny_stub(1)[..0x100]).unwrap();
    let e = inp.refusal(&inp.input(CMDLINE));
    assert!(e.contains("truncated"), "{e}");
}

#[test]
fn truncated_headers_are_refused_at_every_length() {
    let stub = std::fs::read(DEFAULT_STUB).unwrap();
    let l = parse_stub(&stub).unwrap();
    for n in 0..l.raw_data_end as usize {
        assert!(parse_stub(&stub[..n]).is_err(), "{n} bytes parsed");
    }
    let inp = Inputs::new(&stub[..0x200]);
    let e = inp.refusal(&inp.input(CMDLINE));
    assert!(
        e.contains("SizeOfHeaders") || e.contains("truncated"),
        "{e}"
    );
}

#[test]
fn a_stub_without_room_for_the_headers_is_refused() {
    assert_eq!(parse_stub(&tiny_stub(1)).unwrap().header_room(), 5);
    let inp = Inputs::new(&tiny_stub(1));
    let r = inp.write("tiny.efi").unwrap();
    assert_eq!(r.sections[0].virtual_address, 0x2000);

    assert_eq!(parse_stub(&tiny_stub(3)).unwrap().header_room(), 3);
    let inp = Inputs::new(&tiny_stub(3));
    let e = inp.refusal(&inp.input(CMDLINE));
    assert!(e.contains("no room for the UKI's section headers"), "{e}");
    assert!(e.contains("room for 3 more"), "{e}");

    // Bytes in the room that are not zero are not room.
    let mut s = tiny_stub(1);
    s[0x1f0] = 1;
    let e = format!("{:#}", parse_stub(&s).unwrap_err());
    assert!(e.contains("not empty"), "{e}");
}

#[test]
fn stubs_that_lie_are_refused_without_panic() {
    let stub = std::fs::read(DEFAULT_STUB).unwrap();
    let (pe, opt) = (0x80, 0x98);
    let cases: Vec<(usize, Vec<u8>, &str)> = vec![
        (0, b"ZM".to_vec(), "no MZ header"),
        (
            0x3c,
            0xffff_fff0u32.to_le_bytes().to_vec(),
            "no PE signature",
        ),
        (
            pe + 4,
            0x14cu16.to_le_bytes().to_vec(),
            "not one a stub is built for: amd64 (0x8664), arm64 (0xaa64)",
        ),
        (
            opt + 16,
            0x200u32.to_le_bytes().to_vec(),
            "entry point 0x200 is not in a section",
        ),
        (pe + 6, 0u16.to_le_bytes().to_vec(), "0 sections"),
        (pe + 6, 0xffffu16.to_le_bytes().to_vec(), "65535 sections"),
        (
            pe + 20,
            0xfff0u16.to_le_bytes().to_vec(),
            "does not cover the section table",
        ),
        (opt, 0x10bu16.to_le_bytes().to_vec(), "not PE32+"),
        (
            opt + 68,
            3u16.to_le_bytes().to_vec(),
            "not an EFI application",
        ),
        (
            opt + 32,
            0x1234u32.to_le_bytes().to_vec(),
            "SectionAlignment",
        ),
        (opt + 36, 0x100u32.to_le_bytes().to_vec(), "FileAlignment"),
        (opt + 56, 0x1000u32.to_le_bytes().to_vec(), "SizeOfImage"),
        (
            opt + 60,
            0x10_0000u32.to_le_bytes().to_vec(),
            "SizeOfHeaders",
        ),
        (opt + 144, 1u32.to_le_bytes().to_vec(), "certificate table"),
        // .text's raw data size past the end of the file
        (
            0x188 + 16,
            0xffff_fe00u32.to_le_bytes().to_vec(),
            "outside the file",
        ),
        // .reloc moved onto .text
        (
            0x188 + 40 + 12,
            0x4000u32.to_le_bytes().to_vec(),
            "overlaps",
        ),
        (
            pe + 12,
            0xffff_0000u32.to_le_bytes().to_vec(),
            "symbol table",
        ),
    ];
    for (at, bytes, want) in cases {
        let mut s = stub.clone();
        s[at..at + bytes.len()].copy_from_slice(&bytes);
        let e = format!("{:#}", parse_stub(&s).unwrap_err());
        assert!(e.contains(want), "at {at:#x}: {e} (wanted {want:?})");
    }
    // A symbol table whose strings pass the end of the file.
    let l = parse_stub(&stub).unwrap();
    let (at, _) = l.symbol_table.unwrap();
    let mut s = stub.clone();
    s.truncate(s.len() - 1);
    let e = format!("{:#}", parse_stub(&s).unwrap_err());
    assert!(
        e.contains("pass the end of the file"),
        "{e} (symbol table at {at:#x})"
    );
    // AArch64 NOPs are not room in an x86-64 stub.
    let mut s = stub.clone();
    let room = l.section_table + l.number_of_sections * 40;
    s[room..room + 4].copy_from_slice(&[0x1f, 0x20, 0x03, 0xd5]);
    let e = format!("{:#}", parse_stub(&s).unwrap_err());
    assert!(e.contains("not empty"), "{e}");
    // Every byte of the headers flipped in turn: an error or a stub, and
    // headers that fit whenever they are made.
    for at in 0..0x400 {
        let mut s = stub.clone();
        s[at] ^= 0xa5;
        if parse_stub(&s).is_ok() {
            let lens = [1, 1, u64::from(u32::MAX), 7];
            let _ = uki_headers(&s, lens);
        }
    }
}

#[test]
fn sizes_past_the_pe_limit_are_refused() {
    let stub = std::fs::read(DEFAULT_STUB).unwrap();
    let e = format!("{:#}", uki_headers(&stub, [1, 1, 1 << 32, 1]).unwrap_err());
    assert!(e.contains("4 GiB"), "{e}");
    let e = format!(
        "{:#}",
        uki_headers(&stub, [1, 1, 3 << 30, 2 << 30]).unwrap_err()
    );
    assert!(e.contains("4 GiB"), "{e}");
}

#[test]
fn kernels_the_stub_cannot_start_are_refused() {
    let inp = Inputs::debian();
    let mut k = kernel_bytes();
    k[0x236] = 0b0011; // no 64-bit handover
    std::fs::write(&inp.kernel, &k).unwrap();
    let e = inp.refusal(&inp.input(CMDLINE));
    assert!(e.contains("EFI handover"), "{e}");
    let refused = |edit: &dyn Fn(&mut Vec<u8>), want: &str| {
        let mut k = kernel_bytes();
        edit(&mut k);
        std::fs::write(&inp.kernel, &k).unwrap();
        let e = inp.refusal(&inp.input(CMDLINE));
        assert!(e.contains(want), "{e} (wanted {want:?})");
    };
    refused(&|k| k[0x236] = 0b1001, "above 4 GiB");
    refused(&|k| k[0x234] = 0, "not relocatable");
    refused(
        &|k| k[0x206..0x208].copy_from_slice(&0x20au16.to_le_bytes()),
        "2.10 is older",
    );
    k[0x202] = b'X';
    std::fs::write(&inp.kernel, &k).unwrap();
    let e = inp.refusal(&inp.input(CMDLINE));
    assert!(e.contains("not an x86 Linux kernel image"), "{e}");
    std::fs::write(&inp.kernel, kernel_bytes()).unwrap();
    std::fs::write(&inp.initramfs, b"-----BEGIN PRIVATE KEY-----\n").unwrap();
    let e = inp.refusal(&inp.input(CMDLINE));
    assert!(e.contains("is not an initramfs"), "{e}");
}

#[test]
fn the_checksum_over_pieces_equals_the_checksum_over_the_whole() {
    let data: Vec<u8> = (0..1001u32).map(|i| (i * 31 + 7) as u8).collect();
    let whole = pe_checksum(&data, 0x40);
    let mut c = PeChecksum::default();
    let mut z = data.clone();
    z[0x40..0x44].fill(0);
    for piece in z.chunks(3).chain(std::iter::once(&[][..])) {
        c.update(piece);
    }
    assert_eq!(c.finish(), whole);
}

#[test]
fn the_debian_arm64_stub_has_nop_filled_room_and_an_unmapped_tail() {
    let stub = arm64_stub();
    let l = parse_stub(&stub).unwrap();
    assert_eq!(l.arch, contract::Arch::Arm64);
    assert_eq!((l.size_of_headers, l.first_raw_data), (0x1000, 0x1000));
    assert_eq!(l.header_room(), 94, "{l:?}");
    let room = l.section_table + l.number_of_sections * 40;
    assert!(
        stub[room..0x1000]
            .chunks(4)
            .all(|w| w == [0x1f, 0x20, 0x03, 0xd5]),
        "the room is AArch64 NOPs"
    );
    assert_eq!(l.symbol_table, None);
    assert_eq!(l.tail, stub.len() as u64 - l.raw_data_end);
    let tail = &stub[l.raw_data_end as usize..];
    assert!(
        tail.windows(19).any(|w| w == b"sbat,1,SBAT Version"),
        "the tail is the unmapped .sbat text"
    );
    // A word in the room that is neither zero nor a NOP is not room.
    let mut s = stub.clone();
    s[0xff0..0xff4].copy_from_slice(&[0x00, 0x00, 0x80, 0xd2]); // mov x0, #0
    let e = format!("{:#}", parse_stub(&s).unwrap_err());
    assert!(e.contains("not empty"), "{e}");
}

#[test]
fn an_arm64_uki_is_read_back_by_llvm_readobj() {
    let inp = Inputs::arm64();
    let r = inp.write("uki.efi").unwrap();
    let uki = std::fs::read(&r.path).unwrap();
    let stub = arm64_stub();
    let l = parse_stub(&stub).unwrap();
    assert_eq!(r.tail_dropped, l.tail);
    let last = r.sections.last().unwrap();
    assert_eq!(
        uki.len() as u64,
        u64::from(last.pointer_to_raw_data) + u64::from(last.size_of_raw_data),
        "the file ends with the last section (the stub's unmapped tail is left out)"
    );
    // The stub's sections are the stub's bytes; the room after the new
    // section headers keeps its NOPs.
    let table_end = l.section_table + (l.number_of_sections + 4) * 40;
    assert_eq!(
        &uki[0x1000..l.raw_data_end as usize],
        &stub[0x1000..l.raw_data_end as usize]
    );
    assert_eq!(&uki[table_end..0x1000], &stub[table_end..0x1000]);

    let out = crate::disk::testutil::run(
        Command::new(crate::disk::testutil::tool("llvm-readobj"))
            .args(["--file-headers", "--sections"])
            .arg(&r.path),
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("IMAGE_FILE_MACHINE_ARM64 (0xAA64)"), "{text}");
    // osslsigncode computes the PE checksum itself and reads the stored one.
    let o = Command::new(crate::disk::testutil::tool("osslsigncode"))
        .args(["verify", "-in"])
        .arg(&r.path)
        .output()
        .expect("osslsigncode runs");
    let said = String::from_utf8_lossy(&o.stdout).into_owned();
    let sums: Vec<&str> = said
        .lines()
        .filter(|l| l.contains("PE checksum"))
        .filter_map(|l| l.split_whitespace().last())
        .collect();
    // (2.5 prints the stored and the computed one, 2.9 one line when they
    // agree, and a warning when they do not.)
    let want = format!("{:08X}", r.checksum);
    assert!(
        !sums.is_empty() && sums.iter().all(|s| *s == want) && !said.contains("invalid"),
        "{said}"
    );
    assert!(
        text.contains(&format!("SizeOfImage: {}", r.size_of_image)),
        "{text}"
    );
    // Each section as llvm-readobj reads it: name, VirtualSize,
    // VirtualAddress, PointerToRawData.
    let mut listed = Vec::new();
    let mut cur: Option<(String, u64, u64)> = None;
    for line in text.lines().map(str::trim) {
        let num = |v: &str| {
            let v = v.trim();
            v.strip_prefix("0x").map_or_else(|| v.parse().unwrap(), hex)
        };
        if let Some(n) = line.strip_prefix("Name: ") {
            cur = Some((n.split_whitespace().next().unwrap().to_string(), 0, 0));
        } else if let (Some(c), Some(v)) = (cur.as_mut(), line.strip_prefix("VirtualSize: ")) {
            c.1 = num(v);
        } else if let (Some(c), Some(v)) = (cur.as_mut(), line.strip_prefix("VirtualAddress: ")) {
            c.2 = num(v);
        } else if let Some(v) = line.strip_prefix("PointerToRawData: ") {
            let (n, size, va) = cur.take().unwrap();
            listed.push((n, size, va, num(v)));
        }
    }
    let names: Vec<&str> = listed.iter().map(|l| l.0.as_str()).collect();
    assert_eq!(
        names,
        [".text", ".data", ".osrel", ".cmdline", ".linux", ".initrd"]
    );
    let contents = [
        OS_RELEASE.to_vec(),
        CMDLINE.as_bytes().to_vec(),
        arm64_kernel_bytes(),
        initramfs_bytes(),
    ];
    for ((l, s), want) in listed[2..].iter().zip(&r.sections).zip(&contents) {
        assert_eq!(l.1, want.len() as u64, "{} size", s.name);
        assert_eq!(l.2, u64::from(s.virtual_address), "{} address", s.name);
        assert_eq!(l.2 % 4096, 0, "{} starts on a page", s.name);
        let at = l.3 as usize;
        assert_eq!(
            &uki[at..at + want.len()],
            &want[..],
            "{} reads back",
            s.name
        );
    }
    assert_eq!(listed[2].2, 0x11000, ".osrel follows .data's last page");
}

#[test]
fn arm64_stubs_and_kernels_of_the_wrong_kind_are_refused() {
    let inp = Inputs::arm64();
    // The stub of another architecture, either way.
    let mut amd = inp.input(CMDLINE);
    amd.arch = contract::Arch::Amd64;
    let e = inp.refusal(&amd);
    assert!(e.contains("a stub for arm64, not amd64"), "{e}");
    let x64 = Inputs::debian();
    let mut arm = x64.input(CMDLINE);
    arm.arch = contract::Arch::Arm64;
    let e = x64.refusal(&arm);
    assert!(e.contains("a stub for amd64, not arm64"), "{e}");
    assert!(e.contains("linuxaa64.efi.stub"), "{e}");
    // An x86 kernel, and an arm64 kernel without its EFI stub.
    std::fs::write(&inp.kernel, kernel_bytes()).unwrap();
    let e = inp.refusal(&inp.input(CMDLINE));
    assert!(e.contains("not an arm64 Linux kernel image"), "{e}");
    let mut k = arm64_kernel_bytes();
    k[0x44..0x46].copy_from_slice(&0x8664u16.to_le_bytes());
    std::fs::write(&inp.kernel, &k).unwrap();
    let e = inp.refusal(&inp.input(CMDLINE));
    assert!(e.contains("without its EFI stub"), "{e}");
    let mut k = arm64_kernel_bytes();
    k[0x84] = 0;
    std::fs::write(&inp.kernel, &k).unwrap();
    let e = inp.refusal(&inp.input(CMDLINE));
    assert!(e.contains("older than 1.0 (Linux 5.8)"), "{e}");
    // arm64's command line limit.
    std::fs::write(&inp.kernel, arm64_kernel_bytes()).unwrap();
    let long = "x".repeat(2048);
    let e = inp.refusal(&inp.input(&long));
    assert!(e.contains("more than the kernel takes (2047)"), "{e}");
    inp.write("ok.efi").unwrap();
}

/// The fuzz target's seeds (fuzz/seeds/uki_stub/) are stubs the parser
/// takes, so that fuzzing starts inside it: x86-64 ones with one to three
/// sections (one with a COFF symbol table, one without room for the UKI's
/// headers) and an AArch64 one with NOP-filled room and an unmapped tail.
#[test]
fn the_fuzz_seeds_are_stubs_that_parse() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds/uki_stub");
    let names = crate::disk::testutil::sorted_names(&dir);
    assert_eq!(
        names,
        [
            "arm64-nop-room-tail",
            "no-room",
            "one-section",
            "two-sections-symbols"
        ]
    );
    for n in &names {
        let b = std::fs::read(dir.join(n)).unwrap();
        let l = parse_stub(&b).unwrap_or_else(|e| panic!("{n}: {e:#}"));
        let fits = uki_headers(&b, [1, 1, 1, 1]).is_ok();
        assert_eq!(fits, n != "no-room", "{n}: {l:?}");
        if n.starts_with("arm64") {
            assert_eq!(l.arch, contract::Arch::Arm64);
            assert!(l.tail > 0 && l.symbol_table.is_none(), "{l:?}");
        }
        if n.ends_with("symbols") {
            assert!(l.symbol_table.is_some(), "{l:?}");
        }
    }
}

/// The entry point must lie in one of the stub's sections: one in the
/// headers (where the UKI's section headers go) or in the gap between two
/// sections is refused; one in the second section is taken.
#[test]
fn an_entry_point_outside_every_section_is_refused() {
    let opt = 0x44 + 20;
    for (entry, ok) in [
        (0x1008u32, true),
        (0x2004, true),
        (0x1800, false),
        (0x100, false),
    ] {
        let mut s = tiny_stub(2);
        s[opt + 16..opt + 20].copy_from_slice(&entry.to_le_bytes());
        match parse_stub(&s) {
            Ok(_) => assert!(ok, "entry {entry:#x} taken"),
            Err(e) => {
                assert!(!ok, "entry {entry:#x}: {e:#}");
                assert!(format!("{e:#}").contains("not in a section"), "{e:#}");
            }
        }
    }
}
