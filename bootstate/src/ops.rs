//! The slot operations, each a sequence of writes ordered so that a power
//! cut before any one of them leaves a disk that boots one of the two
//! versions and whose META describes it (or is reconciled at the next boot
//! by [`assess`]):
//!
//! * [`upgrade`]: the target slot's entries go, then its old files; the new
//!   kernel and initramfs are written beside and read back; META records the
//!   upgrade; last, the target's entry is created with a generation above
//!   every other and boot counting — creating that one file is the switch.
//! * [`rollback`]: META first, then a new entry for the other slot with the
//!   highest generation (the switch), then its older entries go.
//! * [`assess`] (runtime, at boot): records a fallback, or notes a trial.
//! * [`bless`] (runtime, once ready): the blessed entry is created, then the
//!   counting one removed, then META says good.
//!
//! When BOOT carries GRUB's rendering ([`crate::grubenv`]), each keeps it
//! in step (docs/design.md, "Two renderings of one state"): an upgrade takes
//! GRUB off the target first, writes `X/grub.cfg` with the slot's files and
//! arms GRUB's trial after systemd-boot's switch; a rollback switches GRUB
//! after systemd-boot; a blessing and a recorded fallback bring it to the
//! new state (before META for a blessing, after it for a fallback).

use crate::device::Device;
use crate::fat::BootFs;
use crate::fatscan::Scan;
use crate::{grubenv, meta};
use anyhow::{Context, Result, bail};
use contract::boot::{DEFAULT_TRIES, Entry, EntryKind, EntryName, boot_order};
use contract::grubcfg::{self, Tries};
use contract::meta::{Meta, SlotStatus, Tag};
use contract::state::{Assessment, BootState, FallbackReason, Pending, best_entry};
use contract::{Slot, state};
use std::fs::File;
use std::io::{Read, Seek};
use std::path::PathBuf;

/// Largest entry file read.
const ENTRY_LIMIT: u64 = 64 * 1024;
/// Largest UKI entry copied (a rollback or a blessing copies a slot's UKI
/// under its new name, through memory).
pub const UKI_LIMIT: u64 = 256 << 20;
/// Most entry files of ours read (each is read and its files looked up).
const MAX_ENTRIES: usize = 64;

/// A disk's slot state: META decoded and the entries found on BOOT.
#[derive(Debug, Clone)]
pub struct Status {
    pub meta: Meta,
    pub state: BootState,
    /// Our entries on BOOT that systemd-boot would boot: they parse and
    /// their kernel exists (other files in `loader/entries` are ignored).
    pub entries: Vec<EntryName>,
    /// Our entries that systemd-boot passes over (empty: a creation was
    /// cut short; or naming a missing kernel). Removed by the next change.
    pub broken: Vec<EntryName>,
}

impl Status {
    /// The entry systemd-boot boots next, if any.
    pub fn next_boot(&self) -> Option<EntryName> {
        boot_order(&self.entries).first().copied()
    }

    fn next_generation(&self) -> Result<u32> {
        let next = self
            .entries
            .iter()
            .chain(&self.broken)
            .map(|e| e.generation)
            .max()
            .unwrap_or(0)
            + 1;
        if next > contract::boot::MAX_GENERATION {
            bail!(
                "the boot entries have used up their generations ({}): reinstall the disk",
                contract::boot::MAX_GENERATION
            );
        }
        Ok(next)
    }
}

/// Reads META and the entries.
pub fn status<B: Read + Seek, M: Read + Seek>(
    boot: &mut BootFs<B>,
    meta_dev: &mut M,
) -> Result<Status> {
    let (meta, _) = meta::read(meta_dev)?;
    let state = BootState::from_meta(&meta).map_err(anyhow::Error::msg)?;
    let (entries, broken) = read_entries(boot)?;
    Ok(Status {
        meta,
        state,
        entries,
        broken,
    })
}

/// One of our entry files on BOOT, as systemd-boot sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryFile {
    pub name: EntryName,
    /// The file's name as stored on BOOT.
    pub file: String,
    /// The entry, when it parses.
    pub entry: Option<Entry>,
    /// Why systemd-boot passes over it, when it does.
    pub problem: Option<String>,
}

impl EntryFile {
    /// Whether systemd-boot would boot it: the one rule for that.
    pub fn bootable(&self) -> bool {
        self.problem.is_none()
    }
}

/// Our entries on BOOT (other files in `loader/entries` and `EFI/Linux`
/// are not ours), sorted by name, each with what keeps it from booting: it
/// is empty (a creation cut short, removed by the next change), it does not
/// parse, or a file it names is not on BOOT. A UKI entry is bootable when it
/// is not empty (its length is written last); firmware checks the rest.
pub fn entry_files<B: Read + Seek>(boot: &mut BootFs<B>) -> Result<Vec<EntryFile>> {
    let mut files: Vec<(EntryName, String, u64)> = Vec::new();
    for kind in EntryKind::ALL {
        files.extend(boot.list(kind.dir())?.into_iter().filter_map(|f| {
            EntryName::parse(&f.name.to_lowercase())
                .filter(|n| n.kind == kind)
                .map(|n| (n, f.name, f.size))
        }));
    }
    files.sort();
    if files.len() > MAX_ENTRIES {
        bail!(
            "BOOT has {} boot entries of ours, more than the {MAX_ENTRIES} two slots ever need: \
             the disk was tampered with; reinstall it",
            files.len()
        );
    }
    let mut out = Vec::new();
    for (name, file, size) in files {
        let (entry, problem) = if size == 0 {
            (
                None,
                Some(
                    "empty: its creation was cut short; the next upgrade, rollback or blessing \
                     removes it"
                        .to_string(),
                ),
            )
        } else if name.kind == EntryKind::Uki {
            (None, None)
        } else {
            match entry_of(boot, &name) {
                Err(e) => (None, Some(format!("unreadable: {e:#}"))),
                Ok(e) => {
                    let mut missing = Vec::new();
                    let mut bad = Vec::new();
                    for f in [&e.linux, &e.initrd] {
                        if f.is_empty() {
                            continue;
                        }
                        if !crate::fat::valid_path(f) {
                            bad.push(format!("{f:?}"));
                        } else if !boot.exists(f)? {
                            missing.push(format!("/{f}"));
                        }
                    }
                    let problem = if !bad.is_empty() {
                        Some(format!("names {}, not a path on BOOT", bad.join(" and ")))
                    } else {
                        (!missing.is_empty())
                            .then(|| format!("names {}, not on BOOT", missing.join(" and ")))
                    };
                    (Some(e), problem)
                }
            }
        };
        out.push(EntryFile {
            name,
            file,
            entry,
            problem,
        });
    }
    Ok(out)
}

