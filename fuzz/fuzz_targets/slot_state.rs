//! The slot model as the runtime reads it at every boot: META values and
//! entry names come from the disk. Any text gives a state or an error and an
//! assessment, never a panic; a state written back reads back the same.
#![no_main]
use contract::Slot;
use contract::boot::EntryName;
use contract::meta::{Meta, Tag};
use contract::state::{BootState, assess};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let mut meta = Meta::default();
    let mut entries = Vec::new();
    for line in text.lines() {
        match line.split_once('=') {
            Some(("default", v)) => meta.set(Tag::DefaultSlot, v),
            Some(("a", v)) => meta.set(Tag::SlotA, v),
            Some(("b", v)) => meta.set(Tag::SlotB, v),
            Some(("pending", v)) => meta.set(Tag::PendingUpgrade, v),
            Some(("history", v)) => meta.set(Tag::History, v.replace('|', "\n")),
            _ => {
                if let Some(e) = EntryName::parse(line) {
                    assert_eq!(EntryName::parse(&e.file_name()), Some(e));
                    entries.push(e);
                }
            }
        }
    }
    if let Ok(mut state) = BootState::from_meta(&meta) {
        for slot in Slot::ALL {
            let _ = assess(&state, &entries, slot);
        }
        let _ = state.upgrade_target();
        state.record("fuzz");
        let mut m = Meta::default();
        state.write_to(&mut m);
        assert_eq!(BootState::from_meta(&m).ok(), Some(state));
    }
});
