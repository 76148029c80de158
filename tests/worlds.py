"""Process groups inside the test process, for the fast tier:

- a fake group of any world size (`fake` backend): collectives do nothing, so it shows what
  parallelizing builds (meshes, shards, wrappers, stages), not what training computes;
- a real gloo world of one rank: every collective runs, so a run's trainer trains and its probes
  measure as in a 1-rank run of the CLI (mesh=single)."""

from __future__ import annotations

import os
import socket
from contextlib import contextmanager
from unittest import mock

import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore  # registers the "fake" backend

from fsdp_lab.dist import DistContext, init_distributed


@contextmanager
def fake_group(world_size: int, rank: int = 0):
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def world_of_one():
    """This process as rank 0 of 1, joined the way a launched rank joins (fsdp_lab.dist)."""
    env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    with mock.patch.dict(os.environ, env):
        ctx: DistContext = init_distributed("cpu", timeout_s=60)
        try:
            yield ctx
        finally:
            dist.destroy_process_group()


def tiny_model_on_one_rank(ctx: DistContext, *overrides: str):
    """(run, model): the parallelized tiny model of a 1-rank run (mesh=single) in world_of_one's `ctx`."""
    from fsdp_lab.compose import prepared
    from fsdp_lab.worker import build_trainer

    run, dims = prepared("debug=cpu_tiny", "probes=off", "mesh=single", "train.seq_len=32", *overrides)
    return run, build_trainer(run, dims, ctx, on_step=lambda row: None).model


def sharded_on_two_fake_ranks(model_cfg, rank: int, seed: int):
    """`model_cfg`'s model as fake rank `rank` of 2 holds it: blocks and root fully_shard-ed over a
    2-rank mesh, materialised from `seed` (and model.pretrained's checkpoint, if set). Call inside
    fake_group(2, rank): distributing a whole tensor to its shards needs no collective."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from fsdp_lab.models import build_meta, materializer

    # torch caches DTensor layouts by mesh, and equal meshes of two fake ranks in one process would
    # share rank 0's: the name keeps each rank's mesh its own.
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=(f"shard_of_rank{rank}",))
    sharded = build_meta(model_cfg)
    init = materializer(sharded, model_cfg, seed=seed)
    for block in sharded.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(sharded, mesh=mesh)
    init.materialise(sharded, torch.device("cpu"))
    return sharded
