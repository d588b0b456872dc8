//! Whether a disk holds data, and whether it is an ISO 9660 medium: the one
//! rule the installer (`imager install`) and the live system's install
//! (`machined.install=`) both apply before they lay a disk out.
//!
//! A disk holds data when any byte of its first or last [`EDGE`] bytes is
//! not zero: partition tables (MBR, GPT and its backup), filesystem
//! superblocks, RAID and LVM labels and ISO 9660 headers all live there. A
//! new disk, or one cleared with `blkdiscard` or zeroes, is blank.

use std::io::{Read, Seek, SeekFrom};

/// How much of each end of a disk is looked at: 1 MiB.
pub const EDGE: u64 = 1 << 20;
/// Where ISO 9660's Primary Volume Descriptor is (ECMA-119: sector 16 of
/// 2048 bytes).
pub const ISO_PVD_OFFSET: u64 = 32768;
/// The Volume Set Identifier in the PVD: offset and length.
const ISO_VOLUME_SET_ID: (usize, usize) = (190, 128);

/// What was found on a disk that holds data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Data {
    /// Byte offset of the first non-zero byte found.
    pub offset: u64,
    /// What it looks like: `a GPT partition table`, `an ISO 9660 volume`, …
    pub what: String,
}

impl std::fmt::Display for Data {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} (non-zero bytes at offset {})",
            self.what, self.offset
        )
    }
}

/// Reads up to `buf.len()` bytes at `offset` (short at the end of the
/// disk); returns how many were read.
fn read_at<R: Read + Seek>(r: &mut R, offset: u64, buf: &mut [u8]) -> std::io::Result<usize> {
    r.seek(SeekFrom::Start(offset))?;
    read_full(r, buf)
}

/// Fills `buf` from `r` as far as it goes (to its end or `r`'s); returns
/// the length read.
pub fn read_full(r: &mut (impl Read + ?Sized), buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// What the head of a disk (its first bytes, `head`) holds, by signature.
fn name_head(head: &[u8]) -> Option<&'static str> {
    let at = |off: usize, sig: &[u8]| head.get(off..off + sig.len()) == Some(sig);
    if at(ISO_PVD_OFFSET as usize + 1, b"CD001") {
        Some("an ISO 9660 volume")
    } else if at(512, b"EFI PART") || at(4096, b"EFI PART") {
        Some("a GPT partition table")
    } else if at(0, b"XFSB") {
        Some("an XFS filesystem")
    } else if at(1080, &[0x53, 0xef]) {
        Some("an ext2/3/4 filesystem")
    } else if at(0x10040, b"_BHRfS_M") {
        Some("a btrfs filesystem")
    } else if at(3, b"NTFS    ") {
        Some("an NTFS filesystem")
    } else if at(82, b"FAT32   ") || at(54, b"FAT16   ") || at(54, b"FAT12   ") {
        Some("a FAT filesystem")
    } else if at(510, &[0x55, 0xaa]) {
        Some("an MBR partition table or boot sector")
    } else if at(512, b"LABELONE") {
        Some("an LVM physical volume")
    } else if at(0, b"LUKS\xba\xbe") {
        Some("a LUKS volume")
    } else {
        None
    }
}

/// Whether the disk `r` of `size` bytes holds data (see the module): `None`
/// when its first and last [`EDGE`] bytes are all zero, else what was
/// found.
pub fn find_data<R: Read + Seek>(r: &mut R, size: u64) -> std::io::Result<Option<Data>> {
    let mut buf = vec![0u8; EDGE.min(size) as usize];
    let n = read_at(r, 0, &mut buf)?;
    let head = &buf[..n];
    if let Some(i) = head.iter().position(|b| *b != 0) {
        return Ok(Some(Data {
            offset: i as u64,
            what: name_head(head).unwrap_or("unknown data").to_string(),
        }));
    }
    let tail_start = size.saturating_sub(EDGE).max(n as u64);
    if tail_start < size {
        let mut buf = vec![0u8; (size - tail_start) as usize];
        let n = read_at(r, tail_start, &mut buf)?;
        let tail = &buf[..n];
        if let Some(i) = tail.iter().position(|b| *b != 0) {
            let backup_gpt = n >= 512 && &tail[n - 512..n - 504] == b"EFI PART";
            return Ok(Some(Data {
                offset: tail_start + i as u64,
                what: if backup_gpt {
                    "a backup GPT partition table at the end"
                } else {
                    "data at the end of the disk"
                }
                .to_string(),
            }));
        }
    }
    Ok(None)
}

