//! `imager build`: the whole pipeline from a profile to signed artifacts.
//!
//! kernel → runtime → root filesystem → initramfs → disk image, installer
//! image → manifest.
//!
//! One build at a time writes an output directory: the build holds an
//! exclusive lock on the directory itself ([`lock_output`]) from start to
//! end, and a second build into it is refused at once. Only the lock holder
//! sweeps the temporaries a killed build left there.
//!
//! Every artifact is written into a staging directory inside the output
//! directory ([`crate::io::Staging`]) and checked there; the disk image's
//! partition table is read back and checked against its layout; the
//! manifest is signed there. Only then is the build committed: the old
//! manifest and signature are removed, the artifacts renamed into place,
//! the signature and the manifest last. A build that fails before that
//! leaves the previous build exactly as it was; a directory with a manifest
//! that verifies holds a complete build.
//!
//! `build/skeleton.rs` turns the skeleton manifest into the root
//! filesystem's contents; `build/installer.rs` writes the installer image.

use crate::artifact::{Artifact, Kind};
use crate::io::{DirLock, Staging};
use crate::profile::{Output, Profile};
use crate::{boot, disk, initramfs, kernel, rootfs, runtime, sign};
use anyhow::{Context, Result, bail};
use contract::{Slot, paths};
use std::path::{Path, PathBuf};

mod installer;
mod iso;
pub mod record;
mod secureboot;
mod shared;
mod skeleton;
mod uki;

pub use record::{Inputs, OutputStamp, Reuse, StageReport, Stages};

pub use secureboot::esp_files as secure_esp_files;
pub use shared::CacheRegistry;
use shared::shared_cache;

pub use installer::{PayloadInput, installer_spec, relative_link, write_installer, write_payload};
pub use iso::live_options;
pub use skeleton::{firmware_files, rootfs_spec};

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
    /// Which recorded stages may be skipped (`--force`, `--verify-outputs`).
    pub reuse: Reuse,
    /// A build cache shared through a registry (`--cache-registry`; the
    /// profile's `cache` otherwise).
    pub cache_registry: Option<CacheRegistry>,
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
    /// What became of each stage: built (and why) or skipped.
    pub stages: Vec<StageReport>,
}

/// Runs the whole build: each phase in order, the cheap checks and the
/// signing key first, so that a profile that cannot work or a bad key fails
/// before an hour of work; the commit into the output directory last.
pub fn run(p: &Profile, opts: &BuildOptions) -> Result<BuildReport> {
    build(p, opts, None)
}

/// [`run`], signing with `signer` rather than with the key of `--key`, the
/// profile or the development key.
pub fn run_with_signer(
    p: &Profile,
    opts: &BuildOptions,
    signer: &dyn sign::Signer,
) -> Result<BuildReport> {
    build(p, opts, Some(signer))
}

fn build(
    p: &Profile,
    opts: &BuildOptions,
    given: Option<&dyn sign::Signer>,
) -> Result<BuildReport> {
    not_yet_for_arch(p)?;
    let out = &opts.out_dir;
    let _lock = lock_output(out)?;
    let epoch = describe_build(p, out)?;
    let loaded;
    let signer = match given {
        Some(s) => s,
        None => {
            loaded = load_signer(p, opts)?;
            loaded.as_ref()
        }
    };
    let cosigners = p
        .signing
        .cosigners
        .iter()
        .map(|k| {
            sign::open_signer(k).with_context(|| format!("signing.cosigners: {}", k.display()))
        })
        .collect::<Result<Vec<_>>>()?;
    let root = match &p.signing.root {
        Some(r) => Some(sign::RootFiles::load(r).context("signing.root")?),
        None => None,
    };
    let signing = sign::Signing {
        signer,
        cosigners: &cosigners,
        root: root.as_ref(),
    };
    check_signing(p, &signing)?;
    let trust_files = signing.trust_files();
    let cache = shared_cache(p, opts, signer)?;
    let shared = cache
        .as_ref()
        .map(|cache| crate::remote_cache::Shared { cache, signer });
    let pre = preflight(p, &opts.cache_dir, shared)?;
    let files = output_files(p, &pre);
    crate::io::check_replaceable(
        out,
        &[
            &files[..],
            &[names::SIGNATURE, names::MANIFEST, names::RECORD],
            &paths::PAYLOAD_TRUST_FILES[..],
        ]
        .concat(),
    )?;
    let sb = match &p.secure_boot {
        Some(s) => Some(secureboot::load(p, s, epoch)?),
        None => None,
    };
    let node_ca = match p.node_api.as_ref().and_then(|n| n.ca.as_ref()) {
        Some(ca) => Some(read_node_ca(ca)?),
        None => None,
    };
    let (kernel, (machined, installer_bin)) = kernel_and_binaries(p, opts, shared)?;
    let stage = Staging::create(out, "build")?;
    let mut stages = Stages::open(out, stage.path(), opts.reuse);
    let inputs = BuildInputs {
        p,
        epoch,
        pre,
        signer,
        signing: &signing,
        sb: sb.as_ref(),
        node_ca: node_ca.as_deref(),
        kernel: &kernel,
        machined: &machined,
        installer_bin: installer_bin.as_deref(),
        dir: stage.path(),
        blocks: opts.cache_dir.join("squashfs"),
        shared,
    };
    let (artifacts, boot_info) = run_stages(&mut stages, &inputs)?;
    let listed = stages.run(
        "manifest",
        manifest_inputs(&inputs, &artifacts, &boot_info)?,
        &[&[names::MANIFEST, names::SIGNATURE][..], &trust_files].concat(),
        |dir| {
            step("sign: manifest");
            sign_manifest(p, dir, &artifacts, boot_info, &signing, epoch)?;
            Ok(serde_json::Value::Null)
        },
    )?;
    let mut all = artifacts;
    all.push((Kind::Manifest, listed.outputs[names::MANIFEST].clone()));
    all.push((Kind::Signature, listed.outputs[names::SIGNATURE].clone()));
    if stages.nothing_built() {
        step(&format!("nothing changed: {} is up to date", out.display()));
    } else {
        commit(out, &stage, &files, &trust_files)?;
        stages.write_record()?;
    }
    Ok(BuildReport {
        name: p.name.clone(),
        version: p.version.clone(),
        profile: profile_name(p),
        source_date_epoch: epoch,
        key_id: signer.key_id(),
        kernel_cached: kernel.cached,
        artifacts: all
            .iter()
            .map(|(kind, o)| Artifact {
                kind: *kind,
                path: out.join(&o.name).display().to_string(),
                sha256: o.sha256.clone(),
                size: o.size,
            })
            .collect(),
        stages: stages.report_lines(),
    })
}

