//! The node API's certificate reading (`nodeapi::tls`): PEM credential
//! files, and the role a client certificate names in its subject (read by
//! the server from the peer's certificate): any bytes give certificates, a
//! role or an error, never a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = nodeapi::tls::role_of(data);
    if let Ok(certs) = nodeapi::tls::certs(data, "fuzzed input") {
        for c in certs {
            let _ = nodeapi::tls::role_of(&c);
        }
    }
    let _ = nodeapi::tls::private_key(data, "fuzzed input");
});
