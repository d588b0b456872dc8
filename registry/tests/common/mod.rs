//! A real registry for the tests: Debian's `docker-registry` (the
//! distribution registry v2), started on 127.0.0.1 on a free port with its
//! storage in a temporary directory, waited for by polling `/v2/`, killed
//! when dropped. Images are pushed into it through its HTTP API (as a
//! client such as skopeo does), or with skopeo itself.

// Test helpers panic on unexpected failures: that is how a test fails.
#![allow(clippy::unwrap_used, dead_code)]

pub mod auth;

use registry::Digest;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
pub const OCI_LAYER: &str = "application/vnd.oci.image.layer.v1.tar";

pub struct Registry {
    child: Child,
    pub dir: tempfile::TempDir,
    pub addr: String,
    agent: ureq::Agent,
}

/// A port of 127.0.0.1 free a moment ago.
pub fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

// The one tool lookup; the imager tests that include this file load it
// twice (once through their own common module).
#[path = "../../../tests/common/tool.rs"]
#[allow(clippy::duplicate_mod)]
mod shared;
pub use shared::tool_path as tool;

impl Registry {
    pub fn start() -> Registry {
        Registry::start_with("")
    }

    /// Starts a registry whose configuration has `extra` YAML appended.
    pub fn start_with(extra: &str) -> Registry {
        let binary = tool("docker-registry");
        // A port taken between free_port() and the registry's bind: retry.
        for _ in 0..5 {
            let dir = tempfile::tempdir().unwrap();
            let port = free_port();
            let addr = format!("127.0.0.1:{port}");
            let config = format!(
                "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n\
                 http:\n  addr: {addr}\n{extra}",
                dir.path().join("storage").display()
            );
            let config_path = dir.path().join("config.yml");
            std::fs::write(&config_path, config).unwrap();
            let log = std::fs::File::create(dir.path().join("log")).unwrap();
            let child = Command::new(&binary)
                .arg("serve")
                .arg(&config_path)
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .unwrap();
            let agent: ureq::Agent = ureq::Agent::config_builder()
                .http_status_as_error(false)
                .proxy(None)
                .max_redirects(0)
                .build()
                .into();
            let mut r = Registry {
                child,
                dir,
                addr,
                agent,
            };
            if r.wait_up() {
                return r;
            }
        }
        panic!("docker-registry did not start on 5 ports");
    }

    /// Polls `/v2/` until the registry answers (true), or it exits (false).
    fn wait_up(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(30);
        let url = format!("http://{}/v2/", self.addr);
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().unwrap() {
                eprintln!(
                    "docker-registry exited ({status}): {}",
                    std::fs::read_to_string(self.dir.path().join("log")).unwrap_or_default()
                );
                return false;
            }
            // Any answer: it listens (a TLS registry answers plain HTTP
            // with 400).
            if self.agent.get(&url).call().is_ok() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!(
            "docker-registry on {} did not answer within 30 s",
            self.addr
        );
    }

