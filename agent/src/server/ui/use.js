// The USE checklist: host and container rows from /api/use, coloured by thresholds,
// each linking to the matching profiles.
"use strict";

// [warn, bad] per kind of cell.
const T = { util: [0.7, 0.9], sat: [0.05, 0.25], err: [0, 0] };

function token() { return sessionStorage.getItem("ember-token") || ""; }

function sum(points, pred) { return (points || []).filter(pred || (() => true)).reduce((a, p) => a + p.value, 0); }
function key(labels) { return JSON.stringify(labels); }

// Per-second rate of a counter family between two snapshots, per label set.
function rates(prev, latest, name, dt) {
  const out = new Map();
  if (!prev || dt <= 0) return out;
  const before = new Map((prev.families[name] || []).map((p) => [key(p.labels), p.value]));
  for (const p of latest.families[name] || []) {
    const b = before.get(key(p.labels));
    if (b !== undefined && p.value >= b) out.set(key(p.labels), { labels: p.labels, value: (p.value - b) / dt });
  }
  return out;
}
function rateSum(prev, latest, name, dt, pred) { return sum([...rates(prev, latest, name, dt).values()], pred); }

function cell(value, kind, text) {
  const td = document.createElement("td");
  if (value === null || value === undefined || Number.isNaN(value)) { td.textContent = "–"; return td; }
  const [warn, bad] = T[kind];
  td.className = value > bad ? "bad" : value > warn ? "warn" : "ok";
  if (kind === "err" && value === 0) td.className = "ok";
  td.textContent = text;
  return td;
}
const pct = (v) => (100 * v).toFixed(1) + "%";

function row(body, who, resource, u, s, e, filters) {
  const tr = document.createElement("tr");
  const name = document.createElement("td");
  name.textContent = who;
  const res = document.createElement("td");
  res.textContent = resource;
  tr.append(name, res, cell(u && u[0], "util", u && u[1]), cell(s && s[0], "sat", s && s[1]), cell(e && e[0], "err", e && e[1]));
  const links = document.createElement("td");
  const to = new Date(), from = new Date(to - 9e5);
  for (const type of ["cpu", "offcpu", "lock"]) {
    const a = document.createElement("a");
    a.href = "./?" + new URLSearchParams({ type, from: from.toISOString(), to: to.toISOString(), ...filters });
    a.textContent = { cpu: "CPU", offcpu: "off-CPU", lock: "locks" }[type];
    a.className = "profile-" + type;
    links.append(a, " ");
  }
  tr.append(links);
  body.append(tr);
}

