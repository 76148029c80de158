"""Fine-tuning: `model.freeze` is a regex over parameter names; the matching parameters get
requires_grad=False before any wrapping, on the model and on the parity reference alike, so the
optimizer never sees them and FSDP never reduces their (absent) gradients."""

from __future__ import annotations

import re

import torch
from torch import nn


def frozen_names(model: nn.Module, pattern: str | None) -> list[str]:
    """Names of the parameters `pattern` matches (re.search, so `layers\\.0\\.` freezes the first layer)."""
    if not pattern:
        return []
    regex = re.compile(pattern)
    return [name for name, _ in model.named_parameters() if regex.search(name)]


def freeze(model: nn.Module, pattern: str | None) -> dict[str, torch.Tensor]:
    """Freeze the matching parameters; returns a copy of their initial values (to check later that
    training left them unchanged)."""
    params = dict(model.named_parameters())
    initial = {}
    for name in frozen_names(model, pattern):
        params[name].requires_grad_(False)
        initial[name] = params[name].detach().clone()
    return initial


def mixed_units(model: nn.Module, units: list[nn.Module], pattern: str) -> list[str]:
    """The units (names; "" = the root) whose own parameters, those not inside a nested unit, are
    partly frozen: FSDP1 without use_orig_params flattens them into one tensor, which cannot be."""
    frozen = set(frozen_names(model, pattern))
    unit_ids = {id(u) for u in units}
    owner: dict[str, set[bool]] = {}
    for name, _ in model.named_parameters():
        # The innermost unit on the parameter's path owns it.
        path, unit = name.split(".")[:-1], ""
        module = model
        for i, part in enumerate(path):
            module = getattr(module, part)
            if id(module) in unit_ids:
                unit = ".".join(path[: i + 1])
        owner.setdefault(unit, set()).add(name in frozen)
    return [unit or "(root)" for unit, kinds in owner.items() if len(kinds) > 1]