/// The Volume Set Identifier of the ISO 9660 volume on `r`, trimmed of its
/// space padding; `None` when `r` has no Primary Volume Descriptor at
/// [`ISO_PVD_OFFSET`] (type 1, `CD001`, version 1).
pub fn iso_volume_set_id<R: Read + Seek>(r: &mut R) -> std::io::Result<Option<String>> {
    let mut pvd = [0u8; 2048];
    let n = read_at(r, ISO_PVD_OFFSET, &mut pvd)?;
    if n < pvd.len() || pvd[0] != 1 || &pvd[1..6] != b"CD001" || pvd[6] != 1 {
        return Ok(None);
    }
    let (off, len) = ISO_VOLUME_SET_ID;
    let field = &pvd[off..off + len];
    let text = String::from_utf8_lossy(field);
    Ok(Some(text.trim_end_matches([' ', '\0']).to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    /// A Primary Volume Descriptor with `id` as its Volume Set Identifier,
    /// at its place on a disk of `size` bytes.
    pub fn iso(size: usize, id: &str) -> Vec<u8> {
        let mut d = vec![0u8; size];
        let p = ISO_PVD_OFFSET as usize;
        d[p] = 1;
        d[p + 1..p + 6].copy_from_slice(b"CD001");
        d[p + 6] = 1;
        let f = &mut d[p + 190..p + 190 + 128];
        f.fill(b' ');
        f[..id.len()].copy_from_slice(id.as_bytes());
        d
    }

    #[test]
    fn blank_disks_and_what_data_looks_like() {
        let size = 4 << 20;
        let zero = vec![0u8; size];
        assert_eq!(
            find_data(&mut Cursor::new(&zero), size as u64).unwrap(),
            None
        );
        // Non-zero bytes in the middle do not count.
        let mut mid = zero.clone();
        mid[2 << 20] = 1;
        assert_eq!(
            find_data(&mut Cursor::new(&mid), size as u64).unwrap(),
            None
        );
        let mut gpt = zero.clone();
        gpt[510] = 0x55;
        gpt[511] = 0xaa;
        gpt[512..520].copy_from_slice(b"EFI PART");
        let d = find_data(&mut Cursor::new(&gpt), size as u64)
            .unwrap()
            .unwrap();
        assert_eq!((d.offset, d.what.as_str()), (510, "a GPT partition table"));
        let d = find_data(&mut Cursor::new(iso(size, "ab")), size as u64)
            .unwrap()
            .unwrap();
        assert_eq!(d.what, "an ISO 9660 volume");
        let mut end = zero.clone();
        end[size - 512..size - 504].copy_from_slice(b"EFI PART");
        let d = find_data(&mut Cursor::new(&end), size as u64)
            .unwrap()
            .unwrap();
        assert_eq!(d.offset, size as u64 - 512);
        assert!(d.what.contains("backup GPT"), "{d}");
        let mut last = zero.clone();
        last[size - 1] = 7;
        let d = find_data(&mut Cursor::new(&last), size as u64)
            .unwrap()
            .unwrap();
        assert_eq!(d.what, "data at the end of the disk");
        let mut first = zero.clone();
        first[5] = 1;
        let d = find_data(&mut Cursor::new(&first), size as u64)
            .unwrap()
            .unwrap();
        assert_eq!((d.offset, d.what.as_str()), (5, "unknown data"));
        // Disks smaller than two edges, and empty ones.
        let small = vec![0u8; 1000];
        assert_eq!(find_data(&mut Cursor::new(&small), 1000).unwrap(), None);
        let mut small = small;
        small[999] = 1;
        assert!(find_data(&mut Cursor::new(&small), 1000).unwrap().is_some());
        assert_eq!(find_data(&mut Cursor::new(Vec::new()), 0).unwrap(), None);
    }

    #[test]
    fn volume_set_identifier() {
        let d = iso(1 << 20, "0123abcd");
        assert_eq!(
            iso_volume_set_id(&mut Cursor::new(&d)).unwrap().as_deref(),
            Some("0123abcd")
        );
        assert_eq!(
            iso_volume_set_id(&mut Cursor::new(vec![0u8; 1 << 20])).unwrap(),
            None
        );
        // Too short to hold a PVD.
        assert_eq!(
            iso_volume_set_id(&mut Cursor::new(vec![0u8; 100])).unwrap(),
            None
        );
        let mut not_pvd = d.clone();
        not_pvd[ISO_PVD_OFFSET as usize] = 2;
        assert_eq!(iso_volume_set_id(&mut Cursor::new(&not_pvd)).unwrap(), None);
    }
}
