//! Finding partitions by GPT label, from the uevent files of
//! `/sys/class/block/*` (the kernel exports the GPT partition name as
//! `PARTNAME=`), and waiting for them to appear in /dev.

use anyhow::{Context, Result};
use std::path::{Path, PathBuf};

/// What a uevent file says about a block device.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Uevent {
    pub devname: Option<String>,
    pub devtype: Option<String>,
    pub partname: Option<String>,
    pub partn: Option<u32>,
    pub major: Option<u32>,
    pub minor: Option<u32>,
}

/// Parses a uevent file: `KEY=value` lines; unknown keys are ignored.
pub fn parse_uevent(text: &str) -> Uevent {
    let mut u = Uevent::default();
    for line in text.lines() {
        let Some((k, v)) = line.split_once('=') else {
            continue;
        };
        let v = v.trim();
        match k.trim() {
            "DEVNAME" => u.devname = Some(v.to_string()),
            "DEVTYPE" => u.devtype = Some(v.to_string()),
            "PARTNAME" => u.partname = Some(v.to_string()),
            "PARTN" => u.partn = v.parse().ok(),
            "MAJOR" => u.major = v.parse().ok(),
            "MINOR" => u.minor = v.parse().ok(),
            _ => {}
        }
    }
    u
}

/// A partition found in sysfs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partition {
    /// Kernel name, `vda4`; the device node is `/dev/<name>`.
    pub name: String,
    /// GPT partition name (label), `META`.
    pub label: String,
    /// Kernel name of the whole disk, `vda`, when sysfs says.
    pub disk: Option<String>,
}

impl Partition {
    pub fn dev_path(&self, dev_root: &Path) -> PathBuf {
        dev_root.join(&self.name)
    }
}

/// Every labelled partition under `<sys_root>/class/block`, sorted by name.
pub fn scan(sys_root: &Path) -> Result<Vec<Partition>> {
    let class = sys_root.join("class/block");
    let entries = std::fs::read_dir(&class).with_context(|| format!("read {}", class.display()))?;
    let mut out = Vec::new();
    for entry in entries.flatten() {
        let dir = entry.path();
        // A device may vanish between readdir and read: skip it.
        let Ok(text) = std::fs::read_to_string(dir.join("uevent")) else {
            continue;
        };
        let u = parse_uevent(&text);
        if u.devtype.as_deref() != Some("partition") {
            continue;
        }
        let (Some(label), name) = (u.partname, u.devname) else {
            continue;
        };
        let name = name.unwrap_or_else(|| entry.file_name().to_string_lossy().into_owned());
        out.push(Partition {
            name,
            label,
            disk: disk_of(&dir),
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// The whole disk of a partition: in sysfs the partition's directory is a
/// child of its disk's (`.../block/vda/vda4`).
fn disk_of(class_entry: &Path) -> Option<String> {
    let real = std::fs::canonicalize(class_entry).ok()?;
    let parent = real.parent()?;
    parent
        .join("dev")
        .exists()
        .then(|| parent.file_name())
        .flatten()
        .map(|n| n.to_string_lossy().into_owned())
}

/// Partitions on the same disk as `anchor`, for reporting the layout (all
/// those of unknown disk when sysfs does not say).
pub fn on_disk_of<'a>(parts: &'a [Partition], anchor: &Partition) -> Vec<&'a Partition> {
    parts.iter().filter(|p| p.disk == anchor.disk).collect()
}

/// `vda4=META, vda5=STATE`: the labelled partitions seen, for messages.
pub fn describe(parts: &[Partition]) -> String {
    if parts.is_empty() {
        return "none".into();
    }
    parts
        .iter()
        .map(|p| {
            format!(
                "{}={}",
                contract::text::escape(&p.name),
                contract::text::escape(&p.label)
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use contract::partition::PartitionRole;

    pub(crate) fn tempdir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("machined-test-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn parses_uevent() {
        let u = parse_uevent(
            "MAJOR=253\nMINOR=4\nDEVNAME=vda4\nDEVTYPE=partition\nDISKSEQ=9\nPARTN=4\nPARTNAME=META\n",
        );
        assert_eq!(u.devname.as_deref(), Some("vda4"));
        assert_eq!(u.partname.as_deref(), Some("META"));
        assert_eq!((u.major, u.minor, u.partn), (Some(253), Some(4), Some(4)));
        assert_eq!(parse_uevent("junk\n=\n"), Uevent::default());
    }

    /// A fake sysfs with real-looking symlinks: class/block/X -> devices/.../X.
    pub(crate) fn fake_sys(root: &Path) {
        let dev = root.join("devices/virtio0/block");
        let disk = dev.join("vda");
        std::fs::create_dir_all(root.join("class/block")).unwrap();
        std::fs::create_dir_all(&disk).unwrap();
        std::fs::write(disk.join("dev"), "253:0\n").unwrap();
        std::fs::write(
            disk.join("uevent"),
            "MAJOR=253\nMINOR=0\nDEVNAME=vda\nDEVTYPE=disk\n",
        )
        .unwrap();
        std::os::unix::fs::symlink(&disk, root.join("class/block/vda")).unwrap();
        for (i, spec) in contract::LAYOUT.iter().enumerate() {
            let name = format!("vda{}", i + 1);
            let p = disk.join(&name);
            std::fs::create_dir_all(&p).unwrap();
            std::fs::write(p.join("dev"), format!("253:{}\n", i + 1)).unwrap();
            std::fs::write(
                p.join("uevent"),
                format!(
                    "MAJOR=253\nMINOR={}\nDEVNAME={name}\nDEVTYPE=partition\nPARTN={}\nPARTNAME={}\n",
                    i + 1,
                    i + 1,
                    spec.label
                ),
            )
            .unwrap();
            std::os::unix::fs::symlink(&p, root.join("class/block").join(&name)).unwrap();
        }
        // A loop device (no label) and an unlabelled partition elsewhere.
        std::fs::create_dir_all(root.join("class/block/loop0")).unwrap();
        std::fs::write(
            root.join("class/block/loop0/uevent"),
            "MAJOR=7\nMINOR=0\nDEVNAME=loop0\nDEVTYPE=disk\n",
        )
        .unwrap();
        std::fs::create_dir_all(root.join("class/block/sdb1")).unwrap();
        std::fs::write(
            root.join("class/block/sdb1/uevent"),
            "MAJOR=8\nMINOR=17\nDEVNAME=sdb1\nDEVTYPE=partition\nPARTN=1\n",
        )
        .unwrap();
    }

    #[test]
    fn finds_partitions_by_label_in_fake_sysfs() {
        let root = tempdir("sys");
        fake_sys(&root);
        let parts = scan(&root).unwrap();
        assert_eq!(parts.len(), contract::LAYOUT.len());
        let meta = parts
            .iter()
            .find(|p| p.label == PartitionRole::Meta.label())
            .unwrap();
        assert_eq!(meta.name, "vda4");
        assert_eq!(meta.disk.as_deref(), Some("vda"));
        assert_eq!(on_disk_of(&parts, meta).len(), contract::LAYOUT.len());
        assert!(describe(&parts).contains("vda4=META"));
        assert_eq!(describe(&[]), "none");
        std::fs::remove_dir_all(&root).unwrap();
    }
}
