//! speedscope's file format (<https://www.speedscope.app/file-format-schema.json>): one
//! "sampled" profile whose samples are the distinct stacks of [`flamegraph::stacks`],
//! weighted as the folded file is (samples, or microseconds off CPU), so `ember record
//! --format speedscope` opens in speedscope's time-order, left-heavy and sandwich views.

use std::collections::HashMap;

use serde_json::json;

use super::flamegraph;
use crate::proto::Profile;

/// The profile as a speedscope JSON document named `name`.
pub fn speedscope(profile: &Profile, name: &str) -> Vec<u8> {
    let mut frames: Vec<&str> = Vec::new();
    let mut index: HashMap<String, usize> = HashMap::new();
    let stacks = flamegraph::stacks(profile);
    let mut samples = Vec::with_capacity(stacks.len());
    let mut weights = Vec::with_capacity(stacks.len());
    for (stack, n) in &stacks {
        let ids: Vec<usize> = stack
            .iter()
            .map(|f| {
                *index.entry(f.clone()).or_insert_with(|| {
                    frames.push(f);
                    frames.len() - 1
                })
            })
            .collect();
        samples.push(ids);
        weights.push(*n);
    }
    let total: u64 = weights.iter().fold(0u64, |a, w| a.saturating_add(*w));
    let unit = if flamegraph::is_off_cpu(profile) {
        "microseconds"
    } else {
        "none"
    };
    let doc = json!({
        "$schema": "https://www.speedscope.app/file-format-schema.json",
        "shared": { "frames": frames.iter().map(|f| json!({ "name": f })).collect::<Vec<_>>() },
        "profiles": [{
            "type": "sampled",
            "name": name,
            "unit": unit,
            "startValue": 0,
            "endValue": total,
            "samples": samples,
            "weights": weights,
        }],
        "name": name,
        "activeProfileIndex": 0,
        "exporter": concat!("ember ", env!("CARGO_PKG_VERSION")),
    });
    let mut out = doc.to_string().into_bytes();
    out.push(b'\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{Function, Line, Location, Sample, ValueType};

    fn profile() -> Profile {
        let strings = ["", "samples", "count", "main", "work"];
        let function = |id: u64, name: i64| Function {
            id,
            name,
            ..Default::default()
        };
        let location = |id: u64, function_id: u64| Location {
            id,
            line: vec![Line {
                function_id,
                ..Default::default()
            }],
            ..Default::default()
        };
        Profile {
            sample_type: vec![ValueType { r#type: 1, unit: 2 }],
            string_table: strings.iter().map(|s| s.to_string()).collect(),
            function: vec![function(1, 3), function(2, 4)],
            location: vec![location(1, 1), location(2, 2)],
            sample: vec![
                Sample {
                    location_id: vec![2, 1],
                    value: vec![3],
                    ..Default::default()
                },
                Sample {
                    location_id: vec![1],
                    value: vec![1],
                    ..Default::default()
                },
            ],
            ..Default::default()
        }
    }

    /// Each distinct stack is a sample of frame indices, root first, weighted by its count.
    #[test]
    fn stacks_become_weighted_samples_of_shared_frames() {
        let doc: serde_json::Value =
            serde_json::from_slice(&speedscope(&profile(), "t")).expect("json");
        let frames: Vec<&str> = doc["shared"]["frames"]
            .as_array()
            .expect("frames")
            .iter()
            .map(|f| f["name"].as_str().expect("name"))
            .collect();
        let p = &doc["profiles"][0];
        let stacks: Vec<(Vec<&str>, u64)> = p["samples"]
            .as_array()
            .expect("samples")
            .iter()
            .zip(p["weights"].as_array().expect("weights"))
            .map(|(s, w)| {
                let names = s
                    .as_array()
                    .expect("ids")
                    .iter()
                    .map(|i| frames[i.as_u64().expect("id") as usize])
                    .collect();
                (names, w.as_u64().expect("weight"))
            })
            .collect();
        assert_eq!(
            stacks,
            vec![(vec!["main"], 1), (vec!["main", "work"], 3)],
            "{doc}"
        );
        assert_eq!(p["endValue"], 4);
        assert_eq!(p["type"], "sampled");
    }
}
