//! The node API's client: one request per connection, its events read to
//! the last ([`nodeapi::proto`]), and the wait for a node coming back from
//! a reboot.

use super::credentials::read_small;
use anyhow::{Context, Result, anyhow, bail};
use nodeapi::proto::{self, Event, Outcome, Request, Status};
use rustls::pki_types::ServerName;
use std::io::BufReader;
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a connection may take to open.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the client waits for the node's next line (an upgrade sends
/// progress at least this often).
pub const READ_TIMEOUT: Duration = Duration::from_secs(120);

/// Where a node is and how to talk to it.
#[derive(Debug, Clone)]
pub struct Client {
    config: Arc<rustls::ClientConfig>,
    /// `HOST:PORT` as given, for messages.
    shown: String,
    addrs: Vec<SocketAddr>,
    server_name: ServerName<'static>,
}

/// `HOST`, `HOST:PORT`, `[V6]:PORT`: the host and the port (the API's
/// default when none is given).
pub fn split_node(node: &str) -> Result<(String, u16)> {
    let bad =
        || anyhow!("--node {node:?} is not HOST or HOST:PORT (e.g. 10.0.2.15 or 127.0.0.1:50000)");
    if node.is_empty() || node.len() > 255 || node.chars().any(|c| c.is_whitespace()) {
        return Err(bad());
    }
    if let Some(rest) = node.strip_prefix('[') {
        let (host, tail) = rest.split_once(']').ok_or_else(bad)?;
        let port = match tail {
            "" => proto::PORT,
            t => t
                .strip_prefix(':')
                .and_then(|p| p.parse().ok())
                .ok_or_else(bad)?,
        };
        return Ok((host.to_string(), port));
    }
    match node.rsplit_once(':') {
        None => Ok((node.to_string(), proto::PORT)),
        Some((host, port)) if !host.is_empty() && !host.contains(':') => {
            Ok((host.to_string(), port.parse().map_err(|_| bad())?))
        }
        _ => Err(bad()),
    }
}

impl Client {
    /// A client of `node` (`HOST[:PORT]`) with the credentials of client
    /// `name` in `dir` (`ca.crt`, `NAME.crt`, `NAME.key`). The node's
    /// certificate must be valid for `server_name` (default: the host).
    pub fn new(
        node: &str,
        dir: &std::path::Path,
        name: &str,
        server_name: Option<&str>,
    ) -> Result<Client> {
        let (host, port) = split_node(node)?;
        let key_path = dir.join(format!("{name}.key"));
        let cert_path = dir.join(format!("{name}.crt"));
        if !cert_path.exists() {
            bail!(
                "{} not found: make a client certificate with `imager node credentials {} \
                 --role operator --name {name}`",
                cert_path.display(),
                dir.display()
            );
        }
        crate::secret::refuse_readable_by_others(&key_path)?;
        let ca = super::credentials::trust_bundle(dir)?;
        let cert = read_small(&cert_path, "client certificate")?;
        let key = read_small(&key_path, "client key")?;
        let config = nodeapi::tls::client_config(ca.as_bytes(), cert.as_bytes(), key.as_bytes())?;
        warn_if_expiring(&cert_path, &cert);
        let sn = server_name.unwrap_or(&host).to_string();
        let server_name = ServerName::try_from(sn.clone())
            .map_err(|_| anyhow!("{sn:?} is not a DNS name or an IP address"))?;
        let addrs: Vec<SocketAddr> = (host.as_str(), port)
            .to_socket_addrs()
            .with_context(|| format!("resolving {host}"))?
            .collect();
        if addrs.is_empty() {
            bail!("{host} resolves to no address");
        }
        Ok(Client {
            config,
            shown: format!("{host}:{port}"),
            addrs,
            server_name,
        })
    }

    /// The node as given (`HOST:PORT`).
    pub fn node(&self) -> &str {
        &self.shown
    }

    /// Opens a connection within `timeout`, whose reads and writes time
    /// out after `io`.
    fn connect(
        &self,
        timeout: Duration,
        io: Duration,
    ) -> Result<rustls::StreamOwned<rustls::ClientConnection, TcpStream>> {
        let mut last = None;
        for a in &self.addrs {
            match TcpStream::connect_timeout(a, timeout) {
                Ok(sock) => {
                    sock.set_read_timeout(Some(io))?;
                    sock.set_write_timeout(Some(io))?;
                    let conn = rustls::ClientConnection::new(
                        self.config.clone(),
                        self.server_name.clone(),
                    )
                    .context("starting TLS")?;
                    return Ok(rustls::StreamOwned::new(conn, sock));
                }
                Err(e) => last = Some(e),
            }
        }
        Err(anyhow!(
            "cannot reach the node at {}: {}",
            self.shown,
            last.map_or("no address".into(), |e| e.to_string())
        ))
    }

