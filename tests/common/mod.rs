//! Helpers shared by the end-to-end test binaries (`tests/*.rs`): running
//! the `imager` binary, independent tools, builds into `target/e2e/`.

// Each test binary uses a different subset of these helpers.
#![allow(dead_code)]
// Test helpers panic on unexpected failures: that is how a test fails.
#![allow(clippy::unwrap_used)]

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

mod fixture;
pub mod screen;
#[allow(clippy::duplicate_mod)]
mod tool;
pub mod vm;
#[allow(unused_imports)]
pub use fixture::{Fixture, panic_text};
#[allow(unused_imports)]
pub use tool::{tool, tool_path};

pub const EPOCH: &str = "1700000000";

/// The runtime's line for the default profiles' network, eth0 by DHCP, on
/// QEMU's user-mode network as `imager boot` gives it: QEMU's DHCP server
/// leases 10.0.2.15 for a day and, with `restrict=on`, names no router and
/// no DNS server.
pub const DHCP_UP: &str = "machined: net: eth0 10.0.2.15/24 no gateway by DHCP from 10.0.2.2 \
                           (lease 86400 s, renewal in 43200 s)";

/// `imager node credentials` arguments of the test node's certificate: its
/// name, and the addresses it is reached at (QEMU's guest address and the
/// host's forward).
pub const NODE1: [&str; 6] = [
    "--node",
    "node1",
    "--address",
    "10.0.2.15",
    "--address",
    "127.0.0.1",
];

pub fn repo() -> PathBuf {
    let r = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    r.canonicalize().unwrap_or(r)
}

pub fn imager() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_imager"));
    c.current_dir(repo()).env("SOURCE_DATE_EPOCH", EPOCH);
    c
}

pub fn run(cmd: &mut Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"))
}

