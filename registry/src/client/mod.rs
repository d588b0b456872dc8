//! The client: the calls of the distribution specification a pull needs
//! (`GET /v2/NAME/manifests/REF`, `GET /v2/NAME/blobs/DIGEST`) and a push
//! (`push.rs`), over HTTPS (or plain HTTP for the registries the caller
//! names), with the registry's authentication (`token.rs`), bounded and
//! verified. Requests are sent by `transport.rs`. See docs/registry.md.

mod push;
mod resolve;
pub use push::{PUSH_ATTEMPTS, PUSH_RETRY_WAIT, Pushed};
mod token;
mod transport;

pub use transport::MAX_REDIRECTS;
use transport::{Body, content_length};

use crate::auth::{Credentials, TokenCache};
use crate::blob::VerifiedReader;
use crate::error::{Error, ErrorKind};
use crate::manifest::{self, Descriptor, Document, ImageManifest};
use crate::reference::{Digest, Reference};
use std::collections::BTreeMap;
use std::io::Read;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use ureq::http::header;

/// A blob being read: see [`Client::blob`].
pub type BlobReader = VerifiedReader<Box<dyn Read + Send>>;

/// What the client allows.
#[derive(Debug, Clone)]
pub struct Options {
    /// Registries (`host:port` exactly as in references) spoken to over
    /// plain HTTP; every other one is HTTPS only, and a TLS failure is
    /// never retried over HTTP.
    pub plain_http: Vec<String>,
    /// The largest manifest (or index) read, in bytes.
    pub max_manifest: u64,
    /// The largest blob (layer or config) read, in bytes.
    pub max_blob: u64,
    /// Connecting (each address of the host) and resolving.
    pub connect_timeout: Duration,
    /// Waiting for the answer to a request, and for each read of a body: a
    /// registry that stops sending for this long fails the pull (the stall
    /// limit).
    pub read_timeout: Duration,
    /// Each request in all, its body included, however its bytes arrive
    /// (one byte every few seconds never trips `read_timeout`); none: no
    /// bound but `read_timeout`.
    pub deadline: Option<Duration>,
    /// PEM certificates trusted as roots for HTTPS registries instead of
    /// the Mozilla roots compiled in (a private registry's CA).
    pub ca_pem: Option<Vec<u8>>,
    /// The platform picked from an index (OCI image index, Docker manifest
    /// list): `(os, architecture)`.
    pub platform: (String, String),
    /// Addresses a redirect may never lead to, beside the loopback,
    /// unspecified, link-local (cloud metadata) and multicast ones: the
    /// node's own (a redirect to them would make it talk to its own API).
    pub own_addresses: Vec<std::net::IpAddr>,
    /// Credentials per registry (`host:port` exactly as in references);
    /// a registry not named here is spoken to anonymously. Sent only to
    /// that registry and to the token service its challenge names.
    pub credentials: BTreeMap<String, Credentials>,
    /// How names are resolved: none, the system's resolver (a host);
    /// given, host entries and DNS servers ([`crate::dns`]: the node).
    pub resolver: Option<crate::dns::Resolver>,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            plain_http: Vec::new(),
            // The distribution specification's registries accept manifests
            // of at least 4 MiB; an installer image's is under 1 KiB.
            max_manifest: 4 << 20,
            max_blob: 1 << 30,
            connect_timeout: Duration::from_secs(10),
            read_timeout: Duration::from_secs(30),
            deadline: None,
            ca_pem: None,
            // The machine's own: the node pulls the payload it runs.
            platform: ("linux".into(), contract::Arch::NATIVE.name().into()),
            own_addresses: Vec::new(),
            credentials: BTreeMap::new(),
            resolver: None,
        }
    }
}

/// A registry client (cheap to share across threads: clone it).
#[derive(Clone)]
pub struct Client {
    agent: ureq::Agent,
    options: Options,
    /// The `Authorization` values obtained, shared by the clones.
    tokens: Arc<Mutex<TokenCache>>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("options", &self.options)
            .finish()
    }
}

/// What one request is for, in messages.
struct Target<'a> {
    reference: &'a Reference,
    /// "the manifest", "blob sha256:…"
    what: String,
    /// A push (the `pull,push` scope) rather than a pull.
    push: bool,
}

