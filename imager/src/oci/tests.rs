// Tests panic on unexpected failures: that is how a test fails.
#![allow(clippy::unwrap_used)]

use super::reader::{TAR_ALLOWANCE, Work, extract_counted};
use super::writer::{digest_of, header, write_layer};
use super::*;
use crate::artifact::Kind;
use crate::sign::{self, Manifest, Signer, VerifyingKey};
use contract::Arch;
use contract::paths::{
    PAYLOAD_BOOT_LOADER, PAYLOAD_FILES, PAYLOAD_INITRAMFS, PAYLOAD_KERNEL, PAYLOAD_MANIFEST,
    PAYLOAD_SIGNATURE,
};
use payload::trust::TrustFiles;
use serde_json::json;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

const EPOCH: u64 = 1_700_000_000;
/// amd64's payload directory, where the tests' images put their payload.
const PAYLOAD_DIR: &str = "usr/install/amd64";

/// A signing key made from a seed, for tests.
struct TestKey(ed25519_dalek::SigningKey);

impl Signer for TestKey {
    fn public_key(&self) -> VerifyingKey {
        self.0.verifying_key()
    }
    fn sign(&self, message: &[u8]) -> anyhow::Result<sign::Signature> {
        Ok(ed25519_dalek::Signer::sign(&self.0, message))
    }
}

fn key(seed: u8) -> TestKey {
    TestKey(ed25519_dalek::SigningKey::from_bytes(&[seed; 32]))
}

/// A verifier that trusts `key` only, as the installer trusts a disk's keys.
fn trusting(key: VerifyingKey) -> impl Fn(&TrustFiles) -> anyhow::Result<Manifest> {
    move |f: &TrustFiles| {
        sign::verify_manifest_bytes(
            &f.manifest,
            &f.signature,
            &key,
            PAYLOAD_MANIFEST,
            PAYLOAD_SIGNATURE,
        )
    }
}

/// The key the payloads of these tests are signed with.
fn signer() -> TestKey {
    key(1)
}

/// Extracts with a verifier that trusts [`signer`]'s key.
fn extract(archive: &Path, dest: &Path) -> anyhow::Result<PathBuf> {
    extract_payload(archive, dest, Arch::Amd64, &trusting(signer().public_key()))
}

/// Extracts with `verify`, counting the work.
fn extract_work(
    archive: &Path,
    dest: &Path,
    verify: Verifier,
) -> (anyhow::Result<PathBuf>, u64, usize) {
    let work = Work::default();
    let r = extract_counted(archive, dest, Arch::Amd64, verify, &work);
    (r, work.unpacked.get(), work.layers.get())
}

/// The files of a payload (patterned bytes: kernel, initramfs, boot loader)
/// and their manifest, signed by [`signer`], in `dir/payload`.
fn payload_in(dir: &Path) -> PathBuf {
    let payload = dir.join("payload");
    std::fs::create_dir_all(&payload).unwrap();
    let files = [
        (PAYLOAD_KERNEL, Kind::Kernel, 5000u32),
        (PAYLOAD_INITRAMFS, Kind::Initramfs, 5077),
        (PAYLOAD_BOOT_LOADER, Kind::BootLoader, 3000),
    ];
    let mut artifacts = Vec::new();
    for (i, (name, kind, len)) in files.into_iter().enumerate() {
        let bytes: Vec<u8> = (0..len).map(|n| (n * 31 + i as u32) as u8).collect();
        std::fs::write(payload.join(name), bytes).unwrap();
        artifacts.push(sign::describe(&payload, kind, name).unwrap());
    }
    let m = Manifest {
        boot: Some(sign::Boot {
            title: "Imager 0.1.0".into(),
            cmdline: "console=ttyS0".into(),
            secure_boot_enroll: None,
        }),
        ..Manifest::new(
            "metal",
            "0.1.0",
            "profiles/installer.yaml",
            EPOCH,
            artifacts,
        )
    };
    sign::write_signed_manifest(&payload, &m, &signer()).unwrap();
    payload
}

/// The sum of the sizes [`payload_in`] signs.
const DECLARED: u64 = 5000 + 5077 + 3000;

/// The layers of an installer image, as `build::installer` makes them: the
/// signed manifest, the payload, the installer binary.
fn layers_in(dir: &Path) -> Vec<Vec<Entry>> {
    let payload = payload_in(dir);
    std::fs::write(dir.join("imager"), b"\x7fELF not really").unwrap();
    crate::build::installer_spec(
        &payload,
        &LISTED,
        &[],
        &dir.join("imager"),
        "0.1.0",
        EPOCH,
        contract::Arch::Amd64,
    )
    .layers
}

