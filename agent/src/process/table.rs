//! What ember knows about each sampled process, captured when the pid is first seen.
//!
//! A process may exit long before its window is symbolized, so at first sight ember
//! reads its name and executable mappings and opens every mapped object file. The
//! open file keeps the object readable after the process (or its container) is gone;
//! objects are shared by `(device, inode)` across processes. Addresses are turned
//! into `(object, file offset)` here, while the mapping is known ("normalized").

use crate::process::python::names::PyNames;
use std::collections::{HashMap, HashSet, VecDeque};
use std::fs::File;
use std::os::unix::fs::MetadataExt;

use std::path::PathBuf;
use std::sync::Arc;

use crate::config::Limits;
use crate::metrics::{Cache, Metrics, ProcRead};
use crate::os::procfs::{self, MapsEntry, RegionKind};
use crate::process::object::{Object, ObjectKey};
pub use crate::process::snapshot::Snapshot;
use crate::process::snapshot::{self, exe_id, Mapped, ReadOptions, Region};
use crate::workload::Cgroup;

/// Where a user address points, after normalization.
#[derive(Debug, Clone)]
pub enum UserAddr {
    /// Inside a mapped file, at this file offset.
    Object(Arc<Object>, u64),
    /// Inside a mapping without a usable file (`[vdso]`, anonymous memory such as JIT code,
    /// or a file ember could not open); the label says which.
    Region(Arc<str>, u64),
    /// In no known mapping.
    Unknown(u64),
    /// In JIT code (an anonymous executable region), named from the process's perf map
    /// or jitdump while it was alive.
    Jit(Arc<crate::process::jit::JitFrame>),
    /// An interpreter (Python) frame, named from the process's memory while it was alive.
    Python(Arc<crate::process::python::PyFrame>),
}

/// An exit event: the process `pid` started at `start_time` is gone (it exited, or its pid
/// names another process now). Whatever is kept of it is freed by this event alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exit {
    /// Its pid.
    pub pid: u32,
    /// Its start time (`/proc/PID/stat` field 22), 0 when it was never read.
    pub start_time: u64,
}

#[derive(Debug, Clone)]
enum Target {
    File(Arc<Object>),
    Region(Arc<str>),
}

#[derive(Debug, Clone)]
struct ExecMap {
    start: u64,
    end: u64,
    offset: u64,
    kind: RegionKind,
    target: Target,
}

#[derive(Debug)]
struct Proc {
    start_time: u64,
    name: Arc<str>,
    cgroup: Arc<Cgroup>,
    maps: Vec<ExecMap>,
    last_seen: u64,
    rescanned: u64,
    /// What the JIT stage needs: a JVM? a jitdump?
    jit: crate::process::jit::Hints,
    /// `(device, inode)` of the executable when read, to tell an exec from a rename.
    exe: Option<(u64, u64)>,
    /// A kernel thread (or pid 0, the idle task): its renames are renames.
    kthread: bool,
    /// Its exit record came: forgotten at the end of a window it was not sampled in,
    /// without a look at `/proc`.
    exited: bool,
}

/// Process table, owned by the process registry's thread ([`crate::process::registry`]).
pub struct ProcessTable {
    procs: HashMap<u32, Proc>,
    objects: HashMap<ObjectKey, Arc<Object>>,
    /// `max_processes` and `max_objects` cap the table.
    limits: Limits,
    proc_root: PathBuf,
    window: u64,
    metrics: Metrics,
    /// JIT symbol tables of the processes above, freed with them.
    jit: crate::process::jit::JitTables,
    /// Names of Python frames, per attached process.
    py_names: PyNames,
    /// Snapshots of processes not sampled yet, by pid with the window they came in: taken
    /// when the process is first sampled, dropped a window later (most are never sampled).
    pending: HashMap<u32, (Snapshot, u64)>,
    /// `(last_seen, pid)` in the order pids were last seen, oldest first, so eviction
    /// finds the least recent pid without a scan. Entries go stale when a pid is seen
    /// again or removed (skipped when met); the queue is rebuilt when stale ones pile up.
    recency: VecDeque<(u64, u32)>,
    /// `/proc/PID` reads done (a rename or a move must not make every window pay one).
    reads: u64,
    /// `/proc/PID/stat` reads done by touches to tell a reused pid (only for samples that
    /// carry no start time).
    stat_reads: u64,
    /// Process roots the objects hold, one handle per directory (`st_dev`, `st_ino`): most
    /// processes share a few roots (the host's, one per container).
    roots: HashMap<(u64, u64), Arc<File>>,
    /// ember's own root: objects of processes there get no root of their own, as
    /// `symbols.debug_dirs` on the host already is that root.
    own_root: Option<(u64, u64)>,
}

/// Snapshots of processes not sampled yet that are kept at most.
const MAX_PENDING: usize = 4096;

impl ProcessTable {
    /// An empty table reading the host's `/proc`.
    pub fn new(limits: &Limits, metrics: Metrics) -> Self {
        Self {
            procs: HashMap::new(),
            objects: HashMap::new(),
            limits: limits.clone(),
            proc_root: PathBuf::from("/proc"),
            window: 1,
            jit: crate::process::jit::JitTables::new(
                crate::config::Jit::default(),
                metrics.clone(),
            ),
            py_names: PyNames::new(
                crate::config::Python::default().cache_bytes,
                metrics.clone(),
            ),
            metrics,
            pending: HashMap::new(),
            recency: VecDeque::new(),
            reads: 0,
            stat_reads: 0,
            roots: HashMap::new(),
            own_root: std::fs::metadata("/proc/self/root")
                .ok()
                .map(|m| (m.dev(), m.ino())),
        }
    }

    /// The shared handle of `root` (a process's root directory), `None` for ember's own.
    fn share_root(&mut self, root: Option<File>) -> Option<Arc<File>> {
        let root = root?;
        let m = root.metadata().ok()?;
        let id = (m.dev(), m.ino());
        if Some(id) == self.own_root {
            return None;
        }
        Some(
            self.roots
                .entry(id)
                .or_insert_with(|| Arc::new(root))
                .clone(),
        )
    }

    /// Notes that `pid` was last seen in `window` (for eviction order).
    fn seen_in(&mut self, pid: u32, window: u64) {
        self.recency.push_back((window, pid));
        if self.recency.len() > 2 * self.procs.len() + 1024 {
            let procs = &self.procs;
            self.recency
                .retain(|(w, pid)| procs.get(pid).is_some_and(|p| p.last_seen == *w));
        }
    }

