//! The installer payload's signed manifest: its format ([`manifest`]), the
//! artifacts it lists ([`artifact`]), key ids and META's trusted keys
//! ([`keys`]), the signature check ([`verify`]), and the installer image's
//! layers read as streams ([`layer`]) through the guard that bounds their
//! tar headers ([`targuard`]), and whether a disk takes a payload as far as
//! Secure Boot is concerned ([`secureboot`], its signatures checked by the
//! `authenticode` crate), and the rotating root of trust's format and
//! rules ([`root`]), and which payloads a disk trusts ([`trust`]), and
//! Secure Boot's db and dbx and the signed appends to them ([`efivar`]).
//!
//! imager writes and verifies manifests with it; machined verifies what
//! it pulls from a registry with it, against the keys in META, before it
//! writes anything. So this crate stays small: serde, sha2, tar, ed25519
//! and Authenticode verification, no key generation. `docs/signing.md`
//! describes the formats.

pub mod artifact;
pub mod efivar;
pub mod keys;
pub mod layer;
pub mod manifest;
pub mod root;
pub mod secureboot;
pub mod targuard;
pub mod trust;
pub mod verify;

#[cfg(test)]
mod tests;

pub use ed25519_dalek::{Signature, VerifyingKey};
