//! `imager kernel build|check`.

use super::audit::{Rules, Waiver, audit, load_waivers};
use super::build::{KSPP_CMDLINE, KernelRequest, build, default_cache_dir};
use super::config::KernelConfig;
use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// The default kernel source (Debian's linux-source-6.1 package).
pub const DEFAULT_SOURCE: &str = "/usr/src/linux-source-6.1.tar.xz";

#[derive(Debug, Clone, clap::Subcommand)]
pub enum KernelCommand {
    /// Build the hardened kernel (or return it from the cache).
    Build(BuildArgs),
    /// Audit a kernel .config (and optionally a command line) against the KSPP rules.
    Check(CheckArgs),
}

#[derive(Debug, Clone, clap::Args)]
pub struct BuildArgs {
    /// Take source, fragments, rules, waivers, command line and build epoch
    /// from this profile (name or path) instead of the flags below.
    #[arg(long, conflicts_with_all = ["source", "fragments", "rules", "waivers", "no_waivers", "cmdline", "source_date_epoch", "randstruct_seed"])]
    pub profile: Option<String>,
    /// Kernel source: a .tar.xz/.tar.gz tarball or an unpacked tree.
    #[arg(long, default_value = DEFAULT_SOURCE)]
    pub source: PathBuf,
    /// Config fragment, merged in order onto tinyconfig (repeatable).
    /// Default: kernel-config/base.config and kernel-config/kspp.config.
    #[arg(long = "fragment")]
    pub fragments: Vec<PathBuf>,
    #[command(flatten)]
    pub audit: AuditArgs,
    /// Kernel command line to audit (the image's boot parameters).
    #[arg(long, default_value = KSPP_CMDLINE)]
    pub cmdline: String,
    /// Cache directory. Default: $IMAGER_CACHE_DIR, $XDG_CACHE_HOME/imager or ~/.cache/imager.
    #[arg(long)]
    pub cache_dir: Option<PathBuf>,
    /// Parallel make jobs. Default: the number of CPUs.
    #[arg(long, short = 'j')]
    pub jobs: Option<usize>,
    /// The kernel build timestamp (KBUILD_BUILD_TIMESTAMP), seconds since 1970. Default: 0, as a profile's kernel.build_epoch.
    #[arg(long)]
    pub source_date_epoch: Option<u64>,
    /// File with a 64-hex-digit randstruct seed. Default: derived from the cache key.
    #[arg(long)]
    pub randstruct_seed: Option<PathBuf>,
}

/// Where the KSPP rules and waivers come from (shared by build and check).
#[derive(Debug, Clone, clap::Args)]
pub struct AuditArgs {
    /// KSPP rule table. Default: kernel-config/kspp-rules.yaml.
    #[arg(long)]
    pub rules: Option<PathBuf>,
    /// Waiver file (repeatable). Default: kernel-config/kspp-waivers.yaml.
    #[arg(long = "waivers")]
    pub waivers: Vec<PathBuf>,
    /// Use no waivers at all (not even the default file).
    #[arg(long, conflicts_with = "waivers")]
    pub no_waivers: bool,
}

impl AuditArgs {
    /// The rule table: `--rules`, else kernel-config/kspp-rules.yaml.
    pub fn rules_path(&self) -> Result<PathBuf> {
        match &self.rules {
            Some(r) => Ok(r.clone()),
            None => Ok(kernel_config_dir()?.join("kspp-rules.yaml")),
        }
    }

    /// The waivers of `--waivers` files, the default file, or none.
    pub fn waivers(&self) -> Result<Vec<Waiver>> {
        resolve_waivers(&self.waivers, self.no_waivers)
    }
}

#[derive(Debug, Clone, clap::Args)]
pub struct CheckArgs {
    /// The kernel .config to audit.
    pub config: PathBuf,
    /// File holding the kernel command line to audit too.
    #[arg(long)]
    pub cmdline: Option<PathBuf>,
    #[command(flatten)]
    pub audit: AuditArgs,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Runs a kernel subcommand; `check` exits 1 when a rule fails.
pub fn run(cmd: &KernelCommand) -> Result<ExitCode> {
    match cmd {
        KernelCommand::Build(args) => {
            let req = build_request(args)?;
            let built = build(&req)?;
            println!("{}", built.bzimage.display());
            if built.cached {
                eprintln!("kernel: cached ({})", built.cache_key);
            }
            Ok(ExitCode::SUCCESS)
        }
        KernelCommand::Check(args) => check(args),
    }
}

/// Turns `imager kernel build` arguments into a request, filling defaults.
pub fn build_request(args: &BuildArgs) -> Result<KernelRequest> {
    let fragments = if args.fragments.is_empty() {
        let dir = kernel_config_dir()?;
        vec![dir.join("base.config"), dir.join("kspp.config")]
    } else {
        args.fragments.clone()
    };
    let rules = args.audit.rules_path()?;
    let waivers = args.audit.waivers()?;
    // Not $SOURCE_DATE_EPOCH: the kernel's timestamp is the profile's
    // kernel.build_epoch (default 0), so that `imager kernel build` and
    // `imager build` share one cache entry.
    let source_date_epoch = args.source_date_epoch.unwrap_or_default();
    let jobs = args.jobs.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    });
    Ok(KernelRequest {
        source: args.source.clone(),
        fragments,
        rules,
        waivers,
        cmdline: args.cmdline.clone(),
        cache_dir: args.cache_dir.clone().unwrap_or_else(default_cache_dir),
        source_date_epoch,
        jobs,
        randstruct_seed: args.randstruct_seed.clone(),
    })
}

