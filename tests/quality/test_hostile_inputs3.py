"""Hostile inputs for the webhook journal and body, and for the tables ``drift`` reads."""

from __future__ import annotations

import json
import logging
import time
import zlib
from pathlib import Path
from typing import Any

import pytest

from gpufleet import tables as table_io
from gpufleet.errors import UsageError
from gpufleet.quality.webhook import AlertPayload, AlertReceiver, signed_headers
from gpufleet.tables import MAX_TABLE_BYTES, MAX_TABLE_CELLS, read_table

SECRET = b"hostile-inputs3-secret-0123456789abcdef"
ALERT: dict[str, Any] = {
    "schema_version": 1,
    "model": "tabular-demo",
    "action": "retrain",
    "window": "window-7",
    "dataset": "current",
    "reasons": ["dataset drift in 2 consecutive windows"],
    "evidence": {"share_drifted": 0.6},
}


def handler(alert: AlertPayload, key: str) -> dict[str, Any]:
    return {"handled": key}


# --- webhook journal --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad",
    [b"\xff\xfe\n", b"[" * 50_000 + b"\n", b"{" * 50_000 + b"\n"],
    ids=["not-utf8", "deep-list", "deep-object"],
)
def test_a_corrupt_journal_line_is_skipped_with_a_warning(
    tmp_path: Path, bad: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    journal = tmp_path / "webhook-keys.jsonl"
    good = json.dumps({"key": "alert-kept-0001", "signature": "sha256=" + "a" * 64, "expires": time.time() + 600})
    journal.write_bytes(bad + good.encode() + b"\n")
    with caplog.at_level(logging.WARNING, logger="gpufleet.quality.webhook"):
        receiver = AlertReceiver(SECRET, handler, journal=journal)
    assert "corrupt" in caplog.text
    body = json.dumps(ALERT).encode()
    reply = receiver.handle(signed_headers(SECRET, body, idempotency_key="alert-kept-0001"), body)
    assert reply.status == 409, "the good line after the corrupt one still counts"


def test_a_signed_deeply_nested_body_is_answered_400() -> None:
    receiver = AlertReceiver(SECRET, handler)
    body = b"[" * 30_000 + b"]" * 30_000
    assert len(body) <= receiver.max_body
    reply = receiver.handle(signed_headers(SECRET, body), body)
    assert reply.status == 400
    assert "nested too deeply" in reply.body["reason"]


# --- drift tables -----------------------------------------------------------------------------


def _gzip_bomb(path: Path, decompressed: int) -> None:
    chunk = b"1,2\n" * (1 << 18)  # 1 MiB
    comp = zlib.compressobj(9, zlib.DEFLATED, 31)  # gzip container
    with path.open("wb") as fh:
        fh.write(comp.compress(b"a,b\n"))
        for _ in range(decompressed // len(chunk)):
            fh.write(comp.compress(chunk))
        fh.write(comp.flush())


def test_a_gzip_bomb_is_refused_quickly_under_the_decompressed_cap(tmp_path: Path) -> None:
    assert MAX_TABLE_BYTES <= 256 << 20, "pandas needs several times the text: the cap must stay low"
    bomb = tmp_path / "bomb.csv.gz"
    _gzip_bomb(bomb, MAX_TABLE_BYTES + (32 << 20))
    assert bomb.stat().st_size < 1 << 20
    start = time.process_time()
    with pytest.raises(UsageError, match=f"decompresses to more than {MAX_TABLE_BYTES:,} bytes"):
        read_table(bomb)
    assert time.process_time() - start < 10


def test_the_gzip_size_is_checked_before_pandas_parses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(table_io, "MAX_TABLE_BYTES", 100_000)
    bomb = tmp_path / "bomb.csv.gz"
    _gzip_bomb(bomb, 4 << 20)

    def no_parse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("pandas was handed a gzip bomb")

    monkeypatch.setattr("pandas.read_csv", no_parse)
    with pytest.raises(UsageError, match="decompresses to more than 100,000 bytes"):
        read_table(bomb)


def test_a_gzip_under_the_cap_still_reads(tmp_path: Path) -> None:
    small = tmp_path / "small.csv.gz"
    _gzip_bomb(small, 1 << 20)
    frame = read_table(small)
    assert frame.shape == (1 << 18, 2)


def test_a_plain_csv_over_the_cap_is_refused_before_reading(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(table_io, "MAX_TABLE_BYTES", 1000)
    big = tmp_path / "big.csv"
    big.write_bytes(b"a,b\n" + b"1,2\n" * 1000)
    with pytest.raises(UsageError, match="larger than 1,000 bytes"):
        read_table(big)


def test_a_parquet_declaring_too_many_values_is_refused_from_its_metadata(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    rows = MAX_TABLE_CELLS // 2 + 1
    table = pa.table({"a": pa.nulls(rows, pa.int8()), "b": pa.nulls(rows, pa.int8())})
    path = tmp_path / "many.parquet"
    pq.write_table(table, path, compression="zstd")
    assert path.stat().st_size < MAX_TABLE_BYTES
    with pytest.raises(UsageError, match="rows x 2 columns"):
        read_table(path)


def test_a_small_parquet_still_reads(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "ok.parquet"
    pq.write_table(pa.table({"a": [1, 2, 3]}), path)
    assert read_table(path).shape == (3, 1)
