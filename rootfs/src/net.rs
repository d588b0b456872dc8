//! The network (`docs/design.md`, "Network"): the loopback interface, the
//! hardening sysctls, and the one interface `machined.net=` names, with its
//! static IPv4 address and default route, set through ioctls on an
//! `AF_INET` datagram socket.
//!
//! Only a hardening sysctl that cannot be set, or does not read back as
//! written, is an error ([`setup`] returns it and the boot fails): a node
//! running with weaker settings than it says must not reach ready. A bad
//! `machined.net=`, an interface that never appears or one that cannot be
//! configured is a warning on the console, and the node runs on without
//! network: it still boots, assesses and blesses its slot, but cannot be
//! reached.

use crate::console::say;
use crate::sys::check;
use anyhow::{Context, Result};
use contract::cmdline;
use contract::net::{self, Ipv4, StaticIpv4};
use contract::settings::Settings;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::time::{Duration, Instant};

/// How long to wait for the named interface to appear.
const INTERFACE_TIMEOUT: Duration = Duration::from_secs(10);
const INTERFACE_POLL: Duration = Duration::from_millis(50);

/// The addresses of this machine's interfaces (getifaddrs(3)), IPv4 and
/// IPv6: where a registry's redirect may not lead ([`registry::Options`]'s
/// `own_addresses`). Empty when they cannot be read.
pub fn own_addresses() -> Vec<std::net::IpAddr> {
    let mut out = Vec::new();
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `list` with a list it allocates, freed below.
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return out;
    }
    let mut at = list;
    while !at.is_null() {
        // SAFETY: `at` is an element of the list getifaddrs returned.
        let ifa = unsafe { &*at };
        if !ifa.ifa_addr.is_null() {
            // SAFETY: ifa_addr points to a sockaddr of the family it says.
            match i32::from(unsafe { (*ifa.ifa_addr).sa_family }) {
                libc::AF_INET => {
                    // SAFETY: an AF_INET address is a sockaddr_in.
                    let sin = unsafe { &*ifa.ifa_addr.cast::<libc::sockaddr_in>() };
                    out.push(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)).into());
                }
                libc::AF_INET6 => {
                    // SAFETY: an AF_INET6 address is a sockaddr_in6.
                    let sin6 = unsafe { &*ifa.ifa_addr.cast::<libc::sockaddr_in6>() };
                    out.push(std::net::Ipv6Addr::from(sin6.sin6_addr.s6_addr).into());
                }
                _ => {}
            }
        }
        at = ifa.ifa_next;
    }
    // SAFETY: `list` came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(list) };
    out
}

/// Where the configuration came from, as the console says it.
const FROM_SETTINGS: &str = "the node's settings in META";
const FROM_IMAGE: &str = "the image's default, machined.net=";

