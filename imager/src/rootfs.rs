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
//!
//! The blocks are compressed on every core ([`parallel`]); the bytes are
//! those of backhand's own single-threaded writer, whatever the number of
//! threads. Given a cache directory, blocks compressed by earlier builds
//! are taken from it ([`pack`]): the same bytes again, and a rebuild after
//! a change compresses only the blocks that changed.

pub mod pack;
mod parallel;
pub use parallel::Stats as CompressionStats;

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

/// Block size of the squashfs: 128 KiB, backhand's and mksquashfs's
/// default.
pub const BLOCK_SIZE: u32 = backhand::DEFAULT_BLOCK_SIZE;

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

/// Builds the squashfs at `dest`, atomically, compressing on every core,
/// with the blocks of earlier builds kept in `cache` (a directory; none:
/// every block compressed). Returns its hex SHA-256 and size.
pub fn build_rootfs(dest: &Path, spec: &RootfsSpec, cache: Option<&Path>) -> Result<(String, u64)> {
    let (sha, size, _) = build_rootfs_threads(dest, spec, threads(), cache)?;
    Ok((sha, size))
}

/// The compressing threads [`build_rootfs`] uses: one per core.
pub fn threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// [`build_rootfs`] with `threads` compressing threads, and how the blocks
/// were compressed. `threads == 0`: backhand's own compressor alone, on
/// this thread (the reference the parallel writer must equal; no cache).
pub fn build_rootfs_threads(
    dest: &Path,
    spec: &RootfsSpec,
    threads: usize,
    cache: Option<&Path>,
) -> Result<(String, u64, CompressionStats)> {
    build(dest, spec, threads, cache, |_| {})
}

/// The files of `nodes` whose blocks the reader compresses ahead, in any
/// order ([`parallel::run`] sorts them as backhand does).
type Prediction<'a> = Vec<(&'a str, &'a Source)>;

