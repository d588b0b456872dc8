//! Little-endian integers at byte offsets, bounds-checked.
//!
//! The tools parse bytes they do not trust (ELF headers, GPT and FAT
//! structures read from disks), so none of these functions panics: a value
//! that does not lie wholly inside the buffer (including an offset so large
//! that `at + size` overflows) is `None`. Writers change nothing in that case
//! and are `#[must_use]`, so that an out-of-bounds write cannot pass
//! silently; a caller that writes into a buffer it sized itself may
//! `expect()` the result with the reason it fits.

fn array<const N: usize>(b: &[u8], at: usize) -> Option<[u8; N]> {
    b.get(at..at.checked_add(N)?)?.try_into().ok()
}

fn put<const N: usize>(b: &mut [u8], at: usize, v: [u8; N]) -> Option<()> {
    b.get_mut(at..at.checked_add(N)?)?.copy_from_slice(&v);
    Some(())
}

/// The `u16` at `b[at..at + 2]`.
pub fn read_u16(b: &[u8], at: usize) -> Option<u16> {
    array(b, at).map(u16::from_le_bytes)
}

/// The `u32` at `b[at..at + 4]`.
pub fn read_u32(b: &[u8], at: usize) -> Option<u32> {
    array(b, at).map(u32::from_le_bytes)
}

/// The `u64` at `b[at..at + 8]`.
pub fn read_u64(b: &[u8], at: usize) -> Option<u64> {
    array(b, at).map(u64::from_le_bytes)
}

/// Writes `v` to `b[at..at + 2]`; `None` (and `b` unchanged) if it does not fit.
#[must_use = "an out-of-bounds write returns None and writes nothing"]
pub fn write_u16(b: &mut [u8], at: usize, v: u16) -> Option<()> {
    put(b, at, v.to_le_bytes())
}

/// Writes `v` to `b[at..at + 4]`; `None` (and `b` unchanged) if it does not fit.
#[must_use = "an out-of-bounds write returns None and writes nothing"]
pub fn write_u32(b: &mut [u8], at: usize, v: u32) -> Option<()> {
    put(b, at, v.to_le_bytes())
}

/// Writes `v` to `b[at..at + 8]`; `None` (and `b` unchanged) if it does not fit.
#[must_use = "an out-of-bounds write returns None and writes nothing"]
pub fn write_u64(b: &mut [u8], at: usize, v: u64) -> Option<()> {
    put(b, at, v.to_le_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_little_endian_inside_the_buffer_only() {
        let b = [1u8, 2, 3, 4, 5, 6, 7, 8, 9];
        assert_eq!(read_u16(&b, 0), Some(0x0201));
        assert_eq!(read_u16(&b, 7), Some(0x0908));
        assert_eq!(read_u16(&b, 8), None);
        assert_eq!(read_u32(&b, 5), Some(0x0908_0706));
        assert_eq!(read_u32(&b, 6), None);
        assert_eq!(read_u64(&b, 1), Some(0x0908_0706_0504_0302));
        assert_eq!(read_u64(&b, 2), None);
        assert_eq!(read_u64(&[], 0), None);
        // Offsets whose end overflows are out of bounds, not a panic.
        assert_eq!(read_u16(&b, usize::MAX), None);
        assert_eq!(read_u32(&b, usize::MAX - 2), None);
        assert_eq!(read_u64(&b, usize::MAX - 7), None);
    }

    #[test]
    fn writes_round_trip_and_out_of_bounds_writes_change_nothing() {
        let mut b = [0u8; 10];
        assert_eq!(write_u16(&mut b, 0, 0xBEEF), Some(()));
        assert_eq!(write_u32(&mut b, 2, 0xDEAD_BEEF), Some(()));
        assert_eq!(b[..6], [0xEF, 0xBE, 0xEF, 0xBE, 0xAD, 0xDE]);
        assert_eq!(write_u64(&mut b, 2, u64::MAX - 1), Some(()));
        assert_eq!(read_u64(&b, 2), Some(u64::MAX - 1));
        assert_eq!(read_u16(&b, 0), Some(0xBEEF));

        let before = b;
        assert_eq!(write_u16(&mut b, 9, 1), None);
        assert_eq!(write_u32(&mut b, 7, 1), None);
        assert_eq!(write_u64(&mut b, 3, 1), None);
        assert_eq!(write_u64(&mut b, usize::MAX, 1), None);
        assert_eq!(b, before);
    }
}
