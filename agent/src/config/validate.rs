//! The checks the types cannot make (ranges, combinations), one function per section.
//! They run in the order the sections' errors have always been reported: the first
//! invalid value found is the one named.

use std::time::Duration;

use super::values::Invalid;
use super::{
    selector, Config, ConfigError, Filters, Jit, Limits, OffCpu, OtlpMetrics, Readings, Sampling,
    Server, Symbols,
};

impl Config {
    /// Checks values the types cannot (ranges, combinations); `origin` names where they
    /// came from in the error. Loading runs it; run it again after changing fields.
    pub fn validate(&self, origin: &str) -> Result<(), ConfigError> {
        self.check()
            .map_err(|Invalid { key, message }| ConfigError::Invalid {
                origin: origin.to_owned(),
                key,
                message,
            })
    }

    fn check(&self) -> Result<(), Invalid> {
        sampling(&self.sampling)?;
        offcpu(&self.offcpu)?;
        if self.window.duration < Duration::from_millis(100) {
            return Err(Invalid::new("window.duration", "must be at least 100ms"));
        }
        if self.output.keep_windows == 0 {
            return Err(Invalid::new("output.keep_windows", "must be at least 1"));
        }
        jit(&self.jit)?;
        limit_counts(&self.limits)?;
        symbols(&self.symbols)?;
        limit_bytes(&self.limits)?;
        server(&self.server)?;
        readings(&self.readings)?;
        if self.counters.max_containers == 0 {
            return Err(Invalid::new(
                "counters.max_containers",
                "must be at least 1",
            ));
        }
        otlp_metrics(&self.otlp_metrics)?;
        filters(&self.filters)?;
        self.sinks.validate()
    }
}

/// `Err` naming `key` when `bad`.
fn refuse(bad: bool, key: &'static str, message: &str) -> Result<(), Invalid> {
    if bad {
        return Err(Invalid::new(key, message));
    }
    Ok(())
}

fn sampling(s: &Sampling) -> Result<(), Invalid> {
    refuse(
        !(1..=10_000).contains(&s.frequency_hz),
        "sampling.frequency_hz",
        "must be between 1 and 10000",
    )?;
    refuse(
        !s.ring_buffer_bytes.is_power_of_two() || s.ring_buffer_bytes < 4096,
        "sampling.ring_buffer_bytes",
        "must be a power of two of at least 4096",
    )?;
    refuse(
        s.unwind_max_bytes < 1 << 20,
        "sampling.unwind_max_bytes",
        "must be at least 1048576 (1 MiB)",
    )?;
    refuse(
        !(1..=1 << 20).contains(&s.unwind_max_processes),
        "sampling.unwind_max_processes",
        "must be between 1 and 1048576",
    )
}

fn offcpu(o: &OffCpu) -> Result<(), Invalid> {
    refuse(
        o.window < Duration::from_millis(100),
        "offcpu.window",
        "must be at least 100ms",
    )?;
    refuse(
        !(o.sample_rate > 0.0 && o.sample_rate <= 1.0),
        "offcpu.sample_rate",
        "must be above 0 and at most 1",
    )?;
    refuse(
        !(o.fallback_rate > 0.0 && o.fallback_rate <= 1.0),
        "offcpu.fallback_rate",
        "must be above 0 and at most 1",
    )?;
    refuse(
        !(1..=1 << 22).contains(&o.max_tasks),
        "offcpu.max_tasks",
        "must be between 1 and 4194304",
    )?;
    refuse(
        !(1..=1 << 20).contains(&o.max_threads),
        "offcpu.max_threads",
        "must be between 1 and 1048576",
    )?;
    refuse(
        !(1..=1 << 20).contains(&o.max_stacks),
        "offcpu.max_stacks",
        "must be between 1 and 1048576",
    )?;
    refuse(
        !o.ring_buffer_bytes.is_power_of_two() || o.ring_buffer_bytes < 4096,
        "offcpu.ring_buffer_bytes",
        "must be a power of two of at least 4096",
    )
}

fn jit(j: &Jit) -> Result<(), Invalid> {
    refuse(
        j.max_entries_per_process == 0 || j.max_total_entries == 0,
        "jit.max_total_entries",
        "entry caps must be at least 1",
    )?;
    refuse(
        j.max_bytes_per_process < 1 << 20 || j.max_total_bytes < 1 << 20,
        "jit.max_total_bytes",
        "byte caps must be at least 1 MiB",
    )?;
    refuse(
        !j.jvm_perfmap_refresh.is_zero() && j.jvm_perfmap_refresh < Duration::from_secs(1),
        "jit.jvm_perfmap_refresh",
        "must be 0s (off) or at least 1s",
    )
}

/// The `limits:` counts (the byte caps are checked after `symbols:`).
fn limit_counts(l: &Limits) -> Result<(), Invalid> {
    for (key, v) in [
        ("limits.max_processes", l.max_processes),
        ("limits.max_objects", l.max_objects),
        ("limits.max_stacks_per_window", l.max_stacks_per_window),
        ("limits.symbol_cache_entries", l.symbol_cache_entries),
        ("limits.sample_queue_batches", l.sample_queue_batches),
    ] {
        refuse(v == 0, key, "must be at least 1")?;
    }
    Ok(())
}

