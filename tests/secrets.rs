//! No secret in any output: every command and every profile key that takes
//! a file is fed a private key (PEM, raw bytes, raw hex) and a password
//! hash file in place of what it expects, and no byte of the secret may
//! appear in what the command prints or leaves behind.
//!
//! The kernel comes from the build cache (`scripts/test` builds it first):
//! the profile variants change nothing that goes into the kernel's cache key
//! except the file that is refused before the kernel is looked at.

// Test helpers panic on unexpected failures: that is how a test fails.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A secret file and the fragments of it that must never be seen.
struct Secret {
    name: &'static str,
    path: PathBuf,
    /// Byte strings of which no part of `WINDOW` bytes may appear.
    material: Vec<Vec<u8>>,
}

/// How long a run of a secret's bytes counts as leaked.
const WINDOW: usize = 10;

fn secrets(dir: &Path) -> Vec<Secret> {
    std::fs::create_dir_all(dir).unwrap();
    let pem = dir.join("signing.key");
    let public = dir.join("signing.pub");
    if !pem.exists() {
        ok(imager()
            .args(["keygen", "--private"])
            .arg(&pem)
            .arg("--public")
            .arg(&public));
    }
    let text = std::fs::read_to_string(&pem).unwrap();
    let body: String = text.lines().filter(|l| !l.starts_with("-----")).collect();
    // The first 20 base64 characters are the PKCS#8 header every ed25519
    // key shares; the rest is the key.
    let key_b64 = body.as_bytes()[20..].to_vec();
    // A raw 32-byte key, as bytes and as hex digits (fixed: the test must
    // find it if it leaks, not depend on chance).
    let raw: Vec<u8> = (0u8..32)
        .map(|i| i.wrapping_mul(37).wrapping_add(0x9d))
        .collect();
    let raw_path = dir.join("raw.key");
    std::fs::write(&raw_path, &raw).unwrap();
    let hex_text = hex(&raw);
    let hex_path = dir.join("raw-hex.key");
    std::fs::write(&hex_path, format!("{hex_text}\n")).unwrap();
    let shadow = dir.join("shadow");
    let hash = "$y$j9T$Zq3vN8pLwK2mXc7R$QmVyeVNlY3JldFBhc3N3b3JkSGFzaA";
    std::fs::write(
        &shadow,
        format!("root:{hash}:19700:0:99999:7:::\ndaemon:*:19700:0:99999:7:::\n"),
    )
    .unwrap();
    vec![
        Secret {
            name: "pem",
            path: pem,
            material: vec![key_b64],
        },
        Secret {
            name: "raw",
            path: raw_path,
            material: vec![raw.clone(), hex(&raw).into_bytes()],
        },
        Secret {
            name: "hex",
            path: hex_path,
            material: vec![hex_text.into_bytes()],
        },
        Secret {
            name: "shadow",
            path: shadow,
            material: vec![hash.as_bytes().to_vec()],
        },
    ]
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The first window of `material` found in `haystack`, if any.
fn leaked(haystack: &[u8], material: &[u8]) -> Option<String> {
    material
        .windows(WINDOW.min(material.len()))
        .find(|w| haystack.windows(w.len()).any(|h| h == *w))
        .map(|w| String::from_utf8_lossy(w).into_owned())
}

/// Runs `cmd`, expects it to fail, and checks that neither its output nor
/// any file under `left` holds any of the secret's material.
fn refused_without_leak(
    secret: &Secret,
    what: &str,
    cmd: &mut Command,
    left: Option<&Path>,
) -> String {
    let out = run(cmd);
    let mut seen = out.stdout.clone();
    seen.extend_from_slice(&out.stderr);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "{what} with {}: succeeded\n{stderr}",
        secret.name
    );
    assert!(
        !seen.iter().all(u8::is_ascii_whitespace),
        "{what} with {}: failed without a message",
        secret.name
    );
    for m in &secret.material {
        if let Some(w) = leaked(&seen, m) {
            panic!(
                "{what} with {}: printed secret material {w:?}:\n{stderr}",
                secret.name
            );
        }
    }
    if let Some(dir) = left.filter(|d| d.exists()) {
        for e in walkdir::WalkDir::new(dir) {
            let e = e.unwrap();
            if !e.file_type().is_file() {
                continue;
            }
            let bytes = std::fs::read(e.path()).unwrap();
            for m in &secret.material {
                assert!(
                    leaked(&bytes, m).is_none(),
                    "{what} with {}: wrote secret material into {}",
                    secret.name,
                    e.path().display()
                );
            }
        }
    }
    stderr.into_owned()
}

