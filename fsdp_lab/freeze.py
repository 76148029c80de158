"""Fine-tuning: `model.freeze` is a regex over parameter names; the matching parameters get
requires_grad=False before any wrapping, on the model and on the parity reference alike, so the
optimizer never sees them and FSDP never reduces their (absent) gradients."""

from __future__ import annotations

import re

import torch
from torch import nn

from fsdp_lab.config import ConfigError, RunConfig
from fsdp_lab.parallel.wrap import wrap_units


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


def check_freeze(run: RunConfig, model) -> None:
    pattern = run.model.freeze
    if pattern is None:
        return
    try:
        re.compile(pattern)
    except re.error as e:
        raise ConfigError(f"model.freeze={pattern}: not a regular expression ({e})") from None
    names, frozen = [n for n, _ in model.named_parameters()], frozen_names(model, pattern)
    if not frozen or len(frozen) == len(names):
        raise ConfigError(
            f"model.freeze={pattern}: matches {len(frozen)} of the {len(names)} parameters of model.name={run.model.name}; "
            f"allowed: a regex matching some but not all of {', '.join(names[:4])}, ..."
        )
    if run.probes.memory.tracker == "module":
        # torch's (FSDP)MemTracker registers a gradient hook on every parameter, which a frozen one refuses.
        raise ConfigError(
            f"model.freeze={pattern} with probes.memory.tracker=module: torch's module tracker cannot follow frozen "
            "parameters; allowed: probes.memory.tracker=none (the per-phase probe works)"
        )
    if run.mesh.engine == "fsdp1" and not run.fsdp.use_orig_params:
        mixed = mixed_units(model, wrap_units(model, run.wrap), pattern)
        if mixed:
            raise ConfigError(
                f"model.freeze={pattern} with mesh.engine=fsdp1 and fsdp.use_orig_params=false: FSDP units "
                f"{', '.join(mixed)} mix frozen and trainable parameters in one flat parameter; allowed: "
                "fsdp.use_orig_params=true, a wrap.policy giving frozen parameters their own units (e.g. linear), "
                "or a pattern freezing whole units"
            )
