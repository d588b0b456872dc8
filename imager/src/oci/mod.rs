//! The installer container image: an OCI image layout (`oci-layout`,
//! `index.json`, `blobs/sha256/…`) in one tar archive, the `oci-archive`
//! transport of skopeo and podman.
//!
//! - `writer.rs`: [`write_image`] writes an image of one layer, byte for
//!   byte the same for the same inputs.
//! - `reader.rs`: [`extract_payload`] reads an installer image (or any OCI
//!   image of tar layers) back and extracts its payload, every blob checked.
//!
//! What both agree on is here: the media types and names of the format.

mod reader;
mod writer;

pub use reader::extract_payload;
pub use writer::{Entry, ImageInfo, ImageSpec, check_tag, rfc3339, write_image};

pub const MEDIA_TYPE_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const MEDIA_TYPE_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const MEDIA_TYPE_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
pub const MEDIA_TYPE_LAYER: &str = "application/vnd.oci.image.layer.v1.tar";
pub const MEDIA_TYPE_LAYER_ZSTD: &str = "application/vnd.oci.image.layer.v1.tar+zstd";
pub const MEDIA_TYPE_LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
/// The annotation of `index.json` that names an image (`oci-archive:FILE:TAG`).
pub const REF_NAME: &str = "org.opencontainers.image.ref.name";
/// The image layout version this code writes (`oci-layout`).
pub const LAYOUT_VERSION: &str = "1.0.0";

#[cfg(test)]
mod tests;
