// taskgraph view: the browser side of the run widget and of the HTML report.
//
// One dependency-free ES module, two hosts (see PROTOCOL.md next to this file):
//   * anywidget calls `render({model, el})`: `model.get("state")` is the small state
//     dict (replaced whole on every update), custom messages `{"kind": "events"}`
//     append task and message rows, `{"kind": "reset"}` clears them. At start the view
//     asks Python for everything so far with `model.send({kind: "replay"})`.
//   * the HTML report calls `renderStatic(el, {state, events})`, which wraps the data
//     in a tiny fake model and calls the same `render`, so both show the same views.
// Styles live in view.css (anywidget `_css`; inlined by the report); every class is
// prefixed `tg-` and scoped under the root `.tg-view`.
//
// What is drawn (top to bottom):
//   header      title, status badge, progress bar, `.tg-percent`, done/total, rate,
//               elapsed, ETA, per-kernel table; `.tg-error` when failed.
//   timeline    DOM lane labels (`.tg-lane`, data-rank/data-worker) beside a
//               `<canvas class="tg-timeline">`: one lane per `state.lanes` entry, bars
//               coloured by kernel (failed: black with red outline), critical-path
//               tasks outlined in gold and joined by a gold line, messages as thin
//               arrows from (posted, sender's first lane) to (done, receiver's first
//               lane); legend and a `.tg-critical` caption below. Dynamic runs: spawned
//               calls in the lower part of their lane (over the waiting task), steals
//               as purple arrows from (requested, victim's first lane) to (arrived,
//               thief's first lane); the canvas's data-steals / data-spawned count
//               what is drawn.
//   matrix      `<table class="tg-matrix">` bytes/messages sent, row = sender,
//               column = receiver, heat-shaded; cells with bytes > 0 are `.tg-nonzero`.
//   utilisation per rank a stacked `.tg-util` bar: compute / comm wait / stealing / idle /
//   overhead.
//
// Timeline data and speed (20,000+ tasks): task rows go into growable typed arrays
// (start, end, kernel, id, state, lane; labels in a plain array). Each lane keeps the
// indices of its tasks sorted by start (Int32Array) plus a parallel Float64Array of
// starts and the longest duration seen in the lane. A batch of events is appended,
// then each touched lane is re-sorted once (only when the batch broke the order).
// Drawing asks each lane for the visible window with a binary search (first start >=
// x0 - maxDuration) and walks until start > x1; runs of sub-pixel bars are merged so a
// lane costs at most about one fillRect per pixel column. Redraws are coalesced with
// requestAnimationFrame (at most one per frame). Hover hit-testing is the same binary
// search around the cursor time (+-3 px) in the lane under the cursor.
// Zoom: the wheel scales the x window around the cursor time; dragging pans; double
// click resets to the automatic window [0, max(makespan, latest end seen)], which
// follows the run while it grows. y never zooms.

const PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948",
  "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac", "#17becf", "#8c564b"];
const FAILED_FILL = "#111111", FAILED_LINE = "#e00000", CRIT_LINE = "#d4a000";
const STEAL_LINE = "#8250df"; // steals: victim's lane -> thief's lane
const SPAWN_TOP = 0.4; // spawned calls fill the lower part of a lane, under their parent task
const AXIS_H = 22; // px of time axis above the lanes
const SEGMENTS = [ // utilisation parts: key, legend text, colour
  ["compute", "compute", "#4e79a7"], ["comm", "waiting on communication", "#f28e2b"],
  ["stealing", "looking for work (stealing)", "#edc948"],
  ["idle", "idle", "#d0d4da"], ["overhead", "runtime overhead", "#b07aa1"]];

// ---------------------------------------------------------------- formatting helpers

function dynamicText(d) { // spawned calls and steals: shown only where a run had them
  if (!d || !(d.spawned || d.steals || d.pushes)) return "";
  // (pushes are drawn as lines too: counted apart, or the header read fewer than drawn)
  return ` · ${d.spawned} spawned · ${d.steals} steals` +
    (d.steals ? ` (median latency ${fmtTime(d.steal_latency_median)})` : "") +
    (d.pushes ? ` · ${d.pushes} pushed` : "");
}

function ensembleText(e) { // managed calls' state counts: shown only where a run had them
  if (!e) return "";
  return ` · ${e.pending} pending · ${e.running == null ? "?" : e.running} running · ${e.done} done` +
    ` · ${e.failed} failed · ${e.skipped} skipped · ${e.retries} retries`;
}

function fmtTime(s, digits = 2) { // digits: decimals of seconds (more for exact times)
  if (s == null || !isFinite(s)) return "—";
  const a = Math.abs(s);
  if (a === 0) return "0 s";
  if (a < 1e-3) return (s * 1e6).toFixed(Math.max(0, digits - 2)) + " µs";
  if (a < 0.1) return (s * 1e3).toFixed(digits - 1) + " ms";
  if (a < 60) return s.toFixed(digits) + " s";
  if (a < 3600) return Math.floor(s / 60) + "m " + String(Math.floor(s % 60)).padStart(2, "0") + "s";
  return Math.floor(s / 3600) + "h " + String(Math.floor((s % 3600) / 60)).padStart(2, "0") + "m";
}

