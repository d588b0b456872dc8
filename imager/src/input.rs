//! Text from outside: rule tables, waiver lists, kernel configs, command
//! lines, manifests. Read whole, bounded, and never echoed.
//!
//! A path in a profile or on the command line may point at the wrong file,
//! and the wrong file may be a secret: a private key, `/etc/shadow`. So a
//! text input is read through [`read_text`], which refuses what is not a
//! regular file, what is larger than the input can be, what is not UTF-8 and
//! what looks like a private key, and names the path and what was expected
//! without showing a byte of it. A parser's message quotes at most an
//! [`excerpt`]: a few dozen printable characters, never a run that could be
//! key material; messages of serde parsers go through [`serde_message`].
//! [`redact`] is the last line: every error the command prints passes
//! through it.

use anyhow::{Context, Result, bail};
use std::io::Read;
use std::path::Path;

/// The most bytes a text input may have unless its reader says otherwise:
/// far more than any rule table, waiver list, manifest or kernel `.config`.
pub const MAX_TEXT: u64 = 16 << 20;

/// The longest excerpt of an input a message may quote.
pub const EXCERPT_CHARS: usize = 40;

/// A run of base64 or hex characters this long in a message is taken for
/// key material and not shown.
const KEYLIKE_RUN: usize = 24;

/// True when `bytes` hold a private key in a form we know: a PEM block of any
/// private key (PKCS#8, encrypted PKCS#8, RSA, EC, OpenSSH), or PuTTY's
/// key file.
pub fn looks_like_private_key(bytes: &[u8]) -> bool {
    let has = |needle: &[u8]| bytes.windows(needle.len()).any(|w| w == needle);
    has(b"PRIVATE KEY-----") || has(b"PuTTY-User-Key-File")
}

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
    if looks_like_private_key(&bytes) {
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

/// A short, printable excerpt of `s` for a message: at most
/// [`EXCERPT_CHARS`] characters, control characters escaped, quoted; a
/// string that could be key material (a long base64 or hex run, a PEM line)
/// is not shown at all.
pub fn excerpt(s: &str) -> String {
    quoted(s, true)
}

/// [`excerpt`] of text that is already escaped (`escape` false: quotes and
/// backslashes are kept as they are).
fn quoted(s: &str, escape: bool) -> String {
    if keylike(s) {
        return format!("({} characters, not shown)", s.chars().count());
    }
    let mut out = String::from("\"");
    for (i, c) in s.chars().enumerate() {
        if i == EXCERPT_CHARS {
            out.push('…');
            break;
        }
        match c {
            '"' if escape => out.push_str("\\\""),
            '\\' if escape => out.push_str("\\\\"),
            c if c.is_control() => out.extend(c.escape_default()),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// True when `s` holds something that could be part of a key: a PEM armour
/// line, or a run of [`KEYLIKE_RUN`] or more base64 characters.
fn keylike(s: &str) -> bool {
    if s.contains("-----BEGIN") || s.contains("-----END") || looks_like_private_key(s.as_bytes()) {
        return true;
    }
    longest_run(s, |c| {
        c.is_ascii_alphanumeric() || matches!(c, '+' | '/' | '=')
    }) >= KEYLIKE_RUN
}

fn longest_run(s: &str, in_run: impl Fn(char) -> bool) -> usize {
    let (mut best, mut cur) = (0, 0);
    for c in s.chars() {
        cur = if in_run(c) { cur + 1 } else { 0 };
        best = best.max(cur);
    }
    best
}

/// A serde parser's message (serde_yaml, serde_json) with every value it
/// quotes (`string "…"`, `` `…` ``) cut to an [`excerpt`]: serde quotes
/// whole values, and the value may be a whole file that was not what the
/// parser expected.
pub fn serde_message(msg: &str) -> String {
    let mut out = String::with_capacity(msg.len());
    let mut rest = msg;
    while let Some(start) = rest.find(['"', '`']) {
        let quote = rest[start..].chars().next().unwrap_or('"');
        out.push_str(&rest[..start]);
        let body = &rest[start + 1..];
        // serde escapes quotes inside a quoted string with a backslash.
        let mut end = None;
        let mut escaped = false;
        for (i, c) in body.char_indices() {
            match c {
                '\\' if quote == '"' && !escaped => escaped = true,
                c if c == quote && !escaped => {
                    end = Some(i);
                    break;
                }
                _ => escaped = false,
            }
        }
        let Some(end) = end else {
            out.push_str(&quoted(body, false));
            return out;
        };
        let value = &body[..end];
        if quote == '`' && !keylike(value) && value.chars().count() <= EXCERPT_CHARS {
            // A field or variant name: short, and shown as serde shows it.
            out.push('`');
            out.extend(value.chars().flat_map(char::escape_default));
            out.push('`');
        } else {
            out.push_str(&quoted(value, quote == '`'));
        }
        rest = &body[end + quote.len_utf8()..];
    }
    out.push_str(rest);
    out
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
    fn excerpts_are_short_printable_and_hide_key_material() {
        assert_eq!(excerpt("abc"), "\"abc\"");
        assert_eq!(excerpt("a\u{1b}[2J\n"), "\"a\\u{1b}[2J\\n\"");
        let long = "word ".repeat(20);
        let e = excerpt(&long);
        assert!(
            e.chars().count() <= EXCERPT_CHARS + 3 && e.ends_with("…\""),
            "{e}"
        );
        assert_eq!(excerpt(BODY), "(60 characters, not shown)");
        assert!(!excerpt(PEM).contains("BEGIN"));
    }

    #[test]
    fn serde_messages_lose_quoted_values() {
        let m = format!("invalid type: string \"{PEM}\", expected struct Rules at line 1 column 1");
        let s = serde_message(&m);
        assert!(!s.contains(BODY) && !s.contains("MC4C"), "{s}");
        assert!(
            s.contains("expected struct Rules at line 1 column 1"),
            "{s}"
        );
        let m = "invalid type: string \"root:$y$j9T$c2VjcmV0aGFzaHNlY3JldGhhc2hzZWNyZXQ:19000:0:99999:7:::\", expected a map";
        let s = serde_message(m);
        assert!(!s.contains("c2VjcmV0"), "{s}");
        let m = "unknown field `sorce`, expected one of `source`, `prebuilt`";
        assert_eq!(serde_message(m), m);
        let m = "invalid value: string \"a\\\"b\", expected x";
        assert_eq!(
            serde_message(m),
            "invalid value: string \"a\\\"b\", expected x"
        );
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
