//! Registries that authenticate, for the tests: a test CA and a server
//! certificate for `localhost` and 127.0.0.1 (rcgen), Debian's
//! `docker-registry` behind TLS with Basic auth (an htpasswd file made by
//! Apache's `htpasswd`, bcrypt) or with token auth, and the token server
//! token auth needs: a small HTTPS server (rustls) that checks Basic
//! credentials and issues the JWTs distribution verifies (ES256, the
//! signing certificate in `x5c`, chained to the test CA).

use super::{Registry, tool};
use base64::Engine as _;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// The user the registries know, and the password.
pub const USER: &str = "alice";
pub const PASSWORD: &str = "alice-Pa55word";
/// The service and issuer of the token registry.
pub const SERVICE: &str = "test-registry";
pub const ISSUER: &str = "test-token-issuer";

/// A name the server certificate holds beside `localhost`, resolved by the
/// tests' own host entries or DNS server (never by the system).
pub const TEST_NAME: &str = "registry.test";

/// A test CA and a certificate it signed for localhost, [`TEST_NAME`] and
/// 127.0.0.1.
pub struct Pki {
    pub dir: tempfile::TempDir,
    pub ca_pem: String,
    ca: rcgen::Issuer<'static, rcgen::KeyPair>,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub server_cert_pem: String,
    pub server_key_pem: String,
}

impl Pki {
    pub fn new() -> Pki {
        let dir = tempfile::tempdir().unwrap();
        let ca_key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut p = rcgen::CertificateParams::default();
        p.distinguished_name
            .push(rcgen::DnType::CommonName, "registry test CA");
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        p.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let ca_cert = p.self_signed(&ca_key).unwrap();
        let ca_pem = ca_cert.pem();
        let ca = rcgen::Issuer::new(p, ca_key);
        let (cert, key) = issue(&ca, "localhost", true);
        let server_cert = dir.path().join("server.crt");
        let server_key = dir.path().join("server.key");
        std::fs::write(&server_cert, &cert).unwrap();
        std::fs::write(&server_key, &key).unwrap();
        // skopeo's --cert-dir: CAs as *.crt.
        std::fs::create_dir(dir.path().join("certs.d")).unwrap();
        std::fs::write(dir.path().join("certs.d/ca.crt"), &ca_pem).unwrap();
        std::fs::write(dir.path().join("ca.pem"), &ca_pem).unwrap();
        Pki {
            dir,
            ca_pem,
            ca,
            server_cert,
            server_key,
            server_cert_pem: cert,
            server_key_pem: key,
        }
    }

    /// The directory for skopeo's `--cert-dir`.
    pub fn cert_dir(&self) -> PathBuf {
        self.dir.path().join("certs.d")
    }

    pub fn ca_file(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }
}

/// A certificate (PEM) and key (PEM) signed by `ca` for `name` (and
/// 127.0.0.1 when `server`).
fn issue(ca: &rcgen::Issuer<'_, rcgen::KeyPair>, name: &str, server: bool) -> (String, String) {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let mut names = vec![name.to_string()];
    if server {
        names.push(TEST_NAME.to_string());
    }
    let mut p = rcgen::CertificateParams::new(names).unwrap();
    p.distinguished_name.push(rcgen::DnType::CommonName, name);
    if server {
        p.subject_alt_names
            .push(rcgen::SanType::IpAddress([127, 0, 0, 1].into()));
    }
    let cert = p.signed_by(&key, ca).unwrap();
    (cert.pem(), key.serialize_pem())
}

impl Registry {
    /// A registry over TLS (the test CA's certificate for localhost) with
    /// Basic auth: [`USER`] and [`PASSWORD`].
    pub fn start_basic(pki: &Pki) -> Registry {
        let htpasswd = pki.dir.path().join("htpasswd");
        let out = Command::new(tool("htpasswd"))
            .args(["-Bbn", USER, PASSWORD])
            .output()
            .unwrap();
        assert!(out.status.success(), "htpasswd failed");
        std::fs::write(&htpasswd, &out.stdout).unwrap();
        Registry::start_with(&format!(
            "{}auth:\n  htpasswd:\n    realm: test\n    path: {}\n",
            tls_config(pki),
            htpasswd.display()
        ))
    }

