// gridrpc dashboard. Vanilla JS, no build step, no CDN.
// Data: /api/tree and /api/stats (polled with fetch, no page reload) and
// /api/events (EventSource, live). Every name from the tree or an event is
// put in the page with textContent or SVG text nodes, never innerHTML.
"use strict";

const POLL_MS = 2000;          // tree and stats refresh
const EVENT_REFRESH_MS = 700;  // stats refresh shortly after events arrive
const FEED_MAX = 80;
const SVG = "http://www.w3.org/2000/svg";
const PALETTE = ["#5fb3f9", "#4cc38a", "#e5b443", "#ef6b73", "#b48ef7", "#4fd1c5",
                 "#f78fb3", "#a3be8c", "#f6a35b", "#8fa1b3"];
const colours = new Map();

const state = { tree: [], stats: null, treeOk: false, statsOk: false, streamOk: false,
                eventTimer: null, flashing: new Map(), feedCount: 0, dropped: 0 };

// ---- small helpers ----------------------------------------------------------
const $ = (id) => document.getElementById(id);

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined && text !== null) e.textContent = String(text);
  return e;
}

function svg(tag, attrs, text) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
  if (text !== undefined && text !== null) e.textContent = String(text);
  return e;
}

function colour(name) {
  if (!colours.has(name)) colours.set(name, PALETTE[colours.size % PALETTE.length]);
  return colours.get(name);
}

function num(v) { return typeof v === "number" && isFinite(v) ? v : null; }

function fmtRate(v) {
  v = num(v);
  if (v === null) return "–";
  if (v === 0) return "0";
  return v >= 100 ? v.toFixed(0) : v >= 10 ? v.toFixed(1) : v.toFixed(2);
}

function fmtSecs(v) {
  v = num(v);
  if (v === null) return "–";
  if (v === 0) return "0";
  if (v < 0.001) return (v * 1e6).toFixed(0) + "µs";
  if (v < 1) return (v * 1000).toFixed(v < 0.01 ? 2 : v < 0.1 ? 1 : 0) + "ms";
  if (v < 120) return v.toFixed(v < 10 ? 2 : 1) + "s";
  if (v < 7200) return (v / 60).toFixed(1) + "m";
  return (v / 3600).toFixed(1) + "h";
}

function fmtAge(v) {
  v = num(v);
  if (v === null) return "?";
  v = Math.max(0, v);  // clocks of two hosts: never "-0.0s ago"
  if (v < 60) return v.toFixed(1) + "s";
  if (v < 3600) return Math.floor(v / 60) + "m" + String(Math.floor(v % 60)).padStart(2, "0") + "s";
  return (v / 3600).toFixed(1) + "h";
}

function fmtAgo(v) {   // axis labels: round numbers
  if (v < 90) return Math.round(v) + "s";
  const m = v / 60;
  return (Math.abs(m - Math.round(m)) < 0.05 ? Math.round(m) : m.toFixed(1)) + "m";
}

function fmtClock(t) {
  const d = new Date(t * 1000);
  return d.toLocaleTimeString([], { hour12: false }) + "." + String(d.getMilliseconds()).padStart(3, "0");
}

function setText(id, text) { const e = $(id); if (e && e.textContent !== text) e.textContent = text; }

function clear(node) { while (node.firstChild) node.removeChild(node.firstChild); }

async function getJSON(url) {
  const r = await fetch(url, { cache: "no-store", headers: { Accept: "application/json" } });
  if (!r.ok) throw new Error(url + ": HTTP " + r.status);
  return r.json();
}

function updateConn() {
  const c = $("conn");
  const ok = state.treeOk && state.statsOk;
  let s, text;
  if (ok && state.streamOk) { s = "live"; text = "live"; }
  else if (ok) { s = "connecting"; text = "polling (event stream reconnecting)"; }
  else { s = "down"; text = "MA unreachable, retrying"; }
  c.dataset.state = s;
  setText("conn-text", text);
}

