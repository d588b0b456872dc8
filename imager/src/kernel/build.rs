//! The cached, reproducible kernel build.
//!
//! `<cache>/kernel/<key>/{bzImage,config,build.log,build-info.json}` is the
//! result for one cache key; the key is a SHA-256 over everything that
//! decides the output (source, requested config, compiler, epoch, seed,
//! recipe). A build works in `<cache>/kernel/<key>.tmp-<pid>/` and the result
//! appears only by renaming a finished directory into place, so an
//! interrupted build never leaves a `<key>/` behind; the work directory
//! (with the ~1.5 GB source tree) is deleted on success and on failure (a
//! failed step's log is kept as `<key>.failed.log`), and leftovers of killed
//! builds are swept by the next build.
//!
//! Beside the kernel the cache keeps `kconfig-symbols`, the options the
//! source's Kconfig defines (one per line): the audit of a cached kernel
//! uses it to decide N/A without unpacking the source again. A cache entry
//! without it (made before it existed) gets it from the source on first use.

use super::audit::{Rules, Waiver, audit_with_source, validate_waivers};
use super::config::{
    KernelConfig, compare, describe_mismatches, kconfig_dependencies, merge_fragments, merge_onto,
};
use super::kconfig::KconfigSymbols;
use crate::io::sha256_file;
use anyhow::{Context, Result, bail};
use contract::Arch;
use sha2::{Digest, Sha256};
use std::collections::VecDeque;
use std::fs::{self, File};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Bump when anything in how the kernel is built changes (steps, make
/// variables, environment): it invalidates every cached kernel.
pub const RECIPE_VERSION: &str = "imager-kernel-recipe-2";

/// How many `  CC ` lines the default configuration's build prints (1503 for
/// 6.12.117 + base.config + kspp.config + hardening-distro.config; 1388 for
/// 6.1.192 + base.config + the 6.1 KSPP fragment);
/// only sizes the progress bar (which grows if the estimate is short).
const EXPECTED_OBJECTS: u64 = 1500;

/// The KSPP-recommended boot parameters (everything the cmdline rules in
/// kspp-rules.yaml ask for on 6.12/x86_64 with GCC, where `cfi=kcfi` is
/// waived: it needs CONFIG_CFI_CLANG); profiles append console= etc.
pub const KSPP_CMDLINE: &str = "hardened_usercopy=1 init_on_alloc=1 init_on_free=1 \
    randomize_kstack_offset=on page_alloc.shuffle=1 slab_nomerge pti=on \
    iommu.passthrough=0 iommu.strict=1 mitigations=auto,nosmt vsyscall=none vdso32=0 \
    debugfs=off oops=panic lockdown=confidentiality";

/// Lines of build.log shown when a step fails.
const LOG_TAIL_LINES: usize = 40;

/// What to build. The profile fills this in; `imager kernel build` has defaults.
#[derive(Debug, Clone)]
pub struct KernelRequest {
    /// The architecture built for: amd64 natively, arm64 with the Debian
    /// cross compiler (`contract::arch`).
    pub arch: Arch,
    /// A `.tar.xz`/`.tar.gz` tarball (one top-level directory) or an unpacked tree.
    pub source: PathBuf,
    /// Config fragments, merged in order onto `make tinyconfig` (later wins).
    pub fragments: Vec<PathBuf>,
    /// The KSPP rule table.
    pub rules: PathBuf,
    pub waivers: Vec<Waiver>,
    /// The kernel command line the image will boot with (audited, not built in).
    pub cmdline: String,
    pub cache_dir: PathBuf,
    pub source_date_epoch: u64,
    pub jobs: usize,
    /// A file holding the randstruct seed (64 hex digits). `None`: derive it
    /// from the cache key (see [`randstruct_seed`]).
    pub randstruct_seed: Option<PathBuf>,
}

/// A built (or cached) kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuiltKernel {
    pub bzimage: PathBuf,
    /// The final `.config` the kernel was built with.
    pub config: PathBuf,
    pub cache_key: String,
    /// True when the result came from the cache without building.
    pub cached: bool,
}

/// `$IMAGER_CACHE_DIR`, else `$XDG_CACHE_HOME/imager`, else `$HOME/.cache/imager`.
pub fn default_cache_dir() -> PathBuf {
    let non_empty = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    if let Some(d) = non_empty("IMAGER_CACHE_DIR") {
        return PathBuf::from(d);
    }
    if let Some(d) = non_empty("XDG_CACHE_HOME") {
        return PathBuf::from(d).join("imager");
    }
    let home = non_empty("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/root"));
    home.join(".cache").join("imager")
}

