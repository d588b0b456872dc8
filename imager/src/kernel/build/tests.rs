//! Tests of the kernel build: timestamps, seeds, source hashes, failures
//! and the sweeping of stale work directories (no kernel is compiled).

use super::*;

#[test]
fn build_timestamp_matches_date() {
    assert_eq!(format_build_timestamp(0), "Thu Jan  1 00:00:00 UTC 1970");
    // date -u -d @1700000000 -> Tue Nov 14 22:13:20 UTC 2023
    assert_eq!(
        format_build_timestamp(1_700_000_000),
        "Tue Nov 14 22:13:20 UTC 2023"
    );
    // leap day: date -u -d @1709164800 -> Thu Feb 29 00:00:00 UTC 2024
    assert_eq!(
        format_build_timestamp(1_709_164_800),
        "Thu Feb 29 00:00:00 UTC 2024"
    );
}

#[test]
fn seed_is_deterministic_hex() {
    let a = randstruct_seed("abc");
    assert_eq!(a, randstruct_seed("abc"));
    assert_ne!(a, randstruct_seed("abd"));
    assert_eq!(a.len(), 64);
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("seed");
    std::fs::write(&p, format!("{}\n", a.to_uppercase())).unwrap();
    assert_eq!(read_seed(&p).unwrap(), a);
    std::fs::write(&p, "xyz").unwrap();
    assert!(read_seed(&p).is_err());
}

#[test]
fn seed_script_writes_seed_and_hash() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("gen.sh");
    let seed = randstruct_seed("k");
    write_seed_script(&script, &seed).unwrap();
    let (s, h) = (
        dir.path().join("randstruct.seed"),
        dir.path().join("hash.h"),
    );
    let st = Command::new(&script).arg(&s).arg(&h).status().unwrap();
    assert!(st.success());
    assert_eq!(std::fs::read_to_string(&s).unwrap(), format!("{seed}\n"));
    let expect = hex::encode(Sha256::digest(seed.as_bytes()));
    assert_eq!(
        std::fs::read_to_string(&h).unwrap(),
        format!("#define RANDSTRUCT_HASHED_SEED \"{expect}\"\n")
    );
}

#[test]
fn tree_hash_sees_content_and_names() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("a")).unwrap();
    std::fs::write(dir.path().join("a/x"), "1").unwrap();
    let h1 = hash_source(dir.path()).unwrap();
    assert_eq!(h1, hash_source(dir.path()).unwrap());
    std::fs::write(dir.path().join("a/x"), "2").unwrap();
    let h2 = hash_source(dir.path()).unwrap();
    assert_ne!(h1, h2);
    std::fs::rename(dir.path().join("a/x"), dir.path().join("a/y")).unwrap();
    assert_ne!(h2, hash_source(dir.path()).unwrap());
    assert!(h1.starts_with("tree:"));
}

#[test]
fn tarball_hash_is_remembered_until_the_file_changes() {
    let dir = tempfile::tempdir().unwrap();
    let tarball = dir.path().join("src.tar.xz");
    let stamps = dir.path().join("stamps.json");
    std::fs::write(&tarball, "one").unwrap();
    let h1 = hash_source_memo(&tarball, &stamps).unwrap();
    assert_eq!(h1, hash_source(&tarball).unwrap());
    assert!(std::fs::read_to_string(&stamps).unwrap().contains(&h1));
    assert_eq!(hash_source_memo(&tarball, &stamps).unwrap(), h1);
    std::fs::write(&tarball, "two, longer").unwrap();
    let h2 = hash_source_memo(&tarball, &stamps).unwrap();
    assert_ne!(h1, h2);
    assert_eq!(h2, hash_source(&tarball).unwrap());
    // the stale stamp was replaced, not accumulated
    let map: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(&stamps).unwrap()).unwrap();
    assert_eq!(map.len(), 1);
}

#[test]
fn missing_source_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let req = KernelRequest {
        arch: contract::Arch::Amd64,
        source: dir.path().join("nope.tar.xz"),
        fragments: vec![],
        rules: dir.path().join("rules.yaml"),
        waivers: vec![],
        cmdline: String::new(),
        cache_dir: dir.path().join("cache"),
        source_date_epoch: 0,
        jobs: 1,
        randstruct_seed: None,
    };
    let err = build(&req).unwrap_err().to_string();
    assert!(
        err.contains("nope.tar.xz not found: install linux-source-6.1"),
        "{err}"
    );
}

