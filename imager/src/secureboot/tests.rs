#![allow(clippy::unwrap_used)]

use super::auth::*;
use super::authenticode::*;
use super::keys::*;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

const SD_BOOT: &str = "/usr/lib/systemd/boot/efi/systemd-bootx64.efi";

/// One key directory for the whole test process (RSA key generation is
/// the slow part).
fn key_dir() -> &'static Path {
    static D: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    &D.get_or_init(|| {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("sb");
        keygen(&d, false).unwrap();
        (t, d)
    })
    .1
}

fn keys() -> &'static SecureBootKeys {
    static K: OnceLock<SecureBootKeys> = OnceLock::new();
    K.get_or_init(|| SecureBootKeys::load(key_dir()).unwrap())
}

fn copy_keys() -> (tempfile::TempDir, PathBuf) {
    let t = tempfile::tempdir().unwrap();
    let d = t.path().join("k");
    std::fs::create_dir(&d).unwrap();
    for n in file_names() {
        std::fs::copy(key_dir().join(&n), d.join(&n)).unwrap();
    }
    (t, d)
}

fn err<T: std::fmt::Debug>(r: anyhow::Result<T>) -> String {
    format!("{:#}", r.unwrap_err())
}

#[test]
fn keygen_writes_three_pairs_and_a_guid_with_private_keys_0600() {
    let d = key_dir();
    for n in NAMES {
        let key = std::fs::metadata(d.join(format!("{n}.key"))).unwrap();
        assert_eq!(key.permissions().mode() & 0o777, 0o600, "{n}.key");
        let crt = std::fs::read_to_string(d.join(format!("{n}.crt"))).unwrap();
        assert!(crt.starts_with("-----BEGIN CERTIFICATE-----"), "{n}.crt");
    }
    let k = keys();
    assert!(k.pk.subject().contains("PK"), "{}", k.pk.subject());
    assert!(k.db.subject().contains("db"), "{}", k.db.subject());
    // Three different keys.
    assert_ne!(k.pk.cert_der, k.kek.cert_der);
    assert_ne!(k.kek.cert_der, k.db.cert_der);
    // Self-signed: issuer = subject.
    for key in [&k.pk, &k.kek, &k.db] {
        assert_eq!(
            key.cert.tbs_certificate.issuer,
            key.cert.tbs_certificate.subject
        );
    }
    // Nothing half-written is left behind.
    let names: Vec<String> = std::fs::read_dir(d)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 7, "{names:?}");
}

#[test]
fn keygen_refuses_to_overwrite_and_leaves_the_keys_alone() {
    let (_t, d) = copy_keys();
    let before = std::fs::read(d.join("db.key")).unwrap();
    let e = err(keygen(&d, false));
    assert!(e.contains("already exists") && e.contains("--force"), "{e}");
    assert_eq!(std::fs::read(d.join("db.key")).unwrap(), before);
}

#[test]
fn load_refuses_open_keys_mismatched_pairs_and_a_key_for_a_cert() {
    let (_t, d) = copy_keys();
    std::fs::set_permissions(d.join("KEK.key"), std::fs::Permissions::from_mode(0o644)).unwrap();
    let e = err(SecureBootKeys::load(&d));
    assert!(e.contains("KEK.key") && e.contains("chmod 600"), "{e}");
    std::fs::set_permissions(d.join("KEK.key"), std::fs::Permissions::from_mode(0o600)).unwrap();

    std::fs::copy(d.join("PK.crt"), d.join("db.crt")).unwrap();
    let e = err(SecureBootKeys::load(&d));
    assert!(e.contains("db.crt does not belong to"), "{e}");

    std::fs::copy(d.join("db.key"), d.join("db.crt")).unwrap();
    let e = err(SecureBootKeys::load(&d));
    assert!(e.contains("private key, not a certificate"), "{e}");
    // Never quotes the key.
    let key = std::fs::read_to_string(d.join("db.key")).unwrap();
    let line = key.lines().nth(1).unwrap();
    assert!(!e.contains(line), "{e}");

    std::fs::remove_file(d.join("GUID")).unwrap();
    let e = err(SecureBootKeys::load(&d));
    assert!(
        e.contains("GUID") && e.contains("imager keygen --secure-boot"),
        "{e}"
    );
}

