//! The host's USE sources: CPU, memory, disk and network, each a [`Source`] that reads its
//! files, renders them as node_exporter names them, and derives its `use_ratio` /
//! `use_errors` points from the change since its previous reading.
//!
//! `ember_use_ratio{resource,kind}` (0..1):
//!
//! | resource | utilization | saturation |
//! |---|---|---|
//! | `cpu` | busy share of all CPUs' time (not idle, not iowait) | share of time some task waited for a CPU (PSI cpu `some`); without PSI, runnable tasks beyond the CPU count per CPU |
//! | `memory` | 1 − MemAvailable / MemTotal | share of time some task stalled on memory (PSI memory `some`) |
//! | `disk` | io time share of the busiest device | share of time some task waited on I/O (PSI io `some`) |
//! | `network` | busiest direction of the busiest interface vs its link speed (interfaces with a known speed) | dropped and overrun packets per packet, all interfaces |
//!
//! `ember_use_errors_total{resource}`: `memory` = OOM kills (`/proc/vmstat` `oom_kill`),
//! `network` = receive and transmit errors of all interfaces. The kernel counts no CPU or
//! disk errors in `/proc`, so those resources have none.
//! Ratios need two readings: the first interval has only the gauges.

use std::collections::HashMap;
use std::time::Instant;

use prometheus_client::registry::Unit;
use regex::Regex;

use super::{diskstats, elapsed, loadavg, meminfo, pressure, read_optional, stat, Roots};
use crate::metrics::{Cache, ReadingsSource};
use crate::readings::{Family, Interval, Kind, ReadError, Source};

/// Device filters and caps of the disk and network sources.
#[derive(Clone)]
pub struct Options {
    /// Block devices left out (matched against the name).
    pub disk_exclude: Option<Regex>,
    /// Network interfaces left out.
    pub network_exclude: Option<Regex>,
    /// Most devices of each kind reported; more are counted as dropped.
    pub max_devices: usize,
    /// Where drops are counted.
    pub metrics: crate::metrics::Metrics,
}

impl Options {
    /// From the `readings:` config; empty patterns exclude nothing.
    pub fn from_config(
        cfg: &crate::config::Readings,
        metrics: &crate::metrics::Metrics,
    ) -> Result<Self, regex::Error> {
        let re = |s: &str| (!s.is_empty()).then(|| Regex::new(s)).transpose();
        Ok(Self {
            disk_exclude: re(&cfg.disk_exclude)?,
            network_exclude: re(&cfg.network_exclude)?,
            max_devices: cfg.max_devices,
            metrics: metrics.clone(),
        })
    }
}

/// Seconds per clock tick of `/proc/stat` (USER_HZ).
pub(super) fn tick_seconds() -> f64 {
    1.0 / crate::os::procfs::clock_ticks_per_second() as f64
}

pub(super) fn gauge(name: &'static str, help: &'static str, unit: Option<Unit>) -> Family {
    Family::new(name, help, unit, Kind::Gauge)
}

pub(super) fn counter(name: &'static str, help: &'static str, unit: Option<Unit>) -> Family {
    Family::new(name, help, unit, Kind::Counter)
}

/// Pushes the `use_ratio` points of one resource (values clamped to 0..1, skipped if absent).
pub(super) fn use_ratio(
    out: &mut Vec<Family>,
    resource: &str,
    utilization: Option<f64>,
    saturation: Option<f64>,
) {
    let mut f = gauge(
        "use_ratio",
        "USE method summary per resource: utilization and saturation as a 0..1 ratio over the last interval",
        None,
    );
    for (kind, v) in [("utilization", utilization), ("saturation", saturation)] {
        if let Some(v) = v.filter(|v| v.is_finite()) {
            f.push(
                vec![("resource", resource.to_owned()), ("kind", kind.to_owned())],
                v.clamp(0.0, 1.0),
            );
        }
    }
    if !f.points.is_empty() {
        out.push(f);
    }
}

pub(super) fn use_errors(out: &mut Vec<Family>, resource: &str, total: f64) {
    let mut f = counter(
        "use_errors",
        "USE method summary per resource: errors (memory: OOM kills; network: interface errors)",
        None,
    );
    f.push(vec![("resource", resource.to_owned())], total);
    out.push(f);
}

