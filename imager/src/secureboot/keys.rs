//! Secure Boot keys: generating the PK, KEK and db key pairs with their
//! self-signed X.509 certificates and an owner GUID, and loading them back.
//!
//! A key directory holds `PK.key PK.crt KEK.key KEK.crt db.key db.crt`
//! (private keys PKCS#8 PEM, mode 0600; certificates PEM, mode 0644) and
//! `GUID` (the owner GUID of our signature-list entries, one line). Every
//! key is RSA-2048 with a SHA-256 self-signed certificate: firmware trusts
//! an entry of PK, KEK or db by itself, not through a chain, so a chain
//! would add nothing (see docs/secureboot.md).

use anyhow::{Context, Result, bail, ensure};
use der::pem::LineEnding;
use der::{Decode, Encode, EncodePem};
use rsa::pkcs1::DecodeRsaPrivateKey;
use rsa::pkcs1v15::{Signature, SigningKey, VerifyingKey};
use rsa::pkcs8::{DecodePrivateKey, EncodePrivateKey, EncodePublicKey};
use rsa::signature::{Keypair, RandomizedSigner};
use rsa::{RsaPrivateKey, traits::PublicKeyParts};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;
use uuid::Uuid;
use x509_cert::Certificate;
use x509_cert::builder::{Builder, CertificateBuilder, Profile};
use x509_cert::ext::pkix::{BasicConstraints, KeyUsage, KeyUsages, SubjectKeyIdentifier};
use x509_cert::name::Name;
use x509_cert::serial_number::SerialNumber;
use x509_cert::spki::{
    AlgorithmIdentifierOwned, DynSignatureAlgorithmIdentifier, SubjectPublicKeyInfoOwned,
};
use x509_cert::time::Validity;

use crate::io::Staging;

/// The three keys, in the order of the hierarchy.
pub const NAMES: [&str; 3] = ["PK", "KEK", "db"];
/// The owner GUID's file in a key directory.
pub const GUID_FILE: &str = "GUID";
/// RSA modulus size of generated keys (what OVMF and most firmware take).
pub const RSA_BITS: usize = 2048;
/// Key and certificate files are small; anything larger is not one.
const MAX_FILE: u64 = 64 * 1024;
/// Generated certificates are valid this long from their creation.
const VALIDITY: Duration = Duration::from_secs(30 * 365 * 24 * 3600);

/// One Secure Boot key pair: a private key and its certificate.
pub struct SbKey {
    /// `PK`, `KEK` or `db`.
    pub name: String,
    signing: SbSigning,
    /// The certificate, parsed.
    pub cert: Certificate,
    /// The certificate's DER bytes, as enrolled.
    pub cert_der: Vec<u8>,
}

impl std::fmt::Debug for SbKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the private key.
        f.debug_struct("SbKey")
            .field("name", &self.name)
            .field("subject", &self.cert.tbs_certificate.subject.to_string())
            .finish()
    }
}

impl SbKey {
    /// The certificate's subject, as text (`CN=…`).
    pub fn subject(&self) -> String {
        self.cert.tbs_certificate.subject.to_string()
    }
}

/// Where an [`SbKey`]'s private half is: a PEM file read into memory, or a
/// token or program behind [`crate::sign::KeyBackend`] (docs/signing.md).
enum SbSigning {
    Local(Box<SigningKey<Sha256>>),
    Backend {
        backend: Box<dyn crate::sign::KeyBackend>,
        public: VerifyingKey<Sha256>,
    },
}

impl Keypair for SbKey {
    type VerifyingKey = VerifyingKey<Sha256>;
    fn verifying_key(&self) -> VerifyingKey<Sha256> {
        match &self.signing {
            SbSigning::Local(k) => k.verifying_key(),
            SbSigning::Backend { public, .. } => public.clone(),
        }
    }
}

impl DynSignatureAlgorithmIdentifier for SbKey {
    fn signature_algorithm_identifier(&self) -> x509_cert::spki::Result<AlgorithmIdentifierOwned> {
        use der::referenced::RefToOwned;
        use x509_cert::spki::SignatureAlgorithmIdentifier;
        Ok(VerifyingKey::<Sha256>::SIGNATURE_ALGORITHM_IDENTIFIER.ref_to_owned())
    }
}

