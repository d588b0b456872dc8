//! End-to-end tests of the installer image: `imager build --profile
//! installer` makes `installer.tar`, an OCI archive that skopeo and umoci
//! read, whose entrypoint is the static imager and whose payload verifies.
//!
//! The kernel comes from the build cache; the static installer binary is
//! compiled by the first build (release, LTO: a few minutes cold).

// Test helpers panic on unexpected failures: that is how a test fails.
#![allow(clippy::unwrap_used)]

mod common;
#[path = "../registry/tests/common/mod.rs"]
mod reg;

use common::*;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// The installer image's reference name (the profile's default).
const TAG: &str = "localhost/metal/installer:0.1.0";

fn build_installer(name: &str) -> Build {
    let dir = scratch().join(name);
    let _ = std::fs::remove_dir_all(&dir);
    let stdout = ok(imager()
        .args(["build", "--profile", "installer", "--json", "--out"])
        .arg(&dir));
    let json: Value = serde_json::from_str(&stdout).expect("build --json prints JSON");
    Build { dir, json }
}

/// The installer image, built once for all tests.
fn image() -> &'static Build {
    static B: Fixture<Build> = Fixture::new("installer-first");
    B.get(|| build_installer("installer-first"))
}

fn archive() -> PathBuf {
    let a = image().artifact("installer");
    assert_eq!(a.file_name().unwrap(), "installer.tar");
    a
}

fn dev_pub() -> PathBuf {
    repo().join("out/keys/dev.pub")
}

/// Extracts the payload of `archive`, trusting the development key (what
/// the installer does with the keys a disk trusts).
fn extract(archive: &Path, dest: &Path) -> PathBuf {
    let key = imager::sign::load_public_key(&dev_pub()).unwrap();
    extract_with(archive, dest, &key)
}

/// Each of `names` is the same in `want` and in `got` (extracted from `copy`).
fn same_files(want: &Path, got: &Path, names: &[&str], copy: &Path) {
    for name in names {
        assert_eq!(
            std::fs::read(want.join(name)).unwrap(),
            std::fs::read(got.join(name)).unwrap(),
            "{name} of {}",
            copy.display()
        );
    }
}

/// The archive unpacked into an OCI layout directory (umoci reads those).
fn layout() -> &'static Path {
    static L: Fixture<PathBuf> = Fixture::new("installer-layout");
    L.get(|| {
        let dir = scratch().join("installer-layout");
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        ok(tool("tar").arg("-xf").arg(archive()).arg("-C").arg(&dir));
        dir
    })
}

#[test]
fn two_builds_give_byte_identical_archives_listed_in_the_signed_manifest() {
    let a = archive();
    let second = build_installer("installer-second");
    let b = second.artifact("installer");
    let digest = |p: &Path| ok(tool("sha256sum").arg(p))[..64].to_string();
    assert_eq!(
        digest(&a),
        digest(&b),
        "{} and {} differ (cmp -l shows where)",
        a.display(),
        b.display()
    );
    // The build's manifest lists the archive (and metal's disk image) and
    // verifies.
    let m: Value =
        serde_json::from_slice(&std::fs::read(image().dir.join("manifest.json")).unwrap()).unwrap();
    let kinds: Vec<&str> = m["artifacts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["kind"].as_str().unwrap())
        .collect();
    assert!(kinds.contains(&"installer"), "{kinds:?}");
    assert!(kinds.contains(&"raw"), "{kinds:?}");
    assert_eq!(m["name"], "metal");
    assert_eq!(m["profile"], "profiles/installer.yaml");
    assert_eq!(m["boot"]["title"], "Imager 0.1.0");
    ok(imager()
        .arg("verify")
        .arg(&image().dir)
        .arg("--key")
        .arg(dev_pub()));
    // No temporaries are left in the output directory.
    for e in std::fs::read_dir(&image().dir).unwrap() {
        let n = e.unwrap().file_name().to_string_lossy().into_owned();
        assert!(!n.starts_with('.'), "left behind: {n}");
    }
}

#[test]
fn skopeo_reads_the_archive_its_platform_and_entrypoint() {
    let a = archive();
    for reference in [
        format!("oci-archive:{}", a.display()),
        format!("oci-archive:{}:{TAG}", a.display()),
    ] {
        let out = ok(tool("skopeo").args(["inspect", &reference]));
        let v: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["Architecture"], "amd64", "{v}");
        assert_eq!(v["Os"], "linux", "{v}");
        // The signed manifest, the payload, the installer (docs/design.md).
        assert_eq!(v["Layers"].as_array().unwrap().len(), 3, "{v}");
        assert_eq!(v["Created"], "2023-11-14T22:13:20Z", "{v}");
        let out = ok(tool("skopeo").args(["inspect", "--config", &reference]));
        let c: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(
            c["config"]["Entrypoint"],
            serde_json::json!(["/usr/bin/installer"])
        );
        assert_eq!(c["architecture"], "amd64");
        assert_eq!(c["os"], "linux");
    }
}

