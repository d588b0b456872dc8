//! Which payloads a disk trusts: the one check `imager install`, `imager
//! upgrade` and the node's pull make of a payload's signed manifest
//! (docs/signing.md, "The root of trust").
//!
//! A disk's root of trust ([`disk_root`]) is META's `trust-root`, or, on a
//! disk made before roots (or by a build without `signing.root`), its
//! `trusted-keys` as root version 1 with threshold 1. A payload brings its
//! manifest and signature and, optionally, the trust files
//! ([`contract::paths::PAYLOAD_TRUST_FILES`]): more signatures of the
//! manifest, and the root it was built for with that root's signatures.
//! [`verify`] then:
//!
//! 1. takes the payload's root when its version is above the disk's: it
//!    must be the next one, signed by a threshold of the disk's root and
//!    of its own ([`Root::accept_next`]); a root at or below the disk's
//!    version is not applied (an older payload carries an older root);
//! 2. counts the manifest's valid signatures by the keys of the root that
//!    will be current (the payload's next root when it brings one, as TUF
//!    verifies targets with the newest root): `manifest.json.sig` counts
//!    for the key the manifest names, each entry of `manifest.json.sigs`
//!    for its key, each key once; the threshold must be met.
//!
//! Where the next root goes (META's `trust-root-next`, promoted when the
//! upgrade is blessed) is `bootstate::ops`'s.
//!
//! Untrusted bytes: every file is bounded ([`MAX_TRUST_FILE`]), read only
//! when it is a regular file, and parsed by `root`'s bounded parsers.

use crate::keys::{key_id, parse_trusted_keys};
use crate::manifest::Manifest;
use crate::root::{Root, SignatureEntry, parse_signatures};
use crate::verify::claimed_key_id;
use anyhow::{Context, Result, anyhow, bail};
use contract::meta::{Meta, Tag};
use contract::paths::{self, output};
use ed25519_dalek::VerifyingKey;
use std::io::Read;
use std::path::Path;

/// The largest manifest or trust file read from a payload.
pub const MAX_TRUST_FILE: u64 = 1 << 20;

/// A payload's signed manifest and its trust files, as read (untrusted).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrustFiles {
    /// `manifest.json`.
    pub manifest: Vec<u8>,
    /// `manifest.json.sig`: the raw ed25519 signature of the key the
    /// manifest names.
    pub signature: Vec<u8>,
    /// `manifest.json.sigs`.
    pub signatures: Option<Vec<u8>>,
    /// `root.json`.
    pub root: Option<Vec<u8>>,
    /// `root.json.sigs`.
    pub root_signatures: Option<Vec<u8>>,
}

impl TrustFiles {
    /// Where the file `name` (a name of the payload directory) goes:
    /// `None` for a name that is not a trust file.
    pub fn slot(&mut self, name: &str) -> Option<&mut Option<Vec<u8>>> {
        match name {
            output::SIGNATURES => Some(&mut self.signatures),
            output::ROOT => Some(&mut self.root),
            output::ROOT_SIGNATURES => Some(&mut self.root_signatures),
            _ => None,
        }
    }

    /// The trust files present, by name, taken out (the manifest and its
    /// signature stay): what is written beside the manifest.
    pub fn take_named(&mut self) -> Vec<(&'static str, Vec<u8>)> {
        paths::PAYLOAD_TRUST_FILES
            .into_iter()
            .filter_map(|name| Some((name, self.slot(name)?.take()?)))
            .collect()
    }

    /// The trust files of the payload directory `dir`: the manifest and
    /// its signature, which must be there, and those of the others that
    /// are. Each must be a regular file (a FIFO is not waited on) of at
    /// most [`MAX_TRUST_FILE`] bytes.
    pub fn read_dir(dir: &Path) -> Result<TrustFiles> {
        let need = |name: &str| -> Result<Vec<u8>> {
            read_small(&dir.join(name))?
                .ok_or_else(|| anyhow!("{} is missing: the payload is not signed", name))
        };
        let mut files = TrustFiles {
            manifest: need(paths::PAYLOAD_MANIFEST)?,
            signature: need(paths::PAYLOAD_SIGNATURE)?,
            ..TrustFiles::default()
        };
        for name in paths::PAYLOAD_TRUST_FILES {
            let bytes = read_small(&dir.join(name))?;
            if let Some(slot) = files.slot(name) {
                *slot = bytes;
            }
        }
        Ok(files)
    }
}

