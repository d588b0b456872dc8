//! The guest's network: one NIC ([`Nic`]: virtio-net, or the Intel or
//! VMware NIC of a real machine or hypervisor) on QEMU's
//! user-mode network (slirp), `restrict=on` so that the guest reaches nothing outside QEMU
//! but what is forwarded explicitly, and only to the host's loopback:
//!
//! - [`Forward`]: a host port on 127.0.0.1 forwarded to a guest port
//!   (`hostfwd`), how a test reaches a service of the guest;
//! - [`GuestForward`]: an address and port of the user-mode network
//!   forwarded to a loopback port of the host (`guestfwd`), how the guest
//!   reaches a service a test runs on the host.
//!
//! The user-mode network is QEMU's default: `10.0.2.0/24`, the guest's
//! DHCP address `10.0.2.15` (the default profiles take it by DHCP),
//! the gateway (the host) `10.0.2.2`, DNS `10.0.2.3`. The NIC has no option
//! ROM (`romfile=`): the firmware never tries to boot from the network.

use anyhow::{Result, bail};
use std::net::Ipv4Addr;

/// The user-mode network QEMU gives the guest, and its reserved addresses.
pub const NETWORK: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 0);
pub const PREFIX: u8 = 24;
/// The gateway: the host as the guest sees it.
pub const GATEWAY: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 2);
pub const DNS: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 3);
/// The guest's own address: QEMU's first DHCP address, which the default
/// profiles' DHCP takes.
pub const GUEST: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 15);

/// `--forward HOSTPORT:[GUESTIP:]GUESTPORT`: `127.0.0.1:HOSTPORT` on the
/// host to the guest's GUESTPORT (TCP), at GUESTIP when given (else the
/// address QEMU's DHCP gives, [`GUEST`]): a guest with another static
/// address is reached at that address, and only there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Forward {
    pub host_port: u16,
    pub guest: Option<Ipv4Addr>,
    pub guest_port: u16,
}

/// `--guest-forward GUESTIP:GUESTPORT=HOSTIP:HOSTPORT`: connections of the
/// guest to GUESTIP:GUESTPORT (an otherwise unused address of the
/// user-mode network) go to HOSTIP:HOSTPORT, a loopback address of the
/// host (TCP).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GuestForward {
    pub guest: Ipv4Addr,
    pub guest_port: u16,
    pub host: Ipv4Addr,
    pub host_port: u16,
}

/// The NIC QEMU gives the guest: `imager boot --nic`. Each is one whose
/// driver the default kernel carries (`kernel-config/hardware.config`;
/// virtio-net: every profile's, metal-virtio's too).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Nic {
    /// virtio-net (the default: QEMU's fastest).
    #[default]
    Virtio,
    /// Intel 82540EM (e1000): QEMU's and many hypervisors' default.
    E1000,
    /// Intel 82574L (e1000e): the NIC of Intel boards, Hyper-V's and
    /// VMware's "e1000e".
    E1000e,
    /// VMware's paravirtual VMXNET3.
    Vmxnet3,
}

impl Nic {
    pub const ALL: [Nic; 4] = [Nic::Virtio, Nic::E1000, Nic::E1000e, Nic::Vmxnet3];

    pub fn name(self) -> &'static str {
        match self {
            Nic::Virtio => "virtio",
            Nic::E1000 => "e1000",
            Nic::E1000e => "e1000e",
            Nic::Vmxnet3 => "vmxnet3",
        }
    }

    /// QEMU's device.
    fn device(self) -> &'static str {
        match self {
            Nic::Virtio => "virtio-net-pci",
            Nic::E1000 => "e1000",
            Nic::E1000e => "e1000e",
            Nic::Vmxnet3 => "vmxnet3",
        }
    }
}

impl std::str::FromStr for Nic {
    type Err = String;

    fn from_str(s: &str) -> Result<Nic, String> {
        Nic::ALL.into_iter().find(|n| n.name() == s).ok_or_else(|| {
            let names: Vec<&str> = Nic::ALL.iter().map(|n| n.name()).collect();
            format!(
                "{} is not a NIC: one of {}",
                contract::text::excerpt(s),
                names.join(", ")
            )
        })
    }
}

/// The guest's network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetOptions {
    /// Give the guest its NIC at all.
    pub nic: bool,
    /// Which NIC.
    pub model: Nic,
    /// The program QEMU runs for each connection of a [`GuestForward`]
    /// (`PROGRAM relay HOST:PORT`); this program when `None`.
    pub relay: Option<std::path::PathBuf>,
    pub forwards: Vec<Forward>,
    pub guest_forwards: Vec<GuestForward>,
}

