// gpufleet serve: the job page (common.js holds the helpers, charts.js the charts; each page file adds one entry to PAGES).
"use strict";

// ---- job -------------------------------------------------------------------------------------

const OUTCOME_COLOR = { completed: "#2f8a4a", preempted: "#c07a00", requeued: "#c07a00", failed: "#c0392b", lost: "#c0392b", cancelled: "#8a8f98", running: "#2f6fd0" };
const SIGNAL_KINDS = ["sigterm", "preempted_by", "spot_preempted", "failover", "reclaimed_by"];
const HIDDEN_FIELDS = ["ts", "attempt", "kind", "path", "sources"];
const ACTIVE_STATES = ["queued", "running"];

// The actions the API offers and the states the backends accept them in (backends/base.py answers 409
// otherwise): each returns "" where the action applies, else why not (the disabled button's tooltip).
const ACTIONS = [
  { verb: "preempt", label: "Preempt", why: (j) => (j.state === "running" ? "" : `only a running job can be preempted; this one is ${j.state}`) },
  {
    verb: "hold", label: "Hold",
    why: (j, held) => (held ? "it is held already" : j.state === "queued" ? ""
      : j.state === "running" ? "only a queued job can be held: preempt it, then hold it" : `only a queued job can be held; this one is ${j.state}`),
  },
  { verb: "release", label: "Release", why: (j, held) => (held && ACTIVE_STATES.includes(j.state) ? "" : "it is not held") },
  { verb: "cancel", label: "Cancel", danger: true, why: (j) => (ACTIVE_STATES.includes(j.state) ? "" : `it has ended: ${j.state}`) },
];

function isHeld(job) {
  const last = job.events.filter((e) => e.kind === "held" || e.kind === "released").pop();
  return Boolean(last && last.kind === "held");
}

function clock(ts) { return new Date(ts * 1000).toLocaleTimeString(); }
function attemptsOf(job) { return [...job.attempts].sort((a, b) => a.attempt - b.attempt); }

// ---- the attempt timeline --------------------------------------------------------------------