function fmtBytes(b) {
  if (!b) return "0 B";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (b >= 1024 && i < units.length - 1) { b /= 1024; i++; }
  return (i === 0 ? String(Math.round(b)) : b < 100 ? b.toFixed(1) : b.toFixed(0)) + " " + units[i];
}

function percentText(p, status) {
  const done = p.done || 0, total = p.total || 0;
  if (total > 0) return (done >= total ? 100 : Math.floor((100 * done) / total)) + "%";
  return status === "done" || status === "empty" ? "100%" : "0%";
}

function kernelColour(k) { return PALETTE[((k % PALETTE.length) + PALETTE.length) % PALETTE.length]; }

function h(tag, cls, text) { // tiny element factory
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text != null) e.textContent = text;
  return e;
}

function niceStep(raw) {
  const p = Math.pow(10, Math.floor(Math.log10(raw))), m = raw / p;
  return (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * p;
}

function tickLabel(t, step) {
  if (step < 1e-3) return (t * 1e3).toFixed(Math.max(0, Math.ceil(-Math.log10(step * 1e3) - 1e-9))) + " ms";
  return t.toFixed(Math.max(0, Math.ceil(-Math.log10(step) - 1e-9))) + " s";
}

// first index i in a[0..n) with a[i] >= x
function lowerBound(a, n, x) {
  let lo = 0, hi = n;
  while (lo < hi) { const mid = (lo + hi) >> 1; if (a[mid] < x) lo = mid + 1; else hi = mid; }
  return lo;
}

function grow(arr, need) {
  if (need <= arr.length) return arr;
  const out = new arr.constructor(Math.max(need, arr.length * 2, 1024));
  out.set(arr);
  return out;
}

// ---------------------------------------------------------------- event store

class Store {
  constructor() { this.clear(); }

  clear() {
    this.n = 0;
    this.start = new Float64Array(1024); this.end = new Float64Array(1024);
    this.kern = new Int32Array(1024); this.tid = new Int32Array(1024);
    this.st = new Uint8Array(1024); this.laneOf = new Int32Array(1024);
    this.labels = [];
    this.lanes = []; // {idx: Int32Array, s: Float64Array, n, maxDur}
    this.byId = new Map(); // task id -> row
    this.maxEnd = 0;
    this.msgs = []; // flat: src, dst, t0, t1, bytes, ...
    this.steals = []; // flat: thief, victim, requested, arrived, ...
    this.stealNames = [];
  }

  lane(i) {
    while (this.lanes.length <= i) this.lanes.push({ idx: new Int32Array(256), s: new Float64Array(256), n: 0, maxDur: 0 });
    return this.lanes[i];
  }

  add(msg) {
    this.addRows(msg.tasks || []);
    for (const m of msg.messages || []) {
      this.msgs.push(m[0], m[1], m[2], m[3], m[4]);
      if (m[3] > this.maxEnd) this.maxEnd = m[3];
    }
    for (const [thief, victim, name, req, arr] of msg.steals || []) {
      this.steals.push(thief, victim, req, arr);
      this.stealNames.push(name);
      if (arr > this.maxEnd) this.maxEnd = arr;
    }
  }

  // bars [lane, start, end, colour index, task id (-1: none), state, label]
  addRows(tasks) {
    const touched = new Set();
    const need = this.n + tasks.length;
    for (const k of ["start", "end", "kern", "tid", "st", "laneOf"]) this[k] = grow(this[k], need);
    for (const row of tasks) {
      const [lane, s, e, k, id, state, label] = row, i = this.n++;
      this.start[i] = s; this.end[i] = e; this.kern[i] = k; this.tid[i] = id;
      this.st[i] = state; this.laneOf[i] = lane; this.labels[i] = label;
      if (id >= 0) this.byId.set(id, i);
      if (e > this.maxEnd) this.maxEnd = e;
      const L = this.lane(lane);
      if (L.n + 1 > L.idx.length) { L.idx = grow(L.idx, L.n + 1); L.s = grow(L.s, L.n + 1); }
      if (L.n > 0 && s < L.s[L.n - 1]) touched.add(L);
      L.idx[L.n] = i; L.s[L.n] = s; L.n++;
      if (e - s > L.maxDur) L.maxDur = e - s;
    }
    const S = this.start;
    for (const L of touched) { // the batch broke the order: sort once per batch
      const idx = L.idx.subarray(0, L.n).sort((a, b) => S[a] - S[b]);
      for (let j = 0; j < L.n; j++) L.s[j] = S[idx[j]];
    }
  }
}

// Paint the bars of `st` visible in [x0, x1]: per lane, the window by binary search,
// sub-pixel runs merged; `top`/`bh`: the bars' offset in a lane and height; `crit`
// (or null) collects critical-path rows; `edge`: a white line above each bar (spawned
// calls, drawn over their parent). Returns how many rows were in the window.
function paintBars(ctx, st, g, top, bh, crit, critSet, edge) {
  const { x0, x1, sc, W, laneH } = g;
  const S = st.start, E = st.end, K = st.kern, ST = st.st, failed = [];
  const buckets = PALETTE.map(() => []); // rects (x, y, w) per colour: one fillStyle each
  let shown = 0;
  for (let li = 0; li < st.lanes.length; li++) {
    const L = st.lanes[li], y = AXIS_H + li * laneH + top;
    let j = lowerBound(L.s, L.n, x0 - L.maxDur);
    let rx0 = 0, rx1 = -1, rc = -1; // the pending run
    for (; j < L.n; j++) {
      const i = L.idx[j];
      if (S[i] > x1) break;
      if (E[i] < x0) continue;
      shown++;
      if (crit && critSet.size && critSet.has(st.tid[i])) crit.push(i);
      if (ST[i] === 2) { failed.push(i); continue; }
      let a = (S[i] - x0) * sc, b = (E[i] - x0) * sc;
      if (a < 0) a = 0;
      if (b > W) b = W;
      const c = K[i] % PALETTE.length, narrow = b - a < 2;
      if (c === rc && a <= rx1 + 0.75 && (narrow || rx1 - rx0 < 2)) { if (b > rx1) rx1 = b; continue; }
      if (b - a < 1 && b <= Math.ceil(rx1)) continue; // its pixel is already painted
      if (rc >= 0) buckets[rc].push(rx0, y, rx1 - rx0);
      rx0 = a; rc = c;
      rx1 = b - a >= 3 ? b - 1 : b; // a 1 px gap between wide neighbours
    }
    if (rc >= 0) buckets[rc].push(rx0, y, rx1 - rx0);
  }
  buckets.forEach((rects, c) => {
    for (let r = 0; r < rects.length; r += 3) {
      const w = Math.max(1, rects[r + 2]);
      if (edge) { ctx.fillStyle = "#ffffff"; ctx.fillRect(rects[r], rects[r + 1] - 1, w, 1); }
      ctx.fillStyle = PALETTE[c]; ctx.fillRect(rects[r], rects[r + 1], w, bh);
    }
  });
  for (const i of failed) {
    const y = AXIS_H + st.laneOf[i] * laneH + top;
    const a = (S[i] - x0) * sc, w = Math.max(3, (E[i] - S[i]) * sc);
    ctx.fillStyle = FAILED_FILL; ctx.fillRect(a, y, w, bh);
    ctx.strokeStyle = FAILED_LINE; ctx.lineWidth = 1.5; ctx.strokeRect(a + 0.75, y + 0.75, w - 1.5, bh - 1.5);
  }
  return shown;
}

function arrow(ctx, ax, ay, bx, by) { // a line with its head at (bx, by), into the current path
  ctx.moveTo(ax, ay); ctx.lineTo(bx, by);
  const dx = bx - ax, dy = by - ay, len = Math.hypot(dx, dy);
  if (len > 10) {
    const ux = dx / len, uy = dy / len;
    ctx.moveTo(bx - 6 * ux - 3 * uy, by - 6 * uy + 3 * ux); ctx.lineTo(bx, by);
    ctx.lineTo(bx - 6 * ux + 3 * uy, by - 6 * uy - 3 * ux);
  }
}

function segDist(px, py, [ax, ay, bx, by]) { // pixels from (px, py) to a segment
  const dx = bx - ax, dy = by - ay, l2 = dx * dx + dy * dy;
  const t = l2 > 0 ? Math.max(0, Math.min(1, ((px - ax) * dx + (py - ay) * dy) / l2)) : 0;
  return Math.hypot(px - ax - t * dx, py - ay - t * dy);
}

// ---------------------------------------------------------------- the view

function render({ model, el }) {
  let state = model.get("state") || {};
  const store = new Store();
  const spawns = new Store(); // spawned calls: bars in the lower part of their lane
  const spawnKinds = new Map(); // a spawned function's name -> its colour after the kernels'
  let view = null; // null: automatic x window; else {x0, x1} seconds
  let laneH = 22, width = 600, frame = null, lanesKey = "", showMsgs = true;
  let critSet = new Set();
  let hoverPx = null; // {x, y} of the mouse over the canvas
  const cleanups = [];

  el.classList.add("tg-view");
  el.textContent = "";
  // header
  const header = h("div", "tg-header");
  const titleRow = h("div", "tg-title-row");
  const title = h("span", "tg-title"), badge = h("span", "tg-badge");
  titleRow.append(title, badge);
  const progRow = h("div", "tg-progress-row");
  const bar = h("div", "tg-bar"), barFill = h("div", "tg-bar-fill");
  bar.append(barFill);
  const pct = h("span", "tg-percent"), counts = h("span", "tg-counts");
  progRow.append(bar, pct, counts);
  const stats = h("div", "tg-stats"), errorBox = h("div", "tg-error"), emptyBox = h("div", "tg-empty");
  const kernTable = h("table", "tg-kernels");
  header.append(titleRow, progRow, stats, errorBox, emptyBox, kernTable);
  // timeline
  const tlSection = h("div", "tg-section");
  const tlHead = h("div", "tg-h", "Timeline");
  const tlHint = h("span", "tg-hint", "wheel: zoom · drag: pan · double-click: reset");
  tlHead.append(tlHint);
  const tlBody = h("div", "tg-timeline-body");
  const laneCol = h("div", "tg-lanes");
  const canvasWrap = h("div", "tg-canvas-wrap");
  const canvas = h("canvas", "tg-timeline");
  const tooltip = h("div", "tg-tooltip");
  canvasWrap.append(canvas, tooltip);
  tlBody.append(laneCol, canvasWrap);
  const legend = h("div", "tg-legend"), critCaption = h("div", "tg-critical");
  tlSection.append(tlHead, tlBody, legend, critCaption);
  // matrix and utilisation
  const mxSection = h("div", "tg-section");
  const mxHead = h("div", "tg-h", "Communication");
  mxHead.append(h("span", "tg-hint", "bytes sent · row = sender, column = receiver"));
  const mxWrap = h("div", "tg-matrix-wrap");
  mxSection.append(mxHead, mxWrap);
  const utSection = h("div", "tg-section");
  const utHead = h("div", "tg-h", "Utilisation");
  utHead.append(h("span", "tg-hint", "per rank, seconds summed over its workers"));
  const utBody = h("div", "tg-util-body"), utLegend = h("div", "tg-legend");
  utSection.append(utHead, utBody, utLegend);
  for (const [, text, colour] of SEGMENTS) utLegend.append(swatch(colour, text));
  el.append(header, tlSection, mxSection, utSection);

  function swatch(colour, text, cls) {
    const item = h("span", "tg-legend-item" + (cls ? " " + cls : ""));
    const box = h("span", "tg-swatch");
    box.style.background = colour;
    item.append(box, document.createTextNode(text));
    return item;
  }

  // ------------------------------------------------------------ cheap DOM parts

  function renderState() {
    const st = state.status || "empty", p = state.progress || {};
    title.textContent = state.title || "taskgraph";
    badge.textContent = st;
    badge.className = "tg-badge tg-status-" + st;
    const ptext = percentText(p, st);
    pct.textContent = ptext;
    barFill.style.width = ptext;
    barFill.className = "tg-bar-fill tg-status-" + st;
    counts.textContent = `${p.done || 0} / ${p.total || 0} tasks`;
    // compiling kernels happens before the run: shown apart, never in "elapsed"
    stats.textContent = `${(p.rate || 0).toFixed(1)} tasks/s · elapsed ${fmtTime(p.elapsed || 0)}` +
      (p.compile > 0 ? ` (+ ${fmtTime(p.compile)} compiling kernels before)` : "") +
      ` · ETA ${p.eta == null ? "—" : fmtTime(p.eta)}` + dynamicText(state.dynamic) +
      ensembleText(state.ensemble);
    errorBox.textContent = st === "failed" ? (state.error || "failed") : "";
    errorBox.style.display = st === "failed" ? "" : "none";
    emptyBox.textContent = st === "empty" ? "empty graph: nothing to run" : "";
    emptyBox.style.display = st === "empty" ? "" : "none";
    for (const sec of [tlSection, mxSection, utSection]) sec.style.display = st === "empty" ? "none" : "";
    renderKernels(p.kernels || []);
    renderLanes();
    renderLegend();
    renderCritical();
    renderMatrix();
    renderUtil();
    schedule();
  }

  function renderKernels(ks) {
    kernTable.textContent = "";
    if (!ks.length) return;
    const head = h("tr");
    for (const t of ["kernel", "done", "seconds"]) head.append(h("th", null, t));
    kernTable.append(head);
    const names = state.kernels || [];
    ks.forEach((k, i) => {
      const tr = h("tr"), name = h("td");
      const j = names.indexOf(k.name);
      name.append(swatch(kernelColour(j >= 0 ? j : i), k.name));
      tr.append(name, h("td", null, `${k.done} / ${k.total}`), h("td", null, fmtTime(k.seconds || 0)));
      kernTable.append(tr);
    });
  }

  function laneList() { // state lanes, plus any lane that events name beyond them
    const lanes = (state.lanes || []).slice();
    const n = Math.max(store.lanes.length, spawns.lanes.length);
    for (let i = lanes.length; i < n; i++) lanes.push({ rank: -1, worker: -1, label: "lane " + i });
    return lanes;
  }

  function spawnRows(rows) { // [lane, start, end, state, name] -> bars, coloured by function
    const base = (state.kernels || []).length;
    return rows.map(([lane, s, e, st, name]) => {
      const fn = String(name).split("(")[0];
      if (!spawnKinds.has(fn)) spawnKinds.set(fn, spawnKinds.size);
      return [lane, s, e, base + spawnKinds.get(fn), -1, st, name];
    });
  }

  function renderLanes() {
    const lanes = laneList(), key = JSON.stringify(lanes);
    const nl = Math.max(1, lanes.length);
    laneH = nl <= 8 ? 26 : nl <= 12 ? 22 : nl <= 32 ? 16 : nl <= 96 ? 11 : 7;
    if (key === lanesKey) return;
    lanesKey = key;
    laneCol.textContent = "";
    laneCol.style.paddingTop = AXIS_H + "px";
    lanes.forEach((ln, i) => {
      const d = h("div", ln.rank >= 0 ? "tg-lane" : "tg-lane-extra", ln.label);
      d.dataset.rank = ln.rank; d.dataset.worker = ln.worker;
      d.style.height = d.style.lineHeight = laneH + "px";
      d.style.fontSize = Math.min(12, laneH - 2) + "px";
      if (i > 0 && lanes[i - 1].rank !== ln.rank) d.classList.add("tg-rank-start");
      d.title = ln.label;
      laneCol.append(d);
    });
    resize();
  }

  function renderLegend() {
    legend.textContent = "";
    (state.kernels || []).forEach((k, i) => legend.append(swatch(kernelColour(i), k)));
    const f = swatch(FAILED_FILL, "failed");
    f.firstChild.style.outline = "2px solid " + FAILED_LINE;
    const c = swatch("transparent", "critical path");
    c.firstChild.style.outline = "2px solid " + CRIT_LINE;
    const m = h("label", "tg-legend-item tg-msg-toggle");
    const cb = h("input");
    cb.type = "checkbox"; cb.checked = showMsgs;
    cb.onchange = () => { showMsgs = cb.checked; schedule(); };
    m.append(cb, document.createTextNode("messages"));
    legend.append(f, c, m);
    const base = (state.kernels || []).length;
    for (const [fn, j] of spawnKinds) { // only where a run spawned calls
      const sp = swatch(kernelColour(base + j), fn + " (spawned)", "tg-legend-spawned");
      sp.firstChild.style.height = "6px";
      legend.append(sp);
    }
    if (store.steals.length) {
      const st = swatch(STEAL_LINE, "steal (victim → thief)", "tg-legend-steal");
      st.firstChild.style.height = "2px";
      legend.append(st);
    }
  }

  function renderCritical() {
    const c = state.critical || {};
    critSet = new Set(c.tasks || []);
    if (!critSet.size || !(c.makespan > 0)) { critCaption.textContent = ""; critCaption.style.display = "none"; return; }
    critCaption.style.display = "";
    critCaption.textContent = `critical path ${fmtTime(c.length)} of makespan ${fmtTime(c.makespan)}` +
      ` (${Math.round((100 * c.length) / c.makespan)}%)`;
  }

  function renderMatrix() {
    const mx = state.matrix || {}, B = mx.bytes || [], M = mx.messages || [];
    const n = Math.max(B.length, M.length, (state.util || []).length);
    let max = 0;
    for (const row of B) for (const b of row) if (b > max) max = b;
    const table = h("table", "tg-matrix"), head = h("tr");
    head.append(h("th", null, "from \\ to"));
    for (let j = 0; j < n; j++) head.append(h("th", null, "rank " + j));
    table.append(head);
    for (let i = 0; i < n; i++) {
      const tr = h("tr");
      tr.append(h("th", null, "rank " + i));
      for (let j = 0; j < n; j++) {
        const b = (B[i] && B[i][j]) || 0, m = (M[i] && M[i][j]) || 0, td = h("td");
        if (b > 0 || m > 0) {
          td.append(h("div", "tg-bytes", fmtBytes(b)), h("div", "tg-count", m + (m === 1 ? " msg" : " msgs")));
          const a = max > 0 ? 0.08 + 0.8 * Math.sqrt(b / max) : 0.08;
          td.style.background = `rgba(37, 99, 235, ${a.toFixed(3)})`;
          if (a > 0.55) td.style.color = "#fff";
          td.title = `rank ${i} → rank ${j}: ${b} bytes in ${m} messages`;
          if (b > 0) td.classList.add("tg-nonzero");
        } else td.textContent = "·";
        tr.append(td);
      }
      table.append(tr);
    }
    mxWrap.textContent = "";
    if (n) mxWrap.append(table);
  }

  function renderUtil() {
    utBody.textContent = "";
    for (const u of state.util || []) {
      const row = h("div", "tg-util-row"), bar = h("div", "tg-util");
      bar.dataset.rank = u.rank;
      const wall = u.wall || SEGMENTS.reduce((a, [k]) => a + (u[k] || 0), 0);
      for (const [k, text, colour] of SEGMENTS) {
        const v = u[k] || 0, p = wall > 0 ? (100 * v) / wall : 0;
        const seg = h("div", "tg-seg tg-seg-" + k);
        seg.style.width = p + "%"; seg.style.background = colour;
        seg.title = `rank ${u.rank} ${text}: ${fmtTime(v)} (${p.toFixed(1)}%)`;
        bar.append(seg);
      }
      const cp = wall > 0 ? (100 * (u.compute || 0)) / wall : 0;
      row.append(h("span", "tg-util-label", "rank " + u.rank), bar,
        h("span", "tg-util-text", `${cp.toFixed(0)}% compute of ${fmtTime(wall)}`));
      utBody.append(row);
    }
  }

  // ------------------------------------------------------------ canvas timeline

  function extent() { return Math.max(state.makespan || 0, store.maxEnd, spawns.maxEnd, 1e-9); }
  function win() {
    if (view) return view;
    const e = extent();
    return { x0: 0, x1: e > 1e-9 ? e * 1.01 : 1 };
  }
  function nLanes() { return Math.max(1, (state.lanes || []).length, store.lanes.length, spawns.lanes.length); }

  function resize() {
    const w = Math.max(100, Math.floor(canvasWrap.clientWidth || 600));
    const hgt = AXIS_H + nLanes() * laneH + 4, dpr = window.devicePixelRatio || 1;
    width = w;
    canvas.style.width = w + "px"; canvas.style.height = hgt + "px";
    const W = Math.round(w * dpr), H = Math.round(hgt * dpr);
    if (canvas.width !== W || canvas.height !== H) { canvas.width = W; canvas.height = H; }
    schedule();
  }

  const raf = (f) => (typeof requestAnimationFrame === "function" && !document.hidden
    ? { a: requestAnimationFrame(f) } : { t: setTimeout(f, 16) });
  function schedule() {
    if (frame) return;
    frame = raf(() => { frame = null; draw(); });
  }

  function firstLaneOfRank() {
    const m = new Map();
    (state.lanes || []).forEach((ln, i) => { if (!m.has(ln.rank)) m.set(ln.rank, i); });
    return m;
  }

  function spawnTop(bh) { return Math.round(bh * SPAWN_TOP); }

  // the steal at flat index k as [ax, ay, bx, by] px, or null when not in [x0, x1]
  function stealLine(k, first, x0, x1, sc) {
    const T = store.steals, req = T[k + 2], arr = T[k + 3];
    const lt = first.get(T[k]), lv = first.get(T[k + 1]);
    if (arr < x0 || req > x1 || lt === undefined || lv === undefined) return null;
    return [(req - x0) * sc, AXIS_H + (lv + 0.5) * laneH, (arr - x0) * sc, AXIS_H + (lt + 0.5) * laneH];
  }

  function draw() {
    const ctx = canvas.getContext("2d");
    if (!ctx) return;
    const dpr = canvas.width / Math.max(1, width), W = width, nl = nLanes();
    const H = AXIS_H + nl * laneH;
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.fillStyle = "#ffffff"; ctx.fillRect(0, 0, W, H + 4);
    const { x0, x1 } = win(), sc = W / (x1 - x0);
    const lanes = state.lanes || [];
    // rank bands and separators
    for (let i = 0; i < nl; i++) {
      const r = lanes[i] ? lanes[i].rank : -1;
      if (r % 2 === 1) { ctx.fillStyle = "#f4f6f9"; ctx.fillRect(0, AXIS_H + i * laneH, W, laneH); }
      if (i > 0 && lanes[i - 1] && lanes[i - 1].rank !== r) {
        ctx.fillStyle = "#c5cad3"; ctx.fillRect(0, AXIS_H + i * laneH, W, 1);
      }
    }
    // time axis and grid
    const step = niceStep((x1 - x0) / Math.max(2, W / 90));
    ctx.font = "11px system-ui, sans-serif"; ctx.textBaseline = "middle";
    for (let t = Math.ceil(x0 / step) * step; t <= x1; t += step) {
      const x = Math.round((t - x0) * sc) + 0.5;
      ctx.fillStyle = "#e6e8ec"; ctx.fillRect(x, AXIS_H, 1, nl * laneH);
      ctx.fillStyle = "#555b66"; ctx.fillRect(x, AXIS_H - 5, 1, 5);
      ctx.fillText(tickLabel(t, step), x + 3, AXIS_H / 2 - 1);
    }
    ctx.fillStyle = "#9aa1ab"; ctx.fillRect(0, AXIS_H - 1, W, 1);
    // bars: tasks fill their lane, spawned calls its lower part (over their parent task)
    const S = store.start, E = store.end;
    const pad = laneH >= 14 ? 2 : 1, bh = laneH - 2 * pad, crit = [], sub = spawnTop(bh);
    const g = { x0, x1, sc, W, laneH };
    paintBars(ctx, store, g, pad, bh, crit, critSet, false);
    const nSpawned = spawns.n ? paintBars(ctx, spawns, g, pad + sub, bh - sub, null, critSet, true) : 0;
    // critical path: gold outlines, joined end -> start in path order
    if (crit.length) {
      ctx.strokeStyle = CRIT_LINE; ctx.lineWidth = 2;
      for (const i of crit) {
        const y = AXIS_H + store.laneOf[i] * laneH + pad;
        const a = (S[i] - x0) * sc, w = Math.max(2, (E[i] - S[i]) * sc);
        ctx.strokeRect(a, y, w, bh);
      }
      const path = (state.critical.tasks || []).map((id) => store.byId.get(id)).filter((i) => i !== undefined);
      ctx.lineWidth = 1.2; ctx.beginPath();
      for (let p = 1; p < path.length; p++) {
        const u = path[p - 1], v = path[p];
        ctx.moveTo((E[u] - x0) * sc, AXIS_H + (store.laneOf[u] + 0.5) * laneH);
        ctx.lineTo((S[v] - x0) * sc, AXIS_H + (store.laneOf[v] + 0.5) * laneH);
      }
      ctx.stroke();
    }
    // messages: one path of thin arrows, only those overlapping the window
    const msgs = store.msgs, first = firstLaneOfRank();
    if (showMsgs && msgs.length) {
      ctx.strokeStyle = "rgba(40, 44, 52, 0.45)"; ctx.lineWidth = 1; ctx.beginPath();
      for (let m = 0; m < msgs.length; m += 5) {
        const t0 = msgs[m + 2], t1 = msgs[m + 3];
        if (t1 < x0 || t0 > x1) continue;
        const ls = first.get(msgs[m]), ld = first.get(msgs[m + 1]);
        if (ls === undefined || ld === undefined) continue;
        arrow(ctx, (t0 - x0) * sc, AXIS_H + (ls + 0.5) * laneH, (t1 - x0) * sc, AXIS_H + (ld + 0.5) * laneH);
      }
      ctx.stroke();
    }
    // steals: from (request, the victim's first lane) to (arrival, the thief's first lane)
    let nSteals = 0;
    if (store.steals.length) {
      ctx.strokeStyle = STEAL_LINE; ctx.lineWidth = 1.5; ctx.beginPath();
      for (let k = 0; k < store.steals.length; k += 4) {
        const ln = stealLine(k, first, x0, x1, sc);
        if (!ln) continue;
        arrow(ctx, ...ln);
        nSteals++;
      }
      ctx.stroke();
    }
    canvas.dataset.steals = nSteals; // what is drawn, for a reader and for tests
    canvas.dataset.spawned = nSpawned;
    if (hoverPx) showTooltip(hoverPx.x, hoverPx.y);
  }

  let tipFrame = null; // hover: at most one hit-test per frame
  function scheduleTip() {
    if (tipFrame || frame) return; // a pending redraw updates the tooltip too
    tipFrame = raf(() => { tipFrame = null; if (hoverPx) showTooltip(hoverPx.x, hoverPx.y); });
  }
  function cancel(f) { if (f) { if (f.a != null) cancelAnimationFrame(f.a); else clearTimeout(f.t); } }

  // ------------------------------------------------------------ interaction

  function pick(st, px, py) { // the row of `st` under (px, py), or -1
    const li = Math.floor((py - AXIS_H) / laneH);
    if (li < 0 || li >= st.lanes.length) return -1;
    const L = st.lanes[li], { x0, x1 } = win(), sc = width / (x1 - x0);
    const t = x0 + px / sc, tol = 3 / sc, S = st.start, E = st.end;
    let j = lowerBound(L.s, L.n, t + tol) - 1, best = -1, bestD = Infinity;
    for (; j >= 0 && L.s[j] >= t - tol - L.maxDur; j--) {
      const i = L.idx[j];
      if (E[i] < t - tol) continue;
      const d = t < S[i] ? S[i] - t : t > E[i] ? t - E[i] : 0;
      if (d < bestD) { bestD = d; best = i; if (d === 0) break; }
    }
    return best;
  }

  function pickSteal(px, py) { // flat index of the steal line within 5 px, or -1
    if (!store.steals.length) return -1;
    const { x0, x1 } = win(), sc = width / (x1 - x0), first = firstLaneOfRank();
    let best = -1, bestD = 5;
    for (let k = 0; k < store.steals.length; k += 4) {
      const ln = stealLine(k, first, x0, x1, sc), d = ln ? segDist(px, py, ln) : Infinity;
      if (d < bestD) { bestD = d; best = k; }
    }
    return best;
  }

  function stealTip(k) {
    const T = store.steals, lat = T[k + 3] - T[k + 2];
    return ["steal: " + store.stealNames[k / 4], [
      `rank ${T[k]} (thief) took it from rank ${T[k + 1]} (victim)`,
      `latency ${(lat * 1e6).toFixed(1)} µs, request to arrival`,
      `requested ${fmtTime(T[k + 2], 4)} · arrived ${fmtTime(T[k + 3], 4)}`]];
  }

  function barTip(st, i) {
    const lanes = laneList(), li = st.laneOf[i];
    const lines = [(lanes[li] || {}).label || "lane " + li,
      `start ${fmtTime(st.start[i], 4)} · duration ${fmtTime(st.end[i] - st.start[i], 3)}`];
    if (st === spawns) lines.push("spawned call");
    else {
      const kn = (state.kernels || [])[st.kern[i]];
      if (kn != null) lines.push("kernel " + kn);
    }
    if (st.st[i] === 2) lines.push("FAILED");
    if (st === store && critSet.has(st.tid[i])) lines.push("on the critical path");
    return [st.labels[i] || "task " + st.tid[i], lines];
  }

  function hit(px, py) { // [title, lines] of what is under (px, py), or null
    const k = pickSteal(px, py);
    if (k >= 0) return stealTip(k);
    const pad = laneH >= 14 ? 2 : 1, inLane = (py - AXIS_H) - Math.floor((py - AXIS_H) / laneH) * laneH;
    const lower = inLane >= pad + spawnTop(laneH - 2 * pad);
    for (const st of lower ? [spawns, store] : [store, spawns]) {
      const i = st.n ? pick(st, px, py) : -1;
      if (i >= 0) return barTip(st, i);
    }
    return null;
  }

  function showTooltip(px, py) {
    const got = hit(px, py);
    if (!got) { tooltip.style.display = "none"; return; }
    tooltip.textContent = "";
    tooltip.append(h("div", "tg-tip-title", got[0]));
    for (const l of got[1]) tooltip.append(h("div", null, l));
    tooltip.style.display = "block";
    const tw = tooltip.offsetWidth || 200;
    tooltip.style.left = Math.min(px + 14, Math.max(0, width - tw - 4)) + "px";
    const th = tooltip.offsetHeight || 60, ch = canvas.clientHeight || 0;
    tooltip.style.top = (py + 14 + th > ch && py - th - 8 >= 0 ? py - th - 8 : py + 14) + "px";
  }

  let drag = null;
  function on(target, type, fn, opts) {
    target.addEventListener(type, fn, opts);
    cleanups.push(() => target.removeEventListener(type, fn, opts));
  }
  function localXY(ev) { const r = canvas.getBoundingClientRect(); return { x: ev.clientX - r.left, y: ev.clientY - r.top }; }
  function setView(x0, x1) {
    const e = extent() * 1.01, span = Math.max(x1 - x0, 1e-7);
    if (span >= e) { view = null; schedule(); return; }
    if (x0 < 0) x0 = 0;
    if (x0 + span > e) x0 = e - span;
    view = { x0, x1: x0 + span };
    schedule();
  }
  on(canvas, "wheel", (ev) => {
    ev.preventDefault();
    const { x0, x1 } = win(), { x } = localXY(ev), span = x1 - x0;
    if (Math.abs(ev.deltaX) > Math.abs(ev.deltaY)) { const d = (ev.deltaX / width) * span; setView(x0 + d, x1 + d); return; }
    const f = Math.exp(ev.deltaY * (ev.deltaMode === 1 ? 0.05 : 0.0015));
    const tc = x0 + (x / width) * span;
    setView(tc - (tc - x0) * f, tc + (x1 - tc) * f);
  }, { passive: false });
  on(canvas, "mousedown", (ev) => {
    if (ev.button !== 0) return;
    drag = { x: ev.clientX, v: win() };
    canvas.classList.add("tg-dragging");
    ev.preventDefault();
  });
  on(window, "mousemove", (ev) => {
    if (!drag) return;
    const d = ((drag.x - ev.clientX) / width) * (drag.v.x1 - drag.v.x0);
    setView(drag.v.x0 + d, drag.v.x1 + d);
  });
  on(window, "mouseup", () => { drag = null; canvas.classList.remove("tg-dragging"); });
  on(canvas, "dblclick", () => { view = null; schedule(); });
  on(canvas, "mousemove", (ev) => {
    hoverPx = drag ? null : localXY(ev);
    if (drag) tooltip.style.display = "none";
    else scheduleTip();
  });
  on(canvas, "mouseleave", () => { hoverPx = null; tooltip.style.display = "none"; });
  if (typeof ResizeObserver === "function") {
    const ro = new ResizeObserver(() => resize());
    ro.observe(el);
    cleanups.push(() => ro.disconnect());
  } else on(window, "resize", resize);

  // ------------------------------------------------------------ model wiring

  const onState = () => { state = model.get("state") || {}; renderState(); };
  const onMsg = (msg) => {
    if (!msg || typeof msg !== "object") return;
    const kinds = spawnKinds.size, steals = store.steals.length;
    if (msg.kind === "reset") { store.clear(); spawns.clear(); spawnKinds.clear(); view = null; }
    else if (msg.kind === "events") {
      store.add(msg);
      if (msg.spawned) spawns.addRows(spawnRows(msg.spawned));
    } else return;
    const lanes = Math.max(store.lanes.length, spawns.lanes.length);
    if (lanes > (state.lanes || []).length || msg.kind === "reset") renderLanes();
    if (spawnKinds.size !== kinds || (steals === 0) !== (store.steals.length === 0)) renderLegend();
    schedule();
  };
  model.on("change:state", onState);
  model.on("msg:custom", onMsg);
  renderState();
  model.send({ kind: "replay" });

  return () => {
    if (model.off) { model.off("change:state", onState); model.off("msg:custom", onMsg); }
    for (const c of cleanups) c();
    cancel(frame); cancel(tipFrame); frame = tipFrame = null;
  };
}

// A standalone page: the same render over a fake model that replays `data.events`.
export function renderStatic(el, data) {
  const handlers = {};
  const model = {
    get: (key) => (key === "state" ? (data && data.state) || {} : undefined),
    on: (name, cb) => { (handlers[name] = handlers[name] || []).push(cb); },
    off: (name, cb) => { handlers[name] = (handlers[name] || []).filter((f) => f !== cb); },
    send: (msg) => {
      if (!msg || msg.kind !== "replay") return;
      const deliver = (m) => (handlers["msg:custom"] || []).forEach((cb) => cb(m, []));
      deliver({ kind: "reset" });
      for (const m of (data && data.events) || []) deliver(m);
    },
  };
  return render({ model, el });
}

export default { render };
