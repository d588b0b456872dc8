//! The root filesystem through dm-verity: the squashfs and its hash device
//! (both in the initramfs) attached to loop devices, a `verity` target
//! created with device-mapper ioctls on `/dev/mapper/control` (as
//! `veritysetup open` does, without libdevmapper), then every block read
//! once, so that a changed byte anywhere in the root fails the boot before
//! anything of it is used.
//!
//! Only the root hash comes from the kernel command line
//! ([`contract::cmdline::VERITY`]); the superblock gives the salt and the
//! size, checked by [`contract::verity::Superblock::parse`] (the salt binds
//! the size, and the salt is in every hash). The target has no optional
//! arguments: a block that does not match its hash reads as EIO (the
//! kernel logs `device-mapper: verity: …: data block N is corrupted`), which
//! this module turns into a fatal error naming the block; the runtime's
//! failure path then reboots and boot counting falls back to the other slot.

use crate::console::say;
use crate::loopdev;
use crate::mount;
use crate::sys::{check, open};
use anyhow::{Context, Result, bail};
use contract::ready::Root;
use contract::verity::{self, BLOCK_SIZE, Superblock};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::time::{Duration, Instant};

const CONTROL: &str = "/dev/mapper/control";
/// The dm device's name, and its UUID's prefix (the root hash follows).
const NAME: &str = "root";
const UUID_PREFIX: &str = "machined-verity-";

// <linux/dm-ioctl.h>: struct dm_ioctl is 312 bytes; _IOWR(0xfd, nr, it).
const DM_IOCTL_LEN: usize = 312;
const DM_TARGET_SPEC_LEN: usize = 40;
const fn dm_ioctl(nr: libc::c_ulong) -> libc::c_ulong {
    (3 << 30) | ((DM_IOCTL_LEN as libc::c_ulong) << 16) | (0xfd << 8) | nr
}
const DM_VERSION: libc::c_ulong = dm_ioctl(0);
const DM_DEV_CREATE: libc::c_ulong = dm_ioctl(3);
const DM_DEV_SUSPEND: libc::c_ulong = dm_ioctl(6);
const DM_TABLE_LOAD: libc::c_ulong = dm_ioctl(9);
const DM_READONLY_FLAG: u32 = 1;
/// The interface version asked for (4.0.0: any 4.x kernel).
const DM_VERSION_MAJOR: u32 = 4;
/// Room for what the kernel writes back (version, status).
const BUFFER_LEN: usize = 16 * 1024;

/// One ioctl's buffer: struct dm_ioctl, then the payload.
struct Request {
    buf: Vec<u8>,
}

impl Request {
    fn new(name: &str, uuid: &str, flags: u32) -> Request {
        let mut buf = vec![0u8; BUFFER_LEN];
        buf[0..4].copy_from_slice(&DM_VERSION_MAJOR.to_ne_bytes());
        buf[12..16].copy_from_slice(&(BUFFER_LEN as u32).to_ne_bytes());
        buf[16..20].copy_from_slice(&(DM_IOCTL_LEN as u32).to_ne_bytes());
        buf[28..32].copy_from_slice(&flags.to_ne_bytes());
        // name[128] at 48, uuid[129] at 176; both NUL-terminated (the
        // callers' strings are far shorter).
        buf[48..48 + name.len().min(127)].copy_from_slice(&name.as_bytes()[..name.len().min(127)]);
        buf[176..176 + uuid.len().min(128)]
            .copy_from_slice(&uuid.as_bytes()[..uuid.len().min(128)]);
        Request { buf }
    }

    /// Adds one target (the table has exactly one).
    fn target(&mut self, sectors: u64, kind: &str, params: &str) {
        let at = DM_IOCTL_LEN;
        let b = &mut self.buf;
        b[20..24].copy_from_slice(&1u32.to_ne_bytes());
        b[at + 8..at + 16].copy_from_slice(&sectors.to_ne_bytes());
        let spec_len = (DM_TARGET_SPEC_LEN + params.len() + 1).next_multiple_of(8);
        b[at + 20..at + 24].copy_from_slice(&(spec_len as u32).to_ne_bytes());
        b[at + 24..at + 24 + kind.len()].copy_from_slice(kind.as_bytes());
        let p = at + DM_TARGET_SPEC_LEN;
        b[p..p + params.len()].copy_from_slice(params.as_bytes());
    }

    fn u32_at(&self, o: usize) -> u32 {
        u32::from_ne_bytes([
            self.buf[o],
            self.buf[o + 1],
            self.buf[o + 2],
            self.buf[o + 3],
        ])
    }

    /// The device number the kernel returned (the dev field, encoded as
    /// `huge_encode_dev`): major and minor.
    fn dev(&self) -> (u64, u64) {
        let mut d = [0u8; 8];
        d.copy_from_slice(&self.buf[40..48]);
        let dev = u64::from_ne_bytes(d);
        let major = (dev >> 8) & 0xfff;
        let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
        (major, minor)
    }

