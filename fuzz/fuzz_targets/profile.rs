//! Profile parsing: any text is a profile or an error, never a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = imager::profile::Profile::parse(text, std::path::Path::new("/fuzz/p.yaml"));
    }
});
