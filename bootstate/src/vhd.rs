//! Fixed VHD: the raw disk followed by a 512-byte footer (Microsoft's
//! Virtual Hard Disk Image Format Specification, "Hard Disk Footer Format";
//! disk type 2, fixed). Clouds that take VHD want this type, its size a
//! whole number of MiB. Since the data is the raw disk at offset 0, every
//! reader of ours treats a fixed VHD as the disk before its footer:
//! [`data_size`], which [`crate::gpt::image_size`] applies to image files
//! (never to block devices or partitions), so the
//! partition table, META and BOOT are found and written where they are on
//! the raw disk.
//!
//! The footer is written with the creator application `imgr`. QEMU sizes a
//! VHD of an unknown creator by its CHS geometry, which for most sizes is
//! a little smaller than the disk: `imager boot` opens it with QEMU's
//! `force_size_calc=current_size`, and docs/outputs.md says how to do so
//! with qemu-img.

use std::io::{self, Read, Seek, SeekFrom};

/// The footer's length, at the end of the file.
pub const FOOTER_LEN: u64 = 512;
const COOKIE: &[u8; 8] = b"conectix";
/// Seconds from 1970-01-01 to the VHD epoch, 2000-01-01 00:00:00 UTC.
const VHD_EPOCH: u64 = 946_684_800;
const DISK_TYPE_FIXED: u32 = 2;

/// The footer of a fixed VHD of `size` bytes (a multiple of 512): the
/// timestamp from `epoch` (seconds since 1970, SOURCE_DATE_EPOCH; clamped
/// to the format's range), `unique_id` from the disk's content, so that the
/// same disk gives the same bytes.
pub fn footer(size: u64, unique_id: [u8; 16], epoch: u64) -> [u8; 512] {
    let mut f = [0u8; 512];
    f[0..8].copy_from_slice(COOKIE);
    f[8..12].copy_from_slice(&2u32.to_be_bytes()); // features: reserved bit
    f[12..16].copy_from_slice(&0x0001_0000u32.to_be_bytes()); // version 1.0
    f[16..24].copy_from_slice(&u64::MAX.to_be_bytes()); // no dynamic header
    let stamp = epoch.saturating_sub(VHD_EPOCH).min(u32::MAX as u64) as u32;
    f[24..28].copy_from_slice(&stamp.to_be_bytes());
    f[28..32].copy_from_slice(b"imgr");
    f[32..36].copy_from_slice(&0x0001_0000u32.to_be_bytes());
    f[36..40].copy_from_slice(b"Wi2k"); // creator host OS, as the spec lists
    f[40..48].copy_from_slice(&size.to_be_bytes());
    f[48..56].copy_from_slice(&size.to_be_bytes());
    let (c, h, s) = geometry(size / 512);
    f[56..58].copy_from_slice(&c.to_be_bytes());
    f[58] = h;
    f[59] = s;
    f[60..64].copy_from_slice(&DISK_TYPE_FIXED.to_be_bytes());
    f[68..84].copy_from_slice(&unique_id);
    let sum = checksum(&f);
    f[64..68].copy_from_slice(&sum.to_be_bytes());
    f
}

/// The spec's checksum: the ones' complement of the sum of every byte but
/// the checksum's own four.
fn checksum(f: &[u8; 512]) -> u32 {
    let sum = f
        .iter()
        .enumerate()
        .filter(|(i, _)| !(64..68).contains(i))
        .fold(0u32, |a, (_, &b)| a.wrapping_add(b as u32));
    !sum
}

/// The spec's CHS geometry of `sectors` 512-byte sectors (its appendix
/// "CHS Calculation"): cylinders, heads, sectors per track.
pub fn geometry(sectors: u64) -> (u16, u8, u8) {
    let total = sectors.min(65535 * 16 * 255);
    let (spt, heads, cth) = if total >= 65535 * 16 * 63 {
        (255, 16, total / 255)
    } else {
        let mut spt = 17;
        let mut cth = total / spt;
        let mut heads = cth.div_ceil(1024).max(4);
        if cth >= heads * 1024 || heads > 16 {
            spt = 31;
            heads = 16;
            cth = total / spt;
        }
        if cth >= heads * 1024 {
            spt = 63;
            heads = 16;
            cth = total / spt;
        }
        (spt, heads, cth)
    };
    ((cth / heads) as u16, heads as u8, spt as u8)
}

