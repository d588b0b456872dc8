//! GRUB for the BIOS path: its core image, made at build time with
//! `grub-mkimage -O i386-pc` from Debian's grub-pc-bin, every module it
//! needs embedded, and its `boot.img`. `bootstate::bios` writes both to the
//! disk; [`contract::grub`] decides the prefix and renders `grub.cfg`.
//!
//! The core image embeds [`MODULES`] (grub-mkimage adds what they depend
//! on, from the directory's `moddep.lst`); nothing is loaded from the disk
//! at boot. Its prefix is `(,gpt3)/grub`: BOOT on the disk GRUB was loaded
//! from ([`contract::grub::core_prefix`]).
//!
//! grub-mkimage writes no timestamp: the same modules directory and the
//! same list give the same bytes (checked by a test).

use anyhow::{Context, Result, bail, ensure};
use bootstate::bios::{Grub, SECTOR};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Where Debian's grub-pc-bin puts GRUB's i386-pc images and modules.
pub const DEFAULT_DIR: &str = "/usr/lib/grub/i386-pc";

/// The modules embedded in core.img: reading the disk through the BIOS
/// (`biosdisk`), its GPT (`part_gpt`) and BOOT's FAT (`fat`); the script
/// and menu that read grub.cfg (`normal`, which brings `extcmd`, `crypto`,
/// `boot`, `terminal`, `gettext`, `bufio`…); the Linux loader (`linux`, which
/// loads the initrd too); the environment block (`loadenv`: `load_env`,
/// `save_env`) and conditions (`test`: `[ … ]`) for the A-B rendering;
/// `echo`; the serial console (`serial`) and `terminal_input`/`_output`
/// (`terminal`); `probe` (BOOT's unique GUID). No `search`: the prefix
/// names BOOT's partition.
pub const MODULES: [&str; 12] = [
    "biosdisk",
    "part_gpt",
    "fat",
    "normal",
    "linux",
    "loadenv",
    "test",
    "echo",
    "serial",
    "terminal",
    // `source`, with which grub.cfg loads a slot's lines (contract::grubcfg).
    "configfile",
    // `probe --part-uuid`: BOOT's unique GUID for the kernel's command
    // line, the runtime's word on which disk booted.
    "probe",
];

const MKIMAGE: &str = "grub-mkimage";
const INSTALL_HINT: &str = "install grub-pc-bin (scripts/setup.sh)";

fn find_mkimage() -> Result<PathBuf> {
    std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .map(|d| Path::new(d).join(MKIMAGE))
        .find(|p| p.is_file())
        .with_context(|| format!("{MKIMAGE} not found: {INSTALL_HINT}"))
}

/// Checks `dir` (GRUB's i386-pc directory) and makes core.img with
/// [`MODULES`] and the prefix of [`contract::grub::core_prefix`]; returns it
/// with `dir`'s boot.img, both checked ([`Grub::new`]). Writes nothing but a
/// temporary file.
///
/// With `memo` (a directory of the build cache, and the shared cache), the
/// image grub-mkimage made from the same inputs before is taken from there
/// ([`Memo`], [`Memos`]).
pub fn make(dir: &Path, memo: Option<&Memos>) -> Result<Grub> {
    check_dir(dir, &MODULES, "BIOS boot")?;
    let boot_img = crate::input::read_head(&dir.join("boot.img"), "GRUB's boot.img", 4096)?;
    let core_img = mkimage(
        dir,
        "i386-pc",
        &contract::grub::core_prefix(),
        &MODULES,
        memo,
        &|core| Grub::new(&boot_img, core).map(|_| ()),
    )?;
    Grub::new(&boot_img, &core_img).with_context(|| format!("GRUB's images from {}", dir.display()))
}

