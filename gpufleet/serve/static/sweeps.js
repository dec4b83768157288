// gpufleet serve: the sweeps page (common.js holds the helpers, charts.js xyChart; each page file adds one entry to PAGES).
"use strict";

// ---- sweeps ----------------------------------------------------------------------------------

const TRIAL_COLOR = { finished: "#2f6fd0", pruned: "#8a8f98", best: "#c0392b" };

function trialValue(v) {
  return typeof v === "number" ? v.toLocaleString("en-US", { maximumSignificantDigits: 4, useGrouping: false }) : "";
}
function sweepsTable(sweeps, chosen) {
  return table(["sweep", "objective", { label: "trials", num: 1 }, { label: "finished", num: 1 }, { label: "pruned", num: 1 },
    { label: "failed", num: 1 }, { label: "running", num: 1 }, "best", { label: "GPU time", num: 1 }, { label: "money", num: 1 }],
  sweeps.map((s) => s.problem
    ? `<tr data-sweep="${esc(s.sweep)}"><td>${esc(s.sweep)}</td><td colspan="9" class="err">${esc(s.problem)}</td></tr>`
    : `<tr data-sweep="${esc(s.sweep)}"${s.sweep === chosen ? ' class="chosen"' : ""}><td><a href="/sweeps?sweep=${encodeURIComponent(s.sweep)}">${esc(s.sweep)}</a></td>
      <td>${esc(s.direction)} ${esc(s.metric || "")}</td><td class="num">${s.trials}</td><td class="num">${s.finished}</td>
      <td class="num">${s.pruned}</td><td class="num">${s.failed}</td><td class="num">${s.running}</td>
      <td>${s.best ? `trial ${s.best.trial}: ${trialValue(s.best.value)}` : ""}</td>
      <td class="num">${typeof s.gpu_hours === "number" ? gpuTime(s.gpu_hours * 3600) : "-"}</td><td class="num">${money(s.money, s.currency)}</td></tr>`), 'id="sweeps"');
}

// The objective per trial: finished trials, pruned ones at their last reported value, and the best so far.
function sweepChart(box, s) {
  if (typeof xyChart !== "function") {
    box.innerHTML = '<p class="muted">charts are not available</p>';
    return;
  }
  const done = s.rows.filter((r) => typeof r.value === "number").sort((a, b) => a.trial - b.trial);
  const cut = s.rows.filter((r) => r.state === "pruned" && typeof r.last_value === "number");
  const better = s.direction === "maximize" ? Math.max : Math.min;
  let best = null;
  const line = done.map((r) => { best = best === null ? r.value : better(best, r.value); return [r.trial, best]; });
  const series = [{ name: "finished", color: TRIAL_COLOR.finished, kind: "dots", points: done.map((r) => [r.trial, r.value]) }];
  if (cut.length) series.push({ name: "pruned (last value)", color: TRIAL_COLOR.pruned, kind: "dots", points: cut.map((r) => [r.trial, r.last_value]) });
  if (line.length) series.push({ name: "best so far", color: TRIAL_COLOR.best, kind: "line", points: line });
  xyChart(box, {
    series, x: { label: "trial", time: false }, y: { label: s.metric || "objective", log: false }, height: 220,
    marks: s.best ? [{ x: s.best.trial, label: `best: trial ${s.best.trial}`, color: TRIAL_COLOR.best }] : [],
  });
}
function trialsTable(s) {
  const bestTrial = s.best ? s.best.trial : null;
  const head = ["trial", "state", ...s.params, { label: s.metric || "objective", num: 1 }, "pruned", "job",
    { label: "GPU time", num: 1 }, { label: "money", num: 1 }];
  const rows = [...s.rows].sort((a, b) => a.trial - b.trial).map((r) => {
    const isBest = r.trial === bestTrial;
    const pruned = r.state === "pruned" ? `at step ${r.pruned_at ?? r.last_step ?? "?"} (${trialValue(r.last_value)})` : "";
    return `<tr data-trial="${r.trial}" data-state="${esc(r.state)}"${isBest ? ' class="best" data-best="true"' : ""}>
      <td>${r.trial}${isBest ? ' <span class="pill best">best</span>' : ""}</td><td><span class="pill ${esc(r.state)}">${esc(r.state)}</span></td>
      ${s.params.map((p) => `<td>${p in r.params ? esc(paramValue(r.params[p])) : ""}</td>`).join("")}
      <td class="num">${trialValue(r.value)}</td><td class="muted">${esc(pruned || r.reason || "")}</td>
      <td>${r.job ? `<a href="/jobs/${r.job}">#${r.job}</a>` : ""}</td>
      <td class="num">${typeof r.gpu_hours === "number" ? gpuTime(r.gpu_hours * 3600) : "-"}</td><td class="num">${money(r.money, s.currency)}</td></tr>`;
  });
  return table(head, rows, 'id="trials"');
}

function sweepsPage() {
  main.innerHTML = `<h1>Sweeps</h1><div id="sweep-list"></div><div id="sweep"></div>`;
  let chosen = new URLSearchParams(location.search).get("sweep") || "";
  live(async () => {
    const list = await api("/api/sweeps");
    if (!list.sweeps.length) {
      document.getElementById("sweep-list").innerHTML =
        '<p class="muted">no sweep in this home yet: <code>gpufleet sweep run SWEEP.yaml</code> starts one</p>';
      return;
    }
    if (!list.sweeps.some((s) => s.sweep === chosen && !s.problem)) chosen = (list.sweeps.find((s) => !s.problem) || {}).sweep || "";
    document.getElementById("sweep-list").innerHTML = sweepsTable(list.sweeps, chosen);
    if (!chosen) return;
    const s = await api(`/api/sweeps/${encodeURIComponent(chosen)}`);
    const box = document.getElementById("sweep");
    box.innerHTML = `<h2>${esc(s.sweep)}: ${esc(s.metric || "objective")} per trial (${esc(s.direction)})</h2>
      <p class="muted">${s.best ? `best: trial ${s.best.trial}, ${esc(s.metric || "objective")} ${trialValue(s.best.value)}, ` +
        esc(Object.entries(s.best.params).map(([k, v]) => `${k}=${paramValue(v)}`).join(" ")) : "no finished trial yet"}</p>
      <div id="sweep-chart" class="chart"></div><h2>Trials</h2>${trialsTable(s)}`;
    sweepChart(document.getElementById("sweep-chart"), s);
  });
}


PAGES.sweeps = sweepsPage;
