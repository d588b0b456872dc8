//! Authenticode signing: a PE signed with a db key. The format, the digest
//! and the verifying half are the `authenticode` crate's (re-exported
//! here), which machined shares.

use anyhow::{Context, Result, bail};
use cms::builder::{SignedDataBuilder, SignerInfoBuilder};
use cms::cert::{CertificateChoices, IssuerAndSerialNumber};
use cms::content_info::ContentInfo;
use cms::signed_data::{EncapsulatedContentInfo, SignerIdentifier};
use der::asn1::{ObjectIdentifier, OctetString};
use der::{Any, Decode, Encode};
use rsa::pkcs1v15::Signature;
use std::path::{Path, PathBuf};
use x509_cert::spki::AlgorithmIdentifierOwned;

pub use ::authenticode::{
    Embedded, MAX_HEADERS, MAX_TABLE, PeLayout, SHA256, SPC_INDIRECT_DATA, SPC_PE_IMAGE_DATA,
    Verified, WIN_CERT_REVISION_2_0, WIN_CERT_TYPE_PKCS_SIGNED_DATA, digest, digest_file,
    digest_with, file_digest, layout, layout_of, parse_embedded, verify, verify_file,
};

use super::keys::SbKey;

/// DER of a TLV with a short or long length.
fn tlv(tag: u8, body: &[u8]) -> Vec<u8> {
    let mut v = vec![tag];
    let n = body.len();
    if n < 0x80 {
        v.push(n as u8);
    } else {
        let bytes = n.to_be_bytes();
        let skip = bytes
            .iter()
            .position(|&x| x != 0)
            .unwrap_or(bytes.len() - 1);
        v.push(0x80 | (bytes.len() - skip) as u8);
        v.extend_from_slice(&bytes[skip..]);
    }
    v.extend_from_slice(body);
    v
}

/// The DER `SpcIndirectDataContent` of a PE digest:
/// `SEQUENCE { SEQUENCE { SPC_PE_IMAGE_DATA, SpcPeImageData }, DigestInfo }`
/// with `SpcPeImageData ::= SEQUENCE { flags BIT STRING (empty), file [0]
/// { [2] { [0] "" } } }`: no link, as every signer but signtool writes it.
pub fn spc_indirect_data(digest: &[u8; 32]) -> Result<Vec<u8>> {
    let pe_image_data = tlv(
        0x30,
        &[
            &[0x03, 0x01, 0x00][..],
            &[0xa0, 0x04, 0xa2, 0x02, 0x80, 0x00],
        ]
        .concat(),
    );
    let data = tlv(0x30, &[SPC_PE_IMAGE_DATA.to_der()?, pe_image_data].concat());
    let alg = AlgorithmIdentifierOwned {
        oid: SHA256,
        parameters: Some(Any::null()),
    };
    let digest_info = tlv(
        0x30,
        &[alg.to_der()?, OctetString::new(&digest[..])?.to_der()?].concat(),
    );
    Ok(tlv(0x30, &[data, digest_info].concat()))
}

/// A PKCS#7 SignedData (as a ContentInfo) by `key` with its certificate
/// over `econtent` of type `content_type` (Authenticode), or, with
/// `detached` set, over external content whose SHA-256 is `detached`
/// (variable updates). Signed attributes: content type and message digest
/// only (no signing time: the output depends on the inputs alone).
pub(super) fn signed_data(
    key: &SbKey,
    content_type: ObjectIdentifier,
    econtent: Option<Any>,
    detached: Option<&[u8]>,
) -> Result<ContentInfo> {
    let digest_alg = AlgorithmIdentifierOwned {
        oid: SHA256,
        parameters: None,
    };
    let eci = EncapsulatedContentInfo {
        econtent_type: content_type,
        econtent,
    };
    let sid = SignerIdentifier::IssuerAndSerialNumber(IssuerAndSerialNumber {
        issuer: key.cert.tbs_certificate.issuer.clone(),
        serial_number: key.cert.tbs_certificate.serial_number.clone(),
    });
    let signer = SignerInfoBuilder::new(key, sid, digest_alg.clone(), &eci, detached)
        .map_err(|e| anyhow::anyhow!("preparing the signer info: {e}"))?;
    let mut b = SignedDataBuilder::new(&eci);
    b.add_digest_algorithm(digest_alg)
        .and_then(|b| b.add_certificate(CertificateChoices::Certificate(key.cert.clone())))
        .map_err(|e| anyhow::anyhow!("preparing the SignedData: {e}"))?;
    b.add_signer_info::<SbKey, Signature>(signer)
        .map_err(|e| anyhow::anyhow!("signing with the {} key: {e}", key.name))?;
    b.build()
        .map_err(|e| anyhow::anyhow!("encoding the SignedData: {e}"))
}

