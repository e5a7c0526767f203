//! The loaded BPF object ([`Sampler`]): its maps sized from the settings, the sampling
//! program attached to each online CPU's perf event (and the exec and off-CPU hooks), and
//! the aggregator's deny orders written to its maps.

use std::collections::BTreeMap;
use std::mem::MaybeUninit;

use libbpf_rs::libbpf_sys;
use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{Link, MapCore, MapFlags, OpenObject};
use tracing::{info, warn};

use std::os::fd::{AsFd, AsRawFd};

use libbpf_rs::skel::Skel;

use super::features::{
    kernel_release, Culprit, Feature, LoadLog, LoadReport, Parsed, ProgramStat, LOG_STATS,
    MAX_ATTEMPTS,
};
use super::plan::{OffPath, Plan, Probes, Walker};
use super::record::sample_threshold;
use super::skel::{self, EmberSkelBuilder};
use super::unwind::UnwindMaps;
use super::{CaptureError, Control, CGROUP_DENY_ENTRIES};
use crate::config::{OffCpu as OffCpuSettings, SampleEvent, Sampling, UnwindMode};
use crate::metrics::Metrics;

/// The loaded BPF object and one perf event link per sampled CPU.
pub(super) struct Sampler<'obj> {
    pub(super) skel: skel::EmberSkel<'obj>,
    pub(super) links: BTreeMap<u32, Link>,
    /// `ember_exec` on sched_process_exec, when unwinding by tables with kernel BTF.
    exec: Option<Link>,
    /// `ember_fork` on sched_process_fork, for `sampling.subprocesses` (held to stay attached).
    _forks: Option<Link>,
    /// The off-CPU programs on sched_switch, sched_waking, rseq_update, sys_exit and the
    /// lock contention tracepoints (`offcpu.enabled`).
    pub(super) offcpu_links: Vec<Link>,
    /// `offcpu.locks` asked for kernel lock contention and the kernel has no
    /// lock:contention_begin/end (counted once by capture).
    pub(super) klocks_unsupported: bool,
    event: SampleEvent,
    /// Features whose hooks failed to attach after the object loaded, and why.
    attach_errors: BTreeMap<Feature, String>,
    /// The table walker loaded (and its slot is set): the unwind loader has maps to fill.
    tables: bool,
    /// The sampler loaded is `ember_sample_walk` (the walker's first run), not `ember_sample`.
    walks: bool,
}

