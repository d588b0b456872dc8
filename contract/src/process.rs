//! A helper program run with bounds: its input written, its output read up
//! to a limit, and the whole within a deadline, after which it is killed.
//! One runner for every program the tools ask something of (a registry
//! credential helper, an external signer): neither hangs a build nor
//! fills its memory, whatever the program does.

use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// What a program gave back within the bounds.
#[derive(Debug)]
pub struct Output {
    pub status: ExitStatus,
    /// At most the limit asked for, and one byte more when it printed more
    /// (see [`Output::overflowed`]).
    pub stdout: Vec<u8>,
    /// Its first [`STDERR_KEPT`] bytes, for a message (escape them).
    pub stderr: Vec<u8>,
    limit: u64,
}

impl Output {
    /// It printed more than the limit on its standard output.
    pub fn overflowed(&self) -> bool {
        self.stdout.len() as u64 > self.limit
    }
}

/// How much of the standard error is kept.
pub const STDERR_KEPT: u64 = 4096;

/// Why a program gave nothing usable.
#[derive(Debug)]
pub enum Error {
    /// It could not be started (not found, not executable).
    Spawn(std::io::Error),
    /// It did not end, or its output did not end, within the deadline: it
    /// was killed.
    Timeout(Duration),
    /// Waiting for it failed.
    Wait(std::io::Error),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Spawn(e) => write!(f, "cannot run it ({e})"),
            Error::Timeout(t) => write!(f, "no answer within {} s: it was stopped", t.as_secs()),
            Error::Wait(e) => write!(f, "waiting for it failed ({e})"),
        }
    }
}

impl std::error::Error for Error {}

/// Runs `cmd` with `input` on its standard input; its standard output is
/// read up to `limit` bytes (one more tells it printed more), its standard
/// error whole but only the first [`STDERR_KEPT`] bytes kept (a program
/// that says much there is not cut off); it is killed, with every process
/// it started (its process group), when it has not ended, with its
/// output, within `timeout`.
pub fn run(
    cmd: &mut Command,
    input: &[u8],
    limit: u64,
    timeout: Duration,
) -> Result<Output, Error> {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .map_err(Error::Spawn)?;
    // Written by a thread: a program that does not read its input must not
    // block this one (the thread ends when the program does).
    if let Some(mut stdin) = child.stdin.take() {
        let input = input.to_vec();
        std::thread::spawn(move || {
            let _ = stdin.write_all(&input);
        });
    }
    let stdout = read(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
        limit.saturating_add(1),
        false,
    );
    let stderr = read(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
        STDERR_KEPT,
        true,
    );
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Ok(None) => {
                stop(&mut child);
                return Err(Error::Timeout(timeout));
            }
            Err(e) => {
                stop(&mut child);
                return Err(Error::Wait(e));
            }
        }
    };
    // Its output, within what is left of the wait (a process it left
    // behind may hold the pipes open: the group is stopped then).
    let left = || deadline.saturating_duration_since(Instant::now());
    let stdout = stdout.recv_timeout(left()).map_err(|_| {
        kill_group(&child);
        Error::Timeout(timeout)
    })?;
    let stderr = stderr.recv_timeout(left()).unwrap_or_else(|_| {
        kill_group(&child);
        Vec::new()
    });
    Ok(Output {
        status,
        stdout,
        stderr,
        limit,
    })
}

/// A thread reading `pipe`: up to `keep` bytes kept; with `drain`, the rest
/// read too and dropped (the writer is never cut off).
fn read(pipe: Option<Box<dyn Read + Send>>, keep: u64, drain: bool) -> mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut out = Vec::new();
        if let Some(mut p) = pipe {
            let _ = (&mut p).take(keep).read_to_end(&mut out);
            if drain {
                let _ = std::io::copy(&mut p, &mut std::io::sink());
            }
        }
        let _ = tx.send(out);
    });
    rx
}

/// Kills `child`'s process group (it leads it: `process_group(0)`).
fn kill_group(child: &Child) {
    if let Ok(pid) = i32::try_from(child.id()) {
        // SAFETY: kill(2) on a process group; no memory is involved.
        unsafe {
            libc::kill(-pid, libc::SIGKILL);
        }
    }
}

/// Kills `child` and its group, and reaps it.
fn stop(child: &mut Child) {
    kill_group(child);
    let _ = child.kill();
    let _ = child.wait();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Command {
        let mut c = Command::new("sh");
        c.args(["-c", script]);
        c
    }

    #[test]
    fn input_goes_in_and_output_comes_back() {
        let out = run(
            &mut sh("tr a-z A-Z; echo oops >&2"),
            b"hello",
            100,
            Duration::from_secs(30),
        )
        .unwrap();
        assert!(out.status.success());
        assert_eq!(out.stdout, b"HELLO");
        assert_eq!(out.stderr, b"oops\n");
        assert!(!out.overflowed());
    }

    #[test]
    fn output_past_the_limit_is_cut_and_said() {
        // `yes` never ends by itself: cut at the limit, its pipe closed
        // makes it exit on SIGPIPE.
        let o = run(&mut sh("yes"), b"", 1000, Duration::from_secs(30)).unwrap();
        assert!(o.overflowed());
        assert_eq!(o.stdout.len(), 1001);
        // Much said on stderr does not cut the program off.
        let o = run(
            &mut sh("head -c 100000 /dev/zero >&2; echo done"),
            b"",
            100,
            Duration::from_secs(30),
        )
        .unwrap();
        assert!(o.status.success());
        assert_eq!(o.stdout, b"done\n");
        assert_eq!(o.stderr.len() as u64, STDERR_KEPT);
    }

    #[test]
    fn a_program_that_hangs_is_stopped_at_the_deadline() {
        let started = Instant::now();
        let e = run(&mut sh("sleep 30"), b"", 10, Duration::from_millis(300)).unwrap_err();
        assert!(matches!(e, Error::Timeout(_)), "{e}");
        assert!(started.elapsed() < Duration::from_secs(20));
        // One that ends but leaves a child holding its output open: the
        // child is stopped too.
        let dir = std::env::temp_dir().join(format!("process-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let pidfile = dir.join("pid");
        let script = format!("sleep 30 & echo $! > {}; echo hi", pidfile.display());
        let e = run(&mut sh(&script), b"", 10, Duration::from_millis(500)).unwrap_err();
        assert!(matches!(e, Error::Timeout(_)), "{e}");
        let pid = std::fs::read_to_string(&pidfile).unwrap();
        // Gone, or a zombie waiting for its parent (init) to reap it, once
        // the signal is delivered (waited for, up to 10 s).
        let running = || {
            std::fs::read_to_string(format!("/proc/{}/stat", pid.trim()))
                .is_ok_and(|s| !s.contains(") Z "))
        };
        let waited = Instant::now();
        while running() && waited.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(!running(), "the program's child {} still runs", pid.trim());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_missing_program_is_said() {
        let e = run(
            &mut Command::new("/nonexistent/signer"),
            b"",
            10,
            Duration::from_secs(1),
        )
        .unwrap_err();
        assert!(matches!(e, Error::Spawn(_)));
        assert!(e.to_string().starts_with("cannot run it"), "{e}");
    }
}
