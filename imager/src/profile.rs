//! Build profiles: one declarative YAML file names every input of an image.
//!
//! Every error names the file, the line and the key, and quotes at most a
//! short excerpt of a value ([`crate::secret::excerpt`]). The text is
//! bounded before it is parsed ([`scan`]: size, nesting, no anchors or
//! aliases, not a private key), and every value is checked before a build
//! writes anything. Relative paths in a profile are relative to the
//! profile's directory. `docs/profiles.md` documents every key and check.

mod lines;
pub mod scan;
mod sections;
#[cfg(test)]
mod tests;

use crate::secret::excerpt;
use anyhow::{Context, Result, anyhow, bail};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub use sections::*;

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
    /// The security version signed into the payload's manifest (0: none):
    /// raise it with each release that fixes a vulnerability, and disks
    /// that blessed it refuse older payloads without an admin's
    /// `--allow-downgrade` (docs/signing.md, "Security versions").
    #[serde(default)]
    pub security_version: u64,
    /// The `arch` key as written (checked into [`Profile::arch`]).
    #[serde(default, rename = "arch")]
    arch_name: Option<String>,
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
    /// The live system of the output `iso`.
    #[serde(default)]
    pub live: LiveSection,
    /// Secure Boot with our own keys: the slots boot signed UKIs.
    #[serde(default)]
    pub secure_boot: Option<SecureBootSection>,
    /// The node's IPv4 address (`machined.net=`); none: no network.
    #[serde(default)]
    pub network: Option<NetworkSection>,
    /// The node API: the cluster CA the image carries.
    #[serde(default)]
    pub node_api: Option<NodeApiSection>,
    /// A build cache shared through a registry.
    #[serde(default)]
    pub cache: Option<CacheSection>,
    #[serde(default = "default_outputs")]
    pub outputs: Vec<Output>,
    /// Where the profile was read from (not a YAML key).
    #[serde(skip)]
    pub path: PathBuf,
    /// The `network` section, checked (not a YAML key).
    #[serde(skip)]
    pub net: Option<contract::net::NetConfig>,
    /// The `live` section's node settings, checked (not a YAML key).
    #[serde(skip)]
    pub live_settings: Option<contract::settings::Settings>,
    /// The architecture the image is built for, of the `arch` key:
    /// `amd64` (the default) or `arm64`, cross-built (docs/arm64.md;
    /// `contract::arch` decides what differs).
    #[serde(skip)]
    pub arch: contract::Arch,
}

fn default_pretty() -> String {
    "Imager".into()
}
fn default_outputs() -> Vec<Output> {
    vec![Output::Raw]
}

/// The most keys `signing.cosigners` names.
pub const MAX_COSIGNERS: usize = 8;

impl Profile {
    /// Finds a profile by name (`profiles/NAME.yaml` in this directory or a
    /// parent) or by path. A path that exists but cannot be used (a
    /// symbolic link loop, a directory, unreadable) is reported as such,
    /// not as missing.
    pub fn locate(name_or_path: &str) -> Result<PathBuf> {
        let p = Path::new(name_or_path);
        if name_or_path.contains('/') || name_or_path.ends_with(".yaml") {
            return match scan::usable_file(p) {
                Ok(true) => Ok(p.to_path_buf()),
                Ok(false) => bail!(
                    "profile {name_or_path} not found: pass --profile PATH to a profile file, \
                     or a name from profiles/"
                ),
                Err(e) => bail!("profile {name_or_path} {e}"),
            };
        }
        let cwd = std::env::current_dir().context("reading the current directory")?;
        for dir in cwd.ancestors() {
            let cand = dir.join("profiles").join(format!("{name_or_path}.yaml"));
            match scan::usable_file(&cand) {
                Ok(true) => return Ok(cand),
                Ok(false) => {}
                Err(e) => bail!("profile {} {e}", cand.display()),
            }
        }
        bail!(
            "profile {name_or_path:?} not found in profiles/ of {} or a parent directory: \
             pass --profile PATH to a profile file",
            cwd.display()
        )
    }

