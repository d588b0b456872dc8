//! Secure Boot's signature databases, `db` and `dbx`, as firmware keeps
//! them and as signed appends change them (docs/secureboot.md, "Rotating
//! the db key and revoking UKIs"). UEFI 2.10, 32.4.1 (`EFI_SIGNATURE_LIST`)
//! and 8.2 (`SetVariable`, `EFI_VARIABLE_AUTHENTICATION_2`).
//!
//! - A variable's value is a run of `EFI_SIGNATURE_LIST`s: `SignatureType`
//!   (GUID), `SignatureListSize`, `SignatureHeaderSize`, `SignatureSize`
//!   (u32 little-endian each), the header, then entries of `SignatureSize`
//!   bytes: the owner's GUID and the data (a SHA-256 digest for
//!   `EFI_CERT_SHA256_GUID`, a DER certificate for `EFI_CERT_X509_GUID`).
//! - An update file (`db.append.auth`, `dbx.append.auth`, written by
//!   `imager secureboot enrol-files`) is an `EFI_TIME`, a
//!   `WIN_CERTIFICATE_UEFI_GUID` (its `dwLength` first) whose PKCS#7 the
//!   firmware checks against KEK, then the lists to append.
//!
//! This module reads both (the firmware's variables and the update files
//! are untrusted bytes: bounded, never panicking; fuzz target `efivar`) and
//! says whether a variable already holds every entry of an update. It does
//! not check the KEK's signature: firmware does, when the update is
//! written.

use anyhow::{Context, Result, bail, ensure};

/// `EFI_IMAGE_SECURITY_DATABASE_GUID` as EFI lays it out: the vendor of
/// `db` and `dbx`.
pub const IMAGE_SECURITY_DATABASE: [u8; 16] = guid(
    0xd719b2cb,
    0x3d3a,
    0x4596,
    *b"\xa3\xbc\xda\xd0\x0e\x67\x65\x6f",
);
/// `EFI_CERT_X509_GUID`: entries are DER certificates.
pub const CERT_X509: [u8; 16] = guid(
    0xa5c059a1,
    0x94e4,
    0x4aa7,
    *b"\x87\xb5\xab\x15\x5c\x2b\xf0\x72",
);
/// `EFI_CERT_SHA256_GUID`: entries are SHA-256 digests (for an image, its
/// Authenticode digest).
pub const CERT_SHA256: [u8; 16] = guid(
    0xc1c41626,
    0x504c,
    0x4092,
    *b"\xac\xa9\x41\xf9\x36\x93\x43\x28",
);
/// NON_VOLATILE | BOOTSERVICE_ACCESS | RUNTIME_ACCESS |
/// TIME_BASED_AUTHENTICATED_WRITE_ACCESS.
pub const ATTRIBUTES: u32 = 0x01 | 0x02 | 0x04 | 0x20;
/// `EFI_VARIABLE_APPEND_WRITE`: the update adds to the variable.
pub const APPEND_WRITE: u32 = 0x40;
/// The longest update file: ours hold a few certificates and digests (a
/// db certificate is about 1 KiB). META keeps a version's updates, and a
/// pending upgrade's beside them, as hex: four such files at most fill
/// half of META's 256 KiB block.
pub const MAX_LEN: usize = 16 * 1024;
/// The longest variable read from firmware: Microsoft's whole dbx is
/// about 25 KiB, db a few certificates.
pub const MAX_VAR_LEN: usize = 256 * 1024;
/// The most entries a variable or an update may hold.
pub const MAX_ENTRIES: usize = 4096;

/// An EFI GUID's bytes: the first three fields little-endian.
pub const fn guid(a: u32, b: u16, c: u16, d: [u8; 8]) -> [u8; 16] {
    let a = a.to_le_bytes();
    let b = b.to_le_bytes();
    let c = c.to_le_bytes();
    [
        a[0], a[1], a[2], a[3], b[0], b[1], c[0], c[1], d[0], d[1], d[2], d[3], d[4], d[5], d[6],
        d[7],
    ]
}

/// A variable an update changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Var {
    /// The signature database: what may boot.
    Db,
    /// The forbidden signature database: what may not.
    Dbx,
}

