from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import pytest
import torch

from gpufleet.backends import sync_remote
from gpufleet.backends.base import Backend
from gpufleet.backends.local import LocalBackend, LocalScheduler
from gpufleet.backends.slurm.backend import slurm_env
from gpufleet.jobs.store import Store

REPO = Path(__file__).resolve().parents[1]

if os.environ.get("PYTEST_XDIST_WORKER"):
    # A worker of `pytest -n` starts with COLUMNS=80 and LINES=24: the CLI's tables (and those of every
    # command a test starts) would wrap at 80 columns there, where a plain run without a terminal draws
    # them 200 wide (gpufleet/cli/render.py). The tests read the plain run's output.
    for _name in ("COLUMNS", "LINES"):
        os.environ.pop(_name, None)


def drive(scheduler: LocalScheduler, until: Callable[[], bool], timeout: float = 120.0) -> None:
    """Tick an in-process local scheduler until ``until()`` holds (the timeout is only a safety net)."""
    deadline = time.monotonic() + timeout
    while not until():
        assert time.monotonic() < deadline, "timed out"
        scheduler.tick()
        time.sleep(0.02)


@pytest.fixture
def local(home: Path) -> Iterator[tuple[LocalBackend, LocalScheduler]]:
    """A local backend that spawns nothing, and a one-slot scheduler the test ticks itself."""
    backend = LocalBackend(home, spawn=False)
    scheduler = LocalScheduler(home, slots=1, poll_s=0.02)
    yield backend, scheduler
    scheduler.shutdown(grace_s=5)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private $GPUFLEET_HOME for one test."""
    path = tmp_path / "home"
    monkeypatch.setenv("GPUFLEET_HOME", str(path))
    monkeypatch.delenv("GPUFLEET_LOCAL_SLOTS", raising=False)
    yield path


@pytest.fixture
def local_daemon(home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalBackend]:
    """The local backend with its real detached scheduler, shared by the test, the CLI and a server as by a user.

    At the end its jobs are cancelled and the scheduler, idle, exits (after 2 s here).
    """
    from gpufleet.backends.local import scheduler_pid

    monkeypatch.setenv("GPUFLEET_SCHEDULER_IDLE_S", "2")
    backend = LocalBackend(home)
    yield backend
    for job in backend.store.jobs():
        if job.state not in ("completed", "failed", "cancelled"):
            backend.cancel(job.id)
    follow(backend, lambda: scheduler_pid(home) is None, timeout=120)


def process_gone(pid: int) -> bool:
    """Whether ``pid`` has exited (no such process, or a zombie or dead one)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rindex(")") + 2] in "ZX"


