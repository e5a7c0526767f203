//! The loader's policy: against the in-memory fake of the sampler's maps ([`FakeMaps`]:
//! no BPF, no root) with processes made up under a fake `/proc`, and against real maps
//! (root).

use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use libbpf_rs::{libbpf_sys, MapHandle, MapType};

use super::budget::{now_ns, PROC_COST};
use super::compile::{Stats, UnwindTable};
use super::fake::FakeMaps;
use super::files::kernel_dev;
use super::follow::Queued;
use super::loader::{bias, Loader, Settings};
use super::procs::{Proc, Range};
use super::row::{UnwindPage, UnwindRow};
use super::slots::GENERATIONS;
use super::store::TableKey;
use crate::capture::tasks::TaskEvent;
use crate::capture::unwind::{
    ember_unwind_file, UnwindIo, UnwindMaps, CHUNK_BYTES, FILES, PROC_BYTES, SLOTS, TABLE_NONE,
};
use crate::metrics::Metrics;

fn fake_loader(max_bytes: u64) -> Loader<FakeMaps> {
    let settings = Settings {
        max_bytes,
        cache_dir: None,
        python: false,
        subprocesses: false,
    };
    Loader::with_io(FakeMaps::default(), settings, Metrics::new())
}

/// A made-up table of one chunk (4 KiB in the kernel).
fn one_chunk_table() -> UnwindTable {
    UnwindTable {
        first_page: 1,
        pages: vec![UnwindPage {
            first_row: 0,
            row_count: 100,
        }],
        rows: vec![UnwindRow::default(); 100],
        segments: vec![(0x1000, 0x1000, 0x1000)],
        stats: Stats::default(),
    }
}

/// A process of one range in `key`'s table, written as the loader writes it.
fn put_user(loader: &mut Loader<FakeMaps>, pid: u32, key: TableKey) {
    let ranges = vec![Range {
        start: 0x10_0000,
        len: 0x1000,
        bias: 0,
        table: Some(key),
        file: Some(((8, 1), u64::from(pid))),
    }];
    assert!(loader.write_proc(pid, &ranges, false));
    loader.procs.put(
        pid,
        Proc {
            start_time: 1,
            ranges,
            read_ns: 0,
        },
    );
}

fn slot_of(loader: &Loader<FakeMaps>, key: &TableKey) -> u32 {
    let id = loader.slots.id(key).expect("loaded");
    id.0 & (SLOTS as u32 - 1)
}

/// Tables go least recently walked first, never one walked in the last 500 ms nor one over
/// half the cap; a table's users are pointed at the frame pointer and its files unpublished
/// before its slot is freed.
#[test]
fn eviction_follows_the_walker_under_the_budget() {
    let mut l = fake_loader(4 * CHUNK_BYTES as u64 + PROC_COST);
    let t = one_chunk_table();
    let keys: Vec<TableKey> = (1..=8u8).map(|i| [i; 16]).collect();
    for key in &keys[..4] {
        assert!(l.install(*key, &t));
    }
    l.commit();
    let now = now_ns();
    let slots: Vec<u32> = keys[..4].iter().map(|k| slot_of(&l, k)).collect();
    // Walked 1 s, 3 s, 0 s and 2 s ago (in ms).
    for (slot, ago) in slots.iter().zip([1_000, 3_000, 0, 2_000]) {
        l.io.mark_used(*slot, now - ago * 1_000_000);
    }
    put_user(&mut l, 77, keys[1]);
    let published = super::files::Published {
        key: keys[1],
        size: 1,
        ctime: Default::default(),
    };
    let id = l.slots.id(&keys[1]).expect("loaded");
    let m = l.metrics.clone();
    l.files
        .publish(&mut l.io, (8, 77), published, (id, &[]), &m);
    assert_eq!(l.io.range_tables(77), Some(vec![id.0]));
    assert_eq!(l.io.files.len(), 1);

    assert!(l.install(keys[4], &t), "room made by the least recent");
    assert_eq!(l.io.evicted, [slots[1]]);
    assert_eq!(l.io.range_tables(77), Some(vec![TABLE_NONE]));
    assert!(l.io.files.is_empty(), "its file is unpublished");
    assert!(l.install(keys[5], &t));
    assert!(l.install(keys[6], &t));
    assert_eq!(l.io.evicted, [slots[1], slots[3], slots[0]]);
    // Left: the table in use and three just put in (stamped now): no room.
    assert!(!l.install(keys[7], &t));
    assert_eq!(l.io.evicted.len(), 3);
    assert!(l
        .metrics
        .encode()
        .contains("ember_unwind_tables_built_total{result=\"over_budget\"} 1"));
    assert!(l.budget.is_refused(&keys[7]), "not tried again at once");
    // A table over half the cap is refused without evicting anything.
    let mut big = one_chunk_table();
    big.rows = vec![UnwindRow::default(); 3 * 512];
    l.io.mark_used(slots[2], 1);
    assert!(!l.install([9; 16], &big));
    assert_eq!(l.io.evicted.len(), 3);
    l.commit();
    assert_eq!(l.io.tables.len(), 4);
}

