//! The load plan: which parts of the BPF object are loaded, in which variant, and why
//! each is below what the settings asked. Built from the settings and the kernel's
//! [`Probes`]; [`Plan::step_down`] turns a refused part into its next simpler variant.

use std::collections::BTreeMap;

use super::features::{Culprit, Feature, FeatureState, Reason};
use crate::config::{OffCpu as OffCpuSettings, Sampling, UnwindMode};

/// The user-stack walker's variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Walker {
    /// `ember_sample_walk` and `ember_walk` with unwind tables; `python`: with interpreter
    /// frames.
    Tables { python: bool },
    /// `bpf_get_stack` by frame pointers only.
    FramePointer,
}

/// How off-CPU takes a long block's user stack (see offcpu.bpf.h).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum OffPath {
    /// A BPF task work walks it as the thread returns to user mode (6.18+).
    TaskWork,
    /// The thread's next rseq update or syscall exit walks it.
    Hooks { rseq: bool, exit: bool },
    /// Both stacks walked at switch-out, for a fraction of blocks (the fallback alone).
    SwitchOut,
}

impl OffPath {
    fn name(self) -> &'static str {
        match self {
            OffPath::TaskWork => "task_work",
            OffPath::Hooks {
                rseq: true,
                exit: true,
            } => "rseq+syscall_exit",
            OffPath::Hooks { rseq: true, .. } => "rseq",
            OffPath::Hooks { .. } => "syscall_exit",
            OffPath::SwitchOut => "switch_out",
        }
    }
}

/// What the kernel has, probed before the first load (each missing piece turns its feature
/// off without a failed load).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Probes {
    /// `/sys/kernel/btf/vmlinux`: typed tracepoints and CO-RE reads.
    pub(super) btf: bool,
    /// `BPF_MAP_TYPE_TASK_STORAGE` (5.11+): off-CPU's per-thread records.
    pub(super) task_storage: bool,
    /// `lock:contention_begin/end` (5.19+).
    pub(super) lock_tracepoints: bool,
    /// BPF task works and `bpf_preempt_disable` (6.18+ / 6.10+).
    pub(super) task_work: bool,
    /// `bpf_loop` (5.17+): the walker's range insert and off-CPU's loops.
    pub(super) bpf_loop: bool,
    /// The release has the probe-read bug of 5.19–6.3 ([`probe_read_bug`]).
    pub(super) probe_read_bug: bool,
    /// The release is past 6.18, where the kernel matrix saw task works scheduled from
    /// sched_switch never run ([`task_work_runs`]).
    pub(super) task_work_silent: bool,
    /// `bpf_get_current_task_btf` (5.11) and `bpf_task_pt_regs` (5.15): the user registers
    /// of a sample that interrupted the kernel, and the kernel-thread check.
    pub(super) task_regs: bool,
}

/// Whether task works scheduled from a switch program run on this release: on Debian's
/// 7.2 (the kernel matrix) they are scheduled without error and never run, so every long
/// block waits forever and off-CPU records nothing; 6.18 is where they were verified to
/// run. Past it, off-CPU takes its syscall hooks until a matrix kernel shows them working.
pub(super) fn task_work_runs(release: &str) -> bool {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    let num = |p: Option<&str>| p.and_then(|p| p.parse::<u32>().ok());
    match (num(parts.next()), num(parts.next())) {
        (Some(major), Some(minor)) => (major, minor) <= (6, 18),
        _ => false,
    }
}

