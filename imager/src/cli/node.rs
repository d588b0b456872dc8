//! `imager node …`: the arguments, turned into calls of `imager::node`
//! (credentials, provisioning, and the API's client).

use anyhow::{Result, bail};
use imager::node::client::Client;
use imager::node::credentials::{self, Holder};
use imager::node::fleet;
use nodeapi::Role;
use nodeapi::proto::{Event, Request, Status};
use std::net::IpAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Debug, Clone, clap::Subcommand)]
pub enum NodeCommand {
    /// Make the cluster CA (first use of DIR) and a client's or a node's
    /// certificate and key signed by it (keys 0600, never printed).
    Credentials(CredentialsArgs),
    /// Write a node's certificate and key, and the CA certificate its
    /// clients must chain to, into a disk's META: the node serves the API
    /// from its next boot.
    Provision(ProvisionArgs),
    /// The node's boot id, version, slots, what boots next and the
    /// operation in progress.
    Status(StatusArgs),
    /// Have the node pull an installer image from its registry, verify it,
    /// install it into the other slot and reboot into it (on trial: it is
    /// blessed when it gets ready, or the previous version comes back).
    Upgrade(UpgradeArgs),
    /// Arm the upgrade staged with `upgrade --stage` (it boots next) and
    /// reboot into it.
    Arm(PowerArgs),
    /// Make the other slot the default and reboot into it.
    Rollback(RollbackArgs),
    /// Cancel the upgrade in progress while it pulls: nothing is written
    /// and the node is free again (an upgrade that writes finishes).
    Cancel(PowerArgs),
    /// Follow the operation in progress (an upgrade left without --wait)
    /// through its reboot to its end: succeed when the node is back, idle
    /// and ready (at --version when given), fail when it fell back.
    Wait(WaitArgs),
    /// Reboot the node.
    Reboot(PowerArgs),
    /// Power the node off (admin).
    Poweroff(PowerArgs),
    /// Replace the node's credentials over the API (admin): the CA
    /// certificates of the credentials directory (both during a CA
    /// rollover) and the node's NAME.node.crt and NAME.node.key from it.
    /// Taken from the node's next connection; kept in META.
    SetCredentials(SetCredentialsArgs),
}

#[derive(Debug, Clone, clap::Args)]
pub struct SetCredentialsArgs {
    #[command(flatten)]
    pub power: PowerArgs,
    /// The node's name in the credentials directory (NAME.node.crt,
    /// NAME.node.key, made by `imager node credentials DIR --node NAME`).
    #[arg(long, value_name = "NAME")]
    pub node_name: String,
}

/// How to reach a node and who is asking.
#[derive(Debug, Clone, clap::Args)]
pub struct ConnectArgs {
    /// The node: HOST or HOST:PORT (port 50000 by default). `upgrade` and
    /// `rollback` take several (repeated, each [SERVER_NAME@]HOST[:PORT]):
    /// a rolling operation (docs/node-api.md, "Fleets").
    #[arg(
        long,
        value_name = "HOST[:PORT]",
        required_unless_present = "nodes_file"
    )]
    pub node: Vec<String>,
    /// A file listing the nodes, one [SERVER_NAME@]HOST[:PORT] per line
    /// (`#` comments): for `upgrade` and `rollback`.
    #[arg(long, value_name = "FILE")]
    pub nodes_file: Option<PathBuf>,
    /// The credentials directory (`ca.crt`, the client's certificate and
    /// key), as made by `imager node credentials`.
    #[arg(long, value_name = "DIR")]
    pub credentials: PathBuf,
    /// The client whose certificate and key to use (NAME.crt, NAME.key).
    #[arg(long, value_name = "NAME")]
    pub client: String,
    /// The name the node's certificate must be valid for (default: the
    /// host of --node). Needed when the node is reached through a
    /// forwarded port.
    #[arg(long, value_name = "NAME")]
    pub server_name: Option<String>,
}

