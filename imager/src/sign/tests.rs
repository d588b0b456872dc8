//! Tests of keys, manifests and verification, including interoperability
//! with the real `openssl` binary (which must be installed).

use super::*;
use crate::artifact::{Artifact, Kind};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn openssl(args: &[&str]) -> Output {
    Command::new(crate::disk::testutil::tool("openssl"))
        .args(args)
        .output()
        .expect("the openssl binary is required by the interop tests")
}

fn openssl_ok(args: &[&str]) -> Vec<u8> {
    let out = openssl(args);
    assert!(
        out.status.success(),
        "openssl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

fn s(p: &Path) -> &str {
    p.to_str().expect("test paths are UTF-8")
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

fn flip(path: &Path, at: usize) {
    let mut b = std::fs::read(path).unwrap();
    b[at] ^= 0x01;
    std::fs::write(path, b).unwrap();
}

/// The artifacts of the fixture: (kind, path, size). No raw disk: verify
/// checks a raw disk's partition table too, and the smallest disk of the
/// layout is 804 MiB (tests/outputs.rs verifies built disks).
const FILES: &[(Kind, &str, usize)] = &[
    (Kind::Kernel, "vmlinuz", 3000),
    (Kind::Initramfs, "initramfs.cpio.zst", 1500),
    (Kind::Rootfs, "rootfs.sqsh", 200 * 1024),
    (Kind::Iso, "iso/image.iso", 4096),
];

struct Fixture {
    _tmp: tempfile::TempDir,
    keys: PathBuf,
    out: PathBuf,
    signer: FileSigner,
    public: VerifyingKey,
    manifest: PathBuf,
    sig: PathBuf,
}

impl Fixture {
    fn new() -> Fixture {
        let tmp = tempfile::tempdir().unwrap();
        let keys = tmp.path().join("keys");
        let out = tmp.path().join("out");
        keygen(&keys.join("k.key"), &keys.join("k.pub"), false).unwrap();
        let signer = FileSigner::load(&keys.join("k.key")).unwrap();
        let public = load_public_key(&keys.join("k.pub")).unwrap();
        let mut artifacts = Vec::new();
        for (i, (kind, path, size)) in FILES.iter().enumerate() {
            let p = out.join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            let bytes: Vec<u8> = (0..*size).map(|j| (j * 7 + i * 13) as u8).collect();
            std::fs::write(&p, bytes).unwrap();
            artifacts.push(describe(&out, *kind, path).unwrap());
        }
        let m = Manifest::new("talos-like", "1.2.3", "metal", 1_700_000_000, artifacts);
        let (manifest, sig) = write_signed_manifest(&out, &m, &signer).unwrap();
        Fixture {
            _tmp: tmp,
            keys,
            out,
            signer,
            public,
            manifest,
            sig,
        }
    }

    fn verify(&self) -> Result<VerifyReport, String> {
        verify(&self.manifest, &self.public).map_err(|e| format!("{e:#}"))
    }

    /// Runs the CLI runner with the fixture's key; (exit code, stdout).
    fn cli(&self, json: bool) -> (i32, String) {
        let args = VerifyOptions {
            manifest: self.out.clone(),
            key: Some(self.keys.join("k.pub")),
            json,
        };
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let code = run_verify_to(&args, Path::new("/nonexistent"), &mut out, &mut err).unwrap();
        (code, String::from_utf8(out).unwrap())
    }
}

// ---------------------------------------------------------------- keys

#[test]
fn keygen_writes_a_0600_private_key_and_refuses_to_overwrite() {
    let tmp = tempfile::tempdir().unwrap();
    let (private, public) = (tmp.path().join("keys/a.key"), tmp.path().join("keys/a.pub"));
    let id = keygen(&private, &public, false).unwrap();
    assert_eq!(mode(&private), 0o600);
    assert_eq!(mode(&public), 0o644);
    assert_eq!(mode(&tmp.path().join("keys")), 0o700);
    let pem = std::fs::read_to_string(&private).unwrap();
    assert!(pem.starts_with("-----BEGIN PRIVATE KEY-----\n"), "{pem}");
    assert!(
        std::fs::read_to_string(&public)
            .unwrap()
            .starts_with("-----BEGIN PUBLIC KEY-----\n")
    );
    assert_eq!(id, FileSigner::load(&private).unwrap().key_id());

    // A second keygen without --force changes nothing.
    let err = format!("{:#}", keygen(&private, &public, false).unwrap_err());
    assert!(
        err.contains("already exists") && err.contains("--force"),
        "{err}"
    );
    assert_eq!(std::fs::read_to_string(&private).unwrap(), pem);
    // Nor when only the public key exists.
    let other = tmp.path().join("keys/b.key");
    let err = format!("{:#}", keygen(&other, &public, false).unwrap_err());
    assert!(
        err.contains("public key") && err.contains("already exists"),
        "{err}"
    );
    assert!(!other.exists());
    // Same file for both halves is refused.
    assert!(keygen(&other, &other, true).is_err());

    // --force replaces the pair, still 0600.
    let id2 = keygen(&private, &public, true).unwrap();
    assert_ne!(id, id2);
    assert_ne!(std::fs::read_to_string(&private).unwrap(), pem);
    assert_eq!(mode(&private), 0o600);
    assert_eq!(
        load_public_key(&public).unwrap(),
        FileSigner::load(&private).unwrap().public_key()
    );
    // No temporary files left behind.
    let names: Vec<String> = std::fs::read_dir(tmp.path().join("keys"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
}

/// Issue 8, keys and targets: one file named two ways is refused with
/// nothing written; a pair is written all or nothing; nothing that is not a
/// regular file is replaced, even with --force.
#[test]
fn keygen_refuses_one_file_twice_and_writes_the_pair_whole() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // `k` and `./k`, and a link to k: one file.
    let cwd = std::env::current_dir().unwrap();
    let k = d.join("k");
    let dot = d.join(".").join("k");
    let e = format!("{:#}", keygen(&k, &dot, false).unwrap_err());
    assert!(e.contains("must be different files"), "{e}");
    assert!(!k.exists(), "nothing was written");
    std::os::unix::fs::symlink(&k, d.join("link")).unwrap();
    std::fs::write(&k, "old").unwrap();
    let e = format!("{:#}", keygen(&k, &d.join("link"), true).unwrap_err());
    assert!(e.contains("must be different files"), "{e}");
    assert_eq!(std::fs::read_to_string(&k).unwrap(), "old");
    assert_eq!(std::env::current_dir().unwrap(), cwd);

    // A public key that cannot be written (its directory is a file): no
    // private key is left behind; with --force, the old one comes back.
    let blocker = d.join("blocker");
    std::fs::write(&blocker, "a file").unwrap();
    let private = d.join("new.key");
    assert!(keygen(&private, &blocker.join("new.pub"), false).is_err());
    assert!(!private.exists(), "half a pair was left");
    let (old_private, old_public) = (d.join("old.key"), d.join("old.pub"));
    keygen(&old_private, &old_public, false).unwrap();
    let before = std::fs::read(&old_private).unwrap();
    assert!(keygen(&old_private, &blocker.join("x.pub"), true).is_err());
    assert_eq!(
        std::fs::read(&old_private).unwrap(),
        before,
        "the old key came back"
    );

    // A FIFO or a directory in the way: refused, left as it is.
    let fifo = d.join("fifo");
    assert!(
        Command::new(crate::disk::testutil::tool("mkfifo"))
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    for target in [&fifo, &d.to_path_buf()] {
        let e = format!("{:#}", keygen(target, &d.join("p.pub"), true).unwrap_err());
        assert!(e.contains("is not a regular file"), "{e}");
        let e = format!("{:#}", keygen(&d.join("p.key"), target, true).unwrap_err());
        assert!(e.contains("is not a regular file"), "{e}");
    }
    use std::os::unix::fs::FileTypeExt;
    assert!(
        std::fs::symlink_metadata(&fifo)
            .unwrap()
            .file_type()
            .is_fifo()
    );
    assert!(!d.join("p.key").exists() && !d.join("p.pub").exists());
}

#[test]
fn key_id_is_sha256_of_the_raw_public_key() {
    let tmp = tempfile::tempdir().unwrap();
    let (private, public) = (tmp.path().join("k.key"), tmp.path().join("k.pub"));
    let id = keygen(&private, &public, false).unwrap();
    // The raw key is the last 32 bytes of the SPKI DER, as openssl sees it.
    let der = openssl_ok(&["pkey", "-pubin", "-in", s(&public), "-outform", "DER"]);
    assert_eq!(der.len(), 44);
    let digest = openssl_ok_stdin(&["dgst", "-sha256", "-r"], &der[12..]);
    let hexd = String::from_utf8(digest).unwrap();
    assert_eq!(id, format!("ed25519:{}", &hexd[..16]));
    assert_eq!(id.len(), "ed25519:".len() + 16);
}

fn openssl_ok_stdin(args: &[&str], input: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut child = Command::new(crate::disk::testutil::tool("openssl"))
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("the openssl binary is required by the interop tests");
    child.stdin.take().unwrap().write_all(input).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    out.stdout
}

#[test]
fn openssl_derives_the_same_public_key_from_our_private_key() {
    let tmp = tempfile::tempdir().unwrap();
    let (private, public) = (tmp.path().join("k.key"), tmp.path().join("k.pub"));
    keygen(&private, &public, false).unwrap();
    let derived = openssl_ok(&["pkey", "-in", s(&private), "-pubout"]);
    assert_eq!(
        String::from_utf8(derived).unwrap(),
        std::fs::read_to_string(&public).unwrap()
    );
}

#[test]
fn openssl_verifies_our_signature_and_rejects_a_modified_manifest() {
    let f = Fixture::new();
    let pubk = f.keys.join("k.pub");
    let args = [
        "pkeyutl",
        "-verify",
        "-pubin",
        "-inkey",
        s(&pubk),
        "-rawin",
        "-in",
        s(&f.manifest),
        "-sigfile",
        s(&f.sig),
    ];
    let out = openssl(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("Signature Verified Successfully"));
    flip(&f.manifest, 10);
    assert!(!openssl(&args).status.success());
}

#[test]
fn we_read_openssl_keys_and_sign_exactly_like_openssl() {
    let f = Fixture::new();
    let dir = f._tmp.path();
    let (key, pubk, sig) = (dir.join("o.key"), dir.join("o.pub"), dir.join("o.sig"));
    openssl_ok(&["genpkey", "-algorithm", "ed25519", "-out", s(&key)]);
    openssl_ok(&["pkey", "-in", s(&key), "-pubout", "-out", s(&pubk)]);
    let signer = FileSigner::load(&key).unwrap();
    let public = load_public_key(&pubk).unwrap();
    assert_eq!(signer.public_key(), public);
    // Our PEM encodings are byte-identical to openssl's.
    assert_eq!(
        public_key_pem(&public).unwrap(),
        std::fs::read_to_string(&pubk).unwrap()
    );

    // Re-sign the fixture's manifest with the openssl key; ed25519 is
    // deterministic, so openssl's signature must equal ours byte for byte.
    let m: Manifest = serde_json::from_slice(&std::fs::read(&f.manifest).unwrap()).unwrap();
    write_signed_manifest(&f.out, &m, &signer).unwrap();
    openssl_ok(&[
        "pkeyutl",
        "-sign",
        "-inkey",
        s(&key),
        "-rawin",
        "-in",
        s(&f.manifest),
        "-out",
        s(&sig),
    ]);
    assert_eq!(std::fs::read(&sig).unwrap(), std::fs::read(&f.sig).unwrap());
    let report = verify(&f.manifest, &public).unwrap();
    assert!(report.ok);
    assert_eq!(report.key_id, key_id(&public));
}

#[test]
fn load_public_key_formats_and_errors() {
    let f = Fixture::new();
    let dir = f._tmp.path();
    // Raw 32 bytes as hex.
    let hexfile = dir.join("k.hex");
    std::fs::write(&hexfile, format!("{}\n", hex::encode(f.public.as_bytes()))).unwrap();
    assert_eq!(load_public_key(&hexfile).unwrap(), f.public);
    // A private key is not accepted as the trusted key.
    let err = format!("{:#}", load_public_key(&f.keys.join("k.key")).unwrap_err());
    assert!(err.contains("this is a private key"), "{err}");
    // Garbage.
    let junk = dir.join("junk.pub");
    std::fs::write(&junk, "hello").unwrap();
    let err = format!("{:#}", load_public_key(&junk).unwrap_err());
    assert!(err.contains("not an ed25519 public key in PEM"), "{err}");
    // Another algorithm's public key.
    let (ec, ecpub) = (dir.join("ec.key"), dir.join("ec.pub"));
    openssl_ok(&[
        "genpkey",
        "-algorithm",
        "EC",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-out",
        s(&ec),
    ]);
    openssl_ok(&["pkey", "-in", s(&ec), "-pubout", "-out", s(&ecpub)]);
    let err = format!("{:#}", load_public_key(&ecpub).unwrap_err());
    assert!(err.contains("not an ed25519 public key in PEM"), "{err}");
    // And the signer refuses an EC private key and a public key.
    let err = format!("{:#}", FileSigner::load(&ec).unwrap_err());
    assert!(err.contains("not an ed25519 private key"), "{err}");
    let err = format!("{:#}", FileSigner::load(&f.keys.join("k.pub")).unwrap_err());
    assert!(err.contains("this is a public key"), "{err}");
    // Debug never shows the key material.
    let dbg = format!("{:?}", f.signer);
    assert!(dbg.contains("ed25519:") && !dbg.contains(&hex::encode(f.signer.key.to_bytes())));
}

#[test]
fn dev_key_is_created_once_then_loaded() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("out/keys");
    let (a, created) = load_or_create_dev_key(&dir).unwrap();
    assert!(created);
    assert_eq!(mode(&dir.join(DEV_KEY)), 0o600);
    assert_eq!(load_public_key(&dir.join(DEV_PUB)).unwrap(), a.public_key());
    let (b, created) = load_or_create_dev_key(&dir).unwrap();
    assert!(!created);
    assert_eq!(a.key_id(), b.key_id());
    // dev.pub is derived: restored when lost or wrong.
    std::fs::write(dir.join(DEV_PUB), "stale").unwrap();
    let (c, created) = load_or_create_dev_key(&dir).unwrap();
    assert!(!created);
    assert_eq!(load_public_key(&dir.join(DEV_PUB)).unwrap(), c.public_key());
}

// ---------------------------------------------------------------- verify

#[test]
fn verify_accepts_a_good_set() {
    let f = Fixture::new();
    let r = f.verify().unwrap();
    assert!(r.ok, "{r:?}");
    assert_eq!(r.problems, 0);
    assert_eq!(r.artifacts.len(), FILES.len());
    assert!(r.artifacts.iter().all(ArtifactCheck::is_ok));
    assert_eq!(r.key_id, f.signer.key_id());
    assert_eq!(
        (r.name.as_str(), r.version.as_str(), r.profile.as_str()),
        ("talos-like", "1.2.3", "metal")
    );
    r.ensure_ok().unwrap();
    // A directory works as well as the manifest path.
    assert!(verify(&f.out, &f.public).unwrap().ok);

    let (code, out) = f.cli(false);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("ok  rootfs rootfs.sqsh\n"), "{out}");
    assert!(out.contains("ok  iso iso/image.iso\n"), "{out}");
    assert!(
        out.ends_with(&format!(
            "verify: OK (4 artifacts, key {})\n",
            f.signer.key_id()
        )),
        "{out}"
    );

    let (code, out) = f.cli(true);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["ok"], true);
    assert_eq!(v["artifacts"][0]["status"], "ok");
    assert_eq!(v["artifacts"].as_array().unwrap().len(), 4);
}

/// What an install or upgrade verifies of a payload directory: every
/// artifact but the images (here the ISO), which it never reads; a damaged
/// image passes there and fails the full verify, a damaged kernel fails
/// both.
#[test]
fn verify_payload_leaves_the_images_out() {
    let f = Fixture::new();
    let root = payload::trust::key_root(&[f.public]).unwrap();
    let payload = || crate::sign::verify_payload(&f.manifest, &root).unwrap().0;
    let mut listed: Vec<Kind> = payload().artifacts.iter().map(|a| a.kind).collect();
    listed.sort();
    assert_eq!(listed, [Kind::Kernel, Kind::Initramfs, Kind::Rootfs]);
    flip(&f.out.join("iso/image.iso"), 10);
    assert!(payload().ok);
    assert!(!f.verify().unwrap().ok);
    flip(&f.out.join("vmlinuz"), 10);
    let r = payload();
    assert!(!r.ok && r.problems == 1, "{r:?}");
}

#[test]
fn a_flipped_byte_in_each_artifact_is_named() {
    let f = Fixture::new();
    for (kind, path, size) in FILES {
        let p = f.out.join(path);
        flip(&p, size / 2);
        let r = f.verify().unwrap();
        assert!(!r.ok);
        assert_eq!(r.problems, 1, "{r:?}");
        let (actual, _) = crate::io::sha256_file(&p).unwrap();
        for a in &r.artifacts {
            if a.path == *path {
                assert_eq!(a.kind, *kind);
                let Status::DigestDiffers { manifest, file } = &a.status else {
                    panic!("{path}: {:?}", a.status);
                };
                assert_eq!(file, &actual);
                assert_ne!(manifest, &actual);
                let line = a.line();
                assert!(
                    line.starts_with(&format!(
                        "BAD {} {path}: sha256 differs (manifest ",
                        kind.name()
                    )),
                    "{line}"
                );
            } else {
                assert!(a.is_ok(), "{a:?}");
            }
        }
        let err = format!("{:#}", r.ensure_ok().unwrap_err());
        assert!(err.contains(path), "{err}");
        let (code, out) = f.cli(false);
        assert_eq!(code, 1);
        assert!(out.ends_with("verify: FAILED (1 problem)\n"), "{out}");
        flip(&p, size / 2);
        assert!(f.verify().unwrap().ok);
    }
}

#[test]
fn all_artifact_problems_are_reported_at_once() {
    let f = Fixture::new();
    std::fs::remove_file(f.out.join("vmlinuz")).unwrap();
    let raw = f.out.join("rootfs.sqsh");
    let len = std::fs::metadata(&raw).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&raw)
        .unwrap()
        .set_len(len - 1)
        .unwrap();
    flip(&f.out.join("initramfs.cpio.zst"), 0);
    std::fs::remove_file(f.out.join("iso/image.iso")).unwrap();
    std::fs::create_dir(f.out.join("iso/image.iso")).unwrap();

    let r = f.verify().unwrap();
    assert_eq!(r.problems, 4);
    let status = |p: &str| {
        r.artifacts
            .iter()
            .find(|a| a.path == p)
            .unwrap()
            .status
            .clone()
    };
    assert_eq!(status("vmlinuz"), Status::Missing);
    assert_eq!(
        status("rootfs.sqsh"),
        Status::SizeDiffers {
            manifest: len,
            file: len - 1
        }
    );
    assert!(matches!(
        status("initramfs.cpio.zst"),
        Status::DigestDiffers { .. }
    ));
    assert_eq!(status("iso/image.iso"), Status::NotAFile);

    let (code, out) = f.cli(false);
    assert_eq!(code, 1);
    assert!(out.contains("BAD kernel vmlinuz: missing\n"), "{out}");
    assert!(
        out.contains(&format!(
            "BAD rootfs rootfs.sqsh: size differs (manifest {len} bytes, file {} bytes)\n",
            len - 1
        )),
        "{out}"
    );
    assert!(
        out.contains("BAD initramfs initramfs.cpio.zst: sha256 differs"),
        "{out}"
    );
    assert!(
        out.contains("BAD iso iso/image.iso: not a regular file"),
        "{out}"
    );
    assert!(out.ends_with("verify: FAILED (4 problems)\n"), "{out}");
    let v: serde_json::Value = serde_json::from_str(&f.cli(true).1).unwrap();
    assert_eq!(v["ok"], false);
    assert_eq!(v["problems"], 4);
    let raw_entry = v["artifacts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["path"] == "rootfs.sqsh")
        .unwrap();
    assert_eq!(raw_entry["status"], "size-differs");
    assert_eq!(raw_entry["file"], len - 1);
}

#[test]
fn any_flipped_byte_of_the_manifest_or_signature_fails() {
    let f = Fixture::new();
    // Every 7th byte, the whole key_id line and the final newline (every
    // byte would take ~20 s with the unoptimized ed25519 of test builds).
    let text = std::fs::read_to_string(&f.manifest).unwrap();
    let kid = text.find("\"key_id\"").unwrap();
    let mut positions: Vec<usize> = (0..text.len()).step_by(7).collect();
    positions.extend(kid..kid + 40);
    positions.push(text.len() - 1);
    for at in positions {
        flip(&f.manifest, at);
        assert!(
            f.verify().is_err(),
            "flipping manifest byte {at} went unnoticed"
        );
        flip(&f.manifest, at);
    }
    // A change outside key_id is reported as a modification.
    flip(&f.manifest, text.find("talos-like").unwrap());
    let err = f.verify().unwrap_err();
    assert!(
        err.contains("the manifest was modified after signing"),
        "{err}"
    );
    let (code, out) = f.cli(false);
    assert_eq!(code, 1);
    assert!(out.ends_with("verify: FAILED (1 problem)\n"), "{out}");
    let v: serde_json::Value = serde_json::from_str(&f.cli(true).1).unwrap();
    assert_eq!(v["ok"], false);
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("modified after signing")
    );
    flip(&f.manifest, text.find("talos-like").unwrap());

    for at in 0..64 {
        flip(&f.sig, at);
        let err = f.verify().unwrap_err();
        assert!(err.contains("does not match"), "signature byte {at}: {err}");
        flip(&f.sig, at);
    }
    assert!(f.verify().unwrap().ok);

    let sig = std::fs::read(&f.sig).unwrap();
    std::fs::write(&f.sig, &sig[..63]).unwrap();
    let err = f.verify().unwrap_err();
    assert!(err.contains("is 63 bytes"), "{err}");
    std::fs::remove_file(&f.sig).unwrap();
    let err = f.verify().unwrap_err();
    assert!(err.contains("is missing"), "{err}");
}

#[test]
fn a_wrong_public_key_names_both_keys() {
    let f = Fixture::new();
    let dir = f._tmp.path();
    let other = keygen(&dir.join("o.key"), &dir.join("o.pub"), false).unwrap();
    let key = load_public_key(&dir.join("o.pub")).unwrap();
    let err = format!("{:#}", verify(&f.manifest, &key).unwrap_err());
    assert!(
        err.contains(&format!(
            "is signed by key {} but the trusted key is {other}: pass --key with the public key that signed it",
            f.signer.key_id()
        )),
        "{err}"
    );
}

#[test]
fn unsafe_paths_are_refused_when_signing_and_when_verifying() {
    // Which paths are unsafe is payload::manifest::check_path's, tested
    // there; here, that signing and verifying both apply it.
    let f = Fixture::new();
    let mut m: Manifest = serde_json::from_slice(&std::fs::read(&f.manifest).unwrap()).unwrap();
    // A file outside the directory with the right digest: must still be refused.
    let outside = f._tmp.path().join("secret");
    std::fs::write(&outside, b"secret").unwrap();
    let mut a = describe(f._tmp.path(), Kind::Rootfs, "secret").unwrap();
    a.path = "../secret".into();
    m.artifacts.push(a.clone());
    let err = format!(
        "{:#}",
        write_signed_manifest(&f.out, &m, &f.signer).unwrap_err()
    );
    assert!(err.contains("../secret") && err.contains(".."), "{err}");

    // A manifest signed by someone else's tooling (bypassing our writer).
    let mut abs = a.clone();
    abs.path = outside.display().to_string();
    m.artifacts.push(abs.clone());
    let mut bytes = serde_json::to_vec_pretty(&m).unwrap();
    bytes.push(b'\n');
    std::fs::write(&f.manifest, &bytes).unwrap();
    std::fs::write(&f.sig, f.signer.sign(&bytes).unwrap().to_bytes()).unwrap();
    let r = f.verify().unwrap();
    assert!(!r.ok);
    assert_eq!(r.problems, 2);
    let reason = |p: &str| match &r.artifacts.iter().find(|a| a.path == p).unwrap().status {
        Status::Invalid { reason } => reason.clone(),
        other => panic!("{p}: {other:?}"),
    };
    assert!(reason("../secret").contains("`..`"));
    assert!(reason(&abs.path).contains("absolute"));
}

#[test]
fn signed_but_invalid_manifests_are_refused() {
    let f = Fixture::new();
    let text = std::fs::read_to_string(&f.manifest).unwrap();
    let resign = |t: &str| {
        std::fs::write(&f.manifest, t).unwrap();
        std::fs::write(&f.sig, f.signer.sign(t.as_bytes()).unwrap().to_bytes()).unwrap();
        f.verify()
    };
    let err =
        resign(&text.replace("\"format\": 1,", "\"format\": 1,\n  \"extra\": true,")).unwrap_err();
    assert!(err.contains("unknown field"), "{err}");
    let err = resign(&text.replace("\"format\": 1,", "\"format\": 2,")).unwrap_err();
    assert!(err.contains("format 2 is not supported"), "{err}");
    let err = resign(&text.replace(&f.signer.key_id(), "ed25519:0000000000000000")).unwrap_err();
    assert!(err.contains("names key ed25519:0000000000000000"), "{err}");
    let dup = {
        let mut m: Manifest = serde_json::from_str(&text).unwrap();
        m.artifacts.push(m.artifacts[0].clone());
        serde_json::to_string_pretty(&m).unwrap()
    };
    let r = resign(&dup).unwrap();
    assert_eq!(r.problems, 1);
    assert!(resign(&text).unwrap().ok);
}

#[test]
fn signing_refuses_a_manifest_that_does_not_match_the_directory() {
    let f = Fixture::new();
    let m: Manifest = serde_json::from_slice(&std::fs::read(&f.manifest).unwrap()).unwrap();
    std::fs::write(f.out.join("vmlinuz"), b"short").unwrap();
    std::fs::remove_file(f.out.join("rootfs.sqsh")).unwrap();
    let before = std::fs::read(&f.manifest).unwrap();
    let err = format!(
        "{:#}",
        write_signed_manifest(&f.out, &m, &f.signer).unwrap_err()
    );
    assert!(
        err.contains("vmlinuz") && err.contains("rootfs.sqsh"),
        "{err}"
    );
    // The old signed pair is untouched.
    assert_eq!(std::fs::read(&f.manifest).unwrap(), before);
}

/// A signer that returns garbage: nothing may be written.
struct Broken(VerifyingKey);
impl Signer for Broken {
    fn public_key(&self) -> VerifyingKey {
        self.0
    }
    fn sign(&self, _: &[u8]) -> anyhow::Result<Signature> {
        Ok(Signature::from_bytes(&[7u8; 64]))
    }
}

#[test]
fn a_faulty_signer_writes_nothing() {
    let f = Fixture::new();
    let m: Manifest = serde_json::from_slice(&std::fs::read(&f.manifest).unwrap()).unwrap();
    let fresh = f._tmp.path().join("fresh");
    std::fs::create_dir(&fresh).unwrap();
    std::fs::copy(f.out.join("vmlinuz"), fresh.join("vmlinuz")).unwrap();
    let mut m1 = m.clone();
    m1.artifacts.retain(|a| a.path == "vmlinuz");
    assert!(write_signed_manifest(&fresh, &m1, &Broken(f.public)).is_err());
    assert!(!fresh.join(MANIFEST_NAME).exists() && !fresh.join(SIGNATURE_NAME).exists());
}

// ---------------------------------------------------------------- determinism

#[test]
fn manifest_bytes_are_canonical_and_deterministic() {
    let art = |kind, path: &str, c: char| Artifact {
        kind,
        path: path.into(),
        sha256: c.to_string().repeat(64),
        size: 42,
    };
    let a = Manifest {
        key_id: "ed25519:0123456789abcdef".into(),
        ..Manifest::new(
            "os",
            "1.0",
            "default",
            0,
            vec![
                art(Kind::Raw, "disk.raw", 'a'),
                art(Kind::Kernel, "vmlinuz", 'b'),
                art(Kind::Iso, "b.iso", 'c'),
            ],
        )
    };
    let mut b = a.clone();
    b.artifacts.reverse();
    let bytes = a.to_bytes().unwrap();
    assert_eq!(bytes, b.to_bytes().unwrap());
    let expected = format!(
        r#"{{
  "format": 1,
  "name": "os",
  "version": "1.0",
  "profile": "default",
  "source_date_epoch": 0,
  "key_id": "ed25519:0123456789abcdef",
  "artifacts": [
    {{
      "kind": "iso",
      "path": "b.iso",
      "sha256": "{c}",
      "size": 42
    }},
    {{
      "kind": "raw",
      "path": "disk.raw",
      "sha256": "{a}",
      "size": 42
    }},
    {{
      "kind": "kernel",
      "path": "vmlinuz",
      "sha256": "{b}",
      "size": 42
    }}
  ]
}}
"#,
        a = "a".repeat(64),
        b = "b".repeat(64),
        c = "c".repeat(64)
    );
    assert_eq!(String::from_utf8(bytes).unwrap(), expected);

    // Signing twice (artifacts in another order) gives identical files.
    let f = Fixture::new();
    let m1 = std::fs::read(&f.manifest).unwrap();
    let s1 = std::fs::read(&f.sig).unwrap();
    let mut m: Manifest = serde_json::from_slice(&m1).unwrap();
    m.artifacts.reverse();
    m.key_id = String::new();
    write_signed_manifest(&f.out, &m, &f.signer).unwrap();
    assert_eq!(std::fs::read(&f.manifest).unwrap(), m1);
    assert_eq!(std::fs::read(&f.sig).unwrap(), s1);
    // And no temporary files are left in the output directory.
    assert_eq!(
        crate::disk::testutil::sorted_names(&f.out),
        [
            "initramfs.cpio.zst",
            "iso",
            "manifest.json",
            "manifest.json.sig",
            "rootfs.sqsh",
            "vmlinuz"
        ]
    );
}

// ---------------------------------------------------------------- CLI
// (The argument parsing is tested with the binary, in cli/sign.rs.)

#[test]
fn verify_without_a_key_trusts_the_default_key_if_it_exists() {
    let f = Fixture::new();
    let args = VerifyOptions {
        manifest: f.manifest.clone(),
        key: None,
        json: false,
    };
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let e = run_verify_to(&args, &f.keys.join("missing.pub"), &mut out, &mut err).unwrap_err();
    assert!(format!("{e:#}").contains("no --key given"), "{e:#}");
    let code = run_verify_to(&args, &f.keys.join("k.pub"), &mut out, &mut err).unwrap();
    assert_eq!(code, 0);
    assert!(
        String::from_utf8(err)
            .unwrap()
            .contains("trusting the development public key")
    );
}
