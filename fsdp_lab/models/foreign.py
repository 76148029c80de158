"""A module the lab did not write (model=custom, model=hf) under the lab's protocol (LabModel): its
blocks found by an attribute path, its inputs described by `TokenInputs` or `FeatureInputs`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class TokenInputs:
    """Token ids < vocab_size of shape (batch, seq_len); the targets are the next tokens."""

    vocab_size: int

    def batch(self, generator: torch.Generator, batch_size: int, seq_len: int):
        tokens = torch.randint(0, self.vocab_size, (batch_size, seq_len + 1), generator=generator)
        return tokens[:, :-1], tokens[:, 1:]

    def tokens_per_sample(self, seq_len: int) -> int:
        return seq_len

    def expected_logits(self, batch_size: int, seq_len: int) -> tuple[int, ...]:
        return (batch_size, seq_len, self.vocab_size)


@dataclass(frozen=True)
class FeatureInputs:
    """Floats of shape (batch, *shape); the targets are classes < classes."""

    shape: tuple[int, ...]
    classes: int

    def batch(self, generator: torch.Generator, batch_size: int, seq_len: int):
        inputs = torch.randn(batch_size, *self.shape, generator=generator)
        return inputs, torch.randint(0, self.classes, (batch_size,), generator=generator)

    def tokens_per_sample(self, seq_len: int) -> int:
        return 1

    def expected_logits(self, batch_size: int, seq_len: int) -> tuple[int, ...]:
        return (batch_size, self.classes)


def resolve_blocks(module: nn.Module, path: str | None) -> list[nn.Module]:
    """The modules at the dotted `path` of `module`; ValueError saying what is there instead."""
    if path is None:
        return []
    target: object = module
    for i, part in enumerate(path.split(".")):
        if not hasattr(target, part):
            where = ".".join(path.split(".")[:i]) or type(module).__name__
            children = ", ".join(n for n, _ in target.named_children()) if isinstance(target, nn.Module) else ""
            raise ValueError(f"{where} has no attribute {part!r}" + (f" (its children: {children})" if children else ""))
        target = getattr(target, part)
    if isinstance(target, (nn.ModuleList, nn.Sequential)):
        target = list(target)
    if not isinstance(target, (list, tuple)) or not target or not all(isinstance(b, nn.Module) for b in target):
        raise ValueError(f"is a {type(target).__name__}, not a non-empty list of modules (nn.ModuleList)")
    return list(target)


class ForeignModel(nn.Module):
    """`inner` (the user's module, as a child: its parameter names gain `inner.`) with the lab's
    protocol. Its forward returns logits: the module's output, or that output's `.logits`."""

    def __init__(self, inner: nn.Module, blocks_path: str | None, inputs: TokenInputs | FeatureInputs,
                 attention_flops: Callable[[int], float] = lambda seq_len: 0.0, call_kwargs: dict | None = None):
        super().__init__()
        self.inner = inner
        self.blocks_path, self.inputs, self.attention_flops = blocks_path, inputs, attention_flops
        self.call_kwargs = call_kwargs or {}

    @property
    def blocks(self) -> list[nn.Module]:
        return resolve_blocks(self.inner, self.blocks_path)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.inner(x, **self.call_kwargs)
        return getattr(out, "logits", out)

    def synthetic_batch(self, generator: torch.Generator, batch_size: int, seq_len: int):
        return self.inputs.batch(generator, batch_size, seq_len)

    def tokens_per_sample(self, seq_len: int) -> int:
        return self.inputs.tokens_per_sample(seq_len)

    def flops_per_token(self, seq_len: int) -> float:
        # 6 FLOPs per weight and token (forward + backward) for every weight but the embedding
        # lookups (a tied output projection counts); attention's own matmuls where the model knows them.
        n = sum(p.numel() for m in self.modules() if not isinstance(m, nn.Embedding) for p in m.parameters(recurse=False))
        # A sample of features is one "token": this counts each weight once per sample (as an MLP uses it).
        return 6.0 * n + self.attention_flops(seq_len)
