"""A warm attempt runs with the thread counts its environment asks for, as a new interpreter does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from gpufleet.backends.local.warm import thread_variables_refused

PY = sys.executable
PROBE = "import torch\nprint('threads', torch.get_num_threads(), flush=True)\n"


CHILD = (
    "import os, torch\n"
    "from gpufleet.backends.local.warm_server import _apply_threads\n"
    "torch.get_num_threads()\n"  # read once, as the warm server did at its imports
    "os.environ['OMP_NUM_THREADS'] = '1'\n"
    "_apply_threads(os.environ)\n"
    "print('threads', torch.get_num_threads(), flush=True)\n"
)


def test_a_warm_attempt_uses_the_thread_count_its_environment_names(tmp_path: Path) -> None:
    (tmp_path / "probe.py").write_text(PROBE)
    base = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}
    fresh = subprocess.run(
        [PY, "probe.py"], cwd=tmp_path, env={**base, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, check=True
    )
    warm = subprocess.run([PY, "-c", CHILD], env=base, capture_output=True, text=True, check=True)
    assert warm.stdout.split() == fresh.stdout.split() == ["threads", "1"]


def test_an_attempt_without_the_servers_thread_count_starts_cold() -> None:
    assert thread_variables_refused({"OMP_NUM_THREADS": "4"}, {}) == ["OMP_NUM_THREADS"]
    assert thread_variables_refused({"OMP_NUM_THREADS": "4"}, {"OMP_NUM_THREADS": "zero"}) == ["OMP_NUM_THREADS"]
    assert thread_variables_refused({}, {"OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "3"}) == []
    assert thread_variables_refused({"OMP_NUM_THREADS": "4"}, {"OMP_NUM_THREADS": "4"}) == []
