//! The signature check of a manifest against one trusted key
//! ([`verify_manifest_bytes`]; a disk's root of trust is [`crate::trust`]'s);
//! and whether a
//! verified payload may go onto a disk ([`check_for_disk`]), the same
//! check for `imager upgrade` and the node's pull.
//!
//! Only bytes: the manifest and its signature as read (from a directory, an
//! installer image or a registry). The artifacts the manifest lists are the
//! caller's to check (imager's `sign::verify`, for a manifest in a directory).

use anyhow::{Context, Result, bail};
use contract::meta::{Meta, Tag};
use ed25519_dalek::{Signature, VerifyingKey};

use crate::keys::key_id;
use crate::manifest::Manifest;

/// Verifies that `signature` (the bytes of the signature file `sig_name`:
/// a raw 64-byte ed25519 signature) signs `bytes` (the manifest `name`) with
/// the trusted `public_key`, and decodes the manifest from those very bytes.
/// The artifacts it lists are not checked: that is the caller's job (or
/// imager's `sign::verify`, for a manifest in a directory).
pub fn verify_manifest_bytes(
    bytes: &[u8],
    signature: &[u8],
    public_key: &VerifyingKey,
    name: &str,
    sig_name: &str,
) -> Result<Manifest> {
    let raw: [u8; 64] = signature.try_into().map_err(|_| {
        anyhow::anyhow!(
            "signature {sig_name} is {} bytes, expected a raw 64-byte ed25519 signature",
            signature.len()
        )
    })?;
    check_signed(
        bytes,
        &Signature::from_bytes(&raw),
        public_key,
        name,
        sig_name,
    )
}

/// The key id a manifest that is not trusted says signed it, when it looks
/// like one (`ed25519:` and 16 hex digits): only to explain a failure, and
/// never more of the untrusted bytes than that.
pub fn claimed_key_id(bytes: &[u8]) -> Option<String> {
    let v = serde_json::from_slice::<serde_json::Value>(bytes).ok()?;
    let k = v.get("key_id")?.as_str()?;
    let hex = k.strip_prefix("ed25519:")?;
    (hex.len() == 16 && hex.bytes().all(|b| b.is_ascii_hexdigit())).then(|| k.to_string())
}

/// The signature check of [`verify_manifest_bytes`] (and of imager's
/// `sign::verify`, which reads the signature from a file): `signature`
/// signs `bytes` (the manifest `name`; its signature file is `sig_name`)
/// with `public_key`, and the manifest decoded from those very bytes names
/// that key.
pub fn check_signed(
    bytes: &[u8],
    signature: &Signature,
    public_key: &VerifyingKey,
    name: &str,
    sig_name: &str,
) -> Result<Manifest> {
    let trusted = key_id(public_key);
    if public_key.verify_strict(bytes, signature).is_err() {
        match claimed_key_id(bytes) {
            Some(claimed) if claimed != trusted => bail!(
                "{name} is signed by key {claimed} but the trusted key is {trusted}: \
                 pass --key with the public key that signed it"
            ),
            _ => bail!(
                "signature {sig_name} does not match {name}: the manifest was modified after \
                 signing (or the signature was damaged)"
            ),
        }
    }
    let manifest = Manifest::parse(bytes)
        .with_context(|| format!("{name} is correctly signed but unusable"))?;
    if manifest.key_id != trusted {
        bail!(
            "{name} is signed by the trusted key {trusted} but names key {} in key_id: \
             refusing an inconsistent manifest",
            manifest.key_id
        );
    }
    Ok(manifest)
}

/// Refuses a payload whose signed architecture ([`Manifest::arch`]) is not
/// `arch`, what the disk boots (or an install was asked for: `--arch`);
/// before anything is written.
pub fn check_arch(m: &Manifest, arch: contract::Arch) -> Result<()> {
    let payload = m.arch()?;
    if payload != arch {
        bail!(
            "it is an {payload} payload (of {} {}) but this disk boots {arch}: take the installer \
             image's {arch} manifest (an image index holds one per architecture); nothing \
             was written",
            contract::text::escape(&m.name),
            m.version
        );
    }
    Ok(())
}

/// What the operator asked of a payload: the version it must be, and
/// whether an admin allows a lower security version this once.
#[derive(Debug, Clone, Copy, Default)]
pub struct Asked<'a> {
    /// `--version`, or the version the image reference's tag names.
    pub version: Option<&'a str>,
    /// `--allow-downgrade`.
    pub allow_downgrade: bool,
}

/// Whether the verified payload `m` may be installed on the disk whose
/// META is `meta` and which boots `disk_arch` (its ESP's boot loader's,
/// or the running machine's), as `asked`: the same architecture, the same
/// system (META's image name, which
/// every disk this project makes has: a disk without one is refused, not
/// trusted), the version asked for ([`contract::version::is_expected`]),
/// and a security version not below the disk's floor unless allowed
/// ([`contract::version::check_security`]). The messages end in "nothing
/// was written": callers check before writing.
pub fn check_for_disk(
    meta: &Meta,
    disk_arch: contract::Arch,
    m: &Manifest,
    asked: Asked<'_>,
) -> Result<()> {
    let expected = asked.version;
    check_arch(m, disk_arch)?;
    let Some(name) = meta.get(Tag::ImageName) else {
        bail!(
            "META holds no image name, so nothing tells whether the payload (of the system {}) \
             is for this disk: refusing it; nothing was written (reinstall the disk with \
             `imager install`, which records the name)",
            contract::text::excerpt(&m.name)
        );
    };
    if name != m.name {
        bail!(
            "it is for the system {} but this disk runs {}: an upgrade installs a new \
             version of the same system; nothing was written",
            contract::text::excerpt(&m.name),
            contract::text::excerpt(name)
        );
    }
    if !contract::version::is_expected(expected, &m.version) {
        bail!(
            "it holds {} {} (genuinely signed), not the version {} asked for (the tag's, or \
             --version's): a registry can serve any signed payload under any tag; nothing was \
             written",
            contract::text::escape(&m.name),
            m.version,
            expected.unwrap_or_default()
        );
    }
    let floor = contract::state::BootState::from_meta(meta)
        .map_err(anyhow::Error::msg)?
        .security_floor;
    if let Err(why) =
        contract::version::check_security(floor, m.security_version, asked.allow_downgrade)
    {
        bail!(
            "{} {}: {why}; nothing was written",
            contract::text::escape(&m.name),
            m.version
        );
    }
    Ok(())
}
