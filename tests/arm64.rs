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
    say(&format!(
        "arm64 under AAVMF from {bus}: ready after {:.1} s",
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
    for (i, (arch, build)) in [("amd64", &b.amd64), ("arm64", &b.arm64)]
        .into_iter()
        .enumerate()
    {
        let own = format!("oci-archive:{}", build.artifact("installer").display());
        let alone: serde_json::Value =
            serde_json::from_str(&ok(tool("skopeo").args(["inspect", &own]))).unwrap();
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
/// each named: the ISO, UKIs, Secure Boot (and the clouds' images, whose
/// profiles need more than this one has).
#[test]
fn an_arm64_profile_asking_for_what_arm64_lacks_is_refused_before_any_work() {
    let profile = write_profile_from("installer-arm64", "arm64-too-much", |t| {
        t.replace("outputs: [raw, installer]", "outputs: [raw, iso, uki]")
            .replace("disk:\n", "secure_boot:\n  enroll: force\n\ndisk:\n")
    });
    let out = scratch().join("arm64-too-much");
    let _ = std::fs::remove_dir_all(&out);
    let o = run(imager()
        .args(["build", "--profile"])
        .arg(&profile)
        .arg("--out")
        .arg(&out));
    let said = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{said}");
    assert!(
        said.contains("arch arm64: iso, uki, secure_boot not built for arm64 yet"),
        "{said}"
    );
    assert!(!out.exists(), "{} was made", out.display());
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
