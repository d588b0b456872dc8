// Tests panic on unexpected failures: that is how a test fails.
#![allow(clippy::unwrap_used)]

use super::writer::{assemble, digest_of, header};
use super::*;
use contract::paths::{INSTALLER_PAYLOAD_DIR, PAYLOAD_FILES};
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

const EPOCH: u64 = 1_700_000_000;

/// A payload directory and a fake binary in `dir`; returns the spec.
fn spec_in(dir: &Path) -> ImageSpec {
    let payload = dir.join("payload");
    std::fs::create_dir_all(&payload).unwrap();
    for (i, name) in PAYLOAD_FILES.iter().enumerate() {
        let bytes: Vec<u8> = (0..5000u32 + i as u32 * 77)
            .map(|n| (n * 31 + i as u32) as u8)
            .collect();
        std::fs::write(payload.join(name), bytes).unwrap();
    }
    std::fs::write(dir.join("imager"), b"\x7fELF not really").unwrap();
    let mut entries = vec![
        Entry::File {
            path: "usr/bin/imager".into(),
            source: dir.join("imager"),
            mode: 0o755,
        },
        Entry::Symlink {
            path: "usr/bin/installer".into(),
            target: "imager".into(),
        },
    ];
    for name in PAYLOAD_FILES {
        entries.push(Entry::File {
            path: format!("{INSTALLER_PAYLOAD_DIR}/{name}"),
            source: payload.join(name),
            mode: 0o644,
        });
    }
    ImageSpec {
        entries,
        entrypoint: vec!["/usr/bin/installer".into()],
        tag: "0.1.0".into(),
        epoch: EPOCH,
    }
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// Path → (offset, size) of every regular file in an archive.
fn members(archive: &Path) -> BTreeMap<String, (u64, u64)> {
    let mut ar = tar::Archive::new(File::open(archive).unwrap());
    ar.entries()
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.header().entry_type() == tar::EntryType::Regular)
        .map(|e| {
            (
                e.path().unwrap().display().to_string(),
                (e.raw_file_position(), e.size()),
            )
        })
        .collect()
}