/// Our entries on BOOT, sorted, split into those systemd-boot would boot
/// and the others ([`entry_files`]).
pub fn read_entries<B: Read + Seek>(
    boot: &mut BootFs<B>,
) -> Result<(Vec<EntryName>, Vec<EntryName>)> {
    let (valid, broken): (Vec<EntryFile>, Vec<EntryFile>) = entry_files(boot)?
        .into_iter()
        .partition(EntryFile::bootable);
    Ok((
        valid.into_iter().map(|e| e.name).collect(),
        broken.into_iter().map(|e| e.name).collect(),
    ))
}

/// META with `new` written into it, checked to fit its block: made before
/// an operation's first write, so that a full META refuses it whole.
fn meta_with(st: &Status, new: &BootState) -> Result<Meta> {
    let mut m = st.meta.clone();
    new.write_to(&mut m);
    // Leaving or entering Secure Boot belongs to a pending upgrade: with
    // none, the record goes (a blessing applies it first: see `bless`).
    // So does the root of trust it brings.
    if new.pending.is_none() {
        m.remove(Tag::SecureBootLeaving);
        m.remove(Tag::SecureBootEntering);
        m.remove(Tag::TrustRootNext);
        m.remove(Tag::SecureBootUpdatesNext);
    }
    m.encode_block().map_err(|e| {
        anyhow::anyhow!(
            "META has no room for the new slot state ({e}): nothing was written; reinstall the \
             disk (imager install) to start META afresh"
        )
    })?;
    Ok(m)
}

fn write_state<M: Device>(meta_dev: &mut M, st: &Status, new: &BootState) -> Result<()> {
    meta::write(meta_dev, &meta_with(st, new)?)
}

/// Before a change that creates one entry file of `len` bytes (rollback,
/// blessing): BOOT holds together and has the clusters for it, counting
/// what a reclaim frees; the reclaim is made (its writes are safe at any
/// cut) when it is needed.
fn room_for_an_entry<B: Device>(boot: &mut BootFs<B>, len: u64) -> Result<()> {
    let scan = boot.scan()?.clone();
    let need = clusters(len, scan.cluster_size);
    if scan.room() < need {
        bail!(
            "BOOT is full: there is no room for a boot entry of {} KiB; nothing was written. \
             Remove files from BOOT or reinstall the disk",
            need.div_ceil(1024)
        );
    }
    if u64::from(scan.free) * scan.cluster_size < need {
        boot.reclaim()?;
    }
    Ok(())
}

/// An entry file's bytes: a `.conf` (at most [`ENTRY_LIMIT`]) or a UKI (at
/// most [`UKI_LIMIT`]), to be written again under another name.
fn read_entry<B: Read + Seek>(boot: &mut BootFs<B>, name: &EntryName) -> Result<Vec<u8>> {
    let limit = match name.kind {
        EntryKind::Conf => ENTRY_LIMIT,
        EntryKind::Uki => UKI_LIMIT,
    };
    boot.read(&name.path(), limit)
}

/// A file of the payload: where it is, its SHA-256 (hex) and length.
#[derive(Debug, Clone)]
pub struct PayloadFile {
    pub path: PathBuf,
    pub sha256: String,
    pub len: u64,
}

/// What an upgrade installs into a slot.
#[derive(Debug, Clone)]
pub struct Payload {
    pub version: String,
    /// The signed manifest's security version: recorded in the slot's META
    /// record; the disk's floor rises to it when the slot is blessed.
    pub security_version: u64,
    /// Shown in the entry's title: `<title> <version> (slot B)`.
    pub title: String,
    pub cmdline: String,
    pub kernel: PayloadFile,
    pub initramfs: PayloadFile,
    /// A UKI per slot (its command line names the slot): the slot gets the
    /// UKI as its entry in `EFI/Linux` instead of a `.conf` entry and the
    /// kernel and initramfs files (`contract::boot`, "UKI entries").
    pub ukis: Option<SlotUkis>,
    /// The db certificate (PEM) the payload's UKIs are signed for. On a
    /// disk whose META has [`Tag::SecureBoot`] a payload without it leaves
    /// Secure Boot once it is blessed ([`Tag::SecureBootLeaving`]); the
    /// record itself is never replaced by an upgrade, and added only by
    /// [`upgrade_into_secure_boot`] (through [`Tag::SecureBootEntering`]).
    /// Whether the disk may take the payload is the caller's decision, made
    /// before.
    pub secure_boot: Option<String>,
    /// The root of trust the payload brings (its canonical bytes), which
    /// the disk's root accepted (`payload::trust`): kept in META as
    /// [`Tag::TrustRootNext`] by the upgrade's META write, it becomes the
    /// disk's root ([`Tag::TrustRoot`]) in the blessing's and goes with a
    /// fallback or a rollback. Checking it is the caller's, before.
    pub next_root: Option<Vec<u8>>,
    /// The Secure Boot updates of the payload's version
    /// (`payload::efivar::Record`, as META keeps it): kept as
    /// [`Tag::SecureBootUpdatesNext`] by the upgrade's META write, they
    /// become [`Tag::SecureBootUpdates`] in the blessing's (a version
    /// without updates keeps the disk's) and go with a fallback or a
    /// rollback. An install keeps
    /// them as [`Tag::SecureBootUpdates`] at once. Checking them is the
    /// caller's, before.
    pub secure_boot_updates: Option<String>,
}

