"""nanoGPT's ``train.py``, shakespeare_char style, ported to gpufleet's TrainSession.

The shape is Karpathy's (https://github.com/karpathy/nanoGPT, ``train.py``): a flat config, a
``get_batch(split)``, ``estimate_loss()`` every ``eval_interval`` iterations, ``get_lr(it)`` with
linear warmup and cosine decay, gradient accumulation, ``best_val_loss`` and a ``ckpt.pt`` saved
when validation improves. The model is gpufleet's nanoGPT-style ``CharLM`` over the shipped text,
tiny by default so that a run takes seconds on a CPU.

What the port changed, and why each change is needed for an exact resume:

* the ``while True`` loop is ``for _ in s.steps()`` inside ``with TrainSession.from_env(...)``:
  the session restores weights, optimizer, RNG and ``s.step`` (nanoGPT's ``iter_num``) first;
* ``get_batch`` draws micro-batch ``k`` of the run from ``batch_generator(seed, k)`` with
  ``k = s.data_position + micro_step``, so a resumed or rolled-back run sees the same batches
  (nanoGPT draws from the global RNG and prefetches the next batch, see ``--naive-batches``);
* ``best_val_loss`` lives in ``s.values`` (saved and restored with every checkpoint), not in a
  local variable that restarts at 1e9 after a preemption;
* evaluation runs when ``s.due("eval", every=eval_interval)``, so a rollback or resume that lands
  on an evaluated step does not evaluate it twice, and stops early when ``s.preempt_requested``;
* ``s.report(micro_losses)`` closes each iteration: the health check names the micro-batch
  that spiked, and a preemption is saved there.

``--naive-batches`` is the straight port: the global RNG and the prefetch before the loop (and
after each forward), as in nanoGPT. It trains just as well, but a resumed run draws different
batches: ``gpufleet debug resume-check nanogpt-naive.yaml`` shows where it diverges.

Run by hand (``python train.py``) it checkpoints to ``out-nanogpt/``; under gpufleet the job's
folder holds both the session's checkpoints and ``ckpt.pt``.
"""

from __future__ import annotations

import argparse
import math
import os
import random
from dataclasses import asdict

import numpy as np
import torch

from gpufleet.runtime import TrainSession
from gpufleet.runtime.data import batch_generator
from gpufleet.workloads.charlm import CharLM, CharLMConfig, load_text

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--out-dir", default=os.environ.get("GPUFLEET_JOB_DIR", "out-nanogpt"))
parser.add_argument("--eval-interval", type=int, default=50)
parser.add_argument("--log-interval", type=int, default=10)
parser.add_argument("--eval-iters", type=int, default=4)
parser.add_argument("--gradient-accumulation-steps", type=int, default=2)
parser.add_argument("--batch-size", type=int, default=8)
parser.add_argument("--block-size", type=int, default=32)
parser.add_argument("--n-layer", type=int, default=2)
parser.add_argument("--n-head", type=int, default=2)
parser.add_argument("--n-embd", type=int, default=32)
parser.add_argument("--dropout", type=float, default=0.1)
parser.add_argument("--learning-rate", type=float, default=1e-3)
parser.add_argument("--max-iters", type=int, default=200)
parser.add_argument("--weight-decay", type=float, default=1e-1)
parser.add_argument("--beta1", type=float, default=0.9)
parser.add_argument("--beta2", type=float, default=0.99)
parser.add_argument("--grad-clip", type=float, default=1.0)
parser.add_argument("--warmup-iters", type=int, default=20)
parser.add_argument("--min-lr", type=float, default=1e-4)
parser.add_argument("--seed", type=int, default=1337)
parser.add_argument("--naive-batches", action="store_true", help="nanoGPT's own batches: not resumable exactly")
args = parser.parse_args()
lr_decay_iters = args.max_iters

# every generator the session checkpoints is seeded, so two runs can be compared bit for bit
random.seed(args.seed)
np.random.seed(args.seed)
torch.manual_seed(args.seed)
torch.use_deterministic_algorithms(True)

# data: shakespeare_char's prepare.py, on the text gpufleet ships
text = load_text()
chars = sorted(set(text))
stoi = {ch: i for i, ch in enumerate(chars)}
data = torch.tensor([stoi[c] for c in text], dtype=torch.long)
n = int(0.9 * len(data))
train_data, val_data = data[:n], data[n:]


