//! Secure Boot's signature databases and the signed appends to them
//! (`payload::efivar`): a variable's value as firmware gives it (first
//! byte 0), an update file (1: `db.append.auth`, 2: `dbx.append.auth`), or
//! META's record of a version's updates (3). Any bytes give entries or a
//! short escaped refusal, never a panic; what is read stays within its
//! bounds and a record reads back the same. Seeds: `fuzz/seeds/efivar/`.
#![no_main]
use libfuzzer_sys::fuzz_target;
use payload::efivar::{MAX_ENTRIES, Record, missing, parse_lists, parse_update};

fuzz_target!(|data: &[u8]| {
    let Some((first, rest)) = data.split_first() else {
        return;
    };
    let check = |e: &anyhow::Error| {
        let e = format!("{e:#}");
        assert!(e.len() < 1024, "a long message: {e}");
        assert!(!e.chars().any(|c| c.is_control()), "unescaped: {e:?}");
    };
    match first % 4 {
        0 => match parse_lists(rest) {
            Ok(e) => assert!(e.len() <= MAX_ENTRIES),
            Err(e) => check(&e),
        },
        1 | 2 => {
            let name = if first % 4 == 1 {
                "db.append.auth"
            } else {
                "dbx.append.auth"
            };
            match parse_update(name, rest) {
                Ok(u) => {
                    assert!(!u.entries.is_empty() && u.entries.len() <= MAX_ENTRIES);
                    assert!(missing(&u.entries, &u).is_empty());
                }
                Err(e) => check(&e),
            }
        }
        _ => {
            let Ok(s) = std::str::from_utf8(rest) else {
                return;
            };
            match Record::from_meta(s) {
                Ok(r) => assert_eq!(Record::from_meta(&r.to_meta()).ok().as_ref(), Some(&r)),
                Err(e) => check(&e),
            }
        }
    }
});
