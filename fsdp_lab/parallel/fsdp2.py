"""FSDP2 (`fully_shard`): one unit per wrapped module, then the root. The same code serves FSDP
(1-D mesh) and HSDP (2-D replicate x shard mesh)."""

from __future__ import annotations

import logging

import torch
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

from fsdp_lab.config import FSDPConfig

log = logging.getLogger(__name__)


def dtype_or_none(name: str | None) -> torch.dtype | None:
    return getattr(torch, name) if name else None


def apply_fsdp2(model: nn.Module, mesh, units: list[nn.Module], cfg: FSDPConfig) -> nn.Module:
    kwargs = dict(
        mesh=mesh,
        reshard_after_forward=cfg.reshard_after_forward,
        mp_policy=MixedPrecisionPolicy(
            param_dtype=dtype_or_none(cfg.param_dtype), reduce_dtype=dtype_or_none(cfg.reduce_dtype)
        ),
    )
    if cfg.cpu_offload:
        # Pinned host memory needs an accelerator; on a CPU-only machine the params are plain CPU memory.
        kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=torch.cuda.is_available())
    for unit in units:
        fully_shard(unit, **kwargs)
    fully_shard(model, **kwargs)
    _set_explicit_prefetch(units, cfg.forward_prefetch, cfg.backward_prefetch)
    log.info("fsdp2: %d units + root on mesh %s, reshard_after_forward=%s", len(units), mesh, cfg.reshard_after_forward)
    return model


def _set_explicit_prefetch(units: list[nn.Module], forward: int, backward: int) -> None:
    """Prefetch the next `forward` units in forward and the previous `backward` units in backward."""
    for i, unit in enumerate(units):
        if forward:
            unit.set_modules_to_forward_prefetch(units[i + 1 : i + 1 + forward])
        if backward:
            unit.set_modules_to_backward_prefetch(units[max(0, i - backward) : i][::-1])
