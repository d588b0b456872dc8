//! The cloud and hypervisor platforms' images (issue 27): `gcp`
//! (`gcp.tar.gz`), `azure` (`azure.vhd`), `vmware` (`vmware.ova`) and `aws`
//! (`aws.vmdk`), built once with `raw` from metal. Each is read back by
//! independent tools (GNU tar, gzip, qemu-img, Python's XML parser), its
//! disk converted back by them and compared byte for byte with `disk.raw`,
//! inspected and verified by imager, and booted to ready under OVMF on the
//! controller and NIC its platform gives (or, where QEMU cannot emulate
//! the platform's own, NVMe). A profile whose disk a platform cannot take
//! is refused before anything is built, naming the platform's rule.
//! That two builds give the same bytes is `tests/reproducible.rs`'s (its
//! every-format build lists the four).

// Test helpers panic on unexpected failures: that is how a test fails.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use serde_json::Value;
use std::path::{Path, PathBuf};

const SIZE: u64 = 2 << 30;

fn build() -> &'static Build {
    static B: Fixture<Build> = Fixture::new("platforms");
    B.get(|| {
        let p = write_profile_from("metal", "platforms", |t| {
            assert!(t.contains("\noutputs: [raw]\n"), "metal's outputs changed");
            t.replace(
                "\noutputs: [raw]\n",
                "\noutputs: [raw, gcp, azure, vmware, aws]\n",
            )
        });
        let key = dev_key();
        build_profile("platforms", &p, &["--key", key.to_str().unwrap()])
    })
}

