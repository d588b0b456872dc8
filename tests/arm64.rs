//! arm64 (issue 30), cross-built on this x86-64 machine without emulation:
//! what builds so far, the raw disk image (docs/arm64.md).
//!
//! The kernel is metal-arm64's: the default kernel's source and recipe,
//! cross-compiled with the Debian cross compiler from arm64's fragments,
//! audited by the KSPP rule table's arm64 rules with only the documented
//! waivers, and an EFI program for aa64 (PE machine 0xAA64). The image
//! (`imager build --profile metal-arm64`) is checked by independent tools:
//! its ESP holds Debian's arm64 systemd-boot (scripts/setup.sh unpacks it)
//! and no x86-64 boot file, its MBR and BIOS partition no boot code, its
//! root filesystem the runtime cross-built static for aarch64 and mkfs.xfs
//! with its libraries from Debian's arm64 packages, none of the host's. It
//! reaches ready under QEMU's arm64 UEFI firmware (AAVMF, TCG) from a
//! virtio disk and from NVMe, and two builds in different directories are
//! the same bytes.

// Test helpers panic on unexpected failures: that is how a test fails.
#![allow(clippy::unwrap_used)]

mod common;
#[path = "../registry/tests/common/mod.rs"]
mod reg;

use common::vm::*;
use common::*;
use contract::Arch;
use std::path::{Path, PathBuf};

/// Where scripts/setup.sh unpacks Debian's arm64 packages.
fn arm64_root() -> PathBuf {
    imager::closure::host_root(Arch::Arm64)
}

fn profile() -> imager::profile::Profile {
    imager::profile::Profile::load(&repo().join("profiles/metal-arm64.yaml")).unwrap()
}

/// metal-arm64's kernel (built, or from the cache, once for the file's
/// tests): its image and config, and what the build said.
fn arm64_kernel() -> &'static (PathBuf, PathBuf, String) {
    static KERNEL: std::sync::OnceLock<(PathBuf, PathBuf, String)> = std::sync::OnceLock::new();
    KERNEL.get_or_init(|| {
        let out = run(imager().args(["kernel", "build", "--profile", "metal-arm64"]));
        let said = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{said}");
        let image = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        let config = image.with_file_name("config");
        (image, config, said)
    })
}

/// The PE machine of an EFI program (MZ header, `e_lfanew` at 0x3c).
fn pe_machine(bytes: &[u8]) -> u16 {
    assert_eq!(&bytes[..2], b"MZ", "no MZ header");
    let pe = u32_at(bytes, 0x3c) as usize;
    assert_eq!(&bytes[pe..pe + 4], b"PE\0\0", "no PE header at {pe:#x}");
    u16::from_le_bytes([bytes[pe + 4], bytes[pe + 5]])
}

#[test]
fn the_arm64_kernel_is_cross_built_audited_and_an_efi_program_for_aa64() {
    let (image, config, said) = arm64_kernel();
    assert!(
        said.lines().any(|l| l.starts_with("kernel: kspp: ")
            && l.contains(" ok, 0 failed, ")
            && l.ends_with(" n/a, 4 waived")),
        "{said}"
    );
    let bytes = std::fs::read(image).unwrap();
    // arm64's boot image header (Documentation/arch/arm64/booting.rst):
    // the magic "ARM\x64" at 0x38, and the EFI stub's PE header.
    assert_eq!(&bytes[0x38..0x3c], b"ARM\x64", "not an arm64 Image");
    assert_eq!(pe_machine(&bytes), 0xAA64);
    imager::boot::check_efi_binary(image, Arch::Arm64).unwrap();
    let e = imager::boot::check_efi_binary(image, Arch::Amd64).unwrap_err();
    assert!(
        e.to_string().contains("not an EFI program for amd64"),
        "{e}"
    );
    let file = ok(tool("file").arg(image));
    assert!(file.contains("ARM64 boot executable Image"), "{file}");
    let text = std::fs::read_to_string(config).unwrap();
    assert!(
        text.contains("# Linux/arm64 6.12."),
        "not an arm64 6.12 config"
    );

    // The audit read back by `imager kernel check` against the source's
    // Kconfig, with the profile's command line: only the documented
    // waivers, and arm64's own rules met.
    let dir = scratch().join("arm64-audit");
    std::fs::create_dir_all(&dir).unwrap();
    let cmdline = dir.join("cmdline");
    std::fs::write(&cmdline, profile().cmdline()).unwrap();
    let report = ok(imager()
        .args([
            "kernel",
            "check",
            "--source",
            "/usr/src/linux-source-6.12.tar.xz",
        ])
        .arg("--waivers")
        .arg(repo().join("kernel-config/arm64/kspp-waivers.yaml"))
        .arg("--cmdline")
        .arg(&cmdline)
        .arg(config));
    assert!(report.contains(" 0 failed"), "{report}");
    let mut waived: Vec<&str> = report
        .lines()
        .filter_map(|l| l.strip_prefix("WAIVED "))
        .map(|l| l.split_whitespace().next().unwrap())
        .collect();
    waived.sort_unstable();
    assert_eq!(
        waived,
        [
            "CONFIG_ARM64_BTI_KERNEL",
            "CONFIG_CFI_CLANG",
            "CONFIG_UBSAN_LOCAL_BOUNDS",
            "CONFIG_UNWIND_PATCH_PAC_INTO_SCS"
        ],
        "{report}"
    );
    for met in [
        "CONFIG_ARM64_PTR_AUTH_KERNEL=y",
        "CONFIG_SHADOW_CALL_STACK=y",
        "CONFIG_UNMAP_KERNEL_AT_EL0=y",
        "CONFIG_ARM64_MTE=y",
        "CONFIG_KASAN_HW_TAGS=y",
        "kpti=on",
        "kasan.fault=panic",
        "CONFIG_ARCH_MMAP_RND_BITS=33",
        "CONFIG_GCC_PLUGIN_STACKLEAK=y",
        "CONFIG_RANDSTRUCT_FULL=y",
        "lockdown=confidentiality",
    ] {
        assert!(report.contains(&format!("OK   {met}")), "{met}:\n{report}");
    }
    // x86's rules are not applicable, not failed.
    assert!(
        report.contains("N/A  CONFIG_X86_KERNEL_IBT (x86_64 only; this kernel is arm64)"),
        "{report}"
    );
}

