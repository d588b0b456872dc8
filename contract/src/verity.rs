//! The dm-verity contract of the root filesystem: the hash device's
//! superblock (the format `veritysetup format` writes, cryptsetup's
//! `struct verity_sb`), the one parameter set the image uses, and how the
//! salt binds the data size.
//!
//! The image's root filesystem (`rootfs.sqsh`, a multiple of
//! [`BLOCK_SIZE`]) travels in the initramfs beside its hash device
//! (`rootfs.verity`): block 0 is the superblock, the hash tree starts at
//! block 1, top level first (as veritysetup lays it out). The kernel command
//! line carries only the root hash ([`crate::cmdline::VERITY`]); everything
//! else is read from the superblock and checked here, and none of it can
//! change without changing the root hash (see docs/design.md, "The verified
//! root"):
//!
//! - the format (version 1, hash type 1, sha256, 4096-byte blocks) is fixed
//!   here, not taken from the superblock: a superblock saying otherwise is
//!   refused;
//! - the salt goes into every hash, the root hash included;
//! - the data size is bound through the salt: its last 8 bytes are the
//!   number of data blocks (little-endian), checked against the superblock
//!   and the data file, so a tree of another geometry needs another salt.

/// Data and hash block size in bytes.
pub const BLOCK_SIZE: u64 = 4096;
/// The hash algorithm, as the superblock and the dm table name it.
pub const ALGORITHM: &str = "sha256";
/// Bytes of a sha256 digest (and of the root hash).
pub const DIGEST_LEN: usize = 32;
/// Bytes of the salt.
pub const SALT_LEN: usize = 32;
/// Digests per hash block.
pub const HASHES_PER_BLOCK: u64 = BLOCK_SIZE / DIGEST_LEN as u64;
/// The superblock's size on disk; the rest of block 0 is zero.
pub const SUPERBLOCK_LEN: usize = 512;
/// The superblock's signature.
pub const SIGNATURE: &[u8; 8] = b"verity\0\0";
/// The most data blocks accepted: 2^40 (4 PiB), far above any root
/// filesystem, and low enough that no size computation overflows.
pub const MAX_DATA_BLOCKS: u64 = 1 << 40;

/// What the superblock says, once checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Superblock {
    /// The hash device's UUID, as stored (16 bytes).
    pub uuid: [u8; 16],
    /// Data blocks of [`BLOCK_SIZE`].
    pub data_blocks: u64,
    pub salt: [u8; SALT_LEN],
}

impl Superblock {
    /// The 512 bytes veritysetup writes (format version 1, hash type 1,
    /// sha256, 4096-byte blocks).
    pub fn render(&self) -> [u8; SUPERBLOCK_LEN] {
        let mut b = [0u8; SUPERBLOCK_LEN];
        b[0..8].copy_from_slice(SIGNATURE);
        b[8..12].copy_from_slice(&1u32.to_le_bytes());
        b[12..16].copy_from_slice(&1u32.to_le_bytes());
        b[16..32].copy_from_slice(&self.uuid);
        b[32..32 + ALGORITHM.len()].copy_from_slice(ALGORITHM.as_bytes());
        b[64..68].copy_from_slice(&(BLOCK_SIZE as u32).to_le_bytes());
        b[68..72].copy_from_slice(&(BLOCK_SIZE as u32).to_le_bytes());
        b[72..80].copy_from_slice(&self.data_blocks.to_le_bytes());
        b[80..82].copy_from_slice(&(SALT_LEN as u16).to_le_bytes());
        b[88..88 + SALT_LEN].copy_from_slice(&self.salt);
        b
    }

