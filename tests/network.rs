//! The guest's network (README "Network", docs/design.md "Network"): what
//! the built kernel has (IPv4 and virtio-net; no IPv6, netfilter or packet
//! sockets), read from the kernel cache's own `.config` and build log and
//! from the booted kernel's console; what a booted node reaches (QEMU's
//! user-mode network with `restrict=on`: nothing on the host but what
//! `--guest-forward` forwards), shown by the node API pulling an installer
//! image from a registry on the host's loopback both ways; and what the
//! node takes from a registry (an image pushed without `skopeo copy
//! --preserve-digests`, its layers gzipped, is refused saying how to push
//! it; the same image pushed with it is taken); and per-node settings: two
//! nodes from one image, each provisioned with its own address and
//! hostname, answer each on its own address, and bad settings are refused
//! before anything is written.

// Test helpers panic on unexpected failures: that is how a test fails.
#![allow(clippy::unwrap_used)]

mod common;
#[path = "../registry/tests/common/mod.rs"]
mod reg;

use common::vm::*;
use common::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

/// `grep ARGS FILE`: the matching lines (grep exits 1 when none match, 2
/// on an error, which fails the test).
fn grep(args: &[&str], file: &Path) -> Vec<String> {
    let out = run(tool("grep").args(args).arg(file));
    assert!(
        out.status.code() == Some(0) || out.status.code() == Some(1),
        "grep {args:?} {}: {}",
        file.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

/// The kernel metal's images boot, as the kernel cache holds it: `imager
/// kernel build --profile metal` (built once, then cached) prints its
/// bzImage, beside which the cache keeps the build tree's `.config`
/// (`config`) and the log of the compile (`build.log`). Both are read with
/// grep, not with imager's Kconfig reader: the symbols are off in the
/// configuration, and no object of IPv6, netfilter or packet sockets was
/// compiled, while IPv4's and virtio-net's were.
#[test]
fn the_built_kernel_has_ipv4_and_no_ipv6_netfilter_or_packet_sockets() {
    let bzimage = PathBuf::from(
        ok(imager().args(["kernel", "build", "--profile", "metal"]))
            .trim()
            .to_string(),
    );
    let dir = bzimage.parent().unwrap();
    let config = dir.join("config");
    let log = dir.join("build.log");

    for on in ["CONFIG_NET=y", "CONFIG_INET=y", "CONFIG_VIRTIO_NET=y"] {
        assert_eq!(grep(&["-x", on], &config), [on], "{}", config.display());
    }
    for off in ["IPV6", "NETFILTER", "PACKET"] {
        let line = format!("# CONFIG_{off} is not set");
        assert_eq!(
            grep(&["-x", &line], &config),
            std::slice::from_ref(&line),
            "{}",
            config.display()
        );
    }
    // Nor anything of theirs built in or as a module (netfilter's tables
    // and conntrack, IPv6's and packet sockets' diagnostics, bridging's
    // hooks).
    let on = grep(
        &[
            "-E",
            "^CONFIG_(IPV6|IP6_|NETFILTER|NF_|NFT_|IP_NF_|IP6_NF_|IP_VS|BRIDGE_NF|PACKET)[A-Z0-9_]*=[ym]",
        ],
        &config,
    );
    assert!(on.is_empty(), "{}: {on:?}", config.display());

    // The compile itself: IPv4's and virtio-net's objects were built; of
    // net/ipv6 only the checksum and offload helpers that net/ipv6/Makefile
    // builds for every kernel with INET (addrconf_core.o, ip6_checksum.o,
    // ...), not the protocol (af_inet6.o, tcp_ipv6.o, ndisc.o: built with
    // IPV6); nothing of net/netfilter, IPv4's or bridging's netfilter, or
    // net/packet.
    for built in [
        "net/ipv4/af_inet.o",
        "net/ipv4/tcp.o",
        "drivers/net/virtio_net.o",
        "net/ipv6/ip6_checksum.o",
    ] {
        assert!(
            !grep(&["-F", built], &log).is_empty(),
            "{} does not show {built} compiled",
            log.display()
        );
    }
    let built = grep(
        &[
            "-E",
            "net/ipv6/(af_inet6|tcp_ipv6|ndisc|route|addrconf)\\.o|(net/netfilter|net/ipv4/netfilter|net/bridge/netfilter|net/packet)/",
        ],
        &log,
    );
    assert!(built.is_empty(), "{}: {built:?}", log.display());
}

/// Where the guest reaches the test's registry through `--guest-forward`.
const GUEST_REGISTRY: &str = "10.0.2.100:5000";
/// QEMU's user-mode network's alias of the host, which without
/// `restrict=on` is the host's loopback.
const HOST_ALIAS: &str = "10.0.2.2";

/// The node's API as the operator `ops` of `creds`: `imager node ARGS`.
fn as_ops(vm: &Vm, creds: &Path, args: &[&str]) -> std::process::Output {
    node_cmd(vm, creds, "ops", args)
}

/// The stderr of an `imager node upgrade --image IMAGE` (as `ops`) that
/// must be refused.
fn refused_upgrade(vm: &Vm, creds: &Path, image: &str) -> String {
    let out = as_ops(vm, creds, &["upgrade", "--image", image]);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !out.status.success(),
        "{image}: expected a refusal, got: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    err
}

/// `skopeo copy` of `archive` to `docker://REGISTRY/NAME` over plain HTTP
/// without `--preserve-digests`, as README's reader might push it.
fn skopeo_copy_gzipped(archive: &Path, registry: &str, name: &str) {
    ok(tool("skopeo")
        .args(["copy", "--quiet", "--dest-tls-verify=false"])
        .arg(format!("oci-archive:{}", archive.display()))
        .arg(format!("docker://{registry}/{name}")));
}

/// The layers' media types of `docker://REGISTRY/NAME`, as skopeo reads
/// the registry's manifest.
fn layer_types(registry: &str, name: &str) -> Vec<String> {
    let m: Value = serde_json::from_str(&ok(tool("skopeo")
        .args(["inspect", "--raw", "--tls-verify=false"])
        .arg(format!("docker://{registry}/{name}"))))
    .unwrap();
    m["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["mediaType"].as_str().unwrap().to_string())
        .collect()
}

/// A node booted by `imager boot` with its registry forwarded
/// (`--guest-forward 10.0.2.100:5000=127.0.0.1:P`, P a counting proxy in
/// front of a real registry): a pull from `10.0.2.2:P`, the user-mode
/// network's alias of the host's loopback, never reaches P (the node says
/// it cannot reach the registry, P counts no connection), while pulls
/// through the forward do. The image pushed with `skopeo copy` without
/// `--preserve-digests` (layers gzipped) is refused with a message that
/// names the flag; the same archive pushed with it is pulled, verified and
/// staged. The boot's console shows IPv4 registered and neither IPv6 nor
/// packet sockets.
#[test]
fn the_guest_reaches_the_host_only_through_guest_forward_and_a_node_takes_only_preserved_layers() {
    let creds = scratch().join("network-credentials");
    let _ = std::fs::remove_dir_all(&creds);
    for args in [
        &["--role", "operator", "--name", "ops"][..],
        &["--node", "node1", "--address", "127.0.0.1"][..],
    ] {
        ok(imager()
            .args(["node", "credentials"])
            .arg(&creds)
            .args(args));
    }
    let profile = write_profile_from("installer", "network", |t| {
        format!(
            "{t}\nnode_api:\n  ca: {}\n  plain_http_registries: [{GUEST_REGISTRY}]\n",
            creds.join("ca.crt").display()
        )
    });
    let b = build_profile(
        "network",
        &profile,
        &["--key", &dev_key().display().to_string()],
    );
    let archive = b.dir.join("installer.tar");

    // The registry on the host's loopback, behind a proxy that counts the
    // connections it accepts; the installer image in it both ways, without
    // --preserve-digests first (skopeo does not gzip a layer the registry
    // already holds uncompressed: it reuses it).
    let registry = reg::Registry::start();
    let proxy = reg::CuttingProxy::start(&registry.addr, u64::MAX);
    skopeo_copy_gzipped(&archive, &registry.addr, "metal/installer:gzipped");
    reg::skopeo_copy(
        &format!("oci-archive:{}", archive.display()),
        &registry.addr,
        "metal/installer:kept",
    );
    let tar = "application/vnd.oci.image.layer.v1.tar";
    assert!(
        layer_types(&registry.addr, "metal/installer:kept")
            .iter()
            .all(|t| t == tar)
    );
    let gzipped = layer_types(&registry.addr, "metal/installer:gzipped");
    assert!(
        gzipped.iter().all(|t| t == &format!("{tar}+gzip")),
        "skopeo did not gzip the layers: {gzipped:?}"
    );

    let disk = sparse_copy(&b.artifact("raw"), "network");
    provision_node1(&disk, &creds);
    let port = reg::free_port();
    let mut vm = Vm::boot(
        &disk,
        port,
        &[
            "--guest-forward",
            &format!("{GUEST_REGISTRY}={}", proxy.addr),
        ],
    );
    let ready = vm.wait_for("ready version=", 1);
    assert!(ready.contains("version=0.1.0 slot=A"), "{ready}");
    vm.wait_for("api: listening on port", 1);

    // The booted kernel: IPv4 registered, no IPv6 or packet sockets.
    let console = vm.console();
    assert!(
        console.contains("NET: Registered PF_INET protocol family"),
        "{console}"
    );
    for family in ["PF_INET6", "PF_PACKET"] {
        assert!(!console.contains(family), "{family}:\n{console}");
    }

    // Through the host alias: the node cannot reach the proxy, which sees
    // nothing.
    assert_eq!(proxy.connections.load(Ordering::SeqCst), 0);
    let proxy_port = proxy.addr.rsplit(':').next().unwrap();
    let direct = format!("{HOST_ALIAS}:{proxy_port}");
    let err = refused_upgrade(&vm, &creds, &format!("{direct}/metal/installer:kept"));
    assert!(
        err.contains(&format!("cannot reach registry {direct}")),
        "{err}"
    );
    assert_eq!(
        proxy.connections.load(Ordering::SeqCst),
        0,
        "the guest reached the host's loopback at {direct}"
    );

    // Through the forward: the gzipped image is read and refused, saying
    // how to push it; nothing changes.
    let image = format!("{GUEST_REGISTRY}/metal/installer:gzipped");
    let err = refused_upgrade(&vm, &creds, &image);
    assert!(
        err.contains(&format!(
            "layer 0 of {image} is {tar}+gzip, not an uncompressed tar: push the installer \
             image with `skopeo copy --preserve-digests`"
        )),
        "{err}"
    );
    assert!(proxy.connections.load(Ordering::SeqCst) > 0);
    let s = status(&vm, &creds, "ops");
    assert_eq!(s["slots"][1]["status"], "empty", "{s}");
    assert!(s["staged"].is_null(), "{s}");

    // The same archive pushed with --preserve-digests: pulled, verified
    // and staged into slot B.
    let out = as_ops(
        &vm,
        &creds,
        &[
            "upgrade",
            "--image",
            &format!("{GUEST_REGISTRY}/metal/installer:kept"),
            "--stage",
            "--wait",
        ],
    );
    assert!(
        out.status.success(),
        "{}\nconsole:\n{}",
        String::from_utf8_lossy(&out.stderr),
        vm.console()
    );
    let s = status(&vm, &creds, "ops");
    assert_eq!(s["staged"], "0.1.0 in slot B", "{s}");
    drop(vm);
    std::fs::remove_file(&disk).unwrap();
}

/// Two nodes from one default image (whose network is eth0 by DHCP), each
/// provisioned with its own static address, hostname and DNS server: each
/// says on its console what it configured and from where, and answers its
/// API on its own address: the host's port is forwarded to that address
/// only (a node at QEMU's DHCP address, 10.0.2.15, would not answer). The
/// settings were written into META, which `imager inspect` shows.
#[test]
fn two_nodes_from_one_image_answer_each_on_its_own_provisioned_address() {
    let creds = scratch().join("nodes-credentials");
    let _ = std::fs::remove_dir_all(&creds);
    ok(imager()
        .args(["node", "credentials"])
        .arg(&creds)
        .args(["--role", "reader", "--name", "watcher"]));
    let b = build_into("network-nodes");
    let nodes = [("node1", "10.0.2.21"), ("node2", "10.0.2.22")];
    let mut vms = Vec::new();
    for (name, ip) in nodes {
        ok(imager().args(["node", "credentials"]).arg(&creds).args([
            "--node",
            name,
            "--address",
            "127.0.0.1",
        ]));
        let disk = sparse_copy(&b.artifact("raw"), &format!("network-{name}"));
        ok(imager()
            .args(["node", "provision"])
            .arg(&disk)
            .arg("--credentials")
            .arg(&creds)
            .args(["--node", name, "--hostname", name])
            .args([
                "--net",
                &format!("eth0:{ip}/24:10.0.2.2"),
                "--dns",
                "10.0.2.3",
            ]));
        let inspect = ok(imager().args(["inspect", "--json"]).arg(&disk));
        assert!(
            inspect.contains(&format!("net=eth0:{ip}/24:10.0.2.2")),
            "{name}: inspect does not show the settings:\n{inspect}"
        );
        let vm = Vm::boot_at(&disk, reg::free_port(), Some(ip), &[]);
        vms.push((name, ip, vm, disk));
    }
    for (name, ip, vm, _) in &mut vms {
        vm.wait_for("ready version=", 1);
        let console = vm.console();
        for want in [
            format!("host: hostname {name} (the node's settings in META)"),
            format!("net: eth0 {ip}/24 gateway 10.0.2.2 (up; the node's settings in META)"),
            "net: DNS servers 10.0.2.3 (the node's settings in META)".to_string(),
        ] {
            assert!(
                console.lines().any(|l| said(l, &want)),
                "{name}: no line {want:?}; console:\n{}",
                tail(&console)
            );
        }
        assert!(!console.contains("by DHCP"), "{name}:\n{}", tail(&console));
        vm.wait_for("api: listening on port", 1);
        let out = run(imager()
            .args(["node", "status", "--json", "--node", &vm.node()])
            .args([
                "--server-name",
                name,
                "--client",
                "watcher",
                "--credentials",
            ])
            .arg(&creds));
        assert!(
            out.status.success(),
            "{name} at {ip}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let s: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(s["booted_slot"], "A", "{name}: {s}");
    }
    for (_, _, vm, disk) in vms {
        drop(vm);
        std::fs::remove_file(&disk).unwrap();
    }
}

/// Bad node settings are refused, saying why, before anything is written:
/// a gateway outside the address's prefix, a DNS server that is the node's
/// own address, a bad hostname, a bad interface; by `imager node provision`
/// (the disk's bytes are unchanged) and by `imager install` (no disk file
/// is made).
#[test]
fn bad_node_settings_are_refused_before_anything_is_written() {
    let b = build_into("network-refusals");
    let disk = sparse_copy(&b.artifact("raw"), "network-refusals");
    let before = sha256(&disk);
    let cases: [(&[&str], &str); 5] = [
        (
            &["--net", "eth0:10.0.2.21/24:10.0.3.1"],
            "not in the subnet",
        ),
        (
            &["--net", "eth0:10.0.2.21/24", "--dns", "10.0.2.3,10.0.2.21"],
            "the node's own address",
        ),
        (&["--hostname", "node_1"], "a character other than"),
        (&["--net", "eth/0:dhcp"], "interface name"),
        (&["--dns", "1.1.1.1,1.0.0.1,8.8.8.8,8.8.4.4"], "at most 3"),
    ];
    for (args, why) in cases {
        let out = run(imager().args(["node", "provision"]).arg(&disk).args(args));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(why) && err.contains("nothing was written"),
            "provision {args:?}: {err}"
        );
        assert_eq!(sha256(&disk), before, "provision {args:?} changed the disk");
        let new = scratch().join("network-refused-install.raw");
        let _ = std::fs::remove_file(&new);
        let out = run(imager()
            .args(["install", "--installer"])
            .arg(&b.dir)
            .arg("--disk")
            .arg(&new)
            .args(args));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(why),
            "install {args:?}: {err}"
        );
        assert!(!new.exists(), "install {args:?} made {}", new.display());
    }
    // Nothing to provision at all.
    let out = run(imager().args(["node", "provision"]).arg(&disk));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("nothing to provision"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::remove_file(&disk).unwrap();
}
