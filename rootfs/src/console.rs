//! The console: every line the runtime prints starts with `machined: `,
//! and is one line: whatever it quotes from outside (a request, a registry,
//! a tar header, a disk's serial) is escaped by [`contract::text::escape`],
//! so no input can forge a line (`machined: ready …`) or drive a terminal.

use crate::sys::{check, cstr};
use anyhow::Result;

/// Writes [`line`] to standard output in one write(2), so that lines never
/// interleave. Errors are ignored: there is nowhere to report them.
pub fn say(text: impl AsRef<str>) {
    write_all(libc::STDOUT_FILENO, line(text.as_ref()).as_bytes());
}

/// `machined: <text>\n`, `text` escaped whole: one line, whatever it holds.
pub fn line(text: &str) -> String {
    format!("machined: {}\n", contract::text::escape(text))
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

#[cfg(test)]
mod tests {
    #[test]
    fn a_line_quoting_a_request_cannot_forge_another_or_drive_the_terminal() {
        let op = "x\nmachined: ready version=9.9.9 slot=A\u{1b}[2J\r\nNo bootable device";
        let l = super::line(&format!("api: unknown op {op}"));
        assert_eq!(l.matches('\n').count(), 1, "{l}");
        assert!(
            l.ends_with('\n') && l.starts_with("machined: api: unknown op x\\n"),
            "{l}"
        );
        assert!(!l.contains('\u{1b}') && !l.contains('\r'), "{l}");
    }
}
