//! End-to-end tests: build the default image with the `imager` binary, check
//! every artifact with independent tools, boot it under OVMF and SeaBIOS,
//! tamper with it.
//!
//! The kernel comes from the build cache (`scripts/test` builds it first);
//! everything else is built here, twice, in two directories.

// Test helpers panic on unexpected failures: that is how a test fails.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The default image, built once for all tests.
fn image() -> &'static Build {
    static B: Fixture<Build> = Fixture::new("first");
    B.get(|| build_into("first"))
}

#[test]
fn partition_table_read_by_sfdisk() {
    let raw = image().artifact("raw");
    let json: Value = serde_json::from_str(&ok(tool("sfdisk").arg("--json").arg(&raw))).unwrap();
    let pt = &json["partitiontable"];
    assert_eq!(pt["label"], "gpt");
    let parts = pt["partitions"].as_array().unwrap();
    let got: Vec<(String, String)> = parts
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap().to_string(),
                p["type"].as_str().unwrap().to_uppercase(),
            )
        })
        .collect();
    // Labels from the Talos documents, type GUIDs from the UEFI, GRUB and
    // Boot Loader / Discoverable Partitions specifications.
    let want = [
        ("EFI", "C12A7328-F81F-11D2-BA4B-00A0C93EC93B"),
        ("BIOS", "21686148-6449-6E6F-744E-656564454649"),
        ("BOOT", "BC13C2FF-59E6-4262-A352-B275FD6F7172"),
        ("META", "0FC63DAF-8483-4772-8E79-3D69D8477DE4"),
        ("STATE", "0FC63DAF-8483-4772-8E79-3D69D8477DE4"),
        ("EPHEMERAL", "0FC63DAF-8483-4772-8E79-3D69D8477DE4"),
    ];
    let want: Vec<(String, String)> = want
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    assert_eq!(got, want);
    // Aligned to 1 MiB, in order, not overlapping.
    let mut prev_end = 0;
    for p in parts {
        let (start, size) = (p["start"].as_u64().unwrap(), p["size"].as_u64().unwrap());
        assert_eq!(start % 2048, 0, "{p}");
        assert!(start >= prev_end, "{p}");
        prev_end = start + size;
    }
    // Sparse: far fewer blocks allocated than the 2 GiB it spans.
    use std::os::unix::fs::MetadataExt;
    let md = std::fs::metadata(&raw).unwrap();
    assert_eq!(md.len(), 2 << 30);
    assert!(md.blocks() * 512 < md.len() / 4, "image is not sparse");
}

#[test]
fn fsck_fat_is_clean_on_efi_and_boot() {
    let raw = image().artifact("raw");
    for label in ["EFI", "BOOT"] {
        let part = scratch().join(format!("fsck-{label}.img"));
        extract_partition(&raw, label, &part);
        let out = ok(tool("fsck.fat").arg("-n").arg(&part));
        assert!(!out.contains("differ"), "{label}: {out}");
    }
}

#[test]
fn unsquashfs_lists_the_root() {
    let sq = image().artifact("rootfs");
    let out = ok(tool("unsquashfs").arg("-l").arg(&sq));
    for p in [
        "squashfs-root/usr/bin/machined",
        "squashfs-root/usr/lib/os-release",
        "squashfs-root/etc/hosts",
        "squashfs-root/etc/resolv.conf",
    ] {
        assert!(out.lines().any(|l| l == p), "{p} missing from:\n{out}");
    }
    assert!(
        !out.contains("/bin/sh"),
        "the root filesystem has a shell:\n{out}"
    );
}

