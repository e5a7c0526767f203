//! Parser for the kernel's perf side-band records (`PERF_RECORD_MMAP2`, `COMM`, `FORK`,
//! `EXIT`, `LOST`) as the agent's `TaskWatch` dummy events (`capture/tasks.rs`) write them,
//! and the framing of records in a perf ring's data area.
//!
//! Pure functions over bytes (no I/O, std only), fuzzed (`fuzz/`). The layouts are the ones `include/uapi/linux/perf_event.h` documents for an event
//! opened with `sample_id_all` and `sample_type = PERF_SAMPLE_TID | PERF_SAMPLE_TIME`: every
//! record ends with the 16-byte trailer `{ u32 pid, tid; u64 time; }`. Integers are in the
//! host's byte order.

/// `PERF_RECORD_LOST`.
pub const RECORD_LOST: u32 = 2;
/// `PERF_RECORD_COMM`.
pub const RECORD_COMM: u32 = 3;
/// `PERF_RECORD_EXIT`.
pub const RECORD_EXIT: u32 = 4;
/// `PERF_RECORD_FORK`.
pub const RECORD_FORK: u32 = 7;
/// `PERF_RECORD_MMAP2`.
pub const RECORD_MMAP2: u32 = 10;
/// `PERF_RECORD_MISC_COMM_EXEC`: this COMM record comes from an execve.
pub const MISC_COMM_EXEC: u16 = 1 << 13;
/// `PERF_RECORD_MISC_MMAP_BUILD_ID`: this MMAP2 record carries a build id, not dev/inode.
pub const MISC_MMAP_BUILD_ID: u16 = 1 << 14;

/// `struct perf_event_header`: type, misc, size.
const HEADER: usize = 8;
/// The `sample_id_all` trailer for `PERF_SAMPLE_TID | PERF_SAMPLE_TIME`.
const TRAILER: usize = 16;
/// MMAP2's fixed fields after the header: pid, tid, addr, len, pgoff, 24 bytes of
/// dev/inode (or build id), prot, flags.
const MMAP2_FIXED: usize = 8 + 8 * 3 + 24 + 8;
/// The kernel names a mapping with `d_path` into a `PATH_MAX` buffer, NUL included.
pub const MAX_PATH: usize = 4096;

/// What happened to a process, from the kernel's perf task records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TaskEvent {
    /// execve: the process's previous mappings are gone; its new image's MMAP2 records follow.
    Exec {
        /// Process id (after exec, also its thread id).
        pid: u32,
        /// Thread id.
        tid: u32,
        /// CLOCK_MONOTONIC nanoseconds.
        time_ns: u64,
        /// The new command name, NUL-padded, as a sample's `comm`.
        comm: [u8; 16],
    },
    /// A new executable mapping (file-backed or anonymous, e.g. JIT code).
    Mmap(Mmap),
    /// A new process (not a thread): it starts with its parent's mappings.
    Fork {
        /// The new process.
        pid: u32,
        /// The process that forked it.
        ppid: u32,
        /// CLOCK_MONOTONIC nanoseconds.
        time_ns: u64,
    },
    /// A process ended (its thread-group leader exited).
    Exit {
        /// The process.
        pid: u32,
        /// CLOCK_MONOTONIC nanoseconds.
        time_ns: u64,
    },
}

impl TaskEvent {
    /// When it happened, CLOCK_MONOTONIC nanoseconds.
    pub fn time_ns(&self) -> u64 {
        match self {
            Self::Exec { time_ns, .. }
            | Self::Fork { time_ns, .. }
            | Self::Exit { time_ns, .. } => *time_ns,
            Self::Mmap(m) => m.time_ns,
        }
    }
}

