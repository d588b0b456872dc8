//! Helpers for tests that check our outputs with the reference tools.

use crate::io::Window;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

#[path = "../../../tests/common/tool.rs"]
#[allow(dead_code)]
mod shared;

/// The path of a reference tool, or a failed test saying to run
/// scripts/setup.sh (the one lookup: tests/common/tool.rs).
pub fn tool(name: &str) -> PathBuf {
    shared::tool_path(name)
}

/// Runs a command, failing the test with its output unless it succeeds.
pub fn run(cmd: &mut Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Copies `len` bytes at `offset` of `src` to a new sparse file `dest`.
pub fn extract(src: &Path, offset: u64, len: u64, dest: &Path) {
    let f = File::open(src).unwrap();
    let mut w = Window::new(f, offset, len).unwrap();
    let mut out = File::create(dest).unwrap();
    out.set_len(len).unwrap();
    let mut buf = vec![0u8; 1 << 20];
    let mut at = 0u64;
    loop {
        let n = w.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        if buf[..n].iter().any(|b| *b != 0) {
            out.seek(SeekFrom::Start(at)).unwrap();
            out.write_all(&buf[..n]).unwrap();
        }
        at += n as u64;
    }
    assert_eq!(at, len);
}

/// Changes the entry `index` of both copies of the GPT of the 512-byte-sector
/// disk image `disk` with `change` (on its 128 raw bytes), then makes both
/// copies' CRCs right again, as an attacker would.
pub fn patch_gpt_entry(disk: &Path, index: usize, change: impl Fn(&mut [u8])) {
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(disk)
        .unwrap();
    let size = bootstate::gpt::device_size(&mut f).unwrap();
    let h = bootstate::gpt::read_at(&mut f, size, 512).unwrap().header;
    let len = h.entry_count as usize * h.entry_size as usize;
    let backup_entries = h.alternate_lba - (len as u64).div_ceil(512);
    for (lba, entries_lba) in [(1, h.entries_lba), (h.alternate_lba, backup_entries)] {
        let mut entries = vec![0u8; len];
        f.seek(SeekFrom::Start(entries_lba * 512)).unwrap();
        f.read_exact(&mut entries).unwrap();
        let es = h.entry_size as usize;
        change(&mut entries[index * es..(index + 1) * es]);
        let mut header = vec![0u8; 92];
        f.seek(SeekFrom::Start(lba * 512)).unwrap();
        f.read_exact(&mut header).unwrap();
        header[88..92].copy_from_slice(&crc32fast::hash(&entries).to_le_bytes());
        header[16..20].fill(0);
        let crc = crc32fast::hash(&header);
        header[16..20].copy_from_slice(&crc.to_le_bytes());
        f.seek(SeekFrom::Start(entries_lba * 512)).unwrap();
        f.write_all(&entries).unwrap();
        f.seek(SeekFrom::Start(lba * 512)).unwrap();
        f.write_all(&header).unwrap();
    }
}

/// The names in the directory `dir`, sorted.
pub fn sorted_names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}
