//! Secure Boot with our own keys (`imager::secureboot`), checked by
//! independent tools and real firmware: `sbverify` and `objdump` read what
//! our Authenticode signer wrote; OVMF's Secure Boot build (SMM, TCG) with
//! our keys enrolled by `virt-fw-vars` boots our signed systemd-boot and
//! our signed UKI of the live system to ready and refuses an unsigned
//! systemd-boot and a UKI with one flipped byte; with a store in setup
//! mode, systemd-boot 252 enrols our `.auth` files itself, resets, and
//! the next boot runs with Secure Boot on.

#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use imager::qemu::BootOptions;
use imager::secureboot::{SecureBootKeys, authenticode, write_enrolment};
use std::path::{Path, PathBuf};
use std::time::Duration;

const SD_BOOT: &str = "/usr/lib/systemd/boot/efi/systemd-bootx64.efi";
const UKI_NAME: &str = "live.efi";
/// Generous: OVMF's SMM build under TCG is slow on a loaded machine, and
/// systemd-boot would count 15 s down before it enrols keys if it did not
/// see a hypervisor.
const BOOT_TIMEOUT: Duration = Duration::from_secs(600);

fn dir() -> PathBuf {
    let d = scratch().join("secureboot");
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A fresh key directory made by `imager keygen --secure-boot` (once per
/// test process).
fn keys() -> &'static SecureBootKeys {
    static K: Fixture<SecureBootKeys> = Fixture::new("secureboot-keys");
    K.get(|| {
        let k = dir().join("keys");
        let _ = std::fs::remove_dir_all(&k);
        let out = ok(imager().args(["keygen", "--secure-boot"]).arg(&k));
        assert!(out.contains("owner GUID"), "{out}");
        SecureBootKeys::load(&k).unwrap()
    })
}

/// systemd-boot signed with our db key.
fn signed_sd_boot() -> &'static Path {
    static P: Fixture<PathBuf> = Fixture::new("secureboot-profile");
    P.get(|| {
        let out = dir().join("systemd-bootx64.signed.efi");
        imager::secureboot::sign(Path::new(SD_BOOT), &keys().db, &out).unwrap();
        out
    })
}

/// The live system's UKI (`imager::uki` from the default ISO build's
/// kernel, live initramfs and command line): `(unsigned, signed)`.
fn ukis() -> &'static (PathBuf, PathBuf) {
    static U: Fixture<(PathBuf, PathBuf)> = Fixture::new("secureboot-ukis");
    U.get(|| {
        let build = build_profile("sb-iso", &repo().join("profiles/iso.yaml"), &[]);
        let iso = build.artifact("iso");
        let d = dir().join("uki");
        let (unsigned, ..) = live_uki(&iso, &d);
        let signed = d.join("live.signed.efi");
        imager::secureboot::sign(&unsigned, &keys().db, &signed).unwrap();
        (unsigned, signed)
    })
}

/// A copy of `file` with the byte at `at` flipped.
fn flipped(file: &Path, at: usize, name: &str) -> PathBuf {
    let mut b = std::fs::read(file).unwrap();
    b[at] ^= 0x01;
    let out = dir().join(name);
    std::fs::write(&out, b).unwrap();
    out
}

fn sbverify(file: &Path) -> std::process::Output {
    run(tool("sbverify")
        .arg("--cert")
        .arg(keys().dir.join("db.crt"))
        .arg(file))
}

/// What an ESP holds for these tests.
struct Esp<'a> {
    loader: &'a Path,
    uki: Option<&'a Path>,
    loader_conf: &'a str,
    /// Write our `.auth` files into `loader/keys/auto/`.
    auth: bool,
}

/// A FAT disk (the ESP as a superfloppy, which OVMF boots) with `esp`.
fn esp_disk(name: &str, esp: &Esp) -> PathBuf {
    let d = dir().join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    let disk = d.join("esp.img");
    ok(tool("mkfs.vfat")
        .args(["-C", "-n", "ESP"])
        .arg(&disk)
        .arg("98304"));
    let mut dirs = vec!["::EFI", "::EFI/BOOT", "::EFI/Linux", "::loader"];
    if esp.auth {
        dirs.extend(["::loader/keys", "::loader/keys/auto"]);
        write_enrolment(keys(), EPOCH.parse().unwrap(), &d).unwrap();
    }
    ok(tool("mmd").arg("-i").arg(&disk).args(&dirs));
    let put = |from: &Path, to: &str| {
        ok(tool("mcopy")
            .arg("-i")
            .arg(&disk)
            .arg(from)
            .arg(format!("::{to}")));
    };
    put(esp.loader, "EFI/BOOT/BOOTX64.EFI");
    if let Some(uki) = esp.uki {
        put(uki, &format!("EFI/Linux/{UKI_NAME}"));
    }
    let conf = d.join("loader.conf");
    std::fs::write(&conf, esp.loader_conf).unwrap();
    put(&conf, "loader/loader.conf");
    if esp.auth {
        for f in ["PK.auth", "KEK.auth", "db.auth"] {
            put(&d.join(f), &format!("loader/keys/auto/{f}"));
        }
    }
    disk
}