/// One executable mapping, from a `PERF_RECORD_MMAP2`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mmap {
    /// Process id.
    pub pid: u32,
    /// Thread that mapped it.
    pub tid: u32,
    /// CLOCK_MONOTONIC nanoseconds.
    pub time_ns: u64,
    /// First address.
    pub start: u64,
    /// Length in bytes.
    pub len: u64,
    /// File offset of `start` (for anonymous memory, the address in pages; meaningless).
    pub pgoff: u64,
    /// Device of the file (major, minor); zero when the kernel sent a build id instead.
    pub dev: (u32, u32),
    /// Inode of the file; zero when the kernel sent a build id instead.
    pub inode: u64,
    /// Inode generation; zero when the kernel sent a build id instead.
    pub inode_generation: u64,
    /// `PROT_*` bits.
    pub prot: u32,
    /// `MAP_*` bits.
    pub flags: u32,
    /// The path as the kernel named it (`d_path`, or `//anon`, `[heap]`, ...), lossy UTF-8,
    /// at most [`MAX_PATH`] bytes.
    pub path: String,
}

/// One record, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    /// A task event worth reporting.
    Task(TaskEvent),
    /// `PERF_RECORD_LOST`: the ring was full and the kernel dropped this many records.
    Lost(u64),
}

/// Why a record was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reject {
    /// The header's size is not the record's length, below the header, or not a multiple of 8.
    BadSize,
    /// Shorter than its type's fixed fields and trailer.
    Short,
    /// A string (path, command name) without its terminating NUL.
    Unterminated,
    /// A path longer than the kernel can write.
    PathTooLong,
}

/// Parses one whole record (header included). `Ok(None)` for records that carry nothing to
/// report: other types, COMM without exec (a rename), FORK of a thread, EXIT of a non-leader.
pub fn parse(rec: &[u8]) -> Result<Option<Record>, Reject> {
    let (kind, misc, size) = header(rec).ok_or(Reject::BadSize)?;
    if size != rec.len() || size < HEADER || size % 8 != 0 {
        return Err(Reject::BadSize);
    }
    let body = &rec[HEADER..];
    let trailer_time = |need: usize| -> Result<u64, Reject> {
        if body.len() < need + TRAILER {
            return Err(Reject::Short);
        }
        Ok(u64_at(body, body.len() - 8))
    };
    match kind {
        RECORD_MMAP2 => {
            let time_ns = trailer_time(MMAP2_FIXED + 8)?;
            let name = &body[MMAP2_FIXED..body.len() - TRAILER];
            let path = c_string(name).ok_or(Reject::Unterminated)?;
            if path.len() >= MAX_PATH {
                return Err(Reject::PathTooLong);
            }
            let (dev, inode, inode_generation) = if misc & MISC_MMAP_BUILD_ID != 0 {
                ((0, 0), 0, 0)
            } else {
                (
                    (u32_at(body, 32), u32_at(body, 36)),
                    u64_at(body, 40),
                    u64_at(body, 48),
                )
            };
            Ok(Some(Record::Task(TaskEvent::Mmap(Mmap {
                pid: u32_at(body, 0),
                tid: u32_at(body, 4),
                time_ns,
                start: u64_at(body, 8),
                len: u64_at(body, 16),
                pgoff: u64_at(body, 24),
                dev,
                inode,
                inode_generation,
                prot: u32_at(body, 56),
                flags: u32_at(body, 60),
                path: String::from_utf8_lossy(path).into_owned(),
            }))))
        }
        RECORD_COMM => {
            let time_ns = trailer_time(8 + 8)?;
            if misc & MISC_COMM_EXEC == 0 {
                return Ok(None);
            }
            let name = c_string(&body[8..body.len() - TRAILER]).ok_or(Reject::Unterminated)?;
            let mut comm = [0u8; 16];
            // TASK_COMM_LEN is 16 with the NUL: keep 15 bytes so the result stays terminated.
            let n = name.len().min(15);
            comm[..n].copy_from_slice(&name[..n]);
            Ok(Some(Record::Task(TaskEvent::Exec {
                pid: u32_at(body, 0),
                tid: u32_at(body, 4),
                time_ns,
                comm,
            })))
        }
        RECORD_FORK | RECORD_EXIT => {
            trailer_time(24)?;
            let (pid, ppid, tid) = (u32_at(body, 0), u32_at(body, 4), u32_at(body, 8));
            let time_ns = u64_at(body, 16);
            Ok(match kind {
                RECORD_FORK if pid != ppid => {
                    Some(Record::Task(TaskEvent::Fork { pid, ppid, time_ns }))
                }
                RECORD_EXIT if pid == tid => Some(Record::Task(TaskEvent::Exit { pid, time_ns })),
                _ => None,
            })
        }
        RECORD_LOST => {
            trailer_time(16)?;
            Ok(Some(Record::Lost(u64_at(body, 8))))
        }
        _ => Ok(None),
    }
}

