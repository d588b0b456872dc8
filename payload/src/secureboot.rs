//! Whether a disk takes a payload, as far as Secure Boot is concerned: one
//! decision for `imager upgrade` and for the node's pulls, made before
//! anything is written.
//!
//! A disk that boots with Secure Boot has META's `secure-boot` record: the
//! db certificate its firmware trusts. It takes
//!
//! - a payload signed for that certificate whose UKIs verify with it (the
//!   firmware would refuse the others after the switch): [`Move::Keep`];
//! - when asked for (`change`), a payload without Secure Boot, which then
//!   leaves Secure Boot once it is blessed (`bootstate::ops`):
//!   [`Move::Leave`].
//!
//! A disk without it takes a payload without it ([`Move::None`]), and a
//! Secure Boot payload only when asked for and only one whose boot loader
//! and UKIs verify with the payload's own db certificate: the upgrade then
//! replaces the ESP's boot loader ([`Move::Enter`]). Signatures are checked
//! by the `authenticode` crate, files streamed.

use anyhow::{Context, Result, bail, ensure};
use std::path::Path;

/// What an upgrade does to Secure Boot; see the module doc.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Move {
    /// Neither the disk nor the payload has it.
    None,
    /// The disk has it and keeps it.
    Keep,
    /// The disk has it and leaves it once the payload is blessed.
    Leave,
    /// The disk enters it: the ESP gets the payload's boot loader.
    Enter,
}

/// A payload's Secure Boot parts, staged: its db certificate (PEM), its
/// signed boot loader and its UKIs by slot (A, B); each `None` when the
/// payload has none.
#[derive(Debug, Clone, Copy, Default)]
pub struct Signed<'a> {
    pub db: Option<&'a str>,
    pub loader: Option<&'a Path>,
    pub ukis: Option<[&'a Path; 2]>,
}

/// The part of [`check`] a payload's signed manifest settles alone (the
/// disk has Secure Boot and the payload not, or the reverse, without
/// `change`): the node refuses such a payload before pulling it.
pub fn check_manifest(
    disk_db: Option<&str>,
    m: &crate::manifest::Manifest,
    change: bool,
) -> Result<()> {
    let payload_db = m
        .artifacts
        .iter()
        .any(|a| a.kind == crate::artifact::Kind::SecureBootDb);
    match (disk_db.is_some(), payload_db, change) {
        (true, false, false) => bail!(NOT_SIGNED_FOR_DISK),
        (false, true, false) => bail!(NOT_A_SECURE_BOOT_DISK),
        _ => Ok(()),
    }
}

const NOT_SIGNED_FOR_DISK: &str = "this disk boots with Secure Boot and the payload is not \
    signed for it (no UKIs signed with a db key): firmware would refuse it after the switch; \
    nothing was written. Upgrade with a secure-boot build, or leave Secure Boot with `imager \
    upgrade --change-secure-boot` (turn it off in the firmware first)";

const NOT_A_SECURE_BOOT_DISK: &str = "this disk does not boot with Secure Boot and the payload \
    is a Secure Boot build; nothing was written. `imager upgrade --change-secure-boot` moves \
    the disk into Secure Boot (the upgrade replaces the ESP's boot loader with the signed one \
    and the disk boots under UEFI only from then on; enrol the keys and turn Secure Boot on \
    once the new version is blessed: docs/secureboot.md), or install it from the secure-boot \
    installer (`imager install`)";

