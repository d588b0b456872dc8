//! META (ADV) decoding: any bytes give a result or an error, never a panic;
//! whatever decodes re-encodes and decodes to the same contents.
#![no_main]
use contract::meta::{AREA_LEN, BLOCK_LEN, Meta};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // Small inputs are spread over a block so the checksum path is reached
    // only through valid-looking blocks; whole areas are tried as given.
    let mut area = vec![0u8; AREA_LEN];
    let n = data.len().min(AREA_LEN);
    area[..n].copy_from_slice(&data[..n]);
    let _ = Meta::decode_block(&area[..BLOCK_LEN]);
    if let Ok((m, _)) = Meta::decode(&area) {
        let again = m.encode().expect("decoded META re-encodes");
        assert_eq!(Meta::decode(&again).expect("re-decodes").0, m);
    }
});
