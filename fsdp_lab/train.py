"""The training loop: data -> step -> row -> sinks, with the probes (fsdp_lab/probes/) looking at
each step through the protocol of fsdp_lab/probes/base.py."""

from __future__ import annotations

import contextlib
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
from fsdp_lab.probes.parity import unwrap
from fsdp_lab.step import IN_FLIGHT_AFTER, forward_backward, global_mean, loss_fn, train_step, unmeasured

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

    def run(self, start_step: int = 0, checkpointer=None) -> None:
        """Train from `start_step`; `checkpointer` (fsdp_lab.checkpoint.Checkpointer) saves after each step."""
        for step in range(start_step, self.train.steps):
            self.faults.at(step, "step")
            batches = self._batches(step)
            lr = self.optim.lr
            t0 = time.perf_counter()
            with self._around_step(step, batches) as mark:
                local_loss, norm = train_step(
                    self.model, self.optimizer, batches, mark, self._around_microbatch, functools.partial(self._before_update, step),
                    self.loss,
                )
            loss = global_mean(local_loss, self.dp_group)  # .item() inside: the step's kernels are done
            row = {"step": step + 1, "loss": loss, "grad/norm": float(norm), "lr": lr}
            for extra in self.extras:
                self.activity = f"step {step + 1}: {extra.activity}"
                row[extra.key] = global_mean(extra.step(self.model, self.optimizer, batches), self.dp_group)
            result = StepResult(
                step=step + 1, batches=batches, loss=loss, step_time_s=time.perf_counter() - t0, row=row,
                replay=functools.partial(self._replay, step, batches),
            )
            for probe in self.probes:
                self.activity = f"step {step + 1}: {probe.activity}"
                row.update(probe.after_step(result))
            self.optim.scheduler.step()
            self.last_loss = loss
            self.on_step(row)
            if checkpointer is not None:
                checkpointer.after_step(step + 1)
        if checkpointer is not None:
            checkpointer.finish()
