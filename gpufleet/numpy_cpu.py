"""On AMD Zen 4, numpy is steered to its AVX2 kernels, whose sort is four times faster there.

numpy (2.x) sorts 32- and 64-bit numbers with x86-simd-sort. On a CPU with AVX-512 it takes the
AVX-512 path, whose partition step stores with the memory form of ``VPCOMPRESS``: Zen 4 runs that
form in microcode (AMD's optimisation guide for Zen 4, 2.11.2, says to avoid it). Measured on a
2-core Zen 4 virtual machine (EPYC, family 25, model 17) with numpy 2.4.6: ``np.sort`` of 400,000
doubles takes 18.9 ms on the AVX-512 path and 4.4 ms on the AVX2 one; ``np.argsort`` 25.9 and 9.2
ms; the drift report of 10 columns x 200,000 rows a side 0.134 s and 0.042 s. numpy 2.3.5 behaves
the same. Zen 5 (family 26) runs the register form fast, Zen 3 has no AVX-512, Intel's AVX-512 sort
is its fastest: all are left alone, as are numpy releases before 2.3 (1.26's only vectorised sort
is the AVX-512 one).

numpy reads ``NPY_DISABLE_CPU_FEATURES`` once, when it is first imported, so ``steer()`` runs when
``gpufleet`` is imported (every command does first) and does nothing once numpy is imported. The
processes gpufleet starts on this machine inherit the variable, so a job's ranks run the same numpy
kernels wherever they import numpy; what goes to another machine (a Slurm batch job) goes without it
(``without_own_setting``), and that machine decides for itself. Setting ``NPY_DISABLE_CPU_FEATURES``
(even to nothing) or ``NPY_ENABLE_CPU_FEATURES`` yourself turns this off.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, MutableMapping

VARIABLE = "NPY_DISABLE_CPU_FEATURES"
USER_VARIABLES = (VARIABLE, "NPY_ENABLE_CPU_FEATURES")
ZEN4_FAMILY = 25
CPUINFO = "/proc/cpuinfo"

# numpy names its dispatch targets differently from 2.4 on; a name it does not dispatch draws an
# ImportWarning, so each release range gets exactly its own AVX-512 names.
FEATURES_2_4 = "X86_V4 AVX512_ICL AVX512_SPR"
FEATURES_2_3 = "AVX512F AVX512CD AVX512_KNL AVX512_KNM AVX512_SKX AVX512_CLX AVX512_CNL AVX512_ICL AVX512_SPR"

_set_here: str | None = None  # the value steer() set in this process, if it did


def is_zen4(cpuinfo: str) -> bool:
    """Whether the first processor of a ``/proc/cpuinfo`` text is an AMD family 25 with AVX-512."""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        if not line.strip():
            if fields:
                break
            continue
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    return (
        fields.get("vendor_id") == "AuthenticAMD"
        and fields.get("cpu family") == str(ZEN4_FAMILY)
        and "avx512f" in fields.get("flags", "").split()
    )


def features_for(numpy_version: tuple[int, int] | None) -> str | None:
    """The AVX-512 dispatch targets to turn off for a numpy release, or None to leave it alone."""
    if numpy_version is None or numpy_version < (2, 3):
        return None
    return FEATURES_2_4 if numpy_version >= (2, 4) else FEATURES_2_3


def installed_numpy_version(path: list[str] | None = None) -> tuple[int, int] | None:
    """numpy's major and minor version, read from its ``version.py`` on ``sys.path`` without importing it
    (nor ``importlib.util``, ``re`` or ``pathlib``: this runs in every command, before anything else)."""
    for entry in path if path is not None else sys.path:
        try:
            with open(os.path.join(entry or ".", "numpy", "version.py"), encoding="utf-8") as f:
                text = f.read(4096)
        except (OSError, UnicodeDecodeError):
            continue
        return _version_of(text)
    return None


def _version_of(text: str) -> tuple[int, int] | None:
    """``(2, 4)`` from the line ``version = "2.4.6"`` (or ``version: str = ...``) of numpy's ``version.py``."""
    for line in text.splitlines():
        name, eq, value = line.partition("=")
        if eq and name.split(":")[0].strip() == "version":
            parts = value.strip().strip("'\"").split(".")
            if len(parts) >= 2 and parts[0].isdigit() and parts[1].isdigit():
                return int(parts[0]), int(parts[1])
            return None
    return None


def _read_cpuinfo(path: str) -> str:
    try:
        with open(path, "rb") as f:  # the first processor is in the first few KiB
            return f.read(16384).decode("ascii", "replace")
    except OSError:
        return ""


def steer(
    environ: MutableMapping[str, str] | None = None,
    modules: Mapping[str, object] | None = None,
    cpuinfo: str = CPUINFO,
) -> str | None:
    """Set ``NPY_DISABLE_CPU_FEATURES`` for numpy's AVX2 kernels on Zen 4; the value set, or None."""
    environ = environ if environ is not None else os.environ
    modules = modules if modules is not None else sys.modules
    if "numpy" in modules or any(name in environ for name in USER_VARIABLES):
        return None
    if not is_zen4(_read_cpuinfo(cpuinfo)):  # no /proc/cpuinfo (macOS, Windows): not steered
        return None
    features = features_for(installed_numpy_version())
    if features is not None:
        environ[VARIABLE] = features
        if environ is os.environ:
            global _set_here
            _set_here = features
    return features


def without_own_setting(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` for a process on another machine: the variable dropped when this process set it."""
    env = dict(environ)
    if _set_here is not None and env.get(VARIABLE) == _set_here:
        del env[VARIABLE]
    return env
