//! Reads an installer image back: an OCI archive (or an OCI image layout
//! directory) with one image of tar layers, or an index with one per
//! architecture of which the caller's is taken, uncompressed, gzip
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

use super::store::{
    Descriptor, ImageConfig, ImageManifest, Store, check_config_arch, check_digest, digest_hex,
    sanitize, select_image,
};
use super::{MANIFEST_LAYER, MAX_LAYERS, PAYLOAD_LAYER};
use super::{MEDIA_TYPE_LAYER, MEDIA_TYPE_LAYER_GZIP, MEDIA_TYPE_LAYER_ZSTD};
use crate::io::HashingReader;
use crate::sign::{self, Manifest};
use anyhow::{Context, Result, anyhow, bail};
use contract::Arch;
use contract::paths::{PAYLOAD_FILES, PAYLOAD_MANIFEST, PAYLOAD_SIGNATURE, installer_payload_dir};
use payload::trust::TrustFiles;
use std::cell::Cell;
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

/// Docker's layer media types, which skopeo may write when it copies an
/// image.
const DOCKER_LAYER: &str = "application/vnd.docker.image.rootfs.diff.tar";
const DOCKER_LAYER_GZIP: &str = "application/vnd.docker.image.rootfs.diff.tar.gzip";
/// Index, manifest and config are small JSON documents, and the first layer
/// holds two small files: larger, compressed or not, is not an installer
/// image, and is refused before it is read.
pub const MAX_SMALL: u64 = 1 << 20;
/// What the tar format adds to the payload files in the payload layer
/// (headers, padding, directories, the end marker), at most.
pub(super) const TAR_ALLOWANCE: u64 = 64 << 10;
/// The most one payload file may be, whatever its signed manifest declares.
const MAX_PAYLOAD_FILE: u64 = 1 << 30;

/// Decides whether the payload's manifest is trusted: given the bytes of
/// `manifest.json`, `manifest.json.sig` and the trust files from the
/// image, returns the manifest decoded from those very bytes, or why it is
/// not trusted (for the installer: not signed as the disk's root of trust
/// asks, `payload::trust`). Called before anything large is read.
pub type Verifier<'a> = &'a dyn Fn(&TrustFiles) -> Result<Manifest>;

/// What reading an image cost, for tests that show the work is bounded:
/// the bytes that came out of layers (decompressed) and the layers
/// unpacked (decompressed; the others' blobs are only hashed).
#[derive(Debug, Default)]
pub(super) struct Work {
    pub unpacked: Cell<u64>,
    pub layers: Cell<usize>,
}

/// Extracts the installer payload of `arch` from an OCI archive (or an OCI
/// image layout directory) into `dest` and returns the directory that holds
/// `vmlinuz`, `initramfs.zst`, `manifest.json` and `manifest.json.sig`
/// (`dest`), and whatever else the signed manifest lists.
///
/// The manifest and its signature are read first, with bounded work, and
/// given to `verify`; only when it accepts them is the payload read, and
/// only the files the manifest lists, each checked against the size and
/// digest it declares. Files appear in `dest` only when all of them checked
/// out.
///
/// An image of another architecture, or an index without one of `arch`,
/// is refused before any layer is read.
///
/// Given a directory that already holds the four payload files, returns it
/// unchanged: the caller verifies it (`sign::verify`), as it would any
/// payload directory.
pub fn extract_payload(
    archive: &Path,
    dest: &Path,
    arch: Arch,
    verify: Verifier,
) -> Result<PathBuf> {
    extract_counted(archive, dest, arch, verify, &Work::default())
}

/// [`extract_payload`], counting its work in `work`.
pub(super) fn extract_counted(
    archive: &Path,
    dest: &Path,
    arch: Arch,
    verify: Verifier,
    work: &Work,
) -> Result<PathBuf> {
    let what = archive.display();
    let meta = std::fs::metadata(archive).with_context(|| format!("reading {what}"))?;
    if meta.is_dir() {
        if PAYLOAD_FILES.iter().all(|f| archive.join(f).is_file()) {
            return Ok(archive.to_path_buf());
        }
        if !archive.join("index.json").is_file() {
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
    }
    let (store, index) = Store::open_path(archive)?;
    extract_from(&store, &index, dest, arch, verify, work)
        .with_context(|| format!("extracting the payload of {what}"))
}

fn extract_from(
    store: &Store,
    index: &[u8],
    dest: &Path,
    arch: Arch,
    verify: Verifier,
    work: &Work,
) -> Result<PathBuf> {
    let image = select_image(store, index, Some(arch))?;
    let image = &image;
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
    check_config_arch(&config, arch)?;
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
    let signed = read_signed(store, layer0, diff0, arch, work)?;
    let trusted = verify(&signed).context(
        "refusing the installer image before unpacking its payload: its signed manifest \
         (in the first layer) is not trusted",
    )?;
    // The platform is the image's word, unsigned; the signed manifest's
    // architecture is what counts.
    let signed_arch = trusted.arch()?;
    if signed_arch != arch {
        bail!(
            "the signed payload manifest is for {signed_arch} but the image says {arch}: \
             refusing it; nothing was written"
        );
    }
    let listed = listed_files(&trusted)?;

    std::fs::create_dir_all(dest).with_context(|| format!("creating {}", dest.display()))?;
    let staging = tempfile::Builder::new()
        .prefix(".payload.")
        .suffix(".partial")
        .tempdir_in(dest)
        .with_context(|| format!("creating a temporary directory in {}", dest.display()))?;
    let (layer1, diff1) = layer(PAYLOAD_LAYER);
    extract_listed(store, layer1, diff1, arch, &listed, staging.path(), work)?;
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
    let mut signed = signed;
    let mut written = vec![
        (PAYLOAD_MANIFEST, std::mem::take(&mut signed.manifest)),
        (PAYLOAD_SIGNATURE, std::mem::take(&mut signed.signature)),
    ];
    written.extend(signed.take_named());
    for (name, bytes) in written {
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

/// Reads the first layer, which must hold `manifest.json` and
/// `manifest.json.sig` of the payload directory: at most [`MAX_SMALL`]
/// bytes, compressed and unpacked.
pub(super) fn read_signed(
    store: &Store,
    layer: &Descriptor,
    diff_id: &str,
    arch: Arch,
    work: &Work,
) -> Result<TrustFiles> {
    let first = "the image's first layer";
    let over = || {
        format!(
            "{first} is larger than {MAX_SMALL} bytes, but it must hold only the payload's signed \
             manifest, its signature and trust files: refusing the image before its signature is checked (not \
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
        signed = Some(payload::layer::signed_manifest(r, arch).map_err(|e| {
            let e = layer_error(e, "the layer");
            if format!("{e:#}").contains("lacks") {
                e.context(
                    "an installer image keeps its payload's signed manifest, signature and \
                     trust files in its first layer, alone (not an installer image, or one made by an older \
                     imager: rebuild it with `imager build --profile installer`)",
                )
            } else {
                e
            }
        })?);
        Ok(())
    })
    .with_context(|| format!("reading {first} ({})", layer.digest))?;
    signed.with_context(|| format!("{first} was not read"))
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
    arch: Arch,
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
        let staged = payload::layer::stage_files(r, arch, &wanted, &mut open)
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
        .map(|n| format!("{}/{n}", installer_payload_dir(arch)))
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
pub(super) fn tar_error(e: io::Error, what: &str) -> anyhow::Error {
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
