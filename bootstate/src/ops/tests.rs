//! The slot operations on a BOOT and a META in memory, cut at their writes.

use super::*;
use crate::device::Faulty;
use contract::grubcfg;
use contract::meta::{AREA_LEN, SlotRecord, Tag};
use sha2::{Digest, Sha256};
use std::io::Cursor;

type Dev = Cursor<Vec<u8>>;

/// An upgrade of copies of `b0` and `m0` to `to` (3 tries), its power cut
/// before write `fail_at` (none: counted to the end): whether it finished,
/// how many writes it made, and the disks it left.
fn cut_upgrade(b0: &Dev, m0: &Dev, to: &Payload, fail_at: Option<u64>) -> (bool, u64, Dev, Dev) {
    let mut b = match fail_at {
        Some(n) => Faulty::failing_at(b0.clone(), n),
        None => Faulty::counting(b0.clone()),
    };
    let mut m = b.share(m0.clone());
    let r = upgrade(&mut BootFs::new(&mut b, 0), &mut m, to, 3);
    (r.is_ok(), b.writes(), b.into_inner(), m.into_inner())
}

/// Slot B's three tries run out under the firmware, slot A boots, and the
/// runtime finds it fell back.
fn falls_back(boot: &mut BootFs<&mut Dev>, m: &mut Dev) {
    for _ in 0..3 {
        assert_eq!(firmware_tries(boot), Slot::B);
    }
    assert_eq!(firmware_tries(boot), Slot::A);
    assert!(matches!(
        assess(boot, m, Slot::A).unwrap(),
        BootOutcome::FellBack { .. }
    ));
}

