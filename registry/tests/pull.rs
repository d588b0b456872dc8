//! Pulls from a real registry (Debian's `docker-registry`, started by each
//! test on 127.0.0.1): manifests by tag, digest and index; layers streamed
//! and checked; and every refusal the client promises: a missing tag, a
//! wrong digest, an unreachable registry, plain HTTP not allowed, bounds,
//! a tampered blob, a connection cut in the middle.

// Tests panic on unexpected failures: that is how a test fails.
#![allow(clippy::unwrap_used)]

mod common;

use common::{CuttingProxy, OCI_INDEX, OCI_MANIFEST, Registry, endless_server, noise};
use registry::{Client, Descriptor, Digest, ErrorKind, Options, Reference};
use std::io::Read;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

fn client_for(addrs: &[&str]) -> Client {
    Client::new(Options {
        plain_http: addrs.iter().map(|a| a.to_string()).collect(),
        ..Options::default()
    })
    .unwrap()
}

/// What `f` returns, which it must return within 10 s: a bound of a few
/// seconds ends the call, however the server behaves.
fn within_10s<T>(f: impl FnOnce() -> T) -> T {
    let started = Instant::now();
    let r = f();
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "took {:?}",
        started.elapsed()
    );
    r
}

fn reference(s: &str) -> Reference {
    Reference::parse(s).unwrap()
}

#[test]
fn pulls_by_tag_and_by_digest_and_streams_layers() {
    let reg = Registry::start();
    let layers = [noise(3 << 20, 1), noise(1000, 2), Vec::new()];
    let refs: Vec<&[u8]> = layers.iter().map(|l| l.as_slice()).collect();
    let image = reg.push_image("metal/installer", "0.2.0", &refs);
    let client = client_for(&[&reg.addr]);

    let by_tag = reference(&format!("{}/metal/installer:0.2.0", reg.addr));
    let m = client.manifest(&by_tag).unwrap();
    assert_eq!(m.media_type, OCI_MANIFEST);
    assert_eq!(m.digest, image.digest);
    assert_eq!(m.config.digest, image.config_digest);
    let got: Vec<(Digest, u64)> = m
        .layers
        .iter()
        .map(|d| (d.digest.clone(), d.size))
        .collect();
    let want: Vec<(Digest, u64)> = image
        .layers
        .iter()
        .map(|(d, b)| (d.clone(), b.len() as u64))
        .collect();
    assert_eq!(got, want);

    for (d, (_, bytes)) in m.layers.iter().zip(&image.layers) {
        assert!(
            common::read_blob(&client, &by_tag, d).unwrap() == *bytes,
            "layer {} bytes",
            d.digest
        );
    }
    assert_eq!(
        common::read_blob(&client, &by_tag, &m.config).unwrap(),
        image.config
    );

    // By digest, and by tag and digest: the same manifest.
    for r in [
        format!("{}/metal/installer@{}", reg.addr, image.digest),
        format!("{}/metal/installer:0.2.0@{}", reg.addr, image.digest),
    ] {
        let by_digest = client.manifest(&reference(&r)).unwrap();
        assert_eq!(by_digest, m, "{r}");
    }
}

