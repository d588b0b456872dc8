//! PKCS#11 URIs (RFC 7512): how a profile or `--key` names a key on a
//! token or HSM, for example
//! `pkcs11:token=release;object=manifest?module-path=/usr/lib/softhsm/libsofthsm2.so&pin-source=file:/run/pin`.
//!
//! What this parser takes (RFC 7512 §2.3, a subset):
//!
//! | part | attributes |
//! |---|---|
//! | path (`;`-separated) | `token`, `manufacturer`, `serial`, `model` (which token), `slot-id`, `object` (the key's label), `id` (its CKA_ID, percent-encoded bytes), `type` (only `private`, the key signed with) |
//! | query (`&`-separated) | `module-path` (the PKCS#11 library), `module-name` (a library in p11-kit's module directory), `pin-value`, `pin-source` (`file:` URI or a path: the PIN is its first line) |
//!
//! Values are percent-decoded; `token`, `object` and the others are UTF-8
//! text, `id` any bytes. Anything else is refused with what was not
//! understood (RFC 7512 lets a consumer refuse what it does not
//! recognise, and an attribute ignored could select another key). An
//! attribute given twice is refused. The URI is at most [`MAX_URI`] bytes.
//! Parsing never panics and allocates at most the URI's length
//! (fuzz target `signer`).

use std::collections::BTreeMap;
use std::path::PathBuf;

/// The longest URI taken.
pub const MAX_URI: usize = 4096;

/// A parsed URI.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pkcs11Uri {
    pub token: Option<String>,
    pub manufacturer: Option<String>,
    pub serial: Option<String>,
    pub model: Option<String>,
    pub slot_id: Option<u64>,
    /// The key's label (CKA_LABEL).
    pub object: Option<String>,
    /// The key's CKA_ID.
    pub id: Option<Vec<u8>>,
    pub module_path: Option<PathBuf>,
    pub module_name: Option<String>,
    pub pin: Option<Pin>,
}

/// Where the PIN comes from.
#[derive(Clone, PartialEq, Eq)]
pub enum Pin {
    Value(String),
    /// A file whose first line is the PIN.
    Source(PathBuf),
}

impl std::fmt::Debug for Pin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            // Never the PIN.
            Pin::Value(_) => f.write_str("Pin::Value(<redacted>)"),
            Pin::Source(p) => f.debug_tuple("Pin::Source").field(p).finish(),
        }
    }
}

/// Whether `s` is meant as a PKCS#11 URI (not a key file).
pub fn is_uri(s: &str) -> bool {
    s.as_bytes()
        .get(..7)
        .is_some_and(|p| p.eq_ignore_ascii_case(b"pkcs11:"))
}

/// Parses `s`; the error says what to change (values quoted escaped, the
/// PIN never).
pub fn parse(s: &str) -> Result<Pkcs11Uri, String> {
    if s.len() > MAX_URI {
        return Err(format!(
            "a PKCS#11 URI is at most {MAX_URI} bytes; this one is {}",
            s.len()
        ));
    }
    if !is_uri(s) {
        return Err("a PKCS#11 URI starts with pkcs11:".into());
    }
    let rest = &s[7..];
    let (path, query) = match rest.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (rest, None),
    };
    let mut uri = Pkcs11Uri::default();
    let mut seen = BTreeMap::new();
    for attr in path.split(';').filter(|a| !a.is_empty()) {
        let (name, value) = split_attr(attr)?;
        once(&mut seen, name)?;
        let bytes = decode(value, name)?;
        let text = || {
            String::from_utf8(bytes.clone())
                .map_err(|_| format!("the value of {name} is not UTF-8"))
        };
        match name {
            "token" => uri.token = Some(text()?),
            "manufacturer" => uri.manufacturer = Some(text()?),
            "serial" => uri.serial = Some(text()?),
            "model" => uri.model = Some(text()?),
            "object" => uri.object = Some(text()?),
            "id" => uri.id = Some(bytes),
            "slot-id" => {
                uri.slot_id = Some(text()?.parse().map_err(|_| {
                    "slot-id is a decimal number (a slot's number, as pkcs11-tool -L lists it)"
                        .to_string()
                })?)
            }
            "type" => {
                if text()? != "private" {
                    return Err(
                        "type: only type=private (the key that signs) names a signing key".into(),
                    );
                }
            }
            other => {
                return Err(format!(
                    "the path attribute {} is not one this tool understands (token, \
                     manufacturer, serial, model, slot-id, object, id, type)",
                    contract::text::excerpt(other)
                ));
            }
        }
    }
    for attr in query.unwrap_or("").split('&').filter(|a| !a.is_empty()) {
        let (name, value) = split_attr(attr)?;
        once(&mut seen, name)?;
        let bytes = decode(value, name)?;
        let text = String::from_utf8(bytes).map_err(|_| {
            format!(
                "the value of {} is not UTF-8",
                contract::text::excerpt(name)
            )
        })?;
        match name {
            "module-path" => uri.module_path = Some(PathBuf::from(text)),
            "module-name" => {
                if text.is_empty() || text.contains('/') {
                    return Err("module-name is a library's name, without a directory".into());
                }
                uri.module_name = Some(text)
            }
            "pin-value" => uri.pin = Some(Pin::Value(text)),
            "pin-source" => {
                let path = text
                    .strip_prefix("file://")
                    .or_else(|| text.strip_prefix("file:"));
                let path = path.unwrap_or(&text);
                if !path.starts_with('/') {
                    return Err(
                        "pin-source is a file: URI or an absolute path (its first line is the PIN)"
                            .into(),
                    );
                }
                uri.pin = Some(Pin::Source(PathBuf::from(path)))
            }
            other => {
                return Err(format!(
                    "the query attribute {} is not one this tool understands (module-path, \
                     module-name, pin-value, pin-source)",
                    contract::text::excerpt(other)
                ));
            }
        }
    }
    if seen.contains_key("pin-value") && seen.contains_key("pin-source") {
        return Err("give pin-value or pin-source, not both".into());
    }
    if uri.object.is_none() && uri.id.is_none() {
        return Err(
            "name the key: object=LABEL or id=%XX… (pkcs11-tool --list-objects lists them)".into(),
        );
    }
    Ok(uri)
}

