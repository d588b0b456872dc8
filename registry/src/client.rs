//! The client: the two calls of the distribution specification a pull needs
//! (`GET /v2/NAME/manifests/REF`, `GET /v2/NAME/blobs/DIGEST`), over HTTPS
//! (or plain HTTP for the registries the caller names), anonymous, bounded
//! and verified. See docs/registry.md.

use crate::blob::VerifiedReader;
use crate::error::{Error, ErrorKind};
use crate::manifest::{self, Descriptor, Document, ImageManifest};
use crate::reference::{Digest, Reference, excerpt};
use std::io::Read;
use std::time::Duration;
use ureq::http::{Response, StatusCode, header};

/// The most redirects followed for one request (registries redirect blob
/// downloads to their storage).
pub const MAX_REDIRECTS: usize = 5;

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
            platform: ("linux".into(), "amd64".into()),
            own_addresses: Vec::new(),
        }
    }
}

/// A registry client (cheap to share across threads: clone it).
#[derive(Clone)]
pub struct Client {
    agent: ureq::Agent,
    options: Options,
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
        Ok(Client {
            agent: config.into(),
            options,
        })
    }

    pub fn options(&self) -> &Options {
        &self.options
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
        let target = Target {
            reference,
            what: format!("blob {}", descriptor.digest),
        };
        let response = self.get(&target, &path, None)?;
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
        let target = Target {
            reference,
            what: "the manifest".into(),
        };
        let response = self.get(&target, &path, Some(&manifest::ACCEPTED.join(", ")))?;
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

    fn scheme(&self, host: &str) -> &'static str {
        if self.options.plain_http.iter().any(|h| h == host) {
            "http"
        } else {
            "https"
        }
    }

    /// GET `path` of the reference's registry, following redirects (each
    /// target HTTPS unless its host is one of `plain_http`); a 200 answer,
    /// or an error that says what the status means.
    fn get(
        &self,
        target: &Target,
        path: &str,
        accept: Option<&str>,
    ) -> Result<Response<ureq::Body>, Error> {
        let reference = target.reference;
        let registry = reference.registry();
        let mut url = format!("{}://{registry}{path}", self.scheme(registry));
        for _ in 0..=MAX_REDIRECTS {
            let mut request = self.agent.get(&url);
            if let Some(a) = accept {
                request = request.header(header::ACCEPT, a);
            }
            let response = request
                .call()
                .map_err(|e| transport_error(e, reference, &url))?;
            let status = response.status();
            if status == StatusCode::OK {
                return Ok(response);
            }
            if status.is_redirection() {
                let location = response
                    .headers()
                    .get(header::LOCATION)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default();
                url = self.redirect(&url, location, reference)?;
                continue;
            }
            return Err(status_error(status, target));
        }
        Err(Error::new(
            ErrorKind::Http,
            format!(
                "{registry} redirected the request for {} of {reference} more than \
                 {MAX_REDIRECTS} times",
                target.what
            ),
        ))
    }

    /// The URL a redirect from `from` (a URL this client asked for) to
    /// `location` (the registry's `Location` header: untrusted) leads to,
    /// if allowed: HTTPS, or plain HTTP to a host allowed it; never to this
    /// machine, a link-local or a multicast address unless the registry is
    /// that host ([`Client::forbidden_target`]). Public for the fuzz target
    /// `registry_redirect`.
    pub fn redirect(
        &self,
        from: &str,
        location: &str,
        reference: &Reference,
    ) -> Result<String, Error> {
        let bad = |why: &str| {
            Error::new(
                ErrorKind::Http,
                format!(
                    "{} redirected a request for {reference} to {}: {why}",
                    reference.registry(),
                    excerpt(location)
                ),
            )
        };
        if location.starts_with('/') && !location.starts_with("//") {
            // Same scheme and host.
            let scheme_end = from.find("://").map_or(0, |i| i + 3);
            let host_end = from[scheme_end..]
                .find('/')
                .map_or(from.len(), |i| scheme_end + i);
            return Ok(format!("{}{location}", &from[..host_end]));
        }
        let (scheme, rest) = location
            .split_once("://")
            .ok_or_else(|| bad("not an absolute URL or path"))?;
        let host = rest.split(['/', '?', '#']).next().unwrap_or_default();
        let host = host.rsplit_once('@').map_or(host, |(_, h)| h);
        if let Some(why) = self.forbidden_target(host, reference) {
            return Err(bad(why));
        }
        match scheme {
            "https" => Ok(location.to_string()),
            "http" if self.scheme(host) == "http" => Ok(location.to_string()),
            "http" => Err(bad(
                "plain HTTP to a host not allowed plain HTTP: refused (no downgrade)",
            )),
            _ => Err(bad("not an HTTP(S) URL")),
        }
    }
}