impl ConnectArgs {
    /// The one node of a command that takes one.
    fn client(&self) -> Result<Client> {
        let [node] = self.node.as_slice() else {
            bail!(
                "this command takes one --node (upgrade and rollback take several, or \
                 --nodes-file)"
            );
        };
        if self.nodes_file.is_some() {
            bail!("--nodes-file is for upgrade and rollback (a rolling operation)");
        }
        Client::new(
            node,
            &self.credentials,
            &self.client,
            self.server_name.as_deref(),
        )
    }

    /// The nodes of a rolling operation, when several are given (or a
    /// list); `None`: one node, the single-node command.
    fn fleet(&self) -> Result<Option<Vec<fleet::Member>>> {
        if self.nodes_file.is_none() && self.node.len() <= 1 {
            return Ok(None);
        }
        if self.server_name.is_some() {
            bail!("--server-name names one node's certificate: give NAME@HOST[:PORT] per node");
        }
        let mut members = self
            .node
            .iter()
            .map(|n| fleet::Member::parse(n))
            .collect::<Result<Vec<_>>>()?;
        if let Some(f) = &self.nodes_file {
            members.extend(fleet::read_members(f)?);
        }
        fleet::check_members(&members)?;
        Ok(Some(members))
    }
}

/// How a rolling operation proceeds (with several nodes).
#[derive(Debug, Clone, clap::Args)]
pub struct RolloutArgs {
    /// Nodes operated on at once.
    #[arg(long, default_value_t = 1, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=64))]
    pub max_parallel: u32,
    /// The first K nodes alone first: the rest start only once they are
    /// back, ready and blessed.
    #[arg(long, default_value_t = 0, value_name = "K")]
    pub canary: u32,
    /// Go on past a node that fails (by default the rollout stops there,
    /// leaving the nodes not yet started untouched).
    #[arg(long)]
    pub continue_on_failure: bool,
}

#[derive(Debug, Clone, clap::Args)]
pub struct ProvisionArgs {
    /// The disk (an image file or a block device) made by imager.
    pub disk: PathBuf,
    /// The credentials directory holding `ca.crt` and the node's
    /// `NAME.node.crt` and `NAME.node.key`.
    #[arg(long, value_name = "DIR", requires = "node")]
    pub credentials: Option<PathBuf>,
    /// The node's name (its certificate must be valid for it).
    #[arg(long, value_name = "NAME", requires = "credentials")]
    pub node: Option<String>,
    #[command(flatten)]
    pub settings: super::NodeSettingsArgs,
    /// PEM CA certificates the node trusts for its registries' HTTPS
    /// instead of the Mozilla roots (a private registry's CA).
    #[arg(long, value_name = "FILE")]
    pub registry_ca: Option<PathBuf>,
    /// Replace credentials the disk has already.
    #[arg(long)]
    pub force: bool,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, clap::Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub connect: ConnectArgs,
    /// Print the status as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, clap::Args)]
pub struct UpgradeArgs {
    #[command(flatten)]
    pub power: PowerArgs,
    /// The installer image: REGISTRY/NAME:TAG or REGISTRY/NAME@sha256:…
    /// (plain HTTP only for registries the node's profile allows).
    #[arg(long, value_name = "REF")]
    pub image: String,
    /// Boots the new slot is tried before the boot loader falls back.
    #[arg(long, default_value_t = nodeapi::proto::DEFAULT_TRIES, value_parser = clap::value_parser!(u32).range(1..=99))]
    pub tries: u32,
    /// Download, verify and write the other slot without arming it (`arm`
    /// later).
    #[arg(long)]
    pub stage: bool,
    /// Keep EPHEMERAL (/var); `--preserve=false` wipes it at the next boot
    /// (admin).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub preserve: bool,
    /// The version the image must hold; the node refuses another before
    /// writing anything. Default: the version the tag names (`0.3.0`,
    /// `v0.3.0`); a reference by digest or a tag like `latest` checks none.
    #[arg(long, value_name = "VERSION")]
    pub version: Option<String>,
    /// Install a payload whose security version is lower than the highest
    /// the node has blessed (admin; refused without): this one downgrade.
    #[arg(long)]
    pub allow_downgrade: bool,
    /// The pull ends after this many seconds, however its bytes arrive
    /// (default 1800, at most 21600).
    #[arg(long, value_name = "SECONDS",
          value_parser = clap::value_parser!(u32).range(1..=i64::from(nodeapi::proto::MAX_PULL_DEADLINE)))]
    pub deadline: Option<u32>,
    /// The pull ends when the registry sends nothing for this many
    /// seconds (default 30, 5 to 100).
    #[arg(long, value_name = "SECONDS",
          value_parser = clap::value_parser!(u32).range(
              i64::from(*nodeapi::proto::PULL_STALL_RANGE.start())
                  ..=i64::from(*nodeapi::proto::PULL_STALL_RANGE.end())))]
    pub stall: Option<u32>,
    /// Credentials for the image's registry, sent to the node for this
    /// pull only (it never stores or shows them): given, else found where
    /// podman, skopeo and docker keep them for that registry.
    #[command(flatten)]
    pub registry: super::registry::CredentialArgs,
    /// Send no registry credentials, even if this host has some.
    #[arg(long, conflicts_with_all = ["username", "authfile"])]
    pub anonymous: bool,
    #[command(flatten)]
    pub rollout: RolloutArgs,
}

