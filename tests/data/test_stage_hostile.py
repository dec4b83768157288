"""Staging never widens what a source lets others read, and never reads from a link-local or metadata host.

Copies keep a local source's permission bits (a shared blob drops the write bits only); a source or an
``endpoint_url`` whose host is a link-local or cloud metadata address is refused at submit (written as an
address) and at stage time (a name that resolves to one), unless the source sets ``allow_link_local``.
"""

from __future__ import annotations

import json
import os
import socket
import stat
from pathlib import Path
from typing import Any

import pytest
from conftest import run_cli

from gpufleet.data.stage import StageError, Stager
from gpufleet.spec import DataPolicy, parse_spec

MODES = {"private.bin": 0o600, "group.bin": 0o640, "open.bin": 0o644, "readonly.bin": 0o444}


def policy(*sources: dict[str, Any]) -> DataPolicy:
    spec = parse_spec({"name": "x", "entrypoint": "m:f", "data": {"sources": list(sources)}})
    assert spec.data is not None
    return spec.data


def source_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "src"
    folder.mkdir()
    for name, mode in MODES.items():
        path = folder / name
        path.write_bytes(name.encode() * 100)
        path.chmod(mode)
    return folder


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def umask_022() -> Any:
    old = os.umask(0o022)
    yield
    os.umask(old)


@pytest.mark.usefixtures("umask_022")
def test_a_job_copy_keeps_the_source_files_permission_bits(tmp_path: Path) -> None:
    src = source_folder(tmp_path)
    Stager(policy({"source": str(src), "dest": "d"}), tmp_path / "data").run()
    assert {name: mode(tmp_path / "data" / "d" / name) for name in MODES} == MODES


@pytest.mark.usefixtures("umask_022")
def test_a_shared_blob_drops_write_bits_and_is_narrowed_for_a_narrower_source(tmp_path: Path) -> None:
    src = source_folder(tmp_path)
    p = policy({"source": str(src), "dest": "d", "cache": "shared"})
    Stager(p, tmp_path / "job1", cache_root=tmp_path / "cache").run()
    linked = {name: mode(tmp_path / "job1" / "d" / name) for name in MODES}
    assert linked == {name: bits & ~0o222 for name, bits in MODES.items()}
    (src / "open.bin").chmod(0o600)  # the source narrowed since: the blob it reuses follows
    again = Stager(p, tmp_path / "job2", cache_root=tmp_path / "cache").run()
    assert again.files_copied == 0
    assert mode(tmp_path / "job2" / "d" / "open.bin") == 0o400
    for blob in (tmp_path / "cache" / "blobs").rglob("sha256-*"):
        assert mode(blob) & 0o044 in (0, 0o040, 0o044) and not mode(blob) & 0o222


REFUSED = [
    {"source": "s3://b/x", "dest": "d", "endpoint_url": "http://169.254.169.254"},
    {"source": "s3://b/x", "dest": "d", "endpoint_url": "http://[fe80::1]:9000"},
    {"source": "s3://b/x", "dest": "d", "endpoint_url": "http://[fd00:ec2::254]/"},
    {"source": "s3://b/x", "dest": "d", "endpoint_url": "http://metadata.google.internal"},
    {"source": "s3://b/x", "dest": "d", "endpoint_url": "http://2852039166:80"},  # 169.254.169.254 as one number
    {"source": "s3://b/x", "dest": "d", "endpoint_url": "http://[::ffff:169.254.169.254]"},
    {"source": "hdfs://169.254.10.1:8020/data", "dest": "d"},
]


@pytest.mark.parametrize("source", REFUSED, ids=lambda s: s.get("endpoint_url") or s["source"])
def test_a_link_local_or_metadata_host_is_refused_at_submit(
    source: dict[str, Any], capsys: Any, monkeypatch: Any, home: Path, tmp_path: Path
) -> None:
    from conftest import assert_refused

    path = tmp_path / "job.yaml"
    path.write_text(
        json.dumps({"name": "bad", "entrypoint": "gpufleet.workloads.toy:train", "data": {"sources": [source]}})
    )
    code, _, err = run_cli(capsys, monkeypatch, "submit", str(path))
    assert_refused(code, err, home, "link-local", "allow_link_local: true")
    assert policy({**source, "allow_link_local": True}).sources[0].allow_link_local


@pytest.mark.parametrize("scheme", ["http", "https", "ftp", "sftp", "webdav", "github"])
def test_a_scheme_the_stager_does_not_read_is_refused_at_submit(
    scheme: str, capsys: Any, monkeypatch: Any, home: Path, tmp_path: Path
) -> None:
    from conftest import assert_refused

    path = tmp_path / "job.yaml"
    data = {"sources": [{"source": f"{scheme}://host/x", "dest": "d"}]}
    path.write_text(json.dumps({"name": "bad", "entrypoint": "gpufleet.workloads.toy:train", "data": data}))
    code, _, err = run_cli(capsys, monkeypatch, "submit", str(path))
    assert_refused(code, err, home, f"unknown URL scheme {scheme!r}")


def test_a_name_that_resolves_to_a_metadata_address_is_refused_at_stage_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = socket.getaddrinfo

    def resolve(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host == "store.internal.test":
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("169.254.169.254", 0))]
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", resolve)  # what the stager resolves with
    p = policy({"source": "s3://b/x", "dest": "d", "endpoint_url": "http://store.internal.test:9000"})
    with pytest.raises(StageError, match=r"resolved to 169\.254\.169\.254") as err:
        Stager(p, tmp_path / "data").run()
    assert "allow_link_local: true" in str(err.value)
    assert not (tmp_path / "data").exists()