    /// Parses and checks block 0 of a hash device (at least the superblock;
    /// any bytes after it up to [`BLOCK_SIZE`] must be zero). Every field is
    /// checked: the fixed format, zero padding, the salt's binding of the
    /// data size.
    pub fn parse(block: &[u8]) -> Result<Superblock, String> {
        if block.len() < SUPERBLOCK_LEN {
            return Err(format!(
                "the verity superblock is {} bytes, less than {SUPERBLOCK_LEN}",
                block.len()
            ));
        }
        if block.len() as u64 > BLOCK_SIZE {
            return Err(format!(
                "block 0 of the hash device is {} bytes, more than {BLOCK_SIZE}",
                block.len()
            ));
        }
        let u32_at =
            |o: usize| u32::from_le_bytes([block[o], block[o + 1], block[o + 2], block[o + 3]]);
        if &block[0..8] != SIGNATURE {
            return Err("no verity superblock (signature \"verity\" missing)".into());
        }
        let (version, hash_type) = (u32_at(8), u32_at(12));
        if version != 1 || hash_type != 1 {
            return Err(format!(
                "verity superblock version {version}, hash type {hash_type}: only 1 and 1 \
                 (veritysetup's default) are used"
            ));
        }
        let alg = &block[32..64];
        let name_len = alg.iter().position(|&b| b == 0).unwrap_or(alg.len());
        if &alg[..name_len] != ALGORITHM.as_bytes() || alg[name_len..].iter().any(|&b| b != 0) {
            return Err(format!(
                "verity superblock names hash algorithm {:?}: only {ALGORITHM} is used",
                String::from_utf8_lossy(&alg[..name_len.min(16)])
            ));
        }
        let (data_bs, hash_bs) = (u32_at(64), u32_at(68));
        if u64::from(data_bs) != BLOCK_SIZE || u64::from(hash_bs) != BLOCK_SIZE {
            return Err(format!(
                "verity superblock block sizes {data_bs}/{hash_bs}: only {BLOCK_SIZE} is used"
            ));
        }
        let mut n = [0u8; 8];
        n.copy_from_slice(&block[72..80]);
        let data_blocks = u64::from_le_bytes(n);
        if data_blocks == 0 || data_blocks > MAX_DATA_BLOCKS {
            return Err(format!(
                "verity superblock counts {data_blocks} data blocks: 1 to {MAX_DATA_BLOCKS} \
                 are accepted"
            ));
        }
        let salt_len = u16::from_le_bytes([block[80], block[81]]);
        if usize::from(salt_len) != SALT_LEN {
            return Err(format!(
                "verity superblock salt is {salt_len} bytes: the image's is {SALT_LEN}"
            ));
        }
        let padding = block[82..88]
            .iter()
            .chain(&block[88 + SALT_LEN..])
            .any(|&b| b != 0);
        if padding {
            return Err("verity superblock has non-zero bytes in its padding".into());
        }
        let mut uuid = [0u8; 16];
        uuid.copy_from_slice(&block[16..32]);
        let mut salt = [0u8; SALT_LEN];
        salt.copy_from_slice(&block[88..88 + SALT_LEN]);
        if salt_blocks(&salt) != data_blocks {
            return Err(format!(
                "the verity salt is bound to {} data blocks, the superblock counts \
                 {data_blocks}",
                salt_blocks(&salt)
            ));
        }
        Ok(Superblock {
            uuid,
            data_blocks,
            salt,
        })
    }
}

/// The number of data blocks a salt is bound to: its last 8 bytes.
pub fn salt_blocks(salt: &[u8; SALT_LEN]) -> u64 {
    let mut n = [0u8; 8];
    n.copy_from_slice(&salt[SALT_LEN - 8..]);
    u64::from_le_bytes(n)
}

/// The size of each level of the hash tree in blocks, level 0 (the hashes
/// of the data blocks) first, as cryptsetup and the kernel count them: as
/// many levels as it takes to come down to one block; none for one data
/// block (the root hash is then the data block's hash).
pub fn levels(data_blocks: u64) -> Vec<u64> {
    let mut out = Vec::new();
    let mut n = data_blocks;
    while n > 1 {
        n = n.div_ceil(HASHES_PER_BLOCK);
        out.push(n);
    }
    out
}

