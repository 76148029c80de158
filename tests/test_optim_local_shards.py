"""Adam's step on DTensor parameters' local tensors (fsdp_lab.optim.AdamW) in process: the kernel is
handed plain local tensors, the parameters and moments come out as torch's AdamW over the DTensors
makes them, bit for bit, the moments stay DTensors (what checkpoints save), and a gradient laid out
otherwise than its parameter leaves the group to DTensor."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Partial, Replicate, distribute_tensor

from fsdp_lab.optim import AdamW


def sharded_model() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 4))
    mesh = init_device_mesh("cpu", (1,))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def kernel_inputs(optimizer: torch.optim.Optimizer) -> list[list[torch.Tensor]]:
    """The lists Adam's step hands its kernel for the first parameter group."""
    lists = [[] for _ in range(6)]  # params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps
    optimizer._init_group(optimizer.param_groups[0], *lists)
    return lists


def train(model: nn.Module, optimizer: torch.optim.Optimizer, steps: int = 3) -> None:
    x = torch.randn(5, 8, generator=torch.Generator().manual_seed(1))
    for _ in range(steps):
        model(x).square().sum().backward()
        optimizer.step()
        optimizer.zero_grad()


@pytest.mark.parametrize("kernel", [{"fused": True}, {"foreach": True}, {"foreach": False}], ids=["fused", "foreach", "for-loop"])
def test_the_local_step_is_torchs_step_over_the_dtensors(world_of_one, kernel):
    ours, theirs = sharded_model(), sharded_model()  # the same seed: the same weights
    train(ours, AdamW(ours.parameters(), lr=0.1, weight_decay=0.1, **kernel))
    reference = torch.optim.AdamW(theirs.parameters(), lr=0.1, weight_decay=0.1, **kernel)
    train(theirs, reference)
    for a, b in zip(ours.parameters(), theirs.parameters()):
        assert isinstance(a, DTensor)
        torch.testing.assert_close(a.to_local(), b.to_local(), rtol=0, atol=0)


def test_the_kernel_gets_local_tensors_and_the_moments_stay_dtensors(world_of_one):
    model = sharded_model()
    optimizer = AdamW(model.parameters(), lr=0.1, fused=True)
    train(model, optimizer, steps=1)
    model(torch.randn(2, 8)).sum().backward()
    params, grads, exp_avgs, exp_avg_sqs, _, _ = kernel_inputs(optimizer)
    for tensors in (params, grads, exp_avgs, exp_avg_sqs):
        assert tensors and not any(isinstance(t, DTensor) for t in tensors)
    # The kernel's local moments are the state's own storage: the step updates what is saved.
    state = optimizer.state[next(model.parameters())]
    assert isinstance(state["exp_avg"], DTensor)
    assert state["exp_avg"].to_local().data_ptr() == exp_avgs[0].data_ptr()


def test_a_partial_gradient_of_a_replicated_parameter_is_left_to_dtensor(world_of_one):
    mesh = init_device_mesh("cpu", (1,))
    weight = nn.Parameter(distribute_tensor(torch.ones(4), mesh, [Replicate()]))
    weight.grad = DTensor.from_local(torch.ones(4), mesh, [Partial()])
    optimizer = AdamW([weight], lr=0.1)
    params, grads, *_ = kernel_inputs(optimizer)
    assert isinstance(params[0], DTensor) and isinstance(grads[0], DTensor)
