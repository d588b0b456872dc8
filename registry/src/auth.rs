//! Registry authentication: the credentials a caller gives, the
//! `WWW-Authenticate` challenges a registry answers a 401 with (RFC 7235,
//! as the distribution specification's token flow uses them), the token
//! service's reply (Docker's token specification: `token` or
//! `access_token`, `expires_in`), and the cache of the `Authorization`
//! values they make.
//!
//! Everything a registry or token service sends is untrusted and bounded
//! here: [`parse_challenges`] and [`parse_token_reply`] have the fuzz target
//! `registry_auth`. Secrets never reach a message: [`Credentials`]'s
//! `Debug` prints the user name only, and no error quotes a token.
//! docs/registry.md, "Authentication", says what is sent where.

use crate::error::{Error, ErrorKind};
use crate::reference::excerpt;
use base64::Engine as _;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// The longest `WWW-Authenticate` value parsed.
pub const MAX_CHALLENGE: usize = 8 << 10;
/// The most challenges, and parameters per challenge, parsed from one header.
pub const MAX_CHALLENGES: usize = 16;
pub const MAX_PARAMS: usize = 32;
/// The largest token service reply read.
pub const MAX_TOKEN_REPLY: u64 = 1 << 20;
/// The longest token used (registries' tokens are a few KiB: ECR's the
/// largest, about 2 KiB; a JWT with a certificate chain about 4 KiB).
pub const MAX_TOKEN: usize = 16 << 10;
/// A token whose reply gives no lifetime lives this long (the token
/// specification's default), and a shorter lifetime is raised to it.
pub const DEFAULT_TOKEN_LIFETIME: Duration = Duration::from_secs(60);
/// A cached token is renewed this long before it expires.
pub const TOKEN_MARGIN: Duration = Duration::from_secs(10);
/// The longest user name, password or token (ECR's passwords, the longest
/// registries issue, are about 2.5 KiB; the node API's bound is the same:
/// `nodeapi::proto::MAX_CREDENTIAL`).
pub const MAX_CREDENTIAL: usize = 8 * 1024;
/// The most `Authorization` values cached by one client.
pub const MAX_CACHED: usize = 64;

/// What a client presents to one registry.
#[derive(Clone, Default, PartialEq, Eq)]
pub enum Credentials {
    /// Nothing: public images only (with an anonymous token where the
    /// registry's token flow asks for one).
    #[default]
    Anonymous,
    /// A user name and a password (or a personal access token used as one):
    /// sent as Basic to a registry that asks for Basic, and to the token
    /// service for a bearer token.
    Basic { username: String, password: String },
    /// An OAuth2 refresh token (Docker's `identitytoken`), exchanged at the
    /// token service for an access token.
    IdentityToken(String),
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Credentials::Anonymous => f.write_str("Anonymous"),
            Credentials::Basic { username, .. } => f
                .debug_struct("Basic")
                .field("username", username)
                .field("password", &"(hidden)")
                .finish(),
            Credentials::IdentityToken(_) => f.write_str("IdentityToken((hidden))"),
        }
    }
}

impl Credentials {
    /// Credentials from the operator: a user name and a secret, checked to
    /// be sendable (no control characters; a user name without `:`).
    pub fn basic(username: &str, password: &str) -> Result<Credentials, Error> {
        if username.is_empty()
            || username.len() > MAX_CREDENTIAL
            || username.contains(':')
            || has_control(username)
        {
            return Err(Error::new(
                ErrorKind::Invalid,
                format!(
                    "a registry user name must be 1 to {MAX_CREDENTIAL} bytes, without ':' or \
                     control characters"
                ),
            ));
        }
        check_secret(password)?;
        Ok(Credentials::Basic {
            username: username.into(),
            password: password.into(),
        })
    }

    /// An identity (OAuth2 refresh) token, checked as a password is.
    pub fn identity_token(token: &str) -> Result<Credentials, Error> {
        check_secret(token)?;
        Ok(Credentials::IdentityToken(token.into()))
    }