impl Sampler<'static> {
    /// Loads the object by a [`Plan`]: what the settings ask, less what the kernel lacks;
    /// a part the kernel refuses is stepped down and the load tried again (see
    /// `features.rs`). Fails only when the sampler itself cannot load.
    pub(super) fn load(
        settings: &Sampling,
        offcpu: &OffCpuSettings,
    ) -> Result<(Self, LoadReport), CaptureError> {
        let probes = probe_kernel();
        let mut plan = Plan::new(settings, offcpu, probes);
        let kernel = kernel_release();
        let mut refused: BTreeMap<String, (String, Option<u64>)> = BTreeMap::new();
        for attempt in 0..MAX_ATTEMPTS {
            // Each attempt opens the object afresh; a failed one is closed with its skeleton.
            // The box (one pointer) outlives it: the loaded object lives as long as the agent.
            let object = Box::leak(Box::new(MaybeUninit::<OpenObject>::uninit()));
            let open = open_with(settings, offcpu, &plan, object)?;
            let log = LoadLog::start();
            let loaded = open.load();
            let parsed = log.take();
            let e = match loaded {
                Ok(skel) => {
                    let sampler = Self::start(skel, settings, offcpu, &plan)?;
                    let report = sampler.report(&plan, parsed, refused, kernel, attempt as u32);
                    return Ok((sampler, report));
                }
                Err(e) => e,
            };
            let Some(culprit) = parsed.failed else {
                return Err(CaptureError::Load(e));
            };
            let line = parsed.last_line.unwrap_or_else(|| e.to_string());
            if let Culprit::Program(p) = &culprit {
                refused.insert(p.clone(), (line.clone(), parsed.insns.get(p).copied()));
            }
            if !plan.step_down(&culprit, &line) {
                return Err(CaptureError::Refused {
                    part: culprit.to_string(),
                    kernel,
                    line,
                });
            }
            warn!("kernel {kernel} refused {culprit} ({line}): loading again without it");
        }
        Err(CaptureError::Refused {
            part: "the BPF object".into(),
            kernel,
            line: format!("still refused after {MAX_ATTEMPTS} loads"),
        })
    }

    /// Attaches the loaded object's hooks as the plan says; a hook that fails to attach
    /// turns its feature off (noted in `attach_errors`).
    fn start(
        skel: skel::EmberSkel<'static>,
        settings: &Sampling,
        offcpu: &OffCpuSettings,
        plan: &Plan,
    ) -> Result<Self, CaptureError> {
        for pid in &settings.pids {
            skel.maps
                .pid_filter
                .update(&pid.to_ne_bytes(), &[1u8], MapFlags::ANY)
                .map_err(CaptureError::Load)?;
        }
        let mut attach_errors = BTreeMap::new();
        if matches!(plan.walker, Walker::Tables { .. }) {
            // The sampler tail-calls the walker through slot 0; empty, it keeps frame pointers.
            let fd = skel.progs.ember_walk.as_fd().as_raw_fd();
            if let Err(e) =
                skel.maps
                    .walk_progs
                    .update(&0u32.to_ne_bytes(), &fd.to_ne_bytes(), MapFlags::ANY)
            {
                attach_errors.insert(Feature::UnwindTables, format!("walk_progs: {e}"));
            }
        }
        let exec = if plan.exec {
            match skel.progs.ember_exec.attach() {
                Ok(link) => Some(link),
                Err(e) => {
                    attach_errors.insert(Feature::ExecTracking, e.to_string());
                    None
                }
            }
        } else {
            None
        };
        let forks = if plan.forks {
            match skel.progs.ember_fork.attach() {
                Ok(link) => Some(link),
                Err(e) => {
                    attach_errors.insert(Feature::Subprocesses, e.to_string());
                    None
                }
            }
        } else {
            None
        };
        let mut offcpu_links = Vec::new();
        if let Some(path) = plan.offcpu {
            let (rseq, exit) = match path {
                OffPath::Hooks { rseq, exit } => (rseq, exit),
                _ => (false, false),
            };
            // The hooks of a thread's return first: a record waiting for one always finds it.
            for (prog, on, feature) in [
                (&skel.progs.ember_offcpu_exit, exit, Feature::OffCpu),
                (&skel.progs.ember_offcpu_rseq, rseq, Feature::OffCpu),
                (&skel.progs.ember_offcpu_switch, true, Feature::OffCpu),
                (
                    &skel.progs.ember_offcpu_waking,
                    plan.wakers,
                    Feature::Wakers,
                ),
                (
                    &skel.progs.ember_offcpu_lock_begin,
                    plan.klocks,
                    Feature::KernelLocks,
                ),
                (
                    &skel.progs.ember_offcpu_lock_end,
                    plan.klocks,
                    Feature::KernelLocks,
                ),
            ] {
                if on && !attach_errors.contains_key(&feature) {
                    match prog.attach() {
                        Ok(link) => offcpu_links.push(link),
                        Err(e) => {
                            attach_errors
                                .insert(feature, format!("{}: {e}", prog.name().to_string_lossy()));
                        }
                    }
                }
            }
            if attach_errors.contains_key(&Feature::OffCpu) {
                // Half of off-CPU's hooks would leave records nobody finishes.
                offcpu_links.clear();
            }
        }
        Ok(Self {
            skel,
            links: BTreeMap::new(),
            exec,
            _forks: forks,
            offcpu_links,
            klocks_unsupported: offcpu.enabled && offcpu.locks && !plan.klocks,
            event: settings.event,
            tables: matches!(plan.walker, Walker::Tables { .. })
                && !attach_errors.contains_key(&Feature::UnwindTables),
            walks: matches!(plan.walker, Walker::Tables { .. }),
            attach_errors,
        })
    }

    /// What this load found: every feature's state, every program's verifier cost.
    fn report(
        &self,
        plan: &Plan,
        parsed: Parsed,
        refused: BTreeMap<String, (String, Option<u64>)>,
        kernel: String,
        retries: u32,
    ) -> LoadReport {
        let mut programs: Vec<ProgramStat> = self
            .skel
            .object()
            .progs()
            .filter(|p| p.autoload())
            .map(|p| {
                let name = p.name().to_string_lossy().into_owned();
                ProgramStat {
                    verified_insns: parsed.insns.get(&name).copied(),
                    loaded: true,
                    error: None,
                    name,
                }
            })
            .collect();
        for (name, (line, insns)) in refused {
            if let Some(p) = programs.iter_mut().find(|p| p.name == name) {
                p.error = Some(line);
            } else {
                programs.push(ProgramStat {
                    name,
                    loaded: false,
                    verified_insns: insns,
                    error: Some(line),
                });
            }
        }
        LoadReport {
            kernel,
            features: plan.report(&self.attach_errors),
            programs,
            retries,
        }
    }
}

