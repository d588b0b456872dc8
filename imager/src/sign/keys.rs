//! Keys: the [`Signer`] trait, PEM key files and key generation.
//!
//! Private keys are PKCS#8 v1 PEM (`-----BEGIN PRIVATE KEY-----`), exactly
//! what `openssl genpkey -algorithm ed25519` writes; public keys are SPKI PEM
//! (`-----BEGIN PUBLIC KEY-----`), what `openssl pkey -pubout` writes.

use anyhow::{Context, Result, bail};
use ed25519_dalek::pkcs8::spki::der::pem::LineEnding;
use ed25519_dalek::pkcs8::spki::der::zeroize::Zeroizing;
use ed25519_dalek::pkcs8::{DecodePrivateKey, DecodePublicKey, EncodePrivateKey, EncodePublicKey};
use ed25519_dalek::{Signature, Signer as _, SigningKey, VerifyingKey};
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::io::write_atomic;
use payload::keys::key_id;

/// File name of the development private key inside the key directory.
pub const DEV_KEY: &str = "dev.key";
/// File name of the development public key inside the key directory.
pub const DEV_PUB: &str = "dev.pub";

/// Key files are small; anything larger is not a key and is not read whole.
const MAX_KEY_FILE: u64 = 64 * 1024;

/// Something that signs with an ed25519 key: a key file today, a hardware
/// token later. Implementations never expose the private key.
pub trait Signer {
    /// The public half of the signing key.
    fn public_key(&self) -> VerifyingKey;
    /// `ed25519:` followed by the first 16 hex digits of the SHA-256 of the
    /// raw 32-byte public key; see [`key_id`].
    fn key_id(&self) -> String {
        key_id(&self.public_key())
    }
    /// A detached ed25519 (RFC 8032, pure) signature over `message`.
    fn sign(&self, message: &[u8]) -> Result<Signature>;
}

/// A signer whose private key is a PKCS#8 PEM file.
pub struct FileSigner {
    pub(super) key: SigningKey,
    path: PathBuf,
}

impl std::fmt::Debug for FileSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the private key.
        f.debug_struct("FileSigner")
            .field("path", &self.path)
            .field("key_id", &key_id(&self.key.verifying_key()))
            .finish()
    }
}

impl FileSigner {
    /// Loads a PKCS#8 PEM ed25519 private key (v1, as openssl writes it, or
    /// v2 with the public key, which must then match).
    pub fn load(path: &Path) -> Result<FileSigner> {
        let text = read_small(path, "private key")?;
        let text = Zeroizing::new(text);
        let key = SigningKey::from_pkcs8_pem(text.trim()).map_err(|e| {
            let hint = if text.contains("PUBLIC KEY") {
                " (this is a public key; the signer needs the private key)"
            } else {
                ""
            };
            anyhow::anyhow!(
                "{}: not an ed25519 private key in PKCS#8 PEM{hint}: {e}",
                path.display()
            )
        })?;
        Ok(FileSigner {
            key,
            path: path.to_path_buf(),
        })
    }

    /// Where the private key was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Signer for FileSigner {
    fn public_key(&self) -> VerifyingKey {
        self.key.verifying_key()
    }
    fn sign(&self, message: &[u8]) -> Result<Signature> {
        Ok(self.key.try_sign(message)?)
    }
}

/// Reads a small text file (a key), refusing anything that is not one.
fn read_small(path: &Path, what: &str) -> Result<String> {
    let meta =
        std::fs::metadata(path).with_context(|| format!("reading {what} {}", path.display()))?;
    if !meta.is_file() || meta.len() > MAX_KEY_FILE {
        bail!("{}: not a {what} file", path.display());
    }
    let bytes =
        std::fs::read(path).with_context(|| format!("reading {what} {}", path.display()))?;
    String::from_utf8(bytes)
        .map_err(|_| anyhow::anyhow!("{}: not a {what} in PEM (not text)", path.display()))
}

