"""The tiny character-level language model as a gpufleet job: ``gpufleet.workloads.tinylm:train``.

A complete, preemptible training script in about fifty lines of loop: the model and data come
from :mod:`gpufleet.workloads.charlm`; everything that makes it survive preemption is the
:class:`~gpufleet.runtime.TrainSession` around the loop. Batches are a pure function of the
data position, so the only data state a checkpoint needs is that one integer.
"""

from __future__ import annotations

import contextlib
import os
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gpufleet.errors import SpecError
from gpufleet.jobs.faults import FaultPlan
from gpufleet.jobs.protocol import ENV_STRATEGY
from gpufleet.runtime import TrainSession
from gpufleet.runtime.elastic import Elastic, continues, replica_place
from gpufleet.runtime.group import Group, current_group
from gpufleet.workloads import check_seed
from gpufleet.workloads.charlm import CharCorpus, CharLM, CharLMConfig, evaluate, load_text

TINY: dict[str, Any] = {"batch_size": 8, "context": 16, "layers": 1, "heads": 2, "embed": 32, "eval_batches": 1}
"""A one-layer configuration that trains a step in milliseconds: smoke runs and tests."""


def wrap(model: CharLM, strategy: str, group: Group) -> Any:
    """The model as the ranks train it: ``DistributedDataParallel``, FSDP2 (``fully_shard`` per block, then the
    whole model) or, alone or with ``strategy: none``, as it is."""
    if not group.distributed or strategy == "none":
        return model
    if strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model)
    if strategy == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block)
        return fully_shard(model)
    raise SpecError(f"args.strategy={strategy!r} is not one of none, ddp, fsdp")


def build(
    *,
    seed: int,
    context: int,
    layers: int,
    heads: int,
    embed: int,
    dropout: float,
    lr: float,
    steps: int,
    text: str | None = None,
) -> tuple[CharCorpus, CharLM, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    """Model, optimizer and a warmup-then-cosine schedule, initialised from ``seed``.

    ``text``: the corpus, a UTF-8 file (a relative path is under the job's data folder,
    ``$GPUFLEET_DATA_DIR``, where a ``data`` block staged it); ``None``: the shipped text.
    """
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    corpus = CharCorpus(load_text() if text is None else _read_text(text))
    config = CharLMConfig(
        vocab_size=corpus.vocab_size, context=context, layers=layers, heads=heads, embed=embed, dropout=dropout
    )
    model = CharLM(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.1, betas=(0.9, 0.95))
    return corpus, model, optimizer, schedule_for(optimizer, lr=lr, steps=steps)


def _read_text(text: str) -> str:
    path = Path(text)
    if not path.is_absolute():
        path = Path(os.environ.get("GPUFLEET_DATA_DIR") or ".") / path
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise SpecError(f"args.text={text!r}: cannot read {path}: {err}") from None


def schedule_for(optimizer: torch.optim.Optimizer, *, lr: float, steps: int) -> torch.optim.lr_scheduler.LRScheduler:
    """Linear warmup over the first 5% of the steps, then cosine down to ``lr / 10``."""
    warmup = max(1, steps // 20)
    return torch.optim.lr_scheduler.SequentialLR(
        optimizer,
        [
            torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.1, total_iters=warmup),
            torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=max(1, steps - warmup), eta_min=lr / 10),
        ],
        milestones=[warmup],
    )


