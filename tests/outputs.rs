//! The output directory of `imager build`, through the library: one build
//! at a time, stale temporaries swept only by the lock holder, a failed
//! build leaving the previous one whole, partition sizes that do not fit
//! refused with their profile key, and `verify` refusing a signed disk
//! whose partition table is not sound.
//!
//! No kernel is built: the profile's kernel is a prebuilt stand-in (a few
//! bytes and a one-line config audited against a one-rule table), the
//! runtime a minimal static ELF, so a whole build takes a few seconds.

// Test helpers panic on unexpected failures: that is how a test fails.
#![allow(clippy::unwrap_used)]

mod common;

use anyhow::Result;
use common::{craft_gpt, u32_at};
use imager::build::{self, BuildOptions, names};
use imager::profile::Profile;
use imager::sign::{self, Signature, Signer, VerifyingKey};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A project with everything a build needs and no kernel to compile.
struct Fixture {
    _dir: tempfile::TempDir,
    root: PathBuf,
    public: VerifyingKey,
}

/// The smallest x86-64 ELF executable header `runtime::check_static`
/// accepts: no program headers, so no interpreter.
fn static_elf() -> Vec<u8> {
    let mut b = vec![0u8; 64];
    b[..4].copy_from_slice(b"\x7fELF");
    b[4] = 2; // 64-bit
    b[5] = 1; // little-endian
    b[6] = 1;
    b[16] = 2; // ET_EXEC
    b[18] = 62; // x86-64
    b
}

/// Bytes with the x86 boot protocol's marks (`0xAA55`, `HdrS`): what the
/// builder checks of a prebuilt kernel.
fn stand_in_bzimage() -> Vec<u8> {
    let mut b = vec![0x5a; 200_000];
    b[0x1fe..0x200].copy_from_slice(&[0x55, 0xaa]);
    b[0x202..0x206].copy_from_slice(b"HdrS");
    b
}

/// Bytes with the headers of an x86-64 PE image (`MZ`, `PE\0\0`, machine
/// 0x8664): what the builder checks of a boot loader.
fn stand_in_efi() -> Vec<u8> {
    let mut b = vec![0x4d; 100_000];
    b[..2].copy_from_slice(b"MZ");
    b[0x3c..0x40].copy_from_slice(&0x80u32.to_le_bytes());
    b[0x80..0x84].copy_from_slice(b"PE\0\0");
    b[0x84..0x86].copy_from_slice(&0x8664u16.to_le_bytes());
    b
}

impl Fixture {
    fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        let w = |name: &str, bytes: &[u8]| std::fs::write(root.join(name), bytes).unwrap();
        w("bzImage", &stand_in_bzimage());
        w(
            "config",
            b"# Linux/x86 6.1.0 Kernel Configuration\nCONFIG_BUG=y\n",
        );
        w(
            "rules.yaml",
            b"rules:\n  - {option: CONFIG_BUG, wanted: y, why: \"test\"}\n",
        );
        w("machined", &static_elf());
        w("systemd-bootx64.efi", &stand_in_efi());
        std::fs::create_dir(root.join("skel")).unwrap();
        w(
            "skeleton.txt",
            b"dir 0755 usr\ndir 0755 usr/bin\ndir 0755 usr/lib\n\
              builder 0755 usr/bin/machined\nbuilder 0644 usr/lib/os-release\n",
        );
        sign::keygen(&root.join("test.key"), &root.join("test.pub"), false).unwrap();
        let public = sign::load_public_key(&root.join("test.pub")).unwrap();
        Fixture {
            _dir: dir,
            root,
            public,
        }
    }

    /// A profile of `version` with `extra` lines at the end of its `disk`
    /// section.
    fn profile(&self, version: &str, disk_extra: &str) -> Profile {
        let text = format!(
            "name: outputs\nversion: {version}\n\
             kernel:\n  prebuilt: bzImage\n  prebuilt_config: config\n  rules: rules.yaml\n  \
             cmdline: [console=ttyS0]\n\
             runtime:\n  binary: machined\n  skeleton: skel\n  manifest: skeleton.txt\n\
             boot:\n  systemd_boot: systemd-bootx64.efi\n\
             disk:\n  size: 1GiB\n{disk_extra}\
             signing:\n  key: test.key\n\
             compression:\n  rootfs_zstd_level: 1\n  initramfs_zstd_level: 1\n\
             outputs: [raw]\n"
        );
        let path = self.root.join(format!("outputs-{version}.yaml"));
        std::fs::write(&path, text).unwrap();
        Profile::load(&path).unwrap()
    }

    /// A profile making the live ISO, with `boot` lines as its boot
    /// section (GRUB's real directory unless they say otherwise).
    fn iso_profile(&self, boot: &str) -> Profile {
        let text = format!(
            "name: outputs\nversion: 1.0.0\n\
             kernel:\n  prebuilt: bzImage\n  prebuilt_config: config\n  rules: rules.yaml\n  \
             cmdline: [console=ttyS0]\n\
             runtime:\n  binary: machined\n  skeleton: skel\n  manifest: skeleton.txt\n\
             installer:\n  binary: machined\n\
             boot:\n{boot}\
             signing:\n  key: test.key\n\
             compression:\n  rootfs_zstd_level: 1\n  initramfs_zstd_level: 1\n\
             outputs: [iso]\n"
        );
        let path = self.root.join("outputs-iso.yaml");
        std::fs::write(&path, text).unwrap();
        Profile::load(&path).unwrap()
    }

    fn opts(&self, out: &Path) -> BuildOptions {
        BuildOptions {
            out_dir: out.to_path_buf(),
            key: None,
            cache_dir: self.root.join("cache"),
            jobs: 1,
            reuse: Default::default(),
            cache_registry: None,
        }
    }

    fn out(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }
}

