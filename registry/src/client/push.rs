//! Pushing (the distribution specification's push API): a blob is checked
//! for (`HEAD`), else uploaded in one request (`POST` for an upload
//! location, then `PUT LOCATION?digest=…` with the bytes, streamed); a
//! manifest is `PUT` under a tag or its digest. The `pull,push` scope is
//! asked for; the `HEAD` authenticates before a stream is sent, since a
//! stream cannot be sent twice.

use super::transport::{Body, host_of};
use super::{Client, Target};
use crate::blob::VerifiedReader;
use crate::error::{Error, ErrorKind};
use crate::manifest::Descriptor;
use crate::reference::{Digest, Reference, excerpt};
use std::io::Read;
use ureq::http::header;

/// How many times in all a push asks a registry again when it briefly
/// misses a blob it holds (see [`Client::push_blob`] and
/// [`Client::push_manifest`]).
pub const PUSH_ATTEMPTS: u32 = 4;
/// The wait before the first such retry (doubled each time).
pub const PUSH_RETRY_WAIT: std::time::Duration = std::time::Duration::from_millis(250);

/// What `request` returns, asked again up to [`PUSH_ATTEMPTS`] times in
/// all, after `wait`, then twice that, …, while its error is one `briefly`
/// says a registry gives for a moment; the last error (whatever its kind)
/// says how many times.
fn asking_again<T>(
    wait: std::time::Duration,
    briefly: impl Fn(&Error) -> bool,
    mut request: impl FnMut() -> Result<T, Error>,
) -> Result<T, Error> {
    let mut wait = wait;
    let mut attempt = 1;
    loop {
        match request() {
            Err(e) if attempt < PUSH_ATTEMPTS && briefly(&e) => {
                std::thread::sleep(wait);
                wait *= 2;
                attempt += 1;
            }
            Err(e) if attempt > 1 => return Err(e.and(&format!(": asked {attempt} times"))),
            result => return result,
        }
    }
}

/// A manifest PUT the registry may accept when asked again: it missed a
/// blob (`MANIFEST_BLOB_UNKNOWN`).
fn manifest_briefly_refused(e: &Error) -> bool {
    e.registry_codes()
        .iter()
        .any(|c| c == "MANIFEST_BLOB_UNKNOWN")
}

/// A blob check (HEAD) the registry may answer when asked again: a server
/// error (5xx).
fn check_briefly_failed(e: &Error) -> bool {
    e.status().is_some_and(|s| (500..600).contains(&s))
}

/// What [`Client::push_blob`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pushed {
    /// The registry had the blob already: nothing was sent.
    Present,
    /// The blob was uploaded.
    Uploaded,
}

