//! Container attribution with real cgroups: fixtures are moved into cgroups shaped like a
//! kubelet's (systemd driver on cgroup v2, cgroupfs driver on a v1 controller), and every
//! sample ember takes of them must carry that container id and pod uid. The per-container
//! CPU from samples must agree with the cgroup's own counter (the USE readings'
//! `ember_container_cpu_usage_seconds_total`) on a steady hog.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ember_tests::*;

const ID_V2: &str = "c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00c0ffee01";
const UID_V2: &str = "11111111-2222-3333-4444-555555555555";
const ID_V1: &str = "beef0000beef0000beef0000beef0000beef0000beef0000beef0000beef0002";
const UID_V1: &str = "66666666-7777-8888-9999-aaaaaaaaaaaa";

/// A v1 `cpuacct` hierarchy, when the host has one.
fn v1_cpuacct() -> Option<PathBuf> {
    ["/sys/fs/cgroup/cpuacct", "/sys/fs/cgroup/cpu,cpuacct"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.join("cpuacct.usage").exists())
}

fn kubelet_v2_path() -> String {
    format!(
        "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{ID_V2}.scope",
        UID_V2.replace('-', "_")
    )
}

fn kubelet_v1_path() -> String {
    format!("kubepods/besteffort/pod{UID_V1}/{ID_V1}")
}

/// String labels of every sample, with its count.
fn labelled_samples(p: &ember::proto::Profile) -> Vec<(BTreeMap<String, String>, i64, i64)> {
    p.sample
        .iter()
        .map(|s| {
            let mut labels = BTreeMap::new();
            let mut pid = 0;
            for l in &s.label {
                let key = string(p, l.key);
                if key == "pid" {
                    pid = l.num;
                } else if l.str != 0 {
                    labels.insert(key, string(p, l.str));
                }
            }
            (labels, pid, s.value.first().copied().unwrap_or(0))
        })
        .collect()
}

fn host_config(dir: &Path) -> PathBuf {
    let path = dir.join("ember.yaml");
    fs::write(&path, "kubernetes:\n  enabled: false\n").expect("writing config");
    path
}

