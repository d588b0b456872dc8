//! Boot Loader Specification entries, entry names, kernel command lines
//! (with the runtime's keys: the live install, the network, plain-HTTP
//! registries, the boot disk's partition, the installed node's settings), a
//! node's settings as META keeps them, and the rootfs manifest: parsers
//! the runtime and inspect feed with disk data; and the UEFI loader's
//! `LoaderDevicePartUUID` variable.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    if let Ok(e) = contract::boot::Entry::parse(&text) {
        // What parses renders and parses back to itself.
        assert_eq!(
            contract::boot::Entry::parse(&e.render()).ok(),
            Some(e.clone())
        );
    }
    let _ = contract::boot::slot_of_entry(&text);
    let _ = contract::cmdline::parse(&text);
    // The live system's keys: a value is accepted or refused, never a panic.
    let _ = contract::cmdline::live(&text);
    let _ = contract::cmdline::install(&text);
    let _ = contract::cmdline::parse_install_target(&text);
    // The network (`machined.net=`) and the registries allowed plain HTTP:
    // what parses renders back to the same value.
    if let Ok(n) = contract::net::parse(&text) {
        assert_eq!(contract::net::parse(&n.value()).ok(), Some(n.clone()));
    }
    let _ = contract::cmdline::plain_http(&text);
    // A node's own settings (META's node-settings, the live installer's
    // keys): what parses renders and parses back to itself.
    if let Ok(s) = contract::settings::Settings::parse(&text) {
        assert_eq!(
            contract::settings::Settings::parse(&s.render()).ok(),
            Some(s.clone())
        );
    }
    let _ = contract::cmdline::install_settings(&text);
    let _ = contract::skeleton::parse(&text);
    // The words naming the boot disk: GRUB's key and the UEFI loader's
    // variable (the same bytes as efivarfs would give them).
    let _ = contract::bootdisk::boot_part(&text);
    if let Some(g) = contract::bootdisk::decode_loader_variable(data) {
        assert!(data.len() >= 4 + 2 * 36);
        let _ = g;
    }
});
