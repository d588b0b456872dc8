//! Helpers for tests that check bootstate's output with the reference tools.

use std::path::PathBuf;
use std::process::Command;

#[path = "../../tests/common/tool.rs"]
#[allow(dead_code)]
mod shared;

/// The path of a reference tool, or a failed test saying to run
/// scripts/setup.sh (the one lookup: tests/common/tool.rs).
pub fn tool(name: &str) -> PathBuf {
    shared::tool_path(name)
}

/// Runs `cmd`; its standard output, or a failed test with everything it said.
pub fn output(cmd: &mut Command, what: &str) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{what}: {}{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// `fsck.fat -n` on a FAT volume: everything it says.
pub fn fsck(volume: &[u8]) -> String {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let p = dir.path().join("volume");
    std::fs::write(&p, volume).expect("writing the volume");
    let out = Command::new(tool("fsck.fat"))
        .arg("-n")
        .arg(&p)
        .output()
        .expect("running fsck.fat");
    String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr)
}

/// A FAT32 volume of 40 MiB with 512-byte clusters (FAT32's smallest size
/// at that cluster size), in memory.
pub fn fat32_volume() -> std::io::Cursor<Vec<u8>> {
    let mut dev = std::io::Cursor::new(vec![0u8; 40 << 20]);
    fatfs::format_volume(
        &mut dev,
        fatfs::FormatVolumeOptions::new()
            .fat_type(fatfs::FatType::Fat32)
            .bytes_per_cluster(512),
    )
    .expect("formatting a FAT32 volume in memory");
    dev
}