/// When a slot's ids start over, the walker's row caches are emptied (a row cached for
/// the id GENERATIONS tables ago could still be there), and only then.
#[test]
fn a_generation_wrap_empties_the_row_caches() {
    let mut l = fake_loader(1 << 30);
    let t = one_chunk_table();
    l.slots.set_held(0, u64::from(GENERATIONS) - 1);
    let (a, b) = ([1; 16], [2; 16]);
    assert!(l.install(a, &t));
    l.commit();
    let last = l.slots.id(&a).expect("loaded");
    assert_eq!(last.0, (GENERATIONS - 1) << 12);
    assert_eq!(l.io.cache_clears, 0);
    l.io.mark_used(0, 1);
    assert!(l.evict_one().is_some());
    assert!(l.install(b, &t));
    l.commit();
    assert_eq!(l.io.cache_clears, 1);
    assert_eq!(
        l.slots.id(&b).map(|id| id.0),
        Some(0),
        "slot 0, generation 0"
    );
    put_user(&mut l, 5, b);
    assert_eq!(l.io.range_tables(5), Some(vec![0]));
}

/// A fake `/proc/PID` for `pid` in `proc_root`: its root is `root` (no `map_files`, so
/// objects are opened by path there), its mountinfo this process's; `stat` gives start time
/// `start`, and `maps` maps `file` (inside `root`) executable at `at`.
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
    let stat = format!("{pid} (fake) {}\n", fields.join(" "));
    std::fs::write(dir.join("stat"), stat).expect("stat");
    let m = std::fs::metadata(root.join(file.trim_start_matches('/'))).expect("file");
    let (major, minor) = (libc::major(m.dev()), libc::minor(m.dev()));
    let maps = format!(
        "{at:x}-{:x} r-xp 00000000 {major:02x}:{minor:02x} {} {file}\n",
        at + 0x10000,
        m.ino()
    );
    std::fs::write(dir.join("maps"), maps).expect("maps");
}

/// `/bin/sleep`, and the same program with the second half of its `.eh_frame` zeroed
/// (other CFI, the same size).
fn two_programs() -> (Vec<u8>, Vec<u8>) {
    use object::{Object, ObjectSection};
    let sleep = std::fs::read("/bin/sleep").expect("sleep");
    let mut other = sleep.clone();
    let f = object::File::parse(&sleep[..]).expect("elf");
    let (at, size) = f
        .section_by_name(".eh_frame")
        .and_then(|s| s.file_range())
        .expect(".eh_frame");
    let (at, size) = (at as usize, size as usize);
    other[at + size / 2..at + size].fill(0);
    (sleep, other)
}

/// A fake host: `proc` and a root with `bin/`.
struct Host {
    _dir: tempfile::TempDir,
    proc_root: PathBuf,
    root: PathBuf,
}

impl Host {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("tmp");
        let (proc_root, root) = (dir.path().join("proc"), dir.path().join("root"));
        std::fs::create_dir_all(root.join("bin")).expect("mkdir");
        Self {
            _dir: dir,
            proc_root,
            root,
        }
    }

    fn write(&self, name: &str, bytes: &[u8]) -> std::fs::Metadata {
        let path = self.root.join("bin").join(name);
        std::fs::write(&path, bytes).expect("write");
        std::fs::metadata(&path).expect("stat")
    }

    fn process(&self, pid: u32, start: u64, name: &str) {
        let file = format!("/bin/{name}");
        fake_process(&self.proc_root, &self.root, pid, start, &file, 0x40_0000);
    }

    fn loader(&self) -> Loader<FakeMaps> {
        let mut l = fake_loader(64 << 20);
        l.proc_root = self.proc_root.clone();
        l
    }
}

