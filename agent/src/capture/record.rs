//! The ring buffer's records as samples: the sampler's (`struct ember_record`, then its
//! ips) and the off-CPU programs' (`struct ember_offcpu_head` before one), with the
//! `EMBER_REC_*` flags by which a record asks the unwind loader for its process.

use super::skel::types::{
    ember_limit, ember_offcpu_head, ember_offcpu_kind, ember_offcpu_path, ember_offcpu_state,
    ember_offcpu_sum, ember_py_result, ember_py_tail, ember_rec_flag, ember_record,
    ember_unwind_result,
};
use crate::model::{LockWait, OffCpu, OffState, PyFrameRef, PyWalk, Sample, StackEnd};

/// Frames per stack side, `EMBER_MAX_FRAMES` of `bpf/contract/record.h` (below 128: one
/// bit each in [`Sample::user_exact`]).
pub const MAX_FRAMES: usize = ember_limit::EMBER_MAX_FRAMES.0 as usize;
/// `EMBER_IP_EXACT`: the walker's mark on a user frame to be named at its own address.
const IP_EXACT: u64 = 1 << ember_limit::EMBER_IP_EXACT_BIT.0;
const HEADER: usize = std::mem::size_of::<ember_record>();
// The header is the contract: the ips must start 8-byte aligned right after it.
const _: () = assert!(HEADER % 8 == 0);
const OFFCPU_HEAD: usize = std::mem::size_of::<ember_offcpu_head>();
const PY_TAIL: usize = std::mem::size_of::<ember_py_tail>();
const _: () = assert!(OFFCPU_HEAD % 8 == 0);

/// Record flags (`enum ember_rec_flag`: `user_flags` is one byte of them).
pub(super) const REC_UNKNOWN_PROCESS: u8 = ember_rec_flag::EMBER_REC_UNKNOWN_PROCESS.0 as u8;
pub(super) const REC_RANGE_MISS: u8 = ember_rec_flag::EMBER_REC_RANGE_MISS.0 as u8;
pub(super) const REC_UNREAD: u8 = ember_rec_flag::EMBER_REC_UNREAD.0 as u8;

/// Turns one ring buffer record into a sample and its `EMBER_REC_*` flags; `None` if it is
/// shorter than it claims.
pub fn parse_record(data: &[u8]) -> Option<(Sample, u8)> {
    if data.len() < HEADER {
        return None;
    }
    // SAFETY: the slice holds at least HEADER bytes; ember_record is plain old data.
    let hdr: ember_record = unsafe { std::ptr::read_unaligned(data.as_ptr().cast()) };
    let (k, u) = (usize::from(hdr.kern_frames), usize::from(hdr.user_frames));
    let py_result = py_walk(hdr.py_result);
    let tail = if hdr.py_result == 0 { 0 } else { PY_TAIL };
    let ips_end = HEADER + 8 * (k + u);
    if k > MAX_FRAMES || u > MAX_FRAMES || data.len() < ips_end + tail {
        return None;
    }
    let word = |c: &[u8]| u64::from_ne_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
    let mut ips = data[HEADER..ips_end].chunks_exact(8).map(word);
    let kernel: Vec<u64> = ips.by_ref().take(k).collect();
    let slots: Vec<u64> = ips.collect();
    let bits: Vec<u64> = data[ips_end..ips_end + tail]
        .chunks_exact(8)
        .map(word)
        .collect();
    let walked = hdr.user_result != ember_unwind_result::EMBER_UNWIND_FRAME_POINTER.0 as u8;
    let user = split_user(&slots, walked, &bits);
    let user_end = stack_end(hdr.user_result, user.ips.is_empty());
    let sample = Sample {
        time_ns: hdr.time_ns,
        cgroup_id: hdr.cgroup_id,
        pid: hdr.pid,
        // Pid 0 is every CPU's idle task, each started on its own: one process to ember.
        start_time: match hdr.pid {
            0 => 0,
            _ => crate::os::procfs::start_ticks(hdr.start_ns),
        },
        tid: hdr.tid,
        cpu: hdr.cpu,
        comm: hdr.comm.map(|c| c as u8),
        kernel,
        user: user.ips,
        user_exact: user.exact,
        user_end,
        python: user.python,
        user_eval: user.eval,
        py_result,
        off_cpu: None,
        waker: None,
        lock: None,
    };
    Some((sample, hdr.user_flags))
}

