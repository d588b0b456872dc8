//! Boot files and the raw disk image.
//!
//! The ESP holds systemd-boot at the removable-media path and its
//! loader.conf; BOOT (XBOOTLDR) holds each slot's kernel and initramfs,
//! named by content hash, and its Boot Loader Specification entry; see
//! [`contract::boot`]. [`write_raw_image`] puts the pieces on a disk.

use crate::disk::{BiosBoot, FatFile, FatParams, Layout, PlacedPartition, format_fat, write_disk};
use crate::io::Window;
use anyhow::{Context, Result, ensure};
use bootstate::ops::Payload;
use contract::boot::{Entry, EntryKind, EntryName, loader_conf};
use contract::guid::volume_id;
use contract::meta::Meta;
use contract::partition::Content;
use contract::paths::ESP_LOADER_CONF;
use contract::{Guid, Slot};
use std::io::Write;
use std::path::Path;

/// Where Debian's systemd-boot-efi package puts the x86-64 boot loader.
pub const DEFAULT_SYSTEMD_BOOT: &str = "/usr/lib/systemd/boot/efi/systemd-bootx64.efi";

/// The files of the EFI System Partition: systemd-boot for `arch` at its
/// removable-media path (`EFI/BOOT/BOOTX64.EFI`, `BOOTAA64.EFI`) and
/// `loader/loader.conf`.
pub fn esp_files(systemd_boot: &Path, arch: contract::Arch) -> Result<Vec<FatFile>> {
    ensure!(
        systemd_boot.is_file(),
        "systemd-boot not found at {}: install systemd-boot-efi (scripts/setup.sh) \
         or set boot.systemd_boot in the profile",
        systemd_boot.display()
    );
    check_efi_binary(systemd_boot, arch)?;
    Ok(vec![
        FatFile::file(arch.esp_boot_loader(), systemd_boot),
        FatFile::bytes(ESP_LOADER_CONF, loader_conf()),
    ])
}

/// Refuses a boot loader that is not an EFI program of `arch` (a PE image
/// for its machine: 0x8664, 0xAA64; `contract::arch`): a path pointing at
/// the wrong file must not put that file, perhaps a secret, on the ESP of a
/// published image.
pub fn check_efi_binary(path: &Path, arch: contract::Arch) -> Result<()> {
    let spec = arch.spec();
    let head = crate::input::read_head(path, "boot loader", 4096)?;
    ensure!(
        contract::arch::pe_machine(&head) == Some(spec.pe_machine),
        "{} is not an EFI program for {arch} (PE for machine {:#06x}): set boot.systemd_boot \
         to systemd-boot{}.efi",
        path.display(),
        spec.pe_machine,
        spec.efi_suffix
    );
    Ok(())
}

/// The title of an image, slot aside: `<pretty name> <version>`. Every
/// build's manifest carries it (`boot.title`); a slot's entry adds the slot
/// ([`contract::boot::entry_title`]).
pub fn image_title(name: &str, version: &str) -> String {
    format!("{name} {version}")
}

/// The length of the command line the kernel receives from a slot's boot
/// entry with the image command line `cmdline`: the contract's (the signed
/// manifest checks it too).
pub use contract::boot::loaded_cmdline_len;

/// The boot entry of `slot` (see [`contract::boot::slot_entry`]).
pub fn entry(
    slot: Slot,
    kernel_sha256: &str,
    initramfs_sha256: &str,
    name: &str,
    version: &str,
    cmdline: &str,
) -> Entry {
    contract::boot::slot_entry(
        slot,
        kernel_sha256,
        initramfs_sha256,
        &image_title(name, version),
        version,
        cmdline,
    )
}

