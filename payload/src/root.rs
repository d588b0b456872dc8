//! A root of trust that rotates (issue 29; the rules of TUF's root role,
//! in the small): a versioned set of ed25519 keys and a threshold k. A
//! payload's manifest is accepted when k distinct keys of the current root
//! signed it; a next root (new keys, a new threshold, the version after)
//! is accepted when k of the current root's keys and k' of its own signed
//! it, so a root is never replaced by keys it did not approve, and a lost
//! key is retired by a root that leaves it out.
//!
//! This module is the format and the rules, on bytes; where a disk keeps
//! its root (META) and how a payload brings the next one are the callers'.
//!
//! **A root** (`root.json`), canonical JSON as [`Root::to_bytes`] writes it:
//!
//! ```json
//! {"format":"imager-root-1","version":2,"threshold":2,"keys":["<64 hex digits>",…]}
//! ```
//!
//! `version` from 1, `threshold` from 1 to the number of keys, 1 to
//! [`MAX_KEYS`] keys (raw ed25519 public keys, 32 bytes as hex), none
//! twice; at most [`MAX_ROOT`] bytes.
//!
//! **Signatures** (`root.json.sigs`, `manifest.json.sigs`): a JSON list of
//! `{"key_id":"ed25519:…","signature":"<128 hex digits>"}`, at most
//! [`MAX_SIGNATURES`], at most [`MAX_SIGNATURES_FILE`] bytes. A manifest's
//! signatures are over its bytes as they are (each one verifies with
//! `openssl pkeyutl -verify -rawin`, as `manifest.json.sig` does); a
//! root's over [`ROOT_CONTEXT`] and its bytes, so that no root signature
//! can be taken for a manifest's. Signatures can be added one at a time,
//! on different machines: the list is the union. A signature by a key the
//! root does not hold, or one that does not verify, counts for nothing;
//! a key counts once however often it signed.
//!
//! Everything read here is untrusted: parsing never panics, allocates at
//! most the input's size, and says what is wrong without quoting more
//! than an escaped excerpt (fuzz target `trust_root`).

use crate::keys::key_id;
use ed25519_dalek::{Signature, VerifyingKey};
use serde::{Deserialize, Serialize};

/// The format's name, in every root.
pub const FORMAT: &str = "imager-root-1";
/// The most keys a root holds.
pub const MAX_KEYS: usize = 16;
/// The largest root read.
pub const MAX_ROOT: usize = 16 << 10;
/// The most signatures a list holds.
pub const MAX_SIGNATURES: usize = 32;
/// The largest signature list read.
pub const MAX_SIGNATURES_FILE: usize = 16 << 10;
/// What a root's signatures cover before its bytes.
pub const ROOT_CONTEXT: &[u8] = b"imager root v1\0";

/// A root: its version, its threshold and its keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Root {
    pub version: u64,
    pub threshold: usize,
    pub keys: Vec<VerifyingKey>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RootDoc {
    format: String,
    version: u64,
    threshold: usize,
    keys: Vec<String>,
}

/// One signature of a list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignatureEntry {
    pub key_id: String,
    /// 128 hex digits.
    pub signature: String,
}

/// Why something was not accepted: a message that says what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused(pub String);

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Refused {}

fn refused<T>(msg: impl Into<String>) -> Result<T, Refused> {
    Err(Refused(msg.into()))
}

impl Root {
    /// A root of `keys` needing `threshold` of them, checked as a parsed
    /// one is.
    pub fn new(version: u64, threshold: usize, keys: Vec<VerifyingKey>) -> Result<Root, Refused> {
        if version == 0 {
            return refused("a root's version starts at 1");
        }
        if keys.is_empty() || keys.len() > MAX_KEYS {
            return refused(format!(
                "a root holds 1 to {MAX_KEYS} keys, not {}",
                keys.len()
            ));
        }
        if threshold == 0 || threshold > keys.len() {
            return refused(format!(
                "a root's threshold is 1 to its number of keys ({}), not {threshold}",
                keys.len()
            ));
        }
        for (i, k) in keys.iter().enumerate() {
            if keys[..i].contains(k) {
                return refused(format!("the key {} is in the root twice", key_id(k)));
            }
        }
        Ok(Root {
            version,
            threshold,
            keys,
        })
    }

