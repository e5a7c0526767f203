//! Hostile object files (issue 12): a process maps libraries built by the test to attack the
//! symbolizer, runs code in each, and ember must end on time, never open a file named inside
//! them, and count what it refused.
//!
//! The libraries (one hot function each, compiled with clang, patched here):
//! - `.gnu_debuglink` naming a FIFO by absolute path, and a host file by a `../` path: the
//!   old symbolizer opened these on the host (the FIFO hung `ember record` for good);
//! - `.strtab` made `SHF_COMPRESSED` with `ch_size = 2^62`, and one whose zlib stream (1 GiB
//!   of zeros) inflates far past its declared size (a zlib bomb);
//! - one truncated and restored in a loop while ember reads it (no `SIGBUS`);
//! - one replaced, after the process mapped it, by a FIFO and one by a device node, so its
//!   path names something else and `/proc/PID/maps` says `(deleted)`.
//!
//! The FIFOs, the device and the host file are watched with inotify: no open may happen.

use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use ember_tests::*;

const SHF_COMPRESSED: u64 = 0x800;

/// Compiles a shared library with one hot function `NAME` and, if given, a `.gnu_debuglink`
/// section naming `link`.
fn build_lib(dir: &Path, name: &str, link: Option<&str>) -> PathBuf {
    let mut src = format!(
        "unsigned long {name}(unsigned long n) {{\n\
         \x20 volatile unsigned long x = 0;\n\
         \x20 for (unsigned long i = 0; i < n; i++) x += i * 7;\n\
         \x20 return x;\n}}\n"
    );
    if let Some(link) = link {
        // name, NUL, padding to 4, CRC: what `objcopy --add-gnu-debuglink` writes.
        let mut bytes = link.as_bytes().to_vec();
        bytes.push(0);
        while bytes.len() % 4 != 0 {
            bytes.push(0);
        }
        bytes.extend_from_slice(&[0x12, 0x34, 0x56, 0x78]);
        let list: Vec<String> = bytes.iter().map(|b| b.to_string()).collect();
        src += &format!(
            "__attribute__((section(\".gnu_debuglink\"), used)) static const unsigned char \
             debuglink[] = {{{}}};\n",
            list.join(",")
        );
    }
    let c = dir.join(format!("{name}.c"));
    fs::write(&c, src).expect("write C");
    let so = dir.join(format!("{name}.so"));
    let out = Command::new("clang")
        .args(["-shared", "-fPIC", "-O1", "-fno-omit-frame-pointer", "-o"])
        .arg(&so)
        .arg(&c)
        .output()
        .expect("running clang");
    assert!(
        out.status.success(),
        "clang: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    so
}

fn u16_at(b: &[u8], at: usize) -> usize {
    u16::from_le_bytes([b[at], b[at + 1]]) as usize
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// File offset of the section header of the section named `want` (ELF64 LE).
fn section_header(elf: &[u8], want: &str) -> usize {
    let shoff = u64_at(elf, 0x28) as usize;
    let (shentsize, shnum, shstrndx) = (u16_at(elf, 0x3a), u16_at(elf, 0x3c), u16_at(elf, 0x3e));
    let strtab = shoff + shstrndx * shentsize;
    let names = u64_at(elf, strtab + 24) as usize;
    (0..shnum)
        .map(|i| shoff + i * shentsize)
        .find(|&h| {
            let at = names + u32_at(elf, h) as usize;
            let end = at + elf[at..].iter().position(|&b| b == 0).expect("NUL");
            &elf[at..end] == want.as_bytes()
        })
        .unwrap_or_else(|| panic!("no section {want}"))
}

/// Makes `.strtab` of `so` `SHF_COMPRESSED`: its data (appended at the end of the file) is
/// an `Elf64_Chdr` declaring `declared` bytes, then `stream`.
fn compress_strtab(so: &Path, declared: u64, stream: &[u8]) {
    let mut elf = fs::read(so).expect("read lib");
    let h = section_header(&elf, ".strtab");
    let at = elf.len().next_multiple_of(8);
    elf.resize(at, 0);
    elf.extend_from_slice(&1u32.to_le_bytes()); // ELFCOMPRESS_ZLIB
    elf.extend_from_slice(&0u32.to_le_bytes());
    elf.extend_from_slice(&declared.to_le_bytes());
    elf.extend_from_slice(&1u64.to_le_bytes());
    elf.extend_from_slice(stream);
    let flags = u64_at(&elf, h + 8) | SHF_COMPRESSED;
    let size = (elf.len() - at) as u64;
    elf[h + 8..h + 16].copy_from_slice(&flags.to_le_bytes());
    elf[h + 24..h + 32].copy_from_slice(&(at as u64).to_le_bytes());
    elf[h + 32..h + 40].copy_from_slice(&size.to_le_bytes());
    fs::write(so, elf).expect("write lib");
}

/// A zlib stream of `n` zero bytes.
fn zeros_stream(n: usize) -> Vec<u8> {
    let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
    let block = vec![0u8; 1 << 20];
    for _ in 0..n / block.len() {
        z.write_all(&block).expect("deflate");
    }
    z.finish().expect("deflate")
}

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.to_str().expect("utf-8")).expect("cstring");
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(
        unsafe { libc::mkfifo(c.as_ptr(), 0o644) },
        0,
        "mkfifo {path:?}"
    );
}

