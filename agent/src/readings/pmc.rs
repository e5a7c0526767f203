//! Hardware and software counters from `perf_event_open` in counting mode, per CPU and
//! per container.
//!
//! Every event is opened once per online CPU for the whole host (`pid = -1`), and once per
//! CPU for each container's cgroup (`PERF_FLAG_PID_CGROUP` with an fd of its directory in
//! the `perf_event` hierarchy, see [`crate::workload::walk`]). Counters are read with
//! `PERF_FORMAT_TOTAL_TIME_ENABLED | PERF_FORMAT_TOTAL_TIME_RUNNING` and scaled by
//! enabled / running, since the PMU multiplexes when more events are open than it has
//! registers; the running / enabled ratio is exported so a reader knows how much of a
//! value is an estimate.
//!
//! Which events the machine has is probed once at start: an event the kernel refuses
//! (`ENOENT` on a VM without a virtual PMU) is reported as `ember_pmc_supported{event} 0`,
//! logged in one line, and never tried again. Software events (context switches, CPU
//! migrations, page faults) work everywhere.
//!
//! Containers are taken each interval from the collector's walk of the hierarchy (the
//! [`walk::COUNTERS`] view, the one run-queue latency sees too); fds of containers that
//! went away are closed; at most `max_containers` are counted, and the rest are counted in
//! `ember_cache_dropped_total{cache="perf_containers"}` once each.

use std::collections::{HashMap, HashSet};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use libbpf_rs::libbpf_sys;

use crate::config::Counters;
use crate::metrics::{Cache, Metrics, ReadingsSource};
use crate::readings::{Family, Interval, Kind, ReadError, Source};
use crate::workload::kube::Metadata;
use crate::workload::labels::container_labels;
use crate::workload::walk::{self, ContainerCgroup, Request};

/// One counter ember opens, named as `perf list` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    /// The name (`cycles`, `context-switches`, ...), also the `event` label.
    pub name: &'static str,
    /// `PERF_TYPE_HARDWARE` or `PERF_TYPE_SOFTWARE`.
    pub type_: u32,
    /// The event within its type.
    pub config: u64,
}

const fn hw(name: &'static str, config: u32) -> Event {
    Event {
        name,
        type_: libbpf_sys::PERF_TYPE_HARDWARE,
        config: config as u64,
    }
}

const fn sw(name: &'static str, config: u32) -> Event {
    Event {
        name,
        type_: libbpf_sys::PERF_TYPE_SOFTWARE,
        config: config as u64,
    }
}

/// Every event ember counts, hardware first.
pub const EVENTS: &[Event] = &[
    hw("cycles", libbpf_sys::PERF_COUNT_HW_CPU_CYCLES),
    hw("instructions", libbpf_sys::PERF_COUNT_HW_INSTRUCTIONS),
    hw("ref-cycles", libbpf_sys::PERF_COUNT_HW_REF_CPU_CYCLES),
    hw(
        "cache-references",
        libbpf_sys::PERF_COUNT_HW_CACHE_REFERENCES,
    ),
    hw("cache-misses", libbpf_sys::PERF_COUNT_HW_CACHE_MISSES),
    hw(
        "branch-instructions",
        libbpf_sys::PERF_COUNT_HW_BRANCH_INSTRUCTIONS,
    ),
    hw("branch-misses", libbpf_sys::PERF_COUNT_HW_BRANCH_MISSES),
    hw(
        "stalled-cycles-frontend",
        libbpf_sys::PERF_COUNT_HW_STALLED_CYCLES_FRONTEND,
    ),
    hw(
        "stalled-cycles-backend",
        libbpf_sys::PERF_COUNT_HW_STALLED_CYCLES_BACKEND,
    ),
    sw(
        "context-switches",
        libbpf_sys::PERF_COUNT_SW_CONTEXT_SWITCHES,
    ),
    sw("cpu-migrations", libbpf_sys::PERF_COUNT_SW_CPU_MIGRATIONS),
    sw("minor-faults", libbpf_sys::PERF_COUNT_SW_PAGE_FAULTS_MIN),
    sw("major-faults", libbpf_sys::PERF_COUNT_SW_PAGE_FAULTS_MAJ),
];

