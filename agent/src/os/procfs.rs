//! Small, strict parsers for the /proc and /sys files ember reads.
//!
//! Every parser takes text and returns `None` (or skips a line) on anything
//! malformed: callers count the miss, nothing panics.

use std::path::Path;

/// One line of `/proc/PID/maps`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapsEntry {
    /// First address of the range.
    pub start: u64,
    /// One past the last address.
    pub end: u64,
    /// Whether the range is executable.
    pub exec: bool,
    /// Offset of `start` in the mapped file.
    pub offset: u64,
    /// Device of the file (major, minor).
    pub dev: (u32, u32),
    /// Inode of the file; 0 for anonymous memory.
    pub inode: u64,
    /// The path column: a file path, `[vdso]`, `[heap]`, or empty.
    pub path: String,
    /// What the path column names, classified once here so no caller compares strings.
    pub kind: RegionKind,
}

/// What a mapping is, by its path column: the one place `[anon]`, `[vdso]` and the like
/// are told apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RegionKind {
    /// A file, named by its absolute path (with ` (deleted)` once unlinked).
    File,
    /// Anonymous memory: no name, or one given with `PR_SET_VMA_ANON_NAME`
    /// (`[anon:NAME]`, `[anon_shmem:NAME]`). JIT code lives here.
    Anon,
    /// `[heap]`.
    Heap,
    /// `[stack]` (and `[stack:TID]` of older kernels).
    Stack,
    /// `[vdso]`: the kernel's code mapped into every process.
    Vdso,
    /// `[vsyscall]`.
    Vsyscall,
    /// Any other name the kernel gives (`[vvar]`, `[uprobes]`, `anon_inode:[...]`).
    Special,
}

impl RegionKind {
    /// The kind of a mapping whose path column is `path`.
    pub fn of(path: &str) -> Self {
        match path {
            "" => Self::Anon,
            "[heap]" => Self::Heap,
            "[stack]" => Self::Stack,
            "[vdso]" => Self::Vdso,
            "[vsyscall]" => Self::Vsyscall,
            p if p.starts_with('/') => Self::File,
            p if p.starts_with("[anon") => Self::Anon,
            p if p.starts_with("[stack:") => Self::Stack,
            _ => Self::Special,
        }
    }
}

impl MapsEntry {
    /// Whether the mapping has a file ember may open: a path and an inode.
    pub fn is_file_backed(&self) -> bool {
        self.kind == RegionKind::File && self.inode != 0
    }

    /// The name a region without a usable file is shown by: its path column, `[anon]`
    /// for anonymous memory without a name.
    pub fn label(&self) -> &str {
        match self.path.as_str() {
            "" => "[anon]",
            p => p,
        }
    }
}

/// Parses `/proc/PID/maps` text; malformed lines are skipped and counted in the second value.
pub fn parse_maps(text: &str) -> (Vec<MapsEntry>, usize) {
    let mut out = Vec::new();
    let mut bad = 0;
    for line in text.lines() {
        match parse_maps_line(line) {
            Some(e) => out.push(e),
            None => bad += 1,
        }
    }
    (out, bad)
}

fn parse_maps_line(line: &str) -> Option<MapsEntry> {
    let mut it = line.splitn(6, ' ');
    let range = it.next()?;
    let perms = it.next()?;
    let offset = it.next()?;
    let dev = it.next()?;
    let inode = it.next()?;
    let path = it.next().unwrap_or("").trim_start().to_owned();
    let (start, end) = range.split_once('-')?;
    let (major, minor) = dev.split_once(':')?;
    let start = u64::from_str_radix(start, 16).ok()?;
    let end = u64::from_str_radix(end, 16).ok()?;
    if end < start || perms.len() != 4 {
        return None;
    }
    Some(MapsEntry {
        start,
        end,
        exec: perms.as_bytes()[2] == b'x',
        offset: u64::from_str_radix(offset, 16).ok()?,
        dev: (
            u32::from_str_radix(major, 16).ok()?,
            u32::from_str_radix(minor, 16).ok()?,
        ),
        inode: inode.parse().ok()?,
        kind: RegionKind::of(&path),
        path,
    })
}

/// The fields ember needs from `/proc/PID/stat`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stat {
    /// Process name (`comm`), at most 15 bytes.
    pub comm: String,
    /// User-mode CPU time in clock ticks.
    pub utime: u64,
    /// Kernel-mode CPU time in clock ticks.
    pub stime: u64,
    /// Start time since boot in clock ticks: with the pid, it names one process across pid reuse.
    pub start_time: u64,
    /// A kernel thread (`PF_KTHREAD` in its flags): no executable, no user memory, and a
    /// name that may change with its work (`kworker/1:0H-kblockd`) but never an exec.
    pub kthread: bool,
}

