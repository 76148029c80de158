"""The throughput probe (probes.perf.enabled): step time, tokens/s, MFU on GPUs with a known peak, the
iteration time and the host's time to issue the step (fsdp_lab/probes/perf.py)."""

from __future__ import annotations

import contextlib
import time

from fsdp_lab.config import RunConfig
from fsdp_lab.dist import DistContext
from fsdp_lab.mesh import ParallelDims
from fsdp_lab.probes.base import Probe, ProbeSetup, StepResult
from fsdp_lab.probes.perf import Throughput


class ThroughputProbe(Probe):
    overlaps_next_step = True  # times only: the host's in its step context, the step's from the trainer
    metric_keys = ("perf/step_time_s", "perf/tokens_per_s", "perf/mfu", "perf/iteration_time_s")
    summary_keys = ("perf",)

    @staticmethod
    def enabled(run: RunConfig, dims: ParallelDims, ctx: DistContext) -> bool:
        return run.probes.perf.enabled

    def attach(self, setup: ProbeSetup) -> None:
        run = setup.run
        self.throughput = Throughput(
            tokens_per_step=setup.dims.dp * run.train.batch_size * setup.tokens_per_sample,
            world_size=setup.dims.world_size, flops_per_token=setup.flops_per_token,
            device=setup.ctx.device, warmup_steps=run.probes.perf.warmup_steps,
        )

    @contextlib.contextmanager
    def around_step(self, step: int, batches):
        self._step_start = time.perf_counter()
        yield

    def mark(self, phase: str) -> None:
        if phase == "done":  # the step's last mark: zero_grad issued, the loss's sync still ahead
            self.throughput.host_times.append(time.perf_counter() - self._step_start)

    def after_step(self, result: StepResult) -> dict:
        return self.throughput.metrics(result.step_time_s)

    def summary(self) -> dict:
        return {"perf": self.throughput.summary()}
