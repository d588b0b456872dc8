//! `secure_boot.enroll` other than `force` (docs/profiles.md,
//! docs/secureboot.md "Enrolment, both ways"): the build writes the mode
//! into the ESP's `loader.conf` beside the signed key updates in
//! `loader/keys/auto/`, and systemd-boot, on a machine in setup mode,
//! enrols nothing by itself with either; `manual` offers the keys as a menu
//! entry ("Enroll Secure Boot keys: auto"), `off` does not. Each image is
//! built, its ESP read with mtools, and booted under OVMF's Secure Boot
//! firmware with an empty variable store whose one-shot menu timeout
//! (`LoaderConfigTimeoutOneShot`, systemd-boot's own variable, set with
//! virt-fw-vars) makes systemd-boot show its menu on the serial console.

// Test helpers panic on unexpected failures: that is how a test fails.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use serde_json::Value;
use std::path::Path;

/// systemd-boot's vendor GUID for its own variables.
const LOADER_GUID: &str = "4a67b082-0a4c-41cf-b6c7-440b29bb8c4f";

/// `virt-fw-vars --print` of the store `vars`.
fn print_vars(vars: &Path) -> String {
    ok(tool("virt-fw-vars")
        .arg("--input")
        .arg(vars)
        .args(["--print", "--verbose"]))
}

/// `mtype`/`mdir` of `path` in the FAT image `esp`.
fn mtools(cmd: &str, esp: &Path, args: &[&str], path: &str) -> String {
    ok(tool(cmd)
        .arg("-i")
        .arg(esp)
        .args(args)
        .arg(format!("::{path}")))
}

/// Builds metal with Secure Boot and `enroll: MODE` (its own key set),
/// checks its ESP, and boots it in setup mode with the menu shown: the
/// console, the boot's report and the store afterwards are checked against
/// what `MODE` does; `offered`: whether the menu offers the keys.
fn enrol_with(mode: &str, offered: bool) {
    let name = format!("enroll-{mode}");
    let keys = scratch().join(format!("{name}-keys"));
    let _ = std::fs::remove_dir_all(&keys);
    ok(imager().args(["keygen", "--secure-boot"]).arg(&keys));
    let profile = write_profile_from("secureboot", &name, |t| {
        let from = "\nsecure_boot:\n  enroll: force\n";
        let outputs = "\noutputs: [raw, installer, uki]\n";
        assert!(
            t.contains(from) && t.contains(outputs),
            "secureboot.yaml changed"
        );
        t.replace(
            from,
            &format!(
                "\nsecure_boot:\n  keys: {}\n  enroll: {mode}\n",
                keys.display()
            ),
        )
        .replace(outputs, "\noutputs: [raw]\n")
    });
    let b = build_profile(&name, &profile, &["--key", dev_key().to_str().unwrap()]);
    let raw = b.artifact("raw");

    // The ESP: loader.conf says the mode; the signed updates are there.
    let esp = scratch().join(format!("{name}-esp.img"));
    extract_partition(&raw, "EFI", &esp);
    let conf = mtools("mtype", &esp, &[], "/loader/loader.conf");
    let modes: Vec<&str> = conf
        .lines()
        .filter(|l| l.starts_with("secure-boot-enroll"))
        .collect();
    assert_eq!(modes, [format!("secure-boot-enroll {mode}")], "{conf}");
    let listed = mtools("mdir", &esp, &["-b"], "/loader/keys/auto");
    for f in ["PK.auth", "KEK.auth", "db.auth"] {
        assert!(listed.contains(f), "{f}: {listed}");
    }
    std::fs::remove_file(&esp).unwrap();

    // A machine in setup mode (OVMF's empty store) whose systemd-boot
    // shows its menu for 2 s once.
    let vars = scratch().join(format!("{name}.vars"));
    let json = scratch().join(format!("{name}-vars.json"));
    let two: Vec<u8> = "2\0".encode_utf16().flat_map(u16::to_le_bytes).collect();
    std::fs::write(
        &json,
        serde_json::json!({"version": 2, "variables": [{
            "name": "LoaderConfigTimeoutOneShot",
            "guid": LOADER_GUID,
            "attr": 7,
            "data": hex(&two),
        }]})
        .to_string(),
    )
    .unwrap();
    let _ = std::fs::remove_file(&vars);
    ok(tool("virt-fw-vars")
        .arg("--input")
        .arg(imager::qemu::OVMF_VARS)
        .arg("--set-json")
        .arg(&json)
        .arg("--output")
        .arg(&vars));
    std::fs::remove_file(&json).unwrap();
    let before = print_vars(&vars);
    assert!(
        before.contains("name=LoaderConfigTimeoutOneShot"),
        "{before}"
    );
    for var in ["PK", "KEK", "db"] {
        assert!(!before.contains(&format!("name={var} ")), "{before}");
    }

    let log = scratch().join(format!("{name}.console"));
    let report: Value = boot_report(
        &raw,
        &[
            "--secure-boot",
            vars.to_str().unwrap(),
            "--console-log",
            log.to_str().unwrap(),
        ],
    )
    .unwrap_or_else(|e| panic!("{mode}: {e}"));
    let console = std::fs::read_to_string(&log).unwrap();
    // Ready on slot A, Secure Boot off (setup mode enforces nothing),
    // without a reset: the firmware started a boot option once.
    assert_eq!(report["ready"], true, "{report}");
    assert_eq!(report["slot"], "A", "{report}");
    assert_eq!(report["secure_boot"], "off", "{report}");
    assert_eq!(
        console.matches("BdsDxe: starting Boot").count(),
        1,
        "{console}"
    );
    assert!(!console.contains("Enrolling secure boot keys"), "{console}");
    // systemd-boot took the one-shot timeout (it deletes it) and showed
    // its menu: the keys are an entry of it with manual only.
    let after = print_vars(&vars);
    assert!(
        !after.contains("name=LoaderConfigTimeoutOneShot"),
        "systemd-boot did not read its one-shot timeout: {after}"
    );
    let menu = &console[..console
        .find("Linux version")
        .unwrap_or_else(|| panic!("no kernel started:\n{console}"))];
    assert!(menu.contains("Imager 0.1.0 (slot A)"), "no menu: {menu}");
    assert_eq!(
        menu.contains("Enroll Secure Boot keys: auto"),
        offered,
        "{mode}: {menu}"
    );
    // Nothing enrolled: still setup mode.
    for var in ["PK", "KEK", "db"] {
        assert!(!after.contains(&format!("name={var} ")), "{var}: {after}");
    }
    std::fs::remove_file(&vars).unwrap();
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[test]
fn enroll_manual_offers_the_keys_in_the_menu_and_enrols_nothing_by_itself() {
    enrol_with("manual", true);
}

#[test]
fn enroll_off_neither_offers_nor_enrols_the_keys() {
    enrol_with("off", false);
}
