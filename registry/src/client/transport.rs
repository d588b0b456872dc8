//! The requests: one place where a request is sent to a registry, its
//! credentials attached (only to the registry's own host), a 401 answered
//! once with the challenge's flow (`token.rs`), redirects followed under
//! the rules below, and statuses and transport failures turned into
//! errors that say what to do.

use super::{Client, Target};
use crate::error::{Error, ErrorKind};
use crate::reference::{Reference, excerpt};
use std::io::Read;
use ureq::http::{Response, StatusCode, header};

/// The most redirects followed for one request (registries redirect blob
/// downloads to their storage).
pub const MAX_REDIRECTS: usize = 5;

/// What a request sends.
pub(super) enum Body<'a> {
    /// GET (redirects followed).
    Get,
    /// HEAD (redirects followed).
    Head,
    /// POST with no body.
    Post,
    /// PUT of these bytes with this content type.
    Put(&'a [u8], &'a str),
    /// PUT of a stream of this many bytes (not replayable: the caller has
    /// authenticated before, with a HEAD of the same scope).
    PutStream(&'a mut dyn Read, u64),
}

impl Body<'_> {
    fn follows_redirects(&self) -> bool {
        matches!(self, Body::Get | Body::Head)
    }
}

impl Client {
    pub(super) fn scheme(&self, host: &str) -> &'static str {
        if self.options.plain_http.iter().any(|h| h == host) {
            "http"
        } else {
            "https"
        }
    }

    /// Sends `body` to `path` of the reference's registry (or to `path`
    /// itself when it is a URL: an upload's location). The cached
    /// `Authorization` for the target's scope goes with it when the
    /// request is for the registry's own host (never to a redirect's other
    /// host); a 401 from that host is answered once with the challenge's
    /// flow (a new token, also when the cached one was revoked); redirects
    /// are followed for GET and HEAD. Returns the response if its status
    /// is one of `ok`, else an error that says what the status means.
    pub(super) fn send(
        &self,
        target: &Target,
        path: &str,
        mut body: Body,
        accept: Option<&str>,
        ok: &[u16],
    ) -> Result<Response<ureq::Body>, Error> {
        let reference = target.reference;
        let registry = reference.registry();
        let mut url = if path.starts_with('/') {
            format!("{}://{registry}{path}", self.scheme(registry))
        } else {
            path.to_string()
        };
        let scope = target.scope();
        let mut challenged = false;
        let mut redirects = 0;
        loop {
            let own_host = host_of(&url).eq_ignore_ascii_case(registry);
            let authorization = if own_host {
                self.tokens().get(registry, &scope)
            } else {
                None
            };
            let response = self
                .call(&url, &mut body, accept, authorization.as_deref())
                .map_err(|e| transport_error(e, reference, &url))?;
            let status = response.status();
            if ok.contains(&status.as_u16()) {
                return Ok(response);
            }
            if status == StatusCode::UNAUTHORIZED && own_host && !challenged {
                if matches!(body, Body::PutStream(..)) {
                    return Err(Error::new(
                        ErrorKind::Unauthorized,
                        format!(
                            "{registry} asked for credentials again in the middle of an upload \
                             to {} (HTTP 401): try the push again",
                            reference.name()
                        ),
                    ));
                }
                let challenges: Vec<String> = response
                    .headers()
                    .get_all(header::WWW_AUTHENTICATE)
                    .iter()
                    .take(crate::auth::MAX_CHALLENGES)
                    .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                    .collect();
                self.authenticate(target, &scope, &challenges)?;
                challenged = true;
                continue;
            }
            if status.is_redirection() && body.follows_redirects() {
                redirects += 1;
                if redirects > MAX_REDIRECTS {
                    return Err(Error::new(
                        ErrorKind::Http,
                        format!(
                            "{registry} redirected the request for {} of {reference} more than \
                             {MAX_REDIRECTS} times",
                            target.what
                        ),
                    ));
                }
                let location = response
                    .headers()
                    .get(header::LOCATION)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default();
                url = self.redirect(&url, location, reference)?;
                continue;
            }
            if status == StatusCode::UNAUTHORIZED {
                self.tokens().forget(registry, &scope);
            }
            let codes = if matches!(body, Body::Head) {
                Vec::new()
            } else {
                crate::error::registry_codes(&error_body(response))
            };
            return Err(status_error(status, target, self.has_credentials(registry))
                .answered(status.as_u16(), codes));
        }
    }

    /// One request, with its headers.
    fn call(
        &self,
        url: &str,
        body: &mut Body,
        accept: Option<&str>,
        authorization: Option<&str>,
    ) -> Result<Response<ureq::Body>, ureq::Error> {
        fn with<B>(
            mut r: ureq::RequestBuilder<B>,
            accept: Option<&str>,
            authorization: Option<&str>,
        ) -> ureq::RequestBuilder<B> {
            if let Some(a) = accept {
                r = r.header(header::ACCEPT, a);
            }
            if let Some(a) = authorization {
                r = r.header(header::AUTHORIZATION, a);
            }
            r
        }
        match body {
            Body::Get => with(self.agent.get(url), accept, authorization).call(),
            Body::Head => with(self.agent.head(url), accept, authorization).call(),
            Body::Post => with(self.agent.post(url), accept, authorization).send_empty(),
            Body::Put(bytes, content_type) => with(self.agent.put(url), accept, authorization)
                .header(header::CONTENT_TYPE, *content_type)
                .send(*bytes),
            Body::PutStream(reader, len) => with(self.agent.put(url), accept, authorization)
                .header(header::CONTENT_TYPE, "application/octet-stream")
                .header(header::CONTENT_LENGTH, len.to_string())
                .send(ureq::SendBody::from_reader(*reader)),
        }
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
        let (scheme, _) = location
            .split_once("://")
            .ok_or_else(|| bad("not an absolute URL or path"))?;
        let host = host_of(location);
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
    pub(super) fn forbidden_target(
        &self,
        host: &str,
        reference: &Reference,
    ) -> Option<&'static str> {
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
            return Some("an address of this machine: refused");
        }
        let Ok(ip) = target.parse::<std::net::IpAddr>() else {
            // A host whose last label is a number is no DNS name (no
            // top-level domain is numeric): an address in a form the system
            // resolver reads and a parser does not (`127.1`, `2130706433`,
            // `0x7f.1`), which could be this machine.
            let last = target.rsplit('.').next().unwrap_or_default();
            let numeric = !last.is_empty()
                && (last.bytes().all(|b| b.is_ascii_digit()) || last.starts_with("0x"));
            return numeric.then_some(
                "a numeric host in a non-standard form: refused (it could be this machine)",
            );
        };
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
                "an address of this machine, a link-local or a multicast address: refused (a \
                 registry may not send its client to talk to itself or to instance metadata)",
            )
        } else {
            None
        }
    }
}

