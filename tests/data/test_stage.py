"""Staging against a real S3-protocol server and local folders: checked, resumable, shared, refused."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, S3, shards

from gpufleet.data.stage import Listed, StageError, Stager, copy_verified, stage_for_attempt
from gpufleet.spec import DataPolicy, parse_spec


def policy(*sources: dict[str, Any], **options: Any) -> DataPolicy:
    spec = parse_spec({"name": "x", "entrypoint": "m:f", "data": {"sources": list(sources), **options}})
    assert spec.data is not None
    return spec.data


def files_under(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and ".gpufleet" not in p.parts
    }


def test_s3_and_local_sources_land_verified_and_a_rerun_copies_nothing(s3: S3, tmp_path: Path) -> None:
    s3.client.create_bucket(Bucket="corpus")
    objects = shards(12, 300_000)
    for name, body in objects.items():
        s3.put("corpus", f"train/part/{name}", body)
    import boto3
    from botocore.config import Config  # type: ignore[import-untyped]

    bare = boto3.client("s3", endpoint_url=s3.endpoint, config=Config(request_checksum_calculation="when_required"))
    bare.put_object(Bucket="corpus", Key="train/part/old.bin", Body=b"uploaded without a checksum")  # ETag only
    objects["old.bin"] = b"uploaded without a checksum"
    local = tmp_path / "vocab"
    (local / "sub").mkdir(parents=True)
    (local / "sub" / "vocab.txt").write_text("a b c\n")
    data = tmp_path / "data"
    p = policy(
        {"source": "s3://corpus/train", "dest": "train"},
        {"source": str(local), "dest": "vocab"},
        workers=4,
    )

    first = Stager(p, data).run()
    assert (first.files, first.files_copied, first.files_reused) == (14, 14, 0)
    assert first.bytes_copied == 12 * 300_000 + 27 + 6
    assert first.sources[0].checksums == {"crc32": 12, "md5": 1}  # the objects' own CRC32, else the ETag
    assert first.sources[1].checksums == {"sha256": 1}  # a manifest of the first copy
    assert files_under(data / "train") == {f"part/{k}": v for k, v in objects.items()}
    assert (data / "vocab" / "sub" / "vocab.txt").read_text() == "a b c\n"

    again = Stager(p, data).run()
    assert (again.files_copied, again.files_reused, again.bytes_copied) == (0, 14, 0)
    full = Stager(policy(*[s.model_dump() for s in p.sources], verify="full"), data).run()
    assert (full.files_copied, full.files_reused) == (0, 14)


def test_a_rerun_copies_only_what_is_missing_or_wrong(s3: S3, tmp_path: Path) -> None:
    s3.client.create_bucket(Bucket="corpus")
    objects = shards(8, 100_000, seed=1)
    for name, body in objects.items():
        s3.put("corpus", f"p/{name}", body)
    data = tmp_path / "data"
    p = policy({"source": "s3://corpus/p", "dest": "train"})
    Stager(p, data).run()
    (data / "train" / "shard-002.bin").unlink()
    wrong = data / "train" / "shard-005.bin"
    flipped = bytearray(wrong.read_bytes())
    flipped[1000] ^= 0xFF
    wrong.write_bytes(bytes(flipped))  # same size, new content and modification time
    (data / "train" / ".shard-006.bin.gfpart-1-2").write_bytes(b"half")  # left by a killed copy

    again = Stager(p, data).run()
    assert (again.files_copied, again.files_reused) == (2, 6)
    assert files_under(data / "train") == objects


def test_a_changed_source_is_copied_again(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.bin").write_bytes(b"one")
    (src / "b.bin").write_bytes(b"two")
    data = tmp_path / "data"
    p = policy({"source": str(src), "dest": "d"})
    Stager(p, data).run()
    (src / "b.bin").write_bytes(b"three")
    report = Stager(p, data).run()
    assert (report.files_copied, report.files_reused) == (1, 1)
    assert (data / "d" / "b.bin").read_bytes() == b"three"


def test_an_object_corrupted_behind_its_etag_fails_naming_it_and_leaves_nothing_verified(
    s3: S3, tmp_path: Path
) -> None:
    s3.client.create_bucket(Bucket="corpus")
    objects = shards(4, 50_000, seed=2)
    for name, body in objects.items():
        s3.put("corpus", f"p/{name}", body)
    data = tmp_path / "data"
    p = policy({"source": "s3://corpus/p", "dest": "train"})
    Stager(p, data).run()
    (data / "train" / "shard-001.bin").unlink()
    stored = s3.stored("corpus", "p/shard-001.bin")
    etag = stored.etag
    buffer = stored._value_buffer  # the server's bytes, changed without a new ETag
    buffer.seek(10)
    buffer.write(b"rot")
    assert stored.etag == etag

    with pytest.raises(StageError) as err:
        Stager(p, data).run()
    assert "s3://corpus/p/shard-001.bin" in str(err.value) and "checksum" in str(err.value)
    assert err.value.file == "s3://corpus/p/shard-001.bin"
    assert not (data / "train" / "shard-001.bin").exists()
    assert not list((data / "train").glob("*gfpart*"))


def test_a_file_that_changed_size_during_the_copy_is_refused(tmp_path: Path) -> None:
    import fsspec

    src = tmp_path / "grown.bin"
    src.write_bytes(b"x" * 12)
    listed = Listed(rel="grown.bin", path=str(src), url=str(src), size=10, version="v")
    with pytest.raises(StageError, match=r"changed size during the copy: listed 10 bytes, read 12"):
        copy_verified(fsspec.filesystem("file"), listed, tmp_path / "out", lambda n: None)
    assert not any((tmp_path / "out").iterdir())


@pytest.mark.parametrize(
    ("source", "needle"),
    [
        ("s3://no-such-bucket/x", "does not exist"),
        ("s3://corpus/nothing-here", "does not exist"),
    ],
)
def test_a_missing_source_fails_naming_it(s3: S3, tmp_path: Path, source: str, needle: str) -> None:
    s3.client.create_bucket(Bucket="corpus")
    with pytest.raises(StageError) as err:
        Stager(policy({"source": source, "dest": "d"}), tmp_path / "data").run()
    assert source in str(err.value) and needle in str(err.value)
    assert not (tmp_path / "data" / "d").exists() or not any((tmp_path / "data" / "d").iterdir())


def test_a_key_that_would_land_outside_its_folder_is_refused(s3: S3, tmp_path: Path) -> None:
    s3.client.create_bucket(Bucket="corpus")
    s3.put("corpus", "p/ok.bin", b"ok")
    s3.put("corpus", "p/a/../../escape.bin", b"bad")
    with pytest.raises(StageError, match=r"escape\.bin.*'\.\.' part"):
        Stager(policy({"source": "s3://corpus/p", "dest": "d"}), tmp_path / "job" / "data").run()
    assert not list(tmp_path.rglob("escape.bin"))


def test_missing_credentials_fail_with_the_fix(s3: S3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s3.client.create_bucket(Bucket="corpus")
    s3.put("corpus", "p/a.bin", b"a")
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with pytest.raises(StageError, match=r"s3://corpus/p.*AWS_ACCESS_KEY_ID"):
        Stager(policy({"source": "s3://corpus/p", "dest": "d"}), tmp_path / "data").run()


def test_the_shared_cache_stores_each_content_once_for_every_job(s3: S3, tmp_path: Path) -> None:
    s3.client.create_bucket(Bucket="corpus")
    objects = shards(5, 64_000, seed=3)
    for name, body in objects.items():
        s3.put("corpus", f"p/{name}", body)
    s3.put("corpus", "q/same-as-0.bin", objects["shard-000.bin"])
    cache = tmp_path / "cache"
    p = policy({"source": "s3://corpus/p", "dest": "train", "cache": "shared"})

    one = Stager(p, tmp_path / "job1", cache_root=cache).run()
    two = Stager(p, tmp_path / "job2", cache_root=cache).run()
    assert (one.files_copied, two.files_copied, two.files_reused) == (5, 0, 5)
    same = Stager(
        policy({"source": "s3://corpus/q", "dest": "q", "cache": "shared"}), tmp_path / "job3", cache_root=cache
    ).run()
    assert same.files_copied == 0  # the same bytes under another key: its MD5 names a blob already there
    blobs = [p for p in (cache / "blobs").rglob("md5-*")]
    assert len(blobs) == 5 and all(not os.access(b, os.W_OK) or os.geteuid() == 0 for b in blobs)
    assert all(oct(b.stat().st_mode & 0o777) == oct(0o444) for b in blobs)
    for name, body in objects.items():
        a, b = tmp_path / "job1" / "train" / name, tmp_path / "job2" / "train" / name
        assert a.read_bytes() == body and a.stat().st_ino == b.stat().st_ino  # one copy on disk


def test_kill_9_during_stage_in_then_the_next_attempt_copies_only_the_rest(
    s3: S3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store stalls on one object; the stager is killed with SIGKILL mid-copy; attempt 2 finishes."""
    from moto.s3.models import FakeKey

    s3.client.create_bucket(Bucket="corpus")
    objects = shards(16, 200_000, seed=4)
    for name, body in objects.items():
        s3.put("corpus", f"p/{name}", body)
    gate, stalled = threading.Event(), threading.Event()
    value: Any = FakeKey.value

    def stalling(key: Any) -> Any:
        if key.name == "p/shard-009.bin" and not gate.is_set():
            stalled.set()
            gate.wait(120)
        return value.fget(key)

    monkeypatch.setattr(FakeKey, "value", property(stalling, value.fset))
    job = tmp_path / "job"
    spec = {
        "name": "x",
        "entrypoint": "m:f",
        "data": {"sources": [{"source": "s3://corpus/p", "dest": "train"}], "workers": 2},
    }
    (tmp_path / "spec.json").write_text(__import__("json").dumps(spec))
    env = {
        **os.environ,
        "GPUFLEET_SPEC": str(tmp_path / "spec.json"),
        "GPUFLEET_JOB_DIR": str(job),
        "GPUFLEET_DATA_DIR": str(job / "data"),
        "GPUFLEET_EVENTS": str(job / "events.jsonl"),
        "GPUFLEET_HOME": str(tmp_path / "home"),
        "GPUFLEET_ATTEMPT": "1",
    }
    argv = [sys.executable, "-m", "gpufleet.data.stage_in", "--", sys.executable, "-c", "print('trained')"]
    proc = subprocess.Popen(argv, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert stalled.wait(120), "the stager never asked for the stalled object"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(60)
        gate.set()
    landed = {p.name for p in (job / "data" / "train").glob("shard-*.bin")}
    assert "shard-009.bin" not in landed and len(landed) < 16
    assert all((job / "data" / "train" / n).read_bytes() == objects[n] for n in landed)  # renamed only when verified

    env["GPUFLEET_ATTEMPT"] = "2"
    done = subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "trained"
    events = [__import__("json").loads(line) for line in (job / "events.jsonl").read_text().splitlines()]
    staged = [e for e in events if e["kind"] == "data_staged"]
    assert [e["attempt"] for e in staged] == [2]
    assert staged[0]["files_copied"] == 16 - len(landed) and staged[0]["files_reused"] == len(landed)
    assert files_under(job / "data" / "train") == objects
    assert not list((job / "data").rglob("*gfpart*"))


def test_only_the_first_rank_of_an_attempt_stages(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.bin").write_bytes(hashlib.sha256(b"a").digest())
    p = policy({"source": str(src), "dest": "d"})
    first = stage_for_attempt(p, tmp_path / "data", 1, cache_root=tmp_path / "cache")
    assert first is not None and first.files_copied == 1
    assert stage_for_attempt(p, tmp_path / "data", 1, cache_root=tmp_path / "cache") is None
    again = stage_for_attempt(p, tmp_path / "data", 2, cache_root=tmp_path / "cache")
    assert again is not None and (again.files_copied, again.files_reused) == (0, 1)
