//! GRUB's environment block: the file GRUB's `load_env` reads and its
//! `save_env` rewrites, and the part of the slot state the BIOS path keeps
//! in it (which slot is on trial and its tries left).
//!
//! ## The format (GRUB 2.06, `grub-core/lib/envblk.c`)
//!
//! ```text
//! # GRUB Environment Block\n          the signature, 25 bytes
//! name=value\n                         one variable a line; in a value a `\`
//! ...                                  or a newline is written after a `\`
//! ######...                            `#` up to the end of the block
//! ```
//!
//! GRUB accepts a block of any length that starts with the signature; it
//! skips lines that start with `#` and stops at the first line it cannot
//! end (a name with no `=`, a value with no newline before the end).
//! `save_env` never changes the file's length: it rewrites the bytes of the
//! file's existing sectors (found through the filesystem), moving what
//! follows a changed value within the block. grub-editenv, on the other
//! hand, writes a new file (truncating the old one): it must never touch
//! ours.
//!
//! ## Our variables
//!
//! | variable | value | meaning |
//! |---|---|---|
//! | `trial_slot` | `A`, `B` or empty | the slot on trial, if any |
//! | `trial_tries` | `0` … `99` (decimal, no leading zero) or empty | boots of the trial slot left |
//!
//! [`GrubEnv::render`] writes both, always, in that order, right after the
//! signature: at most 25 + 13 + 15 = 53 bytes, so they lie in the file's
//! first 512-byte sector with [`ROOM_IN_FIRST_SECTOR`] bytes to spare. The
//! file is [`BLOCK_LEN`] bytes (GRUB's default size); its second sector is
//! only `#` and never changes. Every change of the state is then a write of
//! the first sector alone, which a disk does whole or not at all; GRUB's
//! own `save_env trial_tries` changes bytes of that sector only too (and
//! rewrites the unchanged second one).
//!
//! Which slot is good (booted when there is no trial or its tries are gone)
//! is not in the block: it is the first sector of `grub.cfg`
//! ([`crate::grubcfg`]), so that a block GRUB cannot read boots the good
//! slot.

use crate::slot::Slot;

/// The signature every block starts with.
pub const SIGNATURE: &[u8] = b"# GRUB Environment Block\n";
/// The length of the block we write (GRUB's default, `grub-editenv create`).
pub const BLOCK_LEN: usize = 1024;
/// The unit a disk writes whole: every variable lies within the first one.
pub const SECTOR: usize = 512;
/// The slot on trial: `A`, `B`, or empty when none is.
pub const TRIAL_SLOT: &str = "trial_slot";
/// Boots of the trial slot left, decimal (`0` when they are used up).
pub const TRIAL_TRIES: &str = "trial_tries";
/// The most tries the block (and `grub.cfg`'s ladder) counts.
pub const MAX_TRIES: u32 = crate::boot::MAX_TRIES;
/// The longest our variables can be: signature, `trial_slot=B\n`,
/// `trial_tries=99\n`.
pub const VARIABLES_MAX_LEN: usize = SIGNATURE.len() + 13 + 15;
/// Bytes of the first sector left after our variables at their longest.
pub const ROOM_IN_FIRST_SECTOR: usize = SECTOR - VARIABLES_MAX_LEN;

/// A slot on trial under GRUB.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Trial {
    pub slot: Slot,
    /// Boots left: GRUB boots the slot while this is above 0, lowering it
    /// (and saving it) before each boot.
    pub tries: u32,
}

/// The typed content of our environment block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct GrubEnv {
    pub trial: Option<Trial>,
}

/// The block is not one GRUB reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotABlock;

impl std::fmt::Display for NotABlock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(
            "not a GRUB environment block: it does not start with `# GRUB Environment Block`",
        )
    }
}

/// Escapes a value as GRUB writes it: `\` and newline after a `\`.
pub fn escape(value: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(value.len());
    for &b in value {
        if b == b'\\' || b == b'\n' {
            out.push(b'\\');
        }
        out.push(b);
    }
    out
}

/// A variable of a block: name and value, as bytes.
pub type Variable = (Vec<u8>, Vec<u8>);

/// Cuts a C string at its first NUL, as GRUB's use of it does.
fn c_str(b: &[u8]) -> &[u8] {
    b.iter().position(|&c| c == 0).map_or(b, |i| &b[..i])
}

