//! The runtime's DHCP client (`docs/design.md`, "Network"): the messages
//! and the lease are [`contract::dhcp`]'s; this module sends and receives
//! them and applies the lease to the interface.
//!
//! It uses one UDP socket on port 68, bound to the interface
//! (`SO_BINDTODEVICE`) and allowed to broadcast: the kernel has no packet
//! sockets. Until the interface has an address it holds a default route
//! straight onto the link, so that strict reverse-path filtering
//! (`rp_filter=1`) takes the server's replies, and it asks for broadcast
//! replies; both go once the lease is applied.
//!
//! [`start`] waits up to [`FIRST_LEASE`] for the first lease, so that a
//! node on a working network has its address before it says ready; then
//! a thread keeps it: renews at T1 (unicast to the server), rebinds at T2
//! (broadcast), and when the lease ends removes the address and asks
//! again. Without a lease in [`FIRST_LEASE`] the node goes on, and the
//! thread keeps asking, each round at most [`RETRY_MAX`] apart. Every wait
//! is bounded; every datagram read is at most
//! [`contract::dhcp::MAX_MESSAGE`] bytes.

use crate::console::say;
use crate::net::Interface;
use anyhow::{Context, Result};
use contract::dhcp::{self, Client, Kind, Lease, Phase, Refusal, Reply, Requesting};
use contract::settings::Settings;
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// How long boot waits for the first lease.
const FIRST_LEASE: Duration = Duration::from_secs(30);
/// The first wait for an answer, doubled at each retransmission up to
/// [`RETRY_MAX`] (RFC 2131 §4.1: 4 s doubling to 64 s; shorter here, as
/// QEMU's and most LAN servers answer in milliseconds).
const RETRY_FIRST: Duration = Duration::from_secs(2);
const RETRY_MAX: Duration = Duration::from_secs(32);
/// The shortest wait between two renewal requests.
const RENEW_MIN: Duration = Duration::from_secs(10);
/// The most malformed datagrams named on the console in one wait.
const MAX_WARNINGS: u32 = 3;

/// Starts the client on `interface`: the first lease within
/// [`FIRST_LEASE`], then a thread that keeps it. Says on the console what
/// happened; never fails the boot.
pub fn start(interface: &str, settings: &Settings) {
    let mut c = match Conn::open(interface) {
        Ok(c) => c,
        Err(e) => {
            say(format!(
                "net: warning: DHCP on {interface}: {e:#}; no network"
            ));
            return;
        }
    };
    let own = Own {
        hostname: settings.hostname.is_some(),
        dns: settings.dns.clone(),
    };
    let lease = match c.acquire(Some(FIRST_LEASE)) {
        Some(l) => c.apply(&l, &own, true),
        None => {
            say(format!(
                "net: warning: no DHCP lease on {interface} in {} s; still asking (the node \
                 runs on without an address)",
                FIRST_LEASE.as_secs()
            ));
            None
        }
    };
    let spawned = std::thread::Builder::new()
        .name("dhcp".into())
        .spawn(move || c.keep(lease, &own));
    if let Err(e) = spawned {
        say(format!(
            "net: warning: DHCP: cannot start its thread: {e}; the lease will not be renewed"
        ));
    }
}

/// What the node's own settings fix, which a lease does not change.
struct Own {
    hostname: bool,
    dns: Vec<Ipv4Addr>,
}

/// The client's socket and interface.
struct Conn {
    iface: Interface,
    sock: UdpSocket,
    mac: [u8; 6],
}

/// A lease and when it was acknowledged.
type Held = (Lease, Instant);

