//! Incremental builds: what each stage of a build was made from, and
//! whether what it made is still there.
//!
//! A build runs in stages (kernel, rootfs, initramfs, ukis, disk,
//! installer, iso, manifest: [`STAGES`]). Each names everything it reads
//! in an [`Inputs`] digest: the digests of the files it reads (the
//! profile's, the host's and the earlier stages' outputs), the settings it
//! uses, SOURCE_DATE_EPOCH and the imager that runs it. The output
//! directory keeps the build's record ([`names::RECORD`]): for each stage,
//! its inputs digest, what it computed that later stages need (the root
//! hash), and each of its outputs' size, modification time and SHA-256.
//!
//! A stage whose inputs digest is the recorded one and whose outputs are
//! intact is skipped. Intact means, as make checks it, the recorded size
//! and modification time (to the nanosecond); with `--verify-outputs`, the
//! recorded SHA-256. A skipped stage's outputs are hard-linked into the
//! staging directory, so that later stages read them where they read a
//! rebuilt one, and the commit's rename of a file onto itself leaves them
//! as they were: same inode, same time. A stage that runs again after a
//! touch writes the same bytes (builds are deterministic), so the stages
//! after it, whose inputs are digests, are skipped. `--force` runs every
//! stage.
//!
//! The record is removed before the commit's first change and written
//! after its last ([`super::commit`]): a record always describes the
//! committed build, and a directory without one is rebuilt whole. A build
//! in which every stage is skipped commits nothing.

use crate::io::{AtomicFile, sha256_file};
use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

pub use contract::paths::output as names;

/// The stages of a build, in order.
pub const STAGES: [&str; 8] = [
    "kernel",
    "rootfs",
    "initramfs",
    "ukis",
    "disk",
    "installer",
    "iso",
    "manifest",
];

/// The record's format; a record of another format is ignored.
const FORMAT: u32 = 1;

/// The largest record read back (it lists a few dozen files).
const MAX_RECORD: u64 = 1 << 20;

/// When a recorded stage's outputs are taken as intact.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Reuse {
    /// Same size and modification time, as make checks (the default).
    #[default]
    Stamps,
    /// Same SHA-256 (`--verify-outputs`): every output read again.
    Digests,
    /// Never: every stage runs (`--force`).
    Never,
}

/// The record of a build, in the output directory.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Record {
    pub format: u32,
    pub stages: BTreeMap<String, StageRecord>,
}

/// What one stage was made from and what it made.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct StageRecord {
    /// The digest of the stage's inputs ([`Inputs`]).
    pub inputs: String,
    /// Values later stages need (the root hash), as the stage returned them.
    pub values: serde_json::Value,
    pub outputs: Vec<OutputStamp>,
}

/// One output file as its stage left it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct OutputStamp {
    pub name: String,
    pub size: u64,
    /// Modification time, nanoseconds since 1970.
    pub mtime_ns: i128,
    pub sha256: String,
}

/// What became of a stage, for the build's report.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct StageReport {
    pub stage: String,
    /// `built` or `skipped`.
    pub action: &'static str,
    /// Why it was built, or that its inputs and outputs were unchanged.
    pub why: String,
}

/// The digest of everything a stage reads: each item a key and a value,
/// length-prefixed so that no two lists of items hash alike.
pub struct Inputs {
    h: crate::io::ItemHasher,
}

impl Inputs {
    /// The inputs of `stage`, starting with the record's format and the
    /// imager that runs it ([`imager_identity`]).
    pub fn new(stage: &str) -> Result<Inputs> {
        let mut i = Inputs {
            h: crate::io::ItemHasher::new(),
        };
        i.add("format", FORMAT.to_string().as_bytes());
        i.add("stage", stage.as_bytes());
        i.add("imager", imager_identity()?.as_bytes());
        Ok(i)
    }

    fn add(&mut self, key: &str, value: &[u8]) {
        self.h.item(key.as_bytes());
        self.h.item(value);
    }

    /// A setting or a small input held in memory.
    pub fn value(mut self, key: &str, value: impl AsRef<[u8]>) -> Inputs {
        self.add(key, value.as_ref());
        self
    }

    /// A file's contents, by digest.
    pub fn file(self, key: &str, path: &Path) -> Result<Inputs> {
        let (digest, _) = sha256_file(path)?;
        Ok(self.value(key, digest))
    }

