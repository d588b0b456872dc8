//! Stage 2: PID 1 in the root filesystem. Finds the booted slot and META,
//! sets up the network ([`crate::net`]), reports ready, serves the node API
//! ([`crate::api`]), then supervises until power-off. A live boot
//! (`machined.live=`) uses no disk: it reports ready, installs onto the disk
//! `machined.install=` names (if any; see [`crate::live`]) and powers off,
//! or supervises.

use crate::console::{self, say};
use crate::partitions::{self, Partition};
use crate::{
    api, bootdisk, failure, live, net, osrelease, power, secureboot, slots, storage, verity,
};
use anyhow::{Context, Result};
use contract::cmdline;
use contract::meta::{Meta, SlotRecord, Tag};
use contract::paths::ROOTFS_OS_RELEASE;
use std::convert::Infallible;
use std::path::Path;
use std::time::Duration;

/// How long to wait for the META partition to show up.
const DEVICE_TIMEOUT: Duration = Duration::from_secs(10);
const DEVICE_POLL: Duration = Duration::from_millis(20);

pub fn run() -> Result<Infallible> {
    // Stage 1 left the console on fds 0-2; reopen in case we were started
    // some other way. Failing that, the inherited fds are all we have.
    let _ = console::reopen("/dev/console");
    console::say_mirrors("stage2", &console::mirror());
    power::take_signals()?;
    let cmdline = std::fs::read_to_string("/proc/cmdline").context("read /proc/cmdline")?;
    failure::configure(&cmdline);
    failure::arm_ready_timeout(&cmdline, uptime()?.parse().unwrap_or(0.0));
    failure::breakpoint(&cmdline, "stage2")?;

    if cmdline::get(&cmdline, cmdline::LIVE).is_some() {
        return run_live(&cmdline);
    }
    if cmdline::get(&cmdline, cmdline::INSTALL).is_some() {
        say(format!(
            "stage2: warning: {} is only for a live system ({}=<ID>); ignored",
            cmdline::INSTALL,
            cmdline::LIVE
        ));
    }
    let slot = cmdline::slot(&cmdline)
        .with_context(|| format!("no valid {}=A|B on the kernel command line", cmdline::SLOT))?;
    let said = bootdisk::who_said(&cmdline).context("finding the disk this machine booted from")?;
    let (meta_part, all, why) = bootdisk::wait_for_meta(
        Path::new("/sys"),
        Path::new("/dev"),
        said,
        DEVICE_TIMEOUT,
        DEVICE_POLL,
    )?;
    report_layout(&meta_part, &all, &why);
    let dev = meta_part.dev_path(Path::new("/dev"));
    let (meta, copy) = read_meta(&dev)?;
    say(format!(
        "stage2: slot {slot}; META {} copy {copy}: {}",
        dev.display(),
        summary(&meta, slot)
    ));

    let version = version()?;

    let mut disk = slots::Disk::open(&meta_part, &all)?;
    let by_grub = cmdline::trial(&cmdline).is_some();
    let trial = disk.assess(slot, &version, by_grub)?;

    let wipe = meta.get(Tag::WipeEphemeral).is_some();
    storage::setup(&meta_part, slot, &version, wipe)?;
    if wipe {
        disk.set_wipe_ephemeral(None)
            .context("removing META's wipe-ephemeral after the wipe")?;
    }
    net::setup(&cmdline, &meta)?;
    failure::breakpoint(&cmdline, "ready")?;
    if trial {
        disk.bless(slot, &version)?;
    }
    secureboot::apply_updates(&disk, &version);
    failure::ready();
    let supervisor = power::prepare()?;
    // After the supervisor exists: a reboot asked over the API is a signal
    // it reads. A node whose API cannot start still runs (and says why).
    let node = api::Node {
        name: meta.get(Tag::ImageName).unwrap_or_default().to_string(),
        version: version.clone(),
        slot,
        disk,
        plain_http: cmdline::plain_http(&cmdline),
    };
    if let Err(e) = api::start(&meta, node) {
        say(format!("api: not started: {e:#}"));
    }
    say(format!("cmdline {}", cmdline.trim()));
    say(format!(
        "ready version={version} slot={slot} uptime={} {}",
        uptime()?,
        chain(&cmdline)
    ));
    power::supervise(supervisor)
}

/// The ready line's words on the boot chain: Secure Boot and the root's
/// verification (`secureboot=off root=verified`, see [`contract::ready`]).
fn chain(cmdline: &str) -> String {
    contract::ready::words(secureboot::state(), verity::root_state(cmdline))
}