/// Builds the kernel, or returns the cached one. Either way the final config
/// is audited against the KSPP rules (with the request's command line and
/// waivers) and a non-waived failure is an error.
pub fn build(req: &KernelRequest) -> Result<BuiltKernel> {
    build_shared(req, None)
}

/// A build cache shared through a registry, and the signer of what this
/// machine adds to it ([`crate::remote_cache`]).
pub use crate::remote_cache::Shared;

/// [`build`], with a shared cache: on a local miss the kernel is pulled
/// from it when it holds a trusted entry for the key (a refused entry is
/// said, and the kernel built here); a kernel built here, or found in the
/// local cache, is added to it when it lacks the key. The shared cache is
/// an optimisation: its failures are warnings.
pub fn build_shared(req: &KernelRequest, shared: Option<Shared>) -> Result<BuiltKernel> {
    if !req.source.exists() {
        bail!(
            "kernel source {} not found: install linux-source-6.12 (scripts/setup.sh) or set kernel.source in the profile",
            req.source.display()
        );
    }
    validate_waivers(&req.waivers)?;
    let rules = Rules::load(&req.rules)?;
    let requested = load_fragments(&req.fragments)?;
    let seed_file = match &req.randstruct_seed {
        Some(p) => Some(read_seed(p)?),
        None => None,
    };
    let key = cache_key(req, &requested, seed_file.as_deref())?;
    let kernel_dir = req.cache_dir.join("kernel");
    let final_dir = kernel_dir.join(&key);
    let result = BuiltKernel {
        bzimage: final_dir.join("bzImage"),
        config: final_dir.join("config"),
        cache_key: key.clone(),
        cached: true,
    };
    if result.bzimage.is_file() && result.config.is_file() {
        let cfg = KernelConfig::load(&result.config)?;
        let symbols = cached_symbols(&final_dir, &req.source, &cfg)?;
        audit_or_fail(&rules, &cfg, &req.cmdline, &req.waivers, Some(&symbols))?;
        share(shared, &key, &final_dir);
        return Ok(result);
    }

    fs::create_dir_all(&kernel_dir)
        .with_context(|| format!("creating {}", kernel_dir.display()))?;
    sweep_stale_work_dirs(&kernel_dir);
    if let Some(s) = shared
        && pull_shared(s, &key, &kernel_dir, &final_dir)?
    {
        let cfg = KernelConfig::load(&result.config)?;
        let symbols = cached_symbols(&final_dir, &req.source, &cfg)?;
        audit_or_fail(&rules, &cfg, &req.cmdline, &req.waivers, Some(&symbols))?;
        return Ok(result);
    }
    let work = WorkDir::create(kernel_dir.join(format!("{key}.tmp-{}", std::process::id())))?;
    let started = Instant::now();
    let make = prepare_tree(req, &key, &kernel_dir, &work.path, seed_file)?;
    let symbols = configure(&make, req, &requested, &rules)?;
    let target = req.arch.spec().kernel_target;
    crate::progress::line(&format!(
        "kernel: building {target} for {} with {} job(s); log: {}",
        req.arch,
        make.jobs,
        make.log.display()
    ));
    let jobs = format!("-j{}", make.jobs);
    make.run(&[jobs.as_str(), target], Some(EXPECTED_OBJECTS))?;
    let elapsed = started.elapsed();

    // Stage the result next to the work tree, then rename it into place.
    let out = work.path.join("out");
    stage_result(req, &make, &key, elapsed, &symbols, &out)?;
    if let Err(e) = fs::rename(&out, &final_dir) {
        // Another build of the same key may have finished first: use it.
        if !result.bzimage.is_file() {
            return Err(e)
                .with_context(|| format!("renaming the result into {}", final_dir.display()));
        }
    }
    sync_dir(&kernel_dir)?;
    let _ = fs::remove_file(kernel_dir.join(format!("{key}.failed.log")));
    drop(work); // deletes the source tree
    crate::progress::line(&format!(
        "kernel: built in {} -> {}",
        format_duration(elapsed),
        result.bzimage.display()
    ));
    share(shared, &key, &final_dir);
    Ok(BuiltKernel {
        cached: false,
        ..result
    })
}

