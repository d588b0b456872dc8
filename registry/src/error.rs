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
}

impl Error {
    pub(crate) fn new(kind: ErrorKind, message: impl Into<String>) -> Error {
        Error {
            kind,
            message: message.into(),
        }
    }

    pub fn kind(&self) -> ErrorKind {
        self.kind
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