@pytest.fixture
def ray_backend(ray: str, home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A Ray backend on the dev cluster; at the end no job of the test is left running on the shared cluster."""
    from gpufleet.backends.ray.backend import RayBackend

    monkeypatch.setenv("GPUFLEET_LOG_EVERY_S", "0")
    backend = RayBackend(home)
    yield backend
    for job in backend.store.jobs():
        if job.state not in ("completed", "failed", "cancelled"):
            backend.cancel(job.id)


def uses_shared_services(nodeid: str) -> bool:
    """Whether a test drives the shared real services (the one Slurm cluster, Ray and Prometheus of this
    machine): those under tests/integration/, and every test with Slurm or Ray in its file's name."""
    path = nodeid.partition("::")[0].lower()
    return path.startswith("tests/integration/") or "slurm" in path or "/test_ray" in path


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under ``pytest -n 2`` (``make test``), the tests of the shared real services run one after the other
    on one worker, the rest on both: two at once would queue behind each other on the same cluster, and
    read each other's jobs in its queue. Every other test has its own home and ports.

    (xdist's own ``--dist loadgroup`` marks groups by renaming each test, which pytest 9.2 no longer reads.)
    Any other ``--dist`` given on the command line (``each``, ``loadfile``, ``worksteal``) is xdist's own.
    """
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ServicesOnOneWorker(LoadScopeScheduling):  # type: ignore[misc]  # xdist is untyped
        def _split_scope(self, nodeid: str) -> str:
            return "services" if uses_shared_services(nodeid) else nodeid

    return ServicesOnOneWorker(config, log)


def slurm_is_up() -> str | None:
    """``None`` when a Slurm controller answers, else why not."""
    env = slurm_env()
    if "SLURM_CONF" not in env:
        return "no SLURM_CONF and no .dev/slurm/slurm.conf"
    try:
        proc = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, env=env, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"sinfo failed: {err}"
    if proc.returncode != 0:
        return proc.stderr.strip() or "sinfo failed"
    return None


def service_missing(message: str) -> NoReturn:
    """A real service a test needs is not there: fail under CI (it must run there), skip elsewhere."""
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="session")
def slurm() -> dict[str, str]:
    """The environment of a running Slurm cluster; fails under CI, skips elsewhere, when there is none."""
    problem = slurm_is_up()
    if problem is not None:
        service_missing(f"Slurm is not running ({problem}); start it with `scripts/dev-slurm up`")
    return slurm_env()


@pytest.fixture(scope="session")
def ray() -> str:
    """The GCS address of a running Ray cluster (`scripts/dev-ray up`); fails under CI, skips elsewhere, without one."""
    from gpufleet.backends.ray.backend import cluster_problem, find_cluster

    problem = cluster_problem()
    where = find_cluster(None)
    if problem is not None or where is None:
        service_missing(f"Ray is not running ({problem}); start it with `scripts/dev-ray up`")
    return where.address


def prometheus_dir() -> Path:
    return Path(os.environ.get("GPUFLEET_PROMETHEUS_DIR") or REPO / ".dev" / "prometheus")


@pytest.fixture(scope="session")
def prometheus() -> str:
    """Base URL of the dev Prometheus once it answers /-/ready (``$GPUFLEET_PROMETHEUS_URL``, else its url file)."""
    url = os.environ.get("GPUFLEET_PROMETHEUS_URL", "").strip().rstrip("/")
    if not url:
        try:
            url = (prometheus_dir() / "url").read_text().strip().rstrip("/")
        except OSError:
            url = ""
    problem = "" if url else f"no $GPUFLEET_PROMETHEUS_URL and no {prometheus_dir() / 'url'}"
    if url:
        try:
            with urllib.request.urlopen(f"{url}/-/ready", timeout=5) as resp:
                if resp.status != 200:
                    problem = f"{url}/-/ready answered {resp.status}"
        except (OSError, ValueError) as exc:
            problem = f"{url}/-/ready failed: {exc}"
    if problem:
        service_missing(f"dev Prometheus is not up ({problem}); start it with `scripts/dev-prometheus up`")
    return url


@pytest.fixture(scope="session")
def prometheus_targets(prometheus: str) -> Path:
    """The file_sd directory the dev Prometheus watches."""
    targets = prometheus_dir() / "targets"
    if not targets.is_dir():
        pytest.fail(f"{targets} does not exist: was Prometheus started by `scripts/dev-prometheus up`?")
    return targets


@pytest.fixture(scope="session")
def promql(prometheus: str) -> Callable[[str], list[dict[str, Any]]]:
    """Run an instant PromQL query against the dev Prometheus; the result vector."""

    def query(expr: str) -> list[dict[str, Any]]:
        url = f"{prometheus}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
        with urllib.request.urlopen(url, timeout=5) as response:
            body = json.load(response)
        assert body["status"] == "success", body
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    return query


def follow(backend: Backend, until: Callable[[], bool], timeout: float = 240.0, poll_s: float = 0.3) -> None:
    """Sync a remote backend (Slurm, Ray) until ``until()`` holds (the timeout is only a safety net)."""
    deadline = time.monotonic() + timeout
    while not until():
        assert time.monotonic() < deadline, "timed out"
        backend.sync()
        time.sleep(poll_s)


def follow_home(home: Path, until: Callable[[], bool], timeout: float = 240.0) -> None:
    """Sync every scheduler with active jobs in ``home`` (``sync_remote``) until ``until()`` holds.

    For a test whose jobs a fleet may place on more than one backend; the timeout is only a safety net.
    """
    store = Store(home / "state.db")
    deadline = time.monotonic() + timeout
    while not until():
        assert time.monotonic() < deadline, "timed out"
        sync_remote(home, store)
        time.sleep(0.5)


def final_dcp_state(
    home: Path, job: int, *, step: int, world_size: int | None = None, strategy: str | None = None
) -> dict[str, Any]:
    """The full model and optimizer state of a job's newest checkpoint, which must be sharded and at ``step``."""
    from gpufleet.runtime.checkpoint import CheckpointDir
    from gpufleet.runtime.sharded import full_state

    newest = CheckpointDir(home / "jobs" / str(job) / "checkpoints").scan()[-1]
    manifest = newest.manifest
    assert newest.step == step and manifest is not None and manifest.format == "dcp", newest
    assert world_size is None or manifest.world_size == world_size, manifest.world_size
    assert strategy is None or manifest.strategy == strategy, manifest.strategy
    state = full_state(newest.path, manifest)
    return {"model": state["model"], "optimizer": state["optimizer"]}


def straight_and_preempted(
    backend: LocalBackend, scheduler: LocalScheduler, straight_spec: Any, cut_spec: Any, targets: list[int]
) -> tuple[int, int]:
    """Run ``straight_spec`` to its end, then ``cut_spec`` preempted once past each step of ``targets``.

    The ids of both jobs; the straight one completed, the cut one ended (completed or failed).
    """
    from gpufleet.jobs.store import latest_step

    straight = backend.submit(straight_spec)
    drive(scheduler, lambda: backend.store.job(straight).state in ("completed", "failed"), timeout=600)
    assert backend.store.job(straight).state == "completed", backend.store.job(straight).reason
    cut = backend.submit(cut_spec)
    for n, target in enumerate(sorted(targets), start=1):

        def reached(n: int = n, target: int = target) -> bool:
            return len(backend.store.attempts(cut)) == n and (latest_step(backend.store, cut) or 0) >= target

        drive(scheduler, reached, timeout=600)
        backend.preempt(cut)
    drive(scheduler, lambda: backend.store.job(cut).state in ("completed", "failed"), timeout=600)
    return straight, cut


def assert_bitwise_equal(a: Any, b: Any, where: str = "") -> None:
    """Tensors ``torch.equal``, containers alike element by element, anything else ``==``."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            assert_bitwise_equal(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_bitwise_equal(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


@pytest.fixture
def job_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Environment as a backend would export it, with a spec that checkpoints every 7 steps."""
    spec = {
        "name": "t",
        "entrypoint": "gpufleet.workloads.tinylm:train",
        "checkpoint": {"every_steps": 7, "keep": 2},
        "health": {"min_history": 5, "window": 20},
    }
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    monkeypatch.setenv("GPUFLEET_SPEC", str(tmp_path / "spec.json"))
    monkeypatch.setenv("GPUFLEET_CKPT_DIR", str(tmp_path / "ckpt"))
    monkeypatch.setenv("GPUFLEET_EVENTS", str(tmp_path / "events.jsonl"))
    monkeypatch.delenv("GPUFLEET_FAULT", raising=False)
    return tmp_path


def run_cli(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, *args: str) -> tuple[int, str, str]:
    """Run the CLI in this process through ``main()`` (what renders errors): exit code, stdout, stderr."""
    import sys

    from gpufleet.cli.app import main

    monkeypatch.setattr(sys, "argv", ["gpufleet", *args])
    capsys.readouterr()
    try:
        main()
        code = 0
    except SystemExit as exit_:
        code = int(exit_.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def attempt_events(n: int, start: float, outcome: str) -> list[dict[str, Any]]:
    """One attempt: 8 s to its first step (0.5 s of it restoring, after the first), a 0.4 s periodic save,
    then a 0.7 s save at the signal and an exit 2.97 s after the session ended, or the end at step 100."""
    first = n == 1
    events: list[dict[str, Any]] = [
        {"ts": start + 1.0, "kind": "session_start", "total_steps": 100},
        {"ts": start + 6.0, "kind": "restore", "step": None if first else 10 * (n - 1),
         "seconds": 0.0 if first else 0.5, "cause": "start"},
        {"ts": start + 8.0, "kind": "train_start", "step": 0 if first else 10 * (n - 1)},
        {"ts": start + 50.0, "kind": "checkpoint", "step": 10 * n - 5, "seconds": 0.4, "reason": "periodic"},
    ]  # fmt: skip
    if outcome == "completed":
        events += [{"ts": start + 90.0, "kind": "session_end", "status": "completed", "step": 100}]
    else:
        events += [
            {"ts": start + 60.0, "kind": "preempt_signal", "step": 10 * n, "signal": "SIGTERM"},
            {"ts": start + 60.01, "kind": "checkpoint", "step": 10 * n, "seconds": 0.7, "reason": "preempt"},
            {"ts": start + 60.03, "kind": "session_end", "status": "requeue", "step": 10 * n},
        ]
    return [{**e, "attempt": n} for e in events]


def assert_refused(code: int, err: str, home: Path, *needles: str) -> str:
    """Exit 2, exactly one non-empty stderr line (returned) holding every needle, no traceback, home untouched."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, (code, err)
    assert len(lines) == 1, err
    assert "Traceback" not in err and lines[0].startswith("error:"), err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    assert not home.exists() or not any(home.rglob("*")), sorted(home.rglob("*"))
    return lines[0]


# --------------------------------------------------------------------------------------------
# A real S3-protocol server on loopback (moto's server mode), in this process so a test can reach its store
# --------------------------------------------------------------------------------------------
@dataclass
class S3:
    endpoint: str
    client: Any

    def put(self, bucket: str, key: str, body: bytes) -> None:
        self.client.put_object(Bucket=bucket, Key=key, Body=body)

    def stored(self, bucket: str, key: str) -> Any:
        """The server's own record of an object (to change its bytes behind its ETag's back)."""
        from moto.s3.models import s3_backends

        for account in s3_backends.values():
            backend = account["global"]
            if bucket in backend.buckets:
                return backend.buckets[bucket].keys[key]
        raise KeyError(bucket)


@pytest.fixture(scope="session")
def s3_server() -> Iterator[str]:
    """The endpoint of a moto S3 server on 127.0.0.1 (a free port), up for the whole session."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3(s3_server: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[S3]:
    """Credentials for the server in the environment (jobs inherit them), and a client; buckets are per test."""
    import boto3

    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": s3_server,
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    client = boto3.client("s3", endpoint_url=s3_server)
    yield S3(endpoint=s3_server, client=client)
    for bucket in client.list_buckets().get("Buckets", []):
        objects = client.list_objects_v2(Bucket=bucket["Name"]).get("Contents", [])
        for obj in objects:
            client.delete_object(Bucket=bucket["Name"], Key=obj["Key"])
        client.delete_bucket(Bucket=bucket["Name"])


def shards(count: int, size: int, seed: int = 0) -> dict[str, bytes]:
    """``count`` files of ``size`` random bytes each (seeded), as ``shard-000.bin``..."""
    import random

    rng = random.Random(seed)
    return {f"shard-{i:03d}.bin": rng.randbytes(size) for i in range(count)}


@contextlib.contextmanager
def served(app: Any) -> Iterator[str]:
    """Run an ASGI ``app`` under uvicorn on a free loopback port in a thread; yield its base URL."""
    import threading

    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, daemon=True, name="uvicorn")
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def http(
    method: str, url: str, body: bytes | None = None, headers: dict[str, str] | None = None, timeout: float = 60.0
) -> tuple[int, Any]:
    """One request with urllib; the status and the JSON body (or the text when it is not JSON)."""
    import urllib.error

    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            status, raw = reply.status, reply.read()
    except urllib.error.HTTPError as err:
        status, raw = err.code, err.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode("utf-8", errors="replace")


CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
"""Debian's Chromium, headless, with nothing that reaches for the network on its own."""


@pytest.fixture(scope="session")
def chromium() -> Iterator[Any]:
    """A headless Chromium driven by Playwright (``make tools`` installs Debian's; Playwright downloads nothing)."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        service_missing("Playwright is not installed: `make dev` installs the dev extras")
    if not os.path.exists(CHROMIUM):
        service_missing(f"{CHROMIUM} is missing: `make tools` installs Debian's chromium")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def browser_page(chromium: Any) -> Iterator[Any]:
    """A fresh page (its own context: no cookies or storage from another test), 1280x900."""
    context = chromium.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    try:
        yield page
    finally:
        context.close()


def screenshot(page: Any, name: str, tmp_path: Path) -> Path:
    """Save the page, whole, to ``$GPUFLEET_SCREENSHOTS/<name>.png`` (the docs' images), else under ``tmp_path``."""
    folder = Path(os.environ.get("GPUFLEET_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path
