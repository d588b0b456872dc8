//! `imager node credentials`: the arguments, turned into a call of
//! `imager::node::credentials` (the rest of `imager node` is to come: see
//! the note on issue 11).

use imager::node::credentials::{self, Holder};
use nodeapi::Role;
use std::net::IpAddr;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, Clone, clap::Subcommand)]
pub enum NodeCommand {
    /// Make the cluster CA (first use of DIR) and a client's or a node's
    /// certificate and key signed by it (keys 0600, never printed).
    Credentials(CredentialsArgs),
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
    /// Print the result as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

pub fn run(cmd: &NodeCommand) -> anyhow::Result<ExitCode> {
    match cmd {
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
            let made = credentials::make(&a.dir, holder.as_ref(), a.force)?;
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