/// The registry credentials an upgrade sends: none with `--anonymous`,
/// else those given or found for the image's registry (said on stderr,
/// never shown).
fn pull_credentials(a: &UpgradeArgs) -> Result<Option<nodeapi::proto::PullCredentials>> {
    if a.anonymous {
        return Ok(None);
    }
    let r = registry::Reference::parse(&a.image)
        .map_err(|e| anyhow::anyhow!("--image {:?}: {e}", a.image))?;
    let (credentials, source) = a.registry.lookup(&r)?;
    let sent = match credentials {
        registry::Credentials::Anonymous => None,
        registry::Credentials::Basic { username, password } => {
            Some(nodeapi::proto::PullCredentials {
                username: Some(username),
                password: Some(password),
                identity_token: None,
            })
        }
        registry::Credentials::IdentityToken(t) => Some(nodeapi::proto::PullCredentials {
            username: None,
            password: None,
            identity_token: Some(t),
        }),
    };
    if let (Some(_), Some(from)) = (&sent, source) {
        eprintln!(
            "upgrade: sending the node the credentials for {} from {from}",
            r.registry()
        );
    }
    Ok(sent)
}

#[derive(Debug, Clone, clap::Args)]
pub struct WaitArgs {
    #[command(flatten)]
    pub connect: ConnectArgs,
    /// Succeed only when the node runs this version at the end.
    #[arg(long, value_name = "VERSION")]
    pub version: Option<String>,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 900)]
    pub timeout: u64,
    /// Print the final status as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, clap::Args)]
pub struct RollbackArgs {
    #[command(flatten)]
    pub power: PowerArgs,
    #[command(flatten)]
    pub rollout: RolloutArgs,
    /// With several nodes: the version they roll back to; a node already
    /// running it (blessed) is skipped, so that a rerun is safe.
    #[arg(long, value_name = "VERSION")]
    pub version: Option<String>,
    /// Roll back to a slot whose security version is lower than the
    /// highest the node has blessed (admin; refused without).
    #[arg(long)]
    pub allow_downgrade: bool,
}

/// The version an upgrade asks for: `--version`, else the one the image
/// reference's tag names (`contract::version::named_by_tag`).
fn expected_version(a: &UpgradeArgs) -> Result<Option<String>> {
    if let Some(v) = &a.version {
        return Ok(Some(v.clone()));
    }
    let r = registry::Reference::parse(&a.image)
        .map_err(|e| anyhow::anyhow!("--image {:?}: {e}", a.image))?;
    Ok(r.tag()
        .and_then(contract::version::named_by_tag)
        .map(str::to_string))
}

