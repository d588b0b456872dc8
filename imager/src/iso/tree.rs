//! The directory tree of the image: path validation, the plain ISO 9660
//! identifiers (upper case, unique per directory, ECMA-119 9.3 order), the
//! path-table order of the directories and the data order of the files.

use super::encoding::is_d_char;
use super::rockridge::Susp;
use super::{IsoSpec, MAX_LEVELS, MAX_NAME};
use anyhow::{Result, bail, ensure};
use std::collections::{BTreeMap, HashSet};

/// The components of a valid path.
pub(super) fn components(path: &str) -> Result<Vec<&str>> {
    ensure!(!path.is_empty(), "an ISO file has an empty path");
    ensure!(
        !path.starts_with('/'),
        "the ISO path {path:?} starts with '/': paths are relative to the image's root"
    );
    let parts: Vec<&str> = path.split('/').collect();
    for p in &parts {
        ensure!(
            !p.is_empty(),
            "the ISO path {path:?} has an empty component"
        );
        ensure!(
            *p != "." && *p != "..",
            "the ISO path {path:?} has a {p:?} component"
        );
        ensure!(
            p.len() <= MAX_NAME,
            "the ISO path {path:?} has a name of {} bytes: Rock Ridge names are at most \
             {MAX_NAME} bytes",
            p.len()
        );
        ensure!(!p.contains('\0'), "the ISO path {path:?} holds a NUL byte");
    }
    ensure!(
        parts.len() <= MAX_LEVELS,
        "the ISO path {path:?} is {} directories deep: ISO 9660 allows {MAX_LEVELS} levels \
         (the root and {} below it)",
        parts.len() - 1,
        MAX_LEVELS - 1
    );
    Ok(parts)
}

#[derive(Debug)]
pub(super) enum Kind {
    Dir {
        children: Vec<usize>,
        parent: usize,
        lba: u32,
        size: u32,
        /// Path table number (1 for the root).
        number: u16,
    },
    File {
        /// Index in the spec's files.
        file: usize,
        size: u64,
        lba: u32,
    },
}

#[derive(Debug)]
pub(super) struct Node {
    /// The real (Rock Ridge) name; empty for the root.
    pub(super) name: String,
    /// The ISO 9660 identifier, version included for files.
    pub(super) ident: Vec<u8>,
    pub(super) kind: Kind,
    /// System use bytes of this node's record in its parent, and of its own
    /// "." record (directories), laid out by [`layout_susp`](super::rockridge::layout_susp).
    pub(super) susp: Susp,
    pub(super) dot_susp: Susp,
}

/// The plain ISO 9660 identifier for a real name (without uniqueness).
pub(super) fn iso_ident(name: &str, dir: bool) -> (String, String) {
    let map = |s: &str| -> String {
        s.bytes()
            .map(|c| {
                let c = c.to_ascii_uppercase();
                if is_d_char(c) { c as char } else { '_' }
            })
            .collect()
    };
    if dir {
        let mut n = map(name);
        n.truncate(31);
        return (n, String::new());
    }
    let (base, ext) = match name.rfind('.') {
        Some(i) if i > 0 => (&name[..i], &name[i + 1..]),
        _ => (name, ""),
    };
    let mut ext = map(ext);
    ext.truncate(8);
    let mut base = map(base);
    base.truncate(30 - ext.len());
    if base.is_empty() && ext.is_empty() {
        base.push('_');
    }
    (base, ext)
}

pub(super) fn full_ident(base: &str, ext: &str, dir: bool) -> Vec<u8> {
    if dir {
        base.as_bytes().to_vec()
    } else {
        format!("{base}.{ext};1").into_bytes()
    }
}

/// The ECMA-119 9.3 ordering key of an identifier: name, then extension,
/// each padded with spaces.
pub(super) fn order_key(ident: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let s = ident.split(|c| *c == b';').next().unwrap_or(ident);
    let (name, ext) = match s.iter().position(|c| *c == b'.') {
        Some(i) => (&s[..i], &s[i + 1..]),
        None => (s, &[][..]),
    };
    let mut n = name.to_vec();
    n.resize(32, b' ');
    let mut e = ext.to_vec();
    e.resize(32, b' ');
    (n, e)
}

pub(super) struct Layout {
    pub(super) nodes: Vec<Node>,
    /// Directories in path-table order.
    pub(super) dirs: Vec<usize>,
    /// Files (node indices) in data order.
    pub(super) files: Vec<usize>,
}

