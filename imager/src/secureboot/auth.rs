//! Signed EFI variable updates: the `PK.auth`, `KEK.auth` and `db.auth`
//! files firmware (or systemd-boot's `secure-boot-enroll`) writes into the
//! variables `PK`, `KEK` and `db` with `SetVariable`.
//!
//! A file is an `EFI_VARIABLE_AUTHENTICATION_2` followed by the variable's
//! data:
//!
//! - `EFI_TIME TimeStamp` (16 bytes): SOURCE_DATE_EPOCH as UTC, with
//!   `Pad1`, `Nanosecond`, `TimeZone`, `Daylight` and `Pad2` zero as the
//!   specification requires;
//! - `WIN_CERTIFICATE_UEFI_GUID`: `dwLength`, revision 0x0200, type
//!   `WIN_CERT_TYPE_EFI_GUID` (0x0EF1), `CertType` =
//!   `EFI_CERT_TYPE_PKCS7_GUID`, then a DER PKCS#7 SignedData (the bare
//!   SignedData, not wrapped in a ContentInfo: EDK2 reads the digest
//!   algorithm at a fixed offset in it), detached, SHA-256, signed over
//!   `VariableName ‖ VendorGuid ‖ Attributes ‖ TimeStamp ‖ Data`;
//! - the data: one `EFI_SIGNATURE_LIST` of type `EFI_CERT_X509_GUID` with
//!   one entry, our owner GUID and the DER certificate.
//!
//! `PK.auth` and `KEK.auth` are signed by the PK, `db.auth` by the KEK.
//!
//! A rotation's appends, `db.append.auth` and `dbx.append.auth`
//! ([`update_files`]), are signed by the KEK for
//! `EFI_VARIABLE_APPEND_WRITE`; `payload::efivar` reads them back.

use anyhow::{Context, Result, ensure};
use der::Encode;
use der::asn1::ObjectIdentifier;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use uuid::Uuid;

use super::authenticode::signed_data;
use super::keys::{SbKey, SecureBootKeys};

/// `EFI_GLOBAL_VARIABLE`: the vendor GUID of `PK` and `KEK`.
pub const EFI_GLOBAL_VARIABLE: Uuid = Uuid::from_u128(0x8be4df61_93ca_11d2_aa0d_00e098032b8c);
/// `EFI_IMAGE_SECURITY_DATABASE_GUID`: the vendor GUID of `db` and `dbx`.
pub const EFI_IMAGE_SECURITY_DATABASE: Uuid =
    Uuid::from_bytes_le(payload::efivar::IMAGE_SECURITY_DATABASE);
/// `EFI_CERT_X509_GUID`: a signature list of DER X.509 certificates.
pub const EFI_CERT_X509: Uuid = Uuid::from_bytes_le(payload::efivar::CERT_X509);
/// `EFI_CERT_TYPE_PKCS7_GUID`: `WIN_CERTIFICATE_UEFI_GUID.CertType`.
pub const EFI_CERT_TYPE_PKCS7: Uuid = Uuid::from_u128(0x4aafd29d_68df_49ee_8aa9_347d375665a7);
/// `WIN_CERT_TYPE_EFI_GUID`.
pub const WIN_CERT_TYPE_EFI_GUID: u16 = 0x0ef1;
/// NON_VOLATILE | BOOTSERVICE_ACCESS | RUNTIME_ACCESS |
/// TIME_BASED_AUTHENTICATED_WRITE_ACCESS: the attributes systemd-boot
/// writes the variables with (and the signed payload names).
pub const ATTRIBUTES: u32 = payload::efivar::ATTRIBUTES;
const ID_DATA: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.7.1");

/// A GUID as EFI lays it out (the first three fields little-endian).
pub fn guid_bytes(g: &Uuid) -> [u8; 16] {
    g.to_bytes_le()
}

/// An `EFI_SIGNATURE_LIST` of type `EFI_CERT_X509_GUID` with one entry:
/// `owner` and the DER certificate.
pub fn x509_signature_list(owner: &Uuid, cert_der: &[u8]) -> Result<Vec<u8>> {
    let entry = 16 + cert_der.len();
    let list = 16 + 4 + 4 + 4 + entry;
    let (Ok(list32), Ok(entry32)) = (u32::try_from(list), u32::try_from(entry)) else {
        anyhow::bail!("a certificate of {} bytes is too large", cert_der.len());
    };
    let mut v = Vec::with_capacity(list);
    v.extend_from_slice(&guid_bytes(&EFI_CERT_X509));
    v.extend_from_slice(&list32.to_le_bytes());
    v.extend_from_slice(&0u32.to_le_bytes()); // SignatureHeaderSize
    v.extend_from_slice(&entry32.to_le_bytes());
    v.extend_from_slice(&guid_bytes(owner));
    v.extend_from_slice(cert_der);
    Ok(v)
}

