"""The training loop: data -> step -> row -> sinks, with the probes (fsdp_lab/probes/) looking at
each step through the protocol of fsdp_lab/probes/base.py."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn

from fsdp_lab.accum import Accumulation
from fsdp_lab.config import TrainConfig
from fsdp_lab.data import DataPosition, microbatches
from fsdp_lab.fault import Faults
from fsdp_lab.optim import Optimization, Optimized
from fsdp_lab.probes.base import Probe, StepResult
from fsdp_lab.modules import unwrap
from fsdp_lab.step import IN_FLIGHT_AFTER, forward_backward, global_mean, loss_fn, mean_of, sum_over, train_step, unmeasured

log = logging.getLogger(__name__)


class Trainer(Optimized):
    def __init__(
        self, *, model: nn.Module, optim: Optimization, train: TrainConfig, probes: list[Probe], faults: Faults,
        dp_rank: int, dp_group, device: torch.device, on_step: Callable[[dict], None],
        accumulation: Accumulation | None = None, extras: list | None = None, reference=None, loss: Callable = loss_fn,
    ):
        self.model, self.optim = model, optim
        self.train, self.probes, self.faults = train, probes, faults
        self.dp_rank, self.dp_group, self.device = dp_rank, dp_group, device
        self.on_step = on_step
        self.accumulation = accumulation
        self.extras = extras or []
        """Steps after each optimizer step (fsdp_lab.standalone.StandaloneLayer)."""
        self.reference = reference
        """The parity reference, which checkpoints save and restore with the model (or None)."""
        self.loss = loss
        """loss(logits, targets) of a microbatch (fsdp_lab.step)."""
        self.last_loss: float | None = None
        self.data = DataPosition(global_batch=dist.get_world_size(dp_group) * train.batch_size)
        self.activity = "setup"
        self.input_dtype = next(p.dtype for p in model.parameters() if p.is_floating_point())

    def _around_microbatch(self, index: int, count: int) -> contextlib.ExitStack:
        stack = contextlib.ExitStack()
        # The probes' first, so they also see the all-gathers an explicit unshard issues.
        for probe in reversed(self.probes):
            stack.enter_context(probe.around_microbatch(index, count))
        if self.accumulation is not None:
            stack.enter_context(self.accumulation.microbatch(index, count))
        return stack

    @contextlib.contextmanager
    def _around_step(self, step: int, batches):
        """The probes' step contexts (the first probe's innermost); yields the phase marker."""
        with contextlib.ExitStack() as stack:
            for probe in reversed(self.probes):
                stack.enter_context(probe.around_step(step, batches))

            def mark(phase: str) -> None:
                self.activity = f"step {step + 1}: {IN_FLIGHT_AFTER[phase]}"
                for probe in reversed(self.probes):
                    probe.mark(phase)

            yield mark

    def _before_update(self, step: int) -> torch.Tensor:
        self.faults.corrupt_grads(self.model, step)
        return self.optim.clip()

    def _replay(self, step: int, batches) -> None:
        forward_backward(self.model, batches, unmeasured, self.accumulation.microbatch if self.accumulation else None, self.loss)
        self.faults.corrupt_grads(self.model, step)

    def _batches(self, step: int):
        cfg = self.train
        return microbatches(
            unwrap(self.model),
            seed=cfg.seed, first_sample=self.data.next_sample(step) + self.dp_rank * cfg.batch_size, batch_size=cfg.batch_size,
            seq_len=cfg.seq_len, n=cfg.microbatches, device=self.device, dtype=self.input_dtype,
        )

    def overlaps_steps(self) -> bool:
        """Whether a step may be issued before the previous one's loss is read (train.overlap_steps):
        not where something after a step must see it finished and the next not yet begun (a probe
        that reads the step, the standalone layer's extra steps, the parity reference, an injected
        fault)."""
        return (
            self.train.overlap_steps and not self.extras and self.reference is None
            and self.faults.cfg.kill_rank is None and all(p.overlaps_next_step for p in self.probes)
        )

    def _issue(self, step: int, overlapping: bool) -> _IssuedStep:
        """Step `step` up to its loss's all-reduce, queued on the device and not read: with
        overlapping steps the host goes on to the next step while the device runs this one."""
        batches = self._batches(step)
        lr = self.optim.lr
        t0 = time.perf_counter()
        with self._around_step(step, batches) as mark:
            local_loss, norm = train_step(
                self.model, self.optimizer, batches, mark, self._around_microbatch, functools.partial(self._before_update, step),
                self.loss,
            )
        if overlapping:  # the next step, issued before this one is finished, takes the next rate
            self.optim.scheduler.step()
        return _IssuedStep(step, batches, lr, t0, sum_over(local_loss, self.dp_group), norm, scheduled=overlapping)

    def _finish(self, issued: _IssuedStep, checkpointer, next_started: float | None = None) -> None:
        """Read the issued step's loss and norm (waiting for its kernels), then its row, the probes'
        work after it, the sinks and the checkpoint. Its step time runs from its start to its loss
        read, or where the next step was issued before it was read, to that step's start (one turn
        of the loop, which on a host running ahead is paced by the device)."""
        step, batches = issued.step, issued.batches
        loss = mean_of(issued.loss_sum, self.dp_group)
        row = {"step": step + 1, "loss": loss, "grad/norm": float(issued.norm), "lr": issued.lr}
        for extra in self.extras:
            self.activity = f"step {step + 1}: {extra.activity}"
            row[extra.key] = global_mean(extra.step(self.model, self.optimizer, batches), self.dp_group)
        result = StepResult(
            step=step + 1, batches=batches, loss=loss, step_time_s=(next_started or time.perf_counter()) - issued.started, row=row,
            replay=functools.partial(self._replay, step, batches),
        )
        for probe in self.probes:
            self.activity = f"step {step + 1}: {probe.activity}"
            row.update(probe.after_step(result))
        if not issued.scheduled:
            self.optim.scheduler.step()
        self.last_loss = loss
        self.on_step(row)
        if checkpointer is not None:
            checkpointer.after_step(step + 1)

    def run(self, start_step: int = 0, checkpointer=None) -> None:
        """Train from `start_step`; `checkpointer` (fsdp_lab.checkpoint.Checkpointer) saves after each step.
        With overlapping steps, step N's loss is read after step N+1 is issued, except before a
        checkpoint and at the end."""
        overlap = self.overlaps_steps()
        unread: _IssuedStep | None = None  # issued, its loss not read yet (while steps overlap)
        for step in range(start_step, self.train.steps):
            self.faults.at(step, "step")
            apart = not overlap or step + 1 == self.train.steps or (checkpointer is not None and checkpointer.due(step + 1))
            try:
                issued = self._issue(step, overlapping=not apart)
            except BaseException:
                if unread:  # its row is not lost with the step that failed
                    self._finish(unread, checkpointer)
                raise
            if unread:
                self._finish(unread, checkpointer, next_started=issued.started)
            unread = None if apart else issued
            if apart:
                self._finish(issued, checkpointer)
        if checkpointer is not None:
            checkpointer.finish()


@dataclasses.dataclass
class _IssuedStep:
    step: int
    batches: list
    lr: float
    started: float
    loss_sum: torch.Tensor
    """The ranks' losses summed, all-reduced in the stream's order (so no rank joins it out of turn), not read."""
    norm: torch.Tensor
    scheduled: bool
    """Whether the learning-rate schedule already moved on (an overlapped step's successor needs its rate)."""