impl Default for NetOptions {
    fn default() -> Self {
        NetOptions {
            nic: true,
            model: Nic::Virtio,
            relay: None,
            forwards: Vec::new(),
            guest_forwards: Vec::new(),
        }
    }
}

/// A port 1-65535 in decimal.
fn port(v: &str, what: &str) -> Result<u16> {
    match v.parse::<u16>() {
        Ok(p) if p != 0 && v.bytes().all(|b| b.is_ascii_digit()) => Ok(p),
        _ => bail!(
            "{what} {}: not a port number (1 to 65535)",
            crate::secret::excerpt(v)
        ),
    }
}

fn ipv4(v: &str, what: &str) -> Result<Ipv4Addr> {
    v.parse()
        .map_err(|_| anyhow::anyhow!("{what} {}: not an IPv4 address", crate::secret::excerpt(v)))
}

impl Forward {
    /// Parses `HOSTPORT:GUESTPORT` (`8443:50000`) or
    /// `HOSTPORT:GUESTIP:GUESTPORT` (`8443:10.0.2.20:50000`).
    pub fn parse(v: &str) -> Result<Forward> {
        let Some((h, g)) = v.split_once(':') else {
            bail!(
                "--forward {}: write HOSTPORT:[GUESTIP:]GUESTPORT (8443:50000); the host side \
                 is 127.0.0.1:HOSTPORT",
                crate::secret::excerpt(v)
            );
        };
        let (guest, g) = match g.rsplit_once(':') {
            Some((ip, p)) if ip.contains('.') => {
                (Some(ipv4(ip, "--forward: the guest address")?), p)
            }
            _ => (None, g),
        };
        Ok(Forward {
            host_port: port(h, "--forward: the host port")?,
            guest,
            guest_port: port(g, "--forward: the guest port")?,
        })
    }

    /// QEMU's `hostfwd=` value.
    pub fn render(&self) -> String {
        format!(
            "hostfwd=tcp:127.0.0.1:{}-{}:{}",
            self.host_port,
            self.guest.map(|g| g.to_string()).unwrap_or_default(),
            self.guest_port
        )
    }
}

impl GuestForward {
    /// Parses `GUESTIP:GUESTPORT=HOSTIP:HOSTPORT`
    /// (`10.0.2.100:5000=127.0.0.1:5000`).
    pub fn parse(v: &str) -> Result<GuestForward> {
        let shown = crate::secret::excerpt(v);
        let hint = "write GUESTIP:GUESTPORT=HOSTIP:HOSTPORT (10.0.2.100:5000=127.0.0.1:5000)";
        let Some((g, h)) = v.split_once('=') else {
            bail!("--guest-forward {shown}: {hint}");
        };
        let (Some((gip, gport)), Some((hip, hport))) = (g.split_once(':'), h.split_once(':'))
        else {
            bail!("--guest-forward {shown}: {hint}");
        };
        let f = GuestForward {
            guest: ipv4(gip, "--guest-forward: the guest address")?,
            guest_port: port(gport, "--guest-forward: the guest port")?,
            host: ipv4(hip, "--guest-forward: the host address")?,
            host_port: port(hport, "--guest-forward: the host port")?,
        };
        let mask = u32::from(contract::net::netmask(PREFIX));
        let in_net = u32::from(f.guest) & mask == u32::from(NETWORK);
        let broadcast = Ipv4Addr::from(u32::from(NETWORK) | !mask);
        if !in_net || [NETWORK, GATEWAY, DNS, GUEST, broadcast].contains(&f.guest) {
            bail!(
                "--guest-forward {shown}: the guest address must be a free address of QEMU's \
                 user-mode network {NETWORK}/{PREFIX}: not the network, the gateway {GATEWAY}, \
                 the DNS server {DNS}, the guest {GUEST} or the broadcast address (10.0.2.100, \
                 say)"
            );
        }
        if !f.host.is_loopback() {
            bail!(
                "--guest-forward {shown}: the host address must be a loopback address \
                 (127.0.0.1): the guest may reach only services on this host's loopback"
            );
        }
        Ok(f)
    }