/// Sets up the network: the node's own settings (in `meta`, META's
/// [`contract::meta::Tag::NodeSettings`]) before the image's default on
/// the command line, saying on the console what it did and from where.
/// `Err` only for a hardening sysctl (see the module's documentation).
pub fn setup(cmdline: &str, meta: &contract::meta::Meta) -> Result<()> {
    let settings = Settings::from_meta(meta).unwrap_or_else(|e| {
        say(format!(
            "net: warning: {FROM_SETTINGS} are refused ({e}); the image's defaults apply"
        ));
        Settings::default()
    });
    if let Some(h) = &settings.hostname {
        match set_hostname(h) {
            Ok(()) => say(format!("host: hostname {h} ({FROM_SETTINGS})")),
            Err(e) => say(format!("host: warning: {e:#}")),
        }
    }
    let proc_sys = Path::new("/proc/sys");
    if !proc_sys.join("net/ipv4").is_dir() {
        say(match cmdline::get(cmdline, cmdline::NET) {
            Some(_) => format!(
                "net: warning: {}= is given but this kernel has no IPv4 stack (built without \
                 kernel-config/network.config); no network",
                cmdline::NET
            ),
            None => "net: this kernel has no IPv4 stack; no network".to_string(),
        });
        return Ok(());
    }
    let (wanted, from) = match &settings.net {
        Some(n) => (Some(n.clone()), FROM_SETTINGS),
        None => (
            cmdline::net(cmdline).unwrap_or_else(|e| {
                say(format!("net: warning: {e}; no network"));
                None
            }),
            FROM_IMAGE,
        ),
    };
    if let Err(e) = Interface::open(net::LOOPBACK).and_then(|i| {
        i.set_address(net::LOOPBACK_ADDRESS, net::LOOPBACK_PREFIX)?;
        i.up()
    }) {
        say(format!("net: warning: loopback {}: {e:#}", net::LOOPBACK));
    }
    let present = match &wanted {
        Some(c) => match wait_for_interface(
            Path::new("/sys"),
            &c.interface,
            INTERFACE_TIMEOUT,
            INTERFACE_POLL,
        ) {
            Ok(()) => Some(c),
            Err(seen) => {
                say(format!(
                    "net: warning: no interface {} appeared in {} s (interfaces: {}); no network",
                    c.interface,
                    INTERFACE_TIMEOUT.as_secs(),
                    if seen.is_empty() {
                        "none".to_string()
                    } else {
                        seen.join(", ")
                    }
                ));
                None
            }
        },
        None => None,
    };
    // Before the interface comes up.
    let set = apply_sysctls(
        proc_sys,
        &sysctls(proc_sys, present.map(|c| c.interface.as_str())),
    )?;
    say(format!(
        "net: sysctls set and read back: {}",
        set.iter()
            .map(|(k, v)| format!("{}={v}", net::sysctl_name(k)))
            .collect::<Vec<_>>()
            .join(" ")
    ));
    match present {
        Some(c) => match &c.ipv4 {
            Ipv4::Static(s) => match configure(&c.interface, s) {
                Ok(()) => {
                    say(format!("net: {c} (up; {from})"));
                    write_dns(&settings.dns, FROM_SETTINGS);
                }
                Err(e) => say(format!(
                    "net: warning: {c}: {e:#}; no network (the interface may be partly configured)"
                )),
            },
            Ipv4::Dhcp => {
                say(format!("net: {c} ({from})"));
                // The node's own DNS servers at once (they replace DHCP's).
                write_dns(&settings.dns, FROM_SETTINGS);
                crate::dhcp::start(&c.interface, &settings);
            }
        },
        None if wanted.is_none() && cmdline::get(cmdline, cmdline::NET).is_none() => say(format!(
            "net: no {}= on the kernel command line and no network in {FROM_SETTINGS}; no network",
            cmdline::NET
        )),
        None => {}
    }
    Ok(())
}

/// Sets the kernel's hostname.
pub(crate) fn set_hostname(h: &str) -> Result<()> {
    // SAFETY: the pointer and length describe `h`'s bytes.
    let ret = unsafe { libc::sethostname(h.as_ptr().cast(), h.len()) };
    check(ret, || format!("cannot set the hostname {h}")).map(drop)
}

/// Writes the resolver's DNS servers (the generated `/etc/resolv.conf`,
/// written in place: it is bind-mounted) and says which and from where.
/// Nothing is written for an empty list.
pub(crate) fn write_dns(servers: &[Ipv4Addr], from: &str) {
    if servers.is_empty() {
        return;
    }
    let list: Vec<String> = servers.iter().map(Ipv4Addr::to_string).collect();
    let text = render_resolv_conf(servers, from);
    let path = Path::new(contract::paths::SYSTEM_ETC).join("resolv.conf");
    match std::fs::write(&path, text) {
        Ok(()) => say(format!("net: DNS servers {} ({from})", list.join(", "))),
        Err(e) => say(format!(
            "net: warning: cannot write {}: {e}",
            path.display()
        )),
    }
}

/// The generated `/etc/resolv.conf`: a comment naming where the servers
/// came from, then a `nameserver` line each.
fn render_resolv_conf(servers: &[Ipv4Addr], from: &str) -> String {
    let mut text = format!("# Generated by machined from {from}.\n");
    for s in servers {
        text.push_str(&format!("nameserver {s}\n"));
    }
    text
}

