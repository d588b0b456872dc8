//! End-to-end tests of upgrades, boot counting, rollback and the installer's
//! refusals, booted under OVMF: v1 is the default image, v2 the same system
//! as version 0.2.0, v3 a version 0.3.0 whose runtime stops before ready
//! (`machined.break=ready`), all signed with the development key.

// Test helpers panic on unexpected failures: that is how a test fails.
#![allow(clippy::unwrap_used)]

mod common;

use bootstate::Faulty;
use bootstate::fat::BootFs;
use common::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Builds a variant of the default profile into target/e2e/NAME.
fn build_variant(name: &str, edit: impl Fn(String) -> String, key: &Path) -> Build {
    build_variant_of("metal", name, edit, key)
}

fn build_variant_of(base: &str, name: &str, edit: impl Fn(String) -> String, key: &Path) -> Build {
    let profile = write_profile_from(base, name, edit);
    build_profile(name, &profile, &["--key", &key.display().to_string()])
}

fn version(v: &'static str) -> impl Fn(String) -> String {
    move |t| t.replace("version: 0.1.0", &format!("version: {v}"))
}

struct Images {
    v1: Build,
    v2: Build,
    v3: Build,
}

fn images() -> &'static Images {
    static I: Fixture<Images> = Fixture::new("upgrade-images");
    I.get(|| {
        let v1 = build_variant("upgrade-v1", |t| t, &dev_key());
        // v2 comes as an installer image, v3 as a payload directory.
        let v2 = build_variant_of("installer", "upgrade-v2", version("0.2.0"), &dev_key());
        let v3 = build_variant(
            "upgrade-v3",
            |t| {
                version("0.3.0")(t).replace(
                    "    - vdso32=0\n",
                    "    - vdso32=0\n    - machined.break=ready\n",
                )
            },
            &dev_key(),
        );
        Images { v1, v2, v3 }
    })
}

/// A fresh copy of the v1 disk (sparse).
fn disk_copy(name: &str) -> PathBuf {
    sparse_copy(&images().v1.artifact("raw"), name)
}

/// What an upgrade installs: the build's installer image when it made one,
/// else its output directory (whose signed manifest lists the kernel and
/// initramfs too).
fn payload(b: &Build) -> PathBuf {
    let tar = b.dir.join("installer.tar");
    if tar.is_file() { tar } else { b.dir.clone() }
}

fn upgrade(disk: &Path, installer: &Path) -> Value {
    let r = serde_json::from_str(&ok(imager()
        .args(["upgrade", "--json", "--installer"])
        .arg(installer)
        .arg("--disk")
        .arg(disk)))
    .unwrap();
    check_gpt(disk);
    r
}