#[test]
fn an_index_resolves_to_linux_amd64() {
    let reg = Registry::start();
    let arm = reg.push_image("multi", "arm", &[b"arm64 layer"]);
    let amd = reg.push_image("multi", "amd", &[b"amd64 layer"]);
    let entry = |d: &Digest, size: usize, arch: &str| {
        format!(
            r#"{{"mediaType":"{OCI_MANIFEST}","digest":"{d}","size":{size},"platform":{{"architecture":"{arch}","os":"linux"}}}}"#
        )
    };
    let index = format!(
        r#"{{"schemaVersion":2,"mediaType":"{OCI_INDEX}","manifests":[{},{}]}}"#,
        entry(&arm.digest, arm.manifest.len(), "arm64"),
        entry(&amd.digest, amd.manifest.len(), "amd64")
    );
    let index_digest = reg.push_manifest("multi", "1.0", OCI_INDEX, index.as_bytes());
    let client = client_for(&[&reg.addr]);
    for r in [
        format!("{}/multi:1.0", reg.addr),
        format!("{}/multi@{index_digest}", reg.addr),
    ] {
        let m = client.manifest(&reference(&r)).unwrap();
        assert_eq!(m.digest, amd.digest, "{r}");
        assert_eq!(m.layers[0].digest, amd.layers[0].0);
    }
    let s390x = Client::new(Options {
        plain_http: vec![reg.addr.clone()],
        platform: ("linux".into(), "s390x".into()),
        ..Options::default()
    })
    .unwrap();
    let e = s390x
        .manifest(&reference(&format!("{}/multi:1.0", reg.addr)))
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound);
    assert!(e.to_string().contains("none for linux/s390x"), "{e}");
}

#[test]
fn a_missing_tag_or_digest_says_so() {
    let reg = Registry::start();
    reg.push_image("metal/installer", "0.1.0", &[b"x"]);
    let client = client_for(&[&reg.addr]);
    let r = format!("{}/metal/installer:0.9.9", reg.addr);
    let e = client.manifest(&reference(&r)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound);
    assert_eq!(
        e.to_string(),
        format!("no image {r} in {}: check the tag (HTTP 404)", reg.addr)
    );
    // An unknown repository too.
    let e = client
        .manifest(&reference(&format!("{}/nothing/here:1", reg.addr)))
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    // A digest the registry does not have (a wrong digest in the reference).
    let wrong = Digest::of(b"not a manifest");
    let r = format!("{}/metal/installer:0.1.0@{wrong}", reg.addr);
    let e = client.manifest(&reference(&r)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound);
    assert!(e.to_string().contains("check the digest"), "{e}");
}

#[test]
fn a_manifest_that_does_not_hash_to_the_reference_digest_is_refused() {
    let reg = Registry::start();
    let image = reg.push_image("metal/installer", "0.1.0", &[b"layer"]);
    // The registry's stored manifest changed behind its back: it serves
    // other bytes under the digest.
    let file = reg.blob_file(&image.digest);
    let stored = std::fs::read(&file).unwrap();
    assert_eq!(stored, image.manifest);
    let tampered = String::from_utf8(stored)
        .unwrap()
        .replace(r#""size":5"#, r#""size":6"#);
    std::fs::write(&file, tampered).unwrap();
    let client = client_for(&[&reg.addr]);
    let r = reference(&format!("{}/metal/installer@{}", reg.addr, image.digest));
    let e = client.manifest(&r).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::DigestMismatch, "{e}");
    assert!(
        e.to_string()
            .contains("not to the digest the reference names"),
        "{e}"
    );
}

#[test]
fn an_unreachable_registry_is_named_quickly() {
    let port = common::free_port();
    let addr = format!("127.0.0.1:{port}");
    let client = client_for(&[&addr]);
    let started = Instant::now();
    let e = client
        .manifest(&reference(&format!("{addr}/metal/installer:0.1.0")))
        .unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
    assert_eq!(e.kind(), ErrorKind::Unreachable);
    let msg = e.to_string();
    assert!(
        msg.starts_with(&format!("cannot reach registry {addr} (")) && msg.contains("refused"),
        "{msg}"
    );
}

#[test]
fn plain_http_is_used_only_where_allowed() {
    let reg = Registry::start();
    reg.push_image("metal/installer", "0.1.0", &[b"layer"]);
    let r = reference(&format!("{}/metal/installer:0.1.0", reg.addr));
    // Not allowed: HTTPS is tried, fails, and nothing falls back to HTTP.
    for allowed in [
        vec![],
        vec!["127.0.0.1".to_string()],
        vec![format!("{}x", reg.addr)],
    ] {
        let client = Client::new(Options {
            plain_http: allowed,
            ..Options::default()
        })
        .unwrap();
        let e = client.manifest(&r).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Tls, "{e}");
        assert!(
            e.to_string()
                .contains(&format!("TLS with registry {} failed", reg.addr))
                && e.to_string().contains("plain HTTP"),
            "{e}"
        );
    }
    assert!(client_for(&[&reg.addr]).manifest(&r).is_ok());
}