/// Loads a trusted public key: SPKI PEM (`-----BEGIN PUBLIC KEY-----`, as
/// `openssl pkey -pubout` writes it), or the raw 32-byte key as 64 hex digits.
pub fn load_public_key(path: &Path) -> Result<VerifyingKey> {
    let text = read_small(path, "public key")?;
    let text = text.trim();
    if text.len() == 64 && text.bytes().all(|b| b.is_ascii_hexdigit()) {
        let mut raw = [0u8; 32];
        hex::decode_to_slice(text, &mut raw)
            .with_context(|| format!("{}: bad hex", path.display()))?;
        return VerifyingKey::from_bytes(&raw).map_err(|e| {
            anyhow::anyhow!(
                "{}: not an ed25519 public key (raw hex): {e}",
                path.display()
            )
        });
    }
    if text.contains("PRIVATE KEY") {
        bail!(
            "{}: this is a private key; pass the public key (openssl pkey -in {} -pubout)",
            path.display(),
            path.display()
        );
    }
    VerifyingKey::from_public_key_pem(text)
        .map_err(|e| anyhow::anyhow!("{}: not an ed25519 public key in PEM: {e}", path.display()))
}

/// The SPKI PEM text of a public key, as `openssl pkey -pubout` writes it.
pub fn public_key_pem(key: &VerifyingKey) -> Result<String> {
    key.to_public_key_pem(LineEnding::LF)
        .map_err(|e| anyhow::anyhow!("encoding the public key: {e}"))
}

/// The PKCS#8 v1 PEM of a private key (no embedded public key: the form
/// openssl writes and every PKCS#8 reader accepts).
fn private_key_pem(key: &SigningKey) -> Result<Zeroizing<String>> {
    let pair = ed25519_dalek::pkcs8::KeypairBytes {
        secret_key: key.to_bytes(),
        public_key: None,
    };
    pair.to_pkcs8_pem(LineEnding::LF)
        .map_err(|e| anyhow::anyhow!("encoding the private key: {e}"))
}

/// Creates the directory of a key file, the last level with mode 0700.
fn create_key_dir(file: &Path) -> Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    let dir = file
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
        .to_path_buf();
    if !dir.exists() {
        if let Some(up) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(up).with_context(|| format!("creating {}", up.display()))?;
        }
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e).with_context(|| format!("creating {}", dir.display())),
        }
    }
    Ok(dir)
}

fn sync_dir(dir: &Path) -> Result<()> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("flushing directory {}", dir.display()))
}

/// Why writing a private key failed: it already existed, or something else.
enum WriteKey {
    Exists,
    Other(anyhow::Error),
}

impl From<anyhow::Error> for WriteKey {
    fn from(e: anyhow::Error) -> Self {
        WriteKey::Other(e)
    }
}

/// Writes a private key atomically. The temporary file is created with mode
/// 0600 (the umask can only narrow it), so the key is never readable by
/// others, not even before the rename. Without `force` the final rename is
/// a no-clobber link, so two racing writers cannot replace each other's key.
fn write_private_key(path: &Path, key: &SigningKey, force: bool) -> Result<(), WriteKey> {
    use std::os::unix::fs::PermissionsExt;
    let dir = create_key_dir(path)?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut tmp = tempfile::Builder::new()
        .prefix(&format!(".{name}."))
        .suffix(".partial")
        .permissions(std::fs::Permissions::from_mode(0o600))
        .tempfile_in(&dir)
        .with_context(|| format!("creating a temporary file for {}", path.display()))?;
    let pem = private_key_pem(key)?;
    tmp.write_all(pem.as_bytes())
        .and_then(|()| tmp.as_file().sync_all())
        .with_context(|| format!("writing {}", path.display()))?;
    let persisted = if force {
        tmp.persist(path)
    } else {
        tmp.persist_noclobber(path)
    };
    match persisted {
        Ok(_) => {}
        Err(e) if e.error.kind() == std::io::ErrorKind::AlreadyExists => {
            return Err(WriteKey::Exists);
        }
        Err(e) => {
            return Err(WriteKey::Other(
                anyhow::Error::new(e.error).context(format!("renaming into {}", path.display())),
            ));
        }
    }
    sync_dir(&dir)?;
    Ok(())
}

fn write_public_key(path: &Path, key: &VerifyingKey) -> Result<()> {
    write_atomic(path, public_key_pem(key)?.as_bytes(), 0o644)?;
    Ok(())
}

/// What `path` names once resolved: symbolic links and `.`/`..` followed
/// as far as the path exists, so that `k` and `./k` (or a link to `k`) are
/// seen to be one file.
fn resolved(path: &Path) -> PathBuf {
    let abs = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    if let Ok(c) = abs.canonicalize() {
        return c;
    }
    match (abs.parent(), abs.file_name()) {
        (Some(d), Some(n)) => d.canonicalize().map(|d| d.join(n)).unwrap_or(abs),
        _ => abs,
    }
}

