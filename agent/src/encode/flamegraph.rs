//! Views of a pprof CPU profile for humans: folded stacks, a flame graph SVG
//! and a top-functions table.
//!
//! Everything here reads a decoded [`Profile`]; [`decode_gz`] turns a window
//! file from disk into one, with a cap on the decompressed size.

use std::collections::{BTreeMap, HashMap};
use std::io::Read;

use flate2::read::GzDecoder;
use prost::Message;

use crate::model::PYTHON_MAPPING;
use crate::proto::{Function, Line, Location, Profile, Sample};

/// Largest decompressed profile [`decode_gz`] accepts, so that a hostile or
/// corrupt file cannot make us allocate without bound (a gzip bomb).
pub const MAX_DECODED_BYTES: u64 = 512 * 1024 * 1024;

/// Frame name for a location or function we cannot name.
const UNKNOWN: &str = "[unknown]";

/// The mark of a frame inlined into the one below it (every line of a location but its
/// outermost): FlameGraph's annotation, which `stackcollapse-perf --inline` and inferno's
/// perf collapser write and its palettes colour (perf itself writes `(inlined)`).
pub const INLINED: &str = "_[i]";

/// Errors from decoding or rendering a profile.
#[derive(Debug, thiserror::Error)]
pub enum FlameGraphError {
    /// The bytes are not valid gzip.
    #[error("profile is not valid gzip: {0}")]
    Gunzip(#[source] std::io::Error),
    /// The decompressed profile is larger than [`MAX_DECODED_BYTES`].
    #[error("decompressed profile is larger than {MAX_DECODED_BYTES} bytes")]
    TooLarge,
    /// The decompressed bytes are not a pprof `Profile`.
    #[error("profile is not valid pprof: {0}")]
    Decode(#[from] prost::DecodeError),
    /// inferno failed to render the SVG.
    #[error("rendering the flame graph failed: {0}")]
    Render(#[source] std::io::Error),
}

/// Lookup tables over one profile, built once per call.
struct Index<'a> {
    profile: &'a Profile,
    locations: HashMap<u64, &'a Location>,
    functions: HashMap<u64, &'a Function>,
}

impl<'a> Index<'a> {
    fn new(profile: &'a Profile) -> Self {
        Self {
            profile,
            locations: profile.location.iter().map(|l| (l.id, l)).collect(),
            functions: profile.function.iter().map(|f| (f.id, f)).collect(),
        }
    }

    /// A string table entry; out-of-range indexes read as empty rather than
    /// failing, because a view should show what it can.
    fn string(&self, index: i64) -> &'a str {
        usize::try_from(index)
            .ok()
            .and_then(|i| self.profile.string_table.get(i))
            .map_or("", String::as_str)
    }

    fn function_name(&self, function_id: u64) -> &'a str {
        let name = self
            .functions
            .get(&function_id)
            .map_or("", |f| self.string(f.name));
        if name.is_empty() {
            UNKNOWN
        } else {
            name
        }
    }

    /// Pushes the frames of one location, outermost first (pprof stores
    /// inlined lines innermost first).
    fn push_frames(&self, location_id: u64, out: &mut Vec<String>) {
        let Some(location) = self.locations.get(&location_id) else {
            out.push(UNKNOWN.to_string());
            return;
        };
        if location.line.is_empty() {
            out.push(unnamed_location(location));
            return;
        }
        let python = self.is_python(location);
        for (depth, line) in location.line.iter().rev().enumerate() {
            let name = self.function_name(line.function_id);
            if python {
                out.push(sanitize(&self.python_name(name, line)));
            } else if depth > 0 {
                out.push(sanitize(name) + INLINED);
            } else {
                out.push(sanitize(name));
            }
        }
    }

    /// Whether a location is a Python frame (in the `[python]` mapping).
    fn is_python(&self, location: &Location) -> bool {
        self.profile
            .mapping
            .iter()
            .find(|m| m.id == location.mapping_id)
            .is_some_and(|m| self.string(m.filename) == PYTHON_MAPPING)
    }

    /// A Python frame as py-spy names it: `mid (app.py:14)`, the file's base name.
    fn python_name(&self, name: &str, line: &Line) -> String {
        let file = self
            .functions
            .get(&line.function_id)
            .map_or("", |f| self.string(f.filename));
        let base = file.rsplit('/').next().unwrap_or(file);
        if base.is_empty() {
            return name.to_string();
        }
        format!("{name} ({base}:{})", line.line)
    }

    /// The function a sample was in when taken: the innermost line of its
    /// leaf location.
    fn leaf_name(&self, sample: &Sample) -> String {
        let Some(location) = sample
            .location_id
            .first()
            .and_then(|id| self.locations.get(id))
        else {
            return UNKNOWN.to_string();
        };
        match location.line.first() {
            Some(line) => self.function_name(line.function_id).to_string(),
            None => unnamed_location(location),
        }
    }

