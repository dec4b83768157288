"""The fuzz suite: a short seeded run over every surface, and checks that the harness catches what it must.

``test_a_short_run_over_every_surface_finds_no_violation`` runs ``fuzz_runner.py`` in a subprocess
(a fork server of its own, away from pytest's capture and warning filters) on
``$GPUFLEET_FUZZ_CASES`` cases (default :data:`DEFAULT_CASES`, 25 to 60 s on two cores)
of seed ``$GPUFLEET_FUZZ_SEED``, and fails with every violation's reproducer. The seed defaults to
the commit's (:func:`commit_seed`), so every commit explores cases no earlier one did, and the run
prints it first. Cases ``0..N-1`` cycle through :data:`fuzz_cases.SURFACE_ORDER`, so any run of at
least ``len(SURFACE_ORDER)`` cases touches every surface.

The other tests give the runner a fake command (``Runner(target=...)``): a crash, a write into the
home before exit 2, two lines on stderr, a hang, a spin, a memory blow-up, a write outside the case's
folders, a server that answers 500, leaks a path of the host or accepts a foreign ``Host``. Each
must be reported as its own violation, so a clean fuzz run means something.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from fuzz_cases import (
    SURFACE_ORDER,
    SURFACES,
    Case,
    HomeJob,
    HomeRecipe,
    HttpStep,
    Templates,
    _request,
    make_case,
    surface_of,
)
from fuzz_runner import Limits, Result, Runner, Target, case_indices

HERE = Path(__file__).resolve().parent
DEFAULT_CASES = 3 * len(SURFACE_ORDER)
"""Three turns of every surface (about 200 cases, 15 to 30 s on two busy cores when no case hangs); ``make fuzz``
runs 10,000, and each commit's seed explores other cases."""
FALLBACK_SEED = 20261204
"""The seed where no git commit can be read (a source tarball)."""


