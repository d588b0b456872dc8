use super::*;
use crate::disk::testutil::{run, tool};
use std::os::unix::fs::FileExt;

const MACHINE: Machine = Machine {
    name: "metal <&\"'>",
    cpus: 2,
    memory_mib: 2048,
};

fn sample(dir: &Path) -> std::path::PathBuf {
    let raw = dir.join("src.raw");
    let f = File::create(&raw).unwrap();
    f.set_len(40 << 20).unwrap();
    f.write_all_at(b"start", 0).unwrap();
    f.write_all_at(&[3u8; 200_000], 33 << 20).unwrap();
    raw
}

/// GNU tar lists the descriptor first and the VMDK second; Python's XML
/// parser reads the descriptor (the name escaped) and finds the disk's
/// capacity, the VMDK's size, EFI firmware, SATA and VMXNET3; the VMDK
/// tar extracts is the disk for qemu-img; our reader gives the disk back;
/// the same disk gives the same bytes.
#[test]
fn an_ova_is_its_descriptor_then_its_stream_optimised_disk() {
    let dir = tempfile::tempdir().unwrap();
    let raw = sample(dir.path());
    let ova = dir.path().join("vmware.ova");
    write_ova(&raw, &ova, &MACHINE, [1; 16], 1_700_000_000).unwrap();

    let list = run(std::process::Command::new(tool("tar"))
        .env("TZ", "UTC")
        .arg("-tvf")
        .arg(&ova));
    let list = String::from_utf8_lossy(&list.stdout).into_owned();
    let names: Vec<&str> = list
        .lines()
        .map(|l| l.rsplit(' ').next().unwrap())
        .collect();
    assert_eq!(names, [OVF_NAME, VMDK_NAME], "{list}");
    assert!(
        list.lines().all(|l| l.starts_with("-rw-r--r-- 0/0")),
        "{list}"
    );

    let x = dir.path().join("x");
    std::fs::create_dir(&x).unwrap();
    run(std::process::Command::new(tool("tar"))
        .arg("-xf")
        .arg(&ova)
        .arg("-C")
        .arg(&x));
    let vmdk_size = std::fs::metadata(x.join(VMDK_NAME)).unwrap().len();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/common/read-ovf.py");
    let out = run(std::process::Command::new(tool("python3"))
        .arg(script)
        .arg(x.join(OVF_NAME)));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!(
            "disk.vmdk|{vmdk_size}|{}|byte|streamOptimized|ovf:/disk/vmdisk1|vmware.sata.ahci|\
             VmxNet3|vmx-14|efi|metal <&\"'>",
            40 << 20
        )
    );
    let cmp = run(std::process::Command::new(tool("qemu-img"))
        .args(["compare", "-f", "raw", "-F", "vmdk"])
        .arg(&raw)
        .arg(x.join(VMDK_NAME)));
    assert!(String::from_utf8_lossy(&cmp.stdout).contains("identical"));

    let back = dir.path().join("back.raw");
    let size = unpack(
        &mut File::open(&ova).unwrap(),
        &File::create(&back).unwrap(),
    )
    .unwrap();
    assert_eq!(size, 40 << 20);
    assert!(std::fs::read(&back).unwrap() == std::fs::read(&raw).unwrap());
    // The same two files packed by GNU tar: our reader takes them too.
    let gnu = dir.path().join("gnu.ova");
    run(std::process::Command::new(tool("tar"))
        .args(["--format=ustar", "-cf"])
        .arg(&gnu)
        .arg("-C")
        .arg(&x)
        .args([OVF_NAME, VMDK_NAME]));
    let size = unpack(
        &mut File::open(&gnu).unwrap(),
        &File::create(&back).unwrap(),
    )
    .unwrap();
    assert_eq!(size, 40 << 20);
    assert!(std::fs::read(&back).unwrap() == std::fs::read(&raw).unwrap());
    std::fs::remove_file(&gnu).unwrap();

    let again = dir.path().join("again.ova");
    write_ova(&raw, &again, &MACHINE, [1; 16], 1_700_000_000).unwrap();
    assert!(std::fs::read(&again).unwrap() == std::fs::read(&ova).unwrap());
    // No temporary VMDK is left beside it.
    let mut left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    left.sort();
    assert_eq!(
        left,
        ["again.ova", "back.raw", "src.raw", "vmware.ova", "x"]
    );
}

/// An OVA whose first member is not its descriptor, one without a disk,
/// and an empty one are refused, saying which.
#[test]
fn the_ova_reader_refuses_archives_that_are_not_ovas() {
    let dir = tempfile::tempdir().unwrap();
    let sink = File::create(dir.path().join("out.raw")).unwrap();
    let tar_of = |members: &[(&str, &[u8])]| {
        let mut b = tar::Builder::new(Vec::new());
        for (name, data) in members {
            let mut h =
                crate::oci::tar_header(tar::EntryType::Regular, 0o644, data.len() as u64, 0);
            b.append_data(&mut h, name, *data).unwrap();
        }
        b.into_inner().unwrap()
    };
    let refuse = |bytes: Vec<u8>, want: &str| {
        let e = unpack(&mut &bytes[..], &sink).unwrap_err();
        assert!(format!("{e:#}").contains(want), "{want}: {e:#}");
    };
    refuse(tar_of(&[("disk.vmdk", b"KDMV")]), "starts with its .ovf");
    refuse(tar_of(&[("a.ovf", b"<x/>"), ("b.mf", b"")]), "no .vmdk");
    refuse(tar_of(&[]), "empty");
    refuse(
        tar_of(&[("a.ovf", b"<x/>"), ("d.vmdk", b"KDMV")]),
        "truncated",
    );
}
