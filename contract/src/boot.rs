//! Boot entries and boot files, as the Boot Loader Specification (type #1)
//! lays them out on the BOOT partition, and systemd-boot's loader.conf.
//!
//! BOOT holds, per slot:
//!
//! ```text
//! /A/vmlinuz-<16 hex of sha256>                 kernel of slot A
//! /A/initramfs-<16 hex of sha256>.zst           initramfs of slot A
//! /loader/entries/g00000001-slot-a.conf         its entry
//! /loader/entries/g00000002-slot-b+3-0.conf     slot B on trial: 3 tries left
//! ```
//!
//! Boot files are named by their content hash, so that writing a new version
//! never overwrites a file an existing entry points to.
//!
//! A disk whose payload is a Unified Kernel Image per slot (Secure Boot
//! images, `docs/uki.md`) has type #2 entries instead: the UKI itself is the
//! entry, named as a `.conf` would be, in `EFI/Linux/` on BOOT:
//!
//! ```text
//! /EFI/Linux/g00000001-slot-a.efi               slot A's UKI (its command line names slot A)
//! /EFI/Linux/g00000002-slot-b+3-0.efi           slot B's, on trial
//! ```
//!
//! systemd-boot counts tries in those names as in `.conf` names, and orders
//! both kinds by the same rule as long as the UKIs' `.osrel` has no `ID` or
//! `IMAGE_ID` (with those, 252 would order by the os-release `VERSION`
//! first, and a rollback to an older version would never boot: see
//! [`uki_os_release`]).
//!
//! ## Which entry boots
//!
//! `loader.conf` names no default: systemd-boot then boots the first entry
//! of its sorted list. It sorts entries whose tries are used up
//! (`+0-N`) last, and the others by file name, highest version first
//! (`strverscmp`). An entry's name starts with a **generation**: every switch
//! of the default slot writes the new default's entry with a generation one
//! higher than any on the disk, so creating that one file is the switch, and
//! it can be done crash-safely (the entry only becomes valid when its
//! directory entry is written, last). When the new slot's tries run out,
//! its entry sorts last and the previous slot, next in line, boots again.
//! See [`EntryName`] and `docs/design.md`.

use crate::paths::{BOOT_ENTRIES_DIR, BOOT_UKI_DIR};
use crate::slot::Slot;
use std::fmt;

/// How many times a new slot is tried before systemd-boot falls back.
pub const DEFAULT_TRIES: u32 = 3;
/// The most tries an entry may be given.
pub const MAX_TRIES: u32 = 99;
/// The highest generation an entry name can carry (8 digits).
pub const MAX_GENERATION: u32 = 99_999_999;

/// The name of a boot entry file: `g<generation>-slot-<a|b>[+LEFT[-DONE]].conf`
/// (or `.efi`, a UKI: [`EntryKind`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EntryName {
    /// Higher boots first; 8 decimal digits on disk.
    pub generation: u32,
    pub slot: Slot,
    /// systemd-boot's boot counting: tries left, and tries done when given.
    pub tries: Option<Tries>,
    pub kind: EntryKind,
}

/// The two kinds of entry of the Boot Loader Specification that we write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum EntryKind {
    /// Type #1: a `.conf` file in `loader/entries` naming the slot's
    /// kernel and initramfs, with the command line in its `options`.
    Conf,
    /// Type #2: the slot's Unified Kernel Image itself, `.efi` in
    /// `EFI/Linux`, its command line inside it (signed, with Secure Boot).
    Uki,
}

impl EntryKind {
    /// The directory on BOOT that holds entries of this kind.
    pub fn dir(self) -> &'static str {
        match self {
            EntryKind::Conf => BOOT_ENTRIES_DIR,
            EntryKind::Uki => BOOT_UKI_DIR,
        }
    }

    /// The file name extension of an entry of this kind.
    pub fn extension(self) -> &'static str {
        match self {
            EntryKind::Conf => ".conf",
            EntryKind::Uki => ".efi",
        }
    }

    pub const ALL: [EntryKind; 2] = [EntryKind::Conf, EntryKind::Uki];
}

/// Boot counting of an entry: `+LEFT-DONE` (or `+LEFT`) in its file name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Tries {
    pub left: u32,
    pub done: u32,
}

