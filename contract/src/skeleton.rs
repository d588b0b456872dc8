//! The manifest of the root filesystem (`rootfs/skeleton.txt`): which
//! directories and files the squashfs holds, with their modes. The builder
//! builds the root filesystem from it and stage 1 of the runtime checks the
//! mounted root against the same list before switching to it.
//!
//! One entry a line, `<kind> <octal mode> <path relative to />`:
//! `dir` (a directory), `file` (copied from `rootfs/skeleton/`), `builder`
//! (a file the builder produces), `host` (a program copied from the build
//! host at the same path, with the shared libraries and the ELF interpreter
//! it needs; those are listed in the generated [`crate::paths::ROOTFS_HOST_CLOSURE`]
//! manifest, in this same format with kind `host`). Parents come before
//! children.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Dir,
    File,
    Builder,
    Host,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry<'a> {
    pub kind: Kind,
    pub mode: u32,
    /// Relative to the root, no leading slash.
    pub path: &'a str,
}

/// Parses the manifest; a malformed line is an error naming it.
pub fn parse(text: &str) -> Result<Vec<Entry<'_>>, String> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let bad = || format!("skeleton manifest line {}: {line:?}", n + 1);
        let mut w = line.split_whitespace();
        let (Some(kind), Some(mode), Some(path), None) = (w.next(), w.next(), w.next(), w.next())
        else {
            return Err(bad());
        };
        let kind = match kind {
            "dir" => Kind::Dir,
            "file" => Kind::File,
            "builder" => Kind::Builder,
            "host" => Kind::Host,
            _ => return Err(bad()),
        };
        let mode = u32::from_str_radix(mode, 8).map_err(|_| bad())?;
        if path.starts_with('/') || path.split('/').any(|c| c.is_empty() || c == "..") {
            return Err(bad());
        }
        out.push(Entry { kind, mode, path });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_entries_and_rejects_bad_lines() {
        let e = parse("# c\n\ndir 1777 tmp\nbuilder 0755 usr/bin/x\n").unwrap();
        assert_eq!(
            parse("host 0755 usr/sbin/mkfs.xfs").unwrap()[0].kind,
            Kind::Host
        );
        assert_eq!(
            e,
            vec![
                Entry {
                    kind: Kind::Dir,
                    mode: 0o1777,
                    path: "tmp"
                },
                Entry {
                    kind: Kind::Builder,
                    mode: 0o755,
                    path: "usr/bin/x"
                },
            ]
        );
        for bad in [
            "dir 0755",
            "dir 0755 /abs",
            "dir 0855 x",
            "link 0777 x",
            "dir 0755 a/../b",
            "dir 0755 a b",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}
