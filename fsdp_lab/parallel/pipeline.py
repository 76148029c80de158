"""Pipeline parallelism with torch.distributed.pipelining.

The model's layers are split into `pp x stages_per_rank` consecutive stages; each pp rank keeps
only its own (the first stage also holds the embeddings, the last the final norm, the output and
the loss) and parallelizes each like a whole model (TP, FSDP2 over dp). A schedule (gpipe, 1f1b,
interleaved_1f1b) runs `train.microbatches` microbatches through them. Interleaved ranks hold
stages r, r + pp, r + 2pp, ... ("loop" placement), so activations go round the ranks several times.

Stage modules keep the full model's parameter names (`layers.5.attention.wq.weight`), so the parity
probe compares them with the unsplit reference directly."""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

from fsdp_lab.config import ConfigError, MeshConfig, RunConfig
from fsdp_lab.mesh import ParallelDims
from fsdp_lab.models import families_with
from fsdp_lab.models.spec import ModelSpec

log = logging.getLogger(__name__)

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B, "interleaved_1f1b": ScheduleInterleaved1F1B}
MULTI_STAGE_SCHEDULES = ("interleaved_1f1b",)


def stages_per_rank(mesh: MeshConfig) -> int:
    if mesh.pp_stages_per_rank is not None:
        return mesh.pp_stages_per_rank
    return 2 if mesh.pp_schedule in MULTI_STAGE_SCHEDULES else 1


def rank_stage_ids(mesh: MeshConfig, pp: int, pp_rank: int) -> list[int]:
    """The stages pp rank `pp_rank` holds: r, r + pp, r + 2pp, ... ("loop" placement)."""
    return [pp_rank + k * pp for k in range(stages_per_rank(mesh))]


def stage_module(model: nn.Module, stage_cls: type, stage_ids: list[int], n_stages: int, whole: nn.Module, seq_len: int) -> nn.Module:
    """The layers of `stage_ids` (of `n_stages` equal stages) as one `stage_cls` module, under the full model's names."""
    per_stage = len(model.blocks) // n_stages
    layer_ids = [i for s in stage_ids for i in range(s * per_stage, (s + 1) * per_stage)]
    return stage_cls(model, layer_ids, whole, first=0 in stage_ids, last=n_stages - 1 in stage_ids, seq_len=seq_len)