// ---- polling --------------------------------------------------------------------
async function pollTree() {
  try {
    const data = await getJSON("/api/tree");
    state.tree = Array.isArray(data.elements) ? data.elements : [];
    state.treeOk = true;
    renderTree();
    renderKpis();
  } catch (e) {
    state.treeOk = false;
  }
  updateConn();
  setTimeout(pollTree, POLL_MS);
}

let statsInFlight = false;
async function refreshStats() {
  if (statsInFlight) return;
  statsInFlight = true;
  try {
    state.stats = await getJSON("/api/stats");
    state.statsOk = true;
    renderStats();
    renderKpis();
  } catch (e) {
    state.statsOk = false;
  } finally {
    statsInFlight = false;
  }
  updateConn();
}

async function pollStats() {
  await refreshStats();
  setTimeout(pollStats, POLL_MS);
}

function scheduleStats() {
  if (state.eventTimer) return;
  state.eventTimer = setTimeout(() => { state.eventTimer = null; refreshStats(); }, EVENT_REFRESH_MS);
}

// ---- KPIs --------------------------------------------------------------------------
function renderKpis() {
  const tree = state.tree, st = state.stats;
  const ma = tree.find((e) => e.kind === "ma");
  if (ma) setText("ma-name", ma.name);
  setText("kpi-elements", String(tree.length));
  const services = new Set();
  let running = 0, waiting = 0;
  for (const e of tree) {
    if (e.kind === "sed") {
      for (const s of e.services || []) services.add(s);
      const load = e.load || {};
      running += num(load.num_running) || 0;
      waiting += num(load.num_waiting) || 0;
    }
  }
  setText("kpi-services", String(services.size));
  setText("kpi-running", String(running));
  setText("kpi-waiting", String(waiting));
  if (st) {
    setText("calls-per-s", fmtRate(st.calls_per_s));
    setText("kpi-events", fmtRate(st.events_per_s));
    setText("kpi-unfairness", num(st.unfairness) === null ? "–" : st.unfairness.toFixed(2));
  }
}

// ---- tree ----------------------------------------------------------------------------
const NODE_W = 232, COL_W = 290, ROW_H = 70, PAD = 10;

function layoutTree(elements) {
  const byName = new Map(elements.map((e) => [e.name, e]));
  const kids = new Map();
  const roots = [];
  for (const e of elements) {
    if (e.parent && byName.has(e.parent) && e.parent !== e.name) {
      if (!kids.has(e.parent)) kids.set(e.parent, []);
      kids.get(e.parent).push(e);
    } else {
      roots.push(e);
    }
  }
  const order = { ma: 0, la: 1, sed: 2 };
  for (const list of kids.values())
    list.sort((a, b) => (order[a.kind] ?? 3) - (order[b.kind] ?? 3) || String(a.name).localeCompare(String(b.name)));
  roots.sort((a, b) => (order[a.kind] ?? 3) - (order[b.kind] ?? 3));
  const pos = new Map();
  let next = 0, maxDepth = 0;
  const seen = new Set();
  function place(e, depth) {
    if (seen.has(e.name)) return 0;   // defensive: a cycle in hostile data
    seen.add(e.name);
    maxDepth = Math.max(maxDepth, depth);
    const children = kids.get(e.name) || [];
    let y;
    if (children.length === 0) {
      y = next++;
    } else {
      const ys = children.map((c) => place(c, depth + 1));
      y = (Math.min(...ys) + Math.max(...ys)) / 2;
    }
    pos.set(e.name, { x: depth, y });
    return y;
  }
  for (const r of roots) place(r, 0);
  return { pos, rows: Math.max(1, next), cols: maxDepth + 1, byName };
}