/// The servers of a resolv.conf as [`render_resolv_conf`] writes it (other
/// lines ignored), at most [`contract::settings::MAX_DNS`].
fn parse_resolv_conf(text: &str) -> Vec<Ipv4Addr> {
    text.lines()
        .filter_map(|l| l.strip_prefix("nameserver "))
        .filter_map(|a| a.trim().parse().ok())
        .take(contract::settings::MAX_DNS)
        .collect()
}

/// The DNS servers the node uses now: those [`write_dns`] wrote last (the
/// node's settings', else DHCP's); none before either.
pub(crate) fn dns_servers() -> Vec<Ipv4Addr> {
    let path = Path::new(contract::paths::SYSTEM_ETC).join("resolv.conf");
    let mut text = String::new();
    match std::fs::File::open(&path) {
        Ok(f) => {
            use std::io::Read;
            // Ours: a few lines.
            let _ = f.take(4096).read_to_string(&mut text);
            parse_resolv_conf(&text)
        }
        Err(_) => Vec::new(),
    }
}

/// The sysctls to write under `proc_sys`: [`net::sysctls`], and those of
/// [`net::SYSCTLS_IF_PRESENT`] that this kernel has.
pub fn sysctls(proc_sys: &Path, interface: Option<&str>) -> Vec<(String, String)> {
    let mut list = net::sysctls(interface);
    for (k, v) in net::SYSCTLS_IF_PRESENT {
        if proc_sys.join(k).exists() {
            list.push((k.to_string(), v.to_string()));
        }
    }
    list
}

/// Writes each sysctl under `proc_sys` and reads it back; the first that
/// cannot be written or reads back otherwise is an error naming it.
/// Returns what was set.
pub fn apply_sysctls(proc_sys: &Path, list: &[(String, String)]) -> Result<Vec<(String, String)>> {
    for (k, v) in list {
        let path = proc_sys.join(k);
        let name = net::sysctl_name(k);
        // Never created: a sysctl the kernel does not have is an error.
        std::fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(&path)
            .and_then(|mut f| std::io::Write::write_all(&mut f, format!("{v}\n").as_bytes()))
            .with_context(|| format!("cannot set {name}={v} ({})", path.display()))?;
        let back = std::fs::read_to_string(&path)
            .with_context(|| format!("cannot read back {name} ({})", path.display()))?;
        if back.trim() != v {
            anyhow::bail!(
                "{name}={v} did not hold: {} reads back {:?}",
                path.display(),
                back.trim().chars().take(40).collect::<String>()
            );
        }
    }
    Ok(list.to_vec())
}

/// Polls `<sys>/class/net` until `name` is there or `timeout` passes;
/// `Err` with the interfaces seen.
pub fn wait_for_interface(
    sys: &Path,
    name: &str,
    timeout: Duration,
    interval: Duration,
) -> Result<(), Vec<String>> {
    let class = sys.join("class/net");
    let start = Instant::now();
    loop {
        if class.join(name).exists() {
            return Ok(());
        }
        if start.elapsed() >= timeout {
            let mut seen: Vec<String> = std::fs::read_dir(&class)
                .map(|d| {
                    d.flatten()
                        .map(|e| e.file_name().to_string_lossy().into_owned())
                        .collect()
                })
                .unwrap_or_default();
            seen.sort();
            return Err(seen);
        }
        std::thread::sleep(interval);
    }
}

/// Address, netmask, up, then the default route via the gateway.
fn configure(name: &str, c: &StaticIpv4) -> Result<()> {
    let i = Interface::open(name)?;
    i.set_address(c.address, c.prefix)?;
    i.up()?;
    if let Some(g) = c.gateway {
        i.route(Some(g), true)?;
    }
    Ok(())
}

/// An interface being configured: its name and an `AF_INET` datagram
/// socket for the ioctls.
pub(crate) struct Interface {
    name: String,
    sock: OwnedFd,
}

