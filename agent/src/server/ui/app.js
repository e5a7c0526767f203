// ember's profile explorer: range (presets, brush), label filters, search, flame graph /
// icicle, top table and a differential flame graph. Everything comes from this agent's
// /api/*; nothing is fetched from elsewhere.
"use strict";

const FILTER_KEYS = ["service_name", "namespace", "pod", "container", "container_id", "process", "comm", "pid", "cgroup", "systemd_unit"];
const RANGES = { "5m": 3e5, "15m": 9e5, "1h": 36e5, "6h": 216e5, "24h": 864e5 };
const state = { type: "cpu", from: null, to: null, filters: {}, baseFilters: {}, search: "", diff: false, baseline: "previous", icicle: false };
const $ = (id) => document.getElementById(id);
let windows = [];
let chart = null;
let topRows = [];
let topSort = "flat";
let lastTotal = 0;

function token() { return sessionStorage.getItem("ember-token") || ""; }

async function api(path, params) {
  const url = "api/" + path + "?" + new URLSearchParams(params);
  const headers = token() ? { Authorization: "Bearer " + token() } : {};
  const r = await fetch(url, { headers });
  if (r.status === 401) { $("auth").hidden = false; throw new Error("this agent wants a bearer token"); }
  if (!r.ok) throw new Error((await r.text()).trim() || r.statusText);
  return r.json();
}

function iso(ms) { return new Date(ms).toISOString().replace(".000Z", "Z"); }

function rangeParams(from, to, filters) {
  const p = { type: state.type, from: iso(from), to: iso(to) };
  for (const [k, v] of Object.entries(filters)) if (v) p[k] = v;
  return p;
}

function readUrl() {
  const q = new URLSearchParams(location.search);
  for (const [k, v] of q) {
    if (k === "from" || k === "to") state[k] = Date.parse(v) || Number(v) * 1000 || null;
    else if (k === "type") state.type = v;
    else if (k === "search") state.search = v;
    else if (k === "diff") state.diff = v === "1";
    else if (k.startsWith("base_")) state.baseFilters[k.slice(5)] = v;
    else state.filters[k] = v;
  }
}

function writeUrl() {
  const p = rangeParams(state.from, state.to, state.filters);
  if (state.search) p.search = state.search;
  if (state.diff) p.diff = "1";
  for (const [k, v] of Object.entries(state.baseFilters)) if (v) p["base_" + k] = v;
  history.replaceState(null, "", "?" + new URLSearchParams(p));
  const api = new URL("api/profile?" + new URLSearchParams(rangeParams(state.from, state.to, state.filters)), location.href);
  $("download").href = api.href;
  $("pprof-cmd").textContent = "go tool pprof -http=: '" + api.href + "'";
}

function status(text, error) { $("status").textContent = text; $("status").className = error ? "error" : ""; }

async function loadWindows() {
  windows = await api("windows", { type: state.type });
  const now = Date.now();
  if (state.to === null) state.to = now;
  if (state.from === null) state.from = state.to - RANGES["15m"];
  drawTimeline();
}

function drawTimeline() {
  const svg = d3.select("#timeline");
  svg.selectAll("*").remove();
  const width = svg.node().getBoundingClientRect().width || 900;
  const first = windows.length ? windows[0].start_ms : Date.now() - 36e5;
  const lo = Math.min(first, state.from), hi = Math.max(Date.now(), state.to);
  const x = d3.scaleTime().domain([lo, hi]).range([0, width]);
  const maxBytes = d3.max(windows, (w) => w.bytes) || 1;
  svg.append("g").selectAll("rect").data(windows).join("rect")
    .attr("class", (w) => "bar " + w.type)
    .attr("x", (w) => x(w.start_ms)).attr("width", 2)
    .attr("y", (w) => 36 - 30 * w.bytes / maxBytes).attr("height", (w) => 30 * w.bytes / maxBytes);
  svg.append("g").attr("class", "axis").attr("transform", "translate(0,38)").call(d3.axisBottom(x).ticks(8));
  const brush = d3.brushX().extent([[0, 0], [width, 38]]).on("end", (event) => {
    if (!event.sourceEvent || !event.selection) return;
    const [a, b] = event.selection.map((v) => x.invert(v).getTime());
    setRange(a, b);
  });
  const g = svg.append("g").attr("class", "brush").call(brush);
  g.call(brush.move, [x(state.from), x(state.to)]);
}

function setRange(from, to) {
  state.from = Math.round(from); state.to = Math.round(to);
  document.querySelectorAll("#presets button").forEach((b) => b.classList.remove("on"));
  refresh();
}

async function loadFilters() {
  const labels = await api("labels", rangeParams(state.from, state.to, {}));
  drawSelects($("filters"), labels.labels, state.filters, "filter-");
  drawSelects($("baseline-filters"), labels.labels, state.baseFilters, "base-");
}

function drawSelects(box, labels, chosen, prefix) {
  box.textContent = "";
  for (const key of FILTER_KEYS) {
    const values = labels[key];
    if (!values || !values.length) continue;
    const label = document.createElement("label");
    label.textContent = key + " ";
    const sel = document.createElement("select");
    sel.id = prefix + key;
    sel.append(new Option("any", ""));
    for (const v of values) sel.append(new Option(v, v));
    if (chosen[key] && !values.includes(chosen[key])) sel.append(new Option(chosen[key], chosen[key]));
    sel.value = chosen[key] || "";
    sel.onchange = () => { chosen[key] = sel.value; refresh(); };
    label.append(sel);
    box.append(label);
  }
}

