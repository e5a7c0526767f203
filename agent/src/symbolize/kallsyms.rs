//! Kernel symbols from `/proc/kallsyms`, held compactly: one sorted address array and
//! one string blob (about 4 MB for 120k symbols, a third of a general-purpose parse).

use std::io::{BufRead, BufReader};
use std::path::Path;

/// Kernel text symbols sorted by address.
#[derive(Debug, Default)]
pub struct Kallsyms {
    addrs: Vec<u64>,
    /// End of each symbol's name in `names` (its start is the previous end).
    ends: Vec<u32>,
    names: String,
}

impl Kallsyms {
    /// Reads `/proc/kallsyms`. Without privileges every address reads as zero and the
    /// table comes out empty, so frames stay unnamed rather than wrong.
    pub fn load() -> std::io::Result<Self> {
        Self::read(Path::new("/proc/kallsyms"))
    }

    /// Reads a kallsyms-format file; malformed lines are skipped.
    pub fn read(path: &Path) -> std::io::Result<Self> {
        let file = std::fs::File::open(path)?;
        let mut entries: Vec<(u64, String)> = Vec::new();
        for line in BufReader::new(file).lines() {
            if let Some(e) = parse_line(&line?) {
                entries.push(e);
            }
        }
        Ok(Self::from_entries(entries))
    }

    /// Builds the table from text (tests).
    #[cfg(test)]
    pub fn parse(text: &str) -> Self {
        Self::from_entries(text.lines().filter_map(parse_line).collect())
    }

    fn from_entries(mut entries: Vec<(u64, String)>) -> Self {
        entries.sort_by_key(|e| e.0);
        entries.dedup_by_key(|e| e.0);
        let mut k = Kallsyms {
            addrs: Vec::with_capacity(entries.len()),
            ends: Vec::with_capacity(entries.len()),
            names: String::with_capacity(entries.iter().map(|e| e.1.len()).sum()),
        };
        for (addr, name) in entries {
            k.names.push_str(&name);
            let Ok(end) = u32::try_from(k.names.len()) else {
                break;
            };
            k.addrs.push(addr);
            k.ends.push(end);
        }
        k
    }

    /// The symbol containing `addr` (the last one starting at or below it).
    pub fn resolve(&self, addr: u64) -> Option<&str> {
        let i = self.addrs.partition_point(|&a| a <= addr).checked_sub(1)?;
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        self.names.get(start..self.ends[i] as usize)
    }

    /// Number of symbols.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.addrs.len()
    }

    /// Whether the table is empty (e.g. addresses hidden from an unprivileged reader).
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.addrs.is_empty()
    }
}

/// `ffffffff81000000 T _stext [module]` → text symbols only; zero addresses are hidden ones.
fn parse_line(line: &str) -> Option<(u64, String)> {
    let mut f = line.split_whitespace();
    let addr = u64::from_str_radix(f.next()?, 16).ok()?;
    let kind = f.next()?;
    let name = f.next()?;
    if addr == 0 || !matches!(kind, "t" | "T" | "w" | "W") {
        return None;
    }
    Some((addr, name.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_to_the_enclosing_symbol() {
        let k = Kallsyms::parse(
            "ffffffff81000100 T second\n\
             ffffffff81000000 T _stext\n\
             ffffffff81000080 d some_data\n\
             ffffffffc0000000 t mod_fn\t[mymod]\n\
             garbage\n\
             0000000000000000 T hidden\n",
        );
        assert_eq!(k.len(), 3);
        assert_eq!(k.resolve(0xffffffff81000000), Some("_stext"));
        assert_eq!(k.resolve(0xffffffff810000ff), Some("_stext"));
        assert_eq!(k.resolve(0xffffffff81000100), Some("second"));
        assert_eq!(k.resolve(0xffffffffc0000010), Some("mod_fn"));
        assert_eq!(k.resolve(0x1000), None);
    }

    #[test]
    fn hidden_addresses_give_an_empty_table() {
        assert!(Kallsyms::parse("0000000000000000 T a\n0000000000000000 T b\n").is_empty());
    }
}
