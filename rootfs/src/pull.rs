//! The node's own upgrade (docs/node-api.md, "Upgrades over the API"):
//! the installer image pulled from its registry, never held in memory and
//! never run, its payload verified before anything is written to the disk.
//!
//! 1. The image manifest (bounded; checked against the reference's digest
//!    when it names one); its first layer must hold only the payload's
//!    signed manifest and signature (`usr/install/amd64/manifest.json` and
//!    `.sig`, each bounded), which are verified against META's trusted keys,
//!    and the manifest's name against META's image name, before any other
//!    layer is read.
//! 2. The second layer is streamed: each file the signed manifest lists for
//!    a slot (kernel, initramfs, the slots' UKIs; for Secure Boot the db
//!    certificate, the updates and the signed boot loader) is written into the
//!    staging directory on EPHEMERAL while it is hashed, and must be
//!    exactly the signed size and digest; other files are skipped. The
//!    layer is read to its end, which verifies its digest
//!    ([`registry::Client::blob`]).
//! 3. Only then is the disk written, by [`bootstate::ops::upgrade`] as
//!    `imager upgrade` writes it (files read back against the signed
//!    digests, META's intent, the switch with boot counting); on a Secure
//!    Boot disk by [`bootstate::ops::upgrade_with_loader`], which first
//!    replaces the ESP's boot loader when the payload's differs.
//!
//! A cut connection, a tampered layer or a refusal before step 3 leaves
//! the slots as they were (the staging directory is emptied at the next
//! pull).

use anyhow::{Context, Result, bail, ensure};
use bootstate::ops::{Payload, PayloadFile, SlotUkis};
use contract::Slot;
use contract::meta::{Meta, Tag};
use contract::paths;
use payload::artifact::Kind;
use payload::layer::{LAYER_TAR, MANIFEST_LAYER, MAX_LAYERS, MAX_SMALL, PAYLOAD_LAYER};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Where a pulled payload is staged: on EPHEMERAL, never in memory.
pub const STAGING_DIR: &str = "/var/lib/machined/upgrade";

/// What a pull is asked for, and its bounds. Owned: a pull runs in a
/// thread of its own, which the operation waiting for it can leave (a
/// cancel, the deadline) without waiting for a stalled read.
pub struct Pull {
    pub image: String,
    /// The version the signed payload must be (`contract::version`).
    pub version: Option<String>,
    /// A lower security version is allowed this once.
    pub allow_downgrade: bool,
    /// Registries reached over plain HTTP (`machined.plain_http=`).
    pub plain_http: Vec<String>,
    /// The whole pull ends by `started + deadline`.
    pub started: Instant,
    pub deadline: Duration,
    /// A read that waits this long for a byte ends the pull.
    pub stall: Duration,
    /// Set by a cancel: the pull's next read ends it.
    pub cancel: Arc<AtomicBool>,
    /// The operator's credentials for the image's registry (from the
    /// request: in memory only, for this pull).
    pub credentials: Option<registry::Credentials>,
}

/// The registry credentials of a request (their shape checked by
/// [`nodeapi::proto::PullCredentials::check`] when it was parsed, their
/// values by the registry client's own rules here).
pub fn credentials(c: &nodeapi::proto::PullCredentials) -> Result<registry::Credentials> {
    let made = match (&c.username, &c.password, &c.identity_token) {
        (Some(u), Some(p), _) => registry::Credentials::basic(u, p),
        (_, _, Some(t)) => registry::Credentials::identity_token(t),
        _ => Ok(registry::Credentials::Anonymous),
    };
    made.map_err(|e| anyhow::anyhow!("{e}"))
}

