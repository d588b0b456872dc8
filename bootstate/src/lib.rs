//! bootstate: every read and write of a disk, by the builder, the
//! installer, the runtime and `imager inspect`: the partition table
//! ([`gpt`]), BOOT's FAT ([`fatscan`] vets a volume and finds lost clusters,
//! [`fat`] reads and changes it, [`fatformat`] makes a new one, [`fatfix`]
//! repairs fatfs's directories and removes files crash-safely, [`gather`]
//! orders and merges fatfs's writes), META
//! ([`meta`]), a disk locked for one operation ([`disk`]) and the slot
//! state, crash-safely ([`ops`]). A fixed VHD is read and written as the
//! raw disk before its footer ([`vhd`], [`gpt::image_size`]).
//!
//! The model is [`contract::state::BootState`] in META; its systemd-boot
//! rendering is the entries in BOOT's `loader/entries`
//! ([`contract::boot::EntryName`]). The installer (`imager install`,
//! `upgrade`, `rollback`) and the runtime (`machined`, which blesses a boot
//! or records a fallback) both change them through [`ops`], so the order of
//! writes that makes every step survive a power cut is written once.

pub mod bios;
pub mod blank;
pub mod device;
pub mod disk;
pub mod fat;
pub mod fatfix;
pub mod fatformat;
pub mod fatscan;
pub mod gather;
pub mod gpt;
pub mod grubenv;
pub mod meta;
pub mod ops;
pub mod vhd;

pub use device::{Device, Faulty, Window};

#[cfg(test)]
mod testutil;
