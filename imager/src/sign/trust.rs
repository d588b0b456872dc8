//! Roots of trust and signatures by several keys, on files: what `imager
//! root init|sign`, `imager sign --add` and a build with `signing.root` and
//! `signing.cosigners` write. The formats and the rules are
//! `payload::root`'s and `payload::trust`'s (docs/signing.md, "The root of
//! trust"); every signature made here is verified with the key's public
//! half before it is written, and every file is replaced atomically.

use super::keys::Signer;
use crate::io::write_atomic;
use anyhow::{Context, Result, anyhow, bail};
use contract::paths::output;
use payload::root::{Root, add_signature, entry, parse_signatures, root_message};
use payload::trust::read_small;
use std::path::{Path, PathBuf};

/// What signs a build's manifests: its key (`manifest.json.sig`), more
/// keys (`manifest.json.sigs`), and the root of trust its payload carries.
pub struct Signing<'a> {
    pub signer: &'a dyn Signer,
    pub cosigners: &'a [Box<dyn Signer>],
    pub root: Option<&'a RootFiles>,
}

impl Signing<'_> {
    /// The trust files ([`contract::paths::PAYLOAD_TRUST_FILES`]) a
    /// manifest signed this way has beside it.
    pub fn trust_files(&self) -> Vec<&'static str> {
        let mut names = Vec::new();
        if !self.cosigners.is_empty() {
            names.push(output::SIGNATURES);
        }
        if let Some(r) = self.root {
            names.push(output::ROOT);
            if r.signatures.is_some() {
                names.push(output::ROOT_SIGNATURES);
            }
        }
        names
    }
}

/// A root of trust as a build carries it: `root.json` and, when there is
/// one, `root.json.sigs` beside it.
#[derive(Debug, Clone)]
pub struct RootFiles {
    pub root: Root,
    pub bytes: Vec<u8>,
    pub signatures: Option<Vec<u8>>,
}

/// The signature list of `path`: `path` with `.sigs` appended.
pub fn signatures_path(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_os_string();
    s.push(".sigs");
    PathBuf::from(s)
}

impl RootFiles {
    /// Reads the root `path` and its signatures, if any (checked as a
    /// disk checks them, without their count).
    pub fn load(path: &Path) -> Result<RootFiles> {
        let bytes = read_small(path)?.with_context(|| {
            format!(
                "root of trust {} not found: make one with `imager root init`",
                path.display()
            )
        })?;
        let root = Root::parse(&bytes).map_err(|e| anyhow!("{}: {e}", path.display()))?;
        let sigs_path = signatures_path(path);
        let signatures = read_small(&sigs_path)?;
        if let Some(s) = &signatures {
            parse_signatures(s).map_err(|e| anyhow!("{}: {e}", sigs_path.display()))?;
        }
        Ok(RootFiles {
            root,
            bytes,
            signatures,
        })
    }
}

/// The signature list `list` (or an empty one) with `signer`'s signature
/// of `message` added, verified first.
pub fn add_signed(list: Option<&[u8]>, message: &[u8], signer: &dyn Signer) -> Result<Vec<u8>> {
    let list = parse_signatures(list.unwrap_or(b"[]")).map_err(|e| anyhow!("{e}"))?;
    let signature = signer.sign(message).context("signing")?;
    signer
        .public_key()
        .verify_strict(message, &signature)
        .context("the signer produced a signature that does not verify with its own public key")?;
    Ok(add_signature(
        &list,
        entry(&signer.public_key(), &signature),
    ))
}

/// `manifest.json.sigs` for `manifest` signed by each of `cosigners`.
pub fn cosign(manifest: &[u8], cosigners: &[Box<dyn Signer>]) -> Result<Option<Vec<u8>>> {
    let mut list: Option<Vec<u8>> = None;
    for s in cosigners {
        list = Some(
            add_signed(list.as_deref(), manifest, s.as_ref())
                .with_context(|| format!("co-signing the manifest with {}", s.key_id()))?,
        );
    }
    Ok(list)
}

/// `imager root init`: a root of `keys` needing `threshold` of them, as
/// version `version`, written to `out` (refused when it exists, unless
/// `force`).
pub fn root_init(
    out: &Path,
    keys: &[payload::VerifyingKey],
    threshold: usize,
    version: u64,
    force: bool,
) -> Result<Root> {
    let root = Root::new(version, threshold, keys.to_vec()).map_err(|e| anyhow!("{e}"))?;
    if out.exists() && !force {
        bail!(
            "{} exists: pass --force to replace it (a root a disk trusts is replaced by the next \
             version, signed by it, never rewritten)",
            out.display()
        );
    }
    write_atomic(out, &root.to_bytes(), 0o644)?;
    // Signatures of what the file held before are of another root.
    match std::fs::remove_file(signatures_path(out)) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).context("removing the old root's signatures"),
    }
    Ok(root)
}

/// `imager root sign`: `signer`'s signature of the root `path` added to
/// `path.sigs`. The key need not be in this root: a next root is signed
/// by the keys of the one it replaces too.
pub fn root_sign(path: &Path, signer: &dyn Signer) -> Result<PathBuf> {
    let files = RootFiles::load(path)?;
    let list = add_signed(
        files.signatures.as_deref(),
        &root_message(&files.bytes),
        signer,
    )?;
    let sigs = signatures_path(path);
    write_atomic(&sigs, &list, 0o644)?;
    Ok(sigs)
}

