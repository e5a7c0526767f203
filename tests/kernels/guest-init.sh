#!/bin/sh
# /init of the kernel matrix guest (tests/kernels/build-initramfs.sh puts it there): sets up
# what a node gives the agent (proc, sys, debugfs, tracefs, bpffs, cgroup2, /tmp, lo), runs the
# real ember against the fixture workloads, prints every result on the serial console between
# markers for tests/tests/e2e/kernels.rs, and powers off.
#
# Protocol (one marker per line; anything else on the console is ignored by the parser):
#   @@EMBER INIT release=R uptime=S         init started, S seconds after the kernel did
#   @@EMBER BEGIN NAME ... @@EMBER END NAME  a section printed verbatim in between
#   @@EMBER RESULT NAME key=value ...        one line per step
#   @@EMBER DONE uptime=S                    all steps ran
#
# Settings come from the kernel command line (the kernel hands unknown key=value parameters
# to init as environment variables; names must not contain dots): ember_secs (recording
# length), ember_step_timeout (hard limit per ember command, which includes the verifier's
# time), ember_port (the /metrics listener).
#
# No `set -e`: a failing step must be reported and the next one run, never end the guest
# early (init exiting panics the kernel, and the host then only sees a truncated log).

PATH=/usr/bin:/bin:/sbin:/usr/sbin
export PATH

mount -t devtmpfs devtmpfs /dev 2>/dev/null
# The kernel opens /dev/console for init only when the initramfs has the node (it does when
# the image was built as root); take it from devtmpfs either way.
exec </dev/console >/dev/console 2>&1
# The kernel's own messages would interleave with the results mid-line: emergencies only.
dmesg -n 1

mkdir -p /proc /sys /tmp /run
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t tmpfs -o mode=1777 tmpfs /tmp
mount -t tmpfs tmpfs /run
mount -t debugfs debugfs /sys/kernel/debug
mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null
mount -t bpf bpf /sys/fs/bpf
mount -t cgroup2 cgroup2 /sys/fs/cgroup
ip link set lo up 2>/dev/null || ifconfig lo 127.0.0.1 up
hostname ember-guest

secs=${ember_secs:-6}
step_timeout=${ember_step_timeout:-150}
port=${ember_port:-9464}

