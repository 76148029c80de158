"""FSDP2's sharding of a parameter, without a view for every rank: `fully_shard` splits each parameter
into one chunk per rank of its shard group and keeps this rank's and the first (its padded size). Under
FakeTensorMode every chunk is a fake tensor of its own, so at 256 ranks a 70B plan's estimates spent
about a tenth of their time making views nobody reads. Inside `own_chunks()` the chunks are made
when read, each the same view `torch.chunk` makes (the same size, stride and offset)."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence

import torch
from torch.distributed.fsdp._fully_shard import _fsdp_param


class _Chunks(Sequence):
    """`_chunk_with_empty(tensor, n, dim)`'s list, each chunk made when indexed: torch.chunk's chunks of
    ceil(size / n) along dim (the last one shorter), then empty tensors up to n."""

    def __init__(self, tensor: torch.Tensor, n: int, dim: int):
        self.tensor, self.n, self.dim = tensor, n, dim
        self.size = math.ceil(tensor.size(dim) / n)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        if not -self.n <= i < self.n:
            raise IndexError(i)
        start = (i % self.n) * self.size
        if start >= self.tensor.size(self.dim):
            return self[0].new_empty(0)
        return self.tensor.narrow(self.dim, start, min(self.size, self.tensor.size(self.dim) - start))


@contextlib.contextmanager
def own_chunks():
    """Inside: FSDP2's parameters are chunked lazily (module docstring). A torch whose FSDP2 chunks
    otherwise (a private function, which may move) is left as it is: the same estimate, slower."""
    eager = getattr(_fsdp_param, "_chunk_with_empty", None)
    if eager is None:
        yield
        return

    def lazy(tensor: torch.Tensor, num_chunks: int, dim: int):
        # torch.chunk makes every chunk of an empty dimension empty: nothing to save there.
        return _Chunks(tensor, num_chunks, dim) if tensor.size(dim) else eager(tensor, num_chunks, dim)

    _fsdp_param._chunk_with_empty = lazy
    try:
        yield
    finally:
        _fsdp_param._chunk_with_empty = eager
