//! GUIDs: the type GUIDs we use (checked against their specifications in the
//! tests below) and the derivation of unique GUIDs from content.
//!
//! No GUID written by the builder comes from a random source: the disk GUID is
//! derived from the image's identity (name, version and the digests of its
//! payload), each partition GUID from the disk GUID and the partition label.
//! The same inputs therefore give the same disk, byte for byte.
//!
//! An installation gets its own: `imager install` and the live installer
//! give the disk a random GUID ([`installed`], version 4), and a built disk
//! written as it is (`dd`) gets one at its first boot
//! (`bootstate::gpt::reidentify`); its partitions' GUIDs are derived from
//! it as at build time. A disk GUID of version 8 ([`is_derived`]) is
//! therefore the image's own: only the build makes those.

use sha2::{Digest, Sha256};
pub use uuid::Uuid as Guid;

/// EFI System Partition (UEFI 2.10, table 5.7).
pub const EFI_SYSTEM: Guid = Guid::from_u128(0xC12A7328_F81F_11D2_BA4B_00A0C93EC93B);
/// BIOS boot partition, where GRUB's core image goes ("Hah!IdontNeedEFI").
pub const BIOS_BOOT: Guid = Guid::from_u128(0x21686148_6449_6E6F_744E_656564454649);
/// Extended Boot Loader Partition (XBOOTLDR) of the Boot Loader Specification
/// and the Discoverable Partitions Specification.
pub const XBOOTLDR: Guid = Guid::from_u128(0xBC13C2FF_59E6_4262_A352_B275FD6F7172);
/// Linux filesystem data, used for META, STATE and EPHEMERAL as Talos does.
pub const LINUX_DATA: Guid = Guid::from_u128(0x0FC63DAF_8483_4772_8E79_3D69D8477DE4);
/// Linux reserved (util-linux's table, sgdisk's 8301): the EFI partition of
/// a 4096-byte-sector disk, which holds nothing ([`crate::partition::esp_role`]).
pub const LINUX_RESERVED: Guid = Guid::from_u128(0x8DA63339_0007_60C0_C436_083AC8230908);

/// Domain separator of every derived GUID; bump the suffix to change the scheme.
const DERIVE_DOMAIN: &[u8] = b"imager.guid.v1";

/// Derives a GUID from a purpose and a list of inputs.
///
/// The GUID is the first 16 bytes of SHA-256 over the domain, the purpose and
/// every input (each length-prefixed so that no two lists collide), with the
/// RFC 9562 version 8 ("custom") and variant bits set: it is honest about not
/// being random.
pub fn derive(purpose: &str, inputs: &[&[u8]]) -> Guid {
    let mut h = Sha256::new();
    for part in std::iter::once(DERIVE_DOMAIN)
        .chain(std::iter::once(purpose.as_bytes()))
        .chain(inputs.iter().copied())
    {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part);
    }
    let digest = h.finalize();
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    uuid::Builder::from_custom_bytes(bytes).into_uuid()
}

/// The disk GUID of an image, from its identity string (see
/// [`crate::paths::image_identity`]).
pub fn disk_guid(image_identity: &str) -> Guid {
    derive("disk", &[image_identity.as_bytes()])
}

/// A disk GUID of an installation, from 16 random bytes the caller takes
/// from the system's random source: RFC 9562 version 4.
pub fn installed(random: [u8; 16]) -> Guid {
    uuid::Builder::from_random_bytes(random).into_uuid()
}

/// Whether `disk` is a disk GUID derived from an image's content (version
/// 8, [`derive`]): the image's own, which every disk written from the
/// image as it is carries.
pub fn is_derived(disk: Guid) -> bool {
    disk.get_version_num() == 8
}

/// The unique GUID of the partition `label` on the disk `disk`.
pub fn partition_guid(disk: Guid, label: &str) -> Guid {
    derive("partition", &[disk.as_bytes(), label.as_bytes()])
}

/// The 32-bit FAT volume serial of the filesystem in partition `label`.
pub fn volume_id(disk: Guid, label: &str) -> u32 {
    let g = derive("fat-volume-id", &[disk.as_bytes(), label.as_bytes()]);
    let b = g.as_bytes();
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The constants against their textual form in the specifications.
    #[test]
    fn type_guids_match_specifications() {
        let spec = [
            (EFI_SYSTEM, "c12a7328-f81f-11d2-ba4b-00a0c93ec93b"),
            (BIOS_BOOT, "21686148-6449-6e6f-744e-656564454649"),
            (XBOOTLDR, "bc13c2ff-59e6-4262-a352-b275fd6f7172"),
            (LINUX_DATA, "0fc63daf-8483-4772-8e79-3d69d8477de4"),
            (LINUX_RESERVED, "8da63339-0007-60c0-c436-083ac8230908"),
        ];
        for (g, text) in spec {
            assert_eq!(g.hyphenated().to_string(), text);
        }
        // The BIOS boot GUID spells "Hah!IdontNeedEFI" in its mixed-endian
        // on-disk form, which is how GRUB's documentation identifies it.
        assert_eq!(&BIOS_BOOT.to_bytes_le(), b"Hah!IdontNeedEFI");
    }

    #[test]
    fn derived_guids_are_stable_and_distinct() {
        let d = disk_guid("metal 1.0.0 abc");
        assert_eq!(d, disk_guid("metal 1.0.0 abc"));
        assert_ne!(d, disk_guid("metal 1.0.1 abc"));
        assert_ne!(partition_guid(d, "BOOT"), partition_guid(d, "EFI"));
        assert_eq!(d.get_version_num(), 8);
        assert_eq!(d.get_variant(), uuid::Variant::RFC4122);
        // Length prefixes: moving a byte between inputs changes the result.
        assert_ne!(derive("x", &[b"ab", b"c"]), derive("x", &[b"a", b"bc"]));
        // An installation's GUID is version 4 and never taken for the
        // image's own; the image's is.
        let i = installed([0xa5; 16]);
        assert_eq!(i.get_version_num(), 4);
        assert_eq!(i.get_variant(), uuid::Variant::RFC4122);
        assert!(is_derived(d) && !is_derived(i));
    }
}
