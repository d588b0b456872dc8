//! An installer image's layers as the node reads them from a registry
//! (`payload::layer`): the first layer's signed manifest and signature, and
//! the payload layer streamed against a signed manifest's list. Any bytes
//! give files or an error, never a panic; a file is accepted only with its
//! signed size and digest.
#![no_main]
use libfuzzer_sys::fuzz_target;
use payload::artifact::{Artifact, Kind};
use sha2::{Digest, Sha256};

fuzz_target!(|data: &[u8]| {
    let _ = payload::layer::signed_manifest(data);
    // A signed list naming two files, one of them the digest of the first
    // 16 bytes of the input (so that a matching file is reachable).
    let head = &data[..data.len().min(16)];
    let wanted = vec![
        (
            "vmlinuz".to_string(),
            Artifact {
                kind: Kind::Kernel,
                path: "vmlinuz".into(),
                sha256: hex::encode(Sha256::digest(head)),
                size: head.len() as u64,
            },
        ),
        (
            "initramfs.zst".to_string(),
            Artifact {
                kind: Kind::Initramfs,
                path: "initramfs.zst".into(),
                sha256: "0".repeat(64),
                size: 4,
            },
        ),
    ];
    let mut open =
        |_: &str| -> anyhow::Result<Box<dyn std::io::Write>> { Ok(Box::new(std::io::sink())) };
    if let Ok(files) = payload::layer::stage_files(data, &wanted, &mut open) {
        for (name, f) in files {
            let (_, a) = wanted.iter().find(|(n, _)| *n == name).expect("wanted");
            assert_eq!((f.len, f.sha256.as_str()), (a.size, a.sha256.as_str()));
        }
    }
});