/// A directory of its own under scratch, emptied.
fn workdir(name: &str) -> PathBuf {
    let d = scratch().join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `cmp` finds `disk` the same bytes as the build's `disk.raw`.
fn same_as_raw(disk: &Path) {
    let raw = build().artifact("raw");
    assert_eq!(std::fs::metadata(disk).unwrap().len(), SIZE);
    ok(tool("cmp").arg(&raw).arg(disk));
}

/// `imager boot FILE` under OVMF on `controller` with `nic`: it is
/// unpacked into a sparse temporary copy (said on stderr, removed after)
/// and reaches ready on slot A of version 0.1.0.
fn boots(file: &Path, controller: &str, nic: &str) {
    let name = file.file_name().unwrap().to_str().unwrap().to_string();
    let tmp = workdir(&format!("platforms-tmp-{name}"));
    let log = scratch().join(format!("platforms-{name}.console"));
    let out = run(imager()
        .env("TMPDIR", &tmp)
        .args([
            "boot",
            "--json",
            "--quiet",
            "--timeout",
            "600",
            "--firmware",
            "uefi",
        ])
        .args(["--bus", controller, "--nic", nic])
        .arg("--console-log")
        .arg(&log)
        .arg(file));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{name}: {err}");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["ready"], true, "{report}");
    assert_eq!(report["slot"], "A", "{report}");
    assert!(
        err.contains(&format!(
            "boot: {} unpacked into the sparse temporary copy",
            file.display()
        )),
        "{err}"
    );
    let console = std::fs::read_to_string(&log).unwrap();
    assert!(
        console.contains("machined: ready version=0.1.0 slot=A"),
        "{console}"
    );
    let left: Vec<_> = std::fs::read_dir(&tmp).unwrap().collect();
    assert!(left.is_empty(), "{name}: left in TMPDIR: {left:?}");
}

/// Compute Engine's archive: gzip finds it whole; GNU tar lists one
/// member, `disk.raw`, a regular file of the disk's size, owned by 0/0,
/// under a GNU (`oldgnu`) header and ending on a whole record; what tar
/// extracts is `disk.raw`; it boots on virtio-scsi (Compute Engine's SCSI
/// disks) with a virtio NIC.
#[test]
fn gcp_is_disk_raw_alone_in_a_gzipped_gnu_tar_and_boots_on_virtio_scsi() {
    let gz = build().artifact("gcp");
    assert_eq!(gz.file_name().unwrap(), "gcp.tar.gz");
    ok(tool("gzip").arg("-t").arg(&gz));
    let list = ok(tool("tar").env("TZ", "UTC").arg("-tvzf").arg(&gz));
    let lines: Vec<&str> = list.lines().collect();
    assert_eq!(lines.len(), 1, "{list}");
    assert!(lines[0].starts_with("-rw-r--r-- 0/0"), "{list}");
    assert!(lines[0].ends_with(" disk.raw"), "{list}");
    assert!(lines[0].contains(&format!(" {SIZE} ")), "{list}");
    // The header's magic and the archive's length, from gzip's output.
    let head = ok(tool("sh")
        .arg("-c")
        .arg(
            "gzip -dc \"$1\" | head -c 512 | tail -c +258 | head -c 8 | od -An -c; \
         gzip -dc \"$1\" | wc -c",
        )
        .arg("sh")
        .arg(&gz));
    let mut h = head.lines();
    let magic: Vec<&str> = h.next().unwrap().split_whitespace().collect();
    assert_eq!(&magic[..5], ["u", "s", "t", "a", "r"], "{head}");
    assert_eq!(
        magic.len(),
        6,
        "GNU magic is ustar, two spaces, NUL: {head}"
    );
    assert_eq!(magic[5], "\\0", "{head}");
    let len: u64 = h.next().unwrap().trim().parse().unwrap();
    assert_eq!(len % 10240, 0, "not a whole GNU tar record: {len}");

    let dir = workdir("platforms-gcp");
    ok(tool("tar").arg("-xzf").arg(&gz).arg("-C").arg(&dir));
    same_as_raw(&dir.join("disk.raw"));
    std::fs::remove_dir_all(&dir).unwrap();
    boots(&gz, "virtio-scsi", "virtio");
}

/// Azure's fixed VHD: the footer's cookie, fixed type, current size and
/// checksum read by the test itself; qemu-img reads it as a VHD of the
/// disk's size and converts it back to `disk.raw`; it boots on NVMe (Azure's
/// newer machines; QEMU has no Hyper-V storage).
#[test]
fn azure_is_a_fixed_vhd_of_whole_mib_and_boots_on_nvme() {
    let vhd = build().artifact("azure");
    assert_eq!(vhd.file_name().unwrap(), "azure.vhd");
    assert_eq!(std::fs::metadata(&vhd).unwrap().len(), SIZE + 512);
    let mut f = std::fs::File::open(&vhd).unwrap();
    let footer = read_at(&mut f, SIZE, 512);
    assert_eq!(&footer[..8], b"conectix");
    assert_eq!(
        u32::from_be_bytes(footer[60..64].try_into().unwrap()),
        2,
        "not fixed"
    );
    let current = u64::from_be_bytes(footer[48..56].try_into().unwrap());
    assert_eq!(current, SIZE);
    assert_eq!(current % (1 << 20), 0, "not a whole MiB");
    let sum: u32 = footer
        .iter()
        .enumerate()
        .filter(|(i, _)| !(64..68).contains(i))
        .map(|(_, b)| *b as u32)
        .sum();
    assert_eq!(
        u32::from_be_bytes(footer[64..68].try_into().unwrap()),
        !sum,
        "footer checksum"
    );
    let opts = format!(
        "driver=vpc,force_size_calc=current_size,file.filename={}",
        vhd.display()
    );
    let info: Value = serde_json::from_str(&ok(tool("qemu-img").args([
        "info",
        "--output=json",
        "--image-opts",
        &opts,
    ])))
    .unwrap();
    assert_eq!(info["virtual-size"], SIZE, "{info}");
    assert_eq!(info["format"], "vpc", "{info}");
    let dir = workdir("platforms-azure");
    let back = dir.join("disk.raw");
    ok(tool("qemu-img")
        .args(["convert", "-O", "raw", "--image-opts", &opts])
        .arg(&back));
    same_as_raw(&back);
    std::fs::remove_dir_all(&dir).unwrap();
    // A fixed VHD is a raw disk with a footer: booted through QEMU's vpc
    // driver, not unpacked.
    let log = scratch().join("platforms-azure.console");
    let report = boot_report(
        &vhd,
        &["--bus", "nvme", "--console-log", log.to_str().unwrap()],
    )
    .unwrap();
    assert_eq!(report["ready"], true, "{report}");
    assert_eq!(report["slot"], "A", "{report}");
}

/// VMware's OVA: GNU tar lists the descriptor first and the disk second;
/// Python's XML parser reads the descriptor: the VMDK's href and size, the
/// disk's capacity in bytes and stream-optimised format, EFI firmware,
/// hardware version vmx-14, a SATA controller and a VMXNET3 NIC; qemu-img
/// checks the VMDK and converts it back to `disk.raw`; the OVA boots on
/// SATA with VMXNET3, as its descriptor says.
#[test]
fn vmware_is_an_ova_of_descriptor_then_stream_optimised_vmdk_and_boots_on_sata_with_vmxnet3() {
    let ova = build().artifact("vmware");
    assert_eq!(ova.file_name().unwrap(), "vmware.ova");
    let list = ok(tool("tar").arg("-tvf").arg(&ova));
    let names: Vec<&str> = list
        .lines()
        .map(|l| l.rsplit(' ').next().unwrap())
        .collect();
    assert_eq!(names, ["vmware.ovf", "disk.vmdk"], "{list}");
    let dir = workdir("platforms-vmware");
    ok(tool("tar").arg("-xf").arg(&ova).arg("-C").arg(&dir));
    let vmdk = dir.join("disk.vmdk");
    let vmdk_size = std::fs::metadata(&vmdk).unwrap().len();
    let parsed = ok(tool("python3")
        .arg(repo().join("tests/common/read-ovf.py"))
        .arg(dir.join("vmware.ovf")));
    assert_eq!(
        parsed.trim(),
        format!(
            "disk.vmdk|{vmdk_size}|{SIZE}|byte|streamOptimized|ovf:/disk/vmdisk1|\
             vmware.sata.ahci|VmxNet3|vmx-14|efi|metal"
        )
    );
    check_vmdk(&vmdk, &dir);
    std::fs::remove_dir_all(&dir).unwrap();
    boots(&ova, "sata", "vmxnet3");
}

/// qemu-img checks `vmdk` (no error), reads it as a stream-optimised VMDK
/// of the disk's size with compressed 64 KiB grains, and converts it back
/// to `disk.raw` (in `dir`).
fn check_vmdk(vmdk: &Path, dir: &Path) {
    ok(tool("qemu-img").args(["check", "-f", "vmdk"]).arg(vmdk));
    let info: Value = serde_json::from_str(&ok(tool("qemu-img")
        .args(["info", "--output=json", "-f", "vmdk"])
        .arg(vmdk)))
    .unwrap();
    assert_eq!(info["virtual-size"], SIZE, "{info}");
    let data = &info["format-specific"]["data"];
    assert_eq!(data["create-type"], "streamOptimized", "{info}");
    assert_eq!(data["extents"][0]["compressed"], true, "{info}");
    assert_eq!(data["extents"][0]["cluster-size"], 65536, "{info}");
    let back = dir.join("disk.raw");
    ok(tool("qemu-img")
        .args(["convert", "-f", "vmdk", "-O", "raw"])
        .arg(vmdk)
        .arg(&back));
    same_as_raw(&back);
    std::fs::remove_file(&back).unwrap();
}

/// AWS's stream-optimised VMDK: qemu-img checks it and converts it back to
/// `disk.raw`; it boots on NVMe (EC2's Nitro disks; QEMU has no ENA, so
/// the NIC is e1000).
#[test]
fn aws_is_a_stream_optimised_vmdk_and_boots_on_nvme() {
    let vmdk = build().artifact("aws");
    assert_eq!(vmdk.file_name().unwrap(), "aws.vmdk");
    let dir = workdir("platforms-aws");
    check_vmdk(&vmdk, &dir);
    std::fs::remove_dir_all(&dir).unwrap();
    boots(&vmdk, "nvme", "e1000");
}

/// The manifest lists the four; `imager inspect` reads each as the disk;
/// `imager verify` passes, and fails naming the OVA when one of its bytes
/// changes.
#[test]
fn every_platform_image_is_listed_inspected_and_verified() {
    let b = build();
    let manifest = std::fs::read_to_string(b.dir.join("manifest.json")).unwrap();
    for name in ["gcp.tar.gz", "azure.vhd", "vmware.ova", "aws.vmdk"] {
        assert!(manifest.contains(&format!("\"{name}\"")), "{manifest}");
    }
    let key = repo().join("out/keys/dev.pub");
    for kind in ["gcp", "azure", "vmware", "aws"] {
        let f = b.artifact(kind);
        let r: Value = serde_json::from_str(&ok(imager()
            .args(["inspect", "--json"])
            .arg(&f)
            .arg("--key")
            .arg(&key)))
        .unwrap();
        assert_eq!(r["size"], SIZE, "{kind}: {r}");
        assert_eq!(r["partitions"].as_array().unwrap().len(), 6, "{kind}: {r}");
        assert_eq!(
            r["manifest"]["lists_image"], true,
            "{kind}: {}",
            r["manifest"]
        );
    }
    let verify = || {
        let out = run(imager().arg("verify").arg(&b.dir).arg("--key").arg(&key));
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let (passed, out) = verify();
    assert!(passed, "{out}");
    let ova = b.artifact("vmware");
    let copy = scratch().join("platforms-vmware.ova.orig");
    ok(tool("cp").arg("--sparse=always").arg(&ova).arg(&copy));
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .read(true)
            .open(&ova)
            .unwrap();
        let at = f.metadata().unwrap().len() / 2;
        let mut x = [0u8];
        f.read_exact_at(&mut x, at).unwrap();
        f.write_all_at(&[x[0] ^ 1], at).unwrap();
    }
    let (passed, out) = verify();
    std::fs::rename(&copy, &ova).unwrap();
    assert!(!passed, "{out}");
    assert!(
        out.lines().any(|l| l.starts_with("BAD ")
            && l.contains("vmware.ova")
            && l.contains("sha256 differs")),
        "{out}"
    );
}

/// A disk a platform cannot take, or a command line without the console
/// the platform shows, is refused by `imager build` before anything is
/// built, naming the platform's rule and what to do.
#[test]
fn a_disk_a_platform_cannot_take_is_refused_naming_its_rule() {
    let cases = [
        (
            "gcp",
            "  size: 2GiB\n",
            "  size: 2500MiB\n",
            "disk.size: the output gcp: Compute Engine imports a disk.raw of a whole number of \
             GiB (2621440000 bytes is not one); make disk.size 3GiB or drop gcp from outputs",
        ),
        (
            "azure",
            "  size: 2GiB\n",
            "  size: 2147484160\n",
            "disk.size: the output azure: Azure takes a fixed VHD whose virtual size is a whole \
             number of MiB (2147484160 bytes is not one); make disk.size 2049MiB or drop azure \
             from outputs",
        ),
        (
            "aws",
            "    - console=ttyS0,115200\n",
            "",
            "kernel.cmdline: the output aws: EC2's serial console and `aws ec2 \
             get-console-output` show the first serial port; add console=ttyS0",
        ),
        (
            "vmware",
            "  sector_size: 512\n",
            "  sector_size: 4096\n",
            "disk.sector_size: the output vmware is a disk of 512-byte sectors",
        ),
    ];
    for (output, from, to, want) in cases {
        let name = format!("platforms-bad-{output}");
        let p = write_profile_from("metal", &name, |t| {
            assert!(t.contains(from), "metal changed: {from}");
            t.replace(from, to).replace(
                "\noutputs: [raw]\n",
                &format!("\noutputs: [raw, {output}]\n"),
            )
        });
        let dir = scratch().join(&name);
        let _ = std::fs::remove_dir_all(&dir);
        let out = run(imager()
            .args(["build", "--profile"])
            .arg(&p)
            .arg("--out")
            .arg(&dir));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{output}: built");
        assert!(err.contains(want), "{output}: {err}");
        assert!(!dir.exists(), "{output}: {} was made", dir.display());
    }
}
