//! The manifest of the root filesystem (`rootfs/skeleton.txt`), compiled in
//! so that stage 1 checks the very list the builder was given.

use std::path::Path;

pub use contract::skeleton::{Kind, parse};

pub const MANIFEST: &str = include_str!("../skeleton.txt");

/// The manifest entries missing under `root`, as `path` strings: those of
/// `skeleton.txt` (compiled in), then those of the generated closure manifest
/// of the host programs ([`contract::paths::ROOTFS_HOST_CLOSURE`]), when the
/// root filesystem has it. Files not listed in either are not looked at.
pub fn missing(root: &Path) -> Result<Vec<String>, String> {
    let mut out = missing_in(root, MANIFEST)?;
    let closure = root.join(contract::paths::ROOTFS_HOST_CLOSURE.trim_start_matches('/'));
    if closure.is_file() {
        let text = std::fs::read_to_string(&closure)
            .map_err(|e| format!("read {}: {e}", closure.display()))?;
        let more = missing_in(root, &text)
            .map_err(|e| format!("{}: {e}", contract::paths::ROOTFS_HOST_CLOSURE))?;
        out.extend(more);
    }
    Ok(out)
}

fn missing_in(root: &Path, manifest: &str) -> Result<Vec<String>, String> {
    Ok(parse(manifest)?
        .into_iter()
        .filter(|e| {
            let p = root.join(e.path);
            match e.kind {
                Kind::Dir => !p.is_dir(),
                Kind::File | Kind::Builder | Kind::Host => !p.is_file(),
            }
        })
        .map(|e| e.path.to_string())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use contract::paths;

    #[test]
    fn manifest_matches_contract_and_skeleton_dir() {
        let entries = parse(MANIFEST).unwrap();
        let has = |kind: Kind, path: &str| entries.iter().any(|e| e.kind == kind && e.path == path);
        assert!(has(
            Kind::Builder,
            paths::ROOTFS_INIT.trim_start_matches('/')
        ));
        assert!(has(
            Kind::Builder,
            paths::ROOTFS_OS_RELEASE.trim_start_matches('/')
        ));
        for f in paths::GENERATED_ETC_FILES {
            assert!(has(Kind::File, &format!("etc/{f}")), "{f}");
        }
        for d in ["dev", "proc", "sys", "run", "tmp", "var"] {
            assert!(has(Kind::Dir, d), "{d}");
        }
        assert!(has(Kind::Dir, paths::SYSTEM_DIR.trim_start_matches('/')));
        assert!(has(
            Kind::Dir,
            paths::EPHEMERAL_MOUNT.trim_start_matches('/')
        ));
        assert!(has(
            Kind::Builder,
            paths::ROOTFS_HOST_CLOSURE.trim_start_matches('/')
        ));
        assert!(has(Kind::Host, paths::MKFS_XFS.trim_start_matches('/')));
        for d in paths::PERSISTENT_ETC_DIRS {
            assert!(has(Kind::Dir, &format!("etc/{d}")), "{d}");
        }
        // Every `file` is in rootfs/skeleton, and every file there is listed.
        let skel = Path::new(env!("CARGO_MANIFEST_DIR")).join("skeleton");
        for e in entries.iter().filter(|e| e.kind == Kind::File) {
            assert!(skel.join(e.path).is_file(), "{}", e.path);
        }
        let mut stack = vec![skel.clone()];
        while let Some(d) = stack.pop() {
            for f in std::fs::read_dir(&d).unwrap() {
                let p = f.unwrap().path();
                let rel = p.strip_prefix(&skel).unwrap().to_str().unwrap().to_string();
                if p.is_dir() {
                    assert!(has(Kind::Dir, &rel), "{rel} is not in skeleton.txt");
                    stack.push(p);
                } else {
                    assert!(has(Kind::File, &rel), "{rel} is not in skeleton.txt");
                }
            }
        }
        // Parents come before children, so the list can be created in order.
        for (i, e) in entries.iter().enumerate() {
            if let Some((parent, _)) = e.path.rsplit_once('/') {
                assert!(
                    entries[..i]
                        .iter()
                        .any(|p| p.kind == Kind::Dir && p.path == parent)
                );
            }
        }
    }

    #[test]
    fn rejects_bad_lines_and_reports_missing() {
        assert!(parse("dir 0755").is_err());
        assert!(parse("dir 0755 /abs").is_err());
        assert!(parse("dir 0855 x").is_err());
        assert!(parse("link 0777 x").is_err());
        assert!(parse("dir 0755 a/../b").is_err());
        let root = std::env::temp_dir().join(format!("machined-skel-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("etc")).unwrap();
        let m = missing(&root).unwrap();
        assert!(m.contains(&"etc/hosts".to_string()));
        assert!(!m.contains(&"etc".to_string()));
        assert!(m.contains(&"usr/sbin/mkfs.xfs".to_string()));
        // The generated closure manifest is checked when present.
        std::fs::create_dir_all(root.join("usr/lib/machined")).unwrap();
        std::fs::write(
            root.join("usr/lib/machined/host-closure.txt"),
            "host 0755 lib64/ld-linux-x86-64.so.2\n",
        )
        .unwrap();
        let m = missing(&root).unwrap();
        assert!(
            m.contains(&"lib64/ld-linux-x86-64.so.2".to_string()),
            "{m:?}"
        );
        std::fs::create_dir_all(root.join("lib64")).unwrap();
        std::fs::write(root.join("lib64/ld-linux-x86-64.so.2"), "").unwrap();
        let m = missing(&root).unwrap();
        assert!(
            !m.contains(&"lib64/ld-linux-x86-64.so.2".to_string()),
            "{m:?}"
        );
        std::fs::write(root.join("usr/lib/machined/host-closure.txt"), "bad\n").unwrap();
        assert!(missing(&root).is_err());
        std::fs::remove_dir_all(&root).unwrap();
    }
}