/// PSI families of one resource and the share of the interval some task stalled.
struct Psi {
    file: std::path::PathBuf,
    resource: &'static str,
    prev: Option<(Instant, u64)>,
    /// Whether the last read found the file (PSI compiled in and enabled).
    available: bool,
}

impl Psi {
    fn new(roots: &Roots, resource: &'static str) -> Self {
        Self {
            file: roots.proc.join("pressure").join(resource),
            resource,
            prev: None,
            available: false,
        }
    }

    /// Pushes the families; returns the `some` share since the last read.
    fn read(&mut self, out: &mut Vec<Family>, errors: &mut Vec<ReadError>) -> Option<f64> {
        self.available = false;
        let text = match read_optional(&self.file) {
            Ok(Some(t)) => t,
            Ok(None) => return None,
            Err(e) => {
                errors.push(e);
                return None;
            }
        };
        let p = match pressure::parse(&text) {
            Ok(p) => p,
            Err(e) => {
                errors.push(e.into());
                return None;
            }
        };
        self.available = true;
        let (waiting, stalled) = names(self.resource);
        let mut w = counter(
            waiting,
            "Time some task stalled on this resource (PSI some)",
            Some(Unit::Seconds),
        );
        w.push(vec![], p.some_us as f64 / 1e6);
        out.push(w);
        if let Some(full) = p.full_us {
            let mut s = counter(
                stalled,
                "Time all non-idle tasks stalled on this resource at once (PSI full)",
                Some(Unit::Seconds),
            );
            s.push(vec![], full as f64 / 1e6);
            out.push(s);
        }
        let now = Instant::now();
        let share = self.prev.and_then(|(t, some)| {
            let dt = elapsed(now.duration_since(t))?;
            Some(p.some_us.saturating_sub(some) as f64 / 1e6 / dt)
        });
        self.prev = Some((now, p.some_us));
        share
    }
}

pub(super) fn names(resource: &str) -> (&'static str, &'static str) {
    match resource {
        "cpu" => ("node_pressure_cpu_waiting", "node_pressure_cpu_stalled"),
        "memory" => (
            "node_pressure_memory_waiting",
            "node_pressure_memory_stalled",
        ),
        _ => ("node_pressure_io_waiting", "node_pressure_io_stalled"),
    }
}

/// CPU: `/proc/stat`, `/proc/loadavg`, `/proc/pressure/cpu`.
pub struct Cpu {
    roots: Roots,
    tick: f64,
    prev: Option<(u64, u64)>,
    psi: Psi,
}

impl Cpu {
    /// A CPU source reading under `roots`.
    pub fn new(roots: Roots) -> Self {
        Self {
            psi: Psi::new(&roots, "cpu"),
            roots,
            tick: tick_seconds(),
            prev: None,
        }
    }
}

impl Source for Cpu {
    fn name(&self) -> ReadingsSource {
        ReadingsSource::Cpu
    }

