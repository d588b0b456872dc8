//! The node API's messages: JSON, one object per line, over the TLS
//! connection of [`crate::tls`].
//!
//! A client opens a connection, sends one [`Request`] line and reads
//! [`Event`] lines until the last one, [`Event::Done`] or
//! [`Event::Failed`]; then the server closes the connection. Every line is
//! at most [`MAX_LINE`] bytes, every string in it bounded; a line that is
//! longer, not UTF-8, not JSON, or has unknown fields is refused
//! (docs/node-api.md has the schema with examples).

use crate::role::Op;
use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use std::io::{BufRead, Write};

/// The TCP port the node API listens on (Talos's apid port).
pub const PORT: u16 = 50000;
/// Connections a node keeps that have not sent their request yet (the TLS
/// handshake and the request line: anyone can open one); a newcomer
/// closes the oldest of them.
pub const MAX_PENDING: usize = 16;
/// Of those, the most one address may hold: its newcomer closes its own
/// oldest, so a flooding address never closes another's.
pub const MAX_PENDING_PER_PEER: usize = 8;
/// Requests a node answers at once; more are answered `busy`.
pub const MAX_SERVING: usize = 8;
/// How long a connection may take, in all, to finish the TLS handshake and
/// send its request, however slowly its bytes arrive.
pub const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// The longest line either end sends or accepts, newline included.
pub const MAX_LINE: usize = 64 * 1024;
/// The longest image reference a request may name.
pub const MAX_IMAGE_REF: usize = 1024;
/// Boots an upgraded slot is tried before the boot loader falls back, when
/// the request names none (as `imager upgrade`).
pub const DEFAULT_TRIES: u32 = 3;
/// A pull's deadline, in seconds, when the request names none: the whole
/// pull (manifest and layers) ends by then, however its bytes arrive (a
/// registry that drips one byte every few seconds cannot hold the node's
/// operation for longer).
pub const DEFAULT_PULL_DEADLINE: u32 = 1800;
/// The longest deadline a request may ask for, in seconds.
pub const MAX_PULL_DEADLINE: u32 = 6 * 3600;
/// A pull's stall limit, in seconds, when the request names none: a read
/// that waits this long for a byte ends the pull.
pub const DEFAULT_PULL_STALL: u32 = 30;
/// The stall limits a request may ask for, in seconds: at most 100, below
/// the client's 120 s read timeout, so that a stalled pull ends (or sends
/// progress) before its client gives up.
pub const PULL_STALL_RANGE: std::ops::RangeInclusive<u32> = 5..=100;
/// Pull threads a node runs at most: the current pull's and those a cancel
/// or a deadline left (each ends at its next read, or at its registry
/// requests' deadline); a pull beyond is refused.
pub const MAX_PULLS: usize = 3;
/// The step of the `progress` event an upgrade sends once its signed
/// manifest is verified and fits the disk (the system, the version asked
/// for, the security floor): `imager node upgrade` without `--wait`
/// returns there, and the node goes on without it.
pub const ACCEPTED: &str = "accepted";

/// How an operation ended, as `status` reports it in `last_outcome`:
/// `NAME: done: …`, `NAME: done (rebooting): …` when a reboot is still to
/// come, or `NAME: CODE: …` when it was refused or failed. `None` for a
/// progress event (not an end). [`Outcome::of`] reads it back.
pub fn outcome(name: &str, last: &Event) -> Option<String> {
    Some(match last {
        Event::Done {
            message,
            reboot: true,
            ..
        } => format!("{name}: {DONE_REBOOTING}: {message}"),
        Event::Done { message, .. } => format!("{name}: {DONE}: {message}"),
        Event::Failed { code, message, .. } => format!("{name}: {}: {message}", code.name()),
        Event::Progress { .. } => return None,
    })
}

const DONE: &str = "done";
const DONE_REBOOTING: &str = "done (rebooting)";

/// What an [`outcome`] says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Done,
    /// Done, and the node reboots to finish it.
    Rebooting,
    /// Refused or failed.
    NotDone,
}

