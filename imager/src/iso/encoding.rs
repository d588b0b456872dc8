//! The byte encodings ECMA-119 shares between its structures: both-byte-order
//! integers, the two date forms (from SOURCE_DATE_EPOCH) and the d- and
//! a-character sets.

pub(super) fn both16(v: u16) -> [u8; 4] {
    let (l, b) = (v.to_le_bytes(), v.to_be_bytes());
    [l[0], l[1], b[0], b[1]]
}

pub(super) fn both32(v: u32) -> [u8; 8] {
    let (l, b) = (v.to_le_bytes(), v.to_be_bytes());
    [l[0], l[1], l[2], l[3], b[0], b[1], b[2], b[3]]
}

pub(super) fn put(buf: &mut [u8], at: usize, v: &[u8]) {
    if let Some(s) = buf.get_mut(at..at + v.len()) {
        s.copy_from_slice(v);
    }
}

/// A civil date (UTC) from seconds since 1970 (H. Hinnant's algorithm).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Date {
    pub(super) year: u64,
    pub(super) month: u8,
    pub(super) day: u8,
    pub(super) hour: u8,
    pub(super) minute: u8,
    pub(super) second: u8,
}

impl Date {
    pub(super) fn of(epoch: u64) -> Date {
        let secs = epoch % 86400;
        let (year, month, day) = contract::date::civil_from_days(epoch / 86400);
        Date {
            year,
            month: month as u8,
            day: day as u8,
            hour: (secs / 3600) as u8,
            minute: (secs / 60 % 60) as u8,
            second: (secs % 60) as u8,
        }
    }

    /// The 7-byte form of directory records and TF (ECMA-119 9.1.5),
    /// GMT offset 0.
    pub(super) fn short(&self) -> [u8; 7] {
        [
            (self.year.saturating_sub(1900)).min(255) as u8,
            self.month,
            self.day,
            self.hour,
            self.minute,
            self.second,
            0,
        ]
    }

    /// The 17-byte form of volume descriptors (ECMA-119 8.4.26.1).
    pub(super) fn long(&self) -> [u8; 17] {
        let s = format!(
            "{:04}{:02}{:02}{:02}{:02}{:02}00",
            self.year, self.month, self.day, self.hour, self.minute, self.second
        );
        let mut out = [0u8; 17];
        out[..16].copy_from_slice(&s.as_bytes()[..16]);
        out
    }
}

/// "Not specified" in a volume descriptor date.
pub(super) const NO_DATE: [u8; 17] = [
    b'0', b'0', b'0', b'0', b'0', b'0', b'0', b'0', b'0', b'0', b'0', b'0', b'0', b'0', b'0', b'0',
    0,
];

pub(super) fn is_d_char(c: u8) -> bool {
    c.is_ascii_uppercase() || c.is_ascii_digit() || c == b'_'
}

pub(super) fn is_a_char(c: u8) -> bool {
    is_d_char(c) || b" !\"%&'()*+,-./:;<=>?".contains(&c)
}
