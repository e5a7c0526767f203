#!/usr/bin/env python3
"""What unwinding by tables costs in BPF, and how complete the stacks are, against perf dwarf.

Run by `make bench` (as root, after bench/overhead.py). Python 3 stdlib only.

For each workload — the frame-pointer `cpu_hog` fixture, the `nofp_qsort` fixture (C,
-O2 -fomit-frame-pointer, 30 % inside libc's qsort) and Debian's stock /usr/bin/python3
in a loop — it starts the workload and two `ember record --pid` agents on it at once,
one with `sampling.unwind: frame_pointer` and one with `auto`, and reads each sampler's BPF
time per sample over --seconds (`kernel.bpf_stats_enabled`, run_time_ns / run_cnt of that
agent's ember_sample; its tail calls into ember_walk are counted in it), and the share of
samples whose stack reaches `main` (`_start`-rooted stacks of a stripped binary do not
occur here). Measured one mode after the other, the same figure moved 3x between runs on
this VM; side by side, the two modes see the same conditions. The same workload is then
recorded by `perf record -F 99 --call-graph dwarf` for the same time, for its share
reaching main and its CPU. Runs are repeated (--runs) and medians are reported. The table goes into
BENCHMARKS.md between the stacks markers.

Options: --seconds N (default 8), --runs N (3), --no-write, --only WORKLOAD (repeatable).
Environment: EMBER_BIN (default target/release/ember), CLANG (default clang).
"""

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import overhead as oh  # noqa: E402  (results_path: where a section's table is written)
TARGET = os.environ.get("CARGO_TARGET_DIR") or os.path.join(ROOT, "target")
BEGIN = "<!-- stacks:begin (written by bench/stacks.py; edits inside are overwritten) -->"
END = "<!-- stacks:end -->"
PY_LOOP = "import os,sys,time\nprint('pid', os.getpid(), flush=True)\nprint('ready', flush=True)\n" \
    "end = time.time() + float(sys.argv[1])\n" \
    "def f(n):\n    return sum(i * i for i in range(n))\n" \
    "while time.time() < end:\n    f(10000)\n"
MAIN = ("main", "Py_BytesMain")


def log(msg):
    print(f"stacks: {msg}", file=sys.stderr, flush=True)


def die(msg):
    log(msg)
    sys.exit(1)


def build(out_dir):
    clang = os.environ.get("CLANG", "clang")
    if not shutil.which(clang):
        die(f"{clang} not found: run `make deps`")
    os.makedirs(out_dir, exist_ok=True)
    fixtures = os.path.join(ROOT, "tests", "fixtures")
    exes = {}
    for name, flags in [
        ("cpu_hog", ["-fno-omit-frame-pointer", "-mno-omit-leaf-frame-pointer"]),
        ("nofp_qsort", ["-fomit-frame-pointer"]),
    ]:
        exe = os.path.join(out_dir, name)
        subprocess.run([clang, "-O2", "-g", *flags, "-pthread", "-o", exe,
                        os.path.join(fixtures, f"{name}.c")], check=True)
        exes[name] = [exe, "--seconds"]
    script = os.path.join(out_dir, "py_loop.py")
    with open(script, "w") as f:
        f.write(PY_LOOP)
    exes["python3"] = ["/usr/bin/python3", script]
    return exes


def start(cmd, seconds):
    p = subprocess.Popen([*cmd, str(seconds)], stdout=subprocess.PIPE, stdin=subprocess.PIPE,
                         text=True)
    first = p.stdout.readline().split()
    if len(first) != 2 or first[0] != "pid":
        die(f"{cmd[0]} printed {first!r}")
    if p.stdout.readline().strip() != "ready":
        die(f"{cmd[0]} did not get ready")
    return p, int(first[1])


def go(p):
    try:
        p.stdin.write("go\n")
        p.stdin.flush()
    except (BrokenPipeError, OSError):
        pass


