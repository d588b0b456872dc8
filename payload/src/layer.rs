//! The layers of an installer image, read as streams (docs/design.md,
//! "The installer image"): the first holds only the payload's signed
//! manifest, its signature and its trust files ([`signed_manifest`]); the
//! second the
//! payload's files, of which [`stage_files`] takes those a slot needs
//! ([`slot_files`]), each checked against its signed size and digest while
//! it is written. Both read their layer to its end, so that a reader that
//! verifies the layer's digest at its end (`registry::Client::blob`) has
//! verified it when they return. Untrusted bytes: every read is bounded
//! (the tar headers by [`crate::targuard`]),
//! nothing but regular files and directories is accepted, and nothing
//! panics (fuzz target `installer_layer`).

use crate::artifact::{Artifact, Kind};
use crate::manifest::{Manifest, check_path};
use crate::targuard::TarGuard;
use crate::trust::TrustFiles;
use anyhow::{Context, Result, bail, ensure};
use contract::paths;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::io::{Read, Write};

/// The most bytes of the signed manifest or its signature read.
pub const MAX_SMALL: u64 = 1 << 20;
/// The layers of an installer image: the signed manifest's, then the
/// payload's.
pub const MANIFEST_LAYER: usize = 0;
pub const PAYLOAD_LAYER: usize = 1;
/// The most layers an installer image may have.
pub const MAX_LAYERS: usize = 8;
/// The layer media type read from a registry: uncompressed tar, as imager
/// writes it and `skopeo copy --preserve-digests` keeps it.
pub const LAYER_TAR: &str = "application/vnd.oci.image.layer.v1.tar";

/// A file of the payload written by [`stage_files`]: its SHA-256 (hex) and
/// length, both the signed ones.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StagedFile {
    pub sha256: String,
    pub len: u64,
}

/// The payload's signed manifest, its signature and its trust files
/// ([`TrustFiles`]) from the first layer of the installer image of `arch`
/// (its payload directory, [`paths::installer_payload_dir`]): a tar that
/// holds them and nothing else but directories, each at most [`MAX_SMALL`]
/// bytes.
pub fn signed_manifest(blob: impl Read, arch: contract::Arch) -> Result<TrustFiles> {
    let dir = paths::installer_payload_dir(arch);
    let manifest_path = format!("{dir}/{}", paths::PAYLOAD_MANIFEST);
    let sig_path = format!("{dir}/{}", paths::PAYLOAD_SIGNATURE);
    let mut archive = tar::Archive::new(TarGuard::new(blob));
    let (mut manifest, mut signature) = (None, None);
    let mut files = TrustFiles::default();
    for entry in archive.entries().context("reading the first layer")? {
        let mut e = entry.context("reading the first layer")?;
        let path = entry_path(&e)?;
        match e.header().entry_type() {
            tar::EntryType::Directory => continue,
            tar::EntryType::Regular => {}
            t => bail!(
                "the first layer has {} of type {t:?}: only regular files",
                contract::text::excerpt(&path)
            ),
        }
        let name = path
            .strip_prefix(dir.as_str())
            .and_then(|p| p.strip_prefix('/'))
            .unwrap_or_default();
        let slot = if path == manifest_path {
            &mut manifest
        } else if path == sig_path {
            &mut signature
        } else if let Some(slot) = files.slot(name) {
            slot
        } else {
            bail!(
                "the first layer holds {}: it must hold only the signed manifest and its trust \
                 files",
                contract::text::excerpt(&path)
            );
        };
        let mut bytes = Vec::new();
        (&mut e).take(MAX_SMALL + 1).read_to_end(&mut bytes)?;
        ensure!(
            bytes.len() as u64 <= MAX_SMALL,
            "{path} is over {MAX_SMALL} bytes"
        );
        ensure!(slot.is_none(), "{path} is in the first layer twice");
        *slot = Some(bytes);
    }
    // The layer's digest is checked at its end: reach it.
    drain(archive.into_inner())?;
    match (manifest, signature) {
        (Some(m), Some(s)) => {
            files.manifest = m;
            files.signature = s;
            Ok(files)
        }
        _ => bail!("the first layer lacks {manifest_path} or {sig_path}"),
    }
}

/// Reads what is left of a blob: its digest is verified at the end.
fn drain(mut r: impl Read) -> Result<()> {
    std::io::copy(&mut r, &mut std::io::sink()).context("reading the layer to its end")?;
    Ok(())
}

fn entry_path<R: Read>(e: &tar::Entry<R>) -> Result<String> {
    let raw = e.path_bytes();
    let text = std::str::from_utf8(&raw).context("a layer entry's name is not UTF-8")?;
    let t = text.trim_start_matches("./").trim_end_matches('/');
    ensure!(
        t.len() <= 255 && !t.split('/').any(|c| c == ".." || c.is_empty()),
        "a layer entry's name is not a plain relative path"
    );
    Ok(t.to_string())
}