fn rollback(disk: &Path, force: bool) -> Output2 {
    let mut c = imager();
    c.args(["rollback", "--json", "--disk"]).arg(disk);
    if force {
        c.arg("--force");
    }
    let out = run(&mut c);
    check_gpt(disk);
    Output2 {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

struct Output2 {
    ok: bool,
    stdout: String,
    stderr: String,
}

/// Boots `disk`, keeping what the guest writes; returns the report and the
/// whole console.
fn boot(disk: &Path, reboots: bool) -> (Value, String) {
    boot_under(disk, reboots, "uefi")
}

/// [`boot`] under `firmware` (`uefi`: OVMF and systemd-boot; `bios`:
/// SeaBIOS and GRUB).
fn boot_under(disk: &Path, reboots: bool, firmware: &str) -> (Value, String) {
    boot_with(disk, reboots, &["--firmware", firmware])
}

/// [`boot`] with `args` for `imager boot` (the firmware, the bus).
fn boot_with(disk: &Path, reboots: bool, args: &[&str]) -> (Value, String) {
    boot_written(disk, reboots, args)
}

fn inspect(disk: &Path) -> Value {
    let out = run(imager().args(["inspect", "--json"]).arg(disk));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn slot_of(report: &Value) -> (String, String) {
    (
        report["version"].as_str().unwrap().to_string(),
        report["slot"].as_str().unwrap().to_string(),
    )
}

fn slot_status(r: &Value, slot: &str) -> String {
    r["slots"]["slots"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["slot"] == slot)
        .unwrap()["status"]
        .as_str()
        .unwrap()
        .to_string()
}

/// `boot=` and `first-version=` of the last storage line of a console: the
/// runtime appends a line to /var/log/machined/boots at every boot and
/// reports the count and the version that wrote the first line.
fn var_log(console: &str) -> (u32, String) {
    let line = console
        .lines()
        .rfind(|l| l.starts_with("machined: storage "))
        .unwrap_or_else(|| panic!("no storage line in:\n{console}"));
    let field = |k: &str| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(k))
            .unwrap_or_else(|| panic!("no {k} in {line}"))
            .to_string()
    };
    (field("boot=").parse().unwrap(), field("first-version="))
}

#[test]
fn upgrade_bless_manual_rollback_and_fallback_from_a_broken_version() {
    let i = images();
    let disk = disk_copy("upgrade-scenario");
    // /var (EPHEMERAL) keeps its boot log through every boot below: written
    // first by v1, it is read by v2, v1 again after a rollback, and so on.
    let mut boots = 0;
    let mut var_kept = |console: &str| {
        let (n, first) = var_log(console);
        assert!(n > boots, "boot log went from {boots} to {n}:\n{console}");
        assert_eq!(first, "0.1.0", "{console}");
        boots = n;
    };
    let (r, console) = boot(&disk, false);
    assert_eq!(slot_of(&r), ("0.1.0".into(), "A".into()));
    var_kept(&console);

    // v1 -> v2: the trial boot is blessed, and the next boot stays on v2.
    let up = upgrade(&disk, &payload(&i.v2));
    assert_eq!(
        (&up["from_slot"], &up["to_slot"]),
        (&"A".into(), &"B".into())
    );
    assert_eq!(up["entry"], "g00000002-slot-b+3-0.conf");
    let s = inspect(&disk);
    assert_eq!(slot_status(&s, "B"), "pending");
    assert_eq!(s["slots"]["boots_next"], "B");
    let (r, console) = boot(&disk, false);
    assert_eq!(slot_of(&r), ("0.2.0".into(), "B".into()));
    assert!(
        console.contains("machined: blessed slot B (0.2.0): the upgrade from 0.1.0 succeeded"),
        "{console}"
    );
    var_kept(&console);
    let s = inspect(&disk);
    assert_eq!(slot_status(&s, "B"), "good");
    assert_eq!(s["slots"]["pending_upgrade"], Value::Null);
    let (r, console) = boot(&disk, false);
    assert_eq!(slot_of(&r), ("0.2.0".into(), "B".into()));
    assert!(!console.contains("on trial"), "{console}");
    var_kept(&console);

    // A manual rollback boots v1, and another one v2 again.
    let rb = rollback(&disk, false);
    assert!(rb.ok, "{}", rb.stderr);
    let (r, console) = boot(&disk, false);
    assert_eq!(slot_of(&r), ("0.1.0".into(), "A".into()));
    var_kept(&console);
    assert!(rollback(&disk, false).ok);
    let (r, console) = boot(&disk, false);
    assert_eq!(slot_of(&r), ("0.2.0".into(), "B".into()));
    var_kept(&console);

    // v2 -> v3, which never reaches ready: after its tries the machine is
    // back on v2 by itself and says so.
    let up = upgrade(&disk, &payload(&i.v3));
    assert_eq!(
        (&up["from_slot"], &up["to_slot"]),
        (&"B".into(), &"A".into())
    );
    let (r, console) = boot(&disk, true);
    assert_eq!(slot_of(&r), ("0.2.0".into(), "B".into()));
    assert_eq!(r["failed_boots"], 3, "{console}");
    assert_eq!(
        console
            .matches("machined: fatal: machined.break=ready")
            .count(),
        3,
        "{console}"
    );
    assert!(
        console.contains(
            "machined: rollback: the upgrade to slot A (0.3.0) failed: it failed to reach \
             ready in 3 tries; running slot B (0.2.0)"
        ),
        "{console}"
    );
    var_kept(&console);
    let s = inspect(&disk);
    assert_eq!(slot_status(&s, "A"), "bad");
    assert_eq!(s["slots"]["default"], "B");
    let history = s["slots"]["history"].to_string();
    assert!(
        history.contains("upgrade-failed slot=A version=0.3.0 reason=tries-exhausted tries=3"),
        "{history}"
    );
    let a = &s["slots"]["slots"][0];
    assert_eq!((&a["tries_left"], &a["tries_done"]), (&0.into(), &3.into()));

    // A bad slot is not rolled back to unless forced.
    let rb = rollback(&disk, false);
    assert!(!rb.ok && rb.stderr.contains("marked bad"), "{}", rb.stderr);
    let (r, console) = boot(&disk, false);
    assert_eq!(slot_of(&r), ("0.2.0".into(), "B".into()));
    var_kept(&console);
    let _ = rb.stdout;
}

/// A 4Kn disk (4096-byte logical sectors, on QEMU's NVMe controller)
/// installed by `imager install --sector-size 4096` boots under OVMF,
/// upgrades (blessed at the trial boot), rolls back by hand, and falls back
/// by itself from a version that never reaches ready, as a disk of 512-byte
/// sectors does (BOOT is its ESP: `contract::partition::esp_role`).
#[test]
fn a_4kn_disk_installed_by_imager_install_upgrades_rolls_back_and_falls_back() {
    let i = images();
    let disk = scratch().join("install-4kn.raw");
    let _ = std::fs::remove_file(&disk);
    let report: Value = serde_json::from_str(&ok(imager()
        .args(["install", "--json", "--sector-size", "4096", "--installer"])
        .arg(payload(&i.v1))
        .arg("--disk")
        .arg(&disk)))
    .unwrap();
    // BIOS boot reads 512-byte sectors: no GRUB on a 4Kn disk.
    assert_eq!(report["bios_boot"], false, "{report}");
    assert_eq!(gpt_sector_size(&disk), 4096);
    check_gpt(&disk);
    let nvme = |reboots| boot_with(&disk, reboots, &["--bus", "nvme"]);
    let (r, _) = nvme(false);
    assert_eq!(slot_of(&r), ("0.1.0".into(), "A".into()));

    let up = upgrade(&disk, &payload(&i.v2));
    assert_eq!(up["to_slot"], "B");
    let (r, console) = nvme(false);
    assert_eq!(slot_of(&r), ("0.2.0".into(), "B".into()));
    assert!(
        console.contains("machined: blessed slot B (0.2.0): the upgrade from 0.1.0 succeeded"),
        "{console}"
    );

    let rb = rollback(&disk, false);
    assert!(rb.ok, "{}", rb.stderr);
    let (r, _) = nvme(false);
    assert_eq!(slot_of(&r), ("0.1.0".into(), "A".into()));

    let up = upgrade(&disk, &payload(&i.v3));
    assert_eq!(up["to_slot"], "B");
    let (r, console) = nvme(true);
    assert_eq!(slot_of(&r), ("0.1.0".into(), "A".into()));
    assert_eq!(r["failed_boots"], 3, "{console}");
    assert!(
        console.contains(
            "machined: rollback: the upgrade to slot B (0.3.0) failed: it failed to reach \
             ready in 3 tries; running slot A (0.1.0)"
        ),
        "{console}"
    );
    assert_eq!(slot_status(&inspect(&disk), "B"), "bad");
}

/// Profile edit: the slots boot UKIs (`boot.uki`).
fn uki_slots(t: String) -> String {
    t.replace("\noutputs: [", "\nboot:\n  uki: true\n\noutputs: [")
}

/// Slots that boot UKIs (type #2 entries in BOOT's EFI/Linux, the command
/// line inside): the A-B model as with `.conf` entries, under OVMF. v1 boots
/// slot A's UKI; an upgrade from an installer image writes slot B's UKI as
/// the switch, blessed at its first boot; a rollback boots A's again; an
/// upgrade that never reaches ready falls back by itself.
#[test]
fn uki_slots_upgrade_bless_roll_back_and_fall_back() {
    let v1 = build_variant("uki-v1", uki_slots, &dev_key());
    let v2 = build_variant_of(
        "installer",
        "uki-v2",
        |t| uki_slots(version("0.2.0")(t)),
        &dev_key(),
    );
    let v3 = build_variant(
        "uki-v3",
        |t| {
            uki_slots(version("0.3.0")(t)).replace(
                "    - vdso32=0\n",
                "    - vdso32=0\n    - machined.break=ready\n",
            )
        },
        &dev_key(),
    );
    for slot in ["a", "b"] {
        assert!(v1.dir.join(format!("uki-{slot}.efi")).is_file());
    }
    let disk = sparse_copy(&v1.artifact("raw"), "uki-scenario");
    let s = inspect(&disk);
    let entries = s["entries"].to_string();
    assert!(
        entries.contains("EFI/Linux/g00000001-slot-a.efi") && !entries.contains(".conf"),
        "{entries}"
    );
    let (r, _) = boot(&disk, false);
    assert_eq!(slot_of(&r), ("0.1.0".into(), "A".into()));

    let up = upgrade(&disk, &payload(&v2));
    assert_eq!(up["entry"], "g00000002-slot-b+3-0.efi");
    let (r, console) = boot(&disk, false);
    assert_eq!(slot_of(&r), ("0.2.0".into(), "B".into()));
    assert!(
        console.contains("machined: blessed slot B (0.2.0): the upgrade from 0.1.0 succeeded"),
        "{console}"
    );
    assert!(
        inspect(&disk)["entries"]
            .to_string()
            .contains("g00000002-slot-b.efi")
    );

    let rb = rollback(&disk, false);
    assert!(rb.ok, "{}", rb.stderr);
    let (r, _) = boot(&disk, false);
    assert_eq!(slot_of(&r), ("0.1.0".into(), "A".into()));

    let up = upgrade(&disk, &payload(&v3));
    assert_eq!(up["to_slot"], "B");
    let (r, console) = boot(&disk, true);
    assert_eq!(slot_of(&r), ("0.1.0".into(), "A".into()));
    assert_eq!(r["failed_boots"], 3, "{console}");
    assert_eq!(slot_status(&inspect(&disk), "B"), "bad");
}

/// The same state under both boot loaders: an upgrade tried and blessed
/// under SeaBIOS (GRUB) boots on under OVMF (systemd-boot) on the same slot,
/// a rollback made after it boots the same slot under either, and a broken
/// upgrade falls back by itself under GRUB after its tries.
#[test]
fn upgrade_rollback_and_fallback_under_seabios_agree_with_ovmf() {
    let i = images();
    let disk = disk_copy("upgrade-bios");
    let (r, console) = boot_under(&disk, false, "bios");
    assert_eq!(slot_of(&r), ("0.1.0".into(), "A".into()));
    assert!(console.contains("machined.trial=0"), "{console}");

    upgrade(&disk, &payload(&i.v2));
    let (r, console) = boot_under(&disk, false, "bios");
    assert_eq!(slot_of(&r), ("0.2.0".into(), "B".into()));
    assert!(console.contains("machined.trial=1"), "{console}");
    assert!(
        console.contains("machined: blessed slot B (0.2.0): the upgrade from 0.1.0 succeeded"),
        "{console}"
    );
    let s = inspect(&disk);
    assert_eq!(slot_status(&s, "B"), "good");
    // Blessed under GRUB, the same slot under systemd-boot, not a trial.
    let (r, console) = boot_under(&disk, false, "uefi");
    assert_eq!(slot_of(&r), ("0.2.0".into(), "B".into()));
    assert!(!console.contains("on trial"), "{console}");

    // A rollback: slot A under either firmware.
    assert!(rollback(&disk, false).ok);
    let (r, _) = boot_under(&disk, false, "bios");
    assert_eq!(slot_of(&r), ("0.1.0".into(), "A".into()));
    let (r, _) = boot_under(&disk, false, "uefi");
    assert_eq!(slot_of(&r), ("0.1.0".into(), "A".into()));

    // A broken upgrade: GRUB counts its tries down and boots A again.
    upgrade(&disk, &payload(&i.v3));
    let (r, console) = boot_under(&disk, true, "bios");
    assert_eq!(slot_of(&r), ("0.1.0".into(), "A".into()));
    assert_eq!(r["failed_boots"], 3, "{console}");
    assert!(
        console.contains("machined: rollback: the upgrade to slot B (0.3.0) failed"),
        "{console}"
    );
    let s = inspect(&disk);
    assert_eq!(slot_status(&s, "B"), "bad");
    let (r, _) = boot_under(&disk, false, "uefi");
    assert_eq!(slot_of(&r), ("0.1.0".into(), "A".into()));
}

#[test]
fn tampered_and_foreign_payloads_and_a_full_boot_are_refused_with_nothing_written() {
    let i = images();
    let disk = disk_copy("upgrade-refusals");
    let before = sha256(&disk);
    let refused = |installer: &Path, what: &str| {
        let out = run(imager()
            .args(["upgrade", "--installer"])
            .arg(installer)
            .arg("--disk")
            .arg(&disk));
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!out.status.success(), "{what} was accepted");
        assert_eq!(sha256(&disk), before, "{what}: the disk changed");
        err
    };

    // One flipped byte in the installer image, then in a payload directory.
    let tampered_tar = scratch().join("upgrade-tampered.tar");
    std::fs::copy(payload(&i.v2), &tampered_tar).unwrap();
    let mut bytes = std::fs::read(&tampered_tar).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0x40;
    std::fs::write(&tampered_tar, bytes).unwrap();
    let err = refused(&tampered_tar, "a tampered installer image");
    assert!(err.contains("does not match its digest"), "{err}");
    let tampered = scratch().join("upgrade-tampered");
    let _ = std::fs::remove_dir_all(&tampered);
    let _ = std::fs::remove_file(&tampered);
    ok(Command::new("cp").arg("-r").arg(&i.v2.dir).arg(&tampered));
    let initramfs = tampered.join("initramfs.zst");
    let mut bytes = std::fs::read(&initramfs).unwrap();
    bytes[1000] ^= 0x40;
    std::fs::write(&initramfs, bytes).unwrap();
    let err = refused(&tampered, "a tampered payload");
    assert!(err.contains("initramfs.zst"), "{err}");

    // Signed by another key.
    let other = scratch().join("upgrade-other-key");
    std::fs::create_dir_all(&other).unwrap();
    let other_key = other.join("other.key");
    let _ = std::fs::remove_file(&other_key);
    let _ = std::fs::remove_file(other.join("other.pub"));
    ok(imager()
        .args(["keygen", "--private"])
        .arg(&other_key)
        .arg("--public")
        .arg(other.join("other.pub")));
    let foreign = build_variant("upgrade-foreign", version("0.2.0"), &other_key);
    let err = refused(&foreign.dir, "a payload signed by another key");
    assert!(
        err.contains("not signed by a key this disk trusts"),
        "{err}"
    );

    // Another system, signed by the trusted key.
    let stranger = build_variant(
        "upgrade-stranger",
        |t| version("0.2.0")(t).replace("name: metal", "name: other"),
        &dev_key(),
    );
    let err = refused(&stranger.dir, "a payload of another system");
    assert!(err.contains("is for the system \"other\""), "{err}");

    // BOOT without room: all but 2 MiB of it taken by something else.
    {
        let slots = imager::install::open_slots(&disk).unwrap();
        let mut fs = BootFs::new(slots.boot, 0);
        let (free, _) = fs.space().unwrap();
        let junk = free - (2 << 20);
        let mut src = std::io::Read::take(std::io::repeat(0), junk);
        fs.create("junk.bin", &mut src, junk).unwrap();
    }
    let full = sha256(&disk);
    let out = run(imager()
        .args(["upgrade", "--installer"])
        .arg(payload(&i.v2))
        .arg("--disk")
        .arg(&disk));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("BOOT has no room") && err.contains("nothing was written"),
        "{err}"
    );
    assert_eq!(sha256(&disk), full, "a refused upgrade changed the disk");
    let (r, _) = boot(&disk, false);
    assert_eq!(slot_of(&r), ("0.1.0".into(), "A".into()));
}

