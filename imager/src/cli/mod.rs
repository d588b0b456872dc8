//! The command line's argument structs (clap) of the `imager` binary, turned
//! into the library's plain options.

pub mod kernel;
pub mod node;
pub mod registry;
pub mod root;
pub mod secureboot;
pub mod sign;

/// A node's own settings (`imager install`, `imager node provision`):
/// checked by [`contract::settings`] before anything is written.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct NodeSettingsArgs {
    /// The node's hostname (RFC 1123: letters, digits, '-' and '.', at most
    /// 64 bytes). Without it the node takes DHCP's, if any.
    #[arg(long, value_name = "NAME")]
    pub hostname: Option<String>,
    /// The node's network, instead of the image's default: IFACE:dhcp or
    /// IFACE:ADDRESS/PREFIX[:GATEWAY] (eth0:192.168.1.20/24:192.168.1.1).
    #[arg(long, value_name = "IFACE:dhcp|IFACE:ADDRESS/PREFIX[:GATEWAY]")]
    pub net: Option<String>,
    /// The node's DNS servers, comma-separated, at most 3 (they replace
    /// DHCP's).
    #[arg(long, value_name = "IP[,IP...]")]
    pub dns: Option<String>,
    /// A static host entry, NAME=IPV4 (repeatable, at most 8): how the node
    /// resolves a name without DNS (a registry's, before any DNS server).
    #[arg(long = "host", value_name = "NAME=IPV4")]
    pub hosts: Vec<String>,
    /// A node API client certificate the node refuses (repeatable, at most
    /// 32): its PEM file, or its SHA-256 fingerprint (`openssl x509
    /// -fingerprint -sha256`).
    #[arg(long = "revoke", value_name = "CERT|FINGERPRINT")]
    pub revoke: Vec<String>,
}

impl NodeSettingsArgs {
    /// The settings, checked; `None` when no flag is given.
    pub fn settings(&self) -> anyhow::Result<Option<contract::settings::Settings>> {
        let settings = contract::settings::Settings::from_values(
            self.hostname.as_deref(),
            "--net",
            self.net.as_deref(),
            self.dns.as_deref(),
        )
        .and_then(|s| {
            if self.hosts.is_empty() {
                return Ok(s);
            }
            let hosts = contract::settings::parse_hosts(&self.hosts.join(","))?;
            s.unwrap_or_default().with_hosts(hosts).map(Some)
        });
        let mut settings = settings.map_err(|e| anyhow::anyhow!("{e}; nothing was written"))?;
        if !self.revoke.is_empty() {
            let mut prints = Vec::new();
            for r in &self.revoke {
                prints.push(revoked_fingerprint(r)?);
            }
            let revoked = contract::settings::parse_revoked(&prints.join(","))
                .map_err(|e| anyhow::anyhow!("{e}; nothing was written"))?;
            settings.get_or_insert_with(Default::default).revoked = revoked;
        }
        Ok(settings)
    }
}

/// A `--revoke` value as a fingerprint: a certificate file's (its first
/// certificate), or the value itself.
fn revoked_fingerprint(v: &str) -> anyhow::Result<String> {
    let path = std::path::Path::new(v);
    if !path.is_file() {
        return Ok(v.to_string());
    }
    let pem = imager::input::read_head(path, "certificate", nodeapi::tls::MAX_PEM as u64)?;
    let certs = nodeapi::tls::certs(&pem, "certificate to revoke")?;
    Ok(hex::encode(nodeapi::tls::fingerprint(&certs[0])))
}
