//! KSPP audit: checks a kernel `.config` (and optionally a command line)
//! against the rule table in `kernel-config/kspp-rules.yaml`.
//!
//! Each rule gets a verdict: OK, FAIL, N/A (the option does not exist in this
//! kernel or architecture, or the rule's `when` precondition is not met) or
//! WAIVED (a FAIL that a [`Waiver`] with a reason accepts).
//!
//! Whether a config option exists is decided by the Kconfig of the kernel
//! source being audited ([`KconfigSymbols`], [`audit_with_source`]): an
//! option the source defines is audited whatever its version number, so a
//! backport is not missed. Without a source (a bare `.config`, a prebuilt
//! kernel) the rules' `since`/`until` version ranges decide instead, and the
//! report says so ([`Report::basis`]). Boot parameters have no Kconfig entry:
//! their version range always decides.

use super::config::{KernelConfig, Value, values_equal};
use super::kconfig::KconfigSymbols;
use anyhow::{Context, Result, bail};
use serde::{Deserialize, Deserializer, Serialize};
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::path::Path;

/// What a rule checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum RuleKind {
    #[default]
    Config,
    Cmdline,
}

/// One row of the rule table.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    /// `CONFIG_X` or a boot parameter name.
    pub option: String,
    /// `y`, `is not set`, a number or a string (for a cmdline flag, `y` = present).
    #[serde(deserialize_with = "scalar_string")]
    pub wanted: String,
    pub why: String,
    #[serde(default)]
    pub kind: RuleKind,
    /// First kernel version (major.minor) the option exists in upstream.
    /// Decides N/A only when no kernel source is given (and for boot
    /// parameters); otherwise documentation.
    #[serde(default, deserialize_with = "opt_scalar_string")]
    pub since: Option<String>,
    /// Last kernel version (major.minor) the option exists in upstream (as `since`).
    #[serde(default, deserialize_with = "opt_scalar_string")]
    pub until: Option<String>,
    /// Architecture the rule applies to (`x86_64`, `arm64`, ...); none = all.
    #[serde(default)]
    pub arch: Option<String>,
    /// Precondition `CONFIG_X=value`; the rule is N/A when it does not hold.
    #[serde(default)]
    pub when: Option<String>,
}

/// The rule table.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Rules {
    pub rules: Vec<Rule>,
}

impl Rules {
    pub fn parse(text: &str) -> Result<Rules> {
        let rules: Rules = serde_yaml::from_str(text).map_err(|e| {
            anyhow::anyhow!(
                "parsing the KSPP rule table: {}",
                crate::secret::sanitise(&e.to_string())
            )
        })?;
        for r in &rules.rules {
            for v in [&r.since, &r.until].into_iter().flatten() {
                parse_version(v)
                    .with_context(|| format!("rule {}: bad version {v:?}", r.option))?;
            }
            if let Some(w) = &r.when {
                parse_when(w).with_context(|| format!("rule {}", r.option))?;
            }
        }
        Ok(rules)
    }

    pub fn load(path: &Path) -> Result<Rules> {
        let text = crate::input::read_text(path, "KSPP rule table", crate::input::MAX_TEXT)?;
        Rules::parse(&text).with_context(|| format!("in {}", path.display()))
    }
}

/// An accepted deviation from a rule; the reason is mandatory.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Waiver {
    pub option: String,
    #[serde(default)]
    pub reason: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WaiverFile {
    waivers: Vec<Waiver>,
}

/// Parses a waiver file: `waivers: [{option, reason}, ...]`.
pub fn parse_waivers(text: &str) -> Result<Vec<Waiver>> {
    let f: WaiverFile = serde_yaml::from_str(text).map_err(|e| {
        anyhow::anyhow!(
            "parsing the waiver list: {}",
            crate::secret::sanitise(&e.to_string())
        )
    })?;
    validate_waivers(&f.waivers)?;
    Ok(f.waivers)
}

pub fn load_waivers(path: &Path) -> Result<Vec<Waiver>> {
    let text = crate::input::read_text(path, "waiver list", crate::input::MAX_TEXT)?;
    parse_waivers(&text).with_context(|| format!("in {}", path.display()))
}

