#!/usr/bin/env bash
# Build a real kube-apiserver (Kubernetes 1.20.2) from Debian's source package, offline;
# with `node` (or `all`) also what a one-node cluster needs, from the same tree and Go cache.
#
#   tests/k8s/build-apiserver.sh            kube-apiserver only
#   tests/k8s/build-apiserver.sh node       also kubelet, kube-controller-manager,
#                                           kube-scheduler, kube-proxy, kubectl, pause
#   tests/k8s/build-apiserver.sh NAME...    just those (any of the above)
#
# Results: ${EMBER_K8S_CACHE:-/var/cache/ember-k8s}/<name> (pause: the static C binary of
# build/pause/linux/pause.c, as the Kubernetes tree builds it for its sandbox image).
# Idempotent: a binary that exists and runs is not rebuilt.
# Needs root only for the apt steps (installing packages, adding a deb-src entry).
#
# Why this way: bookworm packages no kube-apiserver binary, but its source package
# `kubernetes` vendors every dependency, so `go build` works without a module proxy.
# Its vendored github.com/modern-go/reflect2 1.0.1 crashes under go >= 1.18, so it is
# replaced with Debian's golang-github-modern-go-reflect2-dev (1.0.2).
set -euo pipefail

CACHE=${EMBER_K8S_CACHE:-/var/cache/ember-k8s}
K8S_VERSION=v1.20.2
GO_BINS=(kube-apiserver kubelet kube-controller-manager kube-scheduler kube-proxy kubectl)

die() { echo "build-apiserver: ERROR: $*" >&2; exit 1; }
log() { echo "build-apiserver: $*" >&2; }

WANT=()
[ $# -gt 0 ] || set -- kube-apiserver
for a in "$@"; do
    case "$a" in
        node | all) WANT+=("${GO_BINS[@]}" pause) ;;
        kube-apiserver | kubelet | kube-controller-manager | kube-scheduler | kube-proxy | kubectl | pause) WANT+=("$a") ;;
        *) die "unknown component '$a' (kube-apiserver kubelet kube-controller-manager kube-scheduler kube-proxy kubectl pause node)" ;;
    esac
done
runs() { # NAME FILE: pause answers -v, kubectl `version --client`, the others --version
    case "$1" in
        pause) timeout 10 "$2" -v ;;
        kubectl) timeout 60 "$2" version --client ;;
        *) timeout 60 "$2" --version ;;
    esac >/dev/null 2>&1
}
TODO=()
for b in "${WANT[@]}"; do
    [[ " ${TODO[*]} " == *" $b "* ]] && continue
    if [ -x "$CACHE/$b" ] && runs "$b" "$CACHE/$b"; then log "already built: $CACHE/$b"; else TODO+=("$b"); fi
