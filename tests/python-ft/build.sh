#!/bin/bash
# Builds a free-threaded CPython (`--disable-gil`, a static libpython as `./configure` builds
# by default) for the Python tests' free-threaded runs: no archive this machine reaches ships
# one (Debian has no `python3.X-nogil` package). The source is the upstream tarball as Debian
# keeps it (`python3.X_V.orig.tar.xz`), checked against the SHA-256 pinned below: 3.13.15's is
# the one Debian's signed forky Sources index lists; 3.14.7's was recorded when first fetched
# (it is no longer in a signed index: sid has moved on, and the mirror no longer serves the
# sources it lists). Debian's patches are not applied.
#
#   tests/python-ft/build.sh OUT_DIR 3.13|3.14      (network to deb.debian.org)
#
# Leaves OUT_DIR/build/python (run from its build directory: its standard library is the
# source's), OUT_DIR/version and OUT_DIR/.complete (the Makefile's stamp). Always starts from
# an empty OUT_DIR. About 6 minutes on 2 cores; modules whose libraries the host lacks are
# left out (the fixture needs zlib and threading only).
set -euo pipefail

out=${1:?usage: build.sh OUT_DIR 3.13|3.14}
minor=${2:?usage: build.sh OUT_DIR 3.13|3.14}
mirror=${EMBER_DEBIAN_MIRROR:-http://deb.debian.org/debian}
case "$minor" in
3.13) version=3.13.15 sha256=1e66a7945a48390ee4c2a4268a0e4185884059a13c4aab6d148aa208deea4a76 ;;
3.14) version=3.14.7 sha256=3b48dac8fb59f62eaa67ac83c1eb12bda1b7a08406dd286e252c11a66be27f81 ;;
*) echo "build.sh: no source pinned for $minor" >&2; exit 2 ;;
esac

need=()
for p in zlib1g-dev xz-utils build-essential pkg-config curl; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}"
fi

rm -rf "$out"
mkdir -p "$out/src"
out=$(cd "$out" && pwd)
tarball="python${minor}_${version}.orig.tar.xz"
curl -fsS --retry 3 -o "$out/$tarball" "$mirror/pool/main/p/python$minor/$tarball"
echo "$sha256  $out/$tarball" | sha256sum -c --quiet -
tar -xJf "$out/$tarball" -C "$out/src"
rm "$out/$tarball"
src="$out/src/Python-$version"
[ -d "$src" ] || { echo "build.sh: no $src unpacked" >&2; exit 1; }

mkdir -p "$out/build"
cd "$out/build"
"$src/configure" -q --disable-gil --without-ensurepip --disable-test-modules \
	>"$out/configure.log" 2>&1 || { tail -n 30 "$out/configure.log" >&2; exit 1; }
make -s -j"$(nproc)" >"$out/make.log" 2>&1 || { tail -n 40 "$out/make.log" >&2; exit 1; }

"$out/build/python" -c '
import sys, sysconfig, threading, zlib, argparse
assert sysconfig.get_config_var("Py_GIL_DISABLED") == 1, "not a free-threaded build"
assert not sys._is_gil_enabled(), "the GIL is on"
print(sys.version)' >"$out/version"
touch "$out/.complete"
