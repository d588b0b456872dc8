//! Booting an image in QEMU under real firmware and watching its console.
//!
//! The image is attached through a copy-on-write snapshot (QEMU's
//! `snapshot=on`) unless the caller asks to write to it; OVMF gets a private
//! copy of its variable store. The serial console is read line by line and
//! mirrored; the boot succeeds when the runtime's ready line appears, and
//! fails at once on a kernel panic, a runtime failure or a firmware that
//! found nothing to boot, and after the timeout otherwise. Nothing here
//! sleeps for a fixed time: every wait is for a console line or an exit.
//! With [`BootOptions::secure_boot_vars`] the machine runs OVMF's Secure
//! Boot build on that variable store itself (docs/secureboot.md);
//! [`boot_until`] waits for a refusal line instead of ready. The guest has
//! one virtio-net NIC on QEMU's restricted user-mode network ([`net`]).

pub mod drive;
pub mod machine;
pub mod net;

pub use drive::Bus;
pub use machine::{CPU, Machine};

use anyhow::{Context, Result, bail};
use serde::Serialize;
use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// amd64's UEFI firmware ([`machine::MACHINES`]).
pub const OVMF_CODE: &str = machine::MACHINES[0].uefi_code;
pub const OVMF_VARS: &str = machine::MACHINES[0].uefi_vars;
/// The runtime's ready line starts with this.
pub const READY_PREFIX: &str = "machined: ready ";

/// Every line the runtime prints starts with this.
const RUNTIME_PREFIX: &str = "machined: ";

/// What the runtime said on a console line: the text after its first
/// `machined: ` (a kernel message or a firmware's noise may come before
/// it), or `None` for a line that is not the runtime's. The runtime
/// escapes whatever it quotes ([`contract::text::escape`]), so a request or
/// a registry's answer holding `\nmachined: ready …` stays inside the line
/// that quotes it, after this prefix: a line is read by its first prefix
/// only, and a pattern of another program (the kernel's, the firmware's)
/// only before it.
fn runtime_said(line: &str) -> Option<&str> {
    line.find(RUNTIME_PREFIX)
        .map(|at| &line[at + RUNTIME_PREFIX.len()..])
}

/// The part of a console line before the runtime's text, where other
/// programs' patterns are looked for.
fn not_runtime(line: &str) -> &str {
    line.find(RUNTIME_PREFIX).map_or(line, |at| &line[..at])
}
const LAST_LINES: usize = 40;

/// The firmware a machine boots with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Firmware {
    /// OVMF: systemd-boot from the ESP.
    #[default]
    Uefi,
    /// SeaBIOS, QEMU's default firmware: GRUB from the MBR.
    Bios,
}

impl Firmware {
    pub fn name(self) -> &'static str {
        match self {
            Firmware::Uefi => "uefi",
            Firmware::Bios => "bios",
        }
    }
}

#[derive(Debug, Clone)]
pub struct BootOptions {
    pub image: PathBuf,
    /// UEFI (OVMF, the default) or BIOS (SeaBIOS).
    pub firmware: Firmware,
    pub timeout: Duration,
    pub memory_mib: u32,
    /// Write guest changes to the image instead of a throw-away overlay.
    pub write: bool,
    /// After ready, press the ACPI power button and wait for a clean power-off.
    pub shutdown: bool,
    /// After ready, keep the machine running (through its reboots, with
    /// `reboots`) until it powers off by itself; `timeout` covers it all.
    pub stay: bool,
    /// Use KVM instead of TCG (only when a probe shows it works).
    pub kvm: bool,
    /// Mirror the console to stderr.
    pub echo: bool,
    /// Logical sector size of the virtual disk (512 or 4096).
    pub sector_size: u64,
    /// Also keep the whole console here.
    pub console_log: Option<PathBuf>,
    /// Attach a standard VGA display adapter (the screen: SeaBIOS's VGA
    /// text mode, OVMF's GOP framebuffer) and, once ready, write what it
    /// shows to this file as a PPM image (QMP `screendump`).
    pub screen: Option<PathBuf>,
    /// Let the guest reboot and wait for ready across reboots: a runtime
    /// failure or kernel panic then does not end the boot (systemd-boot's
    /// boot counting may fall back to the other slot).
    pub reboots: bool,
    /// How the image is attached: a disk or a CD-ROM (AHCI).
    pub media: Media,
    /// The controller a disk is attached to ([`drive`]).
    pub bus: Bus,
    /// Serial number of the image's drive, as the guest sees it.
    pub serial: Option<String>,
    /// More disks, attached after the image (virtio, written to).
    pub disks: Vec<ExtraDisk>,
    /// Secure Boot: OVMF's Secure Boot build (SMM on, the variable store
    /// behind a secure pflash) with this variable store, used in place and
    /// not copied, so that keys enrolled during the boot stay in it. TCG
    /// only. `None`: the plain OVMF with a private copy of its store.
    pub secure_boot_vars: Option<PathBuf>,
    /// The guest's NIC on QEMU's restricted user-mode network, and port
    /// forwards to and from the host's loopback ([`net`]).
    pub net: net::NetOptions,
    /// The image's architecture, which picks the machine
    /// ([`machine::MACHINES`]): amd64's q35 or arm64's virt.
    pub arch: contract::Arch,
}