fn spec_in(dir: &Path) -> ImageSpec {
    ImageSpec {
        layers: layers_in(dir),
        entrypoint: vec!["/usr/bin/installer".into()],
        ref_name: "localhost/metal/installer:0.1.0".into(),
        epoch: EPOCH,
        arch: contract::Arch::Amd64,
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

/// Nothing under a final name in `dest` (or no `dest` at all).
fn assert_empty(dest: &Path, what: &str) {
    if dest.exists() {
        assert!(names(dest).is_empty(), "{what}: {:?}", names(dest));
    }
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

/// The paths, kinds and modes inside a layer tar.
fn listing(layer: &[u8]) -> Vec<(String, tar::EntryType, u32)> {
    tar::Archive::new(layer)
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
        .collect()
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

    // The archive: layout, index, five blobs, sorted, owned by 0:0 at EPOCH.
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
            .filter(|p| p.starts_with("blobs/sha256/") && **p != "blobs/sha256/")
            .count(),
        5
    );

    let m = members(&a.path);
    let read = |digest: &str| {
        let (at, size) = m[&format!("blobs/sha256/{}", digest.trim_start_matches("sha256:"))];
        let bytes = std::fs::read(&a.path).unwrap();
        bytes[at as usize..(at + size) as usize].to_vec()
    };
    let (at, size) = m["index.json"];
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&a.path).unwrap()[at as usize..(at + size) as usize])
            .unwrap();
    assert_eq!(
        index["manifests"][0]["annotations"][REF_NAME],
        "localhost/metal/installer:0.1.0"
    );
    assert_eq!(index["manifests"][0]["digest"], a.manifest_digest.as_str());
    let config: serde_json::Value = serde_json::from_slice(&read(&a.config_digest)).unwrap();
    assert_eq!(config["architecture"], "amd64");
    assert_eq!(config["os"], "linux");
    assert_eq!(config["created"], "2023-11-14T22:13:20Z");
    assert_eq!(config["config"]["Entrypoint"][0], "/usr/bin/installer");
    assert_eq!(a.layers.len(), 3);
    for (i, (digest, _)) in a.layers.iter().enumerate() {
        assert_eq!(config["rootfs"]["diff_ids"][i], digest.as_str());
    }
    let manifest: serde_json::Value = serde_json::from_slice(&read(&a.manifest_digest)).unwrap();
    for (i, (digest, size)) in a.layers.iter().enumerate() {
        let d = &manifest["layers"][i];
        assert_eq!(d["digest"], digest.as_str());
        assert_eq!(d["size"], *size);
        assert_eq!(d["mediaType"], MEDIA_TYPE_LAYER);
    }

    // The layers: the signed manifest alone, then the payload, then the
    // installer; parent directories first, fixed modes.
    let dir = |name: &str| (name.to_string(), tar::EntryType::Directory, 0o755);
    let file = |name: &str, mode| (name.to_string(), tar::EntryType::Regular, mode);
    let p = |name: &str| format!("{PAYLOAD_DIR}/{name}");
    let payload_dirs = [dir("usr/"), dir("usr/install/"), dir("usr/install/amd64/")];
    let mut want0 = payload_dirs.to_vec();
    want0.extend([
        file(&p(PAYLOAD_MANIFEST), 0o644),
        file(&p(PAYLOAD_SIGNATURE), 0o644),
    ]);
    assert_eq!(listing(&read(&a.layers[MANIFEST_LAYER].0)), want0);
    let mut want1 = payload_dirs.to_vec();
    want1.extend([
        file(&p(PAYLOAD_INITRAMFS), 0o644),
        file(&p(PAYLOAD_BOOT_LOADER), 0o644),
        file(&p(PAYLOAD_KERNEL), 0o644),
    ]);
    assert_eq!(listing(&read(&a.layers[PAYLOAD_LAYER].0)), want1);
    assert_eq!(
        listing(&read(&a.layers[2].0)),
        [
            dir("usr/"),
            dir("usr/bin/"),
            file("usr/bin/imager", 0o755),
            ("usr/bin/installer".into(), tar::EntryType::Symlink, 0o777),
        ]
    );

    // Read back: the same payload bytes, nothing else in dest; the
    // installer's layer is never opened.
    let dest = t.path().join("extracted");
    let (got, _, layers) = extract_work(&a.path, &dest, &trusting(signer().public_key()));
    let dir = got.unwrap();
    assert_eq!(dir, dest);
    assert_eq!(layers, 2);
    let mut want: Vec<String> = PAYLOAD_FILES
        .iter()
        .chain([&PAYLOAD_BOOT_LOADER])
        .map(|s| s.to_string())
        .collect();
    want.sort();
    assert_eq!(names(&dir), want);
    for name in &want {
        assert_eq!(
            std::fs::read(dir.join(name)).unwrap(),
            std::fs::read(t.path().join("payload").join(name)).unwrap(),
            "{name}"
        );
    }

    // A directory holding the payload is taken as it is.
    let payload = t.path().join("payload");
    assert_eq!(extract(&payload, &dest).unwrap(), payload);

    // An OCI layout directory (the archive unpacked) reads too.
    let layout = t.path().join("layout");
    tar::Archive::new(File::open(&a.path).unwrap())
        .unpack(&layout)
        .unwrap();
    let dest2 = t.path().join("extracted2");
    extract(&layout, &dest2).unwrap();
    for name in &want {
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
    assert_eq!(blobs.len(), 5);
    for (path, (at, size)) in blobs {
        let bad = t.path().join("bad.tar");
        std::fs::copy(&good, &bad).unwrap();
        flip(&bad, at + size / 2);
        let dest = t.path().join("dest");
        let _ = std::fs::remove_dir_all(&dest);
        // The installer's layer too, which is not unpacked but hashed.
        let e = format!("{:#}", extract(&bad, &dest).unwrap_err());
        let digest = format!("sha256:{}", path.trim_start_matches("blobs/sha256/"));
        assert!(
            e.contains(&format!("blob {digest} does not match its digest"))
                && e.contains("the archive is corrupt"),
            "{path}: {e}"
        );
        assert_empty(&dest, &path);
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
    let e = format!("{:#}", extract(&no_index, &dest).unwrap_err());
    assert!(e.contains("not an OCI archive: no index.json"), "{e}");

    // Not a tar at all.
    let junk = t.path().join("junk.bin");
    std::fs::write(&junk, vec![0x5au8; 4096]).unwrap();
    let e = format!("{:#}", extract(&junk, &dest).unwrap_err());
    assert!(
        e.contains("tar archive") || e.contains("no index.json"),
        "{e}"
    );

    // A directory with part of the payload.
    let half = t.path().join("half");
    std::fs::create_dir_all(&half).unwrap();
    std::fs::write(half.join("vmlinuz"), b"k").unwrap();
    let e = format!("{:#}", extract(&half, &dest).unwrap_err());
    assert!(
        e.contains("neither a payload directory") && e.contains("manifest.json.sig"),
        "{e}"
    );

    // Missing file.
    let e = format!(
        "{:#}",
        extract(&t.path().join("nope.tar"), &dest).unwrap_err()
    );
    assert!(e.contains("nope.tar"), "{e}");

    // A FIFO (open() would wait for a writer for ever), as the archive and
    // as a blob of a layout directory.
    let fifo = t.path().join("fifo");
    let made = std::process::Command::new(crate::disk::testutil::tool("mkfifo"))
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    let e = format!("{:#}", extract(&fifo, &dest).unwrap_err());
    assert!(e.contains("fifo is not a regular file"), "{e}");
    let a = write_image(&t.path().join("a.tar"), &spec_in(t.path())).unwrap();
    let layout = t.path().join("layout");
    tar::Archive::new(File::open(&a.path).unwrap())
        .unpack(&layout)
        .unwrap();
    let blob = layout
        .join("blobs/sha256")
        .join(a.layers[MANIFEST_LAYER].0.trim_start_matches("sha256:"));
    std::fs::remove_file(&blob).unwrap();
    std::fs::rename(&fifo, &blob).unwrap();
    let e = format!("{:#}", extract(&layout, &dest).unwrap_err());
    assert!(
        e.contains("is not a regular file") && e.contains("the image is incomplete"),
        "{e}"
    );

    // An image whose first layer lacks the signature.
    let mut spec = spec_in(t.path());
    spec.layers[MANIFEST_LAYER].retain(|e| !e.path().ends_with("manifest.json.sig"));
    let partial = t.path().join("partial.tar");
    write_image(&partial, &spec).unwrap();
    let e = format!("{:#}", extract(&partial, &dest).unwrap_err());
    assert!(
        e.contains("the first layer lacks usr/install/amd64/manifest.json or")
            && e.contains("not an installer image"),
        "{e}"
    );

    // An image of one layer, as older imagers made them.
    let mut spec = spec_in(t.path());
    spec.layers = vec![spec.layers.concat()];
    let old = t.path().join("old.tar");
    write_image(&old, &spec).unwrap();
    let (got, unpacked, layers) = extract_work(&old, &dest, &trusting(signer().public_key()));
    let e = format!("{:#}", got.unwrap_err());
    assert!(
        e.contains("the image has 1 layer(s)") && e.contains("made by an older imager"),
        "{e}"
    );
    assert_eq!((unpacked, layers), (0, 0));

    // A payload manifest that lists no kernel.
    let mut spec = spec_in(t.path());
    let payload = t.path().join("payload");
    let m = Manifest::new(
        "metal",
        "0.1.0",
        "p",
        EPOCH,
        vec![sign::describe(&payload, Kind::Initramfs, PAYLOAD_INITRAMFS).unwrap()],
    );
    sign::write_signed_manifest(&payload, &m, &signer()).unwrap();
    spec.layers[PAYLOAD_LAYER].retain(|e| e.path().ends_with(PAYLOAD_INITRAMFS));
    let no_kernel = t.path().join("no-kernel.tar");
    write_image(&no_kernel, &spec).unwrap();
    let e = format!("{:#}", extract(&no_kernel, &dest).unwrap_err());
    assert!(
        e.contains("the signed payload manifest lists no vmlinuz"),
        "{e}"
    );
    assert_empty(&dest, "no kernel");
}

#[test]
fn a_private_key_given_as_the_archive_is_never_quoted() {
    use ed25519_dalek::pkcs8::EncodePrivateKey;
    use ed25519_dalek::pkcs8::spki::der::pem::LineEnding;
    let t = tempfile::tempdir().unwrap();
    let dest = t.path().join("dest");
    let pem = key(9).0.to_pkcs8_pem(LineEnding::LF).unwrap();
    let body: Vec<&str> = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    assert!(!body.is_empty());
    let leaks = |e: &str| e.contains("PRIVATE") || body.iter().any(|l| e.contains(&l[..16]));

    // The key file itself (the tar crate would quote its first 100 bytes).
    let k = t.path().join("key.pem");
    std::fs::write(&k, pem.as_bytes()).unwrap();
    let e = format!("{:#}", extract(&k, &dest).unwrap_err());
    assert!(!leaks(&e), "{e}");
    assert!(e.contains("is not a tar archive, or a damaged one"), "{e}");

    // The key as a JSON string where a number belongs (serde quotes it).
    let img = t.path().join("key-in-index.tar");
    {
        let index = serde_json::to_vec(&json!({ "schemaVersion": pem.as_str() })).unwrap();
        let mut b = tar::Builder::new(File::create(&img).unwrap());
        for (path, bytes) in [
            ("index.json", index.as_slice()),
            (
                "oci-layout",
                br#"{"imageLayoutVersion":"1.0.0"}"#.as_slice(),
            ),
        ] {
            let mut h = header(tar::EntryType::Regular, 0o644, bytes.len() as u64, EPOCH);
            b.append_data(&mut h, path, bytes).unwrap();
        }
        b.finish().unwrap();
    }
    let e = format!("{:#}", extract(&img, &dest).unwrap_err());
    assert!(!leaks(&e), "{e}");
    assert!(
        e.contains("index.json is not a valid OCI image index: invalid type: string \"…\""),
        "{e}"
    );

    // The key as a layer entry's name, with `..` in it.
    let t2 = tempfile::tempdir().unwrap();
    let name = format!("../{}", &body[0][..60]);
    let img = image_with_payload_layer(t2.path(), |b| {
        raw_entry(b, tar::EntryType::Regular, &name, "", b"x");
    });
    let e = format!("{:#}", extract(&img, &dest).unwrap_err());
    assert!(
        e.contains("a layer entry's name is not a plain relative path"),
        "{e}"
    );
    assert!(!e.contains(&body[0][..60]), "{e}");
}

/// A layer blob: media type, bytes (as stored) and diff_id.
#[derive(Clone)]
struct Blob {
    media_type: &'static str,
    bytes: Vec<u8>,
    diff_id: String,
}

/// The uncompressed layer of `entries`, as the writer makes it.
fn layer_of(entries: &[Entry]) -> Blob {
    let f = tempfile::tempfile().unwrap();
    let (hex, _) = write_layer(&f, entries, EPOCH).unwrap();
    let mut bytes = Vec::new();
    (&f).seek(SeekFrom::Start(0)).unwrap();
    (&f).read_to_end(&mut bytes).unwrap();
    Blob {
        media_type: MEDIA_TYPE_LAYER,
        bytes,
        diff_id: format!("sha256:{hex}"),
    }
}

/// A layer of raw entries (so that what the tar crate refuses to write can
/// be tested).
fn raw_layer(make: impl Fn(&mut tar::Builder<Vec<u8>>)) -> Blob {
    let mut b = tar::Builder::new(Vec::new());
    make(&mut b);
    let bytes = b.into_inner().unwrap();
    let diff_id = digest_of(&bytes);
    Blob {
        media_type: MEDIA_TYPE_LAYER,
        bytes,
        diff_id,
    }
}

fn gzip(b: &Blob) -> Blob {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::new(6));
    e.write_all(&b.bytes).unwrap();
    Blob {
        media_type: MEDIA_TYPE_LAYER_GZIP,
        bytes: e.finish().unwrap(),
        diff_id: b.diff_id.clone(),
    }
}

fn zstd(b: &Blob) -> Blob {
    Blob {
        media_type: MEDIA_TYPE_LAYER_ZSTD,
        bytes: zstd::encode_all(b.bytes.as_slice(), 3).unwrap(),
        diff_id: b.diff_id.clone(),
    }
}

/// What a streamed layer holds.
enum Data<'a> {
    Bytes(&'a [u8]),
    Zeros(u64),
}

/// A zstd layer of `entries`, built streaming: the tar is hashed (its
/// diff_id) and compressed on the way, never held whole.
fn streamed_layer(entries: &[(&str, Data)]) -> Blob {
    struct Out {
        hasher: Sha256,
        zstd: zstd::Encoder<'static, Vec<u8>>,
    }
    impl Out {
        fn put(&mut self, bytes: &[u8]) {
            self.hasher.update(bytes);
            self.zstd.write_all(bytes).unwrap();
        }
    }
    let mut out = Out {
        hasher: Sha256::new(),
        zstd: zstd::Encoder::new(Vec::new(), 1).unwrap(),
    };
    let zeros = vec![0u8; 1 << 20];
    for (path, data) in entries {
        let size = match data {
            Data::Bytes(b) => b.len() as u64,
            Data::Zeros(n) => *n,
        };
        let mut h = header(tar::EntryType::Regular, 0o644, size, EPOCH);
        h.set_path(path).unwrap();
        h.set_cksum();
        out.put(h.as_bytes());
        match data {
            Data::Bytes(b) => out.put(b),
            Data::Zeros(n) => {
                let mut left = *n;
                while left > 0 {
                    let k = left.min(zeros.len() as u64);
                    out.put(&zeros[..k as usize]);
                    left -= k;
                }
            }
        }
        out.put(&zeros[..((512 - size % 512) % 512) as usize]);
    }
    out.put(&zeros[..1024]);
    Blob {
        media_type: MEDIA_TYPE_LAYER_ZSTD,
        diff_id: format!("sha256:{}", hex::encode(out.hasher.finalize())),
        bytes: out.zstd.finish().unwrap(),
    }
}

/// One GiB of zeros as the payload's kernel, zstd-compressed (a few tens of
/// KB): the attack's layer, made once.
const GIB: u64 = 1 << 30;
fn gib_of_zeros() -> &'static Blob {
    static B: OnceLock<Blob> = OnceLock::new();
    B.get_or_init(|| {
        streamed_layer(&[(&format!("{PAYLOAD_DIR}/{PAYLOAD_KERNEL}"), Data::Zeros(GIB))])
    })
}

