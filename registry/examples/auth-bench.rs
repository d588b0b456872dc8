//! The cost of registry authentication, for `scripts/bench`: one image of
//! a 64 MiB layer pulled (manifest and blobs, each verified) from Debian's
//! `docker-registry` on 127.0.0.1, three ways: plain HTTP without
//! authentication, TLS with an anonymous token (a public repository), TLS
//! with a token for credentials (a private one). The registries and the
//! token service are the tests' own (`tests/common/auth.rs`). Prints one
//! line per way: `NAME SECONDS` (the best of 3 pulls, each with a new
//! client: a token asked each time).
//!
//! `cargo run --release -p registry --example auth-bench`

#![allow(clippy::unwrap_used)]

#[path = "../tests/common/mod.rs"]
mod common;

use common::auth::{NamedRegistry, PASSWORD, USER};
use registry::{Client, Credentials, Options, Reference};
use std::io::Read;
use std::time::Instant;

fn pull(client: &Client, r: &Reference) -> f64 {
    let t = Instant::now();
    let m = client.manifest(r).unwrap();
    for d in std::iter::once(&m.config).chain(&m.layers) {
        let mut blob = client.blob(r, d).unwrap();
        std::io::copy(&mut blob, &mut std::io::sink()).unwrap();
        let mut rest = Vec::new();
        blob.read_to_end(&mut rest).unwrap();
    }
    t.elapsed().as_secs_f64()
}

fn best(f: impl Fn() -> f64) -> f64 {
    (0..3).map(|_| f()).fold(f64::INFINITY, f64::min)
}

fn main() {
    let layer = common::noise(64 << 20, 7);
    // Plain HTTP, no authentication.
    let plain = common::Registry::start();
    plain.push_image("bench/image", "1", &[&layer]);
    let r = Reference::parse(&format!("{}/bench/image:1", plain.addr)).unwrap();
    let anonymous_plain = best(|| {
        let c = Client::new(Options {
            plain_http: vec![plain.addr.clone()],
            ..Options::default()
        })
        .unwrap();
        pull(&c, &r)
    });
    // TLS with token authentication, by name.
    let named = NamedRegistry::start();
    let writer = named.client();
    let push = |name: &str| {
        let r = Reference::parse(&format!("{}/{name}:1", named.name)).unwrap();
        common::auth::push_image_via(&writer, &r, &[&layer]);
        r
    };
    let public = push("public/image");
    let private = push("private/image");
    let client = |credentials: Credentials| named.client_with(credentials);
    let anonymous_token = best(|| pull(&client(Credentials::Anonymous), &public));
    let credentials_token = best(|| {
        pull(
            &client(Credentials::basic(USER, PASSWORD).unwrap()),
            &private,
        )
    });
    println!("anonymous-plain-http {anonymous_plain:.3}");
    println!("anonymous-token-tls {anonymous_token:.3}");
    println!("credentials-token-tls {credentials_token:.3}");
}
