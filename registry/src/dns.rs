//! Resolving a registry's name on the node, which has no resolver of its
//! own (a static binary: no NSS): static host entries first (the node's
//! settings, for networks without DNS), then an `A` query (RFC 1035) over
//! UDP to each DNS server in turn (DHCP's or the settings'), over TCP when
//! the answer is truncated. IPv4 only: the node's network is.
//!
//! The answer is untrusted bytes: [`parse_answer`] (the fuzz target
//! `registry_dns`) checks the ID, the question echoed, and reads at most
//! [`MAX_RECORDS`] records, names of at most 255 bytes with at most
//! [`MAX_POINTERS`] compression pointers each, and a CNAME chain of at
//! most [`MAX_CNAMES`] inside the answer; every wait is bounded
//! ([`Resolver::timeout`] per try, [`TRIES`] tries per server).

use crate::error::{Error, ErrorKind};
use crate::reference::excerpt;
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream, UdpSocket};
use std::time::Duration;

/// Records read from one answer.
pub const MAX_RECORDS: usize = 64;
/// Compression pointers followed in one name.
pub const MAX_POINTERS: usize = 16;
/// CNAMEs followed inside one answer.
pub const MAX_CNAMES: usize = 8;
/// Tries per server (UDP is lossy).
pub const TRIES: usize = 2;
/// The most servers asked (the node's settings' bound).
pub const MAX_SERVERS: usize = contract::settings::MAX_DNS;
/// The largest answer read over TCP (its length prefix allows 64 KiB).
const MAX_TCP: usize = 64 << 10;

const TYPE_A: u16 = 1;
const TYPE_CNAME: u16 = 5;
const CLASS_IN: u16 = 1;

/// How names are resolved: static entries, then DNS servers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resolver {
    /// Name (lowercase, without a trailing dot) to addresses.
    pub hosts: BTreeMap<String, Vec<Ipv4Addr>>,
    /// DNS servers, asked in turn (port 53, but for tests).
    pub servers: Vec<SocketAddr>,
    /// Each try's wait for an answer.
    pub timeout: Duration,
    /// Names whose DNS answers may be this machine's, link-local or
    /// multicast addresses: the registry the operator named (a client
    /// refuses such answers for any other name: a registry's redirect or
    /// token realm may not lead there).
    pub trusted_names: Vec<String>,
}

/// What an answer said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// The name's addresses.
    Addresses(Vec<Ipv4Addr>),
    /// The name does not exist (NXDOMAIN), or has no address (NODATA).
    NoSuchName,
    /// Truncated (TC): ask again over TCP.
    Truncated,
    /// The server failed (SERVFAIL, REFUSED, …): ask the next.
    ServerFailed(u8),
}

fn bad(why: &str) -> Error {
    Error::new(
        ErrorKind::Unreachable,
        format!("a DNS server sent an invalid answer ({why})"),
    )
}

/// A host name checked for a query ([`contract::settings::check_domain_name`]:
/// RFC 1123 labels, at most 253 bytes); lowercase, without a trailing dot.
fn check_name(name: &str) -> Result<String, Error> {
    let n = name.trim_end_matches('.').to_ascii_lowercase();
    contract::settings::check_domain_name(&n).map_err(|_| {
        Error::new(
            ErrorKind::Invalid,
            format!("{} is not a host name that can be resolved", excerpt(name)),
        )
    })?;
    Ok(n)
}

/// The query for `name`'s `A` records, with `id` (recursion desired).
pub fn query(id: u16, name: &str) -> Result<Vec<u8>, Error> {
    let name = check_name(name)?;
    let mut q = Vec::with_capacity(name.len() + 18);
    q.extend_from_slice(&id.to_be_bytes());
    q.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
    for label in name.split('.') {
        q.push(label.len() as u8);
        q.extend_from_slice(label.as_bytes());
    }
    q.push(0);
    q.extend_from_slice(&TYPE_A.to_be_bytes());
    q.extend_from_slice(&CLASS_IN.to_be_bytes());
    Ok(q)
}

fn u16_at(m: &[u8], at: usize) -> Result<u16, Error> {
    m.get(at..at + 2)
        .map(|b| u16::from_be_bytes([b[0], b[1]]))
        .ok_or_else(|| bad("it ends early"))
}

