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
    assert!(e.contains("line 16") && e.contains("iso"), "{e}");
    let e = with("outputs: [raw, raw]\n").unwrap_err().to_string();
    assert!(e.contains("raw is listed twice"), "{e}");
    let e = with("outputs: []\n").unwrap_err().to_string();
    assert!(e.contains("at least one output"), "{e}");
    // The version becomes the image's tag.
    let bad = GOOD.replace("version: 1.0.0", "version: 1.0.0+build");
    let e = parse(&format!(
        "{bad}outputs: [installer]\ninstaller: {{ binary: /bin/imager }}\n"
    ))
    .unwrap_err()
    .to_string();
    assert!(e.contains("version") && e.contains("tag"), "{e}");
}

/// `profiles/installer.yaml` builds the system of `profiles/metal.yaml`:
/// it may differ only in its outputs and installer section.
#[test]
fn installer_profile_is_metal_plus_the_installer() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../profiles");
    let metal = Profile::load(&dir.join("metal.yaml")).unwrap();
    let mut inst = Profile::load(&dir.join("installer.yaml")).unwrap();
    assert_eq!(inst.outputs, vec![Output::Raw, Output::Installer]);
    let pkg = inst.installer.take().unwrap().cargo_package.unwrap();
    assert_eq!(
        std::fs::canonicalize(pkg).unwrap(),
        std::fs::canonicalize(Path::new(env!("CARGO_MANIFEST_DIR"))).unwrap()
    );
    inst.outputs = metal.outputs.clone();
    inst.path = metal.path.clone();
    assert_eq!(format!("{inst:?}"), format!("{metal:?}"));
}

#[test]
fn sizes() {
    assert_eq!(Size::parse("512"), Ok(Size(512)));
    assert_eq!(Size::parse("1KiB"), Ok(Size(1024)));
    assert!(Size::parse("1GB").is_err());
    assert!(Size::parse("99999999999TiB").is_err());
    assert!(Size::parse("").is_err());
}
