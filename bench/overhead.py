#!/usr/bin/env python3
"""ember's overhead against its targets and against `perf record`, on a busy machine.

Run by `make bench` (as root, after the criterion benches). Python 3 stdlib only.

What it does:
  1. builds the cpu_hog fixture with clang into target/bench/ and starts two of
     them (one per core on the 2-core CI machine);
  2. enables kernel.bpf_stats_enabled (the old value is restored on exit);
  3. runs `ember run --window 10s --frequency 99` (whole host) --runs times (3) and, from
     20 s after its perf events are attached (steady), for 30 s, reads each thread's run
     time (/proc/PID/task/TID/schedstat) and VmRSS every second, and scrapes its /metrics
     at the start and the end; the table holds the medians of the runs (this VM is noisy:
     one run's steady CPU moves by a third), and each run's steady CPU beside them;
  4. reads the BPF program's run_time_ns / run_cnt (`bpftool prog show -j`,
     program name starting with ember_sample);
  5. runs `perf record -F 99 -ag -o <tmp>/perf.data -- sleep 30` on the same
     workload and takes its CPU time and max RSS from wait4(), then the CPU of
     `perf report --stdio` on that file (what a perf user pays for names);
  6. runs `ember record --duration 30s` on the same workload (its whole CPU time
     and peak RSS: it symbolizes and writes before it exits), and also reports
     `ember run`'s steady CPU by thread;
  7. prints a markdown table (metric | ember | target | perf record) and writes
     it into BENCHMARKS.md between the overhead markers, with the date, kernel,
     and CPU count.

With --unwind-compare it instead runs `ember run` whole-host with
`sampling.unwind: frame_pointer` (no tables: the frame-pointer-only agent) and
`auto` (the default), interleaved, --runs times each, and writes the medians side
by side (section "unwind" of BENCHMARKS.md): what unwinding tables costs on the
same workload in the same run. With --dwarf-compare it does the same with `symbols.dwarf`
off and on, while ember's own debug build (--debug-exe, default target/debug/ember: 100 MB+
of full DWARF) runs whole-host beside the hogs (section "dwarf"): what DWARF lines cost, and
the RSS they hold, on a host running a large binary with full debug info.

With --bpftrace-compare it runs `ember run` (whole host, default config) and then
`bpftrace -e 'profile:hz:99 { @[kstack, ustack, comm] = count(); }'`, each alone, interleaved,
--runs times each, and compares their BPF time per sample (run_time_ns / run_cnt of the
programs each holds, between a reading 10 s after its perf events are attached and one
--seconds later: start-up excluded); section "bpftrace" of BENCHMARKS.md, with the ratio of
the medians against its target (≤ 0.75×). bpftrace is not installed here: `make bench-deps`.

Options: --seconds N (default 30), --frequency HZ (99), --runs N (3), --no-write (print only),
--pids-only (profile only the cpu_hog pids: `ember run --pid ...` and
`perf record -g -p ...`; for a busy shared machine, where whole-host numbers
mostly measure the other work). Each mode has its own section in BENCHMARKS.md.
Environment: EMBER_BIN (default target/release/ember), CLANG (default clang).
"""

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET = os.environ.get("CARGO_TARGET_DIR") or os.path.join(ROOT, "target")
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
MODES = {
    "unwind": "Whole host: unwind tables on and off (`bench/overhead.py --unwind-compare`)",
    "dwarf": "Whole host with a 100 MB+ full-debug binary running: DWARF lines on and off "
             "(`bench/overhead.py --dwarf-compare`)",
    "bpftrace": "Whole host: BPF time per sample against bpftrace's "
                "(`bench/overhead.py --bpftrace-compare`)",
    "host": "Whole host (what `make bench` runs)",
    "pids": "Only the workload's processes (`bench/overhead.py --pids-only`)",
    "python": "Python frames walked and not, on Python processes (`bench/python.py`)",
    "python-service": "Python frames walked and not, on a lightly loaded Python service "
                      "(`bench/python.py --service`)",
}


def markers(mode):
    return (f"<!-- overhead:{mode}:begin (written by bench/overhead.py; edits inside are "
            f"overwritten) -->", f"<!-- overhead:{mode}:end -->")

# Targets (from the project brief).
TARGET_USER_CPU_PCT = 0.10  # ember's threads, % of one core (symbolization issue)
WARMUP_S = 20.0  # steady figures start this long after ember attaches
TARGET_BPF_US = 5.0  # BPF time per sample, microseconds
TARGET_RSS_MB = 24.0  # steady RSS
TARGET_PEAK_MB = 48.0  # peak RSS, first window included
TARGET_STACKS_PCT = 99.9  # samples with stacks
TARGET_VS_PERF = 0.5  # ember CPU / perf record CPU
TARGET_VS_BPFTRACE = 0.75  # ember's BPF time per sample / bpftrace's (medians)
BPFTRACE_WARMUP_S = 10.0  # --bpftrace-compare: steady readings start this long after attaching
# What a bpftrace user writes for a whole-host CPU profile (its ustack follows frame pointers,
# as perf's does).
BPFTRACE_SCRIPT = "profile:hz:{hz} {{ @[kstack, ustack, comm] = count(); }}"


def log(msg):
    print(f"[overhead] {msg}", file=sys.stderr, flush=True)


def die(msg):
    print(f"overhead: {msg}", file=sys.stderr)
    sys.exit(1)