    /// Inserts `proc` for `pid`, keeping the eviction order.
    fn put(&mut self, pid: u32, proc: Proc) {
        let seen = proc.last_seen;
        self.procs.insert(pid, proc);
        self.seen_in(pid, seen);
    }

    /// Replaces the JIT settings (the default reads perf maps and jitdumps, no JVM refresh).
    pub fn set_jit(&mut self, settings: crate::config::Jit) {
        self.jit = crate::process::jit::JitTables::new(settings, self.metrics.clone());
    }

    /// Notes that thread `tid` of `pid` was sampled in the current window (named `comm`, in
    /// cgroup v2 `cgroup_id`, its process started at `start_time`, 0 when unknown), reading
    /// the process if it is new, has exec'd since, or is another process on the pid.
    pub fn touch(&mut self, pid: u32, tid: u32, comm: &[u8; 16], cgroup_id: u64, start_time: u64) {
        let window = self.window;
        if let Some(p) = self.procs.get_mut(&pid) {
            // A sample of a process older than the table's on this pid: a late sample of
            // the process the pid's new one replaced. It is named unknown ([`Self::find`]);
            // nothing of the new one changes.
            if start_time != 0 && start_time < p.start_time {
                return;
            }
            let first_this_window = p.last_seen != window;
            p.last_seen = window;
            // A sample from another cgroup than the one this pid was read in is another
            // process on a reused pid (or one moved between cgroups): read it again.
            let moved = p.cgroup.v2_id != 0 && cgroup_id != 0 && p.cgroup.v2_id != cgroup_id;
            // A process is its pid and its start time: a pid reused in the same cgroup (or
            // on cgroup v1, where samples carry no cgroup id) under the same name is another
            // process all the same. The sample carries its process's start time (the
            // kernel's): a newer one than the table's is another process on the pid, read
            // again now, without a look at /proc/PID/stat. A sample without one (a kernel
            // that lacks it) has the start time read once a window, not at every sample.
            let reused = if start_time != 0 {
                start_time != p.start_time
            } else {
                first_this_window && !moved && {
                    self.stat_reads += 1;
                    procfs::start_time(&self.proc_root, pid).is_some_and(|t| t != p.start_time)
                }
            };
            // Another process for certain (both start times known): read even if this
            // window read the pid already (the old one's), once per process on the pid.
            let replaced = reused && start_time != 0 && p.start_time != 0;
            let moved = moved || reused;
            // The leader renamed may be an exec (a new program with new mappings) or just
            // a rename (prctl, which a process may do at will, so it must stay cheap): the
            // executable's identity, one stat, tells them apart.
            let name_len = comm.iter().position(|&b| b == 0).unwrap_or(comm.len());
            let comm = &comm[..name_len];
            let renamed = tid == pid && p.name.as_bytes() != comm;
            let mut reread = moved;
            // Another executable than the one read: an exec, read again at once even if
            // this window read the process already (a child sampled between fork and exec
            // was read with its parent's program). Bounded by the execs it does.
            let mut exec = false;
            // A kernel thread renames itself with its work and never execs (with off-CPU
            // on, kworkers and the idle task wake threads hundreds of times a window); a
            // process whose executable was not read has nothing to compare with.
            if renamed && !moved {
                let now = if p.kthread {
                    p.exe
                } else {
                    exe_id(&self.proc_root, pid)
                };
                if p.kthread || (p.exe.is_some() && now == p.exe) {
                    p.name = Arc::from(String::from_utf8_lossy(comm).as_ref());
                } else {
                    reread = true;
                    exec = p.exe.is_some() && now.is_some();
                }
            }
            if first_this_window {
                self.seen_in(pid, window);
            }
            let Some(p) = self.procs.get_mut(&pid) else {
                return;
            };
            if !reread || (p.rescanned == window && !exec && !replaced) {
                return;
            }
            p.rescanned = window;
            let old_start = p.start_time;
            if let Some(mut fresh) = self.read_process(pid) {
                if let Some(cg) = Arc::get_mut(&mut fresh.cgroup) {
                    cg.v2_id = cgroup_id;
                }
                // A new program: whatever JIT symbols the old one had are meaningless.
                self.jit.forget(pid);
                if fresh.start_time != old_start {
                    // Another process on this pid: the old one's Python names go (its
                    // exec keeps them: the loader's read of the new program attaches).
                    self.py_names.forget(pid);
                }
                self.jit.seen(pid, &fresh.jit, window);
                self.put(pid, fresh);
                self.gc_objects();
            }
            return;
        }
        if let Some((snap, _)) = self.pending.remove(&pid) {
            // The unwind loader read it at exec: no need to read /proc (it may be gone).
            self.take(snap);
            if let Some(p) = self.procs.get_mut(&pid) {
                p.last_seen = window;
                if let Some(cg) = Arc::get_mut(&mut p.cgroup) {
                    cg.v2_id = cgroup_id;
                }
                self.seen_in(pid, window);
            }
            return;
        }
        if self.procs.len() >= self.limits.max_processes {
            self.evict_least_recent();
        }
        // A process gone already (short-lived) is kept without maps: the unwind loader's
        // snapshot of it, taken while it lived, may still come (`adopt`).
        let mut proc = self.read_process(pid).unwrap_or_else(|| Proc {
            start_time: 0,
            name: Arc::from(""),
            cgroup: Arc::default(),
            maps: Vec::new(),
            last_seen: window,
            rescanned: window,
            jit: crate::process::jit::Hints::default(),
            exe: None,
            // The idle task has no /proc entry; it wakes threads from interrupts.
            kthread: pid == 0,
            exited: false,
        });
        if let Some(cg) = Arc::get_mut(&mut proc.cgroup) {
            cg.v2_id = cgroup_id;
        }
        self.jit.seen(pid, &proc.jit, window);
        self.put(pid, proc);
        self.metrics.processes.set(self.procs.len() as i64);
        self.metrics.objects.set(self.objects.len() as i64);
    }

    /// Takes what the unwind loader read of a process: its mappings and open files replace
    /// what the table has when the table knows less (a process gone before its first sample
    /// was handled) or the same process has mapped more since.
    pub fn adopt(&mut self, snap: Snapshot) {
        if !self.procs.contains_key(&snap.pid) {
            // Not sampled (yet): most processes never are; keep it for a window.
            if self.pending.len() >= MAX_PENDING {
                self.metrics.dropped(Cache::ProcessSnapshots, 1);
                return;
            }
            self.pending.insert(snap.pid, (snap, self.window));
            return;
        }
        self.take(snap);
    }