// Each attempt a bar from its start to its end, the waits before and between attempts hatched and
// labelled "queued", the signals that ended attempts marked above, on a clock-time axis.
function timeline(job, series, now) {
  const W = 960, H = 104, left = 16, right = W - 16, barY = 28, barH = 28, axisY = barY + barH + 6;
  const attempts = attemptsOf(job);
  const t0 = Math.min(job.submitted_at, ...attempts.map((a) => a.started_at));
  const ends = attempts.map((a) => a.ended_at ?? now);
  const t1 = Math.max(t0 + 1, ACTIVE_STATES.includes(job.state) ? now : Math.max(t0 + 1, ...ends));
  const X = (t) => left + ((t - t0) / (t1 - t0)) * (right - left);
  const parts = [];
  const gaps = [];
  let waitingSince = job.submitted_at;
  for (const a of attempts) {
    if (a.started_at > waitingSince) gaps.push({ from: waitingSince, to: a.started_at, before: a.attempt });
    waitingSince = a.ended_at ?? now;
  }
  if (job.state === "queued" && now > waitingSince) gaps.push({ from: waitingSince, to: now, before: null });
  for (const g of gaps) {
    const x = X(g.from), w = Math.max(1, X(g.to) - x);
    const tipText = `queued ${dur(g.to - g.from)}${g.before ? ` before attempt ${g.before}` : ", waiting now"}\n${clock(g.from)} to ${clock(g.to)}`;
    parts.push(`<g class="queued-gap" data-before="${g.before ?? ""}" data-tip="${esc(tipText)}"><rect x="${x.toFixed(1)}" y="${barY}" width="${w.toFixed(1)}" height="${barH}" fill="url(#queued-hatch)"></rect>` +
      (w >= 48 ? `<text x="${(x + w / 2).toFixed(1)}" y="${barY + barH / 2 + 4}" text-anchor="middle">queued</text>` : "") + "</g>");
  }
  for (const a of attempts) {
    const stop = a.ended_at ?? now;
    const ckpts = series.checkpoints.filter((c) => c.attempt === a.attempt);
    const tipText = `attempt ${a.attempt}: ${a.outcome}\n${clock(a.started_at)} to ${a.ended_at ? clock(stop) : "now"} (${dur(stop - a.started_at)})\n` +
      `exit ${a.exit_code ?? "-"}, ${a.gpus} GPU(s)\n` +
      (ckpts.length ? `checkpoints: ${ckpts.map((c) => `step ${c.step}${c.reason && c.reason !== "periodic" ? ` (${c.reason})` : ""}`).join(", ")}` : "no checkpoint");
    parts.push(`<rect class="attempt" data-attempt="${a.attempt}" data-outcome="${esc(a.outcome)}" data-tip="${esc(tipText)}" x="${X(a.started_at).toFixed(1)}" y="${barY}" ` +
      `width="${Math.max(2, X(stop) - X(a.started_at)).toFixed(1)}" height="${barH}" fill="${OUTCOME_COLOR[a.outcome] || "#8a8f98"}"></rect>`);
  }
  for (const e of job.events.filter((ev) => SIGNAL_KINDS.includes(ev.kind))) {
    const cx = X(e.ts);
    parts.push(`<path class="marker" data-kind="${esc(e.kind)}" data-tip="${esc(`${e.kind} at ${clock(e.ts)} (attempt ${e.attempt ?? "-"})`)}" ` +
      `d="M${(cx - 5).toFixed(1)},${barY - 9} L${(cx + 5).toFixed(1)},${barY - 9} L${cx.toFixed(1)},${barY - 1} Z" fill="#c0392b"></path>`);
  }
  const { ticks, step } = timeTicks(t0, t1, 8);
  const axis = `<g class="x-axis"><line class="axis" x1="${left}" x2="${right}" y1="${axisY}" y2="${axisY}"></line>` +
    ticks.map((t) => `<line class="axis" x1="${X(t).toFixed(1)}" x2="${X(t).toFixed(1)}" y1="${axisY}" y2="${axisY + 4}"></line>` +
      `<text class="tick" x="${X(t).toFixed(1)}" y="${axisY + 16}" text-anchor="${tickAnchor(X(t), left, right)}">${esc(timeLabel(t, step))}</text>`).join("") +
    `<text class="axis-label" x="${left}" y="${H - 6}">submitted ${esc(when(job.submitted_at))}; local time</text></g>`;
  const outcomes = [...new Set(attempts.map((a) => a.outcome))];
  const keys = [...outcomes.map((o) => ({ key: o, fill: OUTCOME_COLOR[o] || "#8a8f98" })), ...(gaps.length ? [{ key: "queued", fill: "url(#queued-hatch)" }] : [])];
  let lx = left;
  const legend = keys.map((k) => {
    const item = `<g class="legend-item" data-outcome="${esc(k.key)}"><rect x="${lx}" y="5" width="12" height="12" fill="${k.fill}"></rect><text x="${lx + 16}" y="15">${esc(k.key)}</text></g>`;
    lx += 28 + 7 * k.key.length;
    return item;
  }).join("");
  const hatch = '<defs><pattern id="queued-hatch" patternUnits="userSpaceOnUse" width="6" height="6" patternTransform="rotate(45)">' +
    '<rect width="6" height="6" fill="#eef0f3"></rect><line x1="0" y1="0" x2="0" y2="6" stroke="#b0b7c3" stroke-width="2"></line></pattern></defs>';
  return `<svg id="timeline" class="timeline" viewBox="0 0 ${W} ${H}" width="100%">${hatch}<g class="legend">${legend}</g>${parts.join("")}${axis}</svg>`;
}

// ---- the curves ------------------------------------------------------------------------------

function byAttempt(points, x, y) {
  const out = new Map();
  for (const p of points) {
    if (!out.has(p.attempt)) out.set(p.attempt, []);
    out.get(p.attempt).push([x(p), y(p)]);
  }
  return [...out.entries()].map(([n, pts]) => ({ name: `attempt ${n ?? "-"}`, points: pts, kind: "line" }));
}

// A figure the runtime logs as 0 when it does not know it (tokens/s of a job without tokens) is not charted.
function logged(points, key) { return points.some((p) => typeof p[key] === "number" && p[key] !== 0); }

