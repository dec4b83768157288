"""The model-quality loop: drift statistics, monitors over time, and the labs that exercise them.

``drift`` is pure (numpy/scipy); ``io`` reads tables; ``monitor`` adds time (season-matched
references and a placebo null band); ``embeddings`` puts a sentence encoder in front of MMD.
Heavy imports (pandas, sentence-transformers) stay inside the functions that need them.

Floor 11 of the layers (the Layout in docs/architecture.md): imports only the leaves (errors, paths,
yamlio, fmt, units, ...), spec/, jobs/, estimate/, iobench/, telemetry/, runtime/, cost/, data/, rl/,
workloads/, devtools/, placement/, backends/.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpufleet.quality.drift import ColumnDrift, DriftReport, drift_report

__all__ = ["ColumnDrift", "DriftReport", "drift_report"]


def __getattr__(name: str) -> Any:
    """The drift names, imported on first use: a module of the package (the webhook receiver, the outbox's
    sender) loads scipy only if it measures drift."""
    if name in __all__:
        from gpufleet.quality import drift

        return getattr(drift, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
