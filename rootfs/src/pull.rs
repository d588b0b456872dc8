//! The node's own upgrade (docs/node-api.md, "Upgrades over the API"):
//! the installer image pulled from its registry, never held in memory and
//! never run, its payload verified before anything is written to the disk.
//!
//! 1. The image manifest (bounded; checked against the reference's digest
//!    when it names one); its first layer must hold only the payload's
//!    signed manifest and signature (`usr/install/amd64/manifest.json` and
//!    `.sig`, each bounded), which are verified against META's trusted keys,
//!    and the manifest's name against META's image name, before any other
//!    layer is read.
//! 2. The second layer is streamed: each file the signed manifest lists for
//!    a slot (kernel, initramfs, the slots' UKIs) is written into the
//!    staging directory on EPHEMERAL while it is hashed, and must be
//!    exactly the signed size and digest; other files are skipped. The
//!    layer is read to its end, which verifies its digest
//!    ([`registry::Client::blob`]).
//! 3. Only then is the disk written, by [`bootstate::ops::upgrade`] as
//!    `imager upgrade` writes it (files read back against the signed
//!    digests, META's intent, the switch with boot counting).
//!
//! A cut connection, a tampered layer or a refusal before step 3 leaves
//! the slots as they were (the staging directory is emptied at the next
//! pull).

use anyhow::{Context, Result, bail, ensure};
use bootstate::ops::{Payload, PayloadFile, SlotUkis};
use contract::Slot;
use contract::meta::{Meta, Tag};
use contract::paths::{self, INSTALLER_PAYLOAD_DIR};
use payload::artifact::Kind;
use payload::manifest::Manifest;
use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

/// Where a pulled payload is staged: on EPHEMERAL, never in memory.
pub const STAGING_DIR: &str = "/var/lib/machined/upgrade";
/// The most bytes of the signed manifest or its signature read.
const MAX_SMALL: u64 = 1 << 20;
/// The layers of an installer image: the signed manifest's, then the
/// payload's (`imager::oci`, docs/design.md "The installer image").
const MANIFEST_LAYER: usize = 0;
const PAYLOAD_LAYER: usize = 1;
const MAX_LAYERS: usize = 8;
/// The only layer media type read: uncompressed tar, as imager writes it
/// and `skopeo copy --preserve-digests` keeps it.
const LAYER_TAR: &str = "application/vnd.oci.image.layer.v1.tar";

/// What a pull is asked for.
pub struct Pull<'a> {
    pub image: &'a str,
    /// Registries reached over plain HTTP (`machined.plain_http=`).
    pub plain_http: Vec<String>,
}

/// A verified payload, staged on EPHEMERAL.
pub struct Staged {
    pub payload: Payload,
    pub key_id: String,
    /// The image manifest's digest.
    pub digest: String,
    /// The payload's SOURCE_DATE_EPOCH (the date of the files on BOOT).
    pub epoch: u64,
}

