//! Authentication against real registries: Debian's `docker-registry`
//! behind TLS (a test CA's certificate for `localhost`), reached by name,
//! with token auth (the token server of `common::auth`) and with Basic
//! auth (htpasswd). Pushes and pulls go through the client; skopeo, with
//! the same credentials, checks what was pushed. Credentials never show in
//! an error, and go nowhere they should not.

// Tests panic on unexpected failures: that is how a test fails.
#![allow(clippy::unwrap_used)]

mod common;

use common::auth::{PASSWORD, Pki, TEST_NAME, TokenServer, USER, dns_server};
use common::{OCI_LAYER, Registry, noise, read_blob, tool};
use registry::{Client, Credentials, Descriptor, Digest, ErrorKind, Options, Pushed, Reference};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::process::Command;
use std::sync::atomic::Ordering;

fn reference(s: &str) -> Reference {
    Reference::parse(s).unwrap()
}

/// A client trusting the test CA, with `credentials` for `registry`.
fn client(pki: &Pki, registry: &str, credentials: Credentials) -> Client {
    Client::new(Options {
        ca_pem: Some(pki.ca_pem.clone().into_bytes()),
        credentials: BTreeMap::from([(registry.to_string(), credentials)]),
        ..Options::default()
    })
    .unwrap()
}

fn alice() -> Credentials {
    Credentials::basic(USER, PASSWORD).unwrap()
}

fn descriptor(media_type: &str, bytes: &[u8]) -> Descriptor {
    Descriptor {
        media_type: media_type.into(),
        digest: Digest::of(bytes),
        size: bytes.len() as u64,
    }
}

/// Pushes an image of `layers` under `r` through `client`.
fn push(client: &Client, r: &Reference, layers: &[&[u8]]) -> (Digest, Vec<Descriptor>) {
    common::auth::push_image_via(client, r, layers)
}

/// `skopeo inspect --raw` of `image` with the test CA and `creds`: the
/// manifest's bytes, read by an independent client.
fn skopeo_raw(pki: &Pki, image: &str, creds: Option<&str>) -> Result<Vec<u8>, String> {
    let mut cmd = Command::new(tool("skopeo"));
    cmd.args(["inspect", "--raw", "--cert-dir"])
        .arg(pki.cert_dir());
    match creds {
        Some(c) => cmd.args(["--creds", c]),
        None => cmd.arg("--no-creds"),
    };
    let out = cmd.arg(format!("docker://{image}")).output().unwrap();
    if out.status.success() {
        Ok(out.stdout)
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

#[test]
fn token_auth_push_and_pull_by_name_over_https() {
    let pki = Pki::new();
    let tokens = TokenServer::start(&pki);
    let reg = Registry::start_token(&pki, &tokens);
    let name = reg.by_name();
    let c = client(&pki, &name, alice());
    let r = reference(&format!("{name}/team/installer:0.2.0"));
    let layers = [noise(2 << 20, 1), noise(1000, 2)];
    let (digest, ds) = push(&c, &r, &[&layers[0], &layers[1]]);

    // An independent client sees what was pushed.
    let raw = skopeo_raw(&pki, &r.to_string(), Some(&format!("{USER}:{PASSWORD}"))).unwrap();
    assert_eq!(Digest::of(&raw), digest, "skopeo reads another manifest");

    // Pulled back by a fresh client, by name, through tokens.
    let c = client(&pki, &name, alice());
    let m = c.manifest(&r).unwrap();
    assert_eq!(m.digest, digest);
    for (d, bytes) in ds.iter().zip(&layers) {
        assert_eq!(&read_blob(&c, &r, d).unwrap(), bytes);
    }
    // One token for the pull scope, reused for the manifest and both blobs.
    let before = tokens.requests.load(Ordering::SeqCst);
    let c2 = client(&pki, &name, alice());
    c2.manifest(&r).unwrap();
    for d in &ds {
        read_blob(&c2, &r, d).unwrap();
    }
    assert_eq!(tokens.requests.load(Ordering::SeqCst) - before, 1);
    // A second push finds the blobs there and sends none.
    assert_eq!(
        c.push_blob(&r, &ds[0], &layers[0][..]).unwrap(),
        Pushed::Present
    );
    // The token service got the credentials as Basic, over TLS, and the
    // scopes asked for.
    let heads = tokens.heads.lock().unwrap().join("\n");
    assert!(
        heads.contains("scope=repository%3Ateam%2Finstaller%3Apull%2Cpush"),
        "{heads}"
    );
    assert!(heads.contains("service=test-registry"), "{heads}");
}

#[test]
fn anonymous_tokens_for_public_repositories_and_a_clear_refusal_for_private_ones() {
    let pki = Pki::new();
    let tokens = TokenServer::start(&pki);
    let reg = Registry::start_token(&pki, &tokens);
    let name = reg.by_name();
    let writer = client(&pki, &name, alice());
    let public = reference(&format!("{name}/public/os:1.0.0"));
    let private = reference(&format!("{name}/private/os:1.0.0"));
    let layer = noise(5000, 3);
    let (digest, ds) = push(&writer, &public, &[&layer]);
    push(&writer, &private, &[&layer]);

    let anonymous = client(&pki, &name, Credentials::Anonymous);
    let m = anonymous.manifest(&public).unwrap();
    assert_eq!(m.digest, digest);
    assert_eq!(read_blob(&anonymous, &public, &ds[0]).unwrap(), layer);
    let e = anonymous.manifest(&private).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unauthorized, "{e}");
    assert!(
        e.to_string()
            .contains(&format!("{name} requires credentials to pull private/os"))
            && e.to_string().contains("give credentials"),
        "{e}"
    );
    // Anonymous may not push, even where it may pull.
    let e = anonymous
        .push_blob(&public, &descriptor(OCI_LAYER, b"x"), &b"x"[..])
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unauthorized, "{e}");
}

