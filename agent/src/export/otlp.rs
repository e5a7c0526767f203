//! OTLP profiles (`v1development`, opentelemetry-proto 0.33) over gRPC.
//!
//! A window becomes one `ExportProfilesServiceRequest`: the shared
//! `ProfilesDictionary` (strings, mappings, locations, functions, stacks and
//! attributes; index 0 of every table is the zero value) and one
//! `ResourceProfiles` per container (or per process), whose resource carries
//! the semantic-convention attributes (`service.name`, `host.name`,
//! `container.id`, `k8s.*`, `process.*`). Each sample carries `thread.id` and
//! `thread.name`; its value is CPU time in nanoseconds (`cpu/nanoseconds`,
//! period 1e9/Hz), the second value of the pprof sample.

use std::collections::{BTreeMap, HashMap};
use std::time::UNIX_EPOCH;

use anyhow::{Context, Result};
use opentelemetry_proto::tonic::collector::profiles::v1development::profiles_service_client::ProfilesServiceClient;
use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::profiles::v1development as otlp;
use opentelemetry_proto::tonic::resource::v1::Resource;
use prost::Message;
use tonic::codec::CompressionEncoding;
use tonic::metadata::{MetadataKey, MetadataMap, MetadataValue};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

use super::delivery::{Outcome, Transient, Transport};
use super::Encode;
use crate::config::{OtlpSink, ResourcePer};
use crate::encode::Encoded;
use crate::metrics::ExportDrop;
use crate::proto::{Profile, Sample};

/// Metric and log name of this sink.
pub const NAME: &str = "otlp";

/// Builds export requests from windows.
pub struct Encoder {
    host: String,
    per: ResourcePer,
}

impl Encoder {
    /// An encoder naming `host` as `host.name` (and `k8s.node.name` for pods).
    pub fn new(cfg: &OtlpSink, host: &str) -> Self {
        Self {
            host: host.to_owned(),
            per: cfg.resource_per,
        }
    }