/// A profile's firmware directory (`kernel.firmware`) is in the root
/// filesystem under /lib/firmware, byte for byte, as unsquashfs extracts
/// it, and the image still boots (its root is checked by dm-verity, which
/// covers those files as every other).
#[test]
fn a_profiles_firmware_files_are_under_lib_firmware_in_the_root() {
    let fw = scratch().join("firmware-files");
    let _ = std::fs::remove_dir_all(&fw);
    std::fs::create_dir_all(fw.join("rtl_nic")).unwrap();
    let blob: Vec<u8> = (0..70_000u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(fw.join("rtl_nic/rtl8168h-2.fw"), &blob).unwrap();
    let p = write_profile("firmware", |t| {
        t.replace(
            "  build_epoch: 0\n",
            &format!("  build_epoch: 0\n  firmware: {}\n", fw.display()),
        )
    });
    let dir = build_profile_into(&p, "firmware");
    let out = scratch().join("firmware-root");
    let _ = std::fs::remove_dir_all(&out);
    ok(tool("unsquashfs")
        .args(["-q", "-n", "-d"])
        .arg(&out)
        .arg(dir.join("rootfs.sqsh"))
        .arg("lib/firmware"));
    assert_eq!(
        std::fs::read(out.join("lib/firmware/rtl_nic/rtl8168h-2.fw")).unwrap(),
        blob
    );
    let r = boot_report(&dir.join("disk.raw"), &[]).unwrap();
    assert_eq!(r["root_verified"], true, "{r}");
}

#[test]
fn cpio_lists_the_initramfs() {
    let img = image().artifact("initramfs");
    let cpio = scratch().join("initramfs.cpio");
    ok(tool("zstd")
        .args(["-d", "-f", "-q", "-o"])
        .arg(&cpio)
        .arg(&img));
    let out = ok(tool("cpio").args(["-t", "--quiet", "-F"]).arg(&cpio));
    for p in ["init", "rootfs.sqsh", "rootfs.verity", "dev/console"] {
        assert!(out.lines().any(|l| l == p), "{p} missing from:\n{out}");
    }
}

#[test]
fn boots_under_ovmf_to_ready_on_slot_a_with_kspp_cmdline() {
    let raw = image().artifact("raw");
    let log = scratch().join("ovmf-boot.console");
    let out = ok(imager()
        .args(["boot", "--json", "--shutdown", "--timeout", "600"])
        .arg("--console-log")
        .arg(&log)
        .arg(&raw));
    let r: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(r["ready"], true);
    // The profile's network section: the NIC `imager boot` gives has the
    // address QEMU's DHCP server leases, after the hardening sysctls were
    // written and read back (the runtime fails the boot when one does not
    // hold: there is no shell in the image to read them from outside).
    let console = std::fs::read_to_string(&log).unwrap();
    let net: Vec<&str> = console
        .lines()
        .filter(|l| l.starts_with("machined: net: "))
        .collect();
    assert_eq!(net.last().copied(), Some(common::DHCP_UP), "{console}");
    let sysctls = net
        .iter()
        .find(|l| l.starts_with("machined: net: sysctls set and read back: "))
        .unwrap_or_else(|| panic!("no sysctl line:\n{console}"));
    let mut want: Vec<(String, String)> = contract::net::sysctls(Some("eth0"));
    // net.core.bpf_jit_harden exists only with the BPF JIT (off here).
    let jit = std::fs::read_to_string(image().artifact("kernel-config"))
        .unwrap()
        .lines()
        .any(|l| l == "CONFIG_BPF_JIT=y");
    want.extend(
        contract::net::SYSCTLS_IF_PRESENT
            .iter()
            .filter(|_| jit)
            .map(|(k, v)| (k.to_string(), v.to_string())),
    );
    assert_eq!(
        jit,
        sysctls.contains("net.core.bpf_jit_harden=2"),
        "{sysctls}"
    );
    for (k, v) in &want {
        let item = format!("{}={v}", contract::net::sysctl_name(k));
        assert!(
            sysctls.split(' ').any(|w| w == item),
            "{item} not in {sysctls}"
        );
    }
    assert!(sysctls.contains("net.ipv4.tcp_syncookies=1"), "{sysctls}");
    assert_eq!(r["firmware"], "uefi");
    assert_eq!(r["slot"], "A");
    assert_eq!(r["version"], "0.1.0");
    assert!(r["seconds"].as_f64().unwrap() > 0.0);
    assert_eq!(r["clean_poweroff"], true, "{r}");
    let cmdline = r["cmdline"]
        .as_str()
        .expect("the runtime prints /proc/cmdline");
    // KSPP's recommended boot parameters.
    for p in [
        "slab_nomerge",
        "init_on_alloc=1",
        "init_on_free=1",
        "page_alloc.shuffle=1",
        "pti=on",
        "randomize_kstack_offset=on",
        "vsyscall=none",
    ] {
        assert!(cmdline.split(' ').any(|w| w == p), "{p} not in {cmdline}");
    }
    assert!(cmdline.contains("machined.slot=A"), "{cmdline}");
    assert_chain(&r);
    // And every KSPP rule, boot parameters included, holds for the kernel
    // and the command line it really booted with.
    let file = scratch().join("booted.cmdline");
    std::fs::write(&file, cmdline).unwrap();
    ok(imager()
        .args(["kernel", "check", "--source", KERNEL_SOURCE, "--cmdline"])
        .arg(&file)
        .arg(image().artifact("kernel-config")));
}

/// The default kernel's source (profiles/metal.yaml).
const KERNEL_SOURCE: &str = "/usr/src/linux-source-6.12.tar.xz";

/// The rules the default kernel may fail, waived: only what GCC 12 cannot
/// build (kernel-config/kspp-waivers.yaml).
const CLANG_ONLY: [&str; 3] = ["CONFIG_CFI_CLANG", "CONFIG_UBSAN_LOCAL_BOUNDS", "cfi"];

/// Every `config NAME`/`menuconfig NAME` of the source's Kconfig files, read
/// here with tar and grep (not with imager's scanner): the arch/ trees of
/// other architectures left out.
fn kconfig_names_by_grep(tarball: &str) -> std::collections::BTreeSet<String> {
    let dir = scratch().join("kconfig-grep");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // -C first: GNU tar applies it only to the members named after it.
    ok(Command::new("tar").arg("-C").arg(&dir).args([
        "-xf",
        tarball,
        "--strip-components=1",
        "--wildcards",
        "*Kconfig*",
    ]));
    // Every top-level entry but arch/, then arch/Kconfig and arch/x86: the
    // other architectures' trees are left out, nothing else.
    let mut paths: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n != "arch")
        .collect();
    paths.sort();
    paths.extend(["arch/Kconfig".to_string(), "arch/x86".to_string()]);
    let out = ok(Command::new("grep")
        .args([
            "-rhoE",
            "--include=Kconfig*",
            r"^[[:space:]]*(menu)?config[[:space:]]+[A-Za-z0-9_]+[[:space:]]*$",
        ])
        .args(&paths)
        .current_dir(&dir));
    out.lines()
        .filter_map(|l| l.split_whitespace().nth(1).map(str::to_string))
        .collect()
}

