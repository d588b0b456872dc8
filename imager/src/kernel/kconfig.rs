//! Which options a kernel source defines: the `config NAME` /
//! `menuconfig NAME` entries of its Kconfig files.
//!
//! The KSPP audit uses this set to decide that a rule does not apply (N/A):
//! an option the source being built does not define cannot be set, whatever
//! the version number says (distribution kernels carry backports: Debian's
//! 6.1.192 has 6.12's `PROC_MEM_NO_FORCE`). Kconfig files of other
//! architectures (`arch/<other>/`) are left out, so that an option only
//! another architecture defines counts as absent.
//!
//! The set is read from an unpacked tree ([`KconfigSymbols::from_tree`]) or a
//! source tarball ([`KconfigSymbols::from_source`] unpacks only the Kconfig
//! files into a temporary directory), and is stored beside a cached kernel
//! as one name per line ([`KconfigSymbols::render`] / [`KconfigSymbols::parse`]).

use anyhow::{Context, Result, bail};
use std::collections::BTreeSet;
use std::fs;
use std::path::{Component, Path};
use std::process::Command;

/// Largest Kconfig file read (the largest in 6.12 is ~100 KiB).
const MAX_KCONFIG_FILE: u64 = 4 << 20;

/// The option names (without `CONFIG_`) a kernel source defines.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KconfigSymbols {
    names: BTreeSet<String>,
    /// What the set was read from (a path), for reports.
    pub origin: String,
}

impl KconfigSymbols {
    /// Adds the symbols a Kconfig file's text defines. Lines are
    /// `config NAME` or `menuconfig NAME` after optional indentation; help
    /// text that happens to start with those words and names that are not
    /// Kconfig symbols (`[A-Za-z0-9_]+`) are skipped, so a stray line can at
    /// most add a name no rule asks about.
    pub fn scan_text(&mut self, text: &str) {
        for line in text.lines() {
            let mut words = line.split_whitespace();
            let (Some(kw), Some(name), None) = (words.next(), words.next(), words.next()) else {
                continue;
            };
            if (kw == "config" || kw == "menuconfig")
                && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
            {
                self.names.insert(name.to_string());
            }
        }
    }

    /// Whether the source defines `option` (`CONFIG_X` or `X`).
    pub fn defines(&self, option: &str) -> bool {
        let name = option.strip_prefix("CONFIG_").unwrap_or(option);
        self.names.contains(name)
    }

    pub fn len(&self) -> usize {
        self.names.len()
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// Reads every `Kconfig*` file of an unpacked tree, except those under
    /// `arch/<other>/` for `srcarch` (`x86`, `arm64`, ...: the `.config`
    /// header's architecture).
    pub fn from_tree(tree: &Path, srcarch: &str) -> Result<KconfigSymbols> {
        if !tree.join("Kconfig").is_file() {
            bail!(
                "{} is not a Linux source tree (no top-level Kconfig)",
                tree.display()
            );
        }
        let mut out = KconfigSymbols {
            names: BTreeSet::new(),
            origin: tree.display().to_string(),
        };
        let walk = walkdir::WalkDir::new(tree)
            .sort_by_file_name()
            .into_iter()
            .filter_entry(|e| !(e.file_type().is_dir() && other_arch(tree, e.path(), srcarch)));
        for entry in walk {
            let entry = entry.with_context(|| format!("walking {}", tree.display()))?;
            let is_kconfig = entry.file_type().is_file()
                && entry.file_name().to_string_lossy().starts_with("Kconfig");
            if !is_kconfig {
                continue;
            }
            let len = entry.metadata().map(|m| m.len()).unwrap_or(0);
            if len > MAX_KCONFIG_FILE {
                bail!(
                    "{} has {len} bytes, more than a Kconfig file can have: is this a kernel source?",
                    entry.path().display()
                );
            }
            let bytes = fs::read(entry.path())
                .with_context(|| format!("reading {}", entry.path().display()))?;
            // A few Kconfig help texts are not UTF-8; symbol names are ASCII.
            out.scan_text(&String::from_utf8_lossy(&bytes));
        }
        if out.is_empty() {
            bail!("{} defines no Kconfig symbols", tree.display());
        }
        Ok(out)
    }

    /// From a source tarball (only its Kconfig files are unpacked, into a
    /// temporary directory) or an unpacked tree.
    pub fn from_source(source: &Path, srcarch: &str) -> Result<KconfigSymbols> {
        let meta = fs::metadata(source).with_context(|| format!("reading {}", source.display()))?;
        if meta.is_dir() {
            return KconfigSymbols::from_tree(source, srcarch);
        }
        let tmp = tempfile::tempdir().context("creating a temporary directory")?;
        let out = Command::new("tar")
            .arg("-xf")
            .arg(source)
            .arg("-C")
            .arg(tmp.path())
            .args(["--strip-components=1", "--wildcards", "*Kconfig*"])
            .output()
            .context("running tar")?;
        if !out.status.success() {
            bail!(
                "reading the Kconfig files of {} failed ({}): is it a Linux source tarball? {}",
                source.display(),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        let mut symbols = KconfigSymbols::from_tree(tmp.path(), srcarch)
            .with_context(|| format!("in {}", source.display()))?;
        symbols.origin = source.display().to_string();
        Ok(symbols)
    }

    /// One name per line, sorted.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for n in &self.names {
            out.push_str(n);
            out.push('\n');
        }
        out
    }

    /// The inverse of [`KconfigSymbols::render`]; a line that is not a
    /// symbol name is an error (the file is not ours or is damaged).
    pub fn parse(text: &str, origin: &str) -> Result<KconfigSymbols> {
        let mut names = BTreeSet::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() {
                continue;
            }
            if !line.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
                bail!("{origin}:{}: not a Kconfig symbol name", n + 1);
            }
            names.insert(line.to_string());
        }
        if names.is_empty() {
            bail!("{origin} lists no Kconfig symbols");
        }
        Ok(KconfigSymbols {
            names,
            origin: origin.to_string(),
        })
    }
}

