//! Inlined frames and source lines from DWARF (issue 29), on a C++ fixture built by this test
//! with `g++ -O2 -g` whose hot functions the compiler inlines (checked with objdump):
//!
//! - every sampled address of the fixture: ember's inline chain (function, file, line at each
//!   level) equals binutils' `addr2line -i -f -C` on the same address, for ≥ 99 % of them;
//! - the folded stacks show the inlined functions under their caller, marked `_[i]`, and the
//!   graph's paths take the shares `perf script` (perf's own inline expansion, DWARF
//!   unwinding) gives them on the same run;
//! - `go tool pprof -list` on ember's profile prints the fixture's source lines with samples.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use ember::proto::Profile;
use ember_tests::*;

/// One level of a chain: function, file, line.
type Level = (String, String, u32);

/// Samples a second of ember and perf in the inline test.
const HZ: u32 = 499;

/// Builds `fixtures/inline_hot.cc` with `g++ -O2 -g` into `dir`.
fn build_fixture(dir: &Path) -> (PathBuf, PathBuf) {
    let src = workspace_root().join("tests/fixtures/inline_hot.cc");
    let bin = dir.join("inline_hot");
    let out = Command::new("g++")
        .args(["-O2", "-g", "-fno-omit-frame-pointer", "-o"])
        .arg(&bin)
        .arg(&src)
        .output()
        .expect("running g++ (`make test-deps` installs it)");
    assert!(
        out.status.success(),
        "g++: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (bin, src)
}

/// The disassembly of `crunch`: the hot helpers must be inlined into it (no call left).
fn assert_inlined(bin: &Path) {
    let out = Command::new("objdump")
        .args(["-d", "-C", "--no-show-raw-insn"])
        .arg(bin)
        .output()
        .expect("objdump");
    let text = String::from_utf8_lossy(&out.stdout);
    let crunch: Vec<&str> = text
        .split("\n\n")
        .filter(|block| block.contains("<fixture::crunch(unsigned long)>:"))
        .collect();
    assert_eq!(crunch.len(), 1, "no fixture::crunch in the disassembly");
    assert!(
        !crunch[0].contains("call"),
        "g++ left calls in crunch (not inlined):\n{}",
        crunch[0]
    );
    // Nor an out-of-line copy of them: every sample in them is an inlined frame.
    for helper in ["fixture::mix", "fixture::step", "fixture::Summer"] {
        assert!(
            !text.contains(&format!("<{helper}")),
            "{helper} has an out-of-line copy"
        );
    }
}

/// The `PT_LOAD` segments of `bin` as (file offset, address, file size), from readelf.
fn segments(bin: &Path) -> Vec<(u64, u64, u64)> {
    let out = Command::new("readelf")
        .arg("-lW")
        .arg(bin)
        .output()
        .expect("readelf");
    let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.trim_start().starts_with("LOAD"))
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Some((hex(f.get(1)?)?, hex(f.get(2)?)?, hex(f.get(4)?)?))
        })
        .collect()
}

/// The chains ember wrote for the fixture's locations sampled in `pid`, by file offset
/// (innermost level first, as pprof lists lines).
fn ember_chains(p: &Profile, bin: &Path, pid: i64) -> BTreeMap<u64, (Vec<Level>, i64)> {
    let s = |i: i64| p.string_table[i as usize].clone();
    let name = bin.to_string_lossy();
    let mappings: Vec<u64> = p
        .mapping
        .iter()
        .filter(|m| s(m.filename) == name)
        .map(|m| m.id)
        .collect();
    let funcs: HashMap<u64, (String, String)> = p
        .function
        .iter()
        .map(|f| (f.id, (s(f.name), s(f.filename))))
        .collect();
    let locs: HashMap<u64, _> = p.location.iter().map(|l| (l.id, l)).collect();
    let pid_key = p.string_table.iter().position(|x| x == "pid").unwrap_or(0) as i64;
    let mut out: BTreeMap<u64, (Vec<Level>, i64)> = BTreeMap::new();
    for sample in &p.sample {
        if !sample
            .label
            .iter()
            .any(|l| l.key == pid_key && l.num == pid)
        {
            continue;
        }
        for id in &sample.location_id {
            let Some(loc) = locs.get(id) else { continue };
            if !mappings.contains(&loc.mapping_id) {
                continue;
            }
            let chain = loc
                .line
                .iter()
                .map(|l| {
                    let (n, f) = funcs.get(&l.function_id).cloned().unwrap_or_default();
                    (n, f, l.line as u32)
                })
                .collect();
            out.entry(loc.address).or_insert((chain, 0)).1 += sample.value[0];
        }
    }
    out
}

