"""Tensor-parallel styles the models' plans share (a plan: fsdp_lab.models.spec.TPPlan)."""

from __future__ import annotations

import copy

from torch import nn
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel


class HiddenColwise(ColwiseParallel):
    """Column-wise for a layer whose output only feeds elementwise ops and a row-wise layer.

    Where the output splits evenly over the tp ranks it leaves as a plain local tensor, as in
    PyTorch's own TP plans: the elementwise ops between the two layers then skip DTensor dispatch,
    whose host time bounds the 2D step of a model as small as the 0.95B benchmark's.
    An uneven split (17 = 9 + 8) keeps the DTensor, which knows its global size, where a local
    tensor would be taken by the row-wise layer for an even split."""

    def _apply(self, module: nn.Module, device_mesh):
        style = copy.copy(self)  # one style serves every block: decide per module on a copy
        style.use_local_output = module.out_features % device_mesh.size() == 0
        return ColwiseParallel._apply(style, module, device_mesh)


def mlp_pair() -> dict[str, object]:
    return {"in_proj": HiddenColwise(), "out_proj": RowwiseParallel()}