/// Reads the name at `at`: its text (lowercase) and where the record
/// continues after it.
fn read_name(m: &[u8], mut at: usize) -> Result<(String, usize), Error> {
    let mut name = String::new();
    let mut end = None;
    let mut pointers = 0;
    loop {
        let len = *m.get(at).ok_or_else(|| bad("a name runs past its end"))? as usize;
        match len {
            0 => {
                return Ok((name, end.unwrap_or(at + 1)));
            }
            l if l & 0xc0 == 0xc0 => {
                pointers += 1;
                if pointers > MAX_POINTERS {
                    return Err(bad("a name with a compression loop"));
                }
                let target = (u16_at(m, at)? & 0x3fff) as usize;
                end.get_or_insert(at + 2);
                at = target;
            }
            l if l & 0xc0 != 0 => return Err(bad("a label of a reserved type")),
            l => {
                let label = m
                    .get(at + 1..at + 1 + l)
                    .ok_or_else(|| bad("a label runs past its end"))?;
                if !name.is_empty() {
                    name.push('.');
                }
                name.extend(label.iter().map(|b| (b.to_ascii_lowercase()) as char));
                if name.len() > 255 {
                    return Err(bad("a name over 255 bytes"));
                }
                at += 1 + l;
            }
        }
    }
}

/// Parses the answer `m` to the query `id` for `name` (checked as
/// [`query`] checks it).
pub fn parse_answer(m: &[u8], id: u16, name: &str) -> Result<Answer, Error> {
    let name = check_name(name)?;
    if m.len() < 12 {
        return Err(bad("shorter than its header"));
    }
    if u16_at(m, 0)? != id {
        return Err(bad("another query's ID"));
    }
    let flags = u16_at(m, 2)?;
    if flags & 0x8000 == 0 || (flags >> 11) & 0xf != 0 {
        return Err(bad("not an answer to a standard query"));
    }
    if flags & 0x0200 != 0 {
        return Ok(Answer::Truncated);
    }
    let rcode = (flags & 0xf) as u8;
    match rcode {
        0 => {}
        3 => return Ok(Answer::NoSuchName),
        r => return Ok(Answer::ServerFailed(r)),
    }
    let qdcount = u16_at(m, 4)?;
    let ancount = u16_at(m, 6)? as usize;
    if qdcount != 1 {
        return Err(bad("not one question"));
    }
    let (qname, mut at) = read_name(m, 12)?;
    if qname != name || u16_at(m, at)? != TYPE_A || u16_at(m, at + 2)? != CLASS_IN {
        return Err(bad("an answer to another question"));
    }
    at += 4;
    if ancount > MAX_RECORDS {
        return Err(bad("too many records"));
    }
    let mut records = Vec::with_capacity(ancount);
    for _ in 0..ancount {
        let (owner, next) = read_name(m, at)?;
        let rtype = u16_at(m, next)?;
        let class = u16_at(m, next + 2)?;
        let len = u16_at(m, next + 8)? as usize;
        let data_at = next + 10;
        if data_at + len > m.len() {
            return Err(bad("a record runs past its end"));
        }
        records.push((owner, rtype, class, data_at, len));
        at = data_at + len;
    }
    // The name, or the CNAME it leads to within the answer.
    let mut current = name;
    for _ in 0..=MAX_CNAMES {
        let addrs: Vec<Ipv4Addr> = records
            .iter()
            .filter(|(o, t, c, _, l)| *o == current && *t == TYPE_A && *c == CLASS_IN && *l == 4)
            .map(|&(_, _, _, d, _)| Ipv4Addr::new(m[d], m[d + 1], m[d + 2], m[d + 3]))
            .collect();
        if !addrs.is_empty() {
            return Ok(Answer::Addresses(addrs));
        }
        match records
            .iter()
            .find(|(o, t, c, _, _)| *o == current && *t == TYPE_CNAME && *c == CLASS_IN)
        {
            Some(&(_, _, _, d, _)) => current = read_name(m, d)?.0,
            None => return Ok(Answer::NoSuchName),
        }
    }
    Err(bad("a chain of CNAMEs too long"))
}