impl EntryName {
    /// A `.conf` entry without boot counting (a blessed or known-good slot).
    pub fn good(generation: u32, slot: Slot) -> EntryName {
        EntryName {
            generation,
            slot,
            tries: None,
            kind: EntryKind::Conf,
        }
    }

    /// The same name for an entry of `kind`.
    pub fn of_kind(self, kind: EntryKind) -> EntryName {
        EntryName { kind, ..self }
    }

    /// A `.conf` entry on trial: `tries` boots before systemd-boot gives up
    /// on it.
    pub fn trial(generation: u32, slot: Slot, tries: u32) -> EntryName {
        EntryName {
            generation,
            slot,
            tries: Some(Tries {
                left: tries,
                done: 0,
            }),
            kind: EntryKind::Conf,
        }
    }

    /// The file name, `g00000002-slot-b+3-0.conf` (or `.efi`).
    pub fn file_name(&self) -> String {
        let counter = match self.tries {
            None => String::new(),
            Some(t) => format!("+{}-{}", t.left, t.done),
        };
        format!(
            "g{:08}-{}{counter}{}",
            self.generation,
            entry_id(self.slot),
            self.kind.extension()
        )
    }

    /// Path on BOOT, relative to the partition root.
    pub fn path(&self) -> String {
        format!("{}/{}", self.kind.dir(), self.file_name())
    }

    /// Parses a file name of `loader/entries` (`.conf`) or `EFI/Linux`
    /// (`.efi`); `None` for files that are not entries of ours (other names
    /// are left alone).
    pub fn parse(file_name: &str) -> Option<EntryName> {
        let (stem, kind) = EntryKind::ALL
            .into_iter()
            .find_map(|k| file_name.strip_suffix(k.extension()).map(|s| (s, k)))?;
        let (id, counter) = match stem.split_once('+') {
            Some((id, c)) => (id, Some(c)),
            None => (stem, None),
        };
        let (generation, slot_id) = id.strip_prefix('g')?.split_once('-')?;
        if generation.len() != 8 || !generation.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let slot = Slot::ALL.into_iter().find(|s| entry_id(*s) == slot_id)?;
        let number = |s: &str| {
            (!s.is_empty() && s.len() <= 9 && s.bytes().all(|b| b.is_ascii_digit()))
                .then(|| s.parse().ok())
                .flatten()
        };
        let tries = match counter {
            None => None,
            Some(c) => {
                let (left, done) = match c.split_once('-') {
                    Some((l, d)) => (number(l)?, number(d)?),
                    None => (number(c)?, 0),
                };
                Some(Tries { left, done })
            }
        };
        Some(EntryName {
            generation: generation.parse().ok()?,
            slot,
            tries,
            kind,
        })
    }

    /// Tries used up: systemd-boot sorts the entry last and will not pick it
    /// while another entry is there.
    pub fn is_exhausted(&self) -> bool {
        self.tries.is_some_and(|t| t.left == 0)
    }

    /// The same entry with boot counting dropped (blessed).
    pub fn blessed(&self) -> EntryName {
        EntryName::good(self.generation, self.slot).of_kind(self.kind)
    }
}

impl fmt::Display for EntryName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.file_name())
    }
}

/// The entries in the order systemd-boot sorts them (it boots the first):
/// entries with tries left (or without counting) before used-up ones, then
/// the highest id by its version compare (`strverscmp_improved`), in which
/// our names order by generation (fixed width), then slot; for the same
/// generation and slot, the version compare skips `+` and puts a counting
/// name (`…-slot-b+2-1.conf`) before the plain one (`…-slot-b.conf`), and
/// more tries left first.
pub fn boot_order(entries: &[EntryName]) -> Vec<EntryName> {
    let mut v = entries.to_vec();
    v.sort_by(|a, b| {
        let left = |e: &EntryName| e.tries.map(|t| t.left);
        a.is_exhausted()
            .cmp(&b.is_exhausted())
            .then_with(|| b.generation.cmp(&a.generation))
            .then_with(|| b.slot.cmp(&a.slot))
            .then_with(|| b.tries.is_some().cmp(&a.tries.is_some()))
            .then_with(|| left(b).cmp(&left(a)))
            .then_with(|| a.kind.cmp(&b.kind))
    });
    v
}

/// Entry file stem of a slot (after the generation).
pub fn entry_id(slot: Slot) -> &'static str {
    match slot {
        Slot::A => "slot-a",
        Slot::B => "slot-b",
    }
}

