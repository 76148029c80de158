"""Checks a composed config before any rank starts: each failure is one ConfigError line naming
the key, the value and what is allowed. Grow this file with every new knob."""

from __future__ import annotations

import os

import torch
from omegaconf import DictConfig

from fsdp_lab.config import ConfigError, FSDPConfig, MeshConfig, RunConfig, to_run_config
from fsdp_lab.dist import default_world_size, is_rank_process, resolve_device_type
from fsdp_lab.mesh import ParallelDims


def prepare(cfg: DictConfig) -> tuple[RunConfig, ParallelDims]:
    """The typed, checked run and its parallel dimensions."""
    run = to_run_config(cfg)
    device_type = resolve_device_type(run.device)
    dims = ParallelDims.resolve(
        pp=run.mesh.pp, dp_replicate=run.mesh.dp_replicate, dp_shard=run.mesh.dp_shard, tp=run.mesh.tp,
        world_size=_world_size(run, device_type),
    )
    check_run(run, dims, device_type)
    return run, dims


def _world_size(run: RunConfig, device_type: str) -> int:
    if is_rank_process():
        return int(os.environ["WORLD_SIZE"])
    world = requested_world_size(run.mesh, default_world_size(device_type, run.mesh.cpu_world_size))
    if device_type == "cuda" and world > torch.cuda.device_count():
        raise ConfigError(f"mesh: world size {world} needs {world} GPUs, but {torch.cuda.device_count()} are visible")
    return world


def requested_world_size(m: MeshConfig, default: int) -> int:
    """The ranks a mesh asks for: the product of its degrees, or `default` when dp_shard=-1 fills any world."""
    if m.dp_shard == -1:
        return m.world_size or default
    world = m.pp * m.dp_replicate * m.dp_shard * m.tp
    if m.world_size is not None and m.world_size != world:
        raise ConfigError(
            f"mesh.world_size={m.world_size}, but pp={m.pp} x dp_replicate={m.dp_replicate} x "
            f"dp_shard={m.dp_shard} x tp={m.tp} = {world}"
        )
    return world


def check_run(run: RunConfig, dims: ParallelDims, device_type: str) -> None:
    t = run.train
    if t.steps < 1:
        raise ConfigError(f"train.steps={t.steps}: must be >= 1")
    if t.batch_size < 1:
        raise ConfigError(f"train.batch_size={t.batch_size}: must be >= 1")
    if t.microbatches < 1 or t.batch_size % t.microbatches:
        raise ConfigError(f"train.microbatches={t.microbatches}: must divide train.batch_size={t.batch_size}")
    if run.model.name == "transformer" and run.model.dim % run.model.n_heads:
        raise ConfigError(f"model.n_heads={run.model.n_heads}: must divide model.dim={run.model.dim}")
    _check_fsdp(run, dims, device_type)
    _check_accum(run, dims)
    if run.logger.init_timeout_s <= 0:
        raise ConfigError(f"logger.init_timeout_s={run.logger.init_timeout_s}: must be > 0")
    f = run.fault
    if f.kill_rank is not None and not 0 <= f.kill_rank < dims.world_size:
        raise ConfigError(f"fault.kill_rank={f.kill_rank}: must be a rank in 0..{dims.world_size - 1}")
    if (f.kill_rank is None) != (f.at_step is None):
        raise ConfigError("fault.kill_rank and fault.at_step: set both or neither")


def _check_accum(run: RunConfig, dims: ParallelDims) -> None:
    a = run.train.accum
    if a.sync == "reduce_scatter_only" and not (run.mesh.engine == "fsdp2" and dims.hsdp_enabled):
        raise ConfigError(
            "train.accum.sync=reduce_scatter_only: needs HSDP with FSDP2 (mesh.engine=fsdp2, mesh.dp_replicate>1 "
            f"and mesh.dp_shard>1; here engine={run.mesh.engine}, dp_replicate={dims.dp_replicate}, "
            f"dp_shard={dims.dp_shard}); allowed otherwise: every, last"
        )
    for key, value, default in (("reshard_after_backward", a.reshard_after_backward, True), ("explicit_unshard", a.explicit_unshard, False)):
        if value != default and run.mesh.engine != "fsdp2":
            raise ConfigError(f"train.accum.{key}={str(value).lower()}: only FSDP2 has it; mesh.engine={run.mesh.engine}")


# The engines each fsdp.* knob acts on; any other value than the default with another engine is refused.
ENGINE_KNOBS = {
    "reshard_after_forward": ("fsdp2", "fsdp1"),
    "param_dtype": ("fsdp2", "fsdp1"),
    "reduce_dtype": ("fsdp2", "fsdp1"),
    "cpu_offload": ("fsdp2", "fsdp1"),
    "forward_prefetch": ("fsdp2", "fsdp1"),
    "backward_prefetch": ("fsdp2",),
    "sharding_strategy": ("fsdp1",),
    "use_orig_params": ("fsdp1",),
    "backward_prefetch_policy": ("fsdp1",),
}
HYBRID = ("hybrid_shard", "hybrid_shard_zero2")


