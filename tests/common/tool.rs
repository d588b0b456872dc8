//! The one lookup of an independent tool the tests run (sfdisk, xorriso,
//! qemu-img …): found on PATH (or in /usr/sbin, /sbin, where Debian puts
//! sfdisk and mkfs tools for root), else the test that needs it fails and
//! says to run `scripts/setup.sh`, which installs every one of them. No
//! test skips or passes for want of a tool.
//!
//! std only: the unit tests of `imager` include it with `#[path]`, and
//! `tests/harness.rs` compiles it into a throwaway crate to show a missing
//! tool failing its test.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Where `name` is, or a failed test that names it.
pub fn tool_path(name: &str) -> PathBuf {
    std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .filter(|d| !d.is_empty())
        .chain(["/usr/sbin", "/sbin"])
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!("{name} not found on PATH: run scripts/setup.sh, which installs it")
        })
}

/// A command running `name`, found by [`tool_path`].
pub fn tool(name: &str) -> Command {
    Command::new(tool_path(name))
}