#[test]
fn signing_systemd_boot_gives_a_signature_verify_accepts_and_the_same_bytes_twice() {
    let pe = std::fs::read(SD_BOOT).unwrap();
    let signed = sign_bytes(&pe, &keys().db).unwrap();
    assert_eq!(
        signed,
        sign_bytes(&pe, &keys().db).unwrap(),
        "deterministic"
    );
    assert_eq!(signed.len() % 8, 0);
    // The original bytes come first, unchanged but for the checksum and the
    // certificate-table entry.
    let l = layout(&signed).unwrap();
    let (at, size) = l.cert_table.unwrap();
    assert_eq!(at, pe.len().div_ceil(8) * 8);
    assert_eq!(at + size, signed.len());
    assert_eq!(&signed[at + 4..at + 8], &[0x00, 0x02, 0x02, 0x00]);
    // The digest is the unsigned file's (padded) digest.
    let mut padded = pe.clone();
    padded.resize(at, 0);
    assert_eq!(digest(&padded).unwrap(), digest(&signed).unwrap());
    let v = verify(&signed, &keys().db.cert).unwrap();
    assert!(v.signer.contains("db"), "{v:?}");
    assert_eq!(v.digest, hex::encode(digest(&signed).unwrap()));
}

#[test]
fn verify_refuses_a_changed_image_another_key_and_an_unsigned_image() {
    let pe = std::fs::read(SD_BOOT).unwrap();
    let signed = sign_bytes(&pe, &keys().db).unwrap();
    let mut flipped = signed.clone();
    flipped[0x1000] ^= 1;
    let e = err(verify(&flipped, &keys().db.cert));
    assert!(e.contains("changed after signing"), "{e}");
    let e = err(verify(&signed, &keys().kek.cert));
    assert!(e.contains("another key"), "{e}");
    let e = err(verify(&pe, &keys().db.cert));
    assert!(e.contains("not signed"), "{e}");
    // A flipped byte in the signature itself.
    let (at, size) = layout(&signed).unwrap().cert_table.unwrap();
    let mut bad_sig = signed.clone();
    bad_sig[at + size - 40] ^= 0x80;
    assert!(verify(&bad_sig, &keys().db.cert).is_err());
}

/// The node checks UKIs of tens of MiB within a memory budget: the file
/// is streamed (headers, signature, then the sections a buffer at a time)
/// and the result is the in-memory check's, refusals included.
#[test]
fn verify_file_streams_to_the_same_verdicts_as_verify() {
    let dir = tempfile::tempdir().unwrap();
    let pe = std::fs::read(SD_BOOT).unwrap();
    let signed = sign_bytes(&pe, &keys().db).unwrap();
    let path = dir.path().join("signed.efi");
    std::fs::write(&path, &signed).unwrap();
    assert_eq!(
        verify_file(&path, &keys().db.cert).unwrap(),
        verify(&signed, &keys().db.cert).unwrap()
    );
    let e = err(verify_file(&path, &keys().kek.cert));
    assert!(e.contains("another key") && e.contains("signed.efi"), "{e}");
    // A byte changed in the last section and one after the sections.
    let l = layout(&signed).unwrap();
    let (ptr, size) = *l.sections.last().unwrap();
    for at in [ptr + size - 1, l.size_of_headers + 1] {
        let mut changed = signed.clone();
        changed[at] ^= 1;
        std::fs::write(&path, &changed).unwrap();
        let e = err(verify_file(&path, &keys().db.cert));
        assert!(e.contains("changed after signing"), "byte {at}: {e}");
    }
    // Cut short: the certificate table no longer ends the file.
    std::fs::write(&path, &signed[..signed.len() - 8]).unwrap();
    assert!(verify_file(&path, &keys().db.cert).is_err());
    std::fs::write(&path, &pe).unwrap();
    let e = err(verify_file(&path, &keys().db.cert));
    assert!(e.contains("not signed"), "{e}");
}