/// Pulls and verifies the installer image of `pull` against `meta`
/// (trusted keys, image name), staging its payload in `staging`; `say`
/// gets each step.
pub fn pull(
    pull: &Pull,
    meta: &Meta,
    staging: &Path,
    say: &mut dyn FnMut(&str, String),
) -> Result<Staged> {
    let reference = registry::Reference::parse(pull.image)
        .map_err(|e| anyhow::anyhow!("{e}"))
        .context("the image reference")?;
    let keys = payload::keys::parse_trusted_keys(meta.get(Tag::TrustedKeys).unwrap_or_default())?;
    ensure!(
        !keys.is_empty(),
        "META names no trusted key: this disk cannot be upgraded (reinstall it)"
    );
    if meta.get(Tag::SecureBoot).is_some() {
        bail!(
            "this disk boots with Secure Boot: upgrades over the API do not verify UKIs against \
             its db certificate yet; upgrade with `imager upgrade`; nothing was written"
        );
    }
    let client = registry::Client::new(registry::Options {
        plain_http: pull.plain_http.clone(),
        ..Default::default()
    })
    .map_err(|e| anyhow::anyhow!("{e}"))?;

    say("pull", format!("reading the manifest of {reference}"));
    let image = client
        .manifest(&reference)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    ensure!(
        image.layers.len() > PAYLOAD_LAYER && image.layers.len() <= MAX_LAYERS,
        "{reference} has {} layers: an installer image has 2 to {MAX_LAYERS} (is it one, built \
         by `imager build --profile installer`?)",
        image.layers.len()
    );
    for i in [MANIFEST_LAYER, PAYLOAD_LAYER] {
        let l = &image.layers[i];
        ensure!(
            l.media_type == LAYER_TAR,
            "layer {i} of {reference} is {}, not an uncompressed tar: push the installer image \
             with `skopeo copy --preserve-digests` (docs/registry.md)",
            l.media_type
        );
    }

    // 1. The signed manifest, alone in the first layer, verified first.
    let first = &image.layers[MANIFEST_LAYER];
    ensure!(
        first.size <= MAX_SMALL,
        "the first layer of {reference} is {} bytes: it must hold only the payload's signed \
         manifest",
        first.size
    );
    let blob = client
        .blob(&reference, first)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let (bytes, signature) = signed_manifest(blob)
        .with_context(|| format!("reading the signed manifest of {reference}"))?;
    let manifest = payload::verify::verify_trusted(&bytes, &signature, &keys)?;
    // The key id is part of the signed bytes, and one of `keys` signed them.
    let key = manifest.key_id.clone();
    if let Some(name) = meta.get(Tag::ImageName)
        && name != manifest.name
    {
        bail!(
            "{reference} is an installer for the system {:?} but this node runs {name:?}: an \
             upgrade installs a new version of the same system; nothing was written",
            manifest.name
        );
    }
    check_version(&manifest.version)?;
    ensure!(
        !manifest
            .artifacts
            .iter()
            .any(|a| a.kind == Kind::SecureBootDb),
        "{reference} is a Secure Boot build: entering Secure Boot over the API is not built; \
         use `imager upgrade --change-secure-boot`; nothing was written"
    );
    say(
        "verify",
        format!(
            "{} {} signed by {key}, a key this node trusts",
            manifest.name, manifest.version
        ),
    );

    // 2. The listed files, streamed to EPHEMERAL and checked.
    let wanted = wanted_files(&manifest)?;
    reset_dir(staging)?;
    let second = &image.layers[PAYLOAD_LAYER];
    say(
        "pull",
        format!("streaming the payload ({} bytes)", second.size),
    );
    let blob = client
        .blob(&reference, second)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut staged = stage_files(blob, &wanted, staging)
        .with_context(|| format!("streaming the payload of {reference}; nothing was written"))?;
    for (name, _) in &wanted {
        ensure!(
            staged.contains_key(name),
            "{reference}'s payload lacks {name}, which its signed manifest lists; nothing was \
             written"
        );
    }
    say(
        "verify",
        format!(
            "{} files staged on EPHEMERAL, each its signed size and digest",
            staged.len()
        ),
    );
    let boot = manifest.boot.clone().context(
        "the payload manifest has no `boot` section: it was made by an older imager; rebuild \
         the installer",
    )?;
    let mut take = |kind: Kind| -> Result<PayloadFile> {
        let name = wanted
            .iter()
            .find(|(_, a)| a.kind == kind)
            .map(|(n, _)| n.clone())
            .with_context(|| format!("the payload manifest lists no {}", kind.name()))?;
        staged
            .remove(&name)
            .with_context(|| format!("{name} was not staged"))
    };
    let kernel = take(Kind::Kernel)?;
    let initramfs = take(Kind::Initramfs)?;
    let ukis = match (
        staged.remove(paths::output::uki(Slot::A)),
        staged.remove(paths::output::uki(Slot::B)),
    ) {
        (Some(a), Some(b)) => Some(SlotUkis { a, b }),
        (None, None) => None,
        _ => bail!("the payload has the UKI of one slot but not the other: rebuild the installer"),
    };
    Ok(Staged {
        payload: Payload {
            version: manifest.version.clone(),
            title: boot.title,
            cmdline: boot.cmdline,
            kernel,
            initramfs,
            ukis,
            secure_boot: None,
        },
        key_id: key,
        digest: image.digest.to_string(),
        epoch: manifest.source_date_epoch,
    })
}

