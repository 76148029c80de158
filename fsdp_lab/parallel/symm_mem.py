"""fsdp.symm_mem: FSDP2's all-gathers through NCCL symmetric memory, the ranks' communicators under NCCL's
zero-CTA policy, under which NCCL (2.28 on) may all-gather into a symmetric buffer on one node with the GPUs'
copy engines. Measured on 2xH200 (torch 2.11 and its NCCL) it did not spare the matmuls beside it their SMs
(benchmarks/sm_contention.py --symm-mem: 1.14x slower beside these gathers, 1.13x beside kernel ones), though
the 8B step gains 1.016-1.025x (docs/benchmarks.md)."""

from __future__ import annotations

import logging
import os

import torch
import torch.distributed as dist
import torch.distributed._symmetric_memory as symm_mem
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.fsdp._fully_shard._fsdp_collectives import AllGather

log = logging.getLogger(__name__)


def symm_mem_missing() -> str | None:
    """What this torch lacks for fsdp.symm_mem, or None."""
    has_method = hasattr(FSDPModule, "set_symm_mem_for_comm")
    has_hook = hasattr(FSDPModule, "set_custom_all_gather") and hasattr(symm_mem, "get_mem_pool")
    return None if has_method or has_hook else "FSDPModule.set_symm_mem_for_comm, set_custom_all_gather and symmetric memory pools"


def use_zero_cta_policy() -> None:
    """Before the process group: NCCL reads the policy when it makes the communicator (at once, as the
    group is given a device). Zero CTAs, so that NCCL may give all-gathers into symmetric memory to the copy engines."""
    os.environ.setdefault("NCCL_CTA_POLICY", "2")


def all_gather_from_symm_mem(units: list[nn.Module], device_type: str) -> None:
    """The FSDP units' all-gathers from symmetric memory, where the collectives are NCCL's: gloo has
    none, and the plan and the estimate trace a GPU run on CPU."""
    if device_type != "cuda":
        log.info("fsdp2: fsdp.symm_mem=true has no NCCL on %s; all-gathers run as without", device_type)
        return
    if hasattr(FSDPModule, "set_symm_mem_for_comm"):
        for unit in units:
            unit.set_symm_mem_for_comm()
    else:
        comm = SymmMemAllGather()
        for unit in units:
            unit.set_custom_all_gather(comm)
    log.info("fsdp2: all-gathers from NCCL symmetric memory, NCCL_CTA_POLICY=%s", os.environ.get("NCCL_CTA_POLICY"))


class SymmMemAllGather(AllGather):
    """What torch 2.13's set_symm_mem_for_comm installs, for torch 2.11 (the GPUs'), which has the
    custom all-gather hook and symmetric memory pools but not the method."""

    def __init__(self) -> None:
        symm_mem.set_backend("NCCL")

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        # From the symmetric pool, so buffers are reused rather than allocated and registered each step.
        with torch.cuda.use_mem_pool(symm_mem.get_mem_pool(device)):
            return torch.empty(size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: dist.ProcessGroup, async_op: bool = False):
        symm_mem.rendezvous(output_tensor, group=group.group_name)  # in place: only the output is exchanged
        return dist.all_gather_into_tensor(output_tensor, input_tensor, group=group, async_op=async_op)
