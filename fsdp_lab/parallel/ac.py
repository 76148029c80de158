"""Activation checkpointing of `model.blocks`, mostly applied before data parallelism so it composes
with any engine (FSDP2, FSDP1, DDP): the engine only ever sees blocks whose forward recomputes (or
offloads) its activations — FSDP(checkpoint(block)).

Five implementations of the same idea (PyTorch's test_fsdp_checkpoint compares the last three):
- composable: `torch.distributed._composable.checkpoint`, forward hooks on the block, in place;
- utils: the block's forward routed through `torch.utils.checkpoint.checkpoint`, in place;
- wrapper: `checkpoint_wrapper` / `offload_wrapper` modules replacing the blocks in their parent
  (parameter names gain `_checkpoint_wrapped_module.`; state dicts and parity strip it);
- outer_wrapper: the same wrappers put around the blocks after the engine wrapped them,
  checkpoint(FSDP(block)): the unit's all-gather is part of what backward recomputes;
- manual: the model's own forward calls `torch.utils.checkpoint.checkpoint` (or enters
  `save_on_cpu`) around the block (`fsdp_lab.models.blocks.call_block`), as user code would.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

import torch
from torch import nn
from torch.distributed._composable import checkpoint as composable_checkpoint
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl,
    checkpoint_wrapper,
    offload_wrapper,
)
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from fsdp_lab.config import ACConfig, ConfigError, RunConfig
from fsdp_lab.models.spec import ModelSpec
from fsdp_lab.modules import unwrap

log = logging.getLogger(__name__)

# Matmul outputs are the expensive activations to recompute; everything else (norms, activations
# functions, rotary, softmax inside attention) is cheap and recomputed.
MATMUL_OPS = {
    torch.ops.aten.mm.default,
    torch.ops.aten.addmm.default,
    torch.ops.aten.bmm.default,
    torch.ops.aten.baddbmm.default,
}


def _save_matmuls(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in MATMUL_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def save_matmuls_context():
    """Selective activation checkpointing's op-level policy: keep matmul outputs."""
    return create_selective_checkpoint_contexts(_save_matmuls)


def chosen_blocks(blocks: list[nn.Module], cfg: ACConfig) -> list[int]:
    """Indices of the blocks to checkpoint: all of them, or every `cfg.every`-th for selective."""
    if cfg.mode == "selective":
        return [i for i in range(len(blocks)) if (i + 1) % cfg.every == 0]
    return list(range(len(blocks)))


def apply_ac(model: nn.Module, cfg: ACConfig, *, after_engine: bool = False) -> None:
    """Checkpoint (or offload) the chosen blocks of `model` according to `cfg`, in place. The
    orchestrator calls it before and after the engine wraps the model: ac.impl=outer_wrapper acts
    on the second call, every other implementation on the first."""
    if cfg.mode == "none" or (cfg.impl == "outer_wrapper") != after_engine:
        return
    blocks = unwrap(model).blocks
    indices = chosen_blocks(blocks, cfg)
    if cfg.impl == "manual":
        model.block_calls = {i: _runner(cfg) for i in indices}
    else:
        transform = _offload if cfg.mode == "offload" else _checkpoint
        for i in indices:
            replacement = transform(blocks[i], cfg)
            if replacement is not blocks[i]:
                _replace_child(model, blocks[i], replacement)
    policy = f", selective={cfg.selective}" if cfg.mode == "selective" else ""
    log.info("ac: mode=%s impl=%s on %d of %d blocks%s", cfg.mode, cfg.impl, len(indices), len(blocks), policy)


def _checkpoint_kwargs(cfg: ACConfig) -> dict:
    if cfg.mode == "selective" and cfg.selective == "op":
        return {"context_fn": save_matmuls_context}
    return {}


def _runner(cfg: ACConfig) -> Callable:
    """`runner(fn, *args, **kwargs)`: calls fn under checkpoint or save_on_cpu (impl=utils, manual)."""
    if cfg.mode == "offload":
        return functools.partial(_on_cpu, torch.cuda.is_available())
    return functools.partial(checkpoint, use_reentrant=cfg.reentrant, **_checkpoint_kwargs(cfg))


def _checkpoint(block: nn.Module, cfg: ACConfig) -> nn.Module:
    if cfg.impl == "composable":
        composable_checkpoint(block, **_checkpoint_kwargs(cfg))
        return block
    if cfg.impl == "utils":
        _route_forward(block, _runner(cfg))
        return block
    impl = CheckpointImpl.REENTRANT if cfg.reentrant else CheckpointImpl.NO_REENTRANT
    return checkpoint_wrapper(block, checkpoint_impl=impl, **_checkpoint_kwargs(cfg))


def _offload(block: nn.Module, cfg: ACConfig) -> nn.Module:
    if cfg.impl in ("wrapper", "outer_wrapper"):
        return offload_wrapper(block)
    if cfg.impl == "utils":
        _route_forward(block, _runner(cfg))
        return block
    pin = torch.cuda.is_available()
    # composable: the saved-tensor hooks are entered and left by forward hooks, as checkpoint() does.
    contexts: list = []

    def enter(module, args):
        contexts.append(torch.autograd.graph.save_on_cpu(pin_memory=pin))
        contexts[-1].__enter__()

    def leave(module, args, output):
        contexts.pop().__exit__(None, None, None)

    block.register_forward_pre_hook(enter)
    block.register_forward_hook(leave, always_call=True)
    return block


def _on_cpu(pin: bool, forward: Callable, *args, **kwargs):
    with torch.autograd.graph.save_on_cpu(pin_memory=pin):
        return forward(*args, **kwargs)


def _route_forward(block: nn.Module, runner: Callable) -> None:
    """Make `block(...)` run its original forward through `runner(forward, *args, **kwargs)`.

    Only the forward is routed, not `__call__`, so hooks that an engine puts on the block run once
    per forward and are not replayed by a recomputation."""
    block.forward = functools.partial(runner, block.forward)


def _replace_child(model: nn.Module, old: nn.Module, new: nn.Module) -> None:
    name = next(n for n, m in model.named_modules() if m is old)
    parent_name, _, child = name.rpartition(".")
    model.get_submodule(parent_name).register_module(child, new)


def check_ac(run: RunConfig, spec: ModelSpec) -> None:
    ac = run.ac
    if ac.impl == "manual" and ac.mode != "none" and not spec.manual_ac:
        raise ConfigError(
            f"ac.impl=manual with model.name={run.model.name}: its forward does not call its blocks through "
            "fsdp_lab.models.blocks.call_block; allowed: ac.impl=composable|utils|wrapper|outer_wrapper"
        )
    if ac.impl == "outer_wrapper" and ac.mode != "none" and run.mesh.engine == "ddp":
        raise ConfigError(
            "ac.impl=outer_wrapper with mesh.engine=ddp: it wraps the blocks FSDP made units of, and DDP makes none; "
            "allowed: ac.impl=composable|utils|wrapper|manual, or mesh.engine=fsdp2|fsdp1"
        )
    if not ac.reentrant:
        return
    if ac.impl == "composable":
        raise ConfigError("ac.reentrant=true: the composable checkpoint is non-reentrant only; allowed with ac.impl=utils|wrapper|outer_wrapper|manual")
    if ac.mode not in ("full", "selective") or (ac.mode == "selective" and ac.selective == "op"):
        raise ConfigError(
            f"ac.reentrant=true: only checkpointing that recomputes whole blocks has a reentrant variant "
            f"(ac=full, or ac=selective with ac.selective=layer), not ac.mode={ac.mode}"
            + (f" with ac.selective={ac.selective}" if ac.mode == "selective" else "")
        )