/// A record's user slots, split into native frames and interpreter frames.
struct UserSide {
    ips: Vec<u64>,
    exact: u128,
    eval: u128,
    python: Vec<PyFrameRef>,
}

/// Bit i of a two-word bitmap of the interpreter tail.
fn bit(bits: &[u64], i: usize) -> bool {
    bits.get(i / 64).is_some_and(|w| w >> (i % 64) & 1 == 1)
}

/// Splits the user slots: a slot the tail's `py_start` marks and the one after it are an
/// interpreter frame (code address; unit << 32 | fingerprint); the others are native ips,
/// whose exact and eval bits are renumbered by native frame.
fn split_user(slots: &[u64], walked: bool, tail: &[u64]) -> UserSide {
    let (starts, evals) = (tail.get(..2).unwrap_or(&[]), tail.get(2..4).unwrap_or(&[]));
    let mut side = UserSide {
        ips: Vec::with_capacity(slots.len()),
        exact: 0,
        eval: 0,
        python: Vec::new(),
    };
    let mut i = 0;
    while let Some(&ip) = slots.get(i) {
        if bit(starts, i) {
            if let Some(&data) = slots.get(i + 1) {
                side.python.push(PyFrameRef {
                    before: side.ips.len() as u8,
                    code: ip,
                    unit: (data >> 32) as u32,
                    fingerprint: data as u32,
                });
            }
            i += 2;
            continue;
        }
        let n = side.ips.len();
        // Only the table walker sets the bit; the kernel's frame-pointer walk copies
        // whatever the stack holds.
        if walked && ip & IP_EXACT != 0 {
            side.exact |= 1 << n;
            side.ips.push(ip & !IP_EXACT);
        } else {
            side.ips.push(ip);
        }
        if bit(evals, i) {
            side.eval |= 1 << n;
        }
        i += 1;
    }
    side
}

/// The record's `py_result`; `None` for `EMBER_PY_NONE` (and values this build does not know).
fn py_walk(v: u8) -> Option<PyWalk> {
    use ember_py_result as R;
    Some(match u32::from(v) {
        x if x == R::EMBER_PY_OK.0 => PyWalk::Ok,
        x if x == R::EMBER_PY_NO_STATE.0 => PyWalk::NoState,
        x if x == R::EMBER_PY_TRUNCATED.0 => PyWalk::Truncated,
        x if x == R::EMBER_PY_MISMATCH.0 => PyWalk::Mismatch,
        x if x == R::EMBER_PY_READ.0 => PyWalk::Read,
        x if x == R::EMBER_PY_APPENDED.0 => PyWalk::Appended,
        _ => return None,
    })
}

/// `offcpu.sample_rate` as the BPF program's threshold on a random u32 (2^32: every one).
pub(super) fn sample_threshold(rate: f64) -> u64 {
    if rate >= 1.0 {
        1 << 32
    } else {
        (rate.max(0.0) * (1u64 << 32) as f64) as u64
    }
}

/// What an off-CPU record's times are multiplied by, by where its stacks were taken: the
/// inverse of the fractions of switch-outs that could have produced it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OffCpuScale {
    /// Blocks taken at switch-in or at a syscall's exit: 1 / `offcpu.sample_rate`.
    pub exact: f64,
    /// Blocks the fallback walked at switch-out: 1 / (`sample_rate` × `fallback_rate`).
    pub fallback: f64,
}

impl OffCpuScale {
    /// The scales `offcpu:`'s rates give.
    pub fn of(offcpu: &crate::config::OffCpu) -> Self {
        Self {
            exact: 1.0 / offcpu.sample_rate,
            fallback: 1.0 / (offcpu.sample_rate * offcpu.fallback_rate),
        }
    }
}

/// One off-CPU record (`enum ember_offcpu_kind`), with the key the kernel counts its
/// like under (`struct ember_offcpu_head`).
#[derive(Debug, PartialEq)]
pub enum OffRecord {
    /// A block: the time in its state, then the time runnable after a wakeup, if any (a
    /// waker joins both); both carry [`LockWait::Futex`] when the thread blocked in a
    /// futex syscall.
    Block {
        /// Its key.
        key: u64,
        /// The key of the waker record that woke it (sent before it); 0: none.
        waker_key: u64,
        /// Its parts.
        samples: Vec<Sample>,
    },
    /// The thread that woke a block past `min_block`, as it woke it: the blocks it woke
    /// name it by its key.
    Waker {
        /// Its key.
        key: u64,
        /// The waker's stacks.
        sample: Sample,
    },
    /// Kernel lock contention: the waiting thread's stacks as it got the lock.
    KernelLock {
        /// Its key.
        key: u64,
        /// The stacks and the wait.
        sample: Sample,
    },
}

