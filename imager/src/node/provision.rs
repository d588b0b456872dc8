//! `imager node provision`: gives a disk its node API credentials, its
//! own settings (hostname, network, DNS: [`contract::settings`]), or both,
//! in one write of META. The settings given replace the disk's keys of the
//! same name and keep the others.
//!
//! The node's certificate and key, and the cluster CA's certificate its
//! clients must chain to, go into META (`node-ca`, `node-cert`,
//! `node-key`), never into an image: images are public outputs, a node's
//! key is not. An image may carry the CA certificate (profile
//! `node_api.ca`): its disks then have `node-ca` from the start, and
//! credentials of another CA are refused without `--force`. The runtime serves the API only when META has all three.
//! Everything is checked before META is written (the certificate chains to
//! the CA for the node's name, the key is its key, the key file is not
//! readable by others); META's own write order keeps one valid copy
//! through a power cut ([`bootstate::meta::write`]).
//!
//! META is not encrypted: whoever can read the disk reads the node's key.
//! So a disk image file given to provision is made readable by its owner
//! only (mode 0600, group and others' bits cleared) before the key goes
//! in, and the result says so; a block device's permissions are the
//! system's (docs/node-api.md says who can read what).

use super::credentials::{CA_CERT, Holder, read_small};
use anyhow::{Context, Result, bail};
use bootstate::disk::{Access, Disk};
use contract::meta::Tag;
use contract::settings::Settings;
use std::path::{Path, PathBuf};

/// What to provision.
#[derive(Debug, Clone, Default)]
pub struct Request {
    /// The credentials directory and the node's name in it.
    pub credentials: Option<(PathBuf, String)>,
    /// The node's own settings; they replace any it had.
    pub settings: Option<Settings>,
    /// A file of PEM CA certificates for the node's registries
    /// (META `registry-ca`).
    pub registry_ca: Option<PathBuf>,
    /// Replace credentials the disk has already (or of another CA).
    pub force: bool,
}

/// What was provisioned (no key material).
#[derive(Debug, Clone, serde::Serialize)]
pub struct Provisioned {
    pub disk: PathBuf,
    /// The node whose credentials were written, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// The node's settings written, as META holds them, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub settings: Option<String>,
    /// Whether the disk had node credentials before (they were replaced).
    pub replaced: bool,
    /// The number of registry CA certificates written, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub registry_cas: Option<usize>,
    /// The image file's mode before provision made it readable by its
    /// owner only (octal, e.g. `0644`), when others could read it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub made_private_from: Option<String>,
}

/// Writes what `req` asks into the META of `disk`, in one write: the
/// credentials of a node from a credentials directory (a disk that has
/// credentials already keeps them unless `force`), its settings, or both.
/// Everything is checked before anything is written.
pub fn provision(disk: &Path, req: &Request) -> Result<Provisioned> {
    crate::install::require_raw(disk)?;
    if req.credentials.is_none() && req.settings.is_none() && req.registry_ca.is_none() {
        bail!(
            "nothing to provision: give --credentials DIR --node NAME, a node's settings \
             (--hostname, --net, --dns, --host), --registry-ca FILE, or several"
        );
    }
    let registry_ca = req
        .registry_ca
        .as_ref()
        .map(|p| -> Result<(String, usize)> {
            let pem = read_small(p, "registry CA certificates")?;
            let n = nodeapi::tls::certs(pem.as_bytes(), "registry CA file")?.len();
            Ok((pem, n))
        })
        .transpose()?;
    let creds = req
        .credentials
        .as_ref()
        .map(|(dir, name)| read_credentials(dir, name))
        .transpose()?;
    let disk_handle = Disk::open(disk, Access::Write)?;
    let mut meta_dev = disk_handle.meta()?;
    let (mut meta, _) = bootstate::meta::read(&mut meta_dev).with_context(|| {
        format!(
            "reading META of {}: is it a disk made by imager?",
            disk.display()
        )
    })?;
    let mut changed = false;
    let (mut replaced, mut made_private_from) = (false, None);
    if let Some(c) = &creds {
        let (r, m) = set_credentials(disk, &mut meta, c, req.force)?;
        (replaced, made_private_from) = (r, m.0);
        changed |= m.1;
    }
    // Given keys replace the disk's; the others are kept.
    let settings = match &req.settings {
        Some(given) => Some(merge(meta.get(Tag::NodeSettings), given)?.render()),
        None => None,
    };
    if let Some(text) = &settings
        && meta.get(Tag::NodeSettings) != Some(text.as_str())
    {
        meta.set(Tag::NodeSettings, text.as_bytes());
        changed = true;
    }
    if let Some((pem, _)) = &registry_ca
        && meta.get(Tag::RegistryCa) != Some(pem.as_str())
    {
        meta.set(Tag::RegistryCa, pem.as_bytes());
        changed = true;
    }
    if changed {
        bootstate::meta::write(&mut meta_dev, &meta)
            .with_context(|| format!("writing META of {}", disk.display()))?;
    }
    Ok(Provisioned {
        disk: disk.to_path_buf(),
        node: req.credentials.as_ref().map(|(_, n)| n.clone()),
        settings,
        replaced,
        registry_cas: registry_ca.map(|(_, n)| n),
        made_private_from,
    })
}

