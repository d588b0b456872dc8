//! Kernel command-line keys read by the runtime, and the parser it uses.

use crate::slot::Slot;

/// Which slot the boot entry belongs to: `machined.slot=A`.
pub const SLOT: &str = "machined.slot";
/// Set by GRUB (the BIOS path, `contract::grubcfg`) after the entry's
/// options: `machined.trial=1` on a boot of the slot on trial (its tries
/// already counted down), `machined.trial=0` otherwise. systemd-boot's
/// entries never carry it, so it also says that GRUB booted.
pub const TRIAL: &str = "machined.trial";
/// Set by GRUB (the BIOS path, `contract::grubcfg`) after the entry's
/// options: `machined.boot_part=GUID`, the unique GUID of the BOOT
/// partition GRUB read the slot's files from (`probe --part-uuid`), so
/// that the runtime knows the disk it booted from (under UEFI, systemd-boot
/// says so in `LoaderDevicePartUUID`). Empty when GRUB's core image cannot
/// probe (one written before it could).
pub const BOOT_PART: &str = "machined.boot_part";
/// What to do when the runtime fails: `machined.on_failure=reboot|halt|poweroff`.
pub const ON_FAILURE: &str = "machined.on_failure";
/// Stop before reaching ready (for tests of a deliberately broken version):
/// `machined.break=stage1|switch-root|stage2|ready` fails there,
/// `machined.break=hang` hangs before ready, `machined.break=panic` panics.
pub const BREAK: &str = "machined.break";
/// Seconds from boot to ready before the runtime gives up and applies its
/// failure policy (so a boot that hangs is counted as failed); 0: never.
pub const READY_TIMEOUT: &str = "machined.ready_timeout";
/// The default of [`READY_TIMEOUT`].
pub const DEFAULT_READY_TIMEOUT_S: u64 = 300;

/// A live boot (from the ISO): `machined.live=<ID>`, in place of
/// [`SLOT`]. ID is lowercase or uppercase hex, 1 to [`MAX_LIVE_ID_LEN`]
/// characters, and the same string is the ISO's Volume Set Identifier
/// (ECMA-119 Primary Volume Descriptor): the runtime recognises its own boot
/// medium by it and never installs onto it.
pub const LIVE: &str = "machined.live";
/// The longest live ID: the Volume Set Identifier's field is 128 bytes.
pub const MAX_LIVE_ID_LEN: usize = 128;
/// Install from the live system onto a disk, after ready:
/// `machined.install=<TARGET>`. TARGET is a kernel name (`vdb`,
/// `nvme0n1`), a `/dev/NAME` path, `serial:<S>`, `wwn:<W>` or a
/// `/dev/disk/by-id/<NAME>` path (see [`InstallTarget`]).
pub const INSTALL: &str = "machined.install";
/// Let the install overwrite a disk that holds data:
/// `machined.install.wipe=1` (`0` or absent: refuse such a disk).
pub const INSTALL_WIPE: &str = "machined.install.wipe";
/// The installed node's own settings ([`crate::settings`]), which the live
/// installer writes into the installed disk's META:
/// `machined.install.hostname=NAME`, `machined.install.net=IFACE:dhcp` or
/// `IFACE:ADDRESS/PREFIX[:GATEWAY]`, `machined.install.dns=IP[,IP...]`.
pub const INSTALL_HOSTNAME: &str = "machined.install.hostname";
pub const INSTALL_NET: &str = "machined.install.net";
pub const INSTALL_DNS: &str = "machined.install.dns";
/// The longest install target value accepted (kernel names are at most 31
/// bytes, serials 20, WWNs and by-id names longer; 255 is a file name).
pub const MAX_TARGET_LEN: usize = 255;

/// The runtime's static IPv4 configuration:
/// `machined.net=IFACE:ADDRESS/PREFIX[:GATEWAY]`
/// (`machined.net=eth0:10.0.2.15/24:10.0.2.2`), parsed by
/// [`crate::net::parse`] and written by [`crate::net::NetConfig::arg`]
/// (the build renders the profile's `network` section into it). Without
/// it the runtime brings up only `lo`.
pub const NET: &str = "machined.net";

/// The root filesystem's dm-verity root hash, 64 hex digits:
/// `machined.verity=<hash>` (see [`crate::verity`]). The build always adds
/// it; without it the runtime mounts the root unverified and says so.
pub const VERITY: &str = "machined.verity";
/// Registries (`HOST:PORT`, comma-separated) a node may pull installer
/// images from over plain HTTP; every other registry is reached over HTTPS
/// only.
pub const PLAIN_HTTP: &str = "machined.plain_http";

