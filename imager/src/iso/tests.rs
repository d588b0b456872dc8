use super::eltorito::boot_catalog;
use super::encoding::Date;
use super::plan::plan;
use super::tree::{build_tree, iso_ident};
use super::writer::write_plan;
use super::*;

#[test]
fn dates_from_epoch() {
    let d = Date::of(0);
    assert_eq!((d.year, d.month, d.day), (1970, 1, 1));
    let d = Date::of(951_782_400);
    assert_eq!((d.year, d.month, d.day), (2000, 2, 29));
    let d = Date::of(1_700_000_000);
    assert_eq!(
        (d.year, d.month, d.day, d.hour, d.minute, d.second),
        (2023, 11, 14, 22, 13, 20)
    );
    assert_eq!(&d.long()[..16], b"2023111422132000");
    assert_eq!(d.short(), [123, 11, 14, 22, 13, 20, 0]);
}

use std::process::Command;

const HYBRID: &str = "/usr/lib/grub/i386-pc/boot_hybrid.img";
const ELTORITO: &str = "boot/grub/i386-pc/eltorito.img";
const EFI_IMG: &str = "EFI/efiboot.img";
/// A Rock Ridge name of the longest length, in two NM entries.
fn long_name() -> String {
    let mut n = String::from("Long-Name_with.MixedCase");
    while n.len() < MAX_NAME - 4 {
        n.push_str(".x");
    }
    n.truncate(MAX_NAME - 4);
    n.push_str(".txt");
    assert_eq!(n.len(), MAX_NAME);
    n
}

/// Runs a tool (a missing one fails the test: scripts/setup.sh installs it).
fn run(name: &str, args: &[&str]) -> std::process::Output {
    Command::new(crate::disk::testutil::tool(name))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {name}: {e}"))
}