/// Every entry of `dir` (hidden ones included) with its bytes; a
/// directory's entries under `name/`.
fn snapshot(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut m = BTreeMap::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let name = e.file_name().to_string_lossy().into_owned();
        if e.file_type().unwrap().is_dir() {
            for (k, v) in snapshot(&e.path()) {
                m.insert(format!("{name}/{k}"), v);
            }
            m.insert(format!("{name}/"), Vec::new());
        } else {
            m.insert(name, std::fs::read(e.path()).unwrap());
        }
    }
    m
}

/// Verifies the build in `out`; returns its version.
fn verify_ok(f: &Fixture, out: &Path) -> String {
    let r = sign::verify(out, &f.public).unwrap();
    r.ensure_ok().unwrap();
    r.version
}

/// A signer that fails: the last step of a build.
struct FailingSigner(VerifyingKey);

impl Signer for FailingSigner {
    fn public_key(&self) -> VerifyingKey {
        self.0
    }
    fn sign(&self, _: &[u8]) -> Result<Signature> {
        anyhow::bail!("the signing token was unplugged")
    }
}

/// One test at a time: a build runs `git` (for SOURCE_DATE_EPOCH), and a
/// child forked by one test holds a copy of every descriptor until it
/// execs, another test's output lock included, which would make that
/// test's next build in the same directory "another build".
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static M: std::sync::Mutex<()> = std::sync::Mutex::new(());
    M.lock().unwrap_or_else(|e| e.into_inner())
}

/// The output lock of `out`, once free: other tests' child processes may
/// hold a copy of a dropped lock's descriptor between their fork and exec.
fn lock_when_free(out: &Path) -> imager::io::DirLock {
    let start = std::time::Instant::now();
    loop {
        match build::lock_output(out) {
            Ok(l) => return l,
            Err(e) if start.elapsed().as_secs() > 30 => panic!("{e:#}"),
            Err(_) => std::thread::yield_now(),
        }
    }
}

#[test]
fn a_build_into_a_locked_directory_is_refused_at_once_and_touches_nothing() {
    let _serial = serial();
    let f = Fixture::new();
    let out = f.out("locked");
    // The first build, mid-way: it holds the lock and has a temporary and
    // an artifact in the directory.
    let first = build::lock_output(&out).unwrap();
    std::fs::write(out.join(".rootfs.sqsh.abc123.partial"), b"half a rootfs").unwrap();
    std::fs::create_dir(out.join(".build.xyz.partial")).unwrap();
    std::fs::write(out.join(".build.xyz.partial/vmlinuz"), b"kernel").unwrap();
    std::fs::write(out.join(names::KERNEL), b"the first build's kernel").unwrap();
    let before = snapshot(&out);

    let started = std::time::Instant::now();
    let e = build::run(&f.profile("1.0.0", ""), &f.opts(&out)).unwrap_err();
    let e = format!("{e:#}");
    assert!(
        e.contains(&format!(
            "{} is being written by another build",
            out.display()
        )) && e.contains("another --out directory"),
        "{e}"
    );
    // Refused, not waited for.
    assert!(started.elapsed().as_secs() < 30);
    assert_eq!(snapshot(&out), before, "the first build's files changed");
    let e = format!("{:#}", build::lock_output(&out).unwrap_err());
    assert!(e.contains("being written by another build"), "{e}");
    assert_eq!(snapshot(&out), before);

    // Once the first build is gone, its temporaries are swept, nothing else.
    drop(first);
    let lock = lock_when_free(&out);
    assert_eq!(
        snapshot(&out).into_keys().collect::<Vec<_>>(),
        [names::KERNEL]
    );
    drop(lock);
}