/// One read of a counter: `{value, time_enabled, time_running}`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reading {
    /// Raw count while the event was on the PMU.
    pub value: u64,
    /// Nanoseconds the event was enabled.
    pub enabled: u64,
    /// Nanoseconds it actually counted (less than `enabled` when multiplexed).
    pub running: u64,
}

impl Reading {
    /// The count extrapolated to the whole enabled time: `value × enabled / running`
    /// (0 if it never ran; the raw value when nothing was enabled yet).
    pub fn scaled(&self) -> f64 {
        if self.running == 0 {
            return if self.enabled == 0 {
                self.value as f64
            } else {
                0.0
            };
        }
        self.value as f64 * self.enabled as f64 / self.running as f64
    }

    /// Adds another CPU's reading of the same event (for per-container sums).
    pub fn add(&mut self, o: &Reading) {
        self.value = self.value.saturating_add(o.value);
        self.enabled = self.enabled.saturating_add(o.enabled);
        self.running = self.running.saturating_add(o.running);
    }

    /// running / enabled: 1 when the event had the PMU all the time (or was never enabled).
    pub fn ratio(&self) -> f64 {
        if self.enabled == 0 {
            1.0
        } else {
            (self.running as f64 / self.enabled as f64).min(1.0)
        }
    }
}

/// Instructions per cycle between two cumulative (instructions, cycles) pairs; `None`
/// without cycles in between (idle, or the first interval).
pub fn ipc(before: Option<(f64, f64)>, now: (f64, f64)) -> Option<f64> {
    let (i0, c0) = before?;
    let (di, dc) = (now.0 - i0, now.1 - c0);
    (dc > 0.0 && di >= 0.0).then(|| di / dc)
}

/// Opens `event` in counting mode on `cpu` for every task (`cgroup = None`) or for the
/// tasks of one cgroup directory (an fd of it, `PERF_FLAG_PID_CGROUP`).
fn open(event: &Event, cpu: u32, cgroup: Option<&OwnedFd>) -> std::io::Result<OwnedFd> {
    let mut attr = crate::os::perf_event::attr();
    attr.type_ = event.type_;
    attr.config = event.config;
    attr.read_format = u64::from(
        libbpf_sys::PERF_FORMAT_TOTAL_TIME_ENABLED | libbpf_sys::PERF_FORMAT_TOTAL_TIME_RUNNING,
    );
    crate::os::perf_event::open(&attr, cpu, cgroup.map(AsFd::as_fd))
}

/// Counting per container takes one fd per event per CPU per container (thousands on a
/// big host): lift the soft `RLIMIT_NOFILE` to the hard limit, which needs no privilege.
fn raise_fd_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: lim is a valid rlimit for getrlimit/setrlimit to read and write.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            let _ = libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

fn read(fd: &OwnedFd) -> Option<Reading> {
    let mut buf = [0u64; 3];
    // SAFETY: buf is 24 writable bytes; the kernel writes at most that for this read_format.
    let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), 24) };
    (n == 24).then_some(Reading {
        value: buf[0],
        enabled: buf[1],
        running: buf[2],
    })
}

/// Why the perf counters cannot start.
#[derive(Debug, thiserror::Error)]
pub enum PmcError {
    /// The online CPUs are unknown: nothing to open counters on.
    #[error("cannot read /sys/devices/system/cpu/online")]
    NoCpus,
}

struct Container {
    cgroup: ContainerCgroup,
    /// `[event][cpu]`, events as in `Pmc::events`.
    fds: Vec<Vec<OwnedFd>>,
    last: Option<(f64, f64)>,
}

