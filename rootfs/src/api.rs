//! The node API's server (docs/node-api.md): mutual TLS 1.3 on
//! [`PORT`](nodeapi::proto::PORT), the cluster CA and the node's
//! certificate and key from META (`imager node provision`), one request per
//! connection answered by JSON lines ([`nodeapi::proto`]).
//!
//! Each connection has a thread of its own, so that a slow client holds no
//! one else up. A connection that has not sent its request yet (the TLS
//! handshake and the request line: anyone can open one) is *pending*: it
//! has [`HANDSHAKE_TIMEOUT`](nodeapi::proto::HANDSHAKE_TIMEOUT) in all, however slowly its bytes drip, and
//! their number is bounded, in all and per address ([`crate::pending`]),
//! so that idle or dripping connections cannot lock clients out. A client whose
//! certificate passed and whose request arrived is *served*, at most
//! [`MAX_SERVING`](nodeapi::proto::MAX_SERVING) at once (more are answered `busy`). Connections closed
//! for either bound are counted and said on the console at most every
//! [`REFUSALS_SAID_EVERY`], not one line each. The role in the client's certificate decides what it may
//! call ([`nodeapi::Role::may`]); an operation that changes the node holds
//! the one operation slot, and a second one meanwhile is answered `busy`.
//! A reboot or power-off is answered first, then asked of PID 1's
//! supervisor ([`power::request`]), which stops everything, unmounts and
//! syncs as for the power button.

use crate::console::say;
use crate::pending::Pending;
use crate::{power, pull, secureboot, slots};
use anyhow::{Context, Result, bail};
use contract::Slot;
use contract::meta::{Meta, Tag};
use nodeapi::proto::{
    self, ErrorCode, Event, HANDSHAKE_TIMEOUT, MAX_PENDING, MAX_PULLS, MAX_SERVING, Request,
    SlotStatus, Status,
};
use std::io::{BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long an authenticated client may take to take each answer line.
const IO_TIMEOUT: Duration = Duration::from_secs(30);
/// Connections closed by the bounds above are said on the console at most
/// this often (with their count), never one line each.
pub const REFUSALS_SAID_EVERY: Duration = Duration::from_secs(10);

/// What the server knows of the node it runs on.
pub struct Node {
    /// META's image name and the running version.
    pub name: String,
    pub version: String,
    pub slot: Slot,
    pub disk: slots::Disk,
    /// Registries an upgrade may pull from over plain HTTP
    /// (`machined.plain_http=` on the signed command line).
    pub plain_http: Vec<String>,
}

struct Server {
    node: Node,
    /// The TLS configuration of new connections: replaced when the node's
    /// credentials are (`credentials`).
    config: Mutex<Arc<rustls::ServerConfig>>,
    /// The operation in progress, if any, and what it is doing.
    operation: Mutex<Option<OpState>>,
    /// Set by `cancel`: the upgrade in progress stops pulling.
    cancel: Arc<AtomicBool>,
    /// Pull threads still running: the current pull's, and those a cancel
    /// or a deadline left (each ends at its next read, or at its registry
    /// requests' deadline); at most [`MAX_PULLS`].
    pulling: Arc<AtomicUsize>,
    /// Pulls started this boot: each stages into a directory of its own.
    pulls: AtomicU64,
    /// The upgrade in progress has pulled and writes: `cancel` no longer
    /// stops it.
    writing: AtomicBool,
    /// How the last changing operation of this boot ended.
    last_outcome: Mutex<Option<String>>,
    /// Pending connections (module doc).
    pending: Mutex<Pending>,
    next_id: AtomicU64,
    serving: AtomicUsize,
    /// Connections closed before their request (evicted, timed out, failed
    /// handshakes) since the console last said so, and when it did.
    refused: Mutex<(u64, Option<Instant>)>,
    /// All of them since boot, for status.
    refused_total: AtomicU64,
    /// An upgrade staged (`--stage`) and not armed yet; kept until `arm`
    /// or a reboot (its files stay on EPHEMERAL and in the inactive slot).
    staged: Mutex<Option<StagedUpgrade>>,
}

/// What `arm` needs of a staged upgrade.
struct StagedUpgrade {
    staged: pull::Staged,
    tries: u32,
    preserve: bool,
    target: Slot,
}

/// The operation in progress: its name, and its last step while it runs.
struct OpState {
    name: &'static str,
    step: Option<String>,
}

/// The operation slot, released when dropped.
struct Operation<'a>(&'a Mutex<Option<OpState>>);

