//! The installer image of a build: its payload (kernel, initramfs, boot
//! loader and their signed manifest) and the static installer, as an OCI
//! archive.

use super::{names, profile_name};
use crate::artifact::Kind;
use crate::profile::Profile;
use crate::{oci, sign};
use anyhow::{Context, Result};
use contract::paths;
use std::path::{Path, PathBuf};

/// The boot payload of a build, what the disk image and the installer image
/// carry: kernel, initramfs, how to boot them.
pub struct PayloadInput<'a> {
    /// systemd-boot (signed, with Secure Boot).
    pub boot_loader: &'a Path,
    /// The build's Secure Boot: the payload carries the db certificate and
    /// the enrolment files, for installs.
    pub secure_boot: Option<&'a super::secureboot::SecureBoot>,
    pub kernel: &'a Path,
    pub initramfs: &'a Path,
    pub boot: &'a sign::Boot,
    pub epoch: u64,
    /// GRUB's images for the BIOS path of installs.
    pub grub: Option<&'a crate::disk::Grub>,
    /// The slots' UKIs, when the slots boot them (profile `boot.uki`).
    pub ukis: Option<&'a super::uki::SlotUkis>,
    /// The node API's cluster CA certificate (profile `node_api.ca`).
    pub node_ca: Option<&'a str>,
}

impl PayloadInput<'_> {
    /// What an install or upgrade puts into a slot, from these files.
    pub fn slot_payload(&self, version: &str, security: u64) -> Result<bootstate::ops::Payload> {
        let file = |path: &Path| -> Result<bootstate::ops::PayloadFile> {
            let (sha256, len) = crate::io::sha256_file(path)?;
            Ok(bootstate::ops::PayloadFile {
                path: path.to_path_buf(),
                sha256,
                len,
            })
        };
        Ok(bootstate::ops::Payload {
            version: version.to_string(),
            security_version: security,
            title: self.boot.title.clone(),
            cmdline: self.boot.cmdline.clone(),
            kernel: file(self.kernel)?,
            initramfs: file(self.initramfs)?,
            ukis: match self.ukis {
                Some([a, b]) => Some(bootstate::ops::SlotUkis {
                    a: file(a)?,
                    b: file(b)?,
                }),
                None => None,
            },
            secure_boot: self.secure_boot.map(|s| s.db_pem.clone()),
            next_root: None,
            secure_boot_updates: None,
        })
    }
}

/// Writes the installer image `out/installer.tar`: the payload (kernel,
/// initramfs, boot loader and a manifest listing them, signed by `signer`)
/// under [`paths::INSTALLER_PAYLOAD_DIR`], the static installer `binary` as
/// [`paths::INSTALLER_BINARY`] with [`paths::INSTALLER_LINK`] pointing to
/// it, the link as entrypoint, named [`Profile::installer_image`]. Three layers: the signed
/// manifest and its signature ([`oci::MANIFEST_LAYER`]), the files it lists
/// ([`oci::PAYLOAD_LAYER`]), the installer. The payload is staged in
/// a temporary directory of `out` that a later build sweeps if this one is
/// killed.
pub fn write_installer(
    p: &Profile,
    out: &Path,
    binary: &Path,
    payload: &PayloadInput,
    signing: &sign::Signing,
) -> Result<PathBuf> {
    let stage = crate::io::Staging::create(out, "installer-payload")?;
    let dir = stage.path();
    let manifest = write_payload(p, dir, payload, signing)?;
    let listed: Vec<&str> = manifest.artifacts.iter().map(|a| a.path.as_str()).collect();
    let spec = installer_spec(
        dir,
        &listed,
        &signing.trust_files(),
        binary,
        &p.installer_image(),
        payload.epoch,
        p.arch,
    );
    let dest = out.join(names::INSTALLER);
    oci::write_image(&dest, &spec).with_context(|| format!("writing {}", dest.display()))?;
    Ok(dest)
}

