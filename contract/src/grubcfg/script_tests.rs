//! Runs the rendered `grub.cfg` and `X/grub.cfg` through a small
//! interpreter of the part of GRUB's script language they use (words with
//! quotes and `${var}`, `;`, `if`/`elif`/`else`/`fi`, `[ a = b ]`, `set`,
//! `load_env`, `save_env`, `source`, `probe`, `linux`, `initrd`, `boot`), so that
//! the text itself, not only the model [`next_boot`], is checked: for every
//! good slot, every block (none, unreadable, no trial, each slot with 0 to
//! 99 tries) and a `save_env` that works or fails. A command it does not
//! know fails the test. (grub-script-check checks the syntax against GRUB's
//! own parser in `tests.rs`; a boot in QEMU under SeaBIOS is still to come.)

use super::*;
use crate::boot::slot_entry;
use crate::grubenv::{GrubEnv, SIGNATURE};
use std::collections::HashMap;

#[derive(Debug, Clone)]
enum Seg {
    Lit(String),
    Var(String),
}

type Word = Vec<Seg>;

#[derive(Debug, Clone)]
enum Tok {
    Word(Word),
    Sep,
}

fn tokenize(text: &str) -> Vec<Tok> {
    let c: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    let mut word: Word = Vec::new();
    let mut in_word = false;
    let flush = |word: &mut Word, in_word: &mut bool, out: &mut Vec<Tok>| {
        if *in_word {
            out.push(Tok::Word(std::mem::take(word)));
            *in_word = false;
        }
    };
    let var = |c: &[char], i: &mut usize| -> String {
        // at '$'
        *i += 1;
        let mut name = String::new();
        if c[*i] == '{' {
            *i += 1;
            while c[*i] != '}' {
                name.push(c[*i]);
                *i += 1;
            }
            *i += 1;
        } else {
            while *i < c.len() && (c[*i].is_ascii_alphanumeric() || c[*i] == '_') {
                name.push(c[*i]);
                *i += 1;
            }
        }
        name
    };
    while i < c.len() {
        match c[i] {
            '#' if !in_word => {
                while i < c.len() && c[i] != '\n' {
                    i += 1;
                }
            }
            '\n' | ';' => {
                flush(&mut word, &mut in_word, &mut out);
                out.push(Tok::Sep);
                i += 1;
            }
            ' ' | '\t' => {
                flush(&mut word, &mut in_word, &mut out);
                i += 1;
            }
            '\'' => {
                in_word = true;
                i += 1;
                let mut s = String::new();
                while c[i] != '\'' {
                    s.push(c[i]);
                    i += 1;
                }
                i += 1;
                word.push(Seg::Lit(s));
            }
            '"' => {
                in_word = true;
                i += 1;
                while c[i] != '"' {
                    if c[i] == '$' {
                        word.push(Seg::Var(var(&c, &mut i)));
                    } else {
                        word.push(Seg::Lit(c[i].to_string()));
                        i += 1;
                    }
                }
                i += 1;
            }
            '$' => {
                in_word = true;
                word.push(Seg::Var(var(&c, &mut i)));
            }
            '\\' => {
                in_word = true;
                word.push(Seg::Lit(c[i + 1].to_string()));
                i += 2;
            }
            ch => {
                in_word = true;
                word.push(Seg::Lit(ch.to_string()));
                i += 1;
            }
        }
    }
    flush(&mut word, &mut in_word, &mut out);
    out
}

#[derive(Debug, Clone)]
enum Cmd {
    Simple(Vec<Word>),
    If(Vec<(Vec<Cmd>, Vec<Cmd>)>, Vec<Cmd>),
}

fn keyword(w: &Word) -> Option<String> {
    let s: String = w
        .iter()
        .map(|s| match s {
            Seg::Lit(l) => Some(l.as_str()),
            Seg::Var(_) => None,
        })
        .collect::<Option<String>>()?;
    ["if", "then", "elif", "else", "fi"]
        .contains(&s.as_str())
        .then_some(s)
}

/// Parses commands up to one of `stop` (a keyword at a command's start),
/// returning it.
fn parse(t: &[Tok], i: &mut usize, stop: &[&str]) -> (Vec<Cmd>, Option<String>) {
    let mut cmds = Vec::new();
    loop {
        while matches!(t.get(*i), Some(Tok::Sep)) {
            *i += 1;
        }
        let Some(Tok::Word(w)) = t.get(*i) else {
            return (cmds, None);
        };
        match keyword(w) {
            Some(k) if stop.contains(&k.as_str()) => {
                *i += 1;
                return (cmds, Some(k));
            }
            Some(k) if k == "if" => {
                *i += 1;
                let mut arms = Vec::new();
                let mut els = Vec::new();
                loop {
                    let (cond, k) = parse(t, i, &["then"]);
                    assert_eq!(k.as_deref(), Some("then"));
                    let (body, k) = parse(t, i, &["elif", "else", "fi"]);
                    arms.push((cond, body));
                    match k.as_deref() {
                        Some("elif") => continue,
                        Some("else") => {
                            let (b, k) = parse(t, i, &["fi"]);
                            assert_eq!(k.as_deref(), Some("fi"));
                            els = b;
                            break;
                        }
                        Some("fi") => break,
                        k => panic!("if without fi: {k:?}"),
                    }
                }
                cmds.push(Cmd::If(arms, els));
            }
            Some(k) => panic!("unexpected {k}"),
            None => {
                let mut words = Vec::new();
                while let Some(Tok::Word(w)) = t.get(*i) {
                    words.push(w.clone());
                    *i += 1;
                }
                cmds.push(Cmd::Simple(words));
            }
        }
    }
}