function drawCharts(series, lossLog) {
  const marks = [
    ...series.unhealthy.map((u) => ({ x: u.step, label: "unhealthy", color: "#c0392b" })),
    ...series.rollbacks.map((r) => ({ x: r.from_step, label: `rollback to ${r.to_step}`, color: "#7a5cc0" })),
  ];
  xyChart(document.getElementById("loss"), {
    id: "loss-chart", series: byAttempt(series.points, (p) => p.step, (p) => p.loss),
    x: { label: "step" }, y: { label: "loss", log: lossLog }, marks, height: 220, empty: "no loss logged yet",
  });
  const tps = logged(series.points, "tokens_per_s") ? byAttempt(series.points, (p) => p.ts, (p) => p.tokens_per_s) : [];
  xyChart(document.getElementById("tps"), {
    id: "tps-chart", series: tps, x: { label: "time", time: true }, y: { label: "tokens/s" }, empty: "no tokens/s logged (the job reports none)",
  });
  const mfu = logged(series.points, "mfu") ? byAttempt(series.points, (p) => p.ts, (p) => 100 * p.mfu) : [];
  xyChart(document.getElementById("mfu"), {
    id: "mfu-chart", series: mfu, x: { label: "time", time: true }, y: { label: "MFU (%)" }, empty: "no MFU logged (the job reports none)",
  });
}

// ---- the panels ------------------------------------------------------------------------------

function failureBox(job) {
  const f = job.failure && typeof job.failure === "object" ? job.failure : null;
  if (!f && job.state !== "failed") return "";
  const last = attemptsOf(job).pop();
  const attempt = f && f.attempt ? f.attempt : last ? last.attempt : null;
  const line = (f && f.line) || job.reason || "the job failed";
  const exit = f && f.exit ? f.exit : last && last.exit_code !== null ? `exit code ${last.exit_code}` : "";
  const hint = (f && f.hint) || `gpufleet logs ${job.id}`;
  const title = job.state === "failed" ? "Failed" : `Attempt ${attempt} failed`;
  return `<div id="failure" class="failure" role="alert"><b>${esc(title)}:</b> <code class="failure-line">${esc(line)}</code>` +
    `<div class="failure-more">${exit && exit !== line ? `${esc(exit)}; ` : ""}see <code>${esc(hint)}</code>` +
    (attempt ? ` <button id="failure-log" data-attempt="${attempt}">Show attempt ${attempt}'s log</button>` : "") + "</div></div>";
}

function actionButtons(job) {
  const held = isHeld(job);
  return ACTIONS.map((a) => {
    const why = a.why(job, held);
    return `<span class="action" title="${esc(why)}"><button id="${a.verb}" data-verb="${a.verb}"${a.danger ? ' class="danger"' : ""}${why ? ` disabled title="${esc(why)}"` : ""}>${a.label}</button></span>`;
  }).join("");
}

function progressLine(job, p) {
  const attempts = job.attempts.length;
  if (!attempts) return '<span class="muted">queued: not started yet</span>';
  const step = job.step ?? 0, total = p.total_steps;
  const bar = total ? `<progress id="progress-bar" max="${total}" value="${Math.min(step, total)}"></progress>` : "";
  const done = total ? ` of ${total} (${pct(Math.min(1, step / total))})` : " (the job did not say how many it runs)";
  const bits = [
    p.steps_per_s ? `${num(p.steps_per_s, 1)} steps/s` : "",
    p.elapsed_s !== null && p.elapsed_s !== undefined ? `${job.state === "running" ? "elapsed" : "took"} ${dur(p.elapsed_s)}` : "",
    p.eta_s !== null && p.eta_s !== undefined ? `ETA ${dur(p.eta_s)} (${clock(Date.now() / 1000 + p.eta_s)})` : "",
  ].filter(Boolean);
  return `${bar}<span id="progress-text">step ${step}${done}</span><span class="muted">${esc(bits.join(" · "))}</span>`;
}

function costCards(t) {
  if (!t || t.error) return `<p class="muted">${esc(t ? t.error : "")}</p>`;
  const p = t.preemption || { preemptions: 0, killed: 0, gpu_seconds: 0, money: null, share: 0 };
  const restarts = p.preemptions + p.killed;
  const card = (field, value, shown, label) => `<div class="card" data-field="${field}"><b data-value="${value ?? ""}">${shown}</b>${label}</div>`;
  return card("gpu-time", t.gpu_seconds, esc(gpuTime(t.gpu_seconds)), "GPU time billed") +
    card("money", t.money, money(t.money, t.currency), "money") +
    `<div class="card" data-field="preemption"><b data-value="${p.gpu_seconds}">${esc(gpuTime(p.gpu_seconds))}</b>` +
    `<span data-field="preemption-money" data-value="${p.money ?? ""}">${money(p.money, t.currency)}</span> ` +
    (restarts ? `lost to ${restarts} preemption${restarts === 1 ? "" : "s"}${p.killed ? ` (${p.killed} killed)` : ""}: redone work and restarts, ${pct(p.share)} of the GPU time`
      : "lost to preemptions: none happened") + "</div>" +
    card("goodput", t.goodput, pct(t.goodput), "goodput (compute / billed)");
}