#[test]
fn umoci_unpacks_a_static_installer_that_runs_and_a_payload_that_verifies() {
    let bundle = scratch().join("installer-bundle");
    let _ = std::fs::remove_dir_all(&bundle);
    ok(tool("umoci")
        .args(["unpack", "--image"])
        .arg(format!("{}:{TAG}", layout().display()))
        .arg(&bundle));
    let rootfs = bundle.join("rootfs");
    let bin = rootfs.join("usr/bin/imager");
    imager::runtime::check_static(&bin, contract::Arch::Amd64).unwrap();
    let link = rootfs.join("usr/bin/installer");
    assert_eq!(std::fs::read_link(&link).unwrap(), Path::new("imager"));
    for exe in [&bin, &link] {
        let out = ok(std::process::Command::new(exe).arg("--version"));
        assert!(out.contains("0.1.0"), "{out}");
    }
    // The payload: the kernel, the initramfs and systemd-boot, signed by the
    // build's key, with what a boot entry needs.
    let payload = rootfs.join("usr/install/amd64");
    let out = ok(imager()
        .arg("verify")
        .arg(&payload)
        .arg("--key")
        .arg(dev_pub())
        .arg("--json"));
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["ok"], true, "{v}");
    let m: Value =
        serde_json::from_slice(&std::fs::read(payload.join("manifest.json")).unwrap()).unwrap();
    let listed: Vec<(&str, &str)> = m["artifacts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| (a["kind"].as_str().unwrap(), a["path"].as_str().unwrap()))
        .collect();
    assert_eq!(
        listed,
        [
            ("grub-boot", "grub-boot.img"),
            ("grub-core", "grub-core.img"),
            ("initramfs", "initramfs.zst"),
            ("boot-loader", "systemd-bootx64.efi"),
            ("kernel", "vmlinuz")
        ]
    );
    assert_eq!(m["boot"]["title"], "Imager 0.1.0");
    let cmdline = m["boot"]["cmdline"].as_str().unwrap();
    assert!(
        cmdline.starts_with("console=tty0 console=ttyS0,115200 slab_nomerge"),
        "{cmdline}"
    );
    // The payload is the build's kernel and initramfs.
    for name in ["vmlinuz", "initramfs.zst"] {
        assert_eq!(
            std::fs::read(payload.join(name)).unwrap(),
            std::fs::read(image().dir.join(name)).unwrap(),
            "{name}"
        );
    }
}