    /// Reads and parses the profile at `path` (at most [`scan::MAX_BYTES`]
    /// of it).
    pub fn load(path: &Path) -> Result<Profile> {
        let bytes = scan::read(path).map_err(|e| anyhow!("profile {} {e}", path.display()))?;
        Profile::parse_bytes(&bytes, path)
    }

    /// Parses profile text; `path` is used for messages and relative paths.
    pub fn parse(text: &str, path: &Path) -> Result<Profile> {
        Profile::parse_bytes(text.as_bytes(), path)
    }

    /// Parses the bytes of a profile file, whatever they are: the bounds of
    /// [`scan`] first, then YAML, then every value's check. The entry of
    /// [`Profile::load`] and of the fuzz target.
    pub fn parse_bytes(bytes: &[u8], path: &Path) -> Result<Profile> {
        let fail = |msg: String| anyhow!("profile {}: {msg}", path.display());
        if crate::secret::looks_like_private_key(bytes) {
            bail!(
                "{} looks like a private key, not a profile: check --profile",
                path.display()
            );
        }
        let text = scan::check(bytes).map_err(fail)?;
        let mut p: Profile =
            serde_yaml::from_str(text).map_err(|e| fail(describe_yaml_error(&e)))?;
        let base = path
            .parent()
            .filter(|b| !b.as_os_str().is_empty())
            .unwrap_or(Path::new("."))
            .to_path_buf();
        let base = std::fs::canonicalize(&base).unwrap_or(base);
        p.path = path.to_path_buf();
        p.resolve(&base);
        p.validate().map_err(|Invalid { key, msg }| {
            fail(match lines::line_of(text, &key) {
                Some(line) => format!("line {line}: {key}: {msg}"),
                None => format!("{key}: {msg}"),
            })
        })?;
        Ok(p)
    }

