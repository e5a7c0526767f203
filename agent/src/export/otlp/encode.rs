//! OTLP profiles (`v1development`, opentelemetry-proto 0.33): a window as one
//! `ExportProfilesServiceRequest`.
//!
//! In: a [`Symbolized`] window. Out: the shared `ProfilesDictionary` (strings, mappings,
//! locations, functions, stacks and attributes; index 0 of every table is the zero value)
//! and one `ResourceProfiles` per container (or per process), whose resource carries the
//! semantic-convention attributes (`service.name`, `host.name`, `container.id`, `k8s.*`,
//! `process.*`), all taken from the stacks' typed workload labels. Each sample carries
//! `thread.id` and `thread.name`; its value is CPU time in nanoseconds
//! (`cpu/nanoseconds`, period 1e9/Hz). Sending is [`super`]'s.

use std::collections::{BTreeMap, HashMap};
use std::time::UNIX_EPOCH;

use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::profiles::v1development as otlp;
use opentelemetry_proto::tonic::resource::v1::Resource;

use crate::config::ResourcePer;
use crate::encode::pprof::{location_key, LocationKey, WindowLocations};
use crate::model::{Mapping, SymFrame, SymStack, Symbolized};

/// The export request for window `w`: resources per container (or per process, as `per`
/// says), naming `host` as `host.name` (and `k8s.node.name` for pods).
pub fn request(w: &Symbolized, host: &str, per: ResourcePer) -> ExportProfilesServiceRequest {
    let window = WindowLocations::of(w);
    let mut d = Dict::new(&window);
    let start = w
        .start
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let (kind, unit) = crate::encode::pprof::value_type(w.kind);
    let cpu_ns = otlp::ValueType {
        type_strindex: d.string(kind),
        unit_strindex: d.string(unit),
    };
    let mut groups: BTreeMap<String, (Vec<KeyValue>, Vec<otlp::Sample>)> = BTreeMap::new();
    for s in &w.stacks {
        let per_process = per == ResourcePer::Process || s.labels.container_id.is_empty();
        let key = if per_process {
            format!("pid:{}", s.pid)
        } else {
            format!("container:{}", s.labels.container_id)
        };
        let entry = groups
            .entry(key)
            .or_insert_with(|| (resource(s, host, per_process), Vec::new()));
        let mut attribute_indices = vec![
            d.attribute("thread.id", int(s.tid)),
            d.attribute("thread.name", string(&s.comm)),
        ];
        if !per_process {
            // Several processes share a container resource: name them per sample.
            attribute_indices.push(d.attribute("process.pid", int(s.pid)));
            attribute_indices.push(d.attribute("process.executable.name", string(&s.process)));
        }
        if let Some(o) = s.off_cpu {
            attribute_indices.push(d.attribute("state", string(o.state.as_str())));
        }
        let stack_index = d.stack(s);
        entry.1.push(otlp::Sample {
            stack_index,
            attribute_indices,
            link_index: 0,
            values: vec![match s.off_cpu {
                Some(o) => o.ns as i64,
                None => (s.count * w.period_ns) as i64,
            }],
            timestamps_unix_nano: Vec::new(),
        });
    }
    let resource_profiles = groups
        .into_values()
        .map(|(attributes, samples)| otlp::ResourceProfiles {
            resource: Some(Resource {
                attributes,
                ..Default::default()
            }),
            scope_profiles: vec![otlp::ScopeProfiles {
                scope: Some(InstrumentationScope {
                    name: "ember".into(),
                    version: env!("CARGO_PKG_VERSION").into(),
                    ..Default::default()
                }),
                profiles: vec![otlp::Profile {
                    sample_type: Some(cpu_ns),
                    samples,
                    time_unix_nano: start,
                    duration_nano: w.duration.as_nanos() as u64,
                    period_type: Some(cpu_ns),
                    period: match w.kind {
                        crate::model::ProfileKind::Cpu => w.period_ns as i64,
                        _ => 1,
                    },
                    ..Default::default()
                }],
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        })
        .collect();
    ExportProfilesServiceRequest {
        resource_profiles,
        dictionary: Some(d.finish()),
    }
}

/// The resource attributes of the group `s` opens.
fn resource(s: &SymStack, host: &str, per_process: bool) -> Vec<KeyValue> {
    let l = &s.labels;
    let service = [l.service_name.as_str(), &s.process]
        .into_iter()
        .find(|n| !n.is_empty())
        .unwrap_or("unknown");
    let mut a = vec![kv("service.name", string(service))];
    if !host.is_empty() {
        a.push(kv("host.name", string(host)));
    }
    for (k, v) in [
        ("container.id", &l.container_id),
        ("k8s.namespace.name", &l.namespace),
        ("k8s.pod.name", &l.pod),
        ("k8s.pod.uid", &l.pod_uid),
        ("k8s.container.name", &l.container),
    ] {
        if !v.is_empty() {
            a.push(kv(k, string(v)));
        }
    }
    if !l.namespace.is_empty() && !host.is_empty() {
        a.push(kv("k8s.node.name", string(host)));
    }
    if per_process {
        a.push(kv("process.pid", int(s.pid)));
        if !s.process.is_empty() {
            a.push(kv("process.executable.name", string(&s.process)));
        }
    }
    a
}

fn string(s: &str) -> any_value::Value {
    any_value::Value::StringValue(s.to_owned())
}

fn int(i: u32) -> any_value::Value {
    any_value::Value::IntValue(i64::from(i))
}

fn kv(key: &str, v: any_value::Value) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue { value: Some(v) }),
        ..Default::default()
    }
}