#[test]
fn signing_refuses_a_signed_image_and_what_is_not_a_pe() {
    let pe = std::fs::read(SD_BOOT).unwrap();
    let signed = sign_bytes(&pe, &keys().db).unwrap();
    let e = err(sign_bytes(&signed, &keys().db));
    assert!(e.contains("already signed"), "{e}");
    let e = err(sign_bytes(b"#!/bin/sh\n", &keys().db));
    assert!(e.contains("not a PE"), "{e}");
    let e = err(sign_bytes(&pe[..300], &keys().db));
    assert!(e.contains("header") || e.contains("PE"), "{e}");
    // Two sections that overlap: refused, not hashed twice.
    let mut bad = pe.clone();
    let l = layout(&pe).unwrap();
    let pe_at = u32::from_le_bytes(pe[0x3c..0x40].try_into().unwrap()) as usize;
    let opt_size = u16::from_le_bytes(pe[pe_at + 20..pe_at + 22].try_into().unwrap()) as usize;
    let second = pe_at + 24 + opt_size + 40;
    bad[second + 20..second + 24].copy_from_slice(&(l.sections[0].0 as u32 + 16).to_le_bytes());
    let e = err(sign_bytes(&bad, &keys().db));
    assert!(e.contains("does not follow"), "{e}");
}

#[test]
fn sign_writes_atomically_and_refuses_without_writing() {
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("BOOTX64.EFI");
    let r = sign(Path::new(SD_BOOT), &keys().db, &out).unwrap();
    assert_eq!(std::fs::metadata(&out).unwrap().len(), r.size);
    verify_file(&out, &keys().db.cert).unwrap();
    let again = t.path().join("twice.efi");
    assert!(sign(&out, &keys().db, &again).is_err());
    assert!(!again.exists());
    assert_eq!(std::fs::read_dir(t.path()).unwrap().count(), 1);
}

#[test]
fn efi_time_of_epochs() {
    let t = efi_time(0).unwrap();
    assert_eq!(&t[..7], &[0xb2, 0x07, 1, 1, 0, 0, 0]);
    // 2023-11-14 22:13:20 UTC
    let t = efi_time(1_700_000_000).unwrap();
    assert_eq!(&t[..7], &[0xe7, 0x07, 11, 14, 22, 13, 20]);
    assert_eq!(&t[7..], &[0; 9]);
    // 2000-02-29 (a leap day) 12:00:00
    let t = efi_time(951_825_600).unwrap();
    assert_eq!(&t[..7], &[0xd0, 0x07, 2, 29, 12, 0, 0]);
    assert!(efi_time(u64::MAX).is_err());
}

#[test]
fn signature_list_layout() {
    let owner = uuid::Uuid::from_u128(0x11223344_5566_7788_99aa_bbccddeeff00);
    let l = x509_signature_list(&owner, b"CERT").unwrap();
    assert_eq!(l.len(), 28 + 16 + 4);
    // EFI_CERT_X509_GUID in EFI byte order.
    assert_eq!(&l[..4], &[0xa1, 0x59, 0xc0, 0xa5]);
    assert_eq!(&l[16..20], &(48u32).to_le_bytes());
    assert_eq!(&l[20..24], &[0; 4]);
    assert_eq!(&l[24..28], &(20u32).to_le_bytes());
    assert_eq!(&l[28..32], &[0x44, 0x33, 0x22, 0x11]);
    assert_eq!(&l[44..], b"CERT");
}

