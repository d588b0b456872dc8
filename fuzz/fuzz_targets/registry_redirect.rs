//! Where the registry client follows a redirect (`registry::Client::
//! redirect`), the registry's `Location` header being untrusted: any text
//! gives a URL or an error, never a panic; an error's message is bounded
//! (the header is quoted as an excerpt); a URL allowed is HTTPS, or plain
//! HTTP only to the registry the client may reach over plain HTTP; and,
//! read by `http::Uri` (what ureq sends the request with, not our own
//! reading of the header), it never leads to a loopback, unspecified or
//! link-local address or to the node's own. Seeds: `fuzz/seeds/registry_redirect/`.
#![no_main]
use libfuzzer_sys::fuzz_target;
use std::net::IpAddr;
use std::sync::OnceLock;

fn client() -> &'static (registry::Client, registry::Reference) {
    static C: OnceLock<(registry::Client, registry::Reference)> = OnceLock::new();
    C.get_or_init(|| {
        let options = registry::Options {
            plain_http: vec!["10.0.2.100:5000".into()],
            own_addresses: vec!["10.0.2.15".parse().expect("an address")],
            ..Default::default()
        };
        let client = registry::Client::new(options).expect("a client");
        let reference = registry::Reference::parse("10.0.2.100:5000/metal/installer:0.2.0")
            .expect("a reference");
        (client, reference)
    })
}

/// The address a URL leads to, as `http::Uri` (the parser ureq sends
/// requests with, not ours) reads its host, if it is an IP address.
fn address(url: &str) -> Option<IpAddr> {
    let uri: http::Uri = url.parse().ok()?;
    let host = uri.host()?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    let ip: IpAddr = host.trim_end_matches('.').parse().ok()?;
    Some(match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(location) = std::str::from_utf8(data) else {
        return;
    };
    let (client, reference) = client();
    let from = "http://10.0.2.100:5000/v2/metal/installer/manifests/0.2.0";
    match client.redirect(from, location, reference) {
        Ok(url) => {
            assert!(
                url.starts_with("https://") || url.starts_with("http://"),
                "{url}"
            );
            if let Some(ip) = address(&url) {
                let own = ip == IpAddr::from([10, 0, 2, 15]);
                let registry = ip == IpAddr::from([10, 0, 2, 100]);
                let special = match ip {
                    IpAddr::V4(v4) => v4.is_loopback() || v4.is_link_local() || v4.is_unspecified(),
                    IpAddr::V6(v6) => {
                        v6.is_loopback() || v6.is_unicast_link_local() || v6.is_unspecified()
                    }
                };
                assert!(registry || !(own || special), "{location:?} led to {url}");
            }
        }
        Err(e) => assert!(e.to_string().len() < 1024, "a long message: {e}"),
    }
});