#[derive(Debug, Clone, clap::Args)]
pub struct PowerArgs {
    #[command(flatten)]
    pub connect: ConnectArgs,
    /// Follow the node through its reboot: succeed only when it is back,
    /// ready, on the expected slot, with a new boot id.
    #[arg(long)]
    pub wait: bool,
    /// How long --wait waits for the node, in seconds (default 600). With
    /// several nodes, how long each may take from the request to back,
    /// ready and blessed; a rolling upgrade's must be longer than the
    /// pull's deadline (its default: the deadline and 600 more).
    #[arg(long, value_name = "SECONDS")]
    pub timeout: Option<u64>,
    /// Print every event as a JSON line on stdout.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, clap::Args)]
pub struct CredentialsArgs {
    /// The credentials directory: `ca.crt` and `ca.key` (made when absent),
    /// `NAME.crt`/`NAME.key` per client, `NAME.node.crt`/`.key` per node.
    pub dir: PathBuf,
    /// A client certificate with this role: reader (status), operator
    /// (upgrade, rollback, reboot), admin (also power-off and wiping /var).
    #[arg(long, value_parser = ["reader", "operator", "admin"], requires = "name", conflicts_with = "node")]
    pub role: Option<String>,
    /// The client's name (its files' names and the certificate's CN).
    #[arg(long)]
    pub name: Option<String>,
    /// A node's server certificate, for this DNS name.
    #[arg(long, value_name = "NAME")]
    pub node: Option<String>,
    /// An IP address the node is reached at (repeatable; with --node).
    #[arg(long = "address", value_name = "IP", requires = "node")]
    pub addresses: Vec<IpAddr>,
    /// Replace the client's or node's existing certificate and key.
    #[arg(long)]
    pub force: bool,
    /// Issue a new certificate and key for an existing client or node
    /// (before or after the old one expires); nothing else changes.
    #[arg(long, conflicts_with = "force")]
    pub renew: bool,
    /// The client's or node's certificate is valid this many days from
    /// now (default 365; a new CA: 3650).
    #[arg(long, value_name = "DAYS", default_value_t = imager::node::credentials::HOLDER_DAYS,
          value_parser = clap::value_parser!(u64).range(1..=36500))]
    pub days: u64,
    /// Start a CA rollover: a new CA issues from now on, the old one
    /// (`ca.old.crt`) is still trusted until --end-rollover
    /// (docs/node-api.md, "Credentials that expire and renew").
    #[arg(long, conflicts_with_all = ["role", "node", "end_rollover", "renew", "force"])]
    pub rollover_ca: bool,
    /// End a CA rollover: the old CA is trusted no more.
    #[arg(long, conflicts_with_all = ["role", "node", "renew", "force"])]
    pub end_rollover: bool,
    /// Print the result as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

