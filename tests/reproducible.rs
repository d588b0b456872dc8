//! Reproducibility of every output across two checkouts (issue 24, point
//! 4): the repository itself (checkout A, with its own cargo target
//! directory and kernel cache, warm from the tests before, as on a
//! developer's machine) and a copy of its working tree's files (tracked,
//! and untracked but not ignored, as they are now: uncommitted changes are
//! tested too) in a directory of another path and depth (checkout B), whose
//! build compiles its own runtime and installer (the static `imager` the
//! images carry) into its own `CARGO_TARGET_DIR` and its own kernel in its
//! own, cold, kernel cache, in another time zone, umask and locale. The
//! same signing key, Secure Boot keys and `SOURCE_DATE_EPOCH`. Every output
//! of a build that lists all formats (raw, vhd, qcow2, raw.zst, raw.xz,
//! gcp, azure, vmware, aws,
//! installer, iso, uki) and of a Secure Boot build (signed UKIs, installer,
//! ISO) must be the same bytes.
//!
//! B's copy is made again on every run; its cargo target directory and
//! kernel cache are kept per machine in the cache directory
//! (`reproducible-b/`): B's kernel is built cold on a machine's first run
//! and again whenever the kernel's inputs change, and compared with A's at
//! every run (`IMAGER_REPRO_COLD_KERNEL=1` builds it cold again); its
//! dependencies compile once (the workspace's own crates are rebuilt, the
//! copy being new). The profiles
//! built are written beside the real ones in each checkout
//! (`profiles/repro-*.yaml`, ignored by git) and removed after.
//!
//! Their kernel is metal-virtio's: the default profiles' without
//! `kernel-config/hardware.config`, the same source, recipe and fragments
//! but the drivers of real machines. B's kernel is built cold whenever the
//! kernel's inputs change; with those drivers that is 16.5 minutes on two
//! cores instead of 6.5, on top of A's, in the run that changes them. The
//! recipe's reproducibility (paths, time zone, umask, locale, the GCC
//! plugins' seeds) is what differs between checkouts, not the list of
//! built-in drivers; docs/testing.md says what this leaves unshown.

// Test helpers panic on unexpected failures: that is how a test fails.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// The target triple `imager::runtime` builds static binaries for.
const TARGET: &str = imager::runtime::TARGET;

/// Everything that differs between the two builds.
struct Checkout {
    name: &'static str,
    /// The copy of the working tree.
    root: PathBuf,
    /// Its `CARGO_TARGET_DIR`.
    target: PathBuf,
    /// Its `IMAGER_CACHE_DIR` (`None`: the default cache, whose kernel an
    /// earlier build made, as on a developer's machine).
    cache: Option<PathBuf>,
    tz: &'static str,
    umask: u32,
    /// `LC_ALL` and `LANG`, and the `LOCPATH` it is compiled in (`None`: the
    /// system's locales).
    locale: &'static str,
    locpath: Option<PathBuf>,
}

impl Checkout {
    /// `program` run in the copy with this checkout's environment (the
    /// umask set by `sh` before it `exec`s the program).
    fn command(&self, program: &Path) -> Command {
        let mut c = Command::new("sh");
        c.arg("-c")
            .arg(format!("umask {:04o} && exec \"$0\" \"$@\"", self.umask))
            .arg(program)
            .current_dir(&self.root)
            .env("SOURCE_DATE_EPOCH", EPOCH)
            .env("CARGO_TARGET_DIR", &self.target)
            .env("TZ", self.tz)
            .env("LC_ALL", self.locale)
            .env("LANG", self.locale)
            .env_remove("RUSTFLAGS")
            .env_remove("CARGO_ENCODED_RUSTFLAGS")
            .env_remove("CARGO_BUILD_TARGET_DIR");
        match &self.cache {
            Some(d) => c.env("IMAGER_CACHE_DIR", d),
            None => c.env_remove("IMAGER_CACHE_DIR"),
        };
        match &self.locpath {
            Some(d) => c.env("LOCPATH", d),
            None => c.env_remove("LOCPATH"),
        };
        c
    }

    fn release_dir(&self) -> PathBuf {
        self.target.join(TARGET).join("release")
    }
}

/// The files of the working tree git would commit (tracked, and untracked
/// but not ignored), relative to the repository; deleted ones left out.
fn working_tree_files() -> Vec<PathBuf> {
    let out = ok(tool("git").arg("-C").arg(repo()).args([
        "ls-files",
        "-z",
        "--cached",
        "--others",
        "--exclude-standard",
    ]));
    let mut files: Vec<PathBuf> = out
        .split('\0')
        .filter(|f| !f.is_empty())
        .map(PathBuf::from)
        .filter(|f| repo().join(f).symlink_metadata().is_ok())
        .collect();
    files.sort();
    files.dedup();
    assert!(
        files.iter().any(|f| f == Path::new("imager/Cargo.toml")),
        "git ls-files listed no imager/Cargo.toml in {}",
        repo().display()
    );
    files
}

