//! Secure Boot with our own keys: a PK, a KEK and a db key
//! ([`keys`]), Authenticode signatures of PE images — systemd-boot and
//! UKIs — made and checked in Rust ([`authenticode`]), and the signed
//! variable updates that enrol the keys ([`auth`]).
//!
//! The design (key hierarchy, what is signed with what, enrolment by
//! `virt-fw-vars` or by systemd-boot itself, the layout decisions) is in
//! docs/secureboot.md.

pub mod auth;
pub mod authenticode;
pub mod keys;

#[cfg(test)]
mod tests;

pub use auth::{enrolment_files, write_enrolment};
pub use authenticode::{SignReport, Verified, sign, sign_bytes, verify, verify_file};
pub use keys::{KeygenReport, SbKey, SecureBootKeys, keygen};
