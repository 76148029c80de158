"""Tensor-parallel styles the models' plans share (a plan: fsdp_lab.models.spec.TPPlan)."""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.distributed.tensor import DTensor, Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
from torch.distributed.tensor.parallel.style import ParallelStyle


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


class ReplicatedInput(ParallelStyle):
    """For a module whose column-wise layers all read its input (an attention's q, k and v; an MLP's
    gate and up): the input, its first positional argument or `hidden_states`, enters as one replicated
    DTensor. In backward autograd then sums the layers' partial gradients before one all-reduce, where
    each column-wise layer taking a plain tensor would all-reduce its own (Megatron's f: one a module).
    torch's PrepareModuleInput would need to know how the family calls the module: its positional
    layouts must match the call's positional inputs in number (llama passes `hidden_states=` to its
    attention and the tensor to its MLP)."""

    def _apply(self, module: nn.Module, device_mesh) -> nn.Module:
        def replicate(x):
            is_plain = isinstance(x, torch.Tensor) and not isinstance(x, DTensor)
            return DTensor.from_local(x, device_mesh, (Replicate(),), run_check=False) if is_plain else x

        def enter(_, args, kwargs):
            if args:
                return (replicate(args[0]), *args[1:]), kwargs
            if "hidden_states" in kwargs:
                return args, {**kwargs, "hidden_states": replicate(kwargs["hidden_states"])}
            return args, kwargs

        module.register_forward_pre_hook(enter, with_kwargs=True)
        return module


def mlp_pair() -> dict[str, object]:
    return {"in_proj": HiddenColwise(), "out_proj": RowwiseParallel()}