fn mknod_null(path: &Path) {
    let c = std::ffi::CString::new(path.to_str().expect("utf-8")).expect("cstring");
    // SAFETY: a valid NUL-terminated path; (1, 3) is /dev/null's device number.
    let r = unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o644, libc::makedev(1, 3)) };
    assert_eq!(r, 0, "mknod {path:?}");
}

/// An inotify watch for opens of the given paths.
struct OpenWatch {
    fd: i32,
    names: Vec<(i32, PathBuf)>,
}

impl OpenWatch {
    fn new(paths: &[&Path]) -> Self {
        // SAFETY: plain syscall.
        let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        assert!(fd >= 0, "inotify_init1");
        let names = paths
            .iter()
            .map(|p| {
                let c = std::ffi::CString::new(p.to_str().expect("utf-8")).expect("cstring");
                // SAFETY: valid fd and path.
                let wd = unsafe { libc::inotify_add_watch(fd, c.as_ptr(), libc::IN_OPEN) };
                assert!(wd >= 0, "inotify_add_watch {p:?}");
                (wd, p.to_path_buf())
            })
            .collect();
        Self { fd, names }
    }

    /// Paths opened since the watch began.
    fn opened(&self) -> Vec<PathBuf> {
        let mut buf = [0u8; 4096];
        let mut out = Vec::new();
        loop {
            // SAFETY: valid fd and buffer.
            let n = unsafe { libc::read(self.fd, buf.as_mut_ptr().cast(), buf.len()) };
            if n <= 0 {
                return out;
            }
            let mut at = 0;
            while at + 16 <= n as usize {
                let wd = i32::from_le_bytes(buf[at..at + 4].try_into().expect("4"));
                let len = u32_at(&buf, at + 12) as usize;
                if let Some((_, p)) = self.names.iter().find(|(w, _)| *w == wd) {
                    out.push(p.clone());
                }
                at += 16 + len;
            }
        }
    }
}

impl Drop for OpenWatch {
    fn drop(&mut self) {
        // SAFETY: our fd.
        unsafe { libc::close(self.fd) };
    }
}

/// Everything one test needs: the libraries, the traps, the victim process.
struct Scene {
    _dir: tempfile::TempDir,
    dir: PathBuf,
    watch: OpenWatch,
    victim: Child,
    stop: Arc<AtomicBool>,
    truncator: Option<thread::JoinHandle<u64>>,
}