    /// The export request for one window.
    pub fn request(&self, w: &Encoded) -> ExportProfilesServiceRequest {
        let p = &w.profile;
        let mut d = Dict::new(p);
        let start = w
            .start
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let cpu_ns = otlp::ValueType {
            type_strindex: d.string("cpu"),
            unit_strindex: d.string("nanoseconds"),
        };
        // Which pprof value is CPU time: the sample type named cpu/nanoseconds.
        let value_index = p
            .sample_type
            .iter()
            .position(|vt| text(p, vt.r#type) == "cpu" && text(p, vt.unit) == "nanoseconds");
        let mut groups: BTreeMap<String, (Vec<KeyValue>, Vec<otlp::Sample>)> = BTreeMap::new();
        for s in &p.sample {
            let l = SampleLabels::of(p, s);
            let per_process = self.per == ResourcePer::Process || l.container_id.is_empty();
            let key = if per_process {
                format!("pid:{}", l.pid)
            } else {
                format!("container:{}", l.container_id)
            };
            let entry = groups
                .entry(key)
                .or_insert_with(|| (self.resource(&l, per_process), Vec::new()));
            let mut attribute_indices = vec![
                d.attribute("thread.id", int(l.tid)),
                d.attribute("thread.name", string(l.comm)),
            ];
            if !per_process {
                // Several processes share a container resource: name them per sample.
                attribute_indices.push(d.attribute("process.pid", int(l.pid)));
                attribute_indices.push(d.attribute("process.executable.name", string(l.process)));
            }
            let value = value_index
                .and_then(|i| s.value.get(i))
                .copied()
                .unwrap_or_else(|| s.value.first().copied().unwrap_or(0) * p.period);
            let stack_index = d.stack(&s.location_id);
            entry.1.push(otlp::Sample {
                stack_index,
                attribute_indices,
                link_index: 0,
                values: vec![value],
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
                        period: p.period,
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

    fn resource(&self, l: &SampleLabels<'_>, per_process: bool) -> Vec<KeyValue> {
        let service = [l.service_name, l.process, "unknown"]
            .into_iter()
            .find(|s| !s.is_empty())
            .unwrap_or("unknown");
        let mut a = vec![kv("service.name", string(service))];
        if !self.host.is_empty() {
            a.push(kv("host.name", string(&self.host)));
        }
        for (k, v) in [
            ("container.id", l.container_id),
            ("k8s.namespace.name", l.namespace),
            ("k8s.pod.name", l.pod),
            ("k8s.pod.uid", l.pod_uid),
            ("k8s.container.name", l.container),
        ] {
            if !v.is_empty() {
                a.push(kv(k, string(v)));
            }
        }
        if !l.namespace.is_empty() && !self.host.is_empty() {
            a.push(kv("k8s.node.name", string(&self.host)));
        }
        if per_process {
            a.push(kv("process.pid", int(l.pid)));
            if !l.process.is_empty() {
                a.push(kv("process.executable.name", string(l.process)));
            }
        }
        a
    }
}

impl Encode for Encoder {
    type Item = ExportProfilesServiceRequest;
    fn encode(&mut self, w: &Encoded) -> Result<Vec<(Self::Item, u64)>> {
        let r = self.request(w);
        if r.resource_profiles.is_empty() {
            return Ok(Vec::new());
        }
        let n = r.encoded_len() as u64;
        Ok(vec![(r, n)])
    }
}

fn text(p: &Profile, i: i64) -> &str {
    usize::try_from(i)
        .ok()
        .and_then(|i| p.string_table.get(i))
        .map_or("", String::as_str)
}

/// The pprof sample labels the OTLP attributes come from.
#[derive(Default)]
struct SampleLabels<'a> {
    pid: i64,
    tid: i64,
    comm: &'a str,
    process: &'a str,
    container_id: &'a str,
    pod_uid: &'a str,
    namespace: &'a str,
    pod: &'a str,
    container: &'a str,
    service_name: &'a str,
}

impl<'a> SampleLabels<'a> {
    fn of(p: &'a Profile, s: &Sample) -> Self {
        let mut l = Self::default();
        for label in &s.label {
            let v = text(p, label.str);
            match text(p, label.key) {
                "pid" => l.pid = label.num,
                "tid" => l.tid = label.num,
                "comm" => l.comm = v,
                "process" => l.process = v,
                "container_id" => l.container_id = v,
                "pod_uid" => l.pod_uid = v,
                "namespace" => l.namespace = v,
                "pod" => l.pod = v,
                "container" => l.container = v,
                "service_name" => l.service_name = v,
                _ => {}
            }
        }
        l
    }
}

fn string(s: &str) -> any_value::Value {
    any_value::Value::StringValue(s.to_owned())
}

fn int(i: i64) -> any_value::Value {
    any_value::Value::IntValue(i)
}

fn kv(key: &str, v: any_value::Value) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue { value: Some(v) }),
        ..Default::default()
    }
}

/// The `ProfilesDictionary` under construction, with pprof ids mapped to table indices.
struct Dict<'a> {
    p: &'a Profile,
    d: otlp::ProfilesDictionary,
    strings: HashMap<String, i32>,
    functions: HashMap<u64, i32>,
    mappings: HashMap<u64, i32>,
    locations: HashMap<u64, i32>,
    stacks: HashMap<Vec<u64>, i32>,
    attributes: HashMap<(String, String), i32>,
}

fn index(len: usize) -> i32 {
    i32::try_from(len).unwrap_or(i32::MAX)
}

impl<'a> Dict<'a> {
    fn new(p: &'a Profile) -> Self {
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
            p,
            d,
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

    fn pprof_string(&mut self, i: i64) -> i32 {
        let s = text(self.p, i).to_owned();
        self.string(&s)
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

    fn mapping(&mut self, id: u64) -> i32 {
        if id == 0 {
            return 0;
        }
        if let Some(&i) = self.mappings.get(&id) {
            return i;
        }
        let Some(m) = self.p.mapping.iter().find(|m| m.id == id) else {
            return 0;
        };
        let filename_strindex = self.pprof_string(m.filename);
        let i = index(self.d.mapping_table.len());
        self.d.mapping_table.push(otlp::Mapping {
            memory_start: m.memory_start,
            memory_limit: m.memory_limit,
            file_offset: m.file_offset,
            filename_strindex,
            attribute_indices: Vec::new(),
        });
        self.mappings.insert(id, i);
        i
    }

    fn function(&mut self, id: u64) -> i32 {
        if let Some(&i) = self.functions.get(&id) {
            return i;
        }
        let Some(f) = self.p.function.iter().find(|f| f.id == id) else {
            return 0;
        };
        let name_strindex = self.pprof_string(f.name);
        let system_name_strindex = self.pprof_string(f.system_name);
        let filename_strindex = self.pprof_string(f.filename);
        let i = index(self.d.function_table.len());
        self.d.function_table.push(otlp::Function {
            name_strindex,
            system_name_strindex,
            filename_strindex,
            start_line: f.start_line,
        });
        self.functions.insert(id, i);
        i
    }

    fn location(&mut self, id: u64) -> i32 {
        if let Some(&i) = self.locations.get(&id) {
            return i;
        }
        let Some(l) = self.p.location.iter().find(|l| l.id == id) else {
            return 0;
        };
        let mapping_index = self.mapping(l.mapping_id);
        let lines = l
            .line
            .iter()
            .map(|ln| otlp::Line {
                function_index: self.function(ln.function_id),
                line: ln.line,
                column: ln.column,
            })
            .collect();
        let i = index(self.d.location_table.len());
        self.d.location_table.push(otlp::Location {
            mapping_index,
            address: l.address,
            lines,
            attribute_indices: Vec::new(),
        });
        self.locations.insert(id, i);
        i
    }

    /// The stack of pprof location ids (leaf first, as in pprof and OTLP).
    fn stack(&mut self, ids: &[u64]) -> i32 {
        if let Some(&i) = self.stacks.get(ids) {
            return i;
        }
        let location_indices = ids.iter().map(|&id| self.location(id)).collect();
        let i = index(self.d.stack_table.len());
        self.d.stack_table.push(otlp::Stack { location_indices });
        self.stacks.insert(ids.to_vec(), i);
        i
    }

    fn finish(self) -> otlp::ProfilesDictionary {
        self.d
    }
}

/// Sends export requests to one OTLP endpoint.
pub struct Grpc {
    client: ProfilesServiceClient<Channel>,
    metadata: MetadataMap,
}

impl Grpc {
    /// A lazily connecting client for the `sinks.otlp` settings; must be called
    /// inside a Tokio runtime. Reads the CA and token files now.
    pub fn new(cfg: &OtlpSink, timeout: std::time::Duration) -> Result<Self> {
        let mut endpoint = Endpoint::from_shared(cfg.endpoint.clone())
            .with_context(|| format!("sinks.otlp.endpoint {:?}", cfg.endpoint))?
            .connect_timeout(timeout)
            .timeout(timeout)
            .tcp_nodelay(true)
            .user_agent(concat!("ember/", env!("CARGO_PKG_VERSION")))
            .context("sinks.otlp: user agent")?;
        if cfg.endpoint.starts_with("https://") {
            let tls = if cfg.ca_file.as_os_str().is_empty() {
                ClientTlsConfig::new().with_native_roots()
            } else {
                let pem = std::fs::read(&cfg.ca_file)
                    .with_context(|| format!("reading CA file {}", cfg.ca_file.display()))?;
                ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem))
            };
            endpoint = endpoint.tls_config(tls).context("sinks.otlp: TLS")?;
        }
        let channel = endpoint.connect_lazy();
        let mut client = ProfilesServiceClient::new(channel).max_encoding_message_size(64 << 20);
        if cfg.gzip {
            client = client.send_compressed(CompressionEncoding::Gzip);
        }
        let mut metadata = MetadataMap::new();
        for (k, v) in &cfg.headers {
            let key = MetadataKey::from_bytes(k.to_ascii_lowercase().as_bytes())
                .with_context(|| format!("sinks.otlp.headers: {k:?} is not a header name"))?;
            let value = MetadataValue::try_from(v.0.as_str())
                .with_context(|| format!("sinks.otlp.headers: the value of {k} is not valid"))?;
            metadata.insert(key, value);
        }
        let token = super::secret("", &cfg.bearer_token_file, "sinks.otlp.bearer_token_file")?;
        if !token.is_empty() {
            let value = MetadataValue::try_from(format!("Bearer {token}"))
                .context("sinks.otlp.bearer_token_file: not a valid header value")?;
            metadata.insert("authorization", value);
        }
        Ok(Self { client, metadata })
    }
}

/// What a gRPC status means for delivery: UNAVAILABLE, RESOURCE_EXHAUSTED and
/// DEADLINE_EXCEEDED are retried; everything else is a permanent rejection.
pub fn classify(status: &tonic::Status) -> Outcome {
    use tonic::Code;
    let reason = ExportDrop::Grpc(status.code());
    match status.code() {
        Code::Unavailable | Code::ResourceExhausted | Code::DeadlineExceeded => Outcome::Retry {
            reason: Transient::Status(reason),
            after: None,
        },
        _ => Outcome::Reject {
            reason,
            detail: status.message().chars().take(512).collect(),
        },
    }
}

impl Transport for Grpc {
    type Item = ExportProfilesServiceRequest;
    fn send(
        &mut self,
        item: &ExportProfilesServiceRequest,
    ) -> impl std::future::Future<Output = Outcome> + Send + '_ {
        let mut req = tonic::Request::new(item.clone());
        *req.metadata_mut() = self.metadata.clone();
        let bytes = item.encoded_len() as u64;
        async move {
            match self.client.export(req).await {
                Ok(resp) => {
                    if let Some(p) = resp.into_inner().partial_success {
                        if p.rejected_profiles > 0 {
                            tracing::debug!(
                                rejected = p.rejected_profiles,
                                message = %p.error_message,
                                "the OTLP backend rejected part of a request"
                            );
                        }
                    }
                    Outcome::Sent { bytes }
                }
                Err(status) => classify(&status),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{Function, Label, Line, Location, ValueType};
    use std::time::Duration;

    #[test]
    fn dictionary_and_resources() {
        let strings = [
            "",
            "samples",
            "count",
            "cpu",
            "nanoseconds",
            "pid",
            "tid",
            "comm",
            "worker",
            "process",
            "web",
            "container_id",
            "abc",
            "namespace",
            "shop",
            "main",
            "work",
        ];
        let s = |k: i64, v: i64| Label {
            key: k,
            str: v,
            ..Default::default()
        };
        let n = |k: i64, v: i64| Label {
            key: k,
            num: v,
            ..Default::default()
        };
        let p = Profile {
            string_table: strings.iter().map(|s| s.to_string()).collect(),
            sample_type: vec![
                ValueType { r#type: 1, unit: 2 },
                ValueType { r#type: 3, unit: 4 },
            ],
            period: 10_000_000,
            function: vec![
                Function {
                    id: 1,
                    name: 15,
                    ..Default::default()
                },
                Function {
                    id: 2,
                    name: 16,
                    ..Default::default()
                },
            ],
            location: vec![
                Location {
                    id: 1,
                    line: vec![Line {
                        function_id: 1,
                        ..Default::default()
                    }],
                    ..Default::default()
                },
                Location {
                    id: 2,
                    line: vec![Line {
                        function_id: 2,
                        ..Default::default()
                    }],
                    ..Default::default()
                },
            ],
            sample: vec![
                Sample {
                    location_id: vec![2, 1],
                    value: vec![2, 20_000_000],
                    label: vec![n(5, 10), n(6, 11), s(7, 8), s(9, 10), s(11, 12), s(13, 14)],
                },
                Sample {
                    location_id: vec![1],
                    value: vec![1, 10_000_000],
                    label: vec![n(5, 20), n(6, 20), s(7, 10), s(9, 10)],
                },
            ],
            ..Default::default()
        };
        let w = Encoded {
            start: UNIX_EPOCH + Duration::from_secs(100),
            duration: Duration::from_secs(10),
            samples: 3,
            profile: p,
            gz: Vec::new(),
            frames: Default::default(),
        };
        let r = Encoder::new(&OtlpSink::default(), "node-1").request(&w);
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

    #[test]
    fn grpc_codes() {
        assert!(matches!(
            classify(&tonic::Status::unavailable("x")),
            Outcome::Retry { .. }
        ));
        assert!(matches!(
            classify(&tonic::Status::resource_exhausted("x")),
            Outcome::Retry { .. }
        ));
        assert!(matches!(
            classify(&tonic::Status::invalid_argument("x")),
            Outcome::Reject { reason, .. } if reason.to_string() == "grpc_invalid_argument"
        ));
    }
}
