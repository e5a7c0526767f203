#!/usr/bin/env python3
"""Cost of off-CPU profiling (offcpu.enabled) per context switch, and at a pipe ping-pong.

Run by `make bench` (as root). Python 3 stdlib only.

For offcpu.enabled false, then true (defaults otherwise: min_block 1ms, sample_rate 1):
  1. starts `ember run` (whole host, 10 s windows) and waits for its perf events;
  2. enables kernel.bpf_stats_enabled (the old value is restored on exit);
  3. runs `perf bench sched pipe -l LOOPS` (two threads ping-ponging over pipes: two
     context switches per loop) and takes its context switches per second;
  4. takes ember's CPU time during the run (/proc/PID/stat utime+stime) and the BPF
     run time of its sched_switch programs (`bpftool prog show -j`: run_time_ns /
     run_cnt of ember_offcpu_switch, and of ember_rq_switch, the run-queue latency
     program that is always on, for scale).
Prints a markdown table; --write puts it into BENCHMARKS.md between the offcpu markers.

bcc's offcputime (kprobe on finish_task_switch) cannot run here: this kernel has no
kprobes. `perf sched record` needs the sched tracepoints through perf; it is run on the
same ping-pong for comparison when `perf` is installed (its CPU time and data rate).
"""

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EMBER = os.environ.get("EMBER_BIN", os.path.join(ROOT, "target/release/ember"))
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def prog_stats():
    out = subprocess.run(["bpftool", "prog", "show", "-j"], capture_output=True, text=True)
    stats = {}
    for p in json.loads(out.stdout or "[]"):
        name = p.get("name", "")
        if name.startswith(("ember_offcpu_sw", "ember_rq_switch")):
            stats[name] = (p.get("run_time_ns", 0), p.get("run_cnt", 0))
    return stats


def attached(pid, timeout=60):
    end = time.time() + timeout
    while time.time() < end:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
            n = sum(1 for fd in fds if "perf_event" in os.readlink(f"/proc/{pid}/fd/{fd}"))
            if n:
                return True
        except OSError:
            pass
        time.sleep(0.2)
    return False


def pingpong(loops):
    t0 = time.time()
    out = subprocess.run(
        ["perf", "bench", "sched", "pipe", "-l", str(loops)], capture_output=True, text=True
    )
    wall = time.time() - t0
    m = re.search(r"([\d.]+) usecs/op", out.stdout)
    usecs = float(m.group(1)) if m else wall * 1e6 / loops
    return wall, 2 * 1e6 / usecs  # two switches per loop


def run(enabled, loops, tmp):
    cfg = os.path.join(tmp, f"ember-{enabled}.yaml")
    with open(cfg, "w") as f:
        f.write(f"offcpu:\n  enabled: {str(enabled).lower()}\nkubernetes:\n  enabled: false\n"
                "server:\n  enabled: false\n")
    data = os.path.join(tmp, f"w-{enabled}")
    ember = subprocess.Popen([EMBER, "run", "--config", cfg, "--data-dir", data],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        if not attached(ember.pid):
            sys.exit("ember did not attach")
        time.sleep(3)
        s0, c0 = prog_stats(), cpu_seconds(ember.pid)
        wall, rate = pingpong(loops)
        s1, c1 = prog_stats(), cpu_seconds(ember.pid)
        ns = {}
        for name, (t, n) in s1.items():
            t0, n0 = s0.get(name, (0, 0))
            ns[name] = (t - t0) / max(n - n0, 1)
        return {"wall": wall, "rate": rate, "ember_cpu": (c1 - c0) / wall, "ns": ns}
    finally:
        ember.send_signal(signal.SIGINT)
        try:
            ember.wait(30)
        except subprocess.TimeoutExpired:
            ember.kill()


def perf_sched(loops, tmp):
    data = os.path.join(tmp, "sched.data")
    rec = subprocess.Popen(["perf", "sched", "record", "-a", "-o", data],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(2)
    c0 = cpu_seconds(rec.pid)
    wall, rate = pingpong(loops)
    c1 = cpu_seconds(rec.pid)
    rec.send_signal(signal.SIGINT)
    rec.wait(30)
    size = os.path.getsize(data) if os.path.exists(data) else 0
    return {"wall": wall, "rate": rate, "cpu": (c1 - c0) / wall, "mb_s": size / wall / 1e6}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--loops", type=int, default=1_000_000)
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench/offcpu.py needs root")
    with open("/proc/sys/kernel/bpf_stats_enabled") as f:
        old = f.read().strip()
    with open("/proc/sys/kernel/bpf_stats_enabled", "w") as f:
        f.write("1")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            off = run(False, args.loops, tmp)
            on = run(True, args.loops, tmp)
            perf = perf_sched(args.loops, tmp)
    finally:
        with open("/proc/sys/kernel/bpf_stats_enabled", "w") as f:
            f.write(old)
    rows = [
        "| | offcpu off | offcpu on (defaults) | perf sched record |",
        "|---|---|---|---|",
        f"| ping-pong context switches/s | {off['rate']:,.0f} | {on['rate']:,.0f} | {perf['rate']:,.0f} |",
        f"| ember (or perf) CPU, % of one core | {100 * off['ember_cpu']:.1f} | {100 * on['ember_cpu']:.1f} | {100 * perf['cpu']:.1f} ({perf['mb_s']:.1f} MB/s written) |",
        f"| BPF ns per sched_switch, ember_offcpu_switch | - | {on['ns'].get('ember_offcpu_switch', 0):,.0f} | |",
        f"| BPF ns per sched_switch, ember_rq_switch (run-queue latency, for scale) | {off['ns'].get('ember_rq_switch', 0):,.0f} | {on['ns'].get('ember_rq_switch', 0):,.0f} | |",
    ]
    table = "\n".join(rows)
    print(table)
    if args.write:
        path = os.path.join(ROOT, "BENCHMARKS.md")
        text = open(path).read()
        begin, end = "<!-- offcpu:begin -->", "<!-- offcpu:end -->"
        block = f"{begin}\n{table}\n{end}"
        if begin in text:
            text = re.sub(re.escape(begin) + ".*?" + re.escape(end), block, text, flags=re.S)
        else:
            text += f"\n## Off-CPU profiling (bench/offcpu.py)\n\n{block}\n"
        open(path, "w").write(text)


if __name__ == "__main__":
    main()