/// Builds the tree of `spec`'s files (sizes given).
pub(super) fn build_tree(spec: &IsoSpec, sizes: &[u64]) -> Result<Layout> {
    let mut nodes = vec![Node {
        name: String::new(),
        ident: vec![0],
        kind: Kind::Dir {
            children: Vec::new(),
            parent: 0,
            lba: 0,
            size: 0,
            number: 1,
        },
        susp: Susp::default(),
        dot_susp: Susp::default(),
    }];
    // Children by real name, per directory node.
    let mut by_name: Vec<BTreeMap<String, usize>> = vec![BTreeMap::new()];
    let mut order: Vec<usize> = (0..spec.files.len()).collect();
    order.sort_by(|a, b| spec.files[*a].path.cmp(&spec.files[*b].path));
    for &i in &order {
        let f = &spec.files[i];
        let parts = components(&f.path)?;
        let mut dir = 0usize;
        for (k, part) in parts.iter().enumerate() {
            let last = k + 1 == parts.len();
            match by_name[dir].get(*part).copied() {
                Some(n) => match (&nodes[n].kind, last) {
                    (Kind::Dir { .. }, false) => dir = n,
                    (Kind::File { .. }, _) | (Kind::Dir { .. }, true) => bail!(
                        "the ISO path {:?} is given twice, or as both a file and a directory",
                        parts[..=k].join("/")
                    ),
                },
                None => {
                    let n = nodes.len();
                    let kind = if last {
                        Kind::File {
                            file: i,
                            size: sizes[i],
                            lba: 0,
                        }
                    } else {
                        Kind::Dir {
                            children: Vec::new(),
                            parent: dir,
                            lba: 0,
                            size: 0,
                            number: 0,
                        }
                    };
                    nodes.push(Node {
                        name: (*part).to_string(),
                        ident: Vec::new(),
                        kind,
                        susp: Susp::default(),
                        dot_susp: Susp::default(),
                    });
                    by_name.push(BTreeMap::new());
                    by_name[dir].insert((*part).to_string(), n);
                    if let Kind::Dir { children, .. } = &mut nodes[dir].kind {
                        children.push(n);
                    }
                    if !last {
                        dir = n;
                    }
                }
            }
        }
    }
    // Unique ISO identifiers per directory, children sorted by them.
    for d in 0..nodes.len() {
        let kids = match &nodes[d].kind {
            Kind::Dir { children, .. } => children.clone(),
            Kind::File { .. } => continue,
        };
        let mut used: HashSet<(Vec<u8>, Vec<u8>)> = HashSet::new();
        for &c in &kids {
            let is_dir = matches!(nodes[c].kind, Kind::Dir { .. });
            let (base, ext) = iso_ident(&nodes[c].name, is_dir);
            let mut ident = full_ident(&base, &ext, is_dir);
            let mut n = 1u32;
            while used.contains(&order_key(&ident)) {
                let suffix = format!("_{n}");
                let room = if is_dir { 31 } else { 30 - ext.len() };
                let mut b = base.clone();
                b.truncate(room.saturating_sub(suffix.len()));
                b.push_str(&suffix);
                ident = full_ident(&b, &ext, is_dir);
                n += 1;
            }
            used.insert(order_key(&ident));
            nodes[c].ident = ident;
        }
        let mut sorted = kids;
        sorted.sort_by(|a, b| order_key(&nodes[*a].ident).cmp(&order_key(&nodes[*b].ident)));
        if let Kind::Dir { children, .. } = &mut nodes[d].kind {
            *children = sorted;
        }
    }
    // Path-table order: breadth first, children in identifier order.
    let mut dirs = vec![0usize];
    let mut i = 0;
    while i < dirs.len() {
        if let Kind::Dir { children, .. } = &nodes[dirs[i]].kind {
            for &c in children {
                if matches!(nodes[c].kind, Kind::Dir { .. }) {
                    dirs.push(c);
                }
            }
        }
        i += 1;
    }
    ensure!(
        dirs.len() <= usize::from(u16::MAX),
        "{} directories: the path table numbers at most 65535",
        dirs.len()
    );
    for (k, &d) in dirs.iter().enumerate() {
        if let Kind::Dir { number, .. } = &mut nodes[d].kind {
            *number = (k + 1) as u16;
        }
    }
    // Files in sorted path order.
    let mut files: Vec<(String, usize)> = Vec::new();
    for (n, node) in nodes.iter().enumerate() {
        if let Kind::File { file, .. } = node.kind {
            files.push((spec.files[file].path.clone(), n));
        }
    }
    files.sort();
    Ok(Layout {
        nodes,
        dirs,
        files: files.into_iter().map(|(_, n)| n).collect(),
    })
}