/// Refuses, before anything is written, what a profile of another
/// architecture than amd64 asks for and does not build yet (docs/arm64.md):
/// arm64 builds everything but the clouds' images (gcp, azure, vmware,
/// aws), whose descriptions name an x86-64 machine (the OVA's guest type
/// and SATA controller, the clouds' import architecture).
fn not_yet_for_arch(p: &Profile) -> Result<()> {
    if p.arch == contract::Arch::Amd64 {
        return Ok(());
    }
    let asked: Vec<&str> = p
        .outputs
        .iter()
        .filter(|o| {
            matches!(
                o,
                Output::Gcp | Output::Azure | Output::Vmware | Output::Aws
            )
        })
        .map(|o| o.name())
        .collect();
    if !asked.is_empty() {
        bail!(
            "profile {}: arch {}: {} not built for {} yet (the clouds' images describe x86-64 \
             machines): remove them from the profile; the raw, vhd and qcow2 disks boot on \
             arm64 machines (docs/arm64.md says what works)",
            p.path.display(),
            p.arch,
            asked.join(", "),
            p.arch
        );
    }
    Ok(())
}

/// The names of the files a build of `p` commits into its output
/// directory, but the manifest and its signature.
fn output_files(p: &Profile, pre: &Preflight) -> Vec<&'static str> {
    let mut files = vec![
        names::KERNEL,
        names::KERNEL_CONFIG,
        names::ROOTFS,
        names::ROOTFS_VERITY,
        names::INITRAMFS,
    ];
    if p.makes_ukis() {
        files.extend(Slot::ALL.map(names::uki));
    }
    files.extend(disk_outputs(p, pre));
    if installer_wanted(p) {
        files.push(names::INSTALLER);
    }
    if p.outputs.contains(&Output::Iso) {
        files.push(names::ISO);
    }
    files
}

/// The disk images a build of `p` keeps: the raw disk and the formats
/// made from it.
fn disk_outputs(p: &Profile, pre: &Preflight) -> Vec<&'static str> {
    let mut files = Vec::new();
    if pre.layout.is_none() {
        return files;
    }
    if p.outputs.contains(&Output::Raw) {
        files.push(names::RAW);
    }
    files.extend(disk::formats::made(p).map(|(_, _, name)| name));
    files
}

fn installer_wanted(p: &Profile) -> bool {
    p.installer.is_some() && p.outputs.contains(&Output::Installer)
}

/// What the stages of one build read, found before the first stage.
struct BuildInputs<'a> {
    p: &'a Profile,
    epoch: u64,
    pre: Preflight,
    signer: &'a dyn sign::Signer,
    /// The signer, co-signers and root of trust of the manifests.
    signing: &'a sign::Signing<'a>,
    sb: Option<&'a secureboot::SecureBoot>,
    node_ca: Option<&'a str>,
    kernel: &'a KernelFiles,
    machined: &'a Path,
    installer_bin: Option<&'a Path>,
    /// The staging directory.
    dir: &'a Path,
    /// Where the root filesystem's compressed blocks are kept between
    /// builds (`CACHE/squashfs`, see [`rootfs::pack`]).
    blocks: PathBuf,
    /// The build cache shared through a registry, if any.
    shared: Option<crate::remote_cache::Shared<'a>>,
}

impl BuildInputs<'_> {
    /// The inputs every stage after the initramfs shares: the profile's
    /// text, SOURCE_DATE_EPOCH, the signing key, Secure Boot's keys and
    /// the node API's CA.
    fn common(&self, stage: &str) -> Result<Inputs> {
        let mut i = Inputs::new(stage)?
            .file("profile", &self.p.path)?
            .value("epoch", self.epoch.to_string())
            .value("signer", self.signer.public_key().as_bytes());
        for c in self.signing.cosigners {
            i = i.value("cosigner", c.public_key().as_bytes());
        }
        if let Some(r) = self.signing.root {
            i = i.value("root", &r.bytes).value(
                "root signatures",
                r.signatures.as_deref().unwrap_or_default(),
            );
        }
        if let Some(sb) = self.sb {
            i = i.value("secure-boot db", &sb.db_pem);
            for (name, bytes) in &sb.enrolment {
                i = i.value(name, bytes);
            }
            for (name, _, bytes) in &sb.updates {
                i = i.value(name, bytes);
            }
        }
        if let Some(ca) = self.node_ca {
            i = i.value("node ca", ca);
        }
        Ok(i)
    }
}

/// One output of a stage as the manifest lists it.
type Made = (Kind, OutputStamp);