impl Outcome {
    pub fn of(outcome: &str) -> Outcome {
        match outcome.split(": ").nth(1) {
            Some(DONE) => Outcome::Done,
            Some(DONE_REBOOTING) => Outcome::Rebooting,
            _ => Outcome::NotDone,
        }
    }
}
/// How often, at most, a pull reports its progress (bytes done and total)
/// to the client and in status.
pub const PROGRESS_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// What a client asks for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Request {
    /// The node's state ([`Status`]). (Variants without values are
    /// empty structs, so that unknown fields are refused in them too.)
    Status {},
    /// Pull the installer image `image` from its registry, verify it, and
    /// install it into the inactive slot; armed (tried at the next boot)
    /// and rebooted into, unless `stage`: then written but not armed
    /// ([`Request::Arm`] arms it later).
    Upgrade {
        image: String,
        #[serde(default)]
        stage: bool,
        /// Keep EPHEMERAL (`/var`); false wipes it at the next boot.
        #[serde(default = "yes")]
        preserve: bool,
        #[serde(default)]
        tries: Option<u32>,
        /// The version the signed payload must be (`--version`, else what
        /// the reference's tag names: `contract::version`); another is
        /// refused before anything is written.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        version: Option<String>,
        /// A payload of a lower security version than the node's floor is
        /// installed this once (admin only).
        #[serde(default, skip_serializing_if = "is_false")]
        allow_downgrade: bool,
        /// The pull's deadline in seconds ([`DEFAULT_PULL_DEADLINE`], at
        /// most [`MAX_PULL_DEADLINE`]).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        deadline: Option<u32>,
        /// The pull's stall limit in seconds ([`DEFAULT_PULL_STALL`],
        /// within [`PULL_STALL_RANGE`]).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        stall: Option<u32>,
        /// Credentials for the image's registry, for this pull only: held
        /// in memory while it runs, never written to the disk, logged or
        /// shown ([`PullCredentials`]).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        credentials: Option<PullCredentials>,
    },
    /// Cancel the upgrade in progress while it pulls: the lock is released
    /// and the slots stay as they were. One that writes already finishes.
    Cancel {},
    /// Arm the slot a staged upgrade wrote, and reboot into it.
    Arm {},
    /// Make the other slot the default and reboot into it; one of a lower
    /// security version than the node's floor only with `allow_downgrade`
    /// (admin only).
    Rollback {
        #[serde(default, skip_serializing_if = "is_false")]
        allow_downgrade: bool,
    },
    Reboot {},
    PowerOff {},
    /// Replace the node's own credentials (admin only), for the
    /// connections after this one: `ca`, the CA certificates its clients
    /// must chain to (during a CA rollover the new and the old one,
    /// docs/node-api.md "Credentials that expire and renew"), `cert` its
    /// certificate (valid under `ca` for every name and address the one it
    /// replaces is) and `key` its key. Refused when the client asking would
    /// not be trusted under `ca`; written to META in one write.
    Credentials {
        ca: String,
        cert: String,
        key: NodeKey,
    },
}

/// A node's private key (PEM) on its way to the node: `Debug` never shows
/// it.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct NodeKey(pub String);

impl std::fmt::Debug for NodeKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NodeKey(hidden)")
    }
}

/// The longest user name, password or token a request may carry (ECR's
/// passwords, the longest registries issue, are about 2.5 KiB).
pub const MAX_CREDENTIAL: usize = 8 * 1024;

/// Registry credentials an operator sends with an upgrade: a user name and
/// a password (or a token used as one), or an identity token (an OAuth2
/// refresh token). `Debug` shows the user name only.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PullCredentials {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity_token: Option<String>,
}

impl std::fmt::Debug for PullCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PullCredentials")
            .field("username", &self.username)
            .field("secret", &"(hidden)")
            .finish()
    }
}

