//! The Secure Boot image (profiles/secureboot.yaml) end to end, under OVMF's
//! Secure Boot firmware (SMM, TCG): systemd-boot enrols the image's own keys
//! on a machine in setup mode; with the keys enrolled (by `virt-fw-vars`)
//! the A-B model works as without Secure Boot (upgrade, blessing, rollback,
//! fallback from a broken version, power cuts); firmware refuses a UKI
//! with one changed byte and the other slot comes up; a command line given
//! at boot changes nothing; upgrades across Secure Boot or signed by a db
//! key the disk does not trust are refused before any write.
//!
//! The images are built with a key set made for the tests
//! (`imager keygen --secure-boot`), and a second one for the foreign build.

// Test helpers panic on unexpected failures: that is how a test fails.
#![allow(clippy::unwrap_used)]

mod common;

use bootstate::fat::BootFs;
use common::*;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// A Secure Boot key set made for these tests.
fn sb_keys(name: &str) -> PathBuf {
    let dir = scratch().join(name);
    ok(imager()
        .args(["keygen", "--force", "--secure-boot"])
        .arg(&dir));
    dir
}

struct Images {
    keys: PathBuf,
    v1: Build,
    v2: Build,
    v3: Build,
    /// v2 signed with another db key.
    foreign: Build,
    /// v2 without Secure Boot (the installer profile).
    plain: Build,
}

/// The secureboot profile with `keys`, version `v`, and `extra` edits.
fn variant(name: &str, keys: &Path, v: &str, edit: impl Fn(String) -> String) -> Build {
    let keys = keys.display().to_string();
    let profile = write_profile_from("secureboot", name, |t| {
        edit(t)
            .replace("version: 0.1.0", &format!("version: {v}"))
            .replace(
                "  enroll: force\n",
                &format!("  enroll: force\n  keys: {keys}\n"),
            )
    });
    build_profile(name, &profile, &["--key", &dev_key().display().to_string()])
}

fn images() -> &'static Images {
    static I: Fixture<Images> = Fixture::new("secureboot-ab-images");
    I.get(|| {
        let keys = sb_keys("sb-keys");
        let other = sb_keys("sb-keys-other");
        let v1 = variant("sb-v1", &keys, "0.1.0", |t| t);
        let v2 = variant("sb-v2", &keys, "0.2.0", |t| t);
        // (Each comes as an installer image: its payload carries the db
        // certificate it is signed for.)
        let v3 = variant("sb-v3", &keys, "0.3.0", |t| {
            t.replace(
                "    - vdso32=0\n",
                "    - vdso32=0\n    - machined.break=ready\n",
            )
        });
        let foreign = variant("sb-foreign", &other, "0.2.0", |t| t);
        let plain = build_profile(
            "sb-plain",
            &write_profile_from("metal", "sb-plain", |t| {
                t.replace("version: 0.1.0", "version: 0.2.0")
            }),
            &["--key", &dev_key().display().to_string()],
        );
        Images {
            keys,
            v1,
            v2,
            v3,
            foreign,
            plain,
        }
    })
}

/// An OVMF variable store with the test keys enrolled and Secure Boot on.
fn vars(name: &str) -> PathBuf {
    enrolled_vars(
        &images().keys,
        &scratch().join(format!("{name}.vars.fd")),
        true,
    )
}

/// The same keys enrolled with Secure Boot off: the image's systemd-boot
/// does not enrol (not setup mode) and firmware checks nothing.
fn vars_off(name: &str) -> PathBuf {
    enrolled_vars(
        &images().keys,
        &scratch().join(format!("{name}.off.vars.fd")),
        false,
    )
}

/// A fresh sparse copy of the v1 disk.
fn disk_copy(name: &str) -> PathBuf {
    sparse_copy(&images().v1.artifact("raw"), name)
}

