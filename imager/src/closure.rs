//! Host programs in the root filesystem: a program copied from the build
//! host together with its shared-library closure.
//!
//! The closure is resolved the way the dynamic loader would: the ELF
//! interpreter (`PT_INTERP`), then every `DT_NEEDED` library, recursively,
//! searched in the needing object's `DT_RUNPATH` (or, when it has none, its
//! own and its loaders' `DT_RPATH`), then the Debian multiarch and system
//! directories ([`default_search`]). `$ORIGIN` is expanded.
//!
//! The root filesystem has no symbolic links, so each library's content (the
//! file the name resolves to) is copied under its needed name in the
//! canonical directory it was found in: `/lib/x86_64-linux-gnu/libuuid.so.1`
//! on a merged-/usr host becomes `/usr/lib/x86_64-linux-gnu/libuuid.so.1`.
//! The interpreter keeps its exact path (`/lib64/ld-linux-x86-64.so.2`),
//! which is what the kernel opens. A `DT_NEEDED` naming the interpreter
//! itself (libc needs `ld-linux-x86-64.so.2`) is satisfied by the loader
//! already in memory and is not copied twice.
//!
//! The programs and libraries may come from another root than the build
//! host's ([`resolve_in`]): Debian's packages of another architecture
//! unpacked into a directory (docs/arm64.md). Every path is then resolved
//! inside that root as the loader would see it there: a symbolic link's
//! absolute target is the root's, and `..` stops at the root.
//!
//! The ELF reader is a few dozen lines of our own (64-bit little-endian
//! only, the one format the images run): it reads just the program headers
//! and the dynamic section, so no ELF crate is needed.

use anyhow::{Context, Result, bail, ensure};
use contract::le::{read_u16, read_u32, read_u64};
use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// The root an image of `arch` takes its host files from (its programs and
/// their libraries, systemd-boot and the UKI stub): the build host's own
/// `/` for amd64, and for another architecture the directory where
/// scripts/setup.sh unpacks Debian's packages of it, `IMAGER_ARM64_ROOT`
/// or `/var/lib/imager/arm64` (docs/arm64.md).
pub fn host_root(arch: contract::Arch) -> PathBuf {
    match arch {
        contract::Arch::Amd64 => PathBuf::from("/"),
        contract::Arch::Arm64 => std::env::var_os("IMAGER_ARM64_ROOT")
            .filter(|v| !v.is_empty())
            .map_or_else(|| PathBuf::from(ARM64_ROOT), PathBuf::from),
    }
}

/// Where scripts/setup.sh unpacks Debian's arm64 packages by default.
pub const ARM64_ROOT: &str = "/var/lib/imager/arm64";

/// The host file of the image path `path` (absolute) inside `root`, every
/// symbolic link resolved there: what a `host` line of the skeleton copies.
pub fn host_file(root: &Path, path: &Path) -> Result<PathBuf> {
    let tree = Tree { root };
    Ok(tree.host(&tree.canonical(path)?))
}

/// Where `arch`'s libraries are looked for after the object's own paths:
/// its Debian multiarch directories, then the plain ones.
pub fn default_search(arch: contract::Arch) -> [String; 4] {
    let triplet = arch.spec().multiarch;
    [
        format!("/usr/lib/{triplet}"),
        format!("/lib/{triplet}"),
        "/usr/lib".into(),
        "/lib".into(),
    ]
}

/// The most symbolic links followed to resolve one path (the kernel's
/// limit, `MAXSYMLINKS`).
pub const MAX_LINKS: usize = 40;

/// A root directory the image's programs and libraries are read from:
/// paths are the image's (absolute), resolved inside the root.
struct Tree<'a> {
    root: &'a Path,
}

