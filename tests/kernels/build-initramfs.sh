#!/bin/bash
# Builds the kernel matrix guest's initramfs: busybox, the ember binary, the fixture programs,
# every shared library they load (and the dynamic loader) at the paths the loader looks for
# them, and tests/kernels/guest-init.sh as /init. Everything runs from the initramfs itself
# (no root filesystem, no modules), so one image boots on every kernel of the matrix.
#
#   tests/kernels/build-initramfs.sh OUT EMBER_BIN [FIXTURE...]
#
# OUT is an uncompressed cpio (newc) archive: under TCG the kernel copies it faster than it
# would inflate a gzip one. EMBER_INITRD_GZIP=1 compresses it anyway. EMBER_BUSYBOX names a
# statically linked busybox (default /bin/busybox, from Debian's busybox-static).
set -euo pipefail

out=${1:?usage: build-initramfs.sh OUT EMBER_BIN [FIXTURE...]}
ember=${2:?usage: build-initramfs.sh OUT EMBER_BIN [FIXTURE...]}
shift 2
busybox=${EMBER_BUSYBOX:-/bin/busybox}
here=$(cd "$(dirname "$0")" && pwd)

for tool in cpio ldd; do
	command -v "$tool" >/dev/null || { echo "build-initramfs: $tool not found" >&2; exit 1; }
done
[ -x "$busybox" ] || { echo "build-initramfs: no busybox at $busybox (apt-get install busybox-static)" >&2; exit 1; }
# A dynamically linked busybox would need its libraries before /init could even start.
if ldd "$busybox" >/dev/null 2>&1; then
	echo "build-initramfs: $busybox is dynamically linked; install busybox-static" >&2
	exit 1
fi

stage=$(mktemp -d "${TMPDIR:-/tmp}/ember-initramfs.XXXXXX")
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage"/{bin,sbin,usr/bin,usr/sbin,dev,proc,sys,tmp,run,etc,fixtures}

cp "$busybox" "$stage/bin/busybox"
# Every applet as a link, so the init script and ember's own child processes find them by name.
for applet in $("$busybox" --list); do
	[ -e "$stage/bin/$applet" ] || ln -s busybox "$stage/bin/$applet"
done
# EMBER_GUEST_INIT: another /init, to look into one kernel by hand with the same image.
cp "${EMBER_GUEST_INIT:-$here/guest-init.sh}" "$stage/init"
chmod 755 "$stage/init"
# ember's DWARF (~90 MB of a release build's line tables) is not needed to run it, and the guest
# would spend seconds of emulated time unpacking it on every boot; its code and symbols stay.
# EMBER_INITRD_KEEP_DEBUG=1 keeps the binary as built.
if [ "${EMBER_INITRD_KEEP_DEBUG:-0}" != 1 ] && command -v objcopy >/dev/null; then
	objcopy --strip-debug "$ember" "$stage/usr/bin/ember"
else
	cp "$ember" "$stage/usr/bin/ember"
fi
for f in "$@"; do
	cp "$f" "$stage/fixtures/"
done
# The kernel gives init /dev/console only if the archive holds the node; mknod needs root, and
# without it the init script takes the console from devtmpfs instead.
[ "$(id -u)" = 0 ] && mknod "$stage/dev/console" c 5 1

# ldd's "name => /path (addr)" and "/path/to/ld.so (addr)" lines; the vDSO has no file.
# Copied to the same absolute path, resolving symlinks (usrmerge's /lib -> usr/lib and the
# .so.N -> .so.N.M links), which is where the loader looks without an ld.so.cache.
for bin in "$ember" "$@"; do
	ldd "$bin" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' || true
done | sort -u | while read -r lib; do
	mkdir -p "$stage$(dirname "$lib")"
	cp -L "$lib" "$stage$lib"
done
[ -e "$stage/lib64/ld-linux-x86-64.so.2" ] || echo "build-initramfs: warning: no dynamic loader copied" >&2

# Owned by root in the guest whoever builds it; sorted for a stable archive.
(cd "$stage" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc --owner=0:0 --quiet) >"$out.tmp"
if [ "${EMBER_INITRD_GZIP:-0}" = 1 ]; then
	gzip -1 <"$out.tmp" >"$out"
	rm -f "$out.tmp"
else
	mv "$out.tmp" "$out"
fi
echo "build-initramfs: $out ($(du -h "$out" | cut -f1)): $(basename "$ember"), $# fixtures, $(find "$stage" -name '*.so*' | wc -l) libraries"