/// The disk's settings record (`None`: none, or one that does not parse,
/// which is replaced) with the keys `given` sets replacing its own, checked
/// again as a whole.
fn merge(on_disk: Option<&str>, given: &Settings) -> Result<Settings> {
    let old = on_disk
        .and_then(|t| Settings::parse(t).ok())
        .unwrap_or_default();
    Settings::new(
        given.hostname.clone().or(old.hostname),
        given.net.clone().or(old.net),
        if given.dns.is_empty() {
            old.dns
        } else {
            given.dns.clone()
        },
    )
    .and_then(|s| {
        s.with_hosts(if given.hosts.is_empty() {
            old.hosts
        } else {
            given.hosts.clone()
        })
    })
    .map(|mut s| {
        s.revoked = if given.revoked.is_empty() {
            old.revoked
        } else {
            given.revoked.clone()
        };
        s
    })
    .map_err(|e| {
        anyhow::anyhow!(
            "with the disk's own settings kept, {e}; nothing was written (give that key too)"
        )
    })
}

/// A node's credentials, read and checked.
pub struct Credentials {
    pub dir: PathBuf,
    /// The CA certificates its clients must chain to
    /// ([`super::credentials::trust_bundle`]).
    pub ca: String,
    pub cert: String,
    pub key: String,
}

/// The credentials of node `name` in `dir`, checked: its certificate valid
/// for `name` under the CA certificates, its key its key (mode 0600 or
/// stricter). What `provision` writes to a disk and `imager node
/// set-credentials` sends to a node.
pub fn read_credentials(dir: &Path, name: &str) -> Result<Credentials> {
    let (cert_file, key_file) = Holder::Node {
        name: name.to_string(),
        addresses: Vec::new(),
    }
    .files();
    let (cert_path, key_path) = (dir.join(&cert_file), dir.join(&key_file));
    if !cert_path.exists() {
        bail!(
            "{} not found: make the node's credentials first with `imager node credentials {} \
             --node {name} --address IP`",
            cert_path.display(),
            dir.display()
        );
    }
    crate::secret::refuse_readable_by_others(&key_path)?;
    let ca = super::credentials::trust_bundle(dir)?;
    let cert = read_small(&cert_path, "node certificate")?;
    let key = read_small(&key_path, "node key")?;
    nodeapi::tls::check_node(ca.as_bytes(), cert.as_bytes(), key.as_bytes(), name)?;
    Ok(Credentials {
        dir: dir.to_path_buf(),
        ca,
        cert,
        key,
    })
}