/// The header of a record: (type, misc, size).
pub fn header(bytes: &[u8]) -> Option<(u32, u16, usize)> {
    let h = bytes.get(..HEADER)?;
    Some((
        u32::from_ne_bytes([h[0], h[1], h[2], h[3]]),
        u16::from_ne_bytes([h[4], h[5]]),
        usize::from(u16::from_ne_bytes([h[6], h[7]])),
    ))
}

/// A record whose framing makes no sense; the reader must skip to `data_head`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Malformed;

/// Copies the record that starts at `tail` out of a ring's data area of `size` bytes (a
/// power of two) into `buf`, joining the two pieces of a record that wraps around the end.
/// `copy(offset, dst)` fills `dst` from the data area at `offset`; it is only asked for
/// `offset + dst.len() <= size`. Returns the record's length (how far to move `tail`).
///
/// Refuses a record whose size is below the header, not a multiple of 8, larger than the
/// data area or reaching past `head`, and a `head` more than `size` ahead of `tail`.
pub fn take_record(
    size: u64,
    head: u64,
    tail: u64,
    mut copy: impl FnMut(usize, &mut [u8]),
    buf: &mut Vec<u8>,
) -> Result<usize, Malformed> {
    let avail = head.wrapping_sub(tail);
    if !size.is_power_of_two() || size < HEADER as u64 || avail < HEADER as u64 || avail > size {
        return Err(Malformed);
    }
    let mut read = |start: u64, len: usize, buf: &mut Vec<u8>| {
        buf.clear();
        buf.resize(len, 0);
        // Both casts are below `size`, which indexes memory ember mapped.
        let off = (start & (size - 1)) as usize;
        let first = len.min(size as usize - off);
        copy(off, &mut buf[..first]);
        if first < len {
            copy(0, &mut buf[first..]);
        }
    };
    read(tail, HEADER, buf);
    let (_, _, len) = header(buf).ok_or(Malformed)?;
    if len < HEADER || len % 8 != 0 || len as u64 > size || len as u64 > avail {
        return Err(Malformed);
    }
    read(tail, len, buf);
    Ok(len)
}

/// The bytes before the first NUL, `None` when there is none.
fn c_string(bytes: &[u8]) -> Option<&[u8]> {
    let end = bytes.iter().position(|&b| b == 0)?;
    Some(&bytes[..end])
}

/// Callers check the length first: `at + 4 <= bytes.len()`.
fn u32_at(bytes: &[u8], at: usize) -> u32 {
    let mut b = [0; 4];
    b.copy_from_slice(&bytes[at..at + 4]);
    u32::from_ne_bytes(b)
}

/// Callers check the length first: `at + 8 <= bytes.len()`.
fn u64_at(bytes: &[u8], at: usize) -> u64 {
    let mut b = [0; 8];
    b.copy_from_slice(&bytes[at..at + 8]);
    u64::from_ne_bytes(b)
}

/// Builders of records as the kernel writes them, for tests here and in the agent's
/// `capture/tasks.rs`.
#[cfg(any(test, feature = "testing"))]
pub mod build {
    use super::*;

    fn finish(kind: u32, misc: u16, mut body: Vec<u8>, pid: u32, tid: u32, time: u64) -> Vec<u8> {
        body.extend_from_slice(&pid.to_ne_bytes());
        body.extend_from_slice(&tid.to_ne_bytes());
        body.extend_from_slice(&time.to_ne_bytes());
        let size = (HEADER + body.len()) as u16;
        let mut rec = Vec::new();
        rec.extend_from_slice(&kind.to_ne_bytes());
        rec.extend_from_slice(&misc.to_ne_bytes());
        rec.extend_from_slice(&size.to_ne_bytes());
        rec.extend_from_slice(&body);
        rec
    }

