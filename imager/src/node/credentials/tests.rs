// Tests panic on unexpected failures: that is how a test fails.
#![allow(clippy::unwrap_used)]

use super::*;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::process::Command;

fn client(name: &str, role: Role) -> Holder {
    Holder::Client {
        name: name.into(),
        role,
    }
}

fn node() -> Holder {
    Holder::Node {
        name: "node1".into(),
        addresses: vec![IpAddr::V4(Ipv4Addr::LOCALHOST)],
    }
}

fn read(dir: &Path, name: &str) -> Vec<u8> {
    std::fs::read(dir.join(name)).unwrap()
}

/// openssl's verdict on `cert` against `dir`'s CA, with `purpose`.
fn openssl_verify(dir: &Path, cert: &str, purpose: &str) -> bool {
    Command::new(crate::disk::testutil::tool("openssl"))
        .args(["verify", "-purpose", purpose, "-CAfile"])
        .arg(dir.join(CA_CERT))
        .arg(dir.join(cert))
        .output()
        .unwrap()
        .status
        .success()
}

#[test]
fn the_ca_issues_clients_with_roles_and_nodes_that_openssl_verifies() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("creds");
    let made = make(&dir, Some(&client("admin", Role::Admin)), false).unwrap();
    assert!(made.ca_created);
    assert_eq!(made.files, ["ca.crt", "ca.key", "admin.crt", "admin.key"]);
    let made = make(&dir, Some(&node()), false).unwrap();
    assert!(!made.ca_created);
    assert_eq!(made.files, ["node1.node.crt", "node1.node.key"]);
    make(&dir, Some(&client("alice", Role::Reader)), false).unwrap();
    for key in ["ca.key", "admin.key", "node1.node.key", "alice.key"] {
        let mode = std::fs::metadata(dir.join(key))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "{key}");
    }
    // An independent check of the chain and of what each may be used for.
    assert!(openssl_verify(&dir, "admin.crt", "sslclient"));
    assert!(openssl_verify(&dir, "alice.crt", "sslclient"));
    assert!(openssl_verify(&dir, "node1.node.crt", "sslserver"));
    assert!(!openssl_verify(&dir, "node1.node.crt", "sslclient"));
    assert!(!openssl_verify(&dir, "admin.crt", "sslserver"));
    let other = tmp.path().join("other");
    make(&other, Some(&client("admin", Role::Admin)), false).unwrap();
    assert!(
        !Command::new(crate::disk::testutil::tool("openssl"))
            .args(["verify", "-CAfile"])
            .arg(dir.join(CA_CERT))
            .arg(other.join("admin.crt"))
            .output()
            .unwrap()
            .status
            .success()
    );
    // The role is in the certificate.
    let der = |name: &str| nodeapi::tls::certs(&read(&dir, name), name).unwrap()[0].to_vec();
    assert_eq!(
        nodeapi::tls::role_of(&der("admin.crt")).unwrap(),
        Role::Admin
    );
    assert_eq!(
        nodeapi::tls::role_of(&der("alice.crt")).unwrap(),
        Role::Reader
    );
    assert!(nodeapi::tls::role_of(&der("node1.node.crt")).is_err());
    // Nothing replaced without force; bad names refused; a CA key others
    // can read is refused.
    let before = read(&dir, "alice.key");
    let e = make(&dir, Some(&client("alice", Role::Admin)), false).unwrap_err();
    assert!(format!("{e:#}").contains("already exists"), "{e:#}");
    assert_eq!(read(&dir, "alice.key"), before);
    make(&dir, Some(&client("alice", Role::Operator)), true).unwrap();
    assert_ne!(read(&dir, "alice.key"), before);
    for bad in ["", "ca", ".hidden", "a/b", "x y"] {
        assert!(
            make(&dir, Some(&client(bad, Role::Reader)), false).is_err(),
            "{bad:?}"
        );
    }
    std::fs::set_permissions(dir.join(CA_KEY), std::fs::Permissions::from_mode(0o644)).unwrap();
    let e = make(&dir, Some(&client("bob", Role::Reader)), false).unwrap_err();
    assert!(format!("{e:#}").contains("readable by others"), "{e:#}");
    assert!(!dir.join("bob.crt").exists());
}