    /// The sample's string label `key`, if it has a non-empty one.
    fn label(&self, sample: &Sample, key: &str) -> Option<&'a str> {
        sample
            .label
            .iter()
            .find(|l| self.string(l.key) == key)
            .map(|l| self.string(l.str))
            .filter(|s| !s.is_empty())
    }

    /// The sample's `process` label, if it has a non-empty one.
    fn process(&self, sample: &Sample) -> Option<&'a str> {
        sample
            .label
            .iter()
            .find(|l| self.string(l.key) == "process")
            .map(|l| self.string(l.str))
            .filter(|s| !s.is_empty())
    }
}

/// A location without lines has only an address to show.
fn unnamed_location(location: &Location) -> String {
    if location.address == 0 {
        UNKNOWN.to_string()
    } else {
        format!("0x{:x}", location.address)
    }
}

/// The sample count of a sample: its first value. Negative or missing
/// values count as zero.
fn count(sample: &Sample) -> u64 {
    sample
        .value
        .first()
        .map_or(0, |v| u64::try_from(*v).unwrap_or(0))
}

/// Makes a name safe inside a folded line: `;` separates frames, so it
/// becomes `:`; control characters (newlines, tabs) become spaces; and a
/// trailing ` <number>` would be read by inferno as a second count, so that
/// last space becomes `_`.
fn sanitize(name: &str) -> String {
    let mut out: String = name
        .chars()
        .map(|c| match c {
            ';' => ':',
            c if c.is_control() => ' ',
            c => c,
        })
        .collect();
    if let Some(space) = out.rfind(' ') {
        let tail = &out[space + 1..];
        if !tail.is_empty() && tail.chars().all(|c| c.is_ascii_digit() || c == '.') {
            out.replace_range(space..=space, "_");
        }
    }
    if out.is_empty() {
        out.push_str(UNKNOWN);
    }
    out
}

/// The profile as FlameGraph collapsed stacks, `root;...;leaf COUNT`, one
/// line per distinct stack, sorted.
///
/// COUNT is the first sample value (the sample count in CPU profiles).
/// Inlined functions are expanded outer to inner, each marked [`INLINED`]
/// (`work;hot_[i]`). Each stack starts with the sample's `process` label when it
/// has one, so that different processes get separate towers in the flame graph.
/// Names are sanitized so they cannot break the format (see `sanitize`). Samples
/// with a zero count are left out.
///
/// Off-CPU profiles (default sample type `off_cpu`) count microseconds off CPU (as bcc's
/// `offcputime -f` does), and each stack's second frame is its `state` in brackets
/// (`[sleep]`, `[disk]`, `[runnable]`), so the graph splits first by why threads waited.
pub fn folded(profile: &Profile) -> Vec<String> {
    // Sorted as joined stacks, not as frame lists ("a.b" before "a;x").
    let mut lines: Vec<(String, u64)> = stacks(profile)
        .into_iter()
        .map(|(frames, n)| (frames.join(";"), n))
        .collect();
    lines.sort_unstable();
    lines
        .into_iter()
        .map(|(stack, n)| format!("{stack} {n}"))
        .collect()
}

/// The profile's stacks, root first, each with its weight as [`folded`] gives it (samples,
/// or microseconds off CPU): the process, the off-CPU state, then the frames.
pub fn stacks(profile: &Profile) -> BTreeMap<Vec<String>, u64> {
    let index = Index::new(profile);
    let off_cpu = is_off_cpu(profile);
    let mut stacks: BTreeMap<Vec<String>, u64> = BTreeMap::new();
    let mut frames = Vec::new();
    for sample in &profile.sample {
        let n = if off_cpu {
            sample
                .value
                .get(1)
                .map_or(0, |v| u64::try_from(*v).unwrap_or(0) / 1000)
        } else {
            count(sample)
        };
        if n == 0 {
            continue;
        }
        frames.clear();
        if let Some(process) = index.process(sample) {
            frames.push(sanitize(process));
        }
        if off_cpu {
            if let Some(state) = index.label(sample, "state") {
                frames.push(format!("[{}]", sanitize(state)));
            }
        }
        for &id in sample.location_id.iter().rev() {
            index.push_frames(id, &mut frames);
        }
        if frames.is_empty() {
            frames.push(UNKNOWN.to_string());
        }
        let total = stacks.entry(frames.clone()).or_insert(0);
        *total = total.saturating_add(n);
    }
    stacks
}

