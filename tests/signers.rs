//! Keys outside the build machine (docs/signing.md, "Where the signing key
//! lives"): the default profile built with its key in a file, on a
//! SoftHSM2 token named by a PKCS#11 URI, and behind an external signer
//! program gives the same bytes, every artifact and the signature; the
//! token's and the program's builds leave no private key on the build's
//! disk; a wrong PIN and a signer that signs with another key fail the
//! build with that said, and leave nothing.

// Test helpers panic on unexpected failures: that is how a test fails.
#![allow(clippy::unwrap_used)]

mod common;

use base64::Engine as _;
use common::*;
use std::path::{Path, PathBuf};

const SOFTHSM_MODULE: &str = "/usr/lib/softhsm/libsofthsm2.so";
const PIN: &str = "4711";

/// `imager build --profile metal --key KEY` into target/e2e/NAME with `env`:
/// its output (not asserted).
fn build(name: &str, key: &str, env: &[(&str, &Path)]) -> (PathBuf, std::process::Output) {
    let dir = scratch().join(name);
    let _ = std::fs::remove_dir_all(&dir);
    let mut cmd = imager();
    cmd.args([
        "build",
        "--profile",
        "metal",
        "--json",
        "--key",
        key,
        "--out",
    ])
    .arg(&dir);
    for (k, v) in env {
        cmd.env(k, v);
    }
    (dir, run(&mut cmd))
}

fn built(name: &str, key: &str, env: &[(&str, &Path)]) -> Build {
    let (dir, out) = build(name, key, env);
    assert!(
        out.status.success(),
        "{name}:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Build {
        dir,
        json: serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap(),
    }
}

/// Every artifact's digest, by kind, and the signature's bytes.
fn outputs(b: &Build) -> (Vec<(String, String)>, Vec<u8>) {
    let mut all: Vec<(String, String)> = b.json["artifacts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["kind"].as_str().unwrap().to_string(),
                a["sha256"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    all.sort();
    let sig = std::fs::read(b.dir.join("manifest.json.sig")).unwrap();
    (all, sig)
}

/// The raw 32-byte private key of a PKCS#8 ed25519 PEM (its DER's end).
fn seed_of(pem: &Path) -> Vec<u8> {
    let text = std::fs::read_to_string(pem).unwrap();
    let b64: String = text.lines().filter(|l| !l.starts_with("-----")).collect();
    let der = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .unwrap();
    der[der.len() - 32..].to_vec()
}

/// Whether the file at `path` holds `needle`, read 1 MiB at a time.
fn holds(path: &Path, needle: &[u8]) -> bool {
    use std::io::Read;
    let finder = memchr::memmem::Finder::new(needle);
    let mut f = std::fs::File::open(path).unwrap();
    let overlap = needle.len() - 1;
    let mut buf = vec![0u8; (1 << 20) + overlap];
    let mut kept = 0;
    loop {
        let n = f.read(&mut buf[kept..]).unwrap();
        if n == 0 {
            return false;
        }
        let end = kept + n;
        if finder.find(&buf[..end]).is_some() {
            return true;
        }
        kept = overlap.min(end);
        buf.copy_within(end - kept..end, 0);
    }
}

/// No file under `dir` holds a PEM private key or the key's raw bytes.
fn no_private_key_under(dir: &Path, seed: &[u8]) {
    let mut stack = vec![dir.to_path_buf()];
    let mut files = 0;
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let t = e.file_type().unwrap();
            if t.is_dir() {
                stack.push(e.path());
            } else if t.is_file() {
                files += 1;
                assert!(
                    !holds(&e.path(), b"PRIVATE KEY"),
                    "{} holds a PEM private key",
                    e.path().display()
                );
                assert!(
                    !holds(&e.path(), seed),
                    "{} holds the private key's bytes",
                    e.path().display()
                );
            }
        }
    }
    assert!(files > 5, "{} has only {files} files", dir.display());
}

/// A SoftHSM2 token in `dir` (its own configuration) holding `key` as
/// label `release`, id 01: the configuration file, for SOFTHSM2_CONF.
fn token_with(dir: &Path, key: &Path) -> PathBuf {
    let tokens = dir.join("tokens");
    std::fs::create_dir_all(&tokens).unwrap();
    let conf = dir.join("softhsm2.conf");
    std::fs::write(
        &conf,
        format!(
            "directories.tokendir = {}\nobjectstore.backend = file\nlog.level = ERROR\n",
            tokens.display()
        ),
    )
    .unwrap();
    let softhsm = |args: &[&str]| {
        let out = run(tool("softhsm2-util").env("SOFTHSM2_CONF", &conf).args(args));
        assert!(
            out.status.success(),
            "softhsm2-util {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    softhsm(&[
        "--init-token",
        "--free",
        "--label",
        "imager-test",
        "--pin",
        PIN,
        "--so-pin",
        "123456",
    ]);
    softhsm(&[
        "--import",
        key.to_str().unwrap(),
        "--token",
        "imager-test",
        "--label",
        "release",
        "--id",
        "01",
        "--pin",
        PIN,
    ]);
    conf
}

