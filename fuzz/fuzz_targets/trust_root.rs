//! A rotating root of trust's inputs (`payload::root`): roots (first byte
//! even) and signature lists (first byte odd), as a payload brings them.
//! Any bytes give a root or a list, or a short escaped refusal, never a
//! panic; a root parsed is within its bounds and reads back the same from
//! its own bytes. Seeds: `fuzz/seeds/trust_root/`.
#![no_main]
use libfuzzer_sys::fuzz_target;
use payload::root::{MAX_KEYS, MAX_SIGNATURES, Root, parse_signatures};

fuzz_target!(|data: &[u8]| {
    let Some((first, rest)) = data.split_first() else {
        return;
    };
    let check = |e: &str| {
        assert!(e.len() < 1024, "a long message: {e}");
        assert!(!e.chars().any(|c| c.is_control()), "unescaped: {e:?}");
    };
    if first % 2 == 0 {
        match Root::parse(rest) {
            Ok(r) => {
                assert!(r.version >= 1);
                assert!(!r.keys.is_empty() && r.keys.len() <= MAX_KEYS);
                assert!(r.threshold >= 1 && r.threshold <= r.keys.len());
                assert_eq!(Root::parse(&r.to_bytes()).as_ref(), Ok(&r));
                // Nothing signed: the threshold is never met.
                assert!(r.check(rest, &[], "x").is_err());
            }
            Err(e) => check(&e.0),
        }
    } else {
        match parse_signatures(rest) {
            Ok(list) => assert!(list.len() <= MAX_SIGNATURES),
            Err(e) => check(&e.0),
        }
    }
});
