//! Pushes to a real registry (Debian's `docker-registry`, started by each
//! test on 127.0.0.1) when the registry briefly misses a blob it holds:
//! its filesystem storage rewrites a blob's link in place whenever a client
//! uploads that blob, so a manifest checked at that moment by another
//! client is refused with `MANIFEST_BLOB_UNKNOWN` (two builds pushing the
//! same cache entries at once meet it). The tests leave the link as that
//! rewrite does for a moment, empty, and look at what the client does.

// Tests panic on unexpected failures: that is how a test fails.
#![allow(clippy::unwrap_used)]

mod common;

use common::{OCI_CONFIG, OCI_LAYER, OCI_MANIFEST, Registry, noise};
use registry::{Client, Descriptor, Digest, ErrorKind, Options, PUSH_ATTEMPTS, Pushed, Reference};
use std::time::{Duration, Instant};

/// The manifest PUTs the registry refused for a missing blob so far (its
/// log has a line per error code of each refused answer).
fn refused_manifest_puts(reg: &Registry) -> usize {
    refused(
        reg,
        "PUT",
        "/manifests/",
        "err.code=\"manifest blob unknown\"",
    )
}

/// The blob checks (HEAD) the registry answered with a server error.
fn failed_blob_checks(reg: &Registry) -> usize {
    refused(reg, "HEAD", "/blobs/", "http.response.status=500")
}

fn refused(reg: &Registry, method: &str, path: &str, what: &str) -> usize {
    reg.log()
        .lines()
        .filter(|l| {
            l.contains(what)
                && l.contains(&format!("http.request.method={method} "))
                && l.contains(path)
        })
        .count()
}

/// Waits until `done` while `task` runs, then `then`; what the task
/// returns.
fn once_seen<T>(
    task: std::thread::JoinHandle<T>,
    done: impl Fn() -> bool,
    then: impl FnOnce(),
) -> T {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(
            !task.is_finished() && Instant::now() < deadline,
            "the registry refused nothing"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    then();
    task.join().unwrap()
}

/// A repository holding one layer and a config, pushed by the client; the
/// manifest naming them; the layer's link, emptied as a concurrent upload
/// of the same blob leaves it for a moment; the link's bytes.
struct Staged {
    client: Client,
    reference: Reference,
    manifest: Vec<u8>,
    link: std::path::PathBuf,
    saved: Vec<u8>,
}

fn json_of(d: &Descriptor) -> serde_json::Value {
    serde_json::json!({"mediaType": d.media_type, "digest": d.digest.as_str(), "size": d.size})
}

fn staged(reg: &Registry) -> Staged {
    let client = Client::new(Options {
        plain_http: vec![reg.addr.clone()],
        ..Options::default()
    })
    .unwrap();
    let reference = Reference::parse(&format!("{}/cache/race:entry", reg.addr)).unwrap();
    let layer = noise(4096, 9);
    let config = br#"{"architecture":"amd64","os":"linux"}"#.to_vec();
    let mut descriptors = Vec::new();
    for (media_type, bytes) in [(OCI_CONFIG, &config), (OCI_LAYER, &layer)] {
        let d = Descriptor {
            media_type: media_type.into(),
            digest: Digest::of(bytes),
            size: bytes.len() as u64,
        };
        client.push_blob(&reference, &d, &bytes[..]).unwrap();
        descriptors.push(d);
    }
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": json_of(&descriptors[0]),
        "layers": [json_of(&descriptors[1])],
    }))
    .unwrap();
    let link = reg.link_file("cache/race", &descriptors[1].digest);
    let saved = std::fs::read(&link).unwrap();
    std::fs::write(&link, b"").unwrap();
    Staged {
        client,
        reference,
        manifest,
        link,
        saved,
    }
}

#[test]
fn a_manifest_refused_while_a_blobs_link_is_rewritten_is_put_again() {
    let reg = Registry::start();
    let s = staged(&reg);
    let (client, reference, manifest) = (s.client, s.reference.clone(), s.manifest.clone());
    let pushing =
        std::thread::spawn(move || client.push_manifest(&reference, OCI_MANIFEST, &manifest));
    // The first PUT is refused (the link is empty); the link is then
    // whole again, as it is once the other upload's rewrite ends.
    let pushed = once_seen(
        pushing,
        || refused_manifest_puts(&reg) > 0,
        || std::fs::write(&s.link, &s.saved).unwrap(),
    );
    let digest = pushed.unwrap();
    assert_eq!(digest, Digest::of(&s.manifest));
    assert_eq!(reg.get_manifest("cache/race", "entry"), s.manifest);
    let refused = refused_manifest_puts(&reg);
    assert!(
        (1..PUSH_ATTEMPTS as usize).contains(&refused),
        "{refused} refused PUTs"
    );
}