/// An interactive flame graph (inferno's SVG, with search and zoom) of the
/// profile. A profile without samples gives a small SVG saying so, since
/// inferno refuses empty input.
pub fn svg(profile: &Profile, title: &str) -> Result<Vec<u8>, FlameGraphError> {
    let lines = folded(profile);
    if lines.is_empty() {
        return Ok(empty_svg(title));
    }
    let mut options = inferno::flamegraph::Options::default();
    options.title = title.to_string();
    options.count_name = if is_off_cpu(profile) { "us" } else { "samples" }.to_string();
    // Same function, same colour, across windows: easier to compare.
    options.hash = true;
    let mut out = Vec::new();
    inferno::flamegraph::from_lines(&mut options, lines.iter().map(String::as_str), &mut out)
        .map_err(FlameGraphError::Render)?;
    Ok(out)
}

/// Whether `profile` measures time off CPU (its default sample type is `off_cpu`,
/// `off_wake` or `delay`).
pub fn is_off_cpu(profile: &Profile) -> bool {
    usize::try_from(profile.default_sample_type)
        .ok()
        .and_then(|i| profile.string_table.get(i))
        .is_some_and(|s| matches!(s.as_str(), "off_cpu" | "off_wake" | "delay"))
}

/// A minimal valid SVG showing the title and "no samples".
fn empty_svg(title: &str) -> Vec<u8> {
    format!(
        concat!(
            r#"<?xml version="1.0" standalone="no"?>"#,
            "\n",
            r#"<svg version="1.1" width="1200" height="80" viewBox="0 0 1200 80" xmlns="http://www.w3.org/2000/svg">"#,
            r#"<text x="600" y="30" text-anchor="middle" font-family="Verdana" font-size="17">{}</text>"#,
            r#"<text x="600" y="60" text-anchor="middle" font-family="Verdana" font-size="12">no samples in this profile</text>"#,
            "</svg>\n"
        ),
        xml_escape(title)
    )
    .into_bytes()
}

