"""The collective-count probe (probes.comm.enabled): comm/<op>_count per step (fsdp_lab/probes/comm.py)."""

from __future__ import annotations

import contextlib

from fsdp_lab.config import RunConfig
from fsdp_lab.dist import DistContext
from fsdp_lab.mesh import ParallelDims
from fsdp_lab.probes.base import Probe, ProbeSetup, StepResult
from fsdp_lab.probes.comm import CommCounter


class CommProbe(Probe):
    metric_keys = ("comm/all_gather_count", "comm/reduce_scatter_count", "comm/all_reduce_count", "comm/<op>_count")

    @staticmethod
    def enabled(run: RunConfig, dims: ParallelDims, ctx: DistContext) -> bool:
        return run.probes.comm.enabled

    def attach(self, setup: ProbeSetup) -> None:
        self.counter = CommCounter()

    def around_step(self, step: int, batches):
        self.counter.begin_step()
        return contextlib.nullcontext()

    def around_microbatch(self, index: int, count: int):
        return self.counter.measure()

    def after_step(self, result: StepResult) -> dict:
        return self.counter.metrics()