/// The running version: os-release's VERSION_ID.
fn version() -> Result<String> {
    let os_release = std::fs::read_to_string(ROOTFS_OS_RELEASE)
        .with_context(|| format!("read {ROOTFS_OS_RELEASE}"))?;
    osrelease::get(&os_release, "VERSION_ID")
        .filter(|v| !v.is_empty())
        .with_context(|| format!("{ROOTFS_OS_RELEASE} has no VERSION_ID"))
}

/// The live system: no META, STATE or EPHEMERAL, no slot to assess or
/// bless; ready, then the install asked for (if any), then supervision.
/// An install that is refused or fails says why and leaves the system up.
fn run_live(cmdline: &str) -> Result<Infallible> {
    let id = match cmdline::live(cmdline) {
        Ok(id) => id,
        Err(e) => {
            say(format!(
                "stage2: warning: {e}; the boot medium cannot be recognised, so no install \
                 will be done"
            ));
            None
        }
    };
    if cmdline::slot(cmdline).is_some() {
        say(format!(
            "stage2: warning: both {} and {} given: this is a live boot; the slot is ignored",
            cmdline::LIVE,
            cmdline::SLOT
        ));
    }
    say(format!(
        "stage2: live system{}: no disk is used",
        id.as_deref()
            .map(|i| format!(" (ID {i})"))
            .unwrap_or_default()
    ));
    let version = version()?;
    net::setup(cmdline, &Meta::default())?;
    failure::breakpoint(cmdline, "ready")?;
    failure::ready();
    let supervisor = power::prepare()?;
    say(format!("cmdline {}", cmdline.trim()));
    say(format!(
        "ready version={version} live uptime={} {}",
        uptime()?,
        chain(cmdline)
    ));
    match cmdline::install(cmdline) {
        Ok(None) => {}
        Ok(Some((target, wipe))) => match cmdline::install_settings(cmdline)
            .map_err(anyhow::Error::msg)
            .and_then(|s| install(id.as_deref(), &target, wipe, s.as_ref()))
        {
            Ok((installed, dev)) => {
                say(format!(
                    "{}{installed} on {} (slot A); powering off",
                    contract::iso::INSTALLED,
                    dev.display()
                ));
                crate::sys::sync();
                power::shutdown(power::Action::PowerOff)
            }
            Err(e) => say(format!("install: {e:#}{}", contract::iso::INSTALL_NOT_DONE)),
        },
        Err(e) => say(format!("install: {e}{}", contract::iso::INSTALL_NOT_DONE)),
    }
    power::supervise(supervisor)
}

/// How long an install waits for its target disk to appear.
const INSTALL_DISK_TIMEOUT: Duration = Duration::from_secs(30);
const INSTALL_DISK_POLL: Duration = Duration::from_millis(100);

/// Finds and checks the target, then runs the installer on it, its output
/// streamed to the console. Returns the version installed and the device.
fn install(
    id: Option<&str>,
    target: &cmdline::InstallTarget,
    wipe: bool,
    settings: Option<&contract::settings::Settings>,
) -> Result<(String, std::path::PathBuf)> {
    use contract::paths::{LIVE_INSTALLER, LIVE_PAYLOAD_DIR, LIVE_TRUSTED_KEY, live_run_path};
    let Some(id) = id else {
        anyhow::bail!(
            "refusing to install: {} has no valid ID, so the boot medium cannot be told \
             from the target",
            cmdline::LIVE
        );
    };
    let installer = live_run_path(LIVE_INSTALLER);
    for p in [
        installer.clone(),
        live_run_path(LIVE_PAYLOAD_DIR),
        live_run_path(LIVE_TRUSTED_KEY),
    ] {
        if !Path::new(&p).exists() {
            anyhow::bail!(
                "this live system has no {p}: it cannot install (was the ISO built with its installer?)"
            );
        }
    }
    say(format!("install: looking for {target}"));
    let (info, node) = live::wait_for_disk(
        Path::new("/sys"),
        Path::new("/dev"),
        target,
        INSTALL_DISK_TIMEOUT,
        INSTALL_DISK_POLL,
    )?;
    let shown = format!("{} ({})", node.display(), info.ids());
    live::check_target(&node, &shown, id, wipe)?;
    say(format!("install: installing onto {shown} with {installer}"));
    let mut child = std::process::Command::new(&installer)
        .args(live::installer_args(&node, wipe, settings))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .with_context(|| format!("start {installer}"))?;
    let stderr = child.stderr.take();
    // Whether the installer said it wrote nothing (its refusals do), and
    // its error message.
    let errors = std::thread::spawn(move || {
        use std::io::BufRead;
        let (mut untouched, mut error) = (false, None);
        if let Some(e) = stderr {
            for line in std::io::BufReader::new(e).lines().map_while(Result::ok) {
                untouched |= line.contains("nothing was written");
                if let Some(m) = line.strip_prefix("imager: error: ") {
                    error = Some(m.chars().take(1024).collect::<String>());
                }
                say(format!("installer: {line}"));
            }
        }
        (untouched, error)
    });
    let mut report = String::new();
    if let Some(out) = child.stdout.take() {
        use std::io::BufRead;
        for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            say(format!("installer: {line}"));
            if report.len() < 1 << 16 {
                report.push_str(&line);
                report.push('\n');
            }
        }
    }
    let status = child.wait().context("wait for the installer")?;
    let (untouched, error) = errors.join().unwrap_or((false, None));
    if !status.success() {
        let disk = if untouched {
            "the disk was not changed".to_string()
        } else {
            format!(
                "the disk may be partly written (another try needs {}=1)",
                cmdline::INSTALL_WIPE
            )
        };
        let said = error.map_or("its messages are above".to_string(), |e| {
            format!("it said: {e}")
        });
        anyhow::bail!("the installer failed on {shown} ({status}; {said}); {disk}");
    }
    let version = live::report_version(&report).unwrap_or_else(|| "(unknown version)".into());
    Ok((version, node))
}

