//! `docs/metrics.md`, generated from the metric table ([`Metrics::declared`]: name, type,
//! labels, help) and the label-value enums of `reasons.rs` and `model.rs` (each value with
//! its doc comment), so the reference is written once, where the metric is declared.
//! `ember docs metrics` prints it; a test fails when the checked-in page differs.

use std::fmt::Write as _;

use prometheus_client::metrics::MetricType;

use super::reasons::ExportDrop;
use super::Metrics;
use crate::config::reference::cell;

/// The sources the label values are read from: their doc comments are the documentation,
/// which the compiled enums do not keep.
const REASONS_RS: &str = include_str!("reasons.rs");
const MODEL_RS: &str = include_str!("../model.rs");

/// Label enums of `model.rs` (values of samples, not only of metrics), with the family and
/// label they fill; `reasons.rs` enums name theirs in their own doc comment.
const MODEL_ENUMS: &[(&str, &str)] = &[
    ("StackEnd", "`ember_stacks_total{result}`"),
    ("PyWalk", "`ember_python_walks_total{result}`"),
    ("OffState", "`ember_container_offcpu_seconds_total{state}`"),
];

/// One enum of label values: its doc, and each value with its doc.
#[derive(Debug, PartialEq, Eq)]
struct LabelEnum {
    name: String,
    doc: String,
    values: Vec<(String, String)>,
}

/// Every `pub enum NAME {` block of `src` written as `Variant => "value",` rows, with the
/// `///` lines above the enum and above each row.
fn label_enums(src: &str) -> Vec<LabelEnum> {
    let mut out = Vec::new();
    let mut doc: Vec<&str> = Vec::new();
    let mut current: Option<LabelEnum> = None;
    for line in src.lines() {
        let t = line.trim();
        if let Some(text) = t.strip_prefix("///") {
            doc.push(text.trim());
        } else if let Some(rest) = t.strip_prefix("pub enum ") {
            current = Some(LabelEnum {
                name: rest.trim_end_matches(" {").trim().to_owned(),
                doc: doc.join(" "),
                values: Vec::new(),
            });
            doc.clear();
        } else if let (Some(e), Some((_, value))) = (current.as_mut(), t.split_once(" => \"")) {
            let value = value.trim_end_matches(',').trim_end_matches('"');
            e.values.push((value.to_owned(), doc.join(" ")));
            doc.clear();
        } else if let (Some(e), Some(variant)) = (current.as_mut(), t.strip_suffix(',')) {
            // A variant whose value is made by code (`ExportDrop`): its value by name.
            if let Some(value) = computed_value(&e.name, variant) {
                e.values.push((value, doc.join(" ")));
            }
            doc.clear();
        } else if t == "}" {
            if let Some(e) = current.take() {
                if !e.values.is_empty() {
                    out.push(e);
                }
            }
            doc.clear();
        } else if !t.starts_with("#[") {
            doc.clear();
        }
    }
    out
}

/// The label value of a variant of an enum whose values are made by code, not written in a
/// `=> "value"` row: [`ExportDrop`] (the backend's status is part of its value).
fn computed_value(enum_name: &str, variant: &str) -> Option<String> {
    if enum_name != "ExportDrop" {
        return None;
    }
    let drop = match variant {
        "QueueFull" => ExportDrop::QueueFull,
        "TooLarge" => ExportDrop::TooLarge,
        "Shutdown" => ExportDrop::Shutdown,
        "RetriesExhausted" => ExportDrop::RetriesExhausted,
        "Encode" => ExportDrop::Encode,
        "BadRequest" => ExportDrop::BadRequest,
        "Internal" => ExportDrop::Internal,
        "Http(u16)" => return Some("http_<status>".into()),
        "Grpc(tonic::Code)" => return Some("grpc_<code>".into()),
        _ => return None,
    };
    Some(drop.label().into_owned())
}

fn kind(k: &MetricType) -> &'static str {
    match k {
        MetricType::Counter => "counter",
        MetricType::Gauge => "gauge",
        MetricType::Histogram => "histogram",
        MetricType::Info => "info",
        MetricType::Unknown => "unknown",
    }
}

