"""Numerical parity against a DDP reference, the way PyTorch's FSDP tests check it: the reference is
a deep copy taken before sharding, trained on the same per-rank data with gradients averaged over
the same data-parallel group; each step's losses are compared, and every few steps the local shards
of the parameters (DTensor shards, or FSDP1's flat shards) are compared with the matching slice of
the reference (no all-gather)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import _CHECKPOINT_PREFIX
from torch.distributed.tensor import DTensor, distribute_tensor

from fsdp_lab.modules import unwrap
from fsdp_lab.probes.flat_shards import flat_shard_pairs, is_fsdp1

# Loss and parameter tolerances by compute dtype: fp32 differs only by reduction order.
TOLERANCES = {torch.float32: 1e-5, torch.float64: 1e-10, torch.bfloat16: 5e-2, torch.float16: 1e-2}


@dataclass
class ParityVerdict:
    tolerance: float
    reference: str
    max_loss_abs_diff: float = 0.0
    max_param_abs_diff: float = 0.0
    max_grad_norm_abs_diff: float = 0.0

    def update_loss(self, diff: float) -> None:
        self.max_loss_abs_diff = max(self.max_loss_abs_diff, diff)

    def update_grad_norm(self, diff: float) -> None:
        self.max_grad_norm_abs_diff = max(self.max_grad_norm_abs_diff, diff)

    def update_params(self, diff: float) -> None:
        self.max_param_abs_diff = max(self.max_param_abs_diff, diff)

    @property
    def param_tolerance(self) -> float:
        # Reduction order changes gradients in the last bits; Adam divides by their running RMS, so
        # parameters drift by up to ~10x what the loss shows over a few steps.
        return 10 * self.tolerance

    @property
    def ok(self) -> bool:
        # The gradient norm sums many squares: it drifts as the parameters do.
        return (
            self.max_loss_abs_diff <= self.tolerance and self.max_param_abs_diff <= self.param_tolerance
            and self.max_grad_norm_abs_diff <= self.param_tolerance
        )

    def as_summary(self) -> dict:
        return {
            "enabled": True,
            "ok": self.ok,
            "reference": self.reference,
            "tolerance": self.tolerance,
            "param_tolerance": self.param_tolerance,
            "max_loss_abs_diff": self.max_loss_abs_diff,
            "max_param_abs_diff": self.max_param_abs_diff,
            "max_grad_norm_abs_diff": self.max_grad_norm_abs_diff,
        }


def _shard_pairs(model: nn.Module, ref_params: dict[str, torch.Tensor], only: set[str] | None = None):
    """(local shard, matching reference slice) for every parameter this rank holds (named in `only`, if given)."""
    if is_fsdp1(model):
        yield from flat_shard_pairs(model, ref_params, only)
        return
    for name, param in unwrap(model).named_parameters():
        # An activation-checkpoint wrapper adds a level to the name the reference does not have.
        name = name.replace(_CHECKPOINT_PREFIX, "")
        if only is not None and name not in only:
            continue
        expected = ref_params[name]
        if isinstance(param, DTensor):
            # Every rank holds the full reference, so each slices locally (src_data_rank=None).
            expected = distribute_tensor(expected, param.device_mesh, param.placements, src_data_rank=None)
            yield param.to_local(), expected.to_local()
        else:
            yield param, expected


def _local_worst(model: nn.Module, ref_params: dict[str, torch.Tensor], only: set[str] | None) -> tuple[torch.Tensor, int]:
    """This rank's largest |local shard - reference slice| and how many elements it compared."""
    worst, numel = torch.zeros((), dtype=torch.float64), 0
    for local, expected in _shard_pairs(model, ref_params, only):
        if local.numel():
            diff = (local.detach().double().cpu() - expected.double().cpu()).abs().max()
            worst = torch.maximum(worst, diff)
            numel += local.numel()
    return worst, numel


def _all_reduce(value: torch.Tensor, op) -> torch.Tensor:
    if dist.is_initialized():
        # gloo and nccl both reduce float64 on the device the group uses.
        value = value.to("cuda" if dist.get_backend() == "nccl" else "cpu")
        dist.all_reduce(value, op=op)
    return value


@torch.no_grad()
def max_param_abs_diff(model: nn.Module, reference: nn.Module) -> float:
    """Largest |local shard - reference slice| over all parameters and all ranks."""
    ref_params = {name: p.detach() for name, p in unwrap(reference).named_parameters()}
    worst, _ = _local_worst(model, ref_params, None)
    return float(_all_reduce(worst, dist.ReduceOp.MAX))


@torch.no_grad()
def change_since(model: nn.Module, initial: dict[str, torch.Tensor]) -> tuple[float, int]:
    """(largest |local shard - its initial value| over the parameters named in `initial`, on all ranks;
    the elements compared, summed over ranks: 0 means nothing was compared)."""
    worst, numel = _local_worst(model, initial, set(initial))
    worst = float(_all_reduce(worst, dist.ReduceOp.MAX))
    return worst, int(_all_reduce(torch.tensor(float(numel), dtype=torch.float64), dist.ReduceOp.SUM))
