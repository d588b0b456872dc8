//! Kernel: config fragments, KSPP audit, cached build.
//!
//! - [`config`]: Kconfig `.config` / fragment parse, merge, compare.
//! - [`audit`]: the KSPP rule table, waivers and the audit report.
//! - [`kconfig`]: which options a kernel source defines (decides N/A).
//! - [`build`]: the cached, reproducible `bzImage` build.
//! - [`command`]: what `imager kernel build|check` do.

pub mod audit;
pub mod build;
pub mod command;
pub mod config;
pub mod kconfig;

pub use audit::{Report, Rules, Verdict, Waiver, audit, audit_with_source};
pub use build::{BuiltKernel, KernelRequest, build, default_cache_dir};
pub use config::KernelConfig;

use anyhow::{Result, ensure};
use std::path::Path;

/// Refuses a file that is not an x86 Linux boot image (the boot protocol's
/// `0xAA55` boot flag and `HdrS` header signature): a prebuilt kernel is
/// copied into the image and its manifest, so a path pointing at the wrong
/// file, perhaps a secret, must stop the build.
pub fn check_bzimage(path: &Path) -> Result<()> {
    let head = crate::input::read_head(path, "kernel image", 0x210)?;
    ensure!(
        head.get(0x1fe..0x200) == Some(&[0x55, 0xaa][..])
            && head.get(0x202..0x206) == Some(b"HdrS"),
        "{} is not an x86 Linux kernel image (bzImage, no `HdrS` boot header): set \
         kernel.prebuilt to a bzImage",
        path.display()
    );
    Ok(())
}
