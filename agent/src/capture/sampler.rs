//! The loaded BPF object ([`Sampler`]): its maps sized from the settings, the sampling
//! program attached to each online CPU's perf event (and the exec and off-CPU hooks), and
//! the aggregator's deny orders written to its maps.

use std::collections::BTreeMap;
use std::mem::MaybeUninit;

use libbpf_rs::libbpf_sys;
use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{Link, MapCore, MapFlags, OpenObject};
use tracing::{info, warn};

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
    /// The off-CPU programs on sched_switch, sched_waking, rseq_update, sys_exit and the
    /// lock contention tracepoints (`offcpu.enabled`).
    pub(super) offcpu_links: Vec<Link>,
    /// `offcpu.locks` asked for kernel lock contention and the kernel has no
    /// lock:contention_begin/end (counted once by capture).
    pub(super) klocks_unsupported: bool,
    event: SampleEvent,
}

impl<'obj> Sampler<'obj> {
    pub(super) fn load(
        settings: &Sampling,
        offcpu: &OffCpuSettings,
        object: &'obj mut MaybeUninit<OpenObject>,
    ) -> Result<Self, CaptureError> {
        let mut open = EmberSkelBuilder::default()
            .open(object)
            .map_err(CaptureError::Load)?;
        if let Some(rodata) = open.maps.rodata_data.as_deref_mut() {
            rodata.ember_cfg.filter_pids = u32::from(!settings.pids.is_empty());
            rodata.ember_cfg.include_idle = u32::from(settings.include_idle);
            rodata.ember_cfg.wakeup_bytes = u64::from(settings.ring_buffer_bytes / 4);
            rodata.ember_cfg.unwind_mode = match settings.unwind {
                UnwindMode::FramePointer => 0,
                UnwindMode::Auto => 1,
                UnwindMode::Dwarf => 2,
            };
            rodata.ember_cfg.task_regs = u32::from(kernel_btf());
        }
        let OffCpuPlan {
            on: offcpu_on,
            klocks,
            task_work,
        } = prepare_offcpu(&mut open, offcpu)?;
        // The exec hook is a BTF tracepoint: without kernel BTF it would fail the whole load.
        let exec_hook = settings.unwind != UnwindMode::FramePointer && kernel_btf();
        open.progs.ember_exec.set_autoload(exec_hook);
        open.maps
            .samples
            .set_max_entries(settings.ring_buffer_bytes)
            .map_err(CaptureError::Load)?;
        open.maps
            .unwind_procs
            .set_max_entries(settings.unwind_max_processes)
            .map_err(CaptureError::Load)?;
        open.maps
            .py_procs
            .set_max_entries(settings.unwind_max_processes)
            .map_err(CaptureError::Load)?;
        open.maps
            .cgroup_deny
            .set_max_entries(CGROUP_DENY_ENTRIES)
            .map_err(CaptureError::Load)?;
        let skel = open.load().map_err(CaptureError::Load)?;
        for pid in &settings.pids {
            skel.maps
                .pid_filter
                .update(&pid.to_ne_bytes(), &[1u8], MapFlags::ANY)
                .map_err(CaptureError::Load)?;
        }
        let exec = if exec_hook {
            match skel.progs.ember_exec.attach() {
                Ok(link) => Some(link),
                Err(e) => {
                    warn!("exec hook not attached ({e}): new processes are unwound once the agent has read them");
                    None
                }
            }
        } else {
            None
        };
        let mut offcpu_links = Vec::new();
        if offcpu_on {
            // The hooks of a thread's return first: a record waiting for one always finds it.
            for (prog, on) in [
                (
                    &skel.progs.ember_offcpu_exit,
                    !task_work && offcpu.syscall_exit,
                ),
                (&skel.progs.ember_offcpu_rseq, !task_work && offcpu.rseq),
                (&skel.progs.ember_offcpu_switch, true),
                (&skel.progs.ember_offcpu_waking, true),
                (&skel.progs.ember_offcpu_lock_begin, klocks == Some(true)),
                (&skel.progs.ember_offcpu_lock_end, klocks == Some(true)),
            ] {
                if on {
                    offcpu_links.push(prog.attach().map_err(CaptureError::Load)?);
                }
            }
        }
        Ok(Self {
            skel,
            links: BTreeMap::new(),
            exec,
            offcpu_links,
            klocks_unsupported: offcpu_on && klocks == Some(false),
            event: settings.event,
        })
    }