fn symbols(y: &Symbols) -> Result<(), Invalid> {
    refuse(
        y.cache_bytes < 1 << 20,
        "symbols.cache_bytes",
        "must be at least 1 MiB",
    )?;
    refuse(
        y.max_section_bytes < 4096 || y.max_read_bytes < y.max_section_bytes,
        "symbols.max_read_bytes",
        "max_section_bytes must be at least 4096 and max_read_bytes at least that",
    )?;
    refuse(
        y.debuginfod_urls.iter().any(|u| {
            !(u.starts_with("https://") || y.debuginfod_allow_http && u.starts_with("http://"))
        }),
        "symbols.debuginfod_urls",
        "each must start with https:// (http:// only with symbols.debuginfod_allow_http)",
    )?;
    refuse(
        y.debuginfod_timeout.is_zero(),
        "symbols.debuginfod_timeout",
        "must be more than 0",
    )?;
    refuse(
        y.debuginfod_max_file_bytes < 4096
            || y.debuginfod_cache_bytes < y.debuginfod_max_file_bytes,
        "symbols.debuginfod_cache_bytes",
        "debuginfod_max_file_bytes must be at least 4096 and debuginfod_cache_bytes at least that",
    )?;
    refuse(
        y.dwarf_bytes < 4096,
        "symbols.dwarf_bytes",
        "must be at least 4096",
    )
}

fn limit_bytes(l: &Limits) -> Result<(), Invalid> {
    for (key, v) in [
        ("limits.sample_queue_bytes", l.sample_queue_bytes),
        (
            "limits.max_stack_bytes_per_window",
            l.max_stack_bytes_per_window,
        ),
    ] {
        refuse(v < 1 << 20, key, "must be at least 1 MiB (1048576)")?;
    }
    Ok(())
}

fn server(v: &Server) -> Result<(), Invalid> {
    refuse(
        v.enabled && !v.listen.ip().is_loopback() && v.token_file.as_os_str().is_empty(),
        "server.token_file",
        "must be set when server.listen is not a loopback address \
         (profiles name every process and pod on the host)",
    )?;
    refuse(
        v.metrics_listen == Some(v.listen),
        "server.metrics_listen",
        "must differ from server.listen",
    )?;
    refuse(
        v.health_listen.is_some()
            && (v.health_listen == Some(v.listen) || v.health_listen == v.metrics_listen),
        "server.health_listen",
        "must differ from server.listen and server.metrics_listen",
    )?;
    if let Some(bad) = v
        .allowed_hosts
        .iter()
        .find(|h| h.is_empty() || h.len() > 255 || !h.bytes().all(|b| b.is_ascii_graphic()))
    {
        return Err(Invalid::new(
            "server.allowed_hosts",
            format!("{bad:?} is not a host name (or name:port)"),
        ));
    }
    for (key, n) in [
        ("server.max_connections", v.max_connections),
        ("server.max_concurrent_requests", v.max_concurrent_requests),
        ("server.max_merge_samples", v.max_merge_samples),
        ("server.max_flame_nodes", v.max_flame_nodes),
    ] {
        refuse(n == 0, key, "must be at least 1")?;
    }
    for (key, d) in [
        ("server.header_read_timeout", v.header_read_timeout),
        ("server.idle_timeout", v.idle_timeout),
        ("server.request_timeout", v.request_timeout),
    ] {
        refuse(
            d < Duration::from_millis(100),
            key,
            "must be at least 100ms",
        )?;
    }
    refuse(
        v.max_file_bytes < 4096,
        "server.max_file_bytes",
        "must be at least 4096",
    )?;
    refuse(
        v.max_response_bytes < 4096,
        "server.max_response_bytes",
        "must be at least 4096",
    )
}

fn readings(r: &Readings) -> Result<(), Invalid> {
    refuse(
        r.interval < Duration::from_millis(100),
        "readings.interval",
        "must be at least 100ms",
    )?;
    refuse(
        r.max_containers == 0,
        "readings.max_containers",
        "must be at least 1",
    )?;
    refuse(
        r.max_devices == 0,
        "readings.max_devices",
        "must be at least 1",
    )?;
    for (key, re) in [
        ("readings.disk_exclude", &r.disk_exclude),
        ("readings.network_exclude", &r.network_exclude),
    ] {
        regex::Regex::new(re).map_err(|e| Invalid::new(key, e.to_string()))?;
    }
    Ok(())
}

fn otlp_metrics(o: &OtlpMetrics) -> Result<(), Invalid> {
    refuse(
        !o.endpoint.is_http(),
        "otlp_metrics.endpoint",
        "must start with http:// or https://",
    )?;
    refuse(
        o.interval < Duration::from_millis(100),
        "otlp_metrics.interval",
        "must be at least 100ms",
    )
}

fn filters(f: &Filters) -> Result<(), Invalid> {
    for (key, sel) in [
        ("filters.include_pod_selector", &f.include_pod_selector),
        ("filters.exclude_pod_selector", &f.exclude_pod_selector),
    ] {
        selector::Selector::parse(sel).map_err(|e| Invalid::new(key, e.to_string()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first invalid value in file order is the one named, across sections: a
    /// `symbols:` error comes before a `limits:` byte cap, a `limits:` count before both.
    #[test]
    fn the_first_invalid_section_is_named() {
        let key = |c: &Config| c.check().map_err(|e| e.key);
        let mut c = Config::default();
        assert_eq!(key(&c), Ok(()));
        c.limits.sample_queue_bytes = 1;
        assert_eq!(key(&c), Err("limits.sample_queue_bytes"));
        c.symbols.cache_bytes = 1;
        assert_eq!(key(&c), Err("symbols.cache_bytes"));
        c.limits.max_objects = 0;
        assert_eq!(key(&c), Err("limits.max_objects"));
        c.sinks.queue_bytes = 1;
        c.sampling.frequency_hz = 0;
        assert_eq!(key(&c), Err("sampling.frequency_hz"));
        let mut c = Config::default();
        c.sinks.queue_bytes = 1;
        let err = c.validate("f.yaml").map_err(|e| e.to_string());
        assert_eq!(
            err,
            Err("f.yaml: sinks.queue_bytes: must be at least 1024".into())
        );
    }
}
