//! The compiler against a third party's reading of the same objects: every row that
//! `readelf --debug-dump=frames-interp` prints is looked up in the table, at its first
//! and last byte, the way the sampler looks it up. Fixtures are built here with gcc;
//! Debian's libc and python3 are read as they are installed.

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

use object::{Object, ObjectSegment};

use super::*;

/// The fixture: a qsort callback, recursion, a frame over 64 KiB, a realigned frame
/// (alloca + an over-aligned local make gcc use the DRAP sequence), and PLT calls.
const FIXTURE_C: &str = r#"
#include <stdio.h>
#include <stdlib.h>

__attribute__((noinline)) void sink(void *p) { __asm__ volatile("" :: "r"(p) : "memory"); }

static int cmp(const void *a, const void *b) {
    long x = *(const long *)a, y = *(const long *)b;
    return (x > y) - (x < y);
}

__attribute__((noinline)) long recurse(long n) {
    volatile long pad[4];
    pad[0] = n;
    if (n <= 0) return 0;
    return recurse(n - 1) + pad[0];
}

__attribute__((noinline)) long big_frame(int n) {
    volatile char buf[70000];
    buf[n] = (char)n;
    sink((void *)buf);
    return buf[n / 2];
}

__attribute__((noinline)) double realign(int n) {
    double v[4] __attribute__((aligned(64)));
    char *p = __builtin_alloca(n);
    for (int i = 0; i < 4; i++) v[i] = n * i;
    sink(v);
    sink(p);
    return v[n & 3];
}

/* A signal trampoline (what a handler returns to) after a byte of padding; gcc -g puts
   its CFI in .debug_frame, which has no augmentation to say so. */
__asm__(".text\nint3\n.globl sigreturn_stub\n.type sigreturn_stub, @function\nsigreturn_stub:\n"
        ".cfi_startproc\nmov $15, %rax\nsyscall\nint $3\n.cfi_endproc\n"
        ".size sigreturn_stub, .-sigreturn_stub\n");

int main(int argc, char **argv) {
    long a[64];
    for (int i = 0; i < 64; i++) a[i] = (i * 7919) % 64;
    qsort(a, 64, sizeof a[0], cmp);
    printf("%ld %ld %ld %f\n", a[0], recurse(argc), big_frame(argc), realign(argc));
    return 0;
}
"#;

/// Builds the fixture with `flags` and returns its bytes and its path (in `dir`).
fn build(dir: &Path, name: &str, flags: &[&str]) -> (Vec<u8>, String) {
    let src = dir.join("fixture.c");
    std::fs::write(&src, FIXTURE_C).expect("write fixture source");
    let out = dir.join(name);
    let status = Command::new("gcc")
        .args(flags)
        .arg("-o")
        .arg(&out)
        .arg(&src)
        .status()
        .expect("run gcc (the unwind tests need it)");
    assert!(status.success(), "gcc {flags:?} failed");
    let path = out.to_string_lossy().into_owned();
    (std::fs::read(&out).expect("read fixture"), path)
}

/// A rule as readelf states it, with the freedom its notation leaves.
#[derive(Debug, Clone, PartialEq)]
enum Want {
    Exact(Rule),
    /// A CFA expression: ours must be one of these.
    Expression,
}

type Columns = HashMap<String, String>;
/// A CIE's signal flag and initial rows.
type CieRows = (bool, Vec<(u64, Columns)>);

enum Cur {
    None,
    Cie(String),
    Fde(ReadelfFde, String),
}

/// Ends an FDE: its CIE's signal flag, and the CIE's initial row if readelf printed none.
fn finish(
    cur: Cur,
    section: usize,
    cies: &HashMap<(usize, String), CieRows>,
    fdes: &mut Vec<ReadelfFde>,
) {
    if let Cur::Fde(mut fde, cie) = cur {
        let (signal, initial) = cies.get(&(section, cie)).cloned().unwrap_or_default();
        fde.signal = signal;
        if fde.rows.is_empty() {
            if let Some((_, cols)) = initial.last() {
                fde.rows.push((fde.start, cols.clone()));
            }
        }
        fdes.push(fde);
    }
}

