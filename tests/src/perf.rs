//! `perf record --call-graph dwarf` as the reference for ember's stacks (issue 11).
//!
//! perf copies 16 KiB of user stack and the registers with every sample and unwinds them
//! afterwards, in `perf script`, with `.eh_frame`/`.debug_frame`: slow, but complete
//! for code without frame pointers, and independent of ember. The tests run it on the
//! same process at the same time as ember and compare (see [`crate::completeness`]).
//!
//! What is parsed is `perf script -F comm,pid,tid,ip,sym,dso` (perf 6.1):
//!
//! ```text
//! nofp_qsort 16720/16720
//! \t            1297 sort_round (/tmp/nofp_qsort)
//! \t           3fd35 msort_with_tmp (inlined)
//! \t           27249 __libc_start_call_main (/usr/lib/x86_64-linux-gnu/libc.so.6)
//! \t            3ac0 [unknown] (/usr/bin/xz)
//! ```
//!
//! one block per sample, leaf first, blocks separated by an empty line. Inlined
//! functions are their own lines (dso `inlined`), as in ember's profiles.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};

use crate::{output_with_timeout, wait_timeout};

/// One frame of a `perf script` stack.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PerfFrame {
    /// The address perf printed (map-relative for user objects).
    pub addr: u64,
    /// The symbol, `None` when perf printed `[unknown]`.
    pub name: Option<String>,
    /// The object (`/usr/lib/.../libc.so.6`, `[kernel.kallsyms]`, `[vdso]`), `"inlined"`
    /// for an inlined function's line, `""` when perf printed none.
    pub dso: String,
}

/// One `perf script` sample.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PerfSample {
    /// The command name (may hold spaces).
    pub comm: String,
    /// Process id.
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// Leaf first.
    pub frames: Vec<PerfFrame>,
}

/// Parses `perf script -F comm,pid,tid,ip,sym,dso` output (see the module docs).
pub fn parse_script(text: &str) -> Result<Vec<PerfSample>> {
    let mut out = Vec::new();
    let mut cur: Option<PerfSample> = None;
    for (no, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            out.extend(cur.take());
            continue;
        }
        if line.starts_with(char::is_whitespace) {
            let s = cur
                .as_mut()
                .ok_or_else(|| anyhow!("line {}: a frame before any sample: {line:?}", no + 1))?;
            s.frames.push(
                parse_frame(line.trim())
                    .with_context(|| format!("line {}: bad frame {line:?}", no + 1))?,
            );
        } else {
            out.extend(cur.take());
            cur = Some(
                parse_header(line.trim_end())
                    .with_context(|| format!("line {}: bad sample header {line:?}", no + 1))?,
            );
        }
    }
    out.extend(cur);
    Ok(out)
}

/// `comm PID/TID`; the command name may hold spaces, so the ids are the last token.
fn parse_header(line: &str) -> Result<PerfSample> {
    let (comm, ids) = line
        .rsplit_once(char::is_whitespace)
        .ok_or_else(|| anyhow!("no PID/TID"))?;
    let (pid, tid) = ids.split_once('/').ok_or_else(|| anyhow!("no PID/TID"))?;
    Ok(PerfSample {
        comm: comm.trim().to_string(),
        pid: pid.parse().context("pid")?,
        tid: tid.parse().context("tid")?,
        frames: Vec::new(),
    })
}

/// `ADDR SYMBOL (DSO)`; the symbol may hold spaces and parentheses (C++, Rust), the
/// object is the last parenthesized group.
fn parse_frame(line: &str) -> Result<PerfFrame> {
    let (addr, rest) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
    let addr = u64::from_str_radix(addr, 16).with_context(|| format!("address {addr:?}"))?;
    let rest = rest.trim();
    let (sym, dso) = match rest.rsplit_once(" (") {
        Some((sym, dso)) if dso.ends_with(')') => (sym.trim(), &dso[..dso.len() - 1]),
        _ => (rest, ""),
    };
    let name = match sym {
        "" | "[unknown]" => None,
        s => Some(s.to_string()),
    };
    Ok(PerfFrame {
        addr,
        name,
        dso: dso.to_string(),
    })
}

/// Why perf cannot serve as the reference here, if it cannot (`None`: it can).
pub fn unavailable() -> Option<String> {
    match Command::new("perf").arg("--version").output() {
        Ok(o) if o.status.success() => None,
        Ok(o) => Some(format!(
            "`perf --version` failed: {}{} (on Debian, perf is in the linux-perf package: \
             `make test-deps`)",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )),
        Err(e) => Some(format!(
            "perf does not run ({e}); install it (Debian: `apt-get install linux-perf`, part \
             of `make test-deps`)"
        )),
    }
}

/// A running `perf record --call-graph dwarf,16384 -F 99 -p PID -- sleep N`.
pub struct PerfRecord {
    child: Child,
    data: PathBuf,
    stderr: PathBuf,
}

impl PerfRecord {
    /// Starts recording `pid` (and the children it forks from now on) for `seconds`,
    /// at 99 Hz, into `dir/perf.data`.
    pub fn start(pid: u32, seconds: u32, dir: &Path) -> Result<Self> {
        Self::start_at(pid, seconds, 99, dir)
    }

    /// [`PerfRecord::start`] at `hz` samples a second.
    pub fn start_at(pid: u32, seconds: u32, hz: u32, dir: &Path) -> Result<Self> {
        let data = dir.join("perf.data");
        let stderr = dir.join("perf-record.stderr");
        let child = Command::new("perf")
            .args([
                "record",
                "-F",
                &hz.to_string(),
                "--call-graph",
                "dwarf,16384",
                "-p",
            ])
            .arg(pid.to_string())
            .arg("-o")
            .arg(&data)
            .args(["--", "sleep"])
            .arg(seconds.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(&stderr)?)
            .spawn()
            .context("starting perf record")?;
        Ok(PerfRecord {
            child,
            data,
            stderr,
        })
    }

