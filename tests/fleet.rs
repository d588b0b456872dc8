//! Rolling upgrades across a fleet (docs/node-api.md, "Fleets"): three
//! nodes under OVMF, each its API forwarded to its own port of the host's
//! loopback, all pulling from one registry behind TLS with token
//! authentication (reached by name through their settings). `imager node
//! upgrade` given the three with `--max-parallel 1 --canary 1` upgrades
//! them one after the other; a rerun skips them; an upgrade to a version
//! that never gets ready fails the canary, which falls back, and the other
//! two are never touched.

// Test helpers panic on unexpected failures: that is how a test fails.
#![allow(clippy::unwrap_used)]

mod common;
#[path = "../registry/tests/common/mod.rs"]
mod reg;

use common::vm::*;
use common::*;
use serde_json::Value;
use std::path::Path;

fn build_variant_of(base: &str, name: &str, edit: impl Fn(String) -> String) -> Build {
    let profile = write_profile_from(base, name, edit);
    build_profile(name, &profile, &["--key", &dev_key().display().to_string()])
}

/// The JSON lines of a fleet command's stdout: one report per node.
fn reports(out: &std::process::Output) -> Vec<Value> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
        .collect()
}

/// `imager node ARGS` to the node `name` behind `vm`, as the admin.
fn node(vm: &Vm, creds: &Path, name: &str, args: &[&str]) -> std::process::Output {
    run(imager()
        .arg("node")
        .args(args)
        .args([
            "--node",
            &vm.node(),
            "--server-name",
            name,
            "--client",
            "root",
        ])
        .arg("--credentials")
        .arg(creds))
}

