"""The fleet, sweeps, cost and API pages in a real browser (Debian's headless Chromium, driven by Playwright).

A person's path: on the fleet page, the preemption row names the job preempted and the one that took
its GPU; the Teams table's headers sit over their cells; the jobs list filters by state and team,
searches, sorts by a clicked header, and keeps all of it across a poll and a reload; a running job
shows its progress and ETA. The sweeps page lists the trials and marks the best; the cost page draws
a line per team; the API reference renders with the network cut off. The docs' images come from
``GPUFLEET_SCREENSHOTS=docs/img pytest tests/serve/test_browser_fleet.py`` (serve-fleet, serve-sweeps;
serve-cost comes from real jobs, in ``test_browser_job.py``).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from conftest import screenshot, served
from test_serve_fleet_api import seed_fleet, seed_sweep

from gpufleet.serve.app import ServeConfig, create_app, openapi_document

WAIT_MS = 60_000
"""How long a page may take to show a state: only a safety net on a loaded machine."""


def rows(page: Any) -> list[str]:
    """The jobs list's rows, as their job names in the order shown."""
    names: list[str] = page.eval_on_selector_all(
        "#fleet-jobs tbody tr[data-job] td.col-name", "t => t.map(td => td.textContent)"
    )
    return names


def wait_rows(page: Any, names: list[str]) -> None:
    page.wait_for_function(
        "names => JSON.stringify([...document.querySelectorAll('#fleet-jobs tbody tr[data-job] td.col-name')]"
        ".map(td => td.textContent)) === JSON.stringify(names)",
        arg=names,
        timeout=WAIT_MS,
    )


def polled(page: Any) -> None:
    """Wait until the page has fetched the API again (its ``live`` line changes)."""
    before = page.inner_text("#live")
    page.wait_for_function("t => document.querySelector('#live').textContent !== t", arg=before, timeout=WAIT_MS)


@pytest.mark.timeout(300)
def test_the_fleet_page_names_the_preemptor_aligns_teams_and_keeps_filters(
    home: Path, browser_page: Any, tmp_path: Path
) -> None:
    ids = seed_fleet(home, now=time.time())
    page = browser_page
    with served(create_app(ServeConfig(home=home, token=None, refresh_s=0.5, sync_remote=False))) as url:
        page.goto(url + "/")
        wait_rows(page, ["waiting", "broken", "urgent", "victim"])  # newest first
        victim = page.locator(f'#fleet-jobs tr[data-job="{ids["victim"]}"]')
        assert victim.locator("td.col-progress").text_content().startswith("50 / 100")
        assert victim.locator("td.col-progress progress").get_attribute("value") == "50"
        assert victim.locator("td.col-eta").inner_text().replace(" ", "") in ("50s", "50.0s")
        assert victim.locator("td.col-gpus").inner_text().startswith("1 / 1x")
        assert "lr=0.00125" in victim.locator("td.col-params").inner_text()
        assert page.locator(f'#fleet-jobs tr[data-job="{ids["broken"]}"] td.col-why').inner_text() == "exit code 1"
        assert page.inner_text("#capacity b") == "1 / 1"

        preempted = page.locator('#fleet-recent tr[data-kind="preempted_by"]')
        assert preempted.locator("td.job").inner_text() == f"#{ids['victim']} victim"
        assert preempted.locator("td.detail").inner_text().startswith(f"by #{ids['urgent']} urgent")

        heads = page.eval_on_selector_all("#fleet-teams thead th", "ths => ths.map(th => th.textContent)")
        for row in page.locator("#fleet-teams tbody tr").all():
            cells = row.locator("td")
            assert cells.count() == len(heads)
            for i in range(1, cells.count()):
                assert cells.nth(i).get_attribute("data-state") == heads[i]
        screenshot(page, "serve-fleet", tmp_path)

        page.select_option("#f-team", "nlp")
        wait_rows(page, ["broken", "urgent"])
        page.click('#fleet-jobs th[data-sort="id"]')  # id was sorted newest first: now oldest first
        wait_rows(page, ["urgent", "broken"])
        page.fill("#f-search", "brok")
        wait_rows(page, ["broken"])
        page.fill("#f-search", "")
        page.select_option("#f-team", "")
        page.select_option("#f-state", "running")
        wait_rows(page, ["victim"])
        page.select_option("#f-state", "")
        page.click('#fleet-jobs th[data-sort="progress"]')
        wait_rows(page, ["urgent", "victim", "broken", "waiting"])  # 100, 50 and 5 of 100 steps; none last
        page.fill("#f-search", "u")
        wait_rows(page, ["urgent"])
        polled(page)
        assert rows(page) == ["urgent"]  # a poll redraws the list with the same choices

        page.reload()
        wait_rows(page, ["urgent"])
        assert page.input_value("#f-search") == "u"
        assert page.get_attribute('#fleet-jobs th[data-sort="progress"]', "aria-sort") == "descending"


