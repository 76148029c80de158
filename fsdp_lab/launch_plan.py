"""What a launcher plugin needs to place one sweep job: its world size (and device), from the job's
composed config, checked the way every run is checked before a rank starts."""

from __future__ import annotations

import copy

from omegaconf import DictConfig, open_dict, read_write

from fsdp_lab.compose import to_run_config
from fsdp_lab.dist import default_world_size, resolve_device_type
from fsdp_lab.mesh import ParallelDims, requested_world_size
from fsdp_lab.spawn import check_launch
from fsdp_lab.validate import check_run, prepare


def task_config(cfg: DictConfig) -> DictConfig:
    """A sweep job's config as its task function sees it: without the `hydra` node, whose runtime
    fields are only filled once the job runs."""
    task_cfg = copy.deepcopy(cfg)
    with read_write(task_cfg), open_dict(task_cfg):
        task_cfg.pop("hydra", None)
    return task_cfg


def local_job(cfg: DictConfig) -> tuple[int, str]:
    """(world size, device type) of a job run on this machine; raises ConfigError."""
    run, dims = prepare(task_config(cfg))
    return dims.world_size, resolve_device_type(run.device)


def cluster_world_size(cfg: DictConfig, *, gpus_per_node: int | None, nodes: int) -> int:
    """World size of a job submitted from a login node, which may see no GPU: a mesh that fills any
    world (dp_shard=-1, no mesh.world_size) gets every GPU requested, or the CPU default."""
    run = to_run_config(task_config(cfg))
    m = run.mesh
    world = requested_world_size(m, gpus_per_node * nodes if gpus_per_node else default_world_size("cpu", m.cpu_world_size))
    dims = ParallelDims.from_mesh(m, world)
    device_type = "cuda" if gpus_per_node else "cpu"
    check_run(run, dims, device_type)
    check_launch(run, device_type, ranks_started_by="SLURM (a job's ranks are its tasks)")
    return world