/// How the booted image is attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Media {
    /// A virtio disk: a raw image, or an ISO written to a USB stick.
    #[default]
    Disk,
    /// A CD-ROM drive on the AHCI controller (an ISO).
    Cdrom,
}

/// An extra disk: an image file the guest may write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtraDisk {
    pub path: PathBuf,
    /// Serial number the guest sees (`/sys/block/vdX/serial`).
    pub serial: Option<String>,
    /// Its controller: virtio, nvme or sata ([`drive::extra_device_args`]).
    pub bus: Bus,
}

/// The longest drive serial number QEMU gives virtio-blk (20, as ATA).
pub const MAX_SERIAL: usize = 20;

/// Refuses a serial number QEMU would cut or that its option syntax cannot
/// carry.
pub fn check_serial(serial: &str) -> Result<()> {
    if serial.is_empty()
        || serial.len() > MAX_SERIAL
        || !serial
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        bail!(
            "serial {serial:?}: use 1 to {MAX_SERIAL} letters, digits, '-' and '_' (QEMU gives \
             a drive at most {MAX_SERIAL} characters)"
        );
    }
    Ok(())
}

/// Whether `path` holds an ISO 9660 volume (a Primary Volume Descriptor,
/// as the live runtime reads it: [`bootstate::blank::iso_volume_set_id`]).
pub fn is_iso(path: &Path) -> Result<bool> {
    let mut f = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let id = bootstate::blank::iso_volume_set_id(&mut f)
        .with_context(|| format!("reading {}", path.display()))?;
    Ok(id.is_some())
}

/// The architecture of the disk image at `path` ([`bootstate::disk::Disk::arch`]:
/// the boot loader on its ESP; a hybrid ISO's GPT names its EFI image as
/// its ESP; a qcow2's disk is read through its reader), or why it is not
/// known (a disk imager did not make, a damaged ESP).
pub fn disk_arch(path: &Path) -> Result<contract::Arch> {
    if !crate::disk::qcow2::is_qcow2(path)? {
        return bootstate::disk::Disk::open(path, bootstate::disk::Access::Read)
            .and_then(|d| d.arch());
    }
    let mut q = crate::disk::qcow2::Qcow2::open(path)?;
    let table = crate::disk::gpt::read_table_from(&mut q)
        .with_context(|| format!("reading {}", path.display()))?;
    let role = contract::partition::esp_role(table.sector_size);
    let mut esp = table.window(q, role.label())?;
    bootstate::disk::one_arch(
        &bootstate::disk::loader_arches(&mut esp)?,
        &format!("{}: its ESP", path.display()),
    )
}

/// QEMU's format options for the disk image `path`: qcow2, raw, or a fixed VHD
/// (`bootstate::vhd`) sized by its footer rather than by the CHS geometry
/// QEMU would otherwise believe for an image of an unknown creator.
fn disk_format(path: &Path) -> Result<&'static str> {
    if crate::disk::qcow2::is_qcow2(path)? {
        return Ok("format=qcow2");
    }
    let mut f = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let len = f.metadata()?.len();
    let size = bootstate::gpt::image_size(&mut f)
        .with_context(|| format!("reading {}", path.display()))?;
    Ok(if size == len {
        "format=raw"
    } else {
        "format=vpc,force_size_calc=current_size"
    })
}

impl BootOptions {
    pub fn new(image: impl Into<PathBuf>) -> Self {
        BootOptions {
            image: image.into(),
            firmware: Firmware::Uefi,
            timeout: Duration::from_secs(300),
            memory_mib: 512,
            write: false,
            shutdown: false,
            stay: false,
            kvm: false,
            echo: true,
            sector_size: 512,
            console_log: None,
            screen: None,
            reboots: false,
            media: Media::Disk,
            bus: Bus::Virtio,
            serial: None,
            disks: Vec::new(),
            secure_boot_vars: None,
            net: net::NetOptions::default(),
            arch: contract::Arch::Amd64,
        }
    }
}

/// What the ready line said.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Ready {
    pub version: String,
    /// The slot booted; `None` on a live boot.
    pub slot: Option<String>,
    /// A live boot (`machined.live=`, from the ISO): `ready … live …`.
    pub live: bool,
    pub uptime: f64,
    /// `secureboot=on|off|unknown` (see [`contract::ready`]); `None` from
    /// a runtime that does not say.
    pub secure_boot: Option<String>,
    /// `root=verified|unverified`; `None` from a runtime that does not say.
    pub root_verified: Option<bool>,
}

