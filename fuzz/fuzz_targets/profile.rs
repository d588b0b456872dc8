//! Profile parsing, through the same entry as `imager build --profile`
//! (`Profile::parse_bytes`: the bounds of `profile::scan`, YAML, every
//! check): any bytes are a profile or an error, never a panic, and every
//! input is parsed in bounded time and memory (`scripts/fuzz` runs it with
//! `-timeout=10 -rss_limit_mb=2048`; inputs take milliseconds).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(e) =
        imager::profile::Profile::parse_bytes(data, std::path::Path::new("/fuzz/p.yaml"))
    {
        // Messages quote at most an excerpt: never the whole of a long input.
        let msg = e.to_string();
        assert!(msg.len() < 2048, "message of {} bytes", msg.len());
    }
});
