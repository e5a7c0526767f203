//! How complete a profiler's stacks are, measured the same way for ember and perf.
//!
//! Both profiles are turned into [`NStack`]s (leaf-first frames with a normalized
//! function name and the object's file name), then [`measure`] counts, for one process:
//! - the samples whose stack *reaches the start* of the program: one of its frames is
//!   one of the given roots (see [`START_ROOTS`]);
//! - the samples whose leaf is named;
//! - each target's inclusive share: the fraction of samples whose stack holds the
//!   function (or a frame of the object), in percent.
//!
//! [`Comparison::table`] prints both sides next to each other so that a failing
//! assertion explains itself.

use std::collections::HashMap;
use std::fmt::Write as _;

use crate::perf::PerfSample;
use crate::Stack;

/// Function names that mean "this stack was unwound up to the program's start".
///
/// `main` for programs with symbols. Above it, glibc's `__libc_start_call_main` (named
/// from libc's debug info; perf and ember both find Debian's libc6-dbg) or, without
/// debug info, the exported `__libc_start_main` (`__libc_start_main_impl` is its
/// internal name, shown by perf as an inlined frame). The libc frames are what a
/// *stripped* binary's stacks end with: its own `main` and `_start` have no symbol
/// (xz shows as `xz+0x37e6`), so "reaches the binary's entry" is decided on the first
/// named frame above `main`. For a program with symbols the two criteria agree except
/// after `main` returned (exit handlers run from `__libc_start_call_main`).
pub const START_ROOTS: &[&str] = &[
    "main",
    "__libc_start_call_main",
    "__libc_start_main",
    "__libc_start_main_impl",
];

/// Frames that only occur before a program's `main` runs or after it returned: the kernel
/// loading it (`execve`), ld.so relocating it (`_dl_start`), the process exiting.
const OUTSIDE_MAIN: &[&str] = &[
    "__x64_sys_execve",
    "_dl_start",
    "do_exit",
    "__GI__exit",
    "_exit",
];

/// Whether a stack was sampled outside `main`'s lifetime (see `OUTSIDE_MAIN`): such a
/// stack cannot reach `main` in any profiler.
pub fn outside_main(s: &NStack) -> bool {
    s.frames
        .iter()
        .any(|f| OUTSIDE_MAIN.contains(&f.name.as_str()))
}

/// One frame, profiler-neutral.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NFrame {
    /// Normalized function name (see [`normalize`]); empty when the frame is unnamed.
    pub name: String,
    /// File name of the object (`libc.so.6`, `[kernel.kallsyms]`), empty when unknown
    /// (and for perf's inlined lines).
    pub object: String,
}

/// One stack, profiler-neutral.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NStack {
    /// How many samples it stands for.
    pub count: u64,
    /// Leaf first.
    pub frames: Vec<NFrame>,
}

/// The last path component.
fn base(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// Whether an ember function name is a placeholder for an unnamed frame: empty,
/// `[unknown]`, or `object+0xHEX` (what ember writes when no symbol covers an address).
pub fn is_placeholder(name: &str) -> bool {
    if name.is_empty() || name == "[unknown]" {
        return true;
    }
    match name.rsplit_once("+0x") {
        Some((obj, hex)) => {
            !obj.is_empty()
                && !obj.contains(' ')
                && !hex.is_empty()
                && hex.chars().all(|c| c.is_ascii_hexdigit())
        }
        None => false,
    }
}

/// A function name as both profilers can agree on it: without a Rust legacy hash
/// (`::h0123456789abcdef`) and without a C++ parameter list (`dive_a(int, long)` →
/// `dive_a`, `f() const` → `f`); perf prints C++ names without parameters, ember
/// (blazesym) with them.
pub fn normalize(name: &str) -> String {
    let mut s = name.trim();
    if let Some((head, hash)) = s.rsplit_once("::h") {
        if hash.len() == 16 && hash.chars().all(|c| c.is_ascii_hexdigit()) {
            s = head;
        }
    }
    let s = s.strip_suffix(" const").unwrap_or(s);
    if s.ends_with(')') {
        // Find the '(' that opens the final group, counting nested parentheses.
        let mut depth = 0i32;
        for (i, c) in s.char_indices().rev() {
            match c {
                ')' => depth += 1,
                '(' => {
                    depth -= 1;
                    if depth == 0 {
                        // `(anonymous namespace)` at the start is a name, not parameters.
                        if i > 0 {
                            return s[..i].to_string();
                        }
                        break;
                    }
                }
                _ => {}
            }
        }
    }
    s.to_string()
}

/// ember's stacks (of one process) as [`NStack`]s.
pub fn from_ember(stacks: &[Stack]) -> Vec<NStack> {
    stacks
        .iter()
        .map(|s| NStack {
            count: u64::try_from(s.count()).unwrap_or(0),
            frames: s
                .frames
                .iter()
                .map(|f| NFrame {
                    name: if is_placeholder(&f.name) {
                        String::new()
                    } else {
                        normalize(&f.name)
                    },
                    object: base(&f.mapping).to_string(),
                })
                .collect(),
        })
        .collect()
}

/// perf's samples as [`NStack`]s (one sample each).
pub fn from_perf<'a>(samples: impl IntoIterator<Item = &'a PerfSample>) -> Vec<NStack> {
    samples
        .into_iter()
        .map(|s| NStack {
            count: 1,
            frames: s
                .frames
                .iter()
                .map(|f| NFrame {
                    name: f.name.as_deref().map(normalize).unwrap_or_default(),
                    object: if f.dso == "inlined" {
                        String::new()
                    } else {
                        base(&f.dso).to_string()
                    },
                })
                .collect(),
        })
        .collect()
}