/// binutils' `addr2line -a -i -f -C` on `addrs`: each address's chain, innermost first.
fn addr2line(bin: &Path, addrs: &[u64]) -> Vec<Vec<Level>> {
    let out = Command::new("addr2line")
        .args(["-a", "-i", "-f", "-C", "-e"])
        .arg(bin)
        .args(addrs.iter().map(|a| format!("{a:#x}")))
        .output()
        .expect("addr2line (binutils)");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut chains: Vec<Vec<Level>> = Vec::new();
    let mut lines = text.lines().peekable();
    while let Some(l) = lines.next() {
        if l.starts_with("0x") {
            chains.push(Vec::new());
            continue;
        }
        let at = lines.next().unwrap_or("??:0");
        // `file:line (discriminator N)`; `??:?` when unknown.
        let at = at.split(" (discriminator").next().unwrap_or(at);
        let (file, line) = at.rsplit_once(':').unwrap_or((at, "0"));
        let file = if file == "??" { "" } else { file };
        let name = if l == "??" { "" } else { l };
        if let Some(c) = chains.last_mut() {
            c.push((
                name.to_string(),
                file.to_string(),
                line.parse().unwrap_or(0),
            ));
        }
    }
    chains
}

#[test]
fn inline_chains_and_lines_match_addr2line_and_go_pprof_lists_them() {
    if !require_privileged() {
        return;
    }
    let _lock = sampling_lock();
    let dir = tempfile::tempdir().expect("tempdir");
    let (bin, src) = build_fixture(dir.path());
    assert_inlined(&bin);
    let fixture = Fixture::spawn(bin.to_str().expect("utf-8"), &[]).expect("fixture");
    let pid = fixture.pid;
    let perf = match perf::unavailable() {
        // 499 Hz on both sides: at 99 Hz a loaded machine left ~250 samples each, and the
        // shares of four paths then differed by up to 0.3 by chance alone.
        None => Some(perf::PerfRecord::start_at(pid, 6, HZ, dir.path()).expect("perf record")),
        Some(why) => {
            assert!(
                std::env::var("EMBER_REQUIRE_PRIVILEGED").as_deref() != Ok("1"),
                "this test compares ember with perf, which cannot run: {why}"
            );
            println!("no perf comparison: {why}");
            None
        }
    };
    let out = dir.path().join("cpu.pb.gz");
    let mut ember = EmberRun::record(dir.path())
        .args([
            "--duration",
            "6s",
            "--frequency",
            &HZ.to_string(),
            "--pid",
            &pid.to_string(),
            "-o",
            out.to_str().expect("utf-8"),
        ])
        .try_spawn()
        .expect("ember record");
    let status = ember.wait(Duration::from_secs(90));
    let perf_data = perf.map(|p| p.finish(Duration::from_secs(60)).expect("perf record"));
    drop(fixture);
    assert!(
        status.success(),
        "ember record: {status}\n{}",
        ember.stderr()
    );
    let profile = read_profile(&out).expect("profile");

    // Every distinct sampled address of the fixture, against addr2line.
    let chains = ember_chains(&profile, &bin, i64::from(pid));
    let segs = segments(&bin);
    let vaddr = |off: u64| {
        segs.iter()
            .find(|&&(o, _, size)| off >= o && off < o + size)
            .map(|&(o, v, _)| off - o + v)
            .unwrap_or(off)
    };
    let addrs: Vec<u64> = chains.keys().map(|&off| vaddr(off)).collect();
    let theirs = addr2line(&bin, &addrs);
    assert_eq!(theirs.len(), addrs.len(), "addr2line output");
    let (mut same, mut inlined, mut samples) = (0, 0, 0);
    for ((off, (ours, n)), theirs) in chains.iter().zip(&theirs) {
        samples += n;
        if ours == theirs {
            same += 1;
        } else {
            println!(
                "{off:#x} ({n} samples) differs:\n  ember:     {ours:?}\n  addr2line: {theirs:?}"
            );
        }
        if ours.len() >= 3 {
            inlined += 1;
        }
    }
    println!(
        "{same} of {} sampled addresses ({samples} samples) equal addr2line; {inlined} with \
         two inlined levels or more",
        chains.len()
    );
    assert!(
        chains.len() >= 5,
        "too few sampled addresses in the fixture: {chains:?}"
    );
    assert!(
        same * 100 >= chains.len() * 99,
        "{same} of {} addresses equal addr2line",
        chains.len()
    );
    let src_name = src.to_string_lossy().into_owned();
    let mix_chain = chains.values().find(|(c, _)| {
        c.first()
            .is_some_and(|l| l.0 == "fixture::mix(unsigned long)")
            && c.get(1)
                .is_some_and(|l| l.0 == "fixture::step(unsigned long, unsigned long)")
            && c.last()
                .is_some_and(|l| l.0 == "fixture::crunch(unsigned long)")
    });
    let mix_chain = mix_chain.unwrap_or_else(|| panic!("no mix → step → crunch chain: {chains:?}"));
    assert!(
        mix_chain.0.iter().all(|l| l.1 == src_name && l.2 > 0),
        "levels without the fixture's file and line: {mix_chain:?}"
    );

    // The folded stacks: the inlined functions under their caller, marked.
    let folded = ember::encode::flamegraph::folded(&profile);
    let marked = "fixture::crunch(unsigned long);fixture::step(unsigned long, unsigned long)_[i];\
                  fixture::mix(unsigned long)_[i]";
    assert!(
        folded.iter().any(|l| l.contains(marked)),
        "no folded stack shows mix and step inlined in crunch:\n{}",
        folded.join("\n")
    );

    // The flame graph's shape against `perf report --inline` (perf script, DWARF unwinding,
    // its own inline expansion) on the same run: the fixture's paths, main to leaf.
    if let Some(data) = perf_data {
        let theirs = perf::script(&data).expect("perf script");
        let theirs = shares(theirs.iter().filter(|s| s.pid == pid).map(|s| {
            let names: Vec<&str> = s.frames.iter().filter_map(|f| f.name.as_deref()).collect();
            (fixture_path(&names), 1)
        }));
        let ours = shares(stacks_of(&profile, pid).iter().map(|s| {
            let names: Vec<&str> = s.frames.iter().map(|f| f.name.as_str()).collect();
            (fixture_path(&names), s.count())
        }));
        let distance: f64 = ours
            .keys()
            .chain(theirs.keys())
            .map(|k| (ours.get(k).unwrap_or(&0.0) - theirs.get(k).unwrap_or(&0.0)).abs())
            .sum::<f64>()
            / 2.0;
        println!("ember: {ours:#?}\nperf: {theirs:#?}\ntotal variation distance {distance:.3}");
        let mix = "main;fixture::crunch;fixture::step;fixture::mix";
        assert!(
            ours.get(mix).is_some_and(|&v| v > 0.05) && theirs.get(mix).is_some_and(|&v| v > 0.05),
            "mix inlined under step under crunch is missing from ember's or perf's graph"
        );
        assert!(
            distance <= 0.15,
            "ember's flame graph differs from perf --inline's by {distance:.3}"
        );
    }

    // go tool pprof -list prints the fixture's source with samples on mix's lines.
    let mut go = Command::new("go");
    go.args(["tool", "pprof", "-list", "fixture::mix", "-symbolize=none"])
        .arg(&out)
        .env("PPROF_TMPDIR", dir.path())
        .env("HOME", dir.path());
    let res = output_with_timeout(&mut go, Duration::from_secs(120))
        .expect("running `go tool pprof` (is golang-go installed? `make test-deps`)");
    let listing = String::from_utf8_lossy(&res.stdout);
    println!("{listing}");
    assert!(
        res.status.success(),
        "go tool pprof -list failed: {}",
        String::from_utf8_lossy(&res.stderr)
    );
    let hot = listing.lines().filter(|l| {
        let cols: Vec<&str> = l.split_whitespace().collect();
        (l.contains("x ^= x >> 13") || l.contains("x *= 0x9e3779b97f4a7c15ul"))
            && cols.len() > 2
            && (cols[0] != "." || cols[1] != ".")
    });
    assert!(
        hot.count() >= 1,
        "go tool pprof -list fixture::mix shows no samples on mix's source lines:\n{listing}"
    );
    assert!(
        listing.contains(&src_name),
        "the listing does not name the fixture's source file:\n{listing}"
    );
    let _ = fs::remove_file(&out);
}