/// The result of a boot that reached ready.
#[derive(Debug, Clone, Serialize)]
pub struct BootReport {
    pub ready: bool,
    /// The firmware it booted under.
    pub firmware: Firmware,
    /// The architecture of the machine (`amd64`, `arm64`).
    pub arch: &'static str,
    pub version: String,
    /// The slot booted (`null` on a live boot).
    pub slot: Option<String>,
    /// A live boot: the ready line said `live` in place of `slot=`.
    pub live: bool,
    /// Seconds from QEMU's start to the ready line.
    pub seconds: f64,
    /// Guest uptime the runtime reported.
    pub uptime: f64,
    /// Whether Secure Boot was on: `"on"`, `"off"` or `"unknown"` as the
    /// ready line said (`null` when it did not).
    pub secure_boot: Option<String>,
    /// Whether the root filesystem was opened through dm-verity with the
    /// command line's root hash (`null` when the ready line did not say).
    pub root_verified: Option<bool>,
    /// `/proc/cmdline` as the runtime printed it, if it did.
    pub cmdline: Option<String>,
    /// Whether the machine powered off cleanly after the power button.
    pub clean_poweroff: Option<bool>,
    /// Boots that failed (runtime failure or panic) before the ready one,
    /// with `reboots`.
    pub failed_boots: u32,
    /// What a live system asked to install did.
    pub install: Option<InstallOutcome>,
    #[serde(skip)]
    pub console: Vec<String>,
}

/// Parses a ready line: `machined: ready version=1.0 slot=A uptime=2.31
/// secureboot=off root=verified`, or a live system's `machined: ready
/// version=1.0 live uptime=2.31 …`. One of `slot=` and `live` is required;
/// the boot chain's words ([`contract::ready`]) are optional (older
/// runtimes) and an unknown value of theirs is read as absent.
pub fn parse_ready(line: &str) -> Option<Ready> {
    use contract::ready::{ROOT, Root, SECURE_BOOT, SecureBoot};
    let rest = runtime_said(line)?.strip_prefix(&READY_PREFIX[RUNTIME_PREFIX.len()..])?;
    let (mut version, mut slot, mut uptime, mut live) = (None, None, None, false);
    let (mut secure_boot, mut root_verified) = (None, None);
    for word in rest.split_whitespace() {
        match word.split_once('=') {
            Some(("version", v)) => version = Some(v.to_string()),
            Some(("slot", v)) => slot = Some(v.to_string()),
            Some(("uptime", v)) => uptime = v.parse().ok(),
            Some((k, v)) if k == SECURE_BOOT => {
                secure_boot = SecureBoot::parse(v).map(|s| s.as_str().to_string())
            }
            Some((k, v)) if k == ROOT => {
                root_verified = Root::parse(v).map(|r| r == Root::Verified)
            }
            None if word == "live" => live = true,
            _ => {}
        }
    }
    if slot.is_some() == live {
        return None;
    }
    Some(Ready {
        version: version?,
        slot,
        live,
        uptime: uptime?,
        secure_boot,
        root_verified,
    })
}

/// Failures after which the machine reboots by itself (the runtime reboots
/// on failure; the kernel on panic, with `panic=` set).
const RECOVERABLE: [&str; 3] = ["the kernel panicked", "the runtime failed", REFUSED_UKI];

/// systemd-boot's line when firmware refuses to run a UKI (Secure Boot:
/// not signed by a db key): `Error loading \EFI\Linux\….efi: Access
/// Denied`. systemd-boot then returns to the firmware, which says it found
/// nothing to boot and starts over; the entry's tries were counted down, so
/// the other slot boots once they run out.
const REFUSED_UKI: &str = "the firmware refused to run the slot's UKI (Access Denied)";

/// Whether `line` is systemd-boot's report of a UKI firmware refused.
fn refused_uki(line: &str) -> bool {
    line.contains("Error loading \\EFI\\Linux\\") && line.contains("Access Denied")
}

/// Console lines that end a boot as failed.
fn fatal_line(line: &str) -> Option<&'static str> {
    if runtime_said(line).is_some_and(|said| said.starts_with("fatal:")) {
        return Some("the runtime failed");
    }
    let line = not_runtime(line);
    if refused_uki(line) {
        return Some(REFUSED_UKI);
    }
    const FATAL: [(&str, &str); 9] = [
        ("Kernel panic", "the kernel panicked"),
        ("No bootable option", "the firmware found nothing to boot"),
        ("No bootable device", "the firmware found nothing to boot"),
        (
            "failed to load Boot",
            "the firmware could not load the boot loader",
        ),
        (
            "Failed to boot",
            "the boot loader could not start the kernel",
        ),
        ("No loader found", "systemd-boot found no boot entry"),
        (
            "Boot failed: not a bootable disk",
            "the firmware found nothing to boot",
        ),
        (
            "Press any key to continue",
            "GRUB could not boot its entry (see its error above)",
        ),
        (
            "\"UiApp\"",
            "the firmware gave up and started its setup menu",
        ),
    ];
    FATAL
        .iter()
        .find(|(pat, _)| line.contains(pat))
        .map(|(_, why)| *why)
}

