//! Encoding stage: turns a symbolized window into a pprof CPU profile, written the way
//! the Go runtime writes them (`samples/count` + `cpu/nanoseconds`, period 1e9/Hz).

use std::collections::HashMap;
use std::io::Write;
use std::time::UNIX_EPOCH;

use flate2::write::GzEncoder;
use flate2::Compression;

use crate::aggregate::{Frame, Window};
use crate::normalize::object::ObjectKey;
use crate::normalize::process::UserAddr;
use crate::proto::{Function, Label, Line, Location, Mapping, Profile, Sample, ValueType};
use crate::symbolize::{unnamed, FrameKey, Resolved, KERNEL_MAPPING};

/// How many frames were named, for `ember_frames_total`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct FrameCounts {
    /// Frames with a symbol.
    pub named: u64,
    /// Frames shown as `object+offset` or `[unknown]`.
    pub unnamed: u64,
    /// Frames in JIT code named from a perf map or jitdump.
    pub jit: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum MapKey {
    Kernel,
    Object(ObjectKey),
    Region(String),
    Unknown,
    Jit(crate::normalize::jit::Source),
}

#[derive(Default)]
struct Builder {
    profile: Profile,
    strings: HashMap<String, i64>,
    mappings: HashMap<MapKey, usize>,
    /// By mapping, address and (for JIT code, whose addresses are per process) name.
    locations: HashMap<(u64, u64, i64), u64>,
    functions: HashMap<(i64, i64), u64>,
}

impl Builder {
    fn string(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.strings.get(s) {
            return i;
        }
        let i = self.profile.string_table.len() as i64;
        self.profile.string_table.push(s.to_owned());
        self.strings.insert(s.to_owned(), i);
        i
    }

    fn mapping(&mut self, key: MapKey, filename: &str, build_id: Option<&[u8]>) -> usize {
        if let Some(&i) = self.mappings.get(&key) {
            return i;
        }
        let filename = self.string(filename);
        let build_id = match build_id {
            Some(b) => {
                let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
                self.string(&hex)
            }
            None => 0,
        };
        let i = self.profile.mapping.len();
        self.profile.mapping.push(Mapping {
            id: i as u64 + 1,
            memory_start: u64::MAX,
            filename,
            build_id,
            has_functions: true,
            ..Default::default()
        });
        self.mappings.insert(key, i);
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

    fn location(&mut self, mapping: usize, address: u64, resolved: &Resolved, jit: bool) -> u64 {
        let mapping_id = mapping as u64 + 1;
        // The same JIT address in two processes is two different functions.
        let name = match resolved.funcs.first() {
            Some(f) if jit => self.string(&f.name),
            _ => 0,
        };
        if let Some(&id) = self.locations.get(&(mapping_id, address, name)) {
            return id;
        }
        let m = &mut self.profile.mapping[mapping];
        // A mapping here spans the addresses seen in it (file offsets for object files).
        m.memory_start = m.memory_start.min(address);
        m.memory_limit = m.memory_limit.max(address + 1);
        m.has_filenames |= resolved.funcs.iter().any(|f| f.file.is_some());
        m.has_line_numbers |= resolved.funcs.iter().any(|f| f.line > 0);
        m.has_inline_frames |= resolved.funcs.len() > 1;
        let line = resolved
            .funcs
            .iter()
            .map(|f| Line {
                function_id: self.function(&f.name, f.file.as_deref()),
                line: i64::from(f.line),
                column: 0,
            })
            .collect();
        let id = self.profile.location.len() as u64 + 1;
        self.profile.location.push(Location {
            id,
            mapping_id,
            address,
            line,
            is_folded: false,
        });
        self.locations.insert((mapping_id, address, name), id);
        id
    }

    fn frame(
        &mut self,
        frame: &Frame,
        symbols: &HashMap<FrameKey, Resolved>,
        counts: &mut FrameCounts,
    ) -> u64 {
        let key = match frame {
            Frame::Kernel(a) => Some(FrameKey::Kernel(*a)),
            Frame::User(UserAddr::Object(o, off)) => Some(FrameKey::Object(o.key, *off)),
            Frame::User(_) => None,
        };
        if let Frame::User(UserAddr::Jit(j)) = frame {
            counts.jit += 1;
            let resolved = Resolved {
                funcs: vec![crate::symbolize::Func {
                    name: j.name.clone(),
                    file: j.file.clone(),
                    line: j.line,
                }]
                .into(),
                named: true,
            };
            let m = self.mapping(MapKey::Jit(j.source), j.source.mapping_name(), None);
            return self.location(m, j.addr, &resolved, true);
        }
        let fallback;
        let resolved = match key.and_then(|k| symbols.get(&k)) {
            Some(r) => r,
            None => {
                fallback = unnamed(frame);
                &fallback
            }
        };
        if resolved.named {
            counts.named += 1;
        } else {
            counts.unnamed += 1;
        }
        let (mapping, address) = match frame {
            Frame::Kernel(a) => (self.mapping(MapKey::Kernel, KERNEL_MAPPING, None), *a),
            Frame::User(UserAddr::Object(o, off)) => (
                self.mapping(MapKey::Object(o.key), &o.path, o.build_id.as_deref()),
                *off,
            ),
            Frame::User(UserAddr::Region(label, off)) => (
                self.mapping(MapKey::Region(label.to_string()), label, None),
                *off,
            ),
            Frame::User(UserAddr::Unknown(a)) => {
                (self.mapping(MapKey::Unknown, "[unknown]", None), *a)
            }
            // Returned above.
            Frame::User(UserAddr::Jit(j)) => {
                (self.mapping(MapKey::Unknown, "[unknown]", None), j.addr)
            }
        };
        self.location(mapping, address, resolved, false)
    }

    fn num_label(&mut self, key: &str, num: i64) -> Label {
        Label {
            key: self.string(key),
            num,
            ..Default::default()
        }
    }

    fn str_label(&mut self, key: &str, value: &str) -> Label {
        Label {
            key: self.string(key),
            str: self.string(value),
            ..Default::default()
        }
    }
}

/// Encodes `window`, naming frames from `symbols` (frames missing there are unnamed).
pub fn encode(window: &Window, symbols: &HashMap<FrameKey, Resolved>) -> (Profile, FrameCounts) {
    let mut b = Builder::default();
    b.string("");
    let samples = ValueType {
        r#type: b.string("samples"),
        unit: b.string("count"),
    };
    let cpu = ValueType {
        r#type: b.string("cpu"),
        unit: b.string("nanoseconds"),
    };
    b.profile.sample_type = vec![samples, cpu];
    b.profile.period_type = Some(cpu);
    b.profile.period = window.period_ns as i64;
    b.profile.default_sample_type = cpu.r#type;
    b.profile.time_nanos = window
        .start
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64);
    b.profile.duration_nanos = window.duration.as_nanos() as i64;