#[test]
fn enrolment_files_are_deterministic_and_laid_out_as_edk2_reads_them() {
    let a = enrolment_files(keys(), 1_700_000_000).unwrap();
    let b = enrolment_files(keys(), 1_700_000_000).unwrap();
    assert_eq!(a, b);
    let names: Vec<&str> = a.iter().map(|(n, _)| *n).collect();
    assert_eq!(names, ["db.auth", "KEK.auth", "PK.auth"]);
    for (name, bytes) in &a {
        assert_eq!(&bytes[..16], &efi_time(1_700_000_000).unwrap(), "{name}");
        let len = u32::from_le_bytes(bytes[16..20].try_into().unwrap()) as usize;
        assert_eq!(&bytes[20..24], &[0x00, 0x02, 0xf1, 0x0e], "{name}");
        assert_eq!(&bytes[24..40], &guid_bytes(&EFI_CERT_TYPE_PKCS7), "{name}");
        let sd = &bytes[40..16 + len];
        // EDK2: a bare SignedData with a two-byte length and SHA-256 as its
        // digest algorithm at offset 13.
        assert_eq!(sd[0], 0x30, "{name}");
        assert_eq!(sd[1], 0x82, "{name}");
        assert_eq!(
            &sd[13..22],
            &[0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x01],
            "{name}"
        );
        let data = &bytes[16 + len..];
        let cert = match *name {
            "db.auth" => &keys().db.cert_der,
            "KEK.auth" => &keys().kek.cert_der,
            _ => &keys().pk.cert_der,
        };
        assert_eq!(data, x509_signature_list(&keys().owner, cert).unwrap());
    }
    assert!(efi_time(300_000_000_000).is_err());
}

#[test]
fn write_enrolment_writes_the_three_files_and_nothing_else() {
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("auth");
    let paths = write_enrolment(keys(), 1_700_000_000, &out).unwrap();
    assert_eq!(paths.len(), 3);
    let files = enrolment_files(keys(), 1_700_000_000).unwrap();
    for (name, bytes) in files {
        assert_eq!(std::fs::read(out.join(name)).unwrap(), bytes);
    }
    assert_eq!(std::fs::read_dir(&out).unwrap().count(), 3);
    // A directory in the way of one of them: refused, nothing written.
    let other = t.path().join("other");
    std::fs::create_dir_all(other.join("PK.auth")).unwrap();
    assert!(write_enrolment(keys(), 1_700_000_000, &other).is_err());
    assert_eq!(std::fs::read_dir(&other).unwrap().count(), 1);
}

/// `payload::secureboot::check`, the one decision `imager upgrade` and the
/// node's pulls make before writing: each case of the disk's record and
/// the payload's signatures, with real signed PE files.
#[test]
fn the_secure_boot_decision_for_each_disk_and_payload() {
    use payload::secureboot::{Move, Signed, check};
    let dir = tempfile::tempdir().unwrap();
    let pe = std::fs::read(SD_BOOT).unwrap();
    let write = |name: &str, key: &SbKey| {
        let p = dir.path().join(name);
        std::fs::write(&p, sign_bytes(&pe, key).unwrap()).unwrap();
        p
    };
    let by_db = write("db.efi", &keys().db);
    let by_kek = write("kek.efi", &keys().kek);
    let db = std::fs::read_to_string(key_dir().join("db.crt")).unwrap();
    let kek = std::fs::read_to_string(key_dir().join("KEK.crt")).unwrap();
    let sb = |cert: &str, loader: &Path, b: &Path| -> Result<Move, String> {
        check(
            Some(&db),
            Signed {
                db: Some(cert),
                loader: Some(loader),
                ukis: Some([&by_db, b]),
            },
            false,
        )
        .map_err(|e| format!("{e:#}"))
    };
    let plain = Signed::default();
    assert_eq!(check(None, plain, false).unwrap(), Move::None);
    // A Secure Boot disk: the same db certificate, both UKIs signed by it.
    assert_eq!(sb(&db, &by_db, &by_db).unwrap(), Move::Keep);
    // Slot B's UKI signed by another key.
    let e = sb(&db, &by_db, &by_kek).unwrap_err();
    assert!(
        e.contains("UKI of slot B") && e.contains("not signed by the db key this disk trusts"),
        "{e}"
    );
    // A payload made for another db certificate.
    let e = sb(&kek, &by_db, &by_db).unwrap_err();
    assert!(e.contains("another db certificate"), "{e}");
    // A payload without Secure Boot: only when asked for, then it leaves.
    let e = format!("{:#}", check(Some(&db), plain, false).unwrap_err());
    assert!(e.contains("not signed for it"), "{e}");
    assert_eq!(check(Some(&db), plain, true).unwrap(), Move::Leave);
    // A disk without it: a Secure Boot payload only when asked for, and
    // only if its boot loader and both UKIs verify with its own db.
    fn payload<'a>(db: &'a str, loader: &'a Path, uki: &'a Path) -> Signed<'a> {
        Signed {
            db: Some(db),
            loader: Some(loader),
            ukis: Some([uki, uki]),
        }
    }
    let e = format!(
        "{:#}",
        check(None, payload(&db, &by_db, &by_db), false).unwrap_err()
    );
    assert!(e.contains("--change-secure-boot"), "{e}");
    assert_eq!(
        check(None, payload(&db, &by_db, &by_db), true).unwrap(),
        Move::Enter
    );
    let e = format!(
        "{:#}",
        check(None, payload(&db, &by_kek, &by_db), true).unwrap_err()
    );
    assert!(
        e.contains("boot loader") && e.contains("not signed for its own db certificate"),
        "{e}"
    );
}