impl PullCredentials {
    /// Checks the shape: a user name and a password, or an identity token
    /// alone; each within [`MAX_CREDENTIAL`], without control characters,
    /// a user name without `:`. Messages never quote them.
    pub fn check(&self) -> Result<()> {
        let fields = [&self.username, &self.password, &self.identity_token];
        for v in fields.into_iter().flatten() {
            if v.is_empty() || v.len() > MAX_CREDENTIAL || v.chars().any(char::is_control) {
                bail!(
                    "the registry credentials must be 1 to {MAX_CREDENTIAL} bytes each, without \
                     control characters"
                );
            }
        }
        match (&self.username, &self.password, &self.identity_token) {
            (Some(u), Some(_), None) if !u.contains(':') => Ok(()),
            (Some(_), Some(_), None) => bail!("a registry user name may not contain ':'"),
            (None, None, Some(_)) => Ok(()),
            _ => bail!(
                "registry credentials are a user name and a password, or an identity token alone"
            ),
        }
    }
}

fn yes() -> bool {
    true
}

fn is_false(v: &bool) -> bool {
    !v
}

impl Request {
    /// What the request does, for the role check.
    pub fn op(&self) -> Op {
        match self {
            Request::Status {} => Op::Status,
            Request::Upgrade {
                preserve,
                allow_downgrade,
                ..
            } => Op::Upgrade {
                wipe: !preserve,
                downgrade: *allow_downgrade,
            },
            Request::Arm {} => Op::Arm,
            Request::Cancel {} => Op::Cancel,
            Request::Rollback { allow_downgrade } => Op::Rollback {
                downgrade: *allow_downgrade,
            },
            Request::Reboot {} => Op::Reboot,
            Request::PowerOff {} => Op::PowerOff,
            Request::Credentials { .. } => Op::Credentials,
        }
    }

    /// The request's name, as on the wire (`status`, `upgrade`, …).
    pub fn name(&self) -> &'static str {
        match self {
            Request::Status {} => "status",
            Request::Upgrade { .. } => "upgrade",
            Request::Arm {} => "arm",
            Request::Rollback { .. } => "rollback",
            Request::Cancel {} => "cancel",
            Request::Reboot {} => "reboot",
            Request::PowerOff {} => "power-off",
            Request::Credentials { .. } => "credentials",
        }
    }

    /// Checks the values a request carries (beyond their types).
    pub fn check(&self) -> Result<()> {
        if let Request::Credentials { ca, cert, key } = self {
            for (what, text) in [("CA", ca), ("certificate", cert), ("key", &key.0)] {
                if text.is_empty() || text.len() > crate::tls::MAX_PEM {
                    bail!(
                        "the node's {what} must be 1 to {} bytes of PEM",
                        crate::tls::MAX_PEM
                    );
                }
            }
        }
        if let Request::Upgrade {
            image,
            tries,
            version,
            deadline,
            stall,
            credentials,
            ..
        } = self
        {
            if let Some(c) = credentials {
                c.check()?;
            }
            if let Some(d) = deadline
                && !(1..=MAX_PULL_DEADLINE).contains(d)
            {
                bail!("the pull's deadline must be 1 to {MAX_PULL_DEADLINE} seconds");
            }
            if let Some(s) = stall
                && !PULL_STALL_RANGE.contains(s)
            {
                bail!(
                    "the pull's stall limit must be {} to {} seconds",
                    PULL_STALL_RANGE.start(),
                    PULL_STALL_RANGE.end()
                );
            }
            if let Some(v) = version {
                contract::version::check(v)
                    .map_err(|why| anyhow::anyhow!("the version asked for, {why}"))?;
            }
            if image.is_empty() || image.len() > MAX_IMAGE_REF {
                bail!("the image reference is empty or over {MAX_IMAGE_REF} bytes");
            }
            if image.chars().any(|c| c.is_whitespace() || c.is_control()) {
                bail!("the image reference has spaces or control characters");
            }
            if let Some(t) = tries
                && !(1..=contract::boot::MAX_TRIES).contains(t)
            {
                bail!(
                    "tries must be 1 to {} (boots of the new slot before the boot loader \
                     falls back)",
                    contract::boot::MAX_TRIES
                );
            }
        }
        Ok(())
    }
}