def proc_ticks(pid):
    """utime + stime of a live process, in clock ticks (None once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
        return int(rest[11]) + int(rest[12])
    except (OSError, IndexError, ValueError):
        return None


def proc_status_kb(pid, key):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def thread_ns(pid):
    """{tid: (comm, ns on CPU)} of a live process's threads, from /proc/.../schedstat: the
    scheduler's own run time, to the nanosecond (utime/stime are sampled at the clock tick,
    one tick being 0.033 % of a core over 30 s: too coarse for an agent near 0.1 %)."""
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                comm = f.read().strip()
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                out[tid] = (comm, int(f.read().split()[0]))
        except (OSError, ValueError, IndexError):
            pass
    return out


def cpu_ns_between(before, after):
    """ns on CPU between two thread_ns() readings (threads started since count from 0)."""
    return sum(ns - before.get(tid, (comm, 0))[1] for tid, (comm, ns) in after.items())


def per_thread(before, after, elapsed):
    """% of one core by thread name over `elapsed` s (threads of a name summed)."""
    by = {}
    for tid, (comm, t1) in after.items():
        t0 = before.get(tid, (comm, 0))[1]
        by[comm] = by.get(comm, 0) + (t1 - t0)
    return {c: 100 * t / 1e9 / elapsed for c, t in sorted(by.items())}


def host_busy_seconds():
    """Non-idle CPU time of the whole host so far (all CPUs), from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal guest guest_nice
    user, nice, system, _idle, _iowait, irq, softirq, steal = v[:8]
    return (user + nice + system + irq + softirq + steal) / CLK_TCK


def count_perf_fds(pid):
    n = 0
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                if "perf_event" in os.readlink(f"/proc/{pid}/fd/{fd}"):
                    n += 1
            except OSError:
                pass
    except OSError:
        pass
    return n


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(addr):
    with urllib.request.urlopen(f"http://{addr}/metrics", timeout=5) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)", line)
        if m:
            try:
                out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
            except ValueError:
                pass
    return out


def metric_sum(metrics, name):
    return sum(v for k, v in metrics.items() if k == name or k.startswith(name + "{"))


def bpf_prog_stats(pid):
    """(programs, run_time_ns, run_cnt) summed over BPF programs named ember_sample*
    held by `pid` (when bpftool can tell which process holds a program)."""
    out = subprocess.run(["bpftool", "prog", "show", "-j"], capture_output=True, text=True, check=True)
    progs = json.loads(out.stdout)
    ns = cnt = 0
    found = 0
    for p in progs:
        holders = [h.get("pid") for h in p.get("pids", [])]
        if holders and pid not in holders:
            continue
        if str(p.get("name", "")).startswith("ember_sample"):
            found += 1
            ns += int(p.get("run_time_ns", 0))
            cnt += int(p.get("run_cnt", 0))
    return found, ns, cnt


def build_cpu_hog(out_dir):
    clang = os.environ.get("CLANG", "clang")
    if not shutil.which(clang):
        die(f"{clang} not found: run `make deps`")
    os.makedirs(out_dir, exist_ok=True)
    exe = os.path.join(out_dir, "cpu_hog")
    src = os.path.join(ROOT, "tests", "fixtures", "cpu_hog.c")
    subprocess.run(
        [clang, "-O2", "-g", "-fno-omit-frame-pointer", "-mno-omit-leaf-frame-pointer",
         "-pthread", "-o", exe, src],
        check=True,
    )
    return exe


def start_hog(exe, seconds):
    p = subprocess.Popen([exe, "--seconds", str(seconds)], stdout=subprocess.PIPE,
                         stdin=subprocess.DEVNULL, text=True)
    first = p.stdout.readline().strip()
    ready = p.stdout.readline().strip()
    if not first.startswith("pid ") or ready != "ready":
        die(f"cpu_hog printed {first!r}, {ready!r}")
    return p


def wait4(proc):
    """Reaps a Popen child with wait4: (exit status, rusage)."""
    _, status, ru = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, ru


def measure_ember(ember, hogs, seconds, hz, workdir, pids_only, unwind=None, extra=None):
    data = os.path.join(workdir, "windows")
    shutil.rmtree(data, ignore_errors=True)
    addr = f"127.0.0.1:{free_port()}"
    errf = open(os.path.join(workdir, "ember.stderr"), "w+")
    cmd = [ember, "run", "--window", "10s", "--frequency", str(hz), "--data-dir", data,
           "--listen", addr]
    if unwind or extra:
        # The table cache stays in the work dir: the first auto run compiles, later ones read it.
        config = os.path.join(workdir, f"unwind-{unwind}.yaml")
        with open(config, "w") as f:
            f.write(f"sampling:\n  unwind: {unwind or 'auto'}\n"
                    f"  unwind_cache_dir: {os.path.join(workdir, 'unwind-cache')}\n")
            f.write(extra or "")
        cmd += ["--config", config]
    if pids_only:
        for h in hogs:
            cmd += ["--pid", str(h.pid)]
    log(" ".join(cmd))
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=errf, stderr=errf)
    t_start = time.monotonic()
    ncpu = os.cpu_count() or 1
    while count_perf_fds(proc.pid) < ncpu:
        if proc.poll() is not None:
            errf.seek(0)
            die(f"ember exited with {proc.returncode} before sampling:\n{errf.read()}")
        if time.monotonic() - t_start > 30:
            die("ember did not open its perf events within 30 s")
        time.sleep(0.02)
    startup = time.monotonic() - t_start
    # Steady means after WARMUP (the issue's "after 20 s"): the first windows build the
    # symbol and unwind tables of everything running. Peak RSS still covers them.
    time.sleep(WARMUP_S)
    for _ in range(100):
        try:
            m0 = scrape(addr)
            break
        except OSError:
            time.sleep(0.1)
    else:
        die(f"no /metrics on {addr}")
    t0 = time.monotonic()
    threads0 = thread_ns(proc.pid)
    busy0 = host_busy_seconds()
    hog0 = sum(proc_ticks(h.pid) or 0 for h in hogs)
    rss, hwm = [], []
    for i in range(seconds):
        time.sleep(max(0.0, t0 + i + 1 - time.monotonic()))
        r = proc_status_kb(proc.pid, "VmRSS")
        h = proc_status_kb(proc.pid, "VmHWM")
        if r is not None:
            rss.append(r)
        if h is not None:
            hwm.append(h)
    threads1 = thread_ns(proc.pid)
    busy1 = host_busy_seconds()
    hog1 = sum(proc_ticks(h.pid) or 0 for h in hogs)
    m1 = scrape(addr)
    t1 = time.monotonic()
    found, bpf_ns, bpf_cnt = bpf_prog_stats(proc.pid)
    proc.send_signal(signal.SIGTERM)
    code, ru = wait4(proc)
    errf.seek(0)
    stderr = errf.read()
    errf.close()
    if code != 0:
        log(f"warning: ember exited {code} after SIGTERM:\n{stderr}")
    windows = sorted(f for f in os.listdir(data) if f.endswith(".pb.gz")) if os.path.isdir(data) else []
    elapsed = t1 - t0

    samples = metric_sum(m1, "ember_samples_total") - metric_sum(m0, "ember_samples_total")
    lost = metric_sum(m1, "ember_samples_lost_total") - metric_sum(m0, "ember_samples_lost_total")
    stack_err = metric_sum(m1, "ember_stack_errors_total") - metric_sum(m0, "ember_stack_errors_total")
    lost_by = {k: v - m0.get(k, 0) for k, v in m1.items() if k.startswith("ember_samples_lost_total")}
    steady = rss[-20:] if len(rss) >= 20 else rss
    return {
        "startup_s": startup,
        "elapsed_s": elapsed,
        "cpu_s": cpu_ns_between(threads0, threads1) / 1e9,
        "threads": per_thread(threads0, threads1, elapsed),
        "cpu_total_s": ru.ru_utime + ru.ru_stime,
        "life_s": time.monotonic() - t_start,
        "rss_steady_mb": statistics.median(steady) / 1024 if steady else float("nan"),
        "rss_peak_mb": max(hwm + rss + [ru.ru_maxrss]) / 1024,
        "bpf_progs": found,
        "bpf_ns": bpf_ns,
        "bpf_cnt": bpf_cnt,
        "samples": samples,
        "metrics": m1,
        "lost": lost,
        "lost_by": lost_by,
        "stack_errors": stack_err,
        "host_busy_s": busy1 - busy0,
        "hog_cpu_s": (hog1 - hog0) / CLK_TCK,
        "windows": len(windows),
        "stderr_tail": "\n".join(stderr.splitlines()[-8:]),
    }