    /// A registry over TLS with token auth, its tokens issued by `tokens`.
    pub fn start_token(pki: &Pki, tokens: &TokenServer) -> Registry {
        Registry::start_with(&format!(
            "{}auth:\n  token:\n    realm: {}\n    service: {SERVICE}\n    issuer: {ISSUER}\n    \
             rootcertbundle: {}\n",
            tls_config(pki),
            tokens.realm,
            pki.ca_file().display()
        ))
    }

    /// `localhost:PORT`: the registry by name.
    pub fn by_name(&self) -> String {
        self.addr.replace("127.0.0.1", "localhost")
    }
}

fn tls_config(pki: &Pki) -> String {
    format!(
        "  tls:\n    certificate: {}\n    key: {}\n",
        pki.server_cert.display(),
        pki.server_key.display()
    )
}

/// How the token server behaves.
#[derive(Default)]
pub struct Behaviour {
    /// Issue tokens that expired long ago (the registry refuses them).
    pub stale: AtomicBool,
}

/// The token server: `GET /token?service=…&scope=…` with Basic [`USER`]
/// and [`PASSWORD`] grants every action asked; anonymous requests get
/// `pull` on repositories under `public/` only; wrong credentials get 401.
pub struct TokenServer {
    pub realm: String,
    /// Token requests answered.
    pub requests: Arc<AtomicU64>,
    /// Every request's head, as received (to show what was sent).
    pub heads: Arc<Mutex<Vec<String>>>,
    pub behaviour: Arc<Behaviour>,
}

impl TokenServer {
    /// A token server its registry names as `localhost`.
    pub fn start(pki: &Pki) -> TokenServer {
        TokenServer::start_at(pki, "localhost")
    }

    /// A token server its registry names as `host` (one of the server
    /// certificate's names).
    pub fn start_at(pki: &Pki, host: &str) -> TokenServer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let (signer_cert, signer_key) = issue(&pki.ca, "token signer", false);
        let signer_der = rustls_pki_types::pem::PemObject::from_pem_slice(signer_cert.as_bytes())
            .map(|c: rustls_pki_types::CertificateDer| c.to_vec())
            .unwrap();
        let signer = rcgen::KeyPair::from_pem(&signer_key).unwrap();
        let config = server_config(pki);
        let requests = Arc::new(AtomicU64::new(0));
        let heads = Arc::new(Mutex::new(Vec::new()));
        let behaviour = Arc::new(Behaviour::default());
        let (r, h, b) = (requests.clone(), heads.clone(), behaviour.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let conn = rustls::ServerConnection::new(config.clone()).unwrap();
                let mut tls = rustls::StreamOwned::new(conn, stream);
                let Some(head) = read_head(&mut tls) else {
                    continue;
                };
                h.lock().unwrap().push(head.clone());
                r.fetch_add(1, Ordering::SeqCst);
                let (status, body) = answer(&head, &signer, &signer_der, &b);
                let _ = write!(
                    tls,
                    "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: \
                     {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = tls.flush();
                tls.conn.send_close_notify();
                let _ = tls.flush();
            }
        });
        TokenServer {
            realm: format!("https://{host}:{port}/token"),
            requests,
            heads,
            behaviour,
        }
    }
}

fn server_config(pki: &Pki) -> Arc<rustls::ServerConfig> {
    use rustls_pki_types::pem::PemObject;
    let certs = vec![
        rustls_pki_types::CertificateDer::from_pem_slice(pki.server_cert_pem.as_bytes()).unwrap(),
    ];
    let key =
        rustls_pki_types::PrivateKeyDer::from_pem_slice(pki.server_key_pem.as_bytes()).unwrap();
    Arc::new(
        rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap(),
    )
}

/// The request line and headers (up to the blank line), at most 64 KiB.
fn read_head(r: &mut impl Read) -> Option<String> {
    let mut reader = BufReader::new(r.take(64 << 10));
    let mut head = String::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).ok()? == 0 {
            return None;
        }
        if line == "\r\n" {
            return Some(head);
        }
        head.push_str(&line);
    }
}

