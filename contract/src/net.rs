//! The runtime's IPv4 configuration of its one interface,
//! `IFACE:dhcp` or `IFACE:ADDRESS/PREFIX[:GATEWAY]`: the value of
//! `machined.net=` ([`crate::cmdline::NET`], the image's default) and of a
//! node's own settings ([`crate::settings`], in META). One parser for the
//! runtime, the build (the profile's `network` section) and `imager`'s
//! per-node flags, and one renderer, so that what is written is exactly
//! what the runtime reads.
//!
//! The checks (`docs/design.md`, "Network"):
//! - IFACE is a Linux interface name: 1 to [`MAX_IFNAME`] bytes (`IFNAMSIZ`
//!   less its NUL), not `.` or `..`, no `/`, `:` or whitespace (the kernel's
//!   `dev_valid_name`), and here also printable ASCII only;
//! - ADDRESS is a dotted-quad IPv4 address in Rust's strict form (four
//!   decimal numbers 0-255, no leading zeros, no shorthand), a unicast host
//!   address: not `0.0.0.0`, loopback (`127/8`), multicast (`224/4`),
//!   reserved (`240/4`) or broadcast, and with a prefix up to 30 neither the
//!   subnet's network nor its broadcast address;
//! - PREFIX is 1 to 32, in decimal without sign or leading zero (0 would put
//!   the whole Internet on the link);
//! - GATEWAY, if given, is inside the subnet (a static configuration has no
//!   route to a gateway off the link) and not ADDRESS itself, nor the
//!   subnet's network or broadcast address; so a /32 has no gateway.
//!
//! The whole value is at most [`MAX_VALUE_LEN`] bytes, refused before it is
//! split.

use crate::text::excerpt;
use std::fmt;
use std::net::Ipv4Addr;

/// The longest interface name: the kernel's `IFNAMSIZ` (16) less its NUL.
pub const MAX_IFNAME: usize = 15;
/// The longest value of `machined.net=`: a 15-byte name, `:`,
/// `255.255.255.255/32` (18), `:`, `255.255.255.255` (15).
pub const MAX_VALUE_LEN: usize = MAX_IFNAME + 1 + 18 + 1 + 15;
/// The loopback interface the runtime always brings up, and its address.
pub const LOOPBACK: &str = "lo";
pub const LOOPBACK_ADDRESS: Ipv4Addr = Ipv4Addr::LOCALHOST;
pub const LOOPBACK_PREFIX: u8 = 8;

/// The hardening sysctls the runtime writes (and reads back) whenever the
/// kernel has IPv4, before the interface comes up: paths under `/proc/sys`,
/// and values. KSPP recommends `net.core.bpf_jit_harden` (see
/// [`SYSCTLS_IF_PRESENT`]) and SYN cookies; the rest are the usual host
/// settings (CIS, DISA STIG): no ICMP redirects or source routes, strict
/// reverse-path filtering, martians logged, no answer to broadcast pings or
/// bogus ICMP errors, RFC 1337's TIME-WAIT assassination fix.
pub const SYSCTLS: [(&str, &str); 4] = [
    ("net/ipv4/tcp_syncookies", "1"),
    ("net/ipv4/tcp_rfc1337", "1"),
    ("net/ipv4/icmp_echo_ignore_broadcasts", "1"),
    ("net/ipv4/icmp_ignore_bogus_error_responses", "1"),
];

/// Per-interface settings (`net/ipv4/conf/<NAME>/<setting>`), written for
/// `all`, `default` and the configured interface: an interface that existed
/// before `default` was written keeps its own value, and the kernel takes
/// `accept_redirects`, `secure_redirects` and `send_redirects` as on when
/// either `all` or the interface's is on.
pub const CONF_SYSCTLS: [(&str, &str); 6] = [
    ("rp_filter", "1"),
    ("accept_redirects", "0"),
    ("secure_redirects", "0"),
    ("send_redirects", "0"),
    ("accept_source_route", "0"),
    ("log_martians", "1"),
];

/// Sysctls written only where the kernel has them: `net.core.bpf_jit_harden`
/// exists only with `CONFIG_BPF_JIT`, which `network.config` leaves off.
pub const SYSCTLS_IF_PRESENT: [(&str, &str); 1] = [("net/core/bpf_jit_harden", "2")];

/// The sysctls to write (path under `/proc/sys`, value), in order: the
/// global ones, then [`CONF_SYSCTLS`] for `all`, `default` and `interface`
/// (if any). [`SYSCTLS_IF_PRESENT`] is not included: whether it applies
/// depends on the running kernel.
pub fn sysctls(interface: Option<&str>) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = SYSCTLS
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    for conf in ["all", "default"].into_iter().chain(interface) {
        for (k, v) in CONF_SYSCTLS {
            out.push((format!("net/ipv4/conf/{conf}/{k}"), v.to_string()));
        }
    }
    out
}

