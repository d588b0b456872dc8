//! Kconfig `.config` / fragment syntax: parse, merge, render, compare.
//!
//! A `.config` and a fragment share one syntax: `CONFIG_X=value` sets an
//! option, `# CONFIG_X is not set` unsets it, every other comment or blank
//! line is ignored. Fragments are merged in order onto a base (the output of
//! `make tinyconfig`), later assignments winning. After `make olddefconfig`
//! Kconfig may silently drop or change what was asked for (an unmet `depends
//! on`, a `select`, a choice); [`compare`] lists every such option.

use anyhow::{Context, Result, bail};
use std::collections::HashMap;
use std::fmt;
use std::path::Path;

/// The value of one option.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// `CONFIG_X=<raw>`: the raw text after `=`, quotes included for strings.
    Set(String),
    /// `# CONFIG_X is not set`.
    NotSet,
}

impl Value {
    /// Whether two values mean the same thing: equal text, equal numbers
    /// (`0xb0` == `176`), or an unset option against `n`.
    pub fn equivalent(&self, other: &Value) -> bool {
        match (self, other) {
            (Value::NotSet, Value::NotSet) => true,
            (Value::NotSet, Value::Set(v)) | (Value::Set(v), Value::NotSet) => v == "n",
            (Value::Set(a), Value::Set(b)) => values_equal(a, b),
        }
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Set(v) => f.write_str(v),
            Value::NotSet => f.write_str("is not set"),
        }
    }
}

/// Compares two raw values: numbers numerically (decimal or `0x` hex),
/// strings with their surrounding quotes removed, everything else as text.
pub fn values_equal(a: &str, b: &str) -> bool {
    if a == b {
        return true;
    }
    if let (Some(x), Some(y)) = (parse_number(a), parse_number(b)) {
        return x == y;
    }
    unquote(a) == unquote(b)
}

/// Parses a Kconfig int or hex value.
pub fn parse_number(s: &str) -> Option<i128> {
    let s = s.trim();
    let (neg, digits) = match s.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, s),
    };
    let magnitude = if let Some(hex) = digits
        .strip_prefix("0x")
        .or_else(|| digits.strip_prefix("0X"))
    {
        i128::from_str_radix(hex, 16).ok()?
    } else {
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        digits.parse::<i128>().ok()?
    };
    Some(if neg { -magnitude } else { magnitude })
}

/// Removes one pair of surrounding double quotes and Kconfig's escapes.
pub fn unquote(s: &str) -> String {
    match s.strip_prefix('"').and_then(|r| r.strip_suffix('"')) {
        Some(inner) => inner.replace("\\\"", "\"").replace("\\\\", "\\"),
        None => s.to_string(),
    }
}

/// An ordered set of option assignments, plus what the header says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KernelConfig {
    entries: Vec<(String, Value)>,
    index: HashMap<String, usize>,
    /// From `# Linux/x86 6.1.192 Kernel Configuration`: `6.1.192`.
    pub version: Option<String>,
    /// From the same header: `x86`, `arm64`, ...
    pub header_arch: Option<String>,
}

impl KernelConfig {
    pub fn new() -> KernelConfig {
        KernelConfig::default()
    }

    /// Parses `.config` / fragment text. Lines that are neither assignments,
    /// `is not set` markers, comments nor blank are an error.
    pub fn parse(text: &str) -> Result<KernelConfig> {
        let mut cfg = KernelConfig::new();
        for (n, raw) in text.lines().enumerate() {
            let line = raw.trim();
            if line.is_empty() {
                continue;
            }
            if let Some(comment) = line.strip_prefix('#') {
                let comment = comment.trim();
                if let Some(name) = comment.strip_suffix(" is not set") {
                    let name = name.trim();
                    if is_option_name(name) {
                        cfg.set(name, Value::NotSet);
                        continue;
                    }
                }
                if cfg.version.is_none()
                    && let Some((arch, version)) = parse_header(comment)
                {
                    cfg.header_arch = Some(arch);
                    cfg.version = Some(version);
                }
                continue;
            }
            let Some((name, value)) = line.split_once('=') else {
                bail!(
                    "line {} is not a Kconfig line (CONFIG_NAME=value, `# CONFIG_NAME is not \
                     set`, a comment or blank)",
                    n + 1
                );
            };
            let name = name.trim();
            if !is_option_name(name) {
                bail!(
                    "line {}: {} is not a CONFIG_ option name",
                    n + 1,
                    crate::secret::excerpt(name)
                );
            }
            cfg.set(name, Value::Set(value.trim().to_string()));
        }
        Ok(cfg)
    }

