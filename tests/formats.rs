//! The disk formats made from the raw disk (issue 12): `qcow2`, `raw.zst`
//! and `raw.xz`, built with `raw` from metal and checked with the tools
//! that read them (qemu-img, zstd, xz, cmp) and with imager's own readers
//! (`inspect`, `verify`, `boot`).

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
fn qcow2_zst_and_xz_are_the_raw_disk_and_are_read_verified_and_booted() {
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

    // boot: the qcow2 through QEMU's qcow2 driver, the zst from a copy.
    for (f, what) in [(&qcow2, "qcow2"), (&zst, "zst")] {
        let log = scratch().join(format!("formats-{what}.console"));
        let report = boot_report(f, &["--console-log", log.to_str().unwrap()])
            .unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        assert_eq!(report["ready"], true, "{report}");
        let console = std::fs::read_to_string(&log).unwrap();
        assert!(
            console.contains("[vda] 4194304 512-byte logical blocks"),
            "{console}"
        );
    }
}