    /// A NUL-terminated string padded to 8 bytes.
    fn padded(s: &[u8]) -> Vec<u8> {
        let mut v = s.to_vec();
        v.push(0);
        while v.len() % 8 != 0 {
            v.push(0);
        }
        v
    }

    /// An MMAP2 record of `path` at `start`, with dev 8:1, inode 42, generation 3.
    pub fn mmap2(pid: u32, start: u64, path: &[u8], time: u64) -> Vec<u8> {
        let mut b = Vec::new();
        for v in [pid, pid + 1] {
            b.extend_from_slice(&v.to_ne_bytes());
        }
        for v in [start, 0x2000, 0x1000] {
            b.extend_from_slice(&v.to_ne_bytes());
        }
        for v in [8u32, 1] {
            b.extend_from_slice(&v.to_ne_bytes());
        }
        for v in [42u64, 3] {
            b.extend_from_slice(&v.to_ne_bytes());
        }
        for v in [
            5u32, /* PROT_READ | PROT_EXEC */
            2,    /* MAP_PRIVATE */
        ] {
            b.extend_from_slice(&v.to_ne_bytes());
        }
        b.extend_from_slice(&padded(path));
        finish(RECORD_MMAP2, 2, b, pid, pid + 1, time)
    }

    /// A COMM record.
    pub fn comm(pid: u32, name: &[u8], exec: bool, time: u64) -> Vec<u8> {
        let mut b = Vec::new();
        for v in [pid, pid] {
            b.extend_from_slice(&v.to_ne_bytes());
        }
        b.extend_from_slice(&padded(name));
        let misc = if exec { MISC_COMM_EXEC | 2 } else { 2 };
        finish(RECORD_COMM, misc, b, pid, pid, time)
    }

    /// A FORK or EXIT record.
    pub fn task(kind: u32, pid: u32, ppid: u32, tid: u32, time: u64) -> Vec<u8> {
        let mut b = Vec::new();
        for v in [pid, ppid, tid, ppid] {
            b.extend_from_slice(&v.to_ne_bytes());
        }
        b.extend_from_slice(&time.to_ne_bytes());
        finish(kind, 0, b, pid, tid, time)
    }

    /// A LOST record.
    pub fn lost(lost: u64) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&7u64.to_ne_bytes());
        b.extend_from_slice(&lost.to_ne_bytes());
        finish(RECORD_LOST, 0, b, 0, 0, 0)
    }
}

#[cfg(test)]
mod tests {
    use super::build::*;
    use super::*;

    fn task(rec: &[u8]) -> Option<TaskEvent> {
        match parse(rec).expect("valid") {
            Some(Record::Task(t)) => Some(t),
            Some(Record::Lost(_)) => panic!("not a task event"),
            None => None,
        }
    }

    #[test]
    fn parses_mmap2() {
        let Some(TaskEvent::Mmap(m)) = task(&mmap2(10, 0x40_0000, b"/usr/bin/true", 99)) else {
            panic!("not an mmap");
        };
        assert_eq!(
            m,
            Mmap {
                pid: 10,
                tid: 11,
                time_ns: 99,
                start: 0x40_0000,
                len: 0x2000,
                pgoff: 0x1000,
                dev: (8, 1),
                inode: 42,
                inode_generation: 3,
                prot: 5,
                flags: 2,
                path: "/usr/bin/true".into(),
            }
        );
        // A path of exactly 7 bytes leaves one NUL of padding; 8 bytes need a whole word.
        for path in [&b"/a/b/cd"[..], b"/a/b/cde", b"//anon", b""] {
            let Some(TaskEvent::Mmap(m)) = task(&mmap2(1, 0, path, 0)) else {
                panic!("not an mmap");
            };
            assert_eq!(m.path.as_bytes(), path);
        }
        // Invalid UTF-8 is replaced, not refused.
        let Some(TaskEvent::Mmap(m)) = task(&mmap2(1, 0, b"/x\xff", 0)) else {
            panic!("not an mmap");
        };
        assert_eq!(m.path, "/x\u{fffd}");
    }