/// A copy of OVMF's empty variable store (setup mode), or, with `enrol`,
/// one with our PK, KEK and db enrolled by `virt-fw-vars` and Secure Boot
/// on.
fn vars(name: &str, enrol: bool) -> PathBuf {
    let out = dir().join(format!("{name}.vars.fd"));
    let _ = std::fs::remove_file(&out);
    if !enrol {
        std::fs::copy(imager::qemu::OVMF_VARS, &out).unwrap();
        return out;
    }
    enrolled_vars(&keys().dir, &out, true)
}

fn sb_opts(disk: &Path, vars: &Path) -> BootOptions {
    let mut o = BootOptions::new(disk);
    o.timeout = BOOT_TIMEOUT;
    o.echo = false;
    o.secure_boot_vars = Some(vars.to_path_buf());
    o
}

#[test]
fn sbverify_and_verify_accept_our_systemd_boot_and_refuse_a_flipped_byte() {
    let signed = signed_sd_boot();
    let out = sbverify(signed);
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("Signature verification OK"));
    let list = ok(tool("sbverify").arg("--list").arg(signed));
    assert_eq!(
        list.lines().filter(|l| l.starts_with("signature ")).count(),
        1,
        "{list}"
    );
    authenticode::verify_file(signed, &keys().db.cert).unwrap();

    // One flipped byte in the code: both refuse.
    let bad = flipped(signed, 0x2000, "sd-boot.flipped.efi");
    assert!(!sbverify(&bad).status.success());
    let e = format!(
        "{:#}",
        authenticode::verify_file(&bad, &keys().db.cert).unwrap_err()
    );
    assert!(e.contains("changed after signing"), "{e}");
    // The wrong certificate: both refuse.
    let out = run(tool("sbverify")
        .arg("--cert")
        .arg(keys().dir.join("KEK.crt"))
        .arg(signed));
    assert!(!out.status.success(), "{out:?}");
    assert!(authenticode::verify_file(signed, &keys().kek.cert).is_err());
    // The unsigned original: both refuse.
    assert!(!sbverify(Path::new(SD_BOOT)).status.success());
    assert!(authenticode::verify_file(Path::new(SD_BOOT), &keys().db.cert).is_err());
}

/// sbsign computes the Authenticode digest and the PKCS#7 on its own: our
/// verify accepts what it signs with our db key (so our digest is
/// sbsign's), and refuses it with another certificate.
#[test]
fn verify_accepts_what_sbsign_signs_with_our_db_key() {
    let k = keys();
    let out = dir().join("systemd-bootx64.sbsign.efi");
    ok(tool("sbsign")
        .arg("--key")
        .arg(k.dir.join("db.key"))
        .arg("--cert")
        .arg(k.dir.join("db.crt"))
        .arg("--output")
        .arg(&out)
        .arg(SD_BOOT));
    let v = authenticode::verify_file(&out, &k.db.cert).unwrap();
    let ours = authenticode::verify_file(signed_sd_boot(), &k.db.cert).unwrap();
    assert_eq!(v.digest, ours.digest);
    assert!(authenticode::verify_file(&out, &k.kek.cert).is_err());
}

#[test]
fn the_signed_uki_passes_sbverify_and_objdump_and_a_flipped_byte_fails_both_checkers() {
    let (unsigned, signed) = ukis();
    let out = sbverify(signed);
    assert!(out.status.success(), "{out:?}");
    let list = ok(tool("sbverify").arg("--list").arg(signed));
    assert_eq!(
        list.lines().filter(|l| l.starts_with("signature ")).count(),
        1,
        "{list}"
    );
    authenticode::verify_file(signed, &keys().db.cert).unwrap();
    let sections = ok(tool("objdump").arg("-h").arg(signed));
    for s in [".osrel", ".cmdline", ".linux", ".initrd"] {
        assert!(sections.contains(s), "{s}: {sections}");
    }
    // Signing twice gives the same bytes.
    let again = dir().join("live.again.efi");
    imager::secureboot::sign(unsigned, &keys().db, &again).unwrap();
    assert_eq!(
        std::fs::read(&again).unwrap(),
        std::fs::read(signed).unwrap()
    );
    // A flipped byte in the kernel section.
    let bad = flipped(signed, 0x10_0000, "live.flipped.efi");
    assert!(!sbverify(&bad).status.success());
    assert!(authenticode::verify_file(&bad, &keys().db.cert).is_err());
}

