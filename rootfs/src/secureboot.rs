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
/// revoking UKIs"), and makes META's `secure-boot` record follow: the db
/// certificates firmware's db then holds are added, those its dbx revokes
/// removed. Only with Secure Boot on, and only
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
    use payload::efivar::Record;
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
    // Each update alone: one that fails is said, and the others go on.
    for (name, bytes) in &record.updates {
        if let Err(e) = apply_one(disk, name, bytes) {
            say(format!("secure boot: warning: {name}: {e:#}"));
        }
    }
    Ok(())
}

/// One update file: written to firmware when its variable lacks entries,
/// and META's db certificates made to follow (a certificate db took is
/// trusted; one dbx takes is not, and leaves META first, so that a cut
/// between the two writes leaves META trusting less than firmware, never
/// more).
fn apply_one(disk: &crate::slots::Disk, name: &str, bytes: &[u8]) -> anyhow::Result<()> {
    use anyhow::Context;
    use contract::meta::Tag;
    use payload::efivar::{self, Entry, Var};
    let u = efivar::parse_update(name, bytes)?;
    let var = u.var.efivarfs_name();
    let lacking = efivar::missing(&held(&var)?, &u).len();
    let certs: Vec<&[u8]> = u
        .entries
        .iter()
        .filter_map(|e| match e {
            Entry::X509(der) => Some(der.as_slice()),
            Entry::Sha256(_) => None,
        })
        .collect();
    let set_meta = |new: Option<String>| -> anyhow::Result<()> {
        if let Some(new) = new {
            disk.set_secure_boot(&new)
                .context("changing META's db certificates to firmware's")?;
            say(format!(
                "secure boot: META trusts the {} db certificates firmware holds",
                payload::secureboot::disk_certs(&new)?.len()
            ));
        }
        Ok(())
    };
    let pem = || -> anyhow::Result<String> {
        Ok(disk
            .meta()?
            .get(Tag::SecureBoot)
            .unwrap_or_default()
            .to_string())
    };
    if u.var == Var::Dbx {
        if lacking > 0 {
            payload::secureboot::check_loader_not_revoked(name, &u, &disk.esp_loader()?)?;
        }
        // (Refused here, before firmware is written, when it would leave
        // META trusting no key.)
        if !certs.is_empty() {
            set_meta(payload::secureboot::without_db_certs(&pem()?, &certs)?)?;
        }
    }
    if lacking == 0 {
        say(format!(
            "secure boot: {} holds the {} entries of {name}",
            u.var.name(),
            u.entries.len()
        ));
    } else {
        efi::append(&var, efivar::ATTRIBUTES | efivar::APPEND_WRITE, bytes)
            .with_context(|| format!("appending it to {}", u.var.name()))?;
        let still = efivar::missing(&held(&var)?, &u);
        anyhow::ensure!(
            still.is_empty(),
            "firmware took it, and its {} still lacks {}",
            u.var.name(),
            still[0].describe()
        );
        say(format!(
            "secure boot: {name}: firmware's {} took {lacking} entries",
            u.var.name()
        ));
    }
    if u.var == Var::Db && !certs.is_empty() {
        set_meta(payload::secureboot::with_db_certs(&pem()?, &certs)?)?;
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
