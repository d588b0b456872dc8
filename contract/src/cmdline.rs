//! Kernel command-line keys read by the runtime, and the parser it uses.

use crate::slot::Slot;

/// Which slot the boot entry belongs to: `machined.slot=A`.
pub const SLOT: &str = "machined.slot";
/// What to do when the runtime fails: `machined.on_failure=reboot|halt|poweroff`.
pub const ON_FAILURE: &str = "machined.on_failure";
/// Stop before reaching ready (for tests of a deliberately broken version):
/// `machined.break=stage1|switch-root|stage2|ready` fails there,
/// `machined.break=hang` hangs before ready, `machined.break=panic` panics.
pub const BREAK: &str = "machined.break";
/// Seconds from boot to ready before the runtime gives up and applies its
/// failure policy (so a boot that hangs is counted as failed); 0: never.
pub const READY_TIMEOUT: &str = "machined.ready_timeout";
/// The default of [`READY_TIMEOUT`].
pub const DEFAULT_READY_TIMEOUT_S: u64 = 300;

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
    }
}