    #[test]
    fn build_id_mmap2_has_no_inode() {
        let mut rec = mmap2(10, 0x1000, b"/lib/x.so", 5);
        rec[4..6].copy_from_slice(&(MISC_MMAP_BUILD_ID | 2).to_ne_bytes());
        let Some(TaskEvent::Mmap(m)) = task(&rec) else {
            panic!("not an mmap");
        };
        assert_eq!((m.dev, m.inode, m.inode_generation), ((0, 0), 0, 0));
        assert_eq!((m.path.as_str(), m.prot), ("/lib/x.so", 5));
    }

    #[test]
    fn parses_comm_only_on_exec() {
        assert_eq!(
            task(&comm(7, b"true", true, 123)),
            Some(TaskEvent::Exec {
                pid: 7,
                tid: 7,
                time_ns: 123,
                comm: *b"true\0\0\0\0\0\0\0\0\0\0\0\0",
            })
        );
        assert_eq!(task(&comm(7, b"renamed", false, 1)), None);
        // A longer name than the kernel writes is cut to 15 bytes and stays terminated.
        let Some(TaskEvent::Exec { comm: c, .. }) = task(&comm(7, &[b'a'; 40], true, 1)) else {
            panic!("not an exec");
        };
        assert_eq!(&c[..15], &[b'a'; 15]);
        assert_eq!(c[15], 0);
    }

    #[test]
    fn fork_and_exit_of_processes_only() {
        assert_eq!(
            task(&task_rec(RECORD_FORK, 20, 10, 20, 5)),
            Some(TaskEvent::Fork {
                pid: 20,
                ppid: 10,
                time_ns: 5
            })
        );
        // A new thread: same thread group as its creator.
        assert_eq!(task(&task_rec(RECORD_FORK, 10, 10, 21, 5)), None);
        assert_eq!(
            task(&task_rec(RECORD_EXIT, 20, 1, 20, 6)),
            Some(TaskEvent::Exit {
                pid: 20,
                time_ns: 6
            })
        );
        // A thread that is not the leader.
        assert_eq!(task(&task_rec(RECORD_EXIT, 20, 1, 22, 6)), None);
    }

    fn task_rec(kind: u32, pid: u32, ppid: u32, tid: u32, time: u64) -> Vec<u8> {
        super::build::task(kind, pid, ppid, tid, time)
    }

    #[test]
    fn lost_and_other_types() {
        assert_eq!(parse(&lost(17)), Ok(Some(Record::Lost(17))));
        let mut other = lost(1);
        other[..4].copy_from_slice(&9u32.to_ne_bytes()); // PERF_RECORD_SAMPLE
        assert_eq!(parse(&other), Ok(None));
    }

    #[test]
    fn refuses_truncated_and_lying_records() {
        assert_eq!(parse(&[]), Err(Reject::BadSize));
        assert_eq!(parse(&[0; 7]), Err(Reject::BadSize));
        let rec = mmap2(1, 0, b"/bin/sh", 0);
        // Cut short: the header's size no longer matches.
        assert_eq!(parse(&rec[..rec.len() - 8]), Err(Reject::BadSize));
        // A size that lies about the slice, or is not a multiple of 8.
        for size in [0u16, 4, 12, rec.len() as u16 + 8] {
            let mut r = rec.clone();
            r[6..8].copy_from_slice(&size.to_ne_bytes());
            assert_eq!(parse(&r), Err(Reject::BadSize), "size {size}");
        }
        // Consistent sizes but too short for the type: every type, every shorter length.
        for rec in [
            mmap2(1, 0, b"/bin/sh", 0),
            comm(1, b"sh", true, 0),
            task_rec(RECORD_FORK, 2, 1, 2, 0),
            task_rec(RECORD_EXIT, 2, 1, 2, 0),
            lost(3),
        ] {
            let mut len = rec.len() - 8;
            while len >= HEADER {
                let mut r = rec[..len].to_vec();
                r[6..8].copy_from_slice(&(len as u16).to_ne_bytes());
                assert!(
                    matches!(parse(&r), Err(Reject::Short | Reject::Unterminated)),
                    "{len} of {}",
                    rec.len()
                );
                len -= 8;
            }
        }
        // No NUL in the path.
        let mut r = mmap2(1, 0, b"1234567", 0);
        let name = MMAP2_FIXED + HEADER;
        r[name + 7] = b'8';
        assert_eq!(parse(&r), Err(Reject::Unterminated));
    }