#[derive(Debug, Default)]
struct ReadelfFde {
    start: u64,
    end: u64,
    signal: bool,
    /// In `.debug_frame`, not `.eh_frame`.
    debug_frame: bool,
    /// (address, column → value) in readelf's order.
    rows: Vec<(u64, HashMap<String, String>)>,
}

/// Parses `readelf --debug-dump=frames-interp`: each FDE's rows, or its CIE's initial
/// row when the FDE changes nothing (readelf then prints no rows for it).
fn readelf_fdes(path: &str) -> Vec<ReadelfFde> {
    let out = Command::new("readelf")
        .args(["--wide", "--debug-dump=frames-interp", path])
        .output()
        .expect("run readelf (binutils)");
    // readelf exits 1 on some objects (libc) after printing every frame: not checked.
    let text = String::from_utf8_lossy(&out.stdout);
    let mut cies: HashMap<(usize, String), CieRows> = HashMap::new();
    let mut fdes = Vec::new();
    let mut section = 0usize;
    let mut debug_frame = false;
    let mut columns: Vec<String> = Vec::new();
    let mut cur = Cur::None;
    for line in text.lines() {
        if line.starts_with("Contents of the ") {
            section += 1;
            debug_frame = line.contains(".debug_frame");
            continue;
        }
        // A register rule reads "r9 (r9)": one column, two words.
        let mut line = line.to_string();
        while let Some(open) = line.find(" (") {
            let Some(close) = line[open..].find(')') else {
                break;
            };
            line.replace_range(open..open + close + 1, "");
        }
        let tokens: Vec<&str> = line.split_whitespace().collect();
        if tokens.len() >= 4 && tokens[3] == "CIE" {
            finish(
                std::mem::replace(&mut cur, Cur::None),
                section,
                &cies,
                &mut fdes,
            );
            let signal = tokens.get(4).is_some_and(|a| a.contains('S'));
            cies.insert((section, tokens[0].to_string()), (signal, Vec::new()));
            cur = Cur::Cie(tokens[0].to_string());
        } else if tokens.len() >= 6 && tokens[3] == "FDE" {
            finish(
                std::mem::replace(&mut cur, Cur::None),
                section,
                &cies,
                &mut fdes,
            );
            let cie = tokens[4].trim_start_matches("cie=").to_string();
            let (a, b) = tokens[5]
                .trim_start_matches("pc=")
                .split_once("..")
                .expect("pc range");
            let fde = ReadelfFde {
                start: u64::from_str_radix(a, 16).expect("hex"),
                end: u64::from_str_radix(b, 16).expect("hex"),
                debug_frame,
                ..ReadelfFde::default()
            };
            cur = Cur::Fde(fde, cie);
        } else if tokens.first() == Some(&"LOC") {
            columns = tokens[1..].iter().map(|s| s.to_string()).collect();
        } else if tokens.len() == columns.len() + 1
            && tokens[0].len() == 16
            && tokens[0].chars().all(|c| c.is_ascii_hexdigit())
        {
            let addr = u64::from_str_radix(tokens[0], 16).expect("hex");
            let cols: HashMap<String, String> = columns
                .iter()
                .cloned()
                .zip(tokens[1..].iter().map(|s| s.to_string()))
                .collect();
            match &mut cur {
                Cur::Cie(off) => {
                    if let Some(c) = cies.get_mut(&(section, off.clone())) {
                        c.1.push((addr, cols));
                    }
                }
                Cur::Fde(fde, _) => fde.rows.push((addr, cols)),
                Cur::None => {}
            }
        }
    }
    finish(cur, section, &cies, &mut fdes);
    fdes
}