/// The v1 disk booted once under OVMF (its first boot formats STATE and
/// EPHEMERAL): what the cut sweeps copy, so that no cut boot formats them
/// again. A node upgrades from a disk that has booted, too.
fn booted_v1() -> &'static PathBuf {
    static D: Fixture<PathBuf> = Fixture::new("upgrade-v1-booted");
    D.get(|| {
        let disk = disk_copy("upgrade-v1-booted");
        let (r, console) = boot(&disk, false);
        assert_eq!(slot_of(&r), ("0.1.0".into(), "A".into()), "{console}");
        assert_eq!(r["ready"], true, "{console}");
        disk
    })
}

/// The cut points a sweep boots under firmware: the first write, the last
/// cut (after every write), each point where what the loaders boot next
/// changes and the one before it, and `extra` more chosen by the run's seed
/// ([`test_seed`], printed) from the rest. Every other point is checked
/// offline only (each cut's loaders read off the disk), and `bootstate`'s
/// unit tests cut before every single write.
fn cuts_to_boot(views: &[(u64, String, String)], extra: usize, what: &str) -> Vec<u64> {
    let last = views.last().expect("at least one cut").0;
    let mut points = vec![1, last];
    for w in views.windows(2) {
        if (&w[0].1, &w[0].2) != (&w[1].1, &w[1].2) {
            points.extend([w[0].0, w[1].0]);
        }
    }
    let rest: Vec<u64> = views
        .iter()
        .map(|v| v.0)
        .filter(|n| !points.contains(n))
        .collect();
    points.extend(sample(&rest, extra, test_seed(), what));
    points.sort_unstable();
    points.dedup();
    points
}

