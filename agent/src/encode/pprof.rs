//! pprof: turns a symbolized window into a CPU profile, written the way the Go runtime
//! writes them (`samples/count` + `cpu/nanoseconds`, period 1e9/Hz). The [`Builder`] is
//! shared with the per-service profiles of `crate::export::pyroscope::encode`.

use std::collections::hash_map::Entry;
use std::time::UNIX_EPOCH;

use flate2::{Compress, Compression, Crc, FlushCompress, Status};

use crate::model::{Func, Mapping as SymMapping, ProfileKind, SymFrame, SymStack, Symbolized};
use crate::proto::{Function, Label, Line, Location, Mapping, Profile, Sample, ValueType};

/// The builder's maps, hashed per frame of every window: foldhash, keyed at random per
/// process like the aggregator's (SipHash took 1.3 % of an agent with off-CPU on).
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::quality::RandomState>;

/// What a profile says of one mapping beyond its name: the addresses seen in it and
/// what its functions carry. Per-service profiles keep the window's ([`WindowLocations`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Span {
    memory_start: u64,
    memory_limit: u64,
    has_filenames: bool,
    has_line_numbers: bool,
    has_inline_frames: bool,
}

impl Default for Span {
    fn default() -> Self {
        Self {
            memory_start: u64::MAX,
            memory_limit: 0,
            has_filenames: false,
            has_line_numbers: false,
            has_inline_frames: false,
        }
    }
}

impl Span {
    /// Widens the span by one location (a distinct address in the mapping).
    fn add(&mut self, address: u64, funcs: &[Func]) {
        self.memory_start = self.memory_start.min(address);
        self.memory_limit = self.memory_limit.max(address + 1);
        self.has_filenames |= funcs.iter().any(|f| f.file.is_some());
        self.has_line_numbers |= funcs.iter().any(|f| f.line > 0);
        self.has_inline_frames |= funcs.len() > 1;
    }

    /// The span's start and limit, as pprof and OTLP mappings show them.
    pub(crate) fn bounds(&self) -> (u64, u64) {
        let start = if self.memory_start == u64::MAX {
            0
        } else {
            self.memory_start
        };
        (start, self.memory_limit)
    }

    fn apply(&self, m: &mut Mapping) {
        (m.memory_start, m.memory_limit) = self.bounds();
        m.has_filenames = self.has_filenames;
        m.has_line_numbers = self.has_line_numbers;
        m.has_inline_frames = self.has_inline_frames;
    }
}

/// Which frames are one location: same mapping and address and, for JIT code and
/// interpreted code (whose addresses are per process) and kernel code (whose addresses
/// are not shown), the same function, file and line. The first frame seen gives the lines.
pub(crate) type LocationKey<'w> = (&'w SymMapping, u64, Option<&'w Func>);

/// The location key of `f`.
pub(crate) fn location_key(f: &SymFrame) -> LocationKey<'_> {
    let by_name = f.is_jit() || f.is_interpreted() || matches!(f.mapping, SymMapping::Kernel);
    let func = match f.funcs.first() {
        Some(func) if by_name => Some(func),
        _ => None,
    };
    (&f.mapping, f.address, func)
}

/// What the whole window says of its mappings and locations, for profiles of a part of
/// it (Pyroscope's per-service ones) and for OTLP's dictionary.
pub(crate) struct WindowLocations<'w> {
    /// The address range and contents of each mapping, over its distinct locations.
    spans: HashMap<&'w SymMapping, Span>,
    /// The first frame of each location in the window: its lines are the location's.
    first: HashMap<LocationKey<'w>, &'w SymFrame>,
}

impl<'w> WindowLocations<'w> {
    /// Walks every frame of `w` once.
    pub(crate) fn of(w: &'w Symbolized) -> Self {
        let mut first: HashMap<LocationKey<'w>, &'w SymFrame> = HashMap::default();
        let mut spans: HashMap<&'w SymMapping, Span> = HashMap::default();
        for f in w.stacks.iter().flat_map(|s| &s.frames) {
            if let Entry::Vacant(e) = first.entry(location_key(f)) {
                e.insert(f);
                spans
                    .entry(&f.mapping)
                    .or_default()
                    .add(f.address, &f.funcs);
            }
        }
        Self { spans, first }
    }

    /// The span of mapping `m` over the window.
    pub(crate) fn span(&self, m: &SymMapping) -> Option<&Span> {
        self.spans.get(m)
    }
}

