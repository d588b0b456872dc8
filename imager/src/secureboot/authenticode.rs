//! Authenticode: the PE image digest, signing a PE with a db key and
//! verifying an embedded signature against a certificate.
//!
//! The digest (SHA-256) covers, in this order: the headers up to
//! `SizeOfHeaders` without the checksum field and the certificate-table
//! data directory entry; the raw data of every section with data, in file
//! order; and whatever follows the last section up to the certificate
//! table. A layout the digest cannot cover unambiguously (sections
//! overlapping the headers or each other, gaps between sections, a
//! certificate table that is not last in the file) is refused, so that we,
//! `sbverify` and the firmware can never disagree about what was signed.
//!
//! The signature is a PKCS#7 SignedData over an `SpcIndirectDataContent`
//! (`SpcPeImageData` + `DigestInfo`), with the signer's certificate, in a
//! `WIN_CERTIFICATE` (revision 0x0200, type `PKCS_SIGNED_DATA`) appended
//! at an 8-byte boundary and pointed to by data directory 4.

use anyhow::{Context, Result, bail, ensure};
use cms::builder::{SignedDataBuilder, SignerInfoBuilder};
use cms::cert::{CertificateChoices, IssuerAndSerialNumber};
use cms::content_info::ContentInfo;
use cms::signed_data::{EncapsulatedContentInfo, SignedData, SignerIdentifier};
use der::asn1::{ObjectIdentifier, OctetString};
use der::{Any, Decode, Encode, Reader, Sequence};
use rsa::pkcs1v15::{Signature, VerifyingKey};
use rsa::signature::Verifier;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use x509_cert::Certificate;
use x509_cert::spki::AlgorithmIdentifierOwned;

use super::keys::{SbKey, cert_public_key};

/// `SPC_INDIRECT_DATA_OBJID`: the content type of an Authenticode signature.
pub const SPC_INDIRECT_DATA: ObjectIdentifier =
    ObjectIdentifier::new_unwrap("1.3.6.1.4.1.311.2.1.4");
/// `SPC_PE_IMAGE_DATAOBJ`: the attribute type naming a PE image.
pub const SPC_PE_IMAGE_DATA: ObjectIdentifier =
    ObjectIdentifier::new_unwrap("1.3.6.1.4.1.311.2.1.15");
pub const SHA256: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.16.840.1.101.3.4.2.1");
const RSA_ENCRYPTION: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.1.1");
const SHA256_WITH_RSA: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.1.11");
const ID_SIGNED_DATA: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.7.2");
const ID_CONTENT_TYPE: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.9.3");
const ID_MESSAGE_DIGEST: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.9.4");

/// `WIN_CERTIFICATE.wRevision` of the current format.
pub const WIN_CERT_REVISION_2_0: u16 = 0x0200;
/// `WIN_CERT_TYPE_PKCS_SIGNED_DATA`.
pub const WIN_CERT_TYPE_PKCS_SIGNED_DATA: u16 = 0x0002;
/// The certificate table, data directory 4.
const DIR_SECURITY: usize = 4;
const SECTION_HEADER: usize = 40;

/// Where the parts of a PE sit, as far as the digest is concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeLayout {
    /// Offset of the optional header's `CheckSum`.
    pub checksum_at: usize,
    /// Offset of the certificate-table data directory entry (8 bytes).
    pub cert_dir_at: usize,
    pub size_of_headers: usize,
    /// `(offset, size)` of every section's raw data, in file order.
    pub sections: Vec<(usize, usize)>,
    /// `(offset, size)` of the certificate table, if any.
    pub cert_table: Option<(usize, usize)>,
}

fn u16_at(b: &[u8], o: usize) -> Option<u16> {
    let s = b.get(o..o.checked_add(2)?)?;
    Some(u16::from_le_bytes([s[0], s[1]]))
}