#[test]
fn an_authenticating_registry_without_credentials_says_what_to_give() {
    // Any password: nothing authenticates, the registry only has to ask.
    let dir = tempfile::tempdir().unwrap();
    let htpasswd = dir.path().join("htpasswd");
    std::fs::write(
        &htpasswd,
        "user:$2y$05$aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\n",
    )
    .unwrap();
    let reg = Registry::start_with(&format!(
        "auth:\n  htpasswd:\n    realm: test\n    path: {}\n",
        htpasswd.display()
    ));
    let client = client_for(&[&reg.addr]);
    let e = client
        .manifest(&reference(&format!("{}/metal/installer:0.1.0", reg.addr)))
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unauthorized);
    assert!(
        e.to_string().contains(&format!(
            "{} requires a user name and password to pull metal/installer",
            reg.addr
        )) && e.to_string().contains("give credentials for"),
        "{e}"
    );
}

#[test]
fn bounds_refuse_before_reading() {
    let reg = Registry::start();
    let layer = noise(1 << 20, 3);
    let image = reg.push_image("metal/installer", "0.1.0", &[&layer]);
    // Through a counting proxy: what the client was sent.
    let proxy = CuttingProxy::start(&reg.addr, u64::MAX);
    let r = reference(&format!("{}/metal/installer:0.1.0", proxy.addr));

    let small_manifest = Client::new(Options {
        plain_http: vec![proxy.addr.clone()],
        max_manifest: image.manifest.len() as u64 - 1,
        ..Options::default()
    })
    .unwrap();
    let e = small_manifest.manifest(&r).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::TooLarge);
    assert!(
        e.to_string().contains(&format!(
            "is {} bytes (its Content-Length), over the bound of {} bytes: refused before reading it",
            image.manifest.len(),
            image.manifest.len() - 1
        )),
        "{e}"
    );

    let small_blob = Client::new(Options {
        plain_http: vec![proxy.addr.clone()],
        max_blob: layer.len() as u64 - 1,
        ..Options::default()
    })
    .unwrap();
    let m = small_blob.manifest(&r).unwrap();
    let before = proxy.passed.load(Ordering::SeqCst);
    let e = small_blob.blob(&r, &m.layers[0]).err().unwrap();
    assert_eq!(e.kind(), ErrorKind::TooLarge);
    assert!(e.to_string().contains("refused before reading it"), "{e}");
    assert_eq!(
        proxy.passed.load(Ordering::SeqCst),
        before,
        "nothing of the blob was sent"
    );
    // A descriptor that understates the size: refused on the registry's
    // Content-Length, before the body.
    let mut lying = m.layers[0].clone();
    lying.size -= 1;
    let e = client_for(&[&proxy.addr]).blob(&r, &lying).err().unwrap();
    assert_eq!(e.kind(), ErrorKind::Truncated);
    assert!(e.to_string().contains("refused before reading it"), "{e}");
}

#[test]
fn without_content_length_reads_stay_bounded() {
    // A hostile server: no Content-Length, bytes without end.
    let (addr, sent) = endless_server(OCI_MANIFEST);
    let client = Client::new(Options {
        plain_http: vec![addr.clone()],
        max_manifest: 64 << 10,
        ..Options::default()
    })
    .unwrap();
    let r = reference(&format!("{addr}/endless:1"));
    let e = client.manifest(&r).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::TooLarge, "{e}");
    assert!(
        e.to_string().contains("refused after reading 65537 bytes"),
        "{e}"
    );
    // A blob that runs past its size.
    let d = Descriptor {
        media_type: common::OCI_LAYER.into(),
        digest: Digest::of(&[b' '; 100_000]),
        size: 100_000,
    };
    let e = common::read_blob(&client, &r, &d).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Truncated);
    assert!(e.to_string().contains("runs past the 100000 bytes"), "{e}");
    // Each read stopped the server soon after the bound (socket buffers).
    assert!(sent.load(Ordering::SeqCst) < 64 << 20);
}

