"""Our drift report against Evidently 0.7's DataDriftPreset on the same data, in the same run.

    .venv/bin/python bench/drift_vs_evidently.py [--json] [--rows 200000] [--cols 10]

Evidently 0.7 needs pandas below 3, so it runs in its own virtualenv (``.dev/bench-evidently``,
created with ``evidently==0.7.*`` and ``pandas<3`` on first use) as a subprocess that reads the
same arrays from a temporary ``.npz`` and times only ``Report.run`` (its ~7 s import is not
counted). Ours is timed in this process on the same arrays (median of 3 runs).

1. Speed: 10 numeric columns x 200,000 rows a side (normed Wasserstein, Evidently's choice
   above 1,000 rows). Target: ours at least 100x faster.
2. Agreement: the per-column statistics of that run, plus two small mixed tables (800 and
   3,000 reference rows) where Evidently picks KS, chi-squared, the z-test, Jensen-Shannon and
   Wasserstein: same method per column, values within 1e-9.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, cast

import _common as common
import numpy as np
import pandas as pd

from gpufleet.quality.drift import DriftReport, drift_report

TARGET_SPEEDUP = 100.0
TARGET_DIFF = 1e-9
VENV = common.REPO_ROOT / ".dev" / "bench-evidently"
PROBE = "import evidently, pandas; assert evidently.__version__.startswith('0.7')"
REQUIREMENTS = ["evidently==0.7.*", "pandas<3"]
EVIDENTLY_NAMES = {
    "Wasserstein distance (normed)": "wasserstein",
    "K-S p_value": "ks",
    "chi-square p_value": "chi2",
    "Z-test p_value": "z",
    "Jensen-Shannon distance": "jensenshannon",
}

EVIDENTLY_SCRIPT = r"""
import json, sys, time
import numpy as np, pandas as pd
from evidently import DataDefinition, Dataset, Report
from evidently.presets import DataDriftPreset

def run(prefix, arrays, categorical):
    ref = pd.DataFrame({k[len(prefix) + 4:]: v for k, v in arrays.items() if k.startswith(prefix + "ref_")})
    cur = pd.DataFrame({k[len(prefix) + 4:]: v for k, v in arrays.items() if k.startswith(prefix + "cur_")})
    numeric = [c for c in ref.columns if c not in categorical]
    cats = [c for c in ref.columns if c in categorical]
    definition = DataDefinition(numerical_columns=numeric, categorical_columns=cats)
    cur_ds = Dataset.from_pandas(cur, data_definition=definition)
    ref_ds = Dataset.from_pandas(ref, data_definition=definition)
    started = time.perf_counter()
    snapshot = Report([DataDriftPreset()]).run(cur_ds, ref_ds)
    seconds = time.perf_counter() - started
    columns = {}
    for m in snapshot.dict()["metrics"]:
        cfg = m["config"]
        if cfg.get("type", "").endswith("ValueDrift"):
            value = float(m["value"])
            columns[cfg["column"]] = {"method": cfg["method"], "value": value, "threshold": cfg["threshold"]}
        elif cfg.get("type", "").endswith("DriftedColumnsCount"):
            share = float(m["value"]["share"])
    return {"seconds": seconds, "columns": columns, "share": share}

arrays = dict(np.load(sys.argv[1], allow_pickle=False))
categorical = set(json.loads(sys.argv[2]))
out = {prefix: run(prefix + "_", arrays, categorical) for prefix in ("big", "mix", "large")}
import evidently
out["version"] = evidently.__version__
out["pandas"] = pd.__version__
print(json.dumps(out))
"""


def datasets(rows: int, cols: int, seed: int) -> tuple[dict[str, np.ndarray], list[str]]:
    """The big numeric table (a third of the columns shifted) and a small mixed one, as flat arrays."""
    g = np.random.default_rng(seed)
    arrays: dict[str, np.ndarray] = {}
    for i in range(cols):
        shift = 0.15 if i % 3 == 0 else 0.0
        arrays[f"big_ref_x{i}"] = g.normal(0.0, 1.0 + 0.1 * i, size=rows)
        arrays[f"big_cur_x{i}"] = g.normal(shift, 1.0 + 0.1 * i, size=rows)
    n = 800  # <= 1,000 reference rows: tests with p-values
    arrays["mix_ref_num"], arrays["mix_cur_num"] = g.normal(size=n), g.normal(0.2, size=600)
    arrays["mix_ref_grade"] = g.integers(0, 4, size=n).astype(float)
    arrays["mix_cur_grade"] = g.integers(0, 4, size=600).astype(float)
    arrays["mix_ref_city"] = g.choice(["paris", "lyon", "lille"], size=n, p=[0.5, 0.3, 0.2])
    arrays["mix_cur_city"] = g.choice(["paris", "lyon", "lille"], size=600, p=[0.4, 0.3, 0.3])
    arrays["mix_ref_member"] = g.choice(["no", "yes"], size=n, p=[0.7, 0.3])
    arrays["mix_cur_member"] = g.choice(["no", "yes"], size=600, p=[0.6, 0.4])
    n = 3000  # > 1,000 reference rows: Jensen-Shannon for categories and for numbers with <= 5 values
    arrays["large_ref_city"] = g.choice(["paris", "lyon", "lille", "nice"], size=n, p=[0.4, 0.3, 0.2, 0.1])
    arrays["large_cur_city"] = g.choice(["paris", "lyon", "lille", "nice"], size=2500, p=[0.3, 0.3, 0.2, 0.2])
    arrays["large_ref_grade"] = g.integers(0, 4, size=n).astype(float)
    arrays["large_cur_grade"] = g.integers(0, 5, size=2500).astype(float)
    arrays["large_ref_score"] = g.gamma(2.0, size=n)
    arrays["large_cur_score"] = g.gamma(2.2, size=2500)
    return arrays, ["city", "member"]


def frames(arrays: dict[str, np.ndarray], prefix: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    cut = len(prefix) + 4
    ref = pd.DataFrame({k[cut:]: v for k, v in arrays.items() if k.startswith(prefix + "ref_")})
    cur = pd.DataFrame({k[cut:]: v for k, v in arrays.items() if k.startswith(prefix + "cur_")})
    return ref, cur


def our_value(report: DriftReport, column: str) -> tuple[str, float | None]:
    """Our number for a column in Evidently's terms: the p-value of a test, else the statistic."""
    c = next(c for c in report.columns if c.column == column)
    return c.method, c.p_value if c.p_value is not None else c.statistic


