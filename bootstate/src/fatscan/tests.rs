//! The FAT reader on volumes made by fatfs (what the builder and the
//! installer write), cut short as a power cut leaves them, and made hostile
//! as an attacker would: one field changed at a time.

use super::*;
use crate::device::Faulty;
use crate::fat::BootFs;
use crate::testutil::fsck;
use std::io::Cursor;
use std::time::{Duration, Instant};

type Dev = Cursor<Vec<u8>>;

/// A BOOT-like volume: slot directories, two big files and an entry.
fn volume(kind: Kind) -> Vec<u8> {
    let mut dev = Cursor::new(vec![0u8; 40 << 20]);
    let mut o = fatfs::FormatVolumeOptions::new();
    if kind == Kind::Fat32 {
        o = o.fat_type(fatfs::FatType::Fat32).bytes_per_cluster(512);
    }
    fatfs::format_volume(&mut dev, o).unwrap();
    let mut fs = BootFs::new(dev, 0);
    for d in ["loader", "loader/entries", "A", "B"] {
        fs.ensure_dir(d).unwrap();
    }
    for (path, len) in [
        ("A/vmlinuz", 200_000usize),
        ("A/initramfs", 300_000),
        ("loader/entries/g1.conf", 40),
    ] {
        let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        fs.create(path, &mut &data[..], len as u64).unwrap();
    }
    fs.into_inner().into_inner()
}

fn scan_of(v: &[u8]) -> Result<Scan> {
    scan(&mut Cursor::new(v))
}

fn geom(v: &[u8]) -> Geometry {
    geometry(&mut Cursor::new(v)).unwrap()
}

fn found(v: &[u8], path: &str) -> crate::fatfix::Found {
    crate::fatfix::find(&mut Cursor::new(v), &geom(v), path)
        .unwrap()
        .unwrap()
}

/// Sets cluster `c`'s FAT entry in every copy.
fn set_fat(v: &mut [u8], c: u32, value: u32) {
    let g = geom(v);
    let (at, width) = g.fat_entry(c);
    for copy in 0..g.fats {
        let i = (at + copy * g.fat_len) as usize;
        v[i..i + width].copy_from_slice(&value.to_le_bytes()[..width]);
    }
}

fn set_first_cluster(v: &mut [u8], entry: u64, c: u32) {
    let e = entry as usize;
    v[e + 20..e + 22].copy_from_slice(&((c >> 16) as u16).to_le_bytes());
    v[e + 26..e + 28].copy_from_slice(&(c as u16).to_le_bytes());
}

#[test]
fn a_whole_volume_scans_clean() {
    for kind in [Kind::Fat16, Kind::Fat32] {
        let v = volume(kind);
        let s = scan_of(&v).unwrap();
        assert_eq!(s.kind, kind);
        assert_eq!((s.files, s.dirs), (3, 4), "{kind:?}");
        assert!(s.lost.is_empty(), "{kind:?}");
        let mut fs = BootFs::new(Cursor::new(v.clone()), 0);
        let (free, cluster) = fs.space().unwrap();
        assert_eq!(u64::from(s.free) * cluster, free, "{kind:?}: fatfs agrees");
        let text = fsck(&v);
        assert!(!text.contains("unused cluster"), "{text}");
    }
}

/// A file creation cut at writes spread over all of them: the volume always scans (never
/// refused: a cut is not damage), the clusters it leaves are found and
/// reclaimed, after which fsck.fat finds no lost cluster; a reclaim cut at
/// any of its writes is harmless and finished by the next.
#[test]
fn what_a_cut_creation_leaves_is_reclaimed() {
    crate::device::each_loss(|_| what_a_cut_creation_leaves_is_reclaimed_under_loss());
}