/// What a share is taken of.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// A function, by normalized name.
    Func(String),
    /// Any frame of an object whose file name starts with this (`liblzma.so`).
    Object(String),
}

impl Target {
    /// A function target.
    pub fn func(name: &str) -> Self {
        Target::Func(name.to_string())
    }

    /// An object target.
    pub fn object(prefix: &str) -> Self {
        Target::Object(prefix.to_string())
    }

    fn matches(&self, f: &NFrame) -> bool {
        match self {
            Target::Func(n) => f.name == *n,
            Target::Object(p) => !f.object.is_empty() && f.object.starts_with(p.as_str()),
        }
    }

    /// How the table names it.
    pub fn label(&self) -> String {
        match self {
            Target::Func(n) => n.clone(),
            Target::Object(p) => format!("[object {p}*]"),
        }
    }
}

/// One profiler's figures for one process.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Side {
    /// Samples.
    pub samples: u64,
    /// Samples whose stack reaches one of the roots.
    pub reach: u64,
    /// Samples whose leaf frame is named.
    pub named_leaf: u64,
    /// Samples with a named leaf that also reach a root.
    pub named_and_reach: u64,
    /// Inclusive share of each target, in percent of `samples`.
    pub shares: Vec<f64>,
}

impl Side {
    /// `part` in percent of the samples (0 without samples).
    pub fn pct(&self, part: u64) -> f64 {
        if self.samples == 0 {
            0.0
        } else {
            100.0 * part as f64 / self.samples as f64
        }
    }
}

/// Counts [`Side`]'s figures over `stacks`.
pub fn measure(stacks: &[NStack], roots: &[&str], targets: &[Target]) -> Side {
    let mut side = Side::default();
    let mut hits = vec![0u64; targets.len()];
    for s in stacks {
        side.samples += s.count;
        let reach = s.frames.iter().any(|f| roots.contains(&f.name.as_str()));
        let named = s.frames.first().is_some_and(|f| !f.name.is_empty());
        if reach {
            side.reach += s.count;
        }
        if named {
            side.named_leaf += s.count;
        }
        if reach && named {
            side.named_and_reach += s.count;
        }
        for (t, h) in targets.iter().zip(hits.iter_mut()) {
            if s.frames.iter().any(|f| t.matches(f)) {
                *h += s.count;
            }
        }
    }
    side.shares = hits.into_iter().map(|h| side.pct(h)).collect();
    side
}

/// The tolerance for the difference between two profilers' shares of one target.
///
/// `base` (2 points, the figure) applies as such when the fixture's time split is
/// phase-locked to the sampling period (the fixture alternates its functions in rounds
/// of ~1 ms against the samplers' 10.1 ms, so every sampler steps evenly through the
/// round and the shares carry almost no sampling noise). Otherwise the two profilers
/// take independent samples of a random mix, and their shares differ by binomial noise
/// alone: the tolerance is then the larger of `base` and 3 sigma of that difference.
pub fn share_tolerance(base: f64, phase_locked: bool, p_percent: f64, n1: u64, n2: u64) -> f64 {
    if phase_locked || n1 == 0 || n2 == 0 {
        return base;
    }
    let p = (p_percent / 100.0).clamp(0.0, 1.0);
    let sigma = 100.0 * (p * (1.0 - p) * (1.0 / n1 as f64 + 1.0 / n2 as f64)).sqrt();
    base.max(3.0 * sigma)
}

