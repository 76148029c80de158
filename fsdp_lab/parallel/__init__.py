"""The orchestrator: parallelize a model in a fixed order — float8 conversion, TP, activation checkpointing, compile,
then data parallelism (FSDP2, FSDP1 or DDP), then (ac.impl=outer_wrapper) AC around the engine's
units — each step guarded by the mesh or config and logging one line."""

from __future__ import annotations

import logging

import torch
from torch import nn

from fsdp_lab.config import RunConfig
from fsdp_lab.mesh import ParallelDims
from fsdp_lab.models import model_spec
from fsdp_lab.parallel.ac import apply_ac
from fsdp_lab.parallel.ddp import apply_ddp
from fsdp_lab.parallel.float8 import apply_float8, enabled as float8_enabled, float8_plan
from fsdp_lab.parallel.fsdp1 import apply_fsdp1
from fsdp_lab.parallel.fsdp2 import apply_fsdp2
from fsdp_lab.parallel.tp import apply_tp
from fsdp_lab.parallel.wrap import grouped, wrap_units

log = logging.getLogger(__name__)


def parallelize(model: nn.Module, dims: ParallelDims, mesh, dp_mesh, run: RunConfig, device: torch.device) -> nn.Module:
    """A whole model, or one pipeline stage of it (parallel/pipeline.py calls this per stage)."""
    if float8_enabled(run.float8):
        apply_float8(model, run.float8, device)
    if dims.tp_enabled:
        plan = model_spec(run.model.name).tp_plan(run.model, run.mesh.sequence_parallel)
        styles = (lambda module, p: float8_plan(module, p, run.float8)) if float8_enabled(run.float8) else None
        apply_tp(model, mesh["tp"], plan, name=run.model.name, sequence_parallel=run.mesh.sequence_parallel, styles=styles)
    apply_ac(model, run.ac)
    if run.model.compile:
        for block in model.blocks:
            block.compile()
        log.info("compile: %d blocks", len(model.blocks))
    if run.mesh.engine == "ddp":
        return apply_ddp(model, dp_mesh, device, run.model)
    units = wrap_units(model, run.wrap)
    if run.mesh.engine == "fsdp1":
        model = apply_fsdp1(model, mesh[dims.fsdp_dim_names], units, run.fsdp, device)
    else:
        model = apply_fsdp2(model, mesh[dims.fsdp_dim_names], grouped(units, run.wrap.group), run.fsdp)
    apply_ac(model, run.ac, after_engine=True)  # ac.impl=outer_wrapper: checkpoint(FSDP(block))
    return model
