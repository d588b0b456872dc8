//! Reads an installer image back: an OCI archive (or an OCI image layout
//! directory) with one linux/amd64 image of tar layers, uncompressed, gzip
//! or zstd, laid out as `docs/design.md` ("The installer image") says: the
//! payload's signed manifest and its signature alone in the first layer
//! ([`MANIFEST_LAYER`]), the files it lists in the second
//! ([`PAYLOAD_LAYER`]).
//!
//! Signature before work: before the signature is checked, only small,
//! bounded things are read (`index.json`, the image manifest and config,
//! the first layer, each at most [`MAX_SMALL`] bytes, and at most
//! [`MAX_LAYERS`] layers named). The caller's verifier then decides whether
//! the manifest is trusted; only then is the payload layer read, bounded by
//! the sizes the signed manifest declares, and only the files it lists are
//! written, each checked against its signed size and digest. No other layer
//! is ever decompressed: their blobs are only hashed, once the signature
//! verified. Every blob is checked against its digest and size, each layer
//! unpacked against its `diff_id`.
//!
//! One trust path: this module is transport only (the archive, its blobs,
//! their digests, decompression, bounds on what is unpacked). What a layer
//! may hold and how its files are checked are `payload::layer`'s rules
//! ([`payload::layer::signed_manifest`], [`payload::layer::stage_files`]),
//! the same the node applies to a layer pulled from a registry; whether the
//! payload fits the disk is `payload::verify::check_for_disk`, and a
//! version is checked by `contract::version::check`.

use super::{MANIFEST_LAYER, MAX_LAYERS, PAYLOAD_LAYER};
use super::{MEDIA_TYPE_LAYER, MEDIA_TYPE_LAYER_GZIP, MEDIA_TYPE_LAYER_ZSTD, MEDIA_TYPE_MANIFEST};
use crate::io::HashingReader;
use crate::sign::{self, Manifest};
use anyhow::{Context, Result, anyhow, bail};
use contract::paths::{INSTALLER_PAYLOAD_DIR, PAYLOAD_FILES, PAYLOAD_MANIFEST, PAYLOAD_SIGNATURE};
use payload::targuard::TarGuard;
use serde::Deserialize;
use std::cell::Cell;
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// Docker's media types, which skopeo may write when it copies an image.
const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
const DOCKER_LAYER: &str = "application/vnd.docker.image.rootfs.diff.tar";
const DOCKER_LAYER_GZIP: &str = "application/vnd.docker.image.rootfs.diff.tar.gzip";
/// Index, manifest and config are small JSON documents, and the first layer
/// holds two small files: larger, compressed or not, is not an installer
/// image, and is refused before it is read.
pub const MAX_SMALL: u64 = 1 << 20;
/// The entries of an OCI archive: an installer image has a dozen.
const MAX_ARCHIVE_ENTRIES: usize = 1024;
/// What the tar format adds to the payload files in the payload layer
/// (headers, padding, directories, the end marker), at most.
pub(super) const TAR_ALLOWANCE: u64 = 64 << 10;
/// The most one payload file may be, whatever its signed manifest declares.
const MAX_PAYLOAD_FILE: u64 = 1 << 30;

/// Decides whether the payload's manifest is trusted: given the bytes of
/// `manifest.json` and of `manifest.json.sig` from the image, returns the
/// manifest decoded from those very bytes, or why it is not trusted (for
/// the installer: not signed by a key the disk trusts). Called before
/// anything large is read.
pub type Verifier<'a> = &'a dyn Fn(&[u8], &[u8]) -> Result<Manifest>;

/// What reading an image cost, for tests that show the work is bounded:
/// the bytes that came out of layers (decompressed) and the layers
/// unpacked (decompressed; the others' blobs are only hashed).
#[derive(Debug, Default)]
pub(super) struct Work {
    pub unpacked: Cell<u64>,
    pub layers: Cell<usize>,
}

/// Extracts the installer payload of an OCI archive (or of an OCI image
/// layout directory) into `dest` and returns the directory that holds
/// `vmlinuz`, `initramfs.zst`, `manifest.json` and `manifest.json.sig`
/// (`dest`), and whatever else the signed manifest lists.
///
/// The manifest and its signature are read first, with bounded work, and
/// given to `verify`; only when it accepts them is the payload read, and
/// only the files the manifest lists, each checked against the size and
/// digest it declares. Files appear in `dest` only when all of them checked
/// out.
///
/// Given a directory that already holds the four payload files, returns it
/// unchanged: the caller verifies it (`sign::verify`), as it would any
/// payload directory.
pub fn extract_payload(archive: &Path, dest: &Path, verify: Verifier) -> Result<PathBuf> {
    extract_counted(archive, dest, verify, &Work::default())
}

