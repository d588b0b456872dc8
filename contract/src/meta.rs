//! META: node metadata in Talos's ADV layout.
//!
//! The META partition holds two copies of one 256 KiB block (copy 0 at offset
//! 0, copy 1 at offset [`BLOCK_LEN`]). A block is, all integers big-endian:
//!
//! ```text
//! 0x00000  u32         MAGIC1 (0x5a4b3c2d)
//! 0x00004  u32 tag     u32 size     size bytes of value
//! ...      more records, in ascending tag order; tag 0 or the end stops
//! -0x0024  [u8; 32]    SHA-256 of the whole block with these 32 bytes zeroed
//! -0x0004  u32         MAGIC2 (0xa5b4c3d2)
//! ```
//!
//! A reader takes the first copy that checks out. A writer writes copy 1,
//! flushes, then writes copy 0, so one valid copy survives a power cut.
//! Records are written in tag order so that equal contents give equal bytes.

use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::fmt;

pub const BLOCK_LEN: usize = 256 * 1024;
pub const COPIES: usize = 2;
/// Bytes of the META partition used by the two copies.
pub const AREA_LEN: usize = BLOCK_LEN * COPIES;
pub const MAGIC1: u32 = 0x5a4b_3c2d;
pub const MAGIC2: u32 = 0xa5b4_c3d2;
const TRAILER: usize = 36;
const RECORD_HEADER: usize = 8;

/// The tags we define. Values are UTF-8 text unless said otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u32)]
pub enum Tag {
    /// Name of the image that created this disk.
    ImageName = 0x01,
    /// The slot booted by default: `A` or `B`.
    DefaultSlot = 0x10,
    /// State of slot A: see [`SlotRecord`].
    SlotA = 0x11,
    /// State of slot B: see [`SlotRecord`].
    SlotB = 0x12,
    /// A pending upgrade (from, to, versions); empty when none.
    PendingUpgrade = 0x20,
    /// Upgrade and rollback history, one event per line, oldest first.
    History = 0x21,
    /// The next boot formats EPHEMERAL afresh (an upgrade over the node API
    /// with `--preserve=false`): the value says which upgrade asked for it.
    /// Removed once EPHEMERAL is formatted and mounted.
    WipeEphemeral = 0x22,
    /// The highest security version blessed on this disk (decimal): an
    /// upgrade or a rollback to a lower one is refused unless an admin
    /// allows that one downgrade ([`crate::version::check_security`]).
    /// Raised only when a slot is blessed; absent: 0.
    SecurityFloor = 0x23,
    /// Public keys (PEM, concatenated) whose signatures the installer
    /// accepts for upgrades of this disk, one enough: the disk's root of
    /// trust when it has no [`Tag::TrustRoot`] (version 1, threshold 1,
    /// these keys). Removed when a root of trust is promoted, so that an
    /// older runtime rolled back to refuses payloads rather than trust a
    /// retired key.
    TrustedKeys = 0x30,
    /// The disk boots signed UKIs under Secure Boot: the db certificates
    /// (PEM, one or more) its firmware is known to trust, one of which
    /// every UKI an upgrade installs must be signed for: the one it was
    /// enrolled with, and those the runtime added to firmware's db since,
    /// less those it revoked through dbx ([`Tag::SecureBootUpdates`]).
    /// Absent: no Secure Boot.
    SecureBoot = 0x31,
    /// The pending upgrade leaves Secure Boot (`imager upgrade
    /// --change-secure-boot` to a version without it): once that version is
    /// blessed, [`Tag::SecureBoot`] goes; when it falls back or is rolled
    /// back, this record goes and [`Tag::SecureBoot`] stays.
    SecureBootLeaving = 0x32,
    /// The pending upgrade enters Secure Boot (`imager upgrade
    /// --change-secure-boot` from a disk without it to a Secure Boot
    /// version): the db certificate (PEM) the new version is signed for.
    /// Once that version is blessed it becomes [`Tag::SecureBoot`]; when it
    /// falls back or is rolled back, this record goes and the disk stays
    /// without Secure Boot.
    SecureBootEntering = 0x33,
    /// The disk's root of trust (`payload::root`, `root.json`'s canonical
    /// bytes): its version, its keys, and how many of them must sign a
    /// payload. Absent: [`Tag::TrustedKeys`] stands for it.
    TrustRoot = 0x34,
    /// The root of trust the pending upgrade brings (accepted by the
    /// current root before the upgrade's first write): once that version
    /// is blessed it becomes [`Tag::TrustRoot`], in the blessing's META
    /// write; when it falls back or is rolled back, this record goes and
    /// the disk keeps its root.
    TrustRootNext = 0x35,
    /// The Secure Boot updates (signed appends to db and dbx) the blessed
    /// version wants in firmware (`payload::efivar::Record`: the version,
    /// then the update files): the runtime of that version writes what
    /// firmware lacks. Replaced when an upgrade is blessed.
    SecureBootUpdates = 0x36,
    /// The Secure Boot updates of the pending upgrade's version: once it
    /// is blessed they become [`Tag::SecureBootUpdates`] (a version
    /// without updates keeps the disk's); when it falls back or is rolled
    /// back, this record goes.
    SecureBootUpdatesNext = 0x37,
    /// The node API's cluster CA certificate (PEM): the one root its
    /// clients' certificates must chain to (`imager node provision`).
    NodeCa = 0x40,
    /// The node's own certificate (PEM), issued by [`Tag::NodeCa`].
    NodeCert = 0x41,
    /// The node's private key (PEM). Never shown ([`Tag::is_secret`]).
    NodeKey = 0x42,
    /// The node's own hostname, network and DNS servers
    /// ([`crate::settings`]): written by `imager install`, `imager node
    /// provision` and the live installer; read by the runtime before the
    /// image's default.
    NodeSettings = 0x43,
    /// CA certificates (PEM) the node trusts for its registries' HTTPS
    /// instead of the Mozilla roots (`imager node provision
    /// --registry-ca`): a private registry's CA. Absent: the Mozilla
    /// roots.
    RegistryCa = 0x44,
}

