//! A node's own settings: its hostname, its network and its DNS servers,
//! kept in META ([`crate::meta::Tag::NodeSettings`]) so that they are the
//! node's, not the image's, and survive upgrades and rollbacks (META is
//! never replaced by either). `imager install`, `imager node provision`
//! and the live installer write them; the runtime reads them at every
//! boot, before the image's default (`machined.net=` on its command line).
//!
//! The record is text, one `key=value` per line, each key at most once,
//! in this order when written:
//!
//! ```text
//! hostname=node-1
//! net=eth0:10.0.2.20/24:10.0.2.2
//! dns=10.0.2.3,1.1.1.1
//! hosts=registry.example=10.0.2.100,cache.example=10.0.2.101
//! revoked=3f1c…(64 hex digits),…
//! ```
//!
//! - `hostname`: RFC 1123 labels (letters, digits and `-`, 1 to 63 each,
//!   not starting or ending with `-`) joined by `.`, at most
//!   [`MAX_HOSTNAME`] bytes (Linux's `HOST_NAME_MAX`). Absent: DHCP's
//!   hostname, if the lease gives one.
//! - `net`: [`crate::net`]'s `IFACE:dhcp` or `IFACE:ADDRESS/PREFIX[:GATEWAY]`.
//!   Absent: the image's default.
//! - `dns`: 1 to [`MAX_DNS`] IPv4 host addresses, comma-separated, none of
//!   them the node's own static address. They replace DHCP's servers.
//! - `hosts`: static host entries, `NAME=IPV4` comma-separated, at most
//!   [`MAX_HOSTS`], each name a hostname as above and given once: how the
//!   node resolves a registry's name on a network without DNS (they are
//!   looked up before any DNS server; `registry::dns`).
//! - `revoked`: node API client certificates refused whatever their chain,
//!   by the SHA-256 of their DER (64 hex digits, as `openssl x509
//!   -fingerprint -sha256` prints them, the colons left out), at most
//!   [`MAX_REVOKED`], comma-separated (`nodeapi::tls::Policy`).
//!
//! The whole record is at most [`MAX_LEN`] bytes, refused before it is
//! split. Everything is checked by [`Settings::parse`], which `imager`
//! runs before it writes anything and the runtime runs on what it reads:
//! a record that fails is named on the console and ignored (the image's
//! default applies).

use crate::net::{self, NetConfig};
use std::net::Ipv4Addr;

/// The longest hostname (Linux's `HOST_NAME_MAX`).
pub const MAX_HOSTNAME: usize = 64;
/// The most DNS servers (the resolver reads three).
pub const MAX_DNS: usize = 3;
/// The most static host entries.
pub const MAX_HOSTS: usize = 8;
/// The most revoked certificates.
pub const MAX_REVOKED: usize = 32;
/// The longest record.
pub const MAX_LEN: usize = 4096;

/// A node's settings; every part optional.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Settings {
    pub hostname: Option<String>,
    pub net: Option<NetConfig>,
    pub dns: Vec<Ipv4Addr>,
    /// Static host entries (names lowercase), in the order given.
    pub hosts: Vec<(String, Ipv4Addr)>,
    /// Revoked client certificates' SHA-256 fingerprints, in the order
    /// given.
    pub revoked: Vec<[u8; 32]>,
}

/// Parses `revoked`'s value: fingerprints, 64 hex digits each (colons
/// between the bytes allowed), comma-separated, each once.
pub fn parse_revoked(v: &str) -> Result<Vec<[u8; 32]>, String> {
    let mut out: Vec<[u8; 32]> = Vec::new();
    for item in v.split(',') {
        let hex: String = item.trim().chars().filter(|c| *c != ':').collect();
        let mut fp = [0u8; 32];
        let ok = hex.len() == 64
            && hex.is_ascii()
            && (0..32).all(|i| match u8::from_str_radix(&hex[2 * i..2 * i + 2], 16) {
                Ok(b) => {
                    fp[i] = b;
                    true
                }
                Err(_) => false,
            });
        if !ok {
            return Err(format!(
                "the revoked certificate {} is not a SHA-256 fingerprint (64 hex digits: \
                 openssl x509 -in CERT -noout -fingerprint -sha256)",
                crate::text::excerpt(item)
            ));
        }
        if out.contains(&fp) {
            return Err(format!("the revoked certificate {hex} is given twice"));
        }
        out.push(fp);
    }
    if out.len() > MAX_REVOKED {
        return Err(format!(
            "{} revoked certificates are given; at most {MAX_REVOKED} (roll the CA over to retire \
             more)",
            out.len()
        ));
    }
    Ok(out)
}

/// The longest domain name (RFC 1035's 255 bytes on the wire).
pub const MAX_DOMAIN_NAME: usize = 253;

