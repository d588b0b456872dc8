//! machined: the runtime's PID 1, statically linked. The same binary is
//! stage 1 (`/init` in the initramfs, detected by the squashfs next to it)
//! and stage 2 (`/usr/bin/machined` in the root filesystem).

mod api;
mod bootdisk;
mod console;
mod dhcp;
mod efi;
mod failure;
mod input;
mod live;
mod loopdev;
mod mount;
mod net;
mod osrelease;
mod partitions;
mod pending;
mod power;
mod pull;
mod secureboot;
mod skeleton;
mod slots;
mod stage1;
mod stage2;
mod storage;
mod sys;
mod verity;

use std::path::Path;

fn main() {
    failure::install_panic_hook();
    if sys::pid() != 1 {
        console::say(format!(
            "must run as PID 1 (the kernel's init), not as PID {}",
            sys::pid()
        ));
        std::process::exit(2);
    }
    let in_initramfs = Path::new("/")
        .join(contract::paths::INITRAMFS_ROOTFS)
        .exists();
    let result = if in_initramfs {
        stage1::run()
    } else {
        stage2::run()
    };
    let Err(e) = result;
    failure::fatal(e)
}
