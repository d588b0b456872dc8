//! The build cache shared through a registry (docs/build-cache.md): a
//! build with `--cache-registry` pushes the kernel, GRUB's images and the
//! root filesystem's compressed blocks it has; a second build in an empty
//! cache directory (a second CI machine) pulls them, compiles no kernel,
//! runs no grub-mkimage, compresses no block, and makes the same bytes.
//! Entries tampered with in the registry's storage are refused, said with
//! how to clear them, made again, and the bytes are still the same. Two
//! builds pushing the same keys at once both succeed and leave whole
//! entries. (Refusals of foreign and moved entries are shown against the
//! same registry by `imager::remote_cache`'s tests.)

// Test helpers panic on unexpected failures: that is how a test fails.
#![allow(clippy::unwrap_used)]

mod common;
#[path = "../registry/tests/common/mod.rs"]
mod reg;

use common::*;
use serde_json::Value;
use std::path::Path;

/// `imager build --profile metal --json` into target/e2e/NAME with `args`
/// and `IMAGER_CACHE_DIR` set to `cache_dir` when given: the report and
/// the progress it printed.
fn build(name: &str, cache_dir: Option<&Path>, args: &[&str]) -> (Build, String) {
    let dir = scratch().join(name);
    let _ = std::fs::remove_dir_all(&dir);
    let mut cmd = imager();
    cmd.args(["build", "--profile", "metal", "--json", "--out"])
        .arg(&dir)
        .args(args);
    if let Some(c) = cache_dir {
        cmd.env("IMAGER_CACHE_DIR", c);
    }
    let out = run(&mut cmd);
    let progress = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "build {name}:\n{progress}");
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    (Build { dir, json }, progress)
}

#[test]
fn a_second_machine_pulls_the_kernel_the_first_pushed_and_builds_the_same_bytes() {
    let registry = reg::Registry::start();
    let repo = format!("{}/imager/cache", registry.addr);
    let shared = ["--cache-registry", repo.as_str(), "--cache-plain-http"];

    // The first machine: this one's cache (the kernel scripts/build made).
    let (first, said) = build("cache-first", None, &shared);
    for kind in ["kernel", "grub", "rootfs-blocks"] {
        assert!(
            said.contains(&format!("{kind}: pushed to the cache registry")),
            "{kind}:\n{said}"
        );
    }
    // Its entries, as an independent client lists them: the kernel, GRUB's
    // core image (the metal profile makes no ISO) and the blocks.
    let tags = list_tags(&repo);
    for kind in ["kernel", "grub", "rootfs-blocks"] {
        assert_eq!(
            tags.iter()
                .filter(|t| t.starts_with(&format!("{kind}-")))
                .count(),
            1,
            "{kind}: {tags:?}"
        );
    }

    // The second machine: an empty cache directory.
    let empty = scratch().join("cache-second-dir");
    let _ = std::fs::remove_dir_all(&empty);
    let (second, said) = build("cache-second", Some(&empty), &shared);
    for kind in ["kernel", "grub", "rootfs-blocks"] {
        assert!(
            said.contains(&format!("{kind}: pulled from the cache registry")),
            "{kind}:\n{said}"
        );
    }
    assert!(
        !said.contains("building bzImage"),
        "a kernel was compiled:\n{said}"
    );
    assert_eq!(second.json["kernel_cached"], true);
    // Every block of the root filesystem came from the pulled pack.
    let (kept, all) = blocks_kept(&said);
    assert_eq!(kept, all, "{said}");
    // Nothing was pushed: the registry had it all.
    assert!(!said.contains("pushed to the cache registry"), "{said}");
    // The same bytes as the first machine's.
    for kind in ["raw", "kernel"] {
        assert_eq!(
            sha256(&first.artifact(kind)),
            sha256(&second.artifact(kind)),
            "{kind} differs"
        );
    }
    // Once pulled, the second machine's own cache has it: no registry.
    let (_, said) = build("cache-third", Some(&empty), &[]);
    assert!(
        !said.contains("building bzImage") && !said.contains("cache registry"),
        "{said}"
    );

    // The GRUB and blocks entries changed in the registry's storage (the
    // same length, one byte flipped): a fourth machine refuses both, says
    // why and how to clear them, makes them itself, and its bytes are the
    // same.
    for kind in ["grub", "rootfs-blocks"] {
        let tag = tags
            .iter()
            .find(|t| t.starts_with(&format!("{kind}-")))
            .unwrap();
        let manifest: Value =
            serde_json::from_slice(&registry.get_manifest("imager/cache", tag)).unwrap();
        let digest = manifest["layers"][1]["digest"].as_str().unwrap();
        let file = registry.blob_file(&registry::Digest::parse(digest).unwrap());
        let mut bytes = std::fs::read(&file).unwrap();
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0x40;
        std::fs::write(&file, bytes).unwrap();
    }
    let empty = scratch().join("cache-fourth-dir");
    let _ = std::fs::remove_dir_all(&empty);
    let (fourth, said) = build("cache-fourth", Some(&empty), &shared);
    for kind in ["grub", "rootfs-blocks"] {
        let refused = format!("warning: {kind}: the cache registry's entry is refused");
        let line = said.lines().find(|l| l.contains(&refused));
        assert!(
            line.is_some_and(|l| l.contains("tampered") && l.contains("skopeo delete")),
            "{kind}:\n{said}"
        );
    }
    assert!(
        said.contains("kernel: pulled from the cache registry"),
        "{said}"
    );
    assert_eq!(blocks_kept(&said).0, 0, "{said}");
    for kind in ["raw", "rootfs"] {
        assert_eq!(
            sha256(&first.artifact(kind)),
            sha256(&fourth.artifact(kind)),
            "{kind} differs"
        );
    }
}

