//! Pressure stall information (PSI, kernel ≥ 4.20): `/proc/pressure/{cpu,memory,io}` and a
//! cgroup v2's `cpu.pressure`, `memory.pressure`, `io.pressure`:
//!
//! ```text
//! some avg10=0.00 avg60=0.00 avg300=0.00 total=0
//! full avg10=0.00 avg60=0.00 avg300=0.00 total=0
//! ```
//!
//! `total` is stall time in microseconds. The `full` line of `cpu` appeared in 5.13 (it is
//! zero at the system level); older kernels write only `some` for cpu.

use super::{number, ParseError};

const FILE: &str = "pressure";

/// Stall totals of one resource, in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pressure {
    /// Time some task was stalled.
    pub some_us: u64,
    /// Time all non-idle tasks were stalled at once, when the kernel reports it.
    pub full_us: Option<u64>,
}

/// Parses a PSI file. The `some` line is required.
pub fn parse(text: &str) -> Result<Pressure, ParseError> {
    let mut some = None;
    let mut full = None;
    for (i, line) in text.lines().enumerate() {
        let mut it = line.split_whitespace();
        let Some(kind) = it.next() else { continue };
        let total = it
            .find_map(|f| f.strip_prefix("total="))
            .ok_or_else(|| ParseError::new(FILE, format!("line {}: no total=", i + 1)))?;
        let total = number(FILE, &format!("line {} total", i + 1), total)?;
        match kind {
            "some" => some = Some(total),
            "full" => full = Some(total),
            other => {
                return Err(ParseError::new(
                    FILE,
                    format!("line {}: unknown kind {other:?}", i + 1),
                ))
            }
        }
    }
    let some_us = some.ok_or_else(|| ParseError::new(FILE, "no some line"))?;
    Ok(Pressure {
        some_us,
        full_us: full,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn with_and_without_full() {
        let p = parse(include_str!("testdata/pressure-cpu-6.1")).expect("parses");
        assert_eq!(p.some_us, 3_052_326_154);
        assert_eq!(p.full_us, Some(0));
        let p = parse(include_str!("testdata/pressure-cpu-5.4")).expect("parses");
        assert_eq!(p.some_us, 128_345_678);
        assert_eq!(p.full_us, None);
        let p = parse(include_str!("testdata/pressure-io-5.4")).expect("parses");
        assert_eq!(p.full_us, Some(987_654));
    }

    #[test]
    fn malformed() {
        assert!(parse("").unwrap_err().to_string().contains("no some line"));
        assert!(parse("some avg10=0.00 avg60=0.00 avg300=0.00\n")
            .unwrap_err()
            .to_string()
            .contains("no total="));
        assert!(parse("some avg10=0.00 total=-1\n").is_err());
        assert!(parse("most avg10=0.00 total=1\n").is_err());
    }
}
