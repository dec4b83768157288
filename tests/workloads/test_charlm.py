from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
import torch

from gpufleet.workloads.charlm import CharCorpus, CharLM, CharLMConfig, evaluate, load_text


@pytest.fixture(scope="module")
def corpus() -> CharCorpus:
    return CharCorpus.default()


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    # Models this small run fastest on one thread; with more, intra-op threads spin against any other busy process
    # on a 2-core machine and 30 steps can take seconds instead of a tenth of one.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def small_model(vocab_size: int, *, dropout: float = 0.0) -> CharLM:
    torch.manual_seed(0)
    return CharLM(CharLMConfig(vocab_size=vocab_size, context=32, layers=1, heads=2, embed=32, dropout=dropout))


def test_shipped_text_is_natural_english_of_the_promised_size() -> None:
    text = load_text()
    assert 40_000 <= len(text.encode("utf-8")) <= 80_000
    assert "Shall I compare thee to a summer's day?" in text


def test_split_is_90_5_5_contiguous_and_disjoint(corpus: CharCorpus) -> None:
    text = load_text()
    n = len(text)
    assert len(corpus.train) == n * 90 // 100
    assert len(corpus.val) == n * 5 // 100
    assert len(corpus.train) + len(corpus.val) + len(corpus.test) == n
    assert abs(len(corpus.test) - n * 0.05) <= 2
    # The three splits are consecutive, non-overlapping slices of the encoded text.
    assert torch.equal(torch.cat([corpus.train, corpus.val, corpus.test]), corpus.encode(text))
    for split in ("train", "val", "test"):
        assert corpus.split(split).dtype == torch.int64
    assert corpus.decode(corpus.encode(text)) == text
    assert list(corpus.vocab) == sorted(set(text))
    with pytest.raises(ValueError, match="split"):
        corpus.split("dev")


def test_batch_is_a_pure_function_of_split_position_and_seed(corpus: CharCorpus) -> None:
    torch.manual_seed(1234)
    state = torch.random.get_rng_state()
    x1, y1 = corpus.batch("train", 7, 8, 16, seed=3)
    x2, y2 = corpus.batch("train", 7, 8, 16, seed=3)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert x1.shape == y1.shape == (8, 16)
    assert x1.dtype == y1.dtype == torch.int64
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert torch.equal(x1[:, 1:], y1[:, :-1])  # targets are the inputs shifted by one
    x3, _ = corpus.batch("train", 8, 8, 16, seed=3)
    x4, _ = corpus.batch("train", 7, 8, 16, seed=4)
    assert not torch.equal(x1, x3)
    assert not torch.equal(x1, x4)
    # Windows come from the requested split only.
    xv, yv = corpus.batch("val", 0, 4, 16, seed=3)
    assert int(xv.max()) < corpus.vocab_size
    val = corpus.decode(corpus.val)
    assert all(corpus.decode(row) in val for row in torch.cat([xv, yv[:, -1:]], dim=1))


def test_forward_shapes_and_initial_loss_near_uniform(corpus: CharCorpus) -> None:
    torch.manual_seed(0)
    model = CharLM(CharLMConfig(vocab_size=corpus.vocab_size))
    x, y = corpus.batch("train", 0, 4, 64, seed=0)
    logits, loss = model(x, y)
    assert logits.shape == (4, 64, corpus.vocab_size)
    assert loss is not None and loss.shape == ()
    assert abs(float(loss.detach()) - math.log(corpus.vocab_size)) < 0.3
    logits_only, no_loss = model(x[:, :10])
    assert logits_only.shape == (4, 10, corpus.vocab_size) and no_loss is None
    assert model.head.weight is model.tok_emb.weight
    with pytest.raises(ValueError, match="context"):
        model(torch.zeros(1, 65, dtype=torch.int64))


def test_adamw_steps_reduce_training_loss(corpus: CharCorpus) -> None:
    model = small_model(corpus.vocab_size)
    opts = {"batches": 2, "batch_size": 16, "context": 32, "seed": 99}
    before = evaluate(model, corpus, "train", **opts)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for step in range(30):
        x, y = corpus.batch("train", step, 16, 32, seed=0)
        _, loss = model(x, y)
        assert loss is not None
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    after = evaluate(model, corpus, "train", **opts)
    assert after < before - 0.5


def test_evaluate_is_deterministic_and_restores_mode(corpus: CharCorpus) -> None:
    model = small_model(corpus.vocab_size, dropout=0.1)
    model.train()
    a = evaluate(model, corpus, "val", batches=2, batch_size=4, context=32, seed=0)
    b = evaluate(model, corpus, "val", batches=2, batch_size=4, context=32, seed=0)
    assert a == b
    assert model.training
    model.eval()
    evaluate(model, corpus, "test", batches=1, batch_size=4, context=32, seed=0)
    assert not model.training


def test_flops_per_token_matches_palm_formula_by_hand() -> None:
    vocab, context, layers, heads, embed = 10, 8, 1, 2, 8
    model = CharLM(CharLMConfig(vocab_size=vocab, context=context, layers=layers, heads=heads, embed=embed))
    # Per block: 2 LayerNorms (2E each), qkv (3E^2 + 3E), attention proj (E^2 + E), MLP (4E^2 + 4E, 4E^2 + E).
    per_block = 2 * (2 * embed) + (3 * embed**2 + 3 * embed) + (embed**2 + embed) + (4 * embed**2 + 4 * embed)
    per_block += 4 * embed**2 + embed
    assert per_block == 872
    # Token embedding (shared with the LM head) + blocks + final LayerNorm; the position embedding is excluded.
    n = vocab * embed + layers * per_block + 2 * embed
    assert n == 968
    assert model.num_params(exclude_embedding=True) == n
    assert model.num_params() == n + context * embed
    assert model.flops_per_token() == 6 * n + 12 * layers * heads * (embed // heads) * context == 6576


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"vocab_size": 0}, "vocab_size"),
        ({"vocab_size": 10, "context": 0}, "context"),
        ({"vocab_size": 10, "layers": -1}, "layers"),
        ({"vocab_size": 10, "heads": 0}, "heads"),
        ({"vocab_size": 10, "embed": 0}, "embed"),
        ({"vocab_size": 10, "embed": 130, "heads": 4}, "embed"),
        ({"vocab_size": 10, "dropout": 1.0}, "dropout"),
        ({"vocab_size": 10, "dropout": -0.1}, "dropout"),
    ],
)
def test_config_validation_names_the_field(kwargs: dict[str, float], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        CharLMConfig(**kwargs)  # type: ignore[arg-type]


def test_config_is_frozen() -> None:
    config = CharLMConfig(vocab_size=10)
    assert (config.context, config.layers, config.heads, config.embed, config.dropout) == (64, 2, 4, 128, 0.1)
    with pytest.raises(AttributeError):
        config.layers = 3  # type: ignore[misc]


def test_batch_rejects_bad_arguments(corpus: CharCorpus) -> None:
    with pytest.raises(ValueError):
        corpus.batch("train", -1, 4, 16, seed=0)
    with pytest.raises(ValueError):
        corpus.batch("val", 0, 4, len(corpus.val), seed=0)
    with pytest.raises(ValueError, match="vocabulary"):
        corpus.encode("\u00e9")