#[test]
fn a_tampered_blob_fails_at_the_end_of_the_stream() {
    let reg = Registry::start();
    let layer = noise(2 << 20, 4);
    let image = reg.push_image("metal/installer", "0.1.0", &[&layer]);
    let file = reg.blob_file(&image.layers[0].0);
    let mut bytes = std::fs::read(&file).unwrap();
    assert!(bytes == layer);
    bytes[1 << 20] ^= 0x01;
    std::fs::write(&file, &bytes).unwrap();

    let client = client_for(&[&reg.addr]);
    let r = reference(&format!("{}/metal/installer:0.1.0", reg.addr));
    let m = client.manifest(&r).unwrap();
    let mut reader = client.blob(&r, &m.layers[0]).unwrap();
    let mut sink = Vec::new();
    let e = reader.read_to_end(&mut sink).unwrap_err();
    let e = registry::Error::of_io(&e).unwrap();
    assert_eq!(e.kind(), ErrorKind::DigestMismatch);
    assert!(
        e.to_string().contains(&format!(
            "blob {} of {r} is corrupt or tampered with",
            image.layers[0].0
        )),
        "{e}"
    );
    // Everything but the completing read was passed on; never an end of file.
    assert!(sink.len() < layer.len());
    assert!(reader.read(&mut [0u8; 16]).is_err());
}

#[test]
fn a_connection_cut_mid_stream_is_an_error() {
    let reg = Registry::start();
    let layer = noise(4 << 20, 5);
    let image = reg.push_image("metal/installer", "0.1.0", &[&layer]);
    let proxy = CuttingProxy::start(&reg.addr, 1 << 20);
    let client = client_for(&[&proxy.addr]);
    let r = reference(&format!("{}/metal/installer:0.1.0", proxy.addr));
    let m = client.manifest(&r).unwrap();
    assert_eq!(m.digest, image.digest);
    let e = common::read_blob(&client, &r, &m.layers[0]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Truncated, "{e}");
    let passed = proxy.passed.load(Ordering::SeqCst);
    assert!(passed <= 1 << 20 && passed > 0, "{passed}");
}