fn offset_of(v: &str, prefix: &str) -> Option<i64> {
    v.strip_prefix(prefix)?.parse().ok()
}

/// What our row must be, given readelf's columns.
fn want(cols: &HashMap<String, String>, signal: bool, entry: bool) -> Want {
    let bare = |cfa| Want::Exact(Rule::bare(cfa));
    if entry {
        return bare(CfaRule::Stop);
    }
    if signal {
        return bare(CfaRule::Signal);
    }
    match cols.get("ra").map(String::as_str) {
        Some("u") => return bare(CfaRule::Stop),
        Some("c-8") => {}
        _ => return bare(CfaRule::Unsupported),
    }
    let cfa = cols.get("CFA").map(String::as_str).unwrap_or("");
    let mut rule = if cfa == "exp" {
        return Want::Expression;
    } else if let Some(n) = offset_of(cfa, "rsp+") {
        match u16::try_from(n) {
            Ok(n) => Rule {
                cfa_offset: n,
                ..Rule::bare(CfaRule::Rsp)
            },
            Err(_) => return bare(CfaRule::Unsupported),
        }
    } else if let Some(n) = offset_of(cfa, "rbp+") {
        Rule {
            cfa_offset: u16::try_from(n).expect("rbp offset"),
            ..Rule::bare(CfaRule::Rbp)
        }
    } else {
        return bare(CfaRule::Unsupported);
    };
    match cols.get("rbp").map(String::as_str) {
        None | Some("u") | Some("s") => {}
        Some(v) => match offset_of(v, "c") {
            Some(n) => {
                rule.rbp = RbpRule::AtCfa;
                rule.rbp_offset = i16::try_from(n).expect("rbp offset");
            }
            None => rule.rbp = RbpRule::Unknown,
        },
    }
    Want::Exact(rule)
}

fn entry_point(path: &str) -> u64 {
    let out = Command::new("readelf")
        .args(["-h", path])
        .output()
        .expect("readelf -h");
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| l.trim().strip_prefix("Entry point address:"))
        .and_then(|v| u64::from_str_radix(v.trim().trim_start_matches("0x"), 16).ok())
        .expect("entry point")
}

/// Looks up every readelf row at its first and last byte; returns the rows checked.
fn compare_with_readelf(table: &UnwindTable, path: &str) -> usize {
    let entry = entry_point(path);
    let fdes = readelf_fdes(path);
    assert!(!fdes.is_empty(), "readelf printed no FDE for {path}");
    let file = std::fs::read(path).expect("read the object");
    let elf = object::File::parse(&file[..]).expect("an ELF object");
    let mut checked = 0;
    for fde in &fdes {
        let is_entry = fde.start <= entry && entry < fde.end;
        // `mov $15, %rax; syscall` (rt_sigreturn), read through the program headers.
        let sigreturn = fde.debug_frame
            && fde.end - fde.start <= 16
            && elf.segments().any(|seg| {
                seg.data_range(fde.start, 9).ok().flatten()
                    == Some(&[0x48, 0xc7, 0xc0, 0x0f, 0, 0, 0, 0x0f, 0x05][..])
            });
        for (i, (addr, cols)) in fde.rows.iter().enumerate() {
            let next = fde.rows.get(i + 1).map_or(fde.end, |r| r.0);
            if next <= *addr {
                continue; // a row readelf prints but that is never in force
            }
            let want = want(cols, fde.signal || sigreturn, is_entry);
            for at in [*addr, next - 1] {
                let got = table
                    .lookup(at)
                    .and_then(|r| r.rule())
                    .unwrap_or_else(|| panic!("{path}: no row at {at:#x}"));
                let ok = match &want {
                    Want::Exact(rule) if rule.rbp == RbpRule::Unchanged => {
                        // readelf's "u" is both "no rule yet" and DW_CFA_undefined.
                        got == *rule
                            || got
                                == Rule {
                                    rbp: RbpRule::Unknown,
                                    ..*rule
                                }
                    }
                    Want::Exact(rule) if rule.rbp == RbpRule::Unknown => {
                        // readelf's "exp" for rbp: ours may be the realigned-frame rule.
                        got.cfa == rule.cfa
                            && got.cfa_offset == rule.cfa_offset
                            && matches!(got.rbp, RbpRule::Unknown | RbpRule::AtRbp)
                    }
                    Want::Exact(rule) => got == *rule,
                    Want::Expression => matches!(
                        got.cfa,
                        CfaRule::Plt | CfaRule::RbpDeref | CfaRule::Unsupported
                    ),
                };
                assert!(
                    ok,
                    "{path} at {at:#x} (FDE {:#x}..{:#x}): readelf {cols:?} wants {want:?}, table has {got:?}",
                    fde.start, fde.end
                );
                checked += 1;
            }
        }
    }
    checked
}

