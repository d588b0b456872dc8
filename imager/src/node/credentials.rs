//! The cluster's credentials for the node API (`imager node credentials`):
//! a CA, client certificates that carry a role (`nodeapi::role`), and a
//! node's server certificate.
//!
//! In a credentials directory:
//!
//! | file | what |
//! |---|---|
//! | `ca.crt`, `ca.key` | the cluster CA (self-signed; the image and META carry `ca.crt`) |
//! | `NAME.crt`, `NAME.key` | a client (`O=imager:<role>`, extended key usage clientAuth) |
//! | `NAME.node.crt`, `NAME.node.key` | a node (subject alternative names: its name and addresses; serverAuth) |
//! | `ca.old.crt` | during a CA rollover ([`rollover_ca`]), the CA before: still trusted ([`trust_bundle`]), no longer issuing |
//!
//! Keys are ECDSA P-256 (what every TLS 1.3 stack takes), PKCS#8 PEM, mode
//! 0600, written atomically and never printed. Nothing is replaced without
//! `force` (or `--renew`, which replaces a holder's certificate and key
//! and nothing else); a set of files is written whole or not at all
//! (staged, then moved in).
//!
//! Certificates have validity periods ([`Validity`]): the CA
//! [`CA_DAYS`], clients and nodes [`HOLDER_DAYS`] by default
//! (`--days`), from the time they are made. The node checks a client's
//! against its clock, floored at its build's SOURCE_DATE_EPOCH
//! (`nodeapi::tls::Policy`); both ends warn within
//! `nodeapi::tls::RENEW_WITHIN` of the end.

use anyhow::{Context, Result, bail};
use nodeapi::Role;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use std::net::IpAddr;
use std::path::{Path, PathBuf};

pub const CA_CERT: &str = "ca.crt";
pub const CA_KEY: &str = "ca.key";
/// The CA before a rollover's new one, trusted until [`end_rollover`].
pub const CA_OLD_CERT: &str = "ca.old.crt";
/// How far back a certificate's validity starts before the time it is
/// made (`Validity::from`): the clocks of the issuing machine, the nodes and
/// the clients are never quite the same.
pub const CLOCK_SKEW: u64 = 300;
/// A new CA's validity: ten years.
pub const CA_DAYS: u64 = 3650;
/// A client's or node's validity by default: one year.
pub const HOLDER_DAYS: u64 = 365;

/// When a certificate starts (seconds since 1970) and for how many days it
/// is valid.
#[derive(Debug, Clone, Copy)]
pub struct Validity {
    pub from: u64,
    pub days: u64,
}

impl Validity {
    /// `days` from now.
    pub fn days_from_now(days: u64) -> Validity {
        Validity {
            from: nodeapi::tls::now(),
            days,
        }
    }

    fn apply(&self, p: &mut CertificateParams) -> Result<()> {
        let at = |secs: u64| {
            i64::try_from(secs)
                .ok()
                .and_then(|s| time::OffsetDateTime::from_unix_timestamp(s).ok())
                .context("a certificate time past year 9999")
        };
        // Backdated a little: a node or client whose clock is a few
        // seconds or minutes behind the issuing machine's would otherwise
        // find a new certificate "not yet valid".
        p.not_before = at(self.from.saturating_sub(CLOCK_SKEW))?;
        p.not_after = at(self.from.saturating_add(self.days.saturating_mul(86400)))?;
        Ok(())
    }
}

/// Who a new certificate is for.
#[derive(Debug, Clone)]
pub enum Holder {
    /// A client of the API, with its role.
    Client { name: String, role: Role },
    /// A node, reached by its name and `addresses`.
    Node {
        name: String,
        addresses: Vec<IpAddr>,
    },
}

impl Holder {
    fn name(&self) -> &str {
        match self {
            Holder::Client { name, .. } | Holder::Node { name, .. } => name,
        }
    }

    /// The certificate and key file names.
    pub fn files(&self) -> (String, String) {
        match self {
            Holder::Client { name, .. } => (format!("{name}.crt"), format!("{name}.key")),
            Holder::Node { name, .. } => (format!("{name}.node.crt"), format!("{name}.node.key")),
        }
    }
}

/// What was made, for the report (no key material).
#[derive(Debug, Clone, serde::Serialize)]
pub struct Made {
    pub dir: PathBuf,
    /// Files written, certificates first.
    pub files: Vec<String>,
    pub ca_created: bool,
}

/// A name fit for a file and a certificate: letters, digits, `-`, `_`, `.`,
/// not starting with `.`, at most 63 bytes.
fn check_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        && name != "ca";
    if !ok {
        bail!(
            "{name:?} is not a credential name: use 1 to 63 letters, digits, '-', '_' or '.', \
             not starting with '.', and not \"ca\""
        );
    }
    Ok(())
}