fn check(args: &CheckArgs) -> Result<ExitCode> {
    let rules = Rules::load(&args.audit.rules_path()?)?;
    let config = KernelConfig::load(&args.config)?;
    let cmdline = match &args.cmdline {
        Some(p) => Some(
            std::fs::read_to_string(p)
                .with_context(|| format!("reading the command line {}", p.display()))?,
        ),
        None => None,
    };
    let waivers = args.audit.waivers()?;
    let report = audit(&rules, &config, cmdline.as_deref(), &waivers)?;
    if args.json {
        println!("{}", report.to_json()?);
        eprintln!("{}", report.summary());
    } else {
        println!("{}", report.render_text().trim_end());
    }
    Ok(if report.failures().is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn resolve_waivers(files: &[PathBuf], none: bool) -> Result<Vec<Waiver>> {
    if none {
        return Ok(Vec::new());
    }
    let files = if files.is_empty() {
        vec![kernel_config_dir()?.join("kspp-waivers.yaml")]
    } else {
        files.to_vec()
    };
    let mut out: Vec<Waiver> = Vec::new();
    for f in &files {
        out.extend(load_waivers(f)?);
    }
    super::audit::validate_waivers(&out)?;
    Ok(out)
}

/// `kernel-config/` of the repository: searched from the current directory
/// upwards, then next to this crate's sources (a cargo run from anywhere).
pub fn kernel_config_dir() -> Result<PathBuf> {
    let marker = Path::new("kernel-config").join("kspp-rules.yaml");
    if let Ok(cwd) = std::env::current_dir() {
        for dir in cwd.ancestors() {
            if dir.join(&marker).is_file() {
                return Ok(dir.join("kernel-config"));
            }
        }
    }
    let built_in = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("kernel-config");
    if built_in.join("kspp-rules.yaml").is_file() {
        return Ok(built_in);
    }
    bail!(
        "cannot find kernel-config/kspp-rules.yaml from {} or its parents: run inside the repository or pass --rules",
        std::env::current_dir().unwrap_or_default().display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(subcommand)]
        cmd: KernelCommand,
    }

    #[test]
    fn parses_build_defaults() {
        let cli = Cli::try_parse_from(["kernel", "build", "-j", "3"]).unwrap();
        let KernelCommand::Build(args) = cli.cmd else {
            panic!("not build")
        };
        let req = build_request(&args).unwrap();
        assert_eq!(req.source, PathBuf::from(DEFAULT_SOURCE));
        assert_eq!(req.jobs, 3);
        assert!(req.fragments[0].ends_with("kernel-config/base.config"));
        assert!(req.fragments[1].ends_with("kernel-config/kspp.config"));
        assert!(req.rules.ends_with("kernel-config/kspp-rules.yaml"));
        assert!(req.waivers.iter().any(|w| w.option == "CONFIG_CFI_CLANG"));
        assert_eq!(req.cmdline, KSPP_CMDLINE);
    }

    #[test]
    fn check_exit_code_follows_failures() {
        let dir = tempfile::tempdir().unwrap();
        let rules = dir.path().join("rules.yaml");
        std::fs::write(
            &rules,
            "rules:\n  - {option: CONFIG_A, wanted: y, why: a}\n",
        )
        .unwrap();
        let good = dir.path().join("good.config");
        std::fs::write(
            &good,
            "# Linux/x86 6.1.1 Kernel Configuration\nCONFIG_A=y\n",
        )
        .unwrap();
        let bad = dir.path().join("bad.config");
        std::fs::write(
            &bad,
            "# Linux/x86 6.1.1 Kernel Configuration\n# CONFIG_A is not set\n",
        )
        .unwrap();
        let args = |c: &Path| CheckArgs {
            config: c.to_path_buf(),
            cmdline: None,
            audit: AuditArgs {
                rules: Some(rules.clone()),
                waivers: vec![],
                no_waivers: true,
            },
            json: false,
        };
        assert_eq!(check(&args(&good)).unwrap(), ExitCode::SUCCESS);
        assert_eq!(check(&args(&bad)).unwrap(), ExitCode::FAILURE);
    }
}
