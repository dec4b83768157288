"""Read the tables a drift report compares: CSV or Parquet, chosen by the file's extension.

Files are untrusted input: every failure (missing file, unknown extension, unparsable content,
no engine for Parquet) becomes one :class:`UsageError` naming the path and the fix.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from gpufleet.errors import UsageError

if TYPE_CHECKING:
    import pandas as pd

CSV_SUFFIXES = (".csv", ".csv.gz", ".tsv")
PARQUET_SUFFIXES = (".parquet", ".pq")


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
    if not path.is_file():
        raise UsageError(f"{path}: no such file; check the path")
    try:
        if fmt == "parquet":
            return pd.read_parquet(path)
        return pd.read_csv(path, sep="\t" if path.name.lower().endswith(".tsv") else ",")
    except ImportError as err:
        raise UsageError(f"{path}: reading Parquet needs pyarrow: pip install pyarrow ({err})") from err
    except (ValueError, OSError, pd.errors.ParserError, UnicodeDecodeError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UsageError(f"{path}: cannot read it as {fmt}: {first}") from err


__all__ = ["CSV_SUFFIXES", "PARQUET_SUFFIXES", "read_table", "table_format"]
