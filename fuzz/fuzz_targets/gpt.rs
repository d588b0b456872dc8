//! GPT reading: a disk image of arbitrary bytes is read or refused, never a
//! panic.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let len = data.len() as u64;
    if let Ok(t) = imager::disk::gpt::read_table_from(std::io::Cursor::new(data.to_vec()), len) {
        for p in &t.partitions {
            let (off, size) = p.range(t.sector_size);
            assert!(off + size <= len);
        }
    }
});
