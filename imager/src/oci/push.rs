//! `imager push`: an OCI archive's image (or an image layout's) sent to a
//! registry as it is: its config and layers uploaded byte for byte (each
//! read from the archive at its offset, hashed as it is sent), then its
//! manifest, the same bytes, under the reference's tag. Every digest is
//! the archive's, so a node pulling the pushed image finds what was
//! built (where `skopeo copy` without `--preserve-digests` would compress
//! the layers anew). Blobs the registry has are not sent again. An image
//! index of several architectures (`imager index`) is pushed whole: each
//! image by digest, then the index under the tag.

use super::MEDIA_TYPE_MANIFEST;
use super::store::{
    DOCKER_MANIFEST, Descriptor, ImageManifest, Store, digest_hex, image_entries, select_image,
};
use anyhow::{Context, Result, anyhow, bail};
use serde::Serialize;
use std::path::Path;

/// What was pushed.
#[derive(Debug, Clone, Serialize)]
pub struct PushReport {
    /// The reference pushed to, as given.
    pub reference: String,
    /// The manifest's digest (the archive's, and the registry's).
    pub digest: String,
    /// `REGISTRY/NAME@DIGEST`: the image by digest, to pin it.
    pub pinned: String,
    /// The image manifests pushed: the one image, or each of an index's.
    pub images: Vec<String>,
    pub blobs: Vec<PushedBlob>,
}

#[derive(Debug, Clone, Serialize)]
pub struct PushedBlob {
    pub digest: String,
    pub size: u64,
    pub media_type: String,
    /// False when the registry had it already.
    pub uploaded: bool,
}

fn to_registry(d: &Descriptor) -> Result<registry::Descriptor> {
    Ok(registry::Descriptor {
        media_type: d.media_type.clone(),
        digest: registry::Digest::parse(&d.digest).map_err(|e| anyhow!("{e}"))?,
        size: d.size,
    })
}

/// Pushes the image of `archive` (an OCI archive or image layout) to
/// `reference` (a tag, or the manifest's own digest) with `client`; `say`
/// gets a line per blob. An archive whose `index.json` names one image
/// index (`imager index`: one image per architecture) pushes each image
/// (its blobs, then its manifest by digest), then the index's own bytes
/// under `reference`: a client asking for its platform then finds its
/// image, with every digest the archive's.
pub fn push(
    archive: &Path,
    reference: &registry::Reference,
    client: &registry::Client,
    say: &mut dyn FnMut(String),
) -> Result<PushReport> {
    let what = archive.display().to_string();
    let (store, index) = Store::open_path(archive)
        .with_context(|| format!("{what} is not an OCI archive or image layout"))?;
    let (images, nested) =
        image_entries(&store, &index).with_context(|| format!("reading {what}"))?;
    let is_index = nested.is_some();
    let (top, top_bytes, images) = match nested {
        None => {
            let image =
                select_image(&store, &index, None).with_context(|| format!("reading {what}"))?;
            let bytes = store.read_small(&image, "image manifest")?;
            (image.clone(), bytes, vec![image])
        }
        Some(idx) => {
            let bytes = store.read_small(&idx, "image index")?;
            check_pushable_index(&bytes).with_context(|| format!("{what}: nothing was pushed"))?;
            (idx, bytes, images)
        }
    };
    if let Some(want) = reference.digest()
        && want.as_str() != top.digest
    {
        let kind = if is_index { "image index" } else { "image" };
        bail!(
            "{reference} names digest {want}, but the {kind} of {what} is {}: give a tag, or \
             the {kind}'s own digest",
            top.digest
        );
    }
    // Every image manifest read and checked before anything is sent.
    let mut manifests = Vec::with_capacity(images.len());
    for image in &images {
        digest_hex(&image.digest)?;
        let bytes = if image.digest == top.digest {
            top_bytes.clone()
        } else {
            store.read_small(image, "image manifest")?
        };
        let manifest =
            image_manifest(image, &bytes).with_context(|| format!("{what}: nothing was pushed"))?;
        manifests.push((image, bytes, manifest));
    }
    let parsed: Vec<&ImageManifest> = manifests.iter().map(|(_, _, m)| m).collect();
    check_blob_sizes(&parsed).with_context(|| format!("{what}: nothing was pushed"))?;
    let mut blobs = Vec::new();
    for (image, bytes, manifest) in &manifests {
        push_blobs(&store, manifest, reference, client, say, &what, &mut blobs)?;
        if is_index {
            let by_digest = reference
                .with_digest(registry::Digest::parse(&image.digest).map_err(|e| anyhow!("{e}"))?);
            client
                .push_manifest(&by_digest, &image.media_type, bytes)
                .map_err(|e| anyhow!("{e}"))
                .with_context(|| {
                    format!("pushing the image manifest {} of {what}", image.digest)
                })?;
            say(format!("image manifest {}: pushed", image.digest));
        }
    }
    let digest = client
        .push_manifest(reference, &top.media_type, &top_bytes)
        .map_err(|e| anyhow!("{e}"))
        .with_context(|| format!("pushing the manifest of {what}"))?;
    // `digest` is the bytes' own, which `read_small` checked against the
    // index's: the archive's digest, preserved.
    let pinned = format!("{}/{}@{digest}", reference.registry(), reference.name());
    Ok(PushReport {
        reference: reference.to_string(),
        digest: digest.to_string(),
        pinned,
        images: images.iter().map(|d| d.digest.clone()).collect(),
        blobs,
    })
}