impl Scene {
    fn new() -> Self {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().to_path_buf();
        let fifo = dir.join("trap.fifo");
        mkfifo(&fifo);
        let host_file = dir.join("host-secret.debug");
        fs::write(&host_file, b"not for ember").expect("write host file");
        // `../` enough times to reach / from the library's directory, then the host file.
        let depth = dir.components().count();
        let relative = format!("{}{}", "../".repeat(depth + 2), host_file.display());
        let libs = vec![
            build_lib(
                &dir,
                "ember_hot_link_fifo",
                Some(fifo.to_str().expect("utf-8")),
            ),
            build_lib(&dir, "ember_hot_link_host", Some(&relative)),
            build_lib(&dir, "ember_hot_chsize", None),
            build_lib(&dir, "ember_hot_bomb", None),
            build_lib(&dir, "ember_hot_trunc", None),
            build_lib(&dir, "ember_hot_swap_fifo", None),
            build_lib(&dir, "ember_hot_swap_dev", None),
        ];
        compress_strtab(&libs[2], 1 << 62, &zeros_stream(1 << 20));
        // Declares 64 KiB (under every cap) but inflates to 1 GiB.
        compress_strtab(&libs[3], 64 << 10, &zeros_stream(1 << 30));

        let script = "import ctypes, sys, time\n\
                      libs = [(ctypes.CDLL(p), p.rsplit('/', 1)[1][:-3]) for p in sys.argv[1:]]\n\
                      fns = [getattr(l, n) for l, n in libs]\n\
                      for f in fns: f.restype = ctypes.c_ulong\n\
                      print('ready', flush=True)\n\
                      while True:\n\
                      \x20   for f in fns: f(ctypes.c_ulong(2000000))\n";
        let mut victim = Command::new("/usr/bin/python3")
            .arg("-c")
            .arg(script)
            .args(&libs)
            .stdout(Stdio::piped())
            .spawn()
            .expect("starting python3");
        let mut line = [0u8; 6];
        victim
            .stdout
            .as_mut()
            .expect("stdout")
            .read_exact(&mut line)
            .expect("victim ready");
        assert_eq!(&line, b"ready\n");

        // Swap a FIFO and a device in at the mapped paths ("(deleted)" in maps now).
        let swap_fifo = dir.join("swap.fifo.tmp");
        mkfifo(&swap_fifo);
        fs::rename(&swap_fifo, &libs[5]).expect("rename fifo over lib");
        let swap_dev = dir.join("swap.dev.tmp");
        mknod_null(&swap_dev);
        fs::rename(&swap_dev, &libs[6]).expect("rename device over lib");
        let watch = OpenWatch::new(&[&fifo, &host_file, &libs[5], &libs[6]]);

        // Truncate the symbol tables away and put them back, over and over.
        let stop = Arc::new(AtomicBool::new(false));
        let trunc = libs[4].clone();
        let s = stop.clone();
        let truncator = thread::spawn(move || {
            let whole = fs::read(&trunc).expect("read lib");
            let keep = u64_at(&whole, 0x28).min(section_header(&whole, ".symtab") as u64);
            let keep = keep.min(u64_at(&whole, section_header(&whole, ".symtab") + 24));
            let f = fs::OpenOptions::new()
                .write(true)
                .open(&trunc)
                .expect("open lib");
            let mut rounds = 0;
            while !s.load(Ordering::Relaxed) {
                f.set_len(keep).expect("truncate");
                thread::sleep(Duration::from_micros(200));
                f.write_all_at(&whole[keep as usize..], keep)
                    .expect("restore");
                rounds += 1;
            }
            rounds
        });
        Scene {
            _dir: tmp,
            dir,
            watch,
            victim,
            stop,
            truncator: Some(truncator),
        }
    }

    /// Stops the victim and the truncation; the opens inotify saw; truncation rounds.
    fn finish(&mut self) -> (Vec<PathBuf>, u64) {
        self.stop.store(true, Ordering::Relaxed);
        let rounds = self.truncator.take().map_or(0, |t| t.join().unwrap_or(0));
        let _ = self.victim.kill();
        let _ = self.victim.wait();
        (self.watch.opened(), rounds)
    }
}

impl Drop for Scene {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.victim.kill();
        let _ = self.victim.wait();
    }
}