/// Makes the CA in `dir` when it has none (`ca_created` in the report),
/// then, for `holder`, a certificate signed by it and its key. Refuses to
/// replace an existing certificate or key unless `force` (the CA is never
/// replaced: a new CA is a new directory).
pub fn make(dir: &Path, holder: Option<&Holder>, force: bool) -> Result<Made> {
    make_with(dir, holder, force, Validity::days_from_now(HOLDER_DAYS))
}

/// [`make`], the holder's certificate valid for `validity` (a new CA for
/// [`CA_DAYS`] from the same start).
pub fn make_with(
    dir: &Path,
    holder: Option<&Holder>,
    force: bool,
    validity: Validity,
) -> Result<Made> {
    if let Some(h) = holder {
        check_name(h.name())?;
    }
    if !dir.exists() {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .with_context(|| format!("creating {}", dir.display()))?;
    }
    let (ca_pem, ca_key, ca_created) = match (
        dir.join(CA_CERT).symlink_metadata(),
        dir.join(CA_KEY).symlink_metadata(),
    ) {
        (Ok(_), Ok(_)) => {
            let pem = read_small(&dir.join(CA_CERT), "CA certificate")?;
            let key = read_small(&dir.join(CA_KEY), "CA key")?;
            crate::secret::refuse_readable_by_others(&dir.join(CA_KEY))?;
            (pem, key, false)
        }
        (Err(_), Err(_)) => {
            let (pem, key) = new_ca(Validity {
                days: CA_DAYS,
                ..validity
            })?;
            (pem, key, true)
        }
        _ => bail!(
            "{} has one of {CA_CERT} and {CA_KEY} without the other: restore the missing one, \
             or use a new directory for a new CA",
            dir.display()
        ),
    };
    let mut files: Vec<(String, String, u32)> = Vec::new();
    if ca_created {
        files.push((CA_CERT.into(), ca_pem.clone(), 0o644));
        files.push((CA_KEY.into(), ca_key.clone(), 0o600));
    }
    if let Some(h) = holder {
        let (crt, key) = h.files();
        for f in [&crt, &key] {
            if dir.join(f).symlink_metadata().is_ok() && !force {
                bail!(
                    "{} already exists: refusing to replace credentials (pass --force)",
                    dir.join(f).display()
                );
            }
        }
        let (cert_pem, key_pem) = issue(&ca_pem, &ca_key, h, validity)?;
        files.push((crt, cert_pem, 0o644));
        files.push((key, key_pem, 0o600));
    }
    let staging = crate::io::Staging::create(dir, "node-credentials")?;
    for (name, text, mode) in &files {
        crate::io::write_atomic(staging.join(name), text.as_bytes(), *mode)?;
    }
    let names: Vec<&str> = files.iter().map(|(n, ..)| n.as_str()).collect();
    staging.commit(&names)?;
    Ok(Made {
        dir: dir.to_path_buf(),
        files: names.iter().map(|n| n.to_string()).collect(),
        ca_created,
    })
}

/// The CA certificates the credentials of `dir` trust: the CA's, and
/// during a rollover the one before it (PEM, the issuing CA first). What
/// clients trust a node's certificate by, and what a node is given to
/// trust its clients by.
pub fn trust_bundle(dir: &Path) -> Result<String> {
    let mut pem = read_small(&dir.join(CA_CERT), "CA certificate")?;
    if dir.join(CA_OLD_CERT).symlink_metadata().is_ok() {
        let old = read_small(&dir.join(CA_OLD_CERT), "previous CA certificate")?;
        if !pem.ends_with('\n') {
            pem.push('\n');
        }
        pem.push_str(&old);
    }
    Ok(pem)
}

/// Starts a CA rollover in `dir`: its CA becomes `ca.old.crt` (its key is
/// removed: it issues nothing more) and a new CA is made, valid for
/// [`CA_DAYS`] from `from`. Both are trusted until [`end_rollover`]; in
/// between, nodes get the two ([`trust_bundle`]) and new certificates
/// (`imager node set-credentials`), and clients are renewed. Refused
/// while a rollover is under way. The files change together or not at
/// all.
pub fn rollover_ca(dir: &Path, from: u64) -> Result<Made> {
    if dir.join(CA_OLD_CERT).symlink_metadata().is_ok() {
        bail!(
            "{} has a CA rollover under way ({CA_OLD_CERT}): end it first (`imager node \
             credentials {} --end-rollover`, once every node and client has the new CA's \
             certificates)",
            dir.display(),
            dir.display()
        );
    }
    let old = read_small(&dir.join(CA_CERT), "CA certificate")
        .with_context(|| format!("{} has no CA to roll over", dir.display()))?;
    crate::secret::refuse_readable_by_others(&dir.join(CA_KEY))?;
    let (pem, key) = new_ca(Validity {
        from,
        days: CA_DAYS,
    })?;
    let files = [
        (CA_OLD_CERT, old, 0o644),
        (CA_CERT, pem, 0o644),
        (CA_KEY, key, 0o600),
    ];
    let staging = crate::io::Staging::create(dir, "node-credentials")?;
    for (name, text, mode) in &files {
        crate::io::write_atomic(staging.join(name), text.as_bytes(), *mode)?;
    }
    let names: Vec<&str> = files.iter().map(|(n, ..)| *n).collect();
    staging.commit(&names)?;
    Ok(Made {
        dir: dir.to_path_buf(),
        files: names.iter().map(|n| n.to_string()).collect(),
        ca_created: true,
    })
}

