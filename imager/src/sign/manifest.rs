//! The signed manifest: what a build produced, with sizes and digests.
//!
//! The format ([`Manifest`], [`Boot`], the path and digest checks) is the
//! `payload` crate's; what needs files and a signer is here.

use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};

use super::keys::Signer;
use super::trust::Signing;
use crate::artifact::{Artifact, Kind};
use crate::io::{sha256_file, write_atomic};
use contract::paths::output;
use payload::manifest::{MANIFEST_NAME, Manifest, SIGNATURE_NAME, check_path};

/// Describes the file `dir/path` as an artifact, hashing it (streamed).
pub fn describe(dir: &Path, kind: Kind, path: &str) -> Result<Artifact> {
    check_path(path).map_err(|reason| anyhow::anyhow!("artifact {path}: {reason}"))?;
    let (sha256, size) = sha256_file(&dir.join(path))?;
    Ok(Artifact {
        kind,
        path: path.to_string(),
        sha256,
        size,
    })
}

/// The signature file of a manifest: its path with `.sig` appended.
pub fn signature_path(manifest: &Path) -> PathBuf {
    let mut s = manifest.as_os_str().to_os_string();
    s.push(".sig");
    PathBuf::from(s)
}

fn sync_dir(dir: &Path) -> Result<()> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("flushing directory {}", dir.display()))
}

/// Signs `manifest` with `signer` and writes `dir/manifest.json` and the raw
/// 64-byte detached signature `dir/manifest.json.sig`. `key_id` is set to the
/// signer's; artifacts are sorted; every artifact must exist in `dir` with
/// the listed size (digests are trusted: they were computed while writing).
///
/// Order, so that no crash leaves a manifest that looks finished but is not:
/// 1. remove an old `manifest.json` (the directory is now "not signed");
/// 2. write the signature atomically, flush the directory;
/// 3. write `manifest.json` atomically, flush the directory.
///
/// `manifest.json` is the commit point: whenever it exists, the signature
/// written with it exists too. A crash leaves either no manifest (incomplete,
/// rebuild) or the complete pair; never a new manifest with an old signature.
pub fn write_signed_manifest(
    dir: &Path,
    manifest: &Manifest,
    signer: &dyn Signer,
) -> Result<(PathBuf, PathBuf)> {
    let signing = Signing {
        signer,
        cosigners: &[],
        root: None,
    };
    write_signed_manifest_with(dir, manifest, &signing)
}

/// [`write_signed_manifest`] by `signing`: the key's signature, and the
/// trust files ([`contract::paths::PAYLOAD_TRUST_FILES`]) written before
/// `manifest.json` too, each replaced or (when there is none this time)
/// removed: the co-signers' `manifest.json.sigs`, the root and its
/// signatures.
pub fn write_signed_manifest_with(
    dir: &Path,
    manifest: &Manifest,
    signing: &Signing,
) -> Result<(PathBuf, PathBuf)> {
    let signer = signing.signer;
    let mut m = manifest.clone();
    m.key_id = signer.key_id();
    let bytes = m.to_bytes()?;

    let mut problems = Vec::new();
    for a in &m.artifacts {
        match std::fs::metadata(dir.join(&a.path)) {
            Ok(meta) if !meta.is_file() => problems.push(format!("{}: not a regular file", a.path)),
            Ok(meta) if meta.len() != a.size => problems.push(format!(
                "{}: listed with {} bytes but the file has {}",
                a.path,
                a.size,
                meta.len()
            )),
            Ok(_) => {}
            Err(e) => problems.push(format!("{}: {e}", a.path)),
        }
    }
    if !problems.is_empty() {
        bail!(
            "not signing a manifest that does not match {}:\n  {}",
            dir.display(),
            problems.join("\n  ")
        );
    }

    let signature = signer.sign(&bytes).context("signing the manifest")?;
    // A faulty signer (or hardware token) must not produce an unverifiable pair.
    signer
        .public_key()
        .verify_strict(&bytes, &signature)
        .context("the signer produced a signature that does not verify with its own public key")?;

    let cosigned = super::trust::cosign(&bytes, signing.cosigners)?;

    let manifest_path = dir.join(MANIFEST_NAME);
    let sig_path = dir.join(SIGNATURE_NAME);
    match std::fs::remove_file(&manifest_path) {
        Ok(()) => sync_dir(dir)?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(e).with_context(|| format!("removing the old {}", manifest_path.display()));
        }
    }
    write_atomic(&sig_path, &signature.to_bytes(), 0o644)?;
    let trust = [
        (output::SIGNATURES, cosigned),
        (output::ROOT, signing.root.map(|r| r.bytes.clone())),
        (
            output::ROOT_SIGNATURES,
            signing.root.and_then(|r| r.signatures.clone()),
        ),
    ];
    for (name, bytes) in trust {
        let path = dir.join(name);
        match bytes {
            Some(b) => {
                write_atomic(&path, &b, 0o644)?;
            }
            None => match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(e).with_context(|| format!("removing the old {}", path.display()));
                }
            },
        }
    }
    sync_dir(dir)?;
    write_atomic(&manifest_path, &bytes, 0o644)?;
    sync_dir(dir)?;
    Ok((manifest_path, sig_path))
}