/// An OCI archive of one image of `layers` (bottom first), as skopeo could
/// make it: each blob stored once, however often it is named.
fn craft(dest: &Path, layers: &[&Blob]) {
    let config = serde_json::to_vec(&json!({
        "architecture": "amd64",
        "os": "linux",
        "rootfs": {
            "type": "layers",
            "diff_ids": layers.iter().map(|l| l.diff_id.as_str()).collect::<Vec<_>>(),
        },
    }))
    .unwrap();
    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": MEDIA_TYPE_MANIFEST,
        "config": {
            "mediaType": MEDIA_TYPE_CONFIG,
            "digest": digest_of(&config),
            "size": config.len(),
        },
        "layers": layers.iter().map(|l| json!({
            "mediaType": l.media_type,
            "digest": digest_of(&l.bytes),
            "size": l.bytes.len(),
        })).collect::<Vec<_>>(),
    }))
    .unwrap();
    let index = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": MEDIA_TYPE_INDEX,
        "manifests": [{
            "mediaType": MEDIA_TYPE_MANIFEST,
            "digest": digest_of(&manifest),
            "size": manifest.len(),
            "platform": { "architecture": "amd64", "os": "linux" },
            "annotations": { REF_NAME: "0.1.0" },
        }],
    }))
    .unwrap();
    let mut files: BTreeMap<String, &[u8]> = BTreeMap::new();
    files.insert("oci-layout".into(), br#"{"imageLayoutVersion":"1.0.0"}"#);
    files.insert("index.json".into(), &index);
    let blob = |bytes: &[u8]| {
        format!(
            "blobs/sha256/{}",
            digest_of(bytes).trim_start_matches("sha256:")
        )
    };
    files.insert(blob(&manifest), &manifest);
    files.insert(blob(&config), &config);
    for l in layers {
        files.insert(blob(&l.bytes), &l.bytes);
    }
    let mut b = tar::Builder::new(File::create(dest).unwrap());
    for (path, bytes) in files {
        let mut h = header(tar::EntryType::Regular, 0o644, bytes.len() as u64, EPOCH);
        b.append_data(&mut h, path, bytes).unwrap();
    }
    b.finish().unwrap();
}

