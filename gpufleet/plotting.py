"""Figures written to a file (matplotlib's Agg backend: no display needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpufleet.errors import UsageError


def figure(rows: int = 1, cols: int = 1, size: tuple[float, float] = (8, 4.8)) -> tuple[Any, Any]:
    """A new figure and its axes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(rows, cols, figsize=size)


def save_figure(fig: Any, path: Path) -> str:
    """Write ``fig`` to ``path`` (its suffix picks the format) and close it; an unwritable path is a UsageError."""
    import matplotlib.pyplot as plt

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
    except (OSError, ValueError) as err:
        raise UsageError(f"cannot write the plot to {str(path)!r}: {err}") from None
    finally:
        plt.close(fig)
    return str(path)


__all__ = ["figure", "save_figure"]