impl Sampler<'_> {
    /// Handles on the unwind maps for the loader (none when only frame pointers are used).
    pub(super) fn unwind_maps(&self) -> Result<Option<UnwindMaps>, CaptureError> {
        if !self.tables {
            return Ok(None);
        }
        let maps = &self.skel.maps;
        Ok(Some(UnwindMaps {
            tables: libbpf_rs::MapHandle::try_from(&maps.unwind_tables)
                .map_err(CaptureError::Load)?,
            procs: libbpf_rs::MapHandle::try_from(&maps.unwind_procs)
                .map_err(CaptureError::Load)?,
            used: libbpf_rs::MapHandle::try_from(&maps.unwind_used).map_err(CaptureError::Load)?,
            files: libbpf_rs::MapHandle::try_from(&maps.unwind_files)
                .map_err(CaptureError::Load)?,
            row_cache: libbpf_rs::MapHandle::try_from(&maps.row_cache)
                .map_err(CaptureError::Load)?,
            py_procs: libbpf_rs::MapHandle::try_from(&maps.py_procs).map_err(CaptureError::Load)?,
            exec_hook: self.exec.is_some(),
        }))
    }

    /// Applies an order to the deny maps. A failed update (a full map) leaves a workload
    /// sampled and dropped in userspace (never a loss); the caller counts it.
    pub(super) fn apply(&mut self, order: Control) -> Result<(), libbpf_rs::Error> {
        if matches!(order, Control::DenyPid(_) | Control::DenyCgroup(_)) {
            self.deny_used()?;
        }
        let maps = &self.skel.maps;
        match order {
            Control::DenyPid(pid) => maps
                .pid_deny
                .update(&pid.to_ne_bytes(), &[1], MapFlags::ANY),
            Control::AllowPid(pid) => maps.pid_deny.delete(&pid.to_ne_bytes()),
            Control::DenyCgroup(id) => {
                maps.cgroup_deny
                    .update(&id.to_ne_bytes(), &[1], MapFlags::ANY)
            }
            Control::AllowCgroup(id) => maps.cgroup_deny.delete(&id.to_ne_bytes()),
        }
    }

    /// Tells the programs the deny maps are in use (`ember_deny_used`): until then they skip
    /// the lookups. Set before the first entry goes in, never cleared.
    fn deny_used(&mut self) -> Result<(), libbpf_rs::Error> {
        let Some(bss) = self.skel.maps.bss_data.as_deref_mut() else {
            return Err(libbpf_rs::Error::from(std::io::Error::other(
                "no mmapped .bss to flag the deny maps in",
            )));
        };
        // SAFETY: a plain u32 of the mmapped .bss, which the programs only read.
        unsafe { std::ptr::write_volatile(&mut bss.ember_deny_used, 1) };
        Ok(())
    }

    /// Attaches to CPUs that came online and lets go of CPUs that went away.
    pub(super) fn sync_cpus(
        &mut self,
        settings: &Sampling,
        metrics: &Metrics,
    ) -> Result<(), CaptureError> {
        let online = crate::os::procfs::online_cpus().ok_or(CaptureError::Cpus)?;
        self.links.retain(|cpu, _| online.contains(cpu));
        let mut last_err = None;
        for cpu in online {
            if self.links.contains_key(&cpu) {
                continue;
            }
            match self.attach(cpu, settings.frequency_hz) {
                Ok(link) => {
                    self.links.insert(cpu, link);
                }
                Err(e) => last_err = Some(format!("cpu {cpu}: {e}")),
            }
        }
        metrics.cpus_sampled.set(self.links.len() as i64);
        match (self.links.is_empty(), last_err) {
            (true, Some(e)) => Err(CaptureError::Attach(e)),
            (false, Some(e)) => {
                warn!("some CPUs are not sampled: {e}");
                Ok(())
            }
            _ => Ok(()),
        }
    }

    fn attach(&mut self, cpu: u32, hz: u64) -> std::io::Result<Link> {
        let fd = match open_perf_event(cpu, self.event, hz) {
            Ok(fd) => fd,
            Err(e) if self.event == SampleEvent::Cycles => {
                info!(
                    "hardware cycles are not available here ({e}); sampling on cpu-clock instead"
                );
                self.event = SampleEvent::CpuClock;
                open_perf_event(cpu, self.event, hz)?
            }
            Err(e) => return Err(e),
        };
        let prog = if self.walks {
            &self.skel.progs.ember_sample_walk
        } else {
            &self.skel.progs.ember_sample
        };
        match prog.attach_perf_event(fd) {
            Ok(link) => Ok(link), // the link now owns the perf fd
            Err(e) => {
                // SAFETY: fd was returned by perf_event_open above and is owned by nobody else.
                unsafe { libc::close(fd) };
                Err(std::io::Error::other(e.to_string()))
            }
        }
    }
}

