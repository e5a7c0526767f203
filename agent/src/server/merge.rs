//! Merges window profiles into one: strings, functions, mappings and locations are
//! interned again, samples with the same stack and labels are summed.
//!
//! Memory grows with distinct samples (and the locations they use), never with the
//! number of windows: [`Merger::add`] refuses to go past `max_samples` with
//! [`MergeError::TooManySamples`], so a range too wide for the cap gets a clear error
//! instead of an unbounded allocation.

use std::collections::HashMap;

use super::limits::{Stopped, Work};
use crate::proto::{Function, Label, Line, Location, Mapping, Profile, Sample, ValueType};

/// Why a merge stopped.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum MergeError {
    /// The merged profile would hold more distinct samples than allowed.
    #[error(
        "the range holds more than {cap} distinct samples (server.max_merge_samples): \
         narrow the time range or filter by a label"
    )]
    TooManySamples {
        /// The cap.
        cap: usize,
    },
    /// The windows do not share sample types (e.g. a CPU and an off-CPU profile).
    #[error("window sample types differ from the first window's")]
    SampleTypes,
    /// The request's deadline passed, or it went away.
    #[error("{0}")]
    Stopped(#[from] Stopped),
}

/// Which samples to keep: every `(key, value)` must match one label of the sample
/// (numeric labels compare by their decimal text).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct LabelFilter(pub(crate) Vec<(String, String)>);

impl LabelFilter {
    pub(crate) fn keeps(&self, p: &Profile, s: &Sample) -> bool {
        self.0.iter().all(|(key, want)| {
            s.label.iter().any(|l| {
                str_at(p, l.key) == key
                    && if l.str != 0 {
                        str_at(p, l.str) == want
                    } else {
                        l.num.to_string() == *want
                    }
            })
        })
    }
}

/// The string at `i` of `p`'s table, or `""` for a bad index (counted as nothing).
pub(super) fn str_at(p: &Profile, i: i64) -> &str {
    usize::try_from(i)
        .ok()
        .and_then(|i| p.string_table.get(i))
        .map_or("", String::as_str)
}

type LabelKey = (i64, i64, i64, i64);

/// A location's identity: mapping, address and its (function, line) pairs.
type LocationKey = (u64, u64, Vec<(u64, i64)>);

/// A merged profile under construction.
pub(crate) struct Merger {
    out: Profile,
    max_samples: usize,
    strings: HashMap<String, i64>,
    functions: HashMap<(i64, i64, i64, i64), u64>,
    /// By file name, build id and file offset: the same object in every window. Its
    /// address span widens to cover all of them.
    mappings: HashMap<(i64, i64, u64), u64>,
    /// By mapping, address and lines (JIT code has per-process addresses, told apart
    /// by name).
    locations: HashMap<LocationKey, u64>,
    samples: HashMap<(Vec<u64>, Vec<LabelKey>), usize>,
    started: bool,
    end_nanos: i64,
}

impl Merger {
    /// An empty merge that holds at most `max_samples` distinct samples.
    pub(crate) fn new(max_samples: usize) -> Self {
        let mut m = Self {
            out: Profile::default(),
            max_samples,
            strings: HashMap::new(),
            functions: HashMap::new(),
            mappings: HashMap::new(),
            locations: HashMap::new(),
            samples: HashMap::new(),
            started: false,
            end_nanos: 0,
        };
        m.string("");
        m
    }

    fn string(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.strings.get(s) {
            return i;
        }
        let i = self.out.string_table.len() as i64;
        self.out.string_table.push(s.to_string());
        self.strings.insert(s.to_string(), i);
        i
    }

    fn value_type(&mut self, p: &Profile, v: &ValueType) -> ValueType {
        ValueType {
            r#type: self.string(str_at(p, v.r#type)),
            unit: self.string(str_at(p, v.unit)),
        }
    }

