//! `/proc/stat`: CPU time per CPU and mode, context switches, forks, runnable tasks.
//!
//! CPU lines have grown over kernel versions: 4 modes (2.4: user nice system idle), 7
//! (2.6.0: + iowait irq softirq), 8 (2.6.11: + steal), 9 (2.6.24: + guest), 10 (2.6.33:
//! + guest_nice). Modes a kernel does not report are absent, not zero.

use super::{number, ParseError};

const FILE: &str = "/proc/stat";

/// CPU modes in the order of a `cpu` line; `guest` and `guest_nice` are already counted
/// in `user` and `nice`, so they are kept apart (as node_exporter does).
pub const MODES: [&str; 8] = [
    "user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal",
];

/// Times of one CPU (or of all, for the `cpu` line), in clock ticks (USER_HZ).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CpuTimes {
    /// Ticks per mode of [`MODES`]; `None` where the kernel has no such column.
    pub modes: [Option<u64>; 8],
    /// Guest time (`guest`, `guest_nice`), when reported.
    pub guest: [Option<u64>; 2],
}

impl CpuTimes {
    /// All ticks except guest (already in user/nice).
    pub fn total(&self) -> u64 {
        self.modes.iter().flatten().sum()
    }

    /// Idle and iowait ticks: time the CPU did no work.
    pub fn idle(&self) -> u64 {
        self.modes[3].unwrap_or(0) + self.modes[4].unwrap_or(0)
    }
}

/// What ember uses of `/proc/stat`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stat {
    /// The aggregate `cpu` line.
    pub all: CpuTimes,
    /// Per-CPU lines: (cpu number, times), in file order (offline CPUs are missing).
    pub cpus: Vec<(u32, CpuTimes)>,
    /// Context switches since boot.
    pub ctxt: Option<u64>,
    /// Processes and threads created since boot.
    pub processes: Option<u64>,
    /// Tasks runnable now (running or waiting for a CPU).
    pub procs_running: Option<u64>,
    /// Tasks blocked on I/O now.
    pub procs_blocked: Option<u64>,
    /// Boot time, seconds since the epoch.
    pub btime: Option<u64>,
}

fn cpu_times(line_no: usize, fields: &[&str]) -> Result<CpuTimes, ParseError> {
    if !(4..=10).contains(&fields.len()) {
        return Err(ParseError::new(
            FILE,
            format!(
                "line {line_no}: a cpu line has 4 to 10 counters, this one {}",
                fields.len()
            ),
        ));
    }
    let mut t = CpuTimes::default();
    for (i, f) in fields.iter().enumerate() {
        let v = number(FILE, &format!("line {line_no}"), f)?;
        if i < 8 {
            t.modes[i] = Some(v);
        } else {
            t.guest[i - 8] = Some(v);
        }
    }
    Ok(t)
}

/// Parses the text of `/proc/stat`. The aggregate `cpu` line is required.
pub fn parse(text: &str) -> Result<Stat, ParseError> {
    let mut stat = Stat::default();
    let mut seen_all = false;
    for (i, line) in text.lines().enumerate() {
        let line_no = i + 1;
        let mut it = line.split_whitespace();
        let Some(key) = it.next() else { continue };
        let rest: Vec<&str> = it.collect();
        let single = || -> Result<u64, ParseError> {
            match rest.as_slice() {
                [v] => number(FILE, &format!("line {line_no} {key}"), v),
                _ => Err(ParseError::new(
                    FILE,
                    format!("line {line_no}: {key} should have one value"),
                )),
            }
        };
        match key {
            "cpu" => {
                stat.all = cpu_times(line_no, &rest)?;
                seen_all = true;
            }
            k if k.starts_with("cpu") => {
                let n: u32 = k[3..].parse().map_err(|_| {
                    ParseError::new(FILE, format!("line {line_no}: bad cpu name {k:?}"))
                })?;
                stat.cpus.push((n, cpu_times(line_no, &rest)?));
            }
            "ctxt" => stat.ctxt = Some(single()?),
            "processes" => stat.processes = Some(single()?),
            "procs_running" => stat.procs_running = Some(single()?),
            "procs_blocked" => stat.procs_blocked = Some(single()?),
            "btime" => stat.btime = Some(single()?),
            _ => {} // intr, softirq: not used
        }
    }
    if !seen_all {
        return Err(ParseError::new(FILE, "no aggregate cpu line"));
    }
    Ok(stat)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_6_has_ten_columns() {
        let s = parse(include_str!("testdata/stat-6.1")).expect("parses");
        assert_eq!(s.cpus.len(), 2);
        assert_eq!(s.cpus[1].0, 1);
        assert_eq!(s.all.modes[0], Some(1_234_567));
        assert_eq!(s.all.modes[7], Some(321));
        assert_eq!(s.all.guest, [Some(0), Some(0)]);
        assert_eq!(s.procs_running, Some(3));
        assert_eq!(s.procs_blocked, Some(1));
        assert_eq!(s.ctxt, Some(9_876_543_210));
        assert_eq!(s.btime, Some(1_763_700_000));
    }

    #[test]
    fn kernel_2_6_9_has_no_steal_or_guest() {
        let s = parse(include_str!("testdata/stat-2.6.9")).expect("parses");
        assert_eq!(s.all.modes[6], Some(977));
        assert_eq!(s.all.modes[7], None, "no steal column");
        assert_eq!(s.all.guest, [None, None]);
        assert_eq!(s.cpus.len(), 4);
        assert_eq!(s.procs_running, Some(1));
    }

    #[test]
    fn kernel_2_6_24_has_guest_but_not_guest_nice() {
        let s = parse(include_str!("testdata/stat-2.6.24")).expect("parses");
        assert_eq!(s.all.modes[7], Some(0));
        assert_eq!(s.all.guest, [Some(12), None]);
        assert_eq!(
            s.all.total(),
            2255 + 34 + 2290 + 22625563 + 6290 + 127 + 456
        );
    }

    #[test]
    fn a_missing_cpu_line_or_garbage_is_an_error() {
        let e = parse("ctxt 1\n").unwrap_err();
        assert!(e.to_string().contains("no aggregate cpu line"), "{e}");
        let e = parse("cpu 1 2 3 x\n").unwrap_err();
        assert!(e.to_string().contains("line 1"), "{e}");
        let e = parse("cpu 1 2 3\n").unwrap_err();
        assert!(e.to_string().contains("4 to 10"), "{e}");
        let e = parse("cpu 1 2 3 4\ncpuX 1 2 3 4\n").unwrap_err();
        assert!(e.to_string().contains("cpuX"), "{e}");
        let e = parse("cpu 1 2 3 4\nprocs_running\n").unwrap_err();
        assert!(e.to_string().contains("one value"), "{e}");
        assert!(parse(include_str!("testdata/stat-truncated")).is_err());
    }
}
