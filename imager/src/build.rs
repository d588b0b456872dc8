//! `imager build`: the whole pipeline from a profile to signed artifacts.
//!
//! kernel → runtime → root filesystem → initramfs → disk image, installer
//! image → manifest.
//! Each artifact is written atomically into the output directory; the
//! manifest and its signature come last, so a directory with a manifest that
//! verifies holds a complete build.
//!
//! `build/skeleton.rs` turns the skeleton manifest into the root
//! filesystem's contents; `build/installer.rs` writes the installer image.

use crate::artifact::{Artifact, Kind};
use crate::io::sha256_file;
use crate::profile::{Output, Profile};
use crate::{boot, disk, initramfs, kernel, rootfs, runtime, sign};
use anyhow::{Context, Result, bail};
use contract::{Slot, paths};
use std::path::{Path, PathBuf};

mod installer;
mod skeleton;

pub use installer::{PayloadInput, installer_spec, relative_link, write_installer};
pub use skeleton::rootfs_spec;

/// File names in the output directory.
pub use contract::paths::output as names;

/// Options of one build beyond the profile.
#[derive(Debug, Clone)]
pub struct BuildOptions {
    pub out_dir: PathBuf,
    /// Private signing key; overrides the profile's.
    pub key: Option<PathBuf>,
    pub cache_dir: PathBuf,
    pub jobs: usize,
}

/// What a build produced.
#[derive(Debug, Clone, serde::Serialize)]
pub struct BuildReport {
    pub name: String,
    pub version: String,
    pub profile: String,
    pub source_date_epoch: u64,
    pub key_id: String,
    pub kernel_cached: bool,
    pub artifacts: Vec<Artifact>,
}

/// Runs the whole build: each phase in order, the cheap checks and the
/// signing key first, so that a profile that cannot work or a bad key fails
/// before an hour of work; the manifest and its signature last.
pub fn run(p: &Profile, opts: &BuildOptions) -> Result<BuildReport> {
    let out = &opts.out_dir;
    let epoch = prepare_output(p, out)?;
    let (layout, esp) = preflight(p)?;
    let signer = load_signer(p, opts)?;
    let kernel = kernel_files(p, opts)?;
    remove_old_manifest(out)?;
    let kernel_out = place(&kernel.bzimage, out, names::KERNEL)?;
    let config_out = place(&kernel.config, out, names::KERNEL_CONFIG)?;
    let machined = runtime_binary(p)?;
    let installer_bin = installer_binary(p)?;
    let rootfs_out = write_rootfs(p, out, &machined, epoch)?;
    let initramfs_out = write_initramfs(p, out, &machined, &rootfs_out, epoch)?;
    let mut artifacts = vec![
        (Kind::Kernel, kernel_out.clone()),
        (Kind::KernelConfig, config_out),
        (Kind::Rootfs, rootfs_out),
        (Kind::Initramfs, initramfs_out.clone()),
    ];
    let boot_info = sign::Boot {
        title: boot::image_title(&p.pretty_name, &p.version),
        cmdline: p.cmdline(),
    };
    let payload = PayloadInput {
        kernel: &kernel_out,
        initramfs: &initramfs_out,
        boot: &boot_info,
        epoch,
    };
    if let Some(layout) = &layout {
        let raw = write_disk(p, out, layout, esp, &payload, signer.as_ref())?;
        artifacts.push((Kind::Raw, raw));
    }
    if let Some(bin) = &installer_bin {
        step("installer: payload manifest and OCI archive");
        let image = write_installer(p, out, bin, &payload, signer.as_ref())?;
        artifacts.push((Kind::Installer, image));
    }
    let listed = sign_manifest(p, out, &artifacts, boot_info, signer.as_ref(), epoch)?;
    Ok(BuildReport {
        name: p.name.clone(),
        version: p.version.clone(),
        profile: profile_name(p),
        source_date_epoch: epoch,
        key_id: signer.key_id(),
        kernel_cached: kernel.cached,
        artifacts: listed,
    })
}

/// Creates the output directory, sweeps what an interrupted build left
/// there and returns the build's SOURCE_DATE_EPOCH.
fn prepare_output(p: &Profile, out: &Path) -> Result<u64> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let swept = crate::io::remove_stale_partials(out)?;
    if swept > 0 {
        step(&format!(
            "removed {swept} temporary file(s) of an interrupted build"
        ));
    }
    let epoch = source_date_epoch(p.path.parent().unwrap_or(Path::new(".")))?;
    step(&format!(
        "profile {} ({} {}), SOURCE_DATE_EPOCH={epoch}, output {}",
        p.path.display(),
        p.name,
        p.version,
        out.display()
    ));
    Ok(epoch)
}

