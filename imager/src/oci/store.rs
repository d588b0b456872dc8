//! Where an OCI image's blobs are read from: an OCI archive (the
//! `oci-archive` transport: a tar of an image layout, each blob's offset
//! noted in one pass) or an image layout directory; and the image of its
//! `index.json` this project reads (the only one, or the linux/amd64 one).
//! Every blob is opened with its descriptor's size, every small document
//! read within [`MAX_SMALL`] and checked against its digest. Shared by the
//! payload reader (`reader.rs`) and the push (`push.rs`).

use super::reader::tar_error;
use super::{MAX_SMALL, MEDIA_TYPE_MANIFEST};
use crate::io::HashingReader;
use anyhow::{Context, Result, anyhow, bail};
use payload::targuard::TarGuard;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// Docker's manifest media type, which skopeo may write when it copies an
/// image.
pub(super) const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
/// Docker's manifest list (an index of platforms).
pub(super) const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
/// The entries of an OCI archive: an installer image has a dozen.
const MAX_ARCHIVE_ENTRIES: usize = 1024;

/// At most 64 characters of untrusted bytes, quoted and escaped
/// ([`contract::text::quote`]), for a message.
pub(super) fn sanitize(bytes: &[u8]) -> String {
    contract::text::quote(&String::from_utf8_lossy(bytes), 64)
}

impl Store {
    /// Opens an image layout directory or an OCI archive: the store and
    /// the bytes of its `index.json`.
    pub(super) fn open_path(path: &Path) -> Result<(Store, Vec<u8>)> {
        let meta =
            std::fs::metadata(path).with_context(|| format!("reading {}", path.display()))?;
        if !meta.is_dir() {
            return Store::open_archive(path);
        }
        let layout = open_regular(&path.join("oci-layout"))
            .ok()
            .and_then(|f| read_limited(f, "oci-layout").ok());
        check_layout(layout.as_deref(), path)?;
        let f = open_regular(&path.join("index.json"))?;
        let index = read_limited(f, "index.json")?;
        Ok((Store::Dir(path.to_path_buf()), index))
    }

    /// A small blob's bytes (at most [`MAX_SMALL`]), checked against its
    /// descriptor's size and digest.
    pub(super) fn read_small(&self, d: &Descriptor, what: &str) -> Result<Vec<u8>> {
        // The digest is printed below: only once it is known to be one.
        digest_hex(&d.digest)?;
        if d.size > MAX_SMALL {
            bail!(
                "the {what} {} is {} bytes, more than the {MAX_SMALL} an installer image's \
                 has: refusing it",
                d.digest,
                d.size
            );
        }
        let mut r = HashingReader::new(self.open(d)?);
        let bytes = read_limited(&mut r, what)?;
        check_digest(d, r.finish())?;
        Ok(bytes)
    }
}

/// An image index's bytes (`what`: `index.json`, or an index blob),
/// decoded.
pub(super) fn parse_index(bytes: &[u8], what: &str) -> Result<Index> {
    let index: Index = serde_json::from_slice(bytes)
        .map_err(|e| anyhow!("{what} is not a valid OCI image index: {}", json_error(&e)))?;
    if index.schema_version != 2 {
        bail!(
            "{what} has schemaVersion {}: only 2 is supported",
            index.schema_version
        );
    }
    Ok(index)
}

/// The image manifests `index.json` (its bytes) names: its own entries, or,
/// where it names no image but one image index (a multi-architecture
/// installer image, `imager index`), that index's (one level only), with
/// that index's descriptor.
pub(super) fn image_entries(
    store: &Store,
    index: &[u8],
) -> Result<(Vec<Descriptor>, Option<Descriptor>)> {
    let is_image =
        |d: &Descriptor| d.media_type == MEDIA_TYPE_MANIFEST || d.media_type == DOCKER_MANIFEST;
    let top = parse_index(index, "index.json")?;
    if top.manifests.iter().any(is_image) {
        return Ok((top.manifests.into_iter().filter(is_image).collect(), None));
    }
    let nested: Vec<&Descriptor> = top
        .manifests
        .iter()
        .filter(|d| d.media_type == super::MEDIA_TYPE_INDEX || d.media_type == DOCKER_LIST)
        .collect();
    match nested.as_slice() {
        [] => bail!("index.json names no image manifest"),
        [one] => {
            digest_hex(&one.digest)?;
            let bytes = store.read_small(one, "image index")?;
            let inner = parse_index(&bytes, "the image index index.json names")?;
            Ok((
                inner.manifests.into_iter().filter(is_image).collect(),
                Some((*one).clone()),
            ))
        }
        many => bail!(
            "index.json names {} image indexes and no image: give an archive of one image or \
             one index",
            many.len()
        ),
    }
}

