"""ParallelDims, the mesh logic, without a process group: degrees resolve to the world size or are
refused naming every factor; then the named meshes it builds, on a fake group of 8 ranks."""

from __future__ import annotations

import pytest

from fsdp_lab.config import ConfigError, MeshConfig
from fsdp_lab.mesh import MESH_DIM_NAMES, ParallelDims, degrees, ranks, requested_world_size
from fsdp_lab.plan.cost import Layout


def dims(world_size: int, **given: int) -> ParallelDims:
    return ParallelDims.from_mesh(MeshConfig(**given), world_size)


@pytest.mark.parametrize(
    "degrees,world_size,dp_shard",
    [({}, 1, 1), ({}, 8, 8), ({"tp": 2}, 8, 4), ({"pp": 2, "tp": 2}, 8, 2), ({"dp_replicate": 2, "tp": 2}, 8, 2)],
)
def test_dp_shard_minus_one_fills_the_world(degrees, world_size, dp_shard):
    d = dims(world_size, **degrees)
    assert d.dp_shard == dp_shard
    assert d.pp * d.dp_replicate * d.dp_shard * d.tp == d.world_size == world_size


@pytest.mark.parametrize(
    "degrees,world_size,message",
    [
        ({"tp": 3}, 8, "mesh: pp=1 x dp_replicate=1 x tp=3 = 3 does not divide the world size 8, so mesh.dp_shard=-1 cannot fill it"),
        ({"dp_shard": 3}, 8, "mesh: pp=1 x dp_replicate=1 x dp_shard=3 x tp=1 = 3, but the world size is 8"),
        ({"pp": 2, "dp_replicate": 2, "dp_shard": 2, "tp": 2}, 8, "mesh: pp=2 x dp_replicate=2 x dp_shard=2 x tp=2 = 16, but the world size is 8"),
        ({"tp": 0}, 8, "mesh.tp=0: must be >= 1"),
        ({"pp": 0}, 8, "mesh.pp=0: must be >= 1"),
        ({"dp_replicate": 0}, 8, "mesh.dp_replicate=0: must be >= 1"),
        ({"dp_shard": 0}, 8, "mesh.dp_shard=0: must be >= 1, or -1 to fill the world size"),
    ],
)
def test_degrees_that_do_not_make_the_world_are_refused_naming_every_factor(degrees, world_size, message):
    with pytest.raises(ConfigError) as refused:
        dims(world_size, **degrees)
    assert str(refused.value) == message


def test_which_dimensions_are_on():
    fsdp, hsdp, ddp_like, nd = dims(8), dims(8, dp_replicate=2), dims(8, dp_replicate=8), dims(8, pp=2, tp=2)
    assert (fsdp.dp, fsdp.hsdp_enabled, fsdp.fsdp_dim_names) == (8, False, ("dp_shard",))
    assert (hsdp.dp, hsdp.hsdp_enabled, hsdp.fsdp_dim_names) == (8, True, ("dp_replicate", "dp_shard"))
    # Replicas without shards: FSDP still gets the 2-D mesh (each "shard" holds everything).
    assert (ddp_like.dp_shard, ddp_like.hsdp_enabled, ddp_like.fsdp_dim_names) == (1, False, ("dp_replicate", "dp_shard"))
    assert (nd.dp, nd.pp_enabled, nd.tp_enabled, fsdp.pp_enabled, fsdp.tp_enabled) == (2, True, True, False, False)
    assert list(nd.as_dict()) == list(MESH_DIM_NAMES)


def test_meshes_are_named_4d_with_a_flattened_dp(fake_group):
    fake_group(8)
    d = dims(8, dp_replicate=2, tp=2)
    mesh, dp_mesh = d.build_meshes("cpu")
    assert mesh.mesh_dim_names == MESH_DIM_NAMES and tuple(mesh.shape) == (1, 2, 2, 2)
    assert dp_mesh.mesh_dim_names == ("dp",) and dp_mesh.size() == d.dp == 4
    fsdp_mesh = mesh[d.fsdp_dim_names]
    assert fsdp_mesh.mesh_dim_names == ("dp_replicate", "dp_shard") and tuple(fsdp_mesh.shape) == (2, 2)
    # Rank 0's groups: tp neighbours are adjacent ranks, dp ranks stride over tp.
    assert mesh["tp"].mesh.tolist() == [0, 1] and dp_mesh.mesh.tolist() == [0, 2, 4, 6]


def test_every_kind_of_mesh_description_resolves_the_same_way():
    """The run's mesh config, a planned layout and resolved dims all name their degrees alike, so a
    caller never spells them out (a new mesh dimension is added in MESH_DIM_NAMES, not at each caller)."""
    config = MeshConfig(pp=2, dp_replicate=1, dp_shard=-1, tp=2)
    layout = Layout(pp=2, dp_replicate=1, dp_shard=2, tp=2, ac="none", microbatches=1, microbatch_size=1, reshard=True)
    resolved = ParallelDims.from_mesh(config, 8)
    assert ParallelDims.from_mesh(layout, layout.world) == resolved == ParallelDims.from_mesh(resolved, 8)
    assert degrees(resolved) == {"pp": 2, "dp_replicate": 1, "dp_shard": 2, "tp": 2} and list(degrees(resolved)) == list(MESH_DIM_NAMES)
    assert ranks(resolved) == layout.world == 8
    assert ParallelDims.resolve(8) == ParallelDims.from_mesh(MeshConfig(dp_shard=-1), 8)  # missing degrees are 1, dp_shard fills


@pytest.mark.parametrize(
    "given,default,world",
    [({"dp_shard": -1}, 6, 6), ({"dp_shard": -1, "world_size": 4}, 6, 4), ({"dp_shard": 2, "tp": 2}, 6, 4),
     ({"dp_shard": 2, "tp": 2, "world_size": 4}, 6, 4)],
)
def test_the_world_a_mesh_config_asks_for(given, default, world):
    assert requested_world_size(MeshConfig(**given), default) == world


def test_a_world_size_that_contradicts_the_degrees_is_refused_naming_them():
    with pytest.raises(ConfigError, match=r"^mesh.world_size=8, but pp=1 x dp_replicate=1 x dp_shard=2 x tp=2 = 4$"):
        requested_world_size(MeshConfig(dp_shard=2, tp=2, world_size=8), 2)