/// Writes the payload of an install into the directory `dir`: the kernel,
/// the initramfs, systemd-boot, GRUB's images (with `payload.grub`) and the
/// manifest listing them (with the boot title and command line), signed by
/// `signer`. The installer image and the live ISO carry it.
pub fn write_payload(
    p: &Profile,
    dir: &Path,
    payload: &PayloadInput,
    signing: &sign::Signing,
) -> Result<sign::Manifest> {
    crate::io::link_or_copy(payload.kernel, &dir.join(paths::PAYLOAD_KERNEL))?;
    crate::io::link_or_copy(payload.initramfs, &dir.join(paths::PAYLOAD_INITRAMFS))?;
    let loader = dir.join(paths::PAYLOAD_BOOT_LOADER);
    if payload.boot_loader != loader {
        crate::io::link_or_copy(payload.boot_loader, &loader)?;
    }
    let mut listed = vec![
        sign::describe(dir, Kind::Kernel, paths::PAYLOAD_KERNEL)?,
        sign::describe(dir, Kind::Initramfs, paths::PAYLOAD_INITRAMFS)?,
        sign::describe(dir, Kind::BootLoader, paths::PAYLOAD_BOOT_LOADER)?,
    ];
    if let Some(ukis) = payload.ukis {
        for (slot, uki) in contract::Slot::ALL.iter().zip(ukis) {
            let name = paths::output::uki(*slot);
            crate::io::link_or_copy(uki, &dir.join(name))?;
            listed.push(sign::describe(dir, Kind::Uki, name)?);
        }
    }
    if let Some(sb) = payload.secure_boot {
        let db = dir.join(paths::PAYLOAD_SECURE_BOOT_DB);
        std::fs::write(&db, &sb.db_pem).with_context(|| format!("writing {}", db.display()))?;
        listed.push(sign::describe(
            dir,
            Kind::SecureBootDb,
            paths::PAYLOAD_SECURE_BOOT_DB,
        )?);
        for (name, bytes) in &sb.enrolment {
            let path = dir.join(name);
            std::fs::write(&path, bytes).with_context(|| format!("writing {}", path.display()))?;
            listed.push(sign::describe(dir, Kind::SecureBootAuth, name)?);
        }
        // Checked against the payload's own boot chain before it is listed.
        sb.updates_record(&p.version, payload.ukis, payload.boot_loader)?;
        for (name, _, bytes) in &sb.updates {
            let path = dir.join(name);
            std::fs::write(&path, bytes).with_context(|| format!("writing {}", path.display()))?;
            listed.push(sign::describe(dir, Kind::SecureBootUpdate, name)?);
        }
    }
    if let Some(ca) = payload.node_ca {
        let path = dir.join(paths::PAYLOAD_NODE_CA);
        std::fs::write(&path, ca).with_context(|| format!("writing {}", path.display()))?;
        listed.push(sign::describe(dir, Kind::NodeCa, paths::PAYLOAD_NODE_CA)?);
    }
    if let Some(g) = payload.grub {
        for (name, kind, bytes) in [
            (paths::PAYLOAD_GRUB_BOOT, Kind::GrubBoot, g.boot_img()),
            (paths::PAYLOAD_GRUB_CORE, Kind::GrubCore, g.core_img()),
        ] {
            let path = dir.join(name);
            std::fs::write(&path, bytes).with_context(|| format!("writing {}", path.display()))?;
            listed.push(sign::describe(dir, kind, name)?);
        }
    }
    let mut manifest = sign::Manifest {
        boot: Some(payload.boot.clone()),
        security_version: p.security_version,
        ..sign::Manifest::new(&p.name, &p.version, profile_name(p), payload.epoch, listed)
    };
    manifest.set_arch(p.arch);
    sign::write_signed_manifest_with(dir, &manifest, signing)
        .context("signing the installer's payload manifest")?;
    Ok(manifest)
}

/// The image of an installer: the signed payload in `dir` (its manifest,
/// signature and `trust` files, and the files `listed` in the manifest)
/// and the installer `binary`, named `ref_name`. Three layers, in the order
/// the reader expects (docs/design.md, "The installer image"): the signed
/// manifest with its trust files alone ([`oci::MANIFEST_LAYER`]), the files
/// it lists ([`oci::PAYLOAD_LAYER`]), the installer. The payload goes in
/// `arch`'s directory ([`paths::installer_payload_dir`]), and the image is
/// for that platform.
pub fn installer_spec(
    dir: &Path,
    listed: &[&str],
    trust: &[&str],
    binary: &Path,
    ref_name: &str,
    epoch: u64,
    arch: contract::Arch,
) -> oci::ImageSpec {
    let payload_dir = paths::installer_payload_dir(arch);
    let in_payload = |name: &str| oci::Entry::File {
        path: format!("{payload_dir}/{name}"),
        source: dir.join(name),
        mode: 0o644,
    };
    let mut signed = vec![
        in_payload(paths::PAYLOAD_MANIFEST),
        in_payload(paths::PAYLOAD_SIGNATURE),
    ];
    signed.extend(trust.iter().map(|name| in_payload(name)));
    let payload = listed.iter().map(|name| in_payload(name)).collect();
    let installer = vec![
        oci::Entry::File {
            path: paths::INSTALLER_BINARY.to_string(),
            source: binary.to_path_buf(),
            mode: 0o755,
        },
        oci::Entry::Symlink {
            path: paths::INSTALLER_LINK.to_string(),
            target: relative_link(paths::INSTALLER_LINK, paths::INSTALLER_BINARY),
        },
    ];
    let mut layers = vec![Vec::new(); 3];
    layers[oci::MANIFEST_LAYER] = signed;
    layers[oci::PAYLOAD_LAYER] = payload;
    layers[2] = installer;
    oci::ImageSpec {
        layers,
        entrypoint: vec![format!("/{}", paths::INSTALLER_LINK)],
        ref_name: ref_name.to_string(),
        epoch,
        arch,
    }
}

/// The target of a symbolic link at `link` to `target` (both relative to the
/// same root): `imager` for `usr/bin/installer` → `usr/bin/imager`.
pub fn relative_link(link: &str, target: &str) -> String {
    fn parent(p: &str) -> &str {
        p.rsplit_once('/').map_or("", |(d, _)| d)
    }
    if parent(link) == parent(target) {
        return target.rsplit('/').next().unwrap_or(target).to_string();
    }
    let ups = parent(link).split('/').filter(|c| !c.is_empty()).count();
    format!("{}{target}", "../".repeat(ups))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_links() {
        assert_eq!(
            relative_link("usr/bin/installer", "usr/bin/imager"),
            "imager"
        );
        assert_eq!(
            relative_link("sbin/installer", "usr/bin/imager"),
            "../usr/bin/imager"
        );
        assert_eq!(
            relative_link("installer", "usr/bin/imager"),
            "usr/bin/imager"
        );
    }
}