/// `imager sign --add KEY TARGET`: `signer`'s signature added to the
/// manifest of `target`, a directory ([`add_manifest_signature`]) or an
/// installer archive (`oci::resign`, which writes its first layer
/// again). Says what it changed.
pub fn add_signature_to(target: &Path, signer: &dyn Signer) -> Result<String> {
    if target.is_file() {
        let digest = crate::oci::resign::add_signature(target, signer)?;
        Ok(format!(
            "{} (its image manifest is now {digest})",
            target.display()
        ))
    } else {
        Ok(add_manifest_signature(target, signer)?
            .display()
            .to_string())
    }
}

/// `imager sign --add`: `signer`'s signature of the payload directory's
/// (or build output's) `manifest.json` added to its `manifest.json.sigs`.
pub fn add_manifest_signature(dir: &Path, signer: &dyn Signer) -> Result<PathBuf> {
    let manifest = dir.join(output::MANIFEST);
    let bytes = read_small(&manifest)?.with_context(|| {
        format!(
            "{} not found: pass a build's output directory or a payload directory",
            manifest.display()
        )
    })?;
    payload::manifest::Manifest::parse(&bytes)
        .with_context(|| format!("{} is not a signed manifest", manifest.display()))?;
    let sigs = dir.join(output::SIGNATURES);
    let list = add_signed(read_small(&sigs)?.as_deref(), &bytes, signer)?;
    write_atomic(&sigs, &list, 0o644)?;
    Ok(sigs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sign::{FileSigner, Manifest, keygen, write_signed_manifest_with};
    use payload::trust::{TrustFiles, verify};

    fn signer(dir: &Path, name: &str) -> Box<dyn Signer> {
        let private = dir.join(format!("{name}.key"));
        keygen(&private, &dir.join(format!("{name}.pub")), false).unwrap();
        Box::new(FileSigner::load(&private).unwrap())
    }

    /// Root 1 (A, B; 1 of them) and root 2 (B, C; 2 of them) made and
    /// signed by the commands' functions; a payload signed for root 2 in
    /// one go (a co-signer) and one signed by B, then by C with `sign
    /// --add`, are both taken by a disk of root 1; a rebuild without a root
    /// leaves no stale trust file.
    #[test]
    fn roots_and_signatures_made_here_are_the_ones_a_disk_takes() {
        let t = tempfile::tempdir().unwrap();
        let (a, b, c) = (
            signer(t.path(), "a"),
            signer(t.path(), "b"),
            signer(t.path(), "c"),
        );
        let (r1, r2) = (t.path().join("root1.json"), t.path().join("root2.json"));
        root_init(&r1, &[a.public_key(), b.public_key()], 1, 1, false).unwrap();
        let e = format!(
            "{:#}",
            root_init(&r1, &[a.public_key()], 1, 1, false).unwrap_err()
        );
        assert!(e.contains("pass --force"), "{e}");
        root_init(&r2, &[b.public_key(), c.public_key()], 2, 2, false).unwrap();
        for s in [&a, &b, &c] {
            root_sign(&r2, s.as_ref()).unwrap();
        }
        let root1 = RootFiles::load(&r1).unwrap().root;
        let root2 = RootFiles::load(&r2).unwrap();
        let dir = t.path().join("payload");
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("vmlinuz"), b"kernel").unwrap();
        let m = Manifest::new(
            "os",
            "2",
            "installer",
            0,
            vec![crate::sign::describe(&dir, crate::artifact::Kind::Kernel, "vmlinuz").unwrap()],
        );
        let cosigners = [c];
        let signing = Signing {
            signer: b.as_ref(),
            cosigners: &cosigners,
            root: Some(&root2),
        };
        assert_eq!(
            signing.trust_files(),
            [output::SIGNATURES, output::ROOT, output::ROOT_SIGNATURES]
        );
        write_signed_manifest_with(&dir, &m, &signing).unwrap();
        let t2 = verify(&root1, &TrustFiles::read_dir(&dir).unwrap()).unwrap();
        assert_eq!(t2.next_root.as_ref(), Some(&root2.root));
        // Signed by B alone, then C's signature added.
        let alone = Signing {
            signer: b.as_ref(),
            cosigners: &[],
            root: Some(&root2),
        };
        write_signed_manifest_with(&dir, &m, &alone).unwrap();
        assert!(!dir.join(output::SIGNATURES).exists());
        assert!(verify(&root1, &TrustFiles::read_dir(&dir).unwrap()).is_err());
        add_manifest_signature(&dir, cosigners[0].as_ref()).unwrap();
        verify(&root1, &TrustFiles::read_dir(&dir).unwrap()).unwrap();
        // A build without a root: no root.json is left behind.
        write_signed_manifest_with(
            &dir,
            &m,
            &Signing {
                signer: a.as_ref(),
                cosigners: &[],
                root: None,
            },
        )
        .unwrap();
        for name in contract::paths::PAYLOAD_TRUST_FILES {
            assert!(!dir.join(name).exists(), "{name} is left");
        }
    }
}
