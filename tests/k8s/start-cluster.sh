#!/usr/bin/env bash
# Start a throwaway etcd + kube-apiserver on loopback only.
#
#   tests/k8s/start-cluster.sh DIR PORT     -> prints DIR/kubeconfig on stdout
#   tests/k8s/stop-cluster.sh DIR
#
# DIR gets: ca.crt (trust this), server.{crt,key}, sa.{key,pub}, tokens.csv,
# admin.token (group system:masters), ember.token (user "ember", no grants: bind RBAC to it),
# kubeconfig (admin), kubeconfig-ember, env (sourceable: K8S_SERVER K8S_CA K8S_TOKEN K8S_EMBER_TOKEN),
# etcd/ (data, wiped at every start), etcd.log, apiserver.log, pids.
#
# Authorization is RBAC, not AlwaysAllow: the admin token is in system:masters so it can do
# anything anyway, and RBAC lets tests check ember's real ClusterRole (pods get/list/watch)
# with the unprivileged "ember" token. Costs nothing extra at start-up.
#
# K8S_ADDRESS (default 127.0.0.1): the apiserver's bind and advertise address, for a node
# whose pods must reach it (tests/k8s/start-node.sh passes the node's own address). With a
# non-loopback address the "kubernetes" Service gets it as endpoint (lease reconciler) and
# the ServiceAccount admission plugin is on, so pods get tokens (the controller-manager
# creates them); the server certificate also names 10.0.0.1, the Service's cluster IP.
#
# Binary: ${KUBE_APISERVER:-${EMBER_K8S_CACHE:-/var/cache/ember-k8s}/kube-apiserver}
# (build it with tests/k8s/build-apiserver.sh); etcd from Debian's etcd-server.
set -euo pipefail

SELF_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
die() { echo "start-cluster: ERROR: $*" >&2; exit 1; }
log() { echo "start-cluster: $*" >&2; }

