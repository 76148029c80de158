"""How a model's forward calls its blocks: `call_block`, so that ac.impl=manual can make the model's
own code call torch.utils.checkpoint.checkpoint (or enter save_on_cpu) around a block, as a user's
model would, instead of a hook or wrapper doing it."""

from __future__ import annotations

from torch import nn


def call_block(model: nn.Module, index: int, block: nn.Module, *args):
    """`block(*args)`, or `runner(block, *args)` when ac.impl=manual set a runner for block `index`
    (fsdp_lab.parallel.ac)."""
    runner = model.__dict__.get("block_calls", {}).get(index)
    return runner(block, *args) if runner else block(*args)


def repeated_block_params(model: nn.Module) -> int:
    """Parameters the forward multiplies by beyond each block once: a block listed k times in
    `model.layer_order` runs k times per token (FLOPs and MFU count it k times)."""
    sizes = [sum(p.numel() for p in layer.parameters()) for layer in model.layers]
    return sum(sizes[i] for i in model.layer_order) - sum(sizes)
