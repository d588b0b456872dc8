//! The command line's argument structs (clap) of the `imager` binary, turned
//! into the library's plain options.

pub mod kernel;
pub mod node;
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
}

impl NodeSettingsArgs {
    /// The settings, checked; `None` when no flag is given.
    pub fn settings(&self) -> anyhow::Result<Option<contract::settings::Settings>> {
        if self.hostname.is_none() && self.net.is_none() && self.dns.is_none() {
            return Ok(None);
        }
        let refuse = |e: String| anyhow::anyhow!("{e}; nothing was written");
        let net = self
            .net
            .as_deref()
            .map(|v| contract::net::parse_as("--net", v))
            .transpose()
            .map_err(refuse)?;
        let dns = self
            .dns
            .as_deref()
            .map(contract::settings::parse_dns)
            .transpose()
            .map_err(refuse)?
            .unwrap_or_default();
        contract::settings::Settings::new(self.hostname.clone(), net, dns)
            .map(Some)
            .map_err(refuse)
    }
}