/// The files of `slot` on BOOT: its kernel and initramfs (from these paths)
/// under the content names entry `e` gives them, `e` itself, and GRUB's
/// `grub.cfg` booting the same entry (the BIOS path, [`contract::grub`]).
pub fn boot_files(slot: Slot, e: &Entry, kernel: &Path, initramfs: &Path) -> Result<Vec<FatFile>> {
    // GRUB's rendering of the same state (contract::grubcfg): the script
    // with `slot` good, no trial in the block, and the slot's own lines.
    let slot_cfg = contract::grubcfg::slot_config(slot, e)
        .map_err(anyhow::Error::msg)
        .context("rendering GRUB's lines of the slot")?;
    let env = contract::grubenv::GrubEnv::none()
        .render()
        .map_err(anyhow::Error::msg)
        .context("rendering GRUB's environment block")?;
    let mut files = vec![
        FatFile::file(e.linux.clone(), kernel),
        FatFile::file(e.initrd.clone(), initramfs),
        FatFile::bytes(EntryName::good(1, slot).path(), e.render()),
        FatFile::dir(contract::paths::BOOT_ENTRIES_DIR),
        FatFile::bytes(
            contract::paths::BOOT_GRUB_CFG,
            contract::grubcfg::render(slot),
        ),
        FatFile::bytes(contract::paths::BOOT_GRUB_ENV, env),
        FatFile::bytes(contract::grubcfg::slot_config_path(slot), slot_cfg),
    ];
    // Both slot directories exist from the start: an upgrade never has to
    // create a directory (fatfs gets new directories wrong; see fatfix).
    files.extend(Slot::ALL.iter().map(|s| FatFile::dir(s.name())));
    Ok(files)
}

/// The files of BOOT on a new disk with `payload` in slot A: the slot's
/// UKI as its entry when the payload has UKIs ([`uki_boot_files`]), else
/// its kernel, initramfs and `.conf` entry with GRUB's rendering
/// ([`boot_files`]).
pub fn initial_boot_files(payload: &Payload) -> Result<Vec<FatFile>> {
    match &payload.ukis {
        Some(u) => Ok(uki_boot_files(Slot::A, &u.a.path)),
        None => boot_files(
            Slot::A,
            &payload.entry(Slot::A),
            &payload.kernel.path,
            &payload.initramfs.path,
        ),
    }
}

/// The files of BOOT with `slot` booting the UKI `uki`: the UKI as the
/// slot's first entry in `EFI/Linux` (`contract::boot`, UKI entries), and
/// the directories an upgrade writes into. No GRUB: UKIs boot under UEFI.
pub fn uki_boot_files(slot: Slot, uki: &Path) -> Vec<FatFile> {
    let name = EntryName::good(1, slot).of_kind(EntryKind::Uki);
    let mut files = vec![
        FatFile::dir("EFI"),
        FatFile::dir(EntryKind::Uki.dir()),
        FatFile::file(name.path(), uki),
        FatFile::dir(contract::paths::BOOT_ENTRIES_DIR),
    ];
    files.extend(Slot::ALL.iter().map(|s| FatFile::dir(s.name())));
    files
}

/// Reads back what [`initial_boot_files`] put on BOOT for slot A against
/// the payload's signed digests.
pub fn check_initial_boot<D: std::io::Read + std::io::Seek>(
    fs: &mut bootstate::fat::BootFs<D>,
    payload: &Payload,
) -> Result<()> {
    let e = payload.entry(Slot::A);
    let files: Vec<(String, &bootstate::ops::PayloadFile)> = match &payload.ukis {
        Some(u) => vec![(
            EntryName::good(1, Slot::A).of_kind(EntryKind::Uki).path(),
            &u.a,
        )],
        None => vec![
            (e.linux.clone(), &payload.kernel),
            (e.initrd.clone(), &payload.initramfs),
        ],
    };
    for (path, f) in files {
        let (sha, _) = fs.hash(&path)?;
        ensure!(
            sha == f.sha256,
            "{path} reads back as {sha}, not the signed {}",
            f.sha256
        );
    }
    Ok(())
}

