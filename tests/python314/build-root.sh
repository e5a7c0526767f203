#!/bin/bash
# Builds a minimal root directory holding Debian sid's python3.14 and what it needs to run
# (sid's libc6 among them: bookworm's glibc is too old for it), for the Python tests' 3.14 run
# under chroot. The host's apt sources and state are not touched: apt-get gets a sources list,
# state and cache of its own under $1, checks the archive's signature against the host's
# debian-archive-keyring, and only downloads; dpkg-deb unpacks each package into the root.
#
#   tests/python314/build-root.sh OUT_DIR      (root; network to deb.debian.org)
#
# Leaves OUT_DIR/root/usr/bin/python3.14, OUT_DIR/root/.complete (the Makefile's stamp),
# OUT_DIR/version and OUT_DIR/packages. Always starts from an empty OUT_DIR.
set -euo pipefail

out=${1:?usage: build-root.sh OUT_DIR}
mirror=${EMBER_SID_MIRROR:-http://deb.debian.org/debian}
keyring=${EMBER_SID_KEYRING:-/usr/share/keyrings/debian-archive-keyring.gpg}
# Only these and their dependencies: the interpreter and its standard library (zlib, threading).
packages=(python3.14 libpython3.14-stdlib)

rm -rf "$out"
mkdir -p "$out"/apt/{lists/partial,archives/partial,etc/apt.conf.d,etc/preferences.d,etc/sources.list.d} "$out/root"
out=$(cd "$out" && pwd)
touch "$out/apt/status"
echo "deb [signed-by=$keyring] $mirror sid main" >"$out/apt/etc/sources.list"
opts=(
	-o "Dir::Etc=$out/apt/etc"
	-o "Dir::Etc::sourcelist=sources.list"
	-o "Dir::Etc::sourceparts=sources.list.d"
	-o "Dir::Etc::parts=apt.conf.d"
	-o "Dir::Etc::preferencesparts=preferences.d"
	-o "Dir::State=$out/apt"
	-o "Dir::State::lists=$out/apt/lists"
	-o "Dir::State::status=$out/apt/status"
	-o "Dir::Cache=$out/apt"
	-o "Dir::Cache::archives=$out/apt/archives"
	-o "APT::Architecture=amd64"
	-o "APT::Architectures::=amd64"
	-o "APT::Install-Recommends=false"
	-o "APT::Get::AllowUnauthenticated=false"
	-o "Acquire::AllowInsecureRepositories=false"
	-o "Debug::NoLocking=true"
)
apt-get "${opts[@]}" -q update
# With an empty status file apt resolves the whole closure, libc6 included; --download-only
# fetches and checks each .deb against the signed Packages index and installs nothing.
apt-get "${opts[@]}" -q -y --download-only install "${packages[@]}"
for deb in "$out"/apt/archives/*.deb; do
	dpkg-deb -x "$deb" "$out/root"
done
# usrmerge: sid's packages ship /usr/lib* only; the dynamic loader is found through /lib64.
for d in bin lib lib64 sbin; do
	[ -e "$out/root/$d" ] || ln -s "usr/$d" "$out/root/$d"
done
mkdir -p "$out/root/tmp" "$out/root/proc"

chroot "$out/root" /usr/bin/python3.14 -c 'import zlib, threading, sys; print(sys.version)' >"$out/version"
ls "$out"/apt/archives/*.deb | xargs -n1 basename >"$out/packages"
rm -rf "$out/apt/archives"
touch "$out/root/.complete"
