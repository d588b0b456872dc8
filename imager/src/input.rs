//! Text from outside: rule tables, waiver lists, kernel configs, command
//! lines, manifests. Read whole, bounded, and never echoed.
//!
//! A path in a profile or on the command line may point at the wrong file,
//! and the wrong file may be a secret: a private key, `/etc/shadow`. So a
//! text input is read through [`read_text`], which refuses what is not a
//! regular file, what is larger than the input can be, what is not UTF-8 and
//! what looks like a private key, and names the path and what was expected
//! without showing a byte of it. A parser's message quotes at most a
//! [`crate::secret::excerpt`], and messages of serde parsers go through
//! [`crate::secret::sanitise`]. [`redact`] is the last line: every error the
//! command prints passes through it.

use anyhow::{Context, Result, bail};
use std::io::Read;
use std::path::Path;

/// The most bytes a text input may have unless its reader says otherwise:
/// far more than any rule table, waiver list, manifest or kernel `.config`.
pub const MAX_TEXT: u64 = 16 << 20;

/// A run of base64 characters this long in a printed message is taken for
/// key material and redacted.
const KEYLIKE_RUN: usize = 24;

/// Reads the text file `path` (a `what`, as a message names it: "KSPP rule
/// table"), at most `max` bytes, refusing anything that is not a regular
/// file of UTF-8 text or that looks like a private key. No message quotes
/// the file.
pub fn read_text(path: &Path, what: &str, max: u64) -> Result<String> {
    let shown = path.display();
    let meta = std::fs::metadata(path).with_context(|| format!("reading the {what} {shown}"))?;
    if !meta.is_file() {
        bail!("{shown} is not a regular file: give the path of the {what}");
    }
    if meta.len() > max {
        bail!(
            "{shown} has {} bytes, more than a {what} can have ({max}): check the path",
            meta.len()
        );
    }
    let f = std::fs::File::open(path).with_context(|| format!("opening the {what} {shown}"))?;
    let mut bytes = Vec::new();
    f.take(max + 1)
        .read_to_end(&mut bytes)
        .with_context(|| format!("reading the {what} {shown}"))?;
    if bytes.len() as u64 > max {
        bail!("{shown} grew past {max} bytes while it was read: check the path");
    }
    if crate::secret::looks_like_private_key(&bytes) {
        bail!(
            "{shown} looks like a private key, not a {what}: check the path (nothing of it is \
             shown)"
        );
    }
    String::from_utf8(bytes).map_err(|e| {
        anyhow::anyhow!(
            "{shown} is not UTF-8 text (byte {} is not): it is not a {what}; check the path",
            e.utf8_error().valid_up_to()
        )
    })
}

/// The first `n` bytes of the regular file `path` (fewer if it is shorter),
/// for a check of its format before it is used.
pub fn read_head(path: &Path, what: &str, n: u64) -> Result<Vec<u8>> {
    let shown = path.display();
    let meta = std::fs::metadata(path).with_context(|| format!("reading the {what} {shown}"))?;
    if !meta.is_file() {
        bail!("{shown} is not a regular file: give the path of the {what}");
    }
    let f = std::fs::File::open(path).with_context(|| format!("opening the {what} {shown}"))?;
    let mut head = Vec::new();
    f.take(n)
        .read_to_end(&mut head)
        .with_context(|| format!("reading the {what} {shown}"))?;
    Ok(head)
}

/// The last line before a message is printed: any PEM private-key block and
/// any run of base64 or hex characters that could be key material is
/// replaced by `[redacted]`. SHA-256 digests (64 lowercase hex digits) and
/// key ids are not secrets and stay.
pub fn redact(msg: &str) -> String {
    let mut out = String::with_capacity(msg.len());
    let mut rest = msg;
    // PEM blocks first: from the armour to its end line (or the end).
    while let Some(start) = rest.find("-----BEGIN") {
        let block = &rest[start..];
        let header_end = block[10..].find("-----").map(|i| i + 15);
        let is_private = header_end.is_some_and(|e| block[..e].contains("PRIVATE KEY"));
        if !is_private {
            let cut = header_end.unwrap_or(block.len());
            out.push_str(&redact_runs(&rest[..start + cut]));
            rest = &rest[start + cut..];
            continue;
        }
        out.push_str(&redact_runs(&rest[..start]));
        out.push_str("[redacted]");
        rest = match block.find("-----END") {
            Some(e) => {
                let after = &block[e + 8..];
                match after.find("-----") {
                    Some(f) => &after[f + 5..],
                    None => "",
                }
            }
            None => "",
        };
    }
    out.push_str(&redact_runs(rest));
    out
}

