//! `ember top`: the hottest functions per process and container, refreshed in the
//! terminal every window (a second by default), like `py-spy top` and `perf top`.
//!
//! It runs the `record` pipeline ([`Mode::Live`]: short unaligned windows to a callback,
//! no files, sinks or server) over the whole host, `--pid` processes or a command after
//! `--`. Each window's profile becomes one table ([`table`]); the screen ([`Screen`])
//! draws it with plain ANSI sequences, so no terminal library is needed. `q` or Ctrl-C
//! quits, and so does the end of the followed processes; the terminal is restored on
//! every way out (the screen's `Drop`), and the last table stays on it.

use std::collections::HashMap;
use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Result;

use super::target::{self, Target};
use crate::agent::{Agent, Mode};
use crate::config::units::parse_duration;
use crate::config::{Config, NodeName};
use crate::model::ProfileKind;
use crate::proto::Profile;

/// `ember top` flags.
#[derive(clap::Args, Debug)]
#[command(after_help = "Examples:\n  \
    ember top                          every process on the host\n  \
    ember top --pid 4242               one process (q or Ctrl-C quits)\n  \
    ember top -- python3 app.py        run a command, watch it and its children")]
pub struct TopArgs {
    /// YAML configuration layered over the embedded default.
    #[arg(long, short = 'c')]
    pub config: Option<PathBuf>,
    /// Samples per second per CPU (sampling.frequency_hz).
    #[arg(long)]
    pub frequency: Option<u64>,
    /// Only these processes (sampling.pids); repeat for several.
    #[arg(long = "pid")]
    pub pids: Vec<u32>,
    /// Also the processes the --pid processes start from now on. Always on for a
    /// command given after --.
    #[arg(long)]
    pub subprocesses: bool,
    /// How often the table is refreshed (each refresh shows that window's samples).
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub interval: Duration,
    /// Rows shown at most (fewer when the terminal is shorter).
    #[arg(long, short = 'n', default_value_t = 25)]
    pub rows: usize,
    /// A command to run and watch, with its children, until it exits (after --).
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// One row: a function in one process, and the samples it was on top of (own) and on
/// the stack at all (total).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    /// The function.
    pub function: String,
    /// The process (its name, and pid).
    pub process: String,
    /// The container (`pod/container`, the container, or `-`).
    pub container: String,
    /// Samples with the function on top.
    pub own: u64,
    /// Samples with the function anywhere on the stack (once per sample).
    pub total: u64,
}

/// The rows of `profile`, hottest first (own, then total, then name), and its samples.
pub fn table(profile: &Profile) -> (Vec<Row>, u64) {
    let s = |i: i64| {
        usize::try_from(i)
            .ok()
            .and_then(|i| profile.string_table.get(i))
            .map_or("", String::as_str)
    };
    let functions: HashMap<u64, &str> =
        profile.function.iter().map(|f| (f.id, s(f.name))).collect();
    // Innermost first, as pprof lists a location's (inlined) lines.
    let locations: HashMap<u64, Vec<&str>> = profile
        .location
        .iter()
        .map(|l| {
            let names = l
                .line
                .iter()
                .map(|line| {
                    functions
                        .get(&line.function_id)
                        .copied()
                        .unwrap_or("[unknown]")
                })
                .collect();
            (l.id, names)
        })
        .collect();
    let mut rows: HashMap<(String, i64), Row> = HashMap::new();
    let mut samples = 0u64;
    for sample in &profile.sample {
        let count = sample
            .value
            .first()
            .and_then(|v| u64::try_from(*v).ok())
            .unwrap_or(0);
        if count == 0 {
            continue;
        }
        samples += count;
        let (mut pid, mut process, mut container, mut pod) = (0, "", "", "");
        for l in &sample.label {
            match s(l.key) {
                "pid" => pid = l.num,
                "process" => process = s(l.str),
                "container" => container = s(l.str),
                "pod" => pod = s(l.str),
                _ => {}
            }
        }
        let mut names: Vec<&str> = sample
            .location_id
            .iter()
            .flat_map(|id| locations.get(id).into_iter().flatten().copied())
            .collect();
        if names.is_empty() {
            names.push("[unknown]");
        }
        let mut seen: Vec<&str> = Vec::with_capacity(names.len());
        for (i, name) in names.iter().enumerate() {
            if seen.contains(name) {
                continue;
            }
            seen.push(name);
            let row = rows
                .entry(((*name).to_owned(), pid))
                .or_insert_with(|| Row {
                    function: (*name).to_owned(),
                    process: format!("{}[{pid}]", if process.is_empty() { "?" } else { process }),
                    container: match (pod.is_empty(), container.is_empty()) {
                        (false, false) => format!("{pod}/{container}"),
                        (true, false) => container.to_owned(),
                        _ => "-".to_owned(),
                    },
                    own: 0,
                    total: 0,
                });
            row.total += count;
            if i == 0 {
                row.own += count;
            }
        }
    }
    let mut rows: Vec<Row> = rows.into_values().collect();
    rows.sort_by(|a, b| {
        b.own
            .cmp(&a.own)
            .then(b.total.cmp(&a.total))
            .then_with(|| a.function.cmp(&b.function))
            .then_with(|| a.process.cmp(&b.process))
    });
    (rows, samples)
}

