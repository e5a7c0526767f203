//! `ember features` on the host kernel: every part this kernel can run loads, and every
//! program stays within the verifier budget (a quarter of the kernel's 1M-instruction
//! limit), so the next kernel's verifier has room to be costlier. The same checks run on
//! Debian's kernels under qemu in `kernels.rs`.

use std::process::Command;
use std::time::Duration;

use ember_tests::*;

/// Instructions the verifier may process for any one program: a quarter of its limit.
const VERIFIER_BUDGET: u64 = 250_000;

fn features_json() -> serde_json::Value {
    let out = output_with_timeout(
        Command::new(ember_bin()).args(["features", "--json"]),
        Duration::from_secs(120),
    )
    .expect("running ember features");
    assert!(
        out.status.success(),
        "ember features failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("ember features --json prints JSON")
}

#[test]
fn every_program_is_within_the_verifier_budget_on_this_kernel() {
    if !require_privileged() {
        return;
    }
    let _guard = sampling_lock();
    let json = features_json();
    let kernel = json["kernel"].as_str().unwrap_or("?").to_owned();
    let programs = json["programs"].as_array().expect("programs");
    let mut lines = Vec::new();
    let mut over = Vec::new();
    for p in programs {
        let name = p["name"].as_str().unwrap_or("?");
        let insns = p["verified_insns"].as_u64();
        lines.push(format!(
            "  {name}: {} insns processed{}",
            insns.map_or("?".into(), |n| n.to_string()),
            p["error"]
                .as_str()
                .map_or(String::new(), |e| format!(" (refused once: {e})"))
        ));
        if p["loaded"].as_bool() == Some(true) {
            match insns {
                Some(n) if n <= VERIFIER_BUDGET => {}
                Some(n) => over.push(format!("{name}: {n}")),
                None => over.push(format!("{name}: no statistics")),
            }
        }
    }
    eprintln!(
        "kernel {kernel}, verifier cost per program:\n{}",
        lines.join("\n")
    );
    assert!(
        over.is_empty(),
        "over the budget of {VERIFIER_BUDGET} on {kernel}: {over:?}"
    );
    // The walker and the sampler that takes its first run are among them.
    for name in ["ember_sample_walk", "ember_walk"] {
        assert!(
            programs
                .iter()
                .any(|p| p["name"] == name && p["loaded"] == true),
            "{name} did not load on {kernel}:\n{}",
            lines.join("\n")
        );
    }
}

#[test]
fn this_kernel_runs_every_feature_of_the_default_config() {
    if !require_privileged() {
        return;
    }
    let _guard = sampling_lock();
    let json = features_json();
    let features = json["features"].as_array().expect("features");
    let table: Vec<String> = features
        .iter()
        .map(|f| {
            format!(
                "  {} {} {} ({}: {})",
                f["feature"], f["enabled"], f["path"], f["reason"], f["detail"]
            )
        })
        .collect();
    // What this machine's kernel (6.18, BTF, no kprobes) has: each must be on, and loaded
    // as asked rather than in a fallback variant.
    for name in [
        "sampler",
        "unwind_tables",
        "python",
        "exec_tracking",
        "offcpu",
        "wakers",
        "kernel_locks",
    ] {
        let f = features
            .iter()
            .find(|f| f["feature"] == name)
            .unwrap_or_else(|| panic!("no row for {name}:\n{}", table.join("\n")));
        // Off-CPU's task-work path is refused by this kernel build (its callback must be
        // sleepable now): off-CPU runs on its syscall hooks instead, and says so.
        let fallback = name == "offcpu" && f["reason"] == "refused";
        assert!(
            f["enabled"] == true && (f["reason"] == "loaded" || fallback),
            "{name} is not loaded as asked:\n{}",
            table.join("\n")
        );
    }
}