pub fn ok(cmd: &mut Command) -> String {
    let out = run(cmd);
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub struct Build {
    pub dir: PathBuf,
    pub json: Value,
}

impl Build {
    /// The reference name of its installer image (the profile's default
    /// `installer.image`), as umoci and skopeo select it in the archive.
    pub fn installer_ref(&self) -> String {
        format!(
            "localhost/{}/installer:{}",
            self.json["name"].as_str().expect("name"),
            self.json["version"].as_str().expect("version")
        )
    }

    /// The build's raw disk, when it made one, checked by [`check_gpt`]:
    /// every disk a test builds has both its GPT copies whole.
    pub fn check_disks(&self) {
        let raw = self.json["artifacts"].as_array().and_then(|a| {
            a.iter()
                .find(|a| a["kind"] == "raw")
                .and_then(|a| a["path"].as_str())
        });
        if let Some(raw) = raw {
            check_gpt(Path::new(raw));
        }
    }

    pub fn artifact(&self, kind: &str) -> PathBuf {
        let a = self.json["artifacts"]
            .as_array()
            .expect("artifacts list")
            .iter()
            .find(|a| a["kind"] == kind)
            .unwrap_or_else(|| panic!("no {kind} artifact in {}", self.json));
        PathBuf::from(a["path"].as_str().expect("path"))
    }
}

/// SHA-256 of a file (hex), read a MiB at a time by the sha2 crate: the
/// disks are sparse gigabytes, which sha256sum reads at a tenth of the
/// speed (18 s for 2 GiB here).
pub fn sha256(path: &Path) -> String {
    use sha2::Digest;
    let f = std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut h = sha2::Sha256::new();
    std::io::copy(&mut std::io::BufReader::with_capacity(1 << 20, f), &mut h)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    hex::encode(h.finalize())
}

pub fn scratch() -> PathBuf {
    // scripts/test runs two files at once, each with a directory of its
    // own (IMAGER_E2E_DIR); alone, a file uses target/e2e.
    let d = std::env::var_os("IMAGER_E2E_DIR")
        .filter(|d| !d.is_empty())
        .map_or_else(|| repo().join("target").join("e2e"), PathBuf::from);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Builds the default image into target/e2e/NAME.
pub fn build_into(name: &str) -> Build {
    let dir = scratch().join(name);
    let _ = std::fs::remove_dir_all(&dir);
    let mut cmd = imager();
    let stdout = ok(cmd
        .args(["build", "--profile", "metal", "--json", "--out"])
        .arg(&dir));
    let json: Value = serde_json::from_str(&stdout).expect("build --json prints JSON");
    let b = Build { dir, json };
    b.check_disks();
    b
}

/// Builds `profile` into target/e2e/NAME with `args` added (`--key K`).
pub fn build_profile(name: &str, profile: &Path, args: &[&str]) -> Build {
    let dir = scratch().join(name);
    let _ = std::fs::remove_dir_all(&dir);
    let stdout = ok(imager()
        .args(["build", "--json", "--profile"])
        .arg(profile)
        .args(args)
        .arg("--out")
        .arg(&dir));
    let b = Build {
        dir,
        json: serde_json::from_str(&stdout).unwrap(),
    };
    b.check_disks();
    b
}

/// `imager boot IMAGE --json --quiet --timeout 600` with `args`: the
/// report, or the failure's stderr.
pub fn boot_report(image: &Path, args: &[&str]) -> Result<Value, String> {
    let out = run(imager()
        .args(["boot", "--json", "--quiet", "--timeout", "600"])
        .args(args)
        .arg(image));
    if out.status.success() {
        Ok(serde_json::from_slice(&out.stdout).unwrap())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// `imager boot --write` of `disk` with `args` (`--reboots` when asked),
/// keeping what the guest writes: the report and the whole console; the
/// disk's GPT checked after.
pub fn boot_written(disk: &Path, reboots: bool, args: &[&str]) -> (Value, String) {
    let log = disk.with_extension("console.log");
    let mut c = imager();
    c.args(["boot", "--write", "--quiet", "--json", "--timeout", "900"])
        .args(args)
        .arg("--console-log")
        .arg(&log)
        .arg(disk);
    if reboots {
        c.arg("--reboots");
    }
    let report: Value = serde_json::from_str(&ok(&mut c)).unwrap();
    check_gpt(disk);
    (report, std::fs::read_to_string(&log).unwrap())
}

/// The partition names of `disk`, as sfdisk reads them.
pub fn partition_names(disk: &Path) -> Vec<String> {
    let json: Value = serde_json::from_str(&ok(tool("sfdisk").arg("--json").arg(disk))).unwrap();
    json["partitiontable"]["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap().to_string())
        .collect()
}

/// Partition `label` of `disk` as mtools names it (`DISK@@OFFSET`).
pub fn part_at(disk: &Path, label: &str) -> String {
    format!("{}@@{}", disk.display(), partition_range(disk, label).0)
}

/// The byte offset and length of partition `label` of the image, as
/// sfdisk reads its table.
pub fn partition_range(img: &Path, label: &str) -> (u64, u64) {
    let json: Value = serde_json::from_str(&ok(tool("sfdisk").arg("--json").arg(img))).unwrap();
    let pt = &json["partitiontable"];
    let sector = pt["sectorsize"].as_u64().unwrap_or(512);
    let p = pt["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == label)
        .unwrap_or_else(|| panic!("no {label} partition"));
    let (start, size) = (p["start"].as_u64().unwrap(), p["size"].as_u64().unwrap());
    (start * sector, size * sector)
}

/// The bytes of partition `label` of the image, as a reader.
fn partition_reader(img: &Path, label: &str) -> impl std::io::Read {
    use std::io::{Read, Seek, SeekFrom};
    let (at, len) = partition_range(img, label);
    let mut f = std::fs::File::open(img).unwrap();
    f.seek(SeekFrom::Start(at)).unwrap();
    f.take(len)
}

/// SHA-256 (hex) of the bytes of partition `label` of the image, streamed.
pub fn partition_sha256(img: &Path, label: &str) -> String {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    std::io::copy(&mut partition_reader(img, label), &mut h).unwrap();
    hex::encode(h.finalize())
}

/// Copies the byte range of partition `label` out of the image.
pub fn extract_partition(img: &Path, label: &str, dest: &Path) {
    let mut out = std::fs::File::create(dest).unwrap();
    std::io::copy(&mut partition_reader(img, label), &mut out).unwrap();
}

/// A profile beside the real ones, so its relative paths resolve the same.
pub fn write_profile(name: &str, edit: impl Fn(String) -> String) -> PathBuf {
    write_profile_from("metal", name, edit)
}

/// A variant of `profiles/BASE.yaml` beside the real ones.
pub fn write_profile_from(base: &str, name: &str, edit: impl Fn(String) -> String) -> PathBuf {
    let text = std::fs::read_to_string(repo().join(format!("profiles/{base}.yaml"))).unwrap();
    let dir = scratch().join("profiles");
    std::fs::create_dir_all(&dir).unwrap();
    let text = edit(text).replace(
        "../",
        &format!("{}/", repo().canonicalize().unwrap().display()),
    );
    let path = dir.join(format!("{name}.yaml"));
    std::fs::write(&path, text).unwrap();
    path
}

/// The GPT fields an attacker rewrites (offsets of the UEFI header).
pub struct GptCopy {
    pub header_at: u64,
    pub header: Vec<u8>,
    pub entries_at: u64,
    pub entries: Vec<u8>,
}

pub fn read_at(f: &mut std::fs::File, at: u64, len: usize) -> Vec<u8> {
    use std::io::{Read, Seek, SeekFrom};
    let mut b = vec![0u8; len];
    f.seek(SeekFrom::Start(at)).unwrap();
    f.read_exact(&mut b).unwrap();
    b
}

pub fn write_at(f: &mut std::fs::File, at: u64, b: &[u8]) {
    use std::io::{Seek, SeekFrom, Write};
    f.seek(SeekFrom::Start(at)).unwrap();
    f.write_all(b).unwrap();
}

pub fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

/// Writes a changed copy back with its CRCs made right.
pub fn seal(f: &mut std::fs::File, mut c: GptCopy) {
    let crc = crc32fast::hash(&c.entries);
    c.header[88..92].copy_from_slice(&crc.to_le_bytes());
    c.header[16..20].fill(0);
    let crc = crc32fast::hash(&c.header);
    c.header[16..20].copy_from_slice(&crc.to_le_bytes());
    write_at(f, c.entries_at, &c.entries);
    write_at(f, c.header_at, &c.header);
}

/// Both copies of the table changed by `change`, found where bootstate
/// reads them (the raw header sectors and arrays are what is changed).
pub fn craft_gpt(disk: &Path, change: impl Fn(&mut GptCopy)) {
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(disk)
        .unwrap();
    let size = bootstate::gpt::device_size(&mut f).unwrap();
    let h = bootstate::gpt::read_at(&mut f, size, 512).unwrap().header;
    let len = h.entry_count as usize * h.entry_size as usize;
    let backup_entries = h.alternate_lba - (len as u64).div_ceil(512);
    for (lba, entries) in [(1, h.entries_lba), (h.alternate_lba, backup_entries)] {
        let mut c = GptCopy {
            header_at: lba * 512,
            header: read_at(&mut f, lba * 512, 92),
            entries_at: entries * 512,
            entries: read_at(&mut f, entries * 512, len),
        };
        change(&mut c);
        seal(&mut f, c);
    }
}

/// The development key (`out/keys/dev.key`), made as a build makes it when
/// no test before made it (a test binary may run alone on a fresh
/// checkout).
pub fn dev_key() -> PathBuf {
    let key = repo().join("out/keys/dev.key");
    static MADE: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    MADE.get_or_init(|| {
        if !key.is_file() {
            ok(imager()
                .args(["keygen", "--private"])
                .arg(&key)
                .arg("--public")
                .arg(key.with_extension("pub")));
        }
    });
    key
}

/// An OVMF variable store at `out` with the key set of `keys` (a directory
/// of `imager keygen --secure-boot`) enrolled by `virt-fw-vars`, independent
/// of our own enrolment files; Secure Boot on, or (`secure_boot` false) off:
/// the firmware in user mode, enforcing nothing (a Secure Boot image's
/// systemd-boot enrols its keys on a machine in setup mode, which this
/// store is not).
pub fn enrolled_vars(keys: &Path, out: &Path, secure_boot: bool) -> PathBuf {
    enrolled_vars_of(contract::Arch::Amd64, keys, out, secure_boot)
}

/// [`enrolled_vars`] for the UEFI firmware of `arch`'s machine (AAVMF's
/// for arm64: `imager::qemu::machine::Machine::enrol_args`).
pub fn enrolled_vars_of(
    arch: contract::Arch,
    keys: &Path,
    out: &Path,
    secure_boot: bool,
) -> PathBuf {
    let _ = std::fs::remove_file(out);
    let m = imager::qemu::machine::Machine::of(arch);
    ok(tool("virt-fw-vars").args(m.enrol_args(keys, out, secure_boot).unwrap()));
    out.to_path_buf()
}

/// A new sparse blank disk image of `size` bytes at `path` (what was
/// there removed first).
pub fn blank_disk(path: &Path, size: u64) -> PathBuf {
    let _ = std::fs::remove_file(path);
    std::fs::File::create(path).unwrap().set_len(size).unwrap();
    path.to_path_buf()
}

/// The live system of `iso` (its FAT image's kernel, initramfs and the
/// live entry's command line), extracted into `dir` with xorriso and
/// mtools: what a UKI of the live system is made of.
pub fn live_system(iso: &Path, dir: &Path) -> (PathBuf, PathBuf, String) {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).unwrap();
    let efi = dir.join("efi.img");
    ok(tool("xorriso")
        .args(["-osirrox", "on", "-indev"])
        .arg(iso)
        .args(["-extract", &format!("/{}", contract::iso::EFI_IMAGE)])
        .arg(&efi));
    let get = |from: &str, to: &str| {
        ok(tool("mcopy")
            .arg("-i")
            .arg(&efi)
            .arg(format!("::{from}"))
            .arg(dir.join(to)));
        dir.join(to)
    };
    let kernel = get(contract::iso::LIVE_KERNEL, "vmlinuz");
    let initramfs = get(contract::iso::LIVE_INITRAMFS, "initramfs.zst");
    let entry = std::fs::read_to_string(get(contract::iso::LIVE_ENTRY, "live.conf")).unwrap();
    let cmdline = entry
        .lines()
        .find_map(|l| l.strip_prefix("options "))
        .unwrap_or_else(|| panic!("no options line in {entry}"))
        .trim()
        .to_string();
    (kernel, initramfs, cmdline)
}

/// A sparse copy of `disk` at `target/e2e/NAME.raw`.
pub fn sparse_copy(disk: &Path, name: &str) -> PathBuf {
    let d = scratch().join(format!("{name}.raw"));
    let _ = std::fs::remove_file(&d);
    ok(Command::new("cp").arg("--sparse=always").arg(disk).arg(&d));
    d
}

/// `imager upgrade` of `installer` on `disk` as the CLI makes it (3 tries,
/// `change_secure_boot` as --change-secure-boot), on counted devices with
/// the power cut before write `fail_at` (none: counted to the end): whether
/// it finished, and how many writes it made. A failure other than the cut
/// fails the test.
pub fn cut_upgrade(
    disk: &Path,
    installer: &Path,
    fail_at: Option<u64>,
    change_secure_boot: bool,
) -> (bool, u64) {
    use bootstate::Faulty;
    let slots = imager::install::open_slots(disk).unwrap();
    let arch = slots.disk.arch().unwrap();
    let b = match fail_at {
        Some(n) => Faulty::failing_at(slots.boot, n),
        None => Faulty::counting(slots.boot),
    };
    let mut m = b.share(slots.meta);
    let e = slots.esp.map(|e| b.share(e));
    let allowed = imager::install::Allowed {
        change_secure_boot,
        downgrade: false,
    };
    let r = imager::install::upgrade_on(b, &mut m, e, arch, installer, 3, allowed);
    if let Err(e) = &r {
        let chain = format!("{e:#}");
        assert!(chain.contains("simulated power cut"), "{chain}");
    }
    let writes = m.writes();
    drop(m);
    check_gpt(disk);
    (r.is_ok(), writes)
}

/// QEMU booting `kernel` and `initramfs` directly (no firmware, no boot
/// loader) with `append` as the command line, the console on stdout
/// (piped, for [`follow_console`]), no reboot, the NIC `imager boot` gives
/// (`imager::qemu::net`: the runtime finds the interface its command line
/// names); add disks before spawning.
pub fn direct_qemu(kernel: &Path, initramfs: &Path, append: &str) -> Command {
    let mut c = Command::new("qemu-system-x86_64");
    c.args(["-machine", "q35", "-m", "768", "-nodefaults"])
        .args(["-cpu", imager::qemu::CPU])
        .args(["-display", "none", "-no-reboot", "-serial", "stdio"])
        .arg("-kernel")
        .arg(kernel)
        .arg("-initrd")
        .arg(initramfs)
        .arg("-append")
        .arg(append)
        .args(imager::qemu::net::args(&Default::default()).expect("the default NIC"))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit());
    c
}

/// Follows the console of `child` (stdout piped) until QEMU exits, or a
/// line contains `until` (QEMU is then stopped); a failed test when
/// neither happens within `timeout`. Returns the console and whether QEMU
/// exited by itself.
pub fn follow_console(
    mut child: std::process::Child,
    until: Option<&str>,
    timeout: std::time::Duration,
) -> (Vec<String>, bool) {
    use std::io::{BufRead, BufReader, Write};
    use std::sync::mpsc;
    let (tx, rx) = mpsc::channel();
    let out = child.stdout.take().expect("QEMU's stdout is piped");
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = std::time::Instant::now() + timeout;
    let mut console = Vec::new();
    let exited = loop {
        match rx.recv_timeout(deadline.saturating_duration_since(std::time::Instant::now())) {
            Ok(line) => {
                let line = imager::qemu::clean_line(&line);
                let hit = until.is_some_and(|u| line.contains(u));
                eprintln!("{line}");
                console.push(line);
                if hit {
                    let _ = child.kill();
                    let _ = child.wait();
                    break false;
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                let _ = child.wait();
                break true;
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let _ = child.kill();
                panic!(
                    "no {until:?} and QEMU still running after {timeout:?}:\n{}",
                    console.join("\n")
                );
            }
        }
    };
    let _ = std::io::stderr().flush();
    (console, exited)
}

/// The live system of `iso` ([`live_system`], extracted into `dir`) as a
/// Unified Kernel Image made by `imager::uki` from systemd's stub,
/// `dir/live.efi`: its path, what `write_uki` reported, and the command
/// line inside.
pub fn live_uki(iso: &Path, dir: &Path) -> (PathBuf, imager::uki::UkiReport, String) {
    let (kernel, initramfs, cmdline) = live_system(iso, dir);
    assert!(cmdline.contains("machined.live="), "{cmdline}");
    let uki = dir.join("live.efi");
    let r = imager::uki::write_uki(
        &imager::uki::UkiInput {
            arch: contract::Arch::Amd64,
            stub: Path::new(imager::uki::DEFAULT_STUB),
            kernel: &kernel,
            initramfs: &initramfs,
            os_release: b"NAME=Imager\nID=imager\nVERSION_ID=0.1.0\n",
            cmdline: &cmdline,
        },
        &uki,
    )
    .unwrap();
    (uki, r, cmdline)
}

/// The seed of this run's sampled choices (which cut points boot under
/// firmware): `IMAGER_TEST_SEED` when set, else one from the clock. It is
/// printed, with the variable that reproduces the run's choices.
pub fn test_seed() -> u64 {
    static SEED: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *SEED.get_or_init(|| {
        let seed = match std::env::var("IMAGER_TEST_SEED") {
            Ok(s) => s
                .parse()
                .unwrap_or_else(|_| panic!("IMAGER_TEST_SEED={s:?} is not a number")),
            Err(_) => std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64),
        };
        say(&format!(
            "test: sampled with seed {seed} (IMAGER_TEST_SEED={seed} chooses the same)"
        ));
        seed
    })
}

/// A line straight to stderr, not through the test's captured output: the
/// run's log shows it whether the test passes or fails.
pub fn say(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// `k` of `from` (fewer when it has fewer), chosen by `seed` and `what`
/// (each sample of a run is its own draw), in ascending order.
pub fn sample(from: &[u64], k: usize, seed: u64, what: &str) -> Vec<u64> {
    // splitmix64, started from the seed and the sample's name.
    let mut state = what
        .bytes()
        .fold(seed, |s, b| s.rotate_left(5) ^ u64::from(b));
    let mut next = || {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    let mut pool = from.to_vec();
    let mut chosen = Vec::new();
    while chosen.len() < k && !pool.is_empty() {
        let i = (next() % pool.len() as u64) as usize;
        chosen.push(pool.swap_remove(i));
    }
    chosen.sort_unstable();
    chosen
}

/// The sector size of `disk`'s GPT: where its primary header is (LBA 1).
pub fn gpt_sector_size(disk: &Path) -> u64 {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(disk).unwrap();
    for ss in [512, 4096] {
        let mut sig = [0u8; 8];
        f.seek(SeekFrom::Start(ss)).unwrap();
        if f.read_exact(&mut sig).is_ok() && &sig == b"EFI PART" {
            return ss;
        }
    }
    panic!(
        "{}: no GPT header at LBA 1 of 512 or 4096 bytes",
        disk.display()
    )
}

/// [`check_gpt`] for a disk of 4096-byte sectors: `fdisk -b 4096 -l`
/// (util-linux's libfdisk checks both headers' and arrays' CRCs and
/// warns, on stderr, of a damaged or misplaced table) lists the six
/// partitions and warns of nothing.
pub fn check_gpt_4096(disk: &Path) {
    let out = run(tool("fdisk").args(["-b", "4096", "-l"]).arg(disk));
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        out.status.success()
            && stderr.trim().is_empty()
            && stdout.contains("Disklabel type: gpt")
            && stdout.contains("Sector size (logical/physical): 4096 bytes"),
        "fdisk -b 4096 -l {}:\n{stdout}\n{stderr}",
        disk.display()
    );
    let rows = stdout
        .lines()
        .filter(|l| l.starts_with(&*disk.to_string_lossy()))
        .count();
    assert_eq!(rows, 6, "{stdout}");
}

/// Both GPT copies of `disk` as an independent reader checks them:
/// `sgdisk -v` (gdisk) verifies the primary and the backup header and
/// array, their CRCs and that they agree. It exits 0 whatever it finds, so
/// its words decide: "No problems found" and none of its warnings of a
/// damaged table (sfdisk only warns of a bad backup, and reads on).
/// sgdisk reads a file in 512-byte sectors only: a disk of 4096-byte
/// sectors is checked by `fdisk -b 4096` ([`check_gpt_4096`]).
pub fn check_gpt(disk: &Path) {
    if gpt_sector_size(disk) == 4096 {
        return check_gpt_4096(disk);
    }
    let out = run(tool("sgdisk").arg("-v").arg(disk));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // The last three: no GPT at all (sgdisk makes one up in memory, and
    // then finds no problem with it).
    const DAMAGE: [&str; 9] = [
        "Caution",
        "ERROR",
        "corrupt",
        "Problem",
        "problems!",
        "differ",
        "Creating new GPT",
        "invalid GPT",
        "converting MBR",
    ];
    let found: Vec<&str> = DAMAGE.into_iter().filter(|w| text.contains(w)).collect();
    assert!(
        out.status.success() && text.contains("No problems found") && found.is_empty(),
        "sgdisk -v {}: {found:?}:\n{text}",
        disk.display()
    );
}