def compare(report: DriftReport, evidently: dict[str, Any]) -> tuple[float, list[str]]:
    """Largest absolute difference over the columns, and any method disagreements."""
    worst, problems = 0.0, []
    for column, theirs in evidently["columns"].items():
        method, value = our_value(report, column)
        expected = EVIDENTLY_NAMES.get(theirs["method"], theirs["method"])
        if method != expected or value is None:
            problems.append(f"{column}: ours {method}, Evidently {theirs['method']}")
            continue
        worst = max(worst, abs(value - theirs["value"]))
    return worst, problems


def main() -> int:
    p = common.parser(__doc__ or "")
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--cols", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--venv", type=Path, default=VENV)
    args = p.parse_args()
    python = common.bench_venv(args.venv, REQUIREMENTS, PROBE)
    arrays, categorical = datasets(args.rows, args.cols, args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        npz = Path(tmp) / "data.npz"
        cast(Any, np.savez)(npz, **arrays)  # numpy's stub types **kwds as bool
        common.progress(f"Evidently on {args.cols} x {args.rows:,} rows (in {args.venv}) ...")
        env = {**os.environ, "PYTHONWARNINGS": "ignore"}
        evidently = common.run_json_script(python, EVIDENTLY_SCRIPT, [str(npz), json.dumps(categorical)], env)
    if evidently is None:
        return 1
    common.progress("ours on the same arrays ...")
    big_ref, big_cur = frames(arrays, "big_")
    times = []
    for _ in range(3):
        started = time.perf_counter()
        big = drift_report(big_ref, big_cur)
        times.append(time.perf_counter() - started)
    ours_s = common.median(times)
    mixed = drift_report(*frames(arrays, "mix_"))
    large = drift_report(*frames(arrays, "large_"))
    big_diff, big_problems = compare(big, evidently["big"])
    mixed_diff, mixed_problems = compare(mixed, evidently["mix"])
    large_diff, large_problems = compare(large, evidently["large"])
    mixed_diff = max(mixed_diff, large_diff)
    mixed_problems += large_problems
    theirs_s = evidently["big"]["seconds"]
    speedup = common.ratio(theirs_s, ours_s)
    share_equal = abs(big.share_drifted - evidently["big"]["share"]) < 1e-12
    problems = big_problems + mixed_problems + ([] if share_equal else ["dataset drift share differs"])
    ok = speedup >= TARGET_SPEEDUP and max(big_diff, mixed_diff) <= TARGET_DIFF and not problems
    rows = [
        [f"Evidently {evidently['version']} Report.run", f"{theirs_s:.3f} s", "1.0x", ""],
        ["gpufleet drift_report", f"{ours_s:.3f} s", f"{speedup:.1f}x", f">= {TARGET_SPEEDUP:.0f}x"],
        ["max |diff|, normed Wasserstein", f"{big_diff:.2e}", "", f"<= {TARGET_DIFF:.0e}"],
        ["max |diff|, KS/chi2/z p, JS, W (mixed)", f"{mixed_diff:.2e}", "", f"<= {TARGET_DIFF:.0e}"],
        ["share of drifted columns", f"{big.share_drifted:.2f}", "", "equal" if share_equal else "DIFFERS"],
    ]
    title = f"drift report, {args.cols} numeric columns x {args.rows:,} rows a side"
    table = common.format_table(title, ["what", "value", "speed-up", "target"], rows)
    if problems:
        table += "\n" + "\n".join(problems)
    result = {
        "rows": args.rows,
        "cols": args.cols,
        "evidently_version": evidently["version"],
        "evidently_pandas": evidently["pandas"],
        "evidently_s": theirs_s,
        "ours_s": ours_s,
        "speedup": speedup,
        "max_abs_diff_big": big_diff,
        "max_abs_diff_mixed": mixed_diff,
        "mixed_methods": {
            **{f"small.{c.column}": c.method for c in mixed.columns},
            **{f"large.{c.column}": c.method for c in large.columns},
        },
        "problems": problems,
        "ok": ok,
    }
    verdict = f"{speedup:.1f}x faster (>= {TARGET_SPEEDUP:.0f}x), max |diff| {max(big_diff, mixed_diff):.1e} (<= 1e-9)"
    return common.finish(json_mode=args.json, result=result, table=table, verdict=verdict, ok=ok)


if __name__ == "__main__":
    sys.exit(main())