/// The perf counters source (`source="pmc"`).
pub struct Pmc {
    /// Supported events, in [`EVENTS`] order.
    events: Vec<Event>,
    unsupported: Vec<Event>,
    cpus: Vec<u32>,
    /// `[event][cpu]`.
    host: Vec<Vec<Option<OwnedFd>>>,
    host_last: Vec<Option<(f64, f64)>>,
    containers: HashMap<PathBuf, Container>,
    refused: HashSet<PathBuf>,
    /// `counters.max_containers`: containers counted at most (each costs one fd per
    /// supported event per CPU).
    max_containers: usize,
    root: Option<PathBuf>,
    metadata: Option<Metadata>,
    metrics: Metrics,
    open_error_logged: bool,
}

impl Pmc {
    /// Probes which events this machine has (one log line for those it lacks) and opens the
    /// per-CPU host counters.
    pub fn start(
        cfg: &Counters,
        metadata: Option<Metadata>,
        metrics: Metrics,
    ) -> Result<Self, PmcError> {
        let cpus = crate::os::procfs::online_cpus()
            .filter(|c| !c.is_empty())
            .ok_or(PmcError::NoCpus)?;
        raise_fd_limit();
        let mut events = Vec::new();
        let mut unsupported = Vec::new();
        let mut reason = String::new();
        for e in EVENTS {
            match open(e, cpus[0], None) {
                Ok(_) => events.push(*e),
                Err(err) => {
                    if reason.is_empty() {
                        reason = err.to_string();
                    }
                    unsupported.push(*e);
                }
            }
        }
        if !unsupported.is_empty() {
            let names: Vec<&str> = unsupported.iter().map(|e| e.name).collect();
            tracing::warn!(
                "perf counters: {} not available on this machine ({reason}); \
                 ember_pmc_supported shows 0 for them and they are not retried",
                names.join(", ")
            );
        }
        let host = events
            .iter()
            .map(|e| cpus.iter().map(|&c| open(e, c, None).ok()).collect())
            .collect();
        let root = walk::perf_event_root();
        Ok(Self {
            host_last: vec![None; cpus.len()],
            events,
            unsupported,
            cpus,
            host,
            containers: HashMap::new(),
            refused: HashSet::new(),
            max_containers: cfg.max_containers,
            root,
            metadata,
            metrics,
            open_error_logged: false,
        })
    }

    /// Perf fds currently open.
    pub fn fds_open(&self) -> usize {
        let host: usize = self.host.iter().flatten().filter(|f| f.is_some()).count();
        let containers: usize = self
            .containers
            .values()
            .map(|c| c.fds.iter().map(Vec::len).sum::<usize>())
            .sum();
        host + containers
    }

    fn open_container(&self, c: &ContainerCgroup) -> std::io::Result<Container> {
        let dir = std::fs::File::open(&c.dir)?;
        let dir = OwnedFd::from(dir);
        let mut fds = Vec::with_capacity(self.events.len());
        for e in &self.events {
            let per_cpu = self
                .cpus
                .iter()
                .map(|&cpu| open(e, cpu, Some(&dir)))
                .collect::<std::io::Result<Vec<_>>>()?;
            fds.push(per_cpu);
        }
        Ok(Container {
            cgroup: c.clone(),
            fds,
            last: None,
        })
    }

    /// Opens counters for new containers and closes those of vanished ones.
    fn rescan(&mut self, root: &Path, interval: &Interval) {
        let Some(scan) = interval.cgroups.scan(root, walk::COUNTERS) else {
            return;
        };
        if scan.dropped_dirs > 0 {
            self.metrics.dropped(Cache::PerfCgroupDirs, 1);
        }
        let present: HashSet<&Path> = scan.containers.iter().map(|c| c.dir.as_path()).collect();
        self.containers.retain(|dir, c| {
            // A directory re-created under the same name is a new cgroup.
            present.contains(dir.as_path())
                && scan
                    .containers
                    .iter()
                    .any(|n| n.dir == *dir && n.inode == c.cgroup.inode)
        });
        self.refused.retain(|d| present.contains(d.as_path()));
        for c in &scan.containers {
            if self.containers.contains_key(&c.dir) || self.refused.contains(&c.dir) {
                continue;
            }
            if self.containers.len() >= self.max_containers {
                self.refused.insert(c.dir.clone());
                self.metrics.dropped(Cache::PerfContainers, 1);
                continue;
            }
            match self.open_container(c) {
                Ok(opened) => {
                    self.containers.insert(c.dir.clone(), opened);
                }
                Err(e) => {
                    // Gone between the walk and the open, or out of fds: try again next time.
                    self.metrics.dropped(Cache::PerfContainers, 1);
                    if !self.open_error_logged {
                        self.open_error_logged = true;
                        tracing::warn!(
                            "perf counters: cannot count container cgroup {}: {e}",
                            c.dir.display()
                        );
                    }
                }
            }
        }
    }
}