/// Cuts the power before each write of an upgrade in turn (v1 to v2, from
/// an installer image), and after the last. Every cut disk is read offline:
/// what systemd-boot and GRUB boot next, each switching once, systemd-boot
/// first. The cuts where that changes, the first, the last and a seeded
/// sample of the rest boot under OVMF and a copy under SeaBIOS: always v1
/// or v2, each as its loader's rendering on the disk says, and v2 only
/// once the switch is written; GRUB at most one boot behind (below).
#[test]
fn an_upgrade_interrupted_at_any_point_leaves_a_bootable_disk() {
    let i = images();
    let base = booted_v1();
    let run_upgrade =
        |disk: &Path, fail_at: Option<u64>| cut_upgrade(disk, &payload(&i.v2), fail_at, false);
    let probe = sparse_copy(base, "upgrade-cut-probe");
    let (done, total) = run_upgrade(&probe, None);
    assert!(done && total > 20, "{total} writes");
    assert_eq!(loaders_next(&probe), ("B".into(), "B".into()));

    // Every cut, offline.
    let mut views = Vec::new();
    for n in 1..=total + 1 {
        let what = format!("cut before write {n} of {total}");
        let disk = sparse_copy(base, "upgrade-cut");
        let (done, writes) = run_upgrade(&disk, Some(n));
        assert_eq!(done, n > total, "{what}");
        assert_eq!(writes, (n - 1).min(total), "{what}");
        let (sd, grub) = loaders_next(&disk);
        assert!(
            matches!(
                (sd.as_str(), grub.as_str()),
                ("A", "A") | ("B", "A") | ("B", "B")
            ),
            "{what}: systemd-boot boots {sd}, GRUB {grub}"
        );
        if let Some((m, psd, pgrub)) = views.last() {
            let back = (psd == "B" && sd == "A") || (pgrub == "B" && grub == "A");
            assert!(!back, "{what}: back to A after B at cut {m}");
        }
        views.push((n, sd, grub));
    }
    assert_eq!(
        views.last().map(|v| (v.1.as_str(), v.2.as_str())),
        Some(("B", "B"))
    );
    let points = cuts_to_boot(&views, 3, "upgrade cuts");
    eprintln!(
        "an upgrade makes {total} writes; booting the cuts before writes {points:?} \
         (IMAGER_TEST_SEED={})",
        test_seed()
    );

    for n in points {
        let what = format!("cut before write {n} of {total}");
        let (_, sd, grub) = views[n as usize - 1].clone();
        let disk = sparse_copy(base, "upgrade-cut");
        let (done, _) = run_upgrade(&disk, Some(n));
        assert_eq!(done, n > total, "{what}");
        // The same cut disk under SeaBIOS (GRUB), from a copy.
        let bios = sparse_copy(&disk, "upgrade-cut-bios");
        let version = |slot: &str| if slot == "A" { "0.1.0" } else { "0.2.0" };
        let (r, console) = boot(&disk, false);
        assert_eq!(r["ready"], true, "{what}: {console}");
        assert_eq!(
            slot_of(&r),
            (version(&sd).into(), sd.clone()),
            "{what}: OVMF: {console}"
        );
        if sd == "B" {
            assert!(console.contains("blessed slot B"), "{what}: {console}");
        }
        // GRUB boots its slot: the same, or (a cut between systemd-boot's
        // switch and GRUB's) the old one once, whose runtime finishes the
        // switch: the next boot is the new slot.
        let (rb, cb) = boot_under(&bios, false, "bios");
        assert_eq!(rb["ready"], true, "{what}: {cb}");
        assert_eq!(
            slot_of(&rb),
            (version(&grub).into(), grub.clone()),
            "{what}: SeaBIOS: {cb}"
        );
        if grub != sd {
            assert!(
                cb.contains("GRUB's switch to slot B finished"),
                "{what}: {cb}"
            );
            let (rb, cb) = boot_under(&bios, false, "bios");
            assert_eq!(
                slot_of(&rb),
                (version(&sd).into(), sd.clone()),
                "{what}: the second SeaBIOS boot: {cb}"
            );
        }
        let fsck = boot_fsck_beyond_a_cut(&disk);
        assert!(fsck.is_empty(), "{what}: fsck.fat reports {fsck:#?}");
    }
}

/// What fsck.fat finds on BOOT beyond what a cut leaves by design (the
/// dirty flag, clusters no file uses yet, one FAT copy ahead of the other,
/// the long-name entries of a file whose short entry a removal already
/// marked deleted, which it deletes itself: `bootstate::fatfix::remove_file`
/// marks the short entry first): a damaged entry, shared clusters... Empty
/// when nothing; else its lines, then its whole output.
fn boot_fsck_beyond_a_cut(disk: &Path) -> Vec<String> {
    let fsck = run(tool("fsck.fat").arg("-n").arg(extract_boot(disk)));
    let text = String::from_utf8_lossy(&fsck.stdout);
    const BENIGN: [&str; 8] = [
        "fsck.fat ",
        "Dirty bit is set",
        "Automatically removing dirty bit",
        "Reclaimed ",
        "FATs differ but appear to be intact",
        "Using first FAT",
        "Leaving filesystem unchanged",
        "Orphaned long file name part",
    ];
    let mut last = "";
    let mut found = Vec::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let benign = BENIGN.iter().any(|b| line.starts_with(b))
            || line.contains(" files, ")
            || (line == "Auto-deleting." && last.starts_with("Orphaned long file name part"));
        if !benign {
            found.push(line.to_string());
        }
        last = line;
    }
    if !found.is_empty() {
        found.push(text.into_owned());
    }
    found
}

fn extract_boot(disk: &Path) -> PathBuf {
    let dest = disk.with_extension("boot.img");
    extract_partition(disk, "BOOT", &dest);
    dest
}

/// The slot each loader boots next, read off the disk as they read it:
/// systemd-boot's first entry, and GRUB's choice from `grub/grub.cfg` and
/// its environment block.
fn loaders_next(disk: &Path) -> (String, String) {
    let mut slots = imager::install::open_slots(disk).unwrap();
    let mut boot = BootFs::new(slots.boot, 0);
    let st = bootstate::ops::status(&mut boot, &mut slots.meta).unwrap();
    let sd = st
        .next_boot()
        .unwrap_or_else(|| panic!("{}: no bootable entry", disk.display()));
    let grub = bootstate::grubenv::read(&mut boot).unwrap();
    (sd.slot.name().to_string(), grub.choice().name().to_string())
}