/// How a disk is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiskTarget {
    /// A new image file, created under a temporary name, sparse, and renamed
    /// into place when complete.
    NewImage,
    /// An existing device (a block device), in place: the partition table
    /// is written last, and the start of STATE and EPHEMERAL is zeroed so
    /// that the runtime formats them afresh.
    InPlace,
}

/// Writes the raw disk `dest`: the partition table of `layout`, FAT
/// filesystems on EFI (`esp`) and BOOT (`boot`; at 4096-byte sectors both
/// lists on BOOT, [`contract::partition::esp_role`]), the META area at the start
/// of META, and with `bios` GRUB in the MBR and the BIOS partition (without,
/// BIOS reads as zeros and the MBR has no boot code); STATE and EPHEMERAL
/// are left for the runtime to format. Every timestamp is `epoch`.
#[allow(clippy::too_many_arguments)]
pub fn write_raw_image(
    dest: &Path,
    target: DiskTarget,
    layout: &Layout,
    disk_guid: Guid,
    esp: Vec<FatFile>,
    boot: Vec<FatFile>,
    meta: &Meta,
    bios: Option<BiosBoot>,
    epoch: u64,
) -> Result<()> {
    let in_place = target == DiskTarget::InPlace;
    let mut fill = filler(layout, disk_guid, esp, boot, meta, epoch, in_place)?;
    if in_place {
        crate::disk::write_disk_in_place(dest, layout, disk_guid, bios, |p, w| fill(p, w))
    } else {
        write_disk(dest, layout, disk_guid, bios, |p, w| fill(p, w))
    }
    .with_context(|| format!("writing the disk {}", dest.display()))
}

type Fill<'a> =
    Box<dyn FnMut(&PlacedPartition, &mut Window<&mut std::fs::File>) -> Result<()> + 'a>;