impl Interface {
    pub(crate) fn open(name: &str) -> Result<Self> {
        // SAFETY: socket(2) with constant arguments.
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        let fd = check(fd, || "socket(AF_INET, SOCK_DGRAM)")?;
        // SAFETY: fd was just opened and is owned by nobody else.
        let sock = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Interface {
            name: name.to_string(),
            sock,
        })
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Sets the address and netmask.
    pub(crate) fn set_address(&self, address: Ipv4Addr, prefix: u8) -> Result<()> {
        self.set_addr(libc::SIOCSIFADDR, address, "address")?;
        self.set_addr(libc::SIOCSIFNETMASK, net::netmask(prefix), "netmask")
    }

    /// Removes the address (and with it the routes through it).
    pub(crate) fn clear_address(&self) -> Result<()> {
        self.set_addr(libc::SIOCSIFADDR, Ipv4Addr::UNSPECIFIED, "address")
    }

    /// Brings the interface up.
    pub(crate) fn up(&self) -> Result<()> {
        let mut req = self.request();
        self.ioctl(libc::SIOCGIFFLAGS, &mut req, "read the flags")?;
        // SAFETY: SIOCGIFFLAGS filled in the flags member.
        let flags = unsafe { req.ifr_ifru.ifru_flags };
        req.ifr_ifru.ifru_flags = flags | libc::IFF_UP as libc::c_short;
        self.ioctl(libc::SIOCSIFFLAGS, &mut req, "bring it up")
    }

    pub(crate) fn set_mtu(&self, mtu: u16) -> Result<()> {
        let mut req = self.request();
        req.ifr_ifru.ifru_mtu = libc::c_int::from(mtu);
        self.ioctl(libc::SIOCSIFMTU, &mut req, &format!("set the MTU {mtu}"))
    }

    /// The hardware (MAC) address.
    pub(crate) fn hwaddr(&self) -> Result<[u8; 6]> {
        let mut req = self.request();
        self.ioctl(libc::SIOCGIFHWADDR, &mut req, "read the hardware address")?;
        // SAFETY: SIOCGIFHWADDR filled in the hwaddr member.
        let data = unsafe { req.ifr_ifru.ifru_hwaddr.sa_data };
        let mut mac = [0u8; 6];
        for (m, d) in mac.iter_mut().zip(data) {
            *m = d as u8;
        }
        Ok(mac)
    }

    /// An `ifreq` naming the interface, the rest zero.
    fn request(&self) -> libc::ifreq {
        // SAFETY: ifreq is plain data; all zero is a valid value.
        let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
        // The name is at most 15 bytes (contract::net), so the NUL stays.
        for (d, s) in req
            .ifr_name
            .iter_mut()
            .zip(self.name.bytes().take(libc::IFNAMSIZ - 1))
        {
            *d = s as libc::c_char;
        }
        req
    }

    fn ioctl(&self, request: libc::c_ulong, req: &mut libc::ifreq, what: &str) -> Result<()> {
        // SAFETY: req is a valid ifreq for these SIOC*IF* requests.
        let ret = unsafe { libc::ioctl(self.sock.as_raw_fd(), request as _, req as *mut _) };
        check(ret, || format!("{}: {what}", self.name)).map(drop)
    }

    fn set_addr(&self, request: libc::c_ulong, a: Ipv4Addr, what: &str) -> Result<()> {
        let mut req = self.request();
        req.ifr_ifru.ifru_addr = sockaddr(a);
        self.ioctl(request, &mut req, &format!("set the {what} {a}"))
    }