/// A BOOT filesystem with slot A installed (version 1) and its META.
fn disk(boot_mib: usize) -> (Dev, Dev) {
    let mut dev = Cursor::new(vec![0u8; boot_mib << 20]);
    fatfs::format_volume(&mut dev, fatfs::FormatVolumeOptions::new()).unwrap();
    let mut boot = BootFs::new(dev, 0);
    for d in ["loader", "loader/entries", "A", "B"] {
        boot.ensure_dir(d).unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let p = payload(dir.path(), "1", 1000);
    let e = p.entry(Slot::A);
    for (path, f) in [(&e.linux, &p.kernel), (&e.initrd, &p.initramfs)] {
        boot.create(path, &mut File::open(&f.path).unwrap(), f.len)
            .unwrap();
    }
    let text = e.render();
    boot.create(
        &EntryName::good(1, Slot::A).path(),
        &mut text.as_bytes(),
        text.len() as u64,
    )
    .unwrap();
    let mut meta = Meta::default();
    meta.set(Tag::DefaultSlot, "A");
    meta.set(
        Tag::SlotA,
        SlotRecord {
            status: SlotStatus::Good,
            version: "1".into(),
            security: 0,
        }
        .render(),
    );
    let mut m = Cursor::new(vec![0u8; AREA_LEN]);
    meta::write(&mut m, &meta).unwrap();
    (boot.into_inner(), m)
}

fn payload(dir: &std::path::Path, version: &str, size: usize) -> Payload {
    let file = |name: &str, seed: u8| {
        let data: Vec<u8> = (0..size)
            .map(|i| {
                (i as u8)
                    .wrapping_mul(seed)
                    .wrapping_add(version.len() as u8)
            })
            .chain(version.bytes())
            .collect();
        let path = dir.join(format!("{name}-{version}"));
        std::fs::write(&path, &data).unwrap();
        PayloadFile {
            path,
            sha256: crate::fat::hex(&Sha256::digest(&data)),
            len: data.len() as u64,
        }
    };
    Payload {
        version: version.into(),
        security_version: 0,
        title: "Test".into(),
        cmdline: "console=ttyS0".into(),
        kernel: file("kernel", 7),
        initramfs: file("initramfs", 13),
        ukis: None,
        secure_boot: None,
        next_root: None,
        secure_boot_updates: None,
    }
}

/// A payload whose slots boot from UKIs (made of `size` bytes, one per slot).
fn uki_payload(dir: &std::path::Path, version: &str, size: usize) -> Payload {
    let mut p = payload(dir, version, size);
    let file = |slot: Slot| {
        let data: Vec<u8> = format!("MZ uki of {version} for slot {slot}")
            .bytes()
            .chain((0..size).map(|i| (i % 251) as u8))
            .collect();
        let path = dir.join(format!("uki-{slot}-{version}"));
        std::fs::write(&path, &data).unwrap();
        PayloadFile {
            path,
            sha256: crate::fat::hex(&Sha256::digest(&data)),
            len: data.len() as u64,
        }
    };
    p.ukis = Some(SlotUkis {
        a: file(Slot::A),
        b: file(Slot::B),
    });
    p
}

/// A BOOT with slot A installed from UKIs (version 1: its UKI is the
/// entry, `EFI/Linux/g00000001-slot-a.efi`) and its META; and that payload.
fn uki_disk(boot_mib: usize, dir: &std::path::Path) -> (Dev, Dev, Payload) {
    let (b, m) = disk(boot_mib);
    let mut boot = BootFs::new(b, 0);
    // Start from a BOOT without the `.conf` install.
    let e = payload(dir, "1", 1000).entry(Slot::A);
    for f in [
        e.linux.as_str(),
        e.initrd.as_str(),
        &EntryName::good(1, Slot::A).path(),
    ] {
        boot.remove(f).unwrap();
    }
    let p = uki_payload(dir, "1", 30_000);
    boot.ensure_dir("EFI").unwrap();
    boot.ensure_dir("EFI/Linux").unwrap();
    let a = &p.ukis.as_ref().unwrap().a;
    let name = EntryName::good(1, Slot::A).of_kind(EntryKind::Uki);
    boot.create(&name.path(), &mut File::open(&a.path).unwrap(), a.len)
        .unwrap();
    (boot.into_inner(), m, p)
}

/// The slot that boots, checked to boot the UKI of `versions[slot]` made
/// for that slot (a UKI's command line names its slot).
fn boots_uki(boot: &mut BootFs<&mut Dev>, v1: &Payload, v2: &Payload, n: u64) -> Slot {
    let slot = firmware_tries(boot);
    let best = best_entry(&entries(boot), slot).unwrap();
    assert_eq!(best.kind, EntryKind::Uki, "cut {n}");
    let (sha, _) = boot.hash(&best.path()).unwrap();
    let of = |p: &Payload| p.ukis.as_ref().unwrap().for_slot(slot).sha256.clone();
    assert!(
        sha == of(v1) || sha == of(v2),
        "cut {n}: slot {slot} boots an unknown UKI"
    );
    slot
}

/// What systemd-boot does: picks the first valid entry (its kernel
/// exists) and, if it counts, renames it before starting it.
fn firmware_tries(boot: &mut BootFs<&mut Dev>) -> Slot {
    let entries = entries(boot);
    let first = boot_order(&entries)[0];
    if let Some(t) = first.tries
        && t.left > 0
    {
        let mut next = first;
        next.tries = Some(contract::boot::Tries {
            left: t.left - 1,
            done: t.done + 1,
        });
        let text = boot.read(&first.path(), UKI_LIMIT).unwrap();
        boot.remove(&first.path()).unwrap();
        boot.create(&next.path(), &mut &text[..], text.len() as u64)
            .unwrap();
    }
    first.slot
}

fn entries(boot: &mut BootFs<&mut Dev>) -> Vec<EntryName> {
    let (valid, _) = read_entries(boot).unwrap();
    valid
}

/// Security versions: an upgrade records its payload's; the floor rises
/// when the slot is blessed, not before (a failed upgrade still falls back
/// to a lower one); a manual rollback below it needs `allow_downgrade`.
#[test]
fn the_security_floor_rises_at_the_blessing_and_holds_rollbacks() {
    let dir = tempfile::tempdir().unwrap();
    let (mut b, mut m) = disk(40);
    let mut boot = BootFs::new(&mut b, 0);
    let v2 = Payload {
        security_version: 2,
        ..payload(dir.path(), "2", 100_000)
    };
    upgrade(&mut boot, &mut m, &v2, 3).unwrap();
    let st = status(&mut boot, &mut m).unwrap();
    assert_eq!(st.state.security(Slot::B), 2);
    assert_eq!(st.state.security_floor, 0, "raised before the blessing");
    bless(&mut boot, &mut m, Slot::B, "2").unwrap();
    assert_eq!(status(&mut boot, &mut m).unwrap().state.security_floor, 2);
    let before = m.get_ref().clone();
    let e = format!(
        "{:#}",
        rollback(&mut boot, &mut m, false, false).unwrap_err()
    );
    assert!(
        e.contains("slot A (1): its security version 0 is lower than 2")
            && e.contains("--allow-downgrade"),
        "{e}"
    );
    assert_eq!(m.get_ref(), &before, "a refused rollback wrote META");
    // An admin's downgrade, this once: the floor stays where it was.
    let r = rollback(&mut boot, &mut m, false, true).unwrap();
    assert_eq!(r.to, Slot::A);
    assert_eq!(status(&mut boot, &mut m).unwrap().state.security_floor, 2);
    // v3 (security 3) fails its trial: A (security 0, below the floor)
    // boots again, as any fallback does, and the floor stays.
    let v3 = Payload {
        security_version: 3,
        ..payload(dir.path(), "3", 100_000)
    };
    upgrade(&mut boot, &mut m, &v3, 1).unwrap();
    assert_eq!(firmware_tries(&mut boot), Slot::B);
    assert_eq!(firmware_tries(&mut boot), Slot::A, "tries ran out");
    assert!(matches!(
        assess(&mut boot, &mut m, Slot::A).unwrap(),
        BootOutcome::FellBack { .. }
    ));
    assert_eq!(status(&mut boot, &mut m).unwrap().state.security_floor, 2);
}

#[test]
fn upgrade_bless_fail_and_rollback() {
    let dir = tempfile::tempdir().unwrap();
    let (mut b, mut m) = disk(40);
    let mut boot = BootFs::new(&mut b, 0);
    let v2 = payload(dir.path(), "2", 300_000);
    let up = upgrade(&mut boot, &mut m, &v2, 3).unwrap();
    assert_eq!((up.from, up.to), (Slot::A, Slot::B));
    assert_eq!(up.entry.file_name(), "g00000002-slot-b+3-0.conf");
    let st = status(&mut boot, &mut m).unwrap();
    assert_eq!(st.state.default, Slot::B);
    assert_eq!(st.state.status(Slot::B), SlotStatus::Pending);
    assert!(st.state.history[0].contains("upgrade-started from=A to=B"));
    // The firmware tries B; the runtime blesses it.
    assert_eq!(firmware_tries(&mut boot), Slot::B);
    assert_eq!(
        assess(&mut boot, &mut m, Slot::B).unwrap(),
        BootOutcome::Trial
    );
    let blessed = bless(&mut boot, &mut m, Slot::B, "2").unwrap();
    assert_eq!(blessed.from_version.as_deref(), Some("1"));
    assert_eq!(
        entries(&mut boot),
        [EntryName::good(1, Slot::A), EntryName::good(2, Slot::B)]
    );
    assert_eq!(firmware_tries(&mut boot), Slot::B);
    assert_eq!(
        assess(&mut boot, &mut m, Slot::B).unwrap(),
        BootOutcome::Steady
    );

    // v3 never reaches ready: three tries, then A... no: then B (v2).
    let v3 = payload(dir.path(), "3", 200_000);
    let up = upgrade(&mut boot, &mut m, &v3, 3).unwrap();
    assert_eq!((up.from, up.to), (Slot::B, Slot::A));
    // A's v1 files are gone, v3's are there.
    let a_files: Vec<String> = boot
        .list("A")
        .unwrap()
        .into_iter()
        .map(|f| f.name)
        .collect();
    assert_eq!(a_files.len(), 2);
    assert!(
        a_files
            .iter()
            .all(|f| f.contains(&v3.kernel.sha256[..16]) || f.contains(&v3.initramfs.sha256[..16]))
    );
    for _ in 0..3 {
        assert_eq!(firmware_tries(&mut boot), Slot::A);
    }
    assert_eq!(firmware_tries(&mut boot), Slot::B, "tries ran out");
    let out = assess(&mut boot, &mut m, Slot::B).unwrap();
    assert_eq!(
        out,
        BootOutcome::FellBack {
            failed: Slot::A,
            version: "3".into(),
            reason: FallbackReason::TriesExhausted { tries: 3 }
        }
    );
    let st = status(&mut boot, &mut m).unwrap();
    assert_eq!(st.state.default, Slot::B);
    assert_eq!(st.state.status(Slot::A), SlotStatus::Bad);
    assert!(st.state.pending.is_none());
    assert!(
        st.state
            .history
            .last()
            .unwrap()
            .contains("upgrade-failed slot=A version=3")
    );

    // Rolling back to a bad slot needs force, and then it is on trial.
    let e = format!(
        "{:#}",
        rollback(&mut boot, &mut m, false, false).unwrap_err()
    );
    assert!(e.contains("marked bad") && e.contains("--force"), "{e}");
    let r = rollback(&mut boot, &mut m, true, false).unwrap();
    assert_eq!((r.from, r.to), (Slot::B, Slot::A));
    assert_eq!(r.entry.file_name(), "g00000004-slot-a+3-0.conf");
    assert_eq!(firmware_tries(&mut boot), Slot::A);

    // v4 replaces the trial of A (target stays A, fallback B).
    let v4 = payload(dir.path(), "4", 100_000);
    let up = upgrade(&mut boot, &mut m, &v4, 2).unwrap();
    assert_eq!((up.from, up.to), (Slot::B, Slot::A));
    assert_eq!(firmware_tries(&mut boot), Slot::A);
    bless(&mut boot, &mut m, Slot::A, "4").unwrap();
    // A manual rollback to the good B: no counting.
    let r = rollback(&mut boot, &mut m, false, false).unwrap();
    assert_eq!(r.entry, EntryName::good(6, Slot::B));
    assert_eq!(firmware_tries(&mut boot), Slot::B);
    assert_eq!(
        assess(&mut boot, &mut m, Slot::B).unwrap(),
        BootOutcome::Steady
    );
    assert_eq!(
        entries(&mut boot),
        [EntryName::good(5, Slot::A), EntryName::good(6, Slot::B)]
    );
}

#[test]
fn no_room_is_refused_before_any_write() {
    let dir = tempfile::tempdir().unwrap();
    let (b, m) = disk(8);
    let before = (b.get_ref().clone(), m.get_ref().clone());
    let mut b = Faulty::counting(b);
    let mut m = Faulty::counting(m);
    let big = payload(dir.path(), "2", 6 << 20);
    let e = format!(
        "{:#}",
        upgrade(&mut BootFs::new(&mut b, 0), &mut m, &big, 3).unwrap_err()
    );
    assert!(
        e.contains("BOOT has no room") && e.contains("nothing was written"),
        "{e}"
    );
    assert_eq!((b.writes(), m.writes()), (0, 0));
    assert_eq!(b.into_inner().into_inner(), before.0);
    assert_eq!(m.into_inner().into_inner(), before.1);
}

/// Cut the power before every write of an upgrade in turn: the disk
/// boots A or B (whose files are whole), META reads, and the runtime's
/// assessment leaves a consistent state; the upgrade can then be run
/// again to the end.
#[test]
fn an_upgrade_cut_at_any_write_boots_one_of_the_two() {
    crate::device::each_loss(|_| an_upgrade_cut_at_any_write_boots_one_of_the_two_under_loss());
}

fn an_upgrade_cut_at_any_write_boots_one_of_the_two_under_loss() {
    let dir = tempfile::tempdir().unwrap();
    let (b0, m0) = disk(16);
    let v2 = payload(dir.path(), "2", 20_000);
    let run = |fail_at| cut_upgrade(&b0, &m0, &v2, fail_at);
    let (done, total, ..) = run(None);
    assert!(done && total > 10, "{total} writes");
    let mut saw = [false, false];
    for n in 1..=total + 1 {
        let (done, _, mut bd, mut md) = run(Some(n));
        assert_eq!(done, n > total, "cut {n}");
        let mut boot = BootFs::new(&mut bd, 0);
        let slot = firmware_tries(&mut boot);
        saw[(slot == Slot::B) as usize] = true;
        let best = best_entry(&entries(&mut boot), slot).unwrap();
        let e = entry_of(&mut boot, &best).unwrap();
        let want = if slot == Slot::A { "1" } else { "2" };
        assert_eq!(e.version, want, "cut {n}");
        for f in [&e.linux, &e.initrd] {
            assert!(boot.exists(f).unwrap(), "cut {n}: {f} missing");
        }
        if slot == Slot::B {
            let (sha, _) = boot.hash(&e.linux).unwrap();
            assert_eq!(sha, v2.kernel.sha256, "cut {n}");
        }
        let out = assess(&mut boot, &mut md, slot).unwrap();
        if slot == Slot::B {
            assert_eq!(out, BootOutcome::Trial, "cut {n}");
            bless(&mut boot, &mut md, slot, want).unwrap();
        }
        let st = status(&mut boot, &mut md).unwrap();
        assert_eq!(st.state.default, slot, "cut {n}");
        assert!(st.state.pending.is_none(), "cut {n}");
        // And the upgrade runs again to the end from there.
        if slot == Slot::A {
            let up = upgrade(&mut boot, &mut md, &v2, 3).unwrap();
            assert_eq!(up.to, Slot::B, "cut {n}");
            assert_eq!(firmware_tries(&mut boot), Slot::B, "cut {n}");
        }
    }
    assert_eq!(saw, [true, true]);
}

/// A blessing or a rollback cut at any write: the disk still boots one of
/// the two slots, and running the runtime's steps (or the rollback)
/// again ends in a consistent state.
#[test]
fn bless_and_rollback_cut_at_any_write_recover() {
    crate::device::each_loss(|_| bless_and_rollback_cut_at_any_write_recover_under_loss());
}

fn bless_and_rollback_cut_at_any_write_recover_under_loss() {
    let dir = tempfile::tempdir().unwrap();
    let (mut b0, mut m0) = disk(16);
    let v2 = payload(dir.path(), "2", 20_000);
    upgrade(&mut BootFs::new(&mut b0, 0), &mut m0, &v2, 3).unwrap();
    assert_eq!(firmware_tries(&mut BootFs::new(&mut b0, 0)), Slot::B);
    type Step = dyn Fn(&mut BootFs<&mut Faulty<Dev>>, &mut Faulty<Dev>) -> Result<()>;
    fn count(b0: &Dev, m0: &Dev, f: &Step) -> u64 {
        let mut b = Faulty::counting(b0.clone());
        let mut m = b.share(m0.clone());
        f(&mut BootFs::new(&mut b, 0), &mut m).unwrap();
        b.writes()
    }
    let blessing = |boot: &mut BootFs<&mut Faulty<Dev>>, m: &mut Faulty<Dev>| {
        assess(boot, m, Slot::B)?;
        bless(boot, m, Slot::B, "2").map(|_| ())
    };
    let total = count(&b0, &m0, &blessing);
    for n in 1..=total {
        let mut b = Faulty::failing_at(b0.clone(), n);
        let mut m = b.share(m0.clone());
        assert!(blessing(&mut BootFs::new(&mut b, 0), &mut m).is_err());
        let (mut bd, mut md) = (b.into_inner(), m.into_inner());
        let mut boot = BootFs::new(&mut bd, 0);
        // Tries may run low, but B still boots, and blessing completes.
        let slot = firmware_tries(&mut boot);
        assert_eq!(slot, Slot::B, "cut {n}");
        assess(&mut boot, &mut md, slot).unwrap();
        bless(&mut boot, &mut md, slot, "2").unwrap();
        assert_eq!(
            entries(&mut boot),
            [EntryName::good(1, Slot::A), EntryName::good(2, Slot::B)],
            "cut {n}"
        );
        let st = status(&mut boot, &mut md).unwrap();
        assert_eq!(st.state.status(Slot::B), SlotStatus::Good, "cut {n}");
        assert!(st.state.pending.is_none(), "cut {n}");
    }

    // From the blessed state, a rollback to A cut at any write.
    bless(&mut BootFs::new(&mut b0, 0), &mut m0, Slot::B, "2").unwrap();
    let roll = |boot: &mut BootFs<&mut Faulty<Dev>>, m: &mut Faulty<Dev>| {
        rollback(boot, m, false, false).map(|_| ())
    };
    let total = count(&b0, &m0, &roll);
    let mut saw = [false, false];
    for n in 1..=total {
        let mut b = Faulty::failing_at(b0.clone(), n);
        let mut m = b.share(m0.clone());
        assert!(roll(&mut BootFs::new(&mut b, 0), &mut m).is_err());
        let (mut bd, mut md) = (b.into_inner(), m.into_inner());
        let mut boot = BootFs::new(&mut bd, 0);
        let slot = firmware_tries(&mut boot);
        saw[(slot == Slot::A) as usize] = true;
        let best = best_entry(&entries(&mut boot), slot).unwrap();
        let e = entry_of(&mut boot, &best).unwrap();
        assert_eq!(
            e.version,
            if slot == Slot::A { "1" } else { "2" },
            "cut {n}"
        );
        assess(&mut boot, &mut md, slot).unwrap();
        let st = status(&mut boot, &mut md).unwrap();
        assert_eq!(st.state.default, slot, "cut {n}: META follows what boots");
        // Running the rollback again lands on A whatever the cut.
        if slot == Slot::B {
            rollback(&mut boot, &mut md, false, false).unwrap();
            assert_eq!(firmware_tries(&mut boot), Slot::A, "cut {n}");
        }
    }
    assert_eq!(saw, [true, true]);
}

/// Upgrades cut in the middle of writing the new files, over and over on
/// one disk: each cut leaves clusters no file holds, and each next upgrade
/// frees them before it writes, so BOOT never fills up (without the reclaim
/// these cuts would leak more than BOOT holds); once an upgrade completes,
/// fsck.fat finds no lost cluster.
#[test]
fn repeated_cut_upgrades_do_not_fill_boot() {
    crate::device::each_loss(repeated_cut_upgrades_do_not_fill_boot_under_loss);
}

fn repeated_cut_upgrades_do_not_fill_boot_under_loss(loss: crate::device::Loss) {
    let dir = tempfile::tempdir().unwrap();
    let (mut b, mut m) = disk(16);
    let (free0, cluster) = BootFs::new(&mut b, 0).space().unwrap();
    let rounds = 20;
    let mut leaked = 0u64;
    let mut v2 = payload(dir.path(), "2", 1 << 20);
    for round in 0..rounds {
        // A new version each time (nothing of the last cut is reused), cut
        // somewhere in the middle of its kernel's or initramfs's data.
        v2 = payload(dir.path(), &format!("2.{round}"), 2 << 20);
        let total = {
            let mut bc = Faulty::counting(b.clone());
            let mut mc = bc.share(m.clone());
            upgrade(&mut BootFs::new(&mut bc, 0), &mut mc, &v2, 3).unwrap();
            bc.writes()
        };
        let cut = total * (30 + 2 * round) / 100;
        let mut bf = Faulty::failing_at(b.clone(), cut);
        let mut mf = bf.share(m.clone());
        let r = upgrade(&mut BootFs::new(&mut bf, 0), &mut mf, &v2, 3);
        assert!(r.is_err(), "round {round}: cut at {cut} of {total}");
        b = bf.into_inner();
        m = mf.into_inner();
        let mut fs = BootFs::new(&mut b, 0);
        let lost = fs.scan().unwrap().lost_bytes();
        leaked += lost;
        // Free space stays within what one cut upgrade takes.
        let (free, _) = fs.space().unwrap();
        assert!(
            free + lost + 2 * (v2.kernel.len + v2.initramfs.len) + 8 * cluster >= free0,
            "round {round}: {free} bytes free of {free0}, {lost} lost"
        );
    }
    // That the reclaim is needed shows where every write before the cut
    // landed; a cut that loses unsynced writes loses allocations with them.
    assert!(
        leaked > 16 << 20 || loss != crate::device::Loss::None,
        "the cuts left {leaked} bytes behind in all, more than BOOT holds"
    );
    // A whole upgrade now: it reclaims, installs, and fsck agrees.
    let up = upgrade(&mut BootFs::new(&mut b, 0), &mut m, &v2, 3).unwrap();
    assert_eq!(up.to, Slot::B);
    let mut fs = BootFs::new(&mut b, 0);
    assert!(fs.scan().unwrap().lost.is_empty());
    let text = crate::testutil::fsck(b.get_ref());
    assert!(!text.contains("unused cluster"), "{text}");
    assert!(!text.contains("FATs differ"), "{text}");
}

/// [`disk`] with GRUB's rendering: `grub/grub.cfg` naming A, an empty
/// block, and `A/grub.cfg` from A's entry.
fn disk_with_grub(boot_mib: usize) -> (Dev, Dev) {
    let (mut b, m) = disk(boot_mib);
    let mut boot = BootFs::new(&mut b, 0);
    crate::grubenv::install(&mut boot, Slot::A).unwrap();
    let e = entry_of(&mut boot, &EntryName::good(1, Slot::A)).unwrap();
    let cfg = grubcfg::slot_config(Slot::A, &e).unwrap();
    boot.create(
        &grubcfg::slot_config_path(Slot::A),
        &mut cfg.as_bytes(),
        cfg.len() as u64,
    )
    .unwrap();
    (b, m)
}

/// The slot GRUB boots, given what is on BOOT (without counting).
fn grub_choice(boot: &mut BootFs<&mut Dev>) -> Slot {
    crate::grubenv::read(boot).unwrap().choice()
}

/// GRUB's files of `slot` are there: its `X/grub.cfg` and what it loads.
fn grub_can_boot(boot: &mut BootFs<&mut Dev>, slot: Slot) -> bool {
    let Ok(text) = boot.read(&grubcfg::slot_config_path(slot), 4096) else {
        return false;
    };
    let text = String::from_utf8(text).unwrap();
    text.lines()
        .filter_map(|l| {
            let l = l.trim_start();
            l.strip_prefix("if linux /")
                .or_else(|| l.strip_prefix("if initrd /"))
        })
        .all(|rest| {
            boot.exists(rest.split(' ').next().unwrap().trim_end_matches(';'))
                .unwrap()
        })
}

#[test]
fn grub_follows_upgrade_bless_and_rollback() {
    use contract::grubenv::GrubEnv;
    let dir = tempfile::tempdir().unwrap();
    let (mut b, mut m) = disk_with_grub(40);
    let mut boot = BootFs::new(&mut b, 0);
    let v2 = payload(dir.path(), "2", 300_000);
    upgrade(&mut boot, &mut m, &v2, 3).unwrap();
    let view = crate::grubenv::read(&mut boot).unwrap();
    assert_eq!(
        (view.good, view.env),
        (Some(Slot::A), GrubEnv::trial(Slot::B, 3))
    );
    assert!(grub_can_boot(&mut boot, Slot::B) && grub_can_boot(&mut boot, Slot::A));
    let b_cfg = String::from_utf8(boot.read("B/grub.cfg", 4096).unwrap()).unwrap();
    assert!(b_cfg.contains(&v2.entry(Slot::B).linux), "{b_cfg}");
    assert_eq!(grub_choice(&mut boot), Slot::B);
    assert_eq!(firmware_tries(&mut boot), Slot::B);
    assert_eq!(
        assess(&mut boot, &mut m, Slot::B).unwrap(),
        BootOutcome::Trial
    );
    bless(&mut boot, &mut m, Slot::B, "2").unwrap();
    let view = crate::grubenv::read(&mut boot).unwrap();
    assert_eq!((view.good, view.env), (Some(Slot::B), GrubEnv::none()));
    assert_eq!(grub_choice(&mut boot), firmware_tries(&mut boot));
    // Rollback to A: both loaders.
    rollback(&mut boot, &mut m, false, false).unwrap();
    assert_eq!(grub_choice(&mut boot), Slot::A);
    assert_eq!(firmware_tries(&mut boot), Slot::A);
    // A forced rollback to a slot on trial arms GRUB too.
    let v3 = payload(dir.path(), "3", 200_000);
    upgrade(&mut boot, &mut m, &v3, 2).unwrap();
    let view = crate::grubenv::read(&mut boot).unwrap();
    assert_eq!(view.env, GrubEnv::trial(Slot::B, 2));
    rollback(&mut boot, &mut m, false, false).unwrap();
    let view = crate::grubenv::read(&mut boot).unwrap();
    assert_eq!((view.good, view.env), (Some(Slot::A), GrubEnv::none()));
    rollback(&mut boot, &mut m, true, false).unwrap();
    let view = crate::grubenv::read(&mut boot).unwrap();
    assert_eq!(
        (view.good, view.env),
        (Some(Slot::A), GrubEnv::trial(Slot::B, DEFAULT_TRIES))
    );
    assert_eq!(grub_choice(&mut boot), firmware_tries(&mut boot));
    let text = crate::testutil::fsck(b.get_ref());
    assert_eq!(text.lines().count(), 2, "{text}");
}

/// An upgrade of a disk with GRUB's rendering, cut at every write: each
/// loader boots A or B with all the files it loads, and they disagree only
/// between systemd-boot's switch and GRUB's, where the runtime under GRUB
/// finishes the switch.
#[test]
fn an_upgrade_with_grub_cut_at_any_write_keeps_both_loaders_bootable() {
    crate::device::each_loss(|_| {
        an_upgrade_with_grub_cut_at_any_write_keeps_both_loaders_bootable_under_loss()
    });
}

fn an_upgrade_with_grub_cut_at_any_write_keeps_both_loaders_bootable_under_loss() {
    use contract::grubcfg::{GrubAssessment, assess_grub};
    let dir = tempfile::tempdir().unwrap();
    let (b0, m0) = disk_with_grub(16);
    let v2 = payload(dir.path(), "2", 20_000);
    let run = |fail_at| cut_upgrade(&b0, &m0, &v2, fail_at);
    let (done, total, ..) = run(None);
    assert!(done, "{total} writes");
    let mut disagree = Vec::new();
    for n in 1..=total + 1 {
        let (done, _, mut bd, mut md) = run(Some(n));
        assert_eq!(done, n > total, "cut {n}");
        let mut boot = BootFs::new(&mut bd, 0);
        let g = grub_choice(&mut boot);
        assert!(
            grub_can_boot(&mut boot, g),
            "cut {n}: GRUB boots {g}, whose files are missing"
        );
        let st = status(&mut boot, &mut md).unwrap();
        let sd = st.next_boot().unwrap().slot;
        if g != sd {
            disagree.push(n);
            assert_eq!((sd, g), (Slot::B, Slot::A), "cut {n}");
            let view = crate::grubenv::read(&mut boot).unwrap();
            assert_eq!(
                assess_grub(&st.state, &st.entries, view.env, g),
                GrubAssessment::FinishSwitch { tries: 3 },
                "cut {n}"
            );
        }
    }
    // Only from systemd-boot's switch (its entry valid once its length is
    // written; fatfs's last writes of the creation follow) to GRUB's, the
    // last write.
    assert!(
        !disagree.is_empty()
            && disagree.len() <= 3
            && disagree.windows(2).all(|w| w[1] == w[0] + 1)
            && disagree.last() == Some(&total),
        "{disagree:?} of {total}"
    );
}

/// One boot under GRUB and what the runtime then does (it reaches ready):
/// GRUB counts (its `save_env`), the runtime assesses with
/// [`assess_grub`] and blesses a trial. The slot booted, and the slot each
/// loader boots next.
fn boot_grub(b: &mut Dev, m: &mut Dev) -> (Slot, Slot, Slot) {
    let mut boot = BootFs::new(&mut *b, 0);
    let view = crate::grubenv::read(&mut boot).unwrap();
    let g = grubcfg::next_boot(view.good, view.env);
    if let Some(saved) = g.saved {
        boot.overwrite_in_place(contract::paths::BOOT_GRUB_ENV, &saved.render().unwrap())
            .unwrap();
    }
    let out = assess_grub(&mut boot, &mut *m, g.slot).unwrap();
    if out == GrubOutcome::As(BootOutcome::Trial) {
        let v = status(&mut boot, &mut *m)
            .unwrap()
            .state
            .version(g.slot)
            .to_string();
        bless(&mut boot, &mut *m, g.slot, &v).unwrap();
    }
    let next = status(&mut boot, &mut *m)
        .unwrap()
        .next_boot()
        .unwrap()
        .slot;
    (g.slot, grub_choice(&mut boot), next)
}

/// The same under systemd-boot with [`assess`].
fn boot_uefi(b: &mut Dev, m: &mut Dev) -> (Slot, Slot, Slot) {
    let mut boot = BootFs::new(&mut *b, 0);
    let slot = firmware_tries(&mut boot);
    if assess(&mut boot, &mut *m, slot).unwrap() == BootOutcome::Trial {
        let v = status(&mut boot, &mut *m)
            .unwrap()
            .state
            .version(slot)
            .to_string();
        bless(&mut boot, &mut *m, slot, &v).unwrap();
    }
    let next = status(&mut boot, &mut *m)
        .unwrap()
        .next_boot()
        .unwrap()
        .slot;
    (slot, grub_choice(&mut boot), next)
}

/// What the loaders and the runtime read: META's state, the valid entries,
/// GRUB's rendering.
fn snapshot(b: &mut Dev, m: &mut Dev) -> (BootState, Vec<EntryName>, crate::grubenv::View) {
    let mut boot = BootFs::new(b, 0);
    let st = status(&mut boot, m).unwrap();
    (
        st.state,
        st.entries,
        crate::grubenv::read(&mut boot).unwrap(),
    )
}

/// Upgrade, blessing (on GRUB's last try) and rollbacks of a disk with
/// GRUB's rendering, cut at every write, then booted once under either
/// firmware: from the boot after, both loaders boot the same slot, and the
/// same one whichever firmware booted first (unless the disk is as it was
/// before the operation and already booted differently by firmware).
#[test]
fn after_a_cut_one_boot_under_either_firmware_brings_the_loaders_together() {
    crate::device::each_loss(|_| {
        after_a_cut_one_boot_under_either_firmware_brings_the_loaders_together_under_loss()
    });
}

fn after_a_cut_one_boot_under_either_firmware_brings_the_loaders_together_under_loss() {
    let dir = tempfile::tempdir().unwrap();
    let v2 = payload(dir.path(), "2", 20_000);
    type Op = fn(&mut BootFs<&mut Faulty<Dev>>, &mut Faulty<Dev>, &Payload);
    let ops: [(&str, Op); 4] = [
        ("upgrade", |b, m, p| {
            let _ = upgrade(b, m, p, 1);
        }),
        ("blessing", |b, m, _| {
            let _ = bless(b, m, Slot::B, "2");
        }),
        ("rollback", |b, m, _| {
            let _ = rollback(b, m, false, false);
        }),
        ("forced rollback", |b, m, _| {
            let _ = rollback(b, m, true, false);
        }),
    ];
    for (name, op) in ops {
        // The disk each operation starts from.
        let (mut b0, mut m0) = disk_with_grub(16);
        match name {
            "upgrade" => {}
            "blessing" => {
                // Upgraded with one try, used under GRUB.
                upgrade(&mut BootFs::new(&mut b0, 0), &mut m0, &v2, 1).unwrap();
                let mut boot = BootFs::new(&mut b0, 0);
                let view = crate::grubenv::read(&mut boot).unwrap();
                let g = grubcfg::next_boot(view.good, view.env);
                assert_eq!(g.slot, Slot::B);
                boot.overwrite_in_place(
                    contract::paths::BOOT_GRUB_ENV,
                    &g.saved.unwrap().render().unwrap(),
                )
                .unwrap();
            }
            _ => {
                upgrade(&mut BootFs::new(&mut b0, 0), &mut m0, &v2, 3).unwrap();
                if name == "rollback" {
                    bless(&mut BootFs::new(&mut b0, 0), &mut m0, Slot::B, "2").unwrap();
                }
                if name == "forced rollback" {
                    // B failed: rolled back, marked bad; forced again.
                    rollback(&mut BootFs::new(&mut b0, 0), &mut m0, false, false).unwrap();
                }
            }
        }
        // Each loader counts its own tries: a disk whose trial has tries
        // left under one and none under the other (the blessing's start:
        // its last try used under GRUB) boots differently by firmware
        // before any write of the operation.
        let pre = snapshot(&mut b0.clone(), &mut m0.clone());
        let pre_differs = {
            let (mut b, mut m) = (b0.clone(), m0.clone());
            let g = boot_grub(&mut b, &mut m).2;
            let (mut b, mut m) = (b0.clone(), m0.clone());
            g != boot_uefi(&mut b, &mut m).2
        };
        let mut total = 0;
        for n in 1.. {
            let mut b = Faulty::failing_at(b0.clone(), n);
            let mut m = b.share(m0.clone());
            op(&mut BootFs::new(&mut b, 0), &mut m, &v2);
            let writes = b.writes();
            let (bd, md) = (b.into_inner(), m.into_inner());
            let unchanged = snapshot(&mut bd.clone(), &mut md.clone()) == pre;
            let (mut b1, mut m1) = (bd.clone(), md.clone());
            let (_, g_grub, g_sd) = boot_grub(&mut b1, &mut m1);
            assert_eq!(g_grub, g_sd, "{name}, cut {n}: after a boot under GRUB");
            let (mut b2, mut m2) = (bd, md);
            let (_, u_grub, u_sd) = boot_uefi(&mut b2, &mut m2);
            assert_eq!(u_grub, u_sd, "{name}, cut {n}: after a boot under UEFI");
            if !(pre_differs && unchanged) {
                assert_eq!(g_sd, u_sd, "{name}, cut {n}: GRUB first or UEFI first");
            }
            if writes < n - 1 {
                total = writes;
                break;
            }
        }
        assert!(total > 0, "{name}");
    }
}

#[test]
fn ukis_upgrade_bless_fall_back_and_roll_back_as_entries_do() {
    let dir = tempfile::tempdir().unwrap();
    let (mut b, mut m, v1) = uki_disk(16, dir.path());
    let mut boot = BootFs::new(&mut b, 0);
    let v2 = uki_payload(dir.path(), "2", 300_000);
    let up = upgrade(&mut boot, &mut m, &v2, 3).unwrap();
    assert_eq!(up.entry.path(), "EFI/Linux/g00000002-slot-b+3-0.efi");
    assert_eq!(up.bytes_written, v2.ukis.as_ref().unwrap().b.len);
    // Nothing of the `.conf` kind: no entry, no kernel or initramfs.
    assert!(boot.list("loader/entries").unwrap().is_empty());
    assert!(boot.list("B").unwrap().is_empty());
    assert_eq!(boots_uki(&mut boot, &v1, &v2, 0), Slot::B);
    assert_eq!(
        assess(&mut boot, &mut m, Slot::B).unwrap(),
        BootOutcome::Trial
    );
    bless(&mut boot, &mut m, Slot::B, "2").unwrap();
    let uki = |slot, g| EntryName::good(g, slot).of_kind(EntryKind::Uki);
    assert_eq!(entries(&mut boot), [uki(Slot::A, 1), uki(Slot::B, 2)]);
    assert_eq!(
        boot.hash(&uki(Slot::B, 2).path()).unwrap().0,
        v2.ukis.as_ref().unwrap().b.sha256
    );
    // A rollback's check sees the slot's UKI; its refusal writes nothing.
    drop(boot);
    let (b1, m1) = (b.clone(), m.clone());
    let mut boot = BootFs::new(&mut b, 0);
    let a_sha = v1.ukis.as_ref().unwrap().a.sha256.clone();
    let refuse = |_: &Meta, uki: &[u8]| -> Result<()> {
        assert_eq!(crate::fat::hex(&Sha256::digest(uki)), a_sha);
        bail!("revoked")
    };
    let e = rollback_checked(&mut boot, &mut m, true, true, &refuse).unwrap_err();
    assert!(
        format!("{e:#}")
            .contains("slot A (1) cannot be rolled back to; nothing was written: revoked"),
        "{e:#}"
    );
    drop(boot);
    assert_eq!((b.get_ref(), m.get_ref()), (b1.get_ref(), m1.get_ref()));
    let mut boot = BootFs::new(&mut b, 0);
    // A rollback copies A's UKI under the highest generation.
    let r = rollback(&mut boot, &mut m, false, false).unwrap();
    assert_eq!(r.entry, uki(Slot::A, 3));
    assert_eq!(entries(&mut boot), [uki(Slot::B, 2), uki(Slot::A, 3)]);
    assert_eq!(
        boot.hash(&r.entry.path()).unwrap().0,
        v1.ukis.as_ref().unwrap().a.sha256
    );
    // An upgrade whose tries run out falls back.
    let v3 = uki_payload(dir.path(), "3", 1000);
    upgrade(&mut boot, &mut m, &v3, 2).unwrap();
    for _ in 0..2 {
        assert_eq!(firmware_tries(&mut boot), Slot::B);
    }
    assert_eq!(firmware_tries(&mut boot), Slot::A);
    assert!(matches!(
        assess(&mut boot, &mut m, Slot::A).unwrap(),
        BootOutcome::FellBack {
            failed: Slot::B,
            ..
        }
    ));
}

/// An upgrade to a payload without Secure Boot on a disk with it (the caller
/// allowed it): META keeps the db certificate until that version is blessed;
/// a fallback keeps it for good.
#[test]
fn leaving_secure_boot_takes_effect_at_the_blessing_and_not_after_a_fallback() {
    let dir = tempfile::tempdir().unwrap();
    let (mut b, mut m, mut v1) = uki_disk(16, dir.path());
    let db = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n".to_string();
    {
        let (mut meta, _) = meta::read(&mut m).unwrap();
        meta.set(Tag::SecureBoot, db.as_bytes());
        meta::write(&mut m, &meta).unwrap();
    }
    v1.secure_boot = Some(db.clone());
    let tag = |m: &mut Dev, t: Tag| meta::read(m).unwrap().0.get(t).map(str::to_string);
    let mut boot = BootFs::new(&mut b, 0);
    // v2 without Secure Boot, whose tries run out: Secure Boot stays.
    let plain = payload(dir.path(), "2", 1000);
    upgrade(&mut boot, &mut m, &plain, 1).unwrap();
    assert_eq!(tag(&mut m, Tag::SecureBoot), Some(db.clone()));
    assert_eq!(tag(&mut m, Tag::SecureBootLeaving).as_deref(), Some("1"));
    assert_eq!(firmware_tries(&mut boot), Slot::B);
    assert_eq!(firmware_tries(&mut boot), Slot::A);
    assert!(matches!(
        assess(&mut boot, &mut m, Slot::A).unwrap(),
        BootOutcome::FellBack { .. }
    ));
    assert_eq!(tag(&mut m, Tag::SecureBoot), Some(db.clone()));
    assert_eq!(tag(&mut m, Tag::SecureBootLeaving), None);
    // An upgrade with Secure Boot leaves nothing pending either.
    let v3 = uki_payload(dir.path(), "3", 1000);
    let v3 = Payload {
        secure_boot: Some(db.clone()),
        ..v3
    };
    upgrade(&mut boot, &mut m, &v3, 3).unwrap();
    assert_eq!(tag(&mut m, Tag::SecureBootLeaving), None);
    rollback(&mut boot, &mut m, true, false).unwrap();
    // Leaving again, blessed this time: the record goes.
    upgrade(&mut boot, &mut m, &plain, 3).unwrap();
    let slot = firmware_tries(&mut boot);
    assert_eq!(assess(&mut boot, &mut m, slot).unwrap(), BootOutcome::Trial);
    bless(&mut boot, &mut m, slot, "2").unwrap();
    assert_eq!(tag(&mut m, Tag::SecureBoot), None);
    assert_eq!(tag(&mut m, Tag::SecureBootLeaving), None);
}

/// An upgrade that brings a root of trust and Secure Boot updates (issue
/// 29): META keeps the old root and updates until the new version is
/// blessed, and the new ones from the blessing's META write; a power cut
/// at every write of the upgrade and of the blessing leaves exactly one
/// root with its version's updates, and booting on finishes the change; a
/// fallback or a rollback before the blessing keeps the old ones.
#[test]
fn a_root_of_trust_and_secure_boot_updates_change_at_the_blessing_whatever_the_cut() {
    crate::device::each_loss(|_| a_root_of_trust_changes_at_the_blessing_under_loss());
}

fn a_root_of_trust_changes_at_the_blessing_under_loss() {
    let dir = tempfile::tempdir().unwrap();
    let (b, mut m0) = disk(16);
    {
        let (mut meta, _) = meta::read(&mut m0).unwrap();
        meta.set(Tag::TrustedKeys, "old keys");
        meta.set(Tag::SecureBootUpdates, "updates 1");
        meta::write(&mut m0, &meta).unwrap();
    }
    let b0 = b;
    let v2 = Payload {
        next_root: Some(b"root 2".to_vec()),
        secure_boot_updates: Some("updates 2".into()),
        ..payload(dir.path(), "2", 20_000)
    };
    let tag = |m: &mut Dev, t: Tag| meta::read(m).unwrap().0.get(t).map(str::to_string);
    // Exactly one root at any time: the old keys, or root 2 alone; and
    // the updates of the same version.
    let one_root = |m: &mut Dev, n: u64| {
        let roots = (
            tag(m, Tag::TrustedKeys),
            tag(m, Tag::TrustRoot),
            tag(m, Tag::SecureBootUpdates),
        );
        let (old, new) = (Some("updates 1".into()), Some("updates 2".into()));
        assert!(
            roots == (Some("old keys".into()), None, old)
                || roots == (None, Some("root 2".into()), new),
            "cut {n}: {roots:?}"
        );
        roots.1.is_some()
    };
    let next = |m: &mut Dev| {
        let n = (
            tag(m, Tag::TrustRootNext),
            tag(m, Tag::SecureBootUpdatesNext),
        );
        assert_eq!(n.0.is_some(), n.1.is_some(), "{n:?}");
        n.0
    };
    let (_, total, ..) = cut_upgrade(&b0, &m0, &v2, None);
    let mut saw = [false, false];
    for n in 1..=total + 1 {
        let (done, _, mut bd, mut md) = cut_upgrade(&b0, &m0, &v2, Some(n));
        assert_eq!(done, n > total, "cut {n}");
        assert!(
            !one_root(&mut md, n),
            "cut {n}: the root changed before the blessing"
        );
        let mut boot = BootFs::new(&mut bd, 0);
        let slot = firmware_tries(&mut boot);
        saw[(slot == Slot::B) as usize] = true;
        assess(&mut boot, &mut md, slot).unwrap();
        if slot == Slot::A {
            // Not switched: the root it brought went with the upgrade.
            assert_eq!(next(&mut md), None, "cut {n}");
            assert!(!one_root(&mut md, n));
            upgrade(&mut boot, &mut md, &v2, 3).unwrap();
            assert_eq!(firmware_tries(&mut boot), Slot::B, "cut {n}");
            assess(&mut boot, &mut md, Slot::B).unwrap();
        }
        assert_eq!(next(&mut md).as_deref(), Some("root 2"));
        assert_eq!(
            tag(&mut md, Tag::SecureBootUpdatesNext).as_deref(),
            Some("updates 2")
        );
        if n <= total {
            bless(&mut boot, &mut md, Slot::B, "2").unwrap();
            assert!(one_root(&mut md, n), "cut {n}");
            continue;
        }
        // The blessing of the finished upgrade, cut at each of its writes,
        // then booted again.
        drop(boot);
        let blessing = |boot: &mut BootFs<&mut Faulty<Dev>>, m: &mut Faulty<Dev>| {
            bless(boot, m, Slot::B, "2").map(|_| ())
        };
        let writes = {
            let mut b = Faulty::counting(bd.clone());
            let mut m = b.share(md.clone());
            blessing(&mut BootFs::new(&mut b, 0), &mut m).unwrap();
            b.writes()
        };
        for k in 1..=writes {
            let mut b = Faulty::failing_at(bd.clone(), k);
            let mut m = b.share(md.clone());
            assert!(blessing(&mut BootFs::new(&mut b, 0), &mut m).is_err());
            let (mut bk, mut mk) = (b.into_inner(), m.into_inner());
            one_root(&mut mk, k);
            let mut boot = BootFs::new(&mut bk, 0);
            let slot = firmware_tries(&mut boot);
            assert_eq!(slot, Slot::B, "cut {n}, then {k}");
            assess(&mut boot, &mut mk, slot).unwrap();
            bless(&mut boot, &mut mk, slot, "2").unwrap();
            assert!(one_root(&mut mk, k), "cut {n}, then {k}");
            assert_eq!(next(&mut mk), None);
        }
    }
    assert_eq!(saw, [true, true]);

    // Not blessed: a fallback, or a rollback, keeps the old root.
    for how in ["fallback", "rollback"] {
        let (_, _, mut b, mut m) = cut_upgrade(&b0, &m0, &v2, None);
        let mut boot = BootFs::new(&mut b, 0);
        if how == "fallback" {
            falls_back(&mut boot, &mut m);
            // A blessing of the slot fallen back to takes nothing.
            bless(&mut boot, &mut m, Slot::A, "1").unwrap();
        } else {
            rollback(&mut boot, &mut m, false, false).unwrap();
            assert_eq!(firmware_tries(&mut boot), Slot::A);
        }
        assert!(!one_root(&mut m, 0), "{how}");
        assert_eq!(next(&mut m), None, "{how}");
    }
}

#[test]
fn a_uki_upgrade_is_refused_on_a_boot_with_grub_and_without_room() {
    let dir = tempfile::tempdir().unwrap();
    let (mut b, mut m) = disk_with_grub(16);
    let v2 = uki_payload(dir.path(), "2", 1000);
    let e = upgrade(&mut BootFs::new(&mut b, 0), &mut m, &v2, 3).unwrap_err();
    assert!(format!("{e:#}").contains("GRUB cannot run"), "{e:#}");
    let (mut b, mut m, _) = uki_disk(16, dir.path());
    // 9 MiB fits once on this BOOT but not twice, as its blessing needs.
    for size in [17 << 20, 9 << 20] {
        let big = uki_payload(dir.path(), "2", size);
        let before = b.clone();
        let e = upgrade(&mut BootFs::new(&mut b, 0), &mut m, &big, 3).unwrap_err();
        assert!(format!("{e:#}").contains("no room"), "{e:#}");
        assert!(b.get_ref() == before.get_ref(), "nothing written");
    }
}

#[test]
fn uki_upgrade_bless_and_rollback_cut_at_any_write_boot_one_of_the_two() {
    crate::device::each_loss(|_| {
        uki_upgrade_bless_and_rollback_cut_at_any_write_boot_one_of_the_two_under_loss()
    });
}

fn uki_upgrade_bless_and_rollback_cut_at_any_write_boot_one_of_the_two_under_loss() {
    let dir = tempfile::tempdir().unwrap();
    let (b0, m0, v1) = uki_disk(16, dir.path());
    let v2 = uki_payload(dir.path(), "2", 40_000);
    let run = |fail_at| cut_upgrade(&b0, &m0, &v2, fail_at);
    let (done, total, ..) = run(None);
    assert!(done && total > 5, "{total} writes");
    let mut saw = [false, false];
    for n in 1..=total + 1 {
        let (done, _, mut bd, mut md) = run(Some(n));
        assert_eq!(done, n > total, "cut {n}");
        let mut boot = BootFs::new(&mut bd, 0);
        let slot = boots_uki(&mut boot, &v1, &v2, n);
        saw[(slot == Slot::B) as usize] = true;
        let out = assess(&mut boot, &mut md, slot).unwrap();
        if slot == Slot::B {
            assert_eq!(out, BootOutcome::Trial, "cut {n}");
            bless(&mut boot, &mut md, slot, "2").unwrap();
        }
        let st = status(&mut boot, &mut md).unwrap();
        assert_eq!(st.state.default, slot, "cut {n}");
        if slot == Slot::A {
            upgrade(&mut boot, &mut md, &v2, 3).unwrap();
            assert_eq!(boots_uki(&mut boot, &v1, &v2, n), Slot::B, "cut {n}");
        }
    }
    assert_eq!(saw, [true, true]);

    // The blessing and a rollback, cut at each of their writes.
    let (mut b0, mut m0) = (b0.clone(), m0.clone());
    upgrade(&mut BootFs::new(&mut b0, 0), &mut m0, &v2, 3).unwrap();
    assert_eq!(firmware_tries(&mut BootFs::new(&mut b0, 0)), Slot::B);
    for op in ["bless", "rollback"] {
        if op == "rollback" {
            let mut boot = BootFs::new(&mut b0, 0);
            assess(&mut boot, &mut m0, Slot::B).unwrap();
            bless(&mut boot, &mut m0, Slot::B, "2").unwrap();
        }
        let step = |b: &mut Faulty<Dev>, m: &mut Faulty<Dev>| -> Result<()> {
            let mut boot = BootFs::new(b, 0);
            if op == "bless" {
                assess(&mut boot, m, Slot::B)?;
                bless(&mut boot, m, Slot::B, "2").map(|_| ())
            } else {
                rollback(&mut boot, m, false, false).map(|_| ())
            }
        };
        let mut b = Faulty::counting(b0.clone());
        let mut m = b.share(m0.clone());
        step(&mut b, &mut m).unwrap();
        let total = b.writes();
        for n in 1..=total {
            let mut b = Faulty::failing_at(b0.clone(), n);
            let mut m = b.share(m0.clone());
            assert!(step(&mut b, &mut m).is_err(), "{op} cut {n}");
            let (mut bd, mut md) = (b.into_inner(), m.into_inner());
            let mut boot = BootFs::new(&mut bd, 0);
            let slot = boots_uki(&mut boot, &v1, &v2, n);
            if op == "bless" {
                assert_eq!(slot, Slot::B, "bless cut {n}");
            }
            assess(&mut boot, &mut md, slot).unwrap();
            if op == "bless" {
                bless(&mut boot, &mut md, slot, "2").unwrap();
                let st = status(&mut boot, &mut md).unwrap();
                assert_eq!(st.state.status(Slot::B), SlotStatus::Good, "cut {n}");
            } else if slot == Slot::B {
                rollback(&mut boot, &mut md, false, false).unwrap();
                assert_eq!(boots_uki(&mut boot, &v1, &v2, n), Slot::A, "cut {n}");
            }
        }
    }
}

/// An ESP (FAT32) holding `loader` as the boot loader of each of `arches`.
fn esp_with_at(loader: &[u8], arches: &[contract::Arch]) -> Dev {
    let mut esp = BootFs::new(crate::testutil::fat32_volume(), 0);
    esp.ensure_dir("EFI").unwrap();
    esp.ensure_dir("EFI/BOOT").unwrap();
    for a in arches {
        esp.create(&a.esp_boot_loader(), &mut &loader[..], loader.len() as u64)
            .unwrap();
    }
    esp.into_inner()
}

/// The ESP's (amd64) boot loader as firmware reads it.
fn firmware_loader(esp: &Dev) -> Vec<u8> {
    loader_at(esp, contract::Arch::Amd64).expect("EFI/BOOT/BOOTX64.EFI")
}

/// The ESP's boot loader of `arch` as firmware reads it (through fatfs,
/// not ours), if there is one.
fn loader_at(esp: &Dev, arch: contract::Arch) -> Option<Vec<u8>> {
    let mut c = esp.clone();
    c.set_position(0);
    let fs = fatfs::FileSystem::new(&mut c, fatfs::FsOptions::new()).unwrap();
    let mut f = fs.root_dir().open_file(&arch.esp_boot_loader()).ok()?;
    let mut got = Vec::new();
    std::io::Read::read_to_end(&mut f, &mut got).unwrap();
    Some(got)
}

/// An arm64 disk's boot loader is `EFI/BOOT/BOOTAA64.EFI`: the upgrade
/// replaces it there and makes no x64 one. An ESP with the loaders of
/// both architectures, or with neither, is refused before any write.
#[test]
fn the_boot_loader_is_replaced_at_the_architecture_s_path() {
    use contract::Arch::{Amd64, Arm64};
    let dir = tempfile::tempdir().unwrap();
    let (b0, mut m0, _) = uki_disk(16, dir.path());
    let Loaders {
        old,
        new,
        file: loader,
        db,
        v2,
        ..
    } = loaders_of(dir.path(), Arm64);
    let mut meta0 = meta::read(&mut m0).unwrap().0;
    meta0.set(Tag::SecureBoot, db.as_bytes());
    meta::write(&mut m0, &meta0).unwrap();
    let up_with = |b: &mut Dev, m: &mut Dev, e: &mut Dev, loader: &PayloadFile| {
        esp_op(b, m, e, None, |esp, boot, meta| {
            upgrade_with_loader(Some(esp), loader, boot, meta, &v2, 3)
        })
    };
    let up = |b: &mut Dev, m: &mut Dev, e: &mut Dev| up_with(b, m, e, &loader);
    let (mut b, mut m, mut e) = (b0.clone(), m0.clone(), esp_with_at(&old, &[Arm64]));
    up(&mut b, &mut m, &mut e).0.unwrap();
    assert_eq!(loader_at(&e, Arm64), Some(new));
    assert_eq!(loader_at(&e, Amd64), None);
    // An x64 boot loader for an arm64 ESP: refused before anything is
    // written, even the finishing of a replacement an earlier run left
    // (a stray BOOTAA64.NEW, which finishing removes).
    std::fs::create_dir(dir.path().join("x64")).unwrap();
    let x64 = loaders_of(&dir.path().join("x64"), Amd64).file;
    let mut esp = BootFs::new(esp_with_at(&old, &[Arm64]), 0);
    let stray = crate::fat::replacement(&Arm64.esp_boot_loader());
    esp.create(&stray, &mut &old[..], old.len() as u64).unwrap();
    let e0 = esp.into_inner();
    let (mut b, mut m, mut e) = (b0.clone(), m0.clone(), e0.clone());
    let (r, writes) = up_with(&mut b, &mut m, &mut e, &x64);
    let err = format!("{:#}", r.unwrap_err());
    assert!(err.contains("not an EFI program for arm64"), "{err}");
    assert_eq!(writes, 0);
    assert!(e.get_ref() == e0.get_ref());
    // The ESP's loader is looked up before anything is written: with none
    // (a stray replacement of x64's beside it, which a finished replacement
    // would remove) or with both, refused and untouched.
    for (arches, want) in [
        (&[Amd64, Arm64][..], "several architectures (amd64, arm64)"),
        (&[][..], "no EFI/BOOT boot loader"),
    ] {
        let mut esp = BootFs::new(esp_with_at(&old, arches), 0);
        let stray = crate::fat::replacement(&Amd64.esp_boot_loader());
        esp.create(&stray, &mut &old[..], old.len() as u64).unwrap();
        let e0 = esp.into_inner();
        let (mut b, mut m, mut e) = (b0.clone(), m0.clone(), e0.clone());
        let (r, writes) = up(&mut b, &mut m, &mut e);
        let err = format!("{:#}", r.unwrap_err());
        assert!(err.contains(want), "{err}");
        assert!(err.contains("nothing was written"), "{err}");
        assert_eq!(writes, 0, "{arches:?}");
        assert!(e.get_ref() == e0.get_ref() && b.get_ref() == b0.get_ref());
        assert!(m.get_ref() == m0.get_ref());
    }
}

/// The two boot loaders of the ESP tests: `old` on the ESP `esp`, `new`
/// as the payload's signed one (`file`), and the Secure Boot payload `v2`
/// (signed for `db`).
struct Loaders {
    old: Vec<u8>,
    new: Vec<u8>,
    esp: Dev,
    file: PayloadFile,
    db: String,
    v2: Payload,
}

fn loaders(dir: &std::path::Path) -> Loaders {
    loaders_of(dir, contract::Arch::Amd64)
}

/// `len` bytes of a stand-in EFI program for `arch`: a PE header naming its
/// machine, then bytes made from `seed`.
fn efi_program(arch: contract::Arch, len: u32, seed: u32) -> Vec<u8> {
    let mut b: Vec<u8> = (0..len).map(|i| (i % seed) as u8).collect();
    b[..2].copy_from_slice(b"MZ");
    b[0x3c..0x40].copy_from_slice(&0x40u32.to_le_bytes());
    b[0x40..0x44].copy_from_slice(b"PE\0\0");
    b[0x44..0x46].copy_from_slice(&arch.spec().pe_machine.to_le_bytes());
    b
}

/// [`loaders`] for a disk of `arch`: EFI programs of its machine.
fn loaders_of(dir: &std::path::Path, arch: contract::Arch) -> Loaders {
    let old = efi_program(arch, 12_000, 253);
    let new = efi_program(arch, 20_000, 241);
    let path = dir.join(format!("systemd-boot{}.efi.signed", arch.spec().efi_suffix));
    std::fs::write(&path, &new).unwrap();
    let file = PayloadFile {
        path,
        sha256: crate::fat::hex(&Sha256::digest(&new)),
        len: new.len() as u64,
    };
    let db = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n".to_string();
    let v2 = Payload {
        secure_boot: Some(db.clone()),
        ..uki_payload(dir, "2", 6_000)
    };
    Loaders {
        esp: esp_with_at(&old, &[arch]),
        old,
        new,
        file,
        db,
        v2,
    }
}

/// Whether the boot loader `got` after cut `n` is `new`, checking that it
/// is whole, old or new, and never old again once new (`new_from`: the
/// first cut that left it new).
fn old_or_new(got: &[u8], old: &[u8], new: &[u8], new_from: &mut Option<u64>, n: u64) -> bool {
    if got == new {
        new_from.get_or_insert(n);
        return true;
    }
    assert!(
        got == old,
        "cut {n}: the boot loader is neither old nor new"
    );
    assert!(new_from.is_none(), "cut {n}: old boot loader after the new");
    false
}

type Cut<'a> = Faulty<&'a mut Dev>;

/// `op` on the ESP, BOOT and META (in that order of arguments) counted, or
/// cut at write `fail_at`: its result and the writes it made.
fn esp_op<R>(
    b: &mut Dev,
    m: &mut Dev,
    e: &mut Dev,
    fail_at: Option<u64>,
    op: impl FnOnce(&mut BootFs<&mut Cut>, &mut BootFs<&mut Cut>, &mut Cut) -> Result<R>,
) -> (Result<R>, u64) {
    let mut fb = match fail_at {
        Some(n) => Faulty::failing_at(b, n),
        None => Faulty::counting(b),
    };
    let mut fm = fb.share(m);
    let mut fe = fb.share(e);
    let r = op(
        &mut BootFs::new(&mut fe, 0),
        &mut BootFs::new(&mut fb, 0),
        &mut fm,
    );
    (r, fb.writes())
}

/// Entering Secure Boot by an upgrade from a disk with `.conf` slots and
/// GRUB's rendering, cut before each of its writes (ESP, BOOT and META):
/// the ESP's boot loader is whole, old or new (new from some cut on); the
/// disk boots under UEFI, v1 on A until the switch and v2's UKI on B from
/// it on; META has no `secure-boot` record before the blessing; running
/// the upgrade again finishes it, and the blessing makes the disk a Secure
/// Boot disk with a clean ESP and no GRUB rendering left. Unfinished, a
/// fallback or a rollback leaves the disk without Secure Boot.
#[test]
fn entering_secure_boot_cut_at_any_write_finishes_and_takes_effect_at_the_blessing() {
    crate::device::each_loss(|_| {
        entering_secure_boot_cut_at_any_write_finishes_and_takes_effect_at_the_blessing_under_loss()
    });
}

fn entering_secure_boot_cut_at_any_write_finishes_and_takes_effect_at_the_blessing_under_loss() {
    let dir = tempfile::tempdir().unwrap();
    let (b0, m0) = disk_with_grub(16);
    let Loaders {
        old: old_loader,
        new: new_loader,
        esp: e0,
        file: loader,
        db,
        v2,
    } = loaders(dir.path());
    let tag = |m: &mut Dev, t: Tag| meta::read(m).unwrap().0.get(t).map(str::to_string);
    let enter = |b: &mut Dev, m: &mut Dev, e: &mut Dev, fail_at: Option<u64>| {
        esp_op(b, m, e, fail_at, |esp, boot, meta| {
            upgrade_into_secure_boot(esp, &loader, boot, meta, &v2, 3)
        })
    };
    // Refused before any write: a payload without Secure Boot, a disk with
    // it.
    {
        let (mut b, mut m, mut e) = (b0.clone(), m0.clone(), e0.clone());
        let other = tempfile::tempdir().unwrap();
        let plain = uki_payload(other.path(), "2", 1000);
        let err = upgrade_into_secure_boot(
            &mut BootFs::new(&mut e, 0),
            &loader,
            &mut BootFs::new(&mut b, 0),
            &mut m,
            &plain,
            3,
        )
        .unwrap_err();
        assert!(
            format!("{err:#}").contains("not a Secure Boot build"),
            "{err:#}"
        );
        let mut meta = meta::read(&mut m).unwrap().0;
        meta.set(Tag::SecureBoot, db.as_bytes());
        meta::write(&mut m, &meta).unwrap();
        let (m1, e1) = (m.clone(), e.clone());
        let (r, _) = enter(&mut b, &mut m, &mut e, None);
        let err = r.unwrap_err();
        assert!(format!("{err:#}").contains("already"), "{err:#}");
        assert_eq!(
            (b.get_ref(), m.get_ref(), e.get_ref()),
            (b0.get_ref(), m1.get_ref(), e1.get_ref())
        );
    }
    let (mut b, mut m, mut e) = (b0.clone(), m0.clone(), e0.clone());
    let (r, total) = enter(&mut b, &mut m, &mut e, None);
    r.unwrap();
    assert!(total > 10, "{total} writes");
    let mut loader_new_from = None;
    let mut saw = [false, false];
    for n in 1..=total + 1 {
        let (mut b, mut m, mut e) = (b0.clone(), m0.clone(), e0.clone());
        let (r, _) = enter(&mut b, &mut m, &mut e, Some(n));
        assert_eq!(r.is_ok(), n > total, "cut {n}");
        let got = firmware_loader(&e);
        old_or_new(&got, &old_loader, &new_loader, &mut loader_new_from, n);
        assert_eq!(tag(&mut m, Tag::SecureBoot), None, "cut {n}");
        let mut boot = BootFs::new(&mut b, 0);
        let slot = firmware_tries(&mut boot);
        saw[(slot == Slot::B) as usize] = true;
        let best = best_entry(&entries(&mut boot), slot).unwrap();
        match slot {
            Slot::A => {
                assert_eq!(best.kind, EntryKind::Conf, "cut {n}");
                // (Cut between META's write and the switch: the upgrade is
                // found not switched.)
                let out = assess(&mut boot, &mut m, Slot::A).unwrap();
                assert!(
                    matches!(
                        out,
                        BootOutcome::Steady
                            | BootOutcome::FellBack {
                                reason: FallbackReason::NotSwitched,
                                ..
                            }
                    ),
                    "cut {n}: {out:?}"
                );
                assert_eq!(tag(&mut m, Tag::SecureBootEntering), None, "cut {n}");
                drop(boot);
                // The same upgrade again finishes it.
                let (r, _) = enter(&mut b, &mut m, &mut e, None);
                r.unwrap_or_else(|err| panic!("cut {n}: {err:#}"));
                boot = BootFs::new(&mut b, 0);
                assert_eq!(firmware_tries(&mut boot), Slot::B, "cut {n}");
            }
            Slot::B => assert_eq!(best.kind, EntryKind::Uki, "cut {n}"),
        }
        assert_eq!(
            tag(&mut m, Tag::SecureBootEntering),
            Some(db.clone()),
            "cut {n}"
        );
        assert_eq!(
            assess(&mut boot, &mut m, Slot::B).unwrap(),
            BootOutcome::Trial
        );
        bless(&mut boot, &mut m, Slot::B, "2").unwrap();
        assert_eq!(tag(&mut m, Tag::SecureBoot), Some(db.clone()), "cut {n}");
        assert_eq!(tag(&mut m, Tag::SecureBootEntering), None, "cut {n}");
        assert!(!crate::grubenv::installed(&mut boot).unwrap(), "cut {n}");
        for f in [
            contract::paths::BOOT_GRUB_ENV.to_string(),
            grubcfg::slot_config_path(Slot::A),
            grubcfg::slot_config_path(Slot::B),
        ] {
            assert!(!boot.exists(&f).unwrap(), "cut {n}: {f} is left");
        }
        assert_eq!(firmware_loader(&e), new_loader, "cut {n}");
        let said = crate::testutil::fsck(e.get_ref());
        for bad in ["share", "Reclaimed", "Not auto-correcting", "outside a LFN"] {
            assert!(!said.contains(bad), "cut {n}: fsck.fat says:\n{said}");
        }
    }
    assert_eq!(saw, [true, true]);
    assert!(loader_new_from.is_some());

    // Not blessed: a fallback, or a rollback, leaves no Secure Boot.
    for how in ["fallback", "rollback"] {
        let (mut b, mut m, mut e) = (b0.clone(), m0.clone(), e0.clone());
        let (r, _) = enter(&mut b, &mut m, &mut e, None);
        r.unwrap();
        let mut boot = BootFs::new(&mut b, 0);
        if how == "fallback" {
            falls_back(&mut boot, &mut m);
        } else {
            rollback(&mut boot, &mut m, false, false).unwrap();
            assert_eq!(firmware_tries(&mut boot), Slot::A);
        }
        assert_eq!(tag(&mut m, Tag::SecureBoot), None, "{how}");
        assert_eq!(tag(&mut m, Tag::SecureBootEntering), None, "{how}");
    }

    // A disk that boots under UEFI only (no GRUB rendering to take off).
    let (mut b, mut m) = disk(16);
    let mut e = e0.clone();
    let (r, _) = enter(&mut b, &mut m, &mut e, None);
    r.unwrap();
    let mut boot = BootFs::new(&mut b, 0);
    assert_eq!(firmware_tries(&mut boot), Slot::B);
    assert_eq!(firmware_loader(&e), new_loader);
}

#[test]
fn a_staged_upgrade_changes_no_boot_until_armed_and_a_cut_stage_boots_the_old_slot() {
    crate::device::each_loss(|_| {
        a_staged_upgrade_changes_no_boot_until_armed_and_a_cut_stage_boots_the_old_slot_under_loss()
    });
}

fn a_staged_upgrade_changes_no_boot_until_armed_and_a_cut_stage_boots_the_old_slot_under_loss() {
    let dir = tempfile::tempdir().unwrap();
    let (b0, m0) = disk(40);
    let v2 = payload(dir.path(), "2", 40_000);
    let (mut b, mut m) = (b0.clone(), m0.clone());
    let mut boot = BootFs::new(&mut b, 0);
    let before = status(&mut boot, &mut m).unwrap();
    let staged = stage(&mut boot, &mut m, &v2).unwrap();
    assert_eq!(staged.target, Slot::B);
    assert_eq!(staged.bytes_written, v2.kernel.len + v2.initramfs.len);
    // Nothing armed: META as it was, A's entry the only one, A boots.
    let after = status(&mut boot, &mut m).unwrap();
    assert_eq!(after.meta, before.meta);
    assert_eq!(entries(&mut boot), [EntryName::good(1, Slot::A)]);
    assert_eq!(firmware_tries(&mut boot), Slot::A);
    assert_eq!(
        assess(&mut boot, &mut m, Slot::A).unwrap(),
        BootOutcome::Steady
    );
    // Arming is the upgrade, which finds the files in place.
    let up = upgrade(&mut boot, &mut m, &v2, 3).unwrap();
    assert_eq!((up.to, up.bytes_written), (Slot::B, 0));
    assert_eq!(firmware_tries(&mut boot), Slot::B);

    // A stage cut at any write leaves A booting and META untouched; the
    // upgrade then finishes.
    let count = {
        let mut b = Faulty::counting(b0.clone());
        let mut m = b.share(m0.clone());
        stage(&mut BootFs::new(&mut b, 0), &mut m, &v2).unwrap();
        b.writes()
    };
    assert!(count > 4, "{count}");
    for cut in 0..count {
        let mut b = Faulty::failing_at(b0.clone(), cut);
        let mut m = b.share(m0.clone());
        assert!(stage(&mut BootFs::new(&mut b, 0), &mut m, &v2).is_err());
        let (mut b, mut m) = (b.into_inner(), m.into_inner());
        assert_eq!(m.get_ref(), m0.get_ref(), "cut {cut} wrote META");
        let mut boot = BootFs::new(&mut b, 0);
        assert_eq!(firmware_tries(&mut boot), Slot::A, "cut {cut}");
        upgrade(&mut boot, &mut m, &v2, 3).unwrap();
        assert_eq!(firmware_tries(&mut boot), Slot::B, "cut {cut}");
    }
}

/// What an upgrade costs the disk: its two files go in a few large writes
/// (gathered cluster runs, [`crate::gather`]) and the order needs only a
/// few syncs; it writes little more than the files and META. The figures
/// are printed (`--nocapture`) for the benchmark notes.
#[test]
fn an_upgrade_writes_its_files_in_few_large_writes() {
    let dir = tempfile::tempdir().unwrap();
    let (b0, m0) = disk(40);
    // Two files of 4 MiB, as a small kernel and initramfs.
    let v2 = payload(dir.path(), "2", 4 << 20);
    let mut b = Faulty::counting(b0);
    let mut m = b.share(m0);
    let up = upgrade(&mut BootFs::new(&mut b, 0), &mut m, &v2, 3).unwrap();
    let files = v2.kernel.len + v2.initramfs.len;
    assert_eq!(up.bytes_written, files);
    let (writes, bytes, syncs) = (b.writes(), b.bytes_written(), b.syncs());
    eprintln!(
        "upgrade of a 40 MiB BOOT, {files} bytes of files: {writes} writes, {bytes} bytes, \
         {syncs} syncs"
    );
    assert!(writes <= 64, "{writes} writes");
    assert!(syncs <= 40, "{syncs} syncs");
    // The files, META's two copies, and BOOT's FAT sectors and entries.
    let meta = AREA_LEN as u64;
    assert!(bytes <= files + meta + (64 << 10), "{bytes} bytes written");
}

/// A Secure Boot disk upgraded to a payload with another boot loader (one
/// signed by a new db key), cut before each of its writes (ESP, BOOT and
/// META): the ESP's boot loader is whole, old or new (new from some cut
/// on, before any of BOOT's writes); the disk boots v1 on A or v2's UKI on
/// B; running the upgrade again finishes it. Refused before any write on
/// a disk without Secure Boot. A disk whose BOOT is the ESP keeps its boot
/// loader.
/// On amd64's ESP and arm64's (`EFI/BOOT/BOOTAA64.EFI`) alike.
#[test]
fn an_upgrade_replacing_the_boot_loader_cut_at_any_write_boots_and_finishes() {
    crate::device::each_loss(|_| {
        for arch in contract::arch::ARCHES.map(|a| a.arch) {
            an_upgrade_replacing_the_boot_loader_cut_at_any_write_boots_and_finishes_under_loss(
                arch,
            )
        }
    });
}

fn an_upgrade_replacing_the_boot_loader_cut_at_any_write_boots_and_finishes_under_loss(
    arch: contract::Arch,
) {
    let firmware_loader = |e: &Dev| loader_at(e, arch).expect("the ESP's boot loader");
    let dir = tempfile::tempdir().unwrap();
    let (b0, mut m0, v1) = uki_disk(16, dir.path());
    let Loaders {
        old: old_loader,
        new: new_loader,
        esp: e0,
        file: loader,
        db,
        v2,
    } = loaders_of(dir.path(), arch);
    let plain_meta = m0.clone();
    let mut meta0 = meta::read(&mut m0).unwrap().0;
    meta0.set(Tag::SecureBoot, db.as_bytes());
    meta::write(&mut m0, &meta0).unwrap();
    let up = |b: &mut Dev, m: &mut Dev, e: &mut Dev, fail_at: Option<u64>| {
        esp_op(b, m, e, fail_at, |esp, boot, meta| {
            upgrade_with_loader(Some(esp), &loader, boot, meta, &v2, 3)
        })
    };
    // Refused before any write on a disk without Secure Boot.
    {
        let (mut b, mut m, mut e) = (b0.clone(), plain_meta.clone(), e0.clone());
        let (r, writes) = up(&mut b, &mut m, &mut e, None);
        let err = r.unwrap_err();
        assert!(
            format!("{err:#}").contains("only on a Secure Boot disk"),
            "{err:#}"
        );
        assert_eq!(writes, 0);
        assert_eq!(
            (b.get_ref(), m.get_ref(), e.get_ref()),
            (b0.get_ref(), plain_meta.get_ref(), e0.get_ref())
        );
    }
    let (mut b, mut m, mut e) = (b0.clone(), m0.clone(), e0.clone());
    let (r, total) = up(&mut b, &mut m, &mut e, None);
    r.unwrap();
    assert_eq!(firmware_loader(&e), new_loader);
    let mut saw = [false, false];
    let mut loader_new_from = None;
    for n in 1..=total {
        let (mut b, mut m, mut e) = (b0.clone(), m0.clone(), e0.clone());
        let (r, _) = up(&mut b, &mut m, &mut e, Some(n));
        assert!(r.is_err(), "cut {n}");
        let got = firmware_loader(&e);
        if !old_or_new(&got, &old_loader, &new_loader, &mut loader_new_from, n) {
            // BOOT and META are untouched until the boot loader is new.
            assert!(b.get_ref() == b0.get_ref(), "cut {n}: BOOT written first");
            assert!(m.get_ref() == m0.get_ref(), "cut {n}: META written first");
        }
        let mut boot = BootFs::new(&mut b, 0);
        let slot = boots_uki(&mut boot, &v1, &v2, n);
        saw[(slot == Slot::B) as usize] = true;
        if slot == Slot::B {
            assert_eq!(
                got, new_loader,
                "cut {n}: slot B switched to before the boot loader"
            );
        }
        assess(&mut boot, &mut m, slot).unwrap();
        drop(boot);
        if slot == Slot::A {
            let (r, _) = up(&mut b, &mut m, &mut e, None);
            r.unwrap_or_else(|err| panic!("cut {n}: {err:#}"));
            let mut boot = BootFs::new(&mut b, 0);
            assert_eq!(boots_uki(&mut boot, &v1, &v2, n), Slot::B, "cut {n}");
        }
        assert_eq!(firmware_loader(&e), new_loader, "cut {n}");
        let said = crate::testutil::fsck(e.get_ref());
        for bad in ["share", "Reclaimed", "Not auto-correcting", "outside a LFN"] {
            assert!(!said.contains(bad), "cut {n}: fsck.fat says:\n{said}");
        }
    }
    assert_eq!(saw, [true, true]);
    assert!(loader_new_from.is_some());

    // A disk whose BOOT is the ESP keeps the boot loader on BOOT.
    let (mut b, mut m) = (b0.clone(), m0.clone());
    {
        let mut boot = BootFs::new(&mut b, 0);
        boot.ensure_dir("EFI/BOOT").unwrap();
        let path = &arch.esp_boot_loader();
        boot.create(path, &mut &old_loader[..], old_loader.len() as u64)
            .unwrap();
    }
    upgrade_with_loader::<Dev, _, _>(None, &loader, &mut BootFs::new(&mut b, 0), &mut m, &v2, 3)
        .unwrap();
    let mut boot = BootFs::new(&mut b, 0);
    assert_eq!(boots_uki(&mut boot, &v1, &v2, 0), Slot::B);
    assert_eq!(
        boot.read(&arch.esp_boot_loader(), 1 << 20).unwrap(),
        old_loader
    );
}