def commit_seed() -> int:
    """The first 8 hex digits of the checkout's commit as an int: each commit's run explores new cases,
    and any one is replayed from the seed the run prints."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=HERE, capture_output=True, text=True, timeout=20, check=True
        ).stdout.strip()
        return int(head[:8], 16)
    except (OSError, subprocess.SubprocessError, ValueError):
        return FALLBACK_SEED


CASES = int(os.environ.get("GPUFLEET_FUZZ_CASES", str(DEFAULT_CASES)))
SEED = int(os.environ.get("GPUFLEET_FUZZ_SEED") or commit_seed())
REPLAY = f"replay the run: GPUFLEET_FUZZ_SEED={SEED} pytest tests/fuzz -k short_run"


def _violations(report: dict[str, Any]) -> str:
    lines = []
    for result in report["results"]:
        for v in result["violations"]:
            argv = " ".join(result["argv"])[:200]
            lines.append(
                f"{v['kind']} [{result['surface']}] {result['reproducer']}\n    gpufleet {argv}\n    {v['detail']}"
            )
    return "\n".join(lines)


def test_a_short_run_over_every_surface_finds_no_violation(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with capsys.disabled():
        print(f"\nfuzz: {CASES} cases of seed {SEED} (GPUFLEET_FUZZ_SEED={SEED} replays them)", flush=True)
    report_path = tmp_path / "report.json"
    argv = [sys.executable, str(HERE / "fuzz_runner.py"), "--cases", str(CASES), "--seed", str(SEED)]
    argv += ["--jobs", "2", "--quiet", "--report", str(report_path), "--timeout", "60", "--idle", "15"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    assert report_path.exists(), f"seed {SEED}; {REPLAY}\n" + proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(report_path.read_text())
    assert report["cases"] == CASES, REPLAY
    if len(SURFACE_ORDER) <= CASES:
        assert set(report["per_surface"]) == set(SURFACES), REPLAY
    assert report["violations"] == 0, (
        f"seed {SEED}: {report['violations']} violation(s), each replayed by its command:\n{_violations(report)}"
    )
    assert proc.returncode == 0, f"{REPLAY}\n{proc.stdout[-3000:]}"


# ---- the generators -------------------------------------------------------------------------------


def test_a_case_is_a_function_of_seed_and_index() -> None:
    for index in range(2 * len(SURFACE_ORDER)):
        first, second = make_case(7, index), make_case(7, index)
        assert (first.surface, first.argv, first.files, first.env, first.notes) == (
            second.surface,
            second.argv,
            second.files,
            second.env,
            second.notes,
        )
        assert repr(first.home) == repr(second.home)
    assert make_case(7, 3).argv != make_case(8, 3).argv or make_case(7, 3).files != make_case(8, 3).files


def test_the_generators_never_fail() -> None:
    for seed in (1, 2):
        for index in range(8 * len(SURFACE_ORDER)):
            assert make_case(seed, index).argv


def test_consecutive_indices_cover_every_surface() -> None:
    assert {surface_of(i) for i in range(len(SURFACE_ORDER))} == set(SURFACES)
    picked = case_indices(5, surfaces=["ckpt"])
    assert len(picked) == 5 and {surface_of(i) for i in picked} == {"ckpt"}


def _command_paths() -> set[tuple[str, ...]]:
    """Every leaf command of the CLI, as its words (``("ckpt", "verify")``)."""
    import typer

    from gpufleet.cli.app import app

    found: set[tuple[str, ...]] = set()

    def walk(command: Any, path: tuple[str, ...]) -> None:
        if hasattr(command, "list_commands"):  # a group (Typer may bundle its own click); the top one loads on demand
            ctx = command.context_class(command, info_name=path[-1] if path else "gpufleet")
            for name in command.list_commands(ctx):
                walk(command.get_command(ctx, name), (*path, name))
        else:
            found.add(path)

    walk(typer.main.get_command(app), ())
    return found


def test_every_command_is_fuzzed() -> None:
    """A command added to the CLI fails this until a surface of ``fuzz_cases.py`` generates it."""
    missing = set(_command_paths())
    for i in range(60 * len(SURFACE_ORDER)):  # cases until every command has one: most are found in a few turns
        argv = tuple(make_case(5, i).argv)
        missing = {path for path in missing if argv[: len(path)] != path}
        if not missing:
            break
    assert not missing, f"no fuzz case runs: {', '.join(' '.join(path) for path in sorted(missing))}"


def test_outputs_stay_inside_the_working_folder() -> None:
    """A generated output path never names an absolute place other than a device, nor climbs out."""
    out_flags = {"--out", "--html", "--plot", "--keep", "--port-file"}
    for index in range(6 * len(SURFACE_ORDER)):
        argv = make_case(3, index).argv
        for flag, value in itertools.pairwise(argv):
            if flag in out_flags:
                assert not value.startswith("/") or value in ("/dev/null", "/dev/full"), (index, value)
                assert not value.startswith(".."), (index, value)


# ---- the harness ----------------------------------------------------------------------------------


def _case(surface: str = "harness", *, home: HomeRecipe | None = None, service: bool = False) -> Case:
    return Case(seed=0, index=0, surface=surface, argv=["fake"], home=home, service_exit_ok=service)


def _run(tmp_path: Path, target: Target, case: Case | None = None, limits: Limits | None = None) -> Result:
    (tmp_path / "root").mkdir(exist_ok=True)
    runner = Runner(tmp_path / "root", limits=limits, target=target)
    (result,) = runner.run([case or _case()])
    return result


def _kinds(result: Result) -> set[str]:
    return {v.kind for v in result.violations}


def clean(case: Case) -> int:
    print("all good")
    return 0


def refuses_cleanly(case: Case) -> int:
    print("error: --x 5 is out of range", file=sys.stderr)
    return 2


def crashes(case: Case) -> int:
    raise ValueError("boom")


def writes_home_then_refuses(case: Case) -> int:
    home = Path(os.environ["GPUFLEET_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    (home / "state.db-wal").write_bytes(b"wal")
    print("error: bad input", file=sys.stderr)
    return 2


def touches_state_db_then_refuses(case: Case) -> int:
    db = Path(os.environ["GPUFLEET_HOME"]) / "state.db"
    db.write_bytes(db.read_bytes() + b"\0")
    print("error: bad input", file=sys.stderr)
    return 2


def two_lines_then_refuses(case: Case) -> int:
    print("warning: states may be stale", file=sys.stderr)
    print("error: bad input", file=sys.stderr)
    return 2


def hangs(case: Case) -> int:
    time.sleep(600)
    return 0


def spins(case: Case) -> int:
    while True:
        pass


def eats_memory(case: Case) -> int:
    hog = bytearray(8 << 30)
    return len(hog)


def writes_outside(case: Case) -> int:
    Path("../../escaped.txt").write_text("x")
    return 0


def leaves_a_temp_file(case: Case) -> int:
    import tempfile

    fd, _ = tempfile.mkstemp()
    os.close(fd)
    return 0


def exits_3(case: Case) -> int:
    print("error: no server answers", file=sys.stderr)
    return 3


def test_a_clean_command_and_a_clean_refusal_pass(tmp_path: Path) -> None:
    assert _run(tmp_path, clean).violations == []
    assert _run(tmp_path, refuses_cleanly).violations == []


def test_a_traceback_is_caught(tmp_path: Path) -> None:
    result = _run(tmp_path, crashes)
    assert "traceback" in _kinds(result), result.violations
    assert "ValueError: boom" in result.violations[0].detail


def test_a_write_into_the_home_before_exit_2_is_caught(tmp_path: Path) -> None:
    result = _run(tmp_path, writes_home_then_refuses)
    assert _kinds(result) == {"home-changed"}, result.violations
    assert "+state.db-wal" in result.violations[0].detail


def test_a_changed_state_db_before_exit_2_is_caught(tmp_path: Path) -> None:
    home = HomeRecipe(jobs=[HomeJob(spec={"name": "toy", "entrypoint": "gpufleet.workloads.toy:train"})])
    result = _run(tmp_path, touches_state_db_then_refuses, _case(home=home))
    assert _kinds(result) == {"home-changed"}, result.violations
    assert "~state.db" in result.violations[0].detail


def test_two_stderr_lines_on_exit_2_are_caught(tmp_path: Path) -> None:
    result = _run(tmp_path, two_lines_then_refuses)
    assert _kinds(result) == {"stderr-lines"}, result.violations


def test_a_hang_is_caught_within_the_idle_limit(tmp_path: Path) -> None:
    started = time.monotonic()
    result = _run(tmp_path, hangs, limits=Limits(wall_s=120, idle_s=2))
    assert _kinds(result) == {"hang"}, result.violations
    assert time.monotonic() - started < 30


def test_a_spin_is_caught_within_the_wall_limit(tmp_path: Path) -> None:
    started = time.monotonic()
    result = _run(tmp_path, spins, limits=Limits(wall_s=3, idle_s=60))
    assert _kinds(result) == {"timeout"}, result.violations
    assert time.monotonic() - started < 30


def test_memory_exhaustion_is_caught(tmp_path: Path) -> None:
    result = _run(tmp_path, eats_memory, limits=Limits(address_space=3 << 30))
    assert _kinds(result) == {"memory"}, result.violations


def test_writes_outside_the_case_folders_are_caught(tmp_path: Path) -> None:
    assert _kinds(_run(tmp_path, writes_outside)) == {"wrote-outside"}
    assert _kinds(_run(tmp_path, leaves_a_temp_file)) == {"wrote-outside"}


def test_exit_3_is_a_violation_unless_a_service_is_involved(tmp_path: Path) -> None:
    assert _kinds(_run(tmp_path, exits_3)) == {"exit-code"}
    assert _run(tmp_path, exits_3, _case(service=True)).violations == []


@pytest.mark.parametrize("surface", sorted(SURFACES))
def test_every_surface_generates(surface: str) -> None:
    index = SURFACE_ORDER.index(surface)
    case = make_case(11, index, Templates())
    assert case.surface == surface and case.argv


# ---- the HTTP checks of a serving case --------------------------------------------------------------

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
SECURITY = {
    "Content-Security-Policy": "default-src 'self'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
}


def fake_server(case: Case) -> int:
    """A server that writes ``port.txt`` and answers as ``case.argv[1]`` says, until SIGTERM (then exit 0).

    ``good`` follows the contract (a foreign Host: 421; security headers); ``500`` fails every request;
    ``leak`` names its working folder in the body; ``any-host`` serves whatever the Host header says.
    """
    import signal
    from http.server import BaseHTTPRequestHandler, HTTPServer

    mode = case.argv[1]

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            host = self.headers.get("Host") or ""
            name = host.split("]")[0] + "]" if host.startswith("[") else host.rsplit(":", 1)[0]
            status, body = 200, b'{"jobs": []}'
            if mode == "500":
                status, body = 500, b"Internal Server Error"
            elif mode == "leak":
                body = json.dumps({"home": os.getcwd()}).encode()
            elif mode != "any-host" and name not in LOOPBACK_NAMES:
                status, body = 421, b'{"detail": "misdirected"}'
            self.send_response(status)
            for key, value in SECURITY.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    stop: list[bool] = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    server = HTTPServer(("127.0.0.1", 0), Handler)
    server.timeout = 0.1
    Path("port.txt").write_text(str(server.server_address[1]))
    while not stop:
        server.handle_request()
    server.server_close()
    return 0


def _serving_case(mode: str) -> Case:
    steps = [
        HttpStep("plain GET", _request("GET", "/api/jobs"), (200,)),
        HttpStep("foreign Host", _request("GET", "/api/jobs", host=b"evil.example"), (400, 403, 421)),
    ]
    return Case(seed=0, index=0, surface="harness", argv=["fake", mode], serves="port.txt", http=steps)


def test_a_server_that_keeps_the_contract_passes(tmp_path: Path) -> None:
    result = _run(tmp_path, fake_server, _serving_case("good"))
    assert result.violations == [], result.violations


@pytest.mark.parametrize(
    ("mode", "found"),
    [
        ("500", "answered 500"),
        ("leak", "host path"),
        ("any-host", "(foreign Host: GET /api/jobs HTTP/1.1): answered 200"),
    ],
)
def test_a_server_that_fails_leaks_or_takes_a_foreign_host_is_caught(tmp_path: Path, mode: str, found: str) -> None:
    result = _run(tmp_path, fake_server, _serving_case(mode))
    assert _kinds(result) == {"http"}, result.violations
    assert any(found in v.detail for v in result.violations), result.violations


def warns_then_fails(case: Case) -> int:
    print("UserWarning: torch.distributed is disabled", file=sys.stderr)
    print("error: ck/step-00000010: .metadata names a file the manifest does not list", file=sys.stderr)
    return 1


def test_exit_0_on_an_input_to_refuse_is_caught(tmp_path: Path) -> None:
    case = Case(seed=0, index=0, surface="harness", argv=["fake"], must_refuse=True)
    assert _kinds(_run(tmp_path, clean, case)) == {"accepted"}
    assert _run(tmp_path, refuses_cleanly, case).violations == []


def test_a_warning_beside_the_error_of_a_quiet_case_is_caught(tmp_path: Path) -> None:
    case = Case(seed=0, index=0, surface="harness", argv=["fake"], quiet=True)
    assert _kinds(_run(tmp_path, warns_then_fails, case)) == {"stderr-noise"}
    assert _run(tmp_path, refuses_cleanly, case).violations == []
