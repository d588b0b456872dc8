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

/// Refuses a file that is not `arch`'s Linux kernel image: on amd64 an x86
/// boot image (the boot protocol's `0xAA55` boot flag and `HdrS` header
/// signature, a bzImage); on arm64 an `Image` (the arm64 boot header's
/// `ARM\x64` magic at 0x38, Documentation/arch/arm64/booting.rst) with its
/// EFI stub (`MZ`, and a PE header for machine 0xAA64: UEFI and systemd's
/// stub start it as an EFI program) of version 1.0 or later. A prebuilt kernel is copied into the
/// image and its manifest, so a path pointing at the wrong file, perhaps a
/// secret, must stop the build.
pub fn check_image(path: &Path, arch: contract::Arch) -> Result<()> {
    let shown = path.display();
    let head = crate::input::read_head(path, "kernel image", 0x210)?;
    match arch {
        contract::Arch::Amd64 => ensure!(
            head.get(0x1fe..0x200) == Some(&[0x55, 0xaa][..])
                && head.get(0x202..0x206) == Some(b"HdrS"),
            "{shown} is not an x86 Linux kernel image (bzImage, no `HdrS` boot header): set \
             kernel.prebuilt to a bzImage"
        ),
        contract::Arch::Arm64 => {
            ensure!(
                head.get(0x38..0x3c) == Some(b"ARM\x64"),
                "{shown} is not an arm64 Linux kernel image (no `ARM\\x64` magic in its boot \
                 header): set kernel.prebuilt to an arm64 Image"
            );
            ensure!(
                contract::arch::pe_machine(&head) == Some(arch.spec().pe_machine),
                "{shown} is an arm64 kernel without its EFI stub (CONFIG_EFI_STUB): UEFI cannot \
                 start it"
            );
            // The EFI stub's version, its PE MajorImageVersion: 1.0 (Linux
            // 5.8) and later take the initramfs from LINUX_INITRD_MEDIA_GUID,
            // the only way systemd-boot and systemd's stub hand it over on
            // arm64 (the stub refuses an older kernel as a bad image).
            let version = contract::arch::pe_header(&head)
                .and_then(|pe| head.get(pe + 24 + 44..pe + 24 + 46))
                .map_or(0, |b| u16::from_le_bytes([b[0], b[1]]));
            ensure!(
                version >= 1,
                "{shown}'s EFI stub is version {version}.x, older than 1.0 (Linux 5.8): it cannot \
                 take the initramfs as systemd-boot passes it on arm64; use a newer kernel"
            );
        }
    }
    Ok(())
}
