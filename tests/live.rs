//! The live system's install path end to end, without the ISO: QEMU boots
//! the installer build's kernel directly with its initramfs followed by a
//! second archive holding `/live` (what the live ISO's initramfs adds: the
//! installer, the payload, the trusted key), a stand-in boot medium (a disk
//! whose ISO 9660 Primary Volume Descriptor carries the live ID) and a
//! target disk. The ISO itself is built and booted by the ISO tests.

// Test helpers panic on unexpected failures: that is how a test fails.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use serde_json::Value;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const ID: &str = "5e1f0a11";
const TIMEOUT: Duration = Duration::from_secs(600);

struct Live {
    dir: PathBuf,
    kernel: PathBuf,
    initramfs: PathBuf,
    cmdline: String,
    /// The build's raw disk: a disk holding data (a GPT, partitions).
    raw: PathBuf,
}

/// The installer build, unpacked, and its initramfs with `/live` appended.
fn live() -> &'static Live {
    static L: Fixture<Live> = Fixture::new("live");
    L.get(|| {
        let out = scratch().join("live-build");
        let _ = std::fs::remove_dir_all(&out);
        let json: Value = serde_json::from_str(&ok(imager()
            .args(["build", "--profile", "installer", "--json", "--out"])
            .arg(&out)))
        .unwrap();
        let b = Build { dir: out, json };
        let dir = scratch().join("live");
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("layout")).unwrap();
        ok(tool("tar")
            .arg("-xf")
            .arg(b.artifact("installer"))
            .arg("-C")
            .arg(dir.join("layout")));
        ok(tool("umoci")
            .args(["unpack", "--image"])
            .arg(format!(
                "{}:{}",
                dir.join("layout").display(),
                b.installer_ref()
            ))
            .arg(dir.join("bundle")));
        let root = dir.join("bundle/rootfs");
        let payload = root.join(contract::paths::installer_payload_dir(
            contract::Arch::Amd64,
        ));
        let manifest: Value =
            serde_json::from_slice(&std::fs::read(payload.join("manifest.json")).unwrap()).unwrap();
        let cmdline = manifest["boot"]["cmdline"].as_str().unwrap().to_string();

        // The live archive: live/, live/installer, live/payload/*, live/trusted.pub.
        let mut w = imager::initramfs::CpioWriter::new(Vec::new(), 1_700_000_000);
        w.dir(contract::paths::LIVE_DIR, 0o755).unwrap();
        let add = |w: &mut imager::initramfs::CpioWriter<Vec<u8>>, path: &str, src: &Path, mode| {
            let data = std::fs::read(src).unwrap();
            w.file(path, mode, data.len() as u64, &mut data.as_slice())
                .unwrap();
        };
        add(
            &mut w,
            contract::paths::LIVE_INSTALLER,
            &root.join(contract::paths::INSTALLER_BINARY),
            0o755,
        );
        w.dir(contract::paths::LIVE_PAYLOAD_DIR, 0o755).unwrap();
        let mut names: Vec<String> = std::fs::read_dir(&payload)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        for n in names {
            let path = format!("{}/{n}", contract::paths::LIVE_PAYLOAD_DIR);
            add(&mut w, &path, &payload.join(&n), 0o644);
        }
        add(
            &mut w,
            contract::paths::LIVE_TRUSTED_KEY,
            &repo().join("out/keys/dev.pub"),
            0o644,
        );
        let cpio = w.finish().unwrap();
        let mut initramfs = std::fs::read(payload.join("initramfs.zst")).unwrap();
        // The kernel unpacks concatenated archives; the next one starts at
        // a multiple of 4 (zeros in between are skipped).
        initramfs.resize(initramfs.len().next_multiple_of(4), 0);
        initramfs.extend_from_slice(&zstd::encode_all(cpio.as_slice(), 3).unwrap());
        let live_initramfs = dir.join("live-initramfs");
        std::fs::write(&live_initramfs, initramfs).unwrap();

        // The stand-in boot medium: a PVD at 32768, the ID as its Volume
        // Set Identifier (space padded).
        let mut iso = vec![0u8; 4 << 20];
        let p = 32768;
        iso[p] = 1;
        iso[p + 1..p + 6].copy_from_slice(b"CD001");
        iso[p + 6] = 1;
        iso[p + 190..p + 318].fill(b' ');
        iso[p + 190..p + 190 + ID.len()].copy_from_slice(ID.to_uppercase().as_bytes());
        std::fs::write(dir.join("iso.raw"), iso).unwrap();
        Live {
            kernel: payload.join("vmlinuz"),
            initramfs: live_initramfs,
            cmdline,
            raw: b.artifact("raw"),
            dir,
        }
    })
}

