"""A probe that exists for tests/test_probes.py only: adding a probe is this module plus one line
in fsdp_lab/probes/registry.py's PROBES (the test adds that line with monkeypatch). It counts the
microbatches and phase marks of every step and refuses runs of more than 50 steps."""

from __future__ import annotations

import contextlib

from fsdp_lab.config import ConfigError, RunConfig
from fsdp_lab.probes.base import Probe, StepResult


class MicrobatchProbe(Probe):
    metric_keys = ("count/microbatches", "count/marks")
    summary_keys = ("count",)

    @staticmethod
    def enabled(run: RunConfig, dims, ctx) -> bool:
        return True

    @staticmethod
    def check(run: RunConfig, dims) -> None:
        if run.train.steps > 50:
            raise ConfigError(f"train.steps={run.train.steps} with the microbatch probe: allowed is <= 50")

    def attach(self, setup) -> None:
        self.steps = 0

    @contextlib.contextmanager
    def around_step(self, step: int, batches):
        self.microbatches, self.marks = 0, []
        yield
        self.steps += 1

    def mark(self, phase: str) -> None:
        self.marks.append(phase)

    @contextlib.contextmanager
    def around_microbatch(self, index: int, count: int):
        self.microbatches += 1
        yield

    def after_step(self, result: StepResult) -> dict:
        return {"count/microbatches": self.microbatches, "count/marks": len(self.marks)}

    def summary(self) -> dict:
        return {"count": {"steps": self.steps}}