/// The table of `pid`'s only range.
fn table_of_only_range(l: &Loader<FakeMaps>, pid: u32) -> Option<TableKey> {
    let p = l.procs.get(pid)?;
    assert_eq!(p.ranges.len(), 1);
    p.ranges[0].table
}

/// A process that exits leaves nothing behind: not its ranges, not its inode's table (the
/// inode may be given to another file), whether its exit record comes or a sweep finds it.
#[test]
fn a_process_that_exits_is_forgotten() {
    let host = Host::new();
    let (sleep, _) = two_programs();
    let meta = host.write("prog", &sleep);
    let mut l = host.loader();
    let inode = (
        (libc::major(meta.dev()), libc::minor(meta.dev())),
        meta.ino(),
    );
    for (pid, by_record) in [(4_000_001, false), (4_000_002, true)] {
        host.process(pid, 100, "prog");
        l.load(pid);
        let key = table_of_only_range(&l, pid).expect("a table");
        let id = l.slots.id(&key).expect("loaded");
        assert_eq!(l.io.range_tables(pid), Some(vec![id.0]));
        assert_eq!(l.procs.inode_table(&inode), Some(key));
        std::fs::remove_dir_all(host.proc_root.join(pid.to_string())).expect("exit");
        if by_record {
            let exit = TaskEvent::Exit { pid, time_ns: 0 };
            l.on_task(exit, &mut Queued::default());
        } else {
            l.sweep();
        }
        assert!(l.procs.get(pid).is_none(), "{pid}");
        assert_eq!(l.io.range_tables(pid), None, "{pid}");
        assert_eq!(l.procs.inode_table(&inode), None, "{pid}");
        assert_eq!(
            l.slots.id(&key),
            Some(id),
            "the table stays for the next user"
        );
    }
}

/// A pid given to another process (another start time) is another process: a sweep drops
/// the old one's ranges, and the new one gets its own program's table.
#[test]
fn a_reused_pid_is_read_as_a_new_process() {
    let host = Host::new();
    let (sleep, other) = two_programs();
    host.write("old", &sleep);
    host.write("new", &other);
    let mut l = host.loader();
    let pid = 4_000_003;
    host.process(pid, 100, "old");
    l.load(pid);
    let old = table_of_only_range(&l, pid).expect("old's table");
    host.process(pid, 200, "new");
    l.sweep();
    assert!(l.procs.get(pid).is_none(), "the old process is gone");
    assert_eq!(l.io.range_tables(pid), None);
    l.load(pid);
    assert_eq!(l.procs.get(pid).map(|p| p.start_time), Some(200));
    let new = table_of_only_range(&l, pid).expect("new's table");
    assert_ne!(new, old);
    let id = l.slots.id(&new).expect("loaded").0;
    assert_eq!(l.io.range_tables(pid), Some(vec![id]));
    // The same process seen again: nothing changes.
    l.sweep();
    assert_eq!(l.io.range_tables(pid), Some(vec![id]));
}

/// A file rewritten under the same path (the same inode, another size, mtime or ctime) is
/// another file: read again, its own table, and `unwind_files` names the new table with
/// the new ctime (the sampler checks it against the inode it finds).
#[test]
fn a_file_replaced_under_the_same_path_gets_its_own_table() {
    let host = Host::new();
    let (sleep, other) = two_programs();
    let before = host.write("prog", &sleep);
    let mut l = host.loader();
    host.process(4_000_004, 100, "prog");
    l.load(4_000_004);
    let first = table_of_only_range(&l, 4_000_004).expect("a table");
    let dev = (libc::major(before.dev()), libc::minor(before.dev()));
    let kfile = (kernel_dev(dev), before.ino());
    assert_eq!(l.files.published(&kfile).map(|p| p.key), Some(first));

    // Rewritten in place: ctime moves on (a tick of the file system's clock at most).
    std::thread::sleep(Duration::from_millis(20));
    let after = host.write("prog", &other);
    assert_eq!(after.ino(), before.ino(), "the same inode");
    assert_ne!(
        (after.ctime(), after.ctime_nsec()),
        (before.ctime(), before.ctime_nsec())
    );
    host.process(4_000_005, 100, "prog");
    l.load(4_000_005);
    let second = table_of_only_range(&l, 4_000_005).expect("a table");
    assert_ne!(second, first, "the old table for the new bytes");
    let entry: Option<ember_unwind_file> = l.io.files.get(&kfile).copied();
    let id = l.slots.id(&second).expect("loaded").0;
    assert_eq!(
        entry.map(|f| (f.table, f.ctime_sec, i64::from(f.ctime_nsec), f.size)),
        Some((id, after.ctime(), after.ctime_nsec(), after.len()))
    );
    assert_eq!(l.procs.inode_table(&(dev, after.ino())), Some(second));
}