/// Runs the stages before the manifest: kernel, root filesystem and its
/// hash tree, initramfs, UKIs, disk images, installer image, ISO. Returns
/// the artifacts to list and the manifest's boot section.
fn run_stages(stages: &mut Stages, b: &BuildInputs) -> Result<(Vec<Made>, sign::Boot)> {
    let (p, dir) = (b.p, b.dir);
    let mut made = Vec::new();
    let mut keep = |done: &record::Done, kind: Kind, name: &str| -> Result<()> {
        let o = done
            .outputs
            .get(name)
            .with_context(|| format!("internal: no {name} was made"))?;
        made.push((kind, o.clone()));
        Ok(())
    };
    // 1. The kernel, from the cache or the profile.
    let kernel = stages.run(
        "kernel",
        Inputs::new("kernel")?
            .file("bzImage", &b.kernel.bzimage)?
            .file("config", &b.kernel.config)?,
        &[names::KERNEL, names::KERNEL_CONFIG],
        |dir| {
            place(&b.kernel.bzimage, dir, names::KERNEL)?;
            place(&b.kernel.config, dir, names::KERNEL_CONFIG)?;
            Ok(serde_json::Value::Null)
        },
    )?;
    keep(&kernel, Kind::Kernel, names::KERNEL)?;
    keep(&kernel, Kind::KernelConfig, names::KERNEL_CONFIG)?;
    // 2. The root filesystem and its dm-verity hash tree.
    let spec = rootfs_spec(p, b.machined, b.epoch)?;
    let rootfs = stages.run(
        "rootfs",
        rootfs_inputs(&spec)?,
        &[names::ROOTFS, names::ROOTFS_VERITY],
        |dir| {
            step("rootfs: squashfs");
            let dest = dir.join(names::ROOTFS);
            let shared = match b.shared {
                Some(s) => Some((s, rootfs::blocks_key(&spec)?)),
                None => None,
            };
            let pulled = shared
                .as_ref()
                .is_some_and(|(s, key)| shared::pull_blocks(*s, key, &b.blocks, spec.level));
            let (_, _, blocks) =
                rootfs::build_rootfs_threads(&dest, &spec, rootfs::threads(), Some(&b.blocks))?;
            if let (Some((s, key)), false) = (&shared, pulled) {
                shared::push_blocks(*s, key, &b.blocks, spec.level, blocks.packed);
            }
            if blocks.reused > 0 {
                step(&format!(
                    "rootfs: {} of {} blocks kept from earlier builds ({}), the others compressed",
                    blocks.reused,
                    blocks.blocks,
                    b.blocks.display()
                ));
            }
            let verity = write_verity(dir, &dir.join(names::ROOTFS))?;
            Ok(serde_json::json!({ "root_hash": verity.root_hash }))
        },
    )?;
    keep(&rootfs, Kind::Rootfs, names::ROOTFS)?;
    keep(&rootfs, Kind::RootfsVerity, names::ROOTFS_VERITY)?;
    let root_hash = rootfs.values["root_hash"]
        .as_str()
        .context("internal: the rootfs stage recorded no root hash")?
        .to_string();
    // 3. The initramfs: the runtime, the root filesystem, its hash tree.
    let machined = crate::io::sha256_file(b.machined)?.0;
    let initramfs = stages.run(
        "initramfs",
        Inputs::new("initramfs")?
            .value("machined", &machined)
            .value("rootfs", rootfs.digest(names::ROOTFS)?)
            .value("verity", rootfs.digest(names::ROOTFS_VERITY)?)
            .value("epoch", b.epoch.to_string())
            .value("level", p.compression.initramfs_zstd_level.to_string()),
        &[names::INITRAMFS],
        |dir| {
            write_initramfs(p, dir, b.machined, b.epoch)?;
            Ok(serde_json::Value::Null)
        },
    )?;
    keep(&initramfs, Kind::Initramfs, names::INITRAMFS)?;
    let (kernel_out, initramfs_out) = (dir.join(names::KERNEL), dir.join(names::INITRAMFS));
    // The image's command line: the profile's and the root hash.
    let cmdline = image_cmdline(
        p,
        verified_root(&dir.join(names::KERNEL_CONFIG), &root_hash)?,
    );
    let payload_inputs = |stage: &str| -> Result<Inputs> {
        Ok(b.common(stage)?
            .value("kernel", kernel.digest(names::KERNEL)?)
            .value("initramfs", initramfs.digest(names::INITRAMFS)?)
            .value("cmdline", &cmdline))
    };
    // 4. The slots' UKIs, signed for Secure Boot.
    let ukis = if p.makes_ukis() {
        let names_ = Slot::ALL.map(names::uki);
        let done = stages.run(
            "ukis",
            payload_inputs("ukis")?.file("stub", &p.boot.stub)?,
            &names_,
            |dir| {
                let made = uki::write_ukis(p, dir, &kernel_out, &initramfs_out, &cmdline)?;
                if let Some(sb) = b.sb {
                    step("secure boot: signing the UKIs and systemd-boot with the db key");
                    for u in &made {
                        sb.sign(u, u)?;
                    }
                }
                Ok(serde_json::Value::Null)
            },
        )?;
        for n in names_ {
            keep(&done, Kind::Uki, n)?;
        }
        Some(Slot::ALL.map(|s| dir.join(names::uki(s))))
    } else {
        None
    };
    let boot_info = sign::Boot {
        title: boot::image_title(&p.pretty_name, &p.version),
        cmdline: cmdline.clone(),
        secure_boot_enroll: b.sb.map(|s| s.enroll_mode.clone()),
    };
    // systemd-boot, signed for Secure Boot (staged, not an output).
    let mut esp = b.pre.esp.clone();
    let boot_loader = match b.sb {
        Some(sb) => {
            let signed = sb.sign(&p.boot.systemd_boot, &dir.join(paths::PAYLOAD_BOOT_LOADER))?;
            esp = sb.esp_files(&signed, p.arch)?;
            signed
        }
        None => p.boot.systemd_boot.clone(),
    };
    let payload = PayloadInput {
        boot_loader: &boot_loader,
        secure_boot: b.sb,
        kernel: &kernel_out,
        initramfs: &initramfs_out,
        boot: &boot_info,
        epoch: b.epoch,
        grub: b.pre.grub.as_ref().filter(|_| !p.uki_slots()),
        ukis: ukis.as_ref().filter(|_| p.uki_slots()),
        node_ca: b.node_ca,
    };
    let mut payload_digest = payload_inputs("payload")?.file("boot loader", &boot_loader)?;
    if let Some(u) = &ukis {
        for f in u {
            payload_digest = payload_digest.file("uki", f)?;
        }
    }
    if let Some(g) = b.pre.grub.as_ref() {
        payload_digest = payload_digest
            .value("grub boot.img", g.boot_img())
            .value("grub core.img", g.core_img());
    }
    let payload_digest = payload_digest.finish();
    // 5. The disk images.
    if let Some(layout) = &b.pre.layout {
        let outputs = disk_outputs(p, &b.pre);
        let mut inputs = Inputs::new("disk")?
            .value("payload", &payload_digest)
            .value("layout", format!("{layout:?}"))
            .value("outputs", outputs.join(" "));
        for f in &esp {
            inputs = fat_file_inputs(inputs, f)?;
        }
        let done = stages.run("disk", inputs, &outputs, |dir| {
            write_disk_images(p, dir, layout, esp.clone(), &b.pre, &payload, b.signing)?;
            Ok(serde_json::Value::Null)
        })?;
        for (_, kind, name) in disk::formats::made(p) {
            keep(&done, kind, name)?;
        }
        if p.outputs.contains(&Output::Raw) {
            keep(&done, Kind::Raw, names::RAW)?;
        }
    }
    // 6. The installer image.
    if let (Some(bin), true) = (b.installer_bin, installer_wanted(p)) {
        let done = stages.run(
            "installer",
            Inputs::new("installer")?
                .value("payload", &payload_digest)
                .file("installer", bin)?,
            &[names::INSTALLER],
            |dir| {
                step("installer: payload manifest and OCI archive");
                write_installer(p, dir, bin, &payload, b.signing)?;
                Ok(serde_json::Value::Null)
            },
        )?;
        keep(&done, Kind::Installer, names::INSTALLER)?;
    }
    // 7. The live ISO.
    if let (Some(bin), true) = (b.installer_bin, p.outputs.contains(&Output::Iso)) {
        let input = iso::IsoInput {
            machined: b.machined,
            rootfs: &dir.join(names::ROOTFS),
            rootfs_verity: &dir.join(names::ROOTFS_VERITY),
            installer: bin,
            eltorito: b.pre.eltorito.as_ref(),
        };
        let mut inputs = Inputs::new("iso")?
            .value("payload", &payload_digest)
            .file("installer", bin)?
            .value("machined", &machined)
            .value("rootfs", rootfs.digest(names::ROOTFS)?)
            .value("verity", rootfs.digest(names::ROOTFS_VERITY)?);
        if let Some(eltorito) = &b.pre.eltorito {
            inputs = inputs
                .value("eltorito", &eltorito.image)
                .value("hybrid mbr", &eltorito.hybrid_mbr);
        }
        let done = stages.run("iso", inputs, &[names::ISO], |dir| {
            iso::write_iso(p, dir, &payload, &input, b.signing)?;
            Ok(serde_json::Value::Null)
        })?;
        keep(&done, Kind::Iso, names::ISO)?;
    }
    Ok((made, boot_info))
}