/// The hash device's size in blocks: the superblock and every level.
pub fn hash_device_blocks(data_blocks: u64) -> u64 {
    1 + levels(data_blocks).iter().sum::<u64>()
}

/// A root hash from its hex form on the command line (64 hex digits).
pub fn parse_root_hash(hex: &str) -> Result<[u8; DIGEST_LEN], String> {
    let bad = || {
        let short: String = hex.chars().take(70).collect();
        format!(
            "{}={short:?} is not a root hash: it must be {} hex digits",
            crate::cmdline::VERITY,
            DIGEST_LEN * 2
        )
    };
    if hex.len() != DIGEST_LEN * 2 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(bad());
    }
    let mut out = [0u8; DIGEST_LEN];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
    }
    Ok(out)
}

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sb(n: u64) -> Superblock {
        let mut salt = [7u8; SALT_LEN];
        salt[SALT_LEN - 8..].copy_from_slice(&n.to_le_bytes());
        Superblock {
            uuid: [1; 16],
            data_blocks: n,
            salt,
        }
    }

    #[test]
    fn superblock_round_trip() {
        let s = sb(129);
        let b = s.render();
        assert_eq!(Superblock::parse(&b), Ok(s.clone()));
        let mut block = b.to_vec();
        block.resize(BLOCK_SIZE as usize, 0);
        assert_eq!(Superblock::parse(&block), Ok(s));
    }

    #[test]
    fn superblock_refusals() {
        let good = sb(5).render();
        let refuse = |f: &dyn Fn(&mut Vec<u8>), why: &str| {
            let mut b = good.to_vec();
            f(&mut b);
            let e = Superblock::parse(&b).unwrap_err();
            assert!(e.contains(why), "{why}: {e}");
        };
        refuse(&|b| b.truncate(100), "less than");
        refuse(&|b| b.resize(5000, 0), "more than");
        refuse(&|b| b[0] = b'V', "signature");
        refuse(&|b| b[8] = 0, "version 0");
        refuse(&|b| b[12] = 0, "hash type 0");
        refuse(&|b| b[32..38].copy_from_slice(b"sha512"), "sha512");
        refuse(&|b| b[40] = 1, "algorithm");
        refuse(&|b| b[65] = 2, "block sizes");
        refuse(&|b| b[72..80].fill(0), "0 data blocks");
        refuse(&|b| b[72..80].fill(0xff), "data blocks");
        refuse(&|b| b[80] = 16, "salt is 16 bytes");
        refuse(&|b| b[84] = 1, "padding");
        refuse(&|b| b[300] = 1, "padding");
        refuse(&|b| b.resize(4096, 1), "padding");
        // The salt's binding of the size: a superblock claiming 6 blocks
        // with the salt of 5.
        refuse(&|b| b[72] = 6, "bound to 5 data blocks");
    }

    #[test]
    fn tree_geometry() {
        assert_eq!(levels(1), Vec::<u64>::new());
        assert_eq!(levels(2), vec![1]);
        assert_eq!(levels(128), vec![1]);
        assert_eq!(levels(129), vec![2, 1]);
        assert_eq!(levels(128 * 128), vec![128, 1]);
        assert_eq!(levels(128 * 128 + 1), vec![129, 2, 1]);
        assert_eq!(hash_device_blocks(129), 4);
        assert_eq!(levels(MAX_DATA_BLOCKS).len(), 6);
    }

    #[test]
    fn root_hashes() {
        let h = "00ff".repeat(16);
        assert_eq!(parse_root_hash(&h).unwrap()[1], 0xff);
        assert_eq!(hex(&parse_root_hash(&h).unwrap()), h);
        assert!(parse_root_hash("00").is_err());
        assert!(parse_root_hash(&"g".repeat(64)).is_err());
        assert!(parse_root_hash(&"é".repeat(32)).is_err());
    }
}