/// The layers of [`layers_in`] as blobs: signed manifest, payload, binary.
fn blobs_in(dir: &Path) -> [Blob; 3] {
    let l = layers_in(dir);
    [layer_of(&l[0]), layer_of(&l[1]), layer_of(&l[2])]
}

/// An image whose payload layer holds the entries `make` writes.
fn image_with_payload_layer(dir: &Path, make: impl Fn(&mut tar::Builder<Vec<u8>>)) -> PathBuf {
    let [signed, _, binary] = blobs_in(dir);
    let dest = dir.join("crafted.tar");
    craft(&dest, &[&signed, &raw_layer(make), &binary]);
    dest
}

/// An image whose first layer holds the entries `make` writes.
fn image_with_manifest_layer(dir: &Path, make: impl Fn(&mut tar::Builder<Vec<u8>>)) -> PathBuf {
    let [_, payload, binary] = blobs_in(dir);
    let dest = dir.join("crafted.tar");
    craft(&dest, &[&raw_layer(make), &payload, &binary]);
    dest
}

fn raw_entry(
    b: &mut tar::Builder<Vec<u8>>,
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

/// The payload files `payload_in` made in `dir`, as layer entries.
fn payload_files(dir: &Path, names: &[&str]) -> impl Fn(&mut tar::Builder<Vec<u8>>) {
    let files: Vec<(String, Vec<u8>)> = names
        .iter()
        .map(|n| {
            (
                format!("{PAYLOAD_DIR}/{n}"),
                std::fs::read(dir.join("payload").join(n)).unwrap(),
            )
        })
        .collect();
    move |b| {
        for (path, bytes) in &files {
            raw_entry(b, tar::EntryType::Regular, path, "", bytes);
        }
    }
}

const LISTED: [&str; 3] = [PAYLOAD_KERNEL, PAYLOAD_INITRAMFS, PAYLOAD_BOOT_LOADER];
const SIGNED: [&str; 2] = [PAYLOAD_MANIFEST, PAYLOAD_SIGNATURE];

#[test]
fn unsafe_layer_entries_are_refused() {
    type Make = Box<dyn Fn(&Path, &mut tar::Builder<Vec<u8>>)>;
    // In the payload layer.
    let cases: [(&str, Make, &str); 6] = [
        (
            "a link to a name that would drive the terminal",
            Box::new(|d, b| {
                payload_files(d, &[PAYLOAD_INITRAMFS, PAYLOAD_BOOT_LOADER])(b);
                raw_entry(
                    b,
                    tar::EntryType::Symlink,
                    "usr/install/amd64/vmlinuz",
                    "\u{1b}[2J\nimager: error: forged",
                    b"",
                );
            }),
            "usr/install/amd64/vmlinuz in the payload layer is not a regular file",
        ),
        (
            "dotdot",
            Box::new(|d, b| {
                payload_files(d, &LISTED)(b);
                raw_entry(b, tar::EntryType::Regular, "usr/../../evil", "", b"x");
            }),
            "a layer entry's name is not a plain relative path",
        ),
        (
            "absolute",
            Box::new(|d, b| {
                raw_entry(b, tar::EntryType::Regular, "/etc/evil", "", b"x");
                payload_files(d, &LISTED)(b);
            }),
            "a layer entry's name is not a plain relative path",
        ),
        (
            "symlink in the payload",
            Box::new(|d, b| {
                payload_files(d, &[PAYLOAD_INITRAMFS, PAYLOAD_BOOT_LOADER])(b);
                raw_entry(
                    b,
                    tar::EntryType::Symlink,
                    "usr/install/amd64/vmlinuz",
                    "/etc/shadow",
                    b"",
                );
            }),
            "usr/install/amd64/vmlinuz in the payload layer is not a regular file",
        ),
        (
            "hard link in the payload",
            Box::new(|d, b| {
                payload_files(d, &[PAYLOAD_KERNEL, PAYLOAD_BOOT_LOADER])(b);
                raw_entry(
                    b,
                    tar::EntryType::Link,
                    "usr/install/amd64/initramfs.zst",
                    "usr/bin/imager",
                    b"",
                );
            }),
            "usr/install/amd64/initramfs.zst in the payload layer is not a regular file",
        ),
        (
            "a listed file twice",
            Box::new(|d, b| {
                payload_files(d, &LISTED)(b);
                payload_files(d, &[PAYLOAD_KERNEL])(b);
            }),
            "usr/install/amd64/vmlinuz is in the payload layer twice",
        ),
    ];
    for (what, make, want) in cases {
        let t = tempfile::tempdir().unwrap();
        let img = image_with_payload_layer(t.path(), |b| make(t.path(), b));
        let dest = t.path().join("dest");
        let e = format!("{:#}", extract(&img, &dest).unwrap_err());
        assert!(e.contains(want) && e.contains("refusing"), "{what}: {e}");
        assert!(!e.chars().any(char::is_control), "{what}: {e:?}");
        assert_empty(&dest, what);
    }

    // In the first layer.
    let cases: [(&str, Make, &str); 3] = [
        (
            "symlink as the manifest",
            Box::new(|d, b| {
                payload_files(d, &[PAYLOAD_SIGNATURE])(b);
                raw_entry(
                    b,
                    tar::EntryType::Symlink,
                    "usr/install/amd64/manifest.json",
                    "/etc/shadow",
                    b"",
                );
            }),
            "the first layer has \"usr/install/amd64/manifest.json\" of type Symlink",
        ),
        (
            "link on the way",
            Box::new(|d, b| {
                raw_entry(b, tar::EntryType::Symlink, "usr", "/", b"");
                payload_files(d, &SIGNED)(b);
            }),
            "the first layer has \"usr\" of type Symlink",
        ),
        (
            "the manifest twice",
            Box::new(|d, b| {
                payload_files(d, &SIGNED)(b);
                payload_files(d, &[PAYLOAD_MANIFEST])(b);
            }),
            "usr/install/amd64/manifest.json is in the first layer twice",
        ),
    ];
    for (what, make, want) in cases {
        let t = tempfile::tempdir().unwrap();
        let img = image_with_manifest_layer(t.path(), |b| make(t.path(), b));
        let dest = t.path().join("dest");
        let (got, _, layers) = extract_work(&img, &dest, &trusting(signer().public_key()));
        let e = format!("{:#}", got.unwrap_err());
        assert!(e.contains(want), "{what}: {e}");
        assert_eq!(layers, 1, "{what}: the payload layer is not opened");
        assert_empty(&dest, what);
    }

    // A link on the way to the payload directory is never followed: the
    // listed files are written by name into the destination, and the link
    // is not made.
    let t = tempfile::tempdir().unwrap();
    let img = image_with_payload_layer(t.path(), |b| {
        raw_entry(b, tar::EntryType::Symlink, "usr/install", "/", b"");
        payload_files(t.path(), &LISTED)(b);
    });
    let dest = t.path().join("dest");
    extract(&img, &dest).unwrap();
    let mut want: Vec<&str> = LISTED.iter().chain(&SIGNED).copied().collect();
    want.sort();
    assert_eq!(names(&dest), want);
    assert!(
        std::fs::read_dir(&dest)
            .unwrap()
            .all(|e| !e.unwrap().file_type().unwrap().is_symlink())
    );

    // What the manifest does not list is not extracted: other files, files
    // in subdirectories, whiteouts; "./" prefixes are fine.
    let t = tempfile::tempdir().unwrap();
    let img = image_with_payload_layer(t.path(), |b| {
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
            "usr/install/amd64/sub/x",
            "",
            b"x",
        );
        raw_entry(b, tar::EntryType::Regular, "etc/passwd", "", b"x");
        raw_entry(
            b,
            tar::EntryType::Regular,
            "usr/install/amd64/.wh.vmlinuz",
            "",
            b"",
        );
        payload_files(t.path(), &LISTED)(b);
        raw_entry(
            b,
            tar::EntryType::Regular,
            "usr/install/amd64/.wh..wh..opq",
            "",
            b"",
        );
    });
    let dest = t.path().join("dest");
    extract(&img, &dest).unwrap();
    let mut want: Vec<&str> = LISTED.iter().chain(&SIGNED).copied().collect();
    want.sort();
    assert_eq!(names(&dest), want);
}

