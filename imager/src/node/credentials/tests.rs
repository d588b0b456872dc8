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
    let config = nodeapi::tls::server_config(
        &read(dir, CA_CERT),
        &read(dir, "node1.node.crt"),
        &read(dir, "node1.node.key"),
    )
    .unwrap();
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let port = listener.local_addr().unwrap().port();
    let handle = std::thread::spawn(move || {
        let mut seen = Vec::new();
        for _ in 0..4 {
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