/// The frames of a stack (leaf first) from the leaf to `main`, root first, without
/// parameter lists (perf prints none): `main;fixture::crunch;fixture::step`.
fn fixture_path(leaf_first: &[&str]) -> String {
    let end = leaf_first
        .iter()
        .position(|n| *n == "main")
        .map_or(leaf_first.len(), |i| i + 1);
    let mut names: Vec<&str> = leaf_first[..end]
        .iter()
        .map(|n| n.split('(').next().unwrap_or(n))
        .collect();
    names.reverse();
    names.join(";")
}

/// Each path's share of the samples.
fn shares(paths: impl Iterator<Item = (String, i64)>) -> BTreeMap<String, f64> {
    let mut counts: BTreeMap<String, i64> = BTreeMap::new();
    for (p, n) in paths {
        *counts.entry(p).or_default() += n;
    }
    let total = counts.values().sum::<i64>().max(1) as f64;
    counts
        .into_iter()
        .map(|(p, n)| (p, n as f64 / total))
        .collect()
}

/// ember's own 100 MB+ binary (`EMBER_DWARF_BIG`, else the debug build `target/debug/ember`
/// when built, else the release build, ~100 MB of DWARF), 300 addresses spread over its
/// functions, looked up in windows of 50 as the symbolizer does, under the default cap
/// (`symbols.dwarf_bytes`, 12 MiB, far less than its DWARF) and under 64 MiB (what README
/// suggests for Rust release builds, whose codegen units are large): ≥ 99 % of those that
/// got lines have binutils' `addr2line -i -f -C` chain (file and line per level), what is
/// held stays under the cap, and lines come for some addresses under the default cap and,
/// spread so wide (about a unit each), for at least 40 % under 64 MiB. Before units were
/// loaded one by one, such a binary kept names only (`over_cap`).
#[test]
fn a_big_binarys_chains_under_the_caps_match_addr2line() {
    use ember_parse::elf_file::{ElfReader, DEFAULT_LIMITS};
    let root = workspace_root();
    let bin = std::env::var_os("EMBER_DWARF_BIG")
        .map(PathBuf::from)
        .or_else(|| Some(root.join("target/debug/ember")).filter(|p| p.exists()))
        .unwrap_or_else(|| root.join("target/release/ember"));
    let Ok(bytes) = fs::read(&bin) else {
        skip(&format!("no {} (build ember first)", bin.display()));
        return;
    };
    let mut elf = ElfReader::new(&bytes[..], DEFAULT_LIMITS).expect("headers");
    // Function middles, with the function's symbol name: the symbolizer names the outermost
    // level from the symbol table (and an address without DWARF by its symbol alone), as
    // binutils does.
    let mut syms: BTreeMap<u64, String> = BTreeMap::new();
    elf.function_symbols(object_symtab(), |f| {
        if f.size > 8 {
            let name = ember_parse::symbols::demangle::demangle(f.name).0;
            syms.entry(f.addr + f.size / 2).or_insert(name);
        }
    })
    .expect("symbols");
    let addrs: Vec<u64> = syms.keys().copied().collect();
    let step = (addrs.len() / 300).max(1);
    let addrs: Vec<u64> = addrs.into_iter().step_by(step).take(300).collect();
    let theirs = addr2line(&bin, &addrs);
    let default = ember::config::Symbols::default().dwarf_bytes;
    for (cap, min_percent) in [(default, 1), (64 << 20, 40)] {
        lines_under_a_cap(&bin, &bytes, &syms, &addrs, &theirs, cap, min_percent);
    }
}

