//! imager: builds signed, bootable, immutable operating-system images.
//!
//! One module per artifact or domain. Data flows through small `Read`/`Write`
//! adapters (see [`io`]); every output is written under a temporary name and
//! renamed into place only when complete.

pub mod artifact;
pub mod boot;
pub mod build;
pub mod closure;
pub mod disk;
pub mod grub;
pub mod initramfs;
pub mod input;
pub mod inspect;
pub mod install;
pub mod io;
pub mod iso;
pub mod kernel;
pub mod node;
pub mod oci;
pub mod profile;
pub mod progress;
pub mod qemu;
pub mod remote;
pub mod remote_cache;
pub mod rootfs;
pub mod runtime;
pub mod secret;
pub mod secureboot;
pub mod sign;
pub mod uki;
pub mod verity;
