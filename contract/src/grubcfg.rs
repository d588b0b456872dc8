//! The A-B `grub.cfg` of the BIOS path: the second rendering of the one
//! slot state ([`crate::state::BootState`]), beside systemd-boot's entry
//! names, for Debian's GRUB 2.06 (no arithmetic, no `blscfg`).
//!
//! ## Three files on BOOT, each changed by whole, atomic writes
//!
//! | file | what | changed |
//! |---|---|---|
//! | [`CONFIG_PATH`] `grub/grub.cfg` | the script below; its first 512-byte sector names the **good slot** (`set good_slot=A`) | first sector only, rewritten in place (one sector write): at a blessing and a rollback |
//! | [`ENV_PATH`] `grub/env/grubenv` | the **trial**: `trial_slot`, `trial_tries` ([`crate::grubenv`]) | first sector only, in place: by the installer and the runtime, and by GRUB's `save_env` as it counts |
//! | [`slot_config_path`] `X/grub.cfg` | slot X's kernel, initramfs and options (from its boot entry) | never rewritten: removed and created with the slot's other files, before the switch to it |
//!
//! The script itself never changes after it is written: whatever GRUB
//! boots is decided by one sector of `grub.cfg` and one sector of the
//! environment block, each written whole or not at all.
//!
//! ## What the script does
//!
//! 1. `load_env` reads only `trial_slot` and `trial_tries`; a block GRUB
//!    cannot read leaves them empty.
//! 2. If `trial_slot` is `A` or `B` and `trial_tries` is `N` in 1..=99, a
//!    ladder of flat `if`s (one a value: GRUB has no arithmetic, and an
//!    `elif` chain that long exceeds the nesting limit of 64 commands of
//!    Debian's GRUB, "maximum recursion depth exceeded") sets it to `N-1`.
//!    The trial slot's `X/grub.cfg` is sourced: it loads the kernel and the
//!    initramfs and only then says `loaded=X`. Once it loaded,
//!    `save_env trial_tries` writes the lowered count back, **then** GRUB
//!    boots it. A slot that does not load is not counted (systemd-boot does
//!    not count an entry whose kernel is missing either); if the save
//!    fails, the trial slot is not booted (a counter that does not count
//!    would try a broken slot for ever).
//! 3. Otherwise (no trial, tries used up, unknown values, no block, the
//!    trial slot did not load or its save failed) the good slot is loaded
//!    the same way and booted; if it does not load, the other slot (as
//!    systemd-boot passes over an entry whose kernel is missing).
//!
//! The kernel's command line is the entry's options (which end with
//! `machined.slot=X`) followed by `machined.trial=1` (a trial boot, counted)
//! or `machined.trial=0`, and `machined.boot_part=` BOOT's unique GUID
//! (`probe --part-uuid`: the disk GRUB booted from, for the runtime); systemd-boot's entries never carry
//! `machined.trial`, so its presence also says GRUB booted
//! ([`crate::cmdline::TRIAL`]).
//!
//! ## The same choice as systemd-boot
//!
//! From one [`BootState`] ([`rendering`]): the good slot is the fallback
//! ([`BootState::fallback`]: the default, or during a trial the slot the
//! upgrade came from), the trial is the pending upgrade's slot with the
//! tries it was given. An entry `+3-0` boots three times, renamed `+2-1`,
//! `+1-2`, `+0-3` before each boot, then sorts last; `trial_tries=3` is
//! saved as 2, 1, 0 before each of three boots, then the good slot boots.
//! [`next_boot`] models the script; the tests run both models side by side.

use crate::boot::{Entry, EntryName, boot_order};
use crate::grubenv::{self, GrubEnv, Trial};
use crate::slot::Slot;
use crate::state::{Assessment, BootState, FallbackReason, best_entry};

pub use crate::paths::{
    BOOT_GRUB_CFG as CONFIG_PATH, BOOT_GRUB_ENV as ENV_PATH, BOOT_GRUB_ENV_DIR as ENV_DIR,
};
/// The part of `grub.cfg` that changes: its first sector.
pub const STATE_LEN: usize = 512;
/// The variable of `grub.cfg`'s first sector naming the good slot.
pub const GOOD_SLOT: &str = "good_slot";

/// Slot X's GRUB snippet: `X/grub.cfg`.
pub fn slot_config_path(slot: Slot) -> String {
    format!("{slot}/grub.cfg")
}

const HEADER: &str = "# Written by imager (contract::grubcfg): the BIOS boot path. Do not edit.\n\
                      # Only this first 512-byte sector changes, rewritten in place.\n";