impl Var {
    pub fn name(self) -> &'static str {
        match self {
            Var::Db => "db",
            Var::Dbx => "dbx",
        }
    }

    /// The update file's name for this variable.
    pub fn file_name(self) -> &'static str {
        match self {
            Var::Db => "db.append.auth",
            Var::Dbx => "dbx.append.auth",
        }
    }

    /// The variable of an update file's name; `None` for any other name.
    pub fn of_file(name: &str) -> Option<Var> {
        [Var::Db, Var::Dbx]
            .into_iter()
            .find(|v| v.file_name() == name)
    }

    /// efivarfs's name of the variable: `NAME-GUID`.
    pub fn efivarfs_name(self) -> String {
        let g = IMAGE_SECURITY_DATABASE;
        let hex = |b: &[u8]| hex::encode(b);
        let rev = |b: &[u8]| hex::encode(b.iter().rev().copied().collect::<Vec<u8>>());
        format!(
            "{}-{}-{}-{}-{}-{}",
            self.name(),
            rev(&g[0..4]),
            rev(&g[4..6]),
            rev(&g[6..8]),
            hex(&g[8..10]),
            hex(&g[10..16])
        )
    }
}

/// One entry of a signature list.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Entry {
    /// An Authenticode (or file) SHA-256 digest.
    Sha256([u8; 32]),
    /// A DER certificate.
    X509(Vec<u8>),
}

impl Entry {
    /// A short description for a console line (never the bytes).
    pub fn describe(&self) -> String {
        match self {
            Entry::Sha256(d) => format!("sha256 {}", hex::encode(d)),
            Entry::X509(der) => {
                use sha2::Digest;
                format!(
                    "certificate sha256 {}",
                    hex::encode(sha2::Sha256::digest(der))
                )
            }
        }
    }
}

/// The entries of a run of signature lists, in order; entries of other
/// types (firmware may hold them) are skipped. Refuses a list whose sizes
/// do not add up, and more than [`MAX_ENTRIES`] entries.
pub fn parse_lists(mut b: &[u8]) -> Result<Vec<Entry>> {
    let mut out = Vec::new();
    while !b.is_empty() {
        ensure!(b.len() >= 28, "a signature list's header is cut short");
        let u32_at = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]) as usize;
        let (list, header, size) = (u32_at(16), u32_at(20), u32_at(24));
        ensure!(
            list >= 28 && list <= b.len(),
            "a signature list claims {list} bytes, {} are left",
            b.len()
        );
        let body = list - 28;
        ensure!(
            header <= body,
            "a signature list's header is longer than the list"
        );
        let entries = body - header;
        ensure!(
            size > 16 && entries % size == 0,
            "a signature list's entries ({entries} bytes) are not a whole number of {size}-byte entries"
        );
        let ty: [u8; 16] = b[..16].try_into().context("a signature list's type")?;
        for e in b[28 + header..list].chunks_exact(size) {
            let data = &e[16..];
            let entry = match ty {
                CERT_SHA256 => {
                    let d: [u8; 32] = data
                        .try_into()
                        .ok()
                        .with_context(|| format!("a SHA-256 entry of {} bytes", data.len()))?;
                    Entry::Sha256(d)
                }
                CERT_X509 => Entry::X509(data.to_vec()),
                _ => continue,
            };
            ensure!(
                out.len() < MAX_ENTRIES,
                "more than {MAX_ENTRIES} signature entries"
            );
            out.push(entry);
        }
        b = &b[list..];
    }
    Ok(out)
}

/// A signed append, read: the variable it changes and the entries it adds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Update {
    pub var: Var,
    pub entries: Vec<Entry>,
}