/// The tags of `repo`, as skopeo lists them.
fn list_tags(repo: &str) -> Vec<String> {
    let out = run(std::process::Command::new(reg::tool("skopeo"))
        .args(["list-tags", "--tls-verify=false"])
        .arg(format!("docker://{repo}")));
    assert!(out.status.success(), "skopeo list-tags {repo}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v["Tags"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap().to_string())
        .collect()
}

/// The blocks of the root filesystem a build took from its pack, and all
/// it wrote (`rootfs: X of Y blocks kept …`; none said: none kept).
fn blocks_kept(said: &str) -> (u64, u64) {
    let Some(line) = said
        .lines()
        .find(|l| l.contains(" blocks kept from earlier builds"))
    else {
        return (0, u64::MAX);
    };
    let words: Vec<&str> = line.split_whitespace().collect();
    let at = words.iter().position(|w| *w == "of").unwrap();
    (
        words[at - 1].parse().unwrap(),
        words[at + 1].parse().unwrap(),
    )
}

/// Two machines that build the same inputs at once both push every entry
/// to an empty cache, both succeed, and what the registry then holds is
/// whole: a third machine pulls all of it.
#[test]
fn two_builds_pushing_the_same_keys_at_once_both_succeed() {
    let registry = reg::Registry::start();
    let repo = format!("{}/imager/cache", registry.addr);
    let shared = ["--cache-registry", repo.as_str(), "--cache-plain-http"];
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| build("cache-at-once-a", None, &shared));
        let b = s.spawn(|| build("cache-at-once-b", None, &shared));
        (a.join().unwrap(), b.join().unwrap())
    });
    for (_, said) in [&a, &b] {
        assert!(!said.contains("warning:"), "{said}");
    }
    // Each kind was pushed by one of them at least (the other may have
    // found it there already).
    for kind in ["kernel", "grub", "rootfs-blocks"] {
        let pushed = format!("{kind}: pushed to the cache registry");
        assert!(
            a.1.contains(&pushed) || b.1.contains(&pushed),
            "{kind}:\n{}\n{}",
            a.1,
            b.1
        );
    }
    let empty = scratch().join("cache-at-once-third-dir");
    let _ = std::fs::remove_dir_all(&empty);
    let (third, said) = build("cache-at-once-third", Some(&empty), &shared);
    for kind in ["kernel", "grub", "rootfs-blocks"] {
        assert!(
            said.contains(&format!("{kind}: pulled from the cache registry")),
            "{kind}:\n{said}"
        );
    }
    assert_eq!(sha256(&a.0.artifact("raw")), sha256(&third.artifact("raw")));
}