/// The most bytes of the db certificate a Secure Boot payload carries.
pub const MAX_DB_CERT: u64 = 64 * 1024;

/// The files a slot needs, by name in the payload directory: the kernel,
/// the initramfs, the slots' UKIs, and for a Secure Boot payload the db
/// certificate they are signed for (at most [`MAX_DB_CERT`] bytes, read
/// whole), its Secure Boot updates and its signed boot loader (which
/// replaces the ESP's when it differs).
pub fn slot_files(m: &Manifest) -> Result<Vec<(String, Artifact)>> {
    let secure_boot = m.artifacts.iter().any(|a| a.kind == Kind::SecureBootDb);
    let mut out = Vec::new();
    for a in &m.artifacts {
        if a.kind == Kind::SecureBootDb {
            ensure!(
                a.size <= MAX_DB_CERT,
                "the payload's db certificate is {} bytes: a certificate is a few KiB",
                a.size
            );
        }
        if a.kind == Kind::SecureBootUpdate {
            ensure!(
                a.size <= crate::efivar::MAX_LEN as u64,
                "the payload's {} is {} bytes, more than {}",
                contract::text::escape(&a.path),
                a.size,
                crate::efivar::MAX_LEN
            );
        }
        if matches!(
            a.kind,
            Kind::Kernel
                | Kind::Initramfs
                | Kind::Uki
                | Kind::SecureBootDb
                | Kind::SecureBootUpdate
        ) || (secure_boot && a.kind == Kind::BootLoader)
        {
            check_path(&a.path).map_err(|e| anyhow::anyhow!("{}: {e}", a.path))?;
            ensure!(
                !a.path.contains('/'),
                "{}: payload files are directly in the payload directory",
                a.path
            );
            out.push((a.path.clone(), a.clone()));
        }
    }
    Ok(out)
}

/// Streams the payload layer: each file of `wanted` (by name in the
/// payload directory) goes to the writer `open` gives for its name while it
/// is hashed, and must be its signed size and digest (a file longer than
/// signed is refused as soon as it is); other entries are skipped, a
/// wanted file twice or not a regular file is refused. Returns what was
/// written, by name; the caller checks that nothing wanted is missing.
pub fn stage_files(
    blob: impl Read,
    arch: contract::Arch,
    wanted: &[(String, Artifact)],
    open: &mut dyn FnMut(&str) -> Result<Box<dyn Write>>,
) -> Result<BTreeMap<String, StagedFile>> {
    let dir = paths::installer_payload_dir(arch);
    let mut staged = BTreeMap::new();
    let mut archive = tar::Archive::new(TarGuard::new(blob));
    for entry in archive.entries().context("reading the payload layer")? {
        let mut e = entry.context("reading the payload layer")?;
        let path = entry_path(&e)?;
        let Some(name) = path
            .strip_prefix(dir.as_str())
            .and_then(|p| p.strip_prefix('/'))
        else {
            continue;
        };
        let Some((_, a)) = wanted.iter().find(|(n, _)| n == name) else {
            continue;
        };
        ensure!(
            e.header().entry_type() == tar::EntryType::Regular,
            "{path} in the payload layer is not a regular file"
        );
        ensure!(
            !staged.contains_key(name),
            "{path} is in the payload layer twice"
        );
        // Refused at its header, before any of it is read or written.
        let claimed = e.header().entry_size().unwrap_or(u64::MAX);
        ensure!(
            claimed == a.size,
            "{path} is {claimed} bytes in the image but the signed manifest says {}",
            a.size
        );
        let mut out = open(name)?;
        let mut hash = Sha256::new();
        let mut buf = vec![0u8; 1 << 16];
        let mut len = 0u64;
        loop {
            let n = e
                .read(&mut buf)
                .with_context(|| format!("reading {path}"))?;
            if n == 0 {
                break;
            }
            len += n as u64;
            ensure!(
                len <= a.size,
                "{path} is longer than the {} bytes its signed manifest says",
                a.size
            );
            hash.update(&buf[..n]);
            out.write_all(&buf[..n])
                .with_context(|| format!("writing {name}"))?;
        }
        out.flush().with_context(|| format!("writing {name}"))?;
        let sha = hex::encode(hash.finalize());
        ensure!(
            len == a.size && sha == a.sha256,
            "{path} is not the signed file ({len} bytes, sha256 {sha}; signed: {} bytes, {}): \
             the image was changed",
            a.size,
            a.sha256
        );
        staged.insert(name.to_string(), StagedFile { sha256: sha, len });
    }
    drain(archive.into_inner())?;
    Ok(staged)
}
