//! The node API's messages (`nodeapi::proto`), as both ends read them from
//! the network: a request line (the server) and event lines (the client),
//! framed by `read_line`. Any bytes give messages or errors, never a
//! panic; a message that parses writes back as a line that parses to the
//! same message.
#![no_main]
use libfuzzer_sys::fuzz_target;
use nodeapi::proto;

fuzz_target!(|data: &[u8]| {
    let mut r = data;
    while let Ok(Some(line)) = proto::read_line(&mut r) {
        if let Ok(req) = proto::parse_request(&line) {
            let _ = req.op();
            let mut out = Vec::new();
            proto::write_line(&mut out, &req).expect("a parsed request encodes");
            let back = proto::read_line(&mut &out[..])
                .expect("one line")
                .expect("one line");
            assert_eq!(proto::parse_request(&back).expect("round trip"), req);
        }
        if let Ok(event) = proto::parse_event(&line) {
            let mut out = Vec::new();
            if proto::write_line(&mut out, &event).is_ok() {
                let back = proto::read_line(&mut &out[..])
                    .expect("one line")
                    .expect("one line");
                assert_eq!(proto::parse_event(&back).expect("round trip"), event);
            }
        }
    }
});
