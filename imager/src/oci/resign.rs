//! A signature added to an installer image after its build (`imager sign
//! --add KEY installer.tar`): the first layer, which holds the payload's
//! signed manifest and its trust files ([`super::MANIFEST_LAYER`]), is
//! written again with the new `manifest.json.sigs`; the other layers are
//! copied as they are (their digests checked on the way), and the config,
//! manifest and index are made as a build makes them. Only an archive as
//! `imager build` writes it is taken (uncompressed layers, documents that
//! [`super::writer`] gives the same bytes for): anything else is refused
//! before a byte is written, and the archive is replaced atomically.

use super::MEDIA_TYPE_LAYER;
use super::reader::{Work, read_signed};
use super::store::{Store, check_digest, select_image};
use super::writer::{Entry, ImageSpec, assemble_temps, documents, temp_beside, write_layer};
use super::{MANIFEST_LAYER, REF_NAME};
use crate::io::HashingReader;
use crate::sign::Signer;
use anyhow::{Context, Result};
use contract::paths;
use std::io::{self, Seek, SeekFrom};
use std::path::Path;

/// Adds `signer`'s signature of the payload manifest of the installer
/// archive `archive` to its `manifest.json.sigs`; returns the new image
/// manifest's digest.
pub fn add_signature(archive: &Path, signer: &dyn Signer) -> Result<String> {
    let what = archive.display();
    let (store, index) = Store::open_path(archive)?;
    let image = select_image(&store, &index, None)?;
    let manifest: super::store::ImageManifest = store.read_json(&image, "image manifest")?;
    let config_bytes = store.read_small(&manifest.config, "image config")?;
    let config: serde_json::Value = serde_json::from_slice(&config_bytes)
        .map_err(|e| anyhow::anyhow!("the image config: {}", super::store::json_error(&e)))?;
    let index: serde_json::Value = serde_json::from_slice(&index)
        .map_err(|e| anyhow::anyhow!("index.json: {}", super::store::json_error(&e)))?;
    let not_ours = || {
        anyhow::anyhow!(
            "{what} is not an installer archive as `imager build` writes it (a copy by skopeo or \
             a registry may compress its layers): add the signature to the build's archive, or \
             sign in the build with signing.cosigners; nothing was written"
        )
    };
    if manifest.layers.len() <= super::PAYLOAD_LAYER
        || manifest
            .layers
            .iter()
            .any(|l| l.media_type != MEDIA_TYPE_LAYER)
    {
        return Err(not_ours());
    }
    let entrypoint: Vec<String> = config["config"]["Entrypoint"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    let ref_name = index["manifests"][0]["annotations"][REF_NAME]
        .as_str()
        .unwrap_or_default()
        .to_string();
    // The image's architecture, as the build wrote it (an image index of
    // several is refused above: each architecture's archive is signed
    // before they are combined).
    let arch = match config["architecture"].as_str() {
        Some(a) => contract::Arch::of_name(a).ok_or_else(not_ours)?,
        None => return Err(not_ours()),
    };
    let diff0 = config["rootfs"]["diff_ids"][MANIFEST_LAYER]
        .as_str()
        .ok_or_else(not_ours)?
        .to_string();
    let mut files = read_signed(
        &store,
        &manifest.layers[MANIFEST_LAYER],
        &diff0,
        arch,
        &Work::default(),
    )?;
    let signed = payload::manifest::Manifest::parse(&files.manifest)
        .context("the installer's payload manifest")?;
    let spec = ImageSpec {
        layers: Vec::new(),
        entrypoint,
        ref_name,
        epoch: signed.source_date_epoch,
        arch,
    };
    let old: Vec<(String, u64)> = manifest
        .layers
        .iter()
        .map(|l| (l.digest.clone(), l.size))
        .collect();
    if documents(&spec, &old)?.manifest_digest != image.digest {
        return Err(not_ours());
    }

    // The new first layer: the same files, and the signature list with
    // the new signature.
    files.signatures = Some(crate::sign::trust::add_signed(
        files.signatures.as_deref(),
        &files.manifest,
        signer,
    )?);
    let work = tempfile::tempdir().context("creating a temporary directory")?;
    let mut entries = Vec::new();
    let mut put = |name: &str, bytes: &[u8]| -> Result<()> {
        let source = work.path().join(name);
        std::fs::write(&source, bytes).with_context(|| format!("writing {}", source.display()))?;
        entries.push(Entry::File {
            path: format!("{}/{name}", paths::installer_payload_dir(arch)),
            source,
            mode: 0o644,
        });
        Ok(())
    };
    put(paths::PAYLOAD_MANIFEST, &files.manifest)?;
    put(paths::PAYLOAD_SIGNATURE, &files.signature)?;
    for (name, bytes) in files.take_named() {
        put(name, &bytes)?;
    }
    let mut temps = Vec::new();
    for (i, d) in manifest.layers.iter().enumerate() {
        let t = temp_beside(archive, "layer")?;
        let (hex, size) = if i == MANIFEST_LAYER {
            write_layer(t.as_file(), &entries, spec.epoch)?
        } else {
            let mut r = HashingReader::new(store.open(d)?);
            let mut f = t.as_file();
            io::copy(&mut r, &mut f).with_context(|| format!("copying layer {}", d.digest))?;
            f.seek(SeekFrom::Start(0))?;
            let got = r.finish();
            check_digest(d, got.clone())?;
            got
        };
        temps.push((t, hex, size));
    }
    Ok(assemble_temps(archive, &temps, &spec)?.manifest_digest)
}
