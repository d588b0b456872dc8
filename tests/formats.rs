//! The disk formats made from the raw disk (issue 12): `qcow2`, `raw.zst`
//! and `raw.xz`, built with `raw` from metal and checked with the tools
//! that read them (qemu-img, zstd, xz, cmp) and with imager's own readers
//! (`inspect`, `verify`, `boot`); and the fixed VHD changed in place by
//! `upgrade` and `rollback` and booted, and laid out anew by `install`.

// Test helpers panic on unexpected failures: that is how a test fails.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use serde_json::Value;
use std::path::{Path, PathBuf};

fn dev_pub() -> PathBuf {
    repo().join("out/keys/dev.pub")
}

fn flip_byte(path: &Path, at: u64) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut b = [0u8];
    f.read_exact_at(&mut b, at).unwrap();
    f.write_all_at(&[b[0] ^ 0x01], at).unwrap();
}

/// `imager verify` of the build: whether it passed, and its stdout.
fn verify(dir: &Path) -> (bool, String) {
    let out = run(imager().arg("verify").arg(dir).arg("--key").arg(dev_pub()));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// `imager inspect --json` of `image` and the peak memory (KiB) it took.
fn inspect(image: &Path) -> (Value, u64) {
    let rss = scratch().join("formats.rss");
    let mut cmd = tool("time");
    cmd.arg("-f")
        .arg("%M")
        .arg("-o")
        .arg(&rss)
        .arg(env!("CARGO_BIN_EXE_imager"))
        .current_dir(repo())
        .env("SOURCE_DATE_EPOCH", EPOCH)
        .args(["inspect", "--json"])
        .arg(image)
        .arg("--key")
        .arg(dev_pub());
    let r: Value = serde_json::from_str(&ok(&mut cmd)).unwrap();
    let kib = std::fs::read_to_string(&rss)
        .unwrap()
        .lines()
        .last()
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    (r, kib)
}

#[test]
fn qcow2_zst_and_xz_are_the_raw_disk_are_read_verified_and_booted_and_zst_xz_refuse_write() {
    let p = write_profile("metal", |t| {
        assert!(t.contains("\noutputs: [raw]\n"), "metal's outputs changed");
        t.replace(
            "\noutputs: [raw]\n",
            "\noutputs: [raw, qcow2, raw.zst, raw.xz]\n",
        )
    });
    let key = dev_key();
    let b = build_profile("formats", &p, &["--key", key.to_str().unwrap()]);
    let raw = b.artifact("raw");
    let qcow2 = b.artifact("qcow2");
    let zst = b.artifact("raw-zst");
    let xz = b.artifact("raw-xz");
    for (f, name) in [
        (&qcow2, "disk.qcow2"),
        (&zst, "disk.raw.zst"),
        (&xz, "disk.raw.xz"),
    ] {
        assert_eq!(f.file_name().unwrap(), name);
    }
    let manifest = std::fs::read_to_string(b.dir.join("manifest.json")).unwrap();
    for name in ["disk.qcow2", "disk.raw.zst", "disk.raw.xz"] {
        assert!(manifest.contains(&format!("\"{name}\"")), "{manifest}");
    }

    // qcow2: clean (no errors, no leaks) and the same disk as the raw one.
    let check: Value = serde_json::from_str(&ok(tool("qemu-img")
        .args(["check", "--output=json", "-f", "qcow2"])
        .arg(&qcow2)))
    .unwrap();
    assert_eq!(check["check-errors"], 0, "{check}");
    assert!(check.get("corruptions").is_none(), "{check}");
    assert!(check.get("leaks").is_none(), "{check}");
    let info: Value = serde_json::from_str(&ok(tool("qemu-img")
        .args(["info", "--output=json", "-f", "qcow2"])
        .arg(&qcow2)))
    .unwrap();
    assert_eq!(info["virtual-size"], 2u64 << 30, "{info}");
    assert_eq!(info["cluster-size"], 65536, "{info}");
    assert!(
        ok(tool("qemu-img")
            .args(["compare", "-f", "raw", "-F", "qcow2"])
            .arg(&raw)
            .arg(&qcow2))
        .contains("Images are identical"),
    );
    // The holes are not stored: the qcow2 is the size of the disk's data.
    let qlen = std::fs::metadata(&qcow2).unwrap().len();
    assert!(qlen < 256 << 20, "{qlen} bytes");

    // raw.zst and raw.xz: intact, and unpack to the raw disk's bytes.
    ok(tool("zstd").arg("-q").arg("-t").arg(&zst));
    ok(tool("xz").arg("-t").arg(&xz));
    let unpacked = scratch().join("formats-unpacked.raw");
    for (packer, file) in [("zstd", &zst), ("xz", &xz)] {
        let out = std::fs::File::create(&unpacked).unwrap();
        let status = tool(packer)
            .args(["-d", "-c"])
            .arg(file)
            .stdout(out)
            .status()
            .unwrap();
        assert!(status.success(), "{packer} -d");
        ok(tool("cmp").arg(&raw).arg(&unpacked));
    }
    std::fs::remove_file(&unpacked).unwrap();

    // inspect reads each as the disk, in memory that does not hold it.
    for f in [&raw, &qcow2, &zst, &xz] {
        let (r, kib) = inspect(f);
        assert_eq!(r["size"], 2u64 << 30, "{}: {r}", f.display());
        assert_eq!(r["partition_table"]["copy"], "primary", "{r}");
        assert_eq!(r["partitions"].as_array().unwrap().len(), 6, "{r}");
        assert!(r["meta"]["valid_copy"].is_u64(), "{}", r["meta"]);
        assert_eq!(r["manifest"]["lists_image"], true, "{}", r["manifest"]);
        assert!(kib < 200 << 10, "{}: inspect took {kib} KiB", f.display());
    }

    // verify passes, and names each file when one of its bytes changes.
    let (passed, out) = verify(&b.dir);
    assert!(passed, "{out}");
    for f in [&qcow2, &zst, &xz] {
        let at = std::fs::metadata(f).unwrap().len() / 2;
        flip_byte(f, at);
        let (passed, out) = verify(&b.dir);
        assert!(!passed, "{}: {out}", f.display());
        let name = f.file_name().unwrap().to_str().unwrap();
        assert!(
            out.lines()
                .any(|l| l.starts_with("BAD ") && l.contains(name) && l.contains("sha256 differs")),
            "{name}: {out}"
        );
        flip_byte(f, at);
    }
    let (passed, out) = verify(&b.dir);
    assert!(passed, "{out}");

    // boot --write of a compressed disk: refused before QEMU starts (it
    // would boot a temporary copy and lose what the guest writes), saying
    // how to unpack it; the file is left as it was.
    for f in [&zst, &xz] {
        let out = run(imager()
            .args(["boot", "--write", "--json", "--quiet", "--timeout", "600"])
            .arg(f));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{}: {err}", f.display());
        assert!(
            out.stdout.is_empty(),
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );
        assert!(
            err.contains(&format!(
                "--write: {} is compressed or packed and boots from a temporary copy",
                f.display()
            )) && err.contains(
                "unpack it (zstd -d, xz -d, tar -x, qemu-img convert -O raw) and boot the raw disk"
            ),
            "{}: {err}",
            f.display()
        );
        assert!(!err.contains("unpacked into"), "{err}");
    }
    let (passed, out) = verify(&b.dir);
    assert!(passed, "{out}");

    // boot: the qcow2 through QEMU's qcow2 driver, the zst and the xz each
    // from a sparse temporary copy in TMPDIR, said on stderr and removed
    // when the boot ends.
    let tmp = scratch().join("formats-tmp");
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).unwrap();
    for (f, what) in [(&qcow2, "qcow2"), (&zst, "zst"), (&xz, "xz")] {
        let log = scratch().join(format!("formats-{what}.console"));
        let out = run(imager()
            .env("TMPDIR", &tmp)
            .args(["boot", "--json", "--quiet", "--timeout", "600"])
            .arg("--console-log")
            .arg(&log)
            .arg(f));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{}: {err}", f.display());
        let report: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(report["ready"], true, "{report}");
        let console = std::fs::read_to_string(&log).unwrap();
        assert!(
            console.contains("[vda] 4194304 512-byte logical blocks"),
            "{console}"
        );
        let said = format!(
            "boot: {} unpacked into the sparse temporary copy {}/imager-unpacked-",
            f.display(),
            tmp.display()
        );
        assert_eq!(err.contains(&said), what != "qcow2", "{what}: {err}");
        let left: Vec<_> = std::fs::read_dir(&tmp).unwrap().collect();
        assert!(left.is_empty(), "{what}: left in TMPDIR: {left:?}");
    }
    std::fs::remove_dir(&tmp).unwrap();
}