impl Tree<'_> {
    /// Where the file of image path `p` (already resolved) is on the host.
    fn host(&self, p: &Path) -> PathBuf {
        self.root.join(p.strip_prefix("/").unwrap_or(p))
    }

    /// The image path `p` with every symbolic link resolved inside the
    /// root, as realpath(3) resolves it in the root's own namespace (for
    /// the root `/`, `std::fs::canonicalize`'s answer).
    fn canonical(&self, p: &Path) -> Result<PathBuf> {
        use std::path::Component;
        ensure!(p.is_absolute(), "{} is not an absolute path", p.display());
        let mut done = PathBuf::from("/");
        let mut rest: std::collections::VecDeque<std::ffi::OsString> =
            p.iter().skip(1).map(|c| c.to_os_string()).collect();
        let mut links = 0;
        while let Some(c) = rest.pop_front() {
            match Path::new(&c).components().next() {
                None | Some(Component::CurDir) => continue,
                Some(Component::ParentDir) => {
                    done.pop();
                    continue;
                }
                _ => {}
            }
            let next = done.join(&c);
            let host = self.host(&next);
            let meta = std::fs::symlink_metadata(&host)
                .with_context(|| format!("resolving {}", p.display()))?;
            if !meta.file_type().is_symlink() {
                done = next;
                continue;
            }
            links += 1;
            ensure!(
                links <= MAX_LINKS,
                "resolving {}: more than {MAX_LINKS} symbolic links",
                p.display()
            );
            let target = std::fs::read_link(&host)
                .with_context(|| format!("reading the link {}", host.display()))?;
            if target.is_absolute() {
                done = PathBuf::from("/");
            }
            for t in target.iter().rev() {
                if t != "/" {
                    rest.push_front(t.to_os_string());
                }
            }
        }
        Ok(done)
    }

    #[cfg(test)]
    fn is_file(&self, p: &Path) -> bool {
        self.canonical(p).is_ok_and(|c| self.host(&c).is_file())
    }
}

/// What the dynamic loader needs to know about one ELF file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ElfDeps {
    /// `e_machine`: 62 for x86-64, 183 for AArch64 (`contract::arch`).
    pub machine: u16,
    pub interp: Option<String>,
    pub needed: Vec<String>,
    pub rpath: Vec<String>,
    pub runpath: Vec<String>,
}

const PT_LOAD: u32 = 1;
const PT_DYNAMIC: u32 = 2;
const PT_INTERP: u32 = 3;
const DT_NULL: u64 = 0;
const DT_NEEDED: u64 = 1;
const DT_STRTAB: u64 = 5;
const DT_STRSZ: u64 = 10;
const DT_RPATH: u64 = 15;
const DT_RUNPATH: u64 = 29;

/// Reads the interpreter, needed libraries and search paths of an ELF64
/// little-endian file. `None` when the bytes are not such a file or are
/// truncated or inconsistent.
pub fn parse_elf(b: &[u8]) -> Option<ElfDeps> {
    if b.get(0..4)? != b"\x7fELF" || *b.get(4)? != 2 || *b.get(5)? != 1 {
        return None;
    }
    let phoff = usize::try_from(read_u64(b, 0x20)?).ok()?;
    let phentsize = usize::from(read_u16(b, 0x36)?);
    let phnum = usize::from(read_u16(b, 0x38)?);
    if phentsize < 56 {
        return None;
    }
    // (type, offset, vaddr, filesz)
    let mut phdrs = Vec::with_capacity(phnum);
    for i in 0..phnum {
        let at = phoff.checked_add(i.checked_mul(phentsize)?)?;
        // Field offsets are small: `ph` keeps them from overflowing.
        let ph = b.get(at..)?;
        phdrs.push((
            read_u32(ph, 0)?,
            read_u64(ph, 8)?,
            read_u64(ph, 16)?,
            read_u64(ph, 32)?,
        ));
    }
    let mut deps = ElfDeps {
        machine: read_u16(b, 18)?,
        ..ElfDeps::default()
    };
    let slice = |off: u64, len: u64| -> Option<&[u8]> {
        let start = usize::try_from(off).ok()?;
        let end = start.checked_add(usize::try_from(len).ok()?)?;
        b.get(start..end)
    };
    if let Some(&(_, off, _, len)) = phdrs.iter().find(|p| p.0 == PT_INTERP) {
        let s = slice(off, len)?;
        let s = s.split(|c| *c == 0).next()?;
        deps.interp = Some(String::from_utf8(s.to_vec()).ok()?);
    }
    let Some(&(_, dyn_off, _, dyn_len)) = phdrs.iter().find(|p| p.0 == PT_DYNAMIC) else {
        return Some(deps); // static
    };
    let dynamic = slice(dyn_off, dyn_len)?;
    let mut entries = Vec::new();
    for e in dynamic.chunks_exact(16) {
        let tag = read_u64(e, 0)?;
        if tag == DT_NULL {
            break;
        }
        entries.push((tag, read_u64(e, 8)?));
    }
    let get = |t: u64| entries.iter().find(|e| e.0 == t).map(|e| e.1);
    let (strtab_vaddr, strsz) = (get(DT_STRTAB)?, get(DT_STRSZ)?);
    // The string table is addressed by virtual address: map it through the
    // PT_LOAD segment that contains it.
    let (_, seg_off, seg_vaddr, _) = *phdrs.iter().find(|p| {
        p.0 == PT_LOAD && p.2 <= strtab_vaddr && strtab_vaddr < p.2.saturating_add(p.3)
    })?;
    let strtab = slice(seg_off.checked_add(strtab_vaddr - seg_vaddr)?, strsz)?;
    let string = |off: u64| -> Option<String> {
        let s = strtab.get(usize::try_from(off).ok()?..)?;
        let s = s.split(|c| *c == 0).next()?;
        String::from_utf8(s.to_vec()).ok()
    };
    let split = |s: String| -> Vec<String> {
        s.split(':')
            .filter(|p| !p.is_empty())
            .map(String::from)
            .collect()
    };
    for &(tag, val) in &entries {
        match tag {
            DT_NEEDED => deps.needed.push(string(val)?),
            DT_RPATH => deps.rpath.extend(split(string(val)?)),
            DT_RUNPATH => deps.runpath.extend(split(string(val)?)),
            _ => {}
        }
    }
    Some(deps)
}

