//! DHCP for IPv4 (RFC 2131, options from RFC 2132): the messages the
//! runtime's client sends ([`discover`], [`request`]), the parser of the
//! server's replies ([`parse_reply`]) and the lease they give ([`Lease`],
//! with its renewal schedule, [`Lease::phase`]). No sockets here: the
//! runtime's `rootfs/src/dhcp.rs` sends and receives; this module is what
//! can be tested and fuzzed without a network (`fuzz/fuzz_targets/dhcp.rs`).
//!
//! A reply is untrusted bytes from the network. [`parse_reply`] reads at
//! most [`MAX_MESSAGE`] bytes, walks options only inside them, takes a
//! reply only for this client's transaction and hardware address, and
//! keeps only values it checks: a contiguous subnet mask, routers and DNS
//! servers that are host addresses (at most [`MAX_SERVERS`] of each), a
//! hostname that [`crate::settings::check_hostname`] accepts, an MTU of
//! [`MIN_MTU`] to 65535. A value that fails its check is dropped (and named
//! in [`Reply::ignored`]), never used. Overloaded `sname`/`file` fields
//! (option 52) are not read: the options a client needs fit in the options
//! field.
//!
//! The client asks for broadcast replies (the `BROADCAST` flag): it has no
//! address and no packet socket (the kernel is built without them), so a
//! unicast reply to an address it does not yet have would never reach its
//! UDP socket.

use std::net::Ipv4Addr;
use std::time::Duration;

/// The server's and the client's UDP ports.
pub const SERVER_PORT: u16 = 67;
pub const CLIENT_PORT: u16 = 68;
/// The most bytes of a reply read: an Ethernet frame's payload. A longer
/// datagram is truncated by the socket and then refused (its options would
/// run past the end).
pub const MAX_MESSAGE: usize = 1500;
/// The fixed part of a message before the options (RFC 2131 §2), and the
/// magic cookie that starts the options.
const FIXED: usize = 236;
const COOKIE: [u8; 4] = [99, 130, 83, 99];
/// The most routers and DNS servers kept from a reply (the resolver reads
/// three, as glibc's MAXNS).
pub const MAX_SERVERS: usize = 3;
/// The smallest MTU taken from a lease: IPv4's minimum datagram that every
/// host must take (RFC 791); a smaller value is ignored.
pub const MIN_MTU: u16 = 576;
/// The shortest lease taken as given; a shorter one is renewed as if it were
/// this long, so a hostile server cannot make the node renew in a loop.
pub const MIN_LEASE: Duration = Duration::from_secs(60);

/// The message types (option 53).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Discover = 1,
    Offer = 2,
    Request = 3,
    Decline = 4,
    Ack = 5,
    Nak = 6,
    Release = 7,
}

impl Kind {
    fn from_u8(b: u8) -> Option<Kind> {
        Some(match b {
            1 => Kind::Discover,
            2 => Kind::Offer,
            3 => Kind::Request,
            4 => Kind::Decline,
            5 => Kind::Ack,
            6 => Kind::Nak,
            7 => Kind::Release,
            _ => return None,
        })
    }
}

mod opt {
    pub const PAD: u8 = 0;
    pub const SUBNET_MASK: u8 = 1;
    pub const ROUTER: u8 = 3;
    pub const DNS: u8 = 6;
    pub const HOSTNAME: u8 = 12;
    pub const MTU: u8 = 26;
    pub const REQUESTED_IP: u8 = 50;
    pub const LEASE_TIME: u8 = 51;
    pub const MESSAGE_TYPE: u8 = 53;
    pub const SERVER_ID: u8 = 54;
    pub const PARAMETERS: u8 = 55;
    pub const MAX_SIZE: u8 = 57;
    pub const RENEWAL: u8 = 58;
    pub const REBINDING: u8 = 59;
    pub const CLIENT_ID: u8 = 61;
    pub const END: u8 = 255;
}

/// What the client asks the server for (option 55).
const PARAMETERS: [u8; 7] = [
    opt::SUBNET_MASK,
    opt::ROUTER,
    opt::DNS,
    opt::HOSTNAME,
    opt::MTU,
    opt::RENEWAL,
    opt::REBINDING,
];