    /// Adds (`add`) or deletes the default route on this interface: via
    /// `gateway`, or with none straight onto the link (what the DHCP client
    /// holds while the interface has no address, so that strict
    /// reverse-path filtering takes the server's replies). Adding a route
    /// that is there already, or deleting one that is gone, is not an
    /// error.
    pub(crate) fn route(&self, gateway: Option<Ipv4Addr>, add: bool) -> Result<()> {
        let dev = crate::sys::cstr(&self.name)?;
        let mut rt = RtEntry {
            rt_pad1: 0,
            rt_dst: sockaddr(Ipv4Addr::UNSPECIFIED),
            rt_gateway: sockaddr(gateway.unwrap_or(Ipv4Addr::UNSPECIFIED)),
            rt_genmask: sockaddr(Ipv4Addr::UNSPECIFIED),
            rt_flags: libc::RTF_UP
                | if gateway.is_some() {
                    libc::RTF_GATEWAY
                } else {
                    0
                },
            rt_pad2: 0,
            rt_pad3: 0,
            rt_pad4: std::ptr::null_mut(),
            rt_metric: 0,
            rt_dev: dev.as_ptr().cast_mut(),
            rt_mtu: 0,
            rt_window: 0,
            rt_irtt: 0,
        };
        let request = if add {
            libc::SIOCADDRT
        } else {
            libc::SIOCDELRT
        };
        // SAFETY: rt is a valid struct rtentry; rt_dev points to `dev`,
        // alive until after the call.
        let ret =
            unsafe { libc::ioctl(self.sock.as_raw_fd(), request as _, &mut rt as *mut RtEntry) };
        // Adding a route that is there, or deleting one that is gone, is
        // done: the kernel drops every route of an interface when its last
        // address goes, which setting the netmask does for a moment.
        let errno = std::io::Error::last_os_error().raw_os_error();
        if ret == -1 && errno == Some(if add { libc::EEXIST } else { libc::ESRCH }) {
            return Ok(());
        }
        let via = gateway.map_or("onto the link".to_string(), |g| format!("via {g}"));
        check(ret, || {
            format!(
                "{}: {} the default route {via}",
                self.name,
                if add { "add" } else { "delete" }
            )
        })
        .map(drop)
    }
}

/// The kernel's `struct rtentry` (`include/uapi/linux/route.h`), which the
/// libc crate defines for musl only.
#[repr(C)]
struct RtEntry {
    rt_pad1: libc::c_ulong,
    rt_dst: libc::sockaddr,
    rt_gateway: libc::sockaddr,
    rt_genmask: libc::sockaddr,
    rt_flags: libc::c_ushort,
    rt_pad2: libc::c_short,
    rt_pad3: libc::c_ulong,
    rt_pad4: *mut libc::c_void,
    rt_metric: libc::c_short,
    rt_dev: *mut libc::c_char,
    rt_mtu: libc::c_ulong,
    rt_window: libc::c_ulong,
    rt_irtt: libc::c_ushort,
}