/// The decision for a disk whose META's `secure-boot` record is `disk_db`;
/// `change` asks for a move into or out of Secure Boot (`imager upgrade
/// --change-secure-boot`; the node's API never asks).
pub fn check(disk_db: Option<&str>, payload: Signed, change: bool) -> Result<Move> {
    match (disk_db, payload.db) {
        (None, None) => Ok(Move::None),
        (Some(_), None) if change => Ok(Move::Leave),
        (Some(_), None) => bail!(NOT_SIGNED_FOR_DISK),
        (None, Some(db)) if change => {
            let cert =
                authenticode::parse_cert(db.as_bytes()).context("the payload's db certificate")?;
            let loader = payload
                .loader
                .context("the Secure Boot payload carries no boot loader: rebuild the installer")?;
            verify_all(&cert, &boot_chain(loader, payload.ukis)?).map_err(|e| {
                e.context(
                    "the payload is not signed for its own db certificate: rebuild the \
                     installer; nothing was written",
                )
            })?;
            Ok(Move::Enter)
        }
        (None, Some(_)) => bail!(NOT_A_SECURE_BOOT_DISK),
        (Some(db), Some(payload_db)) => {
            let trusted = disk_certs(db)?;
            let theirs = authenticode::parse_cert(payload_db.as_bytes())
                .context("the payload's db certificate")?;
            let Some(cert) = trusted.into_iter().find(|c| *c == theirs) else {
                bail!(
                    "the payload is signed for another db certificate than the one this disk \
                     trusts (META's secure-boot record: the db certificates its firmware \
                     holds): nothing was written. Build it with the key \
                     directory this disk was built with (secure_boot.keys), or first upgrade to \
                     a version that adds the new db certificate to firmware \
                     (secure_boot.updates: docs/secureboot.md, \"Rotating the db key\") and \
                     boot it until its runtime says it did"
                );
            };
            let [a, b] = payload
                .ukis
                .context("the payload has a db certificate but no UKIs: rebuild the installer")?;
            let mut files = vec![("UKI of slot A", a), ("UKI of slot B", b)];
            files.extend(payload.loader.map(|l| ("boot loader", l)));
            verify_all(&cert, &files).map_err(|e| {
                e.context(
                    "the payload is not signed by the db key this disk trusts (firmware would \
                     refuse it after the switch); nothing was written. Build it with the key \
                     directory this disk was built with (secure_boot.keys)",
                )
            })?;
            Ok(Move::Keep)
        }
    }
}

/// The most db certificates META's `secure-boot` record holds.
pub const MAX_DB_CERTS: usize = 16;

/// The db certificates of META's `secure-boot` record (PEM, one or more).
pub fn disk_certs(pem: &str) -> Result<Vec<authenticode::Certificate>> {
    const END: &str = "-----END CERTIFICATE-----";
    let mut out = Vec::new();
    for part in pem.split_inclusive(END).filter(|p| p.contains(END)) {
        ensure!(
            out.len() < MAX_DB_CERTS,
            "META's secure-boot record holds more than {MAX_DB_CERTS} certificates"
        );
        out.push(
            authenticode::parse_cert(part.trim().as_bytes())
                .context("META's secure-boot record is not a certificate: reinstall the disk")?,
        );
    }
    ensure!(
        !out.is_empty(),
        "META's secure-boot record holds no certificate: reinstall the disk"
    );
    Ok(out)
}

/// META's `secure-boot` record with the certificates `added` (DER) that it
/// lacks; `None` when it holds them all.
pub fn with_db_certs(pem: &str, added: &[&[u8]]) -> Result<Option<String>> {
    let held = disk_certs(pem)?;
    let mut out = pem.to_string();
    let mut changed = false;
    for der in added {
        let c = authenticode::parse_cert(der).context("a certificate added to db")?;
        if !held.contains(&c) {
            if !out.ends_with('\n') {
                out.push('\n');
            }
            out.push_str(&authenticode::cert_pem(&c)?);
            changed = true;
        }
    }
    if changed {
        disk_certs(&out)?;
    }
    Ok(changed.then_some(out))
}

/// What dbx updates revoke: images by their Authenticode SHA-256 digest,
/// and every image a certificate's key signed (EDK2 refuses an image whose
/// signature verifies with an X.509 entry of dbx, as with one of db). One
/// check for the build, the upgrades and the runtime's guard.
#[derive(Debug, Default)]
pub struct Revoked {
    digests: Vec<[u8; 32]>,
    certs: Vec<authenticode::Certificate>,
}

impl Revoked {
    /// The dbx entries of `update` (a db update revokes nothing).
    pub fn of(update: &crate::efivar::Update) -> Result<Self> {
        let mut r = Revoked::default();
        r.add(update)?;
        Ok(r)
    }

    /// Adds the dbx entries of `update`.
    pub fn add(&mut self, update: &crate::efivar::Update) -> Result<()> {
        use crate::efivar::{Entry, Var};
        if update.var != Var::Dbx {
            return Ok(());
        }
        for e in &update.entries {
            match e {
                Entry::Sha256(d) => self.digests.push(*d),
                Entry::X509(der) => self.certs.push(
                    authenticode::parse_cert(der).context("a certificate revoked through dbx")?,
                ),
            }
        }
        Ok(())
    }

    /// Whether it revokes nothing.
    pub fn is_empty(&self) -> bool {
        self.digests.is_empty() && self.certs.is_empty()
    }