/// RSA PKCS#1 v1.5 with SHA-256. A local key computes it with blinding
/// (the result is the same as without: PKCS#1 v1.5 signatures are
/// deterministic, only the computation's timing is randomized); a
/// backend's signature is checked against the certificate's key before it
/// is used.
impl rsa::signature::Signer<Signature> for SbKey {
    fn try_sign(&self, msg: &[u8]) -> Result<Signature, rsa::signature::Error> {
        match &self.signing {
            SbSigning::Local(k) => k.try_sign_with_rng(&mut rand_core::OsRng, msg),
            SbSigning::Backend { backend, public } => {
                use rsa::signature::Verifier;
                let raw = backend
                    .sign(crate::sign::Algorithm::RsaPkcs1Sha256, msg)
                    .map_err(|e| rsa::signature::Error::from_source(format!("{e:#}")))?;
                let sig = Signature::try_from(raw.as_slice())?;
                public.verify(msg, &sig).map_err(|_| {
                    rsa::signature::Error::from_source(format!(
                        "{} returned a signature that does not verify with the {} \
                         certificate's key",
                        backend.describe(),
                        self.name
                    ))
                })?;
                Ok(sig)
            }
        }
    }
}

/// The three keys of a key directory and the owner GUID.
#[derive(Debug)]
pub struct SecureBootKeys {
    pub pk: SbKey,
    pub kek: SbKey,
    pub db: SbKey,
    /// The owner (`SignatureOwner`) of our signature-list entries.
    pub owner: Uuid,
    pub dir: PathBuf,
}

/// What [`keygen`] wrote.
#[derive(Debug, Clone)]
pub struct KeygenReport {
    pub dir: PathBuf,
    pub owner: Uuid,
    /// `(name, subject, SHA-256 of the DER certificate)` for PK, KEK, db.
    pub certs: Vec<(String, String, String)>,
}

/// Every file name [`keygen`] writes, in the order they are moved in.
pub fn file_names() -> Vec<String> {
    let mut v: Vec<String> = NAMES.iter().map(|n| format!("{n}.crt")).collect();
    v.push(GUID_FILE.to_string());
    // The private keys last: a directory with a key always has its certificate.
    v.extend(NAMES.iter().map(|n| format!("{n}.key")));
    v
}

fn make_cert(name: &str, key: &RsaPrivateKey, owner: &Uuid) -> Result<Certificate> {
    let signing = SigningKey::<Sha256>::new(key.clone());
    let mut serial = [0u8; 16];
    rand_core::RngCore::fill_bytes(&mut rand_core::OsRng, &mut serial);
    serial[0] &= 0x7f;
    serial[0] |= 0x01;
    let serial = SerialNumber::new(&serial).context("a certificate serial number")?;
    let owner_short = &owner.to_string()[..8];
    let subject = Name::from_str(&format!("CN=imager Secure Boot {name} {owner_short}"))
        .context("a certificate subject")?;
    let spki = SubjectPublicKeyInfoOwned::from_der(
        key.to_public_key()
            .to_public_key_der()
            .context("encoding a public key")?
            .as_bytes(),
    )
    .context("a public key")?;
    let ski = SubjectKeyIdentifier(
        der::asn1::OctetString::new(&Sha256::digest(spki.subject_public_key.raw_bytes())[..20])
            .context("a key identifier")?,
    );
    let validity = Validity::from_now(VALIDITY).context("a validity period")?;
    let mut b = CertificateBuilder::new(
        Profile::Manual { issuer: None },
        serial,
        validity,
        subject,
        spki,
        &signing,
    )
    .context("starting a certificate")?;
    // A self-signed certificate that signs code and variable updates (and,
    // for tools that want it, certificates).
    b.add_extension(&BasicConstraints {
        ca: true,
        path_len_constraint: None,
    })
    .context("basicConstraints")?;
    b.add_extension(&KeyUsage(
        KeyUsages::DigitalSignature | KeyUsages::KeyCertSign | KeyUsages::CRLSign,
    ))
    .context("keyUsage")?;
    b.add_extension(&ski).context("subjectKeyIdentifier")?;
    b.build::<Signature>()
        .map_err(|e| anyhow::anyhow!("signing the {name} certificate: {e}"))
}