/// The most registries [`PLAIN_HTTP`] names.
pub const MAX_PLAIN_HTTP: usize = 8;

/// A registry as [`PLAIN_HTTP`] names it: `HOST:PORT`, the host a DNS
/// name or an IPv4 address (letters, digits, `.` and `-`), at most 253
/// bytes; the port 1 to 65535.
pub fn check_registry(r: &str) -> Result<(), String> {
    let hint = || {
        format!(
            "{:?} is not HOST:PORT (a DNS name or IPv4 address and a port, e.g. \
             10.0.2.100:5000)",
            r.chars().take(64).collect::<String>()
        )
    };
    let (host, port) = r.rsplit_once(':').ok_or_else(hint)?;
    let host_ok = !host.is_empty()
        && host.len() <= 253
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-');
    let port_ok = port.parse::<u16>().is_ok_and(|p| p > 0) && !port.starts_with('0');
    if host_ok && port_ok {
        Ok(())
    } else {
        Err(hint())
    }
}

/// `machined.plain_http=A,B`: the argument naming `registries` (each
/// checked by [`check_registry`]).
pub fn plain_http_arg(registries: &[String]) -> String {
    format!("{PLAIN_HTTP}={}", registries.join(","))
}

/// The registries [`PLAIN_HTTP`] names (empty when it is absent).
/// Entries that are not `HOST:PORT`, and any beyond [`MAX_PLAIN_HTTP`],
/// are left out (the profile refuses them before a build).
pub fn plain_http(cmdline: &str) -> Vec<String> {
    get(cmdline, PLAIN_HTTP)
        .map(|v| {
            v.split(',')
                .filter(|s| check_registry(s).is_ok())
                .take(MAX_PLAIN_HTTP)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// The bytes [`VERITY`] adds to a command line: a space, the key, `=` and
/// the hash.
pub const VERITY_ARG_LEN: usize = 1 + VERITY.len() + 1 + 2 * crate::verity::DIGEST_LEN;

/// The argument carrying `root_hash` (hex).
pub fn verity_arg(root_hash: &str) -> String {
    format!("{VERITY}={root_hash}")
}

/// The longest kernel command line the boot path carries whole, in bytes:
/// the x86 kernel's `COMMAND_LINE_SIZE` (2048, `arch/x86/include/asm/setup.h`)
/// less its terminating NUL. The EFI stub (`efi_convert_cmdline`,
/// `drivers/firmware/efi/libstub/efi-stub-helper.c` in Linux 6.1) cuts a
/// longer line at its last space before that length, says so on the
/// console and boots on: the arguments past the cut (the slot, say) are
/// silently lost. Builds refuse a profile whose line would not fit
/// ([`loaded_len`]).
pub const MAX_LEN: usize = 2047;

/// The length in bytes of the command line the kernel receives from a Boot
/// Loader Specification type #1 entry with these `options` and `initrd`
/// paths (relative to the partition root, as in
/// [`crate::boot::Entry`]): systemd-boot (252) adds `initrd=<path>` for
/// each `initrd` line, the path absolute with `\` for `/`, separated from
/// the options by one space (the kernel's EFI stub loads the initrd from
/// that argument when the firmware offers no other way). Compare with
/// [`MAX_LEN`].
pub fn loaded_len(options: &str, initrds: &[&str]) -> usize {
    let added: usize = initrds
        .iter()
        .map(|p| " initrd=\\".len() + p.trim_start_matches('/').len())
        .sum();
    if options.is_empty() {
        // The first initrd argument needs no separating space.
        added.saturating_sub(1)
    } else {
        options.len() + added
    }
}

/// What the runtime does after printing a fatal error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnFailure {
    Reboot,
    Halt,
    Poweroff,
}

impl OnFailure {
    pub fn parse(v: &str) -> Option<Self> {
        match v {
            "reboot" => Some(Self::Reboot),
            "halt" => Some(Self::Halt),
            "poweroff" => Some(Self::Poweroff),
            _ => None,
        }
    }
}

/// Iterates over `key=value` (value may be empty) and bare `key` words of a
/// command line, honouring double quotes as the kernel does.
pub fn parse(cmdline: &str) -> Vec<(String, Option<String>)> {
    let mut out = Vec::new();
    let mut word = String::new();
    let mut quoted = false;
    let mut push = |w: &mut String| {
        if !w.is_empty() {
            let item = match w.split_once('=') {
                Some((k, v)) => (k.to_string(), Some(v.to_string())),
                None => (w.clone(), None),
            };
            out.push(item);
            w.clear();
        }
    };
    for c in cmdline.chars() {
        match c {
            '"' => quoted = !quoted,
            c if c.is_whitespace() && !quoted => push(&mut word),
            c => word.push(c),
        }
    }
    push(&mut word);
    out
}

/// The last value of `key` on the command line (the kernel's rule: last wins).
pub fn get(cmdline: &str, key: &str) -> Option<String> {
    parse(cmdline)
        .into_iter()
        .rev()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.unwrap_or_default())
}

/// The slot named on the command line, if any and valid.
pub fn slot(cmdline: &str) -> Option<Slot> {
    get(cmdline, SLOT).and_then(|v| v.parse().ok())
}

/// What GRUB said of this boot: `Some(true)` a trial boot, `Some(false)`
/// not; `None` when the line has no valid `machined.trial` (not booted by
/// GRUB).
pub fn trial(cmdline: &str) -> Option<bool> {
    match get(cmdline, TRIAL)?.as_str() {
        "1" => Some(true),
        "0" => Some(false),
        _ => None,
    }
}

/// The live ID of a live boot: `Ok(None)` when the line has no
/// [`LIVE`]; an error saying what is wrong with a value that is not 1 to
/// [`MAX_LIVE_ID_LEN`] hex digits.
pub fn live(cmdline: &str) -> Result<Option<String>, String> {
    let Some(v) = get(cmdline, LIVE) else {
        return Ok(None);
    };
    if v.is_empty() {
        return Err(format!("{LIVE}= is empty: it must be the ISO's hex ID"));
    }
    if v.len() > MAX_LIVE_ID_LEN {
        return Err(format!(
            "{LIVE}= is {} characters long: the ID is at most {MAX_LIVE_ID_LEN} hex digits",
            v.len()
        ));
    }
    if !v.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(format!("{LIVE}={} is not a hex ID (0-9, a-f)", excerpt(&v)));
    }
    Ok(Some(v))
}