/// installer-arm64's build (metal for arm64: its raw disk and installer
/// image), version 0.1.0, built once for the file's tests.
fn arm64_image() -> &'static Build {
    static B: Fixture<Build> = Fixture::new("arm64-image");
    B.get(|| {
        arm64_kernel();
        build_profile(
            "arm64-a",
            &repo().join("profiles/installer-arm64.yaml"),
            &["--key", &dev_key().display().to_string()],
        )
    })
}

/// Version 0.2.0 of metal for arm64 and for amd64 (each its raw disk and
/// installer image), and the image index `imager index` makes of their
/// two installer images.
struct Both {
    arm64: Build,
    amd64: Build,
    index: PathBuf,
}

fn both() -> &'static Both {
    static B: Fixture<Both> = Fixture::new("arm64-index");
    B.get(|| {
        let v2 = |t: String| t.replace("version: 0.1.0", "version: 0.2.0");
        let key = dev_key().display().to_string();
        let arm64 = build_profile(
            "arm64-v2",
            &write_profile_from("installer-arm64", "arm64-v2", v2),
            &["--key", &key],
        );
        let amd64 = build_profile(
            "amd64-v2",
            &write_profile_from("installer", "amd64-v2", v2),
            &["--key", &key],
        );
        let index = scratch().join("both.tar");
        let said = ok(imager()
            .args(["index", "--out"])
            .arg(&index)
            .arg(amd64.artifact("installer"))
            .arg(arm64.artifact("installer")));
        assert!(said.contains("holds amd64 sha256:"), "{said}");
        Both {
            arm64,
            amd64,
            index,
        }
    })
}