/// A child starts with its parent's ranges; a library mapped later by a known object is
/// added from its mmap record without reading `/proc`.
#[test]
fn forks_and_mmaps_follow_the_records() {
    let host = Host::new();
    let (sleep, _) = two_programs();
    let meta = host.write("prog", &sleep);
    let mut l = host.loader();
    let (parent, child) = (4_000_006, 4_000_007);
    host.process(parent, 100, "prog");
    l.load(parent);
    let key = table_of_only_range(&l, parent).expect("a table");
    host.process(child, 101, "prog");
    let fork = TaskEvent::Fork {
        pid: child,
        ppid: parent,
        time_ns: 0,
    };
    let mut q = Queued::default();
    l.on_task(fork, &mut q);
    assert_eq!(l.io.range_tables(child), l.io.range_tables(parent));
    let mmap = crate::capture::tasks::Mmap {
        pid: child,
        tid: child,
        start: 0x7f00_0000_0000,
        len: 0x1_0000,
        pgoff: 0,
        dev: (libc::major(meta.dev()), libc::minor(meta.dev())),
        inode: meta.ino(),
        inode_generation: 0,
        prot: libc::PROT_READ as u32 | libc::PROT_EXEC as u32,
        flags: libc::MAP_PRIVATE as u32,
        time_ns: 0,
        path: "/bin/prog".to_owned(),
    };
    l.on_task(TaskEvent::Mmap(mmap), &mut q);
    let id = l.slots.id(&key).expect("loaded").0;
    assert_eq!(l.io.range_tables(child), Some(vec![id, id]));
    assert!(q.dirty.contains(&child), "read in full once it settles");
}

/// With `sampling.pids` and `subprocesses`, a child of a followed process is followed from
/// its fork to its exit; a child of another process is not, nor any without `subprocesses`.
#[test]
fn children_of_followed_processes_are_followed_with_subprocesses() {
    let host = Host::new();
    let (sleep, _) = two_programs();
    host.write("prog", &sleep);
    let (parent, child, stranger, other) = (4_000_016, 4_000_017, 4_000_018, 4_000_019);
    for (pid, start) in [(parent, 100), (child, 101), (stranger, 102), (other, 103)] {
        host.process(pid, start, "prog");
    }
    let fork = |pid, ppid| TaskEvent::Fork {
        pid,
        ppid,
        time_ns: 0,
    };
    for subprocesses in [true, false] {
        let mut l = host.loader();
        l.subprocesses = subprocesses;
        l.load(parent);
        l.load(stranger);
        let mut q = Queued {
            only: [parent].into(),
            ..Default::default()
        };
        l.on_task(fork(child, parent), &mut q);
        l.on_task(fork(other, stranger), &mut q);
        let followed = l.io.range_tables(child).is_some();
        assert_eq!(followed, subprocesses, "subprocesses: {subprocesses}");
        assert_eq!(q.children.contains(&child), subprocesses);
        assert!(l.io.range_tables(other).is_none() && !q.children.contains(&other));
        l.on_task(
            TaskEvent::Exit {
                pid: child,
                time_ns: 0,
            },
            &mut q,
        );
        assert!(q.children.is_empty(), "the exit ends it");
        assert!(l.io.range_tables(child).is_none());
    }
}

#[test]
fn bias_maps_pc_to_object_address() {
    // A PIE's text: file offset 0x1000 at address 0x1000, mapped at 0x5555_0000_1000.
    let segs = [(0x1000, 0x1000, 0x5000)];
    assert_eq!(bias(&segs, 0x5555_0000_1000, 0x1000), 0x5555_0000_0000);
    // A non-PIE executable linked at 0x400000: text at file offset 0x1000.
    let segs = [(0x401000, 0x1000, 0x2000)];
    assert_eq!(0x401234 - bias(&segs, 0x401000, 0x1000), 0x401234);
    // A segment whose offset is not page-aligned is mapped from its page start.
    let segs = [(0x2a5e0, 0x295e0, 0x1000)];
    let b = bias(&segs, 0x7f00_0002_9000, 0x29000);
    assert_eq!(0x7f00_0002_95e0 - b, 0x2a5e0);
}

