//! Authenticode, the verifying half: where the parts of a PE image sit
//! ([`layout`]), its SHA-256 image digest ([`digest`]), its one embedded
//! signature read ([`parse_embedded`]) and checked against a db
//! certificate ([`verify`]).
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
//! at an 8-byte boundary and pointed to by data directory 4. References:
//! Microsoft's "Windows Authenticode Portable Executable Signature
//! Format" and the PE/COFF specification.
//!
//! One crate for both sides: `imager` signs with it (its
//! `secureboot::authenticode`) and checks a payload before `imager
//! upgrade` writes; `machined`, static and in the image, checks the UKIs it
//! pulled against META's db certificate before a Secure Boot disk takes
//! them (`payload::secureboot`). Untrusted bytes: nothing here panics or
//! reads past the image it was given (fuzz target `authenticode`).

mod cert;
mod pe;
mod verify;

pub use cert::{cert_pem, cert_public_key, parse_cert};
pub use pe::{
    MAX_HEADERS, PeLayout, SHA256, SPC_INDIRECT_DATA, SPC_PE_IMAGE_DATA, WIN_CERT_REVISION_2_0,
    WIN_CERT_TYPE_PKCS_SIGNED_DATA, digest, digest_file, digest_with, layout, layout_of,
};
pub use verify::{
    Embedded, MAX_TABLE, SignedFile, Verified, file_digest, parse_embedded, read_signed,
    read_signed_file, verify, verify_file,
};
/// The certificate type of [`verify`] and [`parse_cert`].
pub use x509_cert::Certificate;

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A real PE: Debian's systemd-boot (scripts/setup.sh installs it).
    const SD_BOOT: &str = "/usr/lib/systemd/boot/efi/systemd-bootx64.efi";

    /// The streamed digest of a file is the in-memory one, and a prefix
    /// shorter than the headers is refused, not read past.
    #[test]
    fn the_streamed_digest_is_the_in_memory_one_and_headers_are_bounded() {
        let pe = std::fs::read(SD_BOOT).unwrap();
        let l = layout(&pe).unwrap();
        assert_eq!(
            layout_of(&pe[..MAX_HEADERS.min(pe.len())], pe.len()).unwrap(),
            l
        );
        let head = &pe[..l.size_of_headers];
        let streamed =
            digest_file(&mut std::io::Cursor::new(&pe), head, pe.len() as u64, &l).unwrap();
        assert_eq!(streamed, digest(&pe).unwrap());
        let e = layout_of(&pe[..l.size_of_headers - 1], pe.len()).unwrap_err();
        assert!(format!("{e:#}").contains("more than the"), "{e:#}");
        // A file shorter than its layout says: an error, not a panic.
        let e = digest_file(
            &mut std::io::Cursor::new(&pe[..pe.len() - 1]),
            head,
            pe.len() as u64,
            &l,
        )
        .unwrap_err();
        assert!(format!("{e:#}").contains("shorter"), "{e:#}");
        let e = parse_embedded(&pe).unwrap_err();
        assert!(e.to_string().contains("not signed"), "{e}");
    }
}
