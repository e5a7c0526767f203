//! `ember report` over the window files a real `ember run` wrote: every format checked by
//! its own reader (google/pprof's validation and `go tool pprof`, inferno's folded reader,
//! speedscope's JSON schema), the filters, the time range, and a malformed window file
//! counted, named in one warning line and skipped.

use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use ember_tests::*;

/// Runs `ember report ARGS` to completion; its exit status, stdout and stderr.
fn report(dir: &Path, args: &[&str]) -> (bool, String, String) {
    let mut ember = EmberRun::report(dir).args(args.iter().copied()).spawn();
    let status = ember.wait(Duration::from_secs(120));
    (status.success(), ember.stdout(), ember.stderr())
}

/// The window files in `data`.
fn windows(data: &Path) -> Vec<String> {
    fs::read_dir(data)
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter(|n| n.ends_with(".pb.gz"))
                .collect()
        })
        .unwrap_or_default()
}

/// Samples of a folded text, by its own counts, and those of the lines with `name`.
fn folded_counts(text: &str, name: &str) -> (u64, u64) {
    let count = |l: &str| l.rsplit_once(' ').and_then(|(_, n)| n.parse::<u64>().ok());
    let all = text.lines().filter_map(count).sum();
    let hot = text
        .lines()
        .filter(|l| l.contains(name))
        .filter_map(count)
        .sum();
    (all, hot)
}

/// inferno's own reader of folded stacks: the samples it counted (the root frame of the
/// flame graph it draws says `all (N samples, 100%)`).
fn inferno_samples(text: &str) -> u64 {
    let mut opts = inferno::flamegraph::Options::default();
    let mut svg = Vec::new();
    inferno::flamegraph::from_lines(&mut opts, text.lines(), &mut svg)
        .expect("inferno reads the folded output");
    let svg = String::from_utf8(svg).expect("utf-8 svg");
    let at = svg
        .find("all (")
        .unwrap_or_else(|| panic!("no root frame in inferno's graph"));
    svg[at + 5..]
        .split(' ')
        .next()
        .map(|n| n.replace(',', ""))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("inferno's root frame has no count: {}", &svg[at..at + 40]))
}