fn filler<'a>(
    layout: &'a Layout,
    disk_guid: Guid,
    esp: Vec<FatFile>,
    boot: Vec<FatFile>,
    meta: &Meta,
    epoch: u64,
    wipe: bool,
) -> Result<Fill<'a>> {
    let area = meta.encode().context("encoding META")?;
    Ok(Box::new(move |p, w| {
        let params = |fat32| FatParams {
            label: p.label().to_string(),
            volume_id: volume_id(disk_guid, p.label()),
            sector_size: layout.sector_size,
            fat32,
            epoch,
        };
        match p.content() {
            Content::EspFat => {
                format_fat(w, &params(true), &esp)?;
            }
            Content::BootFat => {
                format_fat(w, &params(false), &boot)?;
            }
            Content::EspBootFat => {
                let both: Vec<FatFile> = esp.iter().chain(&boot).cloned().collect();
                format_fat(w, &params(false), &both)?;
            }
            Content::Meta => {
                ensure!(
                    area.len() as u64 <= p.len(),
                    "META partition of {} bytes cannot hold {} bytes",
                    p.len(),
                    area.len()
                );
                w.write_all(&area).context("writing META")?;
            }
            Content::Unformatted | Content::Reserved if wipe => {
                let zeros = vec![0u8; 1 << 20];
                let n = p.len().min(zeros.len() as u64) as usize;
                w.write_all(&zeros[..n]).context("clearing the partition")?;
            }
            // Sparse: unwritten space reads as zeros. The BIOS partition
            // gets GRUB's core image after the table (bootstate::bios).
            Content::Raw | Content::Unformatted | Content::Reserved => {}
        }
        Ok(())
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::disk::testutil::{extract, run, tool};
    use crate::disk::{list_files, open_partition, read_file, read_table};
    use contract::meta::{SlotRecord, SlotStatus, Tag};
    use contract::partition::{DEFAULT_DISK_SIZE, SECTOR_SIZES};
    use std::collections::BTreeMap;
    use std::io::Read;
    use std::process::Command;

    const KSHA: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    const ISHA: &str = "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210";

    #[test]
    fn entry_and_file_names() {
        let e = entry(
            Slot::A,
            KSHA,
            ISHA,
            "Imager",
            "1.2.0",
            " console=ttyS0 quiet ",
        );
        assert_eq!(e.title, "Imager 1.2.0 (slot A)");
        assert_eq!(e.options, "console=ttyS0 quiet machined.slot=A");
        assert_eq!(contract::cmdline::slot(&e.options), Some(Slot::A));
        assert_eq!(
            entry(Slot::B, KSHA, ISHA, "X", "1", "").options,
            "machined.slot=B"
        );
        let e = entry(Slot::A, KSHA, ISHA, "Imager", "1.2.0", "console=ttyS0");
        let files = boot_files(Slot::A, &e, Path::new("/k"), Path::new("/i")).unwrap();
        let paths: Vec<_> = files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "A/vmlinuz-0123456789abcdef",
                "A/initramfs-fedcba9876543210.zst",
                "loader/entries/g00000001-slot-a.conf",
                "loader/entries",
                "grub/grub.cfg",
                "grub/env/grubenv",
                "A/grub.cfg",
                "A",
                "B"
            ]
        );
        let e = entry(Slot::A, KSHA, ISHA, "Imager", "1.2.0", "a=\"b\"");
        let err = format!(
            "{:#}",
            boot_files(Slot::A, &e, Path::new("/k"), Path::new("/i")).unwrap_err()
        );
        assert!(err.contains("GRUB") && err.contains("`\"`"), "{err}");
        let e = format!(
            "{:#}",
            esp_files(Path::new("/nonexistent/sd-boot.efi"), contract::Arch::Amd64).unwrap_err()
        );
        assert!(
            e.contains("install systemd-boot-efi (scripts/setup.sh)"),
            "{e}"
        );
        assert!(e.contains("boot.systemd_boot"), "{e}");
    }

    /// A whole image with the real systemd-boot, checked by sfdisk (512) and
    /// fsck.fat, at both sector sizes.
    #[test]
    fn raw_image_with_systemd_boot() {
        let sd_boot = Path::new(DEFAULT_SYSTEMD_BOOT);
        assert!(
            sd_boot.is_file(),
            "{DEFAULT_SYSTEMD_BOOT} missing: install systemd-boot-efi (scripts/setup.sh)"
        );
        let dir = tempfile::tempdir().unwrap();
        let kernel = dir.path().join("vmlinuz");
        let initramfs = dir.path().join("initramfs.zst");
        std::fs::write(&kernel, vec![0xAB; 5_000_000]).unwrap();
        std::fs::write(&initramfs, vec![0xCD; 7_000_001]).unwrap();
        let (ksha, _) = crate::io::sha256_file(&kernel).unwrap();
        let (isha, _) = crate::io::sha256_file(&initramfs).unwrap();
        let mut meta = Meta::default();
        meta.set(Tag::ImageName, "test");
        meta.set(Tag::DefaultSlot, "A");
        meta.set(
            Tag::SlotA,
            SlotRecord {
                status: SlotStatus::Good,
                version: "1.2.0".into(),
                security: 0,
            }
            .render(),
        );
        let guid = contract::guid::disk_guid("test 1.2.0");
        let grub = crate::grub::make(Path::new(crate::grub::DEFAULT_DIR), None).unwrap();

        for ss in SECTOR_SIZES {
            let layout = Layout::new(DEFAULT_DISK_SIZE, ss, &BTreeMap::new()).unwrap();
            let img = dir.path().join(format!("disk-{ss}.raw"));
            let esp = esp_files(sd_boot, contract::Arch::Amd64).unwrap();
            let e = entry(Slot::A, &ksha, &isha, "Test", "1.2.0", "console=ttyS0");
            let boot = boot_files(Slot::A, &e, &kernel, &initramfs).unwrap();
            let bios = (ss == 512).then_some(BiosBoot {
                grub: &grub,
                boot_flag: false,
            });
            write_raw_image(
                &img,
                DiskTarget::NewImage,
                &layout,
                guid,
                esp,
                boot,
                &meta,
                bios,
                1_700_000_000,
            )
            .unwrap();

            if ss == 512 {
                let out = run(Command::new(tool("sfdisk")).arg("--json").arg(&img));
                let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
                let names: Vec<_> = v["partitiontable"]["partitions"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|p| p["name"].as_str().unwrap().to_string())
                    .collect();
                assert_eq!(names, ["EFI", "BIOS", "BOOT", "META", "STATE", "EPHEMERAL"]);
            }
            let t = read_table(&img).unwrap();
            assert_eq!(t.sector_size, ss);
            // At 4096-byte sectors BOOT is the ESP and EFI holds nothing
            // (contract::partition::esp_role).
            let esp_label = if ss == 512 { "EFI" } else { "BOOT" };
            let fats: &[&str] = if ss == 512 {
                &["EFI", "BOOT"]
            } else {
                &["BOOT"]
            };
            for &label in fats {
                let p = t.find(label).unwrap();
                let (off, len) = p.range(ss);
                let part = dir.path().join(format!("{label}.fat"));
                extract(&img, off, len, &part);
                let out = run(Command::new(tool("fsck.fat")).args(["-n", "-V"]).arg(&part));
                let text = String::from_utf8_lossy(&out.stdout);
                assert!(!text.contains("Warning"), "{label}: {text}");
                std::fs::remove_file(&part).unwrap();
            }

            let efi = || open_partition(&img, esp_label).unwrap();
            let on_esp = list_files(efi()).unwrap();
            for f in ["EFI/BOOT/BOOTX64.EFI", "loader/loader.conf"] {
                assert!(on_esp.iter().any(|p| p == f), "{ss}: {on_esp:?}");
            }
            if ss == 512 {
                assert_eq!(on_esp.len(), 2, "{on_esp:?}");
            }
            assert_eq!(
                read_file(efi(), &contract::Arch::Amd64.esp_boot_loader()).unwrap(),
                std::fs::read(sd_boot).unwrap()
            );
            let bootp = || open_partition(&img, "BOOT").unwrap();
            let text =
                String::from_utf8(read_file(bootp(), &EntryName::good(1, Slot::A).path()).unwrap())
                    .unwrap();
            let e = Entry::parse(&text).unwrap();
            assert_eq!(e.title, "Test 1.2.0 (slot A)");
            assert_eq!(
                read_file(bootp(), &e.initrd).unwrap(),
                std::fs::read(&initramfs).unwrap()
            );
            assert_eq!(
                list_files(bootp()).unwrap().len(),
                if ss == 512 { 6 } else { 8 }
            );
            let cfg = read_file(bootp(), contract::paths::BOOT_GRUB_CFG).unwrap();
            assert_eq!(cfg, contract::grubcfg::render(Slot::A));
            let lines = read_file(bootp(), &contract::grubcfg::slot_config_path(Slot::A)).unwrap();
            assert_eq!(
                lines,
                contract::grubcfg::slot_config(Slot::A, &e)
                    .unwrap()
                    .as_bytes()
            );
            // GRUB in the MBR and the BIOS partition at 512-byte sectors;
            // no boot code at 4096.
            let mut f = std::fs::File::open(&img).unwrap();
            let installed = bootstate::bios::inspect(&mut f, &t).unwrap();
            if ss == 512 {
                bootstate::bios::check(&mut f, &t, &grub, false).unwrap();
            } else {
                assert_eq!(installed, bootstate::bios::Installed::None);
            }

            let mut area = vec![0u8; contract::meta::AREA_LEN];
            open_partition(&img, "META")
                .unwrap()
                .read_exact(&mut area)
                .unwrap();
            assert_eq!(Meta::decode(&area).unwrap().0, meta);
            std::fs::remove_file(&img).unwrap();
        }
    }
}