#[test]
fn failing_make_reports_the_log_tail_and_keeps_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let mut makefile = String::from("all:\n");
    for i in 0..50 {
        makefile.push_str(&format!("\t@echo line{i}\n"));
    }
    makefile.push_str("\t@echo '  CC      x.o'\n\t@echo oops >&2; exit 3\nok:\n\t@echo fine\n");
    std::fs::write(dir.path().join("Makefile"), makefile).unwrap();
    let log = dir.path().join("build.log");
    std::fs::write(&log, "").unwrap();
    let make = Make {
        tree: dir.path().to_path_buf(),
        log: log.clone(),
        epoch: 0,
        jobs: 1,
        arch: contract::Arch::Amd64,
        seed_script: dir.path().join("unused.sh"),
        compiler_seed: compiler_random_seed("k"),
        failed_log: dir.path().join("key.failed.log"),
    };
    make.run(&["ok"], None).unwrap();
    let err = make.run(&["all"], Some(10)).unwrap_err().to_string();
    assert!(err.contains("make all failed"), "{err}");
    assert!(err.contains("key.failed.log"), "{err}");
    assert!(err.contains("oops"), "{err}");
    assert!(err.contains("line49"), "{err}");
    assert!(!err.contains("line5\n"), "only the tail: {err}");
    let kept = std::fs::read_to_string(dir.path().join("key.failed.log")).unwrap();
    assert!(kept.contains("$ make ok\nfine\n"), "{kept}");
    assert!(kept.contains("line0\n"), "{kept}");
}

#[test]
fn stale_work_dirs_are_swept() {
    let dir = tempfile::tempdir().unwrap();
    let stale = dir.path().join("abc.tmp-999999999");
    let live = dir.path().join(format!("abc.tmp-{}", std::process::id()));
    let done = dir.path().join("abc");
    for d in [&stale, &live, &done] {
        std::fs::create_dir(d).unwrap();
    }
    sweep_stale_work_dirs(dir.path());
    assert!(!stale.exists());
    assert!(live.exists());
    assert!(done.exists());
}

/// `kernel check --source`'s symbols: read from the tarball once, then from
/// the memo in the cache directory (named by the tarball's hash and the
/// architecture); the same symbols either way. A memo that does not parse
/// is an error that says to delete it, not a wrong audit.
#[test]
fn source_symbols_are_read_once_and_remembered() {
    let dir = tempfile::tempdir().unwrap();
    let top = dir.path().join("linux-source-9.9");
    fs::create_dir_all(&top).unwrap();
    fs::write(top.join("Kconfig"), "config TOP\nconfig OTHER\n").unwrap();
    let tarball = super::super::kconfig::test_tarball(dir.path(), "linux-source-9.9", "src");
    let cache = dir.path().join("cache");
    let first = source_symbols(&cache, &tarball, "x86").unwrap();
    assert!(first.defines("CONFIG_TOP") && first.defines("CONFIG_OTHER"));
    let memos: Vec<_> = fs::read_dir(cache.join("kernel/kconfig"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(memos.len(), 1, "{memos:?}");
    let name = memos[0].file_name().unwrap().to_str().unwrap().to_string();
    assert!(
        name.starts_with("file-") && name.ends_with("-x86"),
        "{name}"
    );
    let again = source_symbols(&cache, &tarball, "x86").unwrap();
    assert_eq!(again.render(), first.render());
    // The second read came from the memo: a damaged memo is reported.
    fs::write(&memos[0], "not a symbol list \u{1}\n").unwrap();
    let err = format!("{:#}", source_symbols(&cache, &tarball, "x86").unwrap_err());
    assert!(err.contains("delete the file"), "{err}");
    // An architecture name that is not a plain word is never a file name.
    let other = source_symbols(&cache, &tarball, "../x86").unwrap();
    assert_eq!(other.render(), first.render());
    assert_eq!(
        fs::read_dir(cache.join("kernel/kconfig")).unwrap().count(),
        1
    );
}
