//! The label values of ember's own metric families, one enum per family whose label takes a
//! fixed set of values.
//!
//! Each variant is rendered to its label value here and nowhere else ([`Loss::as_str`] and
//! friends), and each variant's doc comment says what it counts: this file is the list that
//! ties a reason to its help text (docs/metrics.md is generated from these comments). The
//! [`super::Metrics`] methods take these enums, so a call site cannot invent a new value.

use std::borrow::Cow;
use std::fmt;

use prometheus_client::encoding::{EncodeLabelValue, LabelValueEncoder};

use crate::model::{OffState, PyWalk, StackEnd};

/// Declares a label enum of unit variants: `Variant => "label_value"`, each with its doc (an
/// enum named as [`crate::model`] names its values), encoded as a label value.
macro_rules! label_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident => $value:literal, )+
        }
    ) => {
        crate::model::named_enum! {
            $(#[$meta])*
            pub enum $name {
                $( $(#[$vmeta])* $variant => $value, )+
            }
        }
        label_value!($name);
    };
}

/// Encodes a named enum as a label value: its `as_str`.
macro_rules! label_value {
    ($name:ident) => {
        impl EncodeLabelValue for $name {
            fn encode(&self, encoder: &mut LabelValueEncoder) -> fmt::Result {
                fmt::Write::write_str(encoder, self.as_str())
            }
        }
    };
}

// Properties of a sample, declared with it: labels here like every other value.
label_value!(OffState);
label_value!(StackEnd);
label_value!(PyWalk);

label_enum! {
    /// `ember_samples_lost_total{reason}`: where along the way a sample was lost. Every value
    /// is created at zero at start, so alert expressions have a series to read.
    pub enum Loss {
        /// BPF: the ring buffer to userspace was full.
        RingbufFull => "ringbuf_full",
        /// BPF: the per-CPU scratch buffer was missing.
        NoScratch => "no_scratch",
        /// Userspace: a record shorter than its header says.
        Malformed => "malformed",
        /// Userspace: the capture → aggregate queue was full (`limits.sample_queue_batches`
        /// or `limits.sample_queue_bytes`).
        QueueFull => "queue_full",
        /// Userspace: `limits.max_stacks_per_window` or `limits.max_stack_bytes_per_window`
        /// reached.
        StackCap => "stack_cap",
        /// Userspace: a closed window could not be queued for encoding.
        WindowQueue => "window_queue",
    }
}

label_enum! {
    /// `ember_stack_errors_total{side}`: which stack the kernel could not walk (the sample is
    /// kept with the other side).
    pub enum StackSide {
        /// The kernel stack.
        Kernel => "kernel",
        /// The user stack.
        User => "user",
    }
}

label_enum! {
    /// `ember_frames_total{result}`: frames in written stacks, by how they were named. Every
    /// value is created at zero at start.
    pub enum FrameResult {
        /// Named from symbols (ELF, DWARF, kallsyms).
        Named => "named",
        /// No symbol: kept as `libfoo.so+0x1a2b`, `[unknown]`, ….
        Unnamed => "unnamed",
        /// Named from a JIT perf map or jitdump.
        Jit => "jit",
    }
}

label_enum! {
    /// `ember_cache_dropped_total{cache}`: which bounded cache or queue dropped entries (full).
    pub enum Cache {
        /// The process table (`limits.max_processes`): the least recently seen process.
        Processes => "processes",
        /// Open object files (`limits.max_objects`): the mapping stays unnamed.
        Objects => "objects",
        /// The symbolizer's frame cache (`limits.symbol_cache_entries`): entries let go to make room.
        Symbols => "symbols",
        /// Parsed symbol tables (`symbols.cache_bytes`): the least recently used table.
        SymbolTables => "symbol_tables",
        /// Filter orders (deny or allow a pid or cgroup in BPF) from the aggregator to capture.
        ControlQueue => "control_queue",
        /// Deny orders the BPF deny maps refused (full): the workload stays sampled in BPF
        /// and is dropped in userspace.
        DenyMaps => "deny_maps",
        /// Containers left out of the per-container CPU series: beyond `limits.max_processes`
        /// containers, or beyond the series' byte cap (8 MiB, see workload::accounting).
        Accounting => "accounting",
        /// A closed window waiting for encoding.
        WindowQueue => "window_queue",
        /// JVM perf map refresh requests to the attach thread.
        JvmRequests => "jvm_requests",
        /// Finished JVM perf map refreshes coming back from the attach thread.
        JvmResults => "jvm_results",
        /// The perf counters' cgroup walk stopped at its directory cap.
        PerfCgroupDirs => "perf_cgroup_dirs",
        /// Containers beyond `counters.max_containers`, or whose counters could not be opened.
        PerfContainers => "perf_containers",
        /// Containers beyond `counters.max_containers` for run-queue latency.
        RunqueueContainers => "runqueue_containers",
        /// Disks beyond `readings.max_devices`.
        ReadingsDisks => "readings_disks",
        /// Network interfaces beyond `readings.max_devices`.
        ReadingsInterfaces => "readings_interfaces",
        /// Cgroup directories the readings' walk skipped at its cap.
        ReadingsCgroupDirs => "readings_cgroup_dirs",
        /// Containers beyond `readings.max_containers`.
        ReadingsContainers => "readings_containers",
        /// Unwind tables evicted (least recently used) to stay under `sampling.unwind_max_bytes`.
        UnwindTables => "unwind_tables",
        /// Processes beyond `sampling.unwind_max_processes` (or map memory): walked by frame pointers.
        UnwindProcesses => "unwind_processes",
        /// Executable ranges beyond the sampler's 64 per process: walked by frame pointers there.
        UnwindRanges => "unwind_ranges",
        /// Files beyond the sampler's `unwind_files` entries: a new process mapping them is
        /// walked by frame pointers until the loader has read it.
        UnwindFiles => "unwind_files",
        /// Rows the walker's per-CPU row cache (direct-mapped, 1,024 a CPU) let go for another.
        UnwindRowCache => "unwind_row_cache",
        /// `--pid` processes' children left unsampled: the BPF pid list (4,096) was full.
        PidFilter => "pid_filter",
        /// Requests from the sampler to load a process's ranges, dropped on a full queue.
        UnwindRequests => "unwind_requests",
        /// Object identities remembered by the unwind loader (`limits.max_objects`).
        UnwindObjects => "unwind_objects",
        /// Named Python code objects (`interpreters.python.cache_bytes`): the least recently
        /// used, read again from the process when next sampled.
        PythonCode => "python_code",
        /// Debug files fetched from debuginfod, evicted (oldest first) to stay under
        /// `symbols.debuginfod_cache_bytes`, and build ids asked for dropped on a full queue
        /// or a full table of outstanding requests.
        Debuginfod => "debuginfod",
        /// DWARF kept between windows (`symbols.dwarf_bytes`): an object's units let go
        /// (the least recently used object, or all of one object's to make room for the
        /// units a window needs); read again when next needed.
        Dwarf => "dwarf",
        /// What the unwind loader read of a process, on its way to the process table.
        ProcessSnapshots => "process_snapshots",
        /// New processes the unwind loader did not read in full: beyond its queue of 4,096,
        /// or exited while its rate of reads (100 a second) held them back.
        ProcessReads => "process_reads",
        /// Kernel task records (exec, mmap, exit) lost to a full ring: such a process is
        /// loaded at its first sample instead.
        TaskRecords => "task_records",
        /// File system kinds remembered by mount id (4,096): forgotten when full, learned
        /// again from mountinfo.
        Mounts => "mounts",
    }
}

label_enum! {
    /// `ember_offcpu_events_total{result}`: what became of each switch-out and block the
    /// off-CPU programs saw (`offcpu.enabled`).
    pub enum OffCpuEvent {
        /// A thread left a CPU (not filtered out).
        Switch => "switch",
        /// ... inside a syscall: nothing walked until it runs again after `offcpu.min_block`.
        Syscall => "syscall",
        /// ... of a thread with rseq registered (`offcpu.rseq`): nothing walked until it is
        /// back, after `offcpu.min_block`, on its way to user mode.
        Rseq => "rseq",
        /// ... of a user thread (`offcpu.task_work`): a task work walks it if it is long.
        TaskWork => "task_work",
        /// Lost: a long block whose task work could not be scheduled (no kernel memory).
        TaskWorkFailed => "task_work_failed",
        /// ... a kernel thread (`offcpu.kernel_threads`): its kernel stack taken if it is long.
        KernelThread => "kernel_thread",
        /// ... a kernel thread, not followed (`offcpu.kernel_threads` false; not a loss).
        KernelThreadSkipped => "kernel_thread_skipped",
        /// ... elsewhere (page fault, preemption), walked at switch-out (the fallback drew it).
        Fallback => "fallback",
        /// ... elsewhere, and not drawn by `offcpu.fallback_rate` (not walked; not a loss).
        FallbackSkipped => "fallback_skipped",
        /// It ran again sooner than `offcpu.min_block` (not reported; not a loss).
        Short => "short",
        /// A long block's user stack walked in its thread once back (task work, rseq, sys_exit).
        ExitWalk => "exit_walk",
        /// A long block added to the one of the same syscall still waiting for its exit.
        Merged => "merged",
        /// Reported: a record went to userspace.
        Sent => "sent",
        /// Reported: a record was counted in the kernel, under the key of one sent since
        /// the agent last read the sums (`offcpu.max_stacks`).
        Summed => "summed",
        /// A record's key found `offcpu.max_stacks` keys counted already: the next ones of
        /// that key are sent whole too (not a loss; it costs the agent more).
        SumsFull => "sums_full",
        /// Lost: blocks the kernel counted under a key whose record the agent did not keep
        /// (its record was lost, or `offcpu.max_stacks` records were kept already).
        SumsOrphaned => "sums_orphaned",
        /// Lost: `offcpu.max_threads` threads were already held.
        MapFull => "map_full",
        /// Lost: the off-CPU ring buffer was full.
        RingbufFull => "ringbuf_full",
        /// Lost: the per-CPU scratch buffer was missing.
        NoScratch => "no_scratch",
        /// Lost: a record shorter than its header says.
        Malformed => "malformed",
        /// Not profiled: a thread had no per-task record (`offcpu.max_tasks`, or no memory).
        TaskFull => "task_full",
        /// Lost: a long block whose thread exited before it was back in user mode.
        Exited => "exited",
        /// Excluded by `--pid`, the filters, or as the agent's own thread (not a loss).
        Filtered => "filtered",
        /// A thread waking a block past `offcpu.min_block` had its stacks walked (wakers).
        Waker => "waker",
        /// ... of them, wakeups from an interrupt (a timer, an I/O completion): the
        /// interrupt's kernel frames only, as no process's (the thread it interrupted is no
        /// waker, and its stack is not walked).
        WakerInterrupt => "waker_interrupt",
        /// ... and joined to its block's record.
        WakerJoined => "waker_joined",
        /// Lost: a block whose waker's record the agent did not keep (lost on the ring,
        /// or kept too long ago).
        WakerUnmatched => "waker_unmatched",
        /// Lost: `offcpu.max_stacks` records were kept already when a waker's came.
        WakerFull => "waker_full",
        /// A kernel lock wait of `offcpu.min_block` or more was walked (`offcpu.locks`).
        KernelLock => "kernel_lock",
        /// A kernel lock wait under `offcpu.min_block` (not reported; not a loss).
        KernelLockShort => "kernel_lock_short",
        /// `offcpu.locks` and the kernel has no lock:contention_begin/end (5.19+): lock
        /// profiles have futex waits only (counted once at start).
        KernelLockUnsupported => "kernel_lock_unsupported",
    }
}

label_enum! {
    /// `ember_unwind_row_lookups_total{result}`: where the walker found the row of a frame it
    /// walked by a table. Every value is created at zero at start.
    pub enum RowLookup {
        /// In this CPU's row cache (the frame was walked a moment ago).
        Cached => "cached",
        /// Searched in the object's table, then kept in the cache.
        Searched => "searched",
        /// The sample's first user frame in code no CFI covers (assembly such as musl's `memcpy`),
        /// stepped as a leaf: its return address at the stack pointer, taken only when that
        /// word is an address in one of the process's mapped objects.
        Leaf => "leaf",
    }
}

label_enum! {
    /// `ember_unwind_tables_built_total{result}`: what came of an object the sampler needed a
    /// table for.
    pub enum TableBuild {
        /// Compiled from the object's CFI.
        Compiled => "compiled",
        /// Read back from the on-disk cache (checked).
        Cached => "cached",
        /// No `.eh_frame`/`.debug_frame` (e.g. Go): walked by frame pointers.
        NoCfi => "no_cfi",
        /// The file could not be opened or read inside the process's root, or is not regular.
        Unreadable => "unreadable",
        /// Larger than the object cap.
        TooLarge => "too_large",
        /// Its headers give the CFI sections (together) or the section names more bytes
        /// than ember reads of them (`.eh_frame` plus `.debug_frame` 64 MiB, names
        /// 1 MiB): refused before they are read, never parsed again.
        SectionTooLarge => "section_too_large",
        /// The file opened (by its path inside the process's root, `map_files` refused) is
        /// not the inode the mapping names: replaced since, so not read.
        OtherFile => "other_file",
        /// Not an x86-64 ELF executable or shared object, or a malformed one.
        BadElf => "bad_elf",
        /// Over a cap on rows, entries, pages or CFI work (a hostile or huge object).
        OverCap => "over_cap",
        /// The kernel refused the table's map (memory, or the slot cap of 4096 tables).
        MapFailed => "map_failed",
        /// No room under `sampling.unwind_max_bytes` without evicting tables walked in the
        /// last 500 ms, or the table alone would take over half of it: walked by frame
        /// pointers, tried again after 10 s.
        OverBudget => "over_budget",
        /// A cache file that failed its check was removed (the table was compiled again).
        CacheCorrupt => "cache_corrupt",
    }
}

label_enum! {
    /// `ember_proc_read_errors_total{reason}`: `/proc` entries unreadable, malformed or reused.
    pub enum ProcRead {
        /// `/proc/<pid>/stat`: the process is not tracked.
        Stat => "stat",
        /// `/proc/<pid>/maps`: the process is tracked without mappings.
        Maps => "maps",
        /// A line of `/proc/<pid>/maps` that does not parse.
        MapsLine => "maps_line",
        /// `/proc/<pid>/cgroup`: the process gets no workload labels.
        Cgroup => "cgroup",
        /// A mapped file that could not be opened through `/proc/<pid>/map_files` or its root.
        OpenObject => "open_object",
        /// `/proc/kallsyms`: kernel frames stay unnamed.
        Kallsyms => "kallsyms",
        /// A kernel task record (perf mmap2/comm/task) that did not parse.
        TaskRecord => "task_record",
        /// A sample's pid names another process now (reused): each address left unknown.
        Replaced => "replaced",
    }
}

label_enum! {
    /// `ember_readings_errors_total{source}`: which readings source failed a read (the log
    /// names the file).
    pub enum ReadingsSource {
        /// Host CPU: `/proc/stat`, `/proc/loadavg`, `/proc/pressure/cpu`.
        Cpu => "cpu",
        /// Host memory: `/proc/meminfo`, `/proc/vmstat`, `/proc/pressure/memory`.
        Memory => "memory",
        /// Host disks: `/proc/diskstats`, `/proc/pressure/io`.
        Disk => "disk",
        /// Host network: `/proc/1/net/dev`, `/proc/1/net/snmp`.
        Network => "network",
        /// Per-container cgroup files.
        Containers => "containers",
        /// Perf counters (`perf_event_open` in counting mode).
        Pmc => "pmc",
        /// Run-queue latency (BPF maps).
        Runqlat => "runqlat",
    }
}

label_enum! {
    /// `ember_http_refused_total{reason}`: connections and requests the HTTP server turned
    /// away or cut short.
    pub enum HttpRefusal {
        /// A connection beyond `server.max_connections`, closed at accept.
        ConnectionCap => "connection_cap",
        /// A connection closed after `server.idle_timeout` without a byte.
        Idle => "idle",
        /// A connection that did not send a complete request's headers within
        /// `server.header_read_timeout`, closed.
        HeaderTimeout => "header_timeout",
        /// A request beyond `server.max_concurrent_requests` (503).
        Busy => "busy",
        /// A request that ran past `server.request_timeout` (503).
        Timeout => "timeout",
        /// A request to the profiles listener without the right bearer token (401).
        Unauthorized => "unauthorized",
        /// A merge beyond `server.max_merge_samples`, a flame graph beyond
        /// `server.max_flame_nodes`, a response beyond `server.max_response_bytes` or a file
        /// beyond `server.max_file_bytes` (413).
        TooLarge => "too_large",
        /// A connection closed at the cap to admit a new one: it had no request in the
        /// works (it never sent a complete request, or idled between requests).
        Evicted => "evicted",
        /// Heavy work stopped early because its request went away (the client hung up,
        /// `server.request_timeout`, shutdown).
        Cancelled => "cancelled",
        /// A request whose `Host` is not the profiles listener's (no token set: DNS
        /// rebinding), 421.
        Host => "host",
    }
}

label_enum! {
    /// `ember_jit_rejects_total{reason}`: why a JIT symbol file, line or record was refused.
    pub enum JitReject {
        /// The perf map is a symbolic link.
        Symlink => "symlink",
        /// The file could not be opened or its metadata read.
        Open => "open",
        /// Not a regular file.
        NotRegular => "not_regular",
        /// Owned by neither the process's user nor root.
        Owner => "owner",
        /// Larger than `jit.max_file_bytes`.
        TooLarge => "too_large",
        /// Reading the file failed.
        Read => "read",
        /// A perf map line that is not `START SIZE name` in hex.
        Malformed => "malformed",
        /// A zero-sized or wrapping code range.
        BadRange => "bad_range",
        /// An entry beyond the per-process or total cap.
        TooMany => "too_many",
        /// An entry beyond the per-process or total byte cap.
        Bytes => "bytes",
        /// Not a jitdump (bad magic), another byte order or an unknown version.
        JitdumpHeader => "jitdump_header",
        /// A jitdump record whose size cannot be right (the rest of the file is ignored).
        JitdumpMalformed => "jitdump_malformed",
        /// A jitdump ending in a partial record that did not grow since the last read.
        JitdumpTruncated => "jitdump_truncated",
        /// The perf map, or a directory on its way, is on a FUSE, network or unknown file
        /// system: not read (a read could wait forever).
        RemoteFs => "remote_fs",
    }
}

label_enum! {
    /// `ember_window_write_errors_total{reason}`: what went wrong with the window directory.
    pub enum WindowWriteError {
        /// No space (or quota) left on its file system; the window was dropped.
        NoSpace => "no_space",
        /// Its file system is read-only; the window was dropped.
        ReadOnly => "read_only",
        /// The directory was gone and was created again (the window was written).
        DirRecreated => "dir_recreated",
        /// Any other write error; the window was dropped.
        Other => "other",
    }
}

label_enum! {
    /// A window that failed on its way out and was dropped. Not a full cache, but counted in
    /// `ember_cache_dropped_total{cache}` beside them, under the values it always had there
    /// ([`super::DropCause`]).
    pub enum WindowFailure {
        /// It could not be compressed.
        Encode => "window_encode",
        /// It could not be written to the window directory.
        Write => "window_write",
    }
}

label_enum! {
    /// `ember_python_attaches_total{result}`: what came of looking at a process that maps
    /// a CPython interpreter.
    pub enum PyAttach {
        /// Its Python frames are walked from now on.
        Attached => "attached",
        /// The interpreter's file could not be read.
        Unreadable => "unreadable",
        /// A version ember has no layout for (or none it could tell).
        UnknownVersion => "unknown_version",
        /// A free-threaded (`t`) build.
        FreeThreaded => "free_threaded",
        /// A debug build (`Py_DEBUG`).
        DebugBuild => "debug_build",
        /// A symbol ember needs is missing or malformed.
        Symbols => "missing_symbols",
        /// musl libc whose `pthread_getspecific` is not the shape ember decodes.
        Musl => "musl",
        /// The process's memory could not be read (ptrace access, an exited process).
        Memory => "memory_unreadable",
        /// The code type's size is not the layout's, or (3.13+) the interpreter's own
        /// `_Py_DebugOffsets` disagree with it: another build than its version says.
        LayoutMismatch => "layout_mismatch",
        /// A code object on the main thread's frame chain is not of the code type, in
        /// three looks: the layout reads the wrong words.
        CodeCheck => "code_check_failed",
        /// Its thread-state key is past glibc's first block.
        TssKey => "tss_key",
        /// The sampler's `py_procs` map refused the entry.
        MapFull => "map_full",
        /// Its runtime never finished initializing while the loader kept looking.
        NeverReady => "never_ready",
    }
}

label_enum! {
    /// `ember_debuginfod_requests_total{result}`: what came of asking the debuginfod servers
    /// for a debug file by build id.
    pub enum DebuginfodResult {
        /// Fetched, its build id checked, stored in the disk cache.
        Fetched => "fetched",
        /// Every server answered 404.
        NotFound => "not_found",
        /// No answer within `symbols.debuginfod_timeout` (connect, headers and body).
        Timeout => "timeout",
        /// The connection failed or broke.
        Connect => "connect_error",
        /// Another HTTP status than 200 or 404.
        Http => "http_error",
        /// Over `symbols.debuginfod_max_file_bytes` (declared or streamed), or over the
        /// disk cache's budget.
        TooLarge => "too_large",
        /// An ELF file with another build id than the one asked for.
        WrongBuildId => "wrong_build_id",
        /// Not an ELF file ember can read.
        Malformed => "malformed",
        /// The disk cache could not be written.
        Io => "io_error",
    }
}

label_enum! {
    /// `ember_python_code_reads_total{result}`: naming a Python frame from its code object.
    pub enum PyCodeRead {
        /// Named from the cache.
        Hit => "hit",
        /// Read from the process and named.
        Read => "read",
        /// The process is not attached (exited, or never was): left unnamed.
        NoProcess => "no_process",
        /// The memory could not be read (freed, unmapped, process gone).
        Memory => "memory_unreadable",
        /// Not a code object of the type the walker expects.
        Type => "type_mismatch",
        /// A code object, but not the one the walker saw (its first line differs).
        Fingerprint => "fingerprint_mismatch",
        /// A name, file or line table refused (too large, wrong kind, malformed).
        Refused => "refused",
    }
}

label_enum! {
    /// `ember_jvm_perfmap_refreshes_total{result}`: how asking a JVM to rewrite its perf map
    /// over the attach protocol ended.
    pub enum JvmRefresh {
        /// The JVM rewrote its perf map.
        Ok => "ok",
        /// The process has no SIGQUIT handler, so it was not signalled.
        NoHandler => "no_handler",
        /// The JVM's `/tmp` could not be opened safely.
        Tmp => "tmp",
        /// Taking the JVM's uid/gid on the attach thread failed.
        Credentials => "credentials",
        /// The JVM did not open its attach socket in time.
        NoSocket => "no_socket",
        /// Talking to the attach socket failed.
        Io => "io",
        /// The JVM answered with a non-zero result.
        Refused => "refused",
        /// The process exited, or its pid now names another process, before the signal.
        Gone => "gone",
        /// `.java_pid<pid>` is not a socket (a symlink or a file put there): never connected.
        NotSocket => "not_socket",
        /// The attach did not finish within its one total deadline (connect, write, answer).
        Timeout => "timeout",
        /// The JVM's root or `/tmp` is on a FUSE, network or unknown file system, or the
        /// socket's name leads onto another mount: not touched.
        RemoteFs => "remote_fs",
    }
}

label_enum! {
    /// `ember_symbol_misses_total{reason}`: addresses of object files that got no name.
    /// Counted once per address looked up (a cached answer is not counted again); the frame
    /// is kept as `libfoo.so+0x1a2b`.
    pub enum SymbolMiss {
        /// The file offset is in no loadable segment of the object.
        InvalidFileOffset => "invalid_file_offset",
        /// The object has no symbols at all (stripped, and no debug file by build id).
        MissingSyms => "missing_syms",
        /// The object's symbols do not cover the address.
        UnknownAddr => "unknown_addr",
        /// The object could not be read or parsed (why: `ember_object_refusals_total`).
        Error => "error",
    }
}

label_enum! {
    /// A pipeline stage whose progress `/healthz` watches ([`super::progress::Progress`]).
    pub enum Stage {
        /// The sampling thread draining the ring buffer.
        Capture => "capture",
        /// The aggregation thread (normalization, windows).
        Aggregate => "aggregate",
        /// The output thread (symbolization, encoding, writing).
        Output => "output",
    }
}

label_enum! {
    /// `ember_object_refusals_total{reason}`: object files (executables, libraries, debug
    /// files) that ember refused to open or read, for symbols, build ids or unwind tables.
    /// The object stays unnamed (`lib.so+0x…`) and the agent goes on.
    pub enum ObjectRefusal {
        /// Neither `/proc/PID/map_files` nor the path inside the process's root opened (gone,
        /// or permission), or a debug file inside a process's root failed to open.
        Open => "open",
        /// A path inside a process's root (a mapped object where `map_files` was refused, a
        /// debug file by build id) is or passes through a symlink: not followed.
        Symlink => "symlink",
        /// The mapping is of a deleted file and `map_files` was refused: the path now names
        /// something else, so it is not opened.
        Deleted => "deleted",
        /// Not a regular file (a FIFO, device, socket or directory swapped in).
        NotRegular => "not_regular",
        /// Larger than the caps (`symbols.max_object_bytes`, `symbols.max_read_bytes`, a
        /// section over `symbols.max_section_bytes`).
        TooLarge => "too_large",
        /// A read failed or came up short (the file was truncated while read).
        Io => "io",
        /// Not an ELF object, or headers that contradict the file.
        Malformed => "malformed",
        /// A compressed section declares a size over `symbols.max_section_bytes`.
        CompressedSize => "compressed_size",
        /// A compressed section inflates past its declared size, or is not valid zlib.
        Inflate => "inflate",
        /// A section compression ember does not inflate (zstd).
        Compression => "compression",
        /// The parser panicked; the panic was caught.
        Panic => "panic",
        /// Its symbol table is bigger than `symbols.cache_bytes`: it named one window's
        /// frames, then the object stays unnamed for a while rather than being parsed again
        /// in every window.
        OverBudget => "over_budget",
        /// On a FUSE file system (`fuse`, `fuse.*`, `fuseblk`, or an overlay over one): its
        /// daemon, which a pod may run, could leave a read waiting forever. Never opened,
        /// stat'ed or read.
        Fuse => "fuse",
        /// On a network file system (NFS, CIFS, 9p, Ceph, ...): never opened or read.
        NetworkFs => "network_fs",
        /// On a mount in neither the process's nor the host's mountinfo (detached, or the
        /// kernel's own such as memfd's): what would answer cannot be told, so not read.
        UnknownFs => "unknown_fs",
        /// The file opened is not the one the maps entry names (another device or inode: the
        /// mapping or the path was replaced meanwhile): nothing of it is read, so no other
        /// file's names are shown for the mapping.
        Mismatch => "mismatch",
    }
}

label_enum! {
    /// `ember_dwarf_objects_total{result}`: what came of reading an object's DWARF (in it or
    /// its debug file) for inlined frames and source lines; counted once per object read.
    /// Every value is created at zero at start.
    pub enum DwarfRead {
        /// Read: its sampled addresses got their inline chains and lines.
        Lines => "lines",
        /// No `.debug_info` in the object or a debug file by its build id: names only.
        NoDwarf => "no_dwarf",
        /// Its DWARF sections are over `symbols.dwarf_bytes` (or one over
        /// `symbols.max_section_bytes`): names only, not read again while the file lives.
        OverCap => "over_cap",
        /// Compressed sections refused: zstd, GNU `.zdebug_*`, or zlib ones declaring more
        /// than the cap or inflating past their size.
        Compressed => "compressed",
        /// DIEs nested deeper than 1024 levels (the lookup recurses per inline level).
        TooDeep => "too_deep",
        /// Sections that do not parse, a short read, or an unreadable object.
        Malformed => "malformed",
        /// The DWARF reader panicked; the panic was caught and the object keeps names only.
        Panic => "panic",
    }
}

label_enum! {
    /// `ember_symbols_total{source}`: where the name of an object file's address came from,
    /// counted once per address looked up (a cached answer is not counted again). Every
    /// value is created at zero at start. (`.gnu_debuglink` is never a source: ember follows
    /// no path named inside an object.)
    pub enum SymbolSource {
        /// The object's own `.symtab`.
        Symtab => "symtab",
        /// Only the object's `.dynsym` (stripped, no debug file found): exported names.
        Dynsym => "dynsym",
        /// The `.symtab` of a debug file found by build id in `symbols.debug_dirs` or, inside
        /// the process's root, `symbols.root_debug_dirs`.
        BuildIdDir => "build_id_dir",
        /// The `.symtab` of a debug file fetched from a debuginfod server.
        Debuginfod => "debuginfod",
        /// No symbol covers it, but the DWARF does.
        Dwarf => "dwarf",
        /// No name: kept as `libfoo.so+0x1a2b` (why: `ember_symbol_misses_total`).
        Unnamed => "none",
    }
}

label_enum! {
    /// `ember_dwarf_skipped_total{reason}`: sampled addresses of an object whose DWARF was
    /// read that got no inline chain or line, counted once per address looked up.
    pub enum DwarfSkip {
        /// The unit covering it did not fit under `symbols.dwarf_bytes`.
        OverCap => "over_cap",
        /// The unit covering it nests DIEs deeper than 1024 levels.
        TooDeep => "too_deep",
        /// The unit covering it does not parse.
        Malformed => "malformed",
        /// No unit covers it (no `.debug_aranges` range holds it: code built without `-g`).
        NoUnit => "no_unit",
        /// The unit covering it was not read yet: reads are paced (all of
        /// `symbols.dwarf_bytes` per 320 s); the address is looked up again next window.
        Deferred => "deferred",
    }
}

label_enum! {
    /// `ember_symbol_names_capped_total{reason}`: symbol names kept short of what a file
    /// made of them. Every value is created at zero at start.
    pub enum NameCap {
        /// Its demangled form passed 4 KiB (a few hundred bytes of C++ whose template
        /// arguments refer back to earlier ones demangle to gigabytes): shown as stored.
        /// Counted once per address named.
        DemangleOutput => "demangle_output",
        /// A demangler panicked (caught): shown as stored.
        DemanglePanic => "demangle_panic",
        /// A name in a string table longer than 4 KiB, or with no NUL before the table's
        /// end: kept cut at 4 KiB. Counted once per name as a table is built.
        NameLength => "name_length",
    }
}

label_enum! {
    /// `ember_export_*{sink}`: the network sink a series counts for.
    pub enum SinkName {
        /// Grafana Pyroscope (`sinks.pyroscope`).
        Pyroscope => "pyroscope",
        /// OTLP profiles over gRPC (`sinks.otlp`).
        Otlp => "otlp",
    }
}

/// `ember_export_dropped_total{reason}`: why a network sink dropped a request. The backend's
/// answers are open-ended, so they carry the status.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ExportDrop {
    /// Pushed out of the sink's queue (`sinks.queue_bytes`) by newer requests; the oldest go first.
    QueueFull,
    /// Larger than the whole queue on its own.
    TooLarge,
    /// Still queued or in flight when the shutdown grace ran out, or pushed after close.
    Shutdown,
    /// Retried until `sinks.retry_max_elapsed` ran out.
    RetriesExhausted,
    /// The window could not be encoded for this sink.
    Encode,
    /// The HTTP request could not be built (a header the client refuses).
    BadRequest,
    /// Delivering the request failed inside ember (a bug: the sink's task caught it, logged
    /// it and went on with the next request).
    Internal,
    /// The backend answered with this HTTP status (a permanent one: not 408, 429 or 5xx).
    Http(u16),
    /// The backend answered with this gRPC status code (a permanent one).
    Grpc(tonic::Code),
}

impl ExportDrop {
    /// The label value: `queue_full`, …, `http_<status>`, `grpc_<code in snake case>`.
    pub fn label(self) -> Cow<'static, str> {
        match self {
            ExportDrop::QueueFull => "queue_full".into(),
            ExportDrop::TooLarge => "too_large".into(),
            ExportDrop::Shutdown => "shutdown".into(),
            ExportDrop::RetriesExhausted => "retries_exhausted".into(),
            ExportDrop::Encode => "encode".into(),
            ExportDrop::BadRequest => "bad_request".into(),
            ExportDrop::Internal => "internal".into(),
            ExportDrop::Http(status) => format!("http_{status}").into(),
            ExportDrop::Grpc(code) => grpc_label(code).into(),
        }
    }
}

