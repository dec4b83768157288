"""The job page (``/jobs/{id}``) in a real browser, over jobs the real local scheduler ran.

A small language model trains; a job of higher priority preempts it and runs, so the first job
waits queued, resumes and completes; a third job dies of an injected out-of-memory error. The page
must show, for each: the failure at the top with its log a click away; progress with an ETA while it
runs; a cost card equal to ``/api/jobs/{id}/goodput``; the spec; only the actions its state accepts;
events without nulls or float tails; charts with ticks, tick labels and a hover readout; and the
attempt timeline with its legend and the queued gap before the resumed attempt. The cost page then
shows the two teams' ledgers (the urgent job is another team's) with money and GPU time in their units.
An unknown job is a page that says so (404), not the API's JSON. ``GPUFLEET_SCREENSHOTS=docs/img``
saves ``docs/img/serve-job.png`` (the preempted job, completed) and ``docs/img/serve-cost.png`` from here.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from conftest import follow, http, screenshot, served

from gpufleet.backends.local import LocalBackend
from gpufleet.fmt import money
from gpufleet.jobs.store import latest_step
from gpufleet.serve.app import ServeConfig, create_app
from gpufleet.spec import parse_spec
from gpufleet.workloads.tinylm import TINY

TOKEN = "browser-job-token-" + "j" * 24
WAIT_MS = 120_000
"""How long a page may take to show a state: only a safety net on a loaded machine."""
STEPS = 240


def spec(name: str, *, steps: int, priority: int = 0, max_restarts: int = 10, team: str = "nlp") -> Any:
    return parse_spec(
        {
            "name": name,
            "team": team,
            "entrypoint": "gpufleet.workloads.tinylm:train",
            "args": {**TINY, "steps": steps, "step_seconds": 0.02},
            "resources": {"gpus": 1, "gpu_type": "H100", "cpus": 1},
            "priority": priority,
            "spot": True,
            "checkpoint": {"every_steps": 20, "grace_seconds": 30},
            "max_restarts": max_restarts,
        }
    )


def test_an_unknown_or_malformed_job_is_a_page_that_says_so(home: Path, browser_page: Any) -> None:
    page = browser_page
    with served(create_app(ServeConfig(home=home, token=TOKEN, sync_remote=False))) as url:
        for shown, path in (("999", "999"), ("abc", "abc"), ("0", "0"), ("12", "0012")):
            status, body = http("GET", f"{url}/jobs/{path}")
            assert status == 404 and f"no job {shown}</h1>" in body and 'href="/"' in body, (path, body)
        status, body = http("GET", f"{url}/api/jobs/999")
        assert status == 404 and body["detail"].startswith("no job 999")
        page.goto(f"{url}/jobs/999")
        assert page.locator("#no-job").inner_text() == "no job 999"
        page.click("text=Back to the fleet")
        page.wait_for_url(f"{url}/")


@pytest.mark.timeout(600)
def test_the_job_page_shows_failure_progress_cost_spec_actions_events_charts_and_timeline(
    local_daemon: LocalBackend, home: Path, browser_page: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUFLEET_LOG_EVERY_S", "0.2")
    backend, page = local_daemon, browser_page
    long = backend.submit(spec("charlm", steps=STEPS))
    follow(backend, lambda: (latest_step(backend.store, long) or 0) >= 40)
    with served(create_app(ServeConfig(home=home, token=TOKEN, refresh_s=0.5, sync_remote=False))) as url:
        page.goto(f"{url}/jobs/{long}")  # running: progress with an ETA, Preempt offered
        page.wait_for_function("() => /ETA \\d/.test(document.querySelector('#progress').textContent)", timeout=WAIT_MS)
        assert f"of {STEPS}" in page.locator("#progress-text").inner_text()
        assert page.locator("#preempt").is_enabled() and page.locator("#release").is_disabled()

        urgent = backend.submit(spec("urgent", steps=60, priority=10, team="vision"))  # preempts the running job
        failing = backend.submit(spec("oom", steps=STEPS, max_restarts=0), env={"GPUFLEET_FAULT": "oom@5"})
        follow(backend, lambda: all(backend.store.job(j).state in ("completed", "failed") for j in (long, urgent)))
        follow(backend, lambda: backend.store.job(failing).state == "failed")
        assert len(backend.store.attempts(long)) == 2

        failed_job = http("GET", f"{url}/api/jobs/{failing}")[1]
        page.goto(f"{url}/jobs/{failing}")
        box = page.locator("#failure")
        box.wait_for(timeout=WAIT_MS)
        text = box.inner_text()
        assert "Failed" in text and f"gpufleet logs {failing}" in text, text
        failure = failed_job.get("failure")
        if failure:  # the reason read from the attempt's log
            assert failure["line"] in text and failure["exit"] in text, (failure, text)
        else:
            assert failed_job["reason"] in text, (failed_job["reason"], text)
        cost_y = page.locator("#cost-card").bounding_box()["y"]
        assert box.bounding_box()["y"] < cost_y  # at the top
        page.click("#failure-log")
        page.wait_for_function(
            "() => document.querySelector('#log').textContent.includes('OutOfMemoryError')", timeout=WAIT_MS
        )

        page.goto(f"{url}/jobs/{long}")
        page.locator("#timeline .queued-gap").first.wait_for(timeout=WAIT_MS)
        check_cost_card(page, http("GET", f"{url}/api/jobs/{long}/goodput")[1])
        check_spec_actions_and_events(page)
        check_charts(page)
        check_timeline(page)
        page.mouse.move(0, 0)
        page.evaluate("window.scrollTo(0, 0)")  # the sticky header back at the top of the picture
        screenshot(page, "serve-job", tmp_path)

        page.goto(f"{url}/cost")
        check_cost_page(page, http("GET", f"{url}/api/cost")[1])
        screenshot(page, "serve-cost", tmp_path)


def check_cost_card(page: Any, time: dict[str, Any]) -> None:
    """The cost card shows the API's figures, formatted as the CLI formats money."""
    page.locator('#cost-card [data-field="money"] b').wait_for(timeout=WAIT_MS)

    def value(selector: str) -> float:
        return float(page.locator(selector).get_attribute("data-value"))

    assert value('#cost-card [data-field="gpu-time"] b') == pytest.approx(time["gpu_seconds"])
    assert value('#cost-card [data-field="money"] b') == pytest.approx(time["money"])
    assert page.locator('#cost-card [data-field="money"] b').inner_text() == money(time["money"], time["currency"])
    lost = time["preemption"]
    assert lost["preemptions"] == 1 and lost["gpu_seconds"] > 0
    assert value('#cost-card [data-field="preemption"] b') == pytest.approx(lost["gpu_seconds"])
    shown = page.locator('#cost-card [data-field="preemption"]').inner_text()
    assert money(lost["money"], time["currency"]) in shown and "1 preemption:" in shown, shown
    assert page.locator('#cost-card [data-field="goodput"] b').inner_text() == f"{100 * time['goodput']:.1f}%"
    assert "GPU-s" in page.locator('#cost-card [data-field="gpu-time"] b').inner_text()  # under 0.01 GPU-h