impl OffRecord {
    /// The process whose stacks the record holds (the waker's, for a waker).
    pub fn pid(&self) -> u32 {
        match self {
            OffRecord::Block { samples, .. } => samples.first().map_or(0, |s| s.pid),
            OffRecord::Waker { sample, .. } | OffRecord::KernelLock { sample, .. } => sample.pid,
        }
    }
}

/// The samples the kernel's sums of a key stand for: the key's record `data` (a block's or a
/// kernel lock's, as it came from the ring) with the sums' times and block counts in place
/// of its own. `None` if the record is malformed, a waker's, or the sums count nothing.
pub fn summed_samples(
    data: &[u8],
    sum: &ember_offcpu_sum,
    scale: OffCpuScale,
) -> Option<Vec<Sample>> {
    if sum.count == 0 || data.len() < OFFCPU_HEAD {
        return None;
    }
    let mut patched = data.to_vec();
    patched[..8].copy_from_slice(&sum.off_ns.to_ne_bytes());
    patched[8..16].copy_from_slice(&sum.runnable_ns.to_ne_bytes());
    let (record, _) = parse_offcpu_record(&patched, scale)?;
    let mut samples = match record {
        OffRecord::Block { samples, .. } => samples,
        OffRecord::KernelLock { sample, .. } => vec![sample],
        OffRecord::Waker { .. } => return None,
    };
    for (i, s) in samples.iter_mut().enumerate() {
        if let Some(o) = &mut s.off_cpu {
            // Every block has the first part; the runnable time after a wakeup, only those
            // woken while asleep.
            o.blocks = u64::from(if i == 0 { sum.count } else { sum.runnable });
        }
    }
    Some(samples)
}

/// Syscall numbers of futex waits (`futex`, `futex_waitv`, `futex_wait`) on this target.
#[cfg(target_arch = "aarch64")]
const FUTEX_SYSCALLS: [i32; 3] = [98, 449, 455];
#[cfg(not(target_arch = "aarch64"))]
const FUTEX_SYSCALLS: [i32; 3] = [202, 449, 455];

/// Turns one off-CPU record into an [`OffRecord`] (times scaled by `scale` for the
/// record's path) and its `EMBER_REC_*` flags; `None` if it is malformed.
pub fn parse_offcpu_record(data: &[u8], scale: OffCpuScale) -> Option<(OffRecord, u8)> {
    if data.len() < OFFCPU_HEAD {
        return None;
    }
    // SAFETY: the slice holds at least OFFCPU_HEAD bytes; ember_offcpu_head is plain old data.
    let head: ember_offcpu_head = unsafe { std::ptr::read_unaligned(data.as_ptr().cast()) };
    let (sample, flags) = parse_record(&data[OFFCPU_HEAD..])?;
    type K = ember_offcpu_kind;
    match ember_offcpu_kind(head.kind) {
        K::EMBER_OFFCPU_BLOCK => {}
        K::EMBER_OFFCPU_WAKER => {
            let sample = Sample {
                python: Vec::new(),
                py_result: None,
                ..sample
            };
            let key = head.key;
            return Some((OffRecord::Waker { key, sample }, flags));
        }
        K::EMBER_OFFCPU_KLOCK => {
            let sample = Sample {
                off_cpu: Some(OffCpu {
                    state: OffState::Sleep,
                    // Timed for every thread with a record: not drawn by sample_rate.
                    ns: head.off_ns,
                    blocks: 1,
                }),
                lock: Some(LockWait::Kernel),
                ..sample
            };
            let key = head.key;
            return Some((OffRecord::KernelLock { key, sample }, flags));
        }
        _ => return None,
    }
    type S = ember_offcpu_state;
    let state = match ember_offcpu_state(head.state) {
        S::EMBER_OFFCPU_SLEEP => OffState::Sleep,
        S::EMBER_OFFCPU_DISK => OffState::Disk,
        S::EMBER_OFFCPU_RUNNABLE => OffState::Runnable,
        _ => return None,
    };
    type P = ember_offcpu_path;
    let scale = match ember_offcpu_path(head.path) {
        P::EMBER_OFFCPU_PATH_EXIT | P::EMBER_OFFCPU_PATH_KTHREAD => scale.exact,
        P::EMBER_OFFCPU_PATH_SWITCH => scale.fallback,
        _ => return None,
    };
    let scaled = |ns: u64| (ns as f64 * scale).round() as u64;
    let mut out = Vec::with_capacity(2);
    // A futex wait lasts until the thread runs again: its runnable part is lock delay too.
    let lock = FUTEX_SYSCALLS
        .contains(&head.syscall)
        .then_some(LockWait::Futex);
    let sample = Sample { lock, ..sample };
    if head.runnable_ns > 0 && state != OffState::Runnable {
        let mut woken = sample.clone();
        woken.off_cpu = Some(OffCpu {
            state: OffState::Runnable,
            ns: scaled(head.runnable_ns),
            blocks: 1,
        });
        out.push(woken);
    }
    out.insert(
        0,
        Sample {
            off_cpu: Some(OffCpu {
                state,
                ns: scaled(head.off_ns),
                blocks: 1,
            }),
            ..sample
        },
    );
    let (key, waker_key) = (head.key, head.waker_key);
    Some((
        OffRecord::Block {
            key,
            waker_key,
            samples: out,
        },
        flags,
    ))
}

