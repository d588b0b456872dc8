//! Tests of the test harness itself: what `scripts/test` does with a test
//! binary that crashes, a file that does not compile, a declared file that
//! runs no test and a tests/*.rs that is not declared; a shared fixture
//! whose build fails; a test whose tool is missing.
//!
//! Each test writes a throwaway crate under target/harness/ (no
//! dependencies: it builds in seconds) whose tests use the real pieces:
//! `scripts/lib/testrun.py`, which scripts/test runs every cargo test
//! command through, and `tests/common/fixture.rs` and `tests/common/tool.rs`,
//! compiled in with `#[path]`. What the inner runs print is quoted with
//! `| ` in front, so that it cannot pass for this binary's own results.

// Test helpers panic on unexpected failures: that is how a test fails.
#![allow(clippy::unwrap_used)]

mod common;

use common::repo;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A crate at target/harness/NAME with `files` (path, text) and one
/// `[[test]]` for each of `declared`.
fn toy(name: &str, declared: &[&str], files: &[(&str, String)]) -> PathBuf {
    let dir = repo().join("target/harness").join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("src")).unwrap();
    std::fs::create_dir_all(dir.join("tests")).unwrap();
    let mut manifest = format!(
        "[package]\nname = \"toy-{name}\"\nversion = \"0.0.0\"\nedition = \"2021\"\n\n\
         # Not part of the repository's workspace.\n[workspace]\n"
    );
    for t in declared {
        manifest.push_str(&format!(
            "\n[[test]]\nname = \"{t}\"\npath = \"tests/{t}.rs\"\n"
        ));
    }
    std::fs::write(dir.join("Cargo.toml"), manifest).unwrap();
    std::fs::write(dir.join("src/lib.rs"), "").unwrap();
    for (path, text) in files {
        std::fs::write(dir.join(path), text).unwrap();
    }
    dir
}

/// `#[path]` to a shared test module of the repository, for a toy's tests.
fn include(module: &str) -> String {
    let p = repo().join("tests/common").join(format!("{module}.rs"));
    format!(
        "#[path = {:?}]\n#[allow(dead_code)]\nmod {module};\n",
        p.display()
    )
}

fn testrun() -> Command {
    let mut c = Command::new("python3");
    c.arg(repo().join("scripts/lib/testrun.py"));
    c
}

/// `testrun.py run LOG LABEL -- cargo test` of the toy crate in `dir`, with
/// the runner that adds each test's time, as scripts/test runs its cargo
/// test commands; add `--test T` and the rest.
fn toy_test(dir: &Path, log: &Path, label: &str) -> Command {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut c = testrun();
    c.arg("run")
        .arg(log)
        .arg(label)
        .arg("--")
        .arg(&cargo)
        .args(["test", "--offline", "--config"])
        .arg(format!(
            "target.{}-unknown-linux-gnu.runner=[{:?}]",
            std::env::consts::ARCH,
            repo().join("scripts/lib/test-runner")
        ))
        .arg("--manifest-path")
        .arg(dir.join("Cargo.toml"))
        .env("CARGO_TARGET_DIR", dir.join("target"));
    c
}

/// `cargo test --test T` of the toy through testrun.py ([`toy_test`]), as
/// scripts/test runs a declared file; then testrun.py's summary. Both
/// outputs, quoted.
fn run_file(dir: &Path, t: &str) -> (Output, Output) {
    let log = dir.join("results.jsonl");
    let _ = std::fs::remove_file(&log);
    let run = common::run(toy_test(dir, &log, t).args(["--test", t]));
    let summary = common::run(testrun().arg("summary").arg(&log));
    (run, summary)
}

/// Everything a command printed, each line behind `| `.
fn quoted(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .chain(String::from_utf8_lossy(&o.stderr).lines())
        .map(|l| format!("| {l}\n"))
        .collect()
}

fn last_line(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .last()
        .unwrap_or_default()
        .to_string()
}

