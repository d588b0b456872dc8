//! PID 1 after ready: reap children, and power off or reboot cleanly on
//! SIGTERM, the ACPI power button (KEY_POWER on an input device) or
//! ctrl-alt-del (SIGINT, once the kernel is told not to reboot by itself).
//!
//! Above [`crate::failure`]: when reboot(2) itself fails at the end of a
//! clean shutdown, the failure policy takes over; failure does not use
//! this module (both call [`sys::reboot`]).

use crate::console::say;
use crate::input::Devices;
use crate::sys::{self, check};
use crate::{failure, mount};
use anyhow::{Context, Result};
use std::convert::Infallible;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::time::{Duration, Instant};

const INPUT_DIR: &str = "/dev/input";
/// How long processes get between SIGTERM and SIGKILL at shutdown.
const TERM_GRACE: Duration = Duration::from_secs(2);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    PowerOff,
    Reboot,
}

fn handled_signals() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data; sigemptyset initialises it.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: set is a valid sigset_t.
    unsafe {
        libc::sigemptyset(&mut set);
        for s in [libc::SIGCHLD, libc::SIGTERM, libc::SIGINT] {
            libc::sigaddset(&mut set, s);
        }
    }
    set
}

/// Blocks the signals PID 1 handles, so that they wait for the signalfd
/// (PID 1 ignores signals it has no handler for: unblocked, they are lost),
/// and asks the kernel to send SIGINT on ctrl-alt-del instead of rebooting.
pub fn take_signals() -> Result<()> {
    let set = handled_signals();
    // SAFETY: set is valid; the old mask is not wanted.
    check(
        unsafe { libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) },
        || "sigprocmask",
    )?;
    // Not fatal: the system is usable without it (and in a container's PID
    // namespace the kernel refuses it).
    // SAFETY: reboot with CAD_OFF only changes the ctrl-alt-del behaviour.
    if unsafe { libc::reboot(libc::RB_DISABLE_CAD) } < 0 {
        let e = std::io::Error::last_os_error();
        say(format!(
            "warning: reboot(RB_DISABLE_CAD): {e}; ctrl-alt-del reboots at once"
        ));
    }
    Ok(())
}

/// Collects every exited child without blocking.
fn reap() {
    loop {
        let mut status = 0;
        // SAFETY: status is a valid out pointer.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        if pid <= 0 {
            return;
        }
    }
}

/// Watches for new input devices (hot-plugged keyboards) with inotify; None
/// when /dev/input cannot be watched, in which case the devices present now
/// are all there is.
fn watch_input_dir() -> Option<OwnedFd> {
    // SAFETY: plain syscall.
    let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
    if fd < 0 {
        return None;
    }
    // SAFETY: fd was just opened.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let dir = sys::cstr(INPUT_DIR).ok()?;
    // SAFETY: valid fd and C string.
    let wd = unsafe { libc::inotify_add_watch(fd.as_raw_fd(), dir.as_ptr(), libc::IN_CREATE) };
    (wd >= 0).then_some(fd)
}

fn drain(fd: &OwnedFd) {
    let mut buf = [0u8; 4096];
    // SAFETY: buf is valid for its length; the fd is non-blocking.
    while unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) } > 0 {}
}

/// Reads pending signals; the first one asking to stop decides the action.
fn read_signals(fd: &OwnedFd) -> Option<Action> {
    let mut action = None;
    loop {
        // SAFETY: signalfd_siginfo is plain data.
        let mut info: libc::signalfd_siginfo = unsafe { std::mem::zeroed() };
        let len = std::mem::size_of::<libc::signalfd_siginfo>();
        // SAFETY: info is valid for len bytes; the fd is non-blocking.
        let n = unsafe {
            libc::read(
                fd.as_raw_fd(),
                (&mut info as *mut libc::signalfd_siginfo).cast(),
                len,
            )
        };
        if n != len as isize {
            return action;
        }
        let signo = info.ssi_signo as libc::c_int;
        if signo == libc::SIGCHLD {
            reap();
        } else if signo == libc::SIGTERM {
            action = action.or(Some(Action::PowerOff));
        } else if signo == libc::SIGINT {
            action = action.or(Some(Action::Reboot));
        }
    }
}

/// PID 1's watch: the signalfd and the open input devices. Made before the
/// ready line, so that a power-button press right after ready is not lost.
pub struct Supervisor {
    sfd: OwnedFd,
    watch: Option<OwnedFd>,
    devices: Devices,
}

/// Blocks the handled signals into a signalfd and opens the input devices.
pub fn prepare() -> Result<Supervisor> {
    let set = handled_signals();
    // SAFETY: set is valid.
    let sfd = check(
        unsafe { libc::signalfd(-1, &set, libc::SFD_NONBLOCK | libc::SFD_CLOEXEC) },
        || "signalfd",
    )?;
    // SAFETY: sfd was just opened.
    let sfd = unsafe { OwnedFd::from_raw_fd(sfd) };
    let watch = watch_input_dir();
    let mut devices = Devices::default();
    devices.rescan(Path::new(INPUT_DIR));
    if devices.is_empty() {
        say("warning: no input device in /dev/input; only signals can stop the system");
    }
    // Children that exited before the signalfd existed.
    reap();
    Ok(Supervisor {
        sfd,
        watch,
        devices,
    })
}