fn u32_at(b: &[u8], o: usize) -> Option<u32> {
    let s = b.get(o..o.checked_add(4)?)?;
    Some(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
}

/// Parses the parts of a PE the Authenticode digest needs, refusing what
/// it cannot cover (see the module doc).
pub fn layout(b: &[u8]) -> Result<PeLayout> {
    const NOT_PE: &str = "not a PE/COFF image";
    ensure!(b.starts_with(b"MZ"), "{NOT_PE} (no MZ header)");
    let pe = u32_at(b, 0x3c).context("not a PE/COFF image (truncated DOS header)")? as usize;
    ensure!(
        pe >= 0x40 && b.get(pe..pe.saturating_add(4)) == Some(&b"PE\0\0"[..]),
        "{NOT_PE} (no PE signature at the offset the DOS header gives)"
    );
    let coff = pe + 4;
    let nsec = usize::from(u16_at(b, coff + 2).context("truncated COFF header")?);
    let opt_size = usize::from(u16_at(b, coff + 16).context("truncated COFF header")?);
    let opt = coff + 20;
    let magic = u16_at(b, opt).context("truncated optional header")?;
    let (nrva_at, dirs_at) = match magic {
        0x10b => (92, 96),
        0x20b => (108, 112),
        m => bail!("optional header magic {m:#06x} is neither PE32 nor PE32+"),
    };
    let dirs_needed = dirs_at + (DIR_SECURITY + 1) * 8;
    ensure!(
        opt_size >= dirs_needed && b.len() >= opt + opt_size,
        "the optional header has no certificate-table data directory (it is {opt_size} bytes)"
    );
    let nrva = u32_at(b, opt + nrva_at).context("truncated optional header")?;
    ensure!(
        nrva as usize > DIR_SECURITY,
        "the PE has {nrva} data directories: none for a certificate table"
    );
    let size_of_headers = u32_at(b, opt + 60).context("truncated optional header")? as usize;
    let section_table = opt + opt_size;
    let table_end = section_table + nsec * SECTION_HEADER;
    ensure!(
        size_of_headers >= table_end && size_of_headers <= b.len(),
        "SizeOfHeaders {size_of_headers} does not cover the headers (they end at {table_end}) or \
         runs past the file ({} bytes)",
        b.len()
    );
    let cert_dir_at = opt + dirs_at + DIR_SECURITY * 8;
    let cert_off = u32_at(b, cert_dir_at).unwrap_or(0) as usize;
    let cert_size = u32_at(b, cert_dir_at + 4).unwrap_or(0) as usize;
    let cert_table = match (cert_off, cert_size) {
        (0, 0) => None,
        (o, s) => {
            ensure!(
                o.checked_add(s) == Some(b.len()) && o % 8 == 0 && s >= 8,
                "the certificate table ({s} bytes at {o}) is not an aligned table at the end of \
                 the file ({} bytes): the signature cannot be read or replaced safely",
                b.len()
            );
            Some((o, s))
        }
    };
    let data_end = cert_table.map_or(b.len(), |(o, _)| o);
    let mut sections = Vec::new();
    for i in 0..nsec {
        let h = section_table + i * SECTION_HEADER;
        let size = u32_at(b, h + 16).context("truncated section table")? as usize;
        let ptr = u32_at(b, h + 20).context("truncated section table")? as usize;
        if size == 0 {
            continue;
        }
        ensure!(
            ptr.checked_add(size).is_some_and(|e| e <= data_end),
            "section {i}'s data ({size} bytes at {ptr}) runs past the file's data ({data_end} \
             bytes)"
        );
        sections.push((ptr, size));
    }
    sections.sort_unstable();
    let mut at = size_of_headers;
    for &(ptr, size) in &sections {
        ensure!(
            ptr == at,
            "section data at {ptr} does not follow the previous data (which ends at {at}): \
             overlapping sections, or a gap the Authenticode digest would not cover the same \
             way everywhere; relink the image with contiguous sections"
        );
        at = ptr + size;
    }
    Ok(PeLayout {
        checksum_at: opt + 64,
        cert_dir_at,
        size_of_headers,
        sections,
        cert_table,
    })
}

/// The Authenticode SHA-256 digest of a PE with layout `l`.
pub fn digest_with(b: &[u8], l: &PeLayout) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(&b[..l.checksum_at]);
    h.update(&b[l.checksum_at + 4..l.cert_dir_at]);
    h.update(&b[l.cert_dir_at + 8..l.size_of_headers]);
    let mut hashed = l.size_of_headers;
    for &(ptr, size) in &l.sections {
        h.update(&b[ptr..ptr + size]);
        hashed += size;
    }
    let end = l.cert_table.map_or(b.len(), |(o, _)| o);
    if end > hashed {
        h.update(&b[hashed..end]);
    }
    h.finalize().into()
}

