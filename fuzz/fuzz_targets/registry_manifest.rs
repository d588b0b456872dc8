//! The registry client's manifest parsing (`registry::manifest::parse`):
//! any bytes a registry sends, with any of the content types it may claim,
//! give an image manifest, an index or an error, never a panic; a parsed
//! image's digest is that of the bytes, and picking a platform from an
//! index never panics either. A first byte past the content types reads
//! the bytes as a failed answer's body instead (`registry_codes`): its
//! codes keep their bounds and are safe to print. Seeds:
//! `fuzz/seeds/registry_manifest/`.
#![no_main]
use libfuzzer_sys::fuzz_target;
use registry::manifest::{self, Document};

const TYPES: [Option<&str>; 6] = [
    None,
    Some(manifest::OCI_MANIFEST),
    Some(manifest::OCI_INDEX),
    Some(manifest::DOCKER_MANIFEST),
    Some(manifest::DOCKER_LIST),
    Some("application/json; charset=utf-8"),
];

fuzz_target!(|data: &[u8]| {
    let Some((&first, bytes)) = data.split_first() else {
        return;
    };
    let which = usize::from(first) % (TYPES.len() + 1);
    let Some(&content_type) = TYPES.get(which) else {
        let codes = registry::registry_codes(bytes);
        assert!(codes.len() <= registry::MAX_CODES);
        for c in &codes {
            assert!(!c.is_empty() && c.len() <= registry::MAX_CODE);
            assert!(
                c.bytes()
                    .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
            );
        }
        return;
    };
    match manifest::parse(bytes, content_type, "the fuzzed manifest") {
        Ok(Document::Image(m)) => {
            assert_eq!(m.digest, registry::Digest::of(bytes));
            assert!(m.layers.len() <= manifest::MAX_DESCRIPTORS);
        }
        Ok(Document::Index(entries)) => {
            assert!(entries.len() <= manifest::MAX_DESCRIPTORS);
            let _ = manifest::pick(&entries, "linux", "amd64");
        }
        Err(e) => assert!(e.to_string().len() < 1024, "a long message: {e}"),
    }
});