/// Refuses `dir` unless it is GRUB's i386-pc directory with `modules`
/// (needed for `what`).
fn check_dir(dir: &Path, modules: &[&str], what: &str) -> Result<()> {
    ensure!(
        dir.is_dir(),
        "GRUB's i386-pc directory {} not found: {INSTALL_HINT}, or set boot.grub_dir in the \
         profile",
        dir.display()
    );
    for name in [
        "boot.img",
        "diskboot.img",
        "kernel.img",
        "lzma_decompress.img",
    ] {
        ensure!(
            dir.join(name).is_file(),
            "{} has no {name}: not GRUB's i386-pc directory ({INSTALL_HINT})",
            dir.display()
        );
    }
    for m in modules {
        ensure!(
            dir.join(format!("{m}.mod")).is_file(),
            "GRUB module {m}.mod, needed for {what}, is missing from {}: {INSTALL_HINT}",
            dir.display()
        );
    }
    Ok(())
}

/// Where grub-mkimage's images are remembered: the build cache's memo
/// directory ([`Memo`]) and, if the build has one, the build cache shared
/// through a registry (entries of kind `grub`, keyed by [`shared_key`]).
pub struct Memos<'a> {
    pub dir: PathBuf,
    pub shared: Option<crate::remote_cache::Shared<'a>>,
}

/// Runs grub-mkimage for `format` with `prefix` and `modules` from `dir`,
/// or takes its image from `memo` (the local memo, then the shared cache;
/// an image made here, or found in the memo, is added to the shared cache
/// when it lacks it); returns the image. An image pulled from the shared
/// cache must pass `check` (what the caller checks of grub-mkimage's own)
/// before it is used or remembered: one that does not is said and made
/// here instead.
fn mkimage(
    dir: &Path,
    format: &str,
    prefix: &str,
    modules: &[&str],
    memo: Option<&Memos>,
    check: &dyn Fn(&[u8]) -> Result<()>,
) -> Result<Vec<u8>> {
    let mkimage = find_mkimage()?;
    let args = [format, prefix];
    let local = match memo {
        Some(m) => Some(Memo::new(&m.dir, &mkimage, dir, &args, modules)?),
        None => None,
    };
    let shared = match memo.and_then(|m| m.shared.map(|s| (s, &m.dir))) {
        Some((s, scratch)) => {
            std::fs::create_dir_all(scratch)
                .with_context(|| format!("creating {}", scratch.display()))?;
            Some((s, shared_key(&mkimage, dir, &args, modules)?, scratch))
        }
        None => None,
    };
    if let Some(image) = local.as_ref().and_then(Memo::get) {
        if let Some((s, key, scratch)) = &shared {
            s.push_file("grub", key, &image, scratch);
        }
        return Ok(image);
    }
    if let Some((s, key, scratch)) = &shared
        && let Some(image) = s.pull_file("grub", key, scratch)
    {
        match check(&image) {
            Ok(()) => {
                if let Some(m) = &local {
                    m.put(&image);
                }
                return Ok(image);
            }
            Err(e) => crate::progress::line(&format!(
                "warning: grub: the cache registry's image is refused and it is made here: \
                 it is not what {MKIMAGE} makes ({e:#})"
            )),
        }
    }
    let image = run_mkimage(&mkimage, dir, format, prefix, modules)?;
    if let Some(m) = &local {
        m.put(&image);
    }
    if let Some((s, key, scratch)) = &shared {
        s.push_file("grub", key, &image, scratch);
    }
    Ok(image)
}

/// The names in `dir`, sorted (the keys hash them in this order).
fn sorted_names(dir: &Path) -> Result<Vec<std::ffi::OsString>> {
    let mut names: Vec<_> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<std::io::Result<_>>()
        .with_context(|| format!("reading {}", dir.display()))?;
    names.sort();
    Ok(names)
}

