//! Signing: keys, the signed build manifest and its verification.
//!
//! A build's output directory holds `manifest.json` (name, version, profile,
//! `SOURCE_DATE_EPOCH`, and every artifact's path, size and SHA-256) and
//! `manifest.json.sig`, the raw 64-byte ed25519 signature over the exact
//! bytes of `manifest.json`. Keys are PEM files openssl reads and writes.
//! `docs/signing.md` describes the formats and how to verify with openssl.
//!
//! The manifest's format, key ids and the signature check live in the
//! `payload` crate (shared with machined) and are re-exported here; the
//! files, key generation and signing are this module's.

mod backend;
mod command;
pub mod external;
mod keys;
mod manifest;
mod pkcs11;
pub mod pkcs11_uri;
pub mod trust;
mod verify;

#[cfg(test)]
mod tests;

pub use backend::{Algorithm, BackendSigner, KeyBackend, KeyRef, open_signer};
pub use command::{
    DEV_KEY_DIR, KeygenOptions, VerifyOptions, default_dev_pub, dev_key_for, run_keygen,
    run_verify, run_verify_to,
};
pub use ed25519_dalek::{Signature, VerifyingKey};
pub use external::ExternalKey;
pub use keys::{
    DEV_KEY, DEV_PUB, FileSigner, Signer, keygen, load_or_create_dev_key, load_public_key,
    public_key_pem,
};
pub use manifest::{describe, signature_path, write_signed_manifest, write_signed_manifest_with};
pub use pkcs11::Pkcs11Key;
pub use trust::{RootFiles, Signing};
// The format, key ids and signature check are the payload crate's, which
// machined shares.
pub use payload::keys::{key_id, parse_trusted_keys};
pub use payload::manifest::{
    Boot, FORMAT, MANIFEST_NAME, Manifest, SIGNATURE_NAME, check_digest, check_path,
};
pub use payload::verify::{claimed_key_id, verify_manifest_bytes};
pub use verify::{ArtifactCheck, Status, VerifyReport, verify, verify_payload};