    fn take(&mut self, snap: Snapshot) {
        if self
            .procs
            .get(&snap.pid)
            .is_some_and(|p| p.start_time != snap.start_time)
        {
            // Another process on this pid (the registry decides reuse here, once): the old
            // one's Python names go before the new one's interpreter is attached.
            self.py_names.forget(snap.pid);
        }
        if let Some(py) = &snap.python {
            // Also from a read that found nothing else new (an interpreter attached late).
            self.py_names.attach(snap.pid, snap.start_time, py.clone());
        }
        // A process keeps its start time across exec, so the same start time with a
        // mapping the table lacks is a new program (or new code mapped since): take it.
        let known = self.procs.get(&snap.pid).map(|p| {
            let holds_all = snap.regions.iter().all(|r| {
                find_map(&p.maps, r.map.start).is_some_and(|m| {
                    (m.start, m.end, m.offset) == (r.map.start, r.map.end, r.map.offset)
                })
            });
            (p.start_time, holds_all, p.last_seen, p.cgroup.v2_id)
        });
        match known {
            Some((start, true, _, _)) if start == snap.start_time => return,
            None if self.procs.len() >= self.limits.max_processes => self.evict_least_recent(),
            _ => {}
        }
        let (pid, start_time) = (snap.pid, snap.start_time);
        let mut proc = self.proc_from(snap);
        let window = self.window;
        if let Some((_, _, last_seen, v2_id)) = known {
            proc.last_seen = last_seen;
            if let Some(cg) = Arc::get_mut(&mut proc.cgroup).filter(|cg| cg.v2_id == 0) {
                cg.v2_id = v2_id;
            }
        }
        if known.is_some_and(|(start, ..)| start != start_time) {
            // Another process on this pid (or the same one after exec): nothing of the old
            // one's JIT symbols applies.
            self.jit.forget(pid);
        }
        self.jit.seen(pid, &proc.jit, window);
        self.put(pid, proc);
        self.gc_objects();
        self.metrics.processes.set(self.procs.len() as i64);
        self.metrics.objects.set(self.objects.len() as i64);
    }

    /// The object for a file the loader opened, shared with every other mapping of it.
    fn target_from_file(&mut self, e: &MapsEntry, file: File, root: &Option<Arc<File>>) -> Target {
        let key = ObjectKey {
            dev: e.dev,
            inode: e.inode,
        };
        if let Some(o) = self.objects.get(&key) {
            return Target::File(o.clone());
        }
        if !self.room_for_object(0) {
            return Target::Region(Arc::from(e.path.as_str()));
        }
        let obj = Arc::new(Object::new(
            key,
            e.path.trim_end_matches(" (deleted)").to_owned(),
            file,
            root.clone(),
        ));
        self.objects.insert(key, obj.clone());
        Target::File(obj)
    }

    /// The table's process on `pid` if it is the one started at `start_time`: `None` when
    /// the pid is unknown, or names another process than the sample's (both start times
    /// known and different: the sample's process is gone, its pid reused). A start time of
    /// 0 (unknown) is whichever process the table has.
    fn proc_of(&self, pid: u32, start_time: u64) -> Option<&Proc> {
        self.procs
            .get(&pid)
            .filter(|p| !other_process(p.start_time, start_time))
    }

    /// Whether the table's process on `pid` is another than the one started at
    /// `start_time`; if so, an address of it left unknown is counted.
    fn replaced(&self, pid: u32, start_time: u64) -> bool {
        let other = self
            .procs
            .get(&pid)
            .is_some_and(|p| other_process(p.start_time, start_time));
        if other {
            self.metrics.proc_read_error(ProcRead::Replaced, 1);
        }
        other
    }

    /// The name (`comm` of the thread group leader) of `pid` started at `start_time`,
    /// empty if unknown (or its pid names another process now).
    pub fn name(&self, pid: u32, start_time: u64) -> Arc<str> {
        self.proc_of(pid, start_time)
            .map(|p| p.name.clone())
            .unwrap_or_else(|| Arc::from(""))
    }

    /// The cgroup `pid` started at `start_time` was in when first seen (none if unknown).
    pub fn cgroup(&self, pid: u32, start_time: u64) -> Arc<Cgroup> {
        self.proc_of(pid, start_time)
            .map(|p| p.cgroup.clone())
            .unwrap_or_default()
    }

    /// Names the interpreter frame `f` of process `pid` started at `start_time` (unnamed
    /// when its process or code object cannot be read, or its pid names another process).
    pub fn python(&mut self, pid: u32, start_time: u64, f: &crate::model::PyFrameRef) -> UserAddr {
        if self.replaced(pid, start_time) {
            return UserAddr::Python(Arc::new(crate::process::python::PyFrame::unnamed(f.code)));
        }
        UserAddr::Python(Arc::new(self.py_names.frame(pid, f)))
    }

    /// The interpreter `pid` started at `start_time` runs, if its frames are walked.
    pub fn runtime(&self, pid: u32, start_time: u64) -> Option<crate::model::Runtime> {
        self.proc_of(pid, start_time)?;
        self.py_names.runtime(pid)
    }

    /// Sets how many bytes of Python names are kept (`interpreters.python.cache_bytes`).
    pub fn set_python_cache(&mut self, bytes: u64) {
        self.py_names = PyNames::new(bytes, self.metrics.clone());
    }

    /// Normalizes a user address of `pid` started at `start_time`; rereads the mappings
    /// once per window on a miss, since libraries loaded later (dlopen) were not there at
    /// first sight. Unknown when the pid names another process now.
    pub fn normalize(&mut self, pid: u32, start_time: u64, addr: u64) -> UserAddr {
        if self.replaced(pid, start_time) {
            return UserAddr::Unknown(addr);
        }
        let (found, kind) = self.normalize_mapped(pid, addr);
        match &found {
            UserAddr::Region(..) if kind == Some(RegionKind::Anon) => {
                let hints = self
                    .procs
                    .get(&pid)
                    .map(|p| p.jit.clone())
                    .unwrap_or_default();
                match self.jit.lookup(pid, addr, self.window, &hints) {
                    Some(frame) => UserAddr::Jit(Arc::new(frame)),
                    None => found,
                }
            }
            _ => found,
        }
    }