/// Generates a PK, a KEK and a db key (RSA-2048, self-signed SHA-256
/// certificates) and an owner GUID into `dir`. Refuses to replace any of
/// the files unless `force`; writes all of them or none (staged in `dir`,
/// moved in at the end; private keys mode 0600, never printed).
pub fn keygen(dir: &Path, force: bool) -> Result<KeygenReport> {
    use std::os::unix::fs::DirBuilderExt;
    let names = file_names();
    for n in &names {
        let p = dir.join(n);
        match p.symlink_metadata() {
            Ok(m) if !m.file_type().is_file() => bail!(
                "{} is not a regular file (a directory, link, device or pipe): refusing to \
                 replace it; choose another directory",
                p.display()
            ),
            Ok(_) if !force => bail!(
                "{} already exists: refusing to overwrite Secure Boot keys (pass --force to \
                 replace all of them; machines enrolled with the old ones then refuse images \
                 signed with the new)",
                p.display()
            ),
            _ => {}
        }
    }
    if !dir.exists() {
        if let Some(up) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(up).with_context(|| format!("creating {}", up.display()))?;
        }
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(dir)
            .or_else(|e| match e.kind() {
                std::io::ErrorKind::AlreadyExists => Ok(()),
                _ => Err(e),
            })
            .with_context(|| format!("creating {}", dir.display()))?;
    }
    let mut random = [0u8; 16];
    rand_core::RngCore::fill_bytes(&mut rand_core::OsRng, &mut random);
    let owner = uuid::Builder::from_random_bytes(random).into_uuid();
    let staging = Staging::create(dir, "secure-boot-keys")?;
    let mut certs = Vec::new();
    for name in NAMES {
        let key = RsaPrivateKey::new(&mut rand_core::OsRng, RSA_BITS)
            .with_context(|| format!("generating the {name} key"))?;
        let cert = make_cert(name, &key, &owner)?;
        let pem = key
            .to_pkcs8_pem(LineEnding::LF)
            .map_err(|e| anyhow::anyhow!("encoding the {name} key: {e}"))?;
        crate::io::write_atomic(staging.join(&format!("{name}.key")), pem.as_bytes(), 0o600)?;
        let cert_pem = cert
            .to_pem(LineEnding::LF)
            .map_err(|e| anyhow::anyhow!("encoding the {name} certificate: {e}"))?;
        crate::io::write_atomic(
            staging.join(&format!("{name}.crt")),
            cert_pem.as_bytes(),
            0o644,
        )?;
        let der = cert.to_der().context("encoding a certificate")?;
        certs.push((
            name.to_string(),
            cert.tbs_certificate.subject.to_string(),
            hex::encode(Sha256::digest(&der)),
        ));
    }
    crate::io::write_atomic(
        staging.join(GUID_FILE),
        format!("{owner}\n").as_bytes(),
        0o644,
    )?;
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    staging.commit(&refs)?;
    Ok(KeygenReport {
        dir: dir.to_path_buf(),
        owner,
        certs,
    })
}

fn read_small(path: &Path, what: &str) -> Result<Vec<u8>> {
    let meta = std::fs::metadata(path).with_context(|| {
        format!(
            "reading the {what} {}: make the key directory with `imager keygen --secure-boot DIR`",
            path.display()
        )
    })?;
    if !meta.is_file() || meta.len() > MAX_FILE {
        bail!("{}: not a {what} file", path.display());
    }
    std::fs::read(path).with_context(|| format!("reading the {what} {}", path.display()))
}

/// Loads an X.509 certificate (PEM or DER). Refuses a private key given in
/// its place without quoting it.
pub fn load_cert(path: &Path) -> Result<Certificate> {
    let bytes = read_small(path, "certificate")?;
    parse_cert(&bytes).with_context(|| format!("{}", path.display()))
}

pub use ::authenticode::{cert_public_key, parse_cert};

fn load_private(path: &Path) -> Result<RsaPrivateKey> {
    let bytes = der::zeroize::Zeroizing::new(read_small(path, "private key")?);
    crate::secret::refuse_readable_by_others(path)?;
    let text = std::str::from_utf8(&bytes)
        .map_err(|_| anyhow::anyhow!("{}: not a private key in PEM (not text)", path.display()))?
        .trim();
    if text.contains("CERTIFICATE") || text.contains("PUBLIC KEY") {
        bail!(
            "{}: this is a certificate or public key, not a private key: give the .key file",
            path.display()
        );
    }
    let key = RsaPrivateKey::from_pkcs8_pem(text)
        .or_else(|_| RsaPrivateKey::from_pkcs1_pem(text))
        .map_err(|_| {
            anyhow::anyhow!(
                "{}: not an RSA private key in PEM (PKCS#8 `BEGIN PRIVATE KEY` or PKCS#1 `BEGIN \
                 RSA PRIVATE KEY`)",
                path.display()
            )
        })?;
    ensure!(
        key.size() * 8 >= RSA_BITS,
        "{}: an RSA key of {} bits is too small: use {RSA_BITS} bits or more",
        path.display(),
        key.size() * 8
    );
    Ok(key)
}

impl SbKey {
    /// Loads `dir/NAME.key` and `dir/NAME.crt` and checks they are a pair.
    pub fn load(dir: &Path, name: &str) -> Result<SbKey> {
        let key_path = dir.join(format!("{name}.key"));
        let cert_path = dir.join(format!("{name}.crt"));
        let key = load_private(&key_path)?;
        let cert = load_cert(&cert_path)?;
        let public = cert_public_key(&cert).with_context(|| format!("{}", cert_path.display()))?;
        if public != key.to_public_key() {
            bail!(
                "{} does not belong to {}: the certificate is for another key; regenerate the \
                 pair or give the matching files",
                cert_path.display(),
                key_path.display()
            );
        }
        let cert_der = cert.to_der().context("encoding a certificate")?;
        Ok(SbKey {
            name: name.to_string(),
            signing: SbSigning::Local(Box::new(SigningKey::<Sha256>::new(key))),
            cert,
            cert_der,
        })
    }

