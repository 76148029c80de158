"""The module breakdown probe (probes.memory.tracker=module): one step under torch's (FSDP)MemTracker
(fsdp_lab/probes/memory_breakdown.py), memory_breakdown.json/.md and a W&B table."""

from __future__ import annotations

import contextlib
from pathlib import Path

from fsdp_lab.config import ConfigError, RunConfig
from fsdp_lab.dist import DistContext
from fsdp_lab.mesh import ParallelDims
from fsdp_lab.probes.base import Probe, ProbeSetup, StepResult
from fsdp_lab.probes.memory_breakdown import ModuleBreakdown, table_rows, write_breakdown
from fsdp_lab.probes.memory_probe import PhaseMemoryProbe


class ModuleBreakdownProbe(Probe):
    metric_keys = ("memory/tracker_accuracy",)
    summary_keys = ("memory",)

    @staticmethod
    def enabled(run: RunConfig, dims: ParallelDims, ctx: DistContext) -> bool:
        return run.probes.memory.tracker == "module"

    @staticmethod
    def check(run: RunConfig, dims: ParallelDims) -> None:
        mem, steps = run.probes.memory, run.train.steps
        if mem.tracker == "module" and not 2 <= mem.tracker_step <= steps:
            raise ConfigError(f"probes.memory.tracker_step={mem.tracker_step}: must be in 2..train.steps={steps} (step 1 is the warm-up)")

    def attach(self, setup: ProbeSetup) -> None:
        self.step = self.run.probes.memory.tracker_step
        self.breakdown = ModuleBreakdown(setup.model, setup.optim.optimizer, setup.ctx.device, step=self.step, gather=True)
        self.phases = next((p for p in setup.probes if isinstance(p, PhaseMemoryProbe)), None)
        self.tracking = False

    @contextlib.contextmanager
    def around_step(self, step: int, batches):
        if step + 1 != self.step:
            yield
            return
        with self.breakdown.track(batches):
            if self.phases is not None:
                self.phases.lend(self.breakdown.tracker)
            self.tracking = True
            yield
        self.tracking = False

    def mark(self, phase: str) -> None:
        if self.tracking:
            self.breakdown.mark(phase)

    def after_step(self, result: StepResult) -> dict:
        if result.step != self.step:
            return {}
        return {"memory/tracker_accuracy": self.breakdown.report["tracker_accuracy"]}

    def summary(self) -> dict:
        report = self.breakdown.report
        return {"memory": {
            "tracker_peak_mib": report["peak_mib"], "tracker_peak_categories_mib": report["peak_categories_mib"],
            "tracker_accuracy": report["tracker_accuracy"],
        }}

    def publish(self, run_dir: Path, sink) -> None:
        write_breakdown(run_dir, self.breakdown.report)
        sink.table("tables/memory_breakdown", *table_rows(self.breakdown.report))
