//! The compiler: an object's CFI, read with gimli, turned into sorted, deduplicated,
//! paged rows.
//!
//! Three steps, each bounded by [`Limits`]:
//! 1. read every CIE of a section once (the FDEs look theirs up by offset, so a hostile
//!    FDE pointing into the middle of the section cannot make gimli re-read it);
//! 2. evaluate each FDE's CFA program into rows of one [`Rule`] each, keeping the FDEs
//!    that describe code in an executable segment;
//! 3. lay the FDEs end to end (`.eh_frame` first, then `.debug_frame` where no
//!    `.eh_frame` FDE covers), mark gaps as frame-pointer rows, drop rows that repeat the
//!    rule before them, and cut the result into 4 KiB pages, each starting with a row
//!    at offset 0.

use std::collections::HashMap;

use gimli::{
    BaseAddresses, CieOrFde, CommonInformationEntry, DebugFrame, EhFrame, FrameDescriptionEntry,
    LittleEndian, UnwindContext, UnwindOffset, UnwindSection,
};

use super::elf;
use super::elf::CodeReader;
use super::error::{SkipReason, UnsupportedReason, UnwindError};
use super::row::{CfaRule, Rule, UnwindPage, UnwindRow, PAGE_SHIFT, PAGE_SIZE};
use super::rules::{to_rule, Reader, RA};

/// Caps on what one object may cost to compile. Every one is checked before the memory or
/// time it guards is spent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest object accepted, in bytes.
    pub max_object_bytes: u64,
    /// Most rows in a table (8 bytes each in BPF).
    pub max_rows: usize,
    /// Most CIEs and FDEs read, over both sections.
    pub max_entries: usize,
    /// Most 4 KiB pages a table may span (8 bytes each in BPF, and a row each at most).
    pub max_pages: u64,
    /// Most CIEs kept per section for their FDEs to refer to (`.debug_frame` has one per
    /// compilation unit; linkers merge `.eh_frame`'s to a handful). FDEs of the CIEs
    /// past the cap are skipped as [`SkipReason::BadCie`].
    pub max_cies: usize,
    /// Longest CIE (its whole entry) whose FDEs are read: real ones are a few dozen
    /// bytes, and every FDE re-runs its CIE's program.
    pub max_cie_bytes: u64,
    /// Work budget: the CFA program bytes interpreted (each FDE's entry plus its CIE's)
    /// may be at most `work_factor` times the CFI sections' size plus `work_base`.
    pub work_factor: u64,
    /// See `work_factor`.
    pub work_base: u64,
    /// Largest compressed `.debug_frame` inflated, in bytes it declares (Go's are a few
    /// hundred KiB; the cap stops a bomb before anything is allocated).
    pub max_inflated_bytes: u64,
    /// Most bytes of call frame information read from one object: `.eh_frame` and
    /// `.debug_frame` together, as stored in the file (a sparse read refuses the object
    /// before reading them, [`super::sparse`]).
    pub max_cfi_bytes: u64,
}

/// The caps until they become configuration: 1 GiB objects, 4 Mi rows (32 MiB, the
/// whole default budget of BPF map memory), 4 Mi entries, 1 Mi pages (4 GiB of
/// code), 16,384 CIEs of at most 4 KiB, 8 times the sections' bytes of CFA program plus
/// 1 MiB, 32 MiB of inflated `.debug_frame`, 64 MiB of CFI (libLLVM's 112 MiB object has
/// 5 MiB, rustc's 150 MiB driver 6 MiB).
pub const DEFAULT_LIMITS: Limits = Limits {
    max_object_bytes: 1 << 30,
    max_rows: 4 << 20,
    max_entries: 4 << 20,
    max_pages: 1 << 20,
    max_cies: 1 << 14,
    max_cie_bytes: 4096,
    work_factor: 8,
    work_base: 1 << 20,
    max_inflated_bytes: 32 << 20,
    max_cfi_bytes: 64 << 20,
};

impl Default for Limits {
    fn default() -> Self {
        DEFAULT_LIMITS
    }
}