def median_of_runs(runs):
    """One result from several runs of measure_ember: the median of each figure, by thread
    too, with every run's steady CPU kept (`cpu_pct_runs`) so the spread stays visible."""
    out = dict(runs[0])
    for k, v in runs[0].items():
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out[k] = statistics.median(r[k] for r in runs)
    names = sorted({t for r in runs for t in r["threads"]})
    out["threads"] = {t: statistics.median(r["threads"].get(t, 0.0) for r in runs) for t in names}
    lost = sorted({k for r in runs for k in r["lost_by"]})
    out["lost_by"] = {k: statistics.median(r["lost_by"].get(k, 0) for r in runs) for k in lost}
    out["cpu_pct_runs"] = [100 * r["cpu_s"] / r["elapsed_s"] for r in runs]
    out["rss_peak_mb"] = max(r["rss_peak_mb"] for r in runs)
    return out


def measure_perf(hogs, seconds, hz, workdir, pids_only):
    perf = shutil.which("perf")
    if not perf:
        return None
    out = os.path.join(workdir, "perf.data")
    if pids_only:
        target = ["-g", "-p", ",".join(str(h.pid) for h in hogs)]
    else:
        target = ["-ag"]
    cmd = [perf, "record", "-F", str(hz)] + target + ["-o", out, "--", "sleep", str(seconds)]
    log(" ".join(cmd))
    busy0 = host_busy_seconds()
    hog0 = sum(proc_ticks(h.pid) or 0 for h in hogs)
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    code, ru = wait4(proc)
    elapsed = time.monotonic() - t0
    busy1 = host_busy_seconds()
    hog1 = sum(proc_ticks(h.pid) or 0 for h in hogs)
    err = proc.stderr.read().decode(errors="replace")
    if code != 0:
        log(f"perf record exited {code}: {err}")
        return None
    # What a perf user pays to read the profile: `perf report` symbolizes after the run.
    with open(os.devnull, "w") as null:
        rp = subprocess.Popen([perf, "report", "-i", out, "--stdio"], stdin=subprocess.DEVNULL,
                              stdout=null, stderr=null)
        _, rru = wait4(rp)
    samples = None
    rep = subprocess.run([perf, "report", "-i", out, "--stats"], capture_output=True, text=True)
    m = re.search(r"SAMPLE events:\s+(\d+)", rep.stdout)
    if m:
        samples = int(m.group(1))
    # perf record's own CPU includes `sleep` (its child), which is negligible.
    return {
        "elapsed_s": elapsed,
        "sleep_s": seconds,
        "cpu_s": ru.ru_utime + ru.ru_stime,
        "report_cpu_s": rru.ru_utime + rru.ru_stime,
        "rss_peak_mb": ru.ru_maxrss / 1024,
        "samples": samples,
        "host_busy_s": busy1 - busy0,
        "hog_cpu_s": (hog1 - hog0) / CLK_TCK,
    }


def measure_record(ember, hogs, seconds, hz, workdir, pids_only):
    """`ember record` for `seconds` on the same workload: its whole CPU time and peak RSS
    (it symbolizes and writes the profile before it exits, as perf report does)."""
    out = os.path.join(workdir, "record.pb.gz")
    cmd = [ember, "record", "--duration", f"{seconds}s", "--frequency", str(hz), "-o", out]
    if pids_only:
        for h in hogs:
            cmd += ["--pid", str(h.pid)]
    log(" ".join(cmd))
    with open(os.devnull, "w") as null:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=null, stderr=null)
        code, ru = wait4(proc)
    if code != 0 or not os.path.exists(out):
        log(f"ember record exited {code}")
        return None
    return {"cpu_s": ru.ru_utime + ru.ru_stime, "rss_peak_mb": ru.ru_maxrss / 1024}