/// The title of a slot's boot entry: the image's title (`Imager 0.1.0`, the
/// `boot.title` of its manifest) and the slot: `Imager 0.1.0 (slot A)`.
pub fn entry_title(image_title: &str, slot: Slot) -> String {
    format!("{image_title} (slot {slot})")
}

/// Slot of an entry file name.
pub fn slot_of_entry(file_name: &str) -> Option<Slot> {
    EntryName::parse(file_name).map(|e| e.slot)
}

fn short(sha256_hex: &str) -> &str {
    sha256_hex.get(..16).unwrap_or(sha256_hex)
}

/// Path of a slot's kernel on BOOT, relative to the partition root.
pub fn kernel_path(slot: Slot, sha256_hex: &str) -> String {
    format!("{slot}/vmlinuz-{}", short(sha256_hex))
}

/// Path of a slot's initramfs on BOOT, relative to the partition root.
pub fn initramfs_path(slot: Slot, sha256_hex: &str) -> String {
    format!("{slot}/initramfs-{}.zst", short(sha256_hex))
}

/// The `.osrel` section of a slot's UKI: `NAME`, `PRETTY_NAME` (the menu
/// title, [`entry_title`]: `Imager 0.1.0 (slot A)`) and `VERSION_ID`,
/// nothing else. Without `ID` and `IMAGE_ID` systemd-boot (252,
/// `boot_entry_compare`) has no sort key for the entry and orders it by its
/// file name, as it does our `.conf` entries: by generation. With them it
/// would order by sort key, then os-release version, highest first, and a
/// rollback to the older version could never become the default.
/// `name` and `image_title` are checked by the profile (no quotes or
/// control characters).
pub fn uki_os_release(name: &str, image_title: &str, version: &str, slot: Slot) -> String {
    format!(
        "NAME=\"{name}\"\nPRETTY_NAME=\"{}\"\nVERSION_ID={version}\n",
        entry_title(image_title, slot)
    )
}

/// A Boot Loader Specification type #1 entry.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Entry {
    pub title: String,
    pub version: String,
    /// Path of the kernel on the partition, relative, without leading slash.
    pub linux: String,
    pub initrd: String,
    pub options: String,
}

impl Entry {
    /// The entry as a `.conf` file (paths absolute from the partition root).
    pub fn render(&self) -> String {
        let mut s = format!(
            "title {}\nversion {}\nlinux /{}\n",
            self.title, self.version, self.linux
        );
        if !self.initrd.is_empty() {
            s.push_str(&format!("initrd /{}\n", self.initrd));
        }
        if !self.options.is_empty() {
            s.push_str(&format!("options {}\n", self.options));
        }
        s
    }

    /// Parses an entry file; unknown keys are ignored as the specification says.
    pub fn parse(text: &str) -> Result<Entry, String> {
        let mut e = Entry {
            title: String::new(),
            version: String::new(),
            linux: String::new(),
            initrd: String::new(),
            options: String::new(),
        };
        for line in text.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (k, v) = line
                .split_once(char::is_whitespace)
                .map_or((line, ""), |(k, v)| (k, v.trim()));
            let v = v.to_string();
            match k {
                "title" => e.title = v,
                "version" => e.version = v,
                "linux" => e.linux = v.trim_start_matches('/').to_string(),
                "initrd" => e.initrd = v.trim_start_matches('/').to_string(),
                "options" if v.is_empty() => {}
                "options" => {
                    if !e.options.is_empty() {
                        e.options.push(' ');
                    }
                    e.options.push_str(&v)
                }
                _ => {}
            }
        }
        if e.linux.is_empty() {
            return Err("boot entry has no `linux` line".into());
        }
        Ok(e)
    }
}

/// The entry of `slot`: title `<image title> (slot A)` ([`entry_title`]),
/// options the image's command line followed by `machined.slot=A`.
pub fn slot_entry(
    slot: Slot,
    kernel_sha256: &str,
    initramfs_sha256: &str,
    image_title: &str,
    version: &str,
    cmdline: &str,
) -> Entry {
    let slot_arg = format!("{}={slot}", crate::cmdline::SLOT);
    let cmdline = cmdline.trim();
    Entry {
        title: entry_title(image_title, slot),
        version: version.to_string(),
        linux: kernel_path(slot, kernel_sha256),
        initrd: initramfs_path(slot, initramfs_sha256),
        options: if cmdline.is_empty() {
            slot_arg
        } else {
            format!("{cmdline} {slot_arg}")
        },
    }
}

