//! The dm-verity hash tree of the root filesystem, computed by our code and
//! byte-identical to what `veritysetup format --salt=S --uuid=U DATA HASH`
//! writes (format version 1, sha256, 4096-byte data and hash blocks, the
//! superblock at block 0 of a separate hash device; see
//! [`contract::verity`] for the superblock and the parameters).
//!
//! The salt and UUID are derived from the data, never from a clock or a
//! random source: the salt is the first 24 bytes of
//! `sha256("imager dm-verity salt v1\0" ‖ sha256(data))` followed by the
//! number of data blocks (little-endian u64, which binds the data size to
//! the root hash); the UUID is the first 16 bytes of
//! `sha256("imager dm-verity uuid v1\0" ‖ salt)`, marked as an RFC 9562
//! version 8 (custom) UUID.
//!
//! The data is read twice, streamed in blocks (once for its digest, once
//! for the tree); the hashes of the data blocks (level 0, 1/128 of the data)
//! and the levels above it are held in memory, then written top level
//! first as veritysetup lays them out.

use crate::io::AtomicFile;
use anyhow::{Context, Result, bail};
use contract::verity::{
    BLOCK_SIZE, DIGEST_LEN, HASHES_PER_BLOCK, MAX_DATA_BLOCKS, SALT_LEN, Superblock,
};
use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::{Read, Write};
use std::path::Path;

type Hash = [u8; DIGEST_LEN];

/// The kernel options stage 1 needs to open the root through dm-verity,
/// built in (the image's kernel has no modules).
pub const KERNEL_OPTIONS: [&str; 3] = [
    "CONFIG_BLK_DEV_DM",
    "CONFIG_DM_VERITY",
    "CONFIG_CRYPTO_SHA256",
];

/// The options of [`KERNEL_OPTIONS`] that `config` does not build in.
pub fn kernel_lacks(config: &crate::kernel::KernelConfig) -> Vec<&'static str> {
    KERNEL_OPTIONS
        .into_iter()
        .filter(|o| config.effective(o) != crate::kernel::config::Value::Set("y".into()))
        .collect()
}

/// What [`format`] made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verity {
    /// The root hash, lowercase hex (what goes on the command line).
    pub root_hash: String,
    /// The salt, lowercase hex.
    pub salt: String,
    /// The hash device's UUID in its usual text form.
    pub uuid: String,
    pub data_blocks: u64,
}

/// Appends zeros to `path` up to a multiple of [`BLOCK_SIZE`] (dm-verity
/// hashes whole blocks; squashfs ignores bytes past its end). Returns how
/// many bytes were added.
pub fn pad_to_block(path: &Path) -> Result<u64> {
    let len = std::fs::metadata(path)
        .with_context(|| format!("reading the size of {}", path.display()))?
        .len();
    let pad = (BLOCK_SIZE - len % BLOCK_SIZE) % BLOCK_SIZE;
    if pad > 0 {
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(path)
            .with_context(|| format!("opening {} to pad it", path.display()))?;
        f.write_all(&vec![0u8; pad as usize])
            .with_context(|| format!("padding {}", path.display()))?;
        f.sync_all()?;
    }
    Ok(pad)
}

fn salted(salt: &[u8], block: &[u8]) -> Hash {
    let mut h = Sha256::new();
    h.update(salt);
    h.update(block);
    h.finalize().into()
}

/// Calls `each` with every [`BLOCK_SIZE`] block of `path`, which must be a
/// whole, non-zero number of blocks. Returns the number of blocks.
fn blocks(path: &Path, mut each: impl FnMut(&[u8])) -> Result<u64> {
    let mut f = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let len = f
        .metadata()
        .with_context(|| format!("reading the size of {}", path.display()))?
        .len();
    if len == 0 || len % BLOCK_SIZE != 0 {
        bail!(
            "{} is {len} bytes: dm-verity needs a non-zero multiple of {BLOCK_SIZE} (pad it)",
            path.display()
        );
    }
    if len / BLOCK_SIZE > MAX_DATA_BLOCKS {
        bail!(
            "{} is too large for the root filesystem's hash tree",
            path.display()
        );
    }
    let mut block = vec![0u8; BLOCK_SIZE as usize];
    for _ in 0..len / BLOCK_SIZE {
        f.read_exact(&mut block)
            .with_context(|| format!("reading {} (did it change?)", path.display()))?;
        each(&block);
    }
    Ok(len / BLOCK_SIZE)
}

/// The salt of data whose SHA-256 is `data_sha256`, `data_blocks` long.
pub fn salt(data_sha256: &[u8], data_blocks: u64) -> [u8; SALT_LEN] {
    let mut h = Sha256::new();
    h.update(b"imager dm-verity salt v1\0");
    h.update(data_sha256);
    let d: Hash = h.finalize().into();
    let mut salt = [0u8; SALT_LEN];
    salt[..SALT_LEN - 8].copy_from_slice(&d[..SALT_LEN - 8]);
    salt[SALT_LEN - 8..].copy_from_slice(&data_blocks.to_le_bytes());
    salt
}