    /// Waits for perf to finish writing and returns its data file.
    pub fn finish(mut self, timeout: Duration) -> Result<PathBuf> {
        let status = wait_timeout(&mut self.child, timeout)?;
        let stderr = fs::read_to_string(&self.stderr).unwrap_or_default();
        match status {
            Some(s) if s.success() => Ok(self.data.clone()),
            Some(s) => bail!("perf record exited with {s}:\n{stderr}"),
            None => bail!("perf record still running after {timeout:?}:\n{stderr}"),
        }
    }
}

impl Drop for PerfRecord {
    fn drop(&mut self) {
        // A no-op once it exited; otherwise do not leave perf behind a failed test.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Unwinds and names the samples of a `perf record` data file (`perf script`).
pub fn script(data: &Path) -> Result<Vec<PerfSample>> {
    let out = output_with_timeout(
        Command::new("perf")
            .arg("script")
            .arg("-i")
            .arg(data)
            .args(["-F", "comm,pid,tid,ip,sym,dso"]),
        Duration::from_secs(120),
    )?;
    if !out.status.success() {
        bail!(
            "perf script failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    parse_script(&String::from_utf8_lossy(&out.stdout))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Captured from perf 6.1 on Debian 12 (nofp_qsort, xz, nofp_cxx, a kernel frame),
    /// with a command name holding a space added.
    const SNIPPET: &str = "\
nofp_qsort 16720/16720 
\t          16d9c6 __memcpy_avx512_unaligned_erms (inlined)
\t           3fd35 msort_with_tmp (inlined)
\t           3fd35 __GI___qsort_r (/usr/lib/x86_64-linux-gnu/libc.so.6)
\t            1297 sort_round (/tmp/sf/nofp_qsort)
\t            188b main (/tmp/sf/nofp_qsort)
\t           27249 __libc_start_call_main (/usr/lib/x86_64-linux-gnu/libc.so.6)
\t            1130 _start (/tmp/sf/nofp_qsort)

xz 15187/15187 
\t           15bd6 [unknown] (/usr/lib/x86_64-linux-gnu/liblzma.so.5.4.1)
\t            4ca7 lzma_code (/usr/lib/x86_64-linux-gnu/liblzma.so.5.4.1)

Web Content 7/9 
\tffffffffa1a0c2d0 do_syscall_64 ([kernel.kallsyms])
\t            1590 nofp::Guard::~Guard (inlined)
\t           40773 <&dyn core::ops::function::Fn<(), Output = i32> + core::marker::Sync as core::ops::function::FnOnce<()>>::call_once (inlined)
\t             bbe __vdso_clock_gettime ([vdso])
\t           a8606 foo::(anonymous namespace)::bar(int) (/usr/lib/libx.so)
nofp_cxx 3/3 
";

    #[test]
    fn parses_perf_script_output() {
        let s = parse_script(SNIPPET).expect("parses");
        assert_eq!(s.len(), 4);
        assert_eq!(
            (s[0].comm.as_str(), s[0].pid, s[0].tid),
            ("nofp_qsort", 16720, 16720)
        );
        assert_eq!(s[0].frames.len(), 7);
        assert_eq!(
            s[0].frames[0],
            PerfFrame {
                addr: 0x16d9c6,
                name: Some("__memcpy_avx512_unaligned_erms".into()),
                dso: "inlined".into()
            }
        );
        assert_eq!(s[0].frames[3].name.as_deref(), Some("sort_round"));
        assert_eq!(s[0].frames[3].dso, "/tmp/sf/nofp_qsort");
        assert_eq!(s[0].frames[6].name.as_deref(), Some("_start"));

        assert_eq!(s[1].frames[0].name, None);
        assert_eq!(s[1].frames[0].addr, 0x15bd6);
        assert_eq!(
            s[1].frames[0].dso,
            "/usr/lib/x86_64-linux-gnu/liblzma.so.5.4.1"
        );

        assert_eq!(
            (s[2].comm.as_str(), s[2].pid, s[2].tid),
            ("Web Content", 7, 9)
        );
        assert_eq!(s[2].frames[0].addr, 0xffff_ffff_a1a0_c2d0);
        assert_eq!(s[2].frames[0].dso, "[kernel.kallsyms]");
        assert_eq!(s[2].frames[1].name.as_deref(), Some("nofp::Guard::~Guard"));
        assert!(s[2].frames[2]
            .name
            .as_deref()
            .is_some_and(|n| n.starts_with("<&dyn core::ops::function::Fn<(), Output = i32>")));
        assert_eq!(s[2].frames[2].dso, "inlined");
        assert_eq!(s[2].frames[3].dso, "[vdso]");
        assert_eq!(
            s[2].frames[4].name.as_deref(),
            Some("foo::(anonymous namespace)::bar(int)")
        );
        assert_eq!(s[2].frames[4].dso, "/usr/lib/libx.so");

        // A last block without frames and without a trailing empty line.
        assert_eq!((s[3].pid, s[3].frames.len()), (3, 0));
    }

    #[test]
    fn rejects_garbage() {
        assert!(
            parse_script("\t  1234 main (/bin/x)\n").is_err(),
            "frame before header"
        );
        assert!(parse_script("comm notapid\n").is_err());
        assert!(parse_script("comm 1/2\n\tzz main (/bin/x)\n").is_err());
        assert!(parse_script("").expect("empty is fine").is_empty());
    }
}