/// The file `path` when it exists: a regular file of at most
/// [`MAX_TRUST_FILE`] bytes, opened without waiting on a FIFO. The one
/// reader of trust files (payloads, and `imager root`'s and `sign --add`'s
/// files).
pub fn read_small(path: &Path) -> Result<Option<Vec<u8>>> {
    read_bounded(path, MAX_TRUST_FILE)
}

/// [`read_small`] with another bound: at most `max` bytes.
pub fn read_bounded(path: &Path, max: u64) -> Result<Option<Vec<u8>>> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let meta = f
        .metadata()
        .with_context(|| format!("reading {}", path.display()))?;
    if !meta.is_file() {
        bail!("{} is not a regular file", path.display());
    }
    let mut bytes = Vec::new();
    f.take(max + 1)
        .read_to_end(&mut bytes)
        .with_context(|| format!("reading {}", path.display()))?;
    if bytes.len() as u64 > max {
        bail!("{} is over {max} bytes", path.display());
    }
    Ok(Some(bytes))
}

/// The root of trust of `keys`, any one of which is enough: what a disk
/// with only `trusted-keys`, or `imager install --key`, trusts.
pub fn key_root(keys: &[VerifyingKey]) -> Result<Root> {
    Root::new(1, 1, keys.to_vec()).map_err(|e| anyhow!("the trusted keys: {e}"))
}

/// What a fresh install (`imager install --key K`, the live ISO's
/// installer) trusts a payload by: the root the payload carries when `key`
/// is one of its keys and the root's own threshold signed it (a new disk
/// takes its build's root, whatever its version), else `key` alone as root
/// 1 ([`key_root`]).
pub fn install_root(key: &VerifyingKey, files: &TrustFiles) -> Result<Root> {
    if let Some(bytes) = &files.root {
        let root = Root::parse(bytes)
            .map_err(|e| anyhow!("the payload's {}: {e}; nothing was written", output::ROOT))?;
        let sigs = match &files.root_signatures {
            Some(b) => parse_signatures(b)
                .map_err(|e| anyhow!("{}: {e}; nothing was written", output::ROOT_SIGNATURES))?,
            None => Vec::new(),
        };
        if root.keys.contains(key)
            && root
                .check(&crate::root::root_message(bytes), &sigs, "the root")
                .is_ok()
        {
            return Ok(root);
        }
    }
    key_root(&[*key])
}

/// The root of trust of the disk whose META is `meta` (see the module's
/// documentation).
pub fn disk_root(meta: &Meta) -> Result<Root> {
    if let Some(root) = meta.get(Tag::TrustRoot) {
        return Root::parse(root.as_bytes()).map_err(|e| {
            anyhow!(
                "META's trust root is unusable ({e}): this disk cannot be upgraded (reinstall \
                 it)"
            )
        });
    }
    let keys = parse_trusted_keys(meta.get(Tag::TrustedKeys).unwrap_or_default())?;
    if keys.is_empty() {
        bail!(
            "META names no trusted key and holds no trust root: this disk cannot be upgraded \
             (it was made by an older imager; reinstall it)"
        );
    }
    key_root(&keys)
}

/// A payload [`verify`] accepted.
#[derive(Debug, Clone)]
pub struct Trusted {
    /// The manifest, decoded from the very bytes that were verified.
    pub manifest: Manifest,
    /// The next root the payload brings, accepted by the disk's: it
    /// verified the manifest, and the disk takes it when the payload is
    /// installed (by an upgrade, once blessed).
    pub next_root: Option<Root>,
    /// The keys whose valid signatures were counted, by key id.
    pub signers: Vec<String>,
}

impl Trusted {
    /// The root that verified the payload: the next one, or `current`.
    pub fn root<'a>(&'a self, current: &'a Root) -> &'a Root {
        self.next_root.as_ref().unwrap_or(current)
    }
}