/// Cuts the power before each write of a rollback in turn (v2 blessed on
/// slot B back to v1 on slot A), and after the last; reads every cut disk
/// offline (fsck.fat, what each loader boots next) and boots the cuts
/// [`cuts_to_boot`] picks under OVMF and a copy under SeaBIOS. Each boots
/// to ready, on v2 from B (the rollback not yet effective) or v1 from A, as
/// its loader's rendering on the disk says; once a cut boots A, no later
/// cut boots B.
/// The two loaders switch by one write each, systemd-boot first: a cut
/// between the two (and only there) boots A under OVMF and B under SeaBIOS
/// once, whose runtime brings GRUB to META (docs/design.md, "Two renderings
/// of one state"); the next SeaBIOS boot is A.
#[test]
fn a_rollback_interrupted_at_any_point_leaves_a_bootable_disk() {
    let i = images();
    // v2 installed and blessed on B (one boot), v1 still good on A.
    let base = disk_copy("rollback-cut-base");
    upgrade(&base, &payload(&i.v2));
    let (r, console) = boot(&base, false);
    assert_eq!(slot_of(&r), ("0.2.0".into(), "B".into()));
    assert!(console.contains("blessed slot B (0.2.0)"), "{console}");
    let s = inspect(&base);
    assert_eq!(
        (slot_status(&s, "A"), slot_status(&s, "B")),
        ("good".into(), "good".into())
    );
    assert_eq!(loaders_next(&base), ("B".into(), "B".into()));

    // The rollback as `imager rollback` makes it, on counted devices.
    let run_rollback = |disk: &Path, fail_at: Option<u64>| -> (bool, u64) {
        let slots = imager::install::open_slots(disk).unwrap();
        let b = match fail_at {
            Some(n) => Faulty::failing_at(slots.boot, n),
            None => Faulty::counting(slots.boot),
        };
        let mut m = b.share(slots.meta);
        let r = bootstate::ops::rollback(&mut BootFs::new(b, 0), &mut m, false, false);
        match &r {
            Ok(rb) => assert_eq!(
                (rb.from.name(), rb.to.name(), rb.version.as_str()),
                ("B", "A", "0.1.0")
            ),
            Err(e) => {
                let chain = format!("{e:#}");
                assert!(chain.contains("simulated power cut"), "{chain}");
            }
        }
        (r.is_ok(), m.writes())
    };
    let probe = sparse_copy(&base, "rollback-cut-probe");
    let (done, total) = run_rollback(&probe, None);
    assert!(done && total > 2, "{total} writes");
    assert_eq!(loaders_next(&probe), ("A".into(), "A".into()));
    eprintln!("a rollback makes {total} writes: cutting before each, then none");

    let version = |slot: &str| if slot == "A" { "0.1.0" } else { "0.2.0" };
    // Every cut, offline: fsck.fat and what each loader boots next.
    let mut views = Vec::new();
    let mut fsck_found = Vec::new();
    for n in 1..=total + 1 {
        let what = format!("cut before write {n} of {total}");
        let disk = sparse_copy(&base, "rollback-cut");
        let (done, writes) = run_rollback(&disk, Some(n));
        assert_eq!(done, n > total, "{what}");
        assert_eq!(writes, (n - 1).min(total), "{what}");
        // What fsck.fat finds, asserted after every cut was read.
        let fsck = boot_fsck_beyond_a_cut(&disk);
        if !fsck.is_empty() {
            eprintln!("{what}: fsck.fat reports {:?}", &fsck[..fsck.len() - 1]);
            fsck_found.push((what.clone(), fsck));
        }
        // What each loader boots, as the disk says: systemd-boot switches
        // first, so only (B, B), (A, B) and (A, A).
        let (sd, grub) = loaders_next(&disk);
        assert!(
            matches!(
                (sd.as_str(), grub.as_str()),
                ("B", "B") | ("A", "B") | ("A", "A")
            ),
            "{what}: systemd-boot boots {sd}, GRUB {grub}"
        );
        if n > total {
            assert_eq!((sd.as_str(), grub.as_str()), ("A", "A"), "{what}");
        }
        views.push((n, sd, grub));
    }
    assert!(
        fsck_found.is_empty(),
        "fsck.fat finds more on BOOT than a cut leaves by design: {fsck_found:#?}"
    );
    // Once a cut boots A, no later cut boots B.
    let a_from = views
        .iter()
        .find(|v| v.1 == "A")
        .map(|v| v.0)
        .expect("the last cut boots A");
    assert!(a_from > 1, "the first cut boots A");
    assert!(
        views.iter().all(|v| (v.1 == "A") == (v.0 >= a_from)),
        "B after A: {views:?}"
    );
    // The loaders differ from systemd-boot's switch to GRUB's, and only
    // there: the cuts from the first that boots A, one after the other.
    let window: Vec<u64> = views.iter().filter(|v| v.1 != v.2).map(|v| v.0).collect();
    let to = a_from + window.len() as u64;
    assert!(
        !window.is_empty() && window == (a_from..to).collect::<Vec<_>>(),
        "cuts where the loaders differ: {window:?} (A from cut {a_from})"
    );

    let points = cuts_to_boot(&views, 2, "rollback cuts");
    eprintln!(
        "a rollback makes {total} writes; booting the cuts before writes {points:?} \
         (IMAGER_TEST_SEED={})",
        test_seed()
    );
    for n in points {
        let what = format!("cut before write {n} of {total}");
        let (_, sd, grub) = views[n as usize - 1].clone();
        let disk = sparse_copy(&base, "rollback-cut");
        let (done, _) = run_rollback(&disk, Some(n));
        assert_eq!(done, n > total, "{what}");
        let bios = sparse_copy(&disk, "rollback-cut-bios");

        // Under OVMF: systemd-boot's slot, to ready; the runtime brings META
        // and GRUB to it.
        let (r, console) = boot(&disk, false);
        assert_eq!(r["ready"], true, "{what}: {console}");
        assert_eq!(r["failed_boots"], 0, "{what}: {console}");
        assert_eq!(
            slot_of(&r),
            (version(&sd).into(), sd.clone()),
            "{what}: OVMF: {console}"
        );
        assert_eq!(inspect(&disk)["slots"]["default"], sd.as_str(), "{what}");
        assert_eq!(loaders_next(&disk), (sd.clone(), sd.clone()), "{what}");

        // Under SeaBIOS: GRUB's slot, to ready.
        let (rb, cb) = boot_under(&bios, false, "bios");
        assert_eq!(rb["ready"], true, "{what}: {cb}");
        assert_eq!(rb["failed_boots"], 0, "{what}: {cb}");
        assert_eq!(
            slot_of(&rb),
            (version(&grub).into(), grub.clone()),
            "{what}: SeaBIOS: {cb}"
        );
        const FOLLOWED: &str = "GRUB's rendering brought in line with META";
        if grub != sd {
            // The window between the two switches: this boot of B brought
            // GRUB to META (A), and the next SeaBIOS boot is A.
            assert!(cb.contains(FOLLOWED), "{what}: {cb}");
            assert_eq!(loaders_next(&bios), (sd.clone(), sd.clone()), "{what}");
            let (rb, cb) = boot_under(&bios, false, "bios");
            assert_eq!(rb["ready"], true, "{what}: {cb}");
            assert_eq!(
                slot_of(&rb),
                (version(&sd).into(), sd.clone()),
                "{what}: the second SeaBIOS boot: {cb}"
            );
        } else {
            assert!(!cb.contains(FOLLOWED), "{what}: {cb}");
        }
        assert_eq!(inspect(&bios)["slots"]["default"], sd.as_str(), "{what}");
        assert_eq!(loaders_next(&bios), (sd.clone(), sd.clone()), "{what}");
        eprintln!("{what}: OVMF boots {sd}, SeaBIOS {grub}");
    }
}

/// The installer taken out of its image by umoci runs as the image's
/// entrypoint would (called `installer`, its own payload at
/// /usr/install/amd64: here in a chroot of the unpacked root) and upgrades a
/// disk image that then boots the new version.
#[test]
fn the_installer_unpacked_by_umoci_upgrades_a_disk_image() {
    let i = images();
    let root = unpack_installer(&i.v2, "upgrade-unpacked");
    let disk = disk_copy("upgrade-by-installer");
    let inside = root.join("disk.raw");
    std::fs::hard_link(&disk, &inside).unwrap();
    let out = ok(tool("chroot").arg(&root).args([
        "/usr/bin/installer",
        "upgrade",
        "--json",
        "--disk",
        "/disk.raw",
    ]));
    let r: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (&r["to_slot"], &r["to_version"]),
        (&"B".into(), &"0.2.0".into())
    );
    std::fs::remove_file(&inside).unwrap();
    let (r, _) = boot(&disk, false);
    assert_eq!(slot_of(&r), ("0.2.0".into(), "B".into()));
}

/// `imager install` lays out a blank disk from an installer image: a new
/// image file of the size asked, and an existing blank file of its own size.
/// Both boot the installed version from slot A, with EPHEMERAL to the end.
#[test]
fn install_lays_out_a_blank_disk_that_boots_the_payload() {
    let i = images();
    let pubkey = repo().join("out/keys/dev.pub");
    let fresh = scratch().join("upgrade-install-new.raw");
    let blank = scratch().join("upgrade-install-blank.raw");
    let _ = std::fs::remove_file(&fresh);
    let _ = std::fs::remove_file(&blank);
    ok(Command::new("truncate").args(["-s", "2G"]).arg(&blank));
    for (disk, size) in [(&fresh, Some("3GiB")), (&blank, None)] {
        let mut c = imager();
        c.args(["install", "--json", "--installer"])
            .arg(payload(&i.v2))
            .arg("--disk")
            .arg(disk)
            .arg("--key")
            .arg(&pubkey);
        if let Some(s) = size {
            c.args(["--size", s]);
        }
        let r: Value = serde_json::from_str(&ok(&mut c)).unwrap();
        check_gpt(disk);
        assert_eq!((&r["slot"], &r["version"]), (&"A".into(), &"0.2.0".into()));
        assert_eq!(r["bios_boot"], true, "GRUB from the payload: {r}");
        let want = if size.is_some() { 3u64 << 30 } else { 2 << 30 };
        assert_eq!(std::fs::metadata(disk).unwrap().len(), want);
        let sf: Value = serde_json::from_str(&ok(tool("sfdisk").arg("--json").arg(disk))).unwrap();
        let parts = sf["partitiontable"]["partitions"].as_array().unwrap();
        let last = parts.last().unwrap();
        assert_eq!(last["name"], "EPHEMERAL");
        let end = (last["start"].as_u64().unwrap() + last["size"].as_u64().unwrap()) * 512;
        assert_eq!(end, want - (1 << 20), "EPHEMERAL ends before the last MiB");
        let s = inspect(disk);
        assert_eq!(slot_status(&s, "A"), "good");
        assert_eq!(s["entries"][0]["title"], "Imager 0.2.0 (slot A)", "{s}");
        assert!(
            s["slots"]["history"][0]
                .as_str()
                .unwrap()
                .contains("install slot=A version=0.2.0"),
            "{s}"
        );
        // Under SeaBIOS first (GRUB from the payload, a throw-away
        // overlay), then under OVMF.
        let r: Value = serde_json::from_str(&ok(imager()
            .args([
                "boot",
                "--quiet",
                "--json",
                "--timeout",
                "900",
                "--firmware",
                "bios",
            ])
            .arg(disk)))
        .unwrap();
        assert_eq!(slot_of(&r), ("0.2.0".into(), "A".into()));
        assert_eq!(r["firmware"], "bios");
        let (r, _) = boot(disk, false);
        assert_eq!(slot_of(&r), ("0.2.0".into(), "A".into()));
    }
    // A payload the given key did not sign is refused, and no disk appears.
    let keys = scratch().join("upgrade-install-key");
    let _ = std::fs::remove_dir_all(&keys);
    std::fs::create_dir_all(&keys).unwrap();
    ok(imager()
        .args(["keygen", "--private"])
        .arg(keys.join("k.key"))
        .arg("--public")
        .arg(keys.join("k.pub")));
    let refused = scratch().join("upgrade-install-refused.raw");
    let _ = std::fs::remove_file(&refused);
    let out = run(imager()
        .args(["install", "--installer"])
        .arg(payload(&i.v2))
        .arg("--disk")
        .arg(&refused)
        .arg("--key")
        .arg(keys.join("k.pub")));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("not signed by"),
        "{err}"
    );
    assert!(!refused.exists());
}