    fn read(&mut self, out: &mut Vec<Family>, _: &Interval) -> Result<(), ReadError> {
        let mut errors = Vec::new();
        let text =
            crate::os::procfs::read_capped(&self.roots.proc.join("stat"), super::MAX_FILE_BYTES)
                .map_err(|source| ReadError::File {
                    path: "/proc/stat".into(),
                    source,
                })?;
        let s = stat::parse(&text)?;
        let mut cpu = counter(
            "node_cpu",
            "Seconds the CPUs spent in each mode",
            Some(Unit::Seconds),
        );
        let mut guest = counter(
            "node_cpu_guest",
            "Seconds the CPUs spent running guests (already counted in user and nice)",
            Some(Unit::Seconds),
        );
        for (n, t) in &s.cpus {
            for (mode, v) in stat::MODES.iter().zip(t.modes) {
                if let Some(v) = v {
                    cpu.push(
                        vec![("cpu", n.to_string()), ("mode", (*mode).to_owned())],
                        v as f64 * self.tick,
                    );
                }
            }
            for (mode, v) in ["user", "nice"].iter().zip(t.guest) {
                if let Some(v) = v {
                    guest.push(
                        vec![("cpu", n.to_string()), ("mode", (*mode).to_owned())],
                        v as f64 * self.tick,
                    );
                }
            }
        }
        out.push(cpu);
        if !guest.points.is_empty() {
            out.push(guest);
        }
        for (name, help, v, kind) in [
            (
                "node_context_switches",
                "Context switches since boot",
                s.ctxt,
                Kind::Counter,
            ),
            (
                "node_forks",
                "Processes and threads created since boot",
                s.processes,
                Kind::Counter,
            ),
            (
                "node_procs_running",
                "Tasks runnable now (running or waiting for a CPU)",
                s.procs_running,
                Kind::Gauge,
            ),
            (
                "node_procs_blocked",
                "Tasks blocked on I/O now",
                s.procs_blocked,
                Kind::Gauge,
            ),
        ] {
            if let Some(v) = v {
                let mut f = Family::new(name, help, None, kind);
                f.push(vec![], v as f64);
                out.push(f);
            }
        }
        if let Some(b) = s.btime {
            let mut f = gauge(
                "node_boot_time",
                "Boot time, seconds since the epoch",
                Some(Unit::Seconds),
            );
            f.push(vec![], b as f64);
            out.push(f);
        }
        match read_optional(&self.roots.proc.join("loadavg")).map(|t| t.map(|t| loadavg::parse(&t)))
        {
            Ok(Some(Ok(l))) => {
                for (name, help, v) in [
                    ("node_load1", "1-minute load average", l.load[0]),
                    ("node_load5", "5-minute load average", l.load[1]),
                    ("node_load15", "15-minute load average", l.load[2]),
                ] {
                    let mut f = gauge(name, help, None);
                    f.push(vec![], v);
                    out.push(f);
                }
            }
            Ok(Some(Err(e))) => errors.push(e.into()),
            Ok(None) => {}
            Err(e) => errors.push(e),
        }
        let psi = self.psi.read(out, &mut errors);
        let (total, idle) = (s.all.total(), s.all.idle());
        let utilization = self.prev.and_then(|(pt, pi)| {
            let dt = total.checked_sub(pt).filter(|d| *d > 0)?;
            Some(1.0 - idle.saturating_sub(pi) as f64 / dt as f64)
        });
        self.prev = Some((total, idle));
        let ncpu = s.cpus.len().max(1) as f64;
        // Without PSI: runnable tasks beyond one per CPU (less this reading thread). With
        // PSI, the first interval has no ratio rather than one of another meaning.
        let saturation = if self.psi.available {
            psi
        } else {
            s.procs_running
                .map(|r| ((r.saturating_sub(1)) as f64 - ncpu).max(0.0) / ncpu)
        };
        use_ratio(out, "cpu", utilization, saturation);
        ReadError::collect(errors)
    }
}

/// `/proc/meminfo` keys exported, as node_exporter names them (parentheses become `_`).
const MEMINFO: &[(&str, &str)] = &[
    ("MemTotal", "node_memory_MemTotal"),
    ("MemFree", "node_memory_MemFree"),
    ("MemAvailable", "node_memory_MemAvailable"),
    ("Buffers", "node_memory_Buffers"),
    ("Cached", "node_memory_Cached"),
    ("SwapCached", "node_memory_SwapCached"),
    ("Active", "node_memory_Active"),
    ("Inactive", "node_memory_Inactive"),
    ("Active(anon)", "node_memory_Active_anon"),
    ("Inactive(anon)", "node_memory_Inactive_anon"),
    ("Active(file)", "node_memory_Active_file"),
    ("Inactive(file)", "node_memory_Inactive_file"),
    ("Unevictable", "node_memory_Unevictable"),
    ("Mlocked", "node_memory_Mlocked"),
    ("SwapTotal", "node_memory_SwapTotal"),
    ("SwapFree", "node_memory_SwapFree"),
    ("Dirty", "node_memory_Dirty"),
    ("Writeback", "node_memory_Writeback"),
    ("AnonPages", "node_memory_AnonPages"),
    ("Mapped", "node_memory_Mapped"),
    ("Shmem", "node_memory_Shmem"),
    ("Slab", "node_memory_Slab"),
    ("SReclaimable", "node_memory_SReclaimable"),
    ("SUnreclaim", "node_memory_SUnreclaim"),
    ("KernelStack", "node_memory_KernelStack"),
    ("PageTables", "node_memory_PageTables"),
    ("CommitLimit", "node_memory_CommitLimit"),
    ("Committed_AS", "node_memory_Committed_AS"),
    ("HugePages_Total", "node_memory_HugePages_Total"),
    ("HugePages_Free", "node_memory_HugePages_Free"),
    ("Hugepagesize", "node_memory_Hugepagesize"),
];