#[test]
fn extract_payload_gives_the_payload_bytes() {
    let dest = scratch().join("installer-extracted");
    let _ = std::fs::remove_dir_all(&dest);
    let dir = extract(&archive(), &dest);
    for name in ["vmlinuz", "initramfs.zst"] {
        assert_eq!(
            std::fs::read(dir.join(name)).unwrap(),
            std::fs::read(image().dir.join(name)).unwrap(),
            "{name}"
        );
    }
    ok(imager().arg("verify").arg(&dir).arg("--key").arg(dev_pub()));
    // What skopeo makes of it reads too: a copy (gzip layer, skopeo's
    // default) and a layout with a zstd layer.
    let copies = scratch().join("installer-copies");
    let _ = std::fs::remove_dir_all(&copies);
    std::fs::create_dir_all(&copies).unwrap();
    let gzip = copies.join("gzip.tar");
    let zstd = copies.join("zstd");
    ok(tool("skopeo")
        .args(["copy", "-q"])
        .arg(format!("oci-archive:{}", archive().display()))
        .arg(format!("oci-archive:{}:{TAG}", gzip.display())));
    ok(tool("skopeo")
        .args([
            "copy",
            "-q",
            "--dest-compress-format",
            "zstd",
            "--dest-compress",
        ])
        .arg(format!("oci-archive:{}", archive().display()))
        .arg(format!("oci:{}:{TAG}", zstd.display())));
    for (i, copy) in [gzip, zstd].iter().enumerate() {
        let d = copies.join(format!("payload-{i}"));
        let got = extract(copy, &d);
        same_files(
            &dir,
            &got,
            &[
                "vmlinuz",
                "initramfs.zst",
                "manifest.json",
                "manifest.json.sig",
            ],
            copy,
        );
    }
    // From the layout directory too, with the same bytes.
    let dest2 = scratch().join("installer-extracted-layout");
    let _ = std::fs::remove_dir_all(&dest2);
    let dir2 = extract(layout(), &dest2);
    for name in [
        "vmlinuz",
        "initramfs.zst",
        "manifest.json",
        "manifest.json.sig",
    ] {
        assert_eq!(
            std::fs::read(dir.join(name)).unwrap(),
            std::fs::read(dir2.join(name)).unwrap(),
            "{name}"
        );
    }
}

/// A small installer image made by the library, as the build lays it out
/// (no build needed): a payload of short fake files signed by a test key.
/// Returns the archive and the key.
fn small_image(dir: &Path) -> (PathBuf, imager::sign::VerifyingKey) {
    use imager::artifact::Kind;
    use imager::sign::{self, Manifest};
    let signer = TestKey::from_seed(5);
    let _ = std::fs::remove_dir_all(dir);
    let payload = dir.join("payload");
    std::fs::create_dir_all(&payload).unwrap();
    let listed = [
        ("vmlinuz", Kind::Kernel),
        ("initramfs.zst", Kind::Initramfs),
        ("systemd-bootx64.efi", Kind::BootLoader),
    ];
    let mut artifacts = Vec::new();
    for (name, kind) in listed {
        std::fs::write(payload.join(name), format!("not really {name}")).unwrap();
        artifacts.push(sign::describe(&payload, kind, name).unwrap());
    }
    let m = Manifest {
        boot: Some(sign::Boot {
            title: "Imager 0.1.0".into(),
            cmdline: "console=ttyS0".into(),
            secure_boot_enroll: None,
        }),
        ..Manifest::new("metal", "0.1.0", "p", 1_700_000_000, artifacts)
    };
    sign::write_signed_manifest(&payload, &m, &signer).unwrap();
    std::fs::write(dir.join("imager"), b"not really imager").unwrap();
    let names: Vec<&str> = listed.iter().map(|(n, _)| *n).collect();
    let spec = imager::build::installer_spec(
        &payload,
        &names,
        &[],
        &dir.join("imager"),
        TAG,
        1_700_000_000,
        contract::Arch::Amd64,
    );
    let tar = dir.join("installer.tar");
    imager::oci::write_image(&tar, &spec).unwrap();
    (tar, sign::Signer::public_key(&signer))
}

/// Extracts with a verifier that trusts `key` (the installer's check, with
/// `key` as the disk's trusted key).
fn extract_with(archive: &Path, dest: &Path, key: &imager::sign::VerifyingKey) -> PathBuf {
    let root = payload::trust::key_root(&[*key]).unwrap();
    let verify =
        |f: &payload::trust::TrustFiles| payload::trust::verify(&root, f).map(|t| t.manifest);
    imager::oci::extract_payload(archive, dest, contract::Arch::Amd64, &verify).unwrap()
}