    /// A directory tree: every entry in sorted order, with its kind, mode
    /// and contents (a file's digest, a link's target).
    pub fn tree(mut self, key: &str, dir: &Path) -> Result<Inputs> {
        self.add(key, b"tree");
        for entry in walkdir::WalkDir::new(dir).sort_by_file_name() {
            let entry = entry.with_context(|| format!("walking {}", dir.display()))?;
            let rel = entry.path().strip_prefix(dir).unwrap_or(entry.path());
            let meta = entry
                .path()
                .symlink_metadata()
                .with_context(|| format!("reading {}", entry.path().display()))?;
            let kind = meta.file_type();
            let what = if kind.is_symlink() {
                let to = std::fs::read_link(entry.path())
                    .with_context(|| format!("reading {}", entry.path().display()))?;
                format!("link {}", to.display())
            } else if kind.is_file() {
                format!("file {}", sha256_file(entry.path())?.0)
            } else if kind.is_dir() {
                "dir".to_string()
            } else {
                "other".to_string()
            };
            let line = format!("{:o} {what}", meta.mode());
            self.add(&rel.to_string_lossy(), line.as_bytes());
        }
        Ok(self)
    }

    /// The digest, hex.
    pub fn finish(self) -> String {
        self.h.finish()
    }
}

/// The imager that runs the build: its version and its executable's size
/// and modification time. A rebuilt imager (new code) runs every stage
/// again; reading the executable whole on every build would cost more
/// than the stages it saves.
pub fn imager_identity() -> Result<String> {
    let exe = std::env::current_exe().context("finding the imager's own executable")?;
    let m = std::fs::metadata(&exe).with_context(|| format!("reading {}", exe.display()))?;
    Ok(format!(
        "{} {} {} {}.{}",
        env!("CARGO_PKG_VERSION"),
        exe.display(),
        m.len(),
        m.mtime(),
        m.mtime_nsec()
    ))
}

/// A stage's result: its outputs' digests and sizes by name, and its
/// values (recorded, or as it returned them).
#[derive(Debug, Clone)]
pub struct Done {
    pub outputs: BTreeMap<String, OutputStamp>,
    pub values: serde_json::Value,
}

impl Done {
    /// The SHA-256 of the output `name`.
    pub fn digest(&self, name: &str) -> Result<&str> {
        self.outputs
            .get(name)
            .map(|o| o.sha256.as_str())
            .with_context(|| format!("internal: the stage made no {name}"))
    }
}

/// The stages of one build: the old record, the new one, and what became
/// of each stage.
pub struct Stages {
    out: PathBuf,
    staging: PathBuf,
    reuse: Reuse,
    old: Record,
    new: Record,
    report: Vec<StageReport>,
}

impl Stages {
    /// Reads the record of `out` (none, unreadable or of another format:
    /// every stage runs); the stages write into `staging`.
    pub fn open(out: &Path, staging: &Path, reuse: Reuse) -> Stages {
        Stages {
            out: out.to_path_buf(),
            staging: staging.to_path_buf(),
            reuse,
            old: read_record(&out.join(names::RECORD)).unwrap_or_default(),
            new: Record {
                format: FORMAT,
                stages: BTreeMap::new(),
            },
            report: Vec::new(),
        }
    }

    /// Runs the stage `stage`, which writes `outputs` into the staging
    /// directory it is given, unless its inputs and outputs are the
    /// recorded ones.
    pub fn run(
        &mut self,
        stage: &str,
        inputs: Inputs,
        outputs: &[&str],
        make: impl FnOnce(&Path) -> Result<serde_json::Value>,
    ) -> Result<Done> {
        let digest = inputs.finish();
        match self.reusable(stage, &digest, outputs)? {
            Ok(rec) => {
                for o in &rec.outputs {
                    crate::io::link_or_copy(&self.out.join(&o.name), &self.staging.join(&o.name))?;
                }
                crate::progress::skipped(stage);
                self.report(stage, "skipped", "inputs and outputs unchanged".into());
                self.new.stages.insert(stage.to_string(), rec.clone());
                Ok(done(&rec))
            }
            Err(why) => {
                let mut bar = crate::progress::Bar::start(stage, 0, "bytes");
                let values = make(&self.staging)?;
                // Hashing the outputs is most of a disk stage's time (a
                // 2 GiB image): the bar counts the bytes hashed.
                let mut total = 0;
                for name in outputs {
                    total += std::fs::metadata(self.staging.join(name)).map_or(0, |m| m.len());
                }
                bar.set_total(total);
                let mut stamps = Vec::new();
                for name in outputs {
                    stamps.push(stamp_now(&self.staging.join(name), name, None, &mut |n| {
                        bar.inc(n)
                    })?);
                }
                bar.finish();
                let rec = StageRecord {
                    inputs: digest,
                    values,
                    outputs: stamps,
                };
                self.report(stage, "built", why);
                self.new.stages.insert(stage.to_string(), rec.clone());
                Ok(done(&rec))
            }
        }
    }