/// The UKIs of a payload, one per slot.
#[derive(Debug, Clone)]
pub struct SlotUkis {
    pub a: PayloadFile,
    pub b: PayloadFile,
}

impl SlotUkis {
    pub fn for_slot(&self, slot: Slot) -> &PayloadFile {
        match slot {
            Slot::A => &self.a,
            Slot::B => &self.b,
        }
    }
}

impl Payload {
    pub fn entry(&self, slot: Slot) -> Entry {
        contract::boot::slot_entry(
            slot,
            &self.kernel.sha256,
            &self.initramfs.sha256,
            &self.title,
            &self.version,
            &self.cmdline,
        )
    }
}

/// What an upgrade did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upgraded {
    pub from: Slot,
    pub to: Slot,
    pub from_version: String,
    pub entry: EntryName,
    /// Bytes of boot files written (0 when identical files were there).
    pub bytes_written: u64,
}

fn clusters(len: u64, cluster: u64) -> u64 {
    len.div_ceil(cluster).max(1) * cluster
}

/// What an upgrade does with GRUB's rendering on BOOT, when BOOT has it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GrubRendering {
    /// Kept in step with the new state (the BIOS path goes on booting).
    Keep,
    /// Taken off before the upgrade (entering Secure Boot: UKI slots, which
    /// GRUB cannot run).
    TakeOff,
}

/// An upgrade decided and checked before its first write.
struct UpgradePlan {
    st: Status,
    target: Slot,
    fallback: Slot,
    entry: Entry,
    entry_text: String,
    /// The kind of the new entry: a UKI when the payload has UKIs.
    kind: EntryKind,
    /// The target slot directory's files before the upgrade.
    old_files: Vec<crate::fat::FileInfo>,
    /// Whether BOOT has clusters that no file holds, to free first.
    reclaim: bool,
    /// META as step 4 writes it (it fits).
    new_meta: Meta,
    /// The state META then holds.
    new_state: BootState,
    generation: u32,
    from_version: String,
    /// With GRUB's rendering on BOOT: the target's `X/grub.cfg`.
    grub_slot_cfg: Option<String>,
}