fn what_a_cut_creation_leaves_is_reclaimed_under_loss() {
    for kind in [Kind::Fat16, Kind::Fat32] {
        let v = volume(kind);
        let data = vec![0x5au8; 100_000];
        let mut count = Faulty::counting(Cursor::new(v.clone()));
        BootFs::new(&mut count, 0)
            .create("B/new", &mut &data[..], data.len() as u64)
            .unwrap();
        let mut lost_seen = false;
        // Every write near the start and the end, and 30 spread between.
        let total = count.writes();
        let mut points: Vec<u64> = (1..=total.min(8)).collect();
        points.extend((1..30).map(|i| total * i / 30));
        points.extend(total.saturating_sub(8)..=total);
        points.retain(|n| *n >= 1);
        points.sort();
        points.dedup();
        for n in points {
            let mut dev = Faulty::failing_at(Cursor::new(v.clone()), n);
            assert!(
                BootFs::new(&mut dev, 0)
                    .create("B/new", &mut &data[..], data.len() as u64)
                    .is_err()
            );
            let cut = dev.into_inner().into_inner();
            let s = scan_of(&cut).unwrap_or_else(|e| panic!("{kind:?} cut {n}: {e:#}"));
            if s.lost.is_empty() {
                continue;
            }
            // The reclaim is cut at each of its writes once per volume kind.
            let cuts = if lost_seen { 0 } else { total_writes(&cut, &s) };
            lost_seen = true;
            let text = fsck(&cut);
            assert!(
                text.contains("unused cluster"),
                "{kind:?} cut {n}: fsck sees what the scan sees: {text}"
            );
            // The reclaim, cut at each of its writes, then run to the end.
            for m in 1..=cuts + 1 {
                let mut d = Faulty::failing_at(Cursor::new(cut.clone()), m);
                let _ = reclaim(&mut d, &s);
                let mut fs = BootFs::new(d.into_inner(), 0);
                let again = fs.scan().unwrap().clone();
                assert!(again.lost.len() <= s.lost.len());
                fs.reclaim().unwrap();
                assert!(fs.scan().unwrap().lost.is_empty());
                for f in ["A/vmlinuz", "A/initramfs"] {
                    assert!(fs.hash(f).is_ok(), "{kind:?} cut {n}/{m}: {f}");
                }
                let after = fs.into_inner().into_inner();
                let text = fsck(&after);
                assert!(
                    !text.contains("unused cluster") && !text.contains("FATs differ"),
                    "{kind:?} cut {n}/{m}: {text}"
                );
            }
        }
        assert!(lost_seen, "{kind:?}: some cut leaves lost clusters");
    }
}

fn total_writes(v: &[u8], s: &Scan) -> u64 {
    let mut total = Faulty::counting(Cursor::new(v.to_vec()));
    reclaim(&mut total, s).unwrap();
    total.writes()
}

/// Runs `f` with a time bound: a hang fails the test instead of stalling it.
fn bounded<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    let start = Instant::now();
    let r = rx
        .recv_timeout(Duration::from_secs(20))
        .unwrap_or_else(|_| panic!("{what}: no answer in 20 s"));
    assert!(start.elapsed() < Duration::from_secs(20));
    r
}