/// The value of a pprof sample label.
pub(crate) enum LabelValue<'a> {
    /// A number (`pid`, `tid`).
    Num(i64),
    /// A string (empty for an unnamed thread or process).
    Str(&'a str),
}

/// The sample labels of a stack, in the order profiles list them: `pid`, `tid`, `comm`,
/// `process`, then the workload's non-empty labels; off-CPU stacks then say why (`state`).
pub(crate) fn sample_labels(s: &SymStack) -> impl Iterator<Item = (&'static str, LabelValue<'_>)> {
    [
        ("pid", LabelValue::Num(i64::from(s.pid))),
        ("tid", LabelValue::Num(i64::from(s.tid))),
        ("comm", LabelValue::Str(&s.comm)),
        ("process", LabelValue::Str(&s.process)),
    ]
    .into_iter()
    .chain(
        s.labels
            .sample_labels()
            .map(|(k, v)| (k, LabelValue::Str(v))),
    )
    .chain(
        s.off_cpu
            .map(|o| ("state", LabelValue::Str(o.state.as_str()))),
    )
    .chain(s.runtime.iter().flat_map(|r| {
        [
            ("runtime", LabelValue::Str(r.name)),
            ("runtime_version", LabelValue::Str(&r.version)),
        ]
    }))
}

/// The values of a stack's sample: `samples/count` and `cpu/nanoseconds`, or for an
/// off-CPU stack `samples/count` (blocks) and `off_cpu/nanoseconds`.
pub(crate) fn values(s: &SymStack, period_ns: u64) -> Vec<i64> {
    match s.off_cpu {
        Some(o) => vec![s.count as i64, o.ns as i64],
        None => vec![s.count as i64, (s.count * period_ns) as i64],
    }
}

/// The second sample type of a window's profiles, and its unit: `cpu`, `off_cpu`,
/// `off_wake` (blocked time under its waker), or `delay` (lock waits, as the Go runtime's
/// mutex and block profiles name them), in nanoseconds.
pub(crate) fn value_type(kind: ProfileKind) -> (&'static str, &'static str) {
    match kind {
        ProfileKind::Cpu => ("cpu", "nanoseconds"),
        ProfileKind::OffCpu => ("off_cpu", "nanoseconds"),
        ProfileKind::OffWake => ("off_wake", "nanoseconds"),
        ProfileKind::Lock => ("delay", "nanoseconds"),
    }
}

/// The first sample type of a window's profiles: `samples/count`, or for lock waits
/// `contentions/count` (the Go runtime's mutex profile, Pyroscope's `mutex`).
pub(crate) fn count_type(kind: ProfileKind) -> (&'static str, &'static str) {
    match kind {
        ProfileKind::Lock => ("contentions", "count"),
        _ => ("samples", "count"),
    }
}

/// A pprof profile under construction: strings, mappings, functions and locations are
/// interned in the order samples first use them.
pub(crate) struct Builder<'w> {
    /// When the profile holds part of a window: the whole window's mappings and locations.
    window: Option<&'w WindowLocations<'w>>,
    profile: Profile,
    strings: HashMap<String, i64>,
    mappings: HashMap<&'w SymMapping, usize>,
    /// What each mapping spans, in this profile.
    spans: Vec<(&'w SymMapping, Span)>,
    /// By mapping, address and (for JIT code, whose addresses are per process) name.
    locations: HashMap<(u64, u64, i64, i64, u32), u64>,
    functions: HashMap<(i64, i64), u64>,
}

impl<'w> Builder<'w> {
    /// An empty CPU profile of window `w`: the header, no samples.
    pub(crate) fn new(w: &Symbolized) -> Self {
        Self::part_of(w, None)
    }

