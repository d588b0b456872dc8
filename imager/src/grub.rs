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
/// (`terminal`). No `search`: the prefix names BOOT's partition.
pub const MODULES: [&str; 11] = [
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
pub fn make(dir: &Path) -> Result<Grub> {
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
    for m in MODULES {
        ensure!(
            dir.join(format!("{m}.mod")).is_file(),
            "GRUB module {m}.mod, needed for BIOS boot, is missing from {}: {INSTALL_HINT}",
            dir.display()
        );
    }
    let mkimage = find_mkimage()?;
    let work = tempfile::tempdir().context("creating a directory for GRUB's core image")?;
    let core = work.path().join("core.img");
    let out = Command::new(&mkimage)
        .args(["-O", "i386-pc", "-d"])
        .arg(dir)
        .arg("-p")
        .arg(contract::grub::core_prefix())
        .arg("-o")
        .arg(&core)
        .args(MODULES)
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
    let core_img = std::fs::read(&core).context("reading GRUB's core image")?;
    let boot_img = crate::input::read_head(&dir.join("boot.img"), "GRUB's boot.img", 4096)?;
    Grub::new(&boot_img, &core_img).with_context(|| format!("GRUB's images from {}", dir.display()))
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
        let a = make(grub_dir()).unwrap();
        let b = make(grub_dir()).unwrap();
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

    #[test]
    fn bad_grub_directories_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope");
        let e = format!("{:#}", make(&missing).unwrap_err());
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
        let e = format!("{:#}", make(&copy).unwrap_err());
        assert!(e.contains("GRUB module linux.mod"), "{e}");
        assert!(e.contains("install grub-pc-bin"), "{e}");
        // A dependency missing: grub-mkimage's own message.
        std::fs::copy(grub_dir().join("linux.mod"), copy.join("linux.mod")).unwrap();
        std::fs::remove_file(copy.join("extcmd.mod")).unwrap();
        let e = format!("{:#}", make(&copy).unwrap_err());
        assert!(e.contains("grub-mkimage failed"), "{e}");
        assert!(e.contains("extcmd.mod"), "{e}");
        // Too small a BIOS partition.
        let g = make(grub_dir()).unwrap();
        let e = format!("{:#}", check_fits(&g, 64 * 1024).unwrap_err());
        assert!(e.contains("too small for GRUB's core image"), "{e}");
    }
}