/// A target smaller than the image: an image file is told to grow (or
/// `--size`), a device to be a larger disk; neither message sends the user
/// to a profile they never wrote, and nothing is written.
#[test]
fn install_on_a_target_smaller_than_the_image_says_what_to_do() {
    let i = images();
    let backing = scratch().join("upgrade-install-small.raw");
    let _ = std::fs::remove_file(&backing);
    ok(Command::new("truncate").args(["-s", "100M"]).arg(&backing));
    let install = |disk: &str| {
        let out = run(imager()
            .args(["install", "--installer"])
            .arg(payload(&i.v2))
            .args(["--disk", disk, "--key"])
            .arg(repo().join("out/keys/dev.pub")));
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = install(backing.to_str().unwrap());
    assert!(
        err.contains("at least 804 MiB")
            && err.contains("--size 804MiB")
            && !err.contains("profile"),
        "{err}"
    );
    assert!(err.contains("nothing was written"), "{err}");
    let dev = ok(tool("losetup").args(["-f", "--show"]).arg(&backing))
        .trim()
        .to_string();
    let _lo = Loop(dev.clone());
    let err = install(&dev);
    assert!(
        err.contains("install onto a disk of at least 804 MiB") && !err.contains("profile"),
        "{err}"
    );
    // Nothing was written: the file is still all zeros.
    let mut f = std::fs::File::open(&backing).unwrap();
    let mut buf = vec![0u8; 1 << 20];
    use std::io::Read;
    while let Ok(n) = f.read(&mut buf) {
        if n == 0 {
            break;
        }
        assert!(
            buf[..n].iter().all(|b| *b == 0),
            "the small disk was written"
        );
    }
}

/// `b`'s installer image unpacked by umoci; returns its root filesystem.
fn unpack_installer(b: &Build, name: &str) -> PathBuf {
    let layout = scratch().join(format!("{name}-layout"));
    let bundle = scratch().join(format!("{name}-bundle"));
    for d in [&layout, &bundle] {
        let _ = std::fs::remove_dir_all(d);
    }
    std::fs::create_dir_all(&layout).unwrap();
    ok(tool("tar")
        .arg("-xf")
        .arg(payload(b))
        .arg("-C")
        .arg(&layout));
    ok(tool("umoci")
        .args(["unpack", "--image"])
        .arg(format!("{}:{}", layout.display(), b.installer_ref()))
        .arg(&bundle));
    bundle.join("rootfs")
}

/// Detaches a loop device when dropped.
struct Loop(String);

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.0]).status();
    }
}

/// On a block device (a loop device on an image file): `imager install`
/// lays it out in place, the installer from the installer image (in a
/// chroot with only the device node) upgrades it, and the image file then
/// boots the upgrade.
#[test]
fn install_and_upgrade_work_on_a_block_device() {
    let i = images();
    let backing = scratch().join("upgrade-blockdev.raw");
    let _ = std::fs::remove_file(&backing);
    ok(Command::new("truncate").args(["-s", "2G"]).arg(&backing));
    let dev = ok(tool("losetup").args(["-f", "--show"]).arg(&backing))
        .trim()
        .to_string();
    assert!(dev.starts_with("/dev/loop"), "losetup gave {dev:?}");
    let lo = Loop(dev.clone());
    let r: Value = serde_json::from_str(&ok(imager()
        .args(["install", "--json", "--installer"])
        .arg(payload(&i.v2))
        .args(["--disk", &dev, "--key"])
        .arg(repo().join("out/keys/dev.pub"))))
    .unwrap();
    assert_eq!(r["size"], 2u64 << 30);

    // The installer image's own binary and payload, on the device.
    let root = unpack_installer(&i.v2, "upgrade-blockdev");
    use std::os::unix::fs::FileTypeExt;
    use std::os::unix::fs::MetadataExt;
    let md = std::fs::metadata(&dev).unwrap();
    assert!(md.file_type().is_block_device());
    let rdev = md.rdev();
    std::fs::create_dir_all(root.join("dev")).unwrap();
    ok(tool("mknod")
        .arg(root.join("dev/disk"))
        .arg("b")
        .arg(((rdev >> 8) & 0xfff).to_string())
        .arg((((rdev >> 12) & !0xff) | (rdev & 0xff)).to_string()));
    // Version 0.2.0 is installed: upgrade to v1's payload (0.1.0) instead,
    // copied into the root the installer sees.
    let v1_payload = root.join("v1");
    ok(Command::new("cp").arg("-r").arg(&i.v1.dir).arg(&v1_payload));
    let out = ok(tool("chroot").arg(&root).args([
        "/usr/bin/installer",
        "upgrade",
        "--json",
        "--installer",
        "/v1",
        "--disk",
        "/dev/disk",
    ]));
    let r: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (&r["to_slot"], &r["to_version"]),
        (&"B".into(), &"0.1.0".into())
    );
    drop(lo);
    let (r, console) = boot(&backing, false);
    assert_eq!(slot_of(&r), ("0.1.0".into(), "B".into()));
    assert!(
        console.contains("blessed slot B (0.1.0): the upgrade from 0.2.0 succeeded"),
        "{console}"
    );
}

// Hostile disks: a disk handed to inspect, upgrade or rollback may be
// damaged or crafted. Each case below is v1 upgraded to v2 (not booted: B on
// trial, A good), then changed as an attacker would; the three commands run
// under a time limit (`timeout`) and an address-space limit (`prlimit`), and
// a refused change leaves the disk as it was.

/// The array re-laid with entries of `size` bytes.
fn entry_size(c: &mut GptCopy, size: u32) {
    let old = u32_at(&c.header, 84) as usize;
    let n = c.entries.len() / size as usize;
    let mut out = vec![0u8; n * size as usize];
    for i in 0..n.min(c.entries.len() / old) {
        out[i * size as usize..i * size as usize + 128]
            .copy_from_slice(&c.entries[i * old..i * old + 128]);
    }
    c.header[80..84].copy_from_slice(&(n as u32).to_le_bytes());
    c.header[84..88].copy_from_slice(&size.to_le_bytes());
    c.entries = out;
}

/// BOOT's FAT as an attacker reads it: where things are.
struct Fat {
    /// Byte offset of BOOT on the disk.
    base: u64,
    fat_at: u64,
    fat_len: u64,
    fats: u64,
    width: u64,
    data_at: u64,
    cluster: u64,
}