/// The update file `name` (`db.append.auth` or `dbx.append.auth`): its
/// authentication header is skipped whole (firmware checks it), the lists
/// after it read. Refuses another name, no entries, or a digest in db
/// (not what this project writes; a certificate in dbx is refused by
/// `secureboot::updates`).
pub fn parse_update(name: &str, bytes: &[u8]) -> Result<Update> {
    let var = Var::of_file(name).with_context(|| {
        format!(
            "{}: a Secure Boot update is named db.append.auth or dbx.append.auth (imager \
             secureboot enrol-files writes them)",
            contract::text::quote(name, 64)
        )
    })?;
    ensure!(
        bytes.len() <= MAX_LEN,
        "{name} is longer than {MAX_LEN} bytes"
    );
    ensure!(
        bytes.len() >= 16 + 24,
        "{name} is too short for its authentication header"
    );
    let len = u32::from_le_bytes([bytes[16], bytes[17], bytes[18], bytes[19]]) as usize;
    ensure!(
        len >= 24 && len <= bytes.len() - 16,
        "{name}: its signature claims {len} bytes, {} are there",
        bytes.len() - 16
    );
    ensure!(
        bytes[20..22] == 0x0200u16.to_le_bytes() && bytes[22..24] == 0x0ef1u16.to_le_bytes(),
        "{name} is not a time-based authenticated variable update (WIN_CERTIFICATE_UEFI_GUID)"
    );
    let entries = parse_lists(&bytes[16 + len..]).with_context(|| name.to_string())?;
    if entries.is_empty() {
        bail!("{name} adds nothing");
    }
    if var == Var::Db && entries.iter().any(|e| matches!(e, Entry::Sha256(_))) {
        bail!("{name} adds digests to db: only certificates are added to db");
    }
    Ok(Update { var, entries })
}

/// The Secure Boot updates a version wants in firmware, as META keeps
/// them (`secure-boot-updates`, and `secure-boot-updates-next` while the
/// upgrade that brings them is on trial): the version, then one line per
/// update file, `NAME HEX`. The runtime running that version applies them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub version: String,
    /// The update files by name, each read by [`parse_update`].
    pub updates: Vec<(String, Vec<u8>)>,
}

impl Record {
    /// The record of `version`'s update files (each checked).
    pub fn new(version: &str, updates: Vec<(String, Vec<u8>)>) -> Result<Record> {
        ensure!(
            !version.is_empty() && !version.chars().any(|c| c.is_whitespace() || c.is_control()),
            "a version of {} cannot name Secure Boot updates",
            contract::text::quote(version, 64)
        );
        let mut vars = Vec::new();
        for (name, bytes) in &updates {
            let var = parse_update(name, bytes)?.var;
            ensure!(!vars.contains(&var), "{name} twice");
            vars.push(var);
        }
        Ok(Record {
            version: version.to_string(),
            updates,
        })
    }

    pub fn to_meta(&self) -> String {
        let mut s = format!("version {}\n", self.version);
        for (name, bytes) in &self.updates {
            s.push_str(&format!("{name} {}\n", hex::encode(bytes)));
        }
        s
    }

    /// META's record, read back; every update in it read by
    /// [`parse_update`].
    pub fn from_meta(s: &str) -> Result<Record> {
        ensure!(
            s.len() <= 3 * MAX_LEN,
            "the record is longer than {} bytes",
            3 * MAX_LEN
        );
        let mut lines = s.lines();
        let version = lines
            .next()
            .and_then(|l| l.strip_prefix("version "))
            .context("the record does not start with its version")?;
        let mut updates = Vec::new();
        for l in lines {
            let (name, hex_bytes) = l.split_once(' ').context("a line without a name")?;
            let bytes = hex::decode(hex_bytes)
                .map_err(|_| anyhow::anyhow!("{} is not hex", contract::text::quote(name, 64)))?;
            ensure!(updates.len() < 2, "more than two updates");
            updates.push((name.to_string(), bytes));
        }
        Record::new(version, updates)
    }
}