/// The screen's lines for one window: a header, the column names, then `rows` rows at
/// most, each cut to `width` columns.
pub fn lines(head: &str, rows: &[Row], samples: u64, max: usize, width: usize) -> Vec<String> {
    let pct = |n: u64| 100.0 * n as f64 / samples.max(1) as f64;
    let mut out = vec![
        head.to_owned(),
        String::new(),
        format!(
            "{:>6} {:>7}  {:<24} {:<20} {}",
            "%Own", "%Total", "Process", "Container", "Function"
        ),
    ];
    for r in rows.iter().take(max) {
        out.push(format!(
            "{:>5.1}% {:>6.1}%  {:<24} {:<20} {}",
            pct(r.own),
            pct(r.total),
            r.process,
            r.container,
            r.function
        ));
    }
    if rows.is_empty() {
        out.push("  (no samples in this window)".to_owned());
    }
    out.into_iter()
        .map(|l| l.chars().take(width).collect())
        .collect()
}

/// A window's table, as the output thread hands it to the screen.
struct Frame {
    profile: Profile,
    duration: Duration,
}

/// Runs `ember top` with `cfg` (the config and the shared flags applied); logging is
/// set up by the caller.
pub fn top(args: TopArgs, mut cfg: Config, node: &NodeName) -> Result<()> {
    cfg.offcpu.enabled = false;
    cfg.window.duration = args.interval;
    let mut target = Target::prepare(&mut cfg, &args.command, args.subprocesses)?;
    cfg.validate("the command line")?;
    // Two windows queued at most: a screen that falls behind skips windows, never lags.
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Frame>(2);
    let agent = Agent::start(
        &cfg,
        node,
        Mode::Live {
            window: args.interval,
        },
        move |enc, _lost| {
            if enc.window.kind == ProfileKind::Cpu {
                let _ = tx.try_send(Frame {
                    profile: enc.profile.clone(),
                    duration: enc.duration,
                });
            }
        },
    )?;
    target.release()?;
    let what = match (args.command.is_empty(), cfg.sampling.pids.is_empty()) {
        (false, _) => format!("`{}` and its children", args.command.join(" ")),
        (true, true) => "every process".to_owned(),
        (true, false) => format!("pids {:?}", cfg.sampling.pids),
    };
    let hz = cfg.sampling.frequency_hz;
    let mut screen = Screen::open();
    let mut keys = keys();
    let started = Instant::now();
    let mut total = 0u64;
    let mut last: Vec<String> = Vec::new();
    agent.wait_until(async {
        let ended = target::ended(target.exits.take());
        tokio::pin!(ended);
        screen.draw(&[format!("ember top: {what} at {hz} Hz; the first table comes in {:?}", args.interval)]);
        loop {
            tokio::select! {
                frame = rx.recv() => {
                    let Some(frame) = frame else { break };
                    let (rows, samples) = table(&frame.profile);
                    total += samples;
                    let head = format!(
                        "ember top {:.0}s: {samples} samples in the last {:.1}s ({total} in all) at {hz} Hz; q quits; {what}",
                        started.elapsed().as_secs_f64(),
                        frame.duration.as_secs_f64()
                    );
                    let (width, height) = screen.size();
                    let max = args.rows.min(height.saturating_sub(4).max(1));
                    last = lines(&head, &rows, samples, max, width);
                    screen.draw(&last);
                }
                _ = keys.recv() => break,
                _ = &mut ended => break,
            }
        }
    });
    drop(screen);
    agent.stop()?;
    if let Some(status) = target
        .held
        .as_mut()
        .and_then(crate::os::watch::Held::try_wait)
    {
        eprintln!("ember: `{}` exited: {status}", args.command.join(" "));
    }
    Ok(())
}