impl Tag {
    pub const ALL: [Tag; 21] = [
        Tag::ImageName,
        Tag::DefaultSlot,
        Tag::SlotA,
        Tag::SlotB,
        Tag::PendingUpgrade,
        Tag::History,
        Tag::WipeEphemeral,
        Tag::SecurityFloor,
        Tag::TrustedKeys,
        Tag::SecureBoot,
        Tag::SecureBootLeaving,
        Tag::SecureBootEntering,
        Tag::TrustRoot,
        Tag::TrustRootNext,
        Tag::SecureBootUpdates,
        Tag::SecureBootUpdatesNext,
        Tag::NodeCa,
        Tag::NodeCert,
        Tag::NodeKey,
        Tag::NodeSettings,
        Tag::RegistryCa,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Tag::ImageName => "image-name",
            Tag::DefaultSlot => "default-slot",
            Tag::SlotA => "slot-a",
            Tag::SlotB => "slot-b",
            Tag::PendingUpgrade => "pending-upgrade",
            Tag::History => "history",
            Tag::WipeEphemeral => "wipe-ephemeral",
            Tag::SecurityFloor => "security-floor",
            Tag::TrustedKeys => "trusted-keys",
            Tag::SecureBoot => "secure-boot",
            Tag::SecureBootLeaving => "secure-boot-leaving",
            Tag::SecureBootEntering => "secure-boot-entering",
            Tag::TrustRoot => "trust-root",
            Tag::TrustRootNext => "trust-root-next",
            Tag::SecureBootUpdates => "secure-boot-updates",
            Tag::SecureBootUpdatesNext => "secure-boot-updates-next",
            Tag::NodeCa => "node-ca",
            Tag::NodeCert => "node-cert",
            Tag::NodeKey => "node-key",
            Tag::NodeSettings => "node-settings",
            Tag::RegistryCa => "registry-ca",
        }
    }

    /// Whether the value is a secret that tools never print.
    pub fn is_secret(self) -> bool {
        self == Tag::NodeKey
    }

    pub fn from_u32(v: u32) -> Option<Tag> {
        Tag::ALL.into_iter().find(|t| *t as u32 == v)
    }

    /// The tag holding the state of `slot`.
    pub fn for_slot(slot: crate::Slot) -> Tag {
        match slot {
            crate::Slot::A => Tag::SlotA,
            crate::Slot::B => Tag::SlotB,
        }
    }
}

/// Why a META block was rejected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MetaError {
    Short(usize),
    BadMagic1(u32),
    BadMagic2(u32),
    Checksum,
    Overrun { tag: u32, size: u32 },
    TooLarge(usize),
    NoValidCopy(Box<MetaError>, Box<MetaError>),
}