fn symbol(path: &str, name: &str) -> u64 {
    let out = Command::new("nm").arg(path).output().expect("nm");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| {
            let mut f = l.split_whitespace();
            let (addr, _, sym) = (f.next()?, f.next()?, f.next()?);
            (sym == name).then(|| u64::from_str_radix(addr, 16).ok())?
        })
        .unwrap_or_else(|| panic!("{name} not in {path}"))
}

fn section_range(path: &str, name: &str) -> (u64, u64) {
    let out = Command::new("readelf")
        .args(["-SW", path])
        .output()
        .expect("readelf -S");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| {
            let l = l.split_once(']')?.1;
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.first() != Some(&name) {
                return None;
            }
            let addr = u64::from_str_radix(f.get(2)?, 16).ok()?;
            let size = u64::from_str_radix(f.get(4)?, 16).ok()?;
            Some((addr, addr + size))
        })
        .unwrap_or_else(|| panic!("{name} not in {path}"))
}

fn rule_at(table: &UnwindTable, addr: u64) -> Rule {
    table
        .lookup(addr)
        .and_then(|r| r.rule())
        .expect("a row for the address")
}

/// How `[start, end)` is covered: the share of its bytes under rows from CFI, and the
/// bytes of the gaps (frame-pointer rows) of 64 bytes or more — shorter ones are the
/// alignment padding between functions.
fn coverage(table: &UnwindTable, (start, end): (u64, u64)) -> (f64, u64) {
    let rows: Vec<(u64, UnwindRow)> = table.rows_with_addresses().collect();
    let (mut covered, mut long_gaps) = (0u64, 0u64);
    let mut gap = 0u64;
    for (i, (addr, row)) in rows.iter().enumerate() {
        let next = rows.get(i + 1).map_or(u64::MAX, |r| r.0);
        let (a, b) = ((*addr).max(start), next.min(end));
        if a >= b {
            continue;
        }
        if row.cfa_rule == CfaRule::FramePointer as u8 {
            gap += b - a; // page-start rows split a gap: add up its pieces
        } else {
            covered += b - a;
            if gap >= 64 {
                long_gaps += gap;
            }
            gap = 0;
        }
    }
    if gap >= 64 {
        long_gaps += gap;
    }
    (covered as f64 / (end - start) as f64, long_gaps)
}

