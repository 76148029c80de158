"""DistributedDataParallel over the data-parallel group: the baseline engine and the parity reference."""

from __future__ import annotations

import warnings

from torch import nn
from torch.nn.parallel import DistributedDataParallel


def skips_blocks(model: nn.Module, model_cfg) -> bool:
    """Whether the config's `layer_order` (a field of the families whose forward follows one) leaves
    some of the model's blocks out of the forward."""
    layer_order = getattr(model_cfg, "layer_order", None)
    return layer_order is not None and set(layer_order) != set(range(len(model.blocks)))


def apply_ddp(model: nn.Module, dp_mesh, device, model_cfg) -> DistributedDataParallel:
    """DDP of `model`, built from `model_cfg` (run.model)."""
    # Buffers stay per rank (no broadcast), as FSDP leaves them, so BatchNorm behaves alike in both.
    # torch 2.13 deprecates broadcast_buffers but offers no way yet to skip the sync at init.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return DistributedDataParallel(
            model.to(device),
            process_group=dp_mesh.get_group(),
            device_ids=[device] if device.type == "cuda" else None,
            broadcast_buffers=False,
            # Blocks a layer order skips get no gradient, which DDP's reducer waits for unless told to
            # look for them (a graph walk per step: only where the order skips some).
            find_unused_parameters=skips_blocks(model, model_cfg),
        )
