//! A signing key on a PKCS#11 token or HSM ([`Pkcs11Key`]), named by an
//! RFC 7512 URI ([`super::pkcs11_uri`]). The library is loaded at run
//! time (`module-path`, `module-name`, else `$IMAGER_PKCS11_MODULE`); the
//! token is the one the URI's token attributes match (exactly one); the
//! key is its private key with the URI's label and/or id (exactly one),
//! and its public key the public key object of the same label and id.
//! Ed25519 signs with CKM_EDDSA (pure), RSA with CKM_SHA256_RSA_PKCS. The
//! PIN comes from the URI (`pin-value`, `pin-source`), else
//! `$IMAGER_PKCS11_PIN`; without one the session is not logged in.
//! The private key never leaves the token.

use super::backend::{Algorithm, KeyBackend};
use super::pkcs11_uri::{self, Pin, Pkcs11Uri};
use anyhow::{Context, Result, anyhow, bail};
use cryptoki::context::{CInitializeArgs, CInitializeFlags, Pkcs11};
use cryptoki::error::RvError;
use cryptoki::mechanism::Mechanism;
use cryptoki::mechanism::eddsa::{EddsaParams, EddsaSignatureScheme};
use cryptoki::object::{Attribute, AttributeType, KeyType, ObjectClass, ObjectHandle};
use cryptoki::session::{Session, UserType};
use std::path::PathBuf;

/// Where p11-kit's modules are (`module-name`): Debian's multiarch
/// directory of this machine.
fn module_dir() -> PathBuf {
    PathBuf::from(format!(
        "/usr/lib/{}-linux-gnu/pkcs11",
        std::env::consts::ARCH
    ))
}
/// The largest PIN file read.
const MAX_PIN_FILE: u64 = 1024;

/// An open session on the token holding the key.
pub struct Pkcs11Key {
    // Dropped before the context (fields drop in order). A session is used
    // by one thread at a time.
    session: std::sync::Mutex<Session>,
    key: ObjectHandle,
    key_type: KeyType,
    public_der: Vec<u8>,
    describe: String,
    _context: Pkcs11,
}

impl Pkcs11Key {
    /// Opens the key `uri` names.
    pub fn open(uri: &str) -> Result<Pkcs11Key> {
        let u = pkcs11_uri::parse(uri).map_err(|e| anyhow!("the PKCS#11 URI: {e}"))?;
        let describe = describe(&u);
        let module = module(&u)?;
        let context = library(&module, &describe)?;
        let slot = find_slot(&context, &u, &describe)?;
        let session = context
            .open_ro_session(slot)
            .map_err(|e| anyhow!("{describe}: opening a session: {e}"))?;
        if let Some(pin) = pin(&u)? {
            match session.login(UserType::User, Some(&pin.into())) {
                // Login is per token for the whole process: another key
                // of the same token logged in first.
                Ok(()) | Err(cryptoki::error::Error::Pkcs11(RvError::UserAlreadyLoggedIn, _)) => {}
                Err(cryptoki::error::Error::Pkcs11(
                    RvError::PinIncorrect | RvError::PinInvalid | RvError::PinLenRange,
                    _,
                )) => bail!("{describe}: the token refused the PIN (check the PIN)"),
                Err(e) => bail!("{describe}: logging in to the token: {e}"),
            }
        }
        let key = find_one(&session, &u, ObjectClass::PRIVATE_KEY, &describe)?;
        let key_type = match session
            .get_attributes(key, &[AttributeType::KeyType])?
            .first()
        {
            Some(Attribute::KeyType(t)) => *t,
            _ => bail!("{describe}: the token does not say the key's type"),
        };
        let public = find_one(&session, &u, ObjectClass::PUBLIC_KEY, &describe).with_context(
            || format!("{describe}: the key's public half (a public key object of the same label and id)"),
        )?;
        let public_der = public_der(&session, public, key_type, &describe)?;
        Ok(Pkcs11Key {
            session: std::sync::Mutex::new(session),
            key,
            key_type,
            public_der,
            describe,
            _context: context,
        })
    }
}

impl KeyBackend for Pkcs11Key {
    fn public_key_der(&self) -> Result<Vec<u8>> {
        Ok(self.public_der.clone())
    }

