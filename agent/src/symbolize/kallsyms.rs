//! Kernel symbols from `/proc/kallsyms`, held compactly: one sorted address array and the
//! names packed ([`PackedNames`]): 2.2 MB for this host's 122k symbols, where plain strings
//! held 4.4 MB.

use std::io::{BufRead, BufReader};
use std::path::Path;

use super::packed::PackedNames;

/// Kernel text symbols sorted by address.
#[derive(Debug, Default)]
pub struct Kallsyms {
    /// Where the kernel's text starts (`_text`, else `_stext`); 0 when unknown. Unnamed
    /// kernel frames are shown as offsets from it: an absolute kernel address gives away
    /// the KASLR slide.
    text: u64,
    addrs: Vec<u64>,
    /// The name of `addrs[i]` at index `i`.
    names: PackedNames,
}

impl Kallsyms {
    /// Reads `/proc/kallsyms`. Without privileges every address reads as zero and the
    /// table comes out empty, so frames stay unnamed rather than wrong.
    pub fn load() -> std::io::Result<Self> {
        Self::read(Path::new("/proc/kallsyms"))
    }

    /// Reads a kallsyms-format file; malformed lines are skipped.
    pub fn read(path: &Path) -> std::io::Result<Self> {
        Self::from_reader(BufReader::new(std::fs::File::open(path)?))
    }

    /// Builds the table from text (tests).
    #[cfg(test)]
    pub fn parse(text: &str) -> Self {
        Self::from_reader(text.as_bytes()).unwrap_or_default()
    }

    fn from_reader(mut r: impl BufRead) -> std::io::Result<Self> {
        // (address, start and end of the name in `names`): no allocation per line.
        let mut entries: Vec<(u64, usize, usize)> = Vec::new();
        let mut names: Vec<u8> = Vec::new();
        let mut line = Vec::new();
        let (mut text, mut stext) = (0, 0);
        while r.read_until(b'\n', &mut line)? > 0 {
            if let Some((addr, name)) = parse_line(&line) {
                match name {
                    b"_text" => text = addr,
                    b"_stext" => stext = addr,
                    _ => {}
                }
                entries.push((addr, names.len(), names.len() + name.len()));
                names.extend_from_slice(name);
            }
            line.clear();
        }
        // Stable: among symbols at one address the first listed wins.
        entries.sort_by_key(|e| e.0);
        entries.dedup_by_key(|e| e.0);
        let packed = PackedNames::new(entries.iter().map(|&(_, a, b)| &names[a..b]));
        // Addresses whose names did not fit name nothing.
        entries.truncate(packed.count());
        Ok(Kallsyms {
            text: if text != 0 { text } else { stext },
            addrs: entries.iter().map(|e| e.0).collect(),
            names: packed,
        })
    }

    /// The symbol containing `addr` (the last one starting at or below it).
    pub fn resolve(&self, addr: u64) -> Option<String> {
        let i = self.addrs.partition_point(|&a| a <= addr).checked_sub(1)?;
        Some(String::from_utf8_lossy(&self.names.get(i)?).into_owned())
    }

    /// The name of an unnamed kernel frame at `addr`: `[kernel.kallsyms]+0x<offset from
    /// the text start>`, or `[kernel.kallsyms]` alone when there is no text start at or
    /// below it (kallsyms hidden): never the address itself.
    pub fn unnamed(&self, addr: u64) -> String {
        match addr.checked_sub(self.text) {
            Some(off) if self.text != 0 => format!("{KERNEL_MAPPING}+{off:#x}"),
            _ => KERNEL_MAPPING.to_string(),
        }
    }

    /// Heap bytes held.
    #[cfg(test)]
    pub fn bytes(&self) -> usize {
        self.addrs.capacity() * 8 + self.names.bytes()
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
fn parse_line(line: &[u8]) -> Option<(u64, &[u8])> {
    let mut f = line
        .split(|c| c.is_ascii_whitespace())
        .filter(|w| !w.is_empty());
    let addr = u64::from_str_radix(std::str::from_utf8(f.next()?).ok()?, 16).ok()?;
    let kind = f.next()?;
    let name = f.next()?;
    if addr == 0 || !matches!(kind, b"t" | b"T" | b"w" | b"W") {
        return None;
    }
    Some((addr, name))
}

use crate::model::KERNEL_MAPPING;

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 58: an unnamed kernel frame is an offset from `_text` (else `_stext`), never
    /// an address; without a text start, the mapping's name alone.
    #[test]
    fn unnamed_frames_are_offsets_from_the_text_start() {
        let k = Kallsyms::parse("ffffffff81000000 T _stext\nffffffff80e00000 T _text\n");
        assert_eq!(
            k.unnamed(0xffff_ffff_8100_2000),
            "[kernel.kallsyms]+0x202000"
        );
        let k = Kallsyms::parse("ffffffff81000000 T _stext\n");
        assert_eq!(k.unnamed(0xffff_ffff_8100_2000), "[kernel.kallsyms]+0x2000");
        assert_eq!(k.unnamed(0xffff_ffff_8000_0000), "[kernel.kallsyms]");
        // kallsyms hidden (kptr_restrict): every address reads 0, no text start.
        let k = Kallsyms::parse("0000000000000000 T _text\n");
        assert_eq!(k.unnamed(0xffff_ffff_8100_2000), "[kernel.kallsyms]");
    }

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
        let name = |a| k.resolve(a);
        assert_eq!(name(0xffffffff81000000).as_deref(), Some("_stext"));
        assert_eq!(name(0xffffffff810000ff).as_deref(), Some("_stext"));
        assert_eq!(name(0xffffffff81000100).as_deref(), Some("second"));
        assert_eq!(name(0xffffffffc0000010).as_deref(), Some("mod_fn"));
        assert_eq!(name(0x1000), None);
    }

    #[test]
    fn names_every_symbol_across_blocks() {
        let text: String = (0..1000u64)
            .map(|i| format!("{:x} T fn_{i}\n", 0xffffffff81000000 + 16 * (999 - i)))
            .collect();
        let k = Kallsyms::parse(&text);
        assert_eq!(k.len(), 1000);
        for i in 0..1000u64 {
            let addr = 0xffffffff81000000 + 16 * (999 - i);
            assert_eq!(k.resolve(addr + 3), Some(format!("fn_{i}")), "{addr:x}");
        }
        // Smaller than the text.
        assert!(k.bytes() < text.len() / 2, "{} bytes", k.bytes());
    }

    #[test]
    fn this_hosts_kallsyms_names_its_own_functions() {
        let Ok(k) = Kallsyms::load() else { return };
        if k.is_empty() {
            return; // addresses hidden: not privileged
        }
        let text = std::fs::read_to_string("/proc/kallsyms").unwrap();
        let (addr, name) = text
            .lines()
            .filter_map(|l| {
                let mut f = l.split_whitespace();
                let (a, t, n) = (f.next()?, f.next()?, f.next()?);
                (t == "T" && n == "schedule").then(|| (u64::from_str_radix(a, 16).unwrap(), n))
            })
            .next()
            .expect("schedule in kallsyms");
        assert_eq!(k.resolve(addr).as_deref(), Some(name));
        eprintln!("{} symbols in {} bytes", k.len(), k.bytes());
    }

    #[test]
    fn hidden_addresses_give_an_empty_table() {
        assert!(Kallsyms::parse("0000000000000000 T a\n0000000000000000 T b\n").is_empty());
    }
}
