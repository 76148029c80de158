"""The training loop: microbatches, optimizer, and the points where probes look."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from fsdp_lab.accum import Accumulation
from fsdp_lab.config import FaultConfig, TrainConfig
from fsdp_lab.data import microbatches
from fsdp_lab.parallel.pipeline import PipelinedModel
from fsdp_lab.probes.comm import CommCounter
from fsdp_lab.probes.memory import PhaseMemory
from fsdp_lab.probes.memory_breakdown import ModuleBreakdown
from fsdp_lab.probes.parity import ParityVerdict, max_param_abs_diff, unwrap
from fsdp_lab.probes.perf import Throughput

if TYPE_CHECKING:
    from fsdp_lab.standalone import StandaloneLayer

log = logging.getLogger(__name__)


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    # At least float32 (a float64 model keeps its precision).
    return F.cross_entropy(logits.flatten(0, -2).to(torch.promote_types(logits.dtype, torch.float32)), targets.flatten())


# What a rank is doing after each phase mark: named in the error when a collective times out.
IN_FLIGHT_AFTER = {
    "start": "forward (parameter all-gather)",
    "after_fwd": "loss",
    "after_loss": "backward (gradient reduce-scatter / all-reduce)",
    "after_bwd": "optimizer step or the next microbatch's forward",
    "after_step": "zero_grad",
    "done": "loss all-reduce",
}


def unmeasured(phase: str) -> None:
    """The phase marker of steps nobody measures (the parity reference's)."""


def forward_backward(
    model: nn.Module, batches, mark: Callable[[str], None],
    around_microbatch: Callable[[int, int], contextlib.AbstractContextManager] | None,
) -> torch.Tensor:
    total = torch.zeros((), device=batches[0][1].device)
    for i, (inputs, targets) in enumerate(batches):
        with around_microbatch(i, len(batches)) if around_microbatch else contextlib.nullcontext():
            logits = model(inputs)
            mark("after_fwd")
            loss = loss_fn(logits, targets) / len(batches)
            mark("after_loss")
            loss.backward()
            mark("after_bwd")
        total = total + loss.detach()  # out of place: a float64 loss stays float64
    return total


def train_step(
    model: nn.Module, optimizer: torch.optim.Optimizer, batches, mark: Callable[[str], None],
    around_microbatch: Callable[[int, int], contextlib.AbstractContextManager] | None = None,
) -> torch.Tensor:
    """One optimizer step over the microbatches; returns this rank's mean loss (detached).

    Each microbatch's loss is divided by their number, so the accumulated gradient equals that of
    one pass over the whole batch. `around_microbatch(index, count)` gives the context each
    microbatch's forward+backward runs in (gradient accumulation policy, collective counting)."""
    mark("start")
    if isinstance(model, PipelinedModel):
        # The schedule interleaves the microbatches' forwards and backwards and sets gradient sync itself.
        total = model.forward_backward(batches)
        mark("after_bwd")
    else:
        total = forward_backward(model, batches, mark, around_microbatch)
    optimizer.step()
    mark("after_step")
    optimizer.zero_grad(set_to_none=True)
    mark("done")
    return total


@contextlib.contextmanager
def measured(memory: PhaseMemory | None, breakdown: ModuleBreakdown | None, batches):
    """The per-phase probe and, if given, the module tracker around one step; yields the marker
    that records each phase for both. The tracker is entered first: on CPU the phases are read from it."""
    with contextlib.ExitStack() as stack:
        marks = []
        if breakdown is not None:
            stack.enter_context(breakdown.track(batches))
            marks.append(breakdown.mark)
        if memory is not None:
            stack.enter_context(memory.step(breakdown.tracker if breakdown else None))
            marks.append(memory.mark)

        def mark(phase: str) -> None:
            for m in marks:
                m(phase)

        yield mark


@dataclass
class Reference:
    """The parity reference: a DDP copy of the model with its own optimizer."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    accumulation: Accumulation
    verdict: ParityVerdict
    param_every: int
    strict: bool


class Trainer:
    def __init__(
        self, *, model: nn.Module, optimizer: torch.optim.Optimizer, train: TrainConfig, fault: FaultConfig,
        rank: int, dp_rank: int, dp_group, device: torch.device, memory: PhaseMemory | None,
        throughput: Throughput | None, reference: Reference | None, on_step: Callable[[dict], None],
        accumulation: Accumulation | None = None, comm: CommCounter | None = None,
        breakdown: ModuleBreakdown | None = None, frozen_initial: dict[str, torch.Tensor] | None = None,
        standalone: StandaloneLayer | None = None,
    ):
        self.model, self.optimizer = model, optimizer
        self.train, self.fault = train, fault
        self.rank, self.dp_rank, self.dp_group, self.device = rank, dp_rank, dp_group, device
        self.memory, self.throughput, self.reference = memory, throughput, reference
        self.on_step = on_step
        self.accumulation, self.comm = accumulation, comm
        self.checkpointer = None  # a fsdp_lab.checkpoint.Checkpointer, set when checkpoint=dcp
        self.breakdown = breakdown
        self.frozen_initial = frozen_initial
        """model.freeze's parameters as they were before training (fsdp_lab.freeze)."""
        self.standalone = standalone
        """train.standalone_layer: a block's own forward/backward and optimizer step after each step."""
        self.last_loss: float | None = None
        self.activity = "setup"
        self.input_dtype = next(p.dtype for p in model.parameters() if p.is_floating_point())

    def _around_microbatch(self, index: int, count: int) -> contextlib.ExitStack:
        stack = contextlib.ExitStack()
        if self.comm is not None:  # first, so it also counts the all-gathers an explicit unshard issues
            stack.enter_context(self.comm.measure())
        if self.accumulation is not None:
            stack.enter_context(self.accumulation.microbatch(index, count))
        return stack

    def _mark(self, step: int, measure: Callable[[str], None], phase: str) -> None:
        self.activity = f"step {step + 1}: {IN_FLIGHT_AFTER[phase]}"
        measure(phase)

    def _batches(self, step: int):
        cfg = self.train
        return microbatches(
            unwrap(self.model),
            seed=cfg.seed, step=step, dp_rank=self.dp_rank, batch_size=cfg.batch_size,
            seq_len=cfg.seq_len, n=cfg.microbatches, device=self.device, dtype=self.input_dtype,
        )

    def _global_mean(self, local: torch.Tensor) -> float:
        value = local.clone()
        dist.all_reduce(value, op=dist.ReduceOp.SUM, group=self.dp_group)
        return value.item() / dist.get_world_size(self.dp_group)

    def inject_fault(self, step: int, phase: str) -> None:
        f = self.fault
        if f.kill_rank != self.rank or f.at_step != step or f.phase != phase:
            return
        if os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
            return  # a restarted attempt must be able to get past the fault
        if f.kind == "raise":
            raise RuntimeError(f"injected fault: rank {self.rank} raised at step {step}" + (" while saving" if phase == "save" else ""))
        if f.kind == "hang":
            while True:
                time.sleep(60)
        os.kill(os.getpid(), signal.SIGKILL)

    def run(self, start_step: int = 0) -> None:
        for step in range(start_step, self.train.steps):
            self.inject_fault(step, "step")
            batches = self._batches(step)
            t0 = time.perf_counter()
            if self.comm is not None:
                self.comm.begin_step()
            tracked = self.breakdown if self.breakdown is not None and self.breakdown.step == step + 1 else None
            with measured(self.memory, tracked, batches) as measure:
                mark = functools.partial(self._mark, step, measure)
                local_loss = train_step(self.model, self.optimizer, batches, mark, self._around_microbatch)
            loss = self._global_mean(local_loss)  # .item() inside: the step's kernels are done
            row = {"step": step + 1, "loss": loss}
            if self.standalone is not None:
                self.activity = f"step {step + 1}: standalone block forward/backward"
                row["standalone/loss"] = self._global_mean(self.standalone.step(self.model, self.optimizer, batches))
            if self.throughput is not None:
                row.update(self.throughput.metrics(time.perf_counter() - t0))
            if self.comm is not None:
                row.update(self.comm.metrics())
            if self.memory is not None:
                row.update(self.memory.metrics())
            if tracked is not None:
                row["memory/tracker_accuracy"] = tracked.report["tracker_accuracy"]
            if self.reference is not None:
                row.update(self._check_parity(step, batches, loss, row.get("standalone/loss")))
            self.last_loss = loss
            self.on_step(row)
            if self.checkpointer is not None:
                self.checkpointer.after_step(step + 1)
        if self.checkpointer is not None:
            self.checkpointer.finish()

    def _check_parity(self, step: int, batches, loss: float, standalone_loss: float | None) -> dict[str, float]:
        ref = self.reference
        self.activity = f"step {step + 1}: parity reference step (DDP all-reduce)"
        ref_loss = self._global_mean(train_step(ref.model, ref.optimizer, batches, unmeasured, ref.accumulation.microbatch))
        out = {"parity/loss_abs_diff": abs(loss - ref_loss)}
        ref.verdict.update_loss(out["parity/loss_abs_diff"])
        if self.standalone is not None:
            ref_standalone = self._global_mean(self.standalone.step(ref.model, ref.optimizer, batches))
            out["parity/standalone_loss_abs_diff"] = abs(standalone_loss - ref_standalone)
            ref.verdict.update_loss(out["parity/standalone_loss_abs_diff"])
        if (step + 1) % ref.param_every == 0 or step + 1 == self.train.steps:
            out["parity/param_max_abs_diff"] = max_param_abs_diff(self.model, ref.model)
            ref.verdict.update_params(out["parity/param_max_abs_diff"])
        if ref.strict and not ref.verdict.ok:
            raise RuntimeError(
                f"parity drift at step {step + 1}: loss diff {ref.verdict.max_loss_abs_diff:.3g}, param diff "
                f"{ref.verdict.max_param_abs_diff:.3g} beyond tolerances {ref.verdict.tolerance:g} / "
                f"{ref.verdict.param_tolerance:g} (probes.parity.strict=true)"
            )
        return out
