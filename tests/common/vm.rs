//! A node booted by `imager boot --stay` in the background, its console
//! followed in a file, its API forwarded to a port of the host's loopback;
//! and `imager node` run against it. Shared by the files that talk to a
//! running node (tests/node.rs, hardware.rs, network.rs, arm64.rs).

use super::{imager, run};
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// A running `imager boot` of a node, its console followed in a file.
pub struct Vm {
    pub child: Child,
    pub log: PathBuf,
    pub port: u16,
}

impl Vm {
    /// Boots `disk` (written to, rebooting, staying up) with the node API
    /// on the host's `127.0.0.1:port`; `extra`: more arguments to `imager
    /// boot` (forwards, the NIC, the firmware).
    pub fn boot(disk: &Path, port: u16, extra: &[&str]) -> Vm {
        Vm::boot_at(disk, port, None, extra)
    }

    /// [`Vm::boot`] with the API forwarded to the guest's address `guest`
    /// (not the address QEMU's DHCP gives): a node with another static
    /// address answers there, and only there.
    pub fn boot_at(disk: &Path, port: u16, guest: Option<&str>, extra: &[&str]) -> Vm {
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
            .arg(match guest {
                Some(g) => format!("{port}:{g}:{}", nodeapi::proto::PORT),
                None => format!("{port}:{}", nodeapi::proto::PORT),
            })
            .arg("--console-log")
            .arg(&log)
            .args(extra)
            .arg(disk)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Its own process group: dropped, it goes with its QEMU.
            .process_group(0)
            .spawn()
            .unwrap();
        Vm { child, log, port }
    }

    pub fn console(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits for the `n`th console line in which the runtime says
    /// something starting with `what` (counting from the start of the log;
    /// what the runtime quotes further on in a line does not count).
    pub fn wait_for(&mut self, what: &str, n: usize) -> String {
        let deadline = Instant::now() + Duration::from_secs(900);
        loop {
            let text = self.console();
            if let Some(line) = text.lines().filter(|l| said(l, what)).nth(n - 1) {
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

    pub fn node(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Powers the node off (an admin's `poweroff`, as client `root` of
    /// `creds`) and waits for its QEMU to exit cleanly; imager boot's
    /// report.
    pub fn power_off(&mut self, creds: &Path) -> String {
        let out = node_cmd(self, creds, "root", &["poweroff"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let deadline = Instant::now() + Duration::from_secs(300);
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            assert!(Instant::now() < deadline, "the node did not power off");
            std::thread::sleep(Duration::from_millis(200));
        };
        let mut report = String::new();
        if let Some(out) = self.child.stdout.take() {
            for l in BufReader::new(out).lines() {
                report.push_str(&l.unwrap());
            }
        }
        assert!(status.success(), "imager boot: {status}; {report}");
        report
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        // imager boot and the QEMU it started, whose group it leads.
        let _ = std::process::Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.child.id())])
            .status();
        let _ = self.child.wait();
    }
}

/// Whether the runtime says something starting with `what` on `line`.
pub fn said(line: &str, what: &str) -> bool {
    line.find("machined: ")
        .is_some_and(|at| line[at + "machined: ".len()..].starts_with(what))
}

/// The last 40 lines of a console.
pub fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// `imager node ARGS` against `vm` as `client` of the credentials in
/// `dir`, the node's certificate named `node1`.
pub fn node_command(vm: &Vm, dir: &Path, client: &str, args: &[&str]) -> std::process::Command {
    let mut c = imager();
    c.arg("node")
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
        .arg(dir);
    c
}

/// [`node_command`] run to its end.
pub fn node_cmd(vm: &Vm, dir: &Path, client: &str, args: &[&str]) -> std::process::Output {
    run(&mut node_command(vm, dir, client, args))
}

/// `imager node status --json` as `client`; the test fails if it does.
pub fn status(vm: &Vm, dir: &Path, client: &str) -> serde_json::Value {
    let out = node_cmd(vm, dir, client, &["status", "--json"]);
    assert!(
        out.status.success(),
        "status as {client}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `imager node provision DISK --credentials CREDS --node node1`: the test
/// node's certificate and key (made with [`super::NODE1`]) and the
/// cluster's CA into `disk`'s META.
pub fn provision_node1(disk: &Path, creds: &Path) {
    super::ok(
        imager()
            .args(["node", "provision"])
            .arg(disk)
            .arg("--credentials")
            .arg(creds)
            .args(["--node", "node1"]),
    );
}
