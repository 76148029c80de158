"""One pipeline rank for mode=estimate: its stage, built and parallelized by the run's own
build_pipeline, driven through the schedule's order of microbatch forwards and backwards, without
the schedule's messages (a fake process group delivers no values, and torch's schedules read
received values: shape inference, the warm-up vote).

What this rank holds, as torch.distributed.pipelining holds it:
- the microbatches in flight: gpipe runs every forward before the first backward; 1f1b runs
  min(microbatches, pp - stage) forwards first, then one backward and one forward at a time, so the
  first stage holds the most. A microbatch's graph (and, on the last stage, its output and loss)
  lives from its forward to its backward;
- the receive buffers the schedule allocates once per microbatch and keeps: the activations a
  non-first stage receives, the output gradients a non-last stage receives;
- the input gradient a backward sends, until the next backward replaces it;
- FSDP as the schedule sets it: no gradient reduction and no resharding in the microbatches'
  backwards, then one post-backward of every parameter group, then gradients divided by the
  number of microbatches (in place).

Stage boundaries (shape and dtype of what is received) come from the plain stages before this one,
run under the fake mode; their activations are in the parameters' compute dtype (fsdp.param_dtype)."""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch import nn
from torch.distributed.fsdp import fully_shard

from fsdp_lab.config import RunConfig
from fsdp_lab.mesh import ParallelDims
from fsdp_lab.models import build_plain, model_spec
from fsdp_lab.parallel import parallelize
from fsdp_lab.parallel.fsdp2 import param_groups
from fsdp_lab.parallel.pipeline import PipelinedModel, build_pipeline, stages_per_rank
from fsdp_lab.step import loss_fn

ESTIMABLE_SCHEDULES = ("gpipe", "1f1b")


def schedule_order(schedule: str, n_microbatches: int, pp: int, stage: int) -> list[tuple[str, int]]:
    """("F" | "B", microbatch) in the order `schedule` runs them on `stage`."""
    if schedule == "gpipe":
        return [("F", i) for i in range(n_microbatches)] + [("B", i) for i in range(n_microbatches)]
    forwards = min(n_microbatches, pp - stage)  # torch's Schedule1F1B warm-up
    order = [("F", i) for i in range(forwards)]
    for i in range(n_microbatches):
        order.append(("B", i))
        if forwards < n_microbatches:
            order.append(("F", forwards))
            forwards += 1
    return order


class _Microbatch(nn.Module):
    """Calls the stage from a fresh root module: FSDPMemTracker refuses a second forward of a root in
    one step, and a stage runs one forward per microbatch."""

    def __init__(self, stage: nn.Module):
        super().__init__()
        object.__setattr__(self, "stage", stage)  # not a submodule: its parameters are tracked once

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.stage(x)


def _reduce_gradients(stage: nn.Module) -> None:
    """The schedule's end of backward for an FSDP stage (torch's perform_reduce_grad / _post_backward)."""
    stage.set_is_last_backward(True)
    stage.set_reshard_after_backward(True)
    stage.set_requires_gradient_sync(True)
    state = fully_shard.state(stage)
    for module_state in state._state_ctx.all_states:
        for group in param_groups(module_state):
            group.post_backward()
    state._root_post_backward_final_callback()