#[test]
fn skopeo_and_umoci_read_the_three_layers_and_copies_extract_the_same_payload() {
    let dir = scratch().join("installer-small");
    let (tar, key) = small_image(&dir);
    let out = ok(tool("skopeo").args(["inspect", &format!("oci-archive:{}:{TAG}", tar.display())]));
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["Layers"].as_array().unwrap().len(), 3, "{v}");
    // umoci applies the three layers into one tree.
    let layout = dir.join("layout");
    std::fs::create_dir_all(&layout).unwrap();
    ok(tool("tar").arg("-xf").arg(&tar).arg("-C").arg(&layout));
    let bundle = dir.join("bundle");
    ok(tool("umoci")
        .args(["unpack", "--image"])
        .arg(format!("{}:{TAG}", layout.display()))
        .arg(&bundle));
    let rootfs = bundle.join("rootfs");
    for f in [
        "usr/bin/imager",
        "usr/install/amd64/manifest.json",
        "usr/install/amd64/manifest.json.sig",
        "usr/install/amd64/vmlinuz",
        "usr/install/amd64/initramfs.zst",
        "usr/install/amd64/systemd-bootx64.efi",
    ] {
        assert!(rootfs.join(f).is_file(), "{f}");
    }
    // What skopeo copies (gzip, zstd) extracts to the same payload.
    let want = extract_with(&tar, &dir.join("payload-0"), &key);
    let gzip = dir.join("gzip.tar");
    let zstd = dir.join("zstd");
    ok(tool("skopeo")
        .args(["copy", "-q"])
        .arg(format!("oci-archive:{}", tar.display()))
        .arg(format!("oci-archive:{}:{TAG}", gzip.display())));
    ok(tool("skopeo")
        .args([
            "copy",
            "-q",
            "--dest-compress-format",
            "zstd",
            "--dest-compress",
        ])
        .arg(format!("oci-archive:{}", tar.display()))
        .arg(format!("oci:{}:{TAG}", zstd.display())));
    for (i, copy) in [gzip, zstd].iter().enumerate() {
        let got = extract_with(copy, &dir.join(format!("payload-{}", i + 1)), &key);
        same_files(
            &want,
            &got,
            &[
                "vmlinuz",
                "initramfs.zst",
                "systemd-bootx64.efi",
                "manifest.json",
                "manifest.json.sig",
            ],
            copy,
        );
    }
}

#[test]
fn install_refuses_an_image_signed_by_another_key_before_unpacking_it() {
    let dir = scratch().join("installer-other-key");
    let (tar, key) = small_image(&dir);
    let other = ed25519_dalek::SigningKey::from_bytes(&[6; 32]).verifying_key();
    let other_pub = dir.join("other.pub");
    std::fs::write(&other_pub, imager::sign::public_key_pem(&other).unwrap()).unwrap();
    let disk = dir.join("disk.raw");
    let out = run(imager()
        .args(["install", "--installer"])
        .arg(&tar)
        .arg("--disk")
        .arg(&disk)
        .arg("--key")
        .arg(&other_pub));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("refusing the installer image before unpacking its payload")
            && err.contains(&format!(
                "it says it is signed by {}",
                imager::sign::key_id(&key)
            ))
            && err.contains("nothing was written"),
        "{err}"
    );
    assert!(!disk.exists());
}