[ $# -eq 2 ] || die "usage: $0 DIR PORT"
DIR=$1 PORT=$2
[[ "$PORT" =~ ^[0-9]+$ ]] && [ "$PORT" -gt 0 ] && [ "$PORT" -lt 65536 ] || die "bad PORT '$PORT'"
APISERVER=${KUBE_APISERVER:-${EMBER_K8S_CACHE:-/var/cache/ember-k8s}/kube-apiserver}
ADDR=${K8S_ADDRESS:-127.0.0.1}
[[ "$ADDR" =~ ^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "bad K8S_ADDRESS '$ADDR'"
[ -x "$APISERVER" ] || die "$APISERVER not found: run tests/k8s/build-apiserver.sh first"
ETCD=$(command -v etcd || true)
[ -n "$ETCD" ] || die "etcd not found (apt-get install etcd-server)"
for t in openssl curl python3; do command -v $t >/dev/null || die "$t not found"; done

mkdir -p "$DIR" || die "cannot create $DIR"
DIR=$(cd "$DIR" && pwd)
if [ -f "$DIR/pids" ]; then
    while read -r pid; do
        [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && die "a cluster from $DIR is still running (pid $pid): run stop-cluster.sh $DIR"
    done <"$DIR/pids"
    rm -f "$DIR/pids"
fi

port_free() {
    python3 - "$1" "$2" <<'EOF'
import socket, sys
s = socket.socket()
# SO_REUSEADDR like Go's listener: TIME_WAIT leftovers of a stopped cluster don't count.
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    s.bind((sys.argv[2], int(sys.argv[1])))
    s.listen()
except OSError:
    sys.exit(1)
EOF
}
free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
port_free "$PORT" "$ADDR" || die "port $ADDR:$PORT is in use"

# --- certificates and credentials (regenerated only when missing) ---------------------
cd "$DIR"
SANS="IP:127.0.0.1,DNS:localhost"
[ "$ADDR" = 127.0.0.1 ] || SANS+=",IP:$ADDR,IP:10.0.0.1,DNS:kubernetes.default.svc"
# A certificate made for other addresses is made again (the CA is kept).
[ "$(cat server.sans 2>/dev/null)" = "$SANS" ] || rm -f server.crt
if [ ! -f ca.crt ] || [ ! -f ca.key ] || [ ! -f server.crt ] || [ ! -f server.key ]; then
    # A CA plus a server certificate rather than one self-signed leaf: rustls (kube-rs) rejects
    # a certificate with CA:TRUE used as the server's own ("CaUsedAsEndEntity").
    if [ ! -f ca.crt ] || [ ! -f ca.key ]; then
        openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=ember-test-ca" \
            -keyout ca.key -out ca.crt \
            -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
            2>/dev/null || die "openssl: CA generation failed"
    fi
    openssl req -newkey rsa:2048 -nodes -subj "/CN=127.0.0.1" -keyout server.key -out server.csr \
        2>/dev/null || die "openssl: server key generation failed"
    printf '%s\n' "basicConstraints=critical,CA:FALSE" "keyUsage=critical,digitalSignature,keyEncipherment" \
        "extendedKeyUsage=serverAuth" "subjectAltName=$SANS" >server.ext
    openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 \
        -extfile server.ext -out server.crt 2>/dev/null || die "openssl: signing server cert failed"
    rm -f server.csr server.ext ca.srl
    echo "$SANS" >server.sans
fi
if [ ! -f sa.key ] || [ ! -f sa.pub ]; then
    openssl genrsa -out sa.key 2048 2>/dev/null && openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null \
        || die "openssl: service-account key generation failed"
fi
if [ ! -f tokens.csv ]; then
    admin=$(openssl rand -hex 24) ember=$(openssl rand -hex 24)
    # token,user,uid,"groups"
    printf '%s,admin,admin,"system:masters"\n%s,ember,ember\n' "$admin" "$ember" >tokens.csv
    echo "$admin" >admin.token
    echo "$ember" >ember.token
fi
chmod 600 ./*.key tokens.csv admin.token ember.token
ADMIN_TOKEN=$(cat admin.token)
EMBER_TOKEN=$(cat ember.token)

# --- etcd -------------------------------------------------------------------------------
rm -rf "$DIR/etcd"
ETCD_CLIENT=$(free_port)
ETCD_PEER=$(free_port)
while [ "$ETCD_PEER" = "$ETCD_CLIENT" ] || [ "$ETCD_PEER" = "$PORT" ] || [ "$ETCD_CLIENT" = "$PORT" ]; do
    ETCD_CLIENT=$(free_port); ETCD_PEER=$(free_port)
done
setsid "$ETCD" --name ember-test --data-dir "$DIR/etcd" \
    --listen-client-urls "http://127.0.0.1:$ETCD_CLIENT" --advertise-client-urls "http://127.0.0.1:$ETCD_CLIENT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER" \
    --initial-cluster "ember-test=http://127.0.0.1:$ETCD_PEER" --initial-cluster-state new \
    --logger zap --log-outputs stderr --log-level warn \
    </dev/null >"$DIR/etcd.log" 2>&1 &
ETCD_PID=$!
echo "$ETCD_PID" >"$DIR/pids"

fail() {
    echo "start-cluster: ERROR: $*" >&2
    for f in etcd.log apiserver.log; do
        [ -f "$DIR/$f" ] && { echo "--- last lines of $DIR/$f" >&2; tail -n 20 "$DIR/$f" >&2; }
    done
    "$SELF_DIR/stop-cluster.sh" "$DIR" >&2 || true
    exit 1
}

for i in $(seq 1 100); do
    curl -fsS "http://127.0.0.1:$ETCD_CLIENT/health" 2>/dev/null | grep -q '"health":"true"' && break
    kill -0 "$ETCD_PID" 2>/dev/null || fail "etcd exited"
    [ "$i" -eq 100 ] && fail "etcd not healthy after 20 s"
    sleep 0.2
done

# --- kube-apiserver -----------------------------------------------------------------------
# On loopback, --endpoint-reconciler-type=none: the default reconciler would try to publish
# 127.0.0.1 in the "kubernetes" Endpoints object, which validation rejects (loopback), logging
# errors forever; and no ServiceAccount admission (no controller-manager makes the tokens).
NODE_FLAGS=(--endpoint-reconciler-type none --disable-admission-plugins ServiceAccount)
# kubectl logs/exec: reach the kubelet at the node's InternalIP, its name is not in DNS.
[ "$ADDR" = 127.0.0.1 ] || NODE_FLAGS=(--endpoint-reconciler-type lease --kubelet-preferred-address-types InternalIP)
setsid "$APISERVER" \
    --etcd-servers "http://127.0.0.1:$ETCD_CLIENT" \
    --bind-address "$ADDR" --advertise-address "$ADDR" --secure-port "$PORT" --insecure-port 0 \
    --cert-dir "$DIR" --tls-cert-file "$DIR/server.crt" --tls-private-key-file "$DIR/server.key" \
    --token-auth-file "$DIR/tokens.csv" --anonymous-auth=false \
    --authorization-mode RBAC \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --service-account-key-file "$DIR/sa.pub" --service-account-signing-key-file "$DIR/sa.key" \
    "${NODE_FLAGS[@]}" \
    --service-cluster-ip-range 10.0.0.0/24 \
    --profiling=false \
    </dev/null >"$DIR/apiserver.log" 2>&1 &
API_PID=$!
echo "$API_PID" >>"$DIR/pids"

SERVER="https://$ADDR:$PORT"
for i in $(seq 1 240); do
    code=$(curl -sS -o /dev/null -w '%{http_code}' --cacert "$DIR/ca.crt" \
        -H "Authorization: Bearer $ADMIN_TOKEN" "$SERVER/readyz" 2>/dev/null || true)
    [ "$code" = 200 ] && break
    kill -0 "$API_PID" 2>/dev/null || fail "kube-apiserver exited"
    [ "$i" -eq 240 ] && fail "kube-apiserver not ready after 60 s (last /readyz: $code)"
    sleep 0.25
done

write_kubeconfig() { # file user token
    cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: ember-test
  cluster:
    server: $SERVER
    certificate-authority: $DIR/ca.crt
users:
- name: $2
  user:
    token: $3
contexts:
- name: ember-test
  context:
    cluster: ember-test
    user: $2
current-context: ember-test
EOF
    chmod 600 "$1"
}
write_kubeconfig "$DIR/kubeconfig" admin "$ADMIN_TOKEN"
write_kubeconfig "$DIR/kubeconfig-ember" ember "$EMBER_TOKEN"
cat >"$DIR/env" <<EOF
K8S_SERVER=$SERVER
K8S_CA=$DIR/ca.crt
K8S_TOKEN=$ADMIN_TOKEN
K8S_EMBER_TOKEN=$EMBER_TOKEN
K8S_ETCD=http://127.0.0.1:$ETCD_CLIENT
EOF
log "ready after ${SECONDS} s: apiserver $SERVER (pid $API_PID), etcd 127.0.0.1:$ETCD_CLIENT (pid $ETCD_PID)"
echo "$DIR/kubeconfig"
