// gpufleet serve: SVG charts with axes, ticks, a legend and a hover readout (loaded after common.js).
"use strict";

// xyChart(box, opts) draws into the element `box`:
//   opts = {series: [{name, color, points: [[x, y], ...], kind: "line" | "dots"}],
//           x: {label, time}, y: {label, log}, marks: [{x, label, color}], height: 180, id, empty}
// A time axis takes Unix seconds and labels local clock times (dates for long spans); a log axis
// labels decades (1, 2, 5... within a narrow range) and drops the points that are not positive.
// Hovering shows the nearest point's series, x and y in the shared #tip.

const CHART_W = 960;
const CHART_PAD = { left: 64, right: 18, top: 14, bottom: 40 };
const SERIES_COLORS = ["#2f6fd0", "#c07a00", "#2f8a4a", "#7a5cc0", "#c0392b", "#4aa3a3"];
const TIME_STEPS = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400, 172800, 604800];

// ---- ticks ------------------------------------------------------------------------------------

// Ticks at round steps (1, 2, 5 x 10^k), about `count` of them over [lo, hi] (rounded out to a tick on
// each side with `roundOut`), each labelled with the decimals its step needs (so that no two read the same).
function linearTicks(lo, hi, count = 5, roundOut = false) {
  const raw = (hi - lo) / Math.max(1, count);
  const mag = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= raw) || 10 * mag;
  const decimals = Math.min(12, Math.max(0, -Math.floor(Math.log10(step))));
  const most = Math.max(Math.abs(lo), Math.abs(hi));
  const unit = step >= 1e5 && most >= 1e7 ? [1e6, "M"] : step >= 100 && most >= 1e4 ? [1e3, "k"] : null; // one unit for every tick
  const label = (v) => (unit && v ? `${(v / unit[0]).toLocaleString("en-US", { maximumFractionDigits: 3 })}${unit[1]}`
    : v.toLocaleString("en-US", { minimumFractionDigits: decimals, maximumFractionDigits: decimals }));
  const out = [];
  const last = roundOut ? Math.ceil(hi / step - 1e-9) : Math.floor(hi / step + 1e-9);
  for (let i = roundOut ? Math.floor(lo / step + 1e-9) : Math.ceil(lo / step - 1e-9); i <= last; i++) {
    const v = i * step + 0; // + 0: never "-0"
    out.push([v, label(v)]);
  }
  return out;
}

// Ticks of a log axis over [lo, hi]: at each 1 to 9 x 10^k within half a decade, at 1, 2 and 5 x 10^k
// within a decade and a half, else at the powers of ten; rounded out to the nearest tick on each side,
// at most about seven of them labelled.
function logTicks(lo, hi) {
  const span = Math.log10(hi) - Math.log10(lo);
  const mults = span > 1.5 ? [1] : span > 0.5 ? [1, 2, 5] : [1, 2, 3, 4, 5, 6, 7, 8, 9];
  const all = [];
  for (let k = Math.floor(Math.log10(lo)) - 1; k <= Math.ceil(Math.log10(hi)) + 1; k++) for (const m of mults) all.push([m, k, m * 10 ** k]);
  const first = all.filter((t) => t[2] <= lo * (1 + 1e-9)).pop();
  let lastIndex = all.findIndex((t) => t[2] >= hi * (1 - 1e-9));
  if (all[lastIndex] === first) lastIndex += 1;
  const ticks = all.slice(all.indexOf(first), lastIndex + 1);
  const stride = Math.ceil(ticks.length / 7);
  return ticks.map(([m, k, v], i) => [v, (ticks.length - 1 - i) % stride ? "" : m === 1 ? decade(k) : Math.abs(k) <= 3 ? axisNum(v) : `${m}\u00d7${decade(k)}`]);
}

// 10^k as people write it: 0.001 to 1,000 in full, beyond as a power of ten (10⁻⁶), never e-notation.
const SUPERSCRIPT = { "-": "\u207b", 0: "\u2070", 1: "\u00b9", 2: "\u00b2", 3: "\u00b3", 4: "\u2074", 5: "\u2075", 6: "\u2076", 7: "\u2077", 8: "\u2078", 9: "\u2079" };
function decade(k) {
  return Math.abs(k) <= 3 ? axisNum(10 ** k) : `10${[...String(k)].map((c) => SUPERSCRIPT[c]).join("")}`;
}

// Clock-aligned times (local midnight, whole minutes...) about `count` apart over [lo, hi] (Unix seconds).
function timeTicks(lo, hi, count = 6) {
  const step = TIME_STEPS.find((s) => (hi - lo) / s <= count) || Math.ceil((hi - lo) / count / 604800) * 604800;
  const local = -new Date(lo * 1000).getTimezoneOffset() * 60;
  const out = [];
  for (let t = Math.ceil((lo + local) / step) * step - local; t <= hi; t += step) out.push(t);
  return { ticks: out, step };
}

