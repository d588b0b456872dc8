//! `imager kernel build|check`: what they do, from plain options (the
//! `imager` binary parses the command line).

use super::audit::{Rules, Waiver, audit_with_source, load_waivers};
use super::build::{KernelRequest, build, configure_only, default_cache_dir, source_symbols};
use super::config::KernelConfig;
use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// The default kernel source (Debian's linux-source-6.12 package).
pub const DEFAULT_SOURCE: &str = "/usr/src/linux-source-6.12.tar.xz";

/// The default fragments, in kernel-config/, merged in this order.
pub const DEFAULT_FRAGMENTS: [&str; 4] = [
    "base.config",
    "network.config",
    "kspp.config",
    "hardening-distro.config",
];

/// `imager kernel build` from its flags (not from a profile).
#[derive(Debug, Clone)]
pub struct BuildOptions {
    /// Kernel source: a .tar.xz/.tar.gz tarball or an unpacked tree.
    pub source: PathBuf,
    /// Config fragments, merged in order onto tinyconfig. Empty:
    /// [`DEFAULT_FRAGMENTS`] of kernel-config/.
    pub fragments: Vec<PathBuf>,
    pub audit: AuditOptions,
    /// Kernel command line to audit (the image's boot parameters).
    pub cmdline: String,
    /// Cache directory. `None`: [`default_cache_dir`].
    pub cache_dir: Option<PathBuf>,
    /// Parallel make jobs. `None`: the number of CPUs.
    pub jobs: Option<usize>,
    /// The kernel build timestamp (KBUILD_BUILD_TIMESTAMP), seconds since
    /// 1970. `None`: 0, as a profile's kernel.build_epoch.
    pub source_date_epoch: Option<u64>,
    /// File with a 64-hex-digit randstruct seed. `None`: derived from the
    /// cache key.
    pub randstruct_seed: Option<PathBuf>,
    /// Configure and audit only; print the final `.config`.
    pub configure_only: bool,
}

/// Where the KSPP rules and waivers come from (shared by build and check).
#[derive(Debug, Clone, Default)]
pub struct AuditOptions {
    /// KSPP rule table. `None`: kernel-config/kspp-rules.yaml.
    pub rules: Option<PathBuf>,
    /// Waiver files. Empty: kernel-config/kspp-waivers.yaml.
    pub waivers: Vec<PathBuf>,
    /// Use no waivers at all (not even the default file).
    pub no_waivers: bool,
}

