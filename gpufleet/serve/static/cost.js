// gpufleet serve: the cost page (common.js holds the helpers; each page file adds one entry to PAGES).
"use strict";

// ---- cost ------------------------------------------------------------------------------------

function spotSavings(c) {
  return typeof c.on_demand_money === "number" && typeof c.money === "number" ? c.on_demand_money - c.money : null;
}
const COST_COLUMNS = [{ key: "gpu-time", label: "GPU time" }, { key: "money", label: "money" },
  { key: "useful", label: "useful GPU time" }, { key: "lost", label: "lost GPU time" },
  { key: "overhead", label: "preemption overhead" }, { key: "spot-savings", label: "spot savings" }];
// GPU-hours as the ledger gives them, written as gpufleet.fmt.gpu_time writes them (escaped HTML).
function gpuHours(h) { return typeof h === "number" ? esc(gpuTime(h * 3600)) : "-"; }
function moneyOrDash(v, currency) { return typeof v === "number" ? money(v, currency) : "-"; }
// One ledger row's figures in COST_COLUMNS' order, each with its unit (escaped HTML).
function costFigures(c, currency) {
  return [gpuHours(c.gpu_hours), moneyOrDash(c.money, currency), gpuHours(c.useful_gpu_hours), gpuHours(c.lost_gpu_hours),
    gpuHours(c.preemption_overhead_gpu_hours), moneyOrDash(spotSavings(c), currency)];
}
function costRow(name, c, currency, link) {
  const cells = costFigures(c, currency).map((v, i) => `<td class="num" data-col="${COST_COLUMNS[i].key}">${v}</td>`);
  return `<tr><td>${link ? `<a href="${link}">${esc(name)}</a>` : esc(name)}</td>${cells.join("")}` +
    `<td class="num goodput">${pct(c.goodput)}</td></tr>`;
}
// Each team's GPU-hours by goodput bucket; money on hover at the team's average rate.
function teamBuckets(c) {
  const teams = Object.entries(c.teams).filter(([, v]) => v.buckets && v.gpu_seconds > 0);
  if (!teams.length) return '<p class="muted">no GPU time by bucket in this period</p>';
  const rows = teams.map(([team, v]) => ({
    label: team, attrs: `data-team="${esc(team)}"`, right: `goodput ${pct(v.goodput)}`,
    parts: Object.entries(v.buckets).map(([b, s]) => ({ key: b, value: s / 3600, color: BUCKET_COLOR[b] || "#999",
      tip: `${team} ${b}: ${gpuTime(s)} (${pct(s / v.gpu_seconds)}), ${money(typeof v.money === "number" ? v.money * s / v.gpu_seconds : null, c.currency)}` })),
  }));
  const names = Object.keys(teams[0][1].buckets);
  return stackedBars("team-buckets", rows) + '<p class="muted">' +
    names.map((b) => `<span class="swatch" data-c="${BUCKET_COLOR[b] || "#999"}"></span>${esc(b)}`).join(" ") + "</p>";
}

const TEAM_COLORS = ["#2f6fd0", "#2f8a4a", "#c07a00", "#7a5cc0", "#c0392b", "#4aa3a3", "#d4658a", "#6b8fb5", "#8e2420", "#8a8f98"];

// Each team's money (or GPU-hours) per hour or day, as /api/cost/timeline splits the ledger's attempts.
async function costTimeline(box, period) {
  const bucket = document.getElementById("tl-bucket").value;
  const measure = document.getElementById("tl-measure").value;
  const t = await api(`/api/cost/timeline?period=${period}&bucket=${bucket}`);
  const teams = Object.entries(t.teams);
  box.dataset.teams = String(teams.length);
  if (!teams.length) {
    box.innerHTML = '<p class="muted">no GPU time in this period</p>';
    return;
  }
  if (typeof xyChart !== "function") {
    box.innerHTML = '<p class="muted">charts are not available</p>';
    return;
  }
  const label = measure === "money" ? `${t.currency} per ${t.bucket}` : `GPU-hours per ${t.bucket}`;
  // Each bucket a level from its start to its end: a bucket is a span of time, and one alone still reads as one.
  xyChart(box, {
    series: teams.map(([team, points], i) => ({
      name: team, color: TEAM_COLORS[i % TEAM_COLORS.length], kind: "line",
      points: points.flatMap((p) => {
        const v = measure === "money" ? p.money : p.gpu_hours;
        return [[p.start, v], [p.start + t.bucket_s, v]];
      }),
    })),
    x: { label: `${t.bucket} (UTC buckets)`, time: true }, y: { label, log: false }, marks: [], height: 220,
  });
}

function costPage() {
  main.innerHTML = `<h1>Cost</h1><div class="actions">period <select id="period">
      <option value="24h">last 24 hours</option><option value="7d">last 7 days</option><option value="30d">last 30 days</option>
      <option value="all" selected>all time</option></select></div>
    <div class="cards" id="total"></div><h2>Per team</h2><div id="teams"></div>
    <h2>Where the GPU time went, per team</h2><div id="team-split"></div>
    <h2>Cost over time, per team</h2><div class="actions"><select id="tl-measure" aria-label="measure">
      <option value="money" selected>money</option><option value="gpu_hours">GPU-hours</option></select>
      <select id="tl-bucket" aria-label="bucket"><option value="auto" selected>by hour or day</option>
      <option value="hour">per hour</option><option value="day">per day</option></select></div>
    <div id="cost-timeline" class="chart"></div><h2>Per job</h2><div id="cost-jobs"></div>`;
  const head = [...COST_COLUMNS.map((c) => ({ label: c.label, num: 1 })), { label: "goodput", num: 1 }];
  const sel = document.getElementById("period");
  const render = async () => {
    const c = await api(`/api/cost?period=${sel.value}`);
    const t = c.total || {};
    document.getElementById("total").innerHTML = costFigures(t, c.currency)
      .map((v, i) => `<div class="card"><b data-field="${COST_COLUMNS[i].key}">${v}</b>${COST_COLUMNS[i].label}</div>`).join("") +
      `<div class="card"><b data-field="goodput">${pct(t.goodput)}</b>goodput (compute / billed)</div>`;
    document.getElementById("teams").innerHTML = table(["team", ...head], Object.entries(c.teams).map(([k, v]) => costRow(k, v, c.currency)));
    const split = document.getElementById("team-split");
    split.innerHTML = teamBuckets(c);
    withTips(split);
    document.getElementById("cost-jobs").innerHTML = table(["job", ...head], c.jobs.map((j) => costRow(`#${j.id} ${j.name}`, j, c.currency, `/jobs/${j.id}`)));
    await costTimeline(document.getElementById("cost-timeline"), sel.value);
  };
  sel.onchange = render;
  for (const id of ["tl-measure", "tl-bucket"]) document.getElementById(id).addEventListener("change", () => costTimeline(document.getElementById("cost-timeline"), sel.value));
  live(render);
}


PAGES.cost = costPage;
