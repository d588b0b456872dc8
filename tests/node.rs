//! End-to-end tests of the node API (docs/node-api.md), booted under OVMF
//! with QEMU's user-mode network: the API reached through a port forwarded
//! on the host's loopback, nothing else. A v1 disk upgraded offline to v2
//! (so both slots hold a version) is provisioned with a node's credentials
//! and booted once; the test then talks to it as clients of each role, and
//! as clients of another CA, and follows it through a rollback, a reboot
//! and a power-off.

// Test helpers panic on unexpected failures: that is how a test fails.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

fn build_variant_of(base: &str, name: &str, edit: impl Fn(String) -> String) -> Build {
    let profile = write_profile_from(base, name, edit);
    build_profile(name, &profile, &["--key", &dev_key().display().to_string()])
}

/// A free TCP port on the host's loopback (bound and released: QEMU binds
/// it next).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
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
        (
            &creds,
            vec![
                "--node",
                "node1",
                "--address",
                "10.0.2.15",
                "--address",
                "127.0.0.1",
            ],
        ),
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

/// A running `imager boot` of the node, its console followed in a file.
struct Vm {
    child: Child,
    log: PathBuf,
    port: u16,
}

impl Vm {
    fn start(disk: &Path, port: u16) -> Vm {
        let log = disk.with_extension("console.log");
        let _ = std::fs::remove_file(&log);
        let child = imager()
            .args([
                "boot",
                "--write",
                "--reboots",
                "--stay",
                "--quiet",
                "--json",
            ])
            .args(["--timeout", "1200", "--forward"])
            .arg(format!("{port}:{}", nodeapi::proto::PORT))
            .arg("--console-log")
            .arg(&log)
            .arg(disk)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        Vm { child, log, port }
    }