/// Each build of [`Both`] in the index's order (amd64, arm64): its
/// architecture, and skopeo's inspection of its own installer image.
fn both_alone(b: &Both) -> [(&'static str, serde_json::Value); 2] {
    [("amd64", &b.amd64), ("arm64", &b.arm64)].map(|(arch, build)| {
        let own = format!("oci-archive:{}", build.artifact("installer").display());
        let alone = serde_json::from_str(&ok(tool("skopeo").args(["inspect", &own]))).unwrap();
        (arch, alone)
    })
}

/// `mtools` reads the partition `label` of `disk` at its byte offset.
fn mtools_at(disk: &Path, label: &str) -> String {
    let (first, _) = partition_range(disk, label);
    format!("{}@@{}", disk.display(), first)
}

#[test]
fn the_arm64_image_is_made_of_arm64s_parts_and_none_of_the_hosts() {
    let b = arm64_image();
    let raw = b.artifact("raw");
    assert_eq!(
        b.json["artifacts"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|a| a["kind"] == "raw")
            .count(),
        1
    );
    // The ESP: Debian's arm64 systemd-boot at arm64's removable-media path
    // (read by mtools), and no x86-64 boot loader.
    let esp = mtools_at(&raw, "EFI");
    let listing = ok(tool("mdir").args(["-i", &esp, "-b", "-/", "::"]));
    assert!(listing.contains("::/EFI/BOOT/BOOTAA64.EFI"), "{listing}");
    assert!(!listing.to_uppercase().contains("BOOTX64"), "{listing}");
    let dir = scratch().join("arm64-parts");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let loader = dir.join("BOOTAA64.EFI");
    ok(tool("mcopy")
        .args(["-i", &esp, "::/EFI/BOOT/BOOTAA64.EFI"])
        .arg(&loader));
    let debian = arm64_root().join("usr/lib/systemd/boot/efi/systemd-bootaa64.efi");
    assert_eq!(
        sha256(&loader),
        sha256(&debian),
        "BOOTAA64.EFI is not Debian's"
    );
    let file = ok(tool("file").arg(&loader));
    assert!(
        file.contains("EFI application") && file.contains("Aarch64"),
        "{file}"
    );
    // UEFI only: no boot code in the MBR (its first 440 bytes) and an empty
    // BIOS boot partition.
    let mut f = std::fs::File::open(&raw).unwrap();
    assert!(
        read_at(&mut f, 0, 440).iter().all(|b| *b == 0),
        "boot code in the MBR"
    );
    let (at, len) = partition_range(&raw, "BIOS");
    let bios = read_at(&mut f, at, usize::try_from(len).unwrap());
    assert!(
        bios.iter().all(|b| *b == 0),
        "the BIOS partition is not empty"
    );

    // The root filesystem, by unsquashfs: the runtime static for aarch64,
    // mkfs.xfs and every library of its closure aarch64 ELF files, the
    // loader arm64's.
    let root = dir.join("rootfs");
    ok(tool("unsquashfs")
        .args(["-no-progress", "-d"])
        .arg(&root)
        .arg(b.artifact("rootfs")));
    let init = root.join(contract::paths::ROOTFS_INIT.trim_start_matches('/'));
    let file = ok(tool("file").arg(&init));
    assert!(
        file.contains("ARM aarch64") && file.contains("statically linked"),
        "{file}"
    );
    let e = imager::runtime::check_static(&init, Arch::Amd64)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("is an arm64 executable, not an amd64 one"),
        "{e}"
    );
    let closure = std::fs::read_to_string(
        root.join(contract::paths::ROOTFS_HOST_CLOSURE.trim_start_matches('/')),
    )
    .unwrap();
    let mut elves = vec!["usr/sbin/mkfs.xfs".to_string()];
    elves.extend(
        closure
            .lines()
            .filter_map(|l| l.strip_prefix("host "))
            .map(|l| l.split_whitespace().nth(1).unwrap().to_string()),
    );
    assert!(
        elves.iter().any(|e| e == "lib/ld-linux-aarch64.so.1"),
        "{closure}"
    );
    assert!(elves.iter().any(|e| e.ends_with("/libc.so.6")), "{closure}");
    for e in &elves {
        let path = root.join(e);
        let file = ok(tool("file").arg("-L").arg(&path));
        assert!(file.contains("ARM aarch64"), "{e}: {file}");
        // The bytes of Debian's arm64 package, not the host's.
        let from = imager::closure::host_file(&arm64_root(), &Path::new("/").join(e)).unwrap();
        assert_eq!(sha256(&path), sha256(&from), "{e}");
    }
    assert!(!elves.iter().any(|e| e.contains("x86_64")), "{elves:?}");
}

/// `imager boot` of the arm64 image on `bus`: the machine is arm64's
/// (found from the ESP's boot loader), and it reaches ready from slot A
/// with its root verified.
fn boots_to_ready(bus: &str) {
    let b = arm64_image();
    let r = boot_report(&b.artifact("raw"), &["--bus", bus]).unwrap();
    ready_on_a(&r, &format!("from {bus}"));
    assert_eq!(r["secure_boot"], "off", "{r}");
}

/// Checks `imager boot`'s report `r` of an arm64 image (booted `how`):
/// 0.1.0 reached ready under UEFI on slot A of an arm64 machine, its root
/// verified; the time is said.
fn ready_on_a(r: &serde_json::Value, how: &str) {
    say(&format!(
        "arm64 under AAVMF {how}: ready after {:.1} s",
        r["seconds"].as_f64().unwrap()
    ));
    assert_eq!(r["arch"], "arm64", "{r}");
    assert_eq!(r["firmware"], "uefi", "{r}");
    assert_eq!(r["slot"], "A", "{r}");
    assert_eq!(r["version"], "0.1.0", "{r}");
    assert_eq!(r["root_verified"], true, "{r}");
}

#[test]
fn the_arm64_image_reaches_ready_under_aavmf_from_virtio() {
    boots_to_ready("virtio");
}

#[test]
fn the_arm64_image_reaches_ready_under_aavmf_from_nvme() {
    boots_to_ready("nvme");
}

/// The arm64 disk converted to qcow2 by qemu-img (not our writer):
/// `imager boot` reads its architecture through the qcow2 reader, without
/// `--arch`, and it reaches ready on arm64's machine.
#[test]
fn the_arm64_disk_as_qcow2_boots_on_arm64s_machine_without_being_told() {
    let raw = arm64_image().artifact("raw");
    let qcow2 = scratch().join("arm64.qcow2");
    let _ = std::fs::remove_file(&qcow2);
    ok(tool("qemu-img")
        .args(["convert", "-O", "qcow2"])
        .arg(&raw)
        .arg(&qcow2));
    let r = boot_report(&qcow2, &[]).unwrap();
    ready_on_a(&r, "from a qcow2 image");
}