    /// An empty CPU profile of part of window `w`. With `window` (what all of `w` says of
    /// its mappings and locations), its mappings span the whole window and each location
    /// has the lines of its first frame in the window, as in the window's own profile.
    pub(crate) fn part_of(w: &Symbolized, window: Option<&'w WindowLocations<'w>>) -> Self {
        let mut b = Self {
            window,
            profile: Profile::default(),
            strings: HashMap::default(),
            mappings: HashMap::default(),
            spans: Vec::new(),
            locations: HashMap::default(),
            functions: HashMap::default(),
        };
        b.string("");
        let (count, count_unit) = count_type(w.kind);
        let samples = ValueType {
            r#type: b.string(count),
            unit: b.string(count_unit),
        };
        let (kind, unit) = value_type(w.kind);
        let time = ValueType {
            r#type: b.string(kind),
            unit: b.string(unit),
        };
        b.profile.sample_type = vec![samples, time];
        b.profile.period_type = Some(time);
        // Off-CPU values are measured times, not counts of a period: one nanosecond each.
        b.profile.period = match w.kind {
            ProfileKind::Cpu => w.period_ns as i64,
            _ => 1,
        };
        b.profile.default_sample_type = time.r#type;
        b.profile.time_nanos = w
            .start
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as i64);
        b.profile.duration_nanos = w.duration.as_nanos() as i64;
        b
    }

    fn string(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.strings.get(s) {
            return i;
        }
        let i = self.profile.string_table.len() as i64;
        self.profile.string_table.push(s.to_owned());
        self.strings.insert(s.to_owned(), i);
        i
    }

    fn mapping(&mut self, m: &'w SymMapping) -> usize {
        if let Some(&i) = self.mappings.get(m) {
            return i;
        }
        let filename = self.string(m.file_name());
        let build_id = match m.build_id() {
            Some(b) => {
                let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
                self.string(&hex)
            }
            None => 0,
        };
        let i = self.profile.mapping.len();
        self.profile.mapping.push(Mapping {
            id: i as u64 + 1,
            filename,
            build_id,
            has_functions: true,
            ..Default::default()
        });
        self.spans.push((m, Span::default()));
        self.mappings.insert(m, i);
        i
    }

    fn function(&mut self, name: &str, file: Option<&str>) -> u64 {
        let name = self.string(name);
        let file = file.map_or(0, |f| self.string(f));
        if let Some(&id) = self.functions.get(&(name, file)) {
            return id;
        }
        let id = self.profile.function.len() as u64 + 1;
        self.profile.function.push(Function {
            id,
            name,
            system_name: name,
            filename: file,
            start_line: 0,
        });
        self.functions.insert((name, file), id);
        id
    }

    /// The location of frame `f`, added with its mapping and functions when new.
    pub(crate) fn frame(&mut self, f: &'w SymFrame) -> u64 {
        let mapping = self.mapping(&f.mapping);
        let mapping_id = mapping as u64 + 1;
        // The same JIT address in two processes is two different functions; the same code
        // object of an interpreter is one location per line.
        let (name, file, line) = match location_key(f).2 {
            Some(func) => (
                self.string(&func.name),
                func.file.as_deref().map_or(0, |p| self.string(p)),
                func.line,
            ),
            None => (0, 0, 0),
        };
        let key = (mapping_id, f.address, name, file, line);
        if let Some(&id) = self.locations.get(&key) {
            return id;
        }
        let f = self
            .window
            .and_then(|w| w.first.get(&location_key(f)))
            .copied()
            .unwrap_or(f);
        self.spans[mapping].1.add(f.address, &f.funcs);
        let line = f
            .funcs
            .iter()
            .map(|func| Line {
                function_id: self.function(&func.name, func.file.as_deref()),
                line: i64::from(func.line),
                column: 0,
            })
            .collect();
        let id = self.profile.location.len() as u64 + 1;
        self.profile.location.push(Location {
            id,
            mapping_id,
            address: f.address,
            line,
            is_folded: false,
        });
        self.locations.insert(key, id);
        id
    }

    /// The locations of a stack, leaf first.
    pub(crate) fn stack(&mut self, s: &'w SymStack) -> Vec<u64> {
        s.frames.iter().map(|f| self.frame(f)).collect()
    }

    /// One sample label.
    pub(crate) fn label(&mut self, key: &str, value: &LabelValue<'_>) -> Label {
        match *value {
            LabelValue::Num(num) => Label {
                key: self.string(key),
                num,
                ..Default::default()
            },
            LabelValue::Str(v) => Label {
                key: self.string(key),
                str: self.string(v),
                ..Default::default()
            },
        }
    }

    /// The samples so far, to add or merge into.
    pub(crate) fn samples(&mut self) -> &mut Vec<Sample> {
        &mut self.profile.sample
    }

    /// The profile.
    pub(crate) fn finish(mut self) -> Profile {
        for (m, (key, own)) in self.profile.mapping.iter_mut().zip(&self.spans) {
            self.window
                .and_then(|w| w.span(key))
                .unwrap_or(own)
                .apply(m);
        }
        self.profile
    }
}

/// Encodes window `w` as one pprof profile: a sample per stack, with every label.
pub fn encode(w: &Symbolized) -> Profile {
    let mut b = Builder::new(w);
    for stack in &w.stacks {
        let location_id = b.stack(stack);
        let label = sample_labels(stack).map(|(k, v)| b.label(k, &v)).collect();
        b.samples().push(Sample {
            location_id,
            value: values(stack, w.period_ns),
            label,
        });
    }
    b.finish()
}

