//! Progress of a build, for people and for machines (docs/progress.md).
//!
//! [`Mode::Human`]: on a terminal, each running stage is an indicatif
//! spinner or bar (the kernel's counts objects compiled); the build's
//! messages are lines `build: …` on standard error, as they are without
//! a terminal, where no bar is drawn.
//!
//! [`Mode::Json`] (`--progress=json`): every line imager itself writes to
//! standard error is one JSON object. A stage's progress is
//! `{"stage":S,"done":D,"total":T,"unit":U}`: `done` 0 when it starts, equal
//! to `total` when it ends, and `"skipped":true` on the last line of a
//! stage the build did not need to run. A message is `{"message":M}`; the
//! lines the tools a build runs write to standard error (cargo building
//! the runtime: [`tool_output`]) come as messages too, one per line, so
//! that every line is JSON (the kernel's make is logged to a file).
//!
//! One build runs per process: the mode and the current bar are global.

use std::io::{BufRead, Read, Write};
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

/// How progress is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// Bars on a terminal, lines of text otherwise.
    #[default]
    Human,
    /// One JSON object per line on standard error.
    Json,
}

impl std::str::FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Mode, String> {
        match s {
            "human" => Ok(Mode::Human),
            "json" => Ok(Mode::Json),
            _ => Err(format!("unknown progress mode {s:?}: use human or json")),
        }
    }
}

static MODE: AtomicU8 = AtomicU8::new(0);

/// Sets how progress is shown, for the rest of the process.
pub fn set_mode(m: Mode) {
    MODE.store(m as u8, Ordering::Relaxed);
}

fn mode() -> Mode {
    match MODE.load(Ordering::Relaxed) {
        1 => Mode::Json,
        _ => Mode::Human,
    }
}

/// Runs a tool the build needs and returns its output, standard output
/// captured. Its standard error is ours: as it is in human mode (cargo's
/// own progress on a terminal), and in JSON mode one [`line`] per line it
/// writes, so that every line on standard error stays one JSON object.
pub fn tool_output(cmd: &mut Command) -> std::io::Result<Output> {
    if mode() != Mode::Json {
        return cmd.stderr(Stdio::inherit()).output();
    }
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
    let (Some(mut out), Some(err)) = (child.stdout.take(), child.stderr.take()) else {
        return Err(std::io::Error::other("the tool's output was not piped"));
    };
    let forward = std::thread::spawn(move || {
        for l in std::io::BufReader::new(err)
            .split(b'\n')
            .map_while(Result::ok)
        {
            line(String::from_utf8_lossy(&l).trim_end_matches('\r'));
        }
    });
    let mut stdout = Vec::new();
    let read = out.read_to_end(&mut stdout);
    let status = child.wait()?;
    let _ = forward.join();
    read?;
    Ok(Output {
        status,
        stdout,
        stderr: Vec::new(),
    })
}

/// The bar of the stage running now (human mode, on a terminal).
static CURRENT: Mutex<Option<indicatif::ProgressBar>> = Mutex::new(None);

fn json_line(v: serde_json::Value) {
    let mut e = std::io::stderr().lock();
    let _ = writeln!(e, "{v}");
}

fn stage_line(stage: &str, done: u64, total: u64, unit: &str, skipped: bool) {
    let mut v = serde_json::json!({"stage": stage, "done": done, "total": total, "unit": unit});
    if skipped {
        v["skipped"] = true.into();
    }
    json_line(v);
}

/// A message of the build: `build: TEXT`, or `{"message":TEXT}`.
pub fn message(text: &str) {
    match mode() {
        Mode::Json => json_line(serde_json::json!({ "message": text })),
        Mode::Human => line(&format!("build: {text}")),
    }
}

/// A line of text as it is (`kernel: …`), or `{"message":TEXT}`.
pub fn line(text: &str) {
    match mode() {
        Mode::Json => json_line(serde_json::json!({ "message": text })),
        Mode::Human => match CURRENT.lock().ok().and_then(|c| c.clone()) {
            Some(bar) if !bar.is_hidden() => bar.println(text),
            _ => eprintln!("{text}"),
        },
    }
}

