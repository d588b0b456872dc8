//! Boot entries and boot files, as the Boot Loader Specification (type #1)
//! lays them out on the BOOT partition, and systemd-boot's loader.conf.
//!
//! BOOT holds, per slot:
//!
//! ```text
//! /A/vmlinuz-<16 hex of sha256>          kernel of slot A
//! /A/initramfs-<16 hex of sha256>.zst    initramfs of slot A
//! /loader/entries/slot-a.conf            its entry (slot-b.conf for B)
//! ```
//!
//! Boot files are named by their content hash, so that writing a new version
//! never overwrites a file an existing entry points to.

use crate::paths::BOOT_ENTRIES_DIR;
use crate::slot::Slot;

/// Entry file stem of a slot (without boot-counting suffix or `.conf`).
pub fn entry_id(slot: Slot) -> &'static str {
    match slot {
        Slot::A => "slot-a",
        Slot::B => "slot-b",
    }
}

/// Path of a slot's entry on BOOT, relative to the partition root, without
/// boot counting: `loader/entries/slot-a.conf`.
pub fn entry_path(slot: Slot) -> String {
    format!("{BOOT_ENTRIES_DIR}/{}.conf", entry_id(slot))
}

/// The title of a slot's boot entry: the image's title (`Imager 0.1.0`, the
/// `boot.title` of its manifest) and the slot: `Imager 0.1.0 (slot A)`.
pub fn entry_title(image_title: &str, slot: Slot) -> String {
    format!("{image_title} (slot {slot})")
}

/// Slot of an entry file name, accepting systemd-boot's boot-counting suffix
/// (`slot-b+3-0.conf`).
pub fn slot_of_entry(file_name: &str) -> Option<Slot> {
    let stem = file_name.strip_suffix(".conf")?;
    let id = stem.split_once('+').map_or(stem, |(id, _)| id);
    Slot::ALL.into_iter().find(|s| entry_id(*s) == id)
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

/// A Boot Loader Specification type #1 entry.
#[derive(Debug, Clone, PartialEq, Eq)]
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

/// systemd-boot's loader.conf: no menu, no editor (the command line cannot be
/// changed at the console), and `default` naming the default slot's entry.
pub fn loader_conf(default: Slot) -> String {
    format!(
        "timeout 0\ndefault {}.conf\neditor no\nauto-entries no\nauto-firmware no\nconsole-mode keep\n",
        entry_id(default)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(slot_of_entry("slot-b+3-0.conf"), Some(Slot::B));
        assert_eq!(slot_of_entry("slot-a.conf"), Some(Slot::A));
        assert_eq!(slot_of_entry("slot-c.conf"), None);
        assert_eq!(
            entry_title("Imager 0.1.0", Slot::B),
            "Imager 0.1.0 (slot B)"
        );
        assert!(loader_conf(Slot::B).contains("default slot-b.conf\n"));
    }
}