/// One transaction's identity: its random `xid` and the interface's
/// hardware (MAC) address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Client {
    pub xid: u32,
    pub mac: [u8; 6],
}

impl Client {
    /// The fixed part and the cookie: a BOOTREQUEST over Ethernet,
    /// broadcast replies asked for, `ciaddr` as given.
    fn header(&self, ciaddr: Ipv4Addr, broadcast: bool) -> Vec<u8> {
        let mut m = vec![0u8; FIXED];
        m[0] = 1; // BOOTREQUEST
        m[1] = 1; // Ethernet
        m[2] = 6;
        m[4..8].copy_from_slice(&self.xid.to_be_bytes());
        if broadcast {
            m[10] = 0x80;
        }
        m[12..16].copy_from_slice(&ciaddr.octets());
        m[28..34].copy_from_slice(&self.mac);
        m.extend_from_slice(&COOKIE);
        m
    }

    /// The options every message of this client carries: its type, its
    /// client identifier (type 1, the MAC), the largest reply it reads and
    /// the parameters it asks for.
    fn common(&self, m: &mut Vec<u8>, kind: Kind) {
        m.extend_from_slice(&[opt::MESSAGE_TYPE, 1, kind as u8]);
        m.extend_from_slice(&[opt::CLIENT_ID, 7, 1]);
        m.extend_from_slice(&self.mac);
        m.extend_from_slice(&[opt::MAX_SIZE, 2]);
        m.extend_from_slice(&(MAX_MESSAGE as u16).to_be_bytes());
        m.extend_from_slice(&[opt::PARAMETERS, PARAMETERS.len() as u8]);
        m.extend_from_slice(&PARAMETERS);
    }
}

fn finish(mut m: Vec<u8>) -> Vec<u8> {
    m.push(opt::END);
    // BOOTP's minimum message (300 bytes): some relays drop shorter ones.
    if m.len() < 300 {
        m.resize(300, opt::PAD);
    }
    m
}

/// DHCPDISCOVER, broadcast.
pub fn discover(c: &Client) -> Vec<u8> {
    let mut m = c.header(Ipv4Addr::UNSPECIFIED, true);
    c.common(&mut m, Kind::Discover);
    finish(m)
}

/// How a DHCPREQUEST is sent (RFC 2131 §4.3.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Requesting {
    /// After an offer: the offered address and the offering server, from
    /// no address, broadcast.
    Selecting { offered: Ipv4Addr, server: Ipv4Addr },
    /// Renewing (unicast to the server) or rebinding (broadcast) the
    /// address the client holds (`ciaddr`).
    Extending { address: Ipv4Addr },
}

/// DHCPREQUEST.
pub fn request(c: &Client, how: Requesting) -> Vec<u8> {
    match how {
        Requesting::Selecting { offered, server } => {
            let mut m = c.header(Ipv4Addr::UNSPECIFIED, true);
            c.common(&mut m, Kind::Request);
            m.extend_from_slice(&[opt::REQUESTED_IP, 4]);
            m.extend_from_slice(&offered.octets());
            m.extend_from_slice(&[opt::SERVER_ID, 4]);
            m.extend_from_slice(&server.octets());
            finish(m)
        }
        Requesting::Extending { address } => {
            let mut m = c.header(address, false);
            c.common(&mut m, Kind::Request);
            finish(m)
        }
    }
}

/// A server's reply to this client, its values checked.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Reply {
    pub kind: Option<Kind>,
    /// `yiaddr`: the address offered or acknowledged.
    pub address: Option<Ipv4Addr>,
    pub server: Option<Ipv4Addr>,
    pub prefix: Option<u8>,
    pub routers: Vec<Ipv4Addr>,
    pub dns: Vec<Ipv4Addr>,
    pub hostname: Option<String>,
    pub mtu: Option<u16>,
    pub lease: Option<Duration>,
    pub renewal: Option<Duration>,
    pub rebinding: Option<Duration>,
    /// Options whose values failed their checks and were dropped, one
    /// short sentence each (escaped: printable ASCII).
    pub ignored: Vec<String>,
}