#[test]
fn two_builds_of_the_arm64_image_in_different_directories_are_the_same_bytes() {
    let a = arm64_image();
    // The second from another working directory, into another output
    // directory, with the profile given by a relative path.
    let other = scratch().join("arm64-b/somewhere/else");
    let _ = std::fs::remove_dir_all(scratch().join("arm64-b"));
    std::fs::create_dir_all(&other).unwrap();
    let profile = pathdiff(&repo().join("profiles/installer-arm64.yaml"), &other);
    let out = ok(imager()
        .current_dir(&other)
        .args(["build", "--json", "--profile"])
        .arg(&profile)
        .arg("--key")
        .arg(dev_key())
        .args(["--out", "out"]));
    let b: serde_json::Value = serde_json::from_str(&out).unwrap();
    // A path the build prints may be relative to its working directory.
    let names = |json: &serde_json::Value, cwd: &Path| -> Vec<(String, String)> {
        let mut v: Vec<(String, String)> = json["artifacts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| {
                let path = cwd.join(x["path"].as_str().unwrap());
                let name = path.file_name().unwrap().to_string_lossy().into_owned();
                (name, sha256(&path))
            })
            .collect();
        v.sort();
        v
    };
    let (first, second) = (names(&a.json, &repo()), names(&b, &other));
    assert!(first.iter().any(|(n, _)| n == "disk.raw"), "{first:?}");
    assert_eq!(first, second, "the two builds differ");
}

/// `to` relative to the directory `from` (both absolute).
fn pathdiff(to: &Path, from: &Path) -> PathBuf {
    let (to, from): (Vec<_>, Vec<_>) = (to.components().collect(), from.components().collect());
    let common = to.iter().zip(&from).take_while(|(a, b)| a == b).count();
    let mut p = PathBuf::new();
    for _ in common..from.len() {
        p.push("..");
    }
    for c in &to[common..] {
        p.push(c);
    }
    p
}