/// A TLS 1.3 server with `dir`'s node credentials on loopback, answering
/// each connection with the role of its client, or the error.
fn serve(dir: &Path) -> (u16, std::thread::JoinHandle<Vec<String>>) {
    serve_with(
        dir,
        &read(dir, CA_CERT),
        &nodeapi::tls::Policy::default(),
        4,
    )
}

/// [`serve`] trusting `ca` under `policy`, for `connections`.
fn serve_with(
    dir: &Path,
    ca: &[u8],
    policy: &nodeapi::tls::Policy,
    connections: usize,
) -> (u16, std::thread::JoinHandle<Vec<String>>) {
    let config = nodeapi::tls::server_config(
        ca,
        &read(dir, "node1.node.crt"),
        &read(dir, "node1.node.key"),
        policy,
    )
    .unwrap();
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let port = listener.local_addr().unwrap().port();
    let handle = std::thread::spawn(move || {
        let mut seen = Vec::new();
        for _ in 0..connections {
            let (mut tcp, _) = listener.accept().unwrap();
            let mut conn = rustls::ServerConnection::new(config.clone()).unwrap();
            let outcome = match conn.complete_io(&mut tcp) {
                Err(e) => format!("handshake: {e}"),
                Ok(_) => {
                    assert_eq!(
                        conn.protocol_version(),
                        Some(rustls::ProtocolVersion::TLSv1_3)
                    );
                    match nodeapi::tls::peer_role(&conn) {
                        Ok(r) => {
                            let mut s = rustls::Stream::new(&mut conn, &mut tcp);
                            s.write_all(r.name().as_bytes()).unwrap();
                            s.conn.send_close_notify();
                            let _ = s.flush();
                            r.name().to_string()
                        }
                        Err(e) => format!("role: {e}"),
                    }
                }
            };
            seen.push(outcome);
        }
        seen
    });
    (port, handle)
}

/// Connects with `creds/name.{crt,key}` trusting `trust`'s CA: what the
/// server said, or the error.
fn call(port: u16, trust: &Path, creds: &Path, name: &str) -> Result<String> {
    let config = nodeapi::tls::client_config(
        &read(trust, CA_CERT),
        &read(creds, &format!("{name}.crt")),
        &read(creds, &format!("{name}.key")),
    )?;
    let server = rustls::pki_types::ServerName::try_from("node1").unwrap();
    let mut conn = rustls::ClientConnection::new(config, server)?;
    let mut tcp = TcpStream::connect((Ipv4Addr::LOCALHOST, port))?;
    let mut s = rustls::Stream::new(&mut conn, &mut tcp);
    let mut got = String::new();
    s.read_to_string(&mut got)?;
    Ok(got)
}

#[test]
fn mutual_tls_admits_clients_of_the_ca_with_their_role_and_nothing_else() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("creds");
    make(&dir, Some(&node()), false).unwrap();
    make(&dir, Some(&client("admin", Role::Admin)), false).unwrap();
    make(&dir, Some(&client("alice", Role::Reader)), false).unwrap();
    let other = tmp.path().join("other");
    make(&other, Some(&client("mallory", Role::Admin)), false).unwrap();
    make(&other, Some(&node()), false).unwrap();
    let (port, server) = serve(&dir);
    assert_eq!(call(port, &dir, &dir, "admin").unwrap(), "admin");
    assert_eq!(call(port, &dir, &dir, "alice").unwrap(), "reader");
    // A client of another CA: refused in the handshake.
    assert!(call(port, &dir, &other, "mallory").is_err());
    // A client that trusts another CA refuses our node.
    let e = call(port, &other, &other, "mallory").unwrap_err();
    assert!(
        format!("{e:#}").to_lowercase().contains("certificate"),
        "{e:#}"
    );
    let seen = server.join().unwrap();
    assert_eq!(seen[..2], ["admin", "reader"]);
    assert!(seen[2].starts_with("handshake:"), "{seen:?}");
    assert!(seen[3].starts_with("handshake:"), "{seen:?}");
}