impl Drop for Operation<'_> {
    fn drop(&mut self) {
        if let Ok(mut op) = self.0.lock() {
            *op = None;
        }
    }
}

/// The node's credentials in META, when all three are there.
pub fn credentials(meta: &Meta) -> Option<(&str, &str, &str)> {
    Some((
        meta.get(Tag::NodeCa)?,
        meta.get(Tag::NodeCert)?,
        meta.get(Tag::NodeKey)?,
    ))
}

/// Starts serving the API in a thread of its own, when META holds the
/// node's credentials; says on the console what it does.
pub fn start(meta: &Meta, node: Node) -> Result<()> {
    let Some((ca, cert, key)) = credentials(meta) else {
        say("api: META has no node credentials (imager node provision): the node API is off");
        return Ok(());
    };
    let policy = tls_policy(meta);
    let config =
        nodeapi::tls::server_config(ca.as_bytes(), cert.as_bytes(), key.as_bytes(), &policy)
            .context("the node credentials in META (provision them again)")?;
    warn_if_expiring(cert, policy.clock_floor);
    let listener = TcpListener::bind(("0.0.0.0", proto::PORT))
        .with_context(|| format!("listening on port {}", proto::PORT))?;
    say(format!(
        "api: listening on port {} (TLS 1.3, clients of the cluster CA in META)",
        proto::PORT
    ));
    let server = Arc::new(Server {
        node,
        config: Mutex::new(config),
        operation: Mutex::new(None),
        cancel: Arc::new(AtomicBool::new(false)),
        pulling: Arc::new(AtomicUsize::new(0)),
        pulls: AtomicU64::new(0),
        writing: AtomicBool::new(false),
        last_outcome: Mutex::new(None),
        pending: Mutex::new(Pending::default()),
        next_id: AtomicU64::new(0),
        serving: AtomicUsize::new(0),
        refused: Mutex::new((0, None)),
        refused_total: AtomicU64::new(0),
        staged: Mutex::new(None),
    });
    std::thread::Builder::new()
        .name("api".into())
        .spawn(move || accept(listener, server))
        .context("starting the API thread")?;
    Ok(())
}

/// What the API's TLS checks beside the CA: the revoked client
/// certificates of the node's settings (a record that does not parse was
/// said at boot by the network's set-up, and revokes nothing), and the
/// clock's floor, this runtime's own build time (its files carry the
/// build's SOURCE_DATE_EPOCH as their time).
fn tls_policy(meta: &Meta) -> nodeapi::tls::Policy {
    let revoked = contract::settings::Settings::from_meta(meta)
        .map(|s| s.revoked)
        .unwrap_or_default();
    if !revoked.is_empty() {
        say(format!(
            "api: {} revoked client certificate(s) refused",
            revoked.len()
        ));
    }
    let clock_floor = std::fs::metadata("/proc/self/exe")
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_secs());
    if nodeapi::tls::now() < clock_floor {
        say(format!(
            "api: the clock is behind this system's build time: certificates are checked as \
             of {clock_floor} (seconds since 1970)"
        ));
    }
    nodeapi::tls::Policy {
        clock_floor,
        revoked,
    }
}

/// Says on the console when the node's own certificate is close to its
/// end or past it (by the floored clock).
fn warn_if_expiring(cert_pem: &str, floor: u64) {
    let Some(end) = nodeapi::tls::certs(cert_pem.as_bytes(), "node certificate")
        .ok()
        .and_then(|c| c.first().and_then(|c| nodeapi::tls::not_after(c)))
    else {
        return;
    };
    let now = nodeapi::tls::now().max(floor);
    if end <= now {
        say(
            "api: WARNING: the node's certificate has expired: clients refuse it; renew it \
             (imager node credentials DIR --node NAME --renew) and replace it (imager node \
             provision, or the replace-credentials operation)",
        );
    } else if end - now < nodeapi::tls::RENEW_WITHIN {
        say(format!(
            "api: WARNING: the node's certificate expires in {} day(s): renew it",
            (end - now) / 86400
        ));
    }
}