fn flip(path: &Path, at: u64) {
    let mut bytes = std::fs::read(path).unwrap();
    bytes[at as usize] ^= 0x01;
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn round_trip_gives_the_payload_back_and_is_reproducible() {
    let t = tempfile::tempdir().unwrap();
    let spec = spec_in(t.path());
    let out = t.path().join("out");
    std::fs::create_dir_all(&out).unwrap();
    let a = write_image(&out.join("a.tar"), &spec).unwrap();
    let b = write_image(&out.join("b.tar"), &spec).unwrap();
    assert_eq!(
        std::fs::read(&a.path).unwrap(),
        std::fs::read(&b.path).unwrap()
    );
    assert_eq!(a.manifest_digest, b.manifest_digest);
    // No temporaries are left beside the archives.
    assert_eq!(names(&out), ["a.tar", "b.tar"]);

    // The archive: layout, index, three blobs, sorted, owned by 0:0 at EPOCH.
    let mut ar = tar::Archive::new(File::open(&a.path).unwrap());
    let listed: Vec<(String, u64, u64, u32)> = ar
        .entries()
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let h = e.header();
            assert_eq!((h.uid().unwrap(), h.gid().unwrap()), (0, 0));
            assert_eq!(h.username().unwrap(), Some(""));
            (
                e.path().unwrap().display().to_string(),
                h.mtime().unwrap(),
                e.size(),
                h.mode().unwrap(),
            )
        })
        .collect();
    let paths: Vec<&str> = listed.iter().map(|l| l.0.as_str()).collect();
    let mut sorted = paths.clone();
    sorted.sort();
    assert_eq!(paths, sorted);
    assert!(listed.iter().all(|l| l.1 == EPOCH));
    assert!(paths.contains(&"oci-layout") && paths.contains(&"index.json"));
    assert_eq!(
        paths
            .iter()
            .filter(|p| p.starts_with("blobs/sha256/"))
            .count(),
        4
    );

    let m = members(&a.path);
    let read = |name: &str| {
        let (at, size) = m[name];
        let bytes = std::fs::read(&a.path).unwrap();
        bytes[at as usize..(at + size) as usize].to_vec()
    };
    let index: serde_json::Value = serde_json::from_slice(&read("index.json")).unwrap();
    assert_eq!(index["manifests"][0]["annotations"][REF_NAME], "0.1.0");
    assert_eq!(index["manifests"][0]["digest"], a.manifest_digest.as_str());
    let config: serde_json::Value = serde_json::from_slice(&read(&format!(
        "blobs/sha256/{}",
        a.config_digest.trim_start_matches("sha256:")
    )))
    .unwrap();
    assert_eq!(config["architecture"], "amd64");
    assert_eq!(config["os"], "linux");
    assert_eq!(config["created"], "2023-11-14T22:13:20Z");
    assert_eq!(config["config"]["Entrypoint"][0], "/usr/bin/installer");
    assert_eq!(config["rootfs"]["diff_ids"][0], a.layer_digest.as_str());

    // The layer: parent directories first, the link, fixed modes.
    let layer = read(&format!(
        "blobs/sha256/{}",
        a.layer_digest.trim_start_matches("sha256:")
    ));
    let mut lar = tar::Archive::new(layer.as_slice());
    let inside: Vec<(String, tar::EntryType, u32)> = lar
        .entries()
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.path().unwrap().display().to_string(),
                e.header().entry_type(),
                e.header().mode().unwrap(),
            )
        })
        .collect();
    assert_eq!(inside[0], ("usr/".into(), tar::EntryType::Directory, 0o755));
    assert!(inside.contains(&("usr/bin/installer".into(), tar::EntryType::Symlink, 0o777)));
    assert!(inside.contains(&("usr/bin/imager".into(), tar::EntryType::Regular, 0o755)));
    assert!(inside.contains(&(
        "usr/install/amd64/vmlinuz".into(),
        tar::EntryType::Regular,
        0o644
    )));

    // Read back: the same payload bytes, nothing else in dest.
    let dest = t.path().join("extracted");
    let dir = extract_payload(&a.path, &dest).unwrap();
    assert_eq!(dir, dest);
    assert_eq!(names(&dir), {
        let mut v: Vec<String> = PAYLOAD_FILES.iter().map(|s| s.to_string()).collect();
        v.sort();
        v
    });
    for name in PAYLOAD_FILES {
        assert_eq!(
            std::fs::read(dir.join(name)).unwrap(),
            std::fs::read(t.path().join("payload").join(name)).unwrap(),
            "{name}"
        );
    }

    // A directory holding the payload is taken as it is.
    let payload = t.path().join("payload");
    assert_eq!(extract_payload(&payload, &dest).unwrap(), payload);

    // An OCI layout directory (the archive unpacked) reads too.
    let layout = t.path().join("layout");
    tar::Archive::new(File::open(&a.path).unwrap())
        .unpack(&layout)
        .unwrap();
    let dest2 = t.path().join("extracted2");
    extract_payload(&layout, &dest2).unwrap();
    for name in PAYLOAD_FILES {
        assert_eq!(
            std::fs::read(dest2.join(name)).unwrap(),
            std::fs::read(dest.join(name)).unwrap()
        );
    }
}

#[test]
fn a_flipped_byte_in_any_blob_is_refused_and_nothing_is_extracted() {
    let t = tempfile::tempdir().unwrap();
    let spec = spec_in(t.path());
    let good = t.path().join("good.tar");
    write_image(&good, &spec).unwrap();
    let blobs: Vec<(String, (u64, u64))> = members(&good)
        .into_iter()
        .filter(|(p, _)| p.starts_with("blobs/sha256/"))
        .collect();
    assert_eq!(blobs.len(), 3);
    for (path, (at, size)) in blobs {
        let bad = t.path().join("bad.tar");
        std::fs::copy(&good, &bad).unwrap();
        flip(&bad, at + size / 2);
        let dest = t.path().join("dest");
        let _ = std::fs::remove_dir_all(&dest);
        let e = format!("{:#}", extract_payload(&bad, &dest).unwrap_err());
        let digest = format!("sha256:{}", path.trim_start_matches("blobs/sha256/"));
        assert!(
            e.contains(&format!("blob {digest} does not match its digest"))
                && e.contains("the archive is corrupt"),
            "{path}: {e}"
        );
        // Nothing under a final name.
        if dest.exists() {
            assert!(names(&dest).is_empty(), "{:?}", names(&dest));
        }
    }
}

