use super::*;
use std::io::Cursor;
use std::os::unix::fs::FileExt;

/// A sparse raw disk of `size` bytes with `writes` at their offsets.
fn raw(dir: &Path, name: &str, size: u64, writes: &[(u64, &[u8])]) -> std::path::PathBuf {
    let p = dir.join(name);
    let f = File::create(&p).unwrap();
    f.set_len(size).unwrap();
    for (at, b) in writes {
        f.write_all_at(b, *at).unwrap();
    }
    p
}

/// qemu-img (qemu-utils, installed by scripts/setup.sh) finds the image
/// `q` clean (no error, no leak) and the same disk as `raw`.
fn qemu_img_agrees(raw: &Path, q: &Path) {
    let run = |args: &[&str]| {
        let out = std::process::Command::new(crate::disk::testutil::tool("qemu-img"))
            .args(args)
            .arg(raw)
            .arg(q)
            .output()
            .expect("qemu-img (scripts/setup.sh installs qemu-utils)");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "qemu-img {args:?}: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        text
    };
    // `check` takes one file: the raw disk is given as its "-f raw" twin.
    let out = std::process::Command::new(crate::disk::testutil::tool("qemu-img"))
        .args(["check", "-f", "qcow2"])
        .arg(q)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "qemu-img check: {text}");
    assert!(text.contains("No errors were found"), "{text}");
    assert!(!text.contains("leak"), "{text}");
    assert!(run(&["compare", "-f", "raw", "-F", "qcow2"]).contains("identical"));
}

/// Reads the whole virtual disk of `q` in odd-sized pieces.
fn read_all<R: Read + Seek>(q: &mut Qcow2<R>) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = vec![0u8; 100_003];
    q.seek(SeekFrom::Start(0)).unwrap();
    loop {
        let n = q.read(&mut buf).unwrap();
        if n == 0 {
            return out;
        }
        out.extend_from_slice(&buf[..n]);
    }
}

/// A disk whose size is not a multiple of the cluster, with data at its
/// first and last byte, in the middle, and a written cluster of zeros:
/// read back as it was, the zero cluster left out, the same bytes twice.
#[test]
fn a_qcow2_reads_back_as_the_raw_disk() {
    let dir = tempfile::tempdir().unwrap();
    // Not a whole number of clusters (but of sectors, as every disk).
    let size = (5 << 20) + 12_800;
    let zeros = vec![0u8; CLUSTER as usize];
    let r = raw(
        dir.path(),
        "disk.raw",
        size,
        &[
            (0, b"first"),
            (3 * CLUSTER - 2, b"across"),
            (40 * CLUSTER, &zeros),
            (size - 3, b"end"),
        ],
    );
    let q = dir.path().join("disk.qcow2");
    write_qcow2(&r, &q).unwrap();
    assert!(is_qcow2(&q).unwrap());
    assert!(!is_qcow2(&r).unwrap());
    let mut img = Qcow2::open(&q).unwrap();
    assert_eq!(img.size(), size);
    assert_eq!(img.header.version, 3);
    assert_eq!(read_all(&mut img), std::fs::read(&r).unwrap());
    qemu_img_agrees(&r, &q);
    // Header, refcount table and block, L1, one L2, four data clusters
    // (0, 2, 3, the last): the zero cluster is not stored.
    assert_eq!(std::fs::metadata(&q).unwrap().len(), 9 * CLUSTER);
    // Reads at any offset, across clusters.
    let mut b = [0u8; 6];
    img.seek(SeekFrom::Start(3 * CLUSTER - 2)).unwrap();
    img.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"across");
    img.seek(SeekFrom::End(-3)).unwrap();
    let mut e = Vec::new();
    img.read_to_end(&mut e).unwrap();
    assert_eq!(e, b"end");
    // A size that is not whole sectors is refused, nothing written.
    let odd = raw(dir.path(), "odd.raw", 12_345, &[(0, b"x")]);
    let e = write_qcow2(&odd, &dir.path().join("odd.qcow2")).unwrap_err();
    assert!(format!("{e:#}").contains("whole 512-byte sectors"), "{e:#}");
    assert!(!dir.path().join("odd.qcow2").exists());
    // Deterministic.
    let q2 = dir.path().join("again.qcow2");
    write_qcow2(&r, &q2).unwrap();
    assert!(std::fs::read(&q).unwrap() == std::fs::read(&q2).unwrap());
    // The GPT reader takes it as a device (here: no table, said so).
    let e = crate::disk::read_table_from(&mut img).unwrap_err();
    assert!(format!("{e:#}").contains("no valid GPT"), "{e:#}");
}