/// Opens the object and writes the plan into it before load: its rodata, which programs
/// load (each with the verifier's statistics), and its maps' sizes (minimal for a part
/// that is off).
fn open_with(
    settings: &Sampling,
    offcpu: &OffCpuSettings,
    plan: &Plan,
    object: &'static mut MaybeUninit<OpenObject>,
) -> Result<skel::OpenEmberSkel<'static>, CaptureError> {
    let mut open = EmberSkelBuilder::default()
        .open(object)
        .map_err(CaptureError::Load)?;
    let tables = matches!(plan.walker, Walker::Tables { .. });
    let (task_work, rseq, exit) = match plan.offcpu {
        Some(OffPath::TaskWork) => (true, false, false),
        Some(OffPath::Hooks { rseq, exit }) => (false, rseq, exit),
        _ => (false, false, false),
    };
    if let Some(rodata) = open.maps.rodata_data.as_deref_mut() {
        let cfg = &mut rodata.ember_cfg;
        cfg.filter_pids = u32::from(!settings.pids.is_empty());
        cfg.include_idle = u32::from(settings.include_idle);
        cfg.wakeup_bytes = u64::from(settings.ring_buffer_bytes / 4);
        cfg.unwind_mode = match (tables, settings.unwind) {
            (false, _) | (_, UnwindMode::FramePointer) => 0,
            (true, UnwindMode::Auto) => 1,
            (true, UnwindMode::Dwarf) => 2,
        };
        cfg.task_regs = u32::from(plan.task_regs);
        cfg.follow_forks = u32::from(plan.forks);
        rodata.ember_walk_no_python = u32::from(plan.walker != (Walker::Tables { python: true }));
        let cfg = &mut rodata.ember_offcpu_cfg;
        cfg.min_block_ns = u64::try_from(offcpu.min_block.as_nanos()).unwrap_or(u64::MAX);
        cfg.sample_threshold = sample_threshold(offcpu.sample_rate);
        cfg.fallback_threshold = sample_threshold(offcpu.fallback_rate);
        cfg.syscall_exit = u32::from(exit);
        cfg.max_tasks = offcpu.max_tasks;
        cfg.rseq = u32::from(rseq);
        cfg.wakers = u32::from(plan.wakers && offcpu.wakers);
        cfg.klocks = u32::from(plan.klocks);
        // The kernel's tgid, as the programs read it: ember runs in the host's pid namespace.
        cfg.self_tgid = std::process::id();
        cfg.kernel_threads = u32::from(offcpu.kernel_threads);
        cfg.task_work = u32::from(task_work);
    }
    let on = plan.offcpu.is_some();
    for mut prog in open.open_object_mut().progs_mut() {
        prog.set_log_level(LOG_STATS);
        let load = match prog.name().to_str().unwrap_or_default() {
            // One sampler: with the walker's first run, or by frame pointers alone.
            "ember_sample" => !tables,
            "ember_sample_walk" | "ember_walk" => tables,
            "ember_exec" => plan.exec,
            "ember_fork" => plan.forks,
            "ember_offcpu_switch" => on,
            "ember_offcpu_waking" => on && plan.wakers,
            "ember_offcpu_lock_begin" | "ember_offcpu_lock_end" => on && plan.klocks,
            "ember_offcpu_exit" => on && exit,
            "ember_offcpu_rseq" => on && rseq,
            _ => false,
        };
        prog.set_autoload(load);
    }
    // A part that is off creates no maps: a kernel without task storage loads the rest.
    for mut map in open.open_object_mut().maps_mut() {
        let name = map.name().to_string_lossy();
        if name.starts_with("offcpu_") && !on {
            map.set_autocreate(false).map_err(CaptureError::Load)?;
        }
    }
    let maps = &mut open.maps;
    // Without the walker its hashes are named but unused: one preallocated entry each.
    if !tables || plan.prealloc {
        for map in [
            &mut maps.unwind_procs,
            &mut maps.py_procs,
            &mut maps.unwind_files,
        ] {
            map.set_map_flags(0).map_err(CaptureError::Load)?;
        }
    }
    let procs = if tables {
        settings.unwind_max_processes
    } else {
        1
    };
    maps.samples
        .set_max_entries(settings.ring_buffer_bytes)
        .map_err(CaptureError::Load)?;
    maps.unwind_procs
        .set_max_entries(procs)
        .map_err(CaptureError::Load)?;
    maps.py_procs
        .set_max_entries(procs)
        .map_err(CaptureError::Load)?;
    if !tables {
        maps.unwind_files
            .set_max_entries(1)
            .map_err(CaptureError::Load)?;
    }
    maps.cgroup_deny
        .set_max_entries(CGROUP_DENY_ENTRIES)
        .map_err(CaptureError::Load)?;
    if on {
        maps.offcpu_threads
            .set_max_entries(offcpu.max_threads)
            .map_err(CaptureError::Load)?;
        maps.offcpu_samples
            .set_max_entries(offcpu.ring_buffer_bytes)
            .map_err(CaptureError::Load)?;
        maps.offcpu_sums
            .set_max_entries(offcpu.max_stacks)
            .map_err(CaptureError::Load)?;
    }
    // The walker's row caches, per CPU: the sampler's, and off-CPU's when it is on.
    maps.row_cache
        .set_max_entries(if on { 2 } else { 1 })
        .map_err(CaptureError::Load)?;
    Ok(open)
}

