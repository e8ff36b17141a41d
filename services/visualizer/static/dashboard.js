// Spreeze dashboard: live charts on <canvas>, the health table, the event timeline and the
// newest evaluation video, fed by Server-Sent Events from /api/stream (see web.py).
"use strict";

// chart id -> [title, x axis]; a series "<chart>:<label>" of an unknown chart gets its own chart.
const CHARTS = {
  eval_steps: ["Evaluation return vs env steps", "env steps"],
  eval_time: ["Evaluation return vs wall-clock", "seconds"],
  losses: ["Losses", "updates"],
  sampling: ["Sampling rate (env steps/s)", "seconds"],
  updates: ["Update frame rate (transitions/s)", "seconds"],
  utd: ["Update-to-data ratio", "seconds"],
  lag: ["Policy lag (updates)", "seconds"],
  replay: ["Replay fill (fraction of capacity)", "seconds"],
  stalls: ["Rate-limiter stalls (cumulative seconds)", "seconds"],
  train_return: ["Training episode return", "seconds"],
  sparsity: ["Sparsity and training FLOPs ratio", "updates"],
  topology: ["Topology adaptations", "updates"],
};
const OPTIONAL = new Set(["train_return", "sparsity", "topology"]);  // hidden until they hold data
const COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#be185d", "#4d7c0f"];

const series = {};   // "<chart>:<label>" -> [[x, y(, std)], ...]
const events = [];   // every event row so far, oldest first (also marked on the time charts)
const charts = {};   // chart id -> {section, canvas, dirty}

function chartOf(id) {
  if (charts[id]) return charts[id];
  const [title, xLabel] = CHARTS[id] || [id, ""];
  const section = document.createElement("section");
  section.id = "chart-" + id;
  section.innerHTML = `<h2></h2><canvas class="chart" data-chart="${id}" data-points="0"></canvas>`
    + `<div class="empty">no data yet</div>`;
  section.querySelector("h2").textContent = title;
  section.hidden = OPTIONAL.has(id);
  document.getElementById("charts").appendChild(section);
  charts[id] = {section, canvas: section.querySelector("canvas"), xLabel, dirty: true};
  return charts[id];
}

function niceTicks(lo, hi, n) {
  const span = hi - lo || Math.abs(hi) || 1;
  const step0 = span / n, mag = Math.pow(10, Math.floor(Math.log10(step0)));
  const step = [1, 2, 5, 10].map(m => m * mag).find(s => s >= step0);
  const out = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(v);
  return out;
}

function fmt(v) {
  const a = Math.abs(v);
  if (a >= 1e6) return (v / 1e6).toFixed(1) + "M";
  if (a >= 1e4) return (v / 1e3).toFixed(0) + "k";
  if (a >= 100 || v === 0) return v.toFixed(0);
  return a >= 1 ? v.toFixed(1) : v.toPrecision(2);
}

function draw(id) {
  const c = charts[id];
  const names = Object.keys(series).filter(n => n.startsWith(id + ":")).sort();
  const total = names.reduce((s, n) => s + series[n].length, 0);
  c.canvas.dataset.points = total;
  c.section.querySelector(".empty").hidden = total > 0;
  if (total > 0) c.section.hidden = false;
  const dpr = window.devicePixelRatio || 1, w = c.canvas.clientWidth, h = c.canvas.clientHeight;
  if (!w || !h) return;
  c.canvas.width = w * dpr; c.canvas.height = h * dpr;
  const g = c.canvas.getContext("2d");
  g.setTransform(dpr, 0, 0, dpr, 0, 0);
  g.clearRect(0, 0, w, h);
  if (!total) return;
  let x0 = Infinity, x1 = -Infinity, y0 = Infinity, y1 = -Infinity;
  for (const n of names) for (const p of series[n]) {
    const s = p.length > 2 ? p[2] : 0;
    x0 = Math.min(x0, p[0]); x1 = Math.max(x1, p[0]);
    y0 = Math.min(y0, p[1] - s); y1 = Math.max(y1, p[1] + s);
  }
  if (x1 === x0) { x0 -= 1; x1 += 1; }
  if (y1 === y0) { y0 -= Math.abs(y0) * 0.1 || 1; y1 += Math.abs(y1) * 0.1 || 1; }
  const L = 52, R = 10, T = 8 + 14 * Math.ceil(names.length / 3), B = 30;
  const X = x => L + (x - x0) / (x1 - x0) * (w - L - R);
  const Y = y => h - B - (y - y0) / (y1 - y0) * (h - T - B);
  g.font = "11px system-ui, sans-serif"; g.strokeStyle = "#e5e7eb"; g.fillStyle = "#6b7280"; g.lineWidth = 1;
  for (const v of niceTicks(y0, y1, 5)) {
    g.beginPath(); g.moveTo(L, Y(v)); g.lineTo(w - R, Y(v)); g.stroke();
    g.textAlign = "right"; g.fillText(fmt(v), L - 4, Y(v) + 4);
  }
  for (const v of niceTicks(x0, x1, 6)) {
    g.textAlign = "center"; g.fillText(fmt(v), X(v), h - B + 14);
  }
  g.fillText(c.xLabel, (L + w - R) / 2, h - 3);
  if (c.xLabel === "seconds") {  // the timeline of decisions and events, on every time axis
    g.strokeStyle = "#f59e0b"; g.setLineDash([3, 3]);
    for (const e of events) if (e.wall_time >= x0 && e.wall_time <= x1) {
      g.beginPath(); g.moveTo(X(e.wall_time), T); g.lineTo(X(e.wall_time), h - B); g.stroke();
    }
    g.setLineDash([]);
  }
  names.forEach((n, i) => {
    const pts = series[n], color = COLORS[i % COLORS.length];
    if (pts[0].length > 2) {  // mean ± std band
      g.fillStyle = color + "22"; g.beginPath();
      pts.forEach((p, j) => (j ? g.lineTo : g.moveTo).call(g, X(p[0]), Y(p[1] + p[2])));
      for (let j = pts.length - 1; j >= 0; j--) g.lineTo(X(pts[j][0]), Y(pts[j][1] - pts[j][2]));
      g.fill();
    }
    g.strokeStyle = color; g.lineWidth = 1.6; g.beginPath();
    pts.forEach((p, j) => (j ? g.lineTo : g.moveTo).call(g, X(p[0]), Y(p[1])));
    g.stroke();
    if (pts.length === 1) { g.fillStyle = color; g.fillRect(X(pts[0][0]) - 2, Y(pts[0][1]) - 2, 4, 4); }
    const lx = L + (i % 3) * ((w - L - R) / 3), ly = 10 + 14 * Math.floor(i / 3);
    g.fillStyle = color; g.fillRect(lx, ly - 7, 10, 3);
    g.fillStyle = "#374151"; g.textAlign = "left";
    g.fillText(n.slice(id.length + 1) + " " + fmt(pts[pts.length - 1][1]), lx + 14, ly - 2);
  });
}