    fn console(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits for the `n`th console line containing `what` (counting from
    /// the start of the log).
    fn wait_for(&mut self, what: &str, n: usize) -> String {
        let deadline = Instant::now() + Duration::from_secs(900);
        loop {
            let text = self.console();
            if let Some(line) = text.lines().filter(|l| l.contains(what)).nth(n - 1) {
                return line.to_string();
            }
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!(
                    "imager boot ended ({status}) before {what:?} #{n}; console:\n{}",
                    tail(&text)
                );
            }
            assert!(
                Instant::now() < deadline,
                "no {what:?} #{n} within 900 s; console:\n{}",
                tail(&text)
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn node(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// `imager node ARGS --node … --credentials DIR --client NAME`.
fn node_cmd(vm: &Vm, dir: &Path, client: &str, args: &[&str]) -> std::process::Output {
    run(imager()
        .arg("node")
        .args(args)
        .args([
            "--node",
            &vm.node(),
            "--server-name",
            "node1",
            "--client",
            client,
        ])
        .arg("--credentials")
        .arg(dir))
}

fn status(vm: &Vm, dir: &Path, client: &str) -> Value {
    let out = node_cmd(vm, dir, client, &["status", "--json"]);
    assert!(
        out.status.success(),
        "status as {client}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn refused(out: &std::process::Output) -> String {
    assert!(
        !out.status.success(),
        "expected a refusal, got success: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
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

#[test]
fn the_node_api_serves_each_role_what_it_may_and_follows_the_node_through_rollback_reboot_and_power_off()
 {
    let v1 = build_variant_of("metal", "node-v1", |t| t);
    let v2 = build_variant_of("installer", "node-v2", |t| {
        t.replace("version: 0.1.0", "version: 0.2.0")
    });
    let dir = scratch().join("node-credentials");
    let (creds, other) = credentials(&dir);
    let mixed = dir.join("mixed");

    let disk = sparse_copy(&v1.artifact("raw"), "node");
    ok(imager()
        .args(["upgrade", "--installer"])
        .arg(v2.dir.join("installer.tar"))
        .arg("--disk")
        .arg(&disk));

    // Provisioning: the key goes into META and is never shown.
    ok(imager()
        .args(["node", "provision"])
        .arg(&disk)
        .arg("--credentials")
        .arg(&creds)
        .args(["--node", "node1"]));
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
    let out = run(imager()
        .args(["node", "provision"])
        .arg(&disk)
        .arg("--credentials")
        .arg(&other)
        .args(["--node", "node1"]));
    assert!(refused(&out).contains("--force"));
    let out = run(imager()
        .args(["node", "provision"])
        .arg(&disk)
        .arg("--credentials")
        .arg(&creds)
        .args(["--node", "node2", "--force"]));
    assert!(refused(&out).contains("node2"));
    assert_eq!(meta_value(&inspect(&disk), "node-cert").unwrap(), cert);

    // The node: v2 on trial in slot B, blessed at its first boot.
    let port = free_port();
    let mut vm = Vm::start(&disk, port);
    let ready = vm.wait_for("ready version=", 1);
    assert!(ready.contains("version=0.2.0 slot=B"), "{ready}");
    let console = vm.console();
    assert!(
        console.contains("api: listening on port 50000"),
        "{}",
        tail(&console)
    );

    // Status, as the reader.
    let s = status(&vm, &creds, "watcher");
    assert_eq!(s["version"], "0.2.0");
    assert_eq!(s["booted_slot"], "B");
    assert_eq!(s["name"], "metal");
    assert_eq!(s["ready"], true);
    assert_eq!(s["next_boot"], "B");
    assert_eq!(s["slots"][0]["status"], "good");
    assert_eq!(s["slots"][0]["version"], "0.1.0");
    assert_eq!(s["slots"][1]["status"], "good");
    assert_eq!(s["slots"][1]["version"], "0.2.0");
    assert!(
        s["last_event"]
            .as_str()
            .unwrap()
            .contains("upgrade-succeeded slot=B"),
        "{s}"
    );
    let boot1 = s["boot_id"].as_str().unwrap().to_string();
    assert_eq!(boot1.len(), 36, "{boot1}");

    // What the reader may not do, and clients of another CA: refused,
    // nothing happens.
    let err = refused(&node_cmd(&vm, &creds, "watcher", &["reboot"]));
    assert!(err.contains("forbidden"), "{err}");
    let err = refused(&node_cmd(&vm, &creds, "ops", &["poweroff"]));
    assert!(err.contains("forbidden"), "{err}");
    let err = refused(&node_cmd(&vm, &mixed, "mallory", &["status"]));
    assert!(err.contains("refused this client's certificate"), "{err}");
    let err = refused(&node_cmd(&vm, &other, "mallory", &["status"]));
    assert!(err.contains("not issued by the cluster CA"), "{err}");
    assert_eq!(status(&vm, &creds, "watcher")["boot_id"], boot1.as_str());

    // Rollback, followed through the reboot: back on A, v1.
    let out = node_cmd(
        &vm,
        &creds,
        "ops",
        &["rollback", "--wait", "--timeout", "600"],
    );
    assert!(
        out.status.success(),
        "rollback --wait: {}\nconsole:\n{}",
        String::from_utf8_lossy(&out.stderr),
        tail(&vm.console())
    );
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("back") && said.contains("slot A"), "{said}");
    let s = status(&vm, &creds, "watcher");
    assert_eq!(
        (s["booted_slot"].as_str(), s["version"].as_str()),
        (Some("A"), Some("0.1.0"))
    );
    let boot2 = s["boot_id"].as_str().unwrap().to_string();
    assert_ne!(boot2, boot1);
    assert!(vm.wait_for("ready version=", 2).contains("slot=A"));

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
    assert_eq!(back["booted_slot"], "A");
    assert_ne!(back["boot_id"], boot2.as_str());
    assert_ne!(back["boot_id"], boot1.as_str());

    // Power-off, by the admin: QEMU exits after a clean shutdown.
    ok(&mut {
        let mut c = imager();
        c.arg("node")
            .args(["poweroff", "--node", &vm.node(), "--server-name", "node1"])
            .args(["--client", "root", "--credentials"])
            .arg(&creds);
        c
    });
    let deadline = Instant::now() + Duration::from_secs(300);
    let status = loop {
        if let Some(s) = vm.child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "the node did not power off");
        std::thread::sleep(Duration::from_millis(200));
    };
    let mut report = String::new();
    if let Some(out) = vm.child.stdout.take() {
        for l in BufReader::new(out).lines() {
            report.push_str(&l.unwrap());
        }
    }
    assert!(status.success(), "imager boot: {status}; {report}");
    let console = vm.console();
    assert!(
        console.contains("machined: powering off"),
        "{}",
        tail(&console)
    );
}
