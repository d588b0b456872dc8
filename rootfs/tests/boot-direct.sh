#!/usr/bin/env bash
# End-to-end test of machined: boot a kernel directly (no boot loader) with an
# initramfs holding machined as /init and the squashfs root, and a GPT disk
# with the contract's labels and a real META, then:
#
#   ready     boot to the ready line, press the ACPI power button, expect a
#             clean power-off
#   break     machined.break=ready: expect `machined: fatal:` and a reboot
#             (QEMU exits because of -no-reboot)
#   cad       boot to ready, send ctrl-alt-delete (needs VT + atkbd in the
#             kernel): expect `machined: rebooting` and QEMU to exit
#   panic     machined.break=panic: expect `machined: fatal: panic:` and, with
#             machined.on_failure=poweroff, a power-off
#
# Usage: rootfs/tests/boot-direct.sh [scenario...]   (default: ready break cad panic)
# Environment:
#   KERNEL        bzImage (default: the newest ~/.cache/imager/kernel/*/bzImage)
#   WORK          work directory (default: a fresh temporary directory, removed
#                 on success)
#   VERSION       VERSION_ID written to os-release (default 0.0.0-test)
#   SLOT          slot on the command line and in META (default A)
#   BOOT_TIMEOUT  seconds to wait for ready (default 120: TCG is slow)
#   SQUASHFS_COMP mksquashfs compressor (default zstd, or xz/gzip when the
#                 kernel's config next to the bzImage lacks SQUASHFS_ZSTD)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
target=x86_64-unknown-linux-gnu
version=${VERSION:-0.0.0-test}
slot=${SLOT:-A}
boot_timeout=${BOOT_TIMEOUT:-120}
scenarios=("$@")
[ ${#scenarios[@]} -gt 0 ] || scenarios=(ready break cad panic)

say() { printf 'boot-direct: %s\n' "$*" >&2; }
die() { say "FAIL: $*"; exit 1; }

for tool in qemu-system-x86_64 mksquashfs cpio zstd sfdisk python3 cargo; do
    command -v "$tool" >/dev/null || die "$tool is not installed"
done

kernel=${KERNEL:-$(ls -t "$HOME"/.cache/imager/kernel/*/bzImage 2>/dev/null | head -n1 || true)}
[ -n "$kernel" ] && [ -f "$kernel" ] || die "no kernel: set KERNEL or build one into ~/.cache/imager/kernel/<key>/bzImage"
say "kernel $kernel"

if [ -n "${WORK:-}" ]; then
    work=$WORK
    mkdir -p "$work"
    keep=1
else
    work=$(mktemp -d /tmp/boot-direct.XXXXXX)
    keep=0
fi
qemu_pid=
cleanup() {
    local rc=$?
    if [ -n "$qemu_pid" ] && kill -0 "$qemu_pid" 2>/dev/null; then
        kill "$qemu_pid" 2>/dev/null || true
        wait "$qemu_pid" 2>/dev/null || true
    fi
    if [ $rc -eq 0 ] && [ $keep -eq 0 ]; then
        rm -rf "$work"
    else
        say "work directory kept: $work"
    fi
}
trap cleanup EXIT

# --- machined, static ------------------------------------------------------
say "building machined (static)"
(cd "$repo" && RUSTFLAGS="-C target-feature=+crt-static" \
    cargo build -q -p machined --release --target "$target")
machined=$repo/target/$target/release/machined
info=$(file -b "$machined")
case $info in
    *"statically linked"* | *"static-pie linked"*) ;;
    *) die "machined is not statically linked: $info" ;;
esac
if readelf -lW "$machined" | grep -q 'INTERP'; then
    die "machined has a program interpreter"
fi
say "machined: $info"
(cd "$repo" && cargo build -q -p machined --example testdisk)
testdisk=$repo/target/debug/examples/testdisk

# --- root filesystem: the manifest rootfs/skeleton.txt, as the builder does --
comp=${SQUASHFS_COMP:-}
if [ -z "$comp" ]; then
    config=$(dirname "$kernel")/config
    [ -f "$config" ] || config=$(dirname "$kernel")/.config
    comp=zstd # what kernel-config/base.config enables
    if [ -f "$config" ] && ! grep -q '^CONFIG_SQUASHFS_ZSTD=y' "$config"; then
        if grep -q '^CONFIG_SQUASHFS_XZ=y' "$config"; then comp=xz
        elif grep -q '^CONFIG_SQUASHFS_ZLIB=y' "$config"; then comp=gzip
        fi
    fi
fi
root=$work/root
rm -rf "$root" && mkdir -p "$root"
closure=$work/host-closure.txt
: >"$closure"
# A host program and its shared libraries, resolved with ldd (the builder has
# its own ELF reader, imager/src/closure.rs): content under the needed name in
# the canonical directory, the interpreter at its exact path, no symlinks.
add_host() { # add_host <mode> <path>
    install -D -m "$1" "/$2" "$root/$2"
    ldd "/$2" | while read -r name arrow lib _; do
        case $name in linux-vdso.so.*) continue ;; esac
        if [ "$arrow" = "=>" ]; then
            dest=$(readlink -f "$(dirname "$lib")")/$name
        else
            dest=$name lib=$name # the interpreter: "/lib64/ld-linux-x86-64.so.2 (0x…)"
        fi
        case $dest in /*) ;; *) continue ;; esac
        [ -e "$root$dest" ] && continue
        install -D -m 0755 "$(readlink -f "$lib")" "$root$dest"
        printf 'host 0755 %s\n' "${dest#/}" >>"$closure"
    done
}
while read -r kind mode path; do
    case $kind in
        '' | '#'*) continue ;;
        dir) mkdir -p "$root/$path" && chmod "$mode" "$root/$path" ;;
        file) install -m "$mode" "$here/../skeleton/$path" "$root/$path" ;;
        builder)
            case /$path in
                /usr/bin/machined) install -m "$mode" "$machined" "$root/$path" ;;
                /usr/lib/os-release)
                    printf 'NAME="Imager test"\nID=imager\nVERSION_ID=%s\n' "$version" >"$root/$path"
                    chmod "$mode" "$root/$path" ;;
                /usr/lib/machined/host-closure.txt) ;; # written after the loop
                *) die "skeleton.txt names a builder file this script does not know: $path" ;;
            esac ;;
        host) add_host "$mode" "$path" ;;
        *) die "skeleton.txt: unknown kind $kind" ;;
    esac
done <"$here/../skeleton.txt"
LC_ALL=C sort -u "$closure" | install -D -m 0644 /dev/stdin "$root/usr/lib/machined/host-closure.txt"
mksquashfs "$root" "$work/rootfs.sqsh" -noappend -all-root -comp "$comp" -quiet -no-progress >/dev/null
say "rootfs.sqsh: $(stat -c %s "$work/rootfs.sqsh") bytes ($comp)"

# --- initramfs: /init, /rootfs.sqsh, /dev/console ----------------------------
initrd=$work/initrd
rm -rf "$initrd" && mkdir -p "$initrd"/{dev,proc,sys,run,newroot}
install -m 0755 "$machined" "$initrd/init"
cp "$work/rootfs.sqsh" "$initrd/rootfs.sqsh"
mknod -m 0600 "$initrd/dev/console" c 5 1
(cd "$initrd" && find . -mindepth 1 | LC_ALL=C sort |
    cpio -o -H newc --owner 0:0 --reproducible --quiet) | zstd -q -19 -f -o "$work/initramfs.zst"
say "initramfs.zst: $(stat -c %s "$work/initramfs.zst") bytes"

# --- disk: GPT with the contract's labels, META written into META ------------
disk=$work/disk.raw
rm -f "$disk" && truncate -s 1G "$disk" # sparse; STATE and EPHEMERAL become XFS
"$testdisk" sfdisk | sfdisk -q "$disk" >/dev/null
"$testdisk" meta "$work/meta.bin" "$slot" "$version"
meta_start=$(sfdisk -J "$disk" | python3 -c '
import json, sys
t = json.load(sys.stdin)["partitiontable"]
print([p["start"] for p in t["partitions"] if p.get("name") == "META"][0] * t.get("sectorsize", 512))')
dd if="$work/meta.bin" of="$disk" bs=64K seek="$meta_start" oflag=seek_bytes conv=notrunc status=none
say "disk.raw: GPT $(sfdisk -J "$disk" | python3 -c 'import json,sys; print(" ".join(p["name"] for p in json.load(sys.stdin)["partitiontable"]["partitions"]))'), META at byte $meta_start"

# --- QEMU --------------------------------------------------------------------
monitor() { # send one monitor command
    python3 - "$work/monitor.sock" "$1" <<'EOF'
import socket, sys, time
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.settimeout(2)
def drain():
    try:
        while s.recv(4096):
            pass
    except socket.timeout:
        pass
drain()  # banner and prompt
s.sendall((sys.argv[2] + "\n").encode())
drain()
s.close()
EOF
}

# Waits until the serial log has a line matching $1 or QEMU exits or $2
# seconds pass; polls every 100 ms. Returns 0 (seen), 1 (QEMU exited), 2
# (timeout).
wait_for_line() {
    local pattern=$1 deadline=$((SECONDS + $2))
    while [ $SECONDS -lt $deadline ]; do
        grep -qa -- "$pattern" "$log" && return 0
        kill -0 "$qemu_pid" 2>/dev/null || { grep -qa -- "$pattern" "$log" && return 0; return 1; }
        sleep 0.1
    done
    return 2
}

# Waits up to $1 seconds for QEMU to exit; sets qemu_rc.
wait_for_exit() {
    local deadline=$((SECONDS + $1))
    while kill -0 "$qemu_pid" 2>/dev/null; do
        [ $SECONDS -lt $deadline ] || return 1
        sleep 0.1
    done
    qemu_rc=0
    wait "$qemu_pid" || qemu_rc=$?
    qemu_pid=
}

boot() { # boot <name> <extra cmdline>
    log=$work/serial-$1.log
    rm -f "$work/monitor.sock" "$log"
    qemu-system-x86_64 -accel tcg -m 512 -nographic -no-reboot \
        -kernel "$kernel" -initrd "$work/initramfs.zst" \
        -append "console=ttyS0 machined.slot=$slot panic=-1 $2" \
        -drive "file=$disk,format=raw,if=virtio" \
        -monitor "unix:$work/monitor.sock,server,nowait" \
        </dev/null >"$log" 2>&1 &
    qemu_pid=$!
    boot_start=$(date +%s.%N)
}

wait_for_ready() {
    local rc=0
    wait_for_line '^machined: ready ' "$boot_timeout" || rc=$?
    if grep -qa 'machined: fatal:' "$log"; then
        die "machined failed: $(grep -a 'machined: fatal:' "$log" | head -n1)"
    fi
    case $rc in
        1) die "QEMU exited before ready (log: $log)" ;;
        2) die "no ready line in ${boot_timeout}s (log: $log)" ;;
    esac
    local host_s
    host_s=$(python3 -c "import time; print(round(time.time() - $boot_start, 2))")
    local line
    line=$(grep -a '^machined: ready ' "$log" | tr -d '\r')
    say "$line"
    [ "$(grep -ac '^machined: ready ' "$log")" = 1 ] || die "more than one ready line"
    [[ $line =~ ^machined:\ ready\ version=${version//./\\.}\ slot=${slot}\ uptime=[0-9]+\.[0-9]+\ secureboot=off\ root=unverified$ ]] ||
        die "unexpected ready line: $line"
    local up=${line##*uptime=}
    say "ready after ${up%% *}s of guest uptime, ${host_s}s of host time"
}

scenario_ready() {
    boot ready ""
    wait_for_ready

    # The ACPI power button.
    monitor system_powerdown
    wait_for_line '^machined: powering off' 30 || die "no 'machined: powering off' after system_powerdown (log: $log)"
    wait_for_exit 30 || die "QEMU did not exit after powering off (log: $log)"
    [ "$qemu_rc" = 0 ] || die "QEMU exited with $qemu_rc"
    grep -qa 'reboot: Power down' "$log" || say "note: the kernel did not print 'reboot: Power down'"
    say "ready: PASS (powered off cleanly)"
}

scenario_break() {
    boot break "machined.break=ready machined.on_failure=reboot"
    wait_for_line '^machined: fatal: ' "$boot_timeout" || die "no fatal line with machined.break=ready (log: $log)"
    grep -qa '^machined: ready ' "$log" && die "ready printed despite machined.break=ready"
    say "$(grep -a '^machined: fatal: ' "$log" | tr -d '\r' | head -n1)"
    wait_for_exit 30 || die "QEMU did not exit (reboot with -no-reboot) after the fatal error (log: $log)"
    say "break: PASS (fatal, then reboot)"
}

scenario_cad() {
    boot cad ""
    wait_for_ready
    monitor "sendkey ctrl-alt-delete"
    wait_for_line '^machined: rebooting' 30 || die "no 'machined: rebooting' after ctrl-alt-delete (log: $log)"
    wait_for_exit 30 || die "QEMU did not exit after rebooting (log: $log)"
    say "cad: PASS (ctrl-alt-del, clean reboot)"
}

scenario_panic() {
    boot panic "machined.break=panic machined.on_failure=poweroff"
    wait_for_line '^machined: fatal: panic: ' "$boot_timeout" || die "no 'fatal: panic:' line with machined.break=panic (log: $log)"
    say "$(grep -a '^machined: fatal: panic: ' "$log" | tr -d '\r' | head -n1)"
    wait_for_line '^machined: powering off (on_failure=poweroff)' 10 || die "on_failure=poweroff not applied (log: $log)"
    wait_for_exit 30 || die "QEMU did not exit after the panic (log: $log)"
    grep -qa 'Attempted to kill init' "$log" && die "PID 1 exited (kernel panic) instead of powering off"
    say "panic: PASS (fatal panic, then power-off)"
}

for s in "${scenarios[@]}"; do
    case $s in
        ready) scenario_ready ;;
        break) scenario_break ;;
        cad) scenario_cad ;;
        panic) scenario_panic ;;
        *) die "unknown scenario $s (ready, break, cad, panic)" ;;
    esac
done
say "all passed: ${scenarios[*]}"