/// Everything an upgrade checks and decides before it writes: the fallback
/// boots, the tries are in range, BOOT holds together and has room, META has
/// room for the new records, a generation is left.
fn plan_upgrade<B: Device, M: Device>(
    boot: &mut BootFs<B>,
    meta_dev: &mut M,
    payload: &Payload,
    tries: u32,
    grub: GrubRendering,
) -> Result<UpgradePlan> {
    let st = status(boot, meta_dev)?;
    let target = st.state.upgrade_target();
    let fallback = target.other();
    if best_entry(&st.entries, fallback).is_none() {
        bail!(
            "slot {fallback}, which must stay bootable during the upgrade, has no boot entry: \
             the disk is not in a state to upgrade (reinstall it with `imager install`)"
        );
    }
    if !(1..=contract::boot::MAX_TRIES).contains(&tries) {
        bail!(
            "tries must be 1 to {}, not {tries}",
            contract::boot::MAX_TRIES
        );
    }
    let entry = payload.entry(target);
    let entry_text = entry.render();
    let kind = match payload.ukis {
        Some(_) => EntryKind::Uki,
        None => EntryKind::Conf,
    };
    // GRUB's rendering, when BOOT has it: ours, and the entry one GRUB can
    // boot as systemd-boot does.
    let grub_slot_cfg = if grub == GrubRendering::Keep && grubenv::installed(boot)? {
        if kind == EntryKind::Uki {
            bail!(
                "BOOT carries GRUB's rendering (the BIOS path), and this payload boots slots \
                 from UKIs, which GRUB cannot run: nothing was written. Upgrade with a payload \
                 without UKIs, or reinstall the disk from the UKI image (`imager install`)"
            );
        }
        if grubenv::read(boot)?.good.is_none() {
            bail!(
                "{} on BOOT was not written by this version of imager: the upgrade would \
                 leave GRUB behind (reinstall the disk with `imager install`)",
                contract::paths::BOOT_GRUB_CFG
            );
        }
        Some(grubcfg::slot_config(target, &entry).map_err(anyhow::Error::msg)?)
    } else {
        None
    };
    // The scan refuses a FAT that contradicts itself (cross-linked files,
    // loops) and counts the clusters a cut upgrade left behind.
    let scan = boot.scan()?.clone();
    let old_files = boot.list(target.name())?;
    let small_files: Vec<&str> = match kind {
        EntryKind::Conf => std::iter::once(entry_text.as_str())
            .chain(grub_slot_cfg.as_deref())
            .collect(),
        EntryKind::Uki => Vec::new(),
    };
    let old_entries = entry_sizes(boot, &st, target)?;
    // What takes room: the slot's files, or its UKI twice (its blessing
    // writes the blessed copy before it removes the counting one).
    let mut room_files = slot_files(payload, &entry);
    if let Some(u) = &payload.ukis {
        let uki = u.for_slot(target);
        if uki.len > UKI_LIMIT {
            bail!(
                "the UKI of slot {target} is {} MiB, more than the {} MiB a blessing or a \
                 rollback copies: nothing was written; make the initramfs smaller",
                uki.len >> 20,
                UKI_LIMIT >> 20
            );
        }
        for copy in ["trial", "blessed"] {
            room_files.push((format!("{}/{copy}", EntryKind::Uki.dir()), uki));
        }
    }
    check_room(
        &scan,
        &old_files,
        old_entries,
        target,
        &room_files,
        &small_files,
    )?;
    let from_version = st.state.version(fallback).to_string();
    let mut new = st.state.clone();
    new.put(
        target,
        SlotStatus::Pending,
        payload.version.clone(),
        payload.security_version,
    );
    new.default = target;
    new.pending = Some(Pending {
        from: fallback,
        to: target,
        from_version: from_version.clone(),
        to_version: payload.version.clone(),
    });
    new.record(format!(
        "upgrade-started from={fallback} to={target} from-version={from_version} to-version={} tries={tries}",
        payload.version
    ));
    let mut new_meta = meta_with(&st, &new)?;
    if st.meta.get(Tag::SecureBoot).is_some() && payload.secure_boot.is_none() {
        new_meta.set(Tag::SecureBootLeaving, "1");
    } else {
        new_meta.remove(Tag::SecureBootLeaving);
    }
    // (Set again by `upgrade_into_secure_boot`, which checks it fits.)
    new_meta.remove(Tag::SecureBootEntering);
    match &payload.next_root {
        Some(root) => new_meta.set(Tag::TrustRootNext, root.as_slice()),
        None => new_meta.remove(Tag::TrustRootNext),
    }
    match &payload.secure_boot_updates {
        Some(u) => new_meta.set(Tag::SecureBootUpdatesNext, u.as_bytes()),
        None => new_meta.remove(Tag::SecureBootUpdatesNext),
    }
    new_meta.encode_block().map_err(|e| {
        anyhow::anyhow!(
            "META has no room for the root of trust or the Secure Boot updates the payload \
             brings ({e}): nothing was written; reinstall the disk (imager install) to start \
             META afresh"
        )
    })?;
    Ok(UpgradePlan {
        new_meta,
        new_state: new,
        grub_slot_cfg,
        generation: st.next_generation()?,
        st,
        target,
        fallback,
        entry,
        entry_text,
        kind,
        old_files,
        reclaim: !scan.lost.is_empty(),
        from_version,
    })
}

/// The files an upgrade writes for `target` before its switch, with their
/// paths on BOOT: the kernel and initramfs of a `.conf` entry; none for a
/// UKI (the UKI is the entry, written at the switch).
fn slot_files<'a>(payload: &'a Payload, entry: &Entry) -> Vec<(String, &'a PayloadFile)> {
    match payload.ukis {
        Some(_) => Vec::new(),
        None => vec![
            (entry.linux.clone(), &payload.kernel),
            (entry.initrd.clone(), &payload.initramfs),
        ],
    }
}

/// The lengths of `target`'s entries on BOOT (they go in an upgrade).
fn entry_sizes<B: Read + Seek>(
    boot: &mut BootFs<B>,
    st: &Status,
    target: Slot,
) -> Result<Vec<u64>> {
    let mut sizes = Vec::new();
    for kind in EntryKind::ALL {
        for f in boot.list(kind.dir())? {
            if st.entries.iter().any(|e| {
                e.slot == target && e.kind == kind && e.file_name() == f.name.to_lowercase()
            }) {
                sizes.push(f.size);
            }
        }
    }
    Ok(sizes)
}

/// Space: what the slot's old files and entries free, and the clusters cut
/// upgrades left behind (reclaimed first), against what comes: the slot's
/// files (`files`, which may reuse an old file of the same name and
/// length), its entry (a small file, or the UKI) and GRUB's `X/grub.cfg`.
fn check_room(
    scan: &Scan,
    old_files: &[crate::fat::FileInfo],
    old_entries: Vec<u64>,
    target: Slot,
    files: &[(String, &PayloadFile)],
    small_files: &[&str],
) -> Result<()> {
    let (free, cluster) = (scan.room(), scan.cluster_size);
    let mut freed: u64 = old_files
        .iter()
        .filter(|f| !files.iter().any(|(p, _)| f.name == file_name(p)))
        .map(|f| clusters(f.size, cluster))
        .sum();
    // (Entries the boot loader passes over go too, but may be empty: not
    // counted.)
    freed += old_entries
        .iter()
        .map(|&len| clusters(len, cluster))
        .sum::<u64>();
    let reused = |name: &str, len: u64| {
        old_files
            .iter()
            .any(|f| f.name == file_name(name) && f.size == len)
    };
    // The entry, and GRUB's `X/grub.cfg` when BOOT has GRUB's rendering.
    let mut needed: u64 = small_files
        .iter()
        .map(|t| clusters(t.len() as u64, cluster))
        .sum();
    for (path, f) in files {
        if !reused(path, f.len) {
            needed += clusters(f.len, cluster);
        }
    }
    if free + freed < needed {
        bail!(
            "BOOT has no room for the new version: it needs {} MiB for slot {target} and has \
             {} MiB free (with slot {target}'s old files counted as free); nothing was written. \
             Make the BOOT partition larger (disk.partitions.BOOT in the profile) and reinstall",
            needed.div_ceil(1 << 20),
            (free + freed) / (1 << 20)
        );
    }
    Ok(())
}