/// One line naming the boot disk, why it is the one, and the partitions
/// found on it; one for each other disk that also carries META (never
/// read for slots, never written).
fn report_layout(meta: &Partition, all: &[Partition], why: &str) {
    let on_disk = partitions::on_disk_of(all, meta);
    let found: Vec<String> = contract::LAYOUT
        .iter()
        .map(
            |spec| match on_disk.iter().find(|p| p.label == spec.label) {
                Some(p) => format!("{}={}", spec.label, p.name),
                None => format!("{}=missing", spec.label),
            },
        )
        .collect();
    let disk = meta.disk.as_deref().unwrap_or("?");
    say(format!("stage2: boot disk {disk}: {why}"));
    say(format!("stage2: disk {disk}: {}", found.join(" ")));
    for o in all
        .iter()
        .filter(|p| p.label == meta.label && p.disk != meta.disk)
    {
        say(format!(
            "stage2: disk {} also carries {} ({}): it is not the disk this machine booted \
             from, and is never written",
            o.disk.as_deref().unwrap_or("?"),
            meta.label,
            o.name
        ));
    }
}

fn read_meta(dev: &Path) -> Result<(Meta, usize)> {
    let mut f = std::fs::File::open(dev).with_context(|| format!("open META {}", dev.display()))?;
    bootstate::meta::read(&mut f).with_context(|| dev.display().to_string())
}

/// `default-slot=A slot-a=good/1.0` style summary of what matters at boot.
fn summary(meta: &Meta, booted: contract::Slot) -> String {
    let default = meta.get(Tag::DefaultSlot).unwrap_or("unset");
    let state = match meta.get(Tag::for_slot(booted)).map(SlotRecord::parse) {
        Some(Ok(r)) => format!("{} version={}", r.status.name(), r.version),
        Some(Err(e)) => format!("unreadable ({e})"),
        None => "no record".into(),
    };
    format!("default-slot={default}, slot {booted}: {state}")
}

/// Seconds since boot, as the kernel prints them in /proc/uptime (`2.31`).
pub(crate) fn uptime() -> Result<String> {
    let text = std::fs::read_to_string("/proc/uptime").context("read /proc/uptime")?;
    parse_uptime(&text).with_context(|| format!("unexpected /proc/uptime {text:?}"))
}

fn parse_uptime(text: &str) -> Option<String> {
    let first = text.split_whitespace().next()?;
    first.parse::<f64>().ok()?;
    Some(first.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uptime_and_summary() {
        assert_eq!(parse_uptime("2.31 3.90\n").as_deref(), Some("2.31"));
        assert_eq!(parse_uptime(""), None);
        assert_eq!(parse_uptime("x y"), None);
        let mut m = Meta::default();
        m.set(Tag::DefaultSlot, "A");
        m.set(Tag::SlotA, "status=good version=1.0");
        assert_eq!(
            summary(&m, contract::Slot::A),
            "default-slot=A, slot A: good version=1.0"
        );
        assert_eq!(
            summary(&m, contract::Slot::B),
            "default-slot=A, slot B: no record"
        );
    }
}