#[test]
fn an_archive_not_signed_by_a_trusted_key_is_refused_before_its_layers_are_read() {
    let t = tempfile::tempdir().unwrap();
    let [signed, _, binary] = blobs_in(t.path());
    let zeros = gib_of_zeros();
    assert!(zeros.bytes.len() < 1 << 20, "{}", zeros.bytes.len());
    // Valid in every way but its signature, its digests and diff_ids right:
    // seven layers that unpack to 1 GiB each.
    let img = t.path().join("unsigned.tar");
    let mut layers = vec![&signed];
    layers.extend([zeros; MAX_LAYERS - 2]);
    layers.push(&binary);
    craft(&img, &layers);
    let dest = t.path().join("dest");

    // Signed by another key than the one trusted.
    let (got, unpacked, opened) = extract_work(&img, &dest, &trusting(key(2).public_key()));
    let e = format!("{:#}", got.unwrap_err());
    assert!(
        e.contains("refusing the installer image before unpacking its payload")
            && e.contains(&format!(
                "is signed by key {} but the trusted key is {}",
                signer().key_id(),
                key(2).key_id()
            )),
        "{e}"
    );
    // Only the first layer was read, a few KB of it.
    assert_eq!(opened, 1);
    assert_eq!(unpacked, signed.bytes.len() as u64);
    assert_empty(&dest, "another key");

    // The right key, but the manifest changed after it was signed.
    let mut forged = signed.clone();
    let at = forged
        .bytes
        .windows(7)
        .position(|w| w == b"\"metal\"")
        .unwrap();
    forged.bytes[at + 1] = b'M';
    forged.diff_id = digest_of(&forged.bytes);
    layers[0] = &forged;
    craft(&img, &layers);
    let (got, unpacked, opened) = extract_work(&img, &dest, &trusting(signer().public_key()));
    let e = format!("{:#}", got.unwrap_err());
    assert!(
        e.contains("refusing the installer image before unpacking its payload")
            && e.contains("signature manifest.json.sig does not match manifest.json"),
        "{e}"
    );
    assert_eq!((opened, unpacked), (1, forged.bytes.len() as u64));
    assert_empty(&dest, "forged");

    // The huge layer first: refused after at most MAX_SMALL bytes of it.
    layers[0] = zeros;
    craft(&img, &layers);
    let (got, unpacked, opened) = extract_work(&img, &dest, &trusting(signer().public_key()));
    let e = format!("{:#}", got.unwrap_err());
    // (It holds a kernel: refused at that entry's header.)
    assert!(
        e.contains(
            "the first layer holds \"usr/install/amd64/vmlinuz\": it must hold only the \
             signed manifest"
        ),
        "{e}"
    );
    assert_eq!(opened, 1);
    assert!(unpacked <= MAX_SMALL + 1, "{unpacked}");
    assert_empty(&dest, "huge first layer");
}

#[test]
fn too_many_layers_are_refused_before_any_is_read() {
    let t = tempfile::tempdir().unwrap();
    let [signed, payload, binary] = blobs_in(t.path());
    let zeros = gib_of_zeros();
    let img = t.path().join("many.tar");
    let mut layers = vec![&signed, &payload];
    layers.extend([zeros; 100]);
    layers.push(&binary);
    craft(&img, &layers);
    let dest = t.path().join("dest");
    let (got, unpacked, opened) = extract_work(&img, &dest, &trusting(signer().public_key()));
    let e = format!("{:#}", got.unwrap_err());
    assert!(
        e.contains("the image has 103 layers, more than the 8 an installer image may have")
            && e.contains("before reading any layer"),
        "{e}"
    );
    assert_eq!((opened, unpacked), (0, 0));
    assert_empty(&dest, "many layers");

    // MAX_LAYERS is allowed (the payload is in the second).
    let mut layers = vec![&signed, &payload];
    layers.extend([&binary; MAX_LAYERS - 2]);
    craft(&img, &layers);
    let (got, _, opened) = extract_work(&img, &dest, &trusting(signer().public_key()));
    got.unwrap();
    assert_eq!(opened, 2);
}

