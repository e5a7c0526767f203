//! Per-container readings from the cgroup filesystems, named as cAdvisor names them.
//!
//! In: each interval's container [`Inventory`] of the v1 `cpu`, `cpuacct`, `memory`
//! hierarchies and the v2 (unified) one, walked under the [`walk::RESOURCES`] rules (see
//! [`crate::workload::walk`]); a container's cgroup is its shallowest directory (its files
//! count its sub-cgroups too). Out: cAdvisor's families. A container found in several
//! hierarchies (hybrid hosts) is one container: CPU and memory come from the v1 controllers
//! when they are there, PSI from v2. Containers are labelled `namespace`, `pod`, `container`
//! from the pod watch when it knows them, and always `container_id`
//! ([`crate::workload::labels::container_labels`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use prometheus_client::registry::Unit;

use super::{cgroupfs, pressure, read_optional, Roots};
use crate::metrics::{Cache, ReadingsSource};
use crate::readings::{Family, Interval, Kind, ReadError, Source};
use crate::workload::kube::Metadata;
use crate::workload::labels::container_labels;
use crate::workload::walk::{self, Inventory, Request};

/// Where one container's cgroup is in each hierarchy.
#[derive(Debug, Default, Clone)]
struct Found {
    pod_uid: Option<String>,
    cpu: Option<PathBuf>,
    cpuacct: Option<PathBuf>,
    memory: Option<PathBuf>,
    v2: Option<PathBuf>,
}

/// The container source.
pub struct Containers {
    roots: Roots,
    meta: Option<Metadata>,
    max: usize,
    metrics: crate::metrics::Metrics,
}

impl Containers {
    /// Reads containers under `roots.cgroup`, at most `max` of them.
    pub fn new(
        roots: Roots,
        meta: Option<Metadata>,
        max: usize,
        metrics: crate::metrics::Metrics,
    ) -> Self {
        Self {
            roots,
            meta,
            max,
            metrics,
        }
    }

    /// The hierarchies: (role, root). v1 controllers may be co-mounted (`cpu,cpuacct`).
    fn hierarchies(&self) -> Vec<(&'static str, PathBuf)> {
        let c = &self.roots.cgroup;
        let mut out = Vec::new();
        for (role, dirs) in [
            ("cpu", ["cpu", "cpu,cpuacct"]),
            ("cpuacct", ["cpuacct", "cpu,cpuacct"]),
            ("memory", ["memory", "memory"]),
        ] {
            if let Some(d) = dirs.iter().map(|d| c.join(d)).find(|d| d.is_dir()) {
                out.push((role, d));
            }
        }
        for d in [c.join("unified"), c.clone()] {
            if d.join("cgroup.controllers").exists() {
                out.push(("v2", d));
                break;
            }
        }
        out
    }

    /// The containers of every hierarchy in `inv`, and how many directories were skipped.
    fn discover(&self, inv: &Inventory) -> (BTreeMap<String, Found>, u64) {
        let mut found: BTreeMap<String, Found> = BTreeMap::new();
        let mut skipped = 0;
        for (role, root) in self.hierarchies() {
            let Some(scan) = inv.scan(&root, walk::RESOURCES) else {
                continue;
            };
            skipped += scan.dropped_dirs;
            for c in scan.containers {
                let f = found.entry(c.container_id).or_default();
                let slot = match role {
                    "cpu" => &mut f.cpu,
                    "cpuacct" => &mut f.cpuacct,
                    "memory" => &mut f.memory,
                    _ => &mut f.v2,
                };
                // The walk goes shallowest first: the first directory is the container's.
                if slot.is_none() {
                    *slot = Some(c.dir);
                }
                if f.pod_uid.is_none() && !c.pod_uid.is_empty() {
                    f.pod_uid = Some(c.pod_uid);
                }
            }
        }
        (found, skipped)
    }

    fn labels(&self, id: &str, f: &Found) -> Vec<(&'static str, String)> {
        container_labels(id, f.pod_uid.as_deref(), self.meta.as_ref())
    }
}

fn read_keyed(
    dir: &Option<PathBuf>,
    file: &'static str,
    errors: &mut Vec<ReadError>,
) -> Option<Vec<(String, u64)>> {
    let text = read_in(dir, file, errors)?;
    match cgroupfs::keyed(file, &text) {
        Ok(v) => Some(v),
        Err(e) => {
            errors.push(e.into());
            None
        }
    }
}

