// gpufleet serve: the job page (common.js holds the helpers; each page file adds one entry to PAGES).
"use strict";

// ---- job -------------------------------------------------------------------------------------

const OUTCOME_COLOR = { completed: "#2f8a4a", preempted: "#c07a00", requeued: "#c07a00", failed: "#c0392b", lost: "#c0392b", cancelled: "#8a8f98", running: "#2f6fd0" };

function timeline(job, series) {
  const W = 960, H = 70, pad = 40;
  const t0 = job.submitted_at;
  const end = Math.max(Date.now() / 1000, ...job.attempts.map((a) => a.ended_at || 0));
  const span = Math.max(1, (job.state === "running" || job.state === "queued" ? Date.now() / 1000 : Math.max(...job.attempts.map((a) => a.ended_at || end), t0 + 1)) - t0);
  const x = (t) => pad + ((t - t0) / span) * (W - 2 * pad);
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  svg.setAttribute("width", "100%");
  svg.id = "timeline";
  for (const a of job.attempts) {
    const stop = a.ended_at || Date.now() / 1000;
    const r = document.createElementNS(svg.namespaceURI, "rect");
    r.setAttribute("class", "attempt");
    r.setAttribute("x", x(a.started_at));
    r.setAttribute("y", 14);
    r.setAttribute("width", Math.max(2, x(stop) - x(a.started_at)));
    r.setAttribute("height", 30);
    r.setAttribute("fill", OUTCOME_COLOR[a.outcome] || "#8a8f98");
    r.dataset.attempt = a.attempt;
    r.dataset.outcome = a.outcome;
    const ckpts = series.checkpoints.filter((c) => c.attempt === a.attempt);
    hover(r, `attempt ${a.attempt}: ${a.outcome}\n+${dur(a.started_at - t0)} to +${dur(stop - t0)} (${dur(stop - a.started_at)})\n` +
      `exit ${a.exit_code ?? "-"}, ${a.gpus} GPU(s)\n` +
      (ckpts.length ? `checkpoints: ${ckpts.map((c) => `step ${c.step}${c.reason ? ` (${c.reason})` : ""}`).join(", ")}` : "no checkpoint"));
    svg.appendChild(r);
  }
  for (const e of job.events.filter((e) => ["sigterm", "preempted_by", "spot_preempted", "failover", "reclaimed_by"].includes(e.kind))) {
    const m = document.createElementNS(svg.namespaceURI, "path");
    const cx = x(e.ts);
    m.setAttribute("d", `M${cx - 5},4 L${cx + 5},4 L${cx},12 Z`);
    m.setAttribute("fill", "#c0392b");
    m.setAttribute("class", "marker");
    m.dataset.kind = e.kind;
    hover(m, `${e.kind} at +${dur(e.ts - t0)} (attempt ${e.attempt ?? "-"})`);
    svg.appendChild(m);
  }
  const label = document.createElementNS(svg.namespaceURI, "text");
  label.setAttribute("x", pad);
  label.setAttribute("y", H - 8);
  label.textContent = `submitted ${when(t0)}; ${dur(span)} shown`;
  svg.appendChild(label);
  return svg;
}

function lineChart(id, points, key, marks = []) {
  const W = 960, H = 220, pad = 44;
  const pts = points.filter((p) => typeof p[key] === "number" && typeof p.step === "number");
  if (!pts.length || pts.every((p) => p[key] === 0)) return `<p class="muted">no ${esc(key)} logged</p>`;
  const xs = pts.map((p) => p.step), ys = pts.map((p) => p[key]);
  const x0 = Math.min(...xs), x1 = Math.max(...xs, x0 + 1), y0 = Math.min(...ys), y1 = Math.max(...ys, y0 + 1e-9);
  const X = (v) => pad + ((v - x0) / (x1 - x0)) * (W - 2 * pad), Y = (v) => H - pad / 2 - ((v - y0) / (y1 - y0)) * (H - pad);
  const d = pts.map((p, i) => `${i ? "L" : "M"}${X(p.step).toFixed(1)},${Y(p[key]).toFixed(1)}`).join(" ");
  const bad = marks.filter((m) => typeof m.step === "number")
    .map((m) => `<line class="unhealthy" x1="${X(m.step)}" x2="${X(m.step)}" y1="10" y2="${H - pad / 2}" stroke="#c0392b" stroke-dasharray="3,3"><title>unhealthy step ${m.step}: ${esc(m.why || "")}</title></line>`).join("");
  return `<svg id="${id}" viewBox="0 0 ${W} ${H}" width="100%"><path d="${d}" fill="none" stroke="#2f6fd0" stroke-width="1.5"/>${bad}
    <text x="${pad}" y="14">${esc(key)}: ${num(y0, 3)} to ${num(y1, 3)}, steps ${x0} to ${x1}</text></svg>`;
}