/// Pulls the entry for `key` from the shared cache into `final_dir` (through
/// a work directory renamed into place, as a build's result): whether it
/// did. A miss, a refused entry or an unreachable registry is said, and
/// the caller builds.
fn pull_shared(shared: Shared, key: &str, kernel_dir: &Path, final_dir: &Path) -> Result<bool> {
    // A work directory the next build sweeps if this one is killed.
    let work = WorkDir::create(kernel_dir.join(format!("{key}-pull.tmp-{}", std::process::id())))?;
    let tmp = work.path.join("entry");
    if !shared.pull("kernel", key, &tmp) {
        return Ok(false);
    }
    sync_dir(&tmp)?;
    if let Err(e) = fs::rename(&tmp, final_dir) {
        // Another build of the same key may have put it there first.
        if !final_dir.join("bzImage").is_file() {
            return Err(e).with_context(|| {
                format!("renaming the pulled kernel into {}", final_dir.display())
            });
        }
    }
    sync_dir(kernel_dir)?;
    crate::progress::line("kernel: nothing compiled");
    Ok(true)
}

/// Adds the kernel of `key` in `dir` to the shared cache when it lacks it;
/// a failure is a warning.
fn share(shared: Option<Shared>, key: &str, dir: &Path) {
    if let Some(s) = shared {
        s.push("kernel", key, dir);
    }
}

/// Configures the kernel as [`build`] would (tinyconfig, the fragments,
/// olddefconfig, the dropped-option check and the audit against the
/// source's Kconfig) without compiling it, and returns the final `.config`
/// as Kconfig wrote it (header included).
/// Nothing is cached; the work tree is deleted. Seconds instead of minutes:
/// how a second kernel version is kept buildable without compiling it in CI.
pub fn configure_only(req: &KernelRequest) -> Result<String> {
    if !req.source.exists() {
        bail!(
            "kernel source {} not found: install its linux-source package (scripts/setup.sh) or set kernel.source in the profile",
            req.source.display()
        );
    }
    validate_waivers(&req.waivers)?;
    let rules = Rules::load(&req.rules)?;
    let requested = load_fragments(&req.fragments)?;
    let key = cache_key(req, &requested, None)?;
    let kernel_dir = req.cache_dir.join("kernel");
    fs::create_dir_all(&kernel_dir)
        .with_context(|| format!("creating {}", kernel_dir.display()))?;
    let work = WorkDir::create(kernel_dir.join(format!("{key}.cfg-{}", std::process::id())))?;
    let make = prepare_tree(req, &key, &kernel_dir, &work.path, None)?;
    configure(&make, req, &requested, &rules)?;
    let dot_config = make.tree.join(".config");
    fs::read_to_string(&dot_config).with_context(|| format!("reading {}", dot_config.display()))
}

/// Starts build.log in the work directory `work`, unpacks the source into
/// `work/src` and writes the randstruct seed script: how to run make there.
fn prepare_tree(
    req: &KernelRequest,
    key: &str,
    kernel_dir: &Path,
    work: &Path,
    seed_file: Option<String>,
) -> Result<Make> {
    let src = work.join("src");
    let log_path = work.join("build.log");
    let mut log =
        File::create(&log_path).with_context(|| format!("creating {}", log_path.display()))?;
    writeln!(
        log,
        "imager kernel build {key}\nsource {}",
        req.source.display()
    )?;

    crate::progress::line(&format!("kernel: unpacking {}", req.source.display()));
    unpack_source(&req.source, &src)?;

    let seed = match seed_file {
        Some(s) => s,
        None => randstruct_seed(key),
    };
    let seed_script = work.join("gen-randstruct-seed.sh");
    write_seed_script(&seed_script, &seed)?;
    Ok(Make {
        tree: src,
        log: log_path,
        epoch: req.source_date_epoch,
        jobs: req.jobs.max(1),
        arch: req.arch,
        seed_script,
        compiler_seed: compiler_random_seed(key),
        failed_log: kernel_dir.join(format!("{key}.failed.log")),
    })
}