/// `/proc/vmstat` fields exported: paging, swapping, faults, page scanning, OOM kills.
const VMSTAT: &[(&str, &str)] = &[
    ("pgpgin", "node_vmstat_pgpgin"),
    ("pgpgout", "node_vmstat_pgpgout"),
    ("pswpin", "node_vmstat_pswpin"),
    ("pswpout", "node_vmstat_pswpout"),
    ("pgfault", "node_vmstat_pgfault"),
    ("pgmajfault", "node_vmstat_pgmajfault"),
    ("pgscan_kswapd", "node_vmstat_pgscan_kswapd"),
    ("pgscan_direct", "node_vmstat_pgscan_direct"),
    ("pgsteal_kswapd", "node_vmstat_pgsteal_kswapd"),
    ("pgsteal_direct", "node_vmstat_pgsteal_direct"),
    ("oom_kill", "node_vmstat_oom_kill"),
];

/// Memory: `/proc/meminfo`, `/proc/vmstat`, `/proc/pressure/memory`.
pub struct Memory {
    roots: Roots,
    psi: Psi,
}

impl Memory {
    /// A memory source reading under `roots`.
    pub fn new(roots: Roots) -> Self {
        Self {
            psi: Psi::new(&roots, "memory"),
            roots,
        }
    }
}

impl Source for Memory {
    fn name(&self) -> ReadingsSource {
        ReadingsSource::Memory
    }

    fn read(&mut self, out: &mut Vec<Family>, _: &Interval) -> Result<(), ReadError> {
        let mut errors = Vec::new();
        let text =
            crate::os::procfs::read_capped(&self.roots.proc.join("meminfo"), super::MAX_FILE_BYTES)
                .map_err(|source| ReadError::File {
                    path: "/proc/meminfo".into(),
                    source,
                })?;
        let m = meminfo::parse_meminfo(&text)?;
        for (key, name) in MEMINFO {
            if let Some(e) = m.iter().find(|e| e.key == *key) {
                let mut f = gauge(
                    name,
                    "Memory information field of /proc/meminfo",
                    e.bytes.then_some(Unit::Bytes),
                );
                f.push(vec![], e.value as f64);
                out.push(f);
            }
        }
        let get = |k: &str| m.iter().find(|e| e.key == k).map(|e| e.value as f64);
        let utilization = get("MemTotal").filter(|t| *t > 0.0).and_then(|total| {
            let avail = get("MemAvailable").or_else(|| {
                Some(get("MemFree")? + get("Buffers").unwrap_or(0.0) + get("Cached").unwrap_or(0.0))
            })?;
            Some(1.0 - avail / total)
        });
        match read_optional(&self.roots.proc.join("vmstat"))
            .map(|t| t.map(|t| meminfo::parse_vmstat(&t)))
        {
            Ok(Some(Ok(v))) => {
                for (key, name) in VMSTAT {
                    if let Some(x) = meminfo::get(&v, key) {
                        // node_exporter exports these counters untyped, without `_total`.
                        let mut f = gauge(
                            name,
                            "Counter of /proc/vmstat (monotonic; named as node_exporter names it)",
                            None,
                        );
                        f.push(vec![], x as f64);
                        out.push(f);
                    }
                }
                if let Some(k) = meminfo::get(&v, "oom_kill") {
                    use_errors(out, "memory", k as f64);
                }
            }
            Ok(Some(Err(e))) => errors.push(e.into()),
            Ok(None) => {}
            Err(e) => errors.push(e),
        }
        let saturation = self.psi.read(out, &mut errors);
        use_ratio(out, "memory", utilization, saturation);
        ReadError::collect(errors)
    }
}

/// Disk: `/proc/diskstats`, `/proc/pressure/io`.
pub struct Disk {
    roots: Roots,
    opts: Options,
    prev: HashMap<String, (Instant, u64)>,
    psi: Psi,
}

