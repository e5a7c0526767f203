#!/bin/bash
# Fetches the kernels the kernel matrix test boots: Debian's cloud kernel of each suite, by
# package name, from Debian's archive. Only the kernel image (vmlinuz) and its config are kept:
# the guest boots from an initramfs with everything built in, so no modules are needed.
#
#   tests/kernels/fetch-kernels.sh [CACHE_DIR]     (root; network to deb.debian.org)
#
# CACHE_DIR defaults to $EMBER_KERNEL_CACHE, else /var/cache/ember-kernels (outside the tree:
# the images outlive `cargo clean` and are shared by every checkout). Leaves, per suite,
# CACHE_DIR/<suite>/{vmlinuz,config,release,package}; `release` holds the uname -r string.
# A suite already fetched is skipped: remove its directory to fetch it again (sid moves).
#
# Why the cloud flavour: it is what cloud fleets run, and it boots under qemu in seconds (few
# drivers to probe). It has what the agent needs built in: BTF, perf events, BPF, the 8250
# serial console, initramfs. The script checks the config for them and fails loudly if a
# future kernel drops one, rather than letting the guest fail in an obscure way.
#
# The host's apt sources and state are not touched: apt gets a sources list, state and cache
# of its own (one per suite, in a temporary directory), checks the archive's signature against
# the host's debian-archive-keyring, and only downloads the one package; dpkg-deb unpacks it.
set -euo pipefail

