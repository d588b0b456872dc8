//! The root filesystem of a build, as the skeleton manifest lists it: the
//! skeleton's files, the host programs with their shared-library closures,
//! and the files the builder makes.

use crate::profile::Profile;
use crate::{closure, rootfs};
use anyhow::{Context, Result, bail};
use contract::paths;
use std::path::Path;

/// The root filesystem, exactly as the runtime's manifest lists it: its
/// directories with their modes, its files from the skeleton, and the files
/// the builder makes (the runtime and os-release).
pub fn rootfs_spec(p: &Profile, machined: &Path, epoch: u64) -> Result<rootfs::RootfsSpec> {
    use contract::skeleton::{Kind, parse};
    let m = &p.runtime.manifest;
    let text = crate::input::read_text(m, "rootfs manifest", crate::input::MAX_TEXT)?;
    let entries = parse(&text).map_err(|e| anyhow::anyhow!("{}: {e}", m.display()))?;
    let mut spec = rootfs::RootfsSpec {
        skeleton: None,
        dirs: Vec::new(),
        files: Vec::new(),
        epoch,
        level: p.compression.rootfs_zstd_level,
        keep_modes: false,
    };
    // The closures of the `host` programs, first: the builder file that
    // lists them may come before them in the manifest.
    let root = closure::host_root(p.arch);
    let closure = host_closures(&entries, m, &root, p.arch)?;
    let mut closure_listed = false;
    for e in entries {
        let abs = format!("/{}", e.path);
        match e.kind {
            Kind::Dir => spec.dirs.push((abs, e.mode)),
            Kind::File => {
                let src = p.runtime.skeleton.join(e.path);
                if !src.is_file() {
                    bail!(
                        "{} lists {} but {} does not exist: add it to the skeleton or remove the line",
                        m.display(),
                        e.path,
                        src.display()
                    );
                }
                spec.files.push(rootfs::RootfsFile {
                    path: abs,
                    source: rootfs::Source::File(src),
                    mode: e.mode,
                });
            }
            Kind::Host => spec.files.push(rootfs::RootfsFile {
                path: abs.clone(),
                source: rootfs::Source::File(closure::host_file(&root, Path::new(&abs))?),
                mode: e.mode,
            }),
            Kind::Builder => {
                let source = if abs == paths::ROOTFS_INIT {
                    rootfs::Source::File(machined.to_path_buf())
                } else if abs == paths::ROOTFS_OS_RELEASE {
                    rootfs::Source::Bytes(os_release(p).into_bytes())
                } else if abs == paths::ROOTFS_HOST_CLOSURE {
                    closure_listed = true;
                    rootfs::Source::Bytes(closure_manifest(closure.values()).into_bytes())
                } else {
                    bail!(
                        "{} asks the builder for {abs}, which it does not make (it makes {}, {} and {})",
                        m.display(),
                        paths::ROOTFS_INIT,
                        paths::ROOTFS_OS_RELEASE,
                        paths::ROOTFS_HOST_CLOSURE
                    );
                };
                spec.files.push(rootfs::RootfsFile {
                    path: abs,
                    source,
                    mode: e.mode,
                });
            }
        }
    }
    if !closure.is_empty() && !closure_listed {
        bail!(
            "{} has host programs but no `builder 0644 {}` line: stage 1 could not check their libraries",
            m.display(),
            paths::ROOTFS_HOST_CLOSURE.trim_start_matches('/')
        );
    }
    for f in closure.into_values() {
        spec.files.push(rootfs::RootfsFile {
            path: f.path,
            source: rootfs::Source::File(f.source),
            mode: f.mode,
        });
    }
    if let Some(dir) = &p.kernel.firmware {
        spec.files.extend(firmware_files(dir)?);
    }
    Ok(spec)
}

/// Where firmware files go in the root filesystem: where the kernel's
/// loader looks first (`/lib/firmware`, Documentation/driver-api/firmware/
/// fw_search_path.rst).
pub const FIRMWARE_DIR: &str = "/lib/firmware";

/// At most this many firmware files, of at most this many bytes in all
/// (linux-firmware whole is about 4,000 files and 1 GB; an image takes
/// the few its machines' drivers ask for).
pub const FIRMWARE_MAX_FILES: usize = 4096;
pub const FIRMWARE_MAX_BYTES: u64 = 512 << 20;

