//! The BPF programs' per-CPU counters mirrored into the metrics ([`CounterSync`]), by
//! difference since the last read.

use libbpf_rs::{MapCore, MapFlags};

use super::sampler::Sampler;
use super::skel::types::{ember_counter, ember_offcpu_counter};
use crate::metrics::{Cache, Loss, Metrics, OffCpuEvent, RowLookup, StackSide};

/// Where the increase of one BPF counter is counted.
#[derive(Clone, Copy)]
enum Counted {
    /// Whole samples lost: `ember_samples_lost_total{reason}`.
    Lost(Loss),
    /// A stack not walked, the sample kept: `ember_stack_errors_total{side}`.
    StackError(StackSide),
    /// Samples a filter excluded in BPF: `ember_samples_filtered_total`.
    Filtered,
    /// Entries a map had no room for: `ember_cache_dropped_total{cache}`.
    Dropped(Cache),
    /// Frames walked by a table: `ember_unwind_row_lookups_total{result}`.
    Row(RowLookup),
}

/// Mirrors the BPF per-CPU counters into the metrics, by difference since the last read.
#[derive(Default)]
pub(super) struct CounterSync {
    last: [u64; ember_counter::EMBER_CNT_MAX.0 as usize],
    offcpu_last: [u64; ember_offcpu_counter::EMBER_OFFCPU_CNT_MAX.0 as usize],
    /// Whether the off-CPU series were made (at zero) by a first read.
    offcpu_made: bool,
}

impl CounterSync {
    pub(super) fn sync(&mut self, sampler: &Sampler<'_>, metrics: &Metrics) {
        self.sync_offcpu(sampler, metrics);
        // Each BPF counter and the series its increase goes to.
        for (idx, into) in [
            (
                ember_counter::EMBER_CNT_LOST_RINGBUF,
                Counted::Lost(Loss::RingbufFull),
            ),
            (
                ember_counter::EMBER_CNT_NO_SCRATCH,
                Counted::Lost(Loss::NoScratch),
            ),
            (
                ember_counter::EMBER_CNT_KERN_STACK_ERR,
                Counted::StackError(StackSide::Kernel),
            ),
            (
                ember_counter::EMBER_CNT_USER_STACK_ERR,
                Counted::StackError(StackSide::User),
            ),
            (ember_counter::EMBER_CNT_FILTERED, Counted::Filtered),
            (
                ember_counter::EMBER_CNT_TAIL_CALL,
                Counted::StackError(StackSide::User),
            ),
            (
                ember_counter::EMBER_CNT_EXEC_FAILED,
                Counted::Dropped(Cache::UnwindProcesses),
            ),
            (
                ember_counter::EMBER_CNT_ROW_CACHED,
                Counted::Row(RowLookup::Cached),
            ),
            (
                ember_counter::EMBER_CNT_ROW_SEARCHED,
                Counted::Row(RowLookup::Searched),
            ),
            (
                ember_counter::EMBER_CNT_ROW_LEAF,
                Counted::Row(RowLookup::Leaf),
            ),
            (
                ember_counter::EMBER_CNT_ROW_EVICTED,
                Counted::Dropped(Cache::UnwindRowCache),
            ),
            (
                ember_counter::EMBER_CNT_FORK_FULL,
                Counted::Dropped(Cache::PidFilter),
            ),
        ] {
            let i = idx.0 as usize;
            let Some(now) = read_counter(sampler, idx.0) else {
                continue;
            };
            let delta = now.saturating_sub(self.last[i]);
            self.last[i] = now;
            if delta == 0 {
                continue;
            }
            match into {
                Counted::Lost(reason) => metrics.lost(reason, delta),
                Counted::StackError(side) => metrics.stack_error(side, delta),
                Counted::Filtered => {
                    metrics.samples_filtered.inc_by(delta);
                }
                Counted::Dropped(cache) => metrics.dropped(cache, delta),
                Counted::Row(result) => metrics.row_lookups(result, delta),
            }
        }
    }
}