#[test]
fn wrong_credentials_are_refused_and_never_shown() {
    let pki = Pki::new();
    let tokens = TokenServer::start(&pki);
    let reg = Registry::start_token(&pki, &tokens);
    let name = reg.by_name();
    let r = reference(&format!("{name}/team/installer:0.2.0"));
    push(&client(&pki, &name, alice()), &r, &[b"layer"]);
    let secret = "wrong-S3cret-pw";
    let wrong = client(&pki, &name, Credentials::basic(USER, secret).unwrap());
    let e = wrong.manifest(&r).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unauthorized);
    let m = e.to_string();
    assert!(
        m.contains("refused the credentials given for") && m.contains("check the user name"),
        "{m}"
    );
    assert!(!m.contains(secret) && !m.contains(PASSWORD), "{m}");
    assert!(!format!("{wrong:?}").contains(secret));

    // Basic auth: the same refusal from the registry itself.
    let basic = Registry::start_basic(&pki);
    let name = basic.by_name();
    let r = reference(&format!("{name}/team/installer:0.2.0"));
    push(&client(&pki, &name, alice()), &r, &[b"layer"]);
    let e = client(&pki, &name, Credentials::basic(USER, secret).unwrap())
        .manifest(&r)
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unauthorized);
    assert!(e.to_string().contains("refused the credentials"), "{e}");
    assert!(!e.to_string().contains(secret), "{e}");
}

#[test]
fn basic_auth_push_and_pull_over_https() {
    let pki = Pki::new();
    let reg = Registry::start_basic(&pki);
    let name = reg.by_name();
    let c = client(&pki, &name, alice());
    let r = reference(&format!("{name}/metal/installer:0.3.0"));
    let layer = noise(1 << 20, 4);
    let (digest, ds) = push(&c, &r, &[&layer]);
    let raw = skopeo_raw(&pki, &r.to_string(), Some(&format!("{USER}:{PASSWORD}"))).unwrap();
    assert_eq!(Digest::of(&raw), digest);
    assert!(skopeo_raw(&pki, &r.to_string(), None).is_err());
    let c = client(&pki, &name, alice());
    assert_eq!(c.manifest(&r).unwrap().digest, digest);
    assert_eq!(read_blob(&c, &r, &ds[0]).unwrap(), layer);
    let e = client(&pki, &name, Credentials::Anonymous)
        .manifest(&r)
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("requires a user name and password to pull metal/installer"),
        "{e}"
    );
}

#[test]
fn a_revoked_or_expired_token_is_renewed_once() {
    let pki = Pki::new();
    let tokens = TokenServer::start(&pki);
    let reg = Registry::start_token(&pki, &tokens);
    let name = reg.by_name();
    let r = reference(&format!("{name}/team/installer:0.2.0"));
    let c = client(&pki, &name, alice());
    let (digest, _) = push(&c, &r, &[b"layer"]);
    // Tokens the registry refuses (expired an hour ago, but said to last
    // 300 s): the client caches one, is refused, asks again once, and
    // reports the refusal.
    tokens.behaviour.stale.store(true, Ordering::SeqCst);
    let c = client(&pki, &name, alice());
    let before = tokens.requests.load(Ordering::SeqCst);
    let e = c.manifest(&r).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unauthorized, "{e}");
    assert_eq!(tokens.requests.load(Ordering::SeqCst) - before, 1);
    // The registry accepts tokens again: the cached stale one is refused,
    // the client fetches a new one and goes on.
    tokens.behaviour.stale.store(false, Ordering::SeqCst);
    let before = tokens.requests.load(Ordering::SeqCst);
    assert_eq!(c.manifest(&r).unwrap().digest, digest);
    assert_eq!(tokens.requests.load(Ordering::SeqCst) - before, 1);
}