/// ember's and perf's figures for one fixture, side by side.
#[derive(Clone, Debug)]
pub struct Comparison {
    /// Fixture name and a few words on what it is.
    pub title: String,
    /// What "reaching" means here (for the table).
    pub reach_label: String,
    /// The targets, in the order of the shares.
    pub targets: Vec<Target>,
    /// ember's figures.
    pub ember: Side,
    /// perf's figures.
    pub perf: Side,
    /// Per target: the tolerance on |ember − perf|.
    pub tolerances: Vec<f64>,
}

impl Comparison {
    /// The target whose shares differ most: (index, ember − perf in points).
    pub fn worst(&self) -> Option<(usize, f64)> {
        self.ember
            .shares
            .iter()
            .zip(&self.perf.shares)
            .map(|(e, p)| e - p)
            .enumerate()
            .max_by(|a, b| a.1.abs().total_cmp(&b.1.abs()))
    }

    /// Targets whose shares differ by more than their tolerance: (label, diff, tolerance).
    pub fn share_failures(&self) -> Vec<(String, f64, f64)> {
        self.targets
            .iter()
            .enumerate()
            .filter_map(|(i, t)| {
                let d = self.ember.shares[i] - self.perf.shares[i];
                (d.abs() > self.tolerances[i]).then(|| (t.label(), d, self.tolerances[i]))
            })
            .collect()
    }

    /// The side-by-side table.
    pub fn table(&self) -> String {
        let (e, p) = (&self.ember, &self.perf);
        let mut t = String::new();
        let _ = writeln!(
            t,
            "=== {}: ember vs perf --call-graph dwarf (same process, same time) ===",
            self.title
        );
        let _ = writeln!(
            t,
            "  {:<44} {:>9} {:>9} {:>8} {:>6}",
            "", "ember", "perf", "diff", "tol"
        );
        let _ = writeln!(t, "  {:<44} {:>9} {:>9}", "samples", e.samples, p.samples);
        let rows = [
            (format!("% reaching {}", self.reach_label), e.reach, p.reach),
            (
                "% with a named leaf".to_string(),
                e.named_leaf,
                p.named_leaf,
            ),
            (
                "% named leaf and reaching".to_string(),
                e.named_and_reach,
                p.named_and_reach,
            ),
        ];
        for (label, ev, pv) in rows {
            let _ = writeln!(t, "  {:<44} {:>9.2} {:>9.2}", label, e.pct(ev), p.pct(pv));
        }
        let _ = writeln!(t, "  inclusive shares, % of samples whose stack has:");
        for (i, target) in self.targets.iter().enumerate() {
            let _ = writeln!(
                t,
                "    {:<42} {:>9.2} {:>9.2} {:>+8.2} {:>6.2}{}",
                truncate(&target.label(), 42),
                e.shares[i],
                p.shares[i],
                e.shares[i] - p.shares[i],
                self.tolerances[i],
                if (e.shares[i] - p.shares[i]).abs() > self.tolerances[i] {
                    "  <-- off"
                } else {
                    ""
                }
            );
        }
        match self.worst() {
            Some((i, d)) => {
                let _ = writeln!(
                    t,
                    "  worst share difference: {d:+.2} points ({}), tolerance {:.2}",
                    self.targets[i].label(),
                    self.tolerances[i]
                );
            }
            None => {
                let _ = writeln!(t, "  (no share targets)");
            }
        }
        t
    }
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        let mut out: String = s.chars().take(n.saturating_sub(1)).collect();
        out.push('…');
        out
    }
}