function nodeInfo(e, refNow) {
  const load = e.load || {};
  if (e.kind === "ma") {
    const up = num(e.started) !== null ? refNow - e.started : null;
    const kids = num(load.children);
    return (kids !== null ? kids + " children · " : "") + "root" + (up !== null ? " · up " + fmtAge(up) : "");
  }
  const age = num(e.last_heartbeat) !== null ? refNow - e.last_heartbeat : null;
  if (e.kind === "la") {
    const kids = num(load.children);
    return (kids !== null ? kids + " children · " : "") + "hb " + fmtAge(age) + " ago";
  }
  return "hb " + fmtAge(age) + " ago";
}

function renderTree() {
  const root = $("tree");
  const elements = state.tree;
  const { pos, rows, cols, byName } = layoutTree(elements);
  const width = (cols - 1) * COL_W + NODE_W + 2 * PAD;
  const height = rows * ROW_H + 2 * PAD - 10;
  root.setAttribute("width", width);
  root.setAttribute("height", height);
  root.setAttribute("viewBox", `0 0 ${width} ${height}`);
  const ma = elements.find((e) => e.kind === "ma");
  // the MA's own last_heartbeat is the server's clock when /api/tree answered:
  // ages are computed against it, so the browser's clock does not matter
  const refNow = ma && num(ma.last_heartbeat) !== null ? ma.last_heartbeat : Date.now() / 1000;
  clear(root);
  const edges = svg("g", { class: "edges" });
  const nodes = svg("g", { class: "nodes" });
  root.appendChild(edges);
  root.appendChild(nodes);
  const xy = (p) => [PAD + p.x * COL_W, PAD + p.y * ROW_H];
  let lost = 0, seds = 0;
  for (const e of elements) {
    const p = pos.get(e.name);
    if (!p) continue;
    const [x, y] = xy(p);
    const h = e.kind === "sed" ? 58 : 46;
    const cy = y + h / 2;
    const isLost = e.state === "lost";
    if (isLost) lost++;
    if (e.kind === "sed") seds++;
    if (e.parent && pos.has(e.parent) && byName.has(e.parent)) {
      const pp = pos.get(e.parent);
      const [px, py] = xy(pp);
      const ph = byName.get(e.parent).kind === "sed" ? 58 : 46;
      const sx = px + NODE_W, sy = py + ph / 2, mx = (sx + x) / 2;
      edges.appendChild(svg("path", { class: "edge" + (isLost ? " lost" : ""),
        d: `M${sx},${sy} C${mx},${sy} ${mx},${cy} ${x},${cy}` }));
    }
    const kind = ["ma", "la", "sed"].includes(e.kind) ? e.kind : "other";
    const g = svg("g", { class: `node ${kind}${isLost ? " lost" : ""}`, transform: `translate(${x},${y})` });
    g.dataset.name = e.name;
    g.appendChild(svg("rect", { class: "box", width: NODE_W, height: h, rx: 7 }));
    g.appendChild(svg("rect", { class: "kindbar", x: 0, y: 6, width: 3, height: h - 12 }));
    g.appendChild(svg("circle", { class: "state " + (isLost ? "lost" : "alive"), cx: NODE_W - 12, cy: 13, r: 4.5 }));
    const title = svg("title", {}, `${e.name} (${e.kind}) ${e.address || ""} pid ${e.pid ?? "?"} on ${e.host || "?"}` +
      (e.services && e.services.length ? "\nservices: " + e.services.join(", ") : ""));
    g.appendChild(title);
    g.appendChild(svg("text", { class: "name", x: 12, y: 18 }, e.name));
    g.appendChild(svg("text", { class: "kind", x: NODE_W - 22, y: 17, "text-anchor": "end" },
      kind === "other" ? String(e.kind || "?") : kind));
    if (e.kind === "sed") drawSed(g, e, refNow, isLost);
    else g.appendChild(svg("text", { class: "info", x: 12, y: 36 }, isLost ? "lost" : nodeInfo(e, refNow)));
    if (state.flashing.has(e.name)) g.classList.add("flash");
    nodes.appendChild(g);
  }
  setText("tree-sub", `${elements.length} elements · ${seds} SeDs` + (lost ? ` · ${lost} lost` : ""));
}