/// The `ProfilesDictionary` under construction. Mappings, locations and functions are
/// the pprof profile's ([`super::pprof`]): same keys, same first-use order.
struct Dict<'w> {
    d: otlp::ProfilesDictionary,
    /// The window's mappings' address ranges.
    window: &'w WindowLocations<'w>,
    strings: HashMap<String, i32>,
    /// By name and file (no file and an empty one are the same).
    functions: HashMap<(&'w str, &'w str), i32>,
    mappings: HashMap<&'w Mapping, i32>,
    locations: HashMap<LocationKey<'w>, i32>,
    stacks: HashMap<Vec<i32>, i32>,
    attributes: HashMap<(String, String), i32>,
}

fn index(len: usize) -> i32 {
    i32::try_from(len).unwrap_or(i32::MAX)
}

impl<'w> Dict<'w> {
    fn new(window: &'w WindowLocations<'w>) -> Self {
        let d = otlp::ProfilesDictionary {
            mapping_table: vec![otlp::Mapping::default()],
            location_table: vec![otlp::Location::default()],
            function_table: vec![otlp::Function::default()],
            link_table: vec![otlp::Link::default()],
            string_table: vec![String::new()],
            attribute_table: vec![otlp::KeyValueAndUnit::default()],
            stack_table: vec![otlp::Stack::default()],
        };
        let mut strings = HashMap::new();
        strings.insert(String::new(), 0);
        Self {
            d,
            window,
            strings,
            functions: HashMap::new(),
            mappings: HashMap::new(),
            locations: HashMap::new(),
            stacks: HashMap::new(),
            attributes: HashMap::new(),
        }
    }

    fn string(&mut self, s: &str) -> i32 {
        if let Some(&i) = self.strings.get(s) {
            return i;
        }
        let i = index(self.d.string_table.len());
        self.d.string_table.push(s.to_owned());
        self.strings.insert(s.to_owned(), i);
        i
    }

    fn attribute(&mut self, key: &str, v: any_value::Value) -> i32 {
        let k = (key.to_owned(), format!("{v:?}"));
        if let Some(&i) = self.attributes.get(&k) {
            return i;
        }
        let i = index(self.d.attribute_table.len());
        let key_strindex = self.string(key);
        self.d.attribute_table.push(otlp::KeyValueAndUnit {
            key_strindex,
            value: Some(AnyValue { value: Some(v) }),
            unit_strindex: 0,
        });
        self.attributes.insert(k, i);
        i
    }

    fn mapping(&mut self, m: &'w Mapping) -> i32 {
        if let Some(&i) = self.mappings.get(m) {
            return i;
        }
        let (memory_start, memory_limit) = self.window.span(m).map_or((0, 0), |s| s.bounds());
        let filename_strindex = self.string(m.file_name());
        let i = index(self.d.mapping_table.len());
        self.d.mapping_table.push(otlp::Mapping {
            memory_start,
            memory_limit,
            file_offset: 0,
            filename_strindex,
            attribute_indices: Vec::new(),
        });
        self.mappings.insert(m, i);
        i
    }

    fn function(&mut self, name: &'w str, file: &'w str) -> i32 {
        if let Some(&i) = self.functions.get(&(name, file)) {
            return i;
        }
        let name_strindex = self.string(name);
        let filename_strindex = self.string(file);
        let i = index(self.d.function_table.len());
        self.d.function_table.push(otlp::Function {
            name_strindex,
            system_name_strindex: name_strindex,
            filename_strindex,
            start_line: 0,
        });
        self.functions.insert((name, file), i);
        i
    }

    fn location(&mut self, f: &'w SymFrame) -> i32 {
        let key = location_key(f);
        if let Some(&i) = self.locations.get(&key) {
            return i;
        }
        let mapping_index = self.mapping(&f.mapping);
        let lines = f
            .funcs
            .iter()
            .map(|func| otlp::Line {
                function_index: self.function(&func.name, func.file.as_deref().unwrap_or("")),
                line: i64::from(func.line),
                column: 0,
            })
            .collect();
        let i = index(self.d.location_table.len());
        self.d.location_table.push(otlp::Location {
            mapping_index,
            address: f.address,
            lines,
            attribute_indices: Vec::new(),
        });
        self.locations.insert(key, i);
        i
    }