struct Machine {
    vars: HashMap<String, String>,
    /// The block file: `None` when missing.
    block: Option<Vec<u8>>,
    save_works: bool,
    /// Files that load: slot configs by path, kernels and initramfs.
    files: HashMap<String, String>,
    cmdline: Option<String>,
    saves: usize,
    /// Commands nested now, and at most: GRUB stops at 64.
    depth: usize,
    max_depth: usize,
}

enum Flow {
    Status(bool),
    Booted(String),
}

impl Machine {
    fn expand(&self, w: &Word) -> String {
        w.iter()
            .map(|s| match s {
                Seg::Lit(l) => l.clone(),
                Seg::Var(v) => self.vars.get(v).cloned().unwrap_or_default(),
            })
            .collect()
    }

    fn run(&mut self, cmds: &[Cmd]) -> Flow {
        self.depth += 1;
        self.max_depth = self.max_depth.max(self.depth);
        let flow = self.run_list(cmds);
        self.depth -= 1;
        flow
    }

    fn run_list(&mut self, cmds: &[Cmd]) -> Flow {
        let mut status = true;
        for c in cmds {
            match c {
                Cmd::If(arms, els) => {
                    let mut done = false;
                    for (cond, body) in arms {
                        match self.run(cond) {
                            Flow::Booted(b) => return Flow::Booted(b),
                            Flow::Status(true) => {
                                if let Flow::Booted(b) = self.run(body) {
                                    return Flow::Booted(b);
                                }
                                done = true;
                                break;
                            }
                            Flow::Status(false) => {}
                        }
                    }
                    if !done && let Flow::Booted(b) = self.run(els) {
                        return Flow::Booted(b);
                    }
                    status = true;
                }
                Cmd::Simple(words) => {
                    let argv: Vec<String> = words.iter().map(|w| self.expand(w)).collect();
                    match self.simple(&argv) {
                        Flow::Booted(b) => return Flow::Booted(b),
                        Flow::Status(s) => status = s,
                    }
                }
            }
        }
        Flow::Status(status)
    }

    fn simple(&mut self, argv: &[String]) -> Flow {
        let a: Vec<&str> = argv.iter().map(String::as_str).collect();
        let ok = match a.as_slice() {
            ["serial" | "terminal_input" | "terminal_output" | "echo", ..] => true,
            ["set", kv] => {
                let (k, v) = kv.split_once('=').expect("set name=value");
                self.vars.insert(k.to_string(), v.to_string());
                true
            }
            ["[", x, "=", y, "]"] => x == y,
            ["load_env", "-f", path, names @ ..] => {
                assert_eq!(*path, format!("/{ENV_PATH}"));
                match self.block.as_deref().map(crate::grubenv::variables) {
                    Some(Ok(vars)) => {
                        for (n, v) in vars {
                            let n = String::from_utf8_lossy(&n).into_owned();
                            if names.contains(&n.as_str()) {
                                self.vars
                                    .insert(n, String::from_utf8_lossy(&v).into_owned());
                            }
                        }
                        true
                    }
                    _ => false,
                }
            }
            ["save_env", "-f", path, "trial_tries"] => {
                assert_eq!(*path, format!("/{ENV_PATH}"));
                if !self.save_works || self.block.is_none() {
                    false
                } else {
                    // The ladder only saves values the block held a rung
                    // above: render the block with the new count.
                    let env = GrubEnv::read(self.block.as_deref().unwrap_or_default())
                        .expect("saved only after a load");
                    let t = env.trial.expect("a trial");
                    let tries = self.vars["trial_tries"].parse().expect("a number");
                    self.block = Some(GrubEnv::trial(t.slot, tries).render().unwrap());
                    self.saves += 1;
                    true
                }
            }
            ["source", path] => match self.files.get(*path).cloned() {
                Some(text) => {
                    let t = tokenize(&text);
                    let (cmds, end) = parse(&t, &mut 0, &[]);
                    assert!(end.is_none());
                    return self.run(&cmds);
                }
                None => false,
            },
            ["linux", path, args @ ..] => {
                if self.files.contains_key(*path) {
                    self.cmdline = Some(args.join(" "));
                    true
                } else {
                    false
                }
            }
            ["initrd", path] => self.files.contains_key(*path),
            // GRUB sets `root` from its prefix, `(,gpt3)/grub`: BOOT.
            ["probe", "--set=boot_part", "--part-uuid", dev] => {
                assert_eq!(*dev, "hd0,gpt3", "probe of another device than BOOT");
                self.vars.insert("boot_part".into(), BOOT_PART_UUID.into());
                true
            }
            ["boot"] => match self.cmdline.clone() {
                Some(c) => return Flow::Booted(c),
                None => false,
            },
            other => panic!("the interpreter does not know {other:?}"),
        };
        Flow::Status(ok)
    }
}