def _show(value) -> str:
    """A value as it is written in an override."""
    if isinstance(value, bool):
        return str(value).lower()
    return "null" if value is None else str(value)


def _check_engine(run: RunConfig, dims: ParallelDims, device_type: str) -> None:
    engine, f = run.mesh.engine, run.fsdp
    defaults = FSDPConfig()
    for key, engines in ENGINE_KNOBS.items():
        value = getattr(f, key)
        if engine not in engines and value != getattr(defaults, key):
            raise ConfigError(f"fsdp.{key}={_show(value)}: applies to mesh.engine={'|'.join(engines)}, not mesh.engine={engine}")
    if engine == "fsdp1":
        _check_fsdp1(run, dims, device_type)


def _check_fsdp1(run: RunConfig, dims: ParallelDims, device_type: str) -> None:
    f, strategy = run.fsdp, run.fsdp.sharding_strategy
    for key in ("pp", "tp"):
        if getattr(dims, key) > 1:
            raise ConfigError(f"mesh.{key}={getattr(dims, key)} with mesh.engine=fsdp1: fsdp1 runs on data-parallel meshes only; allowed: mesh.engine=fsdp2")
    if not isinstance(f.reshard_after_forward, bool):
        raise ConfigError(f"fsdp.reshard_after_forward={f.reshard_after_forward} with mesh.engine=fsdp1: allowed are true, false")
    if not f.reshard_after_forward and strategy in ("full_shard", "hybrid_shard"):
        raise ConfigError(
            f"fsdp.reshard_after_forward=false with fsdp.sharding_strategy={strategy}: {strategy} reshards after "
            "forward; allowed: sharding_strategy=auto|shard_grad_op|hybrid_shard_zero2|no_shard"
        )
    if f.forward_prefetch > 1:
        raise ConfigError(f"fsdp.forward_prefetch={f.forward_prefetch} with mesh.engine=fsdp1: fsdp1 prefetches one unit; allowed: 0, 1")
    if strategy in HYBRID and dims.dp_replicate == 1:
        raise ConfigError(f"fsdp.sharding_strategy={strategy}: needs mesh.dp_replicate > 1 (e.g. mesh=hsdp), got mesh.dp_replicate=1")
    if strategy not in HYBRID + ("auto",) and dims.dp_replicate > 1:
        raise ConfigError(
            f"fsdp.sharding_strategy={strategy} with mesh.dp_replicate={dims.dp_replicate}: a replicated mesh "
            "takes auto, hybrid_shard or hybrid_shard_zero2"
        )
    if dims.dp_replicate > 1 and dims.dp_shard == 1:
        # FSDP1 turns a 1-rank shard group into NO_SHARD over that group: the replicas would never sync.
        raise ConfigError(
            f"mesh.dp_shard=1 with mesh.dp_replicate={dims.dp_replicate} and mesh.engine=fsdp1: fsdp1 cannot "
            "replicate without sharding; allowed: mesh.dp_shard >= 2, or mesh.engine=fsdp2|ddp"
        )
    if f.cpu_offload and device_type == "cpu":
        raise ConfigError("fsdp.cpu_offload=true with mesh.engine=fsdp1 on CPU: FSDP1's CPUOffload needs an accelerator; allowed: false")
    if run.model.compile and not f.use_orig_params:
        raise ConfigError("model.compile=true with mesh.engine=fsdp1: needs fsdp.use_orig_params=true")


def _check_fsdp(run: RunConfig, dims: ParallelDims, device_type: str) -> None:
    _check_engine(run, dims, device_type)
    f = run.fsdp
    raf = f.reshard_after_forward
    if not isinstance(raf, bool):
        if not isinstance(raf, int) or raf < 2 or dims.dp_shard % raf:
            raise ConfigError(
                f"fsdp.reshard_after_forward={raf!r}: allowed are true, false, or an int >= 2 dividing "
                f"mesh.dp_shard={dims.dp_shard}"
            )
    if device_type == "cpu":
        for key in ("param_dtype", "reduce_dtype"):
            if getattr(f, key) == "float16":
                raise ConfigError(f"fsdp.{key}=float16: not supported on CPU; allowed here: float32, bfloat16, null")
    if run.wrap.policy == "linear" and run.model.tie_embeddings:
        raise ConfigError(
            "wrap.policy=linear with model.tie_embeddings=true: the tied weight would sit in two FSDP units; "
            "allowed: wrap.policy=block|root|size"
        )