/// What compiling one object found and gave up, for metrics and benches.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Stats {
    /// Bytes of `.eh_frame` read.
    pub eh_frame_bytes: u64,
    /// Bytes of `.debug_frame` read.
    pub debug_frame_bytes: u64,
    /// A compressed `.debug_frame` was present and not read (zstd, or it did not inflate
    /// beside an `.eh_frame`).
    pub debug_frame_compressed: bool,
    /// CIEs read.
    pub cies: u64,
    /// FDEs read.
    pub fdes: u64,
    /// FDEs whose rows are in the table.
    pub fdes_used: u64,
    /// FDEs (or section tails) given up, indexed like [`SkipReason::ALL`].
    pub skipped: [u64; SkipReason::ALL.len()],
    /// Rows made [`CfaRule::Unsupported`] or with
    /// [`RbpRule::Unknown`](super::RbpRule::Unknown), indexed like
    /// [`UnsupportedReason::ALL`].
    pub unsupported: [u64; UnsupportedReason::ALL.len()],
    /// Rows the FDEs' programs produced, before deduplication.
    pub raw_rows: u64,
    /// Frame-pointer rows marking code no FDE covers.
    pub gap_rows: u64,
    /// Gaps between FDEs left without a row because they are alignment padding.
    pub padding_gaps: u64,
    /// Rows repeated at the start of a page so each page starts with one.
    pub page_rows: u64,
    /// Bytes of CFA program interpreted (the work budget's measure).
    pub work_bytes: u64,
    /// The FDE holding the entry point was found; its rows are [`CfaRule::Stop`].
    pub entry_stop: bool,
}

impl Stats {
    /// How many FDEs were given up for a reason.
    pub fn skipped(&self, reason: SkipReason) -> u64 {
        self.skipped[reason as usize]
    }

    /// How many rows could not be expressed for a reason.
    pub fn unsupported(&self, reason: UnsupportedReason) -> u64 {
        self.unsupported[reason as usize]
    }
}

/// An object's unwind table, ready to be copied into BPF maps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnwindTable {
    /// Page number (address >> 16) of `pages[0]`.
    pub first_page: u64,
    /// One entry per 4 KiB page from `first_page`, none empty.
    pub pages: Vec<UnwindPage>,
    /// Every page's rows, page after page.
    pub rows: Vec<UnwindRow>,
    /// The object's executable segments as (address, file offset, bytes in the file): where
    /// a mapping of the file at some offset puts the object's addresses.
    pub segments: Vec<(u64, u64, u64)>,
    /// What compiling found.
    pub stats: Stats,
}

impl UnwindTable {
    /// The row in force at an object address, found the way the sampler finds it: the
    /// page by index, then a binary search of at most 17 steps. `None` outside the pages.
    pub fn lookup(&self, addr: u64) -> Option<UnwindRow> {
        let index = usize::try_from((addr >> PAGE_SHIFT).checked_sub(self.first_page)?).ok()?;
        let page = self.pages.get(index)?;
        let first = page.first_row as usize;
        let rows = self.rows.get(first..first + page.row_count as usize)?;
        // Truncation intended: the page index carries the high bits.
        let low = (addr & (PAGE_SIZE - 1)) as u16;
        let after = rows.partition_point(|r| r.pc_low <= low);
        rows.get(after.checked_sub(1)?).copied()
    }