/// `make tinyconfig`, the requested fragments merged onto it, `make
/// olddefconfig`; fails unless every requested option survived and the
/// final config passes the audit. Returns the options the tree's Kconfig
/// defines (what the audit decided N/A by).
fn configure(
    make: &Make,
    req: &KernelRequest,
    requested: &KernelConfig,
    rules: &Rules,
) -> Result<KconfigSymbols> {
    crate::progress::line(&format!(
        "kernel: configuring (tinyconfig + {} fragment(s))",
        req.fragments.len()
    ));
    make.run(&["tinyconfig"], None)?;
    let dot_config = make.tree.join(".config");
    let base = KernelConfig::load(&dot_config)?;
    let merged = merge_onto(&base, requested);
    fs::write(&dot_config, merged.render())
        .with_context(|| format!("writing {}", dot_config.display()))?;
    make.run(&["olddefconfig"], None)?;
    let final_config = KernelConfig::load(&dot_config)?;
    let configured = srcarch(&final_config)?;
    if configured != req.arch.spec().kernel_arch {
        bail!(
            "the kernel was configured for {} ({}'s header), not for {} as asked",
            contract::text::escape(&configured),
            dot_config.display(),
            req.arch
        );
    }
    let mismatches = compare(requested, &final_config);
    if !mismatches.is_empty() {
        let names: Vec<&str> = mismatches.iter().map(|m| m.option.as_str()).collect();
        let hints = kconfig_dependencies(&make.tree, &names);
        bail!("{}", describe_mismatches(&mismatches, &hints));
    }
    let mut symbols = KconfigSymbols::from_tree(&make.tree, &srcarch(&final_config)?)?;
    symbols.origin = req.source.display().to_string();
    audit_or_fail(
        rules,
        &final_config,
        &req.cmdline,
        &req.waivers,
        Some(&symbols),
    )?;
    Ok(symbols)
}

/// The source architecture (`arch/<dir>`) of a config: its header's.
fn srcarch(config: &KernelConfig) -> Result<String> {
    config
        .header_arch
        .clone()
        .context("the kernel config has no `# Linux/<arch> <version> Kernel Configuration` header")
}

/// The Kconfig symbols of a cached kernel: its `kconfig-symbols`, else read
/// from the source and stored there (best effort: a read-only cache still
/// works, it only reads the source again next time).
fn cached_symbols(dir: &Path, source: &Path, config: &KernelConfig) -> Result<KconfigSymbols> {
    symbols_memo(&dir.join(SYMBOLS_FILE), source, &srcarch(config)?)
}

/// The Kconfig symbols of `source` for `srcarch`, as `kernel check --source`
/// reads them: remembered in the cache directory by the source's hash, so
/// that a tarball's Kconfig files are unpacked once, not at every check.
pub fn source_symbols(cache_dir: &Path, source: &Path, srcarch: &str) -> Result<KconfigSymbols> {
    let kernel = cache_dir.join("kernel");
    let memo = hash_source_memo(source, &kernel.join("source-hashes.json"))
        .ok()
        .filter(|_| {
            !srcarch.is_empty()
                && srcarch
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_')
        });
    let Some(hash) = memo else {
        return KconfigSymbols::from_source(source, srcarch);
    };
    let name = format!("{}-{srcarch}", hash.replace(':', "-"));
    let dir = kernel.join("kconfig");
    let _ = fs::create_dir_all(&dir);
    symbols_memo(&dir.join(name), source, srcarch)
}

/// The symbols stored at `path`, else read from `source` and stored there
/// (best effort, atomically).
fn symbols_memo(path: &Path, source: &Path, srcarch: &str) -> Result<KconfigSymbols> {
    let origin = source.display().to_string();
    if path.is_file() {
        let text = crate::input::read_text(path, "Kconfig symbol list", crate::input::MAX_TEXT)?;
        return KconfigSymbols::parse(&text, &origin)
            .with_context(|| format!("in {}: delete the file to read it again", path.display()));
    }
    crate::progress::line(&format!(
        "kernel: reading the Kconfig files of {}",
        source.display()
    ));
    let symbols = KconfigSymbols::from_source(source, srcarch)?;
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    if fs::write(&tmp, symbols.render()).is_ok() && fs::rename(&tmp, path).is_err() {
        let _ = fs::remove_file(&tmp);
    }
    Ok(symbols)
}

/// The cached list of the source's Kconfig symbols, beside `config`.
const SYMBOLS_FILE: &str = "kconfig-symbols";