/// The image index of the two architectures' installer images, as skopeo
/// reads it: one index under the images' name, each platform's image (the
/// one its build made, digest for digest) taken by `--override-arch`.
#[test]
fn skopeo_reads_the_index_of_both_architectures_and_takes_each_platform() {
    let b = both();
    let index = format!("oci-archive:{}", b.index.display());
    let raw: serde_json::Value =
        serde_json::from_str(&ok(tool("skopeo").args(["inspect", "--raw", &index]))).unwrap();
    assert_eq!(
        raw["mediaType"], "application/vnd.oci.image.index.v1+json",
        "{raw}"
    );
    let platforms: Vec<String> = raw["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| format!("{}/{}", m["platform"]["os"], m["platform"]["architecture"]))
        .collect();
    assert_eq!(
        platforms,
        ["\"linux\"/\"amd64\"", "\"linux\"/\"arm64\""],
        "{raw}"
    );
    for (i, (arch, alone)) in both_alone(b).into_iter().enumerate() {
        // The index names the image its build made, by its digest.
        assert_eq!(
            raw["manifests"][i]["digest"], alone["Digest"],
            "{arch}: {raw}"
        );
        let taken: serde_json::Value = serde_json::from_str(&ok(tool("skopeo").args([
            "--override-arch",
            arch,
            "inspect",
            &index,
        ])))
        .unwrap();
        // The platform's image: its architecture and its build's layers
        // (the payloads differ between the two).
        assert_eq!(taken["Architecture"], arch, "{taken}");
        assert_eq!(taken["Layers"], alone["Layers"], "{arch}");
    }
    // The same archives give the same index, byte for byte.
    let again = scratch().join("both-again.tar");
    ok(imager()
        .args(["index", "--out"])
        .arg(&again)
        .arg(b.arm64.artifact("installer"))
        .arg(b.amd64.artifact("installer")));
    assert_eq!(sha256(&again), sha256(&b.index));
}

/// `imager upgrade` of `disk` with `installer`, refused: the message says
/// `wants`, and the disk's bytes are unchanged.
fn refused(disk: &Path, installer: &Path, wants: &[&str]) {
    let before = sha256(disk);
    let out = run(imager()
        .args(["upgrade", "--installer"])
        .arg(installer)
        .arg("--disk")
        .arg(disk));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{said}");
    for w in wants {
        assert!(said.contains(w), "{w:?}:\n{said}");
    }
    assert!(said.contains("nothing was written"), "{said}");
    assert_eq!(sha256(disk), before, "{}", disk.display());
}

/// An x86-64 disk refuses the arm64 payload, as an installer image and as
/// a build's directory; an arm64 disk refuses amd64's: before writing
/// anything.
#[test]
fn a_disk_refuses_the_payload_of_the_other_architecture_with_nothing_written() {
    let b = both();
    let x86 = sparse_copy(&b.amd64.artifact("raw"), "arm64-refuses-x86");
    refused(
        &x86,
        &b.arm64.artifact("installer"),
        &["the installer image is for \"arm64\", not amd64"],
    );
    refused(
        &x86,
        &b.arm64.dir,
        &["it is an arm64 payload (of metal 0.2.0) but this disk boots amd64"],
    );
    let arm = sparse_copy(&arm64_image().artifact("raw"), "arm64-refuses-arm");
    refused(
        &arm,
        &b.amd64.artifact("installer"),
        &["the installer image is for \"amd64\", not arm64"],
    );
    refused(
        &arm,
        &b.amd64.dir,
        &["it is an amd64 payload (of metal 0.2.0) but this disk boots arm64"],
    );
}

/// `imager boot --write` of an arm64 `disk`: the report and the console.
fn boot_arm64(disk: &Path, reboots: bool) -> (serde_json::Value, String) {
    let (r, console) = boot_written(disk, reboots, &[]);
    assert_eq!(r["arch"], "arm64", "{r}");
    (r, console)
}

fn version_and_slot(r: &serde_json::Value) -> (&str, &str) {
    (r["version"].as_str().unwrap(), r["slot"].as_str().unwrap())
}

/// Upgrade, bless, rollback and fallback on arm64 as on x86-64
/// (tests/upgrade.rs): the index's arm64 payload goes to slot B and is
/// blessed at its trial boot; a rollback boots A again; a version that
/// never reaches ready falls back by itself after its tries.
#[test]
fn the_arm64_disk_upgrades_from_the_index_rolls_back_and_falls_back() {
    let disk = sparse_copy(&arm64_image().artifact("raw"), "arm64-upgrade");
    let (r, _) = boot_arm64(&disk, false);
    assert_eq!(version_and_slot(&r), ("0.1.0", "A"));
    let up: serde_json::Value = serde_json::from_str(&ok(imager()
        .args(["upgrade", "--json", "--installer"])
        .arg(&both().index)
        .arg("--disk")
        .arg(&disk)))
    .unwrap();
    assert_eq!(
        (&up["to_slot"], &up["to_version"]),
        (&"B".into(), &"0.2.0".into())
    );
    let (r, console) = boot_arm64(&disk, false);
    assert_eq!(version_and_slot(&r), ("0.2.0", "B"));
    assert!(
        console.contains("machined: blessed slot B (0.2.0): the upgrade from 0.1.0 succeeded"),
        "{console}"
    );
    ok(imager().args(["rollback", "--disk"]).arg(&disk));
    let (r, _) = boot_arm64(&disk, false);
    assert_eq!(version_and_slot(&r), ("0.1.0", "A"));

    // 0.3.0 stops before ready: after its three tries systemd-boot's
    // counting has the machine back on A.
    let broken = build_profile(
        "arm64-v3",
        &write_profile_from("metal-arm64", "arm64-v3", |t| {
            t.replace("version: 0.1.0", "version: 0.3.0")
                .replace("    - gpt\n", "    - gpt\n    - machined.break=ready\n")
        }),
        &["--key", &dev_key().display().to_string()],
    );
    let up: serde_json::Value = serde_json::from_str(&ok(imager()
        .args(["upgrade", "--json", "--installer"])
        .arg(&broken.dir)
        .arg("--disk")
        .arg(&disk)))
    .unwrap();
    assert_eq!(up["to_slot"], "B", "{up}");
    let (r, console) = boot_arm64(&disk, true);
    assert_eq!(version_and_slot(&r), ("0.1.0", "A"));
    assert_eq!(r["failed_boots"], 3, "{console}");
    assert!(
        console.contains(
            "machined: rollback: the upgrade to slot B (0.3.0) failed: it failed to reach \
             ready in 3 tries; running slot A (0.1.0)"
        ),
        "{console}"
    );
}

/// What arm64 does not build yet is refused before anything is written,
/// each named: the clouds' images (their descriptions name x86-64
/// machines).
#[test]
fn an_arm64_profile_asking_for_the_clouds_images_is_refused_before_any_work() {
    let profile = write_profile_from("installer-arm64", "arm64-clouds", |t| {
        let (outputs, console) = (
            "outputs: [raw, installer]",
            "    - console=ttyAMA0,115200\n",
        );
        assert!(t.contains(outputs) && t.contains(console), "{t}");
        // The clouds' serial console, which their outputs ask for.
        t.replace(outputs, "outputs: [raw, gcp, aws]")
            .replace(console, "    - console=ttyS0\n")
    });
    let out = scratch().join("arm64-clouds");
    let _ = std::fs::remove_dir_all(&out);
    let o = run(imager()
        .args(["build", "--profile"])
        .arg(&profile)
        .arg("--out")
        .arg(&out));
    let said = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{said}");
    assert!(
        said.contains("arch arm64: gcp, aws not built for arm64 yet"),
        "{said}"
    );
    assert!(!out.exists(), "{} was made", out.display());
}

/// secureboot-arm64's build, with a key set `imager keygen --secure-boot`
/// made for these tests, and that key set's directory.
fn sb_image() -> &'static (Build, PathBuf) {
    static B: Fixture<(Build, PathBuf)> = Fixture::new("arm64-secureboot");
    B.get(|| {
        arm64_kernel();
        let keys = scratch().join("arm64-sb-keys");
        let _ = std::fs::remove_dir_all(&keys);
        ok(imager().args(["keygen", "--secure-boot"]).arg(&keys));
        let profile = write_profile_from("secureboot-arm64", "arm64-sb", |t| {
            let old = "secure_boot:\n  enroll: force\n";
            assert!(t.contains(old), "{t}");
            t.replace(
                old,
                &format!(
                    "secure_boot:\n  keys: {}\n  enroll: force\n",
                    keys.display()
                ),
            )
        });
        let key = dev_key().display().to_string();
        (build_profile("arm64-sb", &profile, &["--key", &key]), keys)
    })
}