now() { cut -d' ' -f1 /proc/uptime; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

echo "@@EMBER INIT release=$(uname -r) uptime=$(now)"

# Prints FILE as section NAME (always ending in a newline, so END stays on a line of its own).
section() {
	echo "@@EMBER BEGIN $1"
	if [ -s "$2" ]; then
		cat "$2"
		[ -n "$(tail -c 1 "$2")" ] && echo
	fi
	echo "@@EMBER END $1"
}

# ember's stderr, trimmed: a rejected program's verifier log runs to thousands of lines, and
# its head (what failed) and tail (the verifier's verdict) are what tell why.
trimmed() {
	n=$(wc -l <"$2")
	if [ "$n" -gt 80 ]; then
		{ head -n 30 "$2"; echo "... ($((n - 70)) lines cut) ..."; tail -n 40 "$2"; } >"$2.trim"
	else
		cp "$2" "$2.trim"
	fi
	cut -c 1-400 "$2.trim" >"$2.cut"
	section "$1" "$2.cut"
}

# Only paths under /tmp: no unwind cache in /var/lib, no window files elsewhere, no
# Kubernetes API to look for.
cat >/tmp/ember.yaml <<EOF
sampling:
  unwind_cache_dir: ""
output:
  data_dir: /tmp/ember-data
kubernetes:
  enabled: false
EOF

# a. What the agent says it can do on this kernel (a subcommand still being written: until
# it exists, or when it prints no JSON, the step records "unavailable").
t0=$(now)
timeout "$step_timeout" ember features --json >/tmp/features.json 2>/tmp/features.err
rc=$?
if grep -q '^[[:space:]]*{' /tmp/features.json 2>/dev/null; then
	section features /tmp/features.json
	echo "@@EMBER RESULT features rc=$rc secs=$(since "$t0")"
else
	echo "@@EMBER RESULT features unavailable rc=$rc secs=$(since "$t0")"
fi
[ "$rc" = 0 ] || trimmed features.stderr /tmp/features.err

# b-d. record NAME TYPE FIXTURE ARGS...: runs the fixture, records it for $secs with
# `ember record --type TYPE --pid`, prints the folded stacks and ember's stderr.
record() {
	name=$1 type=$2
	shift 2
	"$@" >/tmp/$name.fixture 2>&1 &
	fixture=$!
	t0=$(now)
	timeout "$step_timeout" ember record -c /tmp/ember.yaml --type "$type" --pid "$fixture" \
		-d "${secs}s" -o /tmp/$name.folded 2>/tmp/$name.err
	rc=$?
	alive=0
	kill -0 "$fixture" 2>/dev/null && alive=1
	kill -9 "$fixture" 2>/dev/null
	wait "$fixture" 2>/dev/null
	[ -f /tmp/$name.folded ] && section "$name.folded" /tmp/$name.folded
	trimmed "$name.stderr" /tmp/$name.err
	echo "@@EMBER RESULT $name rc=$rc secs=$(since "$t0") fixture_alive=$alive"
}

# The fixtures run far longer than a recording (the verifier's time comes first) and are
# killed after it. cpu_hog: frame pointers; nofp_qsort: none, so only unwind tables get it to
# main; offcpu without its CPU hogs (they would only slow the emulated CPUs down): the
# sleeper and the pipe reader; wakers: a consumer woken by two producers (7:3).
record fp cpu /fixtures/cpu_hog --seconds 600
record nofp cpu /fixtures/nofp_qsort --seconds 600
record offcpu offcpu /fixtures/offcpu --no-hogs --seconds 600
record offwake offwake /fixtures/wakers --seconds 600

# e. The agent proper, and its /metrics: served (ember_ series), and once the sampler runs,
# counting samples (ember_samples_total > 0; waited for at most 60 s after the first answer).
t0=$(now)
ember run -c /tmp/ember.yaml --data-dir /tmp/ember-run --listen "127.0.0.1:$port" \
	>/tmp/run.out 2>/tmp/run.err &
agent=$!
verdict="fail no-answer"
served=""
while :; do
	if ! kill -0 "$agent" 2>/dev/null; then
		verdict="fail exited${served:+ after-serving}"
		break
	fi
	# nc, not wget: busybox-static's wget crashes in static glibc's resolver, IP literal or not.
	printf 'GET /metrics HTTP/1.0\r\nHost: 127.0.0.1:%s\r\n\r\n' "$port" |
		nc -w 5 127.0.0.1 "$port" >/tmp/metrics.txt 2>/dev/null
	if head -n 1 /tmp/metrics.txt | grep -q ' 200 ' && grep -q '^ember_' /tmp/metrics.txt; then
		[ -n "$served" ] || served=$(now)
		samples=$(awk '$1 == "ember_samples_total" { print int($2) }' /tmp/metrics.txt)
		verdict="ok series=$(grep -c '^ember_' /tmp/metrics.txt) samples=${samples:-0}"
		[ "${samples:-0}" -gt 0 ] && break
		[ "$(awk -v a="$served" -v b="$(now)" 'BEGIN { print (b - a > 60) }')" = 1 ] && break
	fi
	[ "$(awk -v a="$t0" -v b="$(now)" -v t="$step_timeout" 'BEGIN { print (b - a > t) }')" = 1 ] && break
	sleep 1
done
secs_up=$(since "$t0")
kill -TERM "$agent" 2>/dev/null
i=0
while kill -0 "$agent" 2>/dev/null && [ $i -lt 20 ]; do
	sleep 0.5
	i=$((i + 1))
done
kill -9 "$agent" 2>/dev/null
wait "$agent"
rc=$?
trimmed metrics.stderr /tmp/run.err
echo "@@EMBER RESULT metrics $verdict rc=$rc secs=$secs_up"

# Warnings the kernel logged meanwhile (a BPF splat, an oops), for the record.
dmesg | grep -iE 'warn|bug|oops|bpf|call trace' | tail -n 40 >/tmp/dmesg.txt
section dmesg /tmp/dmesg.txt

echo "@@EMBER DONE uptime=$(now)"
sync
poweroff -f