/// The body of a failed answer, for its error codes: only one that says
/// its length, of at most `MAX_ERROR_BODY` bytes, read for at most
/// `MAX_ERROR_BODY_TIME` (one read past that waits at most the stall
/// limit); none when it is longer, unsized, slower or fails.
fn error_body(response: Response<ureq::Body>) -> Vec<u8> {
    use crate::error::{MAX_ERROR_BODY, MAX_ERROR_BODY_TIME};
    let Ok(Some(len)) = content_length(&response) else {
        return Vec::new();
    };
    if len > MAX_ERROR_BODY {
        return Vec::new();
    }
    let started = std::time::Instant::now();
    let mut reader = response.into_body().into_reader().take(len);
    let mut bytes = Vec::new();
    let mut chunk = [0u8; 4096];
    while started.elapsed() < MAX_ERROR_BODY_TIME {
        match reader.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => bytes.extend_from_slice(&chunk[..n]),
            Err(_) => return Vec::new(),
        }
    }
    // Whole, or none: a body cut by the time bound has no codes.
    if bytes.len() as u64 == len {
        bytes
    } else {
        Vec::new()
    }
}

/// The `Content-Length` of a response, if it has a valid one.
pub(super) fn content_length(response: &Response<ureq::Body>) -> Result<Option<u64>, Error> {
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

/// The `HOST[:PORT]` of an absolute URL (without user information).
pub(super) fn host_of(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let host = rest.split(['/', '?', '#']).next().unwrap_or_default();
    host.rsplit_once('@').map_or(host, |(_, h)| h)
}

fn status_error(status: StatusCode, target: &Target, credentials: bool) -> Error {
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
        401 if credentials => Error::new(
            ErrorKind::Unauthorized,
            format!(
                "{registry} refused the credentials given for it to {} {name} (HTTP 401): check \
                 the user name and the password or token",
                target.verb()
            ),
        ),
        401 => Error::new(
            ErrorKind::Unauthorized,
            format!(
                "{registry} requires credentials to {} {name} (HTTP 401): give credentials for \
                 {registry} (docs/registry.md, \"Authentication\")",
                target.verb()
            ),
        ),
        403 => Error::new(
            ErrorKind::Unauthorized,
            format!(
                "{registry} denies {}{} {name} (HTTP 403){}",
                if target.push { "pushing to" } else { "pulling" },
                if credentials {
                    " with the credentials given"
                } else {
                    ""
                },
                if credentials {
                    ""
                } else {
                    ": give credentials that may"
                }
            ),
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

/// A transport failure in a few words (for a token service, whose errors
/// the caller words).
pub(super) fn describe(e: &ureq::Error) -> String {
    match e {
        ureq::Error::HostNotFound => "no such host".into(),
        ureq::Error::ConnectionFailed => "connection failed".into(),
        ureq::Error::Timeout(t) => format!("timed out: {t}"),
        ureq::Error::Io(io) => io.to_string(),
        ureq::Error::Rustls(r) => format!("TLS: {r}"),
        ureq::Error::Tls(t) => format!("TLS: {t}"),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Options;

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
            "https://127.1/x",
            "https://2130706433:50000/x",
            "https://0x7f.1/x",
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