/// What the server says, line after line; the last is `Done` or `Failed`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Event {
    /// A step of the operation began or advanced. `done` and `total` count
    /// bytes (or steps) when known.
    Progress {
        step: String,
        message: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        done: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        total: Option<u64>,
    },
    /// The operation succeeded. `status` is the node's state after it;
    /// `reboot`: the node reboots (or powers off) now.
    Done {
        message: String,
        status: Box<Status>,
        #[serde(default)]
        reboot: bool,
    },
    /// The operation was refused or failed; `written` says whether the disk
    /// was changed.
    Failed {
        code: ErrorCode,
        message: String,
        #[serde(default)]
        written: bool,
    },
}

impl Event {
    /// Whether this is the last event of a response.
    pub fn is_last(&self) -> bool {
        !matches!(self, Event::Progress { .. })
    }

    pub fn progress(step: &str, message: impl Into<String>) -> Event {
        Event::Progress {
            step: step.to_string(),
            message: message.into(),
            done: None,
            total: None,
        }
    }
}

/// Why an operation did not happen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ErrorCode {
    /// Another operation is in progress; try again when it has ended.
    Busy,
    /// The client's role may not call this.
    Forbidden,
    /// The request did not parse or its values are out of range.
    BadRequest,
    /// The node refused it (untrusted payload, missing image, nothing to
    /// arm, …); nothing was written unless `written` says so.
    Refused,
    /// It failed on the way.
    Failed,
}

impl ErrorCode {
    pub fn name(self) -> &'static str {
        match self {
            ErrorCode::Busy => "busy",
            ErrorCode::Forbidden => "forbidden",
            ErrorCode::BadRequest => "bad-request",
            ErrorCode::Refused => "refused",
            ErrorCode::Failed => "failed",
        }
    }
}

/// The node's state, as `status` reports it. Unknown fields are passed
/// over (unlike requests'), so that a newer node can say more to an older
/// client; a field added later has a default.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    /// The kernel's boot id (`/proc/sys/kernel/random/boot_id`): new at
    /// every boot.
    pub boot_id: String,
    /// The system's name (META's image name) and running version.
    pub name: String,
    pub version: String,
    /// The slot this boot runs from (`A` or `B`).
    pub booted_slot: String,
    /// The runtime reported ready (the API answers only after that, so
    /// always true in an answer; kept for clients).
    pub ready: bool,
    /// META's default slot.
    pub default_slot: String,
    /// The slot the boot loader boots next, if any.
    pub next_boot: Option<String>,
    pub slots: Vec<SlotStatus>,
    /// The upgrade on trial (`A 0.1.0 -> B 0.2.0`), if any.
    pub pending_upgrade: Option<String>,
    /// A staged upgrade waiting for `arm`: the slot and version written.
    pub staged: Option<String>,
    /// The operation in progress (`upgrade`, …), if any.
    pub operation: Option<String>,
    /// The last line of META's history (the last upgrade, fallback,
    /// rollback or blessing), which says why a node runs the slot it runs.
    pub last_event: Option<String>,
    /// `on`, `off` or `unknown`.
    pub secure_boot: String,
    /// Seconds since boot.
    pub uptime: String,
    /// The runtime's peak resident memory (machined's `VmHWM`), in KiB.
    pub runtime_peak_rss_kib: Option<u64>,
    /// How the last changing operation of this boot ended (`upgrade:
    /// refused: …`), if one did.
    #[serde(default)]
    pub last_outcome: Option<String>,
    /// Connections closed before their request since boot (no valid
    /// client certificate, too slow, closed for a newer one).
    #[serde(default)]
    pub refused_connections: u64,
}

/// One slot's state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlotStatus {
    pub slot: String,
    /// `good`, `trial`, `bad` or `empty` (META's record).
    pub status: String,
    pub version: String,
    /// Boots left and done on its entry, when it is counting.
    pub tries_left: Option<u32>,
    pub tries_done: Option<u32>,
}

