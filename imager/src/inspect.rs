//! `imager inspect`: what is on an image, read back from the image itself
//! through `bootstate` (the partition table, BOOT's entries, META and the
//! slot state), with the disk locked shared so that no install, upgrade or
//! rollback changes it meanwhile. It keeps no parser of its own: what it
//! calls a bootable entry is what the installer and the runtime call one.

use crate::sign;
use anyhow::Result;
use bootstate::disk::{Access, Disk};
use bootstate::fat::BootFs;
use bootstate::gpt::TableCopy;
use bootstate::ops::{self, EntryFile};
use contract::Slot;
use contract::boot::{EntryName, boot_order, slot_of_entry};
use contract::meta::Meta;
use contract::state::{BootState, best_entry};
use serde::Serialize;
use std::path::Path;

#[derive(Debug, Serialize)]
pub struct PartitionInfo {
    pub number: u32,
    pub name: String,
    pub type_guid: String,
    pub unique_guid: String,
    pub first_lba: u64,
    pub last_lba: u64,
}

#[derive(Debug, Serialize)]
pub struct EntryInfo {
    pub slot: String,
    pub file: String,
    pub title: String,
    pub version: String,
    pub linux: String,
    pub initrd: String,
    pub options: String,
    /// Whether the kernel and initramfs the entry names exist on BOOT.
    pub files_present: bool,
    /// Whether systemd-boot would boot it (the rule the installer and the
    /// runtime apply).
    pub bootable: bool,
    /// Why it would not boot: empty (a creation cut short), unreadable, or
    /// naming a file that is not on BOOT.
    pub problem: Option<String>,
}

/// One slot as the slot model and the boot entries describe it.
#[derive(Debug, Serialize)]
pub struct SlotInfo {
    pub slot: String,
    /// `empty`, `good`, `pending` or `bad` (META).
    pub status: String,
    pub version: String,
    /// The slot's entry that systemd-boot would pick, if any.
    pub entry: Option<String>,
    /// Boot counting of that entry: tries left and done (null: not counting).
    pub tries_left: Option<u32>,
    pub tries_done: Option<u32>,
    /// META names it the default slot.
    pub default: bool,
    /// systemd-boot boots it next (first in its order).
    pub boots_next: bool,
}

