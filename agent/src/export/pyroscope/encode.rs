//! Pyroscope: a window split into one pprof profile per service, with the series labels
//! each is pushed under.
//!
//! In: a [`Symbolized`] window. Out: one [`Service`] per `service_name` (else process
//! name, else `unknown`), in name order: its profile, holding only its stacks, and the
//! namespace/pod/container/container_id every one of them shares. Pyroscope turns pprof
//! *sample* labels into series, so only the configured ones (`sample_labels`) stay in
//! the profile; stacks that become identical are merged. Mappings and locations are the
//! window's: a mapping spans the whole window's addresses in it, as in the window's own
//! profile. The requests themselves (push or ingest) are made
//! in [`super`].

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::encode::pprof::{sample_labels, values, Builder, LabelValue, WindowLocations};
use crate::model::{Labels, ProfileKind, SymStack, Symbolized};
use crate::proto::Profile;
use crate::push_proto::LabelPair;

/// Reads one workload label.
type Get = fn(&Labels) -> &str;

/// Series labels copied from the stacks when every stack of a service has the same
/// (non-empty) value, in this order.
const UNIFORM_LABELS: [(&str, Get); 4] = [
    ("namespace", |l| &l.namespace),
    ("pod", |l| &l.pod),
    ("container", |l| &l.container),
    ("container_id", |l| &l.container_id),
];

/// The stacks of one service, as their own profile.
#[derive(Debug, Clone)]
pub struct Service {
    /// `service_name` (else the process name, else `unknown`).
    pub name: String,
    /// Labels every stack of the service shares, in [`UNIFORM_LABELS`] order.
    pub uniform: Vec<(&'static str, String)>,
    /// The service's profile.
    pub profile: Profile,
    /// What the profile measures.
    pub kind: ProfileKind,
}

/// Pyroscope's profile name (`__name__`) for a window's kind: `process_cpu` as Grafana
/// Alloy's eBPF profiler sends CPU profiles, `off_cpu` as Pyroscope names off-CPU profiles
/// it ingests from the OpenTelemetry eBPF profiler (grafana/pyroscope#3875), `mutex` for
/// lock waits as Pyroscope names the Go runtime's mutex profiles (`contentions`/`delay`),
/// and `off_wake` for blocked time under its wakers (no convention names it).
pub fn profile_name(kind: ProfileKind) -> &'static str {
    match kind {
        ProfileKind::Cpu => "process_cpu",
        ProfileKind::OffCpu => "off_cpu",
        ProfileKind::OffWake => "off_wake",
        ProfileKind::Lock => "mutex",
    }
}

impl Service {
    /// The series labels: `__name__`, `service_name`, the uniform labels, then `static_labels`
    /// (a name already set is not repeated).
    pub fn series_labels(&self, static_labels: &BTreeMap<String, String>) -> Vec<LabelPair> {
        let mut labels = vec![
            pair("__name__", profile_name(self.kind)),
            pair("service_name", &self.name),
        ];
        let mut seen: HashSet<&str> = ["__name__", "service_name"].into_iter().collect();
        for (k, v) in &self.uniform {
            if seen.insert(k) {
                labels.push(pair(k, v));
            }
        }
        for (k, v) in static_labels {
            if seen.insert(k) {
                labels.push(pair(k, v));
            }
        }
        labels
    }
}

fn pair(name: &str, value: &str) -> LabelPair {
    LabelPair {
        name: name.to_owned(),
        value: value.to_owned(),
    }
}

/// The service a stack belongs to: `service_name`, else the process name, else `unknown`.
fn service_name(s: &SymStack) -> &str {
    [s.labels.service_name.as_str(), &s.process]
        .into_iter()
        .find(|n| !n.is_empty())
        .unwrap_or("unknown")
}

/// Service name of the stacks folded past a window's series cap ([`split`]).
pub const OVERFLOW_SERVICE: &str = "ember_overflow";