/// The independent audit of the default 6.12 kernel, as the cache built it:
/// every rule OK except the waived Clang-only ones, and every N/A justified
/// from the outside: an option the source's Kconfig files do not define (by
/// grep), a rule for another architecture, or a `when` precondition the
/// .config (read here) does not meet.
#[test]
fn default_kernel_meets_every_kspp_rule_and_na_means_absent_from_its_kconfig() {
    let built = ok(imager().args(["kernel", "build", "--profile", "metal"]));
    let config = PathBuf::from(built.trim()).with_file_name("config");
    let config_text = std::fs::read_to_string(&config).unwrap();
    assert!(
        config_text.contains("# Linux/x86 6.12."),
        "the default kernel is not 6.12"
    );
    // The profile's command line, as the image boots it.
    let profile = std::fs::read_to_string(repo().join("profiles/metal.yaml")).unwrap();
    let cmdline: Vec<&str> = profile
        .split("  cmdline:\n")
        .nth(1)
        .unwrap()
        .lines()
        .map(str::trim)
        .take_while(|l| l.starts_with('-') || l.starts_with('#'))
        .filter_map(|l| l.strip_prefix("- "))
        .collect();
    assert!(cmdline.contains(&"init_on_free=1"), "{cmdline:?}");
    let file = scratch().join("metal.cmdline");
    std::fs::write(&file, cmdline.join(" ")).unwrap();
    let out = run(imager()
        .args([
            "kernel",
            "check",
            "--json",
            "--source",
            KERNEL_SOURCE,
            "--cmdline",
        ])
        .arg(&file)
        .arg(&config));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let findings = v.as_array().unwrap();
    assert!(findings.len() > 150, "{} rules", findings.len());
    let names = kconfig_names_by_grep(KERNEL_SOURCE);
    assert!(names.contains("PROC_MEM_NO_FORCE") && !names.contains("ARM64_SW_TTBR0_PAN"));
    let mut waived = Vec::new();
    for f in findings {
        let option = f["option"].as_str().unwrap();
        let note = f["note"].as_str().unwrap_or("");
        match f["verdict"].as_str().unwrap() {
            "OK" => {}
            "WAIVED" => waived.push(option),
            "N/A" => {
                let name = option.strip_prefix("CONFIG_").unwrap_or(option);
                if let Some(arch) = note.strip_suffix(" only; this kernel is x86_64") {
                    assert_ne!(arch, "x86_64", "{option}");
                } else if let Some(when) = note
                    .strip_prefix("only when ")
                    .and_then(|w| w.strip_suffix(')').or(Some(w)))
                {
                    // The precondition really fails in the .config.
                    let (opt, want) = when.split_once('=').unwrap();
                    let set = config_text
                        .lines()
                        .find_map(|l| l.strip_prefix(&format!("{opt}=")))
                        .unwrap_or("n");
                    assert_ne!(
                        set, want,
                        "{option}: N/A by `{when}`, but the config has {opt}={set}"
                    );
                } else {
                    assert_eq!(
                        f["kind"], "config",
                        "{option}: a boot parameter is N/A: {note}"
                    );
                    assert!(
                        !names.contains(name),
                        "{option} is N/A ({note}) but the 6.12 source defines it"
                    );
                }
            }
            other => panic!("{option}: {other}: {note}"),
        }
    }
    waived.sort();
    let mut want = CLANG_ONLY.to_vec();
    want.sort();
    assert_eq!(waived, want);
}

/// Linux 6.1 stays buildable: its profile configures and passes the audit
/// (against 6.1's own Kconfig, which has 6.12's PROC_MEM_NO_FORCE
/// backported) without compiling it.
#[test]
fn linux_6_1_profile_configures_and_passes_the_audit() {
    let config = ok(imager().args([
        "kernel",
        "build",
        "--profile",
        "metal-6_1",
        "--configure-only",
    ]));
    assert!(config.contains("# Linux/x86 6.1."), "not a 6.1 config");
    assert!(config.lines().any(|l| l == "CONFIG_PROC_MEM_NO_FORCE=y"));
    let file = scratch().join("metal-6_1.config");
    std::fs::write(&file, &config).unwrap();
    let out = ok(imager()
        .args([
            "kernel",
            "check",
            "--source",
            "/usr/src/linux-source-6.1.tar.xz",
            "--waivers",
        ])
        .arg(repo().join("kernel-config/kspp-waivers-6.1.yaml"))
        .arg(&file));
    assert!(out.contains("OK   CONFIG_PROC_MEM_NO_FORCE=y"), "{out}");
    assert!(out.contains("kspp: ") && out.contains(" 0 failed"), "{out}");
}

fn flip_byte(path: &Path, at: u64) {
    use std::io::{Read, Seek, SeekFrom, Write};
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut b = [0u8];
    f.seek(SeekFrom::Start(at)).unwrap();
    f.read_exact(&mut b).unwrap();
    f.seek(SeekFrom::Start(at)).unwrap();
    f.write_all(&[b[0] ^ 0x01]).unwrap();
}

fn dev_pub() -> PathBuf {
    repo().join("out/keys/dev.pub")
}

#[test]
fn verify_fails_on_one_flipped_byte_in_any_artifact() {
    let b = image();
    let copy = scratch().join("tamper");
    let _ = std::fs::remove_dir_all(&copy);
    ok(Command::new("cp")
        .args(["-r", "--sparse=always"])
        .arg(&b.dir)
        .arg(&copy));
    // The untouched copy verifies.
    ok(imager()
        .arg("verify")
        .arg(&copy)
        .arg("--key")
        .arg(dev_pub()));
    let names = [
        "vmlinuz",
        "kernel.config",
        "initramfs.zst",
        "rootfs.sqsh",
        "rootfs.verity",
        "disk.raw",
        "manifest.json",
        "manifest.json.sig",
    ];
    for name in names {
        let f = copy.join(name);
        let len = std::fs::metadata(&f).unwrap().len();
        // A byte in the middle (for the disk: inside the ESP, which is written).
        let at = if name == "disk.raw" {
            2 * 1024 * 1024 + 3
        } else {
            len / 2
        };
        flip_byte(&f, at);
        let out = run(imager()
            .arg("verify")
            .arg(&copy)
            .arg("--key")
            .arg(dev_pub()));
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            !out.status.success(),
            "verify passed with {name} tampered:\n{text}"
        );
        let named = if name.starts_with("manifest.json") {
            "manifest"
        } else {
            name
        };
        assert!(text.contains(named), "verify did not name {name}:\n{text}");
        flip_byte(&f, at);
    }
    ok(imager()
        .arg("verify")
        .arg(&copy)
        .arg("--key")
        .arg(dev_pub()));
}