    /// QEMU's `guestfwd=` value: each connection of the guest runs
    /// `relay` (this program: `imager relay HOST:PORT`, [`relay`]), which
    /// connects to the host's port and copies both ways. (QEMU's other
    /// form, a `tcp:` character device, connects once when QEMU starts and
    /// makes every connection of the guest share that one stream: no use
    /// for an HTTP client, nor across the guest's reboots.)
    pub fn render(&self, relay: &std::path::Path) -> Result<String> {
        let program = relay.to_str().filter(|p| {
            !p.is_empty() && !p.contains([',', '\'', '"', '\\', '\n']) && p.starts_with('/')
        });
        let Some(program) = program else {
            bail!(
                "--guest-forward: this program's path {} cannot be put in QEMU's options (it \
                 must be absolute, without commas or quotes)",
                relay.display()
            );
        };
        Ok(format!(
            "guestfwd=tcp:{}:{}-cmd:{program} relay {}:{}",
            self.guest, self.guest_port, self.host, self.host_port
        ))
    }
}

/// `imager relay HOST:PORT`, run by QEMU for each connection of the guest
/// to a [`GuestForward`]: connects to HOST:PORT (a loopback address only)
/// and copies stdin to it and what it sends to stdout, until both ends are
/// done.
pub fn relay(to: &str) -> Result<()> {
    use anyhow::Context;
    use std::io::Write;
    let addr: std::net::SocketAddr = to
        .parse()
        .map_err(|_| anyhow::anyhow!("relay: {to:?} is not IP:PORT"))?;
    if !addr.ip().is_loopback() {
        bail!("relay: {addr} is not a loopback address");
    }
    let stream = std::net::TcpStream::connect(addr).with_context(|| format!("relay: {addr}"))?;
    let mut up = stream.try_clone().context("relay")?;
    let upstream = std::thread::spawn(move || {
        let _ = std::io::copy(&mut std::io::stdin().lock(), &mut up);
        let _ = up.shutdown(std::net::Shutdown::Write);
    });
    // Each piece goes out at once: stdout is line-buffered, and a reply
    // that does not end in a newline (an HTTP body on a kept-alive
    // connection) would wait in the buffer for ever.
    let mut down = stream;
    let mut out = std::io::stdout().lock();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        use std::io::Read;
        match down.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if out.write_all(&buf[..n]).and_then(|()| out.flush()).is_err() {
                    break;
                }
            }
        }
    }
    // The host's side is done: so is the relay (QEMU closes the guest's
    // connection when this process ends).
    drop(upstream);
    Ok(())
}