/// Reads one line of at most [`MAX_LINE`] bytes, without its newline;
/// `None` at the end of the stream. A longer line is an error (what was
/// read of it is discarded).
pub fn read_line(r: &mut impl BufRead) -> Result<Option<Vec<u8>>> {
    let mut line = Vec::new();
    loop {
        let buf = r.fill_buf().context("reading from the connection")?;
        if buf.is_empty() {
            if line.is_empty() {
                return Ok(None);
            }
            bail!("the connection ended in the middle of a line");
        }
        let (take, end) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (i + 1, true),
            None => (buf.len(), false),
        };
        if line.len() + take > MAX_LINE {
            bail!("a line over {MAX_LINE} bytes: not a node API message");
        }
        line.extend_from_slice(&buf[..take]);
        r.consume(take);
        if end {
            line.pop();
            return Ok(Some(line));
        }
    }
}

/// Decodes a request line.
pub fn parse_request(line: &[u8]) -> Result<Request> {
    let r: Request = parse(line, "request")?;
    r.check()?;
    Ok(r)
}

/// Decodes an event line.
pub fn parse_event(line: &[u8]) -> Result<Event> {
    let e: Event = parse(line, "event")?;
    if let Event::Done { status, .. } = &e {
        check_status(status)?;
    }
    Ok(e)
}

fn parse<T: serde::de::DeserializeOwned>(line: &[u8], what: &str) -> Result<T> {
    if line.len() > MAX_LINE {
        bail!("the {what} is over {MAX_LINE} bytes");
    }
    let text = std::str::from_utf8(line).with_context(|| format!("the {what} is not UTF-8"))?;
    // serde quotes the input (an unknown op, whole): cut and escaped; and
    // never when the line carries registry credentials (a password put
    // where an object belongs would be quoted): then only the position.
    serde_json::from_str(text).map_err(|e| {
        if text.contains("credentials") {
            return anyhow::anyhow!(
                "the {what} is not valid (at line {}, column {}; its credentials are not shown)",
                e.line(),
                e.column()
            );
        }
        anyhow::anyhow!(
            "the {what} is not valid: {}",
            contract::text::sanitise(&e.to_string())
        )
    })
}

/// The bounds of a status a client accepts (its text goes to a terminal).
fn check_status(s: &Status) -> Result<()> {
    if s.slots.len() > 2 {
        bail!("the status lists more than two slots");
    }
    Ok(())
}