#[test]
fn omit_frame_pointer_fixture_matches_readelf() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (bytes, path) = build(dir.path(), "o2", &["-O2", "-fomit-frame-pointer"]);
    let table = compile(&bytes, &DEFAULT_LIMITS).expect("compile");
    table.validate().expect("valid table");
    let checked = compare_with_readelf(&table, &path);
    assert!(checked > 20, "only {checked} rows checked");

    // `_start` is the entry point: the walk stops there.
    assert!(table.stats.entry_stop);
    assert_eq!(rule_at(&table, symbol(&path, "_start")).cfa, CfaRule::Stop);
    // Leaf code without frame pointers: rsp-based.
    let recurse = rule_at(&table, symbol(&path, "recurse"));
    assert_eq!((recurse.cfa, recurse.cfa_offset), (CfaRule::Rsp, 8));
    // A 70,000-byte frame does not fit 16 bits: unsupported, counted.
    assert!(table.stats.unsupported(UnsupportedReason::OffsetRange) >= 1);
    let big = symbol(&path, "big_frame");
    assert!((big..big + 64).any(|a| rule_at(&table, a).cfa == CfaRule::Unsupported));
    // The realigned frame: CFA = *(rbp - 8), rbp saved at rbp + 0, in its body.
    let realign = symbol(&path, "realign");
    let deref = (realign..realign + 128)
        .map(|a| rule_at(&table, a))
        .find(|r| r.cfa == CfaRule::RbpDeref)
        .expect("a realigned-frame row");
    assert_eq!(deref.cfa_offset as i16, -8);
    assert_eq!((deref.rbp, deref.rbp_offset), (RbpRule::AtRbp, 0));
    // The PLT: rsp + 8 + ((rip & 15) >= 11) * 8, after its first entry's two rows.
    let (plt, plt_end) = section_range(&path, ".plt");
    let stub = rule_at(&table, plt_end - 1);
    assert_eq!(
        (stub.cfa, stub.cfa_offset, stub.rbp_offset),
        (CfaRule::Plt, 8, 11)
    );
    assert_eq!(rule_at(&table, plt).cfa, CfaRule::Rsp);
    // Every function of the fixture has CFI rows; code no FDE covers (crtstuff's helpers,
    // padding) is the frame pointer's.
    for f in ["main", "recurse", "big_frame", "realign", "sink", "cmp"] {
        assert_ne!(
            rule_at(&table, symbol(&path, f)).cfa,
            CfaRule::FramePointer,
            "{f}"
        );
    }
    let pad = symbol(&path, "deregister_tm_clones");
    assert_eq!(rule_at(&table, pad).cfa, CfaRule::FramePointer);
}

#[test]
fn frame_pointer_fixture_matches_readelf() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (bytes, path) = build(dir.path(), "o0", &["-O0", "-fno-omit-frame-pointer"]);
    let table = compile(&bytes, &DEFAULT_LIMITS).expect("compile");
    table.validate().expect("valid table");
    compare_with_readelf(&table, &path);
    // After `push rbp; mov rsp, rbp`: CFA = rbp + 16, rbp saved at CFA - 16.
    let main = symbol(&path, "main");
    let body = rule_at(&table, main + 8);
    assert_eq!(
        body,
        Rule {
            cfa: CfaRule::Rbp,
            rbp: RbpRule::AtCfa,
            cfa_offset: 16,
            rbp_offset: -16,
        }
    );
}

#[test]
fn debug_frame_fills_what_eh_frame_lacks() {
    let dir = tempfile::tempdir().expect("tempdir");
    // No unwind tables: gcc puts the fixture's CFI in .debug_frame; crt1.o's stays in
    // .eh_frame.
    let (bytes, path) = build(
        dir.path(),
        "dbg",
        &[
            "-O2",
            "-g",
            "-fno-asynchronous-unwind-tables",
            "-fno-exceptions",
        ],
    );
    let table = compile(&bytes, &DEFAULT_LIMITS).expect("compile");
    table.validate().expect("valid table");
    assert!(table.stats.debug_frame_bytes > 0, "{:?}", table.stats);
    assert!(table.stats.eh_frame_bytes > 0, "{:?}", table.stats);
    compare_with_readelf(&table, &path);
    let recurse = rule_at(&table, symbol(&path, "recurse"));
    assert_eq!((recurse.cfa, recurse.cfa_offset), (CfaRule::Rsp, 8));
    // The trampoline is known by its code, from the byte before it: a handler's return
    // address is its first byte, and the walker looks up the byte before that.
    let stub = symbol(&path, "sigreturn_stub");
    for at in [stub - 1, stub, stub + 8] {
        assert_eq!(rule_at(&table, at).cfa, CfaRule::Signal, "{at:#x}");
    }
}

