#!/usr/bin/env python3
"""What walking Python frames costs: ember with interpreters.python on and off.

Runs N copies of tests/fixtures/py_hot.py (a CPU-bound CPython process: a Python loop,
zlib, sorted with a Python key) and `ember run` whole host, `interpreters.python.enabled`
false and true interleaved, several runs of each; reports the medians of the BPF time per
sample (run_time_ns / run_cnt of the sampler, the walker's tail calls included), ember's CPU
and RSS, and the Python names' cache, into BENCHMARKS.md ("python" section).

    sudo EMBER_BIN=target/release/ember python3 bench/python.py [--runs 3] [--seconds 20]

With `--service`, one fixture works 5 % of the time (`py_hot.py --busy 0.05`), a Python
service under light load on an otherwise quiet host, and the figure that counts is ember's
whole-host CPU (target ≤ 0.10 % of a core with the walk on).
"""

import argparse
import datetime
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import overhead as oh  # noqa: E402

FIXTURE = os.path.join(oh.ROOT, "tests", "fixtures", "py_hot.py")
PYTHONS = ["/usr/bin/python3.11", "/root/.pyenv/versions/3.12.1/bin/python3"]


SERVICE_BUSY = 0.05


def start_fixture(python, seconds, busy=1.0):
    p = subprocess.Popen([python, FIXTURE, "--seconds", str(seconds), "--busy", str(busy)],
                         stdout=subprocess.PIPE,
                         stdin=subprocess.DEVNULL, text=True)
    first = p.stdout.readline().strip()
    if not first.isdigit():
        oh.die(f"{python} py_hot.py printed {first!r}")
    return p


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=int, default=20)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--service", action="store_true",
                    help=f"one fixture busy {SERVICE_BUSY * 100:.0f} %% of the time (whole-host CPU)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        oh.die("needs root (BPF, perf events, sysctl)")
    ember = os.environ.get("EMBER_BIN") or os.path.join(oh.TARGET, "release", "ember")
    pythons = [p for p in PYTHONS if os.access(p, os.X_OK)]
    if not pythons:
        oh.die(f"none of {PYTHONS} is here")
    busy = SERVICE_BUSY if args.service else 1.0
    if args.service:
        pythons = pythons[:1]
    load = " ".join(open("/proc/loadavg").read().split()[:3])
    workdir = tempfile.mkdtemp(prefix="ember-python-")
    stats_path = "/proc/sys/kernel/bpf_stats_enabled"
    old_stats = open(stats_path).read().strip()
    procs = []

    def restore(*_):
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        with open(stats_path, "w") as f:
            f.write(old_stats)

    signal.signal(signal.SIGTERM, lambda s, _f: (restore(), sys.exit(128 + s)))
    results = {"off": [], "on": []}
    try:
        with open(stats_path, "w") as f:
            f.write("1")
        life = 2 * args.runs * (args.seconds + oh.WARMUP_S + 5) + 60
        procs = [start_fixture(p, life, busy) for p in pythons]
        oh.log(f"fixtures: {[(p, q.pid) for p, q in zip(pythons, procs)]}")
        time.sleep(1)
        for i in range(args.runs):
            for mode in ("off", "on"):
                extra = f"interpreters:\n  python:\n    enabled: {'true' if mode == 'on' else 'false'}\n"
                e = oh.measure_ember(ember, procs, args.seconds, 99, workdir, False,
                                     extra=extra)
                oh.log(f"run {i + 1}/{args.runs} python {mode}: cpu "
                       f"{100 * e['cpu_s'] / e['elapsed_s']:.3f} %, bpf "
                       f"{e['bpf_ns'] / max(e['bpf_cnt'], 1) / 1000:.2f} µs, rss "
                       f"{e['rss_steady_mb']:.1f} MB")
                results[mode].append(e)
    finally:
        restore()
        shutil.rmtree(workdir, ignore_errors=True)

    def med(mode, f):
        return statistics.median(f(e) for e in results[mode])

    def metric(e, name):
        return oh.metric_sum(e["metrics"], name)

    rows = ["| metric | python off | python on | on / off |", "|---|---|---|---|"]
    for name, f, fmt in [
        ("BPF time per sample", lambda e: e["bpf_ns"] / max(e["bpf_cnt"], 1) / 1000, "{:.2f} µs"),
        ("CPU of its threads, % of one core (steady)",
         lambda e: 100 * e["cpu_s"] / e["elapsed_s"], "{:.3f} %"),
        ("Steady RSS", lambda e: e["rss_steady_mb"], "{:.1f} MB"),
        ("Samples delivered", lambda e: e["samples"], "{:.0f}"),
        ("Python code cache (ember_python_code_cache_bytes)",
         lambda e: metric(e, "ember_python_code_cache_bytes") / 1024, "{:.1f} KiB"),
        ("Python walks ok (ember_python_walks_total{result=\"ok\"})",
         lambda e: e["metrics"].get('ember_python_walks_total{result="ok"}', 0), "{:.0f}"),
    ]:
        a, b = med("off", f), med("on", f)
        ratio = f"{b / a:.2f}×" if a else "n/a"
        rows.append(f"| {name} | {fmt.format(a)} | {fmt.format(b)} | {ratio} |")
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    head = (
        f"Measured {now} (`bench/python.py`) on kernel {platform.release()}, {os.cpu_count()} "
        f"CPUs ({oh.cpu_model()}), ember {oh.git_rev()}; load average before the run {load}.\n\n"
        f"Workload: `tests/fixtures/py_hot.py{f' --busy {busy}' if args.service else ''}` "
        f"under {', '.join(pythons)}. `ember run` whole "
        f"host, `interpreters.python.enabled` false and true interleaved, {args.runs} runs of "
        f"{args.seconds} s each after {oh.WARMUP_S:.0f} s; medians. Target: "
        + ("ember's whole-host CPU with the walk on ≤ 0.10 % of a core.\n" if args.service
           else "BPF time per sample with the walk on ≤ 1.5× off.\n")
    )
    section = head + "\n" + "\n".join(rows) + "\n"
    print(section)
    if not args.no_write:
        oh.write_benchmarks(section, "python-service" if args.service else "python")


if __name__ == "__main__":
    main()
