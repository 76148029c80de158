"""ParallelDims: mesh degrees -> a validated, named DeviceMesh.

FSDP, HSDP, 2D and N-D are choices of degrees, not of code: the parallelize step asks this object
which dimensions are on and gets the sub-mesh it needs."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from fsdp_lab.config import ConfigError

MESH_DIM_NAMES = ("pp", "dp_replicate", "dp_shard", "tp")


@dataclass(frozen=True)
class ParallelDims:
    pp: int
    dp_replicate: int
    dp_shard: int
    tp: int
    world_size: int

    @classmethod
    def resolve(cls, *, pp: int, dp_replicate: int, dp_shard: int, tp: int, world_size: int) -> ParallelDims:
        """Fill dp_shard=-1 from the world size and check that the degrees multiply to it."""
        for key, value in (("pp", pp), ("dp_replicate", dp_replicate), ("tp", tp)):
            if value < 1:
                raise ConfigError(f"mesh.{key}={value}: must be >= 1")
        fixed = pp * dp_replicate * tp
        if dp_shard == -1:
            if world_size % fixed:
                raise ConfigError(
                    f"mesh: pp={pp} x dp_replicate={dp_replicate} x tp={tp} = {fixed} does not divide "
                    f"the world size {world_size}, so mesh.dp_shard=-1 cannot fill it"
                )
            dp_shard = world_size // fixed
        elif dp_shard < 1:
            raise ConfigError(f"mesh.dp_shard={dp_shard}: must be >= 1, or -1 to fill the world size")
        if fixed * dp_shard != world_size:
            raise ConfigError(
                f"mesh: pp={pp} x dp_replicate={dp_replicate} x dp_shard={dp_shard} x tp={tp} = "
                f"{fixed * dp_shard}, but the world size is {world_size}"
            )
        return cls(pp=pp, dp_replicate=dp_replicate, dp_shard=dp_shard, tp=tp, world_size=world_size)

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
