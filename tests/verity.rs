//! The verified root end to end: the default image boots under OVMF and
//! SeaBIOS (GRUB)
//! with `root_verified: true`; its hash device equals `veritysetup
//! format`'s and `veritysetup verify` accepts it with the command line's
//! root hash; and one changed byte in the root filesystem, in its hash tree
//! or in the superblock's salt or size fails the boot in stage 1 with a
//! dm-verity message (QEMU boots the build's kernel directly, its initramfs
//! followed by a second archive that replaces `rootfs.sqsh` or
//! `rootfs.verity` with the changed copy: the kernel unpacks both, the
//! later file overwriting the earlier).

// Test helpers panic on unexpected failures: that is how a test fails.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use contract::paths::{INITRAMFS_ROOTFS, INITRAMFS_ROOTFS_VERITY};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(600);

/// Builds the metal profile at `version` into target/e2e/NAME.
fn build_verity(name: &str, version: &'static str) -> Build {
    let profile = write_profile(name, |t| {
        t.replace("version: 0.1.0", &format!("version: {version}"))
    });
    build_profile(name, &profile, &["--key", &dev_key().display().to_string()])
}

/// The default build.
fn image() -> &'static Build {
    static B: Fixture<Build> = Fixture::new("verity");
    B.get(|| build_verity("verity", "0.1.0"))
}

fn manifest_cmdline(b: &Build) -> String {
    let m: Value =
        serde_json::from_slice(&std::fs::read(b.dir.join("manifest.json")).unwrap()).unwrap();
    m["boot"]["cmdline"].as_str().unwrap().to_string()
}

fn root_hash(b: &Build) -> String {
    let c = manifest_cmdline(b);
    contract::cmdline::get(&c, contract::cmdline::VERITY).unwrap_or_else(|| {
        panic!(
            "no {} in the image's command line {c}",
            contract::cmdline::VERITY
        )
    })
}

#[test]
fn the_hash_device_is_veritysetups_and_verifies() {
    let b = image();
    let (data, hash) = (b.artifact("rootfs"), b.artifact("rootfs-verity"));
    let block0 = std::fs::read(&hash).unwrap();
    let sb = contract::verity::Superblock::parse(&block0[..4096]).unwrap();
    assert_eq!(
        std::fs::metadata(&data).unwrap().len(),
        sb.data_blocks * 4096
    );
    let theirs = scratch().join("verity-theirs");
    let _ = std::fs::remove_file(&theirs);
    let uuid = uuid::Uuid::from_bytes(sb.uuid).hyphenated().to_string();
    let out = ok(tool("veritysetup")
        .arg("format")
        .arg(format!("--salt={}", contract::verity::hex(&sb.salt)))
        .arg(format!("--uuid={uuid}"))
        .arg(&data)
        .arg(&theirs));
    let hash_hex = root_hash(b);
    assert!(
        out.lines()
            .any(|l| l.starts_with("Root hash:") && l.ends_with(&hash_hex)),
        "{out}"
    );
    assert!(
        std::fs::read(&theirs).unwrap() == block0,
        "hash devices differ"
    );
    ok(tool("veritysetup")
        .arg("verify")
        .arg(&data)
        .arg(&hash)
        .arg(&hash_hex));
}

#[test]
fn a_verified_root_boots_under_ovmf_and_seabios_and_is_reported() {
    let b = image();
    for firmware in ["uefi", "bios"] {
        let r = boot_report(&b.artifact("raw"), &["--shutdown", "--firmware", firmware]).unwrap();
        assert_eq!(r["ready"], true, "{r}");
        assert_eq!(r["firmware"], firmware, "{r}");
        assert_eq!(r["root_verified"], true, "{r}");
        assert_eq!(r["secure_boot"], "off", "{r}");
        let cmdline = r["cmdline"].as_str().unwrap();
        assert!(
            cmdline.contains(&contract::cmdline::verity_arg(&root_hash(b))),
            "{cmdline}"
        );
    }
}

/// One byte of `bytes` flipped at `at`.
fn flipped(mut bytes: Vec<u8>, at: usize) -> Vec<u8> {
    bytes[at] ^= 0x01;
    bytes
}

/// The build's initramfs followed by an archive holding `name` with
/// `contents`.
fn initramfs_with(b: &Build, tag: &str, name: &str, contents: &[u8]) -> PathBuf {
    let mut w = imager::initramfs::CpioWriter::new(Vec::new(), 1_700_000_000);
    w.file(name, 0o444, contents.len() as u64, &mut &contents[..])
        .unwrap();
    let cpio = w.finish().unwrap();
    let mut initramfs = std::fs::read(b.artifact("initramfs")).unwrap();
    initramfs.resize(initramfs.len().next_multiple_of(4), 0);
    initramfs.extend_from_slice(&zstd::encode_all(cpio.as_slice(), 3).unwrap());
    let p = scratch().join(format!("verity-initramfs-{tag}"));
    std::fs::write(&p, initramfs).unwrap();
    p
}

/// Boots the build's kernel directly with `initramfs` and the image's
/// command line (slot A, power off on failure) until QEMU exits; returns
/// the console.
fn boot_direct(b: &Build, initramfs: &Path) -> Vec<String> {
    let append = format!(
        "{} machined.slot=A machined.on_failure=poweroff",
        manifest_cmdline(b)
    );
    let child = direct_qemu(&b.artifact("kernel"), initramfs, &append)
        .spawn()
        .unwrap();
    follow_console(child, None, TIMEOUT).0
}