fn read_single(
    dir: &Option<PathBuf>,
    file: &'static str,
    errors: &mut Vec<ReadError>,
) -> Option<u64> {
    let text = read_in(dir, file, errors)?;
    match cgroupfs::single(file, &text) {
        Ok(v) => Some(v),
        Err(e) => {
            errors.push(e.into());
            None
        }
    }
}

fn read_in(dir: &Option<PathBuf>, file: &str, errors: &mut Vec<ReadError>) -> Option<String> {
    let path: &Path = dir.as_deref()?;
    match read_optional(&path.join(file)) {
        Ok(t) => t,
        // A container that exits between the walk and the read is not an error.
        Err(_) if !path.exists() => None,
        Err(e) => {
            errors.push(e);
            None
        }
    }
}

fn get(v: &[(String, u64)], k: &str) -> Option<u64> {
    v.iter().find(|(n, _)| n == k).map(|(_, x)| *x)
}

/// One family per name, filled container by container.
struct Families(Vec<Family>);

impl Families {
    fn push(
        &mut self,
        name: &'static str,
        help: &'static str,
        unit: Option<Unit>,
        kind: Kind,
        labels: &[(&'static str, String)],
        v: f64,
    ) {
        let f = match self.0.iter_mut().position(|f| f.name == name) {
            Some(i) => &mut self.0[i],
            None => {
                self.0.push(Family::new(name, help, unit, kind));
                let n = self.0.len() - 1;
                &mut self.0[n]
            }
        };
        f.push(labels.to_vec(), v);
    }
}

impl Source for Containers {
    fn name(&self) -> ReadingsSource {
        ReadingsSource::Containers
    }

    fn cgroups(&self) -> Vec<Request> {
        self.hierarchies()
            .into_iter()
            .map(|(_, root)| Request {
                root,
                rules: walk::RESOURCES,
            })
            .collect()
    }

    fn read(&mut self, out: &mut Vec<Family>, interval: &Interval) -> Result<(), ReadError> {
        let (found, skipped) = self.discover(&interval.cgroups);
        if skipped > 0 {
            self.metrics.dropped(Cache::ReadingsCgroupDirs, skipped);
        }
        if found.len() > self.max {
            self.metrics
                .dropped(Cache::ReadingsContainers, (found.len() - self.max) as u64);
        }
        let mut errors = Vec::new();
        let mut fams = Families(Vec::new());
        let mut tracked = 0.0;
        for (id, f) in found.iter().take(self.max) {
            tracked += 1.0;
            let l = self.labels(id, f);
            read_cpu(f, &l, &mut fams, &mut errors);
            read_memory(f, &l, &mut fams, &mut errors);
            read_pressure(id, f, &l, &mut fams, &mut errors);
        }
        out.extend(fams.0);
        let mut n = Family::new(
            "readings_containers",
            "Containers whose cgroups are read (at most readings.max_containers)",
            None,
            Kind::Gauge,
        );
        n.push(vec![], tracked);
        out.push(n);
        ReadError::collect(errors)
    }
}

/// The labels of one container's points.
type Labels = [(&'static str, String)];

/// CPU usage (v1 cpuacct, else v2 `cpu.stat`) and CFS throttling of one container.
fn read_cpu(f: &Found, l: &Labels, fams: &mut Families, errors: &mut Vec<ReadError>) {
    let v2_cpu = read_keyed(&f.v2, "cpu.stat", errors);
    // v1 cpuacct when the container has it (hybrid hosts leave v2's usage at 0).
    let usage = match &f.cpuacct {
        Some(_) => read_single(&f.cpuacct, "cpuacct.usage", errors).map(|ns| ns as f64 / 1e9),
        None => v2_cpu
            .as_deref()
            .and_then(|s| get(s, "usage_usec"))
            .map(|us| us as f64 / 1e6),
    };
    if let Some(u) = usage {
        fams.push(
            "container_cpu_usage",
            "Cumulative CPU time of the container (cgroup)",
            Some(Unit::Seconds),
            Kind::Counter,
            l,
            u,
        );
    }
    let v1_cpu = read_keyed(&f.cpu, "cpu.stat", errors);
    let throttle = v1_cpu
        .as_deref()
        .and_then(cgroupfs::throttling)
        .or_else(|| v2_cpu.as_deref().and_then(cgroupfs::throttling));
    if let Some(t) = throttle {
        fams.push(
            "container_cpu_cfs_periods",
            "CFS enforcement periods that had a quota",
            None,
            Kind::Counter,
            l,
            t.periods as f64,
        );
        fams.push(
            "container_cpu_cfs_throttled_periods",
            "CFS periods in which the container was throttled",
            None,
            Kind::Counter,
            l,
            t.throttled_periods as f64,
        );
        fams.push(
            "container_cpu_cfs_throttled",
            "Time the container was throttled",
            Some(Unit::Seconds),
            Kind::Counter,
            l,
            t.throttled_seconds,
        );
    }
}

/// Working set, usage and OOM kills of one container.
fn read_memory(f: &Found, l: &Labels, fams: &mut Families, errors: &mut Vec<ReadError>) {
    // Working set = usage − inactive file pages, as cAdvisor computes it.
    let (usage, stat, inactive) = if f.memory.is_some() {
        (
            read_single(&f.memory, "memory.usage_in_bytes", errors),
            read_keyed(&f.memory, "memory.stat", errors),
            "total_inactive_file",
        )
    } else {
        (
            read_single(&f.v2, "memory.current", errors),
            read_keyed(&f.v2, "memory.stat", errors),
            "inactive_file",
        )
    };
    if let Some(u) = usage {
        let inactive = stat.as_deref().and_then(|s| get(s, inactive)).unwrap_or(0);
        fams.push(
            "container_memory_working_set",
            "Memory in use that cannot be reclaimed at once (usage − inactive file)",
            Some(Unit::Bytes),
            Kind::Gauge,
            l,
            u.saturating_sub(inactive) as f64,
        );
        fams.push(
            "container_memory_usage",
            "Memory usage of the container, page cache included",
            Some(Unit::Bytes),
            Kind::Gauge,
            l,
            u as f64,
        );
    }
    let ooms = if f.memory.is_some() {
        read_keyed(&f.memory, "memory.oom_control", errors).and_then(|o| get(&o, "oom_kill"))
    } else {
        read_keyed(&f.v2, "memory.events", errors).and_then(|e| get(&e, "oom_kill"))
    };
    if let Some(n) = ooms {
        fams.push(
            "container_oom_events",
            "Processes of the container killed by the OOM killer",
            None,
            Kind::Counter,
            l,
            n as f64,
        );
    }
}

/// PSI of one container's CPU, memory and I/O (cgroup v2).
fn read_pressure(
    id: &str,
    f: &Found,
    l: &Labels,
    fams: &mut Families,
    errors: &mut Vec<ReadError>,
) {
    for (file, waiting, stalled) in [
        (
            "cpu.pressure",
            "container_pressure_cpu_waiting",
            "container_pressure_cpu_stalled",
        ),
        (
            "memory.pressure",
            "container_pressure_memory_waiting",
            "container_pressure_memory_stalled",
        ),
        (
            "io.pressure",
            "container_pressure_io_waiting",
            "container_pressure_io_stalled",
        ),
    ] {
        let Some(text) = read_in(&f.v2, file, errors) else {
            continue;
        };
        match pressure::parse(&text) {
            Ok(p) => {
                fams.push(
                    waiting,
                    "Time some task of the container stalled on this resource (PSI some)",
                    Some(Unit::Seconds),
                    Kind::Counter,
                    l,
                    p.some_us as f64 / 1e6,
                );
                if let Some(full) = p.full_us {
                    fams.push(
                        stalled,
                        "Time all tasks of the container stalled on this resource (PSI full)",
                        Some(Unit::Seconds),
                        Kind::Counter,
                        l,
                        full as f64 / 1e6,
                    );
                }
            }
            Err(source) => errors.push(ReadError::Container {
                container: id.to_owned(),
                source,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::readings::resources::host::tests::value;
    use std::fs;

    const A: &str = "aaaa0000aaaa0000aaaa0000aaaa0000aaaa0000aaaa0000aaaa0000aaaa0001";
    const B: &str = "bbbb0000bbbb0000bbbb0000bbbb0000bbbb0000bbbb0000bbbb0000bbbb0002";

    fn write(dir: &Path, file: &str, text: &str) {
        fs::create_dir_all(dir).expect("mkdir");
        fs::write(dir.join(file), text).expect("write");
    }

    /// A hybrid host: container A in v1 cpu/cpuacct/memory (cgroupfs driver) and in the
    /// v2 hierarchy (PSI only); container B only in v2 (systemd driver, cpu controller).
    fn tree(root: &Path) {
        let v1 = format!("kubepods/burstable/pod11111111-2222-3333-4444-555555555555/{A}");
        write(
            &root.join("cpu").join(&v1),
            "cpu.stat",
            include_str!("testdata/cgroup-v1-cpu.stat"),
        );
        write(
            &root.join("cpuacct").join(&v1),
            "cpuacct.usage",
            "2500000000\n",
        );
        // A sub-cgroup of the container is not another container.
        write(
            &root.join("cpuacct").join(&v1).join("sub"),
            "cpuacct.usage",
            "1\n",
        );
        let mem = root.join("memory").join(&v1);
        write(&mem, "memory.usage_in_bytes", "1000000\n");
        write(
            &mem,
            "memory.stat",
            "cache 10\ntotal_inactive_file 400000\n",
        );
        write(
            &mem,
            "memory.oom_control",
            "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n",
        );
        let unified = root.join("unified");
        write(&unified, "cgroup.controllers", "");
        let a2 = unified.join(&v1);
        write(
            &a2,
            "cpu.pressure",
            include_str!("testdata/pressure-cpu-6.1"),
        );
        write(
            &a2,
            "cpu.stat",
            "usage_usec 0\nuser_usec 0\nsystem_usec 0\n",
        );
        let b2 = unified.join(format!(
            "kubepods.slice/kubepods-pod66666666_7777_8888_9999_aaaaaaaaaaaa.slice/cri-containerd-{B}.scope"
        ));
        write(&b2, "cpu.stat", include_str!("testdata/cgroup-v2-cpu.stat"));
        write(&b2, "memory.current", "5000000\n");
        write(
            &b2,
            "memory.stat",
            include_str!("testdata/cgroup-v2-memory.stat"),
        );
        write(
            &b2,
            "memory.events",
            "low 0\nhigh 0\nmax 0\noom 1\noom_kill 1\n",
        );
        write(&b2, "io.pressure", include_str!("testdata/pressure-io-5.4"));
        // Not containers: the pod's own cgroup, a host service.
        write(
            &unified.join("system.slice/ssh.service"),
            "cpu.stat",
            "usage_usec 1\n",
        );
    }

    fn source(root: &Path, max: usize, metrics: &crate::metrics::Metrics) -> Containers {
        let roots = Roots {
            cgroup: root.to_path_buf(),
            ..Roots::default()
        };
        Containers::new(roots, None, max, metrics.clone())
    }

    /// Reads `s` with an interval gathered for it alone.
    fn read_alone(s: &mut Containers, out: &mut Vec<Family>) -> Result<(), ReadError> {
        let interval = Interval {
            cgroups: Inventory::walk(&s.cgroups()),
        };
        s.read(out, &interval)
    }

    fn ids<'a>(names: impl IntoIterator<Item = &'a str>) -> Vec<&'a str> {
        let mut v: Vec<&str> = names.into_iter().collect();
        v.sort();
        v.dedup();
        v
    }

    #[test]
    fn use_readings_and_counters_see_the_same_containers_from_one_walk() {
        let dir = tempfile::tempdir().expect("tempdir");
        tree(dir.path());
        let metrics = crate::metrics::Metrics::new();
        // What the perf counters and run-queue latency ask for on a hybrid host: the v2
        // mount, which holds perf_event there and which the USE readings walk for PSI.
        struct Counters(PathBuf);
        impl Source for Counters {
            fn name(&self) -> ReadingsSource {
                ReadingsSource::Pmc
            }
            fn cgroups(&self) -> Vec<Request> {
                vec![Request {
                    root: self.0.clone(),
                    rules: walk::COUNTERS,
                }]
            }
            fn read(&mut self, _: &mut Vec<Family>, _: &Interval) -> Result<(), ReadError> {
                Ok(())
            }
        }
        let perf_root = dir.path().join("unified");
        let mut sources: Vec<Box<dyn Source>> = vec![
            Box::new(source(dir.path(), 10, &metrics)),
            Box::new(Counters(perf_root.clone())),
        ];
        let interval = Interval::gather(&sources);
        assert_eq!(
            interval.cgroups.walks(),
            4,
            "cpu, cpuacct, memory and the v2 mount, each once"
        );
        let mut out = Vec::new();
        for s in sources.iter_mut() {
            s.read(&mut out, &interval).expect("reads");
        }
        let read = out
            .iter()
            .filter(|f| f.name.starts_with("container_"))
            .flat_map(|f| &f.points)
            .flat_map(|p| &p.labels)
            .filter(|(k, _)| *k == "container_id")
            .map(|(_, v)| v.as_str());
        let counted = interval
            .cgroups
            .scan(&perf_root, walk::COUNTERS)
            .expect("requested");
        assert_eq!(ids(read), [A, B]);
        assert_eq!(
            ids(counted.containers.iter().map(|c| c.container_id.as_str())),
            [A, B]
        );
    }

    #[test]
    fn v1_and_v2_containers_on_a_hybrid_tree() {
        let dir = tempfile::tempdir().expect("tempdir");
        tree(dir.path());
        let metrics = crate::metrics::Metrics::new();
        let mut s = source(dir.path(), 10, &metrics);
        let mut out = Vec::new();
        read_alone(&mut s, &mut out).expect("reads");
        let a = [("container_id", A)];
        let b = [("container_id", B)];
        assert_eq!(value(&out, "readings_containers", &[]), Some(2.0));
        assert_eq!(
            value(&out, "container_cpu_usage", &a),
            Some(2.5),
            "v1 cpuacct wins over v2's 0"
        );
        assert_eq!(
            value(&out, "container_cpu_cfs_throttled_periods", &a),
            Some(250.0)
        );
        assert_eq!(value(&out, "container_cpu_cfs_throttled", &a), Some(12.5));
        assert_eq!(
            value(&out, "container_memory_working_set", &a),
            Some(600_000.0)
        );
        assert_eq!(value(&out, "container_oom_events", &a), Some(3.0));
        assert_eq!(
            value(&out, "container_pressure_cpu_waiting", &a),
            Some(3052.326154)
        );
        assert_eq!(value(&out, "container_cpu_usage", &b), Some(98.765432));
        assert_eq!(value(&out, "container_cpu_cfs_periods", &b), Some(1200.0));
        assert_eq!(value(&out, "container_cpu_cfs_throttled", &b), Some(1.5));
        assert_eq!(
            value(&out, "container_memory_working_set", &b),
            Some(5_000_000.0 - 1_048_576.0)
        );
        assert_eq!(value(&out, "container_oom_events", &b), Some(1.0));
        assert_eq!(
            value(&out, "container_pressure_io_stalled", &b),
            Some(0.987654)
        );
        // Without the pod watch the names are empty; the id is always there.
        let labels = &out
            .iter()
            .find(|f| f.name == "container_cpu_usage")
            .expect("family")
            .points[0]
            .labels;
        assert_eq!(
            labels.iter().map(|(k, _)| *k).collect::<Vec<_>>(),
            ["namespace", "pod", "container", "container_id"]
        );
    }

    /// A nested tree on a cgroup v2 host: container A runs its process in a sub-cgroup
    /// (systemd inside the container), and a kind node O (a container) runs a process of its
    /// own in `init.scope` and a pod whose container I runs a process directly.
    fn nested_tree(root: &Path) -> [(&'static str, String); 3] {
        const O: &str = "0d0d0000000000000000000000000000000000000000000000000000000000e1";
        const I: &str = "1e1e0000000000000000000000000000000000000000000000000000000000f2";
        write(root, "cgroup.controllers", "cpu memory\n");
        let a = format!(
            "kubepods.slice/kubepods-pod11111111_2222_3333_4444_555555555555.slice/cri-containerd-{A}.scope"
        );
        let o = format!("system.slice/docker-{O}.scope");
        let i = format!(
            "{o}/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-pod66666666_7777_8888_9999_aaaaaaaaaaaa.slice/cri-containerd-{I}.scope"
        );
        let usage = |dir: &str, us: u64| {
            write(&root.join(dir), "cpu.stat", &format!("usage_usec {us}\n"));
        };
        usage(&a, 3_000_000);
        usage(&format!("{a}/app.service"), 1_000_000);
        usage(&o, 50_000_000);
        usage(&format!("{o}/init.scope"), 1_000_000);
        usage(&i, 20_000_000);
        // Where the processes are, as their /proc/PID/cgroup says.
        [
            (A, format!("{a}/app.service")),
            (O, format!("{o}/init.scope")),
            (I, i),
        ]
    }

    /// Series of `name` in `text`, by their label set.
    fn series(text: &str, name: &str) -> BTreeMap<String, f64> {
        text.lines()
            .filter_map(|l| l.strip_prefix(name)?.strip_prefix('{'))
            .filter_map(|l| {
                let (labels, value) = l.rsplit_once("} ")?;
                Some((labels.to_owned(), value.parse().ok()?))
            })
            .collect()
    }

    /// The containers the accounting charges samples to (from each process's
    /// /proc/PID/cgroup) are the containers the USE readings find by walking, under the same
    /// labels; and the cgroup's CPU counter is one series, read at the container's own
    /// directory (sub-cgroups and nested containers included), never at the cgroup of the
    /// process that happened to be sampled.
    #[test]
    fn accounting_and_use_see_the_same_containers_in_a_nested_tree() {
        use crate::model::Labels;
        use crate::workload::{accounting, Accounting, Cgroup};
        let dir = tempfile::tempdir().expect("tempdir");
        let processes = nested_tree(dir.path());
        let metrics = crate::metrics::Metrics::new();
        let mut acc = Accounting::new(&metrics, "node-1".into(), 100, accounting::MAX_BYTES);
        for (id, path) in &processes {
            let cg = Cgroup::from_text(&format!("0::/{path}\n"), dir.path());
            let labels = Labels::new(&cg, None);
            assert_eq!(labels.container_id, *id, "{path}");
            acc.add(&labels, 1.0);
        }
        acc.end_window();
        let mut out = Vec::new();
        read_alone(&mut source(dir.path(), 10, &metrics), &mut out).expect("reads");
        metrics
            .readings
            .publish(crate::metrics::snapshot::Snapshot {
                time: std::time::SystemTime::now(),
                families: out,
            });
        let text = metrics.encode();
        let sampled = series(&text, "ember_container_cpu_seconds_total");
        let usage = series(&text, "ember_container_cpu_usage_seconds_total");
        assert!(
            !text.contains("ember_container_cgroup_cpu"),
            "one series of the cgroup's CPU counter:\n{text}"
        );
        assert_eq!(sampled.len(), 3, "{text}");
        assert_eq!(
            sampled.keys().collect::<Vec<_>>(),
            usage.keys().collect::<Vec<_>>(),
            "the same containers under the same labels"
        );
        let usage_of = |id: &str| {
            usage
                .iter()
                .find(|(labels, _)| labels.contains(id))
                .map(|(_, v)| *v)
        };
        let [(a, _), (o, _), (i, _)] = &processes;
        assert_eq!(usage_of(a), Some(3.0), "A's directory, not app.service's");
        assert_eq!(
            usage_of(o),
            Some(50.0),
            "the node's directory, not init.scope's"
        );
        assert_eq!(usage_of(i), Some(20.0));
    }

    #[test]
    fn the_cap_counts_what_it_drops() {
        let dir = tempfile::tempdir().expect("tempdir");
        tree(dir.path());
        let metrics = crate::metrics::Metrics::new();
        let mut out = Vec::new();
        read_alone(&mut source(dir.path(), 1, &metrics), &mut out).expect("reads");
        assert_eq!(value(&out, "readings_containers", &[]), Some(1.0));
        assert_eq!(
            out.iter()
                .find(|f| f.name == "container_cpu_usage")
                .map(|f| f.points.len()),
            Some(1)
        );
        assert!(metrics
            .encode()
            .contains("ember_cache_dropped_total{cache=\"readings_containers\"} 1"));
    }

    #[test]
    fn malformed_files_are_reported_not_fatal() {
        let dir = tempfile::tempdir().expect("tempdir");
        tree(dir.path());
        let a = dir.path().join(format!(
            "cpuacct/kubepods/burstable/pod11111111-2222-3333-4444-555555555555/{A}"
        ));
        fs::write(a.join("cpuacct.usage"), "lots\n").expect("write");
        let metrics = crate::metrics::Metrics::new();
        let mut out = Vec::new();
        let err = read_alone(&mut source(dir.path(), 10, &metrics), &mut out).unwrap_err();
        assert!(err.to_string().contains("cpuacct.usage"), "{err}");
        // No made-up value for A (v2's usage is not A's), and B is still reported.
        assert_eq!(
            value(&out, "container_cpu_usage", &[("container_id", A)]),
            None
        );
        assert_eq!(
            value(&out, "container_cpu_usage", &[("container_id", B)]),
            Some(98.765432)
        );
    }
}
