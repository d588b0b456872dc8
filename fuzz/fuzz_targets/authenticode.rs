//! Authenticode signatures as `imager::secureboot` reads them from a PE
//! (the installer checks an image before making it the default): any bytes
//! give a layout or an error, never a panic; a parsed signature is
//! verified against the first certificate it carries, which may succeed
//! only if the image's digest is the one it claims.
#![no_main]
use imager::secureboot::authenticode::{digest, parse_embedded, verify};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(d) = digest(data) else { return };
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
