//! The host's network USE source: `/proc/1/net/dev`, `/proc/1/net/snmp` and link speeds,
//! rendered as node_exporter names them (the shared helpers and the USE table are in
//! [`super::host`]).

use std::collections::HashMap;
use std::time::Instant;

use prometheus_client::registry::Unit;

use super::host::{counter, gauge, use_errors, use_ratio, Options};
use super::{elapsed, netdev, read_optional, snmp, Roots};
use crate::metrics::{Cache, ReadingsSource};
use crate::readings::{Family, Interval, ReadError, Source};

/// `/proc/net/snmp` counters exported, as node_exporter's netstat collector names them.
const SNMP: &[(&str, &str, &str)] = &[
    ("Tcp", "RetransSegs", "node_netstat_Tcp_RetransSegs"),
    ("Tcp", "InSegs", "node_netstat_Tcp_InSegs"),
    ("Tcp", "OutSegs", "node_netstat_Tcp_OutSegs"),
    ("Tcp", "InErrs", "node_netstat_Tcp_InErrs"),
    ("Tcp", "OutRsts", "node_netstat_Tcp_OutRsts"),
    ("Tcp", "ActiveOpens", "node_netstat_Tcp_ActiveOpens"),
    ("Tcp", "PassiveOpens", "node_netstat_Tcp_PassiveOpens"),
    ("Tcp", "CurrEstab", "node_netstat_Tcp_CurrEstab"),
    ("Udp", "InDatagrams", "node_netstat_Udp_InDatagrams"),
    ("Udp", "OutDatagrams", "node_netstat_Udp_OutDatagrams"),
    ("Udp", "InErrors", "node_netstat_Udp_InErrors"),
    ("Udp", "NoPorts", "node_netstat_Udp_NoPorts"),
    ("Udp", "RcvbufErrors", "node_netstat_Udp_RcvbufErrors"),
    ("Udp", "SndbufErrors", "node_netstat_Udp_SndbufErrors"),
];

const RX_NAMES: [&str; 8] = [
    "node_network_receive",
    "node_network_receive_packets",
    "node_network_receive_errs",
    "node_network_receive_drop",
    "node_network_receive_fifo",
    "node_network_receive_frame",
    "node_network_receive_compressed",
    "node_network_receive_multicast",
];
const TX_NAMES: [&str; 8] = [
    "node_network_transmit",
    "node_network_transmit_packets",
    "node_network_transmit_errs",
    "node_network_transmit_drop",
    "node_network_transmit_fifo",
    "node_network_transmit_colls",
    "node_network_transmit_carrier",
    "node_network_transmit_compressed",
];

/// Network: `/proc/1/net/dev`, `/proc/1/net/snmp`, `/sys/class/net/<if>/speed`.
pub struct Network {
    roots: Roots,
    opts: Options,
    prev: HashMap<String, (Instant, netdev::Interface)>,
}

impl Network {
    /// A network source reading under `roots`.
    pub fn new(roots: Roots, opts: Options) -> Self {
        Self {
            roots,
            opts,
            prev: HashMap::new(),
        }
    }

    /// Link speed in bytes per second, when the driver reports one.
    fn speed(&self, iface: &str) -> Option<f64> {
        // The name comes from the kernel, but never let it climb out of /sys/class/net.
        if iface.contains('/') || iface == ".." || iface == "." {
            return None;
        }
        let text =
            std::fs::read_to_string(self.roots.sys.join("class/net").join(iface).join("speed"))
                .ok()?;
        let mbps: i64 = text.trim().parse().ok()?;
        (mbps > 0).then_some(mbps as f64 * 125_000.0)
    }
}

impl Source for Network {
    fn name(&self) -> ReadingsSource {
        ReadingsSource::Network
    }