/// The inputs of the manifest: every artifact it lists and its boot
/// section, signed by the build's key.
fn manifest_inputs(b: &BuildInputs, artifacts: &[Made], boot: &sign::Boot) -> Result<Inputs> {
    let mut i = b
        .common("manifest")?
        .value("boot", serde_json::to_string(boot)?);
    for (kind, o) in artifacts {
        i = i.value(kind.name(), format!("{} {} {}", o.name, o.size, o.sha256));
    }
    Ok(i)
}

/// The inputs of the root filesystem: everything its spec names (the
/// skeleton tree, each file's contents and mode, the directories), the
/// epoch and the compression level.
fn rootfs_inputs(spec: &rootfs::RootfsSpec) -> Result<Inputs> {
    let mut i = Inputs::new("rootfs")?
        .value("epoch", spec.epoch.to_string())
        .value("level", spec.level.to_string());
    if let Some(skel) = &spec.skeleton {
        i = i.tree("skeleton", skel)?;
    }
    for (path, mode) in &spec.dirs {
        i = i.value("dir", format!("{path} {mode:o}"));
    }
    for f in &spec.files {
        i = source_inputs(
            i.value("file", format!("{} {:o}", f.path, f.mode)),
            &f.source,
        )?;
    }
    Ok(i)
}

fn fat_file_inputs(i: Inputs, f: &disk::FatFile) -> Result<Inputs> {
    source_inputs(i.value("fat file", &f.path), &f.source)
}

fn source_inputs(i: Inputs, source: &disk::FatSource) -> Result<Inputs> {
    Ok(match source {
        disk::FatSource::Bytes(b) => i.value("bytes", b),
        disk::FatSource::File(path) => i.file("contents", path)?,
        disk::FatSource::Dir => i.value("dir", ""),
    })
}

