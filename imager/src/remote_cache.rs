//! A build cache shared through an OCI registry (`imager build
//! --cache-registry REGISTRY/NAME`, profile `cache.registry`): what one
//! machine compiled, another pulls instead of compiling it again. The
//! registries people already run are the shared store (GHCR, Harbor, a
//! plain `docker-registry`); no server of our own.
//!
//! An entry is an OCI image manifest tagged `KIND-KEY` (`kernel-<the
//! kernel's 64-hex cache key>`) in the cache repository:
//!
//! - its config blob is the **statement** (JSON, [`MEDIA_STATEMENT`]):
//!   the kind, the key, and each file's name, size and digest;
//! - its first layer is the **signature** of the statement's bytes
//!   ([`MEDIA_SIGNATURE`]: the signer's key id and an ed25519 signature,
//!   by the build's signing key, through [`crate::sign::Signer`], over
//!   `imager cache statement v1\0` and the statement);
//! - the other layers are the files, in the statement's order.
//!
//! An entry is used only when everything holds: the signature is by a key
//! this build trusts (its own signing key's, and the profile's
//! `cache.trusted_keys`); the statement names this kind and this key and
//! only files of that kind, each within its bound; the manifest's layers
//! are the statement's digests; each file read hashes to its digest (the
//! registry client's verified reads). Otherwise it is **refused**, with a
//! message, and the stage is built here as on a miss. Files are written
//! into a temporary directory the caller renames into the local cache.
//!
//! A push uploads the files, the signature and the statement (blobs by
//! digest: two machines pushing the same entry upload the same bytes), then
//! the manifest under the tag: a tag names a whole manifest, so concurrent
//! pushes of one key leave one complete entry, whichever came last. The
//! cache is an optimisation: an unreachable registry is a warning, never a
//! failed build. docs/build-cache.md says how to point it at a registry
//! and what to garbage-collect.

use crate::sign::Signer;
use anyhow::{Context, Result, anyhow, bail};
use base64::Engine as _;
use ed25519_dalek::{Signature, Verifier as _, VerifyingKey};
use registry::{Client, Descriptor, Digest, Reference};
use serde::{Deserialize, Serialize};
use std::io::Read;
use std::path::Path;

/// The statement's media type (the manifest's config).
pub const MEDIA_STATEMENT: &str = "application/vnd.imager.cache.statement.v1+json";
/// The signature layer's media type.
pub const MEDIA_SIGNATURE: &str = "application/vnd.imager.cache.signature.v1+json";
/// A file layer's media type.
pub const MEDIA_FILE: &str = "application/octet-stream";
/// The largest statement and signature read.
pub const MAX_STATEMENT: u64 = 64 << 10;
pub const MAX_SIGNATURE: u64 = 4 << 10;

/// The kinds of entry, their files and each file's bound: the kernel
/// ([`crate::kernel::build::build_shared`]), an image grub-mkimage made
/// ([`crate::grub`]), and the root filesystem's compressed blocks
/// ([`crate::rootfs::pack`]: a pack of the blocks one root filesystem
/// used).
pub const KINDS: [(&str, &[(&str, u64)]); 3] = [
    (
        "kernel",
        &[
            ("bzImage", 128 << 20),
            ("config", 4 << 20),
            ("kconfig-symbols", 4 << 20),
            ("build-info.json", 64 << 10),
        ],
    ),
    ("grub", &[("image", 4 << 20)]),
    ("rootfs-blocks", &[("pack", crate::rootfs::pack::MAX_FILE)]),
];

fn files_of(kind: &str) -> Result<&'static [(&'static str, u64)]> {
    KINDS
        .iter()
        .find(|(k, _)| *k == kind)
        .map(|(_, f)| *f)
        .ok_or_else(|| anyhow!("no cache entries of kind {kind}"))
}

#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
struct Statement {
    kind: String,
    key: String,
    files: Vec<FileEntry>,
}

#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
struct FileEntry {
    name: String,
    size: u64,
    digest: String,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SignatureDoc {
    key_id: String,
    signature: String,
}

/// Where the cache is, and whom it trusts.
pub struct RemoteCache {
    client: Client,
    /// `REGISTRY/NAME`.
    repository: String,
    trusted: Vec<VerifyingKey>,
    /// The registry could not be reached once: not tried again in this
    /// build (each try would wait out its own timeouts).
    unreachable: std::sync::atomic::AtomicBool,
}

/// What a lookup found.
#[derive(Debug)]
pub enum Fetched {
    /// The entry, verified, its files written into the directory asked.
    Hit,
    /// No entry for the key.
    Miss,
    /// An entry that is not to be used: why.
    Refused(String),
}

impl RemoteCache {
    /// A cache in `repository` (`REGISTRY/NAME`) reached with `client`,
    /// trusting entries signed by `trusted`.
    pub fn new(
        repository: &str,
        client: Client,
        trusted: Vec<VerifyingKey>,
    ) -> Result<RemoteCache> {
        check_repository(repository)?;
        Ok(RemoteCache {
            client,
            repository: repository.to_string(),
            trusted,
            unreachable: std::sync::atomic::AtomicBool::new(false),
        })
    }

