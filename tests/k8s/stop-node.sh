#!/usr/bin/env bash
# Stop what start-node.sh DIR started and undo what it changed on the host: pods' containers,
# kubelet, kube-proxy (and its iptables chains), containerd and its shims, controller-manager,
# scheduler, apiserver, etcd; mounts under DIR, the kubelet's cgroups, the node's interfaces,
# the sysctls it saved. Idempotent; exits non-zero if anything is left running or mounted.
set -uo pipefail

[ $# -eq 1 ] || { echo "usage: $0 DIR" >&2; exit 2; }
SELF_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DIR=$(cd "$1" 2>/dev/null && pwd) || { echo "stop-node: no such dir $1" >&2; exit 1; }
CD=$DIR/containerd
CGROUP_ROOT=/ember-k8s
log() { echo "stop-node: $*" >&2; }

ours() { kill -0 "$1" 2>/dev/null && tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null | grep -qF "$DIR/"; }
stop_pids() { # PID...: TERM, up to 10 s, then KILL
    local p alive
    for p in "$@"; do kill -TERM "$p" 2>/dev/null; done
    for _ in $(seq 1 50); do
        alive=0
        for p in "$@"; do kill -0 "$p" 2>/dev/null && alive=1; done
        [ "$alive" -eq 0 ] && return 0
        sleep 0.2
    done
    for p in "$@"; do kill -0 "$p" 2>/dev/null && { log "pid $p ignored SIGTERM, SIGKILL"; kill -KILL "$p"; }; done
    sleep 0.2
}
pid_of() { # NAME from node.pids, if still ours
    [ -f "$DIR/node.pids" ] || return 0
    awk -v n="$1" '$2 == n { print $1 }' "$DIR/node.pids" | while read -r p; do ours "$p" && echo "$p"; done
}

# 1. kubelet first, so that it does not restart what we remove.
mapfile -t p < <(pid_of kubelet); [ ${#p[@]} -eq 0 ] || stop_pids "${p[@]}"

# 2. every container and sandbox, through containerd while it runs.
CTR=(ctr --address "$CD/containerd.sock" -n k8s.io)
if [ -S "$CD/containerd.sock" ] && "${CTR[@]}" version >/dev/null 2>&1; then
    for t in $("${CTR[@]}" tasks ls -q 2>/dev/null); do "${CTR[@]}" tasks kill -s SIGKILL "$t" >/dev/null 2>&1; done
    for _ in $(seq 1 25); do
        [ -z "$("${CTR[@]}" tasks ls -q 2>/dev/null | while read -r t; do
            "${CTR[@]}" tasks ls 2>/dev/null | awk -v t="$t" '$1 == t && $3 != "STOPPED"'; done)" ] && break
        sleep 0.2
    done
    for t in $("${CTR[@]}" tasks ls -q 2>/dev/null); do "${CTR[@]}" tasks delete -f "$t" >/dev/null 2>&1; done
    for c in $("${CTR[@]}" containers ls -q 2>/dev/null); do "${CTR[@]}" containers delete "$c" >/dev/null 2>&1; done
fi

# 3. kube-proxy, then every KUBE-* chain in iptables and ip6tables (kube-proxy's and the
# kubelet's; start-node.sh refuses a host that had any). Not `kube-proxy --cleanup`: it
# stops at its IPVS part when ipset is not installed and leaves the kubelet's chains.
mapfile -t p < <(pid_of kube-proxy); [ ${#p[@]} -eq 0 ] || stop_pids "${p[@]}"
for ipt in iptables ip6tables; do
    command -v "$ipt" >/dev/null || continue
    for t in filter nat mangle; do
        "$ipt" -w -t "$t" -S 2>/dev/null | grep -E '^-A [A-Z]+ .*-j KUBE-' | sed 's/^-A /-D /' |
            while read -r rule; do eval "$ipt -w -t $t $rule"; done
        mapfile -t chains < <("$ipt" -w -t "$t" -S 2>/dev/null | awk '/^-N KUBE-/ { print $2 }')
        for c in "${chains[@]}"; do "$ipt" -w -t "$t" -F "$c"; done
        for c in "${chains[@]}"; do "$ipt" -w -t "$t" -X "$c" || log "$ipt -t $t -X $c failed"; done
    done
done

# 4. controller-manager, scheduler, then apiserver and etcd.
for n in scheduler controller-manager; do
    mapfile -t p < <(pid_of "$n"); [ ${#p[@]} -eq 0 ] || stop_pids "${p[@]}"
done
[ -f "$DIR/pids" ] && "$SELF_DIR/stop-cluster.sh" "$DIR"
rm -f "$DIR/node.pids"

# 5. containerd, then any shim or container process still holding DIR (shims outlive containerd).
mapfile -t p < <(pid_of containerd); [ ${#p[@]} -eq 0 ] || stop_pids "${p[@]}"
left=()
for pr in /proc/[0-9]*; do
    pid=${pr#/proc/}
    [ "$pid" = $$ ] && continue
    ours "$pid" && left+=("$pid")
done
[ ${#left[@]} -eq 0 ] || { log "stopping ${#left[@]} leftover process(es) under $DIR"; stop_pids "${left[@]}"; }
# Container processes whose shim is gone: whatever is still in the kubelet's cgroups is ours.
mapfile -t left < <(find /sys/fs/cgroup/pids"$CGROUP_ROOT" -name cgroup.procs -exec cat {} + 2>/dev/null | sort -u)
[ ${#left[@]} -eq 0 ] || { log "killing ${#left[@]} process(es) left in $CGROUP_ROOT"; kill -KILL "${left[@]}" 2>/dev/null; sleep 0.5; }

# 6. mounts under DIR (overlays, shm, netns, secrets/configmap tmpfs), deepest first.
for _ in 1 2 3; do
    mapfile -t m < <(awk -v d="$DIR/" 'index($2, d) == 1 { print $2 }' /proc/self/mounts | sort -r)
    [ ${#m[@]} -eq 0 ] && break
    for x in "${m[@]}"; do umount "$x" 2>/dev/null || umount -l "$x" 2>/dev/null; done
done

# 7. cgroups (deepest first; a cgroup with tasks left cannot go, and says so).
for h in /sys/fs/cgroup/*/; do
    r="$h${CGROUP_ROOT#/}"
    [ -d "$r" ] || continue
    find "$r" -depth -type d -exec rmdir {} \; 2>/dev/null
    [ -d "$r" ] && log "cannot remove cgroup $r (tasks: $(cat "$r"/cgroup.procs 2>/dev/null | wc -l))"
done

# 8. interfaces, files the kubelet and containerd made outside DIR, sysctls.
ip link del emberk8s-br0 2>/dev/null
ip link del emberk8s0 2>/dev/null
if [ -f "$DIR/created" ]; then
    while read -r d; do [ -n "$d" ] && rm -rf "$d"; done <"$DIR/created"
    rm -f "$DIR/created"
fi
if [ -f "$DIR/sysctl.saved" ]; then
    while IFS='=' read -r k v; do [ -n "$k" ] && sysctl -qw "$k=$v"; done <"$DIR/sysctl.saved"
    rm -f "$DIR/sysctl.saved"
fi

# 9. nothing left?
bad=0
for pr in /proc/[0-9]*; do
    pid=${pr#/proc/}
    [ "$pid" = $$ ] && continue
    ours "$pid" && { log "still running: $pid $(tr '\0' ' ' <"$pr/cmdline")"; bad=1; }
done
if awk -v d="$DIR/" 'index($2, d) == 1' /proc/self/mounts | grep -q .; then
    log "still mounted:"; awk -v d="$DIR/" 'index($2, d) == 1 { print "  " $2 }' /proc/self/mounts >&2; bad=1
fi
for ipt in iptables ip6tables; do
    command -v "$ipt" >/dev/null || continue
    for t in filter nat mangle; do
        "$ipt" -w -t "$t" -S 2>/dev/null | grep -q '^-N KUBE-' && { log "$ipt -t $t still has KUBE-* chains"; bad=1; }
    done
done
for i in emberk8s0 emberk8s-br0; do ip link show "$i" >/dev/null 2>&1 && { log "interface $i still there"; bad=1; }; done
[ "$bad" -eq 0 ] && log "stopped; nothing left running or mounted from $DIR"
exit "$bad"