/// Installs `payload` into the slot that is not the fallback and makes it
/// the one tried next, with `tries` boots before systemd-boot falls back.
/// Checks everything it can ([`plan_upgrade`]) before its first write.
pub fn upgrade<B: Device, M: Device>(
    boot: &mut BootFs<B>,
    meta_dev: &mut M,
    payload: &Payload,
    tries: u32,
) -> Result<Upgraded> {
    let plan = plan_upgrade(boot, meta_dev, payload, tries, GrubRendering::Keep)?;
    apply_upgrade(boot, meta_dev, payload, plan, tries)
}

/// What staging an upgrade wrote ([`stage`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Staged {
    /// The slot whose files were written; it boots nothing until armed.
    pub target: Slot,
    pub bytes_written: u64,
}

/// Writes the files of `payload` into the slot an upgrade would take, as
/// the first steps of [`upgrade`] write them (checked before, read back
/// after), without arming it: META and the boot entries of both slots stay
/// as they are, except that the target slot's entries go (it is being
/// rewritten). [`upgrade`] with the same payload later arms it, finding
/// the files in place. A cut anywhere leaves what a cut in those steps of
/// an upgrade leaves: the fallback slot boots.
pub fn stage<B: Device, M: Device>(
    boot: &mut BootFs<B>,
    meta_dev: &mut M,
    payload: &Payload,
) -> Result<Staged> {
    let plan = plan_upgrade(boot, meta_dev, payload, 1, GrubRendering::Keep)?;
    let bytes_written = write_slot_files(boot, payload, &plan)?;
    Ok(Staged {
        target: plan.target,
        bytes_written,
    })
}

/// Steps 0 to 3 of an upgrade `plan`: the target slot's old entries and
/// files go, its new files are written and read back against the signed
/// digests. Returns the bytes of files written.
fn write_slot_files<B: Device>(
    boot: &mut BootFs<B>,
    payload: &Payload,
    plan: &UpgradePlan,
) -> Result<u64> {
    let (target, fallback) = (plan.target, plan.fallback);
    let files = slot_files(payload, &plan.entry);
    let mut bytes_written = 0;
    // 0. Clusters that no file holds (left by cut upgrades) are freed.
    if plan.reclaim {
        boot.reclaim()?;
    }
    // 1. The target's entries: the slot stops being bootable. And entries
    //    the boot loader passes over anyway. GRUB first: off the target,
    //    on the fallback.
    let st = &plan.st;
    if plan.grub_slot_cfg.is_some() {
        grubenv::sync(boot, &st.state, Tries::Disarm)?;
    }
    for e in st
        .entries
        .iter()
        .filter(|e| e.slot == target)
        .chain(&st.broken)
    {
        boot.remove(&e.path())?;
    }
    boot.ensure_dir(target.name())?;
    if plan.kind == EntryKind::Uki {
        boot.ensure_dir("EFI")?;
        boot.ensure_dir(EntryKind::Uki.dir())?;
    }
    // 2. Its old files, and new-named files that are not what we expect.
    for f in &plan.old_files {
        let path = format!("{}/{}", target.name(), f.name);
        let keep = match files.iter().find(|(p, _)| **p == path) {
            Some((_, pf)) => f.size == pf.len && boot.hash(&path)?.0 == pf.sha256,
            None => false,
        };
        if !keep {
            boot.remove(&path)?;
        }
    }
    // 3. The new files, then read back against the signed digests.
    for (path, pf) in &files {
        if !boot.exists(path)? {
            let mut src =
                File::open(&pf.path).with_context(|| format!("opening {}", pf.path.display()))?;
            boot.create(path, &mut src, pf.len)?;
            bytes_written += pf.len;
        }
        let (sha, len) = boot.hash(path)?;
        if sha != pf.sha256 || len != pf.len {
            bail!(
                "{path} on BOOT reads back as sha256 {sha} ({len} bytes), not the signed \
                 {} ({} bytes): the disk does not keep what is written to it; the upgrade \
                 stopped before switching, slot {fallback} still boots",
                pf.sha256,
                pf.len
            );
        }
    }
    //    GRUB's lines for the slot, beside its files.
    if let Some(g) = &plan.grub_slot_cfg {
        boot.create(
            &grubcfg::slot_config_path(target),
            &mut g.as_bytes(),
            g.len() as u64,
        )?;
    }
    Ok(bytes_written)
}

