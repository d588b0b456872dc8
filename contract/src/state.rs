//! The slot state: one bootloader-neutral model, kept in META.
//!
//! What is the default slot, whether each slot is empty, good, pending or
//! bad, which upgrade is on trial and what happened before: all of it is
//! [`BootState`], stored in META's tags (see [`crate::meta::Tag`]). A boot
//! loader's configuration is a *rendering* of it: systemd-boot's entry names
//! ([`crate::boot::EntryName`]) are one, a GRUB environment block will be
//! another. The only state a boot loader adds of its own is the try counter,
//! and [`assess`] reads that back into the model at boot.

use crate::boot::EntryName;
use crate::meta::{Meta, SlotRecord, SlotStatus, Tag};
use crate::slot::Slot;

/// How many history events META keeps (the oldest are dropped).
pub const MAX_HISTORY: usize = 64;

/// An upgrade on trial: written before the switch, cleared when the new slot
/// is blessed or given up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    pub from: Slot,
    pub to: Slot,
    pub from_version: String,
    pub to_version: String,
}

impl Pending {
    /// `from=A to=B from-version=0.1.0 to-version=0.2.0`
    pub fn render(&self) -> String {
        format!(
            "from={} to={} from-version={} to-version={}",
            self.from, self.to, self.from_version, self.to_version
        )
    }

    pub fn parse(s: &str) -> Result<Pending, String> {
        let field = |k: &str| {
            s.split_whitespace()
                .find_map(|w| w.strip_prefix(k)?.strip_prefix('='))
                .ok_or_else(|| format!("pending upgrade {s:?} has no {k}="))
        };
        Ok(Pending {
            from: field("from")?.parse()?,
            to: field("to")?.parse()?,
            from_version: field("from-version")?.to_string(),
            to_version: field("to-version")?.to_string(),
        })
    }
}

/// The whole slot state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootState {
    /// The slot booted next, as far as this model goes (on trial: the new one).
    pub default: Slot,
    /// Slot A's and slot B's records; `None` for an empty slot.
    pub slots: [Option<SlotRecord>; 2],
    pub pending: Option<Pending>,
    /// Events, oldest first: `<seq> <event> key=value…`.
    pub history: Vec<String>,
    /// The highest security version blessed on this disk
    /// ([`Tag::SecurityFloor`]; 0 when absent).
    pub security_floor: u64,
}

fn index(s: Slot) -> usize {
    match s {
        Slot::A => 0,
        Slot::B => 1,
    }
}

impl BootState {
    /// Reads the model out of META. A META without slot records is an error:
    /// the disk was not made by this toolchain.
    pub fn from_meta(meta: &Meta) -> Result<BootState, String> {
        let default: Slot = meta
            .get(Tag::DefaultSlot)
            .ok_or("META has no default-slot: this disk was not made by imager")?
            .parse()?;
        let mut slots = [None, None];
        for s in Slot::ALL {
            if let Some(v) = meta.get(Tag::for_slot(s)) {
                let r = SlotRecord::parse(v).map_err(|e| format!("META slot {s}: {e}"))?;
                if r.status != SlotStatus::Empty {
                    slots[index(s)] = Some(r);
                }
            }
        }
        let pending = match meta.get(Tag::PendingUpgrade) {
            None | Some("") => None,
            Some(v) => Some(Pending::parse(v)?),
        };
        let history = meta
            .get(Tag::History)
            .unwrap_or_default()
            .lines()
            .map(str::trim_end)
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect();
        let security_floor = match meta.get(Tag::SecurityFloor) {
            None => 0,
            Some(v) => v.trim().parse().map_err(|_| {
                format!(
                    "META security-floor {} is not a number",
                    crate::text::excerpt(v)
                )
            })?,
        };
        Ok(BootState {
            default,
            slots,
            pending,
            history,
            security_floor,
        })
    }

