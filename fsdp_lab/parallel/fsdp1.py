"""FSDP1 (`FullyShardedDataParallel`): the same wrap units as FSDP2, flattened into one FlatParameter
each. The sharding strategy follows the mesh unless set: a 2-D (replicate, shard) mesh is HSDP."""

from __future__ import annotations

import logging

import torch
from torch import nn
from torch.distributed.fsdp import BackwardPrefetch, CPUOffload, MixedPrecision, ShardingStrategy
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import CustomPolicy

from fsdp_lab.config import FSDPConfig
from fsdp_lab.parallel.fsdp2 import dtype_or_none

log = logging.getLogger(__name__)

STRATEGIES = {
    "full_shard": ShardingStrategy.FULL_SHARD,
    "shard_grad_op": ShardingStrategy.SHARD_GRAD_OP,
    "no_shard": ShardingStrategy.NO_SHARD,
    "hybrid_shard": ShardingStrategy.HYBRID_SHARD,
    "hybrid_shard_zero2": ShardingStrategy._HYBRID_SHARD_ZERO2,
}
BACKWARD_PREFETCH = {
    "backward_pre": BackwardPrefetch.BACKWARD_PRE,
    "backward_post": BackwardPrefetch.BACKWARD_POST,
    "off": None,
}


def sharding_strategy(cfg: FSDPConfig, replicated: bool) -> str:
    """The strategy's name: as set, or derived from the mesh (replicate dim -> hybrid) and from
    reshard_after_forward (false -> the ZeRO-2 variant, which keeps parameters for backward)."""
    if cfg.sharding_strategy != "auto":
        return cfg.sharding_strategy
    if replicated:
        return "hybrid_shard" if cfg.reshard_after_forward else "hybrid_shard_zero2"
    return "full_shard" if cfg.reshard_after_forward else "shard_grad_op"


def apply_fsdp1(model: nn.Module, mesh, units: list[nn.Module], cfg: FSDPConfig, device: torch.device) -> FSDP:
    """`mesh` is the 1-D shard mesh, or the 2-D (dp_replicate, dp_shard) mesh for HSDP."""
    strategy = sharding_strategy(cfg, replicated=mesh.ndim == 2)
    unit_ids = {id(u) for u in units}
    wrapped = FSDP(
        model,
        device_mesh=mesh,
        sharding_strategy=STRATEGIES[strategy],
        auto_wrap_policy=CustomPolicy(lambda module: id(module) in unit_ids),
        cpu_offload=CPUOffload(offload_params=cfg.cpu_offload),
        mixed_precision=MixedPrecision(
            param_dtype=dtype_or_none(cfg.param_dtype), reduce_dtype=dtype_or_none(cfg.reduce_dtype)
        ),
        backward_prefetch=BACKWARD_PREFETCH[cfg.backward_prefetch_policy],
        forward_prefetch=cfg.forward_prefetch > 0,
        use_orig_params=cfg.use_orig_params,
        device_id=device,
    )
    log.info(
        "fsdp1: %d units + root, %s on mesh %s, use_orig_params=%s", len(units), strategy, mesh, cfg.use_orig_params
    )
    return wrapped