/// The variables GRUB's `load_env` sets from `block`, in the order it sets
/// them (a later one overrides an earlier one of the same name), exactly as
/// `grub_envblk_iterate` reads them: `#` lines skipped, `\x` read as `x`,
/// reading stopped at the first line that does not end within the block.
/// Names and values are bytes (cut at a NUL, as GRUB's strings are). Never
/// panics, whatever the bytes.
pub fn variables(block: &[u8]) -> Result<Vec<Variable>, NotABlock> {
    if !block.starts_with(SIGNATURE) {
        return Err(NotABlock);
    }
    let end = block.len();
    let mut p = SIGNATURE.len();
    let mut out = Vec::new();
    while p < end {
        if block[p] != b'#' {
            let name_start = p;
            while p < end && block[p] != b'=' {
                p += 1;
            }
            if p >= end {
                break;
            }
            let name = &block[name_start..p];
            p += 1;
            let mut value = Vec::new();
            let mut complete = false;
            while p < end {
                match block[p] {
                    b'\n' => {
                        complete = true;
                        break;
                    }
                    b'\\' => {
                        // GRUB skips two bytes; the second is the value's.
                        if p + 1 >= end {
                            p = end;
                            break;
                        }
                        value.push(block[p + 1]);
                        p += 2;
                    }
                    b => {
                        value.push(b);
                        p += 1;
                    }
                }
            }
            if !complete {
                break;
            }
            out.push((c_str(name).to_vec(), c_str(&value).to_vec()));
        }
        // find_next_line: to the byte after the next unescaped newline.
        while p < end {
            match block[p] {
                b'\\' => p += 2,
                b'\n' => break,
                _ => p += 1,
            }
        }
        p = p.saturating_add(1);
    }
    Ok(out)
}

/// The last value GRUB's `load_env` would give `name`.
pub fn get(block: &[u8], name: &str) -> Result<Option<Vec<u8>>, NotABlock> {
    Ok(variables(block)?
        .into_iter()
        .rev()
        .find(|(n, _)| n == name.as_bytes())
        .map(|(_, v)| v))
}

/// `tries` as `grub.cfg`'s ladder compares it: a decimal in 0..=MAX_TRIES
/// without leading zeros (`"03"` matches no rung).
pub fn parse_tries(v: &[u8]) -> Option<u32> {
    let s = std::str::from_utf8(v).ok()?;
    if s.is_empty() || s.len() > 2 || (s.len() > 1 && s.starts_with('0')) {
        return None;
    }
    if !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok().filter(|n| *n <= MAX_TRIES)
}

impl GrubEnv {
    pub fn none() -> GrubEnv {
        GrubEnv { trial: None }
    }

    pub fn trial(slot: Slot, tries: u32) -> GrubEnv {
        GrubEnv {
            trial: Some(Trial { slot, tries }),
        }
    }

    /// What `grub.cfg` acts on when GRUB loads `block`: a trial when
    /// `trial_slot` is exactly `A` or `B`; its tries as the ladder reads
    /// them, a value it does not know counting as none left (GRUB then
    /// boots the good slot). An error for a block GRUB refuses (it then
    /// loads nothing: no trial either).
    pub fn read(block: &[u8]) -> Result<GrubEnv, NotABlock> {
        let slot = match get(block, TRIAL_SLOT)?.as_deref() {
            Some(b"A") => Some(Slot::A),
            Some(b"B") => Some(Slot::B),
            _ => None,
        };
        let tries = get(block, TRIAL_TRIES)?
            .as_deref()
            .and_then(parse_tries)
            .unwrap_or(0);
        Ok(GrubEnv {
            trial: slot.map(|slot| Trial { slot, tries }),
        })
    }

    /// The block as GRUB's script sees it; a block GRUB refuses reads as no
    /// trial (GRUB boots the good slot), as `grub.cfg` does.
    pub fn read_or_none(block: &[u8]) -> GrubEnv {
        GrubEnv::read(block).unwrap_or_default()
    }

    /// The whole block ([`BLOCK_LEN`] bytes): the signature, `trial_slot`,
    /// `trial_tries`, then `#`. An error for tries above [`MAX_TRIES`].
    pub fn render(&self) -> Result<Vec<u8>, String> {
        let (slot, tries) = match self.trial {
            Some(t) if t.tries > MAX_TRIES => {
                return Err(format!(
                    "a trial counts at most {MAX_TRIES} tries, not {}",
                    t.tries
                ));
            }
            Some(t) => (t.slot.name().to_string(), t.tries.to_string()),
            None => (String::new(), String::new()),
        };
        let mut b = SIGNATURE.to_vec();
        for (name, value) in [(TRIAL_SLOT, slot), (TRIAL_TRIES, tries)] {
            b.extend_from_slice(name.as_bytes());
            b.push(b'=');
            b.extend_from_slice(&escape(value.as_bytes()));
            b.push(b'\n');
        }
        if b.len() > VARIABLES_MAX_LEN {
            return Err("internal: the variables outgrew the first sector".into());
        }
        b.resize(BLOCK_LEN, b'#');
        Ok(b)
    }

