// gpufleet serve: the fleet page (common.js holds the helpers; each page file adds one entry to PAGES).
"use strict";

// ---- fleet -----------------------------------------------------------------------------------

function fleetPage() {
  main.innerHTML = `<h1>Fleet</h1><div class="cards" id="states"></div>
    <h2>Jobs</h2><div id="jobs"></div><h2>Queue</h2><div id="queue"></div>
    <h2>Teams</h2><div id="teams"></div><h2>Pools</h2><div id="pools"></div>
    <h2>Recent preemptions, rollbacks and failovers</h2><div id="recent"></div>`;
  live(async () => {
    const f = await api("/api/fleet");
    const order = ["running", "queued", "completed", "failed", "cancelled"];
    document.getElementById("states").innerHTML = order
      .map((s) => `<div class="card" data-state="${s}"><b>${f.states[s] || 0}</b>${s}</div>`).join("");
    const jobs = [...f.jobs].sort((a, b) => b.id - a.id);
    document.getElementById("jobs").innerHTML = table(
      ["id", "name", "team", "state", { label: "attempts", num: 1 }, { label: "step", num: 1 }, "GPUs", "why"],
      jobs.map((j) => `<tr data-job="${j.id}"><td><a href="/jobs/${j.id}">#${j.id}</a></td><td>${esc(j.name)}</td>
        <td>${esc(j.team)}</td><td>${state(j.state)}</td><td class="num">${j.attempts}</td>
        <td class="num step">${j.step ?? ""}</td><td>${j.gpus}x ${esc(j.gpu_type)}</td><td class="muted">${esc(j.reason || "")}</td></tr>`),
      'id="fleet-jobs"');
    document.getElementById("queue").innerHTML = table(["id", "name", "team", "priority", "waits because"],
      f.queue.map((q) => `<tr><td><a href="/jobs/${q.id}">#${q.id}</a></td><td>${esc(q.name)}</td><td>${esc(q.team)}</td>
        <td>${q.priority}</td><td>${esc(q.reason || "waiting for a slot")}</td></tr>`));
    document.getElementById("teams").innerHTML = table(["team", ...order],
      Object.entries(f.teams).map(([t, c]) => `<tr><td>${esc(t)}</td>${order.map((s) => `<td class="num">${c[s] || 0}</td>`).join("")}</tr>`));
    const pools = f.fleet && f.fleet.pools ? f.fleet.pools : [];
    document.getElementById("pools").innerHTML = pools.length
      ? table(["pool", { label: "slots", num: 1 }, "state", "jobs"], pools.map((p) => `<tr><td>${esc(p.offer)}</td>
          <td class="num">${p.slots}</td><td>${esc(p.state)}</td><td>${p.jobs.map((j) => `#${j}`).join(", ")}</td></tr>`))
      : '<p class="muted">no fleet file: the local backend runs one pool (gpufleet fleet use FILE)</p>';
    document.getElementById("recent").innerHTML = table(["when", "job", "event", "detail"],
      f.recent.slice(0, 20).map((e) => `<tr><td>${when(e.ts)}</td><td><a href="/jobs/${e.job}">#${e.job}</a> ${esc(e.name)}</td>
        <td>${esc(e.kind)}</td><td class="muted">${esc(Object.entries(e).filter(([k]) => !["ts", "job", "name", "kind", "attempt"].includes(k))
          .map(([k, v]) => `${k}=${typeof v === "object" ? JSON.stringify(v) : v}`).join(" "))}</td></tr>`));
  });
}


PAGES.fleet = fleetPage;
