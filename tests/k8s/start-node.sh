#!/usr/bin/env bash
# A real one-node Kubernetes 1.20 cluster, everything on this machine's own addresses:
# etcd + kube-apiserver (start-cluster.sh), kube-controller-manager, kube-scheduler,
# containerd + runc + CNI bridge (Debian's packages, our config under DIR), kubelet and
# kube-proxy (iptables). Root only.
# Localhost seccomp profiles go in DIR/kubelet/seccomp (K8S_SECCOMP_DIR in DIR/env): the 1.20
# kubelet's --seccomp-profile-root defaults to /var/lib/kubelet/seccomp whatever --root-dir says.
#
#   tests/k8s/start-node.sh DIR PORT     -> prints DIR/kubeconfig on stdout
#   tests/k8s/stop-node.sh DIR           -> stops it all, leaves nothing running or mounted
#
# Binaries: tests/k8s/build-apiserver.sh node. Images: `make k8s-images` builds them into
# target/k8s-images (EMBER_K8S_IMAGES moves it); every *.oci.tar there is imported.
#
# The node's address is on an interface of its own (emberk8s0, 172.30.254.1/32; a bridge
# with no ports, as this kernel has no dummy driver): not
# on any network, but a local address that pods reach through their gateway, so the
# apiserver (bound there), the kubelet and the "kubernetes" Service work from pods.
# Pods: bridge emberk8s-br0, 172.30.0.0/24 (gateway .1). Services: 10.0.0.0/24.
#
# Host state this changes (stop-node.sh restores or removes each):
#   - sysctls: the kubelet sets vm.overcommit_memory=1, kernel.panic=10,
#     kernel.panic_on_oops=1 (it refuses to run otherwise); the bridge plugin sets
#     net.ipv4.ip_forward=1; kube-proxy net.ipv4.conf.all.route_localnet=1. Saved in DIR/sysctl.saved.
#   - the two interfaces above; iptables KUBE-* chains (kube-proxy --cleanup);
#   - cgroups /ember-k8s/... in every hierarchy (the kubelet's --cgroup-root);
#   - /var/log/pods, /var/log/containers (hard-coded in the kubelet) and
#     /var/lib/kubelet/device-plugins (likewise), /run/containerd/s (containerd's shim
#     sockets): removed when this script created them.
# Everything else lives in DIR: containerd's root/state/sockets, runc's state, the pods'
# network namespaces (netns_mounts_under_state_dir), CNI config and IPAM, kubelet root.
set -euo pipefail

SELF_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
die() { echo "start-node: ERROR: $*" >&2; exit 1; }
log() { echo "start-node: $*" >&2; }