    /// `addr` of `pid` normalized without a read or a change, when that is the whole answer:
    /// in a file or a named region, or nowhere when `pid` is unknown or its mappings were
    /// read again this window already. `None` when [`ProcessTable::normalize`] has more to
    /// do (JIT code, or a miss that rereads the mappings). Unknown, never another process's
    /// mapping, when `pid` names another process than the one started at `start_time`.
    pub fn find(&self, pid: u32, start_time: u64, addr: u64) -> Option<UserAddr> {
        if self.replaced(pid, start_time) {
            return Some(UserAddr::Unknown(addr));
        }
        let Some(p) = self.procs.get(&pid) else {
            return Some(UserAddr::Unknown(addr));
        };
        match find_map(&p.maps, addr) {
            Some(m) if m.kind == RegionKind::Anon => None,
            Some(m) => Some(m.addr(addr)),
            None if p.rescanned >= self.window => Some(UserAddr::Unknown(addr)),
            None => None,
        }
    }

    /// What `addr` of `pid` is, with the kind of mapping it is in.
    fn normalize_mapped(&mut self, pid: u32, addr: u64) -> (UserAddr, Option<RegionKind>) {
        if let Some(m) = self.procs.get(&pid).and_then(|p| find_map(&p.maps, addr)) {
            return m.found(addr);
        }
        let window = self.window;
        let stale = self.procs.get(&pid).is_some_and(|p| p.rescanned < window);
        if stale {
            if let Some(mut fresh) = self.read_process(pid) {
                if let Some(old) = self.procs.get(&pid) {
                    fresh.last_seen = old.last_seen;
                    if old.start_time == fresh.start_time {
                        fresh.cgroup = old.cgroup.clone();
                    } else {
                        // Another process on this pid: none of the old one's JIT symbols
                        // apply, and its cgroup is its own (read just now).
                        if let Some(cg) = Arc::get_mut(&mut fresh.cgroup) {
                            cg.v2_id = old.cgroup.v2_id;
                        }
                        self.jit.forget(pid);
                        self.jit.seen(pid, &fresh.jit, window);
                    }
                    self.procs.insert(pid, fresh);
                }
            }
            if let Some(p) = self.procs.get_mut(&pid) {
                p.rescanned = window;
            }
            self.gc_objects();
            if let Some(m) = self.procs.get(&pid).and_then(|p| find_map(&p.maps, addr)) {
                return m.found(addr);
            }
        }
        (UserAddr::Unknown(addr), None)
    }

    /// Notes `pid`'s exit record (of the process started at `start_time`, when the loader
    /// knew it): it is forgotten at the end of the first window that did not sample it,
    /// without a look at `/proc`. A snapshot not sampled yet stays its window: the samples
    /// of a process that lived 30 ms may still be on their way.
    pub fn exited(&mut self, pid: u32, start_time: Option<u64>) {
        if let Some(p) = self.procs.get_mut(&pid) {
            if start_time.is_none_or(|t| t == p.start_time) {
                p.exited = true;
            }
        }
    }

    /// Closes the current window: forgets processes that were not sampled in it and have
    /// exited (or whose pid now belongs to another process), and the objects only they held.
    /// Returns the exit events: the processes forgotten, whose JIT tables and Python names
    /// are freed with them.
    pub fn end_window(&mut self) -> Vec<Exit> {
        let window = self.window;
        let root = self.proc_root.clone();
        let mut evicted = Vec::new();
        self.procs.retain(|pid, p| {
            let keep = p.last_seen == window
                || (!p.exited
                    && procfs::start_time(&root, *pid).is_some_and(|t| t == p.start_time));
            if !keep {
                evicted.push(Exit {
                    pid: *pid,
                    start_time: p.start_time,
                });
            }
            keep
        });
        for e in &evicted {
            self.jit.forget(e.pid);
            self.py_names.forget(e.pid);
        }
        self.pending.retain(|_, (_, w)| *w == window);
        self.metrics.processes_evicted.inc_by(evicted.len() as u64);
        // Every window, not only when a process goes: an object a window still held when
        // its last process went (a minute's off-CPU sums do) is let go once that window is
        // written, not kept open until some other process exits.
        self.gc_objects();
        self.window += 1;
        self.metrics.processes.set(self.procs.len() as i64);
        self.metrics.objects.set(self.objects.len() as i64);
        evicted
    }

    /// Processes currently tracked.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.procs.len()
    }

    /// Object files currently held open.
    #[cfg(test)]
    pub fn objects(&self) -> usize {
        self.objects.len()
    }

    /// Drops the least recently seen process: amortized O(1) (stale queue entries are
    /// skipped), so a table kept full by a stream of new pids costs no scan per pid. Its
    /// objects are let go of at the end of the window or when the object table is full.
    fn evict_least_recent(&mut self) {
        while let Some((seen, pid)) = self.recency.pop_front() {
            if self.procs.get(&pid).is_some_and(|p| p.last_seen == seen) {
                self.procs.remove(&pid);
                self.jit.forget(pid);
                self.metrics.dropped(Cache::Processes, 1);
                return;
            }
        }
        // Only if the queue lost track (it should not): the scan.
        if let Some((&pid, _)) = self.procs.iter().min_by_key(|(_, p)| p.last_seen) {
            self.procs.remove(&pid);
            self.jit.forget(pid);
            self.metrics.dropped(Cache::Processes, 1);
        }
    }

    /// Drops objects no process maps any more (windows in flight keep their own `Arc`).
    fn gc_objects(&mut self) {
        self.objects.retain(|_, o| Arc::strong_count(o) > 1);
        self.roots.retain(|_, r| Arc::strong_count(r) > 1);
    }

    /// Reads `pid` itself (the loader read it not, or not lately), opening only the files
    /// of objects the table does not hold yet.
    fn read_process(&mut self, pid: u32) -> Option<Proc> {
        self.reads += 1;
        let (proc_root, metrics) = (self.proc_root.clone(), self.metrics.clone());
        let opts = ReadOptions {
            exe: true,
            ..Default::default()
        };
        // Files approved for opening in this read: each counts against `max_objects`, and a
        // file mapped twice is opened once.
        let mut approved = HashSet::new();
        let snap = snapshot::read(&proc_root, pid, opts, &metrics, |e| {
            let key = ObjectKey {
                dev: e.dev,
                inode: e.inode,
            };
            let new = !self.objects.contains_key(&key) && !approved.contains(&key);
            // Checked before the open, so a full table costs no open.
            let open = new && self.room_for_object(approved.len());
            if open {
                approved.insert(key);
            }
            open
        });
        let Ok(snap) = snap else {
            metrics.proc_read_error(ProcRead::Stat, 1);
            return None;
        };
        let refused = snap
            .regions
            .iter()
            .filter(|r| matches!(r.file, Mapped::Refused(_)))
            .count();
        if refused > 0 {
            metrics.proc_read_error(ProcRead::OpenObject, refused as u64);
        }
        if snap.cgroup.is_none() {
            metrics.proc_read_error(ProcRead::Cgroup, 1);
        }
        Some(self.proc_from(snap))
    }

    /// The process `snap` tells of, seen in this window, its objects shared with every
    /// other mapping of them.
    fn proc_from(&mut self, snap: Snapshot) -> Proc {
        let root = self.share_root(snap.root);
        let mut maps = Vec::with_capacity(snap.regions.len());
        let mut jit = crate::process::jit::Hints::default();
        for r in snap.regions {
            let Region { map, file } = r;
            let target = match file {
                Mapped::Open(f) => self.target_from_file(&map, f, &root),
                // Not opened by this read: an object the table holds already.
                Mapped::NotOpened if map.is_file_backed() => {
                    let key = ObjectKey {
                        dev: map.dev,
                        inode: map.inode,
                    };
                    match self.objects.get(&key) {
                        Some(o) => Target::File(o.clone()),
                        None => region(&map),
                    }
                }
                Mapped::NotOpened | Mapped::Refused(_) => region(&map),
            };
            push_map(&mut maps, &mut jit, &map, target);
        }
        maps.sort_by_key(|m| m.start);
        Proc {
            start_time: snap.start_time,
            name: Arc::from(snap.name.as_str()),
            cgroup: Arc::new(snap.cgroup.unwrap_or_default()),
            maps,
            last_seen: self.window,
            rescanned: self.window,
            jit,
            exe: snap.exe,
            kthread: snap.kthread,
            exited: false,
        }
    }

    /// Whether one more object fits under `limits.max_objects` besides `pending` ones about
    /// to be added (after letting go of unmapped ones); a refusal is counted.
    fn room_for_object(&mut self, pending: usize) -> bool {
        if self.objects.len() + pending >= self.limits.max_objects {
            self.gc_objects();
            if self.objects.len() + pending >= self.limits.max_objects {
                self.metrics.dropped(Cache::Objects, 1);
                return false;
            }
        }
        true
    }
}

