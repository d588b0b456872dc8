//! Where a host's tools keep registry credentials, read as they read them:
//! containers' `auth.json` (podman, skopeo, buildah) and Docker's
//! `config.json`, with their credential helpers (`docker-credential-NAME
//! get`). Only `imager` on a build or operator machine reads these; a node
//! gets its credentials with the upgrade request.
//!
//! The files searched, the first holding an entry for the registry winning
//! (containers-auth.json(5), docker-config):
//!
//! 1. `--authfile FILE` when given, else `$REGISTRY_AUTH_FILE` when set:
//!    that file alone;
//! 2. `$XDG_RUNTIME_DIR/containers/auth.json`;
//! 3. `$XDG_CONFIG_HOME/containers/auth.json` (`~/.config/…`);
//! 4. `$DOCKER_CONFIG/config.json` (`~/.docker/config.json`).
//!
//! In a file: `credHelpers[REGISTRY]` names a helper; else the most
//! specific `auths` key (`REGISTRY/NAME`, its parents, then `REGISTRY`;
//! keys may carry `https://` and a `/v1/`, and Docker Hub's names are one)
//! gives `auth` (base64 of `user:password`) or `identitytoken`; else
//! `credsStore` names the helper for every registry. Nothing read here is
//! ever printed: messages name the file or the helper only.

use crate::auth::Credentials;
use crate::error::{Error, ErrorKind};
use crate::reference::excerpt;
use base64::Engine as _;
use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// The largest auth file read.
pub const MAX_AUTH_FILE: u64 = 1 << 20;
/// The most a credential helper may print.
pub const MAX_HELPER_OUTPUT: u64 = 64 << 10;
/// How long a credential helper may take (it may ask a keychain).
pub const HELPER_TIMEOUT: Duration = Duration::from_secs(60);

/// What a file says about one registry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    /// Credentials kept in the file.
    Credentials(Credentials),
    /// Ask this credential helper (`docker-credential-NAME`).
    Helper(String),
}

/// Credentials found, and where (a file or a helper: for messages).
#[derive(Debug, Clone)]
pub struct Found {
    pub credentials: Credentials,
    pub source: String,
}

#[derive(serde::Deserialize)]
struct File {
    #[serde(default)]
    auths: BTreeMap<String, AuthEntry>,
    #[serde(default, rename = "credHelpers")]
    cred_helpers: BTreeMap<String, String>,
    #[serde(default, rename = "credsStore")]
    creds_store: Option<String>,
}

#[derive(serde::Deserialize)]
struct AuthEntry {
    #[serde(default)]
    auth: Option<String>,
    #[serde(default)]
    identitytoken: Option<String>,
}

/// Docker Hub's names, all one registry.
const DOCKER_HUB: [&str; 3] = ["docker.io", "index.docker.io", "registry-1.docker.io"];

/// A key of `auths` or `credHelpers` as `REGISTRY[/PATH]`: without a scheme,
/// a trailing `/v1/` or `/v2/` or `/`, and Docker Hub's names as
/// `docker.io`; lowercase registry.
fn normalize_key(key: &str) -> String {
    let k = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    let k = k.trim_end_matches('/');
    let k = k
        .strip_suffix("/v1")
        .or_else(|| k.strip_suffix("/v2"))
        .unwrap_or(k);
    let (host, path) = k.split_once('/').map_or((k, ""), |(h, p)| (h, p));
    let host = host.to_ascii_lowercase();
    let host = if DOCKER_HUB.contains(&host.as_str()) {
        "docker.io".to_string()
    } else {
        host
    };
    if path.is_empty() {
        host
    } else {
        format!("{host}/{path}")
    }
}