/// The Authenticode SHA-256 digest of a PE.
pub fn digest(b: &[u8]) -> Result<[u8; 32]> {
    let l = layout(b)?;
    Ok(digest_with(b, &l))
}

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

/// `SpcIndirectDataContent`, as far as verification reads it.
#[derive(Sequence)]
struct SpcIndirectDataContent {
    data: SpcAttributeTypeAndOptionalValue,
    message_digest: DigestInfo,
}

#[derive(Sequence)]
struct SpcAttributeTypeAndOptionalValue {
    kind: ObjectIdentifier,
    value: Option<Any>,
}

#[derive(Sequence)]
struct DigestInfo {
    algorithm: AlgorithmIdentifierOwned,
    digest: OctetString,
}

/// An embedded signature, parsed (nothing verified yet).
#[derive(Debug, Clone)]
pub struct Embedded {
    /// The PE's layout.
    pub layout: PeLayout,
    /// The digest the signature claims for the image.
    pub digest: [u8; 32],
    /// The signed data.
    pub signed_data: SignedData,
    /// The value bytes of the `SpcIndirectDataContent` (what the signed
    /// message-digest attribute covers).
    content: Vec<u8>,
}

/// Reads the one Authenticode signature of a PE without checking it:
/// exactly one `WIN_CERTIFICATE` of revision 2.0 and type PKCS_SIGNED_DATA
/// holding a PKCS#7 SignedData of `SpcIndirectDataContent` with a SHA-256
/// digest of a PE image. Untrusted bytes: never panics.
pub fn parse_embedded(pe: &[u8]) -> Result<Embedded> {
    let layout = layout(pe)?;
    let Some((at, size)) = layout.cert_table else {
        bail!("the image is not signed (it has no certificate table)");
    };
    let table = &pe[at..at + size];
    let len = u32_at(table, 0).unwrap_or(0) as usize;
    let rev = u16_at(table, 4).unwrap_or(0);
    let kind = u16_at(table, 6).unwrap_or(0);
    ensure!(
        len > 8 && len <= size,
        "the certificate table's entry is {len} bytes in a {size}-byte table"
    );
    ensure!(
        rev == WIN_CERT_REVISION_2_0 && kind == WIN_CERT_TYPE_PKCS_SIGNED_DATA,
        "the certificate table holds a WIN_CERTIFICATE of revision {rev:#06x} and type \
         {kind:#06x}, not an Authenticode signature (0x0200, PKCS_SIGNED_DATA 0x0002)"
    );
    let rest = table.get(len.div_ceil(8) * 8..).unwrap_or(&[]);
    ensure!(
        rest.iter().all(|&b| b == 0),
        "the image has more than one signature: imager reads exactly one"
    );
    let mut r = der::SliceReader::new(&table[8..len]).context("the signature is empty")?;
    let ci = ContentInfo::decode(&mut r).context("the signature is not PKCS#7 (DER)")?;
    // A signer may pad the entry with zeros after the DER.
    let trailing = r.read_slice(r.remaining_len()).unwrap_or(&[]);
    ensure!(
        trailing.iter().all(|&b| b == 0),
        "bytes after the PKCS#7 signature"
    );
    ensure!(
        ci.content_type == ID_SIGNED_DATA,
        "the PKCS#7 content is not SignedData"
    );
    let sd: SignedData = ci
        .content
        .decode_as()
        .context("the PKCS#7 SignedData is malformed")?;
    ensure!(
        sd.encap_content_info.econtent_type == SPC_INDIRECT_DATA,
        "the signed content is {}, not Authenticode's SpcIndirectDataContent",
        sd.encap_content_info.econtent_type
    );
    let econtent = sd
        .encap_content_info
        .econtent
        .as_ref()
        .context("the signature has no SpcIndirectDataContent")?;
    let spc: SpcIndirectDataContent = econtent
        .decode_as()
        .context("the SpcIndirectDataContent is malformed")?;
    ensure!(
        spc.data.kind == SPC_PE_IMAGE_DATA,
        "the signature is not for a PE image (attribute type {})",
        spc.data.kind
    );
    ensure!(
        spc.message_digest.algorithm.oid == SHA256,
        "the image digest is {}, not SHA-256: imager checks SHA-256 signatures only",
        spc.message_digest.algorithm.oid
    );
    let digest: [u8; 32] = spc
        .message_digest
        .digest
        .as_bytes()
        .try_into()
        .context("the image digest is not 32 bytes")?;
    Ok(Embedded {
        layout,
        digest,
        content: econtent.value().to_vec(),
        signed_data: sd,
    })
}

