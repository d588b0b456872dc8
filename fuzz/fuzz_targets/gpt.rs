//! GPT reading (bootstate::gpt, which the builder, the installer, inspect
//! and the runtime's grow all use): a disk of arbitrary bytes is read or
//! refused, never a panic; what it reads lies on the disk and does not
//! overlap; a grow of what it reads leaves a table it reads again.
#![no_main]
use bootstate::gpt;
use libfuzzer_sys::fuzz_target;
use std::io::Cursor;

fuzz_target!(|data: &[u8]| {
    let len = data.len() as u64;
    let Ok(t) = gpt::read(&mut Cursor::new(data), len) else {
        return;
    };
    for p in &t.partitions {
        let (off, size) = p.range(t.sector_size);
        assert!(off + size <= len);
    }
    // The runtime's grow on a disk twice the size: it either refuses or
    // leaves a table that reads, with the same partitions but the last.
    let Some(last) = t.partitions.iter().max_by_key(|p| p.last_lba) else {
        return;
    };
    let mut bigger = data.to_vec();
    bigger.resize(data.len() * 2, 0);
    let mut dev = Cursor::new(bigger);
    if gpt::grow_last(&mut dev, len * 2, t.sector_size, &last.label).is_ok() {
        let g = gpt::read_at(&mut dev, len * 2, t.sector_size).expect("a grown table reads");
        assert_eq!(g.partitions.len(), t.partitions.len());
    }
});