    pub fn load(path: &Path) -> Result<KernelConfig> {
        let text = crate::input::read_text(path, "kernel config", crate::input::MAX_TEXT)?;
        KernelConfig::parse(&text).with_context(|| format!("parsing {}", path.display()))
    }

    /// Sets an option; a later assignment replaces an earlier one in place.
    pub fn set(&mut self, name: &str, value: Value) {
        match self.index.get(name) {
            Some(&i) => self.entries[i].1 = value,
            None => {
                self.index.insert(name.to_string(), self.entries.len());
                self.entries.push((name.to_string(), value));
            }
        }
    }

    /// The value of an option, `None` when the config does not mention it.
    pub fn get(&self, name: &str) -> Option<&Value> {
        self.index.get(name).map(|&i| &self.entries[i].1)
    }

    /// The option's value as a user reads it: absent counts as not set.
    pub fn effective(&self, name: &str) -> Value {
        self.get(name).cloned().unwrap_or(Value::NotSet)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Applies every assignment of `other` on top of this one.
    pub fn merge_from(&mut self, other: &KernelConfig) {
        for (k, v) in other.iter() {
            self.set(k, v.clone());
        }
    }

    /// The architecture in the naming of the rule table: `x86_64`, `x86_32`,
    /// `arm64`, ...; `None` if the header is missing.
    pub fn arch(&self) -> Option<String> {
        let header = self.header_arch.as_deref()?;
        Some(match header {
            "x86" => {
                if self.get("CONFIG_X86_64") == Some(&Value::Set("y".into())) {
                    "x86_64".into()
                } else {
                    "x86_32".into()
                }
            }
            other => other.to_string(),
        })
    }

    /// Renders in `.config` syntax, in assignment order.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for (k, v) in self.iter() {
            match v {
                Value::Set(v) => out.push_str(&format!("{k}={v}\n")),
                Value::NotSet => out.push_str(&format!("# {k} is not set\n")),
            }
        }
        out
    }
}

fn is_option_name(name: &str) -> bool {
    name.strip_prefix("CONFIG_").is_some_and(|rest| {
        !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
    })
}

/// `Linux/x86 6.1.192 Kernel Configuration` -> (`x86`, `6.1.192`).
fn parse_header(comment: &str) -> Option<(String, String)> {
    let rest = comment.strip_prefix("Linux/")?;
    let rest = rest.strip_suffix("Kernel Configuration")?.trim();
    let (arch, version) = rest.split_once(' ')?;
    Some((arch.trim().to_string(), version.trim().to_string()))
}

/// Merges fragments in order (later wins) into the set of requested options.
pub fn merge_fragments(fragments: &[KernelConfig]) -> KernelConfig {
    let mut out = KernelConfig::new();
    for f in fragments {
        out.merge_from(f);
    }
    out
}

/// Applies the requested options on top of a base config (tinyconfig).
pub fn merge_onto(base: &KernelConfig, requested: &KernelConfig) -> KernelConfig {
    let mut out = base.clone();
    out.merge_from(requested);
    out
}

/// A requested option that the final config does not honour.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    pub option: String,
    pub requested: Value,
    /// `None`: the option vanished from the final config (its dependencies
    /// are not met, so Kconfig does not even write it).
    pub actual: Option<Value>,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.actual {
            None => write!(
                f,
                "{}: requested {}, absent from the final .config (a `depends on` is not met)",
                self.option, self.requested
            ),
            Some(a) => write!(
                f,
                "{}: requested {}, got {} (overridden by a dependency, `select` or choice)",
                self.option, self.requested, a
            ),
        }
    }
}