/// Copies the result of the tree built by `make` into `out` (bzImage,
/// config, build.log, build-info.json) and syncs it.
fn stage_result(
    req: &KernelRequest,
    make: &Make,
    key: &str,
    elapsed: Duration,
    symbols: &KconfigSymbols,
    out: &Path,
) -> Result<()> {
    fs::create_dir_all(out)?;
    fs::write(out.join(SYMBOLS_FILE), symbols.render())?;
    // The cache keeps the image as `bzImage` whatever the architecture
    // (arm64's is `Image`): one layout for the local and shared caches.
    let image = make.tree.join(req.arch.spec().kernel_image);
    fs::copy(&image, out.join("bzImage"))
        .with_context(|| format!("copying {}", image.display()))?;
    fs::copy(make.tree.join(".config"), out.join("config"))?;
    fs::copy(&make.log, out.join("build.log"))?;
    let info = serde_json::json!({
        "cache_key": key,
        "recipe": RECIPE_VERSION,
        "source": req.source,
        "fragments": req.fragments,
        "arch": req.arch.name(),
        "gcc": gcc_version(req.arch)?,
        "source_date_epoch": req.source_date_epoch,
        "randstruct_seed": if req.randstruct_seed.is_some() { "from file" } else { "derived from cache key" },
        "jobs": make.jobs,
        "build_seconds": elapsed.as_secs(),
        "bzimage_sha256": sha256_file(&out.join("bzImage"))?.0,
    });
    fs::write(
        out.join("build-info.json"),
        serde_json::to_string_pretty(&info)?,
    )?;
    sync_dir(out)
}

/// Loads and merges the fragments (in order, later wins).
pub fn load_fragments(fragments: &[PathBuf]) -> Result<KernelConfig> {
    if fragments.is_empty() {
        bail!("no kernel config fragments given");
    }
    let parsed = fragments
        .iter()
        .map(|p| KernelConfig::load(p))
        .collect::<Result<Vec<_>>>()?;
    Ok(merge_fragments(&parsed))
}

/// Audits and fails on a non-waived FAIL. `symbols`: the Kconfig of the
/// kernel's source (`None`: the rules' version ranges decide N/A).
pub fn audit_or_fail(
    rules: &Rules,
    config: &KernelConfig,
    cmdline: &str,
    waivers: &[Waiver],
    symbols: Option<&KconfigSymbols>,
) -> Result<()> {
    let report = audit_with_source(rules, config, Some(cmdline), waivers, symbols)?;
    let failures = report.failures();
    if failures.is_empty() {
        crate::progress::line(&format!("kernel: {}", report.summary()));
        return Ok(());
    }
    let mut msg = format!("the kernel fails {} KSPP rule(s):\n", failures.len());
    for f in failures {
        msg.push_str(&format!("  {}\n", f.render_line()));
    }
    msg.push_str(&report.summary());
    msg.push_str("\nfix the fragments or kernel command line, or add a waiver with a reason");
    bail!("{msg}")
}

/// The cache key: SHA-256 over the recipe version, the source, the merged
/// requested config, the compiler, the epoch and an explicit seed.
pub fn cache_key(
    req: &KernelRequest,
    requested: &KernelConfig,
    seed: Option<&str>,
) -> Result<String> {
    let mut h = Sha256::new();
    h.update(format!("recipe {RECIPE_VERSION}\n"));
    // amd64, the native build, adds no line: the keys of kernels cached
    // before arm64 existed stay valid.
    if req.arch != Arch::Amd64 {
        h.update(format!("arch {}\n", req.arch.name()));
    }
    let stamps = req.cache_dir.join("kernel").join("source-hashes.json");
    h.update(format!(
        "source {}\n",
        hash_source_memo(&req.source, &stamps)?
    ));
    h.update(format!("gcc {}\n", gcc_version(req.arch)?));
    h.update(format!("epoch {}\n", req.source_date_epoch));
    h.update(format!("seed {}\n", seed.unwrap_or("derived")));
    h.update("config\n");
    h.update(requested.render());
    Ok(hex::encode(h.finalize()))
}