/// The network configuration asked for: `Ok(None)` without [`NET`]; an
/// error saying what is wrong with a value [`crate::net::parse`] refuses.
pub fn net(cmdline: &str) -> Result<Option<crate::net::NetConfig>, String> {
    match get(cmdline, NET) {
        None => Ok(None),
        Some(v) => crate::net::parse(&v).map(Some),
    }
}

/// A disk named by [`INSTALL`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InstallTarget {
    /// A kernel name, `vdb`, from `vdb` or `/dev/vdb`.
    Name(String),
    /// `serial:<S>`: the disk whose sysfs serial is S.
    Serial(String),
    /// `wwn:<W>`: the disk whose sysfs wwid is W (with or without `0x`,
    /// `naa.` and the like as sysfs prints it).
    Wwn(String),
    /// `/dev/disk/by-id/<NAME>`: udev's name, worked out from sysfs.
    ById(String),
}

impl std::fmt::Display for InstallTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Name(n) => write!(f, "/dev/{n}"),
            Self::Serial(s) => write!(f, "serial:{s}"),
            Self::Wwn(w) => write!(f, "wwn:{w}"),
            Self::ById(n) => write!(f, "{BY_ID_DIR}/{n}"),
        }
    }
}

/// Where udev puts its by-id names (the runtime has no udev: the names are
/// worked out from sysfs).
pub const BY_ID_DIR: &str = "/dev/disk/by-id";

/// A short, printable excerpt of a command-line value for messages (the
/// one escaping of text from outside, [`crate::text::quote`]).
fn excerpt(v: &str) -> String {
    crate::text::quote(v, 40)
}

/// A name that may be one path component: not empty, not `.` or `..`, no
/// `/`, no control character or space.
fn component(v: &str) -> bool {
    !v.is_empty()
        && v != "."
        && v != ".."
        && !v
            .chars()
            .any(|c| c == '/' || c.is_control() || c.is_whitespace())
}

