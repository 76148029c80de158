"""Tensor parallelism: the model's declarative plan (its ModelSpec's tp_plan: module path ->
ParallelStyle), applied with `parallelize_module` over the tp mesh before FSDP shards the result over
dp (2D, as torchtitan does).

A plan is two dicts: one for the root's own modules (embeddings, final norm, output), one applied to
every block. Pipeline stages reuse the same plans: root entries whose module a stage lacks are skipped."""

from __future__ import annotations

import logging

from collections.abc import Callable

from torch import nn
from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel, parallelize_module

from fsdp_lab.config import ConfigError, RunConfig
from fsdp_lab.mesh import ParallelDims
from fsdp_lab.models import families_with
from fsdp_lab.models.spec import ModelSpec, TPPlan
from fsdp_lab.models.tp_styles import ReplicatedInput

log = logging.getLogger(__name__)

Plan = dict[str, object]


def apply_tp(model: nn.Module, tp_mesh, plan: TPPlan, *, name: str, sequence_parallel: bool,
             styles: Callable[[nn.Module, Plan], Plan] | None = None) -> None:
    """Apply `plan` (the model family `name`'s) to `model`'s root modules and to every block;
    `styles(module, plan)`, given, adapts the plan to the module it is applied to (float8's styles)."""
    adapt = styles or (lambda module, p: p)
    root_plan, block_plan = plan
    children = dict(model.named_children())
    root_plan = {path: style for path, style in root_plan.items() if path in children}
    if root_plan:
        parallelize_module(model, tp_mesh, adapt(model, root_plan))
    for block in model.blocks:
        parallelize_module(block, tp_mesh, adapt(block, block_plan))
    log.info("tp: %s plan over %d ranks, %d blocks, sequence_parallel=%s", name, tp_mesh.size(), len(model.blocks), sequence_parallel)


def block_all_reduces(block_plan: Plan) -> tuple[int, int]:
    """(forward, backward) all-reduces a block issues under `block_plan`, as the plan's step time prices
    them (with sequence parallelism each is a reduce-scatter and an all-gather, the same bytes): one per
    row-wise layer's output in forward; in backward one per module whose input enters replicated
    (PrepareModuleInput, ReplicatedInput: its column-wise layers' gradients summed first), and one per
    column-wise layer outside such a module, which reduces its own."""
    entering = [path for path, style in block_plan.items() if isinstance(style, (PrepareModuleInput, ReplicatedInput))]
    # Each column-wise layer's gradient leaves through the module it enters replicated under, else alone.
    reducing = {next((p for p in entering if path.startswith(p + ".")), path)
                for path, style in block_plan.items() if isinstance(style, ColwiseParallel)}
    forward = sum(isinstance(style, RowwiseParallel) for style in block_plan.values())
    return forward, len(reducing)


def check_tp(run: RunConfig, dims: ParallelDims, spec: ModelSpec) -> None:
    tp, model = dims.tp, run.model
    if not dims.tp_enabled:
        return
    if run.mesh.engine != "fsdp2":
        raise ConfigError(f"mesh.engine={run.mesh.engine} with mesh.tp={tp}: tensor parallelism composes with mesh.engine=fsdp2 only")
    if spec.tp_plan is None:
        raise ConfigError(f"mesh.tp={tp}: model.name={model.name} has no tensor-parallel plan; allowed: {families_with('tp_plan')}")
    if spec.tied(model):
        raise ConfigError(
            f"{spec.tied_key}=true with mesh.tp={tp}: the embedding and the output would each distribute the "
            f"shared weight, untying it; allowed: {spec.tied_key}=false"
        )
    if run.mesh.sequence_parallel:
        if not spec.sequence_parallel:
            raise ConfigError(f"mesh.sequence_parallel=true: model.name={model.name} has no sequence-parallel plan; allowed with model.name={families_with('sequence_parallel')}")
        if run.train.seq_len % tp:
            raise ConfigError(f"mesh.tp={tp} with mesh.sequence_parallel=true: must divide train.seq_len={run.train.seq_len}")