/// A copy of `disk` (as `name` in the scratch directory) whose file `path`
/// on the partition `label` has one byte flipped at `at`, through mtools.
fn with_flipped_byte(disk: &Path, label: &str, path: &str, at: usize, name: &str) -> PathBuf {
    let copy = scratch().join(name);
    std::fs::copy(disk, &copy).unwrap();
    let file = copy.with_extension("file");
    let fs = mtools_at(&copy, label);
    ok(tool("mcopy")
        .args(["-o", "-n", "-i", &fs])
        .arg(format!("::/{path}"))
        .arg(&file));
    let mut b = std::fs::read(&file).unwrap();
    b[at] ^= 0x01;
    std::fs::write(&file, b).unwrap();
    ok(tool("mcopy")
        .args(["-o", "-n", "-i", &fs])
        .arg(&file)
        .arg(format!("::/{path}")));
    copy
}

/// The Secure Boot variant: sbverify (not our verifier) accepts the
/// signed systemd-boot and slot A's UKI as the disk holds them (slot B is
/// empty until an upgrade) and the build's UKIs of both slots, all for
/// AArch64, with the db certificate; AAVMF with the key set enrolled by
/// `virt-fw-vars` boots it to ready with Secure Boot on and the root
/// verified; one changed byte in slot A's UKI, or in systemd-boot, and the
/// firmware refuses to run it.
#[test]
fn the_arm64_secure_boot_image_boots_with_its_keys_enrolled_and_refuses_a_changed_byte() {
    let (b, keys) = sb_image();
    let disk = b.artifact("raw");
    let loader = scratch().join("arm64-sb-BOOTAA64.EFI");
    ok(tool("mcopy")
        .args(["-o", "-n", "-i", &mtools_at(&disk, "EFI")])
        .arg("::/EFI/BOOT/BOOTAA64.EFI")
        .arg(&loader));
    let uki_a = mdir_names(&disk, "BOOT", "EFI/Linux")
        .into_iter()
        .find(|n| n.contains("slot-a"))
        .unwrap();
    let disk_uki = scratch().join("arm64-sb-slot-a.efi");
    ok(tool("mcopy")
        .args(["-o", "-n", "-i", &mtools_at(&disk, "BOOT")])
        .arg(format!("::/EFI/Linux/{uki_a}"))
        .arg(&disk_uki));
    for f in [
        loader.clone(),
        disk_uki,
        b.dir.join("uki-a.efi"),
        b.dir.join("uki-b.efi"),
    ] {
        assert_eq!(pe_machine(&std::fs::read(&f).unwrap()), 0xAA64, "{f:?}");
        let o = run(tool("sbverify")
            .arg("--cert")
            .arg(keys.join("db.crt"))
            .arg(&f));
        let said = String::from_utf8_lossy(&o.stdout);
        assert!(o.status.success(), "{}: {said}", f.display());
        assert!(said.contains("Signature verification OK"), "{said}");
    }
    let vars = |name: &str| {
        enrolled_vars_of(
            Arch::Arm64,
            keys,
            &scratch().join(format!("arm64-sb-{name}.vars.fd")),
            true,
        )
    };
    let v = vars("ready");
    let r = boot_report(&disk, &["--secure-boot", &v.display().to_string()]).unwrap();
    ready_on_a(&r, "with Secure Boot");
    assert_eq!(r["secure_boot"], "on", "{r}");

    let refused = |disk: &Path, name: &str| {
        let mut o = imager::qemu::BootOptions::new(disk);
        o.arch = Arch::Arm64;
        o.echo = false;
        o.timeout = std::time::Duration::from_secs(600);
        o.secure_boot_vars = Some(vars(name));
        imager::qemu::boot_until(&o, &["Access Denied"]).unwrap_or_else(|e| panic!("{e:#}"))
    };
    let bad = with_flipped_byte(
        &disk,
        "BOOT",
        &format!("EFI/Linux/{uki_a}"),
        0x2000,
        "arm64-sb-uki.raw",
    );
    let line = refused(&bad, "uki");
    assert!(
        line.contains(&format!("Error loading \\EFI\\Linux\\{uki_a}")),
        "{line}"
    );
    let bad = with_flipped_byte(
        &disk,
        "EFI",
        "EFI/BOOT/BOOTAA64.EFI",
        0x2000,
        "arm64-sb-loader.raw",
    );
    let line = refused(&bad, "loader");
    assert!(line.contains("failed to load Boot"), "{line}");
}

/// The names in the directory `dir` of the FAT partition `label` of `disk`
/// (mtools).
fn mdir_names(disk: &Path, label: &str, dir: &str) -> Vec<String> {
    ok(tool("mdir")
        .args(["-b", "-i", &mtools_at(disk, label)])
        .arg(format!("::/{dir}")))
    .lines()
    .filter_map(|l| l.trim().rsplit('/').next().map(str::to_string))
    .filter(|n| !n.is_empty())
    .collect()
}

