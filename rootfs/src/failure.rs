//! What PID 1 does when it cannot go on: print `machined: fatal: <reason>`,
//! sync, and reboot, halt or power off as `machined.on_failure=` says.
//!
//! PID 1 must never exit (the kernel would panic) and never hang silently.
//!
//! A low layer: it uses only [`crate::console`] and [`crate::sys`] (reboot(2)
//! included), so that every other module, [`crate::power`]'s clean shutdown
//! among them, may fail through [`fatal`] without a cycle.

use crate::console::say;
use crate::sys;
use anyhow::{Result, bail};
use contract::cmdline::{self, OnFailure};
use std::sync::atomic::{AtomicU8, Ordering};

/// The policy, set once the command line is known; reboot until then.
static POLICY: AtomicU8 = AtomicU8::new(0);

fn encode(p: OnFailure) -> u8 {
    match p {
        OnFailure::Reboot => 0,
        OnFailure::Halt => 1,
        OnFailure::Poweroff => 2,
    }
}

fn decode(v: u8) -> OnFailure {
    match v {
        1 => OnFailure::Halt,
        2 => OnFailure::Poweroff,
        _ => OnFailure::Reboot,
    }
}

/// The failure policy a command line asks for, and a warning when its value
/// is not understood (the default, reboot, is used then).
pub fn policy_of(cmdline: &str) -> (OnFailure, Option<String>) {
    match cmdline::get(cmdline, cmdline::ON_FAILURE) {
        None => (OnFailure::Reboot, None),
        Some(v) => match OnFailure::parse(&v) {
            Some(p) => (p, None),
            None => (
                OnFailure::Reboot,
                Some(format!(
                    "unknown {}={v:?} (reboot|halt|poweroff), using reboot",
                    cmdline::ON_FAILURE
                )),
            ),
        },
    }
}

/// Sets the policy from the kernel command line.
pub fn configure(cmdline: &str) {
    let (p, warning) = policy_of(cmdline);
    if let Some(w) = warning {
        say(w);
    }
    POLICY.store(encode(p), Ordering::SeqCst);
}

pub fn policy() -> OnFailure {
    decode(POLICY.load(Ordering::SeqCst))
}

/// Prints the fatal error and applies the policy. Never returns. The reason
/// is printed with `{:#}`: an [`anyhow::Error`] shows its whole context chain
/// on the one line (plain strings are unaffected).
pub fn fatal(reason: impl std::fmt::Display) -> ! {
    say(format!("fatal: {reason:#}"));
    act(policy())
}

fn act(p: OnFailure) -> ! {
    if sys::pid() != 1 {
        // Only when run by hand: a normal process may simply exit.
        std::process::exit(1);
    }
    let (cmd, what) = match p {
        OnFailure::Reboot => (libc::RB_AUTOBOOT, "rebooting"),
        OnFailure::Halt => (libc::RB_HALT_SYSTEM, "halting"),
        OnFailure::Poweroff => (libc::RB_POWER_OFF, "powering off"),
    };
    say(format!("{what} (on_failure={})", name(p)));
    sys::sync();
    let err = sys::reboot(cmd);
    say(format!("fatal: reboot(2) failed: {err}; stopping here"));
    sys::pause_forever()
}

fn name(p: OnFailure) -> &'static str {
    match p {
        OnFailure::Reboot => "reboot",
        OnFailure::Halt => "halt",
        OnFailure::Poweroff => "poweroff",
    }
}

/// A panic prints `machined: fatal: panic: ...` and applies the policy, before
/// the runtime would abort (release builds use panic=abort).
pub fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        let payload = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "(no message)".into());
        let at = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        fatal(format!("panic: {payload}{at}"))
    }));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_left_never_panics() {
        use std::time::Duration;
        assert_eq!(time_left(90, 30.5), Duration::from_secs_f64(59.5));
        assert_eq!(time_left(10, 30.0), Duration::ZERO);
        assert_eq!(time_left(u64::MAX, 1.0), Duration::MAX);
        assert_eq!(time_left(5, f64::NAN), Duration::ZERO);
        assert_eq!(time_left(5, f64::NEG_INFINITY), Duration::MAX);
    }

    #[test]
    fn policy_from_cmdline() {
        assert_eq!(policy_of("console=ttyS0").0, OnFailure::Reboot);
        assert_eq!(
            policy_of("machined.on_failure=poweroff"),
            (OnFailure::Poweroff, None)
        );
        assert_eq!(policy_of("machined.on_failure=halt").0, OnFailure::Halt);
        let (p, w) = policy_of("machined.on_failure=explode");
        assert_eq!(p, OnFailure::Reboot);
        assert!(w.is_some_and(|w| w.contains("explode")));
        for p in [OnFailure::Reboot, OnFailure::Halt, OnFailure::Poweroff] {
            assert_eq!(decode(encode(p)), p);
        }
    }
}

