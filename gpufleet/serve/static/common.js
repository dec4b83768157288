// gpufleet serve: every page reads the JSON API the CLI's --json mirrors, and polls it to stay live.
"use strict";

// Each page file adds its function here; app.js, loaded last, runs the one this page is.
const PAGES = {};

const boot = JSON.parse(document.body.dataset.boot);
const main = document.getElementById("main");
const tip = document.getElementById("tip");
const tokenInput = document.getElementById("token");
tokenInput.value = sessionStorage.getItem("gpufleet-token") || "";
for (const ev of ["input", "change"]) tokenInput.addEventListener(ev, () => sessionStorage.setItem("gpufleet-token", tokenInput.value.trim()));
for (const a of document.querySelectorAll("nav a")) if (a.dataset.nav === boot.page) a.classList.add("here");

// ---- helpers ---------------------------------------------------------------------------------

function esc(v) {
  return String(v ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}
function num(v, digits = 1) {
  if (v === null || v === undefined || Number.isNaN(v)) return "";
  if (typeof v !== "number") return esc(v);
  if (v !== 0 && Math.abs(v) < 0.1) return v.toLocaleString("en-US", { maximumSignificantDigits: 2, maximumFractionDigits: 12 });
  return Math.abs(v) >= 1000 ? v.toLocaleString("en-US", { maximumFractionDigits: 0 }) : v.toFixed(digits);
}
function when(ts) { return ts ? new Date(ts * 1000).toLocaleString() : ""; }
// A duration with its units: "0.02 ms", "25 ms", "1.4 s", "3 min 05 s", "2 h 07 min", "3 d 4 h".
function dur(s) {
  if (typeof s !== "number" || !Number.isFinite(s)) return "";
  s = Math.max(0, s);
  const two = (n) => String(n).padStart(2, "0");
  if (s === 0) return "0 s";
  if (s < 0.001) return `${(s * 1000).toLocaleString("en-US", { maximumSignificantDigits: 2, maximumFractionDigits: 12 })} ms`;
  if (s < 1) return `${(s * 1000).toLocaleString("en-US", { maximumSignificantDigits: 2 })} ms`;
  if (s < 60) return `${s.toFixed(1)} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m} min ${two(Math.floor(s % 60))} s`;
  const h = Math.floor(m / 60);
  return h < 24 ? `${h} h ${two(m % 60)} min` : `${Math.floor(h / 24)} d ${h % 24} h`;
}
function state(s) { return `<span class="state ${esc(s)}">${esc(s)}</span>`; }
function table(head, rows, attrs = "") {
  const th = head.map((h) => `<th${h.num ? ' class="num"' : ""}>${esc(h.label ?? h)}</th>`).join("");
  return `<table ${attrs}><thead><tr>${th}</tr></thead><tbody>${rows.join("") || `<tr><td colspan="${head.length}" class="muted">none</td></tr>`}</tbody></table>`;
}
async function api(path) {
  const r = await fetch(path, { headers: { Accept: "application/json" } });
  if (!r.ok) throw new Error(`${path}: ${r.status} ${(await r.json().catch(() => ({}))).detail || ""}`);
  return r.json();
}
async function act(path, body, out) {
  const token = tokenInput.value.trim();
  const headers = { "Content-Type": "application/json" };
  if (token) headers.Authorization = `Bearer ${token}`;
  const r = await fetch(path, { method: "POST", headers, body: JSON.stringify(body || {}) });
  const data = await r.json().catch(() => ({}));
  out.classList.remove("ok", "err");
  out.classList.add(r.ok ? "ok" : "err");
  out.textContent = r.ok ? `done: ${JSON.stringify(data.requested || data.model || "ok")}` : `refused (${r.status}): ${data.detail || data.reason || ""}`;
  return r.ok;
}
function hover(el, text) {
  el.addEventListener("mousemove", (e) => {
    tip.hidden = false;
    tip.textContent = text;
    tip.style.left = `${e.clientX + 12}px`;
    tip.style.top = `${e.clientY + 12}px`;
  });
  el.addEventListener("mouseleave", () => { tip.hidden = true; });
}
function live(fn) {
  const tick = async () => {
    try {
      await fn();
      document.getElementById("live").textContent = `live, updated ${new Date().toLocaleTimeString()}`;
    } catch (err) {
      document.getElementById("live").textContent = `update failed: ${err.message}`;
    }
  };
  tick();
  setInterval(tick, boot.refresh_s * 1000);
}

// ---- bars, colours and numbers the job and cost pages share ----------------------------------

const BUCKET_COLOR = {
  queued: "#b0b7c3", startup: "#8a8f98", staging: "#6b8fb5", data_wait: "#e0a030", compute: "#2f8a4a",
  straggler_wait: "#c0392b", checkpoint: "#2f6fd0", restore: "#7a5cc0", lost: "#8e2420", rollback: "#d4658a",
  resize: "#4aa3a3", idle: "#d8dce3",
};
const PHASE_COLOR = { data_wait: "#e0a030", compute: "#2f8a4a", collective: "#2f6fd0", optimizer: "#7a5cc0", checkpoint: "#4aa3a3", straggler_wait: "#c0392b" };
const MAX_RANK_BARS = 64;
function pct(v) { return typeof v === "number" ? `${(100 * v).toFixed(1)}%` : "-"; }
// Money as gpufleet.fmt.money writes it: whole cents from one unit up ("$1,234.57"), three significant
// figures below ("$0.0000663"), the currency's sign where it has one, else its code after the amount.
const CURRENCY_SIGN = { USD: "$", EUR: "\u20ac", GBP: "\u00a3" };
function money(v, currency) {
  if (typeof v !== "number") return "unpriced";
  if (!Number.isFinite(v)) return "n/a";
  const x = Math.abs(v);
  let text = x.toLocaleString("en-US", { minimumFractionDigits: 2, maximumFractionDigits: 2 });
  if (x > 0 && x < 1) {
    text = x.toFixed(Math.min(8, 2 - Math.floor(Math.log10(x)))).replace(/0+$/, "");
    if (text.split(".")[1].length < 2) text = x.toFixed(2);
  }
  const sign = v < 0 ? "-" : "", code = String(currency || "");
  const symbol = CURRENCY_SIGN[code.toUpperCase()];
  return esc(symbol ? `${sign}${symbol}${text}` : `${sign}${text} ${code}`.trim());
}
// GPU time as gpufleet.fmt.gpu_time writes it: GPU-seconds to three significant figures below a hundredth
// of a GPU-hour (36 GPU-s), where GPU-hours would read as 0.00, else GPU-hours in hundredths ("1,234.57 GPU-h").
function gpuTime(seconds) {
  if (typeof seconds !== "number") return "-";
  if (!Number.isFinite(seconds)) return "n/a";
  if (Math.abs(seconds) < 36) {
    const shown = Math.abs(seconds) < 1e-12 ? "0" : seconds.toLocaleString("en-US", { maximumSignificantDigits: 3 });
    return `${shown} GPU-s`;
  }
  return `${(seconds / 3600).toLocaleString("en-US", { minimumFractionDigits: 2, maximumFractionDigits: 2 })} GPU-h`;
}

// Horizontal stacked bars, one a row, scaled to the largest row: rows = [{label, attrs, right, parts: [{key, value, color, tip}]}].
function stackedBars(id, rows, attrs = "") {
  const W = 960, rowH = 22, gap = 6, left = 130, right = 150;
  const most = Math.max(1e-12, ...rows.map((r) => r.parts.reduce((a, p) => a + p.value, 0)));
  const H = rows.length * (rowH + gap) + gap;
  const bars = rows.map((r, i) => {
    const y = gap + i * (rowH + gap);
    let x = left;
    const rects = r.parts.filter((p) => p.value > 0).map((p) => {
      const w = (p.value / most) * (W - left - right);
      const rect = `<rect class="part" data-key="${esc(p.key)}" data-tip="${esc(p.tip)}" x="${x.toFixed(2)}" y="${y}" width="${Math.max(0.5, w).toFixed(2)}" height="${rowH}" fill="${p.color}"></rect>`;
      x += w;
      return rect;
    }).join("");
    return `<g class="bar" ${r.attrs || ""}><text x="4" y="${y + rowH - 6}">${esc(r.label)}</text>${rects}<text x="${W - right + 8}" y="${y + rowH - 6}">${esc(r.right || "")}</text></g>`;
  }).join("");
  return `<svg id="${id}" ${attrs} viewBox="0 0 ${W} ${H}" width="100%">${bars}</svg>`;
}
// Hover texts, and the legend's colours set through the DOM (the CSP refuses inline style attributes).
function withTips(box) {
  for (const r of box.querySelectorAll("rect[data-tip]")) hover(r, r.dataset.tip);
  for (const s of box.querySelectorAll(".swatch[data-c]")) s.style.background = s.dataset.c;
}

// A run's (or a trial's) parameter as people write it: integers whole, others to 3 significant digits, never in e-notation.
function paramValue(v) {
  if (typeof v !== "number") return typeof v === "object" ? JSON.stringify(v) : String(v);
  return Number.isInteger(v) ? String(v) : v.toLocaleString("en-US", { maximumSignificantDigits: 3, useGrouping: false });
}