class PipelinedModel(nn.Module):
    """This pp rank's share of the model and the schedule that runs it.

    `module` holds every layer of this rank's stages under the full model's names (for the
    optimizer, checkpoints and parity, as DDP's `module` does); the stages are views of it."""

    def __init__(self, module: nn.Module, schedule, *, pp_group, has_first: bool, has_last: bool):
        super().__init__()
        self.module = module
        self.schedule = schedule
        self.pp_group, self.has_first, self.has_last = pp_group, has_first, has_last

    def forward_backward(self, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """Forward and backward of every microbatch through the schedule; returns this data-parallel
        rank's mean loss on every pp rank (the last stage computes it, the others receive it).

        The schedule divides the accumulated gradients by the number of microbatches, so they equal
        one pass over the whole batch, as in the unpipelined step."""
        inputs = torch.cat([x for x, _ in batches])
        targets = torch.cat([y for _, y in batches])
        losses: list[torch.Tensor] = []
        args = (inputs,) if self.has_first else ()
        self.schedule.step(*args, target=targets if self.has_last else None, losses=losses, return_outputs=False)
        if self.has_last:
            loss = torch.stack([l.detach().float() for l in losses]).mean()
        else:
            loss = torch.zeros((), device=inputs.device)
        dist.all_reduce(loss, group=self.pp_group)  # a sum with one non-zero term: a broadcast from the last stage
        return loss

    def forward(self, *args):
        raise RuntimeError("a pipelined model runs through its schedule: call forward_backward(batches)")


def build_pipeline(
    model: nn.Module, *, stage_cls: type, mesh_cfg: MeshConfig, pp_mesh, n_microbatches: int, seq_len: int,
    device: torch.device, loss_fn: Callable, parallelize_stage: Callable[[nn.Module], nn.Module],
    schedule_cls: Callable | None = None,
) -> PipelinedModel:
    """Split `model` (parameters still on meta) into this pp rank's stages of `stage_cls` (its
    ModelSpec's pipeline_stage), parallelize each, and schedule them (`schedule_cls`: in place of
    mesh.pp_schedule's, called as a single-stage schedule is; mode=estimate's simulation)."""
    pp, pp_rank = pp_mesh.size(), pp_mesh.get_local_rank()
    per_rank = stages_per_rank(mesh_cfg)
    n_stages = pp * per_rank
    per_stage = len(model.blocks) // n_stages
    whole = copy.deepcopy(model)  # weightless: what the stages ask of the whole model

    def make(stage_ids: list[int]) -> nn.Module:
        return stage_module(model, stage_cls, stage_ids, n_stages, whole, seq_len)

    stage_ids = rank_stage_ids(mesh_cfg, pp, pp_rank)
    local = make(stage_ids)  # all of this rank's layers in one module; the stages below share them
    group = pp_mesh.get_group()
    stages = [
        PipelineStage(parallelize_stage(make([s])), s, n_stages, device, group=group) for s in stage_ids
    ]
    schedule_cls = schedule_cls or SCHEDULES[mesh_cfg.pp_schedule]
    if mesh_cfg.pp_schedule in MULTI_STAGE_SCHEDULES:
        schedule = schedule_cls(stages, n_microbatches=n_microbatches, loss_fn=loss_fn)
    else:
        schedule = schedule_cls(stages[0], n_microbatches=n_microbatches, loss_fn=loss_fn)
    log.info(
        "pp: %s, %d stages x %d layers, this rank's stages %s, %d microbatches",
        mesh_cfg.pp_schedule, n_stages, per_stage, stage_ids, n_microbatches,
    )
    return PipelinedModel(local, schedule, pp_group=group, has_first=0 in stage_ids, has_last=n_stages - 1 in stage_ids)


def check_pipeline(run: RunConfig, dims: ParallelDims, spec: ModelSpec, built) -> None:
    pp, model, m, n_mb = dims.pp, run.model, run.mesh, run.train.microbatches
    if not dims.pp_enabled:
        return
    if m.engine != "fsdp2":
        raise ConfigError(f"mesh.engine={m.engine} with mesh.pp={pp}: pipeline parallelism composes with mesh.engine=fsdp2 only")
    if spec.pipeline_stage is None:
        raise ConfigError(f"mesh.pp={pp}: model.name={model.name} cannot be split into stages; allowed: {families_with('pipeline_stage')}")
    if spec.tied(model):
        raise ConfigError(f"{spec.tied_key}=true with mesh.pp={pp}: the first and last stages would share a weight; allowed: model.tie_embeddings=false")
    if run.probes.comm.enabled:
        raise ConfigError(
            f"probes.comm.enabled=true with mesh.pp={pp}: CommDebugMode's autograd hooks cannot follow a pipeline "
            "schedule; allowed: probes.comm.enabled=false"
        )
    a = run.train.accum
    if (a.sync, a.reshard_after_backward, a.explicit_unshard) != ("every", True, False):
        raise ConfigError(
            f"train.accum.sync={a.sync}, reshard_after_backward={str(a.reshard_after_backward).lower()}, "
            f"explicit_unshard={str(a.explicit_unshard).lower()} with mesh.pp={pp}: the pipeline schedule sets "
            "gradient sync and resharding itself (it reduces after the last microbatch); allowed: the defaults"
        )
    per_rank = stages_per_rank(m)
    multi = m.pp_schedule in MULTI_STAGE_SCHEDULES
    if multi and per_rank < 2:
        raise ConfigError(f"mesh.pp_stages_per_rank={per_rank}: mesh.pp_schedule={m.pp_schedule} needs >= 2 stages per rank")
    if not multi and per_rank != 1:
        raise ConfigError(
            f"mesh.pp_stages_per_rank={per_rank}: mesh.pp_schedule={m.pp_schedule} runs one stage per rank; "
            "allowed: 1, null, or mesh.pp_schedule=interleaved_1f1b"
        )
    if len(built.blocks) % (pp * per_rank):
        raise ConfigError(
            f"model.n_layers={len(built.blocks)}: must be a multiple of the pipeline stages, "
            f"mesh.pp={pp} x {per_rank} stages per rank (mesh.pp_stages_per_rank) = {pp * per_rank}"
        )
    if m.pp_schedule == "1f1b" and n_mb < pp:
        raise ConfigError(f"train.microbatches={n_mb}: mesh.pp_schedule=1f1b needs >= mesh.pp={pp} microbatches")
    rounds = max(1, n_mb // pp)
    if multi and n_mb % rounds:
        raise ConfigError(
            f"train.microbatches={n_mb}: mesh.pp_schedule={m.pp_schedule} needs a multiple of its rounds, "
            f"max(1, {n_mb} // mesh.pp={pp}) = {rounds}"
        )
