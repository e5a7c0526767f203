//! The queues out of the sampler: batches of samples to the aggregator, under a byte
//! budget ([`QueueBytes`]) besides the channel's count, and the unwind loader's work
//! ([`work_queue`]): the sampler's asks and the kernel's task records, in one queue.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, TrySendError};
use std::sync::Arc;
use std::time::Duration;

use super::tasks::TaskEvent;
use crate::model::Sample;

/// What the sampler asks the unwind loader for, on behalf of a sampled process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ask {
    /// The sampler holds no ranges for this process yet: read its mappings and load them.
    Process(u32),
    /// A pc of this process is in none of its ranges (a library loaded since): read them again.
    Remap(u32),
    /// A process the exec hook wrote ranges for, sampled before the loader read it: read it
    /// now, ahead of the paced reads of new processes (it may live a few milliseconds, and
    /// its samples are named from that read).
    Unread {
        /// The process.
        pid: u32,
        /// When the sample that asked was taken (CLOCK_MONOTONIC ns): a read started
        /// since then already covers it.
        at: u64,
    },
}

/// Samples moved between stages together.
pub type Batch = Vec<Sample>;

/// The bytes a batch holds (samples and their frames), as charged to [`QueueBytes`].
pub fn batch_bytes(b: &Batch) -> u64 {
    let frames: usize = b
        .iter()
        .map(|s| {
            let waker = s
                .waker
                .as_ref()
                .map_or(0, |w| w.kernel.capacity() + w.user.capacity());
            s.kernel.capacity() + s.user.capacity() + waker
        })
        .sum();
    (b.capacity() * std::mem::size_of::<Sample>() + frames * 8) as u64
}

/// The byte budget of the sample queue, shared by its two ends: capture takes a batch's
/// bytes before sending it (or drops it, counted), aggregation gives them back on receipt.
/// The queue's batch count alone would let 1,024 batches of a ring buffer's size each pile
/// up behind a slow aggregator.
#[derive(Debug, Clone)]
pub struct QueueBytes {
    held: Arc<std::sync::atomic::AtomicU64>,
    cap: u64,
}

impl QueueBytes {
    /// A budget of `cap` bytes.
    pub fn new(cap: u64) -> Self {
        Self {
            held: Arc::default(),
            cap,
        }
    }

    /// Takes `n` bytes if they fit (an empty queue takes any one batch).
    pub fn try_take(&self, n: u64) -> bool {
        self.held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                (held == 0 || held.saturating_add(n) <= self.cap).then(|| held.saturating_add(n))
            })
            .is_ok()
    }

    /// Takes `n` bytes whether or not they fit (a blocking send).
    pub fn take(&self, n: u64) {
        self.held.fetch_add(n, Ordering::AcqRel);
    }

    /// Gives back `n` bytes (a batch received, or one that was not sent after all).
    pub fn give(&self, n: u64) {
        let _ = self
            .held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                Some(held.saturating_sub(n))
            });
    }

    /// Bytes held now.
    pub fn held(&self) -> u64 {
        self.held.load(Ordering::Acquire)
    }
}

/// Work waiting for the unwind loader (asks and task records); more is dropped (counted):
/// an ask is asked again a second later, a lost task record makes the loader sweep.
pub const WORK_QUEUE: usize = 16_384;

/// What the unwind loader is sent, in one queue so that it sleeps until either comes.
#[derive(Debug)]
pub enum Work {
    /// From the sampler, on behalf of a sampled process.
    Ask(Ask),
    /// From the kernel's task records (exec, mmap, fork, exit).
    Task(TaskEvent),
    /// Nothing to do: look at the halt flag (sent when the agent stops).
    Wake,
}

/// The sending side of the loader's queue: bounded by a count, while its memory grows
/// only as it fills (a `sync_channel` of [`WORK_QUEUE`] task records would hold 1.7 MB
/// from the start).
#[derive(Debug, Clone)]
pub struct WorkSender {
    tx: mpsc::Sender<Work>,
    queued: Arc<AtomicUsize>,
    cap: usize,
}

/// The receiving side of the loader's queue.
#[derive(Debug)]
pub struct WorkReceiver {
    rx: Receiver<Work>,
    queued: Arc<AtomicUsize>,
}

/// A queue of at most `cap` pieces of work for the unwind loader.
pub fn work_queue(cap: usize) -> (WorkSender, WorkReceiver) {
    let (tx, rx) = mpsc::channel();
    let queued = Arc::new(AtomicUsize::new(0));
    (
        WorkSender {
            tx,
            queued: queued.clone(),
            cap,
        },
        WorkReceiver { rx, queued },
    )
}

impl WorkSender {
    /// Queues `work` unless `cap` pieces are waiting.
    pub fn try_send(&self, work: Work) -> Result<(), TrySendError<Work>> {
        if self.queued.fetch_add(1, Ordering::AcqRel) >= self.cap {
            self.queued.fetch_sub(1, Ordering::AcqRel);
            return Err(TrySendError::Full(work));
        }
        self.tx.send(work).map_err(|e| {
            self.queued.fetch_sub(1, Ordering::AcqRel);
            TrySendError::Disconnected(e.0)
        })
    }
}

impl WorkReceiver {
    /// The next piece of work, waiting at most `timeout`.
    pub fn recv_timeout(&self, timeout: Duration) -> Result<Work, mpsc::RecvTimeoutError> {
        let work = self.rx.recv_timeout(timeout)?;
        self.queued.fetch_sub(1, Ordering::AcqRel);
        Ok(work)
    }

    /// The next piece of work if one is waiting.
    pub fn try_recv(&self) -> Result<Work, mpsc::TryRecvError> {
        let work = self.rx.try_recv()?;
        self.queued.fetch_sub(1, Ordering::AcqRel);
        Ok(work)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_loader_queue_is_bounded_and_gives_room_back() {
        let (tx, rx) = work_queue(2);
        assert!(tx.try_send(Work::Wake).is_ok());
        assert!(tx.clone().try_send(Work::Ask(Ask::Process(1))).is_ok());
        assert!(matches!(
            tx.try_send(Work::Wake),
            Err(TrySendError::Full(Work::Wake))
        ));
        assert!(matches!(rx.try_recv(), Ok(Work::Wake)));
        assert!(tx.try_send(Work::Wake).is_ok());
        assert!(matches!(
            rx.recv_timeout(Duration::ZERO),
            Ok(Work::Ask(Ask::Process(1)))
        ));
        drop(rx);
        assert!(matches!(
            tx.try_send(Work::Wake),
            Err(TrySendError::Disconnected(_))
        ));
    }
}
