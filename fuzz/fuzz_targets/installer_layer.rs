//! An installer image's layers as the node reads them from a registry
//! (`payload::layer`): the first layer's signed manifest, signature and
//! trust files, checked as the node checks them (`payload::trust`), and
//! the payload layer streamed against a signed manifest's list. Any bytes
//! give files or an error, never a panic; a file is accepted only with its
//! signed size and digest.
#![no_main]
use libfuzzer_sys::fuzz_target;
use payload::artifact::{Artifact, Kind};
use sha2::{Digest, Sha256};

fuzz_target!(|data: &[u8]| {
    if let Ok(files) = payload::layer::signed_manifest(data, contract::Arch::Amd64) {
        // The trust check of what it read (`payload::trust`): the roots
        // and signature lists it may carry, against a disk's root.
        let key = payload::VerifyingKey::from_bytes(&[
            0xd7, 0x5a, 0x98, 0x01, 0x82, 0xb1, 0x0a, 0xb7, 0xd5, 0x4b, 0xfe, 0xd3, 0xc9, 0x64,
            0x07, 0x3a, 0x0e, 0xe1, 0x72, 0xf3, 0xda, 0xa6, 0x23, 0x25, 0xaf, 0x02, 0x1a, 0x68,
            0xf7, 0x07, 0x51, 0x1a,
        ])
        .expect("RFC 8032's first test key");
        let root = payload::trust::key_root(&[key]).expect("a root of one key");
        let _ = payload::trust::verify(&root, &files);
    }
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
    if let Ok(files) = payload::layer::stage_files(data, contract::Arch::Amd64, &wanted, &mut open)
    {
        for (name, f) in files {
            let (_, a) = wanted.iter().find(|(n, _)| *n == name).expect("wanted");
            assert_eq!((f.len, f.sha256.as_str()), (a.size, a.sha256.as_str()));
        }
    }
});
