//! The `imager` command: a thin layer over the `imager` library.

use anyhow::{Context, Result, bail, ensure};
use clap::{Parser, Subcommand};
use imager::{build, kernel, profile::Profile, qemu, sign};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

mod cli;

#[derive(Parser)]
#[command(
    name = "imager",
    version,
    about = "Builds signed, bootable, immutable OS images"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Build everything the profile asks for.
    Build(BuildArgs),
    /// Kernel: build (cached) or audit a config against the KSPP rules.
    Kernel {
        #[command(subcommand)]
        command: cli::kernel::KernelCommand,
    },
    /// Write a new ed25519 signing key pair.
    Keygen(cli::sign::KeygenArgs),
    /// Check a manifest's signature and the digests of its artifacts.
    Verify(cli::sign::VerifyArgs),
    /// Add a key's signature to a manifest (`manifest.json.sigs`), for a
    /// root of trust whose threshold asks for more than one.
    Sign(cli::root::SignArgs),
    /// A root of trust: the keys a disk trusts and how many must sign.
    Root {
        #[command(subcommand)]
        command: cli::root::RootCommand,
    },
    /// Run by QEMU for each connection of the guest to a `--guest-forward`:
    /// copies stdin and stdout to and from HOST:PORT (loopback only).
    #[command(hide = true)]
    Relay { to: String },
    /// The node API: credentials, provisioning, and the client (status,
    /// rollback, reboot, power-off).
    Node {
        #[command(subcommand)]
        command: cli::node::NodeCommand,
    },
    /// Secure Boot: sign and verify PE images, write the enrolment files.
    Secureboot {
        #[command(subcommand)]
        command: cli::secureboot::SecurebootCommand,
    },
    /// Boot an image in QEMU under UEFI (OVMF) or BIOS (SeaBIOS) firmware and
    /// wait for the ready line.
    Boot(BootArgs),
    /// Show an image's partitions, boot entries, META and manifest status.
    Inspect(InspectArgs),
    /// Make a squashfs (zstd) from a directory, as the image builder does.
    Squashfs(SquashfsArgs),
    /// Write the dm-verity hash device of a file (whole 4096-byte blocks), as
    /// the image builder does for the root filesystem; prints the root hash.
    Verity(VerityArgs),
    /// Lay out a blank disk and install the installer's payload into slot A.
    Install(InstallArgs),
    /// Install the installer's payload into the inactive slot and make it the
    /// one tried next (with boot counting; the current slot is the fallback).
    Upgrade(UpgradeArgs),
    /// Make the other slot the default again.
    Rollback(RollbackArgs),
    /// Push an installer image (an OCI archive, one architecture's or an
    /// index of several) to a registry, every digest as built.
    Push(cli::registry::PushArgs),
    /// Combine installer images of different architectures (archives from
    /// `imager build`) into one archive whose image index names each by
    /// its platform.
    Index(cli::registry::IndexArgs),
}