// A tick's label: seconds shown only when ticks are less than a minute apart, a date when they are a day or more.
function timeLabel(t, step) {
  const d = new Date(t * 1000);
  if (step >= 86400) return d.toLocaleDateString([], { month: "short", day: "numeric" });
  const clock = d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", ...(step < 60 ? { second: "2-digit" } : {}) });
  return d.getHours() === 0 && d.getMinutes() === 0 && step >= 3600 ? d.toLocaleDateString([], { month: "short", day: "numeric" }) : clock;
}

// A number for an axis or a readout: at most 3 significant digits, thousands grouped, never e-notation.
function axisNum(v) {
  if (!Number.isFinite(v)) return "";
  const abs = Math.abs(v);
  if (abs >= 1e6) return `${(v / 1e6).toLocaleString("en-US", { maximumSignificantDigits: 3 })}M`;
  if (abs >= 1e4) return `${(v / 1e3).toLocaleString("en-US", { maximumSignificantDigits: 3 })}k`;
  return v.toLocaleString("en-US", { maximumSignificantDigits: 3, maximumFractionDigits: 12 });
}

// A tick label centred on its tick, but kept inside the plot near its ends.
function tickAnchor(x, left, right) { return x > right - 30 ? "end" : x < left + 10 ? "start" : "middle"; }

// ---- scales -----------------------------------------------------------------------------------

function extent(values) {
  let lo = Infinity, hi = -Infinity;
  for (const v of values) { if (v < lo) lo = v; if (v > hi) hi = v; }
  return [lo, hi];
}

// The x scale and its ticks over [lo, hi] (a time axis when `time`), mapped onto [left, right].
function xScale(lo, hi, time, left, right) {
  if (hi <= lo) { lo -= time ? 30 : 1; hi += time ? 30 : 1; }
  const at = (v) => left + ((v - lo) / (hi - lo)) * (right - left);
  if (time) {
    const { ticks, step } = timeTicks(lo, hi);
    return { at, lo, hi, ticks: ticks.map((t) => [t, timeLabel(t, step)]), show: (v) => new Date(v * 1000).toLocaleString() };
  }
  return { at, lo, hi, ticks: linearTicks(lo, hi, 8), show: (v) => (Number.isInteger(v) ? v.toLocaleString("en-US") : axisNum(v)) };
}

// The y scale: linear (rounded out to ticks) or logarithmic (rounded out to decades), mapped onto [bottom, top].
function yScale(lo, hi, log, bottom, top) {
  if (log) {
    const ticks = logTicks(lo, hi);
    const a = Math.log10(ticks[0][0]), b = Math.log10(ticks[ticks.length - 1][0]);
    return { at: (v) => bottom - ((Math.log10(v) - a) / (b - a)) * (bottom - top), ticks };
  }
  if (hi <= lo) { lo -= Math.abs(lo) * 0.1 || 1; hi += Math.abs(hi) * 0.1 || 1; }
  const ticks = linearTicks(lo, hi, 4, true);
  const a = ticks[0][0], b = ticks[ticks.length - 1][0];
  return { at: (v) => bottom - ((v - a) / (b - a)) * (bottom - top), ticks };
}

// ---- the chart --------------------------------------------------------------------------------