/// The writes of an upgrade `plan`, in their order (docs/design.md).
fn apply_upgrade<B: Device, M: Device>(
    boot: &mut BootFs<B>,
    meta_dev: &mut M,
    payload: &Payload,
    plan: UpgradePlan,
    tries: u32,
) -> Result<Upgraded> {
    let (target, fallback) = (plan.target, plan.fallback);
    let mut bytes_written = write_slot_files(boot, payload, &plan)?;
    // 4. META: the intent, before the switch.
    meta::write(meta_dev, &plan.new_meta)?;
    // 5. The switch: the new entry, generation above all. A UKI is read
    //    back after it: when it does not read back as signed, it is
    //    removed again (until then the slot's tries run out on it).
    let name = EntryName::trial(plan.generation, target, tries).of_kind(plan.kind);
    match &payload.ukis {
        None => {
            let text = plan.entry_text.as_bytes();
            boot.create(&name.path(), &mut &text[..], text.len() as u64)?;
        }
        Some(ukis) => {
            let pf = ukis.for_slot(target);
            let mut src =
                File::open(&pf.path).with_context(|| format!("opening {}", pf.path.display()))?;
            boot.create(&name.path(), &mut src, pf.len)?;
            bytes_written += pf.len;
            let (sha, len) = boot.hash(&name.path())?;
            if sha != pf.sha256 || len != pf.len {
                boot.remove(&name.path())?;
                bail!(
                    "{} on BOOT read back as sha256 {sha} ({len} bytes), not the signed {} \
                     ({} bytes): the disk does not keep what is written to it; the entry was \
                     removed again, slot {fallback} still boots",
                    name.path(),
                    pf.sha256,
                    pf.len
                );
            }
        }
    }
    // 6. GRUB's switch: its block names the target with the same tries.
    if plan.grub_slot_cfg.is_some() {
        grubenv::sync(boot, &plan.new_state, Tries::Arm(tries))?;
    }
    Ok(Upgraded {
        from: fallback,
        to: target,
        from_version: plan.from_version,
        entry: name,
        bytes_written,
    })
}

fn file_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// What a rollback did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RolledBack {
    pub from: Slot,
    pub to: Slot,
    pub version: String,
    pub entry: EntryName,
}

/// Makes the other slot the default. A slot known to be bad is refused
/// unless `force`; it then gets boot counting, so that it falls back again
/// if it still fails. A slot whose security version is below the disk's
/// floor is refused unless `allow_downgrade` (an admin's, for this one
/// rollback: [`contract::version::check_security`]).
pub fn rollback<B: Device, M: Device>(
    boot: &mut BootFs<B>,
    meta_dev: &mut M,
    force: bool,
    allow_downgrade: bool,
) -> Result<RolledBack> {
    rollback_checked(boot, meta_dev, force, allow_downgrade, &|_, _| Ok(()))
}

/// [`rollback`], the slot's UKI (when it boots from one) first given to
/// `check_uki` with META: an error refuses the rollback before any write
/// (firmware would refuse a UKI that the disk's Secure Boot updates revoke:
/// `payload::secureboot::check_rollback`).
pub fn rollback_checked<B: Device, M: Device>(
    boot: &mut BootFs<B>,
    meta_dev: &mut M,
    force: bool,
    allow_downgrade: bool,
    check_uki: &dyn Fn(&Meta, &[u8]) -> Result<()>,
) -> Result<RolledBack> {
    let st = status(boot, meta_dev)?;
    // The slot that boots now, as the entries say: after a rollback cut
    // between its META write and its entry, running it again must not
    // reverse it.
    let from = st.next_boot().map_or(st.state.default, |e| e.slot);
    let to = from.other();
    let status = st.state.status(to);
    match status {
        SlotStatus::Empty => bail!("slot {to} is empty: there is nothing to roll back to"),
        SlotStatus::Bad | SlotStatus::Pending if !force => bail!(
            "slot {to} ({}) is marked {}: it failed to boot or never booted; pass --force to \
             try it anyway (it gets {DEFAULT_TRIES} tries, then slot {from} boots again)",
            st.state.version(to),
            status.name()
        ),
        _ => {}
    }
    contract::version::check_security(
        st.state.security_floor,
        st.state.security(to),
        allow_downgrade,
    )
    .map_err(|why| {
        anyhow::anyhow!(
            "slot {to} ({}): {why}; nothing was written",
            st.state.version(to)
        )
    })?;
    let Some(current) = best_entry(&st.entries, to) else {
        bail!("slot {to} has no boot entry: it cannot be booted");
    };
    let text = read_entry(boot, &current)?;
    if current.kind == EntryKind::Uki {
        check_uki(&st.meta, &text).map_err(|e| {
            e.context(format!(
                "slot {to} ({}) cannot be rolled back to; nothing was written",
                st.state.version(to)
            ))
        })?;
    }
    if current.kind == EntryKind::Conf {
        let text = std::str::from_utf8(&text).context("slot entry is not UTF-8")?;
        let e = Entry::parse(text).map_err(anyhow::Error::msg)?;
        for f in [&e.linux, &e.initrd] {
            if !f.is_empty() && !boot.exists(f)? {
                bail!("slot {to}'s entry names {f}, which is not on BOOT: it cannot be booted");
            }
        }
    }
    let trial = status != SlotStatus::Good;
    let mut new = st.state.clone();
    new.default = to;
    if let Some(p) = new.pending.take() {
        // Rolling back an upgrade still on trial abandons it.
        new.set(p.to, SlotStatus::Bad, p.to_version.clone());
    }
    if trial {
        new.set(to, SlotStatus::Pending, st.state.version(to));
        new.pending = Some(Pending {
            from,
            to,
            from_version: st.state.version(from).to_string(),
            to_version: st.state.version(to).to_string(),
        });
    }
    new.record(format!(
        "rollback from={from} to={to} version={} forced={}",
        st.state.version(to),
        if force { "yes" } else { "no" }
    ));
    let mut new_meta = meta_with(&st, &new)?;
    // A rollback abandons an upgrade that was leaving or entering Secure
    // Boot, and the root of trust it brought.
    new_meta.remove(Tag::SecureBootLeaving);
    new_meta.remove(Tag::SecureBootEntering);
    new_meta.remove(Tag::TrustRootNext);
    new_meta.remove(Tag::SecureBootUpdatesNext);
    let generation = st.next_generation()?;
    room_for_an_entry(boot, text.len() as u64)?;
    let grub = grubenv::installed(boot)?;
    if grub {
        check_grub(boot, to)?;
    }
    meta::write(meta_dev, &new_meta)?;
    let name = if trial {
        EntryName::trial(generation, to, DEFAULT_TRIES)
    } else {
        EntryName::good(generation, to)
    }
    .of_kind(current.kind);
    boot.create(&name.path(), &mut &text[..], text.len() as u64)?;
    if grub {
        let tries = if trial {
            Tries::Arm(DEFAULT_TRIES)
        } else {
            Tries::Keep
        };
        grubenv::sync(boot, &new, tries)?;
    }
    // Then the slot's older entries, and those systemd-boot passes over.
    for old in st.entries.iter().filter(|e| e.slot == to).chain(&st.broken) {
        boot.remove(&old.path())?;
    }
    Ok(RolledBack {
        from,
        to,
        version: st.state.version(to).to_string(),
        entry: name,
    })
}

