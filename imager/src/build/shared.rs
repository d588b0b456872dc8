//! The build cache shared through a registry as a build uses it
//! (docs/build-cache.md): which registry and keys ([`shared_cache`]), and
//! the root filesystem's compressed blocks pulled before its stage and
//! pushed after it ([`pull_blocks`], [`push_blocks`]). The kernel's use is
//! [`crate::kernel::build::build_shared`]'s, GRUB's [`crate::grub`]'s.

use super::{BuildOptions, step};
use crate::profile::Profile;
use crate::remote_cache::Shared;
use crate::{rootfs, sign};
use anyhow::{Context, Result};
use std::path::{Path, PathBuf};

/// Where a shared build cache is and whom it trusts
/// ([`crate::remote_cache`]).
#[derive(Debug, Clone, Default)]
pub struct CacheRegistry {
    /// `REGISTRY/NAME`.
    pub repository: String,
    pub access: crate::remote::Access,
    /// Public keys whose entries are trusted, beside the build's own
    /// signing key.
    pub trusted_keys: Vec<PathBuf>,
}

/// The shared cache a build uses: `opts`' (the command line's), else the
/// profile's `cache` section; its client and trusted keys ready.
pub(super) fn shared_cache(
    p: &Profile,
    opts: &BuildOptions,
    signer: &dyn sign::Signer,
) -> Result<Option<crate::remote_cache::RemoteCache>> {
    let from_profile = p.cache.as_ref().and_then(|c| {
        c.registry.as_ref().map(|r| CacheRegistry {
            repository: r.clone(),
            access: crate::remote::Access {
                plain_http: c.plain_http,
                ca: c.ca.clone(),
                ..Default::default()
            },
            trusted_keys: c.trusted_keys.clone(),
        })
    });
    let from_flags = opts.cache_registry.is_some();
    let Some(c) = opts.cache_registry.clone().or(from_profile) else {
        return Ok(None);
    };
    // A bad repository name or trusted key is the user's to fix: an error.
    crate::remote_cache::check_repository(&c.repository)?;
    let mut trusted = vec![signer.public_key()];
    // The profile's trusted keys, and the flags' when the flags name the
    // registry (`c` is the profile's own otherwise).
    let profile_keys: Vec<PathBuf> = match (&p.cache, from_flags) {
        (Some(pc), true) => pc.trusted_keys.clone(),
        _ => Vec::new(),
    };
    for k in c.trusted_keys.iter().chain(&profile_keys) {
        trusted.push(
            sign::load_public_key(k)
                .with_context(|| format!("the cache's trusted key {}", k.display()))?,
        );
    }
    // Reaching it is not: a cache that cannot be reached (credentials
    // that cannot be read, a helper missing) is a warning, and the build
    // goes on without it.
    let probe = registry::Reference::parse(&format!("{}:probe", c.repository))
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let (client, source) = match crate::remote::client(&probe, &c.access) {
        Ok(c) => c,
        Err(e) => {
            step(&format!(
                "warning: cache registry {}: {e:#}; building without it",
                c.repository
            ));
            return Ok(None);
        }
    };
    step(&format!(
        "cache registry: {} ({}; entries signed by {} key(s) trusted)",
        c.repository,
        match source {
            Some(s) => format!("credentials from {s}"),
            None => "no credentials".to_string(),
        },
        trusted.len()
    ));
    Ok(Some(crate::remote_cache::RemoteCache::new(
        &c.repository,
        client,
        trusted,
    )?))
}

/// The kind of the root filesystem's blocks in the shared cache.
const BLOCKS: &str = "rootfs-blocks";

/// Before the root filesystem's stage: the blocks of `key` pulled from the
/// shared cache into the local pack in `blocks` (the directory
/// [`rootfs::build_rootfs_threads`] reads), first; whether they were.
pub(super) fn pull_blocks(shared: Shared, key: &str, blocks: &Path, level: i32) -> bool {
    let pulled = (|| -> Result<Option<usize>> {
        std::fs::create_dir_all(blocks)
            .with_context(|| format!("creating {}", blocks.display()))?;
        let tmp = tempfile::Builder::new()
            .prefix(".cache-pull.")
            .tempdir_in(blocks)?;
        let entry = tmp.path().join("entry");
        if !shared.pull(BLOCKS, key, &entry) {
            return Ok(None);
        }
        let local = blocks.join(rootfs::pack::file_name(level, rootfs::BLOCK_SIZE));
        Ok(Some(rootfs::pack::merge(
            &entry.join("pack"),
            &local,
            rootfs::BLOCK_SIZE,
        )?))
    })();
    match pulled {
        Ok(Some(n)) => {
            step(&format!(
                "rootfs: {n} compressed blocks from the cache registry"
            ));
            true
        }
        Ok(None) => false,
        Err(e) => {
            step(&format!(
                "warning: rootfs: the blocks pulled from the cache registry were not kept ({e:#})"
            ));
            false
        }
    }
}

/// After the root filesystem's stage: the blocks it used (the first
/// `packed` bytes of the local pack it wrote) pushed under `key`.
pub(super) fn push_blocks(shared: Shared, key: &str, blocks: &Path, level: i32, packed: u64) {
    if packed == 0 {
        return;
    }
    let made = (|| -> Result<tempfile::TempDir> {
        let tmp = tempfile::Builder::new()
            .prefix(".cache-push.")
            .tempdir_in(blocks)?;
        let local = blocks.join(rootfs::pack::file_name(level, rootfs::BLOCK_SIZE));
        rootfs::pack::first_blocks(&local, rootfs::BLOCK_SIZE, packed, &tmp.path().join("pack"))?;
        Ok(tmp)
    })();
    match made {
        Ok(tmp) => shared.push(BLOCKS, key, tmp.path()),
        Err(e) => step(&format!(
            "warning: rootfs: its blocks were not pushed to the cache registry ({e:#})"
        )),
    }
}