/// `imager install` refuses a disk that holds data (a non-zero byte in its
/// first or last MiB) unless `--wipe`, and leaves it as it was; an all-zero
/// image file is installed onto without it, and `--wipe` overwrites.
#[test]
fn install_refuses_a_disk_holding_data_unless_wipe() {
    use imager::artifact::Kind;
    use imager::sign;
    use std::io::{Seek, SeekFrom, Write};
    let dir = scratch().join("installer-wipe");
    let _ = std::fs::remove_dir_all(&dir);
    // A payload directory: stand-in kernel and initramfs (nothing boots
    // them here), the host's systemd-boot, a manifest signed by a test key.
    let payload = dir.join("payload");
    std::fs::create_dir_all(&payload).unwrap();
    std::fs::write(payload.join("vmlinuz"), b"not really vmlinuz").unwrap();
    std::fs::write(payload.join("initramfs.zst"), b"not really an initramfs").unwrap();
    std::fs::copy(
        imager::boot::DEFAULT_SYSTEMD_BOOT,
        payload.join("systemd-bootx64.efi"),
    )
    .unwrap();
    let artifacts = [
        ("vmlinuz", Kind::Kernel),
        ("initramfs.zst", Kind::Initramfs),
        ("systemd-bootx64.efi", Kind::BootLoader),
    ]
    .iter()
    .map(|(name, kind)| sign::describe(&payload, *kind, name).unwrap())
    .collect();
    let m = sign::Manifest {
        boot: Some(sign::Boot {
            title: "Imager 0.1.0".into(),
            cmdline: "console=ttyS0".into(),
            secure_boot_enroll: None,
        }),
        ..sign::Manifest::new("metal", "0.1.0", "p", 1_700_000_000, artifacts)
    };
    let signer = TestKey::from_seed(7);
    sign::write_signed_manifest(&payload, &m, &signer).unwrap();
    let key_pub = dir.join("key.pub");
    std::fs::write(
        &key_pub,
        sign::public_key_pem(&sign::Signer::public_key(&signer)).unwrap(),
    )
    .unwrap();
    let disk = dir.join("disk.raw");
    let install = |wipe: bool| {
        let mut c = imager();
        c.args(["install", "--json", "--installer"])
            .arg(&payload)
            .arg("--disk")
            .arg(&disk)
            .arg("--key")
            .arg(&key_pub);
        if wipe {
            c.arg("--wipe");
        }
        run(&mut c)
    };
    // Data in the last MiB only (a backup GPT, say).
    let f = std::fs::File::create(&disk).unwrap();
    f.set_len(1 << 30).unwrap();
    let mut f = std::fs::OpenOptions::new().write(true).open(&disk).unwrap();
    f.seek(SeekFrom::Start((1 << 30) - 512)).unwrap();
    f.write_all(b"EFI PART").unwrap();
    drop(f);
    let before = std::fs::read(&disk).unwrap();
    let out = install(false);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("holds data: a backup GPT partition table at the end")
            && err.contains("--wipe")
            && err.contains("nothing was written"),
        "{err}"
    );
    assert!(
        std::fs::read(&disk).unwrap() == before,
        "the disk was written"
    );
    // --wipe: installed.
    let out = install(true);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["slot"], "A");
    // Now it holds the install: a second one is refused without --wipe.
    let out = install(false);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("holds data: "),
        "{err}"
    );
    // All zeros: no --wipe needed.
    std::fs::remove_file(&disk).unwrap();
    std::fs::File::create(&disk)
        .unwrap()
        .set_len(1 << 30)
        .unwrap();
    let out = install(false);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A signing key made from a repeated byte, for payloads signed in tests.
struct TestKey(ed25519_dalek::SigningKey);

impl TestKey {
    fn from_seed(byte: u8) -> TestKey {
        TestKey(ed25519_dalek::SigningKey::from_bytes(&[byte; 32]))
    }
}

impl imager::sign::Signer for TestKey {
    fn public_key(&self) -> imager::sign::VerifyingKey {
        self.0.verifying_key()
    }
    fn sign(&self, message: &[u8]) -> anyhow::Result<imager::sign::Signature> {
        Ok(ed25519_dalek::Signer::sign(&self.0, message))
    }
}

/// The built installer image pushed with skopeo as the README says, pulled
/// back with the node's registry client: the same manifest, config and
/// layers as the archive's own, every blob verified while streamed.
#[test]
fn the_installer_image_round_trips_through_a_registry() {
    let source = format!("oci-archive:{}", image().artifact("installer").display());
    let registry = reg::Registry::start();
    reg::skopeo_copy(&source, &registry.addr, "metal/installer:round-trip");
    // The archive's own manifest, as skopeo reads it.
    let raw = run(std::process::Command::new(reg::tool("skopeo"))
        .args(["inspect", "--raw"])
        .arg(&source))
    .stdout;
    let ::registry::manifest::Document::Image(own) =
        ::registry::manifest::parse(&raw, None, "installer.tar's manifest").unwrap()
    else {
        panic!("installer.tar's manifest is an index");
    };
    let client = ::registry::Client::new(::registry::Options {
        plain_http: vec![registry.addr.clone()],
        ..::registry::Options::default()
    })
    .unwrap();
    let r = ::registry::Reference::parse(&format!("{}/metal/installer:round-trip", registry.addr))
        .unwrap();
    let m = client.manifest(&r).unwrap();
    assert_eq!(m.digest, ::registry::Digest::of(&raw));
    assert_eq!(m.config, own.config);
    assert_eq!(m.layers, own.layers);
    assert!(m.layers.len() >= 2, "{:?}", m.layers);
    for d in std::iter::once(&m.config).chain(&m.layers) {
        let n = reg::read_blob(&client, &r, d).unwrap().len();
        assert_eq!(n as u64, d.size);
    }
}