#[test]
fn a_stale_temporary_of_a_dead_build_is_swept_by_the_next_build() {
    let _serial = serial();
    let f = Fixture::new();
    let out = f.out("stale");
    std::fs::create_dir_all(out.join(".build.dead01.partial/.installer-payload.x.partial"))
        .unwrap();
    std::fs::write(out.join(".disk.raw.dead02.partial"), b"half a disk").unwrap();
    // Something of the user's, not ours: never swept.
    std::fs::write(out.join("notes.txt"), b"mine").unwrap();
    let report = build::run(&f.profile("1.0.0", ""), &f.opts(&out)).unwrap();
    let mut left: Vec<String> = snapshot(&out).into_keys().collect();
    left.sort();
    let mut want: Vec<String> = report
        .artifacts
        .iter()
        .map(|a| {
            Path::new(&a.path)
                .file_name()
                .unwrap()
                .to_string_lossy()
                .into_owned()
        })
        .chain(["notes.txt".to_string(), names::RECORD.to_string()])
        .collect();
    want.sort();
    assert_eq!(left, want);
    assert_eq!(verify_ok(&f, &out), "1.0.0");
}

#[test]
fn a_build_that_fails_late_leaves_the_previous_build_whole() {
    let _serial = serial();
    let f = Fixture::new();
    let out = f.out("whole");
    build::run(&f.profile("1.0.0", ""), &f.opts(&out)).unwrap();
    assert_eq!(verify_ok(&f, &out), "1.0.0");
    let before = snapshot(&out);

    // Version 2 differs in every artifact but the kernel's; its signer fails
    // after everything is built, the disk included.
    let e = build::run_with_signer(
        &f.profile("2.0.0", ""),
        &f.opts(&out),
        &FailingSigner(f.public),
    )
    .unwrap_err();
    let e = format!("{e:#}");
    assert!(e.contains("the signing token was unplugged"), "{e}");
    assert!(snapshot(&out) == before, "the previous build changed");
    assert_eq!(verify_ok(&f, &out), "1.0.0");

    // A build that succeeds replaces it whole.
    build::run(&f.profile("2.0.0", ""), &f.opts(&out)).unwrap();
    assert_eq!(verify_ok(&f, &out), "2.0.0");
    let after = snapshot(&out);
    assert_eq!(
        after.keys().collect::<Vec<_>>(),
        before.keys().collect::<Vec<_>>()
    );
    assert_ne!(after[names::ROOTFS], before[names::ROOTFS]);
}

#[test]
fn something_in_the_way_of_an_artifact_is_refused_before_any_work() {
    let _serial = serial();
    let f = Fixture::new();
    let out = f.out("inway");
    build::run(&f.profile("1.0.0", ""), &f.opts(&out)).unwrap();
    std::fs::remove_file(out.join(names::ROOTFS)).unwrap();
    std::fs::create_dir(out.join(names::ROOTFS)).unwrap();
    let before = snapshot(&out);
    let e = format!(
        "{:#}",
        build::run(&f.profile("2.0.0", ""), &f.opts(&out)).unwrap_err()
    );
    assert!(
        e.contains(&format!(
            "{} is in the way: it is not a regular file",
            out.join(names::ROOTFS).display()
        )),
        "{e}"
    );
    assert!(snapshot(&out) == before);
}