/// Looks `addrs` up in `bytes` under `cap` (see above) and checks the answers against
/// addr2line's (`theirs`): ≥ 99 % of the addresses with lines alike, and at least
/// `min_percent` % of them with lines.
fn lines_under_a_cap(
    bin: &Path,
    bytes: &[u8],
    syms: &BTreeMap<u64, String>,
    addrs: &[u64],
    theirs: &[Vec<Level>],
    cap: u64,
    min_percent: usize,
) {
    use ember_parse::dwarf::Dwarf;
    use ember_parse::elf_file::{ElfReader, DEFAULT_LIMITS};
    let started = std::time::Instant::now();
    let mut elf = ElfReader::new(bytes, DEFAULT_LIMITS).expect("headers");
    let mut dwarf = Dwarf::open(&mut elf, cap).expect("DWARF under the default cap");
    let mut ours: Vec<Vec<Level>> = vec![Vec::new(); addrs.len()];
    let mut skipped = 0;
    for (n, part) in addrs.chunks(50).enumerate() {
        // A window's reads, as the symbolizer makes them: a new reader per window.
        let mut elf = ElfReader::new(bytes, DEFAULT_LIMITS).expect("headers");
        let looked = dwarf
            .lookup(&mut elf, part, u64::MAX, |i, chain| {
                ours[n * 50 + i] = chain
                    .into_iter()
                    .map(|f| {
                        let name = f.name.as_deref().map_or(String::new(), |raw| {
                            ember_parse::symbols::demangle::demangle(raw).0
                        });
                        (name, f.file.unwrap_or_default(), f.line)
                    })
                    .collect()
            })
            .expect("lookup");
        let s = looked.skipped;
        skipped += s.over_cap + s.malformed + s.too_deep;
        for (i, &a) in part.iter().enumerate() {
            let chain = &mut ours[n * 50 + i];
            match chain.last_mut() {
                Some(outer) => outer.0 = syms[&a].clone(),
                None => chain.push((syms[&a].clone(), String::new(), 0)),
            }
        }
        assert!(
            dwarf.bytes() <= cap,
            "{} bytes held, cap {cap}",
            dwarf.bytes()
        );
    }
    let ours_time = started.elapsed();
    // binutils names the innermost level after the symbol (and the outermost after the
    // DWARF's short `DW_AT_name`) where rustc's line tables carry no linkage name; ember
    // names the outermost after the symbol. So: every level's file and line, and the
    // names of the levels between.
    let alike = |o: &Vec<Level>, t: &Vec<Level>| {
        o.len() == t.len()
            && o.iter().zip(t).all(|(a, b)| (&a.1, a.2) == (&b.1, b.2))
            && (o.len() < 3 || o[1..o.len() - 1] == t[1..t.len() - 1])
    };
    let same = ours.iter().zip(theirs).filter(|(o, t)| alike(o, t)).count();
    // Addresses whose unit did not fit under the cap keep the symbol's name alone.
    let with_lines = ours.iter().filter(|c| c.iter().any(|l| l.2 > 0)).count();
    for ((a, o), t) in addrs
        .iter()
        .zip(&ours)
        .zip(theirs)
        .filter(|((_, o), t)| !alike(o, t))
        .take(5)
    {
        println!("{a:#x} differs:\n  ember:     {o:?}\n  addr2line: {t:?}");
    }
    println!(
        "{}: {same} of {} addresses equal addr2line, {with_lines} with lines, {skipped} \
         skipped over the cap, {} units, {} bytes held (cap {cap}), {:.2} s",
        bin.display(),
        addrs.len(),
        dwarf.units(),
        dwarf.bytes(),
        ours_time.as_secs_f64()
    );
    // Every address that got lines got addr2line's chain; spread over the whole binary (a
    // unit per address, the worst case for the cap), at least `min_percent` % got lines.
    let lines_alike = ours
        .iter()
        .zip(theirs)
        .filter(|(o, t)| o.iter().any(|l| l.2 > 0) && alike(o, t))
        .count();
    assert!(
        lines_alike * 100 >= with_lines * 99,
        "{lines_alike} of the {with_lines} addresses with lines equal addr2line"
    );
    assert!(
        with_lines * 100 >= addrs.len() * min_percent,
        "only {with_lines} of {} addresses got lines under a cap of {cap}",
        addrs.len()
    );
}

/// `SHT_SYMTAB`.
fn object_symtab() -> u32 {
    2
}