/// A query ID no one can guess from outside (the process's random hash
/// keys, through a counter).
fn random_id() -> u16 {
    use std::hash::{BuildHasher, Hasher};
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(N.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    h.finish() as u16
}

impl Resolver {
    /// The addresses of `host` (a name or an IPv4 literal): a static entry,
    /// else each server in turn; an error that says what was asked.
    pub fn lookup(&self, host: &str) -> Result<Vec<IpAddr>, Error> {
        if let Ok(ip) = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<IpAddr>()
        {
            return Ok(vec![ip]);
        }
        let name = check_name(host)?;
        if let Some(a) = self.hosts.get(&name) {
            return Ok(a.iter().map(|&a| IpAddr::V4(a)).collect());
        }
        if self.servers.is_empty() {
            return Err(Error::new(
                ErrorKind::Unreachable,
                format!(
                    "cannot resolve {}: no DNS server (none from DHCP or the node's settings) \
                     and no host entry for it in the node's settings",
                    excerpt(&name)
                ),
            ));
        }
        let mut why = Vec::new();
        for server in self.servers.iter().take(MAX_SERVERS) {
            match self.ask(*server, &name) {
                Ok(Answer::Addresses(a)) => return Ok(a.into_iter().map(IpAddr::V4).collect()),
                Ok(Answer::NoSuchName) => {
                    return Err(Error::new(
                        ErrorKind::Unreachable,
                        format!(
                            "no such host: {} (the DNS server {server} knows no address for it)",
                            excerpt(&name)
                        ),
                    ));
                }
                Ok(Answer::ServerFailed(r)) => why.push(format!("{server}: failed (rcode {r})")),
                Ok(Answer::Truncated) => why.push(format!("{server}: truncated over TCP")),
                Err(e) => why.push(format!("{server}: {e}")),
            }
        }
        Err(Error::new(
            ErrorKind::Unreachable,
            format!("cannot resolve {}: {}", excerpt(&name), why.join("; ")),
        ))
    }

    /// One server: UDP, [`TRIES`] times, then TCP if truncated.
    fn ask(&self, server: SocketAddr, name: &str) -> Result<Answer, Error> {
        let io = |e: std::io::Error| Error::new(ErrorKind::Unreachable, e.to_string());
        let timeout = if self.timeout.is_zero() {
            Duration::from_secs(2)
        } else {
            self.timeout
        };
        let bind: SocketAddr = if server.is_ipv4() {
            ([0, 0, 0, 0], 0).into()
        } else {
            ([0u16; 8], 0).into()
        };
        let socket = UdpSocket::bind(bind).map_err(io)?;
        socket.connect(server).map_err(io)?;
        socket.set_read_timeout(Some(timeout)).map_err(io)?;
        let mut last = Error::new(ErrorKind::Timeout, "no answer");
        for _ in 0..TRIES {
            let id = random_id();
            socket.send(&query(id, name)?).map_err(io)?;
            let mut buf = [0u8; 512];
            // Answers to other IDs (late, forged) are read past, within the
            // try's wait.
            let deadline = std::time::Instant::now() + timeout;
            let mut invalid = None;
            let no_answer = || Error::new(ErrorKind::Timeout, format!("no answer in {timeout:?}"));
            loop {
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                if left.is_zero() {
                    last = invalid.take().unwrap_or_else(no_answer);
                    break;
                }
                socket.set_read_timeout(Some(left)).map_err(io)?;
                match socket.recv(&mut buf) {
                    Ok(n) => match parse_answer(&buf[..n], id, name) {
                        Ok(Answer::Truncated) => return self.ask_tcp(server, name, timeout),
                        Ok(a) => return Ok(a),
                        Err(e) => invalid = Some(e),
                    },
                    Err(e)
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                        ) =>
                    {
                        last = invalid.take().unwrap_or_else(no_answer);
                        break;
                    }
                    Err(e) => return Err(io(e)),
                }
            }
        }
        Err(last)
    }

    fn ask_tcp(&self, server: SocketAddr, name: &str, timeout: Duration) -> Result<Answer, Error> {
        let io = |e: std::io::Error| Error::new(ErrorKind::Unreachable, e.to_string());
        // One wait for the whole exchange, however the bytes arrive.
        let deadline = std::time::Instant::now() + timeout;
        let left = || {
            let l = deadline.saturating_duration_since(std::time::Instant::now());
            if l.is_zero() {
                Err(Error::new(
                    ErrorKind::Timeout,
                    format!("no whole answer over TCP in {timeout:?}"),
                ))
            } else {
                Ok(l)
            }
        };
        let mut s = TcpStream::connect_timeout(&server, left()?).map_err(io)?;
        s.set_write_timeout(Some(left()?)).map_err(io)?;
        let id = random_id();
        let q = query(id, name)?;
        let mut framed = (q.len() as u16).to_be_bytes().to_vec();
        framed.extend_from_slice(&q);
        s.write_all(&framed).map_err(io)?;
        let mut m = Vec::new();
        let mut want = 2;
        let mut buf = [0u8; 4096];
        while m.len() < want {
            s.set_read_timeout(Some(left()?)).map_err(io)?;
            let n = s.read(&mut buf).map_err(io)?;
            if n == 0 {
                return Err(bad("the TCP answer ends early"));
            }
            m.extend_from_slice(&buf[..n]);
            if want == 2 && m.len() >= 2 {
                want = 2 + (u16::from_be_bytes([m[0], m[1]]) as usize).min(MAX_TCP);
            }
        }
        let m = &m[2..want];
        match parse_answer(m, id, name)? {
            Answer::Truncated => Err(bad("truncated over TCP")),
            a => Ok(a),
        }
    }
}

#[cfg(test)]
mod tests;