/// The cheap checks, before anything is built or written: the disk layout
/// (if the profile makes a disk) and the ESP's files.
fn preflight(p: &Profile) -> Result<(Option<disk::Layout>, Vec<disk::FatFile>)> {
    let layout = if p.outputs.contains(&Output::Raw) {
        Some(disk::Layout::new(
            p.disk.size.0,
            p.disk.sector_size,
            &p.partition_sizes(),
        )?)
    } else {
        None
    };
    let esp = boot::esp_files(&p.boot.systemd_boot)?;
    if layout.is_some() && p.disk.sector_size == 4096 {
        step(
            "WARNING: systemd-boot (up to at least 255) does not read boot entries from \
             XBOOTLDR on 4096-byte-sector disks (systemd/systemd#32535): this image will not \
             boot under UEFI until that is fixed; see docs/design.md",
        );
    }
    Ok((layout, esp))
}

/// The signing key: `--key`, the profile's, or the development key
/// (created on first use).
fn load_signer(p: &Profile, opts: &BuildOptions) -> Result<Box<dyn sign::Signer>> {
    let key_path = opts.key.clone().or_else(|| p.signing.key.clone());
    Ok(match &key_path {
        Some(k) => Box::new(sign::FileSigner::load(k)?),
        None => {
            let dir = dev_key_dir(&p.path);
            let (s, created) = sign::load_or_create_dev_key(&dir)?;
            step(&format!(
                "no signing key configured: using the development key {}{}",
                dir.join("dev.key").display(),
                if created { " (created)" } else { "" }
            ));
            Box::new(s)
        }
    })
}

/// The kernel of a build: where its bzImage and config are.
struct KernelFiles {
    bzimage: PathBuf,
    config: PathBuf,
    /// Prebuilt or from the cache (nothing compiled).
    cached: bool,
}

/// The profile's prebuilt kernel (audited), else the kernel built from its
/// source (or taken from the cache).
fn kernel_files(p: &Profile, opts: &BuildOptions) -> Result<KernelFiles> {
    if let (Some(k), Some(c)) = (&p.kernel.prebuilt, &p.kernel.prebuilt_config) {
        step(&format!("kernel: prebuilt {}", k.display()));
        for f in [k, c] {
            if !f.is_file() {
                bail!("prebuilt kernel file {} not found", f.display());
            }
        }
        let rules = kernel::Rules::load(&p.kernel.rules)?;
        let config = kernel::KernelConfig::load(c)?;
        kernel::build::audit_or_fail(&rules, &config, &p.cmdline(), &waivers(p)?)
            .with_context(|| format!("auditing the prebuilt kernel's {}", c.display()))?;
        return Ok(KernelFiles {
            bzimage: k.clone(),
            config: c.clone(),
            cached: true,
        });
    }
    let req = kernel_request(p, &opts.cache_dir, opts.jobs)?;
    let built = kernel::build(&req)?;
    step(&format!(
        "kernel: {} ({})",
        built.bzimage.display(),
        if built.cached { "cached" } else { "built" }
    ));
    Ok(KernelFiles {
        bzimage: built.bzimage,
        config: built.config,
        cached: built.cached,
    })
}

/// A rebuild replaces artifacts one by one: drop the old manifest (and its
/// signature) before the first, so that a directory with a manifest always
/// holds one complete build; not earlier, so that a build that fails its
/// checks leaves the previous build whole.
fn remove_old_manifest(out: &Path) -> Result<()> {
    for old in [names::MANIFEST, names::SIGNATURE] {
        let old = out.join(old);
        if old.exists() {
            std::fs::remove_file(&old).with_context(|| format!("removing {}", old.display()))?;
        }
    }
    Ok(())
}

/// The runtime binary: built from its cargo package, or the prebuilt one
/// (checked to be static).
fn runtime_binary(p: &Profile) -> Result<PathBuf> {
    match (&p.runtime.cargo_package, &p.runtime.binary) {
        (Some(pkg), _) => {
            step(&format!("runtime: building {}", pkg.display()));
            runtime::build(pkg)
        }
        (None, Some(bin)) => {
            runtime::check_static(bin)?;
            Ok(bin.clone())
        }
        (None, None) => bail!("the profile names no runtime"),
    }
}