    fn resolve(&mut self, base: &Path) {
        let abs = |p: &mut PathBuf| {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        };
        // A key file's path and an external signer's program path (one
        // with a `/`; a bare name is looked up on PATH) are relative to
        // the profile; a PKCS#11 URI is as written.
        let key_ref = |p: &mut PathBuf| match crate::sign::KeyRef::parse(p) {
            crate::sign::KeyRef::File(_) => abs(p),
            crate::sign::KeyRef::Exec(program)
                if program.is_relative() && program.components().count() > 1 =>
            {
                *p = PathBuf::from(format!("exec:{}", base.join(program).display()));
            }
            _ => {}
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
            .chain(k.firmware.iter_mut())
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
        // An empty path is one left out: its default follows the
        // architecture (`validate`).
        for p in [&mut self.boot.systemd_boot, &mut self.boot.stub] {
            if !p.as_os_str().is_empty() {
                abs(p);
            }
        }
        abs(&mut self.boot.grub_dir);
        if let Some(sb) = self.secure_boot.as_mut() {
            if let Some(k) = sb.keys.as_mut() {
                abs(k);
            }
            for k in sb.signers.values_mut() {
                key_ref(k);
            }
            sb.updates.iter_mut().for_each(abs);
        }
        if let Some(k) = self.signing.key.as_mut() {
            key_ref(k);
        }
        for k in &mut self.signing.cosigners {
            key_ref(k);
        }
        if let Some(r) = self.signing.root.as_mut() {
            abs(r);
        }
        if let Some(ca) = self.node_api.as_mut().and_then(|n| n.ca.as_mut()) {
            abs(ca);
        }
        if let Some(c) = self.cache.as_mut() {
            for k in &mut c.trusted_keys {
                abs(k);
            }
            if let Some(ca) = c.ca.as_mut() {
                abs(ca);
            }
        }
    }

    /// Checks every value; the error names the key path (`kernel.cmdline[2]`).
    /// Sets [`Profile::net`] from the `network` section.
    fn validate(&mut self) -> Result<(), Invalid> {
        let name_ok = !self.name.is_empty()
            && self.name.len() <= MAX_NAME
            && self
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        if !name_ok {
            return invalid(
                "name",
                format!(
                    "{}: use 1 to {MAX_NAME} letters, digits, '-' and '_'",
                    excerpt(&self.name)
                ),
            );
        }
        if self.pretty_name.chars().count() > MAX_PRETTY_NAME
            || self
                .pretty_name
                .chars()
                .any(|c| c.is_control() || matches!(c, '"' | '\\' | '$' | '`'))
        {
            return invalid(
                "pretty_name",
                format!(
                    "{}: at most {MAX_PRETTY_NAME} characters, no control characters, quotes, \
                     backslashes, $ or `",
                    excerpt(&self.pretty_name)
                ),
            );
        }
        check_version(&self.version).map_err(|msg| Invalid::new("version", msg))?;
        if let Some(name) = &self.arch_name {
            self.arch = contract::Arch::parse(name).map_err(|msg| Invalid::new("arch", msg))?;
        }
        self.boot.fill_defaults(self.arch);
        if self.signing.cosigners.len() > MAX_COSIGNERS {
            return Err(Invalid::new(
                "signing.cosigners",
                format!(
                    "{} co-signers: at most {MAX_COSIGNERS} (a root of trust's threshold is \
                     rarely more than 3)",
                    self.signing.cosigners.len()
                ),
            ));
        }
        match (&self.kernel.source, &self.kernel.prebuilt) {
            (None, None) => return invalid("kernel", "give either source or prebuilt"),
            (Some(_), Some(_)) => {
                return invalid("kernel.prebuilt", "give source or prebuilt, not both");
            }
            (None, Some(_)) if self.kernel.prebuilt_config.is_none() => {
                return invalid(
                    "kernel.prebuilt",
                    "kernel.prebuilt needs kernel.prebuilt_config (its .config)",
                );
            }
            _ => {}
        }
        if self.kernel.source.is_some() && self.kernel.fragments.is_empty() {
            return invalid(
                "kernel.fragments",
                "a kernel built from source needs fragments",
            );
        }
        match (&self.runtime.cargo_package, &self.runtime.binary) {
            (None, None) | (Some(_), Some(_)) => {
                return invalid("runtime", "give exactly one of cargo_package or binary");
            }
            _ => {}
        }
        if self.outputs.is_empty() {
            return invalid(
                "outputs",
                "name at least one output (raw, vhd, qcow2, raw.zst, raw.xz, installer, iso, uki)",
            );
        }
        let mut seen = std::collections::BTreeSet::new();
        if let Some(i) = self.outputs.iter().position(|o| !seen.insert(*o)) {
            return invalid(
                format!("outputs[{i}]"),
                format!("{} is listed twice", self.outputs[i].name()),
            );
        }
        match &self.installer {
            Some(i) if i.cargo_package.is_some() == i.binary.is_some() => {
                return invalid("installer", "give exactly one of cargo_package or binary");
            }
            None if self.outputs.contains(&Output::Installer) => {
                return invalid(
                    "outputs",
                    "installer needs an installer section naming the installer binary: \
                     installer: { cargo_package: ../imager }",
                );
            }
            None if self.outputs.contains(&Output::Iso) => {
                return invalid(
                    "outputs",
                    "iso needs an installer section naming the installer binary (the live \
                     system installs with it): installer: { cargo_package: ../imager }",
                );
            }
            _ => {}
        }
        if let Some(sb) = &self.secure_boot
            && !contract::boot::ENROLL_MODES.contains(&sb.enroll_mode())
        {
            return invalid(
                "secure_boot.enroll",
                "systemd-boot's secure-boot-enroll is one of off, manual, force",
            );
        }
        if self.outputs.contains(&Output::Installer) {
            let given = self.installer.as_ref().and_then(|i| i.image.as_deref());
            if given.is_none_or(|g| !has_tag(g)) {
                crate::oci::check_tag(&self.version)
                    .map_err(|_| Invalid::new("version", version_tag_hint(&self.version)))?;
            }
            check_installer_image(&self.installer_image())
                .map_err(|e| Invalid::new("installer.image", e))?;
        }
        if self.outputs.contains(&Output::Vhd) {
            use crate::disk::platform::{VHD_SIZE_RULE, check_disk};
            check_disk(self, Output::Vhd, "a cloud", 1 << 20, VHD_SIZE_RULE)
                .map_err(|(key, msg)| Invalid::new(key, msg))?;
        }
        crate::disk::platform::check(self).map_err(|(key, msg)| Invalid::new(key, msg))?;
        if !contract::partition::SECTOR_SIZES.contains(&self.disk.sector_size) {
            return invalid(
                "disk.sector_size",
                format!("{}: must be 512 or 4096", self.disk.sector_size),
            );
        }
        if self.disk.bios_boot_flag && !self.bios_boot() {
            return invalid(
                "disk.bios_boot_flag",
                "a 4096-byte-sector image has no BIOS boot (BIOS firmware reads 512-byte \
                 sectors; see docs/design.md): remove the flag or use disk.sector_size 512",
            );
        }
        for (i, w) in self.kernel.waivers.iter().enumerate() {
            if w.option.is_empty() || w.option.chars().any(|c| c.is_control()) {
                return invalid(
                    format!("kernel.waivers[{i}].option"),
                    format!("{}: name a config option", excerpt(&w.option)),
                );
            }
            if w.reason.trim().is_empty() {
                return invalid(
                    format!("kernel.waivers[{i}].reason"),
                    format!("waiver of {} has no reason: write why", excerpt(&w.option)),
                );
            }
        }
        if let Some(r) = self.cache.as_ref().and_then(|c| c.registry.as_ref()) {
            crate::remote_cache::check_repository(r)
                .map_err(|e| Invalid::new("cache.registry", format!("{e:#}")))?;
        }
        self.net = self.check_network()?;
        self.live_settings = self.check_live_settings()?;
        if let Some(n) = &self.node_api {
            for (i, r) in n.plain_http_registries.iter().enumerate() {
                contract::cmdline::check_registry(r)
                    .map_err(|e| Invalid::new(format!("node_api.plain_http_registries[{i}]"), e))?;
            }
        }
        self.check_cmdline()?;
        self.check_live()?;
        let c = &self.compression;
        let levels = [
            (
                "compression.initramfs_zstd_level",
                c.initramfs_zstd_level,
                crate::initramfs::MAX_LEVEL,
            ),
            (
                "compression.rootfs_zstd_level",
                c.rootfs_zstd_level,
                MAX_ROOTFS_LEVEL,
            ),
        ];
        for (key, level, max) in levels {
            if !(1..=max).contains(&level) {
                return invalid(key, format!("{level} is out of range: use 1 to {max}"));
            }
        }
        Ok(())
    }

    /// `live`: only with the output `iso`; the install target one plain
    /// kernel argument value.
    fn check_live(&self) -> Result<(), Invalid> {
        let l = &self.live;
        if (l.install.is_some() || l.wipe) && !self.outputs.contains(&Output::Iso) {
            return invalid(
                "live",
                "the live section is for the output iso: add iso to outputs, or remove it",
            );
        }
        if l.wipe && l.install.is_none() {
            return invalid("live.wipe", "wipe without live.install: name the disk");
        }
        for (key, v) in [
            ("live.hostname", &l.hostname),
            ("live.net", &l.net),
            ("live.dns", &l.dns),
        ] {
            if v.is_some() && l.install.is_none() {
                return invalid(
                    key,
                    "the installed node's settings without live.install: name the disk",
                );
            }
        }
        if let Some(t) = &l.install {
            // The runtime's own parser; and one plain kernel argument.
            let plain = t
                .bytes()
                .all(|b| b.is_ascii_graphic() && !b"\"'\\$`".contains(&b));
            let parsed = contract::cmdline::parse_install_target(t);
            if !plain || parsed.is_err() {
                let why = parsed.err().unwrap_or_else(|| {
                    "no spaces, quotes, backslashes, $ or ` in a kernel argument".to_string()
                });
                return invalid(
                    "live.install",
                    format!(
                        "{}: {why}; name a disk as vdb, /dev/vdb, serial:SERIAL, wwn:WWN or \
                         /dev/disk/by-id/NAME",
                        excerpt(t)
                    ),
                );
            }
        }
        Ok(())
    }

    /// `live.hostname`, `live.net` and `live.dns` with the runtime's own
    /// parser (the same the live installer runs).
    fn check_live_settings(&self) -> Result<Option<contract::settings::Settings>, Invalid> {
        let l = &self.live;
        // Each is one kernel argument's value.
        for (key, _, v) in l.settings_args() {
            if !v.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(Invalid::new(
                    key,
                    format!("{}: no spaces or control characters", excerpt(v)),
                ));
            }
        }
        contract::settings::Settings::from_values(
            l.hostname.as_deref(),
            contract::cmdline::INSTALL_NET,
            l.net.as_deref(),
            l.dns.as_deref(),
        )
        .map_err(|e| Invalid::new("live", e))
    }

