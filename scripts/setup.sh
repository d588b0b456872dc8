#!/usr/bin/env bash
# Installs every Debian package the project needs to build images and run its
# tests. Idempotent: when everything is present it changes nothing.
set -euo pipefail

packages=(
  # kernel build (linux-source-6.1 puts the tarball in /usr/src)
  linux-source-6.1 bc flex bison libelf-dev libssl-dev gcc-12-plugin-dev make gcc
  xz-utils zstd tar cpio
  # boot: firmware, boot loader, emulator
  ovmf systemd-boot-efi qemu-system-x86
  # independent checkers used by the tests and the benchmark
  fdisk dosfstools squashfs-tools openssl file time
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  echo "setup: all ${#packages[@]} packages present"
fi

command -v cargo >/dev/null || {
  echo "setup: cargo not found: install the Rust toolchain (rustup) first" >&2
  exit 1
}