/// The progress of one stage: counts `unit`s up to `total` (0: unknown).
pub struct Bar {
    stage: String,
    unit: &'static str,
    total: u64,
    done: u64,
    bar: Option<indicatif::ProgressBar>,
    last: Instant,
}

/// A bar with a known `total` (bytes shown as such), else a spinner.
fn set_style(b: &indicatif::ProgressBar, stage: &str, total: u64, unit: &str) {
    let counts = if unit == "bytes" {
        "{bytes}/{total_bytes}".to_string()
    } else {
        format!("{{pos}}/{{len}} {unit}")
    };
    let template = if total > 0 {
        format!("{{spinner}} {stage} [{{elapsed_precise}}] {{bar:40}} {counts} {{msg}}")
    } else {
        format!("{{spinner}} {stage} [{{elapsed_precise}}] {{msg}}")
    };
    if let Ok(style) = indicatif::ProgressStyle::with_template(&template) {
        b.set_style(style);
    }
}

/// How often a JSON progress line is written while a stage runs.
const JSON_EVERY: Duration = Duration::from_millis(500);

impl Bar {
    /// Starts the progress of `stage`.
    pub fn start(stage: &str, total: u64, unit: &'static str) -> Bar {
        let bar = match mode() {
            Mode::Json => {
                stage_line(stage, 0, total, unit, false);
                None
            }
            Mode::Human => {
                let b = if total > 0 {
                    indicatif::ProgressBar::new(total)
                } else {
                    indicatif::ProgressBar::new_spinner()
                };
                set_style(&b, stage, total, unit);
                if !b.is_hidden() {
                    b.enable_steady_tick(Duration::from_millis(250));
                }
                if let Ok(mut c) = CURRENT.lock() {
                    *c = Some(b.clone());
                }
                Some(b)
            }
        };
        Bar {
            stage: stage.to_string(),
            unit,
            total,
            done: 0,
            bar,
            last: Instant::now(),
        }
    }

    /// `n` more units done.
    pub fn inc(&mut self, n: u64) {
        self.done += n;
        if self.total > 0 && self.done > self.total {
            self.set_total(self.done + self.total / 10 + 1);
        }
        match &self.bar {
            Some(b) => b.inc(n),
            None if self.last.elapsed() >= JSON_EVERY => {
                self.last = Instant::now();
                stage_line(&self.stage, self.done, self.total, self.unit, false);
            }
            None => {}
        }
    }

    /// Raises (or sets) the total: a spinner becomes a bar.
    pub fn set_total(&mut self, total: u64) {
        if let Some(b) = &self.bar {
            if self.total == 0 && total > 0 {
                set_style(b, &self.stage, total, self.unit);
            }
            b.set_length(total);
        }
        self.total = total;
    }

    /// A short note beside the bar (the file being compiled).
    pub fn note(&self, text: &str) {
        if let Some(b) = &self.bar {
            b.set_message(text.to_string());
        }
    }

    /// Ends the stage: done equals total.
    pub fn finish(mut self) {
        self.end();
    }

    fn end(&mut self) {
        let total = self.total.max(self.done).max(1);
        match self.bar.take() {
            Some(b) => {
                b.finish_and_clear();
                if let Ok(mut c) = CURRENT.lock() {
                    *c = None;
                }
            }
            None => stage_line(&self.stage, total, total, self.unit, false),
        }
        self.total = 0;
    }
}

impl Drop for Bar {
    /// A stage that failed: its bar is cleared (in JSON, no line says it
    /// is done; the error follows).
    fn drop(&mut self) {
        if let Some(b) = self.bar.take() {
            b.finish_and_clear();
            if let Ok(mut c) = CURRENT.lock() {
                *c = None;
            }
        }
    }
}

/// A stage the build did not need to run: in JSON, one line, done.
pub fn skipped(stage: &str) {
    if mode() == Mode::Json {
        stage_line(stage, 1, 1, "steps", true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_and_unknown_ones_say_what_to_use() {
        assert_eq!("json".parse::<Mode>(), Ok(Mode::Json));
        assert_eq!("human".parse::<Mode>(), Ok(Mode::Human));
        let e = "xml".parse::<Mode>().unwrap_err();
        assert!(e.contains("human or json"), "{e}");
    }
}