/// Copies `files` from `from` to `to` as a checkout made under `umask`
/// would have them: regular files 0666 or (executable) 0777 less the
/// umask, directories 0777 less the umask, symbolic links as links.
fn copy_tree(files: &[PathBuf], from: &Path, to: &Path, umask: u32) {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let _ = std::fs::remove_dir_all(to);
    let dir_mode = 0o777 & !umask;
    for f in files {
        let (src, dst) = (from.join(f), to.join(f));
        let parent = dst.parent().unwrap();
        if !parent.is_dir() {
            std::fs::create_dir_all(parent).unwrap();
            let mut d = parent;
            while d != to {
                std::fs::set_permissions(d, std::fs::Permissions::from_mode(dir_mode)).unwrap();
                d = d.parent().unwrap();
            }
        }
        let meta = src.symlink_metadata().unwrap();
        if meta.file_type().is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(&src).unwrap(), &dst).unwrap();
            continue;
        }
        let exec = meta.permissions().mode() & 0o111 != 0;
        let mode = if exec { 0o777 } else { 0o666 } & !umask;
        let mut out = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&dst)
            .unwrap_or_else(|e| panic!("creating {}: {e}", dst.display()));
        std::io::copy(&mut std::fs::File::open(&src).unwrap(), &mut out).unwrap();
        std::fs::set_permissions(&dst, std::fs::Permissions::from_mode(mode)).unwrap();
    }
}

/// The profiles built, as (name, text): every format from the installer
/// profile, and the Secure Boot profile with the given keys and the ISO.
fn profiles(root: &Path, sb_keys: &Path) -> Vec<(&'static str, String)> {
    // metal-virtio's kernel (see the module's documentation).
    let read = |p: &str| {
        let t = std::fs::read_to_string(root.join("profiles").join(p)).unwrap();
        let hw = "    - ../kernel-config/hardware.config\n";
        assert!(t.contains(hw), "{p} has no hardware.config fragment");
        t.replace(hw, "")
    };
    let all = read("installer.yaml");
    let outputs = "\noutputs: [raw, installer]\n";
    assert!(all.contains(outputs), "installer.yaml's outputs changed");
    let all = all.replace(
        outputs,
        "\noutputs: [raw, vhd, qcow2, raw.zst, raw.xz, gcp, azure, vmware, aws, installer, iso, uki]\n",
    );
    let sb = read("secureboot.yaml");
    let (section, outputs) = (
        "\nsecure_boot:\n  enroll: force\n",
        "\noutputs: [raw, installer, uki]\n",
    );
    assert!(
        sb.contains(section) && sb.contains(outputs),
        "secureboot.yaml's secure_boot section or outputs changed"
    );
    let sb = sb
        .replace(
            section,
            &format!(
                "\nsecure_boot:\n  keys: {}\n  enroll: force\n",
                sb_keys.display()
            ),
        )
        .replace(outputs, "\noutputs: [raw, installer, iso, uki]\n");
    vec![("repro-all", all), ("repro-sb", sb)]
}

/// The artifact kinds each build must list: the test compares what its
/// name says only if the builds made them.
fn expected_kinds(profile: &str) -> &'static [&'static str] {
    match profile {
        "repro-all" => &[
            "kernel",
            "initramfs",
            "rootfs",
            "raw",
            "vhd",
            "qcow2",
            "raw-zst",
            "raw-xz",
            "gcp",
            "azure",
            "vmware",
            "aws",
            "installer",
            "iso",
            "uki",
        ],
        _ => &["raw", "installer", "iso", "uki"],
    }
}

/// The record of the incremental build (docs/design.md, "Incremental
/// builds"): the outputs' modification times and the running imager's, this
/// machine's, not an output; the only file of the output directory not
/// compared.
const BUILD_RECORD: &str = "build-record.json";

/// Every file under `dir` but [`BUILD_RECORD`], relative and sorted
/// (directories left out, symbolic links kept as files).
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in walkdir::WalkDir::new(dir).sort_by_file_name() {
        let e = e.unwrap();
        let rel = e.path().strip_prefix(dir).unwrap();
        if !e.file_type().is_dir() && rel != Path::new(BUILD_RECORD) {
            out.push(rel.to_path_buf());
        }
    }
    out
}