/// [`hash_source`], remembering a tarball's hash by (path, size, mtime,
/// inode) in `stamps` so that a cache hit does not re-read 140 MB.
pub fn hash_source_memo(source: &Path, stamps: &Path) -> Result<String> {
    use std::os::unix::fs::MetadataExt;
    let meta = fs::metadata(source).with_context(|| format!("reading {}", source.display()))?;
    if !meta.is_file() {
        return hash_source(source);
    }
    let abs = fs::canonicalize(source).unwrap_or_else(|_| source.to_path_buf());
    let stamp = format!(
        "{}|{}|{}.{}|{}|{}",
        abs.display(),
        meta.len(),
        meta.mtime(),
        meta.mtime_nsec(),
        meta.ino(),
        meta.dev()
    );
    let mut map: serde_json::Map<String, serde_json::Value> = fs::read(stamps)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default();
    if let Some(serde_json::Value::String(h)) = map.get(&stamp) {
        return Ok(h.clone());
    }
    let hash = hash_source(source)?;
    map.retain(|k, _| !k.starts_with(&format!("{}|", abs.display())));
    map.insert(stamp, serde_json::Value::String(hash.clone()));
    if let Some(dir) = stamps.parent() {
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    crate::io::write_atomic(
        stamps,
        serde_json::to_string_pretty(&map)?.as_bytes(),
        0o644,
    )?;
    Ok(hash)
}

/// A tarball's SHA-256, or for a tree a SHA-256 over its sorted walk
/// (relative path, kind, content hash or link target of every entry).
pub fn hash_source(source: &Path) -> Result<String> {
    let meta = fs::metadata(source).with_context(|| format!("reading {}", source.display()))?;
    if meta.is_file() {
        return Ok(format!("file:{}", sha256_file(source)?.0));
    }
    let mut h = Sha256::new();
    for entry in walkdir::WalkDir::new(source).sort_by_file_name() {
        let entry = entry.with_context(|| format!("walking {}", source.display()))?;
        let rel = entry.path().strip_prefix(source).unwrap_or(entry.path());
        let ft = entry.file_type();
        if ft.is_symlink() {
            let target = fs::read_link(entry.path())?;
            h.update(format!("L {} -> {}\n", rel.display(), target.display()));
        } else if ft.is_file() {
            let file_hash = sha256_file(entry.path())?.0;
            h.update(format!("F {} {file_hash}\n", rel.display()));
        } else if ft.is_dir() {
            h.update(format!("D {}\n", rel.display()));
        }
    }
    Ok(format!("tree:{}", hex::encode(h.finalize())))
}

/// First line of `gcc --version` (the kernel is built with `gcc`).
pub fn gcc_version(arch: Arch) -> Result<String> {
    let gcc = arch.gcc();
    let out = Command::new(&gcc)
        .arg("--version")
        .output()
        .with_context(|| {
            format!("running {gcc} --version (is it installed? scripts/setup.sh installs it)")
        })?;
    if !out.status.success() {
        bail!("{gcc} --version failed: {}", out.status);
    }
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text.lines().next().unwrap_or("").trim().to_string())
}

/// The deterministic randstruct seed derived from the cache key.
///
/// Security trade-off: randstruct only helps against attackers who do not
/// know the structure layout. Upstream draws a fresh random seed per build,
/// which makes every build's layout unique (and unreproducible). Deriving it
/// from the cache key makes the build reproducible, but anyone who has the
/// same inputs (public source, our public fragments) can compute the seed,
/// just as anyone can read the layout out of a published bzImage. For a
/// secret layout, pass a private seed file (`randstruct_seed`) and keep it
/// out of the repository; the build stays reproducible for whoever holds it.
pub fn randstruct_seed(cache_key: &str) -> String {
    let mut h = Sha256::new();
    h.update(b"imager randstruct seed v1\0");
    h.update(cache_key.as_bytes());
    hex::encode(h.finalize())
}

/// GCC's `-frandom-seed`, derived from the cache key.
///
/// The latent_entropy GCC plugin (CONFIG_GCC_PLUGIN_LATENT_ENTROPY) draws the
/// constants it mixes into the boot-time entropy pool from /dev/urandom at
/// compile time unless GCC has a `-frandom-seed`; without one, two builds of
/// the same inputs differ. Fixing the seed makes the build reproducible; the
/// trade-off is the same as for randstruct: the plugin's constants become
/// computable from public inputs (they are readable from the bzImage anyway),
/// and the entropy the plugin actually gathers still comes from run-time
/// control flow.
pub fn compiler_random_seed(cache_key: &str) -> String {
    let mut h = Sha256::new();
    h.update(b"imager gcc random seed v1\0");
    h.update(cache_key.as_bytes());
    hex::encode(&h.finalize()[..8])
}

fn read_seed(path: &Path) -> Result<String> {
    let text = fs::read_to_string(path)
        .with_context(|| format!("reading the randstruct seed {}", path.display()))?;
    let seed = text.trim().to_ascii_lowercase();
    if seed.len() != 64 || !seed.bytes().all(|b| b.is_ascii_hexdigit()) {
        bail!(
            "randstruct seed {} must hold 64 hex digits (e.g. `od -A n -t x8 -N 32 /dev/urandom | tr -d ' \\n'`)",
            path.display()
        );
    }
    Ok(seed)
}