/// Whether a kernel release has the `copy_from_user_nofault()` bug of 5.19 to 6.3 (fixed in
/// 6.4, 6.3.10 and 6.1.36): a user-memory read from a perf event's NMI may read another
/// process's memory, so a walker that reads user stacks and interpreter frames there
/// records frames that are not the thread's. The peers refuse these kernels; ember keeps
/// frame pointers (the kernel's own walk) and turns the walker off.
///
/// `release` is the kernel's own version where the distribution says it elsewhere
/// ([`upstream_version`]): Debian's `6.1.0-9-cloud-amd64` is 6.1.38.
pub(super) fn probe_read_bug(release: &str) -> bool {
    let mut parts = release
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u32>().ok());
    let (Some(Some(major)), Some(Some(minor))) = (parts.next(), parts.next()) else {
        return false;
    };
    let patch = parts.next().flatten().unwrap_or(0);
    match (major, minor) {
        (5, 19) | (6, 0) | (6, 2) => true,
        (6, 1) => patch < 36,
        (6, 3) => patch < 10,
        _ => false,
    }
}

/// The upstream version a distribution's kernel is built from: Debian names it in
/// `uname -v` ("Debian 6.1.158-1"), Ubuntu in /proc/version_signature's last word; else
/// the release.
pub(super) fn upstream_version(release: &str, uname_v: &str, signature: Option<&str>) -> String {
    if let Some(v) = signature.and_then(|s| s.split_whitespace().last()) {
        return v.to_owned();
    }
    if let Some(rest) = uname_v.split("Debian ").nth(1) {
        if let Some(v) = rest.split_whitespace().next() {
            return v.to_owned();
        }
    }
    release.to_owned()
}

/// Which parts load, in which variant.
#[derive(Clone, Debug)]
pub(super) struct Plan {
    pub(super) walker: Walker,
    pub(super) exec: bool,
    /// The fork hook (`ember_fork`): `sampling.subprocesses` with `sampling.pids`.
    pub(super) forks: bool,
    pub(super) offcpu: Option<OffPath>,
    pub(super) wakers: bool,
    pub(super) klocks: bool,
    /// The hashes the sampler and the walker name are preallocated: kernels before 6.1
    /// refuse a perf_event program that names one that is not.
    pub(super) prealloc: bool,
    /// The programs may read the current task's saved user registers ([`Probes::task_regs`]).
    pub(super) task_regs: bool,
    /// The hooks the settings allow when the task work cannot run (`offcpu.rseq`,
    /// `offcpu.syscall_exit`).
    hooks: OffPath,
    /// Why a feature is below what was asked (or off), with the sentence.
    notes: BTreeMap<Feature, (Reason, String)>,
}

