//! arm64 (issue 30), cross-built on this x86-64 machine without emulation:
//! what builds so far, the kernel and the runtime (docs/arm64.md).
//!
//! The kernel is metal-arm64's: the default kernel's source and recipe,
//! cross-compiled with the Debian cross compiler from arm64's fragments,
//! audited by the KSPP rule table's arm64 rules with only the documented
//! waivers, and an EFI program for aa64 (PE machine 0xAA64). Debian's arm64
//! systemd-boot (scripts/setup.sh unpacks it) starts it under QEMU's arm64
//! UEFI firmware (AAVMF, TCG) from a virtio disk and from NVMe, with the
//! runtime, cross-built static for aarch64, as its init: the console shows
//! the runtime's first line.

// Test helpers panic on unexpected failures: that is how a test fails.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use contract::Arch;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Where scripts/setup.sh unpacks Debian's arm64 packages.
fn arm64_root() -> PathBuf {
    PathBuf::from(
        std::env::var("IMAGER_ARM64_ROOT").unwrap_or_else(|_| "/var/lib/imager/arm64".into()),
    )
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

/// An initramfs whose init is the runtime `init`: stage 1 (the squashfs
/// marker is there, empty), which says it started and then fails on the
/// empty root filesystem.
fn initramfs(init: &Path, out: &Path) {
    use imager::initramfs::{CONSOLE, CONSOLE_MAJOR, CONSOLE_MINOR, CpioWriter, MOUNT_DIRS};
    let f = std::fs::File::create(out).unwrap();
    let mut w = CpioWriter::new(f, 0);
    w.dir("dev", 0o755).unwrap();
    w.char_device(CONSOLE, 0o600, CONSOLE_MAJOR, CONSOLE_MINOR)
        .unwrap();
    let bin = std::fs::read(init).unwrap();
    w.file("init", 0o755, bin.len() as u64, &mut bin.as_slice())
        .unwrap();
    w.dir("newroot", 0o755).unwrap();
    w.dir("proc", 0o755).unwrap();
    w.file(
        contract::paths::INITRAMFS_ROOTFS,
        0o444,
        0,
        &mut [].as_slice(),
    )
    .unwrap();
    for d in ["run", "sys"] {
        assert!(MOUNT_DIRS.contains(&d));
        w.dir(d, 0o755).unwrap();
    }
    w.finish().unwrap();
}

/// A GPT disk whose EFI system partition holds `files` (host file, path
/// on the ESP), made with sfdisk and mtools.
fn esp_disk(dir: &Path, name: &str, files: &[(&Path, &str)]) -> PathBuf {
    let disk = dir.join(name);
    let f = std::fs::File::create(&disk).unwrap();
    f.set_len(96 << 20).unwrap();
    drop(f);
    let mut sfdisk = tool("sfdisk");
    sfdisk
        .arg("--quiet")
        .arg(&disk)
        .stdin(std::process::Stdio::piped());
    let mut child = sfdisk.spawn().unwrap();
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        stdin
            .write_all(b"label: gpt\nstart=2048, size=190000, type=uefi\n")
            .unwrap();
    }
    assert!(child.wait().unwrap().success(), "sfdisk");
    let at = format!("{}@@1M", disk.display());
    ok(tool("mformat").args(["-i", &at, "-F", "::"]));
    let mut made = std::collections::BTreeSet::new();
    for (from, to) in files {
        let mut parent = String::new();
        for part in to.split('/').collect::<Vec<_>>().split_last().unwrap().1 {
            parent = format!("{parent}/{part}");
            if made.insert(parent.clone()) {
                ok(tool("mmd").args(["-i", &at, &format!("::{parent}")]));
            }
        }
        ok(tool("mcopy")
            .args(["-i", &at])
            .arg(from)
            .arg(format!("::/{to}")));
    }
    disk
}

/// The removable-media boot file of arm64 on the ESP.
fn boot_file() -> String {
    format!("EFI/BOOT/{}", Arch::Arm64.spec().efi_boot_file)
}

/// A disk whose ESP has Debian's arm64 systemd-boot as the removable-media
/// boot file and one boot entry for `kernel` and `initrd` with `options`.
fn systemd_boot_disk(dir: &Path, kernel: &Path, initrd: &Path, options: &str) -> PathBuf {
    let loader = dir.join("loader.conf");
    std::fs::write(&loader, "timeout 0\ndefault arm64.conf\n").unwrap();
    let entry = dir.join("arm64.conf");
    std::fs::write(
        &entry,
        format!("title arm64\nlinux /Image\ninitrd /initrd\noptions {options}\n"),
    )
    .unwrap();
    let boot = arm64_root().join("usr/lib/systemd/boot/efi/systemd-bootaa64.efi");
    imager::boot::check_efi_binary(&boot, Arch::Arm64).unwrap();
    let file = ok(tool("file").arg(&boot));
    assert!(
        file.contains("EFI application") && file.contains("Aarch64"),
        "{file}"
    );
    esp_disk(
        dir,
        "systemd-boot.img",
        &[
            (&boot, &boot_file()),
            (&loader, "loader/loader.conf"),
            (&entry, "loader/entries/arm64.conf"),
            (kernel, "Image"),
            (initrd, "initrd"),
        ],
    )
}

