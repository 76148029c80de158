"""Cross-entropy of low-precision logits (bf16, fp16) in float32, a slice of rows at a time.

Upcasting all the logits first, as `F.cross_entropy(logits.float(), ...)` does, holds a float32 copy
of them and a float32 log-softmax for backward: at 8192 tokens x 32000 classes, 1 GiB each beside the
0.5 GiB bf16 logits. Here forward keeps one row slice's float32 log-softmax at a time and backward
recomputes each slice's softmax from the low-precision logits the graph holds anyway, writing the
gradient straight in their dtype. The arithmetic is the same float32 (only the order of the mean's
sum differs)."""

from __future__ import annotations

import contextlib
import itertools
from contextvars import ContextVar

import torch

SLICE_ELEMENTS = 2**25
"""Logits per row slice: 128 MiB of float32 work space (1048 rows at 32000 classes)."""

_KEPT: ContextVar[int | None] = ContextVar("slices_kept", default=None)


@contextlib.contextmanager
def slices_kept(n: int | None):
    """Inside: each pass of the loss runs its first n row slices only (None: all), for a trace of memory
    alone (mode=plan's estimates: under fake tensors every slice costs the host its ops, whatever its
    size). From the second slice on each holds what the one before held (the slice it computes beside the
    previous one's, freed once replaced), the last no more, so the first 2 reach the loss's peak of any number."""
    token = _KEPT.set(n)
    try:
        yield
    finally:
        _KEPT.reset(token)


def _row_slices(rows: int, classes: int):
    step = max(1, SLICE_ELEMENTS // max(classes, 1))
    return itertools.islice((slice(start, start + step) for start in range(0, rows, step)), _KEPT.get())


class LowPrecisionCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        rows, classes = logits.shape
        total = torch.zeros((), dtype=torch.float32, device=logits.device)
        for rs in _row_slices(rows, classes):
            log_probs = torch.log_softmax(logits[rs], dim=-1, dtype=torch.float32)
            total = total - log_probs.gather(1, targets[rs, None]).sum()
        ctx.save_for_backward(logits, targets)
        return total / rows

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        logits, targets = ctx.saved_tensors
        rows, classes = logits.shape
        out = torch.empty_like(logits)
        scale = grad / rows
        for rs in _row_slices(rows, classes):
            probs = torch.softmax(logits[rs], dim=-1, dtype=torch.float32)
            probs.scatter_add_(1, targets[rs, None], torch.full_like(probs[:, :1], -1.0))
            # Multiplied in float32 and rounded once into the slice of `out`: one pass over the float32
            # slice instead of a scaling pass and a separate cast (the same bits).
            torch.mul(probs, scale, out=out[rs])
        return out, None


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over the rows of [rows, classes] logits, in at least float32 (a float64
    model keeps its precision); bf16/fp16 logits take the sliced path above."""
    if logits.dtype in (torch.bfloat16, torch.float16):
        return LowPrecisionCrossEntropy.apply(logits, targets)
    return torch.nn.functional.cross_entropy(logits.to(torch.promote_types(logits.dtype, torch.float32)), targets)
