//! End-to-end tests of the node API (docs/node-api.md), booted under OVMF
//! with QEMU's user-mode network: the API reached through a port forwarded
//! on the host's loopback (`hostfwd`), a registry on the host's loopback
//! reached by the guest at 10.0.2.100:5000 (`guestfwd`), nothing else. A
//! v1 disk is provisioned with a node's credentials and booted once; the
//! test then talks to it as clients of each role and of another CA, has it
//! refuse bad images, upgrade itself to v2 from the registry, roll back,
//! reboot and power off. A second test does the same upgrade on a Secure
//! Boot node under OVMF's Secure Boot firmware, and has it refuse a
//! payload signed for another db key.

// Test helpers panic on unexpected failures: that is how a test fails.
#![allow(clippy::unwrap_used)]

mod common;
#[path = "../registry/tests/common/mod.rs"]
mod reg;

use common::vm::*;
use common::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// machined's memory budget (docs/node-api.md, "Memory"): its peak RSS
/// after pulls, refused ones included.
const RSS_BUDGET_KIB: u64 = 32 * 1024;

/// Where the guest reaches the test's registry.
const GUEST_REGISTRY: &str = "10.0.2.100:5000";
/// Where the guest reaches the same registry through a proxy that drips
/// its answers, a byte a second.
const GUEST_DRIP: &str = "10.0.2.102:5000";
/// Where the guest reaches the same registry through a proxy that cuts
/// each connection after 1 MiB of answers: in the middle of the payload
/// layer.
const GUEST_CUT: &str = "10.0.2.103:5000";

fn build_variant_of(base: &str, name: &str, edit: impl Fn(String) -> String) -> Build {
    let profile = write_profile_from(base, name, edit);
    build_profile(name, &profile, &["--key", &dev_key().display().to_string()])
}

/// The cluster's credentials: clients `watcher` (reader), `ops`
/// (operator), `root` (admin), node `node1`; and `mallory`, an admin of
/// another CA, in a directory that otherwise trusts the cluster's CA.
fn credentials(dir: &Path) -> (PathBuf, PathBuf) {
    let _ = std::fs::remove_dir_all(dir);
    let creds = dir.join("cluster");
    let other = dir.join("other");
    for (d, args) in [
        (&creds, vec!["--role", "reader", "--name", "watcher"]),
        (&creds, vec!["--role", "operator", "--name", "ops"]),
        (&creds, vec!["--role", "admin", "--name", "root"]),
        (&creds, NODE1.to_vec()),
        (&other, vec!["--role", "admin", "--name", "mallory"]),
        (&other, vec!["--node", "node1", "--address", "127.0.0.1"]),
    ] {
        ok(imager().args(["node", "credentials"]).arg(d).args(args));
    }
    // mallory's certificate and key beside the cluster's CA certificate:
    // she trusts the node; the node must not trust her.
    let mixed = dir.join("mixed");
    std::fs::create_dir_all(&mixed).unwrap();
    std::fs::copy(creds.join("ca.crt"), mixed.join("ca.crt")).unwrap();
    for f in ["mallory.crt", "mallory.key"] {
        std::fs::copy(other.join(f), mixed.join(f)).unwrap();
    }
    (creds, other)
}

/// A node booted with the registries: `registries` are the addresses on
/// the host of [`GUEST_REGISTRY`], [`GUEST_DRIP`] and [`GUEST_CUT`].
fn start(disk: &Path, port: u16, registries: [&str; 3]) -> Vm {
    start_with(disk, port, registries, &[])
}

/// [`start`] with more arguments to `imager boot`.
fn start_with(disk: &Path, port: u16, [registry, drip, cut]: [&str; 3], extra: &[&str]) -> Vm {
    let forwards = [
        format!("{GUEST_REGISTRY}={registry}"),
        format!("{GUEST_DRIP}={drip}"),
        format!("{GUEST_CUT}={cut}"),
    ];
    let mut args: Vec<&str> = Vec::new();
    for f in &forwards {
        args.extend(["--guest-forward", f]);
    }
    args.extend(extra);
    Vm::boot(disk, port, &args)
}

/// SHA-256 of the partitions the installer and the runtime write (BOOT,
/// META) of `disk`.
fn written_partitions(disk: &Path) -> [(&'static str, String); 2] {
    ["BOOT", "META"].map(|p| (p, partition_sha256(disk, p)))
}

/// Sends `line` as is over the node API as `client` and returns the node's
/// first answer line: what a client that does not use imager can send.
fn raw_request(vm: &Vm, dir: &Path, client: &str, line: &[u8]) -> String {
    use std::io::{Read, Write};
    let read = |f: &str| std::fs::read(dir.join(f)).unwrap();
    let config = nodeapi::tls::client_config(
        &read("ca.crt"),
        &read(&format!("{client}.crt")),
        &read(&format!("{client}.key")),
    )
    .unwrap();
    let sock = std::net::TcpStream::connect(("127.0.0.1", vm.port)).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let conn = rustls::ClientConnection::new(config, "node1".try_into().unwrap()).unwrap();
    let mut tls = rustls::StreamOwned::new(conn, sock);
    tls.write_all(line).unwrap();
    tls.flush().unwrap();
    let mut answer = Vec::new();
    let mut byte = [0u8; 1];
    while answer.len() < 1 << 20 && tls.read(&mut byte).unwrap_or(0) == 1 && byte[0] != b'\n' {
        answer.push(byte[0]);
    }
    String::from_utf8_lossy(&answer).into_owned()
}

/// A tar header of `kind` claiming `size` bytes, then a few blocks of its
/// "data" (a reader that trusts the size reads on for ever, or holds it
/// all in memory).
fn hostile_header(kind: tar::EntryType, size: u64) -> Vec<u8> {
    let mut h = tar::Header::new_gnu();
    h.set_path("././@LongLink").unwrap();
    h.set_entry_type(kind);
    h.set_size(size);
    h.set_mode(0o644);
    h.set_cksum();
    let mut out = h.as_bytes().to_vec();
    out.extend(vec![b'a'; 8 * 512]);
    out
}

/// A credentials directory `dir` for client `late`: an operator's
/// certificate issued by the cluster CA of `creds`, valid only in 2020.
fn expired_client(creds: &Path, dir: &Path) -> PathBuf {
    use rcgen::{
        CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, Issuer, KeyPair,
        KeyUsagePurpose,
    };
    use std::os::unix::fs::PermissionsExt;
    let ca = std::fs::read_to_string(creds.join("ca.crt")).unwrap();
    let ca_key =
        KeyPair::from_pem(&std::fs::read_to_string(creds.join("ca.key")).unwrap()).unwrap();
    let issuer = Issuer::from_ca_cert_pem(&ca, ca_key).unwrap();
    let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let mut p = CertificateParams::default();
    p.distinguished_name = DistinguishedName::new();
    p.distinguished_name.push(DnType::CommonName, "late");
    p.distinguished_name.push(
        DnType::OrganizationName,
        nodeapi::Role::Operator.organization(),
    );
    p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    p.use_authority_key_identifier_extension = true;
    p.not_before = rcgen::date_time_ymd(2020, 1, 1);
    p.not_after = rcgen::date_time_ymd(2020, 12, 31);
    let cert = p.signed_by(&key, &issuer).unwrap();
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("ca.crt"), &ca).unwrap();
    std::fs::write(dir.join("late.crt"), cert.pem()).unwrap();
    std::fs::write(dir.join("late.key"), key.serialize_pem()).unwrap();
    std::fs::set_permissions(dir.join("late.key"), std::fs::Permissions::from_mode(0o600)).unwrap();
    dir.to_path_buf()
}