#[derive(clap::Args, Debug)]
struct InspectArgs {
    /// Raw disk image (or block device).
    image: PathBuf,
    /// Public key to check the manifest beside the image with (default: the
    /// development key of the build that made the image, out/keys/dev.pub).
    #[arg(long)]
    key: Option<PathBuf>,
    /// Print one JSON object on stdout.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args, Debug)]
struct UpgradeArgs {
    /// Installer image (OCI archive) or payload directory; inside the
    /// installer container it defaults to the image's own payload.
    #[arg(long)]
    installer: Option<PathBuf>,
    /// Disk image file or block device.
    #[arg(long)]
    disk: PathBuf,
    /// Boots the new slot is tried before systemd-boot falls back (1 to 99).
    #[arg(long, default_value_t = contract::boot::DEFAULT_TRIES,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(contract::boot::MAX_TRIES)))]
    tries: u32,
    /// Let the upgrade move the disk across Secure Boot (refused without):
    /// out of it (firmware that enforces Secure Boot would refuse an
    /// unsigned version after the switch: turn it off first), or into it
    /// (the ESP gets the payload's signed systemd-boot and the disk boots
    /// under UEFI only; enrol the keys once the new version is blessed).
    #[arg(long)]
    change_secure_boot: bool,
    /// Install a payload whose security version is lower than the highest
    /// this disk has blessed (refused without): this one downgrade only.
    #[arg(long)]
    allow_downgrade: bool,
    /// Print the result as JSON on stdout.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args, Debug)]
struct InstallArgs {
    /// Installer image (OCI archive) or payload directory.
    #[arg(long)]
    installer: Option<PathBuf>,
    /// Disk image file (created if missing) or block device.
    #[arg(long)]
    disk: PathBuf,
    /// Size of a new disk image file, e.g. 2GiB (default: the existing
    /// file's size, else 2 GiB).
    #[arg(long)]
    size: Option<String>,
    /// Logical sector size of a disk image file: 512 (default) or 4096 (a
    /// 4Kn disk: boots under UEFI only). A block device has its own.
    #[arg(long)]
    sector_size: Option<u64>,
    /// Public key the payload must be signed with; the installed disk then
    /// trusts it for upgrades (default: the development key).
    #[arg(long)]
    key: Option<PathBuf>,
    /// Overwrite a disk that holds data (any non-zero byte in its first or
    /// last MiB: a partition table, a filesystem, an ISO); without it such a
    /// disk, block device or image file, is refused.
    #[arg(long)]
    wipe: bool,
    /// The architecture the disk is for, whose payload the installer image
    /// (or image index) gives: amd64 or arm64 (default: this machine's).
    #[arg(long, value_parser = contract::Arch::parse)]
    arch: Option<contract::Arch>,
    #[command(flatten)]
    settings: cli::NodeSettingsArgs,
    /// Print the result as JSON on stdout.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args, Debug)]
struct RollbackArgs {
    /// Disk image file or block device.
    #[arg(long)]
    disk: PathBuf,
    /// Roll back to a slot known to be bad (it gets boot counting).
    #[arg(long)]
    force: bool,
    /// Roll back to a slot whose security version is lower than the
    /// highest this disk has blessed (refused without).
    #[arg(long)]
    allow_downgrade: bool,
    /// Print the result as JSON on stdout.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
struct SquashfsArgs {
    /// Directory to pack.
    source: PathBuf,
    /// Squashfs file to write.
    dest: PathBuf,
    /// zstd compression level.
    #[arg(long, default_value_t = imager::rootfs::DEFAULT_LEVEL)]
    level: i32,
    /// Keep the compressed blocks in DIR/squashfs and take them from there
    /// when the same block comes again (as `imager build` does in its
    /// cache directory); the image is the same with it or without it.
    #[arg(long, value_name = "DIR")]
    cache_dir: Option<PathBuf>,
}

#[derive(clap::Args)]
struct VerityArgs {
    /// Data file (a multiple of 4096 bytes).
    data: PathBuf,
    /// Hash device file to write (superblock and hash tree).
    hash: PathBuf,
}

#[derive(clap::Args)]
struct BuildArgs {
    /// Profile name (profiles/NAME.yaml) or path.
    #[arg(long, default_value = "metal")]
    profile: String,
    /// Output directory (default: out/<profile's name>; out/<name>-<arch>
    /// for another architecture than amd64, so that one system's builds for
    /// two architectures do not replace each other).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Private signing key (PKCS#8 PEM); overrides the profile's.
    #[arg(long)]
    key: Option<PathBuf>,
    /// Print one JSON object describing the artifacts on stdout.
    #[arg(long)]
    json: bool,
    /// Parallel kernel build jobs (default: all cores).
    #[arg(long)]
    jobs: Option<usize>,
    /// Run every stage, even those whose inputs and outputs are unchanged
    /// since the last build into the output directory.
    #[arg(long, conflicts_with = "verify_outputs")]
    force: bool,
    /// Take an earlier stage's outputs as intact only when their SHA-256 is
    /// the recorded one (default: their size and modification time).
    #[arg(long)]
    verify_outputs: bool,
    /// Progress on standard error: `human` (bars on a terminal) or `json`
    /// (one JSON object per line; docs/progress.md).
    #[arg(long, default_value = "human", value_name = "MODE")]
    progress: imager::progress::Mode,
    /// A build cache shared through a registry, REGISTRY/NAME (overrides
    /// the profile's cache.registry): the kernel is pulled from it when a
    /// trusted entry has its key, and pushed to it when built here
    /// (docs/build-cache.md).
    #[arg(long, value_name = "REGISTRY/NAME")]
    cache_registry: Option<String>,
    /// A public key whose cache entries are trusted, beside the build's
    /// signing key (repeatable).
    #[arg(long, value_name = "PUB", requires = "cache_registry")]
    cache_trust: Vec<PathBuf>,
    /// Speak plain HTTP to the cache registry (a local docker-registry).
    #[arg(long, requires = "cache_registry")]
    cache_plain_http: bool,
    /// PEM CA certificates for the cache registry's HTTPS.
    #[arg(long, value_name = "FILE", requires = "cache_registry")]
    cache_ca: Option<PathBuf>,
    /// The auth file with the cache registry's credentials (default: where
    /// podman, skopeo and docker keep them).
    #[arg(long, value_name = "FILE", requires = "cache_registry")]
    cache_authfile: Option<PathBuf>,
}

impl BuildArgs {
    fn cache_registry(&self) -> Option<build::CacheRegistry> {
        self.cache_registry
            .as_ref()
            .map(|repository| build::CacheRegistry {
                repository: repository.clone(),
                access: imager::remote::Access {
                    credentials: None,
                    authfile: self.cache_authfile.clone(),
                    plain_http: self.cache_plain_http,
                    ca: self.cache_ca.clone(),
                },
                trusted_keys: self.cache_trust.clone(),
            })
    }