/// `podman load -i installer.tar`, as a new user loads it, names the image
/// by its full reference (not `localhost/0.1.0:latest`), and the image it
/// stored is the archive's own.
#[test]
fn podman_loads_the_archive_under_its_full_name() {
    let store = scratch().join("installer-podman");
    let _ = std::fs::remove_dir_all(&store);
    let podman = |args: &[&str]| {
        let mut c = tool("podman");
        c.arg("--root")
            .arg(store.join("root"))
            .arg("--runroot")
            .arg(store.join("run"))
            .args(["--storage-driver", "vfs", "--events-backend", "file"])
            .args(args);
        c
    };
    let a = archive();
    let out = ok(podman(&["load", "-i"]).arg(&a));
    assert!(out.contains(&format!("Loaded image: {TAG}")), "{out}");
    let listed = ok(&mut podman(&[
        "images",
        "--format",
        "{{.Repository}}:{{.Tag}}",
    ]));
    assert_eq!(listed.trim(), TAG);
    let own = ok(tool("skopeo").args(["inspect", &format!("oci-archive:{}", a.display())]));
    let own: Value = serde_json::from_str(&own).unwrap();
    let stored = ok(&mut podman(&["image", "inspect", TAG]));
    let stored: Value = serde_json::from_str(&stored).unwrap();
    assert_eq!(stored[0]["Digest"], own["Digest"], "{stored}");
    assert_eq!(
        stored[0]["Config"]["Entrypoint"],
        serde_json::json!(["/usr/bin/installer"])
    );
    let _ = std::fs::remove_dir_all(&store);
}

