"""Tensor-parallel float8 with each shard's own tensorwise scale (`float8.tp_scales=shard`).

torchao casts a DTensor as one tensor: the amax of a weight, an input or a gradient that tensor
parallelism shards is all-reduced before each cast, a wait for every rank at every cast (at 8B on
2×H100, 931 all-reduces a step where bf16 issues 195: docs/float8.md). Each rank's matmul reads only
its own shards, so a scale taken over them serves it as well: finer than the whole tensor's, never
coarser. A converted linear whose weight tensor parallelism split runs torchao's float8 matmul on the
local shards and hands its result back as the DTensor the TP style expects; the only collectives left
are the TP plan's own."""

from __future__ import annotations

import math

import torch
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torchao.float8.float8_linear import Float8Linear, matmul_with_hp_or_float8_args


def _last_dim_shard(placement, ndim: int) -> bool:
    return isinstance(placement, Shard) and placement.dim in (-1, ndim - 1)


class ShardScaledFloat8Linear(Float8Linear):
    """Float8Linear casting the local shards under tensor parallelism (column- or row-wise); anything
    else (no TP, another layout) runs torchao's own forward."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        w = self.weight
        if not (isinstance(w, DTensor) and isinstance(input, DTensor) and w.device_mesh.ndim == 1 == input.device_mesh.ndim):
            return super().forward(input)
        (w_at,), (x_at,) = w.placements, input.placements
        if w_at == Shard(0) and x_at == Replicate():
            # Column-wise: this rank's output features. Its input's gradient is this rank's share of
            # the sum, which the TP style's input layout then reduces.
            out_at, x_grad_at = Shard(input.ndim - 1), Partial()
        elif w_at == Shard(1) and _last_dim_shard(x_at, input.ndim):
            # Row-wise: partial sums over this rank's input features, which the TP style reduces.
            out_at, x_grad_at = Partial(), x_at
        else:
            return super().forward(input)
        x = input.to_local(grad_placements=(x_grad_at,))
        # As torchao's forward: the output in CUDA autocast's precision (torchao asks through the
        # deprecated get_autocast_gpu_dtype, which issues a DeprecationWarning; here the device is named).
        if torch.is_autocast_enabled("cuda"):
            x = x.to(torch.get_autocast_dtype("cuda"))
        out = matmul_with_hp_or_float8_args.apply(x, w.to_local().t(), self.linear_mm_config, self.config)
        # The global shape given, not inferred: inference assumes every rank holds as many columns as this
        # one. The matmul's output is contiguous, and so the global tensor it stands for.
        shape = (*input.shape[:-1], w.shape[0])
        stride = tuple(math.prod(shape[i + 1:]) for i in range(len(shape)))
        out = DTensor.from_local(out, w.device_mesh, (out_at,), run_check=False, shape=torch.Size(shape), stride=stride)
        if self.bias is not None:
            out = out + self.bias.to(out.dtype)
        return out


def use_shard_scales(linear: Float8Linear) -> None:
    """`linear` casts per shard from now on (its class only: weights, config and hooks stay)."""
    linear.__class__ = ShardScaledFloat8Linear