fn accept(listener: TcpListener, server: Arc<Server>) {
    for stream in listener.incoming() {
        let Ok(stream) = stream else { continue };
        let Ok(handle) = stream.try_clone() else {
            continue; // dropped: closed
        };
        let id = server.next_id.fetch_add(1, Ordering::SeqCst);
        let Ok(peer) = stream.peer_addr() else {
            continue; // dropped: closed
        };
        if let Ok(mut pending) = server.pending.lock()
            && let Some(closed) = pending.admit(id, peer.ip(), handle)
        {
            // Its thread's next read fails, and it ends.
            let _ = closed.shutdown(Shutdown::Both);
        }
        let s = server.clone();
        let spawned = std::thread::Builder::new()
            .name("api-conn".into())
            .spawn(move || {
                let peer = peer.to_string();
                match serve(&s, stream, id, &peer) {
                    Ok(()) => {}
                    Err(Refusal::Unauthenticated(e)) => s.refusal(&e),
                    Err(Refusal::Authenticated(e)) => say(format!("api: {peer}: {e:#}")),
                }
                s.unpend(id);
            });
        if spawned.is_err() {
            server.unpend(id);
        }
    }
}

/// Why a connection ended early: before its request was read (anyone can
/// cause that: counted, not said each time), or after.
enum Refusal {
    Unauthenticated(anyhow::Error),
    Authenticated(anyhow::Error),
}

impl From<anyhow::Error> for Refusal {
    fn from(e: anyhow::Error) -> Self {
        Refusal::Authenticated(e)
    }
}

impl From<std::io::Error> for Refusal {
    fn from(e: std::io::Error) -> Self {
        Refusal::Authenticated(e.into())
    }
}

/// A connection's socket whose reads end at a deadline, however slowly
/// bytes arrive (a read timeout alone restarts with each byte).
struct Sock {
    stream: TcpStream,
    deadline: Option<Instant>,
}

impl Read for Sock {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let timeout = match self.deadline {
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "the handshake and request took too long",
                    ));
                }
                left.min(IO_TIMEOUT)
            }
            None => IO_TIMEOUT,
        };
        self.stream.set_read_timeout(Some(timeout))?;
        self.stream.read(buf)
    }
}

impl Write for Sock {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.stream.write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.stream.flush()
    }
}

type Tls = rustls::StreamOwned<rustls::ServerConnection, Sock>;

fn serve(server: &Server, stream: TcpStream, id: u64, peer: &str) -> Result<(), Refusal> {
    let unauthenticated = Refusal::Unauthenticated;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    let config = server
        .config
        .lock()
        .map_err(|_| anyhow::anyhow!("the TLS configuration's lock is poisoned"))?
        .clone();
    let conn = rustls::ServerConnection::new(config).context("TLS")?;
    let sock = Sock {
        stream,
        deadline: Some(Instant::now() + HANDSHAKE_TIMEOUT),
    };
    let mut tls = rustls::StreamOwned::new(conn, sock);
    while tls.conn.is_handshaking() {
        tls.conn
            .complete_io(&mut tls.sock)
            .context("TLS handshake (a client without a certificate of the cluster CA?)")
            .map_err(unauthenticated)?;
    }
    let role = nodeapi::tls::peer_role(&tls.conn).map_err(unauthenticated)?;
    let line = {
        let mut r = BufReader::new(&mut tls);
        proto::read_line(&mut r).map_err(unauthenticated)?
    };
    let Some(line) = line else {
        return Ok(());
    };
    // Authenticated, with its request: no longer pending.
    server.unpend(id);
    tls.sock.deadline = None;
    let Some(_serving) = Serving::take(&server.serving) else {
        finish(
            &mut tls,
            failed(
                ErrorCode::Busy,
                format!("the node is answering {MAX_SERVING} requests already: try again"),
            ),
        )?;
        return Ok(());
    };
    answer(server, &mut tls, &line, role, peer).map_err(Refusal::Authenticated)
}

