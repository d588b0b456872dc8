//! `imager inspect`: what is on an image, read back from the image itself.

use crate::{disk, sign};
use anyhow::{Context, Result};
use contract::PartitionRole;
use contract::Slot;
use contract::boot::{Entry, EntryName, boot_order, slot_of_entry};
use contract::meta::Meta;
use contract::state::{BootState, best_entry};
use serde::Serialize;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

#[derive(clap::Args, Debug)]
pub struct InspectArgs {
    /// Raw disk image.
    pub image: PathBuf,
    /// Public key to check the manifest beside the image with (default: the
    /// development key, out/keys/dev.pub, if it exists).
    #[arg(long)]
    pub key: Option<PathBuf>,
    /// Print one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
}

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
    /// Key ids of the keys the installer accepts for this disk.
    pub trusted_keys: Vec<String>,
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
    pub verified: bool,
    /// Whether the manifest lists this image with its current digest.
    pub lists_image: bool,
    pub detail: String,
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub image: String,
    pub size: u64,
    pub sector_size: u64,
    pub disk_guid: String,
    pub partitions: Vec<PartitionInfo>,
    pub loader_default: Option<String>,
    pub entries: Vec<EntryInfo>,
    pub slots: SlotsInfo,
    pub meta: MetaInfo,
    pub manifest: Option<ManifestInfo>,
}