/// What [`verify`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// The Authenticode SHA-256 digest of the image, in hex.
    pub digest: String,
    /// The subject of the certificate the signature verified against.
    pub signer: String,
}

/// Checks a signed PE against `cert` (a db certificate): the embedded
/// digest must be the image's, the signed attributes must carry the
/// content's digest and type, and the signature must verify with the
/// certificate's key. Anything else is an error saying which check failed.
pub fn verify(pe: &[u8], cert: &Certificate) -> Result<Verified> {
    let e = parse_embedded(pe)?;
    let actual = digest_with(pe, &e.layout);
    ensure!(
        actual == e.digest,
        "the image does not match its signature (digest {} signed, {} now): it was changed \
         after signing",
        hex::encode(e.digest),
        hex::encode(actual)
    );
    ensure!(
        e.signed_data.signer_infos.0.len() == 1,
        "the signature has {} signers: imager reads exactly one",
        e.signed_data.signer_infos.0.len()
    );
    let si = &e.signed_data.signer_infos.0.as_slice()[0];
    ensure!(
        si.digest_alg.oid == SHA256,
        "the signer digests with {}, not SHA-256",
        si.digest_alg.oid
    );
    let attrs = si
        .signed_attrs
        .as_ref()
        .context("the signature has no signed attributes (Authenticode requires them)")?;
    let attr = |oid: ObjectIdentifier| -> Result<&Any> {
        let a = attrs
            .iter()
            .find(|a| a.oid == oid)
            .with_context(|| format!("the signed attributes lack {oid}"))?;
        ensure!(
            a.values.len() == 1,
            "signed attribute {oid} has no single value"
        );
        Ok(&a.values.as_slice()[0])
    };
    let md: OctetString = attr(ID_MESSAGE_DIGEST)?
        .decode_as()
        .context("the message-digest attribute is malformed")?;
    ensure!(
        md.as_bytes() == Sha256::digest(&e.content).as_slice(),
        "the signed message digest does not match the SpcIndirectDataContent"
    );
    let ct: ObjectIdentifier = attr(ID_CONTENT_TYPE)?
        .decode_as()
        .context("the content-type attribute is malformed")?;
    ensure!(
        ct == SPC_INDIRECT_DATA,
        "the signed content type is {ct}, not SpcIndirectDataContent"
    );
    ensure!(
        si.signature_algorithm.oid == RSA_ENCRYPTION
            || si.signature_algorithm.oid == SHA256_WITH_RSA,
        "the signature algorithm {} is not RSA with SHA-256",
        si.signature_algorithm.oid
    );
    let signed = attrs.to_der().context("encoding the signed attributes")?;
    let key = VerifyingKey::<Sha256>::new(cert_public_key(cert)?);
    let sig = Signature::try_from(si.signature.as_bytes())
        .map_err(|_| anyhow::anyhow!("the signature value is malformed"))?;
    key.verify(&signed, &sig).map_err(|_| {
        anyhow::anyhow!(
            "the signature does not verify with the certificate {}: the image was signed with \
             another key",
            cert.tbs_certificate.subject
        )
    })?;
    Ok(Verified {
        digest: hex::encode(actual),
        signer: cert.tbs_certificate.subject.to_string(),
    })
}

/// [`verify`] on a file.
pub fn verify_file(path: &Path, cert: &Certificate) -> Result<Verified> {
    let pe = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    verify(&pe, cert).with_context(|| format!("{}", path.display()))
}
