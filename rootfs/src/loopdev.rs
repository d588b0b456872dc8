//! Attaching a file to a loop device, read-only, as losetup does.

use crate::sys::{check, open};
use anyhow::{Context, Result, anyhow};
use std::os::fd::{AsRawFd, OwnedFd};

// <linux/loop.h>
const LOOP_SET_FD: libc::c_ulong = 0x4C00;
const LOOP_CLR_FD: libc::c_ulong = 0x4C01;
const LOOP_SET_STATUS64: libc::c_ulong = 0x4C04;
const LOOP_CONFIGURE: libc::c_ulong = 0x4C0A;
const LOOP_CTL_GET_FREE: libc::c_ulong = 0x4C82;
const LO_FLAGS_READ_ONLY: u32 = 1;
const LO_NAME_SIZE: usize = 64;
const LO_KEY_SIZE: usize = 32;

#[repr(C)]
struct LoopInfo64 {
    lo_device: u64,
    lo_inode: u64,
    lo_rdevice: u64,
    lo_offset: u64,
    lo_sizelimit: u64,
    lo_number: u32,
    lo_encrypt_type: u32,
    lo_encrypt_key_size: u32,
    lo_flags: u32,
    lo_file_name: [u8; LO_NAME_SIZE],
    lo_crypt_name: [u8; LO_NAME_SIZE],
    lo_encrypt_key: [u8; LO_KEY_SIZE],
    lo_init: [u64; 2],
}

#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

fn info(backing: &str) -> LoopInfo64 {
    let mut name = [0u8; LO_NAME_SIZE];
    for (d, s) in name.iter_mut().zip(backing.bytes().take(LO_NAME_SIZE - 1)) {
        *d = s;
    }
    LoopInfo64 {
        lo_device: 0,
        lo_inode: 0,
        lo_rdevice: 0,
        lo_offset: 0,
        lo_sizelimit: 0,
        lo_number: 0,
        lo_encrypt_type: 0,
        lo_encrypt_key_size: 0,
        lo_flags: LO_FLAGS_READ_ONLY,
        lo_file_name: name,
        lo_crypt_name: [0; LO_NAME_SIZE],
        lo_encrypt_key: [0; LO_KEY_SIZE],
        lo_init: [0; 2],
    }
}

/// Attaches `backing` read-only to a free loop device and returns the
/// device's path (`/dev/loopN`). The device stays attached for the life of
/// the system.
pub fn attach_read_only(backing: &str) -> Result<String> {
    let file = open(backing, libc::O_RDONLY)?;
    let control = open("/dev/loop-control", libc::O_RDWR)?;
    // Another process may take the free device between the two calls; retry.
    let mut last = anyhow!("no attempt made");
    for _ in 0..8 {
        // SAFETY: LOOP_CTL_GET_FREE takes no argument.
        let n = check(
            unsafe { libc::ioctl(control.as_raw_fd(), LOOP_CTL_GET_FREE) },
            || "LOOP_CTL_GET_FREE on /dev/loop-control",
        )?;
        let dev = format!("/dev/loop{n}");
        let loop_fd = open(&dev, libc::O_RDONLY)?;
        match configure(&loop_fd, &file, backing) {
            Ok(()) => return Ok(dev),
            Err((errno, e)) if errno == libc::EBUSY => last = e,
            Err((_, e)) => return Err(e).with_context(|| format!("attach {backing} to {dev}")),
        }
    }
    Err(last).with_context(|| format!("attach {backing}: every free loop device was taken"))
}

/// LOOP_CONFIGURE (Linux 5.8+), or LOOP_SET_FD + LOOP_SET_STATUS64 on older
/// kernels. Errors carry errno so that the caller can retry on EBUSY.
fn configure(
    loop_fd: &OwnedFd,
    file: &OwnedFd,
    backing: &str,
) -> std::result::Result<(), (i32, anyhow::Error)> {
    let errno = |what: &'static str| {
        let e = std::io::Error::last_os_error();
        (
            e.raw_os_error().unwrap_or(0),
            anyhow::Error::new(e).context(what),
        )
    };
    let config = LoopConfig {
        fd: file.as_raw_fd() as u32,
        block_size: 0,
        info: info(backing),
        reserved: [0; 8],
    };
    // SAFETY: config is a valid struct loop_config for the call.
    let ret = unsafe { libc::ioctl(loop_fd.as_raw_fd(), LOOP_CONFIGURE, &config) };
    if ret == 0 {
        return Ok(());
    }
    let (code, e) = errno("LOOP_CONFIGURE");
    if code != libc::EINVAL && code != libc::ENOTTY {
        return Err((code, e));
    }
    // SAFETY: LOOP_SET_FD takes the backing file descriptor.
    if unsafe { libc::ioctl(loop_fd.as_raw_fd(), LOOP_SET_FD, file.as_raw_fd()) } < 0 {
        return Err(errno("LOOP_SET_FD"));
    }
    let status = info(backing);
    // SAFETY: status is a valid struct loop_info64 for the call.
    if unsafe { libc::ioctl(loop_fd.as_raw_fd(), LOOP_SET_STATUS64, &status) } < 0 {
        let err = errno("LOOP_SET_STATUS64");
        // SAFETY: detaches what LOOP_SET_FD attached; no argument.
        unsafe { libc::ioctl(loop_fd.as_raw_fd(), LOOP_CLR_FD) };
        return Err(err);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The structures have the sizes of <linux/loop.h>.
    #[test]
    fn abi_sizes() {
        assert_eq!(std::mem::size_of::<LoopInfo64>(), 232);
        assert_eq!(std::mem::size_of::<LoopConfig>(), 304);
        let i = info(&"x".repeat(100));
        assert_eq!(i.lo_file_name[LO_NAME_SIZE - 1], 0);
        assert_eq!(i.lo_flags, LO_FLAGS_READ_ONLY);
    }
}
