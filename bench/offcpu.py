#!/usr/bin/env python3
"""Cost of off-CPU profiling (offcpu.enabled) per context switch and per syscall.

Run by `make bench` (as root). Python 3 stdlib only.

Five agent settings, interleaved run by run (--runs of each; medians reported):
  off        offcpu.enabled false
  on         offcpu.enabled true with the defaults (stacks only for blocks of min_block
             or more, walked on the thread's way back to user mode by a BPF task work
             its switch-in schedules, on kernels that have them: 6.18+)
  rseq       on, task_work false (older kernels): threads with rseq walked by the
             rseq_update program, others by the fallback at fallback_rate
  sysexit    rseq, but rseq false and syscall_exit true: blocks inside a syscall walked at
             its exit (a program on every syscall of the host), the rest by the fallback
  every      offcpu.enabled true, task_work, rseq and syscall_exit false, fallback_rate 1:
             every switch-out walks both stacks (what off-CPU did before; for scale)
For each run: starts `ember run` (whole host), waits for its perf events and 3 s more, then
  1. ping-pong: `taskset -c 0 perf bench sched pipe -T` (two threads of one process pass a
     token over two pipes, both on CPU 0: every hand-off is a context switch, every block
     a few microseconds, far under min_block), switches/s = 2 / (usecs per op);
  2. syscalls: `perf bench syscall basic` (getppid in a loop), ns per call;
  3. ember's CPU (its threads' schedstat run time, in ns) during the ping-pong, and over --steady
     seconds of the host as it is (steady state);
  4. then again with kernel.bpf_stats_enabled (its clock reads add to every program run,
     so rates and syscall times above are taken without it; restored on exit): BPF time,
     run_time_ns / run_cnt, of ember_offcpu_switch (sched_switch), of all three off-CPU
     programs (switch, waking/wakers, sys_exit, rseq, lock contention) per sched_switch run, during a ping-pong, and of
     the sys_exit program per syscall; ember_rq_switch (run-queue latency, always on) for
     scale.
Then, per run, "off" and "on" started together (their own data and unwind cache directories)
and measured over the same --steady seconds, after --warm: the steady host as it is changes
from one 10 s to the next on a shared machine (builds start and end), so the ratio of two agents
watching the same seconds is the one that tells off-CPU's cost apart from the host's; medians of
the per-pair ratios. Each runs from a copy of the binary named for its mode and excludes the
other by name, so neither profiles the other (a host has one agent).
The pair runs twice per run: on the host as it is, and with a service that blocks (the
wakers fixture, tests/fixtures/wakers.c, built with clang into target/bench/: a consumer on a
condition variable fed by two producers that each sleep 3 ms a round, about 300 rounds a
second, each round two blocks over min_block and a wakeup), whose rounds per second the row
shows: what off-CPU costs grows with the blocks a host makes, not with its CPU samples.
`perf sched record -a` on the same ping-pong, once, for scale. Prints a markdown table;
--write puts it into BENCHMARKS.md between the offcpu markers.

bcc's offcputime (kprobe on finish_task_switch) cannot run here: this kernel has no
kprobes (and refuses fentry).
"""

import argparse
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import overhead as oh  # noqa: E402  (results_path: where a section's table is written)
EMBER = os.environ.get("EMBER_BIN", os.path.join(ROOT, "target/release/ember"))
# bpftool shows the first 15 characters of a program's name.
PROGS = {
    "ember_offcpu_sw": "switch",
    "ember_offcpu_wa": "wakeup",  # sched_waking (wakers): ember_offcpu_waking
    "ember_offcpu_lo": "lock",  # lock:contention_begin/end (offcpu.locks)
    "ember_offcpu_ex": "exit",
    "ember_offcpu_rs": "rseq",
    "ember_rq_switch": "rq",
}
MODES = {
    "off": "offcpu:\n  enabled: false\n",
    "on": "offcpu:\n  enabled: true\n",
    "rseq": "offcpu:\n  enabled: true\n  task_work: false\n",
    "sysexit": "offcpu:\n  enabled: true\n  task_work: false\n  rseq: false\n  syscall_exit: true\n",
    "every": "offcpu:\n  enabled: true\n  task_work: false\n  rseq: false\n  syscall_exit: false\n  fallback_rate: 1.0\n",
}


