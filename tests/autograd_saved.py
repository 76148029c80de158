"""What autograd keeps for backward while a function runs: the tests of the estimate's CUDA kernels
and of the lab's Triton kernels compare it."""

from __future__ import annotations

import torch


def saved_by(fn, *inputs):
    """((shape, dtype) of each tensor autograd keeps for backward while fn(*inputs) runs, fn's output)."""
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append((tuple(t.shape), t.dtype)) or t, lambda t: t):
        out = fn(*inputs)
    return saved, out