/// The sampler's unwind maps, made like the BPF object's (root only).
fn test_maps() -> UnwindMaps {
    let opts = |flags: u32| libbpf_sys::bpf_map_create_opts {
        sz: std::mem::size_of::<libbpf_sys::bpf_map_create_opts>() as _,
        map_flags: flags,
        ..Default::default()
    };
    let create = |kind, name: &str, key: usize, value: usize, n: usize, o| {
        MapHandle::create(kind, Some(name), key as u32, value as u32, n as u32, &o).expect(name)
    };
    let inner = create(
        MapType::Array,
        "t_inner",
        4,
        CHUNK_BYTES,
        1,
        opts(libbpf_sys::BPF_F_INNER_MAP | libbpf_sys::BPF_F_MMAPABLE),
    );
    let mut outer = opts(0);
    outer.inner_map_fd = inner.as_fd().as_raw_fd() as u32;
    let no_prealloc = libbpf_sys::BPF_F_NO_PREALLOC;
    UnwindMaps {
        py_procs: create(MapType::Hash, "t_py", 4, 80, 16, opts(no_prealloc)),
        tables: create(MapType::ArrayOfMaps, "t_tables", 4, 4, SLOTS, outer),
        procs: create(
            MapType::Hash,
            "t_procs",
            4,
            PROC_BYTES,
            256,
            opts(no_prealloc),
        ),
        used: create(
            MapType::Array,
            "t_used",
            4,
            8,
            SLOTS,
            opts(libbpf_sys::BPF_F_MMAPABLE),
        ),
        files: create(
            MapType::Hash,
            "t_files",
            16,
            std::mem::size_of::<ember_unwind_file>(),
            FILES,
            opts(no_prealloc),
        ),
        row_cache: create(MapType::PercpuArray, "t_rows", 4, 24 << 10, 1, opts(0)),
        exec_hook: true,
    }
}

/// Root, or (under `EMBER_REQUIRE_PRIVILEGED=1`) a failure: BPF maps need it.
fn privileged() -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    assert!(
        std::env::var("EMBER_REQUIRE_PRIVILEGED").as_deref() != Ok("1"),
        "needs root (BPF maps) and EMBER_REQUIRE_PRIVILEGED=1 forbids skipping"
    );
    eprintln!("skipped: needs root");
    false
}

