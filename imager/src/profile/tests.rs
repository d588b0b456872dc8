//! Tests of profile parsing, bounds and validation.
use super::*;

const GOOD: &str = "\
name: metal
version: 1.0.0
kernel:
  source: /usr/src/linux.tar.xz
  fragments: [frag.config]
  rules: rules.yaml
  cmdline: [console=ttyS0, slab_nomerge]
runtime:
  cargo_package: ../rootfs
  skeleton: ../rootfs/skeleton
  manifest: ../rootfs/skeleton.txt
disk:
  size: 2GiB
  partitions:
    BOOT: 200MiB
";

fn parse(text: &str) -> Result<Profile> {
    Profile::parse(text, Path::new("/p/profiles/test.yaml"))
}

#[test]
fn parses_and_resolves_relative_paths() {
    let p = parse(GOOD).unwrap();
    assert_eq!(p.disk.size, Size(2 << 30));
    assert_eq!(p.partition_sizes()["BOOT"], 200 << 20);
    assert_eq!(p.kernel.rules, Path::new("/p/profiles/rules.yaml"));
    assert_eq!(
        p.runtime.cargo_package.as_deref(),
        Some(Path::new("/p/profiles/../rootfs"))
    );
    assert_eq!(p.cmdline(), "console=ttyS0 slab_nomerge");
    assert_eq!(p.outputs, vec![Output::Raw]);
}

#[test]
fn the_architecture_defaults_to_amd64_and_an_unknown_one_names_its_line() {
    assert_eq!(parse(GOOD).unwrap().arch, contract::Arch::Amd64);
    let arm = GOOD.replace("version: 1.0.0\n", "version: 1.0.0\narch: arm64\n");
    assert_eq!(parse(&arm).unwrap().arch, contract::Arch::Arm64);
    let bad = GOOD.replace(
        "version: 1.0.0\n",
        "version: 1.0.0\narch: \"s390x\\e[2J\"\n",
    );
    let e = format!("{:#}", parse(&bad).unwrap_err());
    assert!(
        e.contains("line 3") && e.contains("give amd64 or arm64") && !e.contains('\u{1b}'),
        "{e}"
    );
}

#[test]
fn unknown_key_names_file_line_and_key() {
    let bad = GOOD.replace("  rules: rules.yaml", "  rules: rules.yaml\n  sorce: x");
    let e = parse(&bad).unwrap_err().to_string();
    assert!(e.contains("/p/profiles/test.yaml"), "{e}");
    assert!(e.contains("line 7"), "{e}");
    assert!(e.contains("sorce"), "{e}");
}

#[test]
fn wrong_type_names_file_line_and_key() {
    let bad = GOOD.replace("  size: 2GiB", "  size: [1, 2]");
    let e = parse(&bad).unwrap_err().to_string();
    assert!(e.contains("test.yaml") && e.contains("line 13"), "{e}");
    assert!(e.contains("disk.size"), "{e}");
    let bad = GOOD.replace("  size: 2GiB", "  size: 2GB");
    let e = parse(&bad).unwrap_err().to_string();
    assert!(e.contains("KiB, MiB, GiB"), "{e}");
    let bad = GOOD.replace("version: 1.0.0", "version: [1]");
    let e = parse(&bad).unwrap_err().to_string();
    assert!(e.contains("line 2") && e.contains("version"), "{e}");
}

