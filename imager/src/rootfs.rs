//! The root filesystem: a zstd squashfs, the bytes mksquashfs makes of the
//! same tree ([`squashfs`]).
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
//! leak into the image (`imager squashfs` keeps the modes of its tree, as
//! mksquashfs does).
//!
//! The blocks are compressed on every core; the bytes are the same
//! whatever the number of threads. Given a cache directory, blocks
//! compressed by earlier builds are taken from it ([`pack`]): the same
//! bytes again, and a rebuild after a change compresses only the blocks
//! that changed.

pub mod pack;
pub mod squashfs;
pub use squashfs::Stats as CompressionStats;

pub use crate::disk::FatSource as Source;

use crate::io::{AtomicFile, sha256_file};
use anyhow::{Context, Result, bail, ensure};
use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Default zstd level of the squashfs blocks.
pub const DEFAULT_LEVEL: i32 = 15;

/// Block size of the squashfs: 128 KiB, mksquashfs's
/// default.
pub const BLOCK_SIZE: u32 = 128 * 1024;

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
    /// Take the skeleton's permission bits (and its root's) as they are,
    /// as mksquashfs does (`imager squashfs`), instead of normalising them
    /// as git does (the builder's skeleton, checked out under any umask).
    pub keep_modes: bool,
}

impl RootfsSpec {
    /// The root directory's permission bits.
    fn root_mode(&self) -> Result<u16> {
        match &self.skeleton {
            Some(skel) if self.keep_modes => {
                let m = std::fs::metadata(skel)
                    .with_context(|| format!("reading {}", skel.display()))?;
                Ok((m.permissions().mode() & 0o7777) as u16)
            }
            _ => Ok(0o755),
        }
    }
}

