//! Writes the installer image: an OCI archive of uncompressed layers, byte
//! for byte the same for the same inputs: every timestamp is the build's
//! `SOURCE_DATE_EPOCH`, entries are sorted, owners are 0:0 without names,
//! modes are fixed and every JSON document is compact with sorted keys. Each
//! layer is streamed to a temporary file while it is hashed, then copied into
//! the archive; nothing large is held in memory.

use super::{LAYOUT_VERSION, MEDIA_TYPE_CONFIG, MEDIA_TYPE_INDEX, MEDIA_TYPE_LAYER};
use super::{MEDIA_TYPE_MANIFEST, REF_NAME};
use crate::io::{AtomicFile, HashingReader, HashingWriter};
use anyhow::{Context, Result, anyhow, bail};
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// A file or link of one of the image's layers. Paths are relative to the
/// image's root, `/`-separated; each layer gets the parent directories of its
/// entries (mode 0755).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    /// A regular file with the bytes of `source`.
    File {
        path: String,
        source: PathBuf,
        mode: u32,
    },
    /// A symbolic link to `target`.
    Symlink { path: String, target: String },
}

impl Entry {
    pub fn path(&self) -> &str {
        match self {
            Entry::File { path, .. } | Entry::Symlink { path, .. } => path,
        }
    }
}

/// An image of one or more layers.
#[derive(Debug, Clone)]
pub struct ImageSpec {
    /// The layers, bottom first, each the entries it holds. A path is in one
    /// layer only (directories excepted).
    pub layers: Vec<Vec<Entry>>,
    /// `config.Entrypoint`, e.g. `["/usr/bin/installer"]`.
    pub entrypoint: Vec<String>,
    /// The `org.opencontainers.image.ref.name` of the image in `index.json`:
    /// a full reference such as `localhost/metal/installer:0.1.0`, which
    /// `podman load` and skopeo take as the image's name and umoci as its tag.
    pub ref_name: String,
    /// Every timestamp: file mtimes and the config's `created`.
    pub epoch: u64,
    /// The platform's architecture (the config's and `index.json`'s).
    pub arch: contract::Arch,
}

/// What [`write_image`] wrote; digests are `sha256:<hex>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageInfo {
    pub path: PathBuf,
    pub manifest_digest: String,
    pub config_digest: String,
    /// Each layer's digest and size, bottom first.
    pub layers: Vec<(String, u64)>,
}

/// A layer written to a file: the file, its hex SHA-256 and its size.
pub(super) struct LayerFile<'a> {
    pub file: &'a File,
    pub hex: String,
    pub size: u64,
}

/// Writes the OCI archive `dest` of `spec`, atomically (a temporary name,
/// renamed when complete).
pub fn write_image(dest: &Path, spec: &ImageSpec) -> Result<ImageInfo> {
    check_ref_name(&spec.ref_name).map_err(|e| anyhow!("image reference name: {e}"))?;
    check_entries(&spec.layers)?;
    let mut temps = Vec::new();
    for (i, entries) in spec.layers.iter().enumerate() {
        let t = temp_beside(dest, "layer")?;
        let (hex, size) = write_layer(t.as_file(), entries, spec.epoch)
            .with_context(|| format!("writing layer {i} of {}", dest.display()))?;
        temps.push((t, hex, size));
    }
    assemble_temps(dest, &temps, spec)
}

/// A layer in a temporary file beside the archive: the file, its hex
/// SHA-256 and its size.
pub(super) type TempLayer = (tempfile::NamedTempFile, String, u64);

/// [`assemble`] of layers in temporary files.
pub(super) fn assemble_temps(
    dest: &Path,
    temps: &[TempLayer],
    spec: &ImageSpec,
) -> Result<ImageInfo> {
    let layers: Vec<LayerFile> = temps
        .iter()
        .map(|(t, hex, size)| LayerFile {
            file: t.as_file(),
            hex: hex.clone(),
            size: *size,
        })
        .collect();
    assemble(dest, &layers, spec)
}

/// Checks the paths of every layer: valid, each file or link in one layer
/// only, none both a directory and a file, at least one layer.
fn check_entries(layers: &[Vec<Entry>]) -> Result<()> {
    if layers.is_empty() {
        bail!("an image has at least one layer");
    }
    let mut dirs = BTreeSet::new();
    let mut seen = BTreeSet::new();
    for e in layers.iter().flatten() {
        check_image_path(e.path())?;
        if !seen.insert(e.path()) {
            bail!("image path {} is given twice", e.path());
        }
        let mut parent = e.path();
        while let Some((p, _)) = parent.rsplit_once('/') {
            dirs.insert(p.to_string());
            parent = p;
        }
    }
    if let Some(d) = dirs.iter().find(|d| seen.contains(d.as_str())) {
        bail!("image path {d} is both a directory and a file");
    }
    Ok(())
}

