//! The installer image as an OCI archive (placeholder until the OCI module
//! lands).

use anyhow::{Result, bail};
use std::path::{Path, PathBuf};

/// Extracts the installer payload of an OCI archive into `dest`.
pub fn extract_payload(archive: &Path, _dest: &Path) -> Result<PathBuf> {
    bail!(
        "{}: reading OCI archives is not implemented yet: pass the payload directory",
        archive.display()
    )
}