impl fmt::Display for MetaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MetaError::Short(n) => write!(f, "META block is {n} bytes, expected {BLOCK_LEN}"),
            MetaError::BadMagic1(m) => write!(f, "META magic {m:#010x}, expected {MAGIC1:#010x}"),
            MetaError::BadMagic2(m) => {
                write!(f, "META end magic {m:#010x}, expected {MAGIC2:#010x}")
            }
            MetaError::Checksum => write!(f, "META checksum does not match its contents"),
            MetaError::Overrun { tag, size } => {
                write!(
                    f,
                    "META record tag {tag} of {size} bytes runs past the block"
                )
            }
            MetaError::TooLarge(n) => write!(f, "META values need {n} bytes, more than a block"),
            MetaError::NoValidCopy(a, b) => {
                write!(f, "neither META copy is valid (copy 0: {a}; copy 1: {b})")
            }
        }
    }
}

impl std::error::Error for MetaError {}

/// A Secure Boot updates record (`payload::efivar::Record`: `version V`,
/// then `NAME HEX` lines) as one line: the version, each file's name and
/// size, escaped; the bytes are not shown.
fn updates_summary(v: &str) -> String {
    let mut lines = v.lines();
    let mut out = crate::text::quote(lines.next().unwrap_or_default(), 80);
    for l in lines.take(8) {
        let (name, hex) = l.split_once(' ').unwrap_or((l, ""));
        out.push_str(&format!(
            ", {} ({} bytes)",
            crate::text::quote(name, 40),
            hex.len() / 2
        ));
    }
    out
}

/// The decoded contents of META: raw tag numbers to values, in tag order.
/// Unknown tags are kept so that an older tool never drops a newer one's data.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Meta {
    pub tags: BTreeMap<u32, Vec<u8>>,
}

impl Meta {
    pub fn get(&self, tag: Tag) -> Option<&str> {
        self.tags
            .get(&(tag as u32))
            .and_then(|v| std::str::from_utf8(v).ok())
    }

    pub fn set(&mut self, tag: Tag, value: impl Into<Vec<u8>>) {
        self.tags.insert(tag as u32, value.into());
    }

    pub fn remove(&mut self, tag: Tag) {
        self.tags.remove(&(tag as u32));
    }

    /// Encodes one block.
    pub fn encode_block(&self) -> Result<Vec<u8>, MetaError> {
        let needed: usize = 4
            + TRAILER
            + self
                .tags
                .values()
                .map(|v| RECORD_HEADER + v.len())
                .sum::<usize>();
        if needed > BLOCK_LEN {
            return Err(MetaError::TooLarge(needed));
        }
        let mut buf = vec![0u8; BLOCK_LEN];
        buf[..4].copy_from_slice(&MAGIC1.to_be_bytes());
        let mut at = 4;
        for (tag, value) in &self.tags {
            buf[at..at + 4].copy_from_slice(&tag.to_be_bytes());
            buf[at + 4..at + 8].copy_from_slice(&(value.len() as u32).to_be_bytes());
            buf[at + 8..at + 8 + value.len()].copy_from_slice(value);
            at += RECORD_HEADER + value.len();
        }
        buf[BLOCK_LEN - 4..].copy_from_slice(&MAGIC2.to_be_bytes());
        let sum = Sha256::digest(&buf);
        buf[BLOCK_LEN - TRAILER..BLOCK_LEN - 4].copy_from_slice(&sum);
        Ok(buf)
    }

    /// Encodes the whole area: both copies.
    pub fn encode(&self) -> Result<Vec<u8>, MetaError> {
        let block = self.encode_block()?;
        let mut out = Vec::with_capacity(AREA_LEN);
        out.extend_from_slice(&block);
        out.extend_from_slice(&block);
        Ok(out)
    }

    /// Decodes one block.
    pub fn decode_block(block: &[u8]) -> Result<Meta, MetaError> {
        if block.len() != BLOCK_LEN {
            return Err(MetaError::Short(block.len()));
        }
        let be = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
        let m1 = be(&block[..4]);
        if m1 != MAGIC1 {
            return Err(MetaError::BadMagic1(m1));
        }
        let m2 = be(&block[BLOCK_LEN - 4..]);
        if m2 != MAGIC2 {
            return Err(MetaError::BadMagic2(m2));
        }
        let mut h = Sha256::new();
        h.update(&block[..BLOCK_LEN - TRAILER]);
        h.update([0u8; 32]);
        h.update(&block[BLOCK_LEN - 4..]);
        if h.finalize().as_slice() != &block[BLOCK_LEN - TRAILER..BLOCK_LEN - 4] {
            return Err(MetaError::Checksum);
        }
        let mut data = &block[4..BLOCK_LEN - TRAILER];
        let mut meta = Meta::default();
        while data.len() >= RECORD_HEADER {
            let tag = be(&data[..4]);
            if tag == 0 {
                break;
            }
            let size = be(&data[4..8]);
            let end = RECORD_HEADER
                .checked_add(size as usize)
                .filter(|e| *e <= data.len())
                .ok_or(MetaError::Overrun { tag, size })?;
            meta.tags.insert(tag, data[RECORD_HEADER..end].to_vec());
            data = &data[end..];
        }
        Ok(meta)
    }