/// [`extract_payload`], counting its work in `work`.
pub(super) fn extract_counted(
    archive: &Path,
    dest: &Path,
    verify: Verifier,
    work: &Work,
) -> Result<PathBuf> {
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
        let layout = open_regular(&archive.join("oci-layout"))
            .ok()
            .and_then(|f| read_limited(f, "oci-layout").ok());
        check_layout(layout.as_deref(), archive)?;
        let f = open_regular(&index_path)?;
        let index = read_limited(f, "index.json")?;
        (Store::Dir(archive.to_path_buf()), index)
    } else {
        Store::open_archive(archive)?
    };
    extract_from(&store, &index, dest, verify, work)
        .with_context(|| format!("extracting the payload of {what}"))
}

fn extract_from(
    store: &Store,
    index: &[u8],
    dest: &Path,
    verify: Verifier,
    work: &Work,
) -> Result<PathBuf> {
    let index: Index = serde_json::from_slice(index).map_err(|e| {
        anyhow!(
            "index.json is not a valid OCI image index: {}",
            json_error(&e)
        )
    })?;
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
    // Digests are printed in messages: only once they are known to be digests.
    digest_hex(&image.digest)?;
    let manifest: ImageManifest = store.read_json(image, "image manifest")?;
    if manifest.schema_version != 2 {
        bail!(
            "image manifest {} has schemaVersion {}: only 2 is supported",
            image.digest,
            manifest.schema_version
        );
    }
    // Bounded before any layer is opened.
    let n = manifest.layers.len();
    if n > MAX_LAYERS {
        bail!(
            "the image has {n} layers, more than the {MAX_LAYERS} an installer image may have \
             (one made by `imager build` has 3): refusing it before reading any layer"
        );
    }
    if n <= PAYLOAD_LAYER {
        bail!(
            "the image has {n} layer(s), but an installer image keeps its payload's signed \
             manifest in a first layer of its own and the payload in the second: it is not an \
             installer image, or one made by an older imager (rebuild it with `imager build \
             --profile installer`)"
        );
    }
    for d in manifest.layers.iter().chain([&manifest.config]) {
        digest_hex(&d.digest)?;
    }
    let config: ImageConfig = store.read_json(&manifest.config, "image config")?;
    if config.rootfs.diff_ids.len() != n {
        bail!(
            "the image config lists {} layers (rootfs.diff_ids) but the manifest {n}: the image \
             is corrupt",
            config.rootfs.diff_ids.len(),
        );
    }
    let layer = |i: usize| (&manifest.layers[i], config.rootfs.diff_ids[i].as_str());

    // The signed manifest first, and nothing else until it is trusted.
    let (layer0, diff0) = layer(MANIFEST_LAYER);
    let signed = read_signed(store, layer0, diff0, work)?;
    let trusted = verify(&signed.manifest, &signed.signature).context(
        "refusing the installer image before unpacking its payload: its signed manifest \
         (in the first layer) is not trusted",
    )?;
    let listed = listed_files(&trusted)?;

    std::fs::create_dir_all(dest).with_context(|| format!("creating {}", dest.display()))?;
    let staging = tempfile::Builder::new()
        .prefix(".payload.")
        .suffix(".partial")
        .tempdir_in(dest)
        .with_context(|| format!("creating a temporary directory in {}", dest.display()))?;
    let (layer1, diff1) = layer(PAYLOAD_LAYER);
    extract_listed(store, layer1, diff1, &listed, staging.path(), work)?;
    // The other layers are not unpacked, but the archive is whole: their
    // bytes are hashed (each blob once, at most the archive's size each).
    let mut checked = std::collections::BTreeSet::new();
    for (i, d) in manifest.layers.iter().enumerate() {
        if i != MANIFEST_LAYER && i != PAYLOAD_LAYER && checked.insert(d.digest.as_str()) {
            let mut r = HashingReader::new(store.open(d)?);
            io::copy(&mut r, &mut io::sink())
                .with_context(|| format!("reading layer {}", d.digest))?;
            check_digest(d, r.finish())?;
        }
    }
    for (name, bytes) in [
        (PAYLOAD_MANIFEST, &signed.manifest),
        (PAYLOAD_SIGNATURE, &signed.signature),
    ] {
        let to = staging.path().join(name);
        std::fs::write(&to, bytes).with_context(|| format!("writing {}", to.display()))?;
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

/// The payload's manifest and signature, as read from the first layer.
struct Signed {
    manifest: Vec<u8>,
    signature: Vec<u8>,
}

/// Reads the first layer, which must hold `manifest.json` and
/// `manifest.json.sig` of the payload directory: at most [`MAX_SMALL`]
/// bytes, compressed and unpacked.
fn read_signed(store: &Store, layer: &Descriptor, diff_id: &str, work: &Work) -> Result<Signed> {
    let first = "the image's first layer";
    let over = || {
        format!(
            "{first} is larger than {MAX_SMALL} bytes, but it must hold only the payload's signed \
             manifest and signature: refusing the image before its signature is checked (not \
             an installer image, or one made by an older imager: rebuild it)"
        )
    };
    if layer.size > MAX_SMALL {
        bail!("{}", over());
    }
    // The rules of the first layer are the payload crate's, the node's
    // too: the signed manifest and its signature, nothing else.
    let mut signed = None;
    with_layer(store, layer, diff_id, MAX_SMALL, &over, work, |r| {
        signed = Some(payload::layer::signed_manifest(r).map_err(|e| {
            let e = layer_error(e, "the layer");
            if format!("{e:#}").contains("lacks") {
                e.context(
                    "an installer image keeps its payload's signed manifest and signature in \
                     its first layer, alone (not an installer image, or one made by an older \
                     imager: rebuild it with `imager build --profile installer`)",
                )
            } else {
                e
            }
        })?);
        Ok(())
    })
    .with_context(|| format!("reading {first} ({})", layer.digest))?;
    let Some((manifest, signature)) = signed else {
        bail!("{first} was not read");
    };
    Ok(Signed {
        manifest,
        signature,
    })
}

/// The files a trusted payload manifest lists, by name, checked: plain
/// names, valid digests, each once, the kernel and initramfs among them.
fn listed_files(m: &Manifest) -> Result<BTreeMap<String, payload::artifact::Artifact>> {
    let mut listed = BTreeMap::new();
    for a in &m.artifacts {
        let bad = |why: &str| anyhow!("the signed payload manifest lists {:?}: {why}", a.path);
        sign::check_path(&a.path).map_err(|why| bad(&why))?;
        if a.path.contains('/') {
            return Err(bad(
                "a payload lists files of its own directory only, by name",
            ));
        }
        sign::check_digest(&a.sha256).map_err(|why| bad(&why))?;
        if a.size > MAX_PAYLOAD_FILE {
            return Err(bad(&format!(
                "{} bytes is more than a payload file may have ({MAX_PAYLOAD_FILE})",
                a.size
            )));
        }
        if listed.insert(a.path.clone(), a.clone()).is_some() {
            return Err(bad("listed twice"));
        }
    }
    for name in PAYLOAD_FILES {
        if name != PAYLOAD_MANIFEST && name != PAYLOAD_SIGNATURE && !listed.contains_key(name) {
            bail!("the signed payload manifest lists no {name}: it is not an installer payload");
        }
    }
    Ok(listed)
}

/// Reads the payload layer and writes into `staging` the files of `listed`
/// (and nothing else), each checked against its signed size and digest;
/// the layer may unpack to no more than the listed sizes and
/// [`TAR_ALLOWANCE`].
fn extract_listed(
    store: &Store,
    layer: &Descriptor,
    diff_id: &str,
    listed: &BTreeMap<String, payload::artifact::Artifact>,
    staging: &Path,
    work: &Work,
) -> Result<()> {
    let declared = listed
        .values()
        .try_fold(0u64, |sum, f| sum.checked_add(f.size))
        .context("the signed payload manifest's sizes add up to more than 2^64 bytes")?;
    let cap = declared.saturating_add(TAR_ALLOWANCE);
    let over = || {
        format!(
            "the payload layer unpacks to more than the {declared} bytes the signed manifest \
             declares (and {TAR_ALLOWANCE} for the tar format): refusing the image"
        )
    };
    // Compression adds little even to what does not compress.
    let max_blob = cap.saturating_add(cap / 16).saturating_add(MAX_SMALL);
    if layer.size > max_blob {
        bail!(
            "the payload layer {} is {} bytes, but the signed manifest declares {declared} bytes \
             of payload: refusing the image before reading it",
            layer.digest,
            layer.size
        );
    }
    // The rules of the payload layer are the payload crate's, the node's
    // too: each listed file a regular file, once, its signed size and
    // digest as it is written; anything else skipped, never followed.
    let wanted: Vec<(String, payload::artifact::Artifact)> =
        listed.iter().map(|(n, a)| (n.clone(), a.clone())).collect();
    let mut found = std::collections::BTreeSet::new();
    with_layer(store, layer, diff_id, cap, &over, work, |r| {
        let mut open = |name: &str| -> Result<Box<dyn io::Write>> {
            let to = staging.join(name);
            let f = File::create(&to).with_context(|| format!("creating {}", to.display()))?;
            Ok(Box::new(io::BufWriter::with_capacity(1 << 16, f)))
        };
        let staged = payload::layer::stage_files(r, &wanted, &mut open)
            .map_err(|e| layer_error(e, "the layer").context("refusing the image"))?;
        for name in staged.keys() {
            let to = staging.join(name);
            File::open(&to)
                .and_then(|f| f.sync_all())
                .with_context(|| format!("flushing {}", to.display()))?;
            found.insert(name.clone());
        }
        Ok(())
    })
    .with_context(|| format!("reading the payload layer ({})", layer.digest))?;
    let missing: Vec<String> = listed
        .keys()
        .filter(|n| !found.contains(*n))
        .map(|n| format!("{INSTALLER_PAYLOAD_DIR}/{n}"))
        .collect();
    if !missing.is_empty() {
        bail!(
            "the payload layer has no {}, which the signed manifest lists: the image is \
             incomplete",
            missing.join(", ")
        );
    }
    Ok(())
}

/// At most 64 characters of untrusted bytes, quoted and escaped
/// ([`contract::text::quote`]), for a message.
fn sanitize(bytes: &[u8]) -> String {
    contract::text::quote(&String::from_utf8_lossy(bytes), 64)
}

/// Opens `layer`, decompressed, at most `cap` unpacked bytes (more fails
/// with `over()`), and gives it to `read`. When `read` succeeds, reads the
/// rest of the layer (within the cap) and checks the blob's digest and the
/// layer's `diff_id`; when it fails, checks the blob's digest only (so that
/// a corrupt image is reported as such) without unpacking more.
fn with_layer(
    store: &Store,
    layer: &Descriptor,
    diff_id: &str,
    cap: u64,
    over: &dyn Fn() -> String,
    work: &Work,
    read: impl FnOnce(&mut dyn Read) -> Result<()>,
) -> Result<()> {
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
            "layer {} has media type {}: only tar layers, uncompressed or compressed with \
             gzip or zstd, are supported",
            layer.digest,
            sanitize(other.as_bytes())
        ),
    };
    let mut outer = HashingReader::new(store.open(layer)?);
    work.layers.set(work.layers.get() + 1);
    let (done, diff) = {
        let inner: Box<dyn Read + '_> = match compression {
            Compression::None => Box::new(&mut outer),
            Compression::Gzip => Box::new(flate2::read::GzDecoder::new(&mut outer)),
            Compression::Zstd => Box::new(zstd::Decoder::new(&mut outer).context("starting zstd")?),
        };
        let inner = Capped {
            inner,
            left: cap,
            over,
            counter: &work.unpacked,
        };
        let mut diff = HashingReader::new(inner);
        match read(&mut diff) {
            // Hash the rest, so that the digests cover every byte.
            Ok(()) => {
                let drained = io::copy(&mut diff, &mut io::sink());
                let (hex, _) = diff.finish();
                (drained.map(|_| ()).map_err(anyhow::Error::from), Some(hex))
            }
            Err(e) => (Err(e), None),
        }
    };
    // The blob's own bytes: at most its size, checked by the caller.
    let drained = io::copy(&mut outer, &mut io::sink());
    let blob = outer.finish();
    // A corrupt blob is reported as such, whatever else it broke.
    check_digest(layer, blob)?;
    drained.with_context(|| format!("reading layer {}", layer.digest))?;
    done.with_context(|| format!("reading layer {}", layer.digest))?;
    if let Some(diff) = diff
        && format!("sha256:{diff}") != diff_id
    {
        bail!(
            "layer {} unpacks to sha256:{diff} but the config's diff_id is {}: the image is \
             corrupt",
            layer.digest,
            sanitize(diff_id.as_bytes())
        );
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
    fn open(&self, d: &Descriptor) -> Result<Box<dyn Read + '_>> {
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
    fn read_json<T: serde::de::DeserializeOwned>(&self, d: &Descriptor, what: &str) -> Result<T> {
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
fn open_regular(path: &Path) -> Result<File> {
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

fn check_layout(layout: Option<&[u8]>, at: &Path) -> Result<()> {
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
fn normalize(path: &str) -> Result<&str, String> {
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

fn read_limited(r: impl Read, what: &str) -> Result<Vec<u8>> {
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

/// A reader that fails, with `over()`, as soon as more than `left` bytes
/// would pass (it never reads more than one byte past the cap), counting
/// what passes in `counter`.
struct Capped<'a, R> {
    inner: R,
    left: u64,
    over: &'a dyn Fn() -> String,
    counter: &'a Cell<u64>,
}

impl<R: Read> Read for Capped<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let most = usize::try_from(self.left.saturating_add(1)).unwrap_or(usize::MAX);
        let n = buf.len().min(most);
        let n = self.inner.read(&mut buf[..n])?;
        self.counter
            .set(self.counter.get().saturating_add(n as u64));
        self.left = self
            .left
            .checked_sub(n as u64)
            .ok_or_else(|| io::Error::other(CapExceeded((self.over)())))?;
        Ok(n)
    }
}

/// The error of a [`Capped`] reader, told apart from the tar crate's.
#[derive(Debug)]
struct CapExceeded(String);

impl std::fmt::Display for CapExceeded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CapExceeded {}

/// The [`CapExceeded`] message in `e` or its sources.
fn find_cap(e: &io::Error) -> Option<String> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = match e.get_ref() {
        Some(inner) => Some(inner),
        None => None,
    };
    while let Some(err) = cur {
        if let Some(cap) = err.downcast_ref::<CapExceeded>() {
            return Some(cap.0.clone());
        }
        if let Some(found) = err.downcast_ref::<io::Error>().and_then(find_cap) {
            return Some(found);
        }
        cur = err.source();
    }
    None
}

/// An error of `payload::layer` reading a layer, told as [`tar_error`]
/// tells an I/O error of the tar crate (our caps, a truncation, a header
/// that does not parse, without the crate's words, which quote the header's
/// bytes); its own messages (a file not as signed, an entry not allowed) and
/// `payload::targuard`'s refusals stay as they are.
fn layer_error(e: anyhow::Error, what: &str) -> anyhow::Error {
    let Some(io) = e.chain().find_map(|c| c.downcast_ref::<io::Error>()) else {
        return e;
    };
    if let Some(cap) = find_cap(io) {
        return anyhow!("{cap}");
    }
    match io.kind() {
        io::ErrorKind::Other | io::ErrorKind::UnexpectedEof => {
            tar_error(io::Error::from(io.kind()), what)
        }
        _ => e,
    }
}

/// An error reading `what` as a tar archive, told without the tar crate's
/// own message, which quotes header fields: given a file that is not a tar
/// at all (a private key, say), it would print its first hundred bytes.
/// Our caps and the system's errors are told as they are.
fn tar_error(e: io::Error, what: &str) -> anyhow::Error {
    if let Some(cap) = find_cap(&e) {
        return anyhow!("{cap}");
    }
    if e.raw_os_error().is_some() {
        return anyhow::Error::new(e).context(format!("reading {what}"));
    }
    match e.kind() {
        io::ErrorKind::UnexpectedEof => {
            anyhow!("{what} ends in the middle of an entry: it is truncated")
        }
        _ => anyhow!(
            "{what} is not a tar archive, or a damaged one (a header does not parse, or the \
             compression is damaged)"
        ),
    }
}

/// A JSON error without the input's bytes: serde quotes the strings it did
/// not expect (in double quotes; backticks quote the schema's field names);
/// those are elided.
fn json_error(e: &serde_json::Error) -> String {
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
