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
        // The line is not quoted: the file may not be a manifest at all.
        let bad = |what: &str| format!("skeleton manifest line {}: {what}", n + 1);
        let mut w = line.split_whitespace();
        let (Some(kind), Some(mode), Some(path), None) = (w.next(), w.next(), w.next(), w.next())
        else {
            return Err(bad("not three words (`<kind> <octal mode> <path>`)"));
        };
        let kind = match kind {
            "dir" => Kind::Dir,
            "file" => Kind::File,
            "builder" => Kind::Builder,
            "host" => Kind::Host,
            _ => return Err(bad("the kind is not one of dir, file, builder, host")),
        };
        let mode = u32::from_str_radix(mode, 8)
            .ok()
            .filter(|m| *m <= 0o7777)
            .ok_or_else(|| bad("the mode is not an octal number up to 7777"))?;
        if path.starts_with('/') || path.split('/').any(|c| c.is_empty() || c == "..") {
            return Err(bad(
                "the path must be relative to /, without empty or `..` components",
            ));
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
        // A line that is not an entry is named, never quoted: the file
        // may be a secret that was named by mistake.
        let e = parse("# x\nroot:$y$j9T$c2VjcmV0aGFzaA:19000:0:99999:7:::\n").unwrap_err();
        assert_eq!(
            e,
            "skeleton manifest line 2: not three words (`<kind> <octal mode> <path>`)"
        );
        let e = parse("dir 0755 secret/../x").unwrap_err();
        assert!(e.contains("line 1") && !e.contains("secret"), "{e}");
    }
}