/// Serializes and gzips a profile, as pprof files are stored (a one-off: see [`Gzip`]).
pub fn to_gzip(profile: &Profile) -> std::io::Result<Vec<u8>> {
    Gzip::new().profile(profile)
}

/// A gzip writer kept for many profiles. A new deflate state allocates and clears about
/// 300 KB (zlib-rs) that the period's `malloc_trim` then gives back: with four windows a
/// period, that and its page faults were a quarter of the output thread. Level 1: on window
/// files (2-10 KB) it takes 40 % of the default level's time for 16 % more bytes.
pub struct Gzip {
    deflate: Compress,
}

/// RFC 1952 header: magic, deflate, no flags, no mtime, "fastest" (XFL 4), OS unknown.
const GZIP_HEADER: [u8; 10] = [0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 4, 255];

impl Default for Gzip {
    fn default() -> Self {
        Self::new()
    }
}

impl Gzip {
    /// A writer at level 1.
    pub fn new() -> Self {
        Self {
            deflate: Compress::new(Compression::fast(), false),
        }
    }

    /// `profile` serialized and gzipped.
    pub fn profile(&mut self, profile: &Profile) -> std::io::Result<Vec<u8>> {
        self.bytes(&prost::Message::encode_to_vec(profile))
    }

    /// `raw` gzipped (header, raw deflate, CRC-32 and length).
    pub fn bytes(&mut self, raw: &[u8]) -> std::io::Result<Vec<u8>> {
        self.deflate.reset();
        let mut out = Vec::with_capacity(raw.len() / 3 + 64);
        out.extend_from_slice(&GZIP_HEADER);
        loop {
            if out.capacity() - out.len() < 64 {
                out.reserve(out.capacity().max(4096));
            }
            let done = usize::try_from(self.deflate.total_in()).unwrap_or(usize::MAX);
            let rest = raw.get(done..).unwrap_or_default();
            match self
                .deflate
                .compress_vec(rest, &mut out, FlushCompress::Finish)?
            {
                Status::StreamEnd => break,
                Status::Ok | Status::BufError => {}
            }
        }
        let mut crc = Crc::new();
        crc.update(raw);
        out.extend_from_slice(&crc.sum().to_le_bytes());
        // ISIZE is the length modulo 2^32 (RFC 1952).
        out.extend_from_slice(&(raw.len() as u32).to_le_bytes());
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::{Frame, Stack, Window};
    use crate::model::{FrameCounts, KERNEL_MAPPING};
    use crate::process::table::UserAddr;
    use crate::symbolize::{assemble, FrameKey, Resolved};
    use std::collections::HashMap;
    use std::sync::Arc;
    use std::time::{Duration, SystemTime};

    /// Names `w`'s frames from `symbols` and encodes it, as the output thread does.
    fn encode_with(w: Window, symbols: &HashMap<FrameKey, Resolved>) -> (Profile, FrameCounts) {
        let w = assemble(w, symbols);
        (encode(&w), w.frame_counts())
    }

    fn resolved(names: &[&str]) -> Resolved {
        Resolved {
            funcs: names
                .iter()
                .map(|n| Func {
                    name: Arc::from(*n),
                    file: Some(Arc::from("x.c")),
                    line: 7,
                })
                .collect::<Vec<_>>()
                .into(),
            named: true,
        }
    }

    fn window() -> Window {
        let stack = |tid, frames: Vec<Frame>, count| Stack {
            pid: 10,
            tid,
            comm: "hog".into(),
            process: Arc::from("hog"),
            labels: Arc::default(),
            frames,
            count,
            off_cpu: None,
            runtime: None,
        };
        Window {
            start: UNIX_EPOCH + Duration::from_secs(1_700_000_000),
            duration: Duration::from_secs(10),
            period_ns: 10_101_010,
            kind: Default::default(),
            stacks: vec![
                stack(
                    10,
                    vec![Frame::Kernel(0xffff_0010), Frame::Kernel(0xffff_0020)],
                    7,
                ),
                stack(
                    11,
                    vec![
                        Frame::Kernel(0xffff_0010),
                        Frame::User(UserAddr::Unknown(0x42)),
                    ],
                    3,
                ),
            ],
        }
    }

    fn name_of(p: &Profile, loc_id: u64) -> Vec<String> {
        let loc = &p.location[loc_id as usize - 1];
        loc.line
            .iter()
            .map(|l| p.string_table[p.function[l.function_id as usize - 1].name as usize].clone())
            .collect()
    }

    #[test]
    fn round_trips_through_protobuf() {
        let mut symbols = HashMap::default();
        symbols.insert(FrameKey::Kernel(0xffff_0010), resolved(&["inner", "outer"]));
        symbols.insert(FrameKey::Kernel(0xffff_0020), resolved(&["syscall"]));
        let (p, counts) = encode_with(window(), &symbols);
        assert_eq!(
            counts,
            FrameCounts {
                named: 3,
                unnamed: 1,
                jit: 0
            }
        );
        let bytes = to_gzip(&p).expect("gzip");
        let back = crate::encode::flamegraph::decode_gz(&bytes).expect("decode");
        assert_eq!(back, p);
        // A writer kept for many profiles gives each the same bytes as a new one.
        let mut kept = Gzip::new();
        let big = Profile {
            string_table: (0..20_000).map(|i| format!("frame {i}")).collect(),
            ..Profile::default()
        };
        for q in [&big, &p, &big] {
            let again = kept.profile(q).expect("gzip");
            assert_eq!(again, to_gzip(q).expect("gzip"));
            assert_eq!(
                &crate::encode::flamegraph::decode_gz(&again).expect("decode"),
                q
            );
        }

        let s = &back.string_table;
        assert_eq!(s[0], "");
        let types: Vec<(&str, &str)> = back
            .sample_type
            .iter()
            .map(|v| (s[v.r#type as usize].as_str(), s[v.unit as usize].as_str()))
            .collect();
        assert_eq!(types, [("samples", "count"), ("cpu", "nanoseconds")]);
        assert_eq!(back.period, 10_101_010);
        assert_eq!(back.time_nanos, 1_700_000_000_000_000_000);
        assert_eq!(back.duration_nanos, 10_000_000_000);
        assert_eq!(back.sample.len(), 2);
        assert_eq!(back.sample[0].value, [7, 7 * 10_101_010]);
        assert_eq!(
            name_of(&back, back.sample[0].location_id[0]),
            ["inner", "outer"]
        );
        assert_eq!(name_of(&back, back.sample[1].location_id[1]), ["[unknown]"]);
        // Same address → same location; the kernel mapping is shared.
        assert_eq!(back.sample[0].location_id[0], back.sample[1].location_id[0]);
        assert_eq!(back.location.len(), 3);
        assert_eq!(back.mapping.len(), 2);
        assert_eq!(s[back.mapping[0].filename as usize], KERNEL_MAPPING);
        // Issue 58: kernel locations carry no address, the kernel mapping no bounds
        // beyond address 0 (told apart by their functions).
        assert!(back.location[..2].iter().all(|l| l.address == 0));
        assert_eq!(back.mapping[0].memory_start, 0);
        assert_eq!(back.mapping[0].memory_limit, 1);
        assert!(back.mapping[0].has_inline_frames);
        // Strings are unique.
        let mut sorted = s.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), s.len());
        // Labels.
        let labels: Vec<(String, i64, String)> = back.sample[1]
            .label
            .iter()
            .map(|l| (s[l.key as usize].clone(), l.num, s[l.str as usize].clone()))
            .collect();
        assert_eq!(
            labels,
            [
                ("pid".into(), 10, "".into()),
                ("tid".into(), 11, "".into()),
                ("comm".into(), 0, "hog".into()),
                ("process".into(), 0, "hog".into())
            ]
        );
    }

    #[test]
    fn ids_are_dense_and_nonzero() {
        let (p, _) = encode_with(window(), &HashMap::default());
        for (i, l) in p.location.iter().enumerate() {
            assert_eq!(l.id, i as u64 + 1);
            assert!(l.mapping_id >= 1 && l.mapping_id as usize <= p.mapping.len());
        }
        for (i, f) in p.function.iter().enumerate() {
            assert_eq!(f.id, i as u64 + 1);
        }
    }

    #[test]
    fn empty_window_is_a_valid_empty_profile() {
        let w = Window {
            start: SystemTime::now(),
            duration: Duration::from_secs(1),
            period_ns: 1,
            kind: Default::default(),
            stacks: vec![],
        };
        let (p, c) = encode_with(w, &HashMap::default());
        assert!(p.sample.is_empty());
        assert_eq!(c, FrameCounts::default());
        assert_eq!(p.string_table[0], "");
    }
}