/// The length of the command line the kernel receives from a slot's boot
/// entry with the image command line `cmdline`: the longest over both
/// slots and both loaders, for any kernel and initramfs (their names have
/// fixed lengths). systemd-boot adds `initrd=` ([`crate::cmdline::loaded_len`]),
/// GRUB `BOOT_IMAGE=`, `machined.trial=` and `machined.boot_part=`
/// ([`crate::grubcfg::loaded_len`]), which is the longer.
pub fn loaded_cmdline_len(cmdline: &str) -> usize {
    let any_sha = "0".repeat(64);
    Slot::ALL
        .iter()
        .map(|&slot| {
            let e = slot_entry(slot, &any_sha, &any_sha, "- -", "-", cmdline);
            crate::cmdline::loaded_len(&e.options, &[&e.initrd]).max(crate::grubcfg::loaded_len(&e))
        })
        .max()
        .unwrap_or(0)
}

/// systemd-boot's loader.conf: no menu, no editor (the command line cannot be
/// changed at the console) and no `default`: the order of the entries decides
/// (see the module documentation), so that an entry whose tries ran out is
/// passed over.
pub fn loader_conf() -> String {
    "timeout 0\neditor no\nauto-entries no\nauto-firmware no\nconsole-mode keep\n".to_string()
}

/// How systemd-boot enrols the Secure Boot keys it finds in
/// `loader/keys/<name>/` on the ESP when the firmware is in setup mode
/// (`secure-boot-enroll`, systemd 252: `off`, `manual` (a menu entry),
/// `force` (at once, after a countdown)).
pub const ENROLL_MODES: [&str; 3] = ["off", "manual", "force"];

