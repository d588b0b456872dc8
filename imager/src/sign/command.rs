//! `imager keygen` and `imager verify`: what they do, from plain options
//! (the `imager` binary parses the command line).

use anyhow::{Result, bail};
use std::io::Write;
use std::path::{Path, PathBuf};

use super::keys::{DEV_PUB, keygen, load_public_key};
use super::verify::verify;

/// Where the development key pair lives, relative to the working directory.
pub const DEV_KEY_DIR: &str = "out/keys";

/// The development public key: `out/keys/dev.pub` in the current directory
/// or the nearest parent that has one (the build writes it under the
/// project root), else the current directory's path for the messages.
pub fn default_dev_pub() -> PathBuf {
    let rel = Path::new(DEV_KEY_DIR).join(DEV_PUB);
    std::env::current_dir()
        .ok()
        .and_then(|cwd| cwd.ancestors().map(|d| d.join(&rel)).find(|p| p.is_file()))
        .unwrap_or(rel)
}

/// The development public key of the build that made `output` (a build's
/// output directory, or a file in it), whose signed manifest is `manifest`:
/// among the `out/keys/dev.pub` files above `output` (a build writes
/// `<project>/out/NAME/` and keeps its key in `<project>/out/keys/`) and
/// above the working directory, the nearest whose key id is the one the
/// manifest names; else the nearest. So `imager inspect` and `imager verify`
/// find the key from whichever directory they run. (The manifest's key id
/// only chooses the key: the signature is still checked with it.)
pub fn dev_key_for(output: &Path, manifest: &Path) -> Option<PathBuf> {
    let rel = Path::new(DEV_KEY_DIR).join(DEV_PUB);
    let mut candidates: Vec<PathBuf> = Vec::new();
    for start in [
        std::path::absolute(output).ok(),
        std::env::current_dir().ok(),
    ]
    .into_iter()
    .flatten()
    {
        for d in start.ancestors() {
            let p = d.join(&rel);
            if p.is_file() && !candidates.contains(&p) {
                candidates.push(p);
            }
        }
    }
    let claimed = std::fs::read(manifest)
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .and_then(|v| v.get("key_id")?.as_str().map(str::to_string));
    candidates
        .iter()
        .find(|p| super::keys::load_public_key(p).is_ok_and(|k| Some(super::key_id(&k)) == claimed))
        .or(candidates.first())
        .cloned()
}

/// `imager keygen`: where to write a new signing key pair.
#[derive(Debug, Clone)]
pub struct KeygenOptions {
    /// The private key (PKCS#8 PEM, mode 0600).
    pub out_private: PathBuf,
    /// The public key (SPKI PEM). `None`: the private key's path with the
    /// extension .pub.
    pub out_public: Option<PathBuf>,
    /// Replace existing key files.
    pub force: bool,
}

impl KeygenOptions {
    /// The public key path, explicit or derived from the private key's.
    pub fn public_path(&self) -> PathBuf {
        self.out_public
            .clone()
            .unwrap_or_else(|| self.out_private.with_extension("pub"))
    }
}

/// `imager verify`: check a signed manifest and its artifacts.
#[derive(Debug, Clone)]
pub struct VerifyOptions {
    /// The manifest.json, or the directory containing it.
    pub manifest: PathBuf,
    /// The trusted public key (SPKI PEM, or 64 hex digits). `None`: the
    /// development key, if it exists.
    pub key: Option<PathBuf>,
    /// Print the report as JSON on stdout.
    pub json: bool,
}

/// Runs `imager keygen`: prints the files written and the key id, never the key.
pub fn run_keygen(args: &KeygenOptions) -> Result<()> {
    let public = args.public_path();
    let id = keygen(&args.out_private, &public, args.force)?;
    println!(
        "keygen: wrote private key {} (mode 0600) and public key {}: key {id}",
        args.out_private.display(),
        public.display()
    );
    Ok(())
}

/// Runs `imager verify`. Returns the exit code: 0 verified, 1 verification
/// failed (reported on stdout). Errors (no usable trusted key) are for the
/// caller to print.
pub fn run_verify(args: &VerifyOptions) -> Result<i32> {
    let manifest = if args.manifest.is_dir() {
        args.manifest.join(super::MANIFEST_NAME)
    } else {
        args.manifest.clone()
    };
    let default_key = dev_key_for(&args.manifest, &manifest).unwrap_or_else(default_dev_pub);
    let stdout = std::io::stdout();
    let stderr = std::io::stderr();
    run_verify_to(args, &default_key, &mut stdout.lock(), &mut stderr.lock())
}

/// [`run_verify`] with the default key and the outputs given (for tests).
pub fn run_verify_to(
    args: &VerifyOptions,
    default_key: &Path,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<i32> {
    let key_path = match &args.key {
        Some(k) => k.clone(),
        None if default_key.exists() => {
            writeln!(
                err,
                "verify: no --key given: trusting the development public key {}",
                default_key.display()
            )?;
            default_key.to_path_buf()
        }
        None => bail!(
            "no --key given and the development public key {} does not exist: \
             pass --key with the public key that signed the manifest",
            default_key.display()
        ),
    };
    let key = load_public_key(&key_path)?;
    let report = match verify(&args.manifest, &key) {
        Ok(r) => r,
        Err(e) => {
            if args.json {
                let v = serde_json::json!({
                    "manifest": args.manifest.display().to_string(),
                    "ok": false,
                    "problems": 1,
                    "key_id": super::key_id(&key),
                    "error": format!("{e:#}"),
                    "artifacts": [],
                });
                writeln!(out, "{}", serde_json::to_string_pretty(&v)?)?;
            } else {
                writeln!(out, "BAD {e:#}")?;
                writeln!(out, "verify: FAILED (1 problem)")?;
            }
            return Ok(1);
        }
    };
    if args.json {
        writeln!(out, "{}", serde_json::to_string_pretty(&report)?)?;
    } else {
        writeln!(
            out,
            "ok  signature {} (key {})",
            report.manifest, report.key_id
        )?;
        for a in &report.artifacts {
            writeln!(out, "{}", a.line())?;
        }
        if report.ok {
            writeln!(
                out,
                "verify: OK ({} artifact{}, key {})",
                report.artifacts.len(),
                plural(report.artifacts.len()),
                report.key_id
            )?;
        } else {
            writeln!(
                out,
                "verify: FAILED ({} problem{})",
                report.problems,
                plural(report.problems)
            )?;
        }
    }
    Ok(if report.ok { 0 } else { 1 })
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}