    /// Whether `block` is exactly what [`render`](GrubEnv::render) writes
    /// for some state, GRUB's own `save_env` of `trial_tries` included (it
    /// shortens `10` to `9` and pads with `#`): every byte past our
    /// variables is `#`, and the length is [`BLOCK_LEN`]. The state it
    /// holds, or `None` for any other block.
    pub fn read_exact(block: &[u8]) -> Option<GrubEnv> {
        let env = GrubEnv::read(block).ok()?;
        let canonical = env.render().ok()?;
        (block == canonical.as_slice()).then_some(env)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_within_the_first_sector() {
        let b = GrubEnv::trial(Slot::B, 3).render().unwrap();
        assert_eq!(b.len(), BLOCK_LEN);
        let text = b"# GRUB Environment Block\ntrial_slot=B\ntrial_tries=3\n";
        assert_eq!(&b[..text.len()], text);
        assert!(b[text.len()..].iter().all(|&c| c == b'#'));
        let none = GrubEnv::none().render().unwrap();
        assert!(none.starts_with(b"# GRUB Environment Block\ntrial_slot=\ntrial_tries=\n#"));
        let longest = GrubEnv::trial(Slot::A, MAX_TRIES).render().unwrap();
        let used = longest.iter().rposition(|&c| c == b'\n').unwrap() + 1;
        assert_eq!(used, VARIABLES_MAX_LEN);
        assert_eq!(ROOM_IN_FIRST_SECTOR, 459);
        assert!(GrubEnv::trial(Slot::A, MAX_TRIES + 1).render().is_err());
        // The second sector never changes.
        assert_eq!(longest[SECTOR..], none[SECTOR..]);
    }

    #[test]
    fn reads_back_what_it_writes() {
        for env in [
            GrubEnv::none(),
            GrubEnv::trial(Slot::A, 0),
            GrubEnv::trial(Slot::B, 1),
            GrubEnv::trial(Slot::B, 10),
            GrubEnv::trial(Slot::A, MAX_TRIES),
        ] {
            let b = env.render().unwrap();
            assert_eq!(GrubEnv::read(&b), Ok(env));
            assert_eq!(GrubEnv::read_exact(&b), Some(env));
        }
    }

    #[test]
    fn reads_as_grub_does() {
        let mut b = SIGNATURE.to_vec();
        b.extend_from_slice(
            b"#comment=x\ntrial_slot=A\nother=a\\\\b\\\nc\ntrial_slot=B\ntrial_tries=2\n##",
        );
        let vars = variables(&b).unwrap();
        assert_eq!(
            vars,
            [
                (b"trial_slot".to_vec(), b"A".to_vec()),
                (b"other".to_vec(), b"a\\b\nc".to_vec()),
                (b"trial_slot".to_vec(), b"B".to_vec()),
                (b"trial_tries".to_vec(), b"2".to_vec()),
            ]
        );
        assert_eq!(GrubEnv::read(&b), Ok(GrubEnv::trial(Slot::B, 2)));
        // Not rendered by us: read, but not exact.
        assert_eq!(GrubEnv::read_exact(&b), None);
        // A line without `=` swallows the next one into its name (GRUB
        // reads up to the next `=`), and a last line without a newline is
        // not read.
        let mut b = SIGNATURE.to_vec();
        b.extend_from_slice(b"junk\ntrial_slot=A\ntrial_tries=1");
        assert_eq!(
            variables(&b).unwrap(),
            [(b"junk\ntrial_slot".to_vec(), b"A".to_vec())]
        );
        assert_eq!(GrubEnv::read(&b), Ok(GrubEnv::none()));
        // Unknown tries count as none left; an unknown slot as no trial.
        for (tries, want) in [("03", 0), ("100", 0), ("x", 0), ("", 0), ("7", 7)] {
            let mut b = SIGNATURE.to_vec();
            b.extend_from_slice(format!("trial_slot=A\ntrial_tries={tries}\n").as_bytes());
            assert_eq!(
                GrubEnv::read(&b),
                Ok(GrubEnv::trial(Slot::A, want)),
                "{tries}"
            );
        }
        let mut b = SIGNATURE.to_vec();
        b.extend_from_slice(b"trial_slot=a\ntrial_tries=3\n");
        assert_eq!(GrubEnv::read(&b), Ok(GrubEnv::none()));
        assert_eq!(GrubEnv::read(b"# GRUB Environment Bloc"), Err(NotABlock));
        assert_eq!(GrubEnv::read_or_none(b"\0\0"), GrubEnv::none());
        // A backslash at the very end, a NUL in a name.
        let mut b = SIGNATURE.to_vec();
        b.extend_from_slice(b"x\0y=1\nz=\\");
        assert_eq!(variables(&b).unwrap(), [(b"x".to_vec(), b"1".to_vec())]);
    }

    #[test]
    fn escapes_as_grub_does() {
        assert_eq!(escape(b"a\\b\nc"), b"a\\\\b\\\nc");
    }
}
