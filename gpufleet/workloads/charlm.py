"""A tiny character-level transformer language model and its data, small enough to train on 2 CPU cores.

The architecture follows Karpathy's nanoGPT (https://github.com/karpathy/nanoGPT, ``model.py``): learned token and
position embeddings, pre-LayerNorm blocks of causal self-attention and a 4x GELU MLP, a final LayerNorm and an LM head
tied to the token embedding. It exists so that gpufleet has a real workload whose loss must keep falling across
preemptions; the training loop lives elsewhere, written against the runtime.

Batches are a pure function of ``(split, position, seed)``: a checkpoint stores only the step position, and a run
restored from it must see exactly the batches an uninterrupted run would have seen.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources

import torch
from torch import Tensor, nn
from torch.nn import functional as F

TEXT_FILE = "verse.txt"
SPLITS = ("train", "val", "test")


def load_text() -> str:
    """The shipped public-domain English text (see ``data/SOURCE.md``), read from the installed package."""
    return (resources.files("gpufleet.workloads") / "data" / TEXT_FILE).read_text(encoding="utf-8")


class CharCorpus:
    """A text as int64 character ids, split contiguously 90/5/5 into ``train``, ``val`` and ``test``.

    The split is contiguous rather than shuffled so that no validation window overlaps a training window except at
    the two boundaries; the vocabulary is sorted so that ids do not depend on hash order or Python version.
    """

    def __init__(self, text: str) -> None:
        if len(text) < 100:
            raise ValueError(f"text has {len(text)} characters; a corpus needs at least 100")
        self.vocab: tuple[str, ...] = tuple(sorted(set(text)))
        self._ids = {ch: i for i, ch in enumerate(self.vocab)}
        data = self.encode(text)
        n_train = len(text) * 90 // 100
        n_val = len(text) * 5 // 100
        self.train: Tensor = data[:n_train]
        self.val: Tensor = data[n_train : n_train + n_val]
        self.test: Tensor = data[n_train + n_val :]

    @classmethod
    def default(cls) -> CharCorpus:
        """The corpus of the shipped text."""
        return cls(load_text())

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def encode(self, text: str) -> Tensor:
        """Character ids of ``text`` as an int64 tensor; characters outside the vocabulary are an error."""
        try:
            return torch.tensor([self._ids[ch] for ch in text], dtype=torch.int64)
        except KeyError as exc:
            raise ValueError(f"character {exc.args[0]!r} is not in the vocabulary") from None

    def decode(self, ids: Tensor | Sequence[int]) -> str:
        """The text of a 1-D sequence of character ids."""
        values = ids.tolist() if isinstance(ids, Tensor) else list(ids)
        return "".join(self.vocab[i] for i in values)

    def split(self, name: str) -> Tensor:
        """The token tensor of split ``name`` (``train``, ``val`` or ``test``)."""
        if name not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {name!r}")
        tokens: Tensor = getattr(self, name)
        return tokens

    def batch(self, split: str, position: int, batch_size: int, context: int, seed: int) -> tuple[Tensor, Tensor]:
        """Batch number ``position`` of ``split``: inputs ``x`` and next-character targets ``y``, both (B, T) int64.

        A private ``torch.Generator`` seeded from ``seed * 1_000_003 + position`` draws the window offsets, so the
        result depends on nothing but the arguments and the global RNG is left untouched: a run resumed at step
        ``position`` sees the same data as one that never stopped. Tensors are on the CPU; move them yourself.
        """
        if position < 0 or seed < 0:
            raise ValueError(f"position and seed must be >= 0, got position={position}, seed={seed}")
        if batch_size <= 0 or context <= 0:
            raise ValueError(f"batch_size and context must be positive, got {batch_size} and {context}")
        data = self.split(split)
        if len(data) <= context:
            raise ValueError(f"split {split!r} has {len(data)} tokens; context {context} needs at least {context + 1}")
        generator = torch.Generator(device="cpu")
        generator.manual_seed((seed * 1_000_003 + position) % (1 << 64))
        offsets = torch.randint(0, len(data) - context, (batch_size,), generator=generator)
        windows = data[offsets[:, None] + torch.arange(context + 1)]
        return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()


@dataclass(frozen=True, slots=True, kw_only=True)
class CharLMConfig:
    """Shape of a :class:`CharLM`. The defaults give about 0.4M parameters, a few tens of ms per CPU step."""

    vocab_size: int
    context: int = 64
    layers: int = 2
    heads: int = 4
    embed: int = 128
    dropout: float = 0.1

    def __post_init__(self) -> None:
        for name in ("vocab_size", "context", "layers", "heads", "embed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout!r}")
        if self.embed % self.heads != 0:
            raise ValueError(f"embed ({self.embed}) must be divisible by heads ({self.heads})")


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention through PyTorch's fused ``scaled_dot_product_attention`` kernel."""

    def __init__(self, config: CharLMConfig) -> None:
        super().__init__()
        self.heads = config.heads
        self.dropout = config.dropout
        self.qkv = nn.Linear(config.embed, 3 * config.embed)
        self.proj = nn.Linear(config.embed, config.embed)
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x: Tensor) -> Tensor:
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in self.qkv(x).split(c, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        out: Tensor = self.resid_dropout(self.proj(y.transpose(1, 2).contiguous().view(b, t, c)))
        return out


class Block(nn.Module):
    """Pre-LayerNorm transformer block: ``x + attn(ln(x))`` then ``x + mlp(ln(x))``, as in GPT-2 and nanoGPT."""

    def __init__(self, config: CharLMConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(config.embed)
        self.attn = CausalSelfAttention(config)
        self.ln2 = nn.LayerNorm(config.embed)
        self.mlp = nn.Sequential(
            nn.Linear(config.embed, 4 * config.embed),
            nn.GELU(),
            nn.Linear(4 * config.embed, config.embed),
            nn.Dropout(config.dropout),
        )

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln1(x))
        out: Tensor = x + self.mlp(self.ln2(x))
        return out


class CharLM(nn.Module):
    """A nanoGPT-style decoder-only transformer over characters.

    The LM head shares its weight with the token embedding (fewer parameters, and the usual GPT-2 choice). Weights
    start as in nanoGPT: N(0, 0.02), with the residual output projections scaled by 1/sqrt(2 * layers) so that the
    residual stream's variance does not grow with depth; the initial loss is then close to ln(vocab_size).
    """

    def __init__(self, config: CharLMConfig) -> None:
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.embed)
        self.pos_emb = nn.Embedding(config.context, config.embed)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.layers))
        self.ln_f = nn.LayerNorm(config.embed)
        self.head = nn.Linear(config.embed, config.vocab_size, bias=False)
        self.head.weight = self.tok_emb.weight
        self.apply(self._init_weights)
        for name, param in self.named_parameters():
            if name.endswith("attn.proj.weight") or name.endswith("mlp.2.weight"):
                nn.init.normal_(param, mean=0.0, std=0.02 / math.sqrt(2 * config.layers))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx: Tensor, targets: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """Logits (B, T, vocab_size) for ids ``idx`` (B, T), and the mean cross-entropy if ``targets`` is given."""
        t = idx.shape[1]
        if t > self.config.context:
            raise ValueError(f"sequence length {t} exceeds the model's context {self.config.context}")
        pos = torch.arange(t, device=idx.device)
        x = self.drop(self.tok_emb(idx) + self.pos_emb(pos))
        for block in self.blocks:
            x = block(x)
        logits: Tensor = self.head(self.ln_f(x))
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))
        return logits, loss

    def num_params(self, exclude_embedding: bool = False) -> int:
        """Number of parameters, each tied tensor counted once.

        With ``exclude_embedding`` the position embedding is left out, as in nanoGPT's ``get_num_params``: it is a
        lookup that costs no FLOPs. The token embedding stays in, because its tensor is also the LM head's weight and
        that matmul is real compute.
        """
        total = sum(p.numel() for p in self.parameters())
        if exclude_embedding:
            total -= self.pos_emb.weight.numel()
        return total

    def flops_per_token(self) -> int:
        """Training FLOPs (forward + backward) per token: ``6N + 12 * L * H * Q * T``.

        The estimate of PaLM (Chowdhery et al. 2022, "PaLM: Scaling Language Modeling with Pathways",
        arXiv:2204.02311, Appendix B), as used by nanoGPT's ``estimate_mfu``: 6N for the matmuls with the weights
        (N = ``num_params(exclude_embedding=True)``) plus 12LHQT for the attention scores and their weighted sum,
        with L layers, H heads, Q = embed / heads the head size and T the context. Multiply by tokens per second and
        divide by the accelerator's peak to get model FLOPs utilization.
        """
        cfg = self.config
        n = self.num_params(exclude_embedding=True)
        return 6 * n + 12 * cfg.layers * cfg.heads * (cfg.embed // cfg.heads) * cfg.context


@torch.no_grad()
def evaluate(
    model: CharLM, corpus: CharCorpus, split: str, *, batches: int, batch_size: int, context: int, seed: int
) -> float:
    """Mean loss over the deterministic batches at positions ``0 .. batches - 1`` of ``split``.

    The model runs in eval mode (no dropout) on its own device, and is put back in the mode it was in, so this can
    be called in the middle of training. Equal arguments give equal batches, so values are comparable across runs.
    """
    if batches <= 0:
        raise ValueError(f"batches must be positive, got {batches}")
    was_training = model.training
    device = next(model.parameters()).device
    model.eval()
    try:
        total = 0.0
        for position in range(batches):
            x, y = corpus.batch(split, position, batch_size, context, seed)
            _, loss = model(x.to(device), y.to(device))
            assert loss is not None
            total += float(loss)
        return total / batches
    finally:
        model.train(was_training)


__all__ = [
    "SPLITS",
    "TEXT_FILE",
    "Block",
    "CausalSelfAttention",
    "CharCorpus",
    "CharLM",
    "CharLMConfig",
    "evaluate",
    "load_text",
]