/// Whether a process the table holds, started at `held`, is another than a sample's,
/// started at `sampled`: both known and different.
fn other_process(held: u64, sampled: u64) -> bool {
    held != 0 && sampled != 0 && held != sampled
}

/// A mapping without a usable file, named by its path column (`[vdso]`, `[anon]`, ...).
fn region(e: &MapsEntry) -> Target {
    Target::Region(Arc::from(e.label()))
}

/// Adds an executable mapping, noting what the JIT stage needs (a JVM, a jitdump).
fn push_map(
    maps: &mut Vec<ExecMap>,
    jit: &mut crate::process::jit::Hints,
    e: &MapsEntry,
    target: Target,
) {
    if let Target::File(o) = &target {
        jit.jvm |= o.base_name() == "libjvm.so";
        if crate::process::jit::is_jitdump_path(&o.path) {
            jit.jitdump = Some(o.clone());
        }
    }
    maps.push(ExecMap {
        start: e.start,
        end: e.end,
        offset: e.offset,
        kind: e.kind,
        target,
    });
}

/// The mapping `addr` is in.
fn find_map(maps: &[ExecMap], addr: u64) -> Option<&ExecMap> {
    let i = maps.partition_point(|m| m.start <= addr);
    let m = maps.get(i.checked_sub(1)?)?;
    (addr < m.end).then_some(m)
}

/// What `addr` is in `maps`.
#[cfg(test)]
fn find(maps: &[ExecMap], addr: u64) -> Option<UserAddr> {
    find_map(maps, addr).map(|m| m.addr(addr))
}

impl ExecMap {
    /// `addr` (inside this mapping) normalized.
    fn addr(&self, addr: u64) -> UserAddr {
        match &self.target {
            Target::File(o) => UserAddr::Object(o.clone(), addr - self.start + self.offset),
            Target::Region(label) => UserAddr::Region(label.clone(), addr - self.start),
        }
    }

    /// `addr` normalized, with the kind of this mapping.
    fn found(&self, addr: u64) -> (UserAddr, Option<RegionKind>) {
        (self.addr(addr), Some(self.kind))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn exits(e: Vec<Exit>) -> Vec<u32> {
        e.into_iter().map(|e| e.pid).collect()
    }

    fn table() -> ProcessTable {
        ProcessTable::new(
            &Limits {
                max_processes: 4,
                max_objects: 64,
                ..Default::default()
            },
            Metrics::new(),
        )
    }

    /// Address of a function in this test binary, and the binary's path.
    fn own_code_addr() -> u64 {
        own_code_addr as *const () as u64
    }

    #[test]
    fn normalizes_own_code_to_file_offset() {
        let mut t = table();
        let pid = std::process::id();
        t.touch(pid, pid, &[0; 16], 1, 0);
        match t.normalize(pid, 0, own_code_addr()) {
            UserAddr::Object(o, off) => {
                assert!(off > 0);
                let exe = std::fs::read_link("/proc/self/exe").expect("exe");
                assert_eq!(o.path, exe.display().to_string());
                assert!(o.build_id.is_some(), "rustc links a build id");
                assert!(o.id.size > 0);
            }
            other => panic!("expected an object, got {other:?}"),
        }
        assert!(matches!(t.normalize(pid, 0, 8), UserAddr::Unknown(8)));
        assert!(!t.name(pid, 0).is_empty());
    }

    /// The aggregator's view names what the mappings read name, reads nothing, and leaves
    /// a miss (a mapping read later may hold it) to the registry, unless this window read
    /// the mappings already.
    #[test]
    fn find_names_from_the_mappings_and_leaves_misses() {
        let mut t = table();
        let pid = std::process::id();
        assert!(matches!(t.find(pid, 0, 8), Some(UserAddr::Unknown(8))));
        t.touch(pid, pid, &[0; 16], 1, 0);
        let reads = t.reads;
        let Some(UserAddr::Object(o, off)) = t.find(pid, 0, own_code_addr()) else {
            panic!("own code is in the executable");
        };
        match t.normalize(pid, 0, own_code_addr()) {
            UserAddr::Object(n, noff) => assert_eq!((n.path.clone(), noff), (o.path.clone(), off)),
            other => panic!("expected an object, got {other:?}"),
        }
        // Read this window already: a miss is unknown at once.
        assert!(matches!(t.find(pid, 0, 8), Some(UserAddr::Unknown(8))));
        t.end_window();
        // A new window: the miss is the registry's to read again.
        assert!(t.find(pid, 0, 8).is_none());
        assert_eq!(t.reads, reads, "find reads nothing");
    }

    #[test]
    fn exited_process_keeps_its_mappings_until_the_window_after() {
        let mut child = spawn_sleep();
        let pid = child.id();
        let mut t = table();
        t.touch(pid, pid, &[0; 16], 1, 0);
        let _ = child.kill();
        let _ = child.wait();
        // Still known in the window it was seen in, even though it is gone.
        assert_eq!(t.name(pid, 0).as_ref(), "sleep");
        assert!(t.end_window().is_empty());
        assert_eq!(t.len(), 1, "seen in the closing window: kept");
        assert_eq!(exits(t.end_window()), [pid]);
        assert_eq!(t.len(), 0, "not seen, exited: evicted");
        assert_eq!(t.objects(), 0, "its objects are closed");
    }

    #[test]
    fn an_object_a_window_held_when_its_process_went_is_closed_after() {
        let mut child = spawn_sleep();
        let pid = child.id();
        let mut t = table();
        t.touch(pid, pid, &[0; 16], 1, 0);
        // A frame of it in a window still open (an off-CPU window lasts a minute).
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).expect("maps");
        let addr = maps
            .lines()
            .find(|l| l.split_whitespace().nth(1).is_some_and(|p| p.contains('x')))
            .and_then(|l| l.split('-').next())
            .and_then(|a| u64::from_str_radix(a, 16).ok())
            .expect("an executable mapping");
        let held = t.normalize(pid, 0, addr);
        assert!(matches!(held, UserAddr::Object(..)), "{held:?}");
        let _ = child.kill();
        let _ = child.wait();
        assert!(t.end_window().is_empty());
        assert_eq!(exits(t.end_window()), [pid]);
        assert!(
            t.objects() > 0,
            "the window's object stays open while it is held"
        );
        drop(held);
        assert!(t.end_window().is_empty(), "no process went this window");
        assert_eq!(t.objects(), 0, "closed once the window let go");
    }