    pub fn repository(&self) -> &str {
        &self.repository
    }

    fn is_unreachable(&self) -> bool {
        self.unreachable.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn set_unreachable(&self) {
        self.unreachable
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    fn reference(&self, kind: &str, key: &str) -> Result<Reference> {
        if key.len() != 64 || !key.bytes().all(|b| b.is_ascii_hexdigit()) {
            bail!("a cache key is 64 hex digits");
        }
        Reference::parse(&format!("{}:{kind}-{key}", self.repository)).map_err(|e| anyhow!("{e}"))
    }

    /// Looks `kind`/`key` up; on a hit, its files are in `dest` (created).
    /// Network failures are errors (the caller warns and builds).
    pub fn fetch(&self, kind: &str, key: &str, dest: &Path) -> Result<Fetched> {
        let r = self.reference(kind, key)?;
        let manifest = match self.client.manifest(&r) {
            Ok(m) => m,
            Err(e) if e.kind() == registry::ErrorKind::NotFound => return Ok(Fetched::Miss),
            Err(e) => return Err(anyhow!("{e}")),
        };
        let statement = match self.check(&r, &manifest, kind, key) {
            Ok(s) => s,
            Err(why) => return Ok(Fetched::Refused(why)),
        };
        std::fs::create_dir_all(dest).with_context(|| format!("creating {}", dest.display()))?;
        for (f, layer) in statement.files.iter().zip(&manifest.layers[1..]) {
            let path = dest.join(&f.name);
            let copied = (|| -> Result<()> {
                let mut blob = self.client.blob(&r, layer).map_err(|e| anyhow!("{e}"))?;
                let mut out = std::fs::File::create(&path)
                    .with_context(|| format!("creating {}", path.display()))?;
                std::io::copy(&mut blob, &mut out).map_err(read_error)?;
                out.sync_all()?;
                Ok(())
            })();
            if let Err(e) = copied {
                let _ = std::fs::remove_dir_all(dest);
                return Ok(Fetched::Refused(format!(
                    "{r}: {} ({e:#}); a blob damaged in the registry's storage stays there \
                     (a push of the same bytes does not replace it): delete the tag (skopeo \
                     delete docker://{r}) and run the registry's garbage collection",
                    f.name
                )));
            }
        }
        Ok(Fetched::Hit)
    }

    /// The statement of the entry `manifest` (of `r`) if it is a trusted
    /// entry of `kind`/`key` whose layers are the files it names (their
    /// bytes are checked as they are read); else why not.
    fn check(
        &self,
        r: &Reference,
        manifest: &registry::ImageManifest,
        kind: &str,
        key: &str,
    ) -> Result<Statement, String> {
        let files = files_of(kind).map_err(|e| format!("{e:#}"))?;
        if manifest.config.media_type != MEDIA_STATEMENT
            || manifest.config.size > MAX_STATEMENT
            || manifest.layers.len() != files.len() + 1
            || manifest.layers[0].media_type != MEDIA_SIGNATURE
            || manifest.layers[0].size > MAX_SIGNATURE
        {
            return Err(format!(
                "{r} is not a cache entry of this version of imager"
            ));
        }
        let statement = self
            .small(r, &manifest.config)
            .map_err(|e| format!("{e:#}"))?;
        let signature = self
            .small(r, &manifest.layers[0])
            .map_err(|e| format!("{e:#}"))?;
        self.verify(&statement, &signature)
            .map_err(|e| format!("{r}: {e:#}"))?;
        let parsed: Statement = serde_json::from_slice(&statement)
            .map_err(|_| format!("{r}: its statement is not valid"))?;
        if parsed.kind != kind || parsed.key != key {
            return Err(format!(
                "{r} is signed for another entry ({} {}): a tag moved to another entry",
                contract::text::excerpt(&parsed.kind),
                contract::text::excerpt(&parsed.key)
            ));
        }
        let names: Vec<&str> = parsed.files.iter().map(|f| f.name.as_str()).collect();
        let wanted: Vec<&str> = files.iter().map(|(n, _)| *n).collect();
        if names != wanted {
            return Err(format!("{r} does not hold the files of a {kind} entry"));
        }
        for ((f, (_, bound)), layer) in parsed.files.iter().zip(files).zip(&manifest.layers[1..]) {
            if f.size > *bound || layer.size != f.size || layer.digest.as_str() != f.digest {
                return Err(format!(
                    "{r}: its layer for {} is not the one its signed statement names",
                    f.name
                ));
            }
        }
        Ok(parsed)
    }

    /// A small blob of `r`, read whole (its digest checked on the way).
    fn small(&self, r: &Reference, d: &Descriptor) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        self.client
            .blob(r, d)
            .map_err(|e| anyhow!("{e}"))?
            .take(MAX_STATEMENT + 1)
            .read_to_end(&mut out)
            .map_err(read_error)?;
        Ok(out)
    }

    /// The statement's signature is by a trusted key.
    fn verify(&self, statement: &[u8], signature: &[u8]) -> Result<()> {
        let doc: SignatureDoc =
            serde_json::from_slice(signature).map_err(|_| anyhow!("its signature is not valid"))?;
        let raw = base64::engine::general_purpose::STANDARD
            .decode(doc.signature.as_bytes())
            .map_err(|_| anyhow!("its signature is not base64"))?;
        let sig =
            Signature::from_slice(&raw).map_err(|_| anyhow!("its signature is not ed25519"))?;
        let key = self
            .trusted
            .iter()
            .find(|k| payload::keys::key_id(k) == doc.key_id)
            .ok_or_else(|| {
                anyhow!(
                    "signed by {}, a key this build does not trust (its signing key and \
                     cache.trusted_keys are trusted)",
                    contract::text::excerpt(&doc.key_id)
                )
            })?;
        key.verify(&signed_bytes(statement), &sig)
            .map_err(|_| anyhow!("its signature does not verify: the entry was changed"))
    }

    /// Pushes the files of `kind`/`key` from `dir`, signed by `signer`,
    /// unless the registry has a trusted entry for the key already: one it
    /// would refuse (another signer's, a damaged one) is replaced, so that
    /// a bad entry does not hold its key for good.
    pub fn store(&self, kind: &str, key: &str, dir: &Path, signer: &dyn Signer) -> Result<bool> {
        let files = files_of(kind)?;
        let r = self.reference(kind, key)?;
        match self.client.manifest(&r) {
            Ok(m) if self.check(&r, &m, kind, key).is_ok() => return Ok(false),
            Ok(_) => {}
            Err(e) if e.kind() == registry::ErrorKind::NotFound => {}
            Err(e) => return Err(anyhow!("{e}")),
        }
        let mut entries = Vec::new();
        let mut layers = Vec::new();
        for (name, _) in files {
            let path = dir.join(name);
            let (hex, size) = crate::io::sha256_file(&path)?;
            let d = Descriptor {
                media_type: MEDIA_FILE.into(),
                digest: Digest::parse(&format!("sha256:{hex}")).map_err(|e| anyhow!("{e}"))?,
                size,
            };
            let f = std::fs::File::open(&path)
                .with_context(|| format!("reading {}", path.display()))?;
            self.client
                .push_blob(&r, &d, std::io::BufReader::new(f))
                .map_err(|e| anyhow!("{e}"))?;
            entries.push(FileEntry {
                name: (*name).to_string(),
                size,
                digest: d.digest.to_string(),
            });
            layers.push(d);
        }
        let statement = serde_json::to_vec(&Statement {
            kind: kind.into(),
            key: key.into(),
            files: entries,
        })?;
        let signature = serde_json::to_vec(&SignatureDoc {
            key_id: signer.key_id(),
            signature: base64::engine::general_purpose::STANDARD
                .encode(signer.sign(&signed_bytes(&statement))?.to_bytes()),
        })?;
        let blob = |bytes: &[u8], media: &str| -> Result<Descriptor> {
            let d = Descriptor {
                media_type: media.into(),
                digest: Digest::of(bytes),
                size: bytes.len() as u64,
            };
            self.client
                .push_blob(&r, &d, bytes)
                .map_err(|e| anyhow!("{e}"))?;
            Ok(d)
        };
        let config = blob(&statement, MEDIA_STATEMENT)?;
        layers.insert(0, blob(&signature, MEDIA_SIGNATURE)?);
        let describe = |d: &Descriptor| serde_json::json!({"mediaType": d.media_type, "digest": d.digest.as_str(), "size": d.size});
        let manifest = serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "mediaType": crate::oci::MEDIA_TYPE_MANIFEST,
            "config": describe(&config),
            "layers": layers.iter().map(describe).collect::<Vec<_>>(),
        }))?;
        self.client
            .push_manifest(&r, crate::oci::MEDIA_TYPE_MANIFEST, &manifest)
            .map_err(|e| anyhow!("{e}"))?;
        Ok(true)
    }
}

