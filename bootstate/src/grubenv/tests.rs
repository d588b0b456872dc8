//! GRUB's files on real FAT volumes made by `fatformat`: rewritten in
//! place, read by fsck.fat and mtools, cut at every write.

use super::*;
use crate::device::Faulty;
use crate::fatformat::{FatFile, FatParams, format_fat};
use crate::fatscan::geometry;
use crate::testutil::{fsck, output, tool};
use contract::meta::SlotStatus;
use contract::state::Pending;
use std::io::{Cursor, SeekFrom, Write};
use std::process::Command;

type Dev = Cursor<Vec<u8>>;

/// A BOOT volume with GRUB's files for `good` and `env` (and a file
/// before them, so that they do not start at the first cluster).
fn volume(sector: u64, good: Slot, env: GrubEnv) -> Dev {
    volume_of(sector, false, good, env)
}

fn volume_of(sector: u64, fat32: bool, good: Slot, env: GrubEnv) -> Dev {
    let len = if sector == 512 { 40 << 20 } else { 300 << 20 };
    let mut dev = Cursor::new(vec![0u8; len]);
    let files = vec![
        FatFile::dir("loader/entries"),
        FatFile::bytes("A/vmlinuz-0123456789abcdef", vec![1u8; 5000]),
        FatFile::dir("B"),
        FatFile::bytes(BOOT_GRUB_CFG, grubcfg::render(good)),
        FatFile::bytes(BOOT_GRUB_ENV, env.render().unwrap()),
    ];
    let p = FatParams {
        label: "BOOT".into(),
        volume_id: 0x1234_5678,
        sector_size: sector,
        fat32,
        epoch: 1_700_000_000,
    };
    format_fat(&mut dev, &p, &files).unwrap();
    dev
}

/// The short directory entry of `path` and its clusters.
fn placement(dev: &mut Dev, path: &str) -> (Vec<u8>, Vec<(u64, u64)>) {
    let g = geometry(dev).unwrap();
    let f = crate::fatfix::find(dev, &g, path).unwrap().unwrap();
    let mut entry = vec![0u8; 32];
    dev.seek(SeekFrom::Start(f.short)).unwrap();
    dev.read_exact(&mut entry).unwrap();
    (entry, g.chain(dev, f.first_cluster).unwrap())
}

fn fsck_clean(v: &[u8]) {
    // Its version line and its summary, nothing else.
    let text = fsck(v);
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines.len() == 2 && lines[1].contains(" files, "),
        "fsck.fat -n: {text}"
    );
}