impl Client {
    /// Why a redirect may not go to `host` (`HOST[:PORT]`), if it may not:
    /// to this machine (loopback, unspecified, `localhost`, one of
    /// [`Options::own_addresses`]), to a link-local address (where clouds
    /// serve instance metadata and credentials) or a multicast one; unless
    /// the registry itself is that host.
    fn forbidden_target(&self, host: &str, reference: &Reference) -> Option<&'static str> {
        let name = |h: &str| -> String {
            let h = match h.strip_prefix('[') {
                Some(v6) => v6.split(']').next().unwrap_or_default(),
                None if h.matches(':').count() == 1 => h.split(':').next().unwrap_or_default(),
                None => h,
            };
            h.trim_end_matches('.').to_ascii_lowercase()
        };
        let target = name(host);
        if target == name(reference.registry()) {
            return None;
        }
        if target == "localhost" || target.ends_with(".localhost") {
            return Some("a redirect to this machine: refused");
        }
        let ip: std::net::IpAddr = target.parse().ok()?;
        let ip = match ip {
            std::net::IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, std::net::IpAddr::V4),
            v4 => v4,
        };
        let special = match ip {
            std::net::IpAddr::V4(v4) => {
                v4.is_loopback()
                    || v4.is_unspecified()
                    || v4.is_link_local()
                    || v4.is_multicast()
                    || v4.is_broadcast()
            }
            std::net::IpAddr::V6(v6) => {
                v6.is_loopback()
                    || v6.is_unspecified()
                    || v6.is_multicast()
                    || v6.is_unicast_link_local()
            }
        };
        if special || self.options.own_addresses.contains(&ip) {
            Some(
                "a redirect to this machine, a link-local or a multicast address: refused (a \
                 registry may not send its client to talk to itself or to instance metadata)",
            )
        } else {
            None
        }
    }
}

/// The `Content-Length` of a response, if it has a valid one.
fn content_length(response: &Response<ureq::Body>) -> Result<Option<u64>, Error> {
    match response.headers().get(header::CONTENT_LENGTH) {
        None => Ok(None),
        Some(v) => v
            .to_str()
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .map(Some)
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::Http,
                    "the registry sent an invalid Content-Length",
                )
            }),
    }
}

fn status_error(status: StatusCode, target: &Target) -> Error {
    let reference = target.reference;
    let registry = reference.registry();
    let name = reference.name();
    let code = status.as_u16();
    match code {
        404 if target.what == "the manifest" => {
            let by = if reference.digest().is_some() {
                "check the digest"
            } else {
                "check the tag"
            };
            Error::new(
                ErrorKind::NotFound,
                format!("no image {reference} in {registry}: {by} (HTTP 404)"),
            )
        }
        404 => Error::new(
            ErrorKind::NotFound,
            format!(
                "{registry} has no {} in {name} although its manifest names it (HTTP 404)",
                target.what
            ),
        ),
        401 => Error::new(
            ErrorKind::Unauthorized,
            format!(
                "{registry} requires authentication to pull {name} (HTTP 401): this client \
                 pulls anonymously only; make the repository public or use a registry that \
                 allows anonymous pulls"
            ),
        ),
        403 => Error::new(
            ErrorKind::Unauthorized,
            format!("{registry} denies pulling {name} (HTTP 403)"),
        ),
        429 => Error::new(
            ErrorKind::Http,
            format!("{registry} answers too many requests (HTTP 429): try again later"),
        ),
        _ => Error::new(
            ErrorKind::Http,
            format!(
                "{registry} answered HTTP {code} to the request for {} of {reference}",
                target.what
            ),
        ),
    }
}