/// Removes ANSI escape sequences and carriage returns the firmware prints.
pub fn clean_line(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\x1b' => {
                if chars.peek() == Some(&'[') {
                    chars.next();
                    for c in chars.by_ref() {
                        if c.is_ascii_alphabetic() {
                            break;
                        }
                    }
                }
            }
            '\r' => {}
            c if c.is_control() && c != '\t' => {}
            c => out.push(c),
        }
    }
    out
}

struct Guest {
    child: Child,
    _dir: tempfile::TempDir,
    qmp: PathBuf,
}

impl Drop for Guest {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Refuses what `m`, the machine of the image's architecture, does not
/// have: BIOS, q35's AHCI controller (SATA disks; its CD-ROM drive is
/// a SCSI one: [`Machine::cdrom_args`]).
/// (Secure Boot runs on either: [`Machine::secure_boot_code`].)
fn check_machine(opts: &BootOptions, m: &Machine) -> Result<()> {
    if m.bios_and_ahci {
        return Ok(());
    }
    let arch = m.arch;
    if opts.firmware == Firmware::Bios {
        bail!("--firmware bios: an {arch} machine boots UEFI only");
    }
    if opts.kvm {
        bail!("--kvm: an {arch} machine runs under TCG on this x86-64 host");
    }
    if opts.screen.is_some() {
        bail!(
            "--screen: the {arch} machine has no VGA adapter here; its console is the serial one"
        );
    }
    if let Some(b) = std::iter::once(opts.bus)
        .chain(opts.disks.iter().map(|d| d.bus))
        .find(|b| *b == Bus::Sata)
    {
        bail!(
            "bus {}: QEMU's {} machine has no AHCI controller: use virtio, nvme or a SCSI or USB \
             bus",
            b.name(),
            m.machine
        );
    }
    Ok(())
}

fn start(opts: &BootOptions) -> Result<(Guest, mpsc::Receiver<String>)> {
    let image = &opts.image;
    if !image.is_file() {
        bail!("image {} not found", image.display());
    }
    let uefi = opts.firmware == Firmware::Uefi;
    let secure = opts.secure_boot_vars.as_deref();
    let m = Machine::of(opts.arch);
    check_machine(opts, m)?;
    if secure.is_some() && (!uefi || opts.kvm) {
        bail!(
            "Secure Boot needs UEFI firmware under TCG (OVMF's SMM build does not run under KVM here)"
        );
    }
    let code = if secure.is_some() {
        m.secure_boot_code
    } else {
        m.uefi_code
    };
    if uefi {
        for fw in [code, secure.and_then(Path::to_str).unwrap_or(m.uefi_vars)] {
            if !Path::new(fw).is_file() {
                bail!(
                    "UEFI firmware {fw} not found: install {} (scripts/setup.sh)",
                    m.uefi_package
                );
            }
        }
    }
    let qemu = m.find_qemu()?;
    let dir = tempfile::tempdir().context("creating a directory for the VM")?;
    let vars = match secure {
        Some(v) => std::fs::canonicalize(v)
            .with_context(|| format!("resolving the variable store {}", v.display()))?,
        None => dir.path().join("OVMF_VARS.fd"),
    };
    if uefi && secure.is_none() {
        std::fs::copy(m.uefi_vars, &vars).context("copying the UEFI variable store")?;
    }
    let qmp = dir.path().join("qmp.sock");
    let image_abs =
        std::fs::canonicalize(image).with_context(|| format!("resolving {}", image.display()))?;
    let mut cmd = Command::new(qemu);
    cmd.arg("-machine")
        .arg(match secure {
            Some(_) if m.secure_boot_smm => format!("{},smm=on", m.machine),
            _ => m.machine.to_string(),
        })
        .arg("-m")
        .arg(opts.memory_mib.to_string())
        .args(["-cpu", m.cpu])
        .args(["-smp", "1", "-nodefaults", "-display", "none"])
        .args(if opts.reboots {
            &[][..]
        } else {
            &["-no-reboot"][..]
        })
        .args(["-accel", if opts.kvm { "kvm" } else { "tcg" }]);
    if secure.is_some() && m.secure_boot_smm {
        cmd.args(["-global", "driver=cfi.pflash01,property=secure,value=on"]);
    }
    if uefi {
        cmd.arg("-drive")
            .arg(format!(
                "if=pflash,format=raw,unit=0,readonly=on,file={code}"
            ))
            .arg("-drive")
            .arg(format!(
                "if=pflash,format=raw,unit=1,file={}",
                vars.display().to_string().replace(',', ",,")
            ));
    }
    // Without pflash, QEMU boots its default firmware, SeaBIOS. GRUB's
    // grub.cfg turns its serial terminal on first thing. The image boots
    // first (bootindex 0); extra disks have no boot index.
    let quoted = |p: &Path| p.display().to_string().replace(',', ",,");
    let serial = opts
        .serial
        .as_ref()
        .map(|s| format!(",serial={s}"))
        .unwrap_or_default();
    match opts.media {
        Media::Disk => {
            cmd.arg("-drive")
                .arg(format!(
                    "if=none,id=disk0,{},file={},snapshot={}",
                    disk_format(&image_abs)?,
                    // QEMU's option syntax doubles a comma inside a value.
                    quoted(&image_abs),
                    if opts.write { "off" } else { "on" }
                ))
                .args(drive::device_args(
                    opts.bus,
                    "disk0",
                    opts.sector_size,
                    opts.serial.as_deref(),
                )?);
        }
        Media::Cdrom => {
            cmd.arg("-drive")
                .arg(format!(
                    "if=none,id=disk0,format=raw,media=cdrom,readonly=on,file={}",
                    quoted(&image_abs)
                ))
                .args(m.cdrom_args("disk0", &serial));
        }
    }
    for (i, d) in opts.disks.iter().enumerate() {
        let path = std::fs::canonicalize(&d.path)
            .with_context(|| format!("resolving the extra disk {}", d.path.display()))?;
        cmd.arg("-drive")
            .arg(format!(
                "if=none,id=extra{i},{},file={}",
                disk_format(&path)?,
                quoted(&path)
            ))
            .args(drive::extra_device_args(
                d.bus,
                &format!("extra{i}"),
                i,
                d.serial.as_deref(),
            )?);
    }
    cmd.args(net::args(&opts.net)?);
    if opts.screen.is_some() {
        cmd.args(["-device", "VGA"]);
    }
    cmd.args(["-monitor", "none"]);
    if uefi {
        cmd.args(["-serial", "stdio"]);
    } else {
        // SeaBIOS says what it boots (and why it cannot) on its debug port
        // only: that port and the serial port share the console.
        cmd.args(["-chardev", "stdio,id=con,mux=on,signal=off"])
            .args(["-serial", "chardev:con"])
            .args(["-device", "isa-debugcon,iobase=0x402,chardev=con"]);
    }
    cmd.arg("-qmp")
        .arg(format!("unix:{},server=on,wait=off", qmp.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .with_context(|| format!("starting {}", m.qemu))?;
    let (tx, rx) = mpsc::channel();
    let stdout = child.stdout.take().context("qemu's console")?;
    let stderr = child.stderr.take().context("qemu's stderr")?;
    let tx2 = tx.clone();
    std::thread::spawn(move || pump(stdout, tx));
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx2.send(format!("qemu: {line}")).is_err() {
                break;
            }
        }
    });
    Ok((
        Guest {
            child,
            _dir: dir,
            qmp,
        },
        rx,
    ))
}