#[test]
fn a_manifest_whose_blob_stays_missing_fails_after_the_bounded_attempts_with_the_registrys_code() {
    let reg = Registry::start();
    let s = staged(&reg);
    let e = s
        .client
        .push_manifest(&s.reference, OCI_MANIFEST, &s.manifest)
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Http);
    assert!(
        e.registry_codes()
            .iter()
            .any(|c| c == "MANIFEST_BLOB_UNKNOWN"),
        "{e}"
    );
    let said = e.to_string();
    assert!(
        said.contains("answered HTTP 400")
            && said.contains("MANIFEST_BLOB_UNKNOWN")
            && said.contains(&format!("asked {PUSH_ATTEMPTS} times")),
        "{said}"
    );
    assert_eq!(refused_manifest_puts(&reg), PUSH_ATTEMPTS as usize);
}

#[test]
fn a_blob_check_answered_500_while_its_link_is_rewritten_is_asked_again() {
    let reg = Registry::start();
    let s = staged(&reg);
    let layer = noise(4096, 9);
    let descriptor = Descriptor {
        media_type: OCI_LAYER.into(),
        digest: Digest::of(&layer),
        size: layer.len() as u64,
    };
    let (client, reference) = (s.client, s.reference.clone());
    let checking =
        std::thread::spawn(move || client.push_blob(&reference, &descriptor, &layer[..]));
    let pushed = once_seen(
        checking,
        || failed_blob_checks(&reg) > 0,
        || std::fs::write(&s.link, &s.saved).unwrap(),
    );
    assert_eq!(pushed.unwrap(), Pushed::Present);
    let failed = failed_blob_checks(&reg);
    assert!((1..PUSH_ATTEMPTS as usize).contains(&failed), "{failed}");
}

/// A server on 127.0.0.1 answering every request with `head` (status line
/// and headers, the blank line included) and `body`, one byte per `drip`
/// when given.
fn answering_server(head: String, body: Vec<u8>, drip: Option<Duration>) -> String {
    use std::io::Write;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            let (head, body) = (head.clone(), body.clone());
            std::thread::spawn(move || {
                if !common::read_request_head(&mut conn) {
                    return;
                }
                let _ = conn.write_all(head.as_bytes());
                match drip {
                    None => {
                        let _ = conn.write_all(&body);
                    }
                    Some(every) => {
                        for byte in body {
                            if conn.write_all(&[byte]).is_err() {
                                return;
                            }
                            std::thread::sleep(every);
                        }
                    }
                }
            });
        }
    });
    addr
}

/// The codes of a failed answer's body are read only within the bounds
/// docs/registry.md gives: a body that says its length, of at most 16 KiB,
/// read for at most 2 s (plus one read's stall limit).
#[test]
fn an_error_body_is_read_for_its_codes_only_within_its_bounds() {
    let codes = br#"{"errors":[{"code":"MANIFEST_UNKNOWN","message":"unknown"}]}"#.to_vec();
    let sized = |body: &[u8]| {
        format!(
            "HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        )
    };
    let mut long = codes.clone();
    long.resize(registry::MAX_ERROR_BODY as usize + 1, b' ');
    let unsized_head = "HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nConnection: \
                        close\r\n\r\n"
        .to_string();
    let cases = [
        ("sized", sized(&codes), codes.clone(), None, true),
        ("unsized", unsized_head, codes.clone(), None, false),
        ("over the bound", sized(&long), long.clone(), None, false),
        (
            "dripping",
            sized(&codes),
            codes.clone(),
            Some(Duration::from_millis(100)),
            false,
        ),
    ];
    for (what, head, body, drip, read) in cases {
        let addr = answering_server(head, body, drip);
        let client = Client::new(Options {
            plain_http: vec![addr.clone()],
            read_timeout: Duration::from_secs(1),
            ..Options::default()
        })
        .unwrap();
        let reference = Reference::parse(&format!("{addr}/metal/installer:0.1.0")).unwrap();
        let started = Instant::now();
        let e = client.manifest(&reference).unwrap_err();
        let took = started.elapsed();
        assert_eq!(e.status(), Some(400), "{what}: {e}");
        assert_eq!(
            e.registry_codes().is_empty(),
            !read,
            "{what}: {:?}",
            e.registry_codes()
        );
        assert!(
            took < registry::MAX_ERROR_BODY_TIME + Duration::from_secs(3),
            "{what}: took {took:?}"
        );
    }
}