#[test]
fn the_signed_sizes_bound_what_is_read() {
    let t = tempfile::tempdir().unwrap();
    let [signed, _, binary] = blobs_in(t.path());
    let dest = t.path().join("dest");
    let img = t.path().join("big.tar");
    let verify = trusting(signer().public_key());

    // The kernel is 1 GiB in the image, 5000 bytes in the signed manifest:
    // refused at its header, none of it read.
    craft(&img, &[&signed, gib_of_zeros(), &binary]);
    let (got, unpacked, opened) = extract_work(&img, &dest, &verify);
    let e = format!("{:#}", got.unwrap_err());
    assert!(
        e.contains(&format!(
            "usr/install/amd64/vmlinuz is {GIB} bytes in the image but the signed manifest \
             says 5000"
        )),
        "{e}"
    );
    assert_eq!(opened, 2);
    assert!(
        unpacked <= signed.bytes.len() as u64 + 512,
        "{unpacked} bytes unpacked"
    );
    assert_empty(&dest, "big kernel");

    // The listed files as signed, and 64 MiB of something else beside them:
    // refused once the layer unpacks to more than the signed sizes allow.
    let read = |n: &str| std::fs::read(t.path().join("payload").join(n)).unwrap();
    let (k, i, l) = (
        read(PAYLOAD_KERNEL),
        read(PAYLOAD_INITRAMFS),
        read(PAYLOAD_BOOT_LOADER),
    );
    let p = |n: &str| format!("{PAYLOAD_DIR}/{n}");
    let padded = streamed_layer(&[
        (&p(PAYLOAD_INITRAMFS), Data::Bytes(&i)),
        (&p("padding"), Data::Zeros(64 << 20)),
        (&p(PAYLOAD_BOOT_LOADER), Data::Bytes(&l)),
        (&p(PAYLOAD_KERNEL), Data::Bytes(&k)),
    ]);
    craft(&img, &[&signed, &padded, &binary]);
    let (got, unpacked, opened) = extract_work(&img, &dest, &verify);
    let e = format!("{:#}", got.unwrap_err());
    assert!(
        e.contains(&format!(
            "the payload layer unpacks to more than the {DECLARED} bytes the signed manifest \
             declares"
        )),
        "{e}"
    );
    assert_eq!(opened, 2);
    let bound = signed.bytes.len() as u64 + DECLARED + TAR_ALLOWANCE + 1;
    assert!(unpacked <= bound, "{unpacked} > {bound}");
    assert_empty(&dest, "padding");

    // A kernel of the signed size but other bytes.
    let mut other = k.clone();
    other[100] ^= 1;
    let changed = streamed_layer(&[
        (&p(PAYLOAD_INITRAMFS), Data::Bytes(&i)),
        (&p(PAYLOAD_BOOT_LOADER), Data::Bytes(&l)),
        (&p(PAYLOAD_KERNEL), Data::Bytes(&other)),
    ]);
    craft(&img, &[&signed, &changed, &binary]);
    let e = format!("{:#}", extract(&img, &dest).unwrap_err());
    assert!(
        e.contains("usr/install/amd64/vmlinuz is not the signed file")
            && e.contains("the image was changed"),
        "{e}"
    );
    assert_empty(&dest, "changed kernel");

    // An uncompressed payload layer far larger than the signed sizes is
    // refused before it is read.
    let big = raw_layer(|b| {
        payload_files(t.path(), &LISTED)(b);
        raw_entry(b, tar::EntryType::Regular, "junk", "", &vec![7u8; 4 << 20]);
    });
    craft(&img, &[&signed, &big, &binary]);
    let (got, unpacked, opened) = extract_work(&img, &dest, &verify);
    let e = format!("{:#}", got.unwrap_err());
    assert!(
        e.contains(&format!(
            "but the signed manifest declares {DECLARED} bytes"
        )) && e.contains("before reading it"),
        "{e}"
    );
    assert_eq!((opened, unpacked), (1, signed.bytes.len() as u64));
}

#[test]
fn compressed_layers_read_as_skopeo_copies_them() {
    let t = tempfile::tempdir().unwrap();
    let [signed, payload, binary] = blobs_in(t.path());
    for (what, c) in [("gzip", gzip as fn(&Blob) -> Blob), ("zstd", zstd)] {
        let img = t.path().join(format!("{what}.tar"));
        craft(&img, &[&c(&signed), &c(&payload), &c(&binary)]);
        let dest = t.path().join(what);
        extract(&img, &dest).unwrap();
        for name in LISTED.iter().chain(&SIGNED) {
            assert_eq!(
                std::fs::read(dest.join(name)).unwrap(),
                std::fs::read(t.path().join("payload").join(name)).unwrap(),
                "{what}: {name}"
            );
        }
    }
}

/// Writes the seeds of the `oci_archive` fuzz target (`fuzz/seeds/
/// oci_archive/`, see the README there): run with
/// `cargo test -p imager --lib oci::tests::write_fuzz_seeds -- --ignored`.
#[test]
#[ignore = "writes the fuzz seeds into the repository"]
fn write_fuzz_seeds() {
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds/oci_archive");
    std::fs::create_dir_all(&out).unwrap();
    let t = tempfile::tempdir().unwrap();
    // Small payload files keep the seeds small.
    let payload = payload_in(t.path());
    for (i, name) in LISTED.iter().enumerate() {
        std::fs::write(payload.join(name), vec![b'a' + i as u8; 40]).unwrap();
    }
    let artifacts = [Kind::Kernel, Kind::Initramfs, Kind::BootLoader]
        .into_iter()
        .zip(LISTED)
        .map(|(kind, name)| sign::describe(&payload, kind, name).unwrap())
        .collect();
    let m = Manifest::new("metal", "0.1.0", "p", EPOCH, artifacts);
    sign::write_signed_manifest(&payload, &m, &signer()).unwrap();
    let spec = spec_in_payload(t.path(), &payload);
    write_image(&out.join("installer.tar"), &spec).unwrap();
    let [signed, listed, binary] = [0, 1, 2].map(|i| layer_of(&spec.layers[i]));
    craft(
        &out.join("installer-gzip.tar"),
        &[&gzip(&signed), &gzip(&listed), &gzip(&binary)],
    );
    craft(
        &out.join("installer-zstd.tar"),
        &[&zstd(&signed), &zstd(&listed), &zstd(&binary)],
    );
    let mut old = spec.clone();
    old.layers = vec![old.layers.concat()];
    write_image(&out.join("one-layer.tar"), &old).unwrap();
    // Both architectures' images under one index (`imager index`).
    let name = "localhost/metal/installer:0.1.0";
    let both = [Arch::Amd64, Arch::Arm64].map(|a| image_of(&t.path().join("both"), a, name));
    combine(&out.join("index.tar"), &both).unwrap();
    // The same two images as the fuzz target's two halves (each padded
    // with zeros, past its tar end, to the same length): what reaches the
    // writing of an index.
    let [mut a, mut b] = both.map(|p| std::fs::read(p).unwrap());
    let len = a.len().max(b.len());
    a.resize(len, 0);
    b.resize(len, 0);
    std::fs::write(out.join("two-halves.tar"), [a, b].concat()).unwrap();
    for name in names(&out) {
        let len = std::fs::metadata(out.join(&name)).unwrap().len();
        assert!(len < 100 << 10, "{name}: {len} bytes");
    }
}