/// Why a datagram is not a reply to this client. [`Refusal::Other`] is
/// expected on a shared link (another client's transaction) and is
/// dropped silently; the others are said on the console.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Another transaction's or another client's reply, or a request.
    Other,
    /// Not a well-formed DHCP reply.
    Malformed(String),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Other => write!(f, "not a reply to this client"),
            Refusal::Malformed(why) => write!(f, "a malformed DHCP reply: {why}"),
        }
    }
}

fn ip4(b: &[u8]) -> Ipv4Addr {
    Ipv4Addr::new(b[0], b[1], b[2], b[3])
}

/// A host address a client may use as a router, DNS server or its own
/// address: not unspecified, loopback, multicast, reserved or broadcast.
fn host(a: Ipv4Addr) -> bool {
    crate::net::check_host(a, 32, "address").is_ok()
}

/// Parses a datagram as a reply to `client`.
pub fn parse_reply(bytes: &[u8], client: &Client) -> Result<Reply, Refusal> {
    let bad = |why: &str| Refusal::Malformed(why.to_string());
    // Whose it is first: anyone on the link may send datagrams to port 68,
    // and only a reply to this transaction is worth a word on the console.
    if bytes.len() < 34
        || bytes[0] != 2
        || bytes[4..8] != client.xid.to_be_bytes()
        || bytes[1] != 1
        || bytes[2] != 6
        || bytes[28..34] != client.mac
    {
        return Err(Refusal::Other);
    }
    if bytes.len() > MAX_MESSAGE {
        return Err(bad("longer than an Ethernet frame's payload"));
    }
    if bytes.len() < FIXED + COOKIE.len() {
        return Err(bad("shorter than a DHCP message's fixed part"));
    }
    if bytes[FIXED..FIXED + 4] != COOKIE {
        return Err(bad("no DHCP magic cookie (a BOOTP reply?)"));
    }
    let mut r = Reply::default();
    let yiaddr = ip4(&bytes[16..20]);
    if !yiaddr.is_unspecified() {
        if host(yiaddr) {
            r.address = Some(yiaddr);
        } else {
            r.ignored
                .push(format!("yiaddr {yiaddr}: not a host address"));
        }
    }
    let mut seen_end = false;
    let mut at = FIXED + 4;
    while at < bytes.len() {
        let code = bytes[at];
        if code == opt::PAD {
            at += 1;
            continue;
        }
        if code == opt::END {
            seen_end = true;
            break;
        }
        let Some(&len) = bytes.get(at + 1) else {
            return Err(bad("an option's length is past the end"));
        };
        let start = at + 2;
        let end = start + usize::from(len);
        let Some(v) = bytes.get(start..end) else {
            return Err(bad("an option's value runs past the end"));
        };
        take(&mut r, code, v);
        at = end;
    }
    if !seen_end {
        return Err(bad("the options have no end"));
    }
    Ok(r)
}

/// Takes option `code` with value `v` into `r`, checked. A repeated option
/// replaces the earlier one (RFC 3396's concatenation is not needed for
/// the options read here, which are short).
fn take(r: &mut Reply, code: u8, v: &[u8]) {
    let seconds =
        |v: &[u8]| Duration::from_secs(u64::from(u32::from_be_bytes([v[0], v[1], v[2], v[3]])));
    match (code, v.len()) {
        (opt::MESSAGE_TYPE, 1) => r.kind = Kind::from_u8(v[0]),
        (opt::SERVER_ID, 4) => r.server = Some(ip4(v)).filter(|a| host(*a)),
        (opt::SUBNET_MASK, 4) => {
            let m = u32::from_be_bytes([v[0], v[1], v[2], v[3]]);
            let prefix = m.leading_ones();
            if m.checked_shl(prefix).unwrap_or(0) == 0 && (1..=32).contains(&prefix) {
                r.prefix = Some(prefix as u8);
            } else {
                r.ignored
                    .push(format!("subnet mask {}: not contiguous", ip4(v)));
            }
        }
        (opt::ROUTER | opt::DNS, n) if n > 0 && n % 4 == 0 => {
            let list: Vec<Ipv4Addr> = v
                .chunks_exact(4)
                .map(ip4)
                .filter(|a| host(*a))
                .take(MAX_SERVERS)
                .collect();
            if code == opt::ROUTER {
                r.routers = list;
            } else {
                r.dns = list;
            }
        }
        (opt::HOSTNAME, _) => {
            let text = String::from_utf8_lossy(v);
            match crate::settings::check_hostname(&text) {
                Ok(()) => r.hostname = Some(text.into_owned()),
                Err(e) => r.ignored.push(format!("hostname: {e}")),
            }
        }
        (opt::MTU, 2) => {
            let mtu = u16::from_be_bytes([v[0], v[1]]);
            if mtu >= MIN_MTU {
                r.mtu = Some(mtu);
            } else {
                r.ignored.push(format!("MTU {mtu}: below {MIN_MTU}"));
            }
        }
        (opt::LEASE_TIME, 4) => r.lease = Some(seconds(v)),
        (opt::RENEWAL, 4) => r.renewal = Some(seconds(v)),
        (opt::REBINDING, 4) => r.rebinding = Some(seconds(v)),
        _ => {}
    }
}