[ $# -eq 2 ] || die "usage: $0 DIR PORT"
[ "$(id -u)" -eq 0 ] || die "needs root (containerd, kubelet, cgroups, iptables)"
DIR=$1 PORT=$2
CACHE=${EMBER_K8S_CACHE:-/var/cache/ember-k8s}
NODE_NAME=${K8S_NODE_NAME:-ember-node}
NODE_IF=emberk8s0
NODE_IP=172.30.254.1
BRIDGE=emberk8s-br0
POD_CIDR=172.30.0.0/24
CGROUP_ROOT=/ember-k8s
SANDBOX_IMAGE=localhost/ember-k8s/pause:3.4

for b in kube-apiserver kubelet kube-controller-manager kube-scheduler kube-proxy; do
    [ -x "$CACHE/$b" ] || die "$CACHE/$b missing: run tests/k8s/build-apiserver.sh node"
done
for t in containerd containerd-shim-runc-v2 runc ctr iptables conntrack ip; do
    command -v "$t" >/dev/null || die "$t not found (apt-get install containerd runc iptables conntrack iproute2)"
done
CNI_BIN=/usr/lib/cni
for p in bridge host-local loopback; do
    [ -x "$CNI_BIN/$p" ] || die "$CNI_BIN/$p missing (apt-get install containernetworking-plugins)"
done
[ "$(stat -fc %T /sys/fs/cgroup)" != cgroup2fs ] \
    || die "cgroup v2 only (unified) host: Kubernetes 1.20's kubelet needs cgroup v1 controllers"
for ipt in iptables ip6tables; do
    for t in filter nat mangle; do
        ! "$ipt" -w -t "$t" -S 2>/dev/null | grep -q '^-N KUBE-' \
            || die "$ipt -t $t has KUBE-* chains: another Kubernetes node on this host? (stop-node.sh removes ours)"
    done
done
ip link show "$NODE_IF" >/dev/null 2>&1 && die "$NODE_IF exists: another node running? (stop-node.sh DIR)"

mkdir -p "$DIR" && DIR=$(cd "$DIR" && pwd)
[ ! -e "$DIR/node.pids" ] || die "$DIR/node.pids exists: run stop-node.sh $DIR first"

fail() {
    echo "start-node: ERROR: $*" >&2
    for f in containerd.log kubelet.log controller-manager.log scheduler.log kube-proxy.log; do
        [ -s "$DIR/$f" ] && { echo "--- last lines of $DIR/$f" >&2; tail -n 15 "$DIR/$f" >&2; }
    done
    "$SELF_DIR/stop-node.sh" "$DIR" >&2 || true
    exit 1
}

# --- host state, recorded so that stop-node.sh restores exactly it ---------------------
SYSCTLS=(vm.overcommit_memory kernel.panic kernel.panic_on_oops net.ipv4.ip_forward net.ipv4.conf.all.route_localnet)
: >"$DIR/sysctl.saved"
for k in "${SYSCTLS[@]}"; do echo "$k=$(sysctl -n "$k")" >>"$DIR/sysctl.saved"; done
: >"$DIR/created"
for d in /var/log/pods /var/log/containers /var/lib/kubelet /run/containerd; do
    [ -e "$d" ] || echo "$d" >>"$DIR/created"
done
: >"$DIR/node.pids"

ip link add "$NODE_IF" type bridge && ip addr add "$NODE_IP/32" dev "$NODE_IF" && ip link set "$NODE_IF" up \
    || fail "cannot create $NODE_IF"
for h in /sys/fs/cgroup/*/; do
    [ -d "$h" ] || continue
    mkdir -p "$h${CGROUP_ROOT#/}" || fail "mkdir $h${CGROUP_ROOT#/}"
done
# A new v1 cpuset starts with no cpus and mems: nothing could join it.
CS=/sys/fs/cgroup/cpuset
if [ -f "$CS/cpuset.cpus" ]; then
    cat "$CS/cpuset.cpus" >"$CS$CGROUP_ROOT/cpuset.cpus"
    cat "$CS/cpuset.mems" >"$CS$CGROUP_ROOT/cpuset.mems"
fi

# --- etcd + apiserver on the node address -------------------------------------------------
K8S_ADDRESS=$NODE_IP "$SELF_DIR/start-cluster.sh" "$DIR" "$PORT" >/dev/null || fail "start-cluster.sh failed"
KCFG=$DIR/kubeconfig
SERVER=https://$NODE_IP:$PORT

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
spawn() { # NAME CMD...: setsid, log to DIR/NAME.log, pid appended to node.pids
    local name=$1; shift
    setsid "$@" </dev/null >"$DIR/$name.log" 2>&1 &
    echo "$! $name" >>"$DIR/node.pids"
}

# --- controller-manager and scheduler (no serving ports) -------------------------------
spawn controller-manager "$CACHE/kube-controller-manager" --kubeconfig "$KCFG" \
    --leader-elect=false --port 0 --secure-port 0 \
    --service-account-private-key-file "$DIR/sa.key" --root-ca-file "$DIR/ca.crt" \
    --use-service-account-credentials=false --controllers '*,-nodeipam,-cloud-node-lifecycle,-route,-service'
spawn scheduler "$CACHE/kube-scheduler" --kubeconfig "$KCFG" --leader-elect=false --port 0 --secure-port 0

# --- containerd -----------------------------------------------------------------------------
CD=$DIR/containerd
mkdir -p "$CD" "$DIR/cni/net.d" "$DIR/cni/ipam" "$DIR/kubelet/seccomp"
cat >"$DIR/cni/net.d/10-ember.conflist" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "ember-k8s",
  "plugins": [
    {
      "type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "ipMasq": false, "hairpinMode": true,
      "ipam": { "type": "host-local", "ranges": [[{ "subnet": "$POD_CIDR" }]],
                "routes": [{ "dst": "0.0.0.0/0" }], "dataDir": "$DIR/cni/ipam" }
    }
  ]
}
EOF
cat >"$CD/config.toml" <<EOF
version = 2
root = "$CD/root"
state = "$CD/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[grpc]
  address = "$CD/containerd.sock"
[ttrpc]
  address = "$CD/containerd.sock.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "$CD/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$SANDBOX_IMAGE"
  netns_mounts_under_state_dir = true
  # Never below containerd's own oom_score_adj: the kubelet asks -998 for sandboxes, which
  # needs CAP_SYS_RESOURCE, and hosts that withhold it (this one's bounding set does)
  # fail every sandbox ("failed to update /proc/self/oom_score_adj: Permission denied").
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$CNI_BIN"
    conf_dir = "$DIR/cni/net.d"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "$(command -v runc)"
        Root = "$CD/runc"
        SystemdCgroup = false
EOF
spawn containerd containerd --config "$CD/config.toml"
for i in $(seq 1 100); do
    ctr --address "$CD/containerd.sock" version >/dev/null 2>&1 && break
    [ "$i" -eq 100 ] && fail "containerd not answering after 20 s"
    sleep 0.2
done

# --- images made by `make k8s-images` (OCI archives) ----------------------------------------
IMAGES=${EMBER_K8S_IMAGES:-$SELF_DIR/../../target/k8s-images}
if [ -d "$IMAGES" ]; then
    for a in "$IMAGES"/*.oci.tar; do
        [ -f "$a" ] || continue
        ctr --address "$CD/containerd.sock" -n k8s.io images import "$a" >>"$DIR/images.log" 2>&1 \
            || fail "ctr images import $a failed (see $DIR/images.log)"
    done
fi
ctr --address "$CD/containerd.sock" -n k8s.io images ls -q | grep -qxF "$SANDBOX_IMAGE" \
    || log "warning: sandbox image $SANDBOX_IMAGE not imported (make k8s-images): pods cannot start"

# --- kubelet --------------------------------------------------------------------------------
KUBELET_PORT=$(free_port)
KUBELET_HEALTHZ=$(free_port)
cat >"$DIR/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_IP
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $KUBELET_HEALTHZ
# The API server calls the kubelet (logs, exec) without client certificates; the kubelet
# listens only on the node's private dummy address.
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
authorization:
  mode: AlwaysAllow
cgroupDriver: cgroupfs
cgroupRoot: $CGROUP_ROOT
cgroupsPerQOS: true
failSwapOn: false
resolvConf: /etc/resolv.conf
staticPodPath: ""
# This machine's disk is shared with builds: do not evict test pods for it.
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
EOF
spawn kubelet "$CACHE/kubelet" --config "$DIR/kubelet.yaml" --kubeconfig "$KCFG" \
    --root-dir "$DIR/kubelet" --cert-dir "$DIR/kubelet/pki" --seccomp-profile-root "$DIR/kubelet/seccomp" \
    --container-runtime remote --container-runtime-endpoint "unix://$CD/containerd.sock" \
    --hostname-override "$NODE_NAME" --node-ip "$NODE_IP" --v 1

# --- kube-proxy (iptables), for the "kubernetes" Service the pods' clients use ---------------
# --conntrack-*=0: leave the host's conntrack sysctls alone.
spawn kube-proxy "$CACHE/kube-proxy" --kubeconfig "$KCFG" --hostname-override "$NODE_NAME" \
    --proxy-mode iptables --cluster-cidr "$POD_CIDR" --bind-address "$NODE_IP" \
    --healthz-bind-address "127.0.0.1:$(free_port)" --metrics-bind-address "127.0.0.1:$(free_port)" \
    --conntrack-max-per-core 0 --conntrack-min 0 \
    --conntrack-tcp-timeout-established 0 --conntrack-tcp-timeout-close-wait 0

# --- ready: the node Ready, the default ServiceAccount's token made ---------------------------
. "$DIR/env"
K() { curl -sS --cacert "$K8S_CA" -H "Authorization: Bearer $K8S_TOKEN" "$@"; }
for i in $(seq 1 240); do
    ready=$(K "$SERVER/api/v1/nodes/$NODE_NAME" 2>/dev/null | python3 -c '
import json, sys
try: n = json.load(sys.stdin)
except ValueError: sys.exit()
st = n.get("status") if n.get("kind") == "Node" else None
print(next((c["status"] for c in (st or {}).get("conditions", []) if c["type"] == "Ready"), ""))' || true)
    [ "$ready" = True ] && break
    while read -r pid name; do
        kill -0 "$pid" 2>/dev/null || fail "$name exited"
    done <"$DIR/node.pids"
    [ "$i" -eq 240 ] && fail "node $NODE_NAME not Ready after 120 s (Ready=$ready)"
    sleep 0.5
done
cat >>"$DIR/env" <<EOF
K8S_NODE_NAME=$NODE_NAME
K8S_NODE_IP=$NODE_IP
K8S_CONTAINERD=$CD/containerd.sock
K8S_KUBELET_ROOT=$DIR/kubelet
K8S_SECCOMP_DIR=$DIR/kubelet/seccomp
EOF
log "node $NODE_NAME Ready after ${SECONDS} s: apiserver $SERVER"
echo "$KCFG"
