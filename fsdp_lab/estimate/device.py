"""Does an estimated peak fit on a GPU: the device's memory, and what a run needs of it beyond the
traced tensors (the assumptions every estimate states in estimate.json)."""

from __future__ import annotations

import torch

from fsdp_lab.config import EstimateConfig
from fsdp_lab.memory_phases import MIB
from fsdp_lab.device_memory import memory_gib

GIB = 1024


def device_memory(cfg: EstimateConfig) -> tuple[str, float] | None:
    """(name, MiB) of the device to fit on: the configured size, the named device, else the visible GPU."""
    if cfg.device_memory_gib is not None:
        return cfg.device or "estimate.device_memory_gib", cfg.device_memory_gib * GIB
    if cfg.device is not None:
        return cfg.device, memory_gib(cfg.device) * GIB  # the one registry mode=plan reads too
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        return props.name, props.total_memory / MIB
    return None


def assumptions(cfg: EstimateConfig, substituted: dict[str, str]) -> dict:
    return {
        "workspace_mib": cfg.workspace_mib,
        "workspace": "library workspaces inside the allocator (cuBLAS/cuBLASLt), added to the traced peak",
        "reserved_mib": cfg.reserved_mib,
        "reserved": "device memory outside the allocator (CUDA context, NCCL buffers)",
        "fragmentation": cfg.fragmentation,
        "fragmentation_note": "the allocator reserves this fraction over its peak of live tensors",
        "kernels_substituted": substituted,
    }


def verdict(cfg: EstimateConfig, peak_mib: float) -> dict:
    """The device memory a run needs for `peak_mib` of tensors and whether the device has it."""
    needed = peak_mib * (1 + cfg.fragmentation) + cfg.reserved_mib
    device = device_memory(cfg)
    if device is None:
        return {"device": None, "device_memory_mib": None, "needed_mib": needed, "fits": None}
    name, total = device
    return {"device": name, "device_memory_mib": total, "needed_mib": needed, "fits": needed <= total}