#[test]
fn partition_sizes_that_do_not_fit_name_their_profile_key() {
    let _serial = serial();
    let f = Fixture::new();
    let out = f.out("huge");
    let cases = [
        // Plainly too big for 1 GiB: 1023 - 1 - 100 - 1 - 300 - 1 - 300 MiB fits.
        (
            "  partitions:\n    STATE: 16000000TiB\n",
            vec![
                "disk.size: a disk of 1024 MiB is too small for the partitions",
                "disk.partitions.STATE asks for 16777216000000 MiB but at most 320 MiB fits",
            ],
        ),
        // Sizes whose sum passes 2^64 bytes: refused, never wrapped.
        (
            "  partitions:\n    STATE: 17592186044415MiB\n",
            vec![
                "the partitions add up to more than 16 EiB",
                "disk.partitions.STATE asks for 17592186044415 MiB but at most 320 MiB fits",
            ],
        ),
        (
            "  partitions:\n    BOOT: 8388608TiB\n    STATE: 8388608TiB\n",
            vec![
                "the partitions add up to more than 16 EiB",
                "disk.partitions.BOOT asks for 8796093022208 MiB but none fits beside the other \
                 partitions",
                "disk.partitions.STATE asks for 8796093022208 MiB but none fits",
            ],
        ),
    ];
    for (extra, wants) in cases {
        let p = f.profile("1.0.0", extra);
        let e = format!("{:#}", build::run(&p, &f.opts(&out)).unwrap_err());
        assert!(e.starts_with(&p.path.display().to_string()), "{e}");
        for want in wants {
            assert!(e.contains(want), "{want:?} not in {e}");
        }
        assert!(std::fs::read_dir(&out).unwrap().next().is_none());
    }
}

#[test]
fn verify_refuses_a_signed_disk_whose_partitions_overlap() {
    let _serial = serial();
    let f = Fixture::new();
    let out = f.out("overlap");
    build::run(&f.profile("1.0.0", ""), &f.opts(&out)).unwrap();
    let raw = out.join(names::RAW);
    let t = imager::disk::read_table(&raw).unwrap();
    let ephemeral = t.find("EPHEMERAL").unwrap().first_lba;
    // STATE ends inside EPHEMERAL, both tables' CRCs made right, and the
    // manifest re-signed with the build's key: what a builder without the
    // read-back check could have produced and signed.
    patch_entry_last_lba(&raw, 4, ephemeral + 2047);
    let r = sign::verify(&out, &f.public).unwrap();
    let mut m = r.verified.clone();
    for a in &mut m.artifacts {
        if a.path == names::RAW {
            let (sha, size) = imager::io::sha256_file(&raw).unwrap();
            (a.sha256, a.size) = (sha, size);
        }
    }
    let signer = sign::FileSigner::load(&f.root.join("test.key")).unwrap();
    sign::write_signed_manifest(&out, &m, &signer).unwrap();

    let r = sign::verify(&out, &f.public).unwrap();
    assert!(!r.ok);
    let bad: Vec<String> = r
        .artifacts
        .iter()
        .filter(|a| !a.is_ok())
        .map(|a| a.line())
        .collect();
    assert_eq!(bad.len(), 1, "{bad:?}");
    assert!(
        bad[0].starts_with("BAD raw disk.raw: partition table: ")
            && bad[0].contains("partitions 5 (\"STATE\") and 6 (\"EPHEMERAL\") overlap"),
        "{bad:?}"
    );
    let e = format!("{:#}", r.ensure_ok().unwrap_err());
    assert!(e.contains("overlap"), "{e}");
}

/// Sets the last LBA of entry `index` in both GPT copies of a 512-byte-sector
/// image and makes their CRCs right.
fn patch_entry_last_lba(disk: &Path, index: usize, last: u64) {
    craft_gpt(disk, |c| {
        let at = index * u32_at(&c.header, 84) as usize + 40;
        c.entries[at..at + 8].copy_from_slice(&last.to_le_bytes());
    });
}

/// An ISO build (stand-in kernel and runtime, Debian's GRUB and a stand-in
/// systemd-boot): listed in the signed manifest, read by xorriso.
#[test]
fn an_iso_build_is_signed_and_read_by_xorriso() {
    let _serial = serial();
    let f = Fixture::new();
    let out = f.out("iso");
    let p = f.iso_profile("  systemd_boot: systemd-bootx64.efi\n");
    let r = build::run(&p, &f.opts(&out)).unwrap();
    assert!(
        r.artifacts
            .iter()
            .any(|a| a.kind == imager::artifact::Kind::Iso)
    );
    assert_eq!(verify_ok(&f, &out), "1.0.0");
    let iso = out.join(names::ISO);
    let report = common::ok(
        common::tool("xorriso")
            .arg("-indev")
            .arg(&iso)
            .args(["-report_el_torito", "plain"]),
    );
    assert!(
        report.contains("BIOS") && report.contains("UEFI"),
        "{report}"
    );
}

