//! End-to-end tests of STATE and EPHEMERAL: the default image booted under
//! OVMF with its writes kept (`imager boot --write`), twice, and on a disk
//! enlarged after the build; the results checked offline with sfdisk and
//! xfs_db.
//!
//! The kernel comes from the build cache (`scripts/test` builds it first).

// Test helpers panic on unexpected failures: that is how a test fails.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The default image, built once for all tests.
fn image() -> &'static Build {
    static B: Fixture<Build> = Fixture::new("storage");
    B.get(|| build_into("storage"))
}

/// A private, sparse copy of the built disk.
fn disk_copy(name: &str) -> PathBuf {
    let dest = scratch().join(format!("storage-{name}.raw"));
    let _ = std::fs::remove_file(&dest);
    ok(std::process::Command::new("cp")
        .arg("--sparse=always")
        .arg(image().artifact("raw"))
        .arg(&dest));
    dest
}

/// Boots `disk` keeping its writes, presses the power button after ready
/// and returns the `machined: storage …` line's fields and the console.
fn boot(disk: &Path, name: &str) -> (BTreeMap<String, String>, String) {
    let log = scratch().join(format!("storage-{name}.console"));
    ok(imager()
        .args([
            "boot",
            "--write",
            "--shutdown",
            "--quiet",
            "--timeout",
            "600",
            "--console-log",
        ])
        .arg(&log)
        .arg(disk));
    // Both GPT copies whole after the runtime's writes (a grow rewrites them).
    check_gpt(disk);
    let console = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = console
        .lines()
        .filter(|l| l.starts_with("machined: storage "))
        .collect();
    assert_eq!(lines.len(), 1, "one storage line expected:\n{console}");
    let fields = lines[0]
        .trim_start_matches("machined: storage ")
        .split_whitespace()
        .filter_map(|w| w.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    assert!(
        console.contains("machined: powering off"),
        "no clean power-off:\n{console}"
    );
    (fields, console)
}

fn partition(disk: &Path, label: &str) -> (Value, u64) {
    let json: Value = serde_json::from_str(&ok(tool("sfdisk").arg("--json").arg(disk))).unwrap();
    let pt = json["partitiontable"].clone();
    let p = pt["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == label)
        .unwrap_or_else(|| panic!("no {label} in {pt}"))
        .clone();
    (pt, p["size"].as_u64().unwrap() * 512)
}

/// `(dblocks, blocksize, label)` of the XFS filesystem on partition `label`,
/// read offline by xfs_db from a copy of the partition.
fn xfs_superblock(disk: &Path, label: &str) -> (u64, u64, String) {
    // Named after the disk: the tests may run in parallel (scripts/test).
    let stem = disk.file_stem().unwrap().to_string_lossy();
    let part = scratch().join(format!("{stem}-{label}.xfs"));
    extract_partition(disk, label, &part);
    let out = ok(tool("xfs_db")
        .args([
            "-r",
            "-c",
            "sb 0",
            "-c",
            "p dblocks",
            "-c",
            "p blocksize",
            "-c",
            "p fname",
        ])
        .arg(&part));
    let _ = std::fs::remove_file(&part);
    let get = |k: &str| {
        out.lines()
            .find_map(|l| l.strip_prefix(&format!("{k} = ")))
            .unwrap_or_else(|| panic!("no {k} in {out}"))
            .trim()
            .to_string()
    };
    (
        get("dblocks").parse().unwrap(),
        get("blocksize").parse().unwrap(),
        // xfs_db prints the 12-byte label with its NUL padding: "STATE\000…"
        get("fname")
            .trim_matches('"')
            .trim_end_matches("\\000")
            .to_string(),
    )
}

/// Runs xfs_db read-only on a copy of partition `label` with `commands`.
fn xfs_db(disk: &Path, label: &str, commands: &[&str]) -> String {
    let stem = disk.file_stem().unwrap().to_string_lossy();
    let part = scratch().join(format!("{stem}-{label}-db.xfs"));
    extract_partition(disk, label, &part);
    let mut cmd = tool("xfs_db");
    cmd.arg("-r");
    for c in commands {
        cmd.args(["-c", c]);
    }
    let out = ok(cmd.arg(&part));
    let _ = std::fs::remove_file(&part);
    out
}

/// The contents of a small file (one block) of the XFS filesystem on
/// partition `label`, read offline by xfs_db.
fn xfs_small_file(disk: &Path, label: &str, path: &str) -> String {
    let at = format!("path {path}");
    let out = xfs_db(
        disk,
        label,
        &[&at, "p core.size", "dblock 0", "type text", "p"],
    );
    let size: usize = out
        .lines()
        .find_map(|l| l.strip_prefix("core.size = "))
        .unwrap_or_else(|| panic!("no size for {path}: {out}"))
        .trim()
        .parse()
        .unwrap();
    // Hex dump lines: `000:  31 20 73 … <16 ASCII>`.
    let bytes: Vec<u8> = out
        .lines()
        .filter_map(|l| l.split_once(":  "))
        .flat_map(|(_, rest)| {
            rest.split_whitespace()
                .take(16)
                .map(|h| u8::from_str_radix(h, 16).unwrap())
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(bytes.len() >= size, "{out}");
    String::from_utf8(bytes[..size].to_vec()).unwrap()
}

#[test]
fn first_boot_formats_both_and_a_second_boot_keeps_them() {
    let disk = disk_copy("twice");
    let (first, console) = boot(&disk, "twice-1");
    assert_eq!(first["STATE"], "made", "{console}");
    assert_eq!(first["EPHEMERAL"], "made", "{console}");
    assert_eq!(first["boot"], "1", "{console}");
    let version = image().json["version"].as_str().unwrap().to_string();
    assert_eq!(first["first-version"], version);
    let (_, eph_bytes) = partition(&disk, "EPHEMERAL");
    assert_eq!(first["ephemeral-bytes"], eph_bytes.to_string());
    // The builder leaves no grown partition behind on a disk of its size.
    assert!(!console.contains("grew EPHEMERAL"), "{console}");

    let (second, console) = boot(&disk, "twice-2");
    assert_eq!(second["STATE"], "kept", "{console}");
    assert_eq!(second["EPHEMERAL"], "kept", "{console}");
    assert_eq!(second["boot"], "2", "{console}");
    assert_eq!(second["first-version"], first["first-version"]);
    assert_eq!(second["ephemeral-bytes"], first["ephemeral-bytes"]);

    // Offline, on EPHEMERAL: the boot log survived the power-offs, and the
    // /etc/kubernetes overlay has its upper and work directories.
    assert_eq!(
        xfs_small_file(&disk, "EPHEMERAL", "/log/machined/boots"),
        format!("1 slot=A version={version}\n2 slot=A version={version}\n")
    );
    let overlays = xfs_db(&disk, "EPHEMERAL", &["path /system/overlays", "ls"]);
    for d in ["etc-kubernetes-upper", "etc-kubernetes-work"] {
        assert!(overlays.contains(&format!(" {d} (good)")), "{overlays}");
    }

    for label in ["STATE", "EPHEMERAL"] {
        let (dblocks, bs, name) = xfs_superblock(&disk, label);
        assert_eq!(name, label);
        let (_, bytes) = partition(&disk, label);
        assert_eq!(dblocks * bs, bytes, "{label}");
    }
}

#[test]
fn an_enlarged_disk_grows_ephemeral_and_its_filesystem_to_the_end() {
    let disk = disk_copy("grow");
    let (first, console) = boot(&disk, "grow-1");
    assert_eq!(first["EPHEMERAL"], "made", "{console}");
    let small: u64 = first["ephemeral-bytes"].parse().unwrap();

    ok(tool("truncate").args(["-s", "3G"]).arg(&disk));
    let (second, console) = boot(&disk, "grow-2");
    assert_eq!(second["STATE"], "kept", "{console}");
    assert_eq!(second["EPHEMERAL"], "kept", "{console}");
    assert_eq!(second["boot"], "2", "{console}");
    assert_eq!(second["first-version"], first["first-version"]);
    assert!(console.contains("grew EPHEMERAL"), "{console}");
    assert!(
        console.contains("grew the XFS filesystem on /var"),
        "{console}"
    );

    // sfdisk: a valid table whose backup is at the end of the 3 GiB disk,
    // EPHEMERAL ending at the last MiB boundary before the backup GPT.
    let verify = run(tool("sfdisk").arg("--verify").arg(&disk));
    let text = String::from_utf8_lossy(&verify.stdout).to_string()
        + &String::from_utf8_lossy(&verify.stderr);
    assert!(verify.status.success(), "{text}");
    assert!(!text.contains("mismatch"), "{text}");
    let (pt, bytes) = partition(&disk, "EPHEMERAL");
    let sector = pt["sectorsize"].as_u64().unwrap_or(512);
    let last_lba = pt["lastlba"].as_u64().unwrap();
    let total = 3u64 << 30;
    // The backup GPT: 128 entries of 128 bytes, then the header.
    assert_eq!(last_lba, total / sector - 1 - (128 * 128) / sector - 1);
    let eph = pt["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "EPHEMERAL")
        .unwrap();
    let end = (eph["start"].as_u64().unwrap() + eph["size"].as_u64().unwrap()) * sector;
    let mib = 1u64 << 20;
    assert_eq!(end % mib, 0);
    assert_eq!(end, (last_lba + 1) * sector / mib * mib);
    assert!(bytes > small + (900 << 20), "{bytes} vs {small}");
    assert_eq!(second["ephemeral-bytes"], bytes.to_string());

    // xfs_db: the filesystem fills the grown partition.
    let (dblocks, bs, name) = xfs_superblock(&disk, "EPHEMERAL");
    assert_eq!(name, "EPHEMERAL");
    assert_eq!(dblocks * bs, bytes);

    // A third boot finds nothing to grow.
    let (third, console) = boot(&disk, "grow-3");
    assert_eq!(third["boot"], "3", "{console}");
    assert!(!console.contains("grew"), "{console}");
}

#[test]
fn the_root_filesystem_carries_mkfs_xfs_with_its_libraries_and_no_symlinks() {
    let sq = image().artifact("rootfs");
    let out = ok(tool("unsquashfs").args(["-lls", "-UTC"]).arg(&sq));
    let has = |p: &str| {
        out.lines()
            .find(|l| l.ends_with(&format!("squashfs-root/{p}")))
            .unwrap_or_else(|| panic!("{p} missing from:\n{out}"))
            .to_string()
    };
    assert!(has("usr/sbin/mkfs.xfs").starts_with("-rwxr-xr-x"));
    assert!(has("lib64/ld-linux-x86-64.so.2").starts_with("-rwxr-xr-x"));
    for lib in ["libc.so.6", "libuuid.so.1", "libblkid.so.1"] {
        assert!(has(&format!("usr/lib/x86_64-linux-gnu/{lib}")).starts_with('-'));
    }
    has("usr/lib/machined/host-closure.txt");
    has("etc/kubernetes");
    assert!(
        !out.lines().any(|l| l.starts_with('l')),
        "the root filesystem has a symbolic link:\n{out}"
    );
    assert!(!out.contains("/bin/sh"), "a shell:\n{out}");
    // The generated closure manifest lists exactly the libraries shipped.
    let x = scratch().join("storage-rootfs");
    let _ = std::fs::remove_dir_all(&x);
    ok(tool("unsquashfs")
        .args(["-no-xattrs", "-d"])
        .arg(&x)
        .arg(&sq)
        .arg("usr/lib/machined/host-closure.txt"));
    let manifest = std::fs::read_to_string(x.join("usr/lib/machined/host-closure.txt")).unwrap();
    let listed: Vec<&str> = manifest
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| l.split_whitespace().nth(2).unwrap())
        .collect();
    assert!(listed.contains(&"lib64/ld-linux-x86-64.so.2"), "{manifest}");
    assert!(
        listed.contains(&"usr/lib/x86_64-linux-gnu/libc.so.6"),
        "{manifest}"
    );
    let mut sorted = listed.clone();
    sorted.sort();
    assert_eq!(sorted, listed, "sorted");
    for p in &listed {
        has(p);
    }
}

/// The runtime's grow of the partition table, cut before each of its
/// writes (as a power cut during the first boot on a larger disk leaves
/// it), then booted: the kernel finds its partitions every time (from the
/// old table, or from the new backup when the primary was cut between its
/// entries and its header), and the runtime finishes the grow.
#[test]
fn a_grow_cut_at_each_write_boots_and_is_finished() {
    let base = disk_copy("grow-cut");
    let (first, console) = boot(&base, "grow-cut-0");
    assert_eq!(first["EPHEMERAL"], "made", "{console}");
    ok(tool("truncate").args(["-s", "3G"]).arg(&base));
    let open = |p: &Path| {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(p)
            .unwrap()
    };
    let size = 3u64 << 30;
    let writes = {
        let probe = scratch().join("storage-grow-cut-probe.raw");
        ok(std::process::Command::new("cp")
            .arg("--sparse=always")
            .arg(&base)
            .arg(&probe));
        let mut f = bootstate::Faulty::counting(open(&probe));
        bootstate::gpt::grow_last(&mut f, size, 512, "EPHEMERAL")
            .unwrap()
            .unwrap();
        f.writes()
    };
    assert_eq!(writes, 5);
    for n in 1..=writes {
        let disk = scratch().join(format!("storage-grow-cut-{n}.raw"));
        ok(std::process::Command::new("cp")
            .arg("--sparse=always")
            .arg(&base)
            .arg(&disk));
        let mut f = bootstate::Faulty::failing_at(open(&disk), n);
        assert!(bootstate::gpt::grow_last(&mut f, size, 512, "EPHEMERAL").is_err());
        drop(f);
        let (after, console) = boot(&disk, &format!("grow-cut-{n}"));
        assert_eq!(after["EPHEMERAL"], "kept", "cut {n}: {console}");
        assert_eq!(after["boot"], "2", "cut {n}: {console}");
        let verify = run(tool("sfdisk").arg("--verify").arg(&disk));
        let text = String::from_utf8_lossy(&verify.stdout).to_string()
            + &String::from_utf8_lossy(&verify.stderr);
        assert!(verify.status.success(), "cut {n}: {text}");
        let (_, bytes) = partition(&disk, "EPHEMERAL");
        assert_eq!(after["ephemeral-bytes"], bytes.to_string(), "cut {n}");
        assert!(bytes > (3u64 << 30) - (600 << 20), "cut {n}: {bytes}");
        let t = bootstate::gpt::read_at(&mut open(&disk), size, 512).unwrap();
        assert_eq!(t.source, bootstate::gpt::TableCopy::Primary, "cut {n}");
        let _ = std::fs::remove_file(&disk);
    }
}