    /// `network`: each key with the runtime's own parser
    /// ([`contract::net`]), then the combination (the gateway in the
    /// subnet), named at the gateway.
    fn check_network(&self) -> Result<Option<contract::net::NetConfig>, Invalid> {
        use contract::net;
        let Some(n) = &self.network else {
            return Ok(None);
        };
        net::parse_interface(&n.interface).map_err(|e| Invalid::new("network.interface", e))?;
        let address = match (&n.address, n.dhcp) {
            (None, true) if n.gateway.is_none() => {
                return net::NetConfig::dhcp(&n.interface)
                    .map(Some)
                    .map_err(|e| Invalid::new("network.interface", e));
            }
            (None, true) => {
                return Err(Invalid::new(
                    "network.gateway",
                    "a gateway with dhcp: true: the lease gives the router; remove gateway",
                ));
            }
            (Some(_), true) => {
                return Err(Invalid::new(
                    "network.dhcp",
                    "dhcp: true and an address: give one of them",
                ));
            }
            (None, false) => {
                return Err(Invalid::new(
                    "network",
                    "neither dhcp: true nor an address: write dhcp: true, or address: \
                     ADDRESS/PREFIX (10.0.2.15/24)",
                ));
            }
            (Some(a), false) => a,
        };
        let (address, prefix) = net::parse_address(address).map_err(|e| {
            Invalid::new(
                "network.address",
                format!("{e}; write ADDRESS/PREFIX, e.g. 10.0.2.15/24"),
            )
        })?;
        let gateway = match &n.gateway {
            Some(g) => Some(net::parse_gateway(g).map_err(|e| Invalid::new("network.gateway", e))?),
            None => None,
        };
        net::NetConfig::new(&n.interface, address, prefix, gateway)
            .map(Some)
            .map_err(|e| Invalid::new("network.gateway", e))
    }