/// The ISO's bad inputs: no systemd-boot, GRUB's directory without a module
/// the ISO needs or without boot_hybrid.img; each refused before anything
/// is written, naming the profile key.
#[test]
fn an_iso_without_systemd_boot_or_grub_modules_is_refused_before_any_work() {
    let _serial = serial();
    let f = Fixture::new();
    let out = f.out("iso-bad");
    let copy = |without: &str| {
        let dir = f.root.join(format!("grub-without-{without}"));
        std::fs::create_dir(&dir).unwrap();
        for e in std::fs::read_dir(imager::grub::DEFAULT_DIR).unwrap() {
            let e = e.unwrap();
            if e.file_name() != without {
                std::fs::copy(e.path(), dir.join(e.file_name())).unwrap();
            }
        }
        dir
    };
    let no_iso9660 = copy("iso9660.mod");
    let no_hybrid = copy("boot_hybrid.img");
    let cases = [
        (
            "  systemd_boot: missing.efi\n".to_string(),
            vec!["systemd-boot not found", "boot.systemd_boot"],
        ),
        (
            format!(
                "  systemd_boot: systemd-bootx64.efi\n  grub_dir: {}\n",
                no_iso9660.display()
            ),
            vec![
                "GRUB module iso9660.mod, needed for booting the ISO under BIOS",
                "boot.grub_dir",
            ],
        ),
        (
            format!(
                "  systemd_boot: systemd-bootx64.efi\n  grub_dir: {}\n",
                no_hybrid.display()
            ),
            vec!["has no boot_hybrid.img", "boot.grub_dir"],
        ),
    ];
    for (boot, wants) in cases {
        let p = f.iso_profile(&boot);
        let e = format!("{:#}", build::run(&p, &f.opts(&out)).unwrap_err());
        for want in wants {
            assert!(e.contains(want), "{want:?} not in {e}");
        }
        assert!(
            std::fs::read_dir(&out).map_or(true, |mut d| d.next().is_none()),
            "something was written into {}",
            out.display()
        );
    }
}

/// [`snapshot`] without the build record, which records the files'
/// times.
fn built_files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut m = snapshot(dir);
    m.remove(names::RECORD);
    m
}

/// Each file of `dir` (not hidden) with its inode and modification time:
/// what a skipped stage leaves as it was.
fn stamps(dir: &Path) -> BTreeMap<String, (u64, i64, i64)> {
    use std::os::unix::fs::MetadataExt;
    let mut m = BTreeMap::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let name = e.file_name().to_string_lossy().into_owned();
        let md = e.metadata().unwrap();
        if md.is_file() && !name.starts_with('.') {
            m.insert(name, (md.ino(), md.mtime(), md.mtime_nsec()));
        }
    }
    m
}

/// The stages a report says were built, and those it says were skipped.
fn built_and_skipped(r: &build::BuildReport) -> (Vec<String>, Vec<String>) {
    let pick = |action: &str| {
        r.stages
            .iter()
            .filter(|s| s.action == action)
            .map(|s| s.stage.clone())
            .collect::<Vec<_>>()
    };
    (pick("built"), pick("skipped"))
}

impl Fixture {
    /// Adds the skeleton file `etc/motd` with `text` to the root
    /// filesystem's manifest and tree.
    fn with_motd(&self, text: &str) {
        let m = self.root.join("skeleton.txt");
        let manifest = std::fs::read_to_string(&m).unwrap();
        if !manifest.contains("etc/motd") {
            std::fs::write(&m, format!("{manifest}dir 0755 etc\nfile 0644 etc/motd\n")).unwrap();
        }
        std::fs::create_dir_all(self.root.join("skel/etc")).unwrap();
        std::fs::write(self.root.join("skel/etc/motd"), text).unwrap();
    }

    fn opts_reusing(&self, out: &Path, reuse: build::Reuse) -> BuildOptions {
        BuildOptions {
            reuse,
            ..self.opts(out)
        }
    }
}