    /// The file of a blob in the registry's storage.
    pub fn blob_file(&self, digest: &Digest) -> PathBuf {
        let hex = digest.hex();
        self.dir
            .path()
            .join("storage/docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }

    /// The file linking repository `name` to a blob it holds (the
    /// filesystem storage's layout).
    pub fn link_file(&self, name: &str, digest: &Digest) -> PathBuf {
        self.dir
            .path()
            .join("storage/docker/registry/v2/repositories")
            .join(name)
            .join("_layers/sha256")
            .join(digest.hex())
            .join("link")
    }

    /// What the registry logged so far (warnings and errors, one answer
    /// refused per line).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("log")).unwrap_or_default()
    }

    /// Uploads a blob into `name` (monolithic upload: POST, then PUT with
    /// the digest).
    pub fn push_blob(&self, name: &str, bytes: &[u8]) -> Digest {
        let digest = Digest::of(bytes);
        let r = self
            .agent
            .post(&format!("http://{}/v2/{name}/blobs/uploads/", self.addr))
            .send_empty()
            .unwrap();
        assert_eq!(r.status(), 202, "starting an upload");
        let location = r.headers()["location"].to_str().unwrap().to_string();
        let location = if location.starts_with('/') {
            format!("http://{}{location}", self.addr)
        } else {
            location
        };
        let sep = if location.contains('?') { '&' } else { '?' };
        let r = self
            .agent
            .put(&format!("{location}{sep}digest={digest}"))
            .header("content-type", "application/octet-stream")
            .send(bytes)
            .unwrap();
        assert_eq!(r.status(), 201, "finishing the upload of {digest}");
        digest
    }

    /// Puts a manifest under `reference` (a tag or a digest); its digest.
    pub fn push_manifest(
        &self,
        name: &str,
        reference: &str,
        media_type: &str,
        bytes: &[u8],
    ) -> Digest {
        let r = self
            .agent
            .put(&format!(
                "http://{}/v2/{name}/manifests/{reference}",
                self.addr
            ))
            .header("content-type", media_type)
            .send(bytes)
            .unwrap();
        let status = r.status();
        let body = r.into_body().read_to_string().unwrap_or_default();
        assert_eq!(status, 201, "pushing manifest {name}:{reference}: {body}");
        Digest::of(bytes)
    }

    /// The bytes of the OCI manifest `name:reference`, as the registry
    /// stores them.
    pub fn get_manifest(&self, name: &str, reference: &str) -> Vec<u8> {
        let r = self
            .agent
            .get(&format!(
                "http://{}/v2/{name}/manifests/{reference}",
                self.addr
            ))
            .header("accept", OCI_MANIFEST)
            .call()
            .unwrap();
        assert_eq!(r.status(), 200, "getting manifest {name}:{reference}");
        r.into_body().read_to_vec().unwrap()
    }

    /// Pushes an image of `layers` (and a small config) under `name:tag`.
    pub fn push_image(&self, name: &str, tag: &str, layers: &[&[u8]]) -> Image {
        let config =
            br#"{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]}}"#;
        let config_digest = self.push_blob(name, config);
        let mut descriptors = Vec::new();
        for l in layers {
            let d = self.push_blob(name, l);
            descriptors.push(format!(
                r#"{{"mediaType":"{OCI_LAYER}","digest":"{d}","size":{}}}"#,
                l.len()
            ));
        }
        let manifest = format!(
            r#"{{"schemaVersion":2,"mediaType":"{OCI_MANIFEST}","config":{{"mediaType":"{OCI_CONFIG}","digest":"{config_digest}","size":{}}},"layers":[{}]}}"#,
            config.len(),
            descriptors.join(",")
        );
        let digest = self.push_manifest(name, tag, OCI_MANIFEST, manifest.as_bytes());
        Image {
            manifest: manifest.into_bytes(),
            digest,
            config: config.to_vec(),
            config_digest,
            layers: layers.iter().map(|l| (Digest::of(l), l.to_vec())).collect(),
        }
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What [`Registry::push_image`] pushed.
pub struct Image {
    pub manifest: Vec<u8>,
    pub digest: Digest,
    pub config: Vec<u8>,
    pub config_digest: Digest,
    pub layers: Vec<(Digest, Vec<u8>)>,
}

/// `n` pseudo-random bytes (xorshift), different for each `seed`.
pub fn noise(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// A TCP proxy on 127.0.0.1 to `upstream`: what the client sends goes
/// through as it is; what upstream answers goes to `down(server, client)`,
/// run in a thread per connection, and both ends are closed when it
/// returns. Counts the connections it accepted. Returns its address.
fn proxy(
    upstream: &str,
    connections: Arc<AtomicU64>,
    down: impl Fn(TcpStream, &mut TcpStream) + Clone + Send + 'static,
) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let up = upstream.to_string();
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(mut client) = client else { return };
            connections.fetch_add(1, Ordering::SeqCst);
            let Ok(server) = TcpStream::connect(&up) else {
                return;
            };
            let (mut c_read, mut s_write) =
                (client.try_clone().unwrap(), server.try_clone().unwrap());
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut c_read, &mut s_write);
            });
            let down = down.clone();
            std::thread::spawn(move || {
                let closer = server.try_clone().unwrap();
                down(server, &mut client);
                let _ = client.shutdown(std::net::Shutdown::Both);
                let _ = closer.shutdown(std::net::Shutdown::Both);
            });
        }
    });
    addr
}

/// A TCP proxy on 127.0.0.1 to `upstream` that passes at most `budget`
/// bytes from upstream to the client on each connection, then closes both
/// ends: a connection cut in the middle of an answer. Counts the bytes it
/// passed on and the connections it accepted.
pub struct CuttingProxy {
    pub addr: String,
    pub passed: Arc<AtomicU64>,
    pub connections: Arc<AtomicU64>,
}