impl Client {
    /// Whether the repository of `reference` holds the blob `digest`.
    pub fn blob_exists(&self, reference: &Reference, digest: &Digest) -> Result<bool, Error> {
        let target = Target {
            reference,
            what: format!("blob {digest}"),
            push: true,
        };
        let path = format!("/v2/{}/blobs/{digest}", reference.name());
        match self.send(&target, &path, Body::Head, None, &[200]) {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Uploads the blob `descriptor` names into the repository of
    /// `reference`, reading its bytes from `content`, unless the registry
    /// has it. The bytes sent are hashed as they go: content that is not
    /// exactly the descriptor's size and digest fails the upload (and the
    /// registry, which checks the digest too, keeps nothing).
    ///
    /// The check is asked again as [`Client::push_manifest`] is when the
    /// registry answers it with a server error (5xx): the distribution
    /// registry answers 500 while another client's upload of the same
    /// blob rewrites its link.
    pub fn push_blob(
        &self,
        reference: &Reference,
        descriptor: &Descriptor,
        content: impl Read,
    ) -> Result<Pushed, Error> {
        let present = asking_again(PUSH_RETRY_WAIT, check_briefly_failed, || {
            self.blob_exists(reference, &descriptor.digest)
        })?;
        if present {
            return Ok(Pushed::Present);
        }
        let target = Target {
            reference,
            what: format!("blob {}", descriptor.digest),
            push: true,
        };
        let start = format!("/v2/{}/blobs/uploads/", reference.name());
        let response = self.send(&target, &start, Body::Post, None, &[202])?;
        let location = response
            .headers()
            .get(header::LOCATION)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        let registry = reference.registry();
        let from = format!("{}://{registry}{start}", self.scheme(registry));
        // The upload location is the registry's to choose, under the rules
        // of a redirect (no downgrade, never this machine).
        let url = self.redirect(&from, &location, reference)?;
        if !host_of(&url).eq_ignore_ascii_case(registry) {
            return Err(Error::new(
                ErrorKind::Http,
                format!(
                    "{registry} gave an upload location on another host ({}): refused (the \
                     credentials for {registry} are sent only to it)",
                    excerpt(host_of(&url))
                ),
            ));
        }
        let sep = if url.contains('?') { '&' } else { '?' };
        let url = format!("{url}{sep}digest={}", descriptor.digest);
        let mut verified = VerifiedReader::new(
            content,
            descriptor.digest.clone(),
            descriptor.size,
            format!("the content given for blob {}", descriptor.digest),
        );
        self.send(
            &target,
            &url,
            Body::PutStream(&mut verified, descriptor.size),
            None,
            &[201],
        )?;
        Ok(Pushed::Uploaded)
    }

    /// Puts `manifest` (of `media_type`) under the tag, or the digest, of
    /// `reference`; returns its digest, checked against the one the
    /// registry reports when it reports one.
    ///
    /// A registry that answers `MANIFEST_BLOB_UNKNOWN` is asked again, up
    /// to [`PUSH_ATTEMPTS`] times in all, after [`PUSH_RETRY_WAIT`], then
    /// twice that, …: the distribution registry's filesystem storage
    /// rewrites a blob's link in place when another client uploads the
    /// same blob, and a manifest checked at that moment misses it
    /// (docs/registry.md, "Pushing").
    pub fn push_manifest(
        &self,
        reference: &Reference,
        media_type: &str,
        manifest: &[u8],
    ) -> Result<Digest, Error> {
        asking_again(PUSH_RETRY_WAIT, manifest_briefly_refused, || {
            self.put_manifest(reference, media_type, manifest)
        })
    }

    fn put_manifest(
        &self,
        reference: &Reference,
        media_type: &str,
        manifest: &[u8],
    ) -> Result<Digest, Error> {
        let digest = Digest::of(manifest);
        let target = Target {
            reference,
            what: "the manifest".into(),
            push: true,
        };
        let path = format!(
            "/v2/{}/manifests/{}",
            reference.name(),
            reference.selector()
        );
        let response = self.send(
            &target,
            &path,
            Body::Put(manifest, media_type),
            None,
            &[201],
        )?;
        if let Some(reported) = response
            .headers()
            .get("docker-content-digest")
            .and_then(|v| v.to_str().ok())
            && reported != digest.as_str()
        {
            return Err(Error::new(
                ErrorKind::DigestMismatch,
                format!(
                    "{} stored the manifest of {reference} as {}, not as {digest} (its bytes' \
                     digest): the registry rewrote it",
                    reference.registry(),
                    excerpt(reported)
                ),
            ));
        }
        Ok(digest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;
    use std::time::Duration;

    fn answered(status: u16, codes: &[&str]) -> Error {
        Error::new(ErrorKind::Http, format!("HTTP {status}"))
            .answered(status, codes.iter().map(|c| c.to_string()).collect())
    }

    /// Asks `asking_again` with `briefly`, each request failing with
    /// `error`: how many requests were made, and the last error.
    fn asked(briefly: fn(&Error) -> bool, error: &Error) -> (u32, String) {
        let mut n = 0;
        let e = asking_again::<()>(Duration::ZERO, briefly, || {
            n += 1;
            Err(error.clone())
        })
        .unwrap_err();
        (n, e.to_string())
    }

    #[test]
    fn only_the_registrys_brief_misses_are_asked_again_and_boundedly() {
        let missed = answered(400, &["DIGEST_INVALID", "MANIFEST_BLOB_UNKNOWN"]);
        let (n, said) = asked(manifest_briefly_refused, &missed);
        assert_eq!(n, PUSH_ATTEMPTS);
        assert!(
            said.ends_with(&format!(": asked {PUSH_ATTEMPTS} times")),
            "{said}"
        );
        assert_eq!(
            asked(check_briefly_failed, &answered(500, &[])).0,
            PUSH_ATTEMPTS
        );
        assert_eq!(
            asked(check_briefly_failed, &answered(503, &[])).0,
            PUSH_ATTEMPTS
        );
        // Anything else is asked once, and said as it was.
        type Briefly = fn(&Error) -> bool;
        let once: [(Briefly, Error); 6] = [
            (
                manifest_briefly_refused,
                answered(400, &["MANIFEST_INVALID"]),
            ),
            (manifest_briefly_refused, answered(500, &[])),
            (manifest_briefly_refused, answered(401, &["UNAUTHORIZED"])),
            (check_briefly_failed, answered(404, &["BLOB_UNKNOWN"])),
            (check_briefly_failed, answered(429, &[])),
            (
                check_briefly_failed,
                Error::new(ErrorKind::Unreachable, "refused"),
            ),
        ];
        for (briefly, e) in once {
            assert_eq!(asked(briefly, &e), (1, e.to_string()));
        }
        // A success after a miss is the success.
        let mut n = 0;
        let got = asking_again(Duration::ZERO, manifest_briefly_refused, || {
            n += 1;
            if n < 3 { Err(missed.clone()) } else { Ok(n) }
        });
        assert_eq!(got, Ok(3));
    }
}