/// Each hostile change is refused by the scan, with what is wrong, and
/// every BootFs read and change refuses it too (no hang, no fatfs loop).
#[test]
fn hostile_volumes_are_refused() {
    type Craft = fn(&mut Vec<u8>);
    let cases: Vec<(&str, Kind, Craft, &str)> = vec![
        (
            "a directory chain that loops",
            Kind::Fat16,
            |v| {
                let c = found(v, "loader/entries").first_cluster;
                set_fat(v, c, c);
            },
            "cross-linked",
        ),
        (
            "a subdirectory pointing back to its parent",
            Kind::Fat16,
            |v| {
                let parent = found(v, "loader").first_cluster;
                let e = found(v, "loader/entries").short;
                set_first_cluster(v, e, parent);
            },
            "cross-linked",
        ),
        (
            "a subdirectory at cluster 0",
            Kind::Fat32,
            |v| {
                let e = found(v, "loader/entries").short;
                set_first_cluster(v, e, 0);
            },
            "outside the volume",
        ),
        (
            "two files sharing clusters",
            Kind::Fat16,
            |v| {
                let a = found(v, "A/vmlinuz").first_cluster;
                let e = found(v, "A/initramfs").short;
                set_first_cluster(v, e, a);
            },
            "cross-linked",
        ),
        (
            "a file chain that loops",
            Kind::Fat32,
            |v| {
                let c = found(v, "A/vmlinuz").first_cluster;
                set_fat(v, c + 3, c);
            },
            "cross-linked",
        ),
        (
            "a root directory that loops (FAT32)",
            Kind::Fat32,
            |v| {
                let r = geom(v).root_cluster;
                set_fat(v, r, r);
            },
            "cross-linked",
        ),
        (
            "a file larger than its chain",
            Kind::Fat16,
            |v| {
                let e = found(v, "A/vmlinuz").short as usize;
                v[e + 28..e + 32].copy_from_slice(&10_000_000u32.to_le_bytes());
            },
            "its clusters hold",
        ),
        (
            "a chain into a free cluster",
            Kind::Fat16,
            |v| {
                let c = found(v, "A/vmlinuz").first_cluster;
                set_fat(v, c, 0);
            },
            "chain breaks",
        ),
        (
            "a volume larger than its partition",
            Kind::Fat16,
            |v| {
                v[19..21].copy_from_slice(&0u16.to_le_bytes());
                v[32..36].copy_from_slice(&u32::MAX.to_le_bytes());
            },
            "its partition has",
        ),
        (
            "FAT32 using FAT 1 with mirroring off",
            Kind::Fat32,
            |v| v[40..42].copy_from_slice(&0x0081u16.to_le_bytes()),
            "mirroring off",
        ),
        (
            "a `..` entry in the root",
            Kind::Fat16,
            |v| {
                let s = found(v, "loader").short as usize;
                v[s..s + 11].copy_from_slice(DOTDOT);
            },
            "the root directory has a `..` entry",
        ),
        (
            "a long name on `..`",
            Kind::Fat32,
            |v| {
                let dotdot = dotdot_of(v, "A");
                v[dotdot - ENTRY..dotdot].copy_from_slice(&long_name("loader", DOTDOT));
            },
            "carries the long name",
        ),
        (
            "cross-linked files behind an end mark (fatfs's next entry revives them)",
            Kind::Fat32,
            |v| {
                let kernel = found(v, "A/vmlinuz").first_cluster;
                // B becomes a one-byte file on the kernel's clusters.
                let b = found(v, "B").short;
                set_first_cluster(v, b, kernel);
                v[b as usize + 11] = 0x20;
                v[b as usize + 28..b as usize + 32].copy_from_slice(&1u32.to_le_bytes());
                let loader = found(v, "loader");
                let first = *loader.long.iter().min().unwrap_or(&loader.short);
                v[first as usize] = 0x00;
            },
            "cross-linked",
        ),
        (
            "zero bytes per sector",
            Kind::Fat16,
            |v| v[11..13].copy_from_slice(&0u16.to_le_bytes()),
            "not a FAT boot sector",
        ),
    ];
    for (what, kind, craft, want) in cases {
        let mut v = volume(kind);
        craft(&mut v);
        let e = format!("{:#}", scan_of(&v).unwrap_err());
        assert!(e.contains(want), "{what}: {e}");
        let v2 = v.clone();
        let errors = bounded(what, move || {
            let mut fs = BootFs::new(Cursor::new(v2), 0);
            [
                fs.list("loader/entries").map(|_| ()),
                fs.list_all().map(|_| ()),
                fs.hash("A/vmlinuz").map(|_| ()),
                fs.create("B/x", &mut &b"x"[..], 1),
                fs.remove("A/vmlinuz").map(|_| ()),
                fs.reclaim().map(|_| ()),
            ]
            .into_iter()
            .map(|r| r.map_err(|e| format!("{e:#}")))
            .collect::<Vec<_>>()
        });
        for r in errors {
            let e = r.expect_err(what);
            assert!(
                e.contains("BOOT's FAT filesystem is damaged"),
                "{what}: {e}"
            );
        }
        // Nothing was written.
        let mut dev: Dev = Cursor::new(v.clone());
        let _ = BootFs::new(&mut dev, 0).create("B/y", &mut &b"y"[..], 1);
        assert!(
            dev.into_inner() == v,
            "{what}: a refused volume was changed"
        );
    }
}

/// A long-name entry (a single, last one) giving `name` to the short entry
/// `short`.
fn long_name(name: &str, short: &[u8; 11]) -> [u8; 32] {
    let mut e = [0u8; 32];
    e[0] = 0x41;
    e[11] = ATTR_LFN;
    e[13] = short
        .iter()
        .fold(0u8, |s, b| s.rotate_right(1).wrapping_add(*b));
    let mut units: Vec<u16> = name.encode_utf16().collect();
    units.push(0);
    units.resize(13, 0xFFFF);
    let slots = (1..11)
        .step_by(2)
        .chain((14..26).step_by(2))
        .chain((28..32).step_by(2));
    for (at, u) in slots.zip(units) {
        e[at..at + 2].copy_from_slice(&u.to_le_bytes());
    }
    e
}

/// Offset of directory `dir`'s `..` entry (its second).
fn dotdot_of(v: &[u8], dir: &str) -> usize {
    let g = geom(v);
    let at = g.cluster_offset(found(v, dir).first_cluster) as usize + ENTRY;
    assert_eq!(&v[at..at + 11], DOTDOT);
    at
}

