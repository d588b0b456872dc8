use super::*;
use crate::boot::{EntryName, boot_order, slot_entry};
use crate::meta::SlotStatus;
use crate::state::Pending;

fn steady(default: Slot) -> BootState {
    let mut s = BootState {
        default,
        slots: [None, None],
        pending: None,
        history: Vec::new(),
        security_floor: 0,
    };
    s.set(Slot::A, SlotStatus::Good, "1");
    s.set(Slot::B, SlotStatus::Good, "2");
    s
}

fn on_trial(from: Slot) -> BootState {
    let mut s = steady(from);
    s.set(from.other(), SlotStatus::Pending, "3");
    s.default = from.other();
    s.pending = Some(Pending {
        from,
        to: from.other(),
        from_version: "1".into(),
        to_version: "3".into(),
    });
    s
}

#[test]
fn state_sector_names_the_good_slot() {
    for good in Slot::ALL {
        let cfg = render(good);
        assert_eq!(read_good(&cfg), Some(good));
        assert_eq!(cfg[STATE_LEN - 1], b'\n');
        let text = String::from_utf8(cfg[..STATE_LEN].to_vec()).unwrap();
        assert!(
            text.contains(&format!("\nset good_slot={good}\n")),
            "{text}"
        );
        // Only the first sector differs between the two renderings.
        assert_eq!(cfg[STATE_LEN..], render(good.other())[STATE_LEN..]);
    }
    let mut cfg = render(Slot::A);
    cfg[100] = b'x';
    assert_eq!(read_good(&cfg), None);
    assert_eq!(read_good(&cfg[..100]), None);
}

#[test]
fn script_counts_down_and_saves_before_it_boots() {
    let s = script();
    assert!(s.contains("load_env -f /grub/env/grubenv trial_slot trial_tries\n"));
    for (n, m) in [(99, 98), (3, 2), (2, 1), (1, 0)] {
        assert!(s.contains(&format!(
            "\nif [ \"${{tries_was}}\" = \"{n}\" ]; then set trial_tries={m}; set boot_trial=1; fi\n"
        )));
    }
    assert!(!s.contains("elif"), "no elif chain: GRUB's nesting limit");
    assert!(
        !s.contains("\"0\" ]; then"),
        "no rung for 0: the good slot boots"
    );
    // The trial slot loaded, then its try saved, then booted.
    let source = s.find("source \"/${trial_slot}/grub.cfg\"").unwrap();
    let save = s
        .find("if save_env -f /grub/env/grubenv trial_tries; then boot; fi")
        .unwrap();
    assert!(source < save);
    assert_eq!(s.matches("; then boot; fi").count(), 3);
}

#[test]
fn slot_config_loads_the_entry_and_says_so() {
    let e = slot_entry(
        Slot::B,
        "0123456789abcdef0123",
        "fedcba9876543210ff",
        "Imager 1.0",
        "1.0",
        "console=ttyS0,115200 panic=10 x=$y;z",
    );
    assert_eq!(
        slot_config(Slot::B, &e).unwrap(),
        "# Written by imager: slot B (1.0) for GRUB, sourced by /grub/grub.cfg.\n\
         set boot_part=\n\
         probe --set=boot_part --part-uuid \"${root}\"\n\
         if linux /B/vmlinuz-0123456789abcdef console=ttyS0,115200 panic=10 'x=$y;z' \
         machined.slot=B machined.trial=${boot_trial} machined.boot_part=${boot_part}; then\n  \
         if initrd /B/initramfs-fedcba9876543210.zst; then\n    \
         set loaded=B\n  \
         fi\n\
         fi\n"
    );
    assert_eq!(slot_config_path(Slot::B), "B/grub.cfg");
    assert!(
        slot_config(Slot::A, &e)
            .unwrap_err()
            .contains("not a file in A/")
    );
    for bad in ["a=\"b c\"", "a='b'", "a\\b"] {
        let e = Entry {
            options: bad.into(),
            ..e.clone()
        };
        assert!(
            slot_config(Slot::B, &e)
                .unwrap_err()
                .contains("escaped with a backslash")
        );
    }
    let e2 = Entry {
        linux: "B/../A/vmlinuz".into(),
        ..e.clone()
    };
    assert!(slot_config(Slot::B, &e2).is_err());
    let e3 = Entry {
        linux: "B/vmlinuz\nboot".into(),
        ..e.clone()
    };
    assert!(slot_config(Slot::B, &e3).is_err());
    // A version that could end its comment line is not written.
    let e4 = Entry {
        version: "1\nboot".into(),
        ..e.clone()
    };
    let text = slot_config(Slot::B, &e4).unwrap();
    assert!(
        text.starts_with("# Written by imager: slot B (?) for GRUB"),
        "{text}"
    );
    assert_eq!(text.lines().count(), 8);
    // BOOT_IMAGE=/B/vmlinuz-… + options + machined.trial=1 +
    // machined.boot_part=GUID
    let want = format!(
        "BOOT_IMAGE=/{} {} machined.trial=1 machined.boot_part={}",
        e.linux,
        e.options,
        crate::guid::Guid::nil()
    );
    assert_eq!(loaded_len(&e), want.len());
}