/// Writes the raw disk and the formats made from it into `dir`.
fn write_disk_images(
    p: &Profile,
    dir: &Path,
    layout: &disk::Layout,
    esp: Vec<disk::FatFile>,
    pre: &Preflight,
    payload: &PayloadInput,
    signing: &sign::Signing,
) -> Result<()> {
    let bios = pre
        .grub
        .as_ref()
        .filter(|_| pre.raw_bios)
        .map(|grub| disk::BiosBoot {
            grub,
            boot_flag: p.disk.bios_boot_flag,
        });
    let (raw, disk_guid) = write_disk(p, dir, layout, esp, bios, payload, signing)?;
    disk::formats::write(p, &raw, dir, *disk_guid.as_bytes(), payload.epoch)?;
    // Without the output raw, the disk stays in the staging directory.
    Ok(())
}

/// Creates the output directory `out` and takes its lock, held for as long
/// as the returned value lives; refused at once when another build holds
/// it. Holding the lock proves that no build is writing `out`: the
/// temporaries a killed build left there are swept.
pub fn lock_output(out: &Path) -> Result<DirLock> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let Some(lock) = crate::io::try_lock_dir(out)? else {
        bail!(
            "{} is being written by another build (it holds the directory's lock): wait for \
             it to finish, or build into another --out directory",
            out.display()
        );
    };
    if !lock.held() {
        step(&format!(
            "WARNING: {} cannot be locked (its filesystem has no flock): run one build at a \
             time in it; temporaries of interrupted builds are left in place",
            out.display()
        ));
        return Ok(lock);
    }
    let swept = crate::io::remove_stale_partials(out)?;
    if swept > 0 {
        step(&format!(
            "removed {swept} temporary file(s) of an interrupted build"
        ));
    }
    Ok(lock)
}

