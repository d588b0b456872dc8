//! The verification `docs/signing.md` documents for users with openssl,
//! jq and sha256sum alone ("Verifying with openssl alone", and the key id
//! command), run as written there: the commands are read from the page,
//! with only the build's directory and public key put in place of
//! `out/metal` and `/path/to/signing.pub`, so that the page and this test
//! cannot drift apart. On a real build every step succeeds; each step fails
//! on what it guards against.

// Test helpers panic on unexpected failures: that is how a test fails.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::Output;

const DOC: &str = "docs/signing.md";
/// What the page's block starts with and which key it names: replaced by
/// the build's directory and key.
const DOC_CD: &str = "cd out/metal";
const DOC_KEY: &str = "/path/to/signing.pub";

/// The first ```sh block after the line `heading` of docs/signing.md.
fn doc_block(heading: &str) -> String {
    let text = std::fs::read_to_string(repo().join(DOC)).unwrap();
    let mut lines = text.lines().skip_while(|l| *l != heading);
    assert!(lines.next().is_some(), "{DOC} has no line {heading:?}");
    let mut lines = lines.skip_while(|l| *l != "```sh");
    assert!(
        lines.next().is_some(),
        "{DOC} has no ```sh block after {heading:?}"
    );
    let block: Vec<&str> = lines.take_while(|l| *l != "```").collect();
    block.join("\n") + "\n"
}

