"""One optimizer step: the microbatches' forward and backward, the gradient's norm and clipping,
the optimizer step; and the phase marks the probes read between them."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from fsdp_lab.cross_entropy import cross_entropy
from fsdp_lab.parallel.pipeline import PipelinedModel

# What a rank is doing after each phase mark: named in the error when a collective times out.
IN_FLIGHT_AFTER = {
    "start": "forward (parameter all-gather)",
    "after_fwd": "loss",
    "after_loss": "backward (gradient reduce-scatter / all-reduce)",
    "after_bwd": "gradient norm and optimizer step, or the next microbatch's forward",
    "after_step": "zero_grad",
    "done": "loss all-reduce",
}


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return cross_entropy(logits.flatten(0, -2), targets.flatten())


def _upcast_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, -2).to(torch.promote_types(logits.dtype, torch.float32)), targets.flatten())


@functools.cache
def compiled_loss_fn() -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The loss of model.compile=true (compiled on its first call): inductor fuses the upcast into
    the log-softmax's reductions and recomputes the softmax in backward from the logits, so it keeps
    no float32 copy of them either, in a few fused kernels instead of the slices' many."""
    return torch.compile(_upcast_loss)


def sum_over(local: torch.Tensor, group) -> torch.Tensor:
    """A per-rank value summed over the data-parallel group, queued and not read."""
    value = local.clone()
    dist.all_reduce(value, op=dist.ReduceOp.SUM, group=group)
    return value


def mean_of(summed: torch.Tensor, group) -> float:
    """The mean over the data-parallel group of a value `sum_over` summed (read: waits for it)."""
    return summed.item() / dist.get_world_size(group)


def global_mean(local: torch.Tensor, group) -> float:
    """The mean of a per-rank value over the data-parallel group."""
    return mean_of(sum_over(local, group), group)


def unmeasured(phase: str) -> None:
    """The phase marker of steps nobody measures (the parity reference's)."""


def forward_backward(
    model: nn.Module, batches, mark: Callable[[str], None],
    around_microbatch: Callable[[int, int], contextlib.AbstractContextManager] | None, loss: Callable = loss_fn,
) -> torch.Tensor:
    """Forward and backward of every microbatch, each loss divided by their number, so the
    accumulated gradient equals that of one pass over the whole batch; returns the mean loss."""
    if isinstance(model, PipelinedModel):
        # The schedule interleaves the microbatches' forwards and backwards and sets gradient sync itself.
        total = model.forward_backward(batches)
        mark("after_bwd")
        return total
    total = torch.zeros((), device=batches[0][1].device)
    for i, (inputs, targets) in enumerate(batches):
        with around_microbatch(i, len(batches)) if around_microbatch else contextlib.nullcontext():
            logits = model(inputs)
            mark("after_fwd")
            value = loss(logits, targets) / len(batches)
            mark("after_loss")
            value.backward()
            mark("after_bwd")
        total = total + value.detach()  # out of place: a float64 loss stays float64
    return total


def train_step(
    model: nn.Module, optimizer: torch.optim.Optimizer, batches, mark: Callable[[str], None],
    around_microbatch: Callable[[int, int], contextlib.AbstractContextManager] | None = None,
    before_update: Callable[[], torch.Tensor | None] | None = None, loss: Callable = loss_fn,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One optimizer step over the microbatches; returns this rank's mean loss (detached) and what
    `before_update` returned (the pre-clip gradient norm).

    `around_microbatch(index, count)` gives the context each microbatch's forward+backward runs in
    (gradient accumulation policy, collective counting); `before_update()` runs between the last
    backward and the optimizer step (fault injection, gradient norm and clipping); `loss(logits,
    targets)` the microbatch's loss."""
    mark("start")
    total = forward_backward(model, batches, mark, around_microbatch, loss)
    norm = before_update() if before_update is not None else None
    optimizer.step()
    mark("after_step")
    optimizer.zero_grad(set_to_none=True)
    mark("done")
    return total, norm
