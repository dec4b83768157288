"""numpy steered off its AVX-512 sort on AMD Zen 4, and nowhere else (gpufleet/numpy_cpu.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

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
    assert environ == {"PATH": "/usr/bin", numpy_cpu.VARIABLE: expected}

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
    text = Path(numpy_cpu.CPUINFO).read_text() if Path(numpy_cpu.CPUINFO).exists() else ""
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    has_x86_v4 = {"avx512f", "avx512cd", "avx512vl", "avx512bw", "avx512dq"} <= set(flags)
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


def test_own_setting_stays_on_this_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Slurm batch job's environment goes to another node: gpufleet's own setting is dropped, the user's kept."""
    from gpufleet.backends.slurm.backend import slurm_env

    monkeypatch.setattr(numpy_cpu, "_set_here", numpy_cpu.FEATURES_2_4)
    monkeypatch.setenv(numpy_cpu.VARIABLE, numpy_cpu.FEATURES_2_4)
    assert numpy_cpu.VARIABLE not in slurm_env()
    monkeypatch.setenv(numpy_cpu.VARIABLE, "AVX512_SPR")  # the user's own, different value
    assert slurm_env()[numpy_cpu.VARIABLE] == "AVX512_SPR"
    monkeypatch.setattr(numpy_cpu, "_set_here", None)  # this process did not steer: nothing to drop
    monkeypatch.setenv(numpy_cpu.VARIABLE, numpy_cpu.FEATURES_2_4)
    assert slurm_env()[numpy_cpu.VARIABLE] == numpy_cpu.FEATURES_2_4
