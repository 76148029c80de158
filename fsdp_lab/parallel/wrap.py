"""Wrapping policies: which submodules get their own FSDP unit (the root always gets one)."""

from __future__ import annotations

from torch import nn

from fsdp_lab.config import WrapConfig


def wrap_units(model: nn.Module, cfg: WrapConfig) -> list[nn.Module]:
    """Submodules to shard separately, innermost first, in registration (≈ forward) order."""
    if cfg.policy == "block":
        return list(model.blocks)
    if cfg.policy == "root":
        return []
    if cfg.policy == "linear":
        return [m for m in model.modules() if isinstance(m, nn.Linear) and m is not model]
    if cfg.policy == "classes":
        return [m for m in model.modules() if type(m).__name__ in cfg.classes and m is not model]
    # size: the smallest modules reaching min_params (post-order, so a large module's children are
    # taken before, and instead of, the module itself), as size_based_auto_wrap_policy does.
    units: list[nn.Module] = []
    covered: set[int] = set()
    for module in _post_order(model):
        if module is model:
            continue
        inside = {id(m) for m in module.modules()}
        if sum(p.numel() for p in module.parameters()) >= cfg.min_params and not inside & covered:
            units.append(module)
            covered |= inside
    return units


def grouped(units: list[nn.Module], size: int) -> list[list[nn.Module]]:
    """The units, up to `size` consecutive ones of one class to a group (a run's last may be shorter):
    each group one FSDP unit. A unit of another class than its neighbours stays on its own: the
    embedding that policy=classes wraps beside the blocks, grouped with the compiled TP blocks after
    it, reached forward with its weight still sharded (on 2xH100 and on CPU: `DTensor does not support
    cross-mesh operation on aten.embedding`) and its own unit is what the experiment asks for."""
    groups: list[list[nn.Module]] = []
    for unit in units:
        if groups and len(groups[-1]) < size and type(groups[-1][0]) is type(unit):
            groups[-1].append(unit)
        else:
            groups.append([unit])
    return groups


def _post_order(module: nn.Module):
    for child in module.children():
        yield from _post_order(child)
    yield module