    /// Sends `request` and reads the events to the last, each passed to
    /// `on_event`; returns the last (`Done` or `Failed`).
    pub fn call(&self, request: &Request, mut on_event: impl FnMut(&Event)) -> Result<Event> {
        self.call_with(
            request,
            CONNECT_TIMEOUT,
            READ_TIMEOUT,
            &mut on_event,
            &|_| false,
        )
    }

    /// As [`Client::call`], but returns at the first event for which
    /// `stop` holds (the connection is closed; the node goes on).
    pub fn call_until(
        &self,
        request: &Request,
        mut on_event: impl FnMut(&Event),
        stop: &dyn Fn(&Event) -> bool,
    ) -> Result<Event> {
        self.call_with(request, CONNECT_TIMEOUT, READ_TIMEOUT, &mut on_event, stop)
    }

    fn call_with(
        &self,
        request: &Request,
        connect: Duration,
        io: Duration,
        on_event: &mut dyn FnMut(&Event),
        stop: &dyn Fn(&Event) -> bool,
    ) -> Result<Event> {
        let mut tls = self.connect(connect, io)?;
        proto::write_line(&mut tls, request).map_err(|e| self.explain(e, io))?;
        let mut r = BufReader::new(tls);
        loop {
            let line = proto::read_line(&mut r).map_err(|e| self.explain(e, io))?;
            let Some(line) = line else {
                bail!(
                    "the node at {} closed the connection before the end of its answer",
                    self.shown
                );
            };
            let event = proto::parse_event(&line)
                .with_context(|| format!("the node at {} sent a bad answer", self.shown))?;
            on_event(&event);
            if event.is_last() || stop(&event) {
                return Ok(event);
            }
        }
    }

    /// The node's status.
    pub fn status(&self) -> Result<Status> {
        self.status_within(CONNECT_TIMEOUT, READ_TIMEOUT)
    }

    fn status_within(&self, connect: Duration, io: Duration) -> Result<Status> {
        match self.call_with(&Request::Status {}, connect, io, &mut |_| {}, &|_| false)? {
            Event::Done { status, .. } => Ok(*status),
            Event::Failed { code, message, .. } => {
                bail!("the node refused status ({}): {message}", code.name())
            }
            Event::Progress { .. } => unreachable!("call returns the last event"),
        }
    }

    /// A TLS or connection error, said in terms of what to do about it.
    fn explain(&self, e: anyhow::Error, io: Duration) -> anyhow::Error {
        use std::io::ErrorKind as K;
        let io_error = e.chain().find_map(|c| c.downcast_ref::<std::io::Error>());
        let kind = io_error.map(std::io::Error::kind);
        if matches!(kind, Some(K::WouldBlock | K::TimedOut)) {
            return anyhow!(
                "the node at {} sent nothing for {} s: it may be down, cut off, or stuck \
                 (its console says which); `imager node status` tells whether it answers",
                self.shown,
                io.as_secs()
            );
        }
        if matches!(
            kind,
            Some(K::UnexpectedEof | K::ConnectionReset | K::BrokenPipe)
        ) {
            return anyhow!(
                "the node at {} closed the connection before answering: it closes the oldest \
                 of more than {} connections still in their handshake, so it may be flooded \
                 with connections; try again (its console counts what it closed) ({e:#})",
                self.shown,
                proto::MAX_PENDING
            );
        }
        let text = format!("{e:#}");
        let rustls_error = io_error
            .and_then(|io| io.get_ref())
            .and_then(|inner| inner.downcast_ref::<rustls::Error>());
        let Some(why) = rustls_error.and_then(tls_failure) else {
            return e.context(format!("talking to the node at {}", self.shown));
        };
        anyhow!("{why} (talking to {}: {text})", self.shown)
    }

