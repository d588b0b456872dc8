//! Pulls images from an OCI registry and pushes them to one (the
//! distribution specification's pull and push APIs), synchronously, for
//! `machined` and `imager`:
//!
//! - [`Reference::parse`]: `REGISTRY/NAME:TAG`, `REGISTRY/NAME@sha256:…`,
//!   strict and bounded.
//! - [`Client::manifest`]: the image manifest (an index resolved to
//!   linux/amd64), bounded before it is read and checked against the
//!   reference's digest.
//! - [`Client::blob`]: a layer or config, streamed through a reader that
//!   hashes it and fails, rather than ending, unless it is exactly the blob
//!   its descriptor names.
//!
//! - [`Client::push_blob`], [`Client::push_manifest`]: a push, streamed
//!   and checked.
//! - [`auth`]: Bearer (the token flow) and Basic authentication, with the
//!   [`Credentials`] the caller gives per registry ([`Options::credentials`]);
//!   [`authfile`]: where a host's tools keep them.
//!
//! HTTPS with rustls (ring provider, Mozilla roots or a given CA), plain
//! HTTP only for the registries named in [`Options::plain_http`]. The
//! contract, bounds and errors: docs/registry.md.

pub mod auth;
pub mod authfile;
mod blob;
mod client;
pub mod dns;
mod error;
pub mod manifest;
mod reference;

pub use auth::Credentials;
pub use blob::VerifiedReader;
pub use client::{
    BlobReader, Client, MAX_REDIRECTS, Options, PUSH_ATTEMPTS, PUSH_RETRY_WAIT, Pushed,
};
pub use error::{
    Error, ErrorKind, MAX_CODE, MAX_CODES, MAX_ERROR_BODY, MAX_ERROR_BODY_TIME, registry_codes,
};
pub use manifest::{Descriptor, ImageManifest};
pub use reference::{Digest, MAX_NAME, MAX_REFERENCE, MAX_REGISTRY, MAX_TAG, Reference};
