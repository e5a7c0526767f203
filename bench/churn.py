#!/usr/bin/env python3
"""Cost of process churn: ember's CPU per new process and its window lateness under a spawn storm.

Run by `make bench` (as root). Python 3 stdlib only.

ember runs as a fleet agent is deployed: whole host, inside a CPU-limited cgroup (the Helm
chart's limit, 500m: cgroup v1 `cpu.cfs_quota_us` 50000 per 100000, or a v2 `cpu.max`), with
--window seconds windows. For each rate of new processes (0, then each of --rates, interleaved
run by run, --runs runs each; medians reported) a spawner starts short processes (`sh -c
'cat /etc/hostname'` by default: a fork, two execs, a read) at that rate for --seconds, and
the bench measures:
  - ember's CPU (the cgroup's own counter), % of one core, and per new process (the run's CPU
    minus the no-churn run's, over the processes the host started: /proc/stat `processes`);
  - window lateness: when ember printed (stderr) each window's line minus the window's end (its start
    and length are in the line), median and worst of the windows closed during the storm;
  - the longest gap between two window lines (a window held back shows here);
  - the CPU of ember's busiest threads (/proc/PID/task/*/schedstat);
  - new processes the unwind loader did not read in full
    (`ember_cache_dropped_total{cache="process_reads"}`, from /metrics).
Prints a markdown table; --write puts it into BENCHMARKS.md between the churn markers.
"""

import argparse
import os
import platform
import re
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import overhead as oh  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EMBER = os.environ.get("EMBER_BIN", os.path.join(ROOT, "target/release/ember"))
LINE = re.compile(r"^ember: window (\S+) ([\d.]+)s: (\d+) samples")
PORT = 29464


class Cgroup:
    """A CPU-limited cgroup (v1 cpu+cpuacct, else v2) that the agent runs in."""

    def __init__(self, name, quota_us, period_us=100000):
        self.v1 = os.path.isdir("/sys/fs/cgroup/cpu") and os.path.isdir("/sys/fs/cgroup/cpuacct")
        if self.v1:
            self.dirs = [f"/sys/fs/cgroup/cpu/{name}", f"/sys/fs/cgroup/cpuacct/{name}"]
        else:
            self.dirs = [f"/sys/fs/cgroup/{name}"]
        for d in self.dirs:
            os.makedirs(d, exist_ok=True)
        if self.v1:
            open(f"{self.dirs[0]}/cpu.cfs_period_us", "w").write(str(period_us))
            open(f"{self.dirs[0]}/cpu.cfs_quota_us", "w").write(str(quota_us))
        else:
            open(f"{self.dirs[0]}/cpu.max", "w").write(f"{quota_us} {period_us}")

    def enter(self):
        """Moves the calling process in (used as a child's preexec_fn)."""
        for d in self.dirs:
            with open(f"{d}/cgroup.procs", "w") as f:
                f.write(str(os.getpid()))

    def cpu_seconds(self):
        if self.v1:
            return int(open(f"{self.dirs[1]}/cpuacct.usage").read()) / 1e9
        for line in open(f"{self.dirs[0]}/cpu.stat"):
            k, v = line.split()
            if k == "usage_usec":
                return int(v) / 1e6
        return 0.0

    def throttled(self):
        path = f"{self.dirs[0]}/cpu.stat"
        for line in open(path):
            k, v = line.split()
            if k in ("throttled_time", "throttled_usec"):
                return int(v) / (1e9 if k == "throttled_time" else 1e6)
        return 0.0

    def remove(self):
        for d in self.dirs:
            try:
                os.rmdir(d)
            except OSError:
                pass


def processes_started():
    for line in open("/proc/stat"):
        if line.startswith("processes "):
            return int(line.split()[1])
    return 0


def parse_ts(s):
    """RFC 3339 with nanoseconds, UTC → seconds since the epoch."""
    m = re.match(r"(\d+)-(\d+)-(\d+)T(\d+):(\d+):(\d+)(?:\.(\d+))?Z", s)
    if not m:
        return None
    y, mo, d, h, mi, se = (int(x) for x in m.groups()[:6])
    frac = float("0." + m.group(7)) if m.group(7) else 0.0
    import calendar
    return calendar.timegm((y, mo, d, h, mi, se)) + frac