/// The image manifest's descriptor `index.json` (its bytes) names for
/// linux/`arch` ([`image_entries`]): the only image manifest (whose
/// architecture the caller checks in its config, [`check_config_arch`]),
/// or the one of an image index for that platform. With `arch` `None`, the
/// only image manifest (an index of several is refused).
pub(super) fn select_image(
    store: &Store,
    index: &[u8],
    arch: Option<contract::Arch>,
) -> Result<Descriptor> {
    let (entries, _) = image_entries(store, index)?;
    let images: Vec<&Descriptor> = entries.iter().collect();
    let image = match images.as_slice() {
        [one] => *one,
        [] => bail!("index.json names no image manifest"),
        many if arch.is_none() => bail!(
            "index.json names {} images ({}): give the archive of one architecture's installer \
             image",
            many.len(),
            platforms(many)
        ),
        many => {
            let arch = arch.unwrap_or_default();
            let ours: Vec<&&Descriptor> = many
                .iter()
                .filter(|d| {
                    d.platform
                        .as_ref()
                        .is_some_and(|p| p.architecture == arch.name() && p.os == "linux")
                })
                .collect();
            match ours.as_slice() {
                [one] => **one,
                _ => bail!(
                    "index.json names {} images and not exactly one for linux/{arch}: the \
                     installer image has no {arch} payload (its platforms: {}); nothing was \
                     written",
                    many.len(),
                    platforms(many)
                ),
            }
        }
    };
    if let (Some(p), Some(arch)) = (image.platform.as_ref(), arch)
        && p.architecture != arch.name()
    {
        bail!(
            "the installer image is for {}, not {arch}: take an installer image of {arch} (or \
             an index holding one); nothing was written",
            contract::text::quote(&p.architecture, 20)
        );
    }
    // Digests are printed in messages: only once they are known to be digests.
    digest_hex(&image.digest)?;
    Ok(image.clone())
}

/// The platforms of an index's images, for a message.
fn platforms(images: &[&Descriptor]) -> String {
    let names: Vec<String> = images
        .iter()
        .map(|d| match &d.platform {
            Some(p) => format!(
                "{}/{}",
                contract::text::quote(&p.os, 20),
                contract::text::quote(&p.architecture, 20)
            ),
            None => "none".into(),
        })
        .take(8)
        .collect();
    names.join(", ")
}

/// Refuses an image whose config names another architecture than `arch`
/// (what a lone image without a platform in `index.json` says of itself).
pub(super) fn check_config_arch(config: &ImageConfig, arch: contract::Arch) -> Result<()> {
    match config.architecture.as_deref() {
        Some(a) if a != arch.name() => bail!(
            "the installer image is for {}, not {arch}: take an installer image of {arch} (or \
             an index holding one); nothing was written",
            contract::text::quote(a, 20)
        ),
        _ => Ok(()),
    }
}

/// Where the blobs are: a layout directory, or an archive with each blob's
/// data offset and size.
pub(super) enum Store {
    Dir(PathBuf),
    Archive {
        path: PathBuf,
        blobs: BTreeMap<String, (u64, u64)>,
    },
}

