// Draws memplan's plan report from DATA (memplan/reports/plan_report.py) as inline SVG.
"use strict";

const NS = "http://www.w3.org/2000/svg";
// One colour per thing drawn (the tests find each chart by its colours in a screenshot).
const COLORS = {
  plain: "#8c564b", plan: "#1f77b4", budget: "#d62728", keep: "#b8b8b8", resident: "#6baed6",
  d2h: "#ff7f0e", h2d: "#2ca02c", recompute: "#9467bd", compute: "#4c72b0", gap: "#d0d0d0",
};
const WIDTH = 1060, LEFT = 120, RIGHT = 20;
const KEPT_ROW = 3, DECIDED_ROW = 12;  // row heights in the fates chart

function el(tag, attrs, parent, text) {
  const node = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  if (parent) parent.appendChild(node);
  return node;
}

function tip(node, text) { el("title", {}, node, text); return node; }

function bytes(n) {
  if (n === null || n === undefined) return "none";
  const units = [["GiB", 2 ** 30], ["MiB", 2 ** 20], ["KiB", 2 ** 10]];
  for (const [u, s] of units) if (Math.abs(n) >= s) return (n / s).toFixed(2) + " " + u;
  return n + " B";
}

function seconds(t) {
  if (t === 0) return "0";
  if (t >= 1) return t.toFixed(3) + " s";
  if (t >= 1e-3) return (t * 1e3).toFixed(3) + " ms";
  return (t * 1e6).toFixed(1) + " µs";
}

function niceTicks(max, count) {
  if (!(max > 0)) return [0];
  const raw = max / count, mag = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 2.5, 5, 10].map(m => m * mag).find(s => s >= raw);
  const out = [];
  for (let v = 0; v <= max * 1.0001; v += step) out.push(v);
  return out;
}

function timeAxis(svg, x, end, y0, height) {
  for (const t of niceTicks(end, 8)) {
    el("line", {x1: x(t), x2: x(t), y1: y0, y2: y0 + height, stroke: "#eee"}, svg);
    el("text", {x: x(t), y: y0 + height + 14, "text-anchor": "middle"}, svg, seconds(t));
  }
}

function summary() {
  const s = DATA.summary, rows = [
    ["planner", s.planner + " on " + s.profile],
    ["budget", bytes(s.budget_bytes)],
    ["peak without the plan", bytes(s.plain_peak_bytes)],
    ["peak under the plan", bytes(s.peak_bytes)],
    ["predicted step time", seconds(s.time_s) + " (without the plan " + seconds(s.baseline_time_s) + ")"],
    ["predicted overhead", (100 * s.overhead).toFixed(1) + "%"],
    ["where the time goes", Object.entries(s.breakdown).map(([k, v]) => k.replace(/_s$/, "") + " " + seconds(v)).join(", ")],
    ["storages", s.storages + " (" + s.swapped + " swapped, " + s.recomputed + " recomputed), " + s.ops + " ops"],
    ["host link", bytes(s.link_bytes) + " moved, " + bytes(s.host_peak_bytes) + " on the host at most"],
  ];
  const table = document.getElementById("summary");
  for (const [k, v] of rows) {
    const tr = table.insertRow();
    tr.insertCell().textContent = k;
    tr.insertCell().textContent = v;
  }
  document.getElementById("title").textContent = "memplan plan report: " + s.model + (s.batch ? " at batch " + s.batch : "");
  document.getElementById("subtitle").textContent = s.planner + " under a budget of " + bytes(s.budget_bytes) +
    ", simulated on " + s.profile + ": predicted overhead " + (100 * s.overhead).toFixed(1) + "%";
}

function legend(id, entries) {
  const box = document.getElementById(id);
  for (const [label, color] of entries) {
    const span = document.createElement("span");
    span.style.setProperty("--c", color);
    span.textContent = label;
    box.appendChild(span);
  }
}

function stepPath(points, x, y) {
  return points.map(([t, v], i) => (i ? "H" + x(t).toFixed(1) + "V" : "M" + x(t).toFixed(1) + " ") + y(v).toFixed(1))
    .join("");
}

function byteTicks(max) {
  const unit = [2 ** 30, 2 ** 20, 2 ** 10, 1].find(u => max >= 2 * u) || 1;
  return niceTicks(max / unit, 6).map(v => v * unit);
}

function stepEnd() {
  const lanes = Object.values(DATA.lanes).flat().map(span => span[1]);
  return Math.max(DATA.summary.time_s, ...lanes);
}