/// Writes a replacement for the kernel's scripts/gen-randstruct-seed.sh that
/// emits a fixed seed. Kbuild runs `$(gen-randstruct-seed)` to create
/// scripts/basic/randstruct.seed (read by the randstruct GCC plugin) and
/// include/generated/randstruct_hash.h; we point that make variable at this
/// script on the make command line, leaving the source tree untouched.
fn write_seed_script(path: &Path, seed: &str) -> Result<()> {
    let hash = hex::encode(Sha256::digest(seed.as_bytes()));
    let script = format!(
        "#!/bin/sh\n# Written by imager: deterministic randstruct seed (see imager::kernel::build).\n\
         echo '{seed}' > \"$1\"\n\
         echo '#define RANDSTRUCT_HASHED_SEED \"{hash}\"' > \"$2\"\n"
    );
    fs::write(path, script).with_context(|| format!("writing {}", path.display()))?;
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(path, fs::Permissions::from_mode(0o755))?;
    Ok(())
}

/// Unpacks a tarball into `dest` (dropping its top-level directory) or
/// copies a tree there, so the build never writes into the given source.
fn unpack_source(source: &Path, dest: &Path) -> Result<()> {
    fs::create_dir_all(dest).with_context(|| format!("creating {}", dest.display()))?;
    let mut cmd = if source.is_file() {
        // The system tar: it handles .xz/.gz/.zst by itself (the tar crate
        // would need an xz decoder dependency) and is what Debian's
        // linux-source package is meant to be unpacked with.
        let mut c = Command::new("tar");
        c.arg("-xf")
            .arg(source)
            .arg("-C")
            .arg(dest)
            .arg("--strip-components=1");
        c
    } else {
        let mut c = Command::new("cp");
        c.arg("-a")
            .arg("--reflink=auto")
            .arg(source.join("."))
            .arg(dest);
        c
    };
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "unpacking {} failed ({}): {}",
            source.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    if !dest.join("Makefile").is_file() || !dest.join("Kconfig").is_file() {
        bail!(
            "{} does not look like a Linux source tree (no top-level Makefile/Kconfig)",
            source.display()
        );
    }
    Ok(())
}

struct Make {
    tree: PathBuf,
    log: PathBuf,
    epoch: u64,
    jobs: usize,
    arch: Arch,
    seed_script: PathBuf,
    /// `-frandom-seed=` for GCC: see [`compiler_random_seed`].
    compiler_seed: String,
    /// Where build.log is kept when a step fails (the work dir is deleted).
    failed_log: PathBuf,
}

impl Make {
    /// `ARCH=` and `CROSS_COMPILE=` of a cross build (none for amd64, the
    /// native build, whose kernel's bytes stay what they were).
    fn arch_args(&self) -> Vec<String> {
        let spec = self.arch.spec();
        if spec.cross_compile.is_empty() {
            return Vec::new();
        }
        vec![
            format!("ARCH={}", spec.kernel_arch),
            format!("CROSS_COMPILE={}", spec.cross_compile),
        ]
    }