/// mtools reads the file, as it is now.
fn mtype(v: &[u8], path: &str) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("boot.img");
    std::fs::write(&img, v).unwrap();
    let listing = output(
        Command::new(tool("mdir"))
            .arg("-i")
            .arg(&img)
            .arg(format!("::/{BOOT_GRUB_ENV_DIR}")),
        "mdir",
    );
    assert!(
        listing.contains("grubenv") && listing.contains("1024"),
        "{listing}"
    );
    let out = Command::new(tool("mtype"))
        .arg("-i")
        .arg(&img)
        .arg(format!("::/{path}"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

#[test]
fn overwrite_in_place_keeps_the_clusters_and_the_entry() {
    for (sector, fat32) in [(512, false), (512, true), (4096, false), (4096, true)] {
        let mut dev = volume_of(sector, fat32, Slot::A, GrubEnv::none());
        assert_eq!(
            BootFs::new(&mut dev, 0).scan().unwrap().kind,
            if fat32 {
                crate::fatscan::Kind::Fat32
            } else {
                crate::fatscan::Kind::Fat16
            },
            "{sector} {fat32}"
        );
        let before = placement(&mut dev, BOOT_GRUB_ENV);
        let new = GrubEnv::trial(Slot::B, 3).render().unwrap();
        let mut f = Faulty::counting(&mut dev);
        let n = BootFs::new(&mut f, 0)
            .overwrite_in_place(BOOT_GRUB_ENV, &new)
            .unwrap();
        assert_eq!((n, f.writes()), (1, 1), "one sector, one write");
        assert_eq!(f.bytes_written(), 512);
        // Same entry (size, clusters, times), same clusters, new bytes.
        assert_eq!(placement(&mut dev, BOOT_GRUB_ENV), before, "{sector}");
        let mut fs = BootFs::new(&mut dev, 0);
        assert_eq!(fs.read(BOOT_GRUB_ENV, 4096).unwrap(), new);
        // Nothing to change: no write.
        assert_eq!(fs.overwrite_in_place(BOOT_GRUB_ENV, &new).unwrap(), 0);
        // Lengths are never changed; directories and missing files refused.
        let e = fs
            .overwrite_in_place(BOOT_GRUB_ENV, &new[..1000])
            .unwrap_err();
        assert!(format!("{e:#}").contains("never truncated"), "{e:#}");
        let mut longer = new.clone();
        longer.push(b'#');
        assert!(fs.overwrite_in_place(BOOT_GRUB_ENV, &longer).is_err());
        assert!(fs.overwrite_in_place("grub/env", &new).is_err());
        assert!(fs.overwrite_in_place("grub/nothing", &new).is_err());
        assert!(fs.overwrite_in_place("grub/../x", &new).is_err());
        let v = dev.into_inner();
        fsck_clean(&v);
        assert_eq!(mtype(&v, BOOT_GRUB_ENV), new);
    }
}

/// grub-editenv (grub-common, which scripts/setup.sh installs) reads the
/// block we write, and we read what it writes.
#[test]
fn grub_editenv_reads_our_block() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("grubenv");
    std::fs::write(&p, GrubEnv::trial(Slot::B, 2).render().unwrap()).unwrap();
    // `list` only reads (grub-editenv's `set` would write a new file: never
    // on BOOT).
    let text = output(
        Command::new(crate::testutil::tool("grub-editenv"))
            .arg(&p)
            .arg("list"),
        "grub-editenv",
    );
    assert_eq!(text, "trial_slot=B\ntrial_tries=2\n");
    // And what GRUB's writer makes of it, we read (a copy, not BOOT).
    output(
        Command::new(crate::testutil::tool("grub-editenv"))
            .arg(&p)
            .args(["set", "trial_tries=1", "other=a\\b"]),
        "grub-editenv set",
    );
    let b = std::fs::read(&p).unwrap();
    assert_eq!(b.len(), 1024);
    assert_eq!(GrubEnv::read(&b), Ok(GrubEnv::trial(Slot::B, 1)));
    assert_eq!(GrubEnv::read_exact(&b), None, "another variable: not ours");
}

fn state(default: Slot, pending: Option<Slot>) -> BootState {
    let mut s = BootState {
        default,
        slots: [None, None],
        pending: None,
        history: Vec::new(),
        security_floor: 0,
    };
    s.set(Slot::A, SlotStatus::Good, "1");
    s.set(Slot::B, SlotStatus::Good, "2");
    if let Some(to) = pending {
        s.set(to, SlotStatus::Pending, "3");
        s.default = to;
        s.pending = Some(Pending {
            from: to.other(),
            to,
            from_version: "1".into(),
            to_version: "3".into(),
        });
    }
    s
}

/// Every change the operations make: (name, rendering before, new state,
/// tries, rendering after).
fn transitions() -> Vec<(&'static str, Rendering, BootState, Tries, Rendering)> {
    let r = |good, env| Rendering { good, env };
    let none = GrubEnv::none();
    vec![
        (
            "upgrade switch",
            r(Slot::A, none),
            state(Slot::B, Some(Slot::B)),
            Tries::Arm(3),
            r(Slot::A, GrubEnv::trial(Slot::B, 3)),
        ),
        (
            "upgrade replacing a trial: disarm first",
            r(Slot::A, GrubEnv::trial(Slot::B, 2)),
            state(Slot::B, Some(Slot::B)),
            Tries::Disarm,
            r(Slot::A, none),
        ),
        (
            "blessing with tries left",
            r(Slot::A, GrubEnv::trial(Slot::B, 2)),
            state(Slot::B, None),
            Tries::Keep,
            r(Slot::B, none),
        ),
        (
            "blessing on the last try",
            r(Slot::A, GrubEnv::trial(Slot::B, 0)),
            state(Slot::B, None),
            Tries::Keep,
            r(Slot::B, none),
        ),
        (
            "rollback of a steady disk",
            r(Slot::A, none),
            state(Slot::B, None),
            Tries::Keep,
            r(Slot::B, none),
        ),
        (
            "rollback of a trial",
            r(Slot::A, GrubEnv::trial(Slot::B, 3)),
            state(Slot::A, None),
            Tries::Keep,
            r(Slot::A, none),
        ),
        (
            "recorded fallback",
            r(Slot::A, GrubEnv::trial(Slot::B, 0)),
            state(Slot::A, None),
            Tries::Keep,
            r(Slot::A, none),
        ),
        (
            "upgrade switch moving a stale good slot",
            r(Slot::B, none),
            state(Slot::B, Some(Slot::B)),
            Tries::Arm(3),
            r(Slot::A, GrubEnv::trial(Slot::B, 3)),
        ),
        (
            "nothing to do",
            r(Slot::B, GrubEnv::trial(Slot::A, 1)),
            state(Slot::A, Some(Slot::A)),
            Tries::Keep,
            r(Slot::B, GrubEnv::trial(Slot::A, 1)),
        ),
    ]
}

/// A cut before each write of every change leaves GRUB booting the slot it
/// booted before or the one it boots after; the volume scans and fsck.fat
/// finds nothing; once done, the files say the new state.
#[test]
fn a_cut_sync_boots_the_old_or_the_new_slot() {
    crate::device::each_loss(|_| a_cut_sync_boots_the_old_or_the_new_slot_under_loss());
}

fn a_cut_sync_boots_the_old_or_the_new_slot_under_loss() {
    for (name, before, new, tries, after) in transitions() {
        let image = volume(512, before.good, before.env).into_inner();
        let old = grubcfg::choice(Some(before.good), before.env);
        let want = grubcfg::choice(Some(after.good), after.env);
        let mut done_at = None;
        for n in 1..=4u64 {
            let mut f = Faulty::failing_at(Cursor::new(image.clone()), n);
            let res = sync(&mut BootFs::new(&mut f, 0), &new, tries);
            let mut v = f.into_inner();
            let view = read(&mut BootFs::new(&mut v, 0)).unwrap();
            let booted = view.choice();
            assert!(
                booted == old || booted == want,
                "{name}: cut at write {n}: GRUB boots {booted}, neither {old} nor {want}"
            );
            assert!(view.exact, "{name}: cut at write {n}: the block is ours");
            BootFs::new(&mut v, 0).scan().unwrap();
            if let Ok(s) = res {
                assert_eq!(s.rendering, after, "{name}");
                assert!(view.shows(&after), "{name}: {view:?}");
                assert!(s.writes <= 2);
                done_at.get_or_insert((n, s.writes));
                fsck_clean(v.get_ref());
            }
        }
        let (n, writes) = done_at.unwrap_or_else(|| panic!("{name}: never finished"));
        assert_eq!(n, writes as u64 + 1, "{name}: finished after its writes");
    }
}

/// GRUB's own save_env (emulated: the whole block rewritten through the
/// file's clusters, as grub-core/commands/loadenv.c does) counts down, and
/// the runtime reads the count back.
#[test]
fn grub_counts_and_the_runtime_reads_it() {
    let mut dev = volume(512, Slot::A, GrubEnv::trial(Slot::B, 3));
    let mut booted = Vec::new();
    for _ in 0..5 {
        let mut fs = BootFs::new(&mut dev, 0);
        let view = read(&mut fs).unwrap();
        let b = grubcfg::next_boot(view.good, view.env);
        if let Some(saved) = b.saved {
            fs.overwrite_in_place(BOOT_GRUB_ENV, &saved.render().unwrap())
                .unwrap();
        }
        booted.push((b.slot, b.trial));
    }
    use Slot::{A, B};
    assert_eq!(
        booted,
        [(B, true), (B, true), (B, true), (A, false), (A, false)]
    );
    let view = read(&mut BootFs::new(&mut dev, 0)).unwrap();
    assert_eq!(view.env, GrubEnv::trial(B, 0));
    fsck_clean(dev.get_ref());
}

#[test]
fn install_creates_the_files_once() {
    let mut dev = Cursor::new(vec![0u8; 40 << 20]);
    fatfs::format_volume(&mut dev, fatfs::FormatVolumeOptions::new()).unwrap();
    let mut fs = BootFs::new(&mut dev, 0);
    assert_eq!(
        read(&mut fs).unwrap(),
        View {
            good: None,
            env: GrubEnv::none(),
            exact: false
        }
    );
    assert!(sync(&mut fs, &state(Slot::A, None), Tries::Keep).is_err());
    install(&mut fs, Slot::B).unwrap();
    let view = read(&mut fs).unwrap();
    assert_eq!(
        (view.good, view.env, view.exact),
        (Some(Slot::B), GrubEnv::none(), true)
    );
    assert_eq!(fs.list(BOOT_GRUB_ENV_DIR).unwrap().len(), 1);
    // Again: nothing changes (the good slot is sync's business).
    install(&mut fs, Slot::A).unwrap();
    assert_eq!(read(&mut fs).unwrap().good, Some(Slot::B));
    let s = sync(&mut fs, &state(Slot::A, None), Tries::Keep).unwrap();
    assert_eq!(s.writes, 1);
    assert_eq!(read(&mut fs).unwrap().good, Some(Slot::A));
    fsck_clean(dev.get_ref());
    // A grub.cfg that is not ours is not rewritten.
    let mut fs = BootFs::new(&mut dev, 0);
    let mut cfg = fs.read(BOOT_GRUB_CFG, 1 << 20).unwrap();
    cfg[0] = b'x';
    fs.overwrite_in_place(BOOT_GRUB_CFG, &cfg).unwrap();
    let e = sync(&mut fs, &state(Slot::B, None), Tries::Keep).unwrap_err();
    assert!(
        format!("{e:#}").contains("not written by this version"),
        "{e:#}"
    );
    let _ = dev.flush();
}
