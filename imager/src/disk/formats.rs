//! The disk formats made from the raw disk in the build's `disk` stage:
//! the fixed VHD ([`super::vhd`]), `qcow2` ([`super::qcow2`]), `raw.zst`
//! and `raw.xz` ([`super::compress`]), and the platforms' images (`gcp`,
//! `azure`, `vmware`, `aws`: [`super::platform`]). Each is written under a
//! temporary name and renamed when complete, in the stage's directory.

use crate::artifact::Kind;
use crate::profile::{Output, Profile};
use anyhow::Result;
use contract::paths::output as names;
use std::path::Path;

/// Each format: its output, manifest kind and file name.
const FORMATS: [(Output, Kind, &str); 8] = [
    (Output::Vhd, Kind::Vhd, names::VHD),
    (Output::Qcow2, Kind::Qcow2, names::QCOW2),
    (Output::RawZst, Kind::RawZst, names::RAW_ZST),
    (Output::RawXz, Kind::RawXz, names::RAW_XZ),
    (Output::Gcp, Kind::Gcp, names::GCP),
    (Output::Azure, Kind::Azure, names::AZURE),
    (Output::Vmware, Kind::Vmware, names::VMWARE),
    (Output::Aws, Kind::Aws, names::AWS),
];

/// The formats of this list that the profile `p` asks for, in a fixed
/// order.
pub fn made(p: &Profile) -> impl Iterator<Item = (Output, Kind, &'static str)> + '_ {
    FORMATS
        .into_iter()
        .filter(|(o, _, _)| p.outputs.contains(o))
}

/// Writes the formats `p` asks for from the raw disk `raw` into `dir`; the
/// VHD's footer gets the disk's GUID `id` and the build's `epoch`.
pub fn write(p: &Profile, raw: &Path, dir: &Path, id: [u8; 16], epoch: u64) -> Result<()> {
    for (output, _, name) in made(p) {
        let dest = dir.join(name);
        match output {
            Output::Vhd | Output::Azure => {
                crate::progress::message(&format!("disk: fixed VHD ({name})"));
                super::vhd::write_vhd(raw, &dest, id, epoch)?;
            }
            Output::Gcp => {
                crate::progress::message(&format!(
                    "disk: Compute Engine's disk.raw in {name} (gzip level {})",
                    super::gce::GZIP_LEVEL
                ));
                super::gce::write_gce(raw, &dest, epoch)?;
            }
            Output::Vmware => {
                crate::progress::message(&format!("disk: OVF package {name}"));
                let m = super::ova::Machine {
                    name: &p.name,
                    cpus: 2,
                    memory_mib: 2048,
                };
                super::ova::write_ova(raw, &dest, &m, id, epoch)?;
            }
            Output::Aws => {
                crate::progress::message(&format!("disk: stream-optimised VMDK {name}"));
                let d = super::vmdk::Descriptor {
                    id,
                    file_name: name,
                    adapter: super::vmdk::ADAPTER,
                };
                super::vmdk::write_vmdk(raw, &dest, &d)?;
            }
            Output::Qcow2 => {
                crate::progress::message("disk: qcow2");
                super::qcow2::write_qcow2(raw, &dest)?;
            }
            Output::RawZst => {
                crate::progress::message(&format!(
                    "disk: raw.zst (zstd level {})",
                    super::compress::ZSTD_LEVEL
                ));
                super::compress::write_zst(raw, &dest)?;
            }
            Output::RawXz => {
                crate::progress::message(&format!(
                    "disk: raw.xz (xz preset {})",
                    super::compress::XZ_PRESET
                ));
                super::compress::write_xz(raw, &dest)?;
            }
            _ => unreachable!("not a format of this list"),
        }
    }
    Ok(())
}