/// An address leased by DHCPACK.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub address: Ipv4Addr,
    pub prefix: u8,
    pub server: Ipv4Addr,
    /// The first router on the address's link; none: no default route.
    pub router: Option<Ipv4Addr>,
    pub dns: Vec<Ipv4Addr>,
    pub hostname: Option<String>,
    pub mtu: Option<u16>,
    /// The lease's length (at least [`MIN_LEASE`]; `u32::MAX` seconds, RFC
    /// 2131's "infinity", is kept as it is), and when to renew (T1) and
    /// rebind (T2), counted from when it was acknowledged.
    pub lease: Duration,
    pub renewal: Duration,
    pub rebinding: Duration,
}

/// Where a lease is at a time since it was acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Held; renew at T1.
    Bound,
    /// Past T1: ask the server that gave it, unicast.
    Renewing,
    /// Past T2: ask any server, broadcast.
    Rebinding,
    /// Past its end: the address must go.
    Expired,
}

impl Lease {
    /// The lease a DHCPACK gives, with the offer's server when the ACK
    /// does not name one. `Err` says what the ACK lacks.
    pub fn from_ack(ack: &Reply, server: Ipv4Addr) -> Result<Lease, String> {
        let address = ack.address.ok_or("the ACK gives no address")?;
        let prefix = match ack.prefix {
            Some(p) => p,
            // RFC 2131 leaves the mask optional; the class of the address
            // is the historical default.
            None => match address.octets()[0] {
                0..=127 => 8,
                128..=191 => 16,
                _ => 24,
            },
        };
        crate::net::check_host(address, prefix, "leased address")?;
        let router = ack.routers.iter().copied().find(|g| {
            *g != address && crate::net::StaticIpv4::new(address, prefix, Some(*g)).is_ok()
        });
        let lease = ack
            .lease
            .ok_or("the ACK gives no lease time")?
            .max(MIN_LEASE);
        // T1 and T2 default to 1/2 and 7/8 of the lease (RFC 2131 §4.4.5);
        // given ones are kept in order: T1 <= T2 <= lease.
        let rebinding = ack
            .rebinding
            .filter(|t| *t <= lease)
            .unwrap_or(lease / 8 * 7);
        let renewal = ack
            .renewal
            .filter(|t| *t <= rebinding)
            .unwrap_or((lease / 2).min(rebinding));
        Ok(Lease {
            address,
            prefix,
            server: ack.server.unwrap_or(server),
            router,
            dns: ack.dns.clone(),
            hostname: ack.hostname.clone(),
            mtu: ack.mtu,
            lease,
            renewal,
            rebinding,
        })
    }

    /// Where the lease is `elapsed` after it was acknowledged.
    pub fn phase(&self, elapsed: Duration) -> Phase {
        if elapsed >= self.lease {
            Phase::Expired
        } else if elapsed >= self.rebinding {
            Phase::Rebinding
        } else if elapsed >= self.renewal {
            Phase::Renewing
        } else {
            Phase::Bound
        }
    }