/// The version goes into a boot entry line and META's records.
fn check_version(v: &str) -> Result<()> {
    if v.is_empty() || v.len() > 64 || v.chars().any(|c| c.is_whitespace() || c.is_control()) {
        bail!("the payload's version {v:?} is empty, long, or has spaces or control characters");
    }
    Ok(())
}

/// The payload's manifest and signature from the first layer (a tar that
/// holds them and nothing else but directories), each bounded.
fn signed_manifest(blob: impl Read) -> Result<(Vec<u8>, Vec<u8>)> {
    let manifest_path = format!("{INSTALLER_PAYLOAD_DIR}/{}", paths::PAYLOAD_MANIFEST);
    let sig_path = format!("{INSTALLER_PAYLOAD_DIR}/{}", paths::PAYLOAD_SIGNATURE);
    let mut archive = tar::Archive::new(blob);
    let (mut manifest, mut signature) = (None, None);
    for entry in archive.entries().context("reading the first layer")? {
        let mut e = entry.context("reading the first layer")?;
        let path = entry_path(&e)?;
        match e.header().entry_type() {
            tar::EntryType::Directory => continue,
            tar::EntryType::Regular => {}
            t => bail!("the first layer has {path:?} of type {t:?}: only regular files"),
        }
        let slot = if path == manifest_path {
            &mut manifest
        } else if path == sig_path {
            &mut signature
        } else {
            bail!("the first layer holds {path:?}: it must hold only the signed manifest");
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
        (Some(m), Some(s)) => Ok((m, s)),
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

/// The files a slot needs, by name in the payload directory: the kernel,
/// the initramfs and the slots' UKIs.
fn wanted_files(m: &Manifest) -> Result<Vec<(String, payload::artifact::Artifact)>> {
    let mut out = Vec::new();
    for a in &m.artifacts {
        if matches!(a.kind, Kind::Kernel | Kind::Initramfs | Kind::Uki) {
            payload::manifest::check_path(&a.path)
                .map_err(|e| anyhow::anyhow!("{}: {e}", a.path))?;
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

/// Streams the payload layer, writing each wanted file into `staging` while
/// hashing it; every file must be its signed size and digest.
fn stage_files(
    blob: impl Read,
    wanted: &[(String, payload::artifact::Artifact)],
    staging: &Path,
) -> Result<std::collections::BTreeMap<String, PayloadFile>> {
    let mut staged = std::collections::BTreeMap::new();
    let mut archive = tar::Archive::new(blob);
    for entry in archive.entries().context("reading the payload layer")? {
        let mut e = entry.context("reading the payload layer")?;
        let path = entry_path(&e)?;
        let Some(name) = path
            .strip_prefix(INSTALLER_PAYLOAD_DIR)
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
        let dest = staging.join(name);
        let mut out =
            std::fs::File::create(&dest).with_context(|| format!("creating {}", dest.display()))?;
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
                .with_context(|| format!("writing {}", dest.display()))?;
        }
        let sha = hex(&hash.finalize());
        ensure!(
            len == a.size && sha == a.sha256,
            "{path} is not the signed file ({len} bytes, sha256 {sha}; signed: {} bytes, {}): \
             the image was changed",
            a.size,
            a.sha256
        );
        out.sync_all()
            .with_context(|| format!("flushing {}", dest.display()))?;
        staged.insert(
            name.to_string(),
            PayloadFile {
                path: dest,
                sha256: sha,
                len,
            },
        );
    }
    drain(archive.into_inner())?;
    Ok(staged)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Empties (or makes) the staging directory.
fn reset_dir(dir: &Path) -> Result<()> {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("emptying {}", dir.display())),
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))
}

/// The staging directory.
pub fn staging_dir() -> PathBuf {
    PathBuf::from(STAGING_DIR)
}
