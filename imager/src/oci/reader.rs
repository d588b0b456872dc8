//! Reads an installer image back: an OCI archive (or an OCI image layout
//! directory) with one linux/amd64 image of tar layers, uncompressed, gzip
//! or zstd. Index → manifest → config and layers, every blob checked against
//! its digest and size, and the payload directory
//! ([`contract::paths::INSTALLER_PAYLOAD_DIR`]) extracted. The payload's
//! signature is not verified here: that is the installer's job, against the
//! keys the disk trusts.

use super::{MEDIA_TYPE_LAYER, MEDIA_TYPE_LAYER_GZIP, MEDIA_TYPE_LAYER_ZSTD, MEDIA_TYPE_MANIFEST};
use crate::io::HashingReader;
use anyhow::{Context, Result, anyhow, bail};
use contract::paths::{INSTALLER_PAYLOAD_DIR, PAYLOAD_FILES};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// Docker's media types, which skopeo may write when it copies an image.
const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
const DOCKER_LAYER: &str = "application/vnd.docker.image.rootfs.diff.tar";
const DOCKER_LAYER_GZIP: &str = "application/vnd.docker.image.rootfs.diff.tar.gzip";
/// Index, manifest and config are small JSON documents; larger is not one.
const MAX_JSON: u64 = 4 << 20;
/// The most a layer may unpack to, and a payload file may be: a hostile
/// image (its digests are its own; the signature is checked later) must not
/// fill the disk or run for ever.
const MAX_LAYER_UNPACKED: u64 = 4 << 30;
const MAX_PAYLOAD_FILE: u64 = 1 << 30;

/// Extracts the installer payload of an OCI archive (or of an OCI image
/// layout directory) into `dest` and returns the directory that holds
/// `vmlinuz`, `initramfs.zst`, `manifest.json` and `manifest.json.sig`
/// (`dest`). Given a directory that already holds those four files, returns
/// it unchanged. Every blob read is checked against its digest and size;
/// files appear in `dest` only after the whole image checked out. The
/// payload's signature is NOT verified here.
pub fn extract_payload(archive: &Path, dest: &Path) -> Result<PathBuf> {
    let what = archive.display();
    let meta = std::fs::metadata(archive).with_context(|| format!("reading {what}"))?;
    let (store, index) = if meta.is_dir() {
        if PAYLOAD_FILES.iter().all(|f| archive.join(f).is_file()) {
            return Ok(archive.to_path_buf());
        }
        let index_path = archive.join("index.json");
        if !index_path.is_file() {
            let missing: Vec<&str> = PAYLOAD_FILES
                .into_iter()
                .filter(|f| !archive.join(f).is_file())
                .collect();
            bail!(
                "{what} is neither a payload directory (it lacks {}) nor an OCI image layout \
                 (no index.json)",
                missing.join(", ")
            );
        }
        let layout = std::fs::read(archive.join("oci-layout")).ok();
        check_layout(layout.as_deref(), archive)?;
        let f =
            File::open(&index_path).with_context(|| format!("opening {}", index_path.display()))?;
        let index = read_limited(f, "index.json")?;
        (Store::Dir(archive.to_path_buf()), index)
    } else {
        Store::open_archive(archive)?
    };
    extract_from(&store, &index, dest).with_context(|| format!("extracting the payload of {what}"))
}

