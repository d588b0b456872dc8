//! Thin, checked wrappers around the few libc calls that are not mounts,
//! and [`check`], which turns a libc call's -1 into an error. The bottom
//! layer: it uses no other module of the runtime.

use anyhow::{Context, Result};
use std::ffi::CString;
use std::path::Path;

/// Checks the return value of a libc call that returns -1 on error: the
/// error is `<what>: <strerror(errno)>`, errno read before `what` runs.
pub fn check<D>(ret: libc::c_int, what: impl FnOnce() -> D) -> Result<libc::c_int>
where
    D: std::fmt::Display + Send + Sync + 'static,
{
    if ret == -1 {
        Err(std::io::Error::last_os_error()).with_context(what)
    } else {
        Ok(ret)
    }
}

pub fn cstr(s: impl AsRef<std::ffi::OsStr>) -> Result<CString> {
    use std::os::unix::ffi::OsStrExt;
    let s = s.as_ref();
    CString::new(s.as_bytes()).with_context(|| format!("{s:?} contains a NUL byte"))
}

/// `N` bytes from the kernel's random pool (getrandom(2), waiting until
/// the pool is initialised: with the CPU's RDRAND at once).
pub fn random<const N: usize>() -> Result<[u8; N]> {
    let mut b = [0u8; N];
    let mut at = 0;
    while at < N {
        // SAFETY: the pointer and length describe the unfilled tail of `b`.
        let n = unsafe { libc::getrandom(b[at..].as_mut_ptr().cast(), N - at, 0) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e).context("getrandom");
        }
        at += n as usize;
    }
    Ok(b)
}

pub fn pid() -> libc::pid_t {
    // SAFETY: getpid cannot fail.
    unsafe { libc::getpid() }
}

pub fn sync() {
    // SAFETY: sync cannot fail.
    unsafe { libc::sync() }
}

/// reboot(2) with `cmd` (`RB_AUTOBOOT`, `RB_POWER_OFF`, ...). Returns only
/// on failure, with the error.
pub fn reboot(cmd: libc::c_int) -> std::io::Error {
    // SAFETY: reboot takes a command constant.
    unsafe { libc::reboot(cmd) };
    std::io::Error::last_os_error()
}

pub fn chdir(path: &str) -> Result<()> {
    let c = cstr(path)?;
    // SAFETY: valid C string.
    check(unsafe { libc::chdir(c.as_ptr()) }, || {
        format!("chdir {path}")
    })
    .map(drop)
}

pub fn chroot(path: &str) -> Result<()> {
    let c = cstr(path)?;
    // SAFETY: valid C string.
    check(unsafe { libc::chroot(c.as_ptr()) }, || {
        format!("chroot {path}")
    })
    .map(drop)
}

/// Creates `path` and its parents with `mode` (an existing directory is fine).
pub fn mkdir_all(path: &Path, mode: libc::mode_t) -> Result<()> {
    if path.is_dir() {
        return Ok(());
    }
    if let Some(parent) = path.parent()
        && !parent.as_os_str().is_empty()
    {
        mkdir_all(parent, mode)?;
    }
    let c = cstr(path)?;
    // SAFETY: valid C string.
    if unsafe { libc::mkdir(c.as_ptr(), mode) } < 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EEXIST) {
            return Err(e).with_context(|| format!("mkdir {}", path.display()));
        }
    }
    Ok(())
}

/// Writes a whole file with `mode` (ignoring the umask, which is 0 in PID 1
/// anyway), replacing what was there.
pub fn write_file(path: &Path, contents: &[u8], mode: u32) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(path)
        .with_context(|| format!("create {}", path.display()))?;
    f.write_all(contents)
        .with_context(|| format!("write {}", path.display()))?;
    f.set_permissions(std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("chmod {}", path.display()))
}

/// Replaces the process with `path`, keeping the environment. Only returns on
/// failure.
pub fn execv(path: &str) -> anyhow::Error {
    let c = match cstr(path) {
        Ok(c) => c,
        Err(e) => return e,
    };
    let argv = [c.as_ptr(), std::ptr::null()];
    // SAFETY: argv is a NULL-terminated array of valid C strings that outlive
    // the call.
    unsafe { libc::execv(c.as_ptr(), argv.as_ptr()) };
    anyhow::Error::new(std::io::Error::last_os_error()).context(format!("execve {path}"))
}

/// Blocks until a signal arrives; used only when nothing else can be done.
pub fn pause_forever() -> ! {
    loop {
        // SAFETY: pause has no preconditions.
        unsafe { libc::pause() };
    }
}

/// Waits for an exclusive `flock` of the whole disk `f` (`path`), as the
/// installer takes it for each change (`bootstate::disk`). A kernel without
/// file locking (CONFIG_FILE_LOCKING, which our kernels have) cannot lock:
/// that is said once and the work goes on unlocked.
pub fn lock(f: &std::fs::File, path: &std::path::Path) -> Result<()> {
    match f.lock() {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::Unsupported => {
            crate::console::say(format!(
                "warning: the kernel cannot lock {} (no file locking): an installer may \
                 change the disk meanwhile",
                path.display()
            ));
            Ok(())
        }
        Err(e) => Err(e).with_context(|| format!("lock {}", path.display())),
    }
}

/// Opens `path` with `flags` (and `O_CLOEXEC`) as an owned descriptor.
pub fn open(path: &str, flags: libc::c_int) -> Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    let c = cstr(path)?;
    // SAFETY: valid C string.
    let fd = check(
        unsafe { libc::open(c.as_ptr(), flags | libc::O_CLOEXEC) },
        || format!("open {path}"),
    )?;
    // SAFETY: just opened, owned by nobody else.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_says_what_failed_and_why() {
        assert_eq!(check(3, || "unused").ok(), Some(3));
        // SAFETY: closing an invalid descriptor only fails with EBADF.
        let e = check(unsafe { libc::close(-1) }, || "close -1").unwrap_err();
        let text = format!("{e:#}");
        assert!(
            text.starts_with("close -1: ") && text.ends_with("(os error 9)"),
            "{text}"
        );
    }
}
