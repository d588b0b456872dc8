#!/usr/bin/env bash
# Installs every Debian package the project needs to build images and run its
# tests. Idempotent: when everything is present it changes nothing.
set -euo pipefail

packages=(
  # kernel build (linux-source-6.12 puts the tarball in /usr/src: the default
  # kernel; linux-source-6.1: profiles/metal-6_1.yaml, configured in CI)
  linux-source-6.12 linux-source-6.1 bc flex bison libelf-dev libssl-dev gcc-12-plugin-dev make gcc
  xz-utils zstd tar cpio
  # boot: firmware (OVMF; SeaBIOS comes with QEMU), boot loaders (systemd-boot
  # for UEFI, GRUB's i386-pc images, modules and grub-mkimage for BIOS), emulator
  ovmf systemd-boot-efi grub-pc-bin grub-common qemu-system-x86
  # qemu-img: reads the VHD output back in the tests
  qemu-utils
  # independent checkers used by the tests and the benchmark
  fdisk dosfstools mtools squashfs-tools openssl file time util-linux coreutils
  # sgdisk -v: both GPT copies of every disk the tests make, checked
  gdisk
  # jq: docs/signing.md's verification, run as written by tests/signing.rs;
  # locales: localedef compiles tests/reproducible.rs's second locale
  jq locales
  # objdump and sbverify: read the UKI's PE sections back in the tests;
  # llvm-readobj and osslsigncode read arm64's (Debian's objdump reads
  # x86-64 PE only)
  binutils sbsigntool llvm osslsigncode
  # veritysetup: the dm-verity hash tree is checked against its own
  cryptsetup-bin
  # shipped in the root filesystem with their libraries (STATE and EPHEMERAL)
  xfsprogs
  # readers of the installer's OCI image, used by the tests (podman: the
  # name `podman load` gives it)
  skopeo umoci podman
  # the distribution registry (v2) the registry client's tests pull from,
  # started by them on 127.0.0.1 (not the system service)
  docker-registry
  # htpasswd (bcrypt): the Basic-auth registry of registry/tests/auth.rs
  apache2-utils
  # a PKCS#11 token (libsofthsm2.so, softhsm2-util) that tests/signers.rs
  # signs builds through
  softhsm2
  # reader of the ISO images, used by the tests (the ISO is written by imager)
  xorriso
  # the build's epoch (git), benchmarks (python3), static linking (libc6-dev)
  git python3 libc6-dev
  # the host's zstd, which imager links (as mksquashfs does: the same bytes)
  libzstd-dev pkg-config
  # pip: virt-firmware (virt-fw-vars) for the Secure Boot tests, below
  python3-pip
  # arm64 images, cross-built (docs/arm64.md): the Debian cross compiler and
  # its GCC plugin headers (the kernel), arm64's static C library (the
  # runtime's link), QEMU's arm64 machines and their UEFI firmware (AAVMF)
  gcc-aarch64-linux-gnu gcc-12-plugin-dev-aarch64-linux-gnu libc6-dev-arm64-cross
  qemu-system-arm qemu-efi-aarch64
)

# The Rust toolchain comes from rustup, not Debian (Debian 12's rustc is too old).
need_rust=1.90
if ! command -v cargo >/dev/null; then
  echo "setup: cargo not found: install Rust $need_rust or newer with rustup (with rustfmt and clippy)" >&2
  exit 1
fi
have=$(cargo --version | awk '{print $2}')
if [ "$(printf '%s\n%s\n' "$need_rust" "$have" | sort -V | head -1)" != "$need_rust" ]; then
  echo "setup: cargo $have is older than $need_rust: run rustup update stable" >&2
  exit 1
fi

# The packages of the list not installed now.
missing_packages() {
  missing=()
  for p in "${packages[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
      missing+=("$p")
    fi
  done
}

sudo=""
install_missing() {
  echo "setup: installing ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
}

