// gpufleet serve: the fleet page (common.js holds the helpers; each page file adds one entry to PAGES).
"use strict";

// ---- fleet -----------------------------------------------------------------------------------

const STATE_ORDER = ["running", "queued", "completed", "failed", "cancelled"];

function paramsText(j) { return Object.entries(j.args || {}).map(([k, v]) => `${k}=${paramValue(v)}`).join(" "); }
function failureLine(j) { return (j.failure && j.failure.line) || j.reason || ""; }

// The jobs table's columns: what a header sorts by (value) and what a cell shows (cell, already escaped).
const JOB_COLUMNS = [
  { key: "id", label: "id", num: 1, value: (j) => j.id, cell: (j) => `<a href="/jobs/${j.id}">#${j.id}</a>` },
  { key: "name", label: "name", value: (j) => j.name, cell: (j) => esc(j.name) },
  { key: "team", label: "team", value: (j) => j.team, cell: (j) => esc(j.team) },
  { key: "state", label: "state", value: (j) => STATE_ORDER.indexOf(j.state), cell: (j) => state(j.state) },
  {
    key: "progress", label: "progress", num: 1,
    value: (j) => (j.progress.total_steps ? (j.step || 0) / j.progress.total_steps : j.step),
    cell: (j) => `<span class="step">${j.step ?? ""}</span>` + (j.progress.total_steps
      ? ` / ${j.progress.total_steps} <progress max="${j.progress.total_steps}" value="${Math.min(j.step || 0, j.progress.total_steps)}"></progress>`
      : ""),
  },
  { key: "elapsed", label: "elapsed", num: 1, value: (j) => j.progress.elapsed_s, cell: (j) => dur(j.progress.elapsed_s) },
  { key: "eta", label: "ETA", num: 1, value: (j) => j.progress.eta_s, cell: (j) => (j.progress.eta_s === null ? "" : dur(j.progress.eta_s)) },
  {
    key: "gpus", label: "GPUs in use", num: 1, value: (j) => j.gpus_in_use,
    cell: (j) => `${j.gpus_in_use} / ${j.gpus * j.nodes}x ${esc(j.gpu_type)}`,
  },
  { key: "params", label: "params", value: paramsText, cell: (j) => `<span class="params" title="${esc(paramsText(j))}">${esc(paramsText(j))}</span>` },
  { key: "loss", label: "loss", num: 1, value: (j) => j.progress.loss, cell: (j) => num(j.progress.loss, 3) },
  { key: "tokens_per_s", label: "tokens/s", num: 1, value: (j) => j.progress.tokens_per_s, cell: (j) => num(j.progress.tokens_per_s, 0) },
  { key: "attempts", label: "attempts", num: 1, value: (j) => j.attempts, cell: (j) => String(j.attempts) },
  { key: "why", label: "why", value: failureLine, cell: (j) => `<span class="muted">${esc(failureLine(j))}</span>` },
];

// What the user chose (filter, search, sort) lives in the address, so a poll, a reload or a shared link keeps it.
function jobQuery() {
  const q = new URLSearchParams(location.search);
  return { state: q.get("state") || "", team: q.get("team") || "", search: q.get("q") || "", sort: q.get("sort") || "id", dir: q.get("dir") || "desc" };
}
function setJobQuery(view) {
  const q = new URLSearchParams();
  if (view.state) q.set("state", view.state);
  if (view.team) q.set("team", view.team);
  if (view.search) q.set("q", view.search);
  if (view.sort !== "id" || view.dir !== "desc") { q.set("sort", view.sort); q.set("dir", view.dir); }
  const text = q.toString();
  history.replaceState(null, "", text ? `?${text}` : location.pathname);
}