/// A disk over four L2 tables (512 MiB each), data in the first, third
/// and fourth only: three L2 tables, and reads under the absent one are
/// zeros.
#[test]
fn a_large_sparse_disk_has_l2_tables_only_where_data_is() {
    let dir = tempfile::tempdir().unwrap();
    let size = (1 << 30) + (700 << 20) + 512;
    let r = raw(
        dir.path(),
        "disk.raw",
        size,
        &[(4096, b"one"), (1 << 30, b"three"), (size - 1, b"!")],
    );
    let q = dir.path().join("disk.qcow2");
    write_qcow2(&r, &q).unwrap();
    let mut img = Qcow2::open(&q).unwrap();
    assert_eq!(img.header.l1_entries, 4);
    // Header, refcount table and block, L1, 3 L2 tables, 3 data clusters.
    assert_eq!(std::fs::metadata(&q).unwrap().len(), 10 * CLUSTER);
    qemu_img_agrees(&r, &q);
    let mut buf = vec![0u8; 1 << 20];
    for at in [
        0u64,
        600 << 20,
        (1 << 30) - (1 << 20),
        1 << 30,
        size - (1 << 20),
    ] {
        img.seek(SeekFrom::Start(at)).unwrap();
        img.read_exact(&mut buf).unwrap();
        let want = {
            let f = File::open(&r).unwrap();
            let mut w = vec![0u8; 1 << 20];
            f.read_exact_at(&mut w, at).unwrap();
            w
        };
        assert!(buf == want, "at {at}");
    }
}

/// A valid small image (made by the writer) to damage.
fn small_image() -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let r = raw(dir.path(), "disk.raw", 1 << 20, &[(0, b"data")]);
    let q = dir.path().join("disk.qcow2");
    write_qcow2(&r, &q).unwrap();
    std::fs::read(q).unwrap()
}

/// The error of opening `bytes` and reading its whole disk.
fn refused(bytes: Vec<u8>) -> String {
    match Qcow2::new(Cursor::new(bytes)) {
        Err(e) => format!("{e:#}"),
        Ok(mut q) => {
            let mut sink = Vec::new();
            format!("{:#}", q.read_to_end(&mut sink).unwrap_err())
        }
    }
}

#[test]
fn hostile_images_are_refused_with_what_is_wrong() {
    let good = small_image();
    let patched = |at: usize, v: &[u8]| {
        let mut b = good.clone();
        b[at..at + v.len()].copy_from_slice(v);
        b
    };
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (good[..50].to_vec(), "shorter than a header"),
        (patched(0, b"QFI\0"), "no QFI"),
        (patched(4, &4u32.to_be_bytes()), "version 4"),
        (patched(8, &512u64.to_be_bytes()), "backing file"),
        (patched(20, &30u32.to_be_bytes()), "cluster_bits 30"),
        (patched(24, &(1u64 << 60).to_be_bytes()), "64 TiB"),
        (patched(32, &1u32.to_be_bytes()), "encrypted"),
        (patched(36, &0u32.to_be_bytes()), "does not cover"),
        (patched(36, &u32::MAX.to_be_bytes()), "more than 32 MiB"),
        (patched(40, &(1u64 << 40).to_be_bytes()), "past the end"),
        (patched(40, &100u64.to_be_bytes()), "not cluster-aligned"),
        (patched(72, &1u64.to_be_bytes()), "incompatible features"),
        (patched(100, &72u32.to_be_bytes()), "header_length 72"),
        // The L1 entry (at cluster 3) pointing past the file, or unaligned.
        (
            patched(3 * CLUSTER as usize, &(COPIED | (1 << 40)).to_be_bytes()),
            "past the end",
        ),
        (
            patched(3 * CLUSTER as usize, &(COPIED | 4608).to_be_bytes()),
            "not a cluster boundary",
        ),
        // The L2 entry of cluster 0 (at cluster 4): compressed, past the
        // end, unaligned.
        (
            patched(
                4 * CLUSTER as usize,
                &(COMPRESSED | (5 * CLUSTER)).to_be_bytes(),
            ),
            "compressed",
        ),
        (
            patched(4 * CLUSTER as usize, &(COPIED | (1 << 40)).to_be_bytes()),
            "past the end",
        ),
        (
            patched(
                4 * CLUSTER as usize,
                &(COPIED | (5 * CLUSTER + 512)).to_be_bytes(),
            ),
            "not a cluster boundary",
        ),
    ];
    for (i, (bytes, want)) in cases.into_iter().enumerate() {
        let e = refused(bytes);
        assert!(e.contains(want), "case {i}: {e}");
    }
    // The zero flag reads zeros; the image itself reads.
    let mut z = Qcow2::new(Cursor::new(patched(
        4 * CLUSTER as usize,
        &(COPIED | (5 * CLUSTER) | ZERO).to_be_bytes(),
    )))
    .unwrap();
    assert!(read_all(&mut z).iter().all(|&b| b == 0));
    let mut ok = Qcow2::new(Cursor::new(good)).unwrap();
    assert_eq!(&read_all(&mut ok)[..4], b"data");
}

/// The plan's refcount blocks cover every cluster, also when the metadata
/// itself needs a second block.
#[test]
fn the_plan_counts_its_own_refcount_blocks() {
    let p = Plan::new(1 << 30, vec![REFCOUNTS_PER_BLOCK - 3, 0]);
    assert!(p.refcount_blocks * REFCOUNTS_PER_BLOCK >= p.total);
    assert_eq!(p.l1_table, 1 + 1 + 2);
    assert_eq!(p.refcount_blocks, 2);
    assert_eq!(p.total, 1 + 1 + 2 + 1 + 1 + REFCOUNTS_PER_BLOCK - 3);
}