    /// The address as a static configuration (address, prefix, router).
    pub fn config(&self) -> crate::net::StaticIpv4 {
        crate::net::StaticIpv4 {
            address: self.address,
            prefix: self.prefix,
            gateway: self.router,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const C: Client = Client {
        xid: 0x1234_5678,
        mac: [0x52, 0x54, 0, 0x12, 0x34, 0x56],
    };

    /// A reply as a server writes it, built here byte by byte from RFC
    /// 2131's layout (not by this module's own writer).
    fn reply(options: &[(u8, &[u8])]) -> Vec<u8> {
        let mut m = vec![0u8; 236];
        m[0] = 2;
        m[1] = 1;
        m[2] = 6;
        m[4..8].copy_from_slice(&[0x12, 0x34, 0x56, 0x78]);
        m[16..20].copy_from_slice(&[10, 0, 2, 15]);
        m[28..34].copy_from_slice(&[0x52, 0x54, 0, 0x12, 0x34, 0x56]);
        m.extend_from_slice(&[99, 130, 83, 99]);
        for (code, v) in options {
            m.push(*code);
            m.push(v.len() as u8);
            m.extend_from_slice(v);
        }
        m.push(255);
        m
    }

    fn ack() -> Vec<u8> {
        reply(&[
            (53, &[5]),
            (54, &[10, 0, 2, 2]),
            (1, &[255, 255, 255, 0]),
            (3, &[10, 0, 2, 2]),
            (6, &[10, 0, 2, 3, 1, 1, 1, 1]),
            (12, b"node-7"),
            (26, &[5, 220]),
            (51, &[0, 1, 81, 128]),
        ])
    }

    #[test]
    fn the_messages_have_rfc_2131s_layout() {
        let d = discover(&C);
        assert_eq!(d.len(), 300);
        assert_eq!(&d[..4], &[1, 1, 6, 0]);
        assert_eq!(&d[4..8], &[0x12, 0x34, 0x56, 0x78]);
        assert_eq!(&d[10..12], &[0x80, 0], "broadcast flag");
        assert_eq!(&d[28..34], &C.mac);
        assert_eq!(&d[236..240], &[99, 130, 83, 99]);
        assert_eq!(&d[240..243], &[53, 1, 1]);
        let r = request(
            &C,
            Requesting::Selecting {
                offered: Ipv4Addr::new(10, 0, 2, 15),
                server: Ipv4Addr::new(10, 0, 2, 2),
            },
        );
        assert_eq!(&r[240..243], &[53, 1, 3]);
        let opts = &r[240..];
        assert!(opts.windows(6).any(|w| w == [50, 4, 10, 0, 2, 15]));
        assert!(opts.windows(6).any(|w| w == [54, 4, 10, 0, 2, 2]));
        let renew = request(
            &C,
            Requesting::Extending {
                address: Ipv4Addr::new(10, 0, 2, 15),
            },
        );
        assert_eq!(
            &renew[10..16],
            &[0, 0, 10, 0, 2, 15],
            "no broadcast flag, ciaddr"
        );
        assert!(!renew[240..].windows(2).any(|w| w == [50, 4]));
    }

    #[test]
    fn an_ack_gives_a_lease_with_its_schedule() {
        let r = parse_reply(&ack(), &C).unwrap();
        assert_eq!(r.kind, Some(Kind::Ack));
        assert!(r.ignored.is_empty(), "{:?}", r.ignored);
        let l = Lease::from_ack(&r, Ipv4Addr::new(10, 0, 2, 9)).unwrap();
        assert_eq!(l.address, Ipv4Addr::new(10, 0, 2, 15));
        assert_eq!(l.prefix, 24);
        assert_eq!(l.server, Ipv4Addr::new(10, 0, 2, 2));
        assert_eq!(l.router, Some(Ipv4Addr::new(10, 0, 2, 2)));
        assert_eq!(
            l.dns,
            [Ipv4Addr::new(10, 0, 2, 3), Ipv4Addr::new(1, 1, 1, 1)]
        );
        assert_eq!(l.hostname.as_deref(), Some("node-7"));
        assert_eq!(l.mtu, Some(1500));
        assert_eq!(l.lease, Duration::from_secs(86400));
        assert_eq!(l.renewal, Duration::from_secs(43200));
        assert_eq!(l.rebinding, Duration::from_secs(75600));
        assert_eq!(l.phase(Duration::ZERO), Phase::Bound);
        assert_eq!(l.phase(Duration::from_secs(43200)), Phase::Renewing);
        assert_eq!(l.phase(Duration::from_secs(75600)), Phase::Rebinding);
        assert_eq!(l.phase(Duration::from_secs(86400)), Phase::Expired);
    }

    #[test]
    fn a_short_lease_and_disordered_timers_are_bounded() {
        let r = parse_reply(
            &reply(&[
                (53, &[5]),
                (51, &[0, 0, 0, 1]),
                (58, &[0, 0, 1, 0]),
                (59, &[0, 0, 0, 5]),
            ]),
            &C,
        )
        .unwrap();
        let l = Lease::from_ack(&r, Ipv4Addr::new(10, 0, 2, 2)).unwrap();
        assert_eq!(l.lease, MIN_LEASE);
        assert_eq!(l.rebinding, Duration::from_secs(5));
        assert_eq!(l.renewal, Duration::from_secs(5), "T1 past T2 is T2");
        assert_eq!(l.prefix, 8, "no mask: the address's class");
        assert_eq!(l.router, None);
    }

    #[test]
    fn bad_values_are_dropped_and_named() {
        let r = parse_reply(
            &reply(&[
                (53, &[5]),
                (1, &[255, 0, 255, 0]),
                (3, &[127, 0, 0, 1, 10, 0, 2, 2]),
                (6, &[224, 0, 0, 1]),
                (12, b"bad host\x1b[2J"),
                (26, &[0, 68]),
                (54, &[255, 255, 255, 255]),
            ]),
            &C,
        )
        .unwrap();
        assert_eq!(r.prefix, None);
        assert_eq!(r.routers, [Ipv4Addr::new(10, 0, 2, 2)]);
        assert!(r.dns.is_empty());
        assert_eq!(r.hostname, None);
        assert_eq!(r.mtu, None);
        assert_eq!(r.server, None);
        assert_eq!(r.ignored.len(), 3, "{:?}", r.ignored);
        assert!(
            r.ignored
                .iter()
                .all(|i| i.bytes().all(|b| (0x20..0x7f).contains(&b))),
            "{:?}",
            r.ignored
        );
        // A router off the address's link is not the default route.
        let r = parse_reply(
            &reply(&[
                (53, &[5]),
                (1, &[255, 255, 255, 0]),
                (3, &[10, 0, 3, 1]),
                (51, &[0, 0, 14, 16]),
            ]),
            &C,
        )
        .unwrap();
        assert_eq!(
            Lease::from_ack(&r, Ipv4Addr::new(10, 0, 2, 2))
                .unwrap()
                .router,
            None
        );
        // No lease time, no address: no lease.
        let r = parse_reply(&reply(&[(53, &[5])]), &C).unwrap();
        assert!(
            Lease::from_ack(&r, Ipv4Addr::new(10, 0, 2, 2))
                .unwrap_err()
                .contains("lease time")
        );
    }

    #[test]
    fn other_transactions_and_malformed_replies_are_refused() {
        let good = ack();
        let mut other = good.clone();
        other[7] ^= 1;
        assert_eq!(parse_reply(&other, &C), Err(Refusal::Other));
        let mut mac = good.clone();
        mac[33] ^= 1;
        assert_eq!(parse_reply(&mac, &C), Err(Refusal::Other));
        let mut req = good.clone();
        req[0] = 1;
        assert_eq!(parse_reply(&req, &C), Err(Refusal::Other));
        // Too short to say whose: not this client's.
        assert_eq!(parse_reply(&good[..33], &C), Err(Refusal::Other));
        let mut long = good.clone();
        long.resize(MAX_MESSAGE + 1, 0);
        for (bytes, why) in [
            (long, "longer"),
            (good[..200].to_vec(), "fixed part"),
            (
                {
                    let mut b = good.clone();
                    b[236] = 0;
                    b
                },
                "cookie",
            ),
            (good[..good.len() - 1].to_vec(), "no end"),
            (
                {
                    let mut b = good[..240].to_vec();
                    b.extend_from_slice(&[12, 9, b'a']);
                    b
                },
                "runs past",
            ),
            (
                {
                    let mut b = good[..240].to_vec();
                    b.push(12);
                    b
                },
                "past the end",
            ),
        ] {
            match parse_reply(&bytes, &C) {
                Err(Refusal::Malformed(e)) => assert!(e.contains(why), "{why}: {e}"),
                other => panic!("{why}: {other:?}"),
            }
        }
    }
}
