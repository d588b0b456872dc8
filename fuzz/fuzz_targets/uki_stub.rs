//! The UKI stub as `imager::uki` reads it: any bytes give a checked layout
//! or an error, never a panic nor an allocation larger than the input; the
//! UKI headers made from a stub that parses keep the stub's sections, add
//! the UKI's after them (ascending, page-aligned, raw data at FileAlignment)
//! within SizeOfHeaders, and parse again as far as the first added section.
#![no_main]
use imager::uki::{SECTIONS, parse_stub, uki_headers};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(l) = parse_stub(data) else { return };
    // Section lengths: small, odd, and past the PE limit.
    for lens in [
        [1, 7, 5001, 3339],
        [0, 1, 1 << 31, 1 << 31],
        [9, 9, u64::MAX, 1],
    ] {
        let Ok((headers, sections, size_of_image)) = uki_headers(data, lens) else {
            continue;
        };
        let fa = u64::from(l.file_alignment);
        assert_eq!(headers.len() as u64, l.raw_data_end.div_ceil(fa) * fa);
        let mut va_end = l.image_end;
        let mut ptr = headers.len() as u64;
        for (s, name) in sections.iter().zip(SECTIONS) {
            assert_eq!(s.name, name);
            assert!(u64::from(s.virtual_address) >= va_end);
            assert_eq!(s.virtual_address % 4096, 0);
            assert_eq!(u64::from(s.pointer_to_raw_data), ptr);
            assert_eq!(u64::from(s.size_of_raw_data) % fa, 0);
            va_end = u64::from(s.virtual_address) + u64::from(s.virtual_size);
            ptr += u64::from(s.size_of_raw_data);
        }
        assert!(u64::from(size_of_image) >= va_end);
        let e = parse_stub(&headers).expect_err("a UKI is not a stub");
        assert!(format!("{e}").contains("it is a UKI"), "{e}");
    }
});