/// The build's SOURCE_DATE_EPOCH, and a line saying what is built where.
fn describe_build(p: &Profile, out: &Path) -> Result<u64> {
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

/// Moves the staged build into `out`: the old manifest and signature out
/// first (from then on the directory says "no complete build" until the new
/// manifest is in), the artifacts `names`, the signature, the manifest
/// last. Everything in the way is checked before the first change.
fn commit(out: &Path, stage: &Staging, names: &[&str], trust: &[&str]) -> Result<()> {
    let signed = [&[names::SIGNATURE][..], trust].concat();
    stage.check_destinations(&[names, &signed[..], &[names::MANIFEST]].concat())?;
    step(&format!("commit: moving the build into {}", out.display()));
    record::remove_record(out)?;
    remove_old_manifest(out)?;
    stage.commit(names)?;
    stage.commit(&signed)?;
    stage.commit(&[names::MANIFEST])
}

/// The cheap checks, before anything is built or written: the disk layout
/// (if the profile makes a disk), the ESP's files, and GRUB's images made
/// and checked against the BIOS partition.
fn preflight(
    p: &Profile,
    cache_dir: &Path,
    shared: Option<crate::remote_cache::Shared>,
) -> Result<Preflight> {
    let memo = crate::grub::Memos {
        dir: cache_dir.join("grub"),
        shared,
    };
    let layout = if p.makes_disk() {
        Some(layout(p)?)
    } else {
        None
    };
    let esp = boot::esp_files(&p.boot.systemd_boot, p.arch)?;
    if let Some(dir) = &p.kernel.firmware {
        firmware_files(dir)?;
    }
    if layout.is_some() && p.disk.sector_size == 4096 {
        step(
            "WARNING: a 4096-byte-sector image has no BIOS boot (BIOS firmware reads \
             512-byte sectors): the MBR gets no boot code and the BIOS partition stays empty",
        );
    }
    // GRUB for the raw image's BIOS path, and for the installer's payload
    // (an install onto a disk of 512-byte sectors writes it): where the
    // architecture boots BIOS.
    let raw_bios = layout.is_some() && p.bios_boot();
    let installer = p.arch.spec().bios
        && p.installer.is_some()
        && (p.outputs.contains(&Output::Installer) || p.outputs.contains(&Output::Iso));
    let grub = if raw_bios || installer {
        Some(
            crate::grub::make(&p.boot.grub_dir, Some(&memo))
                .with_context(|| format!("{}: boot.grub_dir", p.path.display()))?,
        )
    } else {
        None
    };
    if let (Some(l), Some(g), true) = (&layout, &grub, raw_bios) {
        let bios = l
            .partitions
            .iter()
            .find(|part| part.spec.role == contract::PartitionRole::Bios)
            .context("internal: the layout has no BIOS partition")?;
        crate::grub::check_fits(g, bios.len())?;
    }
    // GRUB boots the ISO under BIOS, on an architecture that has it.
    let eltorito = if p.outputs.contains(&Output::Iso) && p.arch.spec().bios {
        Some(
            crate::grub::make_eltorito(&p.boot.grub_dir, Some(&memo))
                .with_context(|| format!("{}: boot.grub_dir", p.path.display()))?,
        )
    } else {
        None
    };
    Ok(Preflight {
        layout,
        esp,
        grub,
        raw_bios,
        eltorito,
    })
}

/// What the checks before any work found and made: the disk layout, the
/// ESP's files, GRUB's images (for a raw image at 512-byte sectors, and for
/// the installer's payload) and whether the raw image gets GRUB.
struct Preflight {
    layout: Option<disk::Layout>,
    esp: Vec<disk::FatFile>,
    grub: Option<disk::Grub>,
    raw_bios: bool,
    /// GRUB's El Torito image, for the ISO's BIOS boot (none on an
    /// architecture without BIOS: its ISO boots by UEFI only).
    eltorito: Option<crate::grub::Eltorito>,
}

/// The disk layout of the profile; refused with the profile's file and
/// key, and for a disk too small, what would fit.
fn layout(p: &Profile) -> Result<disk::Layout> {
    let (size, ss, sizes) = (p.disk.size.0, p.disk.sector_size, p.partition_sizes());
    disk::Layout::new(size, ss, &sizes).map_err(|e| {
        let hint = match &e {
            disk::LayoutError::TooSmall { .. } => too_small_hint(size, ss, &sizes),
            _ => String::new(),
        };
        anyhow::anyhow!("{}: {}: {e}{hint}", p.path.display(), e.profile_key())
    })
}

/// What to change when the partitions do not fit: each partition size of
/// the profile that is larger than what fits beside the others, else
/// disk.size.
fn too_small_hint(size: u64, ss: u64, sizes: &std::collections::BTreeMap<String, u64>) -> String {
    use disk::layout::mib;
    let mut hints = Vec::new();
    for (label, asked) in sizes {
        let fits = disk::Layout::largest(size, ss, sizes, label);
        if fits.is_some_and(|max| max >= *asked) {
            continue;
        }
        hints.push(format!(
            "; disk.partitions.{label} asks for {} but {} on this disk: lower it, or raise \
             disk.size",
            mib(*asked),
            fits.map_or("none fits beside the other partitions".to_string(), |max| {
                format!("at most {} fits", mib(max))
            })
        ));
    }
    if hints.is_empty() {
        hints.push("; raise disk.size in the profile".to_string());
    }
    hints.concat()
}

/// The build's keys against the root of trust it carries: every key that
/// signs must be in it (a signature by another counts for nothing on the
/// disks it makes), and a root after the first must carry its own
/// threshold's signatures (upgrades refuse it otherwise). Fewer manifest
/// signatures than its threshold fails a build that makes an ISO (whose
/// payload cannot be signed later) and is said otherwise (`imager sign
/// --add` adds them to the output directory and to `installer.tar`).
fn check_signing(p: &Profile, signing: &sign::Signing) -> Result<()> {
    if !signing.trust_files().is_empty() {
        step(
            "WARNING: this build's payloads carry trust files (signing.root or \
             signing.cosigners): a node running a release made before them refuses such an \
             installer image over the node API; upgrade older nodes first to a release built \
             without them (docs/signing.md, \"The root of trust\")",
        );
    }
    let Some(r) = signing.root else {
        if !signing.cosigners.is_empty() {
            step(
                "WARNING: signing.cosigners without signing.root: the disks this build makes \
                 trust the signing key alone, and the co-signatures count only on disks whose \
                 root of trust holds their keys",
            );
        }
        return Ok(());
    };
    let mut keys = vec![signing.signer.public_key()];
    for c in signing.cosigners {
        keys.push(c.public_key());
    }
    for k in &keys {
        if !r.root.keys.contains(k) {
            bail!(
                "the key {} signs this build but is not in its root of trust (signing.root, \
                 version {}): sign with the root's keys ({}), or make a root that holds it \
                 (imager root init)",
                sign::key_id(k),
                r.root.version,
                r.root
                    .keys
                    .iter()
                    .map(sign::key_id)
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }
    let sigs = payload::root::parse_signatures(r.signatures.as_deref().unwrap_or(b"[]"))
        .map_err(|e| anyhow::anyhow!("signing.root's signatures: {e}"))?;
    let own = r.root.check(
        &payload::root::root_message(&r.bytes),
        &sigs,
        &format!("root {}", r.root.version),
    );
    match own {
        Err(e) if r.root.version > 1 => bail!(
            "signing.root: {e} (`imager root sign`): disks of root {} would refuse it",
            r.root.version - 1
        ),
        Err(_) => step(&format!(
            "WARNING: root of trust {} is not signed by {} of its keys (`imager root sign`): \
             the disks this build makes start with it, but an install from its installer or \
             ISO trusts the installing key alone",
            r.root.version, r.root.threshold
        )),
        Ok(()) => {}
    }
    keys.sort_by_key(|k| k.to_bytes());
    keys.dedup();
    if keys.len() < r.root.threshold {
        let short = format!(
            "root of trust {} needs {} signatures of a payload and this build makes {}",
            r.root.version,
            r.root.threshold,
            keys.len()
        );
        if p.outputs.contains(&Output::Iso) {
            bail!(
                "{short}: the ISO's payload cannot be signed after the build; add \
                 signing.cosigners"
            );
        }
        step(&format!(
            "WARNING: {short}: add signing.cosigners, or add signatures to the output \
             directory and installer.tar with `imager sign --add`"
        ));
    }
    Ok(())
}

/// The signing key: `--key`, the profile's, or the development key
/// (created on first use).
fn load_signer(p: &Profile, opts: &BuildOptions) -> Result<Box<dyn sign::Signer>> {
    let key_path = opts.key.clone().or_else(|| p.signing.key.clone());
    Ok(match &key_path {
        Some(k) => sign::open_signer(k)?,
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
fn kernel_files(
    p: &Profile,
    opts: &BuildOptions,
    shared: Option<kernel::build::Shared>,
) -> Result<KernelFiles> {
    if let (Some(k), Some(c)) = (&p.kernel.prebuilt, &p.kernel.prebuilt_config) {
        step(&format!("kernel: prebuilt {}", k.display()));
        for f in [k, c] {
            if !f.is_file() {
                bail!("prebuilt kernel file {} not found", f.display());
            }
        }
        kernel::check_image(k, p.arch)?;
        let rules = kernel::Rules::load(&p.kernel.rules)?;
        let config = kernel::KernelConfig::load(c)?;
        kernel::build::audit_or_fail(&rules, &config, &p.cmdline(), &waivers(p)?, None)
            .with_context(|| format!("auditing the prebuilt kernel's {}", c.display()))?;
        for w in crate::disk::platform::lacking_drivers(&p.outputs, &config) {
            step(&w);
        }
        return Ok(KernelFiles {
            bzimage: k.clone(),
            config: c.clone(),
            cached: true,
        });
    }
    let req = kernel_request(p, &opts.cache_dir, opts.jobs)?;
    let built = kernel::build::build_shared(&req, shared)?;
    step(&format!(
        "kernel: {} ({})",
        built.bzimage.display(),
        if built.cached { "cached" } else { "built" }
    ));
    for w in crate::disk::platform::lacking_drivers(
        &p.outputs,
        &kernel::KernelConfig::load(&built.config)?,
    ) {
        step(&w);
    }
    Ok(KernelFiles {
        bzimage: built.bzimage,
        config: built.config,
        cached: built.cached,
    })
}

/// Removes the old manifest, its signature and its trust files (the
/// manifest first: a signature without a manifest is no build) and flushes
/// the directory.
fn remove_old_manifest(out: &Path) -> Result<()> {
    for old in [
        &[names::MANIFEST, names::SIGNATURE][..],
        &paths::PAYLOAD_TRUST_FILES,
    ]
    .concat()
    {
        let old = out.join(old);
        match std::fs::remove_file(&old) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("removing {}", old.display())),
        }
    }
    crate::io::sync_dir(out)
}

/// The runtime binary: built from its cargo package, or the prebuilt one
/// (checked to be static).
fn runtime_binary(p: &Profile) -> Result<PathBuf> {
    match (&p.runtime.cargo_package, &p.runtime.binary) {
        (Some(pkg), _) => {
            step(&format!("runtime: building {}", pkg.display()));
            runtime::build(pkg, p.arch)
        }
        (None, Some(bin)) => {
            runtime::check_static(bin, p.arch)?;
            Ok(bin.clone())
        }
        (None, None) => bail!("the profile names no runtime"),
    }
}

/// The kernel (built or from its cache) and the static binaries (built by
/// cargo or checked) at once: they are independent, and a no-change
/// rebuild otherwise waits for cargo's own no-change check after the
/// kernel cache's. Both are run to their end before an error is returned.
fn kernel_and_binaries(
    p: &Profile,
    opts: &BuildOptions,
    shared: Option<kernel::build::Shared>,
) -> Result<(KernelFiles, (PathBuf, Option<PathBuf>))> {
    std::thread::scope(|s| {
        let binaries =
            s.spawn(|| Ok::<_, anyhow::Error>((runtime_binary(p)?, installer_binary(p)?)));
        let kernel = kernel_files(p, opts, shared);
        let binaries = binaries
            .join()
            .map_err(|_| anyhow::anyhow!("the thread building the runtime panicked"))?;
        Ok((kernel?, binaries?))
    })
}

/// The installer binary (the static imager), if the profile makes an
/// installer image.
fn installer_binary(p: &Profile) -> Result<Option<PathBuf>> {
    let Some(i) = &p.installer else {
        return Ok(None);
    };
    if !p.outputs.contains(&Output::Installer) && !p.outputs.contains(&Output::Iso) {
        return Ok(None);
    }
    Ok(Some(match (&i.cargo_package, &i.binary) {
        (Some(pkg), _) => {
            step(&format!("installer: building {} (static)", pkg.display()));
            runtime::build_named(pkg, "installer", "installer.cargo_package", p.arch)?
        }
        (None, Some(bin)) => {
            runtime::check_static(bin, p.arch)?;
            bin.clone()
        }
        (None, None) => bail!("the profile names no installer binary"),
    }))
}

/// Pads the root filesystem to whole 4096-byte blocks and writes its
/// dm-verity hash device `out/rootfs.verity` (see [`crate::verity`]).
fn write_verity(out: &Path, rootfs_out: &Path) -> Result<crate::verity::Verity> {
    step("rootfs: dm-verity hash tree");
    let padded = crate::verity::pad_to_block(rootfs_out)?;
    if padded > 0 {
        step(&format!(
            "rootfs: padded with {padded} zero bytes to whole 4096-byte blocks"
        ));
    }
    let verity_out = out.join(names::ROOTFS_VERITY);
    crate::verity::format(rootfs_out, &verity_out)
}

/// The root hash to put on the command line: `None`, said loudly, when
/// the kernel cannot open the root through dm-verity (it would never boot
/// with the hash; see [`crate::verity::KERNEL_OPTIONS`]).
fn verified_root<'a>(config: &Path, root_hash: &'a str) -> Result<Option<&'a str>> {
    let lacks = crate::verity::kernel_lacks(&kernel::KernelConfig::load(config)?);
    if lacks.is_empty() {
        return Ok(Some(root_hash));
    }
    step(&format!(
        "warning: the kernel does not build in {}: the root filesystem will NOT be verified \
         at boot (no {} on the command line; the ready line says root=unverified)",
        lacks.join(", "),
        contract::cmdline::VERITY
    ));
    Ok(None)
}

/// The image's kernel command line: the profile's, then the root hash
/// ([`contract::cmdline::VERITY`]) when there is one. The boot entries,
/// GRUB, the live ISO and the signed manifest all carry this one.
pub fn image_cmdline(p: &Profile, root_hash: Option<&str>) -> String {
    let base = p.cmdline();
    match root_hash {
        Some(h) if base.is_empty() => contract::cmdline::verity_arg(h),
        Some(h) => format!("{base} {}", contract::cmdline::verity_arg(h)),
        None => base,
    }
}

/// Writes the initramfs `out/initramfs.zst`: the runtime, the root
/// filesystem and its hash device (both in `out`).
fn write_initramfs(p: &Profile, out: &Path, machined: &Path, epoch: u64) -> Result<PathBuf> {
    step("initramfs: cpio + zstd");
    let initramfs_out = out.join(names::INITRAMFS);
    initramfs::build_initramfs(
        &initramfs_out,
        machined,
        &out.join(names::ROOTFS),
        Some(&out.join(names::ROOTFS_VERITY)),
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
    bios: Option<disk::BiosBoot>,
    payload: &PayloadInput,
    signing: &sign::Signing,
) -> Result<(PathBuf, contract::Guid)> {
    step("disk: raw GPT image");
    let slot_payload = payload.slot_payload(&p.version, p.security_version)?;
    let identity = paths::image_identity(
        &p.name,
        &p.version,
        &[&slot_payload.kernel.sha256, &slot_payload.initramfs.sha256],
    );
    let disk_guid = contract::guid::disk_guid(&identity);
    let boot_files = boot::initial_boot_files(&slot_payload)?;
    let mut meta = bootstate::meta::initial(
        &p.name,
        &p.version,
        p.security_version,
        &[sign::public_key_pem(&signing.signer.public_key())?],
        "build",
    );
    if let Some(r) = signing.root {
        bootstate::meta::set_root(&mut meta, &r.bytes);
    }
    if let Some(sb) = payload.secure_boot {
        meta.set(contract::meta::Tag::SecureBoot, sb.db_pem.as_bytes());
        if let Some(r) = sb.updates_record(&p.version, payload.ukis, payload.boot_loader)? {
            meta.set(contract::meta::Tag::SecureBootUpdates, r);
        }
    }
    if let Some(ca) = payload.node_ca {
        meta.set(contract::meta::Tag::NodeCa, ca.as_bytes());
    }
    let raw = out.join(names::RAW);
    boot::write_raw_image(
        &raw,
        boot::DiskTarget::NewImage,
        layout,
        disk_guid,
        esp,
        boot_files,
        &meta,
        bios,
        payload.epoch,
    )?;
    Ok((raw, disk_guid))
}

/// The cluster CA certificate `node_api.ca` names: bounded text, PEM
/// certificates only (a private key is refused without being quoted, as
/// every input is: [`crate::input::read_text`]).
fn read_node_ca(path: &Path) -> Result<String> {
    let what = "node_api.ca certificate (ca.crt of `imager node credentials`)";
    let text = crate::input::read_text(path, what, nodeapi::tls::MAX_PEM as u64)?;
    nodeapi::tls::certs(text.as_bytes(), "node_api.ca certificate")
        .with_context(|| format!("node_api.ca: {}", path.display()))?;
    Ok(text)
}

/// Writes the signed manifest of `artifacts` (their digests as their
/// stages recorded them: nothing is read again) and its signature into
/// `out`.
fn sign_manifest(
    p: &Profile,
    out: &Path,
    artifacts: &[Made],
    boot_info: sign::Boot,
    signing: &sign::Signing,
    epoch: u64,
) -> Result<()> {
    let signer = signing.signer;
    let mut manifest = sign::Manifest {
        format: 1,
        name: p.name.clone(),
        version: p.version.clone(),
        security_version: p.security_version,
        profile: profile_name(p),
        arch: None,
        source_date_epoch: epoch,
        key_id: signer.key_id(),
        boot: Some(boot_info),
        artifacts: artifacts
            .iter()
            .map(|(kind, o)| Artifact {
                kind: *kind,
                path: o.name.clone(),
                sha256: o.sha256.clone(),
                size: o.size,
            })
            .collect(),
    };
    manifest.set_arch(p.arch);
    sign::write_signed_manifest_with(out, &manifest, signing)?;
    Ok(())
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
    step("SOURCE_DATE_EPOCH unset and no git history: using 0");
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
    crate::progress::message(msg);
}

/// The kernel request of a profile.
pub fn kernel_request(p: &Profile, cache_dir: &Path, jobs: usize) -> Result<kernel::KernelRequest> {
    let source = p
        .kernel
        .source
        .clone()
        .context("the profile has no kernel.source")?;
    Ok(kernel::KernelRequest {
        arch: p.arch,
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

/// Copies `src` to `out/name` atomically.
fn place(src: &Path, out: &Path, name: &str) -> Result<PathBuf> {
    let dest = out.join(name);
    let mut f = crate::io::AtomicFile::create(&dest)?;
    let mut r = std::fs::File::open(src).with_context(|| format!("opening {}", src.display()))?;
    std::io::copy(&mut r, &mut f).with_context(|| format!("copying {}", src.display()))?;
    f.commit()
}

/// Writes the report's artifact list as JSON (for `--json`).
pub fn report_json(r: &BuildReport) -> Result<String> {
    serde_json::to_string_pretty(r).context("serializing the build report")
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// arm64 builds its disk images, installer, UKIs, ISO and Secure Boot;
    /// the clouds' images are refused, named; amd64 refuses nothing here.
    #[test]
    fn arm64_refuses_what_it_does_not_build_and_amd64_nothing() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../profiles/metal-arm64.yaml");
        let mut p = Profile::load(&path).unwrap();
        assert_eq!(p.arch, contract::Arch::Arm64);
        let built = [
            Output::Raw,
            Output::Vhd,
            Output::Qcow2,
            Output::RawZst,
            Output::RawXz,
            Output::Installer,
            Output::Uki,
            Output::Iso,
        ];
        p.outputs = built.to_vec();
        p.secure_boot = Some(Default::default());
        not_yet_for_arch(&p).unwrap();
        for o in [Output::Gcp, Output::Azure, Output::Vmware, Output::Aws] {
            p.outputs = vec![Output::Raw, o];
            let e = not_yet_for_arch(&p).unwrap_err().to_string();
            assert!(
                e.contains(&format!("arch arm64: {} not built for arm64 yet", o.name())),
                "{e}"
            );
        }
        p.arch = contract::Arch::Amd64;
        not_yet_for_arch(&p).unwrap();
    }
}
