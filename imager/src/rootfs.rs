//! The root filesystem: a zstd squashfs written with backhand.
//!
//! Its contents are a skeleton directory (optional), extra empty directories
//! and extra files pushed by the builder (the runtime at
//! [`contract::paths::ROOTFS_INIT`], os-release at
//! [`contract::paths::ROOTFS_OS_RELEASE`]...). Pushed files win over the
//! skeleton's. Parent directories are created as needed (0755).
//!
//! Deterministic: nodes in path order, uid/gid 0, every mtime (and the
//! superblock's) SOURCE_DATE_EPOCH, and the skeleton's permissions
//! normalised as git does (directories 0755, files 0755 when the owner may
//! execute them, 0644 otherwise), so that the umask of the checkout does not
//! leak into the image. The root directory's own mtime is 0: backhand has no
//! way to set it.

pub use crate::disk::FatSource as Source;

use crate::io::{AtomicFile, sha256_file};
use anyhow::{Context, Result, bail, ensure};
use backhand::compression::{CompressionOptions, Compressor};
use backhand::{FilesystemCompressor, FilesystemWriter, NodeHeader};
use std::collections::BTreeMap;
use std::io::{Seek, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// Default zstd level of the squashfs blocks.
pub const DEFAULT_LEVEL: i32 = 15;

/// A file the builder adds to the root filesystem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RootfsFile {
    /// Absolute path in the image: `/usr/bin/machined`.
    pub path: String,
    pub source: Source,
    /// Permission bits (0o7777 at most).
    pub mode: u32,
}

impl RootfsFile {
    pub fn new(path: impl Into<String>, source: Source, mode: u32) -> RootfsFile {
        RootfsFile {
            path: path.into(),
            source,
            mode,
        }
    }
}

/// What goes into the root filesystem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RootfsSpec {
    /// A directory whose tree is copied (regular files, directories and
    /// symbolic links only).
    pub skeleton: Option<PathBuf>,
    /// Extra empty directories (absolute paths in the image).
    /// Directories to create, with their modes (e.g. `/tmp` 0o1777).
    pub dirs: Vec<(String, u32)>,
    /// Extra files; they replace skeleton files of the same path.
    pub files: Vec<RootfsFile>,
    /// SOURCE_DATE_EPOCH.
    pub epoch: u64,
    /// zstd level, 1 to 22.
    pub level: i32,
}

#[derive(Debug, Clone)]
enum Node {
    Dir(u32),
    File(Source, u32),
    Symlink(PathBuf),
}

/// `/usr/bin/x` or `usr/bin/x` to `usr/bin/x`, refusing `.`, `..`, empty
/// components and the root itself.
fn normalize(path: &str) -> Result<String> {
    let rel = path.trim_start_matches('/');
    ensure!(
        !rel.is_empty()
            && rel
                .split('/')
                .all(|c| !c.is_empty() && c != "." && c != ".." && !c.contains('\0')),
        "invalid path {path:?} in the root filesystem: use an absolute path like /usr/bin/x \
         without `.`, `..` or empty components"
    );
    Ok(rel.to_string())
}

fn add_parents(nodes: &mut BTreeMap<String, Node>, path: &str) -> Result<()> {
    let mut at = 0;
    while let Some(i) = path[at..].find('/') {
        let parent = &path[..at + i];
        match nodes.get(parent) {
            None => {
                nodes.insert(parent.to_string(), Node::Dir(0o755));
            }
            Some(Node::Dir(_)) => {}
            Some(_) => bail!(
                "/{parent} is a file in the root filesystem, but /{path} needs it to be a directory"
            ),
        }
        at += i + 1;
    }
    Ok(())
}

fn walk_skeleton(root: &Path, nodes: &mut BTreeMap<String, Node>) -> Result<()> {
    ensure!(
        root.is_dir(),
        "root filesystem skeleton {} is not a directory: fix rootfs.skeleton in the profile",
        root.display()
    );
    for entry in walkdir::WalkDir::new(root)
        .min_depth(1)
        .follow_links(false)
        .sort_by_file_name()
    {
        let entry = entry.with_context(|| format!("walking {}", root.display()))?;
        let rel = entry
            .path()
            .strip_prefix(root)
            .context("walking the skeleton")?
            .to_str()
            .with_context(|| format!("{} is not UTF-8", entry.path().display()))?
            .to_string();
        let ft = entry.file_type();
        let node = if ft.is_dir() {
            Node::Dir(0o755)
        } else if ft.is_file() {
            let mode = entry
                .metadata()
                .with_context(|| format!("reading {}", entry.path().display()))?
                .permissions()
                .mode();
            let mode = if mode & 0o100 != 0 { 0o755 } else { 0o644 };
            Node::File(Source::File(entry.path().to_path_buf()), mode)
        } else if ft.is_symlink() {
            let target = std::fs::read_link(entry.path())
                .with_context(|| format!("reading the link {}", entry.path().display()))?;
            Node::Symlink(target)
        } else {
            bail!(
                "{} in the skeleton is neither a file, a directory nor a symbolic link: \
                 remove it (device nodes are made at run time)",
                entry.path().display()
            );
        };
        nodes.insert(rel, node);
    }
    Ok(())
}