/// The entries of `update` that the variable's value `held` lacks.
pub fn missing<'a>(held: &[Entry], update: &'a Update) -> Vec<&'a Entry> {
    update
        .entries
        .iter()
        .filter(|e| !held.contains(e))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(ty: [u8; 16], entries: &[&[u8]]) -> Vec<u8> {
        let size = 16 + entries.first().map_or(0, |e| e.len());
        let mut v = ty.to_vec();
        v.extend_from_slice(&((28 + size * entries.len()) as u32).to_le_bytes());
        v.extend_from_slice(&0u32.to_le_bytes());
        v.extend_from_slice(&(size as u32).to_le_bytes());
        for e in entries {
            v.extend_from_slice(&[7; 16]);
            v.extend_from_slice(e);
        }
        v
    }

    fn update(lists: &[u8]) -> Vec<u8> {
        let mut v = vec![0u8; 16];
        v.extend_from_slice(&30u32.to_le_bytes());
        v.extend_from_slice(&0x0200u16.to_le_bytes());
        v.extend_from_slice(&0x0ef1u16.to_le_bytes());
        v.extend_from_slice(&[1; 22]);
        v.extend_from_slice(lists);
        v
    }

    #[test]
    fn the_guids_are_laid_out_as_efi_does() {
        // EFI_IMAGE_SECURITY_DATABASE_GUID's bytes as they appear in
        // firmware volumes (the first three fields little-endian).
        assert_eq!(
            hex::encode(IMAGE_SECURITY_DATABASE),
            "cbb219d73a3d9645a3bcdad00e67656f"
        );
        assert_eq!(hex::encode(CERT_SHA256), "2616c4c14c509240aca941f936934328");
    }

    #[test]
    fn lists_of_digests_and_certificates_are_read_and_others_skipped() {
        let mut b = list(CERT_SHA256, &[&[1; 32], &[2; 32]]);
        b.extend(list([9; 16], &[&[3; 5]]));
        b.extend(list(CERT_X509, &[b"cert"]));
        let e = parse_lists(&b).unwrap();
        assert_eq!(
            e,
            [
                Entry::Sha256([1; 32]),
                Entry::Sha256([2; 32]),
                Entry::X509(b"cert".to_vec())
            ]
        );
    }

    #[test]
    fn lists_whose_sizes_do_not_add_up_are_refused() {
        let good = list(CERT_SHA256, &[&[1; 32]]);
        for cut in 1..good.len() {
            assert!(parse_lists(&good[..cut]).is_err(), "cut at {cut}");
        }
        let mut wrong = good.clone();
        wrong[24] = 40; // an entry size that does not divide the entries
        assert!(parse_lists(&wrong).is_err());
        let mut short = good.clone();
        short[24] = 16; // an entry with no data
        assert!(parse_lists(&short).is_err());
        let mut digest = list(CERT_SHA256, &[&[1; 31]]);
        assert!(parse_lists(&digest).is_err());
        digest.clear();
        assert!(parse_lists(&digest).unwrap().is_empty());
    }

    #[test]
    fn an_update_is_read_by_its_name_and_what_is_missing_is_said() {
        let b = update(&list(CERT_SHA256, &[&[1; 32], &[2; 32]]));
        let u = parse_update("dbx.append.auth", &b).unwrap();
        assert_eq!(u.var, Var::Dbx);
        let held = [Entry::Sha256([2; 32])];
        assert_eq!(missing(&held, &u), [&Entry::Sha256([1; 32])]);
        assert!(missing(&u.entries, &u).is_empty());
        // A digest in db, another name, nothing added, a short header.
        assert!(parse_update("db.append.auth", &b).is_err());
        assert!(parse_update("db.auth", &b).is_err());
        assert!(parse_update("dbx.append.auth", &update(&[])).is_err());
        assert!(parse_update("dbx.append.auth", &b[..39]).is_err());
        let mut bad = b.clone();
        bad[16] = 0xff;
        bad[17] = 0xff;
        assert!(parse_update("dbx.append.auth", &bad).is_err());
        let mut not_auth2 = b.clone();
        not_auth2[22] = 0;
        assert!(parse_update("dbx.append.auth", &not_auth2).is_err());
        let r = Record::new("1.2", vec![("dbx.append.auth".into(), b.clone())]).unwrap();
        assert_eq!(Record::from_meta(&r.to_meta()).unwrap(), r);
        assert!(Record::from_meta("version 1\ndb.auth 00\n").is_err());
        assert!(Record::new("1 2", vec![]).is_err());
        let twice = vec![("dbx.append.auth".into(), b.clone()); 2];
        assert!(Record::new("1", twice).is_err());
        assert_eq!(
            Var::Db.efivarfs_name(),
            "db-d719b2cb-3d3a-4596-a3bc-dad00e67656f"
        );
    }
}