#[path = "../../../tests/common/tool.rs"]
#[allow(dead_code)]
mod tool;

/// grub-script-check (grub-common, which scripts/setup.sh installs) parses
/// what we render.
#[test]
fn grub_parses_the_scripts() {
    use std::io::Write;
    use std::process::Stdio;
    let e = slot_entry(Slot::A, "00", "11", "T", "1", "console=ttyS0 x=$y;z a=b{c}");
    for text in [
        render(Slot::A),
        slot_config(Slot::A, &e).unwrap().into_bytes(),
    ] {
        let mut c = tool::tool("grub-script-check")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        c.stdin.take().unwrap().write_all(&text).unwrap();
        let out = c.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}\n{}",
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&text)
        );
    }
}

#[test]
fn renderings_of_every_state() {
    let none = GrubEnv::none();
    // No trial: the default slot, whatever the block said.
    for d in Slot::ALL {
        for current in [none, GrubEnv::trial(d.other(), 2)] {
            assert_eq!(
                rendering(&steady(d), current, Tries::Keep),
                Rendering { good: d, env: none }
            );
        }
    }
    let t = on_trial(Slot::A);
    // The switch: armed with the tries given.
    assert_eq!(
        rendering(&t, none, Tries::Arm(3)),
        Rendering {
            good: Slot::A,
            env: GrubEnv::trial(Slot::B, 3)
        }
    );
    // On trial: GRUB's count is kept, 3, 2, 1 or 0 left.
    for left in [3, 2, 1, 0] {
        assert_eq!(
            rendering(&t, GrubEnv::trial(Slot::B, left), Tries::Keep),
            Rendering {
                good: Slot::A,
                env: GrubEnv::trial(Slot::B, left)
            }
        );
    }
    // META pending, but the block names no trial (the switch not made) or
    // another slot: no trial.
    for current in [none, GrubEnv::trial(Slot::A, 3)] {
        assert_eq!(rendering(&t, current, Tries::Keep).env, none);
    }
    // Rolled back (or fallen back): the other slot good, no trial.
    let mut back = t.clone();
    back.pending = None;
    back.default = Slot::A;
    back.set(Slot::B, SlotStatus::Bad, "3");
    assert_eq!(
        rendering(&back, GrubEnv::trial(Slot::B, 0), Tries::Keep),
        Rendering {
            good: Slot::A,
            env: none
        }
    );
}

#[test]
fn next_boot_follows_the_ladder() {
    assert_eq!(
        next_boot(Some(Slot::A), GrubEnv::none()),
        GrubBoot {
            slot: Slot::A,
            trial: false,
            saved: None
        }
    );
    assert_eq!(
        next_boot(Some(Slot::A), GrubEnv::trial(Slot::B, 1)),
        GrubBoot {
            slot: Slot::B,
            trial: true,
            saved: Some(GrubEnv::trial(Slot::B, 0))
        }
    );
    assert_eq!(
        next_boot(Some(Slot::A), GrubEnv::trial(Slot::B, 0)).slot,
        Slot::A
    );
    assert_eq!(next_boot(None, GrubEnv::none()).slot, Slot::A);
}

/// systemd-boot's choice among entries, renaming a counting entry as it
/// boots it (as systemd-boot does).
fn sd_boot(entries: &mut [EntryName]) -> Slot {
    let first = boot_order(entries)[0];
    if let Some(t) = first.tries
        && t.left > 0
    {
        let i = entries.iter().position(|e| *e == first).unwrap();
        entries[i].tries = Some(crate::boot::Tries {
            left: t.left - 1,
            done: t.done + 1,
        });
    }
    first.slot
}

/// One BootState, both renderings, the same slot at every boot: an upgrade
/// that fails every boot (tries 1 to 5), one blessed after `k` boots, a
/// rollback.
#[test]
fn both_loaders_boot_the_same_slots() {
    for from in Slot::ALL {
        for tries in 1..=5u32 {
            let state = on_trial(from);
            let mut entries = vec![
                EntryName::good(1, from),
                EntryName::trial(2, from.other(), tries),
            ];
            let r = rendering(&state, GrubEnv::none(), Tries::Arm(tries));
            let mut env = r.env;
            for boot in 0..tries + 3 {
                let sd = sd_boot(&mut entries);
                let g = next_boot(Some(r.good), env);
                if let Some(saved) = g.saved {
                    env = saved;
                }
                assert_eq!(sd, g.slot, "from {from}, {tries} tries, boot {boot}");
                assert_eq!(g.trial, boot < tries);
            }
            // Blessed after one boot: both boot the new slot from then on.
            let mut entries = vec![
                EntryName::good(1, from),
                EntryName::trial(2, from.other(), tries),
            ];
            let mut env = r.env;
            let first_sd = sd_boot(&mut entries);
            let first = next_boot(Some(r.good), env);
            env = first.saved.unwrap();
            assert_eq!((first_sd, first.slot), (from.other(), from.other()));
            entries = vec![EntryName::good(1, from), EntryName::good(2, from.other())];
            let mut blessed = state.clone();
            blessed.pending = None;
            blessed.set(from.other(), SlotStatus::Good, "3");
            let r2 = rendering(&blessed, env, Tries::Keep);
            for _ in 0..3 {
                assert_eq!(sd_boot(&mut entries), from.other());
                assert_eq!(next_boot(Some(r2.good), r2.env).slot, from.other());
            }
        }
        // A rollback of a steady disk: the other slot's entry, generation
        // above all; GRUB's good slot the other one.
        let back = steady(from.other());
        let mut entries = vec![EntryName::good(1, from), EntryName::good(2, from.other())];
        entries.push(EntryName::good(3, from.other()));
        let r = rendering(&back, GrubEnv::none(), Tries::Keep);
        assert_eq!(sd_boot(&mut entries), from.other());
        assert_eq!(next_boot(Some(r.good), r.env).slot, from.other());
    }
}