/// The data size of a fixed VHD whose footer is `f`, if `f` is one (cookie,
/// checksum, fixed type, no dynamic header) for a file of `len` bytes: its
/// current size must be exactly the bytes before the footer.
pub fn parse_footer(f: &[u8; 512], len: u64) -> Option<u64> {
    let be32 = |at: usize| u32::from_be_bytes([f[at], f[at + 1], f[at + 2], f[at + 3]]);
    let be64 = |at: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&f[at..at + 8]);
        u64::from_be_bytes(b)
    };
    let size = be64(48);
    let fixed = &f[0..8] == COOKIE
        && be32(64) == checksum(f)
        && be32(60) == DISK_TYPE_FIXED
        && be64(16) == u64::MAX;
    (fixed && len.checked_sub(FOOTER_LEN) == Some(size) && size % 512 == 0).then_some(size)
}

/// The size of the disk in `dev`, a file or device of `len` bytes: `len`,
/// or the data before the footer when its last 512 bytes are a fixed VHD
/// footer for exactly that data. `dev`'s position is left anywhere.
pub fn data_size<D: Read + Seek>(dev: &mut D, len: u64) -> io::Result<u64> {
    if len < FOOTER_LEN * 2 {
        return Ok(len);
    }
    let mut f = [0u8; 512];
    dev.seek(SeekFrom::Start(len - FOOTER_LEN))?;
    dev.read_exact(&mut f)?;
    Ok(parse_footer(&f, len).unwrap_or(len))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn footer_round_trips_and_anything_else_is_raw() {
        let size = 2u64 << 30;
        let f = footer(size, [7; 16], 1_700_000_000);
        assert_eq!(parse_footer(&f, size + 512), Some(size));
        // Not for a file of another length.
        assert_eq!(parse_footer(&f, size + 1024), None);
        // Any changed byte breaks the checksum (or the fields).
        for at in [0, 20, 50, 60, 64, 100, 511] {
            let mut g = f;
            g[at] ^= 1;
            assert_eq!(parse_footer(&g, size + 512), None, "byte {at}");
        }
        // Zeros (a raw disk's last sector) are raw.
        assert_eq!(parse_footer(&[0; 512], size + 512), None);
        // The timestamp counts from 2000, clamped at both ends.
        assert_eq!(&f[24..28], &(1_700_000_000u32 - 946_684_800).to_be_bytes());
        assert_eq!(&footer(size, [0; 16], 0)[24..28], &[0; 4]);
    }

    /// The spec's examples of its algorithm, worked by hand: 2 GiB falls to
    /// 63 sectors per track, 127 GiB and more to the maximum.
    #[test]
    fn geometry_follows_the_specification() {
        assert_eq!(geometry(4_194_304), (4161, 16, 63));
        assert_eq!(geometry(65535 * 16 * 255 + 5), (65535, 16, 255));
        // 100 MiB: 204800 sectors, 17 per track gives 12047 cylinder-heads,
        // 12 heads, 1003 cylinders.
        assert_eq!(geometry(204_800), (1003, 12, 17));
    }

    #[test]
    fn data_size_reads_the_footer_of_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("d.vhd");
        let size = 1u64 << 20;
        let mut f = std::fs::File::create(&p).unwrap();
        f.set_len(size).unwrap();
        f.seek(SeekFrom::End(0)).unwrap();
        std::io::Write::write_all(&mut f, &footer(size, [1; 16], 0)).unwrap();
        let mut f = std::fs::File::open(&p).unwrap();
        assert_eq!(data_size(&mut f, size + 512).unwrap(), size);
        assert_eq!(data_size(&mut f, 100).unwrap(), 100);
    }
}