/// A sparse blank disk image of `size` bytes.
fn blank(name: &str, size: u64) -> PathBuf {
    blank_disk(&live().dir.join(format!("{name}.raw")), size)
}

/// QEMU booting the live system with the boot medium (serial `live-iso`)
/// and `target` (serial `target1`; read-only with `read_only`) and
/// `append` on the command line (add arguments before spawning).
fn live_qemu(target: &Path, read_only: bool, append: &str) -> Command {
    live_qemu_on(target, read_only, append, "virtio-blk-pci")
}

/// [`live_qemu`] with the target on a `device` of QEMU's (its driver and
/// properties, before `,drive=`).
fn live_qemu_on(target: &Path, read_only: bool, append: &str, device: &str) -> Command {
    let l = live();
    let mut c = direct_qemu(&l.kernel, &l.initramfs, &format!("{} {append}", l.cmdline));
    c.arg("-drive")
        .arg(format!(
            "if=none,id=iso,format=raw,snapshot=on,file={}",
            l.dir.join("iso.raw").display()
        ))
        .args(["-device", "virtio-blk-pci,drive=iso,serial=live-iso"])
        .arg("-drive")
        .arg(format!(
            "if=none,id=t,format=raw,file={}{}",
            target.display(),
            if read_only { ",readonly=on" } else { "" }
        ))
        .arg("-device")
        .arg(format!("{device},drive=t,serial=target1"));
    c
}

/// Boots the live system ([`live_qemu`]) until QEMU exits or a console
/// line contains `until` (then QEMU is stopped). Returns the console and
/// whether QEMU exited by itself.
fn boot(target: &Path, read_only: bool, append: &str, until: &str) -> (Vec<String>, bool) {
    let child = live_qemu(target, read_only, append).spawn().unwrap();
    follow_console(child, Some(until), TIMEOUT)
}

/// How long a live system that is up takes at most to power off after
/// the ACPI power button (generous: TCG on a loaded machine).
const POWER_OFF_TIMEOUT: Duration = Duration::from_secs(300);

/// What a boot that was refused its install did ([`boot_refused`]).
struct Refused {
    console: Vec<String>,
    /// The index in `console` of the line saying why the install was not
    /// done ([`STAYS_UP`]), if one came.
    refusal: Option<usize>,
    /// Whether QEMU exited by itself after the power button.
    exited: bool,
}

/// Boots the live system ([`live_qemu`]) with a QMP socket until the line
/// saying why it does not install; then presses the ACPI power button
/// (QMP `system_powerdown`) and follows the console until QEMU exits. Only
/// a system still up after the refusal answers the button: PID 1's
/// supervisor announces the power-off and the machine powers off.
fn boot_refused(target: &Path, read_only: bool, append: &str) -> Refused {
    use std::io::{BufRead, BufReader};
    use std::sync::mpsc;
    use std::time::Instant;
    let qmp = live().dir.join("refuse.qmp");
    let _ = std::fs::remove_file(&qmp);
    let mut child = live_qemu(target, read_only, append)
        .arg("-qmp")
        .arg(format!("unix:{},server=on,wait=off", qmp.display()))
        .spawn()
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let out = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut console = Vec::new();
    let mut refusal = None;
    let mut deadline = Instant::now() + TIMEOUT;
    let exited = loop {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(line) => {
                let line = imager::qemu::clean_line(&line);
                eprintln!("{line}");
                let refused = refusal.is_none() && line.contains(STAYS_UP);
                console.push(line);
                if refused {
                    refusal = Some(console.len() - 1);
                    power_button(&qmp);
                    deadline = Instant::now() + POWER_OFF_TIMEOUT;
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                child.wait().unwrap();
                break true;
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let _ = child.kill();
                let _ = child.wait();
                break false;
            }
        }
    };
    Refused {
        console,
        refusal,
        exited,
    }
}

/// Presses the ACPI power button of the QEMU whose QMP socket is `socket`.
fn power_button(socket: &Path) {
    use std::io::{BufRead, BufReader, Write};
    let stream = std::os::unix::net::UnixStream::connect(socket)
        .unwrap_or_else(|e| panic!("QMP at {}: {e}", socket.display()));
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut w = stream;
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    assert!(line.contains("\"QMP\""), "QMP greeting: {line}");
    for cmd in ["qmp_capabilities", "system_powerdown"] {
        writeln!(w, "{{\"execute\":\"{cmd}\"}}").unwrap();
        loop {
            line.clear();
            assert!(reader.read_line(&mut line).unwrap() > 0, "QMP closed");
            if line.contains("\"return\"") {
                break;
            }
            assert!(!line.contains("\"error\""), "QMP {cmd}: {line}");
        }
    }
}

