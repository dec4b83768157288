"""numpy steered off its AVX-512 sort on AMD Zen 4, and nowhere else (gpufleet/numpy_cpu.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import drive

from gpufleet import numpy_cpu


def cpuinfo(vendor: str, family: int, flags: str) -> str:
    one = f"processor\t: 0\nvendor_id\t: {vendor}\ncpu family\t: {family}\nmodel\t\t: 17\nflags\t\t: fpu sse2 {flags}\n"
    return one + "\n" + one.replace("processor\t: 0", "processor\t: 1")


ZEN4 = cpuinfo("AuthenticAMD", 25, "avx2 avx512f avx512dq")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (ZEN4, True),
        (cpuinfo("AuthenticAMD", 25, "avx2"), False),  # Zen 3: no AVX-512
        (cpuinfo("AuthenticAMD", 26, "avx2 avx512f"), False),  # Zen 5 runs the sort fast
        (cpuinfo("GenuineIntel", 6, "avx2 avx512f"), False),
        (cpuinfo("AuthenticAMD", 25, "avx2 avx512fx"), False),  # a flag is a whole word
        ("", False),
        ("garbage without colons\n\n", False),
    ],
)
def test_is_zen4(text: str, expected: bool) -> None:
    assert numpy_cpu.is_zen4(text) is expected


def test_features_by_numpy_release() -> None:
    assert numpy_cpu.features_for(None) is None
    assert numpy_cpu.features_for((1, 26)) is None  # its only vectorised sort is the AVX-512 one
    assert numpy_cpu.features_for((2, 2)) is None
    assert numpy_cpu.features_for((2, 3)) == numpy_cpu.FEATURES_2_3
    assert numpy_cpu.features_for((2, 4)) == numpy_cpu.FEATURES_2_4
    assert numpy_cpu.features_for((3, 0)) == numpy_cpu.FEATURES_2_4


def test_installed_numpy_version_is_read_without_importing(tmp_path: Path) -> None:
    major, minor = (int(part) for part in np.__version__.split(".")[:2])
    assert numpy_cpu.installed_numpy_version() == (major, minor)
    (tmp_path / "numpy").mkdir()
    assert numpy_cpu.installed_numpy_version([str(tmp_path / "nowhere")]) is None
    for text, expected in [
        ('"""doc"""\nversion = "2.3.5"\n__version__ = version\n', (2, 3)),
        ("version: str = '2.5.0rc1'\n", (2, 5)),
        ('short_version = "9.9"\nversion = "dev"\n', None),
        ("", None),
    ]:
        (tmp_path / "numpy" / "version.py").write_text(text)
        assert numpy_cpu.installed_numpy_version([str(tmp_path / "nowhere"), str(tmp_path)]) == expected


def test_steer_sets_the_variable_on_zen4_only(tmp_path: Path) -> None:
    zen4, intel = tmp_path / "zen4", tmp_path / "intel"
    zen4.write_text(ZEN4)
    intel.write_text(cpuinfo("GenuineIntel", 6, "avx2 avx512f"))
    expected = numpy_cpu.features_for(numpy_cpu.installed_numpy_version())
    assert expected is not None

    environ: dict[str, str] = {"PATH": "/usr/bin"}
    assert numpy_cpu.steer(environ, modules={}, cpuinfo=str(zen4)) == expected
    assert environ == {"PATH": "/usr/bin", numpy_cpu.VARIABLE: expected, numpy_cpu.MARKER: expected}

    for env, modules, path in [
        ({}, {}, intel),
        ({}, {}, tmp_path / "missing"),
        ({}, {"numpy": object()}, zen4),  # too late: numpy read the variable when imported
        ({numpy_cpu.VARIABLE: ""}, {}, zen4),  # the user's own setting, even empty, wins
        ({"NPY_ENABLE_CPU_FEATURES": "X86_V3"}, {}, zen4),
    ]:
        before = dict(env)
        assert numpy_cpu.steer(env, modules=modules, cpuinfo=str(path)) is None
        assert env == before


def this_cpu() -> tuple[str, bool]:
    """The machine's ``/proc/cpuinfo`` text ("" where there is none), and whether its CPU has numpy's X86_V4."""
    text = Path(numpy_cpu.CPUINFO).read_text() if Path(numpy_cpu.CPUINFO).exists() else ""
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    return text, {"avx512f", "avx512cd", "avx512vl", "avx512bw", "avx512dq"} <= set(flags)


def _child(env: dict[str, str]) -> tuple[str | None, bool]:
    code = (
        "import json, os, gpufleet, numpy._core._multiarray_umath as m;"
        f"print(json.dumps([os.environ.get({numpy_cpu.VARIABLE!r}), bool(m.__cpu_features__.get('X86_V4'))]))"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True, timeout=120)
    value, avx512 = json.loads(out.stdout)
    return value, avx512


def test_importing_gpufleet_steers_numpy_in_a_fresh_process() -> None:
    """Run on the machine at hand: on Zen 4 numpy runs without its AVX-512 kernels, elsewhere as it was."""
    text, has_x86_v4 = this_cpu()
    base = {k: v for k, v in os.environ.items() if k not in numpy_cpu.USER_VARIABLES}
    value, avx512 = _child(base)
    if numpy_cpu.is_zen4(text):
        assert value == numpy_cpu.features_for(numpy_cpu.installed_numpy_version())
        assert not avx512
    else:
        assert value is None
        assert avx512 == has_x86_v4
    # Opting out: the user's own (empty) setting is kept, and numpy keeps every kernel the CPU has.
    assert _child({**base, numpy_cpu.VARIABLE: ""}) == ("", has_x86_v4)


def inherited_value() -> str:
    """The value a gpufleet process on Zen 4 sets for this numpy (2.4's names where it would set none)."""
    return numpy_cpu.features_for(numpy_cpu.installed_numpy_version()) or numpy_cpu.FEATURES_2_4


def fake_numpy(site: Path, version: str, platform: str | None) -> list[str]:
    """A ``sys.path`` holding a numpy ``version`` installed from a wheel tagged ``platform`` (None: no WHEEL)."""
    (site / "numpy").mkdir(parents=True)
    (site / "numpy" / "version.py").write_text(f'version = "{version}"\n')
    if platform is not None:
        info = site / f"numpy-{version}.dist-info"
        info.mkdir()
        tags = "".join(f"Tag: cp311-cp311-{p}\n" for p in platform.split(","))
        (info / "WHEEL").write_text(f"Wheel-Version: 1.0\nGenerator: meson\nRoot-Is-Purelib: false\n{tags}")
    return [str(site)]


def test_only_a_numpy_from_a_portable_wheel_is_steered(tmp_path: Path) -> None:
    """A numpy built for this very CPU may have AVX-512 in its baseline: disabling it would stop its import."""
    zen4 = tmp_path / "cpuinfo"
    zen4.write_text(ZEN4)
    for n, (version, platform, expected) in enumerate(
        [
            ("2.4.6", "manylinux_2_27_x86_64,manylinux_2_28_x86_64", numpy_cpu.FEATURES_2_4),
            ("2.3.5", "musllinux_1_2_x86_64", numpy_cpu.FEATURES_2_3),
            ("2.4.6", "linux_x86_64", None),  # built here (pip install --no-binary, -Dcpu-baseline=native)
            ("2.4.6", "manylinux_2_28_x86_64,linux_x86_64", None),
            ("2.4.6", None, None),  # no WHEEL file: a conda or system package
            ("2.2.6", "manylinux_2_17_x86_64", None),
        ]
    ):
        path = fake_numpy(tmp_path / str(n), version, platform)
        portable = platform is not None and all(p.startswith(("manylinux", "musllinux")) for p in platform.split(","))
        major, minor = (int(part) for part in version.split(".")[:2])
        assert numpy_cpu.portable_numpy(path) == ((major, minor) if portable else None)
        environ: dict[str, str] = {}
        assert numpy_cpu.steer(environ, modules={}, cpuinfo=str(zen4), path=path) == expected
        assert environ == ({} if expected is None else {numpy_cpu.VARIABLE: expected, numpy_cpu.MARKER: expected})
    assert numpy_cpu.portable_numpy([b"/bytes", *path]) == (2, 2)  # type: ignore[list-item]  # bytes: skipped


def test_a_setting_inherited_from_gpufleet_is_decided_again_the_users_kept(tmp_path: Path) -> None:
    zen4 = tmp_path / "cpuinfo"
    zen4.write_text(ZEN4)
    older = fake_numpy(tmp_path / "older", "2.3.5", "manylinux_2_17_x86_64")
    native = fake_numpy(tmp_path / "native", "2.4.6", "linux_x86_64")
    ours = {numpy_cpu.VARIABLE: numpy_cpu.FEATURES_2_4, numpy_cpu.MARKER: numpy_cpu.FEATURES_2_4}
    # Another venv's numpy 2.3 takes 2.3's names; a numpy built here is left alone.
    environ = dict(ours)
    assert numpy_cpu.steer(environ, modules={}, cpuinfo=str(zen4), path=older) == numpy_cpu.FEATURES_2_3
    assert environ == {numpy_cpu.VARIABLE: numpy_cpu.FEATURES_2_3, numpy_cpu.MARKER: numpy_cpu.FEATURES_2_3}
    environ = dict(ours)
    assert numpy_cpu.steer(environ, modules={}, cpuinfo=str(zen4), path=native) is None
    assert environ == {}
    # The user's own value (unmarked, or marked for another value) is theirs: kept as it is.
    for users in [
        {numpy_cpu.VARIABLE: numpy_cpu.FEATURES_2_4},
        {numpy_cpu.VARIABLE: "AVX512_SPR", numpy_cpu.MARKER: numpy_cpu.FEATURES_2_4},
        {**ours, "NPY_ENABLE_CPU_FEATURES": "X86_V3"},
    ]:
        environ = dict(users)
        assert numpy_cpu.steer(environ, modules={}, cpuinfo=str(zen4), path=older) is None
        assert environ == users
        assert numpy_cpu.without_own_setting(users) == {k: v for k, v in users.items() if k != numpy_cpu.MARKER}
    assert numpy_cpu.without_own_setting({**ours, "PATH": "/usr/bin"}) == {"PATH": "/usr/bin"}


def test_own_setting_stays_on_this_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Slurm batch job's environment goes to another node: gpufleet's own setting is dropped, the user's kept."""
    from gpufleet.backends.slurm.backend import slurm_env

    monkeypatch.setenv(numpy_cpu.VARIABLE, numpy_cpu.FEATURES_2_4)
    monkeypatch.setenv(numpy_cpu.MARKER, numpy_cpu.FEATURES_2_4)
    env = slurm_env()
    assert numpy_cpu.VARIABLE not in env and numpy_cpu.MARKER not in env
    monkeypatch.setenv(numpy_cpu.VARIABLE, "AVX512_SPR")  # the user's own, different value
    assert slurm_env()[numpy_cpu.VARIABLE] == "AVX512_SPR"
    monkeypatch.delenv(numpy_cpu.MARKER)  # the same value, unmarked: the user's
    monkeypatch.setenv(numpy_cpu.VARIABLE, numpy_cpu.FEATURES_2_4)
    assert slurm_env()[numpy_cpu.VARIABLE] == numpy_cpu.FEATURES_2_4


JOB = """import json, os, sys
import numpy._core._multiarray_umath as m
names = ({variable!r}, {marker!r})
json.dump({{"env": {{n: os.environ.get(n) for n in names}}, "x86_v4": bool(m.__cpu_features__.get("X86_V4"))}},
          open(sys.argv[1], "w"))
"""


@pytest.mark.parametrize("warm", ["1", "0"])
def test_a_jobs_own_code_gets_the_environment_without_gpufleets_setting(
    local: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, warm: str
) -> None:
    """Run on the machine at hand: the attempt sees the user's environment, as their shell had it."""
    from gpufleet.backends.local.warm import WarmProcess
    from gpufleet.spec import parse_spec

    monkeypatch.setenv("GPUFLEET_WARM_START", warm)
    ours = inherited_value()
    monkeypatch.setenv(numpy_cpu.VARIABLE, ours)  # as a scheduler that imported gpufleet first has it on Zen 4
    monkeypatch.setenv(numpy_cpu.MARKER, ours)
    backend, scheduler = local
    script, out = tmp_path / "job.py", tmp_path / "seen.json"
    script.write_text(JOB.format(variable=numpy_cpu.VARIABLE, marker=numpy_cpu.MARKER))
    if warm == "1":  # the server has imported: the attempt is forked from it, not started while it imports
        scheduler.prepare()
        assert scheduler.warm is not None and scheduler.warm.wait_ready(timeout=300)
    job = backend.submit(parse_spec({"name": "env", "entrypoint": [sys.executable, str(script), str(out)]}))
    drive(scheduler, lambda: job in scheduler.running)
    forked = isinstance(scheduler.running[job].proc, WarmProcess)
    drive(scheduler, lambda: backend.store.job(job).state in ("completed", "failed"))
    assert backend.store.job(job).state == "completed", backend.store.job(job).reason
    seen = json.loads(out.read_text())
    assert seen["env"] == {numpy_cpu.VARIABLE: None, numpy_cpu.MARKER: None}
    # A new interpreter's numpy has every kernel the CPU has; a warm attempt's was imported by the server,
    # as gpufleet imports it: without AVX-512 on Zen 4.
    text, has_x86_v4 = this_cpu()
    steered = warm == "1" and numpy_cpu.is_zen4(text) and numpy_cpu.portable_numpy() is not None
    assert seen["x86_v4"] == (has_x86_v4 and not steered)
    assert forked == (warm == "1")


def test_gpufleets_own_setting_is_not_a_change_of_the_schedulers_environment() -> None:
    """A scheduler steers itself; a script that imported numpy first and submits has no setting: the same."""
    from gpufleet.backends.local.process import environment_digests

    base = {"PATH": "/usr/bin", "GPUFLEET_LOG_EVERY_S": "5"}
    ours = {numpy_cpu.VARIABLE: numpy_cpu.FEATURES_2_4, numpy_cpu.MARKER: numpy_cpu.FEATURES_2_4}
    assert environment_digests({**base, **ours}) == environment_digests(base)


NAMES = (numpy_cpu.VARIABLE, numpy_cpu.MARKER)
SEEN = f"import json, os; print(json.dumps({{n: os.environ.get(n) for n in {NAMES!r}}}), flush=True)"
"""A command that prints the two variables as it sees them."""


def _inherited_setting() -> dict[str, str]:
    """An environment as a gpufleet process on Zen 4 hands it down: with its setting, marked."""
    ours = inherited_value()
    base = {k: v for k, v in os.environ.items() if k not in (*numpy_cpu.USER_VARIABLES, numpy_cpu.MARKER)}
    return {**base, numpy_cpu.VARIABLE: ours, numpy_cpu.MARKER: ours}


def test_gpufleets_wrappers_start_the_jobs_command_without_the_setting(tmp_path: Path) -> None:
    """The stage-in step and Slurm's rank shim import gpufleet (which steers them again on Zen 4), then become
    the job's command: that command gets the user's environment, as a command started directly does."""
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps({"name": "w", "entrypoint": "gpufleet.workloads.toy:train"}))
    env = {**_inherited_setting(), "GPUFLEET_SPEC": str(spec_file), "GPUFLEET_JOB_DIR": str(tmp_path)}
    slurm = {"SLURM_JOB_ID": "7", "SLURM_NODEID": "0", "SLURM_NNODES": "1", "SLURM_JOB_NODELIST": "localhost"}
    slurm |= {"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_LOCALID": "0", "SLURM_TASKS_PER_NODE": "1"}
    for wrapper, extra in [("gpufleet.data.stage_in", {}), ("gpufleet.backends.slurm.rank", slurm)]:
        argv = [sys.executable, "-m", wrapper, "--", sys.executable, "-c", SEEN]
        out = subprocess.run(argv, env={**env, **extra}, capture_output=True, text=True, timeout=120, check=False)
        assert out.returncode == 0, (wrapper, out.stderr)
        assert json.loads(out.stdout.splitlines()[-1]) == {numpy_cpu.VARIABLE: None, numpy_cpu.MARKER: None}, wrapper


def test_a_slurm_batch_script_starts_the_jobs_command_without_the_setting(tmp_path: Path) -> None:
    """The batch script imports gpufleet on the node (its notice handlers), then forks the job's command."""
    from gpufleet.backends.slurm.backend import batch_script
    from gpufleet.spec import parse_spec

    spec = parse_spec({"name": "b", "entrypoint": [sys.executable, "-c", SEEN], "resources": {"gpus": 0}})
    home = tmp_path / "home"
    home.mkdir()
    script = tmp_path / "job.sbatch"
    script.write_text(batch_script(spec, 7, home))
    out = subprocess.run(
        [sys.executable, str(script)], env=_inherited_setting(), capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    (log,) = home.rglob("attempt-1.log")
    seen = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    assert seen == [{numpy_cpu.VARIABLE: None, numpy_cpu.MARKER: None}]