    fn reuse(&self) -> build::Reuse {
        match (self.force, self.verify_outputs) {
            (true, _) => build::Reuse::Never,
            (false, true) => build::Reuse::Digests,
            (false, false) => build::Reuse::Stamps,
        }
    }
}

#[derive(clap::Args)]
struct BootArgs {
    /// Raw disk image, or ISO (attached as a CD-ROM unless --usb).
    image: PathBuf,
    /// Attach an ISO as a disk (the ISO written to a USB stick) instead of
    /// a CD-ROM.
    #[arg(long)]
    usb: bool,
    /// The controller the disk is attached to, as on a real machine:
    /// virtio, nvme, sata (AHCI), virtio-scsi, mptsas (LSI SAS1068),
    /// megasas (MegaRAID SAS), lsi (53c895a), pvscsi (VMware), usb
    /// (mass storage on xHCI) or uas. What each firmware boots from:
    /// docs/design.md, "Disk controllers".
    #[arg(long, default_value = "virtio")]
    bus: qemu::Bus,
    /// The guest's NIC, as on a real machine or hypervisor: virtio,
    /// e1000, e1000e or vmxnet3.
    #[arg(long, default_value = "virtio")]
    nic: qemu::net::Nic,
    /// Serial number of the image's drive, as the guest sees it.
    #[arg(long)]
    serial: Option<String>,
    /// Attach another disk: SIZE (a blank disk for this boot, e.g. 4GiB) or
    /// an image FILE the guest writes to; `,serial=S` gives it a serial
    /// number, `,bus=B` attaches it on B (virtio, the default; nvme;
    /// sata). Repeatable.
    #[arg(long = "disk", value_name = "SIZE|FILE[,serial=S][,bus=B]")]
    disks: Vec<String>,
    /// Firmware: `uefi` (OVMF, systemd-boot) or `bios` (SeaBIOS, GRUB).
    #[arg(long, value_enum, default_value_t = FirmwareArg::Uefi)]
    firmware: FirmwareArg,
    /// The image's architecture, which picks the machine: amd64 (q35,
    /// OVMF or SeaBIOS) or arm64 (virt, AAVMF). By default the one whose
    /// boot loader the disk's ESP holds (amd64 for an ISO or qcow2).
    #[arg(long, value_parser = contract::Arch::parse)]
    arch: Option<contract::Arch>,
    /// Seconds to wait for the ready line.
    #[arg(long, default_value_t = 300)]
    timeout: u64,
    /// Print `ready`, `version`, `slot` (`null` on a live boot), `live` and
    /// `seconds` as JSON on stdout.
    #[arg(long)]
    json: bool,
    /// After ready, press the ACPI power button and wait for a clean power-off.
    #[arg(long)]
    shutdown: bool,
    /// After ready, keep the machine running (with --reboots, through its
    /// reboots) until it powers off by itself (the node API's power-off, or
    /// the power button); the timeout covers the whole run.
    #[arg(long, conflicts_with = "shutdown")]
    stay: bool,
    /// Let the guest write to the image (default: a throw-away overlay).
    /// Extra disks (--disk FILE) are always written.
    #[arg(long)]
    write: bool,
    /// Use KVM (default TCG: /dev/kvm may exist and still hang).
    #[arg(long)]
    kvm: bool,
    /// Guest memory in MiB.
    #[arg(long, default_value_t = 512)]
    memory: u32,
    /// Logical sector size of the virtual disk (default: the image's own,
    /// found from where its GPT header is).
    #[arg(long)]
    sector_size: Option<u64>,
    /// Do not mirror the console.
    #[arg(long)]
    quiet: bool,
    /// Keep the whole console in this file.
    #[arg(long)]
    console_log: Option<PathBuf>,
    /// Give the machine a screen (a standard VGA adapter) and, once ready,
    /// write what it shows to this file (a PPM image).
    #[arg(long)]
    screen: Option<PathBuf>,
    /// Let the guest reboot and wait for ready across reboots (a failed boot
    /// then falls back to the other slot by boot counting).
    #[arg(long)]
    reboots: bool,
    /// Boot the Secure Boot firmware (OVMF's SMM build under TCG; AAVMF on
    /// arm64) with this UEFI variable store, used in place (keys
    /// systemd-boot enrols stay in it): a copy of
    /// /usr/share/OVMF/OVMF_VARS_4M.fd is in setup mode; enrol keys into
    /// one with virt-fw-vars (docs/secureboot.md, also for AAVMF's).
    #[arg(long, value_name = "VARS")]
    secure_boot: Option<PathBuf>,
    /// Forward 127.0.0.1:HOSTPORT on the host to the guest's GUESTPORT
    /// (TCP, QEMU's hostfwd). Repeatable.
    #[arg(long = "forward", value_name = "HOSTPORT:[GUESTIP:]GUESTPORT")]
    forwards: Vec<String>,
    /// Forward the guest's connections to GUESTIP:GUESTPORT (a free address
    /// of QEMU's user-mode network 10.0.2.0/24, e.g. 10.0.2.100) to
    /// HOSTIP:HOSTPORT on the host's loopback (TCP, QEMU's guestfwd; the
    /// host side must be listening when QEMU starts). Repeatable.
    #[arg(
        long = "guest-forward",
        value_name = "GUESTIP:GUESTPORT=HOSTIP:HOSTPORT"
    )]
    guest_forwards: Vec<String>,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum FirmwareArg {
    Uefi,
    Bios,
}

fn jobs(j: Option<usize>) -> usize {
    j.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Invoked as `installer` (the installer image's entrypoint), the payload
/// defaults to the image's own.
fn invoked_as_installer() -> bool {
    std::env::args_os()
        .next()
        .map(PathBuf::from)
        .and_then(|p| p.file_name().map(|n| n == "installer"))
        .unwrap_or(false)
}

fn installer_path(given: &Option<PathBuf>) -> Result<PathBuf> {
    match given {
        Some(p) => Ok(p.clone()),
        None if invoked_as_installer() => Ok(imager::install::builtin_payload()),
        None => anyhow::bail!(
            "--installer is required: pass an installer image (installer.tar) or a payload \
             directory"
        ),
    }
}

fn print_json_or(json: bool, value: &impl serde::Serialize, line: String) -> Result<ExitCode> {
    if json {
        println!("{}", serde_json::to_string_pretty(value)?);
    } else {
        eprintln!("{line}");
    }
    Ok(ExitCode::SUCCESS)
}

fn install(a: &InstallArgs) -> Result<ExitCode> {
    let r = imager::install::run_install(&imager::install::InstallOptions {
        installer: installer_path(&a.installer)?,
        disk: a.disk.clone(),
        size: a.size.clone(),
        sector_size: a.sector_size,
        key: a.key.clone(),
        wipe: a.wipe,
        settings: a.settings.settings()?,
        arch: a.arch.unwrap_or(contract::Arch::NATIVE),
    })?;
    let line = format!(
        "install: {} installed into slot {} of {} (signed by {})",
        r.version, r.slot, r.disk, r.key_id
    );
    print_json_or(a.json, &r, line)
}

fn upgrade(a: &UpgradeArgs) -> Result<ExitCode> {
    let r = imager::install::run_upgrade(&imager::install::UpgradeOptions {
        installer: installer_path(&a.installer)?,
        disk: a.disk.clone(),
        tries: a.tries,
        change_secure_boot: a.change_secure_boot,
        allow_downgrade: a.allow_downgrade,
    })?;
    let line = format!(
        "upgrade: slot {} now has {} and is tried next ({} tries, entry {}); \
             slot {} ({}) is the fallback",
        r.to_slot, r.to_version, r.tries, r.entry, r.from_slot, r.from_version
    );
    print_json_or(a.json, &r, line)
}

fn rollback(a: &RollbackArgs) -> Result<ExitCode> {
    let r = imager::install::run_rollback(&imager::install::RollbackOptions {
        disk: a.disk.clone(),
        force: a.force,
        allow_downgrade: a.allow_downgrade,
    })?;
    let line = format!(
        "rollback: slot {} ({}) is the default now (entry {}); slot {} stays installed",
        r.to_slot, r.version, r.entry, r.from_slot
    );
    print_json_or(a.json, &r, line)
}

fn run() -> Result<ExitCode> {
    let cli = Cli::parse();
    match cli.command {
        Command::Install(a) => install(&a),
        Command::Upgrade(a) => upgrade(&a),
        Command::Rollback(a) => rollback(&a),
        Command::Build(a) => {
            imager::progress::set_mode(a.progress);
            let path = Profile::locate(&a.profile)?;
            let p = Profile::load(&path)?;
            let reuse = a.reuse();
            let cache_registry = a.cache_registry();
            let out = a
                .out
                .unwrap_or_else(|| PathBuf::from("out").join(p.default_out_name()));
            let opts = build::BuildOptions {
                out_dir: out,
                key: a.key,
                cache_dir: kernel::default_cache_dir(),
                jobs: jobs(a.jobs),
                reuse,
                cache_registry,
            };
            let report = build::run(&p, &opts)?;
            if a.json {
                println!("{}", build::report_json(&report)?);
            } else {
                let (built, skipped): (Vec<_>, Vec<_>) =
                    report.stages.iter().partition(|s| s.action == "built");
                let list = |v: &[&build::StageReport]| {
                    v.iter()
                        .map(|s| s.stage.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                println!(
                    "stages built: {}; skipped: {}",
                    if built.is_empty() {
                        "none".into()
                    } else {
                        list(&built)
                    },
                    if skipped.is_empty() {
                        "none".into()
                    } else {
                        list(&skipped)
                    }
                );
                for art in &report.artifacts {
                    println!(
                        "{:<14} {}  {}",
                        art.kind.name(),
                        &art.sha256[..16],
                        art.path
                    );
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Kernel {
            command: cli::kernel::KernelCommand::Build(a),
        } if a.profile.is_some() => {
            let path = Profile::locate(a.profile.as_deref().unwrap_or_default())?;
            let p = Profile::load(&path)?;
            let cache = a
                .cache_dir
                .clone()
                .unwrap_or_else(kernel::default_cache_dir);
            let req = build::kernel_request(&p, &cache, jobs(a.jobs))?;
            kernel::command::run_request(&req, a.configure_only)
        }
        Command::Kernel { command } => cli::kernel::run(&command),
        Command::Keygen(a) if a.secure_boot.is_some() => {
            let dir = a.secure_boot.as_deref().unwrap_or(Path::new("."));
            let r = imager::secureboot::keygen(dir, a.force)?;
            println!(
                "keygen: wrote Secure Boot keys to {} (private keys mode 0600), owner GUID {}",
                r.dir.display(),
                r.owner
            );
            for (name, subject, sha) in &r.certs {
                println!("  {name}: {subject}, certificate sha256 {sha}");
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Keygen(a) => {
            sign::run_keygen(&a.options())?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Verify(a) => Ok(exit(sign::run_verify(&a.options())?)),
        Command::Sign(a) => cli::root::run_sign(&a),
        Command::Root { command } => cli::root::run_root(&command),
        Command::Secureboot { command } => cli::secureboot::run(&command),
        Command::Node { command } => cli::node::run(&command),
        Command::Push(a) => cli::registry::push(&a),
        Command::Index(a) => cli::registry::index(&a),
        Command::Relay { to } => {
            qemu::net::relay(&to)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Boot(a) => boot(a),
        Command::Inspect(a) => Ok(exit(imager::inspect::run(
            &a.image,
            a.key.as_deref(),
            a.json,
        )?)),
        Command::Squashfs(a) => {
            let epoch = build::source_date_epoch(&a.source)?;
            let spec = imager::rootfs::RootfsSpec {
                skeleton: Some(a.source.clone()),
                dirs: Vec::new(),
                files: Vec::new(),
                epoch,
                level: a.level,
                keep_modes: true,
            };
            let blocks = a.cache_dir.map(|d| d.join("squashfs"));
            let (sha, size) = imager::rootfs::build_rootfs(&a.dest, &spec, blocks.as_deref())?;
            println!("{}  {size}  {}", sha, a.dest.display());
            Ok(ExitCode::SUCCESS)
        }
        Command::Verity(a) => {
            let v = imager::verity::format(&a.data, &a.hash)?;
            println!(
                "root hash {}\nsalt      {}\nuuid      {}",
                v.root_hash, v.salt, v.uuid
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// `imager boot`: boots the image and waits for the ready line.
fn boot(a: BootArgs) -> Result<ExitCode> {
    // A compressed disk boots from a sparse copy, removed after the boot.
    let format = imager::disk::compress::Format::of(&a.image)?;
    let unpacked = if format.compressed() {
        if a.write {
            bail!(
                "--write: {} is compressed or packed and boots from a temporary copy, \
                 removed after the boot; unpack it (zstd -d, xz -d, tar -x, qemu-img convert \
                 -O raw) and boot the raw disk to keep what the guest writes",
                a.image.display()
            );
        }
        let u = imager::disk::compress::Unpacked::open(&a.image)?;
        eprintln!(
            "boot: {} unpacked into the sparse temporary copy {} (removed after the boot)",
            a.image.display(),
            u.path.display()
        );
        Some(u)
    } else {
        None
    };
    let image = unpacked
        .as_ref()
        .map_or(a.image.clone(), |u| u.path.clone());
    let mut o = qemu::BootOptions::new(&image);
    o.timeout = Duration::from_secs(a.timeout);
    o.firmware = match a.firmware {
        FirmwareArg::Uefi => qemu::Firmware::Uefi,
        FirmwareArg::Bios => qemu::Firmware::Bios,
    };
    o.shutdown = a.shutdown;
    o.stay = a.stay;
    o.write = a.write;
    o.kvm = a.kvm;
    o.memory_mib = a.memory;
    let iso = format == imager::disk::compress::Format::Raw && qemu::is_iso(&image)?;
    o.arch = match a.arch {
        Some(arch) => arch,
        None => qemu::disk_arch(&image).unwrap_or_else(|e| {
            eprintln!(
                "boot: the disk's architecture is not known ({e:#}): booting it as amd64 \
                 (--arch to say which)"
            );
            contract::Arch::Amd64
        }),
    };
    o.sector_size = match a.sector_size {
        Some(s) => s,
        // An ISO on a disk is read in 512-byte sectors (its system area).
        None if iso => 512,
        // A qcow2 is read through its reader: the table of the disk it holds.
        None if format == imager::disk::compress::Format::Qcow2 => {
            let mut q = imager::disk::qcow2::Qcow2::open(&a.image)?;
            imager::disk::gpt::read_table_from(&mut q)
                .with_context(|| format!("reading {}", a.image.display()))?
                .sector_size
        }
        None => {
            let mut f = std::fs::File::open(&image)
                .with_context(|| format!("opening {}", image.display()))?;
            imager::disk::gpt::read_table_from(&mut f)
                .with_context(|| format!("reading {}", a.image.display()))?
                .sector_size
        }
    };
    o.echo = !a.quiet;
    o.console_log = a.console_log;
    o.screen = a.screen;
    o.reboots = a.reboots;
    o.serial = a.serial;
    o.secure_boot_vars = a.secure_boot;
    o.net.model = a.nic;
    o.net.forwards = a
        .forwards
        .iter()
        .map(|f| qemu::net::Forward::parse(f))
        .collect::<Result<_>>()?;
    o.net.guest_forwards = a
        .guest_forwards
        .iter()
        .map(|f| qemu::net::GuestForward::parse(f))
        .collect::<Result<_>>()?;
    o.media = match (iso, a.usb) {
        (true, false) if a.write => bail!(
            "--write: a CD-ROM is read-only; add --usb to attach {} as a disk the guest writes",
            a.image.display()
        ),
        (true, false) => qemu::Media::Cdrom,
        (true, true) => qemu::Media::Disk,
        (false, true) => bail!(
            "--usb attaches an ISO as a disk: {} is not an ISO (a raw image is always a disk)",
            a.image.display()
        ),
        (false, false) => qemu::Media::Disk,
    };
    if o.media == qemu::Media::Cdrom && a.bus != qemu::Bus::Virtio {
        bail!(
            "--bus {}: an ISO boots from the CD-ROM drive; add --usb to attach it as a disk on \
             that bus",
            a.bus.name()
        );
    }
    o.bus = a.bus;
    let blanks = tempfile::tempdir().context("creating a directory for blank disks")?;
    for (i, spec) in a.disks.iter().enumerate() {
        o.disks.push(extra_disk(
            spec,
            &blanks.path().join(format!("blank{i}.raw")),
        )?);
    }
    let r = qemu::boot(&o).with_context(|| format!("booting {}", a.image.display()))?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        eprintln!(
            "boot: ready version={} {} under {} ({}) in {:.1} s; Secure Boot {}, root {}{}",
            r.version,
            match &r.slot {
                Some(s) => format!("slot={s}"),
                None => "live".into(),
            },
            r.firmware.name(),
            r.arch,
            r.seconds,
            r.secure_boot.as_deref().unwrap_or("not reported"),
            match r.root_verified {
                Some(true) => "verified (dm-verity)",
                Some(false) => "NOT verified",
                None => "verification not reported",
            },
            if r.failed_boots > 0 {
                format!(" after {} failed boot(s)", r.failed_boots)
            } else {
                String::new()
            }
        );
    }
    if let Some(i) = &r.install {
        if !a.json {
            eprintln!("boot: {}", i.message);
        }
        if !i.installed {
            eprintln!(
                "imager: error: the live system did not install: {}",
                i.message
            );
            return Ok(ExitCode::FAILURE);
        }
    }
    Ok(if r.clean_poweroff == Some(false) {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// An extra disk of `imager boot --disk`: `SIZE` (a blank sparse file
/// created at `blank`, gone after the boot) or an existing image `FILE`,
/// either followed by `,serial=S`.
fn extra_disk(spec: &str, blank: &Path) -> Result<qemu::ExtraDisk> {
    // Options after the disk, in any order: `,serial=S`, `,bus=B`.
    let (mut what, mut serial, mut bus) = (spec, None, qemu::Bus::Virtio);
    while let Some((rest, opt)) = what.rsplit_once(',') {
        if let Some(s) = opt.strip_prefix("serial=") {
            serial = Some(s.to_string());
        } else if let Some(b) = opt.strip_prefix("bus=") {
            bus = b
                .parse()
                .map_err(|e| anyhow::anyhow!("--disk {spec}: {e}"))?;
        } else {
            break;
        }
        what = rest;
    }
    qemu::drive::extra_device_args(bus, "extra", 0, None)
        .with_context(|| format!("--disk {spec}"))?;
    if let Some(s) = &serial {
        qemu::check_serial(s).with_context(|| format!("--disk {spec}"))?;
    }
    let path = Path::new(what);
    let size = imager::profile::Size::parse(what);
    if path.exists() && size.is_ok() {
        bail!(
            "--disk {spec}: {what} is both a size and an existing file: write ./{what} for the \
             file"
        );
    }
    if path.exists() {
        ensure!(path.is_file(), "--disk {spec}: {what} is not an image file",);
        return Ok(qemu::ExtraDisk {
            path: path.to_path_buf(),
            serial,
            bus,
        });
    }
    let size = size.map_err(|e| {
        anyhow::anyhow!("--disk {spec}: {what} is neither an existing image file nor a size ({e})")
    })?;
    ensure!(
        size.0 > 0 && size.0 % 512 == 0,
        "--disk {spec}: a disk's size is a positive multiple of 512 bytes"
    );
    let f =
        std::fs::File::create(blank).with_context(|| format!("creating {}", blank.display()))?;
    f.set_len(size.0)
        .with_context(|| format!("sizing {}", blank.display()))?;
    Ok(qemu::ExtraDisk {
        path: blank.to_path_buf(),
        serial,
        bus,
    })
}

fn exit(code: i32) -> ExitCode {
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}

fn main() -> ExitCode {
    match run() {
        Ok(c) => c,
        Err(e) => {
            // Messages never quote secrets; redact is the last guard.
            // Each line escaped: what a message quotes from outside cannot
            // drive the terminal (quoted newlines are escaped at the source).
            let message = imager::input::redact(&format!("{e:#}"));
            let lines: Vec<String> = message.split('\n').map(contract::text::escape).collect();
            eprintln!("imager: error: {}", lines.join("\n"));
            ExitCode::FAILURE
        }
    }
}