def train(
    steps: int = 300,
    batch_size: int = 32,
    context: int = 64,
    layers: int = 2,
    heads: int = 4,
    embed: int = 128,
    dropout: float = 0.1,
    lr: float = 3e-3,
    seed: int = 1337,
    eval_batches: int = 8,
    ckpt_dir: str = "checkpoints",
    strategy: str | None = None,
    step_seconds: float = 0.0,
    eval_every: int = 0,
    text: str | None = None,
    on_step: Callable[[TrainSession], None] | None = None,
) -> dict[str, Any]:
    """Train, surviving preemption; return the final validation and test losses.

    Under torchrun (``distributed:`` in the job's spec) ``strategy`` is ``ddp`` or ``fsdp``
    (default: the spec's ``distributed.strategy``):
    every rank builds the same model, wraps it, and trains on its rows of the same global batch
    (``batch_size`` in all), so the run computes the same thing on any number of ranks that
    divides ``batch_size``. ``eval_every`` > 0 logs the validation loss every that many steps (an
    ``eval`` event: a sweep's pruner reads it as the intermediate value). ``step_seconds`` paces
    each step (a demo a person can follow, a preemption that lands mid-run); it changes no number.
    ``text`` trains on a UTF-8 file instead of the shipped text (relative: under ``$GPUFLEET_DATA_DIR``).
    Under ``distributed.recovery: continue`` each rank is an elastic replica (``runtime.elastic``): it
    trains on its replica's rows and averages gradients over the replicas taking part in each step.
    ``on_step`` is called after every step with the session (progress hooks, tests).
    """
    check_seed(seed)
    torch.use_deterministic_algorithms(True)
    group = current_group()
    strategy = strategy or os.environ.get(ENV_STRATEGY) or "none"
    share, parts = replica_place() if continues() else (group.rank, group.world_size)
    if batch_size % parts:
        raise SpecError(f"args.batch_size={batch_size} does not divide among {parts} ranks: give a multiple of {parts}")
    corpus, plain, optimizer, schedule = build(
        seed=seed,
        context=context,
        layers=layers,
        heads=heads,
        embed=embed,
        dropout=dropout,
        lr=lr,
        steps=steps,
        text=text,
    )
    model = wrap(plain, strategy, group)
    if group.distributed and strategy != "none":  # over the wrapped parameters (fully_shard swaps them in place)
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.1, betas=(0.9, 0.95))
        schedule = schedule_for(optimizer, lr=lr, steps=steps)
    faults = FaultPlan.parse(os.environ.get("GPUFLEET_FAULT", ""))
    sess = TrainSession.from_env(
        model=model,
        optimizer=optimizer,
        scheduler=schedule,
        total_steps=steps,
        ckpt_dir=ckpt_dir,
        flops_per_token=plain.flops_per_token(),
    )
    elastic = Elastic.from_env(
        model,
        optimizer,
        session=sess,
        state_dict=schedule.state_dict,
        load_state_dict=schedule.load_state_dict,
        samples_per_replica=batch_size // parts,
    )
    with elastic or contextlib.nullcontext(), sess:
        model.train()
        for _ in sess.steps():
            x, y = corpus.batch("train", sess.data_position, batch_size, context, seed)
            x, y = x[share::parts], y[share::parts]
            if elastic is not None:
                elastic.zero_grad()  # this step's quorum, while the forward runs
            _, loss = model(x, y)
            assert loss is not None
            loss = faults.apply(loss, sess.data_position, share)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()  # type: ignore[no-untyped-call]
            if elastic is not None:
                elastic.average_gradients()  # over the replicas taking part: the missing shares are skipped
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            if elastic is None:
                optimizer.step()
            elif not elastic.step():
                continue  # a replica was lost mid-step: the step runs again without it
            schedule.step()
            sess.report(loss, tokens=x.numel(), lr=float(schedule.get_last_lr()[0]))
            if eval_every > 0 and sess.step % eval_every == 0 and sess.step < steps:
                val = evaluate(
                    model, corpus, "val", batches=eval_batches, batch_size=batch_size, context=context, seed=seed
                )
                sess.log("eval", val_loss=val)
            if on_step is not None:
                on_step(sess)
            if step_seconds > 0:
                time.sleep(step_seconds)
        result = {
            split: evaluate(
                model, corpus, split, batches=eval_batches, batch_size=batch_size, context=context, seed=seed
            )
            for split in ("val", "test")
        }
        sess.log("eval", val_loss=result["val"], test_loss=result["test"])
    return {"val_loss": result["val"], "test_loss": result["test"], "steps": sess.step}


__all__ = ["TINY", "build", "schedule_for", "train", "wrap"]