#[test]
fn a_rebuild_with_nothing_changed_runs_no_stage_and_touches_no_file() {
    let _serial = serial();
    let f = Fixture::new();
    let out = f.out("again");
    let p = f.profile("1.0.0", "");
    let first = build::run(&p, &f.opts(&out)).unwrap();
    let (built, skipped) = built_and_skipped(&first);
    assert_eq!(built, ["kernel", "rootfs", "initramfs", "disk", "manifest"]);
    assert!(skipped.is_empty(), "{skipped:?}");
    let (bytes, times) = (built_files(&out), stamps(&out));
    for reuse in [build::Reuse::Stamps, build::Reuse::Digests] {
        let again = build::run(&p, &f.opts_reusing(&out, reuse)).unwrap();
        let (built, skipped) = built_and_skipped(&again);
        assert!(built.is_empty(), "{reuse:?}: {built:?} built again");
        assert_eq!(
            skipped,
            ["kernel", "rootfs", "initramfs", "disk", "manifest"]
        );
        assert!(built_files(&out) == bytes, "{reuse:?}: a file changed");
        assert_eq!(stamps(&out), times, "{reuse:?}: a file was rewritten");
        // The report lists the same artifacts, digests and all.
        assert_eq!(
            serde_json::to_value(&again.artifacts).unwrap(),
            serde_json::to_value(&first.artifacts).unwrap()
        );
    }
    assert_eq!(verify_ok(&f, &out), "1.0.0");
    // --force runs every stage, and writes the same bytes.
    let forced = build::run(&p, &f.opts_reusing(&out, build::Reuse::Never)).unwrap();
    let (built, _) = built_and_skipped(&forced);
    assert_eq!(built, ["kernel", "rootfs", "initramfs", "disk", "manifest"]);
    assert!(
        built_files(&out) == bytes,
        "a forced rebuild changed a file"
    );
    assert_ne!(stamps(&out), times, "a forced rebuild kept the old files");
}

