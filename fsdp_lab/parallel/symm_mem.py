"""fsdp.symm_mem: FSDP2's all-gathers through NCCL symmetric memory, the ranks' communicators under NCCL's
zero-CTA policy, under which NCCL (2.28 on) may all-gather into a symmetric buffer on one node with the GPUs'
copy engines; with fsdp.force_sum_reduction=true the reduce-scatters too (NCCL's symmetric reduce-scatter
takes sums only, so torch uses it only then). Measured on 2xH200 (torch 2.11 and its NCCL) it did not spare
the matmuls beside it their SMs (benchmarks/sm_contention.py --symm-mem: 1.14x slower beside these gathers,
1.13x beside kernel ones), though the 8B step gains 1.016-1.025x; reduce-scatters from it gained nothing
at 8B on 4xH200 (0.995x bf16, docs/benchmarks.md)."""

from __future__ import annotations

import logging
import os

import torch
import torch.distributed as dist
import torch.distributed._symmetric_memory as symm_mem
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.fsdp._fully_shard._fsdp_collectives import AllGather, ReduceScatter

log = logging.getLogger(__name__)


def symm_mem_missing(reduce_scatter: bool = False) -> str | None:
    """What this torch lacks for fsdp.symm_mem (and its reduce-scatters, with `reduce_scatter`), or None."""
    if hasattr(FSDPModule, "set_symm_mem_for_comm"):
        return None
    hooks = ("set_custom_all_gather", "set_custom_reduce_scatter") if reduce_scatter else ("set_custom_all_gather",)
    if all(hasattr(FSDPModule, h) for h in hooks) and hasattr(symm_mem, "get_mem_pool"):
        return None
    return f"FSDPModule.set_symm_mem_for_comm, {', '.join(hooks)} and symmetric memory pools"


def use_zero_cta_policy() -> None:
    """Before the process group: NCCL reads the policy when it makes the communicator (at once, as the
    group is given a device). Zero CTAs, so that NCCL may give all-gathers into symmetric memory to the copy engines."""
    os.environ.setdefault("NCCL_CTA_POLICY", "2")


def collectives_from_symm_mem(units: list[nn.Module], device_type: str, reduce_scatter: bool) -> None:
    """The FSDP units' all-gathers (and with `reduce_scatter`, their reduce-scatters, which the units
    already sum: fsdp.force_sum_reduction) from symmetric memory, where the collectives are NCCL's: gloo
    has none, and the plan and the estimate trace a GPU run on CPU."""
    if device_type != "cuda":
        log.info("fsdp2: fsdp.symm_mem=true has no NCCL on %s; collectives run as without", device_type)
        return
    if hasattr(FSDPModule, "set_symm_mem_for_comm"):
        for unit in units:  # its reduce-scatters too where the unit sums (torch checks that itself)
            unit.set_symm_mem_for_comm()
    else:
        all_gather, reduce_scatter_comm = SymmMemAllGather(), SymmMemReduceScatter() if reduce_scatter else None
        for unit in units:
            unit.set_custom_all_gather(all_gather)
            if reduce_scatter_comm is not None:
                unit.set_custom_reduce_scatter(reduce_scatter_comm)
    log.info("fsdp2: %s from NCCL symmetric memory, NCCL_CTA_POLICY=%s",
             "all-gathers and reduce-scatters" if reduce_scatter else "all-gathers", os.environ.get("NCCL_CTA_POLICY"))


class _FromSymmPool:
    """Buffers from the symmetric pool, so they are reused rather than allocated and registered each step."""

    def __init__(self) -> None:
        symm_mem.set_backend("NCCL")

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        with torch.cuda.use_mem_pool(symm_mem.get_mem_pool(device)):
            return torch.empty(size, dtype=dtype, device=device)


class SymmMemAllGather(_FromSymmPool, AllGather):
    """What torch 2.13's set_symm_mem_for_comm installs, for torch 2.11 (the GPUs'), which has the
    custom collective hooks and symmetric memory pools but not the method."""

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: dist.ProcessGroup, async_op: bool = False):
        symm_mem.rendezvous(output_tensor, group=group.group_name)  # in place: only the output is exchanged
        return dist.all_gather_into_tensor(output_tensor, input_tensor, group=group, async_op=async_op)


class SymmMemReduceScatter(_FromSymmPool, ReduceScatter):
    """The reduce-scatter torch 2.13's set_symm_mem_for_comm installs on a unit that sums, for torch 2.11."""

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: dist.ProcessGroup, op, async_op: bool = False):
        symm_mem.rendezvous(input_tensor, group=group.group_name)
        symm_mem.rendezvous(output_tensor, group=group.group_name)
        return dist.reduce_scatter_tensor(output_tensor, input_tensor, op=op, group=group, async_op=async_op)