/// Splits the console byte stream into cleaned lines.
fn pump(mut r: impl Read, tx: mpsc::Sender<String>) {
    let mut buf = [0u8; 4096];
    let mut line = Vec::new();
    while let Ok(n) = r.read(&mut buf) {
        if n == 0 {
            break;
        }
        for &b in &buf[..n] {
            if b == b'\n' {
                let l = clean_line(&String::from_utf8_lossy(&line));
                line.clear();
                if tx.send(l).is_err() {
                    return;
                }
            } else {
                line.push(b);
            }
        }
    }
    if !line.is_empty() {
        let _ = tx.send(clean_line(&String::from_utf8_lossy(&line)));
    }
}

struct Console {
    last: VecDeque<String>,
    all: Vec<String>,
    echo: bool,
    log: Option<std::fs::File>,
}

impl Console {
    fn push(&mut self, line: String) {
        if self.echo {
            eprintln!("{line}");
        }
        if let Some(f) = self.log.as_mut() {
            let _ = writeln!(f, "{line}");
        }
        if self.last.len() == LAST_LINES {
            self.last.pop_front();
        }
        self.last.push_back(line.clone());
        self.all.push(line);
    }
    fn tail(&self) -> String {
        self.last.iter().cloned().collect::<Vec<_>>().join("\n")
    }
}

/// What the live system did with `machined.install=`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct InstallOutcome {
    /// It installed and powered off.
    pub installed: bool,
    /// Its line saying so, or why not.
    pub message: String,
}

/// The runtime's line saying what became of a live install (from
/// `machined: `), if `line` is one.
fn install_outcome(line: &str) -> Option<String> {
    let said = runtime_said(line)?;
    let done = said.starts_with(contract::iso::INSTALLED);
    let not_done = said.starts_with("install: ") && said.ends_with(contract::iso::INSTALL_NOT_DONE);
    (done || not_done).then(|| format!("{RUNTIME_PREFIX}{said}"))
}

/// A running machine and its console.
struct Session {
    guest: Guest,
    rx: mpsc::Receiver<String>,
    con: Console,
    deadline: Instant,
    reboots: bool,
    cmdline: Option<String>,
    failed_boots: u32,
    /// A UKI was refused in this boot (with `reboots`): the firmware's
    /// "nothing to boot" that follows is part of that failed boot.
    refused: bool,
}