    /// Parses a root (see the module's documentation).
    pub fn parse(bytes: &[u8]) -> Result<Root, Refused> {
        if bytes.len() > MAX_ROOT {
            return refused(format!(
                "a root is at most {MAX_ROOT} bytes; this one is {}",
                bytes.len()
            ));
        }
        let doc: RootDoc = serde_json::from_slice(bytes)
            .map_err(|_| Refused(format!("not a root ({FORMAT} JSON)")))?;
        if doc.format != FORMAT {
            return refused(format!(
                "a root of format {}, not {FORMAT}: made by another version of imager",
                contract::text::excerpt(&doc.format)
            ));
        }
        if doc.keys.len() > MAX_KEYS {
            return refused(format!("a root holds at most {MAX_KEYS} keys"));
        }
        let mut keys = Vec::with_capacity(doc.keys.len());
        for k in &doc.keys {
            let mut raw = [0u8; 32];
            hex::decode_to_slice(k, &mut raw)
                .ok()
                .and_then(|()| VerifyingKey::from_bytes(&raw).ok())
                .map(|v| keys.push(v))
                .ok_or_else(|| {
                    Refused(format!(
                        "the root's key {} is not an ed25519 public key (64 hex digits)",
                        contract::text::excerpt(k)
                    ))
                })?;
        }
        Root::new(doc.version, doc.threshold, keys)
    }

    /// The root's canonical bytes (what is signed and stored).
    pub fn to_bytes(&self) -> Vec<u8> {
        let doc = RootDoc {
            format: FORMAT.into(),
            version: self.version,
            threshold: self.threshold,
            keys: self
                .keys
                .iter()
                .map(|k| hex::encode(k.as_bytes()))
                .collect(),
        };
        serde_json::to_vec(&doc).unwrap_or_default()
    }

    /// The distinct keys of this root whose signature of `message` is in
    /// `sigs` and verifies, in the root's order.
    pub fn signers(&self, message: &[u8], sigs: &[SignatureEntry]) -> Vec<VerifyingKey> {
        self.keys
            .iter()
            .filter(|k| {
                let id = key_id(k);
                sigs.iter().filter(|s| s.key_id == id).any(|s| {
                    decode_signature(&s.signature)
                        .is_some_and(|sig| k.verify_strict(message, &sig).is_ok())
                })
            })
            .copied()
            .collect()
    }

    /// `message` (`what`, for the message) carries `threshold` valid
    /// signatures of this root's keys.
    pub fn check(
        &self,
        message: &[u8],
        sigs: &[SignatureEntry],
        what: &str,
    ) -> Result<(), Refused> {
        let good = self.signers(message, sigs);
        if good.len() >= self.threshold {
            return Ok(());
        }
        let named: Vec<String> = good.iter().map(key_id).collect();
        refused(format!(
            "{what} carries {} valid signature(s) of root {}'s keys ({}), and root {} needs {}: \
             add signatures by its keys, or it was not signed for this root",
            good.len(),
            self.version,
            if named.is_empty() {
                "none".to_string()
            } else {
                named.join(", ")
            },
            self.version,
            self.threshold
        ))
    }

    /// The root after this one, from its bytes and signatures: its version
    /// is this one's plus one, `threshold` of this root's keys signed it
    /// and `threshold` of its own. (A disk several versions behind takes
    /// each root in turn.)
    pub fn accept_next(&self, next: &[u8], sigs: &[SignatureEntry]) -> Result<Root, Refused> {
        let root = Root::parse(next)?;
        if root.version != self.version + 1 {
            return refused(format!(
                "root {} cannot follow root {}: roots go up one version at a time (a disk takes \
                 each root between in turn)",
                root.version, self.version
            ));
        }
        let signed = root_message(next);
        self.check(
            &signed,
            sigs,
            &format!("root {} (signed by the root it replaces)", root.version),
        )?;
        root.check(
            &signed,
            sigs,
            &format!("root {} (signed by its own keys)", root.version),
        )?;
        Ok(root)
    }
}

/// What a root's signatures sign: [`ROOT_CONTEXT`] and its bytes.
pub fn root_message(root: &[u8]) -> Vec<u8> {
    [ROOT_CONTEXT, root].concat()
}

fn decode_signature(hex_sig: &str) -> Option<Signature> {
    let mut raw = [0u8; 64];
    hex::decode_to_slice(hex_sig, &mut raw).ok()?;
    Some(Signature::from_bytes(&raw))
}