#[test]
fn verify_refuses_a_wrong_public_key() {
    let b = image();
    let keys = scratch().join("other-key");
    let _ = std::fs::remove_dir_all(&keys);
    ok(imager()
        .args(["keygen", "--private"])
        .arg(keys.join("k.pem"))
        .arg("--public")
        .arg(keys.join("k.pub")));
    let out = run(imager()
        .arg("verify")
        .arg(&b.dir)
        .arg("--key")
        .arg(keys.join("k.pub")));
    let err =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    assert!(
        !out.status.success(),
        "verify passed with another key:\n{err}"
    );
    assert!(
        err.contains("--key"),
        "the error does not say what to do:\n{err}"
    );
}

#[test]
fn the_signature_verifies_with_openssl() {
    let b = image();
    ok(tool("openssl")
        .args(["pkeyutl", "-verify", "-pubin", "-rawin", "-inkey"])
        .arg(dev_pub())
        .arg("-in")
        .arg(b.dir.join("manifest.json"))
        .arg("-sigfile")
        .arg(b.dir.join("manifest.json.sig")));
}

#[test]
fn inspect_shows_partitions_entries_meta_and_manifest() {
    let b = image();
    let raw = b.artifact("raw");
    let out = ok(imager()
        .args(["inspect", "--json"])
        .arg(&raw)
        .arg("--key")
        .arg(dev_pub()));
    let r: Value = serde_json::from_str(&out).unwrap();
    let names: Vec<_> = r["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, ["EFI", "BIOS", "BOOT", "META", "STATE", "EPHEMERAL"]);
    assert_eq!(r["bios"]["boot_code"], "grub", "{}", r["bios"]);
    assert_eq!(r["bios"]["boot_flag"], false, "{}", r["bios"]);
    assert!(
        r["bios"]["core_sectors"].as_u64().unwrap() > 1,
        "{}",
        r["bios"]
    );
    // LBAs as sfdisk reads them.
    let sf: Value = serde_json::from_str(&ok(tool("sfdisk").arg("--json").arg(&raw))).unwrap();
    for (mine, theirs) in r["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .zip(sf["partitiontable"]["partitions"].as_array().unwrap())
    {
        assert_eq!(mine["first_lba"], theirs["start"]);
        assert_eq!(
            mine["last_lba"].as_u64().unwrap() + 1 - mine["first_lba"].as_u64().unwrap(),
            theirs["size"].as_u64().unwrap()
        );
    }
    let entries = r["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 1, "{r}");
    assert_eq!(entries[0]["slot"], "A");
    assert_eq!(entries[0]["title"], "Imager 0.1.0 (slot A)");
    assert_eq!(entries[0]["files_present"], true);
    assert_eq!(entries[0]["file"], "g00000001-slot-a.conf");
    // No default in loader.conf: the entries' order decides.
    assert_eq!(r["loader_default"], Value::Null);
    assert_eq!(r["slots"]["boots_next"], "A");
    assert_eq!(r["slots"]["slots"][0]["status"], "good");
    assert_eq!(r["slots"]["slots"][1]["status"], "empty");
    assert_eq!(
        r["slots"]["history"][0], "1 build slot=A version=0.1.0",
        "{r}"
    );
    assert_eq!(r["slots"]["trusted_keys"].as_array().unwrap().len(), 1);
    let keys = r["meta"]["keys"].as_array().unwrap();
    assert!(
        keys.iter().any(|k| k[0] == "default-slot" && k[1] == "A"),
        "{r}"
    );
    assert_eq!(r["manifest"]["verified"], true, "{r}");
    assert_eq!(r["manifest"]["lists_image"], true, "{r}");
}

/// Run from another directory, inspect and verify find the development key
/// beside the image's own build; where no key is known, inspect says the
/// manifest was not checked (and does not fail for it).
#[test]
fn inspect_and_verify_from_another_directory_use_the_build_key() {
    let b = image();
    let raw = std::path::absolute(b.artifact("raw")).unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let out = ok(imager()
        .current_dir(elsewhere.path())
        .args(["inspect", "--json"])
        .arg(&raw));
    let r: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(r["manifest"]["checked"], true, "{r}");
    assert_eq!(r["manifest"]["verified"], true, "{r}");
    assert_eq!(r["manifest"]["lists_image"], true, "{r}");
    let out = ok(imager()
        .current_dir(elsewhere.path())
        .arg("verify")
        .arg(std::path::absolute(&b.dir).unwrap()));
    assert!(out.contains("verify: OK"), "{out}");
    // A copy of the build outside the project: no key is known.
    let copy = elsewhere.path().join("build");
    ok(Command::new("cp")
        .args(["-r", "--sparse=always"])
        .arg(&b.dir)
        .arg(&copy));
    let out = ok(imager()
        .current_dir(elsewhere.path())
        .arg("inspect")
        .arg(copy.join("disk.raw")));
    assert!(out.contains("NOT CHECKED"), "{out}");
    assert!(!out.contains("DOES NOT VERIFY"), "{out}");
}

/// Builds `profile` into a fresh `target/e2e/NAME`; returns the directory.
fn build_profile_into(profile: &Path, name: &str) -> PathBuf {
    let dir = scratch().join(name);
    let _ = std::fs::remove_dir_all(&dir);
    ok(imager()
        .args(["build", "--profile"])
        .arg(profile)
        .arg("--out")
        .arg(&dir));
    dir
}

/// Runs a build expected to fail; returns its stderr and checks that the
/// output directory holds no file under a final name.
fn failing_build(profile: &Path) -> String {
    let out_dir = scratch().join(format!(
        "fail-{}",
        profile.file_stem().unwrap().to_string_lossy()
    ));
    let _ = std::fs::remove_dir_all(&out_dir);
    let out = run(imager()
        .args(["build", "--profile"])
        .arg(profile)
        .arg("--out")
        .arg(&out_dir));
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "build succeeded:\n{err}");
    if out_dir.exists() {
        let left: Vec<_> = std::fs::read_dir(&out_dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert!(
            left.is_empty(),
            "files left in {}: {left:?}",
            out_dir.display()
        );
    }
    err
}

#[test]
fn bad_profile_key_names_file_line_and_key() {
    let p = write_profile("badkey", |t| {
        t.replace("version: 0.1.0", "version: 0.1.0\nverison: 2")
    });
    let err = failing_build(&p);
    assert!(
        err.contains("badkey.yaml") && err.contains("verison") && err.contains("line 8"),
        "{err}"
    );
    let p = write_profile("badtype", |t| t.replace("size: 2GiB", "size: lots"));
    let err = failing_build(&p);
    assert!(
        err.contains("badtype.yaml") && err.contains("disk.size") && err.contains("line"),
        "{err}"
    );
}

#[test]
fn an_unwaived_kspp_failure_fails_the_build() {
    let p = write_profile("noslab", |t| t.replace("    - slab_nomerge\n", ""));
    let err = failing_build(&p);
    assert!(
        err.contains("KSPP") && err.contains("slab_nomerge"),
        "{err}"
    );
}

#[test]
fn missing_kernel_source_is_a_clear_error() {
    let p = write_profile("nosource", |t| {
        t.replace(
            "/usr/src/linux-source-6.12.tar.xz",
            "/nonexistent/linux.tar.xz",
        )
    });
    let err = failing_build(&p);
    assert!(
        err.contains("/nonexistent/linux.tar.xz") && err.contains("not found"),
        "{err}"
    );
}

#[test]
fn disk_too_small_is_refused_before_anything_is_written() {
    let p = write_profile("small", |t| t.replace("size: 2GiB", "size: 200MiB"));
    let err = failing_build(&p);
    assert!(
        err.contains("too small") && err.contains("disk.size"),
        "{err}"
    );
}

#[test]
fn missing_boot_loader_is_a_clear_error() {
    let p = write_profile("noboot", |t| {
        t + "boot:\n  systemd_boot: /nonexistent/systemd-bootx64.efi\n"
    });
    let err = failing_build(&p);
    assert!(err.contains("/nonexistent/systemd-bootx64.efi"), "{err}");
}

#[test]
fn kernel_options_dropped_by_kconfig_are_listed() {
    // Packet-socket diagnostics need packet sockets, which network.config
    // leaves out: Kconfig drops it.
    let frag = scratch().join("needs-packet.config");
    std::fs::write(&frag, "CONFIG_PACKET_DIAG=y\nCONFIG_XFS_FS=y\n").unwrap();
    let p = write_profile("dropped", |t| {
        t.replace(
            "    - ../kernel-config/kspp.config\n",
            &format!(
                "    - ../kernel-config/kspp.config\n    - {}\n",
                frag.display()
            ),
        )
    });
    let err = failing_build(&p);
    assert!(err.contains("CONFIG_PACKET_DIAG"), "{err}");
    assert!(
        !err.contains("CONFIG_XFS_FS="),
        "an option Kconfig kept was listed:\n{err}"
    );
}

#[test]
fn kspp_audit_cli_gives_verdicts_on_a_small_config() {
    let cfg = scratch().join("small.config");
    std::fs::write(
        &cfg,
        "#\n# Linux/x86 6.1.192 Kernel Configuration\n#\nCONFIG_X86_64=y\nCONFIG_SLAB_FREELIST_HARDENED=y\n# CONFIG_STACKPROTECTOR_STRONG is not set\n",
    )
    .unwrap();
    let out = run(imager().args(["kernel", "check", "--json"]).arg(&cfg));
    assert!(
        !out.status.success(),
        "a config failing KSPP rules passed the audit"
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let verdict = |opt: &str| {
        v.as_array()
            .unwrap()
            .iter()
            .find(|r| r["option"] == opt)
            .map(|r| r["verdict"].as_str().unwrap().to_string())
            .unwrap_or_else(|| panic!("no rule for {opt}"))
    };
    assert_eq!(verdict("CONFIG_SLAB_FREELIST_HARDENED"), "OK");
    assert_eq!(verdict("CONFIG_STACKPROTECTOR_STRONG"), "FAIL");
    // No source given: the version ranges decide. Upstream 6.12 options are
    // N/A for 6.1 (the report says how it decided).
    assert_eq!(verdict("CONFIG_RANDOM_KMALLOC_CACHES"), "N/A");
    assert_eq!(verdict("CONFIG_PROC_MEM_NO_FORCE"), "N/A");
    let text = ok_or_fail(imager().args(["kernel", "check"]).arg(&cfg));
    assert!(
        text.contains("N/A decided by the rules' since/until"),
        "{text}"
    );

    // With Debian's 6.1 source, its Kconfig decides: PROC_MEM_NO_FORCE is
    // backported there, so it is audited (and fails here); RANDOM_KMALLOC_CACHES
    // is not, so it stays N/A.
    let out = run(imager()
        .args([
            "kernel",
            "check",
            "--json",
            "--source",
            "/usr/src/linux-source-6.1.tar.xz",
        ])
        .arg(&cfg));
    assert!(!out.status.success());
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let verdict = |opt: &str| {
        v.as_array()
            .unwrap()
            .iter()
            .find(|r| r["option"] == opt)
            .map(|r| r["verdict"].as_str().unwrap().to_string())
            .unwrap()
    };
    assert_eq!(verdict("CONFIG_PROC_MEM_NO_FORCE"), "FAIL");
    assert_eq!(verdict("CONFIG_RANDOM_KMALLOC_CACHES"), "N/A");
}

/// stdout of a command that may exit 1 (a failing audit).
fn ok_or_fail(cmd: &mut Command) -> String {
    let out = run(cmd);
    assert!(out.status.code().is_some_and(|c| c <= 1), "{out:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// The same image boots under SeaBIOS: GRUB's boot.img in the MBR loads its
/// core.img from the BIOS partition, which reads grub.cfg on BOOT and boots
/// slot A's kernel with the entry's command line.
#[test]
fn boots_under_seabios_through_grub_to_ready_on_slot_a() {
    let raw = image().artifact("raw");
    let out = ok(imager()
        .args([
            "boot",
            "--firmware",
            "bios",
            "--json",
            "--shutdown",
            "--timeout",
            "600",
        ])
        .arg(&raw));
    let r: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(r["ready"], true, "{r}");
    assert_eq!(r["firmware"], "bios", "{r}");
    assert_eq!(r["slot"], "A", "{r}");
    assert_eq!(r["version"], "0.1.0", "{r}");
    assert_eq!(r["clean_poweroff"], true, "{r}");
    let cmdline = r["cmdline"].as_str().unwrap();
    assert!(cmdline.starts_with("BOOT_IMAGE=/A/vmlinuz-"), "{cmdline}");
    for p in ["slab_nomerge", "console=ttyS0,115200", "machined.slot=A"] {
        assert!(cmdline.split(' ').any(|w| w == p), "{p} not in {cmdline}");
    }
    assert_chain(&r);
}

/// What the ready line says of the boot chain: no Secure Boot (plain OVMF,
/// SeaBIOS), and the root verified exactly when the kernel builds in what
/// dm-verity needs (the build leaves the root hash off otherwise and says
/// so); then the booted command line carries the manifest's root hash.
fn assert_chain(r: &Value) {
    assert_eq!(r["secure_boot"], "off", "{r}");
    let config = std::fs::read_to_string(image().artifact("kernel-config")).unwrap();
    let can = imager::verity::KERNEL_OPTIONS
        .iter()
        .all(|o| config.lines().any(|l| l == format!("{o}=y")));
    assert_eq!(r["root_verified"], can, "{r}");
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(image().dir.join("manifest.json")).unwrap()).unwrap();
    let image_cmdline = manifest["boot"]["cmdline"].as_str().unwrap();
    let hash = contract::cmdline::get(image_cmdline, contract::cmdline::VERITY);
    assert_eq!(hash.is_some(), can, "{image_cmdline}");
    let booted = r["cmdline"].as_str().unwrap();
    assert_eq!(
        contract::cmdline::get(booted, contract::cmdline::VERITY),
        hash,
        "{booted}"
    );
}

fn read_at(path: &Path, at: u64, len: usize) -> Vec<u8> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(path).unwrap();
    f.seek(SeekFrom::Start(at)).unwrap();
    let mut b = vec![0u8; len];
    f.read_exact(&mut b).unwrap();
    b
}

/// The MBR holds GRUB's boot.img, patched only where grub-bios-setup
/// patches it, and keeps the protective MBR's entry and disk signature;
/// core.img's blocklist in the BIOS partition loads the sectors after it.
#[test]
fn the_mbr_holds_grub_and_keeps_the_protective_entry() {
    let raw = image().artifact("raw");
    let grub = Path::new("/usr/lib/grub/i386-pc");
    let boot_img = std::fs::read(grub.join("boot.img")).unwrap();
    let mbr = read_at(&raw, 0, 512);
    let patched = |i: usize| (0x5C..0x64).contains(&i) || i == 0x64 || (0x66..0x68).contains(&i);
    for i in (0..0x1B8).filter(|&i| !patched(i)) {
        assert_eq!(mbr[i], boot_img[i], "MBR byte {i:#x} differs from boot.img");
    }
    assert_eq!(mbr[0x64], 0xFF, "boot drive: the one the BIOS booted");
    assert_eq!(&mbr[0x66..0x68], &[0x90, 0x90], "drive check: NOPs");
    // The protective MBR, as sfdisk reads it: its signature (0) and its one
    // entry of type 0xEE over the whole disk, no boot flag by default.
    let dump = ok(tool("sfdisk")
        .args(["--json", "--label-nested", "dos"])
        .arg(&raw));
    let v: Value = serde_json::from_str(&dump).unwrap();
    let pt = &v["partitiontable"];
    assert_eq!(pt["label"], "dos", "{v}");
    assert_eq!(pt["id"], "0x00000000", "{v}");
    let parts = pt["partitions"].as_array().unwrap();
    assert_eq!(parts.len(), 1, "{v}");
    assert_eq!(parts[0]["type"], "ee", "{v}");
    assert_eq!(parts[0]["start"], 1, "{v}");
    assert_eq!(parts[0]["size"], (2u64 << 30) / 512 - 1, "{v}");
    assert!(parts[0].get("bootable").is_none(), "{v}");
    assert_eq!(&mbr[0x1B8..0x1BE], &[0u8; 6]);
    assert_eq!(&mbr[0x1FE..], &[0x55, 0xAA]);
    // core.img in the BIOS partition, where the MBR points.
    let json: Value = serde_json::from_str(&ok(tool("sfdisk").arg("--json").arg(&raw))).unwrap();
    let bios = json["partitiontable"]["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "BIOS")
        .unwrap()
        .clone();
    let first = bios["start"].as_u64().unwrap();
    assert_eq!(
        u64::from_le_bytes(mbr[0x5C..0x64].try_into().unwrap()),
        first
    );
    let core0 = read_at(&raw, first * 512, 512);
    let diskboot = std::fs::read(grub.join("diskboot.img")).unwrap();
    assert_eq!(
        &core0[..0x1E8],
        &diskboot[..0x1E8],
        "core.img starts with diskboot.img"
    );
    assert_eq!(&core0[0x1E8..0x1F4], &[0u8; 12], "blocklist terminator");
    let start = u64::from_le_bytes(core0[0x1F4..0x1FC].try_into().unwrap());
    let len = u64::from(u16::from_le_bytes([core0[0x1FC], core0[0x1FD]]));
    let segment = u16::from_le_bytes([core0[0x1FE], core0[0x1FF]]);
    assert_eq!((start, segment), (first + 1, 0x820));
    assert!(len >= 1 && len < bios["size"].as_u64().unwrap(), "{len}");
    // The sector after core.img is still zeros: nothing past it was written.
    assert!(
        read_at(&raw, (first + 1 + len) * 512, 512)
            .iter()
            .all(|&b| b == 0)
    );
}

/// `disk.bios_boot_flag` marks the protective MBR's entry active; OVMF and
/// SeaBIOS both boot such a disk.
#[test]
fn the_bios_boot_flag_is_set_and_both_firmwares_boot() {
    let p = write_profile("bootflag", |t| {
        t.replace(
            "sector_size: 512",
            "sector_size: 512\n  bios_boot_flag: true",
        )
    });
    let dir = build_profile_into(&p, "bootflag");
    let raw = dir.join("disk.raw");
    let v: Value = serde_json::from_str(&ok(tool("sfdisk")
        .args(["--json", "--label-nested", "dos"])
        .arg(&raw)))
    .unwrap();
    let entry = &v["partitiontable"]["partitions"][0];
    assert_eq!(entry["bootable"], true, "{v}");
    assert_eq!(entry["type"], "ee", "{v}");
    for fw in ["bios", "uefi"] {
        let r = boot_report(&raw, &["--firmware", fw]).unwrap();
        assert_eq!(
            (&r["ready"], &r["firmware"]),
            (&Value::Bool(true), &Value::from(fw))
        );
    }
}

#[test]
fn missing_grub_directory_or_module_is_refused_before_anything_is_written() {
    let p = write_profile("nogrub", |t| {
        t + "boot:\n  grub_dir: /nonexistent/grub/i386-pc\n"
    });
    let err = failing_build(&p);
    assert!(
        err.contains("/nonexistent/grub/i386-pc")
            && err.contains("install grub-pc-bin (scripts/setup.sh)")
            && err.contains("boot.grub_dir"),
        "{err}"
    );
    // GRUB's directory without the Linux loader.
    let copy = scratch().join("grub-without-linux");
    let _ = std::fs::remove_dir_all(&copy);
    std::fs::create_dir_all(&copy).unwrap();
    for f in std::fs::read_dir("/usr/lib/grub/i386-pc").unwrap() {
        let f = f.unwrap();
        if f.file_name() != "linux.mod" {
            std::fs::copy(f.path(), copy.join(f.file_name())).unwrap();
        }
    }
    let p = write_profile("nolinuxmod", |t| {
        t + &format!("boot:\n  grub_dir: {}\n", copy.display())
    });
    let err = failing_build(&p);
    assert!(
        err.contains("GRUB module linux.mod") && err.contains("install grub-pc-bin"),
        "{err}"
    );
}

/// A 4096-byte-sector image (`disk.sector_size: 4096`) is laid out right
/// (checked by fdisk: BOOT is the ESP and EFI is reserved, as
/// `contract::partition::esp_role` decides, since systemd-boot reads no
/// XBOOTLDR on such disks) and boots to ready from a 4Kn NVMe disk under
/// OVMF, the runtime naming BOOT as the partition the loader was read from.
#[test]
fn a_4096_byte_sector_image_boots_from_a_4kn_nvme_disk() {
    let p = write_profile("sector4k", |t| {
        t.replace("sector_size: 512", "sector_size: 4096")
    });
    let dir = build_profile_into(&p, "sector4k");
    let raw = dir.join("disk.raw");
    // The primary GPT header sits in the second 4096-byte sector.
    assert_eq!(common::gpt_sector_size(&raw), 4096);
    common::check_gpt_4096(&raw);
    let out = ok(tool("fdisk")
        .args(["-b", "4096", "-l", "-o", "Device,Type,UUID,Name"])
        .arg(&raw));
    let rows: Vec<Vec<&str>> = out
        .lines()
        .filter(|l| l.starts_with(&*raw.to_string_lossy()))
        .map(|l| l.split_whitespace().collect())
        .collect();
    let types: Vec<String> = rows.iter().map(|r| r[1..r.len() - 2].join(" ")).collect();
    assert_eq!(
        types,
        [
            "Linux reserved",
            "BIOS boot",
            "EFI System",
            "Linux filesystem",
            "Linux filesystem",
            "Linux filesystem"
        ],
        "{out}"
    );
    let boot_guid = rows[2][rows[2].len() - 2].to_lowercase();
    let log = dir.join("nvme.console");
    let r = boot_report(
        &raw,
        &["--bus", "nvme", "--console-log", log.to_str().unwrap()],
    )
    .unwrap_or_else(|e| panic!("the 4Kn image did not boot: {e}"));
    assert_eq!((&r["version"], &r["slot"]), (&"0.1.0".into(), &"A".into()));
    assert_eq!(r["firmware"], "uefi");
    let console = std::fs::read_to_string(&log).unwrap();
    assert!(
        console
            .lines()
            .any(|l| l.starts_with("machined: stage2: boot disk nvme0n1: ")
                && l.contains(&format!("LoaderDevicePartUUID {boot_guid}"))),
        "BOOT ({boot_guid}) not named as the loader's partition:\n{console}"
    );
}

/// Builds the default image with `options` added to its command line and
/// boots it, expecting the boot to fail; returns what `imager boot` said.
fn failing_boot(name: &str, options: &[&str]) -> String {
    let extra: String = options.iter().map(|o| format!("    - {o}\n")).collect();
    let p = write_profile(name, |t| {
        t.replace("    - vdso32=0\n", &format!("    - vdso32=0\n{extra}"))
    });
    let dir = build_profile_into(&p, name);
    let out = run(imager()
        .args(["boot", "--quiet", "--timeout", "600"])
        .arg(dir.join("disk.raw")));
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "a broken runtime booted:\n{err}");
    assert!(err.contains("the runtime failed"), "{err}");
    err
}

#[test]
fn a_runtime_failure_fails_the_boot_with_its_reason() {
    let err = failing_boot(
        "broken",
        &["machined.break=ready", "machined.on_failure=poweroff"],
    );
    assert!(
        err.contains("machined: fatal: machined.break=ready"),
        "{err}"
    );
}

/// A runtime that hangs before ready is failed by its ready timeout, so that
/// boot counting sees a failed boot and not a machine stuck for ever.
#[test]
fn a_boot_that_hangs_is_failed_by_the_ready_timeout() {
    let err = failing_boot(
        "hangs",
        &[
            "machined.break=hang",
            "machined.ready_timeout=30",
            "machined.on_failure=poweroff",
        ],
    );
    assert!(
        err.contains("machined.break=hang: hanging before ready"),
        "{err}"
    );
    assert!(
        err.contains("machined: fatal: not ready 30 s after boot (machined.ready_timeout=30)"),
        "{err}"
    );
}

/// The output `vhd` alone: `disk.vhd` is metal's `disk.raw` byte for byte
/// with a fixed VHD footer (qemu-img reads it as vpc of exactly 2 GiB and
/// compares it equal), the manifest lists it and no raw disk, `imager
/// inspect` reads its table and META, `imager verify` checks it and names it
/// when a byte of its disk is flipped, and `imager boot` boots it to ready.
#[test]
fn the_output_vhd_is_the_raw_disk_as_a_fixed_vhd_and_boots() {
    let raw = image().artifact("raw");
    // Named metal as metal is (META's history names the profile).
    let p = write_profile("metal", |t| {
        assert!(t.contains("\noutputs: [raw]\n"), "metal's outputs changed");
        t.replace("\noutputs: [raw]\n", "\noutputs: [vhd]\n")
    });
    // Signed by the key metal's build used: the same META.
    image();
    let key = dev_key();
    let b = build_profile("vhd", &p, &["--key", key.to_str().unwrap()]);
    let vhd = b.artifact("vhd");
    let kinds: Vec<_> = b.json["artifacts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["kind"].as_str().unwrap().to_string())
        .collect();
    assert!(!kinds.contains(&"raw".to_string()), "{kinds:?}");
    assert!(!b.dir.join("disk.raw").exists());
    let opts = |f: &Path| {
        format!(
            "driver=vpc,force_size_calc=current_size,file.filename={}",
            f.display()
        )
    };
    let info: Value = serde_json::from_str(&ok(tool("qemu-img")
        .args(["info", "--output=json", "--image-opts"])
        .arg(opts(&vhd))))
    .unwrap();
    assert_eq!(info["format"], "vpc", "{info}");
    assert_eq!(info["virtual-size"], 2u64 << 30, "{info}");
    ok(tool("qemu-img")
        .args(["compare", "--image-opts"])
        .arg(opts(&vhd))
        .arg(format!("driver=raw,file.filename={}", raw.display())));
    let r: Value = serde_json::from_str(&ok(imager()
        .args(["inspect", "--json"])
        .arg(&vhd)
        .arg("--key")
        .arg(dev_pub())))
    .unwrap();
    assert_eq!(r["size"], 2u64 << 30, "{r}");
    assert_eq!(r["partition_table"]["copy"], "primary", "{r}");
    assert_eq!(r["partitions"].as_array().unwrap().len(), 6, "{r}");
    assert!(r["meta"]["valid_copy"].is_u64(), "{}", r["meta"]);
    assert_eq!(r["manifest"]["lists_image"], true, "{}", r["manifest"]);
    ok(imager()
        .arg("verify")
        .arg(&b.dir)
        .arg("--key")
        .arg(dev_pub()));
    flip_byte(&vhd, 2 * 1024 * 1024 + 3);
    let out = run(imager()
        .arg("verify")
        .arg(&b.dir)
        .arg("--key")
        .arg(dev_pub()));
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("disk.vhd"));
    flip_byte(&vhd, 2 * 1024 * 1024 + 3);
    // QEMU reads it as the 2 GiB disk, not the file with its footer.
    let log = scratch().join("vhd.console");
    let report = boot_report(&vhd, &["--console-log", log.to_str().unwrap()]).unwrap();
    assert_eq!(report["ready"], true, "{report}");
    let console = std::fs::read_to_string(&log).unwrap();
    assert!(
        console.contains("[vda] 4194304 512-byte logical blocks"),
        "{console}"
    );
}
