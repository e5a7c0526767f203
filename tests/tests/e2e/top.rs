//! `ember top` in a real terminal: tmux runs it, the test reads the screen with
//! `capture-pane`, types `q`, and checks the terminal is given back as it was.

use std::process::Command;
use std::time::{Duration, Instant};

use ember_tests::*;

/// tmux on a server of this test's own (`-L`), so a user's sessions are never touched.
struct Tmux {
    socket: String,
}

impl Tmux {
    fn run(&self, args: &[&str]) -> String {
        let out = output_with_timeout(
            Command::new("tmux")
                .args(["-L", self.socket.as_str()])
                .args(args),
            Duration::from_secs(20),
        )
        .expect("running tmux (is it installed? `make test-deps`)");
        assert!(
            out.status.success(),
            "tmux {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn screen(&self) -> String {
        self.run(&["capture-pane", "-p", "-t", "top"])
    }

    /// Reads the screen until `check` finds what it wants in it, or `timeout` passes.
    fn wait_for<T>(
        &self,
        timeout: Duration,
        check: impl Fn(&str) -> Option<T>,
    ) -> (Option<T>, String) {
        let deadline = Instant::now() + timeout;
        loop {
            let screen = self.screen();
            if let Some(t) = check(&screen) {
                return (Some(t), screen);
            }
            if Instant::now() > deadline {
                return (None, screen);
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["-L", self.socket.as_str(), "kill-server"])
            .output();
    }
}

/// The `%Own` and `%Total` of the row of `function`, from a screen of `ember top`.
fn row_of(screen: &str, function: &str) -> Option<(f64, f64, String)> {
    screen.lines().find_map(|l| {
        let words: Vec<&str> = l.split_whitespace().collect();
        if words.last() != Some(&function) || words.len() < 4 {
            return None;
        }
        let own = words[0].strip_suffix('%')?.parse().ok()?;
        let total = words[1].strip_suffix('%')?.parse().ok()?;
        Some((own, total, words[2].to_owned()))
    })
}

#[test]
fn the_hot_function_is_on_screen_and_q_gives_the_terminal_back() {
    if !require_privileged() {
        return;
    }
    let _lock = sampling_lock();
    let dir = tempfile::tempdir().expect("tempdir");
    let top = EmberRun::top(dir.path())
        .args(["--", CPU_HOG, "--seconds", "40"])
        .shell_line()
        .expect("the command line");
    // After ember: the terminal's settings (`icanon` and `echo`, not `-icanon -echo`), then
    // the pane stays for the test to read.
    let script = format!(
        "{top} 2>{}; echo EXIT=$?; stty -a; sleep 60",
        dir.path().join("stderr").display()
    );
    let tmux = Tmux {
        socket: format!("ember-test-{}", std::process::id()),
    };
    tmux.run(&[
        "new-session",
        "-d",
        "-s",
        "top",
        "-x",
        "160",
        "-y",
        "40",
        script.as_str(),
    ]);
    let (row, screen) = tmux.wait_for(Duration::from_secs(30), |s| {
        let r = row_of(s, "hot_a")?;
        // The first table may cover a part of a window before the command ran.
        s.contains("samples in the last").then_some(r)
    });
    println!("--- screen ---\n{screen}");
    let (own, total, process) = row.unwrap_or_else(|| {
        panic!(
            "no hot_a row on the screen within 30 s\n{screen}\n--- stderr ---\n{}",
            std::fs::read_to_string(dir.path().join("stderr")).unwrap_or_default()
        )
    });
    // Let a few full windows pass, then read it again: hot_a is 70 % of cpu_hog's work.
    std::thread::sleep(Duration::from_secs(3));
    let screen = tmux.screen();
    println!("--- screen 3 s later ---\n{screen}");
    let (own2, total2, _) = row_of(&screen, "hot_a").unwrap_or((own, total, String::new()));
    assert!(
        process.starts_with("cpu_hog["),
        "hot_a's process column: {process}"
    );
    assert!(
        (55.0..=85.0).contains(&own2) && (own2..=85.0).contains(&total2),
        "hot_a at {own2} % own, {total2} % total: not the 70 % cpu_hog spends there\n{screen}"
    );
    let hot_b = row_of(&screen, "hot_b").map(|r| r.0);
    assert!(
        hot_b.is_some_and(|b| (15.0..=45.0).contains(&b)),
        "hot_b's row: {hot_b:?}\n{screen}"
    );
    let started = Instant::now();
    tmux.run(&["send-keys", "-t", "top", "q"]);
    let (exit, screen) = tmux.wait_for(Duration::from_secs(30), |s| {
        s.lines()
            .find_map(|l| l.strip_prefix("EXIT=").map(str::to_owned))
    });
    println!("--- after q ({:?}) ---\n{screen}", started.elapsed());
    assert_eq!(
        exit.as_deref(),
        Some("0"),
        "ember top did not quit 0 on q\n{screen}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "q took {:?}",
        started.elapsed()
    );
    let words: Vec<&str> = screen.split_whitespace().collect();
    assert!(
        words.contains(&"icanon") && words.contains(&"echo"),
        "the terminal was not restored (stty -a after ember top):\n{screen}"
    );
}