/// The nodes of the image, by path (parents sort before their children).
fn plan(spec: &RootfsSpec) -> Result<BTreeMap<String, Node>> {
    let mut nodes = BTreeMap::new();
    if let Some(skel) = &spec.skeleton {
        walk_skeleton(skel, &mut nodes)?;
    }
    for (d, mode) in &spec.dirs {
        ensure!(
            *mode <= 0o7777,
            "mode {mode:o} of {d} has more than permission bits"
        );
        let d = normalize(d)?;
        add_parents(&mut nodes, &d)?;
        match nodes.get(&d) {
            None | Some(Node::Dir(_)) => {
                nodes.insert(d, Node::Dir(*mode));
            }
            Some(_) => bail!("/{d} is asked for as a directory but is a file in the skeleton"),
        }
    }
    for f in &spec.files {
        ensure!(
            f.mode <= 0o7777,
            "mode {:o} of {} has more than permission bits",
            f.mode,
            f.path
        );
        let p = normalize(&f.path)?;
        add_parents(&mut nodes, &p)?;
        if let Some(Node::Dir(_)) = nodes.get(&p) {
            bail!("/{p} is a directory, it cannot be replaced by a file");
        }
        if let Source::File(src) = &f.source {
            ensure!(
                src.is_file(),
                "{} (for /{p} in the root filesystem) is not a file",
                src.display()
            );
        }
        nodes.insert(p, Node::File(f.source.clone(), f.mode));
    }
    Ok(nodes)
}