function jobPage() {
  const id = boot.job;
  main.innerHTML = `<h1 id="job-title">Job #${id}</h1><div id="job-head" class="cards"></div>
    <div class="actions"><button id="preempt">Preempt</button><button id="hold">Hold</button><button id="release">Release</button>
      <button id="cancel" class="danger">Cancel</button><span id="action-result"></span></div>
    <h2>Attempts</h2><div id="timeline-box"></div><div id="attempts"></div>
    <h2>Loss</h2><div id="loss"></div><h2>Throughput</h2><div id="tps"></div><div id="mfu"></div>
    <h2>Where the time went</h2><div id="goodput"></div>
    <h3>Phases per rank (seconds per step)</h3><div id="rank-phases"></div>
    <h3>Stragglers</h3><div id="stragglers"></div><h3>Hangs</h3><div id="hangs"></div>
    <h2>Checkpoints</h2><div id="ckpts"></div><h2>GPU diagnosis</h2><div id="diagnosis"></div>
    <h2>Events</h2><div id="events"></div>
    <h2>Logs</h2><div id="log-tabs" class="actions"></div><pre class="log" id="log"></pre>
    <h2>Trace</h2><div id="trace"></div>`;
  const out = document.getElementById("action-result");
  document.getElementById("preempt").onclick = () => act(`/api/jobs/${id}/preempt`, {}, out);
  document.getElementById("hold").onclick = () => act(`/api/jobs/${id}/hold`, {}, out);
  document.getElementById("release").onclick = () => act(`/api/jobs/${id}/release`, {}, out);
  document.getElementById("cancel").onclick = () => confirm(`Cancel job #${id} for good?`) && act(`/api/jobs/${id}/cancel`, {}, out);
  let shownAttempts = -1;
  live(async () => {
    const [job, series] = await Promise.all([api(`/api/jobs/${id}`), api(`/api/jobs/${id}/series`)]);
    document.getElementById("job-title").textContent = `Job #${job.id} ${job.name}`;
    document.getElementById("job-head").innerHTML = [
      ["state", state(job.state)], ["team", esc(job.team)], ["step", job.step ?? "-"], ["attempts", job.attempts.length],
      ["GPUs", `${job.gpus}x ${esc(job.gpu_type)}`], ["where", esc(job.offer || job.provider)],
      ...(job.rl ? [["env steps/s", num(job.rl.env_steps_per_s, 0)], ["return (100)", num(job.rl.mean_return_100)]] : []),
    ].map(([k, v]) => `<div class="card"><b data-field="${k}">${v}</b>${k}</div>`).join("");
    const box = document.getElementById("timeline-box");
    box.replaceChildren(timeline(job, series));
    document.getElementById("attempts").innerHTML = table(["attempt", "outcome", "GPUs", "started", "wall", "exit"],
      job.attempts.map((a) => `<tr><td>${a.attempt}</td><td>${state(a.outcome)}</td><td>${a.gpus}</td><td>${when(a.started_at)}</td>
        <td>${dur((a.ended_at || Date.now() / 1000) - a.started_at)}</td><td>${a.exit_code ?? ""}</td></tr>`));
    document.getElementById("loss").innerHTML = lineChart("loss-chart", series.points, "loss", series.unhealthy);
    document.getElementById("tps").innerHTML = lineChart("tps-chart", series.points, "tokens_per_s");
    document.getElementById("mfu").innerHTML = series.points.some((p) => typeof p.mfu === "number") ? lineChart("mfu-chart", series.points, "mfu") : "";
    document.getElementById("ckpts").innerHTML = table(["step", "healthy (manifest)", "problem found", "path"],
      job.checkpoints.map((c) => `<tr><td>${c.step}</td><td>${c.healthy === null ? "-" : c.healthy ? "yes" : "no"}</td>
        <td class="muted">${esc(c.problem || "")}</td><td class="muted" title="${esc(c.path)}">…/${esc(c.path.split("/").slice(-3).join("/"))}</td></tr>`));
    document.getElementById("events").innerHTML = table(["when", "attempt", "event", "detail"],
      job.events.map((e) => `<tr data-kind="${esc(e.kind)}"><td>${when(e.ts)}</td><td>${e.attempt ?? ""}</td><td>${esc(e.kind)}</td>
        <td class="muted">${esc(Object.entries(e).filter(([k]) => !["ts", "attempt", "kind", "path", "sources"].includes(k))
          .map(([k, v]) => `${k}=${typeof v === "object" ? JSON.stringify(v) : v}`).join(" "))}</td></tr>`));
    await api(`/api/jobs/${id}/goodput`).then(timePanel, (err) => {
      document.getElementById("goodput").innerHTML = `<p class="muted">${esc(err.message)}</p>`;
    });
    if (job.attempts.length !== shownAttempts) {
      shownAttempts = job.attempts.length;
      const tabs = document.getElementById("log-tabs");
      tabs.innerHTML = job.attempts.map((a) => `<button data-attempt="${a.attempt}">attempt ${a.attempt}</button>`).join("");
      for (const b of tabs.querySelectorAll("button")) b.onclick = () => showLog(id, b.dataset.attempt);
      if (job.attempts.length) showLog(id, job.attempts[job.attempts.length - 1].attempt);
    }
  });
  api(`/api/jobs/${id}/diagnosis`).then((d) => {
    document.getElementById("diagnosis").innerHTML = `<p class="muted">${esc(d.source)}${d.warnings.map((w) => `; ${esc(w)}`).join("")}</p>` +
      table(["rule", "finding", "evidence", "for", "GPUs", "what to do"], d.findings.map((f) => `<tr><td>${esc(f.rule_id)}</td><td>${esc(f.title)}</td>
        <td>${esc(f.metric)} ${num(f.observed, 3)} ${esc(f.comparison)} ${num(f.threshold, 3)}</td><td>${dur(f.duration_s)}</td>
        <td>${esc((f.gpus || []).join(","))}</td><td class="muted">${esc(f.suggestion || "")}</td></tr>`));
  }).catch((err) => { document.getElementById("diagnosis").innerHTML = `<p class="muted">${esc(err.message.replace(/^[^:]*: \d+ /, ""))}</p>`; });
  api(`/api/jobs/${id}/trace`).then((t) => {
    document.getElementById("trace").innerHTML = table(["span", "start", "duration", "status"],
      t.spans.map((s) => `<tr><td>${s.parent_id ? "&nbsp;&nbsp;" : ""}${esc(s.name)}</td><td>${when(s.start)}</td><td>${dur(s.end - s.start)}</td><td>${esc(s.status)}</td></tr>`));
  }).catch((err) => { document.getElementById("trace").textContent = err.message; });
}