fn extract_from(store: &Store, index: &[u8], dest: &Path) -> Result<PathBuf> {
    let index: Index =
        serde_json::from_slice(index).context("index.json is not a valid OCI image index")?;
    if index.schema_version != 2 {
        bail!(
            "index.json has schemaVersion {}: only 2 is supported",
            index.schema_version
        );
    }
    let images: Vec<&Descriptor> = index
        .manifests
        .iter()
        .filter(|d| d.media_type == MEDIA_TYPE_MANIFEST || d.media_type == DOCKER_MANIFEST)
        .collect();
    let image = match images.as_slice() {
        [one] => *one,
        [] => bail!("index.json names no image manifest"),
        many => {
            let amd64: Vec<&&Descriptor> = many
                .iter()
                .filter(|d| {
                    d.platform
                        .as_ref()
                        .is_some_and(|p| p.architecture == "amd64" && p.os == "linux")
                })
                .collect();
            match amd64.as_slice() {
                [one] => **one,
                _ => bail!(
                    "index.json names {} images and not exactly one for linux/amd64: give an \
                     archive of one installer image",
                    many.len()
                ),
            }
        }
    };
    let manifest: ImageManifest = store.read_json(image, "image manifest")?;
    if manifest.schema_version != 2 {
        bail!(
            "image manifest {} has schemaVersion {}: only 2 is supported",
            image.digest,
            manifest.schema_version
        );
    }
    let config: ImageConfig = store.read_json(&manifest.config, "image config")?;
    if config.rootfs.diff_ids.len() != manifest.layers.len() {
        bail!(
            "the image config lists {} layers (rootfs.diff_ids) but the manifest {}: the image \
             is corrupt",
            config.rootfs.diff_ids.len(),
            manifest.layers.len()
        );
    }

    std::fs::create_dir_all(dest).with_context(|| format!("creating {}", dest.display()))?;
    let staging = tempfile::Builder::new()
        .prefix(".payload.")
        .suffix(".partial")
        .tempdir_in(dest)
        .with_context(|| format!("creating a temporary directory in {}", dest.display()))?;
    for (layer, diff_id) in manifest.layers.iter().zip(&config.rootfs.diff_ids) {
        extract_layer(store, layer, diff_id, staging.path())?;
    }
    let missing: Vec<&str> = PAYLOAD_FILES
        .into_iter()
        .filter(|f| !staging.path().join(f).is_file())
        .collect();
    if !missing.is_empty() {
        bail!(
            "the image has no {}: it is not an installer image (build one with \
             `imager build --profile installer`)",
            missing
                .iter()
                .map(|f| format!("{INSTALLER_PAYLOAD_DIR}/{f}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let mut names: Vec<PathBuf> = std::fs::read_dir(staging.path())
        .and_then(|d| d.map(|e| e.map(|e| e.path())).collect())
        .with_context(|| format!("listing {}", staging.path().display()))?;
    names.sort();
    for from in names {
        let to = dest.join(from.file_name().unwrap_or_default());
        std::fs::rename(&from, &to)
            .with_context(|| format!("moving {} to {}", from.display(), to.display()))?;
    }
    Ok(dest.to_path_buf())
}

/// Applies one layer to the staged payload: its regular files directly under
/// the payload directory, whiteouts of them. Checks the layer's digest and
/// size and its uncompressed digest (`diff_id`).
fn extract_layer(store: &Store, layer: &Descriptor, diff_id: &str, staging: &Path) -> Result<()> {
    enum Compression {
        None,
        Gzip,
        Zstd,
    }
    let compression = match layer.media_type.as_str() {
        MEDIA_TYPE_LAYER | DOCKER_LAYER => Compression::None,
        MEDIA_TYPE_LAYER_GZIP | DOCKER_LAYER_GZIP => Compression::Gzip,
        MEDIA_TYPE_LAYER_ZSTD => Compression::Zstd,
        other => bail!(
            "layer {} has media type {other:?}: only tar layers, uncompressed or compressed \
             with gzip or zstd, are supported",
            layer.digest
        ),
    };
    let mut outer = HashingReader::new(store.open(layer)?);
    let (applied, diff) = {
        let inner: Box<dyn Read + '_> = match compression {
            Compression::None => Box::new(&mut outer),
            Compression::Gzip => Box::new(flate2::read::GzDecoder::new(&mut outer)),
            Compression::Zstd => Box::new(zstd::Decoder::new(&mut outer).context("starting zstd")?),
        };
        let inner = Capped {
            inner,
            left: MAX_LAYER_UNPACKED,
            what: "the unpacked layer",
        };
        let mut diff = HashingReader::new(inner);
        let applied = apply_layer(&mut diff, staging);
        // Hash the rest, so that the digests cover every byte.
        let drained = io::copy(&mut diff, &mut io::sink());
        let (hex, _) = diff.finish();
        (applied, drained.map(|_| hex))
    };
    let drained = io::copy(&mut outer, &mut io::sink());
    let blob = outer.finish();
    // A corrupt blob is reported as such, whatever else it broke.
    check_digest(layer, blob)?;
    drained.with_context(|| format!("reading layer {}", layer.digest))?;
    let diff = diff.with_context(|| format!("reading layer {}", layer.digest))?;
    applied.with_context(|| format!("reading layer {}", layer.digest))?;
    if format!("sha256:{diff}") != diff_id {
        bail!(
            "layer {} unpacks to sha256:{diff} but the config's diff_id is {diff_id}: the image \
             is corrupt",
            layer.digest
        );
    }
    Ok(())
}

fn apply_layer(r: impl Read, staging: &Path) -> Result<()> {
    let prefix = format!("{INSTALLER_PAYLOAD_DIR}/");
    let mut ar = tar::Archive::new(r);
    for e in ar.entries().context("reading the layer as a tar archive")? {
        let mut e = e.context("reading the layer as a tar archive")?;
        let raw = e.path_bytes().into_owned();
        let Ok(raw) = std::str::from_utf8(&raw) else {
            continue;
        };
        let path = normalize(raw)
            .map_err(|why| anyhow!("layer entry {why}: refusing the image"))?
            .to_string();
        let kind = e.header().entry_type();
        let is_link = matches!(kind, tar::EntryType::Symlink | tar::EntryType::Link);
        // A link on the way to the payload would move it anywhere.
        if is_link && format!("{INSTALLER_PAYLOAD_DIR}/").starts_with(&format!("{path}/")) {
            bail!(
                "layer entry {path} is a link, so {INSTALLER_PAYLOAD_DIR} would lead elsewhere: \
                 refusing the image"
            );
        }
        let Some(name) = path.strip_prefix(&prefix) else {
            continue;
        };
        if name.is_empty() || name.contains('/') {
            continue;
        }
        // Only the files a payload has; anything else is not extracted.
        let known = PAYLOAD_FILES
            .iter()
            .chain([&contract::paths::PAYLOAD_BOOT_LOADER])
            .any(|k| name == *k || name.strip_prefix(".wh.") == Some(*k));
        if !known && name != ".wh..wh..opq" {
            continue;
        }
        if name == ".wh..wh..opq" {
            for f in std::fs::read_dir(staging).context("listing the staged payload")? {
                let f = f.context("listing the staged payload")?;
                std::fs::remove_file(f.path())
                    .with_context(|| format!("removing {}", f.path().display()))?;
            }
            continue;
        }
        if let Some(gone) = name.strip_prefix(".wh.") {
            match std::fs::remove_file(staging.join(gone)) {
                Err(err) if err.kind() != io::ErrorKind::NotFound => {
                    return Err(err).context("applying a whiteout");
                }
                _ => continue,
            }
        }
        match kind {
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                let to = staging.join(name);
                let mut f =
                    File::create(&to).with_context(|| format!("creating {}", to.display()))?;
                let mut capped = Capped {
                    inner: &mut e,
                    left: MAX_PAYLOAD_FILE,
                    what: "a payload file",
                };
                io::copy(&mut capped, &mut f).with_context(|| format!("extracting {path}"))?;
                f.sync_all()
                    .with_context(|| format!("flushing {}", to.display()))?;
            }
            tar::EntryType::Directory => {}
            _ if is_link => {
                let target = e
                    .link_name_bytes()
                    .map(|t| String::from_utf8_lossy(&t).into_owned())
                    .unwrap_or_default();
                bail!(
                    "payload entry {path} is a link (to {target:?}): the payload must be \
                     regular files: refusing the image"
                );
            }
            other => bail!("payload entry {path} is a {other:?}, not a regular file"),
        }
    }
    Ok(())
}

/// Where the blobs are: a layout directory, or an archive with each blob's
/// data offset and size.
enum Store {
    Dir(PathBuf),
    Archive {
        path: PathBuf,
        blobs: BTreeMap<String, (u64, u64)>,
    },
}

impl Store {
    /// Scans an archive: reads `index.json` and `oci-layout`, notes where
    /// each blob's bytes are.
    fn open_archive(path: &Path) -> Result<(Store, Vec<u8>)> {
        let what = path.display();
        let f = File::open(path).with_context(|| format!("opening {what}"))?;
        let mut ar = tar::Archive::new(BufReader::with_capacity(1 << 20, f));
        let mut blobs = BTreeMap::new();
        let mut index = None;
        let mut layout = None;
        let entries = ar
            .entries_with_seek()
            .with_context(|| format!("reading {what} as a tar archive"))?;
        for e in entries {
            let mut e = e.with_context(|| {
                format!("reading {what} as a tar archive: is it an OCI archive (oci-archive)?")
            })?;
            let raw = e.path_bytes().into_owned();
            let Ok(name) = std::str::from_utf8(&raw) else {
                continue;
            };
            let name = normalize(name)
                .map_err(|e| anyhow!("{what}: archive entry {e}: refusing the archive"))?
                .to_string();
            let regular = matches!(
                e.header().entry_type(),
                tar::EntryType::Regular | tar::EntryType::Continuous
            );
            match name.as_str() {
                "index.json" | "oci-layout" if !regular => {
                    bail!("{what}: {name} is not a regular file in the archive")
                }
                "index.json" => index = Some(read_limited(&mut e, "index.json")?),
                "oci-layout" => layout = Some(read_limited(&mut e, "oci-layout")?),
                _ => {
                    if let Some(hex) = name.strip_prefix("blobs/sha256/") {
                        if hex.is_empty() {
                            continue;
                        }
                        if !regular {
                            bail!("{what}: blob {name} is not a regular file in the archive");
                        }
                        let at = (e.raw_file_position(), e.size());
                        if blobs.insert(hex.to_string(), at).is_some() {
                            bail!("{what}: the archive holds {name} twice: refusing it");
                        }
                    }
                }
            }
        }
        let index = index.with_context(|| {
            format!(
                "not an OCI archive: no index.json in {what}: give an installer image made by \
                 `imager build` (installer.tar) or a directory holding the payload"
            )
        })?;
        check_layout(layout.as_deref(), path)?;
        Ok((
            Store::Archive {
                path: path.to_path_buf(),
                blobs,
            },
            index,
        ))
    }

    /// The bytes of blob `d`, checked to have the descriptor's size; the
    /// caller checks the digest of what it reads.
    fn open(&self, d: &Descriptor) -> Result<Box<dyn Read + '_>> {
        let hex = digest_hex(&d.digest)?;
        let (file, offset, size) = match self {
            Store::Dir(root) => {
                let p = root.join("blobs/sha256").join(hex);
                let f = File::open(&p).map_err(|e| {
                    anyhow!(
                        "blob {} is missing from {} ({e}): the image is incomplete",
                        d.digest,
                        root.display()
                    )
                })?;
                let size = f
                    .metadata()
                    .with_context(|| format!("reading {}", p.display()))?
                    .len();
                (f, 0, size)
            }
            Store::Archive { path, blobs } => {
                let &(offset, size) = blobs.get(hex).with_context(|| {
                    format!(
                        "blob {} is missing from {}: the archive is incomplete",
                        d.digest,
                        path.display()
                    )
                })?;
                let f = File::open(path).with_context(|| format!("opening {}", path.display()))?;
                (f, offset, size)
            }
        };
        if size != d.size {
            bail!(
                "blob {} has {size} bytes but its descriptor says {}: the archive is corrupt",
                d.digest,
                d.size
            );
        }
        let mut f = BufReader::with_capacity(1 << 20, file);
        f.seek(SeekFrom::Start(offset))
            .with_context(|| format!("reading blob {}", d.digest))?;
        Ok(Box::new(f.take(size)))
    }

    /// A small JSON blob, read whole and checked against its digest.
    fn read_json<T: serde::de::DeserializeOwned>(&self, d: &Descriptor, what: &str) -> Result<T> {
        if d.size > MAX_JSON {
            bail!("the {what} {} is {} bytes: too large", d.digest, d.size);
        }
        let mut r = HashingReader::new(self.open(d)?);
        let bytes = read_limited(&mut r, what)?;
        check_digest(d, r.finish())?;
        serde_json::from_slice(&bytes)
            .with_context(|| format!("the {what} {} is not a valid OCI {what}", d.digest))
    }
}

fn check_layout(layout: Option<&[u8]>, at: &Path) -> Result<()> {
    let Some(bytes) = layout else {
        bail!("not an OCI image layout: no oci-layout in {}", at.display());
    };
    let v: serde_json::Value = serde_json::from_slice(bytes)
        .with_context(|| format!("oci-layout in {} is not JSON", at.display()))?;
    match v["imageLayoutVersion"].as_str() {
        Some(s) if s.starts_with("1.") => Ok(()),
        other => bail!(
            "oci-layout in {}: imageLayoutVersion {other:?} is not supported (1.x)",
            at.display()
        ),
    }
}

fn check_digest(d: &Descriptor, (hex, size): (String, u64)) -> Result<()> {
    if size != d.size {
        bail!(
            "blob {} has {size} bytes but its descriptor says {}: the archive is corrupt",
            d.digest,
            d.size
        );
    }
    if d.digest != format!("sha256:{hex}") {
        bail!(
            "blob {} does not match its digest (its bytes hash to sha256:{hex}): the archive \
             is corrupt: download or build it again",
            d.digest
        );
    }
    Ok(())
}

/// The hex part of a `sha256:<64 hex>` digest (nothing else names a blob
/// file, so a digest can never be a path of its own).
fn digest_hex(digest: &str) -> Result<&str> {
    let hex = digest.strip_prefix("sha256:").with_context(|| {
        format!("digest {digest:?} is not a sha256 digest (the only algorithm supported)")
    })?;
    if hex.len() != 64 || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        bail!("digest {digest:?} is not sha256: and 64 lowercase hex digits");
    }
    Ok(hex)
}

