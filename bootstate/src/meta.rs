//! Reading and writing META on its partition, in the order that keeps one
//! valid copy through a power cut: copy 1, sync, copy 0, sync.

use crate::device::Device;
use anyhow::{Context, Result};
use contract::Slot;
use contract::meta::{AREA_LEN, BLOCK_LEN, Meta, SlotRecord, SlotStatus, Tag};
use contract::state::BootState;
use std::io::{Read, Seek, SeekFrom};

/// Reads META; returns it and the copy it came from.
pub fn read<D: Read + Seek>(dev: &mut D) -> Result<(Meta, usize)> {
    let mut area = vec![0u8; AREA_LEN];
    dev.seek(SeekFrom::Start(0))?;
    dev.read_exact(&mut area).context("reading META")?;
    Meta::decode(&area).context("decoding META")
}

/// Writes `meta` to both copies: copy 1 first, synced, then copy 0, synced.
pub fn write<D: Device>(dev: &mut D, meta: &Meta) -> Result<()> {
    let block = meta.encode_block().context("encoding META")?;
    for copy in [1u64, 0] {
        dev.seek(SeekFrom::Start(copy * BLOCK_LEN as u64))?;
        dev.write_all(&block)
            .with_context(|| format!("writing META copy {copy}"))?;
        dev.sync()
            .with_context(|| format!("syncing META copy {copy}"))?;
    }
    Ok(())
}

/// META of a newly built or installed disk: slot A good and default at
/// `version` and `security` (the payload's security version, which is also
/// the disk's floor: slot A counts as blessed), slot B empty, the trusted
/// public keys (PEM, concatenated in `trusted-keys`), and the first history
/// event, `<event> slot=A version=<version>`. The builder and the installer
/// both start a disk with it.
pub fn initial(
    image_name: &str,
    version: &str,
    security: u64,
    trusted_pems: &[String],
    event: &str,
) -> Meta {
    let mut m = Meta::default();
    m.set(Tag::ImageName, image_name);
    let mut state = BootState {
        default: Slot::A,
        slots: [
            Some(SlotRecord {
                status: SlotStatus::Good,
                version: version.to_string(),
                security,
            }),
            None,
        ],
        pending: None,
        history: Vec::new(),
        security_floor: security,
    };
    state.record(format!("{event} slot=A version={version}"));
    state.write_to(&mut m);
    m.set(Tag::TrustedKeys, trusted_pems.concat());
    m
}

/// `root` (a root of trust's canonical bytes, `payload::root`) becomes the
/// disk's in `m`: [`Tag::TrustRoot`], and [`Tag::TrustedKeys`] goes, so that
/// an older runtime (a slot rolled back to) refuses every payload rather
/// than trust a key the root retired. A build, an install, and the
/// blessing of an upgrade that brought the root make this change.
pub fn set_root(m: &mut Meta, root: &[u8]) {
    m.set(Tag::TrustRoot, root);
    m.remove(Tag::TrustedKeys);
    m.remove(Tag::TrustRootNext);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::Faulty;
    use contract::meta::Tag;
    use std::io::Cursor;

    #[test]
    fn a_cut_write_leaves_the_old_or_the_new() {
        crate::device::each_loss(|_| a_cut_write_leaves_the_old_or_the_new_under_loss());
    }

    fn a_cut_write_leaves_the_old_or_the_new_under_loss() {
        let mut old = Meta::default();
        old.set(Tag::DefaultSlot, "A");
        let mut new = old.clone();
        new.set(Tag::DefaultSlot, "B");
        let mut dev = Cursor::new(vec![0u8; AREA_LEN]);
        write(&mut dev, &old).unwrap();
        assert_eq!(read(&mut dev).unwrap(), (old.clone(), 0));
        let image = dev.into_inner();
        for n in 1..=3 {
            let mut d = Faulty::failing_at(Cursor::new(image.clone()), n);
            let done = write(&mut d, &new).is_ok();
            let (got, _) = read(&mut d.into_inner()).unwrap();
            assert_eq!(got == new, n > 2 || done, "cut at write {n}");
            assert!(got == new || got == old);
        }
    }
}