/// The `EFI_TIME` of a Unix time (UTC, whole seconds). Refuses a time
/// outside the years EFI_TIME can hold (1900 to 9999).
pub fn efi_time(epoch: u64) -> Result<[u8; 16]> {
    let secs = epoch % 86400;
    let (year, month, day) = contract::date::civil_from_days(epoch / 86400);
    ensure!(
        (1900..=9999).contains(&year),
        "SOURCE_DATE_EPOCH={epoch} is in the year {year}: an EFI_TIME holds 1900 to 9999"
    );
    let mut t = [0u8; 16];
    t[0..2].copy_from_slice(&(year as u16).to_le_bytes());
    t[2] = month as u8;
    t[3] = day as u8;
    t[4] = (secs / 3600) as u8;
    t[5] = (secs / 60 % 60) as u8;
    t[6] = (secs % 60) as u8;
    // Pad1, Nanosecond, TimeZone, Daylight, Pad2: zero.
    Ok(t)
}

/// The bytes an update of variable `name` (vendor `vendor`) is signed
/// over: `VariableName ‖ VendorGuid ‖ Attributes ‖ TimeStamp ‖ Data`, the
/// name in UCS-2 without its terminating NUL.
pub fn signed_payload(
    name: &str,
    vendor: &Uuid,
    attributes: u32,
    time: &[u8; 16],
    data: &[u8],
) -> Vec<u8> {
    let mut v = Vec::new();
    for u in name.encode_utf16() {
        v.extend_from_slice(&u.to_le_bytes());
    }
    v.extend_from_slice(&guid_bytes(vendor));
    v.extend_from_slice(&attributes.to_le_bytes());
    v.extend_from_slice(time);
    v.extend_from_slice(data);
    v
}

/// A time-based authenticated update (`EFI_VARIABLE_AUTHENTICATION_2` +
/// `data`) of variable `name` signed by `signer`, timestamped `epoch`.
pub fn signed_update(
    name: &str,
    vendor: &Uuid,
    data: &[u8],
    epoch: u64,
    signer: &SbKey,
) -> Result<Vec<u8>> {
    signed_write(name, vendor, ATTRIBUTES, data, epoch, signer)
}

/// [`signed_update`] with the attributes the update is signed for (an
/// append adds `EFI_VARIABLE_APPEND_WRITE`: firmware checks the signature
/// over the attributes it is called with).
fn signed_write(
    name: &str,
    vendor: &Uuid,
    attributes: u32,
    data: &[u8],
    epoch: u64,
    signer: &SbKey,
) -> Result<Vec<u8>> {
    let time = efi_time(epoch)?;
    let payload = signed_payload(name, vendor, attributes, &time, data);
    let digest = Sha256::digest(&payload);
    let ci = signed_data(signer, ID_DATA, None, Some(&digest))?;
    // The bare SignedData: ContentInfo's [0] content.
    let sd = ci.content.to_der().context("encoding the SignedData")?;
    let len = 4 + 2 + 2 + 16 + sd.len();
    let len32 = u32::try_from(len).context("the signature is too large")?;
    let mut v = Vec::with_capacity(16 + len + data.len());
    v.extend_from_slice(&time);
    v.extend_from_slice(&len32.to_le_bytes());
    v.extend_from_slice(&0x0200u16.to_le_bytes());
    v.extend_from_slice(&WIN_CERT_TYPE_EFI_GUID.to_le_bytes());
    v.extend_from_slice(&guid_bytes(&EFI_CERT_TYPE_PKCS7));
    v.extend_from_slice(&sd);
    v.extend_from_slice(data);
    Ok(v)
}

/// `EFI_CERT_SHA256_GUID`: a signature list of SHA-256 digests.
pub const EFI_CERT_SHA256: Uuid = Uuid::from_bytes_le(payload::efivar::CERT_SHA256);

/// An `EFI_SIGNATURE_LIST` of type `EFI_CERT_SHA256_GUID`: one entry per
/// digest, each with `owner`.
pub fn sha256_signature_list(owner: &Uuid, digests: &[[u8; 32]]) -> Vec<u8> {
    let entry = 16 + 32;
    let mut v = Vec::with_capacity(28 + entry * digests.len());
    v.extend_from_slice(&guid_bytes(&EFI_CERT_SHA256));
    v.extend_from_slice(&((28 + entry * digests.len()) as u32).to_le_bytes());
    v.extend_from_slice(&0u32.to_le_bytes());
    v.extend_from_slice(&(entry as u32).to_le_bytes());
    for d in digests {
        v.extend_from_slice(&guid_bytes(owner));
        v.extend_from_slice(d);
    }
    v
}