impl Store {
    /// Scans an archive: reads `index.json` and `oci-layout`, notes where
    /// each blob's bytes are.
    pub(super) fn open_archive(path: &Path) -> Result<(Store, Vec<u8>)> {
        let what = path.display();
        let f = open_regular(path)?;
        let mut ar = tar::Archive::new(TarGuard::new(BufReader::with_capacity(1 << 20, f)));
        let mut blobs = BTreeMap::new();
        let mut index = None;
        let mut layout = None;
        let entries = ar
            .entries_with_seek()
            .map_err(|e| tar_error(e, &what.to_string()))?;
        for (i, e) in entries.enumerate() {
            if i >= MAX_ARCHIVE_ENTRIES {
                bail!(
                    "{what} has more than {MAX_ARCHIVE_ENTRIES} entries: not an installer image \
                     (one made by `imager build` has a dozen)"
                );
            }
            let mut e = e
                .map_err(|e| tar_error(e, &what.to_string()))
                .context("is it an OCI archive (oci-archive) such as installer.tar?")?;
            let raw = e.path_bytes().into_owned();
            let Ok(name) = std::str::from_utf8(&raw) else {
                continue;
            };
            let name = normalize(name)
                .map_err(|why| anyhow!("{what}: entry {i} of the archive {why}: refusing it"))?
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
                        // What no digest names is never read.
                        if digest_hex(&format!("sha256:{hex}")).is_err() {
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
    pub(super) fn open(&self, d: &Descriptor) -> Result<Box<dyn Read + '_>> {
        let hex = digest_hex(&d.digest)?;
        let (file, offset, size) = match self {
            Store::Dir(root) => {
                let p = root.join("blobs/sha256").join(hex);
                let f = open_regular(&p).map_err(|e| {
                    anyhow!(
                        "blob {} is missing from {} ({e:#}): the image is incomplete",
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
                let f = open_regular(path)?;
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
    pub(super) fn read_json<T: serde::de::DeserializeOwned>(
        &self,
        d: &Descriptor,
        what: &str,
    ) -> Result<T> {
        let bytes = self.read_small(d, what)?;
        serde_json::from_slice(&bytes).map_err(|e| {
            anyhow!(
                "the {what} {} is not a valid OCI {what}: {}",
                d.digest,
                json_error(&e)
            )
        })
    }
}

/// Opens `path` for reading if it is a regular file: without blocking on a
/// FIFO (or a device) put where a file belongs.
pub(super) fn open_regular(path: &Path) -> Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    let meta = f
        .metadata()
        .with_context(|| format!("reading {}", path.display()))?;
    if !meta.is_file() {
        bail!(
            "{} is not a regular file: give an installer image (an OCI archive such as \
             installer.tar) or a directory",
            path.display()
        );
    }
    Ok(f)
}

pub(super) fn check_layout(layout: Option<&[u8]>, at: &Path) -> Result<()> {
    let Some(bytes) = layout else {
        bail!("not an OCI image layout: no oci-layout in {}", at.display());
    };
    let v: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| {
        anyhow!(
            "oci-layout in {} is not JSON: {}",
            at.display(),
            json_error(&e)
        )
    })?;
    match v["imageLayoutVersion"].as_str() {
        Some(s) if s.starts_with("1.") => Ok(()),
        other => bail!(
            "oci-layout in {}: imageLayoutVersion {} is not supported (1.x)",
            at.display(),
            other.map_or("(none)".to_string(), |o| sanitize(o.as_bytes()))
        ),
    }
}

pub(super) fn check_digest(d: &Descriptor, (hex, size): (String, u64)) -> Result<()> {
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
pub(super) fn digest_hex(digest: &str) -> Result<&str> {
    let hex = digest.strip_prefix("sha256:").with_context(|| {
        format!(
            "digest {} is not a sha256 digest (the only algorithm supported)",
            sanitize(digest.as_bytes())
        )
    })?;
    if hex.len() != 64 || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        bail!(
            "digest {} is not sha256: and 64 lowercase hex digits",
            sanitize(digest.as_bytes())
        );
    }
    Ok(hex)
}

/// `./a/b/` → `a/b`; refuses absolute paths and `..` (and says which
/// without quoting the path).
pub(super) fn normalize(path: &str) -> Result<&str, String> {
    let mut p = path;
    while let Some(rest) = p.strip_prefix("./") {
        p = rest;
    }
    let p = p.trim_end_matches('/');
    // The path itself is not told: it is bytes of the input.
    if p.starts_with('/') {
        return Err("is an absolute path".into());
    }
    if p.split('/').any(|c| c == "..") {
        return Err("has a path that contains `..`".into());
    }
    Ok(p)
}

pub(super) fn read_limited(r: impl Read, what: &str) -> Result<Vec<u8>> {
    let mut v = Vec::new();
    r.take(MAX_SMALL + 1)
        .read_to_end(&mut v)
        .with_context(|| format!("reading {what}"))?;
    if v.len() as u64 > MAX_SMALL {
        bail!("{what} is larger than {MAX_SMALL} bytes: not an installer image");
    }
    Ok(v)
}

/// An OCI content descriptor (only the fields read here; others are allowed).
#[derive(Debug, Clone, Deserialize)]
pub(super) struct Descriptor {
    #[serde(rename = "mediaType", default)]
    pub(super) media_type: String,
    pub(super) digest: String,
    pub(super) size: u64,
    #[serde(default)]
    pub(super) platform: Option<Platform>,
}

#[derive(Debug, Clone, Deserialize)]
pub(super) struct Platform {
    pub(super) architecture: String,
    pub(super) os: String,
}

#[derive(Debug, Deserialize)]
pub(super) struct Index {
    #[serde(rename = "schemaVersion")]
    pub(super) schema_version: u32,
    pub(super) manifests: Vec<Descriptor>,
}

#[derive(Debug, Deserialize)]
pub(super) struct ImageManifest {
    #[serde(rename = "schemaVersion")]
    pub(super) schema_version: u32,
    pub(super) config: Descriptor,
    pub(super) layers: Vec<Descriptor>,
}

#[derive(Debug, Deserialize)]
pub(super) struct ImageConfig {
    /// The image's architecture (`amd64`, `arm64`; absent in images not
    /// made by imager).
    #[serde(default)]
    pub(super) architecture: Option<String>,
    pub(super) rootfs: RootFs,
}

#[derive(Debug, Deserialize)]
pub(super) struct RootFs {
    pub(super) diff_ids: Vec<String>,
}

/// A JSON error without the input's bytes: serde quotes the strings it did
/// not expect (in double quotes; backticks quote the schema's field names);
/// those are elided.
pub(super) fn json_error(e: &serde_json::Error) -> String {
    let mut out = String::new();
    let mut quoted = None;
    for c in e.to_string().chars() {
        match quoted {
            Some(q) if c == q => {
                out.push('…');
                out.push(c);
                quoted = None;
            }
            Some(_) => {}
            None => {
                out.push(c);
                if c == '"' {
                    quoted = Some(c);
                }
            }
        }
    }
    if quoted.is_some() {
        out.push('…');
    }
    out
}