impl Plan {
    /// What the settings ask for, less what the kernel lacks.
    pub(super) fn new(settings: &Sampling, offcpu: &OffCpuSettings, probes: Probes) -> Self {
        let mut plan = Plan {
            walker: Walker::FramePointer,
            exec: false,
            forks: false,
            offcpu: None,
            wakers: false,
            klocks: false,
            prealloc: false,
            task_regs: probes.btf && probes.task_regs,
            hooks: if offcpu.rseq || offcpu.syscall_exit {
                OffPath::Hooks {
                    rseq: offcpu.rseq,
                    exit: offcpu.syscall_exit,
                }
            } else {
                OffPath::SwitchOut
            },
            notes: BTreeMap::new(),
        };
        if settings.unwind == UnwindMode::FramePointer {
            plan.note(
                Feature::UnwindTables,
                Reason::Config,
                "sampling.unwind: frame_pointer",
            );
        } else if !probes.bpf_loop {
            plan.note(
                Feature::UnwindTables,
                Reason::Unsupported,
                "the kernel lacks bpf_loop and bpf_find_vma (5.17+)",
            );
        } else if probes.probe_read_bug {
            plan.note(
                Feature::UnwindTables,
                Reason::Unsupported,
                "this release has the copy_from_user_nofault bug of 5.19-6.3 (fixed in 6.1.36, \
                 6.3.10, 6.4): user reads in NMI may read another process",
            );
        } else {
            plan.walker = Walker::Tables { python: true };
            if probes.btf {
                plan.exec = true;
            } else {
                plan.note(Feature::ExecTracking, Reason::Unsupported, "no kernel BTF");
            }
        }
        if !settings.subprocesses || settings.pids.is_empty() {
            plan.note(
                Feature::Subprocesses,
                Reason::Config,
                "sampling.subprocesses needs sampling.pids",
            );
        } else if !probes.btf {
            plan.note(Feature::Subprocesses, Reason::Unsupported, "no kernel BTF");
        } else {
            plan.forks = true;
        }
        if !offcpu.enabled {
            plan.note(Feature::OffCpu, Reason::Config, "offcpu.enabled: false");
        } else if !probes.btf {
            plan.note(
                Feature::OffCpu,
                Reason::Unsupported,
                "no kernel BTF (/sys/kernel/btf/vmlinux)",
            );
        } else if !probes.task_regs {
            plan.note(
                Feature::OffCpu,
                Reason::Unsupported,
                "the kernel lacks bpf_get_current_task_btf and bpf_task_pt_regs (5.15+)",
            );
        } else if !probes.task_storage {
            plan.note(
                Feature::OffCpu,
                Reason::Unsupported,
                "the kernel lacks BPF task storage (5.11+)",
            );
        } else if !probes.bpf_loop {
            plan.note(
                Feature::OffCpu,
                Reason::Unsupported,
                "the kernel lacks bpf_loop (5.17+)",
            );
        } else {
            if offcpu.task_work && probes.task_work && probes.task_work_silent {
                plan.note(
                    Feature::OffCpu,
                    Reason::Unsupported,
                    "task works scheduled at sched_switch never ran past 6.18 (Debian's 7.2 in \
                     the kernel matrix): syscall hooks instead",
                );
            }
            plan.offcpu = Some(
                if offcpu.task_work && probes.task_work && !probes.task_work_silent {
                    OffPath::TaskWork
                } else {
                    plan.hooks
                },
            );
            plan.wakers = true;
            if !offcpu.wakers {
                plan.note(Feature::Wakers, Reason::Config, "offcpu.wakers: false");
            }
            if !offcpu.locks {
                plan.note(Feature::KernelLocks, Reason::Config, "offcpu.locks: false");
            } else if probes.lock_tracepoints {
                plan.klocks = true;
            } else {
                plan.note(
                    Feature::KernelLocks,
                    Reason::Unsupported,
                    "the kernel has no lock:contention_begin/end (5.19+): futex waits only",
                );
            }
        }
        plan
    }

    fn note(&mut self, feature: Feature, reason: Reason, detail: impl Into<String>) {
        self.notes.insert(feature, (reason, detail.into()));
    }

