//! Off-CPU stacks as profiles show them: without the tracing machinery their kernel sides
//! were taken inside, and with a waker's side cut at the interrupt that woke a thread.

use std::sync::Arc;

use crate::model::{Func, Mapping, SymFrame, WAKE_SEPARATOR};

/// An off-CPU stack without the tracing machinery its kernel sides were taken inside
/// (bpf_prog_*, bpf_trace_run*, __traceiter_*): the blocked side from the scheduler's
/// core (`__schedule`, where sched_switch fires) or its first other frame; a waker's side
/// (before the `--` frame, outermost first) up to the wakeup (`try_to_wake_up`, where
/// sched_waking fires), or its last other frame. A wakeup from an interrupt (a timer, an
/// I/O completion) has the interrupt's frames only: the thread it interrupted is no waker.
pub(super) fn trim_off_cpu(mut all: Vec<Arc<SymFrame>>) -> Vec<Arc<SymFrame>> {
    let sep = all.iter().position(|f| is_frame(f, WAKE_SEPARATOR));
    let blocked = sep.map_or(0, |i| i + 1);
    let skip = all[blocked..]
        .iter()
        .position(|f| is_frame(f, "__schedule"))
        .or_else(|| all[blocked..].iter().position(|f| !is_tracing_frame(f)))
        .unwrap_or(0);
    all.drain(blocked..blocked + skip);
    if let Some(sep) = sep {
        let waker = &all[..sep];
        let keep = waker
            .iter()
            .rposition(|f| is_frame(f, "try_to_wake_up"))
            .or_else(|| waker.iter().rposition(|f| !is_tracing_frame(f)))
            .map_or(sep, |i| i + 1);
        all.drain(keep..sep);
        if let Some(entry) = all[..keep].iter().rposition(is_interrupt_entry) {
            all.drain(..entry);
        }
    }
    all
}

/// The kernel's entry of a hardware interrupt (`asm_sysvec_apic_timer_interrupt`,
/// `asm_common_interrupt`, ...): the frames outside it are of whatever it interrupted.
fn is_interrupt_entry(f: &Arc<SymFrame>) -> bool {
    matches!(f.mapping, Mapping::Kernel)
        && f.funcs.iter().any(|func| {
            let n = &*func.name;
            n.starts_with("asm_sysvec_") || n == "asm_common_interrupt"
        })
}

/// Whether `f` is the function `name` (a kernel function, or the waker separator).
fn is_frame(f: &Arc<SymFrame>, name: &str) -> bool {
    matches!(f.mapping, Mapping::Kernel | Mapping::Region(_))
        && f.funcs.iter().any(|func| &*func.name == name)
}

/// A kernel frame of the machinery that runs a BPF program from a tracepoint.
fn is_tracing_frame(f: &Arc<SymFrame>) -> bool {
    matches!(f.mapping, Mapping::Kernel)
        && f.funcs.iter().any(|func| {
            let n = &*func.name;
            n.starts_with("bpf_") || n.starts_with("__bpf_") || n.starts_with("__traceiter_")
        })
}

/// The `--` frame between a waker's frames and the blocked ones: named by its label.
pub(super) fn separator(label: &Arc<str>) -> SymFrame {
    SymFrame {
        mapping: Mapping::Region(label.clone()),
        address: 0,
        funcs: vec![Func {
            name: label.clone(),
            file: None,
            line: 0,
        }]
        .into(),
        named: true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(mapping: Mapping, name: &str) -> Arc<SymFrame> {
        Arc::new(SymFrame {
            mapping,
            address: 0,
            funcs: vec![Func {
                name: Arc::from(name),
                file: None,
                line: 0,
            }]
            .into(),
            named: true,
        })
    }

    fn names(frames: &[Arc<SymFrame>]) -> Vec<String> {
        frames.iter().map(|f| f.funcs[0].name.to_string()).collect()
    }

    #[test]
    fn off_cpu_stacks_lose_the_tracing_machinery_and_interrupted_wakers() {
        let k = |n| named(Mapping::Kernel, n);
        let u = |n| named(Mapping::Unknown, n);
        let sep = || named(Mapping::Region(Arc::from(WAKE_SEPARATOR)), WAKE_SEPARATOR);
        // Waker outermost first, then `--`, then the blocked stack leaf first.
        let woken = vec![
            u("main"),
            u("produce"),
            k("do_syscall_64"),
            k("try_to_wake_up"),
            k("__bpf_trace_sched_waking"),
            k("bpf_trace_run1"),
            sep(),
            k("bpf_prog_1"),
            k("__schedule"),
            k("futex_wait"),
            u("consume"),
        ];
        assert_eq!(
            names(&trim_off_cpu(woken)),
            [
                "main",
                "produce",
                "do_syscall_64",
                "try_to_wake_up",
                "--",
                "__schedule",
                "futex_wait",
                "consume"
            ]
        );
        // A timer's wakeup: the interrupted thread's frames go.
        let timer = vec![
            u("rustc"),
            k("asm_sysvec_apic_timer_interrupt"),
            k("hrtimer_wakeup"),
            k("try_to_wake_up"),
            sep(),
            k("hrtimer_nanosleep"),
            u("sleeper"),
        ];
        assert_eq!(
            names(&trim_off_cpu(timer)),
            [
                "asm_sysvec_apic_timer_interrupt",
                "hrtimer_wakeup",
                "try_to_wake_up",
                "--",
                "hrtimer_nanosleep",
                "sleeper"
            ]
        );
        // Kernel lock contention: no waker, no __schedule; the leading tracing frames go.
        let klock = vec![
            k("bpf_prog_2"),
            k("__bpf_trace_contention_end"),
            k("__mutex_lock"),
            u("app"),
        ];
        assert_eq!(names(&trim_off_cpu(klock)), ["__mutex_lock", "app"]);
    }
}
