"""FSDP1's side of the parity check: each FlatParameter's local shard holds pieces of original
parameters; FSDP1's shard metadata says where each piece sits in the shard and in the parameter, so
every rank compares its own pieces with the same slices of the reference (no all-gather)."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp._common_utils import clean_tensor_name


def flat_shard_pairs(
    model: FSDP, ref_params: dict[str, torch.Tensor], only: set[str] | None = None
) -> Iterator[tuple[str, torch.Tensor, torch.Tensor]]:
    """(parameter name, piece of this rank's flat shard, the matching 1-D slice of the reference
    parameter), for the parameters named in `only` if given."""
    for name, module in model.named_modules():
        handle = module._handle if isinstance(module, FSDP) else None
        if handle is None:  # an FSDP unit whose parameters all sit in its children
            continue
        flat = handle.flat_param  # outside forward/backward: the local shard (padded), or all of it for no_shard
        for fqn, info in zip(flat._fqns, flat._shard_param_infos):
            if not info.in_shard:
                continue
            full_name = clean_tensor_name(f"{name}.{fqn}" if name else fqn)
            if only is not None and full_name not in only:
                continue
            local = flat[info.offset_in_shard : info.offset_in_shard + info.numel_in_shard]
            expected = ref_params[full_name].flatten()[info.intra_param_start_idx : info.intra_param_end_idx + 1]
            yield full_name, local, expected


def is_fsdp1(model: nn.Module) -> bool:
    return isinstance(model, FSDP)