/// Escapes text for XML and HTML content and attribute values.
pub fn xml_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The `n` functions with the most self samples (the function on top of
/// the stack, i.e. the innermost line of the leaf location), descending by
/// count, ties broken by name.
pub fn top_functions(profile: &Profile, n: usize) -> Vec<(String, u64)> {
    let index = Index::new(profile);
    let mut by_name: HashMap<String, u64> = HashMap::new();
    for sample in &profile.sample {
        let c = count(sample);
        if c == 0 {
            continue;
        }
        let total = by_name.entry(index.leaf_name(sample)).or_insert(0);
        *total = total.saturating_add(c);
    }
    let mut top: Vec<(String, u64)> = by_name.into_iter().collect();
    top.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    top.truncate(n);
    top
}

/// Decodes a gzip'ed pprof profile, refusing more than
/// [`MAX_DECODED_BYTES`] of decompressed data.
pub fn decode_gz(bytes: &[u8]) -> Result<Profile, FlameGraphError> {
    let mut raw = Vec::new();
    // Read one byte past the cap so "exactly at the cap" and "over" differ.
    GzDecoder::new(bytes)
        .take(MAX_DECODED_BYTES + 1)
        .read_to_end(&mut raw)
        .map_err(FlameGraphError::Gunzip)?;
    if raw.len() as u64 > MAX_DECODED_BYTES {
        return Err(FlameGraphError::TooLarge);
    }
    Ok(Profile::decode(raw.as_slice())?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{Label, Line};
    use std::io::Write;

    /// Builds profiles by hand: strings are interned, functions and
    /// locations get ids in order.
    #[derive(Default)]
    struct Builder {
        p: Profile,
    }

    impl Builder {
        fn new() -> Self {
            let mut b = Self::default();
            b.p.string_table.push(String::new());
            b
        }

        fn s(&mut self, text: &str) -> i64 {
            if let Some(i) = self.p.string_table.iter().position(|t| t == text) {
                return i as i64;
            }
            self.p.string_table.push(text.to_string());
            (self.p.string_table.len() - 1) as i64
        }

        fn func(&mut self, name: &str) -> u64 {
            let name = self.s(name);
            if let Some(f) = self.p.function.iter().find(|f| f.name == name) {
                return f.id;
            }
            let id = self.p.function.len() as u64 + 1;
            self.p.function.push(Function {
                id,
                name,
                ..Default::default()
            });
            id
        }

        /// A location whose lines are `names`, innermost first.
        fn loc(&mut self, names: &[&str]) -> u64 {
            let line = names
                .iter()
                .map(|n| Line {
                    function_id: self.func(n),
                    ..Default::default()
                })
                .collect();
            let id = self.p.location.len() as u64 + 1;
            self.p.location.push(Location {
                id,
                line,
                ..Default::default()
            });
            id
        }

        /// A sample over `locs` (leaf first) with `count` and an optional
        /// process label.
        fn sample(&mut self, locs: &[u64], count: i64, process: Option<&str>) {
            let label = match process {
                Some(p) => vec![Label {
                    key: self.s("process"),
                    str: self.s(p),
                    ..Default::default()
                }],
                None => vec![],
            };
            self.p.sample.push(Sample {
                location_id: locs.to_vec(),
                value: vec![count, count * 10_000_000],
                label,
            });
        }
    }

    fn sample_profile() -> Profile {
        let mut b = Builder::new();
        let main = b.loc(&["main"]);
        let work = b.loc(&["work"]);
        let hot = b.loc(&["hot"]);
        b.sample(&[hot, work, main], 3, Some("app"));
        b.sample(&[work, main], 1, Some("app"));
        b.sample(&[hot, work, main], 2, Some("app"));
        b.sample(&[hot, work, main], 5, None);
        b.p
    }

    #[test]
    fn folded_merges_and_sorts() {
        assert_eq!(
            folded(&sample_profile()),
            vec![
                "app;main;work 1".to_string(),
                "app;main;work;hot 5".to_string(),
                "main;work;hot 5".to_string(),
            ]
        );
    }

    #[test]
    fn folded_expands_inlined_outer_to_inner() {
        let mut b = Builder::new();
        let main = b.loc(&["main"]);
        // `inner` was inlined into `middle`, which was inlined into `outer`.
        let leaf = b.loc(&["inner", "middle", "outer"]);
        b.sample(&[leaf, main], 4, None);
        assert_eq!(
            folded(&b.p),
            vec!["main;outer;middle_[i];inner_[i] 4".to_string()]
        );
        assert_eq!(top_functions(&b.p, 5), vec![("inner".to_string(), 4)]);
    }

    #[test]
    fn folded_sanitizes_names() {
        let mut b = Builder::new();
        let a = b.loc(&["drop<[u8; 8]>"]);
        let c = b.loc(&["line\nbreak 12"]);
        let unnamed = b.loc(&[""]);
        b.sample(&[c, unnamed, a], 1, Some("my;proc"));
        b.sample(&[a], 0, None);
        assert_eq!(
            folded(&b.p),
            vec!["my:proc;drop<[u8: 8]>;[unknown];line break_12 1".to_string()]
        );
    }

    #[test]
    fn unknown_locations_are_kept() {
        let mut b = Builder::new();
        b.p.location.push(Location {
            id: 7,
            address: 0x1a2b,
            ..Default::default()
        });
        b.sample(&[7, 99], 2, None);
        assert_eq!(folded(&b.p), vec!["[unknown];0x1a2b 2".to_string()]);
    }

    #[test]
    fn top_functions_by_self_samples() {
        let mut b = Builder::new();
        let main = b.loc(&["main"]);
        let a = b.loc(&["a"]);
        let z = b.loc(&["z"]);
        let hot = b.loc(&["hot"]);
        b.sample(&[hot, main], 5, None);
        b.sample(&[z, main], 2, None);
        b.sample(&[a, main], 2, None);
        b.sample(&[main], 1, None);
        b.sample(&[hot, a, main], 1, Some("p"));
        let top = top_functions(&b.p, 3);
        assert_eq!(
            top,
            vec![
                ("hot".to_string(), 6),
                ("a".to_string(), 2),
                ("z".to_string(), 2)
            ]
        );
        assert!(top_functions(&Profile::default(), 3).is_empty());
    }

    #[test]
    fn svg_contains_function_names() -> Result<(), FlameGraphError> {
        let out = svg(&sample_profile(), "cpu <window>")?;
        let text = String::from_utf8_lossy(&out);
        assert!(text.contains("<svg"));
        assert!(text.contains("hot"));
        assert!(text.contains("cpu &lt;window&gt;"));
        Ok(())
    }

    #[test]
    fn svg_of_empty_profile_says_no_samples() -> Result<(), FlameGraphError> {
        let out = svg(&Profile::default(), "a & b")?;
        let text = String::from_utf8_lossy(&out);
        assert!(text.starts_with("<?xml"));
        assert!(text.contains("<svg") && text.trim_end().ends_with("</svg>"));
        assert!(text.contains("no samples"));
        assert!(text.contains("a &amp; b"));
        Ok(())
    }

    #[test]
    fn decode_gz_round_trip_and_garbage() -> Result<(), Box<dyn std::error::Error>> {
        let profile = sample_profile();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&profile.encode_to_vec())?;
        let bytes = gz.finish()?;
        assert_eq!(decode_gz(&bytes)?, profile);

        assert!(matches!(
            decode_gz(b"not gzip at all"),
            Err(FlameGraphError::Gunzip(_))
        ));
        // Valid gzip around bytes that are not a profile.
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&[0xff; 64])?;
        assert!(matches!(
            decode_gz(&gz.finish()?),
            Err(FlameGraphError::Decode(_))
        ));
        Ok(())
    }
}