/// `ember record` over the hostile libraries ends on time, opens none of the traps, and
/// still names the functions of the libraries it could read.
#[test]
fn record_ends_on_time_and_opens_nothing_named_inside_objects() {
    if !require_privileged() {
        return;
    }
    let _lock = sampling_lock();
    let mut scene = Scene::new();
    let out = scene.dir.join("hostile.pb.gz");
    let pid = scene.victim.id().to_string();
    let started = Instant::now();
    let o = output_with_timeout(
        Command::new(ember_bin()).args([
            "record",
            "--pid",
            &pid,
            "-d",
            "6s",
            "-o",
            out.to_str().expect("utf-8"),
        ]),
        Duration::from_secs(60),
    )
    .expect("ember record did not end within 60 s (hung on a hostile object?)");
    let took = started.elapsed();
    let (opened, rounds) = scene.finish();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "ember record: {}\n{stderr}", o.status);
    assert!(
        took < Duration::from_secs(40),
        "ember record took {took:?}\n{stderr}"
    );
    assert!(
        opened.is_empty(),
        "opened files named inside objects: {opened:?}"
    );
    println!("record took {took:.1?}; {rounds} truncation rounds; {stderr}");
    let profile = read_profile(&out).expect("profile");
    let st = stacks(&profile);
    // Libraries with intact symbol tables (and their debug links ignored) are named.
    for name in [
        "ember_hot_link_fifo",
        "ember_hot_link_host",
        "ember_hot_swap_fifo",
    ] {
        assert!(
            st.iter().any(|s| s.has(name)),
            "{name} not named:\n{}",
            describe(&st, 15)
        );
    }
    // The two with broken string tables stay unnamed.
    for name in ["ember_hot_chsize", "ember_hot_bomb"] {
        assert!(
            !st.iter().any(|s| s.has(name)),
            "{name} named from a refused table"
        );
    }
}

/// The value of `ember_object_refusals_total{reason="REASON"}` (0 if absent).
fn refused(metrics: &str, reason: &str) -> f64 {
    series_value(
        metrics,
        &format!("ember_object_refusals_total{{reason=\"{reason}\"}}"),
    )
}

/// `ember run` over the same libraries counts each refusal by reason, stays healthy, and
/// stops on SIGTERM.
#[test]
fn run_counts_refused_objects_and_stays_healthy() {
    if !require_privileged() {
        return;
    }
    let _lock = sampling_lock();
    let mut scene = Scene::new();
    let addr = format!("127.0.0.1:{}", free_port());
    let data = scene.dir.join("data");
    let pid = scene.victim.id().to_string();
    let mut ember = EmberRun::run(&scene.dir)
        .args([
            "--pid",
            &pid,
            "--window",
            "2s",
            "--data-dir",
            data.to_str().expect("utf-8"),
            "--listen",
            &addr,
        ])
        .try_spawn()
        .expect("starting ember run");
    let started = Instant::now();
    // Windows close every 2 s: wait until two did and the refusals are counted.
    let mut metrics = String::new();
    while started.elapsed() < Duration::from_secs(40) {
        thread::sleep(Duration::from_secs(1));
        if let Ok((200, m)) = http_get(&addr, "/metrics") {
            metrics = m;
            if refused(&metrics, "compressed_size") >= 1.0 && refused(&metrics, "inflate") >= 1.0 {
                break;
            }
        }
    }
    let health = http_get(&addr, "/healthz").expect("healthz");
    ember.signal(libc::SIGTERM);
    let status = ember.wait(Duration::from_secs(30));
    let (opened, rounds) = scene.finish();
    let stderr = ember.stderr();
    assert!(status.success(), "ember run: {status}\n{stderr}");
    assert_eq!(health.0, 200, "/healthz: {health:?}");
    assert!(
        opened.is_empty(),
        "opened files named inside objects: {opened:?}"
    );
    let refusals: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("ember_object_refusals_total"))
        .collect();
    println!(
        "{rounds} truncation rounds; refusals:\n{}",
        refusals.join("\n")
    );
    for reason in ["compressed_size", "inflate"] {
        assert!(
            refused(&metrics, reason) >= 1.0,
            "{reason} not counted:\n{}\n{stderr}",
            refusals.join("\n")
        );
    }
}