/// Signs a PE image held in memory: pads it to 8 bytes, appends the
/// `WIN_CERTIFICATE` and sets the certificate-table entry and the PE
/// checksum. Refuses a PE that is already signed: sign the unsigned file
/// (replacing or adding signatures would hide a mix-up of keys).
pub fn sign_bytes(pe: &[u8], key: &SbKey) -> Result<Vec<u8>> {
    let l = layout(pe)?;
    if let Some((_, size)) = l.cert_table {
        bail!(
            "the image is already signed (a {size}-byte certificate table): sign the unsigned \
             original; imager neither adds a second signature nor replaces one"
        );
    }
    let mut out = pe.to_vec();
    out.resize(pe.len().div_ceil(8) * 8, 0);
    let l = layout(&out)?;
    let digest = digest_with(&out, &l);
    let spc = spc_indirect_data(&digest)?;
    let econtent = Any::from_der(&spc).context("encoding SpcIndirectDataContent")?;
    let ci = signed_data(key, SPC_INDIRECT_DATA, Some(econtent), None)?;
    let pkcs7 = ci.to_der().context("encoding the PKCS#7 signature")?;
    let table_at = out.len();
    let entry_len = 8 + pkcs7.len();
    let table_len = entry_len.div_ceil(8) * 8;
    let (Ok(table_at32), Ok(table_len32), Ok(entry_len32)) = (
        u32::try_from(table_at),
        u32::try_from(table_len),
        u32::try_from(entry_len),
    ) else {
        bail!("the image is too large for a PE certificate table (4 GiB)");
    };
    out.extend_from_slice(&entry_len32.to_le_bytes());
    out.extend_from_slice(&WIN_CERT_REVISION_2_0.to_le_bytes());
    out.extend_from_slice(&WIN_CERT_TYPE_PKCS_SIGNED_DATA.to_le_bytes());
    out.extend_from_slice(&pkcs7);
    out.resize(table_at + table_len, 0);
    out[l.cert_dir_at..l.cert_dir_at + 4].copy_from_slice(&table_at32.to_le_bytes());
    out[l.cert_dir_at + 4..l.cert_dir_at + 8].copy_from_slice(&table_len32.to_le_bytes());
    let sum = crate::uki::pe_checksum(&out, l.checksum_at);
    out[l.checksum_at..l.checksum_at + 4].copy_from_slice(&sum.to_le_bytes());
    Ok(out)
}

/// What [`sign`] did.
#[derive(Debug, Clone)]
pub struct SignReport {
    pub path: PathBuf,
    /// The Authenticode SHA-256 digest signed, in hex.
    pub digest: String,
    /// The signer's certificate subject.
    pub signer: String,
    pub size: u64,
}

/// Signs the PE `input` with `key` into `dest` (atomically; `dest` may be
/// `input`).
pub fn sign(input: &Path, key: &SbKey, dest: &Path) -> Result<SignReport> {
    let pe = std::fs::read(input).with_context(|| format!("reading {}", input.display()))?;
    let signed = sign_bytes(&pe, key).with_context(|| format!("signing {}", input.display()))?;
    let embedded = parse_embedded(&signed)?;
    crate::io::write_atomic(dest, &signed, 0o644)?;
    Ok(SignReport {
        path: dest.to_path_buf(),
        digest: hex::encode(embedded.digest),
        signer: key.subject(),
        size: signed.len() as u64,
    })
}