/// The steps of "Verifying with openssl alone": (the comment that opens a
/// step, `# 1. …`, and its commands). The block must open with
/// [`DOC_CD`] and name [`DOC_KEY`] once.
fn documented_steps() -> Vec<(String, String)> {
    let block = doc_block("## Verifying with openssl alone");
    let mut lines = block.lines();
    assert_eq!(
        lines.next(),
        Some(DOC_CD),
        "{DOC}'s openssl block no longer opens with {DOC_CD:?}: update tests/signing.rs with it"
    );
    assert_eq!(
        block.matches(DOC_KEY).count(),
        1,
        "{DOC}'s openssl block no longer names the key {DOC_KEY:?} once: update tests/signing.rs with it"
    );
    let mut steps: Vec<(String, String)> = Vec::new();
    for l in lines {
        let opens = l
            .strip_prefix("# ")
            .and_then(|r| r.split_once(". "))
            .is_some_and(|(n, _)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
        if opens {
            steps.push((l.to_string(), String::new()));
        } else {
            let (_, text) = steps
                .last_mut()
                .unwrap_or_else(|| panic!("{DOC}: a command before the first numbered step: {l}"));
            text.push_str(l);
            text.push('\n');
        }
    }
    let titles: Vec<&str> = steps.iter().map(|(t, _)| t.as_str()).collect();
    assert_eq!(
        steps.len(),
        3,
        "{DOC}'s openssl block has other steps than signature, paths, digests: {titles:?}"
    );
    steps
}

/// A shell script run with `sh -e` in `dir`, the documented key replaced
/// by `key`.
fn sh_in(dir: &Path, key: &Path, script: &str) -> Output {
    let quote = |p: &Path| {
        let s = p.to_str().unwrap();
        assert!(!s.contains('\''), "{s}");
        format!("'{s}'")
    };
    run(tool("sh")
        .arg("-e")
        .arg("-c")
        .arg(script.replace(DOC_KEY, &quote(key)))
        .current_dir(dir))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The documented steps run in `dir` with `key`: each step's output, up to
/// and including the first that fails (as a user following the page would
/// stop there).
fn verify_as_documented(dir: &Path, key: &Path) -> Vec<(String, Output)> {
    let mut ran = Vec::new();
    for (title, script) in documented_steps() {
        let out = sh_in(dir, key, &script);
        let failed = !out.status.success();
        ran.push((title, out));
        if failed {
            break;
        }
    }
    ran
}

fn report(ran: &[(String, Output)]) -> String {
    ran.iter()
        .map(|(t, o)| {
            format!(
                "{t} -> {}\nstdout:\n{}stderr:\n{}",
                o.status,
                text(&o.stdout),
                text(&o.stderr)
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Asserts that the documented steps pass up to step `fails` (1-based),
/// which fails, printing `expected` in its output; `None`: all pass.
fn assert_fails_at(ran: &[(String, Output)], fails: Option<usize>, expected: &str) {
    let passed = ran.iter().take_while(|(_, o)| o.status.success()).count();
    match fails {
        None => assert_eq!(
            passed,
            3,
            "the documented verification failed:\n{}",
            report(ran)
        ),
        Some(step) => {
            assert_eq!(
                (passed, ran.len()),
                (step - 1, step),
                "expected steps before {step} to pass and step {step} to fail:\n{}",
                report(ran)
            );
            let (_, o) = &ran[step - 1];
            let said = text(&o.stdout) + &text(&o.stderr);
            assert!(
                said.contains(expected),
                "step {step} failed without {expected:?}:\n{}",
                report(ran)
            );
        }
    }
}

struct Signed {
    /// The build's output directory.
    dir: PathBuf,
    key: PathBuf,
    public: PathBuf,
    /// Another key's public half.
    other: PathBuf,
}

/// One build of profiles/metal.yaml signed with a key of its own, shared
/// by the tests of this file. A build that fails fails every test at once
/// with its message; it is not tried again.
fn signed() -> &'static Signed {
    static BUILD: Fixture<Signed> = Fixture::new("signing");
    BUILD.get(|| {
        let keys = scratch().join("signing-keys");
        let _ = std::fs::remove_dir_all(&keys);
        for k in ["signing", "other"] {
            ok(imager()
                .args(["keygen", "--private"])
                .arg(keys.join(format!("{k}.key")))
                .arg("--public")
                .arg(keys.join(format!("{k}.pub"))));
        }
        let key = keys.join("signing.key");
        let b = build_profile(
            "signing",
            &repo().join("profiles/metal.yaml"),
            &["--key", key.to_str().unwrap()],
        );
        Signed {
            dir: b.dir,
            key,
            public: keys.join("signing.pub"),
            other: keys.join("other.pub"),
        }
    })
}

/// A copy of the build in target/e2e/signing-NAME whose files are hard
/// links to the build's: replace a file with [`replace`], never write it.
fn copy_of_build(name: &str) -> PathBuf {
    let s = signed();
    let dir = scratch().join(format!("signing-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    ok(tool("cp").arg("-al").arg(&s.dir).arg(&dir));
    dir
}

/// Replaces `path` (a hard link into the build) with a file of `bytes`.
fn replace(path: &Path, bytes: &[u8]) {
    std::fs::remove_file(path).unwrap();
    std::fs::write(path, bytes).unwrap();
}

fn manifest(dir: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap()
}

#[test]
fn the_documented_openssl_verification_succeeds_on_a_build_and_checks_every_artifact() {
    let s = signed();
    let ran = verify_as_documented(&s.dir, &s.public);
    assert_fails_at(&ran, None, "");
    let said = |step: usize| text(&ran[step].1.stdout) + &text(&ran[step].1.stderr);
    assert!(
        said(0).contains("Signature Verified Successfully"),
        "{}",
        said(0)
    );
    // Step 3 read every artifact the manifest lists, and found it intact.
    let m = manifest(&s.dir);
    let listed = m["artifacts"].as_array().unwrap();
    assert!(listed.iter().any(|a| a["kind"] == "raw"), "no disk in {m}");
    let step3 = text(&ran[2].1.stdout);
    let checked: Vec<&str> = step3.lines().collect();
    for a in listed {
        let line = format!("{}: OK", a["path"].as_str().unwrap());
        assert!(
            checked.contains(&line.as_str()),
            "sha256sum did not check {line:?}: {checked:?}"
        );
    }
    assert_eq!(checked.len(), listed.len(), "{checked:?}");
}

#[test]
fn the_documented_key_id_command_prints_the_manifests_key_id() {
    let s = signed();
    let block = doc_block("### Key id");
    let lines: Vec<&str> = block.lines().collect();
    assert_eq!(
        lines.len(),
        1,
        "{DOC}'s key id block is one command: {block}"
    );
    assert!(
        block.contains("signing.pub"),
        "{DOC}'s key id command no longer reads signing.pub: {block}"
    );
    // The command names the key `signing.pub` in the current directory.
    let keys = s.public.parent().unwrap();
    let out = sh_in(keys, &s.public, &block);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout).trim(),
        manifest(&s.dir)["key_id"].as_str().unwrap()
    );
    // And another key's id is another.
    let other = sh_in(keys, &s.public, &block.replace("signing.pub", "other.pub"));
    assert!(other.status.success(), "{}", text(&other.stderr));
    assert_ne!(text(&other.stdout), text(&out.stdout));
}

#[test]
fn the_documented_openssl_verification_fails_on_a_changed_artifact() {
    let dir = copy_of_build("artifact");
    let config = dir.join("kernel.config");
    let mut bytes = std::fs::read(&config).unwrap();
    bytes[0] ^= 1;
    replace(&config, &bytes);
    let ran = verify_as_documented(&dir, &signed().public);
    assert_fails_at(&ran, Some(3), "kernel.config: FAILED");
}

#[test]
fn the_documented_openssl_verification_fails_on_a_changed_manifest() {
    // The attacker changes an artifact and writes its new digest into the
    // manifest: only the signature (step 1) tells.
    let dir = copy_of_build("manifest");
    let config = dir.join("kernel.config");
    let old = std::fs::read(&config).unwrap();
    let mut new = old.clone();
    new[0] ^= 1;
    replace(&config, &new);
    let hex = |b: &[u8]| {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(b))
    };
    let m = std::fs::read_to_string(dir.join("manifest.json")).unwrap();
    assert!(m.contains(&hex(&old)), "kernel.config's digest not in {m}");
    replace(
        &dir.join("manifest.json"),
        m.replace(&hex(&old), &hex(&new)).as_bytes(),
    );
    let ran = verify_as_documented(&dir, &signed().public);
    assert_fails_at(&ran, Some(1), "Signature Verification Failure");
    // Steps 2 and 3 alone would have taken it.
    let steps = documented_steps();
    for (title, script) in &steps[1..] {
        let o = sh_in(&dir, &signed().public, script);
        assert!(o.status.success(), "{title}: {}", text(&o.stderr));
    }
}

#[test]
fn the_documented_openssl_verification_fails_on_a_damaged_signature_or_another_key() {
    let s = signed();
    let ran = verify_as_documented(&s.dir, &s.other);
    assert_fails_at(&ran, Some(1), "Signature Verification Failure");

    let dir = copy_of_build("signature");
    let sig = dir.join("manifest.json.sig");
    let mut bytes = std::fs::read(&sig).unwrap();
    assert_eq!(bytes.len(), 64);
    bytes[63] ^= 0x01;
    replace(&sig, &bytes);
    let ran = verify_as_documented(&dir, &s.public);
    assert_fails_at(&ran, Some(1), "Signature Verification Failure");
}

#[test]
fn the_documented_openssl_verification_fails_on_a_signed_manifest_whose_path_leaves_the_directory()
{
    // A manifest signed with the trusted key (a signer's mistake, or a
    // build of another tool) that lists a file outside the directory with
    // its right digest: the signature holds, step 2 refuses the path.
    let s = signed();
    let dir = copy_of_build("path");
    let outside = scratch().join("signing-outside");
    std::fs::write(&outside, b"outside the build\n").unwrap();
    let mut m = manifest(&dir);
    let digest = {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(std::fs::read(&outside).unwrap()))
    };
    m["artifacts"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({
            "kind": "raw",
            "path": "../signing-outside",
            "sha256": digest,
            "size": 18,
        }));
    let text_m = serde_json::to_string_pretty(&m).unwrap() + "\n";
    replace(&dir.join("manifest.json"), text_m.as_bytes());
    std::fs::remove_file(dir.join("manifest.json.sig")).unwrap();
    ok(tool("openssl")
        .args(["pkeyutl", "-sign", "-rawin", "-inkey"])
        .arg(&s.key)
        .arg("-in")
        .arg(dir.join("manifest.json"))
        .arg("-out")
        .arg(dir.join("manifest.json.sig")));
    let ran = verify_as_documented(&dir, &s.public);
    // jq -e prints `false` and exits 1.
    assert_fails_at(&ran, Some(2), "false");
    // Step 3 alone would have read the file outside and passed it.
    let o = sh_in(&dir, &s.public, &documented_steps()[2].1);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(
        text(&o.stdout).contains("../signing-outside: OK"),
        "{}",
        text(&o.stdout)
    );
}
