//! The architectures an image is built for, and everything that differs
//! between them, decided here as one table ([`ARCHES`]; docs/arm64.md says
//! which parts of the builder read it so far): the profile's and
//! OCI's name, the kernel's `ARCH`, source directory, cross compiler and
//! image, the Rust target the runtime is built for, the PE machine of EFI
//! programs and the removable-media boot file UEFI firmware starts.
//!
//! x86-64 (`amd64`) is the default and the host the builder runs on; arm64
//! is cross-built from it (docs/arm64.md). arm64 boots by UEFI only: it has
//! no BIOS boot and no GRUB.

use std::fmt;

/// An architecture an image is built for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum Arch {
    /// x86-64: the default, UEFI and BIOS.
    #[default]
    Amd64,
    /// 64-bit Arm (AArch64): UEFI only.
    Arm64,
}

/// What differs between architectures: one row per [`Arch`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArchSpec {
    pub arch: Arch,
    /// The name in profiles, on the command line and in OCI platforms
    /// (`architecture`), as Go and the OCI image specification spell it.
    pub name: &'static str,
    /// The kernel's `ARCH=` and its `# Linux/<srcarch> …` config header.
    pub kernel_arch: &'static str,
    /// `CROSS_COMPILE=` when building on an x86-64 host (empty: native).
    pub cross_compile: &'static str,
    /// The make target of the kernel image, and where make leaves it
    /// (relative to the tree).
    pub kernel_target: &'static str,
    pub kernel_image: &'static str,
    /// The Rust target triple the static runtime is built for.
    pub rust_target: &'static str,
    /// The ELF machine (`e_machine`) of its programs.
    pub elf_machine: u16,
    /// Debian's multiarch triplet: its libraries' directories
    /// (`/usr/lib/<triplet>`).
    pub multiarch: &'static str,
    /// The PE/COFF machine of this architecture's EFI programs.
    pub pe_machine: u16,
    /// The removable-media boot file UEFI firmware starts (`EFI/BOOT/…`).
    pub efi_boot_file: &'static str,
    /// systemd-boot's and systemd-stub's suffix (`systemd-bootx64.efi`,
    /// `linuxx64.efi.stub`).
    pub efi_suffix: &'static str,
    /// Whether images of this architecture can boot by BIOS (GRUB).
    pub bios: bool,
}

/// The table: [`Arch::spec`] reads it.
pub const ARCHES: [ArchSpec; 2] = [
    ArchSpec {
        arch: Arch::Amd64,
        name: "amd64",
        kernel_arch: "x86",
        cross_compile: "",
        kernel_target: "bzImage",
        kernel_image: "arch/x86/boot/bzImage",
        rust_target: "x86_64-unknown-linux-gnu",
        elf_machine: 62,
        multiarch: "x86_64-linux-gnu",
        pe_machine: 0x8664,
        efi_boot_file: "BOOTX64.EFI",
        efi_suffix: "x64",
        bios: true,
    },
    ArchSpec {
        arch: Arch::Arm64,
        name: "arm64",
        kernel_arch: "arm64",
        cross_compile: "aarch64-linux-gnu-",
        kernel_target: "Image",
        kernel_image: "arch/arm64/boot/Image",
        rust_target: "aarch64-unknown-linux-gnu",
        elf_machine: 183,
        multiarch: "aarch64-linux-gnu",
        pe_machine: 0xAA64,
        efi_boot_file: "BOOTAA64.EFI",
        efi_suffix: "aa64",
        bios: false,
    },
];

impl Arch {
    /// The architecture this program is compiled for: the machine's own,
    /// for the runtime and the installer, which run on it.
    pub const NATIVE: Arch = if cfg!(target_arch = "aarch64") {
        Arch::Arm64
    } else {
        Arch::Amd64
    };

    /// The architecture of an OCI platform's or a payload manifest's
    /// `architecture` (`amd64`, `arm64`: exactly, no alias).
    pub fn of_name(name: &str) -> Option<Arch> {
        ARCHES.iter().find(|s| s.name == name).map(|s| s.arch)
    }

    /// This architecture's row of [`ARCHES`].
    pub fn spec(self) -> &'static ArchSpec {
        match self {
            Arch::Amd64 => &ARCHES[0],
            Arch::Arm64 => &ARCHES[1],
        }
    }

    /// The C compiler that builds for it on an x86-64 host (`gcc`, or the
    /// cross compiler `aarch64-linux-gnu-gcc`).
    pub fn gcc(self) -> String {
        format!("{}gcc", self.spec().cross_compile)
    }

    /// The removable-media boot path on the ESP, where systemd-boot goes
    /// (`EFI/BOOT/BOOTX64.EFI`, `EFI/BOOT/BOOTAA64.EFI`).
    pub fn esp_boot_loader(self) -> String {
        format!("EFI/BOOT/{}", self.spec().efi_boot_file)
    }

    /// The profile's and OCI's name (`amd64`, `arm64`).
    pub fn name(self) -> &'static str {
        self.spec().name
    }

    /// The architecture of `name` (`amd64`, `arm64`; also the kernel's and
    /// GNU's names, `x86_64` and `aarch64`), or an error that lists them.
    pub fn parse(name: &str) -> Result<Arch, String> {
        match name {
            "amd64" | "x86_64" => Ok(Arch::Amd64),
            "arm64" | "aarch64" => Ok(Arch::Arm64),
            _ => Err(format!(
                "unknown architecture {}: give amd64 or arm64",
                crate::text::quote(name, 40)
            )),
        }
    }

    /// The architecture of a kernel config's `# Linux/<srcarch> …` header.
    pub fn of_kernel_arch(srcarch: &str) -> Option<Arch> {
        ARCHES
            .iter()
            .find(|s| s.kernel_arch == srcarch)
            .map(|s| s.arch)
    }

    /// The architecture of an executable's ELF machine field.
    pub fn of_elf_machine(machine: u16) -> Option<Arch> {
        ARCHES
            .iter()
            .find(|s| s.elf_machine == machine)
            .map(|s| s.arch)
    }

    /// The architecture of an EFI program's PE machine field.
    pub fn of_pe_machine(machine: u16) -> Option<Arch> {
        ARCHES
            .iter()
            .find(|s| s.pe_machine == machine)
            .map(|s| s.arch)
    }
}