def fmt_pct(x, digits=3):
    return f"{x:.{digits}f} %"


def table(e, p, hz, pids_only, r=None):
    runs = e.get("cpu_pct_runs") or [100 * e["cpu_s"] / e["elapsed_s"]]
    core_pct = statistics.median(runs)
    bpf_us = e["bpf_ns"] / e["bpf_cnt"] / 1000 if e["bpf_cnt"] else float("nan")
    busy = e["hog_cpu_s"] if pids_only else e["host_busy_s"]
    expected = hz * busy
    delivered_pct = 100 * e["samples"] / expected if expected else float("nan")
    attempted = e["samples"] + e["lost"]
    with_stacks = 100 * (e["samples"] - e["stack_errors"]) / attempted if attempted else float("nan")
    rows = []

    def row(metric, ember, target, perf, ok=None):
        mark = "" if ok is None else (" ✅" if ok else " ❌")
        rows.append(f"| {metric} | {ember}{mark} | {target} | {perf} |")

    p_core = p_ratio = p_samples = p_rss = "n/a"
    if p:
        p_core = fmt_pct(100 * p["cpu_s"] / p["elapsed_s"])
        p_rss = f"{p['rss_peak_mb']:.1f} MB (max)"
        if p["samples"] is not None:
            if pids_only:
                pexp = hz * p["hog_cpu_s"]
            else:
                # perf -a samples idle CPUs too: expect every CPU for the whole run.
                pexp = hz * (os.cpu_count() or 1) * p["sleep_s"]
            p_samples = f"{p['samples']} / {pexp:.0f} ({100 * p['samples'] / pexp:.2f} %)"
    spread = "" if len(runs) < 2 else " (runs: " + ", ".join(f"{x:.3f}" for x in runs) + ")"
    row(f"CPU of its threads (user + kernel, schedstat), % of one core (steady, {'cpu_hog pids' if pids_only else 'whole host'}; median)",
        fmt_pct(core_pct) + spread,
        f"≤ {TARGET_USER_CPU_PCT} %", p_core, core_pct <= TARGET_USER_CPU_PCT)
    # Not against perf: `ember run`'s life includes the warm-up, perf's does not.
    row(f"`ember run`'s whole life ({e['life_s']:.0f} s: start-up, warm-up, the steady "
        f"{round(e['elapsed_s'])} s, exit), CPU (s)", f"{e['cpu_total_s']:.3f} s", "—", "—")
    if r and p:
        both = p["cpu_s"] + p["report_cpu_s"]
        ratio = r["cpu_s"] / both if both else float("inf")
        row(f"`ember record` for {round(e['elapsed_s'])} s, whole CPU (s), against perf record + "
            f"perf report", f"{r['cpu_s']:.3f} s ({ratio:.2f}×), peak {r['rss_peak_mb']:.1f} MB",
            f"≤ {TARGET_VS_PERF}×",
            f"{p['cpu_s']:.3f} s + {p['report_cpu_s']:.3f} s", ratio <= TARGET_VS_PERF)
    row("CPU by thread, % of one core (steady; medians)",
        ", ".join(f"{c} {v:.3f}" for c, v in e["threads"].items() if v > 0) or "all 0",
        "—", "—")
    row("BPF time per sample (run_time_ns / run_cnt)", f"{bpf_us:.2f} µs ({e['bpf_cnt']} runs)",
        f"≤ {TARGET_BPF_US:g} µs", "n/a (no BPF; its handler cost is not exposed)",
        bpf_us <= TARGET_BPF_US)
    row("Steady RSS (median of the last 20 s)", f"{e['rss_steady_mb']:.1f} MB",
        f"≤ {TARGET_RSS_MB:g} MB", p_rss, e["rss_steady_mb"] <= TARGET_RSS_MB)
    row("Peak RSS (VmHWM)", f"{e['rss_peak_mb']:.1f} MB", f"≤ {TARGET_PEAK_MB:g} MB", p_rss,
        e["rss_peak_mb"] <= TARGET_PEAK_MB)
    row("Samples with stacks / samples taken", fmt_pct(with_stacks, 2) +
        f" ({e['samples'] - e['stack_errors']:.0f} / {attempted:.0f})",
        f"≥ {TARGET_STACKS_PCT} %", "—", with_stacks >= TARGET_STACKS_PCT)
    row(f"Samples delivered / expected ({hz} Hz × {'cpu_hog' if pids_only else 'busy'} CPU s)",
        f"{e['samples']:.0f} / {expected:.0f} ({delivered_pct:.2f} %)", "≈ 100 %", p_samples)
    nonzero = {k: v for k, v in e["lost_by"].items() if v}
    row("Samples lost (by reason)",
        ", ".join(f"{k.split('{', 1)[1].rstrip('}') if '{' in k else k}: {v:.0f}"
                  for k, v in sorted(nonzero.items())) or "0", "0", "—")
    return "\n".join(
        ["| metric | ember | target | perf record |", "|---|---|---|---|"] + rows)


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def git_rev():
    try:
        r = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                           capture_output=True, text=True)
        rev = r.stdout.strip() if r.returncode == 0 else "uncommitted"
        d = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--", "agent"],
                           capture_output=True, text=True)
        return rev + (" (+ local changes)" if d.stdout.strip() else "")
    except OSError:
        return "unknown"


