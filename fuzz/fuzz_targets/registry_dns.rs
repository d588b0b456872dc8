//! The node's DNS answers (`registry::dns::parse_answer`): any bytes, as
//! the answer to a query for a name the input's first bytes pick, give
//! addresses, a code or an error, never a panic nor unbounded work; a
//! query the resolver sends parses back as the same question. Seeds:
//! `fuzz/seeds/registry_dns/` (answers to `reg.example`, ID 0x0707).
#![no_main]
use libfuzzer_sys::fuzz_target;
use registry::dns::{Answer, parse_answer, query};

fuzz_target!(|data: &[u8]| {
    // The common case: the seeds' question. Else a name from the input.
    let (name, answer) = match data.split_first() {
        Some((0, rest)) => {
            let n = rest.first().copied().unwrap_or(0) as usize;
            let rest = rest.get(1..).unwrap_or_default();
            let (name, answer) = rest.split_at(n.min(rest.len()));
            (String::from_utf8_lossy(name).into_owned(), answer)
        }
        _ => ("reg.example".to_string(), data),
    };
    match parse_answer(answer, 0x0707, &name) {
        Ok(Answer::Addresses(a)) => assert!(!a.is_empty() && a.len() <= registry::dns::MAX_RECORDS),
        Ok(_) => {}
        Err(e) => assert!(e.to_string().len() < 1024, "a long message: {e}"),
    }
    if let Ok(q) = query(0x0707, &name) {
        // A query is no answer (QR is clear).
        assert!(parse_answer(&q, 0x0707, &name).is_err());
    }
});