    /// Decodes the area (both copies), taking the first valid copy. Returns
    /// the contents and the index of the copy used.
    pub fn decode(area: &[u8]) -> Result<(Meta, usize), MetaError> {
        if area.len() < AREA_LEN {
            return Err(MetaError::Short(area.len()));
        }
        match Meta::decode_block(&area[..BLOCK_LEN]) {
            Ok(m) => Ok((m, 0)),
            Err(e0) => match Meta::decode_block(&area[BLOCK_LEN..AREA_LEN]) {
                Ok(m) => Ok((m, 1)),
                Err(e1) => Err(MetaError::NoValidCopy(Box::new(e0), Box::new(e1))),
            },
        }
    }

    /// Human-readable `name = value` pairs in tag order, for inspect; a
    /// secret's value is replaced by its length.
    pub fn entries(&self) -> Vec<(String, String)> {
        self.tags
            .iter()
            .map(|(t, v)| {
                let tag = Tag::from_u32(*t);
                let name = tag
                    .map(|t| t.name().to_string())
                    .unwrap_or_else(|| format!("tag-{t:#x}"));
                if tag.is_some_and(Tag::is_secret) {
                    return (name, format!("(secret, {} bytes, not shown)", v.len()));
                }
                if matches!(
                    tag,
                    Some(Tag::SecureBootUpdates | Tag::SecureBootUpdatesNext)
                ) {
                    return (name, updates_summary(&String::from_utf8_lossy(v)));
                }
                (name, String::from_utf8_lossy(v).into_owned())
            })
            .collect()
    }
}

/// Status of a slot in the bootloader-neutral slot model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotStatus {
    /// Nothing installed.
    Empty,
    /// Installed and booted to ready at least once.
    Good,
    /// Installed, waiting for its first boot to reach ready.
    Pending,
    /// Failed to reach ready; not to be booted unless forced.
    Bad,
}

impl SlotStatus {
    pub fn name(self) -> &'static str {
        match self {
            SlotStatus::Empty => "empty",
            SlotStatus::Good => "good",
            SlotStatus::Pending => "pending",
            SlotStatus::Bad => "bad",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        [Self::Empty, Self::Good, Self::Pending, Self::Bad]
            .into_iter()
            .find(|v| v.name() == s)
    }
}

/// The value of a [`Tag::SlotA`] / [`Tag::SlotB`] record:
/// `status=good version=1.2.0`, and ` security=N` when the slot's signed
/// manifest carries a security version above 0 (so that records of
/// payloads without one stay as they were; runtimes that predate the word
/// pass over it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotRecord {
    pub status: SlotStatus,
    pub version: String,
    /// The security version of the slot's payload (0: none).
    pub security: u64,
}

impl SlotRecord {
    pub fn render(&self) -> String {
        let mut s = format!("status={} version={}", self.status.name(), self.version);
        if self.security > 0 {
            s.push_str(&format!(" security={}", self.security));
        }
        s
    }

    pub fn parse(s: &str) -> Result<SlotRecord, String> {
        let mut status = None;
        let mut version = String::new();
        let mut security = 0;
        for word in s.split_whitespace() {
            match word.split_once('=') {
                Some(("status", v)) => {
                    status = Some(
                        SlotStatus::parse(v)
                            .ok_or(format!("unknown slot status {}", crate::text::excerpt(v)))?,
                    )
                }
                Some(("version", v)) => version = v.to_string(),
                Some(("security", v)) => {
                    security = v.parse().map_err(|_| {
                        format!(
                            "security version {} is not a number",
                            crate::text::excerpt(v)
                        )
                    })?
                }
                _ => {}
            }
        }
        Ok(SlotRecord {
            status: status.ok_or("slot record has no status")?,
            version,
            security,
        })
    }
}

#[cfg(test)]
mod updates_summary_tests {
    use super::*;

