//! Text from outside, made fit to print.
//!
//! Two concerns, one module, shared by imager, the installer and the
//! runtime (which is why it lives in this small crate):
//!
//! - **Escaping.** [`escape`] is the one escaping function: every string
//!   from outside (a registry's answer, a tar header's name, a request's
//!   field, a certificate's subject, a profile's value) passes through it,
//!   directly or through [`quote`], [`excerpt`] or [`sanitise`], before it
//!   reaches a console or a terminal. Control characters (newline and
//!   escape included) and invisible format or bidirectional characters are
//!   shown escaped, so input can neither forge a line nor drive a terminal.
//!   machined's console escapes every line it prints this way, whole.
//! - **Keeping secrets out of messages.** Errors about input files must say
//!   what is wrong without echoing the file: a file given in the wrong place
//!   may be a private key. [`looks_like_private_key`] refuses such a file by
//!   name, quoting nothing; [`excerpt`] is the most of a value a message may
//!   show: a few dozen characters, escaped, and nothing at all of a value
//!   that looks like key material (a long run of base64 or hex).

/// `s` with every control character (C0 and C1, DEL; newline, carriage
/// return and escape included) and every invisible format or bidirectional
/// character written as a Rust escape (`\n`, `\u{1b}`, `\u{202e}`), the rest
/// as it is. The one escaping function: see the module's documentation.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        push_escaped(&mut out, c);
    }
    out
}

fn push_escaped(out: &mut String, c: char) {
    if c.is_control() || !is_printing(c) {
        out.extend(c.escape_default());
    } else {
        out.push(c);
    }
}

/// At most `max` characters of `value`, [`escape`]d, between double quotes
/// (a quote or backslash inside escaped too), then `…` and the length when
/// it was cut.
pub fn quote(value: &str, max: usize) -> String {
    let n = value.chars().count();
    let mut s = String::from("\"");
    for c in value.chars().take(max) {
        match c {
            '"' => s.push_str("\\\""),
            '\\' => s.push_str("\\\\"),
            c => push_escaped(&mut s, c),
        }
    }
    s.push('"');
    if n > max {
        s.push_str(&format!("… ({n} characters)"));
    }
    s
}

/// The most characters of a value [`excerpt`] shows.
pub const EXCERPT_CHARS: usize = 32;

/// Whether `bytes` look like (or contain) a private key: a PEM block whose
/// label names a private key (`PRIVATE KEY`, `RSA PRIVATE KEY`,
/// `EC PRIVATE KEY`, `ENCRYPTED PRIVATE KEY`, `OPENSSH PRIVATE KEY`,
/// `PGP PRIVATE KEY BLOCK`, …), an OpenSSH private key (binary or base64),
/// a PuTTY key file, or a DER-encoded PKCS#8 / PKCS#1 private key.
///
/// Cheap (one pass over the bytes) and conservative: a file that merely
/// mentions such a header is treated as a key too.
pub fn looks_like_private_key(bytes: &[u8]) -> bool {
    const PEM_BEGIN: &[u8] = b"-----BEGIN ";
    let mut rest = bytes;
    while let Some(i) = find(rest, PEM_BEGIN) {
        let after = &rest[i + PEM_BEGIN.len()..];
        // The label runs to the closing dashes, on the same line.
        let end = after
            .iter()
            .position(|&b| b == b'-' || b == b'\n')
            .unwrap_or(after.len());
        if find(&after[..end], b"PRIVATE KEY").is_some() {
            return true;
        }
        rest = after;
    }
    find(bytes, b"openssh-key-v1").is_some()
        // base64 of "openssh-key-v1\0", the start of an OpenSSH key's body
        || find(bytes, b"b3BlbnNzaC1rZXktdjE").is_some()
        || find(bytes, b"PuTTY-User-Key-File-").is_some()
        || looks_like_der_private_key(bytes)
}