    /// Writes the model into META, leaving every other tag alone.
    pub fn write_to(&self, meta: &mut Meta) {
        meta.set(Tag::DefaultSlot, self.default.name());
        for s in Slot::ALL {
            match &self.slots[index(s)] {
                Some(r) => meta.set(Tag::for_slot(s), r.render()),
                None => meta.remove(Tag::for_slot(s)),
            }
        }
        match &self.pending {
            Some(p) => meta.set(Tag::PendingUpgrade, p.render()),
            None => meta.remove(Tag::PendingUpgrade),
        }
        if self.history.is_empty() {
            meta.remove(Tag::History);
        } else {
            meta.set(Tag::History, self.history.join("\n") + "\n");
        }
        // Never lowered, and absent while 0 (as on disks made before it).
        if self.security_floor > 0 {
            meta.set(Tag::SecurityFloor, self.security_floor.to_string());
        }
    }

    pub fn slot(&self, s: Slot) -> Option<&SlotRecord> {
        self.slots[index(s)].as_ref()
    }

    pub fn status(&self, s: Slot) -> SlotStatus {
        self.slot(s).map_or(SlotStatus::Empty, |r| r.status)
    }

    pub fn version(&self, s: Slot) -> &str {
        self.slot(s).map_or("", |r| r.version.as_str())
    }

    /// The security version of the payload in slot `s` (0: none, or empty).
    pub fn security(&self, s: Slot) -> u64 {
        self.slot(s).map_or(0, |r| r.security)
    }

    /// Sets slot `s`'s status and version, keeping its security version:
    /// for a change of status of what the slot holds.
    pub fn set(&mut self, s: Slot, status: SlotStatus, version: impl Into<String>) {
        let security = self.security(s);
        self.put(s, status, version, security);
    }

    /// Sets slot `s`'s whole record: for new contents (an upgrade).
    pub fn put(&mut self, s: Slot, status: SlotStatus, version: impl Into<String>, security: u64) {
        self.slots[index(s)] = (status != SlotStatus::Empty).then(|| SlotRecord {
            status,
            version: version.into(),
            security,
        });
    }

    /// Slot `s` is blessed: the disk's security floor rises to its
    /// security version (never falls).
    pub fn raise_floor(&mut self, s: Slot) {
        self.security_floor = self.security_floor.max(self.security(s));
    }

    /// Appends an event (`event` is `name key=value…`), numbering it. The
    /// last number comes from META (any bytes): at the largest number the
    /// numbering stays there.
    pub fn record(&mut self, event: impl AsRef<str>) {
        let next = self
            .history
            .last()
            .and_then(|l| l.split_whitespace().next()?.parse::<u64>().ok())
            .map_or(1, |n| n.saturating_add(1));
        self.history.push(format!("{next} {}", event.as_ref()));
        if self.history.len() > MAX_HISTORY {
            let drop = self.history.len() - MAX_HISTORY;
            self.history.drain(..drop);
        }
    }

    /// The slot an upgrade writes to: the one that is not the fallback. With
    /// an upgrade on trial, that is the trial slot again (its upgrade is
    /// replaced); otherwise the slot that is not the default.
    pub fn upgrade_target(&self) -> Slot {
        match &self.pending {
            Some(p) => p.to,
            None => self.default.other(),
        }
    }

    /// The slot that runs now or runs if the trial fails: what an upgrade
    /// must not touch.
    pub fn fallback(&self) -> Slot {
        self.upgrade_target().other()
    }
}

/// Why a boot is not on the slot the model expected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FallbackReason {
    /// The trial slot's tries ran out (it failed to reach ready).
    TriesExhausted { tries: u32 },
    /// The trial slot has no entry: the upgrade stopped before its switch.
    NotSwitched,
    /// The trial slot still had tries left but this slot was booted (chosen
    /// at the boot menu or by the firmware).
    Abandoned,
}

impl FallbackReason {
    pub fn describe(&self) -> String {
        match self {
            FallbackReason::TriesExhausted { tries } => {
                format!("it failed to reach ready in {tries} tries")
            }
            FallbackReason::NotSwitched => "the upgrade stopped before switching to it".into(),
            FallbackReason::Abandoned => "another slot was booted while it was on trial".into(),
        }
    }
}

