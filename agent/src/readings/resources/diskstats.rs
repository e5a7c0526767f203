//! `/proc/diskstats` (Documentation/admin-guide/iostats.rst): `major minor name` then
//! counters. Their number tells the kernel: 14 fields (4.18 and before: reads, writes,
//! in flight, io time, weighted io time), 18 (4.18+: + discards), 20 (5.5+: + flushes).
//! Partitions of kernels before 2.6.25 had 7 fields (reads, read sectors, writes, write
//! sectors), which are read as such.

use super::{number, ParseError};

const FILE: &str = "/proc/diskstats";

/// Counters of one block device. Times are in milliseconds, sizes in 512-byte sectors
/// (the kernel's unit whatever the device's sector size).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Disk {
    /// Device name, e.g. `sda`, `nvme0n1`, `dm-0`.
    pub name: String,
    /// Reads completed, reads merged, sectors read, ms reading.
    pub reads: [u64; 4],
    /// Writes completed, writes merged, sectors written, ms writing.
    pub writes: [u64; 4],
    /// I/Os in flight now.
    pub in_flight: u64,
    /// ms the device had I/O in flight (utilization).
    pub io_ms: u64,
    /// ms of I/O time weighted by in-flight count (queue: saturation).
    pub weighted_ms: u64,
    /// Discards completed, merged, sectors, ms (18+ fields).
    pub discards: Option<[u64; 4]>,
    /// Flushes completed, ms (20 fields).
    pub flushes: Option<[u64; 2]>,
}

/// Parses `/proc/diskstats`; one line per device, malformed lines are errors.
pub fn parse(text: &str) -> Result<Vec<Disk>, ParseError> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.is_empty() {
            continue;
        }
        let at = format!("line {}", i + 1);
        let n = |j: usize| number(FILE, &at, f[j]);
        let mut d = Disk {
            name: f.get(2).map(|s| (*s).to_owned()).unwrap_or_default(),
            ..Disk::default()
        };
        match f.len() {
            7 => {
                d.reads = [n(3)?, 0, n(4)?, 0];
                d.writes = [n(5)?, 0, n(6)?, 0];
            }
            14 | 18 | 20 => {
                d.reads = [n(3)?, n(4)?, n(5)?, n(6)?];
                d.writes = [n(7)?, n(8)?, n(9)?, n(10)?];
                d.in_flight = n(11)?;
                d.io_ms = n(12)?;
                d.weighted_ms = n(13)?;
                if f.len() >= 18 {
                    d.discards = Some([n(14)?, n(15)?, n(16)?, n(17)?]);
                }
                if f.len() == 20 {
                    d.flushes = Some([n(18)?, n(19)?]);
                }
            }
            k => {
                return Err(ParseError::new(
                    FILE,
                    format!("{at}: {k} fields; expected 7, 14, 18 or 20"),
                ))
            }
        }
        n(0)?;
        n(1)?;
        out.push(d);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fourteen_eighteen_and_twenty_fields() {
        let d = parse(include_str!("testdata/diskstats-4.4")).expect("parses");
        assert_eq!(d.len(), 4);
        assert_eq!(d[0].name, "sda");
        assert_eq!(d[0].io_ms, 1_290_524);
        assert_eq!(d[0].discards, None);
        let d = parse(include_str!("testdata/diskstats-4.19")).expect("parses");
        assert_eq!(d[1].name, "nvme0n1");
        assert_eq!(d[1].discards, Some([12, 0, 2048, 4]));
        assert_eq!(d[1].flushes, None);
        let d = parse(include_str!("testdata/diskstats-6.1")).expect("parses");
        let vda = d.iter().find(|d| d.name == "vda").expect("vda");
        assert_eq!(vda.reads, [28_374, 9_870, 2_339_522, 17_651]);
        assert_eq!(vda.writes[2], 9_876_544);
        assert_eq!(vda.in_flight, 1);
        assert_eq!(vda.weighted_ms, 123_457);
        assert_eq!(vda.flushes, Some([5_432, 2_345]));
    }

    #[test]
    fn old_partition_lines() {
        let d = parse(include_str!("testdata/diskstats-2.6.18")).expect("parses");
        let part = d.iter().find(|d| d.name == "hda1").expect("hda1");
        assert_eq!(part.reads, [277, 0, 554, 0]);
        assert_eq!(part.writes, [0, 0, 0, 0]);
        assert_eq!(d[0].io_ms, 27_000);
    }

    #[test]
    fn malformed() {
        let e = parse("   8       0 sda 1 2 3\n").unwrap_err();
        assert!(e.to_string().contains("6 fields"), "{e}");
        let e = parse("   8       0 sda 1 2 3 4 5 6 7 8 9 10 x\n").unwrap_err();
        assert!(e.to_string().contains("line 1"), "{e}");
        assert!(parse(include_str!("testdata/diskstats-truncated")).is_err());
        assert_eq!(parse("").expect("empty is no disks"), vec![]);
    }
}