    /// Each argument printable ASCII without spaces; the whole line, with
    /// what the boot path adds, within what the kernel takes.
    fn check_cmdline(&self) -> Result<(), Invalid> {
        for (i, arg) in self.kernel.cmdline.iter().enumerate() {
            let key = || format!("kernel.cmdline[{i}]");
            // Keys the boot path sets: given here, they would override it
            // (the last value on the line wins).
            let name = arg.split('=').next().unwrap_or(arg);
            if RESERVED_CMDLINE.contains(&name) {
                return invalid(
                    key(),
                    format!(
                        "{name} is set by the boot entries (the slot, GRUB's trial), by the \
                         live section (live.install, live.wipe), by the network section or by \
                         node_api.plain_http_registries: remove it"
                    ),
                );
            }
            if arg.is_empty() || arg.chars().any(char::is_whitespace) {
                return invalid(
                    key(),
                    format!(
                        "{} is not one argument: write one argument per item",
                        excerpt(arg)
                    ),
                );
            }
            if !arg.bytes().all(|b| b.is_ascii_graphic()) {
                return invalid(
                    key(),
                    format!(
                        "{}: a kernel argument is printable ASCII (no control characters, \
                         no other characters)",
                        excerpt(arg)
                    ),
                );
            }
            if arg.matches('"').count() % 2 != 0 {
                return invalid(
                    key(),
                    format!(
                        "{}: an unpaired `\"` would join the arguments after it: remove it",
                        excerpt(arg)
                    ),
                );
            }
            // grub.cfg is on every BOOT (and installs lay out 512-byte
            // sectors, which boot under BIOS), whatever this image's sectors.
            if let Some(c) = contract::grub::unpassable(arg) {
                return invalid(
                    key(),
                    format!(
                        "{}: GRUB, which boots the image under BIOS, passes `{c}` to the \
                         kernel escaped with a backslash, so the kernel would see another \
                         argument: remove it",
                        excerpt(arg)
                    ),
                );
            }
        }
        let cmdline = self.cmdline();
        // The build adds the root hash (` machined.verity=<64 hex>`).
        let loaded = crate::boot::loaded_cmdline_len(&cmdline) + contract::cmdline::VERITY_ARG_LEN;
        if loaded > contract::cmdline::MAX_LEN {
            let added = loaded.saturating_sub(cmdline.len());
            return invalid(
                "kernel.cmdline",
                format!(
                    "the command line is {} bytes (the items joined by spaces, and the network \
                     section's {}=…); the kernel \
                     takes {} bytes in all, of which the build and the boot entry add {added} \
                     (` {}=<root hash>`, ` {}=A` and systemd-boot's ` initrd=…`), so these items may take at most {} bytes: \
                     shorten or remove some (a longer line is cut short at boot and the image \
                     never reaches ready)",
                    cmdline.len(),
                    contract::cmdline::NET,
                    contract::cmdline::MAX_LEN,
                    contract::cmdline::VERITY,
                    contract::cmdline::SLOT,
                    contract::cmdline::MAX_LEN.saturating_sub(added),
                ),
            );
        }
        Ok(())
    }

