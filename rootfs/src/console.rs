//! The console: every line the runtime prints starts with `machined: `.

use crate::sys::{check, cstr};
use anyhow::Result;

/// Writes `machined: <line>\n` to standard output in one write(2), so that
/// lines never interleave. Errors are ignored: there is nowhere to report them.
pub fn say(line: impl AsRef<str>) {
    let text = format!("machined: {}\n", line.as_ref());
    write_all(libc::STDOUT_FILENO, text.as_bytes());
}

fn write_all(fd: libc::c_int, mut buf: &[u8]) {
    while !buf.is_empty() {
        // SAFETY: buf is a valid slice for its length.
        let n = unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) };
        if n < 0 {
            if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return;
        }
        if n == 0 {
            return;
        }
        buf = buf.get(n as usize..).unwrap_or_default();
    }
}

/// Opens /dev/console and makes it standard input, output and error.
pub fn reopen(path: &str) -> Result<()> {
    let c = cstr(path)?;
    // SAFETY: c is a valid NUL-terminated string.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDWR | libc::O_NOCTTY) };
    let fd = check(fd, || format!("open {path}"))?;
    for target in 0..=2 {
        // SAFETY: fd is open; dup2 onto the standard descriptors.
        check(unsafe { libc::dup2(fd, target) }, || {
            format!("dup2 {path} onto fd {target}")
        })?;
    }
    if fd > 2 {
        // SAFETY: fd is ours and no longer needed.
        unsafe { libc::close(fd) };
    }
    Ok(())
}
