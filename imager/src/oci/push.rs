//! `imager push`: an OCI archive's image (or an image layout's) sent to a
//! registry as it is: its config and layers uploaded byte for byte (each
//! read from the archive at its offset, hashed as it is sent), then its
//! manifest, the same bytes, under the reference's tag. Every digest is
//! the archive's, so a node pulling the pushed image finds what was
//! built (where `skopeo copy` without `--preserve-digests` would compress
//! the layers anew). Blobs the registry has are not sent again.

use super::MEDIA_TYPE_MANIFEST;
use super::store::{DOCKER_MANIFEST, Descriptor, ImageManifest, Store, select_image};
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
/// gets a line per blob.
pub fn push(
    archive: &Path,
    reference: &registry::Reference,
    client: &registry::Client,
    say: &mut dyn FnMut(String),
) -> Result<PushReport> {
    let what = archive.display();
    let (store, index) = Store::open_path(archive)
        .with_context(|| format!("{what} is not an OCI archive or image layout"))?;
    let image = select_image(&store, &index, None).with_context(|| format!("reading {what}"))?;
    if image.media_type != MEDIA_TYPE_MANIFEST && image.media_type != DOCKER_MANIFEST {
        bail!("{what}: the image's manifest is not an image manifest");
    }
    let manifest_bytes = store.read_small(&image, "image manifest")?;
    let manifest: ImageManifest = serde_json::from_slice(&manifest_bytes).map_err(|_| {
        anyhow!(
            "{what}: the image manifest {} is not valid JSON",
            image.digest
        )
    })?;
    if let Some(want) = reference.digest()
        && want.as_str() != image.digest
    {
        bail!(
            "{reference} names digest {want}, but the image of {what} is {}: give a tag, or \
             the image's own digest",
            image.digest
        );
    }
    let mut blobs = Vec::new();
    for (d, role) in std::iter::once((&manifest.config, "config"))
        .chain(manifest.layers.iter().map(|l| (l, "layer")))
    {
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
    let digest = client
        .push_manifest(reference, &image.media_type, &manifest_bytes)
        .map_err(|e| anyhow!("{e}"))
        .with_context(|| format!("pushing the manifest of {what}"))?;
    // `digest` is the bytes' own, which `read_small` checked against the
    // index's: the archive's digest, preserved.
    let pinned = format!("{}/{}@{digest}", reference.registry(), reference.name());
    Ok(PushReport {
        reference: reference.to_string(),
        digest: digest.to_string(),
        pinned,
        blobs,
    })
}
