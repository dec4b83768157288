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
``gpufleet`` is imported (every command does first) and does nothing once numpy is imported. Only a
numpy from a portable wheel (PyPI's ``manylinux``/``musllinux``, per its ``WHEEL`` file) is steered:
numpy refuses to import at all when a disabled target is part of its baseline, which a build for
this very CPU (``-Dcpu-baseline=native``) may make AVX-512, and a wheel built for every x86-64 never.

The value is marked as gpufleet's (``GPUFLEET_NUMPY_STEERED``), so what it starts can tell it from
the user's own. A process that imports gpufleet decides again for its own numpy (another venv's
may take other names, or none); what runs a job's own code (an attempt, a Slurm batch job) gets
its environment without gpufleet's setting (:func:`without_own_setting`), as the user's shell had
it. A job that imports gpufleet before numpy is steered by that import, and so is every attempt the
local backend's warm start forks (its server imported numpy the way gpufleet does). Setting
``NPY_DISABLE_CPU_FEATURES`` (even to nothing) or ``NPY_ENABLE_CPU_FEATURES`` yourself turns this off.
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

MARKER = "GPUFLEET_NUMPY_STEERED"
"""Set beside ``NPY_DISABLE_CPU_FEATURES`` to the same value: the setting is gpufleet's, not the user's."""


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
    found = _installed_numpy(path)
    return None if found is None else found[1]


def portable_numpy(path: list[str] | None = None) -> tuple[int, int] | None:
    """The version of the numpy on ``sys.path`` when it was installed from a portable wheel, else None."""
    found = _installed_numpy(path)
    if found is None or found[1] is None:
        return None
    entry, version, full = found
    return version if _portable_wheel(os.path.join(entry, f"numpy-{full}.dist-info", "WHEEL")) else None


def _installed_numpy(path: list[str] | None) -> tuple[str, tuple[int, int] | None, str] | None:
    """Where numpy is (the ``sys.path`` entry), its major and minor version and its full version text."""
    for entry in path if path is not None else sys.path:
        if not isinstance(entry, str):  # sys.path may hold bytes; the import system skips them too
            continue
        try:
            with open(os.path.join(entry or ".", "numpy", "version.py"), encoding="utf-8") as f:
                text = f.read(4096)
        except (OSError, UnicodeDecodeError):
            continue
        full = _version_text(text)
        return entry or ".", _major_minor(full), full or ""
    return None


def _portable_wheel(wheel_file: str) -> bool:
    """Whether a ``WHEEL`` file tags every platform ``manylinux*`` or ``musllinux*`` (built for any x86-64)."""
    try:
        with open(wheel_file, encoding="utf-8") as f:
            text = f.read(4096)
    except (OSError, UnicodeDecodeError):
        return False
    platforms = [
        line.split(":", 1)[1].strip().rsplit("-", 1)[-1] for line in text.splitlines() if line.startswith("Tag:")
    ]
    return bool(platforms) and all(p.startswith(("manylinux", "musllinux")) for p in platforms)


def _version_text(text: str) -> str | None:
    """``2.4.6`` from the line ``version = "2.4.6"`` (or ``version: str = ...``) of numpy's ``version.py``."""
    for line in text.splitlines():
        name, eq, value = line.partition("=")
        if eq and name.split(":")[0].strip() == "version":
            return value.strip().strip("'\"")
    return None


def _major_minor(version: str | None) -> tuple[int, int] | None:
    parts = (version or "").split(".")
    if len(parts) >= 2 and parts[0].isdigit() and parts[1].isdigit():
        return int(parts[0]), int(parts[1])
    return None


def _read_cpuinfo(path: str) -> str:
    try:
        with open(path, "rb") as f:  # the first processor is in the first few KiB
            return f.read(16384).decode("ascii", "replace")
    except OSError:
        return ""


def inherited(environ: Mapping[str, str]) -> bool:
    """Whether ``environ``'s ``NPY_DISABLE_CPU_FEATURES`` is gpufleet's setting (marked), not the user's."""
    value = environ.get(MARKER)
    return value is not None and environ.get(VARIABLE) == value and "NPY_ENABLE_CPU_FEATURES" not in environ


def steer(
    environ: MutableMapping[str, str] | None = None,
    modules: Mapping[str, object] | None = None,
    cpuinfo: str = CPUINFO,
    path: list[str] | None = None,
) -> str | None:
    """Set ``NPY_DISABLE_CPU_FEATURES`` for numpy's AVX2 kernels on Zen 4; the value set, or None.

    A value gpufleet set in a parent process is decided again here, for this interpreter's numpy.
    """
    environ = environ if environ is not None else os.environ
    modules = modules if modules is not None else sys.modules
    if "numpy" in modules:
        return None  # too late: numpy read the variable when it was imported
    if inherited(environ):
        del environ[VARIABLE], environ[MARKER]
    elif any(name in environ for name in USER_VARIABLES):
        return None  # the user's own setting
    environ.pop(MARKER, None)  # a marker without the value it marks means nothing
    if not is_zen4(_read_cpuinfo(cpuinfo)):  # no /proc/cpuinfo (macOS, Windows): not steered
        return None
    features = features_for(portable_numpy(path))
    if features is not None:
        environ[VARIABLE] = environ[MARKER] = features
    return features


def without_own_setting(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` for what runs a job's own code (here or on another machine): gpufleet's setting dropped."""
    env = dict(environ)
    if inherited(env):
        del env[VARIABLE]
    env.pop(MARKER, None)
    return env