/// A waiver needs a reason; an option may be waived once.
pub fn validate_waivers(waivers: &[Waiver]) -> Result<()> {
    let mut seen = HashSet::new();
    for w in waivers {
        if w.option.trim().is_empty() {
            bail!("a waiver has no option");
        }
        if w.reason.trim().is_empty() {
            bail!(
                "the waiver for {} has no reason: every waiver must say why",
                w.option
            );
        }
        if !seen.insert(w.option.as_str()) {
            bail!("{} is waived twice", w.option);
        }
    }
    Ok(())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Verdict {
    #[serde(rename = "OK")]
    Ok,
    #[serde(rename = "FAIL")]
    Fail,
    #[serde(rename = "N/A")]
    NotApplicable,
    #[serde(rename = "WAIVED")]
    Waived,
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Verdict::Ok => "OK",
            Verdict::Fail => "FAIL",
            Verdict::NotApplicable => "N/A",
            Verdict::Waived => "WAIVED",
        })
    }
}

/// The verdict on one rule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub option: String,
    pub kind: RuleKind,
    pub wanted: String,
    /// What the config / command line has: a value, `is not set`, or for a
    /// command line `absent`; `null` when not evaluated (N/A).
    pub actual: Option<String>,
    pub verdict: Verdict,
    pub why: String,
    /// Why N/A, or the waiver's reason.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// The audit of one kernel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Report {
    pub kernel_version: String,
    pub arch: String,
    pub findings: Vec<Finding>,
    /// Waivers that matched no failing rule (harmless, but worth pruning).
    pub unused_waivers: Vec<String>,
    /// What decided that a config option does not exist: the Kconfig of a
    /// source, or the rules' version ranges.
    pub basis: String,
}

impl Report {
    /// Rules that failed and were not waived.
    pub fn failures(&self) -> Vec<&Finding> {
        self.findings
            .iter()
            .filter(|f| f.verdict == Verdict::Fail)
            .collect()
    }

    pub fn count(&self, v: Verdict) -> usize {
        self.findings.iter().filter(|f| f.verdict == v).count()
    }

    pub fn summary(&self) -> String {
        format!(
            "kspp: {} ok, {} failed, {} n/a, {} waived",
            self.count(Verdict::Ok),
            self.count(Verdict::Fail),
            self.count(Verdict::NotApplicable),
            self.count(Verdict::Waived)
        )
    }

    /// One line per rule, then the summary line.
    pub fn render_text(&self) -> String {
        let mut out = String::new();
        for f in &self.findings {
            out.push_str(&f.render_line());
            out.push('\n');
        }
        for w in &self.unused_waivers {
            out.push_str(&format!(
                "note: waiver for {w} is unused (the rule passes or is N/A)\n"
            ));
        }
        out.push_str(&format!("note: N/A decided by {}\n", self.basis));
        out.push_str(&self.summary());
        out.push('\n');
        out
    }

    /// A JSON list of findings (`option`, `kind`, `wanted`, `actual`, `verdict`, `why`, `note`).
    pub fn to_json(&self) -> Result<String> {
        serde_json::to_string_pretty(&self.findings).context("serializing the KSPP report")
    }
}

impl Finding {
    fn display_name(&self) -> String {
        self.option.clone()
    }

    pub fn render_line(&self) -> String {
        let name = self.display_name();
        let actual = self.actual.as_deref().unwrap_or("?");
        match self.verdict {
            Verdict::Ok => {
                if self.wanted == "is not set" {
                    format!("OK   # {name} is not set")
                } else {
                    format!("OK   {name}={}", self.wanted)
                }
            }
            Verdict::Fail => format!(
                "FAIL {name} wanted {}, got {actual}: {}",
                self.wanted, self.why
            ),
            Verdict::NotApplicable => format!(
                "N/A  {name} ({})",
                self.note.as_deref().unwrap_or("not applicable")
            ),
            Verdict::Waived => format!(
                "WAIVED {name} wanted {}, got {actual}: {}",
                self.wanted,
                self.note.as_deref().unwrap_or("")
            ),
        }
    }
}