/// A Pyroscope series: service name and kept sample label values.
type SeriesKey = (String, Vec<(&'static str, String)>);

/// A window split by service, and how many of its stacks went to [`OVERFLOW_SERVICE`].
#[derive(Debug, Clone, Default)]
pub struct Split {
    /// One profile per service, in name order.
    pub services: Vec<Service>,
    /// Stacks folded into [`OVERFLOW_SERVICE`] because the window had more series than
    /// the cap.
    pub folded: usize,
}

/// Splits `w` by service, keeping only the sample labels named in `keep`, into at most
/// `max_series` series.
///
/// Pyroscope makes a series of every service name and every kept sample label value, and
/// both come from workloads: a process that renames itself every 100 ms would make
/// hundreds. Past `max_series` distinct (service, kept labels) pairs in one window, the
/// heaviest `max_series - 1` stay as they are and every other stack goes, without its
/// sample labels, to one series named [`OVERFLOW_SERVICE`]: its samples are kept, only
/// their names are lumped.
pub fn split(w: &Symbolized, keep: &HashSet<String>, max_series: usize) -> Split {
    let series_of = |s: &SymStack| -> SeriesKey {
        let labels = sample_labels(s)
            .filter(|(k, _)| keep.contains(*k))
            .map(|(k, v)| match v {
                LabelValue::Num(n) => (k, n.to_string()),
                LabelValue::Str(v) => (k, v.to_owned()),
            })
            .collect();
        (service_name(s).to_owned(), labels)
    };
    let mut weight: HashMap<SeriesKey, u64> = HashMap::new();
    for s in &w.stacks {
        *weight.entry(series_of(s)).or_default() += s.count;
    }
    let kept: Option<HashSet<SeriesKey>> = (weight.len() > max_series).then(|| {
        let mut by_weight: Vec<_> = weight.into_iter().collect();
        // Heaviest first; ties by name, so the same window always splits the same way.
        by_weight.sort_by(|(ka, a), (kb, b)| b.cmp(a).then_with(|| ka.cmp(kb)));
        by_weight
            .into_iter()
            .take(max_series.saturating_sub(1))
            .map(|(k, _)| k)
            .collect()
    });
    let mut groups: BTreeMap<&str, Vec<&SymStack>> = BTreeMap::new();
    let mut overflow: Vec<&SymStack> = Vec::new();
    for s in &w.stacks {
        match &kept {
            Some(kept) if !kept.contains(&series_of(s)) => overflow.push(s),
            _ => groups.entry(service_name(s)).or_default().push(s),
        }
    }
    let window = WindowLocations::of(w);
    let service = |name: &str, stacks: &[&SymStack], keep: &HashSet<String>| {
        let uniform = UNIFORM_LABELS
            .iter()
            .filter_map(|&(k, get)| {
                let first = get(&stacks.first()?.labels);
                (!first.is_empty() && stacks.iter().all(|s| get(&s.labels) == first))
                    .then(|| (k, first.to_owned()))
            })
            .collect();
        Service {
            name: name.to_owned(),
            uniform,
            profile: profile(w, stacks, keep, &window),
            kind: w.kind,
        }
    };
    let mut services: Vec<Service> = groups
        .iter()
        .map(|(name, stacks)| service(name, stacks, keep))
        .collect();
    let folded = overflow.len();
    if !overflow.is_empty() {
        services.push(service(OVERFLOW_SERVICE, &overflow, &HashSet::new()));
        services.sort_by(|a, b| a.name.cmp(&b.name));
    }
    Split { services, folded }
}

/// The profile of `stacks` (part of `w`), with only the sample labels named in `keep`;
/// stacks that become identical are merged into one sample. Mappings and locations are
/// the window's (`window`), as they are in the window's own profile.
fn profile<'w>(
    w: &Symbolized,
    stacks: &[&'w SymStack],
    keep: &HashSet<String>,
    window: &'w WindowLocations<'w>,
) -> Profile {
    let mut b = Builder::part_of(w, Some(window));
    // (locations, labels as (key, str, num, num_unit)) → index of the merged sample.
    type SampleKey = (Vec<u64>, Vec<(i64, i64, i64, i64)>);
    let mut merged: HashMap<SampleKey, usize> = HashMap::new();
    for &s in stacks {
        let location_id = b.stack(s);
        let label: Vec<_> = sample_labels(s)
            .filter(|(k, _)| keep.contains(*k))
            .map(|(k, v)| b.label(k, &v))
            .collect();
        let key = (
            location_id.clone(),
            label
                .iter()
                .map(|l| (l.key, l.str, l.num, l.num_unit))
                .collect(),
        );
        let value = values(s, w.period_ns);
        let samples = b.samples();
        match merged.get(&key) {
            Some(&j) => {
                for (a, b) in samples[j].value.iter_mut().zip(&value) {
                    *a += b;
                }
            }
            None => {
                merged.insert(key, samples.len());
                samples.push(crate::proto::Sample {
                    location_id,
                    value,
                    label,
                });
            }
        }
    }
    b.finish()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::model::{Func, Mapping, SymFrame};
    use std::sync::Arc;
    use std::time::{Duration, UNIX_EPOCH};

    /// Nanoseconds per sample of [`window`] (99 Hz).
    pub(crate) const PERIOD: u64 = 10_101_010;

    fn frame(name: &str, address: u64) -> Arc<SymFrame> {
        Arc::new(SymFrame {
            mapping: Mapping::Region(Arc::from("[anon]")),
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

    /// Two threads of shop/web with the same stack, and a host process `db`.
    pub(crate) fn window() -> Symbolized {
        let (main, work) = (frame("main", 0x10), frame("work", 0x20));
        let web = Arc::new(Labels {
            service_name: "shop/web".into(),
            namespace: "shop".into(),
            ..Labels::default()
        });
        let stack = |pid, tid, process: &str, labels: &Arc<Labels>, frames, count| SymStack {
            pid,
            tid,
            comm: process.into(),
            process: Arc::from(process),
            labels: labels.clone(),
            frames,
            count,
            off_cpu: None,
            runtime: None,
        };
        Symbolized {
            start: UNIX_EPOCH + Duration::from_secs(1_800_000_000),
            duration: Duration::from_secs(10),
            period_ns: PERIOD,
            kind: Default::default(),
            stacks: vec![
                // Two threads of shop/web with the same stack: merged once tid goes.
                stack(1, 100, "web", &web, vec![work.clone(), main.clone()], 1),
                stack(1, 101, "web", &web, vec![work, main.clone()], 2),
                // A host process: no service_name, named by its process.
                stack(7, 7, "db", &Arc::default(), vec![main], 3),
            ],
        }
    }

    #[test]
    fn splits_by_service_and_drops_unwanted_labels() {
        let keep: HashSet<String> = ["process".to_owned()].into_iter().collect();
        let services = split(&window(), &keep, usize::MAX).services;
        let names: Vec<&str> = services.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["db", "shop/web"]);
        let web = &services[1];
        assert_eq!(web.uniform, vec![("namespace", "shop".to_owned())]);
        assert_eq!(web.profile.sample.len(), 1, "tids dropped, samples merged");
        assert_eq!(web.profile.sample[0].value, vec![3, 3 * PERIOD as i64]);
        let keys: Vec<&str> = web.profile.sample[0]
            .label
            .iter()
            .map(|l| web.profile.string_table[l.key as usize].as_str())
            .collect();
        assert_eq!(keys, ["process"]);
        let db = &services[0];
        assert_eq!(db.profile.location.len(), 1, "only used locations");
        assert_eq!(db.profile.function.len(), 1);
        assert_eq!(
            db.profile.string_table[db.profile.function[0].name as usize],
            "main"
        );
        assert!(db.uniform.is_empty());
    }

    /// A location: its mapping's file and range, address and lines (function, line).
    type Loc = (String, u64, u64, u64, Vec<(String, i64)>);

    /// The locations of a profile.
    fn locations(p: &Profile) -> Vec<Loc> {
        let text = |i: i64| p.string_table[i as usize].clone();
        p.location
            .iter()
            .map(|l| {
                let m = &p.mapping[l.mapping_id as usize - 1];
                let lines = l
                    .line
                    .iter()
                    .map(|ln| (text(p.function[ln.function_id as usize - 1].name), ln.line))
                    .collect();
                (
                    text(m.filename),
                    m.memory_start,
                    m.memory_limit,
                    l.address,
                    lines,
                )
            })
            .collect()
    }

    #[test]
    fn services_keep_the_windows_mappings_and_locations() {
        let jit = |line| {
            Arc::new(SymFrame {
                mapping: Mapping::Jit(crate::model::JitSource::JitDump),
                address: 0x7f00,
                funcs: vec![Func {
                    name: Arc::from("hot"),
                    file: Some(Arc::from("a.js")),
                    line,
                }]
                .into(),
                named: true,
            })
        };
        let mut w = window();
        // The same JIT address and name in two services, with different lines: the
        // window's profile has one location, with the first one's line.
        w.stacks[0].frames.insert(0, jit(3));
        w.stacks[2].frames.insert(0, jit(9));
        w.stacks[2].frames.push(frame("start", 0x90));
        let whole = locations(&crate::encode::pprof::encode(&w));
        for s in split(&w, &HashSet::new(), usize::MAX).services {
            for l in locations(&s.profile) {
                assert!(whole.contains(&l), "{}: {l:?} not in {whole:?}", s.name);
            }
        }
    }

    /// A process renaming itself every 100 ms for a 10 s window (100 names, each its own
    /// series through the `process` label and the service name) is pushed as `max_series`
    /// series, with every sample kept.
    #[test]
    fn a_renaming_process_is_held_to_the_series_cap() {
        let mut w = window();
        let template = w.stacks[2].clone();
        for i in 0..100 {
            let name = format!("renamed-{i}");
            let mut s = template.clone();
            s.process = Arc::from(name.as_str());
            s.comm = name.as_str().into();
            s.count = 1;
            w.stacks.push(s);
        }
        let keep: HashSet<String> = ["process".to_owned()].into_iter().collect();
        let total: u64 = w.stacks.iter().map(|s| s.count).sum();
        let unbounded = split(&w, &keep, usize::MAX);
        assert_eq!(unbounded.folded, 0);
        assert_eq!(unbounded.services.len(), 102);

        let capped = split(&w, &keep, 10);
        assert_eq!(
            capped.services.len(),
            10,
            "9 heaviest series and the overflow one"
        );
        assert!(capped.folded > 90, "{} stacks folded", capped.folded);
        let overflow = capped
            .services
            .iter()
            .find(|s| s.name == OVERFLOW_SERVICE)
            .expect("an overflow series");
        // No sample label is kept on the overflow series: it is one series, not a hundred.
        assert!(overflow.profile.sample.iter().all(|s| s.label.is_empty()));
        // The heaviest series are the ones kept by name.
        assert!(capped.services.iter().any(|s| s.name == "shop/web"));
        assert!(capped.services.iter().any(|s| s.name == "db"));
        let pushed: i64 = capped
            .services
            .iter()
            .flat_map(|s| &s.profile.sample)
            .map(|s| s.value[0])
            .sum();
        assert_eq!(pushed as u64, total, "every sample is still pushed");
        // The same window splits the same way every time.
        let again = split(&w, &keep, 10);
        let names = |s: &Split| {
            s.services
                .iter()
                .map(|x| x.name.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(names(&capped), names(&again));
    }
}