    /// Every row with its full address, in address order.
    pub fn rows_with_addresses(&self) -> impl Iterator<Item = (u64, UnwindRow)> + '_ {
        self.pages.iter().enumerate().flat_map(move |(i, page)| {
            let base = (self.first_page + i as u64) << PAGE_SHIFT;
            let first = page.first_row as usize;
            let rows = self
                .rows
                .get(first..first + page.row_count as usize)
                .unwrap_or(&[]);
            rows.iter().map(move |r| (base + u64::from(r.pc_low), *r))
        })
    }

    /// Checks what the sampler relies on: every page has rows, its first at offset 0, in
    /// increasing order, inside `rows`, with valid rule bytes; pages follow each other
    /// without holes. The compiler's output always passes; the loader can check a table
    /// read back from a cache before trusting it.
    pub fn validate(&self) -> Result<(), &'static str> {
        let mut next_row = 0usize;
        for page in &self.pages {
            let first = page.first_row as usize;
            if first != next_row {
                return Err("pages do not follow each other");
            }
            let rows = self
                .rows
                .get(first..first + page.row_count as usize)
                .ok_or("page outside the rows")?;
            match rows.first() {
                None => return Err("empty page"),
                Some(r) if r.pc_low != 0 => return Err("page does not start at offset 0"),
                Some(_) => {}
            }
            if rows.windows(2).any(|w| w[0].pc_low >= w[1].pc_low) {
                return Err("rows out of order");
            }
            if rows.iter().any(|r| r.rule().is_none()) {
                return Err("invalid rule byte");
            }
            next_row = first + rows.len();
        }
        if next_row != self.rows.len() {
            return Err("rows outside every page");
        }
        Ok(())
    }

    /// Bytes the table takes in BPF maps: its rows and its pages.
    pub fn bpf_bytes(&self) -> usize {
        self.rows.len() * std::mem::size_of::<UnwindRow>()
            + self.pages.len() * std::mem::size_of::<UnwindPage>()
    }
}

/// Compiles the unwind table of an x86-64 ELF executable or shared object from its bytes.
pub fn compile(object: &[u8], limits: &Limits) -> Result<UnwindTable, UnwindError> {
    compile_with(elf::Bytes::Whole(object), None, limits)
}

/// [`compile`] from a sparse read of the object ([`super::sparse::Sparse`]): `object` holds
/// its headers and CFI, `code` reads the code bytes the compiler looks at.
pub fn compile_with(
    object: elf::Bytes<'_>,
    code: Option<&dyn CodeReader>,
    limits: &Limits,
) -> Result<UnwindTable, UnwindError> {
    let bytes = object.object_len();
    if bytes > limits.max_object_bytes {
        return Err(UnwindError::TooLarge {
            bytes,
            max: limits.max_object_bytes,
        });
    }
    let mut parts = elf::parse(object)?;
    parts.reader = code;
    let cfi = [parts.eh_frame, parts.debug_frame]
        .iter()
        .flatten()
        .map(|s| s.data.len() as u64)
        .chain(parts.debug_frame_zlib.map(|z| z.stream.len() as u64))
        .sum::<u64>();
    if cfi > limits.max_cfi_bytes {
        return Err(UnwindError::SectionTooLarge {
            what: "call frame information",
            bytes: cfi,
            max: limits.max_cfi_bytes,
        });
    }
    // Go writes its call frame information only to a zlib-compressed `.debug_frame`.
    let inflated = match parts.debug_frame_zlib {
        Some(z) if parts.debug_frame.is_none() => {
            match elf::inflate(z, limits.max_inflated_bytes) {
                Ok(bytes) => Some(bytes),
                // With `.eh_frame` there is still a table: leave the other section out.
                Err(_) if parts.eh_frame.is_some() => {
                    parts.debug_frame_compressed = true;
                    None
                }
                Err(e) => return Err(e),
            }
        }
        _ => None,
    };
    if let Some(data) = inflated.as_deref() {
        parts.debug_frame = Some(elf::CfiSection { addr: 0, data });
    }
    let mut c = Compiler::new(limits, &parts);

    let mut eh_spans = Vec::new();
    if let Some(s) = parts.eh_frame {
        c.stats.eh_frame_bytes = s.data.len() as u64;
        let mut section = EhFrame::new(s.data, LittleEndian);
        section.set_address_size(8);
        let mut bases = BaseAddresses::default().set_eh_frame(s.addr);
        if let Some(text) = parts.text_addr {
            bases = bases.set_text(text);
        }
        if let Some(got) = parts.got_addr {
            bases = bases.set_got(got);
        }
        eh_spans = c.read_section(&section, &bases, None)?;
    }
    let mut debug_spans = Vec::new();
    if let Some(s) = parts.debug_frame {
        c.stats.debug_frame_bytes = s.data.len() as u64;
        let mut section = DebugFrame::new(s.data, LittleEndian);
        section.set_address_size(8);
        debug_spans = c.read_section(&section, &BaseAddresses::default(), Some(&parts))?;
    }
    c.stats.debug_frame_compressed = parts.debug_frame_compressed;
    let spans = c.merge(eh_spans, debug_spans);
    let mut table = c.lay_out(&spans, &parts)?;
    table.segments = parts.code_file.clone();
    Ok(table)
}

