"""FSDP2 (`fully_shard`): one unit per wrapped module, then the root. The same code serves FSDP
(1-D mesh) and HSDP (2-D replicate x shard mesh)."""

from __future__ import annotations

import dataclasses
import logging

import torch
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard, register_fsdp_forward_method

from fsdp_lab.config import FSDPConfig
from fsdp_lab.parallel import gather_in_place, grad_pack
from fsdp_lab.parallel.symm_mem import collectives_from_symm_mem

log = logging.getLogger(__name__)


def dtype_or_none(name: str | None) -> torch.dtype | None:
    return getattr(torch, name) if name else None


def apply_fsdp2(model: nn.Module, mesh, groups: list[list[nn.Module]], cfg: FSDPConfig) -> nn.Module:
    """Shard each group of modules as one unit (fsdp_lab.parallel.wrap.grouped), then the root."""
    mp_policy = MixedPrecisionPolicy(param_dtype=dtype_or_none(cfg.param_dtype), reduce_dtype=dtype_or_none(cfg.reduce_dtype))
    kwargs = dict(
        mesh=mesh,
        reshard_after_forward=cfg.reshard_after_forward,
        mp_policy=dataclasses.replace(mp_policy, cast_forward_inputs=cfg.cast_forward_inputs),
    )
    if cfg.cpu_offload:
        # Pinned host memory needs an accelerator; on a CPU-only machine the params are plain CPU memory.
        kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=torch.cuda.is_available())
    for group in groups:
        # A lone module is passed as itself, as before groups existed: torch 2.13 takes a one-module
        # list down the same path, torch 2.11 (on the GPUs) was not checked for it.
        fully_shard(group if len(group) > 1 else group[0], **kwargs)
        # Methods the model calls instead of forward must unshard the unit as forward does.
        for module in group:
            for method in getattr(module, "fsdp_forward_methods", ()):
                register_fsdp_forward_method(module, method)
    fully_shard(model, **{**kwargs, "mp_policy": mp_policy})  # the root casts the model's inputs
    # A group's modules share one FSDP state: prefetching its first prefetches the group.
    _set_explicit_prefetch([group[0] for group in groups], cfg.forward_prefetch, cfg.backward_prefetch)
    units = [group[0] for group in groups] + [model]
    if cfg.force_sum_reduction:  # before symmetric memory: torch gives it the reduce-scatters of units that sum
        for unit in units:
            unit.set_force_sum_reduction_for_comms(True)
    grad_pack.use(cfg.reduce_copy_in)
    gather_in_place.use(cfg.all_gather)
    if cfg.symm_mem:
        collectives_from_symm_mem(units, mesh.device_type, reduce_scatter=cfg.force_sum_reduction)
    if not cfg.root_backward_prefetch:
        # An empty list keeps FSDP2's implicit prefetch; the root itself, gathered already, replaces it.
        model.set_modules_to_backward_prefetch([model])
    log.info("fsdp2: %d units + root on mesh %s, reshard_after_forward=%s", len(groups), mesh, cfg.reshard_after_forward)
    return model


def param_groups(state) -> list:
    """An FSDP2 state's parameter groups: torch 2.13 keeps a list, torch 2.11 (the GPUs') one group or None."""
    groups = getattr(state, "_fsdp_param_groups", None)
    if groups is None:
        groups = [state._fsdp_param_group] if state._fsdp_param_group else []
    return groups


def _set_explicit_prefetch(units: list[nn.Module], forward: int, backward: int) -> None:
    """Prefetch the next `forward` units in forward and the previous `backward` units in backward."""
    for i, unit in enumerate(units):
        if forward:
            unit.set_modules_to_forward_prefetch(units[i + 1 : i + 1 + forward])
        if backward:
            unit.set_modules_to_backward_prefetch(units[max(0, i - backward) : i][::-1])


def cast_after_sharding(model: nn.Module, dtype: torch.dtype) -> None:
    """`model.to(dtype)` on the sharded model, as a user converting it does (FSDP2 re-registers its
    sharded parameters); every parameter and its local shard must come out in `dtype`."""
    model.to(dtype)
    wrong = [name for name, p in model.named_parameters() if p.dtype != dtype or getattr(p, "_local_tensor", p).dtype != dtype]
    if wrong:
        raise RuntimeError(f"fsdp.cast_after_sharding={dtype}: parameters not cast: {', '.join(wrong)}")
    log.info("fsdp2: cast after sharding: %d parameters and their shards now %s", len(list(model.parameters())), dtype)


def record_post_optim_event(model: nn.Module, optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    """After every optimizer.step, the event the root's next all-gathers wait on (set_post_optim_event),
    instead of waiting for everything queued on the current stream."""
    if device.type == "cpu":  # no events: CPU ops run in order, so there is nothing to overlap or wait on
        log.info("fsdp2: fsdp.post_optim_event=true has no event to record on CPU; all-gathers follow the stream as without")
        return

    def hand_over(opt, args, kwargs) -> None:
        model.set_post_optim_event(torch.get_device_module(device.type).current_stream().record_event())

    optimizer.register_step_post_hook(hand_over)
    log.info("fsdp2: post-optimizer event recorded after every optimizer.step")
