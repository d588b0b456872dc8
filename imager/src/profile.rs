//! Build profiles: one declarative YAML file names every input of an image.
//!
//! Unknown keys and wrong types are errors naming the file, the line and the
//! key. Relative paths in a profile are relative to the profile's directory.
//! `docs/profiles.md` documents every key.

use anyhow::{Context, Result, anyhow, bail};
use serde::{Deserialize, Deserializer};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A size in bytes, written as a number of bytes or with a binary unit
/// (`512KiB`, `100MiB`, `2GiB`, `1TiB`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Size(pub u64);

impl Size {
    pub fn parse(s: &str) -> Result<Size, String> {
        let t = s.trim();
        let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let mult: u64 = match unit.trim() {
            "" | "B" => 1,
            "KiB" => 1 << 10,
            "MiB" => 1 << 20,
            "GiB" => 1 << 30,
            "TiB" => 1 << 40,
            _ => return Err(size_hint(s)),
        };
        num.parse::<u64>()
            .ok()
            .and_then(|n| n.checked_mul(mult))
            .map(Size)
            .ok_or_else(|| size_hint(s))
    }
}

fn size_hint(s: &str) -> String {
    format!("invalid size {s:?}: write a number of bytes or a number with KiB, MiB, GiB or TiB")
}

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Size, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Size;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a size: a number of bytes or a number with KiB, MiB, GiB or TiB")
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Size, E> {
                Ok(Size(v))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Size, E> {
                u64::try_from(v)
                    .map(Size)
                    .map_err(|_| E::custom(size_hint(&v.to_string())))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Size, E> {
                Size::parse(v).map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

/// What the profile says about the kernel.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KernelSection {
    /// Kernel source: a tarball or an unpacked tree. Ignored with `prebuilt`.
    #[serde(default)]
    pub source: Option<PathBuf>,
    /// A prebuilt bzImage; its `.config` must be given as `prebuilt_config`.
    #[serde(default)]
    pub prebuilt: Option<PathBuf>,
    #[serde(default)]
    pub prebuilt_config: Option<PathBuf>,
    /// Config fragments merged in order onto tinyconfig.
    #[serde(default)]
    pub fragments: Vec<PathBuf>,
    /// The KSPP rule table.
    pub rules: PathBuf,
    /// Files of waivers (`- option: …\n  reason: …`).
    #[serde(default)]
    pub waiver_files: Vec<PathBuf>,
    /// Inline waivers.
    #[serde(default)]
    pub waivers: Vec<WaiverEntry>,
    /// Kernel command line, one argument per item.
    #[serde(default)]
    pub cmdline: Vec<String>,
    /// A secret seed for the randstruct GCC plugin (default: derived).
    #[serde(default)]
    pub randstruct_seed: Option<PathBuf>,
    /// The kernel's build timestamp (KBUILD_BUILD_TIMESTAMP), in seconds
    /// since 1970. Kept apart from the image's SOURCE_DATE_EPOCH so that the
    /// cached kernel survives new commits.
    #[serde(default)]
    pub build_epoch: u64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WaiverEntry {
    pub option: String,
    pub reason: String,
}

/// The runtime embedded in the image.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuntimeSection {
    /// Build the runtime from this cargo package directory.
    #[serde(default)]
    pub cargo_package: Option<PathBuf>,
    /// Or use this prebuilt static binary.
    #[serde(default)]
    pub binary: Option<PathBuf>,
    /// Static files of the root filesystem.
    pub skeleton: PathBuf,
    /// The root filesystem's manifest (`rootfs/skeleton.txt`): every
    /// directory and file with its mode; see `contract::skeleton`.
    pub manifest: PathBuf,
}

/// The installer binary of the installer image (output `installer`): the
/// static `imager`, which acts as the installer when run as `installer`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InstallerSection {
    /// Build it from this cargo package directory (the `imager` package).
    #[serde(default)]
    pub cargo_package: Option<PathBuf>,
    /// Or use this prebuilt static binary.
    #[serde(default)]
    pub binary: Option<PathBuf>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BootSection {
    /// systemd-boot's EFI binary.
    #[serde(default = "default_systemd_boot")]
    pub systemd_boot: PathBuf,
}

fn default_systemd_boot() -> PathBuf {
    PathBuf::from("/usr/lib/systemd/boot/efi/systemd-bootx64.efi")
}

impl Default for BootSection {
    fn default() -> Self {
        BootSection {
            systemd_boot: default_systemd_boot(),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiskSection {
    #[serde(default = "default_disk_size")]
    pub size: Size,
    #[serde(default = "default_sector_size")]
    pub sector_size: u64,
    /// Size overrides of the resizable partitions.
    #[serde(default)]
    pub partitions: PartitionSizes,
}

/// Sizes of the partitions a profile may resize (labels as on disk; BIOS and
/// META are fixed, EPHEMERAL takes the rest).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PartitionSizes {
    #[serde(rename = "EFI", default)]
    pub efi: Option<Size>,
    #[serde(rename = "BOOT", default)]
    pub boot: Option<Size>,
    #[serde(rename = "STATE", default)]
    pub state: Option<Size>,
}

fn default_disk_size() -> Size {
    Size(contract::partition::DEFAULT_DISK_SIZE)
}
fn default_sector_size() -> u64 {
    512
}

impl Default for DiskSection {
    fn default() -> Self {
        DiskSection {
            size: default_disk_size(),
            sector_size: default_sector_size(),
            partitions: PartitionSizes::default(),
        }
    }
}

#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct SigningSection {
    /// PKCS#8 PEM ed25519 private key. Without it a development key is used.
    #[serde(default)]
    pub key: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Output {
    /// The raw GPT disk image (`disk.raw`).
    Raw,
    /// The installer container image, an OCI archive (`installer.tar`).
    Installer,
}

impl Output {
    /// The name as written in a profile.
    pub fn name(self) -> &'static str {
        match self {
            Output::Raw => "raw",
            Output::Installer => "installer",
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompressionSection {
    #[serde(default = "default_initramfs_level")]
    pub initramfs_zstd_level: i32,
    #[serde(default = "default_rootfs_level")]
    pub rootfs_zstd_level: i32,
}
fn default_initramfs_level() -> i32 {
    3
}
fn default_rootfs_level() -> i32 {
    15
}
impl Default for CompressionSection {
    fn default() -> Self {
        CompressionSection {
            initramfs_zstd_level: default_initramfs_level(),
            rootfs_zstd_level: default_rootfs_level(),
        }
    }
}

/// A parsed profile, with every relative path made absolute.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    /// Short name: file names, disk identity, os-release `IMAGE_ID`.
    pub name: String,
    /// Human name: os-release `NAME` and boot-entry titles.
    #[serde(default = "default_pretty")]
    pub pretty_name: String,
    pub version: String,
    pub kernel: KernelSection,
    pub runtime: RuntimeSection,
    /// Required with the output `installer`.
    #[serde(default)]
    pub installer: Option<InstallerSection>,
    #[serde(default)]
    pub boot: BootSection,
    #[serde(default)]
    pub disk: DiskSection,
    #[serde(default)]
    pub signing: SigningSection,
    #[serde(default)]
    pub compression: CompressionSection,
    #[serde(default = "default_outputs")]
    pub outputs: Vec<Output>,
    /// Where the profile was read from (not a YAML key).
    #[serde(skip)]
    pub path: PathBuf,
}

fn default_pretty() -> String {
    "Imager".into()
}
fn default_outputs() -> Vec<Output> {
    vec![Output::Raw]
}

impl Profile {
    /// Finds a profile by name (`profiles/NAME.yaml` in this directory or a
    /// parent) or by path.
    pub fn locate(name_or_path: &str) -> Result<PathBuf> {
        let p = Path::new(name_or_path);
        if name_or_path.contains('/') || name_or_path.ends_with(".yaml") {
            if p.is_file() {
                return Ok(p.to_path_buf());
            }
            bail!("profile {name_or_path} not found");
        }
        let cwd = std::env::current_dir().context("reading the current directory")?;
        for dir in cwd.ancestors() {
            let cand = dir.join("profiles").join(format!("{name_or_path}.yaml"));
            if cand.is_file() {
                return Ok(cand);
            }
        }
        bail!(
            "profile {name_or_path:?} not found in profiles/ of {} or a parent directory: \
             pass --profile PATH to a profile file",
            cwd.display()
        )
    }

    pub fn load(path: &Path) -> Result<Profile> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading profile {}", path.display()))?;
        Profile::parse(&text, path)
    }

    /// Parses profile text; `path` is used for messages and relative paths.
    pub fn parse(text: &str, path: &Path) -> Result<Profile> {
        let mut p: Profile = serde_yaml::from_str(text)
            .map_err(|e| anyhow!("profile {}: {}", path.display(), describe_yaml_error(&e)))?;
        let base = path
            .parent()
            .filter(|b| !b.as_os_str().is_empty())
            .unwrap_or(Path::new("."))
            .to_path_buf();
        let base = std::fs::canonicalize(&base).unwrap_or(base);
        p.path = path.to_path_buf();
        p.resolve(&base);
        p.validate()
            .map_err(|e| anyhow!("profile {}: {e}", path.display()))?;
        Ok(p)
    }

    fn resolve(&mut self, base: &Path) {
        let abs = |p: &mut PathBuf| {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        };
        let k = &mut self.kernel;
        for p in k
            .source
            .iter_mut()
            .chain(k.prebuilt.iter_mut())
            .chain(k.prebuilt_config.iter_mut())
            .chain(k.fragments.iter_mut())
            .chain(std::iter::once(&mut k.rules))
            .chain(k.waiver_files.iter_mut())
            .chain(k.randstruct_seed.iter_mut())
        {
            abs(p);
        }
        let r = &mut self.runtime;
        for p in r
            .cargo_package
            .iter_mut()
            .chain(r.binary.iter_mut())
            .chain([&mut r.skeleton, &mut r.manifest])
        {
            abs(p);
        }
        if let Some(i) = self.installer.as_mut() {
            for p in i.cargo_package.iter_mut().chain(i.binary.iter_mut()) {
                abs(p);
            }
        }
        abs(&mut self.boot.systemd_boot);
        if let Some(k) = self.signing.key.as_mut() {
            abs(k);
        }
    }

    fn validate(&self) -> Result<(), String> {
        let name_ok = !self.name.is_empty()
            && self
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        if !name_ok {
            return Err(format!(
                "name {:?}: use letters, digits, '-' and '_' only",
                self.name
            ));
        }
        if self
            .pretty_name
            .chars()
            .any(|c| c.is_control() || matches!(c, '"' | '\\' | '$' | '`'))
        {
            return Err(format!(
                "pretty_name {:?}: no control characters, quotes, backslashes, $ or `",
                self.pretty_name
            ));
        }
        if self.version.is_empty() || self.version.chars().any(char::is_whitespace) {
            return Err(format!(
                "version {:?}: must be non-empty, without spaces",
                self.version
            ));
        }
        match (&self.kernel.source, &self.kernel.prebuilt) {
            (None, None) => return Err("kernel: give either source or prebuilt".into()),
            (Some(_), Some(_)) => {
                return Err("kernel: give source or prebuilt, not both".into());
            }
            (None, Some(_)) if self.kernel.prebuilt_config.is_none() => {
                return Err("kernel.prebuilt needs kernel.prebuilt_config (its .config)".into());
            }
            _ => {}
        }
        if self.kernel.source.is_some() && self.kernel.fragments.is_empty() {
            return Err("kernel.fragments: a kernel built from source needs fragments".into());
        }
        match (&self.runtime.cargo_package, &self.runtime.binary) {
            (None, None) | (Some(_), Some(_)) => {
                return Err("runtime: give exactly one of cargo_package or binary".into());
            }
            _ => {}
        }
        if self.outputs.is_empty() {
            return Err("outputs: name at least one output (raw, installer)".into());
        }
        let mut seen = std::collections::BTreeSet::new();
        if let Some(o) = self.outputs.iter().find(|o| !seen.insert(**o)) {
            return Err(format!("outputs: {} is listed twice", o.name()));
        }
        match &self.installer {
            Some(i) if i.cargo_package.is_some() == i.binary.is_some() => {
                return Err("installer: give exactly one of cargo_package or binary".into());
            }
            None if self.outputs.contains(&Output::Installer) => {
                return Err(
                    "outputs: installer needs an installer section naming the installer \
                            binary: installer: { cargo_package: ../imager }"
                        .into(),
                );
            }
            _ => {}
        }
        if self.outputs.contains(&Output::Installer) {
            crate::oci::check_tag(&self.version).map_err(|e| format!("version: {e}"))?;
        }
        if !contract::partition::SECTOR_SIZES.contains(&self.disk.sector_size) {
            return Err(format!(
                "disk.sector_size {}: must be 512 or 4096",
                self.disk.sector_size
            ));
        }
        for w in &self.kernel.waivers {
            if w.reason.trim().is_empty() {
                return Err(format!(
                    "kernel.waivers: waiver of {} has no reason: write why",
                    w.option
                ));
            }
        }
        for arg in &self.kernel.cmdline {
            if arg.is_empty() || arg.chars().any(char::is_whitespace) {
                return Err(format!(
                    "kernel.cmdline: {arg:?} is not one argument: write one argument per item"
                ));
            }
        }
        Ok(())
    }

    /// The kernel command line as one string.
    pub fn cmdline(&self) -> String {
        self.kernel.cmdline.join(" ")
    }

    /// Partition size overrides in bytes, by label.
    pub fn partition_sizes(&self) -> BTreeMap<String, u64> {
        let p = &self.disk.partitions;
        [("EFI", p.efi), ("BOOT", p.boot), ("STATE", p.state)]
            .into_iter()
            .filter_map(|(label, size)| size.map(|s| (label.to_string(), s.0)))
            .collect()
    }
}

/// serde_yaml's message with the location spelled out: "line L column C: key: msg".
fn describe_yaml_error(e: &serde_yaml::Error) -> String {
    let msg = crate::input::serde_message(&e.to_string());
    match e.location() {
        Some(loc) => {
            // serde_yaml appends " at line L column C"; move it to the front.
            let tail = format!(" at line {} column {}", loc.line(), loc.column());
            let body = msg.strip_suffix(&tail).unwrap_or(&msg);
            format!("line {} column {}: {body}", loc.line(), loc.column())
        }
        None => msg,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "\
name: metal
version: 1.0.0
kernel:
  source: /usr/src/linux.tar.xz
  fragments: [frag.config]
  rules: rules.yaml
  cmdline: [console=ttyS0, slab_nomerge]
runtime:
  cargo_package: ../rootfs
  skeleton: ../rootfs/skeleton
  manifest: ../rootfs/skeleton.txt
disk:
  size: 2GiB
  partitions:
    BOOT: 200MiB
";

    fn parse(text: &str) -> Result<Profile> {
        Profile::parse(text, Path::new("/p/profiles/test.yaml"))
    }

    #[test]
    fn parses_and_resolves_relative_paths() {
        let p = parse(GOOD).unwrap();
        assert_eq!(p.disk.size, Size(2 << 30));
        assert_eq!(p.partition_sizes()["BOOT"], 200 << 20);
        assert_eq!(p.kernel.rules, Path::new("/p/profiles/rules.yaml"));
        assert_eq!(
            p.runtime.cargo_package.as_deref(),
            Some(Path::new("/p/profiles/../rootfs"))
        );
        assert_eq!(p.cmdline(), "console=ttyS0 slab_nomerge");
        assert_eq!(p.outputs, vec![Output::Raw]);
    }

    #[test]
    fn unknown_key_names_file_line_and_key() {
        let bad = GOOD.replace("  rules: rules.yaml", "  rules: rules.yaml\n  sorce: x");
        let e = parse(&bad).unwrap_err().to_string();
        assert!(e.contains("/p/profiles/test.yaml"), "{e}");
        assert!(e.contains("line 7"), "{e}");
        assert!(e.contains("sorce"), "{e}");
    }

    #[test]
    fn wrong_type_names_file_line_and_key() {
        let bad = GOOD.replace("  size: 2GiB", "  size: [1, 2]");
        let e = parse(&bad).unwrap_err().to_string();
        assert!(e.contains("test.yaml") && e.contains("line 13"), "{e}");
        assert!(e.contains("disk.size"), "{e}");
        let bad = GOOD.replace("  size: 2GiB", "  size: 2GB");
        let e = parse(&bad).unwrap_err().to_string();
        assert!(e.contains("KiB, MiB, GiB"), "{e}");
        let bad = GOOD.replace("version: 1.0.0", "version: [1]");
        let e = parse(&bad).unwrap_err().to_string();
        assert!(e.contains("line 2") && e.contains("version"), "{e}");
    }

    #[test]
    fn semantic_errors() {
        let e = parse(&GOOD.replace("name: metal", "name: my image"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("letters, digits"), "{e}");
        let e = parse(&GOOD.replace("  cargo_package: ../rootfs\n", ""))
            .unwrap_err()
            .to_string();
        assert!(e.contains("exactly one of cargo_package or binary"), "{e}");
        let e = parse(&GOOD.replace("[console=ttyS0, slab_nomerge]", "[\"a b\"]"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("one argument per item"), "{e}");
    }

    #[test]
    fn unknown_partition_names_file_line_and_key() {
        let bad = GOOD.replace("    BOOT: 200MiB", "    ESP: 200MiB");
        let e = parse(&bad).unwrap_err().to_string();
        assert!(
            e.contains("test.yaml") && e.contains("ESP") && e.contains("line"),
            "{e}"
        );
    }

    #[test]
    fn installer_output_needs_its_binary() {
        let with = |extra: &str| parse(&format!("{GOOD}{extra}"));
        let p =
            with("outputs: [raw, installer]\ninstaller:\n  cargo_package: ../imager\n").unwrap();
        assert_eq!(p.outputs, vec![Output::Raw, Output::Installer]);
        let i = p.installer.unwrap();
        assert_eq!(
            i.cargo_package.as_deref(),
            Some(Path::new("/p/profiles/../imager"))
        );
        let e = with("outputs: [installer]\n").unwrap_err().to_string();
        assert!(e.contains("installer: { cargo_package: ../imager }"), "{e}");
        let e = with("outputs: [installer]\ninstaller: { cargo_package: a, binary: b }\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("exactly one of cargo_package or binary"), "{e}");
        let e = with("outputs: [installer]\ninstaller: { cargo: a }\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 17") && e.contains("cargo"), "{e}");
        let e = with("outputs: [iso]\n").unwrap_err().to_string();
        assert!(e.contains("line 16") && e.contains("iso"), "{e}");
        let e = with("outputs: [raw, raw]\n").unwrap_err().to_string();
        assert!(e.contains("raw is listed twice"), "{e}");
        let e = with("outputs: []\n").unwrap_err().to_string();
        assert!(e.contains("at least one output"), "{e}");
        // The version becomes the image's tag.
        let bad = GOOD.replace("version: 1.0.0", "version: 1.0.0+build");
        let e = parse(&format!(
            "{bad}outputs: [installer]\ninstaller: {{ binary: /bin/imager }}\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains("version") && e.contains("tag"), "{e}");
    }

    /// `profiles/installer.yaml` builds the system of `profiles/metal.yaml`:
    /// it may differ only in its outputs and installer section.
    #[test]
    fn installer_profile_is_metal_plus_the_installer() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../profiles");
        let metal = Profile::load(&dir.join("metal.yaml")).unwrap();
        let mut inst = Profile::load(&dir.join("installer.yaml")).unwrap();
        assert_eq!(inst.outputs, vec![Output::Raw, Output::Installer]);
        let pkg = inst.installer.take().unwrap().cargo_package.unwrap();
        assert_eq!(
            std::fs::canonicalize(pkg).unwrap(),
            std::fs::canonicalize(Path::new(env!("CARGO_MANIFEST_DIR"))).unwrap()
        );
        inst.outputs = metal.outputs.clone();
        inst.path = metal.path.clone();
        assert_eq!(format!("{inst:?}"), format!("{metal:?}"));
    }

    #[test]
    fn sizes() {
        assert_eq!(Size::parse("512"), Ok(Size(512)));
        assert_eq!(Size::parse("1KiB"), Ok(Size(1024)));
        assert!(Size::parse("1GB").is_err());
        assert!(Size::parse("99999999999TiB").is_err());
        assert!(Size::parse("").is_err());
    }
}
