//! TEMP(main): stand-in for h-iso's writer, removed at merge.
use anyhow::{Result, bail};
use std::path::{Path, PathBuf};
pub struct IsoFile {
    pub path: String,
    pub source: IsoSource,
}
pub enum IsoSource {
    File(PathBuf),
    Bytes(Vec<u8>),
}
pub struct BiosBoot {
    pub image: String,
    pub hybrid_mbr: Vec<u8>,
}
pub struct IsoSpec {
    pub volume_id: String,
    pub volume_set_id: String,
    pub publisher: String,
    pub epoch: u64,
    pub files: Vec<IsoFile>,
    pub bios: Option<BiosBoot>,
    pub efi_image: Option<String>,
}
pub fn write(_spec: &IsoSpec, _out: &Path) -> Result<()> {
    bail!("not yet")
}