def check_cost_page(page: Any, cost: dict[str, Any]) -> None:
    """The two teams' real ledgers: money as the CLI writes it, GPU time with its unit, goodput above zero,
    and a series per team in the cost over time."""
    page.locator("#cost-timeline svg").wait_for(timeout=WAIT_MS)
    names = page.eval_on_selector_all("#cost-timeline [data-series]", "s => s.map(e => e.dataset.series)")
    assert names == ["nlp", "vision"], names
    total = cost["total"]
    shown = page.locator('#total b[data-field="money"]').inner_text()
    assert shown == money(total["money"], cost["currency"]) and shown.startswith("$"), shown
    assert total["goodput"] > 0 and page.locator('#total b[data-field="goodput"]').inner_text() != "0.0%"
    cells = page.locator('#cost-jobs td[data-col="gpu-time"], #teams td[data-col="gpu-time"]').all_inner_texts()
    assert len(cells) == 5 and all(re.fullmatch(r"[\d.,]+ GPU-(s|h)", c) for c in cells), cells
    figures = page.locator("#total, #teams, #cost-jobs").all_inner_texts()
    assert not [t for t in figures if re.search(r"\de[-+]\d", t)], figures  # no e-notation


def check_spec_actions_and_events(page: Any) -> None:
    """The spec as sentences; a completed job offers no action; events read as lines, nulls dropped."""

    def spec_row(key: str) -> str:
        return str(page.locator(f'#spec tr[data-key="{key}"] td').inner_text())

    assert spec_row("command") == "gpufleet.workloads.tinylm:train"
    assert f"steps={STEPS}" in spec_row("args") and "step_seconds=0.02" in spec_row("args")
    assert spec_row("resources") == "1 x H100 GPU, 1 CPU" and spec_row("team") == "nlp"
    assert spec_row("capacity") == "spot on local" and spec_row("priority").startswith("0 ")
    assert spec_row("checkpoints").startswith("every 20 steps, keep 3")
    for verb in ("preempt", "cancel", "hold", "release"):
        assert page.locator(f"#{verb}").is_disabled(), verb
    assert "only a running job can be preempted" in page.locator("#preempt").get_attribute("title")

    rows = page.locator("#event-table tbody tr")
    assert rows.count() >= 8
    texts = rows.all_inner_texts()
    assert not [t for t in texts if "null" in t or re.search(r"\d\.\d{5,}", t)], texts
    signal = page.locator('#event-table tr[data-kind="preempt_signal"]').inner_text()
    assert re.search(r"SIGTERM at step \d+, saved step \d+ in [\d.]+ (ms|s)", signal), signal
    assert "make room for job #" in page.locator('#event-table tr[data-kind="preempted_by"]').inner_text()