    /// Asks the node's status once a second until `decide` settles it
    /// (returns [`Poll::Done`], or fails) or `timeout` passes, failing then
    /// with `what` it waited for and the last thing waited on. Short
    /// timeouts: a connection opened while the node went down is never
    /// closed by the node (user-mode networking keeps the host's end open),
    /// so it must not hold the wait up; a node that is rebooting refuses
    /// connections at once, hence the pace. `on_try` gets each new thing
    /// waited on.
    fn poll(
        &self,
        what: &str,
        timeout: Duration,
        on_try: &mut dyn FnMut(&str),
        decide: &mut dyn FnMut(Result<Status>) -> Result<Poll>,
    ) -> Result<Status> {
        let start = Instant::now();
        let mut said = String::from("no answer yet");
        while start.elapsed() < timeout {
            let answer = self.status_within(Duration::from_secs(5), Duration::from_secs(10));
            match decide(answer)? {
                Poll::Done(s) => return Ok(*s),
                Poll::Waiting(now) => {
                    if now != said {
                        on_try(&now);
                        said = now;
                    }
                }
            }
            std::thread::sleep(Duration::from_secs(1));
        }
        bail!(
            "the node at {} did not {what} within {} s ({said})",
            self.shown,
            timeout.as_secs()
        )
    }

    /// Waits for the node to come back from the reboot that followed the
    /// status `before`: its status answers with another boot id. Succeeds
    /// when it runs `expected_slot` at `expected_version` (when given);
    /// fails saying where and what it came back on otherwise, or when
    /// `timeout` passes first.
    pub fn wait_back(
        &self,
        before: &Status,
        (expected_slot, expected_version): (&str, Option<&str>),
        timeout: Duration,
        mut on_try: impl FnMut(&str),
    ) -> Result<Status> {
        let history = |s: &Status| {
            s.last_event
                .as_deref()
                .map(|h| format!(": {h}"))
                .unwrap_or_default()
        };
        self.poll("come back", timeout, &mut on_try, &mut |answer| {
            let s = match answer {
                Err(e) => return Ok(Poll::Waiting(format!("{e:#}"))),
                Ok(s) if s.boot_id == before.boot_id => {
                    return Ok(Poll::Waiting("the node has not rebooted yet".into()));
                }
                Ok(s) => s,
            };
            if s.booted_slot == expected_slot
                && s.ready
                && expected_version.is_none_or(|v| v == s.version)
            {
                return Ok(Poll::Done(Box::new(s)));
            }
            if s.booted_slot == expected_slot {
                bail!(
                    "the node came back on slot {expected_slot} running {} {}, not the version \
                     {} it was to boot{}",
                    s.name,
                    s.version,
                    expected_version.unwrap_or_default(),
                    history(&s)
                );
            }
            bail!(
                "the node came back on slot {} ({} {}), not on slot {expected_slot}{}",
                s.booted_slot,
                s.name,
                s.version,
                history(&s)
            )
        })
    }

    /// Follows the node until its operation has ended: it answers, nothing
    /// is in progress, and no reboot it announced is still to come (a
    /// last outcome of this boot that says `rebooting`); through the
    /// reboot, connection failures are waited past. Fails when the last
    /// outcome failed, when META's last event says the upgrade fell back,
    /// when `version` is given and the node runs another, and at
    /// `timeout`. `on_try` gets what is being waited for.
    pub fn wait_settled(
        &self,
        version: Option<&str>,
        timeout: Duration,
        mut on_try: impl FnMut(&str),
    ) -> Result<Status> {
        self.poll("settle", timeout, &mut on_try, &mut |answer| {
            let s = match answer {
                Err(e) => return Ok(Poll::Waiting(format!("no answer ({e:#})"))),
                Ok(s) => s,
            };
            match (&s.operation, &s.last_outcome) {
                (Some(op), _) => return Ok(Poll::Waiting(format!("in progress: {op}"))),
                (None, Some(o)) if Outcome::of(o) == Outcome::Rebooting => {
                    return Ok(Poll::Waiting(format!("the node is to reboot ({o})")));
                }
                (None, Some(o)) if Outcome::of(o) == Outcome::NotDone => {
                    bail!("the node's last operation did not succeed: {o}")
                }
                _ => {}
            }
            if let Some(e) = s.last_event.as_deref()
                && (e.contains("upgrade-failed") || e.contains("fell-back"))
            {
                bail!(
                    "the node is back on {} {} (slot {}), its upgrade failed: {e}",
                    s.name,
                    s.version,
                    s.booted_slot
                );
            }
            if let Some(v) = version
                && v != s.version
            {
                bail!(
                    "the node runs {} {} on slot {}, not {v}{}",
                    s.name,
                    s.version,
                    s.booted_slot,
                    s.last_event
                        .as_deref()
                        .map(|e| format!(": {e}"))
                        .unwrap_or_default()
                );
            }
            Ok(Poll::Done(Box::new(s)))
        })
    }
}

/// What [`Client::poll`]'s decision says of one answer.
enum Poll {
    /// Settled: this status.
    Done(Box<Status>),
    /// Not yet: what is being waited for.
    Waiting(String),
}

