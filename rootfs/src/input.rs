//! Input devices: `struct input_event` decoding and the set of open
//! /dev/input/event* devices watched for the power button.

use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};

/// <linux/input-event-codes.h>
pub const EV_KEY: u16 = 0x01;
pub const KEY_POWER: u16 = 116;

/// Size of `struct input_event` on this architecture (24 bytes on x86_64).
pub const EVENT_LEN: usize = std::mem::size_of::<libc::input_event>();
/// The event's `struct timeval` comes first; type, code and value follow.
const TIME_LEN: usize = std::mem::size_of::<libc::timeval>();

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InputEvent {
    pub kind: u16,
    pub code: u16,
    pub value: i32,
}

impl InputEvent {
    /// A press (not release or autorepeat) of the power key.
    pub fn is_power_press(&self) -> bool {
        self.kind == EV_KEY && self.code == KEY_POWER && self.value == 1
    }
}

/// Decodes whole events from what read(2) returned (native byte order);
/// a trailing partial event, which the kernel never produces, is ignored.
pub fn decode(buf: &[u8]) -> Vec<InputEvent> {
    let u16_at = |b: &[u8], at: usize| u16::from_ne_bytes([b[at], b[at + 1]]);
    buf.chunks_exact(EVENT_LEN)
        .map(|e| InputEvent {
            kind: u16_at(e, TIME_LEN),
            code: u16_at(e, TIME_LEN + 2),
            value: i32::from_ne_bytes([
                e[TIME_LEN + 4],
                e[TIME_LEN + 5],
                e[TIME_LEN + 6],
                e[TIME_LEN + 7],
            ]),
        })
        .collect()
}

/// The event devices currently open, by path.
#[derive(Default)]
pub struct Devices {
    open: BTreeMap<PathBuf, OwnedFd>,
}

impl Devices {
    /// Opens every `event*` node of `dir` not yet open. Nodes that cannot be
    /// opened are skipped (and retried at the next rescan).
    pub fn rescan(&mut self, dir: &Path) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let is_event = entry.file_name().to_string_lossy().starts_with("event");
            if !is_event || self.open.contains_key(&path) {
                continue;
            }
            let Ok(c) = crate::sys::cstr(&path) else {
                continue;
            };
            // SAFETY: valid C string.
            let fd = unsafe {
                libc::open(
                    c.as_ptr(),
                    libc::O_RDONLY | libc::O_NONBLOCK | libc::O_CLOEXEC,
                )
            };
            if fd >= 0 {
                // SAFETY: fd was just opened and is owned by nobody else.
                self.open.insert(path, unsafe { OwnedFd::from_raw_fd(fd) });
            }
        }
    }

    pub fn fds(&self) -> Vec<RawFd> {
        self.open.values().map(|f| f.as_raw_fd()).collect()
    }

    pub fn is_empty(&self) -> bool {
        self.open.is_empty()
    }

    /// Reads what `fd` has; true if the power button was pressed. A device
    /// that was removed is closed.
    pub fn power_pressed(&mut self, fd: RawFd) -> bool {
        let mut buf = [0u8; EVENT_LEN * 32];
        let mut pressed = false;
        loop {
            // SAFETY: buf is valid for its length.
            let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
            if n <= 0 {
                let errno = std::io::Error::last_os_error().raw_os_error();
                if n == 0 || errno == Some(libc::ENODEV) {
                    self.open.retain(|_, f| f.as_raw_fd() != fd);
                }
                return pressed;
            }
            let got = buf.get(..n as usize).unwrap_or_default();
            pressed |= decode(got).iter().any(InputEvent::is_power_press);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(kind: u16, code: u16, value: i32) -> Vec<u8> {
        let mut e = vec![0xAAu8; TIME_LEN];
        e.extend_from_slice(&kind.to_ne_bytes());
        e.extend_from_slice(&code.to_ne_bytes());
        e.extend_from_slice(&value.to_ne_bytes());
        e
    }

    #[test]
    fn decodes_input_events() {
        assert_eq!(EVENT_LEN, 24);
        let mut buf = raw(EV_KEY, KEY_POWER, 1);
        buf.extend(raw(0, 0, 0)); // EV_SYN
        buf.extend(raw(EV_KEY, KEY_POWER, 0)); // release
        buf.extend([1, 2, 3]); // partial
        let ev = decode(&buf);
        assert_eq!(ev.len(), 3);
        assert_eq!(
            ev[0],
            InputEvent {
                kind: EV_KEY,
                code: KEY_POWER,
                value: 1
            }
        );
        assert!(ev[0].is_power_press());
        assert!(!ev[1].is_power_press());
        assert!(!ev[2].is_power_press());
        assert!(!decode(&raw(EV_KEY, 30, 1))[0].is_power_press());
    }
}
