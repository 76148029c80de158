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

from fsdp_lab.config import ConfigError, RunConfig, show
from fsdp_lab.mesh import ParallelDims
from fsdp_lab.models import families_with
from fsdp_lab.models.spec import ModelSpec
from fsdp_lab.modules import unwrap
from fsdp_lab.parallel.wrap import wrap_units
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


def _gathers_alone(block: nn.Module, units: list[nn.Module]) -> bool:
    """Whether every parameter of `block` is in an FSDP unit at or inside it (what FSDP2 gathers when
    the block runs with no root around it); the root unit holds the rest."""
    inside = {id(m) for m in block.modules()}
    covered = {id(p) for unit in units if id(unit) in inside for p in unit.parameters()}
    return all(id(p) in covered for p in block.parameters())


def check_module_calls(run: RunConfig, dims: ParallelDims, device_type: str, spec: ModelSpec, built) -> None:
    """Settings that call the model's modules in other ways than one forward of the whole model."""
    model, t, f = run.model, run.train, run.fsdp
    n_blocks = len(built.blocks)
    layer_order = getattr(model, "layer_order", None)  # a field of the families whose forward follows it
    if layer_order is not None:
        if not layer_order or not all(0 <= i < n_blocks for i in layer_order):
            raise ConfigError(f"model.layer_order={layer_order}: block indices in 0..{n_blocks - 1} (model.n_layers={n_blocks}), at least one")
        if run.probes.comm.enabled and len(set(layer_order)) < len(layer_order):
            # CommDebugMode's module tracker loses its place when a module's forward runs a second time (IndexError).
            raise ConfigError(f"probes.comm.enabled=true with model.layer_order={layer_order}: CommDebugMode cannot follow a block called twice; allowed: probes.comm.enabled=false")
    if t.standalone_layer is not None:
        if not spec.standalone_block:
            raise ConfigError(f"train.standalone_layer={t.standalone_layer}: needs a block that takes the model's inputs and returns logits; allowed with model.name={families_with('standalone_block')}")
        if not 0 <= t.standalone_layer < n_blocks:
            raise ConfigError(f"train.standalone_layer={t.standalone_layer}: a block index in 0..{n_blocks - 1} (model.n_layers={n_blocks})")
        if run.mesh.engine == "fsdp1":
            raise ConfigError(f"train.standalone_layer={t.standalone_layer} with mesh.engine=fsdp1: an inner FSDP1 unit cannot run alone; allowed: mesh.engine=fsdp2|ddp")
        if run.mesh.engine == "fsdp2" and not _gathers_alone(built.blocks[t.standalone_layer], wrap_units(built, run.wrap)):
            raise ConfigError(f"train.standalone_layer={t.standalone_layer} with wrap.policy={run.wrap.policy}: a unit around the block holds some of "
                              "its parameters and does not gather them when the block runs alone; allowed: wrap=block, or a policy that makes "
                              "every module holding the block's parameters a unit")
    if run.wrap.group > 1:
        for key, value in (("model.layer_order", layer_order), ("train.standalone_layer", t.standalone_layer)):
            if value is not None:
                # A group is gathered once for its modules' forwards in order; a block run again or alone is not.
                raise ConfigError(f"{key}={show(value)} with wrap.group={run.wrap.group}: grouped units run each block once, in order; allowed: wrap.group=1")
    if dims.pp_enabled:
        for key, value in (("model.layer_order", layer_order), ("train.standalone_layer", t.standalone_layer),
                           ("fsdp.cast_after_sharding", f.cast_after_sharding), ("fsdp.post_optim_event", f.post_optim_event or None)):
            if value is not None:
                raise ConfigError(f"{key}={show(value)} with mesh.pp={dims.pp}: pipeline stages run the blocks in order, once, and own their optimizer hooks; allowed with mesh.pp=1")
    if f.cast_after_sharding == "float16" and device_type == "cpu":
        raise ConfigError("fsdp.cast_after_sharding=float16: not supported on CPU; allowed here: float64, float32, bfloat16, null")