/// What the client is told when the node refuses it in the handshake
/// (`imager node`'s own explanation of the TLS error).
fn refusal(e: &anyhow::Error) -> String {
    let tls = e
        .chain()
        .find_map(|c| c.downcast_ref::<std::io::Error>())
        .and_then(|io| io.get_ref())
        .and_then(|i| i.downcast_ref::<rustls::Error>())
        .unwrap_or_else(|| panic!("not a TLS error: {e:#}"));
    crate::node::client::tls_failure(tls)
        .unwrap_or_else(|| panic!("no explanation for {tls}"))
        .to_string()
}

/// Certificates that expire, are renewed and are revoked; a clock behind
/// the build's time; two CAs trusted at once during a rollover.
#[test]
fn expired_and_revoked_client_certificates_are_refused_and_renewed_ones_work() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("creds");
    let now = nodeapi::tls::now();
    make(&dir, Some(&node()), false).unwrap();
    // Valid for a day, ten days ago.
    let past = Validity {
        from: now - 10 * 86400,
        days: 1,
    };
    make_with(&dir, Some(&client("alice", Role::Reader)), false, past).unwrap();
    make(&dir, Some(&client("bob", Role::Operator)), false).unwrap();
    make(&dir, Some(&client("carol", Role::Admin)), false).unwrap();
    let bob = nodeapi::tls::certs(&read(&dir, "bob.crt"), "bob").unwrap();
    let policy = nodeapi::tls::Policy {
        clock_floor: 0,
        revoked: vec![nodeapi::tls::fingerprint(&bob[0])],
    };
    let (port, server) = serve_with(&dir, &read(&dir, CA_CERT), &policy, 4);
    let e = call(port, &dir, &dir, "alice").unwrap_err();
    assert!(refusal(&e).contains("it has expired"), "{e:#}");
    assert!(refusal(&e).contains("--renew"), "{e:#}");
    let e = call(port, &dir, &dir, "bob").unwrap_err();
    assert!(refusal(&e).contains("it is revoked"), "{e:#}");
    assert_eq!(call(port, &dir, &dir, "carol").unwrap(), "admin");
    // Renewed (as --renew does: the same name, a new key and period).
    make_with(
        &dir,
        Some(&client("alice", Role::Reader)),
        true,
        Validity::days_from_now(HOLDER_DAYS),
    )
    .unwrap();
    assert_eq!(call(port, &dir, &dir, "alice").unwrap(), "reader");
    let seen = server.join().unwrap();
    assert!(seen[0].starts_with("handshake:"), "{seen:?}");
    assert!(seen[1].starts_with("handshake:"), "{seen:?}");

    // A node whose clock is behind its build's time checks as of the
    // build's time: two years on, a one-year certificate has expired.
    let floor = nodeapi::tls::Policy {
        clock_floor: now + 2 * 365 * 86400,
        revoked: Vec::new(),
    };
    let (port, server) = serve_with(&dir, &read(&dir, CA_CERT), &floor, 1);
    let e = call(port, &dir, &dir, "carol").unwrap_err();
    assert!(refusal(&e).contains("it has expired"), "{e:#}");
    server.join().unwrap();

    // A CA rollover: the node trusts the old and the new CA together, so
    // clients of either are admitted while they move over.
    let new = tmp.path().join("new");
    make(&new, Some(&client("dave", Role::Reader)), false).unwrap();
    let both = [read(&dir, CA_CERT), read(&new, CA_CERT)].concat();
    let (port, server) = serve_with(&dir, &both, &nodeapi::tls::Policy::default(), 2);
    assert_eq!(call(port, &dir, &dir, "carol").unwrap(), "admin");
    assert_eq!(call(port, &dir, &new, "dave").unwrap(), "reader");
    server.join().unwrap();
}