/// `a` as a `sockaddr_in` in a `sockaddr`, as the ioctls take it.
fn sockaddr(a: Ipv4Addr) -> libc::sockaddr {
    let sin = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0,
        sin_addr: libc::in_addr {
            s_addr: u32::from(a).to_be(),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: sockaddr_in and sockaddr are both 16 bytes of plain data;
    // the kernel reads a sockaddr_in from it (family AF_INET).
    unsafe { std::mem::transmute::<libc::sockaddr_in, libc::sockaddr>(sin) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolv_conf_is_read_back_as_written() {
        let servers = [Ipv4Addr::new(10, 0, 2, 3), Ipv4Addr::new(1, 1, 1, 1)];
        let text = render_resolv_conf(&servers, "DHCP");
        assert!(
            text.starts_with("# Generated by machined from DHCP.\n"),
            "{text}"
        );
        assert_eq!(parse_resolv_conf(&text), servers);
        assert_eq!(
            parse_resolv_conf("nameserver x\nsearch a\nnameserver 9.9.9.9\n"),
            [Ipv4Addr::new(9, 9, 9, 9)]
        );
        let many = "nameserver 1.1.1.1\n".repeat(5);
        assert_eq!(parse_resolv_conf(&many).len(), contract::settings::MAX_DNS);
    }
    use std::path::PathBuf;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("machined-net-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// A /proc/sys with a file for every sysctl `list` names.
    fn proc_sys(name: &str, list: &[(String, String)]) -> PathBuf {
        let root = scratch(name);
        for (k, _) in list {
            let p = root.join(k);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, "9\n").unwrap();
        }
        root
    }

    /// The loopback address is always one of this machine's.
    #[test]
    fn own_addresses_include_the_loopback() {
        let own = own_addresses();
        assert!(
            own.contains(&std::net::IpAddr::from(Ipv4Addr::LOCALHOST)),
            "{own:?}"
        );
    }

    #[test]
    fn sysctls_are_written_and_read_back() {
        let list = net::sysctls(Some("eth0"));
        let root = proc_sys("write", &list);
        // Without the JIT's sysctl it is not in the list; with it, it is.
        assert_eq!(sysctls(&root, Some("eth0")), list);
        let jit = root.join("net/core/bpf_jit_harden");
        std::fs::create_dir_all(jit.parent().unwrap()).unwrap();
        std::fs::write(&jit, "0\n").unwrap();
        let full = sysctls(&root, Some("eth0"));
        assert_eq!(full.len(), list.len() + 1);
        let set = apply_sysctls(&root, &full).unwrap();
        assert_eq!(set, full);
        for (k, v) in &full {
            assert_eq!(
                std::fs::read_to_string(root.join(k)).unwrap(),
                format!("{v}\n")
            );
        }
        assert_eq!(std::fs::read_to_string(&jit).unwrap(), "2\n");
        assert_eq!(
            std::fs::read_to_string(root.join("net/ipv4/conf/eth0/accept_redirects")).unwrap(),
            "0\n"
        );
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_sysctl_that_cannot_be_set_or_does_not_hold_is_named() {
        let list = net::sysctls(None);
        let root = proc_sys("fail", &list);
        // Missing: cannot be written.
        std::fs::remove_file(root.join("net/ipv4/conf/default/rp_filter")).unwrap();
        let e = format!("{:#}", apply_sysctls(&root, &list).unwrap_err());
        assert!(
            e.contains("cannot set net.ipv4.conf.default.rp_filter=1"),
            "{e}"
        );
        // Written but reads back otherwise (as /dev/null does).
        let syn = root.join("net/ipv4/tcp_syncookies");
        std::fs::remove_file(&syn).unwrap();
        std::os::unix::fs::symlink("/dev/null", &syn).unwrap();
        let e = format!("{:#}", apply_sysctls(&root, &list).unwrap_err());
        assert!(
            e.contains("net.ipv4.tcp_syncookies=1 did not hold") && e.contains("\"\""),
            "{e}"
        );
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn waits_for_the_interface_and_lists_those_seen() {
        let sys = scratch("sys");
        let class = sys.join("class/net");
        std::fs::create_dir_all(class.join("lo")).unwrap();
        std::fs::create_dir_all(class.join("ens3")).unwrap();
        let tick = Duration::from_millis(1);
        assert_eq!(
            wait_for_interface(&sys, "eth0", Duration::ZERO, tick),
            Err(vec!["ens3".to_string(), "lo".to_string()])
        );
        assert_eq!(
            wait_for_interface(&sys, "ens3", Duration::ZERO, tick),
            Ok(())
        );
        // No sysfs at all: nothing seen.
        assert_eq!(
            wait_for_interface(&sys.join("none"), "eth0", Duration::ZERO, tick),
            Err(vec![])
        );
        std::fs::remove_dir_all(&sys).unwrap();
    }

    #[test]
    fn sockaddrs_carry_the_address_in_network_order() {
        let s = sockaddr(Ipv4Addr::new(10, 0, 2, 15));
        assert_eq!(s.sa_family, libc::AF_INET as libc::sa_family_t);
        // sa_data: port (2 bytes), then the address.
        let data: Vec<u8> = s.sa_data.iter().map(|&b| b as u8).collect();
        assert_eq!(&data[..6], &[0, 0, 10, 0, 2, 15]);
        assert_eq!(std::mem::size_of::<RtEntry>(), 120);
    }
}