    fn sign(&self, algorithm: Algorithm, message: &[u8]) -> Result<Vec<u8>> {
        let mechanism = match (algorithm, self.key_type) {
            (Algorithm::Ed25519, KeyType::EC_EDWARDS) => {
                Mechanism::Eddsa(EddsaParams::new(EddsaSignatureScheme::Pure))
            }
            (Algorithm::RsaPkcs1Sha256, KeyType::RSA) => Mechanism::Sha256RsaPkcs,
            (a, t) => bail!(
                "{}: a {t} key cannot make {} signatures",
                self.describe,
                a.name()
            ),
        };
        self.session
            .lock()
            .map_err(|_| anyhow!("{}: a signing thread failed", self.describe))?
            .sign(&mechanism, self.key, message)
            .map_err(|e| anyhow!("{}: signing: {e}", self.describe))
    }

    fn describe(&self) -> String {
        self.describe.clone()
    }
}

/// The library at `module`, loaded and initialised once for the process
/// (PKCS#11 allows one initialisation per application: a second key of the
/// same library shares it), and never finalised while the build runs.
fn library(module: &std::path::Path, describe: &str) -> Result<Pkcs11> {
    use std::collections::BTreeMap;
    use std::sync::{Mutex, OnceLock};
    static LOADED: OnceLock<Mutex<BTreeMap<PathBuf, Pkcs11>>> = OnceLock::new();
    let mut loaded = LOADED
        .get_or_init(|| Mutex::new(BTreeMap::new()))
        .lock()
        .map_err(|_| anyhow!("{describe}: a thread loading a PKCS#11 library failed"))?;
    let key = std::fs::canonicalize(module).unwrap_or_else(|_| module.to_path_buf());
    if let Some(c) = loaded.get(&key) {
        return Ok(c.clone());
    }
    let context = Pkcs11::new(module).map_err(|e| {
        anyhow!(
            "{describe}: cannot load the PKCS#11 library {} ({e}): install it (softhsm2, \
             opensc, the HSM vendor's) or give module-path=",
            module.display()
        )
    })?;
    match context.initialize(CInitializeArgs::new(CInitializeFlags::OS_LOCKING_OK)) {
        Ok(()) | Err(cryptoki::error::Error::Pkcs11(RvError::CryptokiAlreadyInitialized, _)) => {}
        Err(e) => bail!("{describe}: initialising {}: {e}", module.display()),
    }
    loaded.insert(key, context.clone());
    Ok(context)
}

/// The key as messages name it: its token and label or id, never the PIN.
fn describe(u: &Pkcs11Uri) -> String {
    let mut parts = Vec::new();
    if let Some(t) = &u.token {
        parts.push(format!("token={}", contract::text::excerpt(t)));
    }
    if let Some(o) = &u.object {
        parts.push(format!("object={}", contract::text::excerpt(o)));
    }
    if let Some(id) = &u.id {
        parts.push(format!("id={}", hex::encode(id)));
    }
    format!("the PKCS#11 key {}", parts.join(";"))
}

fn module(u: &Pkcs11Uri) -> Result<PathBuf> {
    if let Some(p) = &u.module_path {
        return Ok(p.clone());
    }
    if let Some(n) = &u.module_name {
        let name = if n.ends_with(".so") {
            n.clone()
        } else {
            format!("{n}.so")
        };
        return Ok(module_dir().join(name));
    }
    if let Some(p) = std::env::var_os("IMAGER_PKCS11_MODULE") {
        return Ok(PathBuf::from(p));
    }
    bail!(
        "the PKCS#11 URI names no library: add ?module-path=/usr/lib/softhsm/libsofthsm2.so (or \
         the HSM's), or set IMAGER_PKCS11_MODULE"
    )
}

fn pin(u: &Pkcs11Uri) -> Result<Option<String>> {
    Ok(match &u.pin {
        Some(Pin::Value(v)) => Some(v.clone()),
        Some(Pin::Source(path)) => {
            crate::secret::refuse_secret_readable_by_others(path, "the PIN file")?;
            let bytes = crate::input::read_head(path, "the PKCS#11 PIN file", MAX_PIN_FILE)?;
            let text = String::from_utf8(bytes)
                .map_err(|_| anyhow!("{}: the PIN file is not text", path.display()))?;
            Some(text.lines().next().unwrap_or("").to_string())
        }
        None => std::env::var("IMAGER_PKCS11_PIN").ok(),
    })
}

