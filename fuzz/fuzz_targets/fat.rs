//! The BOOT filesystem (bootstate::fat::BootFs, bootstate::fatscan,
//! bootstate::fatfix): a FAT volume of arbitrary bytes is scanned, and
//! only a volume that passes the scan reaches fatfs. Nothing panics, hangs
//! or allocates without bound; a reclaim leaves a volume that scans with no
//! lost clusters; a removal leaves a volume that scans.
//!
//! A FAT volume is megabytes (FAT16 needs 4085 clusters), far beyond what a
//! fuzzer mutates well, and a random one never passes the scan. So an input
//! is a list of patches on one of a few real volumes built here once (by
//! fatfs and BootFs, laid out as BOOT is: loader/entries with entries, the
//! slot directories with their files, a lost cluster chain): every input
//! starts from a volume that reaches fatfs, and small patches break it in
//! the places that matter. Patch offsets are relative to a region of the
//! base (boot sector and reserved sectors, each FAT, root directory, data
//! by bytes, data by 32-byte entries), so a mutated offset stays in
//! metadata rather than in megabytes of unused clusters; one more region
//! spans the whole volume (by sectors), so any volume of the base's size
//! can still be written.
//!
//! Input: one byte choosing the base (`% 3`) and the files worked on
//! (`/ 3`), then patches `where off len bytes[len]` (`len` is cut to what
//! is left): `where`'s top 3 bits name the region, its low 5 bits and `off`
//! the offset in it. libFuzzer grows inputs from a few bytes, so a patch
//! costs four bytes: a five-byte input already corrupts the volume.
#![no_main]
use bootstate::fat::BootFs;
use bootstate::ops;
use libfuzzer_sys::fuzz_target;
use std::io::Cursor;
use std::sync::OnceLock;

/// A base volume, stored sparsely: its length, its non-zero 512-byte
/// blocks merged into extents, and the offsets of its regions.
struct Base {
    len: usize,
    extents: Vec<(usize, Vec<u8>)>,
    regions: [usize; 5],
}

impl Base {
    /// The volume with `patches` applied (a zeroed allocation, so a large
    /// volume costs only the pages written).
    fn image(&self, patches: &[(usize, &[u8])]) -> Vec<u8> {
        let mut img = vec![0u8; self.len];
        for (at, bytes) in &self.extents {
            img[*at..*at + bytes.len()].copy_from_slice(bytes);
        }
        for &(at, bytes) in patches {
            let end = (at + bytes.len()).min(self.len);
            if at < end {
                img[at..end].copy_from_slice(&bytes[..end - at]);
            }
        }
        img
    }
}

const KERNEL: &str = "A/vmlinuz-0123456789abcdef";
const INITRD: &str = "A/initramfs-0123456789abcdef.zst";

/// Builds a volume as the installer lays out BOOT.
fn build(len: usize, opts: fatfs::FormatVolumeOptions) -> Base {
    let mut dev = Cursor::new(vec![0u8; len]);
    fatfs::format_volume(&mut dev, opts).expect("format");
    let mut fs = BootFs::new(dev, 1_700_000_000);
    for d in ["EFI", "EFI/BOOT", "loader", "loader/entries", "A", "B"] {
        fs.ensure_dir(d).expect("mkdir");
    }
    let entry = |linux: &str, initrd: &str| {
        format!(
            "title Talos-ish (slot A)\nversion 1\nlinux /{linux}\ninitrd /{initrd}\n\
             options console=ttyS0 machined.slot=A\n"
        )
    };
    let kernel: Vec<u8> = (0..3000u32).map(|i| (i * 7 % 251) as u8).collect();
    // Small files first: their clusters lie within the first 8 KiB of the
    // data region, which patches reach byte by byte.
    let files: Vec<(&str, Vec<u8>)> = vec![
        (
            "loader/entries/g00000001-slot-a.conf",
            entry(KERNEL, INITRD).into_bytes(),
        ),
        (
            "loader/entries/g00000002-slot-b+3-0.conf",
            entry(
                "B/vmlinuz-fedcba9876543210",
                "B/initramfs-fedcba9876543210.zst",
            )
            .into_bytes(),
        ),
        ("loader/entries/g00000003-slot-a+0-3.conf", Vec::new()),
        ("loader/loader.conf", b"timeout 3\n".to_vec()),
        ("EFI/BOOT/BOOTX64.EFI", vec![0x4d; 700]),
        (KERNEL, kernel),
        (INITRD, vec![0x28; 1500]),
    ];
    for (path, data) in &files {
        fs.create(path, &mut &data[..], data.len() as u64)
            .expect("create");
    }
    let mut dev = fs.into_inner();
    let img = dev.get_mut();
    let le16 = |b: &[u8], at: usize| usize::from(u16::from_le_bytes([b[at], b[at + 1]]));
    let le32 =
        |b: &[u8], at: usize| u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]) as usize;
    let bps = le16(img, 11);
    let spc = usize::from(img[13]);
    let reserved = le16(img, 14);
    let fats = usize::from(img[16]);
    let root_entries = le16(img, 17);
    let spf = match le16(img, 22) {
        0 => le32(img, 36),
        n => n,
    };
    let fat32 = root_entries == 0;
    let fat = reserved * bps;
    let fat_len = spf * bps;
    let root_region = fat + fats * fat_len;
    let data = root_region + (root_entries * 32).div_ceil(bps) * bps;
    let cluster = |c: usize| data + (c - 2) * spc * bps;
    let root = if fat32 {
        cluster(le32(img, 44))
    } else {
        root_region
    };
    // Lost clusters: a chain allocated in every FAT that no entry reaches
    // (what a file creation cut short leaves).
    for copy in 0..fats {
        let base = fat + copy * fat_len;
        for (c, next) in [(1000usize, 1001u32), (1001, 0x0FFF_FFFF)] {
            if fat32 {
                img[base + c * 4..base + c * 4 + 4].copy_from_slice(&next.to_le_bytes());
            } else {
                img[base + c * 2..base + c * 2 + 2].copy_from_slice(&(next as u16).to_le_bytes());
            }
        }
    }
    let mut extents: Vec<(usize, Vec<u8>)> = Vec::new();
    for (i, block) in img.chunks(512).enumerate() {
        if block.iter().all(|b| *b == 0) {
            continue;
        }
        match extents.last_mut() {
            Some((at, bytes)) if *at + bytes.len() == i * 512 => bytes.extend_from_slice(block),
            _ => extents.push((i * 512, block.to_vec())),
        }
    }
    Base {
        len,
        extents,
        regions: [0, fat, fat + fat_len, root, data],
    }
}