/// What the interpreter's `probe --part-uuid` finds: BOOT's unique GUID.
const BOOT_PART_UUID: &str = "0f1e2d3c-4b5a-4968-8776-655443322110";

/// Runs grub.cfg for `good` against `block` with the slots in `present`
/// loadable: (slot booted, machined.trial, block after, saves).
fn run_cfg(
    good: Slot,
    block: Option<Vec<u8>>,
    save_works: bool,
    present: &[Slot],
) -> Option<(Slot, bool, Option<Vec<u8>>, usize)> {
    let mut files = HashMap::new();
    for s in present {
        let e = slot_entry(
            *s,
            "0123456789abcdef00",
            "fedcba987654321000",
            "T",
            "1",
            "console=ttyS0 x=$y;z",
        );
        files.insert(
            format!("/{}", slot_config_path(*s)),
            slot_config(*s, &e).unwrap(),
        );
        files.insert(format!("/{}", e.linux), String::new());
        files.insert(format!("/{}", e.initrd), String::new());
    }
    let mut m = Machine {
        vars: HashMap::from([("root".to_string(), "hd0,gpt3".to_string())]),
        block,
        save_works,
        files,
        cmdline: None,
        saves: 0,
        depth: 0,
        max_depth: 0,
    };
    let text = String::from_utf8(render(good)).unwrap();
    let t = tokenize(&text);
    let (cmds, end) = parse(&t, &mut 0, &[]);
    assert!(end.is_none());
    let flow = m.run(&cmds);
    // GRUB counts a level for each command list and each command in it;
    // at 64 it stops the script ("maximum recursion depth exceeded", seen
    // with an `elif` chain of 99 rungs). Lists nest at most 5 deep here
    // (a few commands each): far from it.
    assert!(m.max_depth <= 5, "nested {} deep", m.max_depth);
    match flow {
        Flow::Status(_) => None,
        Flow::Booted(cmdline) => {
            let slot = crate::cmdline::slot(&cmdline).expect("machined.slot");
            let trial = crate::cmdline::trial(&cmdline).expect("machined.trial");
            assert!(
                cmdline.starts_with("console=ttyS0 x=$y;z machined.slot="),
                "{cmdline}"
            );
            assert_eq!(
                crate::cmdline::get(&cmdline, crate::cmdline::BOOT_PART).as_deref(),
                Some(BOOT_PART_UUID),
                "{cmdline}"
            );
            Some((slot, trial, m.block, m.saves))
        }
    }
}

#[test]
fn the_script_does_what_the_model_says() {
    let both = [Slot::A, Slot::B];
    for good in Slot::ALL {
        let mut envs: Vec<GrubEnv> = vec![GrubEnv::none()];
        for s in Slot::ALL {
            for t in 0..=crate::grubenv::MAX_TRIES {
                envs.push(GrubEnv::trial(s, t));
            }
        }
        for env in envs {
            let block = env.render().unwrap();
            let want = next_boot(Some(good), env);
            let (slot, trial, after, saves) =
                run_cfg(good, Some(block.clone()), true, &both).expect("boots");
            assert_eq!((slot, trial), (want.slot, want.trial), "{good} {env:?}");
            let after = GrubEnv::read(&after.unwrap()).unwrap();
            assert_eq!(after, want.saved.unwrap_or(env), "{good} {env:?}");
            assert_eq!(saves, usize::from(want.saved.is_some()));
            // save_env fails: the good slot, not as a trial, nothing saved.
            let (slot, trial, after, _) =
                run_cfg(good, Some(block.clone()), false, &both).expect("boots");
            assert_eq!((slot, trial), (good, false), "{good} {env:?}");
            assert_eq!(after.as_deref(), Some(&block[..]));
            // The slot chosen does not load: the other one, not a trial.
            // Not counted: a slot that does not load uses no try.
            let other = [want.slot.other()];
            let (slot, trial, after, saves) =
                run_cfg(good, Some(block.clone()), true, &other).expect("boots");
            assert_eq!((slot, trial, saves), (want.slot.other(), false, 0));
            assert_eq!(after.as_deref(), Some(&block[..]));
        }
        // No block, a block GRUB refuses, values it does not know: good.
        let mut junk = SIGNATURE.to_vec();
        junk.extend_from_slice(b"trial_slot=C\ntrial_tries=3\n");
        let mut odd = SIGNATURE.to_vec();
        odd.extend_from_slice(b"trial_slot=B\ntrial_tries=03\n");
        for block in [None, Some(b"garbage".to_vec()), Some(junk), Some(odd)] {
            let (slot, trial, _, saves) = run_cfg(good, block, true, &both).expect("boots");
            assert_eq!((slot, trial, saves), (good, false, 0));
        }
        // Neither slot loads: nothing boots.
        assert!(run_cfg(good, None, true, &[]).is_none());
    }
}
