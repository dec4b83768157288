"""Seeded data for the quality labs: a shop with a weekly cycle, and a small RAG corpus with a query stream.

Both are synthetic on purpose: the truth is known (which day the real shift starts, which
queries come from a topic the corpus does not cover), so a detector's false alarms and misses
can be counted rather than argued about.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from gpufleet.quality.embeddings import EmbeddingDrift, embed, embedding_drift

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

DAY_S = 86_400
WEEK_DAYS = 7
SHOP_START = dt.datetime(2026, 1, 5, tzinfo=dt.UTC)  # a Monday
"""Day 0 of the shop data."""
WEEKDAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")


@dataclass(frozen=True, slots=True)
class ShopData:
    """Orders of a web shop, one row each, with the day a real shift starts (``None``: never)."""

    columns: dict[str, NDArray[np.generic]]
    """``ts`` (seconds since :data:`SHOP_START`), ``basket_eur``, ``items``, ``session_min``, ``device``."""
    days: int
    shift_day: int | None


def weekly_shop(seed: int = 0, *, days: int = 42, rows_per_day: int = 1500, shift_day: int | None = 38) -> ShopData:
    """Orders with a weekly cycle: weekends buy more, on phones, in longer sessions.

    Weekdays resemble each other and so do Saturday and Sunday, so yesterday is a bad reference
    on Saturdays and Mondays and the same weekday last week is a good one. Every day also gets a
    little noise of its own (promotions, weather). From ``shift_day`` on, a real change lands:
    prices shown 25% higher (a currency bug) and a new tablet app takes a share of sessions.
    """
    rng = np.random.default_rng(seed)
    cols: dict[str, list[NDArray[np.generic]]] = {k: [] for k in ("ts", "basket_eur", "items", "session_min", "device")}
    for day in range(days):
        weekend = day % WEEK_DAYS >= 5
        shifted = shift_day is not None and day >= shift_day
        n = int(rows_per_day * (1.3 if weekend else 1.0))
        noise = rng.normal(0, 0.02)
        hours = rng.normal(15 if weekend else 12, 3.5, size=n).clip(0, 23.99)
        cols["ts"].append(np.sort(day * DAY_S + hours * 3600))
        basket = rng.lognormal((3.55 if weekend else 3.2) + noise, 0.5, size=n)
        cols["basket_eur"].append(basket * (1.25 if shifted else 1.0))
        cols["items"].append(1 + rng.poisson(3.0 if weekend else 1.8, size=n))
        cols["session_min"].append(rng.gamma(2.0, (6.0 if weekend else 4.0) * (1 + noise), size=n))
        shares = [0.62, 0.30, 0.08] if weekend else [0.40, 0.52, 0.08]
        if shifted:
            shares = [shares[0] - 0.12, shares[1] - 0.08, shares[2] + 0.20]
        cols["device"].append(rng.choice(np.array(["mobile", "desktop", "tablet"]), size=n, p=shares))
    return ShopData({k: np.concatenate(v) for k, v in cols.items()}, days, shift_day)


def day_label(day: int) -> str:
    """``"Tue 2026-01-13"`` for a day index of the shop data."""
    date = SHOP_START + dt.timedelta(days=day)
    return f"{WEEKDAYS[date.weekday()]} {date:%Y-%m-%d}"


# ---------------------------------------------------------------- a small RAG corpus and its queries

CORPUS: dict[str, tuple[str, ...]] = {
    "training": (
        "Checkpoints are written every 500 steps to the shared filesystem and verified with sha256.",
        "A preempted spot instance receives SIGTERM; the job saves a checkpoint and asks to be requeued.",
        "Resuming restores the model, the optimizer, the learning-rate schedule and every RNG state.",
        "Mixed precision with bfloat16 halves activation memory on A100 and H100 GPUs.",
        "Gradient accumulation lets a small GPU reach the global batch size of a large run.",
        "FSDP shards parameters, gradients and optimizer states across the data-parallel ranks.",
        "NCCL timeouts usually mean one rank died or the network between nodes is congested.",
        "Model FLOPs utilization compares achieved throughput with the GPU's datasheet peak.",
        "The learning rate warms up linearly for 2,000 steps and then follows a cosine decay.",
        "A loss spike triggers a rollback to the last healthy checkpoint and skips the bad batch.",
        "Spot GPUs cost about a third of on-demand ones but can be reclaimed with two minutes notice.",
        "Slurm requeues a preempted job automatically when it was submitted with --requeue.",
        "Data loaders keep a cursor in the checkpoint so a resumed run does not repeat samples.",
    ),
    "billing": (
        "Invoices are issued on the first day of each month and list GPU-hours per team.",
        "A refund for an outage is credited to the next invoice within ten business days.",
        "Payment by bank transfer must reference the invoice number printed on the first page.",
        "Each team has a monthly budget; spending above 80% of it sends an alert to the team lead.",
        "Reserved capacity is billed whether or not it is used, at a discount of 40% on demand prices.",
        "Egress traffic between regions is billed per gigabyte on top of compute.",
        "Credit card payments are charged in euros; the bank may add a conversion fee.",
        "Cost reports can be exported as CSV for the finance department every week.",
        "A purchase order number can be added to invoices from the billing settings page.",
        "Storage for checkpoints is billed per terabyte-month, measured daily.",
        "Late payments beyond thirty days suspend new job submissions for the account.",
        "VAT is added for customers in the European Union unless a valid VAT number is given.",
        "Spot discounts vary by region and GPU type and are updated every hour.",
    ),
    "onboarding": (
        "New users receive an account after their manager approves the access request.",
        "Install the command-line client with pip and log in with your single sign-on account.",
        "Each new project starts with a quota of eight GPUs, raised on request.",
        "The example job trains a small language model in ten minutes on one GPU.",
        "Job specifications are YAML files naming the image, the command and the resources.",
        "Teams share a namespace; a team lead can add members from the web console.",
        "The documentation portal has tutorials for PyTorch, JAX and Hugging Face models.",
        "Support answers questions in the team chat channel during business hours.",
        "Secrets such as API tokens are stored in the vault, never in the job specification.",
        "Interactive notebooks run on shared GPUs and stop after two idle hours.",
        "The first login asks for a default project and a default region.",
        "Datasets larger than 100 GB should be staged to the regional object store first.",
        "Office hours for new users take place every Tuesday afternoon.",
        "The quick start guide shows how to submit, watch and cancel a first job.",
    ),
}
"""40 short documents on three topics."""

QUERY_TEMPLATES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "training": (
        (
            "how do I resume {x} after preemption",
            "why does {x} fail on spot GPUs",
            "what happens to {x} when the node is reclaimed",
            "how often should I save {x}",
            "how can I speed up {x} on H100",
        ),
        (
            "my training job",
            "the checkpoint",
            "distributed training",
            "the optimizer state",
            "a multi-node run",
            "the data loader",
            "mixed precision training",
        ),
    ),
    "billing": (
        (
            "when will I receive {x}",
            "how do I pay {x}",
            "why is {x} higher this month",
            "can I get a refund for {x}",
            "who approves {x}",
        ),
        ("the invoice", "the GPU bill", "our team budget", "reserved capacity", "egress charges", "the storage cost"),
    ),
    "onboarding": (
        (
            "how do I get access to {x}",
            "where can I find {x}",
            "how do I set up {x}",
            "who can help me with {x}",
            "is there a tutorial for {x}",
        ),
        ("the cluster", "my first job", "the command-line client", "a notebook", "the team namespace", "the vault"),
    ),
    "security": (
        (
            "how do I report {x}",
            "what should I do about {x}",
            "is {x} a risk for our data",
            "who handles {x}",
            "how do I rotate {x}",
        ),
        (
            "a leaked API key",
            "a phishing e-mail",
            "a suspicious login",
            "a shared SSH key",
            "an exposed storage bucket",
            "a vulnerable container image",
        ),
    ),
}
"""Query templates per topic. ``security`` is not covered by the corpus: a topic shift that hurts retrieval."""


def documents() -> tuple[list[str], list[str]]:
    """The corpus as (texts, topics)."""
    texts = [t for docs in CORPUS.values() for t in docs]
    topics = [topic for topic, docs in CORPUS.items() for _ in docs]
    return texts, topics


def queries(n: int, mix: dict[str, float], seed: int) -> tuple[list[str], list[str]]:
    """``n`` queries drawn from the templates with topic shares ``mix``: (texts, topics)."""
    unknown = [t for t in mix if t not in QUERY_TEMPLATES]
    if unknown:
        raise ValueError(f"no query templates for topic {unknown[0]!r}")
    rng = np.random.default_rng(seed)
    names = list(mix)
    weights = np.array([mix[t] for t in names], dtype=np.float64)
    picks = rng.choice(len(names), size=n, p=weights / weights.sum())
    texts, topics = [], []
    for i in picks:
        patterns, fillers = QUERY_TEMPLATES[names[i]]
        pattern = patterns[rng.integers(len(patterns))]
        texts.append(pattern.format(x=fillers[rng.integers(len(fillers))]))
        topics.append(names[i])
    return texts, topics


REFERENCE_MIX = {"training": 0.5, "billing": 0.25, "onboarding": 0.25}
"""The query mix the assistant was built for."""
SHIFTED_MIX = {"training": 0.3, "billing": 0.15, "onboarding": 0.15, "security": 0.4}
"""After a security incident: 40% of the questions are about a topic the corpus does not cover."""


# ---------------------------------------------------------------- the seasonal lab

SHOP_METHODS = {
    "basket_eur": "wasserstein",
    "items": "wasserstein",
    "session_min": "wasserstein",
    "device": "jensenshannon",
}
"""One method per column for every window, so statistics compare across windows (and with the band)."""


@dataclass(frozen=True, slots=True)
class SeasonalLab:
    """Both monitors' verdicts per judged day, and the counts that matter."""

    shift_day: int | None
    days: list[dict[str, Any]]
    """Per judged day: ``day``, ``label``, ``shifted``, ``naive`` and ``seasonal`` (alarm, score, flagged)."""

    def _alarms(self, detector: str, shifted: bool) -> int:
        return sum(d[detector]["alarm"] for d in self.days if d["shifted"] == shifted)

    @property
    def false_alarms(self) -> dict[str, int]:
        """Alarms on days before the real shift."""
        return {k: self._alarms(k, False) for k in ("naive", "seasonal")}

    @property
    def detected(self) -> dict[str, bool]:
        """Whether each monitor alarmed on the day the real shift landed."""
        first = [d for d in self.days if d["day"] == self.shift_day]
        return {k: bool(first and first[0][k]["alarm"]) for k in ("naive", "seasonal")}

    @property
    def shifted_days_alarmed(self) -> dict[str, int]:
        return {k: self._alarms(k, True) for k in ("naive", "seasonal")}

    def to_dict(self) -> dict[str, Any]:
        return {
            "shift_day": self.shift_day,
            "shift_label": None if self.shift_day is None else day_label(self.shift_day),
            "false_alarms": self.false_alarms,
            "detected_shift": self.detected,
            "shifted_days": sum(d["shifted"] for d in self.days),
            "shifted_days_alarmed": self.shifted_days_alarmed,
            "days": self.days,
        }


