//! One installer image for several architectures (`imager index`): the
//! installer archives of one system's builds for amd64 and arm64 combined
//! into one OCI archive whose `index.json` names a single image index
//! (with the images' reference name), which names each architecture's
//! image manifest by its platform (the OCI image layout and image index
//! specifications: `image-layout.md`, `image-index.md`). skopeo and podman
//! take the platform they are asked for (`--override-arch`), a registry
//! serves the index under the tag, and this project's readers take the
//! disk's own ([`super::store::select_image`]).
//!
//! Each input's payload manifest (its first layer, read within the
//! reader's bounds) must name the architecture its image says, and all of
//! them one system and version: a mislabelled archive is refused here, not
//! later on a machine. (Its signature is the readers' to check, against
//! the disk's trust: an index adds no trust.) The images are copied as they
//! are, every blob's digest checked on the way, so each keeps the digest
//! its build gave it; the archive is written under a temporary name and
//! renamed when complete, its entries sorted and stamped with the latest
//! of the payloads' `source_date_epoch`, so the same inputs give the same
//! bytes wherever and whenever they are combined.

use super::reader::{Work, read_signed};
use super::store::{Descriptor, ImageConfig, Store, digest_hex, select_image};
use super::writer::{ArchiveItem, write_archive};
use super::{MEDIA_TYPE_INDEX, MEDIA_TYPE_MANIFEST, REF_NAME};
use anyhow::{Context, Result, anyhow, bail};
use contract::Arch;
use serde_json::json;
use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

/// What [`combine`] wrote.
#[derive(Debug, Clone, serde::Serialize)]
pub struct IndexReport {
    pub path: PathBuf,
    /// The image index's digest (`sha256:…`): what a registry's tag names.
    pub digest: String,
    /// The reference name of the images (`localhost/NAME/installer:VERSION`).
    pub ref_name: String,
    /// Each architecture's image manifest digest, in the table's order.
    pub images: Vec<(String, String)>,
}

/// One input: its store, its image manifest's descriptor and bytes, its
/// architecture and reference name, and what its payload manifest says.
struct Input {
    path: PathBuf,
    store: Store,
    image: Descriptor,
    manifest: super::store::ImageManifest,
    arch: Arch,
    ref_name: String,
    payload: crate::sign::Manifest,
}

fn open(path: &Path) -> Result<Input> {
    let what = path.display();
    let (store, index) = Store::open_path(path)
        .with_context(|| format!("{what} is not an OCI archive or image layout"))?;
    let image = select_image(&store, &index, None).with_context(|| format!("reading {what}"))?;
    if image.media_type != MEDIA_TYPE_MANIFEST {
        bail!("{what}: its image is not an OCI image manifest (as `imager build` writes)");
    }
    let manifest: super::store::ImageManifest = store.read_json(&image, "image manifest")?;
    // As the reader takes them: schema 2, the signed manifest's and the
    // payload's layers and at most MAX_LAYERS, the blobs' names (paths in
    // the new archive) digests.
    if manifest.schema_version != 2 {
        bail!(
            "{what}: its image manifest has schemaVersion {}: only 2 is supported",
            manifest.schema_version
        );
    }
    if manifest.layers.len() > super::MAX_LAYERS || manifest.layers.len() <= super::PAYLOAD_LAYER {
        bail!(
            "{what}: its image has {} layers: an installer image has its signed manifest's and \
             its payload's, and at most {}",
            manifest.layers.len(),
            super::MAX_LAYERS
        );
    }
    for d in manifest.layers.iter().chain([&manifest.config]) {
        digest_hex(&d.digest)?;
    }
    let config: ImageConfig = store.read_json(&manifest.config, "image config")?;
    if config.rootfs.diff_ids.len() != manifest.layers.len() {
        bail!(
            "{what}: its image config lists {} layers but its manifest {}: the image is corrupt",
            config.rootfs.diff_ids.len(),
            manifest.layers.len()
        );
    }
    let arch = config
        .architecture
        .as_deref()
        .and_then(Arch::of_name)
        .ok_or_else(|| {
            anyhow!(
                "{what}: its image config names no architecture this project builds (amd64, \
                 arm64)"
            )
        })?;
    let top: serde_json::Value = serde_json::from_slice(&index)
        .map_err(|e| anyhow!("{what}: index.json: {}", super::store::json_error(&e)))?;
    let ref_name = top["manifests"][0]["annotations"][REF_NAME]
        .as_str()
        .unwrap_or_default()
        .to_string();
    super::writer::check_ref_name(&ref_name).map_err(|e| {
        anyhow!("{what}: the image's reference name (index.json's {REF_NAME}): {e}")
    })?;
    let (Some(layer0), Some(diff0)) = (
        manifest.layers.get(super::MANIFEST_LAYER),
        config.rootfs.diff_ids.get(super::MANIFEST_LAYER),
    ) else {
        bail!("{what}: not an installer image (no first layer)");
    };
    let signed = read_signed(&store, layer0, diff0, arch, &Work::default())
        .with_context(|| format!("reading {what}"))?;
    let payload = crate::sign::Manifest::parse(&signed.manifest)
        .with_context(|| format!("{what}: its payload manifest"))?;
    let said = payload.arch()?;
    if said != arch {
        bail!(
            "{what}: its image says {arch} but its payload manifest {said}: refusing to list it \
             as {arch}'s"
        );
    }
    Ok(Input {
        path: path.to_path_buf(),
        store,
        image,
        manifest,
        arch,
        ref_name,
        payload,
    })
}