/// `imager node ARGS --node … --credentials DIR --client NAME`.
/// [`node_command`] started, its output piped.
fn spawn_node_cmd(vm: &Vm, dir: &Path, client: &str, args: &[&str]) -> Child {
    node_command(vm, dir, client, args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The output of a call that must succeed; else the test fails with its
/// error and the console's tail.
fn succeeded(vm: &Vm, what: &str, out: std::process::Output) -> String {
    assert!(
        out.status.success(),
        "{what}: {}\nconsole:\n{}",
        String::from_utf8_lossy(&out.stderr),
        tail(&vm.console())
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn refused(out: &std::process::Output) -> String {
    assert!(
        !out.status.success(),
        "expected a refusal, got success: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The offset in the tar archive `layer` of the middle byte of the file
/// `path`'s contents.
fn middle_of_file(layer: &[u8], path: &str) -> usize {
    let mut archive = tar::Archive::new(layer);
    for e in archive.entries().unwrap() {
        let e = e.unwrap();
        let name = e.path().unwrap().to_string_lossy().into_owned();
        if name.trim_start_matches("./") == path {
            assert!(e.size() > 0, "{path} is empty");
            return (e.raw_file_position() + e.size() / 2) as usize;
        }
    }
    panic!("no {path} in the layer");
}

/// `imager node provision DISK --credentials DIR ARGS`.
fn provision(disk: &Path, dir: &Path, args: &[&str]) -> std::process::Command {
    let mut c = imager();
    c.args(["node", "provision"])
        .arg(disk)
        .arg("--credentials")
        .arg(dir)
        .args(args);
    c
}

fn inspect(disk: &Path) -> Value {
    serde_json::from_str(&ok(imager().args(["inspect", "--json"]).arg(disk))).unwrap()
}

fn meta_value(report: &Value, key: &str) -> Option<String> {
    report["meta"]["keys"]
        .as_array()
        .unwrap()
        .iter()
        .find(|kv| kv[0] == key)
        .map(|kv| kv[1].as_str().unwrap().to_string())
}

/// `imager node upgrade --image IMAGE ARGS` as `client`.
/// `imager node upgrade --image IMAGE ARGS --wait`: followed to its end,
/// so that a refusal after the node accepted the upgrade (a bad layer, a
/// deadline) is seen (without --wait the client returns at acceptance).
fn upgrade(vm: &Vm, dir: &Path, client: &str, image: &str, args: &[&str]) -> std::process::Output {
    let mut all = vec!["upgrade", "--image", image];
    all.extend_from_slice(args);
    if !args.contains(&"--wait") {
        all.push("--wait");
    }
    node_cmd(vm, dir, client, &all)
}

/// Connections to the node's API port that never finish a TLS handshake,
/// opened from a thread: up to 48 held at once, every other one dripping
/// a byte every 2 s, each reopened when the node closes it, at most 300 in
/// all. (QEMU's port forward accepts them one at a time, so they come at
/// its pace.)
struct Flood {
    stop: Arc<AtomicBool>,
    opened: Arc<AtomicUsize>,
    closed: Arc<AtomicUsize>,
    thread: std::thread::JoinHandle<()>,
}

impl Flood {
    fn start(port: u16) -> Flood {
        let stop = Arc::new(AtomicBool::new(false));
        let opened = Arc::new(AtomicUsize::new(0));
        let closed = Arc::new(AtomicUsize::new(0));
        let (flag, o, c) = (stop.clone(), opened.clone(), closed.clone());
        let thread = std::thread::spawn(move || {
            use std::io::{Read, Write};
            let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
            let mut open: Vec<(std::net::TcpStream, bool)> = Vec::new();
            let mut last_drip = Instant::now();
            while !flag.load(Ordering::SeqCst) {
                if open.len() < 48
                    && o.load(Ordering::SeqCst) < 300
                    && let Ok(s) =
                        std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1))
                {
                    s.set_nonblocking(true).unwrap();
                    let n = o.fetch_add(1, Ordering::SeqCst);
                    open.push((s, n % 2 == 1));
                }
                let drip = last_drip.elapsed() >= Duration::from_secs(2);
                if drip {
                    last_drip = Instant::now();
                }
                // Drip, and drop those the node closed.
                open.retain_mut(|(s, drips)| {
                    let mut b = [0u8; 64];
                    let gone = match s.read(&mut b) {
                        Ok(0) => true,
                        Ok(_) => false,
                        Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
                    };
                    let gone = gone || (*drips && drip && s.write(&[0x16]).is_err());
                    if gone {
                        c.fetch_add(1, Ordering::SeqCst);
                    }
                    !gone
                });
                if open.len() >= 48 {
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        });
        Flood {
            stop,
            opened,
            closed,
            thread,
        }
    }

    /// Waits (at most 5 minutes) until `n` connections were opened.
    fn wait_opened(&self, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(300);
        while self.opened.load(Ordering::SeqCst) < n {
            assert!(
                Instant::now() < deadline,
                "the flood opened only {} connections in 5 minutes",
                self.opened.load(Ordering::SeqCst)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Stops the flood (its connections closed); (opened, closed by the
    /// node).
    fn stop(self) -> (usize, usize) {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.join().unwrap();
        (
            self.opened.load(Ordering::SeqCst),
            self.closed.load(Ordering::SeqCst),
        )
    }
}

/// The slots as the node reports them: (status, version) of A and B.
/// Whether a status says an upgrade is in progress (`upgrade: <step>`).
fn upgrading(s: &Value) -> bool {
    s["operation"]
        .as_str()
        .is_some_and(|o| o.starts_with("upgrade"))
}

fn slots(s: &Value) -> [(String, String); 2] {
    [0, 1].map(|i| {
        (
            s["slots"][i]["status"].as_str().unwrap().to_string(),
            s["slots"][i]["version"].as_str().unwrap().to_string(),
        )
    })
}

#[test]
fn the_node_upgrades_itself_from_a_registry_and_serves_each_role_only_what_it_may() {
    let dir = scratch().join("node-credentials");
    let (creds, other) = credentials(&dir);
    // The images carry the cluster's CA; v1 may pull from the test's
    // registries over plain HTTP (allowed by name).
    let node_api = |t: String, plain: &str| {
        format!(
            "{t}\nnode_api:\n  ca: {}\n  plain_http_registries: [{plain}]\n",
            creds.join("ca.crt").display()
        )
    };
    let v1 = build_variant_of("metal", "node-v1", |t| {
        node_api(
            t,
            &format!("{GUEST_REGISTRY}, 10.0.2.101:5000, {GUEST_DRIP}, {GUEST_CUT}"),
        )
    });
    // v2 fixes a vulnerability: security version 1. Once it is blessed,
    // the node refuses what has less (v1, v3) without an admin's
    // --allow-downgrade.
    let v2 = build_variant_of("installer", "node-v2", |t| {
        node_api(
            t.replace("version: 0.1.0", "version: 0.2.0\nsecurity_version: 1"),
            "",
        )
    });
    // v3 never gets ready; "foreign" is v2 signed by a key the node does
    // not trust.
    let v3 = build_variant_of("installer", "node-v3", |t| {
        t.replace("version: 0.1.0", "version: 0.3.0").replace(
            "    - vdso32=0\n",
            "    - vdso32=0\n    - machined.break=ready\n",
        )
    });
    let foreign_key = scratch().join("node-foreign.key");
    let _ = std::fs::remove_file(&foreign_key);
    let _ = std::fs::remove_file(foreign_key.with_extension("pub"));
    ok(imager()
        .args(["keygen", "--private"])
        .arg(&foreign_key)
        .arg("--public")
        .arg(foreign_key.with_extension("pub")));
    let profile = write_profile_from("installer", "node-foreign", |t| {
        t.replace("version: 0.1.0", "version: 0.2.0")
    });
    let foreign = build_profile(
        "node-foreign",
        &profile,
        &["--key", &foreign_key.display().to_string()],
    );
    let mixed = dir.join("mixed");

    // The installer images in a registry on the host's loopback, their
    // layers as built (--preserve-digests).
    let registry = reg::Registry::start();
    // v2 also under a newer tag, as a registry replaying an older signed
    // image would serve it.
    for (b, tag) in [
        (&v2, "0.2.0"),
        (&v3, "0.3.0"),
        (&foreign, "foreign"),
        (&v2, "v0.5.0"),
    ] {
        reg::skopeo_copy(
            &format!("oci-archive:{}", b.dir.join("installer.tar").display()),
            &registry.addr,
            &format!("metal/installer:{tag}"),
        );
    }
    let image = format!("{GUEST_REGISTRY}/metal/installer:0.2.0");

    let disk = sparse_copy(&v1.artifact("raw"), "node");

    // The built disk knows its cluster's CA before it is provisioned, and so
    // does a disk installed from the installer image.
    let ca = std::fs::read_to_string(creds.join("ca.crt")).unwrap();
    assert_eq!(
        meta_value(&inspect(&disk), "node-ca").as_deref(),
        Some(ca.as_str())
    );
    let installed = scratch().join("node-installed.raw");
    let _ = std::fs::remove_file(&installed);
    ok(imager()
        .args(["install", "--size", "2GiB", "--key"])
        .arg(dev_key().with_extension("pub"))
        .arg("--installer")
        .arg(v2.dir.join("installer.tar"))
        .arg("--disk")
        .arg(&installed));
    assert_eq!(
        meta_value(&inspect(&installed), "node-ca").as_deref(),
        Some(ca.as_str())
    );
    std::fs::remove_file(&installed).unwrap();
    // Credentials of another CA would lock the cluster's clients out.
    let out = run(&mut provision(&disk, &other, &["--node", "node1"]));
    assert!(refused(&out).contains("another cluster CA"));

    // Provisioning: the key goes into META and is never shown, and the
    // image file that holds it is made readable by its owner only.
    {
        use std::os::unix::fs::PermissionsExt;
        let private = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o077 == 0;
        std::fs::set_permissions(&disk, std::fs::Permissions::from_mode(0o644)).unwrap();
        let said = ok(&mut provision(&disk, &creds, &["--node", "node1"]));
        assert!(
            private(&disk),
            "the provisioned image is readable by others"
        );
        assert!(
            said.contains("readable by its owner only (it was 0644)"),
            "{said}"
        );
    }
    let key = std::fs::read_to_string(creds.join("node1.node.key")).unwrap();
    let key_body: String = key.lines().filter(|l| !l.starts_with("-----")).collect();
    let shown = ok(imager().arg("inspect").arg(&disk))
        + &ok(imager().args(["inspect", "--json"]).arg(&disk));
    assert!(
        !shown.contains(&key_body[40..60]),
        "inspect shows the node key"
    );
    let report = inspect(&disk);
    assert!(
        meta_value(&report, "node-key")
            .unwrap()
            .contains("not shown")
    );
    let cert = meta_value(&report, "node-cert").unwrap();
    assert_eq!(
        cert,
        std::fs::read_to_string(creds.join("node1.node.crt")).unwrap()
    );
    // Another CA's node credentials are not written over them without
    // --force; and a node name the certificate is not for is refused.
    let out = run(&mut provision(&disk, &other, &["--node", "node1"]));
    assert!(refused(&out).contains("--force"));
    let out = run(&mut provision(
        &disk,
        &creds,
        &["--node", "node2", "--force"],
    ));
    assert!(refused(&out).contains("node2"));
    assert_eq!(meta_value(&inspect(&disk), "node-cert").unwrap(), cert);

    // The node: v1 on slot A.
    let port = reg::free_port();
    let drip = reg::DrippingProxy::start(&registry.addr, Duration::from_secs(1));
    let cut = reg::CuttingProxy::start(&registry.addr, 1 << 20);
    let mut vm = start(&disk, port, [&registry.addr, &drip.addr, &cut.addr]);
    let ready = vm.wait_for("ready version=", 1);
    assert!(ready.contains("version=0.1.0 slot=A"), "{ready}");
    let console = vm.console();
    assert!(
        console.contains("api: listening on port 50000"),
        "{}",
        tail(&console)
    );

    // Status, as the reader.
    let s = status(&vm, &creds, "watcher");
    assert_eq!(s["version"], "0.1.0");
    assert_eq!(s["booted_slot"], "A");
    assert_eq!(s["name"], "metal");
    assert_eq!(s["ready"], true);
    assert_eq!(s["next_boot"], "A");
    let before = slots(&s);
    assert_eq!(before[0], ("good".to_string(), "0.1.0".to_string()));
    assert_eq!(before[1].0, "empty");
    let boot1 = s["boot_id"].as_str().unwrap().to_string();
    assert_eq!(boot1.len(), 36, "{boot1}");

    // A flood of connections that never finish their handshake (idle, or
    // dripping a byte at a time), reopened as the node closes them: the
    // operator's requests are still answered within seconds.
    let flood = Flood::start(vm.port);
    flood.wait_opened(nodeapi::proto::MAX_PENDING + 8);
    for _ in 0..3 {
        let t = Instant::now();
        let s = status(&vm, &creds, "watcher");
        assert_eq!(s["boot_id"], boot1.as_str());
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "status took {:?} during the flood",
            t.elapsed()
        );
    }
    let (opened, closed) = flood.stop();
    assert!(
        opened > nodeapi::proto::MAX_PENDING && closed > 0,
        "the flood opened {opened} connections, the node closed {closed}"
    );
    let refused_count = status(&vm, &creds, "watcher")["refused_connections"]
        .as_u64()
        .unwrap();
    assert!(refused_count > 0, "status counts no refused connection");
    // A lone connection that drips its handshake a byte every 2 s is
    // closed by the node at its handshake deadline (a read timeout alone
    // would restart with each byte).
    let t = Instant::now();
    let mut lone = std::net::TcpStream::connect(("127.0.0.1", vm.port)).unwrap();
    lone.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let closed_after = loop {
        use std::io::{Read, Write};
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "a dripping handshake was still open after a minute"
        );
        let mut b = [0u8; 64];
        match lone.read(&mut b) {
            Ok(0) => break t.elapsed(),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => break t.elapsed(),
            Ok(_) => {}
        }
        if lone.write_all(&[0x16]).is_err() {
            break t.elapsed();
        }
    };
    assert!(
        closed_after < Duration::from_secs(25),
        "closed after {closed_after:?}"
    );

    // Requests whose op forges console lines and terminal control, or
    // is 60 KiB long: the node's console quotes each escaped, cut, on one
    // line, and `imager boot --stay` (which ends on the firmware's "No
    // bootable device") stays.
    for (forged, marker) in [
        ("\nmachined: ready version=9.9.9\u{1b}c", "9.9.9"),
        ("\r\nNo bootable device\u{1b}[2J", "bootable"),
        (&*"y".repeat(60_000), "yyyy"),
    ] {
        let answer = raw_request(
            &vm,
            &creds,
            "ops",
            format!("{}\n", serde_json::json!({ "op": forged })).as_bytes(),
        );
        let event: Value = serde_json::from_str(&answer).unwrap();
        assert_eq!(event["code"], "bad-request", "{answer}");
        assert!(answer.len() < 1000, "an answer of {} bytes", answer.len());
        let deadline = Instant::now() + Duration::from_secs(60);
        let quoted = loop {
            let console = vm.console();
            if let Some(l) = console
                .lines()
                .find(|l| said(l, "api: answered bad-request") && l.contains(marker))
            {
                break l.to_string();
            }
            assert!(
                Instant::now() < deadline,
                "the request was not logged: {}",
                tail(&console)
            );
            std::thread::sleep(Duration::from_millis(200));
        };
        assert!(
            !quoted.contains('\u{1b}') && !quoted.contains('\r') && quoted.len() < 1000,
            "{quoted:?}"
        );
        if marker != "yyyy" {
            assert!(quoted.contains("\\u{1b}"), "{quoted:?}");
        }
    }
    let console = vm.console();
    assert!(
        !console
            .lines()
            .any(|l| said(l, "ready version=9.9.9") || l.starts_with("No bootable")),
        "a forged line reached the console: {}",
        tail(&console)
    );
    assert!(
        vm.child.try_wait().unwrap().is_none(),
        "imager boot --stay ended"
    );

    // From here to the power-off below, nothing may write BOOT or META:
    // every request is refused or cancelled. Their bytes now, for the
    // comparison once the node is off.
    let untouched = written_partitions(&disk);

    // Refusals: each leaves the slots as they were and the node up.
    let err = refused(&node_cmd(&vm, &creds, "watcher", &["reboot"]));
    assert!(err.contains("forbidden"), "{err}");
    let err = refused(&upgrade(&vm, &creds, "watcher", &image, &[]));
    assert!(err.contains("forbidden"), "{err}");
    let err = refused(&node_cmd(&vm, &creds, "ops", &["poweroff"]));
    assert!(err.contains("forbidden"), "{err}");
    let err = refused(&node_cmd(&vm, &mixed, "mallory", &["status"]));
    assert!(err.contains("refused this client's certificate"), "{err}");
    let err = refused(&node_cmd(&vm, &other, "mallory", &["status"]));
    assert!(err.contains("not issued by the cluster CA"), "{err}");
    // An operator's certificate of the cluster CA that expired: the node
    // refuses it, and the client says it expired (it used to say another
    // CA issued it).
    let late = expired_client(&creds, &dir.join("late"));
    let err = refused(&node_cmd(&vm, &late, "late", &["status"]));
    assert!(
        err.contains("refused this client's certificate: it has expired"),
        "{err}"
    );
    // Slot B was never written: nothing to roll back to.
    let err = refused(&node_cmd(&vm, &creds, "ops", &["rollback"]));
    assert!(
        err.contains(
            "the node refused rollback (refused): slot B is empty: there is nothing to roll \
             back to"
        ),
        "{err}"
    );
    let err = refused(&upgrade(
        &vm,
        &creds,
        "ops",
        "10.0.2.101:5000/metal/installer:0.2.0",
        &[],
    ));
    assert!(err.contains("cannot reach"), "unreachable registry: {err}");
    let err = refused(&upgrade(
        &vm,
        &creds,
        "ops",
        &format!("{GUEST_REGISTRY}/metal/installer:9.9.9"),
        &[],
    ));
    assert!(err.contains("no image"), "missing tag: {err}");
    let zeros = "0".repeat(64);
    let err = refused(&upgrade(
        &vm,
        &creds,
        "ops",
        &format!("{GUEST_REGISTRY}/metal/installer@sha256:{zeros}"),
        &[],
    ));
    assert!(err.contains("nothing was written"), "wrong digest: {err}");
    // A tampered payload layer (in the registry's storage): one byte in the
    // middle of its kernel changed; refused when the kernel's bytes do not
    // hash to the signed digest, before any write.
    let m: Value = serde_json::from_str(&ok(std::process::Command::new(reg::tool("skopeo"))
        .args(["inspect", "--raw", "--tls-verify=false"])
        .arg(format!("docker://{}/metal/installer:0.2.0", registry.addr))))
    .unwrap();
    let layer = m["layers"][1]["digest"].as_str().unwrap();
    let blob = registry.blob_file(&registry::Digest::parse(layer).unwrap());
    let original = std::fs::read(&blob).unwrap();
    let mut bad = original.clone();
    let kernel = format!(
        "{}/{}",
        contract::paths::installer_payload_dir(contract::Arch::Amd64),
        contract::paths::PAYLOAD_KERNEL
    );
    let at = middle_of_file(&original, &kernel);
    bad[at] ^= 0x40;
    std::fs::write(&blob, &bad).unwrap();
    let err = refused(&upgrade(&vm, &creds, "ops", &image, &[]));
    assert!(
        err.contains("the node refused upgrade (refused): streaming the payload of ")
            && err.contains(&format!(
                "nothing was written: {kernel} is not the signed file ("
            ))
            && err.contains("): the image was changed"),
        "tampered layer: {err}"
    );
    std::fs::write(&blob, &original).unwrap();
    // Hostile payload layers behind the genuine, signed first layer (signed
    // images are public: replaying one costs nothing): a GNU long name and
    // a PAX header claiming hundreds of MiB (read whole into memory by a
    // tar reader), a GNU sparse file, and the kernel longer than signed.
    // Each is refused as it arrives, nothing written, the node up and
    // within its memory budget (checked below, after the drips).
    let first =
        std::fs::read(registry.blob_file(
            &registry::Digest::parse(m["layers"][0]["digest"].as_str().unwrap()).unwrap(),
        ))
        .unwrap();
    let longer = {
        let mut b = tar::Builder::new(Vec::new());
        let mut a = tar::Archive::new(&original[..]);
        for e in a.entries().unwrap() {
            let mut e = e.unwrap();
            let mut h = e.header().clone();
            let mut data = Vec::new();
            std::io::Read::read_to_end(&mut e, &mut data).unwrap();
            if e.path().unwrap().to_str() == Some(kernel.as_str()) {
                data.extend(vec![0u8; 1 << 20]);
                h.set_size(data.len() as u64);
                h.set_cksum();
            }
            b.append(&h, &data[..]).unwrap();
        }
        b.into_inner().unwrap()
    };
    for (tag, layer, want) in [
        (
            "hostile-long-name",
            hostile_header(tar::EntryType::GNULongName, 400 << 20),
            "a GNU long name of 419430400 bytes, over the 4096 accepted",
        ),
        (
            "hostile-pax",
            hostile_header(tar::EntryType::XHeader, 100 << 20),
            "a PAX extended header of 104857600 bytes",
        ),
        (
            "hostile-sparse",
            hostile_header(tar::EntryType::GNUSparse, 1 << 30),
            "a GNU sparse file",
        ),
        (
            "hostile-longer",
            longer,
            "bytes in the image but the signed manifest says",
        ),
    ] {
        registry.push_image("metal/installer", tag, &[&first, &layer]);
        let err = refused(&upgrade(
            &vm,
            &creds,
            "ops",
            &format!("{GUEST_REGISTRY}/metal/installer:{tag}"),
            &[],
        ));
        assert!(
            err.contains(want) && err.contains("nothing was written"),
            "{tag}: {err}"
        );
        let s = status(&vm, &creds, "watcher");
        assert_eq!(s["boot_id"], boot1.as_str(), "{tag}");
        assert_eq!(slots(&s), before, "{tag}");
        assert_eq!(s["operation"], Value::Null, "{tag}: {s}");
    }
    let err = refused(&upgrade(
        &vm,
        &creds,
        "ops",
        &format!("{GUEST_REGISTRY}/metal/installer:foreign"),
        &[],
    ));
    assert!(
        err.contains("not signed by a key this disk trusts"),
        "foreign key: {err}"
    );
    // The version asked for is the version installed: the tag's, or
    // --version's.
    let older = format!("{GUEST_REGISTRY}/metal/installer:v0.5.0");
    let err = refused(&upgrade(&vm, &creds, "ops", &older, &[]));
    assert!(
        err.contains("holds metal 0.2.0 (genuinely signed), not the version 0.5.0 asked for")
            && err.contains("nothing was written"),
        "older payload under a newer tag: {err}"
    );
    let err = refused(&upgrade(
        &vm,
        &creds,
        "ops",
        &image,
        &["--version", "0.2.1"],
    ));
    assert!(
        err.contains("not the version 0.2.1 asked for"),
        "--version: {err}"
    );
    let s = status(&vm, &creds, "watcher");
    assert_eq!(slots(&s), before, "a refusal changed the slots");
    assert_eq!(s["boot_id"], boot1.as_str());

    // A connection cut in the middle of the payload layer: refused, nothing
    // written, the node free.
    let err = refused(&upgrade(
        &vm,
        &creds,
        "ops",
        &format!("{GUEST_CUT}/metal/installer:0.2.0"),
        &[],
    ));
    assert!(
        err.contains("the stream failed after")
            && err.contains("nothing was written")
            && cut.passed.load(std::sync::atomic::Ordering::SeqCst) > 0,
        "{err}"
    );
    let s = status(&vm, &creds, "watcher");
    assert_eq!(
        (slots(&s), s["boot_id"].clone()),
        (before.clone(), Value::from(boot1.as_str()))
    );
    assert_eq!(s["operation"], Value::Null, "{s}");

    // A registry that drips its answers, a byte a second (never stalling
    // long enough for a read timeout): the pull ends at its deadline, with
    // nothing written and the node free.
    let dripped = format!("{GUEST_DRIP}/metal/installer:0.2.0");
    let t = Instant::now();
    let err = refused(&upgrade(
        &vm,
        &creds,
        "ops",
        &dripped,
        &["--deadline", "15"],
    ));
    assert!(
        err.contains("deadline") && err.contains("nothing was written"),
        "{err}"
    );
    assert!(t.elapsed() < Duration::from_secs(60), "{:?}", t.elapsed());
    let s = status(&vm, &creds, "watcher");
    assert_eq!(slots(&s), before);
    assert_eq!(s["operation"], Value::Null, "{s}");
    assert!(
        s["last_outcome"].as_str().unwrap().contains("deadline"),
        "{s}"
    );
    // Cancelled by an operator while it drips: its client is told, the
    // node is free at once (the next upgrade below works).
    let dripping = spawn_node_cmd(&vm, &creds, "ops", &["upgrade", "--image", &dripped]);
    let deadline = Instant::now() + Duration::from_secs(120);
    while status(&vm, &creds, "watcher")["operation"].is_null() {
        assert!(
            Instant::now() < deadline,
            "the dripping upgrade never started"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let err = refused(&node_cmd(&vm, &creds, "watcher", &["cancel"]));
    assert!(err.contains("forbidden"), "{err}");
    let said = succeeded(&vm, "cancel", node_cmd(&vm, &creds, "ops", &["cancel"]));
    assert!(said.contains("cancelled the upgrade"), "{said}");
    let out = dripping.wait_with_output().unwrap();
    let err = refused(&out);
    assert!(
        err.contains("cancelled by an operator") && err.contains("nothing was written"),
        "{err}"
    );
    let s = status(&vm, &creds, "watcher");
    assert_eq!(slots(&s), before);
    assert_eq!(s["operation"], Value::Null, "{s}");
    assert_eq!(s["boot_id"], boot1.as_str());
    let err = refused(&node_cmd(&vm, &creds, "ops", &["cancel"]));
    assert!(err.contains("nothing is in progress"), "{err}");
    // The pulls so far (a whole payload layer streamed and refused, the
    // drips) held machined within its memory budget (docs/node-api.md).
    let rss = s["runtime_peak_rss_kib"].as_u64().unwrap();
    assert!(
        rss < RSS_BUDGET_KIB,
        "machined's peak RSS is {rss} KiB, over its budget of {RSS_BUDGET_KIB} KiB"
    );
    // Powered off: BOOT and META are the bytes they were before the
    // refusals, the hostile layers, the cut and the drips; then the node
    // again, still v1 on slot A.
    vm.power_off(&creds);
    assert_eq!(
        written_partitions(&disk),
        untouched,
        "a refused or cancelled request wrote BOOT or META"
    );
    vm = start(&disk, port, [&registry.addr, &drip.addr, &cut.addr]);
    let ready = vm.wait_for("ready version=", 1);
    assert!(ready.contains("version=0.1.0 slot=A"), "{ready}");

    // The upgrade; a second one meanwhile is answered busy. Its client is
    // then killed while the node pulls: an accepted upgrade finishes, the
    // reboot included, with no one left to tell (the node used to arm it
    // and wait for the next reboot when its last answer could not be sent).
    // It is asked for during a flood of connections that never finish
    // their handshake: accepted within seconds all the same.
    let flood = Flood::start(vm.port);
    flood.wait_opened(nodeapi::proto::MAX_PENDING + 8);
    let t = Instant::now();
    let mut first = spawn_node_cmd(
        &vm,
        &creds,
        "ops",
        &["upgrade", "--image", &image, "--wait", "--timeout", "900"],
    );
    loop {
        let s = status(&vm, &creds, "watcher");
        // `upgrade: <its step>`
        if upgrading(&s) {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "no upgrade in progress {:?} after it was asked for during the flood: {s}",
            t.elapsed()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let (opened, _) = flood.stop();
    assert!(opened > nodeapi::proto::MAX_PENDING, "{opened}");
    let err = refused(&upgrade(&vm, &creds, "ops", &image, &[]));
    assert!(err.contains("busy"), "{err}");
    assert!(
        upgrading(&status(&vm, &creds, "watcher")),
        "the upgrade ended before its client could be killed"
    );
    first.kill().unwrap();
    first.wait().unwrap();
    // Followed afterwards, by another client: to the end, the reboot and
    // the blessing included.
    let said = succeeded(
        &vm,
        "wait",
        node_cmd(
            &vm,
            &creds,
            "watcher",
            &["wait", "--version", "0.2.0", "--timeout", "900"],
        ),
    );
    assert!(said.contains("metal 0.2.0 on slot B"), "{said}");
    let v2_ready = vm.wait_for("ready version=", 2);
    assert!(v2_ready.contains("version=0.2.0 slot=B"), "{v2_ready}");
    let s = status(&vm, &creds, "watcher");
    assert_eq!(
        (s["booted_slot"].as_str(), s["version"].as_str()),
        (Some("B"), Some("0.2.0"))
    );
    assert_eq!(
        slots(&s),
        [
            ("good".to_string(), "0.1.0".to_string()),
            ("good".to_string(), "0.2.0".to_string())
        ]
    );
    assert!(
        s["last_event"]
            .as_str()
            .unwrap()
            .contains("upgrade-succeeded slot=B"),
        "{s}"
    );
    let boot2 = s["boot_id"].as_str().unwrap().to_string();
    assert_ne!(boot2, boot1);
    // /var was kept across the upgrade.
    let storage: Vec<String> = vm
        .console()
        .lines()
        .filter(|l| l.contains("machined: storage "))
        .map(str::to_string)
        .collect();
    assert!(
        storage.last().unwrap().contains("EPHEMERAL=kept"),
        "{storage:?}"
    );

    // Rollback to v1 (security version 0, below the floor v2's blessing
    // raised to 1): refused, also to an operator who allows the downgrade;
    // an admin's, followed through the reboot: back on A, v1.
    let err = refused(&node_cmd(&vm, &creds, "ops", &["rollback"]));
    assert!(
        err.contains("slot A (0.1.0): its security version 0 is lower than 1")
            && err.contains("--allow-downgrade"),
        "{err}"
    );
    let err = refused(&node_cmd(
        &vm,
        &creds,
        "ops",
        &["rollback", "--allow-downgrade"],
    ));
    assert!(err.contains("forbidden"), "{err}");
    assert_eq!(status(&vm, &creds, "watcher")["boot_id"], boot2.as_str());
    let said = succeeded(
        &vm,
        "rollback --allow-downgrade --wait",
        node_cmd(
            &vm,
            &creds,
            "root",
            &[
                "rollback",
                "--allow-downgrade",
                "--wait",
                "--timeout",
                "600",
            ],
        ),
    );
    assert!(said.contains("back") && said.contains("slot A"), "{said}");
    let s = status(&vm, &creds, "watcher");
    assert_eq!(
        (s["booted_slot"].as_str(), s["version"].as_str()),
        (Some("A"), Some("0.1.0"))
    );
    let boot3 = s["boot_id"].as_str().unwrap().to_string();
    assert_ne!(boot3, boot2);

    // A version that never gets ready, of security version 0: refused
    // (nothing written), then allowed by the admin; its tries run out, the
    // node comes back on A by itself (below the floor: a fallback is not
    // refused), and --wait says so.
    let v3_image = format!("{GUEST_REGISTRY}/metal/installer:0.3.0");
    let err = refused(&upgrade(&vm, &creds, "ops", &v3_image, &[]));
    assert!(
        err.contains("metal 0.3.0: its security version 0 is lower than 1")
            && err.contains("nothing was written"),
        "{err}"
    );
    // Without --wait, the client returns once the node accepted it; `wait`
    // then follows it and fails, saying it fell back.
    let said = succeeded(
        &vm,
        "upgrade (not waited for)",
        node_cmd(
            &vm,
            &creds,
            "root",
            &["upgrade", "--image", &v3_image, "--allow-downgrade"],
        ),
    );
    assert!(said.contains("the node accepted the upgrade"), "{said}");
    let err = refused(&node_cmd(
        &vm,
        &creds,
        "watcher",
        &["wait", "--timeout", "900"],
    ));
    assert!(
        err.contains("its upgrade failed") && err.contains("0.1.0 (slot A)"),
        "{err}\nconsole:\n{}",
        tail(&vm.console())
    );
    let s = status(&vm, &creds, "watcher");
    assert_eq!(
        (s["booted_slot"].as_str(), s["version"].as_str()),
        (Some("A"), Some("0.1.0"))
    );
    let boot3 = s["boot_id"].as_str().unwrap().to_string();
    assert!(
        vm.console()
            .contains("rollback: the upgrade to slot B (0.3.0) failed")
    );

    // An upgrade that wipes /var (the admin's alone), staged: written
    // without a reboot and without changing what boots, then armed.
    let err = refused(&upgrade(&vm, &creds, "ops", &image, &["--preserve=false"]));
    assert!(err.contains("forbidden"), "{err}");
    let err = refused(&node_cmd(&vm, &creds, "ops", &["arm"]));
    assert!(err.contains("nothing is staged"), "{err}");
    succeeded(
        &vm,
        "upgrade --stage",
        upgrade(
            &vm,
            &creds,
            "root",
            &image,
            &["--preserve=false", "--stage", "--wait"],
        ),
    );
    let s = status(&vm, &creds, "watcher");
    assert_eq!(s["boot_id"], boot3.as_str(), "staging rebooted");
    assert_eq!(s["next_boot"], "A", "staging armed: {s}");
    assert_eq!(s["staged"], "0.2.0 in slot B", "{s}");
    // The slot's files are the staged version's now, whatever META says.
    assert_eq!(
        slots(&s)[1],
        ("staged".to_string(), "0.2.0".to_string()),
        "{s}"
    );
    succeeded(
        &vm,
        "arm --wait",
        node_cmd(&vm, &creds, "ops", &["arm", "--wait"]),
    );
    let ready = vm.wait_for("ready version=", 5);
    assert!(ready.contains("version=0.2.0 slot=B"), "{ready}");
    let console = vm.console();
    let storage = console
        .lines()
        .rfind(|l| l.contains("machined: storage "))
        .unwrap();
    assert!(
        storage.contains("STATE=kept EPHEMERAL=made") && storage.contains(" boot=1 "),
        "{storage}"
    );
    assert!(console.contains("wiping EPHEMERAL"), "{}", tail(&console));
    let boot4 = status(&vm, &creds, "watcher")["boot_id"]
        .as_str()
        .unwrap()
        .to_string();

    // A CA rollover with the node reachable throughout (issue 29): a new
    // CA issues; the admin gives the node both CAs and a certificate of the
    // new one over the API; clients of either CA reach it, and still do
    // after the reboot below (the credentials are in META).
    let creds_cmd = |args: &[&str]| {
        ok(imager()
            .args(["node", "credentials"])
            .arg(&creds)
            .args(args))
    };
    creds_cmd(&["--rollover-ca"]);
    creds_cmd(&[&NODE1[..], &["--force"]].concat());
    creds_cmd(&["--role", "reader", "--name", "fresh"]);
    let err = refused(&node_cmd(&vm, &creds, "fresh", &["status"]));
    assert!(err.contains("refused this client's certificate"), "{err}");
    status(&vm, &creds, "watcher");
    let set = ["set-credentials", "--node-name", "node1"];
    let err = refused(&node_cmd(&vm, &creds, "ops", &set));
    assert!(err.contains("forbidden"), "{err}");
    succeeded(&vm, "set-credentials", node_cmd(&vm, &creds, "root", &set));
    status(&vm, &creds, "fresh");
    status(&vm, &creds, "watcher");

    // A reboot, followed: the same slot, a new boot id.
    let out = node_cmd(&vm, &creds, "ops", &["reboot", "--wait", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines[0]["event"], "done", "{lines:?}");
    assert_eq!(lines[0]["reboot"], true);
    let back = lines.last().unwrap();
    assert_eq!(back["booted_slot"], "B");
    assert_ne!(back["boot_id"], boot4.as_str());
    assert_ne!(boot4, boot3);

    // The rollover ends: an admin of the old CA may not give the node the
    // new CA alone (it would lock itself out); renewed, it may, and then
    // the old CA's clients are refused and the new ones are not.
    status(&vm, &creds, "fresh");
    creds_cmd(&["--end-rollover"]);
    let err = refused(&node_cmd(&vm, &creds, "root", &set));
    assert!(
        err.contains("would not be trusted under the new CA certificates")
            && err.contains("nothing was written"),
        "{err}"
    );
    creds_cmd(&["--role", "admin", "--name", "root", "--renew"]);
    succeeded(&vm, "set-credentials", node_cmd(&vm, &creds, "root", &set));
    let err = refused(&node_cmd(&vm, &creds, "watcher", &["status"]));
    assert!(err.contains("refused this client's certificate"), "{err}");
    status(&vm, &creds, "fresh");

    // Power-off, by the admin: QEMU exits after a clean shutdown.
    vm.power_off(&creds);
    let console = vm.console();
    assert!(
        console.contains("machined: powering off"),
        "{}",
        tail(&console)
    );
    // The disk afterwards: B the default, both versions kept, no wipe
    // pending.
    let r = inspect(&disk);
    assert_eq!(r["slots"]["default"], "B", "{}", r["slots"]);
    assert!(meta_value(&r, "wipe-ephemeral").is_none());
}

/// A Secure Boot node (the secureboot profile, its keys enrolled and Secure
/// Boot on in OVMF's Secure Boot firmware) upgrades over the API like any
/// other: the node checks the UKIs it pulled against the db certificate in
/// META before it writes, so a payload signed for another db key is
/// refused with the slots as they were, and one signed for its own comes
/// up on slot B, blessed, with Secure Boot still on. The ESP's boot loader,
/// signed by sbsign for the same db key (bootable, other bytes), is then
/// the payload's: the node staged it and its upgrade replaced it.
#[test]
fn a_secure_boot_node_upgrades_over_the_api_and_refuses_a_payload_for_another_db_key() {
    let (creds, _) = credentials(&scratch().join("node-sb-credentials"));
    let sb_keys = |name: &str| {
        let d = scratch().join(name);
        ok(imager()
            .args(["keygen", "--force", "--secure-boot"])
            .arg(&d));
        d
    };
    let keys = sb_keys("node-sb-keys");
    let other = sb_keys("node-sb-keys-other");
    let variant = |name: &str, keys: &Path, v: &str| {
        let keys = keys.display().to_string();
        build_variant_of("secureboot", name, |t| {
            format!(
                "{}\nnode_api:\n  ca: {}\n  plain_http_registries: [{GUEST_REGISTRY}]\n",
                t.replace("version: 0.1.0", &format!("version: {v}"))
                    .replace(
                        "  enroll: force\n",
                        &format!("  enroll: force\n  keys: {keys}\n"),
                    ),
                creds.join("ca.crt").display()
            )
        })
    };
    let v1 = variant("node-sb-v1", &keys, "0.1.0");
    let v2 = variant("node-sb-v2", &keys, "0.2.0");
    let foreign = variant("node-sb-foreign", &other, "0.2.0");
    let registry = reg::Registry::start();
    for (b, tag) in [(&v2, "0.2.0"), (&foreign, "foreign")] {
        reg::skopeo_copy(
            &format!("oci-archive:{}", b.dir.join("installer.tar").display()),
            &registry.addr,
            &format!("metal/installer:{tag}"),
        );
    }
    let disk = sparse_copy(&v1.artifact("raw"), "node-sb");
    ok(&mut provision(&disk, &creds, &["--node", "node1"]));
    let esp = part_at(&disk, "EFI");
    let loader = |name: &str| {
        let out = scratch().join(name);
        let _ = std::fs::remove_file(&out);
        ok(tool("mcopy")
            .args(["-i", &esp, "::/EFI/BOOT/BOOTX64.EFI"])
            .arg(&out));
        out
    };
    let imagers = loader("node-sb-bootx64.efi");
    let resigned = scratch().join("node-sb-sbsign-bootx64.efi");
    ok(tool("sbsign")
        .arg("--key")
        .arg(keys.join("db.key"))
        .arg("--cert")
        .arg(keys.join("db.crt"))
        .arg("--output")
        .arg(&resigned)
        .arg("/usr/lib/systemd/boot/efi/systemd-bootx64.efi"));
    assert_ne!(sha256(&resigned), sha256(&imagers));
    ok(tool("mcopy")
        .args(["-o", "-i", &esp])
        .arg(&resigned)
        .arg("::/EFI/BOOT/BOOTX64.EFI"));
    let vars = enrolled_vars(&keys, &scratch().join("node-sb.vars.fd"), true);
    let vars = vars.display().to_string();
    let port = reg::free_port();
    let r = registry.addr.as_str();
    let mut vm = start_with(&disk, port, [r, r, r], &["--secure-boot", &vars]);
    let ready = vm.wait_for("ready version=", 1);
    assert!(ready.contains("version=0.1.0 slot=A"), "{ready}");
    let s = status(&vm, &creds, "watcher");
    assert_eq!(s["secure_boot"], "on", "{s}");
    let before = slots(&s);
    let boot1 = s["boot_id"].as_str().unwrap().to_string();

    // Signed by the trusted manifest key, its UKIs by another db key:
    // refused once they are staged, before BOOT or META is written.
    let err = refused(&upgrade(
        &vm,
        &creds,
        "ops",
        &format!("{GUEST_REGISTRY}/metal/installer:foreign"),
        &["--version", "0.2.0"],
    ));
    assert!(
        err.contains("another db certificate than the one this disk trusts")
            && err.contains("nothing was written"),
        "{err}"
    );
    let s = status(&vm, &creds, "watcher");
    assert_eq!(slots(&s), before, "{s}");
    assert_eq!(s["boot_id"], boot1.as_str());
    assert_eq!(s["operation"], Value::Null, "{s}");

    // Its own: followed through the reboot under Secure Boot and the
    // blessing.
    let out = upgrade(
        &vm,
        &creds,
        "ops",
        &format!("{GUEST_REGISTRY}/metal/installer:0.2.0"),
        &["--timeout", "900"],
    );
    let steps = String::from_utf8_lossy(&out.stderr).into_owned();
    let said = succeeded(&vm, "upgrade --wait", out);
    assert!(said.contains("metal 0.2.0 on slot B"), "{said}");
    assert!(
        steps.contains(
            "verify: both UKIs and the boot loader are signed by a db key this disk's firmware \
             trusts"
        ),
        "{steps}"
    );
    let ready = vm.wait_for("ready version=", 2);
    assert!(ready.contains("version=0.2.0 slot=B"), "{ready}");
    let s = status(&vm, &creds, "watcher");
    assert_eq!(s["secure_boot"], "on", "{s}");
    assert_eq!(
        slots(&s),
        [
            ("good".to_string(), "0.1.0".to_string()),
            ("good".to_string(), "0.2.0".to_string())
        ],
        "{s}"
    );
    // 0.2.0's boot loader is the one on its own disk's ESP.
    let v2_raw = v2.artifact("raw");
    let payloads = scratch().join("node-sb-v2-bootx64.efi");
    let _ = std::fs::remove_file(&payloads);
    ok(tool("mcopy")
        .args(["-i", &part_at(&v2_raw, "EFI"), "::/EFI/BOOT/BOOTX64.EFI"])
        .arg(&payloads));
    assert_eq!(
        sha256(&loader("node-sb-after-bootx64.efi")),
        sha256(&payloads),
        "the upgrade did not put the payload's boot loader on the ESP"
    );
}

/// A node upgrades itself by name from a registry behind TLS with token
/// authentication: the registry's name and its CA come from the node's
/// settings (`--host`, `--registry-ca`), the credentials from the
/// operator with the upgrade request, found in an auth file as podman
/// writes it. Wrong or missing credentials are refused before anything is
/// written, saying the registry denied them; the password is never on the
/// console, in the CLI's output or on the node's disk.
#[test]
fn the_node_upgrades_by_name_from_a_tls_registry_with_token_auth() {
    use reg::auth::{PASSWORD, TEST_NAME, USER};
    let dir = scratch().join("node-tls");
    let (creds, _) = credentials(&dir.join("credentials"));
    let v1 = build_variant_of("metal", "node-tls-v1", |t| t);
    let v2 = build_variant_of("installer", "node-tls-v2", |t| {
        t.replace("version: 0.1.0", "version: 0.2.0")
    });

    // The registry and its token service, named registry.test in their
    // certificate and in the token realm; v2 pushed from the host, where
    // registry.test is 127.0.0.1 for the client alone.
    let named = reg::auth::NamedRegistry::start();
    let image = format!("{}/metal/installer:0.2.0", named.name);
    imager::oci::push(
        &v2.dir.join("installer.tar"),
        &::registry::Reference::parse(&image).unwrap(),
        &named.client(),
        &mut |_| {},
    )
    .unwrap();

    // The node: its credentials, registry.test at 10.0.2.100 (where QEMU
    // forwards both ports to the host's loopback), the test CA.
    let disk = sparse_copy(&v1.artifact("raw"), "node-tls");
    let said = ok(provision(
        &disk,
        &creds,
        &[
            "--node",
            "node1",
            "--host",
            &format!("{TEST_NAME}=10.0.2.100"),
        ],
    )
    .arg("--registry-ca")
    .arg(named.pki.ca_file()));
    assert!(said.contains("1 CA certificate(s)"), "{said}");
    let report = inspect(&disk);
    assert_eq!(
        meta_value(&report, "registry-ca").as_deref(),
        Some(named.pki.ca_pem.as_str())
    );
    assert!(
        meta_value(&report, "node-settings")
            .unwrap()
            .contains(&format!("hosts={TEST_NAME}=10.0.2.100")),
        "{report}"
    );
    let forwards = named.guest_forwards("10.0.2.100");
    let port = reg::free_port();
    let args: Vec<&str> = forwards.iter().map(String::as_str).collect();
    let mut vm = Vm::boot(&disk, port, &args);
    let ready = vm.wait_for("ready version=", 1);
    assert!(ready.contains("version=0.1.0 slot=A"), "{ready}");
    let before = written_partitions(&disk);
    let mut outputs = String::new();

    // No credentials: the registry wants some; nothing is written.
    let out = upgrade(&vm, &creds, "ops", &image, &["--anonymous"]);
    let err = refused(&out);
    assert!(
        err.contains("requires credentials to pull metal/installer"),
        "{err}\n{}",
        tail(&vm.console())
    );
    // Wrong ones, on stdin: the token service refuses them.
    let wrong = "Wr0ng-S3cret-pw";
    let mut c = node_command(
        &vm,
        &creds,
        "ops",
        &[
            "upgrade",
            "--image",
            &image,
            "--wait",
            "--username",
            USER,
            "--password-stdin",
        ],
    );
    let mut child = c
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        writeln!(child.stdin.take().unwrap(), "{wrong}").unwrap();
    }
    let out = child.wait_with_output().unwrap();
    let err = refused(&out);
    assert!(err.contains("refused the credentials"), "{err}");
    outputs.push_str(&String::from_utf8_lossy(&out.stdout));
    outputs.push_str(&String::from_utf8_lossy(&out.stderr));
    assert_eq!(
        written_partitions(&disk),
        before,
        "a refused pull wrote the disk"
    );
    let s = status(&vm, &creds, "watcher");
    assert_eq!(s["booted_slot"], "A");

    // The right ones, from an auth file: upgraded, by name, over TLS.
    let auth = dir.join("auth.json");
    let encoded = named.write_auth_file(&auth);
    let out = upgrade(
        &vm,
        &creds,
        "ops",
        &image,
        &["--authfile", auth.to_str().unwrap(), "--timeout", "900"],
    );
    outputs.push_str(&String::from_utf8_lossy(&out.stdout));
    outputs.push_str(&String::from_utf8_lossy(&out.stderr));
    let said = succeeded(&vm, "upgrade", out);
    assert!(said.contains("metal 0.2.0 on slot B"), "{said}");
    assert!(
        outputs.contains(&format!(
            "credentials for {} from {}",
            named.name,
            auth.display()
        )),
        "{outputs}"
    );
    let v2_ready = vm.wait_for("ready version=", 2);
    assert!(v2_ready.contains("version=0.2.0 slot=B"), "{v2_ready}");
    assert!(
        named
            .tokens
            .requests
            .load(std::sync::atomic::Ordering::SeqCst)
            >= 3
    );

    // The secrets: nowhere the node or the CLI wrote.
    let console = vm.console();
    for secret in [PASSWORD, wrong, encoded.as_str()] {
        assert!(!console.contains(secret), "the console shows a secret");
        assert!(!outputs.contains(secret), "the CLI shows a secret");
    }
    vm.power_off(&creds);
    for secret in [PASSWORD, wrong] {
        let found = run(std::process::Command::new(tool_path("grep"))
            .args(["-c", "-a", "-F", secret])
            .arg(&disk));
        assert_eq!(
            String::from_utf8_lossy(&found.stdout).trim(),
            "0",
            "the node's disk holds a registry secret"
        );
    }
}
