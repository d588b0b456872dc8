//! How `imager` reaches a registry on this host: the one place that turns
//! what the operator gave (flags, auth files, a CA) into a
//! [`registry::Client`] for a reference. Used by `imager push` (and by
//! whatever else of the toolchain talks to registries: one trust and
//! credential path).
//!
//! Credentials, first found wins: given explicitly (`--username` with the
//! password on stdin), else the host's auth files and credential helpers
//! ([`registry::authfile`]: `--authfile`, `$REGISTRY_AUTH_FILE`,
//! containers' `auth.json`, Docker's `config.json`), else none (public
//! images, anonymous tokens). Never printed: messages name where they
//! came from only.

use anyhow::{Context, Result, anyhow};
use registry::{Client, Credentials, Options, Reference};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// The largest CA bundle read (Mozilla's whole bundle is about 220 KiB).
pub const MAX_CA: u64 = 1 << 20;

/// What the operator gave for reaching registries.
#[derive(Debug, Clone, Default)]
pub struct Access {
    /// Credentials given explicitly (they win over any file).
    pub credentials: Option<Credentials>,
    /// An auth file to read instead of the standard ones.
    pub authfile: Option<PathBuf>,
    /// Speak plain HTTP to the reference's registry (a local
    /// `docker-registry`): never to others, never as a fallback.
    pub plain_http: bool,
    /// PEM roots to trust instead of the Mozilla roots (a private CA).
    pub ca: Option<PathBuf>,
}

/// The credentials for `reference`'s registry (see the module's
/// documentation), and where they came from (`None`: none found).
pub fn credentials(
    reference: &Reference,
    explicit: Option<&Credentials>,
    authfile: Option<&std::path::Path>,
) -> Result<(Credentials, Option<String>)> {
    if let Some(c) = explicit {
        return Ok((c.clone(), Some("the command line".to_string())));
    }
    let files = registry::authfile::files(authfile);
    let found = registry::authfile::lookup(
        &files,
        authfile.is_some() || std::env::var_os("REGISTRY_AUTH_FILE").is_some_and(|v| !v.is_empty()),
        reference.registry(),
        reference.name(),
    )
    .map_err(|e| anyhow!("{e}"))?;
    Ok(match found {
        Some(found) => (found.credentials, Some(found.source)),
        None => (Credentials::Anonymous, None),
    })
}

/// A client for `reference`'s registry, and where its credentials came
/// from (`None`: anonymous).
pub fn client(reference: &Reference, access: &Access) -> Result<(Client, Option<String>)> {
    let registry_host = reference.registry();
    let (credentials, source) = credentials(
        reference,
        access.credentials.as_ref(),
        access.authfile.as_deref(),
    )?;
    let ca_pem = match &access.ca {
        None => None,
        Some(p) => {
            let pem = crate::input::read_head(p, "CA certificates", MAX_CA + 1)?;
            anyhow::ensure!(
                pem.len() as u64 <= MAX_CA,
                "{} is over {MAX_CA} bytes: not a PEM bundle of CA certificates",
                p.display()
            );
            Some(pem)
        }
    };
    let options = Options {
        plain_http: if access.plain_http {
            vec![registry_host.to_string()]
        } else {
            Vec::new()
        },
        ca_pem,
        credentials: BTreeMap::from([(registry_host.to_string(), credentials)]),
        ..Options::default()
    };
    let client = Client::new(options).map_err(|e| anyhow!("{e}"))?;
    Ok((client, source))
}

/// Reads a password or token from `input` (the first line, without its
/// line ending), as `docker login --password-stdin` does.
pub fn read_password(input: impl std::io::Read) -> Result<String> {
    use std::io::Read as _;
    let mut bytes = Vec::new();
    input
        .take(64 << 10)
        .read_to_end(&mut bytes)
        .context("reading the password from stdin")?;
    let text =
        String::from_utf8(bytes).map_err(|_| anyhow!("the password on stdin is not UTF-8"))?;
    let line = text.lines().next().unwrap_or_default().to_string();
    anyhow::ensure!(
        !line.is_empty(),
        "no password on stdin: give it on the first line"
    );
    Ok(line)
}