/// Boots `disk` under Secure Boot firmware with `vars`, writing to it;
/// the report and the whole console.
fn sb_boot(disk: &Path, vars: &Path, reboots: bool) -> (Value, String) {
    let log = disk.with_extension("console.log");
    let mut args = vec![
        "--write".to_string(),
        "--secure-boot".to_string(),
        vars.display().to_string(),
        "--console-log".to_string(),
        log.display().to_string(),
    ];
    if reboots {
        args.push("--reboots".into());
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let r = boot_report(disk, &args).unwrap_or_else(|e| panic!("{e}"));
    (r, std::fs::read_to_string(&log).unwrap())
}

fn slot_of(r: &Value) -> (String, String) {
    (
        r["version"].as_str().unwrap().to_string(),
        r["slot"].as_str().unwrap().to_string(),
    )
}

/// The slot systemd-boot boots next on `disk`, as its boot entries and
/// META say (`bootstate`'s reading of systemd-boot's order): what a boot
/// of a disk cut during an upgrade must come up on.
fn next_slot(disk: &Path) -> String {
    let mut slots = imager::install::open_slots(disk).unwrap();
    let mut boot = BootFs::new(slots.boot, 0);
    let st = bootstate::ops::status(&mut boot, &mut slots.meta).unwrap();
    st.next_boot()
        .unwrap_or_else(|| panic!("{}: no bootable entry", disk.display()))
        .slot
        .name()
        .to_string()
}

fn upgrade(disk: &Path, installer: &Path, extra: &[&str]) -> std::process::Output {
    run(imager()
        .args(["upgrade", "--json", "--installer"])
        .arg(installer)
        .arg("--disk")
        .arg(disk)
        .args(extra))
}

/// `imager` with `args` on `disk` fails saying `says`, and the disk is
/// unchanged.
fn refused(disk: &Path, args: &[&str], says: &str) {
    let before = sha256(disk);
    let out = run(imager().args(args).arg("--disk").arg(disk));
    assert!(!out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(says), "{err}");
    assert_eq!(sha256(disk), before, "refused, and it wrote to the disk");
}

/// An upgrade to `b` refused as [`refused`] says.
fn refused_upgrade(disk: &Path, b: &Build, says: &str) {
    let installer = installer(b);
    refused(
        disk,
        &["upgrade", "--installer", installer.to_str().unwrap()],
        says,
    );
}

/// Upgrades `disk` to `b`, then puts `uki` in the place of its trial entry
/// `entry` on BOOT, by hand.
fn uki_in_trial(disk: &Path, b: &Build, entry: &str, uki: &Path) {
    let up = upgrade(disk, &installer(b), &[]);
    assert!(up.status.success(), "{up:?}");
    let img = boot_at(disk);
    let name = format!("::/EFI/Linux/{entry}");
    ok(tool("mdel").args(["-i", &img, &name]));
    ok(tool("mcopy").args(["-i", &img]).arg(uki).arg(&name));
}

fn installer(b: &Build) -> PathBuf {
    let tar = b.dir.join("installer.tar");
    if tar.is_file() { tar } else { b.dir.clone() }
}

/// The byte offset of BOOT in `disk` (sfdisk), for mtools.
fn boot_at(disk: &Path) -> String {
    part_at(disk, "BOOT")
}

#[test]
fn the_images_ukis_and_boot_loader_are_signed_for_the_db_key_and_nothing_else() {
    let i = images();
    let db = i.keys.join("db.crt");
    for slot in ["a", "b"] {
        let uki = i.v1.dir.join(format!("uki-{slot}.efi"));
        let out = run(tool("sbverify").arg("--cert").arg(&db).arg(&uki));
        assert!(out.status.success(), "{out:?}");
        let other = run(tool("sbverify")
            .arg("--cert")
            .arg(scratch().join("sb-keys-other/db.crt"))
            .arg(&uki));
        assert!(!other.status.success(), "another db key verifies {uki:?}");
        // The sections the UKI specification wants, read by objdump.
        let h = ok(tool("objdump").arg("-h").arg(&uki));
        for s in [".osrel", ".cmdline", ".linux", ".initrd"] {
            assert!(h.contains(s), "{s} missing:\n{h}");
        }
    }
    // systemd-boot on the ESP, as firmware loads it.
    let disk = disk_copy("sb-signed");
    let json: Value = serde_json::from_str(&ok(tool("sfdisk").arg("--json").arg(&disk))).unwrap();
    let esp = json["partitiontable"]["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "EFI")
        .unwrap()["start"]
        .as_u64()
        .unwrap()
        * 512;
    let img = format!("{}@@{esp}", disk.display());
    let loader = scratch().join("sb-bootx64.efi");
    let _ = std::fs::remove_file(&loader);
    ok(tool("mcopy")
        .args(["-i", &img, "::/EFI/BOOT/BOOTX64.EFI"])
        .arg(&loader));
    assert!(
        run(tool("sbverify").arg("--cert").arg(&db).arg(&loader))
            .status
            .success()
    );
    let conf = ok(tool("mtype").args(["-i", &img, "::/loader/loader.conf"]));
    assert!(conf.contains("secure-boot-enroll force"), "{conf}");
    let keys = ok(tool("mdir").args(["-i", &img, "-b", "::/loader/keys/auto"]));
    for f in ["PK.auth", "KEK.auth", "db.auth"] {
        assert!(keys.contains(f), "{keys}");
    }
}

/// A machine in setup mode: systemd-boot enrols the image's keys from the
/// ESP (`secure-boot-enroll force`), the machine resets, and the signed UKI
/// of slot A boots with Secure Boot on.
#[test]
fn systemd_boot_enrols_the_images_keys_and_the_image_boots_with_secure_boot_on() {
    let disk = disk_copy("sb-enrol");
    let vars = scratch().join("sb-enrol.vars.fd");
    std::fs::copy(imager::qemu::OVMF_VARS, &vars).unwrap();
    let (r, console) = sb_boot(&disk, &vars, true);
    assert_eq!(slot_of(&r), ("0.1.0".into(), "A".into()), "{console}");
    assert!(
        console.contains("Enrolling secure boot keys from directory: \\loader\\keys\\auto"),
        "{console}"
    );
    assert_eq!(r["secure_boot"], "on", "{r}");
    // The store holds the image's PK, KEK and db (their subjects name the
    // key set's GUID).
    let print = ok(tool("virt-fw-vars")
        .arg("--input")
        .arg(&vars)
        .args(["--print", "--verbose"]));
    let guid = std::fs::read_to_string(images().keys.join("GUID")).unwrap();
    for var in ["PK", "KEK", "db"] {
        let at = print
            .find(&format!("name={var} "))
            .unwrap_or_else(|| panic!("no {var}: {print}"));
        let end = print[at..].find("\n\n").map_or(print.len(), |e| at + e);
        let subject = format!("subject CN=imager Secure Boot {var} {}", &guid.trim()[..8]);
        assert!(print[at..end].contains(&subject), "{}", &print[at..end]);
    }
}

/// The A-B model under Secure Boot: upgrade, blessing, rollback, and an
/// upgrade to a version that never reaches ready falls back by itself.
#[test]
fn upgrade_bless_rollback_and_fallback_under_secure_boot() {
    let i = images();
    let disk = disk_copy("sb-ab");
    let vars = vars("sb-ab");
    let (r, _) = sb_boot(&disk, &vars, false);
    assert_eq!(slot_of(&r), ("0.1.0".into(), "A".into()));
    assert_eq!(r["secure_boot"], "on");
    let up = upgrade(&disk, &installer(&i.v2), &[]);
    assert!(up.status.success(), "{up:?}");
    let (r, console) = sb_boot(&disk, &vars, false);
    assert_eq!(slot_of(&r), ("0.2.0".into(), "B".into()));
    assert!(
        console.contains("machined: blessed slot B (0.2.0)"),
        "{console}"
    );
    assert!(
        run(imager().args(["rollback", "--disk"]).arg(&disk))
            .status
            .success()
    );
    let (r, _) = sb_boot(&disk, &vars, false);
    assert_eq!(slot_of(&r), ("0.1.0".into(), "A".into()));
    let up = upgrade(&disk, &installer(&i.v3), &[]);
    assert!(up.status.success(), "{up:?}");
    let (r, console) = sb_boot(&disk, &vars, true);
    assert_eq!(slot_of(&r), ("0.1.0".into(), "A".into()), "{console}");
    assert_eq!(r["failed_boots"], 3, "{console}");
}

/// After an upgrade, one byte of slot B's UKI changes on the disk: firmware
/// refuses it at each try, and once its tries are used up slot A boots.
#[test]
fn a_uki_with_one_changed_byte_is_refused_by_firmware_and_the_other_slot_boots() {
    let i = images();
    let disk = disk_copy("sb-tampered");
    let up = upgrade(&disk, &installer(&i.v2), &[]);
    assert!(up.status.success(), "{up:?}");
    let img = boot_at(&disk);
    let name = "::/EFI/Linux/g00000002-slot-b+3-0.efi";
    let copy = scratch().join("sb-tampered-b.efi");
    let _ = std::fs::remove_file(&copy);
    ok(tool("mcopy").args(["-i", &img, name]).arg(&copy));
    let mut bytes = std::fs::read(&copy).unwrap();
    bytes[0x10_0000] ^= 0x01;
    std::fs::write(&copy, &bytes).unwrap();
    ok(tool("mdel").args(["-i", &img, name]));
    ok(tool("mcopy").args(["-i", &img]).arg(&copy).arg(name));
    let vars = vars("sb-tampered");
    let (r, console) = sb_boot(&disk, &vars, true);
    assert_eq!(slot_of(&r), ("0.1.0".into(), "A".into()), "{console}");
    assert!(
        console.contains("Error loading \\EFI\\Linux\\g00000002-slot-b+2-1.efi: Access Denied"),
        "{console}"
    );
    assert_eq!(r["secure_boot"], "on");
}

/// A `.conf` entry that starts slot A's UKI with another command line (the
/// way a command line typed at boot reaches the UKI) has no effect: with
/// Secure Boot on the stub uses the signed one. And an unsigned credential
/// beside the UKI, which the stub adds under `/.extra`, is ignored.
#[test]
fn a_command_line_given_at_boot_has_no_effect() {
    let disk = disk_copy("sb-cmdline");
    let img = boot_at(&disk);
    let cred = scratch().join("sb-extra.cred");
    std::fs::write(&cred, "not signed").unwrap();
    ok(tool("mmd")
        .args(["-i", &img])
        .arg("::/EFI/Linux/g00000001-slot-a.efi.extra.d"));
    ok(tool("mcopy")
        .args(["-i", &img])
        .arg(&cred)
        .arg("::/EFI/Linux/g00000001-slot-a.efi.extra.d/x.cred"));
    let entry = scratch().join("sb-extra.conf");
    std::fs::write(
        &entry,
        "title extra\nefi /EFI/Linux/g00000001-slot-a.efi\noptions console=ttyS0,115200 \
         machined.slot=B machined.break=stage1\n",
    )
    .unwrap();
    ok(tool("mcopy")
        .args(["-i", &img])
        .arg(&entry)
        .arg("::/loader/entries/zz-extra.conf"));
    // The control: without Secure Boot the stub takes the entry's line, so
    // the extra entry is the one systemd-boot starts, and it stops at stage 1.
    let control = sparse_copy(&disk, "sb-cmdline-control");
    let off = vars_off("sb-cmdline");
    let e = boot_report(&control, &["--secure-boot", off.to_str().unwrap()]).unwrap_err();
    assert!(e.contains("machined.break=stage1"), "{e}");
    let vars = vars("sb-cmdline");
    let (r, console) = sb_boot(&disk, &vars, false);
    assert_eq!(slot_of(&r), ("0.1.0".into(), "A".into()), "{console}");
    let cmdline = r["cmdline"].as_str().unwrap();
    assert!(
        !cmdline.contains("machined.break") && cmdline.contains("machined.slot=A"),
        "{cmdline}"
    );
    assert!(console.contains("stage1: ignoring /.extra"), "{console}");
}

/// META's records of `disk` by name (`imager inspect`).
fn meta_keys(disk: &Path) -> Vec<String> {
    let out = run(imager().args(["inspect", "--json"]).arg(disk));
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    r["meta"]["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|kv| kv[0].as_str().unwrap().to_string())
        .collect()
}

/// META's value of `key`, as `imager inspect --json` reads it.
fn meta_value(disk: &Path, key: &str) -> String {
    let out = run(imager().args(["inspect", "--json"]).arg(disk));
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    r["meta"]["keys"]
        .as_array()
        .unwrap()
        .iter()
        .find(|kv| kv[0] == key)
        .and_then(|kv| kv[1].as_str())
        .unwrap_or_default()
        .to_string()
}

/// Upgrades the disk cannot boot are refused before anything is written: a
/// payload without Secure Boot (unless --change-secure-boot), one signed
/// for a db key the disk does not trust, a Secure Boot payload on a disk
/// without it (unless --change-secure-boot: the next test).
/// Asked for, leaving Secure Boot works, and META forgets the db
/// certificate once the new version is blessed.
#[test]
fn upgrades_across_secure_boot_or_from_an_untrusted_db_key_are_refused() {
    let i = images();
    let disk = disk_copy("sb-refusals");
    let before = sha256(&disk);
    let out = upgrade(&disk, &installer(&i.plain), &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("this disk boots with Secure Boot and the payload is not signed for it"),
        "{err}"
    );
    let out = upgrade(&disk, &installer(&i.foreign), &["--change-secure-boot"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("signed for another db certificate than the one this disk trusts"),
        "{err}"
    );
    assert_eq!(sha256(&disk), before, "a refused upgrade wrote to the disk");
    // A plain disk refuses the Secure Boot payload without the flag, and
    // with it one signed with a key that is not its own db certificate's.
    let plain = sparse_copy(&i.plain.artifact("raw"), "sb-refusals-plain");
    let plain_before = sha256(&plain);
    let out = upgrade(&plain, &installer(&i.v2), &[]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("does not boot with Secure Boot") && err.contains("--change-secure-boot"),
        "{err}"
    );
    assert_eq!(sha256(&plain), plain_before);
    // Asked for, the move out of Secure Boot is made; the disk keeps its db
    // certificate until the plain version is blessed (booted with Secure
    // Boot off in the firmware).
    let out = upgrade(&disk, &installer(&i.plain), &["--change-secure-boot"]);
    assert!(out.status.success(), "{out:?}");
    let keys = meta_keys(&disk);
    assert!(
        keys.iter().any(|k| k == "secure-boot") && keys.iter().any(|k| k == "secure-boot-leaving"),
        "{keys:?}"
    );
    let off = vars_off("sb-refusals");
    let r = boot_report(&disk, &["--write", "--secure-boot", off.to_str().unwrap()])
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(slot_of(&r), ("0.2.0".into(), "B".into()));
    assert_eq!(r["secure_boot"], "off", "{r}");
    let keys = meta_keys(&disk);
    assert!(
        !keys.iter().any(|k| k.starts_with("secure-boot")),
        "{keys:?}"
    );
}

/// The ESP's boot loader of `disk`, copied out with mtools.
fn esp_loader(disk: &Path, name: &str) -> PathBuf {
    let copy = scratch().join(format!("{name}-bootx64.efi"));
    let _ = std::fs::remove_file(&copy);
    ok(tool("mcopy")
        .args(["-i", &part_at(disk, "EFI"), "::/EFI/BOOT/BOOTX64.EFI"])
        .arg(&copy));
    copy
}

/// Whether `sbverify` accepts `efi` as signed by the test db key.
fn signed_for_db(efi: &Path) -> bool {
    signed_for(efi, &images().keys.join("db.crt"))
}

/// Whether `sbverify` accepts `efi` as signed for the certificate `cert`.
fn signed_for(efi: &Path, cert: &Path) -> bool {
    tool("sbverify")
        .arg("--cert")
        .arg(cert)
        .arg(efi)
        .output()
        .unwrap()
        .status
        .success()
}

/// A plain disk (BIOS and UEFI, `.conf` slots) moved into Secure Boot by an
/// upgrade with --change-secure-boot: the ESP gets the signed systemd-boot
/// (sbverify), BOOT loses GRUB's rendering, META records the db
/// certificate as entering; the new version boots under OVMF with Secure
/// Boot off (the signed systemd-boot boots it) and is blessed, which makes
/// the disk a Secure Boot disk; with the keys then enrolled and Secure Boot
/// on, it boots with Secure Boot on and a verified root. Cut before writes
/// spread over the upgrade, the disk boots the old or the new version and
/// the same upgrade run again finishes it.
#[test]
fn a_plain_disk_enters_secure_boot_by_an_upgrade_when_asked() {
    let i = images();
    let disk = sparse_copy(&i.plain.artifact("raw"), "sb-enter");
    assert!(!signed_for_db(&esp_loader(&disk, "sb-enter-before")));
    let out = upgrade(&disk, &installer(&i.v2), &["--change-secure-boot"]);
    assert!(out.status.success(), "{out:?}");
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["to_slot"], "B", "{r}");
    assert!(signed_for_db(&esp_loader(&disk, "sb-enter-after")));
    let boot_files = ok(tool("mdir").args(["-i", &boot_at(&disk), "-/", "-b", "::/"]));
    assert!(!boot_files.contains("grub.cfg"), "{boot_files}");
    let keys = meta_keys(&disk);
    assert!(
        keys.iter().any(|k| k == "secure-boot-entering")
            && !keys.iter().any(|k| k == "secure-boot"),
        "{keys:?}"
    );
    // Secure Boot off (OVMF's own store, setup mode: nothing enrols, as
    // the upgrade wrote no enrolment files): the new version boots and is
    // blessed, and the disk becomes a Secure Boot disk.
    let log = disk.with_extension("off.console.log");
    let r = boot_report(&disk, &["--write", "--console-log", log.to_str().unwrap()])
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(slot_of(&r), ("0.2.0".into(), "B".into()), "{r}");
    assert_eq!(r["secure_boot"], "off", "{r}");
    let keys = meta_keys(&disk);
    assert!(
        keys.iter().any(|k| k == "secure-boot")
            && !keys.iter().any(|k| k == "secure-boot-entering"),
        "{keys:?}"
    );
    // The keys enrolled and Secure Boot on.
    let (r, console) = sb_boot(&disk, &vars("sb-enter"), false);
    assert_eq!(slot_of(&r), ("0.2.0".into(), "B".into()), "{console}");
    assert_eq!(r["secure_boot"], "on", "{r}");
    assert_eq!(r["root_verified"], true, "{r}");

    // Cut before writes spread over the upgrade (the ESP's first).
    let run_upgrade =
        |disk: &Path, fail_at: Option<u64>| cut_upgrade(disk, &installer(&i.v2), fail_at, true);
    let fresh = || sparse_copy(&i.plain.artifact("raw"), "sb-enter-cut");
    let (done, total) = run_upgrade(&fresh(), None);
    assert!(done && total > 20, "{total} writes");
    let mut points = vec![1, 3, total / 2, total - 1, total];
    points.dedup();
    let mut b_from = None;
    for n in points {
        let disk = fresh();
        let (done, _) = run_upgrade(&disk, Some(n));
        assert!(!done, "cut {n}");
        // Nothing written yet: A; from the switch on: B, and no cut after
        // it A again.
        let expected = next_slot(&disk);
        if n == 1 {
            assert_eq!(expected, "A", "cut {n}: nothing was written");
        }
        if expected == "B" {
            b_from.get_or_insert(n);
        } else {
            assert!(b_from.is_none(), "cut {n}: A after B at cut {b_from:?}");
        }
        let r = boot_report(&disk, &["--write", "--reboots"])
            .unwrap_or_else(|e| panic!("cut {n}: {e}"));
        // (The plain disk's version is 0.2.0 as well: the slot tells them
        // apart.)
        assert_eq!(
            slot_of(&r),
            ("0.2.0".into(), expected.clone()),
            "cut {n}: {r}"
        );
        let slot = expected;
        if slot == "A" {
            let (done, _) = run_upgrade(&disk, None);
            assert!(done, "cut {n}: the upgrade run again");
            let r = boot_report(&disk, &["--write"]).unwrap_or_else(|e| panic!("cut {n}: {e}"));
            assert_eq!(r["slot"], "B", "cut {n}: {r}");
        }
        assert!(signed_for_db(&esp_loader(&disk, "sb-enter-cut")), "cut {n}");
        assert!(
            meta_keys(&disk).iter().any(|k| k == "secure-boot"),
            "cut {n}"
        );
    }
    assert!(b_from.is_some(), "no cut booted B");
}

/// Power cut before writes spread over a Secure Boot upgrade: each cut disk
/// boots v1 or v2 under Secure Boot, v2 only from the switch on.
#[test]
fn a_secure_boot_upgrade_cut_anywhere_leaves_a_disk_that_boots() {
    let i = images();
    let run_upgrade =
        |disk: &Path, fail_at: Option<u64>| cut_upgrade(disk, &installer(&i.v2), fail_at, false);
    let (done, total) = run_upgrade(&disk_copy("sb-cut-probe"), None);
    assert!(done && total > 20, "{total} writes");
    let mut points = vec![1, total / 2, total - 2, total - 1, total, total + 1];
    points.dedup();
    let vars = vars("sb-cut");
    let mut v2_from = None;
    for n in points {
        let disk = disk_copy("sb-cut");
        let (done, _) = run_upgrade(&disk, Some(n));
        assert_eq!(done, n > total, "cut {n}");
        // The slot the disk says boots next: A before the switch, B from
        // it on (and after the whole upgrade); no A after B.
        let expected = next_slot(&disk);
        match n {
            1 => assert_eq!(expected, "A", "cut {n}: nothing was written"),
            n if n > total => assert_eq!(expected, "B", "the whole upgrade"),
            _ => {}
        }
        if expected == "B" {
            v2_from.get_or_insert(n);
        } else {
            assert!(v2_from.is_none(), "cut {n}: A after B at cut {v2_from:?}");
        }
        let version = if expected == "A" { "0.1.0" } else { "0.2.0" };
        let (r, console) = sb_boot(&disk, &vars, true);
        assert_eq!(
            slot_of(&r),
            (version.into(), expected.clone()),
            "cut {n}: {console}"
        );
        assert_eq!(r["secure_boot"], "on", "cut {n}: {r}");
    }
    assert!(v2_from.is_some(), "no cut booted v2");
}

/// The Secure Boot ISO (the secureboot profile with the output `iso`): its
/// FAT image holds the signed systemd-boot and the signed live UKI, and it
/// reaches ready, live, with Secure Boot on, as a CD and as a USB disk; the
/// disk it installs boots with Secure Boot on.
#[test]
fn the_secure_boot_iso_boots_from_cd_and_usb_and_installs_a_secure_boot_disk() {
    let i = images();
    let b = variant("sb-iso", &i.keys, "0.1.0", |t| {
        t.replace("outputs: [raw, installer, uki]", "outputs: [raw, iso]")
            .replace(
                "secure_boot:\n",
                "live:\n  install: serial:SBTARGET\n\nsecure_boot:\n",
            )
    });
    let iso = b.artifact("iso");
    let dir = scratch().join("sb-iso-efi");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let efi = dir.join("efi.img");
    ok(tool("xorriso")
        .args(["-osirrox", "on", "-indev"])
        .arg(&iso)
        .args(["-extract", &format!("/{}", contract::iso::EFI_IMAGE)])
        .arg(&efi));
    let db = i.keys.join("db.crt");
    for (from, to) in [
        ("::/EFI/BOOT/BOOTX64.EFI", "bootx64.efi"),
        ("::/EFI/Linux/live.efi", "live.efi"),
    ] {
        ok(tool("mcopy")
            .arg("-i")
            .arg(&efi)
            .arg(from)
            .arg(dir.join(to)));
        let out = run(tool("sbverify").arg("--cert").arg(&db).arg(dir.join(to)));
        assert!(out.status.success(), "{to}: {out:?}");
    }
    let vars = vars("sb-iso");
    let target = scratch().join("sb-iso-target.raw");
    for usb in [false, true] {
        // A blank disk for the live system to install onto.
        blank_disk(&target, 4 << 30);
        let disk_arg = format!("{},serial=SBTARGET", target.display());
        let mut args = vec!["--secure-boot", vars.to_str().unwrap(), "--disk", &disk_arg];
        if usb {
            args.push("--usb");
        }
        let r = boot_report(&iso, &args).unwrap_or_else(|e| panic!("usb={usb}: {e}"));
        assert_eq!(r["live"], true, "{r}");
        assert_eq!(r["secure_boot"], "on", "{r}");
        assert_eq!(r["install"]["installed"], true, "{r}");
    }
    // The installed disk is a Secure Boot disk of slot A that boots with
    // Secure Boot on.
    let (r, console) = sb_boot(&target, &vars, false);
    assert_eq!(slot_of(&r), ("0.1.0".into(), "A".into()), "{console}");
    assert_eq!(r["secure_boot"], "on");
}

/// A key set with the test keys' PK, KEK and owner GUID and the foreign
/// set's db key: what a db key's rotation moves to.
fn rotated_keys() -> PathBuf {
    let dir = scratch().join("sb-keys-rotated");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (ours, other) = (&images().keys, scratch().join("sb-keys-other"));
    for (from, name) in [
        (ours.as_path(), "PK.key"),
        (ours, "PK.crt"),
        (ours, "KEK.key"),
        (ours, "KEK.crt"),
        (ours, "GUID"),
        (other.as_path(), "db.key"),
        (other.as_path(), "db.crt"),
    ] {
        std::fs::copy(from.join(name), dir.join(name)).unwrap();
    }
    dir
}

/// `enrol-files` with `args`: the rotation files in `out`.
fn rotation_files(out: &str, args: &[&str]) -> PathBuf {
    let dir = scratch().join(out);
    let _ = std::fs::remove_dir_all(&dir);
    ok(imager()
        .args(["secureboot", "enrol-files", "--keys"])
        .arg(&images().keys)
        .arg("--out")
        .arg(&dir)
        .args(args));
    dir
}

/// What `virt-fw-vars` (an independent reader of the variable store) says
/// the store holds.
fn store(vars: &Path) -> String {
    let out = run(tool("virt-fw-vars")
        .arg("--input")
        .arg(vars)
        .args(["--print", "--verbose"]));
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The signature-list line after variable `name`'s in [`store`]'s text.
fn siglists(store: &str, name: &str) -> String {
    store
        .split(&format!("name={name} "))
        .nth(1)
        .map(|s| s.split("\nname=").next().unwrap_or(s).to_string())
        .unwrap_or_default()
}

/// Issue 29's db rotation and dbx revocation under OVMF's Secure Boot
/// firmware. Version 0.1.0 (signed with db key 1) carries the KEK-signed
/// append of db key 2: its runtime writes it to firmware's db, which the
/// variable store then holds, and META trusts both keys. Only then does
/// the disk take 0.2.0, signed with db key 2, which firmware boots; it
/// carries the dbx append revoking 0.1.0's UKI of slot A, which its
/// runtime writes once blessed. The disk then refuses to upgrade to 0.1.0,
/// and when that UKI is put in a trial entry of slot A by hand, firmware
/// refuses it (it is signed by db key 1, which firmware still trusts: only
/// dbx forbids it) and slot B comes up again.
///
/// The upgrade to 0.2.0 also replaced the ESP's boot loader with 0.2.0's,
/// signed with db key 2 (sbverify). So 0.3.0 may retire db key 1: its dbx
/// append revokes key 1's certificate. Once its runtime wrote it, the
/// machine still boots (its boot loader is key 2's), the disk refuses
/// 0.1.0 by that certificate, and firmware refuses 0.1.0's UKI of slot B,
/// which no digest revokes, in a trial entry: slot A comes up again.
#[test]
fn a_db_key_rotates_and_a_revoked_uki_is_refused_by_firmware() {
    let i = images();
    let rotated = rotated_keys();
    let add = rotation_files(
        "sb-rot-db",
        &["--add-db", rotated.join("db.crt").to_str().unwrap()],
    );
    let with_updates = |files: &Path, name: &str| {
        let f = files.join(name).display().to_string();
        move |t: String| {
            t.replace(
                "  enroll: force\n",
                &format!("  enroll: force\n  updates:\n    - {f}\n"),
            )
        }
    };
    let v1 = variant(
        "sb-rot-v1",
        &i.keys,
        "0.1.0",
        with_updates(&add, "db.append.auth"),
    );
    let revoke = rotation_files(
        "sb-rot-dbx",
        &["--revoke", v1.dir.join("uki-a.efi").to_str().unwrap()],
    );
    let v2 = variant(
        "sb-rot-v2",
        &rotated,
        "0.2.0",
        with_updates(&revoke, "dbx.append.auth"),
    );
    // A version that revokes its own UKI is refused at build.
    let own = rotation_files(
        "sb-rot-own",
        &["--revoke", v2.dir.join("uki-b.efi").to_str().unwrap()],
    );
    // (v2's profile with v2's version: the same UKIs.)
    let profile = write_profile_from("secureboot", "sb-rot-own", |t| {
        with_updates(&own, "dbx.append.auth")(t)
            .replace("version: 0.1.0", "version: 0.2.0")
            .replace(
                "  enroll: force\n",
                &format!("  enroll: force\n  keys: {}\n", rotated.display()),
            )
    });
    let out = run(imager()
        .args(["build", "--profile"])
        .arg(&profile)
        .arg("--out")
        .arg(scratch().join("sb-rot-own-out"))
        .args(["--key", dev_key().to_str().unwrap()]));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("revokes the payload's own UKI of slot B"),
        "{err}"
    );

    let disk = sparse_copy(&v1.artifact("raw"), "sb-rot");
    let vars = vars("sb-rot");
    // Before firmware holds db key 2, the disk refuses what it signs.
    refused_upgrade(&disk, &v2, "adds the new db certificate to firmware");
    let db2 = String::from_utf8(
        run(tool("openssl")
            .args(["x509", "-noout", "-subject", "-in"])
            .arg(rotated.join("db.crt")))
        .stdout,
    )
    .unwrap();
    let db2 = db2.trim().rsplit("CN = ").next().unwrap().to_string();
    assert!(!siglists(&store(&vars), "db").contains(&db2));

    // 0.1.0 writes db key 2 into firmware's db.
    let (r, console) = sb_boot(&disk, &vars, false);
    assert_eq!(slot_of(&r), ("0.1.0".into(), "A".into()));
    assert_eq!(r["secure_boot"], "on");
    assert!(
        console.contains("secure boot: db.append.auth: firmware's db took 1 entries"),
        "{console}"
    );
    assert!(
        console.contains("secure boot: META trusts the 2 db certificates firmware holds"),
        "{console}"
    );
    assert!(
        siglists(&store(&vars), "db").contains(&db2),
        "{}",
        store(&vars)
    );

    // 0.2.0, signed with db key 2, boots; it revokes 0.1.0's UKI of slot A.
    let up = upgrade(&disk, &installer(&v2), &[]);
    assert!(up.status.success(), "{up:?}");
    // Its upgrade replaced the ESP's boot loader with its own, key 2's.
    let loader = esp_loader(&disk, "sb-rot-loader");
    assert!(signed_for(&loader, &rotated.join("db.crt")));
    assert!(!signed_for_db(&loader));
    let dbx_before = siglists(&store(&vars), "dbx");
    let (r, console) = sb_boot(&disk, &vars, false);
    assert_eq!(slot_of(&r), ("0.2.0".into(), "B".into()), "{console}");
    assert!(
        console.contains("machined: blessed slot B (0.2.0)"),
        "{console}"
    );
    assert!(
        console.contains("secure boot: dbx.append.auth: firmware's dbx took 1 entries"),
        "{console}"
    );
    let dbx_after = siglists(&store(&vars), "dbx");
    assert_ne!(dbx_before, dbx_after, "{dbx_after}");

    // The disk refuses 0.1.0 now; firmware refuses its UKI of slot A.
    refused_upgrade(
        &disk,
        &v1,
        "revoked by this disk's Secure Boot updates (by its digest",
    );
    uki_in_trial(
        &disk,
        &v2,
        "g00000003-slot-a+3-0.efi",
        &v1.dir.join("uki-a.efi"),
    );
    let (r, console) = sb_boot(&disk, &vars, true);
    assert_eq!(slot_of(&r), ("0.2.0".into(), "B".into()), "{console}");
    assert!(
        console.contains("Error loading \\EFI\\Linux\\g00000003-slot-a+2-1.efi: Access Denied"),
        "{console}"
    );
    // Each boot of 0.2.0 finds firmware holding what it wants.
    assert!(
        console.contains("secure boot: dbx holds the 1 entries of dbx.append.auth"),
        "{console}"
    );

    // 0.3.0 retires db key 1: its dbx append revokes key 1's certificate.
    let retire = rotation_files(
        "sb-rot-retire",
        &["--revoke-cert", i.keys.join("db.crt").to_str().unwrap()],
    );
    let v3 = variant(
        "sb-rot-v3",
        &rotated,
        "0.3.0",
        with_updates(&retire, "dbx.append.auth"),
    );
    let up = upgrade(&disk, &installer(&v3), &[]);
    assert!(up.status.success(), "{up:?}");
    let dbx_before = siglists(&store(&vars), "dbx");
    let (r, console) = sb_boot(&disk, &vars, false);
    assert_eq!(slot_of(&r), ("0.3.0".into(), "A".into()), "{console}");
    assert!(
        console.contains("secure boot: dbx.append.auth: firmware's dbx took 1 entries"),
        "{console}"
    );
    assert_ne!(dbx_before, siglists(&store(&vars), "dbx"));
    // META trusts key 2 alone now.
    assert!(
        console.contains("secure boot: META trusts the 1 db certificates firmware holds"),
        "{console}"
    );
    let pem = meta_value(&disk, "secure-boot");
    assert_eq!(pem.matches("BEGIN CERTIFICATE").count(), 1, "{pem}");
    // The disk refuses what key 1 signed, by its certificate.
    refused_upgrade(
        &disk,
        &v1,
        "revoked by this disk's Secure Boot updates (by the certificate",
    );
    // Firmware refuses 0.1.0's UKI of slot B, which no digest revokes.
    uki_in_trial(
        &disk,
        &v3,
        "g00000005-slot-b+3-0.efi",
        &v1.dir.join("uki-b.efi"),
    );
    let (r, console) = sb_boot(&disk, &vars, true);
    assert_eq!(slot_of(&r), ("0.3.0".into(), "A".into()), "{console}");
    assert!(
        console.contains("Error loading \\EFI\\Linux\\g00000005-slot-b+2-1.efi: Access Denied"),
        "{console}"
    );
    // Nor is that slot made the default by a rollback, forced or not.
    refused(
        &disk,
        &["rollback", "--force"],
        "its UKI is revoked by this disk's Secure Boot updates (by the certificate",
    );
}