#[derive(Debug, Clone)]
enum Node {
    Dir(u32),
    /// Contents, mode, and (device, inode) for a skeleton file with
    /// further names (hard links).
    File(Source, u32, Option<(u64, u64)>),
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

fn walk_skeleton(root: &Path, keep_modes: bool, nodes: &mut BTreeMap<String, Node>) -> Result<()> {
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
            .with_context(|| {
                format!(
                    "{} is not UTF-8: rename it (paths in the image are UTF-8)",
                    entry.path().display()
                )
            })?
            .to_string();
        let ft = entry.file_type();
        // Not followed: a symbolic link's own.
        let meta = entry
            .metadata()
            .with_context(|| format!("reading {}", entry.path().display()))?;
        let mode = || -> Result<u32> { Ok(meta.permissions().mode() & 0o7777) };
        // A file of the tree under several names is one inode in the image,
        // as mksquashfs makes it.
        let link = (meta.nlink() > 1).then(|| (meta.dev(), meta.ino()));
        let node = if ft.is_dir() {
            Node::Dir(if keep_modes { mode()? } else { 0o755 })
        } else if ft.is_file() {
            let mode = mode()?;
            let mode = if keep_modes {
                mode
            } else if mode & 0o100 != 0 {
                0o755
            } else {
                0o644
            };
            Node::File(Source::File(entry.path().to_path_buf()), mode, link)
        } else if ft.is_symlink() {
            let target = std::fs::read_link(entry.path())
                .with_context(|| format!("reading the link {}", entry.path().display()))?;
            // Not as one inode: mksquashfs merges the names of one symbolic
            // link only if its atime did not change between their lstat()s,
            // which its readlink() of the first may change (it does on a
            // fresh copy, not on a second run): no rule to follow there.
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
        walk_skeleton(skel, spec.keep_modes, &mut nodes)?;
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
        nodes.insert(p, Node::File(f.source.clone(), f.mode, None));
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

/// The key of the compressed blocks of the root filesystem `spec` makes,
/// for the shared build cache ([`crate::remote_cache`]): the SHA-256 of
/// the block pack's name (its format, zstd's version, the level and the
/// block size) and every entry in order (path, mode, a file's contents'
/// SHA-256 and hard-link group, a symbolic link's target). Contents, not
/// times or inodes: the same tree on another machine has the same key.
/// The blocks an entry holds are checked one by one as they are used
/// (each decompresses to the bytes asked for), so a key that names
/// more or fewer blocks than a build needs costs time, never bytes.
pub fn blocks_key(spec: &RootfsSpec) -> Result<String> {
    use sha2::{Digest, Sha256};
    let mut h = crate::io::ItemHasher::new();
    let mut item = |b: &[u8]| h.item(b);
    item(b"rootfs blocks 1");
    item(pack::file_name(spec.level, BLOCK_SIZE).as_bytes());
    let mut links = BTreeMap::new();
    for (path, node) in plan(spec)? {
        item(path.as_bytes());
        match node {
            Node::Dir(m) => item(format!("dir {m:o}").as_bytes()),
            Node::Symlink(t) => item([b"symlink ", t.as_os_str().as_bytes()].concat().as_slice()),
            Node::File(src, m, link) => {
                let group = link.map(|l| {
                    let n = links.len();
                    *links.entry(l).or_insert(n)
                });
                item(format!("file {m:o} {group:?}").as_bytes());
                match src {
                    Source::Bytes(b) => item(&Sha256::digest(b)),
                    Source::File(p) => item(sha256_file(&p)?.0.as_bytes()),
                    Source::Dir => item(b"dir"),
                }
            }
        }
    }
    Ok(h.finish())
}

/// The compressing threads [`build_rootfs`] uses: one per core.
pub fn threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// [`build_rootfs`] with `threads` compressing threads, and how the blocks
/// were compressed (`threads` at least 1: 0 counts as 1).
pub fn build_rootfs_threads(
    dest: &Path,
    spec: &RootfsSpec,
    threads: usize,
    cache: Option<&Path>,
) -> Result<(String, u64, CompressionStats)> {
    let nodes = plan(spec)?;
    let entries: Vec<squashfs::Entry<'_>> = nodes
        .iter()
        .map(|(path, node)| squashfs::Entry {
            path,
            mode: match node {
                Node::Dir(m) | Node::File(_, m, _) => *m as u16,
                Node::Symlink(..) => 0o777,
            },
            kind: match node {
                Node::Dir(_) | Node::File(Source::Dir, ..) => squashfs::Kind::Dir,
                Node::File(src, ..) => squashfs::Kind::File(src),
                Node::Symlink(target) => squashfs::Kind::Symlink(target.as_os_str().as_bytes()),
            },
            link: match node {
                Node::File(_, _, link) => *link,
                Node::Dir(_) | Node::Symlink(_) => None,
            },
        })
        .collect();
    let opts = squashfs::Options {
        level: spec.level,
        block_size: BLOCK_SIZE,
        mtime: u32::try_from(spec.epoch).map_err(|_| {
            anyhow::anyhow!(
                "SOURCE_DATE_EPOCH {} is after 2106: squashfs times are 32-bit seconds; \
                 set an earlier one",
                spec.epoch
            )
        })?,
        root_mode: spec.root_mode()?,
        threads,
        cache,
    };
    let mut out = AtomicFile::create(dest)?;
    let stats = squashfs::write(out.file(), &entries, &opts)
        .with_context(|| format!("writing the squashfs {}", dest.display()))?;
    out.file().flush()?;
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
            keep_modes: false,
        }
    }

    #[test]
    fn unsquashfs_lists_and_extracts_it() {
        let dir = tempfile::tempdir().unwrap();
        let spec = spec(dir.path());
        let img = dir.path().join("rootfs.sqsh");
        let (sha, size) = build_rootfs(&img, &spec, None).unwrap();
        assert_eq!((sha, size), sha256_file(&img).unwrap());

        let unsq = tool("unsquashfs");
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
    /// data blocks written (non-zero blocks of files of a block or more,
    /// duplicates once).
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
        // Duplicates: written once, pointed at again.
        files.push(("big/z-dup-of-f05".into(), files[5].1.clone()));
        files.push(("small/z-dup-of-s007".into(), text(207, 1 + 7 * 997)));
        // All zeros: a hole, not a fragment; two of other lengths share it.
        files.push(("small/zeros".into(), vec![0; 700]));
        files.push(("small/zeros-2".into(), vec![0; 900]));
        files.push(("big/zeros".into(), vec![0; 2 * BS + 3]));
        // Short files of zeros: a later one is a duplicate of the last one
        // only once a short file of its length went into a fragment.
        // (9001 bytes: no other short file of the tree has that length.)
        files.push(("zz/a".into(), vec![0; 9001]));
        files.push(("zz/b".into(), noise(109, 200 * 1024)));
        blocks += 2;
        files.push(("zz/c".into(), vec![0; 9001]));
        files.push(("zz/d".into(), text(110, 9001)));
        files.push(("zz/e".into(), vec![0; 9001]));
        files.push(("zz/f".into(), vec![0; 50]));
        files.push(("zz/g".into(), vec![0; BS]));
        // A directory of 300 entries: an extended directory inode with an
        // index (its entries take more than 8 KiB).
        for i in 0..300u64 {
            files.push((
                format!("wide/a-rather-long-file-name-{i:04}"),
                text(400 + i, 10 + i as usize),
            ));
        }
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
        // Two further names of one file (hard links): one inode, its data
        // once, a link count of 3.
        std::fs::hard_link(skel.join("big/f02"), skel.join("big/f02-link")).unwrap();
        std::fs::hard_link(skel.join("small/s003"), skel.join("usr/s003-link")).unwrap();
        std::fs::hard_link(skel.join("small/s003"), skel.join("usr/s003-link2")).unwrap();
        std::fs::hard_link(skel.join("small/empty"), skel.join("small/empty-link")).unwrap();
        // (Not the names of one symbolic link: mksquashfs makes them one
        // inode or two depending on their atime, see walk_skeleton.)
        std::os::unix::fs::symlink("../big/f02", skel.join("usr/sl")).unwrap();
        // Sparse on disk too: an extended inode that counts its holes.
        {
            use std::os::unix::fs::FileExt;
            let f = std::fs::File::create(skel.join("big/sparse")).unwrap();
            f.set_len(2 * BS as u64).unwrap();
            f.write_all_at(&text(108, 1000), 2 * BS as u64).unwrap();
            blocks += 1;
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
            keep_modes: false,
        };
        (spec, stage, blocks)
    }

    /// Fragment blocks of an image, as unsquashfs counts them.
    fn fragments(img: &Path) -> u64 {
        let out = run(Command::new(tool("unsquashfs")).arg("-s").arg(img));
        let s = String::from_utf8_lossy(&out.stdout);
        s.lines()
            .find_map(|l| l.strip_prefix("Number of fragments "))
            .unwrap_or_else(|| panic!("no fragment count in\n{s}"))
            .trim()
            .parse()
            .unwrap()
    }

    /// mksquashfs's image of `stage` at `level`, times `epoch`.
    fn mksquashfs(stage: &Path, out: &Path, level: i32, epoch: u64) -> Vec<u8> {
        let e = epoch.to_string();
        run(Command::new(tool("mksquashfs"))
            .arg(stage)
            .arg(out)
            .args(["-comp", "zstd", "-Xcompression-level", &level.to_string()])
            .args(["-noappend", "-quiet", "-all-root", "-no-xattrs"])
            .args(["-mkfs-time", &e, "-all-time", &e])
            .env_remove("SOURCE_DATE_EPOCH"));
        std::fs::read(out).unwrap()
    }

    #[test]
    fn same_bytes_as_mksquashfs_whatever_the_thread_count() {
        let dir = tempfile::tempdir().unwrap();
        let (mut spec, stage, data_blocks) = many_blocks(dir.path());
        for level in [6, DEFAULT_LEVEL] {
            spec.level = level;
            let mk = dir.path().join(format!("mk-{level}.sqsh"));
            let want = mksquashfs(&stage, &mk, level, spec.epoch);
            let frags = fragments(&mk);
            assert!(
                frags >= 3,
                "{frags} fragment blocks: the test needs several"
            );
            let threads: &[usize] = if level == 6 { &[1, 2, 4] } else { &[2] };
            for &threads in threads {
                let img = dir.path().join(format!("{level}-{threads}.sqsh"));
                let (sha, size, stats) = build_rootfs_threads(&img, &spec, threads, None).unwrap();
                let got = std::fs::read(&img).unwrap();
                if got != want {
                    let at = got.iter().zip(&want).position(|(a, b)| a != b);
                    panic!(
                        "level {level}, {threads} threads: not mksquashfs's bytes \
                         ({} against {} bytes, first difference at {at:?})",
                        got.len(),
                        want.len()
                    );
                }
                assert_eq!((sha, size), sha256_file(&mk).unwrap());
                // Every data and fragment block, duplicates once.
                assert_eq!(
                    stats,
                    CompressionStats {
                        blocks: data_blocks + frags,
                        reused: 0,
                        packed: 0
                    },
                    "level {level}, {threads} threads"
                );
            }
        }
        let img = dir.path().join("default.sqsh");
        let (sha, _) = build_rootfs(&img, &spec, None).unwrap();
        assert_eq!(sha, sha256_file(&dir.path().join("mk-15.sqsh")).unwrap().0);

        // And it reads back as the tree.
        let x = dir.path().join("x");
        run(Command::new(tool("unsquashfs"))
            .arg("-no-xattrs")
            .arg("-d")
            .arg(&x)
            .arg(&img));
        run(Command::new("diff").arg("-r").arg(&stage).arg(&x));
    }

    #[test]
    fn imager_squashfs_keeps_the_modes_of_the_tree() {
        let dir = tempfile::tempdir().unwrap();
        let tree = dir.path().join("tree");
        std::fs::create_dir_all(tree.join("private")).unwrap();
        std::fs::create_dir_all(tree.join("tmp")).unwrap();
        std::fs::write(tree.join("private/key"), "secret\n").unwrap();
        std::fs::write(tree.join("tool"), "#!/bin/true\n").unwrap();
        std::os::unix::fs::symlink("tool", tree.join("link")).unwrap();
        for (p, m) in [
            ("private", 0o700),
            ("tmp", 0o1777),
            ("private/key", 0o600),
            ("tool", 0o750),
            ("", 0o711),
        ] {
            std::fs::set_permissions(tree.join(p), std::fs::Permissions::from_mode(m)).unwrap();
        }
        let spec = RootfsSpec {
            skeleton: Some(tree.clone()),
            dirs: Vec::new(),
            files: Vec::new(),
            epoch: 1_600_000_000,
            level: DEFAULT_LEVEL,
            keep_modes: true,
        };
        let img = dir.path().join("i.sqsh");
        build_rootfs(&img, &spec, None).unwrap();
        let want = mksquashfs(&tree, &dir.path().join("m.sqsh"), DEFAULT_LEVEL, spec.epoch);
        assert!(
            std::fs::read(&img).unwrap() == want,
            "not mksquashfs's bytes"
        );
    }

    #[test]
    fn kept_blocks_give_the_same_bytes_and_only_changed_blocks_are_compressed() {
        let dir = tempfile::tempdir().unwrap();
        let (mut spec, _, data_blocks) = many_blocks(dir.path());
        let cache = dir.path().join("cache");
        let reference = dir.path().join("reference.sqsh");
        build_rootfs_threads(&reference, &spec, 1, None).unwrap();
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
        assert_eq!((first.blocks, first.reused), (total, 0), "{first:?}");
        let pack = cache.join(pack::file_name(spec.level, BLOCK_SIZE));
        assert!(pack.is_file());
        // Again: every block from the pack.
        let again = build_same(&spec, &reference, "again.sqsh");
        assert_eq!((again.blocks, again.reused), (total, total), "{again:?}");

        // One file of three blocks changed in its second: that block
        // and nothing else is compressed (the fragment holding the small
        // files' tails is unchanged: the file's tail is not a fragment).
        let skel = spec.skeleton.clone().unwrap();
        let f = skel.join("usr/bin/x");
        let mut bytes = std::fs::read(&f).unwrap();
        bytes[BS + 10] ^= 0x55;
        std::fs::write(&f, &bytes).unwrap();
        let changed = dir.path().join("changed-reference.sqsh");
        build_rootfs_threads(&changed, &spec, 1, None).unwrap();
        let after = build_same(&spec, &changed, "changed.sqsh");
        assert_eq!(
            (after.blocks, after.reused),
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
        build_rootfs_threads(&other, &spec, 1, None).unwrap();
        let l4 = build_same(&spec, &other, "level4.sqsh");
        assert_eq!(l4.reused, 0, "{l4:?}");
    }
}
