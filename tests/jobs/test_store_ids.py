"""A job id SQLite cannot hold is a job that does not exist, not an overflow."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.errors import UsageError
from gpufleet.jobs.store import Store


@pytest.mark.parametrize("job_id", [10**30, 2**63, 0, -1])
def test_an_impossible_job_id_is_no_job(tmp_path: Path, job_id: int) -> None:
    with pytest.raises(UsageError, match=f"no job {job_id} in "):
        Store(tmp_path / "state.db").job(job_id)
