//! Image references: `REGISTRY/NAME[:TAG][@sha256:HEX]`, with the registry
//! always given (no implicit Docker Hub), at least a tag or a digest (no
//! implicit `latest`), and the grammars of the OCI distribution
//! specification for the repository name, the tag and the digest. Every
//! part is bounded; [`Reference`]'s `Display` gives back the parsed text.

use crate::error::{Error, ErrorKind};
use std::fmt;

/// The longest reference accepted, in bytes.
pub const MAX_REFERENCE: usize = 512;
/// The longest registry (host and port), as a DNS name may be.
pub const MAX_REGISTRY: usize = 253;
/// The longest repository name (the distribution specification's bound
/// counts the registry in; this counts only the name, and
/// [`MAX_REFERENCE`] bounds the whole).
pub const MAX_NAME: usize = 255;
/// The longest tag: the grammar's `[a-zA-Z0-9_][a-zA-Z0-9._-]{0,127}`.
pub const MAX_TAG: usize = 128;

/// A parsed image reference.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Reference {
    registry: String,
    name: String,
    tag: Option<String>,
    digest: Option<Digest>,
}

/// A SHA-256 content digest, `sha256:` and 64 lowercase hex digits (the
/// only algorithm this client accepts).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest(String);

impl Digest {
    /// Parses `sha256:<64 lowercase hex>`.
    pub fn parse(s: &str) -> Result<Digest, Error> {
        let Some(hex) = s.strip_prefix("sha256:") else {
            let shown = excerpt(s);
            return Err(Error::new(
                ErrorKind::Invalid,
                if s.contains(':') {
                    format!("digest {shown}: only sha256 digests are supported")
                } else {
                    format!("digest {shown} is not of the form sha256:<64 hex digits>")
                },
            ));
        };
        if hex.len() != 64
            || !hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return Err(Error::new(
                ErrorKind::Invalid,
                format!(
                    "digest {} is not of the form sha256:<64 lowercase hex digits>",
                    excerpt(s)
                ),
            ));
        }
        Ok(Digest(s.to_string()))
    }

    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Digest {
        use sha2::Digest as _;
        Digest::from_sha256(sha2::Sha256::digest(bytes).as_slice())
    }

    pub(crate) fn from_sha256(raw: &[u8]) -> Digest {
        let mut s = String::with_capacity(71);
        s.push_str("sha256:");
        for b in raw {
            s.push_str(&format!("{b:02x}"));
        }
        Digest(s)
    }

    /// `sha256:<hex>`.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The 64 hex digits.
    pub fn hex(&self) -> &str {
        self.0.get(7..).unwrap_or_default()
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Reference {
    /// Parses `REGISTRY/NAME:TAG`, `REGISTRY/NAME@sha256:HEX` or
    /// `REGISTRY/NAME:TAG@sha256:HEX`. REGISTRY is a host name, an IPv4
    /// address or a bracketed IPv6 address, with an optional port; it must
    /// contain a `.` or a `:`, or be `localhost` (as Docker tells a
    /// registry from a name's first component), and is never implied.
    pub fn parse(s: &str) -> Result<Reference, Error> {
        let bad = |why: String| {
            Error::new(
                ErrorKind::Invalid,
                format!("image reference {}: {why}", excerpt(s)),
            )
        };
        if s.len() > MAX_REFERENCE {
            return Err(bad(format!("longer than {MAX_REFERENCE} bytes")));
        }
        let (rest, digest) = match s.split_once('@') {
            Some((r, d)) => (r, Some(Digest::parse(d).map_err(|e| bad(e.to_string()))?)),
            None => (s, None),
        };
        let Some((registry, path)) = rest.split_once('/') else {
            return Err(bad(
                "no registry: give REGISTRY/NAME:TAG, e.g. 127.0.0.1:5000/metal/installer:0.1.0"
                    .into(),
            ));
        };
        check_registry(registry).map_err(bad)?;
        // The tag follows the last ':' after the last '/'.
        let (name, tag) = match path.rsplit_once(':') {
            Some((n, t)) if !t.contains('/') => (n, Some(t)),
            _ => (path, None),
        };
        check_name(name).map_err(bad)?;
        if let Some(t) = tag {
            check_tag(t).map_err(bad)?;
        }
        if tag.is_none() && digest.is_none() {
            return Err(bad(
                "no tag and no digest: name the image exactly (NAME:TAG or NAME@sha256:…); \
                 there is no implicit `latest`"
                    .into(),
            ));
        }
        Ok(Reference {
            registry: registry.to_string(),
            name: name.to_string(),
            tag: tag.map(str::to_string),
            digest,
        })
    }

    /// The registry: host and port as given (`127.0.0.1:5000`).
    pub fn registry(&self) -> &str {
        &self.registry
    }

    /// The repository name (`metal/installer`).
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn tag(&self) -> Option<&str> {
        self.tag.as_deref()
    }

    pub fn digest(&self) -> Option<&Digest> {
        self.digest.as_ref()
    }

    /// What the manifest is fetched by: the digest when there is one (the
    /// tag is then only a label), else the tag.
    pub(crate) fn selector(&self) -> &str {
        match (&self.digest, &self.tag) {
            (Some(d), _) => d.as_str(),
            (None, Some(t)) => t,
            // parse() refuses a reference with neither.
            (None, None) => "latest",
        }
    }

    /// The same repository, pinned to `digest` (no tag).
    pub fn with_digest(&self, digest: Digest) -> Reference {
        Reference {
            registry: self.registry.clone(),
            name: self.name.clone(),
            tag: None,
            digest: Some(digest),
        }
    }
}

impl std::str::FromStr for Reference {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Reference::parse(s)
    }
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.registry, self.name)?;
        if let Some(t) = &self.tag {
            write!(f, ":{t}")?;
        }
        if let Some(d) = &self.digest {
            write!(f, "@{d}")?;
        }
        Ok(())
    }
}

