//! `imager kernel build|check`: the arguments.

use imager::kernel::build::KSPP_CMDLINE;
use imager::kernel::command::{self, AuditOptions, BuildOptions, CheckOptions, DEFAULT_SOURCE};
use std::path::PathBuf;
use std::process::ExitCode;

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
    /// Default: kernel-config/base.config, network.config, kspp.config and
    /// hardening-distro.config (the default profile's).
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
    /// Only configure and audit (tinyconfig, fragments, olddefconfig,
    /// audit): print the final .config instead of building. Nothing is cached.
    #[arg(long)]
    pub configure_only: bool,
}

impl BuildArgs {
    /// The options of a build from flags (`--profile` is the caller's).
    pub fn options(&self) -> BuildOptions {
        BuildOptions {
            source: self.source.clone(),
            fragments: self.fragments.clone(),
            audit: self.audit.options(),
            cmdline: self.cmdline.clone(),
            cache_dir: self.cache_dir.clone(),
            jobs: self.jobs,
            source_date_epoch: self.source_date_epoch,
            randstruct_seed: self.randstruct_seed.clone(),
            configure_only: self.configure_only,
        }
    }
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
    pub fn options(&self) -> AuditOptions {
        AuditOptions {
            rules: self.rules.clone(),
            waivers: self.waivers.clone(),
            no_waivers: self.no_waivers,
        }
    }
}

#[derive(Debug, Clone, clap::Args)]
pub struct CheckArgs {
    /// The kernel .config to audit.
    pub config: PathBuf,
    /// File holding the kernel command line to audit too.
    #[arg(long)]
    pub cmdline: Option<PathBuf>,
    /// The kernel source of the config (.tar.xz or tree): an option its
    /// Kconfig does not define is N/A. Without it the rules' version ranges
    /// decide.
    #[arg(long)]
    pub source: Option<PathBuf>,
    #[command(flatten)]
    pub audit: AuditArgs,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

impl CheckArgs {
    pub fn options(&self) -> CheckOptions {
        CheckOptions {
            config: self.config.clone(),
            cmdline: self.cmdline.clone(),
            source: self.source.clone(),
            audit: self.audit.options(),
            json: self.json,
        }
    }
}

/// Runs a kernel subcommand; `check` exits 1 when a rule fails.
pub fn run(cmd: &KernelCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        KernelCommand::Build(args) => command::run_build(&args.options()),
        KernelCommand::Check(args) => command::run_check(&args.options()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Cli, Command};
    use clap::Parser;

    #[test]
    fn parses_build_defaults() {
        let cli = Cli::try_parse_from(["imager", "kernel", "build", "-j", "3"]).unwrap();
        let Command::Kernel {
            command: KernelCommand::Build(args),
        } = cli.command
        else {
            panic!("not build")
        };
        let req = command::build_request(&args.options()).unwrap();
        assert_eq!(req.source, PathBuf::from(DEFAULT_SOURCE));
        assert_eq!(req.jobs, 3);
        assert!(req.fragments[0].ends_with("kernel-config/base.config"));
        assert!(req.fragments[1].ends_with("kernel-config/network.config"));
        assert!(req.fragments[2].ends_with("kernel-config/kspp.config"));
        assert!(req.fragments[3].ends_with("kernel-config/hardening-distro.config"));
        assert!(req.rules.ends_with("kernel-config/kspp-rules.yaml"));
        assert!(req.waivers.iter().any(|w| w.option == "CONFIG_CFI_CLANG"));
        assert_eq!(req.cmdline, KSPP_CMDLINE);
    }
}
