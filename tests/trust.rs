//! A root of trust that rotates (issue 29), end to end through the
//! commands: keys made by `imager keygen`, roots by `imager root init` and
//! signed by `imager root sign`, builds that carry them (`signing.root`,
//! `signing.cosigners`), `imager sign --add`, `imager upgrade` and a real
//! boot of the upgraded disk under OVMF, whose blessing moves META to the
//! new root. (A power cut at every write of the root change is
//! `bootstate`'s test `a_root_of_trust_and_secure_boot_updates_change_at_the_blessing_whatever_the_cut`.)
// Tests panic on unexpected failures: that is how a test fails.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use serde_json::Value;
use std::path::{Path, PathBuf};

fn inspect(disk: &Path) -> Value {
    serde_json::from_str(&ok(imager().args(["inspect", "--json"]).arg(disk))).unwrap()
}

/// The disk's root of trust as inspect shows it: (version, threshold, key
/// ids), and the version a pending upgrade brings.
fn root_of(disk: &Path) -> ((u64, u64, Vec<String>), Option<u64>) {
    let s = &inspect(disk)["slots"];
    let keys = s["trusted_keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k.as_str().unwrap().to_string())
        .collect();
    let root = s["trust_root"].as_array().unwrap();
    (
        (root[0].as_u64().unwrap(), root[1].as_u64().unwrap(), keys),
        s["trust_root_next"].as_u64(),
    )
}

fn upgrade(disk: &Path, installer: &Path) -> std::process::Output {
    run(imager()
        .args(["upgrade", "--json", "--installer"])
        .arg(installer)
        .arg("--disk")
        .arg(disk))
}

fn key_id(dir: &Path, name: &str) -> String {
    let key = imager::sign::load_public_key(&dir.join(format!("{name}.pub"))).unwrap();
    imager::sign::key_id(&key)
}

/// Builds the default profile at `version`, carrying `root`, signed by
/// `key` and `cosigners`.
fn build(name: &str, version: &str, root: &Path, key: &Path, cosigners: &[PathBuf]) -> Build {
    let mut signing = format!("signing:\n  root: {}\n", root.display());
    if !cosigners.is_empty() {
        signing.push_str("  cosigners:\n");
        for c in cosigners {
            signing.push_str(&format!("    - {}\n", c.display()));
        }
    }
    let profile = write_profile(name, |t| {
        format!(
            "{}\n{signing}",
            t.replace("version: 0.1.0", &format!("version: {version}"))
        )
    });
    build_profile(name, &profile, &["--key", &key.display().to_string()])
}

#[test]
fn a_root_rotates_at_the_blessing_and_then_refuses_the_retired_key() {
    let dir = scratch().join("trust");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for k in ["a", "b", "c"] {
        ok(imager()
            .args(["keygen", "--private"])
            .arg(dir.join(format!("{k}.key"))));
    }
    let file = |n: &str| dir.join(n);
    let (a, b, c) = (key_id(&dir, "a"), key_id(&dir, "b"), key_id(&dir, "c"));
    // Root 1: A and B, either one. Root 2: B and C, both; signed by root
    // 1 (A) and by itself (B, C).
    ok(imager()
        .args(["root", "init", "--threshold", "1", "--key"])
        .arg(file("a.pub"))
        .arg("--key")
        .arg(file("b.pub"))
        .arg("-o")
        .arg(file("root1.json")));
    let said = ok(imager()
        .args([
            "root",
            "init",
            "--version",
            "2",
            "--threshold",
            "2",
            "--key",
        ])
        .arg(file("b.pub"))
        .arg("--key")
        .arg(file("c.key"))
        .arg("-o")
        .arg(file("root2.json")));
    assert!(said.contains("version 2, 2 of 2 keys"), "{said}");
    for k in ["a", "b", "c"] {
        ok(imager()
            .args(["root", "sign", "--key"])
            .arg(file(&format!("{k}.key")))
            .arg(file("root2.json")));
    }

    let v1 = build(
        "trust-v1",
        "0.1.0",
        &file("root1.json"),
        &file("a.key"),
        &[],
    );
    let v2 = build(
        "trust-v2",
        "0.2.0",
        &file("root2.json"),
        &file("b.key"),
        &[file("c.key")],
    );
    let v3 = build(
        "trust-v3",
        "0.3.0",
        &file("root2.json"),
        &file("b.key"),
        &[],
    );

    let disk = sparse_copy(&v1.artifact("raw"), "trust-disk.raw");
    assert_eq!(
        root_of(&disk),
        ((1, 1, vec![a.clone(), b.clone()]), None),
        "the disk starts with the root its build carried"
    );
    // The upgrade that brings root 2, signed by B and C.
    let out = upgrade(&disk, &v2.dir);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        root_of(&disk),
        ((1, 1, vec![a.clone(), b.clone()]), Some(2))
    );
    // Rolled back before its blessing: root 1 stays.
    let copy = sparse_copy(&disk, "trust-rolled-back.raw");
    ok(imager().args(["rollback", "--disk"]).arg(&copy));
    assert_eq!(root_of(&copy), ((1, 1, vec![a.clone(), b.clone()]), None));

    // Booted and blessed: root 2 is the disk's.
    let log = dir.join("console.log");
    let report: Value = serde_json::from_str(&ok(imager()
        .args(["boot", "--write", "--quiet", "--json", "--timeout", "900"])
        .arg("--console-log")
        .arg(&log)
        .arg(&disk)))
    .unwrap();
    assert_eq!(report["version"], "0.2.0", "{report}");
    assert_eq!(root_of(&disk), ((2, 2, vec![b.clone(), c.clone()]), None));

    // A, retired, is refused alone (v1's payload, signed by A only).
    let out = upgrade(&disk, &v1.dir);
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && e.contains("is not signed by 2 keys of this disk's root of trust (version 2")
            && e.contains(&format!("it says it is signed by {a}"))
            && e.contains("nothing was written"),
        "{e}"
    );
    // B alone is short of root 2's threshold; with C's signature added
    // (on another machine, say), it installs.
    let out = upgrade(&disk, &v3.dir);
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && e.contains(&format!("it carries 1 valid signature(s) ({b})"))
            && e.contains("imager sign --add"),
        "{e}"
    );
    ok(imager()
        .args(["sign", "--add"])
        .arg(file("c.key"))
        .arg(&v3.dir));
    let out = upgrade(&disk, &v3.dir);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["to_version"], "0.3.0", "{r}");
    assert_eq!(r["key_id"], format!("{b}, {c}"), "{r}");
}