function drawSed(g, e, refNow, isLost) {
  const load = e.load || {};
  const running = num(load.num_running) || 0, waiting = num(load.num_waiting) || 0;
  const policy = load.policy || load.queue || (load.server_type ? String(load.server_type) : null);
  const info = svg("text", { class: "info", x: 12, y: 35 });
  info.appendChild(svg("tspan", { class: "run" }, running + " run"));
  info.appendChild(svg("tspan", {}, " · "));
  info.appendChild(svg("tspan", { class: "wait" }, waiting + " wait"));
  info.appendChild(svg("tspan", {}, " · " + (policy ? policy + " · " : "") +
    (isLost ? "lost" : "hb " + fmtAge(num(e.last_heartbeat) !== null ? refNow - e.last_heartbeat : null))));
  g.appendChild(info);
  // running/waiting slots, then the host's free CPU as a meter
  const slots = Math.min(running + waiting, 12);
  for (let i = 0; i < slots; i++)
    g.appendChild(svg("rect", { class: i < running ? "slot-run" : "slot-wait", x: 12 + i * 8, y: 43, width: 6, height: 8, rx: 1 }));
  if (running + waiting > 12)
    g.appendChild(svg("text", { class: "info", x: 12 + 12 * 8 + 2, y: 51 }, "+" + (running + waiting - 12)));
  const cpu = num(load.free_cpu);
  if (cpu !== null) {
    const frac = Math.max(0, Math.min(1, cpu > 1 ? cpu / 100 : cpu));
    const mx = NODE_W - 82;
    g.appendChild(svg("text", { class: "info", x: mx - 4, y: 51, "text-anchor": "end" }, "cpu"));
    g.appendChild(svg("rect", { class: "meter-bg", x: mx, y: 44, width: 70, height: 7, rx: 3 }));
    g.appendChild(svg("rect", { class: "meter-cpu" + (frac < 0.2 ? " low" : ""), x: mx, y: 44,
      width: Math.max(1, 70 * frac), height: 7, rx: 3 }));
    g.appendChild(svg("title", {}, `free CPU ${(frac * 100).toFixed(0)}%`));
  }
}

function flash(name) {
  if (!name) return;
  const old = state.flashing.get(name);
  if (old) clearTimeout(old);
  state.flashing.set(name, setTimeout(() => state.flashing.delete(name), 1000));
  for (const g of document.querySelectorAll("#tree g.node")) {
    if (g.dataset.name === name) {
      g.classList.remove("flash");
      void g.getBBox();      // restart the animation
      g.classList.add("flash");
    }
  }
}

// ---- charts -----------------------------------------------------------------------------
function tickLabel(text) {   // "2.50" -> "2.5", "5.00s" -> "5s", "1.00ms" -> "1ms"
  return text.replace(/(\.\d*?)0+(?=\D*$)/, "$1").replace(/\.(?=\D*$)/, "");
}

function niceMax(v) {
  if (!(v > 0)) return 1;
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= v) return m * p;
  return 10 * p;
}

