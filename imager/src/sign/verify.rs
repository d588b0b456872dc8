//! Verification of a signed manifest and of the artifacts it lists.

use anyhow::{Context, Result, bail};
use ed25519_dalek::{Signature, VerifyingKey};
use serde::Serialize;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use super::manifest::signature_path;
use crate::artifact::Kind;
use crate::io::sha256_file;
use payload::keys::key_id;
use payload::manifest::{MANIFEST_NAME, Manifest, check_digest, check_path};
use payload::root::Root;
use payload::trust::{TrustFiles, Trusted};
use payload::verify::check_signed;

/// A manifest is a small JSON file; anything larger is not one.
const MAX_MANIFEST: u64 = 64 * 1024 * 1024;

/// The outcome of checking one artifact.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "status", rename_all = "kebab-case")]
pub enum Status {
    Ok,
    Missing,
    NotAFile,
    /// The manifest entry itself is unacceptable (unsafe path, bad digest,
    /// listed twice); the file is not opened.
    Invalid {
        reason: String,
    },
    SizeDiffers {
        manifest: u64,
        file: u64,
    },
    DigestDiffers {
        manifest: String,
        file: String,
    },
    Unreadable {
        error: String,
    },
    /// The file is the one signed, but not sound: a raw disk whose partition
    /// table is not one imager makes (overlapping, out of order, off the
    /// disk; see [`crate::disk::check_table`]). A build never signs one;
    /// an older or foreign tool might have.
    BadContent {
        reason: String,
    },
}

/// One artifact of the manifest and what verification found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ArtifactCheck {
    pub path: String,
    pub kind: Kind,
    #[serde(flatten)]
    pub status: Status,
}

impl ArtifactCheck {
    pub fn is_ok(&self) -> bool {
        self.status == Status::Ok
    }

    /// `ok  raw disk.raw` or `BAD kernel vmlinuz: sha256 differs (...)`.
    pub fn line(&self) -> String {
        let (kind, path) = (self.kind.name(), &self.path);
        let why = match &self.status {
            Status::Ok => return format!("ok  {kind} {path}"),
            Status::Missing => "missing".to_string(),
            Status::NotAFile => "not a regular file".to_string(),
            Status::Invalid { reason } => reason.clone(),
            Status::SizeDiffers { manifest, file } => {
                format!("size differs (manifest {manifest} bytes, file {file} bytes)")
            }
            Status::DigestDiffers { manifest, file } => format!(
                "sha256 differs (manifest {}, file {})",
                abbrev(manifest),
                abbrev(file)
            ),
            Status::Unreadable { error } => format!("unreadable: {error}"),
            Status::BadContent { reason } => reason.clone(),
        };
        format!("BAD {kind} {path}: {why}")
    }
}

fn abbrev(digest: &str) -> String {
    match digest.get(..12) {
        Some(head) if digest.len() > 12 => format!("{head}…"),
        _ => digest.to_string(),
    }
}

/// What [`verify`] found: the signature verified, and each artifact's status.
/// The artifacts may still be bad: check [`VerifyReport::ok`] or call
/// [`VerifyReport::ensure_ok`].
#[must_use = "a report may list bad artifacts: check `ok` or call `ensure_ok()`"]
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VerifyReport {
    /// The manifest file verified.
    pub manifest: String,
    /// True when every artifact is ok.
    pub ok: bool,
    /// The number of artifacts that are not ok.
    pub problems: usize,
    /// The key that signed the manifest (the trusted key); for a payload
    /// checked against a root of trust, the keys whose signatures counted,
    /// `, `-separated.
    pub key_id: String,
    pub name: String,
    pub version: String,
    pub profile: String,
    pub source_date_epoch: u64,
    pub artifacts: Vec<ArtifactCheck>,
    /// The manifest parsed from the very bytes whose signature verified
    /// (never read again from the file, which may have changed since).
    #[serde(skip)]
    pub verified: Manifest,
}

impl VerifyReport {
    /// An error listing every bad artifact, or `Ok` when all are ok.
    pub fn ensure_ok(&self) -> Result<()> {
        if self.ok {
            return Ok(());
        }
        let lines: Vec<String> = self
            .artifacts
            .iter()
            .filter(|a| !a.is_ok())
            .map(ArtifactCheck::line)
            .collect();
        bail!(
            "{}: {} of {} artifacts do not match:\n  {}",
            self.manifest,
            self.problems,
            self.artifacts.len(),
            lines.join("\n  ")
        )
    }
}

/// Verifies `manifest_path` (a `manifest.json`, or a directory containing
/// one) against the trusted `public_key`.
///
/// Errors when the manifest cannot be trusted at all: signature missing or
/// not 64 bytes, signature not verifying (key mismatch or modification),
/// not a format-1 manifest. Otherwise checks every artifact (path safety,
/// existence, size, streamed SHA-256) and reports all of them.
pub fn verify(manifest_path: &Path, public_key: &VerifyingKey) -> Result<VerifyReport> {
    verify_artifacts(manifest_path, public_key, &|_| true)
}

/// What an install or an upgrade reads from a payload directory: the
/// manifest (a `manifest.json`, or a directory holding one) trusted by the
/// disk's `root` with the trust files beside it ([`payload::trust`]), and
/// every artifact but the images made for machines (disks, the ISO, the
/// installer archive, [`Kind::is_image`]), which it never reads and which
/// would cost a hash of 2 GiB or more. Their entries are left out of the
/// report; the signatures still cover them.
pub fn verify_payload(manifest_path: &Path, root: &Root) -> Result<(VerifyReport, Trusted)> {
    let manifest_path = manifest_file(manifest_path);
    let trusted = payload::trust::verify(root, &TrustFiles::read_dir(dir_of(&manifest_path))?)?;
    let report = report(
        &manifest_path,
        trusted.signers.join(", "),
        trusted.manifest.clone(),
        &|k| !k.is_image(),
    );
    Ok((report, trusted))
}