/// The cut windows of docs/design.md: booted under GRUB on the slot GRUB's
/// unswitched rendering names, the runtime finishes the switch the other
/// rendering and META already made, as a boot under systemd-boot would.
#[test]
fn a_switch_cut_between_the_loaders_is_finished() {
    use crate::state::{Assessment, FallbackReason};
    let (f, x) = (Slot::A, Slot::B);
    let mut up = on_trial(f);
    up.record("upgrade-started from=A to=B from-version=1 to-version=3 tries=3");
    let none = GrubEnv::none();
    // Upgrade cut between systemd-boot's switch and GRUB's.
    let entries = [EntryName::good(1, f), EntryName::trial(2, x, 3)];
    assert_eq!(
        assess_grub(&up, &entries, none, f),
        GrubAssessment::FinishSwitch { tries: 3 }
    );
    // An untried entry of X that does not boot first (left by an
    // abandoned trial) is no switch: as under systemd-boot.
    let stale = [EntryName::trial(2, x, 3), EntryName::good(3, f)];
    assert_eq!(
        assess_grub(&up, &stale, none, f),
        GrubAssessment::As(crate::state::assess(&up, &stale, f))
    );
    // The switch not made at all: as under systemd-boot.
    assert_eq!(
        assess_grub(&up, &[EntryName::good(1, f)], none, f),
        GrubAssessment::As(crate::state::assess(&up, &[EntryName::good(1, f)], f))
    );
    // The trial slot booted: a trial, whatever the rest says.
    assert_eq!(
        assess_grub(&up, &entries, GrubEnv::trial(x, 2), x),
        GrubAssessment::As(Assessment::Trial {
            entry: Some(EntryName::trial(2, x, 3))
        })
    );
    // GRUB used up the tries.
    assert_eq!(
        assess_grub(&up, &entries, GrubEnv::trial(x, 0), f),
        GrubAssessment::As(Assessment::FellBack {
            failed: x,
            version: "3".into(),
            reason: FallbackReason::TriesExhausted { tries: 3 }
        })
    );
    // GRUB had tries and booted F: the trial slot did not load.
    assert!(matches!(
        assess_grub(&up, &entries, GrubEnv::trial(x, 2), f),
        GrubAssessment::As(Assessment::FellBack {
            reason: FallbackReason::Abandoned,
            ..
        })
    ));
    // Blessed in systemd-boot's entries, last try used under GRUB.
    let exhausted = EntryName::parse("g00000002-slot-b+0-3.conf").unwrap();
    for blessed in [
        vec![EntryName::good(1, f), EntryName::good(2, x)],
        // The counting entry not removed yet.
        vec![EntryName::good(1, f), EntryName::good(2, x), exhausted],
    ] {
        assert_eq!(
            assess_grub(&up, &blessed, GrubEnv::trial(x, 0), f),
            GrubAssessment::FinishBlessing { slot: x }
        );
    }
    // An older plain entry of X is no blessing.
    let old = [
        EntryName::good(1, x),
        EntryName::good(2, f),
        EntryName::parse("g00000003-slot-b+0-3.conf").unwrap(),
    ];
    assert!(matches!(
        assess_grub(&up, &old, GrubEnv::trial(x, 0), f),
        GrubAssessment::As(Assessment::FellBack { .. })
    ));
    // Rollback to F cut before GRUB's switch (GRUB still names X good).
    let back = steady(f);
    let entries = [EntryName::good(2, x), EntryName::good(3, f)];
    assert_eq!(
        assess_grub(&back, &entries, none, x),
        GrubAssessment::FollowMeta
    );
    // Both renderings name X (moved by hand): META follows, as before.
    let entries = [EntryName::good(3, x)];
    assert_eq!(
        assess_grub(&back, &entries, none, x),
        GrubAssessment::As(Assessment::DefaultMoved)
    );
    assert_eq!(
        assess_grub(&back, &entries, none, f),
        GrubAssessment::As(Assessment::Steady)
    );
}