/// `q` typed on the terminal (read by a thread of its own: a blocking read of standard
/// input); nothing ever when standard input is not a terminal.
fn keys() -> tokio::sync::mpsc::Receiver<()> {
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    if std::io::stdin().is_terminal() {
        let spawned = std::thread::Builder::new()
            .name("ember-keys".into())
            .spawn(move || {
                let mut byte = [0u8; 1];
                while let Ok(1) = std::io::stdin().read(&mut byte) {
                    if matches!(byte[0], b'q' | b'Q') {
                        let _ = tx.try_send(());
                        return;
                    }
                }
            });
        if let Err(e) = spawned {
            eprintln!("ember: cannot read keys ({e}); Ctrl-C quits");
        }
    }
    rx
}

/// The terminal while `top` draws on it: keys unbuffered and not echoed (Ctrl-C still
/// raises SIGINT), the cursor hidden. Dropping it restores both.
struct Screen {
    /// Standard input's settings before, when it is a terminal.
    saved: Option<libc::termios>,
    /// Standard output is a terminal: redraw in place; else print each table after the
    /// last (as `top -b` does).
    tty: bool,
}

impl Screen {
    fn open() -> Self {
        let saved = std::io::stdin().is_terminal().then(raw_keys).flatten();
        let tty = std::io::stdout().is_terminal();
        if tty {
            // Clear once, hide the cursor.
            print!("\x1b[2J\x1b[H\x1b[?25l");
            let _ = std::io::stdout().flush();
        }
        Self { saved, tty }
    }

