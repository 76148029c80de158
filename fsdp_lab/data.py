"""Synthetic data, each sample deterministic in (seed, its global index): the sharded model and its
reference see the same samples, any layout with the same global batch sees the same samples
(step s takes samples s x global batch onwards, data-parallel rank r its r-th slice of them), and a
resumed run continues with the samples the uninterrupted run would have seen, on any mesh."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

# Disjoint bit fields keep every (seed, sample) pair distinct: 2^40 samples per seed, seeds below
# 2^23 (train.seed's limit) keep the generator's seed within 63 bits.
SAMPLE_BITS = 40


def sample_generator(seed: int, index: int) -> torch.Generator:
    return torch.Generator().manual_seed((seed << SAMPLE_BITS) | index)


@dataclass(frozen=True)
class DataPosition:
    """Where a run is in the sample stream: step `step` starts at global sample `sample`, and every
    step takes `global_batch` samples (a run resumed with another global batch continues from there)."""

    global_batch: int
    step: int = 0
    sample: int = 0

    def next_sample(self, step: int) -> int:
        """The first global sample of `step` (0-based)."""
        return self.sample + (step - self.step) * self.global_batch

    def resumed(self, step: int, sample: int) -> DataPosition:
        return DataPosition(self.global_batch, step, sample)


def microbatches(
    model: nn.Module, *, seed: int, first_sample: int, batch_size: int, seq_len: int, n: int,
    device: torch.device, dtype: torch.dtype = torch.float32,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Samples first_sample .. first_sample + batch_size - 1, split into `n` (inputs, targets)
    microbatches on `device`; floating inputs in `dtype` (the parameters')."""
    samples = [model.synthetic_batch(sample_generator(seed, first_sample + i), 1, seq_len) for i in range(batch_size)]
    inputs, targets = (torch.cat(parts) for parts in zip(*samples))
    if inputs.is_floating_point():
        inputs = inputs.to(dtype)
    return [(x.to(device), y.to(device)) for x, y in zip(inputs.chunk(n), targets.chunk(n))]