def reader(proc, lines):
    for raw in proc.stderr:
        m = LINE.match(raw.decode(errors="replace"))
        if m:
            start = parse_ts(m.group(1))
            if start is not None:
                lines.append((time.time(), start, float(m.group(2)), int(m.group(3))))


def spawner(rate, seconds, cmd, stop):
    """Starts cmd `rate` times a second (paced, children reaped); returns how many started."""
    n, t0 = 0, time.time()
    end = t0 + seconds
    while time.time() < end and not stop.is_set():
        try:
            subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            n += 1
        except OSError:
            pass
        d = t0 + n / rate - time.time()
        if d > 0:
            time.sleep(d)
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            pass
    return n


def scrape(name):
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{PORT}/metrics", timeout=5).read().decode()
    except OSError:
        return None
    total = 0.0
    found = False
    for line in body.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            try:
                total += float(line.rsplit(" ", 1)[1])
                found = True
            except ValueError:
                pass
    return total if found else None


def run(rate, args, tmp, cg):
    data = os.path.join(tmp, f"w-{rate}")
    cfg = args.config
    if not cfg:
        cfg = os.path.join(tmp, "ember.yaml")
        with open(cfg, "w") as f:
            f.write("kubernetes:\n  enabled: false\n")
    ember = subprocess.Popen([EMBER, "run", "--config", cfg, "--data-dir", data, "--window", f"{args.window}s",
                              "--listen", f"127.0.0.1:{PORT}"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=cg.enter)
    lines = []
    t = threading.Thread(target=reader, args=(ember, lines), daemon=True)
    t.start()
    stop = threading.Event()
    try:
        # Warm: the first window closed (the host's processes are known) and one more second.
        end = time.time() + 90
        while not lines and time.time() < end:
            time.sleep(0.2)
        if not lines:
            sys.exit("ember printed no window in 90 s")
        time.sleep(1)
        c0, p0, t0, th0 = cg.cpu_seconds(), processes_started(), time.time(), cg.throttled()
        thr0 = oh.thread_ns(ember.pid)
        spawned = spawner(rate, args.seconds, args.cmd, stop) if rate else (time.sleep(args.seconds) or 0)
        c1, p1, t1, th1 = cg.cpu_seconds(), processes_started(), time.time(), cg.throttled()
        thr1 = oh.thread_ns(ember.pid)
        # Fractions of one core by thread name, from the scheduler's run time.
        threads = {k: v / 100 for k, v in oh.per_thread(thr0, thr1, t1 - t0).items()}
        drops = scrape('ember_cache_dropped_total{cache="process_reads"}')
        # Windows that ended during the storm, and the ones up to two windows after it (a
        # backlog shows as lateness there).
        time.sleep(2 * args.window)
        during = [l for l in lines if t0 <= l[1] + l[2] <= t1 + 2 * args.window]
        late = [max(0.0, seen - (start + dur)) for seen, start, dur, _ in during]
        printed = [seen for seen, _, _, _ in lines if seen >= t0]
        gaps = [b - a for a, b in zip([t0] + printed, printed + [time.time()])]
        return {
            "cpu": (c1 - c0) / (t1 - t0),
            "throttled": (th1 - th0) / (t1 - t0),
            "procs": (p1 - p0) / (t1 - t0),
            "spawned": spawned / (t1 - t0),
            "late_med": statistics.median(late) if late else None,
            "late_max": max(late) if late else None,
            "windows": len(during),
            "gap_max": max(gaps) if gaps else None,
            "drops": drops,
            "threads": threads,
        }
    finally:
        stop.set()
        ember.send_signal(signal.SIGINT)
        try:
            ember.wait(30)
        except subprocess.TimeoutExpired:
            ember.kill()
            ember.wait()


def median(runs, key):
    if key == "threads":
        names = {n for r in runs for n in r["threads"]}
        return {n: statistics.median(r["threads"].get(n, 0.0) for r in runs) for n in names}
    vals = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(vals) if vals else None


def fmt(v, spec, scale=1.0):
    return "-" if v is None else f"{v * scale:{spec}}"


def table(res, args):
    m = {rate: {k: median(runs, k) for k in runs[0]} for rate, runs in res.items()}
    base = m[0]["cpu"]
    rev = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                         text=True).stdout.strip()
    load = open("/proc/loadavg").read().split()[:3]
    rates = list(res)
    head = ["no churn" if r == 0 else f"{r}/s" for r in rates]
    rows = [
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} (`bench/churn.py`) on kernel "
        f"{platform.release()}, {os.cpu_count()} CPUs, ember {rev}; load average after the runs "
        f"{' '.join(load)} (other builds share the host). ember whole host, `--window {args.window}s`, in a "
        f"cgroup limited to {args.quota}% of a core (the chart's 500m); spawner: `{shlex.join(args.cmd)}` at "
        f"each rate for {args.seconds:.0f} s. Medians of {args.runs} runs per rate, interleaved.",
        "",
        "| | " + " | ".join(head) + " |",
        "|---|" + "---|" * len(rates),
    ]

    def row(label, key, spec, scale=1.0, extra=None):
        cells = [fmt(m[r].get(key), spec, scale) for r in rates]
        return f"| {label} | " + " | ".join(cells) + " |"

    rows.append(row("new processes/s on the host (/proc/stat)", "procs", ".0f"))
    rows.append(row("ember CPU, % of one core (cgroup counter)", "cpu", ".1f", 100))
    rows.append(row("time throttled by the CPU limit, % of wall time", "throttled", ".1f", 100))
    per = []
    for r in rates:
        c, p, p0 = m[r]["cpu"], m[r]["procs"], m[0]["procs"]
        per.append("-" if r == 0 or not p or p <= p0 else f"{(c - base) / (p - p0) * 1e6:.0f}")
    rows.append("| ember CPU per new process, µs (over no churn) | " + " | ".join(per) + " |")
    rows.append(row("window lateness, median, s", "late_med", ".2f"))
    rows.append(row("window lateness, worst, s", "late_max", ".2f"))
    rows.append(row(f"longest gap between window lines, s (window {args.window} s)", "gap_max", ".1f"))
    rows.append(row("new processes not read in full (`cache_dropped_total{cache=\"process_reads\"}`)",
                    "drops", ".0f"))
    busiest = []
    for r in rates:
        t = sorted(m[r]["threads"].items(), key=lambda kv: -kv[1])[:3]
        busiest.append(", ".join(f"{n.removeprefix('ember-')} {100 * v:.1f}" for n, v in t) or "-")
    rows.append("| busiest threads, % of one core | " + " | ".join(busiest) + " |")
    return "\n".join(rows)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rates", type=int, nargs="+", default=[20, 100, 200])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--window", type=int, default=10)
    ap.add_argument("--quota", type=int, default=50, help="CPU limit, % of one core")
    ap.add_argument("--cmd", default="sh -c 'cat /etc/hostname'", help="command line (shell words)")
    ap.add_argument("--config", help="ember configuration (default: the embedded one, no Kubernetes)")
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    args.cmd = shlex.split(args.cmd)
    if os.geteuid() != 0:
        sys.exit("bench/churn.py needs root")
    cg = Cgroup(f"ember-bench-churn-{os.getpid()}", args.quota * 1000)
    res = {r: [] for r in [0] + args.rates}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for i in range(args.runs):
                for rate in res:
                    r = run(rate, args, tmp, cg)
                    res[rate].append(r)
                    print(f"run {i + 1} {rate}/s: " + ", ".join(
                        f"{k} {v:.4g}" for k, v in r.items() if isinstance(v, float)), flush=True)
    finally:
        cg.remove()
    text = table(res, args)
    print(text)
    if args.write:
        begin, end = "<!-- churn:begin -->", "<!-- churn:end -->"
        path = oh.results_path(begin)
        doc = open(path).read()
        block = f"{begin}\n{text}\n{end}"
        if begin in doc:
            doc = re.sub(re.escape(begin) + ".*?" + re.escape(end), lambda _: block, doc, flags=re.S)
        else:
            doc += f"\n## Process churn (bench/churn.py)\n\n{block}\n"
        open(path, "w").write(doc)


if __name__ == "__main__":
    main()
