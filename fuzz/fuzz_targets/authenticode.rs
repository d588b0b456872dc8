//! Authenticode signatures as the `authenticode` crate reads them from a
//! PE (imager before an upgrade, the node before a Secure Boot disk takes
//! a pulled UKI): any bytes give a layout or an error, never a panic; the
//! streamed digest (what `verify_file` computes, headers read as a bounded
//! prefix) is the in-memory one; a parsed signature is verified against the
//! first certificate it carries, which may succeed only if the image's
//! digest is the one it claims.
#![no_main]
use authenticode::{MAX_HEADERS, digest, digest_file, layout_of, parse_embedded, verify};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(d) = digest(data) else { return };
    let head = &data[..data.len().min(MAX_HEADERS)];
    if let Ok(l) = layout_of(head, data.len()) {
        let streamed = digest_file(&mut std::io::Cursor::new(data), head, data.len() as u64, &l);
        assert_eq!(streamed.ok(), Some(d));
    }
    let Ok(e) = parse_embedded(data) else { return };
    let Some(certs) = e.signed_data.certificates.as_ref() else {
        return;
    };
    for c in certs.0.iter() {
        if let cms::cert::CertificateChoices::Certificate(cert) = c
            && let Ok(v) = verify(data, cert)
        {
            assert_eq!(v.digest, hex::encode(d));
            assert_eq!(e.digest, d);
        }
    }
});