/// What the auth file `bytes` (`what`: its path, for messages) says about
/// repository `name` of `registry`: `None` when nothing.
pub fn parse(bytes: &[u8], what: &str, registry: &str, name: &str) -> Result<Option<Entry>, Error> {
    let bad = |why: String| Error::new(ErrorKind::Invalid, format!("{what}: {why}"));
    if bytes.len() as u64 > MAX_AUTH_FILE {
        return Err(bad(format!("over {MAX_AUTH_FILE} bytes: not an auth file")));
    }
    // serde_json's messages quote the values they did not expect (an
    // `auth` where an object belongs): only the position is told.
    let file: File = serde_json::from_slice(bytes).map_err(|e| {
        bad(format!(
            "not a valid auth file (line {}, column {}): fix or remove it",
            e.line(),
            e.column()
        ))
    })?;
    let registry = normalize_key(registry);
    let helpers: BTreeMap<String, &String> = file
        .cred_helpers
        .iter()
        .map(|(k, v)| (normalize_key(k), v))
        .collect();
    if let Some(h) = helpers.get(&registry) {
        return helper_name(h, what).map(|h| Some(Entry::Helper(h)));
    }
    let auths: BTreeMap<String, &AuthEntry> = file
        .auths
        .iter()
        .map(|(k, v)| (normalize_key(k), v))
        .collect();
    // REGISTRY/a/b/c, REGISTRY/a/b, REGISTRY/a, REGISTRY.
    let mut candidates = vec![registry.clone()];
    let mut path = String::new();
    for part in name.split('/') {
        path.push('/');
        path.push_str(part);
        candidates.push(format!("{registry}{path}"));
    }
    for key in candidates.iter().rev() {
        let Some(entry) = auths.get(key) else {
            continue;
        };
        if let Some(t) = entry.identitytoken.as_deref().filter(|t| !t.is_empty()) {
            return Credentials::identity_token(t)
                .map(|c| Some(Entry::Credentials(c)))
                .map_err(|e| bad(format!("the identity token for {}: {e}", excerpt(key))));
        }
        if let Some(a) = entry.auth.as_deref().filter(|a| !a.is_empty()) {
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(a.trim())
                .ok()
                .and_then(|d| String::from_utf8(d).ok())
                .ok_or_else(|| {
                    bad(format!(
                        "the auth of {} is not base64 of user:password",
                        excerpt(key)
                    ))
                })?;
            let Some((user, password)) = decoded.split_once(':') else {
                return Err(bad(format!(
                    "the auth of {} is not base64 of user:password",
                    excerpt(key)
                )));
            };
            return Credentials::basic(user, password)
                .map(|c| Some(Entry::Credentials(c)))
                .map_err(|e| bad(format!("the auth of {}: {e}", excerpt(key))));
        }
        // An entry without credentials: a credential store holds them.
        break;
    }
    match &file.creds_store {
        Some(h) if !h.is_empty() => helper_name(h, what).map(|h| Some(Entry::Helper(h))),
        _ => Ok(None),
    }
}

/// A helper's name, checked to be a plain program name suffix.
fn helper_name(h: &str, what: &str) -> Result<String, Error> {
    if h.is_empty()
        || h.len() > 64
        || !h
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        || h.starts_with('.')
    {
        return Err(Error::new(
            ErrorKind::Invalid,
            format!(
                "{what}: credential helper {} is not a valid name",
                excerpt(h)
            ),
        ));
    }
    Ok(h.to_string())
}

/// The auth files searched, in order (see the module's documentation);
/// `explicit` (an `--authfile`) replaces them all.
pub fn files(explicit: Option<&Path>) -> Vec<PathBuf> {
    if let Some(p) = explicit {
        return vec![p.to_path_buf()];
    }
    let env = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(p) = env("REGISTRY_AUTH_FILE") {
        return vec![p];
    }
    let home = env("HOME");
    let mut out = Vec::new();
    if let Some(d) = env("XDG_RUNTIME_DIR") {
        out.push(d.join("containers/auth.json"));
    }
    if let Some(d) = env("XDG_CONFIG_HOME").or_else(|| home.as_ref().map(|h| h.join(".config"))) {
        out.push(d.join("containers/auth.json"));
    }
    if let Some(d) = env("DOCKER_CONFIG").or_else(|| home.as_ref().map(|h| h.join(".docker"))) {
        out.push(d.join("config.json"));
    }
    out
}