/// Parses a signature list (see the module's documentation).
pub fn parse_signatures(bytes: &[u8]) -> Result<Vec<SignatureEntry>, Refused> {
    if bytes.len() > MAX_SIGNATURES_FILE {
        return refused(format!(
            "a signature list is at most {MAX_SIGNATURES_FILE} bytes; this one is {}",
            bytes.len()
        ));
    }
    let list: Vec<SignatureEntry> = serde_json::from_slice(bytes)
        .map_err(|_| Refused("not a signature list (a JSON list of {key_id, signature})".into()))?;
    if list.len() > MAX_SIGNATURES {
        return refused(format!(
            "a signature list holds at most {MAX_SIGNATURES} signatures"
        ));
    }
    Ok(list)
}

/// A signature list's bytes: `list` with `entry` added (replacing one by
/// the same key), sorted by key id, so that lists signed on different
/// machines merge to the same bytes.
pub fn add_signature(list: &[SignatureEntry], entry: SignatureEntry) -> Vec<u8> {
    let mut all: Vec<SignatureEntry> = list
        .iter()
        .filter(|s| s.key_id != entry.key_id)
        .cloned()
        .collect();
    all.push(entry);
    all.sort_by(|a, b| a.key_id.cmp(&b.key_id));
    serde_json::to_vec(&all).unwrap_or_default()
}