/// The one slot whose token the URI's token attributes match.
fn find_slot(ctx: &Pkcs11, u: &Pkcs11Uri, describe: &str) -> Result<cryptoki::slot::Slot> {
    let mut found = Vec::new();
    for slot in ctx
        .get_slots_with_token()
        .map_err(|e| anyhow!("{describe}: listing the tokens: {e}"))?
    {
        if u.slot_id.is_some_and(|id| id != slot.id()) {
            continue;
        }
        let info = ctx
            .get_token_info(slot)
            .map_err(|e| anyhow!("{describe}: reading a token's description: {e}"))?;
        let matches = |want: &Option<String>, have: &str| {
            want.as_ref()
                .is_none_or(|w| w.trim_end() == have.trim_end())
        };
        if matches(&u.token, info.label())
            && matches(&u.manufacturer, info.manufacturer_id())
            && matches(&u.serial, info.serial_number())
            && matches(&u.model, info.model())
        {
            found.push(slot);
        }
    }
    match found.as_slice() {
        [one] => Ok(*one),
        [] => bail!("{describe}: no token matches (pkcs11-tool --list-slots lists them)"),
        _ => bail!(
            "{describe}: {} tokens match: add token= (or serial=) to the URI",
            found.len()
        ),
    }
}

/// The one object of `class` with the URI's label and id.
fn find_one(
    session: &Session,
    u: &Pkcs11Uri,
    class: ObjectClass,
    describe: &str,
) -> Result<ObjectHandle> {
    let mut template = vec![Attribute::Class(class)];
    if let Some(o) = &u.object {
        template.push(Attribute::Label(o.as_bytes().to_vec()));
    }
    if let Some(id) = &u.id {
        template.push(Attribute::Id(id.clone()));
    }
    let found = session
        .find_objects(&template)
        .map_err(|e| anyhow!("{describe}: searching the token: {e}"))?;
    match found.as_slice() {
        [one] => Ok(*one),
        [] => bail!(
            "{describe}: the token has no {class} with this label and id (pkcs11-tool --login \
             --list-objects lists them; a private key needs the PIN)"
        ),
        _ => bail!(
            "{describe}: {} objects ({class}) match: add id= to the URI",
            found.len()
        ),
    }
}

/// The public key object `h` as a DER SubjectPublicKeyInfo.
fn public_der(session: &Session, h: ObjectHandle, t: KeyType, describe: &str) -> Result<Vec<u8>> {
    use ed25519_dalek::pkcs8::EncodePublicKey;
    if t == KeyType::EC_EDWARDS {
        let point = match session
            .get_attributes(h, &[AttributeType::EcPoint])?
            .first()
        {
            Some(Attribute::EcPoint(p)) => p.clone(),
            _ => bail!("{describe}: the public key has no EC point"),
        };
        // A DER OCTET STRING (PKCS#11 3.0), or the raw 32 bytes some
        // tokens give.
        let raw = match point.as_slice() {
            [0x04, 32, rest @ ..] if rest.len() == 32 => rest.to_vec(),
            r if r.len() == 32 => r.to_vec(),
            _ => bail!("{describe}: the public key is not an ed25519 point"),
        };
        let raw: [u8; 32] = raw
            .try_into()
            .map_err(|_| anyhow!("{describe}: bad point"))?;
        let key = ed25519_dalek::VerifyingKey::from_bytes(&raw)
            .map_err(|_| anyhow!("{describe}: the public key is not an ed25519 point"))?;
        return Ok(key
            .to_public_key_der()
            .map_err(|e| anyhow!("encoding the public key: {e}"))?
            .into_vec());
    }
    if t == KeyType::RSA {
        let attrs =
            session.get_attributes(h, &[AttributeType::Modulus, AttributeType::PublicExponent])?;
        let (mut n, mut e) = (None, None);
        for a in attrs {
            match a {
                Attribute::Modulus(m) => n = Some(m),
                Attribute::PublicExponent(x) => e = Some(x),
                _ => {}
            }
        }
        let (Some(n), Some(e)) = (n, e) else {
            bail!("{describe}: the RSA public key lacks its modulus or exponent");
        };
        let key = rsa::RsaPublicKey::new(
            rsa::BigUint::from_bytes_be(&n),
            rsa::BigUint::from_bytes_be(&e),
        )
        .map_err(|e| anyhow!("{describe}: the RSA public key: {e}"))?;
        use rsa::pkcs8::EncodePublicKey as _;
        let doc = key
            .to_public_key_der()
            .map_err(|e| anyhow!("encoding the public key: {e}"))?;
        return Ok(doc.into_vec());
    }
    bail!("{describe}: a {t} key: only ed25519 and RSA keys sign here")
}