function argValue(v) {
  if (typeof v === "number") return Number.isInteger(v) ? String(v) : v.toLocaleString("en-US", { maximumSignificantDigits: 6, useGrouping: false });
  return typeof v === "object" && v !== null ? JSON.stringify(v) : String(v);
}

// The spec's parts a person checks first, as sentences; env values are never served (names only).
function specRows(s) {
  const r = s.resources, c = s.checkpoint, d = s.distributed;
  const every = [c.every === "auto" ? "at the interval the planner picks" : "", c.every_steps ? `every ${c.every_steps} steps` : "", c.every_seconds ? `every ${dur(c.every_seconds)}` : ""].filter(Boolean).join(" and ");
  const memory = s.placement && s.placement.memory_gib ? `, ${num(s.placement.memory_gib, 1)} GiB of GPU memory` : "";
  const rows = [
    ["command", `<code>${esc(Array.isArray(s.entrypoint) ? s.entrypoint.join(" ") : s.entrypoint)}</code>`],
    ["args", Object.entries(s.args || {}).map(([k, v]) => `<code>${esc(k)}=${esc(argValue(v))}</code>`).join(" ") || '<span class="muted">none</span>'],
    ["resources", esc(`${r.nodes > 1 ? `${r.nodes} nodes x ` : ""}${r.gpus} x ${r.gpu_type} GPU${r.gpus === 1 ? "" : "s"}, ${r.cpus} CPU${r.cpus === 1 ? "" : "s"}${memory}`)],
    ["team", esc(s.team)],
    ["priority", esc(`${s.priority} (higher preempts lower)`)],
    ["capacity", esc(`${s.spot ? "spot" : "on-demand"} on ${s.provider}`)],
    ["checkpoints", esc(`${every || "only when asked"}, keep ${c.keep}, ${dur(c.grace_seconds)} to save at a preemption${c.async ? ", saved in the background" : ""}${c.memory ? ", a memory tier" : ""}`)],
    ["restarts", esc(`at most ${s.max_restarts}; resume ${s.resume}`)],
  ];
  if (d && d.strategy && d.strategy !== "none") rows.push(["distributed", esc(`${d.strategy} via ${d.launcher}${d.recovery ? `, recovery ${d.recovery}` : ""}`)]);
  if (s.workdir) rows.push(["workdir", `<code>${esc(s.workdir)}</code>`]);
  const env = Object.keys(s.env || {});
  if (env.length) rows.push(["env", `${env.map((k) => `<code>${esc(k)}</code>`).join(" ")} <span class="muted">(values not shown)</span>`]);
  return rows.map(([k, v]) => `<tr data-key="${k}"><th>${k}</th><td>${v}</td></tr>`).join("");
}

// ---- events ----------------------------------------------------------------------------------

// A value as a person reads it: durations with units, numbers without a float's tail, no nulls.
function fieldText(key, v) {
  if (typeof v === "number") return /(^|_)(seconds|s)$|_s$|^grace$/.test(key) ? dur(v) : Number.isInteger(v) ? String(v) : num(v, 3);
  if (typeof v === "boolean") return v ? "yes" : "no";
  return typeof v === "object" ? JSON.stringify(v) : String(v);
}

function genericText(e) {
  return Object.entries(e).filter(([k, v]) => !HIDDEN_FIELDS.includes(k) && v !== null && v !== undefined && v !== "")
    .map(([k, v]) => `${k.replace(/_/g, " ")} ${fieldText(k, v)}`).join(", ");
}