/// The page, as `docs/metrics.md` holds it.
pub fn markdown() -> String {
    let mut out = String::from(
        "<!-- Generated from agent/src/metrics (the metric table, reasons.rs, model.rs) by \
         `ember docs metrics`; do not edit: edit the doc comments there and run `make docs`. \
         -->\n\n# Metrics\n\nember's own metrics, as `/metrics` (OpenMetrics text) and the \
         OTLP metrics exporter show them. Every one is declared once, in the table of \
         `agent/src/metrics/`; its doc comment is both its `# HELP` text and its line here. \
         The resource (USE), perf-counter and run-queue families (`ember_node_*`, \
         `ember_container_*` from cgroups, `ember_perf_*`, `ember_runqueue_*`) are read by \
         the readings thread and described in [use-metrics.md](use-metrics.md) and \
         [runqueue.md](runqueue.md).\n\n\
         | metric | type | labels | help |\n|---|---|---|---|\n",
    );
    for d in Metrics::declared() {
        let labels = d
            .labels
            .iter()
            .map(|l| format!("`{l}`"))
            .collect::<Vec<_>>()
            .join(", ");
        let _ = writeln!(
            out,
            "| `{}` | {} | {} | {} |",
            d.exposed(),
            kind(&d.kind),
            labels,
            cell(&d.help)
        );
    }
    out.push_str(
        "\n## Label values\n\nThe labels that take a fixed set of values, each value with what \
         it counts.\n",
    );
    let model = label_enums(MODEL_RS);
    let from_model = MODEL_ENUMS.iter().filter_map(|(name, family)| {
        let e = model.iter().find(|e| e.name == *name)?;
        Some((family.to_string(), e.doc.clone(), &e.values))
    });
    let reasons = label_enums(REASONS_RS);
    let from_reasons = reasons.iter().filter_map(|e| {
        // The enum's doc starts with the family it fills: "`ember_x_total{label}`: ...".
        let rest = e.doc.strip_prefix('`')?;
        let (family, doc) = rest.split_once("`:")?;
        let doc = doc.trim();
        let mut chars = doc.chars();
        let doc = chars
            .next()
            .map(|c| c.to_uppercase().chain(chars).collect())
            .unwrap_or_default();
        Some((format!("`{family}`"), doc, &e.values))
    });
    let mut all: Vec<_> = from_reasons.chain(from_model).collect();
    all.sort_by(|a, b| a.0.cmp(&b.0));
    for (family, doc, values) in all {
        let _ = write!(out, "\n### {family}\n\n");
        if !doc.is_empty() {
            let _ = writeln!(out, "{}\n", doc.replace('<', "&lt;"));
        }
        for (value, what) in values {
            let _ = writeln!(out, "- `{value}`: {}", what.replace('<', "&lt;"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enums_keep_each_values_doc() {
        let src = "/// `ember_x_total{why}`: what.\n/// More.\npub enum X {\n    /// First.\n    \
                   A => \"a\",\n    #[allow(dead_code)]\n    /// Second,\n    /// two lines.\n    \
                   B => \"b\",\n}\n/// Not one.\npub enum Y {\n    C,\n}\n";
        assert_eq!(
            label_enums(src),
            [LabelEnum {
                name: "X".into(),
                doc: "`ember_x_total{why}`: what. More.".into(),
                values: vec![
                    ("a".into(), "First.".into()),
                    ("b".into(), "Second, two lines.".into())
                ],
            }]
        );
    }

    /// Each metric has one row (python_walks_total once had two that disagreed), and the
    /// label enums the table uses are all found.
    #[test]
    fn one_row_per_metric_and_every_enum_found() {
        let page = markdown();
        for d in Metrics::declared() {
            let row = format!("| `{}` |", d.exposed());
            assert_eq!(page.matches(&row).count(), 1, "{row}");
        }
        for family in [
            "`ember_samples_lost_total{reason}`",
            "`ember_python_walks_total{result}`",
            "`ember_stacks_total{result}`",
            "`ember_cache_dropped_total{cache}`",
            "`ember_export_dropped_total{reason}`",
        ] {
            assert!(page.contains(&format!("### {family}")), "{family}");
        }
    }

    /// Every `ExportDrop` variant has its value in the page: a variant added without a row in
    /// `computed_value` would be missing.
    #[test]
    fn every_export_drop_is_listed() {
        let e = label_enums(REASONS_RS)
            .into_iter()
            .find(|e| e.name == "ExportDrop")
            .expect("ExportDrop");
        let variants = REASONS_RS
            .split("pub enum ExportDrop {")
            .nth(1)
            .and_then(|rest| rest.split('}').next())
            .expect("the enum's body")
            .lines()
            .map(str::trim)
            .filter(|l| !l.starts_with("//") && l.ends_with(','))
            .count();
        assert_eq!(e.values.len(), variants, "{:?}", e.values);
        assert!(e.values.iter().any(|(v, _)| v == "retries_exhausted"));
    }

    /// docs/metrics.md is what `ember docs metrics` prints today.
    #[test]
    fn the_checked_in_page_is_current() {
        crate::config::reference::compare_with_checked_in("docs/metrics.md", &markdown());
    }
}