def report(e, p, hz, seconds, hogs_n, load, pids_only, r=None):
    nruns = len(e.get("cpu_pct_runs") or [0])
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    if pids_only:
        ember_cmd = f"ember run --window 10s --frequency {hz} --pid <each cpu_hog>"
        perf_cmd = f"perf record -F {hz} -g -p <cpu_hog pids> -- sleep {seconds}"
    else:
        ember_cmd = f"ember run --window 10s --frequency {hz}"
        perf_cmd = f"perf record -F {hz} -ag -- sleep {seconds}"
    head = (
        f"Measured {now} (`bench/overhead.py`{' --pids-only' if pids_only else ''}) on kernel "
        f"{platform.release()}, {os.cpu_count()} CPUs ({cpu_model()}), ember {git_rev()}; load "
        f"average before the run {load}.\n\n"
        f"Workload: {hogs_n} × `cpu_hog` (one busy thread each). `{ember_cmd}` is measured "
        f"{nruns} time{'s' if nruns > 1 else ''} for {seconds} s (medians below), from {WARMUP_S:.0f} s after its perf events are attached "
        f"({e['startup_s']:.2f} s start-up); then "
        f"`{perf_cmd}` runs on the same workload. BPF time is charged to the interrupted tasks, "
        f"not to ember (`kernel.bpf_stats_enabled=1` during the run). Busy CPU during ember's "
        f"run: {e['host_busy_s']:.1f} s (cpu_hog: {e['hog_cpu_s']:.1f} s).\n"
    )
    other = e["host_busy_s"] - e["hog_cpu_s"]
    if other > 0.1 * e["host_busy_s"]:
        if pids_only:
            head += (
                f"\nOther processes used {other:.1f} CPU s during ember's run; ember's BPF program "
                f"still runs (and filters) on their samples, but ember does not process them.\n"
            )
        else:
            head += (
                f"\n**Not a quiet machine:** other processes used {other:.1f} CPU s during ember's "
                f"run (ember profiles and symbolizes them too), so these figures overstate what "
                f"ember costs with only the benchmark workload.\n"
            )
    return head + "\n" + table(e, p, hz, pids_only, r) + "\n"


def results_path(begin):
    """The file that holds a section's begin marker: BENCHMARKS.md (the current headline
    figures) or bench/results/current.md (the latest table of every other harness);
    BENCHMARKS.md for a section not written before."""
    for rel in ("BENCHMARKS.md", os.path.join("bench", "results", "current.md")):
        path = os.path.join(ROOT, rel)
        if os.path.exists(path) and begin in open(path).read():
            return path
    return os.path.join(ROOT, "BENCHMARKS.md")


def write_benchmarks(section, mode):
    begin, end = markers(mode)
    path = results_path(begin)
    block = f"{begin}\n{section}{end}\n"
    if os.path.exists(path):
        text = open(path).read()
    else:
        text = (
            "# Benchmarks\n\n"
            "Micro-benchmarks of the pipeline stages: `cargo bench -p ember` (criterion, "
            "`agent/benches/`).\n\n"
            "## Overhead\n\n"
            "What ember costs on a busy machine, against its targets and against `perf record` "
            "at the same frequency. Regenerate with `make bench` (root).\n"
        )
    if begin in text and end in text:
        pre = text.split(begin, 1)[0]
        post = text.split(end, 1)[1].lstrip("\n")
        text = pre + block + ("\n" + post if post else "")
    else:
        text = text.rstrip("\n") + f"\n\n### {MODES[mode]}\n\n" + block
    with open(path, "w") as f:
        f.write(text)
    log(f"wrote {path}")


# What each comparison runs: mode -> (sampling.unwind, extra YAML), first the baseline.
COMPARES = {
    "unwind": {"frame_pointer": ("frame_pointer", None), "auto": ("auto", None)},
    "dwarf": {"dwarf off": ("auto", "symbols:\n  dwarf: false\n"),
              "dwarf on": ("auto", "symbols:\n  dwarf: true\n")},
}