#[test]
fn windows_on_disk_are_merged_filtered_and_written_in_every_format() {
    if !require_privileged() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("windows");
    {
        let _lock = sampling_lock();
        let hog = Fixture::spawn(CPU_HOG, &["--seconds", "60"]).expect("starting cpu_hog");
        let mut run = EmberRun::run(dir.path())
            .config("kubernetes:\n  enabled: false\n")
            .data_dir(&data)
            .listen()
            .args(["--window", "1s"])
            .pids(&[hog.pid])
            .spawn_ready();
        let deadline = Instant::now() + Duration::from_secs(30);
        while windows(&data).len() < 4 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(200));
        }
        run.stop(Duration::from_secs(30));
        drop(hog);
    }
    let good = windows(&data);
    assert!(good.len() >= 4, "ember run wrote {} windows", good.len());
    // A window file that is not a profile, named as ember names them (in 2020: only a
    // report over all time reads it).
    let bad = "20200101T000000.000Z.pb.gz";
    fs::write(data.join(bad), b"not gzip at all").expect("writing the bad window");
    let d = data.to_str().expect("utf-8");
    let hog_name = "cpu_hog";

    // pprof: google/pprof's strict checks, then `go tool pprof`.
    let pb = dir.path().join("all.pb.gz");
    let (ok, _, stderr) = report(
        dir.path(),
        &[
            "--data-dir",
            d,
            "--process",
            hog_name,
            "-o",
            pb.to_str().expect("utf-8"),
        ],
    );
    println!("--- report stderr ---\n{stderr}");
    assert!(ok, "ember report failed:\n{stderr}");
    let warnings: Vec<&str> = stderr.lines().filter(|l| l.contains("skipped")).collect();
    assert_eq!(
        warnings.len(),
        1,
        "one warning line for the bad file:\n{stderr}"
    );
    assert!(
        warnings[0].contains("skipped 1 window file") && warnings[0].contains(bad),
        "the warning counts and names the bad file: {}",
        warnings[0]
    );
    assert!(pprofcheck(&pb) > 0, "pprofcheck found no samples");
    let p = read_profile(&pb).expect("reading the report");
    let samples = total(&stacks(&p)) as u64;
    // Several 1 s windows of a process burning one CPU at 99 Hz.
    assert!(samples >= 250, "{samples} samples in the merged profile");
    assert!(
        stacks(&p)
            .iter()
            .all(|s| s.comm.as_deref() == Some("cpu_hog")),
        "--process cpu_hog kept another process's samples"
    );
    let mut go = Command::new("go");
    go.args(["tool", "pprof", "-top", "-symbolize=none"])
        .arg(&pb)
        .env("PPROF_TMPDIR", dir.path())
        .env("HOME", dir.path());
    let res = output_with_timeout(&mut go, Duration::from_secs(120))
        .expect("running `go tool pprof` (is golang-go installed? `make test-deps`)");
    let top = String::from_utf8_lossy(&res.stdout);
    assert!(res.status.success(), "go tool pprof -top failed:\n{top}");
    assert!(
        top.contains("hot_a"),
        "go tool pprof -top does not list hot_a:\n{top}"
    );

    // Folded to standard output over the last ten minutes: the 2020 file is out of range
    // (no warning), and inferno reads every line.
    let (ok, folded, stderr) = report(dir.path(), &["--data-dir", d, "--since", "10m", "-o", "-"]);
    assert!(ok, "ember report --since 10m failed:\n{stderr}");
    assert!(
        !stderr.contains("skipped"),
        "the 2020 file is out of range:\n{stderr}"
    );
    let (all, hot) = folded_counts(&folded, "hot_a");
    assert_eq!(
        inferno_samples(&folded),
        all,
        "inferno counts other samples than the folded lines say"
    );
    assert!(
        all >= samples,
        "{all} folded samples, {samples} in the cpu_hog pprof"
    );
    let share = 100.0 * hot as f64 / samples as f64;
    println!("folded: {all} samples, hot_a {hot} ({share:.1} % of cpu_hog's)");
    assert!(
        (55.0..=85.0).contains(&share),
        "hot_a is {share:.1} % of cpu_hog's samples"
    );

    // A container no window has: an error that names the filter, not an empty file.
    let (ok, _, stderr) = report(
        dir.path(),
        &["--data-dir", d, "--container", "nope", "-o", "-"],
    );
    assert!(!ok && stderr.contains("container=nope"), "{stderr}");
    // A range with no window: an error that says how many there are.
    let (ok, _, stderr) = report(
        dir.path(),
        &[
            "--data-dir",
            d,
            "--until",
            "2019-01-01T00:00:00Z",
            "-o",
            "-",
        ],
    );
    assert!(!ok && stderr.contains("no cpu windows"), "{stderr}");

    // speedscope, checked against its own schema.
    let (Some(python), Some(schema)) = (
        std::env::var_os("EMBER_OTLP_PYTHON"),
        std::env::var_os("EMBER_SPEEDSCOPE_SCHEMA"),
    ) else {
        skip("EMBER_OTLP_PYTHON (with jsonschema) and EMBER_SPEEDSCOPE_SCHEMA unset: `make e2e-deps`");
        return;
    };
    let doc = dir.path().join("all.speedscope.json");
    let (ok, _, stderr) = report(
        dir.path(),
        &["--data-dir", d, "-o", doc.to_str().expect("utf-8")],
    );
    assert!(ok, "ember report -o .speedscope.json failed:\n{stderr}");
    if let Some(why) = json_schema_refusal(&python, &doc, &schema) {
        panic!("speedscope's schema refuses the report:\n{why}");
    }
    let v: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(&doc).expect("reading")).expect("json");
    let weights: u64 = v["profiles"][0]["weights"]
        .as_array()
        .expect("weights")
        .iter()
        .filter_map(|w| w.as_u64())
        .sum();
    assert!(
        weights >= samples,
        "{weights} speedscope samples, {samples} of cpu_hog's"
    );
}