    /// Whether the raw image boots under BIOS too (GRUB): amd64 at
    /// 512-byte sectors only (arm64 is UEFI only, `contract::arch`).
    pub fn bios_boot(&self) -> bool {
        self.arch.spec().bios && self.disk.sector_size == 512 && !self.uki_slots()
    }

    /// Whether the slots boot UKIs: `boot.uki`, or Secure Boot.
    pub fn uki_slots(&self) -> bool {
        self.boot.uki || self.secure_boot.is_some()
    }

    /// The default output directory's name under `out/`: the profile's
    /// name, with `-<arch>` for another architecture than amd64 (`metal`,
    /// `metal-arm64`).
    pub fn default_out_name(&self) -> String {
        match self.arch {
            contract::Arch::Amd64 => self.name.clone(),
            a => format!("{}-{a}", self.name),
        }
    }

    /// The installer image's full reference name (`installer.image`, its
    /// tag defaulting to the version; or `localhost/NAME/installer:VERSION`).
    pub fn installer_image(&self) -> String {
        match self.installer.as_ref().and_then(|i| i.image.as_deref()) {
            Some(i) if has_tag(i) => i.to_string(),
            Some(i) => format!("{i}:{}", self.version),
            None => format!(
                "localhost/{}/installer:{}",
                repository_component(&self.name),
                self.version
            ),
        }
    }

    /// Whether the build lays out a disk: for the output `raw` or a
    /// format made from it (`vhd`, `qcow2`, `raw.zst`, `raw.xz`).
    pub fn makes_disk(&self) -> bool {
        self.outputs.iter().any(|o| o.is_disk())
    }

    /// Whether the build makes the slots' UKIs: for the output `uki`, or
    /// because the slots boot them.
    pub fn makes_ukis(&self) -> bool {
        self.uki_slots() || self.outputs.contains(&Output::Uki)
    }