#[test]
fn missing_and_foreign_inputs_are_named() {
    let t = tempfile::tempdir().unwrap();
    let dest = t.path().join("dest");

    // A tar without index.json.
    let no_index = t.path().join("no-index.tar");
    {
        let mut b = tar::Builder::new(File::create(&no_index).unwrap());
        let mut h = header(tar::EntryType::Regular, 0o644, 2, 0);
        b.append_data(&mut h, "oci-layout", &b"{}"[..]).unwrap();
        b.finish().unwrap();
    }
    let e = format!("{:#}", extract_payload(&no_index, &dest).unwrap_err());
    assert!(e.contains("not an OCI archive: no index.json"), "{e}");

    // Not a tar at all.
    let junk = t.path().join("junk.bin");
    std::fs::write(&junk, vec![0x5au8; 4096]).unwrap();
    let e = format!("{:#}", extract_payload(&junk, &dest).unwrap_err());
    assert!(
        e.contains("tar archive") || e.contains("no index.json"),
        "{e}"
    );

    // A directory with part of the payload.
    let half = t.path().join("half");
    std::fs::create_dir_all(&half).unwrap();
    std::fs::write(half.join("vmlinuz"), b"k").unwrap();
    let e = format!("{:#}", extract_payload(&half, &dest).unwrap_err());
    assert!(
        e.contains("neither a payload directory") && e.contains("manifest.json.sig"),
        "{e}"
    );

    // Missing file.
    let e = format!(
        "{:#}",
        extract_payload(&t.path().join("nope.tar"), &dest).unwrap_err()
    );
    assert!(e.contains("nope.tar"), "{e}");

    // An image without a payload.
    let mut spec = spec_in(t.path());
    spec.entries
        .retain(|e| !e.path().ends_with("manifest.json.sig"));
    let partial = t.path().join("partial.tar");
    write_image(&partial, &spec).unwrap();
    let e = format!("{:#}", extract_payload(&partial, &dest).unwrap_err());
    assert!(
        e.contains("has no usr/install/amd64/manifest.json.sig")
            && e.contains("not an installer image"),
        "{e}"
    );
}

/// An image whose layer holds the entries `make` writes (raw headers, so
/// that paths the tar crate refuses to write can be tested).
fn image_with_layer(dir: &Path, make: impl Fn(&mut tar::Builder<&File>)) -> PathBuf {
    let spec = spec_in(dir);
    let layer = tempfile::tempfile().unwrap();
    {
        let mut b = tar::Builder::new(&layer);
        make(&mut b);
        b.finish().unwrap();
    }
    let mut bytes = Vec::new();
    (&layer).seek(SeekFrom::Start(0)).unwrap();
    (&layer).read_to_end(&mut bytes).unwrap();
    let hex = digest_of(&bytes).trim_start_matches("sha256:").to_string();
    let size = bytes.len() as u64;
    let dest = dir.join("crafted.tar");
    assemble(&dest, &layer, &hex, size, &spec).unwrap();
    dest
}

fn raw_entry(
    b: &mut tar::Builder<&File>,
    kind: tar::EntryType,
    path: &str,
    link: &str,
    data: &[u8],
) {
    let mut h = tar::Header::new_ustar();
    h.set_entry_type(kind);
    h.set_mode(0o644);
    h.set_size(data.len() as u64);
    h.as_old_mut().name[..path.len()].copy_from_slice(path.as_bytes());
    h.as_old_mut().linkname[..link.len()].copy_from_slice(link.as_bytes());
    h.set_cksum();
    b.append(&h, data).unwrap();
}

fn payload_files(b: &mut tar::Builder<&File>) {
    for name in PAYLOAD_FILES {
        raw_entry(
            b,
            tar::EntryType::Regular,
            &format!("{INSTALLER_PAYLOAD_DIR}/{name}"),
            "",
            name.as_bytes(),
        );
    }
}