/// Answers an authenticated client's request `line`.
fn answer(
    server: &Server,
    tls: &mut Tls,
    line: &[u8],
    role: nodeapi::Role,
    peer: &str,
) -> Result<()> {
    let request = match proto::parse_request(line) {
        Ok(r) => r,
        Err(e) => return finish(tls, failed(ErrorCode::BadRequest, format!("{e:#}"))),
    };
    say(format!("api: {peer} ({}): {}", role.name(), request.name()));
    if !role.may(request.op()) {
        return finish(
            tls,
            failed(
                ErrorCode::Forbidden,
                format!(
                    "the role {} may not call {}: ask for a certificate of a role that may \
                     (docs/node-api.md)",
                    role.name(),
                    request.name()
                ),
            ),
        );
    }
    if let Request::Status {} = request {
        let event = match status(server) {
            Ok(s) => done("status", s, false),
            Err(e) => failed(ErrorCode::Failed, format!("{e:#}")),
        };
        return finish(tls, event);
    }
    if let Request::Cancel {} = request {
        return finish(tls, cancel(server));
    }
    let Some(_op) = server.begin(request.name()) else {
        let now = server
            .current()
            .unwrap_or_else(|| "another operation".into());
        return finish(
            tls,
            failed(
                ErrorCode::Busy,
                format!("the node is busy with {now}: try again when it has ended"),
            ),
        );
    };
    let (event, then) = match operate(server, &request, tls) {
        Ok(r) => r,
        Err(e) => (failed(ErrorCode::Failed, format!("{e:#}")), None),
    };
    server.ended(request.name(), &event);
    // An accepted reboot or power-off happens whether or not the client
    // is still there to read the answer (a client gone before the last
    // event left an armed upgrade waiting for the next unrelated reboot).
    let answered = finish(tls, event);
    if let Some(action) = then {
        power::request(action);
    }
    answered
}

/// One of the [`MAX_SERVING`] places for a request being answered,
/// given back when dropped.
struct Serving<'a>(&'a AtomicUsize);

impl<'a> Serving<'a> {
    fn take(count: &'a AtomicUsize) -> Option<Serving<'a>> {
        let taken = count.fetch_add(1, Ordering::SeqCst);
        let place = Serving(count);
        (taken < MAX_SERVING).then_some(place)
    }
}

impl Drop for Serving<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Server {
    /// Forgets pending connection `id` (served, or ended).
    fn unpend(&self, id: u64) {
        if let Ok(mut pending) = self.pending.lock() {
            pending.remove(id);
        }
    }

    /// Counts a connection that ended before its request; says the count
    /// on the console at most every [`REFUSALS_SAID_EVERY`].
    fn refusal(&self, why: &anyhow::Error) {
        self.refused_total.fetch_add(1, Ordering::SeqCst);
        let Ok(mut r) = self.refused.lock() else {
            return;
        };
        r.0 += 1;
        let now = Instant::now();
        if r.1
            .is_none_or(|t| now.duration_since(t) >= REFUSALS_SAID_EVERY)
        {
            say(format!(
                "api: {} connection(s) closed before a request: no valid client \
                 certificate, too slow (over {} s), or closed for a newer one \
                 (at most {MAX_PENDING} wait); the last: {}",
                r.0,
                HANDSHAKE_TIMEOUT.as_secs(),
                contract::text::sanitise(&format!("{why:#}"))
            ));
            *r = (0, Some(now));
        }
    }