fn b64url(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && i + 2 < b.len()
            && let Ok(v) =
                u8::from_str_radix(std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("zz"), 16)
        {
            out.push(v);
            i += 3;
            continue;
        }
        out.push(if b[i] == b'+' { b' ' } else { b[i] });
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The answer to a token request: its status line and JSON body.
fn answer(
    head: &str,
    signer: &rcgen::KeyPair,
    signer_der: &[u8],
    behaviour: &Behaviour,
) -> (&'static str, String) {
    use rcgen::SigningKey as _;
    let target = head.split_whitespace().nth(1).unwrap_or_default();
    let query = target.split_once('?').map_or("", |(_, q)| q);
    let mut scopes = Vec::new();
    let mut service = String::new();
    for pair in query.split('&') {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        match k {
            "scope" => scopes.push(percent_decode(v)),
            "service" => service = percent_decode(v),
            _ => {}
        }
    }
    let authorization = head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case("authorization")
            .then(|| v.trim().to_string())
    });
    let expected = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{PASSWORD}"))
    );
    let user = match authorization {
        None => None,
        Some(a) if a == expected => Some(USER),
        Some(_) => {
            return (
                "401 Unauthorized",
                r#"{"details":"bad credentials"}"#.into(),
            );
        }
    };
    if service != SERVICE {
        return ("400 Bad Request", r#"{"details":"unknown service"}"#.into());
    }
    let mut access = Vec::new();
    for scope in &scopes {
        let mut parts = scope.splitn(3, ':');
        let (Some("repository"), Some(name), Some(actions)) =
            (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let granted: Vec<&str> = actions
            .split(',')
            .filter(|a| user.is_some() || (*a == "pull" && name.starts_with("public/")))
            .collect();
        if granted.is_empty() {
            continue;
        }
        access.push(serde_json::json!({"type": "repository", "name": name, "actions": granted}));
    }
    if user.is_none() && access.is_empty() {
        return (
            "401 Unauthorized",
            r#"{"details":"authentication required"}"#.into(),
        );
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let exp = if behaviour.stale.load(Ordering::SeqCst) {
        now - 3600
    } else {
        now + 600
    };
    let header = serde_json::json!({
        "typ": "JWT",
        "alg": "ES256",
        "x5c": [base64::engine::general_purpose::STANDARD.encode(signer_der)],
    });
    let claims = serde_json::json!({
        "iss": ISSUER,
        "sub": user.unwrap_or(""),
        "aud": SERVICE,
        "exp": exp,
        "nbf": now - 60,
        "iat": now,
        "jti": format!("{now}-{}", scopes.len()),
        "access": access,
    });
    let signed = format!(
        "{}.{}",
        b64url(header.to_string().as_bytes()),
        b64url(claims.to_string().as_bytes())
    );
    let der = signer.sign(signed.as_bytes()).unwrap();
    let token = format!("{signed}.{}", b64url(&der_to_fixed(&der)));
    (
        "200 OK",
        serde_json::json!({"token": token, "expires_in": 300}).to_string(),
    )
}

/// An ECDSA signature's DER (SEQUENCE of INTEGERs r and s) as JWS's r||s,
/// 32 bytes each.
fn der_to_fixed(der: &[u8]) -> Vec<u8> {
    let mut i = 2; // SEQUENCE, length (< 128 for P-256)
    let mut out = Vec::new();
    for _ in 0..2 {
        assert_eq!(der[i], 0x02, "an INTEGER");
        let len = der[i + 1] as usize;
        let int = &der[i + 2..i + 2 + len];
        let int = &int[int.len().saturating_sub(32)..];
        out.extend(std::iter::repeat_n(0u8, 32 - int.len()));
        out.extend_from_slice(int);
        i += 2 + len;
    }
    out
}

/// A DNS server on 127.0.0.1 (UDP) that answers every `A` query with
/// 127.0.0.1 and counts the queries; its address.
pub fn dns_server() -> (std::net::SocketAddr, Arc<AtomicU64>) {
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = socket.local_addr().unwrap();
    let count = Arc::new(AtomicU64::new(0));
    let c = count.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 512];
        while let Ok((n, from)) = socket.recv_from(&mut buf) {
            if n < 12 {
                continue;
            }
            c.fetch_add(1, Ordering::SeqCst);
            let mut m = buf[..n].to_vec();
            m[2..4].copy_from_slice(&0x8180u16.to_be_bytes());
            m[6..8].copy_from_slice(&1u16.to_be_bytes());
            // The question's name by pointer, A, IN, TTL 60, 127.0.0.1.
            m.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4, 127, 0, 0, 1]);
            let _ = socket.send_to(&m, from);
        }
    });
    (addr, count)
}