#[test]
fn semantic_errors() {
    let e = parse(&GOOD.replace("name: metal", "name: my image"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("letters, digits"), "{e}");
    let e = parse(&GOOD.replace("  cargo_package: ../rootfs\n", ""))
        .unwrap_err()
        .to_string();
    assert!(e.contains("exactly one of cargo_package or binary"), "{e}");
    let e = parse(&GOOD.replace("[console=ttyS0, slab_nomerge]", "[\"a b\"]"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("one argument per item"), "{e}");
}

#[test]
fn unknown_partition_names_file_line_and_key() {
    let bad = GOOD.replace("    BOOT: 200MiB", "    ESP: 200MiB");
    let e = parse(&bad).unwrap_err().to_string();
    assert!(
        e.contains("test.yaml") && e.contains("ESP") && e.contains("line"),
        "{e}"
    );
}

#[test]
fn installer_output_needs_its_binary() {
    let with = |extra: &str| parse(&format!("{GOOD}{extra}"));
    let p = with("outputs: [raw, installer]\ninstaller:\n  cargo_package: ../imager\n").unwrap();
    assert_eq!(p.outputs, vec![Output::Raw, Output::Installer]);
    let i = p.installer.unwrap();
    assert_eq!(
        i.cargo_package.as_deref(),
        Some(Path::new("/p/profiles/../imager"))
    );
    let e = with("outputs: [installer]\n").unwrap_err().to_string();
    assert!(e.contains("installer: { cargo_package: ../imager }"), "{e}");
    let e = with("outputs: [installer]\ninstaller: { cargo_package: a, binary: b }\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("exactly one of cargo_package or binary"), "{e}");
    let e = with("outputs: [installer]\ninstaller: { cargo: a }\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("line 17") && e.contains("cargo"), "{e}");
    let e = with("outputs: [iso]\n").unwrap_err().to_string();
    assert!(e.contains("iso needs an installer section"), "{e}");
    let e = with("outputs: [isoo]\n").unwrap_err().to_string();
    assert!(e.contains("line 16") && e.contains("isoo"), "{e}");
    // The live section: only with the ISO, a target that is one argument.
    let iso = "outputs: [iso]\ninstaller: { binary: /bin/imager }\n";
    with(&format!(
        "{iso}live: {{ install: serial:T1, wipe: true }}\n"
    ))
    .unwrap();
    let e = with("live: { install: vdb }\n").unwrap_err().to_string();
    assert!(e.contains("add iso to outputs"), "{e}");
    let e = with(&format!("{iso}live: {{ wipe: true }}\n"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("live.wipe") && e.contains("name the disk"),
        "{e}"
    );
    for bad in [
        "'a b'",
        "'x\"y'",
        "''",
        "'$x'",
        "foo/bar",
        "'serial:'",
        "../vdb",
    ] {
        let e = with(&format!("{iso}live: {{ install: {bad} }}\n"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("live.install") && e.contains("serial:SERIAL"),
            "{bad}: {e}"
        );
    }
    // Keys the boot path sets are not the profile's.
    for key in [
        "machined.install.wipe=1",
        "machined.live=AB",
        "machined.slot=B",
        "machined.verity=00",
    ] {
        let e = refused(&with_line(
            "  cmdline:",
            &format!("  cmdline: [console=ttyS0, {key}]"),
        ));
        assert!(
            e.contains("kernel.cmdline[1]") && e.contains("remove it"),
            "{key}: {e}"
        );
    }
    let e = with("outputs: [raw, raw]\n").unwrap_err().to_string();
    assert!(e.contains("raw is listed twice"), "{e}");
    let e = with("outputs: []\n").unwrap_err().to_string();
    assert!(
        e.contains("at least one output (raw, vhd, qcow2, raw.zst, raw.xz, installer"),
        "{e}"
    );
    // The version becomes the image's tag.
    let bad = GOOD.replace("version: 1.0.0", "version: 1.0.0+build");
    let e = parse(&format!(
        "{bad}outputs: [installer]\ninstaller: {{ binary: /bin/imager }}\n"
    ))
    .unwrap_err()
    .to_string();
    assert!(e.contains("version") && e.contains("tag"), "{e}");
}

/// The installer image's full reference name: the default, a name whose tag
/// is the version, a name with its own tag (then the version need not be a
/// tag); names podman would not read as given are refused, saying so.
#[test]
fn the_installer_image_has_a_full_reference_name() {
    let with = |version: &str, image: &str| {
        let base = GOOD.replace("version: 1.0.0", &format!("version: {version}"));
        parse(&format!(
            "{base}outputs: [installer]\ninstaller: {{ binary: /bin/imager{image} }}\n"
        ))
    };
    let name = |v: &str, i: &str| with(v, i).unwrap().installer_image();
    assert_eq!(name("1.0.0", ""), "localhost/metal/installer:1.0.0");
    // The default from any valid profile name is a valid reference.
    for (n, repo) in [
        ("My__OS-", "my-os"),
        ("_", "os"),
        ("a-_-b", "a-b"),
        ("X1", "x1"),
    ] {
        let p = parse(&format!(
            "{}outputs: [installer]\ninstaller: {{ binary: /bin/imager }}\n",
            GOOD.replace("name: metal", &format!("name: {n}"))
        ))
        .unwrap();
        assert_eq!(
            p.installer_image(),
            format!("localhost/{repo}/installer:1.0.0")
        );
    }
    assert_eq!(
        name("1.0.0", ", image: registry.example.com:5000/os/installer"),
        "registry.example.com:5000/os/installer:1.0.0"
    );
    assert_eq!(
        name("1.0.0+build", ", image: ghcr.io/os/installer:v1"),
        "ghcr.io/os/installer:v1"
    );
    for (bad, says) in [
        ("os/installer", "names no registry"),
        ("installer", "names no registry"),
        ("localhost/OS/installer", "lower-case"),
        ("ghcr.io/os/installer@sha256:00", "digest"),
        ("ghcr.io/os/installer:", "tag"),
        ("ghcr.io/os//installer", "not an image reference name"),
    ] {
        let e = with("1.0.0", &format!(", image: \"{bad}\""))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("installer.image") && e.contains(says),
            "{bad}: {e}"
        );
    }
}

/// The output vhd: 512-byte sectors and a whole number of MiB, refused
/// before any work otherwise.
#[test]
fn the_vhd_output_needs_512_byte_sectors_and_whole_mib() {
    let p = parse(&format!("{GOOD}outputs: [vhd]\n")).unwrap();
    assert!(p.makes_disk());
    let e = parse(&format!("{GOOD}outputs: [vhd]\n").replace("size: 2GiB", "size: 2147483136"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("disk.size") && e.contains("whole number of MiB"),
        "{e}"
    );
    let e = parse(&format!("{GOOD}  sector_size: 4096\noutputs: [raw, vhd]\n"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("disk.sector_size") && e.contains("vhd"), "{e}");
}

/// The disk formats made from the raw disk: named as in the profile, each
/// a disk output (the build lays out a disk for it alone), listed in the
/// error for an unknown name.
#[test]
fn the_disk_formats_are_outputs() {
    let p = parse(&format!("{GOOD}outputs: [qcow2, raw.zst, raw.xz]\n")).unwrap();
    assert_eq!(
        p.outputs,
        vec![Output::Qcow2, Output::RawZst, Output::RawXz]
    );
    assert!(p.makes_disk());
    for o in [Output::Qcow2, Output::RawZst, Output::RawXz] {
        let p = parse(&format!("{GOOD}outputs: [{}]\n", o.name())).unwrap();
        assert_eq!(p.outputs, vec![o]);
        assert!(p.makes_disk() && o.is_disk());
    }
    assert!(!Output::Iso.is_disk());
    let e = parse(&format!("{GOOD}outputs: [raw.gz]\n"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("raw.gz")
            && e.contains("raw.zst")
            && e.contains("raw.xz")
            && e.contains("qcow2"),
        "{e}"
    );
    let e = parse(&format!("{GOOD}outputs: [qcow2, raw.xz, qcow2]\n"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("qcow2 is listed twice"), "{e}");
}

/// `profiles/installer.yaml` builds the system of `profiles/metal.yaml`:
/// it may differ only in its outputs and installer section; the ISO and
/// Secure Boot profiles likewise. The same holds for arm64's
/// (`metal-arm64.yaml`, `installer-arm64.yaml`, …).
#[test]
fn installer_profile_is_metal_plus_the_installer() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../profiles");
    for suffix in ["", "-arm64"] {
        let load = |name: &str| Profile::load(&dir.join(format!("{name}{suffix}.yaml"))).unwrap();
        let metal = load("metal");
        // `p`, its outputs and path aside, is metal.
        let same_as_metal = |mut p: Profile, what: &str| {
            p.outputs = metal.outputs.clone();
            p.path = metal.path.clone();
            assert_eq!(format!("{p:?}"), format!("{metal:?}"), "{what}{suffix}");
        };
        let mut inst = load("installer");
        assert_eq!(inst.outputs, vec![Output::Raw, Output::Installer]);
        let pkg = inst.installer.take().unwrap().cargo_package.unwrap();
        assert_eq!(
            std::fs::canonicalize(pkg).unwrap(),
            std::fs::canonicalize(Path::new(env!("CARGO_MANIFEST_DIR"))).unwrap()
        );
        same_as_metal(inst, "installer");
        // And profiles/iso.yaml: metal plus the installer and the ISO.
        let mut iso = load("iso");
        assert_eq!(iso.outputs, vec![Output::Raw, Output::Iso]);
        assert!(iso.installer.take().unwrap().cargo_package.is_some());
        assert!(
            iso.live.install.is_none(),
            "the default ISO installs nothing by itself"
        );
        same_as_metal(iso, "iso");
        // And profiles/secureboot.yaml: metal plus the installer, Secure
        // Boot with the development keys, and the UKIs.
        let mut sb = load("secureboot");
        assert_eq!(
            sb.outputs,
            vec![Output::Raw, Output::Installer, Output::Uki]
        );
        assert!(sb.installer.take().unwrap().cargo_package.is_some());
        let s = sb.secure_boot.take().unwrap();
        assert!(s.keys.is_none() && s.enroll_mode() == "force");
        same_as_metal(sb, "secureboot");
    }
}

/// `profiles/metal-6_1.yaml` is metal with Linux 6.1: only its name, the
/// kernel source, fragments and waivers differ.
#[test]
fn metal_6_1_profile_is_metal_with_linux_6_1() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../profiles");
    let metal = Profile::load(&dir.join("metal.yaml")).unwrap();
    let mut old = Profile::load(&dir.join("metal-6_1.yaml")).unwrap();
    let src = old.kernel.source.take().unwrap();
    assert!(
        src.ends_with("linux-source-6.1.tar.xz"),
        "{}",
        src.display()
    );
    assert!(
        metal
            .kernel
            .source
            .as_ref()
            .unwrap()
            .ends_with("linux-source-6.12.tar.xz")
    );
    let names = |v: &[std::path::PathBuf]| -> Vec<String> {
        v.iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect()
    };
    assert_eq!(
        names(&old.kernel.fragments),
        [
            "base.config",
            "network.config",
            "kspp-6.1.config",
            "hardening-distro-6.1.config"
        ]
    );
    assert_eq!(names(&old.kernel.waiver_files), ["kspp-waivers-6.1.yaml"]);
    old.name = metal.name.clone();
    old.path = metal.path.clone();
    old.kernel.source = metal.kernel.source.clone();
    old.kernel.fragments = metal.kernel.fragments.clone();
    old.kernel.waiver_files = metal.kernel.waiver_files.clone();
    assert_eq!(format!("{old:?}"), format!("{metal:?}"));
}

#[test]
fn sizes() {
    assert_eq!(Size::parse("512"), Ok(Size(512)));
    assert_eq!(Size::parse("1KiB"), Ok(Size(1024)));
    assert!(Size::parse("1GB").is_err());
    assert!(Size::parse("99999999999TiB").is_err());
    assert!(Size::parse("").is_err());
}

/// The message of a profile that must be refused.
fn refused(text: &str) -> String {
    let e = parse(text).unwrap_err().to_string();
    assert!(e.contains("/p/profiles/test.yaml"), "{e}");
    e
}

/// `GOOD` with `key`'s line replaced by `line`.
fn with_line(prefix: &str, line: &str) -> String {
    GOOD.lines()
        .map(|l| if l.starts_with(prefix) { line } else { l })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

// --- Bounds (issue 8, point 3) ---

#[test]
fn billion_laughs_is_refused_at_its_first_anchor() {
    let mut text = format!("{GOOD}lol0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]\n");
    for i in 1..10 {
        let refs = vec![format!("*a{}", i - 1); 10].join(", ");
        text.push_str(&format!("lol{i}: &a{i} [{refs}]\n"));
    }
    let e = refused(&text);
    assert!(
        e.contains("line 16 column 7") && e.contains("anchor"),
        "{e}"
    );
    // An anchor is refused wherever it could stand, even in a quoted
    // string: after a space or a flow indicator.
    let e = refused(&with_line("name:", "name: \"a &b\""));
    assert!(
        e.contains("line 1 column 10") && e.contains("anchor"),
        "{e}"
    );
    let e = refused(&with_line("name:", "name: [x,&b]"));
    assert!(
        e.contains("line 1 column 10") && e.contains("anchor"),
        "{e}"
    );
    // Inside a word it is text (a URI's query): no anchor.
    let e = refused(&with_line("name:", "name: \"a&b\""));
    assert!(!e.contains("anchor"), "{e}");
    // "& " is text, not an anchor.
    let e = refused(&with_line("name:", "name: \"a & b\""));
    assert!(e.contains("letters, digits"), "{e}");
    // An alias without its anchor names its line.
    let e = refused(&with_line("version:", "version: *v"));
    assert!(
        e.contains("line 2") && e.contains("anchors or aliases"),
        "{e}"
    );
}

#[test]
fn deep_nesting_is_refused_at_once() {
    let e = refused(&format!("{GOOD}x: {}\n", "[".repeat(100_000)));
    assert!(
        e.contains("line 16 column 36") && e.contains("nested more than 32 deep"),
        "{e}"
    );
    // Closing brackets inside strings do not hide the depth: the number of
    // brackets is bounded too.
    let e = refused(&format!(
        "{GOOD}x: {}\n",
        "[[[[[[[[ \"]]]]]]]]\", ".repeat(200)
    ));
    assert!(e.contains("line 16") && e.contains("more than 1024"), "{e}");
    // Block nesting, by indentation or by compact sequences.
    let nested: String = (0..600).map(|i| format!("{}a:\n", " ".repeat(i))).collect();
    let e = refused(&format!("{GOOD}{nested}"));
    assert!(e.contains("line 80") && e.contains("past column 64"), "{e}");
    let e = refused(&format!("{GOOD}x:\n{}a\n", "- ".repeat(100_000)));
    assert!(e.contains("line 17") && e.contains("past column 64"), "{e}");
}

#[test]
fn the_worst_within_bounds_parses_quickly() {
    // As deep and as many brackets as allowed, in a file of the largest
    // size: refused by serde_yaml (an unknown key), in milliseconds.
    let deep = format!("{}{}", "[".repeat(31), "]".repeat(31));
    let mut text = format!("{GOOD}x: [");
    while text.len() + deep.len() + 3 < scan::MAX_BYTES && text.matches('[').count() < 990 {
        text.push_str(&deep);
        text.push(',');
    }
    text.push_str("a]\n");
    let e = refused(&text);
    assert!(e.contains("unknown field") && e.contains("line 16"), "{e}");
    // Many small values up to the size bound.
    let mut text = format!("{GOOD}x:\n");
    while text.len() < scan::MAX_BYTES - 10 {
        text.push_str("  - lol\n");
    }
    let e = refused(&text);
    assert!(e.contains("unknown field"), "{e}");
}

#[test]
fn oversize_profiles_are_refused_reading_no_further() {
    let big = format!("{GOOD}# {}\n", "x".repeat(scan::MAX_BYTES));
    let e = refused(&big);
    assert!(
        e.contains("line 16") && e.contains("longer than 262144 bytes"),
        "{e}"
    );
    // A huge (sparse) file is not read whole.
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("huge.yaml");
    std::fs::File::create(&f)
        .unwrap()
        .set_len(64 << 30)
        .unwrap();
    let e = Profile::load(&f).unwrap_err().to_string();
    assert!(e.contains("huge.yaml") && e.contains("longer than"), "{e}");
}

#[test]
fn bytes_that_are_not_text_are_refused_without_quoting_them() {
    let e = Profile::parse_bytes(b"name: m\n\xff\xfe\x00secret", Path::new("/p/b.yaml"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("line 2: not UTF-8 text"), "{e}");
    assert!(!e.contains("secret"), "{e}");
    let e = refused(&with_line("version:", "version: 1.0\u{1b}[2J"));
    assert!(
        e.contains("line 2 column 13") && e.contains("control character U+001B"),
        "{e}"
    );
}

// --- No secret in messages (issue 8, point 1) ---

/// The first bytes of every line of a key's base64 body: none of them may
/// appear in a message.
fn body_pieces(pem: &str) -> Vec<String> {
    pem.lines()
        .filter(|l| !l.starts_with("-----"))
        .map(|l| l.chars().take(12).collect())
        .collect()
}

#[test]
fn a_private_key_as_profile_is_named_and_not_shown() {
    let (private, public) = crate::secret::tests::test_keypair();
    let dir = tempfile::tempdir().unwrap();
    let k = dir.path().join("k.key");
    std::fs::write(&k, &private).unwrap();
    let e = Profile::load(&k).unwrap_err().to_string();
    assert_eq!(
        e,
        format!(
            "{} looks like a private key, not a profile: check --profile",
            k.display()
        )
    );
    // Inside a profile, too.
    let e = refused(&format!("{GOOD}signing:\n  key: |\n{private}"));
    assert!(e.contains("looks like a private key"), "{e}");
    for piece in body_pieces(&private) {
        assert!(!e.contains(&piece), "{e}");
    }
    // A public key is not a secret, but it is not quoted either.
    let p = dir.path().join("k.pub");
    std::fs::write(&p, &public).unwrap();
    let e = Profile::load(&p).unwrap_err().to_string();
    assert!(e.contains("k.pub") && e.contains("line 1"), "{e}");
    for piece in body_pieces(&public) {
        assert!(!e.contains(&piece), "{e}");
    }
}

#[test]
fn long_and_key_like_values_are_cut_in_messages() {
    let long = "v".repeat(2000);
    let e = refused(&with_line("version:", &format!("version: \"{long}\"")));
    assert!(e.contains("line 2") && e.contains("version"), "{e}");
    assert!(
        e.contains("(2000 characters)") && !e.contains(&"v".repeat(33)),
        "{e}"
    );
    assert!(e.len() < 400, "{e}");
    // A run of base64 is not shown at all.
    let key = "MC4CAQAwBQYDK2VwBCIEIGbm3ZcVH0lQnqHbXrU2bCrA3o6x";
    let e = refused(&with_line("version:", &format!("version: v{key} x")));
    assert!(e.contains("not shown") && !e.contains("MC4C"), "{e}");
    // serde_yaml's own messages are cut as well.
    let e = refused(&with_line(
        "kernel:",
        &format!("kernel: \"{}\"", "k".repeat(2000)),
    ));
    assert!(
        e.contains("line 3") && e.contains("(2000 characters)") && e.len() < 400,
        "{e}"
    );
    let e = refused(&with_line("kernel:", &format!("kernel: {key}")));
    assert!(!e.contains("MC4C") && !e.contains("bXrU"), "{e}");
    let e = refused(&with_line("  size:", &format!("  size: {key}")));
    assert!(e.contains("line 13") && !e.contains("MC4C"), "{e}");
    let e = refused(&GOOD.replace(
        "  rules: rules.yaml",
        &format!("  rules: rules.yaml\n  \"{}\": 1", "s".repeat(1000)),
    ));
    assert!(
        e.contains("line 7") && e.contains("(1000 characters)") && e.len() < 600,
        "{e}"
    );
}

// --- Every value checked, errors name file, line and key (point 4) ---

#[test]
fn checks_name_the_line_and_the_key() {
    let e = refused(&with_line("name:", "name: my image"));
    assert!(
        e.contains("line 1: name:") && e.contains("letters, digits"),
        "{e}"
    );
    let e = refused(&with_line("  cmdline:", "  cmdline: [a, \"b\\u0007\"]"));
    assert!(
        e.contains("line 7: kernel.cmdline[1]:") && e.contains("\\u{7}"),
        "{e}"
    );
    let block = "  cmdline:\n    - console=ttyS0\n    - quiet\n    - \"x\\ty\"";
    let e = refused(&with_line("  cmdline:", block));
    assert!(e.contains("line 10: kernel.cmdline[2]:"), "{e}");
    let e = refused(&with_line("  cmdline:", "  cmdline: [caf\u{e9}]"));
    assert!(e.contains("printable ASCII"), "{e}");
    let e = refused(&with_line("  cmdline:", "  cmdline: [a=\"b]"));
    assert!(e.contains("unpaired"), "{e}");
    let e = refused(&with_line(
        "  rules:",
        "  rules: r.yaml\n  prebuilt: /b\n  prebuilt_config: /c",
    ));
    assert!(e.contains("line 7: kernel.prebuilt:"), "{e}");
    let e = refused(&GOOD.replace("  cargo_package: ../rootfs\n", ""));
    assert!(e.contains("line 8: runtime:"), "{e}");
    let e = refused(&format!("{GOOD}outputs:\n  - raw\n  - raw\n"));
    assert!(
        e.contains("line 18: outputs[1]: raw is listed twice"),
        "{e}"
    );
    let e = refused(&format!("{GOOD}  sector_size: 1024\n"));
    assert!(e.contains("line 16: disk.sector_size:"), "{e}");
    // The BIOS path (GRUB): no boot flag without it, no argument GRUB
    // would pass escaped.
    assert!(
        parse(&format!("{GOOD}  bios_boot_flag: true\n"))
            .unwrap()
            .disk
            .bios_boot_flag
    );
    assert!(!parse(GOOD).unwrap().disk.bios_boot_flag);
    let e = refused(&format!(
        "{GOOD}  sector_size: 4096\n  bios_boot_flag: true\n"
    ));
    assert!(
        e.contains("disk.bios_boot_flag:") && e.contains("no BIOS boot"),
        "{e}"
    );
    for arg in ["\"a=\\\"b\\\"\"", "a='b'", "'a\\b'"] {
        let text = with_line("  cmdline:", &format!("  cmdline: [x, {arg}]"));
        let e = refused(&text);
        assert!(
            e.contains("line 7: kernel.cmdline[1]:") && e.contains("escaped with a backslash"),
            "{arg}: {e}"
        );
        assert!(refused(&format!("{text}  sector_size: 4096\n")).contains("GRUB"));
    }
    let e = refused(&with_line(
        "  rules:",
        "  rules: r.yaml\n  waivers:\n    - option: CONFIG_X\n      reason: \" \"",
    ));
    assert!(e.contains("line 9: kernel.waivers[0].reason:"), "{e}");
    let e = refused(&with_line("version:", "version: 1\\u2028x"));
    assert!(e.contains("line 2: version:"), "{e}");
}

#[test]
fn versions_that_break_names_are_refused() {
    for bad in [
        "1/2", "../1", "-1", ".1", "1 2", "1\"2", "1$x", "1;x", "\"\"",
    ] {
        let e = refused(&with_line("version:", &format!("version: '{bad}'")));
        assert!(
            e.contains("line 2: version:") && e.contains("letters, digits"),
            "{bad}: {e}"
        );
    }
    let e = refused(&with_line(
        "version:",
        &format!("version: {}", "1".repeat(65)),
    ));
    assert!(e.contains("1 to 64"), "{e}");
    for good in ["1.0.0", "1.0.0+build", "2024_01-rc1", "v1"] {
        let p = parse(&with_line("version:", &format!("version: {good}"))).unwrap();
        assert_eq!(p.version, good);
    }
}

#[test]
fn compression_levels_are_checked() {
    for (key, level, ok) in [
        ("initramfs_zstd_level", 0, false),
        ("initramfs_zstd_level", -1, false),
        ("initramfs_zstd_level", 19, true),
        ("initramfs_zstd_level", 20, false),
        ("rootfs_zstd_level", 0, false),
        ("rootfs_zstd_level", 22, true),
        ("rootfs_zstd_level", 23, false),
    ] {
        let r = parse(&format!("{GOOD}compression:\n  {key}: {level}\n"));
        match (ok, r) {
            (true, Ok(_)) => {}
            (false, Err(e)) => {
                let e = e.to_string();
                assert!(
                    e.contains(&format!(
                        "line 17: compression.{key}: {level} is out of range"
                    )),
                    "{e}"
                );
            }
            (ok, r) => panic!("{key} {level}: expected ok={ok}, got {r:?}"),
        }
    }
}

#[test]
fn a_command_line_longer_than_the_boot_path_carries_is_refused() {
    // What the build and the boot path add: " machined.verity=<64 hex>",
    // " machined.slot=A", and the longer of systemd-boot's
    // " initrd=\A\initramfs-<16>.zst" and GRUB's "BOOT_IMAGE=/A/vmlinuz-<16> "
    // " machined.trial=1 machined.boot_part=<GUID>".
    let added = crate::boot::loaded_cmdline_len("x") - 1 + contract::cmdline::VERITY_ARG_LEN;
    assert_eq!(
        added,
        " machined.verity=".len()
            + 64
            + " machined.slot=A".len()
            + "BOOT_IMAGE=/A/vmlinuz-0123456789abcdef ".len()
            + " machined.trial=1 machined.boot_part=".len()
            + 36
    );
    let allowed = contract::cmdline::MAX_LEN - added;
    // Items of 99 bytes joined by spaces, the last one shorter: `len` bytes.
    let items = |len: usize| {
        let k = len.div_ceil(100);
        let mut v = vec!["a".repeat(99); k - 1];
        v.push("b".repeat(len - (k - 1) * 100));
        v
    };
    let profile = |cmdline: &[String]| {
        with_line(
            "  cmdline:",
            &format!("  cmdline: [{}]", cmdline.join(", ")),
        )
    };
    let fits = items(allowed);
    assert_eq!(fits.join(" ").len(), allowed);
    parse(&profile(&fits)).unwrap();
    let mut over = fits.clone();
    over.last_mut().unwrap().push('d');
    let e = refused(&profile(&over));
    assert!(
        e.contains("line 7: kernel.cmdline:")
            && e.contains(&format!("is {} bytes", allowed + 1))
            && e.contains(&format!("at most {allowed} bytes"))
            && e.contains("2047"),
        "{e}"
    );
    // The line of the report: 2,707 bytes, built and signed, cut at boot.
    let e = refused(&profile(&items(2707)));
    assert!(e.contains("is 2707 bytes"), "{e}");
}

// --- Finding the profile (point 7) ---

#[test]
fn locate_tells_what_is_wrong_with_the_path() {
    use std::os::unix::fs::symlink;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let shown = |p: &Path| p.to_str().unwrap().to_string();
    let lp = d.join("loop.yaml");
    symlink(&lp, &lp).unwrap();
    let e = Profile::locate(&shown(&lp)).unwrap_err().to_string();
    assert!(e.contains("loop.yaml is a symbolic link loop"), "{e}");
    let e = Profile::load(&lp).unwrap_err().to_string();
    assert!(e.contains("symbolic link loop"), "{e}");
    let dangling = d.join("dangling.yaml");
    symlink(d.join("gone.yaml"), &dangling).unwrap();
    let e = Profile::locate(&shown(&dangling)).unwrap_err().to_string();
    assert!(e.contains("gone.yaml, which does not exist"), "{e}");
    let sub = d.join("dir.yaml");
    std::fs::create_dir(&sub).unwrap();
    let e = Profile::locate(&shown(&sub)).unwrap_err().to_string();
    assert!(e.contains("dir.yaml is a directory"), "{e}");
    let e = Profile::locate(&shown(&d.join("none.yaml")))
        .unwrap_err()
        .to_string();
    assert!(e.contains("none.yaml not found"), "{e}");
    // A FIFO is refused, not waited on.
    let fifo = d.join("fifo.yaml");
    let c = std::ffi::CString::new(shown(&fifo)).unwrap();
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let e = Profile::locate(&shown(&fifo)).unwrap_err().to_string();
    assert!(e.contains("not a regular file"), "{e}");
    let e = Profile::load(&fifo).unwrap_err().to_string();
    assert!(e.contains("not a regular file"), "{e}");
    let good = d.join("good.yaml");
    std::fs::write(&good, GOOD).unwrap();
    assert_eq!(Profile::locate(&shown(&good)).unwrap(), good);
}

#[test]
fn lines_of_key_paths() {
    let text = "a: 1\nb:\n  c: [x, y]\n  d:\n    - p\n    - q: 2\n      r: 3\n";
    assert_eq!(lines::line_of(text, "a"), Some(1));
    assert_eq!(lines::line_of(text, "b.c"), Some(3));
    assert_eq!(lines::line_of(text, "b.c[1]"), Some(3));
    assert_eq!(lines::line_of(text, "b.d[1]"), Some(6));
    assert_eq!(lines::line_of(text, "b.d[1].r"), Some(7));
    // Absent keys: the nearest enclosing key that is written.
    assert_eq!(lines::line_of(text, "b.z"), Some(2));
    assert_eq!(lines::line_of(text, "b.d[9]"), Some(4));
    assert_eq!(lines::line_of(text, "z"), None);
}

/// Found by the fuzzer: a key holding backquotes (serde quotes unknown keys
/// in backquotes) made every other part of it print whole.
#[test]
fn unknown_keys_with_backquotes_are_cut() {
    let key = "`a` b ` c ".repeat(200);
    let e = refused(&format!("{{name: m, \"{key}\\n\": 1}}"));
    assert!(
        e.contains("line 1") && e.contains("(2001 characters)") && e.len() < 500,
        "{e}"
    );
    assert!(e.contains("expected one of `name`"), "{e}");
    // And whatever a message holds, it stays short.
    assert!(
        crate::secret::sanitise(&"`a` b ".repeat(1000))
            .chars()
            .count()
            < 700
    );
}

#[test]
fn the_network_section_goes_onto_the_command_line() {
    let net = "network:\n  interface: eth0\n  address: 10.0.2.15/24\n  gateway: 10.0.2.2\n";
    let p = parse(&format!("{GOOD}{net}")).unwrap();
    assert_eq!(
        p.cmdline(),
        "console=ttyS0 slab_nomerge machined.net=eth0:10.0.2.15/24:10.0.2.2"
    );
    // What the build writes is what the runtime reads.
    assert_eq!(contract::cmdline::net(&p.cmdline()).unwrap(), p.net.clone());
    assert_eq!(
        p.net.as_ref().map(ToString::to_string).as_deref(),
        Some("eth0 10.0.2.15/24 gateway 10.0.2.2")
    );
    let p = parse(&format!(
        "{GOOD}network: {{interface: enp1s0, address: 192.168.7.2/30}}\n"
    ))
    .unwrap();
    assert!(p.cmdline().ends_with(" machined.net=enp1s0:192.168.7.2/30"));
    let p = parse(&format!("{GOOD}network: {{interface: eth0, dhcp: true}}\n")).unwrap();
    assert!(p.cmdline().ends_with(" machined.net=eth0:dhcp"));
    assert_eq!(contract::cmdline::net(&p.cmdline()).unwrap(), p.net.clone());
    assert_eq!(parse(GOOD).unwrap().net, None);
}

#[test]
fn network_errors_name_the_line_and_the_key() {
    let net = |i: &str, a: &str, g: &str| {
        refused(&format!(
            "{GOOD}network:\n  interface: {i}\n  address: {a}\n  gateway: {g}\n"
        ))
    };
    let e = net("eth0/1", "10.0.2.15/24", "10.0.2.2");
    assert!(e.contains("line 17: network.interface:"), "{e}");
    let e = net("averyveryverylongname", "10.0.2.15/24", "10.0.2.2");
    assert!(
        e.contains("network.interface:") && e.contains("at most 15"),
        "{e}"
    );
    let e = net("eth0", "10.0.2.15", "10.0.2.2");
    assert!(
        e.contains("line 18: network.address:") && e.contains("ADDRESS/PREFIX"),
        "{e}"
    );
    let e = net("eth0", "10.0.2.15/40", "10.0.2.2");
    assert!(
        e.contains("network.address:") && e.contains("1 to 32"),
        "{e}"
    );
    let e = net("eth0", "10.0.2.15/24", "10.0.2");
    assert!(e.contains("line 19: network.gateway:"), "{e}");
    let e = net("eth0", "10.0.2.15/24", "10.0.3.2");
    assert!(
        e.contains("line 19: network.gateway:") && e.contains("not in the subnet"),
        "{e}"
    );
    let e = refused(&format!("{GOOD}network:\n  address: 10.0.2.15/24\n"));
    assert!(e.contains("interface"), "{e}");
    let e = refused(&format!(
        "{GOOD}network: {{interface: eth0, address: 10.0.2.15/24, dhcp: true}}\n"
    ));
    assert!(
        e.contains("network.dhcp:") && e.contains("one of them"),
        "{e}"
    );
    let e = refused(&format!(
        "{GOOD}network: {{interface: eth0, dhcp: true, gateway: 10.0.2.2}}\n"
    ));
    assert!(e.contains("network.gateway:") && e.contains("lease"), "{e}");
    let e = refused(&format!("{GOOD}network: {{interface: eth0}}\n"));
    assert!(e.contains("dhcp: true"), "{e}");
    // The key itself is the section's, not kernel.cmdline's.
    let e = refused(&with_line(
        "  cmdline:",
        "  cmdline: [machined.net=eth0:10.0.2.15/24]",
    ));
    assert!(
        e.contains("line 7: kernel.cmdline[0]:") && e.contains("network section"),
        "{e}"
    );
}

#[test]
fn node_api_registries_go_onto_the_command_line_and_bad_ones_are_refused() {
    let p = parse(&format!(
        "{GOOD}node_api:\n  plain_http_registries: [10.0.2.100:5000, reg.local:80]\n"
    ))
    .unwrap();
    assert!(
        p.cmdline()
            .ends_with(" machined.plain_http=10.0.2.100:5000,reg.local:80"),
        "{}",
        p.cmdline()
    );
    // What the build writes is what the runtime reads.
    assert_eq!(
        contract::cmdline::plain_http(&p.cmdline()),
        ["10.0.2.100:5000", "reg.local:80"]
    );
    assert!(!parse(GOOD).unwrap().cmdline().contains("plain_http"));
    let e = refused(&format!(
        "{GOOD}node_api:\n  plain_http_registries: [10.0.2.100]\n"
    ));
    assert!(e.contains("node_api.plain_http_registries[0]"), "{e}");
    let e = refused(&GOOD.replace("slab_nomerge]", "slab_nomerge, machined.plain_http=a:1]"));
    assert!(e.contains("machined.plain_http"), "{e}");
}

#[test]
fn the_cache_section_names_a_repository_and_resolves_its_keys() {
    let p = parse(&format!(
        "{GOOD}cache:\n  registry: ghcr.io/org/imager-cache\n  trusted_keys: [keys/ci.pub]\n  \
         plain_http: false\n"
    ))
    .unwrap();
    let c = p.cache.as_ref().unwrap();
    assert_eq!(c.registry.as_deref(), Some("ghcr.io/org/imager-cache"));
    assert!(c.trusted_keys[0].is_absolute(), "{:?}", c.trusted_keys);
    assert!(c.trusted_keys[0].ends_with("keys/ci.pub"));
    for bad in ["ghcr.io/org/cache:tag", "cache", "ghcr.io/Org/x"] {
        let e = refused(&format!("{GOOD}cache:\n  registry: {bad}\n"));
        assert!(e.contains("cache.registry"), "{bad}: {e}");
    }
    let e = refused(&format!("{GOOD}cache:\n  registry: r.io/a\n  token: x\n"));
    assert!(e.contains("token"), "{e}");
}