def seasonal_lab(seed: int = 0, *, days: int = 42, shift_day: int | None = 38) -> SeasonalLab:
    """Run the naive and the seasonal monitor over :func:`weekly_shop` data, one window a day."""
    from gpufleet.quality.monitor import SeasonalConfig, naive_monitor, seasonal_monitor, split_windows

    data = weekly_shop(seed, days=days, shift_day=shift_day)
    windows = split_windows(data.columns, "ts", DAY_S)
    config = SeasonalConfig(windows_per_period=WEEK_DAYS, method=SHOP_METHODS)
    naive = {v.index: v for v in naive_monitor(windows, method=SHOP_METHODS, start=config.history)}
    seasonal = {v.index: v for v in seasonal_monitor(windows, config)}
    rows = []
    for day in sorted(seasonal):
        n, s = naive[day], seasonal[day]
        rows.append(
            {
                "day": day,
                "label": day_label(day),
                "shifted": shift_day is not None and day >= shift_day,
                "naive": {"alarm": n.alarm, "score": n.score, "flagged": list(n.flagged)},
                "seasonal": {"alarm": s.alarm, "score": s.score, "flagged": list(s.flagged)},
            }
        )
    return SeasonalLab(shift_day, rows)


def plot_seasonal_lab(lab: SeasonalLab, path: Path) -> None:
    """Both monitors' scores per day (1 = the alarm line for a column), alarms marked, the shift drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = [d["day"] for d in lab.days]
    fig, axes = plt.subplots(2, 1, figsize=(10, 5.5), sharex=True)
    for ax, key, title in (
        (axes[0], "naive", "naive: today against yesterday"),
        (axes[1], "seasonal", "seasonal: same weekday in past weeks, above the placebo band"),
    ):
        scores = [d[key]["score"] for d in lab.days]
        alarms = [(d["day"], d[key]["score"]) for d in lab.days if d[key]["alarm"]]
        ax.plot(x, scores, marker="o", color="#4C72B0", lw=1.2)
        ax.axhline(1.0, color="#888", ls="--", lw=1)
        if alarms:
            ax.scatter(*zip(*alarms, strict=True), s=90, facecolors="none", edgecolors="#C44E52", lw=2, label="alarm")
            ax.legend(loc="upper left")
        if lab.shift_day is not None:
            ax.axvline(lab.shift_day - 0.5, color="#C44E52", lw=1, alpha=0.6)
        ax.set_title(title, fontsize=10, loc="left")
        ax.set_ylabel("score")
    axes[1].set_xticks(x, [d["label"][:3] + d["label"][-3:] for d in lab.days], rotation=60, fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


@dataclass(frozen=True, slots=True)
class EmbeddingLab:
    """The two comparisons of the lab: a same-distribution split, and a topic shift."""

    same: EmbeddingDrift
    shift: EmbeddingDrift
    queries_per_side: int
    documents: int
    examples: dict[str, list[str]]

    def to_dict(self) -> dict[str, Any]:
        return {
            "queries_per_side": self.queries_per_side,
            "documents": self.documents,
            "same_distribution": self.same.to_dict(),
            "topic_shift": self.shift.to_dict(),
            "examples": self.examples,
        }


def embedding_lab(encoder: SentenceTransformer, *, seed: int = 0, queries_per_side: int = 150) -> EmbeddingLab:
    """Embed the lab corpus and three query streams; compare reference-vs-reference and reference-vs-shifted."""
    docs, _ = documents()
    ref_a, _ = queries(queries_per_side, REFERENCE_MIX, seed)
    ref_b, _ = queries(queries_per_side, REFERENCE_MIX, seed + 1)
    shifted, topics = queries(queries_per_side, SHIFTED_MIX, seed + 2)
    corpus = embed(encoder, docs)
    a, b, c = embed(encoder, ref_a), embed(encoder, ref_b), embed(encoder, shifted)
    new_topic = [q for q, t in zip(shifted, topics, strict=True) if t not in REFERENCE_MIX]
    return EmbeddingLab(
        same=embedding_drift(a, b, corpus=corpus, seed=seed),
        shift=embedding_drift(a, c, corpus=corpus, seed=seed),
        queries_per_side=queries_per_side,
        documents=len(docs),
        examples={"reference": ref_a[:3], "shifted_new_topic": new_topic[:3]},
    )


__all__ = [
    "CORPUS",
    "DAY_S",
    "QUERY_TEMPLATES",
    "REFERENCE_MIX",
    "SHIFTED_MIX",
    "SHOP_METHODS",
    "SHOP_START",
    "WEEKDAYS",
    "WEEK_DAYS",
    "EmbeddingLab",
    "SeasonalLab",
    "ShopData",
    "day_label",
    "documents",
    "embedding_lab",
    "plot_seasonal_lab",
    "queries",
    "seasonal_lab",
    "weekly_shop",
]