/// The entry of a signature by `key` (its 64 bytes).
pub fn entry(key: &VerifyingKey, signature: &Signature) -> SignatureEntry {
    SignatureEntry {
        key_id: key_id(key),
        signature: hex::encode(signature.to_bytes()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ed25519_dalek::{Signer, SigningKey};

    fn key(seed: u8) -> SigningKey {
        SigningKey::from_bytes(&[seed; 32])
    }

    fn sign_all(message: &[u8], keys: &[&SigningKey]) -> Vec<SignatureEntry> {
        let mut list = Vec::new();
        for k in keys {
            let bytes = add_signature(&list, entry(&k.verifying_key(), &k.sign(message)));
            list = parse_signatures(&bytes).unwrap();
        }
        list
    }

    /// Issue 29's rotation: root 1 (A, B; k=1) to root 2 (B, C; k=2).
    #[test]
    fn a_root_rotates_and_the_retired_key_signs_nothing_any_more() {
        let (a, b, c) = (key(1), key(2), key(3));
        let r1 = Root::new(1, 1, vec![a.verifying_key(), b.verifying_key()]).unwrap();
        let r2 = Root::new(2, 2, vec![b.verifying_key(), c.verifying_key()]).unwrap();
        let bytes = r2.to_bytes();
        assert_eq!(Root::parse(&bytes).unwrap(), r2);
        let msg = root_message(&bytes);
        // A alone satisfies root 1, not root 2's own threshold.
        let e = r1.accept_next(&bytes, &sign_all(&msg, &[&a])).unwrap_err();
        assert!(e.0.contains("signed by its own keys"), "{e}");
        // B and C satisfy both (B is in root 1).
        assert_eq!(
            r1.accept_next(&bytes, &sign_all(&msg, &[&b, &c])).unwrap(),
            r2
        );
        // C alone: root 1 did not approve it.
        let e = r1.accept_next(&bytes, &sign_all(&msg, &[&c])).unwrap_err();
        assert!(e.0.contains("signed by the root it replaces"), "{e}");
        // Under root 2, a manifest signed by A alone is refused; by B and C
        // it is accepted.
        let manifest = br#"{"format":1}"#;
        let e = r2
            .check(
                manifest,
                &sign_all(manifest, &[&a]),
                "the payload's manifest",
            )
            .unwrap_err();
        assert!(
            e.0.contains("0 valid signature(s)") && e.0.contains("needs 2"),
            "{e}"
        );
        let e = r2
            .check(
                manifest,
                &sign_all(manifest, &[&b]),
                "the payload's manifest",
            )
            .unwrap_err();
        assert!(e.0.contains("1 valid signature(s)"), "{e}");
        r2.check(
            manifest,
            &sign_all(manifest, &[&b, &c]),
            "the payload's manifest",
        )
        .unwrap();
        // A root's signature is not a manifest's, and the other way round.
        let as_manifest = sign_all(&bytes, &[&b, &c]);
        assert!(r1.accept_next(&bytes, &as_manifest).is_err());
    }

    #[test]
    fn versions_go_up_one_at_a_time() {
        let (a, b) = (key(1), key(2));
        let r1 = Root::new(1, 1, vec![a.verifying_key()]).unwrap();
        for v in [1, 3, 0] {
            let next = Root {
                version: v,
                threshold: 1,
                keys: vec![a.verifying_key(), b.verifying_key()],
            };
            let bytes = next.to_bytes();
            let sigs = sign_all(&root_message(&bytes), &[&a, &b]);
            assert!(r1.accept_next(&bytes, &sigs).is_err(), "version {v}");
        }
    }

    #[test]
    fn a_key_counts_once_and_strangers_and_bad_signatures_count_for_nothing() {
        let (a, b, x) = (key(1), key(2), key(9));
        let r = Root::new(1, 2, vec![a.verifying_key(), b.verifying_key()]).unwrap();
        let m = b"payload";
        let mut sigs = sign_all(m, &[&a, &x]);
        // A twice (another entry, same key): still one.
        sigs.push(entry(&a.verifying_key(), &a.sign(m)));
        assert_eq!(r.signers(m, &sigs).len(), 1);
        assert!(r.check(m, &sigs, "m").is_err());
        // B's entry with A's signature bytes: does not verify.
        sigs.push(SignatureEntry {
            key_id: key_id(&b.verifying_key()),
            signature: hex::encode(a.sign(m).to_bytes()),
        });
        assert_eq!(r.signers(m, &sigs).len(), 1);
        // Signatures added on two machines merge to the same bytes.
        let one = add_signature(&[], entry(&a.verifying_key(), &a.sign(m)));
        let one = parse_signatures(&one).unwrap();
        let ab = add_signature(&one, entry(&b.verifying_key(), &b.sign(m)));
        let other = add_signature(&[], entry(&b.verifying_key(), &b.sign(m)));
        let ba = add_signature(
            &parse_signatures(&other).unwrap(),
            entry(&a.verifying_key(), &a.sign(m)),
        );
        assert_eq!(ab, ba);
        r.check(m, &parse_signatures(&ab).unwrap(), "m").unwrap();
    }

    #[test]
    fn bad_roots_and_lists_are_refused_with_what_to_change() {
        let a = key(1).verifying_key();
        let hex_a = hex::encode(a.as_bytes());
        for (text, said) in [
            ("{}".to_string(), "not a root"),
            (
                format!(r#"{{"format":"x","version":1,"threshold":1,"keys":["{hex_a}"]}}"#),
                "format",
            ),
            (
                format!(r#"{{"format":"{FORMAT}","version":0,"threshold":1,"keys":["{hex_a}"]}}"#),
                "starts at 1",
            ),
            (
                format!(r#"{{"format":"{FORMAT}","version":1,"threshold":2,"keys":["{hex_a}"]}}"#),
                "threshold",
            ),
            (
                format!(r#"{{"format":"{FORMAT}","version":1,"threshold":0,"keys":["{hex_a}"]}}"#),
                "threshold",
            ),
            (
                format!(r#"{{"format":"{FORMAT}","version":1,"threshold":1,"keys":[]}}"#),
                "1 to 16 keys",
            ),
            (
                format!(
                    r#"{{"format":"{FORMAT}","version":1,"threshold":1,"keys":["{hex_a}","{hex_a}"]}}"#
                ),
                "twice",
            ),
            (
                format!(r#"{{"format":"{FORMAT}","version":1,"threshold":1,"keys":["zz"]}}"#),
                "not an ed25519",
            ),
            (
                format!(
                    r#"{{"format":"{FORMAT}","version":1,"threshold":1,"keys":["{hex_a}"],"x":1}}"#
                ),
                "not a root",
            ),
        ] {
            let e = Root::parse(text.as_bytes()).unwrap_err();
            assert!(e.0.contains(said), "{text}: {e}");
        }
        assert!(
            Root::parse(&vec![b' '; MAX_ROOT + 1])
                .unwrap_err()
                .0
                .contains("at most")
        );
        assert!(parse_signatures(b"{}").is_err());
        let many = vec![
            SignatureEntry {
                key_id: "k".into(),
                signature: "s".into()
            };
            MAX_SIGNATURES + 1
        ];
        assert!(
            parse_signatures(&serde_json::to_vec(&many).unwrap())
                .unwrap_err()
                .0
                .contains("at most")
        );
        // Escaped in messages.
        let e = Root::parse(
            format!(r#"{{"format":"\u001b[2J","version":1,"threshold":1,"keys":["{hex_a}"]}}"#)
                .as_bytes(),
        )
        .unwrap_err();
        assert!(!e.0.contains('\u{1b}'), "{e:?}");
    }
}