/// `grpc_` and the code's name in snake case, as the gRPC spec spells it in lower case.
fn grpc_label(code: tonic::Code) -> &'static str {
    use tonic::Code;
    match code {
        Code::Ok => "grpc_ok",
        Code::Cancelled => "grpc_cancelled",
        Code::Unknown => "grpc_unknown",
        Code::InvalidArgument => "grpc_invalid_argument",
        Code::DeadlineExceeded => "grpc_deadline_exceeded",
        Code::NotFound => "grpc_not_found",
        Code::AlreadyExists => "grpc_already_exists",
        Code::PermissionDenied => "grpc_permission_denied",
        Code::ResourceExhausted => "grpc_resource_exhausted",
        Code::FailedPrecondition => "grpc_failed_precondition",
        Code::Aborted => "grpc_aborted",
        Code::OutOfRange => "grpc_out_of_range",
        Code::Unimplemented => "grpc_unimplemented",
        Code::Internal => "grpc_internal",
        Code::Unavailable => "grpc_unavailable",
        Code::DataLoss => "grpc_data_loss",
        Code::Unauthenticated => "grpc_unauthenticated",
    }
}

impl fmt::Display for ExportDrop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.label())
    }
}

impl EncodeLabelValue for ExportDrop {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> fmt::Result {
        fmt::Write::write_str(encoder, &self.label())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    /// Label values are unique within a family, snake case, and what alerts and tests read.
    #[test]
    fn values_are_unique_and_snake_case() {
        fn check(values: &[&'static str]) {
            let set: HashSet<_> = values.iter().collect();
            assert_eq!(set.len(), values.len(), "{values:?}");
            for v in values {
                assert!(
                    v.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
                    "{v}"
                );
            }
        }
        check(&Loss::ALL.iter().map(|r| r.as_str()).collect::<Vec<_>>());
        check(&Cache::ALL.iter().map(|r| r.as_str()).collect::<Vec<_>>());
        // Both share the `cache` label of `ember_cache_dropped_total`.
        check(
            &Cache::ALL
                .iter()
                .map(|r| r.as_str())
                .chain(WindowFailure::ALL.iter().map(|f| f.as_str()))
                .collect::<Vec<_>>(),
        );
        check(&ProcRead::ALL.iter().map(|r| r.as_str()).collect::<Vec<_>>());
        check(
            &HttpRefusal::ALL
                .iter()
                .map(|r| r.as_str())
                .collect::<Vec<_>>(),
        );
        check(
            &JitReject::ALL
                .iter()
                .map(|r| r.as_str())
                .collect::<Vec<_>>(),
        );
        check(
            &JvmRefresh::ALL
                .iter()
                .map(|r| r.as_str())
                .collect::<Vec<_>>(),
        );
        check(
            &SymbolMiss::ALL
                .iter()
                .map(|r| r.as_str())
                .collect::<Vec<_>>(),
        );
        check(
            &ReadingsSource::ALL
                .iter()
                .map(|r| r.as_str())
                .collect::<Vec<_>>(),
        );
        let sinks: Vec<_> = SinkName::ALL.iter().map(|r| r.as_str()).collect();
        check(&sinks);
        assert_eq!(
            sinks,
            ["pyroscope", "otlp"],
            "the values /metrics has always shown"
        );
        assert_eq!(
            Loss::ALL.iter().map(|r| r.as_str()).collect::<Vec<_>>(),
            [
                "ringbuf_full",
                "no_scratch",
                "malformed",
                "queue_full",
                "stack_cap",
                "window_queue"
            ]
        );
    }

    /// The gRPC labels are the code's `Debug` name in snake case, as they were before the
    /// table existed (`grpc_invalid_argument`, …).
    #[test]
    fn grpc_labels_are_snake_case_debug_names() {
        fn snake(code: tonic::Code) -> String {
            let mut out = String::from("grpc_");
            for (i, c) in format!("{code:?}").chars().enumerate() {
                if c.is_ascii_uppercase() && i > 0 {
                    out.push('_');
                }
                out.push(c.to_ascii_lowercase());
            }
            out
        }
        for n in 0..=16 {
            let code = tonic::Code::from_i32(n);
            assert_eq!(ExportDrop::Grpc(code).label(), snake(code));
        }
        assert_eq!(ExportDrop::Http(400).label(), "http_400");
        assert_eq!(
            ExportDrop::RetriesExhausted.to_string(),
            "retries_exhausted"
        );
    }
}