fn bases() -> &'static [Base] {
    static BASES: OnceLock<Vec<Base>> = OnceLock::new();
    BASES.get_or_init(|| {
        let opts = || {
            fatfs::FormatVolumeOptions::new()
                .volume_label(*b"BOOT       ")
                .bytes_per_cluster(512)
        };
        vec![
            // FAT16, 512-byte sectors: BOOT as the builder makes it.
            build(4 << 20, opts().fat_type(fatfs::FatType::Fat16)),
            // FAT32: a root directory in clusters and an FSInfo sector.
            build(34 << 20, opts().fat_type(fatfs::FatType::Fat32)),
            // FAT16 on 4096-byte sectors, clusters of 8 sectors.
            build(
                20 << 20,
                fatfs::FormatVolumeOptions::new()
                    .bytes_per_sector(4096)
                    .bytes_per_cluster(4096)
                    .fat_type(fatfs::FatType::Fat16),
            ),
        ]
    })
}

/// Paths hashed, read and looked up per input: enough to reach fatfs's
/// file reads, few enough to keep an input cheap.
const FILES: usize = 3;

fuzz_target!(|data: &[u8]| {
    let bases = bases();
    let (base, pick, mut rest) = match data {
        [b, rest @ ..] => (
            &bases[usize::from(*b) % bases.len()],
            usize::from(*b) / bases.len(),
            rest,
        ),
        [] => return,
    };
    let mut patches = Vec::new();
    while let [at, lo, n, tail @ ..] = rest {
        let n = usize::from(*n).min(tail.len());
        let off = usize::from(*at & 0x1F) << 8 | usize::from(*lo);
        let at = match usize::from(*at >> 5) {
            r @ 0..5 => base.regions[r] + off,
            // The data region by directory entries: the files' clusters
            // on 4096-byte clusters too.
            5 => base.regions[4] + off * 32,
            // Anywhere: 8192 steps over the volume, sector-aligned.
            _ => off * ((base.len / 8192) & !511),
        };
        patches.push((at, &tail[..n]));
        rest = &tail[n..];
    }

    // Reads: only a volume that passes the scan gets to fatfs.
    let mut fs = BootFs::new(Cursor::new(base.image(&patches)), 0);
    let Ok(scan) = fs.scan().cloned() else {
        return;
    };
    assert!(scan.lost.len() <= scan.clusters as usize);
    let all = fs.list_all().unwrap_or_default();
    let _ = fs.list("loader/entries");
    let _ = fs.list("");
    let _ = ops::entry_files(&mut fs);
    let _ = fs.space();
    for path in all.iter().cycle().skip(pick).take(FILES.min(all.len())) {
        let _ = fs.hash(path);
        let _ = fs.read(path, 4096);
        let _ = fs.exists(path);
    }

    // A reclaim (on the same, unchanged image): the volume then scans,
    // without lost clusters when the reclaim went through.
    let mut dev = fs.into_inner();
    let reclaimed = BootFs::new(&mut dev, 0).reclaim();
    let again = BootFs::new(&mut dev, 0)
        .scan()
        .cloned()
        .expect("a volume scans after a reclaim");
    if reclaimed.is_ok() {
        assert!(
            again.lost.is_empty(),
            "lost clusters after a reclaim: {:?}",
            again.lost
        );
    }

    // A removal of a listed file: the volume then scans.
    if !all.is_empty() {
        let path = &all[pick % all.len()];
        let mut dev = Cursor::new(base.image(&patches));
        let _ = BootFs::new(&mut dev, 0).remove(path);
        BootFs::new(&mut dev, 0)
            .scan()
            .expect("a volume scans after a removal");
    }

    // A new directory and a new file (fatfs's writes, then the dot-entry
    // repair): the volume then scans and holds the file.
    let mut dev = Cursor::new(base.image(&patches));
    let mut fs = BootFs::new(&mut dev, 0);
    if fs.ensure_dir("fuzzdir").is_ok() && fs.create("fuzzdir/new", &mut &b"fuzz"[..], 4).is_ok() {
        let mut fs = BootFs::new(&mut dev, 0);
        fs.scan().expect("a volume scans after a creation");
        assert_eq!(
            fs.read("fuzzdir/new", 16).expect("the new file reads"),
            b"fuzz"
        );
    }
});
