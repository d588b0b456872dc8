//! The signed manifest: what a build produced, with sizes and digests.

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

use crate::artifact::Artifact;

/// The manifest format this code writes and the only one it verifies.
pub const FORMAT: u32 = 1;
/// The manifest's file name in the output directory.
pub const MANIFEST_NAME: &str = contract::paths::output::MANIFEST;
/// The detached signature's file name, next to the manifest.
pub const SIGNATURE_NAME: &str = contract::paths::output::SIGNATURE;

/// The list of artifacts of one build, signed as a whole.
///
/// The serialized form is canonical (see [`Manifest::to_bytes`]): field order
/// as declared here, artifacts sorted by path, two-space indentation and a
/// trailing newline, so that the same build gives the same bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// Always [`FORMAT`].
    pub format: u32,
    pub name: String,
    pub version: String,
    /// The payload's security version (profile `security_version`): a disk
    /// that blessed a higher one refuses it without an admin's
    /// `--allow-downgrade` ([`contract::version::check_security`]). Absent
    /// when 0, so manifests without one keep their bytes.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub security_version: u64,
    pub profile: String,
    /// The architecture the payload runs on (`contract::Arch`'s name):
    /// absent for amd64, so that amd64's manifests keep their bytes and
    /// older runtimes read them; `arm64` otherwise ([`Manifest::arch`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arch: Option<String>,
    pub source_date_epoch: u64,
    /// The [`key_id`](crate::keys::key_id) of the signing key; set by
    /// imager's `write_signed_manifest`.
    pub key_id: String,
    /// How to boot the kernel and initramfs this manifest lists (absent in
    /// manifests of older builds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot: Option<Boot>,
    /// Paths relative to the manifest's directory, `/`-separated, without
    /// `.`, `..` or empty components.
    pub artifacts: Vec<Artifact>,
}

/// What a boot entry for the manifest's kernel and initramfs needs beyond
/// the files: the image's title (`Imager 0.1.0`; a slot's entry title is
/// [`contract::boot::entry_title`] of it) and the kernel command line of the
/// profile (without the slot argument the entry adds).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Boot {
    pub title: String,
    pub cmdline: String,
    /// A Secure Boot payload: systemd-boot's `secure-boot-enroll` for the
    /// ESP an install lays out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secure_boot_enroll: Option<String>,
}

impl Boot {
    /// Both fields end up on lines of a boot entry: no control characters
    /// (a newline would add a line of its own), a non-empty title.
    fn check(&self) -> Result<(), String> {
        if self.title.trim().is_empty() {
            return Err("boot.title is empty".into());
        }
        for (field, v) in [("boot.title", &self.title), ("boot.cmdline", &self.cmdline)] {
            if v.chars().any(char::is_control) {
                return Err(format!(
                    "{field} {} contains a control character (it is one line of a boot entry)",
                    contract::text::excerpt(v)
                ));
            }
        }
        // What a profile may not build, a manifest may not carry: a longer
        // line is cut short at boot and the image never reaches ready.
        let loaded = contract::boot::loaded_cmdline_len(&self.cmdline);
        if loaded > contract::cmdline::MAX_LEN {
            return Err(format!(
                "boot.cmdline reaches the kernel as {loaded} bytes, more than the {} it takes: \
                 the payload would not boot; rebuild it with a shorter kernel.cmdline",
                contract::cmdline::MAX_LEN
            ));
        }
        Ok(())
    }
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

impl Manifest {
    /// A format-[`FORMAT`] manifest; `key_id` is filled in when signing.
    pub fn new(
        name: impl Into<String>,
        version: impl Into<String>,
        profile: impl Into<String>,
        source_date_epoch: u64,
        artifacts: Vec<Artifact>,
    ) -> Manifest {
        Manifest {
            format: FORMAT,
            name: name.into(),
            version: version.into(),
            security_version: 0,
            profile: profile.into(),
            arch: None,
            source_date_epoch,
            key_id: String::new(),
            boot: None,
            artifacts,
        }
    }