/// What a boot of slot `booted` means for the model: computed by the
/// runtime from META and the boot entries before it reports ready.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Assessment {
    /// A good slot booted as expected: nothing to record.
    Steady,
    /// `booted` is on trial (counting entry, or the pending upgrade's target):
    /// bless it once the checks pass.
    Trial {
        /// The counting entry to replace by its blessed name, if any.
        entry: Option<EntryName>,
    },
    /// The pending upgrade to `failed` did not make it; `booted` runs.
    FellBack {
        failed: Slot,
        version: String,
        reason: FallbackReason,
    },
    /// No upgrade pending, but META's default is not the slot the entries
    /// boot first (a switch was cut short, or undone at the boot menu):
    /// META follows the entries.
    DefaultMoved,
}

/// The entry of `slot` systemd-boot would pick among `entries` (highest
/// generation; for the same generation, a counting name before the plain one).
pub fn best_entry(entries: &[EntryName], slot: Slot) -> Option<EntryName> {
    crate::boot::boot_order(
        &entries
            .iter()
            .copied()
            .filter(|e| e.slot == slot)
            .collect::<Vec<_>>(),
    )
    .first()
    .copied()
}

/// Decides what a boot of `booted` means, from the model and the entries
/// found on BOOT.
pub fn assess(state: &BootState, entries: &[EntryName], booted: Slot) -> Assessment {
    let mine = best_entry(entries, booted);
    if let Some(p) = &state.pending
        && p.to != booted
    {
        let theirs = best_entry(entries, p.to);
        let reason = match theirs {
            Some(e) if e.is_exhausted() => FallbackReason::TriesExhausted {
                tries: e.tries.map_or(0, |t| t.done),
            },
            Some(_) => FallbackReason::Abandoned,
            None => FallbackReason::NotSwitched,
        };
        return Assessment::FellBack {
            failed: p.to,
            version: p.to_version.clone(),
            reason,
        };
    }
    let counting = mine.filter(|e| e.tries.is_some());
    if counting.is_some() || state.pending.as_ref().is_some_and(|p| p.to == booted) {
        return Assessment::Trial { entry: counting };
    }
    if state.default != booted {
        return Assessment::DefaultMoved;
    }
    Assessment::Steady
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> BootState {
        let mut m = Meta::default();
        m.set(Tag::DefaultSlot, "A");
        m.set(Tag::SlotA, "status=good version=1");
        BootState::from_meta(&m).unwrap()
    }

    #[test]
    fn meta_round_trip_keeps_other_tags() {
        let mut s = state();
        s.set(Slot::B, SlotStatus::Pending, "2");
        s.default = Slot::B;
        s.pending = Some(Pending {
            from: Slot::A,
            to: Slot::B,
            from_version: "1".into(),
            to_version: "2".into(),
        });
        s.record("upgrade-started from=A to=B");
        s.record("x");
        assert_eq!(s.history, ["1 upgrade-started from=A to=B", "2 x"]);
        let mut m = Meta::default();
        m.set(Tag::ImageName, "metal");
        s.write_to(&mut m);
        assert_eq!(m.get(Tag::ImageName), Some("metal"));
        assert_eq!(
            m.get(Tag::PendingUpgrade),
            Some("from=A to=B from-version=1 to-version=2")
        );
        assert_eq!(BootState::from_meta(&m).unwrap(), s);
        s.pending = None;
        s.set(Slot::B, SlotStatus::Empty, "");
        s.write_to(&mut m);
        assert_eq!(m.get(Tag::PendingUpgrade), None);
        assert_eq!(m.get(Tag::SlotB), None);
        assert!(BootState::from_meta(&Meta::default()).is_err());
    }

    /// The floor: absent is 0, raised to a blessed slot's security
    /// version and never lowered; a status change keeps a slot's security
    /// version, new contents bring theirs.
    #[test]
    fn the_security_floor_only_rises_at_a_blessing() {
        let mut s = state();
        assert_eq!(s.security_floor, 0);
        s.put(Slot::B, SlotStatus::Pending, "2", 3);
        s.set(Slot::B, SlotStatus::Good, "2");
        assert_eq!(s.security(Slot::B), 3);
        assert_eq!(s.security_floor, 0, "a new slot is not blessed yet");
        s.raise_floor(Slot::B);
        assert_eq!(s.security_floor, 3);
        s.raise_floor(Slot::A);
        assert_eq!(s.security_floor, 3, "lowered by a slot with less");
        let mut m = Meta::default();
        s.write_to(&mut m);
        assert_eq!(m.get(Tag::SecurityFloor), Some("3"));
        assert_eq!(m.get(Tag::SlotB), Some("status=good version=2 security=3"));
        assert_eq!(BootState::from_meta(&m).unwrap(), s);
        m.set(Tag::SecurityFloor, "lots");
        assert!(BootState::from_meta(&m).is_err());
        // A disk whose floor is 0 has no record of it.
        let mut m = Meta::default();
        state().write_to(&mut m);
        assert_eq!(m.get(Tag::SecurityFloor), None);
    }

    #[test]
    fn history_is_bounded() {
        let mut s = state();
        for i in 0..MAX_HISTORY + 5 {
            s.record(format!("e{i}"));
        }
        assert_eq!(s.history.len(), MAX_HISTORY);
        assert!(s.history[0].starts_with("6 e5"));
        assert!(
            s.history
                .last()
                .unwrap()
                .starts_with(&format!("{} ", MAX_HISTORY + 5))
        );
    }

    /// Found by the fuzz target `slot_state`: a history whose last event
    /// has the largest number overflowed the next one.
    #[test]
    fn an_event_after_the_largest_number_is_recorded() {
        let mut s = state();
        s.history = vec![format!("{} upgrade", u64::MAX)];
        s.record("next");
        assert_eq!(s.history[1], format!("{} next", u64::MAX));
    }

    #[test]
    fn targets() {
        let mut s = state();
        assert_eq!(s.upgrade_target(), Slot::B);
        s.default = Slot::B;
        assert_eq!(s.upgrade_target(), Slot::A);
        s.pending = Some(Pending::parse("from=A to=B from-version=1 to-version=2").unwrap());
        // Replacing an upgrade still on trial: the same slot again.
        assert_eq!(s.upgrade_target(), Slot::B);
        assert_eq!(s.fallback(), Slot::A);
        assert!(Pending::parse("from=A to=B").is_err());
    }

    #[test]
    fn assessments() {
        let a1 = EntryName::good(1, Slot::A);
        let b2 = EntryName::trial(2, Slot::B, 3);
        let b2_tried = EntryName::parse("g00000002-slot-b+2-1.conf").unwrap();
        let b2_bad = EntryName::parse("g00000002-slot-b+0-3.conf").unwrap();
        let mut s = state();
        assert_eq!(assess(&s, &[a1], Slot::A), Assessment::Steady);
        s.default = Slot::B;
        s.pending = Some(Pending::parse("from=A to=B from-version=1 to-version=2").unwrap());
        assert_eq!(
            assess(&s, &[a1, b2_tried], Slot::B),
            Assessment::Trial {
                entry: Some(b2_tried)
            }
        );
        assert_eq!(
            assess(&s, &[a1, b2_bad], Slot::A),
            Assessment::FellBack {
                failed: Slot::B,
                version: "2".into(),
                reason: FallbackReason::TriesExhausted { tries: 3 }
            }
        );
        assert!(matches!(
            assess(&s, &[a1], Slot::A),
            Assessment::FellBack {
                reason: FallbackReason::NotSwitched,
                ..
            }
        ));
        assert!(matches!(
            assess(&s, &[a1, b2], Slot::A),
            Assessment::FellBack {
                reason: FallbackReason::Abandoned,
                ..
            }
        ));
        // Blessed entry written, META not yet: finish the blessing.
        assert_eq!(
            assess(&s, &[a1, b2.blessed()], Slot::B),
            Assessment::Trial { entry: None }
        );
        // No upgrade pending, META says B, A boots first.
        s.pending = None;
        assert_eq!(assess(&s, &[a1], Slot::A), Assessment::DefaultMoved);
    }
}