// One line per kind a person meets most; any other kind lists its fields (nulls dropped, seconds rounded).
const EVENT_TEXT = {
  queued: () => "queued",
  attempt_start: (e) => `started${e.gpus ? ` on ${e.gpus} GPU${e.gpus === 1 ? "" : "s"}` : ""}${e.world_size > 1 ? `, ${e.world_size} ranks` : ""}`,
  restore: (e) => (typeof e.step === "number" ? `restored step ${e.step}${e.tier ? ` from ${e.tier}` : ""} in ${dur(e.seconds)}` : "no checkpoint to restore: started from step 0"),
  preempted_by: (e) => (typeof e.job === "number" ? `preempted to make room for job #${e.job}` : "preempted"),
  sigterm: (e) => `SIGTERM sent${e.reason ? ` (${e.reason})` : ""}${typeof e.grace === "number" ? `: ${dur(e.grace)} to save` : ""}`,
  preempt_signal: (e, saves) => {
    const save = saves.find((c) => c.attempt === e.attempt && c.reason === "preempt");
    const saved = save ? `, saved step ${save.step}${typeof save.seconds === "number" ? ` in ${dur(save.seconds)}` : ""}` : ", nothing saved";
    return `${e.signal || "signal"} at step ${e.step ?? "-"}${saved}`;
  },
  attempt_end: (e) => `attempt ended: ${e.outcome || "?"}${typeof e.exit_code === "number" ? ` (exit ${e.exit_code})` : ""}`,
  requeued: () => "requeued: resumes from its last checkpoint",
  held: () => "held: it does not start until released",
  released: () => "released: it starts in its turn",
  unhealthy: (e) => `unhealthy step ${e.step ?? "-"}${e.why || e.reason ? `: ${e.why || e.reason}` : ""}`,
  rollback: (e) => `rolled back from step ${e.from_step ?? "-"} to ${e.to_step ?? "-"}`,
  completed: () => "completed",
  failed: (e) => (genericText(e) ? `failed: ${genericText(e)}` : "failed"),
  cancelled: () => "cancelled",
};

function eventRows(job, series) {
  return job.events.map((e) => {
    const text = EVENT_TEXT[e.kind] ? EVENT_TEXT[e.kind](e, series.checkpoints) : genericText(e);
    return `<tr data-kind="${esc(e.kind)}"><td>${esc(clock(e.ts))}</td><td>${e.attempt ?? ""}</td><td>${esc(e.kind.replace(/_/g, " "))}</td><td>${esc(text)}</td></tr>`;
  });
}

// ---- the page --------------------------------------------------------------------------------