/// What a rotation asks of firmware: certificates to add to db, images to
/// forbid through dbx (their Authenticode digests).
#[derive(Debug, Clone, Default)]
pub struct Changes {
    /// DER certificates.
    pub add_db: Vec<Vec<u8>>,
    /// Authenticode SHA-256 digests.
    pub revoke: Vec<[u8; 32]>,
    /// DER certificates whose key's every signature firmware must refuse.
    pub revoke_certs: Vec<Vec<u8>>,
}

/// The signed appends of `changes`, `(file name, bytes)`: `db.append.auth`
/// (one X.509 list per certificate) when certificates are added,
/// `dbx.append.auth` (one X.509 list per revoked certificate, then one
/// SHA-256 list) when certificates or images are revoked; each
/// signed by the KEK for `EFI_VARIABLE_APPEND_WRITE`, time-stamped `epoch`
/// (firmware takes an append whatever its time, and adds only what the
/// variable lacks). Sorted and deduplicated: the same changes give the
/// same bytes.
pub fn update_files(
    keys: &SecureBootKeys,
    epoch: u64,
    changes: &Changes,
) -> Result<Vec<(&'static str, Vec<u8>)>> {
    use payload::efivar::{APPEND_WRITE, MAX_LEN, Var};
    let mut certs = changes.add_db.clone();
    certs.sort();
    certs.dedup();
    let mut digests = changes.revoke.clone();
    digests.sort();
    digests.dedup();
    let mut revoked = changes.revoke_certs.clone();
    revoked.sort();
    revoked.dedup();
    let lists = |certs: &[Vec<u8>]| -> Result<Vec<u8>> {
        let mut v = Vec::new();
        for c in certs {
            v.extend(x509_signature_list(&keys.owner, c)?);
        }
        Ok(v)
    };
    let db = lists(&certs)?;
    let mut dbx = lists(&revoked)?;
    if !digests.is_empty() {
        dbx.extend(sha256_signature_list(&keys.owner, &digests));
    }
    let mut out = Vec::new();
    for (var, data) in [(Var::Db, db), (Var::Dbx, dbx)] {
        if data.is_empty() {
            continue;
        }
        let name = var.file_name();
        let signed_by_kek = signed_write(
            var.name(),
            &EFI_IMAGE_SECURITY_DATABASE,
            ATTRIBUTES | APPEND_WRITE,
            &data,
            epoch,
            &keys.kek,
        )?;
        ensure!(
            signed_by_kek.len() <= MAX_LEN,
            "{name} would be {} bytes, more than {MAX_LEN}: add fewer certificates or revoke \
             fewer images at a time",
            signed_by_kek.len()
        );
        out.push((name, signed_by_kek));
    }
    ensure!(
        !out.is_empty(),
        "nothing to write: name a certificate to add to db (--add-db), an image to revoke \
         (--revoke) or a certificate to revoke (--revoke-cert)"
    );
    Ok(out)
}

/// The three enrolment files, `(file name, bytes)`, in the order firmware
/// must take them when it is asked to enrol them itself: db and KEK while
/// still in setup mode, PK last (it ends setup mode).
pub fn enrolment_files(keys: &SecureBootKeys, epoch: u64) -> Result<Vec<(&'static str, Vec<u8>)>> {
    let list = |k: &SbKey| x509_signature_list(&keys.owner, &k.cert_der);
    Ok(vec![
        (
            "db.auth",
            signed_update(
                "db",
                &EFI_IMAGE_SECURITY_DATABASE,
                &list(&keys.db)?,
                epoch,
                &keys.kek,
            )?,
        ),
        (
            "KEK.auth",
            signed_update(
                "KEK",
                &EFI_GLOBAL_VARIABLE,
                &list(&keys.kek)?,
                epoch,
                &keys.pk,
            )?,
        ),
        (
            "PK.auth",
            signed_update(
                "PK",
                &EFI_GLOBAL_VARIABLE,
                &list(&keys.pk)?,
                epoch,
                &keys.pk,
            )?,
        ),
    ])
}

/// Writes `PK.auth`, `KEK.auth` and `db.auth` into `dir`, all three or
/// none (staged in `dir`, moved in together); the same keys and epoch give
/// the same bytes.
pub fn write_enrolment(keys: &SecureBootKeys, epoch: u64, dir: &Path) -> Result<Vec<PathBuf>> {
    write_files(&enrolment_files(keys, epoch)?, dir)
}

/// Writes `files` into `dir`, all or none (staged in `dir`, moved in
/// together).
pub fn write_files(files: &[(&'static str, Vec<u8>)], dir: &Path) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let staging = crate::io::Staging::create(dir, "secure-boot-auth")?;
    let names: Vec<&str> = files.iter().map(|(n, _)| *n).collect();
    staging.check_destinations(&names)?;
    for (name, bytes) in files {
        crate::io::write_atomic(staging.join(name), bytes, 0o644)?;
    }
    staging.commit(&names)?;
    Ok(names.iter().map(|n| dir.join(n)).collect())
}
