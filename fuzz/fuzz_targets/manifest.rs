//! Manifest decoding and its artifact checks: never a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = imager::sign::Manifest::parse(data) {
        for a in &m.artifacts {
            let _ = imager::sign::check_path(&a.path);
            let _ = imager::sign::check_digest(&a.sha256);
        }
    }
});
