"""DistributedDataParallel over the data-parallel group: the baseline engine and the parity reference."""

from __future__ import annotations

import warnings

from torch import nn
from torch.nn.parallel import DistributedDataParallel


def apply_ddp(model: nn.Module, dp_mesh, device) -> DistributedDataParallel:
    # Buffers stay per rank (no broadcast), as FSDP leaves them, so BatchNorm behaves alike in both.
    # torch 2.13 deprecates broadcast_buffers but offers no way yet to skip the sync at init.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return DistributedDataParallel(
            model.to(device),
            process_group=dp_mesh.get_group(),
            device_ids=[device] if device.type == "cuda" else None,
            broadcast_buffers=False,
        )
