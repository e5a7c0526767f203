//! `ember run`: window files, the HTTP endpoints, and a clean exit on SIGTERM.

use std::fs;
use std::path::PathBuf;
use std::thread;
use std::time::{Duration, Instant};

use ember_tests::*;

/// (f) Windows are written and valid, /metrics is served, SIGTERM exits 0 promptly.
#[test]
fn run_writes_windows_serves_metrics_and_stops_on_sigterm() {
    if !require_privileged() {
        return;
    }
    let _lock = sampling_lock();
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let addr = format!("127.0.0.1:{}", free_port());

    let mut hog = Fixture::spawn(CPU_HOG, &["--seconds", "60"]).expect("starting cpu_hog");
    hog.wait_for("ready", Duration::from_secs(10))
        .expect("ready");

    let mut ember = EmberRun::run(dir.path())
        .args([
            "--window",
            "2s",
            "--data-dir",
            data.to_str().expect("utf-8"),
            "--listen",
            addr.as_str(),
        ])
        .try_spawn()
        .expect("starting ember run");
    let started = Instant::now();
    if ember.wait_attached(Duration::from_secs(15)).is_none() && !ember.running() {
        panic!("ember run exited early\n--- stderr ---\n{}", ember.stderr());
    }

    // /healthz answers once the server is up.
    let health = loop {
        match http_get(&addr, "/healthz") {
            Ok(r) => break r,
            Err(e) if started.elapsed() > Duration::from_secs(10) => panic!(
                "no answer on http://{addr}/healthz after 10 s: {e}\n--- stderr ---\n{}",
                ember.stderr()
            ),
            Err(_) => thread::sleep(Duration::from_millis(100)),
        }
    };
    assert_eq!(health.0, 200, "/healthz: {health:?}");

    // Let two windows close, then scrape.
    let until = started + Duration::from_secs(5);
    thread::sleep(until.saturating_duration_since(Instant::now()));
    let (status, metrics) = http_get(&addr, "/metrics").expect("scraping /metrics");
    assert_eq!(status, 200, "/metrics status\n{metrics}");
    let samples = metric_value(&metrics, "ember_samples_total");
    println!(
        "ember_samples_total = {samples:?}; samples_lost {:?}; frames {:?}",
        metrics
            .lines()
            .filter(|l| l.starts_with("ember_samples_lost_total"))
            .collect::<Vec<_>>(),
        metrics
            .lines()
            .filter(|l| l.starts_with("ember_frames_total"))
            .collect::<Vec<_>>()
    );
    assert!(
        samples.is_some_and(|v| v > 0.0),
        "/metrics has no positive ember_samples_total:\n{metrics}"
    );
    let (status, index) = http_get(&addr, "/").expect("GET /");
    assert_eq!(status, 200, "GET / status\n{index}");

    let until = started + Duration::from_secs(7);
    thread::sleep(until.saturating_duration_since(Instant::now()));
    ember.signal(libc::SIGTERM);
    let t = Instant::now();
    let status = ember.wait(Duration::from_secs(5));
    let stderr = ember.stderr();
    println!("--- ember run stderr ---\n{stderr}---");
    println!(
        "ember run exited {status} {:.2?} after SIGTERM",
        t.elapsed()
    );
    assert!(
        status.success(),
        "ember run exited with {status} after SIGTERM\n{stderr}"
    );
    drop(hog);

    let mut windows: Vec<PathBuf> = fs::read_dir(&data)
        .unwrap_or_else(|e| panic!("reading {}: {e}", data.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| ember_tests::is_cpu_window(p))
        .collect();
    windows.sort();
    println!("windows: {windows:?}");
    assert!(
        windows.len() >= 2,
        "expected at least 2 window files in {} after ~7 s with --window 2s, got {windows:?}",
        data.display()
    );
    let mut all = 0;
    for w in &windows {
        let name = w.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        assert!(
            name.starts_with("20"),
            "window file {name} should be named by its UTC timestamp"
        );
        let n = pprofcheck(w);
        let p = read_profile(w).expect("decoding a window");
        assert_eq!(
            n as usize,
            p.sample.len(),
            "pprofcheck and prost agree on {name}"
        );
        all += total(&stacks(&p));
    }
    assert!(all > 0, "no samples in any window");
}

/// `curl` as `nobody` (setpriv drops every privilege): the HTTP status of `url`, with
/// extra curl arguments; "000" when the connection is refused.
fn curl_as_nobody(url: &str, extra: &[&str]) -> String {
    let out = std::process::Command::new("setpriv")
        .args([
            "--reuid=nobody",
            "--regid=nogroup",
            "--clear-groups",
            "--inh-caps=-all",
            "curl",
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--max-time",
            "10",
        ])
        .args(extra)
        .arg(url)
        .output()
        .expect("running setpriv curl");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Issue 58 (1): on a plain host, a local user who is not ember's owner reads no profile.
/// `ember run` as `make run` starts it (no token configured, loopback listener): every
/// endpoint that names a process answers `nobody` 401, even with a guessed token or a
/// forged cookie; the token file is 0600 and unreadable to `nobody` although its
/// directory is world-readable; root with the token gets the profile, and the printed
/// `/?token=` address sets an HttpOnly, SameSite=Strict cookie and redirects to `/`.
#[test]
fn a_local_user_without_the_token_reads_no_profile() {
    if !require_privileged() {
        return;
    }
    let _lock = sampling_lock();
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    fs::create_dir(&data).expect("data dir");
    // World-readable, like /var/lib/ember: the token file's own mode must protect it.
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).expect("chmod");
    fs::set_permissions(&data, fs::Permissions::from_mode(0o755)).expect("chmod");
    let addr = format!("127.0.0.1:{}", free_port());
    let mut ember = EmberRun::run(dir.path())
        .args([
            "--window",
            "1s",
            "--data-dir",
            data.to_str().expect("utf-8"),
            "--listen",
            addr.as_str(),
        ])
        .try_spawn()
        .expect("starting ember run");
    if ember.wait_attached(Duration::from_secs(30)).is_none() {
        panic!("ember run did not attach\n{}", ember.stderr());
    }
    thread::sleep(Duration::from_secs(3));
    let name = fs::read_dir(&data)
        .expect("data dir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| is_cpu_window(p))
        .and_then(|p| p.file_name().and_then(|n| n.to_str()).map(String::from))
        .expect("a window file");
    let token_file = data.join("ui-token");
    let mode = fs::metadata(&token_file)
        .unwrap_or_else(|e| panic!("no token file: {e}\n{}", ember.stderr()))
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "token file mode {mode:o}");
    let cat = std::process::Command::new("setpriv")
        .args(["--reuid=nobody", "--regid=nogroup", "--clear-groups", "cat"])
        .arg(&token_file)
        .output()
        .expect("setpriv cat");
    assert!(!cat.status.success(), "nobody read the token file");
    let endpoints = [
        "/api/windows".to_string(),
        "/api/profile".into(),
        "/api/profile?from=now-1m".into(),
        "/api/flamegraph".into(),
        "/api/labels".into(),
        "/api/use".into(),
        format!("/windows/{name}"),
        format!("/flamegraph/{name}.svg"),
        "/?token=0000".into(),
    ];
    for path in &endpoints {
        let url = format!("http://{addr}{path}");
        for extra in [
            &[][..],
            &["-H", "Authorization: Bearer 0000"][..],
            &["-b", "ember_token=0000"][..],
        ] {
            let code = curl_as_nobody(&url, extra);
            assert!(
                code == "401" || code == "403" || code == "000",
                "nobody got {code} from {path} {extra:?}"
            );
        }
    }
    // What stays open: the probes, the metrics, the page that holds no data.
    for path in ["/metrics", "/healthz"] {
        assert_eq!(
            curl_as_nobody(&format!("http://{addr}{path}"), &[]),
            "200",
            "{path}"
        );
    }
    // Root, with the token: the profile, and the login address's cookie.
    let token = fs::read_to_string(&token_file)
        .expect("token")
        .trim()
        .to_string();
    let (status, body) = http_get_with(
        &addr,
        "/api/profile?from=now-1m",
        &format!("Authorization: Bearer {token}\r\n"),
    )
    .expect("GET /api/profile");
    assert_eq!(status, 200, "root with the token: {body}");
    let head = std::process::Command::new("curl")
        .args(["-s", "-D", "-", "-o", "/dev/null"])
        .arg(format!("http://{addr}/?token={token}"))
        .output()
        .expect("curl login");
    let head = String::from_utf8_lossy(&head.stdout).to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 303"), "{head}");
    assert!(head.contains("location: /\r\n"), "{head}");
    assert!(
        head.contains(&format!(
            "set-cookie: ember_token={token}; path=/; httponly; samesite=strict"
        )),
        "{head}"
    );
    let (status, _) = http_get_with(
        &addr,
        "/api/windows",
        &format!("Cookie: ember_token={token}\r\n"),
    )
    .expect("GET with cookie");
    assert_eq!(status, 200);
}