#[test]
fn ovmf_with_our_keys_boots_our_signed_systemd_boot_and_uki_to_ready() {
    let (_, signed) = ukis();
    let disk = esp_disk(
        "boot-signed",
        &Esp {
            loader: signed_sd_boot(),
            uki: Some(signed),
            loader_conf: "timeout 0\n",
            auth: false,
        },
    );
    let vars = vars("boot-signed", true);
    let mut opts = sb_opts(&disk, &vars);
    let log = dir().join("boot-signed.console");
    opts.console_log = Some(log.clone());
    let r = imager::qemu::boot(&opts)
        .unwrap_or_else(|e| panic!("the signed UKI under Secure Boot: {e:#}"));
    assert!(r.ready && r.live, "{r:?}");
    // Secure Boot was on for this boot, as three readers see it: the
    // variable store, read by virt-fw-vars after the boot (a PK enrolled:
    // user mode; OVMF's SecureBootEnable set); the kernel, which logs the
    // firmware's SecureBoot variable as its EFI stub found it; and the
    // runtime's ready line. (The refusal tests show that such a store
    // enforces.)
    let print = ok(tool("virt-fw-vars")
        .arg("--input")
        .arg(&vars)
        .arg("--print"));
    assert_eq!(
        store_value(&print, "SecureBootEnable"),
        Some("bool: ON"),
        "{print}"
    );
    assert!(
        store_value(&print, "PK").is_some_and(|v| v.starts_with("blob: ")),
        "no PK: {print}"
    );
    let console = std::fs::read_to_string(&log).unwrap();
    assert!(
        console.contains("secureboot: Secure boot enabled"),
        "{console}"
    );
    assert_eq!(r.secure_boot.as_deref(), Some("on"), "{r:?}");
}

/// The value `virt-fw-vars --print` shows for the variable `name`
/// (`NAME   : bool: ON`).
fn store_value<'a>(print: &'a str, name: &str) -> Option<&'a str> {
    print.lines().find_map(|l| {
        let (n, v) = l.split_once(" : ")?;
        (n.trim() == name).then(|| v.trim())
    })
}

#[test]
fn ovmf_with_our_keys_refuses_an_unsigned_systemd_boot() {
    let disk = esp_disk(
        "unsigned-loader",
        &Esp {
            loader: Path::new(SD_BOOT),
            uki: None,
            loader_conf: "timeout 0\n",
            auth: false,
        },
    );
    let vars = vars("unsigned-loader", true);
    let line = imager::qemu::boot_until(&sb_opts(&disk, &vars), &["Access Denied"])
        .unwrap_or_else(|e| panic!("{e:#}"));
    assert!(line.contains("failed to load Boot"), "{line}");
}

#[test]
fn systemd_boot_refuses_a_uki_with_one_flipped_byte() {
    let (_, signed) = ukis();
    let bad = flipped(signed, 0x10_0000, "live.flipped-boot.efi");
    let disk = esp_disk(
        "flipped-uki",
        &Esp {
            loader: signed_sd_boot(),
            uki: Some(&bad),
            loader_conf: "timeout 0\n",
            auth: false,
        },
    );
    let vars = vars("flipped-uki", true);
    let line = imager::qemu::boot_until(&sb_opts(&disk, &vars), &["Access Denied"])
        .unwrap_or_else(|e| panic!("{e:#}"));
    assert!(line.contains(UKI_NAME), "{line}");
}

