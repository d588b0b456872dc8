//! The PE image as the Authenticode digest sees it (see the crate's doc).

use anyhow::{Context, Result, bail, ensure};
use der::asn1::ObjectIdentifier;
use sha2::{Digest, Sha256};

/// `SPC_INDIRECT_DATA_OBJID`: the content type of an Authenticode signature.
pub const SPC_INDIRECT_DATA: ObjectIdentifier =
    ObjectIdentifier::new_unwrap("1.3.6.1.4.1.311.2.1.4");
/// `SPC_PE_IMAGE_DATAOBJ`: the attribute type naming a PE image.
pub const SPC_PE_IMAGE_DATA: ObjectIdentifier =
    ObjectIdentifier::new_unwrap("1.3.6.1.4.1.311.2.1.15");
pub const SHA256: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.16.840.1.101.3.4.2.1");
pub(crate) const RSA_ENCRYPTION: ObjectIdentifier =
    ObjectIdentifier::new_unwrap("1.2.840.113549.1.1.1");
pub(crate) const SHA256_WITH_RSA: ObjectIdentifier =
    ObjectIdentifier::new_unwrap("1.2.840.113549.1.1.11");
pub(crate) const ID_SIGNED_DATA: ObjectIdentifier =
    ObjectIdentifier::new_unwrap("1.2.840.113549.1.7.2");
pub(crate) const ID_CONTENT_TYPE: ObjectIdentifier =
    ObjectIdentifier::new_unwrap("1.2.840.113549.1.9.3");
pub(crate) const ID_MESSAGE_DIGEST: ObjectIdentifier =
    ObjectIdentifier::new_unwrap("1.2.840.113549.1.9.4");

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

pub(crate) fn u16_at(b: &[u8], o: usize) -> Option<u16> {
    let s = b.get(o..o.checked_add(2)?)?;
    Some(u16::from_le_bytes([s[0], s[1]]))
}

pub(crate) fn u32_at(b: &[u8], o: usize) -> Option<u32> {
    let s = b.get(o..o.checked_add(4)?)?;
    Some(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
}

/// The most bytes of headers (`SizeOfHeaders`) read from a file.
pub const MAX_HEADERS: usize = 64 * 1024;

/// Parses the parts of a PE the Authenticode digest needs, refusing what
/// it cannot cover (see the module doc).
pub fn layout(b: &[u8]) -> Result<PeLayout> {
    layout_of(b, b.len())
}

/// [`layout`] of a PE of `len` bytes of which `b` is the beginning: at
/// least its headers (`SizeOfHeaders`), which are all it reads.
pub fn layout_of(b: &[u8], len: usize) -> Result<PeLayout> {
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
        size_of_headers >= table_end && size_of_headers <= len,
        "SizeOfHeaders {size_of_headers} does not cover the headers (they end at {table_end}) or \
         runs past the file ({len} bytes)"
    );
    ensure!(
        size_of_headers <= b.len(),
        "the headers are {size_of_headers} bytes: more than the {} read",
        b.len()
    );
    let cert_dir_at = opt + dirs_at + DIR_SECURITY * 8;
    let cert_off = u32_at(b, cert_dir_at).unwrap_or(0) as usize;
    let cert_size = u32_at(b, cert_dir_at + 4).unwrap_or(0) as usize;
    let cert_table = match (cert_off, cert_size) {
        (0, 0) => None,
        (o, s) => {
            ensure!(
                o.checked_add(s) == Some(len) && o % 8 == 0 && s >= 8,
                "the certificate table ({s} bytes at {o}) is not an aligned table at the end of \
                 the file ({len} bytes): the signature cannot be read or replaced safely"
            );
            Some((o, s))
        }
    };
    let data_end = cert_table.map_or(len, |(o, _)| o);
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

/// The Authenticode SHA-256 digest of the PE file `f` of `len` bytes with
/// layout `l`, whose headers are `head`: streamed, a buffer at a time.
pub fn digest_file(
    f: &mut (impl std::io::Read + std::io::Seek),
    head: &[u8],
    len: u64,
    l: &PeLayout,
) -> Result<[u8; 32]> {
    use std::io::SeekFrom;
    let mut h = Sha256::new();
    h.update(&head[..l.checksum_at]);
    h.update(&head[l.checksum_at + 4..l.cert_dir_at]);
    h.update(&head[l.cert_dir_at + 8..l.size_of_headers]);
    // The sections follow the headers without a gap (checked by
    // `layout_of`), then whatever precedes the certificate table: one run.
    let end = l.cert_table.map_or(len, |(o, _)| o as u64);
    let start = l.size_of_headers as u64;
    f.seek(SeekFrom::Start(start))
        .context("seeking in the image")?;
    let mut rest = end.saturating_sub(start);
    let mut buf = vec![0u8; 1 << 16];
    while rest > 0 {
        let n = buf.len().min(usize::try_from(rest).unwrap_or(usize::MAX));
        f.read_exact(&mut buf[..n])
            .context("reading the image (it is shorter than its headers say)")?;
        h.update(&buf[..n]);
        rest -= n as u64;
    }
    Ok(h.finalize().into())
}
