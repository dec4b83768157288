"""Read a table a user gives: CSV or Parquet, chosen by the file's extension.

The one reader of tables for every part that takes one: a drift report's two tables, the standing
monitor's windows, the tabular workload's training data and the datasets the model registry logs.
It lives below them all (it needs only pandas, and pyarrow for Parquet), so the workloads read
through it without importing the quality loop.

Files are untrusted input: every failure (missing file, unknown extension, not a regular file,
too large, unparsable or truncated content, no pyarrow for Parquet) becomes one
:class:`UsageError` naming the path and the fix.
"""

from __future__ import annotations

import gzip
import io
import os
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from gpufleet.errors import UsageError
from gpufleet.extras import missing_extra, require
from gpufleet.yamlio import open_regular

if TYPE_CHECKING:
    import pandas as pd

CSV_SUFFIXES = (".csv", ".csv.gz", ".tsv")
PARQUET_SUFFIXES = (".parquet", ".pq")
MAX_TABLE_BYTES = 128 << 20
"""Largest table read: 128 MiB on disk, and once decompressed for a ``.csv.gz`` (a gzip bomb stops there).

pandas needs several times a CSV's size once parsed (a 128 MiB file of ``1,2`` lines is 33 million
rows, about 0.9 GiB while parsing) and a drift report holds two tables: this keeps both well within
a few GiB of memory.
"""
MAX_TABLE_CELLS = 1 << 25
"""Most rows x columns a Parquet file may declare (its metadata is read before the data)."""
_CHUNK = 1 << 20
_EXPECT = "a CSV or Parquet file"


class _TooLarge(Exception):
    """A compressed table that decompresses to more than :data:`MAX_TABLE_BYTES`."""


class _Capped(io.RawIOBase):
    """A reader of ``inner`` that raises :class:`_TooLarge` once more than ``limit`` bytes came out of it."""

    def __init__(self, inner: io.BufferedIOBase, limit: int) -> None:
        self._inner, self._left = inner, limit

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        data = self._inner.read(len(buffer))
        self._left -= len(data)
        if self._left < 0:
            raise _TooLarge
        buffer[: len(data)] = data
        return len(data)


def _check_gzip_size(fh: BinaryIO, limit: int) -> None:
    """Decompress ``fh`` in chunks, keeping nothing, and raise :class:`_TooLarge` past ``limit`` bytes."""
    seen = 0
    with gzip.GzipFile(fileobj=fh) as gz:
        while chunk := gz.read(_CHUNK):
            seen += len(chunk)
            if seen > limit:
                raise _TooLarge
    fh.seek(0)


def _check_parquet_size(path: Path, fh: BinaryIO) -> None:
    """Refuse a Parquet file whose metadata declares more than the cell or byte limits."""
    pq = require("pyarrow.parquet", "quality", f"{path}: reading Parquet")
    meta = pq.ParquetFile(fh).metadata
    cells = meta.num_rows * max(meta.num_columns, 1)
    if cells > MAX_TABLE_CELLS:
        raise UsageError(
            f"{path}: declares {meta.num_rows:,} rows x {meta.num_columns:,} columns, more than the "
            f"{MAX_TABLE_CELLS:,} values allowed for {_EXPECT}: sample it, or split it"
        )
    size = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
    if size > MAX_TABLE_BYTES:
        raise UsageError(
            f"{path}: decompresses to more than {MAX_TABLE_BYTES:,} bytes ({size:,}), the limit for {_EXPECT}: "
            "sample it, or split it"
        )
    fh.seek(0)


def table_format(path: Path) -> str:
    """``csv`` or ``parquet`` from the extension; a :class:`UsageError` for anything else."""
    name = path.name.lower()
    if name.endswith(CSV_SUFFIXES):
        return "csv"
    if name.endswith(PARQUET_SUFFIXES):
        return "parquet"
    raise UsageError(f"{path}: unknown table format; give a .csv, .tsv or .parquet file")


def read_table(path: Path | str) -> pd.DataFrame:
    """The table at ``path`` as a DataFrame (CSV: comma, or tab for .tsv; Parquet via pyarrow)."""
    import pandas as pd

    path = Path(path)
    fmt = table_format(path)
    try:
        os.stat(path)
    except FileNotFoundError:
        raise UsageError(f"{path}: no such file; check the path") from None
    except (OSError, ValueError):
        pass  # a name too long, a NUL in it: open_regular names the problem
    name = path.name.lower()
    with open_regular(path, what="table", error=UsageError, max_bytes=MAX_TABLE_BYTES, expect=_EXPECT) as fh:
        try:
            if fmt == "parquet":
                _check_parquet_size(path, fh)
                return pd.read_parquet(fh)
            sep = "\t" if name.endswith(".tsv") else ","
            if name.endswith(".gz"):
                _check_gzip_size(fh, MAX_TABLE_BYTES)  # a bomb is refused before pandas sees a byte
                with gzip.GzipFile(fileobj=fh) as gz:
                    return pd.read_csv(io.BufferedReader(_Capped(gz, MAX_TABLE_BYTES)), sep=sep)
            return pd.read_csv(fh, sep=sep)
        except ImportError as err:  # pandas' own check of its Parquet engine (a pyarrow too old for it)
            raise missing_extra("pyarrow", "quality", f"{path}: reading Parquet", err) from None
        except _TooLarge:
            raise UsageError(
                f"{path}: decompresses to more than {MAX_TABLE_BYTES:,} bytes, the limit for {_EXPECT}: "
                "sample it, or split it"
            ) from None
        except MemoryError:
            raise UsageError(f"{path}: too large to hold in memory as a table: sample it, or split it") from None
        except EOFError as err:  # a truncated .csv.gz; left alone, Click would take it for Ctrl-D (exit 130)
            raise UsageError(f"{path}: cannot read it as {fmt}: it is truncated ({err}); copy it again") from None
        except (ValueError, OSError, zlib.error, pd.errors.ParserError, UnicodeDecodeError) as err:
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise UsageError(f"{path}: cannot read it as {fmt}: {first}") from err


__all__ = ["CSV_SUFFIXES", "MAX_TABLE_BYTES", "MAX_TABLE_CELLS", "PARQUET_SUFFIXES", "read_table", "table_format"]