/// `PF_KTHREAD` in the flags of `/proc/PID/stat` (include/linux/sched.h).
const PF_KTHREAD: u64 = 0x0020_0000;

/// Parses `/proc/PID/stat`. The name may hold spaces and parentheses, so it ends at the last `)`.
pub fn parse_stat(text: &str) -> Option<Stat> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    if close < open {
        return None;
    }
    let comm = text[open + 1..close].to_owned();
    // Fields after the name start at field 3 (state).
    let rest: Vec<&str> = text[close + 1..].split_whitespace().collect();
    let field = |n: usize| rest.get(n - 3).and_then(|s| s.parse::<u64>().ok());
    Some(Stat {
        comm,
        utime: field(14)?,
        stime: field(15)?,
        start_time: field(22)?,
        kthread: field(9)? & PF_KTHREAD != 0,
    })
}

/// The start time of `pid` (clock ticks since boot) read from `proc_root/PID/stat`: with
/// the pid, it tells a process from a later one on the same pid. `None` once it is gone.
pub fn start_time(proc_root: &Path, pid: u32) -> Option<u64> {
    let text = read_capped(&proc_root.join(pid.to_string()).join("stat"), STAT_CAP).ok()?;
    parse_stat(&text).map(|s| s.start_time)
}

/// `/proc/PID/stat` is read up to this many bytes (a name is at most 15 bytes).
pub const STAT_CAP: u64 = 4096;

/// Clock ticks per second of `/proc` (USER_HZ, `sysconf(_SC_CLK_TCK)`; 100 on every Linux
/// ABI ember runs on), asked once.
pub fn clock_ticks_per_second() -> u64 {
    static HZ: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *HZ.get_or_init(|| {
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        u64::try_from(hz).ok().filter(|&h| h > 0).unwrap_or(100)
    })
}

/// A process start time the kernel keeps in nanoseconds since boot (`start_boottime`), in
/// the clock ticks `/proc/PID/stat` field 22 shows: the kernel's own `nsec_to_clock_t`
/// (a division by the nanoseconds of one tick, truncating). 0 stays 0 (unknown).
pub fn start_ticks(start_ns: u64) -> u64 {
    start_ns / (1_000_000_000 / clock_ticks_per_second().min(1_000_000_000))
}

/// Parses a CPU list such as `0-3,8,10-11` (as in `/sys/devices/system/cpu/online`).
pub fn parse_cpu_list(text: &str) -> Option<Vec<u32>> {
    let mut cpus = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u32, u32) = (a.parse().ok()?, b.parse().ok()?);
                if b < a || b - a > 65_536 {
                    return None;
                }
                cpus.extend(a..=b);
            }
            None => cpus.push(part.parse().ok()?),
        }
    }
    Some(cpus)
}

/// Online CPUs, from sysfs.
pub fn online_cpus() -> Option<Vec<u32>> {
    parse_cpu_list(&std::fs::read_to_string("/sys/devices/system/cpu/online").ok()?)
}

/// Value of a `Key:\tvalue` line of a `/proc/PID/status` file.
pub fn status_field<'a>(status: &'a str, key: &str) -> Option<&'a str> {
    status.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k == key).then(|| v.trim())
    })
}

/// Resident memory of this process in bytes (`VmRSS`).
pub fn self_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    kib_field(&status, "VmRSS")
}

/// A `status` field given in kB, as bytes.
pub fn kib_field(status: &str, key: &str) -> Option<u64> {
    let v = status_field(status, key)?;
    let kib: u64 = v.strip_suffix("kB").unwrap_or(v).trim().parse().ok()?;
    Some(kib * 1024)
}

/// Reads a small /proc file as text, at most `cap` bytes (a hostile or huge file cannot blow memory).
///
/// Invalid UTF-8 is replaced, not an error: a process named (or mapping a file named) with
/// arbitrary bytes must not lose its maps and pod; the parsers only need the ASCII fields.
pub fn read_capped(path: &Path, cap: u64) -> std::io::Result<String> {
    use std::io::Read;
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(cap)
        .read_to_end(&mut bytes)?;
    Ok(match String::from_utf8(bytes) {
        Ok(s) => s,
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    })
}

