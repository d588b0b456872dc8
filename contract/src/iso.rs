//! The live ISO: where its files sit, what its volume says, and how each
//! boot loader starts the live system.
//!
//! ```text
//! /boot/grub/eltorito.img   GRUB's El Torito image (BIOS, from CD and USB)
//! /boot/grub/grub.cfg       GRUB's configuration: [`grub_cfg`]
//! /boot/efi.img             FAT image: the UEFI boot image and the ESP on USB
//!     EFI/BOOT/BOOTX64.EFI      systemd-boot
//!     loader/loader.conf        no menu, no editor
//!     loader/entries/live.conf  the live entry: [`live_entry`]
//!     live/vmlinuz              the kernel
//!     live/initramfs.zst        the live initramfs (runtime, root filesystem,
//!                               the signed payload and the installer)
//! ```
//!
//! An image whose slots boot UKIs (`boot.uki`, Secure Boot) has, in place
//! of `loader/entries/live.conf`, the live system's UKI
//! `EFI/Linux/live.efi` ([`LIVE_UKI`]; signed with Secure Boot, beside a
//! signed systemd-boot and, for its enrolment, `loader/keys/auto/`): the
//! command line is inside it. GRUB (BIOS) boots `live/` as before.
//!
//! The kernel and the initramfs are stored once, in the FAT image:
//! systemd-boot cannot read ISO 9660, and GRUB reads the FAT image through
//! `loopback`. Both give the kernel the same command line: the image's, then
//! `machined.live=<ID>`, where ID names this ISO (it is also the volume set
//! identifier of its primary volume descriptor, so that the live system can
//! tell its own boot medium from the disk it is asked to install to).

use crate::boot::Entry;

/// GRUB's El Torito boot image in the ISO tree.
pub const ELTORITO_IMAGE: &str = "boot/grub/eltorito.img";
/// GRUB's configuration in the ISO tree (the core image's prefix is
/// [`GRUB_PREFIX`]).
pub const GRUB_CFG: &str = "boot/grub/grub.cfg";
/// The prefix of the El Torito core image: `/boot/grub` on the device GRUB
/// was loaded from (the CD, or the whole USB disk, which reads as ISO 9660).
pub const GRUB_PREFIX: &str = "/boot/grub";
/// The FAT image in the ISO tree: the UEFI El Torito boot image, and the
/// EFI System Partition of the ISO written to a disk.
pub const EFI_IMAGE: &str = "boot/efi.img";
/// The kernel in the FAT image.
pub const LIVE_KERNEL: &str = "live/vmlinuz";
/// The live initramfs in the FAT image.
pub const LIVE_INITRAMFS: &str = "live/initramfs.zst";
/// The live boot entry in the FAT image.
pub const LIVE_ENTRY: &str = "loader/entries/live.conf";
/// The live system's UKI in the FAT image, when the image boots UKIs.
pub const LIVE_UKI: &str = "EFI/Linux/live.efi";

/// The `.osrel` of the live UKI: as a slot's
/// ([`crate::boot::uki_os_release`]), titled `<title> (live)`.
pub fn live_os_release(name: &str, title: &str, version: &str) -> String {
    format!("NAME=\"{name}\"\nPRETTY_NAME=\"{title} (live)\"\nVERSION_ID={version}\n")
}
/// GRUB's name for the FAT image once it is attached with `loopback`.
const LOOP: &str = "efi";

/// How the live system's console line after an install starts (after
/// `machined: `): `installed 0.1.0 on /dev/vda (slot A); powering off`.
pub const INSTALLED: &str = "installed ";
/// How the live system's console line about an install that was refused or
/// failed ends: `install: …; the live system stays up`.
pub const INSTALL_NOT_DONE: &str = "; the live system stays up";

/// The longest volume identifier of a primary volume descriptor.
pub const VOLUME_ID_LEN: usize = 32;