/// The credentials this host keeps for repository `name` of `registry`,
/// from the first of `files` that names it (a missing file is skipped; an
/// explicit one must exist), asking its helper when it names one.
pub fn lookup(
    files: &[PathBuf],
    explicit: bool,
    registry: &str,
    name: &str,
) -> Result<Option<Found>, Error> {
    for path in files {
        let what = path.display().to_string();
        let bytes = match std::fs::File::open(path) {
            Ok(f) => {
                let mut bytes = Vec::new();
                f.take(MAX_AUTH_FILE + 1)
                    .read_to_end(&mut bytes)
                    .map_err(|e| Error::new(ErrorKind::Invalid, format!("reading {what}: {e}")))?;
                bytes
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !explicit => continue,
            Err(e) => {
                return Err(Error::new(
                    ErrorKind::Invalid,
                    format!("reading the auth file {what}: {e}"),
                ));
            }
        };
        match parse(&bytes, &what, registry, name)? {
            None => continue,
            Some(Entry::Credentials(credentials)) => {
                return Ok(Some(Found {
                    credentials,
                    source: what,
                }));
            }
            Some(Entry::Helper(h)) => {
                return Ok(run_helper(&h, registry)?.map(|credentials| Found {
                    credentials,
                    source: format!("docker-credential-{h} (named by {what})"),
                }));
            }
        }
    }
    Ok(None)
}

/// Asks `docker-credential-HELPER get` for `registry`'s credentials (its
/// protocol: the server on stdin, `{"Username":…,"Secret":…}` on stdout; a
/// user name `<token>` makes the secret an identity token). A helper that
/// knows none answers an error: then there are none.
pub fn run_helper(helper: &str, registry: &str) -> Result<Option<Credentials>, Error> {
    run_program(Path::new(&format!("docker-credential-{helper}")), registry)
}

/// [`run_helper`] with the helper program given.
fn run_program(program: &Path, registry: &str) -> Result<Option<Credentials>, Error> {
    let program_name = program.display();
    let fail = |why: String| {
        Error::new(
            ErrorKind::Invalid,
            format!("the credential helper {program_name}: {why}"),
        )
    };
    let server = if normalize_key(registry) == "docker.io" {
        "https://index.docker.io/v1/".to_string()
    } else {
        registry.to_string()
    };
    let out = contract::process::run(
        Command::new(program).arg("get"),
        server.as_bytes(),
        MAX_HELPER_OUTPUT,
        HELPER_TIMEOUT,
    )
    .map_err(|e| match e {
        contract::process::Error::Spawn(_) => {
            fail(format!("{e}: install it or remove it from the auth file"))
        }
        _ => fail(e.to_string()),
    })?;
    if out.overflowed() {
        return Err(fail(format!("printed over {MAX_HELPER_OUTPUT} bytes")));
    }
    if !out.status.success() {
        // "credentials not found in native keychain": none kept.
        return Ok(None);
    }
    let out = out.stdout;
    parse_helper_output(&out).map_err(fail).map(Some)
}

/// A credential helper's answer (`{"Username":…,"Secret":…}`).
pub fn parse_helper_output(out: &[u8]) -> Result<Credentials, String> {
    #[derive(serde::Deserialize)]
    struct Answer {
        #[serde(rename = "Username", default)]
        username: String,
        #[serde(rename = "Secret", default)]
        secret: String,
    }
    let a: Answer = serde_json::from_slice(out)
        .map_err(|_| "its answer is not the JSON of the helper protocol".to_string())?;
    if a.username == "<token>" {
        return Credentials::identity_token(&a.secret).map_err(|e| format!("its answer: {e}"));
    }
    Credentials::basic(&a.username, &a.secret).map_err(|e| format!("its answer: {e}"))
}

#[cfg(test)]
mod tests;