/// Every requested option whose final value differs. An option requested
/// as not set is honoured when it is absent from the final config.
pub fn compare(requested: &KernelConfig, final_config: &KernelConfig) -> Vec<Mismatch> {
    let mut out = Vec::new();
    for (name, want) in requested.iter() {
        let actual = final_config.get(name);
        let ok = match (want, actual) {
            (Value::NotSet, None) => true,
            (w, Some(a)) => w.equivalent(a),
            (Value::Set(_), None) => false,
        };
        if !ok {
            out.push(Mismatch {
                option: name.to_string(),
                requested: want.clone(),
                actual: actual.cloned(),
            });
        }
    }
    out
}

/// Human-readable failure text for a non-empty mismatch list; `hints` maps an
/// option to its Kconfig dependency lines (see [`kconfig_dependencies`]).
pub fn describe_mismatches(
    mismatches: &[Mismatch],
    hints: &HashMap<String, Vec<String>>,
) -> String {
    let mut out = format!(
        "make olddefconfig did not keep {} requested option(s):\n",
        mismatches.len()
    );
    for m in mismatches {
        out.push_str(&format!("  {m}\n"));
        if let Some(deps) = hints.get(&m.option) {
            for d in deps {
                out.push_str(&format!("      {d}\n"));
            }
        }
    }
    out.push_str(
        "hint: enable the missing dependency in a fragment (or drop the request); \
         `make menuconfig` and search with / shows why an option is unavailable",
    );
    out
}

/// Columns of leading whitespace (a tab counts to the next multiple of 8).
fn indentation(line: &str) -> usize {
    let mut col = 0;
    for c in line.chars() {
        match c {
            ' ' => col += 1,
            '\t' => col = (col / 8 + 1) * 8,
            _ => break,
        }
    }
    col
}

/// Finds, for each option, the `depends on` lines of its Kconfig definition
/// and the `if` blocks around it (in its own file, and around the `source`
/// lines that include that file), to explain a mismatch. Best effort.
pub fn kconfig_dependencies(tree: &Path, options: &[&str]) -> HashMap<String, Vec<String>> {
    let wanted: HashMap<&str, &str> = options
        .iter()
        .filter_map(|o| o.strip_prefix("CONFIG_").map(|n| (n, *o)))
        .collect();
    let mut out: HashMap<String, Vec<String>> = HashMap::new();
    if wanted.is_empty() {
        return out;
    }
    // (option, defining file) and, per sourced file, the `if`s around its `source` line.
    let mut defined_in: Vec<(String, String)> = Vec::new();
    let mut sourced_under: HashMap<String, (String, Vec<String>)> = HashMap::new();
    for entry in walkdir::WalkDir::new(tree)
        .into_iter()
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_type().is_file() && e.file_name().to_string_lossy().starts_with("Kconfig")
        })
    {
        let Ok(text) = std::fs::read_to_string(entry.path()) else {
            continue;
        };
        let rel = entry
            .path()
            .strip_prefix(tree)
            .unwrap_or(entry.path())
            .display()
            .to_string();
        let mut current: Option<&str> = None;
        let mut ifs: Vec<String> = Vec::new();
        let mut help_indent: Option<usize> = None;
        for line in text.lines() {
            let t = line.trim();
            let indent = indentation(line);
            if let Some(h) = help_indent {
                if t.is_empty() || indent > h {
                    continue; // help text
                }
                help_indent = None;
            }
            if t == "help" || t == "---help---" {
                help_indent = Some(indent);
                continue;
            }
            let mut words = t.split_whitespace();
            let head = words.next().unwrap_or("");
            match head {
                "config" | "menuconfig" => {
                    current = words.next().and_then(|n| wanted.get(n).copied());
                    if let Some(opt) = current {
                        defined_in.push((opt.to_string(), rel.clone()));
                        for cond in &ifs {
                            out.entry(opt.to_string())
                                .or_default()
                                .push(format!("inside `if {cond}`   ({rel})"));
                        }
                    }
                    continue;
                }
                "if" => ifs.push(t[2..].trim().to_string()),
                "endif" => {
                    ifs.pop();
                }
                "source" | "rsource" | "osource" => {
                    let path = t[head.len()..].trim().trim_matches('"');
                    let path = path.replace("$(SRCARCH)", "x86");
                    let path = if head == "rsource" {
                        Path::new(&rel)
                            .parent()
                            .unwrap_or(Path::new(""))
                            .join(&path)
                            .display()
                            .to_string()
                    } else {
                        path
                    };
                    sourced_under.insert(path, (rel.clone(), ifs.clone()));
                }
                _ => {}
            }
            if matches!(
                head,
                "choice" | "endchoice" | "menu" | "endmenu" | "if" | "endif" | "source" | "comment"
            ) {
                current = None;
                continue;
            }
            if let Some(opt) = current
                && t.starts_with("depends on")
            {
                out.entry(opt.to_string())
                    .or_default()
                    .push(format!("{t}   ({rel})"));
            }
        }
    }
    add_source_conditions(&mut out, defined_in, &sourced_under);
    out
}