/// QEMU's arguments for the guest's network: none without a NIC; else the
/// user-mode netdev (restricted, with the forwards) and the NIC, without
/// option ROM. Refuses a host port forwarded twice, or a guest
/// address and port forwarded twice.
pub fn args(net: &NetOptions) -> Result<Vec<String>> {
    if !net.nic {
        if !net.forwards.is_empty() || !net.guest_forwards.is_empty() {
            bail!("port forwards need the guest's NIC");
        }
        return Ok(Vec::new());
    }
    let mut seen = std::collections::BTreeSet::new();
    for f in &net.forwards {
        if !seen.insert(f.host_port) {
            bail!("--forward: host port {} is forwarded twice", f.host_port);
        }
    }
    let mut seen = std::collections::BTreeSet::new();
    for f in &net.guest_forwards {
        if !seen.insert((f.guest, f.guest_port)) {
            bail!(
                "--guest-forward: {}:{} is forwarded twice",
                f.guest,
                f.guest_port
            );
        }
    }
    let mut netdev = "user,id=net0,restrict=on".to_string();
    for f in &net.forwards {
        netdev.push(',');
        netdev.push_str(&f.render());
    }
    if !net.guest_forwards.is_empty() {
        let relay = match &net.relay {
            Some(r) => r.clone(),
            None => std::env::current_exe()
                .map_err(|e| anyhow::anyhow!("--guest-forward: finding this program: {e}"))?,
        };
        for f in &net.guest_forwards {
            netdev.push(',');
            netdev.push_str(&f.render(&relay)?);
        }
    }
    Ok(vec![
        "-netdev".into(),
        netdev,
        "-device".into(),
        format!("{},netdev=net0,romfile=", net.model.device()),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_the_nic_and_the_forwards() {
        assert_eq!(
            args(&NetOptions::default()).unwrap(),
            [
                "-netdev",
                "user,id=net0,restrict=on",
                "-device",
                "virtio-net-pci,netdev=net0,romfile="
            ]
        );
        let net = NetOptions {
            nic: true,
            model: Nic::Vmxnet3,
            forwards: vec![
                Forward::parse("8443:50000").unwrap(),
                Forward::parse("2222:22").unwrap(),
                Forward::parse("2223:10.0.2.20:22").unwrap(),
            ],
            guest_forwards: vec![GuestForward::parse("10.0.2.100:5000=127.0.0.1:5001").unwrap()],
            relay: Some("/usr/bin/imager".into()),
        };
        assert_eq!(
            args(&net).unwrap()[1],
            "user,id=net0,restrict=on,hostfwd=tcp:127.0.0.1:8443-:50000,\
             hostfwd=tcp:127.0.0.1:2222-:22,\
             hostfwd=tcp:127.0.0.1:2223-10.0.2.20:22,\
             guestfwd=tcp:10.0.2.100:5000-cmd:/usr/bin/imager relay 127.0.0.1:5001"
        );
        let none = NetOptions {
            nic: false,
            ..NetOptions::default()
        };
        assert!(args(&none).unwrap().is_empty());
    }

    #[test]
    fn names_each_nic_and_refuses_others() {
        for n in Nic::ALL {
            assert_eq!(n.name().parse::<Nic>(), Ok(n));
        }
        let e1000e = NetOptions {
            model: Nic::E1000e,
            ..NetOptions::default()
        };
        assert_eq!(args(&e1000e).unwrap()[3], "e1000e,netdev=net0,romfile=");
        let err = "rtl8139".parse::<Nic>().unwrap_err();
        assert!(
            err.contains("not a NIC: one of virtio, e1000, e1000e, vmxnet3"),
            "{err}"
        );
    }

    #[test]
    fn refuses_bad_forwards() {
        for (bad, why) in [
            ("8443", "HOSTPORT:[GUESTIP:]GUESTPORT"),
            ("0:22", "not a port"),
            ("65536:22", "not a port"),
            ("+80:22", "not a port"),
            ("80:", "not a port"),
            (":22", "not a port"),
            ("80:22:1", "not a port"),
            ("127.0.0.1:80:22", "not a port"),
            ("80:10.0.2:22", "not an IPv4 address"),
            ("80:10.0.2.20:", "not a port"),
        ] {
            let e = Forward::parse(bad).unwrap_err().to_string();
            assert!(e.contains(why), "{bad}: {e}");
        }
        for (bad, why) in [
            ("10.0.2.100:5000", "GUESTIP:GUESTPORT=HOSTIP:HOSTPORT"),
            (
                "10.0.2.100=127.0.0.1:5000",
                "GUESTIP:GUESTPORT=HOSTIP:HOSTPORT",
            ),
            ("10.0.2.100:0=127.0.0.1:5000", "not a port"),
            ("10.0.2.100:5000=127.0.0.1:x", "not a port"),
            ("10.0.2:5000=127.0.0.1:5000", "not an IPv4 address"),
            ("10.0.2.100:5000=localhost:5000", "not an IPv4 address"),
            ("10.0.3.100:5000=127.0.0.1:5000", "free address"),
            ("10.0.2.2:5000=127.0.0.1:5000", "free address"),
            ("10.0.2.3:5000=127.0.0.1:5000", "free address"),
            ("10.0.2.15:5000=127.0.0.1:5000", "free address"),
            ("10.0.2.255:5000=127.0.0.1:5000", "free address"),
            ("10.0.2.0:5000=127.0.0.1:5000", "free address"),
            ("10.0.2.100:5000=192.168.1.1:5000", "loopback"),
            ("10.0.2.100:5000=0.0.0.0:5000", "loopback"),
        ] {
            let e = GuestForward::parse(bad).unwrap_err().to_string();
            assert!(e.contains(why), "{bad}: {e}");
        }
        let twice = NetOptions {
            forwards: vec![
                Forward::parse("80:1").unwrap(),
                Forward::parse("80:2").unwrap(),
            ],
            ..NetOptions::default()
        };
        assert!(args(&twice).unwrap_err().to_string().contains("twice"));
        let twice = NetOptions {
            guest_forwards: vec![
                GuestForward::parse("10.0.2.100:5000=127.0.0.1:1").unwrap(),
                GuestForward::parse("10.0.2.100:5000=127.0.0.1:2").unwrap(),
            ],
            ..NetOptions::default()
        };
        assert!(args(&twice).unwrap_err().to_string().contains("twice"));
        let nic_off = NetOptions {
            nic: false,
            forwards: vec![Forward::parse("80:1").unwrap()],
            ..NetOptions::default()
        };
        assert!(args(&nic_off).is_err());
    }
}