/// Set once the runtime is ready: the watchdog stands down.
static READY: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Arms the ready timeout (`machined.ready_timeout=`, seconds since boot):
/// if the runtime has not called [`ready`] by then, a watchdog thread fails
/// it, so that a boot that hangs is a failed boot (and systemd-boot's boot
/// counting can fall back). Returns the timeout armed, if any.
pub fn arm_ready_timeout(cmdline: &str, uptime_s: f64) -> Option<u64> {
    let secs = match cmdline::get(cmdline, cmdline::READY_TIMEOUT) {
        None => cmdline::DEFAULT_READY_TIMEOUT_S,
        Some(v) => match v.parse::<u64>() {
            Ok(n) => n,
            Err(_) => {
                say(format!(
                    "warning: {}={v:?} is not a number of seconds, using {}",
                    cmdline::READY_TIMEOUT,
                    cmdline::DEFAULT_READY_TIMEOUT_S
                ));
                cmdline::DEFAULT_READY_TIMEOUT_S
            }
        },
    };
    if secs == 0 {
        return None;
    }
    let left = time_left(secs, uptime_s);
    std::thread::spawn(move || {
        std::thread::sleep(left);
        if !READY.load(Ordering::SeqCst) {
            fatal(format!(
                "not ready {secs} s after boot ({}={secs})",
                cmdline::READY_TIMEOUT
            ));
        }
    });
    Some(secs)
}

/// What is left of `secs` after `uptime_s`: none if it has passed, the
/// longest wait for a timeout too large to count (the command line may
/// say `machined.ready_timeout=18446744073709551615`: no panic).
fn time_left(secs: u64, uptime_s: f64) -> std::time::Duration {
    std::time::Duration::try_from_secs_f64((secs as f64 - uptime_s).max(0.0))
        .unwrap_or(std::time::Duration::MAX)
}

/// The runtime is ready: the ready timeout no longer applies.
pub fn ready() {
    READY.store(true, Ordering::SeqCst);
}

/// The points where `machined.break=<stage>` stops the runtime, in boot order.
pub const BREAK_POINTS: [&str; 4] = ["stage1", "switch-root", "stage2", "ready"];

/// Fails at `point` when the command line asks for it. An unknown break
/// point fails at the first point: a typo must not give a working boot when a
/// broken one was asked for.
pub fn breakpoint(cmdline: &str, point: &str) -> Result<()> {
    let Some(asked) = cmdline::get(cmdline, cmdline::BREAK) else {
        return Ok(());
    };
    // `hang` hangs where `ready` would fail: it tests the ready timeout.
    if asked == "hang" {
        if point == "ready" {
            say(format!(
                "{}=hang: hanging before ready as asked",
                cmdline::BREAK
            ));
            sys::pause_forever();
        }
        return Ok(());
    }
    // `panic` panics where `ready` would fail: it tests the panic hook.
    if asked == "panic" {
        if point == "ready" {
            panic!("{}=panic: panicking before ready as asked", cmdline::BREAK);
        }
        return Ok(());
    }
    let known = BREAK_POINTS.contains(&asked.as_str());
    if asked == point || (!known && point == BREAK_POINTS[0]) {
        let why = if known {
            format!("stopping at {point} as asked")
        } else {
            format!("unknown break point (known: {})", BREAK_POINTS.join(", "))
        };
        bail!("{}={asked}: {why}", cmdline::BREAK);
    }
    Ok(())
}

#[cfg(test)]
mod break_tests {
    use super::*;

    #[test]
    fn breaks_where_asked() {
        let c = "console=ttyS0 machined.break=ready";
        assert!(breakpoint(c, "stage1").is_ok());
        assert!(breakpoint(c, "stage2").is_ok());
        let e = format!("{:#}", breakpoint(c, "ready").unwrap_err());
        assert_eq!(e, "machined.break=ready: stopping at ready as asked");
        assert!(breakpoint("quiet", "ready").is_ok());
        assert!(breakpoint("machined.break=typo", "stage1").is_err());
        assert!(breakpoint("machined.break=typo", "ready").is_ok());
        assert!(breakpoint("machined.break=panic", "stage1").is_ok());
        let p = std::panic::catch_unwind(|| breakpoint("machined.break=panic", "ready"));
        assert!(p.is_err());
    }
}