/// Generates a new ed25519 key pair: `private` (PKCS#8 PEM, mode 0600) and
/// `public` (SPKI PEM, mode 0644). Refuses two paths that are one file, and
/// anything in the way that is not a regular file; refuses to replace a key
/// unless `force`. The pair is written all or nothing: the public key waits
/// in a temporary file until the private key is in place, and a public key
/// that cannot be put in place takes the new private key away again (an
/// old one replaced with `force` comes back). Returns the key id; the
/// private key is never printed.
pub fn keygen(private: &Path, public: &Path, force: bool) -> Result<String> {
    if resolved(private) == resolved(public) {
        bail!(
            "the private and the public key must be different files ({} and {} are one): \
             give --public another path",
            private.display(),
            public.display()
        );
    }
    for (p, what) in [(private, "private"), (public, "public")] {
        match p.symlink_metadata() {
            Ok(m) if !m.file_type().is_file() => bail!(
                "{what} key path {} is not a regular file (a directory, link, device or \
                 pipe): refusing to replace it; choose another path",
                p.display()
            ),
            Ok(_) if !force => bail!(
                "{what} key {} already exists: refusing to overwrite it (pass --force to replace it)",
                p.display()
            ),
            _ => {}
        }
    }
    let key = SigningKey::generate(&mut rand_core::OsRng);
    create_key_dir(public)?;
    let mut pending_public = crate::io::AtomicFile::create(public)?;
    pending_public
        .write_all(public_key_pem(&key.verifying_key())?.as_bytes())
        .with_context(|| format!("writing {}", public.display()))?;
    // An old private key replaced with --force is kept aside until the
    // public key is in place too.
    let kept = match (force, private.symlink_metadata()) {
        (true, Ok(_)) => {
            let aside = private.with_file_name(format!(
                ".{}.replaced",
                private
                    .file_name()
                    .map(|n| n.to_string_lossy())
                    .unwrap_or_default()
            ));
            let _ = std::fs::remove_file(&aside);
            std::fs::hard_link(private, &aside)
                .with_context(|| format!("keeping {} aside", private.display()))?;
            Some(aside)
        }
        _ => None,
    };
    let undo = |kept: &Option<PathBuf>| match kept {
        Some(aside) => std::fs::rename(aside, private),
        None => std::fs::remove_file(private),
    };
    match write_private_key(private, &key, force) {
        Ok(()) => {}
        Err(e) => {
            if let Some(aside) = &kept {
                let _ = std::fs::remove_file(aside);
            }
            return Err(match e {
                WriteKey::Exists => anyhow::anyhow!(
                    "private key {} already exists: refusing to overwrite it (pass --force to replace it)",
                    private.display()
                ),
                WriteKey::Other(e) => e,
            });
        }
    }
    if let Err(e) = pending_public.commit_with_mode(0o644) {
        let restored = undo(&kept);
        return Err(e.context(format!(
            "writing the public key {}: {}",
            public.display(),
            match restored {
                Ok(()) if kept.is_some() => "the old private key is back in place",
                Ok(()) => "the new private key was removed: nothing was written",
                Err(_) => "and the private key could not be put back: check it",
            }
        )));
    }
    if let Some(aside) = &kept {
        let _ = std::fs::remove_file(aside);
    }
    Ok(key_id(&key.verifying_key()))
}

/// Loads the development key `dir/dev.key`, creating it (and `dir/dev.pub`)
/// if it does not exist. Returns the signer and whether the key was created.
/// `dir/dev.pub` is derived data: rewritten when missing or stale.
pub fn load_or_create_dev_key(dir: &Path) -> Result<(FileSigner, bool)> {
    let private = dir.join(DEV_KEY);
    let public = dir.join(DEV_PUB);
    let mut created = false;
    if private.symlink_metadata().is_err() {
        let key = SigningKey::generate(&mut rand_core::OsRng);
        match write_private_key(&private, &key, false) {
            Ok(()) => created = true,
            // Another build created it meanwhile: use that one.
            Err(WriteKey::Exists) => {}
            Err(WriteKey::Other(e)) => return Err(e),
        }
    }
    let signer = FileSigner::load(&private)?;
    let pem = public_key_pem(&signer.public_key())?;
    if std::fs::read_to_string(&public).ok().as_deref() != Some(pem.as_str()) {
        write_public_key(&public, &signer.public_key())?;
    }
    Ok((signer, created))
}