/// The hash device's UUID for `salt`.
pub fn uuid(salt: &[u8; SALT_LEN]) -> [u8; 16] {
    let mut h = Sha256::new();
    h.update(b"imager dm-verity uuid v1\0");
    h.update(salt);
    let d: Hash = h.finalize().into();
    let mut u = [0u8; 16];
    u.copy_from_slice(&d[..16]);
    u[6] = (u[6] & 0x0f) | 0x80;
    u[8] = (u[8] & 0x3f) | 0x80;
    u
}

/// The hash blocks of one level: the hashes below, 128 to a block, the last
/// block padded with zeros.
fn level_blocks(below: &[Hash]) -> impl Iterator<Item = Vec<u8>> + '_ {
    below.chunks(HASHES_PER_BLOCK as usize).map(|chunk| {
        let mut b = vec![0u8; BLOCK_SIZE as usize];
        for (i, h) in chunk.iter().enumerate() {
            b[i * DIGEST_LEN..(i + 1) * DIGEST_LEN].copy_from_slice(h);
        }
        b
    })
}

/// Computes the hash tree of `data` (a whole number of 4096-byte blocks:
/// see [`pad_to_block`]) and writes the hash device to `hash_out`,
/// atomically.
pub fn format(data: &Path, hash_out: &Path) -> Result<Verity> {
    let mut digest = Sha256::new();
    let n = blocks(data, |b| digest.update(b))?;
    let data_sha: Hash = digest.finalize().into();
    let salt = salt(&data_sha, n);
    // Level 0: the data blocks' hashes; then each level hashes the blocks
    // of the one below, up to a single block.
    let mut levels: Vec<Vec<Hash>> = Vec::new();
    let mut below = Vec::with_capacity(usize::try_from(n).unwrap_or(0));
    let again = blocks(data, |b| below.push(salted(&salt, b)))?;
    if again != n {
        bail!("{} changed while it was hashed", data.display());
    }
    while below.len() > 1 {
        let above: Vec<Hash> = level_blocks(&below).map(|b| salted(&salt, &b)).collect();
        levels.push(below);
        below = above;
    }
    let root = below[0];
    debug_assert_eq!(
        levels.len(),
        contract::verity::levels(n).len(),
        "tree geometry"
    );

    let sb = Superblock {
        uuid: uuid(&salt),
        data_blocks: n,
        salt,
    };
    let mut out = AtomicFile::create(hash_out)?;
    let mut block0 = vec![0u8; BLOCK_SIZE as usize];
    block0[..contract::verity::SUPERBLOCK_LEN].copy_from_slice(&sb.render());
    out.write_all(&block0)?;
    for level in levels.iter().rev() {
        for b in level_blocks(level) {
            out.write_all(&b)?;
        }
    }
    out.flush()?;
    out.commit()
        .with_context(|| format!("writing the hash tree {}", hash_out.display()))?;
    Ok(Verity {
        root_hash: contract::verity::hex(&root),
        salt: contract::verity::hex(&salt),
        uuid: uuid::Uuid::from_bytes(sb.uuid).hyphenated().to_string(),
        data_blocks: n,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::disk::testutil::{run, tool};
    use std::process::Command;

    /// Data of `n` blocks that differ from each other.
    fn data(dir: &Path, n: u64) -> std::path::PathBuf {
        let p = dir.join(format!("data-{n}"));
        let bytes: Vec<u8> = (0..n * BLOCK_SIZE)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        std::fs::write(&p, bytes).unwrap();
        p
    }

    fn veritysetup() -> std::path::PathBuf {
        tool("veritysetup")
    }

    /// Our hash device equals veritysetup's, byte for byte, and veritysetup
    /// prints the same root hash; `veritysetup verify` accepts ours and
    /// refuses it after one flipped data byte.
    fn same_as_veritysetup(n: u64) {
        let dir = tempfile::tempdir().unwrap();
        let d = data(dir.path(), n);
        let ours = dir.path().join("ours");
        let v = format(&d, &ours).unwrap();
        assert_eq!(v.data_blocks, n);
        let theirs = dir.path().join("theirs");
        let out = run(Command::new(veritysetup())
            .arg("format")
            .arg(format!("--salt={}", v.salt))
            .arg(format!("--uuid={}", v.uuid))
            .arg(&d)
            .arg(&theirs));
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.lines()
                .any(|l| l.starts_with("Root hash:") && l.ends_with(&v.root_hash)),
            "{n} blocks: veritysetup printed\n{text}\nours {}",
            v.root_hash
        );
        let (a, b) = (
            std::fs::read(&ours).unwrap(),
            std::fs::read(&theirs).unwrap(),
        );
        assert_eq!(a.len(), b.len(), "{n} blocks: hash device size");
        assert!(a == b, "{n} blocks: hash devices differ");
        assert_eq!(
            a.len() as u64,
            contract::verity::hash_device_blocks(n) * BLOCK_SIZE
        );
        let sb = Superblock::parse(&a[..BLOCK_SIZE as usize]).unwrap();
        assert_eq!(sb.data_blocks, n);

        let verify = |data: &Path| {
            Command::new(veritysetup())
                .arg("verify")
                .arg(data)
                .arg(&ours)
                .arg(&v.root_hash)
                .output()
                .unwrap()
        };
        assert!(
            verify(&d).status.success(),
            "{n} blocks: verify refused ours"
        );
        let mut bytes = std::fs::read(&d).unwrap();
        let at = bytes.len() / 2 + 17;
        bytes[at] ^= 0x01;
        std::fs::write(&d, bytes).unwrap();
        let refused = verify(&d);
        assert!(
            !refused.status.success(),
            "{n} blocks: verify accepted a flipped byte"
        );
    }

    #[test]
    fn one_block_equals_veritysetup() {
        same_as_veritysetup(1);
    }

    #[test]
    fn one_full_hash_block_equals_veritysetup() {
        same_as_veritysetup(2);
        same_as_veritysetup(128);
    }

    #[test]
    fn two_levels_equal_veritysetup() {
        same_as_veritysetup(129);
        same_as_veritysetup(1000);
    }

    #[test]
    fn three_levels_equal_veritysetup() {
        // 128 * 128 + 1 blocks (64 MiB): levels of 129, 2 and 1 blocks.
        same_as_veritysetup(128 * 128 + 1);
    }

    /// A case checked by hand, without veritysetup: one level of one block
    /// for two data blocks, and the root hash of one block.
    #[test]
    fn hand_checked_tree() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("d");
        let mut bytes = vec![0u8; 2 * BLOCK_SIZE as usize];
        bytes[BLOCK_SIZE as usize] = 1;
        std::fs::write(&d, &bytes).unwrap();
        let h = dir.path().join("h");
        let v = format(&d, &h).unwrap();
        let s = salt(&Sha256::digest(&bytes), 2);
        assert_eq!(&s[24..], &2u64.to_le_bytes());
        let h0 = Sha256::new()
            .chain_update(s)
            .chain_update(&bytes[..4096])
            .finalize();
        let h1 = Sha256::new()
            .chain_update(s)
            .chain_update(&bytes[4096..])
            .finalize();
        let tree = std::fs::read(&h).unwrap();
        assert_eq!(tree.len(), 2 * 4096);
        assert_eq!(&tree[4096..4128], &h0[..]);
        assert_eq!(&tree[4128..4160], &h1[..]);
        assert!(tree[4160..].iter().all(|&b| b == 0));
        let root = Sha256::new()
            .chain_update(s)
            .chain_update(&tree[4096..])
            .finalize();
        assert_eq!(v.root_hash, contract::verity::hex(&root));
        assert_eq!(v.salt, contract::verity::hex(&s));
        // Same data, same bytes.
        let again = dir.path().join("h2");
        assert_eq!(format(&d, &again).unwrap(), v);
        assert_eq!(std::fs::read(&again).unwrap(), tree);
    }

    #[test]
    fn kernel_options() {
        use crate::kernel::KernelConfig;
        let all = KernelConfig::parse(
            "CONFIG_BLK_DEV_DM=y\nCONFIG_DM_VERITY=y\nCONFIG_CRYPTO_SHA256=y\n",
        )
        .unwrap();
        assert!(kernel_lacks(&all).is_empty());
        let some = KernelConfig::parse(
            "CONFIG_BLK_DEV_DM=y\nCONFIG_DM_VERITY=m\n# CONFIG_CRYPTO_SHA256 is not set\n",
        )
        .unwrap();
        assert_eq!(
            kernel_lacks(&some),
            ["CONFIG_DM_VERITY", "CONFIG_CRYPTO_SHA256"]
        );
    }

    #[test]
    fn padding_and_refusals() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("d");
        std::fs::write(&d, [1u8; 5000]).unwrap();
        let e = format(&d, &dir.path().join("h")).unwrap_err();
        assert!(format!("{e:#}").contains("multiple of 4096"), "{e:#}");
        assert!(!dir.path().join("h").exists());
        assert_eq!(pad_to_block(&d).unwrap(), 8192 - 5000);
        assert_eq!(std::fs::metadata(&d).unwrap().len(), 8192);
        assert_eq!(pad_to_block(&d).unwrap(), 0);
        format(&d, &dir.path().join("h")).unwrap();
        std::fs::write(&d, []).unwrap();
        assert!(format(&d, &dir.path().join("h")).is_err());
    }
}