function compareBy(column, dir) {
  const sign = dir === "asc" ? 1 : -1;
  return (a, b) => {
    const x = column.value(a), y = column.value(b);
    const xn = x === null || x === undefined || x === "", yn = y === null || y === undefined || y === "";
    if (xn || yn) return xn === yn ? b.id - a.id : xn ? 1 : -1; // no value: last, either way
    const c = typeof x === "number" && typeof y === "number" ? x - y : String(x).localeCompare(String(y));
    return c ? sign * c : b.id - a.id;
  };
}
function shownJobs(jobs, view) {
  const words = view.search.trim().toLowerCase();
  const column = JOB_COLUMNS.find((c) => c.key === view.sort) || JOB_COLUMNS[0];
  return jobs
    .filter((j) => !view.state || j.state === view.state)
    .filter((j) => !view.team || j.team === view.team)
    .filter((j) => !words || j.name.toLowerCase().includes(words) || String(j.id) === words.replace(/^#/, ""))
    .sort(compareBy(column, view.dir));
}
function jobsTable(jobs, view) {
  const head = JOB_COLUMNS.map((c) => {
    const sorted = c.key === view.sort ? ` sorted ${view.dir}` : "";
    return `<th class="sortable${c.num ? " num" : ""}${sorted}" data-sort="${c.key}" aria-sort="${sorted ? (view.dir === "asc" ? "ascending" : "descending") : "none"}">${esc(c.label)}</th>`;
  }).join("");
  const rows = jobs.map((j) => `<tr data-job="${j.id}" data-state="${esc(j.state)}">` +
    JOB_COLUMNS.map((c) => `<td class="col-${c.key}${c.num ? " num" : ""}">${c.cell(j)}</td>`).join("") + "</tr>");
  const none = `<tr><td colspan="${JOB_COLUMNS.length}" class="muted">no job matches</td></tr>`;
  return `<table id="fleet-jobs"><thead><tr>${head}</tr></thead><tbody>${rows.join("") || none}</tbody></table>`;
}
function fillTeams(select, teams) {
  const want = ["", ...teams];
  const have = [...select.options].map((o) => o.value);
  if (want.join("\n") === have.join("\n")) return;
  const chosen = select.value;
  select.innerHTML = want.map((t) => `<option value="${esc(t)}">${t ? esc(t) : "all teams"}</option>`).join("");
  select.value = want.includes(chosen) ? chosen : "";
}

// The page lists some jobs (the running, the queue's head, the last ended); the counts are of every job.
function storeCount(teams, view) {
  return Object.entries(teams).filter(([t]) => !view.team || t === view.team)
    .reduce((n, [, c]) => n + (view.state ? c[view.state] || 0 : Object.values(c).reduce((a, b) => a + b, 0)), 0);
}
function countLine(shown, listed, f, view) {
  const matching = listed.filter((j) => (!view.state || j.state === view.state) && (!view.team || j.team === view.team));
  const more = storeCount(f.teams, view) - matching.length;
  const flags = (view.state ? ` --state ${view.state}` : "") + (view.team ? ` --team ${view.team}` : "");
  const which = `${view.state ? `${view.state} ` : ""}job${more === 1 ? "" : "s"}${view.team ? ` of ${view.team}` : ""}`;
  const rest = more > 0 ? `; ${more.toLocaleString("en-US")} more ${which} not listed: gpufleet jobs${flags || " --all"}` : "";
  return `${shown.length} shown of ${listed.length} listed${rest}`;
}

function capacityCard(c) {
  const of = c.source === "fleet" ? "fleet pools" : "local slots";
  const total = c.total === null ? "?" : c.total;
  const more = c.elsewhere ? `<span class="muted">, ${c.elsewhere} more on other backends</span>` : "";
  return `<div class="card" id="capacity"><b>${c.in_use} / ${total}</b>GPUs in use (${of})${more}</div>`;
}
function teamsTable(teams) {
  const seen = new Set(Object.values(teams).flatMap((c) => Object.keys(c)));
  const states = [...STATE_ORDER, ...[...seen].filter((s) => !STATE_ORDER.includes(s)).sort()];
  return table(["team", ...states.map((s) => ({ label: s, num: 1 }))],
    Object.entries(teams).map(([t, c]) => `<tr data-team="${esc(t)}"><td>${esc(t)}</td>` +
      states.map((s) => `<td class="num" data-state="${esc(s)}">${c[s] || 0}</td>`).join("") + "</tr>"), 'id="fleet-teams"');
}
function eventDetail(e) {
  const by = typeof e.by === "number" ? `by <a href="/jobs/${e.by}">#${e.by}</a> ${esc(e.by_name || "")} ` : "";
  const rest = Object.entries(e).filter(([k]) => !["ts", "job", "name", "kind", "attempt", "by", "by_name"].includes(k))
    .map(([k, v]) => `${k}=${typeof v === "object" ? JSON.stringify(v) : v}`).join(" ");
  return by + esc(rest);
}
function recentTable(recent) {
  return table(["when", "job", "event", "detail"],
    recent.slice(0, 20).map((e) => `<tr data-kind="${esc(e.kind)}"><td>${when(e.ts)}</td>
      <td class="job"><a href="/jobs/${e.job}">#${e.job}</a> ${esc(e.name)}</td>
      <td>${esc(e.kind)}</td><td class="muted detail">${eventDetail(e)}</td></tr>`), 'id="fleet-recent"');
}

function fleetPage() {
  main.innerHTML = `<h1>Fleet</h1><div class="cards" id="states"></div>
    <h2>Jobs</h2><div class="filters" id="job-filters">
      <select id="f-state" aria-label="state"><option value="">all states</option>
        ${STATE_ORDER.map((s) => `<option value="${s}">${s}</option>`).join("")}</select>
      <select id="f-team" aria-label="team"><option value="">all teams</option></select>
      <input id="f-search" type="search" placeholder="search name or id" aria-label="search">
      <span id="f-count" class="muted"></span></div>
    <div id="jobs"></div><h2>Queue</h2><div id="queue"></div>
    <h2>Teams</h2><div id="teams"></div><h2>Pools</h2><div id="pools"></div>
    <h2>Recent preemptions, rollbacks and failovers</h2><div id="recent"></div>`;
  const view = jobQuery();
  const [fState, fTeam, fSearch] = ["f-state", "f-team", "f-search"].map((id) => document.getElementById(id));
  fState.value = view.state;
  fSearch.value = view.search;
  let jobs = [];
  let latest = { teams: {} };
  const renderJobs = () => {
    const shown = shownJobs(jobs, view);
    document.getElementById("jobs").innerHTML = jobsTable(shown, view);
    document.getElementById("f-count").textContent = countLine(shown, jobs, latest, view);
  };
  const changed = () => {
    Object.assign(view, { state: fState.value, team: fTeam.value, search: fSearch.value });
    setJobQuery(view);
    renderJobs();
  };
  fState.addEventListener("change", changed);
  fTeam.addEventListener("change", changed);
  fSearch.addEventListener("input", changed);
  document.getElementById("jobs").addEventListener("click", (e) => {
    const th = e.target.closest("th[data-sort]");
    if (!th) return;
    view.dir = view.sort === th.dataset.sort && view.dir === "desc" ? "asc" : "desc";
    view.sort = th.dataset.sort;
    setJobQuery(view);
    renderJobs();
  });
  live(async () => {
    const f = await api("/api/fleet");
    jobs = f.jobs;
    latest = f;
    document.getElementById("states").innerHTML = STATE_ORDER
      .map((s) => `<div class="card" data-state="${s}"><b>${f.states[s] || 0}</b>${s}</div>`).join("") +
      (f.capacity ? capacityCard(f.capacity) : "");
    fillTeams(fTeam, [...new Set([...Object.keys(f.teams), ...(view.team ? [view.team] : [])])].sort());
    fTeam.value = view.team;
    renderJobs();
    document.getElementById("queue").innerHTML = table(["id", "name", "team", "priority", "waits because"],
      f.queue.map((q) => `<tr><td><a href="/jobs/${q.id}">#${q.id}</a></td><td>${esc(q.name)}</td><td>${esc(q.team)}</td>
        <td>${q.priority}</td><td>${esc(q.reason || "waiting for a slot")}</td></tr>`)) +
      (f.queue_total > f.queue.length
        ? `<p class="muted" id="queue-more">${(f.queue_total - f.queue.length).toLocaleString("en-US")} more queued behind these: gpufleet jobs --state queued</p>`
        : "");
    document.getElementById("teams").innerHTML = teamsTable(f.teams);
    const pools = f.fleet && f.fleet.pools ? f.fleet.pools : [];
    document.getElementById("pools").innerHTML = pools.length
      ? table(["pool", { label: "slots", num: 1 }, "state", "jobs"], pools.map((p) => `<tr><td>${esc(p.offer)}</td>
          <td class="num">${p.slots}</td><td>${esc(p.state)}</td><td>${p.jobs.map((j) => `#${j}`).join(", ")}</td></tr>`))
      : '<p class="muted">no fleet file: the local backend runs one pool (gpufleet fleet use FILE)</p>';
    document.getElementById("recent").innerHTML = recentTable(f.recent);
  });
}


PAGES.fleet = fleetPage;
