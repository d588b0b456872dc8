//! The format, key ids and signature check, on bytes. (imager's
//! `sign::tests` cover the files: signing, keys, openssl, `imager verify`.)

use crate::VerifyingKey;
use crate::artifact::{Artifact, Kind};
use crate::keys::{key_id, parse_trusted_keys};
use crate::manifest::{Boot, Manifest, check_path};
use crate::trust::{TrustFiles, key_root};
use crate::verify::{Asked, check_for_disk, claimed_key_id, verify_manifest_bytes};
use contract::Arch;
use ed25519_dalek::pkcs8::EncodePublicKey;
use ed25519_dalek::pkcs8::spki::der::pem::LineEnding;
use ed25519_dalek::{Signer, SigningKey};

fn key(seed: u8) -> SigningKey {
    SigningKey::from_bytes(&[seed; 32])
}

/// A canonical manifest signed by `signer`: (bytes, raw signature).
fn signed(signer: &SigningKey) -> (Vec<u8>, Vec<u8>) {
    let m = Manifest {
        key_id: key_id(&signer.verifying_key()),
        ..Manifest::new(
            "os",
            "1.0",
            "installer",
            0,
            vec![Artifact {
                kind: Kind::Raw,
                path: "disk.raw".into(),
                sha256: "a".repeat(64),
                size: 42,
            }],
        )
    };
    let bytes = m.to_bytes().unwrap();
    let sig = signer.sign(&bytes).to_bytes().to_vec();
    (bytes, sig)
}

/// The one trust check, with `trusted` as a disk's `trusted-keys`.
fn verify_trusted(bytes: &[u8], sig: &[u8], trusted: &[VerifyingKey]) -> anyhow::Result<Manifest> {
    let files = TrustFiles {
        manifest: bytes.to_vec(),
        signature: sig.to_vec(),
        ..TrustFiles::default()
    };
    crate::trust::verify(&key_root(trusted)?, &files).map(|t| t.manifest)
}

#[test]
fn unsafe_paths_are_refused() {
    for bad in [
        "../x",
        "/etc/passwd",
        "a/../../x",
        "",
        "./a",
        "a//b",
        "a/",
        "a\0b",
        "manifest.json",
        "manifest.json.sig",
    ] {
        assert!(check_path(bad).is_err(), "{bad:?} accepted");
    }
    for good in ["a", "a/b.raw", "..a", "a..b", ".hidden"] {
        assert!(check_path(good).is_ok(), "{good:?} refused");
    }
}

#[test]
fn a_manifest_verifies_with_any_trusted_key_that_signed_it() {
    let (k, other) = (key(1), key(2));
    let (bytes, sig) = signed(&k);
    let trusted = [other.verifying_key(), k.verifying_key()];
    let m = verify_trusted(&bytes, &sig, &trusted).unwrap();
    assert_eq!(m, Manifest::parse(&bytes).unwrap());
    assert_eq!(m.key_id, key_id(&k.verifying_key()));
    let one = verify_manifest_bytes(&bytes, &sig, &k.verifying_key(), "m", "s").unwrap();
    assert_eq!(one, m);
}

#[test]
fn an_untrusted_key_is_named_and_a_modification_is_explained() {
    let (k, other) = (key(1), key(2));
    let (bytes, sig) = signed(&k);
    let (kid, oid) = (key_id(&k.verifying_key()), key_id(&other.verifying_key()));
    let e = format!(
        "{:#}",
        verify_trusted(&bytes, &sig, &[other.verifying_key()]).unwrap_err()
    );
    assert_eq!(
        e,
        format!(
            "the installer's payload is not signed by a key this disk trusts ({oid}): it says \
             it is signed by {kid}; build the installer with the key the disk trusts (imager \
             build --key), or install the disk afresh with `imager install --key` for the new \
             key; nothing was written"
        )
    );
    // Modified after signing: the claimed key is trusted, the signature fails.
    let mut changed = bytes.clone();
    let at = changed.len() - 10;
    changed[at] ^= 1;
    let e = format!(
        "{:#}",
        verify_trusted(&changed, &sig, &[k.verifying_key()]).unwrap_err()
    );
    assert_eq!(
        e,
        format!(
            "the installer's payload is not signed by a key this disk trusts ({kid}): its \
             signature does not verify: the payload was modified or damaged; nothing was written"
        )
    );
    // Not a raw 64-byte signature.
    let e = format!(
        "{:#}",
        verify_trusted(&bytes, &sig[..63], &[k.verifying_key()]).unwrap_err()
    );
    assert!(
        e.contains("manifest.json.sig is 63 bytes, not a raw 64-byte"),
        "{e}"
    );
    // No key at all: not a root.
    let e = format!("{:#}", verify_trusted(&bytes, &sig, &[]).unwrap_err());
    assert!(e.contains("a root holds 1 to 16 keys, not 0"), "{e}");
}

