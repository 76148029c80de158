"""Synthetic data, deterministic in (seed, step, data-parallel rank): the sharded model and its
reference see the same samples, and a resumed run sees the samples it would have seen."""

from __future__ import annotations

import torch
from torch import nn


def batch_generator(seed: int, step: int, dp_rank: int) -> torch.Generator:
    # Disjoint bit fields keep every (seed, step, rank) triple distinct.
    return torch.Generator().manual_seed((seed << 44) | (step << 20) | dp_rank)


def microbatches(
    model: nn.Module, *, seed: int, step: int, dp_rank: int, batch_size: int, seq_len: int, n: int,
    device: torch.device, dtype: torch.dtype = torch.float32,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """This rank's batch for `step`, split into `n` (inputs, targets) microbatches on `device`;
    floating inputs in `dtype` (the parameters')."""
    inputs, targets = model.synthetic_batch(batch_generator(seed, step, dp_rank), batch_size, seq_len)
    if inputs.is_floating_point():
        inputs = inputs.to(dtype)
    return [(x.to(device), y.to(device)) for x, y in zip(inputs.chunk(n), targets.chunk(n))]