/// Writes `value` as one line and flushes.
pub fn write_line(w: &mut impl Write, value: &impl Serialize) -> Result<()> {
    let mut line = serde_json::to_vec(value).context("encoding a message")?;
    if line.len() >= MAX_LINE {
        bail!("a message over {MAX_LINE} bytes");
    }
    line.push(b'\n');
    w.write_all(&line).context("writing to the connection")?;
    w.flush().context("writing to the connection")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status() -> Status {
        Status {
            boot_id: "b7c0".into(),
            name: "metal".into(),
            version: "0.1.0".into(),
            booted_slot: "A".into(),
            ready: true,
            default_slot: "A".into(),
            next_boot: Some("A".into()),
            slots: vec![SlotStatus {
                slot: "A".into(),
                status: "good".into(),
                version: "0.1.0".into(),
                tries_left: None,
                tries_done: None,
            }],
            pending_upgrade: None,
            staged: None,
            operation: None,
            last_event: Some("blessed slot=A version=0.1.0".into()),
            secure_boot: "off".into(),
            uptime: "3.1".into(),
            runtime_peak_rss_kib: Some(4096),
            last_outcome: None,
            refused_connections: 0,
        }
    }

    #[test]
    fn requests_on_the_wire() {
        assert_eq!(
            parse_request(br#"{"op":"status"}"#).unwrap(),
            Request::Status {}
        );
        assert_eq!(
            parse_request(br#"{"op":"upgrade","image":"127.0.0.1:5000/metal/installer:0.2.0"}"#)
                .unwrap(),
            Request::Upgrade {
                image: "127.0.0.1:5000/metal/installer:0.2.0".into(),
                stage: false,
                preserve: true,
                tries: None,
                version: None,
                allow_downgrade: false,
                deadline: None,
                stall: None,
                credentials: None,
            }
        );
        assert_eq!(
            parse_request(br#"{"op":"cancel"}"#).unwrap().op(),
            Op::Cancel
        );
        // What an older client sends is what a newer node reads.
        assert_eq!(
            parse_request(br#"{"op":"rollback"}"#).unwrap().op(),
            Op::Rollback { downgrade: false }
        );
        assert_eq!(
            parse_request(br#"{"op":"rollback","allow_downgrade":true}"#)
                .unwrap()
                .op(),
            Op::Rollback { downgrade: true }
        );
        let mut plain = Vec::new();
        write_line(
            &mut plain,
            &Request::Rollback {
                allow_downgrade: false,
            },
        )
        .unwrap();
        assert_eq!(plain, b"{\"op\":\"rollback\"}\n");
        assert_eq!(
            parse_request(br#"{"op":"power-off"}"#).unwrap().op(),
            Op::PowerOff
        );
        let wipe = br#"{"op":"upgrade","image":"r/i:1","preserve":false}"#;
        assert_eq!(
            parse_request(wipe).unwrap().op(),
            Op::Upgrade {
                wipe: true,
                downgrade: false
            }
        );
        // Round trip.
        let r = Request::Upgrade {
            image: "r/i@sha256:00".into(),
            stage: true,
            preserve: false,
            tries: Some(2),
            version: Some("0.2.0".into()),
            allow_downgrade: true,
            deadline: Some(60),
            stall: Some(10),
            credentials: Some(PullCredentials {
                username: Some("ci".into()),
                password: Some("s3cret".into()),
                identity_token: None,
            }),
        };
        assert!(!format!("{r:?}").contains("s3cret"), "{r:?}");
        let mut out = Vec::new();
        write_line(&mut out, &r).unwrap();
        assert_eq!(out.last(), Some(&b'\n'));
        let line = read_line(&mut &out[..]).unwrap().unwrap();
        assert_eq!(parse_request(&line).unwrap(), r);
    }

    #[test]
    fn bad_requests_are_refused() {
        for bad in [
            &br#"{"op":"format-disk"}"#[..],
            br#"{"op":"status","x":1}"#,
            br#"{"op":"upgrade"}"#,
            br#"{"op":"upgrade","image":""}"#,
            br#"{"op":"upgrade","image":"a b"}"#,
            br#"{"op":"upgrade","image":"r/i:1","tries":0}"#,
            br#"{"op":"upgrade","image":"r/i:1","credentials":{"username":"u"}}"#,
            br#"{"op":"upgrade","image":"r/i:1","credentials":{"password":"p"}}"#,
            br#"{"op":"upgrade","image":"r/i:1","credentials":{"username":"a:b","password":"p"}}"#,
            br#"{"op":"upgrade","image":"r/i:1","credentials":{"username":"u","password":"p
"}}"#,
            br#"{"op":"upgrade","image":"r/i:1","credentials":{"username":"u","password":"p","identity_token":"t"}}"#,
            br#"{"op":"upgrade","image":"r/i:1","credentials":{"token":"t"}}"#,
            br#"{"op":"upgrade","image":"r/i:1","credentials":"Summer2024!"}"#,
            br#"{"op":"upgrade","image":"r/i:1","tries":100}"#,
            br#"{"op":"upgrade","image":"r/i:1","deadline":0}"#,
            br#"{"op":"upgrade","image":"r/i:1","deadline":21601}"#,
            br#"{"op":"upgrade","image":"r/i:1","stall":4}"#,
            br#"{"op":"upgrade","image":"r/i:1","stall":101}"#,
            br#"{"op":"cancel","now":true}"#,
            b"\xff",
            b"[]",
            b"",
        ] {
            assert!(
                parse_request(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        let long = format!(r#"{{"op":"upgrade","image":"{}"}}"#, "a".repeat(2000));
        assert!(parse_request(long.as_bytes()).is_err());
        // A secret in a malformed request is never in the refusal.
        for bad in [
            &br#"{"op":"upgrade","image":"r/i:1","credentials":"Summer2024!"}"#[..],
            br#"{"op":"upgrade","image":"r/i:1","credentials":{"username":"u","password":5,"x":"Summer2024!"}}"#,
        ] {
            let e = format!("{:#}", parse_request(bad).unwrap_err());
            assert!(!e.contains("Summer2024"), "{e}");
        }
    }

    /// serde's message quotes an unknown op whole: the refusal the node
    /// logs and sends back shows a short, escaped excerpt of it.
    #[test]
    fn a_refusal_quotes_the_request_short_and_escaped() {
        for op in ["\nmachined: ready\u{1b}[2J", &"y".repeat(60_000)] {
            let line = serde_json::json!({ "op": op }).to_string();
            let e = format!("{:#}", parse_request(line.as_bytes()).unwrap_err());
            assert!(e.contains("unknown variant"), "{e}");
            assert!(e.len() < 400 && !e.chars().any(char::is_control), "{e}");
        }
    }

    #[test]
    fn outcomes_read_back() {
        let s = Box::new(status());
        let done = |reboot| Event::Done {
            message: "ok: fine".into(),
            status: s.clone(),
            reboot,
        };
        let failed = Event::Failed {
            code: ErrorCode::Refused,
            message: "done: not really".into(),
            written: false,
        };
        let read = |e: &Event| Outcome::of(&outcome("upgrade", e).unwrap());
        assert_eq!(read(&done(false)), Outcome::Done);
        assert_eq!(read(&done(true)), Outcome::Rebooting);
        assert_eq!(read(&failed), Outcome::NotDone);
        assert_eq!(outcome("upgrade", &Event::progress("pull", "x")), None);
    }

    #[test]
    fn events_on_the_wire() {
        for e in [
            Event::progress("pull", "pulling"),
            Event::Done {
                message: "ok".into(),
                status: Box::new(status()),
                reboot: true,
            },
            Event::Failed {
                code: ErrorCode::Busy,
                message: "an upgrade is in progress".into(),
                written: false,
            },
        ] {
            let mut out = Vec::new();
            write_line(&mut out, &e).unwrap();
            let line = read_line(&mut &out[..]).unwrap().unwrap();
            assert_eq!(parse_event(&line).unwrap(), e);
        }
        let mut three = status();
        three.slots = vec![three.slots[0].clone(); 3];
        let e = Event::Done {
            message: "ok".into(),
            status: Box::new(three),
            reboot: false,
        };
        assert!(parse_event(&serde_json::to_vec(&e).unwrap()).is_err());
        assert!(parse_event(br#"{"event":"failed","code":"oops","message":""}"#).is_err());
        // A newer node's status may say more: the fields this client knows
        // are read, the others passed over; and an older node's lacks
        // `last_outcome`.
        let done = Event::Done {
            message: "ok".into(),
            status: Box::new(status()),
            reboot: false,
        };
        let mut v = serde_json::to_value(&done).unwrap();
        v["status"]["from_the_future"] = serde_json::json!(1);
        v["status"].as_object_mut().unwrap().remove("last_outcome");
        assert_eq!(parse_event(v.to_string().as_bytes()).unwrap(), done);
    }

    #[test]
    fn lines_are_bounded() {
        let mut two = b"{}\nabc".to_vec();
        let mut r = &two[..];
        assert_eq!(read_line(&mut r).unwrap().unwrap(), b"{}");
        assert!(read_line(&mut r).is_err(), "a cut line is an error");
        two.clear();
        assert_eq!(read_line(&mut &two[..]).unwrap(), None);
        let long = vec![b'a'; MAX_LINE + 1];
        assert!(read_line(&mut &long[..]).is_err());
        let mut fits = vec![b'a'; MAX_LINE - 1];
        fits.push(b'\n');
        assert_eq!(
            read_line(&mut &fits[..]).unwrap().unwrap().len(),
            MAX_LINE - 1
        );
    }
}