/// `path`, or the manifest in it when it is a directory.
fn manifest_file(path: &Path) -> PathBuf {
    if path.is_dir() {
        path.join(MANIFEST_NAME)
    } else {
        path.to_path_buf()
    }
}

/// The directory of a manifest's artifacts: the manifest's own.
fn dir_of(manifest_path: &Path) -> &Path {
    manifest_path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

fn verify_artifacts(
    manifest_path: &Path,
    public_key: &VerifyingKey,
    wanted: &dyn Fn(Kind) -> bool,
) -> Result<VerifyReport> {
    let manifest_path = manifest_file(manifest_path);
    let bytes = read_manifest(&manifest_path)?;
    let sig_path = signature_path(&manifest_path);
    let signature = read_signature(&sig_path, &manifest_path)?;
    let manifest = check_signed(
        &bytes,
        &signature,
        public_key,
        &manifest_path.display().to_string(),
        &sig_path.display().to_string(),
    )?;
    Ok(report(&manifest_path, key_id(public_key), manifest, wanted))
}

/// The report on the artifacts of the verified `manifest` (at
/// `manifest_path`, signed by `signed_by`) that are `wanted`.
fn report(
    manifest_path: &Path,
    signed_by: String,
    manifest: Manifest,
    wanted: &dyn Fn(Kind) -> bool,
) -> VerifyReport {
    let dir = dir_of(manifest_path);
    let mut seen = BTreeSet::new();
    let artifacts: Vec<ArtifactCheck> = manifest
        .artifacts
        .iter()
        .filter(|a| wanted(a.kind))
        .map(|a| {
            let status = if let Err(reason) = check_path(&a.path) {
                Status::Invalid { reason }
            } else if !seen.insert(a.path.clone()) {
                Status::Invalid {
                    reason: "listed twice".to_string(),
                }
            } else if let Err(reason) = check_digest(&a.sha256) {
                Status::Invalid { reason }
            } else {
                check_file(&dir.join(&a.path), a.size, &a.sha256, a.kind)
            };
            ArtifactCheck {
                path: a.path.clone(),
                kind: a.kind,
                status,
            }
        })
        .collect();
    let problems = artifacts.iter().filter(|a| !a.is_ok()).count();
    VerifyReport {
        manifest: manifest_path.display().to_string(),
        ok: problems == 0,
        problems,
        key_id: signed_by,
        name: manifest.name.clone(),
        version: manifest.version.clone(),
        profile: manifest.profile.clone(),
        source_date_epoch: manifest.source_date_epoch,
        artifacts,
        verified: manifest,
    }
}

/// The detached signature `sig_path` of `manifest_path`: a raw 64-byte
/// ed25519 signature.
fn read_signature(sig_path: &Path, manifest_path: &Path) -> Result<Signature> {
    let sig_bytes = match std::fs::read(sig_path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => bail!(
            "signature {} is missing: {} is not signed",
            sig_path.display(),
            manifest_path.display()
        ),
        Err(e) => {
            return Err(e).with_context(|| format!("reading signature {}", sig_path.display()));
        }
    };
    let sig_raw: [u8; 64] = sig_bytes.as_slice().try_into().map_err(|_| {
        anyhow::anyhow!(
            "signature {} is {} bytes, expected a raw 64-byte ed25519 signature",
            sig_path.display(),
            sig_bytes.len()
        )
    })?;
    Ok(Signature::from_bytes(&sig_raw))
}

fn read_manifest(path: &Path) -> Result<Vec<u8>> {
    let meta =
        std::fs::metadata(path).with_context(|| format!("reading manifest {}", path.display()))?;
    if !meta.is_file() {
        bail!("{} is not a manifest file", path.display());
    }
    if meta.len() > MAX_MANIFEST {
        bail!(
            "{} is {} bytes: too large to be a manifest",
            path.display(),
            meta.len()
        );
    }
    std::fs::read(path).with_context(|| format!("reading manifest {}", path.display()))
}

/// Checks the file of one artifact: its size, its digest, and for a disk
/// in any format ([`Kind::is_disk`]: the raw disk, or the disk its VHD,
/// qcow2, compressed stream or platform image holds) its partition table.
fn check_file(path: &Path, size: u64, sha256: &str, kind: Kind) -> Status {
    let disk = kind.is_disk();
    match check_bytes(path, size, sha256) {
        Status::Ok if disk => match crate::disk::check_image(path) {
            Ok(()) => Status::Ok,
            Err(e) => Status::BadContent {
                reason: format!("partition table: {e:#}"),
            },
        },
        status => status,
    }
}

/// Checks the size and digest of the file `path`.
fn check_bytes(path: &Path, size: u64, sha256: &str) -> Status {
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Status::Missing,
        Err(e) => {
            return Status::Unreadable {
                error: e.to_string(),
            };
        }
    };
    if !meta.is_file() {
        return Status::NotAFile;
    }
    if meta.len() != size {
        // Not worth hashing gigabytes to say what the size already says.
        return Status::SizeDiffers {
            manifest: size,
            file: meta.len(),
        };
    }
    match sha256_file(path) {
        // The file may have changed since the stat: judge what was hashed.
        Ok((_, read)) if read != size => Status::SizeDiffers {
            manifest: size,
            file: read,
        },
        Ok((digest, _)) if digest != sha256 => Status::DigestDiffers {
            manifest: sha256.to_string(),
            file: digest,
        },
        Ok(_) => Status::Ok,
        Err(e) => Status::Unreadable {
            error: format!("{e:#}"),
        },
    }
}