#[derive(Debug, Serialize)]
pub struct SlotsInfo {
    pub default: Option<String>,
    pub boots_next: Option<String>,
    /// The upgrade on trial, as META records it.
    pub pending_upgrade: Option<String>,
    pub slots: Vec<SlotInfo>,
    /// Upgrade and rollback history, oldest first.
    pub history: Vec<String>,
    /// Key ids of the keys of the disk's root of trust
    /// (`payload::trust::disk_root`: META's `trust-root`, or its
    /// `trusted-keys` as root 1 with threshold 1).
    pub trusted_keys: Vec<String>,
    /// The root of trust's version and how many of its keys must sign.
    pub trust_root: Option<(u64, usize)>,
    /// The version of the root a pending upgrade brings, taken when it is
    /// blessed.
    pub trust_root_next: Option<u64>,
    /// Why the disk's root of trust could not be read, if it could not.
    pub trust_root_error: Option<String>,
    /// Why the slot model could not be read, if it could not.
    pub error: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct MetaInfo {
    /// Which copy was valid (0 or 1), or null when neither was.
    pub valid_copy: Option<usize>,
    pub error: Option<String>,
    pub keys: Vec<(String, String)>,
}

#[derive(Debug, Serialize)]
pub struct ManifestInfo {
    pub path: String,
    /// Whether a public key was found to check it with.
    pub checked: bool,
    pub verified: bool,
    /// Whether the manifest lists this image with its current digest.
    pub lists_image: bool,
    pub detail: String,
}

/// Which copy of the partition table was read.
#[derive(Debug, Serialize)]
pub struct TableInfo {
    /// `primary`, or `backup` when the primary is damaged.
    pub copy: String,
    /// What is wrong with the primary, when the backup was read.
    pub primary_error: Option<String>,
}

/// The BIOS path: what the MBR's boot code loads (`bootstate::bios::inspect`).
#[derive(Debug, Serialize)]
pub struct BiosInfo {
    /// `grub` (GRUB's boot.img pointing to core.img in the BIOS partition),
    /// `none` (no boot code: the disk boots under UEFI only), or `invalid`.
    pub boot_code: String,
    /// Sectors of core.img its blocklist loads, with GRUB.
    pub core_sectors: Option<u64>,
    /// Whether the protective MBR's entry is marked active.
    pub boot_flag: Option<bool>,
    /// What is wrong, when `invalid`.
    pub error: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub image: String,
    pub size: u64,
    pub sector_size: u64,
    pub disk_guid: String,
    /// Whether the disk has GUIDs of its own (an install, or a disk that
    /// has booted), not the image's own, which every disk written from the
    /// built image as it is carries until its first boot
    /// ([`contract::guid::is_derived`]).
    pub own_guids: bool,
    pub partition_table: TableInfo,
    /// Why BOOT could not be read, when it could not (its entries are then
    /// unknown).
    pub boot_error: Option<String>,
    pub partitions: Vec<PartitionInfo>,
    pub bios: BiosInfo,
    pub loader_default: Option<String>,
    pub entries: Vec<EntryInfo>,
    pub slots: SlotsInfo,
    pub meta: MetaInfo,
    pub manifest: Option<ManifestInfo>,
}

/// Reads everything `inspect` shows.
///
/// A qcow2, zstd or xz image is first unpacked into a sparse temporary
/// copy ([`crate::disk::compress::Unpacked`]), read and removed; the
/// manifest is looked for beside `image` itself.
pub fn inspect(image: &Path, key: Option<&Path>) -> Result<Report> {
    let unpacked = crate::disk::compress::Unpacked::open(image)?;
    if unpacked.is_copy() {
        eprintln!(
            "inspect: {} read through the sparse temporary copy {} (removed after)",
            image.display(),
            unpacked.path.display()
        );
    }
    let disk = Disk::open(&unpacked.path, Access::Read)?;
    let table = &disk.table;
    let partitions = table
        .partitions
        .iter()
        .map(|p| PartitionInfo {
            number: p.index as u32 + 1,
            name: p.label.clone(),
            type_guid: p.type_guid.hyphenated().to_string(),
            unique_guid: p.unique_guid.hyphenated().to_string(),
            first_lba: p.first_lba,
            last_lba: p.last_lba,
        })
        .collect();

    let bios = bios_info(&unpacked.path, table);
    let loader_default = disk
        .partition(contract::partition::esp_role(disk.table.sector_size))
        .ok()
        .and_then(|w| {
            BootFs::new(w, 0)
                .read(contract::paths::ESP_LOADER_CONF, 64 * 1024)
                .ok()
        })
        .and_then(|b| {
            String::from_utf8_lossy(&b)
                .lines()
                .find_map(|l| l.strip_prefix("default ").map(|d| d.trim().to_string()))
        });

    let (entries, boot_error) = match disk
        .boot(0)
        .and_then(|mut boot| ops::entry_files(&mut boot))
    {
        Ok(files) => (files.iter().filter_map(entry_info).collect(), None),
        Err(e) => (Vec::new(), Some(format!("{e:#}"))),
    };

    let (meta, decoded) = match disk.meta().and_then(|mut w| bootstate::meta::read(&mut w)) {
        Ok((m, copy)) => (
            MetaInfo {
                valid_copy: Some(copy),
                error: None,
                keys: m
                    .entries()
                    .into_iter()
                    .filter(|(k, _)| {
                        !["history", "trusted-keys", "trust-root", "trust-root-next"]
                            .contains(&k.as_str())
                    })
                    .collect(),
            },
            Some(m),
        ),
        Err(e) => (
            MetaInfo {
                valid_copy: None,
                error: Some(format!("{e:#}")),
                keys: Vec::new(),
            },
            None,
        ),
    };
    let slots = slots_info(decoded.as_ref(), &entries);

    let manifest = manifest_status(image, key);
    Ok(Report {
        image: image.display().to_string(),
        size: table.disk_size,
        sector_size: table.sector_size,
        disk_guid: table.disk_guid.hyphenated().to_string(),
        own_guids: !contract::guid::is_derived(table.disk_guid),
        partition_table: TableInfo {
            copy: match table.source {
                TableCopy::Primary => "primary",
                TableCopy::Backup => "backup",
            }
            .to_string(),
            primary_error: table.primary_error.clone(),
        },
        boot_error,
        partitions,
        bios,
        loader_default,
        entries,
        slots,
        meta,
        manifest,
    })
}

/// What the MBR and the BIOS partition hold for the BIOS path.
fn bios_info(image: &Path, table: &bootstate::gpt::Table) -> BiosInfo {
    use bootstate::bios::Installed;
    let read = std::fs::File::open(image)
        .map_err(anyhow::Error::from)
        .and_then(|mut f| bootstate::bios::inspect(&mut f, table));
    match read {
        Ok(Installed::None) => BiosInfo {
            boot_code: "none".into(),
            core_sectors: None,
            boot_flag: None,
            error: None,
        },
        Ok(Installed::Grub {
            core_sectors,
            active,
        }) => BiosInfo {
            boot_code: "grub".into(),
            core_sectors: Some(core_sectors),
            boot_flag: Some(active),
            error: None,
        },
        Err(e) => BiosInfo {
            boot_code: "invalid".into(),
            core_sectors: None,
            boot_flag: None,
            error: Some(format!("{e:#}")),
        },
    }
}

/// An entry file as inspect shows it.
fn entry_info(f: &EntryFile) -> Option<EntryInfo> {
    let slot = slot_of_entry(&f.file.to_lowercase())?;
    let mut e = f.entry.clone().unwrap_or_default();
    let uki = f.name.kind == contract::boot::EntryKind::Uki;
    if uki {
        // A UKI is its own kernel, initramfs and command line.
        e.linux = format!("{}/{}", f.name.kind.dir(), f.file);
    }
    Some(EntryInfo {
        slot: slot.to_string(),
        file: f.file.clone(),
        title: e.title,
        version: e.version,
        linux: e.linux,
        initrd: e.initrd,
        options: e.options,
        files_present: (uki || f.entry.is_some()) && f.bootable(),
        bootable: f.bootable(),
        problem: f.problem.clone(),
    })
}

/// The slot model of META, with what the boot entries add (tries, order).
fn slots_info(meta: Option<&Meta>, entries: &[EntryInfo]) -> SlotsInfo {
    let mut info = SlotsInfo {
        default: None,
        boots_next: None,
        pending_upgrade: None,
        slots: Vec::new(),
        history: Vec::new(),
        trusted_keys: Vec::new(),
        trust_root: None,
        trust_root_next: None,
        trust_root_error: None,
        error: None,
    };
    let Some(meta) = meta else {
        info.error = Some("META is invalid".into());
        return info;
    };
    let state = match BootState::from_meta(meta) {
        Ok(s) => s,
        Err(e) => {
            info.error = Some(e);
            return info;
        }
    };
    let names: Vec<EntryName> = entries
        .iter()
        .filter(|e| e.bootable)
        .filter_map(|e| EntryName::parse(&e.file.to_lowercase()))
        .collect();
    let next = boot_order(&names).first().map(|e| e.slot);
    info.default = Some(state.default.to_string());
    info.boots_next = next.map(|s| s.to_string());
    info.pending_upgrade = state.pending.as_ref().map(|p| p.render());
    info.history = state.history.clone();
    match payload::trust::disk_root(meta) {
        Ok(root) => {
            info.trusted_keys = root.keys.iter().map(sign::key_id).collect();
            info.trust_root = Some((root.version, root.threshold));
        }
        Err(e) => info.trust_root_error = Some(format!("{e:#}")),
    }
    info.trust_root_next = meta
        .get(contract::meta::Tag::TrustRootNext)
        .and_then(|r| payload::root::Root::parse(r.as_bytes()).ok())
        .map(|r| r.version);
    for slot in Slot::ALL {
        let best = best_entry(&names, slot);
        info.slots.push(SlotInfo {
            slot: slot.to_string(),
            status: state.status(slot).name().to_string(),
            version: state.version(slot).to_string(),
            entry: best.map(|e| e.file_name()),
            tries_left: best.and_then(|e| e.tries).map(|t| t.left),
            tries_done: best.and_then(|e| e.tries).map(|t| t.done),
            default: state.default == slot,
            boots_next: next == Some(slot),
        });
    }
    info
}

fn manifest_status(image: &Path, key: Option<&Path>) -> Option<ManifestInfo> {
    let dir = image
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let path = dir.join(contract::paths::output::MANIFEST);
    if !path.is_file() {
        return None;
    }
    let key = key
        .map(Path::to_path_buf)
        .or_else(|| sign::dev_key_for(image, &path));
    let mut info = ManifestInfo {
        path: path.display().to_string(),
        checked: false,
        verified: false,
        lists_image: false,
        detail: String::new(),
    };
    let image_name = image.file_name().map(|n| n.to_string_lossy().into_owned());
    let Some(key) = key else {
        info.detail = "no public key is known for it: pass --key PUB to check it".into();
        return Some(info);
    };
    info.checked = true;
    match sign::load_public_key(&key).and_then(|k| sign::verify(&path, &k)) {
        Ok(report) => {
            info.verified = report.ok;
            info.lists_image = report
                .artifacts
                .iter()
                .any(|a| Some(&a.path) == image_name.as_ref() && a.is_ok());
            info.detail = if report.ok {
                format!(
                    "signed by {}, checked with {}",
                    report.key_id,
                    key.display()
                )
            } else {
                format!("{} artifact problem(s); run imager verify", report.problems)
            };
        }
        Err(e) => info.detail = format!("{e:#}"),
    }
    Some(info)
}

/// Prints the report; returns the exit code: 0, or 1 when META or BOOT
/// cannot be read, or the manifest beside the image was checked and does not
/// verify or does not list it.
pub fn run(image: &Path, key: Option<&Path>, json: bool) -> Result<i32> {
    let r = inspect(image, key)?;
    let code = i32::from(
        r.meta.valid_copy.is_none()
            || r.boot_error.is_some()
            || r.bios.error.is_some()
            || r.manifest
                .as_ref()
                .is_some_and(|m| m.checked && !(m.verified && m.lists_image)),
    );
    if json {
        println!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(code);
    }
    print_table(&r);
    print_entries(&r);
    let sl = &r.slots;
    println!(
        "\nslots (default {}, boots next {}):",
        sl.default.as_deref().unwrap_or("?"),
        sl.boots_next.as_deref().unwrap_or("nothing")
    );
    if let Some(e) = &sl.error {
        println!("  unreadable: {e}");
    }
    for s in &sl.slots {
        let tries = match (s.tries_left, s.tries_done) {
            (Some(l), Some(d)) => format!(", {l} tries left ({d} done)"),
            _ => String::new(),
        };
        println!(
            "  {}  {:<8} {:<12} {}{}",
            s.slot,
            s.status,
            if s.version.is_empty() {
                "-".to_string()
            } else {
                contract::text::escape(&s.version)
            },
            contract::text::escape(s.entry.as_deref().unwrap_or("no entry")),
            tries
        );
    }
    println!(
        "  pending upgrade: {}",
        sl.pending_upgrade.as_deref().unwrap_or("none")
    );
    match sl.trust_root {
        Some((version, threshold)) => println!(
            "  root of trust: version {version}, {threshold} of {}: {}{}",
            sl.trusted_keys.len(),
            sl.trusted_keys.join(", "),
            match sl.trust_root_next {
                Some(n) => format!(" (root {n} once the pending upgrade is blessed)"),
                None => String::new(),
            }
        ),
        None => println!(
            "  root of trust: none ({})",
            contract::text::escape(sl.trust_root_error.as_deref().unwrap_or("unknown"))
        ),
    }
    println!("  history:");
    for h in &sl.history {
        println!("    {}", contract::text::escape(h));
    }
    match (&r.meta.valid_copy, &r.meta.error) {
        (Some(c), _) => println!("\nMETA (copy {c} valid):"),
        (None, e) => println!("\nMETA: INVALID: {}", e.as_deref().unwrap_or("")),
    }
    // Values from the disk, escaped: a PEM's line breaks show as `\n`.
    for (k, v) in &r.meta.keys {
        println!("  {k} = {}", contract::text::escape(v));
    }
    match &r.manifest {
        None => println!("\nmanifest: none beside the image"),
        Some(m) => println!(
            "\nmanifest {}: {}{}",
            m.path,
            if !m.checked {
                "NOT CHECKED"
            } else if m.verified && m.lists_image {
                "verifies and lists this image"
            } else if m.verified {
                "verifies but does not list this image as it is"
            } else {
                "DOES NOT VERIFY"
            },
            if m.detail.is_empty() {
                String::new()
            } else {
                format!(" ({})", m.detail)
            }
        ),
    }
    Ok(code)
}

/// The disk and its partitions, for people.
fn print_table(r: &Report) {
    println!(
        "image {} ({} bytes, {}-byte sectors, disk GUID {}: {})",
        r.image,
        r.size,
        r.sector_size,
        r.disk_guid,
        if r.own_guids {
            "its own"
        } else {
            "the image's own; its first boot gives it its own"
        }
    );
    println!("\npartitions:");
    println!(
        "  #  {:<10} {:<36} {:>10} {:>10}",
        "name", "type GUID", "first LBA", "last LBA"
    );
    for p in &r.partitions {
        println!(
            "  {}  {:<10} {:<36} {:>10} {:>10}",
            p.number, p.name, p.type_guid, p.first_lba, p.last_lba
        );
    }
    if let Some(e) = &r.partition_table.primary_error {
        println!("\nthe primary partition table is damaged ({e}): the backup was read");
    }
    let b = &r.bios;
    match (b.boot_code.as_str(), b.core_sectors, &b.error) {
        ("grub", Some(n), _) => println!(
            "\nBIOS boot: GRUB (core image of {n} sectors in BIOS{})",
            if b.boot_flag == Some(true) {
                ", boot flag set"
            } else {
                ""
            }
        ),
        (_, _, Some(e)) => println!("\nBIOS boot: INVALID: {e}"),
        _ => println!("\nBIOS boot: none (no boot code in the MBR: UEFI only)"),
    }
}

/// The boot entries of each slot, for people.
fn print_entries(r: &Report) {
    println!("\nboot entries (systemd-boot boots the first of its order):");
    if let Some(e) = &r.boot_error {
        println!("  BOOT UNREADABLE: {e}");
    }
    for slot in contract::Slot::ALL {
        let mut any = false;
        for e in r.entries.iter().filter(|e| e.slot == slot.name()) {
            any = true;
            if let Some(p) = e.problem.as_ref().filter(|_| e.title.is_empty()) {
                println!("  slot {}: {} ({p})", e.slot, e.file);
                continue;
            }
            println!(
                "  slot {}: {} version {} linux /{} initrd /{}{}",
                e.slot,
                e.file,
                e.version,
                e.linux,
                e.initrd,
                match &e.problem {
                    Some(p) => format!(" (WILL NOT BOOT: {p})"),
                    None => String::new(),
                }
            );
            println!("          options {}", e.options);
        }
        if !any {
            println!("  slot {}: empty", slot.name());
        }
    }
}