/// The metric label of a record's `enum ember_unwind_result`.
fn stack_end(result: u8, empty: bool) -> StackEnd {
    type R = ember_unwind_result;
    match ember_unwind_result(u32::from(result)) {
        R::EMBER_UNWIND_FRAME_POINTER if empty => StackEnd::NoUserStack,
        R::EMBER_UNWIND_FRAME_POINTER => StackEnd::FramePointer,
        R::EMBER_UNWIND_COMPLETE => StackEnd::Complete,
        R::EMBER_UNWIND_TRUNCATED => StackEnd::Truncated,
        R::EMBER_UNWIND_FP_END => StackEnd::FramePointerEnd,
        R::EMBER_UNWIND_ERR_UNSUPPORTED => StackEnd::Unsupported,
        R::EMBER_UNWIND_ERR_READ => StackEnd::ReadFault,
        R::EMBER_UNWIND_ERR_BAD_FRAME => StackEnd::BadFrame,
        R::EMBER_UNWIND_ERR_RBP_UNKNOWN => StackEnd::RbpUnknown,
        R::EMBER_UNWIND_ERR_NO_TABLE => StackEnd::NoTable,
        _ => StackEnd::TableMissing,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(kernel: &[u64], user: &[u64]) -> Vec<u8> {
        record_ended(
            ember_unwind_result::EMBER_UNWIND_FRAME_POINTER,
            kernel,
            user,
        )
    }

    fn record_ended(result: ember_unwind_result, kernel: &[u64], user: &[u64]) -> Vec<u8> {
        let mut hdr = ember_record {
            user_result: result.0 as u8,
            time_ns: 7,
            cgroup_id: 9,
            start_ns: 12_345_678_901,
            pid: 100,
            tid: 101,
            cpu: 1,
            kern_frames: kernel.len() as u16,
            user_frames: user.len() as u16,
            ..Default::default()
        };
        hdr.comm[..4].copy_from_slice(&[b'h' as i8, b'o' as i8, b'g' as i8, 0]);
        // SAFETY: test-only view of a repr(C) POD struct as bytes.
        let mut out = unsafe {
            std::slice::from_raw_parts((&hdr as *const ember_record).cast::<u8>(), HEADER)
        }
        .to_vec();
        for ip in kernel.iter().chain(user) {
            out.extend_from_slice(&ip.to_ne_bytes());
        }
        out
    }

    #[test]
    fn parses_both_sides() {
        let (s, flags) = parse_record(&record(
            &[0xffff_0001, 0xffff_0002],
            &[0x401000, 0x402000, 0x403000],
        ))
        .expect("valid");
        assert_eq!(flags, 0);
        assert_eq!(s.user_end, StackEnd::FramePointer);
        assert_eq!(s.kernel, [0xffff_0001, 0xffff_0002]);
        assert_eq!(s.user, [0x401000, 0x402000, 0x403000]);
        assert_eq!(
            (s.pid, s.tid, s.cpu, s.cgroup_id, s.time_ns),
            (100, 101, 1, 9, 7)
        );
        // Nanoseconds since boot in /proc's clock ticks (USER_HZ 100 on x86-64), truncated.
        assert_eq!(s.start_time, 1234);
        assert_eq!(&s.comm[..3], b"hog");
    }

    #[test]
    fn the_walkers_exact_frames_are_marked_and_their_bit_cleared() {
        const EXACT: u64 = 1 << 63;
        // A handler's stack: leaf, the trampoline, the interrupted frame, its caller.
        let user = [
            0x401005 | EXACT,
            0x7f12_3403_c050 | EXACT,
            0x402000 | EXACT,
            0x403000,
        ];
        let (s, _) = parse_record(&record_ended(
            ember_unwind_result::EMBER_UNWIND_COMPLETE,
            &[],
            &user,
        ))
        .expect("valid");
        assert_eq!(s.user, [0x401005, 0x7f12_3403_c050, 0x402000, 0x403000]);
        assert_eq!(s.user_exact, 0b0111);
        // The kernel's frame-pointer walk copies the stack's words: nothing is read into them.
        let (s, _) = parse_record(&record(&[], &user)).expect("valid");
        assert_eq!(s.user, user);
        assert_eq!(s.user_exact, 0);
    }

    #[test]
    fn python_frames_are_split_out_and_native_bits_renumbered() {
        const EXACT: u64 = 1 << 63;
        // Leaf first: a native leaf, two Python frames (2 slots each), the eval frame, its
        // caller. The tail marks slots 1 and 3 as Python frames and slot 5 as eval.
        let user = [
            0x401005 | EXACT,
            0x7f00_1000,
            (12u64 << 32) | 40,
            0x7f00_2000,
            (3u64 << 32) | 7,
            0x500000,
            0x403000,
        ];
        let mut r = record_ended(ember_unwind_result::EMBER_UNWIND_COMPLETE, &[1], &user);
        r[std::mem::offset_of!(ember_record, py_result)] = ember_py_result::EMBER_PY_OK.0 as u8;
        for word in [0b1010u64, 0, 1 << 5, 0] {
            r.extend_from_slice(&word.to_ne_bytes());
        }
        let (s, _) = parse_record(&r).expect("valid");
        assert_eq!(s.user, [0x401005, 0x500000, 0x403000]);
        assert_eq!(s.user_exact, 0b001);
        assert_eq!(s.user_eval, 0b010);
        assert_eq!(s.py_result, Some(PyWalk::Ok));
        let py = |before, code, unit, fingerprint| PyFrameRef {
            before,
            code,
            unit,
            fingerprint,
        };
        assert_eq!(
            s.python,
            [py(1, 0x7f00_1000, 12, 40), py(1, 0x7f00_2000, 3, 7)]
        );
        // A tail the record claims but does not carry is a short record.
        r.truncate(r.len() - 8);
        assert_eq!(parse_record(&r), None);
    }

    #[test]
    fn rejects_short_or_lying_records() {
        let mut r = record(&[1, 2], &[3]);
        r.truncate(r.len() - 1);
        assert_eq!(parse_record(&r), None);
        assert_eq!(parse_record(&[0u8; 10]), None);
        let mut r = record(&[], &[]);
        r[std::mem::offset_of!(ember_record, kern_frames)] = 200; // > MAX_FRAMES
        assert_eq!(parse_record(&r), None);
    }

    fn offcpu_record(state: u32, path: u32, off_ns: u64, runnable_ns: u64) -> Vec<u8> {
        head_record(ember_offcpu_head {
            off_ns,
            runnable_ns,
            state,
            path,
            syscall: -1,
            ..Default::default()
        })
    }

    fn head_record(head: ember_offcpu_head) -> Vec<u8> {
        // SAFETY: test-only view of a repr(C) POD struct as bytes.
        let mut out = unsafe {
            std::slice::from_raw_parts(
                (&head as *const ember_offcpu_head).cast::<u8>(),
                OFFCPU_HEAD,
            )
        }
        .to_vec();
        out.extend(record(&[0xffff_0001], &[0x401000]));
        out
    }

    fn block(data: &[u8], scale: OffCpuScale) -> (Vec<Sample>, u8) {
        match parse_offcpu_record(data, scale) {
            Some((OffRecord::Block { samples, .. }, flags)) => (samples, flags),
            other => panic!("not a block: {other:?}"),
        }
    }

    #[test]
    fn wakers_futex_waits_and_kernel_locks() {
        let one = OffCpuScale {
            exact: 1.0,
            fallback: 10.0,
        };
        let waker = head_record(ember_offcpu_head {
            off_ns: 5000,
            kind: ember_offcpu_kind::EMBER_OFFCPU_WAKER.0,
            key: 77,
            path: 1,
            ..Default::default()
        });
        match parse_offcpu_record(&waker, one) {
            Some((OffRecord::Waker { key: 77, sample }, 0)) => {
                assert_eq!(sample.off_cpu, None, "a waker is no block");
                assert_eq!((sample.pid, sample.user.as_slice()), (100, &[0x401000][..]));
            }
            other => panic!("not the waker: {other:?}"),
        }
        // A futex wait: both parts are lock delay.
        let futex = head_record(ember_offcpu_head {
            off_ns: 700,
            runnable_ns: 300,
            syscall: FUTEX_SYSCALLS[0],
            ..Default::default()
        });
        let (samples, _) = block(&futex, one);
        let locks: Vec<_> = samples.iter().map(|s| s.lock).collect();
        assert_eq!(locks, [Some(LockWait::Futex), Some(LockWait::Futex)]);
        let (samples, _) = block(&offcpu_record(0, 0, 700, 300), one);
        assert!(samples.iter().all(|s| s.lock.is_none()), "not in a futex");
        // Kernel lock contention: never scaled (not drawn), always a lock wait.
        let klock = head_record(ember_offcpu_head {
            off_ns: 9000,
            path: 1,
            kind: ember_offcpu_kind::EMBER_OFFCPU_KLOCK.0,
            ..Default::default()
        });
        match parse_offcpu_record(&klock, one) {
            Some((OffRecord::KernelLock { sample: s, .. }, _)) => {
                assert_eq!(s.lock, Some(LockWait::Kernel));
                assert_eq!(s.off_cpu.map(|o| o.ns), Some(9000));
            }
            other => panic!("not a kernel lock: {other:?}"),
        }
        let mut bad = klock.clone();
        bad[24] = 9; // kind
        assert!(parse_offcpu_record(&bad, one).is_none(), "unknown kind");
    }

    #[test]
    fn offcpu_records_split_at_the_wakeup_and_scale() {
        let one = OffCpuScale {
            exact: 1.0,
            fallback: 1.0,
        };
        let (samples, _) = block(&offcpu_record(0, 0, 700, 300), one);
        let got: Vec<_> = samples.iter().map(|s| s.off_cpu).collect();
        assert_eq!(
            got,
            [
                Some(OffCpu {
                    state: OffState::Sleep,
                    ns: 700,
                    blocks: 1,
                }),
                Some(OffCpu {
                    state: OffState::Runnable,
                    ns: 300,
                    blocks: 1,
                }),
            ]
        );
        assert_eq!(samples[1].user, [0x401000], "both halves keep the stack");
        let scale = OffCpuScale {
            exact: 2.0,
            fallback: 20.0,
        };
        let ns = |path| {
            let (samples, _) = block(&offcpu_record(1, path, 1000, 0), scale);
            samples.iter().map(|s| s.off_cpu).collect::<Vec<_>>()
        };
        let disk = |ns| {
            vec![Some(OffCpu {
                state: OffState::Disk,
                ns,
                blocks: 1,
            })]
        };
        assert_eq!(
            ns(0),
            disk(2000),
            "no wakeup part; scaled by 1 / sample rate"
        );
        assert_eq!(ns(2), disk(2000), "a kernel thread's block is taken whole");
        assert_eq!(ns(1), disk(20000), "the fallback's blocks: by its rate too");
        assert!(
            parse_offcpu_record(&offcpu_record(1, 3, 1000, 0), scale).is_none(),
            "unknown path"
        );
        assert!(
            parse_offcpu_record(&offcpu_record(9, 0, 1, 0), one).is_none(),
            "unknown state"
        );
        let mut short = offcpu_record(2, 0, 5, 0);
        short.truncate(OFFCPU_HEAD + 8);
        assert!(parse_offcpu_record(&short, one).is_none());
        assert_eq!(sample_threshold(1.0), 1 << 32);
        assert_eq!(sample_threshold(0.5), 1 << 31);
    }

    #[test]
    fn header_matches_c_layout() {
        // time_ns, cgroup_id, start_ns, pid, tid, cpu, kern_frames, user_frames, comm[16],
        // user_result, user_flags, py_result, pad0, pad1
        assert_eq!(
            HEADER,
            8 + 8 + 8 + 4 + 4 + 4 + 2 + 2 + 16 + 1 + 1 + 1 + 1 + 4
        );
    }
}