/// The image manifest `image` (its bytes `bytes`), parsed: an image
/// manifest's media type and valid JSON.
fn image_manifest(image: &Descriptor, bytes: &[u8]) -> Result<ImageManifest> {
    if image.media_type != MEDIA_TYPE_MANIFEST && image.media_type != DOCKER_MANIFEST {
        bail!("the image's manifest is not an image manifest");
    }
    serde_json::from_slice(bytes)
        .map_err(|_| anyhow!("the image manifest {} is not valid JSON", image.digest))
}

/// Refuses images whose manifests list one blob (by digest) with two
/// sizes: each blob is sent once, so one of them would name a blob that
/// is not what it says.
pub(super) fn check_blob_sizes(manifests: &[&ImageManifest]) -> Result<()> {
    let mut sizes = std::collections::BTreeMap::new();
    for m in manifests {
        for d in std::iter::once(&m.config).chain(&m.layers) {
            let size = *sizes.entry(d.digest.as_str()).or_insert(d.size);
            if size != d.size {
                bail!(
                    "blob {} is {size} bytes in one image manifest and {} in another",
                    contract::text::quote(&d.digest, 80),
                    d.size
                );
            }
        }
    }
    Ok(())
}

/// Refuses an image index (its bytes) that does not name only image
/// manifests, at least one: every entry must be pushed before the index,
/// and only images are (a registry refuses an index naming what it does
/// not hold, and one that does not check would keep a tag naming nothing).
pub(super) fn check_pushable_index(bytes: &[u8]) -> Result<()> {
    let index = super::store::parse_index(bytes, "the image index")?;
    if index.manifests.is_empty() {
        bail!("the image index names no image");
    }
    for d in &index.manifests {
        if d.media_type != MEDIA_TYPE_MANIFEST && d.media_type != DOCKER_MANIFEST {
            bail!(
                "the image index names {} of media type {}: only image manifests are pushed \
                 (an index of `imager index`)",
                contract::text::quote(&d.digest, 80),
                contract::text::quote(&d.media_type, 80)
            );
        }
    }
    Ok(())
}

/// Pushes the config and layers of `manifest` from `store` to the
/// repository of `reference`, each once (a blob an earlier image listed,
/// in `blobs`, is not sent again; [`check_blob_sizes`] made sure it is the
/// same blob).
fn push_blobs(
    store: &Store,
    manifest: &ImageManifest,
    reference: &registry::Reference,
    client: &registry::Client,
    say: &mut dyn FnMut(String),
    what: &str,
    blobs: &mut Vec<PushedBlob>,
) -> Result<()> {
    for (d, role) in std::iter::once((&manifest.config, "config"))
        .chain(manifest.layers.iter().map(|l| (l, "layer")))
    {
        if blobs.iter().any(|b| b.digest == d.digest) {
            continue;
        }
        let descriptor = to_registry(d)?;
        let content = store.open(d)?;
        let pushed = client
            .push_blob(reference, &descriptor, content)
            .map_err(|e| anyhow!("{e}"))
            .with_context(|| format!("pushing {role} {} of {what}", d.digest))?;
        let uploaded = pushed == registry::Pushed::Uploaded;
        say(format!(
            "{role} {} ({} bytes): {}",
            d.digest,
            d.size,
            if uploaded {
                "uploaded"
            } else {
                "already there"
            }
        ));
        blobs.push(PushedBlob {
            digest: d.digest.clone(),
            size: d.size,
            media_type: d.media_type.clone(),
            uploaded,
        });
    }
    Ok(())
}