impl Disk {
    /// A disk source reading under `roots`.
    pub fn new(roots: Roots, opts: Options) -> Self {
        Self {
            psi: Psi::new(&roots, "io"),
            roots,
            opts,
            prev: HashMap::new(),
        }
    }
}

/// Disk counter families: name, help, unit, how to get the value (None: not reported).
type DiskField = (
    &'static str,
    &'static str,
    Option<Unit>,
    fn(&diskstats::Disk) -> Option<f64>,
);

const SECTOR: f64 = 512.0;

const DISK_FIELDS: &[DiskField] = &[
    ("node_disk_reads_completed", "Reads completed", None, |d| {
        Some(d.reads[0] as f64)
    }),
    ("node_disk_reads_merged", "Reads merged", None, |d| {
        Some(d.reads[1] as f64)
    }),
    ("node_disk_read", "Bytes read", Some(Unit::Bytes), |d| {
        Some(d.reads[2] as f64 * SECTOR)
    }),
    (
        "node_disk_read_time",
        "Seconds spent by all reads",
        Some(Unit::Seconds),
        |d| Some(d.reads[3] as f64 / 1e3),
    ),
    (
        "node_disk_writes_completed",
        "Writes completed",
        None,
        |d| Some(d.writes[0] as f64),
    ),
    ("node_disk_writes_merged", "Writes merged", None, |d| {
        Some(d.writes[1] as f64)
    }),
    (
        "node_disk_written",
        "Bytes written",
        Some(Unit::Bytes),
        |d| Some(d.writes[2] as f64 * SECTOR),
    ),
    (
        "node_disk_write_time",
        "Seconds spent by all writes",
        Some(Unit::Seconds),
        |d| Some(d.writes[3] as f64 / 1e3),
    ),
    (
        "node_disk_io_time",
        "Seconds the device had I/O in flight (utilization)",
        Some(Unit::Seconds),
        |d| Some(d.io_ms as f64 / 1e3),
    ),
    (
        "node_disk_io_time_weighted",
        "Seconds of I/O weighted by I/Os in flight (queue; saturation)",
        Some(Unit::Seconds),
        |d| Some(d.weighted_ms as f64 / 1e3),
    ),
    (
        "node_disk_discards_completed",
        "Discards completed",
        None,
        |d| d.discards.map(|x| x[0] as f64),
    ),
    ("node_disk_discards_merged", "Discards merged", None, |d| {
        d.discards.map(|x| x[1] as f64)
    }),
    (
        "node_disk_discarded_sectors",
        "Sectors discarded",
        None,
        |d| d.discards.map(|x| x[2] as f64),
    ),
    (
        "node_disk_discard_time",
        "Seconds spent by all discards",
        Some(Unit::Seconds),
        |d| d.discards.map(|x| x[3] as f64 / 1e3),
    ),
    (
        "node_disk_flush_requests",
        "Flush requests completed",
        None,
        |d| d.flushes.map(|x| x[0] as f64),
    ),
    (
        "node_disk_flush_requests_time",
        "Seconds spent by all flush requests",
        Some(Unit::Seconds),
        |d| d.flushes.map(|x| x[1] as f64 / 1e3),
    ),
];

impl Source for Disk {
    fn name(&self) -> ReadingsSource {
        ReadingsSource::Disk
    }

