"""Our label-free performance estimate against NannyML 0.13.1's CBPE and DLE on the same data, in the same run.

    .venv/bin/python bench/estimate_vs_nannyml.py [--json] [--rows 50000] [--chunk-size 5000]

NannyML runs in its own virtualenv (``.dev/bench-nannyml``, created with ``nannyml==0.13.1`` and the pins
that make it import, on first use) as a subprocess that reads the same arrays from a temporary ``.npz``.
Its import is not counted; each case times ``fit`` + ``estimate`` of one estimator with one metric, the
work one ``estimate_performance`` call does. Both sides keep the best of ``--repeats`` runs (as ``timeit``
does): on a shared machine LightGBM's threads now and then stall for seconds, and a median of three still
let one stall make NannyML's DLE look 10x slower than it is. NannyML runs with its defaults (LightGBM on
every core; ours is single-threaded numpy); its usage logging is off (no network).

Four cases, each a reference and a covariate-shifted current window (the second half of its chunks
shifted), ``--rows`` rows a side, chunks of ``--chunk-size``:

1. binary ROC AUC and 2. binary F1: a miscalibrated model (isotonic calibration is applied by both);
3. 3-class ROC AUC and F1 (macro, one-vs-rest);
4. regression MAE (DLE): heteroscedastic noise that grows with an interaction of two features.

Targets: every chunk's estimate within 0.005 of NannyML's, and ours at least 10x faster per case. The
realised values of both on the held-back labels are compared too (they must agree to 1e-9), and how far
each estimate is from the realised value is printed: that is accuracy, not agreement.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, cast

import _common as common
import numpy as np
import pandas as pd

from gpufleet.quality.estimate import PerformanceEstimate, estimate_performance

TARGET_SPEEDUP = 10.0
TARGET_DIFF = 0.005
REALISED_DIFF = 1e-9
VENV = common.REPO_ROOT / ".dev" / "bench-nannyml"
PROBE = "import nannyml, statsmodels; assert nannyml.__version__ == '0.13.1'"
REQUIREMENTS = ["nannyml==0.13.1", "pandas<3", "statsmodels"]
"""NannyML 0.13.1 imports statsmodels without requiring it, and its DLE breaks on pandas 3's string arrays."""
CLASSES = ("a", "b", "c")
FEATURES = ("x0", "x1", "x2", "x3", "segment")

NANNYML_SCRIPT = r"""
import json, sys, time, warnings
warnings.filterwarnings("ignore")
import logging
logging.disable(logging.CRITICAL)
import numpy as np, pandas as pd
import nannyml as nml

arrays = dict(np.load(sys.argv[1], allow_pickle=False))
chunk = int(sys.argv[2])
repeats = int(sys.argv[3])

def frame(prefix):
    return pd.DataFrame({k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)})

def timed(make, ref, cur, metric):
    times, result = [], None
    for _ in range(repeats):
        estimator = make()
        started = time.perf_counter()
        estimator.fit(ref)
        result = estimator.estimate(cur)
        times.append(time.perf_counter() - started)
    data = result.filter(period="analysis").to_df()
    return {
        "seconds": float(min(times)),
        "estimated": [float(v) for v in data[(metric, "value")]],
        "realised": [float(v) for v in data[(metric, "realized")]],
        "calibrated": bool(getattr(estimator, "needs_calibration", False)) or any(
            type(c).__name__ != "NoopCalibrator" for c in getattr(estimator, "_calibrators", {}).values()
        ),
    }

out = {}
ref, cur = frame("bin_ref_"), frame("bin_cur_")
for metric in ("roc_auc", "f1"):
    make = lambda: nml.CBPE(y_pred_proba="score", y_pred="pred", y_true="y", metrics=[metric], chunk_size=chunk,
                            problem_type="classification_binary")
    out["binary_" + metric] = timed(make, ref, cur, metric)
ref, cur = frame("mc_ref_"), frame("mc_cur_")
probas = {c: "p_" + c for c in @CLASSES@}
for metric in ("roc_auc", "f1"):
    make = lambda: nml.CBPE(y_pred_proba=probas, y_pred="pred", y_true="y", metrics=[metric], chunk_size=chunk,
                            problem_type="classification_multiclass")
    out["multiclass_" + metric] = timed(make, ref, cur, metric)
ref, cur = frame("reg_ref_"), frame("reg_cur_")
make = lambda: nml.DLE(feature_column_names=@FEATURES@, y_pred="pred", y_true="y", metrics=["mae"],
                       chunk_size=chunk)
out["regression_mae"] = timed(make, ref, cur, "mae")
out["version"] = nml.__version__
out["pandas"] = pd.__version__
print(json.dumps(out))
""".replace("@CLASSES@", repr(CLASSES)).replace("@FEATURES@", repr(list(FEATURES)))


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return np.asarray(1.0 / (1.0 + np.exp(-z)))