/// A running copy of `sleep` at `path`: its pid once its exec is in its maps.
fn run_copy(path: &Path) -> std::process::Child {
    let child = std::process::Command::new(path)
        .arg("60")
        .spawn()
        .expect("spawn");
    let maps = format!("/proc/{}/maps", child.id());
    // The kernel names the file by its resolved path (no `..`).
    let shown = std::fs::canonicalize(path).expect("path");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !std::fs::read_to_string(&maps)
        .unwrap_or_default()
        .contains(shown.to_str().expect("utf-8"))
    {
        assert!(
            Instant::now() < deadline,
            "{} did not start",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    child
}

/// The table of the range of `pid` that maps inode `ino`.
fn table_of<M: UnwindIo>(loader: &Loader<M>, pid: u32, ino: u64) -> Option<TableKey> {
    let p = loader.procs.get(pid).expect("process loaded");
    let r = p.ranges.iter().find(|r| r.file.is_some_and(|f| f.1 == ino));
    r.and_then(|r| r.table)
}

/// Tenant A's program is loaded, exits and is deleted; tenant B's program, the same
/// size and mtime but other CFI, gets A's inode: B gets its own table, not A's, and
/// the inode's entries of A are gone (the loader's) or no longer match B (the
/// sampler's `unwind_files`: size and ctime). On main B was handed A's table: its
/// identity (dev, inode, size, mtime) was A's.
#[test]
fn an_inode_reused_by_another_file_gets_its_own_table() {
    if !privileged() {
        return;
    }
    let (sleep, other) = two_programs();
    // The filesystem of the temp dir, else the target dir's, must reuse freed inodes.
    let dirs = [
        tempfile::tempdir().expect("tmp"),
        // Canonical: the path must read as /proc/PID/maps names it.
        tempfile::tempdir_in(
            std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
                .canonicalize()
                .expect("workspace"),
        )
        .expect("tmp"),
    ];
    let metrics = Metrics::new();
    let mut loader = Loader::new(
        test_maps(),
        Settings {
            max_bytes: 32 << 20,
            cache_dir: None,
            python: false,
            subprocesses: false,
        },
        metrics.clone(),
    )
    .expect("loader");
    for dir in &dirs {
        let a_path = dir.path().join("tenant-a");
        std::fs::write(&a_path, &sleep).expect("write a");
        std::fs::set_permissions(&a_path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let a_meta = std::fs::metadata(&a_path).expect("stat a");
        let ino = a_meta.ino();
        let mut a = run_copy(&a_path);
        let a_pid = a.id();
        loader.load(a_pid);
        let key_a = table_of(&loader, a_pid, ino).expect("A has a table");
        let file = loader
            .procs
            .get(a_pid)
            .and_then(|p| p.ranges.iter().find_map(|r| r.file.filter(|f| f.1 == ino)))
            .expect("A's range");
        assert_eq!(loader.procs.inode_table(&file), Some(key_a));
        let kernel_id = (kernel_dev(file.0), ino);
        assert_eq!(
            loader.files.published(&kernel_id).map(|p| p.key),
            Some(key_a)
        );

        // A exits: the loader's inode entry goes with its last range.
        let _ = a.kill();
        let _ = a.wait();
        loader.sweep();
        assert!(loader.procs.get(a_pid).is_none());
        assert!(
            loader.procs.inode_table(&file).is_none(),
            "A's inode still names A's table after A is gone"
        );
        std::fs::remove_file(&a_path).expect("rm a");

        // B takes A's inode if this filesystem gives it out again.
        let mut held = Vec::new();
        let mut b_path = None;
        for i in 0..1000 {
            let p = dir.path().join(format!("tenant-b{i}"));
            std::fs::write(&p, &other).expect("write b");
            if std::fs::metadata(&p).expect("stat b").ino() == ino {
                b_path = Some(p);
                break;
            }
            held.push(p);
        }
        let Some(b_path) = b_path else {
            eprintln!(
                "{}: inode {ino} not reused, next place",
                dir.path().display()
            );
            continue;
        };
        let b_file = std::fs::File::options()
            .write(true)
            .open(&b_path)
            .expect("open b");
        b_file
            .set_modified(a_meta.modified().expect("mtime"))
            .expect("set mtime");
        drop(b_file);
        std::fs::set_permissions(&b_path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let b_meta = std::fs::metadata(&b_path).expect("stat b");
        assert_eq!(
            (
                b_meta.ino(),
                b_meta.len(),
                b_meta.mtime(),
                b_meta.mtime_nsec()
            ),
            (ino, a_meta.len(), a_meta.mtime(), a_meta.mtime_nsec()),
            "B looks like A but for its ctime"
        );
        // What the sampler would find for B's inode before the loader reads B: nothing,
        // or an entry whose ctime is not B's (it walks B by the frame pointer).
        if let Some(p) = loader.files.published(&kernel_id) {
            assert_ne!(
                (p.ctime.sec, i64::from(p.ctime.nsec)),
                (b_meta.ctime(), b_meta.ctime_nsec()),
                "unwind_files would give B A's table"
            );
        }

        let mut b = run_copy(&b_path);
        let b_pid = b.id();
        loader.load(b_pid);
        let key_b = table_of(&loader, b_pid, ino);
        let _ = b.kill();
        let _ = b.wait();
        assert!(key_b.is_some(), "B has a table of its own");
        assert_ne!(key_b, Some(key_a), "B was given A's table");
        assert_eq!(
            loader
                .files
                .published(&kernel_id)
                .map(|p| (p.key, (p.ctime.sec, i64::from(p.ctime.nsec)))),
            Some((key_b.expect("B"), (b_meta.ctime(), b_meta.ctime_nsec())))
        );

        // A file opened that is not the inode the mapping names is not read.
        let f = std::fs::File::open(&b_path).expect("open b");
        assert!(loader.file_table(&f, ino + 1).is_none());
        let text = metrics.encode();
        assert!(
            text.contains("ember_unwind_tables_built_total{result=\"other_file\"} 1"),
            "{text}"
        );
        return;
    }
    eprintln!("no filesystem here reuses freed inodes: the case cannot occur");
}

#[test]
fn reads_past_the_rate_wait_and_an_exit_while_waiting_is_counted() {
    let mut l = fake_loader(1 << 20);
    let mut q = Queued::default();
    let allowed = (0..1000).take_while(|_| q.reads.try_take()).count();
    // A burst of the rate's size at once (plus the few earned while taking them), no more.
    let rate = super::follow::READS_PER_SEC as usize;
    assert!(
        (rate..rate + 10).contains(&allowed),
        "{allowed} reads allowed at once"
    );
    let (short, long) = (4_100_001, 4_100_002);
    for pid in [short, long] {
        let exec = TaskEvent::Exec {
            pid,
            tid: pid,
            time_ns: 0,
            comm: [0; 16],
        };
        l.on_task(exec, &mut q);
    }
    assert!(q.dirty.contains(&short) && q.dirty.contains(&long));
    l.on_task(
        TaskEvent::Exit {
            pid: short,
            time_ns: 0,
        },
        &mut q,
    );
    assert!(!q.dirty.contains(&short), "an exited process is never read");
    assert!(q.dirty.contains(&long), "a live one waits for its turn");
    let text = l.metrics.encode();
    assert!(
        text.contains("ember_cache_dropped_total{cache=\"process_reads\"} 1"),
        "{text}"
    );
    std::thread::sleep(Duration::from_millis(30));
    assert!(q.reads.try_take(), "the rate refills");
}

/// A process the sampler samples before the loader has read it (the exec hook wrote its
/// ranges; an `Unread` ask) is read at once, however spent the rate of paced reads is, and
/// once: its exec record and a second ask, both older than that read, ask for no other. A
/// library it maps after the read is read ahead of the rate too; after another exec it is
/// paced again until sampled.
#[test]
fn a_sampled_process_is_read_past_the_rate_and_only_once() {
    use crate::capture::{Ask, Work};
    let host = Host::new();
    let (sleep, _) = two_programs();
    let meta = host.write("prog", &sleep);
    let mut l = host.loader();
    let mut q = Queued::default();
    while q.reads.try_take() {}
    let pid = 4_000_020;
    host.process(pid, 100, "prog");
    let exec = |time_ns| TaskEvent::Exec {
        pid,
        tid: pid,
        time_ns,
        comm: [0; 16],
    };
    let exec_at = now_ns();
    // The ask comes before the exec record (the task reader gathers records).
    let sampled_at = now_ns();
    l.take(
        Work::Ask(Ask::Unread {
            pid,
            at: sampled_at,
        }),
        &mut q,
    );
    assert!(l.read_unread(&mut q));
    assert!(
        table_of_only_range(&l, pid).is_some(),
        "read at once, the rate spent"
    );
    let read_ns = l.procs.get(pid).expect("read").read_ns;
    assert!(read_ns >= sampled_at, "the read is stamped when it starts");
    l.on_task(exec(exec_at), &mut q);
    assert!(
        l.procs.contains(pid) && !q.dirty.contains(&pid),
        "an exec record older than the read reads nothing more"
    );
    l.take(
        Work::Ask(Ask::Unread {
            pid,
            at: sampled_at,
        }),
        &mut q,
    );
    assert!(l.read_unread(&mut q));
    assert_eq!(
        l.procs.get(pid).map(|p| p.read_ns),
        Some(read_ns),
        "an ask from before the read is served by it"
    );
    let mmap = crate::capture::tasks::Mmap {
        pid,
        tid: pid,
        start: 0x7f00_0000_0000,
        len: 0x1_0000,
        pgoff: 0,
        dev: (libc::major(meta.dev()), libc::minor(meta.dev())),
        inode: meta.ino(),
        inode_generation: 0,
        prot: libc::PROT_READ as u32 | libc::PROT_EXEC as u32,
        flags: libc::MAP_PRIVATE as u32,
        time_ns: now_ns(),
        path: "/bin/prog".to_owned(),
    };
    l.on_task(TaskEvent::Mmap(mmap), &mut q);
    assert!(
        q.unread.contains_key(&pid) && !q.dirty.contains(&pid),
        "a library mapped by a sampled process is read at once"
    );
    assert!(l.read_unread(&mut q));
    assert!(l.procs.get(pid).is_some_and(|p| p.read_ns > read_ns));
    l.on_task(exec(now_ns()), &mut q);
    assert!(
        q.dirty.contains(&pid) && !q.sampled.contains(&pid),
        "another program is paced until it is sampled"
    );
    l.on_task(
        TaskEvent::Exit {
            pid,
            time_ns: now_ns(),
        },
        &mut q,
    );
    assert!(q.unread.is_empty() && q.dirty.is_empty());
}

/// A pc outside a process's ranges asks for a read again; while task records are whole
/// since its last read (a new executable mapping would have come as one), the ask is
/// skipped and counted, and served again once records were lost or were never followed.
#[test]
fn a_range_miss_rereads_only_what_task_records_may_have_missed() {
    use crate::capture::{Ask, Work};
    let host = Host::new();
    let (sleep, _) = two_programs();
    host.write("prog", &sleep);
    let mut l = host.loader();
    let pid = 4_000_030;
    host.process(pid, 100, "prog");
    let mut q = Queued {
        whole_since: Some(now_ns()),
        ..Default::default()
    };
    let remap = || Work::Ask(Ask::Remap(pid));
    l.take(remap(), &mut q);
    assert!(q.asked.contains(&pid), "never read: served");
    q.asked.clear();
    l.load(pid);
    l.take(remap(), &mut q);
    assert!(
        !q.asked.contains(&pid),
        "read since records are whole: skipped"
    );
    assert_eq!(l.metrics.unwind_remaps_skipped.get(), 1);
    q.whole_since = Some(now_ns());
    l.take(remap(), &mut q);
    assert!(
        q.asked.contains(&pid),
        "records lost since its read: served"
    );
    q.asked.clear();
    l.load(pid);
    q.whole_since = None;
    l.take(remap(), &mut q);
    assert!(q.asked.contains(&pid), "records not followed: served");
    assert_eq!(l.metrics.unwind_remaps_skipped.get(), 1);
}

/// Python attach state is freed by the registry's exit events (by pid and start time), not
/// by a judgement of its own: an event of another process on the pid leaves the entry, the
/// window end that forgets the process takes it.
#[test]
fn python_attach_state_goes_with_the_registrys_exit_events() {
    use crate::config::{Jit, Limits, Python};
    use crate::process::registry::{self, Exit, Touch, WindowAsk};
    let settings = Settings {
        max_bytes: 1 << 20,
        cache_dir: None,
        python: true,
        subprocesses: false,
    };
    let mut l = Loader::with_io(FakeMaps::default(), settings, Metrics::new());
    let (mut processes, registry) = registry::channel(
        &Limits::default(),
        &Jit::default(),
        &Python::default(),
        Metrics::new(),
    );
    l.own_registry(registry);
    // Pids above the kernel's limit (2^22): never a process, read and not found.
    let (gone, other) = (5_000_001, 5_000_002);
    let py = l.python.as_mut().expect("python on");
    py.attached.insert(gone, 0);
    py.attached.insert(other, 7);
    // An exit event of the process before it on the pid: the entry stays.
    l.drop_python(gone, Some(99));
    assert!(l.python_attached(gone));
    // The aggregator samples `gone` in one window, not in the next: that window's end
    // forgets it, once, and its exit event frees the attach state on this thread.
    let asker = std::thread::spawn(move || {
        let comm = *b"py\0\0\0\0\0\0\0\0\0\0\0\0\0\0";
        processes.touch(Touch {
            pid: gone,
            tid: gone,
            comm,
            cgroup_id: 0,
            start_time: 0,
        });
        let first = processes.close(WindowAsk::default());
        let second = processes.close(WindowAsk::default());
        (processes, first.gone, second.gone)
    });
    while !asker.is_finished() {
        l.serve_registry();
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let (mut processes, first, second) = asker.join().expect("asker");
    l.serve_registry();
    // A window the view named whole ends without a wait: its exit events come with the
    // next close.
    let third = processes.close(WindowAsk::default()).gone;
    assert!(first.is_empty(), "sampled in the first window: {first:?}");
    assert!(
        second.is_empty(),
        "the second window's end not waited for: {second:?}"
    );
    assert_eq!(
        third,
        [Exit {
            pid: gone,
            start_time: 0
        }]
    );
    assert!(!l.python_attached(gone), "freed by the exit event");
    assert!(l.python_attached(other), "no event, no change");
}