/// The firmware files of `dir` (the profile's `kernel.firmware`), each as
/// `/lib/firmware/<its path under dir>`, 0644, in path order. Only regular
/// files and directories: a symbolic link (linux-firmware's `WHENCE`
/// links) is refused with what to copy instead, as is anything else.
pub fn firmware_files(dir: &Path) -> Result<Vec<rootfs::RootfsFile>> {
    let key = "kernel.firmware";
    if !dir.is_dir() {
        bail!(
            "{key}: {} is not a directory: give the directory holding the firmware files, laid \
             out as linux-firmware is",
            dir.display()
        );
    }
    let (mut files, mut bytes) = (Vec::new(), 0u64);
    for entry in walkdir::WalkDir::new(dir)
        .min_depth(1)
        .follow_links(false)
        .sort_by_file_name()
    {
        let entry = entry.with_context(|| format!("{key}: walking {}", dir.display()))?;
        let ft = entry.file_type();
        if ft.is_dir() {
            continue;
        }
        let shown = entry.path().display();
        if !ft.is_file() {
            bail!(
                "{key}: {shown} is not a regular file (a symbolic link?): copy the file it stands \
                 for under that name instead"
            );
        }
        let rel = entry
            .path()
            .strip_prefix(dir)
            .context("walking the firmware directory")?
            .to_str()
            .with_context(|| format!("{key}: {shown} is not UTF-8: rename it"))?;
        bytes = bytes.saturating_add(entry.metadata().map(|m| m.len()).unwrap_or(0));
        if files.len() >= FIRMWARE_MAX_FILES || bytes > FIRMWARE_MAX_BYTES {
            bail!(
                "{key}: {} holds more than {FIRMWARE_MAX_FILES} files or {} MiB: give only the \
                 firmware the image's drivers ask for",
                dir.display(),
                FIRMWARE_MAX_BYTES >> 20
            );
        }
        files.push(rootfs::RootfsFile {
            path: format!("{FIRMWARE_DIR}/{rel}"),
            source: rootfs::Source::File(entry.path().to_path_buf()),
            mode: 0o644,
        });
    }
    Ok(files)
}

/// The files of the closures of the skeleton manifest's `host` programs
/// (`m` names the manifest in messages) that it does not list itself, by
/// path in the image.
/// The closures of the `host` programs of the manifest, read from `root`
/// ([`closure::host_root`]: the build host's own for amd64, Debian's
/// packages of the architecture unpacked for another).
fn host_closures(
    entries: &[contract::skeleton::Entry],
    m: &Path,
    root: &Path,
    arch: contract::Arch,
) -> Result<std::collections::BTreeMap<String, closure::ClosureFile>> {
    use contract::skeleton::Kind;
    let listed: std::collections::BTreeSet<String> =
        entries.iter().map(|e| format!("/{}", e.path)).collect();
    let mut closure = std::collections::BTreeMap::new();
    for e in entries.iter().filter(|e| e.kind == Kind::Host) {
        let image_path = Path::new("/").join(e.path);
        if !closure::host_file(root, &image_path).is_ok_and(|f| f.is_file()) {
            let where_ = if root == Path::new("/") {
                "on this host: install the package that provides it (scripts/setup.sh)".to_string()
            } else {
                format!(
                    "in {} ({arch}'s packages): run scripts/setup.sh, which unpacks them there",
                    root.display()
                )
            };
            bail!(
                "{} asks for the host program /{} but it is not {where_}",
                m.display(),
                e.path
            );
        }
        let program = closure::host_file(root, &image_path)?;
        let head = crate::input::read_head(&program, "host program", 64)?;
        let machine = head
            .starts_with(b"\x7fELF")
            .then(|| contract::le::read_u16(&head, 18))
            .flatten();
        if machine != Some(arch.spec().elf_machine) {
            bail!(
                "the host program /{} ({}) is not an ELF program for {arch}: {}",
                e.path,
                program.display(),
                match root == Path::new("/") {
                    true =>
                        "an image of another architecture takes its programs from that \
                             architecture's packages (docs/arm64.md)",
                    false => "run scripts/setup.sh again to unpack that architecture's packages",
                }
            );
        }
        let files = closure::resolve_in(root, &image_path, &closure::default_search(arch))
            .with_context(|| format!("resolving the shared libraries of /{}", e.path))?;
        for f in files {
            if !listed.contains(&f.path) {
                closure.entry(f.path.clone()).or_insert(f);
            }
        }
    }
    Ok(closure)
}

/// The generated manifest of the host programs' closures (sorted), in the
/// skeleton format, checked by stage 1.
fn closure_manifest<'a>(files: impl Iterator<Item = &'a closure::ClosureFile>) -> String {
    let mut s = String::from(
        "# Generated by imager: the shared libraries and ELF interpreter of the\n\
         # `host` programs of the skeleton manifest. Checked by stage 1.\n",
    );
    for f in files {
        s.push_str(&format!(
            "host {:04o} {}\n",
            f.mode,
            f.path.trim_start_matches('/')
        ));
    }
    s
}