/// The offset of the first byte at which `a` and `b` differ (their common
/// length when one is a prefix of the other), `None` when equal; streamed.
fn first_difference(a: &Path, b: &Path) -> Option<u64> {
    use std::io::Read;
    let (la, lb) = (a.symlink_metadata().unwrap(), b.symlink_metadata().unwrap());
    if la.file_type().is_symlink() || lb.file_type().is_symlink() {
        return (std::fs::read_link(a).ok() != std::fs::read_link(b).ok()).then_some(0);
    }
    let (mut fa, mut fb) = (
        std::fs::File::open(a).unwrap(),
        std::fs::File::open(b).unwrap(),
    );
    let (mut ba, mut bb) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    let mut at = 0u64;
    loop {
        let n = fa.read(&mut ba).unwrap();
        let mut m = 0;
        while m < n {
            let k = fb.read(&mut bb[m..n]).unwrap();
            if k == 0 {
                break;
            }
            m += k;
        }
        // Slices compare with memcmp (fast in this unoptimized test build);
        // the offset is looked for only in a block that differs.
        if ba[..m] != bb[..m] {
            let i = (0..m).find(|&i| ba[i] != bb[i]).unwrap_or(0);
            return Some(at + i as u64);
        }
        if m < n {
            return Some(at + m as u64);
        }
        if n == 0 {
            return (fb.read(&mut bb[..1]).unwrap() != 0).then_some(at);
        }
        at += n as u64;
    }
}

/// Whether `needle` occurs in the file at `path`.
fn contains(path: &Path, needle: &[u8]) -> bool {
    let data = std::fs::read(path).unwrap();
    data.windows(needle.len()).any(|w| w == needle)
}

fn timed<T>(what: &str, f: impl FnOnce() -> T) -> T {
    let start = Instant::now();
    let r = f();
    // Past the capture: the run's log says where this test's time went.
    say(&format!(
        "reproducible: {what}: {:.0} s",
        start.elapsed().as_secs_f64()
    ));
    r
}

/// Removes its paths (files or directories) when dropped: what the test
/// adds to the repository, checkout A, goes even when it fails.
struct RemoveOnDrop(Vec<PathBuf>);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = std::fs::remove_file(p).or_else(|_| std::fs::remove_dir_all(p));
        }
    }
}