impl CounterSync {
    /// The off-CPU counters and the number of threads held, when the programs are attached.
    fn sync_offcpu(&mut self, sampler: &Sampler<'_>, metrics: &Metrics) {
        if sampler.offcpu_links.is_empty() {
            return;
        }
        type C = ember_offcpu_counter;
        // One entry holds every counter (one syscall a second, not one per counter).
        let Some(all) = read_percpu_slots(
            &sampler.skel.maps.offcpu_counters,
            C::EMBER_OFFCPU_CNT_MAX.0 as usize,
        ) else {
            return;
        };
        for (idx, event) in [
            (C::EMBER_OFFCPU_CNT_SWITCHES, OffCpuEvent::Switch),
            (C::EMBER_OFFCPU_CNT_TAKEN, OffCpuEvent::Fallback),
            (C::EMBER_OFFCPU_CNT_SYSCALL, OffCpuEvent::Syscall),
            (C::EMBER_OFFCPU_CNT_RSEQ, OffCpuEvent::Rseq),
            (C::EMBER_OFFCPU_CNT_TASK_WORK, OffCpuEvent::TaskWork),
            (C::EMBER_OFFCPU_CNT_WORK_FAILED, OffCpuEvent::TaskWorkFailed),
            (C::EMBER_OFFCPU_CNT_KTHREAD, OffCpuEvent::KernelThread),
            (
                C::EMBER_OFFCPU_CNT_KTHREAD_SKIPPED,
                OffCpuEvent::KernelThreadSkipped,
            ),
            (C::EMBER_OFFCPU_CNT_SKIPPED, OffCpuEvent::FallbackSkipped),
            (C::EMBER_OFFCPU_CNT_EXIT_WALK, OffCpuEvent::ExitWalk),
            (C::EMBER_OFFCPU_CNT_MERGED, OffCpuEvent::Merged),
            (C::EMBER_OFFCPU_CNT_TASK_FULL, OffCpuEvent::TaskFull),
            (C::EMBER_OFFCPU_CNT_EXITED, OffCpuEvent::Exited),
            (C::EMBER_OFFCPU_CNT_MAP_FULL, OffCpuEvent::MapFull),
            (C::EMBER_OFFCPU_CNT_SHORT, OffCpuEvent::Short),
            (C::EMBER_OFFCPU_CNT_SENT, OffCpuEvent::Sent),
            (C::EMBER_OFFCPU_CNT_SUMMED, OffCpuEvent::Summed),
            (C::EMBER_OFFCPU_CNT_SUMS_FULL, OffCpuEvent::SumsFull),
            (C::EMBER_OFFCPU_CNT_LOST_RINGBUF, OffCpuEvent::RingbufFull),
            (C::EMBER_OFFCPU_CNT_NO_SCRATCH, OffCpuEvent::NoScratch),
            (C::EMBER_OFFCPU_CNT_FILTERED, OffCpuEvent::Filtered),
            (C::EMBER_OFFCPU_CNT_WAKER, OffCpuEvent::Waker),
            (C::EMBER_OFFCPU_CNT_WAKER_IRQ, OffCpuEvent::WakerInterrupt),
            (C::EMBER_OFFCPU_CNT_KLOCK, OffCpuEvent::KernelLock),
            (
                C::EMBER_OFFCPU_CNT_KLOCK_SHORT,
                OffCpuEvent::KernelLockShort,
            ),
        ] {
            let i = idx.0 as usize;
            let Some(&now) = all.get(i) else {
                continue;
            };
            let delta = now.saturating_sub(self.offcpu_last[i]);
            self.offcpu_last[i] = now;
            // Every series exists from the first read (at zero), so alerts have one to
            // read; after it only increases are counted (a label lookup each).
            if delta > 0 || !self.offcpu_made {
                metrics.offcpu(event, delta);
            }
        }
        self.offcpu_made = true;
        if let Some(bss) = sampler.skel.maps.bss_data.as_deref() {
            // SAFETY: the mmapped .bss is written by BPF atomics; a volatile read sees a whole u64.
            let live = unsafe { std::ptr::read_volatile(&bss.ember_offcpu_live) };
            metrics
                .offcpu_threads
                .set(i64::try_from(live).unwrap_or(i64::MAX));
            // SAFETY: as above.
            let tasks = unsafe { std::ptr::read_volatile(&bss.ember_offcpu_tasks) };
            metrics
                .offcpu_tasks
                .set(i64::try_from(tasks).unwrap_or(i64::MAX));
        }
    }
}

fn read_counter(sampler: &Sampler<'_>, idx: u32) -> Option<u64> {
    read_percpu(&sampler.skel.maps.counters, idx)
}

/// The sums over CPUs of the `slots` u64 counters the one entry of a per-CPU array holds.
fn read_percpu_slots(map: &impl MapCore, slots: usize) -> Option<Vec<u64>> {
    let per_cpu = map
        .lookup_percpu(&0u32.to_ne_bytes(), MapFlags::ANY)
        .ok()??;
    Some(sum_slots(&per_cpu, slots))
}

/// Slot-wise sums of per-CPU values that each hold `slots` native-endian u64s (a short
/// value counts as zeros for what it lacks).
fn sum_slots(per_cpu: &[Vec<u8>], slots: usize) -> Vec<u64> {
    let mut sums = vec![0u64; slots];
    for value in per_cpu {
        for (sum, b) in sums.iter_mut().zip(value.chunks_exact(8)) {
            let mut word = [0u8; 8];
            word.copy_from_slice(b);
            *sum = sum.wrapping_add(u64::from_ne_bytes(word));
        }
    }
    sums
}

/// The sum over CPUs of slot `idx` of a per-CPU array of u64 counters.
fn read_percpu(map: &impl MapCore, idx: u32) -> Option<u64> {
    let per_cpu = map
        .lookup_percpu(&idx.to_ne_bytes(), MapFlags::ANY)
        .ok()??;
    Some(
        per_cpu
            .iter()
            .filter_map(|v| {
                v.get(..8)
                    .and_then(|b| b.try_into().ok())
                    .map(u64::from_ne_bytes)
            })
            .sum(),
    )
}

#[cfg(test)]
mod tests {
    use super::sum_slots;

    #[test]
    fn slots_are_summed_over_cpus() {
        let cpu = |v: &[u64]| v.iter().flat_map(|x| x.to_ne_bytes()).collect::<Vec<u8>>();
        let per_cpu = vec![cpu(&[1, 2, 3]), cpu(&[10, 20, 30]), cpu(&[100])];
        assert_eq!(sum_slots(&per_cpu, 3), [111, 22, 33]);
        assert_eq!(sum_slots(&per_cpu, 2), [111, 22]);
        assert_eq!(sum_slots(&[], 2), [0, 0]);
    }
}