/// Ends a CA rollover in `dir`: the previous CA is trusted no more (give
/// the nodes the new [`trust_bundle`] afterwards).
pub fn end_rollover(dir: &Path) -> Result<()> {
    let old = dir.join(CA_OLD_CERT);
    std::fs::remove_file(&old).with_context(|| {
        format!(
            "{} has no CA rollover under way ({} is missing)",
            dir.display(),
            old.display()
        )
    })?;
    crate::io::sync_dir(dir)
}

fn new_key() -> Result<KeyPair> {
    KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).context("generating a P-256 key")
}

/// A new self-signed CA: its certificate and key, PEM.
fn new_ca(validity: Validity) -> Result<(String, String)> {
    let key = new_key()?;
    let mut p = CertificateParams::default();
    validity.apply(&mut p)?;
    p.distinguished_name = DistinguishedName::new();
    p.distinguished_name
        .push(DnType::CommonName, "imager cluster CA");
    p.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    p.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let cert = p.self_signed(&key).context("signing the CA certificate")?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// A certificate for `holder` signed by the CA, and its new key (PEM).
fn issue(
    ca_pem: &str,
    ca_key: &str,
    holder: &Holder,
    validity: Validity,
) -> Result<(String, String)> {
    // (The key's own parse errors would quote nothing, but say it plainly.)
    let ca_key = KeyPair::from_pem(ca_key)
        .map_err(|_| anyhow::anyhow!("{CA_KEY} is not a PEM private key"))?;
    // A rollover cut between its renames could leave a certificate with
    // the other CA's key: never issue certificates no one can verify.
    let ca_spki = nodeapi::tls::certs(ca_pem.as_bytes(), "CA certificate")
        .ok()
        .and_then(|c| nodeapi::tls::public_key_der(&c[0]));
    if ca_spki.as_deref() != Some(rcgen::PublicKeyData::subject_public_key_info(&ca_key).as_slice())
    {
        bail!(
            "{CA_KEY} does not go with {CA_CERT} (a CA rollover cut short?): if {CA_OLD_CERT} \
             exists, move it back to {CA_CERT} and run --rollover-ca again; else restore the \
             pair from a backup"
        );
    }
    let issuer = Issuer::from_ca_cert_pem(ca_pem, ca_key)
        .map_err(|e| anyhow::anyhow!("{CA_CERT} is not a CA certificate: {e}"))?;
    let key = new_key()?;
    let mut p = CertificateParams::default();
    validity.apply(&mut p)?;
    p.distinguished_name = DistinguishedName::new();
    p.distinguished_name
        .push(DnType::CommonName, holder.name().to_string());
    p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    p.use_authority_key_identifier_extension = true;
    match holder {
        Holder::Client { role, .. } => {
            p.distinguished_name
                .push(DnType::OrganizationName, role.organization());
            p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        }
        Holder::Node { name, addresses } => {
            p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
            p.subject_alt_names.push(SanType::DnsName(
                name.as_str()
                    .try_into()
                    .map_err(|_| anyhow::anyhow!("{name:?} is not a DNS name"))?,
            ));
            p.subject_alt_names
                .extend(addresses.iter().map(|a| SanType::IpAddress(*a)));
        }
    }
    let cert = p
        .signed_by(&key, &issuer)
        .context("signing the certificate with the CA")?;
    Ok((cert.pem(), key.serialize_pem()))
}

pub(crate) fn read_small(path: &Path, what: &str) -> Result<String> {
    let bytes = crate::input::read_head(path, what, nodeapi::tls::MAX_PEM as u64 + 1)?;
    if bytes.len() > nodeapi::tls::MAX_PEM {
        bail!("{} is too large for a {what}", path.display());
    }
    String::from_utf8(bytes).with_context(|| format!("{} is not PEM text", path.display()))
}

#[cfg(test)]
mod tests;