/// The heaviest stacks, root first, for failure messages.
pub fn describe(stacks: &[NStack], n: usize) -> String {
    let mut by: HashMap<String, u64> = HashMap::new();
    let mut total = 0;
    for s in stacks {
        total += s.count;
        let folded: Vec<String> = s
            .frames
            .iter()
            .rev()
            .map(|f| {
                if f.name.is_empty() {
                    format!("?{}", if f.object.is_empty() { "" } else { &f.object })
                } else {
                    f.name.clone()
                }
            })
            .collect();
        *by.entry(folded.join(";")).or_default() += s.count;
    }
    let mut v: Vec<(String, u64)> = by.into_iter().collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut out = format!("{total} samples in {} distinct stacks:\n", v.len());
    for (stack, c) in v.into_iter().take(n) {
        let _ = writeln!(out, "  {c:6} {}", truncate(&stack, 400));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::perf::parse_script;

    #[test]
    fn normalizes_names() {
        assert_eq!(
            normalize("nofp::dive_a(int, unsigned long, unsigned long)"),
            "nofp::dive_a"
        );
        assert_eq!(normalize("nofp::dive_a"), "nofp::dive_a");
        assert_eq!(
            normalize("nofp::Bottom::what() const"),
            "nofp::Bottom::what"
        );
        assert_eq!(
            normalize("nofp_rust::key_of::h0123456789abcdef"),
            "nofp_rust::key_of"
        );
        assert_eq!(
            normalize("nofp_rust::sort_batch::{{closure}}"),
            "nofp_rust::sort_batch::{{closure}}"
        );
        assert_eq!(normalize("f(g(int))"), "f");
        assert_eq!(
            normalize("(anonymous namespace)::f(int)"),
            "(anonymous namespace)::f"
        );
        assert_eq!(normalize("main"), "main");
    }

    #[test]
    fn recognizes_placeholders() {
        assert!(is_placeholder(""));
        assert!(is_placeholder("[unknown]"));
        assert!(is_placeholder("liblzma.so.5.4.1+0x15be0"));
        assert!(is_placeholder("xz+0x37e6"));
        assert!(!is_placeholder("main"));
        assert!(!is_placeholder("lzma_code"));
        assert!(!is_placeholder("finish_task_switch.isra.0"));
    }

    #[test]
    fn measures_perf_stacks() {
        let perf = parse_script(
            "x 1/1\n\t1 cmp (/b/x)\n\t2 [unknown] (/lib/libc.so.6)\n\t3 run (/b/x)\n\t4 main (/b/x)\n\n\
             x 1/1\n\t1 [unknown] (/lib/libc.so.6)\n\n\
             x 1/1\n\t1 run (/b/x)\n\t2 __libc_start_call_main (/lib/libc.so.6)\n\n\
             x 1/1\n\t1 hot (/b/x)\n\t2 run (/b/x)\n\t3 main (/b/x)\n",
        )
        .expect("parses");
        let st = from_perf(&perf);
        let targets = [
            Target::func("run"),
            Target::func("cmp"),
            Target::object("libc.so"),
        ];
        let side = measure(&st, START_ROOTS, &targets);
        assert_eq!(side.samples, 4);
        assert_eq!(side.reach, 3);
        assert_eq!(side.named_leaf, 3);
        assert_eq!(side.named_and_reach, 3);
        assert_eq!(side.shares, vec![75.0, 25.0, 75.0]);
    }

    #[test]
    fn compares_sides() {
        let c = Comparison {
            title: "t".into(),
            reach_label: "main".into(),
            targets: vec![Target::func("a"), Target::func("b")],
            ember: Side {
                samples: 10,
                shares: vec![10.0, 50.0],
                ..Side::default()
            },
            perf: Side {
                samples: 10,
                shares: vec![11.0, 90.0],
                ..Side::default()
            },
            tolerances: vec![2.0, 2.0],
        };
        assert_eq!(c.worst(), Some((1, -40.0)));
        assert_eq!(c.share_failures(), vec![("b".to_string(), -40.0, 2.0)]);
        let t = c.table();
        assert!(
            t.contains("worst share difference: -40.00 points (b)"),
            "{t}"
        );
        assert!(t.contains("<-- off"), "{t}");
    }

    #[test]
    fn tolerances() {
        assert_eq!(share_tolerance(2.0, true, 30.0, 800, 800), 2.0);
        // 3 sigma of the difference of two binomial shares at 30 %, 800 samples each.
        let t = share_tolerance(2.0, false, 30.0, 800, 800);
        assert!((t - 6.87).abs() < 0.01, "{t}");
        // Near 0 or 100 % the noise vanishes and the base applies.
        assert_eq!(share_tolerance(2.0, false, 100.0, 800, 800), 2.0);
    }
}