fn ok(name: &str, args: &[&str]) -> String {
    let o = run(name, args);
    assert!(
        o.status.success(),
        "{name} {args:?} failed: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// GRUB's hybrid MBR (grub-pc-bin, which scripts/setup.sh installs).
fn hybrid_mbr() -> Vec<u8> {
    std::fs::read(HYBRID)
        .unwrap_or_else(|e| panic!("{HYBRID}: {e}: run scripts/setup.sh (grub-pc-bin)"))
}

/// A fake eltorito.img: 30 KiB of recognisable bytes.
fn fake_eltorito() -> Vec<u8> {
    (0..30 * 1024u32)
        .map(|i| (i * 7 + 3) as u8 ^ 0x5A)
        .collect()
}

/// A 3 MiB file streamed from disk.
fn big() -> Vec<u8> {
    (0..3 * 1024 * 1024u32)
        .map(|i| (i / 4096) as u8 ^ i as u8)
        .collect()
}

struct Fixture {
    dir: tempfile::TempDir,
    spec: IsoSpec,
    hybrid: Vec<u8>,
    fat: Vec<u8>,
}

/// The files of the test image.
fn fixture() -> Fixture {
    let hybrid = hybrid_mbr();
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n);
    std::fs::write(p("eltorito.img"), fake_eltorito()).unwrap();
    std::fs::write(p("big"), big()).unwrap();
    std::fs::write(p("BOOTX64.EFI"), b"MZ not really an EFI program").unwrap();
    let fat = p("efi.img");
    let fat_s = fat.to_str().unwrap();
    ok("mkfs.vfat", &["-C", "-i", "12345678", fat_s, "2048"]);
    ok("mmd", &["-i", fat_s, "::/EFI", "::/EFI/BOOT"]);
    ok(
        "mcopy",
        &[
            "-i",
            fat_s,
            p("BOOTX64.EFI").to_str().unwrap(),
            "::/EFI/BOOT/BOOTX64.EFI",
        ],
    );
    let file = |path: &str, src: &str| IsoFile {
        path: path.into(),
        source: IsoSource::File(p(src)),
    };
    let bytes = |path: &str, b: &[u8]| IsoFile {
        path: path.into(),
        source: IsoSource::Bytes(b.to_vec()),
    };
    let spec = IsoSpec {
        volume_id: "TALOS_LIKE_1_0".into(),
        volume_set_id: "IMAGER 0123456789ABCDEF".into(),
        publisher: "THE PROJECT".into(),
        epoch: 1_700_000_000,
        files: vec![
            bytes("boot/grub/grub.cfg", b"echo hello\n"),
            file(ELTORITO, "eltorito.img"),
            file(EFI_IMG, "efi.img"),
            file("live/vmlinuz", "big"),
            bytes("README.Mixed-Case.txt", b"Read me.\n"),
            bytes("a-b.txt", b"dash\n"),
            bytes("a_b.txt", b"underscore\n"),
            bytes("empty", b""),
            bytes(&format!("docs/{}", long_name()), b"long\n"),
            bytes("d1/d2/d3/d4/d5/d6/d7/deep.txt", b"deep\n"),
        ],
        bios: Some(BiosBoot {
            image: ELTORITO.into(),
            hybrid_mbr: hybrid.clone(),
        }),
        efi_image: Some(EFI_IMG.into()),
    };
    let fat = std::fs::read(&fat).unwrap();
    Fixture {
        dir,
        spec,
        hybrid,
        fat,
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

/// The content of `path` as the image must hold it: the spec's bytes, the
/// BIOS image with its boot-info table and GRUB patch (computed here
/// independently of the writer).
fn expected(spec: &IsoSpec, path: &str, bios_lba: u32) -> Vec<u8> {
    let f = spec.files.iter().find(|f| f.path == path).unwrap();
    let mut b = match &f.source {
        IsoSource::Bytes(b) => b.clone(),
        IsoSource::File(p) => std::fs::read(p).unwrap(),
    };
    if path == ELTORITO {
        let len = b.len() as u32;
        b[2548..2556].copy_from_slice(&(u64::from(bios_lba) * 4 + 5).to_le_bytes());
        let mut sum = 0u32;
        for w in b[64..].chunks(4) {
            let mut x = [0u8; 4];
            x[..w.len()].copy_from_slice(w);
            sum = sum.wrapping_add(u32::from_le_bytes(x));
        }
        b[8..64].fill(0);
        b[8..12].copy_from_slice(&16u32.to_le_bytes());
        b[12..16].copy_from_slice(&bios_lba.to_le_bytes());
        b[16..20].copy_from_slice(&len.to_le_bytes());
        b[20..24].copy_from_slice(&sum.to_le_bytes());
    }
    b
}

fn write_fixture(f: &Fixture, name: &str) -> (PathBuf, IsoReport) {
    let out = f.dir.path().join(name);
    let r = write(&f.spec, &out).unwrap();
    assert_eq!(std::fs::metadata(&out).unwrap().len(), r.size);
    assert_eq!(r.size, u64::from(r.volume_blocks) * BLOCK);
    (out, r)
}

/// xorriso gives back every file under its Rock Ridge name, with its
/// content and the modes 0555/0444.
#[test]
fn xorriso_extracts_every_file() {
    let f = fixture();
    let (iso, r) = write_fixture(&f, "x.iso");
    let iso_s = iso.to_str().unwrap();
    let dest = f.dir.path().join("extracted");
    ok(
        "xorriso",
        &[
            "-osirrox",
            "on",
            "-indev",
            iso_s,
            "-extract",
            "/",
            dest.to_str().unwrap(),
        ],
    );
    let mut found = Vec::new();
    for e in walkdir::WalkDir::new(&dest).min_depth(1) {
        let e = e.unwrap();
        if e.file_type().is_file() {
            let rel = e
                .path()
                .strip_prefix(&dest)
                .unwrap()
                .to_str()
                .unwrap()
                .to_string();
            found.push(rel);
        }
    }
    found.sort();
    let mut want: Vec<String> = f.spec.files.iter().map(|x| x.path.clone()).collect();
    want.sort();
    assert_eq!(found, want);
    let bios_lba = r.bios_image_lba.unwrap();
    for p in &want {
        let got = std::fs::read(dest.join(p)).unwrap();
        assert!(
            got == expected(&f.spec, p, bios_lba),
            "{p}: the extracted content differs"
        );
    }
    // The extracted tree is read-only: let the temporary directory go.
    ok("chmod", &["-R", "u+w", dest.to_str().unwrap()]);

    let list = ok("xorriso", &["-indev", iso_s, "-find", "/", "-exec", "lsdl"]);
    let mut lines = 0;
    let records = list
        .lines()
        .filter(|l| l.ends_with('\'') && (l.starts_with("d") || l.starts_with("-r")));
    for l in records {
        lines += 1;
        let is_dir = l.starts_with('d');
        let mode = if is_dir { "dr-xr-xr-x" } else { "-r--r--r--" };
        assert!(l.starts_with(mode), "{l}");
        assert!(l.contains("Nov 14  2023"), "date of {l}");
    }
    // 10 files, 14 directories (the root included).
    assert_eq!(lines, 24, "{list}");
    assert!(list.contains("'/README.Mixed-Case.txt'"), "{list}");
    assert!(list.contains(&format!("'/docs/{}'", long_name())), "{list}");
}

/// The El Torito report and the system area as xorriso reads them.
#[test]
fn xorriso_reports_boot_images_and_system_area() {
    let f = fixture();
    let (iso, r) = write_fixture(&f, "b.iso");
    let out = ok(
        "xorriso",
        &[
            "-indev",
            iso.to_str().unwrap(),
            "-report_el_torito",
            "plain",
            "-report_system_area",
            "plain",
        ],
    );
    let (bios, efi) = (r.bios_image_lba.unwrap(), r.efi_image_lba.unwrap());
    let norm: Vec<String> = out
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect();
    let has = |s: &str| assert!(norm.iter().any(|l| l == s), "no line {s:?} in:\n{out}");
    has(&format!("El Torito catalog : {} 1", r.catalog_lba.unwrap()));
    has(&format!(
        "El Torito boot img : 1 BIOS y none 0x0000 0x00 4 {bios}"
    ));
    has(&format!(
        "El Torito boot img : 2 UEFI y none 0x0000 0x00 {} {efi}",
        f.fat.len() / 512
    ));
    has(&format!("El Torito img path : 1 /{ELTORITO}"));
    has("El Torito img opts : 1 boot-info-table grub2-boot-info");
    has(&format!("El Torito img path : 2 /{EFI_IMG}"));
    has("System area summary: MBR protective-msdos-label grub2-mbr cyl-align-off GPT");
    let sectors = r.size / 512;
    has(&format!("MBR partition : 1 0x00 0xee 1 {}", sectors - 1));
    let (first, last) = r.efi_partition.unwrap();
    has(&format!(
        "GPT start and size : 1 {first} {}",
        last - first + 1
    ));
    has(&format!("GPT partition path : 1 /{EFI_IMG}"));
    has("GPT partname local : 1 EFI");
    has("GPT type GUID : 1 28732ac11ff8d211ba4b00a0c93ec93b");
    assert_eq!(first, u64::from(efi) * 4);
    assert_eq!(last - first + 1, f.fat.len() as u64 / 512);
}

/// sfdisk reads the GPT; the EFI partition is the FAT image, byte for byte,
/// and fsck.fat finds it clean.
#[test]
fn sfdisk_finds_the_efi_partition() {
    let f = fixture();
    let (iso, r) = write_fixture(&f, "s.iso");
    let json = ok("sfdisk", &["--json", iso.to_str().unwrap()]);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let t = &v["partitiontable"];
    assert_eq!(t["label"], "gpt", "{json}");
    assert_eq!(t["sectorsize"], 512, "{json}");
    let parts = t["partitions"].as_array().unwrap();
    assert_eq!(parts.len(), 1, "{json}");
    let p = &parts[0];
    let (first, last) = r.efi_partition.unwrap();
    assert_eq!(p["start"], first, "{json}");
    assert_eq!(p["size"], last - first + 1, "{json}");
    assert_eq!(p["type"], "C12A7328-F81F-11D2-BA4B-00A0C93EC93B", "{json}");
    assert_eq!(p["name"], "EFI", "{json}");
    let image = std::fs::read(&iso).unwrap();
    let part = &image[first as usize * 512..(last as usize + 1) * 512];
    assert!(part == &f.fat[..], "the EFI partition is not the FAT image");
    let dumped = f.dir.path().join("esp.img");
    std::fs::write(&dumped, part).unwrap();
    ok("fsck.fat", &["-n", dumped.to_str().unwrap()]);
    let at = format!("{}@@{}", iso.to_str().unwrap(), first * 512);
    let dir = ok("mdir", &["-b", "-i", &at, "::/EFI/BOOT"]);
    assert!(dir.contains("BOOTX64.EFI"), "{dir}");
}

/// The bytes xorriso's -boot-info-table, --grub2-boot-info and
/// --grub2-mbr would write, read straight from the image.
#[test]
fn boot_patches_and_hybrid_mbr() {
    let f = fixture();
    let (iso, r) = write_fixture(&f, "p.iso");
    let image = std::fs::read(&iso).unwrap();
    let lba = r.bios_image_lba.unwrap();
    let at = lba as usize * 2048;
    let boot = &image[at..at + f.fat.len().min(30 * 1024)];
    let orig = fake_eltorito();
    assert_eq!(u32_at(boot, 8), 16, "boot-info: PVD LBA");
    assert_eq!(u32_at(boot, 12), lba, "boot-info: boot file LBA");
    assert_eq!(u32_at(boot, 16), orig.len() as u32, "boot-info: length");
    let sum = boot[64..30 * 1024]
        .chunks(4)
        .fold(0u32, |s, w| s.wrapping_add(u32_at(w, 0)));
    assert_eq!(u32_at(boot, 20), sum, "boot-info: checksum");
    assert!(boot[24..64].iter().all(|b| *b == 0));
    assert_eq!(
        u64_at(boot, 2548),
        u64::from(lba) * 4 + 5,
        "grub2-boot-info"
    );
    assert_eq!(&boot[..8], &orig[..8]);
    assert_eq!(&boot[64..2548], &orig[64..2548]);
    assert_eq!(&boot[2556..], &orig[2556..]);

    let mbr = &image[..512];
    assert_eq!(&mbr[..0x1B0], &f.hybrid[..0x1B0], "boot_hybrid.img's code");
    assert_eq!(
        u64_at(mbr, 0x1B0),
        u64::from(lba) * 4 + 4,
        "grub2-mbr pointer"
    );
    assert_eq!(u32_at(mbr, 440), r.mbr_signature.unwrap());
    assert_eq!(&mbr[510..], &[0x55, 0xAA]);
    assert_eq!(mbr[446], 0, "no boot flag");
    assert_eq!(mbr[450], 0xEE, "the protective partition");
    assert!(mbr[462..510].iter().all(|b| *b == 0), "one MBR partition");

    // The PVD: identifiers, size and dates.
    let pvd = &image[16 * 2048..17 * 2048];
    assert_eq!(&pvd[..7], b"\x01CD001\x01");
    assert_eq!(&pvd[40..72], format!("{:32}", "TALOS_LIKE_1_0").as_bytes());
    assert_eq!(u32_at(pvd, 80) as u64 * 2048, image.len() as u64);
    assert_eq!(&pvd[190..213], b"IMAGER 0123456789ABCDEF");
    assert_eq!(&pvd[813..829], b"2023111422132000");
    assert_eq!(&pvd[830..846], b"2023111422132000");
    let br = &image[17 * 2048..18 * 2048];
    assert_eq!(&br[7..30], b"EL TORITO SPECIFICATION");
    assert_eq!(u32_at(br, 71), r.catalog_lba.unwrap());
    // The catalog's validation entry sums to zero.
    let cat = &image[r.catalog_lba.unwrap() as usize * 2048..][..64];
    let s = cat[..32].chunks(2).fold(0u16, |s, w| {
        s.wrapping_add(u16::from_le_bytes([w[0], w[1]]))
    });
    assert_eq!(s, 0);
    assert_eq!(&cat[30..32], &[0x55, 0xAA]);
}

/// Same spec, same bytes; another epoch changes the dates (and only
/// derived values).
#[test]
fn deterministic() {
    let mut f = fixture();
    let (a, ra) = write_fixture(&f, "a.iso");
    let (b, rb) = write_fixture(&f, "b.iso");
    assert_eq!(ra, rb);
    assert!(std::fs::read(&a).unwrap() == std::fs::read(&b).unwrap());
    f.spec.epoch += 86_400 * 366;
    let (c, _) = write_fixture(&f, "c.iso");
    let c = std::fs::read(c).unwrap();
    assert!(c != std::fs::read(&a).unwrap());
    assert_eq!(&c[16 * 2048 + 813..16 * 2048 + 829], b"2024111422132000");
}

/// BIOS only (no GPT: GRUB's code over an empty table), EFI only (the
/// protective MBR, the EFI image as default entry), neither.
#[test]
fn boot_variants() {
    let mut f = fixture();
    let efi = f.spec.efi_image.take();
    let (iso, r) = write_fixture(&f, "bios.iso");
    let image = std::fs::read(&iso).unwrap();
    assert_eq!(r.efi_partition, None);
    assert!(image[446..510].iter().all(|b| *b == 0));
    assert_eq!(&image[510..512], &[0x55, 0xAA]);
    let cat = &image[r.catalog_lba.unwrap() as usize * 2048..][..128];
    assert_eq!(cat[1], 0);
    assert!(cat[64..].iter().all(|b| *b == 0));

    f.spec.efi_image = efi;
    f.spec.bios = None;
    let (iso, r) = write_fixture(&f, "efi.iso");
    let image = std::fs::read(&iso).unwrap();
    assert!(image[..440].iter().all(|b| *b == 0), "no boot code");
    assert_eq!(u32_at(&image, 440), r.mbr_signature.unwrap());
    assert_eq!(image[450], 0xEE);
    let cat = &image[r.catalog_lba.unwrap() as usize * 2048..][..64];
    assert_eq!(cat[1], 0xEF);
    assert_eq!(cat[32], 0x88);
    assert_eq!(u32_at(cat, 40), r.efi_image_lba.unwrap());
    let out = ok(
        "xorriso",
        &[
            "-indev",
            iso.to_str().unwrap(),
            "-report_el_torito",
            "plain",
        ],
    );
    assert!(out.contains("UEFI"), "{out}");
    assert!(!out.contains("BIOS  y"), "{out}");

    f.spec.efi_image = None;
    let (iso, r) = write_fixture(&f, "plain.iso");
    let image = std::fs::read(&iso).unwrap();
    assert_eq!(r.catalog_lba, None);
    assert!(image[..32 * 1024].iter().all(|b| *b == 0));
    assert_eq!(image[17 * 2048], 255, "the terminator follows the PVD");
}

/// An EFI image too large for the catalog's 16-bit count gets 0: EDK2 then
/// takes the rest of the medium.
#[test]
fn large_efi_image_count() {
    let cat = boot_catalog(Some(40), Some((50, 0)));
    assert_eq!(u16::from_le_bytes([cat[102], cat[103]]), 0);
    assert_eq!(u32_at(&cat, 104), 50);
    assert_eq!(u16::from_le_bytes([cat[38], cat[39]]), 4);
}

/// Each refusal, before the output exists.
#[test]
fn refusals() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("r.iso");
    let base = IsoSpec {
        volume_id: "VOL".into(),
        volume_set_id: String::new(),
        publisher: String::new(),
        epoch: 0,
        files: vec![IsoFile {
            path: "a".into(),
            source: IsoSource::Bytes(vec![1; 3000]),
        }],
        bios: None,
        efi_image: None,
    };
    let refused = |change: &dyn Fn(&mut IsoSpec), want: &str| {
        let mut s = base.clone();
        change(&mut s);
        let e = format!("{:#}", write(&s, &out).unwrap_err());
        assert!(e.contains(want), "{e:?} does not say {want:?}");
        assert!(!out.exists(), "{want}: the output was created");
    };
    let path = |p: &str| {
        let p = p.to_string();
        move |s: &mut IsoSpec| s.files[0].path = p.clone()
    };
    refused(&|s| s.volume_id = "lower".into(), "only d-characters");
    refused(&|s| s.volume_id = "A-B".into(), "only d-characters");
    refused(&|s| s.volume_id = "A".repeat(33), "at most 32");
    refused(
        &|s| s.volume_id = String::new(),
        "volume identifier is empty",
    );
    refused(&|s| s.volume_set_id = "abc".into(), "only a-characters");
    refused(&|s| s.volume_set_id = "A".repeat(129), "at most 128");
    refused(&|s| s.publisher = "é".into(), "only a-characters");
    refused(&|s| s.epoch = 6_000_000_000, "dates end in 2155");
    refused(&path(""), "empty path");
    refused(&path("/a"), "starts with '/'");
    refused(&path("a//b"), "empty component");
    refused(&path("a/../b"), "\"..\" component");
    refused(&path("./b"), "\".\" component");
    refused(&path(&"n".repeat(256)), "at most 255 bytes");
    refused(&path("1/2/3/4/5/6/7/8/f"), "8 directories deep");
    refused(
        &|s| {
            s.files.push(s.files[0].clone());
        },
        "given twice",
    );
    refused(
        &|s| {
            s.files.push(IsoFile {
                path: "a/b".into(),
                source: IsoSource::Bytes(vec![]),
            });
        },
        "both a file and a directory",
    );
    refused(
        &|s| s.files[0].source = IsoSource::File("/nonexistent/source".into()),
        "/nonexistent/source",
    );
    refused(
        &|s| s.files[0].source = IsoSource::File("/".into()),
        "not a regular file",
    );
    let bios = |image: &str, mbr: Vec<u8>| BiosBoot {
        image: image.into(),
        hybrid_mbr: mbr,
    };
    let mut mbr = vec![0u8; 512];
    mbr[510] = 0x55;
    mbr[511] = 0xAA;
    let m = mbr.clone();
    refused(
        &move |s| s.bios = Some(bios("b", m.clone())),
        "BIOS boot image \"b\" is not among the image's files",
    );
    refused(
        &|s| s.bios = Some(bios("a", vec![0; 440])),
        "boot_hybrid.img is one 512-byte sector",
    );
    let m = mbr.clone();
    refused(
        &move |s| {
            s.files[0].source = IsoSource::Bytes(vec![0; 2000]);
            s.bios = Some(bios("a", m.clone()));
        },
        "at least 2556 bytes",
    );
    refused(
        &|s| s.efi_image = Some("x".into()),
        "EFI boot image \"x\" is not among",
    );
    refused(
        &|s| s.efi_image = Some("a".into()),
        "a non-zero multiple of 512",
    );
    // A sparse file of 4 GiB: one extent cannot hold it.
    let huge = dir.path().join("huge");
    std::fs::File::create(&huge)
        .unwrap()
        .set_len(1 << 32)
        .unwrap();
    refused(
        &|s| s.files[0].source = IsoSource::File(huge.clone()),
        "4 GiB - 1",
    );
    // And the spec is fine otherwise.
    write(&base, &out).unwrap();
    // An existing output is not overwritten.
    let e = format!("{:#}", write(&base, &out).unwrap_err());
    assert!(e.contains("creating"), "{e}");
}

/// A source that changes size between layout and write: the output is
/// removed.
#[test]
fn failed_write_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    std::fs::write(&src, vec![7u8; 5000]).unwrap();
    let spec = IsoSpec {
        volume_id: "VOL".into(),
        volume_set_id: String::new(),
        publisher: String::new(),
        epoch: 0,
        files: vec![IsoFile {
            path: "f".into(),
            source: IsoSource::File(src.clone()),
        }],
        bios: None,
        efi_image: None,
    };
    let p = plan(&spec).unwrap();
    std::fs::write(&src, vec![7u8; 6000]).unwrap();
    let out = dir.path().join("o.iso");
    let e = format!("{:#}", write_plan(&spec, &p, &out).unwrap_err());
    assert!(e.contains("grew while the image was written"), "{e}");
    assert!(!out.exists(), "the half-written image was left behind");
}

/// Plain ISO 9660 names: upper case d-characters, unique per directory.
#[test]
fn plain_names() {
    assert_eq!(iso_ident("grub.cfg", false), ("GRUB".into(), "CFG".into()));
    assert_eq!(
        iso_ident("a-b.tar.gz", false),
        ("A_B_TAR".into(), "GZ".into())
    );
    assert_eq!(
        iso_ident(".hidden", false),
        ("_HIDDEN".into(), String::new())
    );
    assert_eq!(
        iso_ident("i386-pc", true),
        ("I386_PC".into(), String::new())
    );
    let spec = IsoSpec {
        volume_id: "V".into(),
        volume_set_id: String::new(),
        publisher: String::new(),
        epoch: 0,
        files: ["a-b.txt", "a_b.txt", "A_B.TXT"]
            .iter()
            .map(|p| IsoFile {
                path: (*p).into(),
                source: IsoSource::Bytes(vec![]),
            })
            .collect(),
        bios: None,
        efi_image: None,
    };
    let l = build_tree(&spec, &[0, 0, 0]).unwrap();
    let mut idents: Vec<String> = l.nodes[1..]
        .iter()
        .map(|n| String::from_utf8(n.ident.clone()).unwrap())
        .collect();
    idents.sort();
    assert_eq!(idents, ["A_B.TXT;1", "A_B_1.TXT;1", "A_B_2.TXT;1"]);
}

/// Directories over several blocks, a path table over several blocks and
/// continuation areas over several blocks still read back.
#[test]
fn large_directories_and_tables() {
    let dir = tempfile::tempdir().unwrap();
    let mut files = Vec::new();
    for i in 0..120 {
        // 120 directories with 31-character identifiers: a path table of
        // about 5 KiB; the root's records pass one block.
        files.push(IsoFile {
            path: format!("directory-with-a-long-name-{i:04}/f"),
            source: IsoSource::Bytes(format!("file {i}\n").into_bytes()),
        });
    }
    for i in 0..40 {
        // 40 names of 255 bytes: their NM entries fill several
        // continuation blocks.
        let mut name = format!("{i:03}-{}", long_name());
        name.truncate(MAX_NAME);
        files.push(IsoFile {
            path: format!("many/{name}"),
            source: IsoSource::Bytes(vec![i as u8; 3000 + i]),
        });
    }
    let spec = IsoSpec {
        volume_id: "BIG".into(),
        volume_set_id: String::new(),
        publisher: String::new(),
        epoch: 0,
        files: files.clone(),
        bios: None,
        efi_image: None,
    };
    let p = plan(&spec).unwrap();
    assert!(p.pt_size > 2 * 2048, "path table of {} bytes", p.pt_size);
    assert!(p.ce_blocks >= 3, "{} continuation blocks", p.ce_blocks);
    let iso = dir.path().join("big.iso");
    write(&spec, &iso).unwrap();
    let dest = dir.path().join("x");
    ok(
        "xorriso",
        &[
            "-osirrox",
            "on",
            "-indev",
            iso.to_str().unwrap(),
            "-extract",
            "/",
            dest.to_str().unwrap(),
        ],
    );
    for f in &files {
        let IsoSource::Bytes(b) = &f.source else {
            unreachable!()
        };
        assert_eq!(&std::fs::read(dest.join(&f.path)).unwrap(), b, "{}", f.path);
    }
    ok("chmod", &["-R", "u+w", dest.to_str().unwrap()]);
}

/// A volume without files: the root alone.
#[test]
fn empty_volume() {
    let dir = tempfile::tempdir().unwrap();
    let spec = IsoSpec {
        volume_id: "EMPTY".into(),
        volume_set_id: String::new(),
        publisher: String::new(),
        epoch: 0,
        files: Vec::new(),
        bios: None,
        efi_image: None,
    };
    let iso = dir.path().join("e.iso");
    let r = write(&spec, &iso).unwrap();
    assert_eq!(r.catalog_lba, None);
    let list = ok(
        "xorriso",
        &[
            "-indev",
            iso.to_str().unwrap(),
            "-find",
            "/",
            "-exec",
            "lsdl",
        ],
    );
    assert!(list.contains("dr-xr-xr-x"), "{list}");
    assert!(list.contains("Jan  1  1970 '/'"), "{list}");
}

/// With Debian's real eltorito.img: the MBR's pointer reaches the sector
/// that holds diskboot.img, whose patched blocklist loads the rest of
/// core.img from the sector after it; cdboot.img is the first 2048 bytes.
#[test]
fn real_grub_eltorito() {
    let hybrid = hybrid_mbr();
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("eltorito.img");
    ok(
        "grub-mkimage",
        &[
            "-O",
            "i386-pc-eltorito",
            "-d",
            "/usr/lib/grub/i386-pc",
            "-p",
            "/boot/grub",
            "-o",
            img.to_str().unwrap(),
            "biosdisk",
            "iso9660",
            "normal",
        ],
    );
    let len = std::fs::metadata(&img).unwrap().len() as usize;
    let spec = IsoSpec {
        volume_id: "GRUB".into(),
        volume_set_id: String::new(),
        publisher: String::new(),
        epoch: 0,
        files: vec![IsoFile {
            path: ELTORITO.into(),
            source: IsoSource::File(img),
        }],
        bios: Some(BiosBoot {
            image: ELTORITO.into(),
            hybrid_mbr: hybrid,
        }),
        efi_image: None,
    };
    let iso = dir.path().join("g.iso");
    let r = write(&spec, &iso).unwrap();
    let image = std::fs::read(&iso).unwrap();
    let lba = u64::from(r.bios_image_lba.unwrap());
    let cdboot = std::fs::read("/usr/lib/grub/i386-pc/cdboot.img").unwrap();
    let diskboot = std::fs::read("/usr/lib/grub/i386-pc/diskboot.img").unwrap();
    let start = lba as usize * 2048;
    assert_eq!(&image[start + 64..start + cdboot.len()], &cdboot[64..]);
    let pointed = u64_at(&image, 0x1B0) as usize * 512;
    assert_eq!(pointed, start + 2048);
    assert_eq!(&image[pointed..pointed + 0x1F4], &diskboot[..0x1F4]);
    let list = &image[pointed + 0x1F4..pointed + 0x200];
    assert_eq!(u64_at(list, 0), lba * 4 + 5, "blocklist start");
    let sectors = u16::from_le_bytes([list[8], list[9]]) as usize;
    assert_eq!(sectors, (len - 2560).div_ceil(512), "blocklist length");
    assert_eq!(u16::from_le_bytes([list[10], list[11]]), 0x820);
}