/// How the node reaches a registry: its CA (META's `registry-ca`, else the
/// Mozilla roots), names through its settings' host entries then the DNS
/// servers it uses (its settings' or DHCP's), never through the system
/// (a static binary has no resolver).
fn reach(meta: &Meta, registry_host: &str) -> (Option<Vec<u8>>, registry::dns::Resolver) {
    let settings = contract::settings::Settings::from_meta(meta).unwrap_or_default();
    let mut hosts = std::collections::BTreeMap::new();
    for (name, addr) in settings.hosts {
        hosts.entry(name).or_insert_with(Vec::new).push(addr);
    }
    let resolver = registry::dns::Resolver {
        hosts,
        servers: crate::net::dns_servers()
            .into_iter()
            .map(|a| std::net::SocketAddr::from((a, 53)))
            .collect(),
        timeout: DNS_TIMEOUT,
        // The registry the operator named may be anywhere; its redirects
        // and token realm may not be this machine or link-local.
        trusted_names: vec![registry_host.to_ascii_lowercase()],
    };
    let ca = meta.get(Tag::RegistryCa).map(|p| p.as_bytes().to_vec());
    (ca, resolver)
}

/// Each DNS try's wait (two tries per server, at most three servers).
const DNS_TIMEOUT: Duration = Duration::from_secs(3);

/// A verified payload, staged on EPHEMERAL.
pub struct Staged {
    pub payload: Payload,
    /// A Secure Boot payload's signed boot loader.
    pub loader: Option<PayloadFile>,
    pub key_id: String,
    /// The image manifest's digest.
    pub digest: String,
    /// The payload's SOURCE_DATE_EPOCH (the date of the files on BOOT).
    pub epoch: u64,
}