// The differential tree: the union of both graphs, the baseline scaled to the target's
// total (so ranges of different lengths compare). A frame is as wide as target + scaled
// baseline, so a function that vanished stays visible (blue) beside one that is new (red),
// and `delta` = target − scaled baseline colours it.
function diffTree(target, base) {
  const scale = base.value ? target.value / base.value : 0;
  function walk(name, t, b) {
    const tv = t ? t.value : 0;
    const bv = b ? b.value * scale : 0;
    const out = { name, value: tv + bv, delta: tv - bv };
    const kids = new Map();
    for (const c of (t && t.children) || []) kids.set(c.name, [c, null]);
    for (const c of (b && b.children) || []) kids.set(c.name, [(kids.get(c.name) || [null])[0], c]);
    if (kids.size) out.children = [...kids].map(([n, [tc, bc]]) => walk(n, tc, bc));
    return out;
  }
  return walk(target.name, target, base);
}

function drawChart(root) {
  const box = $("chart");
  box.textContent = "";
  chart = flamegraph.default()
    .width(box.getBoundingClientRect().width || 1200)
    .cellHeight(18).transitionDuration(300).minFrameSize(1)
    .inverted(state.icicle).sort(true)
    .setDetailsElement($("details"));
  if (state.diff) chart.setColorMapper(flamegraph.colorMapper.differentialColorMapper);
  d3.select("#chart").datum(root).call(chart);
  if (state.search) chart.search(state.search);
}

function drawTop(total) {
  const rows = topRows.map((r) => ({ ...r, flat_pct: total ? 100 * r.flat / total : 0, cum_pct: total ? 100 * r.cum / total : 0 }));
  rows.sort((a, b) => topSort === "name" ? a.name.localeCompare(b.name) : b[topSort] - a[topSort]);
  const body = document.querySelector("#top tbody");
  body.textContent = "";
  for (const r of rows.slice(0, 100)) {
    const tr = document.createElement("tr");
    for (const [v, pct] of [[r.name], [r.flat], [r.flat_pct, 1], [r.cum], [r.cum_pct, 1]]) {
      const td = document.createElement("td");
      td.textContent = pct ? v.toFixed(2) + "%" : v;
      tr.append(td);
    }
    tr.onclick = () => { $("search").value = r.name; state.search = r.name; chart && chart.search(r.name); writeUrl(); };
    body.append(tr);
  }
}

let generation = 0;
async function refresh() {
  const mine = ++generation;
  writeUrl();
  drawTimeline();
  status("loading…");
  try {
    const graph = await api("flamegraph", rangeParams(state.from, state.to, state.filters));
    let root = graph.root;
    let note = "";
    if (state.diff) {
      const len = state.to - state.from;
      const base = state.baseline === "previous"
        ? await api("flamegraph", rangeParams(state.from - len, state.from, state.filters))
        : await api("flamegraph", rangeParams(state.from, state.to, state.baseFilters));
      root = diffTree(graph.root, base.root);
      note = " · differential against " + (state.baseline === "previous" ? "the previous " + Math.round(len / 6e4) + " min" : "the baseline filter") + " (" + base.total + " " + base.unit + ")";
    }
    if (mine !== generation) return;
    drawChart(root);
    topRows = graph.top;
    lastTotal = graph.total;
    drawTop(graph.total);
    status(graph.total + " " + graph.unit + " in " + graph.stacks + " distinct stacks, " + iso(state.from) + " – " + iso(state.to) + note);
    loadFilters().catch(() => {});
  } catch (e) {
    if (mine === generation) status(String(e.message || e), true);
  }
}

function init() {
  readUrl();
  $("type").value = state.type;
  $("search").value = state.search;
  $("diff").checked = state.diff;
  $("type").onchange = () => { state.type = $("type").value; loadWindows().then(refresh); };
  document.querySelectorAll("#presets button").forEach((b) => b.onclick = () => {
    const r = b.dataset.range;
    const now = Date.now();
    const from = r === "all" ? (windows.length ? windows[0].start_ms : now - 36e5) : now - RANGES[r];
    setRange(from, now + 1000);
    b.classList.add("on");
  });
  $("search").oninput = () => { state.search = $("search").value; if (chart) { state.search ? chart.search(state.search) : chart.clear(); } writeUrl(); };
  $("icicle").onchange = () => { state.icicle = $("icicle").checked; refresh(); };
  $("reset").onclick = () => chart && chart.resetZoom();
  $("diff").onchange = () => { state.diff = $("diff").checked; refresh(); };
  $("baseline").onchange = () => { state.baseline = $("baseline").value; if (state.diff) refresh(); };
  $("token-save").onclick = () => { sessionStorage.setItem("ember-token", $("token").value); $("auth").hidden = true; start(); };
  document.querySelectorAll("#top th").forEach((th) => th.onclick = () => { topSort = th.dataset.key; drawTop(lastTotal); });
  if (Object.keys(state.baseFilters).length) { state.baseline = "filter"; $("baseline").value = "filter"; }
  start();
}

function start() { loadWindows().then(refresh).catch((e) => status(String(e.message || e), true)); }

init();
