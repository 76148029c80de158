"""A "fits" that holds. A candidate shown as fitting has mode=estimate's peak at its own config (the
closed form of memory.py only prunes), and the device must hold that peak plus what the caching
allocator adds over its live tensors (fragmentation, cached blocks, cuBLAS workspaces:
plan.memory_margin) plus what lies outside the allocator (the CUDA context, NCCL's buffers:
estimate.reserved_mib).

The estimate traces the candidate at two depths (per pipeline stage: 1 and 2 blocks; without stages
2 or 3, and TRACED_DEPTH blocks: traced_depths) and reads its peak, and each phase's memory, at the
model's depth on their line: a full-depth trace of a 70B model takes minutes, and what a step holds
grows by the same each block (a phase's mark bounds a peak that a steeper phase takes over further
down). Checkpointed blocks one to a unit start from 3 blocks: a 2-block model's peak lies below the
line of deeper ones (the 0.95B Llama with full AC on 4 ranks: 277 MiB from 2 to 3 blocks, 196 from
each block on), and the line through 2 and 4 put the full model 7.8% over its allocator's peak on
4×H100 (through 3 and 4: on the full-depth trace). Without AC the line holds from 2 blocks (the same
model: 668 MiB each block from 2). Without pipeline stages it traces at most 2 microbatches of the
candidate's size: from the second on, each holds what the one before held (the accumulated gradients,
the same activations), the last adding its reduction, so 2 hold the peak of any number, at a fraction
of the trace (an 8B plan's best rows run 8). For the same reason the bf16 loss runs its first 2 row
slices (fsdp_lab/cross_entropy.py slices_kept): a 70B microbatch of 4 samples has 126."""

from __future__ import annotations

import dataclasses

from fsdp_lab.config import ConfigError, RunConfig
from fsdp_lab.mesh import ParallelDims
from fsdp_lab.plan.cost import TRACED_DEPTH, Layout
from fsdp_lab.plan.memory import at_depth


def needed_mib(peak_mib: float, run: RunConfig) -> float:
    """Device memory a run of this peak needs: the peak, the allocator's margin over it, what lies outside."""
    return peak_mib * (1 + run.plan.memory_margin) + run.estimate.reserved_mib


def fits(peak_mib: float, run: RunConfig, memory_bytes: float) -> bool:
    return needed_mib(peak_mib, run) * 2**20 <= memory_bytes


def rule(run: RunConfig, memory_bytes: float) -> str:
    """The rule, as the plan prints it."""
    return (f"fits = estimate's peak x (1 + plan.memory_margin={run.plan.memory_margin:.2f}) + estimate.reserved_mib="
            f"{run.estimate.reserved_mib:.0f} MiB <= {memory_bytes / 2**30:.1f} GiB")


def estimate_run(run: RunConfig, layout: Layout) -> RunConfig:
    """The layout's own run as mode=estimate takes it (compiled blocks hold what eager ones do)."""
    from fsdp_lab.plan.search import run_for

    traced = run_for(run, layout)
    return dataclasses.replace(traced, mode="estimate", model=dataclasses.replace(traced.model, compile=False))


def traced_as(layout: Layout) -> Layout:
    """The layout whose estimate stands for this one's: at most 2 microbatches of its size (module
    docstring: why the peak is the same); pipeline schedules keep theirs (their count shapes the schedule)."""
    if layout.pp > 1 or layout.microbatches <= 2:
        return layout
    return dataclasses.replace(layout, microbatches=2)


def estimated_as(layout: Layout) -> Layout:
    """The layout whose mode=estimate peak stands for this one's. A rank holds what its shard group, tp
    and pipeline stage give it: the replicas around it (HSDP's all-reduce works in the reduce-scatter's
    output) and compiling (traced eager) leave it as it is, so layouts that differ only there, or in
    microbatches beyond the 2 traced, share one estimate, taken on the smallest world."""
    return dataclasses.replace(traced_as(layout), dp_replicate=1, compile=False)


def at_most_two_microbatches(run: RunConfig, layout: Layout) -> RunConfig:
    """The estimate's run with the microbatches of traced_as(layout)."""
    if traced_as(layout) == layout:
        return run
    return dataclasses.replace(run, train=dataclasses.replace(
        run.train, microbatches=2, batch_size=2 * layout.microbatch_size, global_batch_size=None))


def estimable(run: RunConfig, layout: Layout) -> bool:
    """Whether mode=estimate takes the layout's run: its own refusals decide."""
    from fsdp_lab.estimate.refusals import check_estimable

    try:
        check_estimable(estimate_run(run, layout))
    except ConfigError:
        return False
    return True


def traced_depths(layers: int, layout: Layout) -> tuple[int, int]:
    """The two depths (blocks of the whole model) a candidate is estimated at: from 3 blocks where they
    are checkpointed one to a unit (module docstring); from 2, a cheaper trace, where the line holds from
    there, and where units group 2 blocks (3 would leave a unit of one: a 70B plan's grouped rows came
    out up to 92% over their line through whole units)."""
    if layout.pp > 1:
        return (layout.pp, 2 * layout.pp) if layers > 2 * layout.pp else (layers, layers)
    shallow = 3 if layout.ac != "none" and layout.wrap_group == 1 else 2
    return (shallow, TRACED_DEPTH) if layers > TRACED_DEPTH else (layers, layers)


def estimated_peak_mib(run: RunConfig, layout: Layout, layers: int | None = None) -> float:
    """mode=estimate's peak for the layout's own run (with pipeline stages, the largest pp rank's) at
    the model's depth (`layers` blocks; None: counted on the model): what a candidate shown as fitting
    is judged by, and benchmarks/plan_accuracy.py checks against measured peaks."""
    from fsdp_lab.cross_entropy import slices_kept
    from fsdp_lab.estimate import estimate
    from fsdp_lab.models.depth import blocks_kept
    from fsdp_lab.plan.trace import model_facts, quiet

    layers = layers or model_facts(run).layers
    dims = ParallelDims.from_mesh(layout, layout.world)
    depths = traced_depths(layers, layout)
    results = []
    for depth in dict.fromkeys(depths):
        with quiet(), blocks_kept(depth), slices_kept(2):
            results.append(estimate(at_most_two_microbatches(estimate_run(run, layout), layout), dims))
    shallow, deep = results[0], results[-1]
    figures = [at_depth(shallow["peak_mib"], deep["peak_mib"], depths, layers)]
    figures += [at_depth(shallow["phases_mib"][k], deep["phases_mib"][k], depths, layers) + run.estimate.workspace_mib
                for k in deep["phases_mib"] if shallow["phases_mib"].get(k) is not None and deep["phases_mib"][k] is not None]
    return max(figures)
