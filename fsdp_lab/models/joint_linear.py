"""Several bias-free projections of one input as one matmul: `joint_linear(x, wq, wk)` is
`cat(x @ wq.T, x @ wk.T, dim=-1)`, in one buffer, with x's gradient in one matmul instead of one per
weight and a sum.

Autograd keeps the weights themselves for backward, not their concatenation: FSDP frees a unit's
gathered weights after forward and gathers them again for backward, while a concatenated copy kept
by autograd would stay in memory from forward to backward (2 x dim^2 per block)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


class JointLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, *weights: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, *weights)
        return F.linear(x, torch.cat(weights))

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, *weights = ctx.saved_tensors
        grad_x = grad @ torch.cat(weights) if ctx.needs_input_grad[0] else None
        grad_ws = [None] * len(weights)
        if any(ctx.needs_input_grad[1:]):
            joint = grad.flatten(0, -2).T @ x.flatten(0, -2)
            grad_ws = [g if need else None for g, need in zip(joint.split([w.shape[0] for w in weights]), ctx.needs_input_grad[1:])]
        return grad_x, *grad_ws


def joint_linear(x: torch.Tensor, *weights: torch.Tensor) -> torch.Tensor:
    return JointLinear.apply(x, *weights)
