//! The cloud and hypervisor platforms: for each, the output that makes its
//! image, what its importer takes, and the checks a profile must pass
//! before anything is built. One table ([`PLATFORMS`]); docs/outputs.md
//! says the same per platform with its import command.
//!
//! What each platform's image is made of is in its writer: `gcp`
//! ([`super::gce`]), `azure` ([`super::vhd`]), `vmware` ([`super::ova`]),
//! `aws` ([`super::vmdk`]). All four carry the same disk as `disk.raw`,
//! whose kernel has every platform's storage and network drivers built in
//! (`kernel-config/hardware.config`).

use crate::profile::{Output, Profile};

/// One platform's rules.
#[derive(Debug, Clone, Copy)]
pub struct Platform {
    pub output: Output,
    /// The platform, as its maker names it.
    pub name: &'static str,
    /// The disk's size must be a whole number of these bytes.
    pub size_unit: u64,
    /// The rule behind [`Platform::size_unit`], as a refusal says it.
    pub size_rule: &'static str,
    /// The console the platform shows its user: the kernel's command line
    /// must name it (`console=` followed by this name).
    pub console: &'static str,
    /// Where the platform shows that console.
    pub console_rule: &'static str,
    /// The kernel options of the drivers the platform's disks and NICs
    /// need, each built in (`=y`); a build whose kernel lacks one says so
    /// ([`lacking_drivers`]).
    pub drivers: &'static [&'static str],
}

const MIB: u64 = 1 << 20;
/// The size rule of the platforms that take a stream-optimised VMDK.
const VMDK_SIZE_RULE: &str = "a stream-optimised VMDK's capacity is whole 64 KiB grains \
                              (VMware's Virtual Disk Format 5.0), and imager asks a whole \
                              number of MiB";
const GIB: u64 = 1 << 30;

/// Every platform, in the order of [`Output`].
pub const PLATFORMS: [Platform; 4] = [
    Platform {
        output: Output::Gcp,
        name: "Google Compute Engine",
        size_unit: GIB,
        size_rule: "Compute Engine imports a disk.raw of a whole number of GiB",
        console: "ttyS0",
        console_rule: "Compute Engine's serial console and `gcloud compute instances \
                       get-serial-port-output` show the first serial port",
        // virtio-scsi and NVMe disks; virtio-net and gVNIC.
        drivers: &[
            "CONFIG_SCSI_VIRTIO",
            "CONFIG_BLK_DEV_NVME",
            "CONFIG_VIRTIO_NET",
            "CONFIG_GVE",
        ],
    },
    Platform {
        output: Output::Azure,
        name: "Microsoft Azure",
        size_unit: MIB,
        size_rule: "Azure takes a fixed VHD whose virtual size is a whole number of MiB",
        console: "ttyS0",
        console_rule: "Azure's serial console and boot diagnostics show the first serial port",
        // VMBus, its storage and network; NVMe on newer sizes.
        drivers: &[
            "CONFIG_HYPERV",
            "CONFIG_HYPERV_STORAGE",
            "CONFIG_HYPERV_NET",
            "CONFIG_BLK_DEV_NVME",
        ],
    },
    Platform {
        output: Output::Vmware,
        name: "VMware vSphere",
        size_unit: MIB,
        size_rule: VMDK_SIZE_RULE,
        console: "tty0",
        console_rule: "vSphere's console shows the virtual machine's screen",
        // The OVA's SATA disk, PVSCSI, VMXNET3; the screen under EFI.
        drivers: &[
            "CONFIG_SATA_AHCI",
            "CONFIG_VMWARE_PVSCSI",
            "CONFIG_VMXNET3",
            "CONFIG_FB_EFI",
        ],
    },
    Platform {
        output: Output::Aws,
        name: "Amazon EC2",
        size_unit: MIB,
        size_rule: VMDK_SIZE_RULE,
        console: "ttyS0",
        console_rule: "EC2's serial console and `aws ec2 get-console-output` show the first \
                       serial port",
        // Nitro's NVMe and ENA; Xen's block and network front ends.
        drivers: &[
            "CONFIG_BLK_DEV_NVME",
            "CONFIG_ENA_ETHERNET",
            "CONFIG_XEN_BLKDEV_FRONTEND",
            "CONFIG_XEN_NETDEV_FRONTEND",
        ],
    },
];

/// The platform whose output is `o`, if it is one.
pub fn of(o: Output) -> Option<&'static Platform> {
    PLATFORMS.iter().find(|p| p.output == o)
}

/// Checks the profile `p` against the rules of every platform it makes an
/// image for; the error is the profile key and what to do.
pub fn check(p: &Profile) -> Result<(), (&'static str, String)> {
    for pl in PLATFORMS.iter().filter(|pl| p.outputs.contains(&pl.output)) {
        let out = pl.output.name();
        check_disk(p, pl.output, pl.name, pl.size_unit, pl.size_rule)?;
        let named = p.kernel.cmdline.iter().any(|a| {
            a.strip_prefix("console=")
                .is_some_and(|c| c.split(',').next() == Some(pl.console))
        });
        if !named {
            return Err((
                "kernel.cmdline",
                format!(
                    "the output {out}: {}; add console={} to kernel.cmdline (the default \
                     profiles have console=tty0 console=ttyS0,115200) or drop {out} from \
                     outputs",
                    pl.console_rule, pl.console
                ),
            ));
        }
    }
    Ok(())
}

