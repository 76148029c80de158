"""Checks a composed config before any rank starts: each failure is one ConfigError line naming
the key, the value and what is allowed. Grow this file with every new knob."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from omegaconf import DictConfig

from fsdp_lab.checkpoint import CheckpointError, verify
from fsdp_lab.config import ConfigError, MeshConfig, RunConfig, to_run_config
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
    world = requested_world_size(run.mesh, default_world_size(device_type))
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
    _check_ac(run)
    _check_checkpoint(run)
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


def _check_fsdp(run: RunConfig, dims: ParallelDims, device_type: str) -> None:
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


def _check_ac(run: RunConfig) -> None:
    ac = run.ac
    if ac.mode == "selective" and ac.every < 1:
        raise ConfigError(f"ac.every={ac.every}: must be >= 1")
    if not ac.reentrant:
        return
    if ac.impl == "composable":
        raise ConfigError("ac.reentrant=true: the composable checkpoint is non-reentrant only; allowed with ac.impl=utils|wrapper")
    if ac.mode not in ("full", "selective") or (ac.mode == "selective" and ac.selective == "op"):
        raise ConfigError(
            f"ac.reentrant=true: only checkpointing that recomputes whole blocks has a reentrant variant "
            f"(ac=full, or ac=selective with ac.selective=layer), not ac.mode={ac.mode}"
            + (f" with ac.selective={ac.selective}" if ac.mode == "selective" else "")
        )
    if run.model.name == "mlp_stack":
        raise ConfigError(
            "ac.reentrant=true with model=mlp_stack: its first block takes the raw inputs, which need no "
            "gradient, so reentrant checkpointing would drop that block's gradients; allowed: ac.reentrant=false"
        )


def _check_checkpoint(run: RunConfig) -> None:
    c = run.checkpoint
    for key in ("interval", "keep"):
        if getattr(c, key) < 1:
            raise ConfigError(f"checkpoint.{key}={getattr(c, key)}: must be >= 1")
    if c.resume not in (None, "auto"):
        try:
            verify(Path(c.resume))
        except CheckpointError as e:
            raise ConfigError(f"checkpoint.resume={c.resume}: {e.reason}; allowed: auto, null, or a complete checkpoint") from None
