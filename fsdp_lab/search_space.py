"""The meshes hydra/sweeper=layout_search offers on this machine, as one Optuna choice `mesh.degrees`
(`pp1-rep2-tp1` = mesh.pp=1 mesh.dp_replicate=2 mesh.tp=1, mesh.dp_shard=-1 takes the rest): every
(pp, dp_replicate, tp) whose product divides the world a run gets here (the visible GPUs, else
mesh.cpu_world_size CPU ranks). One choice over valid meshes, not three independent degrees, most of
whose combinations would not divide the world and would spend the study's trials on refusals."""

from __future__ import annotations

import re

from omegaconf import OmegaConf

MESH_PARAM = "mesh.degrees"
_DEGREES = re.compile(r"pp(\d+)-rep(\d+)-tp(\d+)")


def mesh_choices(cpu_world_size: int) -> str:
    import torch

    from fsdp_lab.plan.search import divisors

    world = torch.cuda.device_count() or int(cpu_world_size)
    meshes = [f"pp{pp}-rep{rep}-tp{tp}" for tp in divisors(world) for rep in divisors(world // tp)
              for pp in divisors(world // tp // rep)]
    return f"choice({','.join(meshes)})"


def expand_mesh(overrides: list[str]) -> list[str]:
    """A trial's overrides with `mesh.degrees=ppP-repR-tpT` spelled out as the lab's mesh keys."""
    out = []
    for override in overrides:
        key, _, value = override.partition("=")
        if key != MESH_PARAM:
            out.append(override)
            continue
        m = _DEGREES.fullmatch(value)
        if m is None:
            raise ValueError(f"{override}: expected {MESH_PARAM}=pp<P>-rep<R>-tp<T>")
        out += [f"mesh.pp={m[1]}", f"mesh.dp_replicate={m[2]}", f"mesh.tp={m[3]}"]
    return out


def register_search_resolvers() -> None:
    OmegaConf.register_new_resolver("fsdp_lab_meshes", mesh_choices, replace=True)