/// One FDE's rows in `Compiler::raw`.
#[derive(Debug, Clone, Copy)]
struct Span {
    start: u64,
    end: u64,
    first: usize,
    len: usize,
}

struct Compiler<'l> {
    limits: &'l Limits,
    code: Vec<(u64, u64)>,
    entry: u64,
    entries: usize,
    work_budget: u64,
    /// Every FDE's rows, FDE after FDE, each already free of repeats.
    raw: Vec<(u64, Rule)>,
    stats: Stats,
}

impl<'l> Compiler<'l> {
    fn new(limits: &'l Limits, parts: &elf::ElfParts<'_>) -> Self {
        let cfi_bytes = parts.eh_frame.map_or(0, |s| s.data.len() as u64)
            + parts.debug_frame.map_or(0, |s| s.data.len() as u64);
        Self {
            limits,
            code: parts.code.clone(),
            entry: parts.entry,
            entries: 0,
            work_budget: cfi_bytes
                .saturating_mul(limits.work_factor)
                .saturating_add(limits.work_base),
            raw: Vec::new(),
            stats: Stats::default(),
        }
    }

    fn skip(&mut self, reason: SkipReason) {
        self.stats.skipped[reason as usize] += 1;
    }

    fn count_entry(&mut self) -> Result<(), UnwindError> {
        self.entries += 1;
        if self.entries > self.limits.max_entries {
            return Err(UnwindError::TooManyEntries {
                max: self.limits.max_entries,
            });
        }
        Ok(())
    }

    /// Whether `[start, end)` lies inside one executable segment.
    fn in_code(&self, start: u64, end: u64) -> bool {
        let i = self.code.partition_point(|&(_, e)| e <= start);
        self.code
            .get(i)
            .is_some_and(|&(s, e)| s <= start && end <= e)
    }

