"""Jobs with a `data` block on the local backend: staged before the first step, reused after a preemption."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from conftest import S3, drive, run_cli, shards

from gpufleet.cost.usage import job_usages
from gpufleet.spec import parse_spec

HERE = Path(__file__).resolve().parent


def test_a_users_script_trains_on_staged_data_and_its_restart_copies_nothing(local: Any, s3: S3, home: Path) -> None:
    backend, scheduler = local
    s3.client.create_bucket(Bucket="corpus")
    objects = shards(6, 170_000, seed=7)
    for name, body in objects.items():
        s3.put("corpus", f"train/{name}", body)
    spec = parse_spec(
        {
            "name": "shards",
            "entrypoint": ["python", "shard_train.py", "400", "0.01"],
            "workdir": str(HERE),
            "checkpoint": {"grace_seconds": 30},
            "data": {"sources": [{"source": "s3://corpus/train", "dest": "train", "endpoint_url": s3.endpoint}]},
        }
    )
    job = backend.submit(spec)
    progress = home / "jobs" / str(job) / "progress"

    def step() -> int:
        try:
            return int(progress.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return 0

    drive(scheduler, lambda: step() >= 10)
    backend.preempt(job)
    drive(scheduler, lambda: backend.store.job(job).state == "completed", timeout=240)

    attempts = backend.store.attempts(job)
    assert [a.outcome for a in attempts] == ["preempted", "completed"]
    staged = [e for e in backend.store.events(job) if e.kind == "data_staged"]
    assert [e.attempt for e in staged] == [1, 2]
    assert (staged[0].data["files_copied"], staged[0].data["bytes_copied"]) == (6, 6 * 170_000)
    assert (staged[1].data["files_copied"], staged[1].data["files_reused"]) == (0, 6)
    import hashlib

    digest = hashlib.sha256(b"".join(objects[k] for k in sorted(objects))).hexdigest()
    log = (home / "jobs" / str(job) / "logs" / "attempt-2.log").read_text()
    assert f"done 400 {digest}" in log  # the script read exactly the objects, in both attempts
    usage = {u.attempt: u for u in job_usages(backend.store, backend.store.job(job))}
    assert usage[1].staging_s > 0 and usage[1].staging_s == staged[0].data["seconds"]
    assert usage[2].staging_s == staged[1].data["seconds"]


def test_a_bad_source_fails_the_attempt_naming_the_file(local: Any, s3: S3, home: Path) -> None:
    backend, scheduler = local
    s3.client.create_bucket(Bucket="corpus")
    spec = parse_spec(
        {
            "name": "nodata",
            "entrypoint": "gpufleet.workloads.toy:train",
            "args": {"steps": 5},
            "max_restarts": 0,
            "data": {"sources": [{"source": "s3://corpus/missing/", "dest": "train"}]},
        }
    )
    job = backend.submit(spec)
    drive(scheduler, lambda: backend.store.job(job).state in ("failed", "completed"))
    assert backend.store.job(job).state == "failed"
    failed = [e for e in backend.store.events(job) if e.kind == "data_stage_failed"]
    assert len(failed) == 1 and "s3://corpus/missing" in failed[0].data["error"]
    assert not [e for e in backend.store.events(job) if e.kind == "train_start"]


def test_bad_data_blocks_are_refused_at_submit(capsys: Any, monkeypatch: Any, home: Path, tmp_path: Path) -> None:
    from conftest import assert_refused

    cases = [
        ({"sources": [{"source": "ftpx://host/x", "dest": "d"}]}, "unknown URL scheme 'ftpx'"),
        ({"sources": [{"source": "s3://b/x", "dest": "../escape"}]}, "'..' part"),
        ({"sources": [{"source": "s3://b/x", "dest": "/abs"}]}, "relative folder"),
        ({"sources": []}, "source list is empty"),
        ({"sources": [{"source": "s3://b/x", "dest": "d"}, {"source": "s3://b/y", "dest": "d/sub"}]}, "overlap"),
        ({"sources": [{"source": "memory://x", "dest": "d"}]}, "unknown URL scheme 'memory'"),
        ({"sources": [{"source": "zip://a::s3://b/x", "dest": "d"}]}, "chains"),
        ({"sources": [{"source": "/data/x", "dest": "d", "endpoint_url": "http://127.0.0.1:9"}]}, "s3:// sources only"),
    ]
    for data, needle in cases:
        path = tmp_path / "job.yaml"
        path.write_text(json.dumps({"name": "bad", "entrypoint": "gpufleet.workloads.toy:train", "data": data}))
        code, _, err = run_cli(capsys, monkeypatch, "submit", str(path))
        assert_refused(code, err, home, needle)


def test_a_relative_local_source_is_read_from_the_spec_files_folder(tmp_path: Path) -> None:
    from gpufleet.spec import load_spec

    (tmp_path / "sub").mkdir()
    path = tmp_path / "sub" / "job.yaml"
    path.write_text("name: rel\nentrypoint: m:f\ndata: {sources: [{source: ../corpus, dest: c}]}\n")
    spec = load_spec(path)
    assert spec.data is not None and spec.data.sources[0].source == str(tmp_path / "corpus")


def test_a_source_whose_package_is_missing_is_refused_at_submit(
    capsys: Any, monkeypatch: Any, home: Path, tmp_path: Path
) -> None:
    from conftest import assert_refused

    path = tmp_path / "job.yaml"
    path.write_text(
        "name: gcs\nentrypoint: gpufleet.workloads.toy:train\ndata: {sources: [{source: gs://b/x, dest: d}]}\n"
    )
    code, _, err = run_cli(capsys, monkeypatch, "submit", str(path))
    assert_refused(code, err, home, "gs://b/x", "gcsfs")