missing_packages
if ((${#missing[@]})); then
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || {
      echo "setup: run as root (or install sudo) to install: ${missing[*]}" >&2
      exit 1
    }
    sudo="sudo"
  fi
  $sudo apt-get update -q
  install_missing
  # An install can remove a package of the list that was there before: a
  # machine with a newer qemu-utils (a backport) loses it when Debian 12's
  # qemu-system-x86 comes in, whose versions it does not match, and with it
  # qemu-img. Whatever went is installed again, at Debian 12's version.
  missing_packages
  if ((${#missing[@]})); then
    echo "setup: the install removed ${missing[*]}: installing again"
    install_missing
    missing_packages
    if ((${#missing[@]})); then
      echo "setup: still missing after two installs: ${missing[*]}" >&2
      exit 1
    fi
  fi
else
  echo "setup: all ${#packages[@]} packages present"
fi

# Debian's docker-registry package enables a registry service on :5000 of
# every interface; the tests start their own, on 127.0.0.1 only.
if command -v systemctl >/dev/null && systemctl is-enabled --quiet docker-registry 2>/dev/null; then
  echo "setup: disabling the docker-registry service (the tests start their own on 127.0.0.1)"
  s=""; [ "$(id -u)" -eq 0 ] || s="sudo"
  $s systemctl disable --now docker-registry >/dev/null 2>&1 || true
fi

# What arm64 images are cross-built and booted with beyond the packages
# above (docs/arm64.md). A failure here is a warning: x86-64 images build
# and test without it, and tests/arm64.rs then fails saying what is
# missing.
arm64_warn() { echo "setup: warning: $*; arm64 images will not build (docs/arm64.md)" >&2; }

# The Rust standard library of arm64's target, from the Rust toolchain's own
# installer.
arm64_target=aarch64-unknown-linux-gnu
if [ ! -d "$(rustc --print sysroot 2>/dev/null)/lib/rustlib/$arm64_target" ]; then
  if ! command -v rustup >/dev/null; then
    arm64_warn "the Rust target $arm64_target is missing and there is no rustup to add it"
  else
    echo "setup: adding the Rust target $arm64_target"
    rustup target add "$arm64_target" || arm64_warn "rustup target add $arm64_target failed"
  fi
fi

# Debian's arm64 packages the arm64 images take from Debian: the EFI
# programs (systemd-boot and the UKI stub) and the root filesystem's host
# programs with their libraries (mkfs.xfs), each at the version of the
# host's own package, downloaded with apt's package lists of arm64 fetched
# into a scratch directory (no foreign architecture is added to dpkg) and
# unpacked, never installed, into $IMAGER_ARM64_ROOT (default
# /var/lib/imager/arm64) with /usr merged, readable by all. Its .complete lists them
# (PACKAGE=VERSION): when the host's versions change, or this list, it is
# unpacked again.
arm64_root=${IMAGER_ARM64_ROOT:-/var/lib/imager/arm64}
arm64_root=${arm64_root%/}
arm64_debs=()
for p in systemd-boot-efi xfsprogs libc6 libuuid1 libblkid1 libinih1 liburcu8; do
  arm64_debs+=("$p=$(dpkg-query -W -f='${Version}' "$p:amd64" 2>/dev/null || true)")
done
arm64_unpack() {
  local s="" work tmp deb
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { arm64_warn "run as root (or install sudo) to unpack into $arm64_root"; return; }
    s="sudo"
  fi
  local debs=("${arm64_debs[@]}")
  for deb in "${debs[@]}"; do
    [ -n "${deb#*=}" ] || { arm64_warn "the host has no ${deb%=} to take the version of"; return; }
  done
  work=$(mktemp -d)
  chmod 755 "$work"
  mkdir -p "$work/lists/partial" "$work/cache/archives/partial" "$work/debs"
  # apt downloads as its own user when run as root.
  if [ "$(id -u)" -eq 0 ] && id _apt >/dev/null 2>&1; then
    chown _apt "$work/lists/partial" "$work/cache/archives/partial" "$work/debs"
  fi
  local apt=(apt-get -q -o APT::Architecture=arm64 -o APT::Architectures=arm64
    -o "Dir::State::Lists=$work/lists" -o "Dir::Cache=$work/cache")
  echo "setup: downloading Debian's arm64 ${debs[*]}"
  if ! { "${apt[@]}" update && (cd "$work/debs" && "${apt[@]}" download "${debs[@]}"); } \
      >"$work/apt.log" 2>&1; then
    cat "$work/apt.log" >&2
    rm -rf "$work"
    arm64_warn "downloading the arm64 packages failed (apt's output is above)"
    return
  fi
  $s install -d -m 0755 "$(dirname "$arm64_root")"
  tmp=$($s mktemp -d "$arm64_root.tmp.XXXXXX")
  # The merged /usr of Debian 12's systems (/bin, /sbin and /lib are links
  # into /usr), kept through the unpacking.
  $s install -d -m 0755 "$tmp/usr/bin" "$tmp/usr/sbin" "$tmp/usr/lib"
  for d in bin sbin lib; do $s ln -s "usr/$d" "$tmp/$d"; done
  for deb in "$work"/debs/*.deb; do
    dpkg-deb --fsys-tarfile "$deb" | $s tar -x --keep-directory-symlink -C "$tmp"
  done
  printf '%s\n' "${debs[@]}" | $s tee "$tmp/.complete" >/dev/null
  $s chmod -R a+rX "$tmp"
  # The old tree is moved aside before the new one takes its name; a
  # failure between the two leaves none, and the next run unpacks again.
  [ ! -e "$arm64_root" ] || $s mv "$arm64_root" "$tmp.old"
  $s mv "$tmp" "$arm64_root"
  $s rm -rf "$tmp.old"
  rm -rf "$work"
  echo "setup: unpacked ${debs[*]} (arm64) into $arm64_root"
}
[ "$(cat "$arm64_root/.complete" 2>/dev/null)" = "$(printf '%s\n' "${arm64_debs[@]}")" ] ||
  arm64_unpack

# The fuzzer driver for scripts/fuzz (which scripts/test runs).
if ! command -v cargo-fuzz >/dev/null; then
  echo "setup: installing cargo-fuzz"
  cargo install --locked cargo-fuzz --version 0.13.2
fi

# virt-fw-vars (PyPI: virt-firmware) enrols Secure Boot keys into an OVMF
# variable store for tests/secureboot.rs. pip honours the machine's pip
# configuration (find-links); Debian 12's python is externally managed.
if ! command -v virt-fw-vars >/dev/null; then
  echo "setup: installing virt-firmware (virt-fw-vars)"
  python3 -m pip install --quiet --break-system-packages 'virt-firmware>=24' ||
    { echo "setup: pip install virt-firmware failed (python3-pip missing?)" >&2; exit 1; }
fi