cache=${1:-${EMBER_KERNEL_CACHE:-/var/cache/ember-kernels}}
mirror=${EMBER_KERNEL_MIRROR:-http://deb.debian.org/debian}
keyring=${EMBER_KERNEL_KEYRING:-/usr/share/keyrings/debian-archive-keyring.gpg}
# bullseye 5.10, bookworm 6.1, trixie 6.12, sid the newest; backports suites work too
# (e.g. trixie-backports), their kernels being in the same archive.
suites=(${EMBER_KERNEL_SUITES:-bullseye bookworm trixie sid})
meta=${EMBER_KERNEL_META:-linux-image-cloud-amd64}
# Options the guest cannot do without: the agent's BPF programs need BTF and perf events, the
# harness reads the serial console and boots from a cpio initramfs, mounts these filesystems.
required=(CONFIG_DEBUG_INFO_BTF CONFIG_BPF_SYSCALL CONFIG_PERF_EVENTS CONFIG_SERIAL_8250_CONSOLE
	CONFIG_BLK_DEV_INITRD CONFIG_DEVTMPFS CONFIG_TMPFS CONFIG_CGROUPS CONFIG_DEBUG_FS CONFIG_FTRACE
	CONFIG_BPF_EVENTS CONFIG_KPROBES)

for tool in apt-get dpkg-deb; do
	command -v "$tool" >/dev/null || { echo "fetch-kernels: $tool not found (Debian/Ubuntu only)" >&2; exit 1; }
done
[ -r "$keyring" ] || { echo "fetch-kernels: no keyring $keyring (apt-get install debian-archive-keyring)" >&2; exit 1; }

mkdir -p "$cache"
cache=$(cd "$cache" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/ember-kernels.XXXXXX")
trap 'rm -rf "$work"' EXIT

fetch_suite() {
	local suite=$1 dest="$cache/$1" apt="$work/$1/apt"
	if [ -s "$dest/vmlinuz" ] && [ -s "$dest/release" ]; then
		echo "fetch-kernels: $suite: have $(cat "$dest/release")"
		return 0
	fi
	mkdir -p "$apt"/{lists/partial,archives/partial,etc/apt.conf.d,etc/preferences.d,etc/sources.list.d}
	touch "$apt/status"
	echo "deb [signed-by=$keyring] $mirror $suite main" >"$apt/etc/sources.list"
	local opts=(
		-o "Dir::Etc=$apt/etc"
		-o "Dir::Etc::sourcelist=sources.list"
		-o "Dir::Etc::sourceparts=sources.list.d"
		-o "Dir::Etc::parts=apt.conf.d"
		-o "Dir::Etc::preferencesparts=preferences.d"
		-o "Dir::State=$apt"
		-o "Dir::State::lists=$apt/lists"
		-o "Dir::State::status=$apt/status"
		-o "Dir::Cache=$apt"
		-o "Dir::Cache::archives=$apt/archives"
		-o "APT::Architecture=amd64"
		-o "APT::Architectures::=amd64"
		-o "APT::Get::AllowUnauthenticated=false"
		-o "Acquire::AllowInsecureRepositories=false"
		-o "Acquire::Languages=none"
		# apt-get download writes into the current directory, which _apt cannot enter.
		-o "APT::Sandbox::User=root"
		-o "Debug::NoLocking=true"
	)
	apt-get "${opts[@]}" -q update
	# The metapackage only depends on the current ABI's image package (the signed one; its
	# vmlinuz boots under qemu like the unsigned one, the signature being appended data).
	local pkg
	pkg=$(apt-cache "${opts[@]}" depends "$meta" |
		sed -n 's/^ *Depends: \(linux-image-[0-9][^ ]*\).*/\1/p' | head -n1)
	[ -n "$pkg" ] || { echo "fetch-kernels: $suite: $meta names no linux-image-<version> package" >&2; return 1; }
	local version
	version=$(apt-cache "${opts[@]}" show --no-all-versions "$pkg" | sed -n 's/^Version: //p' | head -n1)
	# Newer kernels (sid since 7.x) split the image package: the image in linux-binary-*, the
	# config in linux-base-*, both direct dependencies of the same version; older ones carry
	# both in the image package. Fetch those of the dependencies that exist (never modules).
	local pkgs=("$pkg")
	pkgs+=($(apt-cache "${opts[@]}" depends "$pkg" |
		sed -n 's/^ *Depends: \(linux-\(binary\|base\)-[0-9][^ ]*\).*/\1/p'))
	echo "fetch-kernels: $suite: $meta -> ${pkgs[*]} $version"
	# apt-get download checks each .deb against the signed index, as an install would.
	(cd "$work/$suite" && apt-get "${opts[@]}" -q download "${pkgs[@]}")
	local root="$work/$suite/root" deb
	mkdir -p "$root"
	for deb in "$work/$suite"/*.deb; do
		dpkg-deb -x "$deb" "$root"
	done
	# /boot/vmlinuz-<release> and /boot/config-<release>, or in the split packages
	# /usr/lib/modules/<release>/vmlinuz and .../config.
	local image="" release config f
	for f in "$root"/boot/vmlinuz-* "$root"/usr/lib/modules/*/vmlinuz; do
		[ -f "$f" ] && { image=$f; break; }
	done
	[ -n "$image" ] || { echo "fetch-kernels: $suite: no vmlinuz in ${pkgs[*]}" >&2; return 1; }
	case $image in
	*/boot/vmlinuz-*)
		release=${image##*/vmlinuz-}
		config="$root/boot/config-$release" ;;
	*)
		release=$(basename "$(dirname "$image")")
		config="$root/usr/lib/modules/$release/config" ;;
	esac
	if [ -r "$config" ]; then
		local opt missing=()
		for opt in "${required[@]}"; do
			grep -q "^$opt=y" "$config" || missing+=("$opt")
		done
		if [ ${#missing[@]} -gt 0 ]; then
			echo "fetch-kernels: $suite: $release lacks ${missing[*]}: try EMBER_KERNEL_META=linux-image-amd64" >&2
			return 1
		fi
	fi
	# Into place last, so an interrupted fetch is retried rather than skipped.
	rm -rf "$dest.tmp"
	mkdir -p "$dest.tmp"
	cp "$image" "$dest.tmp/vmlinuz"
	[ -r "$config" ] && cp "$config" "$dest.tmp/config"
	echo "${pkgs[*]} $version" >"$dest.tmp/package"
	echo "$release" >"$dest.tmp/release"
	rm -rf "$dest"
	mv "$dest.tmp" "$dest"
	echo "fetch-kernels: $suite: $release in $dest"
}

for suite in "${suites[@]}"; do
	fetch_suite "$suite"
done