    /// A `sh` that execs `sleep 30` once [`exec_now`] writes to it.
    fn sh_then_sleep() -> std::process::Child {
        std::process::Command::new("sh")
            .args(["-c", "read x; exec sleep 30"])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .expect("spawn sh")
    }

    /// Lets `sh_then_sleep`'s shell exec, and waits until it has.
    fn exec_now(child: &mut std::process::Child) {
        if let Some(stdin) = child.stdin.as_mut() {
            use std::io::Write;
            let _ = stdin.write_all(b"go\n");
        }
        wait_for_sleep(child.id());
    }

    /// `sleep 30`, once it has exec'd (before, its maps and name are the test's own).
    fn spawn_sleep() -> std::process::Child {
        let child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("spawn sleep");
        wait_for_sleep(child.id());
        child
    }

    /// Waits until `pid` runs `sleep` with its code mapped (the exec renames the process
    /// before it maps the new program).
    fn wait_for_sleep(pid: u32) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let mapped = || {
            let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
            maps.lines()
                .any(|l| l.contains(" r-xp ") && l.trim_end().ends_with("/sleep"))
        };
        while std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .unwrap_or_default()
            .trim()
            != "sleep"
            || !mapped()
        {
            assert!(std::time::Instant::now() < deadline, "no exec of sleep");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }

    /// Whether the table maps `sleep`'s executable for `pid`.
    fn maps_sleep(t: &ProcessTable, pid: u32) -> bool {
        t.procs.get(&pid).is_some_and(|p| {
            p.maps
                .iter()
                .any(|m| matches!(&m.target, Target::File(o) if o.base_name() == "sleep"))
        })
    }

    #[test]
    fn exec_is_noticed_by_the_new_name() {
        // sh execs sleep: the same pid, a new name and new mappings.
        let mut child = sh_then_sleep();
        let pid = child.id();
        let mut t = table();
        t.touch(pid, pid, b"sh\0\0\0\0\0\0\0\0\0\0\0\0\0\0", 1, 0);
        assert_eq!(t.name(pid, 0).as_ref(), "sh");
        exec_now(&mut child);
        // In the same window as the first read (a recording is one window).
        t.touch(pid, pid, b"sleep\0\0\0\0\0\0\0\0\0\0\0", 1, 0);
        assert_eq!(t.name(pid, 0).as_ref(), "sleep");
        assert!(maps_sleep(&t, pid), "the new program's mappings were read");
        let _ = child.kill();
        let _ = child.wait();
    }

    #[test]
    fn a_snapshot_after_exec_replaces_the_old_program() {
        // The same start time, as few mappings or fewer: still another program.
        let mut child = sh_then_sleep();
        let pid = child.id();
        let mut t = table();
        t.touch(pid, pid, b"sh\0\0\0\0\0\0\0\0\0\0\0\0\0\0", 1, 0);
        exec_now(&mut child);
        let metrics = Metrics::new();
        let snap = snapshot::read(
            Path::new("/proc"),
            pid,
            ReadOptions::default(),
            &metrics,
            |_| true,
        )
        .expect("snapshot of sleep");
        t.adopt(snap);
        assert_eq!(t.name(pid, 0).as_ref(), "sleep");
        assert!(
            maps_sleep(&t, pid),
            "the loader's read of the new program was taken"
        );
        let _ = child.kill();
        let _ = child.wait();
    }

    #[test]
    fn process_cap_evicts_least_recent() {
        let mut t = table();
        for pid in [1, 2, 3, 4] {
            t.touch(pid, pid, &[0; 16], 1, 0);
        }
        t.end_window();
        t.touch(1, 1, &[0; 16], 1, 0);
        let me = std::process::id();
        t.touch(me, me, &[0; 16], 1, 0);
        assert_eq!(t.len(), 4);
    }

    /// A `sleep 30` whose name is `name`: exec'd through a symlink of that name (the
    /// kernel names a process after the file it execs).
    fn renamed_sleep(name: &[u8]) -> (std::process::Child, tempfile::TempDir) {
        use std::os::unix::ffi::OsStrExt;
        let dir = tempfile::tempdir().expect("tmp");
        let link = dir.path().join(std::ffi::OsStr::from_bytes(name));
        let sleep = ["/bin/sleep", "/usr/bin/sleep"]
            .into_iter()
            .find(|p| std::path::Path::new(p).exists())
            .expect("sleep");
        std::os::unix::fs::symlink(sleep, &link).expect("symlink");
        let child = std::process::Command::new(&link)
            .arg("30")
            .spawn()
            .expect("spawn sleep");
        (child, dir)
    }