#[test]
fn samples_carry_container_id_and_pod_uid() {
    if !require_privileged() {
        return;
    }
    let _lock = sampling_lock();
    let v2 = v2_root().expect("a cgroup v2 hierarchy");
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = host_config(dir.path());

    let mut in_v2 = Fixture::spawn(CPU_HOG, &["--wait-start", "--seconds", "30"]).expect("fixture");
    let cg2 = TestCgroup::create(&v2, &kubelet_v2_path()).expect("creating the v2 cgroup");
    cg2.add(in_v2.pid)
        .expect("moving the fixture into the v2 cgroup");
    // The v1 fixture only where the host has a v1 cpuacct hierarchy (hybrid hosts like CI's).
    let v1 = v1_cpuacct().map(|root| {
        let f = Fixture::spawn(CPU_HOG, &["--wait-start", "--seconds", "30"]).expect("fixture");
        let cg = TestCgroup::create(&root, &kubelet_v1_path()).expect("creating the v1 cgroup");
        cg.add(f.pid)
            .expect("moving the fixture into the v1 cgroup");
        (f, cg)
    });
    in_v2.start().expect("start");
    let mut v1 = v1;
    let mut pids = vec![in_v2.pid];
    if let Some((f, _)) = v1.as_mut() {
        f.start().expect("start");
        pids.push(f.pid);
    }

    let out = dir.path().join("c.pb.gz");
    let mut args = vec![
        "--config".into(),
        cfg.display().to_string(),
        "--duration".into(),
        "5s".into(),
        "-o".into(),
        out.display().to_string(),
    ];
    for p in &pids {
        args.extend(["--pid".to_owned(), p.to_string()]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut ember = EmberRun::record(dir.path())
        .args(args)
        .try_spawn()
        .expect("ember record");
    let status = ember.wait(Duration::from_secs(60));
    assert!(status.success(), "ember record failed:\n{}", ember.stderr());
    let profile = read_profile(&out).expect("profile");

    let samples = labelled_samples(&profile);
    let expect = [(in_v2.pid, ID_V2, UID_V2)]
        .into_iter()
        .chain(v1.as_ref().map(|(f, _)| (f.pid, ID_V1, UID_V1)));
    for (pid, id, uid) in expect {
        let mine: Vec<_> = samples.iter().filter(|s| s.1 == i64::from(pid)).collect();
        let total: i64 = mine.iter().map(|s| s.2).sum();
        println!("pid {pid}: {total} samples in {} stacks", mine.len());
        assert!(total > 50, "pid {pid} was barely sampled: {total}");
        for (labels, _, _) in &mine {
            assert_eq!(
                labels.get("container_id").map(String::as_str),
                Some(id),
                "{labels:?}"
            );
            assert_eq!(
                labels.get("pod_uid").map(String::as_str),
                Some(uid),
                "{labels:?}"
            );
            assert!(
                !labels.contains_key("cgroup"),
                "containers are named by id: {labels:?}"
            );
        }
    }
    drop(cg2);
}

/// The per-container CPU seconds ember derives from samples agree with the cgroup's own counter.
#[test]
fn container_cpu_from_samples_matches_the_cgroup() {
    if !require_privileged() {
        return;
    }
    let _lock = sampling_lock();
    let dir = tempfile::tempdir().expect("tempdir");
    // The cgroup's counter is a reading: read it every 100 ms (containers only), so that
    // between two scrapes it covers the same ~8 s as the windows closed meanwhile, give or
    // take 100 ms.
    let cfg = dir.path().join("ember.yaml");
    fs::write(
        &cfg,
        "kubernetes:\n  enabled: false\nreadings:\n  interval: 100ms\n  host: false\n\
         counters:\n  perf: false\n  runqueue_latency: false\n",
    )
    .expect("writing config");

    // Hybrid hosts account container CPU in v1's cpuacct (v2's usage_usec stays 0 there);
    // pure v2 hosts in cpu.stat.
    let (root, rel, id) = match v1_cpuacct() {
        Some(root) => (root, kubelet_v1_path(), ID_V1),
        None => (
            v2_root().expect("a cgroup hierarchy"),
            kubelet_v2_path(),
            ID_V2,
        ),
    };
    let mut hog = Fixture::spawn(CPU_HOG, &["--wait-start", "--seconds", "60"]).expect("fixture");
    let cg = TestCgroup::create(&root, &rel).expect("creating the cgroup");
    cg.add(hog.pid).expect("moving the fixture into the cgroup");
    hog.start().expect("start");

    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let data = dir.path().join("windows");
    let args = [
        "--config",
        cfg.to_str().expect("utf-8"),
        "--window",
        "2s",
        "--data-dir",
        data.to_str().expect("utf-8"),
        "--listen",
        &addr,
        "--pid",
        &hog.pid.to_string(),
    ];
    let mut ember = EmberRun::run(dir.path())
        .args(args)
        .try_spawn()
        .expect("ember run");
    let series = |text: &str, name: &str| -> Option<f64> {
        text.lines()
            .filter(|l| l.starts_with(name) && l.contains(&format!("container_id=\"{id}\"")))
            .find_map(|l| l.rsplit_once(' ')?.1.parse().ok())
    };
    let scrape = || -> Option<(f64, f64)> {
        let (code, text) = http_get(&addr, "/metrics").ok()?;
        assert_eq!(code, 200);
        Some((
            series(&text, "ember_container_cpu_seconds_total")?,
            series(&text, "ember_container_cpu_usage_seconds_total")?,
        ))
    };
    // Wait for the first window with the container to close, then measure over about four
    // more. The sampled series moves when a window closes, the cgroup's every 100 ms, so two
    // scrapes 8 s apart cover four windows and 8 s (± 0.1 s) of the cgroup's counter.
    let mut first = None;
    for _ in 0..30 {
        std::thread::sleep(Duration::from_millis(500));
        first = scrape();
        if first.is_some() {
            break;
        }
    }
    let (s0, c0) = first.expect("both container CPU series within 15 s");
    std::thread::sleep(Duration::from_secs(8));
    let (s1, c1) = scrape().expect("both series");
    let (sampled, cgroup) = (s1 - s0, c1 - c0);
    println!("over ~8 s: {sampled:.3} s from samples, {cgroup:.3} s from the cgroup");
    assert!(
        cgroup > 2.0,
        "the hog should have burned a good part of 8 s: {cgroup}"
    );
    let diff = (sampled - cgroup).abs() / cgroup;
    assert!(
        diff <= 0.05,
        "sampled {sampled:.3} s vs cgroup {cgroup:.3} s: {:.1} % apart",
        diff * 100.0
    );

    let (_, text) = http_get(&addr, "/metrics").expect("scrape");
    assert!(
        text.lines()
            .any(|l| l.starts_with("ember_container_info{") && l.contains(id)),
        "ember_container_info names the container:\n{text}"
    );
    ember.signal(libc::SIGTERM);
    assert!(ember.wait(Duration::from_secs(10)).success());
    drop(cg);
}