    /// The key `name` of `dir` whose private half `signer` names (a key
    /// file elsewhere, `pkcs11:…` or `exec:…`, [`crate::sign::KeyRef`]);
    /// its certificate is `dir`'s `NAME.crt`, whose key the signer's must
    /// be. The signer is asked once for a signature before it is used.
    pub fn load_with(dir: &Path, name: &str, signer: &Path) -> Result<SbKey> {
        use crate::sign::KeyRef;
        let cert_path = dir.join(format!("{name}.crt"));
        let cert = load_cert(&cert_path)?;
        let public = cert_public_key(&cert).with_context(|| format!("{}", cert_path.display()))?;
        let backend: Box<dyn crate::sign::KeyBackend> = match KeyRef::parse(signer) {
            KeyRef::File(path) => {
                let key = load_private(&path)?;
                if key.to_public_key() != public {
                    bail!(
                        "{} does not belong to {} (secure_boot.signers.{name}): the certificate \
                         is for another key; give the matching key or certificate",
                        cert_path.display(),
                        path.display()
                    );
                }
                let cert_der = cert.to_der().context("encoding a certificate")?;
                return Ok(SbKey {
                    name: name.to_string(),
                    signing: SbSigning::Local(Box::new(SigningKey::<Sha256>::new(key))),
                    cert,
                    cert_der,
                });
            }
            KeyRef::Pkcs11(uri) => Box::new(crate::sign::Pkcs11Key::open(&uri)?),
            KeyRef::Exec(program) => Box::new(crate::sign::ExternalKey::new(&program)?),
        };
        let der = backend.public_key_der()?;
        let theirs = {
            use rsa::pkcs8::DecodePublicKey;
            rsa::RsaPublicKey::from_public_key_der(&der)
        }
        .map_err(|_| anyhow::anyhow!("{}: its public key is not an RSA key", backend.describe()))?;
        ensure!(
            public.size() * 8 >= RSA_BITS,
            "{}: an RSA key of {} bits is too small: use {RSA_BITS} bits or more",
            backend.describe(),
            public.size() * 8
        );
        if theirs != public {
            bail!(
                "{}: its key is not the one of {} (the {name} certificate): give the matching \
                 certificate or key",
                backend.describe(),
                cert_path.display()
            );
        }
        let cert_der = cert.to_der().context("encoding a certificate")?;
        let key = SbKey {
            name: name.to_string(),
            signing: SbSigning::Backend {
                backend,
                public: VerifyingKey::<Sha256>::new(public),
            },
            cert,
            cert_der,
        };
        rsa::signature::Signer::<Signature>::try_sign(&key, b"imager signer check v1\0")
            .map_err(|e| anyhow::anyhow!("the {name} key: {e}"))?;
        Ok(key)
    }
}

impl SecureBootKeys {
    /// Loads a key directory made by [`keygen`] (or by hand, with the same
    /// names): every private key must be mode 0600 or narrower and match
    /// its certificate.
    pub fn load(dir: &Path) -> Result<SecureBootKeys> {
        Self::load_with(dir, &std::collections::BTreeMap::new())
    }

    /// [`SecureBootKeys::load`], the private halves of the keys `signers`
    /// names (`PK`, `KEK`, `db`: a key file, `pkcs11:…` or `exec:…`) taken
    /// from there instead of the directory's `NAME.key`.
    pub fn load_with(
        dir: &Path,
        signers: &std::collections::BTreeMap<String, PathBuf>,
    ) -> Result<SecureBootKeys> {
        if let Some(other) = signers.keys().find(|k| !NAMES.contains(&k.as_str())) {
            bail!(
                "secure_boot.signers: {} is not a Secure Boot key (PK, KEK or db)",
                contract::text::excerpt(other)
            );
        }
        let key = |name: &str| match signers.get(name) {
            Some(s) => SbKey::load_with(dir, name, s),
            None => SbKey::load(dir, name),
        };
        let guid_path = dir.join(GUID_FILE);
        let guid = read_small(&guid_path, "owner GUID")?;
        let owner = std::str::from_utf8(&guid)
            .ok()
            .and_then(|t| Uuid::parse_str(t.trim()).ok())
            .with_context(|| {
                format!(
                    "{}: not a GUID (one line like 8be4df61-93ca-11d2-aa0d-00e098032b8c)",
                    guid_path.display()
                )
            })?;
        Ok(SecureBootKeys {
            pk: key("PK")?,
            kek: key("KEK")?,
            db: key("db")?,
            owner,
            dir: dir.to_path_buf(),
        })
    }
}