    fn call(&mut self, control: &OwnedFd, request: libc::c_ulong, what: &str) -> Result<()> {
        // SAFETY: buf is a struct dm_ioctl followed by its payload, and
        // data_size says how long it is.
        check(
            unsafe { libc::ioctl(control.as_raw_fd(), request, self.buf.as_mut_ptr()) },
            || format!("device-mapper {what} on {CONTROL}"),
        )?;
        Ok(())
    }
}

fn size(path: &str) -> Result<u64> {
    Ok(std::fs::metadata(path)
        .with_context(|| format!("reading the size of {path}"))?
        .len())
}

/// The dm table line of the verity target.
pub fn table(data_dev: &str, hash_dev: &str, sb: &Superblock, root_hash: &str) -> String {
    format!(
        "1 {data_dev} {hash_dev} {BLOCK_SIZE} {BLOCK_SIZE} {} 1 {} {root_hash} {}",
        sb.data_blocks,
        verity::ALGORITHM,
        verity::hex(&sb.salt)
    )
}

/// Checks the hash device's superblock and both sizes against it.
fn check_files(image: &str, hash: &str) -> Result<Superblock> {
    let bytes = {
        use std::io::Read;
        let mut f = std::fs::File::open(hash).with_context(|| format!("open {hash}"))?;
        let mut block = vec![0u8; BLOCK_SIZE as usize];
        let mut n = 0;
        while n < block.len() {
            match f
                .read(&mut block[n..])
                .with_context(|| format!("read {hash}"))?
            {
                0 => break,
                k => n += k,
            }
        }
        block.truncate(n);
        block
    };
    let sb = Superblock::parse(&bytes).map_err(|e| anyhow::anyhow!("{hash}: {e}"))?;
    let want = sb.data_blocks * BLOCK_SIZE;
    let got = size(image)?;
    if got != want {
        bail!(
            "the root filesystem {image} is {got} bytes, its verity superblock says {want}: \
             the image was changed"
        );
    }
    let want = verity::hash_device_blocks(sb.data_blocks) * BLOCK_SIZE;
    let got = size(hash)?;
    if got != want {
        bail!("the hash device {hash} is {got} bytes, its tree takes {want}: it was changed");
    }
    Ok(sb)
}

/// Opens `image` through dm-verity with the hash device `hash` and the
/// command line's `root_hash` (hex), reads it all, and returns the dm
/// device's path (`/dev/dm-N`) to mount.
pub fn open_verified(image: &str, hash: &str, root_hash: &str) -> Result<String> {
    let digest = verity::parse_root_hash(root_hash).map_err(anyhow::Error::msg)?;
    let root_hash = verity::hex(&digest);
    let sb = check_files(image, hash)?;
    let data_dev = loopdev::attach_read_only(image)?;
    let hash_dev = loopdev::attach_read_only(hash)?;
    let control = open(CONTROL, libc::O_RDWR).context(
        "device-mapper is needed for the verified root (CONFIG_BLK_DEV_DM, CONFIG_DM_VERITY)",
    )?;
    let uuid = format!("{UUID_PREFIX}{root_hash}");

    let mut v = Request::new("", "", 0);
    v.call(&control, DM_VERSION, "DM_VERSION")?;
    if v.u32_at(0) != DM_VERSION_MAJOR {
        bail!(
            "the kernel's device-mapper interface is version {}, not 4",
            v.u32_at(0)
        );
    }
    let mut create = Request::new(NAME, &uuid, 0);
    create.call(&control, DM_DEV_CREATE, "DM_DEV_CREATE")?;
    let (major, minor) = create.dev();

    let params = table(&data_dev, &hash_dev, &sb, &root_hash);
    let mut load = Request::new(NAME, "", DM_READONLY_FLAG);
    load.target(sb.data_blocks * (BLOCK_SIZE / 512), "verity", &params);
    load.call(&control, DM_TABLE_LOAD, "DM_TABLE_LOAD (verity)")
        .with_context(|| {
            format!("loading the verity table {params:?} (see the kernel's message above)")
        })?;
    // DM_DEV_SUSPEND without DM_SUSPEND_FLAG resumes: the table goes live.
    let mut resume = Request::new(NAME, "", 0);
    resume.call(&control, DM_DEV_SUSPEND, "DM_DEV_SUSPEND (resume)")?;

    let dev = format!("/dev/dm-{minor}");
    wait_for_node(&dev, major, minor)?;
    read_all(&dev, sb.data_blocks)?;
    say(format!(
        "stage1: root verified: {image} through dm-verity ({dev}, {} blocks, root hash {})",
        sb.data_blocks,
        &root_hash[..16]
    ));
    Ok(dev)
}