fn transport_error(e: ureq::Error, reference: &Reference, url: &str) -> Error {
    let registry = reference.registry();
    let unreachable = |detail: String| {
        Error::new(
            ErrorKind::Unreachable,
            format!(
                "cannot reach registry {registry} ({detail}): check the address and that the \
                 registry is up"
            ),
        )
    };
    let tls = |detail: String| {
        let hint = if url.starts_with("https:") {
            format!(
                "; if {registry} serves plain HTTP, allow it explicitly for plain HTTP (it is \
                 never tried silently)"
            )
        } else {
            String::new()
        };
        Error::new(
            ErrorKind::Tls,
            format!("TLS with registry {registry} failed ({detail}){hint}"),
        )
    };
    let timeout = |what: &str, then: &str| {
        Error::new(
            ErrorKind::Timeout,
            format!("registry {registry} {what} {}{then}", excerpt(url)),
        )
    };
    match e {
        ureq::Error::HostNotFound => unreachable("no such host".into()),
        ureq::Error::ConnectionFailed => unreachable("connection failed".into()),
        ureq::Error::Timeout(ureq::Timeout::Global) => timeout(
            "took longer than the deadline to answer",
            ": refused (a slow or dripping registry)",
        ),
        ureq::Error::Timeout(ureq::Timeout::PerRead | ureq::Timeout::RecvResponse) => timeout(
            "sent nothing for longer than the stall limit while answering",
            "",
        ),
        ureq::Error::Timeout(t) => unreachable(format!("timed out: {t}")),
        ureq::Error::Io(io) => match io.kind() {
            std::io::ErrorKind::ConnectionRefused => unreachable("connection refused".into()),
            std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock => {
                unreachable("timed out".into())
            }
            std::io::ErrorKind::InvalidData if url.starts_with("https:") => tls(io.to_string()),
            _ => unreachable(io.to_string()),
        },
        ureq::Error::Rustls(r) => tls(r.to_string()),
        ureq::Error::Tls(t) => tls(t.to_string()),
        other => Error::new(
            ErrorKind::Http,
            format!("talking to registry {registry}: {other}"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client of `options`, a reference to reg.example:5000 and the URL
    /// of one of its blobs, where the redirects below come from.
    fn redirecting(options: Options) -> (Client, Reference, &'static str) {
        let Ok(client) = Client::new(options) else {
            panic!("a client");
        };
        let Ok(r) = Reference::parse("reg.example:5000/a:1") else {
            panic!("a reference");
        };
        (client, r, "https://reg.example:5000/v2/a/blobs/sha256:00")
    }

    #[test]
    fn redirects_never_downgrade() {
        let (client, r, from) = redirecting(Options {
            plain_http: vec!["plain:5000".into()],
            ..Options::default()
        });
        let go = |location: &str| client.redirect(from, location, &r);
        assert_eq!(
            go("/storage/x?sig=1").ok().as_deref(),
            Some("https://reg.example:5000/storage/x?sig=1")
        );
        assert_eq!(
            go("https://cdn.example/x").ok().as_deref(),
            Some("https://cdn.example/x")
        );
        assert_eq!(
            go("http://plain:5000/x").ok().as_deref(),
            Some("http://plain:5000/x")
        );
        for refused in [
            "http://cdn.example/x",
            "http://user@cdn.example/x",
            "http://plain:5001/x",
            "ftp://cdn.example/x",
            "//cdn.example/x",
            "x/y",
            "",
        ] {
            let Err(e) = go(refused) else {
                panic!("{refused} followed");
            };
            assert_eq!(e.kind(), ErrorKind::Http, "{refused}: {e}");
        }
        let Err(e) = go("http://cdn.example/x") else {
            panic!("followed");
        };
        assert!(e.to_string().contains("no downgrade"), "{e}");
    }

    /// A registry cannot send its client to talk to itself (the node's own
    /// API), to loopback or to instance metadata.
    #[test]
    fn redirects_never_lead_to_this_machine_or_link_local_addresses() {
        let own: std::net::IpAddr = [10, 0, 2, 15].into();
        let (client, r, from) = redirecting(Options {
            own_addresses: vec![own],
            ..Options::default()
        });
        for refused in [
            "https://127.0.0.1:50000/",
            "https://127.9.9.9/x",
            "https://localhost:50000/x",
            "https://LocalHost./x",
            "https://[::1]:50000/x",
            "https://[::ffff:127.0.0.1]/x",
            "https://0.0.0.0/x",
            "https://169.254.169.254/latest/meta-data/",
            "https://[fe80::1]/x",
            "https://10.0.2.15:50000/x",
            "https://user@10.0.2.15/x",
            "https://224.0.0.1/x",
        ] {
            let Err(e) = client.redirect(from, refused, &r) else {
                panic!("{refused} followed");
            };
            assert!(e.to_string().contains("refused"), "{refused}: {e}");
        }
        assert!(client.redirect(from, "https://10.0.2.16/x", &r).is_ok());
        // A registry on the loopback redirecting to itself is followed.
        let Ok(local) = Reference::parse("127.0.0.1:5000/a:1") else {
            panic!("a reference");
        };
        assert!(
            client
                .redirect(from, "https://127.0.0.1:5000/x", &local)
                .is_ok()
        );
    }
}