#[test]
fn rotation_appends_are_read_back_as_what_they_add_and_are_deterministic() {
    use crate::secureboot::auth::{Changes, EFI_CERT_SHA256, update_files};
    use payload::efivar::{self, Entry, Var};
    // One GUID table: the reader's constants are the writer's.
    assert_eq!(guid_bytes(&EFI_CERT_SHA256), efivar::CERT_SHA256);
    assert_eq!(guid_bytes(&EFI_CERT_X509), efivar::CERT_X509);
    assert_eq!(
        guid_bytes(&EFI_IMAGE_SECURITY_DATABASE),
        efivar::IMAGE_SECURITY_DATABASE
    );
    let changes = Changes {
        add_db: vec![keys().kek.cert_der.clone(), keys().db.cert_der.clone()],
        revoke: vec![[2; 32], [1; 32], [2; 32]],
        revoke_certs: vec![keys().kek.cert_der.clone()],
    };
    let files = update_files(keys(), 1_700_000_000, &changes).unwrap();
    assert_eq!(
        files,
        update_files(keys(), 1_700_000_000, &changes).unwrap()
    );
    let names: Vec<&str> = files.iter().map(|(n, _)| *n).collect();
    assert_eq!(names, ["db.append.auth", "dbx.append.auth"]);
    let db = efivar::parse_update(files[0].0, &files[0].1).unwrap();
    assert_eq!(db.var, Var::Db);
    let mut certs = vec![
        Entry::X509(keys().kek.cert_der.clone()),
        Entry::X509(keys().db.cert_der.clone()),
    ];
    certs.sort();
    assert_eq!(db.entries, certs);
    let dbx = efivar::parse_update(files[1].0, &files[1].1).unwrap();
    assert_eq!(
        dbx.entries,
        [
            Entry::X509(keys().kek.cert_der.clone()),
            Entry::Sha256([1; 32]),
            Entry::Sha256([2; 32])
        ]
    );
    // Laid out as the enrolment files are: EFI_TIME, then the PKCS#7.
    for (name, bytes) in &files {
        assert_eq!(&bytes[..16], &efi_time(1_700_000_000).unwrap(), "{name}");
        assert_eq!(&bytes[20..24], &[0x00, 0x02, 0xf1, 0x0e], "{name}");
        assert_eq!(&bytes[24..40], &guid_bytes(&EFI_CERT_TYPE_PKCS7), "{name}");
    }
    // Only what is asked is written; nothing asked is refused.
    let only_dbx = Changes {
        revoke: vec![[3; 32]],
        ..Changes::default()
    };
    let f = update_files(keys(), 1_700_000_000, &only_dbx).unwrap();
    assert_eq!(f.len(), 1);
    assert_eq!(f[0].0, "dbx.append.auth");
    assert!(update_files(keys(), 1_700_000_000, &Changes::default()).is_err());
}

/// The update files of `c`, named, as a payload carries them.
fn updates_of(c: crate::secureboot::auth::Changes) -> Vec<(String, Vec<u8>)> {
    crate::secureboot::auth::update_files(keys(), 1_700_000_000, &c)
        .unwrap()
        .into_iter()
        .map(|(n, b)| (n.to_string(), b))
        .collect()
}

/// META's record of version 3 with the update files of `c`.
fn record_of(c: crate::secureboot::auth::Changes) -> payload::efivar::Record {
    payload::efivar::Record::new("3", updates_of(c)).unwrap()
}