// ---- where the time went ------------------------------------------------------------------------

function timePanel(t) {
  const box = document.getElementById("goodput");
  if (!t.gpu_seconds) {
    box.innerHTML = '<p class="muted">no GPU time billed yet</p>';
  } else {
    const parts = t.buckets.map((b) => ({ key: b.bucket, value: b.gpu_seconds, color: BUCKET_COLOR[b.bucket] || "#999",
      tip: `${b.bucket}: ${num(b.gpu_seconds, 1)} GPU-s (${pct(b.gpu_seconds / t.gpu_seconds)}), ${money(b.money, t.currency)}` }));
    box.innerHTML = `<div class="cards"><div class="card"><b data-field="goodput">${pct(t.goodput)}</b>goodput (compute / billed)</div>
      <div class="card"><b>${num(t.gpu_seconds, 1)}</b>GPU-seconds billed</div><div class="card"><b>${money(t.money, t.currency)}</b>money</div></div>` +
      stackedBars("goodput-bar", [{ label: "all attempts", parts, right: `goodput ${pct(t.goodput)}` }]) +
      table(["bucket", { label: "GPU-s", num: 1 }, { label: "share", num: 1 }, { label: "money", num: 1 }],
        t.buckets.map((b) => `<tr data-bucket="${esc(b.bucket)}"><td><span class="swatch" data-c="${BUCKET_COLOR[b.bucket] || "#999"}"></span>${esc(b.bucket)}</td>
          <td class="num">${num(b.gpu_seconds, 1)}</td><td class="num">${pct(b.gpu_seconds / t.gpu_seconds)}</td><td class="num">${money(b.money, t.currency)}</td></tr>`),
        'id="goodput-legend" class="legend"');
  }
  withTips(box);
  const phasesBox = document.getElementById("rank-phases");
  const r = t.ranks;
  if (!r) {
    phasesBox.innerHTML = '<p class="muted">no phase times reported (the job\'s steps carry no rank_phase_s)</p>';
  } else {
    // collective includes straggler_wait: drawn as its own part so that a bar is the rank's step time
    const shown = t.phases.filter((p) => r.rank_phase_s[p]);
    let rows = Array.from({ length: r.ranks }, (_, rank) => {
      const v = (p) => (r.rank_phase_s[p] ? r.rank_phase_s[p][rank] : 0);
      const parts = shown.map((p) => {
        const value = p === "collective" ? Math.max(0, v(p) - v("straggler_wait")) : v(p);
        return { key: p, value, color: PHASE_COLOR[p] || "#999", tip: `rank ${rank} ${p}${p === "collective" ? " (own, waits excluded)" : ""}: ${num(value, 3)} s per step` };
      });
      const step = parts.reduce((a, p) => a + p.value, 0);
      return { label: `rank ${rank}`, attrs: `data-rank="${rank}"`, parts, step, right: `${num(step, 3)} s/step` };
    });
    const hidden = Math.max(0, rows.length - MAX_RANK_BARS); // a large group: its slowest ranks, in rank order
    if (hidden) {
      const slowest = new Set([...rows].sort((a, b) => b.step - a.step).slice(0, MAX_RANK_BARS));
      rows = rows.filter((row) => slowest.has(row));
    }
    phasesBox.innerHTML = `<p class="muted">attempt ${esc(r.attempt ?? "-")}, at step ${esc(r.step ?? "-")}: ` +
      shown.map((p) => `<span class="swatch" data-c="${PHASE_COLOR[p] || "#999"}"></span>${esc(p)}`).join(" ") + "</p>" +
      stackedBars("rank-phase-bars", rows) + (hidden ? `<p class="muted">the ${MAX_RANK_BARS} slowest of ${r.ranks} ranks shown</p>` : "");
  }
  withTips(phasesBox);
  document.getElementById("stragglers").innerHTML = table(
    ["attempt", "rank", "host", "phase", { label: "factor", num: 1 }, "steps", "status", { label: "tax GPU-s", num: 1 }, { label: "tax money", num: 1 }],
    t.stragglers.map((s) => `<tr data-rank="${s.rank}" data-phase="${esc(s.phase)}"><td>${esc(s.attempt ?? "")}</td><td>${s.rank}</td><td>${esc(s.host)}</td>
      <td>${esc(s.phase)}</td><td class="num">x${num(s.factor, 2)}</td><td>from ${s.first_step}${s.last_step === null ? "" : ` to ${s.last_step}`}</td>
      <td>${esc(s.status)}</td><td class="num">${num(s.tax_gpu_seconds, 1)}</td><td class="num">${money(s.tax_money, t.currency)}</td></tr>`),
    'id="straggler-table"');
  document.getElementById("hangs").innerHTML = table(["when", "attempt", "step", "ranks (phase)", "stuck for", "threshold", "action"],
    t.hangs.map((h) => `<tr><td>${when(h.ts)}</td><td>${esc(h.attempt ?? "")}</td><td>${esc(h.step ?? "")}</td>
      <td>${h.ranks.map((k, i) => `rank ${k} on ${esc(h.hosts[i])} (${esc(h.phases[String(k)])})`).join(", ")}</td>
      <td>${dur(h.seconds)}</td><td>${dur(h.threshold_s)}${h.median_step_s === null ? "" : ` (median step ${num(h.median_step_s, 2)} s)`}</td>
      <td>${esc(h.action || "")}</td></tr>`), 'id="hang-table"');
}

async function showLog(id, attempt) {
  const pre = document.getElementById("log");
  try {
    const l = await api(`/api/jobs/${id}/logs?attempt=${attempt}`);
    pre.textContent = l.log || `(attempt ${attempt} has written nothing)`;
    pre.scrollTop = pre.scrollHeight;
  } catch (err) {
    pre.textContent = err.message;
  }
}


PAGES.job = jobPage;
