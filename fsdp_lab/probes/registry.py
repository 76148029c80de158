"""The probes a run can have, in the order they run: their rows come in this order, and their step
contexts nest with the first innermost (closest to the step). Adding a probe = one module holding a
fsdp_lab.probes.base.Probe subclass + one line here.

    parity      parity/loss_abs_diff, parity/grad_norm_abs_diff, parity/param_max_abs_diff,
                parity/standalone_loss_abs_diff; summary parity{...}; parity_report.json/.md
    memory      memory/<phase>_mib, memory/peak_mib (GPU: memory/<phase>_reserved_mib,
                memory/reserved_peak_mib); summary memory{peak_mib, phases_mib, phases_max_mib}
    breakdown   memory/tracker_accuracy; summary memory{tracker_peak_mib, ...};
                memory_breakdown.json/.md, W&B table tables/memory_breakdown
    comm        comm/<op>_count
    perf        perf/step_time_s, perf/tokens_per_s, perf/mfu, perf/iteration_time_s; summary perf{...}
    frozen      summary frozen{params, compared_numel, max_abs_change}
    profile     summary profile{first_step, steps, device, self_ms_per_step, top_ops}; profile/trace_rank<R>.json,
                profile/ops.md, W&B table tables/profile_ops (last: its window holds the other probes' work around and after each step)
"""

from __future__ import annotations

from fsdp_lab.config import RunConfig
from fsdp_lab.dist import DistContext
from fsdp_lab.mesh import ParallelDims
from fsdp_lab.probes.base import Probe
from fsdp_lab.probes.breakdown_probe import ModuleBreakdownProbe
from fsdp_lab.probes.comm_probe import CommProbe
from fsdp_lab.probes.frozen_probe import FrozenProbe
from fsdp_lab.probes.memory_probe import PhaseMemoryProbe
from fsdp_lab.probes.parity_probe import ParityProbe
from fsdp_lab.probes.perf_probe import ThroughputProbe
from fsdp_lab.probes.profile_probe import ProfileProbe

PROBES: tuple[type[Probe], ...] = (
    ParityProbe,
    PhaseMemoryProbe,
    ModuleBreakdownProbe,
    CommProbe,
    ThroughputProbe,
    FrozenProbe,
    ProfileProbe,
)


def check_probes(run: RunConfig, dims: ParallelDims) -> None:
    """Every probe's refusals, before any rank starts."""
    for cls in PROBES:
        cls.check(run, dims)


def build_probes(run: RunConfig, dims: ParallelDims, ctx: DistContext) -> list[Probe]:
    """The run's probes, in PROBES' order."""
    return [cls(run, dims, ctx) for cls in PROBES if cls.enabled(run, dims, ctx)]