    /// Columns and rows of the terminal (80x24 when it does not say).
    fn size(&self) -> (usize, usize) {
        let mut ws = libc::winsize {
            ws_row: 0,
            ws_col: 0,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // SAFETY: TIOCGWINSZ writes one `winsize` into the struct we own.
        let ok = unsafe { libc::ioctl(libc::STDOUT_FILENO, libc::TIOCGWINSZ, &mut ws) } == 0;
        if ok && ws.ws_col > 0 && ws.ws_row > 0 {
            (usize::from(ws.ws_col), usize::from(ws.ws_row))
        } else {
            (80, 24)
        }
    }

    fn draw(&mut self, lines: &[String]) {
        let mut out = String::new();
        if self.tty {
            // Home, each line over the old one (its rest erased), then erase below.
            out.push_str("\x1b[H");
            for l in lines {
                out.push_str(l);
                out.push_str("\x1b[K\n");
            }
            out.push_str("\x1b[J");
        } else {
            for l in lines {
                out.push_str(l);
                out.push('\n');
            }
            out.push('\n');
        }
        let mut stdout = std::io::stdout().lock();
        let _ = stdout.write_all(out.as_bytes());
        let _ = stdout.flush();
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        if let Some(t) = &self.saved {
            // SAFETY: restores settings tcgetattr filled in, on our own standard input.
            unsafe { libc::tcsetattr(libc::STDIN_FILENO, libc::TCSANOW, t) };
        }
        if self.tty {
            print!("\x1b[?25h");
            let _ = std::io::stdout().flush();
        }
    }
}

/// Turns off line buffering and echo on standard input; returns the settings to restore.
fn raw_keys() -> Option<libc::termios> {
    // SAFETY: termios is plain data; tcgetattr fills it in or fails (then it is unused).
    let mut t: libc::termios = unsafe { std::mem::zeroed() };
    // SAFETY: a valid fd and a pointer to a termios we own.
    if unsafe { libc::tcgetattr(libc::STDIN_FILENO, &mut t) } != 0 {
        return None;
    }
    let saved = t;
    t.c_lflag &= !(libc::ICANON | libc::ECHO);
    t.c_cc[libc::VMIN] = 1;
    t.c_cc[libc::VTIME] = 0;
    // SAFETY: as above.
    if unsafe { libc::tcsetattr(libc::STDIN_FILENO, libc::TCSANOW, &t) } != 0 {
        return None;
    }
    Some(saved)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{Function, Label, Line, Location, Sample};

    /// A profile of `stacks` (root first, count, pid, process, container).
    fn profile(stacks: &[(&[&str], i64, i64, &str, &str)]) -> Profile {
        let mut p = Profile::default();
        let mut strings: Vec<String> = vec![String::new()];
        let mut s = |x: &str| -> i64 {
            match strings.iter().position(|y| y == x) {
                Some(i) => i as i64,
                None => {
                    strings.push(x.to_owned());
                    strings.len() as i64 - 1
                }
            }
        };
        let mut ids: HashMap<String, u64> = HashMap::new();
        for (frames, count, pid, process, container) in stacks {
            let mut locs = Vec::new();
            for f in frames.iter().rev() {
                let next = ids.len() as u64 + 1;
                let id = *ids.entry((*f).to_owned()).or_insert(next);
                if id == next {
                    p.function.push(Function {
                        id,
                        name: s(f),
                        ..Default::default()
                    });
                    p.location.push(Location {
                        id,
                        line: vec![Line {
                            function_id: id,
                            line: 0,
                            ..Default::default()
                        }],
                        ..Default::default()
                    });
                }
                locs.push(id);
            }
            let mut label = vec![
                Label {
                    key: s("pid"),
                    num: *pid,
                    ..Default::default()
                },
                Label {
                    key: s("process"),
                    str: s(process),
                    ..Default::default()
                },
            ];
            if !container.is_empty() {
                label.push(Label {
                    key: s("container"),
                    str: s(container),
                    ..Default::default()
                });
            }
            p.sample.push(Sample {
                location_id: locs,
                value: vec![*count, 0],
                label,
            });
        }
        p.string_table = strings;
        p
    }

    #[test]
    fn rows_count_own_and_total_per_function_and_process() {
        let p = profile(&[
            (&["main", "outer", "hot_a"], 70, 10, "hog", ""),
            (&["main", "outer", "hot_b"], 30, 10, "hog", ""),
            (&["main", "rec", "rec"], 5, 20, "srv", "api"),
        ]);
        let (rows, samples) = table(&p);
        assert_eq!(samples, 105);
        let row = |f: &str, pid: &str| {
            rows.iter()
                .find(|r| r.function == f && r.process.ends_with(&format!("[{pid}]")))
                .cloned()
        };
        let hot = row("hot_a", "10").expect("hot_a");
        assert_eq!((hot.own, hot.total, hot.container.as_str()), (70, 70, "-"));
        assert_eq!(rows[0].function, "hot_a");
        let main = row("main", "10").expect("main");
        assert_eq!((main.own, main.total), (0, 100));
        // Recursion counts once per sample.
        let rec = row("rec", "20").expect("rec");
        assert_eq!((rec.own, rec.total, rec.container.as_str()), (5, 5, "api"));
        let text = lines("head", &rows, samples, 3, 200);
        assert_eq!(text.len(), 6, "{text:?}");
        assert!(text[3].starts_with(" 66.7%   66.7%  hog[10]"), "{text:?}");
        assert!(text[3].ends_with("hot_a"), "{text:?}");
        assert!(lines("head", &rows, samples, 3, 10)
            .iter()
            .all(|l| l.chars().count() <= 10));
    }
}