#[test]
fn a_changed_skeleton_file_rebuilds_exactly_what_depends_on_it() {
    let _serial = serial();
    let f = Fixture::new();
    f.with_motd("one\n");
    // And a file of three blocks and more, which does not change.
    let m = f.root.join("skeleton.txt");
    let manifest = std::fs::read_to_string(&m).unwrap();
    std::fs::write(&m, format!("{manifest}file 0644 etc/big\n")).unwrap();
    let big: String = (0..100_000)
        .map(|i| format!("{}\n", i * 7919 % 10007))
        .collect();
    assert!(big.len() > 3 * 131072);
    std::fs::write(f.root.join("skel/etc/big"), big).unwrap();
    let out = f.out("motd");
    let p = f.profile("1.0.0", "");
    build::run(&p, &f.opts(&out)).unwrap();
    let before = stamps(&out);
    f.with_motd("two\n");
    let r = build::run(&p, &f.opts(&out)).unwrap();
    let (built, skipped) = built_and_skipped(&r);
    assert_eq!(built, ["rootfs", "initramfs", "disk", "manifest"]);
    assert_eq!(skipped, ["kernel"]);
    let after = stamps(&out);
    for name in [names::KERNEL, names::KERNEL_CONFIG] {
        assert_eq!(after[name], before[name], "{name} was rewritten");
    }
    for name in [names::ROOTFS, names::INITRAMFS, names::RAW, names::MANIFEST] {
        assert_ne!(after[name], before[name], "{name} was not rebuilt");
    }
    assert_eq!(verify_ok(&f, &out), "1.0.0");
    // Changed again, built by the command: the big file's blocks come from
    // the pack the builds before left in the cache directory, the
    // fragment block holding the changed file is compressed.
    let packs: Vec<_> = std::fs::read_dir(f.root.join("cache/squashfs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(
        packs.len() == 1 && packs[0].ends_with("-l1-b131072.pack"),
        "{packs:?}"
    );
    f.with_motd("three\n");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_imager"))
        .args(["build", "--progress=json", "--profile"])
        .arg(&p.path)
        .arg("--out")
        .arg(&out)
        .env("IMAGER_CACHE_DIR", f.root.join("cache"))
        .output()
        .unwrap();
    let err = String::from_utf8(o.stderr).unwrap();
    assert!(o.status.success(), "{err}");
    let (messages, _) = progress_lines(&err);
    let kept = messages
        .iter()
        .find_map(|m| {
            let rest = m.strip_prefix("rootfs: ")?;
            let (kept, rest) = rest.split_once(" of ")?;
            let (total, _) = rest.split_once(" blocks kept from earlier builds")?;
            Some((kept.parse::<u64>().ok()?, total.parse::<u64>().ok()?))
        })
        .unwrap_or_else(|| panic!("no blocks kept: {messages:?}"));
    assert!(kept.0 >= 3 && kept.0 < kept.1, "{kept:?}");
    // The same bytes as a whole build of the same inputs, with a cache
    // directory of its own (no blocks kept: every block compressed).
    let whole = f.out("motd-whole");
    let whole_opts = BuildOptions {
        cache_dir: f.root.join("cache-whole"),
        ..f.opts_reusing(&whole, build::Reuse::Never)
    };
    build::run(&p, &whole_opts).unwrap();
    let (a, b) = (snapshot(&out), snapshot(&whole));
    for (name, bytes) in &b {
        if name != names::RECORD {
            assert!(
                a.get(name) == Some(bytes),
                "{name} differs from a whole build"
            );
        }
    }
}

#[test]
fn a_damaged_output_is_rebuilt_and_what_depends_on_it_only_if_its_bytes_change() {
    let _serial = serial();
    let f = Fixture::new();
    let out = f.out("damaged");
    let p = f.profile("1.0.0", "");
    build::run(&p, &f.opts(&out)).unwrap();
    let bytes = built_files(&out);

    // Truncated: the disk is made again, the same bytes; nothing else runs.
    let raw = out.join(names::RAW);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&raw)
        .unwrap()
        .set_len(4096)
        .unwrap();
    let r = build::run(&p, &f.opts(&out)).unwrap();
    assert_eq!(built_and_skipped(&r).0, ["disk"]);
    assert!(built_files(&out) == bytes);

    // Touched: the root filesystem is made again, the same bytes, so the
    // initramfs and the disk made from it are not.
    let rootfs = std::fs::File::options()
        .write(true)
        .open(out.join(names::ROOTFS))
        .unwrap();
    rootfs
        .set_modified(std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(7))
        .unwrap();
    drop(rootfs);
    let r = build::run(&p, &f.opts(&out)).unwrap();
    assert_eq!(built_and_skipped(&r).0, ["rootfs"]);
    assert!(built_files(&out) == bytes);

    // A byte changed behind the build's back, size and time kept: make's
    // check misses it, --verify-outputs does not.
    let initramfs = out.join(names::INITRAMFS);
    let before = std::fs::metadata(&initramfs).unwrap().modified().unwrap();
    let mut data = std::fs::read(&initramfs).unwrap();
    let last = data.len() - 1;
    data[last] ^= 0xff;
    std::fs::write(&initramfs, &data).unwrap();
    std::fs::File::options()
        .write(true)
        .open(&initramfs)
        .unwrap()
        .set_modified(before)
        .unwrap();
    let r = build::run(&p, &f.opts(&out)).unwrap();
    assert!(built_and_skipped(&r).0.is_empty());
    let r = build::run(&p, &f.opts_reusing(&out, build::Reuse::Digests)).unwrap();
    assert_eq!(built_and_skipped(&r).0, ["initramfs"]);
    assert!(built_files(&out) == bytes);
    assert_eq!(verify_ok(&f, &out), "1.0.0");
}

/// The lines of a `--progress=json` build's standard error: every one a
/// JSON object, a stage's progress or a message. Returns the messages and
/// each stage's last line, having checked that every stage of the build
/// ended done.
fn progress_lines(err: &str) -> (Vec<String>, BTreeMap<String, serde_json::Value>) {
    let mut messages = Vec::new();
    let mut last: BTreeMap<String, serde_json::Value> = BTreeMap::new();
    for l in err.lines() {
        let l: serde_json::Value =
            serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {l:?}: {e}"));
        if let Some(stage) = l["stage"].as_str() {
            assert!(l["done"].is_u64() && l["total"].is_u64(), "{l}");
            last.insert(stage.to_string(), l.clone());
        } else {
            let m = l["message"].as_str().unwrap_or_else(|| panic!("{l}"));
            messages.push(m.to_string());
        }
    }
    let stages: Vec<&String> = last.keys().collect();
    assert_eq!(
        stages,
        ["disk", "initramfs", "kernel", "manifest", "rootfs"]
    );
    for l in last.values() {
        assert_eq!(l["done"], l["total"], "{l}");
    }
    (messages, last)
}