impl Session {
    /// Starts the machine of `opts` ([`start`]): its deadline is
    /// `opts.timeout` after `started`; the console goes to `log` too.
    fn start(opts: &BootOptions, started: Instant, log: Option<std::fs::File>) -> Result<Session> {
        let (guest, rx) = start(opts)?;
        Ok(Session {
            guest,
            rx,
            con: Console {
                last: VecDeque::new(),
                all: Vec::new(),
                echo: opts.echo,
                log,
            },
            deadline: started + opts.timeout,
            reboots: opts.reboots,
            cmdline: None,
            failed_boots: 0,
            refused: false,
        })
    }

    /// Waits for the first console line for which `want` gives a value;
    /// fails on a line that ends the boot ([`fatal_line`]; with `reboots`,
    /// a runtime failure or panic is counted and waited past), when QEMU
    /// exits, and at the deadline.
    fn wait_line<T>(&mut self, what: &str, mut want: impl FnMut(&str) -> Option<T>) -> Result<T> {
        loop {
            let left = self.deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(line) => {
                    if let Some(c) = runtime_said(&line).and_then(|s| s.strip_prefix("cmdline ")) {
                        self.cmdline = Some(c.to_string());
                    }
                    let fatal = fatal_line(&line);
                    let found = want(&line);
                    self.con.push(line);
                    // A line the caller waits for wins over a fatal one
                    // (a firmware's refusal, when the refusal is the point).
                    if let Some(v) = found {
                        return Ok(v);
                    }
                    if let Some(why) = fatal {
                        if self.reboots && RECOVERABLE.contains(&why) {
                            self.failed_boots += 1;
                            self.refused = why == REFUSED_UKI;
                            continue;
                        }
                        if self.refused && why == "the firmware found nothing to boot" {
                            // OVMF then waits at its boot menu for a key:
                            // reset the machine, as a watchdog or a person
                            // would; the refused entry's tries were counted.
                            self.refused = false;
                            qmp_command(&self.guest.qmp, "system_reset", None)?;
                            continue;
                        }
                        let hint = if RECOVERABLE.contains(&why) && !self.reboots {
                            " (on an upgrade's trial boot, `imager boot --write --reboots` \
                             lets the machine retry and fall back)"
                        } else {
                            ""
                        };
                        let lines = if self.con.echo {
                            "the console is above".to_string()
                        } else {
                            format!("last console lines:\n{}", self.con.tail())
                        };
                        bail!("boot failed: {why}{hint}; {lines}");
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => bail!(
                    "timed out without {what}; last console lines:\n{}",
                    self.con.tail()
                ),
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let status = self.guest.child.wait().context("waiting for qemu")?;
                    // systemd-boot of a Secure Boot image enrols its keys on
                    // a machine in setup mode and resets it.
                    let enrolled = self
                        .con
                        .tail()
                        .contains("Enrolling secure boot keys from directory");
                    let hint = if enrolled && !self.reboots {
                        " (systemd-boot enrolled the image's Secure Boot keys and reset the \
                         machine: boot with --reboots, and with --secure-boot VARS so that \
                         the keys stay in the variable store)"
                    } else {
                        ""
                    };
                    bail!(
                        "qemu exited ({status}) before {what}{hint}; last console lines:\n{}",
                        self.con.tail()
                    );
                }
            }
        }
    }

    /// Waits for QEMU to exit (the guest powered off), keeping the console.
    fn wait_exit(&mut self, what: &str) -> Result<std::process::ExitStatus> {
        loop {
            let left = self.deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(line) => self.con.push(line),
                Err(mpsc::RecvTimeoutError::Timeout) => bail!(
                    "timed out waiting for {what}; last console lines:\n{}",
                    self.con.tail()
                ),
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    return self.guest.child.wait().context("waiting for qemu");
                }
            }
        }
    }
}