    fn read(&mut self, out: &mut Vec<Family>, _: &Interval) -> Result<(), ReadError> {
        let mut errors = Vec::new();
        let text = crate::os::procfs::read_capped(
            &self.roots.proc.join("diskstats"),
            super::MAX_FILE_BYTES,
        )
        .map_err(|source| ReadError::File {
            path: "/proc/diskstats".into(),
            source,
        })?;
        let mut disks = diskstats::parse(&text)?;
        disks.retain(|d| {
            !self
                .opts
                .disk_exclude
                .as_ref()
                .is_some_and(|re| re.is_match(&d.name))
        });
        if disks.len() > self.opts.max_devices {
            self.opts.metrics.dropped(
                Cache::ReadingsDisks,
                (disks.len() - self.opts.max_devices) as u64,
            );
            disks.truncate(self.opts.max_devices);
        }
        for (name, help, unit, get) in DISK_FIELDS {
            let mut f = counter(name, help, unit.clone());
            for d in &disks {
                if let Some(v) = get(d) {
                    f.push(vec![("device", d.name.clone())], v);
                }
            }
            if !f.points.is_empty() {
                out.push(f);
            }
        }
        let mut now_f = gauge("node_disk_io_now", "I/Os in flight now", None);
        for d in &disks {
            now_f.push(vec![("device", d.name.clone())], d.in_flight as f64);
        }
        out.push(now_f);
        let now = Instant::now();
        let mut busiest: Option<f64> = None;
        let mut next = HashMap::with_capacity(disks.len());
        for d in &disks {
            if let Some((t, io)) = self.prev.get(&d.name) {
                if let Some(dt) = elapsed(now.duration_since(*t)) {
                    let u = d.io_ms.saturating_sub(*io) as f64 / 1e3 / dt;
                    busiest = Some(busiest.map_or(u, |b: f64| b.max(u)));
                }
            }
            next.insert(d.name.clone(), (now, d.io_ms));
        }
        self.prev = next;
        let saturation = self.psi.read(out, &mut errors);
        use_ratio(out, "disk", busiest, saturation);
        ReadError::collect(errors)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::readings::resources::network::Network;
    use std::fs;
    use std::path::Path;

    /// The value of the point of `name` whose labels include all of `labels`.
    pub(crate) fn value(out: &[Family], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        out.iter().filter(|f| f.name == name).find_map(|f| {
            f.points.iter().find_map(|p| {
                let all = labels
                    .iter()
                    .all(|(k, v)| p.labels.iter().any(|(pk, pv)| pk == k && pv == v));
                match (&p.value, all) {
                    (crate::readings::Value::Number(x), true) => Some(*x),
                    _ => None,
                }
            })
        })
    }

    fn write(root: &Path, rel: &str, text: &str) {
        let p = root.join(rel);
        fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        fs::write(p, text).expect("write");
    }

    fn roots(dir: &Path) -> Roots {
        Roots {
            proc: dir.join("proc"),
            proc_net: dir.join("proc/1/net"),
            sys: dir.join("sys"),
            cgroup: dir.join("cgroup"),
        }
    }

    fn opts(max_devices: usize) -> Options {
        let cfg = crate::config::Readings {
            max_devices,
            ..Default::default()
        };
        Options::from_config(&cfg, &crate::metrics::Metrics::new()).expect("default regexes")
    }

    #[test]
    fn cpu_utilization_from_two_readings() {
        let dir = tempfile::tempdir().expect("tempdir");
        let r = roots(dir.path());
        write(&r.proc, "stat", "cpu  100 0 100 800 0 0 0 0 0 0\ncpu0 100 0 100 800 0 0 0 0 0 0\nprocs_running 5\nprocs_blocked 0\n");
        write(&r.proc, "loadavg", "1.50 1.00 0.50 2/100 1234\n");
        let mut cpu = Cpu::new(r.clone());
        let mut out = Vec::new();
        cpu.read(&mut out, &Interval::default())
            .expect("first read");
        let tick = tick_seconds();
        assert_eq!(
            value(&out, "node_cpu", &[("cpu", "0"), ("mode", "idle")]),
            Some(800.0 * tick)
        );
        assert_eq!(value(&out, "node_load1", &[]), Some(1.5));
        assert_eq!(
            value(&out, "use_ratio", &[("kind", "utilization")]),
            None,
            "needs two readings"
        );
        // No PSI in this tree: saturation is runnable tasks beyond the CPU: (5 - 1 - 1) / 1.
        assert_eq!(
            value(&out, "use_ratio", &[("kind", "saturation")]),
            Some(1.0)
        );
        // 300 busy ticks of 400: 75 %.
        write(
            &r.proc,
            "stat",
            "cpu  250 0 250 900 0 0 0 0 0 0\ncpu0 250 0 250 900 0 0 0 0 0 0\nprocs_running 1\n",
        );
        let mut out = Vec::new();
        cpu.read(&mut out, &Interval::default())
            .expect("second read");
        assert_eq!(
            value(
                &out,
                "use_ratio",
                &[("resource", "cpu"), ("kind", "utilization")]
            ),
            Some(0.75)
        );
        assert_eq!(
            value(&out, "use_ratio", &[("kind", "saturation")]),
            Some(0.0)
        );
        // A malformed file is an error, not a panic, and the next good one reads again.
        write(&r.proc, "stat", "cpu 1 2\n");
        assert!(cpu
            .read(&mut Vec::new(), &Interval::default())
            .unwrap_err()
            .to_string()
            .contains("/proc/stat"));
    }

    #[test]
    fn cpu_saturation_from_psi() {
        let dir = tempfile::tempdir().expect("tempdir");
        let r = roots(dir.path());
        let stat = "cpu  1 0 1 8 0 0 0 0 0 0\ncpu0 1 0 1 8 0 0 0 0 0 0\nprocs_running 9\n";
        write(&r.proc, "stat", stat);
        write(
            &r.proc,
            "pressure/cpu",
            "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n",
        );
        let mut cpu = Cpu::new(r.clone());
        let mut out = Vec::new();
        cpu.read(&mut out, &Interval::default()).expect("reads");
        assert_eq!(
            value(&out, "use_ratio", &[("kind", "saturation")]),
            None,
            "with PSI, no fallback of another meaning on the first reading"
        );
        assert_eq!(value(&out, "node_pressure_cpu_waiting", &[]), Some(0.0));
        // 10 000 s of stall in a moment: clamped to 1.
        write(
            &r.proc,
            "pressure/cpu",
            "some avg10=0.00 avg60=0.00 avg300=0.00 total=10000000000\n",
        );
        let mut out = Vec::new();
        cpu.read(&mut out, &Interval::default()).expect("reads");
        assert_eq!(
            value(&out, "use_ratio", &[("kind", "saturation")]),
            Some(1.0)
        );
        assert_eq!(
            value(&out, "node_pressure_cpu_stalled", &[]),
            None,
            "no full line"
        );
    }

    #[test]
    fn memory_ratios_and_oom_errors() {
        let dir = tempfile::tempdir().expect("tempdir");
        let r = roots(dir.path());
        write(&r.proc, "meminfo", "MemTotal: 1000 kB\nMemFree: 100 kB\nMemAvailable: 250 kB\nActive(anon): 5 kB\nHugePages_Total: 3\n");
        write(&r.proc, "vmstat", "pgmajfault 7\noom_kill 2\n");
        write(&r.proc, "pressure/memory", "some avg10=0.00 avg60=0.00 avg300=0.00 total=100\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=50\n");
        let mut m = Memory::new(r.clone());
        let mut out = Vec::new();
        m.read(&mut out, &Interval::default()).expect("reads");
        assert_eq!(
            value(&out, "node_memory_MemAvailable", &[]),
            Some(256_000.0)
        );
        assert_eq!(value(&out, "node_memory_Active_anon", &[]), Some(5120.0));
        assert_eq!(value(&out, "node_memory_HugePages_Total", &[]), Some(3.0));
        assert_eq!(value(&out, "node_vmstat_pgmajfault", &[]), Some(7.0));
        assert_eq!(
            value(&out, "use_errors", &[("resource", "memory")]),
            Some(2.0)
        );
        assert_eq!(
            value(&out, "use_ratio", &[("kind", "utilization")]),
            Some(0.75)
        );
        assert_eq!(
            value(&out, "node_pressure_memory_stalled", &[]),
            Some(50e-6)
        );
        // Bad PSI text: the rest is still reported, the error is returned.
        write(&r.proc, "pressure/memory", "some avg10=0.00\n");
        let mut out = Vec::new();
        assert!(m
            .read(&mut out, &Interval::default())
            .unwrap_err()
            .to_string()
            .contains("pressure"));
        assert_eq!(value(&out, "node_memory_MemTotal", &[]), Some(1_024_000.0));
    }

    #[test]
    fn disks_are_filtered_capped_and_rated() {
        let dir = tempfile::tempdir().expect("tempdir");
        let r = roots(dir.path());
        let line = |name: &str, io: u64| format!(" 8 0 {name} 10 0 8 5 20 0 16 7 0 {io} 30\n");
        write(
            &r.proc,
            "diskstats",
            &(line("sda", 0) + &line("sda1", 0) + &line("loop0", 0)),
        );
        let metrics = crate::metrics::Metrics::new();
        let mut o = opts(8);
        o.metrics = metrics.clone();
        let mut d = Disk::new(r.clone(), o);
        let mut out = Vec::new();
        d.read(&mut out, &Interval::default()).expect("reads");
        assert_eq!(
            value(&out, "node_disk_read", &[("device", "sda")]),
            Some(4096.0)
        );
        assert_eq!(
            value(&out, "node_disk_read", &[("device", "sda1")]),
            None,
            "partition excluded"
        );
        assert_eq!(
            value(&out, "node_disk_read", &[("device", "loop0")]),
            None,
            "loop excluded"
        );
        assert_eq!(
            value(&out, "node_disk_discards_completed", &[]),
            None,
            "14 fields: no discards"
        );
        // 100 s of io time in a moment: the ratio is clamped to 1.
        write(&r.proc, "diskstats", &line("sda", 100_000));
        let mut out = Vec::new();
        d.read(&mut out, &Interval::default()).expect("reads");
        assert_eq!(
            value(
                &out,
                "use_ratio",
                &[("resource", "disk"), ("kind", "utilization")]
            ),
            Some(1.0)
        );
        assert_eq!(
            value(&out, "node_disk_io_time", &[("device", "sda")]),
            Some(100.0)
        );
        // The device cap: two devices, one reported, one counted as dropped.
        let mut o = opts(1);
        o.metrics = metrics.clone();
        let mut d = Disk::new(r.clone(), o);
        write(&r.proc, "diskstats", &(line("sda", 0) + &line("sdb", 0)));
        let mut out = Vec::new();
        d.read(&mut out, &Interval::default()).expect("reads");
        assert_eq!(
            out.iter()
                .find(|f| f.name == "node_disk_read")
                .map(|f| f.points.len()),
            Some(1)
        );
        assert!(metrics
            .encode()
            .contains("ember_cache_dropped_total{cache=\"readings_disks\"} 1"));
    }

    #[test]
    fn network_speed_drops_errors_and_retransmits() {
        let dir = tempfile::tempdir().expect("tempdir");
        let r = roots(dir.path());
        let hdr = "Inter-|   Receive |  Transmit\n face |bytes|bytes\n";
        write(&r.proc_net, "dev", &format!("{hdr}  eth0: 0 0 1 0 0 0 0 0 0 0 2 0 0 0 0 0\n    lo: 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n"));
        write(&r.proc_net, "snmp", include_str!("testdata/snmp-6.1"));
        write(&r.sys, "class/net/eth0/speed", "1000\n");
        let mut n = Network::new(r.clone(), opts(8));
        let mut out = Vec::new();
        n.read(&mut out, &Interval::default()).expect("reads");
        assert_eq!(
            value(&out, "node_network_speed", &[("device", "eth0")]),
            Some(125e6)
        );
        assert_eq!(value(&out, "node_network_speed", &[("device", "lo")]), None);
        assert_eq!(
            value(&out, "node_netstat_Tcp_RetransSegs", &[]),
            Some(4321.0)
        );
        assert_eq!(
            value(&out, "use_errors", &[("resource", "network")]),
            Some(3.0)
        );
        // 100 packets, 5 dropped and 5 overrun; 10 GB received in a moment (clamped to 1).
        write(&r.proc_net, "dev", &format!("{hdr}  eth0: 10000000000 100 1 5 5 0 0 0 0 0 2 0 0 0 0 0\n    lo: 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n"));
        let mut out = Vec::new();
        n.read(&mut out, &Interval::default()).expect("reads");
        assert_eq!(
            value(
                &out,
                "use_ratio",
                &[("resource", "network"), ("kind", "saturation")]
            ),
            Some(0.1)
        );
        assert_eq!(
            value(
                &out,
                "use_ratio",
                &[("resource", "network"), ("kind", "utilization")]
            ),
            Some(1.0)
        );
        assert_eq!(
            value(&out, "node_network_receive", &[("device", "eth0")]),
            Some(1e10)
        );
        write(&r.proc_net, "dev", "garbage\n");
        assert!(n.read(&mut Vec::new(), &Interval::default()).is_err());
    }
}
