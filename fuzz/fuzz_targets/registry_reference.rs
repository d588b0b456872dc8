//! The registry client's image references (`registry::Reference::parse`):
//! any text gives a reference or an error, never a panic; a reference
//! prints back as the text it was parsed from, and that parses to the same
//! reference. Seeds: `fuzz/seeds/registry_reference/`.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match registry::Reference::parse(text) {
        Ok(r) => {
            assert_eq!(r.to_string(), text);
            assert!(text.len() <= registry::MAX_REFERENCE);
            assert_eq!(registry::Reference::parse(&r.to_string()).ok(), Some(r));
        }
        Err(e) => assert!(e.to_string().len() < 1024, "a long message: {e}"),
    }
    if let Ok(d) = registry::Digest::parse(text) {
        assert_eq!(d.as_str(), text);
    }
});