    fn comm(name: &[u8]) -> [u8; 16] {
        let mut c = [0u8; 16];
        c[..name.len()].copy_from_slice(name);
        c
    }

    #[test]
    fn a_non_utf8_name_keeps_maps_and_cgroup() {
        let (mut child, _dir) = renamed_sleep(b"bad\xff\xfename");
        let pid = child.id();
        let mut t = table();
        t.touch(pid, pid, &comm(b"bad\xff\xfename"), 1, 0);
        let p = t.procs.get(&pid).expect("known");
        assert!(p.start_time > 0, "stat was read");
        assert!(!p.maps.is_empty(), "maps were read");
        assert!(!p.cgroup.info.path.is_empty(), "cgroup was read");
        assert_eq!(t.name(pid, 0).as_ref(), "bad\u{fffd}\u{fffd}name");
        let _ = child.kill();
        let _ = child.wait();
    }

    #[test]
    fn renames_without_exec_cost_no_rescan() {
        let (mut child, _dir) = renamed_sleep(b"churn0");
        let pid = child.id();
        let mut t = table();
        t.touch(pid, pid, &comm(b"churn0"), 1, 0);
        let reads = t.reads;
        // Samples name the thread as the kernel saw it: a process that renames itself
        // (prctl) every few milliseconds shows a new name in every window.
        for i in 1..=20u8 {
            let name = format!("churn{i}");
            t.touch(pid, pid, &comm(name.as_bytes()), 1, 0);
            assert_eq!(t.name(pid, 0).as_ref(), name, "the new name is taken");
            t.end_window();
        }
        assert_eq!(t.reads, reads, "renames reread nothing");
        let _ = child.kill();
        let _ = child.wait();
    }

    #[test]
    fn kernel_thread_renames_read_nothing() {
        // kthreadd is pid 2 in the host's pid namespace; elsewhere there is no kernel thread
        // to look at.
        let is_kthread = std::fs::read_to_string("/proc/2/stat")
            .ok()
            .and_then(|t| procfs::parse_stat(&t))
            .is_some_and(|s| s.kthread);
        if !is_kthread {
            eprintln!("skipped: /proc/2 is not a kernel thread here");
            return;
        }
        let mut t = table();
        t.touch(2, 2, &comm(b"kthreadd"), 0, 0);
        t.touch(0, 0, &comm(b"swapper/0"), 0, 0);
        let reads = t.reads;
        // A kworker's name changes with its work queue, and wakeups from interrupts are
        // the idle task's (pid 0, no /proc entry), several times in each window.
        for i in 1..=5u8 {
            for n in 0..50u8 {
                let name = format!("kworker/{i}:{n}");
                t.touch(2, 2, &comm(name.as_bytes()), 0, 0);
                t.touch(0, 0, &comm(name.as_bytes()), 0, 0);
                assert_eq!(t.name(2, 0).as_ref(), name);
            }
            t.end_window();
        }
        assert_eq!(t.reads, reads, "renames of kernel threads reread nothing");
    }

    #[test]
    fn eviction_takes_the_least_recently_seen() {
        let mut t = table();
        for pid in [1, 2, 3, 4] {
            t.touch(pid, pid, &[0; 16], 1, 0);
        }
        t.end_window();
        // 1 and 3 seen again: 2 then 4 are the least recent.
        t.touch(3, 3, &[0; 16], 1, 0);
        t.touch(1, 1, &[0; 16], 1, 0);
        t.touch(5, 5, &[0; 16], 1, 0);
        let mut left: Vec<u32> = t.procs.keys().copied().collect();
        left.sort();
        assert_eq!(left, [1, 3, 4, 5]);
        t.touch(6, 6, &[0; 16], 1, 0);
        let mut left: Vec<u32> = t.procs.keys().copied().collect();
        left.sort();
        assert_eq!(left, [1, 3, 5, 6]);
        // Many pids through a full table: the queue stays bounded.
        for pid in 3_000_000..3_010_000 {
            t.touch(pid, pid, &[0; 16], 1, 0);
        }
        assert_eq!(t.len(), 4);
        assert!(t.recency.len() <= 2 * 4 + 1024 + 1, "{}", t.recency.len());
    }

    /// A fake `/proc/PID` for `pid` in `proc_root`: its root is `root` (no `map_files`, so
    /// objects are opened by path there), its mountinfo this process's; `stat` names it
    /// `same` with start time `start`, and `maps` maps `file` (inside `root`) at `at`.
    fn fake_process(proc_root: &Path, root: &Path, pid: u32, start: u64, file: &str, at: u64) {
        let dir = proc_root.join(pid.to_string());
        std::fs::create_dir_all(&dir).expect("mkdir");
        let _ = std::fs::remove_file(dir.join("root"));
        std::os::unix::fs::symlink(root, dir.join("root")).expect("symlink");
        let own = std::fs::read("/proc/self/mountinfo").expect("mountinfo");
        std::fs::write(dir.join("mountinfo"), own).expect("mountinfo");
        let fields: Vec<String> = (3..=22)
            .map(|i| match i {
                3 => "S".to_owned(),
                22 => start.to_string(),
                _ => "0".to_owned(),
            })
            .collect();
        std::fs::write(
            dir.join("stat"),
            format!("{pid} (same) {}\n", fields.join(" ")),
        )
        .expect("stat");
        let m = std::fs::metadata(root.join(file.trim_start_matches('/'))).expect("file");
        let (major, minor) = (libc::major(m.dev()), libc::minor(m.dev()));
        let maps = format!(
            "{at:x}-{:x} r-xp 00000000 {major:02x}:{minor:02x} {} {file}\n",
            at + 0x1000,
            m.ino()
        );
        std::fs::write(dir.join("maps"), maps).expect("maps");
    }

    /// A fake host with two programs, `/bin/old` and `/bin/new`: its directory, its
    /// `/proc` and its root.
    fn old_and_new_programs() -> (tempfile::TempDir, PathBuf, PathBuf) {
        let dir = tempfile::tempdir().expect("tmp");
        let (proc_root, root) = (dir.path().join("proc"), dir.path().join("root"));
        std::fs::create_dir_all(root.join("bin")).expect("mkdir");
        std::fs::write(root.join("bin/old"), b"\x7fELF old").expect("write");
        std::fs::write(root.join("bin/new"), b"\x7fELF new").expect("write");
        (dir, proc_root, root)
    }