/// The PE/COFF machine of the image whose first bytes are `head` (the `MZ`
/// header, its `e_lfanew` at 0x3c, the `PE\0\0` signature, then the
/// machine), or `None` when `head` is not a PE image or is cut before
/// the machine. The one reader of it for EFI programs' checks (the boot
/// loader, the kernel's EFI stub, a payload's boot loader on the ESP).
pub fn pe_machine(head: &[u8]) -> Option<u16> {
    let pe = pe_header(head)?;
    let m = head.get(pe + 4..pe + 6)?;
    Some(u16::from_le_bytes([m[0], m[1]]))
}

/// The offset of the `PE\0\0` signature in `head` (the `MZ` header's
/// `e_lfanew`, past the 64-byte DOS header), or `None`: where
/// [`pe_machine`] and other readers of a PE header's fields start.
pub fn pe_header(head: &[u8]) -> Option<usize> {
    if !head.starts_with(b"MZ") {
        return None;
    }
    let at = head.get(0x3c..0x40)?;
    let pe = u32::from_le_bytes([at[0], at[1], at[2], at[3]]) as usize;
    (pe >= 0x40 && head.get(pe..pe.checked_add(4)?)? == b"PE\0\0").then_some(pe)
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    /// The PE machine of a well-formed header, and `None` (never a panic)
    /// for each way a hostile one is wrong.
    #[test]
    fn pe_machine_reads_a_pe_header_and_refuses_a_broken_one() {
        let mut ok = vec![0u8; 0x48];
        ok[..2].copy_from_slice(b"MZ");
        ok[0x3c..0x40].copy_from_slice(&0x40u32.to_le_bytes());
        ok[0x40..0x44].copy_from_slice(b"PE\0\0");
        ok[0x44..0x46].copy_from_slice(&0xaa64u16.to_le_bytes());
        assert_eq!(pe_machine(&ok), Some(0xaa64));
        assert_eq!(Arch::of_pe_machine(0xaa64), Some(Arch::Arm64));
        for n in 0..0x46 {
            assert_eq!(pe_machine(&ok[..n]), None, "cut at {n}");
        }
        for (at, bytes) in [
            (0, &b"ZM"[..]),
            (0x3c, &0xffff_ffffu32.to_le_bytes()[..]),
            (0x3c, &0x1000u32.to_le_bytes()[..]),
            (0x3c, &0x3cu32.to_le_bytes()[..]),
            (0x40, &b"PE\0\x01"[..]),
        ] {
            let mut b = ok.clone();
            b[at..at + bytes.len()].copy_from_slice(bytes);
            assert_eq!(pe_machine(&b), None, "{at:#x}: {bytes:?}");
        }
    }

    use super::*;

    /// The table's invariants: one row per architecture in order, and no
    /// two rows share a name, kernel arch, target, machine or boot file.
    #[test]
    fn the_table_has_one_row_per_arch_and_no_shared_values() {
        for (i, s) in ARCHES.iter().enumerate() {
            assert_eq!(s.arch.spec(), s, "row {i}");
            assert_eq!(Arch::parse(s.name), Ok(s.arch));
            assert_eq!(Arch::of_kernel_arch(s.kernel_arch), Some(s.arch));
            assert_eq!(Arch::of_pe_machine(s.pe_machine), Some(s.arch));
            assert_eq!(Arch::of_elf_machine(s.elf_machine), Some(s.arch));
            assert!(
                s.kernel_image
                    .starts_with(&format!("arch/{}/boot/", s.kernel_arch))
            );
            assert!(s.kernel_image.ends_with(s.kernel_target));
            assert!(
                s.efi_boot_file
                    .eq_ignore_ascii_case(&format!("BOOT{}.EFI", s.efi_suffix))
            );
            for o in &ARCHES[i + 1..] {
                assert_ne!(s.name, o.name);
                assert_ne!(s.kernel_arch, o.kernel_arch);
                assert_ne!(s.rust_target, o.rust_target);
                assert_ne!(s.elf_machine, o.elf_machine);
                assert_ne!(s.multiarch, o.multiarch);
                assert_ne!(s.pe_machine, o.pe_machine);
                assert_ne!(s.efi_boot_file, o.efi_boot_file);
            }
        }
        // The host the builder runs on builds natively.
        assert_eq!(Arch::default().spec().cross_compile, "");
        assert_eq!(Arch::parse("x86_64"), Ok(Arch::Amd64));
        assert_eq!(Arch::parse("aarch64"), Ok(Arch::Arm64));
        let e = Arch::parse("riscv64\u{1b}[2J").unwrap_err();
        assert!(
            e.contains("give amd64 or arm64") && !e.contains('\u{1b}'),
            "{e}"
        );
    }
}
