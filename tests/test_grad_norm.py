"""The gradient's norm and clipping (fsdp_lab.optim) in process: grouped by mesh dimensions, device
and dtype into multi-tensor kernels, they give what one norm per parameter gives, for plain and
FSDP2-sharded gradients and for gradients of mixed dtypes."""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from fsdp_lab.optim import clip_to, grad_norm


def model_with_grads() -> nn.Module:
    """Three linears, the middle one in bfloat16: two dtype groups."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 16).to(torch.bfloat16), nn.Linear(16, 4))
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    return model


def per_parameter_norm(model: nn.Module) -> torch.Tensor:
    return sum(torch.linalg.vector_norm(p.grad).double().square() for p in model.parameters()).sqrt()


def test_the_grouped_norm_is_the_norm_over_every_parameter():
    model = model_with_grads()
    norm = grad_norm(model, torch.device("cpu"))
    assert norm.dtype == torch.float64
    torch.testing.assert_close(norm, per_parameter_norm(model), rtol=1e-12, atol=0)


def test_the_norm_of_sharded_gradients_is_that_of_the_whole(world_of_one):
    plain = nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 4))
    sharded = copy.deepcopy(plain)
    mesh = init_device_mesh("cpu", (1,))
    for layer in sharded:
        fully_shard(layer, mesh=mesh)
    fully_shard(sharded, mesh=mesh)
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(1))
    plain(x).square().sum().backward()
    sharded(x).square().sum().backward()
    torch.testing.assert_close(grad_norm(sharded, torch.device("cpu")), per_parameter_norm(plain), rtol=1e-12, atol=0)


def test_clipping_scales_every_gradient_of_every_dtype_by_one_factor():
    model = model_with_grads()
    before = [p.grad.clone() for p in model.parameters()]
    norm = per_parameter_norm(model)
    clip_to(model, 1.0, norm)
    for p, g in zip(model.parameters(), before):
        coef = torch.clamp(1.0 / (norm + 1e-6), max=1.0).to(g.dtype)
        torch.testing.assert_close(p.grad, g * coef, rtol=0, atol=0)
    assert per_parameter_norm(model) < 1.01