#[test]
fn a_payloads_updates_may_not_revoke_its_own_boot_chain_and_db_certificates_accumulate() {
    use crate::secureboot::auth::Changes;
    use der::EncodePem;
    let t = tempfile::tempdir().unwrap();
    let signed = t.path().join("BOOTX64.EFI");
    sign(Path::new(SD_BOOT), &keys().db, &signed).unwrap();
    let own = Some(signed.as_path());
    let digest = ::authenticode::file_digest(&signed).unwrap();
    let files = |revoke: [u8; 32]| {
        updates_of(Changes {
            add_db: vec![keys().kek.cert_der.clone()],
            revoke: vec![revoke],
            ..Changes::default()
        })
    };
    let e = payload::secureboot::updates("2", files(digest), own, None).unwrap_err();
    assert!(
        format!("{e:#}").contains("revokes the payload's own boot loader"),
        "{e:#}"
    );
    let r = payload::secureboot::updates("2", files([9; 32]), own, None)
        .unwrap()
        .unwrap();
    assert_eq!(r.version, "2");
    assert_eq!(r.updates.len(), 2);
    assert!(
        payload::secureboot::updates("2", Vec::new(), own, None)
            .unwrap()
            .is_none()
    );
    // Nor by the certificate that signed it; another certificate is taken.
    let by_cert = |der: &[u8]| {
        updates_of(Changes {
            revoke_certs: vec![der.to_vec()],
            ..Changes::default()
        })
    };
    let e = payload::secureboot::updates("2", by_cert(&keys().db.cert_der), own, None).unwrap_err();
    assert!(
        format!("{e:#}").contains("revokes the payload's own boot loader (by the certificate"),
        "{e:#}"
    );
    payload::secureboot::updates("2", by_cert(&keys().kek.cert_der), own, None)
        .unwrap()
        .unwrap();
    // The same file twice is refused.
    let mut twice = files([9; 32]);
    twice.push(twice[0].clone());
    assert!(payload::secureboot::updates("2", twice, own, None).is_err());

    // META's record gains the certificates firmware's db took, once.
    let db_pem = keys().db.cert.to_pem(der::pem::LineEnding::LF).unwrap();
    let kek = keys().kek.cert_der.as_slice();
    let both = payload::secureboot::with_db_certs(&db_pem, &[kek])
        .unwrap()
        .unwrap();
    assert!(both.starts_with(&db_pem));
    let certs = payload::secureboot::disk_certs(&both).unwrap();
    assert_eq!(certs, [keys().db.cert.clone(), keys().kek.cert.clone()]);
    assert_eq!(
        payload::secureboot::with_db_certs(&both, &[kek]).unwrap(),
        None
    );
    // And loses those dbx revoked, never the last.
    let db_der = keys().db.cert_der.as_slice();
    let kept = payload::secureboot::without_db_certs(&both, &[db_der])
        .unwrap()
        .unwrap();
    assert_eq!(
        payload::secureboot::disk_certs(&kept).unwrap(),
        [keys().kek.cert.clone()]
    );
    assert_eq!(
        payload::secureboot::without_db_certs(&kept, &[db_der]).unwrap(),
        None
    );
    assert!(payload::secureboot::without_db_certs(&kept, &[kek]).is_err());
    assert!(payload::secureboot::disk_certs("").is_err());
    assert!(payload::secureboot::with_db_certs(&db_pem, &[b"not a cert"]).is_err());
}

