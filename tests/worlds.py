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
