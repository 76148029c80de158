"""PyTorch's test_non_root_forward_backward as a training option (train.standalone_layer): after each
step, one block of the model alone runs forward and backward on the step's batch and a second
optimizer step follows. Under FSDP2 the block is a non-root unit: it all-gathers, reduce-scatters and
finishes its backward by itself, with no root around it.

DDP only reduces gradients of backward passes that went through its own forward, so for a DDP model
(the parity reference, or mesh.engine=ddp) the block's gradients are averaged over the data-parallel
group by hand, as the PyTorch test does for its reference."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from fsdp_lab.modules import unwrap
from fsdp_lab.step import forward_backward, unmeasured


class StandaloneLayer:
    key = "standalone/loss"
    """Its metric key; the parity probe compares it as parity/standalone_loss_abs_diff."""
    activity = "standalone block forward/backward"

    def __init__(self, index: int, dp_group):
        self.index, self.dp_group = index, dp_group

    def step(self, model: nn.Module, optimizer: torch.optim.Optimizer, batches) -> torch.Tensor:
        """Forward/backward of block `index` alone, then an optimizer step; returns its loss (detached)."""
        block = unwrap(model).layers[self.index]
        loss = forward_backward(block, batches, unmeasured, None)
        if isinstance(model, DistributedDataParallel):
            size = dist.get_world_size(self.dp_group)
            for p in block.parameters():
                if p.grad is not None:
                    dist.all_reduce(p.grad, group=self.dp_group)
                    p.grad.div_(size)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss
