//! The off-CPU records the capture thread keeps, by key, for the kernel's sums to be
//! counted against. The kernel sends the first record of a key after each read of its
//! sums (`offcpu_sums`) and only adds the times of the later ones (see `struct
//! ember_offcpu_head`); once a window, at its last drain of the ring, the thread reads
//! the sums, and each key's sums become copies of the record kept for it. A waker's
//! record is kept too: the blocks it woke name it by its key, and are joined to it as
//! they come.
//!
//! A record is kept for the period (between two reads: a window) it came in and the
//! next one: a key's entry is made just after its record is sent, so a read may fall
//! between the two and find the entry only the next time. At most `cap` records are
//! kept at once; the sums of a key whose record was not kept are counted lost.

use std::collections::HashMap;

use super::record::{summed_samples, OffCpuScale, OffRecord};
use super::skel::types::ember_offcpu_sum;
use crate::metrics::OffCpuEvent;
use crate::model::Sample;

/// A block's or kernel lock's record, as it came (its times are patched with the sums).
struct Record {
    bytes: Vec<u8>,
    /// The waker joined to it, if any.
    waker: Option<Sample>,
    period: u64,
}

/// Records kept by key (see the module).
pub struct Kept {
    records: HashMap<u64, Record>,
    wakers: HashMap<u64, (u64, Sample)>,
    period: u64,
    cap: usize,
}

impl Kept {
    /// At most `cap` records (blocks, kernel locks and wakers) kept at once.
    pub fn new(cap: usize) -> Self {
        Self {
            records: HashMap::new(),
            wakers: HashMap::new(),
            period: 0,
            cap: cap.max(1),
        }
    }

    fn full(&self) -> bool {
        self.records.len() + self.wakers.len() >= self.cap
    }

    /// A record from the ring (`data`, parsed as `record`): a block's samples joined to
    /// their waker, a kernel lock's, none for a waker; the record is kept under its key.
    /// What happened on the way is counted through `event`.
    pub fn take(
        &mut self,
        data: &[u8],
        record: OffRecord,
        event: &mut impl FnMut(OffCpuEvent),
    ) -> Vec<Sample> {
        let period = self.period;
        match record {
            OffRecord::Waker { key, sample } => {
                if self.wakers.contains_key(&key) || !self.full() {
                    self.wakers.insert(key, (period, sample));
                } else {
                    event(OffCpuEvent::WakerFull);
                }
                Vec::new()
            }
            OffRecord::KernelLock { key, sample } => {
                self.keep(key, data, None);
                vec![sample]
            }
            OffRecord::Block {
                key,
                waker_key,
                mut samples,
            } => {
                let waker = match waker_key {
                    0 => None,
                    k => match self.wakers.get(&k) {
                        Some((_, w)) => {
                            event(OffCpuEvent::WakerJoined);
                            Some(w.clone())
                        }
                        None => {
                            event(OffCpuEvent::WakerUnmatched);
                            None
                        }
                    },
                };
                self.keep(key, data, waker.clone());
                if let Some(w) = waker {
                    // Each part of the block (asleep, then runnable) carries the waker.
                    samples
                        .iter_mut()
                        .for_each(|s| s.waker = Some(Box::new(w.clone())));
                }
                samples
            }
        }
    }

    fn keep(&mut self, key: u64, data: &[u8], waker: Option<Sample>) {
        if !self.records.contains_key(&key) && self.full() {
            // Its sums, if any, will be counted lost.
            return;
        }
        let record = Record {
            bytes: data.to_vec(),
            waker,
            period: self.period,
        };
        self.records.insert(key, record);
    }

    /// The samples the kernel's sums stand for, each as copies of its key's record with
    /// the sums' times; the blocks of keys with no record kept are counted lost
    /// (`sums_orphaned`). Then a new period begins.
    pub fn sums(
        &mut self,
        sums: impl IntoIterator<Item = (u64, ember_offcpu_sum)>,
        scale: OffCpuScale,
        event: &mut impl FnMut(OffCpuEvent, u64),
    ) -> Vec<Sample> {
        let mut out = Vec::new();
        for (key, sum) in sums {
            if sum.count == 0 {
                continue; // a waker's entry, or a key sent once since the last read
            }
            let Some(record) = self.records.get(&key) else {
                event(OffCpuEvent::SumsOrphaned, u64::from(sum.count));
                continue;
            };
            match summed_samples(&record.bytes, &sum, scale) {
                Some(samples) => out.extend(samples.into_iter().map(|mut s| {
                    s.waker = record.waker.clone().map(Box::new);
                    s
                })),
                None => event(OffCpuEvent::Malformed, 1),
            }
        }
        self.period += 1;
        let last = self.period - 1;
        self.records.retain(|_, r| r.period >= last);
        self.wakers.retain(|_, (p, _)| *p >= last);
        out
    }

    /// Records kept now (wakers included).
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.records.len() + self.wakers.len()
    }
}

#[cfg(test)]
mod tests {
    use super::super::skel::types::{ember_offcpu_head, ember_offcpu_kind, ember_record};
    use super::*;
    use crate::model::{OffCpu, OffState};

    const ONE: OffCpuScale = OffCpuScale {
        exact: 1.0,
        fallback: 10.0,
    };

