//! Rolling operations across a fleet (`imager node upgrade` and `imager
//! node rollback` given several nodes): the nodes in the order given, the
//! first `canary` alone first, then the rest, at most `max_parallel` at a
//! time. A node counts as done only once it is back, ready and blessed on
//! the expected version (the health gate); at the first node that is not
//! (it refused, fell back, never came back), the rollout stops: nodes in
//! flight finish, nodes not yet started are left untouched, and every node
//! is reported. `continue_on_failure` goes on instead, explicitly, past
//! the canaries (a failed canary always stops the rollout). A node
//! already on the target version (and blessed) is skipped, so that a rerun
//! of the same command picks up where the last one stopped.
//!
//! [`rollout`] is the schedule alone (what runs when, what stops it);
//! [`operate`] is what one node goes through. docs/node-api.md, "Fleets".

use super::client::Client;
use anyhow::{Context, Result, bail};
use nodeapi::proto::{Event, Request, Status};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The most nodes one rollout takes.
pub const MAX_MEMBERS: usize = 1000;
/// The largest node list file read.
pub const MAX_LIST: u64 = 1 << 20;

/// A node of the fleet: `[SERVER_NAME@]HOST[:PORT]` (the name its
/// certificate is for, when it is not the host).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub node: String,
    pub server_name: Option<String>,
}

impl Member {
    pub fn parse(text: &str) -> Result<Member> {
        let (server_name, node) = match text.split_once('@') {
            Some((name, node)) => {
                contract::settings::check_domain_name(name).map_err(|e| {
                    anyhow::anyhow!("the node {}: {e}", contract::text::excerpt(text))
                })?;
                (Some(name.to_string()), node)
            }
            None => (None, text),
        };
        super::client::split_node(node)?;
        Ok(Member {
            node: node.to_string(),
            server_name,
        })
    }

    /// As given.
    pub fn shown(&self) -> String {
        match &self.server_name {
            Some(n) => format!("{n}@{}", self.node),
            None => self.node.clone(),
        }
    }
}

/// The members listed in `file`: one `[SERVER_NAME@]HOST[:PORT]` per
/// line; blank lines and lines starting with `#` are skipped.
pub fn read_members(file: &Path) -> Result<Vec<Member>> {
    let bytes = crate::input::read_head(file, "node list", MAX_LIST + 1)?;
    if bytes.len() as u64 > MAX_LIST {
        bail!(
            "{} is over {MAX_LIST} bytes: not a node list",
            file.display()
        );
    }
    let text = String::from_utf8(bytes)
        .with_context(|| format!("{} is not UTF-8 text", file.display()))?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        out.push(
            Member::parse(line).with_context(|| format!("{} line {}", file.display(), i + 1))?,
        );
    }
    Ok(out)
}

/// Checks a fleet: at least one node, at most [`MAX_MEMBERS`], none twice.
pub fn check_members(members: &[Member]) -> Result<()> {
    if members.is_empty() {
        bail!("no node: give --node (repeatable) or --nodes-file FILE");
    }
    if members.len() > MAX_MEMBERS {
        bail!("{} nodes: at most {MAX_MEMBERS} per rollout", members.len());
    }
    // One node however its address is written (`10.0.0.1` and
    // `10.0.0.1:50000` are one).
    let mut seen = std::collections::BTreeSet::new();
    for m in members {
        let (host, port) = super::client::split_node(&m.node)?;
        if !seen.insert((host.to_ascii_lowercase(), port)) {
            bail!(
                "the node {} is given twice",
                contract::text::excerpt(&m.node)
            );
        }
    }
    Ok(())
}

/// How a rollout proceeds.
#[derive(Debug, Clone, Copy)]
pub struct Policy {
    /// Nodes operated on at once (at least 1).
    pub max_parallel: usize,
    /// The first nodes, done alone before any other starts.
    pub canary: usize,
    /// Go on past a failed node (else the rollout stops there).
    pub continue_on_failure: bool,
}

