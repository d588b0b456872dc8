//! `imager root init|sign` and `imager sign --add`: a root of trust and
//! signatures by several keys (docs/signing.md, "The root of trust"). The
//! work is `imager::sign::trust`'s; this is arguments and what is printed.

use anyhow::{Context, Result};
use imager::sign::{self, trust};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Debug, Clone, clap::Subcommand)]
pub enum RootCommand {
    /// Write a root of trust: its keys, how many must sign, its version.
    Init(InitArgs),
    /// Add a key's signature of a root to ROOT.sigs (a next root is signed
    /// by a threshold of the root it replaces and of its own keys).
    Sign(RootSignArgs),
}

#[derive(Debug, Clone, clap::Args)]
pub struct InitArgs {
    /// A key of the root (repeatable, 1 to 16): a public key file (SPKI
    /// PEM), or a key named as signing keys are (`pkcs11:…`, `exec:…`),
    /// whose public half is asked for.
    #[arg(long = "key", value_name = "PUB", required = true)]
    pub keys: Vec<PathBuf>,
    /// How many of the keys must sign a payload (and the next root).
    #[arg(long, default_value_t = 1)]
    pub threshold: usize,
    /// The root's version: 1 for a new disk's, the current one's plus one
    /// for a rotation.
    #[arg(long, default_value_t = 1)]
    pub version: u64,
    /// Where to write it.
    #[arg(short, long, value_name = "ROOT", default_value = "root.json")]
    pub out: PathBuf,
    /// Replace an existing file.
    #[arg(long)]
    pub force: bool,
}

#[derive(Debug, Clone, clap::Args)]
pub struct RootSignArgs {
    /// The root (`root.json`); its signatures are ROOT.sigs.
    #[arg(value_name = "ROOT")]
    pub root: PathBuf,
    /// The signing key: a key file, `pkcs11:…` or `exec:PROGRAM`.
    #[arg(long, value_name = "KEY")]
    pub key: PathBuf,
}

/// `imager sign --add KEY TARGET`.
#[derive(Debug, Clone, clap::Args)]
pub struct SignArgs {
    /// The key whose signature of the manifest is added to
    /// `manifest.json.sigs`: a key file, `pkcs11:…` or `exec:PROGRAM`.
    #[arg(long, value_name = "KEY")]
    pub add: PathBuf,
    /// A build's output directory, a payload directory, or an installer
    /// archive (`installer.tar` as the build wrote it: its first layer is
    /// written again).
    #[arg(value_name = "TARGET")]
    pub target: PathBuf,
}

/// A root's key: a public key file, or a signer's public half (a private
/// key file, a token's key, a program's).
fn public_key(k: &Path) -> Result<sign::VerifyingKey> {
    match sign::KeyRef::parse(k) {
        sign::KeyRef::File(f) => sign::load_public_key(&f).or_else(|public| {
            sign::open_signer(k)
                .map(|s| s.public_key())
                .map_err(|_| public)
        }),
        _ => Ok(sign::open_signer(k)?.public_key()),
    }
}

pub fn run_root(command: &RootCommand) -> Result<ExitCode> {
    match command {
        RootCommand::Init(a) => {
            let keys = a
                .keys
                .iter()
                .map(|k| public_key(k).with_context(|| format!("--key {}", k.display())))
                .collect::<Result<Vec<_>>>()?;
            let root = trust::root_init(&a.out, &keys, a.threshold, a.version, a.force)?;
            println!(
                "root: wrote {}: version {}, {} of {} keys ({})",
                a.out.display(),
                root.version,
                root.threshold,
                root.keys.len(),
                root.keys
                    .iter()
                    .map(sign::key_id)
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        RootCommand::Sign(a) => {
            let signer = sign::open_signer(&a.key)?;
            let sigs = trust::root_sign(&a.root, signer.as_ref())?;
            println!(
                "root: added the signature of {} to {}",
                signer.key_id(),
                sigs.display()
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub fn run_sign(a: &SignArgs) -> Result<ExitCode> {
    let signer = sign::open_signer(&a.add)?;
    let changed = trust::add_signature_to(&a.target, signer.as_ref())?;
    println!(
        "sign: added the signature of {} to {changed}",
        signer.key_id()
    );
    Ok(ExitCode::SUCCESS)
}