/// Where a PEM private key is read as text, the message says what it is.
fn says_private_key(secret: &Secret, what: &str, stderr: &str) {
    if secret.name == "pem" {
        assert!(
            stderr.contains("looks like a private key"),
            "{what}: the message does not say the file is a private key:\n{stderr}"
        );
    }
}

/// A file with the x86 boot protocol's header marks and nothing else: the
/// kernel check passes it, so that what comes after it is reached.
fn fake_bzimage(dir: &Path) -> PathBuf {
    let mut b = vec![0u8; 0x400];
    b[0x1fe..0x200].copy_from_slice(&[0x55, 0xaa]);
    b[0x202..0x206].copy_from_slice(b"HdrS");
    let p = dir.join("bzImage");
    std::fs::write(&p, b).unwrap();
    p
}

/// Profile keys that name a file, each set to the secret in a variant of
/// the default profile. Values are YAML, with `S` for the secret's path and
/// `B` for a file that passes as a bzImage; last, whether the key is read as
/// text (so that a PEM key is named as such).
const PROFILE_KEYS: &[(&str, &str, &str, bool)] = &[
    (
        "kernel.rules",
        "  rules: ../kernel-config/kspp-rules.yaml",
        "  rules: S",
        true,
    ),
    (
        "kernel.waiver_files",
        "    - ../kernel-config/kspp-waivers.yaml",
        "    - S",
        true,
    ),
    (
        "kernel.fragments",
        "    - ../kernel-config/kspp.config",
        "    - ../kernel-config/kspp.config\n    - S",
        true,
    ),
    (
        "kernel.prebuilt",
        "  source: /usr/src/linux-source-6.12.tar.xz",
        "  prebuilt: S\n  prebuilt_config: ../kernel-config/base.config",
        false,
    ),
    (
        "kernel.prebuilt_config",
        "  source: /usr/src/linux-source-6.12.tar.xz",
        "  prebuilt: B\n  prebuilt_config: S",
        true,
    ),
    (
        "runtime.manifest",
        "  manifest: ../rootfs/skeleton.txt",
        "  manifest: S",
        true,
    ),
    (
        "runtime.binary",
        "  cargo_package: ../rootfs",
        "  binary: S",
        false,
    ),
    (
        "boot.systemd_boot",
        "disk:\n",
        "boot:\n  systemd_boot: S\ndisk:\n",
        false,
    ),
    (
        "node_api.ca",
        "disk:\n",
        "node_api:\n  ca: S\ndisk:\n",
        true,
    ),
];