/// `..` names the parent, and fatfs follows it when a path goes through
/// it (an entry's `linux /A/../vmlinuz`): a `..` pointing to a chain the
/// scan never walked (here a lost cluster that loops, full of names) is
/// refused, or at least not followed for ever. (fuzz: the fat target.)
#[test]
fn dotdot_to_an_unscanned_chain_is_not_followed() {
    for kind in [Kind::Fat16, Kind::Fat32] {
        let mut fs = BootFs::new(Cursor::new(volume(kind)), 0);
        let entry = b"title x\nlinux /A/../vmlinuz\n";
        fs.create(
            "loader/entries/g00000001-slot-a.conf",
            &mut &entry[..],
            entry.len() as u64,
        )
        .unwrap();
        let mut v = fs.into_inner().into_inner();
        let g = geom(&v);
        let x = g.clusters + 1; // the last cluster: free
        let at = g.cluster_offset(x) as usize;
        for e in v[at..at + g.cluster_size as usize].chunks_mut(ENTRY) {
            e[..11].copy_from_slice(b"JUNK       ");
            e[11] = 0x20;
        }
        set_fat(&mut v, x, x);
        let dotdot = dotdot_of(&v, "A");
        set_first_cluster(&mut v, dotdot as u64, x);
        let w = v.clone();
        let r = bounded("entry_files through a looping `..`", move || {
            crate::ops::entry_files(&mut BootFs::new(Cursor::new(w), 0))
                .map(|_| ())
                .map_err(|e| format!("{e:#}"))
        });
        let e = r.expect_err("a `..` elsewhere than the parent is refused");
        assert!(e.contains("not to the parent directory"), "{e}");
        bounded("exists through a looping `..`", move || {
            let _ = BootFs::new(Cursor::new(v), 0).exists("A/../vmlinuz");
        });
    }
}

/// fatfs names an entry by its long name: a long name on `.` or `..`
/// (which the scan skips by their short names) must not make list_all walk
/// into the directory or its parent again, for ever. (fuzz: the fat target.)
#[test]
fn a_long_name_on_a_dot_entry_is_not_walked() {
    for kind in [Kind::Fat16, Kind::Fat32] {
        for (slot, short) in [(1usize, DOT), (0, DOTDOT)] {
            let mut v = volume(kind);
            // The entry before `short` becomes its long name; for `.`,
            // that moves `.` one slot down over `..`.
            let dotdot = dotdot_of(&v, "A");
            let dot = dotdot - ENTRY;
            if slot == 1 {
                v.copy_within(dot..dot + ENTRY, dotdot);
            }
            v[dot..dot + ENTRY].copy_from_slice(&long_name("zz", short));
            let paths = bounded("list_all with a long-named dot entry", move || {
                BootFs::new(Cursor::new(v), 0)
                    .list_all()
                    .map_err(|e| e.to_string())
            });
            if let Ok(paths) = paths {
                assert!(
                    paths.iter().all(|p| !p.contains("zz/")),
                    "{kind:?}: {paths:?}"
                );
            }
        }
    }
}

/// An entry naming a path through `..` does not boot (shown as such), on a
/// volume that holds together, and BootFs refuses such paths.
#[test]
fn an_entry_through_dotdot_is_not_bootable() {
    let mut fs = BootFs::new(Cursor::new(volume(Kind::Fat16)), 0);
    let entry = b"title x\nlinux /A/../A/vmlinuz\n";
    fs.create(
        "loader/entries/g00000001-slot-a.conf",
        &mut &entry[..],
        entry.len() as u64,
    )
    .unwrap();
    let files = crate::ops::entry_files(&mut fs).unwrap();
    assert_eq!(files.len(), 1);
    let p = files[0].problem.as_deref().unwrap();
    assert!(p.contains("not a path on BOOT"), "{p}");
    for path in ["A/../A/vmlinuz", "./A/vmlinuz", "A//vmlinuz", ""] {
        let e = format!("{:#}", fs.exists(path).unwrap_err());
        assert!(e.contains("not a path on BOOT"), "{path}: {e}");
    }
}

/// A directory as fatfs's create_dir leaves it before `fix_dot_entries`
/// (long names on `.` and `..`, `..` naming the FAT32 root's cluster), as a
/// cut between the two leaves it, scans.
#[test]
fn a_directory_cut_before_its_repair_scans() {
    for kind in [Kind::Fat16, Kind::Fat32] {
        let mut dev = Cursor::new(volume(kind));
        {
            let fs = fatfs::FileSystem::new(&mut dev, fatfs::FsOptions::new()).unwrap();
            fs.root_dir().create_dir("new").unwrap();
            fs.root_dir().create_dir("new/deeper").unwrap();
            fs.unmount().unwrap();
        }
        let v = dev.into_inner();
        let s = scan_of(&v).unwrap_or_else(|e| panic!("{kind:?}: {e:#}"));
        assert_eq!(s.dirs, 6, "{kind:?}");
    }
}