/// Sets the credentials in `meta`: whether the disk had others (replaced),
/// the image file's mode before it was made private, and whether `meta`
/// changed.
fn set_credentials(
    disk: &Path,
    meta: &mut contract::meta::Meta,
    c: &Credentials,
    force: bool,
) -> Result<(bool, (Option<String>, bool))> {
    let (ca, cert, key, dir) = (&c.ca, &c.cert, &c.key, &c.dir);
    // The image's CA (profile `node_api.ca`), when it carries one, is the
    // cluster's: credentials of another CA would lock its clients out.
    // (During a CA rollover the directory trusts the image's CA and the
    // new one: that keeps its clients.)
    let within = |theirs: &str| -> bool {
        let ours = nodeapi::tls::certs(ca.as_bytes(), "CA certificates").unwrap_or_default();
        nodeapi::tls::certs(theirs.as_bytes(), "CA certificates")
            .is_ok_and(|t| t.iter().all(|c| ours.contains(c)))
    };
    if let Some(theirs) = meta.get(Tag::NodeCa)
        && !within(theirs)
        && !force
    {
        bail!(
            "{} trusts another cluster CA than {} (its image carries one, or it was \
             provisioned before): its clients would be refused; provision it with credentials \
             of that CA, or pass --force to replace the CA; nothing was written",
            disk.display(),
            dir.join(CA_CERT).display()
        );
    }
    let replaced = meta.get(Tag::NodeKey).is_some();
    let same = meta.get(Tag::NodeCa) == Some(ca.as_str())
        && meta.get(Tag::NodeCert) == Some(cert.as_str())
        && meta.get(Tag::NodeKey) == Some(key.as_str());
    if replaced && !same && !force {
        bail!(
            "{} has node credentials already; pass --force to replace them (clients of the old \
             CA are then refused); nothing was written",
            disk.display()
        );
    }
    // Checked: the file is to hold the key (or holds it already).
    let made_private_from = make_private(disk)?;
    if !same {
        meta.set(Tag::NodeCa, ca.as_bytes());
        meta.set(Tag::NodeCert, cert.as_bytes());
        meta.set(Tag::NodeKey, key.as_bytes());
    }
    Ok((replaced && !same, (made_private_from, !same)))
}

/// Clears the group's and others' permission bits of the disk image file
/// `disk` (it is to hold a private key); returns its mode before, when it
/// changed. A block device is left as it is.
fn make_private(disk: &Path) -> Result<Option<String>> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(disk).with_context(|| format!("reading {}", disk.display()))?;
    let mode = meta.permissions().mode() & 0o7777;
    if !meta.is_file() || mode & 0o077 == 0 {
        return Ok(None);
    }
    std::fs::set_permissions(disk, std::fs::Permissions::from_mode(mode & !0o077)).with_context(
        || {
            format!(
                "{} is readable by others (mode {mode:04o}) and is to hold the node's private \
                 key, but its mode cannot be changed: chmod 600 it; nothing was written",
                disk.display()
            )
        },
    )?;
    Ok(Some(format!("{mode:04o}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_settings_replace_their_keys_and_keep_the_others() {
        let disk = "hostname=n1\nnet=eth0:10.0.2.20/24:10.0.2.2\ndns=10.0.2.3\n";
        let dns_only = Settings::parse("dns=1.1.1.1\n").unwrap();
        assert_eq!(
            merge(Some(disk), &dns_only).unwrap().render(),
            "hostname=n1\nnet=eth0:10.0.2.20/24:10.0.2.2\ndns=1.1.1.1\n"
        );
        let net = Settings::parse("net=eth0:dhcp\n").unwrap();
        assert_eq!(
            merge(Some(disk), &net).unwrap().render(),
            "hostname=n1\nnet=eth0:dhcp\ndns=10.0.2.3\n"
        );
        // Revoked certificates are kept, and replaced when given.
        let fp = "ab".repeat(32);
        let with_revoked = format!("{disk}revoked={fp}\n");
        assert_eq!(
            merge(Some(&with_revoked), &dns_only).unwrap().render(),
            format!("hostname=n1\nnet=eth0:10.0.2.20/24:10.0.2.2\ndns=1.1.1.1\nrevoked={fp}\n")
        );
        let other = "cd".repeat(32);
        let revoke = Settings::parse(&format!("revoked={other}\n")).unwrap();
        assert!(
            merge(Some(&with_revoked), &revoke)
                .unwrap()
                .render()
                .ends_with(&format!("revoked={other}\n"))
        );
        // A record that does not parse is replaced.
        assert_eq!(
            merge(Some("junk"), &net).unwrap().render(),
            "net=eth0:dhcp\n"
        );
        // The whole is checked: the disk's DNS server is the new address.
        let clash = Settings::parse("net=eth0:10.0.2.3/24\n").unwrap();
        let e = format!("{:#}", merge(Some(disk), &clash).unwrap_err());
        assert!(
            e.contains("own address") && e.contains("nothing was written"),
            "{e}"
        );
    }
}