/// Before a rollback to `to` on a BOOT with GRUB's rendering: it is ours,
/// and `to` has its `X/grub.cfg`.
fn check_grub<B: Device>(boot: &mut BootFs<B>, to: Slot) -> Result<()> {
    if grubenv::read(boot)?.good.is_none() {
        bail!(
            "{} on BOOT was not written by this version of imager: the rollback would leave \
             GRUB behind (reinstall the disk with `imager install`)",
            contract::paths::BOOT_GRUB_CFG
        );
    }
    if !boot.exists(&grubcfg::slot_config_path(to))? {
        bail!(
            "slot {to} has no {}: GRUB (the BIOS path) cannot boot it",
            grubcfg::slot_config_path(to)
        );
    }
    Ok(())
}

/// What the runtime found at boot, once recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BootOutcome {
    /// Nothing to record.
    Steady,
    /// A trial boot: [`bless`] it once the checks pass.
    Trial,
    /// The upgrade to `failed` did not make it; this slot runs.
    FellBack {
        failed: Slot,
        version: String,
        reason: FallbackReason,
    },
    /// META's default followed the entries to this slot.
    DefaultMoved,
}

/// At boot of `booted`: reads the state and records what the boot means
/// ([`contract::state::assess`]); a fallback is written to META at once.
pub fn assess<B: Device, M: Device>(
    boot: &mut BootFs<B>,
    meta_dev: &mut M,
    booted: Slot,
) -> Result<BootOutcome> {
    let st = status(boot, meta_dev)?;
    let a = state::assess(&st.state, &st.entries, booted);
    record(boot, meta_dev, &st, a, booted)
}

/// What a boot under GRUB finished (beside what [`assess`] records).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GrubOutcome {
    /// Recorded as under systemd-boot.
    As(BootOutcome),
    /// GRUB's trial armed: an upgrade's switch cut between the two loaders
    /// is finished; the next boot tries the new slot.
    SwitchFinished { slot: Slot, tries: u32 },
    /// GRUB's rendering brought to META (a rollback cut between the two
    /// loaders); META unchanged.
    FollowedMeta,
    /// The slot on trial was blessed in systemd-boot's entries: its
    /// blessing finished (META, GRUB); the next boot is on it.
    BlessingFinished(Blessed),
}

/// At boot of `booted` by GRUB (`machined.trial` on the command line; BOOT
/// carries GRUB's rendering): [`contract::grubcfg::assess_grub`] recorded.
/// A switch cut between the two loaders is finished, never undone
/// (docs/design.md, "Two renderings of one state").
pub fn assess_grub<B: Device, M: Device>(
    boot: &mut BootFs<B>,
    meta_dev: &mut M,
    booted: Slot,
) -> Result<GrubOutcome> {
    let st = status(boot, meta_dev)?;
    let view = grubenv::read(boot)?;
    Ok(
        match grubcfg::assess_grub(&st.state, &st.entries, view.env, booted) {
            grubcfg::GrubAssessment::As(a) => {
                GrubOutcome::As(record(boot, meta_dev, &st, a, booted)?)
            }
            grubcfg::GrubAssessment::FinishSwitch { tries } => {
                let s = grubenv::sync(boot, &st.state, Tries::Arm(tries))?;
                let slot = s.rendering.env.trial.map_or(booted, |t| t.slot);
                GrubOutcome::SwitchFinished { slot, tries }
            }
            grubcfg::GrubAssessment::FollowMeta => {
                grubenv::sync(boot, &st.state, Tries::Keep)?;
                GrubOutcome::FollowedMeta
            }
            grubcfg::GrubAssessment::FinishBlessing { slot } => {
                let version = st.state.version(slot).to_string();
                GrubOutcome::BlessingFinished(bless(boot, meta_dev, slot, &version)?)
            }
        },
    )
}

