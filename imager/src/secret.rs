//! Keeping secrets out of messages.
//!
//! Errors about input files must say what is wrong without echoing the
//! file: a file given in the wrong place may be a private key. Every reader
//! of an outside file uses these two helpers:
//!
//! - [`looks_like_private_key`]: refuse such a file by name, quoting nothing;
//! - [`excerpt`]: the most of a value a message may show: a few dozen
//!   characters, control characters escaped, and nothing at all of a value
//!   that looks like key material (a long run of base64 or hex).
//!
//! The text helpers are the `contract` crate's ([`contract::text`]), which
//! the manifest's messages and the runtime use too; re-exported here.

pub use contract::text::{
    EXCERPT_CHARS, excerpt, looks_like_key_material, looks_like_private_key, sanitise,
};

/// Refuses a private key file that others can read (group or world bits):
/// it may have been copied. The message names the file, never its bytes.
pub fn refuse_readable_by_others(path: &std::path::Path) -> anyhow::Result<()> {
    refuse_secret_readable_by_others(path, "the private key")
}

/// [`refuse_readable_by_others`] for any secret file: `what` names it in
/// the message ("the private key", "the PIN file").
pub fn refuse_secret_readable_by_others(path: &std::path::Path, what: &str) -> anyhow::Result<()> {
    use anyhow::Context;
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(path)
        .with_context(|| format!("reading {}", path.display()))?
        .permissions()
        .mode();
    if mode & 0o077 != 0 {
        anyhow::bail!(
            "{}: {what} is readable by others (mode {:04o}): chmod 600 it (and consider it \
             exposed if others could log in)",
            path.display(),
            mode & 0o7777
        );
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    /// A key pair as `imager keygen` writes it: (private PEM, public PEM).
    pub(crate) fn test_keypair() -> (String, String) {
        let dir = tempfile::tempdir().unwrap();
        let (k, p) = (dir.path().join("k.key"), dir.path().join("k.pub"));
        crate::sign::keygen(&k, &p, false).unwrap();
        (
            std::fs::read_to_string(k).unwrap(),
            std::fs::read_to_string(p).unwrap(),
        )
    }
}