async function load() {
  const r = await fetch("api/use", { headers: token() ? { Authorization: "Bearer " + token() } : {} });
  if (!r.ok) throw new Error((await r.text()).trim());
  const { previous: prev, latest } = await r.json();
  const dt = prev ? (latest.time_ms - prev.time_ms) / 1000 : 0;
  const f = latest.families;
  const body = document.querySelector("#use tbody");
  body.textContent = "";
  // Host.
  const cpus = new Set((f.node_cpu || []).map((p) => p.labels.cpu)).size || 1;
  const busy = prev ? rateSum(prev, latest, "node_cpu", dt, (p) => p.labels.mode !== "idle" && p.labels.mode !== "iowait") / cpus : null;
  const load1 = sum(f.node_load1) / cpus;
  const cpuWait = prev ? rateSum(prev, latest, "node_pressure_cpu_waiting", dt) : null;
  row(body, "host", "CPU", busy === null ? null : [busy, pct(busy)], [Math.max(cpuWait || 0, load1 - 1), "psi " + (cpuWait === null ? "–" : pct(cpuWait)) + ", load/cpu " + load1.toFixed(2)], null, {});
  const total = sum(f.node_memory_MemTotal), avail = sum(f.node_memory_MemAvailable);
  const memU = total ? 1 - avail / total : null;
  const memWait = prev ? rateSum(prev, latest, "node_pressure_memory_waiting", dt) : null;
  const swaps = prev ? rateSum(prev, latest, "node_vmstat_pswpin", dt) + rateSum(prev, latest, "node_vmstat_pswpout", dt) : 0;
  const ooms = prev ? rateSum(prev, latest, "node_vmstat_oom_kill", dt) : null;
  row(body, "host", "memory", memU === null ? null : [memU, pct(memU)], memWait === null ? null : [memWait, "psi " + pct(memWait) + ", swap " + swaps.toFixed(1) + "/s"], ooms === null ? null : [ooms, ooms.toFixed(2) + " oom kills/s"], {});
  const ioBusy = prev ? Math.max(0, ...[...rates(prev, latest, "node_disk_io_time", dt).values()].map((p) => p.value)) : null;
  const ioWait = prev ? rateSum(prev, latest, "node_pressure_io_waiting", dt) : null;
  row(body, "host", "disk", ioBusy === null ? null : [ioBusy, "busiest " + pct(ioBusy)], ioWait === null ? null : [ioWait, "psi " + pct(ioWait)], null, {});
  if (prev) {
    const speed = new Map((f.node_network_speed || []).map((p) => [p.labels.device, p.value]));
    let netU = 0;
    for (const dir of ["node_network_receive", "node_network_transmit"]) {
      for (const p of rates(prev, latest, dir, dt).values()) {
        const s = speed.get(p.labels.device);
        if (s > 0) netU = Math.max(netU, p.value / s);
      }
    }
    const drops = rateSum(prev, latest, "node_network_receive_drop", dt) + rateSum(prev, latest, "node_network_transmit_drop", dt);
    const errs = rateSum(prev, latest, "node_network_receive_errs", dt) + rateSum(prev, latest, "node_network_transmit_errs", dt);
    row(body, "host", "network", [netU, "busiest " + pct(netU)], [drops > 0 ? 1 : 0, drops.toFixed(2) + " drops/s"], [errs, errs.toFixed(2) + " errors/s"], {});
  } else {
    row(body, "host", "network", null, null, null, {});
  }
  // Containers, by their labels.
  const byContainer = new Map();
  for (const p of f.container_cpu_usage || []) byContainer.set(key(p.labels), p.labels);
  for (const [k, labels] of byContainer) {
    const who = labels.namespace ? labels.namespace + "/" + labels.pod + "/" + labels.container : (labels.container || labels.container_id || "?");
    const filters = {};
    for (const l of ["namespace", "pod", "container"]) if (labels[l]) filters[l] = labels[l];
    if (!filters.container && labels.container_id) filters.container_id = labels.container_id;
    const pick = (name) => (prev ? rates(prev, latest, name, dt).get(k) : undefined);
    const cpu = pick("container_cpu_usage");
    const periods = pick("container_cpu_cfs_periods"), throttled = pick("container_cpu_cfs_throttled_periods");
    const thr = periods && periods.value > 0 && throttled ? throttled.value / periods.value : null;
    const cw = pick("container_pressure_cpu_waiting");
    const csat = Math.max(thr || 0, cw ? cw.value : 0);
    row(body, who, "CPU", cpu ? [cpu.value / cpus, cpu.value.toFixed(2) + " cores"] : null, prev ? [csat, "throttled " + (thr === null ? "–" : pct(thr)) + ", psi " + (cw ? pct(cw.value) : "–")] : null, null, filters);
    const ws = (f.container_memory_working_set || []).find((p) => key(p.labels) === k);
    const mw = pick("container_pressure_memory_waiting");
    const oom = pick("container_oom_events");
    row(body, who, "memory", ws ? [0, (ws.value / 1048576).toFixed(1) + " MiB"] : null, mw ? [mw.value, "psi " + pct(mw.value)] : null, oom ? [oom.value, oom.value.toFixed(2) + " ooms/s"] : null, filters);
    const iw = pick("container_pressure_io_waiting");
    row(body, who, "disk", null, iw ? [iw.value, "psi " + pct(iw.value)] : null, null, filters);
  }
  document.getElementById("status").textContent = prev
    ? "rates over " + dt.toFixed(0) + " s ending " + new Date(latest.time_ms).toISOString()
    : "first reading " + new Date(latest.time_ms).toISOString() + "; rates appear after the next one";
}

function tick() { load().catch((e) => { document.getElementById("status").textContent = String(e.message || e); }); }
tick();
setInterval(tick, 5000);