/// A DER private key: `SEQUENCE { INTEGER 0|1, SEQUENCE … }` (PKCS#8) or
/// `SEQUENCE { INTEGER 0, INTEGER … }` (PKCS#1 RSA, SEC1 EC keys start
/// `SEQUENCE { INTEGER 1, OCTET STRING … }`).
fn looks_like_der_private_key(b: &[u8]) -> bool {
    if b.first() != Some(&0x30) {
        return false;
    }
    // The outer length: short form, or long form with 1 or 2 length bytes.
    let body = match b.get(1) {
        Some(&l) if l < 0x80 => 2,
        Some(0x81) => 3,
        Some(0x82) => 4,
        _ => return false,
    };
    match b.get(body..body + 4) {
        Some([0x02, 0x01, v, next]) => {
            matches!((v, next), (0 | 1, 0x30) | (0, 0x02) | (1, 0x04))
        }
        _ => false,
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Whether `s` holds something that could be key material: a run of at
/// least 16 base64 characters mixing upper case, lower case and digits, or
/// of at least 32 hex digits.
pub fn looks_like_key_material(s: &str) -> bool {
    let b64 = |c: char| c.is_ascii_alphanumeric() || matches!(c, '+' | '/' | '=' | '_' | '-');
    s.split(|c: char| !b64(c)).any(|run| {
        let len = run.chars().count();
        let mixed = run.chars().any(|c| c.is_ascii_uppercase())
            && run.chars().any(|c| c.is_ascii_lowercase())
            && run.chars().any(|c| c.is_ascii_digit());
        (len >= 16 && mixed)
            || run
                .split(|c: char| !c.is_ascii_hexdigit())
                .any(|h| h.len() >= 32)
    })
}

/// A short, sanitised, quoted excerpt of `value` for a message: at most
/// [`EXCERPT_CHARS`] characters (then `…` and the length), control and
/// non-printing characters escaped, and only the length of a value that
/// [`looks_like_key_material`] or a private key.
pub fn excerpt(value: &str) -> String {
    if looks_like_key_material(value) || looks_like_private_key(value.as_bytes()) {
        return format!("<{} characters, not shown>", value.chars().count());
    }
    quote(value, EXCERPT_CHARS)
}

/// Not a format, bidirectional or other invisible character that could make
/// a message lie about what it shows.
fn is_printing(c: char) -> bool {
    !matches!(c,
        '\u{200b}'..='\u{200f}' | '\u{2028}'..='\u{202e}' | '\u{2060}'..='\u{206f}'
        | '\u{feff}' | '\u{fff9}'..='\u{fffb}')
}

/// A parser's message made safe to print: every quoted part (`` `…` `` or
/// `"…"`, where serde quotes values and keys) cut to an excerpt and hidden
/// when it looks like key material, every other long word cut too, control
/// characters escaped.
pub fn sanitise(msg: &str) -> String {
    let out = sanitise_parts(msg);
    // Whatever the parts, the whole stays short.
    if out.chars().count() > MAX_MESSAGE {
        let cut: String = out.chars().take(MAX_MESSAGE).collect();
        return format!("{cut}… (message cut)");
    }
    out
}

/// The longest message [`sanitise`] returns, in characters.
const MAX_MESSAGE: usize = 600;

fn sanitise_parts(msg: &str) -> String {
    // serde's "unknown field `NAME`, expected …": NAME is the input's and
    // may itself hold backquotes, so it runs to serde's own closing words.
    for pre in ["unknown field `", "unknown variant `"] {
        if let Some(i) = msg.find(pre) {
            let after = &msg[i + pre.len()..];
            if let Some(end) = after
                .rfind("`, expected")
                .or_else(|| after.rfind("`, there are no"))
            {
                return format!(
                    "{}{pre}{}`{}",
                    plain(&msg[..i]),
                    shorten(&after[..end]),
                    sanitise_parts(&after[end + 1..])
                );
            }
        }
    }
    let mut out = String::new();
    let mut rest = msg;
    while let Some(start) = rest.find(['`', '"']) {
        let q = rest[start..].chars().next().unwrap_or('"');
        out.push_str(&plain(&rest[..start]));
        let body = &rest[start + 1..];
        let end = closing(body, q);
        match end {
            Some(end) => {
                out.push(q);
                out.push_str(&shorten(&body[..end]));
                out.push(q);
                rest = &body[end + 1..];
            }
            None => {
                out.push(q);
                out.push_str(&shorten(body));
                rest = "";
            }
        }
    }
    out.push_str(&plain(rest));
    out
}

/// The end of a quoted part; `"…"` is Rust-escaped (serde's `{:?}`).
fn closing(body: &str, q: char) -> Option<usize> {
    let mut escaped = false;
    for (i, c) in body.char_indices() {
        match c {
            '\\' if q == '"' && !escaped => escaped = true,
            c if c == q && !escaped => return Some(i),
            _ => escaped = false,
        }
    }
    None
}

fn shorten(s: &str) -> String {
    let n = s.chars().count();
    if looks_like_key_material(s) {
        return format!("<{n} characters, not shown>");
    }
    let mut out = escape(&s.chars().take(EXCERPT_CHARS).collect::<String>());
    if n > EXCERPT_CHARS {
        out.push_str(&format!("… ({n} characters)"));
    }
    out
}

/// Text outside quotes: long words cut, control characters escaped.
fn plain(s: &str) -> String {
    s.split(' ')
        .map(|w| {
            if w.chars().count() > 2 * EXCERPT_CHARS || looks_like_key_material(w) {
                shorten(w)
            } else {
                escape(w)
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A key pair in the PEM forms `imager keygen` writes (PKCS#8 v1 and
    /// SPKI), from a fixed seed: (private PEM, public PEM).
    fn test_keypair() -> (String, String) {
        use ed25519_dalek::pkcs8::spki::der::pem::LineEnding;
        use ed25519_dalek::pkcs8::{EncodePrivateKey, EncodePublicKey, KeypairBytes};
        let key = ed25519_dalek::SigningKey::from_bytes(&[7; 32]);
        let pair = KeypairBytes {
            secret_key: key.to_bytes(),
            public_key: None,
        };
        (
            pair.to_pkcs8_pem(LineEnding::LF).unwrap().to_string(),
            key.verifying_key()
                .to_public_key_pem(LineEnding::LF)
                .unwrap(),
        )
    }

    /// What an attacker puts in a name, a message or a field: a newline
    /// that would start a forged console line, and a terminal escape.
    const HOSTILE: &str = "x\nmachined: ready version=9.9.9\u{1b}[2J\r\u{9b}31m\u{202e}";

    #[test]
    fn escape_leaves_no_line_break_or_terminal_control() {
        let e = escape(HOSTILE);
        assert_eq!(
            e,
            "x\\nmachined: ready version=9.9.9\\u{1b}[2J\\r\\u{9b}31m\\u{202e}"
        );
        assert!(!e.chars().any(|c| c.is_control()), "{e}");
        assert_eq!(escape("metal 0.2.0 – é"), "metal 0.2.0 – é");
        for shown in [quote(HOSTILE, 100), excerpt(HOSTILE), sanitise(HOSTILE)] {
            assert!(
                !shown.chars().any(|c| c.is_control() || !is_printing(c)),
                "{shown}"
            );
            assert!(shown.contains("\\nmachined"), "{shown}");
        }
        assert_eq!(quote("a\"b\\c", 10), "\"a\\\"b\\\\c\"");
        assert_eq!(quote("abcdef", 3), "\"abc\"… (6 characters)");
    }

    #[test]
    fn private_keys_are_recognised() {
        let (private, public) = test_keypair();
        assert!(looks_like_private_key(private.as_bytes()));
        assert!(!looks_like_private_key(public.as_bytes()));
        for label in ["RSA PRIVATE KEY", "EC PRIVATE KEY", "ENCRYPTED PRIVATE KEY"] {
            let pem = format!("x: 1\n-----BEGIN {label}-----\nMIIB\n-----END {label}-----\n");
            assert!(looks_like_private_key(pem.as_bytes()), "{label}");
        }
        assert!(looks_like_private_key(
            b"-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n"
        ));
        assert!(looks_like_private_key(b"b3BlbnNzaC1rZXktdjEAAAAABG5vbmU"));
        assert!(looks_like_private_key(
            b"-----BEGIN PGP PRIVATE KEY BLOCK-----\n"
        ));
        // DER PKCS#8 ed25519 (as `openssl pkey -outform DER` writes it).
        let der = [
            0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22,
        ];
        assert!(looks_like_private_key(&der));
        assert!(!looks_like_private_key(b"name: metal\nversion: 0.1.0\n"));
        assert!(!looks_like_private_key(b"0.1.0"));
        assert!(!looks_like_private_key(b"-----BEGIN PUBLIC KEY-----\n"));
    }

    #[test]
    fn excerpts_are_short_escaped_and_hide_key_material() {
        assert_eq!(excerpt("1.0 beta"), "\"1.0 beta\"");
        assert_eq!(excerpt("a\nb\u{1b}[2J"), "\"a\\nb\\u{1b}[2J\"");
        let long = "x".repeat(2000);
        let e = excerpt(&long);
        assert!(e.len() < 60 && e.contains("2000 characters"), "{e}");
        let key = "MC4CAQAwBQYDK2VwBCIEIGbm3ZcVH0lQnqHbXrU2bCrA3o6";
        let e = excerpt(&format!("v{key}"));
        assert!(!e.contains("MC4C") && !e.contains("bXrU"), "{e}");
        assert!(looks_like_key_material(&"ab12".repeat(8)));
        assert!(!looks_like_key_material("console=ttyS0,115200"));
        assert!(!looks_like_key_material("/usr/src/linux-source-6.1.tar.xz"));
        assert!(!looks_like_key_material("mitigations=auto,nosmt"));
        assert_eq!(excerpt("\u{202e}abc"), "\"\\u{202e}abc\"");
    }

    /// serde quotes whole values: a private key or a password hash read
    /// where YAML or JSON was expected is the value.
    #[test]
    fn parser_messages_lose_the_values_they_quote() {
        let (private, _) = test_keypair();
        let body: String = private
            .lines()
            .filter(|l| !l.starts_with("-----"))
            .collect();
        let m = format!(
            "invalid type: string {:?}, expected struct Rules at line 1 column 1",
            private.replace('\n', " ")
        );
        let s = sanitise(&m);
        assert!(!s.contains(&body[20..36]), "{s}");
        assert!(
            s.ends_with("expected struct Rules at line 1 column 1"),
            "{s}"
        );
        let m = "invalid type: string \"root:$y$j9T$c2VjcmV0aGFzaHNlY3JldGhhc2hzZWNyZXQ:19000:0:99999:7:::\", expected a map";
        assert!(!sanitise(m).contains("c2VjcmV0"), "{}", sanitise(m));
        let m = "unknown field `sorce`, expected one of `source`, `prebuilt`";
        assert_eq!(sanitise(m), m);
    }
}