/// The name `sysctl(8)` shows for a path under `/proc/sys`:
/// `net.ipv4.conf.eth0.rp_filter` (a `.` in a component becomes `/`, as
/// `sysctl` writes it).
pub fn sysctl_name(path: &str) -> String {
    path.split('/')
        .map(|c| c.replace('.', "/"))
        .collect::<Vec<_>>()
        .join(".")
}

/// The IPv4 configuration of one interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetConfig {
    pub interface: String,
    pub ipv4: Ipv4,
}

/// How the interface gets its address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ipv4 {
    /// From a DHCP server (`IFACE:dhcp`): the address, prefix, router, DNS
    /// servers, hostname and MTU its lease gives ([`crate::dhcp`]).
    Dhcp,
    /// A static address.
    Static(StaticIpv4),
}

/// A static IPv4 address of an interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StaticIpv4 {
    pub address: Ipv4Addr,
    /// 1 to 32.
    pub prefix: u8,
    /// Inside the subnet; `None`: no default route.
    pub gateway: Option<Ipv4Addr>,
}

/// The word of `IFACE:dhcp`.
pub const DHCP: &str = "dhcp";

impl NetConfig {
    /// `interface` by DHCP.
    pub fn dhcp(interface: &str) -> Result<Self, String> {
        parse_interface(interface)?;
        Ok(NetConfig {
            interface: interface.to_string(),
            ipv4: Ipv4::Dhcp,
        })
    }

    /// A static address: checks the combination (see the module's
    /// documentation); the parts are checked by [`parse_interface`],
    /// [`parse_address`] and [`parse_gateway`].
    pub fn new(
        interface: &str,
        address: Ipv4Addr,
        prefix: u8,
        gateway: Option<Ipv4Addr>,
    ) -> Result<Self, String> {
        parse_interface(interface)?;
        Ok(NetConfig {
            interface: interface.to_string(),
            ipv4: Ipv4::Static(StaticIpv4::new(address, prefix, gateway)?),
        })
    }

    /// The static address, if it is one.
    pub fn fixed(&self) -> Option<&StaticIpv4> {
        match &self.ipv4 {
            Ipv4::Static(s) => Some(s),
            Ipv4::Dhcp => None,
        }
    }

    /// The value of `machined.net=`: `eth0:10.0.2.15/24:10.0.2.2` or
    /// `eth0:dhcp`.
    pub fn value(&self) -> String {
        match &self.ipv4 {
            Ipv4::Dhcp => format!("{}:{DHCP}", self.interface),
            Ipv4::Static(s) => format!("{}:{}", self.interface, s.value()),
        }
    }

    /// The kernel argument: `machined.net=eth0:10.0.2.15/24:10.0.2.2`.
    pub fn arg(&self) -> String {
        format!("{}={}", crate::cmdline::NET, self.value())
    }
}

impl StaticIpv4 {
    /// Checks the combination (see the module's documentation).
    pub fn new(address: Ipv4Addr, prefix: u8, gateway: Option<Ipv4Addr>) -> Result<Self, String> {
        check_host(address, prefix, "address")?;
        if let Some(g) = gateway {
            if g == address {
                return Err(format!("the gateway {g} is the address itself"));
            }
            if !in_subnet(g, address, prefix) {
                return Err(format!(
                    "the gateway {g} is not in the subnet {}/{prefix} of the address: a static \
                     configuration reaches only a gateway on its own link",
                    network(address, prefix)
                ));
            }
            check_host(g, prefix, "gateway")?;
        }
        Ok(StaticIpv4 {
            address,
            prefix,
            gateway,
        })
    }

    /// The netmask of [`Self::prefix`] (`255.255.255.0` for 24).
    pub fn netmask(&self) -> Ipv4Addr {
        netmask(self.prefix)
    }

    /// Whether `a` is on this address's link (its subnet).
    pub fn on_link(&self, a: Ipv4Addr) -> bool {
        in_subnet(a, self.address, self.prefix)
    }

    /// `10.0.2.15/24:10.0.2.2`, or `10.0.2.15/24` without a gateway.
    fn value(&self) -> String {
        let mut v = format!("{}/{}", self.address, self.prefix);
        if let Some(g) = self.gateway {
            v.push_str(&format!(":{g}"));
        }
        v
    }
}