/// The first sector of `grub.cfg`: comments, `set good_slot=X`, `#` up to
/// the sector's last byte, a newline.
pub fn state_sector(good: Slot) -> [u8; STATE_LEN] {
    let mut s = [b'#'; STATE_LEN];
    let text = format!("{HEADER}set {GOOD_SLOT}={good}\n");
    s[..text.len()].copy_from_slice(text.as_bytes());
    s[STATE_LEN - 1] = b'\n';
    s
}

/// The good slot `grub.cfg`'s first sector names, when the sector is
/// exactly one [`state_sector`] writes.
pub fn read_good(cfg: &[u8]) -> Option<Slot> {
    let first = cfg.get(..STATE_LEN)?;
    Slot::ALL.into_iter().find(|s| first == state_sector(*s))
}

/// The part of `grub.cfg` after its first sector, the same for every state.
pub fn script() -> String {
    let env = format!("/{ENV_PATH}");
    let mut s = String::from(
        "serial --unit=0 --speed=115200\n\
         terminal_input serial console\n\
         terminal_output serial console\n\
         set timeout=0\n\
         set boot_slot=\"${good_slot}\"\n\
         set boot_trial=0\n\
         set trial_slot=\n\
         set trial_tries=\n\
         set trial_ok=0\n",
    );
    s.push_str(&format!(
        "load_env -f {env} {} {}\n",
        grubenv::TRIAL_SLOT,
        grubenv::TRIAL_TRIES
    ));
    // One flat `if` a rung, comparing the value loaded (`tries_was`), not
    // the one being lowered: GRUB 2.06 as Debian ships it stops a script
    // nested 64 commands deep ("maximum recursion depth exceeded",
    // script/execute.c), which an `elif` chain of 99 rungs is.
    s.push_str(
        "if [ \"${trial_slot}\" = \"A\" ]; then set trial_ok=1; fi\n\
         if [ \"${trial_slot}\" = \"B\" ]; then set trial_ok=1; fi\n\
         set tries_was=\n\
         if [ \"${trial_ok}\" = \"1\" ]; then set tries_was=\"${trial_tries}\"; fi\n",
    );
    for n in (1..=grubenv::MAX_TRIES).rev() {
        s.push_str(&format!(
            "if [ \"${{tries_was}}\" = \"{n}\" ]; then set trial_tries={}; set boot_trial=1; fi\n",
            n - 1
        ));
    }
    // The trial slot is loaded first and its try saved only once it
    // loaded (systemd-boot does not count an entry whose kernel is
    // missing either), then booted; if the save fails, it is not booted.
    s.push_str(&format!(
        "if [ \"${{boot_trial}}\" = \"1\" ]; then\n  \
         set loaded=\n  \
         source \"/${{trial_slot}}/grub.cfg\"\n  \
         if [ \"${{loaded}}\" = \"${{trial_slot}}\" ]; then\n    \
         if save_env -f {env} {}; then boot; fi\n  \
         fi\n  \
         set boot_trial=0\n\
         fi\n",
        grubenv::TRIAL_TRIES
    ));
    let attempt = "set loaded=\n\
                   source \"/${boot_slot}/grub.cfg\"\n\
                   if [ \"${loaded}\" = \"${boot_slot}\" ]; then boot; fi\n";
    s.push_str(attempt);
    s.push_str(
        "# The slot did not load: the other one, not as a trial.\n\
         if [ \"${boot_slot}\" = \"A\" ]; then set boot_slot=B; else set boot_slot=A; fi\n\
         set boot_trial=0\n",
    );
    s.push_str(attempt);
    s.push_str("echo \"imager: no slot could be loaded\"\n");
    s
}

/// The whole `grub.cfg` naming `good` the good slot.
pub fn render(good: Slot) -> Vec<u8> {
    let mut b = state_sector(good).to_vec();
    b.extend_from_slice(script().as_bytes());
    b
}

/// Characters GRUB's `linux` command passes to the kernel escaped with a
/// backslash (`grub_create_loader_cmdline`, grub-core/lib/cmdline.c in
/// GRUB 2.06): the kernel would see other arguments than systemd-boot
/// gives it.
pub const ESCAPED_BY_GRUB: [char; 3] = ['"', '\'', '\\'];