fn outcomes(r: &[Value]) -> Vec<(String, String)> {
    r.iter()
        .map(|r| {
            (
                r["node"]
                    .as_str()
                    .unwrap()
                    .split('@')
                    .next()
                    .unwrap()
                    .to_string(),
                r["outcome"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn a_fleet_upgrades_one_node_at_a_time_and_stops_at_a_failed_canary() {
    use reg::auth::TEST_NAME;
    let dir = scratch().join("fleet");
    let _ = std::fs::remove_dir_all(&dir);
    let creds = dir.join("credentials");
    ok(imager()
        .args(["node", "credentials"])
        .arg(&creds)
        .args(["--role", "admin", "--name", "root"]));
    for n in ["node1", "node2", "node3"] {
        ok(imager().args(["node", "credentials"]).arg(&creds).args([
            "--node",
            n,
            "--address",
            "127.0.0.1",
        ]));
    }
    let v1 = build_variant_of("metal", "fleet-v1", |t| t);
    let v2 = build_variant_of("installer", "fleet-v2", |t| {
        t.replace("version: 0.1.0", "version: 0.2.0")
    });
    // v3 never gets ready: its runtime panics before, the boot loader
    // falls back.
    let v3 = build_variant_of("installer", "fleet-v3", |t| {
        t.replace("version: 0.1.0", "version: 0.3.0").replace(
            "    - vdso32=0\n",
            "    - vdso32=0\n    - machined.break=ready\n",
        )
    });

    let named = reg::auth::NamedRegistry::start();
    let image = |v: &str| format!("{}/metal/installer:{v}", named.name);
    let client = named.client();
    for (b, v) in [(&v2, "0.2.0"), (&v3, "0.3.0")] {
        imager::oci::push(
            &b.dir.join("installer.tar"),
            &::registry::Reference::parse(&image(v)).unwrap(),
            &client,
            &mut |_| {},
        )
        .unwrap();
    }
    let auth = dir.join("auth.json");
    named.write_auth_file(&auth);

    // Three nodes, booted one after the other (two cores).
    let forwards = named.guest_forwards("10.0.2.100");
    let mut vms = Vec::new();
    let mut list = String::from("# the fleet\n");
    for n in ["node1", "node2", "node3"] {
        let disk = sparse_copy(&v1.artifact("raw"), &format!("fleet-{n}"));
        ok(imager()
            .args(["node", "provision"])
            .arg(&disk)
            .arg("--credentials")
            .arg(&creds)
            .args(["--node", n, "--host", &format!("{TEST_NAME}=10.0.2.100")])
            .arg("--registry-ca")
            .arg(named.pki.ca_file()));
        let port = reg::free_port();
        let args: Vec<&str> = forwards.iter().map(String::as_str).collect();
        let mut vm = Vm::boot(&disk, port, &args);
        let ready = vm.wait_for("ready version=", 1);
        assert!(ready.contains("version=0.1.0 slot=A"), "{ready}");
        list.push_str(&format!("{n}@127.0.0.1:{port}\n"));
        vms.push(vm);
    }
    let nodes = dir.join("nodes");
    std::fs::write(&nodes, &list).unwrap();
    let fleet = |version: &str, extra: &[&str]| {
        let mut c = imager();
        c.args(["node", "upgrade", "--image", &image(version)])
            .arg("--nodes-file")
            .arg(&nodes)
            .arg("--credentials")
            .arg(&creds)
            .args(["--client", "root", "--authfile"])
            .arg(&auth)
            .args(["--max-parallel", "1", "--canary", "1", "--json"])
            // Each node's time, request to blessed: longer than the
            // pull's deadline, or the client refuses it.
            .args(["--deadline", "600", "--timeout", "900"])
            .args(extra);
        run(&mut c)
    };
    let status = |vm: &Vm, n: &str| -> Value {
        let out = node(vm, &creds, n, &["status", "--json"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let shown = |vms: &[Vm]| {
        vms.iter()
            .map(|vm| tail(&vm.console()))
            .collect::<Vec<_>>()
            .join("\n----\n")
    };

    // To 0.2.0: one after the other, in the order given, each back,
    // ready and blessed before the next starts.
    let out = fleet("0.2.0", &[]);
    let r = reports(&out);
    assert!(
        out.status.success(),
        "{}\n{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout),
        shown(&vms)
    );
    let done = |n: &str| (n.to_string(), "done".to_string());
    assert_eq!(outcomes(&r), [done("node1"), done("node2"), done("node3")]);
    for (vm, rep) in vms.iter_mut().zip(&r) {
        assert_eq!(
            (rep["version"].as_str(), rep["slot"].as_str()),
            (Some("0.2.0"), Some("B"))
        );
        let ready = vm.wait_for("ready version=", 2);
        assert!(ready.contains("version=0.2.0 slot=B"), "{ready}");
    }
    // One after the other: reported in the order given (--max-parallel
    // 1), each having taken a whole upgrade's time.
    for rep in &r {
        assert!(rep["seconds"].as_u64().unwrap() > 5, "{rep}");
    }

    // A rerun: every node is on 0.2.0 already.
    let out = fleet("0.2.0", &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let skipped = |n: &str| (n.to_string(), "skipped".to_string());
    assert_eq!(
        outcomes(&reports(&out)),
        [skipped("node1"), skipped("node2"), skipped("node3")]
    );

    // To 0.3.0, which never gets ready (one try): the canary falls back to
    // 0.2.0 and the rollout stops; the other two are never asked.
    let untouched: Vec<String> = vms[1..]
        .iter()
        .zip(["node2", "node3"])
        .map(|(vm, n)| status(vm, n)["boot_id"].as_str().unwrap().to_string())
        .collect();
    let out = fleet("0.3.0", &["--tries", "1"]);
    assert!(!out.status.success());
    let r = reports(&out);
    assert_eq!(
        outcomes(&r),
        [
            ("node1".to_string(), "failed".to_string()),
            ("node2".to_string(), "not-started".to_string()),
            ("node3".to_string(), "not-started".to_string())
        ],
        "{}",
        shown(&vms)
    );
    assert_eq!(r[0]["version"], "0.2.0", "{}", r[0]);
    let said = r[0]["message"].as_str().unwrap();
    assert!(
        said.contains("upgrade failed") || said.contains("fell"),
        "{said}"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("0 done, 0 skipped, 1 failed, 2 not started")
    );
    let s = status(&vms[0], "node1");
    assert_eq!(
        (s["booted_slot"].as_str(), s["version"].as_str()),
        (Some("B"), Some("0.2.0"))
    );
    for ((vm, before), n) in vms[1..].iter().zip(&untouched).zip(["node2", "node3"]) {
        let s = status(vm, n);
        assert_eq!(s["boot_id"].as_str(), Some(before.as_str()));
        assert_eq!(s["version"], "0.2.0");
        assert!(
            s["last_event"]
                .as_str()
                .unwrap_or_default()
                .contains("upgrade-succeeded")
        );
    }
    for (vm, n) in vms.iter_mut().zip(["node1", "node2", "node3"]) {
        let out = node(vm, &creds, n, &["poweroff"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