fn boot_fat(disk: &Path) -> Fat {
    let mut f = std::fs::File::open(disk).unwrap();
    let size = bootstate::gpt::device_size(&mut f).unwrap();
    let t = bootstate::gpt::read(&mut f, size).unwrap();
    let base = t.find("BOOT").unwrap().first_lba * 512;
    let bs = read_at(&mut f, base, 512);
    let word = |at: usize| u64::from(u16::from_le_bytes([bs[at], bs[at + 1]]));
    let (bps, spc, reserved, fats, roots) = (
        word(11),
        u64::from(bs[13]),
        word(14),
        u64::from(bs[16]),
        word(17),
    );
    let total = if word(19) != 0 {
        word(19)
    } else {
        u64::from(u32_at(&bs, 32))
    };
    let spf = if word(22) != 0 {
        word(22)
    } else {
        u64::from(u32_at(&bs, 36))
    };
    let data = reserved + fats * spf + (roots * 32).div_ceil(bps);
    let clusters = (total - data) / spc;
    Fat {
        base,
        fat_at: base + reserved * bps,
        fat_len: spf * bps,
        fats,
        width: if clusters < 65525 { 2 } else { 4 },
        data_at: base + data * bps,
        cluster: spc * bps,
    }
}

impl Fat {
    fn set(&self, disk: &Path, c: u32, v: u32) {
        let mut f = std::fs::OpenOptions::new().write(true).open(disk).unwrap();
        for copy in 0..self.fats {
            let at = self.fat_at + copy * self.fat_len + u64::from(c) * self.width;
            write_at(&mut f, at, &v.to_le_bytes()[..self.width as usize]);
        }
    }

    fn cluster_at(&self, c: u32) -> u64 {
        self.data_at + u64::from(c - 2) * self.cluster
    }
}

/// The first cluster of `path` on BOOT, as mtools' mshowfat reads it.
fn first_cluster(disk: &Path, fat: &Fat, path: &str) -> u32 {
    let out = ok(tool("mshowfat")
        .arg("-i")
        .arg(format!("{}@@{}", disk.display(), fat.base))
        .arg(format!("::/{path}")));
    let inside = out.split('<').nth(1).unwrap_or_else(|| panic!("{out}"));
    inside
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .unwrap()
        .parse()
        .unwrap_or_else(|_| panic!("{out}"))
}

/// Points the directory entry `name` (8.3, upper case) found in the first
/// cluster of directory `dir` at cluster `to`.
fn repoint(disk: &Path, fat: &Fat, dir: &str, name: &str, to: u32) {
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(disk)
        .unwrap();
    let at = fat.cluster_at(first_cluster(disk, fat, dir));
    let bytes = read_at(&mut f, at, fat.cluster as usize);
    let mut short = name.as_bytes().to_vec();
    short.resize(11, b' ');
    let i = bytes
        .chunks(32)
        .position(|e| e[..11] == short[..] && e[11] != 0x0F)
        .unwrap_or_else(|| panic!("no {name} in {dir}"));
    let e = at + i as u64 * 32;
    write_at(&mut f, e + 20, &((to >> 16) as u16).to_le_bytes());
    write_at(&mut f, e + 26, &(to as u16).to_le_bytes());
}

/// What a bounded run of `imager ARGS` gave.
struct Bounded {
    ok: bool,
    stdout: String,
    stderr: String,
}

