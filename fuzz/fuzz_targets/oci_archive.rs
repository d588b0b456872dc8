//! The installer image reader: any bytes as an OCI archive give a payload
//! directory or an error, never a panic, and never a file outside the
//! destination. The verifier accepts any manifest that parses (the fuzzer
//! cannot sign), so that the unpacking after the signature check is reached
//! too. Either architecture's payload is asked for (by the input's length),
//! and the input's two halves are combined into an index (`imager
//! index`), whose reading of each input is the same store's. Seeds:
//! `fuzz/seeds/oci_archive/` (see its README).
#![no_main]
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

fn work() -> &'static std::path::Path {
    static W: OnceLock<std::path::PathBuf> = OnceLock::new();
    W.get_or_init(|| {
        let d = std::env::temp_dir().join(format!("imager-fuzz-oci-{}", std::process::id()));
        std::fs::create_dir_all(&d).expect("work directory");
        d
    })
}

fuzz_target!(|data: &[u8]| {
    let dir = work();
    let archive = dir.join("archive.tar");
    let dest = dir.join("dest");
    let _ = std::fs::remove_dir_all(&dest);
    std::fs::create_dir_all(&dest).expect("destination");
    std::fs::write(&archive, data).expect("archive");
    let accept =
        |files: &payload::trust::TrustFiles| imager::sign::Manifest::parse(&files.manifest);
    let arch = contract::arch::ARCHES[data.len() % contract::arch::ARCHES.len()].arch;
    let _ = imager::oci::extract_payload(&archive, &dest, arch, &accept);
    // Two archives of the input's halves, so that two images may be read
    // and combined (the same archive twice stops at "both are … images").
    let (a, b) = data.split_at(data.len() / 2);
    let (first, second) = (dest.join("a.tar"), dest.join("b.tar"));
    std::fs::write(&first, a).expect("archive");
    std::fs::write(&second, b).expect("archive");
    let _ = imager::oci::combine(&dest.join("index.tar"), &[first, second]);
    // Nothing beside the archive and the destination.
    for e in std::fs::read_dir(dir).expect("work directory").flatten() {
        let name = e.file_name();
        assert!(
            name == "archive.tar" || name == "dest",
            "{name:?} written outside dest"
        );
    }
});
