"""FSDP2's chunks made when read (fsdp_lab/estimate/shard_views.py): the same views as torch.chunk's, and
the same estimate."""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch.distributed.fsdp._fully_shard import _fsdp_param
from torch.distributed.fsdp._fully_shard._fsdp_common import _chunk_with_empty

import fsdp_lab.estimate.trace as estimate_trace
from fsdp_lab.estimate import estimate
from fsdp_lab.estimate.shard_views import own_chunks


@pytest.mark.parametrize("shape, n, dim", [((5, 6), 4, 0), ((10, 6), 4, 0), ((3, 8), 4, 1), ((3, 6), 8, 0), ((1000, 2), 256, 0)])
def test_each_chunk_is_the_view_torch_chunk_makes(shape, n, dim):
    t = torch.empty(shape)
    with own_chunks():
        lazy = _fsdp_param._chunk_with_empty(t, n, dim)
    eager = _chunk_with_empty(t, n, dim)
    assert not isinstance(lazy, list) and len(lazy) == len(eager) == n
    for i in [*range(n), -1]:
        a, b = lazy[i], eager[i]
        assert (a.shape, a.stride(), a.storage_offset(), a.dtype) == (b.shape, b.stride(), b.storage_offset(), b.dtype)
    assert _fsdp_param._chunk_with_empty is not lazy and isinstance(_fsdp_param._chunk_with_empty(t, n, dim), list)


def test_the_estimate_of_an_uneven_shard_group_is_the_same(prepared, monkeypatch):
    """8 ranks over a model whose widths 8 does not divide: the padded shards, as eager chunks give them."""
    run, dims = prepared("model.dim=36", "model.n_layers=2", "model.n_heads=3", "model.ffn_dim=100", "model.vocab_size=250",
                         "mode=estimate", "mesh.dp_shard=8", "train.seq_len=16", "train.batch_size=1", "logger=none")
    lazy = estimate(run, dims)
    monkeypatch.setattr(estimate_trace, "own_chunks", contextlib.nullcontext)
    eager = estimate(run, dims)
    assert lazy["peak_mib"] == eager["peak_mib"] and lazy["phases_mib"] == eager["phases_mib"]
