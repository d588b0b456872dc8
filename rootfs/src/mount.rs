//! mount(2) and umount(2), with errors that say what was being mounted, and
//! the /proc/self/mountinfo parser used at shutdown.

use crate::sys::{check, cstr};
use anyhow::Result;
use std::ptr;

/// mount(2). `source`/`fstype`/`data` may be absent.
pub fn mount(
    source: Option<&str>,
    target: &str,
    fstype: Option<&str>,
    flags: libc::c_ulong,
    data: Option<&str>,
) -> Result<()> {
    let what = || {
        format!(
            "mount {} on {target} (type {}, options {:?})",
            source.unwrap_or("none"),
            fstype.unwrap_or("none"),
            data.unwrap_or("")
        )
    };
    let s = source.map(cstr).transpose()?;
    let t = cstr(target)?;
    let f = fstype.map(cstr).transpose()?;
    let d = data.map(cstr).transpose()?;
    let p = |c: &Option<std::ffi::CString>| c.as_ref().map_or(ptr::null(), |c| c.as_ptr());
    // SAFETY: every pointer is NULL or a valid C string alive for the call.
    let ret = unsafe { libc::mount(p(&s), t.as_ptr(), p(&f), flags, p(&d).cast()) };
    check(ret, what).map(drop)
}

/// A virtual filesystem: `mount -t <fstype> <fstype> <target>`.
pub fn fs(fstype: &str, target: &str, flags: libc::c_ulong, data: Option<&str>) -> Result<()> {
    mount(Some(fstype), target, Some(fstype), flags, data)
}

/// `mount --bind source target`, then read-only when asked.
pub fn bind(source: &str, target: &str, read_only: bool) -> Result<()> {
    mount(Some(source), target, None, libc::MS_BIND, None)?;
    if read_only {
        let flags = libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY;
        mount(None, target, None, flags, None)?;
    }
    Ok(())
}

/// `mount --move source target`.
pub fn move_mount(source: &str, target: &str) -> Result<()> {
    mount(Some(source), target, None, libc::MS_MOVE, None)
}

pub fn umount(target: &str) -> Result<()> {
    let t = cstr(target)?;
    // SAFETY: valid C string.
    check(unsafe { libc::umount2(t.as_ptr(), 0) }, || {
        format!("umount {target}")
    })
    .map(drop)
}

pub fn remount_read_only(target: &str) -> Result<()> {
    mount(None, target, None, libc::MS_REMOUNT | libc::MS_RDONLY, None)
}

/// One line of /proc/self/mountinfo, the fields we use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountInfo {
    pub mount_point: String,
    pub fstype: String,
    pub source: String,
}

/// Parses /proc/self/mountinfo (proc(5)); lines that do not parse are skipped.
pub fn parse_mountinfo(text: &str) -> Vec<MountInfo> {
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            let mount_point = unescape(fields.get(4)?);
            let sep = fields.iter().position(|f| *f == "-")?;
            Some(MountInfo {
                mount_point,
                fstype: fields.get(sep + 1)?.to_string(),
                source: unescape(fields.get(sep + 2)?),
            })
        })
        .collect()
}

/// Undoes the kernel's octal escapes (`\040` for a space).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let oct = b
            .get(i + 1..i + 4)
            .filter(|o| b[i] == b'\\' && o.iter().all(|c| (b'0'..=b'7').contains(c)));
        match oct {
            Some(o) => {
                let v = o.iter().fold(0u32, |a, c| a * 8 + u32::from(c - b'0'));
                out.push(v as u8);
                i += 4;
            }
            None => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_mountinfo() {
        let text = "\
22 1 7:0 / / ro,relatime - squashfs /dev/loop0 ro
23 22 0:5 / /dev rw,nosuid shared:2 - devtmpfs devtmpfs rw,size=1k,mode=755
30 22 0:30 /hosts /etc/hosts ro - tmpfs tmpfs rw
31 22 0:31 / /mnt/a\\040b rw - ext4 /dev/vda\\0401 rw
garbage
";
        let m = parse_mountinfo(text);
        assert_eq!(m.len(), 4);
        assert_eq!(m[0].mount_point, "/");
        assert_eq!(m[0].fstype, "squashfs");
        assert_eq!(m[1].fstype, "devtmpfs");
        assert_eq!(m[2].mount_point, "/etc/hosts");
        assert_eq!(m[3].mount_point, "/mnt/a b");
        assert_eq!(m[3].source, "/dev/vda 1");
        assert_eq!(unescape("a\\\\b\\0"), "a\\\\b\\0");
    }
}
