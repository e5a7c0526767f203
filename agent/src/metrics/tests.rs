//! The metrics table checked against what /metrics shows (docs/metrics.md is generated from
//! it: `reference.rs`).

use std::collections::{BTreeMap, BTreeSet};

use super::golden::touch_every_family;
use super::*;

#[test]
fn workloads_past_the_cap_share_other() {
    let m = Metrics::new();
    for i in 0..MAX_WORKLOADS {
        assert_eq!(m.workload_label(format!("w{i}")), format!("w{i}"));
    }
    assert_eq!(m.workload_label("w0".into()), "w0");
    assert_eq!(m.workload_label("late".into()), "other");
    m.unnamed_frames("late".into(), 3);
    m.unnamed_frames("w1".into(), 2);
    let text = m.encode();
    assert!(
        text.contains("ember_unnamed_frames_total{workload=\"other\"} 3"),
        "{text}"
    );
    assert!(
        text.contains("ember_unnamed_frames_total{workload=\"w1\"} 2"),
        "{text}"
    );
}

/// What the exposition says of one family: help, type, unit, and the label names of its
/// series (`le` of histogram buckets left out).
#[derive(Debug, Default, PartialEq)]
struct Shown {
    help: String,
    kind: String,
    unit: Option<String>,
    labels: BTreeSet<Vec<String>>,
}

/// The families of an exposition, by the name in their `# HELP` line.
fn families(text: &str) -> BTreeMap<String, Shown> {
    let mut out: BTreeMap<String, Shown> = BTreeMap::new();
    let mut current = String::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').expect("HELP name text");
            current = name.to_owned();
            out.entry(current.clone()).or_default().help = help.to_owned();
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            out.entry(current.clone()).or_default().kind =
                rest.rsplit(' ').next().expect("TYPE").to_owned();
        } else if let Some(rest) = line.strip_prefix("# UNIT ") {
            out.entry(current.clone()).or_default().unit =
                Some(rest.rsplit(' ').next().expect("UNIT").to_owned());
        } else if let Some((_, labels)) = line.split_once('{') {
            let labels = labels.split_once('}').expect("closing brace").0;
            let names: Vec<String> = labels
                .split("\",")
                .filter_map(|kv| kv.split_once('=').map(|(k, _)| k.trim().to_owned()))
                .filter(|k| k != "le")
                .collect();
            if !names.is_empty() {
                out.entry(current.clone()).or_default().labels.insert(names);
            }
        }
    }
    out
}

/// Every row of the table is on /metrics with its help, type, unit and label names, and
/// /metrics shows nothing the table does not declare (the readings snapshot aside: its
/// families are the sources' own).
#[test]
fn the_table_is_what_metrics_shows() {
    let m = Metrics::new();
    touch_every_family(&m);
    let shown = families(&m.encode());
    let declared = Metrics::declared();
    let mut names = BTreeSet::new();
    for d in &declared {
        // The HELP line names the family by its stem and unit, without `_total`.
        let family = d.exposed();
        let family = family.strip_suffix("_total").unwrap_or(&family);
        assert!(names.insert(family.to_owned()), "{family} declared twice");
        let s = shown
            .get(family)
            .unwrap_or_else(|| panic!("{family} is declared but not on /metrics"));
        assert_eq!(s.help, format!("{}.", d.help), "{family}");
        assert_eq!(s.kind, d.kind.as_str(), "{family}");
        assert_eq!(s.unit.as_deref(), d.unit.map(|u| u.as_str()), "{family}");
        let labels: Vec<String> = d.labels.iter().map(|l| l.to_string()).collect();
        let want = if labels.is_empty() {
            BTreeSet::new()
        } else {
            BTreeSet::from([labels])
        };
        assert_eq!(s.labels, want, "{family}: label names");
    }
    let undeclared: Vec<_> = shown.keys().filter(|n| !names.contains(*n)).collect();
    assert!(undeclared.is_empty(), "not in the table: {undeclared:?}");
}

#[test]
fn help_joins_doc_lines_without_the_final_stop() {
    assert_eq!(
        table::help(&[" Frames (object+offset", " or [unknown]), by workload."]),
        "Frames (object+offset or [unknown]), by workload"
    );
    assert_eq!(
        table::help(&[" 1 while synced, else 0"]),
        "1 while synced, else 0"
    );
}