def start_debug_workload(exe, workdir):
    """Starts ember's own debug build (full DWARF, 100 MB+) as a busy workload: a second
    agent symbolizing the host every second, so its code runs all over its text."""
    data = os.path.join(workdir, "debug-windows")
    cmd = [exe, "run", "--window", "1s", "--data-dir", data, "--listen",
           f"127.0.0.1:{free_port()}"]
    log("debug workload: " + " ".join(cmd))
    return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def compare(kind, ember, hogs, seconds, hz, workdir, runs, load, debug_exe=None):
    """Runs the modes of COMPARES[kind] interleaved; returns the report section."""
    modes = COMPARES[kind]
    results = {m: [] for m in modes}
    for i in range(runs):
        for mode, (unwind, extra) in modes.items():
            e = measure_ember(ember, hogs, seconds, hz, workdir, False, unwind=unwind,
                              extra=extra)
            log(f"run {i + 1}/{runs} {mode}: cpu {100 * e['cpu_s'] / e['elapsed_s']:.3f} %, "
                f"rss {e['rss_steady_mb']:.1f} MB, peak {e['rss_peak_mb']:.1f} MB, bpf "
                f"{e['bpf_ns'] / max(e['bpf_cnt'], 1) / 1000:.2f} µs; by thread {e['threads']}; "
                f"dwarf read {metric_sum(e['metrics'], 'ember_dwarf_read_bytes_total'):.0f} B, "
                f"held {metric_sum(e['metrics'], 'ember_dwarf_cache_bytes'):.0f} B")
            results[mode].append(e)
            time.sleep(1)

    def med(mode, f):
        return statistics.median(f(e) for e in results[mode])

    metrics = [
        ("CPU of its threads, % of one core (steady)", lambda e: 100 * e["cpu_s"] / e["elapsed_s"],
         "{:.3f} %"),
        ("BPF time per sample", lambda e: e["bpf_ns"] / max(e["bpf_cnt"], 1) / 1000, "{:.2f} µs"),
        ("Steady RSS (median of the last 20 s)", lambda e: e["rss_steady_mb"], "{:.1f} MB"),
        ("Peak RSS (VmHWM)", lambda e: e["rss_peak_mb"], "{:.1f} MB"),
        ("Samples delivered", lambda e: e["samples"], "{:.0f}"),
        ("DWARF read in the steady part (`dwarf_read_bytes_total`)",
         lambda e: metric_sum(e["metrics"], "ember_dwarf_read_bytes_total") / 1e6, "{:.1f} MB"),
        ("DWARF held at the end (`dwarf_cache_bytes`)",
         lambda e: metric_sum(e["metrics"], "ember_dwarf_cache_bytes") / 1e6, "{:.1f} MB"),
    ]
    base, other = list(modes)
    rows = [f"| metric | {base} | {other} | {other} / {base} |", "|---|---|---|---|"]
    for name, f, fmt in metrics:
        a, b = med(base, f), med(other, f)
        ratio = f"{b / a:.2f}×" if a else "n/a"
        rows.append(f"| {name} | {fmt.format(a)} | {fmt.format(b)} | {ratio} |")

    def by_thread(mode):
        names = sorted({t for e in results[mode] for t in e["threads"]})
        meds = {t: statistics.median(e["threads"].get(t, 0.0) for e in results[mode]) for t in names}
        return ", ".join(f"{t} {v:.3f}" for t, v in meds.items() if v > 0)

    rows.append(f"| CPU by thread, % of one core (medians) | {by_thread(base)} | "
                f"{by_thread(other)} | — |")
    each = "; ".join(
        f"{m}: " + ", ".join(f"{100 * e['cpu_s'] / e['elapsed_s']:.3f}" for e in results[m])
        for m in modes)
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    busy = statistics.median(e["host_busy_s"] for r in results.values() for e in r)
    hog = statistics.median(e["hog_cpu_s"] for r in results.values() for e in r)
    extra = ""
    if debug_exe:
        extra = (f" Beside them, ember's own debug build ({os.path.getsize(debug_exe) / 1e6:.0f} MB, "
                 f"full DWARF) runs whole-host with 1 s windows: a large busy binary whose "
                 f"addresses keep changing.")
    head = (
        f"Measured {now} (`bench/overhead.py --{kind}-compare`) on kernel {platform.release()}, "
        f"{os.cpu_count()} CPUs ({cpu_model()}), ember {git_rev()}; load average before the "
        f"run {load}.\n\n"
        f"Workload: {len(hogs)} × `cpu_hog`.{extra} `ember run --window 10s --frequency {hz}` "
        f"(whole host) in each mode, interleaved, {runs} runs of {seconds} s each; medians. "
        f"Busy CPU per run: {busy:.1f} s (cpu_hog {hog:.1f} s). Steady CPU of each run, % of "
        f"a core: {each}.\n"
    )
    return head + "\n" + "\n".join(rows) + "\n"


def held_prog_ids(pid):
    """Ids of the BPF programs whose fds `pid` holds, from /proc/PID/fdinfo (`bpftool prog
    show` fills `pids` only when built with its skeletons, which Debian's bpftool 7.1 is not)."""
    ids = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return ids
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") != "anon_inode:bpf-prog":
                continue
            with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                for line in f:
                    if line.startswith("prog_id:"):
                        ids.add(int(line.split()[1]))
        except (OSError, ValueError, IndexError):
            pass
    return ids


def progs_held(pid):
    """{id: (type, name, run_time_ns, run_cnt)} of the BPF programs `pid` holds (bpftool -j)."""
    out = subprocess.run(["bpftool", "prog", "show", "-j"], capture_output=True, text=True,
                         check=True)
    ids = held_prog_ids(pid)
    held = {}
    for p in json.loads(out.stdout):
        if p.get("id") in ids or pid in [h.get("pid") for h in p.get("pids", [])]:
            held[p["id"]] = (p.get("type", ""), str(p.get("name", "")),
                             int(p.get("run_time_ns", 0)), int(p.get("run_cnt", 0)))
    return held


def steady_bpf(name, cmd, stop_sig, select, hogs, seconds, out, errf):
    """Starts `cmd` (a sampler), waits until it has a perf event on every CPU, lets it run
    BPFTRACE_WARMUP_S, then reads the programs it holds twice, `seconds` apart, and stops it
    with `stop_sig`. Returns the differences (start-up and exit excluded): run time and runs of
    the programs `select(type, name)` picks, and every held program's by name."""
    log(" ".join(cmd))
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=errf)
    t_start = time.monotonic()
    ncpu = os.cpu_count() or 1
    while count_perf_fds(proc.pid) < ncpu:
        if proc.poll() is not None:
            errf.seek(0)
            die(f"{name} exited with {proc.returncode} before sampling:\n{errf.read()}")
        if time.monotonic() - t_start > 60:
            proc.kill()
            die(f"{name} did not open its perf events within 60 s")
        time.sleep(0.02)
    startup = time.monotonic() - t_start
    time.sleep(BPFTRACE_WARMUP_S)
    r0 = progs_held(proc.pid)
    t0 = time.monotonic()
    busy0 = host_busy_seconds()
    hog0 = sum(proc_ticks(h.pid) or 0 for h in hogs)
    time.sleep(seconds)
    r1 = progs_held(proc.pid)
    t1 = time.monotonic()
    busy1 = host_busy_seconds()
    hog1 = sum(proc_ticks(h.pid) or 0 for h in hogs)
    alive = proc.poll() is None
    proc.send_signal(stop_sig)
    try:
        code = proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        # bpftrace prints its map on SIGINT, symbolizing every stack of a busy host (minutes);
        # the readings are taken, so nothing measured is lost.
        log(f"{name} still running 30 s after signal {stop_sig}: killed (readings taken)")
        proc.kill()
        proc.wait()
        code = 0
    errf.seek(0)
    stderr = errf.read()
    if not alive:
        die(f"{name} exited ({proc.returncode}) during the steady readings:\n{stderr[-4000:]}")
    if code != 0:
        log(f"warning: {name} exited {code} after signal {stop_sig}:\n{stderr[-2000:]}")
    ns = cnt = 0
    picked, by_name = [], {}
    for prog_id, (ptype, pname, pns, pcnt) in r1.items():
        _, _, ns0, cnt0 = r0.get(prog_id, (ptype, pname, 0, 0))
        d_ns, d_cnt = pns - ns0, pcnt - cnt0
        key = f"{pname or '?'} ({ptype})"
        a, b = by_name.get(key, (0, 0))
        by_name[key] = (a + d_ns, b + d_cnt)
        if select(ptype, pname):
            picked.append(pname)
            ns += d_ns
            cnt += d_cnt
    if not cnt:
        die(f"{name}: no run of its sampling program between the readings (programs held: "
            f"{by_name}); is kernel.bpf_stats_enabled on?")
    return {"startup_s": startup, "elapsed_s": t1 - t0, "progs": sorted(picked), "ns": ns,
            "cnt": cnt, "by_name": by_name, "host_busy_s": busy1 - busy0,
            "hog_cpu_s": (hog1 - hog0) / CLK_TCK}


