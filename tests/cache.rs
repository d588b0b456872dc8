//! The build cache shared through a registry (docs/build-cache.md): a
//! build with `--cache-registry` pushes the kernel it has; a second build
//! in an empty cache directory (a second CI machine) pulls it, compiles no
//! kernel, and makes the same bytes. (Refusals of foreign, tampered and
//! moved entries, and concurrent pushes of one key, are shown against the
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
    assert!(
        said.contains("kernel: pushed to the cache registry"),
        "{said}"
    );
    // Its entry, as an independent client reads it: signed statement,
    // signature, the kernel's files.
    let tags = run(std::process::Command::new(reg::tool("skopeo"))
        .args(["list-tags", "--tls-verify=false"])
        .arg(format!("docker://{repo}")));
    let tags = String::from_utf8_lossy(&tags.stdout);
    assert!(tags.contains("\"kernel-"), "{tags}");

    // The second machine: an empty cache directory.
    let empty = scratch().join("cache-second-dir");
    let _ = std::fs::remove_dir_all(&empty);
    let (second, said) = build("cache-second", Some(&empty), &shared);
    assert!(
        said.contains("kernel: pulled from the cache registry"),
        "{said}"
    );
    assert!(
        !said.contains("building bzImage"),
        "a kernel was compiled:\n{said}"
    );
    assert_eq!(second.json["kernel_cached"], true);
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
}
