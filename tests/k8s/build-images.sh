#!/usr/bin/env bash
# Container images for the test cluster, without a registry or a Docker daemon: made with
# buildah (Debian) from files on this machine, written as OCI archives that
# start-node.sh imports into its containerd (`ctr -n k8s.io images import`).
#
#   tests/k8s/build-images.sh OUTDIR EMBER_BIN
#
#   OUTDIR/ember.oci.tar   localhost/ember:<chart appVersion>: EMBER_BIN + the shared libraries
#                          ldd names + config/ember.yaml + CA certificates (what deploy/Dockerfile's
#                          runtime stage holds, minus the rest of debian:bookworm-slim)
#   OUTDIR/pause.oci.tar   localhost/ember-k8s/pause:3.4: build/pause of the Kubernetes source
#                          (tests/k8s/build-apiserver.sh pause)
#   OUTDIR/burner.oci.tar  localhost/ember-k8s/burner:1: tests/k8s/burner/burner.c, static
#   OUTDIR/python.oci.tar  localhost/ember-k8s/python:1: Debian's /usr/bin/python3.11 (libpython
#                          linked in, no frame pointers), the libraries ldd names, os.py (the
#                          landmark of its prefix) and encodings/ (all it imports at start-up
#                          with -S), running tests/k8s/python/hot.py
#
# buildah's storage is a throwaway directory (vfs driver: no mounts), not the host's
# /var/lib/containers. Root only (buildah as root; no user namespaces needed).
set -euo pipefail

die() { echo "build-images: ERROR: $*" >&2; exit 1; }
log() { echo "build-images: $*" >&2; }
[ $# -eq 2 ] || die "usage: $0 OUTDIR EMBER_BIN"
OUT=$1 EMBER_BIN=$2
SELF_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$SELF_DIR/../.." && pwd)
CACHE=${EMBER_K8S_CACHE:-/var/cache/ember-k8s}
[ "$(id -u)" -eq 0 ] || die "needs root (buildah)"
command -v buildah >/dev/null || die "buildah not found (apt-get install buildah)"
[ -x "$EMBER_BIN" ] || die "$EMBER_BIN not found: cargo build --release -p ember"
[ -x "$CACHE/pause" ] || die "$CACHE/pause not found: tests/k8s/build-apiserver.sh pause"
VERSION=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' "$ROOT/helm/ember/Chart.yaml")
[ -n "$VERSION" ] || die "no appVersion in helm/ember/Chart.yaml"
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)

WORK=$(mktemp -d /tmp/ember-images.XXXXXX)
B=(buildah --root "$WORK/storage" --runroot "$WORK/run" --storage-driver vfs)
cleanup() { "${B[@]}" rm --all >/dev/null 2>&1; rm -rf "$WORK"; }
trap cleanup EXIT

# image NAME REF FILES_DIR ENTRYPOINT_JSON [CMD_JSON]: a scratch image holding FILES_DIR's tree.
image() {
    local name=$1 ref=$2 files=$3 entry=$4 cmd=${5:-} c
    c=$("${B[@]}" from --quiet scratch)
    "${B[@]}" copy --quiet "$c" "$files/" / >/dev/null
    "${B[@]}" config --entrypoint "$entry" --cmd "$cmd" --workingdir / \
        --label org.opencontainers.image.source=ember-tests-k8s "$c"
    "${B[@]}" commit --quiet --format oci "$c" "$ref" >/dev/null
    rm -f "$OUT/$name.oci.tar"
    "${B[@]}" push --quiet "$ref" "oci-archive:$OUT/$name.oci.tar:$ref"
    log "$ref -> $OUT/$name.oci.tar ($(du -h "$OUT/$name.oci.tar" | cut -f1))"
}

# libs BIN ROOT: exactly the libraries the dynamic loader resolves for BIN, under ROOT.
libs() {
    ldd "$1" | awk '/=> \// { print $3 } /^[ \t]*\// { print $1 }' | while read -r lib; do
        install -D -m 0755 "$(readlink -f "$lib")" "$2$lib"
    done
    [ -n "$(find "$2" -name 'ld-linux*')" ] || die "no dynamic loader found by ldd $1"
}

# ember: the binary and its libraries.
E=$WORK/ember
install -D -m 0755 "$EMBER_BIN" "$E/usr/local/bin/ember"
libs "$EMBER_BIN" "$E"
install -D -m 0644 "$ROOT/config/ember.yaml" "$E/etc/ember/ember.yaml"
install -D -m 0644 /etc/ssl/certs/ca-certificates.crt "$E/etc/ssl/certs/ca-certificates.crt"
# What the chart's seccomp installer runs in the agent's image (debian:bookworm-slim has them).
for tool in sh cp mv mkdir; do
    install -D -m 0755 "$(readlink -f "/bin/$tool")" "$E/bin/$tool"
    libs "/bin/$tool" "$E"
done
mkdir -p "$E/tmp" "$E/var/lib/ember"
chmod 1777 "$E/tmp"
image ember "localhost/ember:$VERSION" "$E" '["/usr/local/bin/ember"]' \
    '["run", "--config", "/etc/ember/ember.yaml"]'

P=$WORK/pause
install -D -m 0755 "$CACHE/pause" "$P/pause"
image pause localhost/ember-k8s/pause:3.4 "$P" '["/pause"]'

W=$WORK/burner
mkdir -p "$W"
gcc -O1 -g -fno-omit-frame-pointer -static -o "$W/burner" "$SELF_DIR/burner/burner.c" || die "gcc burner.c failed"
image burner localhost/ember-k8s/burner:1 "$W" '["/burner"]'

PY=/usr/bin/python3.11
[ -x "$PY" ] || die "$PY not found (apt-get install python3.11)"
Y=$WORK/python
install -D -m 0755 "$PY" "$Y/usr/bin/python3.11"
libs "$PY" "$Y"
install -D -m 0644 /usr/lib/python3.11/os.py "$Y/usr/lib/python3.11/os.py"
cp -a /usr/lib/python3.11/encodings "$Y/usr/lib/python3.11/"
find "$Y/usr/lib/python3.11" -name __pycache__ -prune -exec rm -rf {} +
mkdir -p "$Y/usr/lib/python3.11/lib-dynload" "$Y/tmp"
chmod 1777 "$Y/tmp"
install -D -m 0644 "$SELF_DIR/python/hot.py" "$Y/app/hot.py"
image python localhost/ember-k8s/python:1 "$Y" '["/usr/bin/python3.11", "-S", "-u", "/app/hot.py"]'