/// How one node ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    /// Back, ready and blessed on the expected version.
    Done,
    /// Already there: nothing was asked of it.
    Skipped,
    /// It refused, fell back, or did not come back in time.
    Failed,
    /// Never asked: the rollout stopped before its turn.
    NotStarted,
}

/// What happened to one node.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub node: String,
    pub outcome: Outcome,
    /// The version and slot it runs at the end, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slot: Option<String>,
    /// What happened, in a sentence (the node's own words when it
    /// refused: shown escaped).
    pub message: String,
    /// Seconds it took.
    pub seconds: u64,
}

impl Report {
    fn not_started(m: &Member) -> Report {
        Report {
            node: m.shown(),
            outcome: Outcome::NotStarted,
            version: None,
            slot: None,
            message: "not started: the rollout stopped before its turn".into(),
            seconds: 0,
        }
    }
}

/// Runs `run` on each member under `policy` (see the module's
/// documentation), giving each report to `on_report` as it comes; returns
/// the reports in the members' order.
pub fn rollout(
    members: &[Member],
    policy: Policy,
    run: &(dyn Fn(&Member) -> Report + Sync),
    on_report: &mut dyn FnMut(&Report),
) -> Vec<Report> {
    let mut reports: Vec<Option<Report>> = vec![None; members.len()];
    let stop = AtomicBool::new(false);
    let canary = policy.canary.min(members.len());
    let canary_failed = AtomicBool::new(false);
    for (start, end) in [(0, canary), (canary, members.len())] {
        // A failed canary stops the rollout whatever the policy: it is
        // what canaries are for. Past them, `continue_on_failure` decides.
        if start == end
            || canary_failed.load(Ordering::SeqCst)
            || (stop.load(Ordering::SeqCst) && !policy.continue_on_failure)
        {
            continue;
        }
        let in_canary = start == 0 && end == canary;
        let next = AtomicUsize::new(start);
        let workers = policy.max_parallel.max(1).min(end - start);
        let (tx, rx) = std::sync::mpsc::channel::<(usize, Report)>();
        std::thread::scope(|scope| {
            for _ in 0..workers {
                let tx = tx.clone();
                let (next, stop, canary_failed) = (&next, &stop, &canary_failed);
                scope.spawn(move || {
                    loop {
                        if stop.load(Ordering::SeqCst) && (!policy.continue_on_failure || in_canary)
                        {
                            return;
                        }
                        let i = next.fetch_add(1, Ordering::SeqCst);
                        if i >= end {
                            return;
                        }
                        let report = run(&members[i]);
                        if report.outcome == Outcome::Failed {
                            stop.store(true, Ordering::SeqCst);
                            if in_canary {
                                canary_failed.store(true, Ordering::SeqCst);
                            }
                        }
                        if tx.send((i, report)).is_err() {
                            return;
                        }
                    }
                });
            }
            drop(tx);
            for (i, report) in rx {
                on_report(&report);
                reports[i] = Some(report);
            }
        });
    }
    members
        .iter()
        .zip(reports)
        .map(|(m, r)| {
            r.unwrap_or_else(|| {
                let r = Report::not_started(m);
                on_report(&r);
                r
            })
        })
        .collect()
}

/// How to reach each member.
#[derive(Debug, Clone)]
pub struct Connect {
    pub credentials: PathBuf,
    pub client: String,
}

/// The booted slot's record says it is blessed (`good`).
fn blessed(s: &Status) -> bool {
    s.slots
        .iter()
        .any(|x| x.slot == s.booted_slot && x.status == "good")
}

/// How long `--wait` waits for a node back from its reboot when no
/// `--timeout` is given.
pub const WAIT_TIMEOUT: u64 = 600;