/// The ISO's volume identifier: `NAME_VERSION` in d-characters (upper case
/// letters, digits and `_`; anything else becomes `_`), at most
/// [`VOLUME_ID_LEN`] characters.
pub fn volume_id(name: &str, version: &str) -> String {
    format!("{name}_{version}")
        .chars()
        .map(|c| {
            let c = c.to_ascii_uppercase();
            if c.is_ascii_uppercase() || c.is_ascii_digit() {
                c
            } else {
                '_'
            }
        })
        .take(VOLUME_ID_LEN)
        .collect()
}

/// The longest publisher identifier of a primary volume descriptor.
pub const PUBLISHER_LEN: usize = 128;

/// The ISO's publisher identifier: `pretty_name` in a-characters (upper
/// case; anything else becomes `_`), at most [`PUBLISHER_LEN`] characters.
pub fn publisher(pretty_name: &str) -> String {
    pretty_name
        .chars()
        .map(|c| {
            let c = c.to_ascii_uppercase();
            if c.is_ascii_uppercase() || c.is_ascii_digit() || " !\"%&'()*+,-./:;<=>?_".contains(c)
            {
                c
            } else {
                '_'
            }
        })
        .take(PUBLISHER_LEN)
        .collect()
}

/// The live entry systemd-boot boots from the FAT image.
pub fn live_entry(title: &str, version: &str, options: &str) -> Entry {
    Entry {
        title: format!("{title} (live)"),
        version: version.to_string(),
        linux: LIVE_KERNEL.to_string(),
        initrd: LIVE_INITRAMFS.to_string(),
        options: options.to_string(),
    }
}

/// GRUB's `grub.cfg` on the ISO: the serial console, the FAT image attached
/// with `loopback`, and the same kernel, initramfs and options as
/// [`live_entry`]. Refused when `options` holds a character GRUB would pass
/// to the kernel escaped ([`crate::grub::unpassable`]).
pub fn grub_cfg(options: &str) -> Result<String, String> {
    if let Some(c) = crate::grub::unpassable(options) {
        return Err(format!(
            "the kernel command line holds `{c}`, which GRUB (the BIOS boot path) passes to \
             the kernel escaped with a backslash: remove it"
        ));
    }
    let mut linux = format!("linux ({LOOP})/{LIVE_KERNEL}");
    for w in options.split_whitespace() {
        linux.push(' ');
        linux.push_str(&crate::grubcfg::word(w));
    }
    Ok(format!(
        "serial --unit=0 --speed=115200\n\
         terminal_input serial console\n\
         terminal_output serial console\n\
         set timeout=0\n\
         loopback {LOOP} /{EFI_IMAGE}\n\
         {linux}\n\
         initrd ({LOOP})/{LIVE_INITRAMFS}\n\
         boot\n\
         echo \"imager: the live system could not be loaded\"\n"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn volume_id_is_d_characters() {
        assert_eq!(volume_id("metal", "0.1.0"), "METAL_0_1_0");
        assert_eq!(publisher("Imager ü-1"), "IMAGER _-1");
        let long = volume_id(&"n".repeat(40), "1");
        assert_eq!(long.len(), VOLUME_ID_LEN);
        assert!(
            volume_id("a-b.c", "1.0+x")
                .chars()
                .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
        );
    }

    #[test]
    fn both_loaders_boot_the_same_files_and_options() {
        let e = live_entry("Imager 1.0", "1.0", "console=ttyS0 machined.live=ab12");
        let cfg = grub_cfg(&e.options).unwrap();
        assert!(cfg.contains(&format!(
            "linux (efi)/{} console=ttyS0 machined.live=ab12\n",
            e.linux
        )));
        assert!(cfg.contains(&format!("initrd (efi)/{}\n", e.initrd)));
        assert!(cfg.contains(&format!("loopback efi /{EFI_IMAGE}\n")));
        assert!(e.render().contains("linux /live/vmlinuz\n"));
        assert!(grub_cfg("a=\"b\"").unwrap_err().contains("escaped"));
        // Words GRUB's parser would expand are quoted.
        assert!(grub_cfg("x=$y").unwrap().contains(" 'x=$y'\n"));
    }
}