/// The key of an image in the shared cache: the SHA-256 of grub-mkimage's
/// bytes, of every file of the modules directory (its name and bytes),
/// and of the arguments. Contents, not times or inodes as the local
/// [`Memo`]'s key: another machine with the same GRUB package has the same
/// key. (The shared libraries grub-mkimage loads are not in it: machines
/// that share a cache run the same distribution, as they must for the
/// kernel's compiler; docs/build-cache.md.)
fn shared_key(mkimage: &Path, dir: &Path, args: &[&str], modules: &[&str]) -> Result<String> {
    let mut h = crate::io::ItemHasher::new();
    let mut item = |b: &[u8]| h.item(b);
    item(b"grub-mkimage shared 1");
    item(crate::io::sha256_file(mkimage)?.0.as_bytes());
    for n in sorted_names(dir)? {
        let path = dir.join(&n);
        if path.is_file() {
            item(n.as_encoded_bytes());
            item(crate::io::sha256_file(&path)?.0.as_bytes());
        }
    }
    for a in args.iter().chain(modules) {
        item(a.as_bytes());
    }
    Ok(h.finish())
}

/// A remembered grub-mkimage image (a no-change build would otherwise
/// spend most of its time running grub-mkimage): the file `KEY.img` in the
/// memo directory, KEY the SHA-256 of everything the image is made from as
/// make would see it (the path, size, times and inode of grub-mkimage and
/// of every file in the modules directory, and the arguments), holding
/// the image after its own SHA-256. A memo that does not match its digest
/// is ignored and made again; one that cannot be written is skipped. The
/// directory keeps the [`MEMOS`] memos written or used last (each GRUB
/// directory and format has its own; an update of GRUB's package makes
/// new ones).
struct Memo {
    path: PathBuf,
}

impl Memo {
    fn new(
        memo: &Path,
        mkimage: &Path,
        dir: &Path,
        args: &[&str],
        modules: &[&str],
    ) -> Result<Memo> {
        use std::os::unix::fs::MetadataExt;
        let mut h = crate::io::ItemHasher::new();
        let mut item = |b: &[u8]| h.item(b);
        item(b"grub-mkimage memo 1");
        let stamp = |p: &Path| -> Result<String> {
            let m = std::fs::metadata(p).with_context(|| format!("reading {}", p.display()))?;
            Ok(format!(
                "{} {} {}.{} {}.{} {} {}",
                p.display(),
                m.len(),
                m.mtime(),
                m.mtime_nsec(),
                m.ctime(),
                m.ctime_nsec(),
                m.ino(),
                m.dev()
            ))
        };
        item(stamp(mkimage)?.as_bytes());
        for n in sorted_names(dir)? {
            item(stamp(&dir.join(n))?.as_bytes());
        }
        for a in args.iter().chain(modules) {
            item(a.as_bytes());
        }
        let key = h.finish();
        Ok(Memo {
            path: memo.join(format!("{key}.img")),
        })
    }

    /// The image, if the memo holds it whole. A memo used is marked as
    /// written now, so that pruning keeps the memos in use.
    fn get(&self) -> Option<Vec<u8>> {
        use sha2::{Digest, Sha256};
        let b = std::fs::read(&self.path).ok()?;
        let (digest, image) = b.split_at_checked(32)?;
        if Sha256::digest(image).as_slice() != digest {
            return None;
        }
        if let Ok(f) = std::fs::File::options().write(true).open(&self.path) {
            let _ = f.set_modified(std::time::SystemTime::now());
        }
        Some(image.to_vec())
    }

    fn put(&self, image: &[u8]) {
        use sha2::{Digest, Sha256};
        let mut b = Sha256::digest(image).to_vec();
        b.extend_from_slice(image);
        if let Some(d) = self.path.parent() {
            let _ = std::fs::create_dir_all(d);
        }
        if crate::io::write_atomic(&self.path, &b, 0o644).is_ok()
            && let Some(d) = self.path.parent()
        {
            prune(d, MEMOS);
        }
    }
}

/// The memos a memo directory keeps: about 30 KiB each.
const MEMOS: usize = 16;