    #[test]
    fn secure_boot_updates_are_summed_up_not_dumped() {
        let mut m = Meta::default();
        m.set(
            Tag::SecureBootUpdates,
            "version 0.2.0\ndbx.append.auth 00ff10\n",
        );
        m.set(Tag::SecureBootUpdatesNext, "version \u{1b}[2J\n");
        let e = m.entries();
        assert_eq!(
            e[0],
            (
                "secure-boot-updates".to_string(),
                "\"version 0.2.0\", \"dbx.append.auth\" (3 bytes)".to_string()
            )
        );
        assert!(!e[1].1.contains('\u{1b}'), "{:?}", e[1]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Meta {
        let mut m = Meta::default();
        m.set(Tag::DefaultSlot, "A");
        m.set(Tag::SlotA, "status=good version=1.0");
        m.tags.insert(0x7f, vec![0, 1, 2]);
        m
    }

    #[test]
    fn round_trip_and_layout() {
        let m = sample();
        let area = m.encode().unwrap();
        assert_eq!(area.len(), AREA_LEN);
        assert_eq!(&area[..4], &MAGIC1.to_be_bytes());
        assert_eq!(&area[BLOCK_LEN - 4..BLOCK_LEN], &MAGIC2.to_be_bytes());
        // First record: the lowest tag, big-endian tag and size.
        assert_eq!(&area[4..8], &(Tag::DefaultSlot as u32).to_be_bytes());
        assert_eq!(&area[8..12], &1u32.to_be_bytes());
        assert_eq!(area[12], b'A');
        let (back, copy) = Meta::decode(&area).unwrap();
        assert_eq!(copy, 0);
        assert_eq!(back, m);
        assert_eq!(back.get(Tag::DefaultSlot), Some("A"));
    }

    #[test]
    fn checksum_is_sha256_of_block_with_zeroed_sum() {
        let block = sample().encode_block().unwrap();
        let mut zeroed = block.clone();
        zeroed[BLOCK_LEN - 36..BLOCK_LEN - 4].fill(0);
        assert_eq!(
            Sha256::digest(&zeroed).as_slice(),
            &block[BLOCK_LEN - 36..BLOCK_LEN - 4]
        );
    }

    #[test]
    fn falls_back_to_second_copy_and_rejects_both_bad() {
        let mut area = sample().encode().unwrap();
        area[100] ^= 1;
        let (m, copy) = Meta::decode(&area).unwrap();
        assert_eq!((m, copy), (sample(), 1));
        area[BLOCK_LEN + 4] ^= 0xff;
        assert!(matches!(
            Meta::decode(&area),
            Err(MetaError::NoValidCopy(..))
        ));
    }

    #[test]
    fn overrun_and_overflow_are_errors() {
        let mut block = Meta::default().encode_block().unwrap();
        block[4..8].copy_from_slice(&5u32.to_be_bytes());
        block[8..12].copy_from_slice(&u32::MAX.to_be_bytes());
        block[BLOCK_LEN - 36..BLOCK_LEN - 4].fill(0);
        let sum = Sha256::digest(&block);
        block[BLOCK_LEN - 36..BLOCK_LEN - 4].copy_from_slice(&sum);
        assert!(matches!(
            Meta::decode_block(&block),
            Err(MetaError::Overrun { tag: 5, .. })
        ));
        let mut big = Meta::default();
        big.set(Tag::History, vec![b'x'; BLOCK_LEN]);
        assert!(matches!(big.encode_block(), Err(MetaError::TooLarge(_))));
    }

    #[test]
    fn tags_are_unique_and_the_node_key_is_never_shown() {
        let mut seen = std::collections::BTreeSet::new();
        for t in Tag::ALL {
            assert!(seen.insert(t as u32), "{t:?}");
            assert_eq!(Tag::from_u32(t as u32), Some(t));
        }
        let mut m = Meta::default();
        let key = "-----BEGIN PRIVATE KEY-----\nMIGHAgEA\n-----END PRIVATE KEY-----\n";
        m.set(Tag::NodeKey, key);
        m.set(Tag::NodeCert, "CERT");
        let shown = format!("{:?}", m.entries());
        assert!(
            !shown.contains("MIGHAgEA") && !shown.contains("PRIVATE"),
            "{shown}"
        );
        assert!(
            shown.contains("node-key") && shown.contains("CERT"),
            "{shown}"
        );
    }

    #[test]
    fn slot_record_round_trip() {
        let r = SlotRecord {
            status: SlotStatus::Pending,
            version: "2.0".into(),
            security: 0,
        };
        // Without a security version, the record is as it always was.
        assert_eq!(r.render(), "status=pending version=2.0");
        assert_eq!(SlotRecord::parse(&r.render()).unwrap(), r);
        let r = SlotRecord { security: 7, ..r };
        assert_eq!(r.render(), "status=pending version=2.0 security=7");
        assert_eq!(SlotRecord::parse(&r.render()).unwrap(), r);
        assert!(SlotRecord::parse("version=1").is_err());
        assert!(SlotRecord::parse("status=good version=1 security=-1").is_err());
        assert!(SlotRecord::parse("status=good version=1 security=x\u{1b}").is_err());
    }
}