/// A shared cache as a stage uses it: the cache, and the signer of what
/// the stage pushes. Its failures are warnings (the cache is an
/// optimisation); what it did is said on the progress output, one line.
#[derive(Clone, Copy)]
pub struct Shared<'a> {
    pub cache: &'a RemoteCache,
    pub signer: &'a dyn Signer,
}

impl Shared<'_> {
    /// Pulls `kind`/`key` into `dest` (a directory it creates): true on a
    /// hit, its files there. A refused entry, or a registry that cannot be
    /// reached, is a warning and false, as a miss is; nothing is left in
    /// `dest` then.
    pub fn pull(&self, kind: &str, key: &str, dest: &Path) -> bool {
        let repo = self.cache.repository();
        if self.cache.is_unreachable() {
            return false;
        }
        match self.cache.fetch(kind, key, dest) {
            Ok(Fetched::Hit) => {
                crate::progress::line(&format!(
                    "{kind}: pulled from the cache registry {repo} (key {}…), signed by a \
                     trusted key",
                    short(key)
                ));
                true
            }
            Ok(Fetched::Miss) => {
                crate::progress::line(&format!(
                    "{kind}: not in the cache registry {repo} (key {}…): made here",
                    short(key)
                ));
                false
            }
            Ok(Fetched::Refused(why)) => {
                crate::progress::line(&format!(
                    "warning: {kind}: the cache registry's entry is refused and it is \
                     made here: {why}"
                ));
                false
            }
            Err(e) => {
                self.cache.set_unreachable();
                crate::progress::line(&format!(
                    "warning: {kind}: the cache registry {repo} could not be read; made \
                     here, and the registry is not tried again by this build ({e:#})"
                ));
                false
            }
        }
    }

    /// Pushes the files of `kind`/`key` from `dir`, unless the registry
    /// holds a trusted entry for the key already.
    pub fn push(&self, kind: &str, key: &str, dir: &Path) {
        let repo = self.cache.repository();
        if self.cache.is_unreachable() {
            return;
        }
        match self.cache.store(kind, key, dir, self.signer) {
            Ok(true) => crate::progress::line(&format!(
                "{kind}: pushed to the cache registry {repo} (key {}…)",
                short(key)
            )),
            Ok(false) => {}
            Err(e) => {
                self.cache.set_unreachable();
                crate::progress::line(&format!(
                    "warning: {kind}: could not push to the cache registry {repo}; it is not \
                     tried again by this build ({e:#})"
                ))
            }
        }
    }

    /// [`Shared::pull`] of a kind of one file: its bytes (at most the
    /// kind's bound), through a temporary directory in `scratch`.
    pub fn pull_file(&self, kind: &str, key: &str, scratch: &Path) -> Option<Vec<u8>> {
        let (name, _) = files_of(kind).ok()?.first()?;
        let tmp = tempfile::Builder::new()
            .prefix(".cache-pull.")
            .tempdir_in(scratch)
            .ok()?;
        let dest = tmp.path().join("entry");
        if !self.pull(kind, key, &dest) {
            return None;
        }
        std::fs::read(dest.join(name)).ok()
    }

    /// [`Shared::push`] of a kind of one file, `bytes`.
    pub fn push_file(&self, kind: &str, key: &str, bytes: &[u8], scratch: &Path) {
        let Some((name, _)) = files_of(kind).ok().and_then(|f| f.first()) else {
            return;
        };
        let dir = tempfile::Builder::new()
            .prefix(".cache-push.")
            .tempdir_in(scratch);
        let written = dir.and_then(|d| std::fs::write(d.path().join(name), bytes).map(|()| d));
        match written {
            Ok(d) => self.push(kind, key, d.path()),
            Err(e) => crate::progress::line(&format!(
                "warning: {kind}: could not push to the cache registry {} ({e})",
                self.cache.repository()
            )),
        }
    }
}