/// Builds the squashfs at `dest`, atomically. Returns its hex SHA-256 and
/// size.
pub fn build_rootfs(dest: &Path, spec: &RootfsSpec) -> Result<(String, u64)> {
    ensure!(
        (1..=22).contains(&spec.level),
        "squashfs zstd level {} is out of range: use 1 to 22",
        spec.level
    );
    let nodes = plan(spec)?;
    let mtime = u32::try_from(spec.epoch).unwrap_or(u32::MAX);
    let header = |mode: u32| NodeHeader::new(mode as u16, 0, 0, mtime);

    let mut fs = FilesystemWriter::default();
    fs.set_time(mtime);
    fs.set_root_mode(0o755);
    fs.set_root_uid(0);
    fs.set_root_gid(0);
    fs.set_only_root_id();
    let compressor = FilesystemCompressor::new(
        Compressor::Zstd,
        Some(CompressionOptions::Zstd(backhand::compression::Zstd {
            compression_level: spec.level as u32,
        })),
    )
    .context("setting up zstd for the squashfs")?;
    fs.set_compressor(compressor);

    for (path, node) in &nodes {
        let res = match node {
            Node::Dir(mode) => fs.push_dir(path, header(*mode)),
            Node::File(Source::File(src), mode) => {
                fs.push_file_from_path(src.clone(), path, header(*mode))
            }
            Node::File(Source::Bytes(b), mode) => {
                fs.push_file(std::io::Cursor::new(&b[..]), path, header(*mode))
            }
            Node::File(Source::Dir, mode) => fs.push_dir(path, header(*mode)),
            Node::Symlink(target) => fs.push_symlink(target.clone(), path, header(0o777)),
        };
        res.with_context(|| format!("adding /{path} to the root filesystem"))?;
    }

    let mut out = AtomicFile::create(dest)?;
    {
        let f = out.file();
        fs.write(&mut *f)
            .with_context(|| format!("writing the squashfs {}", dest.display()))?;
        f.flush()?;
        f.rewind()?;
    }
    let (sha, size) = sha256_file(out.path())?;
    out.commit()?;
    Ok((sha, size))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::disk::testutil::{run, tool};
    use std::process::Command;

    fn spec(dir: &Path) -> RootfsSpec {
        let skel = dir.join("skel");
        std::fs::create_dir_all(skel.join("etc/ssl")).unwrap();
        std::fs::create_dir_all(skel.join("usr/bin")).unwrap();
        std::fs::write(skel.join("etc/hostname"), "skeleton\n").unwrap();
        std::fs::write(skel.join("etc/ssl/ca.pem"), "pem\n").unwrap();
        std::fs::write(skel.join("usr/bin/machined"), "old").unwrap();
        std::fs::write(skel.join("usr/bin/tool"), "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(
            skel.join("usr/bin/tool"),
            std::fs::Permissions::from_mode(0o700),
        )
        .unwrap();
        std::fs::set_permissions(
            skel.join("etc/hostname"),
            std::fs::Permissions::from_mode(0o600),
        )
        .unwrap();
        std::os::unix::fs::symlink("../usr/lib/os-release", skel.join("etc/os-release")).unwrap();
        let machined = dir.join("machined");
        let big: Vec<u8> = (0..700_000u32).map(|i| (i % 253) as u8).collect();
        std::fs::write(&machined, big).unwrap();
        RootfsSpec {
            skeleton: Some(skel),
            dirs: vec![
                ("/var".into(), 0o755),
                ("/system/state".into(), 0o700),
                ("/usr".into(), 0o755),
                ("/tmp".into(), 0o1777),
            ],
            files: vec![
                RootfsFile::new(contract::paths::ROOTFS_INIT, Source::File(machined), 0o755),
                RootfsFile::new(
                    contract::paths::ROOTFS_OS_RELEASE,
                    Source::Bytes(b"NAME=Test\n".to_vec()),
                    0o644,
                ),
            ],
            epoch: 1_700_000_000,
            level: 3,
        }
    }

    #[test]
    fn unsquashfs_lists_and_extracts_it() {
        let dir = tempfile::tempdir().unwrap();
        let spec = spec(dir.path());
        let img = dir.path().join("rootfs.sqsh");
        let (sha, size) = build_rootfs(&img, &spec).unwrap();
        assert_eq!((sha, size), sha256_file(&img).unwrap());

        let unsq = tool("unsquashfs", "squashfs-tools");
        let out = run(Command::new(&unsq).args(["-lln", "-UTC"]).arg(&img));
        let text = String::from_utf8_lossy(&out.stdout);
        let line = |p: &str| {
            text.lines()
                .find(|l| {
                    l.ends_with(&format!("squashfs-root{p}"))
                        || l.contains(&format!("squashfs-root{p} "))
                })
                .unwrap_or_else(|| panic!("{p} not in\n{text}"))
                .to_string()
        };
        assert!(
            line("/usr/bin/machined").starts_with("-rwxr-xr-x 0/0"),
            "{text}"
        );
        assert!(line("/usr/lib/os-release").starts_with("-rw-r--r-- 0/0"));
        assert!(line("/etc/hostname").starts_with("-rw-r--r-- 0/0"));
        assert!(line("/usr/bin/tool").starts_with("-rwxr-xr-x 0/0"));
        assert!(line("/etc/os-release").starts_with("lrwxrwxrwx 0/0"));
        assert!(line("/system/state").starts_with("drwx------ 0/0"));
        assert!(line("/tmp").starts_with("drwxrwxrwt 0/0"), "{text}");
        assert!(line("/var").starts_with("drwxr-xr-x 0/0"));
        assert!(
            line("/usr/bin/machined").contains("2023-11-14 22:13"),
            "{text}"
        );

        let x = dir.path().join("x");
        run(Command::new(&unsq)
            .arg("-no-xattrs")
            .arg("-d")
            .arg(&x)
            .arg(&img));
        let machined = std::fs::read(x.join("usr/bin/machined")).unwrap();
        assert_eq!(machined.len(), 700_000);
        assert_eq!(
            machined,
            std::fs::read(dir.path().join("machined")).unwrap()
        );
        assert_eq!(
            std::fs::read(x.join("usr/lib/os-release")).unwrap(),
            b"NAME=Test\n"
        );
        assert_eq!(std::fs::read(x.join("etc/ssl/ca.pem")).unwrap(), b"pem\n");
        let mode = |p: &str| {
            std::fs::symlink_metadata(x.join(p))
                .unwrap()
                .permissions()
                .mode()
                & 0o7777
        };
        assert_eq!(mode("usr/bin/machined"), 0o755);
        assert_eq!(mode("usr/lib/os-release"), 0o644);
        assert_eq!(
            std::fs::read_link(x.join("etc/os-release")).unwrap(),
            Path::new("../usr/lib/os-release")
        );
        assert!(x.join("system/state").is_dir());

        let stat = run(Command::new(&unsq).arg("-s").arg(&img));
        let s = String::from_utf8_lossy(&stat.stdout);
        assert!(s.contains("Compression zstd"), "{s}");
    }

    #[test]
    fn same_inputs_same_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let spec = spec(dir.path());
        let a = dir.path().join("a.sqsh");
        let b = dir.path().join("b.sqsh");
        let ra = build_rootfs(&a, &spec).unwrap();
        assert_eq!(ra, build_rootfs(&b, &spec).unwrap());
        assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
    }

    #[test]
    fn clear_errors() {
        let dir = tempfile::tempdir().unwrap();
        let base = spec(dir.path());
        let mut s = base.clone();
        s.files
            .push(RootfsFile::new("/usr/../etc", Source::Bytes(vec![]), 0o644));
        let e = format!("{:#}", build_rootfs(&dir.path().join("x"), &s).unwrap_err());
        assert!(e.contains("invalid path"), "{e}");
        let mut s = base.clone();
        s.files.push(RootfsFile::new(
            "/etc/hostname/x",
            Source::Bytes(vec![]),
            0o644,
        ));
        let e = format!("{:#}", build_rootfs(&dir.path().join("x"), &s).unwrap_err());
        assert!(e.contains("/etc/hostname is a file"), "{e}");
        let mut s = base;
        s.skeleton = Some(dir.path().join("missing"));
        let e = format!("{:#}", build_rootfs(&dir.path().join("x"), &s).unwrap_err());
        assert!(e.contains("rootfs.skeleton"), "{e}");
        assert!(!dir.path().join("x").exists());
    }
}
