"""The base of a pipeline stage (fsdp_lab.parallel.pipeline): some of a model's blocks, under the
model's own names, with the data and throughput helpers of the whole model."""

from __future__ import annotations

import torch
from torch import nn


class Stage(nn.Module):
    """`layers.<i>` for each of `layer_ids`; `whole` (weightless, on meta) answers for the model.
    Subclasses add the root modules their position needs (first: embeddings, last: the head) and
    a forward."""

    def __init__(self, model: nn.Module, layer_ids: list[int], whole: nn.Module):
        super().__init__()
        self.layers = nn.ModuleDict({str(i): model.blocks[i] for i in layer_ids})
        object.__setattr__(self, "whole", whole)  # not a submodule: its meta parameters are no one's to train

    @property
    def blocks(self) -> list[nn.Module]:
        return list(self.layers.values())

    def synthetic_batch(self, generator: torch.Generator, batch_size: int, seq_len: int):
        return self.whole.synthetic_batch(generator, batch_size, seq_len)

    def tokens_per_sample(self, seq_len: int) -> int:
        return self.whole.tokens_per_sample(seq_len)

    def flops_per_token(self, seq_len: int) -> float:
        return self.whole.flops_per_token(seq_len)