fn os_release(p: &Profile) -> String {
    format!(
        "NAME=\"{}\"\nID={}\nVERSION_ID={}\nIMAGE_ID={}\nIMAGE_VERSION={}\nPRETTY_NAME=\"{} {}\"\n",
        p.pretty_name, p.name, p.version, p.name, p.version, p.pretty_name, p.version
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile_with_manifest(dir: &Path, manifest: &str) -> Profile {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut p = Profile::load(&root.join("profiles/metal.yaml")).unwrap();
        let m = dir.join("skeleton.txt");
        std::fs::write(&m, manifest).unwrap();
        p.runtime.manifest = m;
        p
    }

    #[test]
    fn host_programs_bring_their_closure_and_its_manifest() {
        let dir = tempfile::tempdir().unwrap();
        let machined = dir.path().join("machined");
        std::fs::write(&machined, "x").unwrap();
        let p = profile_with_manifest(
            dir.path(),
            "builder 0644 usr/lib/machined/host-closure.txt\nhost 0755 usr/sbin/mkfs.xfs\n",
        );
        let spec = rootfs_spec(&p, &machined, 0).unwrap();
        let paths: Vec<&str> = spec.files.iter().map(|f| f.path.as_str()).collect();
        assert!(paths.contains(&"/usr/sbin/mkfs.xfs"), "{paths:?}");
        assert!(paths.contains(&"/lib64/ld-linux-x86-64.so.2"), "{paths:?}");
        assert!(
            paths.contains(&"/usr/lib/x86_64-linux-gnu/libc.so.6"),
            "{paths:?}"
        );
        let manifest = spec
            .files
            .iter()
            .find(|f| f.path == paths::ROOTFS_HOST_CLOSURE)
            .unwrap();
        let rootfs::Source::Bytes(text) = &manifest.source else {
            panic!("closure manifest is not generated")
        };
        let text = String::from_utf8(text.clone()).unwrap();
        let entries = contract::skeleton::parse(&text).unwrap();
        assert!(
            entries
                .iter()
                .any(|e| e.path == "usr/lib/x86_64-linux-gnu/libc.so.6"),
            "{text}"
        );
        assert!(!entries.iter().any(|e| e.path == "usr/sbin/mkfs.xfs"));
        // Same inputs, same manifest.
        let again = rootfs_spec(&p, &machined, 0).unwrap();
        assert_eq!(again, spec);

        // Without the closure manifest line, or with a program that is not
        // on the host, the build stops with the reason.
        let p = profile_with_manifest(dir.path(), "host 0755 usr/sbin/mkfs.xfs\n");
        let e = format!("{:#}", rootfs_spec(&p, &machined, 0).unwrap_err());
        assert!(e.contains("host-closure.txt"), "{e}");
        let p = profile_with_manifest(dir.path(), "host 0755 usr/sbin/no-such-program\n");
        let e = format!("{:#}", rootfs_spec(&p, &machined, 0).unwrap_err());
        assert!(e.contains("not on this host"), "{e}");
    }

    /// A profile's firmware directory goes under /lib/firmware, file by
    /// file, in path order, 0644; a symbolic link or a missing directory is
    /// refused with what to do.
    #[test]
    fn firmware_files_go_under_lib_firmware() {
        let dir = tempfile::tempdir().unwrap();
        let fw = dir.path().join("firmware");
        std::fs::create_dir_all(fw.join("rtl_nic")).unwrap();
        std::fs::write(fw.join("rtl_nic/rtl8168h-2.fw"), b"fw-a").unwrap();
        std::fs::write(fw.join("e100.bin"), b"fw-b").unwrap();
        let machined = dir.path().join("machined");
        std::fs::write(&machined, "x").unwrap();
        let mut p = profile_with_manifest(dir.path(), "dir 0755 usr\n");
        p.kernel.firmware = Some(fw.clone());
        let spec = rootfs_spec(&p, &machined, 0).unwrap();
        let got: Vec<(&str, u32)> = spec
            .files
            .iter()
            .filter(|f| f.path.starts_with("/lib/firmware/"))
            .map(|f| (f.path.as_str(), f.mode))
            .collect();
        assert_eq!(
            got,
            [
                ("/lib/firmware/e100.bin", 0o644),
                ("/lib/firmware/rtl_nic/rtl8168h-2.fw", 0o644)
            ]
        );
        std::os::unix::fs::symlink("e100.bin", fw.join("link.bin")).unwrap();
        let e = format!("{:#}", firmware_files(&fw).unwrap_err());
        assert!(
            e.contains("kernel.firmware") && e.contains("link.bin") && e.contains("copy the file"),
            "{e}"
        );
        let e = format!(
            "{:#}",
            firmware_files(&dir.path().join("none")).unwrap_err()
        );
        assert!(e.contains("is not a directory"), "{e}");
    }
}