    /// Reads one section's FDEs into `raw`; returns their spans in section order.
    /// `.debug_frame` has no augmentation to mark a signal trampoline: with `code`, a
    /// short FDE whose code is [`SIGRETURN`] is taken for one (Go's `runtime.sigreturn`).
    fn read_section<'a, S>(
        &mut self,
        section: &S,
        bases: &BaseAddresses,
        code: Option<&elf::ElfParts<'_>>,
    ) -> Result<Vec<Span>, UnwindError>
    where
        S: UnwindSection<Reader<'a>>,
    {
        let cies = self.read_cies(section, bases)?;

        // Pass 2: the FDEs, each with its CIE from pass 1.
        let mut spans = Vec::new();
        let mut ctx = UnwindContext::new();
        let mut entries = section.entries(bases);
        while let Ok(Some(entry)) = entries.next() {
            let CieOrFde::Fde(partial) = entry else {
                continue;
            };
            self.stats.fdes += 1;
            let mut known_cie = true;
            let fde = match partial.parse(|_, _, offset| {
                let offset = UnwindOffset::into(offset);
                let cie = cies.get(&offset).cloned();
                known_cie = cie.is_some();
                cie.ok_or(gimli::Error::NoEntryAtGivenOffset(offset as u64))
            }) {
                Ok(fde) => fde,
                Err(_) => {
                    // An FDE pointing at no CIE of pass 1 (or one past the cap) is not
                    // followed: gimli would parse whatever is at that offset, again for
                    // every such FDE.
                    self.skip(if known_cie {
                        SkipReason::Malformed
                    } else {
                        SkipReason::BadCie
                    });
                    continue;
                }
            };
            let cie = fde.cie();
            let cie_len = cie.entry_len() as u64;
            if cie.address_size() != 8
                || cie.return_address_register() != RA
                || cie_len > self.limits.max_cie_bytes
            {
                self.skip(SkipReason::BadCie);
                continue;
            }
            let start = fde.initial_address();
            let end = match start.checked_add(fde.len()) {
                Some(end) if end > start && self.in_code(start, end) => end,
                _ => {
                    self.skip(SkipReason::OutsideCode);
                    continue;
                }
            };
            self.stats.work_bytes += cie_len + fde.entry_len() as u64;
            if self.stats.work_bytes > self.work_budget {
                return Err(UnwindError::TooMuchWork {
                    budget: self.work_budget,
                });
            }
            if let Some(span) = self.read_fde(&fde, (start, end), section, bases, &mut ctx, code)? {
                spans.push(span);
            }
        }
        Ok(spans)
    }

    /// Pass 1 of [`Compiler::read_section`]: every CIE, once, by offset (at most
    /// `max_cies` kept); every entry counts against `max_entries`.
    fn read_cies<'a, S>(
        &mut self,
        section: &S,
        bases: &BaseAddresses,
    ) -> Result<HashMap<usize, CommonInformationEntry<Reader<'a>>>, UnwindError>
    where
        S: UnwindSection<Reader<'a>>,
    {
        let mut cies = HashMap::new();
        let mut entries = section.entries(bases);
        loop {
            match entries.next() {
                Ok(None) => break,
                Err(_) => {
                    // The length of an entry is wrong: nothing after it can be found.
                    self.skip(SkipReason::SectionCut);
                    break;
                }
                Ok(Some(CieOrFde::Cie(cie))) => {
                    self.count_entry()?;
                    self.stats.cies += 1;
                    if cies.len() < self.limits.max_cies {
                        cies.insert(cie.offset(), cie);
                    }
                }
                Ok(Some(CieOrFde::Fde(_))) => self.count_entry()?,
            }
        }
        Ok(cies)
    }

    /// Evaluates one FDE, covering `[start, end)` of code, into `raw`: its span, or `None`
    /// when it gave no row, or a malformed program (its rows dropped, counted).
    fn read_fde<'a, S>(
        &mut self,
        fde: &FrameDescriptionEntry<Reader<'a>>,
        (start, end): (u64, u64),
        section: &S,
        bases: &BaseAddresses,
        ctx: &mut UnwindContext<usize>,
        code: Option<&elf::ElfParts<'_>>,
    ) -> Result<Option<Span>, UnwindError>
    where
        S: UnwindSection<Reader<'a>>,
    {
        let first = self.raw.len();
        // Where the rows of a trampoline known by its code start (see `sigreturn_at`).
        let by_code = match code {
            Some(parts) if !fde.is_signal_trampoline() => sigreturn_at(parts, start, end),
            _ => None,
        };
        let signal = fde.is_signal_trampoline() || by_code.is_some();
        // The entry point's function is the outermost frame: toolchains mark its
        // return address undefined only sometimes (Debian's crt1.o does not), and
        // the walk must stop there, not read past the stack's top.
        let outermost = self.entry != 0 && start <= self.entry && self.entry < end;
        self.stats.entry_stop |= outermost;
        let mut ok = true;
        if let Some(at) = by_code {
            self.push_raw(first, at, Rule::bare(CfaRule::Signal))?;
        }
        match fde.rows(section, bases, ctx) {
            Err(_) => ok = false,
            Ok(mut table) => loop {
                match table.next_row() {
                    Ok(None) => break,
                    Err(_) => {
                        ok = false;
                        break;
                    }
                    Ok(Some(row)) => {
                        let (row_start, row_end) = (row.start_address(), row.end_address());
                        // Empty rows and rows a program advanced past its FDE are
                        // never in force.
                        if row_start >= row_end || row_start < start || row_start >= end {
                            continue;
                        }
                        self.stats.raw_rows += 1;
                        let rule = if outermost {
                            Rule::bare(CfaRule::Stop)
                        } else if signal {
                            Rule::bare(CfaRule::Signal)
                        } else {
                            to_rule(row, section, &mut self.stats.unsupported)
                        };
                        self.push_raw(first, row_start, rule)?;
                    }
                }
            },
        }
        if !ok {
            self.raw.truncate(first);
            self.skip(SkipReason::Malformed);
            return Ok(None);
        }
        Ok((self.raw.len() > first).then(|| Span {
            start: by_code.unwrap_or(start),
            end,
            first,
            len: self.raw.len() - first,
        }))
    }

    /// Appends a row of the FDE whose rows start at `first`, dropping a repeat.
    fn push_raw(&mut self, first: usize, addr: u64, rule: Rule) -> Result<(), UnwindError> {
        push_row(&mut self.raw, first, addr, rule);
        if self.raw.len() > self.limits.max_rows {
            return Err(UnwindError::TooManyRows {
                max: self.limits.max_rows,
            });
        }
        Ok(())
    }
}