impl AuditOptions {
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

/// `imager kernel check`.
#[derive(Debug, Clone)]
pub struct CheckOptions {
    /// The kernel .config to audit.
    pub config: PathBuf,
    /// File holding the kernel command line to audit too.
    pub cmdline: Option<PathBuf>,
    /// The kernel source the config belongs to (tarball or tree): its
    /// Kconfig decides which options exist. `None`: the rules' version
    /// ranges decide (and the report says so).
    pub source: Option<PathBuf>,
    pub audit: AuditOptions,
    /// Print the report as JSON.
    pub json: bool,
}

/// Runs `imager kernel build`: prints the bzImage's path.
pub fn run_build(opts: &BuildOptions) -> Result<ExitCode> {
    let req = build_request(opts)?;
    run_request(&req, opts.configure_only)
}

/// Builds `req` and prints the bzImage's path, or with `configure_only`
/// configures and audits it and prints the final `.config`.
pub fn run_request(req: &KernelRequest, configure_only_: bool) -> Result<ExitCode> {
    if configure_only_ {
        print!("{}", configure_only(req)?);
        return Ok(ExitCode::SUCCESS);
    }
    let built = build(req)?;
    println!("{}", built.bzimage.display());
    if built.cached {
        eprintln!("kernel: cached ({})", built.cache_key);
    }
    Ok(ExitCode::SUCCESS)
}

/// Turns `imager kernel build` options into a request, filling defaults.
pub fn build_request(args: &BuildOptions) -> Result<KernelRequest> {
    let fragments = if args.fragments.is_empty() {
        let dir = kernel_config_dir()?;
        DEFAULT_FRAGMENTS.iter().map(|f| dir.join(f)).collect()
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
        // The flags build amd64; another architecture's kernel is built
        // from its profile (`--profile metal-arm64`), which names its
        // fragments and command line.
        arch: contract::Arch::Amd64,
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

/// Runs `imager kernel check`: exits 1 when a rule fails.
pub fn run_check(args: &CheckOptions) -> Result<ExitCode> {
    let rules = Rules::load(&args.audit.rules_path()?)?;
    let config = KernelConfig::load(&args.config)?;
    let cmdline = match &args.cmdline {
        Some(p) => Some(crate::input::read_text(p, "kernel command line", 64 << 10)?),
        None => None,
    };
    let waivers = args.audit.waivers()?;
    let symbols = match &args.source {
        Some(src) => {
            let arch = config.header_arch.clone().with_context(|| {
                format!(
                    "{} has no `# Linux/<arch> <version> Kernel Configuration` header",
                    args.config.display()
                )
            })?;
            Some(source_symbols(&default_cache_dir(), src, &arch)?)
        }
        None => None,
    };
    let report = audit_with_source(
        &rules,
        &config,
        cmdline.as_deref(),
        &waivers,
        symbols.as_ref(),
    )?;
    if args.json {
        println!("{}", report.to_json()?);
        eprintln!("note: N/A decided by {}", report.basis);
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
/// upwards, then from the running executable's directory upwards (a
/// `target/*/imager` run from anywhere). Not from a path fixed at compile
/// time: that would put the build machine's checkout path into every
/// binary, the installer in `installer.tar` and `live.iso` included, and
/// two checkouts would build different images (tests/reproducible.rs).
pub fn kernel_config_dir() -> Result<PathBuf> {
    let cwd = std::env::current_dir().ok();
    let exe = std::env::current_exe().ok();
    let starts = [cwd.as_deref(), exe.as_deref().and_then(Path::parent)];
    if let Some(dir) = find_kernel_config(starts.into_iter().flatten()) {
        return Ok(dir);
    }
    bail!(
        "cannot find kernel-config/kspp-rules.yaml from {} or its parents, nor from imager's own \
         directory: run inside the repository or pass --rules",
        cwd.unwrap_or_default().display()
    )
}

/// The first `kernel-config/` holding `kspp-rules.yaml` in any of `starts`
/// or their ancestors, in that order.
fn find_kernel_config<'a>(starts: impl IntoIterator<Item = &'a Path>) -> Option<PathBuf> {
    let marker = Path::new("kernel-config").join("kspp-rules.yaml");
    starts
        .into_iter()
        .flat_map(Path::ancestors)
        .find(|dir| dir.join(&marker).is_file())
        .map(|dir| dir.join("kernel-config"))
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let args = |c: &Path| CheckOptions {
            config: c.to_path_buf(),
            cmdline: None,
            source: None,
            audit: AuditOptions {
                rules: Some(rules.clone()),
                waivers: vec![],
                no_waivers: true,
            },
            json: false,
        };
        assert_eq!(run_check(&args(&good)).unwrap(), ExitCode::SUCCESS);
        assert_eq!(run_check(&args(&bad)).unwrap(), ExitCode::FAILURE);
    }

    #[test]
    fn kernel_config_is_found_above_the_first_start_then_the_next() {
        let root = tempfile::tempdir().unwrap();
        let (a, b) = (root.path().join("a"), root.path().join("b"));
        for d in [&a, &b] {
            std::fs::create_dir_all(d.join("kernel-config")).unwrap();
            std::fs::create_dir_all(d.join("x/y")).unwrap();
        }
        std::fs::write(b.join("kernel-config/kspp-rules.yaml"), "rules: []\n").unwrap();
        let (ay, by) = (a.join("x/y"), b.join("x/y"));
        // a has no rule table: passed over, whichever comes first.
        let found = find_kernel_config([ay.as_path(), by.as_path()]);
        assert_eq!(found, Some(b.join("kernel-config")));
        std::fs::write(a.join("kernel-config/kspp-rules.yaml"), "rules: []\n").unwrap();
        let found = find_kernel_config([ay.as_path(), by.as_path()]);
        assert_eq!(found, Some(a.join("kernel-config")));
        let found = find_kernel_config([by.as_path(), ay.as_path()]);
        assert_eq!(found, Some(b.join("kernel-config")));
        assert_eq!(find_kernel_config([root.path()]), None);
    }
}