/// A registry on 127.0.0.1 that answers every request with 401 and
/// `challenge`, recording each request's head. Returns its address.
fn challenging_server(
    challenge: String,
) -> (String, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let heads = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let h = heads.clone();
    std::thread::spawn(move || {
        for s in listener.incoming() {
            let Ok(mut s) = s else { continue };
            let mut buf = [0u8; 8192];
            let n = s.read(&mut buf).unwrap_or(0);
            h.lock()
                .unwrap()
                .push(String::from_utf8_lossy(&buf[..n]).into_owned());
            let _ = write!(
                s,
                "HTTP/1.1 401 Unauthorized\r\nwww-authenticate: {challenge}\r\ncontent-length: \
                 0\r\nconnection: close\r\n\r\n"
            );
        }
    });
    (addr, heads)
}

#[test]
fn a_registry_cannot_send_credentials_elsewhere() {
    let secret = "S3cret-never-sent";
    for (realm, want) in [
        // A realm over plain HTTP, to a host not allowed plain HTTP.
        (
            "http://token.example/token",
            "credentials and tokens travel over HTTPS only",
        ),
        // Instance metadata, this machine.
        ("https://169.254.169.254/token", "link-local"),
        ("https://localhost:50000/token", "this machine"),
        ("ftp://token.example/token", "not an HTTP(S) URL"),
        ("/token", "not an absolute URL"),
    ] {
        let (addr, heads) = challenging_server(format!(
            r#"Bearer realm="{realm}",service="s",scope="repository:a:pull""#
        ));
        // The registry is plain HTTP on 127.0.0.1: allowed for it alone. A
        // realm on localhost is refused all the same (another name).
        let c = Client::new(Options {
            plain_http: vec![addr.clone()],
            credentials: BTreeMap::from([(
                addr.clone(),
                Credentials::basic(USER, secret).unwrap(),
            )]),
            ..Options::default()
        })
        .unwrap();
        let e = c.manifest(&reference(&format!("{addr}/a:1"))).unwrap_err();
        assert!(e.to_string().contains(want), "{realm}: {e}");
        assert!(!e.to_string().contains(secret));
        // The registry itself asked first and got nothing but the request.
        let heads = heads.lock().unwrap();
        assert_eq!(heads.len(), 1, "{realm}: {heads:?}");
        assert!(
            !heads[0].to_ascii_lowercase().contains("authorization"),
            "{heads:?}"
        );
    }
    // A scheme the client does not speak.
    let (addr, _) = challenging_server(r#"Negotiate abc=="#.into());
    let c = Client::new(Options {
        plain_http: vec![addr.clone()],
        ..Options::default()
    })
    .unwrap();
    let e = c.manifest(&reference(&format!("{addr}/a:1"))).unwrap_err();
    assert!(e.to_string().contains("does not speak"), "{e}");
}

/// A client given a resolver (as the node is: no system resolver) reaches
/// the registry by a name that only its host entries or its DNS server
/// know, the token service's name too.
#[test]
fn names_resolve_through_host_entries_and_a_dns_server() {
    let pki = Pki::new();
    let tokens = TokenServer::start_at(&pki, TEST_NAME);
    let reg = Registry::start_token(&pki, &tokens);
    let port = reg.addr.rsplit(':').next().unwrap();
    let name = format!("{TEST_NAME}:{port}");
    let r = reference(&format!("{name}/team/installer:0.2.0"));
    let with = |resolver: registry::dns::Resolver| {
        Client::new(Options {
            ca_pem: Some(pki.ca_pem.clone().into_bytes()),
            credentials: BTreeMap::from([(name.clone(), alice())]),
            resolver: Some(resolver),
            ..Options::default()
        })
        .unwrap()
    };
    let loopback = vec![std::net::Ipv4Addr::LOCALHOST];
    let hosts = registry::dns::Resolver {
        hosts: BTreeMap::from([(TEST_NAME.to_string(), loopback)]),
        ..Default::default()
    };
    let (digest, _) = push(&with(hosts), &r, &[b"layer"]);
    let (server, queries) = dns_server();
    let dns = registry::dns::Resolver {
        servers: vec![server],
        timeout: std::time::Duration::from_secs(2),
        trusted_names: vec![TEST_NAME.to_string()],
        ..Default::default()
    };
    assert_eq!(with(dns.clone()).manifest(&r).unwrap().digest, digest);
    // A DNS answer that leads to this machine for a name the operator did
    // not give (here, the registry's own name, untrusted): refused.
    let e = with(registry::dns::Resolver {
        trusted_names: Vec::new(),
        ..dns
    })
    .manifest(&r)
    .unwrap_err();
    assert!(
        e.to_string()
            .contains(&format!("the DNS answer for \"{TEST_NAME}\" is 127.0.0.1")),
        "{e}"
    );
    // registry.test, for the registry and for its token service.
    assert!(queries.load(Ordering::SeqCst) >= 2);
    // Without an entry or a server: a message that says so.
    let e = with(registry::dns::Resolver::default())
        .manifest(&r)
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unreachable, "{e}");
    assert!(e.to_string().contains("no DNS server"), "{e}");
}