    /// Adds the samples of `p` that `filter` keeps, polling `work` as it goes.
    pub(crate) fn add(
        &mut self,
        p: &Profile,
        filter: &LabelFilter,
        work: &Work,
    ) -> Result<(), MergeError> {
        self.header(p)?;
        let mapping_ids = self.add_mappings(p, work)?;
        let function_ids = self.add_functions(p, work)?;
        let mut location_ids: HashMap<u64, u64> = HashMap::new();
        for loc in &p.location {
            work.tick()?;
            let mapping = mapping_ids.get(&loc.mapping_id).copied().unwrap_or(0);
            let lines: Vec<(u64, i64)> = loc
                .line
                .iter()
                .map(|l| {
                    (
                        function_ids.get(&l.function_id).copied().unwrap_or(0),
                        l.line,
                    )
                })
                .collect();
            let key = (mapping, loc.address, lines);
            let next = self.out.location.len() as u64 + 1;
            let id = *self.locations.entry(key).or_insert(next);
            if id == next {
                self.out.location.push(Location {
                    id,
                    mapping_id: mapping,
                    address: loc.address,
                    line: loc
                        .line
                        .iter()
                        .map(|l| Line {
                            function_id: function_ids.get(&l.function_id).copied().unwrap_or(0),
                            line: l.line,
                            ..Default::default()
                        })
                        .collect(),
                    is_folded: loc.is_folded,
                });
            }
            location_ids.insert(loc.id, id);
        }
        let width = self.out.sample_type.len();
        for s in &p.sample {
            work.tick()?;
            if !filter.keeps(p, s) {
                continue;
            }
            let locs: Vec<u64> = s
                .location_id
                .iter()
                .filter_map(|id| location_ids.get(id).copied())
                .collect();
            let labels: Vec<LabelKey> = s
                .label
                .iter()
                .map(|l| {
                    (
                        self.string(str_at(p, l.key)),
                        self.string(str_at(p, l.str)),
                        l.num,
                        self.string(str_at(p, l.num_unit)),
                    )
                })
                .collect();
            let key = (locs, labels);
            let index = match self.samples.get(&key) {
                Some(&i) => i,
                None => {
                    if self.out.sample.len() >= self.max_samples {
                        return Err(MergeError::TooManySamples {
                            cap: self.max_samples,
                        });
                    }
                    let i = self.out.sample.len();
                    self.out.sample.push(Sample {
                        location_id: key.0.clone(),
                        value: vec![0; width],
                        label: key
                            .1
                            .iter()
                            .map(|&(key, str, num, num_unit)| Label {
                                key,
                                str,
                                num,
                                num_unit,
                            })
                            .collect(),
                    });
                    self.samples.insert(key, i);
                    i
                }
            };
            let sum = &mut self.out.sample[index].value;
            for (acc, v) in sum.iter_mut().zip(&s.value) {
                *acc = acc.saturating_add(*v);
            }
        }
        Ok(())
    }

    /// Takes the first window's header; later windows must have the same sample types.
    fn header(&mut self, p: &Profile) -> Result<(), MergeError> {
        let types: Vec<ValueType> = p
            .sample_type
            .iter()
            .map(|v| self.value_type(p, v))
            .collect();
        let end = p.time_nanos.saturating_add(p.duration_nanos);
        if !self.started {
            self.started = true;
            self.out.sample_type = types;
            self.out.period_type = p.period_type.map(|v| self.value_type(p, &v));
            self.out.period = p.period;
            self.out.default_sample_type = self.string(str_at(p, p.default_sample_type));
            self.out.time_nanos = p.time_nanos;
            self.end_nanos = end;
        } else if types != self.out.sample_type {
            return Err(MergeError::SampleTypes);
        } else {
            self.out.time_nanos = self.out.time_nanos.min(p.time_nanos);
            self.end_nanos = self.end_nanos.max(end);
        }
        self.out.duration_nanos = self.end_nanos.saturating_sub(self.out.time_nanos);
        Ok(())
    }