#[test]
fn systemd_boot_enrols_our_keys_resets_and_boots_the_signed_uki_with_secure_boot_on() {
    let (unsigned, signed) = ukis();
    let disk = esp_disk(
        "enrol",
        &Esp {
            loader: signed_sd_boot(),
            uki: Some(signed),
            loader_conf: "timeout 0\nsecure-boot-enroll force\n",
            auth: true,
        },
    );
    let vars = vars("enrol", false);
    let mut opts = sb_opts(&disk, &vars);
    // systemd-boot resets the machine after enrolling.
    opts.reboots = true;
    let log = dir().join("enrol.console");
    opts.console_log = Some(log.clone());
    let r = imager::qemu::boot(&opts).unwrap_or_else(|e| panic!("{e:#}"));
    assert!(r.ready && r.live, "{r:?}");
    let console = std::fs::read_to_string(&log).unwrap();
    assert!(
        console.contains("Enrolling secure boot keys from directory: \\loader\\keys\\auto"),
        "{console}"
    );
    // The next boot ran with Secure Boot on: the kernel logs the firmware's
    // SecureBoot variable as its EFI stub found it, the runtime reports it.
    assert!(
        console.contains("secureboot: Secure boot enabled"),
        "{console}"
    );
    assert_eq!(r.secure_boot.as_deref(), Some("on"), "{r:?}");
    // systemd-boot reset the machine after enrolling: the firmware started
    // it twice.
    assert_eq!(
        console.matches("BdsDxe: starting Boot").count(),
        2,
        "{console}"
    );
    // The store now holds our PK, KEK and db certificates, written with the
    // time stamp of our .auth files (SOURCE_DATE_EPOCH).
    let print = ok(tool("virt-fw-vars")
        .arg("--input")
        .arg(&vars)
        .args(["--print", "--verbose"]));
    for (var, key) in [("PK", &keys().pk), ("KEK", &keys().kek), ("db", &keys().db)] {
        let at = print
            .find(&format!("name={var} "))
            .unwrap_or_else(|| panic!("no {var}: {print}"));
        let end = print[at..].find("\n\n").map_or(print.len(), |e| at + e);
        let entry = &print[at..end];
        assert!(entry.contains("time=2023-11-14 22:13:20"), "{entry}");
        assert!(
            entry.contains(&format!("subject {}", key.subject())),
            "{entry}"
        );
    }
    // And it enforces: the unsigned UKI is refused with this store.
    let disk = esp_disk(
        "enrol-unsigned",
        &Esp {
            loader: signed_sd_boot(),
            uki: Some(unsigned),
            loader_conf: "timeout 0\n",
            auth: false,
        },
    );
    let line = imager::qemu::boot_until(&sb_opts(&disk, &vars), &["Access Denied"])
        .unwrap_or_else(|e| panic!("{e:#}"));
    assert!(line.contains(UKI_NAME), "{line}");
}

#[test]
fn keygen_cli_refuses_to_overwrite_secure_boot_keys() {
    let k = keys();
    let before = std::fs::read(k.dir.join("db.key")).unwrap();
    let out = run(imager().args(["keygen", "--secure-boot"]).arg(&k.dir));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("already exists"), "{err}");
    assert_eq!(std::fs::read(k.dir.join("db.key")).unwrap(), before);
    // The certificates are what openssl reads as self-signed RSA-2048.
    for n in ["PK", "KEK", "db"] {
        let text = ok(tool("openssl")
            .args(["x509", "-noout", "-text", "-in"])
            .arg(k.dir.join(format!("{n}.crt"))));
        assert!(text.contains("Public-Key: (2048 bit)"), "{text}");
        assert!(text.contains("sha256WithRSAEncryption"), "{text}");
        ok(tool("openssl")
            .args(["verify", "-CAfile"])
            .arg(k.dir.join(format!("{n}.crt")))
            .arg(k.dir.join(format!("{n}.crt"))));
    }
}

/// DER length octets.
fn der_len(n: usize) -> Vec<u8> {
    match n {
        0..0x80 => vec![n as u8],
        0x80..0x100 => vec![0x81, n as u8],
        _ => vec![0x82, (n >> 8) as u8, n as u8],
    }
}