/// One word for GRUB's script parser: as it is when it holds only
/// characters the parser takes literally, else in single quotes (nothing
/// is expanded inside them).
pub fn word(s: &str) -> String {
    let plain = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.,:=/+@%".contains(c));
    if plain {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// `X/grub.cfg`: loads slot X's kernel with the entry's options and
/// `machined.trial=${boot_trial}`, then its initramfs, and only when both
/// loaded sets `loaded=X`. Refused when the entry is not slot X's (its
/// files outside `X/`), has no kernel, or its options hold a character
/// GRUB would pass escaped ([`ESCAPED_BY_GRUB`]).
pub fn slot_config(slot: Slot, entry: &Entry) -> Result<String, String> {
    if let Some(c) = crate::grub::unpassable(&entry.options) {
        return Err(format!(
            "the kernel command line holds `{c}`, which GRUB (the BIOS boot path) passes to \
             the kernel escaped with a backslash: remove it"
        ));
    }
    let dir = format!("{slot}/");
    if entry.linux.is_empty() {
        return Err(format!("slot {slot}'s boot entry has no kernel"));
    }
    for f in [&entry.linux, &entry.initrd] {
        if !f.is_empty() && (!f.starts_with(&dir) || !path_ok(f)) {
            return Err(format!(
                "slot {slot}'s boot entry names {f:?}, not a file in {dir}"
            ));
        }
    }
    let mut linux = format!("linux {}", word(&format!("/{}", entry.linux)));
    for arg in entry.options.split_whitespace() {
        linux.push(' ');
        linux.push_str(&word(arg));
    }
    linux.push_str(&format!(
        " {}=${{boot_trial}} {}=${{boot_part}}",
        crate::cmdline::TRIAL,
        crate::cmdline::BOOT_PART
    ));
    // The version only when it cannot end the comment it is in.
    let version = if entry
        .version
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || ".-_+~".contains(c))
    {
        entry.version.as_str()
    } else {
        "?"
    };
    let mut s = format!(
        "# Written by imager: slot {slot} ({version}) for GRUB, sourced by /{CONFIG_PATH}.\n"
    );
    // The unique GUID of BOOT, read from its disk's GPT: the runtime's
    // word on which disk booted (docs/design.md, "The boot disk"). A core
    // image without `probe` (written before it had it) leaves it empty.
    s.push_str("set boot_part=\nprobe --set=boot_part --part-uuid \"${root}\"\n");
    s.push_str(&format!("if {linux}; then\n"));
    if entry.initrd.is_empty() {
        s.push_str(&format!("  set loaded={slot}\n"));
    } else {
        s.push_str(&format!(
            "  if initrd {}; then\n    set loaded={slot}\n  fi\n",
            word(&format!("/{}", entry.initrd))
        ));
    }
    s.push_str("fi\n");
    Ok(s)
}

/// A path of BOOT as an entry may name it: no control character (it would
/// end a line of the script), no empty, `.` or `..` component.
fn path_ok(p: &str) -> bool {
    !p.chars().any(char::is_control) && p.split('/').all(|c| !c.is_empty() && c != "." && c != "..")
}

/// The length of the command line GRUB gives the kernel for `entry`:
/// `BOOT_IMAGE=/<linux>`, the options, `machined.trial=N` and
/// `machined.boot_part=GUID`, separated by single spaces (GRUB 2.06's i386
/// `linux` command). Compare with [`crate::cmdline::MAX_LEN`].
pub fn loaded_len(entry: &Entry) -> usize {
    let words: usize = entry.options.split_whitespace().map(|w| w.len() + 1).sum();
    "BOOT_IMAGE=/".len()
        + entry.linux.len()
        + words
        + " machined.trial=1".len()
        + format!(" {}=", crate::cmdline::BOOT_PART).len()
        + 36
}

/// GRUB's rendering of a state: the good slot (`grub.cfg`'s first sector)
/// and the environment block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Rendering {
    pub good: Slot,
    pub env: GrubEnv,
}

/// How the trial's tries are set by [`rendering`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tries {
    /// A new trial (the switch of an upgrade): this many.
    Arm(u32),
    /// Keep GRUB's count when the block already names the trial slot;
    /// otherwise no trial (the switch was not made).
    Keep,
    /// No trial, whatever META says: an upgrade replacing the slot on
    /// trial takes it off trial before it removes its files.
    Disarm,
}

/// GRUB's rendering of `state`, given the block on the disk now
/// (`current`): the good slot is [`BootState::fallback`]; the trial is
/// the pending upgrade's slot, its tries as `tries` says.
pub fn rendering(state: &BootState, current: GrubEnv, tries: Tries) -> Rendering {
    let trial = state.pending.as_ref().and_then(|p| match tries {
        Tries::Arm(n) => Some(Trial {
            slot: p.to,
            tries: n,
        }),
        Tries::Keep => current.trial.filter(|t| t.slot == p.to),
        Tries::Disarm => None,
    });
    Rendering {
        good: state.fallback(),
        env: GrubEnv { trial },
    }
}

/// The slot GRUB boots next with `grub.cfg` naming `good` and this block
/// (every slot loading).
pub fn choice(good: Option<Slot>, env: GrubEnv) -> Slot {
    next_boot(good, env).slot
}

/// What one boot under GRUB does: the slot booted, whether as a trial, and
/// the block `save_env` left (`None`: not written).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrubBoot {
    pub slot: Slot,
    pub trial: bool,
    pub saved: Option<GrubEnv>,
}