    /// Whether anything is presented.
    pub fn is_anonymous(&self) -> bool {
        matches!(self, Credentials::Anonymous)
    }

    /// `Basic base64(user:password)`, for Basic credentials.
    pub(crate) fn basic_header(&self) -> Option<String> {
        match self {
            Credentials::Basic { username, password } => Some(format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(format!("{username}:{password}"))
            )),
            _ => None,
        }
    }
}

/// A password or token: 1 to [`MAX_CREDENTIAL`] bytes without control
/// characters (the message never quotes it).
fn check_secret(secret: &str) -> Result<(), Error> {
    if secret.is_empty() || secret.len() > MAX_CREDENTIAL || has_control(secret) {
        return Err(Error::new(
            ErrorKind::Invalid,
            format!(
                "a registry password or token must be 1 to {MAX_CREDENTIAL} bytes, without \
                 control characters"
            ),
        ));
    }
    Ok(())
}

fn has_control(s: &str) -> bool {
    s.chars().any(char::is_control)
}

/// One challenge of a `WWW-Authenticate` header: its scheme (lowercase) and
/// its parameters (names lowercase, values unquoted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Challenge {
    pub scheme: String,
    pub params: Vec<(String, String)>,
}

impl Challenge {
    /// The value of parameter `name` (lowercase), if given once or more
    /// (the first).
    pub fn param(&self, name: &str) -> Option<&str> {
        self.params
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

fn invalid(what: &str, header: &str) -> Error {
    Error::new(
        ErrorKind::Http,
        format!(
            "the registry's authentication challenge {} is malformed ({what}): refused",
            excerpt(header)
        ),
    )
}

/// Where a token68 starting at `i` ends, if one does: `[A-Za-z0-9-._~+/]+`
/// and `=` padding, then the end or a comma.
fn token68_end(b: &[u8], i: usize) -> Option<usize> {
    let mut j = i;
    while j < b.len() && (b[j].is_ascii_alphanumeric() || b"-._~+/".contains(&b[j])) {
        j += 1;
    }
    if j == i {
        return None;
    }
    while j < b.len() && b[j] == b'=' {
        j += 1;
    }
    let mut k = j;
    while k < b.len() && (b[k] == b' ' || b[k] == b'\t') {
        k += 1;
    }
    (k == b.len() || b[k] == b',').then_some(j)
}

fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Parses a `WWW-Authenticate` value: one or more challenges
/// (`Bearer realm="…",service="…",scope="…"`, `Basic realm="…"`),
/// separated by commas. A token68 form (`Negotiate abc==`) is kept as a
/// parameter with an empty name. At most [`MAX_CHALLENGE`] bytes,
/// [`MAX_CHALLENGES`] challenges and [`MAX_PARAMS`] parameters each;
/// quoted values are unescaped and may hold no control character.
pub fn parse_challenges(header: &str) -> Result<Vec<Challenge>, Error> {
    if header.len() > MAX_CHALLENGE {
        return Err(invalid(&format!("over {MAX_CHALLENGE} bytes"), header));
    }
    let b = header.as_bytes();
    let mut i = 0;
    let mut out: Vec<Challenge> = Vec::new();
    let skip_ws = |i: &mut usize| {
        while *i < b.len() && (b[*i] == b' ' || b[*i] == b'\t') {
            *i += 1;
        }
    };
    let token = |i: &mut usize| -> &str {
        let start = *i;
        while *i < b.len() && is_tchar(b[*i]) {
            *i += 1;
        }
        &header[start..*i]
    };
    loop {
        while i < b.len() && (b[i] == b' ' || b[i] == b'\t' || b[i] == b',') {
            i += 1;
        }
        if i >= b.len() {
            break;
        }
        let scheme = token(&mut i);
        if scheme.is_empty() {
            return Err(invalid("expected an authentication scheme", header));
        }
        if out.len() == MAX_CHALLENGES {
            return Err(invalid(
                &format!("more than {MAX_CHALLENGES} challenges"),
                header,
            ));
        }
        let mut challenge = Challenge {
            scheme: scheme.to_ascii_lowercase(),
            params: Vec::new(),
        };
        skip_ws(&mut i);
        // A token68 (`Negotiate abc==`), or parameters until the end or the
        // next challenge's scheme.
        if let Some(end) = token68_end(b, i) {
            challenge
                .params
                .push((String::new(), header[i..end].to_string()));
            i = end;
            out.push(challenge);
            continue;
        }
        loop {
            let start = i;
            let name = token(&mut i);
            skip_ws(&mut i);
            if name.is_empty() || i >= b.len() || b[i] != b'=' {
                // Not `name=`: the next challenge.
                i = start;
                break;
            }
            if challenge.params.len() == MAX_PARAMS {
                return Err(invalid(
                    &format!("more than {MAX_PARAMS} parameters"),
                    header,
                ));
            }
            i += 1;
            skip_ws(&mut i);
            let value = if i < b.len() && b[i] == b'"' {
                i += 1;
                let mut v = String::new();
                loop {
                    let Some(c) = header[i..].chars().next() else {
                        return Err(invalid("an unterminated quoted value", header));
                    };
                    i += c.len_utf8();
                    match c {
                        '"' => break,
                        '\\' => {
                            let Some(e) = header[i..].chars().next() else {
                                return Err(invalid("an unterminated quoted value", header));
                            };
                            i += e.len_utf8();
                            v.push(e);
                        }
                        c => v.push(c),
                    }
                }
                v
            } else {
                token(&mut i).to_string()
            };
            if has_control(&value) {
                return Err(invalid("a control character in a value", header));
            }
            challenge.params.push((name.to_ascii_lowercase(), value));
            skip_ws(&mut i);
            if i < b.len() && b[i] == b',' {
                i += 1;
                skip_ws(&mut i);
                continue;
            }
            if i < b.len() {
                return Err(invalid("expected ',' after a parameter", header));
            }
            break;
        }
        out.push(challenge);
    }
    if out.is_empty() {
        return Err(invalid("no challenge", header));
    }
    Ok(out)
}

/// What a token service answered.
#[derive(Clone, PartialEq, Eq)]
pub struct TokenReply {
    /// The bearer token: visible ASCII only, at most [`MAX_TOKEN`] bytes.
    pub token: String,
    /// How long it may be used (the reply's `expires_in`, at least
    /// [`DEFAULT_TOKEN_LIFETIME`]).
    pub lifetime: Duration,
}

impl std::fmt::Debug for TokenReply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenReply")
            .field("token", &"(hidden)")
            .field("lifetime", &self.lifetime)
            .finish()
    }
}

