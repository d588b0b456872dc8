//! The runtime binary (`machined`): built from its cargo package as a static
//! executable, or taken prebuilt, and checked to be static either way.

use anyhow::{Context, Result, anyhow, bail};
use contract::Arch;
use contract::le::{read_u16, read_u32, read_u64};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The target of amd64 images, the host's; `+crt-static` makes it static.
/// Another architecture's is its `contract::arch` row's `rust_target`.
pub const TARGET: &str = contract::arch::ARCHES[0].rust_target;

/// Builds the binary of the cargo package in `package_dir` for `arch`
/// (release, static, with build paths remapped so that the binary does not
/// depend on where the checkout lives) and returns its path.
pub fn build(package_dir: &Path, arch: Arch) -> Result<PathBuf> {
    build_named(package_dir, "runtime", "runtime.cargo_package", arch)
}

/// [`build`] for any static binary of the image: `what` names it in
/// messages (`runtime`, `installer`), `key` is its profile key. Another
/// architecture than the host's is cross-built: its Rust target's standard
/// library (`rustup target add`) and the Debian cross compiler as linker
/// and C compiler (scripts/setup.sh installs both).
pub fn build_named(package_dir: &Path, what: &str, key: &str, arch: Arch) -> Result<PathBuf> {
    let manifest = package_dir.join("Cargo.toml");
    let manifest = std::fs::canonicalize(&manifest).unwrap_or(manifest);
    if !manifest.is_file() {
        bail!(
            "{what} package {} has no Cargo.toml: set {key} in the profile",
            package_dir.display()
        );
    }
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let workspace = workspace_root(&manifest)?;
    let cargo_home = std::env::var("CARGO_HOME").unwrap_or_else(|_| {
        std::env::var("HOME").map_or_else(|_| "/root/.cargo".into(), |h| format!("{h}/.cargo"))
    });
    let rustflags = format!(
        "-C target-feature=+crt-static --remap-path-prefix={}=/src --remap-path-prefix={cargo_home}=/cargo",
        workspace.display()
    );
    let spec = arch.spec();
    let mut cmd = Command::new(&cargo);
    if !spec.cross_compile.is_empty() {
        let triple = spec.rust_target.replace('-', "_");
        let gcc = arch.gcc();
        cmd.env(
            format!("CARGO_TARGET_{}_LINKER", triple.to_uppercase()),
            &gcc,
        )
        .env(format!("CC_{triple}"), &gcc);
    }
    let out = crate::progress::tool_output(
        cmd.args([
            "build",
            "--release",
            "--locked",
            "--target",
            spec.rust_target,
        ])
        .arg("--manifest-path")
        .arg(&manifest)
        .args(["--message-format", "json-render-diagnostics"])
        .env("RUSTFLAGS", &rustflags)
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        // Built as the stable toolchain builds it: a caller's
        // RUSTC_BOOTSTRAP (scripts/lib/test-runner sets it for test
        // binaries) would change cargo's fingerprints and rebuild it.
        .env_remove("RUSTC_BOOTSTRAP"),
    )
    .with_context(|| format!("running cargo to build the {what}"))?;
    if !out.status.success() {
        bail!(
            "building the {what} in {} failed (cargo's messages are above)",
            package_dir.display()
        );
    }
    let exe = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["reason"] == "compiler-artifact")
        .filter(|v| v["manifest_path"].as_str() == manifest.to_str())
        .filter_map(|v| v["executable"].as_str().map(PathBuf::from))
        .next_back();
    let exe = exe.with_context(|| {
        format!(
            "cargo built no executable for {}: is it a binary package?",
            manifest.display()
        )
    })?;
    check_static(&exe, arch)?;
    Ok(exe)
}

/// The root of the cargo workspace `manifest` belongs to: the nearest
/// ancestor directory whose Cargo.toml has a `[workspace]` table, else the
/// package's own directory (cargo's rule, read without starting cargo: a
/// no-change build should not pay for a process that only finds a file).
fn workspace_root(manifest: &Path) -> Result<PathBuf> {
    let package = manifest
        .parent()
        .with_context(|| format!("{} has no directory", manifest.display()))?;
    for dir in package.ancestors() {
        let toml = dir.join("Cargo.toml");
        let Ok(text) = std::fs::read_to_string(&toml) else {
            continue;
        };
        if text.lines().any(|l| l.trim() == "[workspace]") {
            return Ok(dir.to_path_buf());
        }
    }
    Ok(package.to_path_buf())
}

/// Fails unless `path` is an ELF executable of `arch` without an
/// interpreter (no dynamic loader in the image means the binary must be
/// static).
pub fn check_static(path: &Path, arch: Arch) -> Result<()> {
    let data = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let what = path.display();
    if data.len() < 64 || &data[..4] != b"\x7fELF" {
        bail!("{what} is not an ELF executable");
    }
    if data[4] != 2 || data[5] != 1 {
        bail!("{what} is not a little-endian 64-bit ELF");
    }
    let machine = read_u16(&data, 18).unwrap_or_default();
    if machine != arch.spec().elf_machine {
        let is = Arch::of_elf_machine(machine)
            .map_or_else(|| format!("ELF machine {machine}"), |a| a.to_string());
        bail!("{what} is an {is} executable, not an {arch} one: build it for {arch}");
    }
    let truncated = || anyhow!("{what}: truncated program headers");
    let phoff = read_u64(&data, 0x20).and_then(|o| usize::try_from(o).ok());
    let phoff = phoff.ok_or_else(truncated)?;
    let phentsize = usize::from(read_u16(&data, 0x36).ok_or_else(truncated)?);
    let phnum = usize::from(read_u16(&data, 0x38).ok_or_else(truncated)?);
    for i in 0..phnum {
        let ty = i
            .checked_mul(phentsize)
            .and_then(|o| phoff.checked_add(o))
            .and_then(|at| read_u32(&data, at))
            .ok_or_else(truncated)?;
        if ty == 3 {
            bail!(
                "{what} is dynamically linked (it has an ELF interpreter) but images have no \
                 dynamic loader: build it with RUSTFLAGS='-C target-feature=+crt-static'"
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dynamic_binaries_are_refused() {
        // /bin/true on Debian is dynamically linked.
        let e = check_static(Path::new("/bin/true"), Arch::Amd64)
            .unwrap_err()
            .to_string();
        assert!(e.contains("dynamically linked"), "{e}");
        let e = check_static(Path::new("/etc/hostname"), Arch::Amd64)
            .or_else(|_| check_static(Path::new("/etc/passwd"), Arch::Amd64))
            .unwrap_err()
            .to_string();
        assert!(e.contains("not an ELF"), "{e}");
    }

    /// The workspace root found without cargo is the one cargo finds: this
    /// repository's for its runtime package, the package itself outside any
    /// workspace.
    #[test]
    fn workspace_root_is_the_nearest_workspace_manifest() {
        let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let rootfs = repo.join("rootfs/Cargo.toml");
        assert_eq!(workspace_root(&rootfs).unwrap(), repo);
        let alone = std::env::temp_dir().join(format!("ws-root-{}", std::process::id()));
        std::fs::create_dir_all(alone.join("src")).unwrap();
        std::fs::write(alone.join("Cargo.toml"), "[package]\nname = \"x\"\n").unwrap();
        let found = workspace_root(&alone.join("Cargo.toml"));
        std::fs::remove_dir_all(&alone).unwrap();
        assert_eq!(found.unwrap(), alone);
    }
}