/// `10.0.2.15/24 gateway 10.0.2.2` (or `… no gateway`).
impl fmt::Display for StaticIpv4 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.address, self.prefix)?;
        match self.gateway {
            Some(g) => write!(f, " gateway {g}"),
            None => write!(f, " no gateway"),
        }
    }
}

/// `eth0 10.0.2.15/24 gateway 10.0.2.2` (or `… no gateway`, or `eth0 by
/// DHCP`): how the runtime names the configuration on the console.
impl fmt::Display for NetConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.ipv4 {
            Ipv4::Dhcp => write!(f, "{} by DHCP", self.interface),
            Ipv4::Static(s) => write!(f, "{} {s}", self.interface),
        }
    }
}

/// The netmask of a prefix length (0 to 32).
pub fn netmask(prefix: u8) -> Ipv4Addr {
    let bits = match prefix {
        0 => 0,
        p if p >= 32 => u32::MAX,
        p => u32::MAX << (32 - u32::from(p)),
    };
    Ipv4Addr::from(bits)
}

fn network(a: Ipv4Addr, prefix: u8) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(a) & u32::from(netmask(prefix)))
}

fn in_subnet(x: Ipv4Addr, a: Ipv4Addr, prefix: u8) -> bool {
    network(x, prefix) == network(a, prefix)
}

/// A unicast host address of the subnet: see the module's documentation.
pub fn check_host(a: Ipv4Addr, prefix: u8, what: &str) -> Result<(), String> {
    let o = a.octets();
    let why = if a.is_unspecified() {
        Some("unspecified")
    } else if a.is_loopback() {
        Some("a loopback address")
    } else if a.is_multicast() {
        Some("a multicast address")
    } else if a.is_broadcast() {
        Some("the broadcast address")
    } else if o[0] >= 240 {
        Some("a reserved address (240.0.0.0/4)")
    } else if prefix <= 30 && a == network(a, prefix) {
        Some("the subnet's network address")
    } else if prefix <= 30 && u32::from(a) | !u32::from(netmask(prefix)) == u32::from(a) {
        Some("the subnet's broadcast address")
    } else {
        None
    };
    match why {
        Some(w) => Err(format!(
            "the {what} {a} is {w}, not a host address (in /{prefix})"
        )),
        None => Ok(()),
    }
}

/// An interface name as Linux accepts it (`dev_valid_name`), printable
/// ASCII: see the module's documentation.
pub fn parse_interface(v: &str) -> Result<&str, String> {
    if v.is_empty() {
        return Err("the interface name is empty".into());
    }
    if v.len() > MAX_IFNAME {
        return Err(format!(
            "the interface name {} is {} bytes long: Linux's are at most {MAX_IFNAME}",
            excerpt(v),
            v.len()
        ));
    }
    if v == "." || v == ".." {
        return Err(format!("{v:?} is not an interface name"));
    }
    if !v
        .bytes()
        .all(|b| b.is_ascii_graphic() && b != b'/' && b != b':')
    {
        return Err(format!(
            "the interface name {} has a character Linux refuses or this parser does not \
             take ('/', ':', whitespace, control or non-ASCII characters)",
            excerpt(v)
        ));
    }
    Ok(v)
}

/// `ADDRESS/PREFIX`, e.g. `10.0.2.15/24`, each part strict (see the
/// module's documentation); the address is checked as a host address of
/// its subnet.
pub fn parse_address(v: &str) -> Result<(Ipv4Addr, u8), String> {
    let Some((a, p)) = v.split_once('/') else {
        return Err(format!(
            "{} is not ADDRESS/PREFIX (an IPv4 address and a prefix length, 10.0.2.15/24)",
            excerpt(v)
        ));
    };
    let address = parse_ipv4(a, "address")?;
    let prefix_ok = !p.is_empty()
        && p.len() <= 2
        && p.bytes().all(|b| b.is_ascii_digit())
        && !(p.len() > 1 && p.starts_with('0'));
    let prefix = match p.parse::<u8>() {
        Ok(n) if prefix_ok && (1..=32).contains(&n) => n,
        _ => {
            return Err(format!(
                "the prefix length {} is not a number from 1 to 32",
                excerpt(p)
            ));
        }
    };
    check_host(address, prefix, "address")?;
    Ok((address, prefix))
}

/// A gateway address (dotted quad); whether it fits the subnet is
/// [`NetConfig::new`]'s check.
pub fn parse_gateway(v: &str) -> Result<Ipv4Addr, String> {
    parse_ipv4(v, "gateway")
}

