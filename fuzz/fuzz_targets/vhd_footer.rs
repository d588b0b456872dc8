//! A disk's last sector read as a fixed VHD footer (bootstate::vhd), as
//! every reader of a disk does to find its size: any bytes and file length
//! give a size within the file or "not a VHD", never a panic; a footer we
//! write for a size reads back as that size, and one changed byte of it
//! is refused.
#![no_main]
use bootstate::vhd::{FOOTER_LEN, data_size, footer, parse_footer};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 520 {
        return;
    }
    let mut len = [0u8; 8];
    len.copy_from_slice(&data[512..520]);
    let len = u64::from_le_bytes(len);
    let mut f = [0u8; 512];
    f.copy_from_slice(&data[..512]);
    if let Some(size) = parse_footer(&f, len) {
        assert_eq!(size + FOOTER_LEN, len);
    }
    // As readers find a disk's size: the input as the whole file.
    let n = data.len() as u64;
    let size = data_size(&mut std::io::Cursor::new(data), n).expect("in memory");
    assert!(size == n || size + FOOTER_LEN == n);
    // Our own footer for a size taken from the input.
    let size = (len % (1 << 50)) & !511;
    let mut id = [0u8; 16];
    id.copy_from_slice(&data[..16]);
    let ours = footer(size, id, len);
    assert_eq!(parse_footer(&ours, size + FOOTER_LEN), Some(size));
    // One changed byte changes the sum (or the checksum): refused.
    let at = data[519] as usize * 2 % 512 + (data[518] & 1) as usize;
    let mut changed = ours;
    changed[at] ^= data[517] | 1;
    assert_eq!(parse_footer(&changed, size + FOOTER_LEN), None);
});