def check_charts(page: Any) -> None:
    """The loss on a log axis (decades) with a linear toggle, tokens/s over clock time, a hover readout."""
    loss = page.locator("#loss-chart")
    loss.wait_for(timeout=WAIT_MS)
    y_ticks = [t for t in loss.locator(".y-axis text.tick").all_text_contents() if t]
    x_ticks = loss.locator(".x-axis text.tick").all_text_contents()
    assert len(y_ticks) >= 2 and len(x_ticks) >= 2 and all(x_ticks), (y_ticks, x_ticks)
    assert all(re.fullmatch(r"[\d.,]+|(\d\u00d7)?10[⁻⁰¹²³⁴⁵⁶⁷⁸⁹]+", t) for t in y_ticks), y_ticks  # no e-notation
    assert "loss (log)" in loss.locator(".y-axis .axis-label").text_content()
    assert loss.locator(".legend-item").count() == 2  # one line per attempt
    loss.evaluate("chart => chart.scrollIntoView({block: 'center'})")  # clear of the sticky header
    loss.locator(".hover-area").hover()
    tip = page.locator("#tip")
    tip.wait_for(state="visible", timeout=WAIT_MS)
    assert re.search(r"step: [\d,]+\nloss: [\d.]+", tip.inner_text()), tip.inner_text()

    page.click('#loss-scale button[data-scale="linear"]')
    page.wait_for_function(
        "() => !document.querySelector('#loss-chart .y-axis .axis-label').textContent.includes('log')",
        timeout=WAIT_MS,
    )
    tps = page.locator("#tps-chart")
    tps.wait_for(timeout=WAIT_MS)
    assert all(re.search(r"\d:\d\d", t) for t in tps.locator(".x-axis text.tick").all_text_contents())  # clock times
    page.click('#loss-scale button[data-scale="log"]')


def check_timeline(page: Any) -> None:
    """A legend of outcomes and the queue; the wait before attempt 2 drawn and hovered as queued."""
    legend = page.locator("#timeline .legend-item")
    assert {legend.nth(i).get_attribute("data-outcome") for i in range(legend.count())} == {
        "preempted",
        "completed",
        "queued",
    }
    assert len(page.locator("#timeline .x-axis text.tick").all_text_contents()) >= 2
    gap = page.locator('#timeline .queued-gap[data-before="2"]')
    page.locator("#timeline").evaluate("chart => chart.scrollIntoView({block: 'center'})")  # clear of the sticky header
    gap.hover()
    tip = page.locator("#tip")
    tip.wait_for(state="visible", timeout=WAIT_MS)
    assert re.match(r"queued [\d.]+ (ms|s|min).* before attempt 2", tip.inner_text()), tip.inner_text()