/// devtmpfs makes the node when the device is added; wait for it briefly.
fn wait_for_node(dev: &str, major: u64, minor: u64) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !Path::new(dev).exists() {
        if Instant::now() > deadline {
            bail!("{dev} (device {major}:{minor}) did not appear in devtmpfs");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

/// Reads every block of the verity device; the first one that fails
/// verification is named.
fn read_all(dev: &str, blocks: u64) -> Result<()> {
    let fd = open(dev, libc::O_RDONLY)?;
    const CHUNK: u64 = 64;
    let mut buf = vec![0u8; (CHUNK * BLOCK_SIZE) as usize];
    let mut block = 0;
    while block < blocks {
        let n = CHUNK.min(blocks - block);
        if pread(&fd, &mut buf[..(n * BLOCK_SIZE) as usize], block).is_err() {
            for b in block..block + n {
                if let Err(e) = pread(&fd, &mut buf[..BLOCK_SIZE as usize], b) {
                    bail!(
                        "dm-verity: block {b} of the root filesystem (bytes {} to {}) does not \
                         match the root hash on the kernel command line ({e}): the root \
                         filesystem or its hash tree was changed; refusing to boot it",
                        b * BLOCK_SIZE,
                        (b + 1) * BLOCK_SIZE - 1
                    );
                }
            }
            bail!(
                "dm-verity: reading blocks {block} to {} failed",
                block + n - 1
            );
        }
        block += n;
    }
    Ok(())
}

fn pread(fd: &OwnedFd, buf: &mut [u8], block: u64) -> std::io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        let off = (block * BLOCK_SIZE + done as u64) as libc::off_t;
        // SAFETY: buf[done..] is valid for writes of its length.
        let r = unsafe {
            libc::pread(
                fd.as_raw_fd(),
                buf[done..].as_mut_ptr().cast(),
                buf.len() - done,
                off,
            )
        };
        match r {
            r if r < 0 => return Err(std::io::Error::last_os_error()),
            0 => return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof)),
            r => done += r as usize,
        }
    }
    Ok(())
}

/// Whether the mounted root is the dm-verity device stage 1 made with the
/// command line's root hash: the squashfs mounted on `/` is a dm device
/// whose UUID names that hash.
pub fn root_state(cmdline: &str) -> Root {
    let Some(hash) = contract::cmdline::get(cmdline, contract::cmdline::VERITY) else {
        return Root::Unverified;
    };
    let Ok(text) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Root::Unverified;
    };
    let Some(root) = mount::parse_mountinfo(&text)
        .into_iter()
        .rev()
        .find(|m| m.mount_point == "/")
    else {
        return Root::Unverified;
    };
    let Some(name) = root.source.strip_prefix("/dev/") else {
        return Root::Unverified;
    };
    let uuid = std::fs::read_to_string(format!("/sys/block/{name}/dm/uuid")).unwrap_or_default();
    if root.fstype == "squashfs"
        && uuid.trim() == format!("{UUID_PREFIX}{}", hash.to_ascii_lowercase())
    {
        Root::Verified
    } else {
        Root::Unverified
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ioctl_numbers_and_layout() {
        // As <linux/dm-ioctl.h> defines them on x86_64.
        assert_eq!(DM_VERSION, 0xc138_fd00);
        assert_eq!(DM_DEV_CREATE, 0xc138_fd03);
        assert_eq!(DM_DEV_SUSPEND, 0xc138_fd06);
        assert_eq!(DM_TABLE_LOAD, 0xc138_fd09);
        let mut r = Request::new("root", "u", DM_READONLY_FLAG);
        r.target(16, "verity", "1 a b");
        assert_eq!(r.u32_at(0), 4);
        assert_eq!(r.u32_at(16), 312);
        assert_eq!(r.u32_at(20), 1);
        assert_eq!(&r.buf[48..53], b"root\0");
        assert_eq!(&r.buf[176..178], b"u\0");
        assert_eq!(&r.buf[312 + 24..312 + 30], b"verity");
        assert_eq!(&r.buf[352..358], b"1 a b\0");
        assert_eq!(r.u32_at(312 + 20), 48);
        // huge_encode_dev(MKDEV(254, 300))
        let dev: u64 = (300 & 0xff) | (254 << 8) | ((300 & !0xff) << 12);
        r.buf[40..48].copy_from_slice(&dev.to_ne_bytes());
        assert_eq!(r.dev(), (254, 300));
    }

    #[test]
    fn table_line() {
        let mut salt = [0u8; 32];
        salt[24] = 3;
        let sb = Superblock {
            uuid: [0; 16],
            data_blocks: 3,
            salt,
        };
        let t = table("/dev/loop0", "/dev/loop1", &sb, &"ab".repeat(32));
        assert_eq!(
            t,
            format!(
                "1 /dev/loop0 /dev/loop1 4096 4096 3 1 sha256 {} {}",
                "ab".repeat(32),
                verity::hex(&salt)
            )
        );
    }
}
