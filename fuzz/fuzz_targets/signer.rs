//! What a build reads to reach a key outside the machine: PKCS#11 URIs
//! (`imager::sign::pkcs11_uri::parse`, first byte even) and an external
//! signer's answers (`imager::sign::external::parse_answer`, first byte
//! odd). Any bytes give a parse or a short, escaped message, never a
//! panic; a URI parsed names a key, and its PIN never shows in its Debug.
//! Seeds: `fuzz/seeds/signer/`.
#![no_main]
use imager::sign::external::{Failure, parse_answer};
use imager::sign::pkcs11_uri::{MAX_URI, Pin, parse};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((first, rest)) = data.split_first() else {
        return;
    };
    if first % 2 == 0 {
        let Ok(text) = std::str::from_utf8(rest) else {
            return;
        };
        match parse(text) {
            Ok(u) => {
                assert!(text.len() <= MAX_URI);
                assert!(u.object.is_some() || u.id.is_some());
                if let Some(p @ Pin::Value(_)) = &u.pin {
                    assert_eq!(format!("{p:?}"), "Pin::Value(<redacted>)");
                }
            }
            Err(e) => {
                assert!(e.len() < 1024, "a long message: {e}");
                assert!(!e.chars().any(|c| c.is_control()), "unescaped: {e:?}");
            }
        }
    } else {
        match parse_answer(rest, "signature") {
            Ok(sig) => assert!(sig.len() <= rest.len()),
            Err(Failure::Said(e)) | Err(Failure::Malformed(e)) => {
                assert!(e.len() < 1024, "a long message: {e}");
                assert!(!e.chars().any(|c| c.is_control()), "unescaped: {e:?}");
            }
        }
    }
});