/// Audits a config (and optionally a command line) against the rules, with
/// no kernel source: the rules' version ranges decide whether an option
/// exists. Without a command line, the cmdline rules are N/A.
pub fn audit(
    rules: &Rules,
    config: &KernelConfig,
    cmdline: Option<&str>,
    waivers: &[Waiver],
) -> Result<Report> {
    audit_with_source(rules, config, cmdline, waivers, None)
}

/// [`audit`], where `symbols` (the Kconfig of the config's kernel source),
/// when given, decides whether a config option exists.
pub fn audit_with_source(
    rules: &Rules,
    config: &KernelConfig,
    cmdline: Option<&str>,
    waivers: &[Waiver],
    symbols: Option<&KconfigSymbols>,
) -> Result<Report> {
    validate_waivers(waivers)?;
    let known: HashSet<&str> = rules.rules.iter().map(|r| r.option.as_str()).collect();
    if let Some(w) = waivers.iter().find(|w| !known.contains(w.option.as_str())) {
        bail!("waiver for {}: no rule has this option (typo?)", w.option);
    }
    let version_text = config
        .version
        .clone()
        .context("the config has no `# Linux/<arch> <version> Kernel Configuration` header")?;
    let version = parse_version(&version_text)?;
    let arch = config
        .arch()
        .context("the config header names no architecture")?;
    let cmdline = cmdline.map(parse_cmdline);
    let waiver_by_option: HashMap<&str, &Waiver> =
        waivers.iter().map(|w| (w.option.as_str(), w)).collect();
    let mut used = HashSet::new();

    let mut findings = Vec::new();
    for rule in &rules.rules {
        let mut finding = Finding {
            option: rule.option.clone(),
            kind: rule.kind,
            wanted: rule.wanted.clone(),
            actual: None,
            verdict: Verdict::NotApplicable,
            why: rule.why.clone(),
            note: None,
        };
        if let Some(reason) = not_applicable(rule, version, &version_text, &arch, config, symbols)?
        {
            finding.note = Some(reason);
            findings.push(finding);
            continue;
        }
        let actual = match rule.kind {
            RuleKind::Config => Some(config.effective(&rule.option).to_string()),
            RuleKind::Cmdline => match &cmdline {
                None => {
                    finding.note = Some("no kernel command line given".into());
                    findings.push(finding);
                    continue;
                }
                Some(params) => Some(
                    params
                        .get(rule.option.as_str())
                        .cloned()
                        .unwrap_or_else(|| "absent".to_string()),
                ),
            },
        };
        let actual = actual.expect("set on every non-N/A path");
        let ok = match rule.kind {
            RuleKind::Config => {
                let want = if rule.wanted == "is not set" {
                    Value::NotSet
                } else {
                    Value::Set(rule.wanted.clone())
                };
                want.equivalent(&config.effective(&rule.option))
            }
            RuleKind::Cmdline => actual != "absent" && values_equal(&rule.wanted, &actual),
        };
        finding.actual = Some(actual);
        finding.verdict = if ok {
            Verdict::Ok
        } else if let Some(w) = waiver_by_option.get(rule.option.as_str()) {
            used.insert(w.option.as_str());
            finding.note = Some(w.reason.clone());
            Verdict::Waived
        } else {
            Verdict::Fail
        };
        findings.push(finding);
    }
    let unused_waivers = waivers
        .iter()
        .filter(|w| !used.contains(w.option.as_str()))
        .map(|w| w.option.clone())
        .collect();
    let basis = match symbols {
        Some(s) => format!("the Kconfig of {} ({} options)", s.origin, s.len()),
        None => "the rules' since/until version ranges (no kernel source given)".to_string(),
    };
    Ok(Report {
        kernel_version: version_text,
        arch,
        findings,
        unused_waivers,
        basis,
    })
}

