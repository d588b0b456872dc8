//! What the KSPP audit reads from a kernel source and a user's files: a
//! Kconfig file's `config NAME` entries (imager::kernel::kconfig), the
//! cached symbol list, a `.config` and a rule table. Any bytes give a
//! result or an error, never a panic; a symbol list renders and reads back
//! to the same set; an audit of any parsed config with any parsed rules
//! and the scanned symbols completes.
#![no_main]
use imager::kernel::audit::{Rules, audit_with_source};
use imager::kernel::config::KernelConfig;
use imager::kernel::kconfig::KconfigSymbols;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let mut symbols = KconfigSymbols::default();
    symbols.scan_text(&text);
    if !symbols.is_empty() {
        let back = KconfigSymbols::parse(&symbols.render(), "fuzz").expect("a rendered list reads");
        assert_eq!(back.render(), symbols.render());
    }
    let _ = KconfigSymbols::parse(&text, "fuzz");
    // The first half as a .config, the rest as a rule table.
    let (a, b) = text.split_at(text.floor_char_boundary(text.len() / 2));
    if let (Ok(cfg), Ok(rules)) = (KernelConfig::parse(a), Rules::parse(b)) {
        let _ = audit_with_source(&rules, &cfg, Some(a), &[], Some(&symbols));
        let _ = audit_with_source(&rules, &cfg, None, &[], None);
    }
});