impl CuttingProxy {
    pub fn start(upstream: &str, budget: u64) -> CuttingProxy {
        let passed = Arc::new(AtomicU64::new(0));
        let connections = Arc::new(AtomicU64::new(0));
        let p = passed.clone();
        let addr = proxy(upstream, connections.clone(), move |mut server, client| {
            let mut left = budget;
            let mut buf = [0u8; 16 << 10];
            while left > 0 {
                let want = buf.len().min(left as usize);
                let n = match server.read(&mut buf[..want]) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                if client.write_all(&buf[..n]).is_err() {
                    break;
                }
                p.fetch_add(n as u64, Ordering::SeqCst);
                left -= n as u64;
            }
        });
        CuttingProxy {
            addr,
            passed,
            connections,
        }
    }
}

/// A TCP proxy on 127.0.0.1 to `upstream` that passes what upstream
/// answers one byte every `interval` (what it is sent goes through at
/// once): a registry that drips, never stalling long enough to trip a
/// client's read timeout. Counts the connections it accepted.
pub struct DrippingProxy {
    pub addr: String,
    pub connections: Arc<AtomicU64>,
}

impl DrippingProxy {
    pub fn start(upstream: &str, interval: Duration) -> DrippingProxy {
        let connections = Arc::new(AtomicU64::new(0));
        let addr = proxy(upstream, connections.clone(), move |mut server, client| {
            let mut b = [0u8; 1];
            // The drip is the point: one byte per interval, until either
            // side goes.
            while let Ok(1) = server.read(&mut b) {
                if client.write_all(&b).is_err() {
                    break;
                }
                std::thread::sleep(interval);
            }
        });
        DrippingProxy { addr, connections }
    }
}

/// Reads a request's head (up to its blank line, 64 KiB at most) from
/// `conn`: false when the connection ends first.
pub fn read_request_head(conn: &mut TcpStream) -> bool {
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && head.len() < 65536 {
        match conn.read(&mut b) {
            Ok(1) => head.push(b[0]),
            _ => return false,
        }
    }
    true
}

/// A hostile HTTP server on 127.0.0.1: answers every request with status
/// 200, the given headers, no Content-Length, and then bytes without end
/// (until the client goes away). Counts what it sent.
pub fn endless_server(content_type: &'static str) -> (String, Arc<AtomicU64>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let sent = Arc::new(AtomicU64::new(0));
    let s = sent.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            let s = s.clone();
            std::thread::spawn(move || {
                if !read_request_head(&mut conn) {
                    return;
                }
                let answer = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\nConnection: close\r\n\r\n"
                );
                if conn.write_all(answer.as_bytes()).is_err() {
                    return;
                }
                let chunk = [b' '; 8192];
                while conn.write_all(&chunk).is_ok() {
                    s.fetch_add(chunk.len() as u64, Ordering::SeqCst);
                }
            });
        }
    });
    (addr, sent)
}

/// A server on 127.0.0.1 that reads each request, sends `head` (status line
/// and headers, or nothing) and then `body_prefix`, and then sends nothing
/// more while holding the connection open for a minute: a registry that
/// stalls.
pub fn stalling_server(head: &'static str, body_prefix: Vec<u8>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            let prefix = body_prefix.clone();
            std::thread::spawn(move || {
                if !read_request_head(&mut conn) {
                    return;
                }
                let _ = conn.write_all(head.as_bytes());
                let _ = conn.write_all(&prefix);
                std::thread::sleep(Duration::from_secs(60));
            });
        }
    });
    addr
}

/// `skopeo copy --preserve-digests SOURCE docker://REGISTRY/NAME` (plain
/// HTTP), as the README pushes an installer image.
pub fn skopeo_copy(source: &str, registry: &str, name: &str) {
    let out = Command::new(tool("skopeo"))
        .args([
            "copy",
            "--quiet",
            "--preserve-digests",
            "--dest-tls-verify=false",
        ])
        .arg(source)
        .arg(format!("docker://{registry}/{name}"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "skopeo copy {source}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A blob read to its end through the client (so verified), or the
/// registry error that ended the read.
pub fn read_blob(
    client: &registry::Client,
    r: &registry::Reference,
    d: &registry::Descriptor,
) -> Result<Vec<u8>, registry::Error> {
    let mut reader = client.blob(r, d)?;
    let mut out = Vec::new();
    match reader.read_to_end(&mut out) {
        Ok(_) => Ok(out),
        Err(e) => Err(registry::Error::of_io(&e)
            .cloned()
            .unwrap_or_else(|| panic!("a blob read failed without a registry error: {e}"))),
    }
}