/// `./a/b/` → `a/b`; refuses absolute paths and `..`.
fn normalize(path: &str) -> Result<&str, String> {
    let mut p = path;
    while let Some(rest) = p.strip_prefix("./") {
        p = rest;
    }
    let p = p.trim_end_matches('/');
    if p.starts_with('/') {
        return Err(format!("{path:?} is an absolute path"));
    }
    if p.split('/').any(|c| c == "..") {
        return Err(format!("{path:?} contains `..`"));
    }
    Ok(p)
}

fn read_limited(r: impl Read, what: &str) -> Result<Vec<u8>> {
    let mut v = Vec::new();
    r.take(MAX_JSON + 1)
        .read_to_end(&mut v)
        .with_context(|| format!("reading {what}"))?;
    if v.len() as u64 > MAX_JSON {
        bail!("{what} is larger than {MAX_JSON} bytes: not an OCI image");
    }
    Ok(v)
}

/// An OCI content descriptor (only the fields read here; others are allowed).
#[derive(Debug, Clone, Deserialize)]
struct Descriptor {
    #[serde(rename = "mediaType", default)]
    media_type: String,
    digest: String,
    size: u64,
    #[serde(default)]
    platform: Option<Platform>,
}

#[derive(Debug, Clone, Deserialize)]
struct Platform {
    architecture: String,
    os: String,
}

#[derive(Debug, Deserialize)]
struct Index {
    #[serde(rename = "schemaVersion")]
    schema_version: u32,
    manifests: Vec<Descriptor>,
}

#[derive(Debug, Deserialize)]
struct ImageManifest {
    #[serde(rename = "schemaVersion")]
    schema_version: u32,
    config: Descriptor,
    layers: Vec<Descriptor>,
}

#[derive(Debug, Deserialize)]
struct ImageConfig {
    rootfs: RootFs,
}

#[derive(Debug, Deserialize)]
struct RootFs {
    diff_ids: Vec<String>,
}

/// A reader that fails once more than `left` bytes have passed.
struct Capped<R> {
    inner: R,
    left: u64,
    what: &'static str,
}

impl<R: Read> Read for Capped<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.left = self.left.checked_sub(n as u64).ok_or_else(|| {
            io::Error::other(format!("{} is larger than the installer allows", self.what))
        })?;
        Ok(n)
    }
}
