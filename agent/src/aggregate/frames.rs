//! A stack's frames before and after the process registry names them: the plan of a
//! window's stack (kernel frames as they are, user frames as lookups for the registry,
//! the waker's frames on top) and the frames made of the registry's answers.

use std::collections::HashMap;
use std::sync::Arc;

use crate::model::WAKE_SEPARATOR;
use crate::process::registry::{Lookup, StackAsk, WindowAsk};
use crate::process::table::UserAddr;

use super::{caller, Aggregator, Frame, Key, WakerKey};

/// A frame of a stack before its user addresses are named.
pub(super) enum Slot {
    /// A kernel address, as it is.
    Kernel(u64),
    /// The user frame the window's `i`th lookup names.
    User(usize),
    /// [`WAKE_SEPARATOR`], between a waker's frames and the blocked thread's.
    Separator,
}

/// A window's lookups as its stacks are planned: each user address of a process asked once
/// (stacks share most of their frames), Python frames each time (their reads are counted).
#[derive(Default)]
pub(super) struct Lookups {
    ask: WindowAsk,
    /// The index of each (pid, start time, address) asked.
    addrs: HashMap<(u32, u64, u64), usize, foldhash::fast::RandomState>,
}

impl Lookups {
    /// The index of the lookup of `addr` of `pid` started at `start_time`, asked now if not
    /// yet.
    fn addr(&mut self, (pid, start_time): (u32, u64), addr: u64) -> usize {
        let lookups = &mut self.ask.lookups;
        *self
            .addrs
            .entry((pid, start_time, addr))
            .or_insert_with(|| {
                lookups.push(Lookup::Addr {
                    pid,
                    start_time,
                    addr,
                });
                lookups.len() - 1
            })
    }

    /// The index of a lookup asked every time.
    fn push(&mut self, l: Lookup) -> usize {
        self.ask.lookups.push(l);
        self.ask.lookups.len() - 1
    }

    /// The window's ask.
    pub(super) fn into_ask(self) -> WindowAsk {
        self.ask
    }
}

impl Aggregator {
    /// What the stack of `key` is made of, leaf first, and what the registry is to name
    /// for it, in the order it names them: the waker's frames (if any) outermost first,
    /// then the separator (read leaf first, the waker's stack stands upside down on the
    /// blocked one, as bcc's offwaketime draws it, so a flame graph shows the waker's leaf,
    /// the wakeup, right above the blocked thread's wait), then the kernel frames, then the
    /// user side.
    pub(super) fn plan(&self, key: &Key, lookups: &mut Lookups) -> Vec<Slot> {
        let mut slots = Vec::with_capacity(key.kernel.len() + key.user.len());
        let before = lookups.ask.lookups.len();
        if let Some(w) = &key.waker {
            waker_slots(w, &mut slots, lookups);
        }
        slots.extend(
            key.kernel
                .iter()
                .enumerate()
                .map(|(i, &a)| Slot::Kernel(caller(i, a, false))),
        );
        self.user_slots(key, &mut slots, lookups);
        lookups.ask.stacks.push(StackAsk {
            pid: key.pid,
            start_time: key.start_time,
            lookups: lookups.ask.lookups.len() - before,
        });
        slots
    }

    /// Appends the user side of `key`: each native frame, after the interpreter frames
    /// placed before it; eval loop frames left out where interpreter frames stand for them
    /// (unless `keep_eval_frames`).
    fn user_slots(&self, key: &Key, slots: &mut Vec<Slot>, lookups: &mut Lookups) {
        let hide_eval = !self.keep_eval_frames && !key.python.is_empty();
        let mut py = key.python.iter().peekable();
        for i in 0..=key.user.len() {
            while let Some(f) = py.next_if(|f| usize::from(f.before) <= i) {
                slots.push(Slot::User(lookups.push(Lookup::Python {
                    pid: key.pid,
                    start_time: key.start_time,
                    frame: *f,
                })));
            }
            let Some(&a) = key.user.get(i) else {
                break;
            };
            if hide_eval && i < 128 && key.user_eval >> i & 1 == 1 {
                continue;
            }
            let exact = i < 128 && key.user_exact >> i & 1 == 1;
            let at = caller(i, a, exact);
            slots.push(Slot::User(lookups.addr((key.pid, key.start_time), at)));
        }
    }
}

/// Appends a waker's frames, outermost first, then the separator (see
/// [`Aggregator::plan`]).
fn waker_slots(w: &WakerKey, slots: &mut Vec<Slot>, lookups: &mut Lookups) {
    let start = slots.len();
    slots.extend(
        w.kernel
            .iter()
            .enumerate()
            .map(|(i, &a)| Slot::Kernel(caller(i, a, false))),
    );
    for (i, &a) in w.user.iter().enumerate() {
        let exact = i < 128 && w.user_exact >> i & 1 == 1;
        slots.push(Slot::User(
            lookups.addr((w.pid, w.start_time), caller(i, a, exact)),
        ));
    }
    slots[start..].reverse();
    slots.push(Slot::Separator);
}

/// The frames `slots` stand for, each user frame the registry's answer to its lookup
/// (`addrs`, one per lookup of the window; an answer missing is an unknown address).
pub(super) fn frames_of(slots: Vec<Slot>, addrs: &[UserAddr]) -> Vec<Frame> {
    slots
        .into_iter()
        .map(|s| match s {
            Slot::Kernel(a) => Frame::Kernel(a),
            Slot::User(i) => Frame::User(addrs.get(i).cloned().unwrap_or(UserAddr::Unknown(0))),
            Slot::Separator => Frame::User(UserAddr::Region(Arc::from(WAKE_SEPARATOR), 0)),
        })
        .collect()
}