/// Pulls and verifies the installer image of `pull` against `meta`
/// (trusted keys, image name), staging its payload in `staging`; `say`
/// gets each step.
pub fn pull(
    pull: &Pull,
    meta: &Meta,
    staging: &Path,
    say: &mut dyn FnMut(&str, String),
) -> Result<Staged> {
    let reference = registry::Reference::parse(&pull.image)
        .map_err(|e| anyhow::anyhow!("{e}"))
        .context("the image reference")?;
    let root = payload::trust::disk_root(meta)?;
    let host = reference.registry();
    let host = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => host.rsplit_once(':').map_or(host, |(h, _)| h),
    };
    let (ca_pem, resolver) = reach(meta, host);
    let credentials = match &pull.credentials {
        Some(c) => [(reference.registry().to_string(), c.clone())].into(),
        None => Default::default(),
    };
    let client = registry::Client::new(registry::Options {
        plain_http: pull.plain_http.clone(),
        own_addresses: crate::net::own_addresses(),
        read_timeout: pull.stall,
        deadline: Some(pull.deadline),
        ca_pem,
        resolver: Some(resolver),
        credentials,
        ..Default::default()
    })
    .map_err(|e| anyhow::anyhow!("{e}"))
    .context("the registry CA certificates in META (registry-ca)")?;

    say("pull", format!("reading the manifest of {reference}"));
    let image = client
        .manifest(&reference)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    ensure!(
        image.layers.len() > PAYLOAD_LAYER && image.layers.len() <= MAX_LAYERS,
        "{reference} has {} layers: an installer image has 2 to {MAX_LAYERS} (is it one, built \
         by `imager build --profile installer`?)",
        image.layers.len()
    );
    for i in [MANIFEST_LAYER, PAYLOAD_LAYER] {
        let l = &image.layers[i];
        ensure!(
            l.media_type == LAYER_TAR,
            "layer {i} of {reference} is {}, not an uncompressed tar: push the installer image \
             with `skopeo copy --preserve-digests` (docs/registry.md)",
            l.media_type
        );
    }

    // 1. The signed manifest, alone in the first layer, verified first.
    let first = &image.layers[MANIFEST_LAYER];
    ensure!(
        first.size <= MAX_SMALL,
        "the first layer of {reference} is {} bytes: it must hold only the payload's signed \
         manifest",
        first.size
    );
    let blob = client
        .blob(&reference, first)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut quiet = |_| {};
    let blob = Watched::new(blob, pull, first.size, &mut quiet);
    let files = payload::layer::signed_manifest(blob, contract::Arch::NATIVE)
        .with_context(|| format!("reading the signed manifest of {reference}"))?;
    let trusted = payload::trust::verify(&root, &files)?;
    let key = trusted.signers.join(", ");
    let manifest = trusted.manifest;
    let asked = payload::verify::Asked {
        version: pull.version.as_deref(),
        allow_downgrade: pull.allow_downgrade,
    };
    payload::verify::check_for_disk(meta, contract::Arch::NATIVE, &manifest, asked)
        .with_context(|| reference.to_string())?;
    // A disk with Secure Boot and a payload without, or the reverse: known
    // before a byte of the payload is pulled (moving in or out is `imager
    // upgrade --change-secure-boot`'s, never the API's).
    let disk_db = meta.get(Tag::SecureBoot);
    payload::secureboot::check_manifest(disk_db, &manifest, false)
        .with_context(|| reference.to_string())?;
    // The step a client that does not wait returns at
    // (`nodeapi::proto::ACCEPTED`).
    say(
        nodeapi::proto::ACCEPTED,
        format!(
            "{} {} signed by {key}, as this node's root of trust {} asks{}: accepted; pulling \
             its payload",
            manifest.name,
            manifest.version,
            root.version,
            match &trusted.next_root {
                Some(r) => format!(" (it brings root {}, taken once it is blessed)", r.version),
                None => String::new(),
            }
        ),
    );

    // 2. The listed files, streamed to EPHEMERAL and checked.
    let wanted = payload::layer::slot_files(&manifest)?;
    reset_dir(staging)?;
    let second = &image.layers[PAYLOAD_LAYER];
    say(
        "pull",
        format!("streaming the payload ({} bytes)", second.size),
    );
    let blob = client
        .blob(&reference, second)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let total = second.size;
    let mut progress = |done: u64| {
        say(
            "pull",
            format!(
                "{:.1} of {:.1} MiB of the payload",
                done as f64 / 1048576.0,
                total as f64 / 1048576.0
            ),
        )
    };
    let blob = Watched::new(blob, pull, total, &mut progress);
    let mut open = |name: &str| -> Result<Box<dyn std::io::Write>> {
        let dest = staging.join(name);
        let f =
            std::fs::File::create(&dest).with_context(|| format!("creating {}", dest.display()))?;
        Ok(Box::new(std::io::BufWriter::with_capacity(1 << 16, f)))
    };
    let written = payload::layer::stage_files(blob, contract::Arch::NATIVE, &wanted, &mut open)
        .with_context(|| format!("streaming the payload of {reference}; nothing was written"))?;
    // On the disk before BOOT is written from them.
    let mut staged = std::collections::BTreeMap::new();
    for (name, f) in written {
        let path = staging.join(&name);
        std::fs::File::open(&path)
            .and_then(|f| f.sync_all())
            .with_context(|| format!("flushing {}", path.display()))?;
        staged.insert(
            name,
            PayloadFile {
                path,
                sha256: f.sha256,
                len: f.len,
            },
        );
    }
    for (name, _) in &wanted {
        ensure!(
            staged.contains_key(name),
            "{reference}'s payload lacks {name}, which its signed manifest lists; nothing was \
             written"
        );
    }
    say(
        "verify",
        format!(
            "{} files staged on EPHEMERAL, each its signed size and digest",
            staged.len()
        ),
    );
    let boot = manifest.boot.clone().context(
        "the payload manifest has no `boot` section: it was made by an older imager; rebuild \
         the installer",
    )?;
    let mut take = |kind: Kind| -> Result<PayloadFile> {
        let name = wanted
            .iter()
            .find(|(_, a)| a.kind == kind)
            .map(|(n, _)| n.clone())
            .with_context(|| format!("the payload manifest lists no {}", kind.name()))?;
        staged
            .remove(&name)
            .with_context(|| format!("{name} was not staged"))
    };
    let kernel = take(Kind::Kernel)?;
    let initramfs = take(Kind::Initramfs)?;
    // Secure Boot: the UKIs must verify with the db certificate META
    // records (the one the firmware trusts), as `imager upgrade` checks.
    let db = if wanted.iter().any(|(_, a)| a.kind == Kind::SecureBootDb) {
        let f = take(Kind::SecureBootDb)?;
        let pem =
            std::fs::read(&f.path).with_context(|| format!("reading {}", f.path.display()))?;
        Some(String::from_utf8(pem).context("the payload's db certificate is not PEM text")?)
    } else {
        None
    };
    // (Its signed boot loader, which replaces the ESP's when it differs.)
    let loader = match &db {
        Some(_) => Some(take(Kind::BootLoader)?),
        None => None,
    };
    let ukis = match (
        staged.remove(paths::output::uki(Slot::A)),
        staged.remove(paths::output::uki(Slot::B)),
    ) {
        (Some(a), Some(b)) => Some(SlotUkis { a, b }),
        (None, None) => None,
        _ => bail!("the payload has the UKI of one slot but not the other: rebuild the installer"),
    };
    let signed = payload::secureboot::Signed {
        db: db.as_deref(),
        loader: loader.as_ref().map(|l| l.path.as_path()),
        ukis: ukis
            .as_ref()
            .map(|u| [u.a.path.as_path(), u.b.path.as_path()]),
    };
    payload::secureboot::check_disk_dbx(meta.get(Tag::SecureBootUpdates), signed)
        .with_context(|| reference.to_string())?;
    let decided = payload::secureboot::check(disk_db, signed, false)
        .with_context(|| reference.to_string())?;
    // Its Secure Boot updates, which must not revoke its own UKIs.
    let mut updates = Vec::new();
    for (name, a) in wanted
        .iter()
        .filter(|(_, a)| a.kind == Kind::SecureBootUpdate)
    {
        let f = staged
            .remove(name)
            .with_context(|| format!("{name} was not staged"))?;
        let bytes = payload::trust::read_bounded(&f.path, a.size)?
            .with_context(|| format!("{name} was not staged"))?;
        updates.push((name.clone(), bytes));
    }
    let secure_boot_updates =
        payload::secureboot::updates(&manifest.version, updates, signed.loader, signed.ukis)
            .with_context(|| format!("{reference}'s Secure Boot updates; nothing was written"))?
            .map(|r| r.to_meta());
    if decided == payload::secureboot::Move::Keep {
        say(
            "verify",
            "both UKIs and the boot loader are signed by a db key this disk's firmware trusts"
                .to_string(),
        );
    }
    Ok(Staged {
        payload: Payload {
            version: manifest.version.clone(),
            security_version: manifest.security_version,
            title: boot.title,
            cmdline: boot.cmdline,
            kernel,
            initramfs,
            ukis,
            secure_boot: db,
            next_root: trusted
                .next_root
                .as_ref()
                .map(payload::root::Root::to_bytes),
            secure_boot_updates,
        },
        loader,
        key_id: key,
        digest: image.digest.to_string(),
        epoch: manifest.source_date_epoch,
    })
}