#[test]
fn libc_compiles_and_matches_readelf() {
    let path = "/lib/x86_64-linux-gnu/libc.so.6";
    let bytes = std::fs::read(path).expect("Debian's libc");
    let table = compile(&bytes, &DEFAULT_LIMITS).expect("compile libc");
    table.validate().expect("valid table");
    let checked = compare_with_readelf(&table, path);
    assert!(checked > 10_000, "{checked}");
    let (cover, long_gaps) = coverage(&table, section_range(path, ".text"));
    // Only the padding between functions has no FDE.
    assert_eq!(long_gaps, 0, "libc .text coverage {cover}");
    let has = |cfa: CfaRule| table.rows.iter().any(|r| r.cfa_rule == cfa as u8);
    // __restore_rt, clone3's thread start, the PLT.
    assert!(has(CfaRule::Signal) && has(CfaRule::Stop) && has(CfaRule::Plt));
    println!(
        "libc: {} rows, {} pages, {} bytes in BPF, .text coverage {cover:.4}, {:?}",
        table.rows.len(),
        table.pages.len(),
        table.bpf_bytes(),
        table.stats
    );
}

#[test]
fn python3_compiles_and_matches_readelf() {
    let path = "/usr/bin/python3";
    let bytes = std::fs::read(path).expect("Debian's python3");
    let table = compile(&bytes, &DEFAULT_LIMITS).expect("compile python3");
    table.validate().expect("valid table");
    compare_with_readelf(&table, path);
    let (cover, long_gaps) = coverage(&table, section_range(path, ".text"));
    // Padding, and crtstuff's helpers (`deregister_tm_clones`...), built without CFI.
    assert!(
        long_gaps < 512,
        "python3 .text coverage {cover}, gaps {long_gaps}"
    );
    assert!(table.stats.entry_stop);
    println!(
        "python3: {} rows, {} pages, {} bytes in BPF, .text coverage {cover:.4}, {:?}",
        table.rows.len(),
        table.pages.len(),
        table.bpf_bytes(),
        table.stats
    );
}

#[test]
fn caps_are_typed_errors() {
    let bytes = std::fs::read("/lib/x86_64-linux-gnu/libc.so.6").expect("libc");
    let limits = |f: fn(&mut Limits)| {
        let mut l = DEFAULT_LIMITS;
        f(&mut l);
        l
    };
    let reason = |l: Limits| compile(&bytes, &l).map(|_| ()).map_err(|e| e.reason());
    assert_eq!(
        reason(limits(|l| l.max_object_bytes = 1 << 20)),
        Err(ErrorReason::TooLarge)
    );
    assert_eq!(
        reason(limits(|l| l.max_cfi_bytes = 64 << 10)),
        Err(ErrorReason::SectionTooLarge)
    );
    assert_eq!(
        reason(limits(|l| l.max_rows = 1000)),
        Err(ErrorReason::TooManyRows)
    );
    assert_eq!(
        reason(limits(|l| l.max_entries = 1000)),
        Err(ErrorReason::TooManyEntries)
    );
    assert_eq!(
        reason(limits(|l| l.max_pages = 4)),
        Err(ErrorReason::SpanTooLarge)
    );
    assert_eq!(
        reason(limits(|l| {
            l.work_factor = 0;
            l.work_base = 4096;
        })),
        Err(ErrorReason::TooMuchWork)
    );
    // One CIE kept of libc's three: the FDEs of the others are skipped, counted.
    let one_cie = compile(&bytes, &limits(|l| l.max_cies = 1)).expect("compile");
    assert!(one_cie.stats.skipped(SkipReason::BadCie) > 0);
    assert!(one_cie.stats.fdes_used < one_cie.stats.fdes);
    // A CIE cap below libc's CIEs: every FDE skipped, nothing left.
    assert_eq!(
        reason(limits(|l| l.max_cie_bytes = 4)),
        Err(ErrorReason::NoCfi)
    );
}