/// Parses an install target value (see [`INSTALL`]).
pub fn parse_install_target(v: &str) -> Result<InstallTarget, String> {
    let bad = |why: &str| format!("{INSTALL}={} {why}", excerpt(v));
    if v.is_empty() {
        return Err(format!(
            "{INSTALL}= is empty: name a disk (vdb, /dev/sda, serial:<S>, wwn:<W> or \
             {BY_ID_DIR}/<NAME>)"
        ));
    }
    if v.len() > MAX_TARGET_LEN {
        return Err(bad(&format!(
            "is {} bytes long, more than {MAX_TARGET_LEN}",
            v.len()
        )));
    }
    if let Some(s) = v.strip_prefix("serial:") {
        return if component(s) {
            Ok(InstallTarget::Serial(s.to_string()))
        } else {
            Err(bad(
                "is not a serial number (empty, or has /, spaces or control characters)",
            ))
        };
    }
    if let Some(w) = v.strip_prefix("wwn:") {
        return if component(w) {
            Ok(InstallTarget::Wwn(w.to_string()))
        } else {
            Err(bad(
                "is not a WWN (empty, or has /, spaces or control characters)",
            ))
        };
    }
    if let Some(n) = v.strip_prefix(&format!("{BY_ID_DIR}/")) {
        return if component(n) {
            Ok(InstallTarget::ById(n.to_string()))
        } else {
            Err(bad(&format!("is not a name in {BY_ID_DIR}")))
        };
    }
    let name = v.strip_prefix("/dev/").unwrap_or(v);
    if component(name)
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.:!".contains(&b))
    {
        return Ok(InstallTarget::Name(name.to_string()));
    }
    Err(bad(&format!(
        "is not a disk: give a kernel name (vdb), /dev/NAME, serial:<S>, wwn:<W> or \
         {BY_ID_DIR}/<NAME>"
    )))
}

/// The install asked for: `Ok(None)` without [`INSTALL`]; the target and
/// whether [`INSTALL_WIPE`] allows overwriting data.
pub fn install(cmdline: &str) -> Result<Option<(InstallTarget, bool)>, String> {
    let Some(v) = get(cmdline, INSTALL) else {
        return Ok(None);
    };
    let target = parse_install_target(&v)?;
    let wipe = match get(cmdline, INSTALL_WIPE).as_deref() {
        None | Some("0") => false,
        Some("1") => true,
        Some(w) => {
            return Err(format!("{INSTALL_WIPE}={} is neither 1 nor 0", excerpt(w)));
        }
    };
    Ok(Some((target, wipe)))
}

/// The installed node's settings asked for ([`INSTALL_HOSTNAME`],
/// [`INSTALL_NET`], [`INSTALL_DNS`]), checked: `Ok(None)` without any.
pub fn install_settings(cmdline: &str) -> Result<Option<crate::settings::Settings>, String> {
    crate::settings::Settings::from_values(
        get(cmdline, INSTALL_HOSTNAME).as_deref(),
        INSTALL_NET,
        get(cmdline, INSTALL_NET).as_deref(),
        get(cmdline, INSTALL_DNS).as_deref(),
    )
}

#[cfg(test)]
mod tests {