/// A registry behind TLS with token authentication whose registry and token
/// service are both named [`TEST_NAME`] (their certificate's name), as a
/// node reaches them through a host entry: tests/node.rs and tests/fleet.rs
/// push installer images into it and have nodes pull from it.
pub struct NamedRegistry {
    pub pki: Pki,
    pub tokens: TokenServer,
    pub registry: Registry,
    /// `registry.test:PORT`: the registry as references name it.
    pub name: String,
    /// The ports of the registry and of its token service on 127.0.0.1.
    pub ports: [String; 2],
}

impl NamedRegistry {
    pub fn start() -> NamedRegistry {
        let pki = Pki::new();
        let tokens = TokenServer::start_at(&pki, TEST_NAME);
        let registry = Registry::start_token(&pki, &tokens);
        let port_of = |addr: &str| addr.rsplit(':').next().unwrap().to_string();
        let ports = [
            port_of(&registry.addr),
            port_of(tokens.realm.trim_end_matches("/token")),
        ];
        NamedRegistry {
            name: format!("{TEST_NAME}:{}", ports[0]),
            pki,
            tokens,
            registry,
            ports,
        }
    }

    /// A client with [`USER`]'s credentials that reaches the registry by
    /// its name from this host (a host entry for 127.0.0.1).
    pub fn client(&self) -> registry::Client {
        self.client_with(registry::Credentials::basic(USER, PASSWORD).unwrap())
    }

    /// [`NamedRegistry::client`] with `credentials` instead.
    pub fn client_with(&self, credentials: registry::Credentials) -> registry::Client {
        registry::Client::new(registry::Options {
            ca_pem: Some(self.pki.ca_pem.clone().into_bytes()),
            credentials: [(self.name.clone(), credentials)].into(),
            resolver: Some(registry::dns::Resolver {
                hosts: [(TEST_NAME.to_string(), vec![std::net::Ipv4Addr::LOCALHOST])].into(),
                ..Default::default()
            }),
            ..Default::default()
        })
        .unwrap()
    }

    /// `imager boot` arguments that forward both ports to `guest_ip`
    /// (`--guest-forward GUEST:PORT=127.0.0.1:PORT`, twice).
    pub fn guest_forwards(&self, guest_ip: &str) -> Vec<String> {
        self.ports
            .iter()
            .flat_map(|p| {
                [
                    "--guest-forward".to_string(),
                    format!("{guest_ip}:{p}=127.0.0.1:{p}"),
                ]
            })
            .collect()
    }

    /// Writes an auth file (as `podman login` does) with [`USER`]'s
    /// credentials for the registry at `path`; the encoded secret, which
    /// no output may show.
    pub fn write_auth_file(&self, path: &std::path::Path) -> String {
        let encoded =
            base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{PASSWORD}"));
        std::fs::write(
            path,
            format!(r#"{{"auths":{{"{}":{{"auth":"{encoded}"}}}}}}"#, self.name),
        )
        .unwrap();
        encoded
    }
}

/// Pushes an image of `layers` (and a small config) under `r` through
/// `client`, each layer uploaded: its manifest's digest and the layers'
/// descriptors.
pub fn push_image_via(
    client: &registry::Client,
    r: &registry::Reference,
    layers: &[&[u8]],
) -> (registry::Digest, Vec<registry::Descriptor>) {
    use super::{OCI_CONFIG, OCI_LAYER, OCI_MANIFEST};
    let descriptor = |media_type: &str, bytes: &[u8]| registry::Descriptor {
        media_type: media_type.into(),
        digest: registry::Digest::of(bytes),
        size: bytes.len() as u64,
    };
    let config =
        br#"{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]}}"#;
    let config_d = descriptor(OCI_CONFIG, config);
    client.push_blob(r, &config_d, &config[..]).unwrap();
    let mut ds = Vec::new();
    for l in layers {
        let d = descriptor(OCI_LAYER, l);
        assert_eq!(
            client.push_blob(r, &d, *l).unwrap(),
            registry::Pushed::Uploaded
        );
        ds.push(d);
    }
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {"mediaType": OCI_CONFIG, "digest": config_d.digest.as_str(), "size": config_d.size},
        "layers": ds.iter().map(|d| serde_json::json!(
            {"mediaType": d.media_type, "digest": d.digest.as_str(), "size": d.size})).collect::<Vec<_>>(),
    })
    .to_string();
    let digest = client
        .push_manifest(r, OCI_MANIFEST, manifest.as_bytes())
        .unwrap();
    assert_eq!(digest, registry::Digest::of(manifest.as_bytes()));
    (digest, ds)
}