#[test]
fn a_token_and_an_external_signer_sign_the_same_bytes_as_the_key_file() {
    let dir = scratch().join("signers");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // The release key, made by openssl (the "HSM's" side of the test).
    let key = dir.join("release.pem");
    let out = run(tool("openssl")
        .args(["genpkey", "-algorithm", "ed25519", "-out"])
        .arg(&key));
    assert!(out.status.success());
    let seed = seed_of(&key);

    let file = built("signers-file", key.to_str().unwrap(), &[]);

    // PKCS#11: the key imported into a SoftHSM2 token; the PIN from a
    // file, as a CI secret would be.
    let hsm = dir.join("hsm");
    let conf = token_with(&hsm, &key);
    let pin = dir.join("pin");
    std::fs::write(&pin, format!("{PIN}\n")).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&pin, std::fs::Permissions::from_mode(0o600)).unwrap();
    let uri = format!(
        "pkcs11:token=imager-test;object=release?module-path={SOFTHSM_MODULE}&pin-source=file:{}",
        pin.display()
    );
    let token = built("signers-pkcs11", &uri, &[("SOFTHSM2_CONF", &conf)]);

    // An external signer program.
    let log = dir.join("signer.log");
    let program = repo().join("tests/common/external-signer.py");
    let exec = format!("exec:{}", program.display());
    let external = built(
        "signers-exec",
        &exec,
        &[("TEST_SIGNER_KEY", &key), ("TEST_SIGNER_LOG", &log)],
    );
    let asked = std::fs::read_to_string(&log).unwrap();
    assert!(asked.lines().any(|l| l == "public-key"), "{asked}");
    assert!(asked.lines().any(|l| l == "sign"), "{asked}");

    // The same bytes, whoever signed.
    let (want, want_sig) = outputs(&file);
    for (name, b) in [("pkcs11", &token), ("exec", &external)] {
        let (got, sig) = outputs(b);
        assert_eq!(got, want, "{name}: artifacts differ");
        assert_eq!(sig, want_sig, "{name}: signature differs");
        assert_eq!(b.json["key_id"], file.json["key_id"], "{name}");
        // And nothing of the private key in what the build wrote.
        no_private_key_under(&b.dir, &seed);
    }
    // The signature verifies with the public key, as a user checks it.
    let public = dir.join("release.pub");
    assert!(
        run(tool("openssl")
            .args(["pkey", "-pubout", "-in"])
            .arg(&key)
            .arg("-out")
            .arg(&public))
        .status
        .success()
    );
    let verify = run(imager()
        .args(["verify", "--key"])
        .arg(&public)
        .arg(&token.dir));
    assert!(
        verify.status.success(),
        "{}",
        String::from_utf8_lossy(&verify.stderr)
    );
}

