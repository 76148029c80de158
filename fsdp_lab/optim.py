"""Optimizers, learning-rate schedules and gradient clipping. Fused kernels on GPU: one launch per
step instead of one per parameter.

The gradient norm is the norm of the whole model's gradient, whatever the layout holds locally:
each DTensor gradient (FSDP2, HSDP, TP) contributes its local sum of squares, summed over the mesh
dimensions it is sharded on (not over those it is replicated on); FSDP1 computes it with its own
`clip_grad_norm_`; DDP's gradients are whole on every rank; pipeline stages sum their parts over the
pp group. The reference's norm is that of its full, replicated gradient, so the two compare."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.placement_types import Replicate

from fsdp_lab.config import OptimConfig


def _laid_out_alike(param: torch.Tensor, grad: torch.Tensor) -> bool:
    """Whether `grad` is split over the ranks as `param` is (same mesh, same placements), so that an
    elementwise step on the local tensors is the step on the whole parameter."""
    if not isinstance(param, DTensor):
        return not isinstance(grad, DTensor)
    return isinstance(grad, DTensor) and grad.device_mesh == param.device_mesh and grad.placements == param.placements


class _StepsLocalShards:
    """Adam's step taken on the local tensors of DTensor parameters, gradients and moments. The
    update is elementwise, so it is the same numbers; what it spares is DTensor's dispatch of the
    multi-tensor call, which unwraps and checks every tensor of the list on every step: at the 0.95B
    benchmark's shape on 2 GPUs the fused AdamW call took 5.5 ms of host time, 0.5 ms of it the fused
    op on the local tensors, in a step that waits for its host; on the local tensors the whole
    optimizer step took 1.6 ms. The moments are created (by Adam itself) and kept as DTensors, so
    checkpoints see them sharded as their parameters. A gradient laid out otherwise than its
    parameter (a replicated parameter's partial gradient) leaves the group to DTensor, which
    reduces it first."""

    def _init_group(self, group, params, grads, *states):
        has_complex = super()._init_group(group, params, grads, *states)
        if all(_laid_out_alike(p, g) for p, g in zip(params, grads)):
            for tensors in (params, grads, *states):
                tensors[:] = [t._local_tensor if isinstance(t, DTensor) else t for t in tensors]
        return has_complex


class Adam(_StepsLocalShards, torch.optim.Adam):
    pass


class AdamW(_StepsLocalShards, torch.optim.AdamW):
    pass


def build_optimizer(params, cfg: OptimConfig, device: torch.device) -> torch.optim.Optimizer:
    params = [p for p in params if p.requires_grad]
    if cfg.name == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay, foreach=cfg.foreach)
    cls = AdamW if cfg.name == "adamw" else Adam
    fused = device.type == "cuda" and cfg.foreach is None
    return cls(params, lr=cfg.lr, weight_decay=cfg.weight_decay, foreach=cfg.foreach, fused=fused or None)


def lr_factor(cfg: OptimConfig, total_steps: int) -> Callable[[int], float]:
    """The factor on optim.lr for 0-based step `s`: a linear warm-up, then the schedule, which
    reaches 0 one step after the last."""

    def factor(s: int) -> float:
        if s < cfg.warmup_steps:
            return (s + 1) / (cfg.warmup_steps + 1)
        progress = (s - cfg.warmup_steps) / max(total_steps - cfg.warmup_steps, 1)
        if cfg.schedule == "linear":
            return 1.0 - progress
        if cfg.schedule == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * progress))
        return 1.0

    return factor


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: OptimConfig, total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor(cfg, total_steps))


def _reduce_over(value: torch.Tensor, groups) -> torch.Tensor:
    for group in groups:
        dist.all_reduce(value, group=group)
    return value


def _sq_sum(tensors: list[torch.Tensor]) -> torch.Tensor:
    """The sum of the tensors' squared norms: each norm in the tensors' dtype (no float64 copy of a
    gradient), one multi-tensor kernel for all of them, then squared and summed in float64."""
    return torch.stack(torch._foreach_norm(tensors)).double().square().sum()


def _sharded_dims(grad: DTensor) -> tuple[int, ...]:
    """Mesh dimensions over which `grad`'s local tensors are parts of one whole (not copies)."""
    return tuple(i for i, p in enumerate(grad.placements) if not isinstance(p, Replicate))


@torch.no_grad()
def grad_sq_sum(model: nn.Module, device: torch.device) -> torch.Tensor:
    """The squared gradient norm of what this rank's parameters span, summed over the mesh
    dimensions each DTensor gradient is sharded on (float64, on `device`: the collectives' device,
    also when the gradients are offloaded to the CPU). The local tensors are grouped by the mesh
    dimensions to sum over, device and dtype: one norm kernel per group, not one per parameter."""
    groups: dict[tuple, list[torch.Tensor]] = {}
    for g in (p.grad for p in model.parameters() if p.grad is not None):
        mesh, dims = None, ()
        if isinstance(g, DTensor):
            if any(p.is_partial() for p in g.placements):  # summands, not parts: sum them first
                g = g.redistribute(placements=[Replicate() if p.is_partial() else p for p in g.placements])
            mesh, dims = g.device_mesh, _sharded_dims(g)
            g = g.to_local()
        groups.setdefault((mesh, dims, g.device, g.dtype), []).append(g.detach())
    total = torch.zeros((), dtype=torch.float64, device=device)
    sharded: dict[tuple, torch.Tensor] = {}
    for (mesh, dims, _, _), tensors in groups.items():
        part = _sq_sum(tensors).to(device)
        if dims:
            sharded[mesh, dims] = sharded.get((mesh, dims), 0) + part
        else:
            total += part
    for (mesh, dims), part in sharded.items():
        total += _reduce_over(part, [mesh.get_group(d) for d in dims])
    return total


@torch.no_grad()
def grad_norm(model: nn.Module, device: torch.device, pp_group=None) -> torch.Tensor:
    """The total L2 norm of the model's gradient over every rank (float64); `pp_group` sums the
    stages' parts."""
    if isinstance(model, FullyShardedDataParallel):
        # FSDP1 knows which flat shards are sharded and over which groups; an infinite max_norm
        # only reads the norm (the coefficient clamps to 1).
        return model.clip_grad_norm_(math.inf).double().to(device)
    sq = grad_sq_sum(model, device)
    if pp_group is not None:
        dist.all_reduce(sq, group=pp_group)
    return sq.sqrt()


def clip_coefficient(max_norm: float, total_norm: torch.Tensor) -> torch.Tensor:
    """The factor that brings a gradient of norm `total_norm` down to `max_norm` (1 when within it)."""
    return torch.clamp(max_norm / (total_norm + 1e-6), max=1.0)


@torch.no_grad()
def clip_to(model: nn.Module, coef: torch.Tensor) -> None:
    """Scale every local gradient by `coef`: one multi-tensor kernel per device and dtype (offloaded
    gradients live on the CPU)."""
    groups: dict[tuple, list[torch.Tensor]] = {}
    for p in model.parameters():
        if p.grad is not None:
            g = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
            groups.setdefault((g.device, g.dtype), []).append(g)
    for (device, dtype), grads in groups.items():
        torch._foreach_mul_(grads, coef.to(device=device, dtype=dtype))


def _forget_grad_scale(optimizer: torch.optim.Optimizer, args, kwargs) -> None:
    optimizer.__dict__.pop("grad_scale", None)


@dataclass
class Optimization:
    """One model's optimizer, its learning-rate schedule and its gradient clipping."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    max_norm: float | None
    device: torch.device
    pp_group: object = None

    @classmethod
    def build(cls, model: nn.Module, cfg: OptimConfig, total_steps: int, device: torch.device, pp_group=None) -> Optimization:
        optimizer = build_optimizer(model.parameters(), cfg, device)
        return cls(model, optimizer, build_scheduler(optimizer, cfg, total_steps), cfg.max_norm, device, pp_group)

    def __post_init__(self):
        if self.folds_clipping:
            # The clipping factor is for the step right after the clip, not for a step taken
            # without one (train.standalone_layer's).
            self.optimizer.register_step_post_hook(_forget_grad_scale)

    @functools.cached_property
    def folds_clipping(self) -> bool:
        """Whether the optimizer's own kernel applies the clipping: a fused optimizer divides every
        gradient by its `grad_scale` as it reads it (the hook GradScaler unscales through), which
        spares clipping its own pass over the gradients. At the 0.95B benchmark's shape on one H200
        (float32 gradients of 3.8 GB) that pass takes 2.07 ms (torchtitan's, in its profile) and the
        lab's fused step took 1.35 ms longer than torchtitan's: 0.7 ms of a 115 ms step.

        Only where the parameters live on the device the norm is taken on: the fused step moves a
        factor from another device without waiting for the copy (offloaded parameters are stepped
        on the CPU, the norm is on the GPU)."""
        on_device = all(p.device.type == self.device.type for g in self.optimizer.param_groups for p in g["params"])
        return self.max_norm is not None and on_device and getattr(self.optimizer, "_step_supports_amp_scaling", False)

    @property
    def lr(self) -> float:
        return self.optimizer.param_groups[0]["lr"]

    def clip(self) -> torch.Tensor:
        """The pre-clip total gradient norm; the gradients are clipped to max_norm if it is set, by
        the next optimizer step itself where it folds clipping in."""
        norm = grad_norm(self.model, self.device, self.pp_group)
        if self.max_norm is not None:
            coef = clip_coefficient(self.max_norm, norm)
            if self.folds_clipping:
                self.optimizer.grad_scale = coef.reciprocal().float()
            else:
                clip_to(self.model, coef)
        return norm


class Optimized:
    """What checkpoints read off a trained model's holder (the trainer, the parity reference)."""

    optim: Optimization

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self.optim.optimizer

    @property
    def scheduler(self) -> torch.optim.lr_scheduler.LambdaLR:
        return self.optim.scheduler