impl Target<'_> {
    fn pull<'a>(reference: &'a Reference, what: impl Into<String>) -> Target<'a> {
        Target {
            reference,
            what: what.into(),
            push: false,
        }
    }

    /// The token scope (the distribution specification's
    /// `repository:NAME:ACTIONS`).
    fn scope(&self) -> String {
        let actions = if self.push { "pull,push" } else { "pull" };
        format!("repository:{}:{actions}", self.reference.name())
    }

    fn verb(&self) -> &'static str {
        if self.push { "push to" } else { "pull" }
    }
}

impl Client {
    pub fn new(options: Options) -> Result<Client, Error> {
        let roots = match &options.ca_pem {
            None => ureq::tls::RootCerts::WebPki,
            Some(pem) => {
                let certs = ureq::tls::parse_pem(pem)
                    .filter_map(|item| match item {
                        Ok(ureq::tls::PemItem::Certificate(c)) => Some(Ok(c)),
                        Ok(_) => None,
                        Err(e) => Some(Err(e)),
                    })
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| {
                        Error::new(ErrorKind::Invalid, format!("the registry CA PEM: {e}"))
                    })?;
                if certs.is_empty() {
                    return Err(Error::new(
                        ErrorKind::Invalid,
                        "the registry CA PEM holds no certificate",
                    ));
                }
                ureq::tls::RootCerts::new_with_certs(&certs)
            }
        };
        let tls = ureq::tls::TlsConfig::builder()
            .provider(ureq::tls::TlsProvider::Rustls)
            .root_certs(roots)
            .build();
        let config = ureq::Agent::config_builder()
            .tls_config(tls)
            // Statuses are answered here, with messages that say what to do.
            .http_status_as_error(false)
            // Redirects are followed here, checking each target's scheme.
            .max_redirects(0)
            // No proxy from the environment: the node reaches the registry
            // it was told, directly.
            .proxy(None)
            .timeout_resolve(Some(options.connect_timeout))
            .timeout_connect(Some(options.connect_timeout))
            .timeout_send_request(Some(options.read_timeout))
            .timeout_recv_response(Some(options.read_timeout))
            .timeout_per_read(Some(options.read_timeout))
            .timeout_global(options.deadline)
            .max_response_header_size(64 << 10)
            .user_agent(concat!("imager-registry/", env!("CARGO_PKG_VERSION")))
            .build();
        let agent = match &options.resolver {
            None => config.into(),
            Some(r) => ureq::Agent::with_parts(
                config,
                ureq::unversioned::transport::DefaultConnector::new(),
                resolve::Names(Arc::new(r.clone()), options.own_addresses.clone()),
            ),
        };
        Ok(Client {
            agent,
            options,
            tokens: Arc::default(),
        })
    }

    pub fn options(&self) -> &Options {
        &self.options
    }

    fn tokens(&self) -> std::sync::MutexGuard<'_, TokenCache> {
        self.tokens
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn credentials(&self, registry: &str) -> Credentials {
        self.options
            .credentials
            .get(registry)
            .cloned()
            .unwrap_or_default()
    }

    fn has_credentials(&self, registry: &str) -> bool {
        !self.credentials(registry).is_anonymous()
    }

    /// The image manifest `reference` names, for the configured platform
    /// when it names an index. The manifest is read only if it is no larger
    /// than `max_manifest` (refused on its `Content-Length` before its body
    /// is read, and the read bounded too); when the reference has a digest,
    /// the manifest's bytes must hash to it (an index's, then the image
    /// manifest's to the index's entry).
    pub fn manifest(&self, reference: &Reference) -> Result<ImageManifest, Error> {
        let (bytes, content_type) = self.fetch_manifest(reference, reference.selector())?;
        let got = Digest::of(&bytes);
        if let Some(want) = reference.digest()
            && &got != want
        {
            return Err(Error::new(
                ErrorKind::DigestMismatch,
                format!(
                    "the manifest of {reference} hashes to {got}, not to the digest the \
                     reference names: refused (a wrong digest, or a registry that serves \
                     something else)"
                ),
            ));
        }
        let what = format!("the manifest of {reference}");
        match manifest::parse(&bytes, content_type.as_deref(), &what)? {
            Document::Image(m) => Ok(m),
            Document::Index(entries) => {
                let (os, arch) = &self.options.platform;
                let Some(entry) = manifest::pick(&entries, os, arch) else {
                    return Err(Error::new(
                        ErrorKind::NotFound,
                        format!(
                            "{reference} is an index of {} image(s), none for {os}/{arch}",
                            entries.len()
                        ),
                    ));
                };
                let d = &entry.descriptor;
                self.check_manifest_size(d.size, reference, "its size in the index")?;
                let (bytes, content_type) = self.fetch_manifest(reference, d.digest.as_str())?;
                let got = Digest::of(&bytes);
                if got != d.digest || bytes.len() as u64 != d.size {
                    return Err(Error::new(
                        ErrorKind::DigestMismatch,
                        format!(
                            "the {os}/{arch} manifest of {reference} is {} bytes hashing to \
                             {got}, not the {} bytes {} its index names: refused",
                            bytes.len(),
                            d.size,
                            d.digest
                        ),
                    ));
                }
                let what = format!("the {os}/{arch} manifest {} of {reference}", d.digest);
                match manifest::parse(&bytes, content_type.as_deref(), &what)? {
                    Document::Image(m) => Ok(m),
                    Document::Index(_) => Err(Error::new(
                        ErrorKind::Invalid,
                        format!("{what} is another index: nested indexes are not followed"),
                    )),
                }
            }
        }
    }

    /// The blob `descriptor` names in `reference`'s repository, streamed:
    /// refused before any request when its declared size is over
    /// `max_blob`, and before its body is read when the registry announces
    /// another size; the reader then fails (never a plain end of file)
    /// when the stream ends short, runs long, is cut, or hashes to another
    /// digest. Reading to the end of file verifies the blob.
    pub fn blob(
        &self,
        reference: &Reference,
        descriptor: &Descriptor,
    ) -> Result<BlobReader, Error> {
        let what = format!("blob {} of {reference}", descriptor.digest);
        if descriptor.size > self.options.max_blob {
            return Err(Error::new(
                ErrorKind::TooLarge,
                format!(
                    "{what} is {} bytes, over the bound of {} bytes: refused before reading it",
                    descriptor.size, self.options.max_blob
                ),
            ));
        }
        let path = format!("/v2/{}/blobs/{}", reference.name(), descriptor.digest);
        let target = Target::pull(reference, format!("blob {}", descriptor.digest));
        let response = self.send(&target, &path, Body::Get, None, &[200])?;
        if let Some(n) = content_length(&response)?
            && n != descriptor.size
        {
            return Err(Error::new(
                ErrorKind::Truncated,
                format!(
                    "the registry sends {what} as {n} bytes, but its descriptor declares {}: \
                     refused before reading it",
                    descriptor.size
                ),
            ));
        }
        let body: Box<dyn Read + Send> = Box::new(response.into_body().into_reader());
        Ok(VerifiedReader::new(
            body,
            descriptor.digest.clone(),
            descriptor.size,
            what,
        ))
    }

    fn check_manifest_size(&self, n: u64, reference: &Reference, how: &str) -> Result<(), Error> {
        if n > self.options.max_manifest {
            return Err(Error::new(
                ErrorKind::TooLarge,
                format!(
                    "the manifest of {reference} is {n} bytes ({how}), over the bound of {} \
                     bytes: refused before reading it",
                    self.options.max_manifest
                ),
            ));
        }
        Ok(())
    }

    /// The bytes and content type of the manifest `selector` (tag or digest)
    /// of `reference`'s repository, at most `max_manifest` bytes.
    fn fetch_manifest(
        &self,
        reference: &Reference,
        selector: &str,
    ) -> Result<(Vec<u8>, Option<String>), Error> {
        let path = format!("/v2/{}/manifests/{selector}", reference.name());
        let target = Target::pull(reference, "the manifest");
        let accept = manifest::ACCEPTED.join(", ");
        let response = self.send(&target, &path, Body::Get, Some(&accept), &[200])?;
        if let Some(n) = content_length(&response)? {
            self.check_manifest_size(n, reference, "its Content-Length")?;
        }
        let content_type = response
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let bound = self.options.max_manifest;
        let mut bytes = Vec::new();
        response
            .into_body()
            .into_reader()
            .take(bound.saturating_add(1))
            .read_to_end(&mut bytes)
            .map_err(|e| {
                Error::new(
                    ErrorKind::Truncated,
                    format!("reading the manifest of {reference}: {e}"),
                )
            })?;
        if bytes.len() as u64 > bound {
            return Err(Error::new(
                ErrorKind::TooLarge,
                format!(
                    "the manifest of {reference} is over the bound of {bound} bytes: refused \
                     after reading {} bytes of it",
                    bytes.len()
                ),
            ));
        }
        Ok((bytes, content_type))
    }
}