function jobPage() {
  const id = boot.job;
  main.innerHTML = `<h1 id="job-title">Job #${id}</h1><div id="failure-box"></div>
    <div class="actions" id="actions"></div><span id="action-result"></span>
    <div id="job-head" class="cards"></div>
    <div id="progress" class="progress"></div>
    <h2>Cost</h2><div id="cost-card" class="cards"></div>
    <h2>Attempts</h2><div id="timeline-box"></div><div id="attempts"></div>
    <h2>Loss</h2><div class="actions" id="loss-scale"><button data-scale="log">log</button><button data-scale="linear">linear</button></div><div id="loss"></div>
    <h2>Throughput</h2><div id="tps"></div><h3>MFU</h3><div id="mfu"></div>
    <h2>Spec</h2><table id="spec" class="kv"></table>
    <h2>Where the time went</h2><div id="goodput"></div>
    <h3>Phases per rank (seconds per step)</h3><div id="rank-phases"></div>
    <h3>Stragglers</h3><div id="stragglers"></div><h3>Hangs</h3><div id="hangs"></div>
    <h2>Checkpoints</h2><div id="ckpts"></div><h2>GPU diagnosis</h2><div id="diagnosis"></div>
    <h2>Events</h2><div id="events"></div>
    <h2>Logs</h2><div id="log-tabs" class="actions"></div><pre class="log" id="log"></pre>
    <h2>Trace</h2><div id="trace"></div>`;
  const out = document.getElementById("action-result");
  let lossLog = true, drawn = "", drawnTimeline = null, shownAttempts = -1, last = null;
  const scaleButtons = () => {
    for (const b of document.querySelectorAll("#loss-scale button")) b.classList.toggle("here", (b.dataset.scale === "log") === lossLog);
  };
  for (const b of document.querySelectorAll("#loss-scale button")) {
    b.addEventListener("click", () => {
      lossLog = b.dataset.scale === "log";
      scaleButtons();
      if (last) drawCharts(last, lossLog);
    });
  }
  scaleButtons();
  document.getElementById("actions").addEventListener("click", async (e) => {
    const b = e.target.closest("button[data-verb]");
    if (!b || b.disabled) return;
    if (b.dataset.verb === "cancel" && !confirm(`Cancel job #${id} for good?`)) return;
    if (await act(`/api/jobs/${id}/${b.dataset.verb}`, {}, out)) refresh();
  });
  document.getElementById("failure-box").addEventListener("click", (e) => {
    const b = e.target.closest("#failure-log");
    if (!b) return;
    showLog(id, b.dataset.attempt);
    document.getElementById("log").scrollIntoView({ block: "center" });
  });

  const refresh = async () => {
    const [job, series, time] = await Promise.all([
      api(`/api/jobs/${id}`), api(`/api/jobs/${id}/series`), api(`/api/jobs/${id}/goodput`).catch((err) => ({ error: err.message })),
    ]);
    const now = Date.now() / 1000;
    last = series;
    document.getElementById("job-title").innerHTML = `Job #${job.id} ${esc(job.name)} ${state(job.state)}`;
    document.getElementById("failure-box").innerHTML = failureBox(job);
    document.getElementById("actions").innerHTML = actionButtons(job);
    document.getElementById("job-head").innerHTML = [
      ["team", esc(job.team)], ["step", job.step ?? "-"], ["attempts", job.attempts.length],
      ["GPUs", `${job.gpus}x ${esc(job.gpu_type)}`], ["where", esc(job.offer || job.provider)],
      ...(job.rl ? [["env steps/s", num(job.rl.env_steps_per_s, 0)], ["return (100)", num(job.rl.mean_return_100)]] : []),
    ].map(([k, v]) => `<div class="card"><b data-field="${k}">${v}</b>${k}</div>`).join("");
    document.getElementById("progress").innerHTML = progressLine(job, series.progress || {});
    document.getElementById("cost-card").innerHTML = costCards(time);
    // an ended job's timeline is drawn once: redrawing it under the cursor would drop the hover
    const shape = ACTIVE_STATES.includes(job.state) ? now : JSON.stringify([job.state, job.attempts, job.events.length, series.checkpoints.length]);
    if (shape !== drawnTimeline) {
      drawnTimeline = shape;
      const box = document.getElementById("timeline-box");
      box.innerHTML = timeline(job, series, now);
      for (const el of box.querySelectorAll("[data-tip]")) hover(el, el.dataset.tip);
    }
    document.getElementById("attempts").innerHTML = table(["attempt", "outcome", "GPUs", "started", "wall", "exit"],
      attemptsOf(job).map((a) => `<tr><td>${a.attempt}</td><td>${state(a.outcome)}</td><td>${a.gpus}</td><td>${when(a.started_at)}</td>
        <td>${dur((a.ended_at ?? now) - a.started_at)}</td><td>${a.exit_code ?? ""}</td></tr>`));
    const signature = `${series.points.length}:${series.points.length ? series.points[series.points.length - 1].ts : ""}`;
    if (signature !== drawn) {
      drawn = signature;
      drawCharts(series, lossLog);
    }
    document.getElementById("spec").innerHTML = specRows(job.spec);
    document.getElementById("ckpts").innerHTML = table(["step", "healthy (manifest)", "problem found", "path"],
      job.checkpoints.map((c) => `<tr><td>${c.step}</td><td>${c.healthy === null ? "-" : c.healthy ? "yes" : "no"}</td>
        <td class="muted">${esc(c.problem || "")}</td><td class="muted" title="${esc(c.path)}">…/${esc(c.path.split("/").slice(-3).join("/"))}</td></tr>`));
    document.getElementById("events").innerHTML = table(["time", "attempt", "event", "what happened"], eventRows(job, series), 'id="event-table"');
    if (time && !time.error) timePanel(time);
    else document.getElementById("goodput").innerHTML = `<p class="muted">${esc(time ? time.error : "")}</p>`;
    if (job.attempts.length !== shownAttempts) {
      shownAttempts = job.attempts.length;
      const tabs = document.getElementById("log-tabs");
      tabs.innerHTML = attemptsOf(job).map((a) => `<button data-attempt="${a.attempt}">attempt ${a.attempt}</button>`).join("");
      for (const b of tabs.querySelectorAll("button")) b.addEventListener("click", () => showLog(id, b.dataset.attempt));
      if (job.attempts.length) showLog(id, attemptsOf(job).pop().attempt);
    }
  };
  live(refresh);
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
    box.innerHTML = stackedBars("goodput-bar", [{ label: "all attempts", parts, right: `goodput ${pct(t.goodput)}` }]) +
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
  for (const b of document.querySelectorAll("#log-tabs button")) b.classList.toggle("here", b.dataset.attempt === String(attempt));
  try {
    const l = await api(`/api/jobs/${id}/logs?attempt=${attempt}`);
    pre.textContent = l.log || `(attempt ${attempt} has written nothing)`;
    pre.scrollTop = pre.scrollHeight;
  } catch (err) {
    pre.textContent = err.message;
  }
}


PAGES.job = jobPage;
PAGES.missing = () => {}; // the server wrote the whole page (no job to show): nothing to load
