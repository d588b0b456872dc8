//! Where a signing key lives, behind one small interface ([`KeyBackend`]):
//! a key file on this machine ([`super::FileSigner`]), a PKCS#11 token or
//! HSM named by an RFC 7512 URI ([`super::pkcs11`]), or an external signer
//! program speaking the protocol of docs/signing.md ([`super::external`]),
//! through which a cloud KMS is plugged in without linking its SDK.
//!
//! A key is named the same way everywhere (`--key`, the profile's
//! `signing.key`): `pkcs11:…` is a token's key, `exec:PROGRAM` an external
//! signer, anything else a key file ([`KeyRef::parse`]). Whichever signs,
//! the bytes are the same: ed25519 and RSA PKCS#1 v1.5 signatures are
//! deterministic, and every signature a token or program returns is
//! verified with its public key before it is used (a token that signs
//! with another key, or a program that answers garbage, fails the build
//! with that said, and nothing is written).

use super::{Signature, Signer, VerifyingKey, key_id};
use anyhow::{Result, anyhow, bail};
use ed25519_dalek::Verifier as _;
use std::path::{Path, PathBuf};

/// The signature schemes a backend is asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    /// Ed25519 (RFC 8032, pure): the manifest's and the cache's signatures.
    Ed25519,
    /// RSASSA-PKCS1-v1_5 with SHA-256: Secure Boot's.
    RsaPkcs1Sha256,
}

impl Algorithm {
    /// Its name in the external signer protocol.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Ed25519 => "ed25519",
            Algorithm::RsaPkcs1Sha256 => "rsa-pkcs1-sha256",
        }
    }
}

/// A key that signs without showing its private half.
pub trait KeyBackend: Send + Sync {
    /// The public key, as a DER SubjectPublicKeyInfo.
    fn public_key_der(&self) -> Result<Vec<u8>>;
    /// A signature of `message` (not a digest: the backend hashes as the
    /// scheme says) by the key under `algorithm`.
    fn sign(&self, algorithm: Algorithm, message: &[u8]) -> Result<Vec<u8>>;
    /// What to call it in messages (never a secret).
    fn describe(&self) -> String;
}

/// How a key is named.
#[derive(Clone, PartialEq, Eq)]
pub enum KeyRef {
    File(PathBuf),
    /// An RFC 7512 URI, as given.
    Pkcs11(String),
    /// An external signer program.
    Exec(PathBuf),
}

impl std::fmt::Debug for KeyRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeyRef::File(p) => f.debug_tuple("File").field(p).finish(),
            // Not the URI: it may carry a PIN.
            KeyRef::Pkcs11(_) => f.write_str("Pkcs11(<uri>)"),
            KeyRef::Exec(p) => f.debug_tuple("Exec").field(p).finish(),
        }
    }
}

impl KeyRef {
    /// `pkcs11:…`, `exec:PROGRAM`, else a key file.
    pub fn parse(s: &Path) -> KeyRef {
        let text = s.to_string_lossy();
        if super::pkcs11_uri::is_uri(&text) {
            KeyRef::Pkcs11(text.into_owned())
        } else if let Some(program) = text.strip_prefix("exec:") {
            KeyRef::Exec(PathBuf::from(program))
        } else {
            KeyRef::File(s.to_path_buf())
        }
    }

    /// Whether this names something other than a file (a profile's path
    /// is then taken as written, not made absolute).
    pub fn is_uri(s: &Path) -> bool {
        !matches!(KeyRef::parse(s), KeyRef::File(_))
    }
}

/// The ed25519 signer `key` names.
pub fn open_signer(key: &Path) -> Result<Box<dyn Signer>> {
    let backend: Box<dyn KeyBackend> = match KeyRef::parse(key) {
        KeyRef::File(p) => return Ok(Box::new(super::FileSigner::load(&p)?)),
        KeyRef::Pkcs11(uri) => Box::new(super::pkcs11::Pkcs11Key::open(&uri)?),
        KeyRef::Exec(program) => Box::new(super::external::ExternalKey::new(&program)?),
    };
    Ok(Box::new(BackendSigner::new(backend)?))
}

/// An ed25519 [`Signer`] over a [`KeyBackend`].
pub struct BackendSigner {
    backend: Box<dyn KeyBackend>,
    public: VerifyingKey,
}

impl BackendSigner {
    pub fn new(backend: Box<dyn KeyBackend>) -> Result<BackendSigner> {
        use ed25519_dalek::pkcs8::DecodePublicKey;
        let der = backend.public_key_der()?;
        let public = VerifyingKey::from_public_key_der(&der).map_err(|_| {
            anyhow!(
                "{}: its public key is not an ed25519 key (the manifest is signed with ed25519)",
                backend.describe()
            )
        })?;
        let signer = BackendSigner { backend, public };
        // Asked once before anything is built: a key that cannot sign, or
        // signs with another key, fails the build at its start.
        signer
            .sign(PROBE)
            .map_err(|e| anyhow!("{e:#} (checked before the build, with a test message)"))?;
        Ok(signer)
    }
}

/// What a backend signs when it is opened (a context of its own: it reads
/// as nothing a verifier of this project accepts).
const PROBE: &[u8] = b"imager signer check v1\0";

impl Signer for BackendSigner {
    fn public_key(&self) -> VerifyingKey {
        self.public
    }

    fn sign(&self, message: &[u8]) -> Result<Signature> {
        let raw = self.backend.sign(Algorithm::Ed25519, message)?;
        let sig = Signature::from_slice(&raw).map_err(|_| {
            anyhow!(
                "{} returned {} bytes, not an ed25519 signature (64)",
                self.backend.describe(),
                raw.len()
            )
        })?;
        if self.public.verify(message, &sig).is_err() {
            bail!(
                "{} returned a signature that does not verify with its public key {}: \
                 nothing was signed",
                self.backend.describe(),
                key_id(&self.public)
            );
        }
        Ok(sig)
    }
}