/// [`spec_in`] around an existing payload directory.
fn spec_in_payload(dir: &Path, payload: &Path) -> ImageSpec {
    let mut spec = spec_in(dir);
    for layer in &mut spec.layers[..2] {
        for e in layer {
            if let Entry::File { source, path, .. } = e {
                *source = payload.join(path.rsplit('/').next().unwrap());
            }
        }
    }
    spec
}

#[test]
fn image_paths_and_tags_are_checked() {
    let t = tempfile::tempdir().unwrap();
    let mut spec = spec_in(t.path());
    spec.layers[2].push(Entry::Symlink {
        path: "usr/../x".into(),
        target: "y".into(),
    });
    let e = format!(
        "{:#}",
        write_image(&t.path().join("x.tar"), &spec).unwrap_err()
    );
    assert!(e.contains("`..`"), "{e}");
    assert!(!t.path().join("x.tar").exists());
    // A file in two layers.
    let mut spec = spec_in(t.path());
    let dup = spec.layers[1][0].clone();
    spec.layers[2].push(dup);
    let e = format!(
        "{:#}",
        write_image(&t.path().join("x.tar"), &spec).unwrap_err()
    );
    assert!(e.contains("is given twice"), "{e}");
    let mut spec = spec_in(t.path());
    spec.ref_name = "localhost/metal/installer:1.0+-build".into();
    let e = format!(
        "{:#}",
        write_image(&t.path().join("x.tar"), &spec).unwrap_err()
    );
    assert!(e.contains("not an image reference name"), "{e}");
    for good in [
        "0.1.0",
        "localhost/metal/installer:0.1.0",
        "registry.example.com:5000/a/b-c_d:v1.2-rc.3",
        "ghcr.io/x/installer@sha256:0123abc",
        "a--b",
    ] {
        assert!(check_ref_name(good).is_ok(), "{good}");
    }
    for bad in [
        "",
        "/a",
        "a/",
        "a//b",
        "-a",
        "a-",
        "a..b",
        "a---b",
        "a-_b",
        "a:/b",
        "A B",
        "é",
        &"a".repeat(256),
    ] {
        assert!(check_ref_name(bad).is_err(), "{bad:?}");
    }
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

/// `imager sign --add KEY installer.tar`: the archive with the signature
/// added is byte for byte the archive a build that co-signed with the key
/// writes; its payload then passes a root that needs both keys, which the
/// archive before did not; adding the same signature again changes
/// nothing; an archive whose documents a build would not write is
/// refused untouched.
#[test]
fn a_signature_added_to_an_archive_gives_the_archive_a_cosigning_build_writes() {
    let t = tempfile::tempdir().unwrap();
    let (one, two) = (t.path().join("one"), t.path().join("two"));
    for d in [&one, &two] {
        std::fs::create_dir_all(d).unwrap();
    }
    let (a, b) = (one.join("installer.tar"), two.join("installer.tar"));
    write_image(&a, &spec_in(&one)).unwrap();
    // The same payload, signed in its build by the key and a co-signer.
    let payload = payload_in(&two);
    let cosigners: [Box<dyn Signer>; 1] = [Box::new(key(2))];
    let m = Manifest::parse(&std::fs::read(payload.join(PAYLOAD_MANIFEST)).unwrap()).unwrap();
    let signer = signer();
    sign::write_signed_manifest_with(
        &payload,
        &m,
        &sign::Signing {
            signer: &signer,
            cosigners: &cosigners,
            root: None,
        },
    )
    .unwrap();
    std::fs::write(two.join("imager"), b"\x7fELF not really").unwrap();
    let trust = [contract::paths::output::SIGNATURES];
    let spec = ImageSpec {
        layers: crate::build::installer_spec(
            &payload,
            &LISTED,
            &trust,
            &two.join("imager"),
            "0.1.0",
            EPOCH,
            contract::Arch::Amd64,
        )
        .layers,
        ..spec_in(&one)
    };
    write_image(&b, &spec).unwrap();

    let both = payload::trust::key_root(&[signer.public_key(), key(2).public_key()]).unwrap();
    let both = payload::root::Root::new(1, 2, both.keys).unwrap();
    let verify = |f: &TrustFiles| payload::trust::verify(&both, f).map(|t| t.manifest);
    assert!(extract_payload(&a, &t.path().join("x1"), Arch::Amd64, &verify).is_err());
    super::resign::add_signature(&a, &key(2)).unwrap();
    assert!(
        std::fs::read(&a).unwrap() == std::fs::read(&b).unwrap(),
        "the re-signed archive is not the co-signed build's"
    );
    extract_payload(&a, &t.path().join("x2"), Arch::Amd64, &verify).unwrap();
    super::resign::add_signature(&a, &key(2)).unwrap();
    assert!(std::fs::read(&a).unwrap() == std::fs::read(&b).unwrap());

    // Documents a build would not write for this payload (another epoch
    // than its manifest's; a registry copy with compressed layers is
    // refused by the same check): refused, nothing written.
    let gz = t.path().join("gz.tar");
    let mut spec = spec_in(&one);
    spec.epoch = EPOCH + 1;
    write_image(&gz, &spec).unwrap();
    let before = std::fs::read(&gz).unwrap();
    let e = format!(
        "{:#}",
        super::resign::add_signature(&gz, &key(2)).unwrap_err()
    );
    assert!(
        e.contains("not an installer archive as `imager build` writes it"),
        "{e}"
    );
    assert!(std::fs::read(&gz).unwrap() == before);
}

/// An installer archive of `arch` in `dir/<arch>.tar`: the test payload,
/// its signed manifest naming `arch`, the payload in `arch`'s directory.
fn image_of(dir: &Path, arch: Arch, ref_name: &str) -> PathBuf {
    image_with(dir, arch, ref_name, |_| {})
}

/// [`image_of`] with its payload manifest changed by `edit` (then signed).
fn image_with(dir: &Path, arch: Arch, ref_name: &str, edit: impl Fn(&mut Manifest)) -> PathBuf {
    let d = dir.join(arch.name());
    std::fs::create_dir_all(&d).unwrap();
    let payload = payload_in(&d);
    let mut m = Manifest::parse(&std::fs::read(payload.join(PAYLOAD_MANIFEST)).unwrap()).unwrap();
    m.set_arch(arch);
    edit(&mut m);
    sign::write_signed_manifest(&payload, &m, &signer()).unwrap();
    std::fs::write(d.join("imager"), b"\x7fELF not really").unwrap();
    let spec = ImageSpec {
        layers: crate::build::installer_spec(
            &payload,
            &LISTED,
            &[],
            &d.join("imager"),
            ref_name,
            EPOCH,
            arch,
        )
        .layers,
        entrypoint: vec!["/usr/bin/installer".into()],
        ref_name: ref_name.into(),
        epoch: EPOCH,
        arch,
    };
    let tar = dir.join(format!("{}.tar", arch.name()));
    write_image(&tar, &spec).unwrap();
    tar
}

/// The index of two architectures' images: each reader takes its own
/// platform's payload (the signed manifest saying so), the same inputs in
/// any order give the same bytes, and what cannot be one system's index is
/// refused.
#[test]
fn an_index_of_two_architectures_gives_each_its_own_payload() {
    let t = tempfile::tempdir().unwrap();
    let name = "localhost/metal/installer:0.1.0";
    let amd = image_of(t.path(), Arch::Amd64, name);
    let arm = image_of(t.path(), Arch::Arm64, name);
    let both = t.path().join("both.tar");
    let r = combine(&both, &[arm.clone(), amd.clone()]).unwrap();
    assert_eq!(r.images[0].0, "amd64");
    assert_eq!(r.images[1].0, "arm64");
    let again = t.path().join("again.tar");
    combine(&again, &[amd.clone(), arm.clone()]).unwrap();
    assert_eq!(
        std::fs::read(&both).unwrap(),
        std::fs::read(&again).unwrap()
    );
    let verify = trusting(signer().public_key());
    for arch in [Arch::Amd64, Arch::Arm64] {
        let dest = t.path().join(format!("x-{}", arch.name()));
        let dir = extract_payload(&both, &dest, arch, &verify).unwrap();
        let m = Manifest::parse(&std::fs::read(dir.join(PAYLOAD_MANIFEST)).unwrap()).unwrap();
        assert_eq!(m.arch().unwrap(), arch);
    }
    // A lone image of the other architecture, refused by its platform.
    let e = format!(
        "{:#}",
        extract_payload(&amd, &t.path().join("y"), Arch::Arm64, &verify).unwrap_err()
    );
    assert!(
        e.contains("the installer image is for \"amd64\", not arm64")
            && e.contains("nothing was written"),
        "{e}"
    );
    // Two of one architecture, or of two systems, make no index; nothing
    // is written.
    let e = format!(
        "{:#}",
        combine(&t.path().join("z1"), &[amd.clone(), amd.clone()]).unwrap_err()
    );
    assert!(e.contains("are both amd64 images"), "{e}");
    let other = image_of(
        &t.path().join("o"),
        Arch::Arm64,
        "localhost/other/installer:0.1.0",
    );
    let e = format!(
        "{:#}",
        combine(&t.path().join("z2"), &[amd.clone(), other]).unwrap_err()
    );
    assert!(
        e.contains("the images of one index are one system's version"),
        "{e}"
    );
    // The same reference name over another version of the payload.
    let later = image_with(&t.path().join("l"), Arch::Arm64, name, |m| {
        m.version = "0.2.0".into();
    });
    let e = format!(
        "{:#}",
        combine(&t.path().join("z3"), &[amd.clone(), later]).unwrap_err()
    );
    assert!(
        e.contains("holds \"metal\" 0.1.0 but") && e.contains("holds \"metal\" 0.2.0"),
        "{e}"
    );
    for z in ["z1", "z2", "z3"] {
        assert!(!t.path().join(z).exists());
    }
    // Signing an image adds to one image's manifest: an index of two is
    // refused by resign, saying why (push takes the index whole:
    // tests/arm64.rs pushes one to a registry).
    let e = format!(
        "{:#}",
        super::resign::add_signature(&both, &signer()).unwrap_err()
    );
    assert!(e.contains("index.json names 2 images"), "{e}");
}

/// The signed architecture is what counts: an image whose platform says
/// arm64 but whose signed manifest is amd64's is refused after the
/// signature check, before its payload is unpacked.
#[test]
fn a_platform_that_is_not_the_signed_architecture_is_refused() {
    let t = tempfile::tempdir().unwrap();
    // An amd64 payload (its manifest names no arch) laid out as arm64's
    // image.
    let tar = image_with(&t.path().join("p"), Arch::Arm64, "x", |m| {
        m.set_arch(Arch::Amd64);
    });
    let e = format!(
        "{:#}",
        extract_payload(
            &tar,
            &t.path().join("x"),
            Arch::Arm64,
            &trusting(signer().public_key())
        )
        .unwrap_err()
    );
    assert!(
        e.contains("the signed payload manifest is for amd64 but the image says arm64"),
        "{e}"
    );
    let x = t.path().join("x");
    assert!(!x.exists() || names(&x).is_empty(), "something unpacked");
    // Nor is it listed as arm64's in an index.
    let amd = image_of(&t.path().join("a"), Arch::Amd64, "x");
    let e = format!(
        "{:#}",
        combine(&t.path().join("both.tar"), &[amd, tar]).unwrap_err()
    );
    assert!(
        e.contains("its image says arm64 but its payload manifest amd64: refusing to list it"),
        "{e}"
    );
    assert!(!t.path().join("both.tar").exists());
}

/// An image index is pushed only when it names image manifests alone, at
/// least one (each is pushed before it): an empty one, or one naming
/// another index or an unknown kind, is refused before anything is sent,
/// with the entry's media type escaped.
#[test]
fn only_an_index_of_images_is_pushed() {
    let entry = |media: &str| {
        format!(
            r#"{{"mediaType":"{media}","digest":"sha256:{}","size":1}}"#,
            "a".repeat(64)
        )
    };
    let index = |entries: &[String]| {
        format!(
            r#"{{"schemaVersion":2,"mediaType":"{}","manifests":[{}]}}"#,
            super::MEDIA_TYPE_INDEX,
            entries.join(",")
        )
        .into_bytes()
    };
    let image = entry(super::MEDIA_TYPE_MANIFEST);
    super::push::check_pushable_index(&index(&[image.clone(), image.clone()])).unwrap();
    let e = super::push::check_pushable_index(&index(&[])).unwrap_err();
    assert!(format!("{e:#}").contains("names no image"), "{e:#}");
    for (media, shown) in [
        (super::MEDIA_TYPE_INDEX, super::MEDIA_TYPE_INDEX),
        ("text/\\u001b[31mred", "text/\\u{1b}[31mred"),
    ] {
        let e =
            super::push::check_pushable_index(&index(&[image.clone(), entry(media)])).unwrap_err();
        let said = format!("{e:#}");
        assert!(said.contains("only image manifests are pushed"), "{said}");
        assert!(said.contains(shown), "{said}");
        assert!(!said.contains('\u{1b}'), "{said}");
    }
}

/// A blob two image manifests of one index list with different sizes is
/// refused before anything is pushed; the same blob at the same size (a
/// layer the architectures share) is fine.
#[test]
fn a_blob_listed_with_two_sizes_is_not_pushed() {
    let manifest = |layer_size: u64| -> super::store::ImageManifest {
        serde_json::from_str(&format!(
            r#"{{"schemaVersion":2,"mediaType":"{}",
                "config":{{"mediaType":"c","digest":"sha256:{c}","size":10}},
                "layers":[{{"mediaType":"l","digest":"sha256:{l}","size":{layer_size}}}]}}"#,
            super::MEDIA_TYPE_MANIFEST,
            c = "c".repeat(64),
            l = "1".repeat(64),
        ))
        .unwrap()
    };
    let (a, b, c) = (manifest(100), manifest(100), manifest(101));
    super::push::check_blob_sizes(&[&a, &b]).unwrap();
    let e = super::push::check_blob_sizes(&[&a, &c]).unwrap_err();
    assert!(
        format!("{e:#}").contains("is 100 bytes in one image manifest and 101 in another"),
        "{e:#}"
    );
}