#[test]
fn certificates_carry_their_validity_periods() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("creds");
    make(&dir, Some(&client("alice", Role::Reader)), false).unwrap();
    let end = |f: &str| {
        let c = nodeapi::tls::certs(&read(&dir, f), f).unwrap();
        nodeapi::tls::not_after(&c[0]).unwrap()
    };
    let now = nodeapi::tls::now();
    let days = |t: u64| (t - now + 3600) / 86400;
    assert_eq!(days(end(CA_CERT)), CA_DAYS);
    assert_eq!(days(end("alice.crt")), HOLDER_DAYS);
    // openssl reads the same end: not within 364 days, within 366.
    let ends_within = |days: u64| {
        !Command::new(crate::disk::testutil::tool("openssl"))
            .args(["x509", "-noout", "-checkend"])
            .arg((days * 86400).to_string())
            .arg("-in")
            .arg(dir.join("alice.crt"))
            .output()
            .unwrap()
            .status
            .success()
    };
    assert!(!ends_within(364));
    assert!(ends_within(366));
}

/// A CA rollover: the new CA issues, both are trusted until the rollover
/// ends; a node's new certificate is valid for its names under both, a
/// client of the old CA stays trusted until the end, one of the new CA
/// from the start; openssl agrees on the chains.
#[test]
fn a_ca_rollover_trusts_both_cas_until_it_ends() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("creds");
    make(&dir, Some(&client("old", Role::Admin)), false).unwrap();
    make(&dir, Some(&node()), false).unwrap();
    let chain = |name: &str| nodeapi::tls::certs(&read(&dir, name), "cert").unwrap();
    let old_client = chain("old.crt");
    let old_ca = read(&dir, CA_CERT);

    let e = format!("{:#}", end_rollover(&dir).unwrap_err());
    assert!(e.contains("no CA rollover under way"), "{e}");
    let made = rollover_ca(&dir, nodeapi::tls::now()).unwrap();
    assert_eq!(made.files, [CA_OLD_CERT, CA_CERT, CA_KEY]);
    assert_eq!(read(&dir, CA_OLD_CERT), old_ca);
    assert_ne!(read(&dir, CA_CERT), old_ca);
    let mode = std::fs::metadata(dir.join(CA_KEY))
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600);
    let e = format!("{:#}", rollover_ca(&dir, nodeapi::tls::now()).unwrap_err());
    assert!(e.contains("rollover under way"), "{e}");

    let bundle = trust_bundle(&dir).unwrap();
    assert_eq!(
        nodeapi::tls::certs(bundle.as_bytes(), "b").unwrap().len(),
        2
    );
    make(&dir, Some(&node()), true).unwrap();
    make(&dir, Some(&client("new", Role::Admin)), false).unwrap();
    assert!(openssl_verify(&dir, "new.crt", "sslclient"));
    assert!(!openssl_verify(&dir, "old.crt", "sslclient"));
    let (cert, key) = (read(&dir, "node1.node.crt"), read(&dir, "node1.node.key"));
    let names = nodeapi::tls::server_names(&cert).unwrap();
    assert_eq!(names, ["node1", "127.0.0.1"]);
    for n in &names {
        nodeapi::tls::check_node(bundle.as_bytes(), &cert, &key, n).unwrap();
    }
    nodeapi::tls::check_client(bundle.as_bytes(), &old_client).unwrap();
    nodeapi::tls::check_client(bundle.as_bytes(), &chain("new.crt")).unwrap();
    // The old CA alone does not take the new node certificate.
    assert!(nodeapi::tls::check_node(&old_ca, &cert, &key, "node1").is_err());

    end_rollover(&dir).unwrap();
    let only = trust_bundle(&dir).unwrap();
    assert_eq!(nodeapi::tls::certs(only.as_bytes(), "b").unwrap().len(), 1);
    let e = format!(
        "{:#}",
        nodeapi::tls::check_client(only.as_bytes(), &old_client).unwrap_err()
    );
    assert!(e.contains("would not be trusted under the new CA"), "{e}");
    nodeapi::tls::check_client(only.as_bytes(), &chain("new.crt")).unwrap();
}