/// Removes all but the `keep` memos of `dir` written or used last (by
/// modification time, then name); what cannot be read or removed stays.
fn prune(dir: &Path, keep: usize) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut memos: Vec<(std::time::SystemTime, PathBuf)> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "img"))
        .filter_map(|p| Some((std::fs::metadata(&p).ok()?.modified().ok()?, p)))
        .collect();
    memos.sort();
    let old = memos.len().saturating_sub(keep);
    for (_, p) in memos.into_iter().take(old) {
        let _ = std::fs::remove_file(p);
    }
}

fn run_mkimage(
    mkimage: &Path,
    dir: &Path,
    format: &str,
    prefix: &str,
    modules: &[&str],
) -> Result<Vec<u8>> {
    let work = tempfile::tempdir().context("creating a directory for GRUB's core image")?;
    let core = work.path().join("core.img");
    let out = Command::new(mkimage)
        .args(["-O", format, "-d"])
        .arg(dir)
        .arg("-p")
        .arg(prefix)
        .arg("-o")
        .arg(&core)
        .args(modules)
        .output()
        .with_context(|| format!("running {}", mkimage.display()))?;
    if !out.status.success() {
        let said = String::from_utf8_lossy(&out.stderr);
        let said: Vec<&str> = said.lines().rev().take(5).collect();
        bail!(
            "{MKIMAGE} failed ({}) making GRUB's core image from {}: {}",
            out.status,
            dir.display(),
            said.into_iter().rev().collect::<Vec<_>>().join("; ")
        );
    }
    std::fs::read(&core).context("reading GRUB's core image")
}

/// The modules of the ISO's El Torito core image: the BIOS disks (a CD
/// and, written to a USB stick, a hard disk: `biosdisk`), ISO 9660 (where
/// grub.cfg is), `loopback` and `fat` (the FAT image holding the kernel
/// and the initramfs), the script and the Linux loader, `echo`, the serial
/// console ([`contract::iso::grub_cfg`]).
pub const ISO_MODULES: [&str; 9] = [
    "biosdisk", "iso9660", "loopback", "fat", "normal", "linux", "echo", "serial", "terminal",
];

/// GRUB's images for a hybrid ISO (BIOS side).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Eltorito {
    /// `cdboot.img` followed by a core image (`diskboot.img`, the
    /// decompressor, the kernel and [`ISO_MODULES`]), with the prefix
    /// [`contract::iso::GRUB_PREFIX`]: the El Torito no-emulation boot image.
    /// The ISO writer patches its boot-info table and blocklist.
    pub image: Vec<u8>,
    /// `boot_hybrid.img`: the MBR code of the ISO written to a disk, which
    /// loads the core image's first sector from the LBA the writer patches
    /// in.
    pub hybrid_mbr: Vec<u8>,
}

/// The size of `cdboot.img`, which starts the El Torito image: one CD
/// sector.
pub const CDBOOT_LEN: usize = 2048;

/// Checks `dir` and makes GRUB's El Torito image (`grub-mkimage -O
/// i386-pc-eltorito`) with [`ISO_MODULES`]; returns it with `dir`'s
/// `boot_hybrid.img`, both checked.
pub fn make_eltorito(dir: &Path, memo: Option<&Memos>) -> Result<Eltorito> {
    check_dir(dir, &ISO_MODULES, "booting the ISO under BIOS")?;
    for name in ["cdboot.img", "boot_hybrid.img"] {
        ensure!(
            dir.join(name).is_file(),
            "{} has no {name}, needed for the ISO's BIOS boot: {INSTALL_HINT}",
            dir.display()
        );
    }
    let cdboot = crate::input::read_head(&dir.join("cdboot.img"), "GRUB's cdboot.img", 4096)?;
    let check = |image: &[u8]| -> Result<()> {
        ensure!(
            cdboot.len() == CDBOOT_LEN && image.starts_with(&cdboot),
            "{MKIMAGE} made an El Torito image that does not start with {}'s cdboot.img: \
             {INSTALL_HINT}",
            dir.display()
        );
        let core_sectors = (image.len() - CDBOOT_LEN).div_ceil(SECTOR) as u64;
        ensure!(
            core_sectors <= bootstate::bios::MAX_CORE_SECTORS,
            "GRUB's El Torito core image is {core_sectors} sectors, over GRUB's limit of {}: \
             check {}",
            bootstate::bios::MAX_CORE_SECTORS,
            dir.display()
        );
        Ok(())
    };
    let image = mkimage(
        dir,
        "i386-pc-eltorito",
        contract::iso::GRUB_PREFIX,
        &ISO_MODULES,
        memo,
        &check,
    )?;
    check(&image)?;
    let hybrid_mbr =
        crate::input::read_head(&dir.join("boot_hybrid.img"), "GRUB's boot_hybrid.img", 4096)?;
    ensure!(
        hybrid_mbr.len() == SECTOR && hybrid_mbr[510..] == [0x55, 0xAA],
        "{}/boot_hybrid.img is not a 512-byte boot sector: {INSTALL_HINT}",
        dir.display()
    );
    Ok(Eltorito { image, hybrid_mbr })
}

