//! Secure Boot of a build (profile `secure_boot`, `docs/secureboot.md`):
//! the key set (the profile's, or development keys made on first use),
//! systemd-boot and the slots' UKIs signed with the db key, and what the
//! ESP and META of a Secure Boot disk carry: `loader.conf` with
//! `secure-boot-enroll`, the signed variable updates in
//! `loader/keys/<name>/`, and the db certificate the disk trusts.

use super::{dev_key_dir, step};
use crate::disk::FatFile;
use crate::profile::{Profile, SecureBootSection};
use crate::secureboot::{self, SecureBootKeys};
use anyhow::{Context, Result};
use contract::paths;
use der::EncodePem;
use std::path::{Path, PathBuf};

/// The development key set, beside the development signing key.
pub const DEV_KEYS: &str = "secureboot";

/// What a Secure Boot build signs with and puts on the ESP.
pub struct SecureBoot {
    pub keys: SecureBootKeys,
    /// The db certificate, PEM: META's `secure-boot` record.
    pub db_pem: String,
    /// `(file name, bytes)` of `PK.auth`, `KEK.auth`, `db.auth`.
    pub enrolment: Vec<(&'static str, Vec<u8>)>,
    /// systemd-boot's `secure-boot-enroll`.
    pub enroll_mode: String,
    /// `secure_boot.updates`: `(file name, path, bytes)`, each read by
    /// `payload::efivar::parse_update`.
    pub updates: Vec<(String, PathBuf, Vec<u8>)>,
}

/// Loads the profile's key set, or the development one (made when missing,
/// and said so).
pub fn load(p: &Profile, s: &SecureBootSection, epoch: u64) -> Result<SecureBoot> {
    let dir = match &s.keys {
        Some(d) => d.clone(),
        None => {
            let dir = dev_key_dir(&p.path).join(DEV_KEYS);
            let made = !dir.join("db.crt").exists();
            if made {
                secureboot::keygen(&dir, false).with_context(|| {
                    format!(
                        "making the development Secure Boot keys in {}",
                        dir.display()
                    )
                })?;
            }
            step(&format!(
                "no secure_boot.keys configured: using the development Secure Boot keys {}{}",
                dir.display(),
                if made { " (created)" } else { "" }
            ));
            dir
        }
    };
    let keys = SecureBootKeys::load_with(&dir, &s.signers)
        .with_context(|| format!("{}: secure_boot.keys", p.path.display()))?;
    let db_pem = keys
        .db
        .cert
        .to_pem(der::pem::LineEnding::LF)
        .context("encoding the db certificate")?;
    let enrolment = secureboot::enrolment_files(&keys, epoch)?;
    let mut updates = Vec::new();
    for path in &s.updates {
        let within = || format!("{}: secure_boot.updates", p.path.display());
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_string();
        let bytes = payload::trust::read_bounded(path, payload::efivar::MAX_LEN as u64)
            .with_context(within)?
            .with_context(|| format!("{}: no such file", path.display()))
            .with_context(within)?;
        payload::efivar::parse_update(&name, &bytes)
            .with_context(|| path.display().to_string())
            .with_context(within)?;
        updates.push((name, path.clone(), bytes));
    }
    if !updates.is_empty() {
        step(
            "WARNING: this build's payloads carry Secure Boot updates (secure_boot.updates): a \
             node running a release made before them refuses such an installer image (an \
             artifact kind it does not know); upgrade older nodes first to a release built \
             without them (docs/secureboot.md, \"Rotating the db key and revoking UKIs\")",
        );
    }
    Ok(SecureBoot {
        keys,
        db_pem,
        enrolment,
        enroll_mode: s.enroll_mode().to_string(),
        updates,
    })
}

impl SecureBoot {
    /// Signs the PE `input` with the db key into `dest`.
    pub fn sign(&self, input: &Path, dest: &Path) -> Result<PathBuf> {
        secureboot::sign(input, &self.keys.db, dest)?;
        Ok(dest.to_path_buf())
    }

    /// META's record of this version's Secure Boot updates, checked
    /// against its own signed boot chain (`payload::secureboot::updates`);
    /// `None` without `secure_boot.updates`.
    pub fn updates_record(
        &self,
        version: &str,
        ukis: Option<&[PathBuf; 2]>,
        boot_loader: &Path,
    ) -> Result<Option<String>> {
        let files = self
            .updates
            .iter()
            .map(|(n, _, b)| (n.clone(), b.clone()))
            .collect();
        let ukis = ukis.map(|[a, b]| [a.as_path(), b.as_path()]);
        let r = payload::secureboot::updates(version, files, Some(boot_loader), ukis)
            .context("secure_boot.updates")?;
        Ok(r.map(|r| r.to_meta()))
    }

    /// The ESP of a Secure Boot disk: the signed systemd-boot,
    /// `loader.conf` with `secure-boot-enroll`, and the signed updates
    /// systemd-boot enrols on a machine in setup mode.
    pub fn esp_files(&self, boot_loader: &Path, arch: contract::Arch) -> Result<Vec<FatFile>> {
        esp_files(boot_loader, arch, &self.enroll_mode, &self.enrolment)
    }
}

/// The ESP of a Secure Boot disk of `arch` from its parts (the build's, or
/// an installer payload's).
pub fn esp_files(
    boot_loader: &Path,
    arch: contract::Arch,
    enroll_mode: &str,
    enrolment: &[(impl AsRef<str>, Vec<u8>)],
) -> Result<Vec<FatFile>> {
    crate::boot::check_efi_binary(boot_loader, arch)?;
    let mut files = vec![
        FatFile::file(arch.esp_boot_loader(), boot_loader),
        FatFile::bytes(
            paths::ESP_LOADER_CONF,
            contract::boot::loader_conf_enrolling(enroll_mode),
        ),
    ];
    let dir = paths::ESP_KEYS_AUTO;
    for (file, bytes) in enrolment {
        files.push(FatFile::bytes(
            format!("{dir}/{}", file.as_ref()),
            bytes.clone(),
        ));
    }
    Ok(files)
}