function drawChart(canvas, t, series, fmt, opts) {
  opts = opts || {};
  const dpr = window.devicePixelRatio || 1;
  const w = canvas.clientWidth, h = canvas.clientHeight;
  if (!w || !h) return;
  if (canvas.width !== Math.round(w * dpr) || canvas.height !== Math.round(h * dpr)) {
    canvas.width = Math.round(w * dpr);
    canvas.height = Math.round(h * dpr);
  }
  const ctx = canvas.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, w, h);
  const L = 52, R = 8, T = 8, B = 20;
  const pw = w - L - R, ph = h - T - B;
  let max = 0, min = Infinity;
  for (const s of series) for (const v of s.values) if (num(v) !== null) { if (v > max) max = v; if (v > 0 && v < min) min = v; }
  // y scale: linear from 0, or logarithmic by decades (latencies span µs to minutes)
  let Y, ticks;
  if (opts.log && max > 0) {
    const lo = Math.floor(Math.log10(Math.min(min, max))), hi = Math.max(lo + 1, Math.ceil(Math.log10(max)));
    Y = (v) => T + ph - (ph * (Math.log10(Math.max(v, Math.pow(10, lo))) - lo)) / (hi - lo);
    ticks = [];
    for (let d = lo; d <= hi; d++) ticks.push(Math.pow(10, d));
  } else {
    max = niceMax(max * 1.1);
    Y = (v) => T + ph - (ph * v) / max;
    ticks = [0, 1, 2, 3, 4].map((i) => (max * i) / 4);
  }
  ctx.font = "11px system-ui, sans-serif";
  ctx.fillStyle = "#8592a3";
  ctx.strokeStyle = "#243041";
  ctx.lineWidth = 1;
  ctx.textAlign = "right";
  ctx.textBaseline = "middle";
  for (const v of ticks) {
    const y = Y(v);
    ctx.beginPath(); ctx.moveTo(L, Math.round(y) + 0.5); ctx.lineTo(L + pw, Math.round(y) + 0.5); ctx.stroke();
    ctx.fillText(tickLabel(fmt(v)), L - 6, y);
  }
  const n = t.length;
  ctx.textAlign = "center";
  ctx.textBaseline = "top";
  if (n > 1) {
    const span = opts.window || t[n - 1] - t[0];
    for (const frac of [0, 0.25, 0.5, 0.75, 1]) {
      const ago = span * (1 - frac);
      ctx.fillText(ago < 1 ? "now" : "-" + fmtAgo(ago), Math.min(Math.max(L + pw * frac, L + 14), L + pw - 14), T + ph + 5);
    }
  }
  const X = (i) => L + (n > 1 ? (pw * i) / (n - 1) : pw);
  for (const s of series) {
    ctx.strokeStyle = s.colour;
    ctx.lineWidth = 1.8;
    ctx.lineJoin = "round";
    ctx.beginPath();
    let pen = false;
    s.values.forEach((v, i) => {
      if (num(v) === null) { pen = false; return; }
      if (!pen) { ctx.moveTo(X(i), Y(v)); pen = true; } else ctx.lineTo(X(i), Y(v));
    });
    ctx.stroke();
    if (s.fill) {   // a soft area under the line
      ctx.globalAlpha = 0.12;
      ctx.fillStyle = s.colour;
      ctx.beginPath();
      ctx.moveTo(X(0), Y(0));
      s.values.forEach((v, i) => ctx.lineTo(X(i), Y(num(v) === null ? 0 : v)));
      ctx.lineTo(X(n - 1), Y(0));
      ctx.closePath();
      ctx.fill();
      ctx.globalAlpha = 1;
    }
    // a dot on the latest known value
    for (let i = s.values.length - 1; i >= 0; i--) {
      if (num(s.values[i]) !== null) {
        ctx.fillStyle = s.colour;
        ctx.beginPath(); ctx.arc(X(i), Y(s.values[i]), 2.5, 0, 2 * Math.PI); ctx.fill();
        break;
      }
    }
  }
}

function renderLegend(id, names) {
  const box = $(id);
  clear(box);
  for (const name of names) {
    const s = el("span", null, name);
    s.style.setProperty("--swatch", colour(name));
    box.appendChild(s);
  }
}