def bpf_stats(holder):
    out = subprocess.run(["bpftool", "prog", "show", "-j"], capture_output=True, text=True,
                         check=True)
    ns = cnt = 0
    for p in json.loads(out.stdout):
        holders = [h.get("pid") for h in p.get("pids", [])]
        # bpftool names the holding processes only when built with that support.
        if (holders and holder not in holders) or \
                not str(p.get("name", "")).startswith("ember_sample"):
            continue
        ns += int(p.get("run_time_ns", 0))
        cnt += int(p.get("run_cnt", 0))
    return ns, cnt


def reach_main_folded(path):
    total = hit = 0
    with open(path) as f:
        for line in f:
            stack, _, n = line.rstrip("\n").rpartition(" ")
            n = int(n)
            total += n
            if any(fr in MAIN for fr in stack.split(";")):
                hit += n
    return hit, total


def ember_programs():
    """ember's sampler programs loaded now, by id."""
    out = subprocess.run(["bpftool", "prog", "show", "-j"], capture_output=True, text=True,
                         check=True)
    return {p["id"]: p for p in json.loads(out.stdout)
            if str(p.get("name", "")).startswith("ember_sample")}


def run_embers(ember, cmd, modes, seconds, work):
    """One agent per mode, all at once on one workload, so that the VM's drift (3x from
    run to run here) hits every mode alike. Each agent's sampler is told apart by its
    program id. Programs on one event run in the order they attached, the first warming
    the caches for the others: the caller alternates `modes`."""
    p, pid = start(cmd, seconds + 4 + 2 * len(modes))
    agents = {}
    for mode in modes:
        cfg = os.path.join(work, f"ember-{mode}.yaml")
        with open(cfg, "w") as f:
            f.write(f"sampling:\n  unwind: {mode}\n  pids: [{pid}]\n")
        out = os.path.join(work, f"ember-{mode}.folded")
        known = set(ember_programs())
        e = subprocess.Popen([ember, "record", "-c", cfg, "-d", f"{seconds + 2 * len(modes)}s",
                              "-o", out], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1.0)  # attached, and the preloaded tables are in
        new = set(ember_programs()) - known
        if len(new) != 1:
            die(f"ember ({mode}) loaded {len(new)} sampler programs, not 1")
        agents[mode] = (e, new.pop(), out)
    go(p)
    time.sleep(0.5)

    def stat(prog):
        q = ember_programs().get(prog, {})
        return int(q.get("run_time_ns", 0)), int(q.get("run_cnt", 0))

    before = {m: stat(a[1]) for m, a in agents.items()}
    time.sleep(seconds)
    after = {m: stat(a[1]) for m, a in agents.items()}
    res = {}
    for mode, (e, _, out) in agents.items():
        e.wait()
        ns, cnt = after[mode][0] - before[mode][0], after[mode][1] - before[mode][1]
        hit, total = reach_main_folded(out)
        res[mode] = {"ns": ns / cnt if cnt > 0 else float("nan"),
                     "main": hit / total if total else 0.0, "samples": total}
    p.kill()
    p.wait()
    return res