/// Checks a hostname (see the module's documentation): a domain name
/// ([`check_domain_name`]) of at most [`MAX_HOSTNAME`] bytes. The message
/// quotes it escaped.
pub fn check_hostname(h: &str) -> Result<(), String> {
    if h.len() > MAX_HOSTNAME {
        return Err(format!(
            "the hostname {} is {} bytes long, more than {MAX_HOSTNAME}",
            crate::text::excerpt(h),
            h.len()
        ));
    }
    check_domain_name(h)
}

/// Checks a domain name (a registry's, a host entry's): RFC 1123 labels
/// (letters, digits and `-`, 1 to 63 each, not starting or ending with
/// `-`) joined by `.`, at most [`MAX_DOMAIN_NAME`] bytes.
pub fn check_domain_name(h: &str) -> Result<(), String> {
    let bad = |why: &str| Err(format!("the hostname {} {why}", crate::text::excerpt(h)));
    if h.is_empty() {
        return bad("is empty");
    }
    if h.len() > MAX_DOMAIN_NAME {
        return bad(&format!(
            "is {} bytes long, more than {MAX_DOMAIN_NAME}",
            h.len()
        ));
    }
    for label in h.split('.') {
        if label.is_empty() || label.len() > 63 {
            return bad("has an empty label or one longer than 63 characters");
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        {
            return bad("has a character other than letters, digits, '-' and '.'");
        }
        if label.starts_with('-') || label.ends_with('-') {
            return bad("has a label that starts or ends with '-'");
        }
    }
    Ok(())
}

/// Parses a comma-separated list of DNS servers.
pub fn parse_dns(v: &str) -> Result<Vec<Ipv4Addr>, String> {
    let mut out = Vec::new();
    for part in v.split(',') {
        let a: Ipv4Addr = part.parse().map_err(|_| {
            format!(
                "the DNS server {} is not an IPv4 address (four numbers 0-255: 10.0.2.3)",
                crate::text::excerpt(part)
            )
        })?;
        net::check_host(a, 32, "DNS server")?;
        if out.contains(&a) {
            return Err(format!("the DNS server {a} is given twice"));
        }
        out.push(a);
    }
    Ok(out)
}

/// Parses static host entries, `NAME=IPV4` comma-separated (names
/// lowercased, each given once, at most [`MAX_HOSTS`]).
pub fn parse_hosts(v: &str) -> Result<Vec<(String, Ipv4Addr)>, String> {
    let mut out: Vec<(String, Ipv4Addr)> = Vec::new();
    for part in v.split(',') {
        let Some((name, ip)) = part.split_once('=') else {
            return Err(format!(
                "the host entry {} is not NAME=IPV4 (registry.example=10.0.2.100)",
                crate::text::excerpt(part)
            ));
        };
        check_domain_name(name)?;
        let name = name.to_ascii_lowercase();
        let a: Ipv4Addr = ip.parse().map_err(|_| {
            format!(
                "the address {} of host entry {name} is not an IPv4 address",
                crate::text::excerpt(ip)
            )
        })?;
        if a.is_unspecified() || a.is_broadcast() || a.is_multicast() {
            return Err(format!(
                "the address {a} of host entry {name} is not a host's"
            ));
        }
        if out.iter().any(|(n, _)| *n == name) {
            return Err(format!("the host entry {name} is given twice"));
        }
        out.push((name, a));
    }
    if out.len() > MAX_HOSTS {
        return Err(format!(
            "{} host entries are given; at most {MAX_HOSTS}",
            out.len()
        ));
    }
    Ok(out)
}

impl Settings {
    /// The settings with `hosts` as their static host entries (checked as
    /// [`parse_hosts`] checks them).
    pub fn with_hosts(mut self, hosts: Vec<(String, Ipv4Addr)>) -> Result<Settings, String> {
        let text: Vec<String> = hosts.iter().map(|(n, a)| format!("{n}={a}")).collect();
        self.hosts = if hosts.is_empty() {
            Vec::new()
        } else {
            parse_hosts(&text.join(","))?
        };
        Ok(self)
    }

    /// Checks the combination: no DNS server is the node's own static
    /// address.
    pub fn new(
        hostname: Option<String>,
        net: Option<NetConfig>,
        dns: Vec<Ipv4Addr>,
    ) -> Result<Settings, String> {
        if let Some(h) = &hostname {
            check_hostname(h)?;
        }
        if dns.len() > MAX_DNS {
            return Err(format!(
                "{} DNS servers are given; the resolver reads at most {MAX_DNS}",
                dns.len()
            ));
        }
        if let Some(s) = net.as_ref().and_then(NetConfig::fixed)
            && dns.contains(&s.address)
        {
            return Err(format!(
                "the DNS server {} is the node's own address",
                s.address
            ));
        }
        Ok(Settings {
            hostname,
            net,
            dns,
            hosts: Vec::new(),
            revoked: Vec::new(),
        })
    }

    /// The settings from the values of their three keys, each parsed as
    /// the record's are (`net` named `net_key` in messages: `--net`,
    /// `machined.install.net`), then checked as a whole; `Ok(None)` when no
    /// value is given. One constructor for the command line's flags, the
    /// live installer's kernel arguments and the ISO profile's keys.
    pub fn from_values(
        hostname: Option<&str>,
        net_key: &str,
        net: Option<&str>,
        dns: Option<&str>,
    ) -> Result<Option<Settings>, String> {
        if hostname.is_none() && net.is_none() && dns.is_none() {
            return Ok(None);
        }
        let net = net.map(|v| net::parse_as(net_key, v)).transpose()?;
        let dns = dns.map(parse_dns).transpose()?.unwrap_or_default();
        Settings::new(hostname.map(str::to_string), net, dns).map(Some)
    }

    /// Whether nothing is set.
    pub fn is_empty(&self) -> bool {
        self.hostname.is_none()
            && self.net.is_none()
            && self.dns.is_empty()
            && self.hosts.is_empty()
            && self.revoked.is_empty()
    }

    /// The record (see the module's documentation).
    pub fn render(&self) -> String {
        let mut out = String::new();
        if let Some(h) = &self.hostname {
            out.push_str(&format!("hostname={h}\n"));
        }
        if let Some(n) = &self.net {
            out.push_str(&format!("net={}\n", n.value()));
        }
        if !self.dns.is_empty() {
            let list: Vec<String> = self.dns.iter().map(Ipv4Addr::to_string).collect();
            out.push_str(&format!("dns={}\n", list.join(",")));
        }
        if !self.hosts.is_empty() {
            let list: Vec<String> = self.hosts.iter().map(|(n, a)| format!("{n}={a}")).collect();
            out.push_str(&format!("hosts={}\n", list.join(",")));
        }
        if !self.revoked.is_empty() {
            let list: Vec<String> = self
                .revoked
                .iter()
                .map(|fp| fp.iter().map(|b| format!("{b:02x}")).collect())
                .collect();
            out.push_str(&format!("revoked={}\n", list.join(",")));
        }
        out
    }

    /// The node's settings in `meta` ([`crate::meta::Tag::NodeSettings`]):
    /// none (the default) when it has no record, why when its record does
    /// not parse. The one reading of the record: the network's set-up says
    /// a refused record on the console at boot; the API and the pull then
    /// take the default.
    pub fn from_meta(meta: &crate::meta::Meta) -> Result<Settings, String> {
        meta.get(crate::meta::Tag::NodeSettings)
            .map_or_else(|| Ok(Settings::default()), Settings::parse)
    }

    /// Parses a record.
    pub fn parse(text: &str) -> Result<Settings, String> {
        if text.len() > MAX_LEN {
            return Err(format!(
                "the node's settings are {} bytes long, more than {MAX_LEN}",
                text.len()
            ));
        }
        let (mut hostname, mut net, mut dns, mut hosts) = (None, None, None, None);
        let mut revoked = None;
        for line in text.lines() {
            if line.is_empty() {
                continue;
            }
            let Some((k, v)) = line.split_once('=') else {
                return Err(format!(
                    "the line {} of the node's settings is not key=value",
                    crate::text::excerpt(line)
                ));
            };
            let twice = || format!("the node's settings give {k}= twice");
            match k {
                "hostname" => {
                    check_hostname(v)?;
                    if hostname.replace(v.to_string()).is_some() {
                        return Err(twice());
                    }
                }
                "net" => {
                    if net.replace(net::parse_as("net", v)?).is_some() {
                        return Err(twice());
                    }
                }
                "dns" => {
                    if dns.replace(parse_dns(v)?).is_some() {
                        return Err(twice());
                    }
                }
                "hosts" => {
                    if hosts.replace(parse_hosts(v)?).is_some() {
                        return Err(twice());
                    }
                }
                "revoked" => {
                    if revoked.replace(parse_revoked(v)?).is_some() {
                        return Err(twice());
                    }
                }
                _ => {
                    return Err(format!(
                        "the node's settings have an unknown key {} (hostname, net, dns, \
                         hosts and revoked are known)",
                        crate::text::excerpt(k)
                    ));
                }
            }
        }
        let mut s = Settings::new(hostname, net, dns.unwrap_or_default())?
            .with_hosts(hosts.unwrap_or_default())?;
        s.revoked = revoked.unwrap_or_default();
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn revoked_certificates_are_read_written_and_bounded() {
        let fp = "AB:".repeat(31) + "CD";
        let s = Settings::parse(&format!("revoked={fp},{}\n", "01".repeat(32))).unwrap();
        assert_eq!(s.revoked.len(), 2);
        assert_eq!(s.revoked[0][0], 0xab);
        assert_eq!(s.revoked[0][31], 0xcd);
        assert_eq!(Settings::parse(&s.render()).unwrap(), s);
        assert!(
            s.render()
                .contains(&format!("revoked={}cd,", "ab".repeat(31)))
        );
        for bad in [
            "revoked=abc",
            "revoked=\u{1b}[2J",
            &format!("revoked={0},{0}", "01".repeat(32)),
        ] {
            let e = Settings::parse(bad).unwrap_err();
            assert!(!e.contains('\u{1b}'), "{e:?}");
        }
        let many: Vec<String> = (0..=MAX_REVOKED).map(|i| format!("{i:064x}")).collect();
        let e = Settings::parse(&format!("revoked={}", many.join(","))).unwrap_err();
        assert!(e.contains("at most"), "{e}");
    }

    #[test]
    fn a_record_round_trips() {
        let text = "hostname=node-1\nnet=eth0:10.0.2.20/24:10.0.2.2\ndns=10.0.2.3,1.1.1.1\n\
                    hosts=registry.example=10.0.2.100,cache=10.0.2.101\n";
        let s = Settings::parse(text).unwrap();
        assert_eq!(s.hostname.as_deref(), Some("node-1"));
        assert_eq!(
            s.net.as_ref().unwrap().value(),
            "eth0:10.0.2.20/24:10.0.2.2"
        );
        assert_eq!(
            s.dns,
            [Ipv4Addr::new(10, 0, 2, 3), Ipv4Addr::new(1, 1, 1, 1)]
        );
        assert_eq!(
            s.hosts,
            [
                ("registry.example".to_string(), Ipv4Addr::new(10, 0, 2, 100)),
                ("cache".to_string(), Ipv4Addr::new(10, 0, 2, 101))
            ]
        );
        assert_eq!(s.render(), text);
        assert!(Settings::parse("").unwrap().is_empty());
        assert_eq!(
            Settings::parse("net=ens3:dhcp\n").unwrap().render(),
            "net=ens3:dhcp\n"
        );
    }

    #[test]
    fn hostnames_follow_rfc_1123() {
        for good in ["a", "node-1", "n1.example.com", "0abc", &"a".repeat(63)] {
            assert_eq!(check_hostname(good), Ok(()), "{good}");
        }
        for (bad, why) in [
            ("", "empty"),
            ("-a", "starts or ends"),
            ("a-", "starts or ends"),
            ("a..b", "empty label"),
            ("a_b", "character"),
            ("a b", "character"),
            ("ünï", "character"),
            ("a\u{1b}[2J", "character"),
            (&"a".repeat(64), "longer than 63"),
            (
                &format!("{}.{}", "a".repeat(40), "b".repeat(40)),
                "bytes long",
            ),
        ] {
            let e = check_hostname(bad).unwrap_err();
            assert!(e.contains(why), "{bad:?}: {e}");
            assert!(!e.contains('\u{1b}'), "{e}");
        }
    }

    #[test]
    fn bad_records_are_refused_with_the_reason() {
        for (bad, why) in [
            ("hostname=a\nhostname=b\n", "twice"),
            ("mtu=1500\n", "unknown key"),
            ("hostname\n", "not key=value"),
            ("net=eth0:10.0.2.15/24:10.0.3.1\n", "not in the subnet"),
            ("net=eth0:10.0.2.15/24\ndns=10.0.2.15\n", "own address"),
            ("dns=10.0.2.3,10.0.2.3\n", "twice"),
            ("dns=1.1.1.1,1.0.0.1,8.8.8.8,8.8.4.4\n", "at most 3"),
            ("dns=127.0.0.1\n", "loopback"),
            ("dns=10.0.2\n", "not an IPv4 address"),
            ("dns=\n", "not an IPv4 address"),
            ("hostname=x_y\n", "character"),
            ("hosts=registry\n", "not NAME=IPV4"),
            ("hosts=a=10.0.2.1,A=10.0.2.2\n", "twice"),
            ("hosts=a=10.0.2\n", "not an IPv4 address"),
            ("hosts=a=224.0.0.1\n", "not a host's"),
            ("hosts=a b=10.0.2.1\n", "character"),
            (
                "hosts=a=1.1.1.1,b=1.1.1.1,c=1.1.1.1,d=1.1.1.1,e=1.1.1.1,f=1.1.1.1,g=1.1.1.1,\
                 h=1.1.1.1,i=1.1.1.1\n",
                "at most 8",
            ),
        ] {
            let e = Settings::parse(bad).unwrap_err();
            assert!(e.contains(why), "{bad:?}: {e}");
        }
        let long = format!("hostname={}\n", "a".repeat(MAX_LEN));
        assert!(Settings::parse(&long).unwrap_err().contains("bytes long"));
    }
}