// ---- stats -----------------------------------------------------------------------------
function renderStats() {
  const st = state.stats;
  if (!st) return;
  const services = st.services || {};
  const names = Object.keys(services);
  const t = Array.isArray(st.t) ? st.t : [];
  const bucket = num(st.bucket) || 1;
  for (const n of names) colour(n);
  const rateSeries = names.map((n) => ({ colour: colour(n), fill: names.length <= 3,
    values: ((services[n].series || {}).calls || []).map((c) => (num(c) === null ? null : c / bucket)) }));
  const latSeries = names.map((n) => ({ colour: colour(n), values: (services[n].series || {}).mean || [] }));
  drawChart($("chart-rate"), t, rateSeries, fmtRate, { window: num(st.window) });
  drawChart($("chart-latency"), t, latSeries, fmtSecs, { window: num(st.window), log: true });
  renderLegend("legend-rate", names);
  renderLegend("legend-latency", names);
  setText("rate-sub", `last ${fmtAge(num(st.window) || 0).replace(/m00s$/, " min")} · ${bucket}s buckets`);

  const tbody = $("services").tBodies[0];
  clear(tbody);
  if (!names.length) {
    const tr = el("tr", "empty"); const td = el("td", null, "no calls yet"); td.colSpan = 7; tr.appendChild(td); tbody.appendChild(tr);
  }
  for (const n of names) {
    const s = services[n];
    const tr = el("tr");
    const first = el("td");
    const sw = el("span", "swatch"); sw.style.background = colour(n);
    first.appendChild(sw); first.appendChild(document.createTextNode(n));
    tr.appendChild(first);
    tr.appendChild(el("td", null, fmtRate(s.calls_per_s)));
    tr.appendChild(el("td", null, fmtSecs(s.mean)));
    tr.appendChild(el("td", null, fmtSecs(s.p95)));
    tr.appendChild(el("td", "dim", fmtSecs(s.wait_mean)));
    tr.appendChild(el("td", s.errors ? "bad" : "dim", String(s.errors || 0)));
    const tot = s.total || {};
    tr.appendChild(el("td", null, String(Object.values(tot).reduce((a, b) => a + (num(b) || 0), 0))));
    tbody.appendChild(tr);
  }
  renderUsers(st);
  renderErrors(st.errors || []);
}

function renderUsers(st) {
  const users = st.users || {};
  const tbody = $("users").tBodies[0];
  clear(tbody);
  const names = Object.keys(users);
  if (!names.length) {
    const tr = el("tr", "empty"); const td = el("td", null, "no users yet"); td.colSpan = 8; tr.appendChild(td); tbody.appendChild(tr);
  }
  for (const n of names) {
    const u = users[n];
    const tr = el("tr");
    tr.appendChild(el("td", null, n));
    tr.appendChild(el("td", null, String(u.queued ?? 0)));
    tr.appendChild(el("td", null, String(u.finished ?? 0)));
    tr.appendChild(el("td", u.failed ? "bad" : "dim", String(u.failed ?? 0)));
    tr.appendChild(el("td", (u.killed || u.preempted) ? "bad" : "dim", String((u.killed ?? 0) + (u.preempted ?? 0))));
    tr.appendChild(el("td", "dim", `${u.optional_completed ?? 0}/${u.optional_killed ?? 0}`));
    tr.appendChild(el("td", null, fmtSecs(u.allocated)));
    const td = el("td");
    const sat = num(u.satisfaction);
    if (sat !== null) {
      const bar = el("span", "share" + (sat > 1.25 ? " over" : ""));
      bar.style.width = Math.max(2, Math.round(Math.min(2, sat) * 18)) + "px";
      td.appendChild(bar);
      td.appendChild(document.createTextNode(sat.toFixed(2)));
    } else td.textContent = "–";
    tr.appendChild(td);
    tbody.appendChild(tr);
  }
  setText("users-sub", names.length ? `${names.length} users · unfairness ${num(st.unfairness) === null ? "–" : st.unfairness.toFixed(2)}` : "");
}

function renderErrors(errors) {
  const list = $("errors");
  clear(list);
  if (!errors.length) { list.appendChild(el("li", "empty", "no errors")); return; }
  for (const ev of errors.slice(0, 30)) list.appendChild(eventRow(ev, false));
}

// ---- events -----------------------------------------------------------------------------
function describe(ev) {
  const parts = [];
  if (ev.service) parts.push(ev.service);
  if (ev.user) parts.push("by " + ev.user);
  if (ev.server && ev.server !== ev.element) parts.push("→ " + ev.server);
  if (num(ev.duration) !== null) parts.push(fmtSecs(ev.duration));
  if (ev.optional) parts.push("optional");
  if (ev.detail) parts.push(ev.detail);
  return parts.join(" · ");
}