/// Writes the layer tar of `entries` (checked by [`check_entries`]), with
/// their parent directories, sorted, into `file`, hashing it. Returns its hex
/// SHA-256 and size.
pub(super) fn write_layer(file: &File, entries: &[Entry], epoch: u64) -> Result<(String, u64)> {
    let mut dirs = BTreeSet::new();
    for e in entries {
        let mut parent = e.path();
        while let Some((p, _)) = parent.rsplit_once('/') {
            dirs.insert(p.to_string());
            parent = p;
        }
    }
    enum Item<'a> {
        Dir,
        Entry(&'a Entry),
    }
    let mut items: Vec<(&str, Item)> = dirs.iter().map(|d| (d.as_str(), Item::Dir)).collect();
    items.extend(entries.iter().map(|e| (e.path(), Item::Entry(e))));
    items.sort_by(|a, b| a.0.cmp(b.0));

    let w = HashingWriter::new(BufWriter::with_capacity(1 << 20, file));
    let mut b = tar::Builder::new(w);
    for (path, item) in items {
        match item {
            Item::Dir => {
                let mut h = header(tar::EntryType::Directory, 0o755, 0, epoch);
                b.append_data(&mut h, format!("{path}/"), io::empty())
                    .with_context(|| format!("adding {path}/ to the layer"))?;
            }
            Item::Entry(Entry::File { source, mode, .. }) => {
                let f =
                    File::open(source).with_context(|| format!("opening {}", source.display()))?;
                let size = f
                    .metadata()
                    .with_context(|| format!("reading {}", source.display()))?
                    .len();
                let mut h = header(tar::EntryType::Regular, *mode, size, epoch);
                // Exactly `size` bytes: a file that grows meanwhile cannot
                // break the archive (one that shrinks fails the copy).
                b.append_data(&mut h, path, BufReader::new(f).take(size))
                    .with_context(|| {
                        format!("adding {} as {path} to the layer", source.display())
                    })?;
            }
            Item::Entry(Entry::Symlink { target, .. }) => {
                let mut h = header(tar::EntryType::Symlink, 0o777, 0, epoch);
                b.append_link(&mut h, path, target)
                    .with_context(|| format!("adding the link {path} to the layer"))?;
            }
        }
    }
    let w = b.into_inner().context("finishing the layer")?;
    let (buf, hex, size) = w.finish();
    buf.into_inner()
        .map_err(|e| e.into_error())
        .context("writing the layer")?;
    Ok((hex, size))
}

/// Writes the archive `dest` around the uncompressed `layers` (bottom
/// first): config, manifest, index, layout.
pub(super) fn assemble(dest: &Path, layers: &[LayerFile], spec: &ImageSpec) -> Result<ImageInfo> {
    let digests: Vec<(String, u64)> = layers
        .iter()
        .map(|l| (format!("sha256:{}", l.hex), l.size))
        .collect();
    let docs = documents(spec, &digests)?;
    let blob = |d: &str| format!("blobs/sha256/{}", d.trim_start_matches("sha256:"));
    let mut items: BTreeMap<String, ArchiveItem> = BTreeMap::new();
    items.insert("oci-layout".into(), ArchiveItem::Bytes(&docs.layout));
    items.insert("index.json".into(), ArchiveItem::Bytes(&docs.index));
    items.insert(
        blob(&docs.manifest_digest),
        ArchiveItem::Bytes(&docs.manifest),
    );
    items.insert(blob(&docs.config_digest), ArchiveItem::Bytes(&docs.config));
    for l in layers {
        // Two equal layers are one blob; the layer as hashed, re-checked
        // on the way in.
        let open = move || -> Result<Box<dyn Read + '_>> {
            let mut f = l.file;
            f.seek(SeekFrom::Start(0))?;
            Ok(Box::new(BufReader::with_capacity(1 << 20, f)))
        };
        items.insert(
            blob(&l.hex),
            ArchiveItem::Stream {
                size: l.size,
                hex: l.hex.clone(),
                from: "its layer's temporary file".into(),
                open: Box::new(open),
            },
        );
    }
    let path = write_archive(dest, items, spec.epoch)?;
    Ok(ImageInfo {
        path,
        manifest_digest: docs.manifest_digest,
        config_digest: docs.config_digest,
        layers: digests,
    })
}

