//! Whether the firmware booted with Secure Boot on, for the ready line:
//! the UEFI global variable `SecureBoot` (4 bytes of attributes, then one
//! byte, 1 = on) read through efivarfs ([`crate::efi`]).
//!
//! Without `/sys/firmware/efi` the machine booted through BIOS: off. A UEFI
//! boot whose efivarfs cannot be mounted (a kernel without
//! CONFIG_EFIVAR_FS) or read is `unknown`; never a failure of the boot.
//! Firmware without Secure Boot support has no such variable: off.

use crate::console::say;
use crate::efi;
use contract::ready::SecureBoot;

/// EFI_GLOBAL_VARIABLE's `SecureBoot`.
const VARIABLE: &str = "SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c";

/// The variable's contents to a state: attributes (4 bytes) and a byte.
pub fn decode(bytes: &[u8]) -> SecureBoot {
    match bytes {
        [_, _, _, _, 1] => SecureBoot::On,
        [_, _, _, _, 0] => SecureBoot::Off,
        _ => SecureBoot::Unknown,
    }
}

/// The Secure Boot state of this boot.
pub fn state() -> SecureBoot {
    if !efi::booted_uefi() {
        return SecureBoot::Off;
    }
    match efi::read(VARIABLE) {
        Ok(Some(bytes)) => decode(&bytes),
        Ok(None) => SecureBoot::Off,
        Err(e) => {
            say(format!(
                "stage2: warning: cannot read the Secure Boot state: {e:#}"
            ));
            SecureBoot::Unknown
        }
    }
}

/// Writes to firmware what its db and dbx lack of the Secure Boot updates
/// of `version`, the blessed version running (META's
/// `secure-boot-updates`, docs/secureboot.md "Rotating the db key and
/// revoking UKIs"), and adds to META's `secure-boot` record the db
/// certificates firmware then holds. Only with Secure Boot on, and only
/// the running version's updates (a slot rolled back to leaves a newer
/// version's alone). Never a failure of the boot: what went wrong is said
/// on the console.
pub fn apply_updates(disk: &crate::slots::Disk, version: &str) {
    if let Err(e) = try_apply(disk, version) {
        say(format!("secure boot: warning: {e:#}"));
    }
}

fn try_apply(disk: &crate::slots::Disk, version: &str) -> anyhow::Result<()> {
    use anyhow::Context;
    use contract::meta::Tag;
    use payload::efivar::{self, Entry, Record, Var};
    let meta = disk.meta()?;
    let Some(text) = meta.get(Tag::SecureBootUpdates) else {
        return Ok(());
    };
    let record = Record::from_meta(text).context("META's secure-boot-updates")?;
    if record.version != version {
        say(format!(
            "secure boot: the updates in META are version {}'s, not this version's: left alone",
            contract::text::escape(&record.version)
        ));
        return Ok(());
    }
    if state() != SecureBoot::On {
        say("secure boot: not on: this version's db and dbx updates wait until it is");
        return Ok(());
    }
    for (name, bytes) in &record.updates {
        let u = efivar::parse_update(name, bytes)?;
        let var = u.var.efivarfs_name();
        let lacking = efivar::missing(&held(&var)?, &u).len();
        if u.var == Var::Dbx && lacking > 0 {
            payload::secureboot::check_loader_not_revoked(name, &u, &disk.esp_loader()?)?;
        }
        if lacking == 0 {
            say(format!(
                "secure boot: {} holds the {} entries of {name}",
                u.var.name(),
                u.entries.len()
            ));
        } else {
            efi::append(&var, efivar::ATTRIBUTES | efivar::APPEND_WRITE, bytes)
                .with_context(|| format!("appending {name} to {}", u.var.name()))?;
            let still = efivar::missing(&held(&var)?, &u);
            anyhow::ensure!(
                still.is_empty(),
                "firmware took {name}, and its {} still lacks {}",
                u.var.name(),
                still[0].describe()
            );
            say(format!(
                "secure boot: {name}: firmware's {} took {lacking} entries",
                u.var.name()
            ));
        }
        // META's db certificates follow firmware's: a certificate db took
        // is trusted, one dbx took is not (upgrades signed by it are then
        // refused whatever record META keeps later).
        let certs: Vec<&[u8]> = u
            .entries
            .iter()
            .filter_map(|e| match e {
                Entry::X509(der) => Some(der.as_slice()),
                Entry::Sha256(_) => None,
            })
            .collect();
        if certs.is_empty() {
            continue;
        }
        let meta = disk.meta()?;
        let pem = meta.get(Tag::SecureBoot).unwrap_or_default();
        let new = match u.var {
            Var::Db => payload::secureboot::with_db_certs(pem, &certs)?,
            Var::Dbx => payload::secureboot::without_db_certs(pem, &certs)?,
        };
        if let Some(new) = new {
            disk.set_secure_boot(&new)
                .context("changing META's db certificates to firmware's")?;
            say(format!(
                "secure boot: META trusts the {} db certificates firmware holds",
                payload::secureboot::disk_certs(&new)?.len()
            ));
        }
    }
    Ok(())
}

/// The entries firmware's variable `var` holds (none when it has none).
fn held(var: &str) -> anyhow::Result<Vec<payload::efivar::Entry>> {
    let max = payload::efivar::MAX_VAR_LEN as u64 + 4;
    match efi::read_up_to(var, max)? {
        Some(bytes) if bytes.len() >= 4 => payload::efivar::parse_lists(&bytes[4..]),
        Some(_) | None => Ok(Vec::new()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variable_contents() {
        assert_eq!(decode(&[6, 0, 0, 0, 1]), SecureBoot::On);
        assert_eq!(decode(&[6, 0, 0, 0, 0]), SecureBoot::Off);
        assert_eq!(decode(&[6, 0, 0, 0, 2]), SecureBoot::Unknown);
        assert_eq!(decode(&[6, 0, 0, 0]), SecureBoot::Unknown);
        assert_eq!(decode(&[6, 0, 0, 0, 1, 0]), SecureBoot::Unknown);
        assert_eq!(decode(&[]), SecureBoot::Unknown);
    }
}
