//! Key ids and the trusted keys META carries.
//!
//! Public keys are SPKI PEM (`-----BEGIN PUBLIC KEY-----`, what
//! `openssl pkey -pubout` writes). Private keys, signing and key files are
//! imager's (`imager::sign`).

use anyhow::{Context, Result};
use ed25519_dalek::VerifyingKey;
use ed25519_dalek::pkcs8::DecodePublicKey;
use sha2::{Digest, Sha256};

/// The key id of a public key: `ed25519:` + the first 16 hex digits of the
/// SHA-256 of its raw 32 bytes.
pub fn key_id(key: &VerifyingKey) -> String {
    let digest = Sha256::digest(key.as_bytes());
    format!("ed25519:{}", &hex::encode(digest)[..16])
}

/// Parses the concatenated PEM public keys of META's `trusted-keys`.
pub fn parse_trusted_keys(text: &str) -> Result<Vec<VerifyingKey>> {
    const BEGIN: &str = "-----BEGIN PUBLIC KEY-----";
    const END: &str = "-----END PUBLIC KEY-----";
    let mut keys = Vec::new();
    let mut rest = text;
    while let Some(b) = rest.find(BEGIN) {
        let after = &rest[b..];
        let e = after
            .find(END)
            .context("a trusted key in META has no END line")?;
        let pem = &after[..e + END.len()];
        keys.push(
            VerifyingKey::from_public_key_pem(pem)
                .map_err(|e| anyhow::anyhow!("a trusted key in META is not ed25519: {e}"))?,
        );
        rest = &after[e + END.len()..];
    }
    Ok(keys)
}