/// True for the directory `tree/arch/<dir>` when `dir` is not `srcarch`
/// (`arch/Kconfig` itself is common to all).
fn other_arch(tree: &Path, dir: &Path, srcarch: &str) -> bool {
    let Ok(rel) = dir.strip_prefix(tree) else {
        return false;
    };
    let parts: Vec<Component> = rel.components().collect();
    match parts.as_slice() {
        [Component::Normal(a), Component::Normal(d)] if *a == "arch" => *d != srcarch,
        _ => false,
    }
}

/// `DIR/NAME.tar.xz` of the tree `DIR/TOP`, as a source tarball is made
/// (for tests that read one).
#[cfg(test)]
pub(crate) fn test_tarball(dir: &Path, top: &str, name: &str) -> std::path::PathBuf {
    let tarball = dir.join(format!("{name}.tar.xz"));
    let st = Command::new("tar")
        .arg("-cJf")
        .arg(&tarball)
        .arg("-C")
        .arg(dir)
        .arg(top)
        .status()
        .expect("running tar");
    assert!(st.success());
    tarball
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scans_config_and_menuconfig_entries() {
        let mut s = KconfigSymbols::default();
        s.scan_text(
            "menuconfig CPU_MITIGATIONS\n\tbool \"x\"\nconfig PROC_MEM_NO_FORCE\n\
             \thelp\n\t  config files are read\n  config\tINDENTED\nconfig bad-name\n\
             config TWO WORDS\n# config COMMENTED\n",
        );
        assert!(s.defines("CONFIG_CPU_MITIGATIONS"));
        assert!(s.defines("PROC_MEM_NO_FORCE"));
        assert!(s.defines("CONFIG_INDENTED"));
        assert!(!s.defines("CONFIG_files"));
        assert!(!s.defines("bad-name"));
        assert!(!s.defines("CONFIG_TWO"));
        assert!(!s.defines("CONFIG_COMMENTED"));
        assert_eq!(s.len(), 3);
    }

    #[test]
    fn other_architectures_are_left_out() {
        let dir = tempfile::tempdir().unwrap();
        let t = dir.path();
        fs::write(t.join("Kconfig"), "config TOP\n").unwrap();
        for (d, sym) in [
            ("arch/x86", "X86_ONLY"),
            ("arch/arm64", "ARM64_ONLY"),
            ("mm", "MM_ONE"),
        ] {
            fs::create_dir_all(t.join(d)).unwrap();
            fs::write(t.join(d).join("Kconfig"), format!("config {sym}\n")).unwrap();
        }
        fs::write(t.join("arch").join("Kconfig"), "config ARCH_COMMON\n").unwrap();
        fs::write(t.join("mm").join("Kconfig.debug"), "config MM_DEBUG\n").unwrap();
        fs::write(t.join("mm").join("notes.txt"), "config NOT_KCONFIG\n").unwrap();
        let s = KconfigSymbols::from_tree(t, "x86").unwrap();
        let got: Vec<&str> = s.names.iter().map(String::as_str).collect();
        assert_eq!(
            got,
            ["ARCH_COMMON", "MM_DEBUG", "MM_ONE", "TOP", "X86_ONLY"]
        );
        let arm = KconfigSymbols::from_tree(t, "arm64").unwrap();
        assert!(arm.defines("ARM64_ONLY") && !arm.defines("X86_ONLY"));
    }

    #[test]
    fn a_tarball_is_read_without_unpacking_it_all() {
        let dir = tempfile::tempdir().unwrap();
        let top = dir.path().join("linux-source-9.9");
        fs::create_dir_all(top.join("security")).unwrap();
        fs::write(top.join("Kconfig"), "config TOP\n").unwrap();
        fs::write(top.join("security/Kconfig"), "config PROC_MEM_NO_FORCE\n").unwrap();
        fs::write(top.join("Makefile"), "config NOT_READ\n").unwrap();
        let tarball = super::test_tarball(dir.path(), "linux-source-9.9", "src");
        let s = KconfigSymbols::from_source(&tarball, "x86").unwrap();
        assert!(s.defines("CONFIG_PROC_MEM_NO_FORCE") && s.defines("CONFIG_TOP"));
        assert!(!s.defines("CONFIG_NOT_READ"));
        assert_eq!(s.origin, tarball.display().to_string());
        let not_a_kernel = dir.path().join("other.tar.xz");
        Command::new("tar")
            .arg("-cJf")
            .arg(&not_a_kernel)
            .arg("-C")
            .arg(dir.path())
            .arg("src.tar.xz")
            .status()
            .unwrap();
        let err = KconfigSymbols::from_source(&not_a_kernel, "x86").unwrap_err();
        assert!(format!("{err:#}").contains("Linux source"), "{err:#}");
    }

    #[test]
    fn render_and_parse_round_trip() {
        let mut s = KconfigSymbols::default();
        s.scan_text("config B\nconfig A\n");
        let back = KconfigSymbols::parse(&s.render(), "cache").unwrap();
        assert_eq!(back.names, s.names);
        assert!(KconfigSymbols::parse("A\nnot a name\n", "f").is_err());
        assert!(KconfigSymbols::parse("\n", "f").is_err());
    }
}