/// The last `n` bytes of `path`.
fn tail_bytes(path: &Path, n: u64) -> Vec<u8> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open(path).unwrap();
    let len = f.metadata().unwrap().len();
    let mut b = vec![0u8; n as usize];
    f.read_exact_at(&mut b, len - n).unwrap();
    b
}

/// `imager boot DISK --write` (QEMU's vpc driver for a VHD): the ready
/// line and the console.
fn boot_write(disk: &Path, name: &str) -> (String, String) {
    let log = scratch().join(format!("{name}.console"));
    let report = boot_report(disk, &["--write", "--console-log", log.to_str().unwrap()])
        .unwrap_or_else(|e| panic!("{}: {e}", disk.display()));
    assert_eq!(report["ready"], true, "{report}");
    let console = std::fs::read_to_string(&log).unwrap();
    let ready = console
        .lines()
        .find(|l| l.contains("machined: ready version="))
        .unwrap_or_else(|| panic!("no ready line:\n{console}"))
        .to_string();
    (ready, console)
}

/// `sfdisk --verify` of `disk`: util-linux reads both partition tables and
/// says what is wrong with either (it exits 0 even then, so the output is
/// what is checked).
fn sfdisk_verify(disk: &Path) {
    let out = ok(tool("sfdisk").arg("--verify").arg(disk));
    assert!(out.contains("No errors detected"), "{out}");
    assert!(!out.to_lowercase().contains("warning"), "{out}");
}

