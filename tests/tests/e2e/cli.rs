//! CLI behaviour that needs no sampling: `check-config`, and the message an
//! unprivileged user gets.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Output};
use std::time::Duration;

use ember_tests::*;

fn ember(args: &[&str]) -> Output {
    output_with_timeout(
        Command::new(ember_bin()).args(args),
        Duration::from_secs(30),
    )
    .expect("running ember")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Whether `s` has `PATH:LINE:COL: ` for the given line.
fn has_position(s: &str, path: &str, line: usize) -> bool {
    let prefix = format!("{path}:{line}:");
    s.match_indices(&prefix).any(|(i, _)| {
        let rest = &s[i + prefix.len()..];
        let digits = rest.chars().take_while(char::is_ascii_digit).count();
        digits > 0 && rest[digits..].starts_with(": ")
    })
}

/// (g) check-config accepts the shipped config and points at the line of a mistake.
#[test]
fn check_config_reports_file_line_col() {
    let shipped = workspace_root().join("config/ember.yaml");
    let o = ember(&["check-config", shipped.to_str().expect("utf-8")]);
    assert!(
        o.status.success(),
        "config/ember.yaml should be valid:\n{}",
        text(&o)
    );

    let dir = tempfile::tempdir().expect("tempdir");
    let cases = [
        // An unknown key on line 3.
        (
            "unknown.yaml",
            "sampling:\n  frequency_hz: 99\n  frequnecy_hz: 5\n",
            3,
        ),
        // A wrong type on line 2.
        ("type.yaml", "sampling:\n  frequency_hz: lots\n", 2),
        // A YAML syntax error on line 3.
        ("syntax.yaml", "window:\n  duration: 10s\n  - oops\n", 3),
    ];
    for (name, body, line) in cases {
        let path = dir.path().join(name);
        fs::write(&path, body).expect("writing the config");
        let p = path.to_str().expect("utf-8");
        let o = ember(&["check-config", p]);
        let out = text(&o);
        assert_eq!(
            o.status.code(),
            Some(1),
            "check-config on {name} should exit 1:\n{out}"
        );
        assert!(
            has_position(&out, p, line),
            "check-config on {name} should print `{p}:{line}:COL: message`, got:\n{out}"
        );
    }
}

/// A flag meets the rules of the key it overrides: `run --window 10ms` is refused like
/// `window.duration: 10ms` in the file (and `record --frequency 0` like
/// `sampling.frequency_hz: 0`), before anything starts.
#[test]
fn flags_are_validated_like_the_keys_they_override() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let data = data.to_str().expect("utf-8");
    let write = |name: &str, body: &str| {
        let path = dir.path().join(name);
        fs::write(&path, body).expect("writing the config");
        path.to_str().expect("utf-8").to_owned()
    };
    let short = write(
        "short.yaml",
        "server:\n  enabled: false\nwindow:\n  duration: 10ms\n",
    );
    let plain = write("plain.yaml", "server:\n  enabled: false\n");
    let out = dir.path().join("x.pb.gz");
    let out = out.to_str().expect("utf-8");
    let window = "window.duration: must be at least 100ms";
    let frequency = "sampling.frequency_hz: must be between 1 and 10000";
    let cases: [(&str, Vec<&str>, &str); 3] = [
        (
            "the file",
            vec!["run", "-c", &short, "--data-dir", data],
            window,
        ),
        (
            "--window",
            vec!["run", "-c", &plain, "--data-dir", data, "--window", "10ms"],
            window,
        ),
        (
            "--frequency",
            vec![
                "record",
                "-c",
                &plain,
                "--frequency",
                "0",
                "-d",
                "1s",
                "-o",
                out,
            ],
            frequency,
        ),
    ];
    for (what, args, message) in cases {
        let o = ember(&args);
        let all = text(&o);
        assert_eq!(
            o.status.code(),
            Some(1),
            "a too small value from {what} should be refused:\n{all}"
        );
        assert!(
            all.contains(message),
            "the refusal of {what} should say `{message}`:\n{all}"
        );
    }
    assert!(
        !std::path::Path::new(data).exists(),
        "nothing should have started"
    );
    assert!(
        !std::path::Path::new(out).exists(),
        "no profile should be written"
    );
}

/// (h) Without privileges, `ember record` fails with one sentence naming CAP_BPF.
#[test]
fn unprivileged_record_names_missing_capabilities() {
    let dir = tempfile::tempdir().expect("tempdir");
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).expect("chmod");
    let out = dir.path().join("x.pb.gz");
    let args = [
        "record",
        "--duration",
        "2s",
        "-o",
        out.to_str().expect("utf-8"),
    ];
    let o = if is_root() {
        // Drop to nobody. The binary is copied to a world-readable place first:
        // the checkout may live under a directory nobody cannot enter (/root).
        let bin = dir.path().join("ember");
        fs::copy(ember_bin(), &bin).expect("copying ember");
        fs::set_permissions(&bin, fs::Permissions::from_mode(0o755)).expect("chmod");
        let mut cmd = Command::new("setpriv");
        cmd.args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
            "--",
        ])
        .arg(&bin)
        .args(args)
        .current_dir(dir.path());
        output_with_timeout(&mut cmd, Duration::from_secs(30))
            .expect("running ember as nobody via setpriv (util-linux)")
    } else {
        ember(&args)
    };
    let stderr = String::from_utf8_lossy(&o.stderr);
    println!("unprivileged ember record: {}\n{stderr}", o.status);
    assert!(
        !o.status.success(),
        "ember record succeeded without privileges:\n{}",
        text(&o)
    );
    assert!(
        stderr.contains("CAP_BPF"),
        "stderr should name the missing CAP_BPF:\n{stderr}"
    );
    assert!(
        !stderr.contains("panicked") && !stderr.contains("RUST_BACKTRACE"),
        "a missing privilege is a message, not a crash:\n{stderr}"
    );
    assert!(!out.exists(), "no output file should be written");
}

/// The usage block of docs/commands.md names every long flag each command's `--help` lists
/// (it once lacked `--health-listen`), and no flag the commands do not take.
#[test]
fn the_usage_in_the_docs_names_every_flag() {
    let doc = fs::read_to_string(workspace_root().join("docs/commands.md")).expect("commands.md");
    let usage = doc
        .split("```")
        .nth(1)
        .expect("docs/commands.md opens with its usage block");
    let flags = |text: &str| -> std::collections::BTreeSet<String> {
        text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
            .filter(|w| w.starts_with("--") && w.len() > 2)
            .map(str::to_owned)
            .collect()
    };
    for command in ["run", "record", "report", "top", "features"] {
        let o = ember(&[command, "--help"]);
        assert!(o.status.success(), "ember {command} --help:\n{}", text(&o));
        let line = usage
            .split("\nember ")
            .find(|l| {
                l.trim_start_matches("ember ")
                    .trim_start_matches('[')
                    .starts_with(command)
            })
            .unwrap_or_else(|| panic!("no `ember {command}` line in the usage block:\n{usage}"));
        let mut helped = flags(&String::from_utf8_lossy(&o.stdout));
        helped.remove("--help");
        helped.remove("--version");
        let documented = flags(line);
        assert_eq!(
            documented, helped,
            "docs/commands.md's `ember {command}` usage against `ember {command} --help`"
        );
    }
}
