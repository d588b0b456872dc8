//! Against a real registry (Debian's docker-registry on 127.0.0.1, plain
//! HTTP): entries stored and fetched, and every refusal the module
//! promises.

#![allow(clippy::unwrap_used)]

use super::*;

#[path = "../../../registry/tests/common/mod.rs"]
#[allow(clippy::duplicate_mod)]
mod reg;

/// A signer of a fixed key, for the tests.
struct TestSigner(ed25519_dalek::SigningKey);

impl Signer for TestSigner {
    fn public_key(&self) -> VerifyingKey {
        self.0.verifying_key()
    }
    fn sign(&self, message: &[u8]) -> Result<Signature> {
        use ed25519_dalek::Signer as _;
        Ok(self.0.sign(message))
    }
}

fn signer(seed: u8) -> TestSigner {
    TestSigner(ed25519_dalek::SigningKey::from_bytes(&[seed; 32]))
}

fn cache(reg: &reg::Registry, trusted: &[&TestSigner]) -> RemoteCache {
    let client = Client::new(registry::Options {
        plain_http: vec![reg.addr.clone()],
        ..Default::default()
    })
    .unwrap();
    RemoteCache::new(
        &format!("{}/imager/cache", reg.addr),
        client,
        trusted.iter().map(|s| s.public_key()).collect(),
    )
    .unwrap()
}

/// A kernel entry's files, different for each `seed`.
fn entry(dir: &Path, seed: u64) -> std::path::PathBuf {
    let d = dir.join(format!("entry-{seed}"));
    std::fs::create_dir_all(&d).unwrap();
    for (i, (name, _)) in files_of("kernel").unwrap().iter().enumerate() {
        std::fs::write(
            d.join(name),
            reg::noise(1000 + i * 4096, seed * 10 + i as u64),
        )
        .unwrap();
    }
    d
}

const KEY: &str = "4523671ae348e39c0d3280bfaac84001efcf36e085232d70263c7054af9aa3f0";
const OTHER_KEY: &str = "9951e296f75026313e6421e37011452472751d0e746e4f31b25883b96da38085";

fn same_files(a: &Path, b: &Path) {
    for (name, _) in files_of("kernel").unwrap() {
        assert_eq!(
            std::fs::read(a.join(name)).unwrap(),
            std::fs::read(b.join(name)).unwrap(),
            "{name}"
        );
    }
}

#[test]
fn an_entry_stored_is_fetched_whole_and_stored_once() {
    let reg = reg::Registry::start();
    let tmp = tempfile::tempdir().unwrap();
    let s = signer(1);
    let c = cache(&reg, &[&s]);
    assert!(matches!(
        c.fetch("kernel", KEY, &tmp.path().join("x")).unwrap(),
        Fetched::Miss
    ));
    let src = entry(tmp.path(), 1);
    assert!(c.store("kernel", KEY, &src, &s).unwrap());
    assert!(!c.store("kernel", KEY, &src, &s).unwrap(), "stored twice");
    let dest = tmp.path().join("fetched");
    assert!(matches!(
        c.fetch("kernel", KEY, &dest).unwrap(),
        Fetched::Hit
    ));
    same_files(&src, &dest);
}

#[test]
fn foreign_tampered_and_moved_entries_are_refused() {
    let reg = reg::Registry::start();
    let tmp = tempfile::tempdir().unwrap();
    let (ours, theirs) = (signer(1), signer(2));
    // Signed by a key this cache does not trust.
    let src = entry(tmp.path(), 1);
    cache(&reg, &[&theirs])
        .store("kernel", KEY, &src, &theirs)
        .unwrap();
    let c = cache(&reg, &[&ours]);
    let Fetched::Refused(why) = c.fetch("kernel", KEY, &tmp.path().join("a")).unwrap() else {
        panic!("a foreign entry used");
    };
    assert!(why.contains("does not trust"), "{why}");
    // A trusted machine's push replaces it: a bad entry holds no key.
    assert!(c.store("kernel", KEY, &src, &ours).unwrap());
    assert!(matches!(
        c.fetch("kernel", KEY, &tmp.path().join("a2")).unwrap(),
        Fetched::Hit
    ));
    // Ours, then a file's blob changed in the registry's storage.
    let other = entry(tmp.path(), 2);
    c.store("kernel", OTHER_KEY, &other, &ours).unwrap();
    let (hex, _) = crate::io::sha256_file(&other.join("bzImage")).unwrap();
    let blob = reg.blob_file(&registry::Digest::parse(&format!("sha256:{hex}")).unwrap());
    let mut bytes = std::fs::read(&blob).unwrap();
    bytes[100] ^= 1;
    std::fs::write(&blob, bytes).unwrap();
    let dest = tmp.path().join("b");
    let Fetched::Refused(why) = c.fetch("kernel", OTHER_KEY, &dest).unwrap() else {
        panic!("a tampered entry used");
    };
    assert!(why.contains("bzImage") && why.contains("tampered"), "{why}");
    assert!(!dest.exists(), "a refused entry left files");
    // An entry's manifest under another key's tag.
    let reg2 = reg::Registry::start();
    let c2 = cache(&reg2, &[&ours]);
    c2.store("kernel", KEY, &src, &ours).unwrap();
    let raw = reg2.get_manifest("imager/cache", &format!("kernel-{KEY}"));
    reg2.push_manifest(
        "imager/cache",
        &format!("kernel-{OTHER_KEY}"),
        crate::oci::MEDIA_TYPE_MANIFEST,
        &raw,
    );
    let Fetched::Refused(why) = c2
        .fetch("kernel", OTHER_KEY, &tmp.path().join("c"))
        .unwrap()
    else {
        panic!("a moved entry used");
    };
    assert!(why.contains("signed for another entry"), "{why}");
}

#[test]
fn two_machines_pushing_one_key_at_once_both_succeed() {
    let reg = reg::Registry::start();
    let tmp = tempfile::tempdir().unwrap();
    let s = signer(1);
    let src = entry(tmp.path(), 3);
    let results: Vec<bool> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..2)
            .map(|_| {
                let c = cache(&reg, &[&s]);
                let (src, s) = (&src, &s);
                scope.spawn(move || c.store("kernel", KEY, src, s).is_ok())
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(results, [true, true]);
    let dest = tmp.path().join("fetched");
    assert!(matches!(
        cache(&reg, &[&s]).fetch("kernel", KEY, &dest).unwrap(),
        Fetched::Hit
    ));
    same_files(&src, &dest);
}

#[test]
fn repositories_and_keys_are_checked() {
    for ok in ["127.0.0.1:5000/cache", "ghcr.io/org/imager-cache"] {
        assert!(check_repository(ok).is_ok(), "{ok}");
    }
    for bad in ["cache", "ghcr.io/org/cache:tag", "ghcr.io/Org", ""] {
        assert!(check_repository(bad).is_err(), "{bad}");
    }
}