/// Runs imager with 60 s and 2 GiB of address space at most.
fn bounded(args: &[&str], disk: &Path) -> Bounded {
    let out = run(Command::new("timeout")
        .args(["60", "prlimit", "--as=2147483648", "--"])
        .arg(env!("CARGO_BIN_EXE_imager"))
        .args(args)
        .arg(disk)
        .current_dir(repo())
        .env("SOURCE_DATE_EPOCH", EPOCH));
    assert_ne!(
        out.status.code(),
        Some(124),
        "imager {args:?} ran out of time"
    );
    assert!(
        out.status.code().is_some(),
        "imager {args:?} was killed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Bounded {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// The upgraded disk, ready to be made hostile.
fn hostile_base(name: &str) -> PathBuf {
    let disk = disk_copy(name);
    upgrade(&disk, &payload(&images().v2));
    disk
}

/// A disk whose floor is security version 1 (as after blessing a payload
/// of security version 1; `bootstate`'s tests and tests/node.rs bless
/// one): `imager upgrade` to a payload of security version 0 and `imager
/// rollback` to a slot of version 0 are refused with nothing written, and
/// each is done once with --allow-downgrade; the floor stays.
#[test]
fn a_lower_security_version_needs_allow_downgrade_to_upgrade_or_roll_back() {
    let d = hostile_base("security-floor");
    let floor = |d: &Path| {
        let mut slots = imager::install::open_slots(d).unwrap();
        let (m, _) = bootstate::meta::read(&mut slots.meta).unwrap();
        m.get(contract::meta::Tag::SecurityFloor)
            .map(str::to_string)
    };
    assert_eq!(floor(&d), None, "a disk of security version 0 has no floor");
    edit_meta(&d, |m| m.set(contract::meta::Tag::SecurityFloor, "1"));
    let v2 = payload(&images().v2);
    refused_unchanged(
        &["upgrade", "--installer", v2.to_str().unwrap(), "--disk"],
        &d,
        &[
            "its security version 0 is lower than 1",
            "--allow-downgrade",
        ],
    );
    refused_unchanged(
        &["rollback", "--disk"],
        &d,
        &["slot A (0.1.0): its security version 0 is lower than 1"],
    );
    let up = bounded(
        &[
            "upgrade",
            "--allow-downgrade",
            "--installer",
            v2.to_str().unwrap(),
            "--disk",
        ],
        &d,
    );
    assert!(up.ok, "{}", up.stderr);
    let rb = bounded(&["rollback", "--allow-downgrade", "--disk"], &d);
    assert!(rb.ok, "{}", rb.stderr);
    assert_eq!(inspect(&d)["slots"]["default"], "A");
    assert_eq!(floor(&d).as_deref(), Some("1"), "the floor moved");
}

/// Rewrites `disk`'s META through `edit` (as a hostile or damaged disk
/// would have it), with bootstate's own write.
fn edit_meta(disk: &Path, edit: impl FnOnce(&mut contract::meta::Meta)) {
    let mut slots = imager::install::open_slots(disk).unwrap();
    let (mut m, _) = bootstate::meta::read(&mut slots.meta).unwrap();
    edit(&mut m);
    bootstate::meta::write(&mut slots.meta, &m).unwrap();
}

/// `imager ARGS DISK` (bounded) must be refused saying each of `wants` and
/// that nothing was written, and must leave `disk` as it was.
fn refused_unchanged(args: &[&str], disk: &Path, wants: &[&str]) {
    let before = sha256(disk);
    let out = bounded(args, disk);
    assert!(!out.ok, "imager {args:?} was accepted");
    for want in wants.iter().chain(&["nothing was written"]) {
        assert!(out.stderr.contains(want), "{want:?} not in: {}", out.stderr);
    }
    assert_eq!(sha256(disk), before, "a refused {args:?} changed the disk");
}

/// What the three commands must do with a hostile disk.
#[derive(Clone, Copy)]
enum Expect {
    /// inspect, upgrade and rollback work.
    Works,
    /// inspect reports the damage and exits 1; upgrade and rollback are
    /// refused with it and leave the disk unchanged.
    Refused(&'static str),
}

fn try_all(name: &str, disk: &Path, expect: Expect) -> Value {
    let v2 = payload(&images().v2);
    let before = sha256(disk);
    let ins = bounded(&["inspect", "--json"], disk);
    let report: Value =
        serde_json::from_str(&ins.stdout).unwrap_or_else(|_| Value::String(ins.stderr.clone()));
    let up_args = [
        "upgrade",
        "--json",
        "--installer",
        v2.to_str().unwrap(),
        "--disk",
    ];
    match expect {
        Expect::Works => {
            assert!(ins.ok, "{name}: inspect: {}", ins.stderr);
            let rb = bounded(&["rollback", "--json", "--disk"], disk);
            assert!(rb.ok, "{name}: rollback: {}", rb.stderr);
            let up = bounded(&up_args, disk);
            assert!(up.ok, "{name}: upgrade: {}", up.stderr);
        }
        Expect::Refused(why) => {
            let shown = format!("{report}");
            assert!(!ins.ok && shown.contains(why), "{name}: inspect: {shown}");
            for args in [&up_args[..], &["rollback", "--json", "--disk"][..]] {
                let r = bounded(args, disk);
                assert!(!r.ok, "{name}: {args:?} accepted a hostile disk");
                assert!(r.stderr.contains(why), "{name}: {args:?}: {}", r.stderr);
                assert!(!r.stderr.contains("panicked"), "{name}: {}", r.stderr);
                assert_eq!(sha256(disk), before, "{name}: {args:?} changed the disk");
            }
        }
    }
    report
}

#[test]
fn hostile_partition_tables() {
    // Entries of 256 bytes: legal (UEFI allows 128 × 2^n), so handled.
    let d = hostile_base("hostile-entry-256");
    craft_gpt(&d, |c| entry_size(c, 256));
    let r = try_all("entries of 256 bytes", &d, Expect::Works);
    assert_eq!(r["partitions"].as_array().unwrap().len(), 6, "{r}");
    // Entries of 0 or 100 bytes: refused, saying what is wrong.
    for size in [0u32, 100] {
        let d = hostile_base(&format!("hostile-entry-{size}"));
        craft_gpt(&d, |c| {
            c.header[84..88].copy_from_slice(&size.to_le_bytes())
        });
        let out = bounded(&["inspect"], &d);
        assert!(
            !out.ok && out.stderr.contains("128 × 2^n"),
            "{size}: {}",
            out.stderr
        );
        let v2 = payload(&images().v2);
        let up = ["upgrade", "--installer", v2.to_str().unwrap(), "--disk"];
        for args in [&["rollback", "--disk"][..], &up[..]] {
            let before = sha256(&d);
            let r = bounded(args, &d);
            assert!(!r.ok && r.stderr.contains("128 × 2^n"), "{}", r.stderr);
            assert_eq!(sha256(&d), before);
        }
    }
    // A damaged primary array: the backup is read, as Linux reads it.
    let d = hostile_base("hostile-primary");
    {
        let mut f = std::fs::OpenOptions::new().write(true).open(&d).unwrap();
        write_at(&mut f, 2 * 512 + 300, &[0x42; 16]);
    }
    let r = try_all("a damaged primary array", &d, Expect::Works);
    assert_eq!(r["partition_table"]["copy"], "backup", "{r}");
}

#[test]
fn hostile_boot_filesystems() {
    type Craft = fn(&Path, &Fat);
    let cases: [(&str, Craft, &str); 4] = [
        (
            "a directory whose chain loops",
            |d, fat| {
                let c = first_cluster(d, fat, "loader/entries");
                fat.set(d, c, c);
            },
            "cross-linked",
        ),
        (
            "a subdirectory pointing back to its parent",
            |d, fat| {
                let parent = first_cluster(d, fat, "loader");
                repoint(d, fat, "loader", "ENTRIES", parent);
            },
            "cross-linked",
        ),
        (
            "a subdirectory at cluster 0",
            |d, fat| repoint(d, fat, "loader", "ENTRIES", 0),
            "outside the volume",
        ),
        (
            "two files sharing clusters",
            |d, fat| {
                // The smaller of the kernel and the initramfs now starts at
                // the larger's clusters (so that its size fits the shared
                // chain, and the cross-link is what is wrong).
                let short = ok(tool("mdir")
                    .arg("-i")
                    .arg(format!("{}@@{}", d.display(), fat.base))
                    .arg("::/A"));
                // `NAME EXT SIZE DATE TIME LONGNAME`, EXT absent for a name
                // without one: (8.3 name as stored, size, long name).
                let entry = |prefix: &str| -> (String, u64, String) {
                    let line = short
                        .lines()
                        .find(|l| l.starts_with(prefix))
                        .unwrap_or_else(|| panic!("no {prefix} in {short}"));
                    let parts: Vec<&str> = line.split_whitespace().collect();
                    let (ext, size) = if parts[1].bytes().all(|b| b.is_ascii_digit()) {
                        ("", parts[1])
                    } else {
                        (parts[1], parts[2])
                    };
                    (
                        format!("{:<8}{ext}", parts[0]),
                        size.parse().unwrap(),
                        parts.last().unwrap().to_string(),
                    )
                };
                let (kernel, initramfs) = (entry("VMLINU"), entry("INITRA"));
                let (small, large) = if kernel.1 <= initramfs.1 {
                    (kernel, initramfs)
                } else {
                    (initramfs, kernel)
                };
                let to = first_cluster(d, fat, &format!("A/{}", large.2));
                repoint(d, fat, "A", &small.0, to);
            },
            "cross-linked",
        ),
    ];
    for (what, craft, why) in cases {
        let d = hostile_base(&format!("hostile-fat-{}", what.replace(' ', "-")));
        let fat = boot_fat(&d);
        craft(&d, &fat);
        let r = try_all(what, &d, Expect::Refused(why));
        assert!(
            r["boot_error"]
                .as_str()
                .is_some_and(|e| e.contains("BOOT's FAT filesystem is damaged")),
            "{what}: {r}"
        );
    }
}

#[test]
fn what_a_cut_leaves_and_a_full_meta_and_a_busy_disk() {
    // An empty entry, as a cut creation leaves it: shown as such, and
    // removed by the next rollback (which works).
    let d = hostile_base("hostile-empty-entry");
    {
        let slots = imager::install::open_slots(&d).unwrap();
        let mut fs = BootFs::new(slots.boot, 0);
        fs.create("loader/entries/g00000009-slot-a+3-0.conf", &mut &b""[..], 0)
            .unwrap();
    }
    let r = inspect(&d);
    let empty = r["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["file"] == "g00000009-slot-a+3-0.conf")
        .unwrap_or_else(|| panic!("{r}"));
    assert_eq!(empty["bootable"], false, "{r}");
    assert!(
        empty["problem"].as_str().unwrap().contains("cut short"),
        "{r}"
    );
    assert_eq!(r["slots"]["boots_next"], "B", "{r}");
    let r = try_all("an empty entry", &d, Expect::Works);
    assert!(
        r["entries"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["file"] == "g00000009-slot-a+3-0.conf")
    );
    let after = inspect(&d);
    assert!(
        after["entries"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["bootable"] == true),
        "removed by the rollback and the upgrade: {after}"
    );

    // A META too full for the new records: refused before the first write.
    let d = hostile_base("hostile-full-meta");
    edit_meta(&d, |m| {
        let keys = m.get(contract::meta::Tag::TrustedKeys).unwrap().to_string();
        let room = contract::meta::BLOCK_LEN - m.encode_block().map(|_| 0).unwrap_or(0);
        let mut padded = keys.clone();
        // Fill the block up to a few bytes with junk after the PEM keys.
        for n in (0..room).rev() {
            padded.truncate(keys.len());
            padded.push_str(&"#".repeat(n));
            let mut t = m.clone();
            t.set(contract::meta::Tag::TrustedKeys, padded.clone());
            if t.encode_block().is_ok() {
                *m = t;
                break;
            }
        }
    });
    let v2 = payload(&images().v2);
    refused_unchanged(
        &["upgrade", "--installer", v2.to_str().unwrap(), "--disk"],
        &d,
        &["META has no room"],
    );

    // A META without the image name: nothing tells whether the payload is
    // for this system, so it is refused (the check used to pass).
    let d = disk_copy("hostile-nameless-meta");
    edit_meta(&d, |m| m.remove(contract::meta::Tag::ImageName));
    refused_unchanged(
        &["upgrade", "--installer", v2.to_str().unwrap(), "--disk"],
        &d,
        &["META holds no image name"],
    );

    // A disk in use by another change: refused at once, unchanged.
    let d = hostile_base("hostile-busy");
    let before = sha256(&d);
    let held = imager::install::open_slots(&d).unwrap();
    for args in [
        &["upgrade", "--installer", v2.to_str().unwrap(), "--disk"][..],
        &["rollback", "--disk"][..],
        &["inspect"][..],
    ] {
        let r = bounded(args, &d);
        assert!(
            !r.ok && r.stderr.contains("is in use"),
            "{args:?}: {}",
            r.stderr
        );
    }
    drop(held);
    assert_eq!(sha256(&d), before);
    assert!(bounded(&["inspect"], &d).ok);
}
