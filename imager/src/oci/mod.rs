//! The installer container image: an OCI image layout (`oci-layout`,
//! `index.json`, `blobs/sha256/…`) in one tar archive, the `oci-archive`
//! transport of skopeo and podman.
//!
//! - `writer.rs`: [`write_image`] writes an image of uncompressed layers,
//!   byte for byte the same for the same inputs.
//! - `reader.rs`: [`extract_payload`] reads an installer image back: the
//!   payload's signed manifest first, then, once the caller's verifier
//!   trusts it, only the files it lists, every blob checked and all work
//!   bounded.
//! - `store.rs`: where the blobs of an archive (or a layout directory) are,
//!   and which image of its index is read.
//! - `push.rs`: [`push`] sends an archive's image to a registry as it is
//!   (every digest kept).
//! - `index.rs`: [`combine`] makes one archive of several architectures'
//!   installer images (an image index naming each by its platform).
//!
//! What both agree on is here: the media types and names of the format, and
//! where an installer image keeps what (docs/design.md, "The installer
//! image").

mod index;
mod push;
mod reader;
pub mod resign;
mod store;
mod writer;

pub use index::{IndexReport, combine};
pub use push::{PushReport, PushedBlob, push};
pub use reader::{MAX_SMALL, Verifier, extract_payload};
pub(crate) use writer::header as tar_header;
pub use writer::{Entry, ImageInfo, ImageSpec, check_ref_name, check_tag, rfc3339, write_image};

/// The layer of an installer image that holds the payload's signed manifest
/// and its signature (`usr/install/<arch>/manifest.json` and `.sig`,
/// `contract::paths::installer_payload_dir`),
/// alone: the first, so that it is found and verified before anything else
/// is read.
pub const MANIFEST_LAYER: usize = 0;
/// The layer that holds the files the signed manifest lists (kernel,
/// initramfs, boot loader), in the same directory. Other layers (the
/// installer binary) are never read by [`extract_payload`].
pub const PAYLOAD_LAYER: usize = 1;
/// The most layers an installer image may name; more is refused before any
/// layer is read.
pub const MAX_LAYERS: usize = 8;

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