/// The reason a rule does not apply, or `None` when it does.
fn not_applicable(
    rule: &Rule,
    version: (u32, u32),
    version_text: &str,
    arch: &str,
    config: &KernelConfig,
    symbols: Option<&KconfigSymbols>,
) -> Result<Option<String>> {
    if let Some(a) = &rule.arch
        && a != arch
    {
        return Ok(Some(format!("{a} only; this kernel is {arch}")));
    }
    match (rule.kind, symbols) {
        (RuleKind::Config, Some(symbols)) => {
            if !symbols.defines(&rule.option) {
                return Ok(Some(format!(
                    "not defined in the Kconfig of this kernel ({version_text})"
                )));
            }
        }
        _ => {
            if let Some(reason) = outside_versions(rule, version, version_text)? {
                return Ok(Some(reason));
            }
        }
    }
    if let Some(w) = &rule.when {
        let (opt, want) = parse_when(w)?;
        if !want.equivalent(&config.effective(&opt)) {
            return Ok(Some(format!("only when {w}")));
        }
    }
    Ok(None)
}

/// The reason a rule's version range excludes the kernel, if it does.
fn outside_versions(
    rule: &Rule,
    version: (u32, u32),
    version_text: &str,
) -> Result<Option<String>> {
    if let Some(s) = &rule.since
        && version < parse_version(s)?
    {
        return Ok(Some(format!("since {s}; this kernel is {version_text}")));
    }
    if let Some(u) = &rule.until
        && version > parse_version(u)?
    {
        return Ok(Some(format!("until {u}; this kernel is {version_text}")));
    }
    Ok(None)
}

/// `6.1.192` / `6.1` / `6.1.0-rc1` -> (6, 1).
pub fn parse_version(v: &str) -> Result<(u32, u32)> {
    let mut parts = v.trim().split(['.', '-', '+']);
    let major = parts.next().unwrap_or("").parse::<u32>();
    let minor = parts.next().unwrap_or("").parse::<u32>();
    match (major, minor) {
        (Ok(a), Ok(b)) => Ok((a, b)),
        _ => bail!("{v:?} is not a kernel version (major.minor[.patch])"),
    }
}

fn parse_when(w: &str) -> Result<(String, Value)> {
    let w = w.trim();
    if let Some(name) = w
        .strip_prefix("# ")
        .and_then(|r| r.strip_suffix(" is not set"))
    {
        return Ok((name.trim().to_string(), Value::NotSet));
    }
    let Some((k, v)) = w.split_once('=') else {
        bail!("`when: {w}` is not CONFIG_X=value");
    };
    let v = v.trim();
    let value = if v == "n" || v == "is not set" {
        Value::NotSet
    } else {
        Value::Set(v.to_string())
    };
    Ok((k.trim().to_string(), value))
}

/// Splits a kernel command line into parameters; a later parameter wins; a
/// bare flag has the value `y`. Double quotes group (`foo="a b"`). Everything
/// after a lone `--` belongs to init and is ignored.
pub fn parse_cmdline(cmdline: &str) -> HashMap<String, String> {
    let mut out = HashMap::new();
    let mut tokens = Vec::new();
    let mut cur = String::new();
    let mut in_quotes = false;
    for c in cmdline.chars() {
        match c {
            '"' => in_quotes = !in_quotes,
            c if c.is_whitespace() && !in_quotes => {
                if !cur.is_empty() {
                    tokens.push(std::mem::take(&mut cur));
                }
            }
            c => cur.push(c),
        }
    }
    if !cur.is_empty() {
        tokens.push(cur);
    }
    for t in tokens {
        if t == "--" {
            break;
        }
        match t.split_once('=') {
            Some((k, v)) => out.insert(k.to_string(), v.to_string()),
            None => out.insert(t, "y".to_string()),
        };
    }
    out
}

fn scalar_to_string(v: serde_yaml::Value) -> Result<String, String> {
    match v {
        serde_yaml::Value::String(s) => Ok(s),
        serde_yaml::Value::Number(n) => Ok(n.to_string()),
        serde_yaml::Value::Bool(b) => Ok(if b { "y".into() } else { "n".into() }),
        other => Err(format!("expected a scalar, got {other:?}")),
    }
}

fn scalar_string<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let v = serde_yaml::Value::deserialize(d)?;
    scalar_to_string(v).map_err(serde::de::Error::custom)
}