#[test]
fn unsafe_layer_entries_are_refused() {
    type Make = Box<dyn Fn(&mut tar::Builder<&File>)>;
    let cases: [(&str, Make, &str); 5] = [
        (
            "dotdot",
            Box::new(|b| {
                payload_files(b);
                raw_entry(b, tar::EntryType::Regular, "usr/../../evil", "", b"x");
            }),
            "contains `..`",
        ),
        (
            "absolute",
            Box::new(|b| {
                raw_entry(b, tar::EntryType::Regular, "/etc/evil", "", b"x");
                payload_files(b);
            }),
            "absolute path",
        ),
        (
            "symlink in the payload",
            Box::new(|b| {
                payload_files(b);
                raw_entry(
                    b,
                    tar::EntryType::Symlink,
                    "usr/install/amd64/vmlinuz",
                    "/etc/shadow",
                    b"",
                );
            }),
            "is a link (to \"/etc/shadow\")",
        ),
        (
            "hard link in the payload",
            Box::new(|b| {
                payload_files(b);
                raw_entry(
                    b,
                    tar::EntryType::Link,
                    "usr/install/amd64/manifest.json",
                    "usr/bin/imager",
                    b"",
                );
            }),
            "is a link",
        ),
        (
            "link on the way",
            Box::new(|b| {
                raw_entry(b, tar::EntryType::Symlink, "usr/install", "/", b"");
                payload_files(b);
            }),
            "would lead elsewhere",
        ),
    ];
    for (what, make, want) in cases {
        let t = tempfile::tempdir().unwrap();
        let img = image_with_layer(t.path(), make);
        let dest = t.path().join("dest");
        let e = format!("{:#}", extract_payload(&img, &dest).unwrap_err());
        assert!(e.contains(want) && e.contains("refusing"), "{what}: {e}");
        assert!(names(&dest).is_empty(), "{what}");
    }

    // Whiteouts and later entries apply in order; "./" prefixes are fine.
    let t = tempfile::tempdir().unwrap();
    let img = image_with_layer(t.path(), |b| {
        raw_entry(
            b,
            tar::EntryType::Regular,
            "./usr/install/amd64/extra",
            "",
            b"x",
        );
        raw_entry(
            b,
            tar::EntryType::Regular,
            "usr/install/amd64/.wh.extra",
            "",
            b"",
        );
        payload_files(b);
        raw_entry(
            b,
            tar::EntryType::Regular,
            "usr/install/amd64/vmlinuz",
            "",
            b"k2",
        );
    });
    let dest = t.path().join("dest");
    extract_payload(&img, &dest).unwrap();
    assert_eq!(std::fs::read(dest.join("vmlinuz")).unwrap(), b"k2");
    assert!(!dest.join("extra").exists());
}

#[test]
fn image_paths_and_tags_are_checked() {
    let t = tempfile::tempdir().unwrap();
    let mut spec = spec_in(t.path());
    spec.entries.push(Entry::Symlink {
        path: "usr/../x".into(),
        target: "y".into(),
    });
    let e = format!(
        "{:#}",
        write_image(&t.path().join("x.tar"), &spec).unwrap_err()
    );
    assert!(e.contains("`..`"), "{e}");
    assert!(!t.path().join("x.tar").exists());
    let mut spec = spec_in(t.path());
    spec.tag = "1.0+build".into();
    let e = format!(
        "{:#}",
        write_image(&t.path().join("x.tar"), &spec).unwrap_err()
    );
    assert!(e.contains("OCI image tag"), "{e}");
    assert!(check_tag("0.1.0").is_ok());
    assert!(check_tag("v1_2-rc.3").is_ok());
    assert!(check_tag("").is_err());
    assert!(check_tag(".x").is_err());
    assert!(check_tag(&"a".repeat(129)).is_err());
}

#[test]
fn rfc3339_dates() {
    assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
    assert_eq!(rfc3339(1_700_000_000), "2023-11-14T22:13:20Z");
    assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
    assert_eq!(rfc3339(4_107_542_399), "2100-02-28T23:59:59Z");
}