function xyChart(box, opts) {
  const log = Boolean(opts.y && opts.y.log);
  const usable = (p) => Array.isArray(p) && Number.isFinite(p[0]) && Number.isFinite(p[1]) && (!log || p[1] > 0);
  const series = (opts.series || []).map((s) => ({ ...s, points: (s.points || []).filter(usable) })).filter((s) => s.points.length);
  if (!series.length) {
    box.innerHTML = `<p class="muted chart-empty">${esc(opts.empty || "nothing logged yet")}</p>`;
    return;
  }
  const marks = (opts.marks || []).filter((m) => Number.isFinite(m.x));
  const legend = series.length > 1;
  const H = opts.height || 180, top = CHART_PAD.top + (legend ? 18 : 0), bottom = H - CHART_PAD.bottom;
  const all = series.flatMap((s) => s.points);
  const [x0, x1] = extent([...all.map((p) => p[0]), ...marks.map((m) => m.x)]);
  const [y0, y1] = extent(all.map((p) => p[1]));
  const Y = yScale(y0, y1, log, bottom, top);
  const widest = Math.max(...Y.ticks.map(([, label]) => label.length));
  const left = Math.max(CHART_PAD.left, 34 + 7 * widest), right = CHART_W - CHART_PAD.right; // room for the tick labels
  const X = xScale(x0, x1, Boolean(opts.x && opts.x.time), left, right);
  const f = (v) => v.toFixed(1);

  const grid = Y.ticks.map(([v]) => `<line class="grid" x1="${left}" x2="${right}" y1="${f(Y.at(v))}" y2="${f(Y.at(v))}"></line>`).join("");
  const yAxis = `<g class="y-axis"><line class="axis" x1="${left}" x2="${left}" y1="${top}" y2="${bottom}"></line>` +
    Y.ticks.map(([v, label]) => `<text class="tick" x="${left - 6}" y="${f(Y.at(v) + 4)}" text-anchor="end">${esc(label)}</text>`).join("") +
    `<text class="axis-label" transform="translate(14 ${f((top + bottom) / 2)}) rotate(-90)" text-anchor="middle">${esc((opts.y && opts.y.label) || "")}${log ? " (log)" : ""}</text></g>`;
  const xAxis = `<g class="x-axis"><line class="axis" x1="${left}" x2="${right}" y1="${bottom}" y2="${bottom}"></line>` +
    X.ticks.map(([v, label]) => `<line class="axis" x1="${f(X.at(v))}" x2="${f(X.at(v))}" y1="${bottom}" y2="${bottom + 4}"></line>` +
      `<text class="tick" x="${f(X.at(v))}" y="${bottom + 16}" text-anchor="${tickAnchor(X.at(v), left, right)}">${esc(label)}</text>`).join("") +
    `<text class="axis-label" x="${f((left + right) / 2)}" y="${H - 6}" text-anchor="middle">${esc((opts.x && opts.x.label) || "")}</text></g>`;
  const drawn = series.map((s, i) => {
    const color = s.color || SERIES_COLORS[i % SERIES_COLORS.length];
    if (s.kind === "dots" || s.points.length === 1) {
      return `<g class="series" data-series="${esc(s.name)}">${s.points.map((p) => `<circle cx="${f(X.at(p[0]))}" cy="${f(Y.at(p[1]))}" r="2.5" fill="${esc(color)}"></circle>`).join("")}</g>`;
    }
    const d = s.points.map((p, j) => `${j ? "L" : "M"}${f(X.at(p[0]))},${f(Y.at(p[1]))}`).join(" ");
    return `<path class="series" data-series="${esc(s.name)}" d="${d}" fill="none" stroke="${esc(color)}" stroke-width="1.6"></path>`;
  }).join("");
  const marked = marks.map((m) => `<g class="mark"><line x1="${f(X.at(m.x))}" x2="${f(X.at(m.x))}" y1="${top}" y2="${bottom}" stroke="${esc(m.color || "#c0392b")}" stroke-dasharray="3,3"></line>` +
    `<text x="${f(X.at(m.x) + 3)}" y="${top + 10}">${esc(m.label || "")}</text></g>`).join("");
  let lx = right;
  const keys = legend ? [...series].reverse().map((s) => {
    const i = series.indexOf(s);
    lx -= 18 + 7 * String(s.name).length;
    return `<g class="legend-item"><rect x="${f(lx)}" y="4" width="10" height="10" fill="${esc(s.color || SERIES_COLORS[i % SERIES_COLORS.length])}"></rect><text x="${f(lx + 14)}" y="13">${esc(s.name)}</text></g>`;
  }).join("") : "";
  box.innerHTML = `<svg class="xy" ${opts.id ? `id="${esc(opts.id)}"` : ""} viewBox="0 0 ${CHART_W} ${H}" width="100%">${grid}${yAxis}${xAxis}${marked}${drawn}` +
    (legend ? `<g class="legend">${keys}</g>` : "") +
    `<circle class="focus" r="4" cx="-10" cy="-10"></circle><rect class="hover-area" x="${left}" y="${top}" width="${right - left}" height="${bottom - top}" fill="transparent"></rect></svg>`;
  const svg = box.querySelector("svg");
  const focus = svg.querySelector(".focus");
  const nearest = (px, py) => {
    let best = null, bestD = Infinity;
    for (const s of series) {
      for (const p of s.points) {
        const dx = X.at(p[0]) - px, dy = (Y.at(p[1]) - py) / 4; // the x distance counts most: a readout follows the cursor
        const d = dx * dx + dy * dy;
        if (d < bestD) { bestD = d; best = { s, p }; }
      }
    }
    return best;
  };
  const area = svg.querySelector(".hover-area");
  area.addEventListener("mousemove", (e) => {
    const pt = svg.createSVGPoint();
    pt.x = e.clientX; pt.y = e.clientY;
    const at = pt.matrixTransform(svg.getScreenCTM().inverse());
    const hit = nearest(at.x, at.y);
    if (!hit) return;
    focus.setAttribute("cx", f(X.at(hit.p[0])));
    focus.setAttribute("cy", f(Y.at(hit.p[1])));
    focus.setAttribute("fill", hit.s.color || SERIES_COLORS[series.indexOf(hit.s) % SERIES_COLORS.length]);
    tip.hidden = false;
    tip.textContent = `${legend ? `${hit.s.name}\n` : ""}${(opts.x && opts.x.label) || "x"}: ${X.show(hit.p[0])}\n${(opts.y && opts.y.label) || "y"}: ${axisNum(hit.p[1])}`;
    tip.style.left = `${e.clientX + 12}px`;
    tip.style.top = `${e.clientY + 12}px`;
  });
  area.addEventListener("mouseleave", () => { tip.hidden = true; focus.setAttribute("cx", "-10"); });
}