/// Boots the image and waits for the ready line (and, with `shutdown`, for a
/// clean power-off after the ACPI power button). A live system asked to
/// install (`machined.install=` on its command line) is followed until it
/// powered off after installing, or said why it did not.
pub fn boot(opts: &BootOptions) -> Result<BootReport> {
    let started = Instant::now();
    if let Some(s) = &opts.serial {
        check_serial(s)?;
    }
    for d in &opts.disks {
        if let Some(s) = &d.serial {
            check_serial(s)?;
        }
    }
    let log = match &opts.console_log {
        Some(p) => {
            Some(std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?)
        }
        None => None,
    };
    let mut session = Session::start(opts, started, log)?;
    let ready = session
        .wait_line("the ready line", parse_ready)
        .with_context(|| format!("booting (timeout {} s)", opts.timeout.as_secs()))?;
    let seconds = started.elapsed().as_secs_f64();
    if let Some(path) = &opts.screen {
        screendump(&session.guest.qmp, path)?;
    }
    // Only a live system installs (a disk's runtime ignores the key).
    let installs = ready.live
        && session
            .cmdline
            .as_deref()
            .is_some_and(|c| contract::cmdline::get(c, contract::cmdline::INSTALL).is_some());
    let install = if installs {
        let message = session.wait_line("the live install's outcome", install_outcome)?;
        let installed = !message.ends_with(contract::iso::INSTALL_NOT_DONE);
        if installed {
            let status = session.wait_exit("the power-off after the install")?;
            if !status.success() {
                bail!("qemu exited ({status}) after the install");
            }
        }
        Some(InstallOutcome { installed, message })
    } else {
        None
    };
    let clean_poweroff = if opts.shutdown && install.as_ref().is_none_or(|i| !i.installed) {
        Some(power_button(
            &mut session.guest,
            &session.rx,
            &mut session.con,
            session.deadline,
        )?)
    } else if opts.stay {
        Some(stay(&mut session)?)
    } else {
        None
    };
    Ok(BootReport {
        ready: true,
        firmware: opts.firmware,
        arch: opts.arch.name(),
        version: ready.version,
        slot: ready.slot,
        live: ready.live,
        seconds,
        uptime: ready.uptime,
        secure_boot: ready.secure_boot,
        root_verified: ready.root_verified,
        cmdline: session.cmdline,
        clean_poweroff,
        failed_boots: session.failed_boots,
        install,
        console: session.con.all,
    })
}

/// Boots and waits for the first console line that contains one of
/// `patterns` (a firmware's or boot loader's refusal, say), not for the
/// ready line; returns that line and stops the machine. Fails if the
/// runtime gets ready first, on a fatal line ([`BootOptions`] as for
/// [`boot`]), when QEMU exits and at the timeout.
pub fn boot_until(opts: &BootOptions, patterns: &[&str]) -> Result<String> {
    let started = Instant::now();
    let mut session = Session::start(opts, started, None)?;
    let what = format!("a line with {patterns:?}");
    let found = session.wait_line(&what, |l| {
        if parse_ready(l).is_some() {
            return Some(Err(l.to_string()));
        }
        patterns
            .iter()
            .any(|p| l.contains(p))
            .then(|| Ok(l.to_string()))
    })?;
    found.map_err(|ready| {
        anyhow::anyhow!(
            "the machine got ready ({ready}) without {what}; last console lines:\n{}",
            session.con.tail()
        )
    })
}

/// Follows a machine after ready until it powers off by itself: whether it
/// announced the power-off and QEMU exited cleanly.
fn stay(session: &mut Session) -> Result<bool> {
    session.wait_line("the machine's power-off", |l| {
        runtime_said(l)
            .is_some_and(|s| s.starts_with("powering off"))
            .then_some(())
    })?;
    let status = session.wait_exit("QEMU's exit after the power-off")?;
    Ok(status.success())
}

/// Presses the ACPI power button through QMP and waits for QEMU to exit
/// after the runtime announced the power-off.
fn power_button(
    guest: &mut Guest,
    rx: &mpsc::Receiver<String>,
    con: &mut Console,
    deadline: Instant,
) -> Result<bool> {
    qmp_command(&guest.qmp, "system_powerdown", None)?;
    let mut announced = false;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                announced |= runtime_said(&line).is_some_and(|s| s.starts_with("powering off"));
                con.push(line);
            }
            Err(mpsc::RecvTimeoutError::Timeout) => bail!(
                "the machine did not power off after the power button; last console lines:\n{}",
                con.tail()
            ),
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                let status = guest.child.wait().context("waiting for qemu")?;
                return Ok(announced && status.success());
            }
        }
    }
}

/// Writes what the screen shows to `path` (PPM), through QMP's
/// `screendump`: to a temporary name beside it, renamed once QEMU wrote it
/// whole.
fn screendump(qmp: &Path, path: &Path) -> Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let dir = std::fs::canonicalize(dir)
        .with_context(|| format!("the directory of --screen {}", path.display()))?;
    let name = path
        .file_name()
        .with_context(|| format!("--screen {} names no file", path.display()))?
        .to_string_lossy()
        .into_owned();
    let tmp = dir.join(format!(".{name}.partial"));
    let args = serde_json::json!({ "filename": tmp.to_string_lossy() });
    qmp_command(qmp, "screendump", Some(args)).context("taking the screen's picture")?;
    std::fs::rename(&tmp, dir.join(&name))
        .with_context(|| format!("moving the screen's picture to {}", path.display()))
}