function age(s) { return s === null || s === undefined ? "-" : s.toFixed(1) + " s ago"; }

function renderHealth(rows) {
  const body = document.querySelector("#health tbody");
  body.replaceChildren(...rows.map(r => {
    const tr = document.createElement("tr");
    tr.dataset.service = r.service;
    const state = r.note ? `${r.state} · ${r.note}` : r.state;  // a learner's: compiling / compiled / eager
    const cells = [r.service, r.role, r.alive ? "● alive" : "✖ dead", state, r.pid ?? "-", r.restarts,
                   age(r.heartbeat_age_s), age(r.metrics_age_s)];
    cells.forEach((v, i) => {
      const td = document.createElement("td");
      td.textContent = v;
      if (i === 2) td.className = r.alive ? "alive" : "dead";
      tr.appendChild(td);
    });
    return tr;
  }));
}

function addEvents(rows) {
  const list = document.getElementById("events");
  for (const e of rows) {
    events.push(e);
    const li = document.createElement("li");
    li.className = "event";
    li.dataset.kind = e.event;
    li.innerHTML = `<span class="t"></span><span class="kind"></span><span class="reason"></span>`;
    li.querySelector(".t").textContent = (e.wall_time ?? 0).toFixed(0) + " s";
    li.querySelector(".kind").textContent = e.event;
    li.querySelector(".reason").textContent = e.reason;
    list.prepend(li);  // newest first
  }
  document.getElementById("no-events").hidden = list.children.length > 0;
}

function renderVideo(v) {
  const el = document.getElementById("video");
  if (v.url && el.dataset.src !== v.url) {
    el.dataset.src = v.url; el.src = v.url; el.hidden = false;
    document.getElementById("video-name").textContent = v.name;
  }
  const note = document.getElementById("video-note");
  note.textContent = v.note || (v.url ? "" : "no video yet");
}

function apply(update) {
  if (update.reset) {
    for (const k of Object.keys(series)) delete series[k];
    events.length = 0;
    document.getElementById("events").replaceChildren();
    for (const c of Object.values(charts)) c.dirty = true;
  }
  for (const [name, pts] of Object.entries(update.points)) {
    (series[name] = series[name] || []).push(...pts);
    chartOf(name.split(":")[0]).dirty = true;
  }
  addEvents(update.events);
  if (update.events.length) for (const c of Object.values(charts)) if (c.xLabel === "seconds") c.dirty = true;
  renderHealth(update.health);
  renderVideo(update.video);
  for (const [id, c] of Object.entries(charts)) if (c.dirty) { draw(id); c.dirty = false; }
  document.getElementById("status").textContent = `live · run time ${update.wall_time.toFixed(0)} s`;
}

Object.keys(CHARTS).forEach(chartOf);
const stream = new EventSource("/api/stream");
stream.onmessage = m => apply(JSON.parse(m.data));
stream.onerror = () => { document.getElementById("status").textContent = "disconnected: retrying…"; };
window.addEventListener("resize", () => Object.keys(charts).forEach(draw));
