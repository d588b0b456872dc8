//! Helpers for rootfs/tests/boot-direct.sh, built on the contract so that the
//! test disk has the real labels, type GUIDs and META format:
//!
//! ```text
//! testdisk sfdisk                      sfdisk script: every LAYOUT partition, 1 MiB
//!                                      each (STATE: its minimum size), the last
//!                                      one taking the rest
//! testdisk meta <out> <slot> <version> META area (both copies) with that slot
//!                                      as default and good at that version
//! ```

use contract::meta::{Meta, SlotRecord, SlotStatus, Tag};
use contract::partition::{Content, MIB};
use contract::{LAYOUT, Slot};
use std::process::ExitCode;

fn sfdisk() -> String {
    let mut s = String::from("label: gpt\nunit: sectors\nfirst-lba: 2048\n");
    for (i, p) in LAYOUT.iter().enumerate() {
        let size = if i + 1 == LAYOUT.len() {
            String::new()
        } else if p.content == Content::Unformatted {
            // The runtime formats it (XFS): its smallest allowed size.
            format!("size={}MiB, ", p.min_size / MIB)
        } else {
            "size=1MiB, ".into()
        };
        s.push_str(&format!(
            "{size}type={}, name=\"{}\"\n",
            p.type_guid.hyphenated().to_string().to_uppercase(),
            p.label
        ));
    }
    s
}

fn meta(slot: Slot, version: &str) -> Result<Vec<u8>, String> {
    let mut m = Meta::default();
    m.set(Tag::ImageName, "boot-direct-test");
    m.set(Tag::DefaultSlot, slot.name());
    let record = SlotRecord {
        status: SlotStatus::Good,
        version: version.to_string(),
        security: 0,
    };
    m.set(Tag::for_slot(slot), record.render());
    m.encode().map_err(|e| e.to_string())
}

fn run(args: &[String]) -> Result<(), String> {
    match args {
        [cmd] if cmd == "sfdisk" => {
            print!("{}", sfdisk());
            Ok(())
        }
        [cmd, out, slot, version] if cmd == "meta" => {
            let slot: Slot = slot.parse()?;
            let bytes = meta(slot, version)?;
            std::fs::write(out, bytes).map_err(|e| format!("write {out}: {e}"))
        }
        _ => Err("usage: testdisk sfdisk | testdisk meta <out> <A|B> <version>".into()),
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("testdisk: {e}");
            ExitCode::FAILURE
        }
    }
}
