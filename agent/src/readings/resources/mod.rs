//! USE readings (utilization, saturation, errors) of the host and of every container, read
//! from `/proc` and the cgroup filesystems by the [`crate::readings`] collector thread.
//!
//! One private module per file format, each a pure parser that turns text into a typed
//! struct or a [`ParseError`] (never a panic); the [`host`] and [`containers`] sources read
//! the files, keep the previous reading, and turn both into families named as node_exporter
//! and cAdvisor name them (with the `ember_` prefix), plus the `use_ratio` and `use_errors`
//! summaries that let one alert rule cover a resource.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::readings::{ReadError, Source};

mod containers;
mod host;
mod network;

mod cgroupfs;
mod diskstats;
mod loadavg;
mod meminfo;
mod netdev;
mod pressure;
mod snmp;
mod stat;

/// Most bytes read from one file: `/proc/stat` on a 1024-CPU machine is ~150 KiB; the cap
/// bounds memory whatever a file holds.
pub const MAX_FILE_BYTES: u64 = 4 << 20;

/// Why a file's text was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}: {message}")]
pub struct ParseError {
    /// Which format (`/proc/stat`, `cpu.stat`, ...).
    pub file: &'static str,
    /// What is wrong, naming the line when there is one.
    pub message: String,
}

impl ParseError {
    fn new(file: &'static str, message: impl Into<String>) -> Self {
        Self {
            file,
            message: message.into(),
        }
    }
}

/// Parses one unsigned decimal field, naming `what` in the error.
fn number(file: &'static str, what: &str, s: &str) -> Result<u64, ParseError> {
    s.parse()
        .map_err(|_| ParseError::new(file, format!("{what}: {s:?} is not a number")))
}

/// Reads a file (capped at [`MAX_FILE_BYTES`]); `Ok(None)` when it does not exist, which for
/// optional files (PSI off, an old kernel, a controller not mounted) is not an error.
fn read_optional(path: &Path) -> Result<Option<String>, ReadError> {
    match crate::os::procfs::read_capped(path, MAX_FILE_BYTES) {
        Ok(t) => Ok(Some(t)),
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::Unsupported
            ) || e.raw_os_error() == Some(libc::EOPNOTSUPP) =>
        {
            Ok(None)
        }
        Err(source) => Err(ReadError::File {
            path: path.to_owned(),
            source,
        }),
    }
}

/// Where the sources read from, so tests can point them at fixture trees.
#[derive(Debug, Clone)]
pub struct Roots {
    /// procfs of the host (`/proc`).
    pub proc: PathBuf,
    /// The host's network statistics: `/proc/1/net` (the init process's network
    /// namespace, which is the host's when ember runs with `hostPID` but not `hostNetwork`).
    pub proc_net: PathBuf,
    /// sysfs (`/sys`), for link speeds.
    pub sys: PathBuf,
    /// The cgroup filesystems (`/sys/fs/cgroup`).
    pub cgroup: PathBuf,
}

impl Default for Roots {
    fn default() -> Self {
        Self {
            proc: PathBuf::from("/proc"),
            proc_net: PathBuf::from("/proc/1/net"),
            sys: PathBuf::from("/sys"),
            cgroup: PathBuf::from("/sys/fs/cgroup"),
        }
    }
}

/// The USE sources the `readings` config enables: CPU, memory, disk, network of the host,
/// then the containers (named by `meta` when the pod watch runs).
pub fn sources(
    cfg: &crate::config::Readings,
    meta: Option<crate::workload::kube::Metadata>,
    metrics: &crate::metrics::Metrics,
) -> Result<Vec<Box<dyn Source>>, regex::Error> {
    let roots = Roots::default();
    let mut out: Vec<Box<dyn Source>> = Vec::new();
    if cfg.host {
        let opts = host::Options::from_config(cfg, metrics)?;
        out.push(Box::new(host::Cpu::new(roots.clone())));
        out.push(Box::new(host::Memory::new(roots.clone())));
        out.push(Box::new(host::Disk::new(roots.clone(), opts.clone())));
        out.push(Box::new(network::Network::new(roots.clone(), opts)));
    }
    if cfg.containers {
        out.push(Box::new(containers::Containers::new(
            roots,
            meta,
            cfg.max_containers,
            metrics.clone(),
        )));
    }
    Ok(out)
}

/// Seconds between two readings, for rates; `None` when the clock did not advance.
fn elapsed(d: Duration) -> Option<f64> {
    let s = d.as_secs_f64();
    (s > 0.0).then_some(s)
}

#[cfg(test)]
mod tests {
    //! Files copied from a real 6.18 kernel (a hybrid cgroup host, 2 CPUs, one virtio disk).

    use super::*;

    #[test]
    fn real_kernel_6_18_files_parse() {
        let s = stat::parse(include_str!("testdata/stat-6.18")).expect("stat");
        assert_eq!(s.cpus.len(), 2);
        assert!(s.all.guest[1].is_some(), "10 columns");
        assert_eq!(
            s.all.total(),
            s.cpus.iter().map(|(_, t)| t.total()).sum::<u64>(),
            "the cpu line is the sum of the cpuN lines"
        );
        let d = diskstats::parse(include_str!("testdata/diskstats-6.18")).expect("diskstats");
        assert!(d.iter().all(|d| d.flushes.is_some()), "20 fields");
        let n = netdev::parse(include_str!("testdata/netdev-6.18")).expect("net/dev");
        assert!(n.iter().any(|i| i.name == "lo"));
        let c = snmp::parse(include_str!("testdata/snmp-6.18")).expect("snmp");
        assert!(snmp::get(&c, "Tcp", "RetransSegs").is_some());
        let p = pressure::parse(include_str!("testdata/pressure-memory-6.18")).expect("psi");
        assert!(p.full_us.is_some());
        let m = meminfo::parse_meminfo(include_str!("testdata/meminfo-6.18")).expect("meminfo");
        assert!(m.iter().any(|e| e.key == "MemAvailable" && e.bytes));
        let v = meminfo::parse_vmstat(include_str!("testdata/vmstat-6.18")).expect("vmstat");
        assert!(meminfo::get(&v, "oom_kill").is_some());
        let v1 = cgroupfs::keyed("cpu.stat", include_str!("testdata/cgroup-v1-cpu.stat-6.18"))
            .expect("v1 cpu.stat");
        assert_eq!(
            cgroupfs::throttling(&v1),
            Some(cgroupfs::Throttling::default()),
            "the root has no quota: zero, but present"
        );
        let v2 = cgroupfs::keyed("cpu.stat", include_str!("testdata/cgroup-v2-cpu.stat-6.18"))
            .expect("v2 cpu.stat");
        assert_eq!(
            cgroupfs::throttling(&v2),
            None,
            "v2 without the cpu controller (hybrid host)"
        );
    }
}
