//! A qcow2 image read by imager's reader (imager::disk::qcow2), as `imager
//! boot`, `inspect` and `verify` read `disk.qcow2`: any bytes are a disk
//! that reads, or an error, never a panic; every read stays within the
//! virtual disk and returns what it says; the GPT reader reads through it.
#![no_main]
use imager::disk::qcow2::Qcow2;
use libfuzzer_sys::fuzz_target;
use std::io::{Cursor, Read, Seek, SeekFrom};

fuzz_target!(|data: &[u8]| {
    let Ok(mut q) = Qcow2::new(Cursor::new(data)) else {
        return;
    };
    let size = q.size();
    // A few reads: the start, the middle, the end, and one the input picks.
    let pick = data.get(200..208).map_or(0, |b| {
        u64::from_le_bytes(b.try_into().expect("8 bytes")) % size.max(1)
    });
    let mut buf = vec![0u8; 70_000];
    for at in [0, size / 2, size.saturating_sub(4096), pick] {
        q.seek(SeekFrom::Start(at)).expect("seek");
        match q.read(&mut buf) {
            Ok(n) => assert!(n as u64 <= size - at.min(size)),
            Err(_) => continue,
        }
    }
    // Past the end: nothing.
    q.seek(SeekFrom::Start(size)).expect("seek");
    assert_eq!(q.read(&mut buf).expect("at the end"), 0);
    let _ = bootstate::gpt::read(&mut q, size);
});
