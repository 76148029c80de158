"""A world that is not there: a fake process group (collectives do nothing) in which this process plays
one rank, and device meshes built outside FakeTensorMode.

DeviceMesh keeps small real tensors of ranks; `fully_shard` over tensor-parallel parameters builds a
joint (dp, tp) mesh while the model is fake, whose rank lookup (`nonzero`) cannot run on fake tensors."""

from __future__ import annotations

import contextlib
import functools

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.distributed.device_mesh import DeviceMesh
from torch.testing._internal.distributed.fake_pg import FakeStore  # registers the "fake" backend


def _outside_fake_mode(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with unset_fake_temporarily():
            return fn(*args, **kwargs)
    return wrapper


@contextlib.contextmanager
def fake_world(world_size: int, rank: int):
    """Inside: a fake process group of `world_size` with this process as `rank`; meshes stay real."""
    init = DeviceMesh.__init__
    DeviceMesh.__init__ = _outside_fake_mode(init)
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()
        DeviceMesh.__init__ = init
        _forget_meshes()


def _forget_meshes() -> None:
    """DTensor's caches hold the meshes of the world that filled them, and an equal mesh of the next
    world finds them there (meshes compare by ranks and names): its collectives would then look up this
    world's process groups by name, gone with it. A world's meshes die with it."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor import _redistribute

    DTensor._op_dispatcher.sharding_propagator.propagate_op_sharding.cache_clear()
    getattr(torch._C, "_clear_DTensor_sharding_propagator_cache", lambda: None)()  # the C++ fast path's (torch 2.13)
    _redistribute._gen_transform_infos.cache_clear()
    getattr(_redistribute, "clear_redistribute_planner_cache", lambda: None)()  # torch 2.13; 2.11 has none