/// How long each node of a rollout may take, from the request to back,
/// ready and blessed: `--timeout`, else [`WAIT_TIMEOUT`] (an upgrade's pull
/// comes first: its deadline and [`WAIT_TIMEOUT`] more). A `--timeout`
/// an upgrade's pull may outlast is refused: it would fail a node still
/// pulling within its deadline.
pub fn rollout_timeout(timeout: Option<u64>, request: &Request) -> Result<Duration> {
    let pull = match request {
        Request::Upgrade { deadline, .. } => Some(u64::from(
            deadline.unwrap_or(nodeapi::proto::DEFAULT_PULL_DEADLINE),
        )),
        _ => None,
    };
    Ok(Duration::from_secs(match (timeout, pull) {
        (Some(t), Some(d)) if t <= d => bail!(
            "--timeout {t} is not longer than the pull's deadline of {d} s: a node still \
             pulling within its deadline would be failed; give a --timeout above {d} (the \
             default is {}) or a shorter --deadline",
            d + WAIT_TIMEOUT
        ),
        (Some(t), _) => t,
        (None, Some(d)) => d + WAIT_TIMEOUT,
        (None, None) => WAIT_TIMEOUT,
    }))
}

/// What one node goes through: skipped when it already runs `target`
/// (blessed, nothing in progress); else `request` (an upgrade is left at
/// the node's acceptance: the node goes on alone), then followed through
/// its reboot until it settles, which must be on `target` (when known),
/// ready and blessed, within `timeout`.
pub fn operate(
    member: &Member,
    connect: &Connect,
    request: &Request,
    target: Option<&str>,
    timeout: Duration,
) -> Report {
    let started = Instant::now();
    let report = |outcome, s: Option<&Status>, message: String| Report {
        node: member.shown(),
        outcome,
        version: s.map(|s| s.version.clone()),
        slot: s.map(|s| s.booted_slot.clone()),
        message: contract::text::escape(&message),
        seconds: started.elapsed().as_secs(),
    };
    let client = match Client::new(
        &member.node,
        &connect.credentials,
        &connect.client,
        member.server_name.as_deref(),
    ) {
        Ok(c) => c,
        Err(e) => return report(Outcome::Failed, None, format!("{e:#}")),
    };
    let before = match client.status() {
        Ok(s) => s,
        Err(e) => return report(Outcome::Failed, None, format!("{e:#}")),
    };
    if let Some(v) = target
        && before.version == v
        && blessed(&before)
        && before.operation.is_none()
    {
        return report(
            Outcome::Skipped,
            Some(&before),
            format!("already runs {} {v}, blessed: nothing asked", before.name),
        );
    }
    let accepted =
        |e: &Event| matches!(e, Event::Progress { step, .. } if step == nodeapi::proto::ACCEPTED);
    match client.call_until(request, |_| {}, &accepted) {
        Ok(Event::Failed { message, .. }) => {
            return report(
                Outcome::Failed,
                Some(&before),
                format!("refused {}: {message}", request.name()),
            );
        }
        Ok(_) => {}
        Err(e) => return report(Outcome::Failed, Some(&before), format!("{e:#}")),
    }
    let left = timeout.saturating_sub(started.elapsed());
    let settled = match client.wait_settled(target, left, |_| {}) {
        Ok(s) => s,
        Err(e) => {
            let now = client.status().ok();
            return report(Outcome::Failed, now.as_ref(), format!("{e:#}"));
        }
    };
    // Settled is ready; blessed follows ready at once (the runtime blesses
    // the slot it reached ready on): read again until it shows, in time.
    let mut s = settled;
    while !(s.ready && blessed(&s)) {
        if started.elapsed() >= timeout {
            return report(
                Outcome::Failed,
                Some(&s),
                format!(
                    "back on {} {} (slot {}) but not ready and blessed within {} s",
                    s.name,
                    s.version,
                    s.booted_slot,
                    timeout.as_secs()
                ),
            );
        }
        std::thread::sleep(Duration::from_millis(500));
        match client.status() {
            Ok(n) => s = n,
            Err(e) => return report(Outcome::Failed, Some(&s), format!("{e:#}")),
        }
    }
    if matches!(request, Request::Rollback { .. }) && s.booted_slot == before.booted_slot {
        return report(
            Outcome::Failed,
            Some(&s),
            format!("still on slot {} after the rollback", s.booted_slot),
        );
    }
    report(
        Outcome::Done,
        Some(&s),
        format!(
            "{} {} on slot {}, ready and blessed",
            s.name, s.version, s.booted_slot
        ),
    )
}

#[cfg(test)]
mod tests;