/// SHA-256 of `len` zero bytes.
fn zero_digest(len: u64) -> String {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    std::io::copy(&mut std::io::repeat(0).take(len), &mut h).unwrap();
    hex::encode(h.finalize())
}

fn has(console: &[String], text: &str) -> bool {
    console.iter().any(|l| l.contains(text))
}

const STAYS_UP: &str = "the live system stays up";

/// The runtime's line for the default profiles' network section.
const UP: &str = common::DHCP_UP;

/// A blank disk named by serial: the live system reaches ready (the live
/// ready line, which `imager boot` parses), installs with the node's own
/// settings given on its command line, powers off; the disk then boots the
/// installed version from slot A under UEFI and BIOS, with those settings
/// (hostname, static address, DNS server) and not the image's DHCP.
#[test]
fn live_install_onto_a_blank_disk_then_the_disk_boots() {
    let disk = blank("install-ok", 2 << 30);
    let (console, exited) = boot(
        &disk,
        false,
        &format!(
            "machined.live={ID} machined.install=serial:target1 \
             machined.install.hostname=installed-7 \
             machined.install.net=eth0:10.0.2.30/24:10.0.2.2 machined.install.dns=10.0.2.3"
        ),
        "machined: fatal",
    );
    let all = console.join("\n");
    assert!(exited, "{all}");
    assert!(
        has(&console, "machined: stage1: live: moved /live to /run/live"),
        "{all}"
    );
    let ready = console
        .iter()
        .find_map(|l| imager::qemu::parse_ready(l))
        .unwrap_or_else(|| panic!("no ready line:\n{all}"));
    assert!(ready.live && ready.slot.is_none(), "{ready:?}");
    // The profile's network section, configured before ready.
    assert!(has(&console, UP), "{all}");
    assert!(
        has(
            &console,
            "machined: installed 0.1.0 on /dev/vdb (slot A); powering off"
        ),
        "{all}"
    );
    for fw in ["uefi", "bios"] {
        let log = live().dir.join(format!("installed-{fw}.console"));
        let r = boot_report(
            &disk,
            &["--firmware", fw, "--console-log", log.to_str().unwrap()],
        )
        .unwrap();
        assert_eq!((&r["version"], &r["slot"]), (&"0.1.0".into(), &"A".into()));
        assert_eq!(r["live"], false);
        let installed = std::fs::read_to_string(&log).unwrap();
        for want in [
            "machined: host: hostname installed-7 (the node's settings in META)",
            "machined: net: eth0 10.0.2.30/24 gateway 10.0.2.2 (up; the node's settings in META)",
            "machined: net: DNS servers 10.0.2.3 (the node's settings in META)",
        ] {
            assert!(
                installed.lines().any(|l| l == want),
                "{fw}: no line {want:?}:\n{installed}"
            );
        }
        assert!(!installed.contains("by DHCP"), "{fw}:\n{installed}");
    }
}

/// A live install onto a 4Kn disk (QEMU's NVMe with 4096-byte logical
/// blocks): the installer lays it out in 4096-byte sectors as the device
/// says (BOOT is the ESP, no GRUB: `contract::partition::esp_role`), and
/// the disk then boots from NVMe under OVMF.
#[test]
fn live_install_onto_a_4kn_nvme_disk_then_it_boots() {
    let disk = blank("install-4kn", 2 << 30);
    let child = live_qemu_on(
        &disk,
        false,
        &format!("machined.live={ID} machined.install=serial:target1"),
        "nvme,logical_block_size=4096,physical_block_size=4096",
    )
    .spawn()
    .unwrap();
    let (console, exited) = follow_console(child, Some("machined: fatal"), TIMEOUT);
    let all = console.join("\n");
    assert!(exited, "{all}");
    assert!(
        has(
            &console,
            "machined: installed 0.1.0 on /dev/nvme0n1 (slot A); powering off"
        ),
        "{all}"
    );
    assert_eq!(gpt_sector_size(&disk), 4096);
    check_gpt(&disk);
    let r = boot_report(&disk, &["--bus", "nvme"]).unwrap();
    assert_eq!((&r["version"], &r["slot"]), (&"0.1.0".into(), &"A".into()));
    assert_eq!(r["firmware"], "uefi");
}

/// A disk named by its udev by-id path (there is no udev: the runtime
/// works the name out from sysfs) and by its kernel name installs as well.
#[test]
fn live_install_by_id_path_and_by_kernel_name() {
    for (name, target) in [
        ("install-by-id", "/dev/disk/by-id/virtio-target1"),
        ("install-by-name", "vdb"),
    ] {
        let disk = blank(name, 2 << 30);
        let (console, exited) = boot(
            &disk,
            false,
            &format!("machined.live={ID} machined.install={target}"),
            "machined: fatal",
        );
        let all = console.join("\n");
        assert!(exited, "{target}: {all}");
        assert!(
            has(
                &console,
                "machined: installed 0.1.0 on /dev/vdb (slot A); powering off"
            ),
            "{target}: {all}"
        );
        assert_eq!(
            partition_names(&disk),
            ["EFI", "BIOS", "BOOT", "META", "STATE", "EPHEMERAL"]
        );
    }
}