impl Compiler<'_> {
    /// The FDEs to lay out, sorted and disjoint: `.eh_frame`'s first, then those of
    /// `.debug_frame` that no `.eh_frame` FDE overlaps.
    fn merge(&mut self, eh: Vec<Span>, debug: Vec<Span>) -> Vec<Span> {
        let eh = self.disjoint(eh);
        let mut all = Vec::with_capacity(eh.len() + debug.len());
        for d in debug {
            let i = eh.partition_point(|e| e.end <= d.start);
            if eh.get(i).is_some_and(|e| e.start < d.end) {
                self.skip(SkipReason::Overlap);
            } else {
                all.push(d);
            }
        }
        all.extend_from_slice(&eh);
        self.disjoint(all)
    }

    /// Sorts spans by address and drops each that overlaps one before it.
    fn disjoint(&mut self, mut spans: Vec<Span>) -> Vec<Span> {
        spans.sort_by_key(|s| s.start);
        let mut kept: Vec<Span> = Vec::with_capacity(spans.len());
        for s in spans {
            if kept.last().is_some_and(|k| s.start < k.end) {
                self.skip(SkipReason::Overlap);
            } else {
                kept.push(s);
            }
        }
        kept
    }

    /// Lays the spans end to end, marks the gaps, drops repeats, and cuts the rows into
    /// pages.
    fn lay_out(
        mut self,
        spans: &[Span],
        parts: &elf::ElfParts<'_>,
    ) -> Result<UnwindTable, UnwindError> {
        const GAP: Rule = Rule::bare(CfaRule::FramePointer);
        let too_many = UnwindError::TooManyRows {
            max: self.limits.max_rows,
        };
        // At most every raw row plus a gap row per span: bounded by the caps already met.
        let mut out: Vec<(u64, Rule)> = Vec::with_capacity(self.raw.len() + spans.len() + 1);
        let mut prev_end = None;
        for s in spans {
            if let Some(end) = prev_end.filter(|&end| end < s.start) {
                if is_padding(parts, end, s.start) {
                    // Never executed: the previous function's last rule may cover it,
                    // which often lets the next function's first row go too.
                    self.stats.padding_gaps += 1;
                } else {
                    push_row(&mut out, 0, end, GAP);
                }
            }
            for &(addr, rule) in self.raw.get(s.first..s.first + s.len).unwrap_or(&[]) {
                push_row(&mut out, 0, addr, rule);
            }
            prev_end = Some(s.end);
            self.stats.fdes_used += 1;
        }
        let (Some(end), Some(&(start, _))) = (prev_end, out.first()) else {
            return Err(UnwindError::NoCfi);
        };
        push_row(&mut out, 0, end, GAP);
        self.raw = Vec::new();
        self.stats.gap_rows = out.iter().filter(|(_, r)| *r == GAP).count() as u64;
        if out.len() > self.limits.max_rows {
            return Err(too_many);
        }

        let first_page = start >> PAGE_SHIFT;
        let last_page = end >> PAGE_SHIFT;
        let page_count = last_page - first_page + 1;
        if page_count > self.limits.max_pages {
            return Err(UnwindError::SpanTooLarge {
                pages: page_count,
                max: self.limits.max_pages,
            });
        }
        let mut pages = Vec::with_capacity(page_count as usize);
        let mut rows: Vec<UnwindRow> = Vec::with_capacity(out.len() + page_count as usize);
        let mut next = out.iter().peekable();
        let mut active = GAP;
        for page in first_page..=last_page {
            let first_row = rows.len();
            let base = page << PAGE_SHIFT;
            if next.peek().is_none_or(|&&(addr, _)| addr != base) {
                // The row in force at the page's start, so every search finds one.
                rows.push(active.at(base));
                self.stats.page_rows += 1;
            }
            while let Some(&&(addr, rule)) = next.peek() {
                if addr >> PAGE_SHIFT != page {
                    break;
                }
                rows.push(rule.at(addr));
                active = rule;
                next.next();
            }
            if rows.len() > self.limits.max_rows {
                return Err(too_many);
            }
            let row_count = rows.len() - first_row;
            pages.push(UnwindPage {
                first_row: u32::try_from(first_row).map_err(|_| too_many.clone())?,
                row_count: u32::try_from(row_count).map_err(|_| too_many.clone())?,
            });
        }
        Ok(UnwindTable {
            first_page,
            pages,
            rows,
            segments: Vec::new(),
            stats: self.stats,
        })
    }
}

