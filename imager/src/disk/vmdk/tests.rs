use super::*;
use crate::disk::testutil::{run, tool};

/// A sparse raw disk of `size` bytes with `writes` at their offsets.
fn raw(dir: &Path, size: u64, writes: &[(u64, &[u8])]) -> std::path::PathBuf {
    let p = dir.join("disk.raw");
    let f = File::create(&p).unwrap();
    f.set_len(size).unwrap();
    for (at, b) in writes {
        f.write_all_at(b, *at).unwrap();
    }
    p
}

fn descriptor() -> Descriptor<'static> {
    Descriptor {
        id: [0xab; 16],
        file_name: "disk.vmdk",
        adapter: "lsilogic",
    }
}

/// A disk with data in several grains and grain tables, a grain of noise
/// (compresses badly) and one at the very end.
fn sample(dir: &Path) -> std::path::PathBuf {
    let size = 70 << 20; // three grain tables (32 MiB each), the last partial
    let mut noise = vec![0u8; 100_000];
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for b in noise.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    raw(
        dir,
        size,
        &[
            (0, b"start"),
            (5 << 20, &noise),
            (40 << 20, &[7u8; 300_000]),
            (size - 3, b"end"),
        ],
    )
}

/// qemu-img reads our VMDK as a clean stream-optimised image of the same
/// disk; our reader gives the raw disk back, holes as holes; the same disk
/// on 1 or 3 threads gives the same bytes.
#[test]
fn a_stream_optimised_vmdk_is_the_raw_disk_for_qemu_img_and_for_us() {
    let dir = tempfile::tempdir().unwrap();
    let raw = sample(dir.path());
    let vmdk = dir.path().join("disk.vmdk");
    write_vmdk_threads(&raw, &vmdk, &descriptor(), 1).unwrap();

    let info = run(std::process::Command::new(tool("qemu-img"))
        .args(["info", "--output=json", "-f", "vmdk"])
        .arg(&vmdk));
    let info: serde_json::Value = serde_json::from_slice(&info.stdout).unwrap();
    assert_eq!(info["virtual-size"], 70 << 20, "{info}");
    assert_eq!(
        info["format-specific"]["data"]["create-type"],
        "streamOptimized"
    );
    let extent = &info["format-specific"]["data"]["extents"][0];
    assert_eq!(extent["compressed"], true, "{info}");
    assert_eq!(extent["cluster-size"], 65536, "{info}");
    run(std::process::Command::new(tool("qemu-img"))
        .args(["check", "-f", "vmdk"])
        .arg(&vmdk));
    let cmp = run(std::process::Command::new(tool("qemu-img"))
        .args(["compare", "-f", "raw", "-F", "vmdk"])
        .arg(&raw)
        .arg(&vmdk));
    assert!(String::from_utf8_lossy(&cmp.stdout).contains("identical"));

    let back = dir.path().join("back.raw");
    let out = File::create(&back).unwrap();
    let size = unpack(&mut File::open(&vmdk).unwrap(), &out).unwrap();
    assert_eq!(size, 70 << 20);
    assert!(std::fs::read(&back).unwrap() == std::fs::read(&raw).unwrap());
    use std::os::unix::fs::MetadataExt;
    assert!(
        out.metadata().unwrap().blocks() * 512 < 2 << 20,
        "holes were filled"
    );

    let three = dir.path().join("three.vmdk");
    write_vmdk_threads(&raw, &three, &descriptor(), 3).unwrap();
    assert!(std::fs::read(&three).unwrap() == std::fs::read(&vmdk).unwrap());
}

/// What qemu-img writes as a stream-optimised VMDK, our reader reads.
#[test]
fn the_reader_takes_qemu_imgs_stream_optimised_vmdk() {
    let dir = tempfile::tempdir().unwrap();
    let raw = sample(dir.path());
    let theirs = dir.path().join("theirs.vmdk");
    run(std::process::Command::new(tool("qemu-img"))
        .args([
            "convert",
            "-f",
            "raw",
            "-O",
            "vmdk",
            "-o",
            "subformat=streamOptimized",
        ])
        .arg(&raw)
        .arg(&theirs));
    let back = dir.path().join("back.raw");
    let out = File::create(&back).unwrap();
    unpack(&mut File::open(&theirs).unwrap(), &out).unwrap();
    assert!(std::fs::read(&back).unwrap() == std::fs::read(&raw).unwrap());
}

/// Damaged and truncated streams, and VMDKs of other kinds, are refused
/// with what is wrong.
#[test]
fn the_reader_refuses_what_it_cannot_read_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let raw = sample(dir.path());
    let vmdk = dir.path().join("disk.vmdk");
    write_vmdk(&raw, &vmdk, &descriptor()).unwrap();
    let good = std::fs::read(&vmdk).unwrap();
    let sink = File::create(dir.path().join("out.raw")).unwrap();
    let refuse = |bytes: &[u8], want: &str| {
        let e = unpack(&mut &bytes[..], &sink).unwrap_err();
        assert!(format!("{e:#}").contains(want), "{want}: {e:#}");
    };
    refuse(&good[..good.len() / 2], "truncated");
    refuse(&good[..100], "truncated");
    refuse(b"", "truncated");
    let mut b = good.clone();
    b[0] = b'X';
    refuse(&b, "KDMV");
    let mut b = good.clone();
    b[8..12].copy_from_slice(&1u32.to_le_bytes());
    refuse(&b, "not stream-optimised");
    let mut b = good.clone();
    b[12..20].copy_from_slice(&(1u64 << 60).to_le_bytes());
    refuse(&b, "64 TiB");
    let mut b = good.clone();
    b[20..28].copy_from_slice(&100u64.to_le_bytes());
    refuse(&b, "power of two");
    // The first grain's marker: a sector outside the disk, then a length
    // of a whole megabyte, then damaged compressed bytes.
    let first = 512 * 128; // grains start on a grain boundary
    let mut b = good.clone();
    b[first..first + 8].copy_from_slice(&(1u64 << 40).to_le_bytes());
    refuse(&b, "inside the disk");
    let mut b = good.clone();
    b[first + 8..first + 12].copy_from_slice(&(1u32 << 20).to_le_bytes());
    refuse(&b, "twice a grain");
    let mut b = good.clone();
    b[first + 12..first + 20].fill(0xff);
    refuse(&b, "inflating");
    // The descriptor says nothing the reader needs; the rest reads.
    let mut b = good;
    b[512..520].copy_from_slice(b"########");
    unpack(&mut &b[..], &sink).unwrap();
}