/// Replaces base64-like runs of [`KEYLIKE_RUN`] or more characters, except
/// lowercase hex digests and words of letters only. A slash separates runs,
/// so that paths stay readable; a key's PEM lines are caught whole above.
fn redact_runs(s: &str) -> String {
    let is_b64 = |c: char| c.is_ascii_alphanumeric() || matches!(c, '+' | '=');
    let mut out = String::with_capacity(s.len());
    let mut run = String::new();
    let flush = |run: &mut String, out: &mut String| {
        let digest = run
            .chars()
            .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c));
        let word = run.chars().all(|c| c.is_ascii_alphabetic());
        if run.chars().count() >= KEYLIKE_RUN && !digest && !word {
            out.push_str("[redacted]");
        } else {
            out.push_str(run);
        }
        run.clear();
    };
    for c in s.chars() {
        if is_b64(c) {
            run.push(c);
        } else {
            flush(&mut run, &mut out);
            out.push(c);
        }
    }
    flush(&mut run, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const PEM: &str = "-----BEGIN PRIVATE KEY-----\n\
        MC4CAQAwBQYDK2VwBCIEIGx1c3Rlcmtlcm5lbHNlY3JldGtleW1hdGVyaWFs\n\
        -----END PRIVATE KEY-----\n";
    const BODY: &str = "MC4CAQAwBQYDK2VwBCIEIGx1c3Rlcmtlcm5lbHNlY3JldGtleW1hdGVyaWFs";

    #[test]
    fn read_text_refuses_keys_binary_size_and_non_files_without_quoting() {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("k");
        std::fs::write(&key, PEM).unwrap();
        let e = format!(
            "{:#}",
            read_text(&key, "KSPP rule table", MAX_TEXT).unwrap_err()
        );
        assert!(e.contains("looks like a private key") && e.contains("KSPP rule table"));
        assert!(!e.contains("MC4C"), "{e}");
        let bin = dir.path().join("b");
        std::fs::write(&bin, [0x41, 0xff, 0xfe, 0x00]).unwrap();
        let e = format!(
            "{:#}",
            read_text(&bin, "waiver list", MAX_TEXT).unwrap_err()
        );
        assert!(e.contains("not UTF-8 text"), "{e}");
        let big = dir.path().join("big");
        std::fs::write(&big, "x".repeat(100)).unwrap();
        let e = format!("{:#}", read_text(&big, "command line", 10).unwrap_err());
        assert!(e.contains("more than a command line can have"), "{e}");
        let e = format!(
            "{:#}",
            read_text(dir.path(), "command line", 10).unwrap_err()
        );
        assert!(e.contains("not a regular file"), "{e}");
        let ok = dir.path().join("ok");
        std::fs::write(&ok, "a: b\n").unwrap();
        assert_eq!(read_text(&ok, "x", MAX_TEXT).unwrap(), "a: b\n");
    }

    #[test]
    fn redact_removes_pem_blocks_and_keylike_runs_but_keeps_digests_and_paths() {
        let m = format!("error: {PEM} and more");
        let r = redact(&m);
        assert_eq!(r, "error: [redacted]\n and more");
        let r = redact(&format!("value {BODY} end"));
        assert_eq!(r, "value [redacted] end");
        let digest = "sha256 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
        assert_eq!(redact(digest), digest);
        let path = "reading /usr/lib/systemd/boot/efi/systemd-bootx64.efi: not found";
        assert_eq!(redact(path), path);
        let path = "profile /work/main/target/e2e/secrets/inputs/signing.key: line 1";
        assert_eq!(redact(path), path);
        let public = "-----BEGIN PUBLIC KEY-----";
        assert_eq!(redact(public), public);
        let truncated = "-----BEGIN PRIVATE KEY-----\nMC4C";
        assert_eq!(redact(truncated), "[redacted]");
    }
}