/// Bytes of the padding gas and ld put between functions: the nop forms (`90`,
/// `66 90`, `0f 1f 00`, `0f 1f 40 00`, `0f 1f 44 00 00`, `66 0f 1f 44 00 00`,
/// `0f 1f 80 00 00 00 00`, `0f 1f 84 00 00 00 00 00`, `66 2e 0f 1f 84 ...`), int3, zeros.
const PADDING: [u8; 11] = [
    0x90, 0x66, 0x2e, 0x0f, 0x1f, 0x84, 0x80, 0x44, 0x40, 0x00, 0xcc,
];

/// Whether `[start, end)` is alignment padding after a function: it ends where `start`
/// rounds up to 8, 16, 32 or 64 bytes, and holds padding bytes only. Code without CFI
/// fails one test or the other, and keeps its frame-pointer row.
fn is_padding(parts: &elf::ElfParts<'_>, start: u64, end: u64) -> bool {
    let aligned = [8u64, 16, 32, 64]
        .iter()
        .any(|&a| start.checked_next_multiple_of(a) == Some(end));
    aligned
        && parts
            .code_bytes(start, end)
            .is_some_and(|b| b.iter().all(|x| PADDING.contains(x)))
}

/// `mov $15, %rax; syscall`: the x86-64 `rt_sigreturn` trampoline a signal handler
/// returns to (glibc's `__restore_rt`, Go's `runtime.sigreturn`), as libgcc and gdb
/// recognise it when no CFI says so.
const SIGRETURN: [u8; 9] = [0x48, 0xc7, 0xc0, 0x0f, 0x00, 0x00, 0x00, 0x0f, 0x05];

/// Where the rows of the `rt_sigreturn` trampoline at `[start, end)` start, if that is
/// what the function is (only short functions are read, so a sparse read of the object
/// costs a few small reads, not one per function). A handler returns to the trampoline's
/// first byte, and the walker looks up the byte before a return address: glibc starts its
/// trampoline's FDE one byte early, at a nop, for this; Go does not, so the rows start
/// one byte early when that byte is padding.
fn sigreturn_at(parts: &elf::ElfParts<'_>, start: u64, end: u64) -> Option<u64> {
    let len = SIGRETURN.len() as u64;
    if !(len..=16).contains(&(end - start)) || *parts.code_bytes(start, start + len)? != SIGRETURN {
        return None;
    }
    let before = start.checked_sub(1)?;
    let padding = parts
        .code_bytes(before, start)
        .is_some_and(|b| matches!(b.first(), Some(0xcc | 0x90)));
    Some(if padding { before } else { start })
}

/// Appends a row to `out`, where rows from index `floor` on are compared: a row at the
/// same address as the last replaces it, a row repeating the last one's rule is dropped.
fn push_row(out: &mut Vec<(u64, Rule)>, floor: usize, addr: u64, rule: Rule) {
    let len = out.len();
    if len > floor {
        let last = out[len - 1];
        if addr < last.0 {
            // Never for sorted input; an out-of-order row is dropped rather than let
            // break the table's order.
            return;
        }
        if addr == last.0 {
            if len - 1 > floor && out[len - 2].1 == rule {
                out.pop();
            } else {
                out[len - 1].1 = rule;
            }
            return;
        }
        if last.1 == rule {
            return;
        }
    }
    out.push((addr, rule));
}