/// The rules of the output `vhd` (`disk.vhd`, a fixed VHD for the clouds
/// that take one): the same as `azure`'s disk.
pub const VHD_SIZE_RULE: &str = "a cloud that takes a VHD refuses one whose virtual size is not \
                                 a whole number of MiB";

/// Checks that the disk of the profile `p` is one the output `o` (made for
/// `maker`) can carry: 512-byte sectors, and a size a whole number of
/// `unit` bytes (`rule` says why). Used by every platform and by `vhd`.
pub fn check_disk(
    p: &Profile,
    o: Output,
    maker: &str,
    unit: u64,
    rule: &str,
) -> Result<(), (&'static str, String)> {
    let out = o.name();
    if p.disk.sector_size != 512 {
        return Err((
            "disk.sector_size",
            format!(
                "the output {out} is a disk of 512-byte sectors ({maker} attaches its disks with \
                 512-byte logical sectors): use 512, or drop {out} from outputs"
            ),
        ));
    }
    let size = p.disk.size.0;
    if !size.is_multiple_of(unit) {
        let up = size.next_multiple_of(unit);
        return Err((
            "disk.size",
            format!(
                "the output {out}: {rule} ({size} bytes is not one); make disk.size {} or drop \
                 {out} from outputs",
                if unit == GIB {
                    format!("{}GiB", up / GIB)
                } else if unit == MIB {
                    format!("{}MiB", up / MIB)
                } else {
                    format!("{up}")
                }
            ),
        ));
    }
    Ok(())
}

/// What a build with `outputs` whose kernel is `config` lacks of the
/// drivers of each platform it makes an image for: one warning per
/// platform, none when nothing lacks. A warning, not a refusal: a kernel
/// trimmed to the instance types one uses is a choice (docs/outputs.md).
pub fn lacking_drivers(outputs: &[Output], config: &crate::kernel::KernelConfig) -> Vec<String> {
    use crate::kernel::config::Value;
    let mut warnings = Vec::new();
    for pl in PLATFORMS.iter().filter(|pl| outputs.contains(&pl.output)) {
        let lacking: Vec<&str> = pl
            .drivers
            .iter()
            .copied()
            .filter(|d| config.get(d) != Some(&Value::Set("y".into())))
            .collect();
        if !lacking.is_empty() {
            warnings.push(format!(
                "warning: the output {}: the kernel does not build in {}, which {}'s disks or \
                 NICs need: the image may not find its disk or network there (the default \
                 profiles' kernel-config/hardware.config has them)",
                pl.output.name(),
                lacking.join(", "),
                pl.name,
            ));
        }
    }
    warnings
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every platform output is in the table once, is a disk output, and
    /// its size unit is a whole number of sectors.
    #[test]
    fn every_platform_output_has_one_row() {
        for o in [Output::Gcp, Output::Azure, Output::Vmware, Output::Aws] {
            assert_eq!(PLATFORMS.iter().filter(|p| p.output == o).count(), 1);
            assert!(o.is_disk());
            assert!(of(o).unwrap().size_unit.is_multiple_of(512));
        }
        assert!(of(Output::Raw).is_none());
    }

    /// The drivers of every platform are in `kernel-config/hardware.config`
    /// (the default profiles' fragment), built in.
    #[test]
    fn every_platforms_drivers_are_in_the_hardware_fragment() {
        let dir = env!("CARGO_MANIFEST_DIR");
        let text = std::fs::read_to_string(format!("{dir}/../kernel-config/hardware.config"))
            .unwrap()
            + &std::fs::read_to_string(format!("{dir}/../kernel-config/network.config")).unwrap();
        for pl in &PLATFORMS {
            for d in pl.drivers {
                assert!(
                    text.lines().any(|l| l == format!("{d}=y")),
                    "{}: {d}",
                    pl.name
                );
            }
        }
    }

    /// A kernel without a platform's driver gets a warning for that
    /// platform's output, naming the option; other outputs do not care.
    #[test]
    fn a_kernel_without_a_platforms_driver_is_warned_of() {
        use crate::kernel::KernelConfig;
        let all: String = PLATFORMS
            .iter()
            .flat_map(|p| p.drivers)
            .map(|d| format!("{d}=y\n"))
            .collect();
        let full = KernelConfig::parse(&all).unwrap();
        let outputs = [
            Output::Raw,
            Output::Gcp,
            Output::Azure,
            Output::Vmware,
            Output::Aws,
        ];
        assert!(lacking_drivers(&outputs, &full).is_empty());
        let less = KernelConfig::parse(&all.replace("CONFIG_GVE=y\n", "# CONFIG_GVE is not set\n"))
            .unwrap();
        let w = lacking_drivers(&outputs, &less);
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].starts_with(
                "warning: the output gcp: the kernel does not build in CONFIG_GVE, which Google \
                 Compute Engine's disks or NICs need"
            ),
            "{w:?}"
        );
        assert!(lacking_drivers(&[Output::Raw, Output::Aws], &less).is_empty());
        assert!(lacking_drivers(&[Output::Raw], &KernelConfig::new()).is_empty());
        assert_eq!(lacking_drivers(&outputs, &KernelConfig::new()).len(), 4);
    }
}