/// openssl checks each .auth file's PKCS#7 over the bytes the UEFI
/// specification says are signed: db.auth verifies with the KEK
/// certificate as the only trust anchor and not with the PK's; KEK.auth and
/// PK.auth with the PK's. (In setup mode firmware does not check db.auth
/// and KEK.auth, so the enrolment test alone would not catch a wrong
/// signer.)
#[test]
fn openssl_verifies_each_auth_file_against_its_signer_only() {
    use imager::secureboot::auth::*;
    let k = keys();
    let epoch: u64 = EPOCH.parse().unwrap();
    let d = dir().join("auth-openssl");
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    // And a rotation's appends, signed by the KEK over attributes with
    // EFI_VARIABLE_APPEND_WRITE.
    let changes = Changes {
        add_db: vec![k.kek.cert_der.clone()],
        revoke: vec![[7; 32]],
        revoke_certs: vec![k.db.cert_der.clone()],
    };
    let mut files = enrolment_files(k, epoch).unwrap();
    files.extend(update_files(k, epoch, &changes).unwrap());
    assert_eq!(files.len(), 5);
    for (file, bytes) in files {
        let (var, vendor, signer, other) = match file {
            "db.auth" | "db.append.auth" => ("db", EFI_IMAGE_SECURITY_DATABASE, "KEK", "PK"),
            "dbx.append.auth" => ("dbx", EFI_IMAGE_SECURITY_DATABASE, "KEK", "db"),
            "KEK.auth" => ("KEK", EFI_GLOBAL_VARIABLE, "PK", "KEK"),
            _ => ("PK", EFI_GLOBAL_VARIABLE, "PK", "db"),
        };
        let attributes = if file.contains(".append.") {
            ATTRIBUTES | payload::efivar::APPEND_WRITE
        } else {
            ATTRIBUTES
        };
        let time: [u8; 16] = bytes[..16].try_into().unwrap();
        let len = u32::from_le_bytes(bytes[16..20].try_into().unwrap()) as usize;
        let sd = &bytes[40..16 + len];
        let data = &bytes[16 + len..];
        // openssl reads a ContentInfo: wrap the bare SignedData.
        let oid = [
            0x06, 0x09, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x07, 0x02,
        ];
        let mut explicit = vec![0xa0];
        explicit.extend(der_len(sd.len()));
        explicit.extend_from_slice(sd);
        let mut ci = vec![0x30];
        ci.extend(der_len(oid.len() + explicit.len()));
        ci.extend_from_slice(&oid);
        ci.extend(explicit);
        let p7 = d.join(format!("{file}.p7"));
        std::fs::write(&p7, ci).unwrap();
        let payload = d.join(format!("{file}.payload"));
        std::fs::write(
            &payload,
            signed_payload(var, &vendor, attributes, &time, data),
        )
        .unwrap();
        let check = |anchor: &str| {
            run(tool("openssl")
                .args([
                    "cms", "-verify", "-binary", "-inform", "DER", "-purpose", "any",
                ])
                .arg("-in")
                .arg(&p7)
                .arg("-content")
                .arg(&payload)
                .arg("-CAfile")
                .arg(k.dir.join(format!("{anchor}.crt")))
                .args(["-out", "/dev/null"]))
        };
        let good = check(signer);
        assert!(good.status.success(), "{file} with {signer}: {good:?}");
        let bad = check(other);
        assert!(!bad.status.success(), "{file} with {other}: {bad:?}");
        // A changed payload does not verify.
        let mut changed = std::fs::read(&payload).unwrap();
        let last = changed.len() - 1;
        changed[last] ^= 1;
        std::fs::write(&payload, changed).unwrap();
        assert!(!check(signer).status.success(), "{file}: a changed payload");
    }
}

#[test]
fn the_cli_signs_verifies_and_writes_the_enrolment_files() {
    let k = keys();
    let d = dir().join("cli");
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    let out = d.join("BOOTX64.EFI");
    let said = ok(imager()
        .args(["secureboot", "sign", "--keys"])
        .arg(&k.dir)
        .arg(SD_BOOT)
        .arg("-o")
        .arg(&out));
    assert!(said.contains("Authenticode sha256"), "{said}");
    // The same bytes as the library's signature.
    assert_eq!(
        std::fs::read(&out).unwrap(),
        std::fs::read(signed_sd_boot()).unwrap()
    );
    let said = ok(imager()
        .args(["secureboot", "verify", "--cert"])
        .arg(k.dir.join("db.crt"))
        .arg(&out));
    assert!(said.contains(": OK, signed by"), "{said}");
    let r = run(imager()
        .args(["secureboot", "verify", "--cert"])
        .arg(k.dir.join("db.crt"))
        .arg(&out)
        .arg(SD_BOOT));
    assert_eq!(r.status.code(), Some(1));
    let said = String::from_utf8_lossy(&r.stdout);
    assert!(
        said.contains("FAILED") && said.contains("not signed"),
        "{said}"
    );
    let auth = d.join("auth");
    ok(imager()
        .args(["secureboot", "enrol-files", "--keys"])
        .arg(&k.dir)
        .arg("--out")
        .arg(&auth));
    for (name, bytes) in imager::secureboot::enrolment_files(k, EPOCH.parse().unwrap()).unwrap() {
        assert_eq!(std::fs::read(auth.join(name)).unwrap(), bytes, "{name}");
    }
}
