//! Calendar dates from days since 1970-01-01 (UTC), for the timestamps the
//! tools write: FAT directory entries, OCI configs, the kernel's build
//! timestamp.

/// The proleptic Gregorian date `(year, month 1..=12, day 1..=31)` that is
/// `days` days after 1970-01-01 (Howard Hinnant's `civil_from_days`).
/// Defined for every `u64`; never panics.
pub fn civil_from_days(days: u64) -> (u64, u32, u32) {
    // In u128, so that no input overflows; every result fits its type.
    let z = u128::from(days) + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097; // [0, 146096]
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365; // [0, 399]
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // [0, 365]
    let mp = (5 * doy + 2) / 153; // [0, 11], from March
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u128::from(month <= 2);
    (year as u64, month as u32, day as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(31), (1970, 2, 1));
        assert_eq!(civil_from_days(789), (1972, 2, 29));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        assert_eq!(civil_from_days(19_675), (2023, 11, 14));
        // 2100 is not a leap year.
        assert_eq!(civil_from_days(47_540), (2100, 2, 28));
        assert_eq!(civil_from_days(47_541), (2100, 3, 1));
        assert_eq!(civil_from_days(50_402), (2107, 12, 31));
        assert_eq!(civil_from_days(157_113), (2400, 2, 29));
        assert_eq!(civil_from_days(2_932_896), (9999, 12, 31));
        assert_eq!(civil_from_days(u64::MAX), (50_505_469_855_535_079, 2, 21));
    }

    #[test]
    fn every_day_follows_the_one_before() {
        let leap =
            |y: u64| y.is_multiple_of(4) && (!y.is_multiple_of(100) || y.is_multiple_of(400));
        let mut prev = civil_from_days(0);
        for days in 1..=200_000 {
            let (y, m, d) = prev;
            let len = match m {
                2 if leap(y) => 29,
                2 => 28,
                4 | 6 | 9 | 11 => 30,
                _ => 31,
            };
            let want = if d < len {
                (y, m, d + 1)
            } else if m < 12 {
                (y, m + 1, 1)
            } else {
                (y + 1, 1, 1)
            };
            let got = civil_from_days(days);
            assert_eq!(got, want, "day {days}");
            prev = got;
        }
    }
}
