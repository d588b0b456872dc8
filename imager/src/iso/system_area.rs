//! The volume identity that the disk GUIDs and the MBR disk signature of
//! the system area derive from.

use super::IsoSpec;
use sha2::{Digest, Sha256};

/// The volume identity hashed into the GUIDs and the disk signature.
pub(super) fn identity(spec: &IsoSpec, sizes: &[u64]) -> Vec<u8> {
    let mut h = Sha256::new();
    let mut field = |b: &[u8]| {
        h.update((b.len() as u64).to_le_bytes());
        h.update(b);
    };
    field(b"imager.iso.v1");
    field(spec.volume_id.as_bytes());
    field(spec.volume_set_id.as_bytes());
    field(spec.publisher.as_bytes());
    field(&spec.epoch.to_le_bytes());
    let mut files: Vec<(&str, u64)> = spec
        .files
        .iter()
        .zip(sizes)
        .map(|(f, s)| (f.path.as_str(), *s))
        .collect();
    files.sort();
    for (p, s) in files {
        field(p.as_bytes());
        field(&s.to_le_bytes());
    }
    field(
        spec.bios
            .as_ref()
            .map(|b| b.image.as_bytes())
            .unwrap_or(b"-"),
    );
    field(
        spec.bios
            .as_ref()
            .map(|b| &b.hybrid_mbr[..])
            .unwrap_or(b"-"),
    );
    field(spec.efi_image.as_deref().unwrap_or("-").as_bytes());
    h.finalize().to_vec()
}