done
[ ${#TODO[@]} -gt 0 ] || exit 0

start=$(date +%s)
mkdir -p "$CACHE" || die "cannot create cache dir $CACHE"
CACHE=$(cd "$CACHE" && pwd)

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else
        command -v sudo >/dev/null || die "need root for: $*"
        sudo "$@"
    fi
}
APT=(apt-get -o DPkg::Lock::Timeout=300)

# 1. packages -------------------------------------------------------------------------
PKGS=(etcd-server golang-go golang-github-modern-go-reflect2-dev dpkg-dev openssl curl ca-certificates)
[[ " ${TODO[*]} " == *" pause "* ]] && PKGS+=(gcc libc6-dev)   # pause is static C
missing=()
for p in "${PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    log "installing: ${missing[*]}"
    as_root "${APT[@]}" update >/dev/null || die "apt-get update failed"
    as_root env DEBIAN_FRONTEND=noninteractive "${APT[@]}" install -y --no-install-recommends "${missing[@]}" \
        || die "apt-get install ${missing[*]} failed"
fi
REFLECT2_SRC=/usr/share/gocode/src/github.com/modern-go/reflect2
[ -f "$REFLECT2_SRC/reflect2.go" ] || die "$REFLECT2_SRC missing (golang-github-modern-go-reflect2-dev)"

# 2. source ---------------------------------------------------------------------------
SRCROOT="$CACHE/src"
find_srcdir() { [ -d "$SRCROOT" ] || return 0; find "$SRCROOT" -maxdepth 1 -mindepth 1 -type d -name 'kubernetes-*' | sort | tail -n1; }
SRCDIR=$(find_srcdir)
if [ -z "$SRCDIR" ] || [ ! -f "$SRCDIR/.ember-unpacked" ]; then
    if ! apt-cache showsrc kubernetes 2>/dev/null | grep -q '^Package: kubernetes'; then
        codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
        [ -n "$codename" ] || die "no VERSION_CODENAME in /etc/os-release: cannot tell which suite's deb-src to add"
        # The deb-src entry mirrors one of this machine's own 'deb' entries for $codename
        # (same archive, components and signing key); nothing is made up: with no such
        # entry, say so and stop.
        entry=$(python3 - "$codename" /etc/apt/sources.list.d/*.sources /etc/apt/sources.list /etc/apt/sources.list.d/*.list <<'PY' 2>/dev/null || true
import sys, glob, os, re
codename, paths = sys.argv[1], [p for p in sys.argv[2:] if os.path.isfile(p)]
def emit(uri, comps, signed):
    print("Types: deb-src"); print("URIs: " + uri); print("Suites: " + codename)
    print("Components: " + " ".join(comps))
    if signed: print("Signed-By: " + signed)
    sys.exit(0)
for p in paths:
    if not p.endswith(".sources"):
        continue
    for stanza in re.split(r"\n\s*\n", open(p).read()):
        f = {}
        for line in stanza.splitlines():
            if line.startswith("#") or ":" not in line or line[:1].isspace():
                continue
            k, v = line.split(":", 1)
            f[k.strip().lower()] = v.strip()
        if f.get("enabled", "yes").lower() == "no" or "deb" not in f.get("types", "").split():
            continue
        if codename in f.get("suites", "").split() and f.get("uris") and f.get("components"):
            emit(f["uris"].split()[0], f["components"].split(), f.get("signed-by", ""))
for p in paths:
    if p.endswith(".sources"):
        continue
    for line in open(p):
        m = re.match(r"^\s*deb\s+(\[([^\]]*)\]\s+)?(\S+)\s+(\S+)\s+(.+)$", line)
        if m and m.group(4) == codename:
            opts = dict(o.split("=", 1) for o in (m.group(2) or "").split() if "=" in o)
            emit(m.group(3), m.group(5).split("#")[0].split(), opts.get("signed-by", ""))
sys.exit(1)
PY
)
        [ -n "$entry" ] || die "no 'deb' entry for suite $codename in /etc/apt/sources.list or /etc/apt/sources.list.d/: add a deb-src line for the archive that ships kubernetes, then run again"
        log "adding deb-src for $codename, from this machine's own deb entry: $(echo "$entry" | sed -n 's/^URIs: //p')"
        printf '%s\n' "$entry" | as_root tee /etc/apt/sources.list.d/ember-deb-src.sources >/dev/null
        as_root "${APT[@]}" update >/dev/null || die "apt-get update (deb-src) failed"
        apt-cache showsrc kubernetes 2>/dev/null | grep -q '^Package: kubernetes' \
            || die "no source package 'kubernetes' in this machine's archive for $codename"
    fi
    rm -rf "$SRCROOT"; mkdir -p "$SRCROOT"
    log "fetching source: apt-get source kubernetes"
    (cd "$SRCROOT" && "${APT[@]}" source kubernetes >"$SRCROOT/apt-source.log" 2>&1) \
        || { tail -20 "$SRCROOT/apt-source.log" >&2; die "apt-get source kubernetes failed"; }
    SRCDIR=$(find_srcdir)
    [ -n "$SRCDIR" ] && [ -f "$SRCDIR/cmd/kube-apiserver/apiserver.go" ] || die "unpacked source not found under $SRCROOT"
    rm -f "$SRCROOT"/*.orig.tar.* "$SRCROOT"/*.debian.tar.* # keep the cache small
    touch "$SRCDIR/.ember-unpacked"
fi

# 3. swap reflect2 ----------------------------------------------------------------------
VR="$SRCDIR/vendor/github.com/modern-go/reflect2"
if [ ! -f "$VR/.ember-debian-reflect2" ]; then
    log "replacing vendored reflect2 with $REFLECT2_SRC"
    rm -rf "$VR" && mkdir -p "$VR"
    cp -a "$REFLECT2_SRC"/. "$VR"/ || die "copying reflect2 failed"
    rm -f "$VR/go.mod" "$VR/go.sum"   # vendored packages carry no go.mod
    touch "$VR/.ember-debian-reflect2"
fi

# 4. build ------------------------------------------------------------------------------
command -v go >/dev/null || die "go not found"
log "building ${TODO[*]} with $(go version) (kube-apiserver alone: about 8 min on 2 cores the first time)"
pkg_ver=$(dpkg-parsechangelog -l "$SRCDIR/debian/changelog" -S Version 2>/dev/null || echo unknown)
# Kubernetes <= 1.22 builds in GOPATH mode (hack/lib/init.sh sets GO111MODULE=off): module
# mode with go 1.19 refuses its go.mod/vendor pair ("updates to go.mod needed"). So lay out
# GOPATH/src/k8s.io/kubernetes -> source, and vendored packages get the .../vendor/ prefix.
GOPATH_DIR="$CACHE/gopath"
mkdir -p "$CACHE/gocache" "$GOPATH_DIR/src/k8s.io"
ln -sfn "$SRCDIR" "$GOPATH_DIR/src/k8s.io/kubernetes"
LDX=""
for v in k8s.io/kubernetes/vendor/k8s.io/component-base/version k8s.io/kubernetes/vendor/k8s.io/client-go/pkg/version; do
    LDX+=" -X $v.gitVersion=$K8S_VERSION -X $v.gitMajor=1 -X $v.gitMinor=20"
    LDX+=" -X $v.gitTreeState=archive -X $v.gitCommit=debian-$pkg_ver"
    LDX+=" -X $v.buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
done
export GO111MODULE=off GOFLAGS='' GOPROXY=off GOCACHE="$CACHE/gocache" GOPATH="$GOPATH_DIR" CGO_ENABLED=0
cd "$GOPATH_DIR/src/k8s.io/kubernetes"

# pkg/generated/openapi/zz_generated.openapi.go is not in the tarball (git-ignored upstream;
# `make` generates it). Same inputs as Makefile.generated_files' gen_openapi for KUBE.
OPENAPI_OUT=pkg/generated/openapi/zz_generated.openapi.go
if [ ! -s "$OPENAPI_OUT" ]; then
    log "generating $OPENAPI_OUT with vendored openapi-gen"
    go build -o "$CACHE/openapi-gen" ./vendor/k8s.io/kube-openapi/cmd/openapi-gen || die "building openapi-gen failed"
    inputs=$(find -H . \( -path './_*' -o -path './.*' -o -path ./vendor -o -path ./debian \) -prune \
                  -o -type f -name '*.go' -print \
             | sed 's|^\./staging/src|vendor|; s|^\./||' \
             | xargs grep -l '^// *+k8s:' | xargs grep -l '+k8s:openapi-gen=' \
             | grep -v -e '^vendor/k8s.io/code-generator/' -e '^vendor/k8s.io/sample-apiserver/' \
             | xargs -n1 dirname | LC_ALL=C sort -u | sed 's|^|k8s.io/kubernetes/|' | paste -sd,)
    [ -n "$inputs" ] || die "no +k8s:openapi-gen packages found"
    "$CACHE/openapi-gen" --logtostderr -i "$inputs" -p k8s.io/kubernetes/pkg/generated/openapi \
        -O zz_generated.openapi -h vendor/k8s.io/code-generator/hack/boilerplate.go.txt \
        -r "$CACHE/openapi-violations.report" -o "$GOPATH_DIR/src" >"$CACHE/openapi-gen.log" 2>&1 \
        || { rm -f "$OPENAPI_OUT"; tail -20 "$CACHE/openapi-gen.log" >&2; die "openapi-gen failed"; }
    [ -s "$OPENAPI_OUT" ] || die "openapi-gen wrote no $OPENAPI_OUT"
fi

for b in "${TODO[@]}"; do
    t0=$(date +%s)
    OUT="$CACHE/$b"
    if [ "$b" = pause ]; then
        # As build/pause/Makefile: TAG 3.4, REV from its CHANGELOG is not needed here.
        gcc -Os -Wall -Werror -static -DVERSION=v3.4-ember -o "$OUT.tmp" build/pause/linux/pause.c \
            || die "gcc build/pause/linux/pause.c failed"
    else
        # All static (CGO_ENABLED=0) and with the same tags, so every binary reuses the
        # packages the others compiled. Upstream builds the kubelet with cgo; nothing the
        # kubelet does here needs it (cgroupfs driver, remote CRI runtime).
        go build -trimpath -tags selinux,notest -ldflags="-s -w -buildid=$LDX" -o "$OUT.tmp" "./cmd/$b" \
            || die "go build ./cmd/$b failed (source: $SRCDIR)"
    fi
    runs "$b" "$OUT.tmp" || die "built $b does not run"
    mv -f "$OUT.tmp" "$OUT"
    log "built $OUT in $(($(date +%s) - t0)) s, $(du -h "$OUT" | cut -f1)"
done

end=$(date +%s)
echo "build-apiserver: total build time $((end - start)) s"
