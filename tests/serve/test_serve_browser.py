"""``gpufleet serve``'s pages in a real browser (Debian's headless Chromium, driven by Playwright).

A person's path: the fleet page's step counter advances without a reload; the job page refuses a
preemption without the token, accepts it with the token, and its timeline then shows the preempted
attempt, hovered; the cost page lists the job; the quality page, after ``gpufleet quality demo
--worse``, shows the rollback. The quality page is saved as a screenshot (the docs' images come
from ``GPUFLEET_SCREENSHOTS=docs/img pytest tests/serve/test_serve_browser.py``; the job page's from
``tests/serve/test_browser_job.py``, with the cost page's, the fleet and sweeps pages' from
``tests/serve/test_browser_fleet.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import follow, run_cli, screenshot, served

from gpufleet.backends.local import LocalBackend
from gpufleet.jobs.store import latest_step
from gpufleet.serve.app import ServeConfig, create_app
from gpufleet.spec import parse_spec

TOKEN = "browser-test-token-" + "k" * 24
WAIT_MS = 120_000
"""How long a page may take to show a state: only a safety net on a loaded machine."""


def long_job(name: str) -> Any:
    return parse_spec(
        {
            "name": name,
            "team": "vision",
            "entrypoint": "gpufleet.workloads.toy:train",
            "args": {"steps": 100_000, "step_seconds": 0.02},
            "resources": {"gpus": 1, "gpu_type": "H100", "cpus": 1},
            "spot": True,
            "checkpoint": {"every_steps": 20, "grace_seconds": 30},
        }
    )


@pytest.mark.timeout(600)
def test_fleet_live_job_timeline_preempt_with_the_token_and_cost(
    local_daemon: LocalBackend, home: Path, browser_page: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUFLEET_LOG_EVERY_S", "0.2")
    backend, page = local_daemon, browser_page
    done = backend.submit(parse_spec({**long_job("warmup").model_dump(), "args": {"steps": 30, "step_seconds": 0}}))
    follow(backend, lambda: backend.store.job(done).state == "completed")
    job = backend.submit(long_job("resnet-like"))
    follow(backend, lambda: (latest_step(backend.store, job) or 0) >= 1)
    with served(create_app(ServeConfig(home=home, token=TOKEN, refresh_s=0.5, sync_remote=False))) as url:
        page.goto(url + "/")
        step = page.locator(f'#fleet-jobs tr[data-job="{job}"] .step')
        step.wait_for(timeout=WAIT_MS)
        page.wait_for_function(
            f"() => Number(document.querySelector('#fleet-jobs tr[data-job=\"{job}\"] .step').textContent) > 0",
            timeout=WAIT_MS,
        )
        first = int(step.inner_text())
        page.evaluate("window.__notReloaded = true")
        page.wait_for_function(
            f"() => Number(document.querySelector('#fleet-jobs tr[data-job=\"{job}\"] .step').textContent) > {first}",
            timeout=WAIT_MS,
        )
        assert page.evaluate("window.__notReloaded") is True  # the same document: updated in place
        assert page.locator('.card[data-state="running"] b').inner_text() == "1"

        page.click(f'#fleet-jobs tr[data-job="{job}"] a')
        page.wait_for_url(f"{url}/jobs/{job}")
        page.locator("#timeline rect.attempt").first.wait_for(timeout=WAIT_MS)
        page.click("#preempt")  # no token yet
        page.wait_for_function(
            "() => document.querySelector('#action-result').textContent.includes('refused (401)')", timeout=WAIT_MS
        )
        assert len(backend.store.attempts(job)) == 1
        page.fill("#token", TOKEN)
        page.click("#preempt")
        page.wait_for_function(
            "() => document.querySelector('#action-result').textContent.startsWith('done')", timeout=WAIT_MS
        )
        follow(backend, lambda: len(backend.store.attempts(job)) == 2, timeout=180)
        preempted = page.locator('#timeline rect.attempt[data-outcome="preempted"]')
        preempted.wait_for(timeout=WAIT_MS)
        page.locator('#timeline rect.attempt[data-attempt="2"]').wait_for(timeout=WAIT_MS)
        preempted.hover()
        tip = page.locator("#tip")
        tip.wait_for(state="visible", timeout=WAIT_MS)
        assert "attempt 1: preempted" in tip.inner_text() and "checkpoints: step" in tip.inner_text()
        assert page.locator('#events tr[data-kind="sigterm"]').count() >= 1
        page.locator("#loss-chart path").first.wait_for(timeout=WAIT_MS)

        page.goto(url + "/cost")
        page.locator("#cost-jobs a", has_text=f"#{job} resnet-like").wait_for(timeout=WAIT_MS)
        page.select_option("#period", "24h")
        page.locator("#cost-jobs a", has_text=f"#{done} warmup").wait_for(timeout=WAIT_MS)


@pytest.mark.timeout(600)
def test_the_quality_page_shows_the_demos_rollback(
    home: Path,
    browser_page: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("GPUFLEET_USER", "browser-test")
    code, _, err = run_cli(capsys, monkeypatch, "quality", "demo", "--worse", "--json")
    assert code == 0, err
    page = browser_page
    with served(create_app(ServeConfig(home=home, token=TOKEN, refresh_s=1.0, sync_remote=False))) as url:
        page.goto(url + "/quality")
        rollback = page.locator("table.alias-history tr[data-action='rollback']")
        rollback.first.wait_for(timeout=WAIT_MS)
        assert rollback.count() == 2  # champion back to the old version, previous cleared
        assert "rollback" in rollback.first.inner_text()
        assert page.locator("text=Policy decisions").count() == 1
        screenshot(page, "serve-quality", tmp_path)

        # the actions: promote the rolled-back version by hand, then roll it back, with the token
        form = page.locator("form[data-model='tabular-demo']")
        form.locator("input[name=version]").fill("2")
        form.locator("input[name=reason]").fill("manual check passed")
        form.locator("button[data-do=promote]").click()
        form.locator(".result", has_text="refused (401)").wait_for(timeout=WAIT_MS)
        page.fill("#token", TOKEN)
        form.locator("button[data-do=promote]").click()
        page.locator("table.alias-history tr[data-action='promote']", has_text="manual check passed").first.wait_for(
            timeout=WAIT_MS
        )
        form = page.locator("form[data-model='tabular-demo']")  # the page redrew it
        form.locator("input[name=reason]").fill("back to v1 after all")
        form.locator("button[data-do=rollback]").click()
        page.locator("table.alias-history tr[data-action='rollback']", has_text="back to v1 after all").first.wait_for(
            timeout=WAIT_MS
        )
        champion = page.locator("h2", has_text="tabular-demo").first.inner_text()
        assert "@champion v1" in champion, champion


def monitored_with_labels(folder: Path, home: Path) -> None:
    """A standing monitor with a CBPE estimate over two windows, and the labels of the first one checked too."""
    import json

    import numpy as np
    import pandas as pd

    from gpufleet.quality.standing import StandingMonitor, load_monitor_config

    def scored(rows: int, seed: int, first_id: int, x0_sd: float = 1.0) -> pd.DataFrame:
        rng = np.random.default_rng(seed)
        x0 = rng.normal(0.0, x0_sd, rows)
        p = 1.0 / (1.0 + np.exp(-2.5 * x0))
        y = (rng.uniform(size=rows) < p).astype(int)
        return pd.DataFrame({"id": np.arange(first_id, first_id + rows), "x0": x0, "p": p, "y": y})

    for name in ("windows", "labels"):
        (folder / name).mkdir(parents=True)
    scored(3000, 1, 0).to_csv(folder / "reference.csv", index=False)
    first, second = scored(1000, 2, 10_000), scored(1000, 3, 20_000, x0_sd=0.3)
    first.drop(columns=["y"]).to_csv(folder / "windows" / "w1.csv", index=False)
    second.drop(columns=["y"]).to_csv(folder / "windows" / "w2.csv", index=False)
    model = {
        "name": "scored",
        "reference": "reference.csv",
        "current": "windows",
        "estimate": {"metric": "roc_auc", "target": "y", "score": "p", "chunk_size": 500},
        "labels": "labels",
    }
    (folder / "monitor.yaml").write_text(json.dumps({"models": [model]}))
    monitor = StandingMonitor(load_monitor_config(folder / "monitor.yaml"), home)
    monitor.run_round()
    first[["id", "y"]].to_csv(folder / "labels" / "batch-1.csv", index=False)
    monitor.run_round()


@pytest.mark.timeout(600)
def test_the_quality_page_charts_estimated_and_realised_performance(
    home: Path, browser_page: Any, tmp_path: Path
) -> None:
    monitored_with_labels(tmp_path / "data", home)
    page = browser_page
    with served(create_app(ServeConfig(home=home, token=TOKEN, refresh_s=1.0, sync_remote=False))) as url:
        page.goto(url + "/quality")
        chart = page.locator(".perf-chart[data-model='scored'] svg")
        chart.wait_for(timeout=WAIT_MS)
        for series in ("estimated", "band low", "band high", "threshold"):
            assert chart.locator(f"[data-series='{series}']").count() == 1, series
        assert chart.locator("g[data-series='realised'] circle").count() == 1  # only w1's labels came
        rows = page.locator("table.performance[data-model='scored'] tr[data-window]")
        assert rows.count() == 2
        assert "labels not yet in" in rows.nth(1).inner_text() and "labels not yet in" not in rows.nth(0).inner_text()