    /// The stack of `s`'s frames (leaf first, as in pprof and OTLP).
    fn stack(&mut self, s: &'w SymStack) -> i32 {
        let location_indices: Vec<i32> = s.frames.iter().map(|f| self.location(f)).collect();
        if let Some(&i) = self.stacks.get(&location_indices) {
            return i;
        }
        let i = index(self.d.stack_table.len());
        self.stacks.insert(location_indices.clone(), i);
        self.d.stack_table.push(otlp::Stack { location_indices });
        i
    }

    fn finish(self) -> otlp::ProfilesDictionary {
        self.d
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Func, Labels};
    use std::sync::Arc;
    use std::time::Duration;

    fn frame(name: &str, address: u64) -> Arc<SymFrame> {
        Arc::new(SymFrame {
            mapping: Mapping::Unknown,
            address,
            funcs: vec![Func {
                name: Arc::from(name),
                file: None,
                line: 0,
            }]
            .into(),
            named: true,
        })
    }

    #[test]
    fn dictionary_and_resources() {
        let (main, work) = (frame("main", 1), frame("work", 2));
        let container = Arc::new(Labels {
            container_id: "abc".into(),
            namespace: "shop".into(),
            ..Labels::default()
        });
        let w = Symbolized {
            start: UNIX_EPOCH + Duration::from_secs(100),
            duration: Duration::from_secs(10),
            period_ns: 10_000_000,
            kind: Default::default(),
            stacks: vec![
                SymStack {
                    pid: 10,
                    tid: 11,
                    comm: "worker".into(),
                    process: Arc::from("web"),
                    labels: container,
                    frames: vec![work, main.clone()],
                    count: 2,
                    off_cpu: None,
                    runtime: None,
                },
                SymStack {
                    pid: 20,
                    tid: 20,
                    comm: "web".into(),
                    process: Arc::from("web"),
                    labels: Arc::default(),
                    frames: vec![main],
                    count: 1,
                    off_cpu: None,
                    runtime: None,
                },
            ],
        };
        let r = request(
            &w,
            "node-1",
            crate::config::OtlpSink::default().resource_per,
        );
        let d = r.dictionary.as_ref().expect("dictionary");
        for (name, zero) in [
            ("string", d.string_table[0].is_empty()),
            ("stack", d.stack_table[0] == otlp::Stack::default()),
            ("function", d.function_table[0] == otlp::Function::default()),
            ("location", d.location_table[0] == otlp::Location::default()),
            (
                "attribute",
                d.attribute_table[0] == otlp::KeyValueAndUnit::default(),
            ),
        ] {
            assert!(zero, "{name} table index 0 is not the zero value");
        }
        assert_eq!(
            r.resource_profiles.len(),
            2,
            "one container, one host process"
        );
        let attrs = |i: usize| -> Vec<(String, String)> {
            r.resource_profiles[i]
                .resource
                .as_ref()
                .map(|res| {
                    res.attributes
                        .iter()
                        .map(|kv| {
                            let v = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                                Some(any_value::Value::StringValue(s)) => s.clone(),
                                Some(any_value::Value::IntValue(i)) => i.to_string(),
                                other => format!("{other:?}"),
                            };
                            (kv.key.clone(), v)
                        })
                        .collect()
                })
                .unwrap_or_default()
        };
        let container = attrs(0);
        assert!(
            container.contains(&("container.id".into(), "abc".into())),
            "{container:?}"
        );
        assert!(container.contains(&("k8s.node.name".into(), "node-1".into())));
        assert!(!container.iter().any(|(k, _)| k == "process.pid"));
        let host = attrs(1);
        assert!(
            host.contains(&("process.pid".into(), "20".into())),
            "{host:?}"
        );
        assert!(
            host.contains(&("service.name".into(), "web".into())),
            "{host:?}"
        );
        let prof = &r.resource_profiles[0].scope_profiles[0].profiles[0];
        assert_eq!(prof.samples[0].values, vec![20_000_000]);
        let stack = &d.stack_table[prof.samples[0].stack_index as usize];
        let names: Vec<&str> = stack
            .location_indices
            .iter()
            .map(|&l| {
                let f = d.location_table[l as usize].lines[0].function_index;
                d.string_table[d.function_table[f as usize].name_strindex as usize].as_str()
            })
            .collect();
        assert_eq!(names, ["work", "main"]);
        let st = prof.sample_type.expect("sample type");
        assert_eq!(d.string_table[st.type_strindex as usize], "cpu");
        assert_eq!(prof.period, 10_000_000);
    }
}
