//! A packed disk read by imager's unpacker (imager::disk::compress), as
//! `imager boot`, `inspect` and `verify` read the platforms' images and
//! the compressed disks: a stream-optimised VMDK (`aws.vmdk`), an OVA
//! (`vmware.ova`), Compute Engine's gzip'd tar (`gcp.tar.gz`), zstd and xz
//! streams, told apart by their first bytes. Any bytes give a disk of the
//! size the unpacker says, or an error, never a panic.
#![no_main]
use imager::disk::compress::{Format, unpack_stream};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let format = Format::of_bytes(data);
    if !format.compressed() {
        return;
    }
    let dest = std::env::temp_dir().join(format!("fuzz-packed-disk-{}.raw", std::process::id()));
    let r = unpack_stream(format, &mut &data[..], &dest);
    if let Ok(size) = r {
        let len = std::fs::metadata(&dest).expect("the unpacked disk").len();
        assert_eq!(len, size, "the unpacked disk is not the size said");
    }
    let _ = std::fs::remove_file(&dest);
});