    /// A record as the ring carries it: head, record, one user frame `ip`, tid `tid`.
    fn bytes(head: ember_offcpu_head, tid: u32, ip: u64) -> Vec<u8> {
        let rec = ember_record {
            pid: 100,
            tid,
            user_frames: 1,
            ..Default::default()
        };
        // SAFETY: test-only views of repr(C) POD structs as bytes.
        let mut out = unsafe {
            std::slice::from_raw_parts(
                (&head as *const ember_offcpu_head).cast::<u8>(),
                std::mem::size_of::<ember_offcpu_head>(),
            )
        }
        .to_vec();
        out.extend_from_slice(unsafe {
            std::slice::from_raw_parts(
                (&rec as *const ember_record).cast::<u8>(),
                std::mem::size_of::<ember_record>(),
            )
        });
        out.extend(ip.to_ne_bytes());
        out
    }

    fn came(kept: &mut Kept, data: &[u8], events: &mut Vec<OffCpuEvent>) -> Vec<Sample> {
        let (record, _) = super::super::parse_offcpu_record(data, ONE).expect("parses");
        kept.take(data, record, &mut |e| events.push(e))
    }

    fn waker(key: u64, tid: u32) -> Vec<u8> {
        let head = ember_offcpu_head {
            kind: ember_offcpu_kind::EMBER_OFFCPU_WAKER.0,
            key,
            ..Default::default()
        };
        bytes(head, tid, 0x500)
    }

    fn block(key: u64, waker_key: u64, off_ns: u64, runnable_ns: u64) -> Vec<u8> {
        let head = ember_offcpu_head {
            off_ns,
            runnable_ns,
            syscall: -1,
            key,
            waker_key,
            ..Default::default()
        };
        bytes(head, 7, 0x400)
    }

    fn sum(off_ns: u64, runnable_ns: u64, count: u32, runnable: u32) -> ember_offcpu_sum {
        ember_offcpu_sum {
            off_ns,
            runnable_ns,
            count,
            runnable,
        }
    }

    fn offs(samples: &[Sample]) -> Vec<(Option<OffCpu>, Option<u32>)> {
        samples
            .iter()
            .map(|s| (s.off_cpu, s.waker.as_ref().map(|w| w.tid)))
            .collect()
    }

    fn off(state: OffState, ns: u64, blocks: u64) -> Option<OffCpu> {
        Some(OffCpu { state, ns, blocks })
    }

    #[test]
    fn sums_become_copies_of_their_record_with_its_waker() {
        let mut kept = Kept::new(16);
        let mut events = Vec::new();
        assert!(came(&mut kept, &waker(50, 70), &mut events).is_empty());
        let first = came(&mut kept, &block(9, 50, 700, 300), &mut events);
        assert_eq!(
            offs(&first),
            [
                (off(OffState::Sleep, 700, 1), Some(70)),
                (off(OffState::Runnable, 300, 1), Some(70)),
            ],
            "the record counts as itself, joined to the waker its key names"
        );
        assert_eq!(events, [OffCpuEvent::WakerJoined]);
        // Five more blocks of key 9 counted in the kernel, three of them woken; key 50's
        // entry (the waker) sums nothing; key 11 was never kept.
        let mut lost = Vec::new();
        let summed = kept.sums(
            [
                (9, sum(5000, 900, 5, 3)),
                (50, sum(0, 0, 0, 0)),
                (11, sum(10, 0, 4, 0)),
            ],
            ONE,
            &mut |e, n| lost.push((e, n)),
        );
        assert_eq!(
            offs(&summed),
            [
                (off(OffState::Sleep, 5000, 5), Some(70)),
                (off(OffState::Runnable, 900, 3), Some(70)),
            ]
        );
        assert_eq!(summed[0].user, [0x400]);
        assert_eq!(lost, [(OffCpuEvent::SumsOrphaned, 4)]);
    }

    #[test]
    fn records_last_two_periods_and_the_cap_holds() {
        let mut kept = Kept::new(3);
        let mut events = Vec::new();
        let mut none = |_e: OffCpuEvent, _n: u64| panic!("nothing lost");
        came(&mut kept, &waker(50, 70), &mut events);
        came(&mut kept, &block(9, 0, 700, 0), &mut events);
        // A read falls between a record and its key's entry: the entry is read next time.
        assert!(kept.sums([], ONE, &mut none).is_empty());
        let again = kept.sums([(9, sum(100, 0, 1, 0))], ONE, &mut none);
        assert_eq!(offs(&again), [(off(OffState::Sleep, 100, 1), None)]);
        assert_eq!(kept.len(), 0, "both periods over");
        // A block whose waker was let go: no waker, counted.
        came(&mut kept, &block(9, 50, 700, 0), &mut events);
        assert_eq!(events, [OffCpuEvent::WakerUnmatched]);
        // The cap: two more fit, the fourth is refused, a waker counted.
        came(&mut kept, &block(10, 0, 1, 0), &mut events);
        came(&mut kept, &waker(51, 71), &mut events);
        came(&mut kept, &waker(52, 72), &mut events);
        came(&mut kept, &block(12, 0, 1, 0), &mut events);
        assert_eq!(kept.len(), 3);
        assert_eq!(
            events,
            [OffCpuEvent::WakerUnmatched, OffCpuEvent::WakerFull]
        );
        let mut lost = Vec::new();
        kept.sums([(12, sum(5, 0, 2, 0))], ONE, &mut |e, n| lost.push((e, n)));
        assert_eq!(lost, [(OffCpuEvent::SumsOrphaned, 2)]);
    }
}