/// The fixed VHD changed in place (README: install, upgrade and rollback
/// take raw disks "and a fixed VHD"): `imager upgrade` puts the build's
/// payload into slot B of the disk before the footer and the VHD, booted
/// through QEMU's vpc driver, runs slot B and blesses it; `imager rollback`
/// makes A the default again and the VHD boots slot A. The footer stays the
/// build's byte for byte, and the disk before it, read by qemu-img as a VHD
/// and converted, has both GPTs intact (sfdisk). `imager install` onto a
/// VHD lays out the whole file, footer included: the result is a raw disk
/// (docs/outputs.md).
#[test]
fn a_fixed_vhd_is_upgraded_and_rolled_back_in_place_booting_each_slot_and_install_makes_it_raw() {
    let p = write_profile("formats-vhd", |t| {
        assert!(t.contains("\noutputs: [raw]\n"), "metal's outputs changed");
        t.replace("\noutputs: [raw]\n", "\noutputs: [vhd]\n")
    });
    let key = dev_key();
    let b = build_profile("formats-vhd", &p, &["--key", key.to_str().unwrap()]);
    let vhd = b.artifact("vhd");
    let footer = tail_bytes(&vhd, 512);
    assert_eq!(&footer[..8], b"conectix", "not a VHD footer");
    let len = std::fs::metadata(&vhd).unwrap().len();
    assert_eq!(len, (2u64 << 30) + 512);
    let disk = scratch().join("formats-vhd-disk.vhd");
    let _ = std::fs::remove_file(&disk);
    ok(std::process::Command::new("cp")
        .arg("--sparse=always")
        .arg(&vhd)
        .arg(&disk));
    let inspect = |d: &Path| -> Value {
        serde_json::from_str(&ok(imager()
            .args(["inspect", "--json"])
            .arg(d)
            .arg("--key")
            .arg(dev_pub())))
        .unwrap()
    };

    // Upgrade: slot B, tried next; the footer untouched.
    ok(imager()
        .args(["upgrade", "--json", "--installer"])
        .arg(&b.dir)
        .arg("--disk")
        .arg(&disk));
    let r = inspect(&disk);
    assert_eq!(r["size"], 2u64 << 30, "{r}");
    assert_eq!(r["slots"]["boots_next"], "B", "{}", r["slots"]);
    assert_eq!(tail_bytes(&disk, 512), footer, "upgrade changed the footer");
    let (ready, console) = boot_write(&disk, "formats-vhd-upgraded");
    assert!(ready.contains("version=0.1.0 slot=B"), "{ready}");
    assert!(console.contains("machined: blessed slot B"), "{console}");
    assert!(
        console.contains("[vda] 4194304 512-byte logical blocks"),
        "{console}"
    );

    // Rollback: A is the default again and boots.
    ok(imager().args(["rollback", "--json", "--disk"]).arg(&disk));
    let r = inspect(&disk);
    assert_eq!(r["slots"]["boots_next"], "A", "{}", r["slots"]);
    let (ready, _) = boot_write(&disk, "formats-vhd-rolled-back");
    assert!(ready.contains("version=0.1.0 slot=A"), "{ready}");

    // The file afterwards: its size and footer the build's; the disk before
    // the footer, as QEMU reads the VHD, has both tables intact.
    assert_eq!(std::fs::metadata(&disk).unwrap().len(), len);
    assert_eq!(tail_bytes(&disk, 512), footer, "a boot changed the footer");
    let raw = scratch().join("formats-vhd-disk.raw");
    let _ = std::fs::remove_file(&raw);
    ok(tool("qemu-img")
        .args(["convert", "-O", "raw", "--image-opts"])
        .arg(format!(
            "driver=vpc,force_size_calc=current_size,file.filename={}",
            disk.display()
        ))
        .arg(&raw));
    assert_eq!(std::fs::metadata(&raw).unwrap().len(), 2u64 << 30);
    sfdisk_verify(&raw);
    std::fs::remove_file(&raw).unwrap();
    std::fs::remove_file(&disk).unwrap();

    // Install onto a VHD: the whole file is the disk, the footer gone.
    let installed = scratch().join("formats-vhd-installed.vhd");
    let _ = std::fs::remove_file(&installed);
    ok(std::process::Command::new("cp")
        .arg("--sparse=always")
        .arg(&vhd)
        .arg(&installed));
    ok(imager()
        .args(["install", "--wipe", "--json", "--key"])
        .arg(dev_pub())
        .arg("--installer")
        .arg(&b.dir)
        .arg("--disk")
        .arg(&installed));
    assert_eq!(std::fs::metadata(&installed).unwrap().len(), len);
    let last = tail_bytes(&installed, 512);
    assert_eq!(
        &last[..8],
        b"EFI PART",
        "the last sector is not the backup GPT"
    );
    let r = inspect(&installed);
    assert_eq!(r["size"], len, "{r}");
    assert_eq!(r["slots"]["boots_next"], "A", "{}", r["slots"]);
    sfdisk_verify(&installed);
    std::fs::remove_file(&installed).unwrap();
}