@pytest.mark.timeout(300)
def test_the_api_reference_renders_every_operation_with_the_network_cut_off(home: Path, browser_page: Any) -> None:
    page = browser_page
    refused: list[str] = []

    def loopback_only(route: Any) -> None:
        if urlsplit(route.request.url).hostname in ("127.0.0.1", "localhost"):
            route.continue_()
        else:
            refused.append(route.request.url)
            route.abort()

    page.route("**/*", loopback_only)
    operations = sum(len(ops) for ops in openapi_document()["paths"].values())
    with served(create_app(ServeConfig(home=home, token=None, sync_remote=False))) as url:
        page.goto(url + "/")
        page.click("nav a:has-text('API')")
        page.wait_for_url(url + "/api/docs")
        page.locator("section.op").first.wait_for(timeout=WAIT_MS)
        assert page.locator("section.op").count() == operations
        jobs = page.locator('section.op[data-method="get"][data-path="/api/jobs"]')
        assert "gpufleet jobs --json" in jobs.inner_text() and "JobsView" in jobs.inner_text()
        page.click('section.op[data-path="/api/jobs"] a[href="#schema-JobsView"]')
        assert page.locator("#schema-JobsView").is_visible()
        page.goto(url + "/docs")
        page.wait_for_url(url + "/api/docs")
    assert refused == []


@pytest.mark.timeout(300)
def test_the_sweeps_page_lists_the_trials_and_marks_the_best(home: Path, browser_page: Any, tmp_path: Path) -> None:
    seed_sweep(home)
    page = browser_page
    with served(create_app(ServeConfig(home=home, token=None, refresh_s=1.0, sync_remote=False))) as url:
        page.goto(url + "/")
        page.click("nav a:has-text('Sweeps')")
        page.wait_for_url(url + "/sweeps")
        page.locator("#trials tr[data-trial]").first.wait_for(timeout=WAIT_MS)
        assert page.locator("#trials tr[data-trial]").count() == 4
        best = page.locator("#trials tr.best")
        assert best.count() == 1 and best.get_attribute("data-trial") == "1"
        assert "best" in best.inner_text() and "2.9" in best.inner_text()
        assert "at step 10" in page.locator('#trials tr[data-state="pruned"]').inner_text()
        series = page.eval_on_selector_all("#sweep-chart [data-series]", "s => s.map(e => e.dataset.series)")
        assert series == ["finished", "pruned (last value)", "best so far"]
        assert page.locator("#sweep-chart circle").count() >= 4
        screenshot(page, "serve-sweeps", tmp_path)


@pytest.mark.timeout(300)
def test_the_cost_page_draws_a_line_of_money_per_team(home: Path, browser_page: Any) -> None:
    seed_fleet(home, now=time.time())
    page = browser_page
    with served(create_app(ServeConfig(home=home, token=None, refresh_s=1.0, sync_remote=False))) as url:
        page.goto(url + "/cost")
        chart = page.locator("#cost-timeline svg")
        chart.wait_for(timeout=WAIT_MS)
        names = page.eval_on_selector_all("#cost-timeline [data-series]", "s => s.map(e => e.dataset.series)")
        assert names == ["nlp", "vision"]
        assert "USD per hour" in (chart.text_content() or "")
        page.select_option("#tl-measure", "gpu_hours")
        page.wait_for_function(
            "() => document.querySelector('#cost-timeline svg').textContent.includes('GPU-hours per hour')",
            timeout=WAIT_MS,
        )
