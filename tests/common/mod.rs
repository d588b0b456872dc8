//! Helpers shared by the end-to-end test binaries (`tests/*.rs`): running
//! the `imager` binary, independent tools, builds into `target/e2e/`.

// Each test binary uses a different subset of these helpers.
#![allow(dead_code)]
// Test helpers panic on unexpected failures: that is how a test fails.
#![allow(clippy::unwrap_used)]

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub const EPOCH: &str = "1700000000";

pub fn repo() -> PathBuf {
    let r = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    r.canonicalize().unwrap_or(r)
}

pub fn imager() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_imager"));
    c.current_dir(repo()).env("SOURCE_DATE_EPOCH", EPOCH);
    c
}

pub fn run(cmd: &mut Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"))
}

pub fn ok(cmd: &mut Command) -> String {
    let out = run(cmd);
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn tool(name: &str) -> Command {
    let found = std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .chain(["/usr/sbin", "/sbin"])
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file());
    let path = found.unwrap_or_else(|| panic!("{name} not found: run scripts/setup.sh"));
    Command::new(path)
}

pub struct Build {
    pub dir: PathBuf,
    pub json: Value,
}

impl Build {
    pub fn artifact(&self, kind: &str) -> PathBuf {
        let a = self.json["artifacts"]
            .as_array()
            .expect("artifacts list")
            .iter()
            .find(|a| a["kind"] == kind)
            .unwrap_or_else(|| panic!("no {kind} artifact in {}", self.json));
        PathBuf::from(a["path"].as_str().expect("path"))
    }
}

pub fn scratch() -> PathBuf {
    let d = repo().join("target").join("e2e");
    std::fs::create_dir_all(&d).unwrap();
    d
}

pub fn build_into(name: &str) -> Build {
    build_with(name, None)
}

/// Builds the default image into target/e2e/NAME, optionally with the
/// runtime compiled into another cargo target directory.
pub fn build_with(name: &str, cargo_target: Option<&Path>) -> Build {
    let dir = scratch().join(name);
    let _ = std::fs::remove_dir_all(&dir);
    let mut cmd = imager();
    if let Some(t) = cargo_target {
        cmd.env("CARGO_TARGET_DIR", t);
    }
    let stdout = ok(cmd
        .args(["build", "--profile", "metal", "--json", "--out"])
        .arg(&dir));
    let json: Value = serde_json::from_str(&stdout).expect("build --json prints JSON");
    Build { dir, json }
}

/// Copies the byte range of partition `label` out of the image.
pub fn extract_partition(img: &Path, label: &str, dest: &Path) {
    let json: Value = serde_json::from_str(&ok(tool("sfdisk").arg("--json").arg(img))).unwrap();
    let pt = &json["partitiontable"];
    let sector = pt["sectorsize"].as_u64().unwrap_or(512);
    let p = pt["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == label)
        .unwrap_or_else(|| panic!("no {label} partition"));
    let (start, size) = (p["start"].as_u64().unwrap(), p["size"].as_u64().unwrap());
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(img).unwrap();
    f.seek(SeekFrom::Start(start * sector)).unwrap();
    let mut out = std::fs::File::create(dest).unwrap();
    std::io::copy(&mut f.take(size * sector), &mut out).unwrap();
}

/// A profile beside the real ones, so its relative paths resolve the same.
pub fn write_profile(name: &str, edit: impl Fn(String) -> String) -> PathBuf {
    write_profile_from("metal", name, edit)
}

/// A variant of `profiles/BASE.yaml` beside the real ones.
pub fn write_profile_from(base: &str, name: &str, edit: impl Fn(String) -> String) -> PathBuf {
    let text = std::fs::read_to_string(repo().join(format!("profiles/{base}.yaml"))).unwrap();
    let dir = scratch().join("profiles");
    std::fs::create_dir_all(&dir).unwrap();
    let text = edit(text).replace(
        "../",
        &format!("{}/", repo().canonicalize().unwrap().display()),
    );
    let path = dir.join(format!("{name}.yaml"));
    std::fs::write(&path, text).unwrap();
    path
}