/// Refuses a BIOS partition of `bios_bytes` too small for `grub`'s core.
pub fn check_fits(grub: &Grub, bios_bytes: u64) -> Result<()> {
    let need = grub.core_sectors() * SECTOR as u64;
    ensure!(
        need <= bios_bytes,
        "the BIOS partition ({bios_bytes} bytes) is too small for GRUB's core image ({need} \
         bytes)"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grub_dir() -> &'static Path {
        let d = Path::new(DEFAULT_DIR);
        assert!(d.is_dir(), "{DEFAULT_DIR} missing: {INSTALL_HINT}");
        d
    }

    /// The real core.img: deterministic, within GRUB's limit, with the
    /// directory's boot.img.
    #[test]
    fn core_image_is_deterministic_and_embeds_its_modules() {
        let a = make(grub_dir(), None).unwrap();
        let b = make(grub_dir(), None).unwrap();
        assert_eq!(a, b, "two runs give the same bytes");
        assert!(a.core_sectors() < bootstate::bios::MAX_CORE_SECTORS);
        assert_eq!(
            a.boot_img(),
            &std::fs::read(grub_dir().join("boot.img")).unwrap()[..]
        );
        check_fits(&a, contract::partition::MIB).unwrap();
        // core.img is LZMA-compressed past its first two sectors: the
        // modules and the prefix show only when GRUB boots (tests/e2e.rs).
        assert_eq!(a.patched_core(2048).len() as u64, a.core_sectors() * 512);
    }

    /// The real El Torito image: deterministic, cdboot.img first, the
    /// core's blocklist with GRUB's load segment, boot_hybrid.img beside.
    #[test]
    fn eltorito_image_is_deterministic() {
        let a = make_eltorito(grub_dir(), None).unwrap();
        assert_eq!(a, make_eltorito(grub_dir(), None).unwrap());
        let seg = u16::from_le_bytes([a.image[CDBOOT_LEN + 0x1FE], a.image[CDBOOT_LEN + 0x1FF]]);
        assert_eq!(seg, 0x820, "diskboot's blocklist loads at 0x8200");
        assert_eq!(a.hybrid_mbr.len(), SECTOR);
    }

    #[test]
    fn a_memo_directory_keeps_the_memos_written_last() {
        let t = tempfile::tempdir().unwrap();
        let at = |s: u64| std::time::UNIX_EPOCH + std::time::Duration::from_secs(s);
        for i in 0..20u64 {
            let p = t.path().join(format!("{i:02}.img"));
            std::fs::write(&p, b"memo").unwrap();
            std::fs::File::options()
                .write(true)
                .open(&p)
                .unwrap()
                .set_modified(at(1_000 + (i * 7) % 20))
                .unwrap();
        }
        std::fs::write(t.path().join("other"), b"not a memo").unwrap();
        prune(t.path(), MEMOS);
        let mut left: Vec<String> = std::fs::read_dir(t.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        // The 16 of times 1004..1019 stay: i * 7 % 20 >= 4.
        let mut want: Vec<String> = (0..20u64)
            .filter(|i| (i * 7) % 20 >= 4)
            .map(|i| format!("{i:02}.img"))
            .collect();
        want.push("other".into());
        want.sort();
        assert_eq!(left, want);
    }

    /// The memo gives grub-mkimage's bytes back; a changed module (its
    /// times) or a damaged memo file makes the image again, and what that
    /// run fails on shows (a memo never hides a broken directory).
    #[test]
    fn memo_gives_the_same_image_and_is_remade_when_an_input_changes() {
        let t = tempfile::tempdir().unwrap();
        let memo = Memos {
            dir: t.path().join("memo"),
            shared: None,
        };
        let copy = t.path().join("i386-pc");
        std::fs::create_dir(&copy).unwrap();
        for f in std::fs::read_dir(grub_dir()).unwrap() {
            let f = f.unwrap();
            std::fs::copy(f.path(), copy.join(f.file_name())).unwrap();
        }
        let fresh = make(&copy, None).unwrap();
        assert_eq!(make(&copy, Some(&memo)).unwrap(), fresh);
        let files: Vec<_> = std::fs::read_dir(&memo.dir).unwrap().collect();
        assert_eq!(files.len(), 1, "one image remembered");
        let remembered = files[0].as_ref().unwrap().path();
        assert_eq!(make(&copy, Some(&memo)).unwrap(), fresh, "from the memo");
        // A damaged memo: ignored, made again, and rewritten whole.
        let mut b = std::fs::read(&remembered).unwrap();
        let last = b.len() - 1;
        b[last] ^= 1;
        std::fs::write(&remembered, &b).unwrap();
        assert_eq!(make(&copy, Some(&memo)).unwrap(), fresh);
        assert_ne!(std::fs::read(&remembered).unwrap(), b);
        // A dependency removed: another key, so grub-mkimage runs and fails.
        std::fs::remove_file(copy.join("extcmd.mod")).unwrap();
        let e = format!("{:#}", make(&copy, Some(&memo)).unwrap_err());
        assert!(e.contains("grub-mkimage failed"), "{e}");
        // The same bytes with a new modification time: another key too.
        std::fs::copy(grub_dir().join("extcmd.mod"), copy.join("extcmd.mod")).unwrap();
        assert_eq!(make(&copy, Some(&memo)).unwrap(), fresh);
        assert_eq!(std::fs::read_dir(&memo.dir).unwrap().count(), 2);
    }

    #[test]
    fn bad_grub_directories_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope");
        let e = format!("{:#}", make(&missing, None).unwrap_err());
        assert!(e.contains("not found: install grub-pc-bin"), "{e}");
        assert!(e.contains("boot.grub_dir"), "{e}");

        // A copy of the directory without one module.
        let copy = dir.path().join("i386-pc");
        std::fs::create_dir(&copy).unwrap();
        for f in std::fs::read_dir(grub_dir()).unwrap() {
            let f = f.unwrap();
            if f.file_name() != "linux.mod" {
                std::fs::copy(f.path(), copy.join(f.file_name())).unwrap();
            }
        }
        let e = format!("{:#}", make(&copy, None).unwrap_err());
        assert!(e.contains("GRUB module linux.mod"), "{e}");
        assert!(e.contains("install grub-pc-bin"), "{e}");
        // A dependency missing: grub-mkimage's own message.
        std::fs::copy(grub_dir().join("linux.mod"), copy.join("linux.mod")).unwrap();
        std::fs::remove_file(copy.join("extcmd.mod")).unwrap();
        let e = format!("{:#}", make(&copy, None).unwrap_err());
        assert!(e.contains("grub-mkimage failed"), "{e}");
        assert!(e.contains("extcmd.mod"), "{e}");
        // Too small a BIOS partition.
        let g = make(grub_dir(), None).unwrap();
        let e = format!("{:#}", check_fits(&g, 64 * 1024).unwrap_err());
        assert!(e.contains("too small for GRUB's core image"), "{e}");
    }
}