/// A build that runs cargo (the runtime from a cargo package): cargo's own
/// lines on standard error come as JSON messages too.
#[test]
fn progress_json_carries_the_lines_of_cargo_as_messages() {
    let _serial = serial();
    let f = Fixture::new();
    let pkg = f.root.join("tiny");
    std::fs::create_dir_all(&pkg).unwrap();
    std::fs::write(
        pkg.join("Cargo.toml"),
        "[package]\nname = \"tiny\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n\
         [[bin]]\nname = \"tiny\"\npath = \"main.rs\"\n\n[workspace]\n",
    )
    .unwrap();
    std::fs::write(
        pkg.join("Cargo.lock"),
        "version = 4\n\n[[package]]\nname = \"tiny\"\nversion = \"0.1.0\"\n",
    )
    .unwrap();
    std::fs::write(pkg.join("main.rs"), "fn main() {}\n").unwrap();
    f.profile("1.0.0", "");
    let text = std::fs::read_to_string(f.root.join("outputs-1.0.0.yaml")).unwrap();
    let text = text.replace("  binary: machined\n", "  cargo_package: tiny\n");
    assert!(text.contains("cargo_package: tiny"), "{text}");
    let profile = f.root.join("cargo.yaml");
    std::fs::write(&profile, text).unwrap();
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_imager"))
        .args(["build", "--progress=json", "--profile"])
        .arg(&profile)
        .arg("--out")
        .arg(f.out("cargo"))
        .output()
        .unwrap();
    let err = String::from_utf8(o.stderr).unwrap();
    assert!(o.status.success(), "{err}");
    let (messages, _) = progress_lines(&err);
    assert!(
        messages.iter().any(|m| m.contains("Compiling tiny v0.1.0")),
        "cargo's lines are not among the messages: {messages:?}"
    );
}

#[test]
fn progress_json_is_one_object_per_line_and_ends_with_every_stage_done() {
    let _serial = serial();
    let f = Fixture::new();
    let out = f.out("progress");
    f.profile("1.0.0", "");
    let run = || {
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_imager"))
            .args(["build", "--progress=json", "--profile"])
            .arg(f.root.join("outputs-1.0.0.yaml"))
            .arg("--out")
            .arg(&out)
            .output()
            .unwrap();
        let err = String::from_utf8(o.stderr).unwrap();
        assert!(o.status.success(), "{err}");
        progress_lines(&err).1
    };
    let first = run();
    assert!(first.values().all(|l| l.get("skipped").is_none()));
    let second = run();
    assert!(second.values().all(|l| l["skipped"] == true), "{second:?}");
}

/// The disk formats alone (no `raw`): the build signs qcow2, raw.zst and
/// raw.xz with their kinds, keeps no raw disk and no temporary, each holds
/// the same disk (checked by verify, and unpacked here), and a forced
/// rebuild writes the same bytes.
#[test]
fn the_disk_formats_are_built_signed_and_deterministic_without_the_raw_disk() {
    use imager::disk::compress::Unpacked;
    use imager::profile::Output;
    let _serial = serial();
    let f = Fixture::new();
    let out = f.out("formats");
    let mut p = f.profile("1.0.0", "");
    p.outputs = vec![Output::Qcow2, Output::RawZst, Output::RawXz];
    let r = build::run(&p, &f.opts(&out)).unwrap();
    let kinds: Vec<String> = r
        .artifacts
        .iter()
        .map(|a| a.kind.name().to_string())
        .collect();
    for k in ["qcow2", "raw-zst", "raw-xz"] {
        assert!(kinds.iter().any(|x| x == k), "{kinds:?}");
    }
    assert!(!kinds.iter().any(|x| x == "raw"), "{kinds:?}");
    verify_ok(&f, &out);
    let files = built_files(&out);
    assert!(!files.contains_key(names::RAW), "{:?}", files.keys());
    assert!(
        !files.keys().any(|k| k.starts_with('.')),
        "a temporary was left: {:?}",
        files.keys()
    );
    let disks: Vec<(String, u64)> = [names::QCOW2, names::RAW_ZST, names::RAW_XZ]
        .iter()
        .map(|n| imager::io::sha256_file(&Unpacked::open(&out.join(n)).unwrap().path).unwrap())
        .collect();
    assert_eq!(disks[0].1, 1 << 30);
    assert!(disks[0] == disks[1] && disks[1] == disks[2], "{disks:?}");
    let forced = build::run(&p, &f.opts_reusing(&out, build::Reuse::Never)).unwrap();
    assert_eq!(
        serde_json::to_value(&forced.artifacts).unwrap(),
        serde_json::to_value(&r.artifacts).unwrap()
    );
    assert!(
        built_files(&out) == files,
        "a forced rebuild changed a file"
    );
}