/// Runs PID 1's loop until asked to stop, then shuts down. Never returns
/// Ok.
pub fn supervise(sup: Supervisor) -> Result<Infallible> {
    let Supervisor {
        sfd,
        watch,
        mut devices,
    } = sup;
    loop {
        let mut fds = vec![libc::pollfd {
            fd: sfd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        if let Some(w) = &watch {
            fds.push(libc::pollfd {
                fd: w.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            });
        }
        let first_device = fds.len();
        fds.extend(devices.fds().into_iter().map(|fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        }));
        // SAFETY: fds is a valid array of pollfd for its length.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return Err(e).context("poll");
        }
        if fds[0].revents != 0
            && let Some(action) = read_signals(&sfd)
        {
            shutdown(action);
        }
        if let Some(w) = &watch
            && fds[1].revents != 0
        {
            drain(w);
            devices.rescan(Path::new(INPUT_DIR));
        }
        let ready: Vec<_> = fds[first_device..]
            .iter()
            .filter(|p| p.revents != 0)
            .map(|p| p.fd)
            .collect();
        for fd in ready {
            if devices.power_pressed(fd) {
                shutdown(Action::PowerOff);
            }
        }
    }
}

/// Asks every process to stop, then kills what is left. PID 1 is the parent
/// of every orphan, so waitpid sees all of them.
fn terminate_processes() {
    // SAFETY: kill(-1) signals every process but PID 1 and kernel threads.
    if unsafe { libc::kill(-1, libc::SIGTERM) } < 0 {
        return; // ESRCH: nobody to stop.
    }
    if all_children_gone_within(TERM_GRACE) {
        return;
    }
    // SAFETY: as above.
    unsafe { libc::kill(-1, libc::SIGKILL) };
    // Killed processes still hold their files until they are gone: wait for
    // them (a while), so that the filesystems can be unmounted cleanly.
    if !all_children_gone_within(TERM_GRACE) {
        reap();
    }
}

/// Reaps children until none is left (true) or `grace` has passed.
fn all_children_gone_within(grace: Duration) -> bool {
    let start = Instant::now();
    while start.elapsed() < grace {
        // SAFETY: plain syscall with a NULL status.
        let pid = unsafe { libc::waitpid(-1, std::ptr::null_mut(), libc::WNOHANG) };
        if pid < 0 {
            return true; // ECHILD: everyone is gone.
        }
        if pid == 0 {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    false
}

/// Whether a mount point is an API filesystem left mounted to the end (the
/// console lives in /dev, mountinfo in /proc).
fn keep_mounted(mount_point: &str) -> bool {
    mount_point == "/"
        || ["/dev", "/proc", "/sys"]
            .iter()
            .any(|k| mount_point == *k || mount_point.starts_with(&format!("{k}/")))
}

/// Unmounts everything that can be, innermost first, in passes until no more
/// can be; what is left and backed by a device is remounted read-only.
fn unmount_all() {
    let mut failures = Vec::new();
    for _pass in 0..4 {
        let Ok(text) = std::fs::read_to_string("/proc/self/mountinfo") else {
            say("cannot read /proc/self/mountinfo; filesystems stay mounted");
            return;
        };
        failures.clear();
        let mut progress = false;
        for m in mount::parse_mountinfo(&text).into_iter().rev() {
            if keep_mounted(&m.mount_point) {
                continue;
            }
            match mount::umount(&m.mount_point) {
                Ok(()) => progress = true,
                Err(e) => failures.push((m, e)),
            }
        }
        if !progress {
            break;
        }
    }
    for (m, e) in failures {
        if m.source.starts_with("/dev/")
            && let Err(e2) = mount::remount_read_only(&m.mount_point)
        {
            say(format!("{e:#}; {e2:#}"));
        }
    }
    let _ = mount::remount_read_only("/");
}

/// Asks PID 1's supervisor for `action` from another thread (the node
/// API): the signal it handles for it (SIGTERM powers off, SIGINT
/// reboots) is sent to this process, blocked in every thread, and read by
/// [`supervise`]'s signalfd, so the shutdown is the same as for the power
/// button.
pub fn request(action: Action) {
    let signal = match action {
        Action::PowerOff => libc::SIGTERM,
        Action::Reboot => libc::SIGINT,
    };
    // SAFETY: kill(2) on our own PID with a handled (blocked) signal.
    unsafe { libc::kill(libc::getpid(), signal) };
}

/// The clean shutdown. Never returns.
pub fn shutdown(action: Action) -> ! {
    let (cmd, what) = match action {
        Action::PowerOff => (libc::RB_POWER_OFF, "powering off"),
        Action::Reboot => (libc::RB_AUTOBOOT, "rebooting"),
    };
    say(what);
    terminate_processes();
    sys::sync();
    unmount_all();
    sys::sync();
    let err = sys::reboot(cmd);
    failure::fatal(format!("reboot(2) for {what}: {err}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_filesystems_stay_mounted() {
        for m in ["/", "/dev", "/dev/pts", "/proc", "/sys/fs/cgroup"] {
            assert!(keep_mounted(m), "{m}");
        }
        for m in ["/run", "/system", "/etc/hosts", "/var", "/devices", "/tmp"] {
            assert!(!keep_mounted(m), "{m}");
        }
    }
}