    /// How the signed PE file at `path` is revoked (`by its digest`, `by
    /// the certificate …`), `None` when it is not. Streamed, and read once
    /// whatever the number of certificates.
    pub fn file(&self, path: &Path) -> Result<Option<String>> {
        if self.is_empty() {
            return Ok(None);
        }
        if self.certs.is_empty() {
            return Ok(self.how(authenticode::file_digest(path)?, |_| false));
        }
        // Read once, checked against each certificate; an unsigned image
        // is revoked by its digest alone, and a signature that does not
        // read is an error (never taken for one no certificate revokes).
        match authenticode::read_signed_file(path)? {
            Some(f) => Ok(self.how(f.digest(), |c| f.verify(c).is_ok())),
            None => Ok(self.how(authenticode::file_digest(path)?, |_| false)),
        }
    }

    /// [`Revoked::file`] of a PE image in memory.
    pub fn image(&self, pe: &[u8]) -> Result<Option<String>> {
        if self.is_empty() {
            return Ok(None);
        }
        match authenticode::read_signed(pe)? {
            Some(f) => Ok(self.how(f.digest(), |c| f.verify(c).is_ok())),
            None => Ok(self.how(authenticode::digest(pe)?, |_| false)),
        }
    }

    fn how(
        &self,
        digest: [u8; 32],
        signed_by: impl Fn(&authenticode::Certificate) -> bool,
    ) -> Option<String> {
        if self.digests.contains(&digest) {
            return Some("by its digest".into());
        }
        self.certs.iter().find(|c| signed_by(c)).map(|c| {
            format!(
                "by the certificate {}",
                contract::text::quote(&c.tbs_certificate.subject.to_string(), 64)
            )
        })
    }
}

/// META's `secure-boot` record without the certificates whose key is a
/// certificate's of `revoked` (DER: what firmware's dbx takes; compared by
/// public key, as [`Revoked`] compares signers), `None` when it holds none
/// of them. A record that would be left empty is refused: firmware would
/// trust none of the disk's keys.
pub fn without_db_certs(pem: &str, revoked: &[&[u8]]) -> Result<Option<String>> {
    let held = disk_certs(pem)?;
    let mut gone = Vec::new();
    for der in revoked {
        gone.push(authenticode::parse_cert(der).context("a certificate revoked through dbx")?);
    }
    let key = |c: &authenticode::Certificate| c.tbs_certificate.subject_public_key_info.clone();
    let gone: Vec<_> = gone.iter().map(key).collect();
    let kept: Vec<_> = held.iter().filter(|c| !gone.contains(&key(c))).collect();
    if kept.len() == held.len() {
        return Ok(None);
    }
    ensure!(
        !kept.is_empty(),
        "dbx revokes every db certificate META's secure-boot record holds: the disk would trust \
         none of its keys"
    );
    let mut out = String::new();
    for c in kept {
        out.push_str(&authenticode::cert_pem(c)?);
    }
    Ok(Some(out))
}

/// A payload's Secure Boot updates (`files`: its artifacts of kind
/// `secure-boot-update`, by name, read and checked against their signed
/// digests by the caller) checked before anything is written: at most one
/// per variable, and nothing in dbx that revokes the payload's own boot
/// chain (`loader`, its signed boot loader, and its UKIs), by digest or by
/// certificate, which would make the version refuse itself once its
/// runtime wrote them. Returns META's record for `version`, `None` without
/// updates.
pub fn updates(
    version: &str,
    files: Vec<(String, Vec<u8>)>,
    loader: Option<&Path>,
    ukis: Option<[&Path; 2]>,
) -> Result<Option<crate::efivar::Record>> {
    use crate::efivar::parse_update;
    if files.is_empty() {
        return Ok(None);
    }
    let mut own: Vec<(&str, &Path)> = loader.map(|l| ("boot loader", l)).into_iter().collect();
    if let Some([a, b]) = ukis {
        own.extend([("UKI of slot A", a), ("UKI of slot B", b)]);
    }
    let mut read = Vec::new();
    for (name, bytes) in files {
        let name = name.as_str();
        let u = parse_update(name, &bytes)?;
        ensure!(
            !read.iter().any(|(n, _)| n == name),
            "the payload carries {} twice",
            contract::text::escape(name)
        );
        let revoked = Revoked::of(&u)?;
        for (what, path) in &own {
            if let Some(how) = revoked.file(path).with_context(|| format!("its {what}"))? {
                bail!(
                    "{} revokes the payload's own {what} ({how}): the version would refuse \
                     itself once it wrote it; nothing was written",
                    contract::text::escape(name)
                );
            }
        }
        read.push((name.to_string(), bytes));
    }
    crate::efivar::Record::new(version, read).map(Some)
}

