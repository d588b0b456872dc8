//! The on-disk contract.
//!
//! Everything that the builder (`imager`), the installer and the runtime
//! (`machined`) must agree on is decided here and only here: the partition
//! layout and its type GUIDs, how the unique GUIDs are derived, the slot
//! names, the boot-entry and boot-file naming, the kernel command-line keys
//! and the META format. `docs/design.md` describes the same contract in prose.
//!
//! This crate is deliberately small (sha2 and uuid only) so that the static
//! runtime can link it without pulling in the builder's dependencies.

pub mod arch;
pub mod boot;
pub mod bootdisk;
pub mod cmdline;
pub mod date;
pub mod dhcp;
pub mod grub;
pub mod grubcfg;
pub mod grubenv;
pub mod guid;
pub mod iso;
pub mod le;
pub mod meta;
pub mod net;
pub mod partition;
pub mod paths;
pub mod process;
pub mod ready;
pub mod settings;
pub mod skeleton;
pub mod slot;
pub mod state;
pub mod text;
pub mod verity;
pub mod version;

pub use arch::Arch;
pub use guid::Guid;
pub use partition::{LAYOUT, PartitionRole, PartitionSpec};
pub use slot::Slot;