    #[test]
    fn refuses_overlong_paths() {
        let long = vec![b'a'; MAX_PATH];
        assert_eq!(parse(&mmap2(1, 0, &long, 0)), Err(Reject::PathTooLong));
        assert!(parse(&mmap2(1, 0, &long[..MAX_PATH - 1], 0)).is_ok());
    }

    /// A ring of `size` bytes holding `recs` from byte `start` on (wrapping); returns the
    /// data area and the head.
    fn ring(size: usize, start: u64, recs: &[Vec<u8>]) -> (Vec<u8>, u64) {
        let mut data = vec![0xeeu8; size];
        let mut pos = start;
        for r in recs {
            for &b in r {
                data[(pos % size as u64) as usize] = b;
                pos += 1;
            }
        }
        (data, pos)
    }

    fn drain(data: &[u8], head: u64, mut tail: u64) -> (Vec<Record>, u32) {
        let mut buf = Vec::new();
        let (mut out, mut malformed) = (Vec::new(), 0);
        let copy = |off: usize, dst: &mut [u8]| dst.copy_from_slice(&data[off..off + dst.len()]);
        while tail != head {
            match take_record(data.len() as u64, head, tail, copy, &mut buf) {
                Ok(len) => {
                    out.extend(parse(&buf).expect("valid"));
                    tail += len as u64;
                }
                Err(Malformed) => {
                    malformed += 1;
                    tail = head;
                }
            }
        }
        (out, malformed)
    }

    #[test]
    fn records_wrap_around_the_ring() {
        let recs = [
            comm(5, b"true", true, 1),
            mmap2(5, 0x1000, b"/usr/lib/x86_64-linux-gnu/libc.so.6", 2),
            task_rec(RECORD_EXIT, 5, 1, 5, 3),
        ];
        let total: usize = recs.iter().map(Vec::len).sum();
        // Start every 8 bytes through the ring, so each record straddles its end once.
        for start in (0..256u64).step_by(8) {
            let (data, head) = ring(256, 1 << 40 | start, &recs);
            assert_eq!(head - (1 << 40 | start), total as u64);
            let (out, malformed) = drain(&data, head, 1 << 40 | start);
            assert_eq!(malformed, 0, "start {start}");
            assert_eq!(out.len(), 3, "start {start}");
            assert!(
                matches!(&out[1], Record::Task(TaskEvent::Mmap(m)) if m.path.ends_with("libc.so.6"))
            );
        }
    }

    #[test]
    fn lying_sizes_resynchronise_to_head() {
        let good = task_rec(RECORD_EXIT, 5, 1, 5, 3);
        for size in [0u16, 4, 13, 512, 40_000] {
            let mut bad = good.clone();
            bad[6..8].copy_from_slice(&size.to_ne_bytes());
            let (data, head) = ring(256, 0, &[good.clone(), bad, good.clone()]);
            let (out, malformed) = drain(&data, head, 0);
            assert_eq!((out.len(), malformed), (1, 1), "size {size}");
        }
        // A record longer than what the kernel has published.
        let (data, head) = ring(256, 0, std::slice::from_ref(&good));
        assert_eq!(drain(&data, head - 8, 0), (vec![], 1));
        // head more than a ring ahead of tail, or behind it.
        let mut buf = Vec::new();
        let copy = |_: usize, _: &mut [u8]| {};
        assert_eq!(take_record(256, 300, 0, copy, &mut buf), Err(Malformed));
        assert_eq!(take_record(256, 0, 8, copy, &mut buf), Err(Malformed));
        assert_eq!(take_record(100, 8, 0, copy, &mut buf), Err(Malformed));
    }
}