    /// Steps the refused part down to its next simpler variant (or off). False when the
    /// part is the sampler itself, or one this plan does not load (nothing left to drop).
    pub(super) fn step_down(&mut self, culprit: &Culprit, line: &str) -> bool {
        let refused = |what: &str| format!("{what} refused: {line}");
        if line.contains("preallocated hash map") && !self.prealloc {
            self.prealloc = true;
            return true;
        }
        match culprit {
            Culprit::Program(p) => match p.as_str() {
                "ember_walk" | "ember_sample_walk" => match self.walker {
                    Walker::Tables { python: true } => {
                        self.walker = Walker::Tables { python: false };
                        self.note(Feature::Python, Reason::Refused, refused(p));
                    }
                    Walker::Tables { python: false } => {
                        self.walker = Walker::FramePointer;
                        self.exec = false;
                        self.note(
                            Feature::UnwindTables,
                            Reason::Refused,
                            refused(&format!("{p} without Python")),
                        );
                    }
                    Walker::FramePointer => return false,
                },
                "ember_exec" if self.exec => {
                    self.exec = false;
                    self.note(Feature::ExecTracking, Reason::Refused, refused(p));
                }
                "ember_fork" if self.forks => {
                    self.forks = false;
                    self.note(Feature::Subprocesses, Reason::Refused, refused(p));
                }
                "ember_offcpu_switch" => return self.offcpu_down(refused(p)),
                "ember_offcpu_rseq" | "ember_offcpu_exit" => match self.offcpu {
                    Some(OffPath::Hooks { rseq, exit }) => {
                        let (rseq, exit) = if p == "ember_offcpu_rseq" {
                            (false, exit)
                        } else {
                            (rseq, false)
                        };
                        self.offcpu = Some(if rseq || exit {
                            OffPath::Hooks { rseq, exit }
                        } else {
                            OffPath::SwitchOut
                        });
                        self.note(Feature::OffCpu, Reason::Refused, refused(p));
                    }
                    _ => return false,
                },
                "ember_offcpu_waking" if self.wakers => {
                    self.wakers = false;
                    self.note(Feature::Wakers, Reason::Refused, refused(p));
                }
                "ember_offcpu_lock_begin" | "ember_offcpu_lock_end" if self.klocks => {
                    self.klocks = false;
                    self.note(Feature::KernelLocks, Reason::Refused, refused(p));
                }
                _ => return false,
            },
            Culprit::Map(m) => {
                if m.starts_with("offcpu_") && self.offcpu.is_some() {
                    self.offcpu = None;
                    self.wakers = false;
                    self.klocks = false;
                    self.note(
                        Feature::OffCpu,
                        Reason::Unsupported,
                        format!("map {m} could not be created: {line}"),
                    );
                } else if (m.starts_with("unwind_") || m.starts_with("py_"))
                    && self.walker != Walker::FramePointer
                {
                    self.walker = Walker::FramePointer;
                    self.exec = false;
                    self.note(
                        Feature::UnwindTables,
                        Reason::Unsupported,
                        format!("map {m} could not be created: {line}"),
                    );
                } else {
                    return false;
                }
            }
        }
        true
    }

    /// Off-CPU's next path after its switch program was refused in this one.
    fn offcpu_down(&mut self, why: String) -> bool {
        self.offcpu = match self.offcpu {
            Some(OffPath::TaskWork) => Some(self.hooks),
            Some(OffPath::Hooks { .. }) => Some(OffPath::SwitchOut),
            Some(OffPath::SwitchOut) | None => None,
        };
        if self.offcpu.is_none() {
            self.wakers = false;
            self.klocks = false;
        }
        self.note(Feature::OffCpu, Reason::Refused, why);
        true
    }

