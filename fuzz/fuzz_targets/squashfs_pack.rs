//! The root filesystem's block pack (imager::rootfs::pack), as a build
//! reads it from its cache directory: any bytes are an index whose blocks
//! all lie within the data part, sorted and unique, or an error, never a
//! panic; a pack made of the input's own blocks reads back as made, and
//! with one byte of its index or footer changed it reads as an error or
//! as entries that still keep those rules.
#![no_main]
use imager::rootfs::pack::{Entry, MAX_ENTRIES, index_and_footer, key, parse_index};
use libfuzzer_sys::fuzz_target;

const BLOCK: u32 = 131072;

fn parse(bytes: &[u8]) -> std::io::Result<Vec<Entry>> {
    parse_index(bytes.len() as u64, BLOCK, &mut |at, buf| {
        let at = usize::try_from(at).map_err(|_| std::io::ErrorKind::UnexpectedEof)?;
        let src = bytes
            .get(at..at.saturating_add(buf.len()))
            .ok_or(std::io::ErrorKind::UnexpectedEof)?;
        buf.copy_from_slice(src);
        Ok(())
    })
}

fn check(entries: &[Entry], bytes: &[u8]) {
    for w in entries.windows(2) {
        assert!(w[0].key < w[1].key);
    }
    for e in entries {
        assert!(e.len > 0);
        assert!(e.offset + u64::from(e.len) <= bytes.len() as u64);
    }
}

fuzz_target!(|data: &[u8]| {
    // The input as a pack.
    if let Ok(entries) = parse(data) {
        check(&entries, data);
    }
    // A pack of the input's pieces (cut where a byte says), then one byte
    // of its index or footer changed.
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let mut entries = Vec::new();
    let mut pack = Vec::new();
    for piece in rest
        .chunks(usize::from(pick % 64) + 1)
        .take(MAX_ENTRIES as usize)
    {
        let k = key(piece);
        if entries.iter().any(|e: &Entry| e.key == k) {
            continue;
        }
        entries.push(Entry {
            key: k,
            offset: pack.len() as u64,
            len: piece.len() as u32,
        });
        pack.extend_from_slice(piece);
    }
    let data_len = pack.len() as u64;
    pack.extend(index_and_footer(&mut entries, data_len));
    assert_eq!(parse(&pack).expect("a pack as made"), entries);
    let at = data_len as usize + usize::from(pick) * 7 % (pack.len() - data_len as usize);
    pack[at] ^= pick | 1;
    if let Ok(changed) = parse(&pack) {
        check(&changed, &pack);
    }
});