#[test]
fn a_changed_byte_in_the_root_or_its_tree_fails_the_boot_with_a_dm_verity_message() {
    let b = image();
    let data = std::fs::read(b.artifact("rootfs")).unwrap();
    let hash = std::fs::read(b.artifact("rootfs-verity")).unwrap();
    let n = data.len() / 4096;
    let levels = contract::verity::levels(n as u64);
    assert!(
        !levels.is_empty(),
        "a root of one block has no tree to change"
    );
    // Level 0 (the data blocks' hashes) is the last level on the device.
    let level0 = 4096 * (hash.len() / 4096 - levels[0] as usize);
    let mut other_size = hash.clone();
    other_size[72] ^= 0x01;
    let cases: [(&str, &str, Vec<u8>, &str); 4] = [
        (
            "data",
            INITRAMFS_ROOTFS,
            flipped(data.clone(), (n / 2) * 4096 + 1000),
            &format!("dm-verity: block {} of the root filesystem", n / 2),
        ),
        (
            "tree",
            INITRAMFS_ROOTFS_VERITY,
            flipped(hash.clone(), level0 + 32 * 3 + 7),
            "dm-verity: block 0 of the root filesystem",
        ),
        (
            "salt",
            INITRAMFS_ROOTFS_VERITY,
            flipped(hash.clone(), 88 + 5),
            "dm-verity: block 0 of the root filesystem",
        ),
        ("size", INITRAMFS_ROOTFS_VERITY, other_size, "data blocks"),
    ];
    for (tag, name, contents, want) in cases {
        let initramfs = initramfs_with(b, tag, name, &contents);
        let console = boot_direct(b, &initramfs);
        let all = console.join("\n");
        let fatal = console
            .iter()
            .find(|l| l.contains("machined: fatal:"))
            .unwrap_or_else(|| panic!("{tag}: no fatal line:\n{all}"));
        assert!(fatal.contains(want), "{tag}: want {want:?} in {fatal}");
        assert!(
            !console.iter().any(|l| l.contains("machined: ready")),
            "{tag}: reached ready"
        );
        assert!(
            !console.iter().any(|l| l.contains("stage1: mounted root")),
            "{tag}: mounted the root"
        );
        if tag != "size" {
            // The kernel's own word on it.
            assert!(
                console
                    .iter()
                    .any(|l| l.contains("device-mapper: verity") && l.contains("is corrupted")),
                "{tag}: no dm-verity kernel message:\n{all}"
            );
        }
    }
}

/// An upgrade to a payload whose root filesystem has one changed byte (its
/// initramfs carries the changed `rootfs.sqsh`, and the payload's manifest
/// is signed again over it, as a build of such a root would be): the new
/// slot fails in stage 1 with the dm-verity message on every try, and the
/// machine comes back on the old slot by itself.
#[test]
fn an_upgrade_to_a_corrupted_root_falls_back() {
    let v1 = image();
    let v2 = build_verity("verity-v2", "0.2.0");
    let data = std::fs::read(v2.artifact("rootfs")).unwrap();
    let n = data.len() / 4096;
    let bad = initramfs_with(
        &v2,
        "upgrade",
        INITRAMFS_ROOTFS,
        &flipped(data, (n / 3) * 4096 + 9),
    );
    std::fs::copy(&bad, v2.artifact("initramfs")).unwrap();
    let manifest = v2.dir.join("manifest.json");
    let mut m = imager::sign::Manifest::parse(&std::fs::read(&manifest).unwrap()).unwrap();
    for a in &mut m.artifacts {
        if a.kind == imager::artifact::Kind::Initramfs {
            *a = imager::sign::describe(&v2.dir, a.kind, &a.path).unwrap();
        }
    }
    let signer = imager::sign::FileSigner::load(&dev_key()).unwrap();
    imager::sign::write_signed_manifest(&v2.dir, &m, &signer).unwrap();

    let disk = scratch().join("verity-upgrade.raw");
    let _ = std::fs::remove_file(&disk);
    ok(Command::new("cp")
        .arg("--sparse=always")
        .arg(v1.artifact("raw"))
        .arg(&disk));
    ok(imager()
        .args(["upgrade", "--json", "--installer"])
        .arg(&v2.dir)
        .arg("--disk")
        .arg(&disk));
    let log = scratch().join("verity-upgrade.console.log");
    let r: Value = serde_json::from_str(&ok(imager()
        .args([
            "boot",
            "--write",
            "--quiet",
            "--json",
            "--timeout",
            "900",
            "--reboots",
        ])
        .arg("--console-log")
        .arg(&log)
        .arg(&disk)))
    .unwrap();
    let console = std::fs::read_to_string(&log).unwrap();
    assert_eq!(r["version"], "0.1.0", "{r}");
    assert_eq!(r["slot"], "A", "{r}");
    assert_eq!(r["root_verified"], true, "{r}");
    assert_eq!(r["failed_boots"], 3, "{console}");
    let want = format!("dm-verity: block {} of the root filesystem", n / 3);
    assert_eq!(
        console
            .lines()
            .filter(|l| l.contains("machined: fatal:") && l.contains(&want))
            .count(),
        3,
        "{console}"
    );
    assert!(
        console.contains("machined: rollback: the upgrade to slot B (0.2.0) failed"),
        "{console}"
    );
}