fn index_of(events: &[Event], name: &str) -> Option<usize> {
    events.iter().position(|e| e.name == name)
}

impl Source for Pmc {
    fn name(&self) -> ReadingsSource {
        ReadingsSource::Pmc
    }

    fn cgroups(&self) -> Vec<Request> {
        Request::counters(self.root.as_ref())
    }

    fn read(&mut self, out: &mut Vec<Family>, interval: &Interval) -> Result<(), ReadError> {
        if let Some(root) = self.root.clone() {
            self.rescan(&root, interval);
        }
        let mut errors = 0u64;
        out.push(self.supported());
        out.extend(self.per_cpu(&mut errors));
        out.extend(self.per_container(&mut errors));
        let mut fds = Family::new(
            "perf_event_fds",
            "Perf event fds open for counting (events × CPUs × (1 + containers))",
            None,
            Kind::Gauge,
        );
        fds.push(vec![], self.fds_open() as f64);
        let mut counted = Family::new(
            "perf_containers",
            "Containers whose cgroups have perf counters open",
            None,
            Kind::Gauge,
        );
        counted.push(vec![], self.containers.len() as f64);
        out.extend([fds, counted]);
        if errors > 0 {
            return Err(ReadError::Counters(errors));
        }
        Ok(())
    }
}

impl Pmc {
    /// `pmc_supported`: 1 for each event counted, 0 for each the probe refused.
    fn supported(&self) -> Family {
        let mut supported = Family::new(
            "pmc_supported",
            "1 if the perf event can be counted on this machine, else 0 (probed once at start)",
            None,
            Kind::Gauge,
        );
        for e in &self.events {
            supported.push(vec![("event", e.name.to_owned())], 1.0);
        }
        for e in &self.unsupported {
            supported.push(vec![("event", e.name.to_owned())], 0.0);
        }
        supported
    }

    /// Each CPU's counters, their scaling ratios and IPC (failed reads added to `errors`).
    fn per_cpu(&mut self, errors: &mut u64) -> [Family; 3] {
        let mut total = Family::new(
            "perf_events",
            "Perf events counted on each CPU, scaled by time enabled / time running",
            None,
            Kind::Counter,
        );
        let mut ratio = Family::new(
            "perf_events_scaling_ratio",
            "Time running / time enabled of each CPU's counter (below 1 when the PMU multiplexes)",
            None,
            Kind::Gauge,
        );
        let (ins, cyc) = (
            index_of(&self.events, "instructions"),
            index_of(&self.events, "cycles"),
        );
        let mut ipc_family = Family::new(
            "cpu_instructions_per_cycle",
            "Instructions per cycle of each CPU over the last interval",
            None,
            Kind::Gauge,
        );
        for (ci, cpu) in self.cpus.iter().enumerate() {
            let mut pair = (None, None);
            for (ei, e) in self.events.iter().enumerate() {
                let Some(fd) = self
                    .host
                    .get(ei)
                    .and_then(|v| v.get(ci))
                    .and_then(Option::as_ref)
                else {
                    continue;
                };
                let Some(r) = read(fd) else {
                    *errors += 1;
                    continue;
                };
                let labels = vec![("cpu", cpu.to_string()), ("event", e.name.to_owned())];
                total.push(labels.clone(), r.scaled());
                ratio.push(labels, r.ratio());
                if Some(ei) == ins {
                    pair.0 = Some(r.scaled());
                }
                if Some(ei) == cyc {
                    pair.1 = Some(r.scaled());
                }
            }
            if let (Some(i), Some(c)) = pair {
                if let Some(v) = ipc(self.host_last[ci], (i, c)) {
                    ipc_family.push(vec![("cpu", cpu.to_string())], v);
                }
                self.host_last[ci] = Some((i, c));
            }
        }
        [total, ratio, ipc_family]
    }

