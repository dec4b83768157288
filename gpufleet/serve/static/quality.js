// gpufleet serve: the quality page (common.js holds the helpers; each page file adds one entry to PAGES).
"use strict";

// ---- quality ---------------------------------------------------------------------------------

function qualityPage() {
  main.innerHTML = `<h1>Model quality</h1><div id="homes"></div>`;
  let shown = "";
  live(async () => {
    const q = await api("/api/quality");
    const text = JSON.stringify(q);
    if (text === shown) return; // redraw only what changed: a form being filled in keeps its input
    shown = text;
    document.getElementById("homes").innerHTML = q.homes.map((h) => {
      const models = h.models.map((m) => `<h2>${esc(m.name)} ${Object.entries(m.aliases).map(([a, v]) => `<span class="pill">@${esc(a)} v${esc(v)}</span>`).join("")}</h2>
        ${table(["#", "when", "action", "alias", "version", "who", "why"], m.history.map((e) => `<tr data-action="${esc(e.action)}">
          <td>${esc(e.seq)}</td><td>${when(e.when)}</td><td><span class="pill ${esc(e.action)}">${esc(e.action)}</span></td><td>@${esc(e.alias)}</td>
          <td>${esc(e.from_version ?? "")} → ${esc(e.to_version ?? "")}</td><td>${esc(e.who)}</td><td>${esc(e.why)}</td></tr>`), `class="alias-history" data-model="${esc(m.name)}"`)}
        <form class="actions" data-model="${esc(m.name)}" data-home="${esc(h.home)}">
          <input name="version" placeholder="version" size="6"><input name="reason" placeholder="reason (recorded)" size="30">
          <button data-do="promote">Promote to champion</button><button data-do="rollback" class="danger">Roll back</button>
          <span class="result"></span></form>`).join("");
      const decisions = h.decisions.length ? `<h2>Policy decisions</h2>${table(["window", "when", "action", "reasons"],
        h.decisions.map((d) => `<tr><td>${esc(d.window)}</td><td>${when(d.at)}</td><td><span class="pill ${esc(d.action)}">${esc(d.action)}</span></td>
          <td>${esc(d.reasons.join("; "))}</td></tr>`))}` : "";
      const monitor = Object.entries(h.monitor || {}).map(([model, m]) => `<h2>Monitor: ${esc(model)}</h2>
        ${table(["window", "when", "dataset drift", "drifted columns"], (m.drift || []).map((w) => `<tr><td>${esc(w.window)}</td><td>${when(w.at)}</td>
          <td>${w.error ? `error: ${esc(w.error)}` : w.dataset_drift ? "yes" : "no"}</td>
          <td>${esc((w.columns || []).filter((c) => c.drifted).map((c) => `${c.column} ${c.method}=${num(c.statistic, 3)}`).join(", "))}</td></tr>`))}
        ${table(["window", "action", "reasons"], (m.decisions || []).map((d) => `<tr><td>${esc(d.window)}</td>
          <td><span class="pill ${esc(d.action)}">${esc(d.action)}</span></td><td>${esc(d.reasons.join("; "))}</td></tr>`))}
        ${performanceSection(h.home, model, m.performance || [])}`).join("");
      return `<section data-home="${esc(h.home)}"><h1>${h.home ? esc(h.home) : "this home"}</h1>${models || '<p class="muted">no registered model</p>'}${decisions}${monitor}</section>`;
    }).join("");
    for (const box of document.querySelectorAll("#homes .perf-chart")) drawPerformance(box, q);
    for (const form of document.querySelectorAll("#homes form")) {
      form.addEventListener("submit", (e) => e.preventDefault()); // the buttons act; the form never navigates
      for (const b of form.querySelectorAll("button")) {
        b.onclick = () => {
          const body = { reason: form.reason.value, home_name: form.dataset.home };
          if (b.dataset.do === "promote") body.version = form.version.value;
          act(`/api/registry/${encodeURIComponent(form.dataset.model)}/${b.dataset.do}`, body, form.querySelector(".result"));
        };
      }
    }
  });
}


// ---- estimated and realised performance per window ---------------------------------------------

// A monitored model's windows: the estimate with its band and threshold, and the realised metric once labels came.
function performanceSection(home, model, perf) {
  if (!perf.length) return "";
  const metric = perf[perf.length - 1].metric || "metric";
  const band = (p) => (p.lower == null ? "" : `${num(p.lower, 3)} to ${num(p.upper, 3)}`);
  return `<h2>Performance: ${esc(model)} (${esc(metric)}, estimated and realised)</h2>
    <div class="perf-chart" data-home="${esc(home)}" data-model="${esc(model)}"></div>
    ${table(["window", "estimated", "band", "threshold", "realised", "note"], perf.map((p) => `<tr data-window="${esc(p.window)}">
      <td>${esc(p.window)}</td><td class="estimated">${num(p.estimated, 3)}</td><td>${band(p)}</td><td>${num(p.threshold, 3)}</td>
      <td class="realised">${p.realised == null ? '<span class="muted">labels not yet in</span>' : num(p.realised, 3)}</td>
      <td>${esc(p.error || "")}</td></tr>`), `class="performance" data-model="${esc(model)}"`)}`;
}

// The chart of one model's performance series, x = the window's place in the order checked.
function drawPerformance(box, q) {
  const home = q.homes.find((h) => h.home === box.dataset.home);
  const perf = (((home || {}).monitor || {})[box.dataset.model] || {}).performance || [];
  if (typeof xyChart !== "function") {
    box.innerHTML = '<p class="muted">charts are not available</p>';
    return;
  }
  const line = (key) => perf.map((p, i) => [i + 1, p[key]]).filter((pt) => pt[1] != null);
  xyChart(box, {
    series: [
      { name: "estimated", color: "#2f6fd0", kind: "line", points: line("estimated") },
      { name: "band low", color: "#9dbbe8", kind: "line", points: line("lower") },
      { name: "band high", color: "#9dbbe8", kind: "line", points: line("upper") },
      { name: "threshold", color: "#c0392b", kind: "line", points: line("threshold") },
      { name: "realised", color: "#2f8a4a", kind: "dots", points: line("realised") },
    ],
    x: { label: "window (in the order checked)" }, y: { label: perf.length ? perf[perf.length - 1].metric || "metric" : "metric" },
    marks: [], height: 220, empty: "no window estimated yet",
  });
}


PAGES.quality = qualityPage;
