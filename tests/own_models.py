"""Models a user brings (model=custom, `model.build._target_=own_models.NAME`): written as a user
would, knowing nothing of the lab, each with the PyTorch conventions the lab relies on (blocks in an
nn.ModuleList, parameters initialised by reset_parameters())."""

from __future__ import annotations

import torch
from torch import nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(self.norm(x)).chunk(3, dim=-1)
        x = x + self.proj(F.scaled_dot_product_attention(q, k, v, is_causal=True))
        return x + self.mlp(x)


class TinyGPT(nn.Module):
    """Token ids in, (batch, seq, vocab) logits out; its blocks at `blocks`."""

    def __init__(self, vocab: int, dim: int, n_layer: int, max_len: int = 64):
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(max_len, dim)
        self.blocks = nn.ModuleList(Block(dim) for _ in range(n_layer))
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.wte(tokens) + self.wpe(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            h = block(h)
        return self.head(h)


def classifier(features: int, hidden: int, classes: int, depth: int = 2) -> nn.Module:
    """A factory, not a class: features in, (batch, classes) logits out; its blocks at `1`."""
    return nn.Sequential(
        nn.Linear(features, hidden),
        nn.Sequential(*(nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU()) for _ in range(depth))),
        nn.Linear(hidden, classes),
    )


class Scaled(nn.Module):
    """A parameter without reset_parameters(): the lab cannot initialise it from the seed."""

    def __init__(self, dim: int):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(dim))
        self.blocks = nn.ModuleList([nn.Linear(dim, dim)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks[0](x) * self.scale
