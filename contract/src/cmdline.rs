//! Kernel command-line keys read by the runtime, and the parser it uses.

use crate::slot::Slot;

/// Which slot the boot entry belongs to: `machined.slot=A`.
pub const SLOT: &str = "machined.slot";
/// Set by GRUB (the BIOS path, `contract::grubcfg`) after the entry's
/// options: `machined.trial=1` on a boot of the slot on trial (its tries
/// already counted down), `machined.trial=0` otherwise. systemd-boot's
/// entries never carry it, so it also says that GRUB booted.
pub const TRIAL: &str = "machined.trial";
/// What to do when the runtime fails: `machined.on_failure=reboot|halt|poweroff`.
pub const ON_FAILURE: &str = "machined.on_failure";
/// Stop before reaching ready (for tests of a deliberately broken version):
/// `machined.break=stage1|switch-root|stage2|ready` fails there,
/// `machined.break=hang` hangs before ready, `machined.break=panic` panics.
pub const BREAK: &str = "machined.break";
/// Seconds from boot to ready before the runtime gives up and applies its
/// failure policy (so a boot that hangs is counted as failed); 0: never.
pub const READY_TIMEOUT: &str = "machined.ready_timeout";
/// TEMP(main): reconciled with h-live at merge.
pub const LIVE: &str = "machined.live";
pub const INSTALL: &str = "machined.install";
pub const INSTALL_WIPE: &str = "machined.install.wipe";
/// The default of [`READY_TIMEOUT`].
pub const DEFAULT_READY_TIMEOUT_S: u64 = 300;

/// The longest kernel command line the boot path carries whole, in bytes:
/// the x86 kernel's `COMMAND_LINE_SIZE` (2048, `arch/x86/include/asm/setup.h`)
/// less its terminating NUL. The EFI stub (`efi_convert_cmdline`,
/// `drivers/firmware/efi/libstub/efi-stub-helper.c` in Linux 6.1) cuts a
/// longer line at its last space before that length, says so on the
/// console and boots on: the arguments past the cut (the slot, say) are
/// silently lost. Builds refuse a profile whose line would not fit
/// ([`loaded_len`]).
pub const MAX_LEN: usize = 2047;

/// The length in bytes of the command line the kernel receives from a Boot
/// Loader Specification type #1 entry with these `options` and `initrd`
/// paths (relative to the partition root, as in
/// [`crate::boot::Entry`]): systemd-boot (252) adds `initrd=<path>` for
/// each `initrd` line, the path absolute with `\` for `/`, separated from
/// the options by one space (the kernel's EFI stub loads the initrd from
/// that argument when the firmware offers no other way). Compare with
/// [`MAX_LEN`].
pub fn loaded_len(options: &str, initrds: &[&str]) -> usize {
    let added: usize = initrds
        .iter()
        .map(|p| " initrd=\\".len() + p.trim_start_matches('/').len())
        .sum();
    if options.is_empty() {
        // The first initrd argument needs no separating space.
        added.saturating_sub(1)
    } else {
        options.len() + added
    }
}

/// What the runtime does after printing a fatal error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnFailure {
    Reboot,
    Halt,
    Poweroff,
}

impl OnFailure {
    pub fn parse(v: &str) -> Option<Self> {
        match v {
            "reboot" => Some(Self::Reboot),
            "halt" => Some(Self::Halt),
            "poweroff" => Some(Self::Poweroff),
            _ => None,
        }
    }
}

/// Iterates over `key=value` (value may be empty) and bare `key` words of a
/// command line, honouring double quotes as the kernel does.
pub fn parse(cmdline: &str) -> Vec<(String, Option<String>)> {
    let mut out = Vec::new();
    let mut word = String::new();
    let mut quoted = false;
    let mut push = |w: &mut String| {
        if !w.is_empty() {
            let item = match w.split_once('=') {
                Some((k, v)) => (k.to_string(), Some(v.to_string())),
                None => (w.clone(), None),
            };
            out.push(item);
            w.clear();
        }
    };
    for c in cmdline.chars() {
        match c {
            '"' => quoted = !quoted,
            c if c.is_whitespace() && !quoted => push(&mut word),
            c => word.push(c),
        }
    }
    push(&mut word);
    out
}

/// The last value of `key` on the command line (the kernel's rule: last wins).
pub fn get(cmdline: &str, key: &str) -> Option<String> {
    parse(cmdline)
        .into_iter()
        .rev()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.unwrap_or_default())
}

/// The slot named on the command line, if any and valid.
pub fn slot(cmdline: &str) -> Option<Slot> {
    get(cmdline, SLOT).and_then(|v| v.parse().ok())
}

/// What GRUB said of this boot: `Some(true)` a trial boot, `Some(false)`
/// not; `None` when the line has no valid `machined.trial` (not booted by
/// GRUB).
pub fn trial(cmdline: &str) -> Option<bool> {
    match get(cmdline, TRIAL)?.as_str() {
        "1" => Some(true),
        "0" => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_quotes_and_last_value_wins() {
        let c = r#"console=ttyS0 machined.slot=B quiet x="a b" machined.slot=A"#;
        assert_eq!(get(c, "x").as_deref(), Some("a b"));
        assert_eq!(get(c, "quiet").as_deref(), Some(""));
        assert_eq!(slot(c), Some(Slot::A));
        assert_eq!(get(c, "missing"), None);
        assert_eq!(slot("machined.slot=C"), None);
        assert_eq!(trial("a machined.trial=1"), Some(true));
        assert_eq!(trial("machined.trial=0"), Some(false));
        assert_eq!(trial("machined.trial=2"), None);
        assert_eq!(trial("machined.slot=A"), None);
    }

    #[test]
    fn loaded_length_counts_what_systemd_boot_adds() {
        // "a b initrd=\A\i.zst"
        assert_eq!(loaded_len("a b", &["A/i.zst"]), 3 + 1 + 7 + 8);
        assert_eq!(loaded_len("", &["/A/i.zst"]), 7 + 8);
        assert_eq!(loaded_len("a", &[]), 1);
    }
}