/// Refuses a dbx update that revokes `loader`, the boot loader firmware
/// starts from the disk (by its digest, or by the certificate that signed
/// it: an upgrade replaces it with the payload's first,
/// `bootstate::ops::upgrade_with_loader`): the machine would start nothing
/// once firmware took it.
pub fn check_loader_not_revoked(
    name: &str,
    update: &crate::efivar::Update,
    loader: &[u8],
) -> Result<()> {
    let how = Revoked::of(update)?
        .image(loader)
        .context("the disk's boot loader")?;
    if let Some(how) = how {
        bail!(
            "{} revokes the boot loader on this disk's ESP ({how}): firmware would start \
             nothing; not written (docs/secureboot.md, \"Rotating the db key and revoking UKIs\")",
            contract::text::escape(name)
        );
    }
    Ok(())
}

/// What the disk's own Secure Boot updates (META's `secure-boot-updates`)
/// revoke through dbx, and the version they are of; `None` without.
fn disk_revoked(disk_updates: Option<&str>) -> Result<Option<(Revoked, String)>> {
    use crate::efivar::{Record, parse_update};
    let Some(text) = disk_updates else {
        return Ok(None);
    };
    let record = Record::from_meta(text).context("META's secure-boot-updates")?;
    let mut revoked = Revoked::default();
    for (name, bytes) in &record.updates {
        revoked.add(&parse_update(name, bytes)?)?;
    }
    Ok(Some((revoked, contract::text::escape(&record.version))))
}

/// Refuses a payload whose UKIs or boot loader (`signed`) the disk's own
/// Secure Boot updates (META's `secure-boot-updates`, `disk_updates`)
/// revoke through dbx, by digest or by certificate: firmware would refuse
/// them once the runtime wrote the updates, or has already (and the boot
/// loader replaces the ESP's). Before anything is written.
pub fn check_disk_dbx(disk_updates: Option<&str>, signed: Signed) -> Result<()> {
    let Some((revoked, version)) = disk_revoked(disk_updates)? else {
        return Ok(());
    };
    let mut files: Vec<(&str, &Path)> = Vec::new();
    if let Some([a, b]) = signed.ukis {
        files.extend([("UKI of slot A", a), ("UKI of slot B", b)]);
    }
    files.extend(signed.loader.map(|l| ("boot loader", l)));
    for (what, path) in files {
        if let Some(how) = revoked.file(path).with_context(|| format!("its {what}"))? {
            bail!(
                "its {what} is revoked by this disk's Secure Boot updates ({how}; dbx, from \
                 version {version}): firmware refuses it; nothing was written"
            );
        }
    }
    Ok(())
}

/// Refuses a rollback to a slot whose UKI (`uki`, read from BOOT) the
/// disk's Secure Boot updates revoke (`bootstate::ops::rollback_checked`):
/// the slot would be the default without boot counting, and firmware
/// refusing it would leave the machine at its boot menu.
pub fn check_rollback(meta: &contract::meta::Meta, uki: &[u8]) -> Result<()> {
    use contract::meta::Tag;
    if meta.get(Tag::SecureBoot).is_none() {
        return Ok(());
    }
    let Some((revoked, version)) = disk_revoked(meta.get(Tag::SecureBootUpdates))? else {
        return Ok(());
    };
    if let Some(how) = revoked.image(uki).context("its UKI")? {
        bail!(
            "its UKI is revoked by this disk's Secure Boot updates ({how}; dbx, from version \
             {version}): firmware would refuse it and the machine would start nothing"
        );
    }
    Ok(())
}

/// The boot loader and both UKIs, named.
fn boot_chain<'a>(
    loader: &'a Path,
    ukis: Option<[&'a Path; 2]>,
) -> Result<[(&'static str, &'a Path); 3]> {
    let [a, b] = ukis.context("the Secure Boot payload has no UKIs: rebuild the installer")?;
    Ok([
        ("boot loader", loader),
        ("UKI of slot A", a),
        ("UKI of slot B", b),
    ])
}

/// Each file verifies with `cert`; the first that does not is named.
pub fn verify_all(cert: &authenticode::Certificate, files: &[(&str, &Path)]) -> Result<()> {
    for &(what, path) in files {
        authenticode::verify_file(path, cert).with_context(|| format!("its {what}"))?;
    }
    Ok(())
}