/// The runtime cross-built for arm64, and an initramfs of it in `dir`.
fn runtime_initramfs(dir: &Path) -> PathBuf {
    let runtime = imager::runtime::build(&repo().join("rootfs"), Arch::Arm64).unwrap();
    // An aarch64 executable, static: refused as an amd64 one.
    let e = imager::runtime::check_static(&runtime, Arch::Amd64)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("is an arm64 executable, not an amd64 one"),
        "{e}"
    );
    let file = ok(tool("file").arg(&runtime));
    assert!(
        file.contains("ARM aarch64") && file.contains("statically linked"),
        "{file}"
    );
    let initrd = dir.join("initrd");
    initramfs(&runtime, &initrd);
    initrd
}

/// Boots `disk` on `device` under AAVMF until the runtime's first line;
/// its console. The runtime must speak before QEMU ends, and the kernel's
/// partition scan must show `scanned` (its own driver found the disk).
fn boot_to_runtime(
    dir: &Path,
    disk: &Path,
    device: &str,
    scanned: &str,
    what: &str,
) -> Vec<String> {
    let child = aavmf_qemu(dir, disk, device).spawn().unwrap();
    let started = std::time::Instant::now();
    let (console, exited) = follow_console(
        child,
        Some("machined: stage1: started"),
        Duration::from_secs(600),
    );
    let text = console.join("\n");
    // The runtime said its first line as init (QEMU was stopped then): an
    // init that did not run would have ended the machine first.
    assert!(
        !exited,
        "{what} ({device}): QEMU ended before the runtime spoke:\n{text}"
    );
    say(&format!(
        "arm64 under AAVMF, {what} ({device}): the runtime's first line after {:.1} s",
        started.elapsed().as_secs_f64()
    ));
    assert!(
        console.iter().any(|l| l.contains(scanned)),
        "{what} ({device}): no {scanned:?}:\n{text}"
    );
    assert!(
        console
            .iter()
            .any(|l| l.contains("Booting Linux on physical CPU")),
        "{what} ({device}):\n{text}"
    );
    console
}

/// QEMU's arm64 `virt` machine under AAVMF (TCG), the console on stdout,
/// `disk` attached as `device` (`virtio-blk-pci` or `nvme`).
fn aavmf_qemu(dir: &Path, disk: &Path, device: &str) -> std::process::Command {
    let vars = dir.join(format!("vars-{device}.fd"));
    std::fs::copy("/usr/share/AAVMF/AAVMF_VARS.fd", &vars).unwrap();
    let mut c = std::process::Command::new("qemu-system-aarch64");
    c.args([
        "-machine",
        "virt",
        "-cpu",
        "max,pauth-impdef=on",
        "-m",
        "1024",
    ])
    .args([
        "-nodefaults",
        "-display",
        "none",
        "-no-reboot",
        "-serial",
        "stdio",
    ])
    .args([
        "-drive",
        "if=pflash,format=raw,unit=0,readonly=on,file=/usr/share/AAVMF/AAVMF_CODE.fd",
    ])
    .arg("-drive")
    .arg(format!(
        "if=pflash,format=raw,unit=1,file={}",
        vars.display()
    ))
    .arg("-drive")
    .arg(format!(
        "if=none,id=disk,format=raw,file={}",
        disk.display()
    ))
    .arg("-device")
    .arg(if device == "nvme" {
        "nvme,drive=disk,serial=arm64".to_string()
    } else {
        format!("{device},drive=disk")
    })
    .stdin(std::process::Stdio::null())
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::inherit());
    c
}

#[test]
fn debian_arm64_systemd_boot_starts_the_kernel_and_the_runtime_under_aavmf_from_virtio_and_nvme() {
    let (image, _, _) = arm64_kernel();
    let dir = scratch().join("arm64-boot");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let initrd = runtime_initramfs(&dir);
    let cmdline = profile().cmdline();
    let disk = systemd_boot_disk(&dir, image, &initrd, &cmdline);
    // The kernel finds the disk through its own driver: the partition
    // scan's line of virtio's vda, of NVMe's nvme0n1.
    for (device, scanned) in [("virtio-blk-pci", " vda: vda1"), ("nvme", " nvme0n1: p1")] {
        let console = boot_to_runtime(&dir, &disk, device, scanned, "systemd-boot");
        // systemd-boot gave the kernel the entry's command line.
        assert!(
            console
                .iter()
                .any(|l| l.contains("Kernel command line:") && l.contains(&cmdline)),
            "{device}:\n{}",
            console.join("\n")
        );
    }
}