/// The script's decision ([`script`]) for a `grub.cfg` naming `good`
/// (`None`: a first sector GRUB does not understand; the script then tries
/// A) and the block GRUB loaded, when every slot loads.
pub fn next_boot(good: Option<Slot>, env: GrubEnv) -> GrubBoot {
    match env.trial {
        Some(t) if t.tries > 0 => GrubBoot {
            slot: t.slot,
            trial: true,
            saved: Some(GrubEnv::trial(t.slot, t.tries - 1)),
        },
        _ => GrubBoot {
            slot: good.unwrap_or(Slot::A),
            trial: false,
            saved: None,
        },
    }
}

#[cfg(test)]
mod script_tests;
/// What a boot under GRUB means, for the runtime (booted with
/// `machined.trial`): [`crate::state::assess`] with GRUB's rendering in
/// place of systemd-boot's for the slot on trial, and the rule of
/// docs/design.md ("Two renderings of one state") for a cut between the
/// two loaders' switches: such a switch is finished, never undone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GrubAssessment {
    /// As under systemd-boot; then GRUB's rendering follows META
    /// ([`Tries::Keep`]).
    As(Assessment),
    /// An upgrade's systemd-boot switch was made (its entry untried,
    /// `+N-0`) and GRUB's was not: arm GRUB's trial with `tries`
    /// ([`Tries::Arm`]) and record nothing; the next boot tries the slot.
    FinishSwitch { tries: u32 },
    /// META and systemd-boot's entries name another slot than GRUB booted
    /// (a rollback cut before GRUB's switch): GRUB's rendering follows META
    /// ([`Tries::Keep`]); META is not moved.
    FollowMeta,
    /// The slot on trial is blessed in systemd-boot's entries (a plain
    /// entry) but not in META or GRUB's rendering (a blessing cut short, or
    /// its last try used under GRUB): finish its blessing.
    FinishBlessing { slot: Slot },
}

/// Decides what a boot of `booted` by GRUB means, from META's `state`,
/// systemd-boot's `entries` and GRUB's block `env`.
pub fn assess_grub(
    state: &BootState,
    entries: &[EntryName],
    env: GrubEnv,
    booted: Slot,
) -> GrubAssessment {
    if let Some(p) = &state.pending
        && p.to != booted
    {
        let entry = best_entry(entries, p.to);
        // A plain entry of the trial's generation (or above): the blessing
        // wrote it (an upgrade removes the slot's entries before its
        // switch), whether or not the counting one is gone yet.
        let top = entries
            .iter()
            .filter(|e| e.slot == p.to)
            .map(|e| e.generation)
            .max();
        let blessed = top.is_some_and(|top| {
            entries
                .iter()
                .any(|e| e.slot == p.to && e.tries.is_none() && e.generation >= top)
        });
        if blessed {
            return GrubAssessment::FinishBlessing { slot: p.to };
        }
        let fell_back = |reason| {
            GrubAssessment::As(Assessment::FellBack {
                failed: p.to,
                version: p.to_version.clone(),
                reason,
            })
        };
        return match env.trial.filter(|t| t.slot == p.to) {
            Some(t) if t.tries == 0 => fell_back(FallbackReason::TriesExhausted {
                tries: tries_given(state).unwrap_or(0),
            }),
            // GRUB had tries left and booted another slot: the trial slot
            // did not load, or its try could not be saved.
            Some(_) => fell_back(FallbackReason::Abandoned),
            // systemd-boot switched (the slot's untried entry boots first)
            // and GRUB did not.
            None => match entry.filter(|e| boot_order(entries).first() == Some(e)) {
                Some(EntryName { tries: Some(t), .. }) if t.done == 0 && t.left > 0 => {
                    GrubAssessment::FinishSwitch { tries: t.left }
                }
                _ => GrubAssessment::As(crate::state::assess(state, entries, booted)),
            },
        };
    }
    if state.pending.is_none()
        && state.default != booted
        && boot_order(entries)
            .iter()
            .find(|e| !e.is_exhausted())
            .is_some_and(|e| e.slot == state.default)
    {
        return GrubAssessment::FollowMeta;
    }
    GrubAssessment::As(crate::state::assess(state, entries, booted))
}

/// The tries the pending upgrade was given: `tries=N` of the last
/// `upgrade-started` event.
fn tries_given(state: &BootState) -> Option<u32> {
    state
        .history
        .iter()
        .rev()
        .find(|l| l.split_whitespace().nth(1) == Some("upgrade-started"))?
        .split_whitespace()
        .find_map(|w| w.strip_prefix("tries=")?.parse().ok())
}

#[cfg(test)]
mod tests;