/// Every refusal says why on a `machined: install:` line and leaves the
/// live system up: after the line, the ACPI power button makes PID 1
/// announce a clean power-off and the machine powers off, as only a
/// running system does; the target unchanged.
#[test]
fn live_install_refusals_leave_the_system_up_and_the_disk_unchanged() {
    let l = live();
    let data = l.dir.join("refuse-data.raw");
    ok(Command::new("cp")
        .arg("--sparse=always")
        .arg(&l.raw)
        .arg(&data));
    let before = sha256(&data);
    let small = blank("refuse-small", 100 << 20);
    let empty = blank("refuse-blank", 1 << 30);
    // The last cases also carry a machined.net= that cannot be used (it
    // wins over the image's): the node says why and runs without network.
    let cases: [(&Path, bool, String, &str, &str); 7] = [
        (
            &data,
            false,
            format!("machined.live={ID} machined.install=vdb"),
            "refusing /dev/vdb (serial:target1): it holds data: a GPT partition table",
            UP,
        ),
        (
            &data,
            false,
            format!("machined.live={ID} machined.install=/dev/disk/by-id/virtio-target1-part2"),
            "is a partition (of /dev/vdb)",
            UP,
        ),
        (
            &empty,
            false,
            format!("machined.live={ID} machined.install=serial:live-iso machined.install.wipe=1"),
            "refusing /dev/vda (serial:live-iso): it is the boot medium",
            UP,
        ),
        (
            &empty,
            true,
            format!("machined.live={ID} machined.install=serial:target1"),
            "(serial:target1) is read-only",
            UP,
        ),
        (
            &small,
            false,
            format!("machined.live={ID} machined.install=/dev/vdb"),
            "install onto a disk of at least",
            UP,
        ),
        (
            &empty,
            false,
            "machined.live=.. machined.install=vdb machined.net=eth9:10.0.3.15/24".to_string(),
            "machined.live has no valid ID",
            "machined: net: warning: no interface eth9 appeared in 10 s (interfaces: eth0, lo); \
             no network",
        ),
        (
            &empty,
            false,
            format!("machined.live={ID} machined.install=../vdb machined.net=eth0:10.0.2.15/33"),
            "machined.install=\"../vdb\" is not a disk",
            "machined: net: warning: machined.net=\"eth0:10.0.2.15/33\": the prefix length \
             \"33\" is not a number from 1 to 32; no network",
        ),
    ];
    for (disk, ro, append, want, net) in cases {
        let Refused {
            console,
            refusal,
            exited,
        } = boot_refused(disk, ro, &append);
        let all = console.join("\n");
        let at = refusal.unwrap_or_else(|| panic!("{append}: no {STAYS_UP:?} line:\n{all}"));
        let (before, after) = console.split_at(at + 1);
        assert!(
            has(before, "machined: ready version=0.1.0 live uptime="),
            "{all}"
        );
        let line = &console[at];
        assert!(
            line.contains(want),
            "{append}: want {want:?} in {line:?}:\n{all}"
        );
        assert!(
            !has(before, "powering off"),
            "{append}: powered off before the refusal:\n{all}"
        );
        // Still up after the refusal: the power button is answered by a
        // clean power-off, and QEMU exits by itself.
        assert!(
            has(after, "machined: powering off"),
            "{append}: no power-off after the power button:\n{all}"
        );
        assert!(
            exited,
            "{append}: still running {POWER_OFF_TIMEOUT:?} after the power button:\n{all}"
        );
        assert!(
            !has(&console, "machined: fatal") && !has(&console, "Kernel panic"),
            "{append}: {all}"
        );
        assert!(has(&console, net), "{append}: want {net:?}:\n{all}");
        // Its outcome: the lease, or why there is no network (DHCP's start,
        // `net: eth0 by DHCP (…)`, is said before the lease).
        let net_lines = console
            .iter()
            .filter(|l| {
                l.starts_with("machined: net: ")
                    && !l.contains(" sysctls ")
                    && !l.ends_with(" by DHCP (the image's default, machined.net=)")
            })
            .count();
        assert_eq!(net_lines, 1, "{append}: one line on the network:\n{all}");
    }
    assert_eq!(sha256(&data), before, "the disk was written");
    for p in [&small, &empty] {
        assert_eq!(sha256(p), zero_digest(std::fs::metadata(p).unwrap().len()));
    }
}
