//! An embedded Authenticode signature: read, then checked against a
//! certificate.

use anyhow::{Context, Result, bail, ensure};
use cms::content_info::ContentInfo;
use cms::signed_data::SignedData;
use der::asn1::{ObjectIdentifier, OctetString};
use der::{Any, Decode, Encode, Reader, Sequence};
use rsa::pkcs1v15::{Signature, VerifyingKey};
use rsa::signature::Verifier;
use sha2::{Digest, Sha256};
use std::path::Path;
use x509_cert::Certificate;
use x509_cert::spki::AlgorithmIdentifierOwned;

use crate::cert::cert_public_key;
use crate::pe::*;

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
    parse_table(&pe[at..at + size], layout)
}

/// The most bytes of a certificate table read from a file: one signature
/// with its certificate is a few KiB.
pub const MAX_TABLE: usize = 1 << 20;

/// [`parse_embedded`] of the certificate table `table` of a PE laid out as
/// `layout`.
fn parse_table(table: &[u8], layout: PeLayout) -> Result<Embedded> {
    let size = table.len();
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
        "the image has more than one signature: exactly one is read"
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
        "the image digest is {}, not SHA-256: only SHA-256 signatures are checked",
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
    check(&e, actual, cert)
}

/// [`verify`] of the parsed signature `e` of an image whose digest is
/// `actual`.
fn check(e: &Embedded, actual: [u8; 32], cert: &Certificate) -> Result<Verified> {
    ensure!(
        actual == e.digest,
        "the image does not match its signature (digest {} signed, {} now): it was changed \
         after signing",
        hex::encode(e.digest),
        hex::encode(actual)
    );
    ensure!(
        e.signed_data.signer_infos.0.len() == 1,
        "the signature has {} signers: exactly one is read",
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

/// The Authenticode SHA-256 digest of the PE file at `path`, signed or
/// not, streamed (its headers bounded by [`MAX_HEADERS`]): what a dbx
/// entry revoking that image holds.
pub fn file_digest(path: &Path) -> Result<[u8; 32]> {
    let (mut f, head, len, layout) = open_pe(path)?;
    digest_file(&mut f, &head, len, &layout).with_context(|| format!("{}", path.display()))
}

/// The PE file at `path` opened: the file, its headers (at most
/// [`MAX_HEADERS`] bytes), its length and its layout.
fn open_pe(path: &Path) -> Result<(std::fs::File, Vec<u8>, u64, PeLayout)> {
    use std::io::Read;
    let within = || format!("{}", path.display());
    let mut f = std::fs::File::open(path).with_context(|| format!("reading {}", path.display()))?;
    let len = f.metadata().with_context(within)?.len();
    let ulen = usize::try_from(len).context("the image is too large")?;
    let mut head = Vec::new();
    (&mut f)
        .take(MAX_HEADERS as u64)
        .read_to_end(&mut head)
        .with_context(within)?;
    let layout = layout_of(&head, ulen).with_context(within)?;
    Ok((f, head, len, layout))
}

/// A signed PE file read once ([`read_signed_file`]): its signature and
/// its digest, checked against any number of certificates without reading
/// it again.
#[derive(Debug, Clone)]
pub struct SignedFile {
    e: Embedded,
    actual: [u8; 32],
}

impl SignedFile {
    /// The file's Authenticode SHA-256 digest.
    pub fn digest(&self) -> [u8; 32] {
        self.actual
    }

    /// [`verify`] against `cert`.
    pub fn verify(&self, cert: &Certificate) -> Result<Verified> {
        check(&self.e, self.actual, cert)
    }
}

/// Reads a signed PE file, streamed: its headers and its signature (each
/// bounded: [`MAX_HEADERS`], [`MAX_TABLE`]), its sections hashed a buffer
/// at a time, so that a UKI of tens of MiB costs a few hundred KiB of
/// memory (the node's budget: docs/node-api.md). `None` for an image with
/// no certificate table; a table that does not read as one signature is
/// an error.
pub fn read_signed_file(path: &Path) -> Result<Option<SignedFile>> {
    use std::io::{Read, Seek, SeekFrom};
    let within = || format!("{}", path.display());
    let (mut f, head, len, layout) = open_pe(path)?;
    let Some((at, size)) = layout.cert_table else {
        return Ok(None);
    };
    ensure!(
        size <= MAX_TABLE,
        "{}: its certificate table is {size} bytes: more than the {MAX_TABLE} one signature \
         needs",
        path.display()
    );
    let mut table = vec![0u8; size];
    f.seek(SeekFrom::Start(at as u64))
        .and_then(|_| f.read_exact(&mut table))
        .with_context(within)?;
    let e = parse_table(&table, layout).with_context(within)?;
    let actual = digest_file(&mut f, &head, len, &e.layout).with_context(within)?;
    Ok(Some(SignedFile { e, actual }))
}

/// [`read_signed_file`] of a PE image in memory.
pub fn read_signed(pe: &[u8]) -> Result<Option<SignedFile>> {
    if layout(pe)?.cert_table.is_none() {
        return Ok(None);
    }
    let e = parse_embedded(pe)?;
    let actual = digest_with(pe, &e.layout);
    Ok(Some(SignedFile { e, actual }))
}

/// [`verify`] on a file, streamed ([`read_signed_file`]).
pub fn verify_file(path: &Path, cert: &Certificate) -> Result<Verified> {
    read_signed_file(path)?
        .with_context(|| {
            format!(
                "{}: the image is not signed (it has no certificate table)",
                path.display()
            )
        })?
        .verify(cert)
        .with_context(|| format!("{}", path.display()))
}
