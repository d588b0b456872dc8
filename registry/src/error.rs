//! The client's errors: a kind a program can act on, and a message that
//! says what happened and what to do, naming the registry and the image.

use std::fmt;

/// What went wrong, for programs; the message is for people.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// Not a valid reference, digest, manifest or answer: the input is wrong.
    Invalid,
    /// The registry could not be reached: connection refused, no such host,
    /// a timeout.
    Unreachable,
    /// TLS failed, or plain HTTP was needed and not allowed.
    Tls,
    /// No such image (tag or digest) or blob in the registry (HTTP 404).
    NotFound,
    /// The registry wants credentials (HTTP 401) the client was not
    /// given, refuses those it was given, or denies the operation (403).
    Unauthorized,
    /// A manifest or blob over the caller's bound, refused before it was read.
    TooLarge,
    /// Content whose SHA-256 is not the digest that named it.
    DigestMismatch,
    /// A blob that ended before, or ran past, the size its descriptor
    /// declares, or a connection cut in the middle of it.
    Truncated,
    /// The registry stalled past the stall limit (`Options::read_timeout`)
    /// or a request took past its deadline (`Options::deadline`).
    Timeout,
    /// Any other answer of the registry (HTTP 5xx, a redirect loop, …).
    Http,
}

/// An error of the registry client. Its message is complete: it names the
/// registry or the image and says what to check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    kind: ErrorKind,
    message: String,
    status: Option<u16>,
    codes: Vec<String>,
}

impl Error {
    pub(crate) fn new(kind: ErrorKind, message: impl Into<String>) -> Error {
        Error {
            kind,
            message: message.into(),
            status: None,
            codes: Vec::new(),
        }
    }

    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The distribution specification's error codes the registry sent with
    /// a failed status (`MANIFEST_BLOB_UNKNOWN`, …; [`registry_codes`]),
    /// also said at the end of the message.
    pub fn registry_codes(&self) -> &[String] {
        &self.codes
    }

    /// This error with `more` said at the end of its message.
    pub(crate) fn and(mut self, more: &str) -> Error {
        self.message.push_str(more);
        self
    }

    /// The HTTP status of the registry's answer this error is about, if
    /// it is about one.
    pub fn status(&self) -> Option<u16> {
        self.status
    }

    /// This error about an answer of `status` whose body had `codes`. An
    /// error of kind `Http` (a status this client has no words of its own
    /// for) says them at the end of its message.
    pub(crate) fn answered(mut self, status: u16, codes: Vec<String>) -> Error {
        self.status = Some(status);
        if !codes.is_empty() && self.kind == ErrorKind::Http {
            self.message = format!("{} (the registry said {})", self.message, codes.join(", "));
        }
        self.codes = codes;
        self
    }

    /// The registry error inside an I/O error of a blob reader, if it is one.
    pub fn of_io(e: &std::io::Error) -> Option<&Error> {
        e.get_ref().and_then(|inner| inner.downcast_ref::<Error>())
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

impl From<Error> for std::io::Error {
    fn from(e: Error) -> std::io::Error {
        let kind = match e.kind {
            ErrorKind::Truncated => std::io::ErrorKind::UnexpectedEof,
            ErrorKind::Unreachable => std::io::ErrorKind::ConnectionAborted,
            _ => std::io::ErrorKind::InvalidData,
        };
        std::io::Error::new(kind, e)
    }
}

/// The most bytes of a failed answer's body read for its error codes (a
/// body that does not say its length, or says more, is not read).
pub const MAX_ERROR_BODY: u64 = 16 * 1024;
/// The longest a failed answer's body is read for.
pub const MAX_ERROR_BODY_TIME: std::time::Duration = std::time::Duration::from_secs(2);
/// The most error codes kept from one answer.
pub const MAX_CODES: usize = 4;
/// The longest error code kept.
pub const MAX_CODE: usize = 64;

/// The error codes of a registry's error body (the distribution
/// specification's `{"errors": [{"code": "…", …}, …]}`): at most
/// [`MAX_CODES`], each of capital letters, digits and `_` and at most
/// [`MAX_CODE`] long (anything else is left out, so a code is safe to
/// print); none for a body that is not such a document. The caller reads
/// at most [`MAX_ERROR_BODY`] bytes.
pub fn registry_codes(body: &[u8]) -> Vec<String> {
    #[derive(serde::Deserialize)]
    struct Body {
        errors: Vec<Entry>,
    }
    #[derive(serde::Deserialize)]
    struct Entry {
        code: Option<serde_json::Value>,
    }
    let Ok(parsed) = serde_json::from_slice::<Body>(body) else {
        return Vec::new();
    };
    parsed
        .errors
        .into_iter()
        .filter_map(|e| match e.code {
            Some(serde_json::Value::String(c)) => Some(c),
            _ => None,
        })
        .filter(|c| {
            !c.is_empty()
                && c.len() <= MAX_CODE
                && c.bytes()
                    .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
        })
        .take(MAX_CODES)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_read_from_the_specifications_body_and_nothing_else() {
        let body = br#"{"errors":[{"code":"DIGEST_INVALID","message":"m"},{"code":"MANIFEST_BLOB_UNKNOWN","detail":"sha256:ab"}]}"#;
        assert_eq!(
            registry_codes(body),
            ["DIGEST_INVALID", "MANIFEST_BLOB_UNKNOWN"]
        );
        // Codes that are not the specification's shape are left out.
        let odd = br#"{"errors":[{"code":"\u001b[31mX"},{"code":7},{},{"code":"lower"},{"code":"OK_1"}]}"#;
        assert_eq!(registry_codes(odd), ["OK_1"]);
        let many = format!("{{\"errors\":[{}]}}", [r#"{"code":"A"}"#; 9].join(","));
        assert_eq!(registry_codes(many.as_bytes()).len(), MAX_CODES);
        assert_eq!(registry_codes(&[b'A'; MAX_CODE + 1]), Vec::<String>::new());
        let long = format!(
            "{{\"errors\":[{{\"code\":\"{}\"}}]}}",
            "A".repeat(MAX_CODE + 1)
        );
        assert!(registry_codes(long.as_bytes()).is_empty());
        for junk in [&b""[..], b"<html>", b"{\"errors\":{}}", b"null"] {
            assert!(registry_codes(junk).is_empty());
        }
        let e = Error::new(ErrorKind::Http, "HTTP 400").answered(400, registry_codes(body));
        assert_eq!(
            e.to_string(),
            "HTTP 400 (the registry said DIGEST_INVALID, MANIFEST_BLOB_UNKNOWN)"
        );
        assert_eq!(e.registry_codes().len(), 2);
    }
}