fn parse_ipv4(v: &str, what: &str) -> Result<Ipv4Addr, String> {
    // Rust's parser takes only four decimal numbers 0-255 without leading
    // zeros: no octal or hex, no shorthand (`10.1`), no spaces.
    v.parse::<Ipv4Addr>().map_err(|_| {
        format!(
            "the {what} {} is not an IPv4 address (four numbers 0-255: 10.0.2.15)",
            excerpt(v)
        )
    })
}

/// Parses the value of `machined.net=`.
pub fn parse(v: &str) -> Result<NetConfig, String> {
    parse_as(crate::cmdline::NET, v)
}

/// Parses `IFACE:dhcp` or `IFACE:ADDRESS/PREFIX[:GATEWAY]`, given as `key`
/// (named in messages: `machined.net`, `--net`, `net`).
pub fn parse_as(key: &str, v: &str) -> Result<NetConfig, String> {
    if v.is_empty() {
        return Err(format!(
            "{key}= is empty: write {key}=IFACE:dhcp or {key}=IFACE:ADDRESS/PREFIX[:GATEWAY] \
             ({key}=eth0:10.0.2.15/24:10.0.2.2)"
        ));
    }
    if v.len() > MAX_VALUE_LEN {
        return Err(format!(
            "{key}={} is {} bytes long, more than {MAX_VALUE_LEN}",
            excerpt(v),
            v.len()
        ));
    }
    let bad = |why: String| format!("{key}={}: {why}", excerpt(v));
    let mut parts = v.split(':');
    let (Some(iface), Some(addr)) = (parts.next(), parts.next()) else {
        return Err(bad(
            "not IFACE:dhcp or IFACE:ADDRESS/PREFIX[:GATEWAY] (eth0:10.0.2.15/24:10.0.2.2)".into(),
        ));
    };
    if addr == DHCP {
        if parts.next().is_some() {
            return Err(bad(
                "IFACE:dhcp takes no gateway (the lease gives it)".into()
            ));
        }
        return NetConfig::dhcp(iface).map_err(bad);
    }
    let gateway = parts.next();
    if parts.next().is_some() {
        return Err(bad(
            "too many ':'-separated parts: IFACE:ADDRESS/PREFIX[:GATEWAY]".into(),
        ));
    }
    parse_interface(iface).map_err(bad)?;
    let (address, prefix) = parse_address(addr).map_err(bad)?;
    let gateway = gateway.map(parse_gateway).transpose().map_err(bad)?;
    NetConfig::new(iface, address, prefix, gateway).map_err(bad)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> Ipv4Addr {
        s.parse().unwrap()
    }

    #[test]
    fn parses_and_renders_the_same_value() {
        let c = parse("eth0:10.0.2.15/24:10.0.2.2").unwrap();
        assert_eq!(
            c,
            NetConfig {
                interface: "eth0".into(),
                ipv4: Ipv4::Static(StaticIpv4 {
                    address: ip("10.0.2.15"),
                    prefix: 24,
                    gateway: Some(ip("10.0.2.2")),
                }),
            }
        );
        assert_eq!(c.fixed().unwrap().netmask(), ip("255.255.255.0"));
        assert_eq!(c.value(), "eth0:10.0.2.15/24:10.0.2.2");
        assert_eq!(c.arg(), "machined.net=eth0:10.0.2.15/24:10.0.2.2");
        assert_eq!(c.to_string(), "eth0 10.0.2.15/24 gateway 10.0.2.2");
        let n = parse("enp0s3:192.168.1.10/16").unwrap();
        assert_eq!(n.fixed().unwrap().gateway, None);
        assert_eq!(n.to_string(), "enp0s3 192.168.1.10/16 no gateway");
        assert_eq!(parse(&n.value()), Ok(n));
        // The edges: /32 without gateway, /31 (RFC 3021) with the other
        // address, /1, a 15-byte name, the longest value.
        assert!(parse("eth0:10.0.0.1/32").is_ok());
        assert!(parse("eth0:10.0.0.0/31:10.0.0.1").is_ok());
        assert!(parse("eth0:10.0.0.1/1:10.0.0.2").is_ok());
        assert!(parse("abcdefghijklmno:10.0.0.1/8").is_ok());
        let longest = "abcdefghijklmno:172.255.255.254/16:172.255.255.253";
        assert!(longest.len() <= MAX_VALUE_LEN);
        assert!(parse(longest).is_ok(), "{:?}", parse(longest));
        // DHCP.
        let d = parse("ens3:dhcp").unwrap();
        assert_eq!(d, NetConfig::dhcp("ens3").unwrap());
        assert_eq!(d.fixed(), None);
        assert_eq!(d.arg(), "machined.net=ens3:dhcp");
        assert_eq!(d.to_string(), "ens3 by DHCP");
        assert_eq!(parse(&d.value()), Ok(d));
    }

    #[test]
    fn sysctl_list() {
        let all = sysctls(None);
        assert_eq!(all.len(), SYSCTLS.len() + 2 * CONF_SYSCTLS.len());
        assert_eq!(all[0], ("net/ipv4/tcp_syncookies".into(), "1".into()));
        let with = sysctls(Some("eth0"));
        assert_eq!(with.len(), SYSCTLS.len() + 3 * CONF_SYSCTLS.len());
        assert!(with.contains(&("net/ipv4/conf/eth0/accept_redirects".into(), "0".into())));
        assert!(with.contains(&("net/ipv4/conf/default/rp_filter".into(), "1".into())));
        assert_eq!(
            sysctl_name("net/ipv4/conf/all/rp_filter"),
            "net.ipv4.conf.all.rp_filter"
        );
        assert_eq!(
            sysctl_name("net/ipv4/conf/eth0.100/rp_filter"),
            "net.ipv4.conf.eth0/100.rp_filter"
        );
    }

    #[test]
    fn netmasks() {
        assert_eq!(netmask(0), ip("0.0.0.0"));
        assert_eq!(netmask(1), ip("128.0.0.0"));
        assert_eq!(netmask(8), ip("255.0.0.0"));
        assert_eq!(netmask(23), ip("255.255.254.0"));
        assert_eq!(netmask(32), ip("255.255.255.255"));
    }

    #[test]
    fn refusals() {
        for (bad, why) in [
            ("", "empty"),
            ("eth0", "not IFACE:dhcp or IFACE:ADDRESS"),
            ("eth0:dhcp:10.0.2.2", "takes no gateway"),
            ("eth0:DHCP", "not ADDRESS/PREFIX"),
            ("e/th0:dhcp", "character"),
            (":10.0.2.15/24", "empty"),
            ("eth0:10.0.2.15/24:10.0.2.2:x", "too many"),
            ("eth0:10.0.2.15", "not ADDRESS/PREFIX"),
            ("eth0:10.0.2.15/", "prefix length"),
            ("eth0:10.0.2.15/0", "prefix length"),
            ("eth0:10.0.2.15/33", "prefix length"),
            ("eth0:10.0.2.15/024", "prefix length"),
            ("eth0:10.0.2.15/+24", "prefix length"),
            ("eth0:10.0.2.15/2a", "prefix length"),
            ("eth0:10.0.2/24", "not an IPv4 address"),
            ("eth0:10.0.2.015/24", "not an IPv4 address"),
            ("eth0:0x0a.0.2.15/24", "not an IPv4 address"),
            ("eth0:10.0.2.256/24", "not an IPv4 address"),
            ("eth0: 10.0.2.15/24", "not an IPv4 address"),
            ("eth0:0.0.0.0/8", "unspecified"),
            ("eth0:127.0.0.2/8", "loopback"),
            ("eth0:224.0.0.1/4", "multicast"),
            ("eth0:250.0.0.1/8", "reserved"),
            ("eth0:255.255.255.255/32", "broadcast"),
            ("eth0:10.0.2.0/24", "network address"),
            ("eth0:10.0.2.255/24", "broadcast address"),
            ("eth0:10.0.2.15/24:10.0.3.2", "not in the subnet"),
            ("eth0:10.0.2.15/24:10.0.2.15", "address itself"),
            ("eth0:10.0.2.15/24:10.0.2.255", "broadcast address"),
            ("eth0:10.0.2.15/24:10.0.2.0", "network address"),
            ("eth0:10.0.2.15/24:10.0.2", "not an IPv4 address"),
            ("eth0:10.0.2.15/24:", "not an IPv4 address"),
            ("eth0:10.0.0.1/32:10.0.0.2", "not in the subnet"),
            ("abcdefghijklmnop:10.0.0.1/8", "at most 15"),
            (".:10.0.0.1/8", "not an interface name"),
            ("..:10.0.0.1/8", "not an interface name"),
            ("et/h0:10.0.0.1/8", "character"),
            ("et h0:10.0.0.1/8", "character"),
            ("eth\u{7}:10.0.0.1/8", "character"),
            ("ethé:10.0.0.1/8", "character"),
        ] {
            match parse(bad) {
                Ok(c) => panic!("{bad:?} was accepted as {c:?}"),
                Err(e) => assert!(e.contains(why), "{bad:?}: {e}"),
            }
        }
        let long = format!("eth0:10.0.2.15/24:{}", "1".repeat(MAX_VALUE_LEN));
        let e = parse(&long).unwrap_err();
        assert!(e.contains("bytes long"), "{e}");
        assert!(e.len() < 200, "{e}");
    }
}