/// `NAME=VALUE`. The message does not quote it: a mistyped
/// `pin-value:1234` must not print the PIN.
fn split_attr(attr: &str) -> Result<(&str, &str), String> {
    attr.split_once('=').ok_or_else(|| {
        "an attribute is not NAME=VALUE (after pkcs11:, attributes are NAME=VALUE, \
         separated by ; before the ? and by & after it)"
            .to_string()
    })
}

fn once<'a>(seen: &mut BTreeMap<&'a str, ()>, name: &'a str) -> Result<(), String> {
    if seen.insert(name, ()).is_some() {
        return Err(format!("{} is given twice", contract::text::excerpt(name)));
    }
    Ok(())
}

/// Percent-decodes `value` (of the attribute `name`).
fn decode(value: &str, name: &str) -> Result<Vec<u8>, String> {
    let b = value.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| {
                    format!(
                        "the value of {} has a % not followed by two hex digits",
                        contract::text::excerpt(name)
                    )
                })?;
            out.push(hex);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_attributes_are_read_and_decoded() {
        let u = parse(
            "pkcs11:token=Release%20Keys;object=manifest;id=%01%ff;slot-id=7;type=private\
             ?module-path=/usr/lib/softhsm/libsofthsm2.so&pin-source=file:/run/pin",
        )
        .unwrap();
        assert_eq!(u.token.as_deref(), Some("Release Keys"));
        assert_eq!(u.object.as_deref(), Some("manifest"));
        assert_eq!(u.id, Some(vec![1, 0xff]));
        assert_eq!(u.slot_id, Some(7));
        assert_eq!(
            u.module_path,
            Some(PathBuf::from("/usr/lib/softhsm/libsofthsm2.so"))
        );
        assert_eq!(u.pin, Some(Pin::Source(PathBuf::from("/run/pin"))));
        let u = parse("PKCS11:object=k?pin-value=12%334&module-name=libsofthsm2.so").unwrap();
        assert_eq!(u.pin, Some(Pin::Value("1234".into())));
        assert_eq!(u.module_name.as_deref(), Some("libsofthsm2.so"));
        assert!(!format!("{u:?}").contains("1234"), "the PIN in Debug");
    }

    #[test]
    fn what_is_not_understood_is_refused_and_said() {
        for (uri, said) in [
            ("pkcs11:token=t", "name the key"),
            ("pkcs11:object=a;object=b", "given twice"),
            ("pkcs11:object=a;library-version=1", "library-version"),
            ("pkcs11:object=a?pin-value=1&pin-source=/p", "not both"),
            ("pkcs11:object=a?pin-source=relative", "absolute path"),
            ("pkcs11:object=%zz", "two hex digits"),
            ("pkcs11:object=%ff", "not UTF-8"),
            ("pkcs11:object=a;type=public", "type=private"),
            ("pkcs11:object=a;slot-id=x", "decimal"),
            ("pkcs11:object", "NAME=VALUE"),
            ("pkcs11:object=a?pin-value:1234", "NAME=VALUE"),
            ("pkcs11:object=a?module-name=../x.so", "without a directory"),
            ("pkcs11:object=a?x-vendor=1", "x-vendor"),
            ("file.pem", "starts with pkcs11:"),
        ] {
            let e = parse(uri).unwrap_err();
            assert!(e.contains(said), "{uri}: {e}");
        }
        // Paths that are no URI, whatever their bytes.
        assert!(!is_uri("/home/émilie/k.pem"));
        assert!(!is_uri("ééééé"));
        assert!(is_uri("PKCS11:object=x"));
        let e = parse("pkcs11:object=a?pin-value:4711zz").unwrap_err();
        assert!(!e.contains("4711zz"), "{e}");
        let long = format!("pkcs11:object={}", "a".repeat(MAX_URI));
        assert!(parse(&long).unwrap_err().contains("at most"));
        // A value with a terminal escape comes back escaped.
        let e = parse("pkcs11:object=a;\u{1b}[2J=1").unwrap_err();
        assert!(!e.contains('\u{1b}'), "{e:?}");
    }
}
