//! perf task record parser and ring framing: never panic, never read past what the kernel
//! published, never loop more than once per 8 bytes of ring, and bound every path.
#![no_main]

use ember_parse::perf_record::{header, parse, take_record, Record, TaskEvent, MAX_PATH};
use libfuzzer_sys::fuzz_target;

fn check(rec: &[u8]) {
    if let Ok(Some(Record::Task(TaskEvent::Mmap(m)))) = parse(rec) {
        // Lossy UTF-8 turns each refused byte into 3.
        assert!(m.path.len() < 3 * MAX_PATH);
    }
}

fuzz_target!(|data: &[u8]| {
    // The input as one record, as is.
    check(data);
    let Some((ctl, rest)) = data.split_first_chunk::<8>() else {
        return;
    };
    // The input as one record whose header's size tells the truth, so the fuzzer spends
    // its time in the bodies.
    let mut rec = rest[..rest.len() / 8 * 8].to_vec();
    if let Ok(len) = u16::try_from(rec.len()) {
        if len >= 8 {
            rec[6..8].copy_from_slice(&len.to_ne_bytes());
            check(&rec);
        }
    }

    // The input as a ring's data area, with head and tail from the control bytes.
    let size = rest.len().next_power_of_two().clamp(8, 1 << 16);
    let mut ring = rest.to_vec();
    ring.resize(size, 0);
    let mut tail = u64::from(u32::from_le_bytes([ctl[0], ctl[1], ctl[2], ctl[3]]));
    if ctl[7] & 1 == 1 {
        // Near the end of the u64 range: positions must not overflow.
        tail = u64::MAX - tail;
    }
    let ahead = u64::from(u32::from_le_bytes([ctl[4], ctl[5], ctl[6], 0])) % (size as u64 + 16);
    let head = tail.wrapping_add(ahead);
    let copy = |off: usize, dst: &mut [u8]| {
        assert!(off + dst.len() <= size);
        dst.copy_from_slice(&ring[off..off + dst.len()]);
    };
    let mut buf = Vec::new();
    let mut turns = 0;
    while tail != head {
        turns += 1;
        assert!(turns <= size / 8 + 1, "looping");
        match take_record(size as u64, head, tail, copy, &mut buf) {
            Ok(len) => {
                assert!(len >= 8 && len % 8 == 0 && len as u64 <= head.wrapping_sub(tail));
                assert_eq!(buf.len(), len);
                assert_eq!(header(&buf).map(|h| h.2), Some(len));
                check(&buf);
                tail = tail.wrapping_add(len as u64);
            }
            Err(_) => tail = head,
        }
    }
});