/// The payload `files` checked against the disk's root `current` (see the
/// module's documentation). The errors end in "nothing was written":
/// callers verify before they write.
pub fn verify(current: &Root, files: &TrustFiles) -> Result<Trusted> {
    let next = next_root(current, files)?;
    let root = next.as_ref().unwrap_or(current);
    let mut sigs = match &files.signatures {
        Some(b) => parse_signatures(b)
            .map_err(|e| anyhow!("{}: {e}; nothing was written", output::SIGNATURES))?,
        None => Vec::new(),
    };
    let claimed = claimed_key_id(&files.manifest);
    if let (Some(id), Ok(raw)) = (&claimed, <[u8; 64]>::try_from(&files.signature[..])) {
        sigs.push(SignatureEntry {
            key_id: id.clone(),
            signature: hex::encode(raw),
        });
    }
    let good = root.signers(&files.manifest, &sigs);
    if good.len() < root.threshold {
        let brought = next.as_ref().map(|_| current.version);
        return Err(not_trusted(
            root,
            brought,
            claimed,
            &good,
            files.signature.len(),
        ));
    }
    let manifest = Manifest::parse(&files.manifest)
        .context("the payload's manifest is correctly signed but unusable")?;
    Ok(Trusted {
        manifest,
        next_root: next,
        signers: good.iter().map(key_id).collect(),
    })
}

/// The payload's root when it is the one after `current`; `None` when it
/// brings none or one at or below `current`'s version.
fn next_root(current: &Root, files: &TrustFiles) -> Result<Option<Root>> {
    let Some(bytes) = &files.root else {
        return Ok(None);
    };
    let root = Root::parse(bytes)
        .map_err(|e| anyhow!("the payload's {}: {e}; nothing was written", output::ROOT))?;
    if root.version <= current.version {
        return Ok(None);
    }
    let sigs = match &files.root_signatures {
        Some(b) => parse_signatures(b)
            .map_err(|e| anyhow!("{}: {e}; nothing was written", output::ROOT_SIGNATURES))?,
        None => Vec::new(),
    };
    current.accept_next(bytes, &sigs).map(Some).map_err(|e| {
        anyhow!(
            "the payload brings a root of trust this disk does not accept: {e}; nothing was \
             written"
        )
    })
}