def _inputs(g: np.random.Generator, rows: int, shifted_from: int | None) -> dict[str, np.ndarray]:
    """Four numeric features and a segment; from row ``shifted_from`` on, x0 and x1 move and the segment mix changes."""
    x = g.normal(size=(rows, 4))
    segment = g.choice(np.array(["north", "south", "east"]), size=rows, p=[0.5, 0.3, 0.2])
    if shifted_from is not None:
        moved = slice(shifted_from, rows)
        x[moved, 0] += 0.8
        x[moved, 1] -= 0.5
        segment[moved] = g.choice(np.array(["north", "south", "east"]), size=rows - shifted_from, p=[0.2, 0.3, 0.5])
    return {"x0": x[:, 0], "x1": x[:, 1], "x2": x[:, 2], "x3": x[:, 3], "segment": segment}


def datasets(rows: int, seed: int) -> dict[str, np.ndarray]:
    """Reference and current tables of the three problems, as flat arrays (``bin_ref_x0``, ...)."""
    g = np.random.default_rng(seed)
    arrays: dict[str, np.ndarray] = {}
    for side, shifted in (("ref", None), ("cur", rows // 2)):
        base = _inputs(g, rows, shifted)
        x0, x1, x2, x3 = (base[k] for k in ("x0", "x1", "x2", "x3"))
        east = (base["segment"] == "east").astype(float)
        # binary: the truth has a curvature the model lacks; the model is overconfident (miscalibrated)
        logit = 1.2 * x0 - 0.8 * x1 + 0.5 * x2 + 0.4 * x0 * x0 - 0.6 * east - 0.3
        y = (g.random(rows) < _sigmoid(logit)).astype(np.int64)
        score = _sigmoid(1.8 * (1.2 * x0 - 0.8 * x1 + 0.5 * x2 + 0.2) + 0.3 * g.normal(size=rows))
        arrays |= {f"bin_{side}_{k}": v for k, v in base.items()}
        arrays |= {f"bin_{side}_y": y, f"bin_{side}_score": score, f"bin_{side}_pred": (score >= 0.5).astype(np.int64)}
        # three classes: softmax truth; the model sharpens it (temperature 0.6) and misses x2's effect on class c
        true_logits = np.column_stack([x0, 0.7 * x1 - 0.3 * x0 + 0.2 * east, 0.6 * x2 - 0.5 * x1])
        p = np.exp(true_logits - true_logits.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        y_idx = (g.random(rows)[:, None] > np.cumsum(p, axis=1)).sum(axis=1)
        model_logits = true_logits.copy()
        model_logits[:, 2] -= 0.6 * x2
        q = np.exp((model_logits - model_logits.max(axis=1, keepdims=True)) / 0.6)
        q /= q.sum(axis=1, keepdims=True)
        arrays |= {f"mc_{side}_{k}": v for k, v in base.items()}
        arrays[f"mc_{side}_y"] = np.asarray(CLASSES)[y_idx]
        arrays[f"mc_{side}_pred"] = np.asarray(CLASSES)[q.argmax(axis=1)]
        arrays |= {f"mc_{side}_p_{c}": q[:, i] for i, c in enumerate(CLASSES)}
        # regression: noise that grows with |x0 * x1| and in the east; the model misses a small curvature
        truth = 2.0 * x0 - x1 + 0.5 * x2 + 0.3 * x3 * x3 + 0.5 * east
        noise = (0.3 + 0.4 * np.abs(x0 * x1) + 0.3 * east) * g.normal(size=rows)
        arrays |= {f"reg_{side}_{k}": v for k, v in base.items()}
        arrays[f"reg_{side}_y"] = truth + noise
        arrays[f"reg_{side}_pred"] = truth - 0.3 * x3 * x3 + 0.3 + 0.1 * g.normal(size=rows)
    return arrays


def frames(arrays: dict[str, np.ndarray], prefix: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    def side(name: str) -> pd.DataFrame:
        start = f"{prefix}_{name}_"
        return pd.DataFrame({k[len(start) :]: v for k, v in arrays.items() if k.startswith(start)})

    return side("ref"), side("cur")


CASES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "binary_roc_auc": ("bin", "roc_auc", {"score": "score", "prediction": "pred"}),
    "binary_f1": ("bin", "f1", {"score": "score", "prediction": "pred"}),
    "multiclass_roc_auc": ("mc", "roc_auc", {"score": {c: f"p_{c}" for c in CLASSES}, "prediction": "pred"}),
    "multiclass_f1": ("mc", "f1", {"score": {c: f"p_{c}" for c in CLASSES}, "prediction": "pred"}),
    "regression_mae": ("reg", "mae", {"prediction": "pred", "features": list(FEATURES)}),
}


def ours(
    arrays: dict[str, np.ndarray], case: str, chunk: int, repeats: int
) -> tuple[float, PerformanceEstimate, list[float | None]]:
    """Best seconds of ``estimate_performance`` on the current window without its labels, the last
    result, and the realised value per chunk (a run on the labelled window, not timed)."""
    prefix, metric, kwargs = CASES[case]
    ref, cur = frames(arrays, prefix)
    unlabelled = cur.drop(columns=["y"])
    times, result = [], None
    for _ in range(repeats):
        started = time.perf_counter()
        result = estimate_performance(ref, unlabelled, target="y", metric=metric, chunk_size=chunk, **kwargs)
        times.append(time.perf_counter() - started)
    assert result is not None
    labelled = estimate_performance(ref, cur, target="y", metric=metric, chunk_size=chunk, **kwargs)
    return min(times), result, [c.realised for c in labelled.chunks]


def compare(
    case: str, mine: PerformanceEstimate, realised: list[float | None], seconds: float, theirs: dict[str, Any]
) -> dict[str, Any]:
    """Our figures and NannyML's for one case, chunk by chunk."""
    est = np.array([c.estimated for c in mine.chunks])
    real = np.array([np.nan if r is None else r for r in realised])
    their_est, their_real = np.array(theirs["estimated"]), np.array(theirs["realised"])
    return {
        "case": case,
        "ours_s": seconds,
        "nannyml_s": theirs["seconds"],
        "speedup": common.ratio(theirs["seconds"], seconds),
        "max_abs_diff": float(np.max(np.abs(est - their_est))),
        "max_abs_diff_realised": float(np.nanmax(np.abs(real - their_real))),
        "max_abs_error_ours": float(np.nanmax(np.abs(est - real))),
        "max_abs_error_nannyml": float(np.nanmax(np.abs(their_est - their_real))),
        "calibrated": {"ours": mine.calibrated, "nannyml": theirs["calibrated"] if mine.kind != "regression" else None},
        "ours_estimated": est.round(5).tolist(),
        "nannyml_estimated": their_est.round(5).tolist(),
        "realised": real.round(5).tolist(),
    }


def main() -> int:
    p = common.parser(__doc__ or "")
    p.add_argument("--rows", type=int, default=50_000)
    p.add_argument("--chunk-size", type=int, default=5_000)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--venv", type=Path, default=VENV)
    args = p.parse_args()
    python = common.bench_venv(args.venv, REQUIREMENTS, PROBE)
    arrays = datasets(args.rows, args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        npz = Path(tmp) / "data.npz"
        cast(Any, np.savez)(npz, **arrays)  # numpy's stub types **kwds as bool
        common.progress(f"NannyML on {len(CASES)} cases x {args.rows:,} rows a side (in {args.venv}) ...")
        env = {**os.environ, "PYTHONWARNINGS": "ignore", "NML_DISABLE_USAGE_LOGGING": "1"}
        theirs = common.run_json_script(
            python, NANNYML_SCRIPT, [str(npz), str(args.chunk_size), str(args.repeats)], env
        )
    if theirs is None:
        return 1
    common.progress("ours on the same arrays ...")
    results = []
    for case in CASES:
        seconds, mine, realised = ours(arrays, case, args.chunk_size, args.repeats)
        results.append(compare(case, mine, realised, seconds, theirs[case]))
    problems = [
        f"{r['case']}: {what}"
        for r in results
        for what, bad in (
            (f"estimates differ by {r['max_abs_diff']:.4f} > {TARGET_DIFF}", r["max_abs_diff"] > TARGET_DIFF),
            (f"{r['speedup']:.1f}x < {TARGET_SPEEDUP:.0f}x", r["speedup"] < TARGET_SPEEDUP),
            (f"realised values differ by {r['max_abs_diff_realised']:.1e}", r["max_abs_diff_realised"] > REALISED_DIFF),
        )
        if bad
    ]
    ok = not problems
    rows = [
        [
            r["case"],
            f"{r['nannyml_s']:.3f} s",
            f"{r['ours_s']:.3f} s",
            f"{r['speedup']:.1f}x",
            f"{r['max_abs_diff']:.1e}",
            f"{r['max_abs_diff_realised']:.1e}",
            f"{r['max_abs_error_ours']:.4f}",
            f"{r['max_abs_error_nannyml']:.4f}",
        ]
        for r in results
    ]
    head = ["case", "NannyML", "ours", "speed-up", "max |diff|", "realised |diff|", "ours vs real", "NannyML vs real"]
    title = (
        f"label-free estimates, {args.rows:,} rows a side, chunks of {args.chunk_size:,} "
        f"(NannyML {theirs['version']}, pandas {theirs['pandas']}; per chunk, max over chunks)"
    )
    table = common.format_table(title, head, rows)
    if problems:
        table += "\n" + "\n".join(problems)
    worst = max(r["max_abs_diff"] for r in results)
    slowest = min(r["speedup"] for r in results)
    result = {
        "rows": args.rows,
        "chunk_size": args.chunk_size,
        "nannyml_version": theirs["version"],
        "nannyml_pandas": theirs["pandas"],
        "cases": results,
        "max_abs_diff": worst,
        "min_speedup": slowest,
        "problems": problems,
        "ok": ok,
    }
    verdict = f"max |diff| {worst:.4f} (<= {TARGET_DIFF}), slowest speed-up {slowest:.1f}x (>= {TARGET_SPEEDUP:.0f}x)"
    return common.finish(json_mode=args.json, result=result, table=table, verdict=verdict, ok=ok)


if __name__ == "__main__":
    sys.exit(main())
