//! The build record an output directory keeps (imager::build::record),
//! read back by the next build: any bytes are a record of this format or
//! nothing (every stage runs), never a panic; a record read back writes
//! and reads as itself.
#![no_main]
use imager::build::record::{parse, render};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some(r) = parse(data) {
        let again = render(&r).expect("a record renders");
        assert_eq!(parse(&again), Some(r));
    }
});
