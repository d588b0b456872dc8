//! A db certificate, PEM or DER, and its RSA key.

use anyhow::{Context, Result, bail};
use der::{Decode, DecodePem, Encode};
use rsa::RsaPublicKey;
use x509_cert::Certificate;

/// Parses an X.509 certificate from PEM or DER bytes. Refuses a private
/// key given in its place without quoting it.
pub fn parse_cert(bytes: &[u8]) -> Result<Certificate> {
    if contract::text::looks_like_private_key(bytes) {
        bail!("this is a private key, not a certificate: give the .crt file");
    }
    let cert = if bytes.starts_with(b"-----BEGIN") || bytes.trim_ascii_start().starts_with(b"-") {
        let text =
            std::str::from_utf8(bytes).context("not a certificate (PEM that is not text)")?;
        Certificate::from_pem(text.trim())
            .map_err(|e| anyhow::anyhow!("not an X.509 certificate in PEM: {e}"))?
    } else {
        Certificate::from_der(bytes)
            .map_err(|e| anyhow::anyhow!("not an X.509 certificate (PEM or DER): {e}"))?
    };
    Ok(cert)
}

/// A certificate as PEM (LF line ends).
pub fn cert_pem(cert: &Certificate) -> Result<String> {
    use der::EncodePem;
    cert.to_pem(der::pem::LineEnding::LF)
        .map_err(|e| anyhow::anyhow!("encoding a certificate as PEM: {e}"))
}

/// The RSA public key of a certificate (RSA is all Secure Boot firmware
/// takes).
pub fn cert_public_key(cert: &Certificate) -> Result<RsaPublicKey> {
    use rsa::pkcs8::DecodePublicKey;
    let spki = cert
        .tbs_certificate
        .subject_public_key_info
        .to_der()
        .context("encoding a certificate's public key")?;
    RsaPublicKey::from_public_key_der(&spki).map_err(|e| {
        anyhow::anyhow!("the certificate's key is not RSA ({e}): Secure Boot needs RSA keys")
    })
}