impl Conn {
    fn open(interface: &str) -> Result<Conn> {
        let iface = Interface::open(interface)?;
        iface.up()?;
        let mac = iface.hwaddr()?;
        let sock = UdpSocket::bind(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, dhcp::CLIENT_PORT))
            .context("bind UDP port 68")?;
        sock.set_broadcast(true).context("SO_BROADCAST")?;
        let dev = crate::sys::cstr(interface)?;
        // SAFETY: the option value is the interface name's bytes with its
        // NUL, and its length.
        let ret = unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_BINDTODEVICE,
                dev.as_ptr().cast(),
                dev.as_bytes_with_nul().len() as libc::socklen_t,
            )
        };
        crate::sys::check(ret, || format!("bind the DHCP socket to {interface}"))?;
        // Onto the link until there is an address (see the module's
        // documentation).
        iface.route(None, true)?;
        Ok(Conn { iface, sock, mac })
    }

    /// DISCOVER, OFFER, REQUEST, ACK: a lease, or `None` when `within`
    /// (if any) passed without one.
    fn acquire(&mut self, within: Option<Duration>) -> Option<Lease> {
        let start = Instant::now();
        let mut wait = RETRY_FIRST;
        loop {
            let left = within.map(|w| w.saturating_sub(start.elapsed()));
            if left == Some(Duration::ZERO) {
                return None;
            }
            let round = left.map_or(wait, |l| l.min(wait));
            let began = Instant::now();
            if let Some(l) = self.round(round) {
                return Some(l);
            }
            // A round that failed at once (a send refused, a NAK) still
            // takes its time: no loop of requests and console lines.
            std::thread::sleep(round.saturating_sub(began.elapsed()));
            wait = (wait * 2).min(RETRY_MAX);
        }
    }

    /// One DISCOVER and what follows, within `limit`.
    fn round(&mut self, limit: Duration) -> Option<Lease> {
        let client = Client {
            xid: xid(),
            mac: self.mac,
        };
        let broadcast = SocketAddrV4::new(Ipv4Addr::BROADCAST, dhcp::SERVER_PORT);
        let deadline = Instant::now() + limit;
        self.send(&dhcp::discover(&client), broadcast)?;
        let Got::Reply(offer) = self.receive(&client, deadline, Kind::Offer, None) else {
            return None;
        };
        let (Some(offered), Some(server)) = (offer.address, offer.server) else {
            say("net: warning: DHCP: an offer without an address or a server identifier; ignored");
            return None;
        };
        let req = dhcp::request(&client, Requesting::Selecting { offered, server });
        self.send(&req, broadcast)?;
        let Got::Reply(ack) = self.receive(&client, deadline, Kind::Ack, Some(server)) else {
            return None;
        };
        match Lease::from_ack(&ack, server) {
            Ok(l) => Some(l),
            Err(e) => {
                say(format!(
                    "net: warning: DHCP: the ACK of {server} is refused: {e}"
                ));
                None
            }
        }
    }

    fn send(&self, msg: &[u8], to: SocketAddrV4) -> Option<()> {
        match self.sock.send_to(msg, to) {
            Ok(_) => Some(()),
            Err(e) => {
                say(format!("net: warning: DHCP: cannot send to {to}: {e}"));
                None
            }
        }
    }

    /// The first reply of `kind` to `client` before `deadline`, or a NAK
    /// (from `server`, when given: the one asked). Malformed datagrams are
    /// named on the console, at most [`MAX_WARNINGS`] per wait.
    fn receive(
        &self,
        client: &Client,
        deadline: Instant,
        kind: Kind,
        server: Option<Ipv4Addr>,
    ) -> Got {
        // One byte more than a reply may have: a longer datagram is seen
        // as such (and refused), not cut to size.
        let mut buf = vec![0u8; dhcp::MAX_MESSAGE + 1];
        let mut warnings = 0;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || self.sock.set_read_timeout(Some(left)).is_err() {
                return Got::Nothing;
            }
            let n = match self.sock.recv(&mut buf) {
                Ok(n) => n,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock
                            | std::io::ErrorKind::TimedOut
                            | std::io::ErrorKind::Interrupted
                    ) =>
                {
                    continue;
                }
                Err(e) => {
                    say(format!("net: warning: DHCP: cannot receive: {e}"));
                    return Got::Nothing;
                }
            };
            match dhcp::parse_reply(&buf[..n], client) {
                Ok(r) if r.kind == Some(kind) => {
                    for i in &r.ignored {
                        say(format!("net: warning: DHCP: ignored {i}"));
                    }
                    return Got::Reply(r);
                }
                Ok(r) if r.kind == Some(Kind::Nak) && (server.is_none() || r.server == server) => {
                    say(format!(
                        "net: DHCP: {} refused the request (NAK)",
                        r.server.map_or("the server".to_string(), |s| s.to_string())
                    ));
                    return Got::Nak;
                }
                Ok(_) | Err(Refusal::Other) => {}
                Err(e) => {
                    warnings += 1;
                    if warnings <= MAX_WARNINGS {
                        say(format!("net: warning: DHCP: {e}"));
                    }
                }
            }
        }
    }

    /// Configures the interface from `lease` and says so: the held lease,
    /// or `None` when its address could not be set (asked again after a
    /// wait). `first`: the address or its prefix or router is new (not a
    /// renewal of the same). An MTU the NIC refuses is a warning.
    fn apply(&self, lease: &Lease, own: &Own, first: bool) -> Option<Held> {
        let name = self.iface.name().to_string();
        let cfg = lease.config();
        if first {
            let set = (|| -> Result<()> {
                self.iface.set_address(lease.address, lease.prefix)?;
                self.iface.up()?;
                // The route onto the link goes; the gateway's comes.
                self.iface.route(None, false)?;
                if let Some(g) = lease.router {
                    self.iface.route(Some(g), true)?;
                }
                Ok(())
            })();
            if let Err(e) = set {
                say(format!(
                    "net: warning: {name}: the DHCP lease {cfg}: {e:#}; asking again"
                ));
                self.drop_address();
                return None;
            }
        }
        if let Some(mtu) = lease.mtu
            && let Err(e) = self.iface.set_mtu(mtu)
        {
            say(format!(
                "net: warning: {name}: the lease's MTU: {e:#}; the NIC's is kept"
            ));
        }
        say(format!(
            "net: {name} {cfg} by DHCP from {} (lease {} s, renewal in {} s{})",
            lease.server,
            lease.lease.as_secs(),
            lease.renewal.as_secs(),
            lease.mtu.map(|m| format!(", MTU {m}")).unwrap_or_default()
        ));
        if first {
            // The node's own DNS servers were written before DHCP began.
            if own.dns.is_empty() {
                crate::net::write_dns(&lease.dns, "DHCP");
            }
            if let (Some(h), false) = (&lease.hostname, own.hostname) {
                match crate::net::set_hostname(h) {
                    Ok(()) => say(format!("host: hostname {h} (DHCP)")),
                    Err(e) => say(format!("host: warning: {e:#}")),
                }
            }
        }
        Some((lease.clone(), Instant::now()))
    }

    /// Keeps the lease (see the module's documentation); never returns.
    /// Two requests are at least [`RENEW_MIN`] apart, whatever the server's
    /// timers say.
    fn keep(mut self, mut held: Option<Held>, own: &Own) {
        let mut last_request: Option<Instant> = None;
        loop {
            let Some((lease, at)) = held.take() else {
                // Without a limit, acquire returns only with a lease.
                if let Some(l) = self.acquire(None) {
                    held = self.apply(&l, own, true);
                    if held.is_none() {
                        std::thread::sleep(RETRY_MAX);
                    }
                }
                continue;
            };
            let elapsed = at.elapsed();
            let to = match lease.phase(elapsed) {
                Phase::Bound => {
                    std::thread::sleep(lease.renewal.saturating_sub(elapsed));
                    held = Some((lease, at));
                    continue;
                }
                Phase::Renewing => SocketAddrV4::new(lease.server, dhcp::SERVER_PORT),
                Phase::Rebinding => SocketAddrV4::new(Ipv4Addr::BROADCAST, dhcp::SERVER_PORT),
                Phase::Expired => {
                    say(format!(
                        "net: warning: the DHCP lease of {} on {} ended; asking again",
                        lease.address,
                        self.iface.name()
                    ));
                    self.drop_address();
                    continue;
                }
            };
            if let Some(t) = last_request {
                std::thread::sleep(RENEW_MIN.saturating_sub(t.elapsed()));
            }
            // Half the time to the next phase, at least RENEW_MIN.
            let until = match lease.phase(elapsed) {
                Phase::Renewing => lease.rebinding,
                _ => lease.lease,
            };
            let wait = (until.saturating_sub(elapsed) / 2).max(RENEW_MIN);
            let client = Client {
                xid: xid(),
                mac: self.mac,
            };
            let req = dhcp::request(
                &client,
                Requesting::Extending {
                    address: lease.address,
                },
            );
            last_request = Some(Instant::now());
            let server = (to.ip() != &Ipv4Addr::BROADCAST).then_some(lease.server);
            let got = match self.send(&req, to) {
                Some(()) => self.receive(&client, Instant::now() + wait, Kind::Ack, server),
                None => Got::Nothing,
            };
            held = match got {
                Got::Reply(a) => match Lease::from_ack(&a, lease.server) {
                    Ok(new) if new.address == lease.address && new.config() == lease.config() => {
                        self.apply(&new, own, false)
                    }
                    Ok(new) => {
                        say(format!(
                            "net: DHCP moved {} from {} to {}",
                            self.iface.name(),
                            lease.config(),
                            new.config()
                        ));
                        let _ = self.iface.clear_address();
                        self.apply(&new, own, true)
                    }
                    Err(e) => {
                        say(format!("net: warning: DHCP: the ACK is refused: {e}"));
                        Some((lease, at))
                    }
                },
                // RFC 2131 §4.4.5: a NAK ends the lease at once.
                Got::Nak => {
                    self.drop_address();
                    std::thread::sleep(RETRY_FIRST);
                    None
                }
                Got::Nothing => Some((lease, at)),
            };
        }
    }

    /// The address goes (and the routes through it); the route onto the
    /// link comes back for the next DISCOVER.
    fn drop_address(&self) {
        let _ = self.iface.clear_address();
        let _ = self.iface.route(None, true);
    }
}

/// What [`Conn::receive`] got.
enum Got {
    Reply(Reply),
    Nak,
    Nothing,
}

/// A transaction identifier from the kernel's random pool.
fn xid() -> u32 {
    // Without the pool the identifier is still unique enough on a link
    // for one client: the clock's nanoseconds.
    crate::sys::random::<4>()
        .map(u32::from_ne_bytes)
        .unwrap_or_else(|_| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0)
        })
}
