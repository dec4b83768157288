"""An FSDP2 training script, ported to ``TrainSession`` the way docs/distributed.md says.

Written the way PyTorch's ``distributed/FSDP2/example.py`` is: its own ``init_process_group``, a
small transformer built on the meta device, ``fully_shard`` on every layer and then on the root,
``to_empty`` and ``reset_parameters``, Adam built after sharding, gradient clipping, its own final
save of the full model and optimizer state dicts (``get_model_state_dict`` /
``get_optimizer_state_dict``, written by rank 0 into ``checkpoints/``) and
``torch.distributed.destroy_process_group()`` as the last line of ``main()``. The port removed the
script's own checkpoint loading, put ``TrainSession.from_env`` around the loop, and feeds it token
batches from a ``DistributedSampler`` (a restore moves the loader to ``s.data_position``).

``python fsdp2_port.py [--steps N] [--n-layers N]`` under torchrun (``gpufleet submit`` with
``resources: {gpus: 2}``, ``distributed: {strategy: fsdp}``).
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from gpufleet.runtime import TrainSession


@dataclass
class ModelArgs:
    n_layers: int = 2
    vocab_size: int = 64
    max_seq_len: int = 16
    dim: int = 32
    n_heads: int = 4


class Attention(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.n_heads = args.n_heads
        self.wqkv = nn.Linear(args.dim, 3 * args.dim, bias=False)
        self.wo = nn.Linear(args.dim, args.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (p.view(b, t, self.n_heads, -1).transpose(1, 2) for p in self.wqkv(x).split(d, dim=-1))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        result: torch.Tensor = self.wo(out.transpose(1, 2).reshape(b, t, d))
        return result


class TransformerBlock(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.attention_norm = nn.LayerNorm(args.dim)
        self.attention = Attention(args)
        self.ffn_norm = nn.LayerNorm(args.dim)
        self.feed_forward = nn.Sequential(
            nn.Linear(args.dim, 4 * args.dim), nn.GELU(), nn.Linear(4 * args.dim, args.dim)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        result: torch.Tensor = x + self.feed_forward(self.ffn_norm(x))
        return result


class Transformer(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.pos_embeddings = nn.Embedding(args.max_seq_len, args.dim)
        self.layers = nn.ModuleList(TransformerBlock(args) for _ in range(args.n_layers))
        self.norm = nn.LayerNorm(args.dim)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(tokens.shape[1], device=tokens.device)
        h = self.tok_embeddings(tokens) + self.pos_embeddings(pos)
        for layer in self.layers:
            h = layer(h)
        result: torch.Tensor = self.output(self.norm(h))
        return result

    def reset_parameters(self) -> None:
        """Every parameter, blocks included: memory from ``to_empty`` holds whatever was there."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=1 / math.sqrt(module.in_features))
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight)
            elif isinstance(module, nn.LayerNorm):
                module.reset_parameters()


def batches(loader: DataLoader[Any], position: int) -> Iterator[torch.Tensor]:
    """The token batches from ``position`` on: its epoch (``set_epoch``), minus the batches trained in it."""
    epoch, skip = divmod(position, len(loader))
    while True:
        loader.sampler.set_epoch(epoch)  # type: ignore[attr-defined]
        for index, (tokens,) in enumerate(loader):
            if index >= skip:
                yield tokens
        epoch, skip = epoch + 1, 0


def save(model: nn.Module, optim: torch.optim.Optimizer, folder: str) -> None:
    """Full state dicts, gathered on every rank and written by rank 0 (the example's own checkpoint)."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_sd = get_model_state_dict(model, options=options)
    optim_sd = get_optimizer_state_dict(model, optim, options=options)
    if torch.distributed.get_rank() == 0:
        os.makedirs(folder, exist_ok=True)
        torch.save(model_sd, os.path.join(folder, "model_state_dict.pt"))
        torch.save(optim_sd, os.path.join(folder, "optim_state_dict.pt"))


def main(args: argparse.Namespace) -> None:
    device = torch.device("cpu")
    torch.distributed.init_process_group(backend="gloo")

    torch.manual_seed(0)
    model_args = ModelArgs(n_layers=args.n_layers)
    with torch.device("meta"):
        model = Transformer(model_args)
    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)
    model.to_empty(device=device)
    model.reset_parameters()

    optim = torch.optim.Adam(model.parameters(), lr=1e-2)
    tokens = torch.randint(0, model_args.vocab_size, (args.samples, model_args.max_seq_len + 1))
    loader = DataLoader(
        TensorDataset(tokens), batch_size=args.batch_size, sampler=DistributedSampler(TensorDataset(tokens))
    )

    with TrainSession.from_env(model=model, optimizer=optim, total_steps=args.steps) as s:
        stream, expected = None, -1
        for _ in s.steps():
            if stream is None or s.data_position != expected:  # first step, or a restore or rollback
                stream = batches(loader, s.data_position)
            x = next(stream)
            logits = model(x[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, model_args.vocab_size), x[:, 1:].reshape(-1))
            loss.backward()  # type: ignore[no-untyped-call]
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
            optim.step()
            optim.zero_grad()
            s.report(loss.detach(), tokens=x.numel())
            expected = s.data_position

    save(model, optim, "checkpoints")
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="PyTorch FSDP2 example")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--n-layers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--samples", type=int, default=256)
    args = parser.parse_args()

    main(args)