/// The installer binary (the static imager), if the profile makes an
/// installer image.
fn installer_binary(p: &Profile) -> Result<Option<PathBuf>> {
    let Some(i) = &p.installer else {
        return Ok(None);
    };
    if !p.outputs.contains(&Output::Installer) {
        return Ok(None);
    }
    Ok(Some(match (&i.cargo_package, &i.binary) {
        (Some(pkg), _) => {
            step(&format!("installer: building {} (static)", pkg.display()));
            runtime::build_named(pkg, "installer", "installer.cargo_package")?
        }
        (None, Some(bin)) => {
            runtime::check_static(bin)?;
            bin.clone()
        }
        (None, None) => bail!("the profile names no installer binary"),
    }))
}

/// Writes the squashfs root filesystem `out/rootfs.sqsh`.
fn write_rootfs(p: &Profile, out: &Path, machined: &Path, epoch: u64) -> Result<PathBuf> {
    step("rootfs: squashfs");
    let rootfs_out = out.join(names::ROOTFS);
    let spec = rootfs_spec(p, machined, epoch)?;
    rootfs::build_rootfs(&rootfs_out, &spec)?;
    Ok(rootfs_out)
}

/// Writes the initramfs `out/initramfs.zst`: the runtime and the root
/// filesystem.
fn write_initramfs(
    p: &Profile,
    out: &Path,
    machined: &Path,
    rootfs_out: &Path,
    epoch: u64,
) -> Result<PathBuf> {
    step("initramfs: cpio + zstd");
    let initramfs_out = out.join(names::INITRAMFS);
    initramfs::build_initramfs(
        &initramfs_out,
        machined,
        rootfs_out,
        epoch,
        p.compression.initramfs_zstd_level,
    )?;
    Ok(initramfs_out)
}

/// Writes the raw disk image `out/disk.raw`: the payload's kernel and
/// initramfs in slot A, META trusting the signing key.
fn write_disk(
    p: &Profile,
    out: &Path,
    layout: &disk::Layout,
    esp: Vec<disk::FatFile>,
    payload: &PayloadInput,
    signer: &dyn sign::Signer,
) -> Result<PathBuf> {
    let (kernel_out, initramfs_out) = (payload.kernel, payload.initramfs);
    let (kernel_sha, _) = sha256_file(kernel_out)?;
    let (initramfs_sha, _) = sha256_file(initramfs_out)?;
    step("disk: raw GPT image");
    let identity = paths::image_identity(&p.name, &p.version, &[&kernel_sha, &initramfs_sha]);
    let disk_guid = contract::guid::disk_guid(&identity);
    let entry = boot::entry(
        Slot::A,
        &kernel_sha,
        &initramfs_sha,
        &p.pretty_name,
        &p.version,
        &p.cmdline(),
    );
    let boot_files = boot::boot_files(Slot::A, &entry, kernel_out, initramfs_out);
    let meta = bootstate::meta::initial(
        &p.name,
        &p.version,
        &[sign::public_key_pem(&signer.public_key())?],
        "build",
    );
    let raw = out.join(names::RAW);
    boot::write_raw_image(
        &raw,
        boot::DiskTarget::NewImage,
        layout,
        disk_guid,
        esp,
        boot_files,
        &meta,
        payload.epoch,
    )?;
    Ok(raw)
}

/// Writes the signed manifest of `artifacts` (paths in `out`) and its
/// signature, last. Returns every artifact, the manifest and signature
/// included, with paths as the user named the output directory.
fn sign_manifest(
    p: &Profile,
    out: &Path,
    artifacts: &[(Kind, PathBuf)],
    boot_info: sign::Boot,
    signer: &dyn sign::Signer,
    epoch: u64,
) -> Result<Vec<Artifact>> {
    let mut listed = Vec::new();
    for (kind, path) in artifacts {
        listed.push(artifact(*kind, path)?);
    }
    step("sign: manifest");
    let manifest = sign::Manifest {
        format: 1,
        name: p.name.clone(),
        version: p.version.clone(),
        profile: profile_name(p),
        source_date_epoch: epoch,
        key_id: signer.key_id(),
        boot: Some(boot_info),
        artifacts: listed.clone(),
    };
    let (m, s) = sign::write_signed_manifest(out, &manifest, signer)?;
    listed.push(artifact(Kind::Manifest, &m)?);
    listed.push(artifact(Kind::Signature, &s)?);
    for a in &mut listed {
        a.path = out.join(&a.path).display().to_string();
    }
    Ok(listed)
}