/// Parses a token service's JSON reply: `token` (Docker's) or
/// `access_token` (OAuth2's; `token` first when both are given), and
/// `expires_in` in seconds. `what` names the service in errors; the token
/// itself is never quoted.
pub fn parse_token_reply(bytes: &[u8], what: &str) -> Result<TokenReply, Error> {
    #[derive(serde::Deserialize)]
    struct Reply {
        #[serde(default)]
        token: Option<String>,
        #[serde(default)]
        access_token: Option<String>,
        #[serde(default)]
        expires_in: Option<serde_json::Value>,
    }
    let bad = |why: &str| {
        Error::new(
            ErrorKind::Http,
            format!("the token service {what} sent an invalid reply ({why}): refused"),
        )
    };
    if bytes.len() as u64 > MAX_TOKEN_REPLY {
        return Err(bad(&format!("over {MAX_TOKEN_REPLY} bytes")));
    }
    let reply: Reply = serde_json::from_slice(bytes).map_err(|_| bad("not a JSON object"))?;
    let token = reply
        .token
        .filter(|t| !t.is_empty())
        .or(reply.access_token.filter(|t| !t.is_empty()))
        .ok_or_else(|| bad("no token"))?;
    if token.len() > MAX_TOKEN {
        return Err(bad(&format!("a token of over {MAX_TOKEN} bytes")));
    }
    if !token.bytes().all(|b| (0x21..=0x7e).contains(&b)) {
        return Err(bad("a token with characters a header cannot carry"));
    }
    let seconds = match reply.expires_in {
        None | Some(serde_json::Value::Null) => 0,
        Some(v) => v
            .as_u64()
            .ok_or_else(|| bad("expires_in is not a whole number"))?,
    };
    // A year at most: a token is renewed on 401 anyway.
    let lifetime = Duration::from_secs(seconds.min(365 * 86400)).max(DEFAULT_TOKEN_LIFETIME);
    Ok(TokenReply { token, lifetime })
}