#[test]
fn skopeo_pushes_what_the_client_pulls_with_the_same_digests() {
    // A hand-made OCI image layout, copied into the registry by skopeo with
    // its digests preserved (uncompressed layers stay uncompressed).
    let reg = Registry::start();
    let dir = tempfile::tempdir().unwrap();
    let layout = dir.path().join("layout");
    let blobs = layout.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).unwrap();
    let put = |bytes: &[u8]| {
        let d = Digest::of(bytes);
        std::fs::write(blobs.join(d.hex()), bytes).unwrap();
        d
    };
    // A real tar layer.
    let src = dir.path().join("src");
    std::fs::create_dir_all(src.join("usr/install")).unwrap();
    std::fs::write(src.join("usr/install/payload"), noise(200_000, 6)).unwrap();
    let tar = dir.path().join("layer.tar");
    let ok = std::process::Command::new(common::tool("tar"))
        .args(["--sort=name", "--mtime=@0", "--owner=0", "--group=0", "-cf"])
        .arg(&tar)
        .arg("-C")
        .arg(&src)
        .arg("usr")
        .status()
        .unwrap();
    assert!(ok.success());
    let layer = std::fs::read(&tar).unwrap();
    let layer_digest = put(&layer);
    let config = format!(
        r#"{{"architecture":"amd64","os":"linux","rootfs":{{"type":"layers","diff_ids":["{layer_digest}"]}}}}"#
    );
    let config_digest = put(config.as_bytes());
    let manifest = format!(
        r#"{{"schemaVersion":2,"mediaType":"{OCI_MANIFEST}","config":{{"mediaType":"{}","digest":"{config_digest}","size":{}}},"layers":[{{"mediaType":"{}","digest":"{layer_digest}","size":{}}}]}}"#,
        common::OCI_CONFIG,
        config.len(),
        common::OCI_LAYER,
        layer.len()
    );
    let manifest_digest = put(manifest.as_bytes());
    std::fs::write(
        layout.join("oci-layout"),
        r#"{"imageLayoutVersion":"1.0.0"}"#,
    )
    .unwrap();
    std::fs::write(
        layout.join("index.json"),
        format!(
            r#"{{"schemaVersion":2,"manifests":[{{"mediaType":"{OCI_MANIFEST}","digest":"{manifest_digest}","size":{},"annotations":{{"org.opencontainers.image.ref.name":"0.3.0"}}}}]}}"#,
            manifest.len()
        ),
    )
    .unwrap();
    common::skopeo_copy(
        &format!("oci:{}:0.3.0", layout.display()),
        &reg.addr,
        "metal/installer:0.3.0",
    );

    let client = client_for(&[&reg.addr]);
    let r = reference(&format!("{}/metal/installer:0.3.0", reg.addr));
    let m = client.manifest(&r).unwrap();
    assert_eq!(
        m.digest, manifest_digest,
        "the registry holds the layout's manifest"
    );
    assert_eq!(m.config.digest, config_digest);
    assert_eq!(m.layers.len(), 1);
    assert_eq!(m.layers[0].digest, layer_digest);
    assert!(common::read_blob(&client, &r, &m.layers[0]).unwrap() == layer);
}

#[test]
fn a_registry_that_stalls_times_out() {
    let quick = |addr: &str| {
        Client::new(Options {
            plain_http: vec![addr.to_string()],
            read_timeout: Duration::from_secs(1),
            ..Options::default()
        })
        .unwrap()
    };
    // Accepts the connection, never answers.
    let addr = common::stalling_server("", Vec::new());
    let e = within_10s(|| {
        quick(&addr)
            .manifest(&reference(&format!("{addr}/metal/installer:0.1.0")))
            .unwrap_err()
    });
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    assert!(
        e.to_string().starts_with(&format!(
            "registry {addr} sent nothing for longer than the stall limit"
        )),
        "{e}"
    );
    // Answers a blob, sends part of it, then nothing.
    let addr = common::stalling_server(
        "HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n",
        vec![0u8; 30_000],
    );
    let d = Descriptor {
        media_type: common::OCI_LAYER.into(),
        digest: Digest::of(&[0u8; 100_000]),
        size: 100_000,
    };
    let e = within_10s(|| {
        common::read_blob(&quick(&addr), &reference(&format!("{addr}/x:1")), &d).unwrap_err()
    });
    assert_eq!(e.kind(), ErrorKind::Truncated, "{e}");
    assert!(
        e.to_string()
            .contains("the stream failed after 30000 of 100000 bytes"),
        "{e}"
    );
}

/// A registry that drips its answer a byte every 50 ms never trips the
/// stall limit; the deadline ends the request.
#[test]
fn a_registry_that_drips_is_cut_at_the_deadline() {
    let reg = Registry::start();
    reg.push_image("metal/installer", "0.1.0", &[&noise(4096, 3)]);
    let drip = common::DrippingProxy::start(&reg.addr, Duration::from_millis(50));
    let client = Client::new(Options {
        plain_http: vec![drip.addr.clone()],
        read_timeout: Duration::from_secs(5),
        deadline: Some(Duration::from_secs(2)),
        ..Options::default()
    })
    .unwrap();
    let e = within_10s(|| {
        client
            .manifest(&reference(&format!("{}/metal/installer:0.1.0", drip.addr)))
            .unwrap_err()
    });
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    assert!(
        e.to_string().contains("took longer than the deadline"),
        "{e}"
    );
}
