//! META (ADV) decoding: any bytes give a result or an error, never a panic;
//! whatever decodes re-encodes and decodes to the same contents.
#![no_main]
use contract::meta::{AREA_LEN, BLOCK_LEN, MAGIC1, MAGIC2, Meta};
use libfuzzer_sys::fuzz_target;
use sha2::{Digest, Sha256};

/// The block's trailer: SHA-256, then MAGIC2 (see contract::meta).
const TRAILER: usize = 36;

fn check(area: &[u8]) {
    let _ = Meta::decode_block(&area[..BLOCK_LEN]);
    if let Ok((m, _)) = Meta::decode(area) {
        let again = m.encode().expect("decoded META re-encodes");
        assert_eq!(Meta::decode(&again).expect("re-decodes").0, m);
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, data)) = data.split_first() else {
        return;
    };
    let mut area = vec![0u8; AREA_LEN];
    if mode & 1 == 0 {
        // As found on a disk: the bytes from the start of the area.
        let n = data.len().min(AREA_LEN);
        area[..n].copy_from_slice(&data[..n]);
    } else {
        // The bytes as the records of a block whose magics and checksum
        // are right, so that the record parser is reached (random bytes
        // never match a SHA-256); copy 0 or copy 1 (mode bit 1).
        let at = if mode & 2 == 0 { 0 } else { BLOCK_LEN };
        let block = &mut area[at..at + BLOCK_LEN];
        block[..4].copy_from_slice(&MAGIC1.to_be_bytes());
        let n = data.len().min(BLOCK_LEN - 4 - TRAILER);
        block[4..4 + n].copy_from_slice(&data[..n]);
        block[BLOCK_LEN - 4..].copy_from_slice(&MAGIC2.to_be_bytes());
        let sum = Sha256::digest(&block[..]);
        block[BLOCK_LEN - TRAILER..BLOCK_LEN - 4].copy_from_slice(&sum);
    }
    check(&area);
});