/// What a TLS failure means: which side refused which certificate, and
/// why.
/// Says on stderr when this client's certificate is close to its end, or
/// past it.
fn warn_if_expiring(path: &std::path::Path, pem: &str) {
    let Some(end) = nodeapi::tls::certs(pem.as_bytes(), "client certificate")
        .ok()
        .and_then(|c| c.first().and_then(|c| nodeapi::tls::not_after(c)))
    else {
        return;
    };
    let now = nodeapi::tls::now();
    let renew = "renew it: imager node credentials DIR --role ROLE --name NAME --renew";
    if end <= now {
        crate::progress::line(&format!(
            "warning: the client certificate {} has expired: nodes refuse it; {renew}",
            path.display()
        ));
    } else if end - now < nodeapi::tls::RENEW_WITHIN {
        crate::progress::line(&format!(
            "warning: the client certificate {} expires in {} day(s); {renew}",
            path.display(),
            (end - now) / 86400
        ));
    }
}

pub fn tls_failure(e: &rustls::Error) -> Option<&'static str> {
    use rustls::{AlertDescription as A, CertificateError as C, Error};
    Some(match e {
        // The node's alerts about this client's certificate.
        Error::AlertReceived(A::CertificateExpired) => {
            "the node refused this client's certificate: it has expired, or is not valid yet, \
             by the node's clock: renew it (`imager node credentials DIR --role ROLE --name \
             NAME --renew`)"
        }
        Error::AlertReceived(A::CertificateRevoked) => {
            "the node refused this client's certificate: it is revoked (listed in the node's \
             settings, `imager node provision --revoke`): use another client's credentials"
        }
        Error::AlertReceived(_) => {
            "the node refused this client's certificate: it must be issued by the cluster CA \
             the node was provisioned with (`imager node provision`)"
        }
        // This client's checks of the node's certificate.
        Error::InvalidCertificate(
            C::Expired | C::ExpiredContext { .. } | C::NotValidYet | C::NotValidYetContext { .. },
        ) => {
            "the node's certificate has expired, or is not valid yet, by this machine's clock \
             (check both clocks; a node's credentials are renewed with `imager node \
             credentials DIR --node NAME --renew` and `imager node provision --force`)"
        }
        Error::InvalidCertificate(C::UnknownIssuer | C::BadSignature) => {
            "the node's certificate is not issued by the cluster CA in the credentials \
             directory (is it the right node, and the right --credentials?)"
        }
        Error::InvalidCertificate(C::NotValidForName | C::NotValidForNameContext { .. }) => {
            "the node's certificate is not for this name or address: pass --server-name with \
             a name its certificate has (`imager node credentials --node NAME --address IP`)"
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::{AlertDescription as A, CertificateError as C, Error};

    #[test]
    fn tls_failures_say_which_certificate_and_why() {
        let cases = [
            (
                Error::AlertReceived(A::CertificateExpired),
                "it has expired",
            ),
            (Error::AlertReceived(A::CertificateRevoked), "it is revoked"),
            (
                Error::AlertReceived(A::UnknownCA),
                "issued by the cluster CA",
            ),
            (
                Error::AlertReceived(A::BadCertificate),
                "issued by the cluster CA",
            ),
            (
                Error::InvalidCertificate(C::Expired),
                "the node's certificate has expired",
            ),
            (
                Error::InvalidCertificate(C::UnknownIssuer),
                "not issued by the cluster CA",
            ),
            (
                Error::InvalidCertificate(C::NotValidForName),
                "not for this name",
            ),
        ];
        for (e, want) in cases {
            let why = tls_failure(&e).unwrap_or_default();
            assert!(why.contains(want), "{e}: {why}");
        }
        assert!(tls_failure(&Error::DecryptError).is_none());
    }

    #[test]
    fn node_addresses() {
        assert_eq!(
            split_node("10.0.2.15").unwrap(),
            ("10.0.2.15".into(), proto::PORT)
        );
        assert_eq!(
            split_node("127.0.0.1:6000").unwrap(),
            ("127.0.0.1".into(), 6000)
        );
        assert_eq!(split_node("[::1]:7").unwrap(), ("::1".into(), 7));
        assert_eq!(split_node("[::1]").unwrap(), ("::1".into(), proto::PORT));
        for bad in [
            "", "a b", "h:", "h:x", "h:70000", "::1", "[::1", "[::1]x", ":5",
        ] {
            assert!(split_node(bad).is_err(), "{bad}");
        }
    }
}
