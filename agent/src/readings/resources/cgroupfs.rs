//! Files of the cgroup filesystems: flat keyed files (`name value` lines: v1 and v2
//! `cpu.stat`, `memory.stat`, `memory.events`, v1 `memory.oom_control`) and single values
//! (`cpuacct.usage`, `memory.usage_in_bytes`, `memory.current`).
//!
//! v1 `cpu.stat` has `nr_periods nr_throttled throttled_time` (ns); v2 `cpu.stat` has
//! `usage_usec user_usec system_usec` and, with the cpu controller, `nr_periods nr_throttled
//! throttled_usec`, plus `nr_bursts burst_usec` since 5.14.

use super::{number, ParseError};

/// Parses a flat keyed file; `file` names it in errors.
pub fn keyed(file: &'static str, text: &str) -> Result<Vec<(String, u64)>, ParseError> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let f: Vec<&str> = line.split_whitespace().collect();
        match f.as_slice() {
            [] => {}
            [k, v] => out.push(((*k).to_owned(), number(file, k, v)?)),
            _ => {
                return Err(ParseError::new(
                    file,
                    format!("line {}: expected `name value`", i + 1),
                ))
            }
        }
    }
    Ok(out)
}

/// Parses a file holding one number.
pub fn single(file: &'static str, text: &str) -> Result<u64, ParseError> {
    number(file, "value", text.trim())
}

/// CPU throttling of one cgroup, in the units of the file's version.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Throttling {
    /// CFS periods that had a quota.
    pub periods: u64,
    /// Periods in which the cgroup was throttled.
    pub throttled_periods: u64,
    /// Time throttled, seconds.
    pub throttled_seconds: f64,
}

/// Throttling from a parsed v1 (`throttled_time`, ns) or v2 (`throttled_usec`) `cpu.stat`;
/// `None` when the file has no CFS fields (v2 without the cpu controller).
pub fn throttling(stat: &[(String, u64)]) -> Option<Throttling> {
    let get = |k: &str| stat.iter().find(|(n, _)| n == k).map(|(_, v)| *v);
    let seconds = get("throttled_usec")
        .map(|us| us as f64 / 1e6)
        .or_else(|| get("throttled_time").map(|ns| ns as f64 / 1e9))?;
    Some(Throttling {
        periods: get("nr_periods")?,
        throttled_periods: get("nr_throttled")?,
        throttled_seconds: seconds,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v1_and_v2_cpu_stat() {
        let v1 = keyed("cpu.stat", include_str!("testdata/cgroup-v1-cpu.stat")).expect("v1");
        let t = throttling(&v1).expect("cfs fields");
        assert_eq!(t.periods, 5_000);
        assert_eq!(t.throttled_periods, 250);
        assert!((t.throttled_seconds - 12.5).abs() < 1e-9);
        let v2 = keyed("cpu.stat", include_str!("testdata/cgroup-v2-cpu.stat")).expect("v2");
        let t = throttling(&v2).expect("cfs fields");
        assert_eq!(t.periods, 1_200);
        assert_eq!(t.throttled_periods, 30);
        assert!((t.throttled_seconds - 1.5).abs() < 1e-9);
        assert!(v2.iter().any(|(k, v)| k == "nr_bursts" && *v == 0));
        // Without the cpu controller v2 has only usage: no throttling, not zero throttling.
        let bare = keyed("cpu.stat", "usage_usec 10\nuser_usec 6\nsystem_usec 4\n").expect("ok");
        assert_eq!(throttling(&bare), None);
    }

    #[test]
    fn memory_files() {
        let s = keyed(
            "memory.stat",
            include_str!("testdata/cgroup-v2-memory.stat"),
        )
        .expect("ok");
        assert!(s
            .iter()
            .any(|(k, v)| k == "inactive_file" && *v == 1_048_576));
        let e = keyed(
            "memory.events",
            "low 0\nhigh 0\nmax 3\noom 2\noom_kill 1\noom_group_kill 0\n",
        )
        .expect("ok");
        assert_eq!(e[4], ("oom_kill".to_owned(), 1));
        let o = keyed(
            "memory.oom_control",
            "oom_kill_disable 0\nunder_oom 0\noom_kill 4\n",
        )
        .expect("ok");
        assert_eq!(o[2].1, 4);
        assert_eq!(single("memory.current", "123456\n").expect("ok"), 123_456);
    }

    #[test]
    fn malformed() {
        assert!(keyed("cpu.stat", "nr_periods\n").is_err());
        assert!(keyed("cpu.stat", "nr_periods x\n").is_err());
        assert!(keyed("cpu.stat", "nr_periods 1 2\n").is_err());
        assert!(single("cpuacct.usage", "").is_err());
        assert!(single("memory.max", "max\n").is_err());
    }
}