    let mut counts = FrameCounts::default();
    for stack in &window.stacks {
        let location_id = stack
            .frames
            .iter()
            .map(|f| b.frame(f, symbols, &mut counts))
            .collect();
        let mut label = vec![
            b.num_label("pid", i64::from(stack.pid)),
            b.num_label("tid", i64::from(stack.tid)),
            b.str_label("comm", &stack.comm),
            b.str_label("process", &stack.process),
        ];
        for (k, v) in stack.labels.sample_labels() {
            label.push(b.str_label(k, v));
        }
        b.profile.sample.push(Sample {
            location_id,
            value: vec![stack.count as i64, (stack.count * window.period_ns) as i64],
            label,
        });
    }
    for m in &mut b.profile.mapping {
        if m.memory_start == u64::MAX {
            m.memory_start = 0;
        }
    }
    (b.profile, counts)
}

/// Serializes and gzips a profile, as pprof files are stored.
pub fn to_gzip(profile: &Profile) -> std::io::Result<Vec<u8>> {
    let raw = prost::Message::encode_to_vec(profile);
    let mut gz = GzEncoder::new(Vec::with_capacity(raw.len() / 4), Compression::default());
    gz.write_all(&raw)?;
    gz.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::Stack;
    use crate::symbolize::Func;
    use std::sync::Arc;
    use std::time::{Duration, SystemTime};

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
        };
        Window {
            start: UNIX_EPOCH + Duration::from_secs(1_700_000_000),
            duration: Duration::from_secs(10),
            period_ns: 10_101_010,
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
        let mut symbols = HashMap::new();
        symbols.insert(FrameKey::Kernel(0xffff_0010), resolved(&["inner", "outer"]));
        symbols.insert(FrameKey::Kernel(0xffff_0020), resolved(&["syscall"]));
        let (p, counts) = encode(&window(), &symbols);
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
        assert_eq!(back.mapping[0].memory_start, 0xffff_0010);
        assert_eq!(back.mapping[0].memory_limit, 0xffff_0021);
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
        let (p, _) = encode(&window(), &HashMap::new());
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
            stacks: vec![],
        };
        let (p, c) = encode(&w, &HashMap::new());
        assert!(p.sample.is_empty());
        assert_eq!(c, FrameCounts::default());
        assert_eq!(p.string_table[0], "");
    }
}