def cpu_seconds(pid):
    """CPU time of every live thread of `pid`, from schedstat (nanoseconds: /proc/PID/stat
    counts clock ticks, sampled, 6 of them in 120 s for an agent at 0.05 %)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass  # a thread that ended meanwhile
    return total / 1e9


def stats(on):
    with open("/proc/sys/kernel/bpf_stats_enabled", "w") as f:
        f.write("1" if on else "0")


def prog_stats():
    out = subprocess.run(["bpftool", "prog", "show", "-j"], capture_output=True, text=True)
    stats = {}
    for p in json.loads(out.stdout or "[]"):
        key = PROGS.get(p.get("name", "")[:15])
        if key:
            # Two programs share "lock" (begin, end): summed.
            t, n = stats.get(key, (0, 0))
            stats[key] = (t + p.get("run_time_ns", 0), n + p.get("run_cnt", 0))
    return stats


def delta(s0, s1):
    return {k: (t - s0.get(k, (0, 0))[0], n - s0.get(k, (0, 0))[1]) for k, (t, n) in s1.items()}


def attached(pid, timeout=60):
    end = time.time() + timeout
    while time.time() < end:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
            if any("perf_event" in os.readlink(f"/proc/{pid}/fd/{fd}") for fd in fds):
                return True
        except OSError:
            pass
        time.sleep(0.2)
    return False


def usecs_per_op(cmd):
    out = subprocess.run(cmd, capture_output=True, text=True)
    m = re.search(r"([\d.]+) usecs/op", out.stdout)
    if not m:
        sys.exit(f"{' '.join(cmd)}: no usecs/op in\n{out.stdout}{out.stderr}")
    return float(m.group(1))


def pingpong(loops):
    """Context switches per second of a ping-pong pair on CPU 0."""
    us = usecs_per_op(["taskset", "-c", "0", "perf", "bench", "sched", "pipe", "-T", "-l", str(loops)])
    return 2 * 1e6 / us


def syscall_ns(loops):
    return 1000 * usecs_per_op(["perf", "bench", "syscall", "basic", "-l", str(loops)])


def run(mode, args, tmp):
    cfg = os.path.join(tmp, f"ember-{mode}.yaml")
    with open(cfg, "w") as f:
        f.write(MODES[mode] + "kubernetes:\n  enabled: false\nserver:\n  enabled: false\n")
    data = os.path.join(tmp, f"w-{mode}")
    ember = subprocess.Popen([EMBER, "run", "--config", cfg, "--data-dir", data],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        if not attached(ember.pid):
            sys.exit("ember did not attach")
        time.sleep(3)
        stats(False)
        c0, t0 = cpu_seconds(ember.pid), time.time()
        rate = pingpong(args.loops)
        c1, t1 = cpu_seconds(ember.pid), time.time()
        sc = syscall_ns(args.syscalls)
        c2 = cpu_seconds(ember.pid)
        time.sleep(args.steady)
        c3 = cpu_seconds(ember.pid)
        stats(True)
        s0 = prog_stats()
        pingpong(args.loops // 2)
        s1 = prog_stats()
        syscall_ns(args.syscalls // 2)
        s2 = prog_stats()
        pp, sys_d = delta(s0, s1), delta(s1, s2)
        per = lambda k, d: d[k][0] / d[k][1] if d.get(k, (0, 0))[1] else None
        sw_runs = pp.get("switch", (0, 0))[1]
        all_ns = (sum(pp.get(k, (0, 0))[0] for k in ("switch", "wakeup", "exit", "rseq", "lock")) / sw_runs
                  if sw_runs else None)
        return {
            "rate": rate,
            "switch_ns": per("switch", pp),
            "all_ns": all_ns,
            "rq_ns": per("rq", pp),
            "syscall_ns": sc,
            "exit_ns": per("exit", sys_d),
            "rseq_ns": per("rseq", pp),
            "cpu_pp": (c1 - c0) / (t1 - t0),
            "cpu_steady": (c3 - c2) / args.steady,
        }
    finally:
        ember.send_signal(signal.SIGINT)
        try:
            ember.wait(30)
        except subprocess.TimeoutExpired:
            ember.kill()


def build_wakers():
    """The wakers fixture, built into target/bench/."""
    clang = os.environ.get("CLANG", "clang")
    if not shutil.which(clang):
        sys.exit(f"{clang} not found: run `make deps`")
    out = os.path.join(ROOT, "target", "bench")
    os.makedirs(out, exist_ok=True)
    exe = os.path.join(out, "wakers")
    subprocess.run([clang, "-O2", "-g", "-fno-omit-frame-pointer", "-pthread", "-o", exe,
                    os.path.join(ROOT, "tests", "fixtures", "wakers.c")], check=True)
    return exe


def pair(args, tmp, run_no, service=None):
    """`args.agents` embers with off-CPU off and as many with it on, all at once over the
    same seconds: the median CPU % of one core of each mode (and, with `service`, the wakers
    fixture's rounds per second, which runs throughout). Several of each at once, because on
    this host one agent's CPU over two minutes moves by 2x with what else runs: the medians
    of agents that met the same host are what compares."""
    procs = {}
    work = None
    if service:
        # It ends by itself soon after the measured seconds, with its totals.
        life = args.warm + args.steady_pair + 20
        work = subprocess.Popen([service, "--seconds", str(life)],
                                stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    order = ["off", "on"] if run_no % 2 == 0 else ["on", "off"]
    # Each agent runs from a copy named for it and leaves all the others out
    # (filters.exclude_processes): a host has one agent, and an agent walking and naming
    # another's blocks (a 120 MB binary's DWARF) is a cost no host pays.
    names = {(m, k): f"ember-pair-{m}{k}" for m in order for k in range(args.agents)}
    try:
        for (mode, k), name in names.items():
            binary = os.path.join(tmp, name)
            if not os.path.exists(binary):
                shutil.copy2(EMBER, binary)
            cfg = os.path.join(tmp, f"{name}.yaml")
            with open(cfg, "w") as f:
                f.write(MODES[mode] + "kubernetes:\n  enabled: false\nserver:\n  enabled: false\n"
                        f"sampling:\n  unwind_cache_dir: {os.path.join(tmp, 'uc-' + name)}\n"
                        f"filters:\n  exclude_processes: [{', '.join(names.values())}]\n")
            procs[(mode, k)] = subprocess.Popen(
                [binary, "run", "--config", cfg, "--data-dir", os.path.join(tmp, f"d-{name}")],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for p in procs.values():
            if not attached(p.pid):
                sys.exit("ember did not attach")
        time.sleep(args.warm)
        c0 = {key: cpu_seconds(p.pid) for key, p in procs.items()}
        time.sleep(args.steady_pair)
        c1 = {key: cpu_seconds(p.pid) for key, p in procs.items()}
        each = {m: [(c1[key] - c0[key]) / args.steady_pair for key in procs if key[0] == m]
                for m in order}
        out = {m: statistics.median(v) for m, v in each.items()}
        out["each"] = each
        if work:
            text, _ = work.communicate(timeout=120)
            rounds = sum(int(x) for x in re.findall(r"signals \w+ (\d+)", text))
            out["rounds"] = rounds / life if rounds else None
        return out
    finally:
        if work and work.poll() is None:
            work.kill()
        for p in procs.values():
            p.send_signal(signal.SIGINT)
        for p in procs.values():
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()


def perf_sched(loops, tmp):
    data = os.path.join(tmp, "sched.data")
    rec = subprocess.Popen(["perf", "sched", "record", "-a", "-o", data],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(2)
    c0, t0 = cpu_seconds(rec.pid), time.time()
    rate = pingpong(loops)
    c1, t1 = cpu_seconds(rec.pid), time.time()
    rec.send_signal(signal.SIGINT)
    rec.wait(30)
    size = os.path.getsize(data) if os.path.exists(data) else 0
    return {"rate": rate, "cpu": (c1 - c0) / (t1 - t0), "mb_s": size / (t1 - t0) / 1e6}


def median(runs, key):
    vals = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(vals) if vals else None


def fmt(v, spec, unit=""):
    return "-" if v is None else f"{v:{spec}}{unit}"


def pair_row(label, pairs, args, extra=""):
    off_p = statistics.median(p["off"] for p in pairs)
    on_p = statistics.median(p["on"] for p in pairs)
    ratio = statistics.median(p["on"] / p["off"] for p in pairs if p["off"] > 0)
    each = "; ".join(" ".join(f"{100 * v:.3f}" for v in p["each"]["off"]) + " / "
                     + " ".join(f"{100 * v:.3f}" for v in p["each"]["on"]) for p in pairs)
    return (f"| ember CPU, {label}, {args.agents} agents off and {args.agents} on at once "
            f"({args.steady_pair:.0f} s after {args.warm:.0f} s), % of one core (median of each "
            f"run's on ÷ off medians){extra} | {100 * off_p:.3f} | {100 * on_p:.3f} ({ratio:.2f}×) "
            f"| - | - | - | runs, each agent off / on: {each} |")


def table(res, perf, pairs, args, service_pairs=()):
    m = {mode: {k: median(runs, k) for k in runs[0]} for mode, runs in res.items()}
    off = m["off"]
    cols = ["off", "on", "rseq", "sysexit", "every"]
    load = open("/proc/loadavg").read().split()[:3]
    rev = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                         text=True).stdout.strip()

    def row(label, key, spec, scale=1.0, ratio=False, perf_cell=""):
        cells = []
        for c in cols:
            v = m[c].get(key)
            cell = fmt(None if v is None else v * scale, spec)
            if ratio and c != "off" and v is not None and off.get(key):
                cell += f" ({v / off[key]:.2f}×)"
            cells.append(cell)
        return f"| {label} | " + " | ".join(cells) + f" | {perf_cell} |"

    rows = [
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} (`bench/offcpu.py`) on kernel "
        f"{platform.release()}, {os.cpu_count()} CPUs, ember {rev}; load average after the runs "
        f"{' '.join(load)} (other builds share the host). Medians of {args.runs} runs per setting, "
        f"interleaved. Ping-pong: `taskset -c 0 perf bench sched pipe -T -l {args.loops}` (two threads "
        "on one CPU, blocks of a few µs, all under `min_block`). Rates, syscall times and CPU with "
        "`kernel.bpf_stats_enabled` off; BPF times in a second pass with it on.",
        "",
        "| | offcpu off | on (defaults: task work) | rseq instead (kernels before 6.18) "
        "| sys_exit instead of rseq | walk at every switch-out (before) | perf sched record |",
        "|---|---|---|---|---|---|---|",
        row("ping-pong context switches/s (× off)", "rate", ",.0f", ratio=True,
            perf_cell=f"{perf['rate']:,.0f}"),
        row("BPF ns per sched_switch, ember_offcpu_switch", "switch_ns", ",.0f"),
        row("BPF ns per sched_switch, all off-CPU programs (switch, waking with wakers, sys_exit, rseq, lock contention)", "all_ns",
            ",.0f"),
        row("BPF ns per run, ember_offcpu_rseq (once per switch of a thread with rseq)", "rseq_ns", ",.0f"),
        row("BPF ns per sched_switch, ember_rq_switch (run-queue latency, for scale)", "rq_ns", ",.0f"),
        row("getppid() ns per call, `perf bench syscall basic` (× off)", "syscall_ns", ".0f", ratio=True),
        row("BPF ns per syscall, ember_offcpu_exit (sys_exit)", "exit_ns", ".0f"),
        row("ember (or perf) CPU during the ping-pong, % of one core (× off)", "cpu_pp", ".2f", 100,
            ratio=True, perf_cell=f"{100 * perf['cpu']:.1f} ({perf['mb_s']:.1f} MB/s written)"),
        row(f"ember CPU, steady host ({args.steady:.0f} s), % of one core (× off)", "cpu_steady", ".2f",
            100, ratio=True),
    ]
    if pairs:
        rows.append(pair_row("steady host", pairs, args))
    if service_pairs:
        rounds = median(service_pairs, "rounds")
        rows.append(pair_row("host with a blocking service (wakers fixture)", service_pairs, args,
                             f"; {fmt(rounds, ',.0f')} rounds/s"))
    return "\n".join(rows)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--loops", type=int, default=300_000)
    ap.add_argument("--syscalls", type=int, default=3_000_000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--steady", type=float, default=10.0)
    ap.add_argument("--steady-pair", type=float, default=180.0)
    ap.add_argument("--agents", type=int, default=3, help="agents of each mode per pair run")
    # Agents name new stacks and page in DWARF for minutes after they start (paced: at most
    # symbols.dwarf_bytes per 320 s), and off-CPU stacks bring in objects CPU samples do not.
    # 600 s: at 240 s one agent of a pair was often still reading, which moved the ratio by
    # 0.2 either way.
    ap.add_argument("--warm", type=float, default=600.0)
    ap.add_argument("--no-pair", action="store_true")
    ap.add_argument("--only-pairs", action="store_true",
                    help="only the agents' steady CPU, printed (not written)")
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench/offcpu.py needs root")
    with open("/proc/sys/kernel/bpf_stats_enabled") as f:
        old = f.read().strip()
    res = {mode: [] for mode in MODES}
    pairs, service_pairs = [], []
    service = None if args.no_pair else build_wakers()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for i in range(args.runs):
                for mode in [] if args.only_pairs else MODES:
                    r = run(mode, args, tmp)
                    res[mode].append(r)
                    print(f"run {i + 1} {mode}: " + ", ".join(
                        f"{k} {v:.4g}" for k, v in r.items() if v is not None), flush=True)
                if not args.no_pair:
                    stats(False)
                    pairs.append(pair(args, tmp, i))
                    print(f"run {i + 1} pair: off {100 * pairs[-1]['off']:.2f} %, on "
                          f"{100 * pairs[-1]['on']:.2f} %", flush=True)
                    service_pairs.append(pair(args, tmp, i, service))
                    print(f"run {i + 1} pair with the service: off "
                          f"{100 * service_pairs[-1]['off']:.2f} %, on "
                          f"{100 * service_pairs[-1]['on']:.2f} %", flush=True)
            stats(False)
            perf = None if args.only_pairs else perf_sched(args.loops, tmp)
    finally:
        with open("/proc/sys/kernel/bpf_stats_enabled", "w") as f:
            f.write(old)
    if args.only_pairs:
        print(pair_row("steady host", pairs, args))
        print(pair_row("host with a blocking service (wakers fixture)", service_pairs, args))
        return
    text = table(res, perf, pairs, args, service_pairs)
    print(text)
    if args.write:
        begin, end = "<!-- offcpu:begin -->", "<!-- offcpu:end -->"
        path = oh.results_path(begin)
        doc = open(path).read()
        block = f"{begin}\n{text}\n{end}"
        if begin in doc:
            doc = re.sub(re.escape(begin) + ".*?" + re.escape(end), lambda _: block, doc, flags=re.S)
        else:
            doc += f"\n## Off-CPU profiling (bench/offcpu.py)\n\n{block}\n"
        open(path, "w").write(doc)


if __name__ == "__main__":
    main()
