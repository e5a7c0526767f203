#!/usr/bin/env bash
# Stop the etcd + kube-apiserver that start-cluster.sh DIR started (pids in DIR/pids).
# Only kills a pid whose command line still mentions DIR (guards against pid reuse).
set -uo pipefail

[ $# -eq 1 ] || { echo "usage: $0 DIR" >&2; exit 2; }
DIR=$(cd "$1" 2>/dev/null && pwd) || { echo "stop-cluster: no such dir $1" >&2; exit 1; }
[ -f "$DIR/pids" ] || { echo "stop-cluster: nothing to stop ($DIR/pids missing)" >&2; exit 0; }

ours() { kill -0 "$1" 2>/dev/null && tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null | grep -qF "$DIR/"; }

pids=()
while read -r pid; do
    [ -n "$pid" ] && ours "$pid" && pids+=("$pid")
done <"$DIR/pids"
# apiserver first (it was appended last), then etcd
for ((i = ${#pids[@]} - 1; i >= 0; i--)); do kill -TERM "${pids[i]}" 2>/dev/null; done
for _ in $(seq 1 50); do
    alive=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ "$alive" -eq 0 ] && break
    sleep 0.2
done
for pid in "${pids[@]}"; do
    if kill -0 "$pid" 2>/dev/null; then
        echo "stop-cluster: pid $pid ignored SIGTERM for 10 s, sending SIGKILL" >&2
        kill -KILL "$pid" 2>/dev/null
    fi
done
rm -f "$DIR/pids"
echo "stop-cluster: stopped ${#pids[@]} process(es) from $DIR" >&2