/// A static program, stripped, whose one hot function is `name`, at `/prog` in the new
/// root `root`, and its debug file (`objcopy --only-keep-debug`); returns the debug file's
/// path under `/usr/lib/debug/.build-id/` inside a root (`/ab/cdef….debug`, relative).
fn build_rooted_prog(root: &Path, name: &str) -> (PathBuf, PathBuf) {
    fs::create_dir_all(root).expect("mkdir root");
    let src = root.with_extension("c");
    fs::write(
        &src,
        format!(
            "#include <stdio.h>\n\
             __attribute__((noinline)) unsigned long {name}(unsigned long n) {{\n\
             \x20 volatile unsigned long x = 0;\n\
             \x20 for (unsigned long i = 0; i < n; i++) x += i * 7;\n\
             \x20 return x;\n}}\n\
             int main(void) {{\n\
             \x20 puts(\"ready\");\n\
             \x20 fflush(stdout);\n\
             \x20 for (;;) {name}(2000000);\n}}\n"
        ),
    )
    .expect("write C");
    let prog = root.join("prog");
    let debug = root.with_extension("debug");
    let run = |cmd: &mut Command| {
        let out = cmd.output().expect("running a build tool");
        assert!(
            out.status.success(),
            "{cmd:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    };
    run(Command::new("clang")
        .args([
            "-static",
            "-O1",
            "-fno-omit-frame-pointer",
            "-Wl,--build-id",
            "-o",
        ])
        .arg(&prog)
        .arg(&src));
    run(Command::new("objcopy")
        .arg("--only-keep-debug")
        .arg(&prog)
        .arg(&debug));
    run(Command::new("strip").arg("--strip-all").arg(&prog));
    let stripped = fs::read(&prog).expect("read prog");
    assert!(
        !stripped.windows(name.len()).any(|w| w == name.as_bytes()),
        "{name} is still in the stripped program"
    );
    let notes =
        String::from_utf8_lossy(&run(Command::new("readelf").arg("-n").arg(&prog))).into_owned();
    let id = notes
        .lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: "))
        .unwrap_or_else(|| panic!("no build id:\n{notes}"))
        .trim()
        .to_owned();
    let by_id = PathBuf::from(&id[..2]).join(format!("{}.debug", &id[2..]));
    (debug, by_id)
}

/// Starts `/prog` chrooted into `root` and waits until it runs.
fn start_rooted(root: &Path) -> Child {
    let mut child = Command::new("chroot")
        .arg(root)
        .arg("/prog")
        .stdout(Stdio::piped())
        .spawn()
        .expect("starting chroot");
    let mut line = [0u8; 6];
    child
        .stdout
        .as_mut()
        .expect("stdout")
        .read_exact(&mut line)
        .expect("rooted program ready");
    assert_eq!(&line, b"ready\n");
    child
}

/// Debug files inside a process's own root (its container image): a stripped program in a
/// chroot is named from the debug file at `/usr/lib/debug/.build-id/…` in that root; in a
/// second root, a symlink at that path (to the right debug file, inside the root) is refused,
/// counted as `symlink`, and its target never opened.
#[test]
fn debug_files_inside_the_process_root_name_stripped_programs() {
    if !require_privileged() {
        return;
    }
    let _lock = sampling_lock();
    let tmp = tempfile::tempdir().expect("tempdir");
    let build_ids = Path::new("usr/lib/debug/.build-id");

    let good_root = tmp.path().join("good");
    let (debug, by_id) = build_rooted_prog(&good_root, "ember_rooted_debug_hot");
    let at = good_root.join(build_ids).join(&by_id);
    fs::create_dir_all(at.parent().expect("parent")).expect("mkdir");
    fs::rename(&debug, &at).expect("place debug file");

    let link_root = tmp.path().join("link");
    let (debug, by_id) = build_rooted_prog(&link_root, "ember_rooted_symlink_hot");
    let target = link_root.join("real.debug");
    fs::rename(&debug, &target).expect("place debug file");
    let at = link_root.join(build_ids).join(&by_id);
    fs::create_dir_all(at.parent().expect("parent")).expect("mkdir");
    // Absolute: followed inside the root, it would reach the right file.
    std::os::unix::fs::symlink("/real.debug", &at).expect("symlink");
    let watch = OpenWatch::new(&[&target]);

    let mut good = start_rooted(&good_root);
    let mut linked = start_rooted(&link_root);
    let (good_pid, link_pid) = (good.id(), linked.id());
    let addr = format!("127.0.0.1:{}", free_port());
    let data = tmp.path().join("data");
    let mut ember = EmberRun::run(tmp.path())
        .args([
            "--pid",
            &good_pid.to_string(),
            "--pid",
            &link_pid.to_string(),
            "--window",
            "2s",
            "--data-dir",
            data.to_str().expect("utf-8"),
            "--listen",
            &addr,
        ])
        .try_spawn()
        .expect("starting ember run");
    let started = Instant::now();
    let mut metrics = String::new();
    while started.elapsed() < Duration::from_secs(40) {
        thread::sleep(Duration::from_secs(1));
        if let Ok((200, m)) = http_get(&addr, "/metrics") {
            metrics = m;
            if refused(&metrics, "symlink") >= 1.0 {
                break;
            }
        }
    }
    // One more window, so the good program's names are written too.
    thread::sleep(Duration::from_secs(3));
    ember.signal(libc::SIGTERM);
    let status = ember.wait(Duration::from_secs(30));
    for child in [&mut good, &mut linked] {
        let _ = child.kill();
        let _ = child.wait();
    }
    let stderr = ember.stderr();
    assert!(status.success(), "ember run: {status}\n{stderr}");
    let refusals: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("ember_object_refusals_total"))
        .collect();
    println!("refusals:\n{}", refusals.join("\n"));
    assert!(
        refused(&metrics, "symlink") >= 1.0,
        "the symlinked debug file was not refused:\n{}\n{stderr}",
        refusals.join("\n")
    );
    let opened = watch.opened();
    assert!(opened.is_empty(), "followed the symlink to {opened:?}");

    let mut windows: Vec<PathBuf> = fs::read_dir(&data)
        .expect("data dir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| ember_tests::is_cpu_window(p))
        .collect();
    windows.sort();
    let (mut good_stacks, mut link_stacks) = (Vec::new(), Vec::new());
    for w in &windows {
        let p = read_profile(w).expect("decoding a window");
        good_stacks.extend(stacks_of(&p, good_pid));
        link_stacks.extend(stacks_of(&p, link_pid));
    }
    assert!(
        good_stacks.iter().any(|s| s.has("ember_rooted_debug_hot")),
        "the stripped program was not named from the debug file in its root:\n{}",
        describe(&good_stacks, 10)
    );
    assert!(
        !link_stacks.is_empty(),
        "the second program was not sampled"
    );
    assert!(
        !link_stacks
            .iter()
            .any(|s| s.has("ember_rooted_symlink_hot")),
        "named through a symlinked debug file:\n{}",
        describe(&link_stacks, 10)
    );
}

/// The value of the series `series` (name and labels, then a space) in an exposition.
fn value(metrics: &str, series: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Compiles a program in `dir` whose hot function has the symbol `symbol` (an asm label: any
/// name the assembler takes, mangled or not); it prints `pid N` and calls it forever.
fn build_prog(dir: &Path, file: &str, symbol: &str) -> PathBuf {
    let src = dir.join(format!("{file}.c"));
    fs::write(
        &src,
        format!(
            "#include <stdio.h>\n#include <unistd.h>\n\
             unsigned long hot(unsigned long n) __asm__(\"{symbol}\");\n\
             __attribute__((noinline)) unsigned long hot(unsigned long n) {{\n\
             \x20 volatile unsigned long x = 0;\n\
             \x20 for (unsigned long i = 0; i < n; i++) x += i * 7;\n\
             \x20 return x;\n}}\n\
             int main(void) {{\n\
             \x20 printf(\"pid %d\\n\", getpid());\n\
             \x20 fflush(stdout);\n\
             \x20 for (;;) hot(2000000);\n}}\n"
        ),
    )
    .expect("write C");
    let prog = dir.join(file);
    let out = Command::new("clang")
        .args(["-O1", "-fno-omit-frame-pointer", "-o"])
        .arg(&prog)
        .arg(&src)
        .output()
        .expect("running clang");
    assert!(
        out.status.success(),
        "clang: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    prog
}

/// `st_value`, `st_size` and `st_shndx` of the symbol `name` in `.symtab` (ELF64 LE).
fn symbol(elf: &[u8], name: &str) -> (u64, u64, u16) {
    let sh = section_header(elf, ".symtab");
    let (off, size, link) = (
        u64_at(elf, sh + 24) as usize,
        u64_at(elf, sh + 32) as usize,
        u32_at(elf, sh + 40) as usize,
    );
    let strs = u64_at(
        elf,
        u64_at(elf, 0x28) as usize + link * u16_at(elf, 0x3a) + 24,
    ) as usize;
    (off..off + size)
        .step_by(24)
        .find(|&s| {
            let at = strs + u32_at(elf, s) as usize;
            elf[at..].starts_with(name.as_bytes()) && elf[at + name.len()] == 0
        })
        .map(|s| {
            (
                u64_at(elf, s + 8),
                u64_at(elf, s + 16),
                u16_at(elf, s + 6) as u16,
            )
        })
        .unwrap_or_else(|| panic!("no symbol {name}"))
}

/// Replaces the `.strtab` of `prog` with one NUL and 1 MiB of `A` with no NUL after it, and
/// its `.symtab` with `count` function symbols all named from offset 1 (that unterminated
/// name), the first over the function `hot`, the others one byte each after its start.
fn giant_unterminated_names(prog: &Path, hot: &str, count: u64) {
    let mut elf = fs::read(prog).expect("read program");
    let (value, size, shndx) = symbol(&elf, hot);
    let mut strtab = vec![0u8];
    strtab.resize(1 + (1 << 20), b'A');
    let mut symtab = vec![0u8; 24];
    for i in 0..count {
        symtab.extend_from_slice(&1u32.to_le_bytes());
        symtab.push(0x12); // STB_GLOBAL, STT_FUNC
        symtab.push(0);
        symtab.extend_from_slice(&shndx.to_le_bytes());
        symtab.extend_from_slice(&(value + i).to_le_bytes());
        symtab.extend_from_slice(&(if i == 0 { size } else { 1 }).to_le_bytes());
    }
    for (section, bytes) in [(".strtab", strtab), (".symtab", symtab)] {
        let h = section_header(&elf, section);
        let at = elf.len().next_multiple_of(8);
        elf.resize(at, 0);
        elf.extend_from_slice(&bytes);
        elf[h + 24..h + 32].copy_from_slice(&(at as u64).to_le_bytes());
        elf[h + 32..h + 40].copy_from_slice(&(bytes.len() as u64).to_le_bytes());
    }
    fs::write(prog, elf).expect("write program");
}

/// `ember run` with 1 s windows on `pid`: the agent, its HTTP address and data directory.
fn run_on(dir: &Path, pid: u32) -> (Ember, String, PathBuf) {
    let addr = format!("127.0.0.1:{}", free_port());
    let data = dir.join("data");
    let mut ember = EmberRun::run(dir)
        .args([
            "--pid",
            &pid.to_string(),
            "--window",
            "1s",
            "--data-dir",
            data.to_str().expect("utf-8"),
            "--listen",
            &addr,
        ])
        .try_spawn()
        .expect("starting ember run");
    if ember.wait_attached(Duration::from_secs(20)).is_none() && !ember.running() {
        panic!("ember run exited early\n{}", ember.stderr());
    }
    (ember, addr, data)
}

/// Polls `/metrics` until `done` holds or `timeout` passes (printing ember's peak RSS as it
/// goes); returns the last scrape.
fn watch(ember: &Ember, addr: &str, timeout: Duration, done: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + timeout;
    loop {
        let text = http_get(addr, "/metrics")
            .map(|(_, t)| t)
            .unwrap_or_default();
        if done(&text) || Instant::now() >= deadline {
            return text;
        }
        println!("peak RSS so far {} MiB", peak_rss(ember.pid()) >> 20);
        thread::sleep(Duration::from_millis(500));
    }
}

/// The stacks of `pid` in every window file in `data`.
fn window_stacks(data: &Path, pid: u32) -> Vec<Stack> {
    let mut windows: Vec<PathBuf> = fs::read_dir(data)
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    windows.retain(|p| ember_tests::is_cpu_window(p));
    windows.sort();
    windows
        .iter()
        .filter_map(|w| read_profile(w).ok())
        .flat_map(|p| stacks_of(&p, pid))
        .collect()
}

/// A C++ symbol of 394 bytes whose template arguments each refer back to the previous one
/// twice (`B<prev, prev>`, 34 levels) demangles to 2^34 times 30 bytes: the old symbolizer
/// grew by tens of MB a second demangling it, wrote no window and failed `/healthz`. Now
/// the demangled text stops at 4 KiB, the frame shows the name as stored, the refusal is
/// counted, windows close, and ember's peak RSS stays far from the deploy's limit.
#[test]
fn a_nesting_mangled_name_is_shown_as_stored_within_the_cap() {
    if !require_privileged() {
        return;
    }
    let _lock = sampling_lock();
    let tmp = tempfile::tempdir().expect("tempdir");
    let name = ember::symbolize::demangle::nesting_name(34);
    let prog = build_prog(tmp.path(), "nest", &name);
    let victim = Fixture::spawn(prog.to_str().expect("utf-8"), &[]).expect("victim");
    let pid = victim.pid;
    let (mut ember, addr, data) = run_on(tmp.path(), pid);
    let capped = "ember_symbol_names_capped_total{reason=\"demangle_output\"} ";
    let started = Instant::now();
    let metrics = watch(&ember, &addr, Duration::from_secs(40), |m| {
        value(m, capped) >= 1.0
    });
    let took = started.elapsed();
    // Two more windows, written after the name was shown.
    thread::sleep(Duration::from_secs(2));
    let health = http_get(&addr, "/healthz").map(|(s, _)| s).unwrap_or(0);
    let peak = peak_rss(ember.pid());
    ember.signal(libc::SIGTERM);
    let status = ember.wait(Duration::from_secs(30));
    drop(victim);
    println!(
        "{}-byte name: counted after {took:.1?}; peak RSS {} MiB; /healthz {health}",
        name.len(),
        peak >> 20
    );
    assert!(status.success(), "ember run: {status}\n{}", ember.stderr());
    assert!(
        value(&metrics, capped) >= 1.0,
        "not counted within 40 s (peak RSS {} MiB)",
        peak >> 20
    );
    assert_eq!(health, 200, "/healthz");
    assert!(peak < 200 << 20, "peak RSS {} MiB", peak >> 20);
    let st = window_stacks(&data, pid);
    assert!(
        st.iter().any(|s| s.has(&name)),
        "the frame does not show the name as stored:\n{}",
        describe(&st, 5)
    );
}

/// A 1.05 MB program whose `.strtab` ends in 1 MiB with no NUL, named by 1,000 function
/// symbols: the old symbolizer copied the whole rest of the table per symbol (and again to
/// pack it), a peak RSS of over a gigabyte. Now the name is copied once (interned by its
/// offset), cut at 4 KiB and counted, and ember's peak RSS stays far from the limit.
#[test]
fn a_giant_unterminated_symbol_name_is_stored_once_and_cut() {
    if !require_privileged() {
        return;
    }
    let _lock = sampling_lock();
    let tmp = tempfile::tempdir().expect("tempdir");
    let prog = build_prog(tmp.path(), "giant", "ember_giant_hot");
    giant_unterminated_names(&prog, "ember_giant_hot", 1000);
    let size = fs::metadata(&prog).expect("stat").len();
    let victim = Fixture::spawn(prog.to_str().expect("utf-8"), &[]).expect("victim");
    let pid = victim.pid;
    let (mut ember, addr, data) = run_on(tmp.path(), pid);
    let cut = "ember_symbol_names_capped_total{reason=\"name_length\"} ";
    let named = "ember_frames_total{result=\"named\"} ";
    let started = Instant::now();
    let metrics = watch(&ember, &addr, Duration::from_secs(40), |m| {
        value(m, cut) >= 1.0 && value(m, named) >= 1.0
    });
    let took = started.elapsed();
    thread::sleep(Duration::from_secs(2));
    let health = http_get(&addr, "/healthz").map(|(s, _)| s).unwrap_or(0);
    let peak = peak_rss(ember.pid());
    ember.signal(libc::SIGTERM);
    let status = ember.wait(Duration::from_secs(30));
    drop(victim);
    println!(
        "{size}-byte program: cut name counted after {took:.1?}; peak RSS {} MiB; \
         /healthz {health}",
        peak >> 20
    );
    assert!(status.success(), "ember run: {status}\n{}", ember.stderr());
    assert!(
        value(&metrics, cut) >= 1.0,
        "no cut name counted within 40 s (peak RSS {} MiB)",
        peak >> 20
    );
    assert_eq!(health, 200, "/healthz");
    assert!(peak < 200 << 20, "peak RSS {} MiB", peak >> 20);
    let giant = "A".repeat(4096);
    let st = window_stacks(&data, pid);
    assert!(
        st.iter().any(|s| s.has(&giant)),
        "the hot function is not named with the cut name:\n{}",
        describe(&st, 5)
    );
}