    /// Every feature's state once this plan has loaded (`attach` notes failures after it).
    pub(super) fn report(&self, attach: &BTreeMap<Feature, String>) -> Vec<FeatureState> {
        let state = |feature: Feature, on: bool, path: &str| {
            // Wakers and locks are off-CPU's: off with it, for its reason.
            let note = self.notes.get(&feature).or_else(|| {
                matches!(feature, Feature::Wakers | Feature::KernelLocks)
                    .then(|| self.offcpu.is_none())
                    .filter(|off| *off)
                    .and_then(|_| self.notes.get(&Feature::OffCpu))
            });
            let (reason, detail) = match (attach.get(&feature), note) {
                (Some(e), _) if on => (Reason::AttachFailed, e.clone()),
                (_, Some((r, d))) => (*r, d.clone()),
                _ if on => (Reason::Loaded, "loaded".to_owned()),
                _ => (Reason::Config, "off".to_owned()),
            };
            let enabled = on && !matches!(reason, Reason::AttachFailed | Reason::Config);
            FeatureState {
                feature,
                enabled,
                path: if enabled {
                    path.to_owned()
                } else {
                    "off".into()
                },
                reason,
                detail,
            }
        };
        let tables = matches!(self.walker, Walker::Tables { .. });
        let off = self.offcpu.is_some();
        vec![
            state(
                Feature::Sampler,
                true,
                if tables {
                    "perf_event"
                } else {
                    "perf_event, frame pointers"
                },
            ),
            state(
                Feature::UnwindTables,
                tables,
                "ember_sample_walk+ember_walk",
            ),
            state(
                Feature::Python,
                self.walker == Walker::Tables { python: true },
                "in ember_walk",
            ),
            state(
                Feature::ExecTracking,
                self.exec,
                "tp_btf/sched_process_exec",
            ),
            state(
                Feature::Subprocesses,
                self.forks,
                "tp_btf/sched_process_fork",
            ),
            state(
                Feature::OffCpu,
                off,
                self.offcpu.map_or("off", OffPath::name),
            ),
            state(Feature::Wakers, off && self.wakers, "tp_btf/sched_waking"),
            state(
                Feature::KernelLocks,
                off && self.klocks,
                "tp_btf/contention_begin+end",
            ),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn probes() -> Probes {
        Probes {
            btf: true,
            task_storage: true,
            lock_tracepoints: true,
            task_work: true,
            bpf_loop: true,
            probe_read_bug: false,
            task_work_silent: false,
            task_regs: true,
        }
    }

    #[test]
    fn task_works_are_used_up_to_6_18_only() {
        assert!(task_work_runs("6.18.44-fc-v1300"));
        assert!(task_work_runs("6.12.117+deb13-cloud-amd64"));
        assert!(!task_work_runs("7.2.13+deb14-cloud-amd64"));
        assert!(!task_work_runs("6.19.1"));
        let plan = Plan::new(
            &Sampling::default(),
            &on(),
            Probes {
                task_work_silent: true,
                ..probes()
            },
        );
        assert!(matches!(
            plan.offcpu,
            Some(OffPath::Hooks { rseq: true, .. })
        ));
        let report = plan.report(&BTreeMap::new());
        let off = report
            .iter()
            .find(|f| f.feature == Feature::OffCpu)
            .unwrap();
        assert!(off.enabled && off.detail.contains("never ran"), "{off:?}");
    }

    #[test]
    fn the_probe_read_bug_is_known_by_release() {
        for (release, bug) in [
            ("5.19.0-50-generic", true),
            ("6.0.12", true),
            ("6.1.0-9-cloud-amd64", true),
            ("6.1.35", true),
            ("6.1.36", false),
            ("6.1.158+deb12-cloud-amd64", false),
            ("6.2.16", true),
            ("6.3.9", true),
            ("6.3.10", false),
            ("6.4.0", false),
            ("5.15.0-91-generic", false),
            ("5.10.0-30-cloud-amd64", false),
            ("6.18.44-fc-v1300", false),
            ("garbage", false),
        ] {
            assert_eq!(probe_read_bug(release), bug, "{release}");
        }
        for (release, uname_v, signature, upstream) in [
            (
                "6.1.0-9-cloud-amd64",
                "#1 SMP PREEMPT_DYNAMIC Debian 6.1.27-1 (2023-05-08)",
                None,
                "6.1.27-1",
            ),
            (
                "5.19.0-50-generic",
                "#50-Ubuntu SMP PREEMPT_DYNAMIC Mon Jul 10 18:24:29 UTC 2023",
                Some("Ubuntu 5.19.0-50.50-generic 5.19.17"),
                "5.19.17",
            ),
            ("6.18.44-fc-v1300", "#1 SMP", None, "6.18.44-fc-v1300"),
        ] {
            assert_eq!(upstream_version(release, uname_v, signature), upstream);
        }
        for (release, bug) in [("6.1.27-1", true), ("6.1.158-1", false)] {
            assert_eq!(probe_read_bug(release), bug, "{release}");
        }
        let plan = Plan::new(
            &Sampling::default(),
            &on(),
            Probes {
                probe_read_bug: true,
                ..probes()
            },
        );
        assert_eq!(plan.walker, Walker::FramePointer);
    }

    fn on() -> OffCpuSettings {
        OffCpuSettings {
            enabled: true,
            ..OffCpuSettings::default()
        }
    }

    fn prog(p: &str) -> Culprit {
        Culprit::Program(p.into())
    }

    #[test]
    fn a_refused_walker_drops_python_then_tables_and_never_the_sampler() {
        let mut plan = Plan::new(&Sampling::default(), &on(), probes());
        assert_eq!(plan.walker, Walker::Tables { python: true });
        assert!(plan.step_down(&prog("ember_walk"), "too large"));
        assert_eq!(plan.walker, Walker::Tables { python: false });
        // The sampler's walking variant steps down as the walker does.
        assert!(plan.step_down(&prog("ember_sample_walk"), "too large"));
        assert_eq!(plan.walker, Walker::FramePointer);
        assert!(!plan.exec);
        assert!(!plan.step_down(&prog("ember_walk"), "too large"));
        assert!(!plan.step_down(&prog("ember_sample"), "bad"));
        let report = plan.report(&BTreeMap::new());
        let tables = &report[1];
        assert_eq!(tables.feature, Feature::UnwindTables);
        assert!(!tables.enabled);
        assert_eq!(tables.reason, Reason::Refused);
        assert!(tables.detail.contains("too large"), "{}", tables.detail);
        // Off-CPU was not touched.
        let offcpu = report.iter().find(|f| f.feature == Feature::OffCpu);
        assert!(offcpu.is_some_and(|f| f.enabled));
    }

    #[test]
    fn a_kernel_that_wants_preallocated_hashes_gets_them() {
        let mut plan = Plan::new(&Sampling::default(), &on(), probes());
        let line = "perf_event programs can only use preallocated hash map";
        assert!(plan.step_down(&prog("ember_sample"), line));
        assert!(plan.prealloc);
        assert_eq!(plan.walker, Walker::Tables { python: true });
        // Asked again, the sampler itself is refused: nothing left to try.
        assert!(!plan.step_down(&prog("ember_sample"), line));
    }

    #[test]
    fn offcpu_steps_through_its_paths_then_off() {
        let settings = OffCpuSettings {
            syscall_exit: true,
            ..on()
        };
        let mut plan = Plan::new(&Sampling::default(), &settings, probes());
        assert_eq!(plan.offcpu, Some(OffPath::TaskWork));
        assert!(plan.step_down(&prog("ember_offcpu_switch"), "x"));
        assert_eq!(
            plan.offcpu,
            Some(OffPath::Hooks {
                rseq: true,
                exit: true
            })
        );
        assert!(plan.step_down(&prog("ember_offcpu_rseq"), "x"));
        assert!(plan.step_down(&prog("ember_offcpu_exit"), "x"));
        assert_eq!(plan.offcpu, Some(OffPath::SwitchOut));
        assert!(plan.step_down(&prog("ember_offcpu_switch"), "x"));
        assert_eq!(plan.offcpu, None);
        assert!(!plan.wakers && !plan.klocks);
    }

    #[test]
    fn a_kernel_without_task_storage_runs_without_offcpu_and_says_why() {
        let plan = Plan::new(
            &Sampling::default(),
            &on(),
            Probes {
                task_storage: false,
                ..probes()
            },
        );
        assert_eq!(plan.offcpu, None);
        let report = plan.report(&BTreeMap::new());
        let off = report
            .iter()
            .find(|f| f.feature == Feature::OffCpu)
            .unwrap();
        assert_eq!(off.reason, Reason::Unsupported);
        assert!(off.detail.contains("task storage"));
        assert!(report[0].enabled, "the sampler always runs");
    }

    #[test]
    fn a_map_the_kernel_cannot_create_turns_off_its_feature_only() {
        let mut plan = Plan::new(&Sampling::default(), &on(), probes());
        assert!(plan.step_down(&Culprit::Map("offcpu_tasks".into()), "EINVAL"));
        assert_eq!(plan.offcpu, None);
        assert_eq!(plan.walker, Walker::Tables { python: true });
        assert!(!plan.step_down(&Culprit::Map("samples".into()), "EINVAL"));
    }
}