#[test]
fn no_command_prints_or_writes_a_secret_it_was_given_in_place_of_its_input() {
    let dir = scratch().join("secrets");
    let all = secrets(&dir.join("inputs"));
    let out_dir = dir.join("out");
    // A disk for the commands that need one besides the secret.
    let disk = dir.join("blank.raw");
    std::fs::write(&disk, vec![0u8; 1 << 20]).unwrap();
    for s in &all {
        let sp = s.path.to_str().unwrap();
        let fresh = || {
            let _ = std::fs::remove_dir_all(&out_dir);
            out_dir.clone()
        };
        // The profile itself.
        let o = fresh();
        let err = refused_without_leak(
            s,
            "build --profile",
            imager().args(["build", "--profile", sp, "--out"]).arg(&o),
            Some(&o),
        );
        says_private_key(s, "build --profile", &err);
        // Each profile key that names a file.
        let bz = fake_bzimage(&dir);
        for (key, from, to, text) in PROFILE_KEYS {
            let name = format!("secret-{}-{}", s.name, key.replace('.', "-"));
            let p = write_profile(&name, |t| {
                assert!(t.contains(from), "{key}: {from:?} not in the profile");
                let to = to.replace('S', sp).replace('B', bz.to_str().unwrap());
                t.replacen(from, &to, 1)
            });
            let o = fresh();
            let what = format!("build with {key}");
            let err = refused_without_leak(
                s,
                &what,
                imager()
                    .args(["build", "--profile"])
                    .arg(&p)
                    .arg("--out")
                    .arg(&o),
                Some(&o),
            );
            if *text {
                says_private_key(s, &what, &err);
            }
        }
        // The signing key: a file that is not a PKCS#8 private key.
        if s.name != "pem" {
            let o = fresh();
            refused_without_leak(
                s,
                "build --key",
                imager()
                    .args(["build", "--profile", "metal", "--key", sp, "--out"])
                    .arg(&o),
                Some(&o),
            );
        }
        // The kernel audit.
        let config = repo().join("kernel-config/base.config");
        let rules = repo().join("kernel-config/kspp-rules.yaml");
        for (what, args) in [
            ("kernel check CONFIG", vec!["kernel", "check", sp]),
            (
                "kernel check --rules",
                vec!["kernel", "check", config.to_str().unwrap(), "--rules", sp],
            ),
            (
                "kernel check --waivers",
                vec![
                    "kernel",
                    "check",
                    config.to_str().unwrap(),
                    "--rules",
                    rules.to_str().unwrap(),
                    "--waivers",
                    sp,
                ],
            ),
            (
                "kernel check --cmdline",
                vec![
                    "kernel",
                    "check",
                    config.to_str().unwrap(),
                    "--rules",
                    rules.to_str().unwrap(),
                    "--cmdline",
                    sp,
                ],
            ),
        ] {
            let err = refused_without_leak(s, what, imager().args(&args), None);
            says_private_key(s, what, &err);
        }
        // Verification, inspection, installation, boot.
        let dir_with_secret_manifest = dir.join("manifest-dir");
        let _ = std::fs::remove_dir_all(&dir_with_secret_manifest);
        std::fs::create_dir_all(&dir_with_secret_manifest).unwrap();
        std::fs::copy(&s.path, dir_with_secret_manifest.join("manifest.json")).unwrap();
        std::fs::write(
            dir_with_secret_manifest.join("manifest.json.sig"),
            [0u8; 64],
        )
        .unwrap();
        let target = dir.join("target.raw");
        let _ = std::fs::remove_file(&target);
        let disk_s = disk.to_str().unwrap();
        let target_s = target.to_str().unwrap();
        let md = dir_with_secret_manifest.to_str().unwrap();
        let public = dir.join("inputs/signing.pub");
        let pub_s = public.to_str().unwrap();
        for (what, args) in [
            ("verify --key", vec!["verify", md, "--key", sp]),
            ("verify (manifest)", vec!["verify", md, "--key", pub_s]),
            ("inspect", vec!["inspect", sp]),
            ("inspect --key", vec!["inspect", disk_s, "--key", sp]),
            (
                "install --installer",
                vec![
                    "install",
                    "--installer",
                    sp,
                    "--disk",
                    target_s,
                    "--key",
                    pub_s,
                ],
            ),
            (
                "install --key",
                vec![
                    "install",
                    "--installer",
                    md,
                    "--disk",
                    target_s,
                    "--key",
                    sp,
                ],
            ),
            (
                "upgrade --disk",
                vec!["upgrade", "--installer", md, "--disk", sp],
            ),
            (
                "upgrade --installer",
                vec!["upgrade", "--installer", sp, "--disk", disk_s],
            ),
            ("rollback --disk", vec!["rollback", "--disk", sp]),
            ("boot", vec!["boot", sp, "--timeout", "60"]),
            ("squashfs", vec!["squashfs", sp, target_s]),
        ] {
            refused_without_leak(s, what, imager().args(&args), Some(&target));
        }
        // keygen refuses to overwrite the secret and says nothing of it.
        let new = dir.join("new.key");
        let _ = std::fs::remove_file(&new);
        refused_without_leak(
            s,
            "keygen over an existing file",
            imager()
                .args(["keygen", "--private", sp, "--public"])
                .arg(&new),
            None,
        );
        assert!(!new.exists(), "keygen wrote half a pair");
    }
}