    /// Handles on the unwind maps for the loader (none when only frame pointers are used).
    pub(super) fn unwind_maps(
        &self,
        settings: &Sampling,
    ) -> Result<Option<UnwindMaps>, CaptureError> {
        if settings.unwind == UnwindMode::FramePointer {
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
        match self.skel.progs.ember_sample.attach_perf_event(fd) {
            Ok(link) => Ok(link), // the link now owns the perf fd
            Err(e) => {
                // SAFETY: fd was returned by perf_event_open above and is owned by nobody else.
                unsafe { libc::close(fd) };
                Err(std::io::Error::other(e.to_string()))
            }
        }
    }
}

/// What `prepare_offcpu` decided.
struct OffCpuPlan {
    /// Off-CPU profiling is on.
    on: bool,
    /// Kernel lock contention is followed (`None`: not asked for).
    klocks: Option<bool>,
    /// Long blocks are walked by a task work (so neither rseq nor sys_exit is hooked).
    task_work: bool,
}

/// The off-CPU settings written into the object before load: its rodata, which programs
/// load, and its maps' sizes (minimal when off).
fn prepare_offcpu(
    open: &mut skel::OpenEmberSkel<'_>,
    offcpu: &OffCpuSettings,
) -> Result<OffCpuPlan, CaptureError> {
    // The lock tracepoints exist since 5.19: a program on a missing one fails the whole load.
    let klocks = (offcpu.enabled && offcpu.locks).then(|| kernel_has("btf_trace_contention_begin"));
    // BPF task works (6.18; bpf_preempt_disable is 6.10): without them, rseq or sys_exit.
    let task_work = offcpu.enabled
        && offcpu.task_work
        && kernel_has("bpf_task_work_schedule_resume_impl")
        && kernel_has("bpf_preempt_disable");
    if let Some(rodata) = open.maps.rodata_data.as_deref_mut() {
        let cfg = &mut rodata.ember_offcpu_cfg;
        cfg.min_block_ns = u64::try_from(offcpu.min_block.as_nanos()).unwrap_or(u64::MAX);
        cfg.sample_threshold = sample_threshold(offcpu.sample_rate);
        cfg.fallback_threshold = sample_threshold(offcpu.fallback_rate);
        cfg.syscall_exit = u32::from(offcpu.syscall_exit);
        cfg.max_tasks = offcpu.max_tasks;
        cfg.rseq = u32::from(offcpu.rseq);
        cfg.wakers = u32::from(offcpu.wakers);
        cfg.klocks = u32::from(klocks == Some(true));
        // The kernel's tgid, as the programs read it: ember runs in the host's pid namespace.
        cfg.self_tgid = std::process::id();
        cfg.kernel_threads = u32::from(offcpu.kernel_threads);
        cfg.task_work = u32::from(task_work);
    }
    // The off-CPU programs are BTF tracepoints too; off, their maps are kept minimal.
    let on = offcpu.enabled && kernel_btf();
    if offcpu.enabled && !on {
        warn!("off-CPU profiling needs the kernel's BTF (/sys/kernel/btf/vmlinux): off");
    }
    open.progs.ember_offcpu_switch.set_autoload(on);
    open.progs.ember_offcpu_waking.set_autoload(on);
    open.progs
        .ember_offcpu_lock_begin
        .set_autoload(on && klocks == Some(true));
    open.progs
        .ember_offcpu_lock_end
        .set_autoload(on && klocks == Some(true));
    if on && klocks == Some(false) {
        warn!("this kernel has no lock:contention_begin/end (5.19+): lock profiles have futex waits only");
    }
    // Without them, blocks take the fallback (their rodata switches are 0 too).
    open.progs
        .ember_offcpu_exit
        .set_autoload(on && !task_work && offcpu.syscall_exit);
    open.progs
        .ember_offcpu_rseq
        .set_autoload(on && !task_work && offcpu.rseq);
    open.maps
        .offcpu_threads
        .set_max_entries(if on { offcpu.max_threads } else { 1 })
        .map_err(CaptureError::Load)?;
    open.maps
        .offcpu_samples
        .set_max_entries(if on { offcpu.ring_buffer_bytes } else { 4096 })
        .map_err(CaptureError::Load)?;
    open.maps
        .offcpu_sums
        .set_max_entries(if on { offcpu.max_stacks } else { 1 })
        .map_err(CaptureError::Load)?;
    // The walker's row caches, per CPU: the sampler's, and off-CPU's when it is on.
    open.maps
        .row_cache
        .set_max_entries(if on { 2 } else { 1 })
        .map_err(CaptureError::Load)?;
    if task_work {
        info!("off-CPU: long blocks walked by a BPF task work on the way back to user mode");
    }
    Ok(OffCpuPlan {
        on,
        klocks,
        task_work,
    })
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
    // SAFETY: attr is initialised and outlives the call; pid -1 + cpu = every task on that CPU.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            &attr as *const libbpf_sys::perf_event_attr,
            -1,
            cpu as libc::c_int,
            -1,
            libbpf_sys::PERF_FLAG_FD_CLOEXEC as libc::c_ulong,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(fd as i32)
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