    /// The kernel command line as one string: `kernel.cmdline`'s items,
    /// then the `network` section's `machined.net=` (the build adds the
    /// root hash, the boot entries the slot).
    pub fn cmdline(&self) -> String {
        let mut items = self.kernel.cmdline.clone();
        items.extend(self.net.as_ref().map(contract::net::NetConfig::arg));
        if let Some(n) = self
            .node_api
            .as_ref()
            .filter(|n| !n.plain_http_registries.is_empty())
        {
            items.push(contract::cmdline::plain_http_arg(&n.plain_http_registries));
        }
        items.join(" ")
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

/// Kernel command-line keys the profile's `kernel.cmdline` may not carry:
/// the boot entries, the build (the root hash), the live ISO and the
/// `network` section set them.
const RESERVED_CMDLINE: [&str; 11] = [
    contract::cmdline::SLOT,
    contract::cmdline::PLAIN_HTTP,
    contract::cmdline::NET,
    contract::cmdline::TRIAL,
    contract::cmdline::LIVE,
    contract::cmdline::INSTALL,
    contract::cmdline::INSTALL_WIPE,
    contract::cmdline::INSTALL_HOSTNAME,
    contract::cmdline::INSTALL_NET,
    contract::cmdline::INSTALL_DNS,
    contract::cmdline::VERITY,
];

/// The longest `name`.
pub const MAX_NAME: usize = 64;
/// The longest `pretty_name`, in characters.
pub const MAX_PRETTY_NAME: usize = 128;
/// The longest `version`.
pub use contract::version::MAX_VERSION;
/// The highest zstd level of the squashfs (zstd's highest; see
/// [`crate::rootfs::build_rootfs`]).
pub const MAX_ROOTFS_LEVEL: i32 = 22;

/// A value that fails its check: the key path and what is wrong.
#[derive(Debug)]
struct Invalid {
    key: String,
    msg: String,
}

impl Invalid {
    fn new(key: impl Into<String>, msg: impl Into<String>) -> Invalid {
        Invalid {
            key: key.into(),
            msg: msg.into(),
        }
    }
}

fn invalid(key: impl Into<String>, msg: impl Into<String>) -> Result<(), Invalid> {
    Err(Invalid::new(key, msg))
}

/// The one version rule ([`contract::version::check`]).
fn check_version(v: &str) -> Result<(), String> {
    contract::version::check(v)
}

/// The profile's name as a repository name component: lower case, each run
/// of '-' and '_' one '-', none at either end (`My__OS-` → `my-os`); `os`
/// when nothing is left.
fn repository_component(name: &str) -> String {
    let lower = name.to_ascii_lowercase();
    let parts: Vec<&str> = lower.split(['-', '_']).filter(|p| !p.is_empty()).collect();
    if parts.is_empty() {
        "os".to_string()
    } else {
        parts.join("-")
    }
}

/// Whether an image name carries a tag (a ':' after its last '/').
fn has_tag(image: &str) -> bool {
    image
        .rsplit('/')
        .next()
        .is_some_and(|last| last.contains(':'))
}

/// A full reference name: a registry first (a host with a '.' or a port,
/// or `localhost`: otherwise podman and docker read the first component
/// as a Docker Hub user), a tag, no digest, in the image layout's grammar.
fn check_installer_image(r: &str) -> Result<(), String> {
    let hint = "give REGISTRY/NAME[:TAG], e.g. registry.example.com/metal/installer (the tag \
                defaults to the version)";
    let registry = r.split('/').next().unwrap_or("");
    if !r.contains('/')
        || !(registry.contains('.') || registry.contains(':') || registry == "localhost")
    {
        return Err(format!("{} names no registry: {hint}", excerpt(r)));
    }
    if r.contains('@') {
        return Err(format!("{} has a digest: {hint}", excerpt(r)));
    }
    let (name, tag) = r.rsplit_once(':').unwrap_or((r, ""));
    if name.bytes().any(|b| b.is_ascii_uppercase()) {
        return Err(format!(
            "{} has capitals before its tag: registries and podman take lower-case names only",
            excerpt(r)
        ));
    }
    crate::oci::check_tag(tag).map_err(|e| format!("{}: {e}", excerpt(r)))?;
    crate::oci::check_ref_name(r)
}

fn version_tag_hint(v: &str) -> String {
    format!(
        "{} cannot be an OCI image tag (the installer image is tagged with the version): use \
         at most 128 letters, digits, '.', '_' and '-', not starting with '.' or '-'",
        excerpt(v)
    )
}

/// serde_yaml's message with the location spelled out ("line L column C:
/// key: msg"), quoting at most an excerpt of any value
/// ([`crate::secret::sanitise`]).
fn describe_yaml_error(e: &serde_yaml::Error) -> String {
    let msg = e.to_string();
    let (pos, body) = match e.location() {
        Some(loc) => {
            // serde_yaml appends " at line L column C"; move it to the front.
            let tail = format!(" at line {} column {}", loc.line(), loc.column());
            let body = msg.strip_suffix(&tail).unwrap_or(&msg).to_string();
            (
                format!("line {} column {}: ", loc.line(), loc.column()),
                body,
            )
        }
        None => (String::new(), msg),
    };
    let mut body = crate::secret::sanitise(&body);
    if body.contains("unknown anchor") {
        body.push_str(": profiles do not use anchors or aliases (`*name`): write the value out");
    }
    format!("{pos}{body}")
}
