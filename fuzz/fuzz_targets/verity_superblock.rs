//! The dm-verity superblock the runtime reads from the initramfs's hash
//! device before it trusts the root: any bytes give a superblock or an
//! error, never a panic; one accepted renders back to the same bytes.
#![no_main]
use contract::verity::{SUPERBLOCK_LEN, Superblock};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(sb) = Superblock::parse(data) {
        assert_eq!(&sb.render()[..], &data[..SUPERBLOCK_LEN]);
        assert!(data[SUPERBLOCK_LEN..].iter().all(|&b| b == 0));
    }
    let _ = contract::verity::parse_root_hash(&String::from_utf8_lossy(data));
});
