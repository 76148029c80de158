"""The mesh degrees hydra/sweeper=layout_search offers on this machine: those that divide the world a
run gets here (every visible GPU, else mesh.cpu_world_size CPU ranks), as an Optuna choice."""

from __future__ import annotations

from omegaconf import OmegaConf


def degree_choices(cpu_world_size: int) -> str:
    import torch

    world = torch.cuda.device_count() or int(cpu_world_size)
    return f"choice({','.join(str(d) for d in range(1, world + 1) if world % d == 0)})"


def register_search_resolvers() -> None:
    OmegaConf.register_new_resolver("fsdp_lab_degrees", degree_choices, replace=True)
