"""The model-quality loop: drift statistics, monitors over time, and the labs that exercise them.

``drift`` is pure (numpy/scipy); ``io`` reads tables; ``monitor`` adds time (season-matched
references and a placebo null band); ``embeddings`` puts a sentence encoder in front of MMD.
Heavy imports (pandas, sentence-transformers) stay inside the functions that need them.

Floor 11 of the layers (the Layout in docs/architecture.md): imports only the leaves (errors, paths,
yamlio, fmt, units, ...), spec/, jobs/, estimate/, iobench/, telemetry/, runtime/, cost/, data/, rl/,
workloads/, devtools/, placement/, backends/.
"""

from __future__ import annotations

from gpufleet.quality.drift import ColumnDrift, DriftReport, drift_report

__all__ = ["ColumnDrift", "DriftReport", "drift_report"]
