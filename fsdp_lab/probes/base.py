"""The probe protocol. A probe is one module of fsdp_lab/probes/ holding one Probe subclass; it owns
its config slice (`enabled(run, dims, ctx)`), its refusals before any rank starts (`check`), its metric keys,
its work around each step and microbatch, its metric row after each step and its section of
summary.json. `fsdp_lab.probes.registry` lists them in a fixed order and builds them.

A step, seen by the probes (in build order: the first probe's contexts are entered last, so they sit
closest to the step, and its row comes first):

    before_sharding(model)           once, on the model as built (a copy, initial values)
    attach(setup)                    once, on the parallelized model and its optimizer
    with around_step(step, batches):     for each step
        mark(phase)                  at each phase of the step (fsdp_lab.step.IN_FLIGHT_AFTER)
        with around_microbatch(i, n):    around each microbatch's forward + backward
    after_step(result) -> row        metric keys and values; may run more work (the parity reference);
                                     with train.overlap_steps, after the next step is issued, where
                                     every probe of the run says it may (overlaps_next_step)
    summary() -> {section: value}    at the end, merged into summary.json (fsdp_lab/summary.py)
    publish(run_dir, sink)           at the end, on rank 0: files of its own, W&B tables
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from torch import nn

from fsdp_lab.config import RunConfig
from fsdp_lab.dist import DistContext
from fsdp_lab.mesh import ParallelDims
from fsdp_lab.optim import Optimization


@dataclass
class ProbeSetup:
    """What a probe may look at once the model is parallelized."""

    run: RunConfig
    dims: ParallelDims
    ctx: DistContext
    model: nn.Module
    optim: Optimization
    dp_mesh: object
    dp_group: object
    tokens_per_sample: int
    flops_per_token: float
    extras: list = field(default_factory=list)
    """Steps training runs after each optimizer step (fsdp_lab.standalone): `key`, `step(model, optimizer, batches)`."""
    run_dir: Path | None = None
    """Where rank 0 writes a probe's own files as soon as it has them (None: nowhere)."""
    probes: list[Probe] = field(default_factory=list)
    """Every probe, in build order (one probe may lend another what it measures)."""


@dataclass
class StepResult:
    """One finished training step, as the trainer hands it to the probes."""

    step: int
    """1-based."""
    batches: list
    loss: float
    step_time_s: float
    """From the step's start to its loss on every rank, extra steps included; the probes' work after it is not.
    Where steps overlap (train.overlap_steps), from its start to the next step's start."""
    row: dict
    """The row so far (the trainer's keys and earlier probes' keys)."""
    replay: Callable[[], None]
    """Run the step's forward and backward again on the model as it is now (same microbatch
    contexts, same injected faults), leaving its gradients; no optimizer step."""


class Probe:
    activity: ClassVar[str] = "the probes' work after the step"
    """What its after_step does, named if a collective times out there."""
    metric_keys: ClassVar[tuple[str, ...]] = ()
    """The metric keys it writes (`<...>` stands for a family: memory/<phase>_mib)."""
    summary_keys: ClassVar[tuple[str, ...]] = ()
    """The summary.json sections it fills (fsdp_lab/summary.py lists each one's keys)."""
    overlaps_next_step: ClassVar[bool] = False
    """True where its after_step reads only what its step contexts kept of that step, so that it may
    run after the next step is issued (train.overlap_steps); a probe that looks at the model, the
    gradients or the device after a step keeps every step finished before the next."""
    reference = None
    """A model it trains beside the run's, which checkpoints save and restore with it (parity's)."""

    @staticmethod
    def enabled(run: RunConfig, dims: ParallelDims, ctx: DistContext) -> bool:
        """Whether this run has it (its config slice; a probe that cannot follow the run says why)."""
        raise NotImplementedError

    @staticmethod
    def check(run: RunConfig, dims: ParallelDims) -> None:
        """Raise ConfigError for settings this probe refuses (before any rank starts)."""

    def __init__(self, run: RunConfig, dims: ParallelDims, ctx: DistContext):
        self.run, self.dims, self.ctx = run, dims, ctx

    def before_sharding(self, model: nn.Module) -> None:
        pass

    def attach(self, setup: ProbeSetup) -> None:
        pass

    def around_step(self, step: int, batches) -> contextlib.AbstractContextManager:
        """`step` is 0-based."""
        return contextlib.nullcontext()

    def mark(self, phase: str) -> None:
        pass

    def around_microbatch(self, index: int, count: int) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def after_step(self, result: StepResult) -> dict:
        return {}

    def summary(self) -> dict:
        return {}

    def publish(self, run_dir: Path, sink) -> None:
        """Rank 0, at the end: `sink.table(name, columns, rows)` logs a table to W&B if it is on."""