/// [`build_rootfs_threads`]; `predict` may change what the reader is told
/// (the tests make it wrong, which must cost only time).
fn build(
    dest: &Path,
    spec: &RootfsSpec,
    threads: usize,
    cache: Option<&Path>,
    predict: impl FnOnce(&mut Prediction<'_>),
) -> Result<(String, u64, CompressionStats)> {
    ensure!(
        (1..=22).contains(&spec.level),
        "squashfs zstd level {} is out of range: use 1 to 22",
        spec.level
    );
    let nodes = plan(spec)?;
    let mtime = u32::try_from(spec.epoch).unwrap_or(u32::MAX);
    let header = |mode: u32| NodeHeader::new(mode as u16, 0, 0, mtime);

    let mut fs = FilesystemWriter::default();
    fs.set_block_size(BLOCK_SIZE);
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
    if threads > 0 {
        fs.set_kind(backhand::kind::Kind::new_v4(&parallel::PARALLEL_ZSTD));
    }

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
    let stats = {
        let f = out.file();
        let (written, stats) = if threads > 0 {
            let mut files: Prediction<'_> = nodes
                .iter()
                .filter_map(|(path, node)| match node {
                    Node::File(src @ (Source::File(_) | Source::Bytes(_)), _) => {
                        Some((path.as_str(), src))
                    }
                    _ => None,
                })
                .collect();
            predict(&mut files);
            parallel::run(&files, BLOCK_SIZE, spec.level, threads, cache, || {
                fs.write(&mut *f)
            })
        } else {
            (fs.write(&mut *f), CompressionStats::default())
        };
        written.with_context(|| format!("writing the squashfs {}", dest.display()))?;
        f.flush()?;
        f.rewind()?;
        stats
    };
    let (sha, size) = sha256_file(out.path())?;
    out.commit()?;
    Ok((sha, size, stats))
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
        let (sha, size) = build_rootfs(&img, &spec, None).unwrap();
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
        let ra = build_rootfs(&a, &spec, None).unwrap();
        assert_eq!(ra, build_rootfs(&b, &spec, None).unwrap());
        assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
    }

    #[test]
    fn clear_errors() {
        let dir = tempfile::tempdir().unwrap();
        let base = spec(dir.path());
        let mut s = base.clone();
        s.files
            .push(RootfsFile::new("/usr/../etc", Source::Bytes(vec![]), 0o644));
        let e = format!(
            "{:#}",
            build_rootfs(&dir.path().join("x"), &s, None).unwrap_err()
        );
        assert!(e.contains("invalid path"), "{e}");
        let mut s = base.clone();
        s.files.push(RootfsFile::new(
            "/etc/hostname/x",
            Source::Bytes(vec![]),
            0o644,
        ));
        let e = format!(
            "{:#}",
            build_rootfs(&dir.path().join("x"), &s, None).unwrap_err()
        );
        assert!(e.contains("/etc/hostname is a file"), "{e}");
        let mut s = base;
        s.skeleton = Some(dir.path().join("missing"));
        let e = format!(
            "{:#}",
            build_rootfs(&dir.path().join("x"), &s, None).unwrap_err()
        );
        assert!(e.contains("rootfs.skeleton"), "{e}");
        assert!(!dir.path().join("x").exists());
    }

    const BS: usize = BLOCK_SIZE as usize;

    /// `len` bytes that zstd compresses, but not to nothing.
    fn text(seed: u64, len: usize) -> Vec<u8> {
        const WORDS: [&[u8]; 8] = [
            b"squashfs ",
            b"block ",
            b"zstd ",
            b"fragment ",
            b"verity\n",
            b"root ",
            b"machined ",
            b"0123 ",
        ];
        let mut x = seed.wrapping_add(1);
        let mut v = Vec::with_capacity(len + 16);
        while v.len() < len {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            v.extend_from_slice(WORDS[(x >> 61) as usize]);
            if x & 0x1f00 == 0 {
                v.extend_from_slice(&x.to_le_bytes());
            }
        }
        v.truncate(len);
        v
    }

    /// `len` bytes zstd cannot compress (stored uncompressed).
    fn noise(seed: u64, len: usize) -> Vec<u8> {
        let mut x = seed | 1;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 24) as u8
            })
            .collect()
    }

    /// A tree with many files larger than a block (several blocks, whole
    /// blocks, a last partial block, holes, a zero tail, incompressible
    /// blocks, a duplicate, one from memory), many small files packed into
    /// several fragment blocks, and names that sort differently as strings
    /// and as paths (`usr/bin/x`, `usr/bin-x`). Returns the spec, the
    /// staging tree mksquashfs gets (the same files), and the number of
    /// data blocks backhand compresses (non-zero blocks of files of a block
    /// or more).
    fn many_blocks(dir: &Path) -> (RootfsSpec, PathBuf, u64) {
        let skel = dir.join("skel");
        let mut files: Vec<(String, Vec<u8>)> = Vec::new();
        let mut blocks = 0u64;
        for i in 0..12u64 {
            let len = BS + (i as usize) * BS / 2 + 777 * i as usize;
            files.push((format!("big/f{i:02}"), text(i, len)));
            blocks += len.div_ceil(BS) as u64;
        }
        files.push(("big/exact3".into(), text(100, 3 * BS)));
        blocks += 3;
        let mut holes = text(101, BS);
        holes.extend(std::iter::repeat_n(0u8, BS));
        holes.extend(text(102, 100));
        files.push(("big/holes".into(), holes));
        blocks += 2; // the zero block is a hole
        let mut tail = text(103, BS);
        tail.extend(std::iter::repeat_n(0u8, 5000));
        files.push(("big/zero-tail".into(), tail));
        blocks += 1; // the all-zero last block is a hole too
        files.push(("big/noise".into(), noise(104, 2 * BS + 9)));
        blocks += 3;
        files.push(("big/z-dup-of-f05".into(), files[5].1.clone()));
        blocks += files[5].1.len().div_ceil(BS) as u64;
        files.push(("usr/bin/x".into(), text(105, 2 * BS + 1)));
        blocks += 3;
        files.push(("usr/bin-x".into(), text(106, BS + 5)));
        blocks += 2;
        files.push(("usr/bin/z".into(), text(107, 300)));
        files.push(("small/empty".into(), Vec::new()));
        for i in 0..120u64 {
            let len = 1 + (i as usize * 997) % 9000;
            files.push((format!("small/s{i:03}"), text(200 + i, len)));
        }
        for (p, b) in &files {
            let f = skel.join(p);
            std::fs::create_dir_all(f.parent().unwrap()).unwrap();
            std::fs::write(&f, b).unwrap();
            std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        }
        let blob = text(300, 3 * BS + 3);
        blocks += 4;
        let stage = dir.join("stage");
        run(Command::new("cp").arg("-a").arg(&skel).arg(&stage));
        std::fs::write(stage.join("usr/lib/blob"), &blob)
            .or_else(|_| {
                std::fs::create_dir_all(stage.join("usr/lib"))?;
                std::fs::write(stage.join("usr/lib/blob"), &blob)
            })
            .unwrap();
        for d in walkdir::WalkDir::new(&stage) {
            let d = d.unwrap();
            if d.file_type().is_dir() {
                std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
            }
        }
        std::fs::set_permissions(
            stage.join("usr/lib/blob"),
            std::fs::Permissions::from_mode(0o644),
        )
        .unwrap();
        let spec = RootfsSpec {
            skeleton: Some(skel),
            dirs: Vec::new(),
            files: vec![RootfsFile::new("/usr/lib/blob", Source::Bytes(blob), 0o644)],
            epoch: 1_700_000_000,
            level: 6,
        };
        (spec, stage, blocks)
    }

    /// Fragment blocks of an image, as unsquashfs counts them.
    fn fragments(img: &Path) -> u64 {
        let out = run(Command::new(tool("unsquashfs", "squashfs-tools"))
            .arg("-s")
            .arg(img));
        let s = String::from_utf8_lossy(&out.stdout);
        s.lines()
            .find_map(|l| l.strip_prefix("Number of fragments "))
            .unwrap_or_else(|| panic!("no fragment count in\n{s}"))
            .trim()
            .parse()
            .unwrap()
    }

    #[test]
    fn parallel_compression_same_bytes_whatever_the_thread_count() {
        let dir = tempfile::tempdir().unwrap();
        let (spec, _, data_blocks) = many_blocks(dir.path());
        let reference = dir.path().join("one-thread.sqsh");
        let (sha, size, none) = build_rootfs_threads(&reference, &spec, 0, None).unwrap();
        assert_eq!(none, CompressionStats::default());
        let frags = fragments(&reference);
        assert!(
            frags >= 3,
            "{frags} fragment blocks: the test needs several"
        );
        let want = std::fs::read(&reference).unwrap();
        for threads in [1, 2, 4] {
            let img = dir.path().join(format!("{threads}.sqsh"));
            let (s, n, stats) = build_rootfs_threads(&img, &spec, threads, None).unwrap();
            assert!(
                std::fs::read(&img).unwrap() == want,
                "{threads} threads: the image differs from backhand's single-threaded one"
            );
            assert_eq!((&s, n), (&sha, size));
            // Every data and fragment block came from the workers; only
            // metadata blocks (inodes, directories, tables) were compressed
            // by the writer's thread.
            assert_eq!(
                stats.parallel,
                data_blocks + frags,
                "{threads} threads: {stats:?}"
            );
            assert!(stats.inline <= 8, "{threads} threads: {stats:?}");
        }
        let img = dir.path().join("default.sqsh");
        assert_eq!(build_rootfs(&img, &spec, None).unwrap(), (sha, size));
    }

    #[test]
    fn parallel_image_reads_back_as_mksquashfs_makes_it() {
        let dir = tempfile::tempdir().unwrap();
        let (spec, stage, _) = many_blocks(dir.path());
        let img = dir.path().join("rootfs.sqsh");
        build_rootfs_threads(&img, &spec, 2, None).unwrap();
        let unsq = tool("unsquashfs", "squashfs-tools");
        let x = dir.path().join("x");
        run(Command::new(&unsq)
            .arg("-no-xattrs")
            .arg("-d")
            .arg(&x)
            .arg(&img));
        run(Command::new("diff").arg("-r").arg(&stage).arg(&x));

        // mksquashfs on the same tree at the same level: the same listing
        // (modes, owners, sizes, times; the root's time aside, which
        // backhand cannot set) and the same contents.
        let mk = dir.path().join("mk.sqsh");
        run(Command::new(tool("mksquashfs", "squashfs-tools"))
            .arg(&stage)
            .arg(&mk)
            .args(["-comp", "zstd", "-Xcompression-level", "6"])
            .args(["-noappend", "-quiet", "-all-root"])
            .env("SOURCE_DATE_EPOCH", spec.epoch.to_string()));
        let list = |p: &Path| {
            let out = run(Command::new(&unsq).args(["-lln", "-UTC"]).arg(p));
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter(|l| l.contains("squashfs-root/"))
                .map(str::to_string)
                .collect::<Vec<_>>()
        };
        let ours = list(&img);
        assert!(ours.len() > 140, "{ours:?}");
        assert_eq!(ours, list(&mk));
    }

    #[test]
    fn a_wrong_prediction_costs_only_time() {
        let dir = tempfile::tempdir().unwrap();
        let (spec, _, _) = many_blocks(dir.path());
        let reference = dir.path().join("one-thread.sqsh");
        build_rootfs_threads(&reference, &spec, 0, None).unwrap();
        let want = std::fs::read(&reference).unwrap();
        // A file left out: its blocks are compressed by the writer, the
        // rest still by the workers.
        let img = dir.path().join("missing.sqsh");
        let (_, _, stats) = build(&img, &spec, 2, None, |f| {
            f.retain(|(p, _)| *p != "big/f03");
        })
        .unwrap();
        assert!(std::fs::read(&img).unwrap() == want, "{stats:?}");
        assert!(stats.inline >= 3 && stats.parallel > 30, "{stats:?}");
        // A file given twice: the reader's queue never matches again from
        // there, and every later block is compressed by the writer.
        let img = dir.path().join("extra.sqsh");
        let (_, _, stats) = build(&img, &spec, 2, None, |f| {
            let twice = *f.iter().find(|(p, _)| *p == "big/f03").unwrap();
            f.push(twice);
        })
        .unwrap();
        assert!(std::fs::read(&img).unwrap() == want, "{stats:?}");
        assert!(stats.inline > 30, "{stats:?}");
    }
    #[test]
    fn kept_blocks_give_the_same_bytes_and_only_changed_blocks_are_compressed() {
        let dir = tempfile::tempdir().unwrap();
        let (mut spec, _, data_blocks) = many_blocks(dir.path());
        let cache = dir.path().join("cache");
        let reference = dir.path().join("reference.sqsh");
        build_rootfs_threads(&reference, &spec, 0, None).unwrap();
        let total = data_blocks + fragments(&reference);
        let build_same = |spec: &RootfsSpec, reference: &Path, name: &str| {
            let img = dir.path().join(name);
            let (_, _, stats) = build_rootfs_threads(&img, spec, 2, Some(&cache)).unwrap();
            assert!(
                std::fs::read(&img).unwrap() == std::fs::read(reference).unwrap(),
                "{name}: the image differs from the one made without a cache ({stats:?})"
            );
            stats
        };
        // No pack yet: every block compressed, then kept.
        let first = build_same(&spec, &reference, "first.sqsh");
        assert_eq!((first.parallel, first.reused), (total, 0), "{first:?}");
        let pack = cache.join(pack::file_name(spec.level, BLOCK_SIZE));
        assert!(pack.is_file());
        // Again: every block from the pack.
        let again = build_same(&spec, &reference, "again.sqsh");
        assert_eq!((again.parallel, again.reused), (total, total), "{again:?}");

        // One file of three blocks changed in its second: that block
        // and nothing else is compressed (the fragment holding the small
        // files' tails is unchanged: the file's tail is not a fragment).
        let skel = spec.skeleton.clone().unwrap();
        let f = skel.join("usr/bin/x");
        let mut bytes = std::fs::read(&f).unwrap();
        bytes[BS + 10] ^= 0x55;
        std::fs::write(&f, &bytes).unwrap();
        let changed = dir.path().join("changed-reference.sqsh");
        build_rootfs_threads(&changed, &spec, 0, None).unwrap();
        let after = build_same(&spec, &changed, "changed.sqsh");
        assert_eq!(
            (after.parallel, after.reused),
            (total, total - 1),
            "{after:?}"
        );

        // A damaged pack: the damaged blocks are compressed again, the
        // image is the same.
        let mut raw = std::fs::read(&pack).unwrap();
        for at in (0..raw.len() / 2).step_by(50_000) {
            raw[at] ^= 0xff;
        }
        std::fs::write(&pack, &raw).unwrap();
        let damaged = build_same(&spec, &changed, "damaged.sqsh");
        assert!(
            damaged.reused < total && damaged.reused > total / 2,
            "{damaged:?}"
        );
        // Garbage for a pack: no block from it, the same image, and a
        // good pack again afterwards.
        std::fs::write(&pack, b"not a pack").unwrap();
        let garbage = build_same(&spec, &changed, "garbage.sqsh");
        assert_eq!(garbage.reused, 0, "{garbage:?}");
        let healed = build_same(&spec, &changed, "healed.sqsh");
        assert_eq!(healed.reused, total, "{healed:?}");

        // Another level: another pack, nothing taken from this one.
        spec.level = 4;
        let other = dir.path().join("level4-reference.sqsh");
        build_rootfs_threads(&other, &spec, 0, None).unwrap();
        let l4 = build_same(&spec, &other, "level4.sqsh");
        assert_eq!(l4.reused, 0, "{l4:?}");
    }
}
