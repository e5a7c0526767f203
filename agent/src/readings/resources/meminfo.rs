//! `/proc/meminfo` (`MemTotal:       16318360 kB`) and `/proc/vmstat` (`pgmajfault 1234`).

use super::{number, ParseError};

/// One `/proc/meminfo` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The key, e.g. `MemAvailable`, `Active(anon)`, `HugePages_Total`.
    pub key: String,
    /// The value in bytes for `kB` entries, else the plain count.
    pub value: u64,
    /// Whether the value is in bytes (the line had a `kB` unit).
    pub bytes: bool,
}

/// Parses `/proc/meminfo`.
pub fn parse_meminfo(text: &str) -> Result<Vec<Entry>, ParseError> {
    const FILE: &str = "/proc/meminfo";
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let (key, rest) = line
            .split_once(':')
            .ok_or_else(|| ParseError::new(FILE, format!("line {}: no colon", i + 1)))?;
        let f: Vec<&str> = rest.split_whitespace().collect();
        let (value, bytes) = match f.as_slice() {
            [v] => (number(FILE, key, v)?, false),
            [v, "kB"] => (
                number(FILE, key, v)?
                    .checked_mul(1024)
                    .ok_or_else(|| ParseError::new(FILE, format!("{key}: too large")))?,
                true,
            ),
            _ => {
                return Err(ParseError::new(
                    FILE,
                    format!("line {}: expected `value [kB]`, got {rest:?}", i + 1),
                ))
            }
        };
        out.push(Entry {
            key: key.trim().to_owned(),
            value,
            bytes,
        });
    }
    if out.is_empty() {
        return Err(ParseError::new(FILE, "empty"));
    }
    Ok(out)
}

/// Parses `/proc/vmstat`: `name value` lines.
pub fn parse_vmstat(text: &str) -> Result<Vec<(String, u64)>, ParseError> {
    const FILE: &str = "/proc/vmstat";
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let f: Vec<&str> = line.split_whitespace().collect();
        match f.as_slice() {
            [] => {}
            [k, v] => out.push(((*k).to_owned(), number(FILE, k, v)?)),
            _ => {
                return Err(ParseError::new(
                    FILE,
                    format!("line {}: expected `name value`", i + 1),
                ))
            }
        }
    }
    if out.is_empty() {
        return Err(ParseError::new(FILE, "empty"));
    }
    Ok(out)
}

/// The value of `key` in parsed entries.
pub fn get(entries: &[(String, u64)], key: &str) -> Option<u64> {
    entries.iter().find(|(k, _)| k == key).map(|(_, v)| *v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_units() {
        let m = parse_meminfo(include_str!("testdata/meminfo-6.1")).expect("parses");
        let find = |k: &str| m.iter().find(|e| e.key == k).cloned().expect(k);
        assert_eq!(find("MemAvailable").value, 20_123_456 * 1024);
        assert!(find("MemAvailable").bytes);
        assert_eq!(find("HugePages_Total").value, 0);
        assert!(!find("HugePages_Total").bytes);
        assert_eq!(find("Active(anon)").value, 1_048_576 * 1024);
        // 3.x kernels have no MemAvailable: the parser does not invent one.
        let old = parse_meminfo(include_str!("testdata/meminfo-3.10")).expect("parses");
        assert!(!old.iter().any(|e| e.key == "MemAvailable"));
    }

    #[test]
    fn meminfo_malformed() {
        assert!(parse_meminfo("").is_err());
        assert!(parse_meminfo("MemTotal 1 kB\n").is_err());
        assert!(parse_meminfo("MemTotal: x kB\n").is_err());
        assert!(parse_meminfo("MemTotal: 1 MB\n").is_err());
        assert!(parse_meminfo("MemTotal: 99999999999999999999 kB\n").is_err());
        assert!(parse_meminfo(&format!("MemTotal: {} kB\n", u64::MAX / 2)).is_err());
    }

    #[test]
    fn vmstat() {
        let v = parse_vmstat(include_str!("testdata/vmstat-6.1")).expect("parses");
        assert_eq!(get(&v, "pgmajfault"), Some(12_345));
        assert_eq!(get(&v, "oom_kill"), Some(2));
        assert_eq!(get(&v, "pswpin"), Some(7));
        assert_eq!(get(&v, "nope"), None);
        assert!(parse_vmstat("pgmajfault\n").is_err());
        assert!(parse_vmstat("pgmajfault -1\n").is_err());
        assert!(parse_vmstat("").is_err());
    }
}