    /// Takes the operation slot for `name`, unless an operation holds it.
    fn begin(&self, name: &'static str) -> Option<Operation<'_>> {
        let mut op = self.operation.lock().ok()?;
        if op.is_some() {
            return None;
        }
        *op = Some(OpState { name, step: None });
        self.cancel.store(false, Ordering::SeqCst);
        self.writing.store(false, Ordering::SeqCst);
        Some(Operation(&self.operation))
    }

    /// The operation in progress and its last step (`upgrade: 12.0 of
    /// 80.0 MiB of the payload`), for status and `busy` answers.
    fn current(&self) -> Option<String> {
        let op = self.operation.lock().ok()?;
        op.as_ref().map(|o| match &o.step {
            Some(step) => format!("{}: {step}", o.name),
            None => o.name.to_string(),
        })
    }

    /// Records the step the operation in progress is at.
    fn step(&self, step: &str) {
        if let Ok(mut op) = self.operation.lock()
            && let Some(o) = op.as_mut()
        {
            o.step = Some(step.to_string());
        }
    }

    /// Records how operation `name` ended, for status.
    fn ended(&self, name: &str, event: &Event) {
        if let Some(outcome) = proto::outcome(name, event)
            && let Ok(mut o) = self.last_outcome.lock()
        {
            *o = Some(outcome);
        }
    }
}

/// Runs a changing operation; its last event, and the power action that
/// follows it once the answer is sent.
fn operate(
    server: &Server,
    request: &Request,
    tls: &mut Tls,
) -> Result<(Event, Option<power::Action>)> {
    let node = &server.node;
    Ok(match request {
        Request::Reboot {} => (
            done("rebooting", status(server)?, true),
            Some(power::Action::Reboot),
        ),
        Request::PowerOff {} => (
            done("powering off", status(server)?, true),
            Some(power::Action::PowerOff),
        ),
        Request::Rollback { allow_downgrade } => {
            proto::write_line(
                tls,
                &Event::progress("rollback", "making the other slot the default"),
            )?;
            match node.disk.rollback(*allow_downgrade) {
                Ok(r) => {
                    say(format!(
                        "api: rolled back: slot {} ({}) boots next; rebooting",
                        r.to, r.version
                    ));
                    (
                        done(
                            &format!(
                                "rolled back from slot {} to slot {} ({}); rebooting",
                                r.from, r.to, r.version
                            ),
                            status(server)?,
                            true,
                        ),
                        Some(power::Action::Reboot),
                    )
                }
                Err(e) => (failed(ErrorCode::Refused, format!("{e:#}")), None),
            }
        }
        Request::Upgrade {
            image,
            stage,
            preserve,
            tries,
            version,
            allow_downgrade,
            deadline,
            stall,
            credentials,
        } => {
            let credentials = match credentials.as_ref().map(pull::credentials).transpose() {
                Ok(c) => c,
                Err(e) => return Ok((failed(ErrorCode::BadRequest, format!("{e:#}")), None)),
            };
            let pull = pull::Pull {
                credentials,
                image: image.clone(),
                version: version.clone(),
                allow_downgrade: *allow_downgrade,
                plain_http: node.plain_http.clone(),
                started: Instant::now(),
                deadline: Duration::from_secs(u64::from(
                    deadline.unwrap_or(proto::DEFAULT_PULL_DEADLINE),
                )),
                stall: Duration::from_secs(u64::from(stall.unwrap_or(proto::DEFAULT_PULL_STALL))),
                cancel: server.cancel.clone(),
            };
            return upgrade(
                server,
                pull,
                tries.unwrap_or(proto::DEFAULT_TRIES),
                *preserve,
                *stage,
                tls,
            );
        }
        Request::Arm {} => {
            let taken = server.staged.lock().ok().and_then(|mut s| s.take());
            let Some(s) = taken else {
                return Ok((
                    failed(
                        ErrorCode::Refused,
                        "nothing is staged: stage an upgrade first (`imager node upgrade \
                         --stage`); nothing was written"
                            .into(),
                    ),
                    None,
                ));
            };
            let mut progress = |step: &str, message: String| tell(tls, "arm", step, message);
            progress(
                "write",
                format!(
                    "arming slot {} with {} ({} tries)",
                    s.target, s.staged.payload.version, s.tries
                ),
            );
            return switch(server, s.staged, s.tries, s.preserve, &mut progress);
        }
        Request::Credentials { ca, cert, key } => {
            let peer: Vec<_> = tls.conn.peer_certificates().unwrap_or_default().to_vec();
            match replace_credentials(server, ca, cert, &key.0, &peer) {
                Ok(message) => {
                    say(format!("api: {message}"));
                    (done(&message, status(server)?, false), None)
                }
                Err(e) => (failed(ErrorCode::Refused, format!("{e:#}")), None),
            }
        }
        Request::Status {} => (done("status", status(server)?, false), None),
        // Answered before the operation slot is taken (it stops the
        // operation that holds it).
        Request::Cancel {} => (cancel(server), None),
    })
}

/// Replaces the node's credentials with `ca`, `cert` and `key` once they
/// are checked: the certificate valid under `ca` for every name and
/// address the current one is for, the key its key, and the client asking
/// (`peer`, its chain) still trusted under `ca`. Written to META in one
/// write (a cut keeps the old credentials or the new), then taken by the
/// connections after this one; the revocations and the clock's floor stay.
fn replace_credentials(
    server: &Server,
    ca: &str,
    cert: &str,
    key: &str,
    peer: &[rustls::pki_types::CertificateDer<'static>],
) -> Result<String> {
    let meta = server.node.disk.status()?.meta;
    let (_, old_cert, _) = credentials(&meta).context("the node has no credentials to replace")?;
    let names = nodeapi::tls::server_names(old_cert.as_bytes())?;
    anyhow::ensure!(
        !names.is_empty(),
        "the node's certificate names no DNS name or address"
    );
    for name in &names {
        nodeapi::tls::check_node(ca.as_bytes(), cert.as_bytes(), key.as_bytes(), name)
            .with_context(|| "the new credentials; nothing was written".to_string())?;
    }
    nodeapi::tls::check_client(ca.as_bytes(), peer).context("nothing was written")?;
    let config = nodeapi::tls::server_config(
        ca.as_bytes(),
        cert.as_bytes(),
        key.as_bytes(),
        &tls_policy(&meta),
    )?;
    server.node.disk.set_credentials(ca, cert, key)?;
    *server
        .config
        .lock()
        .map_err(|_| anyhow::anyhow!("the TLS configuration's lock is poisoned"))? = config;
    let cas = nodeapi::tls::certs(ca.as_bytes(), "CA certificates")?.len();
    Ok(format!(
        "credentials replaced: a certificate for {} under {cas} CA certificate(s), taken from \
         the next connection",
        names.join(", ")
    ))
}

/// An upgrade from a registry ([`pull`]): pulled and verified before the
/// first write, then written as `imager upgrade` writes it, then a reboot
/// into the new slot. Nothing needs stopping or unmounting first: the
/// runtime runs no workloads, and BOOT and META are never mounted (the
/// staged files on EPHEMERAL stay mounted until the reboot unmounts them).
fn upgrade(
    server: &Server,
    request: pull::Pull,
    tries: u32,
    preserve: bool,
    stage: bool,
    tls: &mut Tls,
) -> Result<(Event, Option<power::Action>)> {
    let node = &server.node;
    let meta = node.disk.status()?.meta;
    let mut progress = |step: &str, message: String| {
        server.step(&message);
        tell(tls, "upgrade", step, message)
    };
    let staged = match pull_watched(server, request, meta, &mut progress) {
        Ok(s) => s,
        Err(e) => {
            return Ok((
                failed(ErrorCode::Refused, {
                    let m = format!("{e:#}");
                    if m.contains("nothing was written") {
                        m
                    } else {
                        format!("{m}; nothing was written")
                    }
                }),
                None,
            ));
        }
    };
    if stage {
        progress(
            "write",
            format!(
                "writing {} into the other slot, not armed (--stage)",
                staged.payload.version
            ),
        );
        return Ok(match node.disk.stage(&staged.payload, staged.epoch) {
            Ok(st) => {
                let message = format!(
                    "staged {} in slot {} ({} bytes written), signed by {}, image {}; `arm` \
                     makes it boot next",
                    staged.payload.version,
                    st.target,
                    st.bytes_written,
                    staged.key_id,
                    staged.digest
                );
                say(format!("api: {message}"));
                if let Ok(mut s) = server.staged.lock() {
                    *s = Some(StagedUpgrade {
                        staged,
                        tries,
                        preserve,
                        target: st.target,
                    });
                }
                (done(&message, status(server)?, false), None)
            }
            Err(e) => (
                Event::Failed {
                    code: ErrorCode::Failed,
                    message: format!("{e:#}; the slot in use still boots"),
                    written: true,
                },
                None,
            ),
        });
    }
    // A new upgrade replaces what was staged.
    if let Ok(mut s) = server.staged.lock() {
        *s = None;
    }
    progress(
        "write",
        format!(
            "installing {} into the other slot ({tries} tries)",
            staged.payload.version
        ),
    );
    switch(server, staged, tries, preserve, &mut progress)
}

/// Runs `request`'s pull in a thread of its own, passing its steps to
/// `progress`, and waits for it; leaves it, with nothing written, when an
/// operator cancels it or its deadline passes (its thread then ends at its
/// next read: [`pull::Pull::cancel`]).
fn pull_watched(
    server: &Server,
    request: pull::Pull,
    meta: Meta,
    progress: &mut dyn FnMut(&str, String),
) -> Result<pull::Staged> {
    if server.pulling.fetch_add(1, Ordering::SeqCst) >= MAX_PULLS {
        server.pulling.fetch_sub(1, Ordering::SeqCst);
        bail!(
            "{MAX_PULLS} pulls are still running (those cancelled end at their next read or \
             their deadline): try again later"
        );
    }
    let (started, deadline, stall) = (request.started, request.deadline, request.stall);
    let cancel = request.cancel.clone();
    let pulling = server.pulling.clone();
    let keep = server.staged.lock().ok().and_then(|s| {
        s.as_ref().and_then(|s| {
            s.staged
                .payload
                .kernel
                .path
                .parent()
                .map(std::path::Path::to_path_buf)
        })
    });
    pull::remove_stale(keep.as_deref());
    let staging = pull::staging_dir(server.pulls.fetch_add(1, Ordering::SeqCst));
    let (tx, rx) = std::sync::mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name("pull".into())
        .spawn(move || {
            let steps = tx.clone();
            let mut say = |step: &str, m: String| {
                let _ = steps.send(Said::Step(step.to_string(), m));
            };
            let r = pull::pull(&request, &meta, &staging, &mut say);
            pulling.fetch_sub(1, Ordering::SeqCst);
            let _ = tx.send(Said::Done(Box::new(r)));
        });
    if let Err(e) = spawned {
        server.pulling.fetch_sub(1, Ordering::SeqCst);
        return Err(e).context("starting the pull");
    }
    let r = wait_for_pull(&rx, (started, deadline, stall), &cancel, progress);
    // Past its pull, an upgrade writes (or ends): a cancel no longer stops it.
    server.writing.store(true, Ordering::SeqCst);
    r
}

/// Waits for the pull thread's result on `rx`, passing its steps on;
/// leaves when `cancel` is set or the deadline has passed.
fn wait_for_pull(
    rx: &std::sync::mpsc::Receiver<Said>,
    (started, deadline, stall): (Instant, Duration, Duration),
    cancel: &AtomicBool,
    progress: &mut dyn FnMut(&str, String),
) -> Result<pull::Staged> {
    loop {
        if cancel.load(Ordering::SeqCst) {
            bail!("cancelled by an operator while pulling");
        }
        match rx.recv_timeout(Duration::from_secs(1)) {
            Ok(Said::Step(step, m)) => progress(&step, m),
            Ok(Said::Done(r)) => return *r,
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                bail!("the pull ended without a result")
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
        }
        // The pull's own bounds end it; this one also covers a registry
        // that never answers the first request (stall + a margin).
        if started.elapsed() > deadline + stall + Duration::from_secs(5) {
            cancel.store(true, Ordering::SeqCst);
            bail!("{}", pull::past_deadline(deadline));
        }
    }
}

/// What a pull thread says: a step, then its result.
enum Said {
    Step(String, String),
    Done(Box<Result<pull::Staged>>),
}

/// `cancel`: stops the upgrade in progress while it pulls (nothing is
/// written, the lock is free once it has stopped); one that is writing
/// finishes, and the answer says so.
fn cancel(server: &Server) -> Event {
    let what = server.current();
    let Some(what) = what else {
        return failed(
            ErrorCode::Refused,
            "nothing is in progress: there is nothing to cancel".into(),
        );
    };
    if !what.starts_with("upgrade") || server.writing.load(Ordering::SeqCst) {
        return failed(
            ErrorCode::Refused,
            format!("{what} is not pulling: only an upgrade's pull can be cancelled; it finishes"),
        );
    }
    server.cancel.store(true, Ordering::SeqCst);
    say(format!("api: cancel: cancelling {what}"));
    // The operation sees the flag within a second and ends.
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.current().is_some() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    match (server.current(), status(server)) {
        (None, Ok(s)) => done(
            "cancelled the upgrade while it pulled: nothing was written; the node is free",
            s,
            false,
        ),
        (Some(now), _) => failed(
            ErrorCode::Failed,
            format!("asked {now} to stop, but it has not within 10 s"),
        ),
        (None, Err(e)) => failed(ErrorCode::Failed, format!("{e:#}")),
    }
}

/// The upgrade's writes (or the arming of a staged one, whose files are
/// found in place), then the reboot into the new slot; with `preserve`
/// false, META's `wipe-ephemeral` after the switch.
fn switch(
    server: &Server,
    staged: pull::Staged,
    tries: u32,
    preserve: bool,
    progress: &mut dyn FnMut(&str, String),
) -> Result<(Event, Option<power::Action>)> {
    let node = &server.node;
    match node
        .disk
        .upgrade(&staged.payload, staged.loader.as_ref(), staged.epoch, tries)
    {
        Ok(up) => {
            // After the switch, so that a refused or failed upgrade never
            // costs /var (a cut between the two leaves /var kept).
            if !preserve {
                let why = format!("upgrade to {} slot {}", staged.payload.version, up.to);
                if let Err(e) = node.disk.set_wipe_ephemeral(Some(&why)) {
                    return Ok((
                        Event::Failed {
                            code: ErrorCode::Failed,
                            message: format!(
                                "slot {} has {} armed, but asking the next boot to wipe \
                                 EPHEMERAL failed: {e:#}; not rebooting",
                                up.to, staged.payload.version
                            ),
                            written: true,
                        },
                        None,
                    ));
                }
                progress(
                    "write",
                    "EPHEMERAL (/var) is wiped at the next boot (--preserve=false)".into(),
                );
            }
            let message = format!(
                "upgraded from {} (slot {}) to {} (slot {}), signed by {}, image {}; rebooting \
                 into slot {}",
                up.from_version,
                up.from,
                staged.payload.version,
                up.to,
                staged.key_id,
                staged.digest,
                up.to
            );
            say(format!("api: {message}"));
            Ok((
                done(&message, status(server)?, true),
                Some(power::Action::Reboot),
            ))
        }
        Err(e) => Ok((
            Event::Failed {
                code: ErrorCode::Failed,
                message: format!("{e:#}"),
                written: true,
            },
            None,
        )),
    }
}

/// A step of operation `op`, on the console and to the client (a client
/// gone away does not stop the operation).
fn tell(tls: &mut Tls, op: &str, step: &str, message: String) {
    say(format!("api: {op}: {message}"));
    let _ = proto::write_line(tls, &Event::progress(step, message));
}

fn done(message: &str, status: Status, reboot: bool) -> Event {
    Event::Done {
        message: message.to_string(),
        status: Box::new(status),
        reboot,
    }
}

fn failed(code: ErrorCode, message: String) -> Event {
    Event::Failed {
        code,
        message,
        written: false,
    }
}

/// Sends the last event and closes the connection cleanly.
fn finish(tls: &mut Tls, event: Event) -> Result<()> {
    proto::write_line(tls, &event)?;
    tls.conn.send_close_notify();
    tls.conn
        .complete_io(&mut tls.sock)
        .context("closing the connection")?;
    if let Event::Failed { code, message, .. } = &event {
        say(format!("api: answered {}: {message}", code.name()));
    }
    Ok(())
}

/// The node's status: the disk's slot state read now.
fn status(server: &Server) -> Result<Status> {
    let node = &server.node;
    let st = node.disk.status()?;
    let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .context("reading the boot id")?
        .trim()
        .to_string();
    if boot_id.is_empty() {
        bail!("the kernel gave an empty boot id");
    }
    let staged = server.staged.lock().ok().and_then(|s| {
        s.as_ref()
            .map(|s| (s.target, s.staged.payload.version.clone()))
    });
    let slots = Slot::ALL
        .into_iter()
        .map(|slot| {
            let best = contract::state::best_entry(&st.entries, slot);
            let (status, version) = slot_said(&st.state, slot, best.is_some(), staged.as_ref());
            SlotStatus {
                slot: slot.to_string(),
                status,
                version,
                tries_left: best.and_then(|e| e.tries).map(|t| t.left),
                tries_done: best.and_then(|e| e.tries).map(|t| t.done),
            }
        })
        .collect();
    Ok(Status {
        boot_id,
        name: node.name.clone(),
        version: node.version.clone(),
        booted_slot: node.slot.to_string(),
        ready: true,
        default_slot: st.state.default.to_string(),
        next_boot: st.next_boot().map(|e| e.slot.to_string()),
        slots,
        pending_upgrade: st.state.pending.as_ref().map(|p| p.render()),
        staged: staged.map(|(target, version)| format!("{version} in slot {target}")),
        operation: server.current(),
        last_outcome: server.last_outcome.lock().ok().and_then(|o| o.clone()),
        refused_connections: server.refused_total.load(Ordering::SeqCst),
        last_event: st.state.history.last().cloned(),
        secure_boot: secureboot::state().as_str().to_string(),
        uptime: crate::stage2::uptime().unwrap_or_default(),
        runtime_peak_rss_kib: peak_rss_kib(),
    })
}

/// What status says of `slot`: (status, version). META's record, unless
/// the files on BOOT say otherwise: the slot a staged upgrade wrote holds
/// the staged version (`staged`), and a slot META calls good or pending
/// whose boot entries are gone (a stage forgotten by a reboot, a cut
/// upgrade) boots nothing (`unbootable`). docs/node-api.md lists them.
fn slot_said(
    state: &contract::state::BootState,
    slot: Slot,
    has_entry: bool,
    staged: Option<&(Slot, String)>,
) -> (String, String) {
    use contract::meta::SlotStatus as S;
    match staged {
        Some((target, version)) if *target == slot => ("staged".into(), version.clone()),
        _ => {
            let status = state.status(slot);
            let name = if matches!(status, S::Good | S::Pending) && !has_entry {
                "unbootable"
            } else {
                status.name()
            };
            (name.to_string(), state.version(slot).to_string())
        }
    }
}

/// This process's peak resident memory (`VmHWM` of /proc/self/status).
fn peak_rss_kib() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/status").ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse().ok())
}