fn opt_scalar_string<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    let v = Option::<serde_yaml::Value>::deserialize(d)?;
    v.map(scalar_to_string)
        .transpose()
        .map_err(serde::de::Error::custom)
}

#[cfg(test)]
mod tests {
    use super::*;

    const RULES: &str = r#"
rules:
  - {option: CONFIG_SLAB_FREELIST_HARDENED, wanted: y, why: "harden freelists"}
  - {option: CONFIG_DEVMEM, wanted: is not set, why: "no /dev/mem"}
  - {option: CONFIG_DEFAULT_MMAP_MIN_ADDR, wanted: 65536, arch: x86_64, why: "no low mappings"}
  - {option: CONFIG_HARDENED_USERCOPY_FALLBACK, wanted: is not set, until: "5.15", why: "old"}
  - {option: CONFIG_RANDOM_KMALLOC_CACHES, wanted: y, since: "6.6", why: "new"}
  - {option: CONFIG_SHADOW_CALL_STACK, wanted: y, arch: arm64, why: "arm64 only"}
  - {option: CONFIG_CFI_CLANG, wanted: y, since: "6.1", why: "clang cfi"}
  - {option: CONFIG_MODULE_SIG, wanted: y, when: "CONFIG_MODULES=y", why: "signed modules"}
  - {option: CONFIG_PANIC_TIMEOUT, wanted: -1, why: "reboot"}
  - {kind: cmdline, option: slab_nomerge, wanted: y, why: "no merging"}
  - {kind: cmdline, option: init_on_free, wanted: "1", why: "wipe"}
  - {kind: cmdline, option: pti, wanted: "on", why: "pti"}
"#;

    const CONFIG: &str = "\
# Linux/x86 6.1.192 Kernel Configuration
CONFIG_X86_64=y
CONFIG_SLAB_FREELIST_HARDENED=y
CONFIG_DEFAULT_MMAP_MIN_ADDR=4096
CONFIG_PANIC_TIMEOUT=-1
# CONFIG_MODULES is not set
";

    fn verdicts(r: &Report) -> Vec<(&str, Verdict)> {
        r.findings
            .iter()
            .map(|f| (f.option.as_str(), f.verdict))
            .collect()
    }