def get_batch(split: str, position: int | None = None, stream: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Batch ``position`` of ``stream`` (0: training, 1-2: evaluation), or nanoGPT's draw from the global RNG."""
    data = train_data if split == "train" else val_data
    high = len(data) - args.block_size
    if position is None:
        ix = torch.randint(high, (args.batch_size,))
    else:
        ix = torch.randint(high, (args.batch_size,), generator=batch_generator(args.seed * 3 + stream, position))
    x = torch.stack([data[i : i + args.block_size] for i in ix.tolist()])
    y = torch.stack([data[i + 1 : i + 1 + args.block_size] for i in ix.tolist()])
    return x, y


config = CharLMConfig(
    vocab_size=len(chars),
    context=args.block_size,
    layers=args.n_layer,
    heads=args.n_head,
    embed=args.n_embd,
    dropout=args.dropout,
)
model = CharLM(config)

# nanoGPT's configure_optimizers: weight decay on matrices only
params = [p for p in model.parameters() if p.requires_grad]
optimizer = torch.optim.AdamW(
    [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": args.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ],
    lr=args.learning_rate,
    betas=(args.beta1, args.beta2),
)


def get_lr(it: int) -> float:
    """Linear warmup for ``warmup_iters``, cosine decay to ``min_lr`` at ``lr_decay_iters``, then flat."""
    if it < args.warmup_iters:
        return float(args.learning_rate * (it + 1) / (args.warmup_iters + 1))
    if it > lr_decay_iters:
        return float(args.min_lr)
    decay_ratio = (it - args.warmup_iters) / (lr_decay_iters - args.warmup_iters)
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))
    return float(args.min_lr + coeff * (args.learning_rate - args.min_lr))


@torch.no_grad()
def estimate_loss(s: TrainSession) -> dict[str, float] | None:
    """Mean loss over ``eval_iters`` batches of each split; ``None`` when a preemption cut it short."""
    out = {}
    model.eval()
    for stream, split in enumerate(("train", "val"), 1):
        losses = torch.zeros(args.eval_iters)
        for k in range(args.eval_iters):
            if s.preempt_requested:  # the grace period is short: get to report(), which saves
                model.train()
                return None
            x, y = get_batch(split) if args.naive_batches else get_batch(split, k, stream)
            _, loss = model(x, y)
            assert loss is not None
            losses[k] = loss.item()
        out[split] = float(losses.mean())
    model.train()
    return out


os.makedirs(args.out_dir, exist_ok=True)
s = TrainSession.from_env(
    model=model,
    optimizer=optimizer,
    extra={"best_val_loss": 1e9},
    total_steps=args.max_iters,
    ckpt_dir=os.path.join(args.out_dir, "checkpoints"),
    flops_per_token=model.flops_per_token(),
)
with s:
    if args.naive_batches:
        X, Y = get_batch("train")  # fetch the very first batch
    for _ in s.steps():
        it = s.step
        lr = get_lr(it)
        for param_group in optimizer.param_groups:
            param_group["lr"] = lr

        if s.due("eval", every=args.eval_interval):
            losses = estimate_loss(s)
            if losses is not None:
                print(f"step {it}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}", flush=True)
                if losses["val"] < s.values["best_val_loss"]:
                    s.values["best_val_loss"] = losses["val"]
                    if it > 0:
                        checkpoint = {
                            "model": model.state_dict(),
                            "optimizer": optimizer.state_dict(),
                            "model_args": asdict(config),
                            "iter_num": it,
                            "best_val_loss": s.values["best_val_loss"],
                            "config": vars(args),
                        }
                        torch.save(checkpoint, os.path.join(args.out_dir, "ckpt.pt"))
                s.log("eval", val_loss=losses["val"], train_loss=losses["train"])

        micro_losses = []
        for micro_step in range(args.gradient_accumulation_steps):
            if not args.naive_batches:
                X, Y = get_batch("train", s.data_position + micro_step)
            _, loss = model(X, Y)
            assert loss is not None
            micro_losses.append(loss.detach())
            if args.naive_batches:
                X, Y = get_batch("train")  # prefetch the next micro-batch, as nanoGPT does
            (loss / args.gradient_accumulation_steps).backward()
        if args.grad_clip != 0.0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        s.report(micro_losses, tokens=X.numel() * args.gradient_accumulation_steps, lr=lr)
        if it % args.log_interval == 0:
            print(f"iter {it}: loss {float(torch.stack(micro_losses).mean()):.4f}, lr {lr:.2e}", flush=True)