def run_perf(cmd, seconds, work):
    p, pid = start(cmd, seconds + 4)
    data = os.path.join(work, "perf.data")
    go(p)
    t0 = time.time()
    r = subprocess.Popen(["perf", "record", "-q", "-F", "99", "--call-graph", "dwarf,16384",
                          "-p", str(pid), "-o", data, "--", "sleep", str(seconds)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, _, ru = os.wait4(r.pid, 0)
    record_cpu = ru.ru_utime + ru.ru_stime
    p.kill()
    p.wait()
    s = subprocess.run(["perf", "script", "-i", data, "-F", "comm,ip,sym"], capture_output=True,
                       text=True)
    hit = total = 0
    stack = []
    for line in s.stdout.splitlines() + [""]:
        if not line.strip():
            if stack:
                total += 1
                hit += any(fr in MAIN for fr in stack)
            stack = []
            continue
        parts = line.split()
        if len(parts) >= 2 and not line.startswith(("\t", " ")):
            stack = []  # the sample's header line
        elif len(parts) >= 2:
            stack.append(parts[1].split("+")[0])
    return {"main": hit / total if total else 0.0, "samples": total,
            "cpu": record_cpu / (time.time() - t0)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=int, default=8)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--only", action="append", help="measure only this workload (repeatable)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        die("needs root (BPF, perf, kernel.bpf_stats_enabled)")
    ember = os.environ.get("EMBER_BIN") or os.path.join(TARGET, "release", "ember")
    for tool in ("bpftool", "perf"):
        if not shutil.which(tool):
            die(f"{tool} not found: run `make bench` (it installs it)")
    old = open("/proc/sys/kernel/bpf_stats_enabled").read().strip()
    with open("/proc/sys/kernel/bpf_stats_enabled", "w") as f:
        f.write("1")
    rows = []
    try:
        with tempfile.TemporaryDirectory() as work:
            exes = build(os.path.join(TARGET, "bench"))
            for name, cmd in exes.items():
                if args.only and name not in args.only:
                    continue
                res = {"frame_pointer": [], "auto": [], "perf": [], "ratio": []}
                for i in range(args.runs):
                    modes = ("frame_pointer", "auto")[::1 if i % 2 == 0 else -1]
                    both = run_embers(ember, cmd, modes, args.seconds, work)
                    for mode in modes:
                        r = both[mode]
                        log(f"{name} {mode} run {i + 1}: {r['ns'] / 1000:.2f} µs/sample, "
                            f"{r['main'] * 100:.1f} % reach main of {r['samples']}")
                        res[mode].append(r)
                    res["ratio"].append({"x": both["auto"]["ns"] / both["frame_pointer"]["ns"]})
                    log(f"{name} run {i + 1}: auto / frame_pointer {res['ratio'][-1]['x']:.2f}×")
                    r = run_perf(cmd, args.seconds, work)
                    log(f"{name} perf dwarf run {i + 1}: {r['main'] * 100:.1f} % reach main of "
                        f"{r['samples']}, perf record {r['cpu'] * 100:.2f} % of a core")
                    res["perf"].append(r)
                rows.append((name, res))
    finally:
        with open("/proc/sys/kernel/bpf_stats_enabled", "w") as f:
            f.write(old)

    def med(rs, key):
        return statistics.median(r[key] for r in rs)

    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    out = [f"Measured {now} (`bench/stacks.py`) on kernel {platform.release()}, "
           f"{os.cpu_count()} CPUs; medians of {args.runs} runs of {args.seconds} s each. "
           "In each run ember's two modes sample the same workload at once (one agent each, "
           "attached in alternating order), and the ratio is the median of the runs' own "
           "ratios; perf runs after them on a fresh workload.\n",
           "| workload | BPF µs/sample, frame_pointer | BPF µs/sample, auto (tables) | ratio | "
           "reach main, frame_pointer | reach main, auto | reach main, perf dwarf | "
           "perf record CPU |",
           "|---|---|---|---|---|---|---|---|"]
    for name, res in rows:
        fp, auto = med(res["frame_pointer"], "ns"), med(res["auto"], "ns")
        ratio = med(res["ratio"], "x")
        out.append(f"| {name} | {fp / 1000:.2f} | {auto / 1000:.2f} | {ratio:.2f}× | "
                   f"{med(res['frame_pointer'], 'main') * 100:.1f} % | "
                   f"{med(res['auto'], 'main') * 100:.1f} % | "
                   f"{med(res['perf'], 'main') * 100:.1f} % | "
                   f"{med(res['perf'], 'cpu') * 100:.2f} % of a core |")
    section = "\n".join(out) + "\n"
    print(section)
    if args.no_write:
        return
    path = oh.results_path(BEGIN)
    text = open(path).read()
    block = f"{BEGIN}\n{section}{END}\n"
    if BEGIN in text and END in text:
        pre, rest = text.split(BEGIN, 1)
        text = pre + block + rest.split(END, 1)[1].lstrip("\n")
    else:
        text = text.rstrip("\n") + "\n\n### Stacks: unwind tables against frame pointers and " \
            "perf dwarf\n\n" + block
    with open(path, "w") as f:
        f.write(text)
    log(f"wrote {path}")


if __name__ == "__main__":
    main()