function memoryChart() {
  const L = DATA.load, height = 300, top = 10;
  const end = Math.max(stepEnd(), L.plain_end_s);
  const peak = Math.max(...L.plain.map(p => p[1]), ...L.plan.map(p => p[1]), L.budget || 0) * 1.05;
  const x = t => LEFT + (WIDTH - LEFT - RIGHT) * t / end, y = v => top + height - height * v / peak;
  const svg = el("svg", {width: WIDTH, height: height + 40, id: "memory-svg"}, document.getElementById("memory"));
  timeAxis(svg, x, end, top, height);
  for (const v of byteTicks(peak)) {
    el("line", {x1: LEFT, x2: WIDTH - RIGHT, y1: y(v), y2: y(v), stroke: "#eee"}, svg);
    el("text", {x: LEFT - 6, y: y(v) + 4, "text-anchor": "end"}, svg, bytes(v));
  }
  const plain = L.plain.concat([[L.plain_end_s, 0]]), plan = L.plan.concat([[L.end_s, 0]]);
  tip(el("path", {d: stepPath(plain, x, y), fill: "none", stroke: COLORS.plain, "stroke-width": 3}, svg),
      "without the plan: peak " + bytes(DATA.summary.plain_peak_bytes));
  tip(el("path", {d: stepPath(plan, x, y), fill: "none", stroke: COLORS.plan, "stroke-width": 3}, svg),
      "under the plan: peak " + bytes(DATA.summary.peak_bytes));
  if (L.budget !== null) {
    tip(el("line", {x1: LEFT, x2: WIDTH - RIGHT, y1: y(L.budget), y2: y(L.budget), stroke: COLORS.budget,
                    "stroke-width": 3, "stroke-dasharray": "8 5"}, svg), "budget " + bytes(L.budget));
  }
  legend("memory-legend", [["without the plan", COLORS.plain], ["under the plan", COLORS.plan], ["budget", COLORS.budget]]);
}

function lanesChart() {
  const lanes = [["compute", "compute stream"], ["d2h", "device to host"], ["h2d", "host to device"]];
  const row = 22, end = stepEnd(), x = t => LEFT + (WIDTH - LEFT - RIGHT) * t / end;
  const svg = el("svg", {width: WIDTH, height: lanes.length * row + 30, id: "lanes-svg"}, document.getElementById("lanes"));
  timeAxis(svg, x, end, 0, lanes.length * row);
  lanes.forEach(([key, label], i) => {
    el("text", {x: LEFT - 6, y: i * row + 15, "text-anchor": "end"}, svg, label);
    const color = key === "compute" ? COLORS.compute : COLORS[key];
    for (const [a, b] of DATA.lanes[key] || []) {
      el("rect", {x: x(a), y: i * row + 4, width: Math.max(1, x(b) - x(a)), height: row - 8, fill: color}, svg);
    }
  });
}

function describe(r) {
  return "storage " + r.id + (r.name ? " (" + r.name + ")" : "") + ", " + r.kind + ", " + bytes(r.bytes) + ": " +
    ({keep: "kept", swap: "swapped", recompute: "recomputed"}[r.fate] || r.fate.replace("+", " and ") + "d");
}

function eventTip(r, e) {
  const ops = DATA.ops;
  if (e[0] === "recompute") {
    return describe(r) + "; recomputed by replaying ops " + e[3] + "-" + e[4] + " (" + ops.names[e[3]] + " in " +
      (ops.modules[e[3]] || "the model") + " to " + ops.names[e[4]] + ") in " + seconds(e[2] - e[1]);
  }
  return describe(r) + "; " + (e[0] === "d2h" ? "to the host" : "back to the device") + " in " + seconds(e[2] - e[1]) +
    " from " + seconds(e[1]);
}

function fatesChart() {
  const rows = DATA.storages.rows, end = stepEnd();
  const heights = rows.map(r => r.fate === "keep" ? KEPT_ROW : DECIDED_ROW);
  const tops = heights.map((h, i) => heights.slice(0, i).reduce((a, b) => a + b, 0));
  const total = heights.reduce((a, b) => a + b, 0);
  const x = t => LEFT + (WIDTH - LEFT - RIGHT) * Math.min(t, end) / end;
  const svg = el("svg", {width: WIDTH, height: total + 30, id: "fates-svg"}, document.getElementById("fates"));
  timeAxis(svg, x, end, 0, total);
  rows.forEach((r, i) => fateRow(svg, r, tops[i], heights[i], x));
  legend("fates-legend", [["kept", COLORS.keep], ["resident (swapped or recomputed storage)", COLORS.resident],
                          ["to the host", COLORS.d2h], ["back from the host", COLORS.h2d],
                          ["recomputed (its ops replayed)", COLORS.recompute], ["away or dropped", COLORS.gap]]);
  if (DATA.storages.hidden > 0) {
    document.getElementById("fates-note").textContent += " " + DATA.storages.hidden + " smaller kept storages are not shown.";
  }
}

function shorten(text, n) { return text.length > n ? "…" + text.slice(1 - n) : text; }

function fateRow(svg, r, y, h, x) {
  const spans = r.t.concat(r.x.map(e => [e[1], e[2]]));
  if (r.fate !== "keep" && spans.length) {
    const a = Math.min(...spans.map(s => s[0])), b = Math.max(...spans.map(s => s[1]));
    el("line", {x1: x(a), x2: x(b), y1: y + h / 2, y2: y + h / 2, stroke: COLORS.gap, "stroke-width": 2}, svg);
    el("text", {x: LEFT - 6, y: y + h - 2, "text-anchor": "end"}, svg, shorten(r.name || "storage " + r.id, 18));
  }
  const color = r.fate === "keep" ? COLORS.keep : COLORS.resident;
  for (const [a, b] of r.t) {
    tip(el("rect", {x: x(a), y: y + 0.5, width: Math.max(1, x(b) - x(a)), height: h - 1, fill: color}, svg), describe(r));
  }
  for (const e of r.x) {
    tip(el("rect", {x: x(e[1]), y: y, width: Math.max(2, x(e[2]) - x(e[1])), height: h, fill: COLORS[e[0]]}, svg),
        eventTip(r, e));
  }
}

summary();
memoryChart();
lanesChart();
fatesChart();
document.body.setAttribute("data-rendered", document.querySelectorAll("svg *").length);