function eventRow(ev, isNew) {
  const li = el("li", isNew ? "new" : null);
  li.appendChild(el("span", "t", num(ev.time) !== null ? fmtClock(ev.time) : ""));
  li.appendChild(el("span", "k " + String(ev.kind).replace(/[^a-z_]/g, ""), ev.kind));
  li.appendChild(el("span", "el", ev.element));
  li.appendChild(el("span", "msg", describe(ev)));
  if (ev.id) {
    const a = el("span", "idlink", ev.id.length > 14 ? "…" + ev.id.slice(-12) : ev.id);
    a.title = "show this call's story: " + ev.id;
    a.addEventListener("click", () => showStory(ev.id));
    li.appendChild(a);
  }
  return li;
}

function onEvent(ev) {
  const feed = $("feed");
  const empty = feed.querySelector("li.empty");
  if (empty) empty.remove();
  feed.insertBefore(eventRow(ev, true), feed.firstChild);
  while (feed.children.length > FEED_MAX) feed.removeChild(feed.lastChild);
  state.feedCount++;
  setText("feed-sub", `${state.feedCount} received` + (state.dropped ? ` · ${state.dropped} dropped` : ""));
  flash(ev.element);
  if (ev.server && ev.server !== ev.element) flash(ev.server);
  scheduleStats();
}

function connectEvents() {
  const es = new EventSource("/api/events?replay=40");
  es.onopen = () => { state.streamOk = true; updateConn(); };
  es.onerror = () => { state.streamOk = false; updateConn(); };   // EventSource reconnects by itself
  es.onmessage = (m) => {
    let ev;
    try { ev = JSON.parse(m.data); } catch (e) { return; }
    if (ev && typeof ev === "object" && typeof ev.kind === "string") onEvent(ev);
  };
  es.addEventListener("dropped", (m) => {
    try { state.dropped += JSON.parse(m.data).dropped || 0; } catch (e) { /* ignore */ }
    setText("feed-sub", `${state.feedCount} received · ${state.dropped} dropped (slow connection)`);
  });
  es.addEventListener("gap", () => {
    const feed = $("feed");
    feed.insertBefore(el("li", "note", "… some events were missed while disconnected"), feed.firstChild);
  });
}

// ---- a call's story -------------------------------------------------------------------------
async function showStory(id) {
  const panel = $("story");
  setText("story-id", id);
  const sum = $("story-summary"), list = $("story-events");
  clear(sum); clear(list);
  panel.hidden = false;
  try {
    const data = await getJSON("/api/events/" + encodeURIComponent(id));
    const s = data.summary || {};
    const rows = [["state", s.state], ["service", s.service], ["user", s.user], ["server", s.server || s.chosen],
                  ["waited", num(s.wait) !== null ? fmtSecs(s.wait) : null], ["ran", num(s.run) !== null ? fmtSecs(s.run) : null],
                  ["error", s.error]];
    for (const [k, v] of rows) {
      if (v === undefined || v === null) continue;
      sum.appendChild(el("dt", null, k));
      sum.appendChild(el("dd", null, v));
    }
    for (const ev of data.events || []) {
      const li = el("li");
      li.appendChild(el("span", "t", fmtClock(ev.time) + " "));
      li.appendChild(el("span", "k " + String(ev.kind).replace(/[^a-z_]/g, ""), ev.kind));
      li.appendChild(document.createTextNode(" " + ev.element + " " + describe(ev)));
      list.appendChild(li);
    }
  } catch (e) {
    list.appendChild(el("li", "note", "no story for this id (forgotten or unknown)"));
  }
}

// ---- start ----------------------------------------------------------------------------------
document.addEventListener("DOMContentLoaded", () => {
  $("story-close").addEventListener("click", () => { $("story").hidden = true; });
  window.addEventListener("resize", () => renderStats());
  pollTree();
  pollStats();
  connectEvents();
});