    /// Each container's counters (summed over CPUs), ratios and IPC.
    fn per_container(&mut self, errors: &mut u64) -> [Family; 3] {
        let (ins, cyc) = (
            index_of(&self.events, "instructions"),
            index_of(&self.events, "cycles"),
        );
        let mut c_total = Family::new(
            "container_perf_events",
            "Perf events counted in each container's cgroup (all CPUs), scaled by time enabled / time running",
            None,
            Kind::Counter,
        );
        let mut c_ratio = Family::new(
            "container_perf_events_scaling_ratio",
            "Time running / time enabled of each container's counters (below 1 when the PMU multiplexes)",
            None,
            Kind::Gauge,
        );
        let mut c_ipc = Family::new(
            "container_instructions_per_cycle",
            "Instructions per cycle of each container over the last interval",
            None,
            Kind::Gauge,
        );
        let meta = self.metadata.as_ref();
        for c in self.containers.values_mut() {
            let labels = container_labels(&c.cgroup.container_id, None, meta);
            let mut pair = (None, None);
            for (ei, e) in self.events.iter().enumerate() {
                let mut sum = Reading::default();
                let mut scaled = 0.0;
                for fd in c.fds.get(ei).into_iter().flatten() {
                    match read(fd) {
                        Some(r) => {
                            scaled += r.scaled();
                            sum.add(&r);
                        }
                        None => *errors += 1,
                    }
                }
                let mut l = labels.clone();
                l.push(("event", e.name.to_owned()));
                c_total.push(l.clone(), scaled);
                c_ratio.push(l, sum.ratio());
                if Some(ei) == ins {
                    pair.0 = Some(scaled);
                }
                if Some(ei) == cyc {
                    pair.1 = Some(scaled);
                }
            }
            if let (Some(i), Some(cy)) = pair {
                if let Some(v) = ipc(c.last, (i, cy)) {
                    c_ipc.push(labels.clone(), v);
                }
                c.last = Some((i, cy));
            }
        }
        [c_total, c_ratio, c_ipc]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scaling_extrapolates_multiplexed_counts() {
        let r = Reading {
            value: 1000,
            enabled: 4_000,
            running: 1_000,
        };
        assert_eq!(r.scaled(), 4000.0);
        assert_eq!(r.ratio(), 0.25);
        let full = Reading {
            value: 7,
            enabled: 10,
            running: 10,
        };
        assert_eq!(full.scaled(), 7.0);
        assert_eq!(full.ratio(), 1.0);
        let never = Reading {
            value: 0,
            enabled: 10,
            running: 0,
        };
        assert_eq!(never.scaled(), 0.0);
        assert_eq!(never.ratio(), 0.0);
        assert_eq!(Reading::default().ratio(), 1.0);
        let mut sum = r;
        sum.add(&full);
        assert_eq!(sum.enabled, 4010);
        assert_eq!(sum.running, 1010);
    }

    #[test]
    fn ipc_is_a_ratio_of_deltas() {
        assert_eq!(ipc(None, (10.0, 10.0)), None);
        assert_eq!(ipc(Some((100.0, 100.0)), (400.0, 300.0)), Some(1.5));
        assert_eq!(ipc(Some((100.0, 100.0)), (100.0, 100.0)), None, "idle");
    }

    #[test]
    fn event_names_are_unique_and_perf_spelled() {
        let names: HashSet<&str> = EVENTS.iter().map(|e| e.name).collect();
        assert_eq!(names.len(), EVENTS.len());
        for n in ["cycles", "instructions", "context-switches", "major-faults"] {
            assert!(names.contains(n), "{n}");
        }
    }
}