/// A layer being read, watched: each read first checks the pull's cancel
/// flag and deadline (the registry client bounds each request's time and
/// each read's wait, [`registry::Options`]), and progress (bytes done) is
/// reported at most every [`nodeapi::proto::PROGRESS_EVERY`].
struct Watched<'a, R> {
    inner: R,
    pull: &'a Pull,
    done: u64,
    total: u64,
    said: Instant,
    progress: &'a mut dyn FnMut(u64),
}

impl<'a, R: Read> Watched<'a, R> {
    fn new(inner: R, pull: &'a Pull, total: u64, progress: &'a mut dyn FnMut(u64)) -> Self {
        Watched {
            inner,
            pull,
            done: 0,
            total,
            said: Instant::now(),
            progress,
        }
    }
}

impl<R: Read> Read for Watched<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.pull.cancel.load(Ordering::SeqCst) {
            return Err(std::io::Error::other("the pull was cancelled"));
        }
        if self.pull.started.elapsed() > self.pull.deadline {
            return Err(std::io::Error::other(past_deadline(self.pull.deadline)));
        }
        let n = self.inner.read(buf)?;
        self.done += n as u64;
        if self.said.elapsed() >= nodeapi::proto::PROGRESS_EVERY || self.done == self.total {
            (self.progress)(self.done);
            self.said = Instant::now();
        }
        Ok(n)
    }
}