/// Reads everything `inspect` shows.
pub fn inspect(image: &Path, key: Option<&Path>) -> Result<Report> {
    let table = disk::read_table(image).context("reading the partition table")?;
    let mut f = File::open(image).with_context(|| format!("opening {}", image.display()))?;
    let size = f.metadata()?.len();
    let partitions = table
        .partitions
        .iter()
        .enumerate()
        .map(|(i, p)| PartitionInfo {
            number: i as u32 + 1,
            name: p.label.clone(),
            type_guid: p.type_guid.hyphenated().to_string(),
            unique_guid: p.unique_guid.hyphenated().to_string(),
            first_lba: p.first_lba,
            last_lba: p.last_lba,
        })
        .collect();

    let loader_default = {
        let mut w = table.window(&mut f, PartitionRole::Efi.label())?;
        disk::fat::read_file(&mut w, contract::paths::ESP_LOADER_CONF)
            .ok()
            .and_then(|b| {
                String::from_utf8_lossy(&b)
                    .lines()
                    .find_map(|l| l.strip_prefix("default ").map(|d| d.trim().to_string()))
            })
    };

    let mut entries = Vec::new();
    {
        let mut w = table.window(&mut f, PartitionRole::Boot.label())?;
        let files = disk::fat::list_files(&mut w).context("listing BOOT")?;
        let prefix = format!("{}/", contract::paths::BOOT_ENTRIES_DIR);
        for file in files.iter().filter(|f| f.starts_with(&prefix)) {
            let name = &file[prefix.len()..];
            let Some(slot) = slot_of_entry(name) else {
                continue;
            };
            let text = disk::fat::read_file(&mut w, file)?;
            let e = Entry::parse(&String::from_utf8_lossy(&text))
                .map_err(anyhow::Error::msg)
                .with_context(|| format!("parsing {file}"))?;
            let files_present = files.contains(&e.linux) && files.contains(&e.initrd);
            entries.push(EntryInfo {
                slot: slot.to_string(),
                file: name.to_string(),
                title: e.title,
                version: e.version,
                linux: e.linux,
                initrd: e.initrd,
                options: e.options,
                files_present,
            });
        }
    }

    let (meta, decoded) = {
        let mut w = table.window(&mut f, PartitionRole::Meta.label())?;
        let mut area = vec![0u8; contract::meta::AREA_LEN];
        w.read_exact(&mut area).context("reading META")?;
        match Meta::decode(&area) {
            Ok((m, copy)) => (
                MetaInfo {
                    valid_copy: Some(copy),
                    error: None,
                    keys: m
                        .entries()
                        .into_iter()
                        .filter(|(k, _)| k != "history" && k != "trusted-keys")
                        .collect(),
                },
                Some(m),
            ),
            Err(e) => (
                MetaInfo {
                    valid_copy: None,
                    error: Some(e.to_string()),
                    keys: Vec::new(),
                },
                None,
            ),
        }
    };
    let slots = slots_info(decoded.as_ref(), &entries);

    let manifest = manifest_status(image, key);
    Ok(Report {
        image: image.display().to_string(),
        size,
        sector_size: table.sector_size,
        disk_guid: table.disk_guid.hyphenated().to_string(),
        partitions,
        loader_default,
        entries,
        slots,
        meta,
        manifest,
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
        .filter(|e| e.files_present)
        .filter_map(|e| EntryName::parse(&e.file))
        .collect();
    let next = boot_order(&names).first().map(|e| e.slot);
    info.default = Some(state.default.to_string());
    info.boots_next = next.map(|s| s.to_string());
    info.pending_upgrade = state.pending.as_ref().map(|p| p.render());
    info.history = state.history.clone();
    info.trusted_keys = crate::install::parse_trusted_keys(
        meta.get(contract::meta::Tag::TrustedKeys)
            .unwrap_or_default(),
    )
    .map(|ks| ks.iter().map(sign::key_id).collect())
    .unwrap_or_default();
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
    let path = dir.join(crate::build::names::MANIFEST);
    if !path.is_file() {
        return None;
    }
    let default_key = sign::default_dev_pub();
    let key = key
        .map(Path::to_path_buf)
        .or_else(|| default_key.is_file().then_some(default_key));
    let mut info = ManifestInfo {
        path: path.display().to_string(),
        verified: false,
        lists_image: false,
        detail: String::new(),
    };
    let image_name = image.file_name().map(|n| n.to_string_lossy().into_owned());
    let Some(key) = key else {
        info.detail = "no public key: pass --key to check the manifest".into();
        return Some(info);
    };
    match sign::load_public_key(&key).and_then(|k| sign::verify(&path, &k)) {
        Ok(report) => {
            info.verified = report.ok;
            info.lists_image = report
                .artifacts
                .iter()
                .any(|a| Some(&a.path) == image_name.as_ref() && a.is_ok());
            info.detail = if report.ok {
                format!("signed by {}", report.key_id)
            } else {
                format!("{} artifact problem(s); run imager verify", report.problems)
            };
        }
        Err(e) => info.detail = format!("{e:#}"),
    }
    Some(info)
}

/// Prints the report; returns the exit code: 0, or 1 when META is invalid or
/// the manifest beside the image does not verify or does not list it.
pub fn run(args: &InspectArgs) -> Result<i32> {
    let r = inspect(&args.image, args.key.as_deref())?;
    let code = i32::from(
        r.meta.valid_copy.is_none()
            || r.manifest
                .as_ref()
                .is_some_and(|m| !(m.verified && m.lists_image)),
    );
    if args.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(code);
    }
    println!(
        "image {} ({} bytes, {}-byte sectors, disk GUID {})",
        r.image, r.size, r.sector_size, r.disk_guid
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
    println!("\nboot entries (systemd-boot boots the first of its order):");
    for slot in contract::Slot::ALL {
        let mut any = false;
        for e in r.entries.iter().filter(|e| e.slot == slot.name()) {
            any = true;
            println!(
                "  slot {}: {} version {} linux /{} initrd /{}{}",
                e.slot,
                e.file,
                e.version,
                e.linux,
                e.initrd,
                if e.files_present {
                    ""
                } else {
                    " (FILES MISSING)"
                }
            );
            println!("          options {}", e.options);
        }
        if !any {
            println!("  slot {}: empty", slot.name());
        }
    }
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
                "-"
            } else {
                &s.version
            },
            s.entry.as_deref().unwrap_or("no entry"),
            tries
        );
    }
    println!(
        "  pending upgrade: {}",
        sl.pending_upgrade.as_deref().unwrap_or("none")
    );
    println!("  trusted keys: {}", sl.trusted_keys.join(", "));
    println!("  history:");
    for h in &sl.history {
        println!("    {h}");
    }
    match (&r.meta.valid_copy, &r.meta.error) {
        (Some(c), _) => println!("\nMETA (copy {c} valid):"),
        (None, e) => println!("\nMETA: INVALID: {}", e.as_deref().unwrap_or("")),
    }
    for (k, v) in &r.meta.keys {
        println!("  {k} = {v}");
    }
    match &r.manifest {
        None => println!("\nmanifest: none beside the image"),
        Some(m) => println!(
            "\nmanifest {}: {}{}",
            m.path,
            if m.verified && m.lists_image {
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
