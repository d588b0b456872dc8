//! The one error type of the runtime: a message with its context, ready to be
//! printed as `machined: fatal: <message>`.

use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error(String);

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn msg(m: impl Into<String>) -> Self {
        Error(m.into())
    }

    /// `<what>: <strerror(errno)>`, from the calling thread's errno.
    pub fn last_os(what: impl fmt::Display) -> Self {
        Error(format!("{what}: {}", std::io::Error::last_os_error()))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Adds context to any error that can be displayed.
pub trait Context<T> {
    fn context(self, what: impl fmt::Display) -> Result<T>;
    fn with_context<D: fmt::Display>(self, what: impl FnOnce() -> D) -> Result<T>;
}

impl<T, E: fmt::Display> Context<T> for std::result::Result<T, E> {
    fn context(self, what: impl fmt::Display) -> Result<T> {
        self.map_err(|e| Error(format!("{what}: {e}")))
    }

    fn with_context<D: fmt::Display>(self, what: impl FnOnce() -> D) -> Result<T> {
        self.map_err(|e| Error(format!("{}: {e}", what())))
    }
}

/// Checks the return value of a libc call that returns -1 on error.
pub fn check(ret: libc::c_int, what: impl FnOnce() -> String) -> Result<libc::c_int> {
    if ret == -1 {
        Err(Error::last_os(what()))
    } else {
        Ok(ret)
    }
}