/// What a pull past its deadline says (the reader's and the operation's
/// watch alike).
pub fn past_deadline(deadline: Duration) -> String {
    format!(
        "the pull took longer than its deadline of {} s",
        deadline.as_secs()
    )
}

/// Empties (or makes) the staging directory.
fn reset_dir(dir: &Path) -> Result<()> {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("emptying {}", dir.display())),
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))
}

/// The staging directory of pull number `n` of this boot: each pull has
/// its own, so that one a cancel left behind (it ends at its next read)
/// never writes into the next one's. Those of earlier pulls are removed
/// when a pull starts ([`remove_stale`]), but for `keep` (the staged
/// upgrade's, still to be armed).
pub fn staging_dir(n: u64) -> PathBuf {
    PathBuf::from(STAGING_DIR).join(format!("pull-{n}"))
}

/// Removes the staging directories of earlier pulls but `keep`; errors
/// are ignored (a directory a pull still writes into goes, and that pull
/// fails at its next write, as it should).
pub fn remove_stale(keep: Option<&Path>) {
    let Ok(dir) = std::fs::read_dir(STAGING_DIR) else {
        return;
    };
    for e in dir.flatten() {
        let path = e.path();
        if Some(path.as_path()) != keep {
            let _ = std::fs::remove_dir_all(&path).or_else(|_| std::fs::remove_file(&path));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pull(deadline: Duration) -> Pull {
        Pull {
            image: "r/i:1".into(),
            version: None,
            allow_downgrade: false,
            plain_http: Vec::new(),
            started: Instant::now(),
            deadline,
            stall: Duration::from_secs(30),
            cancel: Arc::new(AtomicBool::new(false)),
            credentials: None,
        }
    }

    /// The node API and the registry client bound credentials alike.
    #[test]
    fn one_bound_for_credentials() {
        assert_eq!(
            nodeapi::proto::MAX_CREDENTIAL,
            registry::auth::MAX_CREDENTIAL
        );
    }

    /// A watched layer reports progress, and stops at its next read once
    /// cancelled or past its deadline.
    #[test]
    fn a_watched_layer_stops_when_cancelled_or_late() {
        let p = pull(Duration::from_secs(60));
        let data = vec![7u8; 300_000];
        let mut seen = Vec::new();
        let mut progress = |done| seen.push(done);
        let mut w = Watched::new(&data[..], &p, data.len() as u64, &mut progress);
        let mut buf = [0u8; 100_000];
        assert_eq!(w.read(&mut buf).unwrap(), 100_000);
        p.cancel.store(true, Ordering::SeqCst);
        let e = w.read(&mut buf).unwrap_err();
        assert!(e.to_string().contains("cancelled"), "{e}");
        p.cancel.store(false, Ordering::SeqCst);
        let mut rest = Vec::new();
        w.read_to_end(&mut rest).unwrap();
        assert_eq!(rest.len(), 200_000);
        assert_eq!(seen.last(), Some(&300_000), "the end is reported");

        // Started 2 s ago with a deadline of 1 s.
        let mut late = pull(Duration::from_secs(1));
        late.started = Instant::now().checked_sub(Duration::from_secs(2)).unwrap();
        let mut quiet = |_| {};
        let mut w = Watched::new(&data[..], &late, 1, &mut quiet);
        let e = w.read(&mut buf).unwrap_err();
        assert!(e.to_string().contains("deadline of 1 s"), "{e}");
    }
}