/// What an entry of an OCI archive holds ([`write_archive`]).
pub(super) enum ArchiveItem<'a> {
    Dir,
    Bytes(&'a [u8]),
    /// `size` bytes read from what `open` gives, whose SHA-256 must be
    /// `hex`: checked while they go in, so that a blob changed meanwhile
    /// or corrupt (a layer file, another archive's blob) fails the write.
    /// `from` names where they come from, for that message.
    Stream {
        size: u64,
        hex: String,
        from: String,
        open: Box<dyn FnOnce() -> Result<Box<dyn Read + 'a>> + 'a>,
    },
}

/// Writes the OCI archive `dest` of `items` (path → content; `blobs/` and
/// `blobs/sha256/` added), sorted, every entry stamped with `epoch`, under
/// a temporary name renamed when complete: the one writer of archives, for
/// an image ([`write_image`]) and an index (`index::combine`).
pub(super) fn write_archive(
    dest: &Path,
    mut items: BTreeMap<String, ArchiveItem>,
    epoch: u64,
) -> Result<PathBuf> {
    items.insert("blobs/".into(), ArchiveItem::Dir);
    items.insert("blobs/sha256/".into(), ArchiveItem::Dir);
    let mut out = AtomicFile::create(dest)?;
    {
        let mut b = tar::Builder::new(BufWriter::with_capacity(1 << 20, &mut out));
        for (path, item) in items {
            let what = || format!("adding {path} to {}", dest.display());
            match item {
                ArchiveItem::Dir => {
                    let mut h = header(tar::EntryType::Directory, 0o755, 0, epoch);
                    b.append_data(&mut h, &path, io::empty())
                        .with_context(what)?;
                }
                ArchiveItem::Bytes(bytes) => {
                    let mut h = header(tar::EntryType::Regular, 0o644, bytes.len() as u64, epoch);
                    b.append_data(&mut h, &path, bytes).with_context(what)?;
                }
                ArchiveItem::Stream {
                    size,
                    hex,
                    from,
                    open,
                } => {
                    let mut r = HashingReader::new(open().with_context(what)?.take(size));
                    let mut h = header(tar::EntryType::Regular, 0o644, size, epoch);
                    b.append_data(&mut h, &path, &mut r).with_context(what)?;
                    let (got, len) = r.finish();
                    if (got.as_str(), len) != (hex.as_str(), size) {
                        bail!(
                            "{path} from {from} is not what it was when {} was begun: it \
                             hashed to sha256:{got}, {len} bytes, not sha256:{hex}, {size} \
                             (changed meanwhile, or corrupt)",
                            dest.display()
                        );
                    }
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
    out.commit()
}

/// The JSON documents of an image around its layer, serialized: config,
/// manifest (with their digests), index and `oci-layout`.
pub(super) struct Documents {
    config: Vec<u8>,
    config_digest: String,
    manifest: Vec<u8>,
    pub(super) manifest_digest: String,
    index: Vec<u8>,
    layout: Vec<u8>,
}

/// The documents of `spec`'s image of the uncompressed `layers` (digest
/// `sha256:<hex>` and size each, bottom first).
pub(super) fn documents(spec: &ImageSpec, layers: &[(String, u64)]) -> Result<Documents> {
    let created = rfc3339(spec.epoch);
    // Uncompressed: a layer's diff_id is its digest.
    let diff_ids: Vec<&str> = layers.iter().map(|(d, _)| d.as_str()).collect();
    let descriptors: Vec<serde_json::Value> = layers
        .iter()
        .map(|(digest, size)| {
            json!({
                "digest": digest,
                "mediaType": MEDIA_TYPE_LAYER,
                "size": size,
            })
        })
        .collect();

    // Keys in sorted order, compact: the same document gives the same bytes
    // whatever the map type of serde_json.
    let config = json!({
        "architecture": spec.arch.name(),
        "config": { "Entrypoint": spec.entrypoint },
        "created": created,
        "history": [ { "created": created, "created_by": "imager build" } ],
        "os": "linux",
        "rootfs": { "diff_ids": diff_ids, "type": "layers" },
    });
    let config = serde_json::to_vec(&config).context("serializing the image config")?;
    let config_digest = digest_of(&config);
    let manifest = json!({
        "config": {
            "digest": config_digest,
            "mediaType": MEDIA_TYPE_CONFIG,
            "size": config.len(),
        },
        "layers": descriptors,
        "mediaType": MEDIA_TYPE_MANIFEST,
        "schemaVersion": 2,
    });
    let manifest = serde_json::to_vec(&manifest).context("serializing the image manifest")?;
    let manifest_digest = digest_of(&manifest);
    let index = json!({
        "manifests": [ {
            "annotations": { REF_NAME: spec.ref_name },
            "digest": manifest_digest,
            "mediaType": MEDIA_TYPE_MANIFEST,
            "platform": { "architecture": spec.arch.name(), "os": "linux" },
            "size": manifest.len(),
        } ],
        "mediaType": MEDIA_TYPE_INDEX,
        "schemaVersion": 2,
    });
    let index = serde_json::to_vec(&index).context("serializing index.json")?;
    let layout = serde_json::to_vec(&json!({ "imageLayoutVersion": LAYOUT_VERSION }))
        .context("serializing oci-layout")?;
    Ok(Documents {
        config,
        config_digest,
        manifest,
        manifest_digest,
        index,
        layout,
    })
}

/// Checks that `tag` is a valid OCI tag (`[A-Za-z0-9_][A-Za-z0-9._-]{0,127}`).
pub fn check_tag(tag: &str) -> Result<(), String> {
    let ok = !tag.is_empty()
        && tag.len() <= 128
        && !tag.starts_with(['.', '-'])
        && tag
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{tag:?} cannot be an OCI image tag: use at most 128 letters, digits, '.', '_' and \
             '-', not starting with '.' or '-'"
        ))
    }
}

/// Checks `name` against the image layout's grammar of
/// `org.opencontainers.image.ref.name`: components of letters and digits
/// joined by one of `-._:@+` (or `--`), separated by `/`; at most 255
/// bytes.
pub fn check_ref_name(name: &str) -> Result<(), String> {
    let component_ok = |c: &str| {
        let b = c.as_bytes();
        let sep = |x: u8| matches!(x, b'-' | b'.' | b'_' | b':' | b'@' | b'+');
        !b.is_empty()
            && b[0].is_ascii_alphanumeric()
            && b[b.len() - 1].is_ascii_alphanumeric()
            && b.iter().all(|&x| x.is_ascii_alphanumeric() || sep(x))
            // Between letters and digits: one separator, or exactly "--".
            && b.split(|x| x.is_ascii_alphanumeric())
                .all(|run| run.len() <= 1 || run == b"--")
    };
    if name.len() <= 255 && name.split('/').all(component_ok) {
        Ok(())
    } else {
        Err(format!(
            "{} is not an image reference name: use components of letters and digits \
             joined by one of - . _ : @ +, separated by /, at most 255 bytes (e.g. \
             registry.example.com/metal/installer:0.1.0)",
            contract::text::quote(name, 64)
        ))
    }
}

/// Checks a path inside the image: relative, `/`-separated, no empty, `.`
/// or `..` component, no NUL.
fn check_image_path(path: &str) -> Result<()> {
    if path.is_empty() || path.starts_with('/') || path.contains('\0') {
        bail!("image path {path:?} must be relative to the image's root and not empty");
    }
    if path.split('/').any(|c| matches!(c, "" | "." | "..")) {
        bail!("image path {path:?} has an empty, `.` or `..` component");
    }
    Ok(())
}

/// `1970-01-01T00:00:00Z` from seconds since 1970 (RFC 3339, UTC).
pub fn rfc3339(epoch: u64) -> String {
    let (year, month, day) = contract::date::civil_from_days(epoch / 86400);
    let secs = epoch % 86400;
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

pub(crate) fn header(kind: tar::EntryType, mode: u32, size: u64, epoch: u64) -> tar::Header {
    let mut h = tar::Header::new_ustar();
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(epoch);
    h.set_size(size);
    h
}

/// A temporary file beside `dest`, named so that a later build sweeps it if
/// this one is killed ([`crate::io::remove_stale_partials`]).
pub(super) fn temp_beside(dest: &Path, what: &str) -> Result<tempfile::NamedTempFile> {
    let dir = dest
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = dest
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    tempfile::Builder::new()
        .prefix(&format!(".{name}.{what}."))
        .suffix(".partial")
        .tempfile_in(dir)
        .with_context(|| format!("creating a temporary {what} for {}", dest.display()))
}

pub(super) fn digest_of(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}