/// A key as progress lines show it: its first 12 digits.
fn short(key: &str) -> &str {
    key.get(..12).unwrap_or(key)
}

/// An error reading a blob: the registry client's own (a digest that does
/// not match, a cut connection), else the I/O error.
fn read_error(e: std::io::Error) -> anyhow::Error {
    match registry::Error::of_io(&e) {
        Some(re) => anyhow!("{re}"),
        None => anyhow!("{e}"),
    }
}

/// What a cache signature covers: a context of its own, then the
/// statement (a signing key that also signs payload manifests never signs
/// a cache statement that could be read as something else).
const SIGNED_CONTEXT: &[u8] = b"imager cache statement v1\0";

fn signed_bytes(statement: &[u8]) -> Vec<u8> {
    [SIGNED_CONTEXT, statement].concat()
}

/// `REGISTRY/NAME`: a reference without a tag or digest.
pub fn check_repository(repository: &str) -> Result<()> {
    let r = Reference::parse(&format!("{repository}:probe")).map_err(|e| {
        anyhow!(
            "the cache registry {}: {e}",
            contract::text::excerpt(repository)
        )
    })?;
    if r.digest().is_some() || repository.contains('@') {
        bail!(
            "the cache registry is REGISTRY/NAME (a repository, without a tag): {}",
            contract::text::excerpt(repository)
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests;