/// The bytes of the agent's own vDSO: every process on this kernel maps the same image, so
/// the unwinder builds its table and the symbolizer names its functions from this copy.
/// `None` when the agent has none (or one over 1 MiB, which no kernel makes).
pub fn own_vdso() -> Option<Vec<u8>> {
    let text = read_capped(Path::new("/proc/self/maps"), 32 << 20).ok()?;
    let (entries, _) = parse_maps(&text);
    let e = entries.iter().find(|e| e.kind == RegionKind::Vdso)?;
    let len = usize::try_from(e.end.checked_sub(e.start)?).ok()?;
    if len > 1 << 20 {
        return None;
    }
    // SAFETY: [vdso] is mapped readable in this process for its whole life, at this range.
    let image = unsafe { std::slice::from_raw_parts(e.start as *const u8, len) };
    Some(image.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_lines() {
        let text = "55d0c2a00000-55d0c2a28000 r--p 00000000 fd:01 1311 /usr/bin/cat\n\
55d0c2a28000-55d0c2a3c000 r-xp 00028000 fd:01 1311 /usr/bin/cat\n\
7ffd5b1f0000-7ffd5b1f2000 r-xp 00000000 00:00 0                          [vdso]\n\
7f0000000000-7f0000001000 rw-p 00000000 00:00 0 \n\
garbage line\n\
7f00-7e00 r-xp 0 00:00 0\n\
7f1000000000-7f1000001000 r-xp 00001000 103:02 42 /opt/my app/lib (deleted)\n";
        let (maps, bad) = parse_maps(text);
        assert_eq!(bad, 2);
        assert_eq!(maps.len(), 5);
        assert_eq!(maps[1].start, 0x55d0c2a28000);
        assert!(maps[1].exec);
        assert!(!maps[0].exec);
        assert_eq!(maps[1].offset, 0x28000);
        assert_eq!(maps[1].dev, (0xfd, 1));
        assert_eq!(maps[1].inode, 1311);
        assert_eq!(maps[1].path, "/usr/bin/cat");
        assert_eq!(maps[2].path, "[vdso]");
        assert_eq!(maps[3].path, "");
        assert_eq!(maps[4].path, "/opt/my app/lib (deleted)");
        assert_eq!(maps[4].dev, (0x103, 2));
        let kinds: Vec<RegionKind> = maps.iter().map(|m| m.kind).collect();
        use RegionKind::*;
        assert_eq!(kinds, [File, File, Vdso, Anon, File]);
        assert!(maps[1].is_file_backed() && !maps[2].is_file_backed());
        assert_eq!((maps[3].label(), maps[2].label()), ("[anon]", "[vdso]"));
    }

    #[test]
    fn region_kinds() {
        use RegionKind::*;
        for (path, kind) in [
            ("", Anon),
            ("[anon:v8 code]", Anon),
            ("[anon_shmem:x]", Anon),
            ("[heap]", Heap),
            ("[stack]", Stack),
            ("[stack:42]", Stack),
            ("[vdso]", Vdso),
            ("[vsyscall]", Vsyscall),
            ("[vvar]", Special),
            ("anon_inode:[perf_event]", Special),
            ("/usr/lib/libc.so.6", File),
            ("/memfd:jit (deleted)", File),
        ] {
            assert_eq!(RegionKind::of(path), kind, "{path:?}");
        }
    }

    #[test]
    fn kernel_threads_are_told_by_their_flags() {
        // kthreadd as 6.18 shows it: flags PF_KTHREAD | PF_NOFREEZE | PF_FORKNOEXEC...
        let text =
            "2 (kthreadd) S 0 0 0 0 -1 2129984 0 0 0 0 0 3 0 0 20 0 1 0 1 0 0 18446744073709551615";
        assert!(parse_stat(text).expect("parses").kthread);
        let own = read_capped(Path::new("/proc/self/stat"), STAT_CAP).expect("own stat");
        assert!(!parse_stat(&own).expect("parses").kthread);
    }

    #[test]
    fn stat_with_hostile_name() {
        let text = "1234 (a) b) (c) R 1 1234 1234 0 -1 4194304 100 0 0 0 250 30 0 0 20 0 1 0 98765 1000 200 18446744073709551615";
        let s = parse_stat(text).expect("parses");
        assert_eq!(s.comm, "a) b) (c");
        assert_eq!((s.utime, s.stime, s.start_time), (250, 30, 98765));
        assert!(!s.kthread, "flags 4194304 lack PF_KTHREAD");
        assert_eq!(parse_stat("1234 (x"), None);
        assert_eq!(parse_stat("1 (x) R 1 2"), None);
        assert_eq!(parse_stat(""), None);
    }

    #[test]
    fn cpu_lists() {
        assert_eq!(
            parse_cpu_list("0-3,8,10-11\n"),
            Some(vec![0, 1, 2, 3, 8, 10, 11])
        );
        assert_eq!(parse_cpu_list("0"), Some(vec![0]));
        assert_eq!(parse_cpu_list("3-1"), None);
        assert_eq!(parse_cpu_list("a"), None);
    }

    #[test]
    fn status_fields() {
        let s = "Name:\tcat\nVmRSS:\t    1234 kB\nCapEff:\t000001ffffffffff\n";
        assert_eq!(status_field(s, "Name"), Some("cat"));
        assert_eq!(kib_field(s, "VmRSS"), Some(1234 * 1024));
        assert_eq!(status_field(s, "VmHWM"), None);
        assert!(self_rss_bytes().is_some_and(|b| b > 0));
    }
}