/// Adds to `out`, for each (option, defining file), the `if` blocks around
/// the `source` lines that include that file, up the chain of includes.
fn add_source_conditions(
    out: &mut HashMap<String, Vec<String>>,
    defined_in: Vec<(String, String)>,
    sourced_under: &HashMap<String, (String, Vec<String>)>,
) {
    for (opt, file) in defined_in {
        let mut file = file;
        for _ in 0..8 {
            let Some((parent, conds)) = sourced_under.get(&file) else {
                break;
            };
            for cond in conds {
                out.entry(opt.clone()).or_default().push(format!(
                    "inside `if {cond}`   ({parent}, around `source \"{file}\"`)"
                ));
            }
            file = parent.clone();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TINY: &str = "\
#
# Automatically generated file; DO NOT EDIT.
# Linux/x86 6.1.192 Kernel Configuration
#
CONFIG_CC_VERSION_TEXT=\"gcc (Debian 12.2.0-14+deb12u1) 12.2.0\"
CONFIG_X86_64=y
CONFIG_SLOB=y
# CONFIG_SLUB is not set
CONFIG_LOG_BUF_SHIFT=17
CONFIG_MAGIC_SYSRQ_DEFAULT_ENABLE=0xb0
";

    #[test]
    fn parses_values_header_and_not_set() {
        let c = KernelConfig::parse(TINY).unwrap();
        assert_eq!(c.version.as_deref(), Some("6.1.192"));
        assert_eq!(c.header_arch.as_deref(), Some("x86"));
        assert_eq!(c.arch().as_deref(), Some("x86_64"));
        assert_eq!(c.get("CONFIG_SLOB"), Some(&Value::Set("y".into())));
        assert_eq!(c.get("CONFIG_SLUB"), Some(&Value::NotSet));
        assert_eq!(c.get("CONFIG_NOPE"), None);
        assert_eq!(c.effective("CONFIG_NOPE"), Value::NotSet);
        assert_eq!(
            c.get("CONFIG_CC_VERSION_TEXT"),
            Some(&Value::Set(
                "\"gcc (Debian 12.2.0-14+deb12u1) 12.2.0\"".into()
            ))
        );
        assert_eq!(c.len(), 6);
    }

    #[test]
    fn rejects_garbage_lines() {
        let err = KernelConfig::parse("CONFIG_A=y\nhello world\n").unwrap_err();
        assert!(err.to_string().contains("line 2"), "{err}");
        assert!(KernelConfig::parse("FOO=y\n").is_err());
    }

    #[test]
    fn merge_later_fragment_wins_and_keeps_order() {
        let base = KernelConfig::parse(TINY).unwrap();
        let a =
            KernelConfig::parse("# CONFIG_SLOB is not set\nCONFIG_SLUB=y\nCONFIG_A=1\n").unwrap();
        let b = KernelConfig::parse("CONFIG_A=2\n# CONFIG_B is not set\n").unwrap();
        let requested = merge_fragments(&[a, b]);
        assert_eq!(
            requested.render(),
            "# CONFIG_SLOB is not set\nCONFIG_SLUB=y\nCONFIG_A=2\n# CONFIG_B is not set\n"
        );
        let merged = merge_onto(&base, &requested);
        assert_eq!(merged.get("CONFIG_SLOB"), Some(&Value::NotSet));
        assert_eq!(merged.get("CONFIG_SLUB"), Some(&Value::Set("y".into())));
        assert_eq!(merged.get("CONFIG_A"), Some(&Value::Set("2".into())));
        // base order first, new options appended
        let rendered = merged.render();
        assert!(
            rendered.starts_with("CONFIG_CC_VERSION_TEXT="),
            "{rendered}"
        );
        assert!(
            rendered.ends_with("CONFIG_A=2\n# CONFIG_B is not set\n"),
            "{rendered}"
        );
        // round trip
        assert_eq!(KernelConfig::parse(&rendered).unwrap().render(), rendered);
    }

    #[test]
    fn compare_lists_every_dropped_or_changed_option() {
        let requested = KernelConfig::parse(
            "CONFIG_KEPT=y\nCONFIG_DROPPED=y\nCONFIG_CHANGED=y\n# CONFIG_GONE is not set\n\
             # CONFIG_FORCED is not set\nCONFIG_HEX=176\nCONFIG_STR=\"\"\n",
        )
        .unwrap();
        let fin = KernelConfig::parse(
            "CONFIG_KEPT=y\n# CONFIG_CHANGED is not set\nCONFIG_FORCED=y\nCONFIG_HEX=0xb0\nCONFIG_STR=\"\"\n",
        )
        .unwrap();
        let m = compare(&requested, &fin);
        assert_eq!(
            m,
            vec![
                Mismatch {
                    option: "CONFIG_DROPPED".into(),
                    requested: Value::Set("y".into()),
                    actual: None
                },
                Mismatch {
                    option: "CONFIG_CHANGED".into(),
                    requested: Value::Set("y".into()),
                    actual: Some(Value::NotSet)
                },
                Mismatch {
                    option: "CONFIG_FORCED".into(),
                    requested: Value::NotSet,
                    actual: Some(Value::Set("y".into()))
                },
            ]
        );
        let text = describe_mismatches(&m, &HashMap::new());
        assert!(text.contains("3 requested option(s)"), "{text}");
        assert!(
            text.contains("CONFIG_DROPPED: requested y, absent"),
            "{text}"
        );
        assert!(
            text.contains("CONFIG_CHANGED: requested y, got is not set"),
            "{text}"
        );
        assert!(
            text.contains("CONFIG_FORCED: requested is not set, got y"),
            "{text}"
        );
    }

    #[test]
    fn numbers_compare_numerically() {
        assert!(values_equal("0xb0", "176"));
        assert!(values_equal("-1", "-1"));
        assert!(!values_equal("-1", "1"));
        assert!(values_equal("\"abc\"", "abc"));
        assert!(!values_equal("y", "m"));
        assert_eq!(parse_number("0x10"), Some(16));
        assert_eq!(parse_number("abc"), None);
    }

    #[test]
    fn finds_kconfig_dependencies() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("fs/squashfs")).unwrap();
        std::fs::write(
            dir.path().join("fs/Kconfig"),
            "menu \"File systems\"\nif MISC_FILESYSTEMS\nsource \"fs/squashfs/Kconfig\"\nendif\nendmenu\n",
        )
        .unwrap();
        std::fs::write(
            dir.path().join("fs/squashfs/Kconfig"),
            "config SQUASHFS\n\ttristate \"SquashFS\"\n\tdepends on BLOCK\n\thelp\n\t  Say Y\n\n\t  if you have a\n\t  source of squash\n\tdepends on MISC_FILESYSTEMS\n\nconfig OTHER\n\tdepends on FOO\n",
        )
        .unwrap();
        let h = kconfig_dependencies(dir.path(), &["CONFIG_SQUASHFS"]);
        let deps = &h["CONFIG_SQUASHFS"];
        assert_eq!(deps.len(), 3, "{deps:?}");
        assert!(
            deps[1].starts_with("depends on MISC_FILESYSTEMS"),
            "{deps:?}"
        );
        assert_eq!(
            deps[2],
            "inside `if MISC_FILESYSTEMS`   (fs/Kconfig, around `source \"fs/squashfs/Kconfig\"`)"
        );
        assert!(!h.contains_key("CONFIG_OTHER"));
    }
}