/// What the kernel has, asked before the first load.
fn probe_kernel() -> Probes {
    use libbpf_rs::{MapType, ProgramType};
    let btf = kernel_btf();
    Probes {
        btf,
        task_storage: MapType::TaskStorage.is_supported().unwrap_or(false),
        // The lock tracepoints exist since 5.19: a program on a missing one fails the load.
        lock_tracepoints: btf && kernel_has("btf_trace_contention_begin"),
        // BPF task works (6.18; bpf_preempt_disable is 6.10).
        task_work: btf
            && kernel_has("bpf_task_work_schedule_resume_impl")
            && kernel_has("bpf_preempt_disable"),
        bpf_loop: ProgramType::PerfEvent
            .is_helper_supported(libbpf_sys::BPF_FUNC_loop)
            .unwrap_or(false),
        task_work_silent: !super::plan::task_work_runs(&kernel_release()),
        task_regs: [
            libbpf_sys::BPF_FUNC_get_current_task_btf,
            libbpf_sys::BPF_FUNC_task_pt_regs,
        ]
        .into_iter()
        .all(|f| {
            ProgramType::PerfEvent
                .is_helper_supported(f)
                .unwrap_or(false)
        }),
        probe_read_bug: {
            let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
            let signature = read("/proc/version_signature");
            super::plan::probe_read_bug(&super::plan::upstream_version(
                &kernel_release(),
                &read("/proc/sys/kernel/version"),
                Some(signature.trim()).filter(|s| !s.is_empty()),
            ))
        },
    }
}

fn open_perf_event(cpu: u32, event: SampleEvent, hz: u64) -> std::io::Result<i32> {
    // SAFETY: perf_event_attr is a plain C struct for which all-zero is a valid value.
    let mut attr: libbpf_sys::perf_event_attr = unsafe { std::mem::zeroed() };
    attr.size = std::mem::size_of::<libbpf_sys::perf_event_attr>() as u32;
    (attr.type_, attr.config) = match event {
        SampleEvent::CpuClock => (
            libbpf_sys::PERF_TYPE_SOFTWARE,
            libbpf_sys::PERF_COUNT_SW_CPU_CLOCK as u64,
        ),
        SampleEvent::Cycles => (
            libbpf_sys::PERF_TYPE_HARDWARE,
            libbpf_sys::PERF_COUNT_HW_CPU_CYCLES as u64,
        ),
    };
    attr.__bindgen_anon_1.sample_freq = hz;
    attr.set_freq(1);
    crate::os::perf_event::open(&attr, cpu, None).map(std::os::fd::IntoRawFd::into_raw_fd)
}

/// Kernel BTF, which typed tracepoints, `bpf_task_pt_regs` and CO-RE field reads need.
fn kernel_btf() -> bool {
    std::path::Path::new("/sys/kernel/btf/vmlinux").exists()
}

/// Whether the kernel's BTF names the type `name` (a tracepoint `btf_trace_<event>`).
fn kernel_has(name: &str) -> bool {
    libbpf_rs::btf::Btf::from_vmlinux().is_ok_and(|btf| {
        btf.type_by_name::<libbpf_rs::btf::BtfType<'_>>(name)
            .is_some()
    })
}