#[test]
fn a_disks_dbx_updates_refuse_payloads_and_boot_loaders_they_revoke() {
    use crate::secureboot::auth::Changes;
    let t = tempfile::tempdir().unwrap();
    let (a, b) = (t.path().join("uki-a.efi"), t.path().join("uki-b.efi"));
    // Two different images (the digest leaves the signature out).
    sign(Path::new(SD_BOOT), &keys().db, &a).unwrap();
    let stub = Path::new("/usr/lib/systemd/boot/efi/linuxx64.efi.stub");
    sign(stub, &keys().db, &b).unwrap();
    let revoke = |d: [u8; 32]| {
        record_of(Changes {
            revoke: vec![d],
            ..Changes::default()
        })
    };
    let digest_b = ::authenticode::file_digest(&b).unwrap();
    let both = payload::secureboot::Signed {
        ukis: Some([a.as_path(), b.as_path()]),
        ..Default::default()
    };
    let record = revoke(digest_b).to_meta();
    let e = payload::secureboot::check_disk_dbx(Some(&record), both).unwrap_err();
    assert!(
        format!("{e:#}")
            .contains("its UKI of slot B is revoked by this disk's Secure Boot updates"),
        "{e:#}"
    );
    // The boot loader too (it would replace the ESP's).
    let loader_b = payload::secureboot::Signed {
        loader: Some(b.as_path()),
        ..Default::default()
    };
    let e = payload::secureboot::check_disk_dbx(Some(&record), loader_b).unwrap_err();
    assert!(
        format!("{e:#}").contains("its boot loader is revoked by this disk's Secure Boot updates"),
        "{e:#}"
    );
    let other = revoke([5; 32]).to_meta();
    payload::secureboot::check_disk_dbx(Some(&other), both).unwrap();
    payload::secureboot::check_disk_dbx(None, both).unwrap();
    // The runtime's guard: a dbx update that revokes the disk's boot loader.
    let loader = std::fs::read(&b).unwrap();
    let (name, bytes) = &revoke(digest_b).updates[0];
    let u = payload::efivar::parse_update(name, bytes).unwrap();
    let e = payload::secureboot::check_loader_not_revoked(name, &u, &loader).unwrap_err();
    assert!(format!("{e:#}").contains("revokes the boot loader on this disk's ESP"));
    let ours = std::fs::read(&a).unwrap();
    payload::secureboot::check_loader_not_revoked(name, &u, &ours).unwrap();

    // A revoked certificate revokes every image its key signed.
    let revoke_cert = |der: &[u8]| {
        record_of(Changes {
            revoke_certs: vec![der.to_vec()],
            ..Changes::default()
        })
    };
    let db_cert = revoke_cert(&keys().db.cert_der);
    let e = payload::secureboot::check_disk_dbx(Some(&db_cert.to_meta()), both).unwrap_err();
    assert!(
        format!("{e:#}").contains(
            "its UKI of slot A is revoked by this disk's Secure Boot updates (by the certificate"
        ),
        "{e:#}"
    );
    let kek_cert = revoke_cert(&keys().kek.cert_der);
    payload::secureboot::check_disk_dbx(Some(&kek_cert.to_meta()), both).unwrap();
    let (name, bytes) = &db_cert.updates[0];
    let u = payload::efivar::parse_update(name, bytes).unwrap();
    let e = payload::secureboot::check_loader_not_revoked(name, &u, &ours).unwrap_err();
    assert!(
        format!("{e:#}").contains("revokes the boot loader on this disk's ESP (by the certificate"),
        "{e:#}"
    );
    // A rollback to a slot whose UKI the disk's updates revoke is refused
    // on a Secure Boot disk.
    let mut meta = contract::meta::Meta::default();
    meta.set(
        contract::meta::Tag::SecureBootUpdates,
        revoke(digest_b).to_meta().as_bytes(),
    );
    payload::secureboot::check_rollback(&meta, &loader).unwrap();
    meta.set(contract::meta::Tag::SecureBoot, b"(a certificate)");
    let e = payload::secureboot::check_rollback(&meta, &loader).unwrap_err();
    assert!(
        format!("{e:#}")
            .contains("its UKI is revoked by this disk's Secure Boot updates (by its digest"),
        "{e:#}"
    );
    payload::secureboot::check_rollback(&meta, &ours).unwrap();
    meta.set(
        contract::meta::Tag::SecureBootUpdates,
        db_cert.to_meta().as_bytes(),
    );
    assert!(payload::secureboot::check_rollback(&meta, &ours).is_err());
    // A db update revokes nothing.
    let added = record_of(Changes {
        add_db: vec![keys().db.cert_der.clone()],
        ..Changes::default()
    });
    payload::secureboot::check_disk_dbx(Some(&added.to_meta()), both).unwrap();
}
