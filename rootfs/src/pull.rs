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
use contract::paths;
use payload::artifact::Kind;
use payload::layer::{LAYER_TAR, MANIFEST_LAYER, MAX_LAYERS, MAX_SMALL, PAYLOAD_LAYER};
use std::path::{Path, PathBuf};

/// Where a pulled payload is staged: on EPHEMERAL, never in memory.
pub const STAGING_DIR: &str = "/var/lib/machined/upgrade";

/// What a pull is asked for.
pub struct Pull<'a> {
    pub image: &'a str,
    /// The version the signed payload must be (`contract::version`), and
    /// whether a lower security version is allowed this once.
    pub asked: payload::verify::Asked<'a>,
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
        own_addresses: crate::net::own_addresses(),
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
    let (bytes, signature) = payload::layer::signed_manifest(blob)
        .with_context(|| format!("reading the signed manifest of {reference}"))?;
    let manifest = payload::verify::verify_trusted(&bytes, &signature, &keys)?;
    // The key id is part of the signed bytes, and one of `keys` signed them.
    let key = manifest.key_id.clone();
    payload::verify::check_for_disk(meta, &manifest, pull.asked)
        .with_context(|| reference.to_string())?;
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
    let wanted = payload::layer::slot_files(&manifest)?;
    reset_dir(staging)?;
    let second = &image.layers[PAYLOAD_LAYER];
    say(
        "pull",
        format!("streaming the payload ({} bytes)", second.size),
    );
    let blob = client
        .blob(&reference, second)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut open = |name: &str| -> Result<Box<dyn std::io::Write>> {
        let dest = staging.join(name);
        let f =
            std::fs::File::create(&dest).with_context(|| format!("creating {}", dest.display()))?;
        Ok(Box::new(std::io::BufWriter::with_capacity(1 << 16, f)))
    };
    let written = payload::layer::stage_files(blob, &wanted, &mut open)
        .with_context(|| format!("streaming the payload of {reference}; nothing was written"))?;
    // On the disk before BOOT is written from them.
    let mut staged = std::collections::BTreeMap::new();
    for (name, f) in written {
        let path = staging.join(&name);
        std::fs::File::open(&path)
            .and_then(|f| f.sync_all())
            .with_context(|| format!("flushing {}", path.display()))?;
        staged.insert(
            name,
            PayloadFile {
                path,
                sha256: f.sha256,
                len: f.len,
            },
        );
    }
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
            security_version: manifest.security_version,
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