/// The serial number of the disk the arm64 ISO installs to.
const TARGET: &str = "TARGET01";

/// iso-arm64's build with `live.install: serial:TARGET01`: a live ISO that
/// installs onto the disk with that serial.
fn install_iso() -> &'static Build {
    static B: Fixture<Build> = Fixture::new("arm64-iso");
    B.get(|| {
        arm64_kernel();
        let profile = write_profile_from("iso-arm64", "arm64-iso", |t| {
            format!("{t}\nlive:\n  install: serial:{TARGET}\n")
        });
        let key = dev_key().display().to_string();
        build_profile("arm64-iso", &profile, &["--key", &key])
    })
}

/// The arm64 ISO, read by xorriso and sfdisk: one El Torito boot image,
/// for UEFI, no BIOS image and no GRUB; a GPT whose one partition is the
/// EFI image, holding arm64's systemd-boot. Booted from the CD-ROM
/// (virtio-scsi: the virt machine has no AHCI) with a blank disk, the live
/// system installs onto it and powers off, and the disk then boots to
/// ready by itself; attached as a disk with the target's serial (a USB
/// stick written with dd), the ISO boots too and refuses to install onto
/// itself.
#[test]
fn the_arm64_iso_boots_by_uefi_and_installs_a_disk_that_boots() {
    let iso = install_iso().artifact("iso");
    let report = ok(tool("xorriso")
        .args(["-indev"])
        .arg(&iso)
        .args(["-report_el_torito", "plain"]));
    let images: Vec<&str> = report
        .lines()
        .filter(|l| l.starts_with("El Torito boot img :"))
        .collect();
    assert_eq!(images.len(), 1, "{report}");
    assert!(images[0].contains(" UEFI "), "{report}");
    let listing = ok(tool("xorriso")
        .args(["-indev"])
        .arg(&iso)
        .args(["-find", "/", "-exec", "lsdl"]));
    assert!(!listing.to_lowercase().contains("grub"), "{listing}");
    assert_eq!(partition_names(&iso), ["EFI"]);
    let efi = mdir_names(&iso, "EFI", "EFI/BOOT");
    assert_eq!(efi, ["BOOTAA64.EFI"], "{efi:?}");

    let disk = blank_disk(&scratch().join("arm64-iso-target.raw"), 4 << 30);
    let spec = format!("{},serial={TARGET}", disk.display());
    let r = boot_report(&iso, &["--disk", &spec]).unwrap();
    assert_eq!(r["arch"], "arm64", "{r}");
    assert_eq!(r["live"], true, "{r}");
    assert_eq!(r["install"]["installed"], true, "{r}");
    check_gpt(&disk);
    assert_eq!(
        partition_names(&disk),
        ["EFI", "BIOS", "BOOT", "META", "STATE", "EPHEMERAL"]
    );
    let r = boot_report(&disk, &[]).unwrap();
    assert_eq!(r["arch"], "arm64", "{r}");
    assert_eq!(
        (&r["slot"], &r["live"]),
        (&"A".into(), &false.into()),
        "{r}"
    );

    let e = boot_report(&iso, &["--usb", "--serial", TARGET]).unwrap_err();
    assert!(e.contains("it is the boot medium"), "{e}");
}

/// `imager install --arch arm64` lays out a blank disk from the index's
/// arm64 payload, which boots to ready under AAVMF with no BIOS boot; the
/// same install without `--arch` (this machine's amd64) of the arm64
/// installer image alone is refused and makes no disk.
#[test]
fn imager_install_takes_the_payload_of_its_arch_from_the_index() {
    let b = both();
    let pubkey = repo().join("out/keys/dev.pub");
    let refused_disk = scratch().join("arm64-install-refused.raw");
    let _ = std::fs::remove_file(&refused_disk);
    let o = run(imager()
        .args(["install", "--installer"])
        .arg(b.arm64.artifact("installer"))
        .arg("--disk")
        .arg(&refused_disk)
        .arg("--key")
        .arg(&pubkey));
    let said = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{said}");
    assert!(
        said.contains("installing the amd64 payload (--arch)")
            && said.contains("the installer image is for \"arm64\", not amd64"),
        "{said}"
    );
    assert!(!refused_disk.exists(), "a disk was made");

    let disk = scratch().join("arm64-install.raw");
    let _ = std::fs::remove_file(&disk);
    let r: serde_json::Value = serde_json::from_str(&ok(imager()
        .args([
            "install",
            "--json",
            "--arch",
            "arm64",
            "--size",
            "2GiB",
            "--installer",
        ])
        .arg(&b.index)
        .arg("--disk")
        .arg(&disk)
        .arg("--key")
        .arg(&pubkey)))
    .unwrap();
    check_gpt(&disk);
    assert_eq!((&r["slot"], &r["version"]), (&"A".into(), &"0.2.0".into()));
    assert_eq!(r["bios_boot"], false, "{r}");
    let (r, _) = boot_arm64(&disk, false);
    assert_eq!(version_and_slot(&r), ("0.2.0", "A"));
}

