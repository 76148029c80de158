"""One training step of a configuration, traced for one rank without its hardware: a fake process group
of the configured world (collectives do nothing), the model under FakeTensorMode (no storage is
allocated), the same build and parallelize path as a real run, CUDA's kernels where the fake CPU
device's would save other tensors (cuda_kernels.py). A warm-up step creates the optimizer state;
the measured step runs under FSDPMemTracker, which counts what each tensor would occupy.

The optimizer is built for the fake CPU device (neither fused nor foreach), and its single-tensor
step is replaced by fused Adam's in-place update (cuda_kernels.py); an explicit `optim.foreach=true`
is traced as configured."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from fsdp_lab.accum import Accumulation
from fsdp_lab.config import RunConfig
from fsdp_lab.data import microbatches
from fsdp_lab.estimate.cuda_kernels import cuda_kernels
from fsdp_lab.estimate.fake_world import fake_world
from fsdp_lab.estimate.pipeline import pipelined_rank
from fsdp_lab.estimate.profiler_ranges import no_profiler_ranges
from fsdp_lab.estimate.shard_views import own_chunks
from fsdp_lab.mesh import ParallelDims
from fsdp_lab.models import build_plain, count_params
from fsdp_lab.optim import build_optimizer
from fsdp_lab.parallel import parallelize
from fsdp_lab.probes.memory import PhaseMemory
from fsdp_lab.probes.memory_breakdown import ModuleBreakdown, measured
from fsdp_lab.modules import unwrap
from fsdp_lab.step import train_step, unmeasured

MEASURED_STEP = 2


@dataclass
class StepTrace:
    rank: int
    params: int
    """The whole model's parameters."""
    breakdown: dict
    """The tracker's report of the measured step (ModuleBreakdown.report)."""
    phases_mib: dict[str, float]
    """Memory at each phase of the measured step."""


def trace_step(run: RunConfig, dims: ParallelDims, rank: int = 0,
               around_step: Callable[[], contextlib.AbstractContextManager] | None = None) -> StepTrace:
    """Rank `rank`'s memory over one optimizer step after warm-up. Rank 0 holds the largest shard
    where a dimension does not divide evenly, so its figure bounds every rank's; with pipeline
    stages each pp rank holds its own stage (estimate/pipeline.py), and `rank` picks which. `around_step()`
    gives a context the measured step runs in, inside the fake mode (mode=plan records the step's ops there)."""
    device = torch.device("cpu")
    with fake_world(dims.world_size, rank), cuda_kernels(), no_profiler_ranges(), own_chunks():
        mesh, dp_mesh = dims.build_meshes(device.type)  # real tensors: outside the fake mode
        with FakeTensorMode():
            model = build_plain(run.model)  # fake: the values do not matter, their sizes do
            params = count_params(model)
            dtype = next(p.dtype for p in model.parameters() if p.is_floating_point())
            dp_rank = dp_mesh.get_local_rank()

            def batches_of(step: int):
                return microbatches(
                    unwrap(model), seed=run.train.seed, batch_size=run.train.batch_size,
                    first_sample=(step * dims.dp + dp_rank) * run.train.batch_size,
                    seq_len=run.train.seq_len, n=run.train.microbatches, device=device, dtype=dtype,
                )

            held = ()  # tensors a step keeps beside its batches (a pipeline's receive buffers)
            if dims.pp_enabled:
                model, tracked, schedule = pipelined_rank(model, run, dims, mesh, dp_mesh, device, batches_of(0)[0][0])
            else:
                model = tracked = parallelize(model, dims, mesh, dp_mesh, run, device)
            optimizer = build_optimizer(model.parameters(), run.optim, device)
            phases = PhaseMemory(device, model, optimizer)
            breakdown = ModuleBreakdown(tracked, optimizer, device, step=MEASURED_STEP, gather=False)
            around = Accumulation(model, run.train.accum).microbatch if run.train.microbatches > 1 and not dims.pp_enabled else None
            for step in range(MEASURED_STEP):
                batches = batches_of(step)
                if step + 1 < MEASURED_STEP:
                    train_step(model, optimizer, batches, unmeasured, around)
                    continue
                if dims.pp_enabled:
                    held = schedule.buffers
                with measured(phases, breakdown, (batches, held)) as mark, around_step() if around_step else contextlib.nullcontext():
                    train_step(model, optimizer, batches, mark, around)
            phases.metrics()
    return StepTrace(rank=rank, params=params, breakdown=breakdown.report, phases_mib=phases.summary()["phases_mib"])