fn read_deps(path: &Path) -> Result<ElfDeps> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    parse_elf(&bytes).with_context(|| {
        format!(
            "{} is not a readable 64-bit little-endian ELF file",
            path.display()
        )
    })
}

/// One file of a closure: where it goes in the image and where its bytes
/// come from on the host.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ClosureFile {
    /// Absolute path in the image.
    pub path: String,
    /// The host file (symbolic links resolved).
    pub source: PathBuf,
    /// 0o755 when the host file is executable by its owner, 0o644 otherwise.
    pub mode: u32,
}

fn mode_of(path: &Path) -> Result<u32> {
    let m = std::fs::metadata(path)
        .with_context(|| format!("reading {}", path.display()))?
        .permissions()
        .mode();
    Ok(if m & 0o100 != 0 { 0o755 } else { 0o644 })
}

fn expand_origin(p: &str, origin: &Path) -> String {
    let o = origin.to_string_lossy();
    p.replace("${ORIGIN}", &o).replace("$ORIGIN", &o)
}

/// The closure of `program` (an absolute host path): the interpreter and
/// every shared library, not the program itself, sorted by image path.
/// `search` is [`default_search`] (another, for tests).
pub fn resolve(program: &Path, search: &[impl AsRef<str>]) -> Result<Vec<ClosureFile>> {
    resolve_in(Path::new("/"), program, search)
}