    /// Issue 25: a pid reused by another process in the same cgroup (or on cgroup v1, where
    /// samples carry no cgroup id), under the same name, is another process all the same:
    /// its start time tells. The table reads the new one's mappings (on main it kept the
    /// old ones, and a miss in them read the new process but threw it away as not the
    /// same, so the new process's code stayed unknown for as long as it was sampled).
    #[test]
    fn a_pid_reused_in_the_same_cgroup_under_the_same_name_is_read_again() {
        let (_dir, proc_root, root) = old_and_new_programs();
        let pid = 3_999_999;
        let mut t = table();
        t.proc_root = proc_root.clone();
        let comm = comm(b"same");
        fake_process(&proc_root, &root, pid, 100, "/bin/old", 0x10000);
        t.touch(pid, pid, &comm, 0, 0);
        match t.normalize(pid, 0, 0x10100) {
            UserAddr::Object(o, 0x100) => assert_eq!(o.path, "/bin/old"),
            other => panic!("{other:?}"),
        }
        t.end_window();
        // The old process is gone; a new one has its pid, cgroup and name.
        fake_process(&proc_root, &root, pid, 200, "/bin/new", 0x20000);
        t.touch(pid, pid, &comm, 0, 0);
        assert_eq!(t.procs.get(&pid).map(|p| p.start_time), Some(200));
        match t.normalize(pid, 0, 0x20100) {
            UserAddr::Object(o, 0x100) => assert_eq!(o.path, "/bin/new"),
            other => panic!("the new process's code: {other:?}"),
        }
        assert!(
            matches!(t.normalize(pid, 0, 0x10100), UserAddr::Unknown(_)),
            "the old process's mappings are gone"
        );
        // The same process seen again: no read.
        let reads = t.reads;
        t.end_window();
        t.touch(pid, pid, &comm, 0, 0);
        assert_eq!(t.reads, reads);
    }

    /// Issue 53: samples carry their process's start time. Two processes on one pid in one
    /// window are each named from their own mappings or unknown, never from the other's; a
    /// sample of a newer process reads it again without a look at `/proc/PID/stat`, and a
    /// late sample of the old one changes nothing.
    #[test]
    fn two_processes_on_one_pid_are_named_by_their_start_times() {
        let (_dir, proc_root, root) = old_and_new_programs();
        let pid = 3_999_998;
        let mut t = table();
        t.proc_root = proc_root.clone();
        let comm = comm(b"same");
        let replaced = |t: &ProcessTable| {
            t.metrics
                .proc_read_errors
                .get_or_create(&crate::metrics::ReasonLabel {
                    reason: ProcRead::Replaced,
                })
                .get()
        };
        fake_process(&proc_root, &root, pid, 100, "/bin/old", 0x10000);
        t.touch(pid, pid, &comm, 0, 100);
        let object = |a: Option<UserAddr>| match a {
            Some(UserAddr::Object(o, off)) => Some((o.path.clone(), off)),
            _ => None,
        };
        assert_eq!(
            object(t.find(pid, 100, 0x10100)),
            Some(("/bin/old".into(), 0x100))
        );
        // In the same window, the old process exits and a new one takes its pid.
        fake_process(&proc_root, &root, pid, 200, "/bin/new", 0x20000);
        let (reads, stat_reads) = (t.reads, t.stat_reads);
        t.touch(pid, pid, &comm, 0, 200);
        assert_eq!(
            t.reads,
            reads + 1,
            "the new process is read at its first sample"
        );
        assert_eq!(
            t.stat_reads, stat_reads,
            "its start time came with the sample"
        );
        assert_eq!(t.procs.get(&pid).map(|p| p.start_time), Some(200));
        // The new process's stacks: its own mappings.
        assert_eq!(
            object(t.find(pid, 200, 0x20100)),
            Some(("/bin/new".into(), 0x100))
        );
        assert_eq!(t.name(pid, 200).as_ref(), "same");
        // The old process's stacks of this window: unknown, even where the new one maps code.
        let before = replaced(&t);
        for addr in [0x10100, 0x20100] {
            assert!(matches!(t.find(pid, 100, addr), Some(UserAddr::Unknown(_))));
            assert!(matches!(t.normalize(pid, 100, addr), UserAddr::Unknown(_)));
        }
        assert_eq!(t.name(pid, 100).as_ref(), "", "not the new process's name");
        assert!(
            !Arc::ptr_eq(&t.cgroup(pid, 100), &t.cgroup(pid, 200)),
            "nor its cgroup"
        );
        assert!(t.runtime(pid, 100).is_none());
        assert_eq!(
            replaced(&t),
            before + 4,
            "each address left unknown is counted"
        );
        // A late sample of the old process: nothing changes, nothing is read.
        let (reads, stat_reads) = (t.reads, t.stat_reads);
        t.touch(pid, pid, &comm, 0, 100);
        assert_eq!((t.reads, t.stat_reads), (reads, stat_reads));
        assert_eq!(
            object(t.find(pid, 200, 0x20100)),
            Some(("/bin/new".into(), 0x100))
        );
        // The same process in the next windows: no read at all.
        for _ in 0..3 {
            t.end_window();
            t.touch(pid, pid, &comm, 0, 200);
        }
        assert_eq!((t.reads, t.stat_reads), (reads, stat_reads));
        // A sample without a start time (a kernel without the field) answers for whichever
        // process has the pid, and pays the stat read once a window, as before.
        assert!(t
            .find(pid, 0, 0x20100)
            .is_some_and(|a| object(Some(a)).is_some()));
        t.end_window();
        t.touch(pid, pid, &comm, 0, 0);
        t.touch(pid, pid, &comm, 0, 0);
        assert_eq!(t.stat_reads, stat_reads + 1);
    }

    #[test]
    fn find_uses_half_open_ranges() {
        let maps = vec![
            ExecMap {
                start: 0x1000,
                end: 0x2000,
                offset: 0x500,
                kind: RegionKind::Vdso,
                target: Target::Region(Arc::from("[vdso]")),
            },
            ExecMap {
                start: 0x3000,
                end: 0x4000,
                offset: 0,
                kind: RegionKind::Anon,
                target: Target::Region(Arc::from("[anon]")),
            },
        ];
        assert!(matches!(find(&maps, 0x1000), Some(UserAddr::Region(_, 0))));
        assert!(matches!(
            find(&maps, 0x1fff),
            Some(UserAddr::Region(_, 0xfff))
        ));
        assert!(find(&maps, 0x2000).is_none());
        assert!(find(&maps, 0xfff).is_none());
        assert!(matches!(find(&maps, 0x3fff), Some(UserAddr::Region(l, _)) if &*l == "[anon]"));
    }
}