    fn add_mappings(&mut self, p: &Profile, work: &Work) -> Result<HashMap<u64, u64>, Stopped> {
        let mut ids = HashMap::new();
        for m in &p.mapping {
            work.tick()?;
            let key = (
                self.string(str_at(p, m.filename)),
                self.string(str_at(p, m.build_id)),
                m.file_offset,
            );
            let next = self.out.mapping.len() as u64 + 1;
            let id = *self.mappings.entry(key).or_insert(next);
            if id == next {
                self.out.mapping.push(Mapping {
                    id,
                    memory_start: m.memory_start,
                    memory_limit: m.memory_limit,
                    file_offset: m.file_offset,
                    filename: key.0,
                    build_id: key.1,
                    ..*m
                });
            } else if let Some(out) = self.out.mapping.get_mut(id as usize - 1) {
                out.memory_start = out.memory_start.min(m.memory_start);
                out.memory_limit = out.memory_limit.max(m.memory_limit);
                out.has_functions |= m.has_functions;
                out.has_filenames |= m.has_filenames;
                out.has_line_numbers |= m.has_line_numbers;
                out.has_inline_frames |= m.has_inline_frames;
            }
            ids.insert(m.id, id);
        }
        Ok(ids)
    }

    fn add_functions(&mut self, p: &Profile, work: &Work) -> Result<HashMap<u64, u64>, Stopped> {
        let mut ids = HashMap::new();
        for f in &p.function {
            work.tick()?;
            let key = (
                self.string(str_at(p, f.name)),
                self.string(str_at(p, f.system_name)),
                self.string(str_at(p, f.filename)),
                f.start_line,
            );
            let next = self.out.function.len() as u64 + 1;
            let id = *self.functions.entry(key).or_insert(next);
            if id == next {
                self.out.function.push(Function {
                    id,
                    name: key.0,
                    system_name: key.1,
                    filename: key.2,
                    start_line: key.3,
                });
            }
            ids.insert(f.id, id);
        }
        Ok(ids)
    }

    /// The merged profile. With no window added it has no sample types; callers give
    /// such a range the header of an empty CPU profile.
    pub(crate) fn finish(self) -> Profile {
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A profile with one sample `leaf <- main` of `n`, labelled `container=c`.
    fn window(leaf: &str, container: &str, n: i64, at: i64) -> Profile {
        Profile {
            sample_type: vec![ValueType { r#type: 1, unit: 2 }],
            string_table: ["", "samples", "count", "main", leaf, "container", container]
                .map(String::from)
                .to_vec(),
            function: vec![
                Function {
                    id: 1,
                    name: 3,
                    ..Default::default()
                },
                Function {
                    id: 2,
                    name: 4,
                    ..Default::default()
                },
            ],
            location: (1..=2)
                .map(|id| Location {
                    id,
                    address: 0x1000 * id,
                    line: vec![Line {
                        function_id: id,
                        ..Default::default()
                    }],
                    ..Default::default()
                })
                .collect(),
            sample: vec![Sample {
                location_id: vec![2, 1],
                value: vec![n],
                label: vec![Label {
                    key: 5,
                    str: 6,
                    ..Default::default()
                }],
            }],
            time_nanos: at,
            duration_nanos: 10,
            ..Default::default()
        }
    }

    #[test]
    fn sums_equal_stacks_and_filters_by_label() -> Result<(), MergeError> {
        let mut m = Merger::new(10);
        let all = LabelFilter::default();
        let w = Work::unlimited();
        m.add(&window("hot", "a", 3, 100), &all, &w)?;
        m.add(&window("hot", "a", 4, 110), &all, &w)?;
        m.add(&window("cold", "b", 5, 120), &all, &w)?;
        let p = m.finish();
        assert_eq!(p.sample.len(), 2);
        assert_eq!(p.sample[0].value, vec![7]);
        assert_eq!(p.function.len(), 3);
        assert_eq!((p.time_nanos, p.duration_nanos), (100, 30));

        let mut m = Merger::new(10);
        let only_b = LabelFilter(vec![("container".into(), "b".into())]);
        m.add(&window("hot", "a", 3, 100), &only_b, &w)?;
        m.add(&window("cold", "b", 5, 120), &only_b, &w)?;
        let p = m.finish();
        assert_eq!(p.sample.len(), 1);
        assert_eq!(p.sample[0].value, vec![5]);
        Ok(())
    }

    #[test]
    fn stops_at_the_cap() {
        let mut m = Merger::new(1);
        let all = LabelFilter::default();
        let w = Work::unlimited();
        assert!(m.add(&window("hot", "a", 3, 100), &all, &w).is_ok());
        assert_eq!(
            m.add(&window("cold", "a", 3, 100), &all, &w),
            Err(MergeError::TooManySamples { cap: 1 })
        );
    }
}