/// Secure Boot's keys too: the Secure Boot profile built with the key
/// directory's files, then with a directory of certificates only, db and
/// PK on a SoftHSM2 token and KEK behind the external signer, gives the
/// same UKIs, systemd-boot, enrolment files and disk.
#[test]
fn secure_boot_keys_on_a_token_and_a_signer_sign_the_same_bytes() {
    let dir = scratch().join("signers-sb");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let manifest_key = dir.join("release.pem");
    assert!(
        run(tool("openssl")
            .args(["genpkey", "-algorithm", "ed25519", "-out"])
            .arg(&manifest_key))
        .status
        .success()
    );
    let keys = dir.join("keys");
    let out = run(imager().args(["keygen", "--secure-boot"]).arg(&keys));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The same certificates and owner, without a private key.
    let certs = dir.join("certs");
    std::fs::create_dir_all(&certs).unwrap();
    for f in ["PK.crt", "KEK.crt", "db.crt", "GUID"] {
        std::fs::copy(keys.join(f), certs.join(f)).unwrap();
    }
    let conf = token_with(&dir.join("hsm"), &keys.join("db.key"));
    let import_pk = run(tool("softhsm2-util").env("SOFTHSM2_CONF", &conf).args([
        "--import",
        keys.join("PK.key").to_str().unwrap(),
        "--token",
        "imager-test",
        "--label",
        "PK",
        "--id",
        "02",
        "--pin",
        PIN,
    ]));
    assert!(import_pk.status.success());
    let uri = |label: &str| {
        format!(
            "pkcs11:token=imager-test;object={label}?module-path={SOFTHSM_MODULE}&pin-value={PIN}"
        )
    };
    let program = repo().join("tests/common/external-signer.py");
    // One profile name for both (the installer image records it), its
    // secure_boot section written for each build in turn.
    let files = |()| {
        write_profile_from("secureboot", "signers-sb", |t| {
            t.replace(
                "secure_boot:\n",
                &format!("secure_boot:\n  keys: {}\n", keys.display()),
            )
        })
    };
    let tokens = |()| {
        write_profile_from("secureboot", "signers-sb", |t| {
            t.replace(
            "secure_boot:\n",
            &format!(
                "secure_boot:\n  keys: {}\n  signers:\n    db: \"{}\"\n    PK: \"{}\"\n    KEK: \
                 \"exec:{}\"\n",
                certs.display(),
                uri("release"),
                uri("PK"),
                program.display()
            ),
        )
        })
    };
    let key = manifest_key.to_str().unwrap();
    let build = |name: &str, profile: &Path, env: &[(&str, &Path)]| {
        let out_dir = scratch().join(name);
        let _ = std::fs::remove_dir_all(&out_dir);
        let mut cmd = imager();
        cmd.args(["build", "--json", "--key", key, "--profile"])
            .arg(profile)
            .arg("--out")
            .arg(&out_dir);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let out = run(&mut cmd);
        assert!(
            out.status.success(),
            "{name}:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        Build {
            dir: out_dir,
            json: serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap(),
        }
    };
    let with_files = build("signers-sb-files", &files(()), &[]);
    let log = dir.join("signer.log");
    let kek = keys.join("KEK.key");
    let with_tokens = build(
        "signers-sb-tokens",
        &tokens(()),
        &[
            ("SOFTHSM2_CONF", &conf),
            ("TEST_SIGNER_KEY", &kek),
            ("TEST_SIGNER_LOG", &log),
        ],
    );
    assert!(std::fs::read_to_string(&log).unwrap().contains("sign"));
    let (want, want_sig) = outputs(&with_files);
    let (got, sig) = outputs(&with_tokens);
    assert_eq!(got, want, "artifacts differ");
    assert_eq!(sig, want_sig);
    // The UKIs are signed by the db certificate's key, as sbverify sees it.
    let uki = with_tokens.artifact("uki");
    let v = run(tool("sbverify")
        .arg("--cert")
        .arg(certs.join("db.crt"))
        .arg(&uki));
    assert!(v.status.success(), "{}", String::from_utf8_lossy(&v.stderr));
}

#[test]
fn a_wrong_pin_or_a_signer_of_another_key_fails_and_leaves_nothing() {
    let dir = scratch().join("signers-bad");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let key = dir.join("release.pem");
    assert!(
        run(tool("openssl")
            .args(["genpkey", "-algorithm", "ed25519", "-out"])
            .arg(&key))
        .status
        .success()
    );
    let conf = token_with(&dir.join("hsm"), &key);
    let uri = format!(
        "pkcs11:token=imager-test;object=release?module-path={SOFTHSM_MODULE}&pin-value=Pin-9173-qz"
    );
    let (out_dir, out) = build("signers-wrong-pin", &uri, &[("SOFTHSM2_CONF", &conf)]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{said}");
    assert!(said.contains("check the PIN"), "{said}");
    assert!(
        !said.contains("Pin-9173-qz"),
        "the PIN was printed:\n{said}"
    );
    assert!(!out_dir.join("manifest.json").exists());

    // A program that says one public key and signs with another: its
    // signature is checked before it is used.
    let other = dir.join("other.pem");
    assert!(
        run(tool("openssl")
            .args(["genpkey", "-algorithm", "ed25519", "-out"])
            .arg(&other))
        .status
        .success()
    );
    let liar = dir.join("liar.sh");
    std::fs::write(
        &liar,
        format!(
            "#!/bin/sh\nreq=$(cat)\ncase \"$req\" in *public-key*) TEST_SIGNER_KEY={} ;; *) \
             TEST_SIGNER_KEY={} ;; esac\nexport TEST_SIGNER_KEY\nprintf %s \"$req\" | exec {}\n",
            key.display(),
            other.display(),
            repo().join("tests/common/external-signer.py").display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&liar, std::fs::Permissions::from_mode(0o755)).unwrap();
    let log = dir.join("signer.log");
    let (out_dir, out) = build(
        "signers-liar",
        &format!("exec:{}", liar.display()),
        &[("TEST_SIGNER_LOG", &log)],
    );
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains("returned a signature that does not verify with its public key"),
        "{said}"
    );
    assert!(!out_dir.join("manifest.json").exists());
}