/// Where the arm64 node reaches the test's registry (QEMU's guestfwd).
const GUEST_REGISTRY: &str = "10.0.2.100:5000";

/// The node's pull on arm64: `imager push` sends the index of both
/// architectures to a registry whole (skopeo then takes each platform's
/// image from the tag, at the digest its build made); an arm64 node,
/// provisioned with a node's credentials, asked over its API to upgrade
/// from that tag, takes its own platform's image (its runtime's
/// `Arch::NATIVE`), writes it to slot B, and boots it.
#[test]
fn an_arm64_node_pulls_its_own_platform_from_a_pushed_index() {
    let b = both();
    let dir = scratch().join("arm64-node");
    let _ = std::fs::remove_dir_all(&dir);
    let creds = dir.join("credentials");
    for args in [
        &["--role", "operator", "--name", "ops"][..],
        &["--role", "admin", "--name", "root"][..],
        &NODE1[..],
    ] {
        ok(imager()
            .args(["node", "credentials"])
            .arg(&creds)
            .args(args));
    }
    let v1 = {
        arm64_kernel();
        let profile = write_profile_from("metal-arm64", "arm64-node-v1", |t| {
            format!("{t}\nnode_api:\n  plain_http_registries: [{GUEST_REGISTRY}]\n")
        });
        build_profile(
            "arm64-node-v1",
            &profile,
            &["--key", &dev_key().display().to_string()],
        )
    };

    let registry = reg::Registry::start();
    let tag = format!("{}/metal/installer:0.2.0", registry.addr);
    let pushed: serde_json::Value = serde_json::from_str(&ok(imager()
        .args(["push", "--plain-http", "--json"])
        .arg(&b.index)
        .arg(&tag)))
    .unwrap();
    assert_eq!(pushed["images"].as_array().unwrap().len(), 2, "{pushed}");
    let remote = format!("docker://{tag}");
    let raw_text = ok(tool("skopeo").args(["inspect", "--tls-verify=false", "--raw", &remote]));
    // The registry holds the archive's own index, byte for byte.
    let archived = ok(tool("skopeo").args([
        "inspect",
        "--raw",
        &format!("oci-archive:{}", b.index.display()),
    ]));
    assert_eq!(raw_text, archived);
    let raw: serde_json::Value = serde_json::from_str(&raw_text).unwrap();
    assert_eq!(
        raw["mediaType"], "application/vnd.oci.image.index.v1+json",
        "{raw}"
    );
    let mut arm64_digest = String::new();
    for (i, (arch, alone)) in both_alone(b).into_iter().enumerate() {
        // The registry's index names each build's image by its digest.
        assert_eq!(raw["manifests"][i]["digest"], alone["Digest"], "{raw}");
        assert_eq!(raw["manifests"][i]["platform"]["architecture"], arch);
        if arch == "arm64" {
            arm64_digest = alone["Digest"].as_str().unwrap().to_string();
        }
        let taken: serde_json::Value = serde_json::from_str(&ok(tool("skopeo").args([
            "--override-arch",
            arch,
            "inspect",
            "--tls-verify=false",
            &remote,
        ])))
        .unwrap();
        // The tag's digest is the index's, as pushed; the platform's
        // image is its build's (its layers).
        assert_eq!(taken["Digest"], pushed["digest"], "{taken}");
        assert_eq!(taken["Architecture"], arch, "{taken}");
        assert_eq!(taken["Layers"], alone["Layers"], "{arch}");
    }

    let disk = sparse_copy(&v1.artifact("raw"), "arm64-node");
    provision_node1(&disk, &creds);
    let forward = format!("{GUEST_REGISTRY}={}", registry.addr);
    let mut vm = Vm::boot(&disk, reg::free_port(), &["--guest-forward", &forward]);
    let ready = vm.wait_for("ready version=", 1);
    assert!(ready.contains("version=0.1.0 slot=A"), "{ready}");
    let image = format!("{GUEST_REGISTRY}/metal/installer:0.2.0");
    let out = node_cmd(
        &vm,
        &creds,
        "ops",
        &["upgrade", "--image", &image, "--wait"],
    );
    assert!(
        out.status.success(),
        "{}\nconsole:\n{}",
        String::from_utf8_lossy(&out.stderr),
        tail(&vm.console())
    );
    let ready = vm.wait_for("ready version=", 2);
    assert!(ready.contains("version=0.2.0 slot=B"), "{ready}");
    // The node says which image it took: arm64's, by its digest.
    let console = vm.console();
    assert!(
        console.contains("to 0.2.0 (slot B), signed by")
            && console.contains(&format!("image {arm64_digest}; rebooting")),
        "{}",
        tail(&console)
    );
    let s = status(&vm, &creds, "ops");
    assert_eq!(s["version"], "0.2.0", "{s}");
    vm.power_off(&creds);
}