    fn finding<'a>(r: &'a Report, option: &str) -> &'a Finding {
        r.findings.iter().find(|f| f.option == option).unwrap()
    }

    #[test]
    fn exact_verdicts_without_cmdline() {
        let rules = Rules::parse(RULES).unwrap();
        let cfg = KernelConfig::parse(CONFIG).unwrap();
        let r = audit(&rules, &cfg, None, &[]).unwrap();
        use Verdict::*;
        assert_eq!(
            verdicts(&r),
            vec![
                ("CONFIG_SLAB_FREELIST_HARDENED", Ok),
                ("CONFIG_DEVMEM", Ok),
                ("CONFIG_DEFAULT_MMAP_MIN_ADDR", Fail),
                ("CONFIG_HARDENED_USERCOPY_FALLBACK", NotApplicable),
                ("CONFIG_RANDOM_KMALLOC_CACHES", NotApplicable),
                ("CONFIG_SHADOW_CALL_STACK", NotApplicable),
                ("CONFIG_CFI_CLANG", Fail),
                ("CONFIG_MODULE_SIG", NotApplicable),
                ("CONFIG_PANIC_TIMEOUT", Ok),
                ("slab_nomerge", NotApplicable),
                ("init_on_free", NotApplicable),
                ("pti", NotApplicable),
            ]
        );
        assert_eq!(r.kernel_version, "6.1.192");
        assert_eq!(r.arch, "x86_64");
        let f = finding(&r, "CONFIG_DEFAULT_MMAP_MIN_ADDR");
        assert_eq!(f.actual.as_deref(), Some("4096"));
        let f = finding(&r, "CONFIG_CFI_CLANG");
        assert_eq!(f.actual.as_deref(), Some("is not set"));
        assert_eq!(
            finding(&r, "CONFIG_HARDENED_USERCOPY_FALLBACK")
                .note
                .as_deref(),
            Some("until 5.15; this kernel is 6.1.192")
        );
        assert_eq!(r.failures().len(), 2);
        assert_eq!(r.summary(), "kspp: 3 ok, 2 failed, 7 n/a, 0 waived");
    }

    #[test]
    fn version_range_decides_na() {
        let rules = Rules::parse(RULES).unwrap();
        let old = CONFIG.replace("6.1.192", "5.15.3");
        let cfg = KernelConfig::parse(&old).unwrap();
        let r = audit(&rules, &cfg, None, &[]).unwrap();
        // On 5.15 the fallback option exists (and is unset: OK); CFI does not.
        assert_eq!(
            finding(&r, "CONFIG_HARDENED_USERCOPY_FALLBACK").verdict,
            Verdict::Ok
        );
        assert_eq!(
            finding(&r, "CONFIG_CFI_CLANG").verdict,
            Verdict::NotApplicable
        );
        let new = CONFIG.replace("6.1.192", "6.6.0");
        let r = audit(&rules, &KernelConfig::parse(&new).unwrap(), None, &[]).unwrap();
        let f = finding(&r, "CONFIG_RANDOM_KMALLOC_CACHES");
        assert_eq!(f.verdict, Verdict::Fail);
        assert_eq!(f.actual.as_deref(), Some("is not set"));
    }

    #[test]
    fn waiver_turns_fail_into_waived() {
        let rules = Rules::parse(RULES).unwrap();
        let cfg = KernelConfig::parse(CONFIG).unwrap();
        let waivers = vec![
            Waiver {
                option: "CONFIG_CFI_CLANG".into(),
                reason: "clang only; built with gcc".into(),
            },
            Waiver {
                option: "CONFIG_DEVMEM".into(),
                reason: "not needed: passes".into(),
            },
        ];
        let r = audit(&rules, &cfg, None, &waivers).unwrap();
        let f = finding(&r, "CONFIG_CFI_CLANG");
        assert_eq!(f.verdict, Verdict::Waived);
        assert_eq!(f.note.as_deref(), Some("clang only; built with gcc"));
        assert_eq!(
            f.render_line(),
            "WAIVED CONFIG_CFI_CLANG wanted y, got is not set: clang only; built with gcc"
        );
        assert_eq!(r.failures().len(), 1);
        assert_eq!(r.failures()[0].option, "CONFIG_DEFAULT_MMAP_MIN_ADDR");
        assert_eq!(r.unused_waivers, vec!["CONFIG_DEVMEM".to_string()]);
        assert!(
            r.summary().ends_with("1 failed, 7 n/a, 1 waived"),
            "{}",
            r.summary()
        );
    }

    #[test]
    fn waiver_without_reason_is_an_error() {
        let rules = Rules::parse(RULES).unwrap();
        let cfg = KernelConfig::parse(CONFIG).unwrap();
        let w = vec![Waiver {
            option: "CONFIG_CFI_CLANG".into(),
            reason: "  ".into(),
        }];
        let err = audit(&rules, &cfg, None, &w).unwrap_err();
        assert!(err.to_string().contains("has no reason"), "{err}");
        assert!(parse_waivers("waivers:\n  - {option: CONFIG_X}\n").is_err());
        let ok = parse_waivers("waivers:\n  - {option: CONFIG_X, reason: because}\n").unwrap();
        assert_eq!(ok[0].reason, "because");
        let typo = vec![Waiver {
            option: "CONFIG_CFI_CLANGG".into(),
            reason: "x".into(),
        }];
        assert!(audit(&rules, &cfg, None, &typo).is_err());
    }

    #[test]
    fn cmdline_rules() {
        let rules = Rules::parse(RULES).unwrap();
        let cfg = KernelConfig::parse(CONFIG).unwrap();
        let r = audit(
            &rules,
            &cfg,
            Some("console=ttyS0 slab_nomerge init_on_free=0 init_on_free=1 -- pti=on"),
            &[],
        )
        .unwrap();
        assert_eq!(finding(&r, "slab_nomerge").verdict, Verdict::Ok);
        assert_eq!(finding(&r, "init_on_free").verdict, Verdict::Ok);
        let pti = finding(&r, "pti");
        assert_eq!(pti.verdict, Verdict::Fail);
        assert_eq!(pti.actual.as_deref(), Some("absent"));
        assert_eq!(pti.render_line(), "FAIL pti wanted on, got absent: pti");
        let r = audit(&rules, &cfg, Some("init_on_free=0 pti=on"), &[]).unwrap();
        assert_eq!(finding(&r, "init_on_free").verdict, Verdict::Fail);
        assert_eq!(finding(&r, "slab_nomerge").verdict, Verdict::Fail);
        assert_eq!(finding(&r, "pti").verdict, Verdict::Ok);
    }

    #[test]
    fn renders_text_and_json() {
        let rules = Rules::parse(RULES).unwrap();
        let cfg = KernelConfig::parse(CONFIG).unwrap();
        let r = audit(&rules, &cfg, None, &[]).unwrap();
        let text = r.render_text();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "OK   CONFIG_SLAB_FREELIST_HARDENED=y");
        assert_eq!(lines[1], "OK   # CONFIG_DEVMEM is not set");
        assert_eq!(
            lines[2],
            "FAIL CONFIG_DEFAULT_MMAP_MIN_ADDR wanted 65536, got 4096: no low mappings"
        );
        assert_eq!(
            lines[5],
            "N/A  CONFIG_SHADOW_CALL_STACK (arm64 only; this kernel is x86_64)"
        );
        assert_eq!(
            *lines.last().unwrap(),
            "kspp: 3 ok, 2 failed, 7 n/a, 0 waived"
        );
        let json: serde_json::Value = serde_json::from_str(&r.to_json().unwrap()).unwrap();
        let first = &json[2];
        assert_eq!(first["option"], "CONFIG_DEFAULT_MMAP_MIN_ADDR");
        assert_eq!(first["wanted"], "65536");
        assert_eq!(first["actual"], "4096");
        assert_eq!(first["verdict"], "FAIL");
        assert_eq!(first["why"], "no low mappings");
        assert_eq!(json[3]["verdict"], "N/A");
    }

    #[test]
    fn rejects_bad_tables() {
        assert!(Rules::parse("rules:\n  - {option: X, wanted: y, why: w, since: abc}\n").is_err());
        assert!(Rules::parse("rules:\n  - {option: X, wanted: y, why: w, colour: red}\n").is_err());
        assert!(
            Rules::parse("rules:\n  - {option: X, wanted: y, why: w, when: nonsense}\n").is_err()
        );
        let cfg = KernelConfig::parse("CONFIG_A=y\n").unwrap();
        let rules = Rules::parse("rules: []\n").unwrap();
        assert!(
            audit(&rules, &cfg, None, &[]).is_err(),
            "no header, no version"
        );
    }

    /// With the source's Kconfig, existence decides, not the version: an
    /// option backported into an "old" kernel is audited, one the source
    /// does not define is N/A even inside its version range.
    #[test]
    fn kconfig_of_the_source_decides_na() {
        let rules = Rules::parse(
            r#"
rules:
  - {option: CONFIG_PROC_MEM_NO_FORCE, wanted: y, since: "6.12", why: "backported"}
  - {option: CONFIG_RANDOM_KMALLOC_CACHES, wanted: y, since: "6.6", why: "not backported"}
  - {option: CONFIG_SLAB_FREELIST_HARDENED, wanted: y, why: "always there"}
  - {option: CONFIG_HARDENED_USERCOPY_FALLBACK, wanted: is not set, until: "5.15", why: "removed"}
  - {option: CONFIG_SHADOW_CALL_STACK, wanted: y, arch: arm64, why: "arm64"}
  - {option: CONFIG_MODULE_SIG, wanted: y, when: "CONFIG_MODULES=y", why: "modules"}
  - {kind: cmdline, option: cfi, wanted: kcfi, since: "6.2", why: "kcfi"}
"#,
        )
        .unwrap();
        let cfg = KernelConfig::parse(
            "# Linux/x86 6.1.192 Kernel Configuration
CONFIG_X86_64=y
             CONFIG_SLAB_FREELIST_HARDENED=y
",
        )
        .unwrap();
        let mut symbols = KconfigSymbols::default();
        symbols.scan_text(
            "config PROC_MEM_NO_FORCE
config SLAB_FREELIST_HARDENED
             config SHADOW_CALL_STACK
config MODULE_SIG
config MODULES
             config HARDENED_USERCOPY_FALLBACK
",
        );
        symbols.origin = "linux-6.1.192".into();
        let r = audit_with_source(&rules, &cfg, Some(""), &[], Some(&symbols)).unwrap();
        assert_eq!(
            verdicts(&r),
            [
                // 6.12 by version, but 6.1.192 defines it: audited, and fails.
                ("CONFIG_PROC_MEM_NO_FORCE", Verdict::Fail),
                // 6.6+ by version and not in this source: N/A.
                ("CONFIG_RANDOM_KMALLOC_CACHES", Verdict::NotApplicable),
                ("CONFIG_SLAB_FREELIST_HARDENED", Verdict::Ok),
                // "until 5.15", yet the source still has it: audited.
                ("CONFIG_HARDENED_USERCOPY_FALLBACK", Verdict::Ok),
                ("CONFIG_SHADOW_CALL_STACK", Verdict::NotApplicable),
                ("CONFIG_MODULE_SIG", Verdict::NotApplicable),
                // Boot parameters: the version range still decides.
                ("cfi", Verdict::NotApplicable),
            ]
        );
        let note = |o: &str| finding(&r, o).note.clone().unwrap_or_default();
        assert!(note("CONFIG_RANDOM_KMALLOC_CACHES").contains("not defined in the Kconfig"));
        assert!(note("CONFIG_SHADOW_CALL_STACK").contains("arm64 only"));
        assert!(note("CONFIG_MODULE_SIG").contains("only when CONFIG_MODULES=y"));
        assert!(r.basis.contains("linux-6.1.192"), "{}", r.basis);
        assert!(
            r.render_text()
                .contains("N/A decided by the Kconfig of linux-6.1.192")
        );

        // The same config without a source: the version ranges decide, and
        // the backport is missed (what the report then says).
        let r = audit(&rules, &cfg, Some(""), &[]).unwrap();
        assert_eq!(
            finding(&r, "CONFIG_PROC_MEM_NO_FORCE").verdict,
            Verdict::NotApplicable
        );
        assert_eq!(
            finding(&r, "CONFIG_HARDENED_USERCOPY_FALLBACK").verdict,
            Verdict::NotApplicable
        );
        assert!(
            r.render_text()
                .contains("since/until version ranges (no kernel source given)")
        );
    }

    #[test]
    fn shipped_rule_table_parses() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../kernel-config");
        let rules = Rules::load(&dir.join("kspp-rules.yaml")).unwrap();
        assert!(rules.rules.len() > 100);
        let known: HashSet<&str> = rules.rules.iter().map(|r| r.option.as_str()).collect();
        for file in [
            "kspp-waivers.yaml",
            "kspp-waivers-6.1.yaml",
            "arm64/kspp-waivers.yaml",
        ] {
            let waivers = load_waivers(&dir.join(file)).unwrap();
            for w in &waivers {
                assert!(known.contains(w.option.as_str()), "{file}: {}", w.option);
                // The only acceptable waivers: what GCC 12 cannot build.
                assert!(
                    w.reason.contains("Clang") || w.reason.contains("CFI_CLANG"),
                    "{file}: {} is waived for another reason than GCC: {}",
                    w.option,
                    w.reason
                );
            }
        }
        // One rule per option and kind on each architecture (an option may
        // want another value on another architecture), and none both for
        // every architecture and for one.
        let mut seen = HashSet::new();
        for r in &rules.rules {
            assert!(
                seen.insert((r.option.as_str(), r.kind, r.arch.as_deref())),
                "duplicate rule {}",
                r.option
            );
        }
        for r in rules.rules.iter().filter(|r| r.arch.is_some()) {
            assert!(
                !seen.contains(&(r.option.as_str(), r.kind, None)),
                "{} has a rule for every architecture and one for {:?}",
                r.option,
                r.arch
            );
        }
    }
}
