//! Reading an agent's `/metrics` exposition (OpenMetrics text), the one parser every suite
//! uses: exact series lines, metric families with their labels, and sums over a family.

use std::collections::BTreeMap;
use std::thread;
use std::time::{Duration, Instant};

use crate::http_get;

/// A series' labels, by name.
pub type Labels = BTreeMap<String, String>;

/// Value of the series whose name and labels are exactly `series` (`name{a="b",...}`, as
/// /metrics writes them, or a bare `name`) in an exposition; `None` if absent.
pub fn series(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

/// [`series`], 0 if absent.
pub fn series_value(text: &str, series: &str) -> f64 {
    self::series(text, series).unwrap_or(0.0)
}

/// Value of the first sample of metric `name` (any labels) in an OpenMetrics/Prometheus text.
pub fn metric_value(exposition: &str, name: &str) -> Option<f64> {
    family(exposition, name).first().map(|(_, v)| *v)
}

/// Every series of metric `name`, with its labels parsed, in exposition order.
pub fn family(exposition: &str, name: &str) -> Vec<(Labels, f64)> {
    let mut out = Vec::new();
    for line in exposition.lines().filter(|l| !l.starts_with('#')) {
        let Some((head, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let (base, labels) = match head.split_once('{') {
            Some((b, l)) => (b, l.trim_end_matches('}')),
            None => (head, ""),
        };
        if base != name {
            continue;
        }
        let mut map = Labels::new();
        for pair in labels.split("\",").filter(|p| !p.is_empty()) {
            if let Some((k, v)) = pair.split_once("=\"") {
                map.insert(k.to_owned(), v.trim_end_matches('"').to_owned());
            }
        }
        if let Ok(v) = value.trim().parse::<f64>() {
            out.push((map, v));
        }
    }
    out
}

/// Sum of the series of metric `name` whose labels include every `key="value"` of `labels`.
pub fn family_sum(exposition: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    family(exposition, name)
        .into_iter()
        .filter(|(l, _)| {
            labels
                .iter()
                .all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|(_, v)| v)
        .sum()
}

/// `/metrics` on `addr`, retried for up to 30 s until it answers 200 (a busy listener may
/// refuse for a while); panics with the last answer after that.
pub fn scrape(addr: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match http_get(addr, "/metrics") {
            Ok((200, body)) => return body,
            other => assert!(
                Instant::now() < deadline,
                "no /metrics on {addr}: {other:?}"
            ),
        }
        thread::sleep(Duration::from_millis(100));
    }
}

/// Polls `/metrics` on `addr` until `done` holds or `timeout` passes; returns the last scrape.
pub fn metrics_until(addr: &str, timeout: Duration, done: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + timeout;
    loop {
        let text = http_get(addr, "/metrics")
            .map(|(_, t)| t)
            .unwrap_or_default();
        if done(&text) || Instant::now() >= deadline {
            return text;
        }
        thread::sleep(Duration::from_millis(250));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# TYPE ember_x counter\n\
        ember_x_total{kind=\"a\",pid=\"1\"} 2\n\
        ember_x_total{kind=\"b\",pid=\"1\"} 3.5\n\
        ember_y 7\n";

    #[test]
    fn series_families_and_sums() {
        assert_eq!(
            series(TEXT, "ember_x_total{kind=\"b\",pid=\"1\"}"),
            Some(3.5)
        );
        assert_eq!(series(TEXT, "ember_x_total{kind=\"b\"}"), None);
        assert_eq!(series_value(TEXT, "ember_y"), 7.0);
        assert_eq!(series_value(TEXT, "ember_z"), 0.0);
        assert_eq!(metric_value(TEXT, "ember_x_total"), Some(2.0));
        assert_eq!(family(TEXT, "ember_x_total").len(), 2);
        assert_eq!(family(TEXT, "ember_x_total")[1].0["kind"], "b");
        assert_eq!(family_sum(TEXT, "ember_x_total", &[("pid", "1")]), 5.5);
        assert_eq!(family_sum(TEXT, "ember_x_total", &[("kind", "a")]), 2.0);
    }
}
