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
//! The images are copied as they are, every blob's digest checked on the
//! way, so each keeps the digest its build gave it; the archive is written
//! under a temporary name and renamed when complete, its entries sorted and
//! stamped with one time, so the same inputs give the same bytes.

use super::store::{Descriptor, ImageConfig, Store, check_digest, select_image};
use super::writer::header;
use super::{MEDIA_TYPE_INDEX, MEDIA_TYPE_MANIFEST, REF_NAME};
use crate::io::{AtomicFile, HashingReader};
use anyhow::{Context, Result, anyhow, bail};
use contract::Arch;
use serde_json::json;
use std::collections::BTreeMap;
use std::io::{self, BufWriter, Read};
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
/// config's descriptor, architecture and reference name.
struct Input {
    path: PathBuf,
    store: Store,
    image: Descriptor,
    manifest: super::store::ImageManifest,
    arch: Arch,
    ref_name: String,
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
    let config: ImageConfig = store.read_json(&manifest.config, "image config")?;
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
    Ok(Input {
        path: path.to_path_buf(),
        store,
        image,
        manifest,
        arch,
        ref_name,
    })
}

/// Combines the single-architecture installer archives `inputs` (one per
/// architecture, of the same reference name) into the archive `dest`,
/// whose entries carry the time `epoch`.
pub fn combine(dest: &Path, inputs: &[PathBuf], epoch: u64) -> Result<IndexReport> {
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

    enum Src<'a> {
        Dir,
        Bytes(&'a [u8]),
        Blob(&'a Input, &'a Descriptor),
    }
    let blob = |d: &str| format!("blobs/sha256/{}", d.trim_start_matches("sha256:"));
    let mut items: BTreeMap<String, Src> = BTreeMap::new();
    items.insert("blobs/".into(), Src::Dir);
    items.insert("blobs/sha256/".into(), Src::Dir);
    items.insert("oci-layout".into(), Src::Bytes(&layout));
    items.insert("index.json".into(), Src::Bytes(&top));
    items.insert(blob(&digest), Src::Bytes(&nested));
    for i in by_arch.values() {
        for d in std::iter::once(&i.image)
            .chain([&i.manifest.config])
            .chain(&i.manifest.layers)
        {
            // A blob two images share is copied once.
            items.entry(blob(&d.digest)).or_insert(Src::Blob(i, d));
        }
    }
    let mut out = AtomicFile::create(dest)?;
    {
        let mut b = tar::Builder::new(BufWriter::with_capacity(1 << 20, &mut out));
        for (path, src) in &items {
            let what = || format!("adding {path} to {}", dest.display());
            match src {
                Src::Dir => {
                    let mut h = header(tar::EntryType::Directory, 0o755, 0, epoch);
                    b.append_data(&mut h, path, io::empty())
                        .with_context(what)?;
                }
                Src::Bytes(bytes) => {
                    let mut h = header(tar::EntryType::Regular, 0o644, bytes.len() as u64, epoch);
                    b.append_data(&mut h, path, *bytes).with_context(what)?;
                }
                Src::Blob(i, d) => {
                    // Exactly the descriptor's size, its digest checked.
                    let mut r = HashingReader::new(i.store.open(d)?.take(d.size));
                    let mut h = header(tar::EntryType::Regular, 0o644, d.size, epoch);
                    b.append_data(&mut h, path, &mut r).with_context(what)?;
                    check_digest(d, r.finish())
                        .with_context(|| format!("copying from {}", i.path.display()))?;
                }
            }
        }
        let w = b
            .into_inner()
            .with_context(|| format!("finishing {}", dest.display()))?;
        w.into_inner()
            .map_err(|e| e.into_error())
            .with_context(|| format!("writing {}", dest.display()))?;
    }
    let path = out.commit()?;
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