/// A file whose test passes: the run passes and counts it (the toy and the
/// reading of its output work, so the failures below are the failures
/// they are named for), and the summary names its slowest test with
/// libtest's time of it.
#[test]
fn a_passing_file_passes_and_is_counted() {
    let dir = toy(
        "pass",
        &["fine"],
        &[(
            "tests/fine.rs",
            "#[test]\nfn works() {}\n\
             #[test]\nfn takes_a_while() {\n    \
             std::thread::sleep(std::time::Duration::from_millis(1500));\n}\n"
                .into(),
        )],
    );
    let (run, summary) = run_file(&dir, "fine");
    let text = format!("{}{}", quoted(&run), quoted(&summary));
    assert!(run.status.success(), "{text}");
    assert!(summary.status.success(), "{text}");
    let slowest = String::from_utf8_lossy(&summary.stdout)
        .lines()
        .skip_while(|l| !l.starts_with("test: the slowest tests"))
        .nth(1)
        .unwrap_or_default()
        .to_string();
    let (secs, name) = slowest.trim().split_once("  ").unwrap_or_default();
    assert_eq!(name, "fine: takes_a_while", "{text}");
    let secs: f64 = secs.parse().unwrap_or(0.0);
    assert!((1.5..60.0).contains(&secs), "{text}");
    assert_eq!(
        last_line(&summary),
        "tests: 2 passed, 0 failed, 0 skipped",
        "{text}"
    );
}

/// A test binary that aborts (as a crash, a stack overflow or a double
/// panic does) prints no result line: the run fails and says so, and the
/// closing line counts it as failed.
#[test]
fn a_crashing_test_binary_fails_the_run() {
    let dir = toy(
        "crash",
        &["crash"],
        &[(
            "tests/crash.rs",
            "#[test]\nfn aborts() {\n    std::process::abort();\n}\n".into(),
        )],
    );
    let (run, summary) = run_file(&dir, "crash");
    let text = format!("{}{}", quoted(&run), quoted(&summary));
    assert!(!run.status.success(), "{text}");
    assert!(!summary.status.success(), "{text}");
    assert!(text.contains("the test binary crashed"), "{text}");
    assert_eq!(
        last_line(&summary),
        "tests: 0 passed, 1 failed, 0 skipped",
        "{text}"
    );
}

/// A declared file with no test in it fails the run.
#[test]
fn a_declared_file_without_tests_fails_the_run() {
    let dir = toy(
        "empty",
        &["empty", "fine"],
        &[
            ("tests/empty.rs", "// No test here.\n".into()),
            ("tests/fine.rs", "#[test]\nfn works() {}\n".into()),
        ],
    );
    let (run, summary) = run_file(&dir, "empty");
    let text = format!("{}{}", quoted(&run), quoted(&summary));
    assert!(!run.status.success(), "{text}");
    assert!(
        text.contains("a declared test file that ran no test"),
        "{text}"
    );
    assert!(!summary.status.success(), "{text}");
    assert!(
        last_line(&summary).ends_with(" failed, 0 skipped"),
        "{text}"
    );
    assert!(!last_line(&summary).contains(" 0 failed"), "{text}");
}

/// A failing test whose output holds look-alikes of cargo's and libtest's
/// lines (a result that passes nine, a `Running` header) is counted as
/// what it is: one failed test, in the binary it ran in.
#[test]
fn look_alike_lines_in_a_failed_tests_output_do_not_change_the_count() {
    let dir = toy(
        "lookalike",
        &["lookalike"],
        &[(
            "tests/lookalike.rs",
            "#[test]\nfn fails() {\n\
             \x20   println!(\"     Running fake.rs (target/debug/deps/fake)\");\n\
             \x20   println!(\"test result: ok. 9 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out\");\n\
             \x20   panic!(\"the real failure\");\n}\n\
             #[test]\nfn passes() {}\n"
                .into(),
        )],
    );
    let (run, summary) = run_file(&dir, "lookalike");
    let text = format!("{}{}", quoted(&run), quoted(&summary));
    assert!(!run.status.success(), "{text}");
    assert_eq!(
        last_line(&summary),
        "tests: 1 passed, 1 failed, 0 skipped",
        "{text}"
    );
    assert!(!text.contains("crashed"), "{text}");
}

/// A file that does not compile fails the run, and says so.
#[test]
fn a_file_that_does_not_compile_fails_the_run() {
    let dir = toy(
        "broken",
        &["broken"],
        &[(
            "tests/broken.rs",
            "#[test]\nfn f() { let x: u8 = \"no\"; }\n".into(),
        )],
    );
    let (run, summary) = run_file(&dir, "broken");
    let text = format!("{}{}", quoted(&run), quoted(&summary));
    assert!(!run.status.success(), "{text}");
    assert!(text.contains("did not compile"), "{text}");
    assert_eq!(
        last_line(&summary),
        "tests: 0 passed, 1 failed, 0 skipped",
        "{text}"
    );
}