#[test]
fn hostile_bytes_never_panic() {
    assert_eq!(
        compile(&[], &DEFAULT_LIMITS).map_err(|e| e.reason()),
        Err(ErrorReason::BadElf)
    );
    assert_eq!(
        compile(b"\x7fELF garbage", &DEFAULT_LIMITS).map_err(|e| e.reason()),
        Err(ErrorReason::BadElf)
    );
    // A relocatable object is not a mapped object.
    let dir = tempfile::tempdir().expect("tempdir");
    let (obj, _) = build(dir.path(), "fixture.o", &["-O2", "-c"]);
    assert_eq!(
        compile(&obj, &DEFAULT_LIMITS).map_err(|e| e.reason()),
        Err(ErrorReason::NotLoadable)
    );

    // libc with its .eh_frame damaged in many ways: a table or an error, never a panic.
    let libc = std::fs::read("/lib/x86_64-linux-gnu/libc.so.6").expect("libc");
    let out = Command::new("readelf")
        .args(["-SW", "/lib/x86_64-linux-gnu/libc.so.6"])
        .output()
        .expect("readelf");
    let (off, size) = String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split_once(']')?.1.split_whitespace().collect();
            (f.first() == Some(&".eh_frame")).then(|| {
                (
                    usize::from_str_radix(f[3], 16).expect("hex"),
                    usize::from_str_radix(f[4], 16).expect("hex"),
                )
            })
        })
        .expect(".eh_frame");
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut rand = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut tables = 0;
    for round in 0..40 {
        let mut bytes = libc.clone();
        for _ in 0..(1 + round * 5) {
            let at = off + (rand() as usize) % size;
            bytes[at] = rand() as u8;
        }
        if let Ok(table) = compile(&bytes, &DEFAULT_LIMITS) {
            table.validate().expect("valid table from damaged input");
            tables += 1;
        }
    }
    assert!(tables > 0, "some damaged objects still compile");
    // Truncated: the section headers are gone.
    assert!(compile(&libc[..libc.len() / 2], &DEFAULT_LIMITS).is_err());
}

#[test]
fn compiling_is_deterministic_and_deduplicated() {
    let bytes = std::fs::read("/lib/x86_64-linux-gnu/libc.so.6").expect("libc");
    let a = compile(&bytes, &DEFAULT_LIMITS).expect("compile");
    let b = compile(&bytes, &DEFAULT_LIMITS).expect("compile");
    assert_eq!(a, b);
    // No row repeats the rule of the row before it, except the one that opens a page.
    for page in &a.pages {
        let rows = &a.rows[page.first_row as usize..][..page.row_count as usize];
        for w in rows.windows(2) {
            assert_ne!(w[0].rule(), w[1].rule(), "{w:?}");
        }
    }
}

/// `EMBER_UNWIND_OBJECT=/path cargo test --release -p ember --lib -- --ignored
/// any_object`: the readelf comparison on any object.
#[test]
#[ignore = "needs EMBER_UNWIND_OBJECT"]
fn any_object_matches_readelf() {
    let path = std::env::var("EMBER_UNWIND_OBJECT").expect("EMBER_UNWIND_OBJECT");
    let bytes = std::fs::read(&path).expect("read the object");
    let table = compile(&bytes, &DEFAULT_LIMITS).expect("compile");
    table.validate().expect("valid table");
    let checked = compare_with_readelf(&table, &path);
    println!(
        "{path}: {checked} rows checked; {} rows, {} pages, {:?}",
        table.rows.len(),
        table.pages.len(),
        table.stats
    );
}
