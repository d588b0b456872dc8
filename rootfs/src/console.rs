//! The console: every line the runtime prints starts with `machined: `,
//! and is one line: whatever it quotes from outside (a request, a registry,
//! a tar header, a disk's serial) is escaped by [`contract::text::escape`],
//! so no input can forge a line (`machined: ready …`) or drive a terminal.

use crate::sys::{check, cstr};
use anyhow::Result;
use std::sync::OnceLock;

/// Writes [`line`] to every console the kernel writes its messages to: the
/// others first ([`mirror`]: the screen), then standard output
/// (/dev/console, the serial port), each in one write(2), so that lines
/// never interleave and a line seen on the serial console is on the screen
/// already. Errors are ignored: there is nowhere to report them.
pub fn say(text: impl AsRef<str>) {
    let l = line(text.as_ref());
    for &fd in MIRRORS.get().map(Vec::as_slice).unwrap_or_default() {
        write_all(fd, l.as_bytes());
    }
    write_all(libc::STDOUT_FILENO, l.as_bytes());
}

/// The consoles [`say`] writes to besides standard output.
static MIRRORS: OnceLock<Vec<libc::c_int>> = OnceLock::new();

/// How much of /proc/consoles is read, and how many consoles are taken.
const CONSOLES_MAX_BYTES: usize = 4096;
const CONSOLES_MAX: usize = 8;

/// Opens the enabled consoles of /proc/consoles that are not /dev/console
/// ([`other_consoles`]; `console=tty0 console=ttyS0,115200` on the command
/// line: the screen) for [`say`], once /proc and /dev are mounted; returns
/// the names of those it opened. A console that does not open is left out.
pub fn mirror() -> Vec<String> {
    use std::io::Read;
    let mut text = String::new();
    let read = std::fs::File::open("/proc/consoles")
        .and_then(|f| f.take(CONSOLES_MAX_BYTES as u64).read_to_string(&mut text));
    if read.is_err() {
        return Vec::new();
    }
    let mut names = Vec::new();
    let mut fds = Vec::new();
    for name in other_consoles(&text) {
        let Ok(c) = cstr(format!("/dev/{name}")) else {
            continue;
        };
        // SAFETY: c is a valid NUL-terminated string.
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_WRONLY | libc::O_NOCTTY | libc::O_CLOEXEC,
            )
        };
        if fd >= 0 {
            fds.push(fd);
            names.push(name);
        }
    }
    if MIRRORS.set(fds).is_err() {
        return Vec::new();
    }
    names
}

/// Says, as `stage`, which consoles [`mirror`] found besides
/// /dev/console (nothing when none).
pub fn say_mirrors(stage: &str, names: &[String]) {
    if !names.is_empty() {
        say(format!(
            "{stage}: console lines also on {}",
            names.join(", ")
        ));
    }
}

/// The enabled consoles of `/proc/consoles` other than the one
/// /dev/console is: its lines are `NAME OPERATIONS (FLAGS) MAJOR:MINOR`,
/// FLAGS holding `E` for an enabled console and `C` for the preferred one,
/// /dev/console (Documentation/filesystems/proc.rst, "/proc/consoles").
/// Only plain device names (letters and digits, at most 32) are taken, at
/// most [`CONSOLES_MAX`].
pub fn other_consoles(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| {
            let name = l.split_whitespace().next()?;
            let flags = l.split_once('(')?.1.split_once(')')?.0;
            let plain = !name.is_empty()
                && name.len() <= 32
                && name.bytes().all(|b| b.is_ascii_alphanumeric());
            (plain && flags.contains('E') && !flags.contains('C')).then(|| name.to_string())
        })
        .take(CONSOLES_MAX)
        .collect()
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
    /// /proc/consoles as Linux 6.12 writes it with `console=tty0
    /// console=ttyS0,115200`: the serial port is /dev/console (`C`), the
    /// screen is the other.
    #[test]
    fn the_screen_is_the_other_console() {
        let text =
            "ttyS0                -W- (EC p a)    4:64\ntty0                 -WU (E  p  )    4:1\n";
        assert_eq!(super::other_consoles(text), ["tty0"]);
        assert!(super::other_consoles("ttyS0 -W- (EC p a) 4:64\n").is_empty());
        // Disabled, odd names, no flags: left out.
        let odd = "tty1 -WU (   p  ) 4:2\n../x -W- (E) 1:1\nttyX0\n";
        assert!(super::other_consoles(odd).is_empty());
        let many = "tty0 -WU (E) 4:1\n".repeat(20);
        assert_eq!(super::other_consoles(&many).len(), super::CONSOLES_MAX);
    }

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