/// [`resolve`] inside `root`: `program` and every path the closure names
/// are the image's, read from under `root` with symbolic links resolved
/// there ([`Tree::canonical`]); a [`ClosureFile`]'s `source` is the host
/// path of its bytes.
pub fn resolve_in(
    root: &Path,
    program: &Path,
    search: &[impl AsRef<str>],
) -> Result<Vec<ClosureFile>> {
    let tree = Tree { root };
    let where_ = if root == Path::new("/") {
        "this host".to_string()
    } else {
        root.display().to_string()
    };
    let program_src = tree.host(&tree.canonical(program)?);
    let deps_of_program = read_deps(&program_src)?;
    let mut out: BTreeMap<String, ClosureFile> = BTreeMap::new();
    let mut interp_name = None;
    if let Some(interp) = &deps_of_program.interp {
        let src = tree
            .canonical(Path::new(interp))
            .map(|c| tree.host(&c))
            .with_context(|| {
                format!(
                    "the ELF interpreter {interp} of {} is not in {where_}",
                    program.display()
                )
            })?;
        interp_name = Path::new(interp)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned());
        out.insert(
            interp.clone(),
            ClosureFile {
                path: interp.clone(),
                mode: mode_of(&src)?,
                source: src,
            },
        );
    }
    // (needed name, needed by, RPATHs inherited from the loaders)
    let mut queue: Vec<(String, PathBuf, ElfDeps, Vec<String>)> = Vec::new();
    let mut seen: BTreeSet<String> = BTreeSet::new();
    let push = |queue: &mut Vec<_>, by: &Path, deps: &ElfDeps, inherited: &[String]| {
        let origin = by.parent().unwrap_or(Path::new("/"));
        let mut rpaths: Vec<String> = inherited.to_vec();
        if deps.runpath.is_empty() {
            rpaths.extend(deps.rpath.iter().map(|p| expand_origin(p, origin)));
        }
        for n in deps.needed.iter().rev() {
            queue.push((n.clone(), by.to_path_buf(), deps.clone(), rpaths.clone()));
        }
    };
    push(&mut queue, program, &deps_of_program, &[]);
    while let Some((name, by, by_deps, rpaths)) = queue.pop() {
        if interp_name.as_deref() == Some(name.as_str()) || !seen.insert(name.clone()) {
            continue;
        }
        ensure!(
            !name.is_empty() && name != "." && name != "..",
            "{} needs a library with the invalid name {name:?}",
            by.display()
        );
        let origin = by.parent().unwrap_or(Path::new("/"));
        let dirs: Vec<String> = if name.contains('/') {
            Vec::new()
        } else if by_deps.runpath.is_empty() {
            rpaths.clone()
        } else {
            by_deps
                .runpath
                .iter()
                .map(|p| expand_origin(p, origin))
                .collect()
        };
        let candidates: Vec<PathBuf> = if name.contains('/') {
            vec![PathBuf::from(&name)]
        } else {
            dirs.iter()
                .map(String::as_str)
                .chain(search.iter().map(AsRef::as_ref))
                .map(|d| Path::new(d).join(&name))
                .collect()
        };
        // The first candidate that is a file, and its resolved path.
        let hit = candidates.iter().find_map(|c| {
            let real = tree.canonical(c).ok()?;
            tree.host(&real).is_file().then_some((c, real))
        });
        let Some((found, real)) = hit else {
            let mut looked: Vec<String> = dirs.clone();
            looked.extend(search.iter().map(|s| s.as_ref().to_string()));
            bail!(
                "{name} needed by {} not found in {}: install the package that provides it",
                by.display(),
                looked.join(", ")
            );
        };
        let real = tree.host(&real);
        let dir = tree
            .canonical(found.parent().unwrap_or(Path::new("/")))
            .with_context(|| format!("resolving the directory of {}", found.display()))?;
        let file_name = Path::new(&name)
            .file_name()
            .with_context(|| format!("{name} has no file name"))?;
        let image_path = dir.join(file_name).to_string_lossy().into_owned();
        let deps = read_deps(&real)?;
        // The loader skips a library of another machine; one of ours would
        // be a broken root (another architecture's packages mixed in).
        ensure!(
            deps.machine == deps_of_program.machine,
            "{} (for {name}, needed by {}) is for ELF machine {}, {} for {}: the libraries of \
             {where_} are not all of one architecture",
            real.display(),
            by.display(),
            deps.machine,
            program.display(),
            deps_of_program.machine
        );
        out.insert(
            image_path.clone(),
            ClosureFile {
                path: image_path,
                mode: mode_of(&real)?,
                source: real.clone(),
            },
        );
        push(&mut queue, found, &deps, &rpaths);
    }
    Ok(out.into_values().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mkfs_xfs_closure_has_libc_and_the_interpreter() {
        let prog = Path::new("/usr/sbin/mkfs.xfs");
        if !prog.is_file() {
            panic!("/usr/sbin/mkfs.xfs is missing: run scripts/setup.sh (xfsprogs)");
        }
        let deps = read_deps(prog).unwrap();
        assert_eq!(deps.interp.as_deref(), Some("/lib64/ld-linux-x86-64.so.2"));
        assert!(deps.needed.iter().any(|n| n == "libc.so.6"), "{deps:?}");
        let c = resolve(prog, &default_search(contract::Arch::Amd64)).unwrap();
        let paths: Vec<&str> = c.iter().map(|f| f.path.as_str()).collect();
        assert!(paths.contains(&"/lib64/ld-linux-x86-64.so.2"), "{paths:?}");
        assert!(paths.iter().any(|p| p.ends_with("/libc.so.6")), "{paths:?}");
        assert!(
            paths.iter().any(|p| p.ends_with("/libuuid.so.1")),
            "{paths:?}"
        );
        // Sorted, no duplicates, the loader only once, regular files only.
        let mut sorted = paths.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted, paths);
        assert_eq!(
            paths
                .iter()
                .filter(|p| p.ends_with("ld-linux-x86-64.so.2"))
                .count(),
            1
        );
        for f in &c {
            assert!(f.source.is_file(), "{f:?}");
            assert!(std::fs::symlink_metadata(&f.source).unwrap().is_file());
            assert!(f.path.starts_with('/'));
        }
        // Same answer twice.
        assert_eq!(
            c,
            resolve(prog, &default_search(contract::Arch::Amd64)).unwrap()
        );
    }

    /// In the root `/` the tree resolves every path as realpath(3) does.
    #[test]
    fn the_tree_resolves_as_realpath_does_on_this_host() {
        let tree = Tree {
            root: Path::new("/"),
        };
        let mut paths: Vec<PathBuf> = [
            "/usr/sbin/mkfs.xfs",
            "/lib64/ld-linux-x86-64.so.2",
            "/lib/x86_64-linux-gnu/libc.so.6",
            "/usr/../usr/lib/./x86_64-linux-gnu/libuuid.so.1",
            "/sbin/../lib",
        ]
        .iter()
        .map(PathBuf::from)
        .collect();
        paths.extend(
            resolve(
                Path::new("/usr/sbin/mkfs.xfs"),
                &default_search(contract::Arch::Amd64),
            )
            .unwrap()
            .into_iter()
            .map(|f| PathBuf::from(f.path)),
        );
        for p in &paths {
            assert_eq!(
                tree.canonical(p).unwrap(),
                std::fs::canonicalize(p).unwrap(),
                "{}",
                p.display()
            );
        }
    }

    /// In another root, links (absolute or relative, `..` past the top, a
    /// loop) never leave it.
    #[test]
    fn links_stay_inside_another_root() {
        use std::os::unix::fs::symlink;
        let dir = tempfile::tempdir().unwrap();
        let r = &dir.path().join("root");
        // A file beside the root, which a link climbing out would reach.
        std::fs::write(dir.path().join("outside"), b"host").unwrap();
        std::fs::create_dir_all(r.join("usr/lib/t")).unwrap();
        std::fs::write(r.join("usr/lib/t/libx.so.1"), b"x").unwrap();
        symlink("usr/lib", r.join("lib")).unwrap();
        symlink("/usr/lib/t/libx.so.1", r.join("usr/lib/abs.so")).unwrap();
        symlink("../../../outside", r.join("usr/lib/up")).unwrap();
        symlink(dir.path().join("outside"), r.join("usr/lib/host")).unwrap();
        symlink("loop", r.join("loop")).unwrap();
        let tree = Tree { root: r };
        let c = |p: &str| tree.canonical(Path::new(p));
        assert_eq!(
            c("/lib/t/libx.so.1").unwrap(),
            Path::new("/usr/lib/t/libx.so.1")
        );
        assert_eq!(c("/lib/abs.so").unwrap(), Path::new("/usr/lib/t/libx.so.1"));
        assert!(tree.is_file(Path::new("/lib/abs.so")));
        // The file beside the root is not the root's: there is none there,
        // by a relative link or by its absolute host path.
        for link in ["/usr/lib/up", "/usr/lib/host"] {
            assert!(c(link).is_err(), "{link}");
            assert!(!tree.is_file(Path::new(link)), "{link}");
        }
        assert!(c("/../../lib/t/libx.so.1").is_ok());
        let e = format!("{:#}", c("/loop").unwrap_err());
        assert!(
            e.contains(&format!("more than {MAX_LINKS} symbolic links")),
            "{e}"
        );
    }

    /// mkfs.xfs of Debian's arm64 packages (scripts/setup.sh unpacks them)
    /// resolves inside their root: arm64's loader and libraries, never the
    /// host's.
    #[test]
    fn mkfs_xfs_of_debians_arm64_packages_resolves_inside_their_root() {
        let root = host_root(contract::Arch::Arm64);
        assert!(
            root.join("usr/sbin/mkfs.xfs").is_file(),
            "{}: no arm64 mkfs.xfs: run scripts/setup.sh",
            root.display()
        );
        let search = default_search(contract::Arch::Arm64);
        let c = resolve_in(&root, Path::new("/usr/sbin/mkfs.xfs"), &search).unwrap();
        let paths: Vec<&str> = c.iter().map(|f| f.path.as_str()).collect();
        assert!(paths.contains(&"/lib/ld-linux-aarch64.so.1"), "{paths:?}");
        for lib in [
            "libc.so.6",
            "libuuid.so.1",
            "libblkid.so.1",
            "libinih.so.1",
            "liburcu.so.8",
        ] {
            assert!(
                paths.contains(&format!("/usr/lib/aarch64-linux-gnu/{lib}").as_str()),
                "{lib}: {paths:?}"
            );
        }
        for f in &c {
            assert!(f.source.starts_with(&root), "{f:?}");
            assert!(
                std::fs::symlink_metadata(&f.source).unwrap().is_file(),
                "{f:?}"
            );
            let b = std::fs::read(&f.source).unwrap();
            assert_eq!(read_u16(&b, 18), Some(183), "{f:?} is not an aarch64 ELF");
        }
        // The host's own search finds none of them there.
        assert!(
            resolve_in(
                &root,
                Path::new("/usr/sbin/mkfs.xfs"),
                &default_search(contract::Arch::Amd64)
            )
            .is_err()
        );
    }

    #[test]
    fn a_static_binary_has_an_empty_closure() {
        // ldconfig is static on Debian.
        let p = Path::new("/sbin/ldconfig");
        if p.is_file() && read_deps(p).unwrap().interp.is_none() {
            assert!(
                resolve(p, &default_search(contract::Arch::Amd64))
                    .unwrap()
                    .is_empty()
            );
        }
    }

    #[test]
    fn a_missing_library_names_it_the_needer_and_the_places_searched() {
        let empty = tempfile::tempdir().unwrap();
        let dir = empty.path().to_str().unwrap();
        let err = resolve(Path::new("/usr/sbin/mkfs.xfs"), &[dir]).unwrap_err();
        let e = format!("{err:#}");
        assert!(
            e.contains("needed by /usr/sbin/mkfs.xfs not found in"),
            "{e}"
        );
        assert!(e.contains(dir), "{e}");
        assert!(e.contains("install the package that provides it"), "{e}");
    }

    #[test]
    fn garbage_is_not_an_elf_and_does_not_panic() {
        assert_eq!(parse_elf(b""), None);
        assert_eq!(parse_elf(b"\x7fELF\x02\x01"), None);
        let mut b = std::fs::read("/usr/sbin/mkfs.xfs").unwrap();
        b.truncate(200);
        let _ = parse_elf(&b);
        for cut in [64, 1000, 5000] {
            let full = std::fs::read("/usr/sbin/mkfs.xfs").unwrap();
            let _ = parse_elf(&full[..cut.min(full.len())]);
        }
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("x");
        std::fs::write(&f, b"#!/bin/sh\n").unwrap();
        let e = format!(
            "{:#}",
            resolve(&f, &default_search(contract::Arch::Amd64)).unwrap_err()
        );
        assert!(e.contains("not a readable 64-bit"), "{e}");
    }

    #[test]
    fn origin_is_expanded() {
        assert_eq!(
            expand_origin("$ORIGIN/../lib:${ORIGIN}", Path::new("/opt/x/bin")),
            "/opt/x/bin/../lib:/opt/x/bin"
        );
    }
}
