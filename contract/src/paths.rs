//! Paths inside the images: in the initramfs, in the root filesystem, on the
//! EFI System Partition and where the runtime mounts things.

/// The runtime binary in the initramfs: stage 1, run by the kernel.
pub const INITRAMFS_INIT: &str = "init";
/// The squashfs root filesystem inside the initramfs.
pub const INITRAMFS_ROOTFS: &str = "rootfs.sqsh";
/// Where stage 1 assembles the new root before switching to it.
pub const INITRAMFS_NEWROOT: &str = "newroot";

/// The runtime binary in the root filesystem: stage 2, PID 1 after switch-root.
pub const ROOTFS_INIT: &str = "/usr/bin/machined";
/// os-release written by the builder (NAME, ID, VERSION_ID, IMAGE_ID...).
pub const ROOTFS_OS_RELEASE: &str = "/usr/lib/os-release";

/// tmpfs for files the runtime generates; every file under it is reproducible.
pub const SYSTEM_DIR: &str = "/system";
/// Generated files bind-mounted over their /etc counterparts.
pub const SYSTEM_ETC: &str = "/system/etc";
/// The /etc files that are generated under [`SYSTEM_ETC`] and bind-mounted.
pub const GENERATED_ETC_FILES: [&str; 2] = ["hosts", "resolv.conf"];
/// Where STATE is mounted (XFS, machine configuration and identity).
pub const STATE_MOUNT: &str = "/system/state";
/// Where EPHEMERAL is mounted (XFS).
pub const EPHEMERAL_MOUNT: &str = "/var";

/// The removable-media boot path on the ESP, where systemd-boot goes.
pub const ESP_BOOT_LOADER: &str = "EFI/BOOT/BOOTX64.EFI";
/// systemd-boot's configuration, on the ESP.
pub const ESP_LOADER_CONF: &str = "loader/loader.conf";
/// Boot Loader Specification type #1 entries, on BOOT (XBOOTLDR).
pub const BOOT_ENTRIES_DIR: &str = "loader/entries";

/// The identity of an image, the input of its disk GUID.
pub fn image_identity(name: &str, version: &str, payload_digests: &[&str]) -> String {
    let mut s = format!("{name}\n{version}\n");
    for d in payload_digests {
        s.push_str(d);
        s.push('\n');
    }
    s
}

/// The installer container image (`imager build` output `installer`): where
/// its files are, relative to the image's root.
///
/// The installer binary (the static `imager`).
pub const INSTALLER_BINARY: &str = "usr/bin/imager";
/// A symbolic link to [`INSTALLER_BINARY`]: run under this name, the binary
/// acts as the installer. `/usr/bin/installer` is the image's entrypoint.
pub const INSTALLER_LINK: &str = "usr/bin/installer";
/// The directory of the payload the installer writes to a disk: the four
/// `PAYLOAD_*` files, the manifest signed by the build's key.
pub const INSTALLER_PAYLOAD_DIR: &str = "usr/install/amd64";
/// The payload's kernel.
pub const PAYLOAD_KERNEL: &str = "vmlinuz";
/// The payload's initramfs.
pub const PAYLOAD_INITRAMFS: &str = "initramfs.zst";
/// The payload's signed manifest: lists exactly the kernel and the initramfs.
pub const PAYLOAD_MANIFEST: &str = "manifest.json";
/// The detached signature of [`PAYLOAD_MANIFEST`].
pub const PAYLOAD_SIGNATURE: &str = "manifest.json.sig";
/// Every file of the payload directory.
/// The boot loader (systemd-boot) in the payload, for installs on blank disks;
/// listed in the payload manifest, but not required by readers.
pub const PAYLOAD_BOOT_LOADER: &str = "systemd-bootx64.efi";
pub const PAYLOAD_FILES: [&str; 4] = [
    PAYLOAD_KERNEL,
    PAYLOAD_INITRAMFS,
    PAYLOAD_MANIFEST,
    PAYLOAD_SIGNATURE,
];
