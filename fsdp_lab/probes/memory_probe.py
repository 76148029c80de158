"""The per-phase memory probe (probes.memory.enabled): memory at each phase of every step
(fsdp_lab/probes/memory.py measures it), the run's peak, each phase's maximum."""

from __future__ import annotations

import contextlib
import logging

import torch
import torch.distributed as dist
from torch.distributed._tools.mem_tracker import MemTracker

from fsdp_lab.config import RunConfig
from fsdp_lab.dist import DistContext
from fsdp_lab.mesh import ParallelDims
from fsdp_lab.probes.base import Probe, ProbeSetup, StepResult
from fsdp_lab.probes.memory import PhaseMemory

log = logging.getLogger("fsdp_lab")


class PhaseMemoryProbe(Probe):
    overlaps_next_step = True  # host-side counts, kept per step at the step's end
    metric_keys = ("memory/<phase>_mib", "memory/peak_mib", "memory/<phase>_reserved_mib", "memory/reserved_peak_mib")
    summary_keys = ("memory",)

    @staticmethod
    def enabled(run: RunConfig, dims: ParallelDims, ctx: DistContext) -> bool:
        if not run.probes.memory.enabled:
            return False
        if dims.pp_enabled and ctx.device.type == "cpu":
            # MemTracker's multi-grad hooks fail on the leaf inputs that a stage's autograd.grad differentiates.
            if ctx.is_main:
                log.warning("probes.memory.enabled=true is ignored: on CPU the memory probe cannot follow a pipeline (mesh.pp=%d)", dims.pp)
            return False
        return True

    def attach(self, setup: ProbeSetup) -> None:
        self.phases = PhaseMemory(setup.ctx.device, setup.model, setup.optim.optimizer)
        self.lent: MemTracker | None = None
        self.metrics: dict[int, dict] = {}
        """Per 0-based step, until its row: with overlapping steps the next step is measured before it."""

    def lend(self, tracker: MemTracker) -> None:
        """A module tracker entered around the next step: on CPU it counts that step in place of
        this probe's own (two dispatch modes would see every tensor twice)."""
        self.lent = tracker

    @contextlib.contextmanager
    def around_step(self, step: int, batches):
        with self.phases.step(self.lent):
            yield
        self.lent = None
        # Read at the step's end: the parity reference's step that follows is not this step's memory.
        self.metrics[step] = self.phases.metrics()

    def mark(self, phase: str) -> None:
        self.phases.mark(phase)

    def after_step(self, result: StepResult) -> dict:
        return self.metrics.pop(result.step - 1)

    def summary(self) -> dict:
        section = self.phases.summary()
        if self.phases.on_gpu and dist.is_initialized():
            # Every rank's peak: pipeline stages (and uneven shards) differ, and no tracker reports them.
            mine = torch.tensor([section["peak_mib"]], dtype=torch.float64, device=self.phases.device)
            peaks = mine.new_empty(dist.get_world_size())
            dist.all_gather_into_tensor(peaks, mine)
            section["ranks_peak_mib"] = peaks.tolist()
        return {"memory": section}