/// Combines the single-architecture installer archives `inputs` (one per
/// architecture, of the same system, version and reference name) into the
/// archive `dest`.
pub fn combine(dest: &Path, inputs: &[PathBuf]) -> Result<IndexReport> {
    if inputs.len() < 2 {
        bail!("give the installer archives of at least two architectures to combine");
    }
    let mut by_arch: BTreeMap<Arch, Input> = BTreeMap::new();
    for path in inputs {
        let input = open(path)?;
        if let Some(other) = by_arch.get(&input.arch) {
            bail!(
                "{} and {} are both {} images: give one archive per architecture",
                other.path.display(),
                path.display(),
                input.arch
            );
        }
        by_arch.insert(input.arch, input);
    }
    let first = by_arch.values().next().context("no input")?;
    if let Some(other) = by_arch.values().find(|i| i.ref_name != first.ref_name) {
        bail!(
            "{} is {} but {} is {}: the images of one index are one system's version, built \
             for each architecture",
            first.path.display(),
            first.ref_name,
            other.path.display(),
            other.ref_name
        );
    }
    let same = |i: &Input| {
        i.payload.name == first.payload.name && i.payload.version == first.payload.version
    };
    if let Some(other) = by_arch.values().find(|i| !same(i)) {
        bail!(
            "{} holds {} {} but {} holds {} {}: the images of one index are one system's \
             version, built for each architecture",
            first.path.display(),
            contract::text::quote(&first.payload.name, 64),
            first.payload.version,
            other.path.display(),
            contract::text::quote(&other.payload.name, 64),
            other.payload.version
        );
    }
    let epoch = by_arch
        .values()
        .map(|i| i.payload.source_date_epoch)
        .max()
        .unwrap_or_default();
    // A tar header's time has 11 octal digits (until the year 2242).
    if epoch >= 1 << 33 {
        bail!("the payloads' source_date_epoch {epoch} is past what a tar header holds");
    }
    let ref_name = first.ref_name.clone();
    // The image index, platforms in the table's order; and index.json,
    // naming it with the reference name.
    let entries: Vec<serde_json::Value> = by_arch
        .values()
        .map(|i| {
            json!({
                "digest": i.image.digest,
                "mediaType": MEDIA_TYPE_MANIFEST,
                "platform": { "architecture": i.arch.name(), "os": "linux" },
                "size": i.image.size,
            })
        })
        .collect();
    let nested = serde_json::to_vec(&json!({
        "manifests": entries,
        "mediaType": MEDIA_TYPE_INDEX,
        "schemaVersion": 2,
    }))
    .context("serializing the image index")?;
    let digest = super::writer::digest_of(&nested);
    let top = serde_json::to_vec(&json!({
        "manifests": [ {
            "annotations": { REF_NAME: ref_name },
            "digest": digest,
            "mediaType": MEDIA_TYPE_INDEX,
            "size": nested.len(),
        } ],
        "mediaType": MEDIA_TYPE_INDEX,
        "schemaVersion": 2,
    }))
    .context("serializing index.json")?;
    let layout = serde_json::to_vec(&json!({ "imageLayoutVersion": super::LAYOUT_VERSION }))
        .context("serializing oci-layout")?;

    let blob = |d: &str| format!("blobs/sha256/{}", d.trim_start_matches("sha256:"));
    let mut items: BTreeMap<String, ArchiveItem> = BTreeMap::new();
    items.insert("oci-layout".into(), ArchiveItem::Bytes(&layout));
    items.insert("index.json".into(), ArchiveItem::Bytes(&top));
    items.insert(blob(&digest), ArchiveItem::Bytes(&nested));
    // A blob two images share is copied once; its size must agree.
    let mut sizes: BTreeMap<&str, (u64, &PathBuf)> = BTreeMap::new();
    for i in by_arch.values() {
        for d in std::iter::once(&i.image)
            .chain([&i.manifest.config])
            .chain(&i.manifest.layers)
        {
            // Its digest checked on the way in (a digest is checked to be
            // one when its image is read).
            let hex = d.digest.trim_start_matches("sha256:").to_string();
            if let Some((size, other)) = sizes.insert(d.digest.as_str(), (d.size, &i.path)) {
                if size != d.size {
                    bail!(
                        "blob {} is {size} bytes in {} but {} in {}: one of them is corrupt",
                        d.digest,
                        other.display(),
                        d.size,
                        i.path.display()
                    );
                }
                continue;
            }
            let open = move || -> Result<Box<dyn Read + '_>> { i.store.open(d) };
            items.insert(
                blob(&d.digest),
                ArchiveItem::Stream {
                    size: d.size,
                    hex,
                    from: i.path.display().to_string(),
                    open: Box::new(open),
                },
            );
        }
    }
    let path = write_archive(dest, items, epoch)?;
    Ok(IndexReport {
        path,
        digest,
        ref_name,
        images: by_arch
            .values()
            .map(|i| (i.arch.name().to_string(), i.image.digest.clone()))
            .collect(),
    })
}