def bpftrace_compare(ember, hogs, seconds, hz, workdir, runs, load):
    """ember's and bpftrace's BPF time per sample, each alone, interleaved; the report section."""
    bpftrace = shutil.which("bpftrace")
    version = subprocess.run([bpftrace, "--version"], capture_output=True,
                             text=True).stdout.strip() or "bpftrace (version unknown)"
    script = BPFTRACE_SCRIPT.format(hz=hz)

    # ember: its perf_event program ember_sample. ember_walk is reached only by bpf_tail_call
    # (from ember_sample and from itself), and the kernel takes a program's run time and count
    # in __bpf_prog_run() (include/linux/filter.h: sched_clock() around the call of the entry
    # program's bpf_func, added to that program's stats); a tail call jumps into the next
    # program's image without returning there, so the whole chain's time is ember_sample's and
    # ember_walk's own run_cnt stays 0 (logged below, from bpftool: by_name).
    def is_ember(ptype, pname):
        return ptype == "perf_event" and pname.startswith("ember_sample")

    # bpftrace: the program of its profile probe (perf_event; its name is the probe's, cut).
    def is_bpftrace(ptype, _pname):
        return ptype == "perf_event"

    results = {"ember": [], "bpftrace": []}
    for i in range(runs):
        data = os.path.join(workdir, "windows")
        shutil.rmtree(data, ignore_errors=True)
        with open(os.path.join(workdir, "ember.stderr"), "w+") as errf:
            e = steady_bpf("ember", [ember, "run", "--window", "10s", "--frequency", str(hz),
                                     "--data-dir", data, "--listen", f"127.0.0.1:{free_port()}"],
                           signal.SIGTERM, is_ember, hogs, seconds, errf, errf)
        log(f"run {i + 1}/{runs} ember: {e['ns'] / e['cnt'] / 1000:.3f} µs/sample over "
            f"{e['cnt']} runs of {e['progs']}; all held programs (ns, runs): {e['by_name']}")
        results["ember"].append(e)
        time.sleep(1)
        with open(os.path.join(workdir, "bpftrace.stderr"), "w+") as errf, \
                open(os.devnull, "w") as null:
            b = steady_bpf("bpftrace", [bpftrace, "-e", script], signal.SIGINT, is_bpftrace,
                           hogs, seconds, null, errf)
        log(f"run {i + 1}/{runs} bpftrace: {b['ns'] / b['cnt'] / 1000:.3f} µs/sample over "
            f"{b['cnt']} runs of {b['progs']}; all held programs (ns, runs): {b['by_name']}")
        results["bpftrace"].append(b)
        time.sleep(1)
        for h in hogs:
            if h.poll() is not None:
                die(f"cpu_hog {h.pid} exited ({h.returncode}) during the comparison")

    def us(r):
        return r["ns"] / r["cnt"] / 1000

    rows = ["| run | ember (`ember_sample*`) | bpftrace (`profile:hz`) | ember ÷ bpftrace |",
            "|---|---|---|---|"]
    for i, (e, b) in enumerate(zip(results["ember"], results["bpftrace"])):
        rows.append(f"| {i + 1} | {us(e):.2f} µs ({e['cnt']} samples) | {us(b):.2f} µs "
                    f"({b['cnt']} samples) | {us(e) / us(b):.2f}× |")
    me = statistics.median(us(e) for e in results["ember"])
    mb = statistics.median(us(b) for b in results["bpftrace"])
    ratio = me / mb
    mark = " ✅" if ratio <= TARGET_VS_BPFTRACE else " ❌"
    rows.append(f"| **median** | **{me:.2f} µs** | **{mb:.2f} µs** | **{ratio:.2f}×**{mark} "
                f"(target ≤ {TARGET_VS_BPFTRACE}×) |")
    walk = [e["by_name"].get("ember_walk (perf_event)", (0, 0))[1] for e in results["ember"]]
    every = [r for rs in results.values() for r in rs]
    busy = statistics.median(r["host_busy_s"] for r in every)
    hog = statistics.median(r["hog_cpu_s"] for r in every)
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    head = (
        f"Measured {now} (`bench/overhead.py --bpftrace-compare`) on kernel {platform.release()}, "
        f"{os.cpu_count()} CPUs ({cpu_model()}), ember {git_rev()}, {version}; load average "
        f"before the run {load}.\n\n"
        f"Workload: {len(hogs)} × `cpu_hog`. `ember run --window 10s --frequency {hz}` (whole "
        f"host, default config) and `bpftrace -e '{script}'` (whole host; its `ustack` follows "
        f"frame pointers, as perf's does), each alone, interleaved, {runs} run{'s' if runs > 1 else ''} each. BPF time "
        f"per sample is run_time_ns / run_cnt (`kernel.bpf_stats_enabled=1`) of the "
        f"perf_event program each holds, between a `bpftool prog show` reading "
        f"{BPFTRACE_WARMUP_S:.0f} s after its perf events are attached and one {seconds} s "
        f"later: start-up excluded. ember's is `ember_sample_walk` (`ember_sample` where the walker is off) with the `ember_walk` tail calls "
        f"it makes: the kernel times a program around its whole tail-call chain (`ember_walk`'s "
        f"own runs between the readings: {', '.join(str(w) for w in walk)}). Busy CPU per "
        f"steady part: {busy:.1f} s (cpu_hog {hog:.1f} s).\n"
    )
    if busy - hog > 0.1 * busy:
        head += (f"\n**Not a quiet machine:** other processes used {busy - hog:.1f} CPU s per "
                 f"steady part (median); both samplers walk their stacks too.\n")
    return head + "\n" + "\n".join(rows) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=int, default=30)
    ap.add_argument("--frequency", type=int, default=99)
    ap.add_argument("--hogs", type=int, default=2)
    ap.add_argument("--no-write", action="store_true", help="print the table only")
    ap.add_argument("--pids-only", action="store_true",
                    help="profile only the cpu_hog processes (ember --pid, perf -p)")
    ap.add_argument("--unwind-compare", action="store_true",
                    help="ember with unwind tables against frame pointers only (no perf)")
    ap.add_argument("--dwarf-compare", action="store_true",
                    help="ember with DWARF lines on against off, beside a debug build (no perf)")
    ap.add_argument("--bpftrace-compare", action="store_true",
                    help="ember's BPF time per sample against bpftrace's profile one-liner")
    ap.add_argument("--debug-exe", default=os.path.join(TARGET, "debug", "ember"),
                    help="the 100 MB+ full-debug binary run beside --dwarf-compare "
                         "(none: the hogs alone)")
    ap.add_argument("--runs", type=int, default=3,
                    help="runs of ember (of each mode with --unwind-compare); medians reported")
    args = ap.parse_args()

    if os.geteuid() != 0:
        die("needs root (BPF, perf events, sysctl): run `sudo make bench`")
    ember = os.environ.get("EMBER_BIN") or os.path.join(TARGET, "release", "ember")
    if not os.access(ember, os.X_OK):
        die(f"{ember} not found: `make build` first")
    if not shutil.which("bpftool"):
        die("bpftool not found: run `make deps`")
    if args.bpftrace_compare and not shutil.which("bpftrace"):
        die("bpftrace not found (--bpftrace-compare compares with it): run `make bench-deps`, "
            "or `apt-get install bpftrace`")

    load = " ".join(open("/proc/loadavg").read().split()[:3])
    workdir = tempfile.mkdtemp(prefix="ember-overhead-")
    exe = build_cpu_hog(os.path.join(TARGET, "bench"))
    stats_path = "/proc/sys/kernel/bpf_stats_enabled"
    old_stats = open(stats_path).read().strip()
    hogs = []

    def restore(*_):
        for h in hogs:
            if h.poll() is None:
                h.kill()
                h.wait()
        try:
            with open(stats_path, "w") as f:
                f.write(old_stats)
        except OSError as err:
            log(f"could not restore {stats_path} to {old_stats}: {err}")

    def on_signal(signum, _frame):
        restore()
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        with open(stats_path, "w") as f:
            f.write("1")
        # Long enough for both measurements (or every compared run) and their start-up.
        comparing = args.unwind_compare or args.dwarf_compare
        life = (2 * args.runs if comparing else args.runs + 2) * (
            args.seconds + WARMUP_S + 5) + 60
        if args.bpftrace_compare:
            # Each run: start-up, warm-up, the steady part, and bpftrace printing its map.
            life = 2 * args.runs * (args.seconds + BPFTRACE_WARMUP_S + 45) + 60
        hogs = [start_hog(exe, life) for _ in range(args.hogs)]
        log(f"{args.hogs} cpu_hog running: pids {[h.pid for h in hogs]}")
        time.sleep(1)
        if args.bpftrace_compare:
            section = bpftrace_compare(ember, hogs, args.seconds, args.frequency, workdir,
                                       max(args.runs, 1), load)
            print(section)
            if not args.no_write:
                write_benchmarks(section, "bpftrace")
            return
        if comparing:
            kind = "unwind" if args.unwind_compare else "dwarf"
            debug_exe = None
            if kind == "dwarf" and args.debug_exe != "none":
                if not os.access(args.debug_exe, os.X_OK):
                    die(f"{args.debug_exe} not found: `cargo build -p ember` (debug) first")
                debug_exe = args.debug_exe
                hogs.append(start_debug_workload(debug_exe, workdir))
                time.sleep(5)
            section = compare(kind, ember, hogs[:args.hogs], args.seconds, args.frequency,
                              workdir, args.runs, load, debug_exe)
            print(section)
            if not args.no_write:
                write_benchmarks(section, kind)
            return
        runs = []
        for i in range(max(args.runs, 1)):
            one = measure_ember(ember, hogs, args.seconds, args.frequency, workdir,
                                args.pids_only)
            log(f"ember run {i + 1}/{args.runs}: "
                f"{json.dumps({k: v for k, v in one.items() if k != 'stderr_tail'}, default=str)}")
            log(f"ember stderr (tail):\n{one['stderr_tail']}")
            runs.append(one)
            time.sleep(1)
        e = median_of_runs(runs)
        time.sleep(1)
        for h in hogs:
            if h.poll() is not None:
                die(f"cpu_hog {h.pid} exited ({h.returncode}) during the ember run")
        p = measure_perf(hogs, args.seconds, args.frequency, workdir, args.pids_only)
        log(f"perf: {json.dumps(p)}")
        r = measure_record(ember, hogs, args.seconds, args.frequency, workdir, args.pids_only)
        log(f"ember record: {json.dumps(r)}")
    finally:
        restore()
        shutil.rmtree(workdir, ignore_errors=True)

    section = report(e, p, args.frequency, args.seconds, args.hogs, load, args.pids_only, r)
    print(section)
    if not args.no_write:
        write_benchmarks(section, "pids" if args.pids_only else "host")


if __name__ == "__main__":
    main()