    fn read(&mut self, out: &mut Vec<Family>, _: &Interval) -> Result<(), ReadError> {
        let mut errors = Vec::new();
        let path = self.roots.proc_net.join("dev");
        let text =
            crate::os::procfs::read_capped(&path, super::MAX_FILE_BYTES).map_err(|source| {
                ReadError::File {
                    path: path.clone(),
                    source,
                }
            })?;
        let mut ifaces = netdev::parse(&text)?;
        ifaces.retain(|i| {
            !self
                .opts
                .network_exclude
                .as_ref()
                .is_some_and(|re| re.is_match(&i.name))
        });
        if ifaces.len() > self.opts.max_devices {
            self.opts.metrics.dropped(
                Cache::ReadingsInterfaces,
                (ifaces.len() - self.opts.max_devices) as u64,
            );
            ifaces.truncate(self.opts.max_devices);
        }
        let help_rx = "Received, by interface (/proc/net/dev)";
        let help_tx = "Transmitted, by interface (/proc/net/dev)";
        for (j, name) in RX_NAMES.iter().enumerate() {
            let mut f = counter(name, help_rx, (j == 0).then_some(Unit::Bytes));
            for i in &ifaces {
                f.push(vec![("device", i.name.clone())], i.rx[j] as f64);
            }
            out.push(f);
        }
        for (j, name) in TX_NAMES.iter().enumerate() {
            let mut f = counter(name, help_tx, (j == 0).then_some(Unit::Bytes));
            for i in &ifaces {
                f.push(vec![("device", i.name.clone())], i.tx[j] as f64);
            }
            out.push(f);
        }
        let mut speed_f = gauge(
            "node_network_speed",
            "Link speed, when the driver reports one",
            Some(Unit::Bytes),
        );
        let now = Instant::now();
        let (mut busiest, mut dropped, mut packets, mut errs): (Option<f64>, u64, u64, u64) =
            (None, 0, 0, 0);
        let mut have_prev = false;
        let mut next = HashMap::with_capacity(ifaces.len());
        for i in ifaces {
            let speed = self.speed(&i.name);
            if let Some(s) = speed {
                speed_f.push(vec![("device", i.name.clone())], s);
            }
            errs += i.rx[2] + i.tx[2];
            if let Some((t, p)) = self.prev.get(&i.name) {
                have_prev = true;
                let d = |a: u64, b: u64| a.saturating_sub(b);
                dropped += d(i.rx[3], p.rx[3])
                    + d(i.tx[3], p.tx[3])
                    + d(i.rx[4], p.rx[4])
                    + d(i.tx[4], p.tx[4]);
                packets += d(i.rx[1], p.rx[1]) + d(i.tx[1], p.tx[1]);
                if let (Some(s), Some(dt)) = (speed, elapsed(now.duration_since(*t))) {
                    let u = d(i.rx[0], p.rx[0]).max(d(i.tx[0], p.tx[0])) as f64 / dt / s;
                    busiest = Some(busiest.map_or(u, |b: f64| b.max(u)));
                }
            }
            next.insert(i.name.clone(), (now, i));
        }
        self.prev = next;
        if !speed_f.points.is_empty() {
            out.push(speed_f);
        }
        let path = self.roots.proc_net.join("snmp");
        match read_optional(&path).map(|t| t.map(|t| snmp::parse(&t))) {
            Ok(Some(Ok(c))) => {
                for (proto, field, name) in SNMP {
                    if let Some(v) = snmp::get(&c, proto, field) {
                        // Untyped in node_exporter, so no `_total`.
                        let mut f = gauge(
                            name,
                            "Counter of /proc/net/snmp (named as node_exporter names it)",
                            None,
                        );
                        f.push(vec![], v as f64);
                        out.push(f);
                    }
                }
            }
            Ok(Some(Err(e))) => errors.push(e.into()),
            Ok(None) => {}
            Err(e) => errors.push(e),
        }
        let saturation = (have_prev && packets > 0).then(|| dropped as f64 / packets as f64);
        let saturation = if have_prev && packets == 0 {
            Some(0.0)
        } else {
            saturation
        };
        use_ratio(out, "network", busiest, saturation);
        use_errors(out, "network", errs as f64);
        ReadError::collect(errors)
    }
}