/// [`loader_conf`] of a Secure Boot image: with `secure-boot-enroll MODE`.
pub fn loader_conf_enrolling(mode: &str) -> String {
    format!("{}secure-boot-enroll {mode}\n", loader_conf())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loaded_cmdline_len_counts_the_slot_and_initrd_arguments() {
        let sha = "0".repeat(64);
        let e = slot_entry(Slot::B, &sha, &sha, "Imager 1.0", "1.0", "console=ttyS0");
        let systemd_boot = crate::cmdline::loaded_len(&e.options, &[&e.initrd]);
        // What GRUB 2.06's `linux` gives the kernel, written out.
        let grub = format!(
            "BOOT_IMAGE=/B/vmlinuz-{} console=ttyS0 machined.slot=B machined.trial=1 \
             machined.boot_part=00000000-0000-0000-0000-000000000000",
            &sha[..16]
        );
        assert_eq!(e.linux, format!("B/vmlinuz-{}", &sha[..16]));
        assert!(grub.len() > systemd_boot, "{grub}");
        assert_eq!(loaded_cmdline_len("console=ttyS0"), grub.len());
        // " machined.slot=A", then " initrd=\" and the initramfs path.
        let fixed = loaded_cmdline_len("");
        assert_eq!(loaded_cmdline_len("x"), fixed + 1 + 1);
        assert_eq!(loaded_cmdline_len(&"y".repeat(100)), fixed + 100 + 1);
    }

    #[test]
    fn entry_round_trip_and_names() {
        let e = Entry {
            title: "Imager 1.0 (slot A)".into(),
            version: "1.0".into(),
            linux: kernel_path(Slot::A, "0123456789abcdef0123"),
            initrd: initramfs_path(Slot::A, "fedcba9876543210aa"),
            options: "console=ttyS0 machined.slot=A".into(),
        };
        assert_eq!(e.linux, "A/vmlinuz-0123456789abcdef");
        assert_eq!(Entry::parse(&e.render()).unwrap(), e);
        // Found by the fuzzer: an empty options line added a trailing space.
        let e = Entry::parse("linux /k\noptions a\noptions\n").unwrap();
        assert_eq!(e.options, "a");
        assert_eq!(Entry::parse(&e.render()).unwrap(), e);
        assert!(!e.render().contains("initrd"));
        assert!(!loader_conf().contains("default"));
    }

    #[test]
    fn entry_names() {
        let t = EntryName::trial(2, Slot::B, 3);
        assert_eq!(t.file_name(), "g00000002-slot-b+3-0.conf");
        assert_eq!(t.path(), "loader/entries/g00000002-slot-b+3-0.conf");
        assert_eq!(EntryName::parse(&t.file_name()), Some(t));
        let g = EntryName::good(17, Slot::A);
        assert_eq!(g.file_name(), "g00000017-slot-a.conf");
        assert_eq!(EntryName::parse("g00000017-slot-a.conf"), Some(g));
        // systemd-boot renames +3-0 to +2-1 before each try, and may write +N.
        let p = EntryName::parse("g00000002-slot-b+0-3.conf").unwrap();
        assert!(p.is_exhausted());
        assert_eq!(p.blessed(), EntryName::good(2, Slot::B));
        assert_eq!(
            EntryName::parse("g00000002-slot-b+2.conf").unwrap().tries,
            Some(Tries { left: 2, done: 0 })
        );
        for bad in [
            "slot-a.conf",
            "g1-slot-a.conf",
            "g00000001-slot-c.conf",
            "g00000001-slot-a+x-1.conf",
            "g00000001-slot-a+1-.conf",
            "g00000001-slot-a",
            "gxxxxxxxx-slot-a.conf",
        ] {
            assert_eq!(EntryName::parse(bad), None, "{bad}");
        }
        assert_eq!(slot_of_entry("g00000003-slot-b+1-2.conf"), Some(Slot::B));
    }

    #[test]
    fn uki_entries_are_named_like_conf_entries_in_efi_linux() {
        let t = EntryName::trial(2, Slot::B, 3).of_kind(EntryKind::Uki);
        assert_eq!(t.file_name(), "g00000002-slot-b+3-0.efi");
        assert_eq!(t.path(), "EFI/Linux/g00000002-slot-b+3-0.efi");
        assert_eq!(EntryName::parse(&t.file_name()), Some(t));
        assert_eq!(t.blessed().path(), "EFI/Linux/g00000002-slot-b.efi");
        assert_eq!(
            EntryName::parse("g00000002-slot-b+0-3.efi").map(|e| (e.is_exhausted(), e.kind)),
            Some((true, EntryKind::Uki))
        );
        for bad in [
            "g00000001-slot-a.EFI",
            "g00000001-slot-a.efi.conf",
            "g00000001-slot-a.exe",
        ] {
            assert_eq!(EntryName::parse(bad), None, "{bad}");
        }
        // Both kinds order alike: by generation, used-up tries last.
        let a1 = EntryName::good(1, Slot::A).of_kind(EntryKind::Uki);
        assert_eq!(boot_order(&[a1, t])[0], t);
        let tx = EntryName::parse("g00000002-slot-b+0-3.efi").unwrap();
        assert_eq!(boot_order(&[tx, a1])[0], a1);
        // No ID or IMAGE_ID: systemd-boot orders by file name.
        let osrel = uki_os_release("Imager", "Imager 0.1.0", "0.1.0", Slot::A);
        assert_eq!(
            osrel,
            "NAME=\"Imager\"\nPRETTY_NAME=\"Imager 0.1.0 (slot A)\"\nVERSION_ID=0.1.0\n"
        );
        assert!(
            !osrel
                .lines()
                .any(|l| l.starts_with("ID=") || l.starts_with("IMAGE_ID="))
        );
    }

    #[test]
    fn boot_order_follows_systemd_boot() {
        let a1 = EntryName::good(1, Slot::A);
        let b2 = EntryName::trial(2, Slot::B, 3);
        // The newer generation boots first, whatever the slot letter.
        assert_eq!(boot_order(&[a1, b2])[0], b2);
        let a3 = EntryName::good(3, Slot::A);
        assert_eq!(boot_order(&[b2, a3])[0], a3);
        // Tries used up: sorted last, the previous slot boots again.
        let b2x = EntryName::parse("g00000002-slot-b+0-3.conf").unwrap();
        assert_eq!(boot_order(&[b2x, a1]), vec![a1, b2x]);
        // A blessing cut short: systemd-boot still prefers the counting name.
        let b2t = EntryName::parse("g00000002-slot-b+2-1.conf").unwrap();
        assert_eq!(boot_order(&[b2.blessed(), b2t])[0], b2t);
        assert_eq!(
            entry_title("Imager 0.1.0", Slot::B),
            "Imager 0.1.0 (slot B)"
        );
    }
}