/// At most 40 characters of an input, quoted and escaped
/// ([`contract::text::quote`]): what messages show of text from outside.
pub(crate) fn excerpt(s: &str) -> String {
    contract::text::quote(s, 40)
}

fn check_registry(r: &str) -> Result<(), String> {
    if r.is_empty() {
        return Err("empty registry".into());
    }
    if r.len() > MAX_REGISTRY {
        return Err(format!("registry longer than {MAX_REGISTRY} bytes"));
    }
    let (host, port) = if let Some(v6) = r.strip_prefix('[') {
        let Some((addr, after)) = v6.split_once(']') else {
            return Err("registry: unclosed [ of an IPv6 address".into());
        };
        if addr.is_empty()
            || !addr
                .bytes()
                .all(|b| b.is_ascii_hexdigit() || b == b':' || b == b'.')
        {
            return Err("registry: not an IPv6 address between [ ]".into());
        }
        let port = match after {
            "" => None,
            p => Some(
                p.strip_prefix(':')
                    .ok_or("registry: after ] comes only :PORT")?,
            ),
        };
        (None, port)
    } else {
        match r.split_once(':') {
            Some((h, p)) => (Some(h), Some(p)),
            None => (Some(r), None),
        }
    };
    if let Some(p) = port {
        let ok = !p.is_empty()
            && p.len() <= 5
            && p.bytes().all(|b| b.is_ascii_digit())
            && p.parse::<u32>().is_ok_and(|n| (1..=65535).contains(&n));
        if !ok {
            return Err(format!("registry port {} is not 1–65535", excerpt(p)));
        }
    }
    if let Some(h) = host {
        if h.is_empty() {
            return Err("registry: empty host".into());
        }
        for label in h.split('.') {
            let b = label.as_bytes();
            let ok = !b.is_empty()
                && b.len() <= 63
                && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'-')
                && b.first() != Some(&b'-')
                && b.last() != Some(&b'-');
            if !ok {
                return Err(format!(
                    "registry host {} is not a host name or IPv4 address",
                    excerpt(h)
                ));
            }
        }
        if !(h.contains('.') || port.is_some() || h == "localhost") {
            return Err(format!(
                "{} is not a registry (a registry has a '.' or a ':PORT', or is localhost): \
                 give REGISTRY/NAME:TAG in full",
                excerpt(r)
            ));
        }
    }
    Ok(())
}

/// The distribution specification's name grammar:
/// `[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*(\/[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*)*`.
fn check_name(n: &str) -> Result<(), String> {
    if n.is_empty() {
        return Err("empty repository name".into());
    }
    if n.len() > MAX_NAME {
        return Err(format!("repository name longer than {MAX_NAME} bytes"));
    }
    for component in n.split('/') {
        if !name_component(component.as_bytes()) {
            return Err(format!(
                "repository name component {} is not lowercase letters and digits separated \
                 by '.', '_', '__' or dashes",
                excerpt(component)
            ));
        }
    }
    Ok(())
}

fn name_component(c: &[u8]) -> bool {
    let alnum = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let mut i = 0;
    loop {
        // One or more [a-z0-9].
        let start = i;
        while c.get(i).is_some_and(alnum) {
            i += 1;
        }
        if i == start {
            return false;
        }
        if i == c.len() {
            return true;
        }
        // A separator: '.', '_', '__' or '-'+.
        match &c[i..] {
            [b'_', b'_', ..] => i += 2,
            [b'.' | b'_', ..] => i += 1,
            [b'-', ..] => {
                while c.get(i) == Some(&b'-') {
                    i += 1;
                }
            }
            _ => return false,
        }
    }
}