/// The `Authorization` values a client has obtained, per registry and
/// scope, until they expire (a monotonic clock: a token's lifetime is
/// counted from when it was received).
#[derive(Default)]
pub(crate) struct TokenCache {
    entries: BTreeMap<(String, String), (String, Option<Instant>)>,
}

impl TokenCache {
    pub(crate) fn get(&self, registry: &str, scope: &str) -> Option<String> {
        let (value, expires) = self
            .entries
            .get(&(registry.to_string(), scope.to_string()))?;
        match expires {
            Some(t) if Instant::now() + TOKEN_MARGIN >= *t => None,
            _ => Some(value.clone()),
        }
    }

    /// Keeps `value` for `registry` and `scope`, for `lifetime` (none:
    /// until refused, as Basic credentials).
    pub(crate) fn put(
        &mut self,
        registry: &str,
        scope: &str,
        value: String,
        lifetime: Option<Duration>,
    ) {
        if self.entries.len() >= MAX_CACHED {
            self.entries.clear();
        }
        self.entries.insert(
            (registry.to_string(), scope.to_string()),
            (value, lifetime.map(|l| Instant::now() + l)),
        );
    }

    pub(crate) fn forget(&mut self, registry: &str, scope: &str) {
        self.entries
            .remove(&(registry.to_string(), scope.to_string()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(h: &str) -> Challenge {
        match parse_challenges(h) {
            Ok(mut v) if v.len() == 1 => v.remove(0),
            other => panic!("{h}: {other:?}"),
        }
    }

    #[test]
    fn bearer_challenges_as_registries_send_them() {
        // Docker Hub's, GHCR's and distribution's forms.
        let c = one(
            r#"Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:library/alpine:pull""#,
        );
        assert_eq!(c.scheme, "bearer");
        assert_eq!(c.param("realm"), Some("https://auth.docker.io/token"));
        assert_eq!(c.param("service"), Some("registry.docker.io"));
        assert_eq!(c.param("scope"), Some("repository:library/alpine:pull"));
        let c = one(
            r#"Bearer realm="https://ghcr.io/token",service="ghcr.io",scope="repository:a/b:pull,push""#,
        );
        assert_eq!(c.param("scope"), Some("repository:a/b:pull,push"));
        let c = one(r#"basic Realm=Registry"#);
        assert_eq!(
            (c.scheme.as_str(), c.param("realm")),
            ("basic", Some("Registry"))
        );
        let c = one(r#"Bearer realm = "r\"q\\" , error="invalid_token""#);
        assert_eq!(c.param("realm"), Some(r#"r"q\"#));
        assert_eq!(c.param("error"), Some("invalid_token"));
    }

    #[test]
    fn several_challenges_in_one_header() {
        let Ok(v) = parse_challenges(
            r#"Negotiate abc==, Basic realm="x", Bearer realm="https://t/",service=s"#,
        ) else {
            panic!("parsed");
        };
        let schemes: Vec<_> = v.iter().map(|c| c.scheme.as_str()).collect();
        assert_eq!(schemes, ["negotiate", "basic", "bearer"]);
        assert_eq!(v[0].param(""), Some("abc=="));
        assert_eq!(v[2].param("service"), Some("s"));
        let Ok(v) = parse_challenges("Basic, Bearer") else {
            panic!("parsed");
        };
        assert_eq!(v.len(), 2);
    }

    #[test]
    fn malformed_challenges_are_refused() {
        for bad in [
            "",
            " , ",
            "=x",
            r#"Bearer realm="unterminated"#,
            r#"Bearer realm="a\"#,
            "Bearer realm=\"a\u{7}b\"",
            r#"Bearer realm="a" service="b""#,
        ] {
            assert!(parse_challenges(bad).is_err(), "{bad:?} parsed");
        }
        let many = "Basic, ".repeat(MAX_CHALLENGES + 1);
        assert!(parse_challenges(&many).is_err());
        let params: Vec<String> = (0..=MAX_PARAMS).map(|i| format!("p{i}=v")).collect();
        assert!(parse_challenges(&format!("Bearer {}", params.join(","))).is_err());
        assert!(parse_challenges(&"a".repeat(MAX_CHALLENGE + 1)).is_err());
    }

    #[test]
    fn token_replies() {
        let r = |s: &str| parse_token_reply(s.as_bytes(), "t");
        let Ok(t) = r(r#"{"token":"abc.def","expires_in":300,"issued_at":"2026-01-01T00:00:00Z"}"#)
        else {
            panic!("parsed");
        };
        assert_eq!((t.token.as_str(), t.lifetime.as_secs()), ("abc.def", 300));
        let Ok(t) = r(r#"{"access_token":"x","expires_in":5}"#) else {
            panic!("parsed");
        };
        assert_eq!(
            (t.token.as_str(), t.lifetime),
            ("x", DEFAULT_TOKEN_LIFETIME)
        );
        let Ok(t) = r(r#"{"token":"","access_token":"y"}"#) else {
            panic!("parsed");
        };
        assert_eq!(t.token, "y");
        for bad in [
            "",
            "[]",
            "{}",
            r#"{"token":""}"#,
            r#"{"token":"a b"}"#,
            r#"{"token":"a\r\nX-Evil: 1"}"#,
            r#"{"token":"a","expires_in":-1}"#,
            r#"{"token":"a","expires_in":"300"}"#,
        ] {
            let Err(e) = r(bad) else {
                panic!("{bad} accepted");
            };
            assert!(!e.to_string().contains("X-Evil"), "{e}");
        }
        let long = format!(r#"{{"token":"{}"}}"#, "a".repeat(MAX_TOKEN + 1));
        assert!(r(&long).is_err());
    }

    #[test]
    fn secrets_are_never_in_debug_output() {
        let Ok(c) = Credentials::basic("ci-bot", "s3cret-pass") else {
            panic!("valid");
        };
        let shown = format!("{c:?} {:?}", Credentials::IdentityToken("rt-s3cret".into()));
        assert!(shown.contains("ci-bot"), "{shown}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert_eq!(
            c.basic_header().as_deref(),
            Some("Basic Y2ktYm90OnMzY3JldC1wYXNz")
        );
        let long = "x".repeat(MAX_CREDENTIAL + 1);
        assert!(Credentials::identity_token(&long).is_err());
        assert!(Credentials::identity_token("rt").is_ok());
        for (u, p) in [
            ("", "p"),
            ("a:b", "p"),
            ("u", ""),
            ("u", "p\n"),
            ("u", long.as_str()),
        ] {
            assert!(Credentials::basic(u, p).is_err(), "{u:?} {p:?}");
        }
    }

    #[test]
    fn cached_values_expire_before_their_lifetime_ends() {
        let mut c = TokenCache::default();
        c.put("r", "s", "Bearer a".into(), Some(Duration::from_secs(3600)));
        c.put("r", "short", "Bearer b".into(), Some(TOKEN_MARGIN));
        c.put("r", "basic", "Basic c".into(), None);
        assert_eq!(c.get("r", "s").as_deref(), Some("Bearer a"));
        assert_eq!(c.get("r", "short"), None);
        assert_eq!(c.get("r", "basic").as_deref(), Some("Basic c"));
        assert_eq!(c.get("other", "s"), None);
        c.forget("r", "s");
        assert_eq!(c.get("r", "s"), None);
    }
}
