#!/bin/bash
# Builds CPython 3.11 against musl libc (Debian's musl-tools: musl-gcc), shared libpython as
# Alpine builds it, for the Python tests' musl run: the only way this machine has to run a
# musl interpreter (no Alpine archive is reachable). The source is Debian bookworm's
# python3.11 source package (apt-get source checks it against the signed Sources index).
#
#   tests/python-musl/build.sh OUT_DIR      (root for apt; network to deb.debian.org)
#
# Leaves OUT_DIR/build/python (its rpath finds OUT_DIR/build/libpython3.11.so.1.0),
# OUT_DIR/static/python (the same, fully static), OUT_DIR/version and OUT_DIR/.complete
# (the Makefile's stamp). Always starts from an empty
# OUT_DIR. About 5 minutes on 2 cores; modules whose libraries musl lacks are left out
# (ssl, sqlite...; the fixture needs none of them), as are ensurepip and the test modules.
set -euo pipefail

out=${1:?usage: build.sh OUT_DIR}
rm -rf "$out"
mkdir -p "$out/src" "$out/kheaders"
out=$(cd "$out" && pwd)

need=()
for p in musl-tools linux-libc-dev dpkg-dev; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}"
fi

cd "$out/src"
if ! apt-get source -q --download-only python3.11 >/dev/null 2>&1; then
	# No deb-src entry for this suite yet: add one beside the host's (bookworm) sources.
	codename=$(. /etc/os-release && echo "${VERSION_CODENAME:?}")
	echo "deb-src http://deb.debian.org/debian $codename main" >/etc/apt/sources.list.d/ember-src.list
	apt-get -q update >/dev/null
	apt-get source -q --download-only python3.11 >/dev/null
fi
apt-get source -q --download-only zlib >/dev/null
tar -xzf python3.11_*.orig.tar.gz
tar -xf zlib_*.orig.tar.*
src=$(find "$out/src" -maxdepth 1 -mindepth 1 -type d -name 'Python-3.11*' | head -n1)
[ -n "$src" ] || { echo "build.sh: no Python-3.11 source unpacked" >&2; exit 1; }

# musl-gcc sees musl's headers only; the kernel's (linux-libc-dev) are libc-independent and
# some modules include them, as Alpine's linux-headers provides.
ln -s /usr/include/linux /usr/include/asm-generic "$out/kheaders/"
ln -s /usr/include/x86_64-linux-gnu/asm "$out/kheaders/asm"

# configure compares the compiler's multiarch with the platform triplet it derives from
# the C library, and setup.py adds /usr/include/<multiarch> to every module's include path;
# gcc under musl-gcc still says x86_64-linux-gnu (glibc's headers).
cat >"$out/musl-cc" <<'CC'
#!/bin/sh
case "$1" in -print-multiarch | --print-multiarch) echo x86_64-linux-musl; exit 0 ;; esac
exec musl-gcc "$@"
CC
chmod +x "$out/musl-cc"

# zlib for the fixture's `zlib.compress` (musl-gcc cannot use the host's glibc-built one):
# static and position-independent, linked into CPython's zlib module.
zsrc=$(find "$out/src" -maxdepth 1 -mindepth 1 -type d -name 'zlib-*' | head -n1)
(cd "$zsrc" && CC="$out/musl-cc" CFLAGS="-O2 -fPIC" ./configure --static --prefix="$out/zlib" \
	&& make -s -j"$(nproc)" && make -s install) >"$out/zlib.log" 2>&1 \
	|| { tail -n 30 "$out/zlib.log" >&2; exit 1; }

# Configures and builds the source in the current directory with musl-gcc: LDFLAGS, then
# configure's own options; logs go to $out/configure$1.log and $out/make$1.log.
build() {
	local logs=$1 ldflags=$2
	shift 2
	"$src/configure" -q CC="$out/musl-cc" \
		CFLAGS="-O2 -idirafter $out/kheaders" CPPFLAGS="-I$out/zlib/include" \
		LDFLAGS="$ldflags -L$out/zlib/lib" \
		"$@" --without-ensurepip --disable-test-modules >"$out/configure$logs.log" 2>&1 \
		|| { tail -n 30 "$out/configure$logs.log" >&2; exit 1; }
	make -s -j"$(nproc)" >"$out/make$logs.log" 2>&1 || { tail -n 40 "$out/make$logs.log" >&2; exit 1; }
}

mkdir -p "$out/build"
cd "$out/build"
build "" "-Wl,-rpath,$out/build" --enable-shared

interp=$(readelf -l "$out/build/python" | sed -n 's/.*interpreter: \(.*\)]/\1/p')
case "$interp" in
*ld-musl*) ;;
*) echo "build.sh: $out/build/python is not a musl program ($interp)" >&2; exit 1 ;;
esac
"$out/build/python" -c 'import threading, zlib, argparse, sys; print(sys.version)' >"$out/version"

# The same source linked fully static (no dynamic loader, no libc mapped: musl inside the
# binary, as python-build-standalone's musl builds are); a static musl program cannot
# dlopen, so the modules it needs are built in.
# 3.11 builds its other modules with setup.py, as shared objects: the fixture's (zlib) and a
# few the standard library's pure modules import are listed here instead.
mkdir -p "$out/static/Modules"
cd "$out/static"
cat >Modules/Setup.local <<'SETUP'
*static*
zlib zlibmodule.c -lz
binascii binascii.c
math mathmodule.c
_struct _struct.c
_heapq _heapqmodule.c
_bisect _bisectmodule.c
select selectmodule.c
fcntl fcntlmodule.c
_posixsubprocess _posixsubprocess.c
_random _randommodule.c
SETUP
build -static -static --disable-shared
if readelf -l "$out/static/python" | grep -q 'INTERP'; then
	echo "build.sh: $out/static/python is not static" >&2
	exit 1
fi
"$out/static/python" -c 'import threading, zlib, argparse, sys; print(sys.version)' >"$out/version-static"
touch "$out/.complete"