/// Why a manifest (which says `claimed` signed it, with a
/// `manifest.json.sig` of `sig_len` bytes) is not trusted by `root` (the
/// disk's, or the one the payload brings, accepted by the disk's root of
/// version `brought`), whose keys `good` signed it validly, too few.
fn not_trusted(
    root: &Root,
    brought: Option<u64>,
    claimed: Option<String>,
    good: &[VerifyingKey],
    sig_len: usize,
) -> anyhow::Error {
    let ids: Vec<String> = root.keys.iter().map(key_id).collect();
    let what = match brought {
        Some(disk) => format!(
            "{} key(s) of the root of trust it brings (version {}, accepted by this disk's root \
             {disk}: {})",
            root.threshold,
            root.version,
            ids.join(", ")
        ),
        None if root.threshold == 1 => format!("a key this disk trusts ({})", ids.join(", ")),
        None => format!(
            "{} keys of this disk's root of trust (version {}: {})",
            root.threshold,
            root.version,
            ids.join(", ")
        ),
    };
    let why = if !good.is_empty() {
        let named: Vec<String> = good.iter().map(key_id).collect();
        format!(
            "it carries {} valid signature(s) ({}): add signatures by the root's other keys \
             (`imager sign --add`)",
            good.len(),
            named.join(", ")
        )
    } else {
        match claimed {
            Some(k) if !ids.contains(&k) => format!(
                "it says it is signed by {k}; build the installer with the key the disk \
                 trusts (imager build --key), or install the disk afresh with `imager install \
                 --key` for the new key"
            ),
            _ if sig_len != 64 => format!(
                "its signature {} is {sig_len} bytes, not a raw 64-byte ed25519 signature",
                paths::PAYLOAD_SIGNATURE
            ),
            _ => "its signature does not verify: the payload was modified or damaged".to_string(),
        }
    };
    anyhow!("the installer's payload is not signed by {what}: {why}; nothing was written")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::artifact::{Artifact, Kind};
    use crate::root::{add_signature, entry, root_message};
    use ed25519_dalek::{Signer, SigningKey};

    fn key(seed: u8) -> SigningKey {
        SigningKey::from_bytes(&[seed; 32])
    }

    /// A payload's trust files: its manifest signed by `signers` (the
    /// first one's signature as `manifest.json.sig`, the others' in
    /// `manifest.json.sigs`), and `root` with the signatures of
    /// `root_signers`, when given.
    fn payload(signers: &[&SigningKey], root: Option<(&Root, &[&SigningKey])>) -> TrustFiles {
        let m = Manifest {
            key_id: key_id(&signers[0].verifying_key()),
            ..Manifest::new(
                "os",
                "2.0",
                "installer",
                0,
                vec![Artifact {
                    kind: Kind::Kernel,
                    path: "vmlinuz".into(),
                    sha256: "a".repeat(64),
                    size: 42,
                }],
            )
        };
        let bytes = m.to_bytes().unwrap();
        let list = |message: &[u8], keys: &[&SigningKey]| {
            keys.iter().fold(b"[]".to_vec(), |list, k| {
                let e = entry(&k.verifying_key(), &k.sign(message));
                add_signature(&parse_signatures(&list).unwrap(), e)
            })
        };
        let (root, root_signatures) = match root {
            Some((r, keys)) => {
                let b = r.to_bytes();
                let sigs = list(&root_message(&b), keys);
                (Some(b), Some(sigs))
            }
            None => (None, None),
        };
        TrustFiles {
            signature: signers[0].sign(&bytes).to_bytes().to_vec(),
            signatures: Some(list(&bytes, &signers[1..])),
            manifest: bytes,
            root,
            root_signatures,
        }
    }

    #[test]
    fn a_payload_rotates_the_root_and_then_the_retired_key_is_refused() {
        let (a, b, c) = (key(1), key(2), key(3));
        let root1 = Root::new(1, 1, vec![a.verifying_key(), b.verifying_key()]).unwrap();
        let root2 = Root::new(2, 2, vec![b.verifying_key(), c.verifying_key()]).unwrap();
        let bring = |signers: &[&SigningKey]| payload(signers, Some((&root2, &[&a, &b, &c])));

        // Under root 1, A alone is enough.
        let t = verify(&root1, &payload(&[&a], None)).unwrap();
        assert!(t.next_root.is_none());
        assert_eq!(t.signers, [key_id(&a.verifying_key())]);
        // The payload that brings root 2 is verified by root 2: B and C.
        let t = verify(&root1, &bring(&[&b, &c])).unwrap();
        assert_eq!(t.next_root.as_ref(), Some(&root2));
        assert_eq!(t.root(&root1), &root2);
        let e = format!("{:#}", verify(&root1, &bring(&[&a])).unwrap_err());
        assert!(
            e.contains(
                "is not signed by 2 key(s) of the root of trust it brings (version 2, accepted \
                 by this disk's root 1"
            ) && e.contains(&format!(
                "it says it is signed by {}",
                key_id(&a.verifying_key())
            )),
            "{e}"
        );
        // Root 2 signed by C alone: root 1 did not approve it.
        let unapproved = payload(&[&b, &c], Some((&root2, &[&b, &c][1..])));
        let e = format!("{:#}", verify(&root1, &unapproved).unwrap_err());
        assert!(
            e.contains("brings a root of trust this disk does not accept")
                && e.contains("signed by the root it replaces"),
            "{e}"
        );

        // Once root 2 is the disk's: A alone is refused, B alone is short
        // of the threshold, B and C pass; root 2 brought again is not new.
        let e = format!("{:#}", verify(&root2, &payload(&[&a], None)).unwrap_err());
        assert!(e.ends_with("nothing was written"), "{e}");
        let e = format!("{:#}", verify(&root2, &payload(&[&b], None)).unwrap_err());
        assert!(
            e.contains(&format!(
                "it carries 1 valid signature(s) ({}): add signatures",
                key_id(&b.verifying_key())
            )),
            "{e}"
        );
        // A signature twice, or by a stranger, counts once or not at all.
        let twice = payload(&[&b, &b, &key(9)], None);
        let e = format!("{:#}", verify(&root2, &twice).unwrap_err());
        assert!(e.contains("it carries 1 valid signature(s)"), "{e}");
        let t = verify(&root2, &bring(&[&c, &b])).unwrap();
        assert!(t.next_root.is_none());
        assert_eq!(t.signers.len(), 2);
        // An older payload's root 1 is not applied either.
        let old = payload(&[&b, &c], Some((&root1, &[&a])));
        assert!(verify(&root2, &old).unwrap().next_root.is_none());
        // A root two versions ahead is refused: roots go one at a time.
        let root3 = Root::new(3, 1, vec![c.verifying_key()]).unwrap();
        let e = format!(
            "{:#}",
            verify(&root1, &payload(&[&c], Some((&root3, &[&a, &c])))).unwrap_err()
        );
        assert!(e.contains("roots go up one version at a time"), "{e}");
    }

    /// A fresh install by key A takes the payload's root when A is in it
    /// and the root signed itself (root 3 here: an install never climbs
    /// from root 1), else A alone.
    #[test]
    fn an_install_takes_the_payloads_own_root_when_its_key_is_in_it() {
        let (a, b, c) = (key(1), key(2), key(3));
        let root3 = Root::new(3, 2, vec![a.verifying_key(), b.verifying_key()]).unwrap();
        let signed = payload(&[&a, &b], Some((&root3, &[&a, &b])));
        let r = install_root(&a.verifying_key(), &signed).unwrap();
        assert_eq!(r, root3);
        assert!(verify(&r, &signed).unwrap().next_root.is_none());
        // Not self-signed to its threshold, or without the key: A alone.
        let half = payload(&[&a, &b], Some((&root3, &[&a])));
        assert_eq!(
            install_root(&a.verifying_key(), &half).unwrap(),
            key_root(&[a.verifying_key()]).unwrap()
        );
        let other = payload(&[&a, &b], Some((&root3, &[&a, &b])));
        assert_eq!(
            install_root(&c.verifying_key(), &other).unwrap(),
            key_root(&[c.verifying_key()]).unwrap()
        );
    }

    #[test]
    fn a_disk_root_is_metas_root_or_its_trusted_keys() {
        use ed25519_dalek::pkcs8::EncodePublicKey;
        use ed25519_dalek::pkcs8::spki::der::pem::LineEnding;
        let (a, b) = (key(1), key(2));
        let mut m = Meta::default();
        let e = format!("{:#}", disk_root(&m).unwrap_err());
        assert!(e.contains("names no trusted key"), "{e}");
        let pem = |k: &SigningKey| k.verifying_key().to_public_key_pem(LineEnding::LF).unwrap();
        m.set(Tag::TrustedKeys, format!("{}{}", pem(&a), pem(&b)));
        assert_eq!(
            disk_root(&m).unwrap(),
            Root::new(1, 1, vec![a.verifying_key(), b.verifying_key()]).unwrap()
        );
        let root = Root::new(4, 2, vec![a.verifying_key(), b.verifying_key()]).unwrap();
        m.set(Tag::TrustRoot, root.to_bytes());
        assert_eq!(disk_root(&m).unwrap(), root);
        m.set(Tag::TrustRoot, "{}");
        let e = format!("{:#}", disk_root(&m).unwrap_err());
        assert!(e.contains("META's trust root is unusable"), "{e}");
    }

    #[test]
    fn trust_files_are_read_bounded_and_regular() {
        let dir = std::env::temp_dir().join(format!("trust-files-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let e = format!("{:#}", TrustFiles::read_dir(&dir).unwrap_err());
        assert!(e.contains("manifest.json is missing"), "{e}");
        std::fs::write(dir.join(paths::PAYLOAD_MANIFEST), b"m").unwrap();
        std::fs::write(dir.join(paths::PAYLOAD_SIGNATURE), b"s").unwrap();
        std::fs::write(dir.join(output::ROOT), b"r").unwrap();
        let f = TrustFiles::read_dir(&dir).unwrap();
        assert_eq!(
            (f.manifest, f.signature, f.root, f.signatures),
            (b"m".to_vec(), b"s".to_vec(), Some(b"r".to_vec()), None)
        );
        let big = std::fs::File::create(dir.join(output::SIGNATURES)).unwrap();
        big.set_len(MAX_TRUST_FILE + 1).unwrap();
        let e = format!("{:#}", TrustFiles::read_dir(&dir).unwrap_err());
        assert!(e.contains("is over 1048576 bytes"), "{e}");
        std::fs::remove_file(dir.join(output::SIGNATURES)).unwrap();
        let fifo = std::ffi::CString::new(
            dir.join(output::ROOT_SIGNATURES)
                .into_os_string()
                .into_encoded_bytes(),
        )
        .unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        let e = format!("{:#}", TrustFiles::read_dir(&dir).unwrap_err());
        assert!(e.contains("is not a regular file"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
