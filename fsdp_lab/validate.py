"""Checks a composed config before any rank starts, each failure one ConfigError line naming the key,
the value and what is allowed. A thin dispatcher: MODES holds, per mode, its checks and what the CLI
then does (run.py looks the mode up here once); each subsystem keeps its own refusals beside its code
(the engines, TP, PP, AC, accumulation, checkpoints, faults, the probes, each model family, the
estimate, the plan)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import DictConfig

from fsdp_lab.accum import check_accum
from fsdp_lab.checkpoint import check_checkpoint
from fsdp_lab.checks import parse as parse_check
from fsdp_lab.compose import to_run_config
from fsdp_lab.config import ConfigError, RunConfig, TrainConfig
from fsdp_lab.dist import default_world_size, is_rank_process, resolve_device_type
from fsdp_lab.estimate.refusals import check_estimable
from fsdp_lab.fault import check_fault
from fsdp_lab.freeze import check_freeze
from fsdp_lab.mesh import ParallelDims, requested_world_size
from fsdp_lab.models import model_spec
from fsdp_lab.mode_limits import check_estimate_limits, check_plan_limits
from fsdp_lab.names import check_names
from fsdp_lab.objective import check_objective
from fsdp_lab.parallel.ac import check_ac
from fsdp_lab.parallel.engine_checks import check_fsdp
from fsdp_lab.parallel.float8 import check_float8
from fsdp_lab.parallel.pipeline import check_pipeline
from fsdp_lab.parallel.tp import check_tp
from fsdp_lab.probes.parity_probe import check_reference_fits
from fsdp_lab.probes.registry import check_probes
from fsdp_lab.spawn import check_launch
from fsdp_lab.standalone import check_module_calls
from fsdp_lab.user_code import built_on_meta

Execute = Callable[[RunConfig, ParallelDims, Path, list[str]], None]


@dataclass(frozen=True)
class Mode:
    check: Callable[[RunConfig], ParallelDims]
    """The mode's refusals, before any rank starts; returns the dims it runs with."""
    execute: Execute
    """What the command line then does in the run dir (given the run's overrides)."""


def prepare(cfg: DictConfig) -> tuple[RunConfig, ParallelDims]:
    """The typed, checked run and its parallel dimensions."""
    run = to_run_config(cfg)
    check_objective(run)
    return run, MODES[run.mode].check(run)


def _check_train(run: RunConfig) -> ParallelDims:
    device_type = resolve_device_type(run.device)
    dims = ParallelDims.from_mesh(run.mesh, _world_size(run, device_type))
    derive_batch_size(run.train, dims)
    check_run(run, dims, device_type)
    return dims


def _check_estimate(run: RunConfig) -> ParallelDims:
    """mode=estimate predicts a world this machine may not have: its size comes from the degrees, and
    it is checked as the GPU run it predicts (GPU-only dtypes are fine)."""
    m = run.mesh
    if m.dp_shard == -1 and m.world_size is None:
        raise ConfigError("mesh.dp_shard=-1: mode=estimate needs the world size; set mesh.dp_shard=N or mesh.world_size=N")
    dims = ParallelDims.from_mesh(m, requested_world_size(m, m.world_size))
    check_estimable(run)  # first: what cannot be estimated at all says so before finer checks
    derive_batch_size(run.train, dims)
    check_run(run, dims, "cuda")
    check_estimate_limits(run)
    return dims


def _check_plan(run: RunConfig) -> ParallelDims:
    """mode=plan picks the mesh itself: the run's own mesh is not checked; its dims are plan.gpus of FSDP."""
    from fsdp_lab.plan.run import check_plan

    check_plan_limits(run)  # first: what the planner cannot take, before check_plan looks at the model's blocks
    check_plan(run)
    return ParallelDims.resolve(run.plan.gpus)


# The executors import their mode's code only when it runs: a rank never imports the planner.
def _train(run: RunConfig, dims: ParallelDims, run_dir: Path, overrides: list[str]) -> None:
    from fsdp_lab.launch import train

    train(run, dims, run_dir)


def _estimate(run: RunConfig, dims: ParallelDims, run_dir: Path, overrides: list[str]) -> None:
    from fsdp_lab.estimate import run_estimate

    run_estimate(run, dims, run_dir)
    print(f"run dir: {run_dir}", flush=True)


def _plan(run: RunConfig, dims: ParallelDims, run_dir: Path, overrides: list[str]) -> None:
    from fsdp_lab.plan.run import run_plan

    run_plan(run, run_dir, overrides)
    print(f"run dir: {run_dir}", flush=True)


MODES = {"train": Mode(_check_train, _train), "estimate": Mode(_check_estimate, _estimate), "plan": Mode(_check_plan, _plan)}


def _world_size(run: RunConfig, device_type: str) -> int:
    if is_rank_process():
        return int(os.environ["WORLD_SIZE"])
    world = requested_world_size(run.mesh, default_world_size(device_type, run.mesh.cpu_world_size))
    if device_type == "cuda" and world > torch.cuda.device_count():
        raise ConfigError(f"mesh: world size {world} needs {world} GPUs, but {torch.cuda.device_count()} are visible")
    return world


def derive_batch_size(t: TrainConfig, dims: ParallelDims) -> None:
    """train.global_batch_size, when set, decides the per-rank train.batch_size."""
    if t.global_batch_size is None:
        return
    if t.global_batch_size % dims.dp:
        raise ConfigError(
            f"train.global_batch_size={t.global_batch_size}: must be a multiple of the data-parallel size "
            f"{dims.dp} (mesh.dp_replicate={dims.dp_replicate} x mesh.dp_shard={dims.dp_shard})"
        )
    t.batch_size = t.global_batch_size // dims.dp


def check_run(run: RunConfig, dims: ParallelDims, device_type: str, model=None) -> None:
    """Every subsystem's refusals of a run on `dims`, in an order where the broader come first. `model`:
    run.model built on meta, where the caller holds one (mode=plan checks thousands of layouts of one model)."""
    t = run.train
    if t.batch_size % t.microbatches:
        raise ConfigError(f"train.microbatches={t.microbatches}: must divide train.batch_size={t.batch_size}")
    family = model_spec(run.model.name)
    model = model if model is not None else built_on_meta(run.model)  # parameters on meta: shapes and structure, no memory
    check_fsdp(run, dims, device_type, family)
    check_accum(run, dims)
    check_tp(run, dims, family)
    check_pipeline(run, dims, family, model)
    check_ac(run, family)
    check_checkpoint(run)
    check_freeze(run, model)
    check_module_calls(run, dims, device_type, family, model)
    check_float8(run, dims, device_type, model, family.tp_plan(run.model, run.mesh.sequence_parallel) if dims.tp_enabled else None)
    family.check(run.model, run, dims, model)
    check_reference_fits(run, dims, device_type, model)
    for spec in run.checks:
        parse_check(spec)
    check_probes(run, dims)
    check_fault(run, dims)
    check_launch(run, device_type)
    check_names(run, dims, model)