/// `[a-zA-Z0-9_][a-zA-Z0-9._-]{0,127}`.
fn check_tag(t: &str) -> Result<(), String> {
    let b = t.as_bytes();
    let ok = !b.is_empty()
        && b.len() <= MAX_TAG
        && (b[0].is_ascii_alphanumeric() || b[0] == b'_')
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "tag {} is not 1–{MAX_TAG} letters, digits, '_', '.' or '-' (not starting with '.' \
             or '-')",
            excerpt(t)
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEX: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn ok(s: &str) -> Reference {
        match Reference::parse(s) {
            Ok(r) => {
                assert_eq!(r.to_string(), s, "Display round-trips");
                r
            }
            Err(e) => panic!("{s} refused: {e}"),
        }
    }

    fn refused(s: &str, why: &str) {
        match Reference::parse(s) {
            Ok(r) => panic!("{s} accepted as {r:?}"),
            Err(e) => assert!(e.to_string().contains(why), "{s}: {e} (wanted {why:?})"),
        }
    }

    #[test]
    fn parses_tags_and_digests() {
        let r = ok("127.0.0.1:5000/metal/installer:0.2.0");
        assert_eq!(r.registry(), "127.0.0.1:5000");
        assert_eq!(r.name(), "metal/installer");
        assert_eq!(r.tag(), Some("0.2.0"));
        assert_eq!(r.digest(), None);
        assert_eq!(r.selector(), "0.2.0");

        let s = format!("127.0.0.1:5000/metal/installer@sha256:{HEX}");
        let r = ok(&s);
        assert_eq!(r.tag(), None);
        assert_eq!(r.digest().map(Digest::hex), Some(HEX));
        assert_eq!(r.selector(), format!("sha256:{HEX}"));

        let r = ok(&format!("registry.example.com/a/b/c:v1@sha256:{HEX}"));
        assert_eq!(r.registry(), "registry.example.com");
        assert_eq!(r.name(), "a/b/c");
        assert_eq!(r.tag(), Some("v1"));
        // The digest decides what is fetched.
        assert_eq!(r.selector(), format!("sha256:{HEX}"));

        ok("localhost/x:latest");
        ok("[::1]:5000/x:1");
        ok("[fe80::1]/x:1");
        ok("ghcr.io/a-b__c.d/e---f_g:_T.a-g");
        ok(&format!("r.io/n:{}", "a".repeat(128)));
    }

    #[test]
    fn refuses_what_is_not_a_reference() {
        refused("metal/installer:0.1.0", "is not a registry");
        refused("installer:0.1.0", "no registry");
        refused("127.0.0.1:5000/metal/installer", "no tag and no digest");
        refused("127.0.0.1:5000/Metal/installer:1", "component \"Metal\"");
        refused("127.0.0.1:5000/metal//installer:1", "component \"\"");
        refused("127.0.0.1:5000/metal/installer/:1", "component \"\"");
        refused("127.0.0.1:5000/-metal:1", "component");
        refused("127.0.0.1:5000/metal.:1", "component");
        refused("127.0.0.1:5000/me___tal:1", "component");
        refused("127.0.0.1:5000/metal:", "tag \"\"");
        refused("127.0.0.1:5000/metal:.x", "tag");
        refused("127.0.0.1:5000/metal:-x", "tag");
        refused(&format!("r.io/n:{}", "a".repeat(129)), "tag");
        refused("127.0.0.1:5000/metal:a b", "tag");
        refused("127.0.0.1:5000/metal:é", "tag");
        refused("127.0.0.1:99999/metal:1", "port");
        refused("127.0.0.1:0/metal:1", "port");
        refused("127.0.0.1:/metal:1", "port");
        refused("127.0.0.1:+5/metal:1", "port");
        refused("exa_mple.com/metal:1", "host name");
        refused("-a.com/metal:1", "host name");
        refused("a..com/metal:1", "host name");
        refused("[::1/metal:1", "unclosed");
        refused("[::1]x/metal:1", "after ]");
        refused("[zz]/metal:1", "IPv6");
        refused("/metal:1", "empty registry");
        refused("r.io/metal@sha512:00", "only sha256");
        refused("r.io/metal@sha256:00", "64");
        refused(
            &format!("r.io/metal@sha256:{}", HEX.to_uppercase()),
            "lowercase",
        );
        refused(&format!("r.io/metal@sha256:{HEX}0"), "64");
        refused(&format!("r.io/metal@sha256:{HEX}@sha256:{HEX}"), "64");
        refused(&format!("r.io/{}:1", "a".repeat(256)), "longer than 255");
        refused(&format!("r.io/{}:1", "a/".repeat(300)), "longer than 512");
        refused(&format!("{}.io/a:1", "a".repeat(300)), "longer than 253");
    }

    #[test]
    fn messages_show_an_excerpt_only() {
        let long = format!("r.io/a:{}\n{}", "x".repeat(60), "y".repeat(100));
        let e = Reference::parse(&long)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(!e.contains('\n') && !e.contains(&"x".repeat(60)), "{e}");
    }

    #[test]
    fn digests() {
        let d = Digest::of(b"");
        assert_eq!(
            d.as_str(),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(Digest::parse(d.as_str()).ok(), Some(d));
    }
}