#[test]
fn the_claimed_key_id_is_only_a_key_id() {
    let (bytes, _) = signed(&key(1));
    assert_eq!(
        claimed_key_id(&bytes),
        Some(key_id(&key(1).verifying_key()))
    );
    assert_eq!(claimed_key_id(br#"{"key_id": "ed25519:0123"}"#), None);
    assert_eq!(
        claimed_key_id(br#"{"key_id": "rsa:0123456789abcdef"}"#),
        None
    );
    assert_eq!(claimed_key_id(b"not json"), None);
}

#[test]
fn trusted_keys_are_read_from_concatenated_pem() {
    let pem = |k: &SigningKey| k.verifying_key().to_public_key_pem(LineEnding::LF).unwrap();
    let text = format!("{}{}", pem(&key(1)), pem(&key(2)));
    let keys: Vec<VerifyingKey> = parse_trusted_keys(&text).unwrap();
    assert_eq!(keys, [key(1).verifying_key(), key(2).verifying_key()]);
    assert_eq!(parse_trusted_keys("").unwrap(), []);
    let cut = &text[..text.len() - 30];
    let e = format!("{:#}", parse_trusted_keys(cut).unwrap_err());
    assert!(e.contains("has no END line"), "{e}");
    let id = key_id(&key(1).verifying_key());
    assert!(id.starts_with("ed25519:") && id.len() == "ed25519:".len() + 16);
}

#[test]
fn the_boot_field_is_optional_canonical_and_one_line() {
    let art = Artifact {
        kind: Kind::Kernel,
        path: "vmlinuz".into(),
        sha256: "b".repeat(64),
        size: 42,
    };
    let mut m = Manifest {
        key_id: "ed25519:0123456789abcdef".into(),
        ..Manifest::new("os", "1.0", "profiles/x.yaml", 0, vec![art])
    };
    // Without it, no key at all (manifests of earlier builds stay the same).
    let plain = String::from_utf8(m.to_bytes().unwrap()).unwrap();
    assert!(!plain.contains("boot"), "{plain}");
    assert_eq!(Manifest::parse(plain.as_bytes()).unwrap().boot, None);
    m.boot = Some(Boot {
        title: "Imager 1.0".into(),
        cmdline: "console=ttyS0 slab_nomerge".into(),
        secure_boot_enroll: None,
    });
    let text = String::from_utf8(m.to_bytes().unwrap()).unwrap();
    assert!(
        text.contains(
            "  \"key_id\": \"ed25519:0123456789abcdef\",\n  \"boot\": {\n    \"title\": \"Imager 1.0\",\n    \"cmdline\": \"console=ttyS0 slab_nomerge\"\n  },\n  \"artifacts\": ["
        ),
        "{text}"
    );
    assert_eq!(Manifest::parse(text.as_bytes()).unwrap(), m);
    // Unknown fields in it are refused, like everywhere in the manifest.
    let extra = text.replace("\"title\":", "\"entry\": \"x\",\n    \"title\":");
    assert!(Manifest::parse(extra.as_bytes()).is_err());
    // A newline would add a line to the boot entry the installer writes.
    let mut bad = m.clone();
    bad.boot = Some(Boot {
        title: "Imager".into(),
        cmdline: "quiet\ninitrd /evil".into(),
        secure_boot_enroll: None,
    });
    let e = bad.to_bytes().unwrap_err().to_string();
    assert!(
        e.contains("boot.cmdline") && e.contains("control character"),
        "{e}"
    );
    let forged = text.replace("slab_nomerge", "slab_nomerge\\ninitrd /evil");
    let e = format!("{:#}", Manifest::parse(forged.as_bytes()).unwrap_err());
    assert!(e.contains("control character"), "{e}");
    // A command line the boot path would cut short is refused in a
    // manifest too: the installer must not install what cannot boot.
    let limit = contract::cmdline::MAX_LEN - (contract::boot::loaded_cmdline_len("x") - 1);
    let fits = text.replace("console=ttyS0 slab_nomerge", &"x".repeat(limit));
    assert!(Manifest::parse(fits.as_bytes()).is_ok());
    let long = text.replace("console=ttyS0 slab_nomerge", &"x".repeat(limit + 1));
    let e = format!("{:#}", Manifest::parse(long.as_bytes()).unwrap_err());
    assert!(
        e.contains("boot.cmdline") && e.contains("would not boot"),
        "{e}"
    );
}

/// One check, whatever brings the payload: the same system, named in
/// META (a disk without the name is refused, not trusted), the version
/// asked for, and a security version not below the disk's floor unless an
/// admin allows it.
#[test]
fn a_payload_fits_a_disk_of_the_same_system_at_the_version_asked_for() {
    use contract::meta::{Meta, Tag};
    let mut m = Manifest::new("metal", "0.2.0", "installer", 0, Vec::new());
    let none = Asked::default();
    let want = |v| Asked {
        version: Some(v),
        ..none
    };
    let mut meta = Meta::default();
    meta.set(Tag::DefaultSlot, "A");
    meta.set(Tag::SlotA, "status=good version=0.1.0");
    let e = check_for_disk(&meta, Arch::Amd64, &m, none)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("META holds no image name") && e.contains("nothing was written"),
        "{e}"
    );
    meta.set(Tag::ImageName, "other");
    let e = check_for_disk(&meta, Arch::Amd64, &m, none)
        .unwrap_err()
        .to_string();
    assert!(e.contains("this disk runs \"other\""), "{e}");
    meta.set(Tag::ImageName, "metal");
    check_for_disk(&meta, Arch::Amd64, &m, none).unwrap();
    check_for_disk(&meta, Arch::Amd64, &m, want("0.2.0")).unwrap();
    let e = check_for_disk(&meta, Arch::Amd64, &m, want("0.5.0"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("holds metal 0.2.0 (genuinely signed), not the version 0.5.0 asked for"),
        "{e}"
    );
    // A disk that blessed security version 2 takes 2 and more; less only
    // when an admin allows it.
    meta.set(Tag::SecurityFloor, "2");
    let e = check_for_disk(&meta, Arch::Amd64, &m, none)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("metal 0.2.0: its security version 0 is lower than 2")
            && e.contains("nothing was written"),
        "{e}"
    );
    m.security_version = 1;
    assert!(check_for_disk(&meta, Arch::Amd64, &m, none).is_err());
    let admin = Asked {
        allow_downgrade: true,
        ..none
    };
    check_for_disk(&meta, Arch::Amd64, &m, admin).unwrap();
    for fine in [2, 3] {
        m.security_version = fine;
        check_for_disk(&meta, Arch::Amd64, &m, none).unwrap();
    }
    // The architecture first: an arm64 payload on an amd64 disk, and the
    // reverse, are refused before anything else is looked at.
    let mut arm = m.clone();
    arm.set_arch(Arch::Arm64);
    let e = check_for_disk(&meta, Arch::Amd64, &arm, none)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("it is an arm64 payload (of metal 0.2.0) but this disk boots amd64")
            && e.contains("nothing was written"),
        "{e}"
    );
    let e = check_for_disk(&meta, Arch::Arm64, &m, none)
        .unwrap_err()
        .to_string();
    assert!(e.contains("an amd64 payload"), "{e}");
    check_for_disk(&meta, Arch::Arm64, &arm, none).unwrap();
}

/// The architecture is signed with the manifest: absent for amd64 (its
/// manifests keep their bytes and older runtimes read them), `arm64`
/// otherwise; any other value, or amd64 spelt out, is refused.
#[test]
fn the_architecture_is_signed_and_absent_for_amd64() {
    let mut m = Manifest::new("os", "1.0", "installer", 0, Vec::new());
    let plain = m.to_bytes().unwrap();
    assert!(!String::from_utf8_lossy(&plain).contains("arch"));
    assert_eq!(
        Manifest::parse(&plain).unwrap().arch().unwrap(),
        Arch::Amd64
    );
    m.set_arch(Arch::Arm64);
    let arm = m.to_bytes().unwrap();
    assert!(String::from_utf8_lossy(&arm).contains("\"arch\": \"arm64\""));
    assert_eq!(Manifest::parse(&arm).unwrap().arch().unwrap(), Arch::Arm64);
    for bad in ["amd64", "aarch64", "riscv64", ""] {
        m.arch = Some(bad.into());
        assert!(m.to_bytes().is_err(), "{bad}");
        let text = String::from_utf8_lossy(&arm).replace("\"arm64\"", &format!("{bad:?}"));
        let e = Manifest::parse(text.as_bytes()).unwrap_err().to_string();
        assert!(e.contains("invalid manifest: arch"), "{bad}: {e}");
    }
}

/// A security version of 0 leaves the manifest's bytes as they were.
#[test]
fn the_security_version_is_signed_and_absent_when_zero() {
    let mut m = Manifest::new("os", "1.0", "installer", 0, Vec::new());
    let plain = String::from_utf8(m.to_bytes().unwrap()).unwrap();
    assert!(!plain.contains("security"), "{plain}");
    m.security_version = 4;
    let text = String::from_utf8(m.to_bytes().unwrap()).unwrap();
    assert!(text.contains("\"security_version\": 4"), "{text}");
    assert_eq!(Manifest::parse(text.as_bytes()).unwrap(), m);
}

#[test]
fn a_manifest_with_a_version_outside_the_rule_does_not_parse() {
    let mut m = Manifest::new("os", "1.0", "installer", 0, Vec::new());
    m.version = "1.0\nready".into();
    let bytes = serde_json::to_vec(&m).unwrap();
    let e = Manifest::parse(&bytes).unwrap_err().to_string();
    assert!(e.contains("invalid manifest: version"), "{e}");
}