/// The manifest's entry of the file `path`: its name, digest and size.
fn artifact(kind: Kind, path: &Path) -> Result<Artifact> {
    let (sha256, size) = sha256_file(path)?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .context("artifact without a file name")?;
    Ok(Artifact {
        kind,
        path: name,
        sha256,
        size,
    })
}

/// SOURCE_DATE_EPOCH from the environment, else the last commit time of the
/// repository holding `dir`, else 0. Never the clock.
pub fn source_date_epoch(dir: &Path) -> Result<u64> {
    if let Ok(v) = std::env::var("SOURCE_DATE_EPOCH") {
        return v.trim().parse().with_context(|| {
            format!("SOURCE_DATE_EPOCH={v:?} is not a number of seconds since 1970")
        });
    }
    let out = std::process::Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["log", "-1", "--format=%ct"])
        .output();
    if let Ok(o) = out
        && o.status.success()
        && let Ok(t) = String::from_utf8_lossy(&o.stdout).trim().parse()
    {
        return Ok(t);
    }
    eprintln!("build: SOURCE_DATE_EPOCH unset and no git history: using 0");
    Ok(0)
}

/// The directory that holds `out/keys`: the project root of the profile
/// (the parent of its `profiles/` directory), else the current directory.
pub fn project_root(profile: &Path) -> PathBuf {
    let dir = profile.parent().unwrap_or(Path::new("."));
    let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    if dir.file_name().is_some_and(|n| n == "profiles")
        && let Some(root) = dir.parent()
    {
        return root.to_path_buf();
    }
    std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."))
}

/// How the manifest names the profile: its path relative to the project root
/// (`profiles/metal.yaml`), never an absolute path of this machine.
pub fn profile_name(p: &Profile) -> String {
    let abs = std::fs::canonicalize(&p.path).unwrap_or_else(|_| p.path.clone());
    let root = project_root(&p.path);
    abs.strip_prefix(&root)
        .map(Path::to_path_buf)
        .unwrap_or_else(|_| abs.file_name().map(PathBuf::from).unwrap_or_default())
        .display()
        .to_string()
}

/// Where the development key lives.
pub fn dev_key_dir(profile: &Path) -> PathBuf {
    project_root(profile).join("out").join("keys")
}

fn step(msg: &str) {
    eprintln!("build: {msg}");
}

/// The kernel request of a profile.
pub fn kernel_request(p: &Profile, cache_dir: &Path, jobs: usize) -> Result<kernel::KernelRequest> {
    let source = p
        .kernel
        .source
        .clone()
        .context("the profile has no kernel.source")?;
    Ok(kernel::KernelRequest {
        source,
        fragments: p.kernel.fragments.clone(),
        rules: p.kernel.rules.clone(),
        waivers: waivers(p)?,
        cmdline: p.cmdline(),
        cache_dir: cache_dir.to_path_buf(),
        source_date_epoch: p.kernel.build_epoch,
        jobs,
        randstruct_seed: p.kernel.randstruct_seed.clone(),
    })
}

/// Inline waivers plus those of the waiver files.
pub fn waivers(p: &Profile) -> Result<Vec<kernel::Waiver>> {
    let mut all: Vec<kernel::Waiver> = p
        .kernel
        .waivers
        .iter()
        .map(|w| kernel::Waiver {
            option: w.option.clone(),
            reason: w.reason.clone(),
        })
        .collect();
    for f in &p.kernel.waiver_files {
        all.extend(kernel::audit::load_waivers(f)?);
    }
    Ok(all)
}

/// Copies `src` to `out/name` atomically unless an identical file is there.
fn place(src: &Path, out: &Path, name: &str) -> Result<PathBuf> {
    let dest = out.join(name);
    if dest.is_file() && sha256_file(&dest)? == sha256_file(src)? {
        return Ok(dest);
    }
    let mut f = crate::io::AtomicFile::create(&dest)?;
    let mut r = std::fs::File::open(src).with_context(|| format!("opening {}", src.display()))?;
    std::io::copy(&mut r, &mut f).with_context(|| format!("copying {}", src.display()))?;
    f.commit()
}

/// Writes the report's artifact list as JSON (for `--json`).
pub fn report_json(r: &BuildReport) -> Result<String> {
    serde_json::to_string_pretty(r).context("serializing the build report")
}