/// A tests/*.rs beside the declared ones that is not declared fails the
/// run (it would never run); the declared names are what scripts/test runs.
#[test]
fn an_undeclared_test_file_fails_the_run() {
    let dir = toy(
        "undeclared",
        &["fine"],
        &[
            ("tests/fine.rs", "#[test]\nfn works() {}\n".into()),
            ("tests/stray.rs", "#[test]\nfn never_runs() {}\n".into()),
        ],
    );
    let out = common::run(testrun().arg("declared").arg(dir.join("Cargo.toml")));
    let text = quoted(&out);
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("stray.rs is not declared"), "{text}");
    // The declared files still run.
    assert_eq!(String::from_utf8_lossy(&out.stdout), "fine\n");
    std::fs::remove_file(dir.join("tests/stray.rs")).unwrap();
    let out = common::run(testrun().arg("declared").arg(dir.join("Cargo.toml")));
    assert!(out.status.success(), "{}", quoted(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "fine\n");
}

/// The repository's own test files are all declared.
#[test]
fn every_repository_test_file_is_declared() {
    let out = common::run(
        testrun()
            .arg("declared")
            .arg(repo().join("imager/Cargo.toml")),
    );
    assert!(out.status.success(), "{}", quoted(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .any(|l| l == "harness")
    );
}

/// A shared fixture whose build fails (a real `imager build` of a profile
/// that does not parse) is built once: the first test that asks fails with
/// the build's log, and the others fail with the same log at once, with no
/// second build.
#[test]
fn a_broken_fixture_fails_its_file_at_once_with_the_log() {
    let fixture_test = format!(
        "{}\nuse fixture::Fixture;\nuse std::process::Command;\n\
         static BUILT: Fixture<()> = Fixture::new(\"broken\");\n\
         fn build() {{\n\
         \x20   let count = std::env::var(\"BUILDS\").unwrap();\n\
         \x20   let mut f = std::fs::OpenOptions::new().append(true).create(true).open(&count).unwrap();\n\
         \x20   std::io::Write::write_all(&mut f, b\"build\\n\").unwrap();\n\
         \x20   let out = Command::new(std::env::var(\"IMAGER\").unwrap())\n\
         \x20       .args([\"build\", \"--profile\", &std::env::var(\"PROFILE\").unwrap()])\n\
         \x20       .output().unwrap();\n\
         \x20   assert!(out.status.success(), \"imager build failed:\\n{{}}\", String::from_utf8_lossy(&out.stderr));\n\
         }}\n\
         #[test] fn first() {{ BUILT.get(build); }}\n\
         #[test] fn second() {{ BUILT.get(build); }}\n\
         #[test] fn third() {{ BUILT.get(build); }}\n",
        include("fixture")
    );
    let dir = toy(
        "fixture",
        &["fixture"],
        &[("tests/fixture.rs", fixture_test)],
    );
    let profile = dir.join("broken.yaml");
    std::fs::write(&profile, "name: [this is not a profile\n").unwrap();
    let builds = dir.join("builds");
    let log = dir.join("results.jsonl");
    let started = std::time::Instant::now();
    let run = common::run(
        toy_test(&dir, &log, "fixture")
            .args(["--test", "fixture", "--", "--test-threads", "3"])
            .env("IMAGER", env!("CARGO_BIN_EXE_imager"))
            .env("PROFILE", &profile)
            .env("BUILDS", &builds),
    );
    let took = started.elapsed();
    let summary = common::run(testrun().arg("summary").arg(&log));
    let text = format!("{}{}", quoted(&run), quoted(&summary));
    assert!(!run.status.success(), "{text}");
    assert_eq!(
        std::fs::read_to_string(&builds).unwrap(),
        "build\n",
        "the fixture was built more than once:\n{text}"
    );
    // Every test failed, each with the build's own error (the profile
    // does not parse) and the fixture's name.
    assert_eq!(
        last_line(&summary),
        "tests: 0 passed, 3 failed, 0 skipped",
        "{text}"
    );
    let with_log = text
        .lines()
        .filter(|l| l.contains("fixture broken failed to build"))
        .count();
    assert_eq!(with_log, 3, "{text}");
    assert!(text.contains("imager build failed:"), "{text}");
    assert!(
        text.contains("broken.yaml"),
        "the build's log names the profile:\n{text}"
    );
    eprintln!("the broken fixture's file failed in {took:?}");
}

/// A test that needs a tool fails, naming it and scripts/setup.sh, when
/// the tool is not on PATH (and passes when it is: the tool is real).
#[test]
fn a_missing_tool_fails_the_test_that_needs_it() {
    let tool_test = format!(
        "{}\n#[test]\nfn reads_an_iso() {{\n\
         \x20   let out = tool::tool(\"xorriso\").arg(\"-version\").output().unwrap();\n\
         \x20   assert!(out.status.success());\n}}\n",
        include("tool")
    );
    let dir = toy("tool", &["tool"], &[("tests/tool.rs", tool_test)]);
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    // Build the test binary once, then run it with and without the tool.
    let built = common::run(
        Command::new(&cargo)
            .args([
                "test",
                "--offline",
                "--no-run",
                "--message-format=json",
                "--manifest-path",
            ])
            .arg(dir.join("Cargo.toml"))
            .args(["--test", "tool"])
            .env("CARGO_TARGET_DIR", dir.join("target")),
    );
    assert!(built.status.success(), "{}", quoted(&built));
    let exe = String::from_utf8_lossy(&built.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v["executable"].as_str().map(PathBuf::from))
        .next_back()
        .expect("cargo names the test binary");
    let with = common::run(&mut Command::new(&exe));
    assert!(with.status.success(), "{}", quoted(&with));
    let empty = dir.join("empty-path");
    std::fs::create_dir_all(&empty).unwrap();
    let without = common::run(Command::new(&exe).env("PATH", &empty));
    let text = quoted(&without);
    assert!(!without.status.success(), "{text}");
    assert!(
        text.contains("xorriso not found on PATH: run scripts/setup.sh"),
        "{text}"
    );
    assert!(
        text.contains("test result: FAILED. 0 passed; 1 failed"),
        "{text}"
    );
}

/// The independent GPT check every built, installed, upgraded and grown
/// disk goes through ([`common::check_gpt`]) passes a whole table and
/// fails on a damaged backup header or backup array, which a reader of the
/// primary alone (and sfdisk, which only warns) would pass.
#[test]
fn the_gpt_check_fails_on_a_damaged_backup() {
    let dir = repo().join("target/harness/gpt");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let whole = dir.join("whole.img");
    std::fs::File::create(&whole)
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    let mut sfdisk = common::tool("sfdisk")
        .args(["-q"])
        .arg(&whole)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    sfdisk
        .stdin
        .take()
        .unwrap()
        .write_all(b"label: gpt\n,10M,L\n,,L\n")
        .unwrap();
    assert!(sfdisk.wait().unwrap().success());
    common::check_gpt(&whole);
    let last = (64 << 20) / 512 - 1;
    // The backup header (the last sector), then one byte of the backup
    // array (the 32 sectors before it).
    for (name, sector, at) in [("header", last, 20), ("array", last - 32, 40)] {
        let damaged = dir.join(format!("{name}.img"));
        std::fs::copy(&whole, &damaged).unwrap();
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&damaged)
            .unwrap();
        let mut b = common::read_at(&mut f, sector * 512 + at, 1);
        b[0] ^= 0xFF;
        common::write_at(&mut f, sector * 512 + at, &b);
        drop(f);
        let r = std::panic::catch_unwind(|| common::check_gpt(&damaged));
        let e = r.expect_err(&format!("a damaged backup {name} passed the GPT check"));
        let text = common::panic_text(e.as_ref());
        assert!(text.contains("sgdisk -v"), "{text}");
    }
    // No GPT at all (both headers wiped; sgdisk makes one up in memory and
    // finds "No problems" with it), and a blank disk.
    let wiped = dir.join("wiped.img");
    std::fs::copy(&whole, &wiped).unwrap();
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(&wiped)
        .unwrap();
    common::write_at(&mut f, 512, &[0; 512]);
    common::write_at(&mut f, last * 512, &[0; 512]);
    drop(f);
    let blank = dir.join("blank.img");
    std::fs::File::create(&blank)
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    for disk in [&wiped, &blank] {
        let r = std::panic::catch_unwind(|| common::check_gpt(disk));
        assert!(r.is_err(), "{} passed the GPT check", disk.display());
    }
}