#[test]
fn every_output_is_the_same_bytes_from_two_checkouts_in_other_places_zones_umasks_and_locales() {
    let started = Instant::now();
    let base = repo().join("target/reproducible");
    // The copy and the keys are made again. B's cargo target directory and
    // kernel cache are kept per machine, in the cache directory
    // (`reproducible-b/`): B's kernel is built cold, in B's environment, on
    // a machine's first run and whenever the kernel's inputs change (its
    // cache key), and compared with A's at every run; its dependencies
    // compile once. IMAGER_REPRO_COLD_KERNEL=1 builds B's kernel cold again.
    let machine = imager::kernel::default_cache_dir().join("reproducible-b");
    if std::env::var_os("IMAGER_REPRO_COLD_KERNEL").is_some() {
        let _ = std::fs::remove_dir_all(machine.join("kernel-cache"));
    }
    for d in [
        "a",
        "a-target",
        "second/checkout-b",
        "b-cache",
        "b-target",
        "keys",
        "locale",
    ] {
        let _ = std::fs::remove_dir_all(base.join(d));
    }
    std::fs::create_dir_all(base.join("locale")).unwrap();

    // The second checkout's locale, compiled from glibc's sources (Debian's
    // `locales`): Turkish, whose case mapping of i and I differs from
    // ASCII's.
    ok(tool("localedef")
        .args(["-i", "tr_TR", "-f", "UTF-8"])
        .arg(base.join("locale/tr_TR.UTF-8")));

    let a = Checkout {
        name: "a",
        root: repo(),
        target: repo().join("target"),
        cache: None,
        tz: "UTC",
        umask: 0o022,
        locale: "C.UTF-8",
        locpath: None,
    };
    let b = Checkout {
        name: "b",
        root: base.join("second/checkout-b"),
        target: machine.join("target"),
        cache: Some(machine.join("kernel-cache")),
        tz: "Pacific/Chatham",
        umask: 0o077,
        locale: "tr_TR.UTF-8",
        locpath: Some(base.join("locale")),
    };
    timed("copying the working tree", || {
        copy_tree(&working_tree_files(), &repo(), &b.root, b.umask);
    });
    // The second environment is in effect: another month name, another
    // offset, another umask.
    let probe = ok(b
        .command(Path::new("sh"))
        .args(["-c", "date -d @0 '+%B %z' && umask"]));
    assert_eq!(
        probe.split_whitespace().collect::<Vec<_>>(),
        ["Ocak", "+1245", "0077"],
        "the second checkout's locale, time zone or umask is not in effect"
    );

    // The same keys for both.
    let keys = base.join("keys");
    let key = keys.join("signing.key");
    ok(imager()
        .args(["keygen", "--private"])
        .arg(&key)
        .arg("--public")
        .arg(keys.join("signing.pub")));
    let sb_keys = keys.join("secureboot");
    ok(imager().args(["keygen", "--secure-boot"]).arg(&sb_keys));

    // The images are built by this test's imager, run in each copy: the
    // runtime and the installer (the static imager the images carry) are
    // compiled from the copy by the build. The kernels first (the second's
    // cold, in its own cache; the first's the default cache's).
    let driver = Path::new(env!("CARGO_BIN_EXE_imager"));
    let _cleanup = RemoveOnDrop(
        profiles(&a.root, &sb_keys)
            .iter()
            .flat_map(|(name, _)| {
                [
                    a.root.join(format!("profiles/{name}.yaml")),
                    a.root.join("out").join(name),
                ]
            })
            .collect(),
    );
    for c in [&a, &b] {
        for (name, text) in profiles(&c.root, &sb_keys) {
            std::fs::write(c.root.join(format!("profiles/{name}.yaml")), text).unwrap();
        }
    }
    for c in [&b, &a] {
        timed(&format!("{}: kernel", c.name), || {
            ok(c.command(driver)
                .args(["kernel", "build", "--profile", "profiles/repro-all.yaml"]))
        });
    }
    for c in [&a, &b] {
        for (name, _) in profiles(&c.root, &sb_keys) {
            let out = timed(&format!("{}: build {name}", c.name), || {
                ok(c.command(driver)
                    .args(["build", "--json", "--profile"])
                    .arg(format!("profiles/{name}.yaml"))
                    .arg("--key")
                    .arg(&key)
                    .arg("--out")
                    .arg(format!("out/{name}")))
            });
            let json: Value = serde_json::from_str(&out).unwrap();
            let kinds: Vec<&str> = json["artifacts"]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| a["kind"].as_str().unwrap())
                .collect();
            for k in expected_kinds(name) {
                assert!(kinds.contains(k), "{name} made no {k}: {kinds:?}");
            }
        }
        // The Secure Boot build's UKIs are signed with the db key.
        for uki in ["uki-a.efi", "uki-b.efi"] {
            ok(tool("sbverify")
                .arg("--cert")
                .arg(sb_keys.join("db.crt"))
                .arg(c.root.join("out/repro-sb").join(uki)));
        }
    }
    let installers: Vec<PathBuf> = [&a, &b]
        .iter()
        .map(|c| c.release_dir().join("imager"))
        .collect();

    // No path of the build machine in the binaries the images carry: the
    // installer and the runtime, as compiled from each copy.
    // (B's copy lies under the repository: its path starts with it.)
    let needle = repo().to_str().unwrap().as_bytes().to_vec();
    let needle = &needle[..];
    for c in [&a, &b] {
        for bin in ["imager", "machined"] {
            let path = c.release_dir().join(bin);
            assert!(
                !contains(&path, needle),
                "{} carries the build path {}",
                path.display(),
                repo().display()
            );
        }
    }

    // Every output, byte for byte.
    let mut differ = Vec::new();
    timed("comparing", || {
        for (name, _) in profiles(&a.root, &sb_keys) {
            let (da, db) = (a.root.join("out").join(name), b.root.join("out").join(name));
            let (fa, fb) = (files_under(&da), files_under(&db));
            assert_eq!(
                fa,
                fb,
                "the two {name} builds made different files ({} and {})",
                da.display(),
                db.display()
            );
            // Every artifact the manifest lists is among them.
            let manifest: Value =
                serde_json::from_slice(&std::fs::read(da.join("manifest.json")).unwrap()).unwrap();
            for art in manifest["artifacts"].as_array().unwrap() {
                let p = Path::new(art["path"].as_str().unwrap());
                assert!(
                    fa.iter().any(|f| f == p),
                    "{name}: {} not compared",
                    p.display()
                );
            }
            for f in &fa {
                if let Some(at) = first_difference(&da.join(f), &db.join(f)) {
                    differ.push(format!("{name}/{} (from byte {at})", f.display()));
                }
            }
        }
    });
    let installer = match first_difference(&installers[0], &installers[1]) {
        Some(at) => format!(
            "; the static imager (the installer) differs too, from byte {at}: {} and {}",
            installers[0].display(),
            installers[1].display()
        ),
        None => String::new(),
    };
    assert!(
        differ.is_empty(),
        "first differing output: {}; all: {}{installer} (outputs in {} and {})",
        differ[0],
        differ.join(", "),
        a.root.join("out").display(),
        b.root.join("out").display()
    );
    say(&format!(
        "reproducible: total {:.0} s",
        started.elapsed().as_secs_f64()
    ));
}