    fn report(&mut self, stage: &str, action: &'static str, why: String) {
        self.report.push(StageReport {
            stage: stage.to_string(),
            action,
            why,
        });
    }

    /// The recorded stage when it can be reused, else why not.
    fn reusable(
        &self,
        stage: &str,
        digest: &str,
        outputs: &[&str],
    ) -> Result<std::result::Result<StageRecord, String>> {
        if self.reuse == Reuse::Never {
            return Ok(Err("--force".into()));
        }
        let Some(rec) = self.old.stages.get(stage) else {
            return Ok(Err("not built before".into()));
        };
        if rec.inputs != digest {
            return Ok(Err("inputs changed".into()));
        }
        let names: Vec<&str> = rec.outputs.iter().map(|o| o.name.as_str()).collect();
        if names != outputs {
            return Ok(Err("outputs changed".into()));
        }
        let mut kept = rec.clone();
        for o in &mut kept.outputs {
            let path = self.out.join(&o.name);
            let Ok(now) = stamp_now(&path, &o.name, Some(&o.sha256), &mut |_| {}) else {
                return Ok(Err(format!("{} missing", o.name)));
            };
            let intact = match self.reuse {
                Reuse::Digests => {
                    now.size == o.size && sha256_file(&path).is_ok_and(|(d, _)| d == o.sha256)
                }
                _ => now.size == o.size && now.mtime_ns == o.mtime_ns,
            };
            if !intact {
                return Ok(Err(format!("{} changed", o.name)));
            }
            // Checked by digest, a touched output is kept under its new time.
            *o = now;
        }
        Ok(Ok(kept))
    }

    /// True when every stage was skipped: nothing to commit.
    pub fn nothing_built(&self) -> bool {
        self.report.iter().all(|r| r.action == "skipped")
    }

    /// What became of each stage, in order.
    pub fn report_lines(&self) -> Vec<StageReport> {
        self.report.clone()
    }

    /// Writes the new record into the output directory (after the commit).
    pub fn write_record(&self) -> Result<()> {
        let mut f = AtomicFile::create(self.out.join(names::RECORD))?;
        f.write_all(&render(&self.new)?)
            .context("writing the build record")?;
        f.commit()?;
        Ok(())
    }
}

fn done(rec: &StageRecord) -> Done {
    Done {
        outputs: rec
            .outputs
            .iter()
            .map(|o| (o.name.clone(), o.clone()))
            .collect(),
        values: rec.values.clone(),
    }
}

/// The stamp of `path` as it is now: size and time, and its digest when
/// `sha256` is none (told to `progress` as it is hashed), else the
/// `sha256` given, the recorded one.
fn stamp_now(
    path: &Path,
    name: &str,
    sha256: Option<&str>,
    progress: &mut dyn FnMut(u64),
) -> Result<OutputStamp> {
    let m =
        std::fs::symlink_metadata(path).with_context(|| format!("{} missing", path.display()))?;
    if !m.is_file() {
        bail!("{} is not a regular file", path.display());
    }
    let sha256 = match sha256 {
        Some(s) => s.to_string(),
        None => crate::io::sha256_file_progress(path, progress)?.0,
    };
    Ok(OutputStamp {
        name: name.to_string(),
        size: m.len(),
        mtime_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
        sha256,
    })
}

/// The record in `path`, if it is one of this format.
fn read_record(path: &Path) -> Option<Record> {
    let text = crate::input::read_text(path, "build record", MAX_RECORD).ok()?;
    parse(text.as_bytes())
}

/// A record's bytes, as the output directory keeps them.
pub fn render(r: &Record) -> Result<Vec<u8>> {
    let mut text = serde_json::to_vec_pretty(r).context("serializing the build record")?;
    text.push(b'\n');
    Ok(text)
}

/// A record's bytes read back: `None` for anything but a record of this
/// format (the build then runs every stage).
pub fn parse(bytes: &[u8]) -> Option<Record> {
    let r: Record = serde_json::from_slice(bytes).ok()?;
    (r.format == FORMAT).then_some(r)
}

/// Removes the record of `out` (before the commit's first change).
pub fn remove_record(out: &Path) -> Result<()> {
    let path = out.join(names::RECORD);
    match std::fs::remove_file(&path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("removing {}", path.display())),
    }
}