/// Records assessment `a` of a boot of `booted`: a fallback or a moved
/// default in META, then the renderings follow.
fn record<B: Device, M: Device>(
    boot: &mut BootFs<B>,
    meta_dev: &mut M,
    st: &Status,
    a: Assessment,
    booted: Slot,
) -> Result<BootOutcome> {
    let mut new = st.state.clone();
    match a {
        // GRUB's rendering follows META at every boot (a rollback cut
        // between the two loaders' switches is finished here).
        Assessment::Steady => {
            sync_grub(boot, &st.state)?;
            Ok(BootOutcome::Steady)
        }
        Assessment::Trial { .. } => {
            sync_grub(boot, &st.state)?;
            Ok(BootOutcome::Trial)
        }
        Assessment::FellBack {
            failed,
            version,
            reason,
        } => {
            let (status, why) = match reason {
                FallbackReason::TriesExhausted { tries } => {
                    (SlotStatus::Bad, format!("tries-exhausted tries={tries}"))
                }
                FallbackReason::NotSwitched => (SlotStatus::Empty, "not-switched".to_string()),
                FallbackReason::Abandoned => (SlotStatus::Bad, "abandoned".to_string()),
            };
            new.set(failed, status, version.clone());
            new.default = booted;
            new.pending = None;
            new.record(format!(
                "upgrade-failed slot={failed} version={version} reason={why} running={booted}"
            ));
            write_state(meta_dev, st, &new)?;
            // Not to be tried again behind our back: an abandoned slot's
            // entries, and entries of the failed slot that still have
            // tries (its tries ran out under GRUB, not systemd-boot).
            for e in st.entries.iter().filter(|e| {
                e.slot == failed && (reason == FallbackReason::Abandoned || !e.is_exhausted())
            }) {
                boot.remove(&e.path())?;
            }
            sync_grub(boot, &new)?;
            Ok(BootOutcome::FellBack {
                failed,
                version,
                reason,
            })
        }
        Assessment::DefaultMoved => {
            new.default = booted;
            new.record(format!("default-moved slot={booted}"));
            write_state(meta_dev, st, &new)?;
            sync_grub(boot, &new)?;
            Ok(BootOutcome::DefaultMoved)
        }
    }
}

/// GRUB's rendering, when BOOT has it, brought to `state` (after META).
fn sync_grub<B: Device>(boot: &mut BootFs<B>, state: &BootState) -> Result<()> {
    if grubenv::installed(boot)? {
        grubenv::sync(boot, state, Tries::Keep)?;
    }
    Ok(())
}

/// What [`bless`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blessed {
    pub slot: Slot,
    pub version: String,
    /// The version it replaced as default, when an upgrade succeeded.
    pub from_version: Option<String>,
}

/// Once a trial boot of `booted` (running `version`) passed its checks:
/// the entry loses its counter (new name written, then the counting one
/// removed), then META marks the slot good and clears the upgrade.
pub fn bless<B: Device, M: Device>(
    boot: &mut BootFs<B>,
    meta_dev: &mut M,
    booted: Slot,
    version: &str,
) -> Result<Blessed> {
    let st = status(boot, meta_dev)?;
    let from_version = st
        .state
        .pending
        .as_ref()
        .filter(|p| p.to == booted)
        .map(|p| p.from_version.clone());
    let mut new = st.state.clone();
    new.set(booted, SlotStatus::Good, version);
    new.raise_floor(booted);
    new.default = booted;
    new.pending = None;
    new.record(match &from_version {
        Some(f) => format!("upgrade-succeeded slot={booted} version={version} from-version={f}"),
        None => format!("blessed slot={booted} version={version}"),
    });
    let mut new_meta = meta_with(&st, &new)?;
    // An upgrade that left Secure Boot succeeded: the disk no longer has it.
    if from_version.is_some() && st.meta.get(Tag::SecureBootLeaving).is_some() {
        new_meta.remove(Tag::SecureBoot);
    }
    // One that entered it succeeded: the disk has it, for the certificate
    // the new version is signed for.
    if let Some(db) = st
        .meta
        .get(Tag::SecureBootEntering)
        .filter(|_| from_version.is_some())
    {
        new_meta.set(Tag::SecureBoot, db.as_bytes());
    }
    // One that brought a root of trust succeeded: it is the disk's root.
    if let Some(root) = st
        .meta
        .get(Tag::TrustRootNext)
        .filter(|_| from_version.is_some())
    {
        meta::set_root(&mut new_meta, root.as_bytes());
    }
    // The blessed version's Secure Boot updates replace the disk's; a
    // version without any keeps the last ones (firmware keeps what they
    // revoked, and upgrades are checked against them).
    if from_version.is_some()
        && let Some(u) = st.meta.tags.get(&(Tag::SecureBootUpdatesNext as u32))
    {
        new_meta.set(Tag::SecureBootUpdates, u.clone());
    }
    let mut redone = None;
    if let Some(counting) = best_entry(&st.entries, booted).filter(|e| e.tries.is_some()) {
        let good = counting.blessed();
        if !st.entries.contains(&good) {
            let text = read_entry(boot, &counting)?;
            room_for_an_entry(boot, text.len() as u64)?;
            // An empty file of that name is a blessing cut short: redo it.
            if st.broken.contains(&good) {
                boot.remove(&good.path())?;
                redone = Some(good);
            }
            boot.create(&good.path(), &mut &text[..], text.len() as u64)?;
        }
    }
    // Every counting entry of this slot goes, also one left behind by a
    // blessing cut short (systemd-boot would keep trying it), and the
    // entries systemd-boot passes over.
    let stale = st
        .entries
        .iter()
        .filter(|e| e.slot == booted && e.tries.is_some())
        .chain(st.broken.iter().filter(|e| Some(**e) != redone));
    for e in stale {
        boot.remove(&e.path())?;
    }
    sync_grub(boot, &new)?;
    meta::write(meta_dev, &new_meta)?;
    Ok(Blessed {
        slot: booted,
        version: version.to_string(),
        from_version,
    })
}

/// Reads the kernel and initramfs hashes named by a slot's entry, for
/// checks (`imager inspect`).
pub fn entry_of<B: Read + Seek>(boot: &mut BootFs<B>, name: &EntryName) -> Result<Entry> {
    let text = boot.read(&name.path(), ENTRY_LIMIT)?;
    Entry::parse(&String::from_utf8_lossy(&text)).map_err(anyhow::Error::msg)
}

mod secureboot;
#[cfg(test)]
mod tests;

pub use secureboot::{upgrade_into_secure_boot, upgrade_with_loader};