pub fn run(cmd: &NodeCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        NodeCommand::Provision(a) => {
            let p = imager::node::provision::provision(
                &a.disk,
                &imager::node::provision::Request {
                    credentials: a.credentials.clone().zip(a.node.clone()),
                    settings: a.settings.settings()?,
                    registry_ca: a.registry_ca.clone(),
                    force: a.force,
                },
            )?;
            if a.json {
                println!("{}", serde_json::to_string_pretty(&p)?);
            } else {
                if let Some(mode) = &p.made_private_from {
                    println!(
                        "made {} readable by its owner only (it was {mode}): it holds the node's \
                         private key",
                        p.disk.display()
                    );
                }
                if let Some(node) = &p.node {
                    println!(
                        "provisioned {} as node {node}{}: it serves the node API from its next \
                         boot",
                        p.disk.display(),
                        if p.replaced {
                            " (replacing its credentials)"
                        } else {
                            ""
                        }
                    );
                }
                if let Some(text) = &p.settings {
                    println!(
                        "gave {} the node's settings (from its next boot, kept across upgrades \
                         and rollbacks): {}",
                        p.disk.display(),
                        text.trim_end().replace('\n', " ")
                    );
                }
                if let Some(n) = p.registry_cas {
                    println!(
                        "gave {} {n} CA certificate(s) for its registries' HTTPS (META \
                         registry-ca; instead of the Mozilla roots)",
                        p.disk.display()
                    );
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        NodeCommand::Status(a) => {
            let s = a.connect.client()?.status()?;
            if a.json {
                println!("{}", serde_json::to_string_pretty(&s)?);
            } else {
                print_status(&s);
            }
            Ok(ExitCode::SUCCESS)
        }
        NodeCommand::Upgrade(a) => operate_all(
            &a.power,
            &a.rollout,
            expected_version(a)?.as_deref(),
            &Request::Upgrade {
                image: a.image.clone(),
                stage: a.stage,
                preserve: a.preserve,
                tries: Some(a.tries),
                version: expected_version(a)?,
                allow_downgrade: a.allow_downgrade,
                deadline: a.deadline,
                stall: a.stall,
                credentials: pull_credentials(a)?,
            },
        ),
        NodeCommand::Arm(a) => operate(a, &Request::Arm {}),
        NodeCommand::Cancel(a) => operate(a, &Request::Cancel {}),
        NodeCommand::Wait(a) => {
            let client = a.connect.client()?;
            let s = client.wait_settled(
                a.version.as_deref(),
                Duration::from_secs(a.timeout),
                |what| {
                    if !a.json {
                        eprintln!("{}", shown(what));
                    }
                },
            )?;
            if a.json {
                println!("{}", serde_json::to_string(&s)?);
            } else {
                println!(
                    "{}",
                    shown(&format!(
                        "the node is idle and ready: {} {} on slot {}{}",
                        s.name,
                        s.version,
                        s.booted_slot,
                        s.last_outcome
                            .as_deref()
                            .or(s.last_event.as_deref())
                            .map(|e| format!(" ({e})"))
                            .unwrap_or_default()
                    ))
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        NodeCommand::Rollback(a) => operate_all(
            &a.power,
            &a.rollout,
            a.version.as_deref(),
            &Request::Rollback {
                allow_downgrade: a.allow_downgrade,
            },
        ),
        NodeCommand::Reboot(a) => operate(a, &Request::Reboot {}),
        NodeCommand::Poweroff(a) => operate(a, &Request::PowerOff {}),
        NodeCommand::SetCredentials(a) => {
            let c = imager::node::provision::read_credentials(
                &a.power.connect.credentials,
                &a.node_name,
            )?;
            let request = Request::Credentials {
                ca: c.ca,
                cert: c.cert,
                key: nodeapi::proto::NodeKey(c.key),
            };
            operate(&a.power, &request)
        }
        NodeCommand::Credentials(a) if a.rollover_ca => {
            let made = credentials::rollover_ca(&a.dir, nodeapi::tls::now())?;
            println!(
                "{}: a new CA issues from now on; the old one ({}) is trusted until \
                 --end-rollover: give every node the new certificates (imager node \
                 set-credentials), renew every client, then end the rollover",
                made.dir.display(),
                credentials::CA_OLD_CERT
            );
            Ok(ExitCode::SUCCESS)
        }
        NodeCommand::Credentials(a) if a.end_rollover => {
            credentials::end_rollover(&a.dir)?;
            println!(
                "{}: the old CA is trusted no more here; give the nodes the CA certificate \
                 alone (imager node set-credentials)",
                a.dir.display()
            );
            Ok(ExitCode::SUCCESS)
        }
        NodeCommand::Credentials(a) => {
            let holder = match (&a.role, &a.name, &a.node) {
                (Some(role), Some(name), None) => Some(Holder::Client {
                    name: name.clone(),
                    role: Role::parse(role)
                        .ok_or_else(|| anyhow::anyhow!("unknown role {role:?}"))?,
                }),
                (None, None, Some(node)) => Some(Holder::Node {
                    name: node.clone(),
                    addresses: a.addresses.clone(),
                }),
                (None, None, None) => None,
                _ => anyhow::bail!(
                    "give --role and --name for a client, or --node for a node, or neither \
                     (only the CA)"
                ),
            };
            if a.renew {
                let Some(h) = &holder else {
                    anyhow::bail!("--renew needs the client (--role, --name) or --node to renew");
                };
                let (crt, _) = h.files();
                if !a.dir.join(&crt).is_file() {
                    anyhow::bail!(
                        "{} does not exist: nothing to renew (leave out --renew to make it)",
                        a.dir.join(crt).display()
                    );
                }
            }
            let made = credentials::make_with(
                &a.dir,
                holder.as_ref(),
                a.force || a.renew,
                credentials::Validity::days_from_now(a.days),
            )?;
            if a.json {
                println!("{}", serde_json::to_string_pretty(&made)?);
            } else {
                for f in &made.files {
                    println!("wrote {}", made.dir.join(f).display());
                }
                if made.files.is_empty() {
                    println!("{} has a CA already: nothing to do", made.dir.display());
                }
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// `request` on the one node given ([`operate`]), or rolled out across
/// the nodes given ([`fleet::rollout`]), each followed until it is back,
/// ready and blessed on `target` (when known).
fn operate_all(
    a: &PowerArgs,
    policy: &RolloutArgs,
    target: Option<&str>,
    request: &Request,
) -> Result<ExitCode> {
    let Some(members) = a.connect.fleet()? else {
        return operate(a, request);
    };
    match request {
        Request::Upgrade { stage: true, .. } => {
            bail!(
                "--stage is for one node: a rolling upgrade waits for each node to be back on the new version"
            )
        }
        Request::Rollback { .. } if target.is_none() => bail!(
            "a rollback of several nodes needs --version VERSION, the version they roll back \
             to: a node already on it is skipped, so that a rerun does not roll it back again"
        ),
        _ => {}
    }
    let connect = fleet::Connect {
        credentials: a.connect.credentials.clone(),
        client: a.connect.client.clone(),
    };
    let timeout = fleet::rollout_timeout(a.timeout, request)?;
    let run = |m: &fleet::Member| fleet::operate(m, &connect, request, target, timeout);
    let json = a.json;
    if !json {
        eprintln!(
            "{}: {} node(s), {} at a time{}{}",
            request.name(),
            members.len(),
            policy.max_parallel,
            match policy.canary {
                0 => String::new(),
                k => format!(", the first {k} alone first"),
            },
            if policy.continue_on_failure {
                ", going on past failures"
            } else {
                ", stopping at the first failure"
            }
        );
    }
    let mut show = |r: &fleet::Report| {
        if json {
            if let Ok(line) = serde_json::to_string(r) {
                println!("{line}");
            }
        } else {
            let outcome = match r.outcome {
                fleet::Outcome::Done => "done",
                fleet::Outcome::Skipped => "skipped",
                fleet::Outcome::Failed => "FAILED",
                fleet::Outcome::NotStarted => "not started",
            };
            println!("{}: {outcome}: {}", shown(&r.node), r.message);
        }
    };
    let reports = fleet::rollout(
        &members,
        fleet::Policy {
            max_parallel: policy.max_parallel as usize,
            canary: policy.canary as usize,
            continue_on_failure: policy.continue_on_failure,
        },
        &run,
        &mut show,
    );
    let count = |o: fleet::Outcome| reports.iter().filter(|r| r.outcome == o).count();
    let failed = count(fleet::Outcome::Failed);
    // On stderr: with --json, stdout holds only the reports.
    eprintln!(
        "{}: {} done, {} skipped, {failed} failed, {} not started",
        request.name(),
        count(fleet::Outcome::Done),
        count(fleet::Outcome::Skipped),
        count(fleet::Outcome::NotStarted)
    );
    if failed > 0 || count(fleet::Outcome::NotStarted) > 0 {
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

/// Sends `request`, shows its events, and with `--wait` follows the node
/// through the reboot that ends it.
fn operate(a: &PowerArgs, request: &Request) -> Result<ExitCode> {
    let client = a.connect.client()?;
    let show = |e: &Event| {
        if a.json {
            if let Ok(line) = serde_json::to_string(e) {
                println!("{line}");
            }
        } else if let Event::Progress { step, message, .. } = e {
            eprintln!("{}", shown(&format!("{step}: {message}")));
        }
    };
    // An upgrade not waited for ends here once the node accepted it: the
    // node goes on without the client (`imager node wait` follows it).
    let early = !a.wait && matches!(request, Request::Upgrade { .. });
    let accepted = |e: &Event| {
        early && matches!(e, Event::Progress { step, .. } if step == nodeapi::proto::ACCEPTED)
    };
    let (message, status, reboot) = match client.call_until(request, show, &accepted)? {
        Event::Done {
            message,
            status,
            reboot,
        } => (message, status, reboot),
        Event::Failed {
            code,
            message,
            written,
        } => bail!(
            "the node refused {} ({}): {}{}",
            request.name(),
            code.name(),
            shown(&message),
            if written || message.contains("nothing was written") {
                ""
            } else {
                "; nothing was written"
            }
        ),
        Event::Progress { message, .. } => {
            if !a.json {
                println!(
                    "{}",
                    shown(&format!(
                        "the node accepted the upgrade ({message}); it goes on without this \
                         client: `imager node status` shows its progress, `imager node wait` \
                         follows it to its end"
                    ))
                );
            }
            return Ok(ExitCode::SUCCESS);
        }
    };
    if !a.json {
        println!("{}", shown(&message));
    }
    if !a.wait || !reboot {
        return Ok(ExitCode::SUCCESS);
    }
    if matches!(request, Request::PowerOff {}) {
        bail!("--wait cannot follow a node that powers off");
    }
    let expected = status
        .next_boot
        .clone()
        .unwrap_or_else(|| status.booted_slot.clone());
    if !a.json {
        eprintln!(
            "waiting for {} to come back on slot {expected} (boot id other than {})",
            client.node(),
            status.boot_id
        );
    }
    // The version that slot holds, as the node's answer says: --wait
    // succeeds only on that slot running that version.
    let version = status
        .slots
        .iter()
        .find(|s| s.slot == expected)
        .map(|s| s.version.clone())
        .filter(|v| !v.is_empty());
    let back = client.wait_back(
        &status,
        (&expected, version.as_deref()),
        Duration::from_secs(a.timeout.unwrap_or(fleet::WAIT_TIMEOUT)),
        |_| {},
    )?;
    if a.json {
        println!("{}", serde_json::to_string(&back)?);
    } else {
        println!(
            "{}",
            shown(&format!(
                "the node is back: {} {} on slot {}, ready (boot id {})",
                back.name, back.version, back.booted_slot, back.boot_id
            ))
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn print_status(s: &Status) {
    for line in status_lines(s) {
        println!("{}", shown(&line));
    }
}

/// A node's answer made fit for the terminal: each line is printed
/// through this ([`contract::text::escape`]), whole, so that nothing the
/// node (or a registry it quotes) says can forge a line or send the
/// terminal an escape sequence.
fn shown(line: &str) -> String {
    contract::text::escape(line)
}

fn status_lines(s: &Status) -> Vec<String> {
    let mut out = vec![
        format!(
            "{} {} on slot {} ({}), boot id {}, up {} s",
            s.name,
            s.version,
            s.booted_slot,
            if s.ready { "ready" } else { "not ready" },
            s.boot_id,
            s.uptime
        ),
        format!(
            "default slot {}, boots next {}, Secure Boot {}",
            s.default_slot,
            s.next_boot.as_deref().unwrap_or("nothing"),
            s.secure_boot
        ),
    ];
    for slot in &s.slots {
        let tries = match (slot.tries_left, slot.tries_done) {
            (Some(l), Some(d)) => format!(", tries left {l}, done {d}"),
            _ => String::new(),
        };
        out.push(format!(
            "  slot {}: {} {}{tries}",
            slot.slot, slot.status, slot.version
        ));
    }
    for (what, v) in [
        ("pending upgrade", &s.pending_upgrade),
        ("staged", &s.staged),
        ("operation in progress", &s.operation),
        ("last operation", &s.last_outcome),
        ("last event", &s.last_event),
    ] {
        if let Some(v) = v {
            out.push(format!("{what}: {v}"));
        }
    }
    out
}