    /// The architecture the payload runs on: amd64 when the manifest names
    /// none (every manifest before arm64).
    pub fn arch(&self) -> Result<contract::Arch> {
        match self.arch.as_deref() {
            None => Ok(contract::Arch::Amd64),
            Some(name) => contract::Arch::of_name(name)
                .filter(|a| *a != contract::Arch::Amd64)
                .with_context(|| {
                    format!(
                        "arch {}: a payload names arm64, or no architecture for amd64",
                        contract::text::excerpt(name)
                    )
                }),
        }
    }

    /// Sets the architecture ([`Manifest::arch`]): absent for amd64.
    pub fn set_arch(&mut self, arch: contract::Arch) {
        self.arch = (arch != contract::Arch::Amd64).then(|| arch.name().to_string());
    }

    /// Decodes a manifest of a supported format (not yet trusted: the caller
    /// checks its signature first). Never panics on malformed input.
    pub fn parse(bytes: &[u8]) -> Result<Manifest> {
        let m: Manifest = serde_json::from_slice(bytes).map_err(|e| {
            anyhow::anyhow!(
                "not a format-{FORMAT} manifest: {}",
                contract::text::sanitise(&e.to_string())
            )
        })?;
        if m.format != FORMAT {
            anyhow::bail!(
                "manifest format {} is not supported (this imager reads format {FORMAT})",
                m.format
            );
        }
        if let Some(Err(reason)) = m.boot.as_ref().map(Boot::check) {
            anyhow::bail!("invalid manifest: {reason}");
        }
        if let Err(why) = contract::version::check(&m.version) {
            anyhow::bail!("invalid manifest: version {why}");
        }
        m.arch()
            .map_err(|e| anyhow::anyhow!("invalid manifest: {e}"))?;
        Ok(m)
    }

    /// The canonical bytes: artifacts sorted by path, pretty JSON, newline.
    /// Refuses invalid manifests (format, paths, digests, duplicates).
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let mut m = self.clone();
        m.artifacts.sort_by(|a, b| a.path.cmp(&b.path));
        m.validate()?;
        let mut bytes = serde_json::to_vec_pretty(&m).context("serializing the manifest")?;
        bytes.push(b'\n');
        Ok(bytes)
    }

    fn validate(&self) -> Result<()> {
        if self.format != FORMAT {
            bail!(
                "manifest format {} is not supported (this imager writes format {FORMAT})",
                self.format
            );
        }
        let mut seen = BTreeSet::new();
        let mut problems = Vec::new();
        if let Some(Err(reason)) = self.boot.as_ref().map(Boot::check) {
            problems.push(reason);
        }
        if let Err(e) = self.arch() {
            problems.push(format!("{e}"));
        }
        for a in &self.artifacts {
            if let Err(reason) = check_path(&a.path) {
                problems.push(format!("{}: {reason}", a.path));
            }
            if let Err(reason) = check_digest(&a.sha256) {
                problems.push(format!("{}: {reason}", a.path));
            }
            if !seen.insert(a.path.as_str()) {
                problems.push(format!("{}: listed twice", a.path));
            }
        }
        if !problems.is_empty() {
            bail!("invalid manifest:\n  {}", problems.join("\n  "));
        }
        Ok(())
    }
}

/// Checks that an artifact path stays inside the manifest's directory: not
/// empty, not absolute, `/`-separated, no empty, `.` or `..` component, and
/// not the manifest or its signature. Returns why not.
pub fn check_path(path: &str) -> Result<(), String> {
    if path.is_empty() {
        return Err("empty path".into());
    }
    if path.starts_with('/') {
        return Err(
            "absolute path (artifact paths are relative to the manifest's directory)".into(),
        );
    }
    if path.contains('\0') {
        return Err("path contains a NUL byte".into());
    }
    for c in path.split('/') {
        match c {
            ".." => {
                return Err(
                    "path contains `..` (artifact paths must stay inside the manifest's directory)"
                        .into(),
                );
            }
            "." | "" => return Err("path is not canonical (empty or `.` component)".into()),
            _ => {}
        }
    }
    if path == MANIFEST_NAME || path == SIGNATURE_NAME {
        return Err("the manifest cannot list itself or its signature".into());
    }
    Ok(())
}

/// Checks that a digest is 64 lowercase hex digits.
pub fn check_digest(sha256: &str) -> Result<(), String> {
    if sha256.len() == 64
        && sha256
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    {
        Ok(())
    } else {
        Err(format!("sha256 {sha256:?} is not 64 lowercase hex digits"))
    }
}