    #[test]
    fn plain_http_registries() {
        let list = vec![
            "10.0.2.100:5000".to_string(),
            "registry.local:443".to_string(),
        ];
        let arg = plain_http_arg(&list);
        assert_eq!(
            arg,
            "machined.plain_http=10.0.2.100:5000,registry.local:443"
        );
        assert_eq!(plain_http(&format!("console=ttyS0 {arg}")), list);
        assert!(plain_http("console=ttyS0").is_empty());
        for bad in [
            "",
            "host",
            "host:",
            ":5000",
            "host:0",
            "host:70000",
            "host:05",
            "a b:1",
            "h/x:1",
            "[::1]:5",
        ] {
            assert!(check_registry(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            plain_http("machined.plain_http=a:1,bad,b:2"),
            ["a:1", "b:2"]
        );
    }
    use super::*;

    #[test]
    fn live_ids() {
        assert_eq!(live("console=ttyS0"), Ok(None));
        assert_eq!(
            live("machined.live=0123abcDEF").unwrap().as_deref(),
            Some("0123abcDEF")
        );
        assert!(live("machined.live=").unwrap_err().contains("empty"));
        assert!(live("machined.live").unwrap_err().contains("empty"));
        assert!(
            live("machined.live=..")
                .unwrap_err()
                .contains("not a hex ID")
        );
        assert!(
            live("machined.live=12g4")
                .unwrap_err()
                .contains("not a hex ID")
        );
        let long = format!("machined.live={}", "a".repeat(MAX_LIVE_ID_LEN + 1));
        assert!(live(&long).unwrap_err().contains("at most 128"));
        let max = format!("machined.live={}", "a".repeat(MAX_LIVE_ID_LEN));
        assert!(live(&max).unwrap().is_some());
        // Messages show an excerpt of hostile values, never all of them.
        let junk = format!("machined.live={}", "\u{7}x".repeat(60));
        let e = live(&junk).unwrap_err();
        assert!(e.len() < 200, "{e}");
    }

    #[test]
    fn install_targets() {
        use InstallTarget::*;
        let t = |v: &str| parse_install_target(v);
        assert_eq!(t("vdb"), Ok(Name("vdb".into())));
        assert_eq!(t("/dev/nvme0n1"), Ok(Name("nvme0n1".into())));
        assert_eq!(t("serial:ABC-123"), Ok(Serial("ABC-123".into())));
        assert_eq!(
            t("wwn:0x5000c500a1b2c3d4"),
            Ok(Wwn("0x5000c500a1b2c3d4".into()))
        );
        assert_eq!(
            t("/dev/disk/by-id/virtio-live-target"),
            Ok(ById("virtio-live-target".into()))
        );
        for bad in [
            "",
            "..",
            ".",
            "/dev/..",
            "/dev/",
            "/dev/disk/by-id/..",
            "/dev/disk/by-id/",
            "/dev/disk/by-id/a/b",
            "serial:",
            "wwn:",
            "serial:a/b",
            "/etc/passwd",
            "../vda",
            "vd a",
        ] {
            assert!(t(bad).is_err(), "{bad:?}");
        }
        assert!(
            t(&"v".repeat(MAX_TARGET_LEN + 1))
                .unwrap_err()
                .contains("bytes long")
        );
        assert_eq!(Serial("S1".into()).to_string(), "serial:S1");
        assert_eq!(Name("vdb".into()).to_string(), "/dev/vdb");

        assert_eq!(install("machined.live=ab"), Ok(None));
        assert_eq!(
            install("machined.install=vdb"),
            Ok(Some((Name("vdb".into()), false)))
        );
        assert_eq!(
            install("machined.install=vdb machined.install.wipe=1"),
            Ok(Some((Name("vdb".into()), true)))
        );
        assert_eq!(
            install("machined.install=vdb machined.install.wipe=0"),
            Ok(Some((Name("vdb".into()), false)))
        );
        assert!(install("machined.install=vdb machined.install.wipe=yes").is_err());
        assert!(install("machined.install=").unwrap_err().contains("empty"));
        assert!(install("machined.install").unwrap_err().contains("empty"));
        assert_eq!(install_settings("machined.install=vdb"), Ok(None));
        let s = install_settings(
            "machined.install=vdb machined.install.hostname=n2 \
             machined.install.net=eth0:10.0.2.21/24:10.0.2.2 machined.install.dns=10.0.2.3",
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            s.render(),
            "hostname=n2\nnet=eth0:10.0.2.21/24:10.0.2.2\ndns=10.0.2.3\n"
        );
        let e = install_settings("machined.install.net=eth0:10.0.2.21/24:10.0.9.1").unwrap_err();
        assert!(
            e.contains("machined.install.net=") && e.contains("subnet"),
            "{e}"
        );
        assert!(install_settings("machined.install.hostname=-x").is_err());
    }

    #[test]
    fn net_key() {
        assert_eq!(net("console=ttyS0"), Ok(None));
        let c = net("a machined.net=eth0:10.0.2.15/24:10.0.2.2 b")
            .unwrap()
            .unwrap();
        assert_eq!(c.to_string(), "eth0 10.0.2.15/24 gateway 10.0.2.2");
        // The last value wins, as for every key.
        let c = net("machined.net=eth0:10.0.2.15/24 machined.net=eth1:10.0.3.15/24")
            .unwrap()
            .unwrap();
        assert_eq!(c.interface, "eth1");
        assert!(net("machined.net").unwrap_err().contains("empty"));
        assert!(net("machined.net=eth0").is_err());
    }

    #[test]
    fn parses_quotes_and_last_value_wins() {
        let c = r#"console=ttyS0 machined.slot=B quiet x="a b" machined.slot=A"#;
        assert_eq!(get(c, "x").as_deref(), Some("a b"));
        assert_eq!(get(c, "quiet").as_deref(), Some(""));
        assert_eq!(slot(c), Some(Slot::A));
        assert_eq!(get(c, "missing"), None);
        assert_eq!(slot("machined.slot=C"), None);
        assert_eq!(trial("a machined.trial=1"), Some(true));
        assert_eq!(trial("machined.trial=0"), Some(false));
        assert_eq!(trial("machined.trial=2"), None);
        assert_eq!(trial("machined.slot=A"), None);
    }

    #[test]
    fn loaded_length_counts_what_systemd_boot_adds() {
        // "a b initrd=\A\i.zst"
        assert_eq!(loaded_len("a b", &["A/i.zst"]), 3 + 1 + 7 + 8);
        assert_eq!(loaded_len("", &["/A/i.zst"]), 7 + 8);
        assert_eq!(loaded_len("a", &[]), 1);
    }
}
