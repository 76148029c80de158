"""The profiler probe (probes.profile.enabled): steps first_step .. first_step+steps-1, each with
the probes' work after it (the parity reference's step, ...), under torch.profiler
(fsdp_lab/probes/profile.py); every rank's trace in profile/, rank 0's op table in profile/ops.md and
as the W&B table tables/profile_ops, and the summary's profile section. The files are written when the
window closes, so a run that fails later keeps them. A run resumed inside the window profiles the
window's steps it runs; one resumed past it profiles none (its summary says 0 steps)."""

from __future__ import annotations

import contextlib
from pathlib import Path

from torch.profiler import record_function

from fsdp_lab.config import ConfigError, RunConfig
from fsdp_lab.dist import DistContext
from fsdp_lab.mesh import ParallelDims
from fsdp_lab.probes.base import Probe, ProbeSetup, StepResult
from fsdp_lab.probes.profile import TOP_OPS, ProfileWindow, write_ops_table

PROFILE_DIR = "profile"
OPS_TABLE = "tables/profile_ops"
OPS_COLUMNS = ("name", "self_ms_per_step", "total_ms_per_step", "calls_per_step")


class ProfileProbe(Probe):
    summary_keys = ("profile",)

    @staticmethod
    def enabled(run: RunConfig, dims: ParallelDims, ctx: DistContext) -> bool:
        return run.probes.profile.enabled

    @staticmethod
    def check(run: RunConfig, dims: ParallelDims) -> None:
        cfg, steps = run.probes.profile, run.train.steps
        last = cfg.first_step + cfg.steps - 1
        if cfg.enabled and last > steps:
            raise ConfigError(f"probes.profile.first_step={cfg.first_step}: the window of probes.profile.steps={cfg.steps} "
                              f"ends at step {last}, past train.steps={steps}")

    def attach(self, setup: ProbeSetup) -> None:
        cfg = self.run.probes.profile
        self.first, self.last = cfg.first_step, cfg.first_step + cfg.steps - 1
        self.window = ProfileWindow(setup.ctx.device)
        self.begun_at: int | None = None
        self.out_dir = setup.run_dir / PROFILE_DIR if setup.run_dir is not None else None

    @contextlib.contextmanager
    def around_step(self, step: int, batches):
        if not self.first <= step + 1 <= self.last:
            yield
            return
        if self.begun_at is None:  # the window's first step, or the first this (resumed) run trains
            self.begun_at = step + 1
            self.window.begin()
        with record_function(f"step {step + 1}"):  # the step's span in the trace
            yield

    def after_step(self, result: StepResult) -> dict:
        # Last in probe order: the window holds each step's whole turn, the other probes' work after it too.
        if result.step == self.last and self.begun_at is not None:
            self.window.end(self.out_dir, self.ctx.rank, self._profiled_steps())
            if self.ctx.is_main and self.out_dir is not None:
                write_ops_table(self.out_dir / "ops.md", self.window.ops,
                                f"Rank 0, steps {self.begun_at}-{self.last}, self time on {self.ctx.device.type}")
        return {}

    def _profiled_steps(self) -> int:
        return 0 if self.begun_at is None else self.last - self.begun_at + 1

    def summary(self) -> dict:
        return {"profile": {"first_step": self.begun_at or self.first, "steps": self._profiled_steps(),
                            "device": self.ctx.device.type, **self.window.figures()}}

    def publish(self, run_dir: Path, sink) -> None:
        sink.table(OPS_TABLE, list(OPS_COLUMNS), [[op[c] for c in OPS_COLUMNS] for op in self.window.ops[:TOP_OPS]])