class SimulatedSchedule:
    """Stands in for torch's schedule in PipelinedModel: `step` runs this stage's microbatches in the
    schedule's order, with the schedule's buffers and FSDP settings."""

    def __init__(self, stage, n_microbatches: int, loss_fn: Callable, *, kind: str, received: torch.Tensor | None,
                 sent: torch.Tensor | None):
        self.module, self.stage_index, self.n_stages = stage.submod, stage.stage_index, stage.num_stages
        self.n_microbatches, self.loss_fn = n_microbatches, loss_fn
        self.order = schedule_order(kind, n_microbatches, self.n_stages, self.stage_index)
        # Allocated once, at the first step, and kept, as the schedule's receive buffers are.
        self._received_like, self._sent_like = received, sent
        self.buffers: list[torch.Tensor] = []

    def _allocate_buffers(self) -> None:
        n = self.n_microbatches
        self.activations = [torch.empty_like(self._received_like) for _ in range(n)] if self._received_like is not None else None
        self.output_grads = [torch.empty_like(self._sent_like) for _ in range(n)] if self._sent_like is not None else None
        self.buffers = [*(self.activations or ()), *(self.output_grads or ())]

    def step(self, *args, target=None, losses: list | None = None, return_outputs: bool = True) -> None:
        if not self.buffers and (self._received_like is not None or self._sent_like is not None):
            self._allocate_buffers()
        n = self.n_microbatches
        inputs = torch.tensor_split(args[0], n) if self.stage_index == 0 else self.activations
        targets = torch.tensor_split(target, n) if target is not None else [None] * n
        in_flight: dict[int, tuple] = {}
        sent_grad = None  # what the last backward sends upstream, held until the next one
        for action, i in self.order:
            if action == "F":
                x = inputs[i] if self.stage_index == 0 else inputs[i].requires_grad_(True)
                out = _Microbatch(self.module)(x)
                loss = self.loss_fn(out, targets[i]) if targets[i] is not None else None
                in_flight[i] = (x, out, loss)
                continue
            x, out, loss = in_flight.pop(i)
            self.module.set_is_last_backward(False)
            self.module.set_reshard_after_backward(False)
            self.module.set_requires_gradient_sync(False)
            if loss is not None:
                loss.backward()
                if losses is not None:
                    losses.append(loss)
            else:
                torch.autograd.backward(out, grad_tensors=self.output_grads[i])
            del out, loss
            if self.stage_index > 0:
                sent_grad, x.grad = x.grad, None
        del sent_grad
        _reduce_gradients(self.module)
        for p in self.module.parameters():
            if p.grad is not None:
                p.grad.div_(n)


def _boundaries(run: RunConfig, dims: ParallelDims, stage_index: int, n_stages: int, microbatch: torch.Tensor,
                dtype: torch.dtype) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(what stage `stage_index` receives, what it sends), as empty tensors: the plain stages up to it,
    run on one microbatch."""
    spec = model_spec(run.model.name)
    model = build_plain(run.model)
    per_stage = len(model.blocks) // n_stages
    h, received = microbatch, None
    with torch.no_grad():
        for s in range(stage_index + 1):
            if s == stage_index:
                received = h if s > 0 else None
            stage = spec.pipeline_stage(model, list(range(s * per_stage, (s + 1) * per_stage)), model,
                                        first=s == 0, last=s == n_stages - 1, seq_len=run.train.seq_len)
            h = stage(h)
    as_activation = lambda t: torch.empty(t.shape, dtype=dtype) if t is not None else None  # noqa: E731
    return as_activation(received), as_activation(h) if stage_index < n_stages - 1 else None


def pipelined_rank(model: nn.Module, run: RunConfig, dims: ParallelDims, mesh, dp_mesh, device: torch.device,
                   microbatch: torch.Tensor) -> tuple[PipelinedModel, nn.Module, SimulatedSchedule]:
    """This pp rank's PipelinedModel (built as a run builds it) with a SimulatedSchedule, its FSDP
    stage module and the schedule; `microbatch`: one microbatch's inputs."""
    pp_rank, n_stages = mesh["pp"].get_local_rank(), dims.pp * stages_per_rank(run.mesh)
    dtype = getattr(torch, run.fsdp.param_dtype) if run.fsdp.param_dtype else next(model.parameters()).dtype
    received, sent = _boundaries(run, dims, pp_rank, n_stages, microbatch, dtype)
    schedule_cls = functools.partial(SimulatedSchedule, kind=run.mesh.pp_schedule, received=received, sent=sent)
    pipelined = build_pipeline(
        model, stage_cls=model_spec(run.model.name).pipeline_stage, mesh_cfg=run.mesh, pp_mesh=mesh["pp"],
        n_microbatches=run.train.microbatches, seq_len=run.train.seq_len, device=device, loss_fn=loss_fn,
        parallelize_stage=functools.partial(parallelize, dims=dims, mesh=mesh, dp_mesh=dp_mesh, run=run, device=device),
        schedule_cls=schedule_cls,
    )
    return pipelined, pipelined.schedule.module, pipelined.schedule
