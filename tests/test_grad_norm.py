"""The gradient's norm and clipping (fsdp_lab.optim) in process: grouped by mesh dimensions, device
and dtype into multi-tensor kernels, they give what one norm per parameter gives, for plain and
FSDP2-sharded gradients and for gradients of mixed dtypes; a fused optimizer clips inside its step
what a separate pass would have clipped, for that step only."""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from fsdp_lab.optim import Optimization, clip_coefficient, clip_to, grad_norm


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
    clip_to(model, clip_coefficient(1.0, norm))
    for p, g in zip(model.parameters(), before):
        coef = torch.clamp(1.0 / (norm + 1e-6), max=1.0).to(g.dtype)
        torch.testing.assert_close(p.grad, g * coef, rtol=0, atol=0)
    assert per_parameter_norm(model) < 1.01


def fused_and_separate(max_norm: float) -> tuple[Optimization, Optimization]:
    """Two copies of one float32 model with equal, large gradients: the first's optimizer fused
    (AdamW on the CPU), the second's multi-tensor; both clip to `max_norm`."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 4))
    twin = copy.deepcopy(model)
    fused = Optimization(model, torch.optim.AdamW(model.parameters(), lr=0.1, fused=True), None, max_norm, torch.device("cpu"))
    separate = Optimization(twin, torch.optim.AdamW(twin.parameters(), lr=0.1, foreach=True), None, max_norm, torch.device("cpu"))
    return fused, separate


def give_grads(*optims: Optimization, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    grads = [torch.randn(p.shape, generator=g) * 10 for p in optims[0].model.parameters()]
    for o in optims:
        for p, grad in zip(o.model.parameters(), grads):
            p.grad = grad.clone()


def test_a_fused_optimizer_clips_in_its_step_what_a_separate_pass_clips():
    fused, separate = fused_and_separate(max_norm=1.0)
    assert fused.folds_clipping and not separate.folds_clipping
    for step in range(3):
        give_grads(fused, separate, seed=step)
        torch.testing.assert_close(fused.clip(), separate.clip(), rtol=0, atol=0)
        assert "grad_scale" in fused.optimizer.__dict__  # the pass left to the step...
        fused.optimizer.step()
        separate.optimizer.step()
        assert "grad_scale" not in fused.optimizer.__dict__  # ...and to that step only
        for a, b in zip(fused.model.parameters(), separate.model.parameters()):
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-6, atol=0)  # the clipped gradients
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_a_step_without_a_clip_before_it_is_not_clipped():
    fused, separate = fused_and_separate(max_norm=1.0)
    give_grads(fused, separate, seed=0)
    fused.clip()
    fused.optimizer.step()
    give_grads(fused, separate, seed=1)
    unclipped = [p.grad.clone() for p in fused.model.parameters()]
    fused.optimizer.step()  # as train.standalone_layer's extra step: no clip before it
    for p, g in zip(fused.model.parameters(), unclipped):
        torch.testing.assert_close(p.grad, g, rtol=0, atol=0)


def test_a_fused_step_of_sharded_parameters_clips_as_a_separate_pass(world_of_one):
    def sharded_with_grads(fused: bool) -> Optimization:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 4))
        for layer in model:
            fully_shard(layer, mesh=init_device_mesh("cpu", (1,)))
        model(torch.randn(3, 8, generator=torch.Generator().manual_seed(1))).square().sum().mul(100).backward()
        opt = torch.optim.AdamW(model.parameters(), lr=0.1, fused=fused, foreach=None if fused else True)
        return Optimization(model, opt, None, 1.0, torch.device("cpu"))

    fused, separate = sharded_with_grads(True), sharded_with_grads(False)
    assert fused.folds_clipping
    torch.testing.assert_close(fused.clip(), separate.clip(), rtol=0, atol=0)
    fused.optimizer.step()
    separate.optimizer.step()
    for a, b in zip(fused.model.parameters(), separate.model.parameters()):
        # The clipped gradients (Adam's update barely depends on their scale, so compare them too).
        torch.testing.assert_close(a.grad.full_tensor(), b.grad.full_tensor(), rtol=1e-6, atol=0)
        torch.testing.assert_close(a.full_tensor(), b.full_tensor(), rtol=1e-6, atol=1e-7)


def test_parameters_away_from_the_norms_device_are_clipped_by_a_separate_pass():
    """Offloaded parameters step on the CPU while the norm is on the GPU: the fused step would take
    the factor from a copy it does not wait for."""
    model = nn.Linear(4, 4)
    opt = Optimization(model, torch.optim.AdamW(model.parameters(), fused=True), None, 1.0, torch.device("meta"))
    assert not opt.folds_clipping