/// The disk GUID and the partitions' unique GUIDs of `disk`, as sfdisk
/// reads them.
fn guids(disk: &Path) -> (String, Vec<String>) {
    let v: Value = serde_json::from_str(&ok(tool("sfdisk").arg("--json").arg(disk))).unwrap();
    let t = &v["partitiontable"];
    (
        t["id"].as_str().unwrap().to_lowercase(),
        t["partitions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["uuid"].as_str().unwrap().to_lowercase())
            .collect(),
    )
}

/// Two installs from one installer image get each their own disk GUID and
/// partition GUIDs (sfdisk), random ones (version 4), never the built
/// image's; `imager inspect` tells an installed disk (its own GUIDs) from
/// the built one (the image's own). The second install also carries the
/// node's settings given to it, which inspect shows.
#[test]
fn two_installs_from_one_installer_image_have_guids_of_their_own() {
    let dir = scratch().join("installer-guids");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut seen = Vec::new();
    for (name, extra) in [
        ("one.raw", &[][..]),
        ("two.raw", &["--hostname", "two", "--net", "eth0:dhcp"][..]),
    ] {
        let disk = dir.join(name);
        ok(imager()
            .args(["install", "--installer"])
            .arg(archive())
            .arg("--disk")
            .arg(&disk)
            .arg("--key")
            .arg(dev_pub())
            .args(extra));
        let (id, parts) = guids(&disk);
        assert_eq!(
            &id[14..15],
            "4",
            "{name}: disk GUID {id} is not random (version 4)"
        );
        let inspect: Value =
            serde_json::from_str(&ok(imager().args(["inspect", "--json"]).arg(&disk))).unwrap();
        assert_eq!(inspect["own_guids"], true, "{name}: {inspect}");
        assert_eq!(inspect["disk_guid"], id.as_str(), "{name}");
        if !extra.is_empty() {
            let keys = inspect["meta"]["keys"].to_string();
            assert!(
                keys.contains("hostname=two") && keys.contains("net=eth0:dhcp"),
                "{name}: {keys}"
            );
        }
        seen.push((id, parts));
    }
    let built = image().artifact("raw");
    let (built_id, built_parts) = guids(&built);
    let inspect: Value =
        serde_json::from_str(&ok(imager().args(["inspect", "--json"]).arg(&built))).unwrap();
    assert_eq!(inspect["own_guids"], false, "{inspect}");
    seen.push((built_id, built_parts));
    let mut all: Vec<&String> = seen
        .iter()
        .flat_map(|(d, p)| std::iter::once(d).chain(p))
        .collect();
    let n = all.len();
    all.sort();
    all.dedup();
    assert_eq!(all.len(), n, "a GUID is shared: {seen:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `imager push` to a registry behind TLS with token authentication, by
/// name, with the credentials from an auth file (as `podman login` writes
/// it): skopeo, an independent client with the same credentials, reads the
/// archive's own manifest and layers back; `--digest-file` holds the
/// digest; a second push, with the password on stdin, sends no blob again;
/// without credentials the push is refused with what to give, and the
/// password never shows.
#[test]
fn imager_push_keeps_every_digest_through_token_auth() {
    use base64::Engine as _;
    use reg::auth::{PASSWORD, Pki, TokenServer, USER};
    let source = format!("oci-archive:{}", archive().display());
    let own_raw = run(std::process::Command::new(reg::tool("skopeo"))
        .args(["inspect", "--raw"])
        .arg(&source))
    .stdout;
    let pki = Pki::new();
    let tokens = TokenServer::start(&pki);
    let registry = reg::Registry::start_token(&pki, &tokens);
    let target = format!("{}/team/installer:0.1.0", registry.by_name());
    let dir = scratch().join("installer-push");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let auth = dir.join("auth.json");
    let encoded = base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{PASSWORD}"));
    std::fs::write(
        &auth,
        format!(
            r#"{{"auths":{{"{}":{{"auth":"{encoded}"}}}}}}"#,
            registry.by_name()
        ),
    )
    .unwrap();
    let digest_file = dir.join("digest");
    // `imager push installer.tar TARGET --ca CA`, more arguments to add.
    let push = || {
        let mut c = imager();
        c.arg("push")
            .arg(archive())
            .arg(&target)
            .arg("--ca")
            .arg(pki.ca_file());
        c
    };
    let out = ok(push()
        .arg("--authfile")
        .arg(&auth)
        .arg("--digest-file")
        .arg(&digest_file)
        .arg("--json"));
    let report: Value = serde_json::from_str(&out).unwrap();
    let own_digest = ::registry::Digest::of(&own_raw).to_string();
    assert_eq!(report["digest"], own_digest.as_str(), "{report}");
    assert_eq!(
        std::fs::read_to_string(&digest_file).unwrap(),
        format!("{own_digest}\n")
    );
    assert!(
        report["blobs"]
            .as_array()
            .unwrap()
            .iter()
            .all(|b| b["uploaded"] == true),
        "{report}"
    );
    // skopeo reads the pushed manifest: the archive's bytes, and so its
    // config and layer digests.
    let pushed_raw = run(std::process::Command::new(reg::tool("skopeo"))
        .args(["inspect", "--raw", "--cert-dir"])
        .arg(pki.cert_dir())
        .args(["--creds", &format!("{USER}:{PASSWORD}")])
        .arg(format!("docker://{target}")))
    .stdout;
    assert_eq!(pushed_raw, own_raw, "the registry holds another manifest");
    let layers = |raw: &[u8]| -> Vec<String> {
        let v: Value = serde_json::from_slice(raw).unwrap();
        v["layers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["digest"].as_str().unwrap().to_string())
            .collect()
    };
    let info = ok(std::process::Command::new(reg::tool("skopeo"))
        .args(["inspect", "--cert-dir"])
        .arg(pki.cert_dir())
        .args(["--creds", &format!("{USER}:{PASSWORD}")])
        .arg(format!("docker://{target}")));
    let info: Value = serde_json::from_str(&info).unwrap();
    let listed: Vec<String> = info["Layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap().to_string())
        .collect();
    assert_eq!(listed, layers(&own_raw));

    // Again, the password on stdin: every blob is there already.
    let mut cmd = push();
    cmd.args(["--username", USER, "--password-stdin", "--json"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        writeln!(stdin, "{PASSWORD}").unwrap();
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        report["blobs"]
            .as_array()
            .unwrap()
            .iter()
            .all(|b| b["uploaded"] == false),
        "{report}"
    );

    // No credentials (an empty auth file): refused, saying what to give.
    let empty = dir.join("empty.json");
    std::fs::write(&empty, "{}").unwrap();
    let out = run(push().arg("--authfile").arg(&empty));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("requires credentials to push to team/installer")
            && stderr.contains("give credentials for"),
        "{stderr}"
    );
    let all = format!("{stderr}{}", String::from_utf8_lossy(&out.stdout));
    assert!(!all.contains(PASSWORD) && !all.contains(&encoded));
}
