"""ParallelDims: mesh degrees -> a validated, named DeviceMesh.

FSDP, HSDP, 2D and N-D are choices of degrees, not of code: the parallelize step asks this object
which dimensions are on and gets the sub-mesh it needs."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

from fsdp_lab.config import ConfigError

MESH_DIM_NAMES = ("pp", "dp_replicate", "dp_shard", "tp")
FILLED = "dp_shard"  # the degree -1 fills from the world size
_FIXED = tuple(name for name in MESH_DIM_NAMES if name != FILLED)


def degrees(mesh) -> dict[str, int]:
    """{name: degree} of anything with an attribute per mesh dimension (MeshConfig, Layout, ParallelDims)."""
    return {name: getattr(mesh, name) for name in MESH_DIM_NAMES}


def ranks(mesh) -> int:
    """The ranks `mesh`'s degrees multiply to (dp_shard=-1 not filled in: a negative product)."""
    return math.prod(degrees(mesh).values())


def requested_world_size(mesh, default: int) -> int:
    """The ranks a mesh config asks for: the product of its degrees, or `default` (mesh.world_size when
    set) when dp_shard=-1 fills any world."""
    if getattr(mesh, FILLED) == -1:
        return mesh.world_size or default
    world = ranks(mesh)
    if mesh.world_size is not None and mesh.world_size != world:
        raise ConfigError(f"mesh.world_size={mesh.world_size}, but {_spelled(degrees(mesh), MESH_DIM_NAMES)} = {world}")
    return world


def _spelled(d: dict[str, int], names) -> str:
    return " x ".join(f"{name}={d[name]}" for name in names)


@dataclass(frozen=True)
class ParallelDims:
    pp: int
    dp_replicate: int
    dp_shard: int
    tp: int
    world_size: int

    @classmethod
    def from_mesh(cls, mesh, world_size: int) -> ParallelDims:
        """The degrees `mesh` names (anything with an attribute per MESH_DIM_NAMES: the run's
        MeshConfig, a planned Layout) over `world_size` ranks."""
        return cls.resolve(world_size, **degrees(mesh))

    @classmethod
    def resolve(cls, world_size: int, **given: int) -> ParallelDims:
        """Degrees by name (a missing one is 1; dp_shard=-1 or missing fills the world size), checked
        to multiply to world_size."""
        d = {name: given.get(name, -1 if name == FILLED else 1) for name in MESH_DIM_NAMES}
        for key in _FIXED:
            if d[key] < 1:
                raise ConfigError(f"mesh.{key}={d[key]}: must be >= 1")
        fixed = math.prod(d[key] for key in _FIXED)
        if d[FILLED] == -1:
            if world_size % fixed:
                raise ConfigError(
                    f"mesh: {_spelled(d, _FIXED)} = {fixed} does not divide "
                    f"the world size {world_size}, so mesh.{FILLED}=-1 cannot fill it"
                )
            d[FILLED] = world_size // fixed
        elif d[FILLED] < 1:
            raise ConfigError(f"mesh.{FILLED}={d[FILLED]}: must be >= 1, or -1 to fill the world size")
        if fixed * d[FILLED] != world_size:
            raise ConfigError(f"mesh: {_spelled(d, MESH_DIM_NAMES)} = {fixed * d[FILLED]}, but the world size is {world_size}")
        return cls(**d, world_size=world_size)

    @property
    def dp(self) -> int:
        return self.dp_replicate * self.dp_shard

    @property
    def pp_enabled(self) -> bool:
        return self.pp > 1

    @property
    def tp_enabled(self) -> bool:
        return self.tp > 1

    @property
    def hsdp_enabled(self) -> bool:
        return self.dp_replicate > 1 and self.dp_shard > 1

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in MESH_DIM_NAMES}

    def build_meshes(self, device_type: str):
        """The 4-D named mesh (size-1 dimensions included, so sub-meshes are always addressable) and
        the data-parallel mesh: dp_replicate x dp_shard flattened into one `dp` dimension."""
        from torch.distributed.device_mesh import init_device_mesh

        shape = tuple(getattr(self, name) for name in MESH_DIM_NAMES)
        mesh = init_device_mesh(device_type, shape, mesh_dim_names=MESH_DIM_NAMES)
        return mesh, mesh["dp_replicate", "dp_shard"]._flatten("dp")

    @cached_property
    def fsdp_dim_names(self) -> tuple[str, ...]:
        """Mesh dimensions FSDP shards over: 2-D (replicate, shard) for HSDP, else the shard dim."""
        return ("dp_replicate", "dp_shard") if self.dp_replicate > 1 else ("dp_shard",)