    /// make with `args` in the tree, in the reproducibility environment.
    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("make");
        cmd.current_dir(&self.tree)
            .args(args)
            .arg("LOCALVERSION=")
            .args(self.arch_args())
            .arg(format!(
                "gen-randstruct-seed={}",
                self.seed_script.display()
            ))
            .arg(format!("KCFLAGS=-frandom-seed={}", self.compiler_seed));
        for k in [
            "ARCH",
            "CROSS_COMPILE",
            "CC",
            "LLVM",
            "O",
            "KBUILD_OUTPUT",
            "KCFLAGS",
            "KCPPFLAGS",
            "KAFLAGS",
            "KCONFIG_CONFIG",
            "MAKEFLAGS",
            "MFLAGS",
            "MAKELEVEL",
            "LOCALVERSION",
        ] {
            cmd.env_remove(k);
        }
        cmd.env("LC_ALL", "C")
            .env("TZ", "UTC")
            .env("SOURCE_DATE_EPOCH", self.epoch.to_string())
            .env("KBUILD_BUILD_TIMESTAMP", format_build_timestamp(self.epoch))
            .env("KBUILD_BUILD_USER", "imager")
            .env("KBUILD_BUILD_HOST", "imager")
            .env("KBUILD_BUILD_VERSION", "1");
        cmd
    }

    /// Runs make in the tree with the reproducibility environment, appending
    /// all output to build.log. With `expected`, shows a progress bar
    /// counting compiled objects. On failure, the error carries the log tail.
    fn run(&self, args: &[&str], expected: Option<u64>) -> Result<()> {
        let mut log = fs::OpenOptions::new()
            .append(true)
            .open(&self.log)
            .with_context(|| format!("opening {}", self.log.display()))?;
        writeln!(log, "\n$ make {}", args.join(" "))?;
        let (reader, writer) = std::io::pipe().context("creating a pipe for make's output")?;
        let mut child = {
            let mut cmd = self.command(args);
            cmd.stdin(Stdio::null())
                .stdout(writer.try_clone()?)
                .stderr(writer);
            cmd.spawn().context("running make (is it installed?)")?
            // `cmd` (holding the pipe's write ends) is dropped here, so the
            // reader sees EOF when make exits.
        };
        let mut bar = expected.map(|len| crate::progress::Bar::start("kernel", len, "objects"));
        let mut lines = BufReader::new(reader);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            let n = lines
                .read_until(b'\n', &mut buf)
                .context("reading make's output")?;
            if n == 0 {
                break;
            }
            log.write_all(&buf)?;
            if let Some(bar) = &mut bar
                && buf.starts_with(b"  CC ")
            {
                bar.inc(1);
                let line = String::from_utf8_lossy(&buf);
                bar.note(line.split_whitespace().last().unwrap_or(""));
            }
        }
        let status = child.wait().context("waiting for make")?;
        if let Some(bar) = bar
            && status.success()
        {
            bar.finish();
        }
        log.flush()?;
        if !status.success() {
            let tail = log_tail(&self.log, LOG_TAIL_LINES).unwrap_or_default();
            let kept = match fs::copy(&self.log, &self.failed_log) {
                Ok(_) => self.failed_log.display().to_string(),
                Err(_) => "(the log could not be kept)".to_string(),
            };
            bail!(
                "make {} failed ({status}); full log: {kept}; last {LOG_TAIL_LINES} lines:\n{tail}",
                args.join(" ")
            );
        }
        Ok(())
    }
}

fn log_tail(path: &Path, n: usize) -> Result<String> {
    let f = File::open(path)?;
    let mut tail = VecDeque::with_capacity(n);
    for line in BufReader::new(f).split(b'\n') {
        if tail.len() == n {
            tail.pop_front();
        }
        tail.push_back(String::from_utf8_lossy(&line?).into_owned());
    }
    Ok(tail.into_iter().collect::<Vec<_>>().join("\n"))
}

/// The work directory; removed (with the source tree in it) when dropped.
struct WorkDir {
    path: PathBuf,
}

impl WorkDir {
    fn create(path: PathBuf) -> Result<WorkDir> {
        if path.exists() {
            fs::remove_dir_all(&path)
                .with_context(|| format!("removing stale {}", path.display()))?;
        }
        fs::create_dir_all(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(WorkDir { path })
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.path);
    }
}

/// Removes `<key>.tmp-<pid>` directories whose process is gone.
fn sweep_stale_work_dirs(kernel_dir: &Path) {
    let Ok(entries) = fs::read_dir(kernel_dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some((_, pid)) = name.rsplit_once(".tmp-") else {
            continue;
        };
        let Ok(pid) = pid.parse::<u32>() else {
            continue;
        };
        if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = fs::remove_dir_all(e.path());
        }
    }
}

fn sync_dir(dir: &Path) -> Result<()> {
    for e in fs::read_dir(dir)?.flatten() {
        if e.file_type()?.is_file() {
            File::open(e.path())?.sync_all()?;
        }
    }
    File::open(dir)?.sync_all()?;
    Ok(())
}

fn format_duration(d: Duration) -> String {
    let s = d.as_secs();
    format!("{}m{:02}s", s / 60, s % 60)
}

/// `date -u -d @EPOCH` style: `Thu Jan  1 00:00:00 UTC 1970`.
pub fn format_build_timestamp(epoch: u64) -> String {
    const DAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let days = epoch / 86_400;
    let secs = epoch % 86_400;
    let (year, month, day) = contract::date::civil_from_days(days);
    format!(
        "{} {} {:>2} {:02}:{:02}:{:02} UTC {}",
        DAYS[(days % 7) as usize],
        MONTHS[(month - 1) as usize],
        day,
        secs / 3600,
        secs % 3600 / 60,
        secs % 60,
        year
    )
}

#[cfg(test)]
mod tests;
