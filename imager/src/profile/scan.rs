//! Reading a profile within bounds, before any YAML parser sees it.
//!
//! serde_yaml (libyaml) expands aliases as often as they are used and
//! parses deeply nested flow collections in quadratic time: a 1 MB profile
//! of aliases took 7.8 GB, an 800 KB one of nested brackets over 20
//! minutes. A profile is a small hand-written file (about 2 KB), so the text
//! is checked first, cheaply and conservatively, in one pass:
//!
//! - at most [`MAX_BYTES`] (256 KiB), read no further;
//! - not something that looks like a private key ([`crate::secret`]); not
//!   quoted in any message;
//! - UTF-8 text without control characters other than tab and line breaks;
//! - no YAML anchor (`&name`): without anchors an alias has nothing to
//!   expand, and serde_yaml refuses it as an unknown anchor. An anchor
//!   starts a node, so its `&` stands at the start of a line or after a
//!   space, a tab or one of `[ { , :`; the check does not parse YAML, so
//!   such a `&` directly followed by a name is refused even inside a
//!   quoted string or a comment. A `&` inside a word (a URL's or a
//!   PKCS#11 URI's `…so&pin-source=…`) cannot start an anchor and is
//!   text;
//! - flow collections (`[…]`, `{…}`) nested at most [`MAX_DEPTH`] deep and
//!   at most [`MAX_BRACKETS`] of them in all (brackets are counted even in
//!   strings and comments, so the real depth never exceeds what is counted);
//! - block nesting: no line indented (spaces, `- ` and `? ` markers) past
//!   column [`MAX_INDENT`].
//!
//! A refusal names the line (and column) and what to do.

use std::io::Read;
use std::path::Path;

/// The largest profile read, in bytes (profiles are 1-2 KB).
pub const MAX_BYTES: usize = 256 * 1024;
/// How deep flow collections (`[…]`, `{…}`) may nest.
pub const MAX_DEPTH: usize = 32;
/// How many flow collections a profile may open in all.
pub const MAX_BRACKETS: usize = 1024;
/// The deepest column a line's content may start at (block nesting).
pub const MAX_INDENT: usize = 64;

/// Reads at most [`MAX_BYTES`] + 1 bytes of the regular file `path`
/// (opened without blocking, so that a FIFO cannot hang the build).
pub fn read(path: &Path) -> Result<Vec<u8>, String> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| describe_open_error(&e))?;
    let meta = f.metadata().map_err(|e| format!("cannot be read: {e}"))?;
    if !meta.is_file() {
        return Err(not_a_file(&meta));
    }
    let mut bytes = Vec::new();
    f.take(MAX_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot be read: {e}"))?;
    Ok(bytes)
}

/// Checks the bounds above; returns the text, or the refusal (which quotes
/// nothing of the input).
pub fn check(bytes: &[u8]) -> Result<&str, String> {
    if crate::secret::looks_like_private_key(bytes) {
        return Err("looks like a private key, not a profile: check --profile".into());
    }
    let line_at = |offset: usize| {
        1 + bytes[..offset.min(bytes.len())]
            .iter()
            .filter(|&&b| b == b'\n')
            .count()
    };
    if bytes.len() > MAX_BYTES {
        return Err(format!(
            "line {}: the file is longer than {MAX_BYTES} bytes (256 KiB), the most a profile \
             may be: is this the right file?",
            line_at(MAX_BYTES)
        ));
    }
    let text = std::str::from_utf8(bytes).map_err(|e| {
        format!(
            "line {}: not UTF-8 text: a profile is a YAML text file: is this the right file?",
            line_at(e.valid_up_to())
        )
    })?;
    let (mut line, mut col) = (1usize, 0usize);
    let (mut depth, mut brackets) = (0usize, 0usize);
    // Still in the line's indentation: spaces and `- ` / `? ` markers.
    let mut indenting = true;
    let mut chars = text.chars().peekable();
    let mut prev = '\n';
    while let Some(c) = chars.next() {
        col += 1;
        let next = chars.peek().copied();
        let after = std::mem::replace(&mut prev, c);
        match c {
            '\n' => {
                line += 1;
                col = 0;
                indenting = true;
                continue;
            }
            '\t' | '\r' => {}
            c if c.is_control() => {
                return Err(format!(
                    "line {line} column {col}: control character U+{:04X}: a profile is plain \
                     text: remove it",
                    c as u32
                ));
            }
            '&' if (after.is_whitespace() || "[{,:".contains(after))
                && next.is_some_and(|n| !n.is_whitespace() && !",[]{}".contains(n)) =>
            {
                return Err(format!(
                    "line {line} column {col}: `&` followed by a name starts a YAML anchor: \
                     profiles do not use anchors or aliases (write each value out; in text, \
                     put a space after the `&`)"
                ));
            }
            '[' | '{' => {
                depth += 1;
                brackets += 1;
                if depth > MAX_DEPTH {
                    return Err(format!(
                        "line {line} column {col}: brackets nested more than {MAX_DEPTH} deep: \
                         a profile needs a few levels at most"
                    ));
                }
                if brackets > MAX_BRACKETS {
                    return Err(format!(
                        "line {line} column {col}: more than {MAX_BRACKETS} `[` and `{{` in \
                         all: a profile needs a few: is this the right file?"
                    ));
                }
            }
            ']' | '}' => depth = depth.saturating_sub(1),
            _ => {}
        }
        if indenting {
            let marker = matches!(c, '-' | '?') && next == Some(' ');
            if c != ' ' && !marker {
                indenting = false;
                if col > MAX_INDENT {
                    return Err(format!(
                        "line {line}: nested or indented {col} columns deep, past column \
                         {MAX_INDENT}: a profile nests a few levels: indent less"
                    ));
                }
            }
        }
    }
    Ok(text)
}

/// Whether `p` is a regular file (`Ok(false)`: nothing there); what else it
/// is, or why it cannot be used, as the end of a sentence about it.
pub(super) fn usable_file(p: &Path) -> Result<bool, String> {
    match std::fs::metadata(p) {
        Ok(m) if m.is_file() => Ok(true),
        Ok(m) => Err(not_a_file(&m)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => match std::fs::symlink_metadata(p) {
            Ok(m) if m.file_type().is_symlink() => Err(match std::fs::read_link(p) {
                Ok(t) => format!(
                    "is a symbolic link to {}, which does not exist: fix the link or pass \
                         --profile PATH to the profile file",
                    t.display()
                ),
                Err(_) => "is a symbolic link to nothing: fix the link or pass --profile \
                               PATH to the profile file"
                    .to_string(),
            }),
            _ => Ok(false),
        },
        Err(e) => Err(describe_open_error(&e)),
    }
}

/// Why a profile cannot be opened, as the end of a sentence about it.
pub(super) fn describe_open_error(e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::ELOOP) => "is a symbolic link loop (a link that leads back to itself): fix \
                              the link, or pass --profile PATH to the profile file itself"
            .to_string(),
        Some(libc::EACCES) | Some(libc::EPERM) => {
            format!("cannot be read: {e}: check its permissions (and its directories')")
        }
        _ if e.kind() == std::io::ErrorKind::NotFound => {
            "not found: pass --profile PATH to a profile file".to_string()
        }
        _ => format!("cannot be read: {e}"),
    }
}

pub(super) fn not_a_file(m: &std::fs::Metadata) -> String {
    let what = if m.is_dir() {
        "a directory"
    } else {
        "not a regular file (a device, FIFO or socket)"
    };
    format!("is {what}, not a profile file: pass --profile PATH to the profile's .yaml file")
}