/// Sends one QMP command with its `arguments` (after the capabilities
/// handshake) and waits for its answer; events on the way are passed over.
fn qmp_command(socket: &Path, command: &str, arguments: Option<serde_json::Value>) -> Result<()> {
    use std::os::unix::net::UnixStream;
    let stream = UnixStream::connect(socket)
        .with_context(|| format!("connecting to QMP at {}", socket.display()))?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    // QEMU's own answers, bounded all the same.
    let mut reader = BufReader::new(stream.try_clone()?).take(1 << 20);
    let mut w = stream;
    let mut line = String::new();
    reader
        .read_line(&mut line)
        .context("reading the QMP greeting")?;
    let handshake = serde_json::json!({ "execute": "qmp_capabilities" });
    let mut asked = serde_json::json!({ "execute": command });
    if let Some(a) = arguments {
        asked["arguments"] = a;
    }
    for (cmd, message) in [("qmp_capabilities", handshake), (command, asked)] {
        writeln!(w, "{message}").context("writing to QMP")?;
        loop {
            line.clear();
            if reader.read_line(&mut line).context("reading from QMP")? == 0 {
                bail!("QMP closed before answering {cmd}");
            }
            let v: serde_json::Value = serde_json::from_str(&line)
                .with_context(|| format!("QMP answered {cmd} with no JSON: {}", line.trim()))?;
            if v.get("return").is_some() {
                break;
            }
            if v.get("error").is_some() {
                bail!("QMP refused {cmd}: {}", line.trim());
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_line_parsing() {
        let r = parse_ready("[  2.1] machined: ready version=1.0.0 slot=A uptime=2.31").unwrap();
        assert_eq!(
            r,
            Ready {
                version: "1.0.0".into(),
                slot: Some("A".into()),
                live: false,
                uptime: 2.31,
                secure_boot: None,
                root_verified: None,
            }
        );
        let r = parse_ready(
            "machined: ready version=0.2.0 live uptime=3.5 secureboot=unknown root=verified",
        )
        .unwrap();
        assert_eq!(
            r,
            Ready {
                version: "0.2.0".into(),
                slot: None,
                live: true,
                uptime: 3.5,
                secure_boot: Some("unknown".into()),
                root_verified: Some(true),
            }
        );
        // The runtime's own words read back.
        for (sb, root) in [
            (
                contract::ready::SecureBoot::On,
                contract::ready::Root::Unverified,
            ),
            (
                contract::ready::SecureBoot::Off,
                contract::ready::Root::Verified,
            ),
        ] {
            let line = format!(
                "machined: ready version=1 slot=B uptime=1.0 {}",
                contract::ready::words(sb, root)
            );
            let r = parse_ready(&line).unwrap();
            assert_eq!(r.secure_boot.as_deref(), Some(sb.as_str()));
            assert_eq!(
                r.root_verified,
                Some(root == contract::ready::Root::Verified)
            );
        }
        let r = parse_ready("machined: ready version=1 slot=A uptime=1 secureboot=maybe root=")
            .unwrap();
        assert_eq!((r.secure_boot, r.root_verified), (None, None));
        assert!(parse_ready("machined: ready version=1.0.0 uptime=1").is_none());
        assert!(parse_ready("machined: ready version=1 slot=A live uptime=1").is_none());
        assert!(parse_ready("machined: ready version=1.0.0 slot=A").is_none());
        assert!(parse_ready("machined: readying").is_none());
    }

    #[test]
    fn install_outcomes() {
        let done = "[ 9.1] machined: installed 0.1.0 on /dev/vda (slot A); powering off";
        assert_eq!(
            install_outcome(done).as_deref(),
            Some("machined: installed 0.1.0 on /dev/vda (slot A); powering off")
        );
        let refused = "machined: install: refusing /dev/vda: it is the boot medium; the live \
                       system stays up";
        assert!(install_outcome(refused).is_some());
        assert!(install_outcome("machined: install: looking for serial:T").is_none());
        assert!(install_outcome("machined: installer: installed").is_none());
    }

    #[test]
    fn console_cleaning_and_fatal_lines() {
        assert_eq!(clean_line("\x1b[0m\x1b[2JBdsDxe: x\r"), "BdsDxe: x");
        assert!(fatal_line("[ 1.0] Kernel panic - not syncing: x").is_some());
        assert!(fatal_line("machined: fatal: no META").is_some());
        assert!(fatal_line("No loader found. Configuration files in").is_some());
        assert!(fatal_line("Boot failed: not a bootable disk").is_some());
        assert!(fatal_line("Press any key to continue...").is_some());
        assert!(fatal_line("machined: ready version=1 slot=A uptime=1").is_none());
    }

    /// What the runtime quotes (escaped, on its own line) is never read as
    /// another line: not as ready, fatal, an install's outcome or the
    /// firmware's.
    #[test]
    fn a_quoted_line_is_not_read_as_the_line_it_quotes() {
        for forged in [
            "machined: ready version=9.9.9 slot=A uptime=1",
            "machined: fatal: x",
            "No bootable device",
            "Kernel panic - not syncing",
            "machined: installed 9.9.9 on /dev/vda (slot A); powering off",
            "machined: powering off",
        ] {
            let line = format!(
                "machined: api: 10.0.2.2:1 (operator): unknown op {}",
                contract::text::escape(&format!("x\n{forged}"))
            );
            assert!(parse_ready(&line).is_none(), "{line}");
            assert!(fatal_line(&line).is_none(), "{line}");
            assert!(install_outcome(&line).is_none(), "{line}");
        }
    }
}
